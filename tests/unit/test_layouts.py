"""reference.layouts: cuBLASLt swizzle (docs/numerics.md §3 Layouts, §8 swizzle row), scale shapes (§8 layouts row)."""

from __future__ import annotations

import pytest
import torch

from reference import layouts
from reference.formats import QuantConfig
from reference.types import QuantizedTensor, SpecViolation


def _formula_offset(i: int, j: int, c: int) -> int:
    """docs/numerics.md §3: (i//128 * (C/4) + j//4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4."""
    return (i // 128 * (c // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4


def _index_matrix(r: int, c: int) -> torch.Tensor:
    return torch.arange(r * c, dtype=torch.int64).reshape(r, c)


# ---- §8 swizzle row ----------------------------------------------------------------------------

SWIZZLE_VECTORS = [
    ((0, 0), 0),
    ((1, 0), 16),
    ((32, 0), 4),
    ((0, 1), 1),
    ((0, 4), 512),
    ((128, 0), 1024),
    ((37, 5), 597),
]


@pytest.mark.parametrize("ij,offset", SWIZZLE_VECTORS, ids=[f"T[{i},{j}]->{o}" for (i, j), o in SWIZZLE_VECTORS])
def test_swizzle_numerics_vector(ij, offset):
    t = _index_matrix(256, 8)
    flat = layouts.swizzle(t)
    i, j = ij
    assert flat.shape == (256 * 8,)
    assert int(flat[offset]) == int(t[i, j])


@pytest.mark.parametrize("shape", [(256, 8), (128, 4), (384, 12)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_swizzle_matches_offset_formula_everywhere(shape):
    r, c = shape
    t = _index_matrix(r, c)
    flat = layouts.swizzle(t)
    expected = torch.empty(r * c, dtype=torch.int64)
    for i in range(r):
        for j in range(c):
            expected[_formula_offset(i, j, c)] = t[i, j]
    assert torch.equal(flat, expected)


@pytest.mark.parametrize("seed", range(6))
def test_swizzle_unswizzle_exact_inverses(seed):
    g = torch.Generator().manual_seed(seed)
    r = 128 * int(torch.randint(1, 4, (1,), generator=g))
    c = 4 * int(torch.randint(1, 7, (1,), generator=g))
    t = torch.randint(0, 256, (r, c), generator=g, dtype=torch.int64).to(torch.uint8)
    flat = layouts.swizzle(t)
    assert flat.dtype == torch.uint8 and flat.dim() == 1
    assert torch.equal(layouts.unswizzle(flat, (r, c)), t)
    f = torch.randint(0, 256, (r * c,), generator=g, dtype=torch.int64).to(torch.uint8)
    assert torch.equal(layouts.swizzle(layouts.unswizzle(f, (r, c))), f)


@pytest.mark.parametrize("shape", [(100, 4), (128, 6), (64, 8)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_swizzle_rejects_unpadded(shape):
    with pytest.raises(SpecViolation, match="R % 128"):
        layouts.swizzle(torch.zeros(shape, dtype=torch.uint8))


def test_unswizzle_rejects_wrong_length():
    with pytest.raises(SpecViolation, match="1-D tensor of 512"):
        layouts.unswizzle(torch.zeros(511, dtype=torch.uint8), (128, 4))


# ---- §8 layouts row ----------------------------------------------------------------------------


def test_layouts_vector_mxfp8():
    cfg = QuantConfig("mxfp8")
    assert layouts.scale_padded_shape(cfg, "rowwise", 64, 96) == (128, 4)  # S_r
    assert layouts.scale_padded_shape(cfg, "colwise", 64, 96) == (4, 128)  # S_c
    assert layouts.scale_valid_shape(cfg, "rowwise", 64, 96) == (64, 3)
    assert layouts.scale_valid_shape(cfg, "colwise", 64, 96) == (2, 96)
    assert layouts.data_shape(cfg, "colwise", 64, 96) == (64, 96)  # not transposed


def test_layouts_vector_blockwise_1d():
    cfg = QuantConfig("fp8_block", tile=(1, 128))
    assert layouts.scale_padded_shape(cfg, "rowwise", 3, 200) == (2, 4)  # sinv
    assert layouts.scale_valid_shape(cfg, "rowwise", 3, 200) == (2, 3)
    assert layouts.data_shape(cfg, "colwise", 3, 200) == (200, 3)  # data_T
    assert layouts.scale_padded_shape(cfg, "colwise", 3, 200) == (1, 200)  # sinv_T
    assert layouts.scale_valid_shape(cfg, "colwise", 3, 200) == (1, 200)


def test_layouts_vector_nvfp4():
    cfg = QuantConfig("nvfp4")
    assert layouts.data_shape(cfg, "rowwise", 32, 64) == (32, 32)
    assert layouts.data_shape(cfg, "colwise", 32, 64) == (64, 16)
    assert layouts.scale_padded_shape(cfg, "rowwise", 32, 64) == (128, 4)
    assert layouts.scale_padded_shape(cfg, "colwise", 32, 64) == (128, 4)
    assert layouts.scale_valid_shape(cfg, "rowwise", 32, 64) == (32, 4)
    assert layouts.scale_valid_shape(cfg, "colwise", 32, 64) == (64, 2)


def test_layouts_blockwise_2d_and_per_tensor():
    cfg = QuantConfig("fp8_block", tile=(128, 128))
    # docs/numerics.md §4: [ceil(M/128), roundup(ceil(K/128), 4)]; colwise its transpose, padded on the fast dim.
    assert layouts.scale_padded_shape(cfg, "rowwise", 300, 520) == (3, 8)
    assert layouts.scale_valid_shape(cfg, "rowwise", 300, 520) == (3, 5)
    assert layouts.scale_padded_shape(cfg, "colwise", 300, 520) == (5, 4)
    assert layouts.scale_valid_shape(cfg, "colwise", 300, 520) == (5, 3)
    for scheme in ("fp8_current", "fp8_delayed"):
        c = QuantConfig(scheme)
        for o in ("rowwise", "colwise"):
            assert layouts.scale_padded_shape(c, o, 7, 9) == (1,)
            assert layouts.scale_valid_shape(c, o, 7, 9) == (1,)
        assert layouts.data_shape(c, "colwise", 7, 9) == (9, 7)


def test_layouts_2d_tiles_keep_1d_storage():
    # MXFP8 32x32 and NVFP4 16x16 store one entry per row/column like 1-D (docs/numerics.md §3, §5.5).
    assert layouts.scale_padded_shape(QuantConfig("mxfp8", tile=(32, 32)), "rowwise", 64, 96) == (128, 4)
    assert layouts.scale_padded_shape(QuantConfig("nvfp4", tile=(16, 16)), "colwise", 32, 64) == (128, 4)


# ---- swizzle_scales: per-scheme orientation, padding zeroed ------------------------------------------


def _mxfp8_q(m, k, fill_pad=0xAB):
    cfg = QuantConfig("mxfp8")
    g = torch.Generator().manual_seed(m * 1000 + k)
    s_r = torch.full((128 * -(-m // 128), 4 * -(-(k // 32) // 4)), fill_pad, dtype=torch.uint8)
    s_r[:m, : k // 32] = torch.randint(100, 150, (m, k // 32), generator=g).to(torch.uint8)
    s_c = torch.full((4 * -(-(m // 32) // 4), 128 * -(-k // 128)), fill_pad, dtype=torch.uint8)
    s_c[: m // 32, :k] = torch.randint(100, 150, (m // 32, k), generator=g).to(torch.uint8)
    data = torch.zeros((m, k), dtype=torch.uint8)
    q = QuantizedTensor(cfg, (m, k), rowwise_data=data, rowwise_scale=s_r, colwise_data=data, colwise_scale=s_c)
    return q, s_r, s_c


def test_swizzle_scales_mxfp8_rowwise_and_colwise_transposed():
    m, k = 64, 96
    q, s_r, s_c = _mxfp8_q(m, k)
    flat_r = layouts.swizzle_scales(q, "rowwise")
    flat_c = layouts.swizzle_scales(q, "colwise")
    c_r = s_r.shape[1]
    c_c = s_c.shape[0]  # columns of T = S_c^T
    assert flat_r.numel() == s_r.numel() and flat_c.numel() == s_c.numel()
    for i in range(m):
        for j in range(k // 32):
            assert int(flat_r[_formula_offset(i, j, c_r)]) == int(s_r[i, j])
    # docs/numerics.md §3: columnwise T = S_c transposed, i = k, j = mb.
    for kk in range(k):
        for mb in range(m // 32):
            assert int(flat_c[_formula_offset(kk, mb, c_c)]) == int(s_c[mb, kk])


@pytest.mark.parametrize("orientation", ["rowwise", "colwise"])
def test_swizzled_padding_is_zero(orientation):
    m, k = 64, 96
    q, s_r, s_c = _mxfp8_q(m, k, fill_pad=0xAB)  # compact padding deliberately non-zero (as TE leaves it)
    flat = layouts.swizzle_scales(q, orientation)
    if orientation == "rowwise":
        c, valid = s_r.shape[1], [(i, j) for i in range(m) for j in range(k // 32)]
    else:
        c, valid = s_c.shape[0], [(kk, mb) for kk in range(k) for mb in range(m // 32)]
    mask = torch.zeros(flat.numel(), dtype=torch.bool)
    for i, j in valid:
        mask[_formula_offset(i, j, c)] = True
    assert int(mask.sum()) == len(valid)
    assert bool((flat[~mask] == 0).all())
    assert bool((flat[mask] >= 100).all())


@pytest.mark.parametrize("orientation", ["rowwise", "colwise"])
def test_unswizzle_scales_inverts_swizzle_scales(orientation):
    m, k = 64, 96
    q, s_r, s_c = _mxfp8_q(m, k, fill_pad=0)
    flat = layouts.swizzle_scales(q, orientation)
    back = layouts.unswizzle_scales(flat, q.config, orientation, m, k)
    assert torch.equal(back, s_r if orientation == "rowwise" else s_c)


def test_swizzle_scales_nvfp4_compact_as_is():
    cfg = QuantConfig("nvfp4")
    m, k = 32, 64
    s_c = torch.zeros((128, 4), dtype=torch.uint8)
    s_c[:k, : m // 16] = torch.arange(k * (m // 16), dtype=torch.int64).reshape(k, m // 16).to(torch.uint8) + 1
    q = QuantizedTensor(cfg, (m, k), colwise_data=torch.zeros((k, m // 2), dtype=torch.uint8), colwise_scale=s_c)
    flat = layouts.swizzle_scales(q, "colwise")
    for i in range(k):
        for j in range(m // 16):
            assert int(flat[_formula_offset(i, j, 4)]) == int(s_c[i, j])


def test_swizzle_scales_rejects_blockwise_and_wrong_shape():
    cfg = QuantConfig("fp8_block")
    q = QuantizedTensor(
        cfg, (3, 200), rowwise_data=torch.zeros((3, 200), dtype=torch.uint8), rowwise_scale=torch.ones(2, 4)
    )
    with pytest.raises(SpecViolation, match="swizzled layout"):
        layouts.swizzle_scales(q, "rowwise")
    q2, _, _ = _mxfp8_q(64, 96)
    q2.rowwise_scale = q2.rowwise_scale[:64]
    with pytest.raises(SpecViolation, match="padded compact shape"):
        layouts.swizzle_scales(q2, "rowwise")


# ---- pow2 blockwise sinv -> E8M0 (§4 last line) ---------------------------------------------------


def test_blockwise_sinv_to_e8m0():
    sinv = torch.tensor([1.0, 0.5, 2.0**-7, 2.0**127, 0.0], dtype=torch.float32)
    sub = torch.tensor([0x00400000], dtype=torch.int32).view(torch.float32)  # 2^-127, subnormal
    e = layouts.blockwise_sinv_to_e8m0(torch.cat([sinv, sub]))
    assert e.dtype == torch.uint8
    assert e.tolist() == [127, 126, 120, 254, 0, 0]


@pytest.mark.parametrize(
    "bad", [3.0, -1.0, float("inf"), float("nan"), 2.0**-128], ids=["3", "neg", "inf", "nan", "2^-128"]
)
def test_blockwise_sinv_to_e8m0_rejects_non_pow2(bad):
    with pytest.raises(SpecViolation, match="power-of-two"):
        layouts.blockwise_sinv_to_e8m0(torch.tensor([1.0, bad], dtype=torch.float32))


# ---- CopyGeometry: one object per copy --------------------------------------------------------

GEOMETRY_CONFIGS = {
    "fp8_current": QuantConfig("fp8_current"),
    "fp8_delayed": QuantConfig("fp8_delayed"),
    "mxfp8-1x32": QuantConfig("mxfp8"),
    "mxfp8-32x32": QuantConfig("mxfp8", tile=(32, 32)),
    "fp8_block-1x128": QuantConfig("fp8_block"),
    "fp8_block-128x128": QuantConfig("fp8_block", tile=(128, 128)),
    "nvfp4-1x16": QuantConfig("nvfp4"),
    "nvfp4-16x16": QuantConfig("nvfp4", tile=(16, 16)),
}

# Hand-derived from docs/numerics.md §1, §3, §4, §5.9 for a logical [64, 256] input:
# (transposed, block, scale_block, scale index of data element (r, c) = (40, 200)).
GEOMETRY_VECTORS = {
    ("fp8_current", "rowwise"): (False, (64, 256), None, None),
    ("fp8_current", "colwise"): (True, (256, 64), None, None),
    ("mxfp8-1x32", "rowwise"): (False, (1, 32), (1, 32), (40, 6)),
    ("mxfp8-1x32", "colwise"): (False, (32, 1), (32, 1), (1, 200)),
    ("mxfp8-32x32", "rowwise"): (False, (32, 32), (1, 32), (40, 6)),
    ("mxfp8-32x32", "colwise"): (False, (32, 32), (32, 1), (1, 200)),
    ("fp8_block-1x128", "rowwise"): (False, (1, 128), (1, 128), (1, 40)),  # stored [kb, m]
    ("fp8_block-1x128", "colwise"): (True, (1, 128), (1, 128), (1, 40)),  # data [K, M]: (r=40, c=200) -> [c//128, r]
    ("fp8_block-128x128", "rowwise"): (False, (128, 128), (128, 128), (0, 1)),
    ("fp8_block-128x128", "colwise"): (True, (128, 128), (128, 128), (0, 1)),
    ("nvfp4-1x16", "rowwise"): (False, (1, 16), (1, 16), (40, 12)),
    ("nvfp4-16x16", "colwise"): (True, (16, 16), (1, 16), (40, 12)),
}


@pytest.mark.parametrize("key", GEOMETRY_VECTORS, ids=[f"{n}-{o}" for n, o in GEOMETRY_VECTORS])
def test_geometry_vectors(key):
    name, o = key
    g = layouts.copy_geometry(GEOMETRY_CONFIGS[name], o, 64, 256)
    transposed, block, scale_block, idx = GEOMETRY_VECTORS[key]
    assert g.transposed is transposed
    assert (g.rows, g.cols) == ((256, 64) if transposed else (64, 256))
    assert g.block == block and g.scale_block == scale_block
    assert g.scale_index(40, 200) == idx
    assert g.per_tensor is (scale_block is None)
    assert g.logical(3, 5) == ((5, 3) if transposed else (3, 5))


@pytest.mark.parametrize("name", GEOMETRY_CONFIGS)
@pytest.mark.parametrize("o", ["rowwise", "colwise"])
def test_geometry_scale_region_is_the_preimage_of_scale_index(name, o):
    """Every data element maps to exactly one valid scale entry, and scale_region(i, j) is exactly the
    set of elements that map to (i, j) (exhaustive, with partial edge blocks where the scheme pads)."""
    cfg = GEOMETRY_CONFIGS[name]
    m, k = (200, 300) if cfg.scheme_row.partial_tiles else (64, 96)
    g = layouts.copy_geometry(cfg, o, m, k)
    if g.per_tensor:
        assert g.scale_index(0, 0) is None and g.scale_valid_shape == (1,)
        return
    r = torch.arange(g.rows).reshape(-1, 1).expand(g.rows, g.cols)
    c = torch.arange(g.cols).reshape(1, -1).expand(g.rows, g.cols)
    i, j = g.scale_index(r, c)
    vr, vc = g.scale_valid_shape
    assert int(i.max()) == vr - 1 and int(j.max()) == vc - 1 and int(i.min()) == 0 and int(j.min()) == 0
    flat = i * vc + j
    counts = torch.bincount(flat.reshape(-1), minlength=vr * vc)
    assert bool((counts > 0).all())  # no valid entry unused
    for ii in range(0, vr, max(1, vr // 7)):
        for jj in range(0, vc, max(1, vc // 7)):
            r0, r1, c0, c1 = g.scale_region(ii, jj)
            mask = (i == ii) & (j == jj)
            region = torch.zeros_like(mask)
            region[r0:r1, c0:c1] = True
            assert torch.equal(mask, region), (ii, jj)


@pytest.mark.parametrize("name", [n for n in GEOMETRY_CONFIGS if not n.startswith("nvfp4")])
@pytest.mark.parametrize("o", ["rowwise", "colwise"])
def test_geometry_scale_index_reproduces_dequantize(name, o):
    """Oracle: decode(code[r, c]) * scale[scale_index(r, c)] at logical(r, c) is the golden dequantize."""
    from reference import casts, dequantize, quantize

    cfg = GEOMETRY_CONFIGS[name]
    m, k = (160, 200) if cfg.scheme_row.partial_tiles else (64, 96)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3)) * 7
    q = quantize(x, cfg, rowwise=True, colwise=True)
    g = layouts.geometry_of(q, o)
    codes = casts.decode(getattr(q, f"{o}_data"), cfg.element_format).to(torch.float64)
    scale = getattr(q, f"{o}_scale")
    sdec = casts.e8m0_decode(scale) if scale.dtype == torch.uint8 else scale
    r = torch.arange(g.rows).reshape(-1, 1).expand(g.rows, g.cols)
    c = torch.arange(g.cols).reshape(1, -1).expand(g.rows, g.cols)
    idx = g.scale_index(r, c)
    s = sdec.reshape(-1)[0].expand(g.rows, g.cols) if idx is None else sdec[idx[0], idx[1]]
    want = codes * s.to(torch.float64)
    if g.transposed:
        want = want.t()
    got = dequantize(q, o, torch.float32).to(torch.float64)
    assert torch.equal(got, want.to(torch.float32).to(torch.float64))


def test_geometry_fields_match_the_golden_output():
    """data / scale / amax shapes and dtypes of every copy are what the golden quantize writes."""
    from reference import quantize

    x = torch.randn(64, 256).to(torch.bfloat16)
    for cfg in GEOMETRY_CONFIGS.values():
        q = quantize(x, cfg, rowwise=True, colwise=True)
        for o in ("rowwise", "colwise"):
            g = layouts.geometry_of(q, o)
            assert tuple(getattr(q, f"{o}_data").shape) == g.data_shape
            assert tuple(getattr(q, f"{o}_scale").shape) == g.scale_padded_shape
            assert getattr(q, f"{o}_scale").dtype == g.scale_dtype
            amax = getattr(q, f"{o}_amax")
            assert (amax is None) == (g.amax_shape is None)
            if amax is not None:
                assert tuple(amax.shape) == g.amax_shape


def test_geometry_validates_its_arguments():
    with pytest.raises(ValueError, match="orientation='diag'"):
        layouts.copy_geometry(QuantConfig("mxfp8"), "diag", 32, 32)
    with pytest.raises(SpecViolation, match="positive int"):
        layouts.copy_geometry(QuantConfig("mxfp8"), "rowwise", 0, 32)


# ---- the GEMM layout table ----------------------------------------------------------------------


def test_gemm_layout_table():
    tn, nn, nt = (layouts.GEMM_LAYOUTS[n] for n in ("TN", "NN", "NT"))
    assert tn.consumes == ("rowwise", "rowwise") and tn.copies == (True, False, True, False)
    assert nn.consumes == ("rowwise", "colwise") and nn.copies == (True, False, False, True)
    assert nt.consumes == ("colwise", "colwise") and nt.copies == (False, True, False, True)
    # out [M=2, N=3] contracting K=5: fprop a [M, K] b [N, K]; dgrad b [K, N]; wgrad a [K, M] b [K, N].
    assert tn.operand_shapes(2, 3, 5) == ((2, 5), (3, 5))
    assert nn.operand_shapes(2, 3, 5) == ((2, 5), (5, 3))
    assert nt.operand_shapes(2, 3, 5) == ((5, 2), (5, 3))
    assert nn.quantize_flags("b") == {"rowwise": False, "colwise": True}
    with pytest.raises(SpecViolation, match=r"layout='TT' is invalid"):
        layouts.gemm_layout("TT")
