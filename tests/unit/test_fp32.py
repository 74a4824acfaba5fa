"""fp32 arithmetic rules: true division and FMA32 emulation (docs/numerics.md §0.1, §0.2.2, §0.2.6)."""

from fractions import Fraction

import numpy as np
import torch

from reference import fp32


def rn32(q: Fraction) -> float:
    """Correctly rounded fp32 of an exact rational, by bisection on the fp32 grid (independent oracle)."""
    f = np.float32(float(q))  # float(q) is RN to fp64; fix the possible double rounding below
    lo = np.nextafter(f, np.float32(-np.inf), dtype=np.float32)
    hi = np.nextafter(f, np.float32(np.inf), dtype=np.float32)
    best = min((lo, f, hi), key=lambda c: (abs(Fraction(float(c)) - q), int(np.array(c).view(np.uint32)) & 1))
    return float(best)


def test_division_is_true_ieee_not_reciprocal_multiply():
    # docs/numerics.md §0.2.2: RN(448/3) = 0x43155555; reciprocal-then-multiply gives ...56.
    s = fp32.div(448.0, torch.tensor([3.0]))
    assert fp32.bits(s).item() == 0x43155555
    assert fp32.bits(fp32.div(1.0, s)).item() == 0x3BDB6DB7


def test_reciprocal_constants():
    assert fp32.bits(torch.tensor([fp32.reciprocal_const(448.0)])).item() == 0x3B124925
    assert fp32.bits(torch.tensor([fp32.reciprocal_const(57344.0)])).item() == 0x37924925
    assert fp32.bits(torch.tensor([fp32.reciprocal_const(6.0)])).item() == 0x3E2AAAAB
    assert fp32.bits(torch.tensor([fp32.reciprocal_const(2688.0)])).item() == 0x39C30C31
    assert fp32.bits(torch.tensor([fp32.reciprocal_const(7225344.0)])).item() == 0x34149B93


def test_fma32_matches_exact_rational_rounding_on_random_and_tie_cases():
    g = torch.Generator().manual_seed(7)
    a = torch.randn(4000, generator=g) * torch.exp2(torch.randint(-20, 20, (4000,), generator=g).float())
    b = torch.randn(4000, generator=g)
    c = torch.randn(4000, generator=g) * torch.exp2(torch.randint(-20, 20, (4000,), generator=g).float())
    # Constructed double-rounding traps: a*b + c lands just beside an fp32 midpoint in fp64.
    one_p = 1.0 + 2.0**-23
    traps_a = torch.tensor([one_p, one_p, 1.0 + 2.0**-12, -(1.0 + 2.0**-12)], dtype=torch.float32)
    traps_b = torch.tensor([one_p, -one_p, 1.0 + 2.0**-12, 1.0 + 2.0**-12], dtype=torch.float32)
    traps_c = torch.tensor([2.0**-24, -(2.0**-24), 2.0**-25, -(2.0**-25)], dtype=torch.float32)
    a, b, c = torch.cat([a, traps_a]), torch.cat([b, traps_b]), torch.cat([c, traps_c])
    got = fp32.fma32(a, b, c)
    for i in range(a.numel()):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        assert float(got[i]) == rn32(exact), (float(a[i]), float(b[i]), float(c[i]))


def test_fma32_differs_from_two_roundings_where_it_should():
    a = torch.tensor([1.0 + 2.0**-12], dtype=torch.float32)
    c = torch.tensor([-(1.0 + 2.0**-11)], dtype=torch.float32)
    # a*a = 1 + 2^-11 + 2^-24 exactly; FMA keeps the 2^-24, the unfused product drops it.
    assert float(fp32.fma32(a, a, c)) == 2.0**-24
    assert float(a * a + c) == 0.0
