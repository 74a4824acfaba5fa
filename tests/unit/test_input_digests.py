"""harness.inputs.generate is bit-identical to the base implementation (issue #18 item 3: faster, same bits).

The oracle is tests/unit/data/input_digests.json: SHA-256 digests of generate() outputs written by
tests/unit/input_digests.py at base commit 460c2fa, before the speed-ups, over every smoke case, every 50th
nightly case and the first nightly case of each (op, distribution, scheme, input dtype).
"""

from __future__ import annotations

import collections
import json

import pytest
import torch

from harness.cases import load_cases

from .input_digests import DATA, digest

SHARDS = 6
TABLE = json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def sampled_cases() -> dict:
    """{case id: case} of the frozen sample, loaded from the tiers named in the table."""
    want = collections.defaultdict(set)
    for cid, row in TABLE.items():
        want[row["tier"]].add(cid)
    out = {}
    for tier, ids in want.items():
        out.update({c.id: c for c in load_cases(tier) if c.id in ids})
    return out


def test_sample_covers_every_op_and_distribution(sampled_cases):
    assert set(sampled_cases) == set(TABLE), "a sampled case id vanished from its tier"
    ops = {c.op for c in sampled_cases.values()}
    assert {"quantize", "dequantize", "grouped_quantize", "gemm", "linear"} <= ops
    dists = {(c.op == "gemm", c.distribution) for c in sampled_cases.values()}
    from harness.cases import DISTRIBUTIONS  # noqa: PLC0415

    assert {d for _, d in dists} == set(DISTRIBUTIONS)
    assert (True, "exact_representable") in dists


@pytest.mark.parametrize("shard", range(SHARDS))
def test_generate_matches_base_digests(sampled_cases, shard):
    from harness.inputs import generate, input_key  # noqa: PLC0415

    ids = sorted(TABLE)[shard::SHARDS]
    done: dict = {}
    bad = []
    for cid in ids:
        case = sampled_cases[cid]
        k = input_key(case)
        if k not in done:
            done[k] = digest(generate(case))
        if done[k] != TABLE[cid]["digest"]:
            bad.append(cid)
    assert not bad, f"{len(bad)} of {len(ids)} cases changed input bits, e.g. {bad[:5]}"


def test_digest_sees_one_bit():
    """The digest is byte-exact: flipping one bit, a dtype or a shape changes it."""
    x = torch.arange(8, dtype=torch.float32)
    y = x.clone()
    y.view(torch.int32)[3] ^= 1
    assert digest({"x": x}) != digest({"x": y})
    assert digest({"x": x}) != digest({"x": x.view(torch.int32)})
    assert digest({"x": x}) != digest({"x": x.reshape(2, 4)})
    assert digest({"x": x}) == digest({"x": x.clone()})
