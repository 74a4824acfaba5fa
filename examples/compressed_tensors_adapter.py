"""compressed-tensors 0.20's FP8 / MXFP8 / NVFP4 quantize path as a harness backend, CPU.

    pip install "compressed-tensors==0.20.*"
    python -m harness run --tier smoke --backend examples/compressed_tensors_adapter.py:backend --out /tmp/r-ct

Give it as a file path, never as a module named after the library (docs/adapters.md §8).

As a user runs it: `QuantizationArgs` like its presets (FP8 TENSOR, FP8_BLOCK, MXFP8 GROUP 32 with
scale_dtype uint8, NVFP4 TENSOR_GROUP 16 with E4M3 scales), min/max per group (`torch.aminmax`, as its
dynamic path `compute_dynamic_scales_and_zp`), `calculate_qparams` (with `generate_gparam`'s global scale for
NVFP4), then `compressed_tensors.quantization.lifecycle.forward.quantize` to the quantized values.

| contract scheme | strategy | outputs -> contract (harness/adapters/build.py) |
|---|---|---|
| `fp8_current` e4m3 | TENSOR | fp8 codes; scale = amax/448 in the input dtype -> sinv; amax = max(|min|, |max|) |
| `fp8_block` 1x128 e4m3 | GROUP 128 on X / Xᵀ | scales [rows, cols/128] of the source |
| `fp8_block` 128x128 e4m3 | BLOCK [128, 128] on X | tile grid of X; colwise = transposed codes |
| `mxfp8` 1x32 e4m3 | GROUP 32, scale_dtype uint8 | float 2^e scales -> E8M0 bytes (exact) |
| `nvfp4` 1x16 | TENSOR_GROUP 16 | E2M1 values -> codes (exact); E4M3-valued scales -> bytes; A_g = max(|min|, |max|) |

Its scales are computed in the input dtype (bf16 for bf16 input), as amax / fp8_max; MX exponents come
from `round_to_power_2` (rounding amax's significand at E2M1's mantissa width) minus 8.
"""

from __future__ import annotations

import importlib.util

import torch

from harness.adapters import build
from reference import Unsupported

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _installed() -> bool:
    return importlib.util.find_spec("compressed_tensors") is not None


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """E2M1 grid values (compressed-tensors' quantized output) -> 4-bit codes, exactly; sign from the sign bit."""
    a = v.abs().float()
    idx = torch.searchsorted(_E2M1, a.contiguous())
    idx = idx.clamp(max=7)
    if not bool((_E2M1[idx] == a).all()):
        raise ValueError("compressed-tensors returned a value off the E2M1 grid")
    return (idx.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3))


class CompressedTensors:
    name = "compressed_tensors"

    def supports(self, case, device) -> tuple[bool, str]:
        if not _installed():
            return False, "compressed_tensors: not installed (pip install 'compressed-tensors==0.20.*')"
        if case.op != "quantize":
            return False, f"compressed_tensors: only quantize is adapted, not {case.op}"
        ok, why = self._supports_config(case.config)
        c, (m, k) = case.config, (case.shape[0] if len(case.shape) == 2 else -1, case.shape[-1])
        if ok and c.scheme == "fp8_block" and (k % 128 or (case.orientation != "rowwise" and m % 128)):
            return False, f"compressed_tensors: GROUP/BLOCK 128 needs the blocked dims to be multiples of 128, not {case.shape}"
        return ok, why

    def _supports_config(self, c) -> tuple[bool, str]:
        if c.convention != "te":
            return False, f"compressed_tensors: runs its own rules, compared with te; not {c.id}"
        if c.scheme in ("fp8_current", "fp8_block", "mxfp8") and c.element != "e4m3":
            return False, f"compressed_tensors: 8-bit float is e4m3 only; not {c.id}"
        if c.scheme in ("fp8_current", "fp8_block") and (c.pow2_scales or c.eps):
            return False, f"compressed_tensors: FP8 scale is amax/448 (no pow2, no eps); not {c.id}"
        if c.scheme == "mxfp8" and (c.tile != (1, 32) or c.e8m0_rule != "ceil"):
            return False, f"compressed_tensors: MXFP8 is 1x32 groups, its own rounded exponent (run as ceil); not {c.id}"
        if c.scheme == "nvfp4" and (c.tile != (1, 16) or c.rht or c.stochastic or c.variant is not None):
            return False, f"compressed_tensors: NVFP4 is 1x16 round-to-nearest, no RHT/variant; not {c.id}"
        if c.scheme == "fp8_delayed":
            return False, "compressed_tensors: no delayed scaling (static observers are a calibration workflow)"
        return True, ""

    @staticmethod
    def _args(config):
        from compressed_tensors.quantization import QuantizationArgs

        s = config.scheme
        if s == "fp8_current":
            return QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=True)
        if s == "fp8_block" and config.tile == (128, 128):
            return QuantizationArgs(num_bits=8, type="float", strategy="block", symmetric=True, dynamic=False,
                                    block_structure=[128, 128])
        if s == "fp8_block":
            return QuantizationArgs(num_bits=8, type="float", strategy="group", symmetric=True, dynamic=True,
                                    group_size=128)
        if s == "mxfp8":
            return QuantizationArgs(num_bits=8, type="float", strategy="group", symmetric=True, dynamic=False,
                                    group_size=32, scale_dtype=torch.uint8, zp_dtype=torch.uint8)
        return QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", symmetric=True, dynamic=False,
                                group_size=16, scale_dtype=torch.float8_e4m3fn, zp_dtype=torch.float8_e4m3fn)

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        ok, why = self._supports_config(config) if _installed() else (False, "compressed_tensors: not installed")
        if not ok:
            raise Unsupported(why)
        from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize
        from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

        args = self._args(config)
        x2d = build.two_d(x)
        q = build.empty(config, x)
        want = {"rowwise": rowwise, "colwise": colwise}
        fp8 = torch.float8_e4m3fn
        if config.scheme == "fp8_current":
            lo, hi = torch.aminmax(x2d)
            scale, zp = calculate_qparams(lo, hi, args)
            codes = ct_quantize(x2d, scale, zp, args, dtype=fp8)
            amax = torch.max(lo.abs(), hi.abs())  # calculate_qparams' max_val_pos
            for o in ("rowwise", "colwise"):
                if want[o]:
                    build.put_copy(q, o, data=codes, scale=scale, amax=amax, by="logical")
            return q
        if config.scheme == "fp8_block" and config.tile == (128, 128):
            m, k = x2d.shape
            if m % 128 or k % 128:
                raise Unsupported("compressed_tensors: the adapter's block min/max needs M, K multiples of 128")
            blocks = x2d.reshape(m // 128, 128, k // 128, 128)
            scale, zp = calculate_qparams(blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3)), args)
            codes = ct_quantize(x2d, scale, zp, args, dtype=fp8)
            for o in ("rowwise", "colwise"):
                if want[o]:
                    build.put_copy(q, o, data=codes, scale=scale, by="logical")
            return q
        if config.scheme == "nvfp4":
            lo, hi = torch.aminmax(x2d)
            gscale = generate_gparam(lo, hi)  # 6 * 448 / amax, shared by both copies
            a_g = torch.max(lo.abs(), hi.abs())
        gs = args.group_size
        for o, src in (("rowwise", x2d), ("colwise", x2d.t().contiguous())):
            if not want[o]:
                continue
            grouped = src.unflatten(-1, (src.shape[-1] // gs, gs))
            lo, hi = grouped.amin(dim=-1), grouped.amax(dim=-1)
            if config.scheme == "nvfp4":
                scale, zp = calculate_qparams(lo, hi, args, global_scale=gscale)
                vals = ct_quantize(src, scale, zp, args, global_scale=gscale)
                build.put_copy(q, o, data=_e2m1_codes(vals), scale=scale, amax=a_g)
            else:
                scale, zp = calculate_qparams(lo, hi, args)
                codes = ct_quantize(src, scale, zp, args, dtype=fp8)
                build.put_copy(q, o, data=codes, scale=scale)
        return q


backend = CompressedTensors()
