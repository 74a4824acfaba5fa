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

from .launch import device_index
from .launchers import launcher
from .per_tensor import update_amax_history as _update_amax_history
from .plan import QUANTIZE_PLANS, STAMP

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
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        return False, f"device {device!r} is invalid: {e}"
    if op == "grouped_quantize":
        # native.grouped runs the scheme's quantize kernels once per group; a scheme without groups is a
        # SpecViolation of reference.grouped.splits_rule (docs/numerics.md §12.1), as in the reference.
        op = "quantize"
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
    out: QuantizedTensor | None = None,
) -> QuantizedTensor:
    """Quantize a CUDA tensor by `config` with the native kernels; same result as `reference.quantize`.

    A given `amax` (TE's quantize_with_amax; fp8_current and nvfp4, `reference.spec.check_given_amax`)
    replaces the scheme's amax pass: the kernels read X once (docs/numerics.md §1, §5.1).

    `out` (in place, like TE's `quantizer.update_quantized`): a QuantizedTensor returned by an earlier call with
    the same signature (config, shape, dtype, device, copies, kinds of rng / state / amax, x's contiguity and
    alignment) that a call plan allocated - any call after a signature's first, with plans on. Its tensors are
    overwritten (on torch's current stream) with this call's values and `out` itself is returned: every earlier
    reference to them sees the new values, and x must not overlap them. Anything else raises ValueError naming
    what differs (docs/design.md §4.1). Without `out`, every call returns fresh tensors.

    Raises SpecViolation for input that breaks the spec (`reference.spec.check_quantize`, plus: x must be
    on a CUDA device) and Unsupported when this machine cannot run the kernels.
    """
    key = _plan_key(x_hp, config, rowwise, colwise, rng, state, amax)
    if out is not None:
        return _quantize_into(out, key, x_hp, config, rowwise, colwise, rng, state, amax)
    plan = QUANTIZE_PLANS.get(key) if key is not None else None
    if plan is not None:
        # A later call of a planned signature: only the per-call values are checked (the SR seed's range, a host
        # amax's value, the fp8_delayed state), exactly as check_quantize / check_given_amax / quantize_2d do.
        seed = SRSeed.coerce(rng)
        given = None if amax is None else _planned_given(amax, config)
        # NUMERICS: §0.1 - [..., K] is [M, K]; a contiguous 2-D input already is (key[1]: shape, key[9]: contiguous).
        x2d = x_hp if key[9] and len(key[1]) == 2 else x_hp.reshape(-1, x_hp.shape[-1]).contiguous()
        got = plan.run(x2d, seed, given, state)
        if got is not None:
            q = QuantizedTensor(config=config, shape=tuple(x_hp.shape), hp_dtype=DTYPE_NAMES[x_hp.dtype], **got.public())
            got.key = key
            setattr(q, STAMP, got)  # what `out=q` writes again
            return q
    x2d, seed = check_quantize(x_hp, config, rowwise=rowwise, colwise=colwise, rng=rng)
    extra = {} if amax is None else {"amax": check_given_amax(amax, config)}
    if not x2d.is_cuda:
        raise _not_cuda(config, x2d)
    _require("quantize", config, x2d.device)
    with torch.cuda.device(x2d.device):
        mod = launcher(config.scheme)
        fields = mod.quantize_2d(x2d, config, rowwise=rowwise, colwise=colwise, rng=seed, state=state, **extra)
        if key is not None and plan is None:
            m, k = x2d.shape
            QUANTIZE_PLANS.put(key, mod.plan_quantize(config, m, k, x2d.dtype, rowwise=bool(rowwise),
                                                      colwise=bool(colwise), aligned=x2d.data_ptr() % 16 == 0,
                                                      given=amax is not None, index=device_index(x2d.device)))  # fmt: skip
    return QuantizedTensor(config=config, shape=tuple(x_hp.shape), hp_dtype=DTYPE_NAMES[x_hp.dtype], **fields)


def _not_cuda(config, x2d) -> SpecViolation:
    return SpecViolation(
        f"{config.id}: the native backend quantizes CUDA tensors; x is on {x2d.device} "
        f"(move it with x.cuda(), or use the reference backend)"
    )


# What each entry of a quantize plan key is (_plan_key), for the errors of out=.
KEY_NAMES = ("config", "x.shape", "x.dtype", "x.device", "rowwise", "colwise", "rng is None", "state is None",
             "amax is None", "x.is_contiguous()", "x is 16-byte aligned (or copied)")  # fmt: skip


def _quantize_into(out, key, x_hp, config, rowwise, colwise, rng, state, amax) -> QuantizedTensor:
    """quantize(..., out=out): the call's values written into out's tensors (the plan that allocated them)."""
    got = getattr(out, STAMP, None) if isinstance(out, QuantizedTensor) else None
    if got is None:
        what = type(out).__name__ if not isinstance(out, QuantizedTensor) else "a QuantizedTensor no call plan allocated"
        raise ValueError(
            f"out= takes a QuantizedTensor that a native call plan allocated (a call after the first of its "
            f"signature, with plans on; not a copy), got {what}"
        )
    if key != got.key:
        if key is None:  # a call no plan can make: the full path's error
            x2d, _ = check_quantize(x_hp, config, rowwise=rowwise, colwise=colwise, rng=rng)
            raise _not_cuda(config, x2d)
        diffs = [f"{n} is {a!r} here, {b!r} for out" for n, a, b in zip(KEY_NAMES, key, got.key, strict=True) if a != b]
        raise ValueError(f"out= was allocated by another call signature: {'; '.join(diffs)}")
    fields = got.fields
    for name in got.plan.block.public or fields:
        if getattr(out, name) is not fields[name]:
            raise ValueError(f"out.{name} is not the tensor its call plan allocated (was it replaced?)")
    # As the planned path of quantize: only the per-call values are checked.
    seed = SRSeed.coerce(rng)
    given = None if amax is None else _planned_given(amax, config)
    # NUMERICS: §0.1 - [..., K] is [M, K]; a contiguous 2-D input already is (key[1]: shape, key[9]: contiguous).
    x2d = x_hp if key[9] and len(key[1]) == 2 else x_hp.reshape(-1, x_hp.shape[-1]).contiguous()
    got.plan.run(x2d, seed, given, state, into=got)
    return out


def _planned_given(amax, config: QuantConfig):
    """check_given_amax for a planned call (whose config took a given amax on the signature's first call): a CUDA
    fp32 tensor of shape [] or [1] is taken as it is (check_given_amax would return it as [1] unread, §5.1; the
    kernels read its one element by pointer), anything else gets the full check (a host amax's value rules, the
    errors)."""
    if type(amax) is torch.Tensor and amax.is_cuda and amax.dtype is torch.float32 and amax.dim() < 2 and amax.numel() == 1:
        return amax
    return check_given_amax(amax, config)


def _plan_key(x_hp, config, rowwise, colwise, rng, state, amax) -> tuple | None:
    """The quantize plan key (docs/design.md §4.1): everything check_quantize and the launch geometry read - config,
    shape, dtype, device, copies, the kinds of rng / state / amax - and the input's contiguity and 16-byte
    alignment (the vector-width choices); None when the call cannot have a plan (not a CUDA tensor, ...)."""
    if not isinstance(x_hp, torch.Tensor) or type(config) is not QuantConfig:
        return None
    dev = x_hp.device
    if dev.type != "cuda":
        return None
    contiguous = x_hp.is_contiguous()
    return (config, x_hp.shape, x_hp.dtype, dev, bool(rowwise), bool(colwise), rng is None, state is None,
            amax is None, contiguous, not contiguous or x_hp.data_ptr() % 16 == 0)  # fmt: skip


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
