"""NVFP4: E2M1 data, UE4M3 scale per 16 elements, fp32 global amax per copy; optional RHT and SR.

Source: docs/numerics.md §5 (5.1 global scale, 5.2 block scale, 5.3 encode factor, 5.4 elements and
packing, 5.5 1-D/2-D and rowwise/columnwise, 5.6 RHT, 5.7 SR, 5.8 dequantization and GEMM alpha,
5.9 layouts); TE common/cast/nvfp4/core_nvfp4.cuh, quantize_transpose_nvfp4.cuh,
dequantize_nvfp4.cuh, common/recipe/nvfp4.cu.

Work is done in row chunks of X (whole 16-row groups), so fp32/fp64 temporaries stay a few tens
of MiB whatever the tensor size: one pass for the block amaxes (hence A_g), one pass per copy for
the codes. The columnwise copy is computed from a source S [M, K] (X, or RHT(X^T) transposed back)
whose 16-row groups are its blocks: copy element [k, 16b + j] is S[16b + j, k].
Convention `torchao_nvfp4` (docs/numerics.md §10.5) replaces the scale chain and the
element cast in `_quantize_torchao`; layouts are unchanged.
"""

from __future__ import annotations

import torch

from . import casts, fp32, hadamard, stochastic
from .formats import E2M1, E4M3, FLT_MAX, QuantConfig
from .scaling import amax as nan_ignoring_amax
from .types import SpecViolation, SRSeed

# NUMERICS: §5.1 - 2688 = 6 * 448 = E2M1 max * E4M3 max (exact in fp32).
GLOBAL_RANGE = E2M1.max_finite * E4M3.max_finite
# NUMERICS: §5.2 - fl(1/6) = 0x3E2AAAAB.
INV_E2M1_MAX = fp32.reciprocal_const(E2M1.max_finite)
# NUMERICS: §5.8 - fl(1/2688) = 0x39C30C31 (dequantization), fl(1/7225344) = 0x34149B93 (GEMM alpha).
INV_GLOBAL_RANGE = fp32.reciprocal_const(GLOBAL_RANGE)
INV_ALPHA_RANGE = fp32.reciprocal_const(GLOBAL_RANGE * GLOBAL_RANGE)

# Scale padding (docs/numerics.md §5.9): rows to a multiple of 128, scale columns to a multiple of 4.
SCALE_ROW_ALIGN = 128
SCALE_COL_ALIGN = 4
# Target elements per processing chunk (fp32: 4 MiB; fp64: 8 MiB, below glibc's mmap threshold cap).
CHUNK_ELEMS = 1 << 20


def _roundup(n: int, a: int) -> int:
    return (n + a - 1) // a * a


# --------------------------------------------------------------------------------------------
# Scale chain (docs/numerics.md §5.1-§5.3)
# --------------------------------------------------------------------------------------------


def global_range(e4m3_max: float = E4M3.max_finite) -> float:
    """6 * e4m3_max: 2688 by default, 1536 for 4over6 with e4m3_max = 256 (exact; NUMERICS: §5.1, §5.10)."""
    return E2M1.max_finite * e4m3_max


def global_scale(a_g: torch.Tensor, e4m3_max: float = E4M3.max_finite) -> tuple[torch.Tensor, torch.Tensor]:
    """(S_enc, S_dec) from the global amax A_g (fp32, any shape; row-scaled: one per row).

    NUMERICS: §5.1 - S_enc = fmin(RN(6 * e4m3_max / A_g), FLT_MAX) (true division; 2688 unless a
    4over6 variant sets e4m3_max = 256, §5.10); A_g = 0 or S_enc = 0 (A_g = +inf) -> 1 (TE's kernel
    `compute_global_encode_scaling_factor_FP4`, per row when row-scaled); A_g = NaN -> FLT_MAX
    through fmin; S_dec = RN(1 / S_enc).
    """
    a_g = a_g.to(torch.float32)
    s_enc = torch.fmin(fp32.div(global_range(e4m3_max), a_g, like=a_g), fp32.scalar(FLT_MAX, a_g))
    s_enc = torch.where((a_g == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)
    s_dec = fp32.div(1.0, s_enc, like=s_enc)
    return s_enc, s_dec


def block_multiplier(s_enc: torch.Tensor) -> torch.Tensor:
    """m = RN(S_enc * fl(1/6)) (NUMERICS: §5.2 - a multiply by the rounded constant, not A_b/6*S_enc)."""
    return s_enc * fp32.scalar(INV_E2M1_MAX, s_enc)


def block_scale(a_b: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, s_blk): d = fmin(RN(A_b * m), FLT_MAX) fp32, s_blk = sat_e4m3(d) as uint8 E4M3 bits.

    NUMERICS: §5.2 - A_b = inf gives FLT_MAX and then 448 (0x7E); d <= 2^-10 gives 0x00.
    """
    d = torch.fmin(a_b.to(torch.float32) * m, fp32.scalar(FLT_MAX, m))
    return d, casts.saturating_cast(d, E4M3)


def encode_factor(s_blk: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """f = fmin(RN(1 / RN(float(s_blk) * S_dec)), FLT_MAX); s_blk = 0 gives FLT_MAX.

    NUMERICS: §5.3 - a true division (no approximate reciprocal); with s_blk = 0 the product is
    0, 1/0 = inf, fmin gives FLT_MAX, so non-zero codes saturate (and decode to 0).
    """
    p = casts.decode(s_blk, E4M3) * s_dec
    f = torch.fmin(fp32.div(1.0, p, like=p), fp32.scalar(FLT_MAX, p))
    return torch.where(s_blk == 0, fp32.scalar(FLT_MAX, p), f)


# --------------------------------------------------------------------------------------------
# Element cast (docs/numerics.md §0.5 e2m1_rn)
# --------------------------------------------------------------------------------------------

_FP32_MAG_MASK = (1 << 31) - 1  # all but the sign bit


def e2m1_thresholds() -> torch.Tensor:
    """fp32 [7]: magnitude code c+1 is reached at |y| >= t[c] (the §0.5 table, derived from the grid).

    NUMERICS: §0.5 e2m1_rn - between grid values g_c < g_{c+1} the midpoint ties to the even code:
    if c is even the midpoint stays at c (threshold = next fp32 above the midpoint), else it goes up.
    Gives 0.25+, 0.75, 1.25+, 1.75, 2.5+, 3.5, 5+ ("+": the next fp32 up).
    """
    grid = stochastic.e2m1_grid()  # (8,)
    mid = (grid[:-1] + grid[1:]) * 0.5  # exact: half of a sum of two short grid values
    up = torch.nextafter(mid, torch.full_like(mid, float("inf")))
    even = (torch.arange(mid.numel()) % 2) == 0
    return torch.where(even, up, mid)


_NEG_INF_BITS = int(fp32.bits(torch.tensor(float("-inf"))))
_FP32_MAN_BITS = 23
_FP32_BIAS = 127
_E2M1_MAX_BITS = int(fp32.bits(torch.tensor(E2M1.max_finite)))
# Biased fp32 exponents of E2M1's binades: [1, 2) (emin; below it the spacing stays 2^(emin - man)) .. [4, 8) (emax).
_E2M1_EXP_LO = _FP32_BIAS + E2M1.emin
_E2M1_EXP_HI = _FP32_BIAS + E2M1.emax
# Magic addend bits of the binade with biased exponent E: E * _MAGIC_MUL + _MAGIC_ADD, i.e. the fp32
# 2^(E - 127 - man + 23), whose ulp is the E2M1 spacing 2^(E - 127 - man) there, plus (E - 127 - emin) * 2^man
# ulps: the number of codes below the binade, an even count of ulps.
_MAGIC_MUL = (1 << _FP32_MAN_BITS) + (1 << E2M1.man_bits)
_MAGIC_ADD = ((_FP32_MAN_BITS - E2M1.man_bits - E2M1.emin) << _FP32_MAN_BITS) - _E2M1_EXP_LO * (1 << E2M1.man_bits)


def e2m1_rn(y: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of fp32 y: RNE, saturating, NaN -> 0x7, sign copied.

    Same result as casts.saturating_cast(y, E2M1) and as the §0.5 threshold table (e2m1_thresholds;
    the tests check both, and every one of the 2^32 fp32 patterns was checked once against the
    table), by one fp32 addition that rounds (the classic "magic number" rounding):
    NUMERICS: §0.5 e2m1_rn / §0.2.4 - a = min(|y|, 6) on the magnitude bits (inf and NaN give 6, so
    NaN gives 7); for a in binade [2^e, 2^(e+1)), e = clamp(floor(log2 a), emin, emax), the fp32
    sum s = RN(a + M_e) with M_e = 2^(22 + e) + 2e ulps rounds a to E2M1's spacing 2^(e - 1) there,
    ties to even (the 2e ulps are even, so they keep the tie parity), and the low bits of s are the
    magnitude code. The sign bit is copied from y for every non-NaN value (-0.0 and tiny negatives
    give 0x8); NaN of either sign gives 0x7.
    """
    b = fp32.bits(y)
    # int32 view: negative non-NaN floats are exactly the bit patterns <= bits(-inf).
    neg = (b <= _NEG_INF_BITS).to(torch.uint8)
    neg <<= E2M1.bits - 1
    mag = b & _FP32_MAG_MASK
    mag.clamp_(max=_E2M1_MAX_BITS)  # saturate: > 6, inf and NaN (bits above inf's) become 6
    magic = mag >> _FP32_MAN_BITS  # biased exponent E
    magic.clamp_(_E2M1_EXP_LO, _E2M1_EXP_HI)
    magic *= _MAGIC_MUL
    magic += _MAGIC_ADD
    # NUMERICS: §0.5 e2m1_rn - the one rounding: fp32 RN(a + M_e), exact but for the rounding to the E2M1 grid.
    mag.view(torch.float32).add_(magic.view(torch.float32))
    code = mag.to(torch.uint8)  # the low byte: s's mantissa counts the codes, 0..7
    code |= neg
    return code


# --------------------------------------------------------------------------------------------
# Block amaxes (docs/numerics.md §0.1 amax, §5.2 A_b, §5.5 1-D / 2-D)
# --------------------------------------------------------------------------------------------


def _max_last(a: torch.Tensor) -> torch.Tensor:
    """Max over the last axis (a power of two long) by a tree of elementwise maxima (NaN propagates)."""
    while a.shape[-1] > 1:
        h = a.shape[-1] // 2
        a = torch.maximum(a[..., :h], a[..., h:])
    return a[..., 0]


def _abs_nan_zero(v: torch.Tensor) -> torch.Tensor:
    """|v| in fp32 with NaN lanes set to 0 (NUMERICS: §0.2.5 - NaN-ignoring amax)."""
    a = v.to(torch.float32).abs()
    return a.masked_fill_(torch.isnan(a), 0.0)


# 16-bit float inputs: the magnitude bits (sign cleared) order like the magnitudes; above inf's are NaN.
_HALF_INF_BITS = {dt: int(torch.tensor(float("inf"), dtype=dt).view(torch.int16)) for dt in (torch.bfloat16,
                                                                                         torch.float16)}
_HALF_MAG_MASK = (1 << 15) - 1


def _half_blocks_amax(xc: torch.Tensor, shape: tuple[int, ...], dim: int) -> torch.Tensor | None:
    """fp32 amax over `dim` of the magnitudes of a bf16/fp16 xc viewed as `shape`, or None if a NaN is there.

    NUMERICS: §0.1 - exact: the max of the magnitude bits is the bits of the max magnitude (-0 gives +0).
    """
    mag = xc.view(torch.int16) & _HALF_MAG_MASK
    out = mag.reshape(shape).amax(dim=dim)
    if bool(out.amax() > _HALF_INF_BITS[xc.dtype]):
        return None  # NUMERICS: §0.2.5 - a NaN lane: the caller's NaN-ignoring path
    return out.view(xc.dtype).to(torch.float32)


def _row_blocks_amax(xc: torch.Tensor, blk: int) -> torch.Tensor:
    """fp32 (R, C/blk): amax of each 1 x blk block along the rows of xc (R, C); NaN ignored.

    NUMERICS: §0.1 - exact in any order. The fast paths let NaN propagate, and a chunk that got a
    NaN is redone with NaN lanes zeroed.
    """
    r, c = xc.shape
    if xc.dtype in _HALF_INF_BITS:
        out = _half_blocks_amax(xc, (r, c // blk, blk), -1)
        if out is not None:
            return out
    a = xc.to(torch.float32).abs().reshape(r, c // blk, blk)  # (R, C/16, 16); |.| gives +0 for -0
    out = _max_last(a)
    if bool(torch.isnan(out).any()):
        out = _abs_nan_zero(xc).reshape(r, c // blk, blk).amax(dim=-1)
    return out


def _col_blocks_amax(xc: torch.Tensor, blk: int) -> torch.Tensor:
    """fp32 (R/blk, C): amax of each blk x 1 block down the columns of xc (R, C); NaN ignored."""
    r, c = xc.shape
    if xc.dtype in _HALF_INF_BITS:
        out = _half_blocks_amax(xc, (r // blk, blk, c), 1)
        if out is not None:
            return out
    out = xc.to(torch.float32).abs().reshape(r // blk, blk, c).amax(dim=1)  # (R/16, C)
    if bool(torch.isnan(out).any()):
        out = _abs_nan_zero(xc).reshape(r // blk, blk, c).amax(dim=1)
    return out


def _tile_amax(row_blocks: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """(R/16, C/16) amax of 16x16 tiles from the 1x16 block amaxes (R, C/16) (NUMERICS: §5.5 2-D)."""
    r, nb = row_blocks.shape
    return row_blocks.reshape(r // tile_rows, tile_rows, nb).amax(dim=1)


# --------------------------------------------------------------------------------------------
# Copies
# --------------------------------------------------------------------------------------------


def _check(x2d: torch.Tensor, config: QuantConfig) -> None:
    if config.scheme != "nvfp4":
        raise SpecViolation(f"reference.nvfp4 quantizes nvfp4 configs, got {config.id}")
    blk = config.block
    if x2d.dim() != 2 or x2d.shape[0] % blk or x2d.shape[1] % blk:
        raise SpecViolation(
            f"{config.id}: NVFP4 needs M and K multiples of {blk} (docs/numerics.md §5.5); got shape {tuple(x2d.shape)}"
        )
    if config.rht and x2d.dtype != torch.bfloat16:
        raise SpecViolation(f"{config.id}: RHT needs a bfloat16 input (docs/numerics.md §5.6), got {x2d.dtype}")


def _chunks(rows: int, cols: int, align: int):
    """(r0, r1) row ranges of about CHUNK_ELEMS elements, r0 and r1 multiples of `align`."""
    step = max(align, CHUNK_ELEMS // max(cols, 1) // align * align)
    for r0 in range(0, rows, step):
        yield r0, min(r0 + step, rows)


def _scale_buffer(rows: int, cols: int, blk: int, device) -> torch.Tensor:
    """Zero-filled compact scale tensor [roundup(rows, 128), roundup(cols/16, 4)] (docs/numerics.md §5.9)."""
    shape = (_roundup(rows, SCALE_ROW_ALIGN), _roundup(cols // blk, SCALE_COL_ALIGN))
    return torch.zeros(shape, dtype=torch.uint8, device=device)


def _copy_chain(a_g: torch.Tensor, config: QuantConfig):
    """A function (a_b, r0, r1) -> (s_blk uint8, f fp32) for one copy (docs/numerics.md §5.1-§5.3).

    a_g is the copy's global amax, shaped to broadcast against the block amaxes: (1, 1), or
    row-scaled (rows, 1) (rowwise: sliced to the chunk's rows r0:r1) or (1, K) (colwise).
    """
    s_enc, s_dec = global_scale(a_g, config.e4m3_max)
    mult = block_multiplier(s_enc)

    def chain(a_b: torch.Tensor, r0: int = 0, r1: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        m_c, s_c = (mult[r0:r1], s_dec[r0:r1]) if mult.shape[0] > 1 else (mult, s_dec)
        _, s_blk = block_scale(a_b, m_c)
        return s_blk, encode_factor(s_blk, s_c)

    return chain


def _codes(y: torch.Tensor, r: torch.Tensor | None) -> torch.Tensor:
    """NUMERICS: §5.4 / §5.7 - e2m1_rn, or SR with random bytes r (same layout as y)."""
    return e2m1_rn(y) if r is None else stochastic.e2m1_sr(y, r)


# Input dtypes whose widening to fp32 is exact: x * f then computes RN(x * f) in fp32 directly.
_EXACT_IN_FP32 = (torch.float32, torch.bfloat16, torch.float16)


def _times(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """y = RN(x * f) in fp32 (NUMERICS: §5.4 - one fp32 multiply of the exactly widened x)."""
    if x.dtype not in _EXACT_IN_FP32:
        x = x.to(torch.float32)
    return torch.mul(x, f)  # bf16/fp16 x promotes to fp32 (exact widening), then one fp32 multiply


def _pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes (uint8, < 16, contiguous) to [..., n] bytes, even element low (docs/numerics.md §5.4).

    Through an int16 view of each pair: its low byte is the even code, the high byte the odd one.
    """
    pairs = codes.view(torch.int16)
    return (pairs | (pairs >> 4)).to(torch.uint8)


def _quantize_rowwise(
    x2d: torch.Tensor, a_b_all: torch.Tensor, a_g: torch.Tensor, config: QuantConfig, seed: SRSeed | None
) -> dict:
    """Rowwise copy NVFP4(X), blocks along K, from the block amaxes a_b_all (M, K/16) (docs/numerics.md §5.4, §5.9)."""
    m_rows, k = x2d.shape
    blk = config.block
    chain = _copy_chain(a_g.reshape(-1, 1), config)  # NUMERICS: §5.10 row-scaled: A_g [M], one per row
    data = torch.empty((m_rows, k // 2), dtype=torch.uint8, device=x2d.device)
    scale = _scale_buffer(m_rows, k, blk, x2d.device)
    s_blk, f = chain(a_b_all)  # (M, K/16): elementwise, so one call for the whole copy
    scale[:m_rows, : k // blk] = s_blk
    for r0, r1 in _chunks(m_rows, k, blk):
        # NUMERICS: §5.4 - y = RN(x * f): one fp32 multiply.
        y = _times(x2d[r0:r1].reshape(r1 - r0, k // blk, blk), f[r0:r1, :, None])  # (R, K/16, 16)
        if seed is None:
            data[r0:r1] = _pack_pairs(e2m1_rn(y).reshape(r1 - r0, k))
            continue
        stream = stochastic.copy_stream(seed.stream, "rowwise")
        r = stochastic.random_bytes(k, r0, r1, seed.seed, stream, x2d.device).reshape(y.shape)
        data[r0:r1] = casts.pack_nibbles(_codes(y, r).reshape(r1 - r0, k))
    return {"rowwise_data": data, "rowwise_scale": scale, "rowwise_amax": a_g.clone()}


def _quantize_colwise(
    src: torch.Tensor, a_b_all: torch.Tensor, a_g: torch.Tensor, config: QuantConfig, seed: SRSeed | None
) -> dict:
    """Columnwise copy, blocks along M: NVFP4 of src^T with src (M, K) = X, or RHT(X^T)^T with RHT.

    a_b_all (M/16, K) holds the amax of block [k, 16b : 16b + 16] of the copy at [b, k].
    NUMERICS: §5.5 - quantized from the high-precision values, never a transpose of FP4 data.
    """
    m_rows, k = src.shape
    blk = config.block
    chain = _copy_chain(a_g.reshape(1, -1), config)  # NUMERICS: §5.10 row-scaled: A_g [K], one per copy row
    data = torch.empty((k, m_rows // 2), dtype=torch.uint8, device=src.device)
    scale = _scale_buffer(k, m_rows, blk, src.device)
    s_blk, f = chain(a_b_all)  # (M/16, K): elementwise, so one call for the whole copy
    scale[:k, : m_rows // blk] = s_blk.t()
    for r0, r1 in _chunks(m_rows, k, blk):
        b0, b1 = r0 // blk, r1 // blk
        # NUMERICS: §5.4 - y = RN(x * f); (nb, 16, K): [b, j, k] is element [k, 16(b0 + b) + j] of the copy.
        y = _times(src[r0:r1].reshape(b1 - b0, blk, k), f[b0:b1, None, :])
        r = None
        if seed is not None:
            stream = stochastic.copy_stream(seed.stream, "colwise")
            r = stochastic.random_bytes_blocked(m_rows, k, b0, b1, blk, seed.seed, stream, src.device)
            r = r.transpose(1, 2)  # (nb, 16, K) like y
        codes = _codes(y, r)  # (nb, 16, K)
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # (nb, 8, K): element pairs (2i, 2i + 1) of each block
        # Row 8b + i of the (nb * 8, K) bytes is byte 8(b0 + b) + i of every copy row k: one 2-D transpose.
        data[:, r0 // 2 : r1 // 2] = packed.reshape((r1 - r0) // 2, k).t().contiguous()
    return {"colwise_data": data, "colwise_scale": scale, "colwise_amax": a_g.clone()}


def _amax_pass(x2d: torch.Tensor, config: QuantConfig, rows: bool, cols: bool) -> dict:
    """Block amaxes of X in one pass: "rows" (M, K/16) and/or "cols" (M/16, K), and "g" = amax(X) fp32 [1].

    2-D: the 16x16 tile amax, expanded to the rows of each copy (NUMERICS: §5.5 - same tile amax
    for both copies). NUMERICS: §0.1 - amax(X) = max of the block amaxes, exact in any order.
    """
    m_rows, k = x2d.shape
    blk, tile_rows = config.block, config.tile[0]
    out: dict = {}
    if config.is_2d:
        tiles = torch.empty((m_rows // tile_rows, k // blk), dtype=torch.float32, device=x2d.device)
        for r0, r1 in _chunks(m_rows, k, tile_rows):
            tiles[r0 // tile_rows : r1 // tile_rows] = _tile_amax(_row_blocks_amax(x2d[r0:r1], blk), tile_rows)
        if rows:
            out["rows"] = tiles.repeat_interleave(tile_rows, dim=0)  # (M, K/16)
        if cols:
            out["cols"] = tiles.repeat_interleave(blk, dim=1)  # (M/16, K)
        out["g"] = tiles.amax().reshape(1)
        return out
    if rows:
        out["rows"] = torch.empty((m_rows, k // blk), dtype=torch.float32, device=x2d.device)
    if cols or not rows:
        out["cols"] = torch.empty((m_rows // blk, k), dtype=torch.float32, device=x2d.device)
    for r0, r1 in _chunks(m_rows, k, blk):
        if "rows" in out:
            out["rows"][r0:r1] = _row_blocks_amax(x2d[r0:r1], blk)
        if "cols" in out:
            out["cols"][r0 // blk : r1 // blk] = _col_blocks_amax(x2d[r0:r1], blk)
    out["g"] = (out["rows"] if "rows" in out else out["cols"]).amax().reshape(1)
    return out


def _rht_pass(x2d: torch.Tensor, blk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, its block amaxes (M/16, K), its amax fp32 [1]) with h = RHT(X^T)^T, bf16 (M, K).

    NUMERICS: §5.6 - the columnwise A_g is the amax of the bf16 RHT output (post-RHT amax).
    """
    hadamard.check_rht_input(x2d)
    m_rows, k = x2d.shape
    h = torch.empty_like(x2d)
    a_b = torch.empty((m_rows // blk, k), dtype=torch.float32, device=x2d.device)
    for r0, r1 in _chunks(m_rows, k, hadamard.RHT_SIZE):
        hadamard.rht_rows(x2d[r0:r1], h[r0:r1])
        a_b[r0 // blk : r1 // blk] = _col_blocks_amax(h[r0:r1], blk)
    return h, a_b, a_b.amax().reshape(1)


# --------------------------------------------------------------------------------------------
# 4over6 (docs/numerics.md §5.10; TE common/cast/nvfp4/quantize_4over6_nvfp4.cuh)
# --------------------------------------------------------------------------------------------

# NUMERICS: §5.10 - map-to-4 expands the block scale by 1.5 (exact constant, one RN multiply).
MAP4_EXPAND = 1.5


def candidate_scales(a_b: torch.Tensor, s_enc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(map4, map6) E4M3 scale bits of the two 4over6 candidates from block amaxes and S_enc.

    NUMERICS: §5.10 - base = RN(RN(A_b / 6) * S_enc) (a true division, unlike §5.2);
    map4 = sat_e4m3(fmin(RN(1.5 * base), 448)), map6 = sat_e4m3(fmin(base, 448)).
    """
    base = fp32.div(a_b.to(torch.float32), E2M1.max_finite) * s_enc
    cap = fp32.scalar(E4M3.max_finite, base)
    map4 = casts.saturating_cast(torch.fmin(base * MAP4_EXPAND, cap), E4M3)
    map6 = casts.saturating_cast(torch.fmin(base, cap), E4M3)
    return map4, map6


def candidate_error(codes: torch.Tensor, s_blk: torch.Tensor, x: torch.Tensor, a_g: torch.Tensor,
                    config: QuantConfig) -> torch.Tensor:
    """fp32 (..., nb) error of one candidate per 16-element block; codes and x (..., nb, 16), s_blk (..., nb).

    NUMERICS: §5.10 - for elements 0..15 in order, every step RN: val = RN(RN(RN(v * sf) * A_g) /
    (6 * e4m3_max)) (true division), d = RN(val - x), err = RN(err + |d|) (mae) or RN(err + RN(d * d)) (mse).
    """
    v = casts.decode(codes, E2M1)  # (..., nb, 16)
    sf = casts.decode(s_blk, E4M3)[..., None]
    val = fp32.div((v * sf) * a_g, global_range(config.e4m3_max))
    d = val - x
    e = d.abs() if config.err_mode == "mae" else d * d
    err = torch.zeros_like(e[..., 0])
    for i in range(e.shape[-1]):  # NUMERICS: §5.10 - sequential sum over the block's elements
        err = err + e[..., i]
    return err


def tile_error_sum(err: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """(R/16, nb) sum of the 16 row errors of each 16x16 tile from (R, nb), as TE's warp reduction.

    NUMERICS: §5.10 - a tree with offsets 8, 4, 2, 1: row j + row j+8, then + 4, + 2, + 1, each RN.
    """
    e = err.reshape(err.shape[0] // tile_rows, tile_rows, err.shape[1])
    while e.shape[1] > 1:
        h = e.shape[1] // 2
        e = e[:, :h] + e[:, h:]
    return e[:, 0]


def _four_over_six_copy(src: torch.Tensor, a_g: torch.Tensor, config: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed data [R, C/2], scales [roundup(R, 128), roundup(C/16, 4)]) of the copy whose source is src [R, C].

    The copy is quantized from its own source (X, or X^T for the colwise copy), blocks along C;
    a_g is fp32 [1], or [R] when row-scaled. NUMERICS: §5.10 - with 16x16 tiles the candidate is
    chosen per tile from the tree sum of its 16 row errors, so the colwise copy (its errors
    summed over the rows of the transposed tile) is not the transpose of the rowwise copy.
    """
    rows, cols = src.shape
    blk, tile_rows = config.block, config.tile[0]
    data = torch.empty((rows, cols // 2), dtype=torch.uint8, device=src.device)
    scale = _scale_buffer(rows, cols, blk, src.device)
    g_all = a_g.to(torch.float32).reshape(-1, 1)  # (1 or R, 1)
    s_enc_all, s_dec_all = global_scale(g_all, config.e4m3_max)
    for r0, r1 in _chunks(rows, cols, max(blk, tile_rows)):
        n = r1 - r0
        rs = slice(r0, r1) if g_all.shape[0] > 1 else slice(None)  # row-scaled: the chunk's rows
        g, s_enc, s_dec = g_all[rs], s_enc_all[rs], s_dec_all[rs]  # (n or 1, 1)
        x = src[r0:r1].to(torch.float32).reshape(n, cols // blk, blk)  # (n, C/16, 16)
        a_b = _row_blocks_amax(src[r0:r1], blk)  # (n, C/16)
        if config.is_2d:
            a_b = _tile_amax(a_b, tile_rows).repeat_interleave(tile_rows, dim=0)
        picks = []
        for s_blk in candidate_scales(a_b, s_enc):
            f = encode_factor(s_blk, s_dec)  # NUMERICS: §5.3 per candidate
            codes = e2m1_rn(x * f[:, :, None])  # NUMERICS: §5.4 y = RN(x * f)
            err = candidate_error(codes, s_blk, x, g[:, :, None], config)  # (n, C/16)
            if config.is_2d:
                err = tile_error_sum(err, tile_rows).repeat_interleave(tile_rows, dim=0)
            picks.append((s_blk, codes, err))
        (s4, c4, e4), (s6, c6, e6) = picks
        pick4 = e4 < e6  # NUMERICS: §5.10 - map4 iff err4 < err6; ties and NaN go to map6
        scale[r0:r1, : cols // blk] = torch.where(pick4, s4, s6)
        codes = torch.where(pick4[:, :, None], c4, c6).reshape(n, cols)
        data[r0:r1] = casts.pack_nibbles(codes)
    return data, scale


def _quantize_four_over_six(x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool,
                            given: torch.Tensor | None) -> dict:
    """Both copies under a 4over6 variant (docs/numerics.md §5.10); each copy from its own source."""
    out: dict = {}
    if config.row_scaled:
        a_g = _row_blocks_amax(x2d, config.block).amax(dim=1)  # NUMERICS: §5.10 A_g [M]: amax of each row
    else:
        a_g = given if given is not None else _amax_pass(x2d, config, rows=True, cols=False)["g"]
    if rowwise:
        data, scale = _four_over_six_copy(x2d, a_g, config)
        out.update(rowwise_data=data, rowwise_scale=scale, rowwise_amax=a_g.clone())
    if colwise:
        data, scale = _four_over_six_copy(x2d.t().contiguous(), a_g, config)
        out.update(colwise_data=data, colwise_scale=scale, colwise_amax=a_g.clone())
    return out


# --------------------------------------------------------------------------------------------
# Convention torchao_nvfp4 (docs/numerics.md §10.5)
# --------------------------------------------------------------------------------------------


def e2m1_torchao(y: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of fp32 y (|y| <= 6 or NaN) as torchao's bit-level cast (custom_fp_utils._f32_to_floatx_unpacked).

    NUMERICS: §10.5 - every non-NaN lane equals e2m1_rn (RNE, sign copied; §0.5). The cast has no NaN
    case: a NaN takes its normal-number branch, which re-biases the magnitude bits, adds
    2^(22 - man) - 1 plus the kept mantissa's low bit and keeps bits [22 + 8 : 22] (a uint8); for
    NaN payloads that gives 2, 3 or 4, then the sign (0x8) is OR-ed in.
    """
    code = e2m1_rn(y)
    b = fp32.bits(y)
    mag = b & _FP32_MAG_MASK
    shift = _FP32_MAN_BITS - E2M1.man_bits  # 22
    r = mag + ((E2M1.bias - 127) << _FP32_MAN_BITS) + ((1 << (shift - 1)) - 1) + ((mag >> shift) & 1)
    nan_code = ((r >> shift) & 0xFF).to(torch.uint8) | (torch.signbit(y).to(torch.uint8) << (E2M1.bits - 1))
    return torch.where(torch.isnan(y), nan_code, code)


def _torchao_copy(src: torch.Tensor, a_g: torch.Tensor, blk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed data [R, C/2], s_blk [R, C/16]) of src [R, C], blocks along C (torchao nvfp4_quantize, two-level)."""
    rows, cols = src.shape
    xf = src.to(torch.float32).reshape(rows, cols // blk, blk)  # (R, C/16, 16)
    # NUMERICS: §10.5 - per_tensor_scale pts = RN(A_g / 2688) (per_tensor_amax_to_scale, a true division).
    pts = fp32.div(a_g.reshape(()), GLOBAL_RANGE)
    # NUMERICS: §10.5 - A_b = torch.amax(|x|) (NaN propagates); RN(RN(A_b / 6) / pts): two true divisions.
    scaled = fp32.div(fp32.div(xf.abs().amax(dim=-1), E2M1.max_finite), pts)
    # NUMERICS: §10.5 - s_blk = e4m3(clamp(., 2^-6, 448)): never 0 or subnormal; a NaN keeps its sign
    # (0x7F / 0xFF, torch's cast; 0/0 from an all-zero tensor is a negative NaN on x86).
    s_blk = casts.saturating_cast_signed_nan(torch.clamp(scaled, min=E4M3.min_normal, max=E4M3.max_finite), E4M3)
    s32 = s_blk.view(torch.float8_e4m3fn).to(torch.float32)  # torch's decode (its NaN bits feed the codes)
    # NUMERICS: §10.5 - factor RN(RN(1 / pts) / s_blk) (reciprocal, then a true division), y = RN(x * factor).
    factor = fp32.div(fp32.div(1.0, pts), s32)
    y = torch.clamp(xf * factor[..., None], -E2M1.max_finite, E2M1.max_finite)
    return casts.pack_nibbles(e2m1_torchao(y).reshape(rows, cols)), s_blk


def _quantize_torchao(x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool) -> dict:
    """NVFP4 1x16 under `torchao_nvfp4`: A_g = torch.max(|X|) (NaN propagates), shared by both copies."""
    blk = config.block
    m_rows, k = x2d.shape
    # NUMERICS: §10.5 - the per-tensor amax torchao's NVFP4 workflows pass: torch.max(torch.abs(x)).
    a_g = x2d.abs().max().to(torch.float32).reshape(1)
    out: dict = {}
    for orientation, src in (("rowwise", x2d), ("colwise", x2d.t())):
        if not (rowwise if orientation == "rowwise" else colwise):
            continue
        rows, cols = src.shape
        data, s_blk = _torchao_copy(src.contiguous(), a_g, blk)
        scale = _scale_buffer(rows, cols, blk, x2d.device)
        scale[:rows, : cols // blk] = s_blk
        out.update({f"{orientation}_data": data, f"{orientation}_scale": scale, f"{orientation}_amax": a_g.clone()})
    return out


def quantize_2d(
    x2d: torch.Tensor,
    config: QuantConfig,
    *,
    rowwise: bool,
    colwise: bool,
    rng: SRSeed | None = None,
    state=None,
    amax: torch.Tensor | None = None,
) -> dict:
    """NVFP4 copies of a 2-D [M, K] input as QuantizedTensor fields (docs/numerics.md §5, layouts §5.9).

    Without RHT both copies use A_g = amax(X), or the given `amax` (TE's quantize_with_amax, §5.1);
    with RHT the columnwise copy quantizes the bf16 RHT(X^T) with A_g = its amax. Row-scaled
    variants use A_g = the amax of each row [M] (rowwise) and of each column [K] (colwise), §5.10.
    SR bytes: rowwise stream, columnwise stream + 1. `state` is unused.
    """
    _check(x2d, config)
    if not (rowwise or colwise):
        raise SpecViolation("quantize needs rowwise=True or colwise=True; both were False")
    seed = SRSeed.coerce(rng) if config.stochastic else None
    if config.stochastic and seed is None:
        raise SpecViolation(f"{config.id}: stochastic rounding needs rng=(seed, stream) (docs/numerics.md §5.7)")
    if config.convention != "te":
        return _quantize_torchao(x2d, config, rowwise=rowwise, colwise=colwise)
    given = None if amax is None else amax.to(device=x2d.device, dtype=torch.float32).reshape(1)
    if config.four_over_six:
        return _quantize_four_over_six(x2d, config, rowwise=rowwise, colwise=colwise, given=given)
    out: dict = {}
    amax_x = _amax_pass(x2d, config, rows=rowwise, cols=colwise and not config.rht)
    a_g = given if given is not None else amax_x["g"]
    if rowwise:
        # NUMERICS: §5.10 row-scaled - A_g [M] = amax of each row = max of its block amaxes (exact).
        a_row = amax_x["rows"].amax(dim=1) if config.row_scaled else a_g
        out.update(_quantize_rowwise(x2d, amax_x["rows"], a_row, config, seed))
    if colwise:
        if config.rht:
            h, a_b, a_g = _rht_pass(x2d, config.block)
            out.update(_quantize_colwise(h, a_b, a_g, config, seed))
            del h
        else:
            # NUMERICS: §5.10 row-scaled - A_g [K] = amax of each column of X (each row of the copy).
            a_col = amax_x["cols"].amax(dim=0) if config.row_scaled else a_g
            out.update(_quantize_colwise(x2d, amax_x["cols"], a_col, config, seed))
    return out


# --------------------------------------------------------------------------------------------
# Diagnostics: the scale chain of one copy
# --------------------------------------------------------------------------------------------


def copy_source(x2d: torch.Tensor, config: QuantConfig, orientation: str) -> torch.Tensor:
    """The high-precision values a copy quantizes, in its own layout: X [M, K], X^T or RHT(X^T) [K, M]."""
    if orientation == "rowwise":
        return x2d
    if orientation != "colwise":
        raise ValueError(f"orientation={orientation!r} is invalid: expected 'rowwise' or 'colwise'")
    return hadamard.rht_transposed(x2d) if config.rht else x2d.t()


def scale_chain(x2d: torch.Tensor, config: QuantConfig, orientation: str) -> dict:
    """Every scale-chain intermediate of one copy, for showing a mismatching block.

    Returns fp32 0-dim "A_g", "S_enc", "S_dec", "m"; per block, in the copy's own layout
    [rows, cols/16] (rowwise [M, K/16], colwise [K, M/16]): "A_b", "d" (fp32), "s_blk" (uint8 E4M3
    bits), "f" (fp32); and "source", the high-precision values quantized ([M, K] or [K, M]), from
    which block (r, c) is source[r, 16c : 16c + 16] and its y = RN(source * f[r, c]).
    NUMERICS: §5.1-§5.3, §5.5, §5.6.
    """
    _check(x2d, config)
    if config.variant is not None:
        raise SpecViolation(f"{config.id}: scale_chain shows the plain chain of §5.1-§5.3, not the "
                            f"{config.variant} variant (docs/numerics.md §5.10)")
    src = copy_source(x2d, config, orientation)
    blk, tile_rows = config.block, config.tile[0]
    if orientation == "colwise" and config.rht:
        a_g = nan_ignoring_amax(src).reshape(1)
    else:
        a_g = _amax_pass(x2d, config, rows=True, cols=False)["g"]
    a_b = _row_blocks_amax(src, blk)  # (rows, cols/16)
    if config.is_2d:
        a_b = _tile_amax(a_b, tile_rows).repeat_interleave(tile_rows, dim=0)
    s_enc, s_dec = global_scale(a_g)
    mult = block_multiplier(s_enc)
    d, s_blk = block_scale(a_b, mult)
    return {
        "A_g": a_g.reshape(()),
        "S_enc": s_enc.reshape(()),
        "S_dec": s_dec.reshape(()),
        "m": mult.reshape(()),
        "A_b": a_b,
        "d": d,
        "s_blk": s_blk,
        "f": encode_factor(s_blk, s_dec),
        "source": src,
    }


# --------------------------------------------------------------------------------------------
# Dequantization and GEMM alpha (docs/numerics.md §5.8)
# --------------------------------------------------------------------------------------------


def decode_factor(s_blk: torch.Tensor, a_g: torch.Tensor, e4m3_max: float = E4M3.max_finite) -> torch.Tensor:
    """g = RN(RN(float(s_blk) * A_g) * fl(1/(6 * e4m3_max))) (NUMERICS: §5.8 - TE's decode, not the
    encode inverse; fl(1/2688) by default, fl(1/1536) for 4over6 with e4m3_max = 256, §5.10)."""
    p = casts.decode(s_blk, E4M3) * a_g.to(torch.float32)
    return p * fp32.scalar(fp32.reciprocal_const(global_range(e4m3_max)), p)


def dequantize(q, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(v * g)) of one copy as [M, K] (colwise transposed back; RHT copies stay in the Hadamard domain).

    NUMERICS: §5.8 - v the E2M1 value, g from the stored s_blk and the copy's A_g.
    """
    data = getattr(q, f"{orientation}_data")
    scale = getattr(q, f"{orientation}_scale")
    a_g = getattr(q, f"{orientation}_amax")
    blk = q.config.block
    rows, cols = data.shape[0], data.shape[1] * 2
    v = casts.decode(casts.unpack_nibbles(data), E2M1).reshape(rows, cols // blk, blk)  # (rows, cols/16, 16)
    # NUMERICS: §5.10 row-scaled - one A_g per row of the copy.
    a_g = a_g.reshape(-1, 1) if q.config.row_scaled else a_g.reshape(())
    g = decode_factor(scale[:rows, : cols // blk], a_g.to(data.device), q.config.e4m3_max)  # (rows, cols/16)
    xh = (v * g.unsqueeze(-1)).reshape(rows, cols).to(dtype)  # NUMERICS: §5.8 - one fp32 RN, then RN_out
    return xh if orientation == "rowwise" else xh.t().contiguous()


def gemm_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor, e4m3_max_a: float = E4M3.max_finite,
               e4m3_max_b: float = E4M3.max_finite) -> torch.Tensor:
    """alpha = RN(RN(A_g,a * A_g,b) * fl(1/(36 * e4m3_max_a * e4m3_max_b))), fp32.

    NUMERICS: §5.8 - the kernel multiplies, never divides; fl(1/7225344) unless a 4over6 operand
    has e4m3_max = 256 (§5.10, TE common/recipe/nvfp4.cu: each operand's own e4m3 max).
    """
    p = amax_a.to(torch.float32) * amax_b.to(torch.float32)
    inv = fp32.reciprocal_const(global_range(e4m3_max_a) * global_range(e4m3_max_b))
    return p * fp32.scalar(inv, p)
