"""NVFP4 variants (docs/numerics.md §5.10), SR on 16x16 tiles (§5.7), a given / reduced amax (§1, §5.1).

Hand-checked vectors with their expected bytes, and an independent scalar oracle written from the
rules of TE's Python reference (transformer_engine/pytorch/custom_recipes/reference_nvfp4.py,
`NVFP4QuantizerRef._quantize_blockwise_4over6_reference`, `_sum_4over6_2d_error`, the row-scaled
branch of `_quantize`) and kernel (common/cast/nvfp4/quantize_4over6_nvfp4.cuh): numpy float32
scalar arithmetic (one IEEE rounding per operation) and ml_dtypes casts, block by block. TE cannot
be installed here, so nothing of it is ported; the oracle follows the rules as §5.10 states them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from reference import QuantConfig, dequantize, gemm, philox, quantize, stochastic
from reference import nvfp4 as ref_nvfp4
from reference.layouts import copy_geometry
from reference.quantization import reduce_amax
from reference.spec import check_quantized
from reference.types import SpecViolation

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def _e4m3(v: np.float32) -> np.float32:
    """sat_e4m3 of a value in [0, 448] (ml_dtypes RNE cast), as fp32."""
    return F32(np.array([v], dtype=F32).astype(ml_dtypes.float8_e4m3fn).astype(F32)[0])


def _e2m1(y: np.ndarray) -> np.ndarray:
    """e2m1_rn of finite fp32 values (clamped to +-6 first, as TE's reference does), as fp32 values."""
    return np.clip(y, -6, 6).astype(F32).astype(ml_dtypes.float4_e2m1fn).astype(F32)


def _s_enc(a_g: np.float32, e4m3_max: int) -> np.float32:
    """§5.1 with 6 * e4m3_max; A_g = 0 or S_enc = 0 -> 1 (TE's kernel)."""
    if a_g == 0:
        return F32(1)
    s = F32(F32(6 * e4m3_max) / a_g)
    s = min(s, FLT_MAX)
    return F32(1) if s == 0 else s


def _oracle_block_candidates(x16: np.ndarray, a_b: np.float32, a_g: np.float32, e4m3_max: int, mse: bool):
    """[(scale, values, err)] for map4 and map6 of one 16-element block (docs/numerics.md §5.10)."""
    s_enc = _s_enc(a_g, e4m3_max)
    s_dec = F32(F32(1) / s_enc)
    base = F32(F32(a_b / F32(6)) * s_enc)
    out = []
    for mult in (F32(1.5), F32(1)):
        sf = _e4m3(min(F32(base * mult), F32(448)))
        denom = F32(sf * s_dec)
        f = FLT_MAX if denom == 0 else min(F32(F32(1) / denom), FLT_MAX)
        v = _e2m1((x16 * f).astype(F32))
        err = F32(0)
        for i in range(16):
            val = F32(F32(F32(v[i] * sf) * a_g) / F32(6 * e4m3_max))
            d = F32(val - x16[i])
            err = F32(err + (F32(d * d) if mse else abs(d)))
        out.append((sf, v, err))
    return out


def _tree16(e: list) -> np.float32:
    """TE's warp tree over 16 row errors: offsets 8, 4, 2, 1 (docs/numerics.md §5.10)."""
    e = [F32(v) for v in e]
    while len(e) > 1:
        h = len(e) // 2
        e = [F32(e[j] + e[j + h]) for j in range(h)]
    return e[0]


def oracle_4over6(src: np.ndarray, a_g, tile_rows: int, e4m3_max: int, mse: bool):
    """(values [R, C], scales [R, C/16]) of the copy quantized from src [R, C] (fp32), blocks along C.

    a_g: a scalar, or one per row (row-scaled). 16x16: the tile amax for every row, the candidate
    chosen from the tree sum of the 16 row errors (TE `_sum_4over6_2d_error`).
    """
    rows, cols = src.shape
    vals = np.zeros_like(src)
    scales = np.zeros((rows, cols // 16), dtype=F32)
    ag = np.broadcast_to(np.asarray(a_g, dtype=F32).reshape(-1), (rows,))
    for r0 in range(0, rows, tile_rows):
        for cb in range(cols // 16):
            tile = src[r0:r0 + tile_rows, 16 * cb:16 * cb + 16]
            a_b = F32(np.abs(tile).max())
            cands = []
            for r in range(tile_rows):
                blk_ab = a_b if tile_rows > 1 else F32(np.abs(tile[r]).max())
                cands.append(_oracle_block_candidates(tile[r], blk_ab, ag[r0 + r], e4m3_max, mse))
            err4 = _tree16([c[0][2] for c in cands]) if tile_rows > 1 else cands[0][0][2]
            err6 = _tree16([c[1][2] for c in cands]) if tile_rows > 1 else cands[0][1][2]
            pick = 0 if err4 < err6 else 1
            for r in range(tile_rows):
                sf, v, _ = cands[r][pick]
                vals[r0 + r, 16 * cb:16 * cb + 16] = v
                scales[r0 + r, cb] = sf
    return vals, scales


def _values(q, orientation):
    """(E2M1 values [rows, cols] fp32, scales [rows, cols/16] fp32) of one copy, in its own layout."""
    from reference import casts
    from reference.formats import E2M1, E4M3

    data, scale = getattr(q, f"{orientation}_data"), getattr(q, f"{orientation}_scale")
    rows, cols = data.shape[0], data.shape[1] * 2
    v = casts.decode(casts.unpack_nibbles(data), E2M1).reshape(rows, cols)
    s = casts.decode(scale[:rows, : cols // 16], E4M3)
    return v.numpy(), s.numpy()


def _hi(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.float32).numpy()


# ---- hand-checked 4over6 vectors ------------------------------------------------------------

# A_g = 2688 makes S_enc = S_dec = 1, so the block scale is the E4M3 cast of RN(A_b / 6) (x 1.5).
#  block 0 [4, 2, 1, 3, 0...]: base = RN(4/6) = 0x3F2AAAAB; map6 = e4m3(0.6667) = 0.6875 (0x33),
#     map4 = e4m3(RN(1.5 * base) = 1.0) = 1.0 (0x38): x lands on the grid -> err4 = 0 < err6: map4,
#     codes 4 -> 6, 2 -> 4, 1 -> 2, 3 -> 5.
#  block 1 [6, 0...]: map6 = 1.0 (0x38), map4 = 1.5 (0x3C); map6 gives y = 6, err 0; map4 gives
#     y = RN(6 * RN(1/1.5)) = 4.0 (code 6), val = 4 * 1.5 = 6, err 0: a tie -> map6, code 7.
#  block 2 [6, 5, 0...]: map6: 5 -> code 6 (4.0, the tie to even), err6 = |4 - 5| = 1; map4:
#     y = RN(5 * 0.6666667) = 3.3333335 -> code 5 (3.0), val 4.5, err4 = 0.5 -> map4 (0x3C), codes 6, 5.
#  block 3 [2688, 0...]: base = 448, both candidates 448 (0x7E): tie -> map6, code 7.
HAND_X = [4, 2, 1, 3] + [0] * 12 + [6] + [0] * 15 + [6, 5] + [0] * 14 + [2688] + [0] * 15
HAND_SCALES = [0x38, 0x38, 0x3C, 0x7E]
HAND_CODES = [[6, 4, 2, 5] + [0] * 12, [7] + [0] * 15, [6, 5] + [0] * 14, [7] + [0] * 15]


def _packed(codes):
    return [c0 | (c1 << 4) for c0, c1 in zip(codes[0::2], codes[1::2], strict=True)]


@pytest.mark.parametrize("err_mode", ["mae", "mse"])
def test_4over6_hand_vector(err_mode):
    x = torch.tensor(HAND_X, dtype=torch.float32).repeat(16, 1)  # (16, 64): every row the same
    q = quantize(x, QuantConfig("nvfp4", variant="4over6", err_mode=err_mode))
    assert q.rowwise_amax.tolist() == [2688.0]
    assert q.rowwise_scale[0, :4].tolist() == HAND_SCALES
    assert q.rowwise_data[0].tolist() == sum((_packed(c) for c in HAND_CODES), [])
    # dequantization with 6 * 448: g = RN(RN(s * 2688) * fl(1/2688)) = s here (2688 * fl(1/2688) rounds to 1).
    xh = dequantize(q, "rowwise", torch.float32)[0]
    assert xh[:4].tolist() == [4.0, 2.0, 1.0, 3.0] and xh[32:34].tolist() == [6.0, 4.5]


def test_4over6_e4m3_max_256_given_amax_hand_vector():
    """e4m3_max = 256 with a given A_g = 1536: S_enc = 1536 / 1536 = 1, the same candidates as above."""
    x = torch.tensor(HAND_X[:48], dtype=torch.float32).repeat(16, 1)
    q = quantize(x, QuantConfig("nvfp4", variant="4over6", e4m3_max=256), amax=torch.tensor([1536.0]))
    assert q.rowwise_amax.tolist() == [1536.0]
    assert q.rowwise_scale[0, :3].tolist() == HAND_SCALES[:3]
    assert q.rowwise_data[0].tolist() == sum((_packed(c) for c in HAND_CODES[:3]), [])
    # g = RN(RN(1.5 * 1536) * fl(1/1536)) = 1.5 (2304 * 0x3AAAAAAB = 1.50000004 rounds to 1.5).
    assert dequantize(q, "rowwise", torch.float32)[0, 32:34].tolist() == [6.0, 4.5]


def test_tile_error_sum_is_te_tree_not_sequential():
    """Row errors [2^24, 1 x 15]: a sequential fp32 sum stays 2^24 (each +1 ties to even); TE's tree
    (8, 4, 2, 1) gives ((2^24 + 1 -> 2^24) + 2) + 4 + 8 = 2^24 + 14 (hand-checked)."""
    err = torch.ones(16, 1, dtype=torch.float32)
    err[0, 0] = 2.0**24
    assert ref_nvfp4.tile_error_sum(err, 16).item() == 2.0**24 + 14
    assert float(_tree16(err[:, 0].tolist())) == 2.0**24 + 14


# ---- 4over6 against the scalar oracle ----------------------------------------------------------


def _inputs(seed: int, m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g))
    # near-tie values: multiples of 0.25 of a per-tile unit, so candidates often tie or nearly tie
    ties = torch.randint(-24, 25, (m, k), generator=g).to(torch.float32) * 0.25
    x = torch.where(torch.rand(m, k, generator=g) < 0.5, x, ties)
    return x.to(dtype)


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("e4m3_max", [448, 256])
@pytest.mark.parametrize("err_mode", ["mae", "mse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_4over6_matches_oracle_both_copies(tile, e4m3_max, err_mode, dtype):
    x = _inputs(7 + e4m3_max + len(err_mode), 32, 64, dtype)
    cfg = QuantConfig("nvfp4", tile=tile, variant="4over6", e4m3_max=e4m3_max, err_mode=err_mode)
    q = quantize(x, cfg, rowwise=True, colwise=True)
    xf = _hi(x)
    a_g = F32(np.abs(xf).max())
    for orientation, src in (("rowwise", xf), ("colwise", np.ascontiguousarray(xf.T))):
        v, s = _values(q, orientation)
        ov, os_ = oracle_4over6(src, a_g, tile[0], e4m3_max, err_mode == "mse")
        np.testing.assert_array_equal(s, os_, err_msg=f"{orientation} scales")
        np.testing.assert_array_equal(v, ov, err_msg=f"{orientation} values")


def test_4over6_16x16_colwise_sums_over_the_transposed_tile():
    """§5.10: the 16x16 colwise copy sums each candidate's errors over the rows of the transposed
    tile (the oracle test above checks its bytes against X^T). The two orders give different fp32
    sums of the same 256 element errors: row 0 = [2^24, 1 x 15], the rest 0 - rowwise (each row in
    order, then the tree) gives 2^24 (the +1s tie to even), colwise (column 0 = [2^24, 0...], columns
    1..15 = [1, 0...], tree over columns) gives 2^24 + 14. Plain RN 2-D keeps §5.5's exact transpose."""
    e = torch.zeros(16, 16)
    e[0, 0], e[0, 1:] = 2.0**24, 1.0
    row_sums = torch.zeros(16, 1)
    col_sums = torch.zeros(16, 1)
    for i in range(16):  # sequential over the elements of each block
        row_sums[:, 0] = row_sums[:, 0] + e[:, i]
        col_sums[:, 0] = col_sums[:, 0] + e.t()[:, i]
    assert ref_nvfp4.tile_error_sum(row_sums, 16).item() == 2.0**24
    assert ref_nvfp4.tile_error_sum(col_sums, 16).item() == 2.0**24 + 14
    x = _inputs(3, 64, 64, torch.float32)
    p = quantize(x, QuantConfig("nvfp4", tile=(16, 16)), rowwise=True, colwise=True)
    assert torch.equal(p.rowwise_scale[:64, :4][::16], p.colwise_scale[:64, :4][::16].t())


def test_4over6_nan_and_inf_blocks_pick_map6():
    """NaN / inf elements make both errors NaN / inf: the comparison fails, map6 wins (§5.10)."""
    x = torch.zeros(16, 32)
    x[:, 0], x[:, 1] = 3.0, float("nan")
    x[:, 16], x[:, 17] = 3.0, float("inf")
    q = quantize(x, QuantConfig("nvfp4", variant="4over6"))
    # A_g = inf -> S_enc = 1 (§5.1); block 0: A_b = 3 (NaN ignored): map6 = e4m3(RN(3/6)) = 0.5 (0x30).
    assert q.rowwise_scale[0, 0].item() == 0x30
    # block 1: A_b = inf: base = inf -> both candidates 448 (0x7E).
    assert q.rowwise_scale[0, 1].item() == 0x7E


# ---- row-scaled ------------------------------------------------------------------------------


def test_row_scaled_rows_and_columns_use_their_own_amax():
    """Oracle: row r of the row-scaled rowwise copy equals row r of a plain quantization with the
    given amax A_row[r] (and column k of the colwise copy: a plain one with amax A_col[k])."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(32, 48, generator=g) * torch.logspace(-3, 3, 32)[:, None]).to(torch.bfloat16)
    x[3] = 0  # an all-zero row: A_g = 0 -> S_enc = 1 (TE's kernel), scales 0, codes 0
    q = quantize(x, QuantConfig("nvfp4", variant="row_scaled"), rowwise=True, colwise=True)
    a_row = x.float().abs().amax(dim=1)
    a_col = x.float().abs().amax(dim=0)
    assert torch.equal(q.rowwise_amax, a_row) and torch.equal(q.colwise_amax, a_col)
    assert copy_geometry(q.config, "rowwise", 32, 48).amax_shape == (32,)
    assert copy_geometry(q.config, "colwise", 32, 48).amax_shape == (48,)
    check_quantized(q, "rowwise")
    check_quantized(q, "colwise")
    plain = QuantConfig("nvfp4")
    for r in (0, 3, 17, 31):
        p = quantize(x, plain, amax=a_row[r].reshape(1))
        assert torch.equal(q.rowwise_data[r], p.rowwise_data[r]), r
        assert torch.equal(q.rowwise_scale[r], p.rowwise_scale[r]), r
    for k in (0, 9, 47):
        p = quantize(x, plain, rowwise=False, colwise=True, amax=a_col[k].reshape(1))
        assert torch.equal(q.colwise_data[k], p.colwise_data[k]), k
        assert torch.equal(q.colwise_scale[k], p.colwise_scale[k]), k
    assert int(q.rowwise_data[3].abs().sum()) == 0 and int(q.rowwise_scale[3].sum()) == 0
    # dequantize uses each row's A_g: row r equals the plain dequantization with amax A_row[r]
    xh = dequantize(q, "rowwise", torch.float32)
    p = quantize(x, plain, amax=a_row[17].reshape(1))
    assert torch.equal(xh[17], dequantize(p, "rowwise", torch.float32)[17])


def test_row_scaled_4over6_matches_oracle_and_has_no_colwise_copy():
    x = _inputs(11, 32, 64, torch.float32)
    x[5] = 0
    cfg = QuantConfig("nvfp4", variant="row_scaled_4over6", e4m3_max=256, err_mode="mse")
    q = quantize(x, cfg)
    xf = _hi(x)
    a_row = np.abs(xf).max(axis=1).astype(F32)
    v, s = _values(q, "rowwise")
    ov, os_ = oracle_4over6(xf, a_row, 1, 256, True)
    np.testing.assert_array_equal(s, os_)
    np.testing.assert_array_equal(v, ov)
    with pytest.raises(SpecViolation, match="no columnwise copy"):
        quantize(x, cfg, colwise=True)


# ---- GEMM alpha and the row-scaled GEMM ---------------------------------------------------------


def test_gemm_alpha_uses_each_operands_e4m3_max():
    one = torch.ones(1)
    # fl(1/7225344) = 0x34149B93 (§5.8); 36 * 448 * 256 = 4128768; 36 * 256 * 256 = 2359296.
    assert ref_nvfp4.gemm_alpha(one, one).view(torch.int32).item() == 0x34149B93
    assert ref_nvfp4.gemm_alpha(one, one, 256, 256).item() == float(F32(1) / F32(2359296))
    assert ref_nvfp4.gemm_alpha(one, one, 448, 256).item() == float(F32(1) / F32(4128768))


def _row_scaled_oracle(qa, qb, out_dtype, bias=None, c=None):
    """TE's kernel path (pytorch/cpp_extensions/gemm.py): per-tensor GEMM with amaxes 1, fp32 out,
    then out *= RN(a[m] * b) (one side a vector) or (out * a[m]) * b[n] (both), bias, cast, C."""
    va, sa = _values(qa, "rowwise")
    vb, sb = _values(qb, "rowwise")
    y = (np.repeat(sa, 16, 1).astype(np.float64) * va) @ (np.repeat(sb, 16, 1).astype(np.float64) * vb).T
    alpha = F32(F32(1) / F32(36 * qa.config.e4m3_max * qb.config.e4m3_max))
    y32 = (y * np.float64(alpha)).astype(F32)
    ra, rb = qa.rowwise_amax.numpy().reshape(-1, 1), qb.rowwise_amax.numpy().reshape(1, -1)
    if qa.config.row_scaled and qb.config.row_scaled:
        y32 = ((y32 * ra).astype(F32) * rb).astype(F32)
    else:
        y32 = (y32 * (ra * rb).astype(F32)).astype(F32)
    if bias is not None:
        y32 = (y32 + bias.float().numpy()[None, :]).astype(F32)
    z = torch.from_numpy(y32).to(out_dtype)
    if c is not None:
        z = (c.float() + z.float()).to(out_dtype)
    return z


@pytest.mark.parametrize("b_variant", [None, "row_scaled"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_row_scaled_gemm_follows_te_kernel_order(b_variant, out_dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 64, generator=g) * torch.logspace(-2, 2, 32)[:, None]
    w = torch.randn(48, 64, generator=g) * torch.logspace(1, -1, 48)[:, None]
    qa = quantize(x, QuantConfig("nvfp4", variant="row_scaled"))
    qb = quantize(w, QuantConfig("nvfp4", variant=b_variant))
    bias = torch.randn(48, generator=g).to(out_dtype)
    c = torch.randn(32, 48, generator=g).to(out_dtype)
    assert torch.equal(gemm(qa, qb, out_dtype=out_dtype), _row_scaled_oracle(qa, qb, out_dtype))
    assert torch.equal(gemm(qa, qb, out_dtype=out_dtype, bias=bias, c=c),
                       _row_scaled_oracle(qa, qb, out_dtype, bias=bias, c=c))


def test_row_scaled_gemm_order_hand_vector():
    """One element: y32 = 1 + 2^-23 (the fp32 GEMM output), A_a = 3, A_b = 1/3 (fp32 0x3EAAAAAB).
    Folded (TE with one vector side): RN(3 * 0x3EAAAAAB) = 1.0, y = 1 + 2^-23; two steps would give
    RN(RN(3 * (1 + 2^-23)) * 0x3EAAAAAB) = 1 + 2^-22 (hand-checked with exact rationals)."""
    from reference.gemm import Operand, _row_scaled_output

    def op(amax, row_scaled):
        return Operand("a", "rowwise", torch.zeros(1, 16, dtype=torch.float64), None, 16, False, None,
                       torch.tensor([amax], dtype=torch.float32), False, 448, row_scaled)

    third = float(F32(1) / F32(3))
    y = torch.tensor([[1 + 2.0**-23]], dtype=torch.float64)
    assert _row_scaled_output(y, op(3.0, True), op(third, False), torch.float32, None, None).item() == 1 + 2.0**-23
    assert _row_scaled_output(y, op(3.0, True), op(third, True), torch.float32, None, None).item() == 1 + 2.0**-22


# ---- SR on 16x16 tiles (§5.7) -------------------------------------------------------------------


def test_sr_16x16_scales_transpose_and_colwise_bits_follow_the_contract():
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(32, 48, generator=g) * 3).to(torch.bfloat16)
    seed, stream = 0x1234_5678_9ABC, 7
    cfg = QuantConfig("nvfp4", tile=(16, 16), stochastic=True)
    q = quantize(x, cfg, rowwise=True, colwise=True, rng=(seed, stream))
    # same tile amax and A_g: the colwise scales are the rowwise ones transposed (§5.5)
    assert torch.equal(q.rowwise_scale[:32, :3][::16].t(), q.colwise_scale[:48, :2][::16])
    # colwise element [k, m]: L = k*M + m, Philox counter (L // 16, 0, stream + 1, 0), byte L mod 4 of word
    # (L mod 16) // 4 of the call's (x0, x1, x2, x3)
    chain = ref_nvfp4.scale_chain(x, cfg, "colwise")
    codes = torch.stack([q.colwise_data & 0xF, q.colwise_data >> 4], dim=-1).reshape(48, 32)
    m_rows = 32
    for k, m in [(0, 0), (0, 1), (5, 17), (47, 31), (20, 3)]:
        lin = k * m_rows + m
        word = philox.philox4x32((lin // 16, 0, stream + 1, 0), philox.seed_key(seed))[(lin % 16) // 4]
        r = torch.tensor([(word >> (8 * (lin % 4))) & 0xFF], dtype=torch.uint8)
        y = chain["source"][k, m].float() * chain["f"][k, m // 16]
        assert codes[k, m].item() == stochastic.e2m1_sr(y.reshape(1), r).item(), (k, m)
    # and the rowwise copy is not the transpose of the colwise one (independent bits)
    assert not torch.equal(q.rowwise_data, q.colwise_data)


# ---- given amax and amax reduction --------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["fp8_current", "nvfp4"])
def test_given_amax_equals_own_amax_and_reduction_over_shards(scheme):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 64, generator=g)
    cfg = QuantConfig(scheme)
    own = quantize(x, cfg, rowwise=True, colwise=True)
    shards = [x[i * 16:(i + 1) * 16].abs().amax().reshape(1) for i in range(4)]
    red = reduce_amax(shards)
    assert torch.equal(red, own.rowwise_amax)
    given = quantize(x, cfg, rowwise=True, colwise=True, amax=red)
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale", "rowwise_amax"):
        assert torch.equal(getattr(given, f), getattr(own, f)), f
    # a larger given amax (another shard holds the max) changes the scales: fp8_current s = 448 / 4
    big = quantize(x, cfg, amax=torch.tensor([4.0 * float(red)]))
    assert big.rowwise_amax.item() == 4.0 * float(red)
    assert not torch.equal(big.rowwise_scale, own.rowwise_scale)


def test_given_amax_hand_vector_fp8_current():
    """amax = 3 given for x = [1]: s = RN(448 / 3) = 0x43155555 (§1), sinv = RN(1/s), q(1) = e4m3(149.33) = 144."""
    q = quantize(torch.ones(1, 4), QuantConfig("fp8_current"), amax=torch.tensor(3.0))
    assert q.rowwise_amax.tolist() == [3.0]
    assert q.rowwise_data[0, 0].item() == 0x71  # e4m3 144 = 1.125 * 2^7: biased exponent 14, mantissa 1
    s = np.array([0x43155555], dtype=np.uint32).view(F32)[0]
    assert q.rowwise_scale.item() == float(F32(1) / s)


@pytest.mark.parametrize(
    "kwargs,amax,match",
    [
        (dict(scheme="mxfp8"), torch.tensor([1.0]), "exists only for"),
        (dict(scheme="nvfp4", rht=True), torch.tensor([1.0]), "RHT"),
        (dict(scheme="nvfp4", variant="row_scaled"), torch.tensor([1.0]), "row-scaled"),
        (dict(scheme="nvfp4"), torch.tensor([1.0, 2.0]), "shape"),
        (dict(scheme="nvfp4"), torch.tensor([1.0], dtype=torch.float64), "dtype"),
        (dict(scheme="nvfp4"), torch.tensor([-1.0]), ">= \\+0"),
        (dict(scheme="nvfp4"), torch.tensor([-0.0]), ">= \\+0"),
        (dict(scheme="fp8_current"), torch.tensor([float("nan")]), "NaN"),
        (dict(scheme="fp8_current"), 3.0, "torch.Tensor"),
    ],
)
def test_given_amax_spec_checks(kwargs, amax, match):
    x = torch.ones(32, 32, dtype=torch.bfloat16)
    with pytest.raises(SpecViolation, match=match):
        quantize(x, QuantConfig(**kwargs), colwise=True, amax=amax)


def test_reduce_amax_checks_shards():
    assert reduce_amax([torch.tensor(1.0), torch.tensor([float("inf")])]).tolist() == [float("inf")]
    with pytest.raises(SpecViolation, match="at least one"):
        reduce_amax([])
    with pytest.raises(SpecViolation, match="shard amax 1"):
        reduce_amax([torch.tensor([1.0]), torch.tensor([float("nan")])])


# ---- the harness compare handles the vector amax ------------------------------------------------


@pytest.mark.parametrize("variant", ["row_scaled", "4over6"])
def test_compare_locates_a_mismatch_in_a_variant_copy(variant):
    from dataclasses import replace

    from harness.compare import compare_quantized

    g = torch.Generator().manual_seed(8)
    x = torch.randn(32, 64, generator=g).to(torch.bfloat16)
    golden = quantize(x, QuantConfig("nvfp4", variant=variant), rowwise=True)
    assert all(r.status == "pass" for r in compare_quantized(golden, golden, x))
    n_amax = golden.rowwise_amax.numel()
    data = golden.rowwise_data.clone()
    data[17, 5] ^= 0x01  # one flipped code in row 17
    amax = golden.rowwise_amax.clone()
    amax[-1] = amax[-1] * 2  # and the last row's amax (the only one without row-scaling)
    res = {r.tensor: r for r in compare_quantized(golden, replace(golden, rowwise_data=data, rowwise_amax=amax), x)}
    assert res["rowwise_data"].status == "fail" and res["rowwise_data"].n_mismatch == 1
    assert res["rowwise_data"].first_mismatch["row"] == 17
    assert res["rowwise_amax"].status == "fail" and res["rowwise_amax"].first_mismatch["index"] == [n_amax - 1]
    if variant == "row_scaled":
        assert n_amax == 32
        assert res["rowwise_data"].first_mismatch["golden_chain"]["amax"] == float(golden.rowwise_amax[17])


# ---- native: which variants have kernels ---------------------------------------------------------


@pytest.mark.parametrize("op", ["quantize", "dequantize", "gemm"])
@pytest.mark.parametrize(
    "kwargs",
    [dict(variant="4over6"), dict(variant="row_scaled"), dict(variant="row_scaled_4over6", e4m3_max=256),
     dict(tile=(16, 16), stochastic=True)],
)
def test_native_supports_gives_no_variant_or_sr_2d_reason(op, kwargs):
    """The variants and SR on 16x16 tiles have native kernels (tests/gpu/test_native_nvfp4_variants.py,
    test_native_features.py): here, without a GPU, supports() refuses for the missing device only."""
    native = pytest.importorskip("native")
    ok, why = native.supports(op, QuantConfig("nvfp4", **kwargs), "cuda")
    assert not ok and "variant" not in why and "16x16" not in why
    assert "CUDA" in why or "CuPy" in why or "GPU" in why


def test_native_quantize_checks_a_given_amax():
    """native takes a given amax (tests/gpu/test_native_features.py); on the CPU only its spec checks run."""
    native = pytest.importorskip("native")

    with pytest.raises(SpecViolation, match="CUDA tensors"):
        native.quantize(torch.ones(16, 16), QuantConfig("nvfp4"), amax=torch.tensor([1.0]))
    with pytest.raises(SpecViolation, match=">= \\+0"):
        native.quantize(torch.ones(16, 16), QuantConfig("nvfp4"), amax=torch.tensor([-1.0]))
