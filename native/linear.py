"""The native backend's Linear / LayerNormLinear training step: reference.linear's orchestration, native kernels.

Source: docs/numerics.md §9 (the step), docs/design.md §3 (native.quantize / native.gemm are drop-ins).
The step's order, its state (weight cache, amax histories, accumulated grads) and the SR seeds are
`reference.linear.module_step`'s; every quantization, GEMM and delayed-scaling update is native's (the
GEMM picks cuBLASLt or, where this GPU lacks the scale mode, the portable block-scaled kernel:
`native.gemm`'s method "auto"). Native has no norm or reduction kernels: the LayerNorm / RMSNorm, dbias and
the weight.grad accumulation are the shared PyTorch arithmetic of reference.linear on the same device
(docs/numerics.md §9.2, §9.3), so a mismatch this backend reports lies in a quantizer or a GEMM.
CUDA only; the harness checks it with the gpu-marked tests.
"""

from __future__ import annotations

from reference.linear import Kernels, ModuleParams, ModuleRun, ModuleSpec, StepInput
from reference.linear import run_module as _run_steps
from reference.types import Unsupported


def kernels() -> Kernels:
    """native.quantize, native.gemm and native.update_amax_history as a step's Kernels."""
    from . import gemm, quantize, update_amax_history  # noqa: PLC0415 - the package imports CuPy lazily

    return Kernels(quantize=quantize, gemm=gemm, update_amax_history=update_amax_history)


def run_module(spec: ModuleSpec, params: ModuleParams, steps: list[StepInput], *,
               with_kernels: Kernels | None = None) -> ModuleRun:
    """Every step of a module case with native kernels (`with_kernels` replaces them, for CPU tests of
    this path); the tensors must be on a CUDA device unless kernels are injected."""
    if with_kernels is None and params.weight.device.type != "cuda":
        raise Unsupported(f"native.linear runs on CUDA only (the weight is on {params.weight.device})")
    return _run_steps(spec, params, steps, kernels=with_kernels or kernels())
