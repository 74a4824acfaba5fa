"""A complete third-party adapter: a small "user kernel" (a naive per-tensor FP8 quantizer) wrapped as a Backend.

This is what validating a new kernel against the golden reference takes. The kernel below is plain
PyTorch standing in for yours (a CUDA extension, a Triton kernel, ...); the adapter class maps
its outputs onto the contract types (`reference.QuantizedTensor`, docs/design.md §3) and says which
cases it supports. Run the harness on it from the repository root:

    python -m harness run --tier smoke --backend examples.my_kernel_adapter:backend --out reports/my_kernel
    python -m harness report reports/my_kernel
    pytest cases/smoke.toml --backend examples.my_kernel_adapter:backend          # or as pytest items
    python -m harness repro <case_id> --backend examples.my_kernel_adapter:backend

Cases it does not support (every scheme but fp8_current, GEMMs) are reported as skips with the
reason from `supports`. `broken_backend` is the same kernel with a classic bug
(reciprocal-then-multiply scale, docs/numerics.md §0.2.2), to see what a located mismatch looks like:

    python -m harness run --tier smoke --backend examples.my_kernel_adapter:broken_backend --filter fp8_current

To publish an adapter from your own package instead, add an entry point:

    [project.entry-points."numerics_harness.backends"]
    my_kernel = "my_package.adapter:backend"

and run with `--backend my_kernel`.
"""

from __future__ import annotations

import torch

from reference import QuantConfig, QuantizedTensor, Unsupported

_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


# ---- the "user kernel" ------------------------------------------------------------------------


def my_fp8_quantize(x: torch.Tensor, fp8_dtype: torch.dtype, nan_code: int, *, reciprocal_bug: bool = False):
    """Naive per-tensor current-scaling FP8 quantizer: returns (codes uint8 [M, K], sinv fp32 [1], amax fp32 [1])."""
    x32 = x.reshape(-1, x.shape[-1]).float()  # (M, K)
    mag = x32.abs()
    amax = torch.where(torch.isnan(mag), torch.zeros_like(mag), mag).amax().reshape(1)  # NaN-ignoring amax
    fp8_max = torch.full_like(amax, torch.finfo(fp8_dtype).max)
    if reciprocal_bug:
        scale = fp8_max * torch.reciprocal(amax)  # the bug: two roundings instead of one division
    else:
        scale = torch.div(fp8_max, amax)  # one correctly rounded division
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, torch.finfo(torch.float32).max), scale)
    scale = torch.where((amax == 0) | torch.isinf(amax), torch.ones_like(scale), scale)
    y = x32 * scale
    codes = torch.clamp(y, -fp8_max, fp8_max).to(fp8_dtype).view(torch.uint8)  # saturate, then cast
    codes = torch.where(torch.isnan(y), torch.full_like(codes, nan_code), codes)  # the GPU's NaN byte
    return codes, torch.reciprocal(scale), amax


# ---- the adapter --------------------------------------------------------------------------------


class MyKernelBackend:
    """Backend adapter around `my_fp8_quantize`: fp8_current quantize and dequantize, any device."""

    def __init__(self, name: str = "my_kernel", *, reciprocal_bug: bool = False):
        self.name = name
        self.reciprocal_bug = reciprocal_bug

    def supports(self, op: str, config: QuantConfig, device) -> tuple[bool, str]:
        if op not in ("quantize", "dequantize"):
            return False, f"{self.name}: only quantize/dequantize are implemented (not {op})"
        if config.scheme != "fp8_current" or config.pow2_scales or config.eps:
            return False, f"{self.name}: only plain fp8_current (no pow2 scales, eps 0) is implemented, not {config.id}"
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None) -> QuantizedTensor:
        ok, why = self.supports("quantize", config, x.device)
        if not ok:
            raise Unsupported(why)
        fmt = config.element_format  # the contract's format row (reference/formats.py)
        codes, sinv, amax = my_fp8_quantize(x, _FP8[config.element], fmt.nan_code, reciprocal_bug=self.reciprocal_bug)
        q = QuantizedTensor(config=config, shape=tuple(x.shape), hp_dtype=str(x.dtype).removeprefix("torch."))
        if rowwise:
            q.rowwise_data, q.rowwise_scale, q.rowwise_amax = codes, sinv, amax
        if colwise:  # the transposed copy [K, M] shares the scale (docs/numerics.md §1)
            q.colwise_data, q.colwise_scale, q.colwise_amax = codes.t().contiguous(), sinv.clone(), amax.clone()
        return q

    def dequantize(self, q: QuantizedTensor, orientation: str = "rowwise", dtype=torch.float32) -> torch.Tensor:
        codes, sinv = getattr(q, f"{orientation}_data"), getattr(q, f"{orientation}_scale")
        d = codes.view(_FP8[q.config.element]).float()
        d = torch.where(torch.isnan(d), torch.copysign(torch.full_like(d, float("nan")), d), d)  # plain quiet NaN
        x = d * sinv
        return (x if orientation == "rowwise" else x.t()).contiguous().to(dtype)


backend = MyKernelBackend()
broken_backend = MyKernelBackend("my_kernel_broken", reciprocal_bug=True)
