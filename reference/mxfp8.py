"""MXFP8: E4M3 / E5M2 data with one UE8M0 exponent per 32 elements (1x32) or per 32x32 tile.

Source: NUMERICS.md §3 and §0.5 (e8m0_up, e8m0_floor, P(e), D(e)); TE common/cast/mxfp8/quantize_mxfp8.cuh,
common/util/ptx_arch_spec.cuh.

Per block (A = amax(block)): e = e8m0_up(RN(A * fl(1/fp8_max))) (rule `ceil`, default) or e8m0_floor(A)
(rule `floor`, OCP MX); q = sat_fp8(RN(x * P(e))). Layouts (padding zero):
- data: rowwise [M, K]; colwise ALSO [M, K], row-major, NOT transposed;
- compact scales (uint8 exponents): rowwise S_r [roundup(M,128), roundup(K/32,4)], entry [m, kb];
  colwise S_c [roundup(M/32,4), roundup(K,128)], entry [mb, k].
- 2-D (32x32): one exponent per tile, written into every S_r / S_c entry of the tile; both data
  copies are then identical.
"""

from __future__ import annotations

import torch

from . import casts, fp32, layouts, scaling
from .formats import QuantConfig
from .types import QuantizedTensor, SpecViolation

# Elements per row chunk: bounds the fp32 temporaries (a few chunk-sized tensors at a time).
CHUNK_ELEMENTS = 1 << 22


def _row_chunks(m: int, k: int, rows_multiple: int):
    """(m0, m1) row ranges of about CHUNK_ELEMENTS elements, m0 a multiple of `rows_multiple`."""
    rows = max(1, CHUNK_ELEMENTS // max(k, 1) // rows_multiple) * rows_multiple
    for m0 in range(0, m, rows):
        yield m0, min(m, m0 + rows)


def exponent(a: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """The UE8M0 block exponent (uint8) of block amaxes `a` by the config's rule (NUMERICS.md §3)."""
    fmt = config.element_format
    if config.e8m0_rule == "ceil":
        # NUMERICS: §3 ceil - e = e8m0_up(RN(A * fl(1/fp8_max))): a multiply by the rounded constant,
        # not a division (fl(1/448) = 0x3B124925, fl(1/57344) = 0x37924925).
        inv = fp32.scalar(fp32.reciprocal_const(fmt.max_finite), a)
        return casts.e8m0_up(a.to(torch.float32) * inv)
    # NUMERICS: §3 floor (OCP MX v1.0) - e = clamp(floor(log2 A) - emax_elem + 127, 0, 254).
    return casts.e8m0_floor(a, fmt)


def quantize_2d(x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool, rng=None, state=None) -> dict:
    """MXFP8 quantization of a contiguous [M, K] tensor, M and K multiples of 32 (NUMERICS.md §3).

    `rng` and `state` are unused (no stochastic rounding, no history).
    """
    fmt = config.element_format
    b = config.block  # 32
    assert b is not None
    m, k = x2d.shape
    for dim_name, n in (("M", m), ("K", k)):
        if n % b:
            raise SpecViolation(
                f"{config.id}: {dim_name}={n} is not a multiple of {b}; mxfp8 has no partial blocks (NUMERICS.md §3)"
            )
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
    """x_hat = RN_out(RN(D(e) * dec(q))) as [M, K] (both copies are stored [M, K]). NUMERICS.md §3."""
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
