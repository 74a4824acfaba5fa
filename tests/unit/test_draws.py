"""harness.draws: known answers from the published Philox4x32-10 vector (docs/numerics.md §5.7) and
Python-int Philox, counter layout (prefix / chunk independence), statistics with sound bounds, and the
hand-written log / exp / cos / sin against math."""

from __future__ import annotations

import math

import pytest
import torch

from harness import draws
from harness.draws import Draws
from reference.philox import philox4x32, seed_key

# docs/numerics.md §5.7 known answer: counter 0, key 0 (seed 0) -> these four words.
KA = (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)


def _words(seed: int, j: int, call: int) -> tuple[int, ...]:
    """Philox words of counter (j, 0, call, 0) with Python ints (no tensors)."""
    return philox4x32((j, 0, call, 0), seed_key(seed))


def test_uniform_known_answer_from_the_published_vector():
    u = Draws(0).uniform(2)
    want0 = (KA[0] * 2**21 + (KA[1] >> 11)) / 2**53  # exact in float64 (53-bit integer / 2^53)
    want1 = (KA[2] * 2**21 + (KA[3] >> 11)) / 2**53
    assert u.tolist() == [want0, want1]


def test_integers_sign_bits_bernoulli_known_answers_and_call_numbers():
    d = Draws(0)
    assert d.integers(0, 9, 4).tolist() == [(w * 10) >> 32 for w in KA]  # call 0
    bits = d.sign_bits(130).tolist()  # call 1: counters 0 and 1
    w0, w1 = _words(0, 0, 1), _words(0, 1, 1)
    want = [(w0[i] >> b) & 1 for i in range(4) for b in range(32)] + [w1[0] & 1, (w1[0] >> 1) & 1]
    assert bits == want
    got = d.bernoulli(0.25, 5).tolist()  # call 2: words of counters 0 and 1
    w0, w1 = _words(0, 0, 2), _words(0, 1, 2)
    assert got == [w < 2**30 for w in (*w0, w1[0])]
    assert d.integer(-3, 3) == -3 + ((_words(0, 0, 3)[0] * 7) >> 32)  # call 3, on the host
    assert d.calls == 4


def test_normal_known_answer_box_muller():
    seed = 12345
    z = Draws(seed).normal(2).tolist()
    w = _words(seed, 0, 0)
    u1 = 1 - (w[0] * 2**21 + (w[1] >> 11)) / 2**53
    u2 = (w[2] * 2**21 + (w[3] >> 11)) / 2**53
    r = math.sqrt(-2 * math.log(u1))
    for got, want in zip(z, (r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)), strict=True):
        assert got == pytest.approx(want, rel=1e-13, abs=1e-15)


@pytest.mark.parametrize("method", ["uniform", "normal", "sign_bits", "integers", "bernoulli"])
def test_values_depend_on_the_element_index_only(method, monkeypatch):
    def draw(n):
        d = Draws(7)
        if method == "integers":
            return d.integers(-5, 100, n)
        if method == "bernoulli":
            return d.bernoulli(0.5, n)
        return getattr(d, method)(n)

    full = draw(5000)
    monkeypatch.setattr(draws, "CPU_CHUNK", 3)  # many chunks, the last one partial
    chunked = draw(5000)
    assert torch.equal(full, chunked)
    assert torch.equal(draw(1234), full[:1234])  # a prefix is the same draw
    d = Draws(7)
    assert torch.equal(d.uniform((50, 100)).reshape(-1), Draws(7).uniform(5000))


def test_calls_and_seeds_are_independent_streams():
    d = Draws(1)
    a, b = d.uniform(1000), d.uniform(1000)
    c = Draws(2).uniform(1000)
    assert not torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.float64 and a.device.type == "cpu"


N_STAT = 1 << 20


def test_uniform_is_uniform():
    u = Draws(3).uniform(N_STAT)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert bool((u * 2.0**53 == torch.floor(u * 2.0**53)).all())  # multiples of 2^-53
    # mean 1/2, sd of the mean sqrt(1/12 / N): 6 sigma
    assert abs(float(u.mean()) - 0.5) < 6 * math.sqrt(1 / 12 / N_STAT)
    # chi-square over 256 bins (255 dof: mean 255, sd sqrt(510) ~ 22.6): below mean + 6 sd
    counts = torch.bincount((u * 256).to(torch.int64), minlength=256).to(torch.float64)
    e = N_STAT / 256
    assert float(((counts - e) ** 2 / e).sum()) < 255 + 6 * math.sqrt(2 * 255)


def test_normal_moments_and_cdf():
    z = Draws(4).normal(N_STAT)
    n = N_STAT
    # sd of the sample mean 1/sqrt(n); of the mean of z^2: sqrt(2/n); of z^3: sqrt(15/n); of z^4: sqrt(96/n)
    assert abs(float(z.mean())) < 6 / math.sqrt(n)
    assert abs(float((z**2).mean()) - 1) < 6 * math.sqrt(2 / n)
    assert abs(float((z**3).mean())) < 6 * math.sqrt(15 / n)
    assert abs(float((z**4).mean()) - 3) < 6 * math.sqrt(96 / n)
    for x in (-2.0, -1.0, 0.0, 0.5, 1.5, 3.0):
        p = 0.5 * math.erfc(-x / math.sqrt(2))
        frac = float((z <= x).to(torch.float64).mean())
        assert abs(frac - p) < 6 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (-8, 8), (1, 63), (0, 255), (-64, 64), (6, 12)])
def test_integers_in_range_every_value_hit_and_balanced(lo, hi):
    n = hi - lo + 1
    x = Draws(5).integers(lo, hi, 200 * n, dtype=torch.int32)
    assert x.dtype == torch.int32
    assert int(x.min()) == lo and int(x.max()) == hi
    counts = torch.bincount((x - lo).to(torch.int64), minlength=n).to(torch.float64)
    assert bool((counts > 0).all())
    e = 200.0
    dof = max(n - 1, 1)
    assert float(((counts - e) ** 2 / e).sum()) < dof + 6 * math.sqrt(2 * dof) + 6


def test_integer_range_checks():
    with pytest.raises(ValueError):
        Draws(0).integers(0, 2**31, 3)
    with pytest.raises(ValueError):
        Draws(0).integer(1, 0)
    with pytest.raises(ValueError):
        Draws(0).bernoulli(0.1, 3)  # not a multiple of 2^-32


def test_bernoulli_and_signs_frequencies():
    b = Draws(6).bernoulli(0.125, N_STAT)
    assert b.dtype == torch.bool
    p = float(b.to(torch.float64).mean())
    assert abs(p - 0.125) < 6 * math.sqrt(0.125 * 0.875 / N_STAT)
    s = Draws(6).signs(N_STAT)
    assert set(s.unique().tolist()) == {-1.0, 1.0}
    assert abs(float(s.mean())) < 6 / math.sqrt(N_STAT)


@pytest.mark.parametrize(("k", "n"), [(0, 5), (1, 1), (7, 7), (10, 1000), (65, 65536), (1000, 2 * 3 * 5 * 7 * 11 * 13)])
def test_positions_are_distinct_and_in_range(k, n):
    d = Draws(8)
    p = d.positions(k, n)
    assert p.dtype == torch.int64 and p.numel() == k
    assert p.unique().numel() == k
    assert k == 0 or (int(p.min()) >= 0 and int(p.max()) < n)
    if k == n:
        assert sorted(p.tolist()) == list(range(n))
    with pytest.raises(ValueError):
        d.positions(n + 1, n)


def _rel(got: torch.Tensor, want: list[float]) -> float:
    w = torch.tensor(want, dtype=torch.float64)
    err = (got - w).abs()
    assert bool((err[w == 0] == 0).all())
    nz = w != 0
    return float((err[nz] / w[nz].abs()).max())


def test_log_matches_math_log():
    grid = torch.cat([
        torch.linspace(1e-3, 4.0, 40001, dtype=torch.float64),
        torch.logspace(-300, 300, 20001, dtype=torch.float64),
        torch.tensor([1.0, 2.0**-53, 1 - 2.0**-53, 1 + 2.0**-52, 0.5, 2.0, math.sqrt(0.5), math.nextafter(math.sqrt(0.5), 0),
                      math.sqrt(2.0), 2.0**-1022, 1.7976931348623157e308], dtype=torch.float64),
    ])
    got = draws.log(grid)
    assert float(got[grid == 1.0].abs().max()) == 0.0
    assert _rel(got, [math.log(v) for v in grid.tolist()]) < 1e-14


def test_sqrt_matches_math_sqrt_and_is_zero_at_zero():
    """draws.sqrt = exp(log(x) / 2): torch.sqrt's float64 results differ between CUDA and the CPU (torch 2.11)."""
    used = torch.linspace(0.0, 80.0, 80001, dtype=torch.float64)  # -2 log(1 - u) < 74 for the 53-bit u
    got = draws.sqrt(used)
    assert float(got[0]) == 0.0 and float(got[used == 4.0][0]) == pytest.approx(2.0, rel=1e-15)
    assert _rel(got, [math.sqrt(v) for v in used.tolist()]) < 1e-14
    # far out, exp amplifies log's absolute error (|log x| up to 709): still a few parts in 1e14
    wide = torch.cat([torch.logspace(-300, 300, 6001, dtype=torch.float64),
                      torch.tensor([2.0**-1022, 1.7976931348623157e308], dtype=torch.float64)])
    assert _rel(draws.sqrt(wide), [math.sqrt(v) for v in wide.tolist()]) < 1e-13


def test_exp_matches_math_exp():
    grid = torch.cat([torch.linspace(-40, 40, 80001, dtype=torch.float64),
                      torch.tensor([0.0, 1e-300, -1e-17, 0.5 * math.log(2), -0.5 * math.log(2), 700.0, -700.0],
                                   dtype=torch.float64)])
    assert _rel(draws.exp(grid), [math.exp(v) for v in grid.tolist()]) < 1e-14


def _cos_sin_ref(t: float) -> tuple[float, float]:
    """cos / sin of 2 pi t from math after an exact reduction t = k/4 + r, |r| <= 1/8 (r exact in float64)."""
    k = round(4 * t)
    r = t - k / 4  # exact: t and k/4 are within a factor 2 of each other or r is t itself
    c, s = math.cos(2 * math.pi * r), math.sin(2 * math.pi * r)
    return [(c, s), (-s, c), (-c, -s), (s, -c)][k % 4]


def test_cos_sin_turns_match_math():
    t = torch.cat([torch.linspace(0, 1, 100001, dtype=torch.float64)[:-1],
                   torch.tensor([2.0**-53, 0.125, 0.25 - 2.0**-54, 0.25, 0.25 + 2.0**-54, 0.375, 0.5, 0.75,
                                 1 - 2.0**-53, 1e-10, 0.5 - 1e-12], dtype=torch.float64)])
    cos, sin = draws.cos_sin_turns(t)
    ref = [_cos_sin_ref(v) for v in t.tolist()]
    assert _rel(cos, [c for c, _ in ref]) < 1e-14
    assert _rel(sin, [s for _, s in ref]) < 1e-14


def test_pow2_is_exact():
    k = torch.arange(-1022, 1024)
    assert draws.pow2(k).tolist() == [math.ldexp(1.0, int(i)) for i in k]
