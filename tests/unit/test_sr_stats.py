"""The statistical stochastic-rounding mode (harness/sr_stats.py, docs/numerics.md §12.3).

It must pass the golden (Philox bits) and a candidate with its own random bits (the §5.7 rule fed by
torch's RNG), and fail a biased SR (round up with probability 0.6 whatever the fraction; round up with
p + 0.05), a rule biased in opposite directions for small and large p, a round-to-nearest "SR", and codes
off the two grid neighbours. The neighbour/probability table is checked by hand.
"""

from __future__ import annotations

import pytest
import torch

import reference
from harness import runner, sr_stats
from harness.cases import Case
from reference import QuantConfig, casts, nvfp4, stochastic
from reference.types import SRSeed


class OwnBits:
    """A backend whose SR codes come from `rule(y, gen) -> codes`, y the golden scaled values; scales from the
    reference. `sr_bits = "own"` selects the statistical mode."""

    sr_bits = "own"

    def __init__(self, name, rule):
        self.name, self.rule = name, rule

    def supports(self, op, config, device):
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        q = reference.quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state)
        s = SRSeed.coerce(rng)
        gen = torch.Generator().manual_seed(s.seed * 7919 + s.stream)
        x2d = x.reshape(-1, x.shape[-1])
        for o in ("rowwise", "colwise"):
            if getattr(q, f"{o}_data") is not None:
                y = sr_stats.scaled(x2d, config, o).y
                setattr(q, f"{o}_data", casts.pack_nibbles(self.rule(y, gen)))
        return q


def torch_rng_sr(y, gen):
    """The §5.7 rule with random bytes from torch's RNG (own bits, unbiased)."""
    r = torch.randint(0, 256, y.shape, generator=gen).to(torch.float32)
    return stochastic.e2m1_sr(y, r)


def _fixed_up(p_up_of):
    def rule(y, gen):
        grid = stochastic.e2m1_grid()
        a = y.abs().clamp(max=6.0).contiguous()
        lo_i = torch.searchsorted(grid, a, right=True) - 1
        lo = grid[lo_i]
        hi_i = (lo_i + (lo < a).long()).clamp(max=7)
        hi = grid[hi_i]
        p = torch.where(hi > lo, (a - lo) / (hi - lo).clamp(min=1e-30), torch.zeros_like(a))
        up = torch.rand(y.shape, generator=gen) < p_up_of(p)
        code = torch.where(up & (hi > lo), hi_i, lo_i).to(torch.uint8)
        return code | (torch.signbit(y).to(torch.uint8) << 3)
    return rule


BIASED_06 = _fixed_up(lambda p: torch.where(p > 0, torch.full_like(p, 0.6), p))  # up with p = 0.6
BIASED_PLUS = _fixed_up(lambda p: torch.where(p > 0, (p + 0.05).clamp(max=1.0), p))  # p + 0.05
TILTED = _fixed_up(lambda p: torch.where(p > 0, 0.5 + 0.8 * (p - 0.5), p))  # too high below 1/2, too low above
UNBIASED_EXACT = _fixed_up(lambda p: p)


def rtn(y, gen):
    return nvfp4.e2m1_rn(y)


def off_grid(y, gen):
    codes = torch_rng_sr(y, gen)
    codes[0, 0] ^= 0x4  # four codes away from its value: never a grid neighbour
    return codes


def sr_case(shape=(32, 64), orientation="both", dist="normal", seed=3):
    return Case("quantize", QuantConfig("nvfp4", stochastic=True), shape, distribution=dist, seed=seed,
                orientation=orientation)


def conformance(rows):
    return {r["tensor"]: r for r in rows if r["kind"] == "conformance"}


# ---- the hand-checked table -------------------------------------------------------------------


def test_neighbours_and_probabilities_by_hand():
    # Blocks with amax 6 and A_g = 6: S_enc = 448, s_blk = 448 (0x7E), f = 1 exactly, so y = x.
    vals = [6.0, 0.25, 0.75, 1.25, 2.5, 3.5, 5.0, -0.125, 1.0, 2.0, 4.0, 0.0, -5.5, 1.375, 2.25, 3.0]
    x = torch.tensor([vals] * 16, dtype=torch.float32)
    sc = sr_stats.scaled(x, QuantConfig("nvfp4", stochastic=True), "rowwise")
    assert sc.y[0].tolist() == vals
    assert sc.lo[0].tolist() == [6, 0, 0.5, 1, 2, 3, 4, 0, 1, 2, 4, 0, 4, 1, 2, 3]
    assert sc.hi[0].tolist() == [6, 0.5, 1, 1.5, 3, 4, 6, 0.5, 1, 2, 4, 0, 6, 1.5, 3, 3]
    p = [0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0, 0, 0, 0, 0.75, 0.75, 0.25, 0]
    assert torch.allclose(sc.p[0], torch.tensor(p, dtype=torch.float64), atol=0)
    assert sc.tested[0].tolist() == [False] + [True] * 15  # the block maximum (6.0) is masked


# ---- the harness mode ---------------------------------------------------------------------------


def test_golden_passes_with_own_bits_flag():
    rows = runner.run_case(sr_case(), _golden_own(), "cpu")
    conf = conformance(rows)
    assert set(conf) == {"rowwise_data_sr", "colwise_data_sr", "rowwise_scale", "colwise_scale",
                         "rowwise_amax", "colwise_amax"}
    assert all(r["status"] == "pass" for r in conf.values()), [(t, r["reason"]) for t, r in conf.items()]


def _golden_own():
    class GoldenOwn:
        name, sr_bits = "golden_own", "own"

        def supports(self, op, config, device):
            return True, ""

        quantize = staticmethod(reference.quantize)

    return GoldenOwn()


@pytest.mark.parametrize("dist", ["normal", "ties", "uniform"])
@pytest.mark.parametrize("rule", [torch_rng_sr, UNBIASED_EXACT], ids=["torch_rng_sr", "unbiased_exact"])
def test_own_bits_candidate_passes(rule, dist):
    rows = runner.run_case(sr_case(dist=dist), OwnBits("own", rule), "cpu")
    conf = conformance(rows)
    assert all(r["status"] == "pass" for r in conf.values()), [(t, r["reason"]) for t, r in conf.items()]


@pytest.mark.parametrize(("rule", "check"), [
    (BIASED_06, "sr_unbiased"), (BIASED_PLUS, "sr_unbiased"), (TILTED, "sr_unbiased"),
    (rtn, "sr_draws_differ"), (off_grid, "sr_neighbours"),
], ids=["up_p0.6", "p_plus_0.05", "tilted", "round_to_nearest", "off_grid"])
def test_biased_or_broken_sr_fails(rule, check):
    rows = runner.run_case(sr_case(), OwnBits("bad", rule), "cpu")
    conf = conformance(rows)
    data = [conf["rowwise_data_sr"], conf["colwise_data_sr"]]
    assert all(r["status"] == "fail" for r in data)
    assert all(check in r["mismatch_classes"] for r in data), [r["mismatch_classes"] for r in data]
    assert conf["rowwise_scale"]["status"] == "pass"  # scales are still compared byte for byte


def test_rtn_also_loses_to_itself_on_ties():
    # On exact midpoints round-to-nearest's mean is as far from y as RN: fails beats_rtn too.
    rows = runner.run_case(sr_case(dist="ties"), OwnBits("rtn", rtn), "cpu")
    assert "sr_beats_rtn" in conformance(rows)["rowwise_data_sr"]["mismatch_classes"]


def test_backends_without_the_flag_keep_the_byte_comparison():
    rows = runner.run_case(sr_case(), "reference", "cpu")
    assert "rowwise_data" in conformance(rows) and "rowwise_data_sr" not in conformance(rows)
    own_rows = runner.run_case(sr_case(), OwnBits("own", torch_rng_sr), "cpu")
    assert "rowwise_data" not in conformance(own_rows)
    # A round-to-nearest case is never statistical, even for an own-bits backend.
    rn = Case("quantize", QuantConfig("nvfp4"), (32, 64), orientation="rowwise")
    assert not sr_stats.applies(rn, OwnBits("own", torch_rng_sr))


def test_seeds_are_fresh_and_deterministic():
    s = sr_stats.seeds((5, 9), 4)
    assert s == [(6, 9), (7, 9), (8, 9), (9, 9)]
    assert sr_stats.seeds((2**64 - 1, 0), 1) == [(0, 0)]
