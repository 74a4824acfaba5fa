"""Native `quantize` / `dequantize` / `supports`: the reference's checks, then CUDA kernels per scheme.

Source: DESIGN.md §3-§4 (same signatures as `reference`, SpecViolation / Unsupported), NUMERICS.md
§1 (fp8_current), §2 (fp8_delayed), §3 (mxfp8), §4 (fp8_block); "nvfp4" goes to `native.nvfp4`.
Kernels live in native/cuda/*.cu and are built only by `native._compile.load_module`. Tensors reach
the kernels as raw device pointers (zero copy) and every launch runs on torch's current stream
(`native.launch`). CuPy is
imported lazily, so this module imports on a CPU-only machine.
"""

from __future__ import annotations

import functools
import importlib
import math

import numpy as np
import torch

from reference import layouts
from reference.formats import QuantConfig
from reference.spec import DTYPE_NAMES, check_dequantize, check_quantize
from reference.types import QuantizedTensor, SpecViolation, SRSeed, Unsupported

from .launch import launch

# Scheme -> CUDA source (nvfp4: native/nvfp4.py owns its kernels).
CU_FILES = {
    "fp8_current": "fp8_per_tensor.cu",
    "fp8_delayed": "fp8_per_tensor.cu",
    "mxfp8": "mxfp8.cu",
    "fp8_block": "fp8_block.cu",
}
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_TILE = 128  # the kernels' CTA tile (native/cuda/common.cuh kTile)
_THREADS = 256  # the kernels' CTA size (common.cuh kThreads)
_ELEMENTWISE_THREADS = 256
_SCALAR_SLOT = 4  # fp32 elements per scalar slot in the per-tensor buffer (16 bytes: aligned scale pointers)


# --------------------------------------------------------------------------------------------
# supports
# --------------------------------------------------------------------------------------------


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
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        return False, f"device {device!r} is invalid: {e}"
    if op == "gemm":
        try:
            from .gemm import supports_gemm
        except ImportError as e:
            return False, f"native.gemm is unavailable: {e}"
        return supports_gemm(config, dev)
    if op not in ("quantize", "dequantize"):
        return False, f"op {op!r} is unknown: expected 'quantize', 'dequantize' or 'gemm'"
    if dev.type != "cuda":
        return False, f"native kernels need a CUDA device, got {dev}"
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible (torch.cuda.is_available() is False)"
    gap = _cupy_gap()
    if gap:
        return False, gap
    if config.scheme == "nvfp4":
        try:
            mod = importlib.import_module(f"{__package__}.nvfp4")
        except ImportError as e:
            return False, f"native.nvfp4 is unavailable: {e}"
        sup = getattr(mod, "supports", None)
        return sup(op, config, dev) if callable(sup) else (True, "")
    if config.scheme not in CU_FILES:
        return False, f"scheme {config.scheme!r} has no native kernel"
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


# --------------------------------------------------------------------------------------------
# launching
# --------------------------------------------------------------------------------------------


def _module(config: QuantConfig, device: torch.device):
    """The compiled module of `config`'s scheme file for `device` (cached per config and device)."""
    return _module_for(config, device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _module_for(config: QuantConfig, device_index: int):
    from . import _compile

    with torch.cuda.device(device_index):
        arch = _compile.device_arch(device_index)
        return _compile.load_module(CU_FILES[config.scheme], _compile.defines_for(config), arch=arch)


def _launch(mod, name: str, grid: int, block: int, args: tuple, device: torch.device) -> None:
    """Launch `name` on torch's current stream of `device`."""
    launch(mod, name, grid, block, args, device.index if device.index is not None else torch.cuda.current_device())


def _i64(v: int) -> np.int64:
    return np.int64(v)


def _i32(v: int | bool) -> np.int32:
    return np.int32(int(v))


def _aligned(t: torch.Tensor | None, nbytes: int = 16) -> bool:
    return t is not None and t.data_ptr() % nbytes == 0


def _n_tiles(m: int, k: int) -> int:
    return math.ceil(m / _TILE) * math.ceil(k / _TILE)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _elementwise_grid(n: int, device: torch.device) -> int:
    return max(1, min(math.ceil(n / _ELEMENTWISE_THREADS), _sm_count(device) * 32))


def _vec_flags(x2d: torch.Tensor, q_row: torch.Tensor | None, q_col: torch.Tensor | None) -> tuple[int, int, int]:
    """(vec_in, vec_row, vec_col): 16-byte input rows, 8-byte rowwise stores, 16-byte transposed stores."""
    m, k = x2d.shape
    vec_in = _aligned(x2d) and (k * x2d.element_size()) % 16 == 0
    vec_row = q_row is None or (_aligned(q_row, 8) and k % 8 == 0)
    vec_col = q_col is None or (_aligned(q_col) and m % 16 == 0)
    return int(vec_in), int(vec_row), int(vec_col)


def _vec_flags_same_layout(x2d, q_row, q_col) -> tuple[int, int]:
    """(vec_in, vec_out) for kernels whose both outputs are [M, K] (mxfp8)."""
    m, k = x2d.shape
    vec_in = _aligned(x2d) and (k * x2d.element_size()) % 16 == 0
    vec_out = k % 8 == 0 and all(t is None or _aligned(t, 8) for t in (q_row, q_col))
    return int(vec_in), int(vec_out)


# --------------------------------------------------------------------------------------------
# per-scheme quantizers (each returns the QuantizedTensor fields, like reference.<module>.quantize_2d)
# --------------------------------------------------------------------------------------------


def _per_tensor(x2d: torch.Tensor, config: QuantConfig, rowwise: bool, colwise: bool, state) -> dict:
    """fp8_current (NUMERICS §1: amax pass, scale, one cast pass) and fp8_delayed (§2: cast with state.scale)."""
    dev = x2d.device
    m, k = x2d.shape
    mod = _module(config, dev)
    sfx = _SUFFIX[x2d.dtype]
    # One zeroed fp32 buffer (one memset) holds every scalar, each slot 16-byte aligned:
    # amax (+0: the start of every amax, NUMERICS §0.1), scale, sinv, and the colwise copy's amax and sinv.
    slots = torch.zeros(5 * _SCALAR_SLOT, dtype=torch.float32, device=dev)
    amax, scale, sinv, amax_c, sinv_c = (slots[i * _SCALAR_SLOT:i * _SCALAR_SLOT + 1] for i in range(5))
    q_row = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None  # (M, K)
    q_col = torch.empty((k, m), dtype=torch.uint8, device=dev) if colwise else None  # (K, M)
    vec_in, vec_row, vec_col = _vec_flags(x2d, q_row, q_col)
    both = rowwise and colwise
    if config.scheme == "fp8_current":
        if state is not None:
            raise ValueError(f"{config.id}: state is only for fp8_delayed (got {type(state).__name__})")
        n = m * k
        grid = _elementwise_grid(math.ceil(n / 8), dev)
        _launch(mod, f"tensor_amax_{sfx}", grid, _THREADS, (x2d, _i64(n), _i32(_aligned(x2d)), amax), dev)
        # The cast kernel derives the scale from the amax itself (NUMERICS §1) and stores scale, sinv
        # and the second copy's amax / sinv (no separate scale launch).
        amax_in, amax_acc, copy_amax, copy_sinv = amax, None, (amax_c if both else None), (sinv_c if both else None)
    else:
        from reference.per_tensor import AmaxHistory

        if state is None:
            # Documented (as in the reference): a fresh AmaxHistory (scale 1.0), then discarded.
            state = AmaxHistory(config, device=dev)
        if not isinstance(state, AmaxHistory):
            raise ValueError(f"{config.id}: state must be a reference.per_tensor.AmaxHistory, got {type(state).__name__}")
        if state.config != config:
            raise ValueError(f"{config.id}: state was built for {state.config.id}, not for this config")
        scale = state.scale.to(device=dev, dtype=torch.float32).contiguous()
        # NUMERICS: §2 sinv = RN(1/scale); amax of the unscaled input
        amax_in, amax_acc, copy_amax, copy_sinv = None, amax, None, None
    _launch(
        mod,
        f"per_tensor_cast_{sfx}",
        _n_tiles(m, k),
        _THREADS,
        (x2d, _i64(m), _i64(k), _i32(vec_in), _i32(vec_row), _i32(vec_col), amax_in, scale, sinv, amax_acc,
         copy_amax, copy_sinv, q_row, q_col),
        dev,
    )
    if config.scheme == "fp8_delayed":
        state.record(amax)  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) on the state's own device
        if both:  # the cast kernel wrote amax and sinv once; the colwise copy gets its own tensors
            amax_c.copy_(amax)
            sinv_c.copy_(sinv)
    out: dict = {}
    # NUMERICS: §1 the transposed copy shares sinv and the amax (as separate tensors of equal value).
    if rowwise:
        out.update(rowwise_data=q_row, rowwise_scale=sinv, rowwise_amax=amax)
    if colwise:
        out.update(colwise_data=q_col, colwise_scale=sinv_c if both else sinv, colwise_amax=amax_c if both else amax)
    return out


def _mxfp8(x2d: torch.Tensor, config: QuantConfig, rowwise: bool, colwise: bool) -> dict:
    """MXFP8 (NUMERICS §3): both copies [M, K], compact E8M0 scales with zero padding."""
    dev = x2d.device
    m, k = x2d.shape
    mod = _module(config, dev)
    u8 = dict(dtype=torch.uint8, device=dev)
    q_row = torch.empty((m, k), **u8) if rowwise else None
    q_col = torch.empty((m, k), **u8) if colwise else None
    # The kernel writes every scale byte, the zero padding included (mxfp8.cu), so no memset is needed.
    s_r = torch.empty(layouts.scale_padded_shape(config, "rowwise", m, k), **u8) if rowwise else None
    s_c = torch.empty(layouts.scale_padded_shape(config, "colwise", m, k), **u8) if colwise else None
    vec_in, vec_out = _vec_flags_same_layout(x2d, q_row, q_col)
    ld_r = s_r.shape[1] if s_r is not None else 0
    ld_c = s_c.shape[1] if s_c is not None else 0
    _launch(
        mod,
        f"mxfp8_quantize_{_SUFFIX[x2d.dtype]}",
        _n_tiles(m, k),
        _THREADS,
        (x2d, _i64(m), _i64(k), _i32(vec_in), _i32(vec_out), q_row, s_r, _i64(ld_r), q_col, s_c, _i64(ld_c)),
        dev,
    )
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=q_row, rowwise_scale=s_r, rowwise_amax=None)
    if colwise:
        out.update(colwise_data=q_col, colwise_scale=s_c, colwise_amax=None)
    return out


def _fp8_block(x2d: torch.Tensor, config: QuantConfig, rowwise: bool, colwise: bool) -> dict:
    """FP8 blockwise 1x128 / 128x128 (NUMERICS §4): rowwise [M, K], colwise [K, M], fp32 sinv layouts."""
    dev = x2d.device
    m, k = x2d.shape
    mod = _module(config, dev)
    f32 = dict(dtype=torch.float32, device=dev)
    q_row = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None  # (M, K)
    q_col = torch.empty((k, m), dtype=torch.uint8, device=dev) if colwise else None  # (K, M)
    # The kernel writes every scale, the zero padding included (fp8_block.cu), so no memset is needed.
    s_r = torch.empty(layouts.scale_padded_shape(config, "rowwise", m, k), **f32) if rowwise else None
    s_c = torch.empty(layouts.scale_padded_shape(config, "colwise", m, k), **f32) if colwise else None
    vec_in, vec_row, vec_col = _vec_flags(x2d, q_row, q_col)
    ld_r = s_r.shape[1] if s_r is not None else 0
    ld_c = s_c.shape[1] if s_c is not None else 0
    _launch(
        mod,
        f"fp8_block_quantize_{_SUFFIX[x2d.dtype]}",
        _n_tiles(m, k),
        _THREADS,
        (x2d, _i64(m), _i64(k), _i32(vec_in), _i32(vec_row), _i32(vec_col), q_row, s_r, _i64(ld_r), q_col, s_c,
         _i64(ld_c)),
        dev,
    )
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=q_row, rowwise_scale=s_r, rowwise_amax=None)
    if colwise:
        out.update(colwise_data=q_col, colwise_scale=s_c, colwise_amax=None)
    return out


# --------------------------------------------------------------------------------------------
# public entry points
# --------------------------------------------------------------------------------------------


def quantize(
    x_hp: torch.Tensor,
    config: QuantConfig,
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
    state=None,
) -> QuantizedTensor:
    """Quantize a CUDA tensor by `config` with the native kernels; same result as `reference.quantize`.

    Raises SpecViolation for input that breaks the spec (the reference's checks, plus: x must be on
    a CUDA device) and Unsupported when this machine cannot run the kernels.
    """
    x2d, seed = check_quantize(x_hp, config, rowwise=rowwise, colwise=colwise, rng=rng)
    if not x2d.is_cuda:
        raise SpecViolation(
            f"{config.id}: the native backend quantizes CUDA tensors; x is on {x2d.device} "
            f"(move it with x.cuda(), or use the reference backend)"
        )
    _require("quantize", config, x2d.device)
    with torch.cuda.device(x2d.device):
        if config.scheme == "nvfp4":
            from . import nvfp4

            fields = nvfp4.quantize_2d(x2d, config, rowwise=rowwise, colwise=colwise, rng=seed, state=state)
        elif config.scheme in ("fp8_current", "fp8_delayed"):
            fields = _per_tensor(x2d, config, rowwise, colwise, state)
        elif config.scheme == "mxfp8":
            fields = _mxfp8(x2d, config, rowwise, colwise)
        elif config.scheme == "fp8_block":
            fields = _fp8_block(x2d, config, rowwise, colwise)
        else:  # pragma: no cover - QuantConfig validates the scheme
            raise Unsupported(f"native quantize has no kernel for scheme {config.scheme!r}")
    return QuantizedTensor(config=config, shape=tuple(x_hp.shape), hp_dtype=DTYPE_NAMES[x_hp.dtype], **fields)


def dequantize(q: QuantizedTensor, orientation: str = "rowwise", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_hat of one copy as the GPU computes it, [M, K] (colwise copies transposed back); CUDA tensors in/out."""
    check_dequantize(q, orientation, dtype)  # the spec rules, with the reference's messages
    config = q.config
    data = getattr(q, f"{orientation}_data")
    scale = getattr(q, f"{orientation}_scale")
    if not data.is_cuda:
        raise SpecViolation(f"{config.id}: the native backend dequantizes CUDA tensors; data is on {data.device}")
    dev = data.device
    _require("dequantize", config, dev)
    with torch.cuda.device(dev):
        if config.scheme == "nvfp4":
            from . import nvfp4

            return nvfp4.dequantize(q, orientation, dtype)
        m, k = q.m, q.k
        data = data.contiguous()
        scale = scale.to(device=dev).contiguous()
        out = torch.empty((m, k), dtype=dtype, device=dev)  # (M, K)
        mod = _module(config, dev)
        sfx = _SUFFIX[dtype]
        colw = _i32(orientation == "colwise")
        grid = _elementwise_grid(m * k, dev)
        if config.scheme in ("fp8_current", "fp8_delayed"):
            name, args = f"per_tensor_dequantize_{sfx}", (data, scale, _i64(m), _i64(k), colw, out)
        elif config.scheme == "mxfp8":
            name, args = f"mxfp8_dequantize_{sfx}", (data, scale, _i64(scale.shape[1]), _i64(m), _i64(k), colw, out)
        else:
            name, args = f"fp8_block_dequantize_{sfx}", (data, scale, _i64(scale.shape[1]), _i64(m), _i64(k), colw, out)
        _launch(mod, name, grid, _ELEMENTWISE_THREADS, args, dev)
        return out


def update_amax_history(state, reduced_amax: torch.Tensor | float | None = None) -> None:
    """The fused end-of-step fp8_delayed update on the GPU (NUMERICS §2 steps 1-6), like AmaxHistory.update.

    `state.history` and `state.scale` are replaced by the new tensors, on the state's own device.
    """
    from reference.per_tensor import AmaxHistory

    if not isinstance(state, AmaxHistory):
        raise ValueError(f"state must be a reference.per_tensor.AmaxHistory, got {type(state).__name__}")
    config = state.config
    home = state.history.device
    dev = home if home.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    _require("quantize", config, dev)
    with torch.cuda.device(dev):
        hist = state.history.to(device=dev, dtype=torch.float32).contiguous()  # (L,)
        h_out = torch.empty_like(hist)
        scale = state.scale.to(device=dev, dtype=torch.float32).clone()
        has_r = reduced_amax is not None
        r = (
            torch.as_tensor(reduced_amax, dtype=torch.float32).reshape(1).to(dev)
            if has_r
            else torch.zeros(1, dtype=torch.float32, device=dev)
        )
        _launch(_module(config, dev), "delayed_update", 1, 1024, (hist, h_out, scale, r, _i32(has_r)), dev)
    state.history = h_out.to(home)
    state.scale = scale.to(home)
