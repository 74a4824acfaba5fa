"""Element and scale casts: docs/numerics.md §0.5 and §8 vectors, exhaustive code tables, ml_dtypes oracle."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from reference import casts, fp32
from reference.casts import _arith_cast, _torch_fp8_cast
from reference.formats import E2M1, E4M3, E5M2, UE8M0

NAN, INF = float("nan"), float("inf")
CASTS = {"arith": _arith_cast, "dispatch": casts.saturating_cast}


def f32(vals):
    return torch.tensor(vals, dtype=torch.float32)


def f32_bits(patterns):
    return fp32.from_bits(torch.tensor([p - (1 << 32) if p >= 1 << 31 else p for p in patterns], dtype=torch.int32))


def codes(t):
    return [int(c) for c in t]


# ---- docs/numerics.md §8, byte for byte ----------------------------------------------------------

SECTION8_CASTS = [
    ("sat_e4m3-overflow", E4M3, [448, 464, 465, 1e6, INF, -INF], [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE]),
    ("sat_e4m3-nan-negzero", E4M3, [NAN, -NAN, -0.0], [0x7F, 0x7F, 0x80]),
    (
        "sat_e4m3-subnormal-ties",
        E4M3,
        [2**-9, 2**-10, 2**-10 + 2**-20, 1.5 * 2**-9, 17, 19],
        [0x01, 0x00, 0x01, 0x02, 0x58, 0x5A],
    ),
    (
        "sat_e5m2",
        E5M2,
        [57344, 61439, 61440, INF, NAN, 2**-16, 2**-17, 3 * 2**-17, -0.0],
        [0x7B, 0x7B, 0x7B, 0x7B, 0x7F, 0x01, 0x00, 0x02, 0x80],
    ),
    (
        "e2m1_rn-ties",
        E2M1,
        [0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7],
        [0x0, 0x1, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x7],
    ),
    (
        "e2m1_rn-specials",
        E2M1,
        [-0.25, -0.0, -1e-45, NAN, -NAN, INF, -INF, -5],
        [0x8, 0x8, 0x8, 0x7, 0x7, 0x7, 0xF, 0xE],
    ),
]


@pytest.mark.parametrize("impl", CASTS)
@pytest.mark.parametrize("name,fmt,inp,expected", SECTION8_CASTS, ids=[r[0] for r in SECTION8_CASTS])
def test_section8_cast_vectors(impl, name, fmt, inp, expected):
    assert codes(CASTS[impl](f32(inp), fmt)) == expected


def test_section8_e8m0_up():
    t = f32_bits([0x3E800000, 0x3E800001, 0x3F800000, 0x00400000, 0x00400001, 0x00000001, 0])
    assert codes(casts.e8m0_up(t)) == [125, 126, 127, 0, 1, 0, 0]
    t = torch.cat([f32_bits([0x7F000000, 0x7F7FFFFF]), f32([INF, NAN])])
    assert codes(casts.e8m0_up(t)) == [254, 254, 254, 255]


# ---- exhaustive code tables ------------------------------------------------------------------


def exact_value(code: int, exp_bits: int, man_bits: int, bias: int) -> Fraction:
    """Value of a magnitude code from the bit-field definition, written independently of casts.py."""
    e = code >> man_bits
    m = code & ((1 << man_bits) - 1)
    if e == 0:
        return Fraction(m, 1 << man_bits) * Fraction(2) ** (1 - bias)
    return (1 + Fraction(m, 1 << man_bits)) * Fraction(2) ** (e - bias)


def finite_table(fmt):
    """[(magnitude code, exact value)] for every finite non-negative code of fmt, ascending."""
    return [(c, exact_value(c, fmt.exp_bits, fmt.man_bits, fmt.bias)) for c in range(fmt.max_code + 1)]


def fp32_neighbours(x: float):
    t = torch.tensor([x], dtype=torch.float32)
    return (
        float(torch.nextafter(t, torch.tensor([0.0]))),
        float(torch.nextafter(t, torch.tensor([INF]))),
    )


@pytest.mark.parametrize("impl", CASTS)
@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
def test_exhaustive_grid_midpoints_and_ulps(impl, fmt):
    """Every value, every midpoint (ties to the even code) and one fp32 ulp either side of it."""
    table = finite_table(fmt)
    assert float(table[-1][1]) == fmt.max_finite
    inputs, expected = [], []
    for code, val in table:
        inputs.append(float(val))
        expected.append(code)
    for (c0, v0), (c1, v1) in zip(table[:-1], table[1:], strict=True):
        mid = (v0 + v1) / 2
        assert float(mid) == mid  # every midpoint is exact in fp32
        below, above = fp32_neighbours(float(mid))
        inputs += [float(mid), below, above]
        expected += [c0 if c0 % 2 == 0 else c1, c0, c1]
    sign = fmt.sign_mask
    inp = f32(inputs + [-x for x in inputs])
    exp = expected + [e | sign for e in expected]
    assert codes(CASTS[impl](inp, fmt)) == exp


@pytest.mark.parametrize("impl", CASTS)
@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
def test_saturation_and_underflow_edges(impl, fmt):
    top_mid = fmt.max_finite + (fmt.max_finite - float(finite_table(fmt)[-2][1])) / 2
    inp = f32([top_mid, fmt.max_finite * 1e3, 3.0e38, INF, fmt.min_subnormal / 2, fmt.min_subnormal / 3, 1e-45])
    sat = fmt.max_code
    assert codes(CASTS[impl](inp, fmt)) == [sat, sat, sat, sat, 0, 0, 0]
    assert codes(CASTS[impl](-inp, fmt)) == [sat | fmt.sign_mask] * 4 + [fmt.sign_mask] * 3


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
def test_decode_is_exact_inverse_on_finite_codes(fmt):
    allc = torch.arange(0, 1 << fmt.bits, dtype=torch.uint8)
    vals = casts.decode(allc, fmt)
    for c in range(1 << fmt.bits):
        mag = c & ~fmt.sign_mask
        v = float(vals[c])
        if mag > fmt.max_code:
            assert np.isnan(v) or np.isinf(v), hex(c)
            continue
        ref = exact_value(mag, fmt.exp_bits, fmt.man_bits, fmt.bias)
        assert Fraction(abs(v)) == ref and (np.signbit(v) == bool(c & fmt.sign_mask)), hex(c)
    finite = torch.tensor([c for c in range(1 << fmt.bits) if (c & ~fmt.sign_mask) <= fmt.max_code], dtype=torch.uint8)
    assert torch.equal(casts.saturating_cast(casts.decode(finite, fmt), fmt), finite)


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
def test_decode_of_a_tensor_equals_the_per_code_formula_bits_and_shape(fmt):
    # decode looks codes up in a table built once per format; a random [37, 53] tensor of bytes
    # (high bits set too: only the low fmt.bits count) must give the formula's bits element by element.
    g = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 256, (37, 53), generator=g, dtype=torch.int64).to(torch.uint8)
    got = casts.decode(codes, fmt)
    want = casts._decode_values(codes.to(torch.int64) & ((1 << fmt.bits) - 1), fmt)
    assert got.shape == codes.shape and got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_torch_fast_path_is_in_use_and_agrees():
    """The clamped PyTorch cast is used only after equalling the arithmetic definition on every probe."""
    for fmt in (E4M3, E5M2):
        assert casts.torch_cast_agrees(fmt), f"torch {torch.__version__} clamped {fmt.name} cast disagrees"
        p = casts._grid_probe(fmt)
        assert torch.equal(_torch_fp8_cast(p, fmt), _arith_cast(p, fmt))


# ---- independent oracle: ml_dtypes on 10^6 random fp32 bit patterns --------------------------

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}


@pytest.mark.parametrize("impl", CASTS)
@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1], ids=lambda f: f.name)
def test_ml_dtypes_oracle_random_bit_patterns(impl, fmt):
    rng = np.random.default_rng(20261121)
    n = 1_000_000
    pats = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    # Half the patterns uniform over all fp32; half concentrated in the format's range, where rounding matters.
    near = rng.standard_normal(n // 2).astype(np.float32) * np.float32(fmt.max_finite / 8)
    x = np.concatenate([pats.view(np.float32)[: n // 2], near])
    ours = CASTS[impl](torch.from_numpy(x.copy()), fmt).numpy()
    # ml_dtypes' overflow rule differs (E4M3 -> NaN, E5M2 -> Inf): clamp first (docs/numerics.md §0.2.3).
    clamped = np.clip(x, -fmt.max_finite, fmt.max_finite)
    with np.errstate(invalid="ignore"):  # NaN lanes; compared separately below
        theirs = clamped.astype(ML[fmt.name]).view(np.uint8) & ((1 << fmt.bits) - 1)
    differ = ours != theirs
    # The differences that remain, with their reason:
    #  NaN inputs: docs/numerics.md §0.5/§7.1 - the GPU writes one positive code (E4M3/E5M2 0x7F, E2M1 +6 = 0x7)
    #  for NaN of either sign; ml_dtypes keeps the sign (E4M3 0xFF), uses 0x7E for E5M2, and maps
    #  NaN to -0 / +0 for E2M1, which has no NaN.
    nan = np.isnan(x)
    assert not differ[~nan].any(), f"{int(differ[~nan].sum())} non-NaN differences, first at {x[~nan][differ[~nan]][:5]}"
    assert (ours[nan] == (fmt.nan_code if fmt.nan_code is not None else fmt.max_code)).all()


# ---- E8M0 boundaries, both rules -------------------------------------------------------------


def test_e8m0_up_every_power_of_two_boundary():
    """For every normal 2^k: exactly 2^k -> k+127, one ulp above -> k+128 (saturating at 254)."""
    ks = list(range(-126, 128))
    exact = f32([2.0**k for k in ks])
    above = torch.nextafter(exact, torch.tensor(INF))
    assert codes(casts.e8m0_up(exact)) == [k + 127 for k in ks]
    assert codes(casts.e8m0_up(above)) == [min(k + 128, 254) for k in ks]
    # Subnormal fp32: t <= 2^-127 -> 0, t in (2^-127, 2^-126) -> 1.
    sub = f32_bits([0x00000001, 0x003FFFFF, 0x00400000, 0x00400001, 0x007FFFFF])
    assert codes(casts.e8m0_up(sub)) == [0, 0, 0, 1, 1]


@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=lambda f: f.name)
def test_e8m0_floor_boundaries(elem):
    """floor rule: e = clamp(floor(log2 A) - emax + 127, 0, 254); A = 0 -> 0, inf -> 254, NaN -> 255."""
    assert elem.emax == {"e4m3": 8, "e5m2": 15}[elem.name]
    ks = list(range(-149, 128))
    a = f32([2.0**k for k in ks])
    below = torch.nextafter(a, torch.tensor(0.0))
    exp_a = [min(max(k - elem.emax + 127, 0), 254) for k in ks]
    exp_below = [min(max(k - 1 - elem.emax + 127, 0), 254) for k in ks]
    assert codes(casts.e8m0_floor(a, elem)) == exp_a
    assert codes(casts.e8m0_floor(below[1:], elem)) == exp_below[1:]
    assert codes(casts.e8m0_floor(f32([0.0, INF, NAN]), elem)) == [0, 254, 255]


def test_e8m0_decode_and_multiplier():
    e = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    d = casts.e8m0_decode(e)
    assert fp32.bits(d[:1]).item() == 0x00400000  # D(0) = 2^-127, subnormal
    assert d[1:6].tolist() == [2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert torch.isnan(d[6])
    p = casts.e8m0_multiplier(e)
    assert p[0].item() == 2.0**127 and fp32.bits(p[5:6]).item() == 0x00400000  # P(254) = 2^-127
    assert torch.isnan(p[6])
    assert UE8M0.max_code == 254 and UE8M0.nan_code == 255


# ---- nibble packing --------------------------------------------------------------------------


def test_pack_nibbles_even_element_low():
    c = torch.tensor([[0x7, 0x1, 0x0, 0x2, 0xF, 0x8]], dtype=torch.uint8)
    assert codes(casts.pack_nibbles(c)[0]) == [0x17, 0x20, 0x8F]
    assert torch.equal(casts.unpack_nibbles(casts.pack_nibbles(c)), c)
    r = torch.randint(0, 16, (7, 32), dtype=torch.uint8)
    assert torch.equal(casts.unpack_nibbles(casts.pack_nibbles(r)), r)
    with pytest.raises(ValueError, match="even"):
        casts.pack_nibbles(torch.zeros(3, dtype=torch.uint8))
