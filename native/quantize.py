"""Native `quantize` / `dequantize` / `supports`: the spec rules of `reference.spec`, then the scheme's launcher.

Source: docs/design.md §3-§4 (same signatures as `reference`, SpecViolation / Unsupported), docs/numerics.md §0.3
(kernel rules). Every scheme's kernels are driven by its launcher module (`native.launchers`: per_tensor,
mxfp8, fp8_block, nvfp4); this module is generic. Kernels live in native/cuda/*.cu and are built only
by `native._compile`. Tensors reach the kernels as raw device pointers (zero copy) and every launch runs
on torch's current stream (`native.launch`). CuPy is imported lazily, so this module imports on a
CPU-only machine.
"""

from __future__ import annotations

import functools

import torch

from reference.conventions import DEFAULT as TE_CONVENTION
from reference.formats import QuantConfig
from reference.spec import DTYPE_NAMES, check_dequantize, check_given_amax, check_quantize
from reference.types import QuantizedTensor, SpecViolation, SRSeed, Unsupported

from .launchers import launcher
from .per_tensor import update_amax_history as _update_amax_history

OPS = ("quantize", "dequantize", "gemm")


def _cupy_gap() -> str | None:
    try:
        import cupy  # noqa: F401
        from cupy_backends.cuda.libs import nvrtc  # noqa: F401
    except Exception as e:
        return f"CuPy with NVRTC is not importable ({type(e).__name__}: {e}); install the 'gpu' extra"
    return None


def supports(op: str, config: QuantConfig, device) -> tuple[bool, str]:
    """(True, "") if the native backend can run `op` for `config` on `device`, else (False, reason)."""
    if not isinstance(config, QuantConfig):
        return False, f"config must be a QuantConfig, got {type(config).__name__}"
    if config.convention != TE_CONVENTION:
        return False, f"native implements the {TE_CONVENTION!r} convention only, not {config.convention!r}"
    if config.stochastic and config.is_2d:
        return False, ("native has not been validated for stochastic rounding on 16x16 tiles "
                       "(docs/numerics.md §5.7 colwise random bits); run it on a GPU before lifting this")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        return False, f"device {device!r} is invalid: {e}"
    if op == "grouped_quantize":
        return False, ("native: grouped (split) quantization has no kernel yet; the reference quantizes each "
                       "group on its own (docs/numerics.md §12.1)")
    if op == "gemm":
        try:
            from .gemm import supports_gemm
        except ImportError as e:
            return False, f"native.gemm is unavailable: {e}"
        return supports_gemm(config, dev)
    if op not in OPS:
        return False, f"op {op!r} is unknown: expected 'quantize', 'dequantize' or 'gemm'"
    if dev.type != "cuda":
        return False, f"native kernels need a CUDA device, got {dev}"
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible (torch.cuda.is_available() is False)"
    gap = _cupy_gap()
    if gap:
        return False, gap
    try:
        launcher(config.scheme)
    except (ImportError, ValueError) as e:
        return False, f"scheme {config.scheme!r} has no native launcher: {e}"
    return True, ""


def _require(op: str, config: QuantConfig, device: torch.device) -> None:
    ok, reason = _supports_cached(op, config, device)
    if not ok:
        raise Unsupported(f"native {op} of {config.id} on {device}: {reason}")


@functools.lru_cache(maxsize=1024)
def _supports_cached(op: str, config: QuantConfig, device: torch.device) -> tuple[bool, str]:
    """supports() for quantize / dequantize, once per (op, config, device): its answer depends only on
    this process's CuPy / CUDA setup, and it costs a few microseconds per call."""
    return supports(op, config, device)


def quantize(
    x_hp: torch.Tensor,
    config: QuantConfig,
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
    state=None,
    amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize a CUDA tensor by `config` with the native kernels; same result as `reference.quantize`.

    A given `amax` (reference.quantize's TE quantize_with_amax) has no kernel yet: Unsupported.

    Raises SpecViolation for input that breaks the spec (`reference.spec.check_quantize`, plus: x must be
    on a CUDA device) and Unsupported when this machine cannot run the kernels.
    """
    x2d, seed = check_quantize(x_hp, config, rowwise=rowwise, colwise=colwise, rng=rng)
    if amax is not None:
        check_given_amax(amax, config)
        raise Unsupported(f"native quantize of {config.id}: a given amax has no kernel yet (the kernel would read "
                          "X once, skipping its amax pass; docs/numerics.md §5.1)")
    if not x2d.is_cuda:
        raise SpecViolation(
            f"{config.id}: the native backend quantizes CUDA tensors; x is on {x2d.device} "
            f"(move it with x.cuda(), or use the reference backend)"
        )
    _require("quantize", config, x2d.device)
    with torch.cuda.device(x2d.device):
        fields = launcher(config.scheme).quantize_2d(x2d, config, rowwise=rowwise, colwise=colwise, rng=seed,
                                                     state=state)  # fmt: skip
    return QuantizedTensor(config=config, shape=tuple(x_hp.shape), hp_dtype=DTYPE_NAMES[x_hp.dtype], **fields)


def dequantize(q: QuantizedTensor, orientation: str = "rowwise", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_hat of one copy as the GPU computes it, [M, K] (colwise copies transposed back); CUDA tensors in/out."""
    check_dequantize(q, orientation, dtype)
    config = q.config
    data = getattr(q, f"{orientation}_data")
    if not data.is_cuda:
        raise SpecViolation(f"{config.id}: the native backend dequantizes CUDA tensors; data is on {data.device}")
    dev = data.device
    _require("dequantize", config, dev)
    with torch.cuda.device(dev):
        return launcher(config.scheme).dequantize(q, orientation, dtype)


def update_amax_history(state, reduced_amax: torch.Tensor | float | None = None) -> None:
    """The fused end-of-step fp8_delayed update on the GPU (docs/numerics.md §2 steps 1-6), like AmaxHistory.update.

    `state.history` and `state.scale` are replaced by the new tensors, on the state's own device.
    """
    from reference.per_tensor import AmaxHistory

    if not isinstance(state, AmaxHistory):
        raise ValueError(f"state must be a reference.per_tensor.AmaxHistory, got {type(state).__name__}")
    home = state.history.device
    dev = home if home.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    _require("quantize", state.config, dev)
    _update_amax_history(state, reduced_amax)
