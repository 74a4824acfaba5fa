"""Philox4x32-10 (reference/philox.py): known answers and agreement with a plain-Python oracle.

Source of the expected values: docs/numerics.md §8 (Random123 known answers; SR bits for seed 42).
"""

from __future__ import annotations

import random

import pytest
import torch

from reference import philox

MASK = 0xFFFFFFFF


def philox_py(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """Independent oracle: Philox4x32-10 on Python ints, written from the Random123 definition."""
    c = list(counter)
    k0, k1 = key
    for rnd in range(10):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c[3] ^ k1) & MASK, p0 & MASK]
        if rnd < 9:
            k0 = (k0 + 0x9E3779B9) & MASK
            k1 = (k1 + 0xBB67AE85) & MASK
    return tuple(c)


def sr_words_py(g: int, seed: int, stream: int) -> tuple[int, int, int, int]:
    """(x0, x1, x2, x3) for group g under the docs/numerics.md §5.7 counter/key layout, by the oracle."""
    return philox_py((g & MASK, g >> 32, stream & MASK, 0), (seed & MASK, seed >> 32))


def sr_byte_py(lin: int, seed: int, stream: int) -> int:
    """docs/numerics.md §5.7: r of element L = byte L mod 4 of word floor((L mod 16) / 4) of group floor(L / 16)."""
    return (sr_words_py(lin // 16, seed, stream)[(lin % 16) // 4] >> (8 * (lin % 4))) & 0xFF


KNOWN = [
    pytest.param((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8), id="zero"),
    pytest.param((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD), id="all-ones"),
]


@pytest.mark.parametrize("counter,key,expected", KNOWN)
def test_known_answer_python_ints(counter, key, expected):
    assert philox.philox4x32(counter, key) == expected


@pytest.mark.parametrize("counter,key,expected", KNOWN)
def test_known_answer_tensors(counter, key, expected):
    words = tuple(torch.tensor([c, c], dtype=torch.int64) for c in counter)
    out = philox.philox4x32(words, key)
    assert [int(w[1]) for w in out] == list(expected)
    assert int(philox.philox4x32(words, key, x0_only=True)[0]) == expected[0]


@pytest.mark.parametrize("counter,key,expected", KNOWN)
def test_oracle_matches_known_answers(counter, key, expected):
    assert philox_py(counter, key) == expected


def test_sr_bits_seed_42():
    """docs/numerics.md §8: seed 42, stream 0, g = 0 (all four words) and g = 1, 2 (x0); stream 1, g = 0 (x0)."""
    w = philox.words_of_groups(torch.arange(3), 42, 0)
    assert w.shape == (3, 4)
    assert w[0].tolist() == [0x9CEAF053, 0x77F5493B, 0x12BF50AD, 0x5742B3D7]
    assert w[1:, 0].tolist() == [0xFCDB2127, 0xD36C0225]
    assert int(philox.words_of_groups(torch.tensor([0]), 42, 1)[0, 0]) == 0x02933769
    assert [sr_words_py(g, 42, 0) for g in range(3)] == [tuple(r) for r in w.tolist()]


def test_seed_key_split():
    assert philox.seed_key(42) == (42, 0)
    assert philox.seed_key((7 << 32) | 5) == (5, 7)
    assert philox.seed_key(2**64 - 1) == (MASK, MASK)


def test_random_counters_and_keys_match_oracle():
    rng = random.Random(1234)
    n = 300
    counters = [tuple(rng.getrandbits(32) for _ in range(4)) for _ in range(n)]
    # edge words too: 0, 1, 2^31, 2^32 - 1
    edges = [0, 1, 1 << 31, MASK]
    counters += [(a, b, c, d) for a in edges for b in edges[:2] for c in edges for d in edges[:2]]
    key = (rng.getrandbits(32), rng.getrandbits(32))
    words = tuple(torch.tensor([c[i] for c in counters], dtype=torch.int64) for i in range(4))
    out = philox.philox4x32(words, key)
    got = list(zip(*[w.tolist() for w in out], strict=True))
    assert got == [philox_py(c, key) for c in counters]


@pytest.mark.parametrize(
    "seed,stream",
    [(0, 0), (42, 7), (2**64 - 1, MASK), ((3 << 32) + 11, 1)],
    ids=["seed0", "seed42-stream7", "max-seed-max-stream", "seed-hi-word"],
)
def test_words_of_groups_matches_oracle(seed, stream):
    groups = [0, 1, 2, 3, 1000, MASK, 1 << 32, (1 << 32) + 5, (1 << 40) + 3]
    got = philox.words_of_groups(torch.tensor(groups, dtype=torch.int64), seed, stream, chunk=4).tolist()
    assert got == [list(sr_words_py(g, seed, stream)) for g in groups]


def test_words_chunking_does_not_matter():
    g = torch.arange(5000, dtype=torch.int64).reshape(50, 100)
    a = philox.words_of_groups(g, 9, 3, chunk=1 << 16)
    b = philox.words_of_groups(g, 9, 3, chunk=37)
    assert a.shape == (50, 100, 4)
    assert torch.equal(a, b)
    assert tuple(a[3, 7].tolist()) == sr_words_py(307, 9, 3)


def test_in_place_xor_is_used_exactly_when_the_word_holds_the_broadcast():
    import itertools

    from reference.philox import _holds

    shapes = [(), (1,), (3,), (2, 3), (1, 3), (2, 1), (4, 2, 3), (4, 1, 1), (1, 2, 3)]
    for a, b in itertools.product(shapes, shapes):
        assert _holds(torch.Size(a), torch.Size(b)) == (torch.Size(a) == torch.broadcast_shapes(a, b)), (a, b)


def test_mulhilo_on_the_cpu_is_the_exact_64_bit_product():
    """The CPU path multiplies once in int64 (wrapping modulo 2^64); its halves are the exact product's, also where
    the product passes 2^63 (the signed wrap) - against Python integers, edges and 100k random words."""
    import random

    from reference import philox

    rnd = random.Random(7)
    words = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + [rnd.getrandbits(32) for _ in range(100_003)]
    a = torch.tensor(words, dtype=torch.int64)
    for m in (philox.M0, philox.M1):
        hi, lo = philox._mulhilo(a, m)
        assert hi.tolist() == [(w * m) >> 32 for w in words]
        assert lo.tolist() == [(w * m) & 0xFFFFFFFF for w in words]
        assert a.tolist() == words  # the input is not modified
