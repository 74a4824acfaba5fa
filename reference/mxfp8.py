"""MXFP8: E4M3 / E5M2 data with one UE8M0 exponent per 32 elements (1x32) or per 32x32 tile.

Source: docs/numerics.md §3 and §0.5 (e8m0_up, e8m0_floor, P(e), D(e)); TE common/cast/mxfp8/quantize_mxfp8.cuh,
common/util/ptx_arch_spec.cuh.

Per block (A = amax(block)): e = e8m0_up(RN(A * fl(1/fp8_max))) (rule `ceil`, default) or e8m0_floor(A)
(rule `floor`, OCP MX); q = sat_fp8(RN(x * P(e))). Layouts (padding zero):
- data: rowwise [M, K]; colwise ALSO [M, K], row-major, NOT transposed;
- compact scales (uint8 exponents): rowwise S_r [roundup(M,128), roundup(K/32,4)], entry [m, kb];
  colwise S_c [roundup(M/32,4), roundup(K,128)], entry [mb, k].
- 2-D (32x32): one exponent per tile, written into every S_r / S_c entry of the tile; both data
  copies are then identical.
Other conventions (`config.convention`, docs/numerics.md §10.2-§10.4: OCP MX, torchao's
to_mx scale modes) replace the per-block rule in `convention_blocks`; layouts are unchanged.
"""

from __future__ import annotations

import torch

from . import casts, fp32, layouts, scaling
from .formats import UE8M0, QuantConfig, ScalarFormat
from .types import QuantizedTensor, SpecViolation

# Elements per row chunk: bounds the fp32 temporaries (a few chunk-sized tensors at a time).
CHUNK_ELEMENTS = 1 << 22


def _row_chunks(m: int, k: int, rows_multiple: int):
    """(m0, m1) row ranges of about CHUNK_ELEMENTS elements, m0 a multiple of `rows_multiple`."""
    rows = max(1, CHUNK_ELEMENTS // max(k, 1) // rows_multiple) * rows_multiple
    for m0 in range(0, m, rows):
        yield m0, min(m, m0 + rows)


def exponent(a: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """The UE8M0 block exponent (uint8) of block amaxes `a` by the config's rule (docs/numerics.md §3)."""
    fmt = config.element_format
    if config.e8m0_rule == "ceil":
        # NUMERICS: §3 ceil - e = e8m0_up(RN(A * fl(1/fp8_max))): a multiply by the rounded constant,
        # not a division (fl(1/448) = 0x3B124925, fl(1/57344) = 0x37924925).
        inv = fp32.scalar(fp32.reciprocal_const(fmt.max_finite), a)
        return casts.e8m0_up(a.to(torch.float32) * inv)
    # NUMERICS: §3 floor (OCP MX v1.0) - e = clamp(floor(log2 A) - emax_elem + 127, 0, 254).
    return casts.e8m0_floor(a, fmt)


# --------------------------------------------------------------------------------------------
# Other conventions (docs/numerics.md §10.2-§10.4)
# --------------------------------------------------------------------------------------------

_FP32_EXP_MASK = 0xFF
_FP32_MAN_BITS = 23
_FP32_MAN_MASK = (1 << _FP32_MAN_BITS) - 1
_FP32_MIN_NORMAL = 2.0**-126


def _amax_nan(blocks: torch.Tensor) -> torch.Tensor:
    """max |x| over the last axis in the input's dtype with NaN propagating (torch.amax), then fp32 (exact)."""
    return torch.amax(torch.abs(blocks), dim=-1).to(torch.float32)


def _ocp_blocks(blocks: torch.Tensor, fmt: ScalarFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MX v1.0 §6.3 (microxcaling mx_ops._quantize_mx): floor exponent; a NaN/Inf block is a NaN block."""
    # NUMERICS: §10.2 - e = e8m0_floor(amax) over the finite elements (§0.5), as the floor rule.
    e = casts.e8m0_floor(scaling.amax(blocks, dim=-1), fmt)
    # NUMERICS: §10.2 - microxcaling's shared exponent is log2 of a NaN-propagating max: NaN, and +inf
    # (above the E8M0 range), give a NaN scale (0xFF); x / NaN makes every element NaN (0x7F).
    special = (~torch.isfinite(blocks)).any(dim=-1)
    e = torch.where(special, torch.full_like(e, UE8M0.nan_code), e)
    return e, casts.saturating_cast(blocks * casts.e8m0_multiplier(e)[..., None], fmt)


def _torchao_rceil_blocks(blocks: torch.Tensor, a: torch.Tensor, fmt: ScalarFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao to_mx RCEIL, eager fallback (mx_tensor.py _to_mx_rceil), torchao 0.18.0; `a` the block amaxes."""
    # NUMERICS: §10.4 - descale = RN(amax / fp8_max): NaN-propagating amax, a true division.
    descale = fp32.div(a, fmt.max_finite)
    # NUMERICS: §10.4 - e = clamp(ceil(log2f(descale)), -127, 127) + 127 with torch's fp32 log2 (not the
    # exact bit rule: log2f rounds values just above 2^k down to k); NaN -> 255, +inf -> 254.
    e = (torch.clamp(torch.ceil(torch.log2(descale)), -UE8M0.bias, UE8M0.bias) + UE8M0.bias).to(torch.uint8)
    e = torch.where(torch.isinf(descale), torch.full_like(e, UE8M0.max_code), e)
    e = torch.where(torch.isnan(descale), torch.full_like(e, UE8M0.nan_code), e)
    # NUMERICS: §10.4 - multiplier 2^(127 - e), but 1.0 for e = 0 (TE ptx.cuh exp2f_rcp), the NaN
    # descale itself for e = 255; exact powers of two otherwise.
    p = casts.e8m0_multiplier(e)
    p = torch.where(e == 0, torch.ones_like(p), p)
    p = torch.where(e == UE8M0.nan_code, descale, p)
    return e, casts.saturating_cast_signed_nan(blocks * p[..., None], fmt)


def _torchao_pow2_blocks(
    blocks: torch.Tensor, a: torch.Tensor, fmt: ScalarFormat, mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao to_mx FLOOR / CEIL / EVEN (mx_tensor.py to_mx), torchao 0.18.0; `a` the block amaxes (NaN kept)."""
    nan = torch.isnan(a)
    b = fp32.bits(a)
    if mode == "even":
        # NUMERICS: §10.3 EVEN - add half an element ulp to amax's bits and keep sign and exponent only
        # (int32 arithmetic, so a carry moves amax up one binade); a NaN amax stays NaN.
        b = (b + (1 << (_FP32_MAN_BITS - fmt.man_bits - 1))) & fp32.bits(fp32.from_bits(0xFF800000))
        b = torch.where(nan, fp32.bits(torch.full_like(a, float("nan"))), b)
    # NUMERICS: §10.3 - unbiased exponent read from the bits (a subnormal or zero amax reads -127);
    # CEIL adds 1 whenever any mantissa bit is set; e = clamp(p - emax_elem, -127, 128) + 127.
    p = ((b >> _FP32_MAN_BITS) & _FP32_EXP_MASK) - UE8M0.bias
    if mode == "ceil":
        p = p + ((b & _FP32_MAN_MASK) > 0).to(p.dtype)
    e = (torch.clamp(p - fmt.emax, -UE8M0.bias, UE8M0.bias + 1) + UE8M0.bias).to(torch.uint8)
    e = torch.where(nan, torch.full_like(e, UE8M0.nan_code), e)
    # NUMERICS: §10.3 - the divisor is the fp32 with exponent field e (e = 255 gives +inf), clamped to
    # at least 2^-126: a zero or tiny block (e = 0) is divided by 2^-126 while its stored byte says 2^-127.
    scale = torch.clamp(fp32.from_bits(e.to(torch.int32) << _FP32_MAN_BITS), min=_FP32_MIN_NORMAL)
    # NUMERICS: §10.3 - q = cast(clamp(x / scale)): a true division (exact but for underflow).
    return e, casts.saturating_cast_signed_nan(torch.div(blocks, scale[..., None]), fmt)


def convention_blocks(blocks: torch.Tensor, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(e uint8 [...], q uint8 [..., 32]) of blocks [..., 32] (the input dtype) under the config's non-`te` convention."""
    fmt = config.element_format
    conv = config.convention
    if conv == "ocp_mx":
        return _ocp_blocks(blocks.to(torch.float32), fmt)
    # NUMERICS: §10.3/§10.4 - torchao reduces amax in the input dtype, then widens (exact) to fp32.
    a = _amax_nan(blocks)
    blocks = blocks.to(torch.float32)
    if conv == "torchao_rceil":
        return _torchao_rceil_blocks(blocks, a, fmt)
    return _torchao_pow2_blocks(blocks, a, fmt, conv.removeprefix("torchao_"))


def _quantize_convention(x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool) -> dict:
    """1x32 MXFP8 under a catalogue convention: same layouts as §3, per-block rule from `convention_blocks`.

    The colwise copy quantizes the contiguous X^T [K, M] by rows and is transposed back (data [M, K],
    S_c [M/32, K]), the order in which torchao runs its cast on X^T: a NaN amax's bits, which the
    NaN codes inherit, depend on the reduction's memory order.
    """
    b = config.block
    m, k = x2d.shape
    out: dict = {}
    for orientation, src in (("rowwise", x2d), ("colwise", x2d.t().contiguous())):
        if not (rowwise if orientation == "rowwise" else colwise):
            continue
        rows, cols = src.shape
        e, q = convention_blocks(src.view(rows, cols // b, b), config)  # (rows, cols/32), (rows, cols/32, 32)
        scale = torch.zeros(layouts.scale_padded_shape(config, orientation, m, k), dtype=torch.uint8, device=x2d.device)
        if orientation == "rowwise":
            scale[:m, : k // b] = e
            out.update(rowwise_data=q.view(m, k), rowwise_scale=scale, rowwise_amax=None)
        else:
            scale[: m // b, :k] = e.t()
            out.update(colwise_data=q.view(k, m).t().contiguous(), colwise_scale=scale, colwise_amax=None)
    return out


def quantize_2d(x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool, rng=None, state=None) -> dict:
    """MXFP8 quantization of a contiguous [M, K] tensor, M and K multiples of 32 (docs/numerics.md §3).

    `rng` and `state` are unused (no stochastic rounding, no history).
    """
    fmt = config.element_format
    b = config.block  # 32
    assert b is not None
    m, k = x2d.shape
    for dim_name, n in (("M", m), ("K", k)):
        if n % b:
            raise SpecViolation(
                f"{config.id}: {dim_name}={n} is not a multiple of {b}; mxfp8 has no partial blocks (docs/numerics.md §3)"
            )
    if config.convention != "te":
        return _quantize_convention(x2d, config, rowwise=rowwise, colwise=colwise)
    dev = x2d.device
    u8 = dict(dtype=torch.uint8, device=dev)
    data = torch.empty((m, k), **u8) if rowwise else None  # (M, K)
    data_c = torch.empty((m, k), **u8) if colwise else None  # (M, K), NOT transposed
    # NUMERICS: §3 compact scales S_r [roundup(M,128), roundup(K/32,4)], S_c [roundup(M/32,4), roundup(K,128)];
    # padding zero.
    s_r = torch.zeros(layouts.scale_padded_shape(config, "rowwise", m, k), **u8) if rowwise else None
    s_c = torch.zeros(layouts.scale_padded_shape(config, "colwise", m, k), **u8) if colwise else None
    for m0, m1 in _row_chunks(m, k, b):
        r = m1 - m0
        xc = x2d[m0:m1].to(torch.float32)  # (r, K), exact widening
        mb0, mb1 = m0 // b, m1 // b
        if config.is_2d:
            tiles = xc.view(r // b, b, k // b, b)
            e = exponent(scaling.amax(tiles, dim=(1, 3)), config)  # (r/32, K/32)
            # NUMERICS: §3 q = sat_fp8(RN(x * P(e))), exact but for fp32 underflow.
            p = casts.e8m0_multiplier(e)
            q = casts.saturating_cast(tiles * p[:, None, :, None], fmt).view(r, k)
            if rowwise:
                data[m0:m1] = q
                s_r[m0:m1, : k // b] = e.repeat_interleave(b, dim=0)
            if colwise:
                # NUMERICS: §3 2-D - the tile exponent serves both copies, so the data copies are identical.
                data_c[m0:m1] = q
                s_c[mb0:mb1, :k] = e.repeat_interleave(b, dim=1)
            continue
        if rowwise:
            rows = xc.view(r, k // b, b)
            e = exponent(scaling.amax(rows, dim=2), config)  # (r, K/32)
            q = casts.saturating_cast(rows * casts.e8m0_multiplier(e)[:, :, None], fmt)
            data[m0:m1] = q.view(r, k)
            s_r[m0:m1, : k // b] = e
        if colwise:
            cols = xc.view(r // b, b, k)
            e = exponent(scaling.amax(cols, dim=1), config)  # (r/32, K)
            q = casts.saturating_cast(cols * casts.e8m0_multiplier(e)[:, None, :], fmt)
            data_c[m0:m1] = q.view(r, k)
            s_c[mb0:mb1, :k] = e
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=data, rowwise_scale=s_r, rowwise_amax=None)
    if colwise:
        out.update(colwise_data=data_c, colwise_scale=s_c, colwise_amax=None)
    return out


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(D(e) * dec(q))) as [M, K] (both copies are stored [M, K]). docs/numerics.md §3."""
    cfg = q.config
    b = cfg.block
    assert b is not None
    m, k = q.m, q.k
    codes = getattr(q, f"{orientation}_data")
    e = getattr(q, f"{orientation}_scale")
    if orientation == "rowwise":
        d = casts.e8m0_decode(e[:m, : k // b]).repeat_interleave(b, dim=1)  # (M, K)
    else:
        d = casts.e8m0_decode(e[: m // b, :k]).repeat_interleave(b, dim=0)  # (M, K)
    # NUMERICS: §3 dequantization - one fp32 multiply by D(e), then one rounding to the output dtype.
    return (d * casts.decode(codes, cfg.element_format)).to(dtype)
