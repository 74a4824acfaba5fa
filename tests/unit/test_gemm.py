"""reference.gemm: the three layouts, every method, bias/accumulate, the blockwise FMA order (docs/numerics.md §6).

Operands are hand-built QuantizedTensors (codes and scales placed by this file from the docs/numerics.md
layout text, independently of reference.layouts), so expected outputs come from an exact fp64 /
rational oracle, never from the code under test.
"""

from __future__ import annotations

import zlib
from fractions import Fraction

import pytest
import torch

import reference
from reference import casts
from reference.formats import E2M1, E4M3, FORMATS, QuantConfig
from reference.gemm import (
    METHODS_FOR_SCHEME,
    device_independent,
    exact_representable_ok,
    fp64_sums_exact,
    gemm,
    round_out,
)
from reference.types import QuantizedTensor, SpecViolation

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
GRID = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64
)


def ru(a: int, b: int) -> int:
    return -(-a // b) * b


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def enc(v: torch.Tensor, fmt) -> torch.Tensor:
    codes = casts.saturating_cast(v.to(torch.float32), fmt)
    assert torch.equal(casts.decode(codes, fmt).to(torch.float64), v.to(torch.float64)), "test bug: value off the grid"
    return codes


def pack(codes: torch.Tensor) -> torch.Tensor:
    """docs/numerics.md §5.4: byte j = code[2j] | code[2j+1] << 4."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({F32: torch.int32, BF16: torch.int16, F16: torch.int16}[t.dtype])


def f32_hex(h: int) -> float:
    return float(torch.tensor([h], dtype=torch.int32).view(torch.float32))


# ---- hand-built operands ------------------------------------------------------------------------
# Each builder returns (q, logical_rowwise, logical_colwise): the exact fp64 [M, K] values each copy
# encodes (the copies of 1-D schemes are independent quantizations, so they differ).


def build_per_tensor(cfg, v, sinv):
    fmt = FORMATS[cfg.element]
    codes = enc(v, fmt)
    s = torch.tensor([sinv], dtype=F32)
    amax = v.abs().max().reshape(1).to(F32)
    q = QuantizedTensor(
        cfg,
        tuple(v.shape),
        rowwise_data=codes,
        rowwise_scale=s,
        rowwise_amax=amax,
        colwise_data=codes.t().contiguous(),
        colwise_scale=s.clone(),
        colwise_amax=amax.clone(),
    )  # docs/numerics.md §1: data_T is the byte-exact transpose, same sinv
    return q, v * sinv, v * sinv


def build_block_1d(cfg, vr, sr, vc, sc):
    """§4 1-D: rowwise sinv stored transposed [ceil(K/128), roundup(M,4)] entry [kb, m];
    colwise data [K, M], sinv [ceil(M/128), roundup(K,4)] entry [mb, k]."""
    fmt = FORMATS[cfg.element]
    m, k = vr.shape
    rs = torch.zeros(cdiv(k, 128), ru(m, 4), dtype=F32)
    rs[:, :m] = sr.t()
    cs = torch.zeros(cdiv(m, 128), ru(k, 4), dtype=F32)
    cs[:, :k] = sc
    q = QuantizedTensor(
        cfg,
        (m, k),
        rowwise_data=enc(vr, fmt),
        rowwise_scale=rs,
        colwise_data=enc(vc, fmt).t().contiguous(),
        colwise_scale=cs,
    )
    lr = vr * sr.double().repeat_interleave(128, 1)[:, :k]
    lc = vc * sc.double().repeat_interleave(128, 0)[:m]
    return q, lr, lc


def build_block_2d(cfg, v, s):
    """§4 2-D: sinv [ceil(M/128), roundup(ceil(K/128),4)] entry [mb, kb]; colwise = transposes."""
    fmt = FORMATS[cfg.element]
    m, k = v.shape
    nm, nk = s.shape
    rs = torch.zeros(nm, ru(nk, 4), dtype=F32)
    rs[:, :nk] = s
    cs = torch.zeros(nk, ru(nm, 4), dtype=F32)
    cs[:, :nm] = s.t()
    codes = enc(v, fmt)
    q = QuantizedTensor(
        cfg, (m, k), rowwise_data=codes, rowwise_scale=rs, colwise_data=codes.t().contiguous(), colwise_scale=cs
    )
    lv = v * s.double().repeat_interleave(128, 0)[:m].repeat_interleave(128, 1)[:, :k]
    return q, lv, lv


def build_mxfp8(cfg, vr, er, vc, ec):
    """§3: S_r [roundup(M,128), roundup(K/32,4)] entry [m, kb]; S_c [roundup(M/32,4), roundup(K,128)]
    entry [mb, k]; colwise data [M, K] NOT transposed."""
    fmt = FORMATS[cfg.element]
    m, k = vr.shape
    rs = torch.zeros(ru(m, 128), ru(k // 32, 4), dtype=torch.uint8)
    rs[:m, : k // 32] = er.to(torch.uint8)
    cs = torch.zeros(ru(m // 32, 4), ru(k, 128), dtype=torch.uint8)
    cs[: m // 32, :k] = ec.to(torch.uint8)
    q = QuantizedTensor(
        cfg, (m, k), rowwise_data=enc(vr, fmt), rowwise_scale=rs, colwise_data=enc(vc, fmt), colwise_scale=cs
    )
    lr = vr * torch.pow(2.0, er.double() - 127).repeat_interleave(32, 1)
    lc = vc * torch.pow(2.0, ec.double() - 127).repeat_interleave(32, 0)
    return q, lr, lc


def build_nvfp4(cfg, vr, sr, vc, sc, amax_r, amax_c):
    """§5.9: rowwise data [M, K/2], scales [roundup(M,128), roundup(K/16,4)] entry [m, kb];
    colwise = NVFP4 of x^T: data [K, M/2], scales [roundup(K,128), roundup(M/16,4)] entry [k, mb]."""
    m, k = vr.shape
    rs = torch.zeros(ru(m, 128), ru(k // 16, 4), dtype=torch.uint8)
    rs[:m, : k // 16] = enc(sr, E4M3)
    cs = torch.zeros(ru(k, 128), ru(m // 16, 4), dtype=torch.uint8)
    cs[:k, : m // 16] = enc(sc, E4M3)
    q = QuantizedTensor(
        cfg,
        (m, k),
        rowwise_data=pack(enc(vr, E2M1)),
        rowwise_scale=rs,
        rowwise_amax=torch.tensor([amax_r], dtype=F32),
        colwise_data=pack(enc(vc.t().contiguous(), E2M1)),
        colwise_scale=cs,
        colwise_amax=torch.tensor([amax_c], dtype=F32),
    )
    lr = vr * sr.double().repeat_interleave(16, 1)
    lc = vc * sc.double().repeat_interleave(16, 1).t()
    return q, lr, lc


def random_operand(cfg: QuantConfig, m: int, k: int, g: torch.Generator, amax: float = 2688.0):
    """A random exactly-representable operand: grid values, small power-of-two (or short) scales."""

    def vals():
        return GRID[torch.randint(0, len(GRID), (m, k), generator=g)]

    def pow2(shape, lo=-2, hi=2):
        return torch.pow(2.0, torch.randint(lo, hi + 1, shape, generator=g).double()).to(F32)

    s = cfg.scheme
    if s in ("fp8_current", "fp8_delayed"):
        return build_per_tensor(cfg, vals(), float(pow2((1,))[0]))
    if s == "fp8_block":
        if cfg.is_2d:
            return build_block_2d(cfg, vals(), pow2((cdiv(m, 128), cdiv(k, 128))))
        return build_block_1d(cfg, vals(), pow2((m, cdiv(k, 128))), vals(), pow2((cdiv(m, 128), k)))
    if s == "mxfp8":
        if cfg.is_2d:
            t = torch.randint(125, 130, (m // 32, k // 32), generator=g)
            v = vals()
            return build_mxfp8(cfg, v, t.repeat_interleave(32, 0), v, t.repeat_interleave(32, 1))
        return build_mxfp8(
            cfg,
            vals(),
            torch.randint(125, 130, (m, k // 32), generator=g),
            vals(),
            torch.randint(125, 130, (m // 32, k), generator=g),
        )
    if s == "nvfp4":
        scales = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0], dtype=F32)

        def pick(shape):
            return scales[torch.randint(0, len(scales), shape, generator=g)]

        if cfg.is_2d:
            t = pick((m // 16, k // 16))
            v = vals()
            return build_nvfp4(cfg, v, t.repeat_interleave(16, 0), v, t.t().repeat_interleave(16, 0), amax, amax)
        return build_nvfp4(cfg, vals(), pick((m, k // 16)), vals(), pick((k, m // 16)), amax, amax)
    raise AssertionError(s)


def oracle_y(layout, la, lb):
    """out[m, n] = sum_k A[m, k] B[n, k] from the logical copies (docs/numerics.md §6), exact in fp64 here."""
    a_r, a_c = la
    b_r, b_c = lb
    if layout == "TN":
        return a_r @ b_r.t()
    if layout == "NN":
        return a_r @ b_c  # b logical [K, N], its colwise copy
    return a_c.t() @ b_c  # NT: a logical [K, M], b logical [K, N]


def expected_out(y64, scheme, out_dtype, bias=None, c=None):
    """docs/numerics.md §6 epilogues, for a Y that is exact in fp32 (guarded)."""
    y = y64.to(F32)
    assert torch.equal(y.double(), y64), "test bug: Y not exact in fp32"
    if scheme == "fp8_block":
        if bias is not None:
            y = y + bias.to(F32)
        z = y.to(out_dtype)
        if c is not None:
            z = (c.to(F32) + z.to(F32)).to(out_dtype)  # D = RN_out(C + RN_out(Y)); fp32 then out is innocuous
        return z
    if c is not None:
        y = y + c.to(F32)  # NVFP4: C added in fp32
    if bias is not None:
        y = y + bias.to(F32)
    return y.to(out_dtype)


PAIRS = {
    "current-e4m3": (QuantConfig("fp8_current"), QuantConfig("fp8_current")),
    "delayed-e5m2xe4m3": (QuantConfig("fp8_delayed", element="e5m2"), QuantConfig("fp8_delayed")),
    "block-1Dx2D": (QuantConfig("fp8_block", tile=(1, 128)), QuantConfig("fp8_block", tile=(128, 128))),
    "block-2Dx1D": (QuantConfig("fp8_block", tile=(128, 128)), QuantConfig("fp8_block", tile=(1, 128))),
    "block-1Dx1D-e5m2": (QuantConfig("fp8_block", element="e5m2"), QuantConfig("fp8_block")),
    "mxfp8-e4m3xe5m2": (QuantConfig("mxfp8"), QuantConfig("mxfp8", element="e5m2")),
    "mxfp8-32x32": (QuantConfig("mxfp8", tile=(32, 32)), QuantConfig("mxfp8")),
    "nvfp4-1Dx2D": (QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16))),
    "nvfp4-1Dx1D": (QuantConfig("nvfp4"), QuantConfig("nvfp4")),
}
ALPHA = {(2688.0, 2688.0): 1.0, (2688.0, 21504.0): 8.0, (21504.0, 21504.0): 64.0}  # docs/numerics.md §8 / §5.8


def logical_shapes(layout, m, n, k):
    a = (m, k) if layout in ("TN", "NN") else (k, m)
    b = (n, k) if layout == "TN" else (k, n)
    return a, b


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("pair", list(PAIRS), ids=list(PAIRS))
def test_every_method_matches_exact_oracle(pair, layout):
    """Exact-representable hand-built operands: every method and out dtype returns RN_out(Y) bit for bit."""
    cfg_a, cfg_b = PAIRS[pair]
    m, n, k = (64, 32, 96) if cfg_a.scheme != "fp8_block" else (5, 3, 300)  # blockwise: partial blocks
    g = torch.Generator().manual_seed(zlib.crc32(f"{pair}-{layout}".encode()))
    (am, ak), (bm, bk) = logical_shapes(layout, m, n, k)
    amax_b = 21504.0 if cfg_a.scheme == "nvfp4" else 2688.0
    qa, *la = random_operand(cfg_a, am, ak, g)
    qb, *lb = random_operand(cfg_b, bm, bk, g, amax=amax_b)
    y = oracle_y(layout, la, lb)
    if cfg_a.scheme == "nvfp4":
        y = y * ALPHA[(2688.0, amax_b)]
    ok, why = exact_representable_ok(qa, qb, layout=layout)
    assert ok, why
    methods = ("auto",) + METHODS_FOR_SCHEME[cfg_a.scheme]
    bias = (torch.arange(n, dtype=F32) * 0.25 - 1).to(BF16)
    for out_dtype in (F32, BF16, F16):
        exp = expected_out(y, cfg_a.scheme, out_dtype)
        c = (torch.arange(m * n, dtype=F32).reshape(m, n) * 0.125 - 3).to(out_dtype)
        exp_bc = expected_out(y, cfg_a.scheme, out_dtype, bias=bias, c=c)
        for method in methods:
            got = gemm(qa, qb, layout=layout, out_dtype=out_dtype, method=method)
            assert got.dtype == out_dtype and got.shape == (m, n)
            assert torch.equal(bits(got), bits(exp)), (method, out_dtype)
            got = gemm(qa, qb, layout=layout, out_dtype=out_dtype, method=method, bias=bias, c=c)
            assert torch.equal(bits(got), bits(exp_bc)), (method, out_dtype, "bias+c")


# ---- literal hand-computed cases ------------------------------------------------------------------


def test_per_tensor_literal_product():
    cfg = QuantConfig("fp8_current")
    a, _, _ = build_per_tensor(cfg, torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64), 0.5)
    b, _, _ = build_per_tensor(cfg, torch.tensor([[1.0, 1.0], [2.0, -1.0]], dtype=torch.float64), 2.0)
    # [[1*1+2*1, 1*2-2], [3+4, 6-4]] * 0.5 * 2
    assert gemm(a, b, layout="TN", out_dtype=F32).tolist() == [[3.0, 0.0], [7.0, 2.0]]
    # NT: a logical [K=2, M=2], b logical [K=2, N=2]: out = a^T b
    assert gemm(a, b, layout="NT", out_dtype=F32).tolist() == [[7.0, -2.0], [10.0, -2.0]]
    # NN: a [M=2, K=2] rowwise, b logical [K=2, N=2]: out = a b
    assert gemm(a, b, layout="NN", out_dtype=BF16).tolist() == [[5.0, -1.0], [11.0, -1.0]]


def test_exact_method_rounds_once_from_fp64():
    """Y = 1 + 2^-8 + 2^-32: one RN_bf16 gives 1 + 2^-7; rounding through fp32 first would tie to 1.0."""
    cfg = QuantConfig("fp8_current", element="e5m2")
    v = torch.tensor([[1.0, 2.0**-4, 2.0**-16]], dtype=torch.float64)
    a, _, _ = build_per_tensor(cfg, v, 1.0)
    b, _, _ = build_per_tensor(cfg, v, 1.0)
    assert gemm(a, b, out_dtype=BF16, method="exact").item() == 1.0078125
    assert gemm(a, b, out_dtype=F32, method="exact").item() == 1.00390625
    y = torch.tensor([1.0 + 2.0**-8 + 2.0**-40, -(1.0 + 2.0**-8 + 2.0**-40), 1.0 + 2.0**-8], dtype=torch.float64)
    assert round_out(y, BF16).tolist() == [1.0078125, -1.0078125, 1.0]
    assert round_out(torch.tensor([65520.0 - 2.0**-20, 65520.0], dtype=torch.float64), F16).tolist() == [
        65504.0,
        float("inf"),
    ]


# The blockwise order (§6): K = 1, p = 15, sinv_a = RN(1/13) = 0x3D9D89D9, sinv_b = RN(1/19) = 0x3D579436.
# Rational-arithmetic oracle: a-first RN(RN(15 sa) sb) = 0x3D78BEB4, b-first RN(RN(15 sb) sa) = 0x3D78BEB6,
# one rounding RN(15 sa sb) = 0x3D78BEB5.
SA, SB = f32_hex(0x3D9D89D9), f32_hex(0x3D579436)


def _block_pair(tile_a, tile_b, pa=15.0, pb=1.0, sa=SA, sb=SB):
    ca = QuantConfig("fp8_block", tile=tile_a, pow2_scales=False)
    cb = QuantConfig("fp8_block", tile=tile_b, pow2_scales=False)

    def one(cfg, v, s):
        vv = torch.tensor([[v]], dtype=torch.float64)
        st = torch.tensor([[s]], dtype=F32)
        return (build_block_2d(cfg, vv, st) if cfg.is_2d else build_block_1d(cfg, vv, st, vv, st))[0]

    return one(ca, pa, sa), one(cb, pb, sb)


@pytest.mark.parametrize(
    "tiles,expected",
    [
        (((1, 128), (1, 128)), 0x3D78BEB4),
        (((1, 128), (128, 128)), 0x3D78BEB4),
        (((128, 128), (1, 128)), 0x3D78BEB6),
    ],
    ids=["1Dx1D-a-first", "1Dx2D-a-first", "2Dx1D-b-first"],
)
def test_blockwise_order_scale_order(tiles, expected):
    a, b = _block_pair(*tiles)
    for layout in ("TN", "NN", "NT"):
        got = gemm(a, b, layout=layout, out_dtype=F32, method="blockwise_order")
        assert got.view(torch.int32).item() == expected
        assert gemm(a, b, layout=layout, out_dtype=F32, method="auto").view(torch.int32).item() == expected
        assert gemm(a, b, layout=layout, out_dtype=F32, method="exact").view(torch.int32).item() == 0x3D78BEB5


def _rn32(x: Fraction) -> Fraction:
    """Correctly rounded fp32 (RNE) of a rational, by exact comparison with the neighbours."""
    f = torch.tensor(float(x), dtype=F32)
    cands = [f, torch.nextafter(f, torch.tensor(float("inf"))), torch.nextafter(f, torch.tensor(float("-inf")))]
    return min(
        (Fraction(float(c)) for c in cands),
        key=lambda c: (abs(c - x), int(torch.tensor(float(c), dtype=F32).view(torch.int32)) & 1),
    )


def test_blockwise_order_fma_chain_matches_rational_oracle():
    """Three 128-deep K blocks with fp32 (non-pow2) scales: y <- FMA32(RN(p sa), sb, y), blocks in order."""
    g = torch.Generator().manual_seed(7)
    m, n, k = 3, 2, 3 * 128
    ca = QuantConfig("fp8_block", tile=(1, 128), pow2_scales=False)
    inv = torch.tensor([1.0 / d for d in (3, 5, 7, 11, 13, 17, 19, 23)], dtype=F32)
    va = GRID[torch.randint(0, len(GRID), (m, k), generator=g)]
    vb = GRID[torch.randint(0, len(GRID), (n, k), generator=g)]
    sa = inv[torch.randint(0, 8, (m, 3), generator=g)]
    sb = inv[torch.randint(0, 8, (n, 3), generator=g)]
    qa = build_block_1d(ca, va, sa, va, torch.ones(1, k, dtype=F32))[0]
    qb = build_block_1d(ca, vb, sb, vb, torch.ones(1, k, dtype=F32))[0]
    got = gemm(qa, qb, layout="TN", out_dtype=F32, method="blockwise_order")
    for i in range(m):
        for j in range(n):
            y = Fraction(0)
            for kb in range(3):
                p = sum(Fraction(float(va[i, t])) * Fraction(float(vb[j, t])) for t in range(128 * kb, 128 * kb + 128))
                t1 = _rn32(_rn32(p) * Fraction(float(sa[i, kb])))
                y = _rn32(t1 * Fraction(float(sb[j, kb])) + y)
            assert Fraction(float(got[i, j])) == y, (i, j)


def test_blockwise_order_rejects_2d_by_2d():
    a, b = _block_pair((128, 128), (128, 128))
    for method in ("auto", "exact", "blockwise_order"):
        with pytest.raises(SpecViolation, match="2-D x 2-D"):
            gemm(a, b, method=method)


def _y_one_plus_2m8(scheme):
    """Operands with Y = 1 + 2^-8 exactly (a bf16 midpoint), K = 2 (fp8_block) or 32 (nvfp4)."""
    if scheme == "fp8_block":
        cfg = QuantConfig("fp8_block")
        one = torch.ones(1, 1, dtype=F32)
        va = torch.tensor([[1.0, 2.0**-8]], dtype=torch.float64)
        vb = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
        return build_block_1d(cfg, va, one, va, torch.ones(1, 2, dtype=F32))[0], build_block_1d(
            cfg, vb, one, vb, torch.ones(1, 2, dtype=F32)
        )[0]
    cfg = QuantConfig("nvfp4")
    va = torch.zeros(16, 32, dtype=torch.float64)
    va[0, 0], va[0, 16] = 1.0, 0.5
    vb = torch.zeros(16, 32, dtype=torch.float64)
    vb[0, 0], vb[0, 16] = 1.0, 1.0
    sa = torch.ones(16, 2, dtype=F32)
    sa[0, 1] = 2.0**-7
    ones_c = torch.ones(32, 1, dtype=F32)
    qa = build_nvfp4(cfg, va, sa, va, ones_c, 2688.0, 2688.0)[0]
    qb = build_nvfp4(cfg, vb, torch.ones(16, 2, dtype=F32), vb, ones_c, 2688.0, 2688.0)[0]
    return qa, qb


@pytest.mark.parametrize(
    "scheme,expected", [("fp8_block", 1.0), ("nvfp4", 1.0078125)], ids=["block-RNout-then-C", "nvfp4-C-in-fp32"]
)
def test_accumulate_order_literal(scheme, expected):
    """C = 2^-8: fp8_block RN_bf16(C + RN_bf16(Y)) = RN(1 + 2^-8) = 1.0 (tie to even); NVFP4 RN_bf16(Y + C) = 1 + 2^-7."""
    a, b = _y_one_plus_2m8(scheme)
    c = torch.zeros(a.m, b.m, dtype=BF16)
    c[0, 0] = 2.0**-8
    for method in ("auto", "exact"):
        out = gemm(a, b, out_dtype=BF16, c=c, method=method)
        assert out[0, 0].item() == expected
    assert gemm(a, b, out_dtype=F32, c=c.float())[0, 0].item() == 1.0 + 2.0**-7
    assert gemm(a, b, out_dtype=BF16)[0, 0].item() == 1.0  # without C: RN_bf16(1 + 2^-8) ties to even


def test_bias_added_in_fp32_before_rn_out():
    """fp8_block: RN(1 + 2^-8 + 2^-30) = 1 + 2^-8 in fp32, then RN_bf16 ties to 1.0 (one rounding would give 1 + 2^-7)."""
    a, b = _y_one_plus_2m8("fp8_block")
    bias = torch.tensor([2.0**-30], dtype=F32)
    for method in ("blockwise_order", "exact"):
        assert gemm(a, b, out_dtype=BF16, bias=bias, method=method).item() == 1.0
        assert gemm(a, b, out_dtype=F32, bias=bias, method=method).item() == 1.0 + 2.0**-8
    bias2 = torch.tensor([0.25], dtype=BF16)
    assert gemm(a, b, out_dtype=F32, bias=bias2).item() == 1.25 + 2.0**-8


def test_nvfp4_alpha_applied():
    """docs/numerics.md §8: A_g,a = A_g,b = 21504 gives alpha = 64."""
    cfg = QuantConfig("nvfp4")
    v = torch.zeros(16, 16, dtype=torch.float64)
    v[0, 0], v[0, 1] = 1.5, 3.0
    s = torch.ones(16, 1, dtype=F32)
    q = build_nvfp4(cfg, v, s, v, torch.ones(16, 1, dtype=F32), 21504.0, 21504.0)[0]
    for method in ("auto", "exact", "block_sum"):
        out = gemm(q, q, out_dtype=F32, method=method)
        assert out[0, 0].item() == (1.5 * 1.5 + 3.0 * 3.0) * 64
        assert out[1:].abs().sum().item() == 0


# ---- exact-representable checker -------------------------------------------------------------------


def test_exact_representable_ok_rejects():
    cfg = QuantConfig("fp8_current")
    g = torch.Generator().manual_seed(1)
    # 2^24 q exceeded: q = 2^-18 (E4M3 subnormal times itself), and sum |t| is about 2^16.
    v = torch.full((2, 256), 448.0, dtype=torch.float64)
    v[0, 0] = 2.0**-9
    a, _, _ = build_per_tensor(cfg, v, 1.0)
    ok, why = exact_representable_ok(a, a)
    assert not ok and "exceeds" in why
    # NVFP4 with a non-power-of-two alpha (A_g = 1000).
    n = QuantConfig("nvfp4")
    qa, _, _ = random_operand(n, 16, 16, g, amax=1000.0)
    ok, why = exact_representable_ok(qa, qa)
    assert not ok and "alpha" in why
    # Per-tensor sinv whose product is not exact in fp32.
    w = torch.ones(1, 2, dtype=torch.float64)
    pa, _, _ = build_per_tensor(cfg, w, SA)
    pb, _, _ = build_per_tensor(cfg, w, SB)
    assert not exact_representable_ok(pa, pb)[0]
    # Fast accumulation tightens the bound to 2^13 q.
    x = torch.ones(1, 2**14, dtype=torch.float64)
    qx, _, _ = build_per_tensor(cfg, x, 1.0)
    assert exact_representable_ok(qx, qx)[0]
    assert not exact_representable_ok(qx, qx, fast_accum=True)[0]


# ---- device independence (fp64 sums exact) -----------------------------------------------------------


def test_fp64_sums_exact_accepts_fp8_sums_and_rejects_wide_spans_and_long_products():
    cfg = QuantConfig("fp8_current")
    g = torch.Generator().manual_seed(5)
    # E4M3 values times E4M3 values: lsb 2^-18, K = 256 sums of |t| <= 448^2 * 256 < 2^34 -> exact.
    qa, _, _ = random_operand(cfg, 8, 256, g)
    qb, _, _ = random_operand(cfg, 4, 256, g)
    ok, why = fp64_sums_exact(qa, qb)
    assert ok, why
    # All-zero operand: Y = 0 in every order.
    z, _, _ = build_per_tensor(cfg, torch.zeros(2, 4, dtype=torch.float64), 1.0)
    assert fp64_sums_exact(z, z) == (True, "an operand is all zero")
    # MXFP8 blocks 2^-80 apart: the K sums span more than 52 bits, so the order could matter.
    mx = QuantConfig("mxfp8")
    v = torch.ones(32, 64, dtype=torch.float64)
    v[:, :32] = 2.0**-80 * 1.5
    qm = reference.quantize(v.to(torch.float32), mx)
    ok, why = fp64_sums_exact(qm, qm)
    assert not ok and "52 bits" in why
    # fp8_block with fp32 (non-power-of-two) scales, method "exact": 28-bit x 28-bit products round.
    fb = QuantConfig("fp8_block", pow2_scales=False)
    x = torch.randn(4, 128, generator=g) * 3.3
    y = torch.randn(4, 128, generator=g) * 7.1
    qx, qy = reference.quantize(x, fb), reference.quantize(y, fb)
    ok, why = fp64_sums_exact(qx, qy, method="exact")
    assert not ok and "significands" in why
    # blockwise_order sums the unscaled codes only: exact for the same operands.
    assert fp64_sums_exact(qx, qy, method="blockwise_order")[0]
    assert fp64_sums_exact(qx, qy)[0]  # auto -> blockwise_order for fp8_block


# ---- operand compatibility ------------------------------------------------------------------------


def test_compatibility_errors_name_the_field():
    g = torch.Generator().manual_seed(3)
    cur = QuantConfig("fp8_current")
    a, _, _ = random_operand(cur, 4, 8, g)
    b, _, _ = random_operand(cur, 4, 6, g)
    with pytest.raises(SpecViolation, match="K mismatch"):
        gemm(a, b)
    m8, _, _ = random_operand(QuantConfig("mxfp8"), 32, 32, g)
    c8, _, _ = random_operand(cur, 32, 32, g)
    with pytest.raises(SpecViolation, match="a.config.scheme"):
        gemm(m8, c8)
    m8.colwise_data = None
    with pytest.raises(SpecViolation, match="b.colwise_data is None"):
        gemm(m8, m8, layout="NN")
    with pytest.raises(SpecViolation, match="layout"):
        gemm(a, a, layout="TT")
    with pytest.raises(SpecViolation, match="method"):
        gemm(a, a, method="block_sum")
    with pytest.raises(SpecViolation, match="bias"):
        gemm(a, a, bias=torch.zeros(5))
    with pytest.raises(SpecViolation, match="c must be"):
        gemm(a, a, c=torch.zeros(4, 5))
    a.rowwise_scale = torch.ones(2)
    with pytest.raises(SpecViolation, match="a.rowwise_scale has shape"):
        gemm(a, b)


def test_rht_on_one_operand_only_is_rejected():
    g = torch.Generator().manual_seed(4)
    x, _, _ = random_operand(QuantConfig("nvfp4", rht=True), 32, 32, g)
    w, _, _ = random_operand(QuantConfig("nvfp4"), 32, 32, g)
    with pytest.raises(SpecViolation, match="Hadamard"):
        gemm(x, w, layout="NT")
    assert gemm(x, w, layout="TN", out_dtype=F32).shape == (32, 32)  # rowwise copies are plain
    assert gemm(x, x, layout="NT", out_dtype=F32).shape == (32, 32)  # wgrad: both in the RHT domain


# ---- end to end with the scheme modules (reference.quantize) -----------------------------------------


E2E_PAIRS = {
    "current": (QuantConfig("fp8_current"), QuantConfig("fp8_current")),
    "current-pow2-hybrid": (
        QuantConfig("fp8_current", element="e5m2", pow2_scales=True),
        QuantConfig("fp8_current", pow2_scales=True),
    ),
    "delayed": (QuantConfig("fp8_delayed"), QuantConfig("fp8_delayed")),
    "block-1Dx2D": (QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))),
    "block-2Dx1D-fp32scale": (
        QuantConfig("fp8_block", tile=(128, 128), pow2_scales=False),
        QuantConfig("fp8_block", pow2_scales=False),
    ),
    "block-1Dx1D-e5m2": (QuantConfig("fp8_block", element="e5m2"), QuantConfig("fp8_block")),
    "mxfp8": (QuantConfig("mxfp8"), QuantConfig("mxfp8", element="e5m2")),
    "mxfp8-32x32-floor": (QuantConfig("mxfp8", e8m0_rule="floor"), QuantConfig("mxfp8", tile=(32, 32))),
    "nvfp4-1Dx2D": (QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16))),
    "nvfp4-1Dx1D": (QuantConfig("nvfp4"), QuantConfig("nvfp4")),
}


def _q(x, cfg, orientation):
    return reference.quantize(x, cfg, rowwise=orientation == "rowwise", colwise=orientation == "colwise")


def _e2e_shape(cfg):
    return (64, 32, 96) if cfg.scheme != "fp8_block" else (130, 20, 300)


@pytest.mark.parametrize("pair", list(E2E_PAIRS), ids=list(E2E_PAIRS))
def test_e2e_colwise_layouts_equal_tn_on_transposed_inputs(pair):
    """colwise(X) is rowwise(X^T) in every scheme (no RHT), so NN and NT equal TN on transposed inputs, bitwise."""
    cfg_a, cfg_b = E2E_PAIRS[pair]
    m, n, k = _e2e_shape(cfg_a)
    g = torch.Generator().manual_seed(zlib.crc32(pair.encode()))
    a = torch.randn(m, k, generator=g)
    b_log = torch.randn(k, n, generator=g) * 3  # logical B of NN / NT: [K, N]
    tn_b = _q(b_log.t().contiguous(), cfg_b, "rowwise")
    tn_a = _q(a, cfg_a, "rowwise")
    for method in ("auto", "exact"):
        ref = gemm(tn_a, tn_b, layout="TN", out_dtype=F32, method=method)
        nn = gemm(tn_a, _q(b_log, cfg_b, "colwise"), layout="NN", out_dtype=F32, method=method)
        nt = gemm(
            _q(a.t().contiguous(), cfg_a, "colwise"),
            _q(b_log, cfg_b, "colwise"),
            layout="NT",
            out_dtype=F32,
            method=method,
        )
        assert torch.equal(bits(nn), bits(ref)), method
        assert torch.equal(bits(nt), bits(ref)), method


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("pair", list(E2E_PAIRS), ids=list(E2E_PAIRS))
def test_e2e_exact_close_to_matmul_of_dequantized(pair, layout):
    """'exact' and the scheme-native method agree with fp64 X_hat @ W_hat^T (dequantize rounds each element once)."""
    cfg_a, cfg_b = E2E_PAIRS[pair]
    m, n, k = _e2e_shape(cfg_a)
    g = torch.Generator().manual_seed(zlib.crc32(f"{pair}{layout}".encode()))
    (am, ak), (bm, bk) = logical_shapes(layout, m, n, k)
    xa, xb = torch.randn(am, ak, generator=g), torch.randn(bm, bk, generator=g)
    oa, ob = {"TN": ("rowwise", "rowwise"), "NN": ("rowwise", "colwise"), "NT": ("colwise", "colwise")}[layout]
    qa, qb = _q(xa, cfg_a, oa), _q(xb, cfg_b, ob)
    da = reference.dequantize(qa, oa).double()
    db = reference.dequantize(qb, ob).double()
    ya, yb = (da, da.abs()) if layout != "NT" else (da.t(), da.abs().t())
    yb_, ybabs = (db.t(), db.abs().t()) if layout == "TN" else (db, db.abs())
    truth = ya @ yb_
    scale = yb @ ybabs
    # Each dequantized element is within 2^-23 (relative) of dec * scale (NVFP4: g vs alpha, 1 ulp each).
    tol = scale * 2.0**-20 + truth.abs() * 2.0**-23
    for method in ("exact", "auto"):
        got = gemm(qa, qb, layout=layout, out_dtype=F32, method=method).double()
        assert bool(((got - truth).abs() <= tol).all()), method
        assert float((got - truth).abs().max()) < 1e-3 * float(scale.max())


def _lossless_fp8_input(shape, g):
    """Integers in [-8, 8]: every FP8 scheme here quantizes them exactly (pow2 / E8M0 / unit scales)."""
    return torch.randint(-8, 9, shape, generator=g).to(F32)


def _lossless_nvfp4_input(shape, g):
    """16x16 tiles of grid values times 2^j with +-6 on each tile's diagonal (every row and column block
    then has amax 6 * 2^j, so s_blk = 2^j exactly); one diagonal-only tile times 448 makes A_g = 2688
    (alpha = 1). j in [2, 5] keeps every scaled product a multiple of q = 4 and sum |t| <= 2^24 q."""
    r, c = shape
    v = GRID[torch.randint(0, len(GRID), shape, generator=g)].to(F32)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    eye = torch.eye(16).repeat(r // 16, c // 16).bool()
    v = torch.where(eye, 6.0 * sign, v)
    v[:16, :16] = torch.where(eye[:16, :16], v[:16, :16], torch.zeros(16, 16))
    mult = torch.pow(2.0, torch.randint(2, 6, (r // 16, c // 16), generator=g).float())
    mult[0, 0] = 448.0
    return v * mult.repeat_interleave(16, 0).repeat_interleave(16, 1)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize(
    "pair",
    [p for p in E2E_PAIRS if p not in ("current", "block-2Dx1D-fp32scale")],
    ids=[p for p in E2E_PAIRS if p not in ("current", "block-2Dx1D-fp32scale")],
)
def test_e2e_lossless_inputs_every_method_exact(pair, layout):
    """Inputs that quantize losslessly: every method returns RN_out of the exact product, bit for bit."""
    cfg_a, cfg_b = E2E_PAIRS[pair]
    m, n, k = _e2e_shape(cfg_a)
    g = torch.Generator().manual_seed(zlib.crc32(f"lossless{pair}{layout}".encode()))
    (am, ak), (bm, bk) = logical_shapes(layout, m, n, k)
    make = _lossless_nvfp4_input if cfg_a.scheme == "nvfp4" else _lossless_fp8_input
    xa, xb = make((am, ak), g), make((bm, bk), g)
    oa, ob = {"TN": ("rowwise", "rowwise"), "NN": ("rowwise", "colwise"), "NT": ("colwise", "colwise")}[layout]
    qa, qb = _q(xa, cfg_a, oa), _q(xb, cfg_b, ob)
    assert torch.equal(reference.dequantize(qa, oa).double(), xa.double()), "input did not quantize losslessly"
    assert torch.equal(reference.dequantize(qb, ob).double(), xb.double()), "input did not quantize losslessly"
    y = oracle_y(layout, (xa.double(), xa.double()), (xb.double(), xb.double()))
    ok, why = exact_representable_ok(qa, qb, layout=layout)
    assert ok, why
    for out_dtype in (F32, BF16):
        exp = y.to(F32).to(out_dtype)
        assert torch.equal(y.to(F32).double(), y)
        for method in ("auto",) + METHODS_FOR_SCHEME[cfg_a.scheme]:
            got = gemm(qa, qb, layout=layout, out_dtype=out_dtype, method=method)
            assert torch.equal(bits(got), bits(exp)), (method, out_dtype)


def test_block_sum_adds_block_terms_in_k_order_and_is_device_independent():
    """docs/numerics.md §6: the block terms 2^60, 1, -2^60 (three MXFP8 blocks) are added in K order, so
    the 1 is absorbed by 2^60 and Y = 0 exactly (the true sum is 1; another order would give 1)."""
    mx = QuantConfig("mxfp8")
    x = torch.zeros(32, 96)
    x[:, 0], x[:, 32], x[:, 64] = 2.0**60, 1.0, -(2.0**60)
    qa = reference.quantize(x, mx)
    qb = reference.quantize(torch.ones(32, 96), mx)
    y = gemm(qa, qb, out_dtype=torch.float32)
    assert bool((y == 0.0).all())
    # The K sum rounds, so fp64_sums_exact refuses; the E4M3 block terms are exact and their order fixed.
    assert not fp64_sums_exact(qa, qb)[0]
    ok, why = device_independent(qa, qb)
    assert ok and "block terms" in why
    # Swapping the second and third blocks changes the sequential sum: (2^60 - 2^60) + 1 = 1.
    x2 = x.clone()
    x2[:, 32], x2[:, 64] = x[:, 64], x[:, 32]
    assert bool((gemm(reference.quantize(x2, mx), qb, out_dtype=torch.float32) == 1.0).all())


def test_device_independent_refuses_e5m2_blocks_with_wide_spans_and_non_finite_operands():
    e5 = QuantConfig("mxfp8", element="e5m2")
    x = torch.ones(32, 64)
    x[:, :32] = 2.0**-100
    q = reference.quantize(x, e5)
    ok, why = device_independent(q, q)
    assert not ok and "can round" in why
    mx = QuantConfig("mxfp8")
    n = torch.ones(32, 64)
    n[0, 3] = float("nan")  # E4M3 keeps NaN (its code 0x7F)
    qn = reference.quantize(n, mx)
    assert device_independent(qn, qn) == (False, "an operand holds a non-finite value")
    # Exact sums (all ones) need no block argument.
    qo = reference.quantize(torch.ones(32, 64), mx)
    assert device_independent(qo, qo)[0]
