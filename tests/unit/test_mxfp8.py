"""MXFP8 (1x32, 32x32; E8M0 rules `ceil` and `floor`) against docs/numerics.md §3, §0.5 and §8.

Expected bytes are hand-derived in the comments (E4M3 code = s|EEEE|mmm, value (1 + m/8)·2^(E-7),
subnormal m·2^-9) or come from an independent per-block Python loop: exact rational log2 for the
exponent (`ceil`: max(0, ceil(log2(A/max)) + 127); `floor`: frexp), numpy float32 products and
ml_dtypes float8 casts after clamping.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

import reference
from reference import mxfp8
from reference.formats import E4M3, E5M2, QuantConfig
from reference.types import SpecViolation

from .oracles import oracle_codes, wide_range_input

NAN, INF = float("nan"), float("inf")
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMT = {"e4m3": E4M3, "e5m2": E5M2}
B = 32


def f32(b: int) -> float:
    return float(np.array([b], dtype=np.uint32).view(np.float32)[0])


def block_row(vals, dtype=torch.float32) -> torch.Tensor:
    """A [32, 32] input whose first row starts with `vals` (zero elsewhere)."""
    x = torch.zeros(B, B, dtype=torch.float32)
    x[0, : len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return x.to(dtype)


def quant(x, **kw) -> reference.QuantizedTensor:
    return reference.quantize(x, QuantConfig("mxfp8", **kw), rowwise=True, colwise=True)


# ---- §8 rows ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["ceil", "floor"])
def test_block_amax_112(rule):
    # t = RN(112·fl(1/448)) = 0.25 exactly: ceil 125 = floor 125 (floor: 6 - 8 + 127); P = 4.
    # 448: 0x7E; 4 = 2^2: 0x48; -12 = -1.5·2^3: 0xD4; 0.04 -> 10·2^-8 = 1.25·2^-5: 0x12.
    q = quant(block_row([112.0, 1.0, -3.0, 0.01]), e8m0_rule=rule)
    assert q.rowwise_scale[0, 0].item() == 125
    assert q.rowwise_data[0, :4].tolist() == [0x7E, 0x48, 0xD4, 0x12]


@pytest.mark.parametrize(
    "rule, e, expected",
    [
        # t = RN(120·fl(1/448)) = 0x3E892493 > 0.25 -> ceil 126, P = 2: 240 = 1.875·2^7: 0x77;
        # 2: 0x40; -6 = -1.5·2^2: 0xCC; 0.02 -> 10·2^-9 = 1.25·2^-6: 0x0A.
        pytest.param("ceil", 126, [0x77, 0x40, 0xCC, 0x0A], id="ceil"),
        # floor 125 (floor(log2 120) = 6), P = 4: 480 clips to 448: 0x7E; the rest as amax 112.
        pytest.param("floor", 125, [0x7E, 0x48, 0xD4, 0x12], id="floor"),
    ],
)
def test_block_amax_120(rule, e, expected):
    q = quant(block_row([120.0, 1.0, -3.0, 0.01]), e8m0_rule=rule)
    assert q.rowwise_scale[0, 0].item() == e
    assert q.rowwise_data[0, :4].tolist() == expected


@pytest.mark.parametrize(
    "element, amax, ceil_e, floor_e",
    [
        pytest.param("e4m3", 113.0, 126, 125, id="e4m3-113"),
        pytest.param("e4m3", 150.0, 126, 126, id="e4m3-150"),
        pytest.param("e4m3", 448.0, 127, 127, id="e4m3-448"),
        pytest.param("e4m3", 449.0, 128, 127, id="e4m3-449"),
        pytest.param("e4m3", 0.0, 0, 0, id="e4m3-0"),
        pytest.param("e4m3", INF, 254, 254, id="e4m3-inf"),
        pytest.param("e5m2", 1.0, 112, 112, id="e5m2-1.0"),
        pytest.param("e5m2", 1.9, 113, 112, id="e5m2-1.9"),
        pytest.param("e5m2", 61440.0, 128, 127, id="e5m2-61440"),
    ],
)
def test_exponents(element, amax, ceil_e, floor_e):
    for rule, e in (("ceil", ceil_e), ("floor", floor_e)):
        q = quant(block_row([amax]), element=element, e8m0_rule=rule)
        assert q.rowwise_scale[0, 0].item() == e, rule
        # Column 0 holds the same amax in its 32x1 block.
        assert q.colwise_scale[0, 0].item() == e, rule


def test_exponent_449_data():
    # ceil 128 (P = 0.5): 224.5 -> nearest of 224/240 is 224 = 1.75·2^7: 0x76 (no saturation);
    # floor 127 (P = 1): 449 -> 448: 0x7E (clipped).
    assert quant(block_row([449.0])).rowwise_data[0, 0].item() == 0x76
    assert quant(block_row([449.0]), e8m0_rule="floor").rowwise_data[0, 0].item() == 0x7E


def test_ceil_bit_rule_edge():
    # docs/numerics.md §3/§7.14: the bit rule differs from the real ceil(log2(A/448)) at one amax.
    # A = 0x04600001 = 1.75·2^-119 + 1 ulp: A/448 > 2^-127 (real ceil -> e = 1), but
    # RN(A·fl(1/448)) = 0x00400000 = 2^-127 exactly, and e8m0_up(2^-127) = 0. With P(0) = 2^127,
    # A·P = 448·(1 + 2^-23/1.75) lands a hair above max and is rounded back to 448: 0x7E.
    q = quant(block_row([f32(0x04600001)]))
    assert q.rowwise_scale[0, 0].item() == 0
    assert q.rowwise_data[0, 0].item() == 0x7E
    # One ulp further, t = 0x00400001 > 2^-127 and the rule gives 1.
    assert quant(block_row([f32(0x04600002)])).rowwise_scale[0, 0].item() == 1


def test_layout_64x96():
    # §8: MXFP8 x [64, 96]: S_r [128, 4], S_c [4, 128]; colwise data [M, K] NOT transposed.
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)) + 3.0
    q = quant(x)
    assert q.rowwise_data.shape == (64, 96) and q.colwise_data.shape == (64, 96)
    assert q.rowwise_scale.shape == (128, 4) and q.rowwise_scale.dtype == torch.uint8
    assert q.colwise_scale.shape == (4, 128) and q.colwise_scale.dtype == torch.uint8
    assert q.rowwise_amax is None and q.colwise_amax is None
    # Valid regions are non-zero (every block has amax ~ 3, e = 120 or so); padding is zero.
    assert bool((q.rowwise_scale[:64, :3] > 0).all()) and bool((q.colwise_scale[:2, :96] > 0).all())
    assert q.rowwise_scale[64:].sum() == 0 and q.rowwise_scale[:, 3:].sum() == 0
    assert q.colwise_scale[2:].sum() == 0 and q.colwise_scale[:, 96:].sum() == 0


# ---- special-value corpus --------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["ceil", "floor"])
@pytest.mark.parametrize(
    "vals, e, expected",
    [
        # Zero block: A = 0 -> e = 0 (P = 2^127): +0 -> 0x00, -0 -> 0x80.
        pytest.param([0.0, -0.0], 0, [0x00, 0x80], id="zero_block"),
        # A = +inf (NaN ignored) -> e = 254, P = 2^-127: inf -> 0x7E, -inf -> 0xFE, NaN -> 0x7F,
        # 1·2^-127 and 2^100·2^-127 = 2^-27 underflow to 0.
        pytest.param(
            [NAN, INF, -INF, 1.0, -NAN, 2.0**100], 254, [0x7F, 0x7E, 0xFE, 0x00, 0x7F, 0x00], id="inf_nan_block"
        ),
        # NaN-only block: A = 0 -> e = 0; NaN -> 0x7F.
        pytest.param([NAN, -NAN], 0, [0x7F, 0x7F], id="nan_only_block"),
        # Subnormal inputs: A = 2^-130. ceil: t = RN(2^-130·fl(1/448)) < 2^-127 -> 0; floor:
        # -130 - 8 + 127 < 0 -> 0. P(0) = 2^127: 2^-3 -> 0x20; -2^-6 (min normal) -> 0x88; 2^-22 -> 0.
        pytest.param([2.0**-130, -(2.0**-133), 2.0**-149], 0, [0x20, 0x88, 0x00], id="subnormal_block"),
        # All-max block: A = 448, t = RN(448·fl(1/448)) = 1.0 -> 127 (floor: 8 - 8 + 127): ±max.
        pytest.param([448.0] * 16 + [-448.0] * 16, 127, [0x7E] * 16 + [0xFE] * 16, id="all_max_block"),
    ],
)
def test_special_value_corpus(vals, e, expected, rule):
    for tile in ((1, 32), (32, 32)):
        q = quant(block_row(vals), e8m0_rule=rule, tile=tile)
        assert q.rowwise_scale[0, 0].item() == e, tile
        assert q.rowwise_data[0, : len(vals)].tolist() == expected, tile


def test_e5m2_all_max_block():
    # t = RN(57344·fl(1/57344)) = 1.0 -> 127 (floor 15 - 15 + 127); 57344: 0x7B.
    q = quant(block_row([57344.0] * 32), element="e5m2")
    assert q.rowwise_scale[0, 0].item() == 127 and q.rowwise_data[0].tolist() == [0x7B] * 32


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, dim", [((48, 64), "M=48"), ((64, 40), "K=40"), ((3, 16, 64), "M=48")])
def test_not_multiple_of_32_raises(shape, dim):
    with pytest.raises(SpecViolation, match=dim):
        reference.quantize(torch.zeros(shape), QuantConfig("mxfp8"))
    x2d = torch.zeros(shape).reshape(-1, shape[-1])
    with pytest.raises(SpecViolation, match=dim):
        mxfp8.quantize_2d(x2d, QuantConfig("mxfp8"), rowwise=True, colwise=True)


# ---- independent oracle ----------------------------------------------------------------------


def ceil_log2(r: Fraction) -> int:
    """Smallest n with 2^n >= r, exactly."""
    n = r.numerator.bit_length() - r.denominator.bit_length()
    while Fraction(2) ** n < r:
        n += 1
    while Fraction(2) ** (n - 1) >= r:
        n -= 1
    return n


def oracle_exponent(blk: np.ndarray, element: str, rule: str) -> int:
    a = np.abs(blk[~np.isnan(blk)])
    a = float(a.max()) if a.size else 0.0
    if a == 0.0:
        return 0
    if math.isinf(a):
        return 254
    fmt = FMT[element]
    if rule == "ceil":
        n = ceil_log2(Fraction(a) / Fraction(fmt.max_finite))
    else:
        n = (math.frexp(a)[1] - 1) - (math.frexp(fmt.max_finite)[1] - 1)
    return min(max(0, n + 127), 254)


def oracle_mxfp8(xs: np.ndarray, element, rule, two_d):
    """(rowwise codes, S_r valid [M, K/32], colwise codes, S_c valid [M/32, K]) by a loop over blocks."""
    m, k = xs.shape
    d_r, d_c = np.zeros((m, k), np.uint8), np.zeros((m, k), np.uint8)
    s_r, s_c = np.zeros((m, k // B), np.uint8), np.zeros((m // B, k), np.uint8)

    def put(dst, scale, sl, ssl, blk):
        e = oracle_exponent(blk, element, rule)
        dst[sl] = oracle_codes(blk * np.float32(2.0 ** (127 - e)), element)
        scale[ssl] = e

    for i in range(m // B):
        for j in range(k // B):
            if two_d:
                sl = np.s_[i * B : (i + 1) * B, j * B : (j + 1) * B]
                put(d_r, s_r, sl, np.s_[i * B : (i + 1) * B, j], xs[sl])
                put(d_c, s_c, sl, np.s_[i, j * B : (j + 1) * B], xs[sl])
                continue
            for t in range(B):
                sl = np.s_[i * B + t, j * B : (j + 1) * B]
                put(d_r, s_r, sl, np.s_[i * B + t, j], xs[sl])
                sl = np.s_[i * B : (i + 1) * B, j * B + t]
                put(d_c, s_c, sl, np.s_[i, j * B + t], xs[sl])
    return d_r, s_r, d_c, s_c


def random_input(seed: int, shape, dtype) -> torch.Tensor:
    """Per-row magnitudes from fp32-subnormal to huge, per-column spread, zeros, NaN, a few inf."""
    return wide_range_input(seed, shape, dtype, row_exp=(-150, 120), row_exp_f16=(-24, 14), col_exp=(-4, 5),
                            inf_frac=0.002)


CASES = [
    # (shape, dtype, element, rule, tile)
    ((64, 96), torch.float32, "e4m3", "ceil", (1, 32)),
    ((64, 96), torch.bfloat16, "e4m3", "floor", (1, 32)),
    ((96, 64), torch.float32, "e5m2", "ceil", (1, 32)),
    ((32, 128), torch.float16, "e5m2", "floor", (1, 32)),
    ((64, 96), torch.bfloat16, "e4m3", "ceil", (32, 32)),
    ((96, 64), torch.float32, "e5m2", "floor", (32, 32)),
    ((32, 32), torch.float16, "e4m3", "floor", (32, 32)),
]


def _id(c):
    return f"{c[0][0]}x{c[0][1]}-{str(c[1])[6:]}-{c[2]}-{c[3]}-{c[4][0]}x{c[4][1]}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_matches_oracle(case):
    shape, dtype, element, rule, tile = case
    x = random_input(sum(map(ord, _id(case))), shape, dtype)
    q = quant(x, element=element, e8m0_rule=rule, tile=tile)
    xs = x.float().numpy()
    m, k = shape
    d_r, s_r, d_c, s_c = oracle_mxfp8(xs, element, rule, tile == (32, 32))
    assert np.array_equal(q.rowwise_data.numpy(), d_r)
    assert np.array_equal(q.colwise_data.numpy(), d_c)
    exp_r = np.zeros((-(-m // 128) * 128, -(-(k // B) // 4) * 4), np.uint8)
    exp_r[:m, : k // B] = s_r
    exp_c = np.zeros((-(-(m // B) // 4) * 4, -(-k // 128) * 128), np.uint8)
    exp_c[: m // B, :k] = s_c
    assert np.array_equal(q.rowwise_scale.numpy(), exp_r)
    assert np.array_equal(q.colwise_scale.numpy(), exp_c)
    # Dequantization RN_out(RN(D(e)·dec(q))).
    d_row = np.repeat((2.0 ** (s_r.astype(np.float64) - 127)).astype(np.float32), B, axis=1)
    d_col = np.repeat((2.0 ** (s_c.astype(np.float64) - 127)).astype(np.float32), B, axis=0)
    for out_dtype, ml_out in ((torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16)):
        for o, d, codes in (("rowwise", d_row, d_r), ("colwise", d_col, d_c)):
            with np.errstate(over="ignore"):  # D(254)·448 overflows to inf, as RN does
                ref = (d * codes.view(ML[element]).astype(np.float32)).astype(ml_out).astype(np.float32)
            got = reference.dequantize(q, o, out_dtype)
            assert got.dtype == out_dtype and got.shape == shape
            assert np.array_equal(got.float().numpy(), ref, equal_nan=True), (o, out_dtype)


def test_rules_differ_only_above_1_75():
    # docs/numerics.md §3: ceil and floor agree whenever the significand of A is <= 1.75; above, ceil is
    # one higher. One block per significand step 2^-10 of the binade [32, 64): A = sig·2^5,
    # floor = 5 - 8 + 127 = 124 for all, ceil = 124 for sig <= 1.75 and 125 above.
    sig = 1.0 + np.arange(0, 2**10) / 2**10  # (1024,)
    x = torch.zeros(1024, 32)
    x[:, 0] = torch.from_numpy((sig * 2.0**5).astype(np.float32))
    ec = quant(x).rowwise_scale[:1024, 0].to(torch.int64)
    ef = quant(x, e8m0_rule="floor").rowwise_scale[:1024, 0].to(torch.int64)
    assert bool((ef == 124).all())
    assert torch.equal(ec - ef, torch.from_numpy(sig > 1.75).to(torch.int64))


def test_2d_tile_shared_by_both_copies():
    x = random_input(3, (64, 96), torch.bfloat16)
    q = quant(x, tile=(32, 32))
    assert torch.equal(q.rowwise_data, q.colwise_data)
    e_r = q.rowwise_scale[:64, :3]  # (M, K/32): constant over the 32 rows of a tile
    e_c = q.colwise_scale[:2, :96]  # (M/32, K): constant over the 32 columns of a tile
    tiles = e_r[::32]  # (M/32, K/32)
    assert torch.equal(e_r, tiles.repeat_interleave(32, dim=0))
    assert torch.equal(e_c, tiles.repeat_interleave(32, dim=1))


def test_colwise_is_rowwise_of_transpose_transposed():
    # The 32x1 colwise blocks of x are the 1x32 rowwise blocks of x^T (same bytes, transposed).
    x = random_input(4, (64, 96), torch.float32)
    q = quant(x)
    qt = reference.quantize(x.T.contiguous(), QuantConfig("mxfp8"))
    assert torch.equal(q.colwise_data, qt.rowwise_data.T)
    assert torch.equal(q.colwise_scale[:2, :96], qt.rowwise_scale[:96, :2].T)


def test_chunked_rows_match_small_chunks(monkeypatch):
    x = random_input(6, (320, 96), torch.bfloat16)
    full, full2d = quant(x), quant(x, tile=(32, 32))
    monkeypatch.setattr(mxfp8, "CHUNK_ELEMENTS", 1)  # one 32-row block per chunk
    small, small2d = quant(x), quant(x, tile=(32, 32))
    for a, b in ((full, small), (full2d, small2d)):
        for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f
