"""Philox4x32-10 counter-based generator (Random123), vectorized over counters with int64 tensors.

Source: docs/numerics.md §5.7 (constants, round function, key schedule, known answer); Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3" (SC'11), the Random123 `philox4x32` definition.
Every 32-bit word is held in an int64 tensor (or a Python int) in [0, 2^32). A 32x32-bit product
needs 64 unsigned bits, more than int64 holds without overflow, so each product is formed from two
32x16-bit partial products (< 2^48) and every intermediate stays below 2^63: the arithmetic is exact
and identical on CPU and CUDA (no reliance on signed-overflow wrapping).
"""

from __future__ import annotations

import torch

# NUMERICS: §5.7 Philox4x32-10 constants (Random123 PHILOX_M4x32_0/1, PHILOX_W32_0/1).
M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85
ROUNDS = 10

MASK32 = 0xFFFFFFFF
_MASK16 = 0xFFFF
# Counters per chunk: cache-sized int64 temporaries on CPU; large launches elsewhere.
CPU_CHUNK = 1 << 16
DEVICE_CHUNK = 1 << 22


def _mulhilo(a, m: int):
    """(hi, lo) 32-bit halves of the 64-bit product a*m; a a uint32 word (int64 tensor or int), m a constant.

    a*m = p_hi*2^16 + p_lo with p_hi = a*(m >> 16) and p_lo = a*(m & 0xFFFF), both < 2^48;
    t = p_hi + (p_lo >> 16) < 2^49; hi = t >> 16; lo = (t mod 2^16)*2^16 + (p_lo mod 2^16).
    Returns fresh tensors (the caller may update them in place); `a` is never modified.
    """
    if not isinstance(a, torch.Tensor):
        p = a * m
        return p >> 32, p & MASK32
    if a.device.type == "cpu":
        # NUMERICS: §5.7 - on the CPU one int64 multiply: a*m < 2^64 wraps modulo 2^64 (two's complement), so its
        # bits are the product's; lo = bits 0-31, hi = bits 32-63 (the arithmetic shift's sign copies masked off).
        # Checked against Python integers (tests/unit/test_philox.py). Other devices keep the 16-bit split below.
        p = a * m
        hi = p >> 32
        hi &= MASK32
        p &= MASK32
        return hi, p
    p_lo = a * (m & _MASK16)  # < 2^48
    t = a * (m >> 16)  # < 2^48
    t += p_lo >> 16  # < 2^49
    hi = t >> 16
    t &= _MASK16
    t <<= 16
    p_lo &= _MASK16
    t |= p_lo
    return hi, t


def _holds(shape: torch.Size, other: torch.Size) -> bool:
    """Whether a tensor of `shape` holds its broadcast with `other` (an in-place op keeps its shape).
    (torch.broadcast_shapes would do, but its first call imports sympy: ~0.7 s per process.)"""
    return len(other) <= len(shape) and all(o in (1, s) for s, o in zip(reversed(shape), reversed(other), strict=False))


def _xor3(h, c, k: int):
    """h ^ c ^ k for a fresh word h (updated in place when it can hold the result), a word c, an int k."""
    if not isinstance(h, torch.Tensor):
        return c ^ (h ^ k) if isinstance(c, torch.Tensor) else h ^ c ^ k
    if isinstance(c, torch.Tensor):
        h = h.bitwise_xor_(c) if _holds(h.shape, c.shape) else h ^ c
    else:
        k ^= c
    return h.bitwise_xor_(k) if k else h


def philox4x32(counter, key, rounds: int = ROUNDS, *, x0_only: bool = False):
    """Philox4x32-`rounds` of `counter` (c0, c1, c2, c3) under `key` (k0, k1).

    Words are int64 tensors (broadcastable, values in [0, 2^32)) or Python ints. Returns the four
    output words (int64 tensors, or ints when every input is an int); with `x0_only`, only x0.
    NUMERICS: §5.7 - a round maps (c0, c1, c2, c3) to (hi(M1*c2) ^ c1 ^ k0, lo(M1*c2),
    hi(M0*c0) ^ c3 ^ k1, lo(M0*c0)); the first round uses the seed key, after each of the first
    rounds-1 rounds k0 += W0, k1 += W1 (mod 2^32).
    """
    c0, c1, c2, c3 = counter
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    for rnd in range(rounds):
        last = rnd == rounds - 1
        hi1, lo1 = _mulhilo(c2, M1)
        if last and x0_only:
            return _xor3(hi1, c1, k0)
        hi0, lo0 = _mulhilo(c0, M0)
        c0, c1, c2, c3 = _xor3(hi1, c1, k0), lo1, _xor3(hi0, c3, k1), lo0
        if not last:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
    return c0, c1, c2, c3


def seed_key(seed: int) -> tuple[int, int]:
    """NUMERICS: §5.7 - key = (seed mod 2^32, floor(seed / 2^32)) for a 64-bit seed."""
    seed = int(seed)
    return seed & MASK32, (seed >> 32) & MASK32


def words_of_groups(groups: torch.Tensor, seed: int, stream: int, *, chunk: int | None = None) -> torch.Tensor:
    """The four output words (x0, x1, x2, x3) of Philox4x32-10 for counters (g lo, g hi, stream, 0).

    `groups` is an int64 tensor of group indices g >= 0 (any shape); returns int64 [..., 4] in [0, 2^32), word w
    at [..., w]. NUMERICS: §5.7 - counter = (g mod 2^32, floor(g / 2^32), stream, 0), key from the 64-bit seed,
    one call per group of 16 elements, all four words used. Processed in chunks of `chunk` counters (default:
    CPU_CHUNK on CPU, DEVICE_CHUNK elsewhere).
    """
    g = groups.to(torch.int64).reshape(-1)
    if chunk is None:
        chunk = CPU_CHUNK if g.device.type == "cpu" else DEVICE_CHUNK
    key = seed_key(seed)
    s = int(stream) & MASK32
    out = torch.empty((g.numel(), 4), dtype=torch.int64, device=g.device)
    for start in range(0, g.numel(), chunk):
        gc = g[start : start + chunk]
        lo = gc & MASK32
        # NUMERICS: §5.7 - c1 = floor(g / 2^32), a Python 0 below 2^32 groups (2^36 elements).
        hi = gc >> 32
        c1 = hi if bool((hi != 0).any()) else 0
        for w, word in enumerate(philox4x32((lo, c1, s, 0), key)):  # fixed count: 4 words
            out[start : start + chunk, w] = word
    return out.reshape(*groups.shape, 4)
