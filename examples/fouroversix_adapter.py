"""fouroversix 1.0.5's NVFP4 quantizer (its PyTorch backend, which runs on the CPU) as a harness backend.

    SKIP_CUDA_BUILD=1 pip install --no-build-isolation --no-deps fouroversix==1.0.5
    python -m harness run --tier nvfp4 --backend examples/fouroversix_adapter.py:backend --filter bf16 --out /tmp/r-4o6

Give it as a file path (`examples/fouroversix_adapter.py:backend`), never as a module named after the
library (docs/adapters.md §8). `backend` is plain NVFP4 (`ScaleRule.static_6`); `fouroversix_4over6` is
its 4/6 block-scale selection (`ScaleRule.mae` / `mse`), offered for the contract's `4over6` variant with
`e4m3_max = 256` (fouroversix's 4/6 path uses E4M3 max 256).

What fouroversix returns and how it maps (harness/adapters/build.py does the mapping):
- `QuantizedTensor.values`: packed E2M1 [roundup(rows,128), roundup(cols,64)/2], element 2j in the low
  nibble (the contract's order) -> cropped to the copy's [rows, cols/2];
- `scale_factors`: E4M3, flat in the cuBLASLt swizzled ("Blackwell") layout over the same padded shape
  the contract pads to -> `reference.layouts.unswizzle_scales`, cropped to the valid region;
- `amax`: fp32 amax of the input -> the copy's A_g, as it is;
- the colwise copy is `quantize_to_fp4` of Xᵀ (its `transpose=True` option does the same), with the amax
  of Xᵀ (= amax of X).
"""

from __future__ import annotations

import importlib.util

import torch

from harness.adapters import build
from reference import Unsupported
from reference.layouts import unswizzle_scales


def _installed() -> bool:
    return importlib.util.find_spec("fouroversix") is not None


class FourOverSix:
    def __init__(self, name: str = "fouroversix", four_over_six: bool = False) -> None:
        self.name = name
        self.four_over_six = four_over_six

    def supports(self, case, device) -> tuple[bool, str]:
        if not _installed():
            return False, f"{self.name}: fouroversix is not installed (pip install fouroversix==1.0.5)"
        if case.op != "quantize":
            return False, f"{self.name}: only quantize is adapted, not {case.op}"
        c = case.config
        if c.scheme != "nvfp4" or c.convention != "te":
            return False, f"{self.name}: NVFP4 only (te convention), not {c.id}"
        if c.rht or c.stochastic:
            return False, (f"{self.name}: fouroversix's RHT (its own sign vector) and SR (torch.rand bits) are not "
                           f"the contract's: not {c.id}")
        want = "4over6" if self.four_over_six else None
        if c.variant != want or (want and c.e4m3_max != 256):
            return False, f"{self.name}: runs variant {want or 'none'}" + (
                " with e4m3_max 256" if want else "") + f", not {c.id}"
        if case.in_dtype not in ("bfloat16", "float32", "float16"):
            return False, f"{self.name}: input {case.in_dtype}"
        return True, ""

    def _rule(self, config):
        from fouroversix import ScaleRule

        if not self.four_over_six:
            return ScaleRule.static_6
        return ScaleRule.mse if config.err_mode == "mse" else ScaleRule.mae

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        if not _installed():
            raise Unsupported(f"{self.name}: fouroversix is not installed")
        from fouroversix import QuantizationConfig, quantize_to_fp4

        cfg = QuantizationConfig(backend="pytorch", scale_rule=self._rule(config),
                                 block_scale_2d=config.tile == (16, 16))
        x2d = build.two_d(x)
        m, k = x2d.shape
        q = build.empty(config, x)
        for orientation, src in (("rowwise", x2d), ("colwise", x2d.t().contiguous())):
            if not (rowwise if orientation == "rowwise" else colwise):
                continue
            t = quantize_to_fp4(src, cfg)
            rows, cols = src.shape
            g = build.geometry(config, orientation, m, k)
            compact = unswizzle_scales(t.scale_factors.view(torch.uint8).reshape(-1), config, orientation, m, k)
            r, c = g.scale_valid_shape
            build.put_copy(q, orientation, data=t.values[:rows, : cols // 2], scale=compact[:r, :c],
                           amax=t.amax.float())
        return q


backend = FourOverSix()
fouroversix_4over6 = FourOverSix("fouroversix_4over6", four_over_six=True)
