"""NVFP4 golden reference (reference/nvfp4.py): docs/numerics.md §5 and its §8 rows, special values,
layouts, 2-D transposition, dequantization, GEMM alpha, bad input, and an independent slow oracle.

Expected bytes come from docs/numerics.md §8, from hand derivations written next to each case, and from
a per-block Python oracle (numpy fp32 scalar arithmetic for the scale chain, exact Fractions for
the E2M1 rounding, ml_dtypes for the E4M3 cast, plain-Python Philox and RHT).
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import QuantConfig, SpecViolation, casts, dequantize, fp32, nvfp4, quantize
from reference.formats import E2M1, E4M3
from tests.unit.test_hadamard import rht_oracle
from tests.unit.test_philox import sr_words_py
from tests.unit.test_stochastic import sr_oracle

RN1 = QuantConfig("nvfp4")
RN2 = QuantConfig("nvfp4", tile=(16, 16))
SR = QuantConfig("nvfp4", stochastic=True)
RHT = QuantConfig("nvfp4", rht=True)
RHT_SR = QuantConfig("nvfp4", rht=True, stochastic=True)

FLT_MAX = float(np.finfo(np.float32).max)
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


def bits(v) -> int:
    return int(np.array(v, dtype=np.float32).view(np.uint32))


def from_bits(b: int) -> float:
    return float(np.array(b, dtype=np.uint32).view(np.float32))


NEG_NAN = from_bits(0xFFC00000)


# ---- the independent oracle -------------------------------------------------------------------

GRID = [Fraction(v) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]


def rn_oracle(y: np.float32) -> int:
    """e2m1_rn by exact Fractions: nearest grid value, ties to the even code, saturating; NaN -> 0x7."""
    if np.isnan(y):
        return 0x7
    sign = 0x8 if np.signbit(y) else 0
    if np.isinf(y) or abs(float(y)) >= 6:
        return 0x7 | sign
    a = Fraction(float(abs(y)))
    for i in range(7):
        lo, hi = GRID[i], GRID[i + 1]
        if lo <= a < hi:
            if a - lo != hi - a:
                return (i if a - lo < hi - a else i + 1) | sign
            return (i if i % 2 == 0 else i + 1) | sign
    raise AssertionError(y)


def oracle_copy(src: np.ndarray, tile_rows: int, a_g: np.float32, stream: int | None, seed: int):
    """(packed data, scale bytes [rows, cols/16]) of one copy of `src` (float32 values [rows, cols])."""
    f32 = np.float32
    rows, cols = src.shape
    codes = np.zeros((rows, cols), dtype=np.uint8)
    scales = np.zeros((rows, cols // 16), dtype=np.uint8)
    with np.errstate(all="ignore"):
        s_enc = f32(2688) / f32(a_g)
        if np.isnan(s_enc) or s_enc > f32(FLT_MAX):  # fmin(., FLT_MAX): NaN and inf give FLT_MAX
            s_enc = f32(FLT_MAX)
        if a_g == 0 or s_enc == 0:
            s_enc = f32(1)
        s_dec = f32(1) / s_enc
        m = s_enc * (f32(1) / f32(6))
        words_cache: dict[int, tuple[int, int, int, int]] = {}
        for r in range(rows):
            for c in range(cols // 16):
                r0 = r - r % tile_rows
                tile = src[r0 : r0 + tile_rows, 16 * c : 16 * c + 16].ravel()
                a_b = f32(max([abs(float(v)) for v in tile if not np.isnan(v)], default=0.0))
                d = min(a_b * m, f32(FLT_MAX))
                s = np.array(min(d, f32(448)), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
                scales[r, c] = s.view(np.uint8)
                if scales[r, c] == 0:
                    f = f32(FLT_MAX)
                else:
                    f = min(f32(1) / (f32(s.astype(np.float32)) * s_dec), f32(FLT_MAX))
                for j in range(16):
                    y = f32(src[r, 16 * c + j]) * f
                    if stream is None:
                        codes[r, 16 * c + j] = rn_oracle(y)
                    else:
                        L = r * cols + 16 * c + j  # §5.7: group L // 16, word (L % 16) // 4, byte L % 4
                        if L // 16 not in words_cache:
                            words_cache[L // 16] = sr_words_py(L // 16, seed, stream)
                        rb = (words_cache[L // 16][(L % 16) // 4] >> (8 * (L % 4))) & 0xFF
                        codes[r, 16 * c + j] = sr_oracle(float(y), rb)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, scales


def nan_amax(v: np.ndarray) -> np.float32:
    a = np.abs(v[~np.isnan(v)])
    return np.float32(a.max() if a.size else 0.0)


def oracle_quantize(x: torch.Tensor, config: QuantConfig, seed: int = 0, stream: int = 0) -> dict:
    xv = x.to(torch.float32).numpy()
    tile_rows = config.tile[0]
    sr = config.stochastic
    out = {}
    a = nan_amax(xv)
    out["rowwise"] = oracle_copy(xv, tile_rows, a, stream if sr else None, seed) + (a,)
    src = rht_oracle(x) if config.rht else np.ascontiguousarray(xv.T)
    a_c = nan_amax(src)
    out["colwise"] = oracle_copy(src, tile_rows, a_c, (stream + 1) if sr else None, seed) + (a_c,)
    return out


def special_input(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(2 * torch.randn(m, k, generator=g))
    flat = x.view(-1)
    picks = torch.randperm(m * k, generator=g)[:12]
    specials = [0.0, -0.0, math.nan, NEG_NAN, 1e-40, -3e-42, 2.0**-133, 1e-30, 5.0, -7.0, 0.0, -0.0]
    for p, v in zip(picks.tolist(), specials, strict=True):
        flat[p] = v
    x[:16, 16:32] = 0.0  # an all-zero block / tile
    x[16:32, :16] = -2.5  # a block where every element is the maximum
    return x.to(dtype)


ORACLE_CASES = [
    pytest.param(RN1, torch.float32, (32, 64), id="1x16-rn-fp32"),
    pytest.param(RN1, torch.bfloat16, (48, 32), id="1x16-rn-bf16"),
    pytest.param(RN1, torch.float16, (32, 32), id="1x16-rn-fp16"),
    pytest.param(RN2, torch.float32, (32, 64), id="16x16-rn-fp32"),
    pytest.param(RN2, torch.bfloat16, (48, 32), id="16x16-rn-bf16"),
    pytest.param(SR, torch.float32, (32, 48), id="1x16-sr-fp32"),
    pytest.param(RHT, torch.bfloat16, (32, 48), id="1x16-rht-bf16"),
    pytest.param(RHT_SR, torch.bfloat16, (48, 32), id="1x16-rht-sr-bf16"),
]


@pytest.mark.parametrize("config,dtype,shape", ORACLE_CASES)
@pytest.mark.parametrize("specials", [False, True], ids=["plain", "specials"])
def test_matches_independent_oracle(config, dtype, shape, specials):
    m, k = shape
    if specials:
        x = special_input(m, k, dtype, seed=m + k)
    else:
        g = torch.Generator().manual_seed(m * k)
        x = (torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))).to(dtype)
    seed, stream = 2**40 + 17, 6
    q = quantize(x, config, rowwise=True, colwise=True, rng=(seed, stream))
    want = oracle_quantize(x, config, seed, stream)
    for o in ("rowwise", "colwise"):
        data, scales, a_g = want[o]
        np.testing.assert_array_equal(getattr(q, f"{o}_data").numpy(), data, err_msg=f"{o} data")
        sc = getattr(q, f"{o}_scale")
        np.testing.assert_array_equal(sc[: scales.shape[0], : scales.shape[1]].numpy(), scales, err_msg=f"{o} scale")
        assert int(sc.sum()) == int(scales.astype(np.int64).sum()), f"{o} scale padding must be 0"
        amax = getattr(q, f"{o}_amax")
        assert amax.dtype == torch.float32 and amax.shape == (1,)
        assert bits(amax.item()) == bits(a_g)


# ---- docs/numerics.md §8 rows ------------------------------------------------------------------------


def test_global_scale_rows():
    """§8: A_g = 0, +inf, NaN, 1e-40, 21504, 2688, 1 -> S_enc 1, 1, FLT_MAX, FLT_MAX, 0.125, 1, 2688."""
    a_g = torch.tensor([0.0, math.inf, math.nan, 1e-40, 21504.0, 2688.0, 1.0])
    s_enc, s_dec = nvfp4.global_scale(a_g)
    assert s_enc.tolist() == [1.0, 1.0, FLT_MAX, FLT_MAX, 0.125, 1.0, 2688.0]
    assert s_dec[4].item() == 8.0
    assert fp32.bits(s_dec[2]).item() == 0x00200000  # RN(1/FLT_MAX), subnormal


def test_constants():
    assert bits(nvfp4.INV_E2M1_MAX) == 0x3E2AAAAB
    assert bits(nvfp4.INV_GLOBAL_RANGE) == 0x39C30C31
    assert bits(nvfp4.INV_ALPHA_RANGE) == 0x34149B93
    assert nvfp4.GLOBAL_RANGE == 2688.0


def _with_ag(block_rows: dict[int, list[float]], a_g: float, m: int = 16, k: int = 32) -> torch.Tensor:
    """[m, k] fp32 with the given 16-element rows in block 0 and A_g placed at [m-1, k-1]."""
    x = torch.zeros(m, k)
    for r, vals in block_rows.items():
        x[r, :16] = torch.tensor(vals + [0.0] * (16 - len(vals)))
    x[m - 1, k - 1] = a_g
    return x


def _bytes(q, row: int, orientation: str = "rowwise", n: int = 8) -> list[int]:
    return getattr(q, f"{orientation}_data")[row, :n].tolist()


def test_row_ag_21504_single_max():
    """§8: block [21504, 0x15]: d = 448 -> 0x7E, y0 = 6.0000005 -> code 7, bytes 07 00 ..."""
    x = _with_ag({0: [21504.0]}, 21504.0)
    q = quantize(x, RN1)
    assert q.rowwise_scale[0, 0].item() == 0x7E
    assert _bytes(q, 0) == [0x07] + [0] * 7
    chain = nvfp4.scale_chain(x, RN1, "rowwise")
    assert chain["S_enc"].item() == 0.125 and chain["S_dec"].item() == 8.0
    assert chain["d"][0, 0].item() == 448.0
    y0 = (x[0, 0] * chain["f"][0, 0]).item()
    assert bits(y0) == bits(np.float32(6.0000005))


def test_row_ag_21504_mixed_block():
    """§8: [96, 8, 4, 12, 20, 28, 40, 56, 80, -0, -1, -96, 0x4] -> 0x40, f = 1/16, bytes 17 20 42 64 86 F8 00 00."""
    x = _with_ag({0: [96, 8, 4, 12, 20, 28, 40, 56, 80, -0.0, -1, -96]}, 21504.0)
    q = quantize(x, RN1)
    assert q.rowwise_scale[0, 0].item() == 0x40
    assert _bytes(q, 0) == [0x17, 0x20, 0x42, 0x64, 0x86, 0xF8, 0x00, 0x00]
    assert nvfp4.scale_chain(x, RN1, "rowwise")["f"][0, 0].item() == 1 / 16


def test_row_1d_vs_2d():
    """§8: row [8, 1, 0...] alone (1-D): d = 0.16666667 -> 0x23, f = 0.72727275, codes 7, 1;
    inside a 16x16 tile with amax 96 (2-D): 0x40, codes 1, 0."""
    x = _with_ag({0: [8.0, 1.0], 5: [0.0, 0.0, 96.0]}, 21504.0)
    q1 = quantize(x, RN1)
    c1 = nvfp4.scale_chain(x, RN1, "rowwise")
    assert bits(c1["d"][0, 0].item()) == bits(np.float32(0.16666667))
    assert q1.rowwise_scale[0, 0].item() == 0x23
    assert bits(c1["f"][0, 0].item()) == bits(np.float32(0.72727275))
    assert _bytes(q1, 0, n=1) == [0x17]
    q2 = quantize(x, RN2)
    assert q2.rowwise_scale[0, 0].item() == 0x40
    assert q2.rowwise_scale[:16, 0].tolist() == [0x40] * 16  # stored per row
    assert _bytes(q2, 0, n=1) == [0x01]


def test_row_ag_1():
    """§8: A_g = 1, block [1, 0.5, -0.3, 0.1, 0...]: S_enc 2688, m = 448, 0x7E, f = 6.0, codes 7, 5, C, 1."""
    x = torch.zeros(16, 16)
    x[0, :4] = torch.tensor([1.0, 0.5, -0.3, 0.1])
    q = quantize(x, RN1)
    chain = nvfp4.scale_chain(x, RN1, "rowwise")
    assert chain["S_enc"].item() == 2688.0 and chain["m"].item() == 448.0
    assert q.rowwise_scale[0, 0].item() == 0x7E
    assert chain["f"][0, 0].item() == 6.0
    assert _bytes(q, 0, n=3) == [0x57, 0x1C, 0x00]


def test_block_multiplier_is_a_multiply_by_fl_one_sixth():
    """§5.2: m = RN(S_enc * fl(1/6)), not RN(S_enc / 6). A_g = 0x43264284: S_enc = 16.167465, m = 2.6945777
    (division: 2.6945775). A_b = 0x3F61A369: d = RN(A_b m) = 2.375 exactly, an E4M3 tie -> even 2.5 (0x42);
    with the division, d = 2.3749998 -> 2.25 (0x41)."""
    a_g, a_b = from_bits(0x43264284), from_bits(0x3F61A369)
    s_enc = np.float32(2688) / np.float32(a_g)
    assert s_enc * (np.float32(1) / np.float32(6)) != s_enc / np.float32(6)  # the case discriminates
    x = _with_ag({0: [a_b]}, a_g)
    chain = nvfp4.scale_chain(x, RN1, "rowwise")
    assert bits(chain["m"].item()) == bits(s_enc * (np.float32(1) / np.float32(6)))
    assert chain["d"][0, 0].item() == 2.375
    assert quantize(x, RN1).rowwise_scale[0, 0].item() == 0x42


def test_row_underflow():
    """§8: A_g = 1e6, block [1e-3, -1e-3, 5e-4, 0...]: d = 4.48e-7 -> 0x00, f = FLT_MAX, codes 7, F, 7, 0."""
    x = _with_ag({0: [1e-3, -1e-3, 5e-4]}, 1e6)
    q = quantize(x, RN1)
    chain = nvfp4.scale_chain(x, RN1, "rowwise")
    assert chain["d"][0, 0].item() == pytest.approx(4.48e-7, rel=1e-5)
    assert q.rowwise_scale[0, 0].item() == 0x00
    assert chain["f"][0, 0].item() == FLT_MAX
    assert _bytes(q, 0, n=3) == [0xF7, 0x07, 0x00]


def test_row_dequant_and_alpha():
    """§8: s_blk 2.0, A_g 21504 -> g = 16.0; alpha(2688, 2688) = 1.0, alpha(21504, 21504) = 64.0."""
    g = nvfp4.decode_factor(torch.tensor([0x40], dtype=torch.uint8), torch.tensor([21504.0]))
    assert g.item() == 16.0
    alpha = nvfp4.gemm_alpha(torch.tensor([2688.0, 21504.0]), torch.tensor([2688.0, 21504.0]))
    assert alpha.dtype == torch.float32 and alpha.tolist() == [1.0, 64.0]


def test_row_decode_is_not_the_inverse():
    """§8: A_g = 0x443D687C: S_dec = 0x3E904F9B, but RN(A_g * fl(1/2688)) = 0x3E904F9C."""
    a_g = torch.tensor([from_bits(0x443D687C)])
    _, s_dec = nvfp4.global_scale(a_g)
    assert bits(s_dec.item()) == 0x3E904F9B
    one = torch.tensor([0x38], dtype=torch.uint8)  # E4M3 1.0
    assert bits(nvfp4.decode_factor(one, a_g).item()) == 0x3E904F9C


def test_layouts_32x64():
    """§8 layouts: NVFP4 x [32, 64] -> data [32, 32] and [64, 16], scales [128, 4] and [128, 4]."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    q = quantize(x, RN1, rowwise=True, colwise=True)
    assert q.rowwise_data.shape == (32, 32) and q.colwise_data.shape == (64, 16)
    assert q.rowwise_scale.shape == (128, 4) and q.colwise_scale.shape == (128, 4)
    assert q.rowwise_data.dtype == q.rowwise_scale.dtype == torch.uint8
    assert (q.rowwise_scale[32:] == 0).all() and (q.colwise_scale[64:] == 0).all()
    assert torch.equal(q.rowwise_amax, q.colwise_amax)  # shared A_g without RHT


def test_layouts_padding_columns():
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    q = quantize(x, RN1, rowwise=True, colwise=True)
    assert q.rowwise_scale.shape == (128, 4) and (q.rowwise_scale[:, 2:] == 0).all()
    assert q.colwise_scale.shape == (128, 4) and (q.colwise_scale[:, 1:] == 0).all()


# ---- special values (hand-derived bytes) ---------------------------------------------------------


def test_special_zero_block():
    """All-zero block: A_b = 0 -> d = 0 -> s_blk 0x00, f = FLT_MAX, y = 0 -> codes 0."""
    x = _with_ag({}, 21504.0)
    q = quantize(x, RN1, rowwise=True, colwise=True)
    assert q.rowwise_scale[0, 0].item() == 0 and _bytes(q, 0) == [0] * 8
    assert q.colwise_scale[0, 0].item() == 0 and _bytes(q, 0, "colwise") == [0] * 8


def test_special_negative_zero():
    """-0.0 * FLT_MAX = -0.0 -> code 0x8 (sign copied); +0 -> 0x0. Block [-0, +0, -0, -0] -> 08 88."""
    x = _with_ag({0: [-0.0, 0.0, -0.0, -0.0]}, 21504.0)
    q = quantize(x, RN1)
    assert q.rowwise_scale[0, 0].item() == 0
    assert _bytes(q, 0, n=3) == [0x08, 0x88, 0x00]


def test_special_nan():
    """NaN is ignored by amax and encodes 0x7 for either sign: [NaN, 96, -NaN, 0] with A_g 21504 -> 0x40; 77 07."""
    x = _with_ag({0: [math.nan, 96.0, NEG_NAN, 0.0]}, 21504.0)
    assert math.isnan(x[0, 2].item()) and fp32.bits(x[0, 2]).item() < 0
    q = quantize(x, RN1)
    assert q.rowwise_amax.item() == 21504.0
    assert q.rowwise_scale[0, 0].item() == 0x40
    assert _bytes(q, 0, n=3) == [0x77, 0x07, 0x00]


def test_special_infinities():
    """A_g = +inf -> S_enc = S_dec = 1, m = fl(1/6). Block [inf, -inf, 1]: A_b inf -> d FLT_MAX -> 0x7E,
    f = fl(1/448), codes 7, F, 0 -> F7 00. Block [6, 3]: d = RN(6 fl(1/6)) = 1.0 -> 0x38, f = 1, codes 7, 5 -> 57."""
    x = torch.zeros(16, 32)
    x[0, :3] = torch.tensor([math.inf, -math.inf, 1.0])
    x[0, 16:18] = torch.tensor([6.0, 3.0])
    q = quantize(x, RN1)
    chain = nvfp4.scale_chain(x, RN1, "rowwise")
    assert chain["A_g"].item() == math.inf and chain["S_enc"].item() == 1.0 and chain["S_dec"].item() == 1.0
    assert q.rowwise_scale[0, :2].tolist() == [0x7E, 0x38]
    assert bits(chain["f"][0, 0].item()) == 0x3B124925
    assert _bytes(q, 0) == [0xF7, 0x00, 0, 0, 0, 0, 0, 0] and q.rowwise_data[0, 8].item() == 0x57


def test_special_subnormal_inputs():
    """A_g = 2688 -> S_enc 1. Block [2^-129, -2^-133]: d underflows -> 0x00, f = FLT_MAX = (2 - 2^-23) 2^127,
    y0 = (2 - 2^-23) 2^-2 = 0.49999997 -> 1, y1 = -(2 - 2^-23) 2^-6 ~ -0.03125 -> 0x8: byte 0x81."""
    x = _with_ag({0: [2.0**-129, -(2.0**-133)], 1: [2688.0]}, 2688.0)
    assert x[0, 0].item() == 2.0**-129  # fp32 subnormal kept
    q = quantize(x, RN1)
    assert q.rowwise_scale[0, 0].item() == 0x00 and _bytes(q, 0, n=2) == [0x81, 0x00]
    assert q.rowwise_scale[1, 0].item() == 0x7E and _bytes(q, 1, n=1) == [0x07]
    # the same through bf16 (2^-129, 2^-133 are bf16 subnormals)
    qb = quantize(x.to(torch.bfloat16), RN1)
    assert torch.equal(qb.rowwise_data, q.rowwise_data) and torch.equal(qb.rowwise_scale, q.rowwise_scale)


def test_special_global_scale_overflow():
    """A_g = fp32(1e-40): 2688/A_g overflows -> S_enc = FLT_MAX, S_dec = 2^-128 (0x00200000).
    Block [1e-40, -1e-40]: d = 5.67e-3 -> E4M3 subnormal 3*2^-9 (0x03); f = RN(2^137/3) overflows -> FLT_MAX;
    y = +-0.034 -> codes 0, 8: byte 0x80."""
    x = torch.zeros(16, 16)
    x[0, :2] = torch.tensor([1e-40, -1e-40])
    q = quantize(x, RN1)
    chain = nvfp4.scale_chain(x, RN1, "rowwise")
    assert chain["S_enc"].item() == FLT_MAX
    assert fp32.bits(chain["S_dec"]).item() == 0x00200000
    assert q.rowwise_scale[0, 0].item() == 0x03
    assert chain["f"][0, 0].item() == FLT_MAX
    assert _bytes(q, 0, n=2) == [0x80, 0x00]


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["pos", "neg"])
@pytest.mark.parametrize("dtype,vmax", [(torch.bfloat16, BF16_MAX), (torch.float32, FLT_MAX)], ids=["bf16", "fp32"])
def test_special_all_max_block(sign, dtype, vmax):
    """Every element = the dtype's max: A_b = A_g, d ~ 448 -> 0x7E, y ~ 6 -> code 7 (0xF negative)."""
    x = torch.full((16, 16), sign * vmax, dtype=dtype)
    q = quantize(x, RN1, rowwise=True, colwise=True)
    byte = 0x77 if sign > 0 else 0xFF
    for o in ("rowwise", "colwise"):
        assert (getattr(q, f"{o}_data") == byte).all()
        assert getattr(q, f"{o}_scale")[:16, 0].tolist() == [0x7E] * 16


# ---- structure ---------------------------------------------------------------------------------


def test_2d_colwise_is_exact_transpose_of_rowwise():
    x = special_input(48, 64, torch.float32, seed=9)
    q = quantize(x, RN2, rowwise=True, colwise=True)
    row_codes = casts.unpack_nibbles(q.rowwise_data)  # (M, K)
    col_codes = casts.unpack_nibbles(q.colwise_data)  # (K, M)
    assert torch.equal(col_codes, row_codes.t())
    row_s = q.rowwise_scale[:48, :4].repeat_interleave(16, dim=1)  # (M, K) per-element scale
    col_s = q.colwise_scale[:64, :3].repeat_interleave(16, dim=1)  # (K, M)
    assert torch.equal(col_s, row_s.t())
    assert torch.equal(dequantize(q, "colwise"), dequantize(q, "rowwise"))


def test_1d_colwise_is_rowwise_of_transpose():
    x = special_input(32, 48, torch.bfloat16, seed=3)
    q = quantize(x, RN1, rowwise=False, colwise=True)
    qt = quantize(x.t().contiguous(), RN1, rowwise=True)
    assert torch.equal(q.colwise_data, qt.rowwise_data) and torch.equal(q.colwise_scale, qt.rowwise_scale)


def test_rht_only_on_colwise_and_post_rht_amax():
    x = special_input(32, 32, torch.bfloat16, seed=5)
    q = quantize(x, RHT, rowwise=True, colwise=True)
    plain = quantize(x, RN1, rowwise=True)
    assert torch.equal(q.rowwise_data, plain.rowwise_data) and torch.equal(q.rowwise_amax, plain.rowwise_amax)
    h = rht_oracle(x)
    assert bits(q.colwise_amax.item()) == bits(nan_amax(h))


def test_chunking_does_not_change_bytes(monkeypatch):
    x = special_input(64, 48, torch.bfloat16, seed=8)
    for cfg in (RN1, RN2, RHT_SR):
        a = quantize(x, cfg, rowwise=True, colwise=True, rng=(3, 4))
        monkeypatch.setattr(nvfp4, "CHUNK_ELEMS", 16 * 48)  # one 16-row group per chunk
        b = quantize(x, cfg, rowwise=True, colwise=True, rng=(3, 4))
        monkeypatch.undo()
        for f in a.TENSOR_FIELDS:
            assert torch.equal(getattr(a, f), getattr(b, f)), (cfg.id, f)


def test_leading_dims_flatten():
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    q = quantize(x, RN1)
    q2 = quantize(x.reshape(32, 32), RN1)
    assert q.shape == (2, 16, 32) and torch.equal(q.rowwise_data, q2.rowwise_data)


@pytest.mark.parametrize("orientation", ["rowwise", "colwise"])
@pytest.mark.parametrize("config", [RN1, RN2, RHT], ids=["1x16", "16x16", "rht"])
def test_scale_chain_matches_quantize(config, orientation):
    x = special_input(32, 48, torch.bfloat16, seed=4)
    q = quantize(x, config, rowwise=True, colwise=True)
    chain = nvfp4.scale_chain(x, config, orientation)
    s = getattr(q, f"{orientation}_scale")
    rows, nb = chain["s_blk"].shape
    assert torch.equal(s[:rows, :nb], chain["s_blk"])
    assert bits(chain["A_g"].item()) == bits(getattr(q, f"{orientation}_amax").item())
    src = chain["source"].to(torch.float32).reshape(rows, nb, 16)
    codes = nvfp4.e2m1_rn(src * chain["f"][..., None]).reshape(rows, nb * 16)
    assert torch.equal(casts.pack_nibbles(codes), getattr(q, f"{orientation}_data"))


# ---- e2m1_rn (fast threshold path) against the generic cast --------------------------------------


def test_e2m1_rn_table_rows():
    """§8 e2m1_rn rows."""
    v = [0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, -0.25, -0.0, -1e-45, math.nan, NEG_NAN]
    v += [math.inf, -math.inf, -5.0]
    want = [0x0, 0x1, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x7, 0x8, 0x8, 0x8, 0x7, 0x7, 0x7, 0xF, 0xE]
    assert nvfp4.e2m1_rn(torch.tensor(v, dtype=torch.float32)).tolist() == want


def _bit_corpus() -> torch.Tensor:
    thr = [bits(t) for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1, 1.5, 2, 3, 4, 6, 8)]
    b = [torch.arange(t - 3000, t + 3000, dtype=torch.int64) for t in thr]
    b.append(torch.arange(0, 1 << 32, 65537, dtype=torch.int64))  # every exponent, sign and NaN/inf region
    b.append(torch.tensor([0, 1, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7F7FFFFF, 0x00800000], dtype=torch.int64))
    allb = torch.cat(b)
    allb = torch.cat([allb, allb | (1 << 31)]) & 0xFFFFFFFF
    allb = torch.where(allb >= 1 << 31, allb - (1 << 32), allb).to(torch.int32)
    return allb.view(torch.float32)


def test_e2m1_rn_equals_generic_saturating_cast():
    y = _bit_corpus()
    assert torch.equal(nvfp4.e2m1_rn(y), casts.saturating_cast(y, E2M1))


def test_e2m1_rn_equals_ml_dtypes_off_nan():
    y = _bit_corpus()
    y = y[~torch.isnan(y)]
    want = y.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    np.testing.assert_array_equal(nvfp4.e2m1_rn(y).numpy(), want)


def threshold_codes(y: torch.Tensor) -> torch.Tensor:
    """The §0.5 table read directly: magnitude code = number of thresholds <= |y| on the fp32 magnitude bits
    (NaN's bits exceed all: 7), sign bit copied from every non-NaN value."""
    mag = fp32.bits(y).to(torch.int64) & 0x7FFFFFFF
    code = torch.zeros(y.shape, dtype=torch.uint8)
    for t in fp32.bits(nvfp4.e2m1_thresholds()).tolist():
        code += mag >= t
    neg = torch.signbit(y) & ~torch.isnan(y)
    return code | (neg.to(torch.uint8) << 3)


def test_e2m1_rn_equals_threshold_table():
    """The magic-number rounding of e2m1_rn against the threshold table of §0.5 (checked once on all 2^32 patterns)."""
    y = _bit_corpus()
    # Every pattern whose magnitude lies in the binades around E2M1's ([2^-3, 2^4)), in steps of 509 ulps.
    near = torch.arange(bits(0.125), bits(16.0), 509, dtype=torch.int32)
    y = torch.cat([y, near.view(torch.float32), (near | (-(1 << 31))).view(torch.float32)])
    assert torch.equal(nvfp4.e2m1_rn(y), threshold_codes(y))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=64))
def test_e2m1_rn_on_any_bit_pattern(patterns):
    y = torch.tensor(patterns, dtype=torch.int32).view(torch.float32)
    before = y.clone()
    assert torch.equal(nvfp4.e2m1_rn(y), threshold_codes(y))
    assert torch.equal(nvfp4.e2m1_rn(y), casts.saturating_cast(y, E2M1))
    assert torch.equal(y.view(torch.int32), before.view(torch.int32))  # the input is not scratch


def test_pack_pairs_equals_pack_nibbles():
    codes = torch.cartesian_prod(torch.arange(16), torch.arange(16)).to(torch.uint8).reshape(16, 32)
    assert torch.equal(nvfp4._pack_pairs(codes), casts.pack_nibbles(codes))


def test_e2m1_thresholds():
    t = nvfp4.e2m1_thresholds()
    nxt = lambda v: float(np.nextafter(np.float32(v), np.float32(np.inf)))  # noqa: E731
    assert t.tolist() == [nxt(0.25), 0.75, nxt(1.25), 1.75, nxt(2.5), 3.5, nxt(5.0)]


# ---- the 16-bit fast paths against the fp32 general path ------------------------------------------

HALF_SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, NEG_NAN, 2.0**-133, -(2.0**-126), 6e-8, 65504.0,
                 -65504.0, 3.0e38, 0.25, 0.75, 5.0, 2.5]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    mb=st.integers(1, 6),
    kb=st.integers(1, 6),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    tile=st.sampled_from([(1, 16), (16, 16)]),
    variant=st.sampled_from([None, "row_scaled"]),
    special_frac=st.sampled_from([0.0, 0.05, 0.5]),
    nan_rows=st.sets(st.integers(0, 95), max_size=2),
    chunk_elems=st.sampled_from([1, 1 << 20]),
)
def test_half_input_equals_its_fp32_widening(seed, mb, kb, dtype, tile, variant, special_frac, nan_rows, chunk_elems):
    """quantize(x) for a bf16/fp16 x (block amaxes on the 16-bit magnitude bits, y = x * f with x widened by the
    multiply) equals quantize(x.float()) (the fp32 general path) bit for bit: NaN (whole chunks then take the
    NaN-ignoring path), +-inf, subnormals, ties of the E2M1 grid, and 16-row chunks (chunk_elems = 1)."""
    if variant is not None and tile != (1, 16):
        tile = (1, 16)
    m, k = 16 * mb, 16 * kb
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-30, 30, (m, 1), generator=g).float())
    sp = torch.tensor(HALF_SPECIALS)
    pick = torch.rand(m, k, generator=g) < special_frac
    x = torch.where(pick, sp[torch.randint(0, len(sp), (m, k), generator=g)], x).to(dtype)
    for r in nan_rows:
        if r < m:
            x[r, (r * 7) % k] = math.nan
    config = QuantConfig("nvfp4", tile=tile, variant=variant)
    old = nvfp4.CHUNK_ELEMS
    try:
        nvfp4.CHUNK_ELEMS = chunk_elems
        half = quantize(x, config, rowwise=True, colwise=True)
        wide = quantize(x.to(torch.float32), config, rowwise=True, colwise=True)
    finally:
        nvfp4.CHUNK_ELEMS = old
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
        assert torch.equal(getattr(half, f), getattr(wide, f)), f
    for f in ("rowwise_amax", "colwise_amax"):
        assert torch.equal(fp32.bits(getattr(half, f)), fp32.bits(getattr(wide, f))), f
    for blocks in (nvfp4._row_blocks_amax, nvfp4._col_blocks_amax):
        assert torch.equal(fp32.bits(blocks(x, 16)), fp32.bits(blocks(x.to(torch.float32), 16)))


# ---- dequantize ----------------------------------------------------------------------------------


def test_dequantize_formula():
    """x_hat = RN_out(RN(v * g)), g = RN(RN(s_blk * A_g) * fl(1/2688)): §8 block [96, 8, ...] with A_g 21504."""
    x = _with_ag({0: [96, 8, 4, 12, 20, 28, 40, 56, 80, -0.0, -1, -96]}, 21504.0)
    q = quantize(x, RN1)
    xh = dequantize(q, "rowwise")
    assert xh.shape == (16, 32) and xh.dtype == torch.float32
    assert xh[0, :12].tolist() == [96, 8, 0, 16, 16, 32, 32, 64, 64, -0.0, -0.0, -96]
    assert fp32.bits(xh[0, 9]).item() < 0  # code 0x8 decodes to -0.0
    assert xh[15, 31].item() == 21504.0  # 6 * RN(RN(448 * 21504) * fl(1/2688)) = 6 * 3584


def test_dequantize_colwise_transposed_back_and_dtype():
    x = torch.randn(32, 48, generator=torch.Generator().manual_seed(6))
    q = quantize(x, RN1, rowwise=True, colwise=True)
    xc = dequantize(q, "colwise", torch.bfloat16)
    assert xc.shape == (32, 48) and xc.dtype == torch.bfloat16
    qt = quantize(x.t().contiguous(), RN1)
    assert torch.equal(xc, dequantize(qt, "rowwise", torch.bfloat16).t())
    # RN_out from the fp32 value
    assert torch.equal(dequantize(q, "rowwise", torch.bfloat16), dequantize(q, "rowwise").to(torch.bfloat16))


def test_dequantize_uses_te_decode_not_encode_inverse():
    a_g = from_bits(0x443D687C)
    x = torch.zeros(16, 16)
    x[0, 0] = a_g
    q = quantize(x, RN1)
    s_blk = q.rowwise_scale[0:1, 0]
    g = nvfp4.decode_factor(s_blk, q.rowwise_amax)
    want = np.float32(np.float32(casts.decode(s_blk, E4M3).item()) * np.float32(a_g)) * np.float32(1 / 2688)
    assert bits(g.item()) == bits(want)
    v = casts.decode(casts.unpack_nibbles(q.rowwise_data)[0:1, 0], E2M1)
    assert bits(dequantize(q)[0, 0].item()) == bits(np.float32(v.item()) * np.float32(g.item()))


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 32), (16, 24), (20, 20)], ids=["M8", "K24", "M20-K20"])
def test_shape_not_multiple_of_16(shape):
    with pytest.raises(SpecViolation, match="multiple of 16"):
        quantize(torch.ones(shape), RN1)
    with pytest.raises(SpecViolation, match=r"multiples? of 16.*§5\.5"):
        nvfp4.quantize_2d(torch.ones(shape), RN1, rowwise=True, colwise=False)


def test_rht_on_fp32_input():
    with pytest.raises(SpecViolation, match=r"RHT needs a bfloat16 input \(docs/numerics.md §5.6\)"):
        nvfp4.quantize_2d(torch.ones(16, 16), RHT, rowwise=False, colwise=True)
    with pytest.raises(SpecViolation, match="RHT needs a bfloat16"):
        quantize(torch.ones(16, 16, dtype=torch.float16), RHT, colwise=True)


def test_sr_needs_seed():
    with pytest.raises(SpecViolation, match="§5.7"):
        nvfp4.quantize_2d(torch.ones(16, 16), SR, rowwise=True, colwise=False)
