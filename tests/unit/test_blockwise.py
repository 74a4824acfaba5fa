"""fp8_block (1x128, 128x128) against docs/numerics.md §4 and §8: vectors, layouts, partial tiles, oracle.

Expected bytes are hand-derived in the comments (E4M3 code = s|EEEE|mmm, value (1 + m/8)·2^(E-7),
subnormal m·2^-9) or come from an independent per-block Python loop: numpy float32 scalar
arithmetic plus ml_dtypes float8 casts after clamping.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from reference.formats import BF16_MAX, E4M3, E5M2, F16_MAX, FLT_MAX, QuantConfig

from .oracles import np_compute_scale, oracle_codes, wide_range_input

NAN, INF = float("nan"), float("inf")
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMT = {"e4m3": E4M3, "e5m2": E5M2}
VINF = {torch.float32: FLT_MAX, torch.bfloat16: BF16_MAX, torch.float16: F16_MAX}
B = 128


def bits(t: torch.Tensor) -> int:
    return int(t.reshape(()).to(torch.float32).view(torch.int32)) & 0xFFFFFFFF


def u32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def block_row(vals, dtype=torch.float32, k=B) -> torch.Tensor:
    """One [1, k] row holding `vals`, zero elsewhere."""
    x = torch.zeros(1, k, dtype=torch.float32)
    x[0, : len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return x.to(dtype)


def quant(x, colwise=True, **kw) -> reference.QuantizedTensor:
    return reference.quantize(x, QuantConfig("fp8_block", **kw), rowwise=True, colwise=colwise)


# ---- §8 rows ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pow2, sinv, expected, alone",
    [
        # bf16 2.9 = 2.90625. pow2: s = 128 (sinv 2^-7): 384 = 1.5·2^8: 0x7C; 128: 0x70; -64: 0xE8;
        # 2.90625·128 = 372 -> nearest of 352/384 is 384: 0x7C.
        # Colwise, each column is a block of its own: 3 -> s 128 -> 0x7C; 1 -> s 256 -> 0x78;
        # -0.5 -> s 512 -> -256: 0xF8; 2.90625 -> 448/2.90625 = 154.2 -> s 128 -> 0x7C.
        pytest.param(True, 0x3C000000, [0x7C, 0x70, 0xE8, 0x7C], [0x7C, 0x78, 0xF8, 0x7C], id="pow2"),
        # fp32 scale s = RN(448/3) = 0x43155555, sinv 0x3BDB6DB7: 448: 0x7E; 149.3 -> 144: 0x71;
        # -74.7 -> -72 = -1.125·2^6: 0xE9; 434 -> nearest of 416/448 is 448: 0x7E.
        # Colwise alone: x·RN(448/|x|) is within 1 ulp of 448 -> ±max.
        pytest.param(False, 0x3BDB6DB7, [0x7E, 0x71, 0xE9, 0x7E], [0x7E, 0x7E, 0xFE, 0x7E], id="fp32scale"),
    ],
)
def test_bf16_block_amax_3(pow2, sinv, expected, alone):
    q = quant(block_row([3.0, 1.0, -0.5, 2.9], torch.bfloat16), pow2_scales=pow2)
    assert bits(q.rowwise_scale[0, 0]) == sinv
    assert q.rowwise_data[0, :4].tolist() == expected
    assert q.colwise_data[:4, 0].tolist() == alone


@pytest.mark.parametrize(
    "dtype, pow2, sinv, code",
    [
        # bf16(1e-37) = 17·2^-127. 448/A overflows -> s = v_inf = BF16_MAX (sinv 0x00202020);
        # A·BF16_MAX = 17·(2 - 2^-7)·2^0 = 33.87 -> nearest of 32/36 is 32: 0x60.
        pytest.param(torch.bfloat16, False, 0x00202020, 0x60, id="bf16-fp32scale"),
        # pow2: BF16_MAX -> 2^127 (sinv 2^-127 = 0x00400000); 17 ties between 16 and 18 -> even 16: 0x58.
        pytest.param(torch.bfloat16, True, 0x00400000, 0x58, id="bf16-pow2"),
        # fp32 input: v_inf = FLT_MAX (sinv 0x00200000); fp32(1e-37)·FLT_MAX = 34.03 -> 36: 0x61.
        pytest.param(torch.float32, False, 0x00200000, 0x61, id="fp32-fp32scale"),
        # pow2: 2^127; 1e-37·2^127 = 17.01 -> 18 = 1.125·2^4: 0x59.
        pytest.param(torch.float32, True, 0x00400000, 0x59, id="fp32-pow2"),
    ],
)
def test_tiny_amax_uses_input_dtype_max(dtype, pow2, sinv, code):
    q = quant(block_row([1e-37], dtype), pow2_scales=pow2)
    assert bits(q.rowwise_scale[0, 0]) == sinv
    assert q.rowwise_data[0, 0].item() == code


def test_layout_shapes_3x200():
    # §8: blockwise 1-D x [3, 200]: sinv [2, 4], data_T [200, 3], sinv_T [1, 200].
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(0))
    q = quant(x)
    assert q.rowwise_data.shape == (3, 200) and q.rowwise_data.dtype == torch.uint8
    assert q.rowwise_scale.shape == (2, 4) and q.rowwise_scale.dtype == torch.float32
    assert q.colwise_data.shape == (200, 3) and q.colwise_data.dtype == torch.uint8
    assert q.colwise_scale.shape == (1, 200) and q.colwise_scale.dtype == torch.float32
    assert q.rowwise_amax is None and q.colwise_amax is None
    assert q.rowwise_scale[:, 3].abs().max().item() == 0  # padding column (m = 3) is zero
    assert bool((q.rowwise_scale[:, :3] > 0).all()) and bool((q.colwise_scale > 0).all())


@pytest.mark.parametrize(
    "shape, row_sinv, col_sinv",
    [
        # 2-D: rowwise [ceil(M/128), roundup(ceil(K/128), 4)], colwise [ceil(K/128), roundup(ceil(M/128), 4)].
        pytest.param((3, 200), (1, 4), (2, 4), id="3x200"),
        pytest.param((130, 257), (2, 4), (3, 4), id="130x257"),
        pytest.param((640, 128), (5, 4), (1, 8), id="640x128"),
    ],
)
def test_layout_shapes_2d(shape, row_sinv, col_sinv):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    q = quant(x, tile=(128, 128))
    assert q.rowwise_scale.shape == row_sinv and q.colwise_scale.shape == col_sinv
    assert q.colwise_data.shape == shape[::-1]


# ---- special-value corpus --------------------------------------------------------------------


@pytest.mark.parametrize(
    "vals, dtype, kw, sinv, expected",
    [
        # Zero block: A = 0 -> s = 1; -0.0 keeps its sign: 0x80.
        pytest.param([0.0, -0.0], torch.float32, {}, 0x3F800000, [0x00, 0x80], id="zero_block"),
        # A = +inf (NaN ignored) -> s = 1: inf -> 0x7E, NaN of either sign -> 0x7F, -inf -> 0xFE,
        # 1.0: 0x38, -0.0: 0x80, 2^-149 underflows: 0x00, 464 ties to the even 448: 0x7E,
        # 2^-9 = min subnormal: 0x01, 2^-10 ties to 0.
        pytest.param(
            [INF, NAN, -NAN, -INF, 1.0, -0.0, 2.0**-149, 464.0, 2.0**-9, 2.0**-10],
            torch.float32,
            {},
            0x3F800000,
            [0x7E, 0x7F, 0x7F, 0xFE, 0x38, 0x80, 0x00, 0x7E, 0x01, 0x00],
            id="inf_nan_block",
        ),
        # NaN-only block: A = 0 -> s = 1, codes 0x7F.
        pytest.param([NAN, -NAN], torch.float32, {}, 0x3F800000, [0x7F, 0x7F], id="nan_only_block"),
        # All-max fp32 block: s = 448/448 = 1.
        pytest.param([448.0, -448.0], torch.float32, {}, 0x3F800000, [0x7E, 0xFE], id="all_max_e4m3"),
        # All-max bf16 block: 448/BF16_MAX = 0.878·2^-119 -> pow2 s = 2^-120 (sinv 2^120 = 0x7B800000);
        # BF16_MAX·2^-120 = (2 - 2^-7)·2^7 = 255 -> nearest of 240/256 is 256 = 2^8: 0x78 / 0xF8.
        pytest.param([BF16_MAX, -BF16_MAX], torch.bfloat16, {}, 0x7B800000, [0x78, 0xF8], id="all_bf16_max_pow2"),
        # fp32 scales: RN(BF16_MAX·RN(448/BF16_MAX)) = 448 exactly -> ±max.
        pytest.param(
            [BF16_MAX, -BF16_MAX],
            torch.bfloat16,
            {"pow2_scales": False},
            None,
            [0x7E, 0xFE],
            id="all_bf16_max_fp32scale",
        ),
        # Subnormal inputs: A = 2^-127 -> 448/A overflows -> FLT_MAX -> pow2 2^127 (sinv 0x00400000);
        # 2^-127·2^127 = 1: 0x38; -2^-130·2^127 = -2^-3 -> E=4: 0xA0.
        pytest.param([2.0**-127, -(2.0**-130)], torch.float32, {}, 0x00400000, [0x38, 0xA0], id="subnormal_block"),
        # eps 1.0, A = 0.5 -> A = 1: fp32 scales s = 448 (sinv fl(1/448) = 0x3B124925):
        # 224 = 1.75·2^7: 0x76; -112 = -1.75·2^6: 0xEE.
        pytest.param(
            [0.5, -0.25],
            torch.float32,
            {"eps": 1.0, "pow2_scales": False},
            0x3B124925,
            [0x76, 0xEE],
            id="eps_fp32scale",
        ),
        # pow2: s = 256 (sinv 2^-8 = 0x3B800000): 128: 0x70; -64: 0xE8.
        pytest.param([0.5, -0.25], torch.float32, {"eps": 1.0}, 0x3B800000, [0x70, 0xE8], id="eps_pow2"),
        # E5M2 block, A = 3.5: pow2 s = 2^floor(log2 16384) = 16384 (sinv 2^-14 = 0x38800000);
        # 57344: 0x7B; -16384 = -2^14 -> E=29: 0xF4.
        pytest.param([3.5, -1.0], torch.float32, {"element": "e5m2"}, 0x38800000, [0x7B, 0xF4], id="e5m2"),
    ],
)
def test_special_value_corpus(vals, dtype, kw, sinv, expected):
    for tile in ((1, 128), (128, 128)):
        q = quant(block_row(vals, dtype), tile=tile, **kw)
        if sinv is not None:
            assert bits(q.rowwise_scale[0, 0]) == sinv, tile
        assert q.rowwise_data[0, : len(vals)].tolist() == expected, tile


def test_multiplies_by_s_never_divides_by_sinv():
    # docs/numerics.md §4: fp32 scales, block amax 3 -> s = 0x43155555. x = 0x3FB92492: exact x·s =
    # 215.9999876 -> RN 0x4357FFFF < 216 (midpoint of 208/224) -> 208: 0x75. RN(x / sinv) = 216.0,
    # a tie -> 224: 0x76.
    x = block_row([3.0, float(np.array([0x3FB92492], dtype=np.uint32).view(np.float32)[0])])
    q = quant(x, pow2_scales=False)
    assert q.rowwise_data[0, :2].tolist() == [0x7E, 0x75]


def test_blocks_are_independent():
    # Row [3.5 in block 0, 0.875 in block 1]: pow2 s = 128 and 512 -> both elements -> 448 (0x7E).
    x = torch.zeros(1, 256)
    x[0, 0], x[0, 128] = 3.5, 0.875
    q = quant(x)
    assert q.rowwise_data[0, 0].item() == 0x7E and q.rowwise_data[0, 128].item() == 0x7E
    assert [bits(v) for v in q.rowwise_scale[:, 0]] == [0x3C000000, 0x3B000000]  # 2^-7, 2^-9


# ---- independent oracle ----------------------------------------------------------------------


def oracle_scale(blk: np.ndarray, fp8_max, pow2, eps, v_inf):
    """(s, sinv) of one block: NaN-ignoring amax, then compute_scale in numpy float32 scalars."""
    a = np.abs(blk[~np.isnan(blk)])
    a = np.float32(max(0.0, float(a.max()))) if a.size else np.float32(0.0)
    return np_compute_scale(a, fp8_max, pow2, eps, v_inf)


def oracle_1x128(xs: np.ndarray, element, pow2, eps, v_inf):
    """Rowwise 1x128 quantization by a loop over blocks: (codes [M, K], sinv [M, ceil(K/128)])."""
    m, k = xs.shape
    kb = -(-k // B)
    data = np.zeros((m, k), np.uint8)
    sinv = np.zeros((m, kb), np.float32)
    for i in range(m):
        for j in range(kb):
            blk = xs[i, j * B : (j + 1) * B]
            s, sinv[i, j] = oracle_scale(blk, FMT[element].max_finite, pow2, eps, v_inf)
            data[i, j * B : (j + 1) * B] = oracle_codes(blk * s, element)
    return data, sinv


def oracle_128x128(xs: np.ndarray, element, pow2, eps, v_inf):
    m, k = xs.shape
    mb, kb = -(-m // B), -(-k // B)
    data = np.zeros((m, k), np.uint8)
    sinv = np.zeros((mb, kb), np.float32)
    for i in range(mb):
        for j in range(kb):
            sl = np.s_[i * B : (i + 1) * B, j * B : (j + 1) * B]
            s, sinv[i, j] = oracle_scale(xs[sl], FMT[element].max_finite, pow2, eps, v_inf)
            data[sl] = oracle_codes(xs[sl] * s, element)
    return data, sinv


def padded(a: np.ndarray, cols: int) -> np.ndarray:
    out = np.zeros((a.shape[0], cols), np.float32)
    out[:, : a.shape[1]] = a
    return out


def random_input(seed: int, shape, dtype, nan_free: bool = False) -> torch.Tensor:
    """Per-row magnitudes over a wide exponent range (tiny rows overflow 448/A), zeros and NaN.

    `nan_free` replaces the NaN lanes by -0.0: such an input takes blockwise's NaN-free path.
    """
    x = wide_range_input(seed, shape, dtype, row_exp=(-135, 100), row_exp_f16=(-20, 12), col_exp=(-3, 4),
                         inf_frac=0.003)
    return torch.where(torch.isnan(x), torch.tensor(-0.0, dtype=dtype), x) if nan_free else x


CASES = [
    # (shape, dtype, element, pow2, eps)
    ((3, 200), torch.bfloat16, "e4m3", True, 0.0),
    ((130, 257), torch.float32, "e4m3", False, 0.0),
    ((130, 257), torch.bfloat16, "e5m2", True, 0.0),
    ((256, 128), torch.float16, "e4m3", True, 0.0),
    ((1, 1), torch.float32, "e4m3", True, 0.0),
    ((5, 129), torch.float32, "e5m2", False, 1e-3),
    ((129, 7), torch.bfloat16, "e4m3", False, 0.0),
]


def _id(c):
    return f"{c[0][0]}x{c[0][1]}-{str(c[1])[6:]}-{c[2]}-{'pow2' if c[3] else 'fp32scale'}" + (
        f"-eps{c[4]}" if c[4] else ""
    )


@pytest.mark.parametrize("nan_free", [False, True], ids=["with_nan", "nan_free"])
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_1x128_matches_oracle(case, nan_free):
    # With NaN every chunk takes quantize_2d's general path; NaN-free inputs take the fast one.
    shape, dtype, element, pow2, eps = case
    x = random_input(zlib.crc32(_id(case).encode()), shape, dtype, nan_free)
    q = quant(x, element=element, pow2_scales=pow2, eps=eps)
    xs = x.float().numpy()
    m, k = shape
    d_r, s_r = oracle_1x128(xs, element, pow2, eps, VINF[dtype])
    d_c, s_c = oracle_1x128(np.ascontiguousarray(xs.T), element, pow2, eps, VINF[dtype])  # blocks along M
    assert np.array_equal(q.rowwise_data.numpy(), d_r)
    # NUMERICS: §4 rowwise sinv stored transposed [ceil(K/128), roundup(M,4)], zero padding.
    assert np.array_equal(u32(q.rowwise_scale.numpy()), u32(padded(s_r.T, -(-m // 4) * 4)))
    assert np.array_equal(q.colwise_data.numpy(), d_c)  # [K, M]
    assert np.array_equal(
        u32(q.colwise_scale.numpy()), u32(padded(s_c.T, -(-k // 4) * 4))
    )  # [ceil(M/128), roundup(K,4)]
    # Dequantization: RN_out(RN(dec(q)·sinv)), [M, K] for both copies.
    for out_dtype, ml_out in ((torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16)):
        per_r = np.repeat(s_r, B, axis=1)[:, :k]
        ref_r = (d_r.view(ML[element]).astype(np.float32) * per_r).astype(ml_out).astype(np.float32)
        per_c = np.repeat(s_c, B, axis=1)[:, :m]
        ref_c = (d_c.view(ML[element]).astype(np.float32) * per_c).astype(ml_out).astype(np.float32).T
        got_r = reference.dequantize(q, "rowwise", out_dtype)
        got_c = reference.dequantize(q, "colwise", out_dtype)
        assert got_r.dtype == out_dtype and got_r.shape == shape and got_c.shape == shape
        assert np.array_equal(got_r.float().numpy(), ref_r, equal_nan=True)
        assert np.array_equal(got_c.float().numpy(), ref_c, equal_nan=True)


@pytest.mark.parametrize("nan_free", [False, True], ids=["with_nan", "nan_free"])
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_128x128_matches_oracle(case, nan_free):
    # With NaN every chunk takes quantize_2d's general path; NaN-free inputs take the fast one.
    shape, dtype, element, pow2, eps = case
    x = random_input(zlib.crc32(_id(case).encode()) + 1, shape, dtype, nan_free)
    q = quant(x, tile=(128, 128), element=element, pow2_scales=pow2, eps=eps)
    xs = x.float().numpy()
    d, s = oracle_128x128(xs, element, pow2, eps, VINF[dtype])
    assert np.array_equal(q.rowwise_data.numpy(), d)
    assert np.array_equal(u32(q.rowwise_scale.numpy()), u32(padded(s, -(-s.shape[1] // 4) * 4)))
    assert np.array_equal(q.colwise_data.numpy(), d.T)
    assert np.array_equal(u32(q.colwise_scale.numpy()), u32(padded(s.T, -(-s.shape[0] // 4) * 4)))
    per = np.repeat(np.repeat(s, B, axis=0), B, axis=1)[: shape[0], : shape[1]]
    ref = (d.view(ML[element]).astype(np.float32) * per).astype(ml_dtypes.bfloat16).astype(np.float32)
    for o in ("rowwise", "colwise"):
        got = reference.dequantize(q, o, torch.bfloat16)
        assert got.shape == shape and np.array_equal(got.float().numpy(), ref, equal_nan=True), o


# ---- relations -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 200), (130, 257), (256, 384)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_1d_colwise_is_rowwise_of_transpose(shape):
    # NUMERICS: §4 row k of the colwise copy is the 1x128 quantization of column k of x, and the
    # colwise sinv [ceil(M/128), roundup(K,4)] is the rowwise (transposed-storage) sinv of x^T.
    x = random_input(11, shape, torch.bfloat16)
    qc = quant(x, colwise=True)
    qt = quant(x.T.contiguous(), colwise=False)
    assert torch.equal(qc.colwise_data, qt.rowwise_data)
    assert torch.equal(qc.colwise_scale.view(torch.int32), qt.rowwise_scale.view(torch.int32))


@pytest.mark.parametrize("shape", [(3, 200), (130, 257), (256, 384)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_2d_colwise_is_transpose(shape):
    x = random_input(12, shape, torch.float32)
    q = quant(x, tile=(128, 128))
    mb, kb = -(-shape[0] // B), -(-shape[1] // B)
    assert torch.equal(q.colwise_data, q.rowwise_data.T)
    assert torch.equal(q.colwise_scale[:kb, :mb], q.rowwise_scale[:mb, :kb].T)
    assert q.rowwise_scale[:, kb:].abs().sum() == 0 and q.colwise_scale[:, mb:].abs().sum() == 0


def test_2d_tile_amax_covers_whole_tile():
    # One large element in tile (0, 0) sets the scale for all of its 128 rows: pow2 s = 128 for
    # A = 3.5, so 1.0 in another row of the tile -> 128: 0x70; the same 1.0 in 1-D (its own
    # block, s = 256) -> 256: 0x78.
    x = torch.zeros(130, 130)
    x[0, 0], x[100, 5] = 3.5, 1.0
    q2 = quant(x, tile=(128, 128))
    q1 = quant(x)
    assert q2.rowwise_data[100, 5].item() == 0x70 and q1.rowwise_data[100, 5].item() == 0x78


def test_rowwise_only_and_colwise_only_agree_with_both():
    x = random_input(5, (130, 257), torch.float32)
    both = quant(x, colwise=True)
    r = reference.quantize(x, QuantConfig("fp8_block"), rowwise=True, colwise=False)
    c = reference.quantize(x, QuantConfig("fp8_block"), rowwise=False, colwise=True)
    assert r.colwise_data is None and c.rowwise_data is None
    assert torch.equal(r.rowwise_data, both.rowwise_data) and torch.equal(c.colwise_data, both.colwise_data)
    assert torch.equal(c.colwise_scale, both.colwise_scale) and torch.equal(r.rowwise_scale, both.rowwise_scale)


def test_chunked_rows_match_small_chunks(monkeypatch):
    # Row chunking bounds memory; the result must not depend on the chunk size.
    from reference import blockwise

    for nan_free in (False, True):  # the general path's chunks, then the NaN-free path's
        x = random_input(6, (700, 300), torch.bfloat16, nan_free)
        full = quant(x, colwise=True)
        full2d = quant(x, tile=(128, 128))
        monkeypatch.setattr(blockwise, "CHUNK_ELEMENTS", 1)  # one tile row (128 rows) per chunk
        # Two tile rows per NaN-free-path chunk: with NaN each is redone as two general chunks (rows 0, 128).
        monkeypatch.setattr(blockwise, "FAST_CHUNK_ELEMENTS", 256 * 384)
        small = quant(x, colwise=True)
        small2d = quant(x, tile=(128, 128))
        monkeypatch.undo()
        for a, b in ((full, small), (full2d, small2d)):
            for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
                assert torch.equal(getattr(a, f), getattr(b, f)), f


# ---- the NaN-free path against the general path ------------------------------------------------

SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), 448.0, -448.0, 464.0, 1e-40, -1e-45, 3.0e38, 65504.0,
            57344.0, 2.0**-126, 1.0 + 2.0**-23]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**31 - 1),
    m=st.one_of(st.sampled_from([128, 256]), st.integers(1, 300)),  # whole blocks: no padding
    k=st.one_of(st.sampled_from([128, 256]), st.integers(1, 300)),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    tile=st.sampled_from([(1, 128), (128, 128)]),
    element=st.sampled_from(["e4m3", "e5m2"]),
    pow2=st.booleans(),
    eps=st.sampled_from([0.0, 1e-3, 2.0**-140]),
    convention=st.sampled_from(["te", "vllm_group", "vllm_group_ue8m0"]),
    copies=st.sampled_from([(True, True), (True, False), (False, True)]),
    nan_rows=st.sets(st.integers(0, 299), max_size=2),
    special_frac=st.sampled_from([0.0, 0.02, 0.3]),
    fast_rows=st.sampled_from([128, 256]),
)
def test_nan_free_path_matches_general_path(seed, m, k, dtype, tile, element, pow2, eps, convention, copies,
                                            nan_rows, special_frac, fast_rows):
    """quantize_2d with FAST_PATH on equals it with FAST_PATH off, bit for bit, over many chunks.

    The NaN-free path's chunks are `fast_rows` rows, the general path's 128 rows (CHUNK_ELEMENTS = 1), so a
    NaN planted in a few rows sends only their chunks down the general path (a 256-row chunk in two pieces);
    the others take the NaN-free one. Special values: ±0, ±inf, ±max of each format, subnormals of fp32 /
    fp16, values that overflow 448/A and fp16's max.
    """
    from reference import blockwise

    if convention != "te" and (tile != (1, 128) or element != "e4m3"):
        tile, element = (1, 128), "e4m3"  # vLLM's rules are 1x128 E4M3 only
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-140, 120, (m, 1), generator=g).to(torch.float64))
    sp = torch.tensor(SPECIALS, dtype=torch.float64)
    pick = torch.rand(m, k, generator=g) < special_frac
    x = torch.where(pick, sp[torch.randint(0, len(sp), (m, k), generator=g)], x).to(torch.float32).to(dtype)
    for r in nan_rows:
        if r < m:
            x[r, (r * 7) % k] = float("nan")
    cfg = dict(tile=tile, element=element, pow2_scales=pow2, eps=eps)
    if convention != "te":
        cfg = dict(convention=convention, pow2_scales=convention == "vllm_group_ue8m0", eps=eps or 1e-10)
    config = QuantConfig("fp8_block", **cfg)
    rowwise, colwise = copies
    old_chunks = blockwise.CHUNK_ELEMENTS, blockwise.FAST_CHUNK_ELEMENTS
    try:
        blockwise.CHUNK_ELEMENTS, blockwise.FAST_CHUNK_ELEMENTS = 1, fast_rows * -(-k // B) * B
        x_before = x.clone()
        fast = reference.quantize(x, config, rowwise=rowwise, colwise=colwise)
        assert torch.equal(x.float().view(torch.int32), x_before.float().view(torch.int32)), "input modified"
        blockwise.FAST_PATH = False
        slow = reference.quantize(x, config, rowwise=rowwise, colwise=colwise)
    finally:
        blockwise.FAST_PATH = True
        blockwise.CHUNK_ELEMENTS, blockwise.FAST_CHUNK_ELEMENTS = old_chunks
    for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
        a, b = getattr(fast, f), getattr(slow, f)
        assert (a is None) == (b is None), f
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f


def test_nan_free_path_without_torch_cast(monkeypatch):
    """Where PyTorch's float8 cast disagrees with §0.5, both paths use the arithmetic cast: still the same bits."""
    from reference import blockwise, casts

    x = random_input(21, (256, 384), torch.bfloat16, nan_free=True)
    monkeypatch.setattr(casts, "torch_cast_agrees", lambda fmt, device="cpu": False)
    for cfg in (QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128), element="e5m2")):
        fast = reference.quantize(x, cfg, rowwise=True, colwise=True)
        monkeypatch.setattr(blockwise, "FAST_PATH", False)
        slow = reference.quantize(x, cfg, rowwise=True, colwise=True)
        monkeypatch.setattr(blockwise, "FAST_PATH", True)
        for f in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
            assert torch.equal(getattr(fast, f), getattr(slow, f)), f
