"""NVIDIA ModelOpt 0.47's real-quant tensors (modelopt.torch.quantization.qtensor) as a harness backend, CPU.

    pip install "nvidia-modelopt==0.47.*" requests huggingface_hub
    python -m harness run --tier smoke --backend examples/modelopt_adapter.py:backend --out /tmp/r-modelopt

Give it as a file path (`examples/modelopt_adapter.py:backend`), never as `modelopt:backend` (docs/adapters.md §8).

| contract scheme | ModelOpt call | its outputs -> contract (harness/adapters/build.py) |
|---|---|---|
| `fp8_current` e4m3 (no pow2, eps 0) | `FP8QTensor.quantize(X)` | e4m3 codes; `scales` = amax/448 in the input dtype -> sinv; amax = `reduce_amax(X)` |
| `fp8_block` 1x128 e4m3 (no pow2) | `FP8QTensor.quantize(S, block_sizes={-1: 128})`, S = X or Xᵀ | scales [rows, cols/128] of S |
| `fp8_block` 128x128 e4m3 (no pow2) | `FP8QTensor.quantize(X, block_sizes={-1: 128, -2: 128})` | tile grid of X; colwise = transposed codes |
| `mxfp8` 1x32 e4m3, e8m0_rule ceil | `MXFP8QTensor.quantize(S)` | E8M0 uint8 [rows, cols/32] of S |
| `nvfp4` 1x16 (no RHT/SR/variant) | `NVFP4QTensor.quantize(S, 16, weights_scaling_factor_2=reduce_amax(X)/2688)` | packed E2M1 (low nibble first), E4M3 scales, A_g = reduce_amax(X) |

ModelOpt's scales are decode scales amax / fp8_max computed in the input dtype (a bf16 scale for bf16 input),
not sinv = RN(1/RN(448/amax)) in fp32; its FP8 cast is `(x / scale).to(float8_e4m3fn)` (no saturation).
`dequantize` uses ModelOpt's own `dequantize` of each QTensor on the contract's fields.
"""

from __future__ import annotations

import importlib.util

import torch

from harness.adapters import build
from reference import Unsupported

_E2M1_X_E4M3 = 6.0 * 448.0


def _installed() -> bool:
    return importlib.util.find_spec("modelopt") is not None


class ModelOpt:
    name = "modelopt"

    def supports(self, case, device) -> tuple[bool, str]:
        if not _installed():
            return False, "modelopt: nvidia-modelopt is not installed (pip install 'nvidia-modelopt==0.47.*')"
        if case.op not in ("quantize", "dequantize"):
            return False, f"modelopt: only quantize/dequantize are adapted, not {case.op}"
        return self._supports_config(case.config)

    def _supports_config(self, c) -> tuple[bool, str]:
        if c.convention != "te":
            return False, f"modelopt: runs its own rules, compared with te; not {c.id}"
        if c.scheme in ("fp8_current", "fp8_block"):
            if c.element != "e4m3" or c.pow2_scales or c.eps:
                return False, f"modelopt: FP8QTensor is e4m3 with scale amax/448 (no pow2, no eps); not {c.id}"
            return True, ""
        if c.scheme == "mxfp8":
            if c.element != "e4m3" or c.tile != (1, 32) or c.e8m0_rule != "ceil":
                return False, f"modelopt: MXFP8QTensor is e4m3, 1x32, exponent ceil(log2(amax/448)); not {c.id}"
            return True, ""
        if c.scheme == "nvfp4":
            if c.tile != (1, 16) or c.rht or c.stochastic or c.variant is not None:
                return False, f"modelopt: NVFP4QTensor.quantize is 1x16, round-to-nearest, no RHT/variant; not {c.id}"
            return True, ""
        return False, f"modelopt: no ModelOpt quantizer for {c.scheme} (fp8_delayed is a calibration workflow)"

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        ok, why = self._supports_config(config) if _installed() else (False, "modelopt: not installed")
        if not ok:
            raise Unsupported(why)
        from modelopt.torch.quantization.qtensor import FP8QTensor, MXFP8QTensor, NVFP4QTensor
        from modelopt.torch.quantization.utils import reduce_amax

        x2d = build.two_d(x)
        q = build.empty(config, x)
        want = {"rowwise": rowwise, "colwise": colwise}
        scheme = config.scheme
        if scheme == "fp8_current" or (scheme == "fp8_block" and config.tile == (128, 128)):
            blocks = {-1: 128, -2: 128} if scheme == "fp8_block" else None
            t, s = FP8QTensor.quantize(x2d, block_sizes=blocks)
            amax = reduce_amax(x2d).float() if scheme == "fp8_current" else None
            for o in ("rowwise", "colwise"):
                if want[o]:  # the colwise copy is the transposed codes, the same scale(s)
                    build.put_copy(q, o, data=t._quantized_data, scale=s, amax=amax, by="logical")
            return q
        a_g = reduce_amax(x2d).float().reshape(1)  # NVFP4: one global amax for both copies
        for o, src in (("rowwise", x2d), ("colwise", x2d.t().contiguous())):
            if not want[o]:
                continue
            if scheme == "fp8_block":
                t, s = FP8QTensor.quantize(src, block_sizes={-1: 128})
                build.put_copy(q, o, data=t._quantized_data, scale=s)
            elif scheme == "mxfp8":
                t, s = MXFP8QTensor.quantize(src)
                build.put_copy(q, o, data=t._quantized_data, scale=s)
            else:
                t, s, _ = NVFP4QTensor.quantize(src, 16, weights_scaling_factor_2=a_g / _E2M1_X_E4M3)
                build.put_copy(q, o, data=t._quantized_data, scale=s, amax=a_g)
        return q

    def dequantize(self, q, orientation="rowwise", dtype=torch.float32):
        """ModelOpt's own decode of the contract's copy (scales cropped to the valid region)."""
        from modelopt.torch.quantization.qtensor import FP8QTensor, MXFP8QTensor, NVFP4QTensor

        g = build.geometry(q, orientation)
        data = getattr(q, f"{orientation}_data")
        sc = getattr(q, f"{orientation}_scale")
        r, c = g.scale_valid_shape if len(g.scale_valid_shape) == 2 else (1, 1)
        scheme = q.config.scheme
        if scheme == "nvfp4":
            t = NVFP4QTensor((g.rows, g.cols), torch.float32, data)
            out = t.dequantize(torch.float32, scale=sc[:r, :c].view(torch.float8_e4m3fn),
                               double_scale=getattr(q, f"{orientation}_amax").float() / _E2M1_X_E4M3,
                               block_sizes={-1: 16})
        elif scheme == "mxfp8":
            if orientation == "colwise":
                raise Unsupported("modelopt: MXFP8QTensor decodes blocks along the last dim only (rowwise copy)")
            t = MXFP8QTensor((g.rows, g.cols), torch.float32, data.view(torch.float8_e4m3fn))
            out = t.dequantize(torch.float32, scale=sc[:r, :c])
        elif scheme == "fp8_current":
            t = FP8QTensor((g.rows, g.cols), torch.float32, data.view(torch.float8_e4m3fn))
            out = t.dequantize(torch.float32, scale=sc.reshape(()))
        else:
            raise Unsupported(f"modelopt: dequantize of {scheme} is not adapted")
        out = out.reshape(g.rows, g.cols)
        return (out.t() if g.transposed else out).contiguous().to(dtype)


backend = ModelOpt()
