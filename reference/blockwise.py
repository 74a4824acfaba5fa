"""FP8 blockwise scaling (`fp8_block`): 1x128 and 128x128 blocks with fp32 scales.

Source: docs/numerics.md §4; TE common/transpose/quantize_transpose_vector_blockwise.cu (1x128),
quantize_transpose_square_blockwise.cu (128x128), common/recipe/recipe_common.cuh (compute_scale).

Per block: A = amax(block) over the valid elements (edge blocks zero-padded, any shape);
(s, sinv) = compute_scale(A, fp8_max, pow2, eps, v_inf = max finite of the INPUT dtype);
q = sat_fp8(RN(x*s)). Layouts (padding zero):
- 1-D rowwise: data [M, K]; sinv stored TRANSPOSED [ceil(K/128), roundup(M,4)], entry [kb, m].
- 1-D colwise: data [K, M] (row k = 1x128 quantization of column k of x); sinv [ceil(M/128), roundup(K,4)],
  entry [mb, k].
- 2-D: rowwise sinv [ceil(M/128), roundup(ceil(K/128),4)], entry [mb, kb]; colwise data [K, M] is exactly
  the transpose of the rowwise data, colwise sinv [ceil(K/128), roundup(ceil(M/128),4)] the transpose of
  the rowwise sinv.
Conventions `vllm_group` and `vllm_group_ue8m0` (1x128; docs/numerics.md §10.7) replace the
scale rule and the element step in `_scale` and `_encode`; layouts are unchanged.
Under the `te` rule a chunk without NaN takes `_quantize_chunk_nan_free`: the same bits with fewer passes
(amaxes in the input dtype, one scale computation, no NaN fix-up); the general path handles everything else.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import casts, fp32, layouts, scaling
from .formats import INPUT_DTYPE_MAX, QuantConfig
from .spec import DTYPE_NAMES
from .types import QuantizedTensor

# Elements per row chunk: bounds the fp32 temporaries (a few chunk-sized tensors at a time).
CHUNK_ELEMENTS = 1 << 22
# The `te` rule's NaN-free chunks take `_quantize_chunk_nan_free` (same bits, fewer passes); tests switch it off
# to compare it with the general path. Its temporaries are smaller (|x| in the input dtype, no NaN mask), so its
# chunks are larger: fewer, longer operations, which matters most on a loaded machine. A chunk holding a NaN is
# redone by the general path in chunks of CHUNK_ELEMENTS.
FAST_PATH = True
FAST_CHUNK_ELEMENTS = 1 << 24


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _roundup(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _row_chunks(m: int, k: int, rows_multiple: int, elements: int):
    """(m0, m1) row ranges of about `elements` elements, m0 a multiple of `rows_multiple`."""
    rows = max(1, elements // max(k, 1) // rows_multiple) * rows_multiple
    for m0 in range(0, m, rows):
        yield m0, min(m, m0 + rows)


def pow2_up(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 v) for finite v > 0, exactly (from the bits, subnormals included); 0, inf, NaN unchanged."""
    mant, e = torch.frexp(v)  # v = mant * 2^e, mant in [0.5, 1)
    up = torch.ldexp(torch.ones_like(v, dtype=torch.float64), e - (mant == 0.5).to(e.dtype)).to(torch.float32)
    return torch.where(torch.isfinite(v) & (v > 0), up, v)


def _vllm_scale(a: torch.Tensor, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, sinv) of vLLM's per-token-group rule; s is unused by `_encode` (it divides by sinv)."""
    fp8_max = config.element_format.max_finite
    # NUMERICS: §10.7 - A = max(amax, eps) (vLLM fp8_utils._per_token_group_quant_fp8: tl.maximum(absmax, eps);
    # amax NaN-ignoring like Triton's tl.max); sinv = RN(A / fp8_max), a true division.
    a = a.to(torch.float32)
    eps = fp32.scalar(config.eps, a)
    sinv = fp32.div(torch.where(a < eps, eps, a), fp8_max)
    if config.convention == "vllm_group_ue8m0":
        # NUMERICS: §10.7 - use_ue8m0: sinv = exp2(ceil(log2(sinv))), taken exactly (rounded up to a power of two).
        sinv = pow2_up(sinv)
    return fp32.div(1.0, sinv), sinv


def _scale(a: torch.Tensor, config: QuantConfig, v_inf: float) -> tuple[torch.Tensor, torch.Tensor]:
    if config.convention != "te":
        return _vllm_scale(a, config)
    # NUMERICS: §4 s = compute_scale(A, fp8_max, pow2, eps, v_inf = max finite of the input dtype).
    fp8_max = config.element_format.max_finite
    return scaling.compute_scale(a, fp8_max, pow2=config.pow2_scales, eps=config.eps, v_inf=v_inf)


def _encode(blocks: torch.Tensor, s: torch.Tensor, sinv: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """Codes of scaled blocks: sat_fp8(RN(x*s)) (NUMERICS: §4), or sat_fp8(RN(x / sinv)) under vLLM's rule."""
    if config.convention != "te":
        # NUMERICS: §10.7 - y_q = clamp(y / y_s): a true division by the stored decode scale.
        return casts.saturating_cast(fp32.div(blocks, sinv), config.element_format)
    return casts.saturating_cast(blocks * s, config.element_format)


def _holds_nan(abs_amax: torch.Tensor) -> bool:
    """Whether a NaN-propagating amax (torch's amax of |x| in the input dtype) met a NaN.

    NUMERICS: §0.1 amax - |x| and max are exact in any float dtype and any order, and widening is exact, so for
    NaN-free blocks torch's amax equals scaling.amax (§0.2.5's NaN-to-0 step changes nothing); torch's amax
    propagates NaN, so a NaN anywhere in the blocks shows up here and the caller takes the general path.
    """
    return abs_amax.numel() > 0 and bool(torch.isnan(abs_amax.max()))


@functools.lru_cache(maxsize=64)
def _scale_table(config: QuantConfig, dtype: torch.dtype, v_inf: float, device: torch.device):
    """(s, sinv) of every non-negative value of a 16-bit input dtype, indexed by its bit pattern (built once)."""
    vals = torch.arange(1 << 15, dtype=torch.int16, device=device).view(dtype)  # +0 .. +inf, then NaNs
    return _scale(vals.to(torch.float32), config, v_inf)


def _scales(amaxes: list[torch.Tensor], config: QuantConfig, v_inf: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(s, sinv) for each amax tensor (|x| amaxes in the input dtype, NaN-free), from one computation.

    The scale rule is elementwise, so one `_scale` call on all of them gives the same bits. For a bf16 / fp16
    input every amax is one of 2^15 non-negative 16-bit values: their (s, sinv) are computed once per rule and
    looked up (exact, and a few large operations instead of the rule's two dozen).
    """
    flat = torch.cat([a.reshape(-1) for a in amaxes])
    if flat.dtype in (torch.bfloat16, torch.float16):
        s_t, sinv_t = _scale_table(config, flat.dtype, v_inf, flat.device)
        idx = flat.view(torch.int16).to(torch.int32)  # amax >= +0: the sign bit is clear
        s, sinv = s_t[idx], sinv_t[idx]
    else:
        s, sinv = _scale(flat.to(torch.float32), config, v_inf)  # exact widening
    out, i = [], 0
    for a in amaxes:
        n = a.numel()
        out.append((s[i : i + n].view(a.shape), sinv[i : i + n].view(a.shape)))
        i += n
    return out


def _encode_nan_free(blocks: torch.Tensor, s: torch.Tensor, fmt, out: torch.Tensor | None = None) -> torch.Tensor:
    """sat_fp8(RN(x*s)) for NaN-free fp32 blocks and finite s > 0 (the `te` rule's scales); codes into `out`."""
    # NUMERICS: §4 q = sat_fp8(RN(x*s)), one fp32 multiply. x*s has no NaN: x is not NaN and s is finite and > 0
    # (§1 steps 2-4), so §0.2.3's NaN fix-up is a no-op and is skipped.
    return casts.saturating_cast_nan_free_(blocks * s, fmt, out)


def _quantize_chunk_nan_free(xb: torch.Tensor, config: QuantConfig, v_inf: float, dst: dict, m0: int, r: int,
                             k: int) -> bool:
    """The `te` rule on one zero-padded chunk [rp, kp] of x in its input dtype, if it holds no NaN.

    Writes the chunk's codes and sinv into `dst` (quantize_2d's buffers) and returns True; returns False without
    writing if any element is NaN. Same bits as quantize_2d's general path (NaN-ignoring amax on fp32,
    saturating_cast with the NaN fix-up) with fewer full passes: one |x| in the input dtype for both copies'
    amaxes, one scale computation for both, one widening, the codes written straight into the outputs.
    """
    fmt, b = config.element_format, config.block
    rp, kp = xb.shape
    kb = kp // b
    data, data_t, sinv_r, sinv_c = dst["data"], dst["data_t"], dst["sinv_r"], dst["sinv_c"]
    ax = xb.abs()
    if config.is_2d:
        a = ax.view(rp // b, b, kb, b).amax(dim=(1, 3))
        del ax
        if _holds_nan(a):
            return False
        ((s, sinv),) = _scales([a], config, v_inf)  # (rp/b, kb)
        tiles = xb.to(torch.float32).view(rp // b, b, kb, b)  # exact widening
        q = _encode_nan_free(tiles, s[:, None, :, None], fmt).view(rp, kp)[:r, :k]
        if data is not None:
            data[m0 : m0 + r] = q
            sinv_r[m0 // b : m0 // b + rp // b, :kb] = sinv
        if data_t is not None:
            # NUMERICS: §4 2-D colwise data and sinv are exactly the transposes of the rowwise ones.
            data_t[:, m0 : m0 + r] = q.T.contiguous()
            sinv_c[:kb, m0 // b : m0 // b + rp // b] = sinv.T
        return True
    codes_c = dst["codes_c"]  # 1-D colwise codes [M, K] in x's layout (quantize_2d transposes them once)
    amaxes = []
    if data is not None:
        amaxes.append(ax.view(rp, kb, b).amax(dim=2))  # (rp, kb)
    if codes_c is not None:
        amaxes.append(ax.view(rp // b, b, kp).amax(dim=1))  # (rp/b, kp)
    del ax
    if _holds_nan(amaxes[0]):  # either copy's amaxes cover every element of the chunk
        return False
    scales = _scales(amaxes, config, v_inf)  # one scale computation for both copies
    xf = xb.to(torch.float32)  # (rp, kp), exact widening, shared by both copies
    unpadded = rp == r and kp == k  # then the codes go straight into the output rows
    if data is not None:
        s, sinv = scales.pop(0)  # (rp, kb)
        if unpadded:
            _encode_nan_free(xf.view(rp, kb, b), s[:, :, None], fmt, data[m0 : m0 + r].view(rp, kb, b))
        else:
            data[m0 : m0 + r] = _encode_nan_free(xf.view(rp, kb, b), s[:, :, None], fmt).view(rp, kp)[:r, :k]
        # NUMERICS: §4 1-D rowwise sinv is stored transposed: entry [kb, m].
        sinv_r[:kb, m0 : m0 + r] = sinv[:r].T
    if codes_c is not None:
        s, sinv = scales.pop(0)  # (rp/b, kp)
        # NUMERICS: §4 q = sat_fp8(RN(x*s)), the same fp32 multiply, in place when xf is our own copy (an fp32
        # input's chunk is the caller's tensor and stays untouched).
        cols = xf.view(rp // b, b, kp)
        cols = cols.mul_(s[:, None, :]) if xf is not xb else cols * s[:, None, :]
        if unpadded:
            casts.saturating_cast_nan_free_(cols, fmt, codes_c[m0 : m0 + r].view(rp // b, b, kp))
        else:
            codes_c[m0 : m0 + r] = casts.saturating_cast_nan_free_(cols, fmt).view(rp, kp)[:r, :k]
        sinv_c[m0 // b : m0 // b + rp // b, :k] = sinv[:, :k]
    return True


def _padded_rows(x2d: torch.Tensor, m0: int, m1: int, kp: int, b: int) -> torch.Tensor:
    """Rows m0..m1 of x, zero-padded to [roundup(m1 - m0, b), kp], in the input dtype."""
    xb = x2d[m0:m1]
    r, k = xb.shape
    rp = _roundup(r, b)
    if rp != r or kp != k:
        # NUMERICS: §4 edge blocks are zero-padded; +0 never raises an amax, so A is over the valid elements.
        xb = F.pad(xb, (0, kp - k, 0, rp - r))  # zero padding is exact in any float dtype
    return xb


def _quantize_chunk_general(xc: torch.Tensor, config: QuantConfig, v_inf: float, dst: dict, m0: int, r: int,
                            k: int) -> None:
    """Any rule on one zero-padded fp32 chunk [rp, kp] (NaN included): writes its codes and sinv into `dst`."""
    fmt, b = config.element_format, config.block
    rp, kp = xc.shape
    kb = kp // b
    m1 = m0 + r
    data, data_t, sinv_r, sinv_c = dst["data"], dst["data_t"], dst["sinv_r"], dst["sinv_c"]
    if config.is_2d:
        tiles = xc.view(rp // b, b, kb, b)
        s, sinv = _scale(scaling.amax(tiles, dim=(1, 3)), config, v_inf)  # (rp/b, kb)
        # NUMERICS: §4 q = sat_fp8(RN(x*s)): multiply by s, never divide by sinv.
        q = casts.saturating_cast(tiles * s[:, None, :, None], fmt).view(rp, kp)[:r, :k]
        if data is not None:
            data[m0:m1] = q
            sinv_r[m0 // b : m0 // b + rp // b, :kb] = sinv
        if data_t is not None:
            # NUMERICS: §4 2-D colwise data and sinv are exactly the transposes of the rowwise ones.
            data_t[:, m0:m1] = q.T.contiguous()  # blocked transpose, then row-contiguous stores
            sinv_c[:kb, m0 // b : m0 // b + rp // b] = sinv.T
        return
    if data is not None:
        rows = xc.view(rp, kb, b)
        s, sinv = _scale(scaling.amax(rows, dim=2), config, v_inf)  # (rp, kb)
        q = _encode(rows, s[:, :, None], sinv[:, :, None], config).view(rp, kp)[:r, :k]
        data[m0:m1] = q
        # NUMERICS: §4 1-D rowwise sinv is stored transposed: entry [kb, m].
        sinv_r[:kb, m0:m1] = sinv[:r].T
    if dst["codes_c"] is not None:
        cols = xc.view(rp // b, b, kp)
        s, sinv = _scale(scaling.amax(cols, dim=1), config, v_inf)  # (rp/b, kp)
        dst["codes_c"][m0:m1] = _encode(cols, s[:, None, :], sinv[:, None, :], config).view(rp, kp)[:r, :k]
        sinv_c[m0 // b : m0 // b + rp // b, :k] = sinv[:, :k]


def quantize_2d(x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool, rng=None, state=None) -> dict:
    """fp8_block quantization of a contiguous [M, K] tensor of any shape (docs/numerics.md §4).

    `rng` and `state` are unused (no stochastic rounding, no history).
    """
    b = config.block  # 128
    assert b is not None
    m, k = x2d.shape
    kb = _ceil_div(k, b)
    v_inf = INPUT_DTYPE_MAX[DTYPE_NAMES[x2d.dtype]]
    dev = x2d.device
    f32 = dict(dtype=torch.float32, device=dev)
    data = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None  # (M, K)
    data_t = torch.empty((k, m), dtype=torch.uint8, device=dev) if colwise and config.is_2d else None  # (K, M)
    # 1-D colwise codes in x's layout [M, K], written chunk by chunk, transposed once at the end.
    codes_c = torch.empty((m, k), dtype=torch.uint8, device=dev) if colwise and not config.is_2d else None
    # NUMERICS: §4 layouts (1-D rowwise sinv transposed [kb, m]); padding zero.
    sinv_r = torch.zeros(layouts.scale_padded_shape(config, "rowwise", m, k), **f32) if rowwise else None
    sinv_c = torch.zeros(layouts.scale_padded_shape(config, "colwise", m, k), **f32) if colwise else None
    kp = kb * b
    dst = dict(data=data, data_t=data_t, codes_c=codes_c, sinv_r=sinv_r, sinv_c=sinv_c)
    fast = FAST_PATH and config.convention == "te"
    for m0, m1 in _row_chunks(m, kp, b, FAST_CHUNK_ELEMENTS if fast else CHUNK_ELEMENTS):
        if fast and _quantize_chunk_nan_free(_padded_rows(x2d, m0, m1, kp, b), config, v_inf, dst, m0, m1 - m0, k):
            continue
        # General path: vLLM's rules (a true division whose scale may be 0 or inf) and chunks holding a NaN,
        # in chunks of CHUNK_ELEMENTS.
        for g0, g1 in _row_chunks(m1 - m0, kp, b, CHUNK_ELEMENTS):
            xc = _padded_rows(x2d, m0 + g0, m0 + g1, kp, b).to(torch.float32)  # exact widening
            _quantize_chunk_general(xc, config, v_inf, dst, m0 + g0, g1 - g0, k)
    if codes_c is not None:
        # NUMERICS: §4 1-D colwise data is [K, M]: row k = 1x128 blocks of column k of x.
        data_t = codes_c.T.contiguous()
        del codes_c
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=data, rowwise_scale=sinv_r, rowwise_amax=None)
    if colwise:
        out.update(colwise_data=data_t, colwise_scale=sinv_c, colwise_amax=None)
    return out


def _expand(sinv: torch.Tensor, b_rows: int, b_cols: int, rows: int, cols: int) -> torch.Tensor:
    """Per-block values [ceil(rows/b_rows), ceil(cols/b_cols)] repeated over their blocks -> [rows, cols]."""
    return sinv.repeat_interleave(b_rows, dim=0).repeat_interleave(b_cols, dim=1)[:rows, :cols]


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(dec(q) * sinv)) as [M, K] (the colwise copy is transposed back). docs/numerics.md §4."""
    cfg = q.config
    b = cfg.block
    assert b is not None
    m, k = q.m, q.k
    mb, kb = _ceil_div(m, b), _ceil_div(k, b)
    codes = getattr(q, f"{orientation}_data")
    sinv = getattr(q, f"{orientation}_scale").to(torch.float32)
    # The copy's own [rows, cols] orientation: rowwise [M, K], colwise [K, M].
    rows, cols = (m, k) if orientation == "rowwise" else (k, m)
    if cfg.is_2d:
        tiles = sinv[: _ceil_div(rows, b), : _ceil_div(cols, b)]  # both orientations store entry [row tile, col tile]
        per_elem = _expand(tiles, b, b, rows, cols)
    elif orientation == "rowwise":
        per_elem = _expand(sinv[:kb, :m].T, 1, b, m, k)  # stored [kb, m]
    else:
        per_elem = _expand(sinv[:mb, :k].T, 1, b, k, m)  # stored [mb, k]; the copy is [K, M]
    # NUMERICS: §4 dequantization - one fp32 multiply, then one rounding to the output dtype.
    x = (casts.decode(codes, cfg.element_format) * per_elem).to(dtype)
    return x if orientation == "rowwise" else x.T.contiguous()
