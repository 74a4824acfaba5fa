"""harness.inputs.generate gives the bytes pinned in tests/unit/data/input_digests.json (a changed digest is a
changed input bit).

The oracle: SHA-256 digests of generate() outputs written by tests/unit/input_digests.py (its docstring says
when and from which generator), over every smoke case, every 50th nightly case and the first nightly case of each (op, distribution, scheme, input dtype). Cases of more than
CPU_ELEMENTS input elements are checked on a GPU (tests/gpu/test_input_digests_gpu.py), the rest here.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch

from harness.cases import load_cases

from .input_digests import CPU_ELEMENTS, DATA, digest, elements

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
    """The sample, and its part checked here on the CPU (the larger cases: tests/gpu/test_input_digests_gpu.py),
    each cover every op and distribution."""
    assert set(sampled_cases) == set(TABLE), "a sampled case id vanished from its tier"
    from harness.cases import DISTRIBUTIONS  # noqa: PLC0415

    on_cpu = [c for c in sampled_cases.values() if elements(c) <= CPU_ELEMENTS]
    for part in (list(sampled_cases.values()), on_cpu):
        assert {"quantize", "dequantize", "grouped_quantize", "gemm", "linear"} <= {c.op for c in part}
        dists = {(c.op == "gemm", c.distribution) for c in part}
        assert {d for _, d in dists} == set(DISTRIBUTIONS)
        assert (True, "exact_representable") in dists


@pytest.mark.parametrize("shard", range(SHARDS))
def test_generate_matches_base_digests(sampled_cases, shard):
    from harness.inputs import generate, input_key  # noqa: PLC0415

    ids = [cid for cid in sorted(TABLE)[shard::SHARDS] if elements(sampled_cases[cid]) <= CPU_ELEMENTS]
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
