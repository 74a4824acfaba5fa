"""Counter-based random draws with the same bits on every device (the sweep's input generator).

Source: issue #18 item 3 / #19 (draw inputs on the GPU through a device-independent generator);
reference.philox (Philox4x32-10, docs/numerics.md §5.7) is the bit source; docs/numerics.md §0.2 is why
only some torch ops are used.

A `Draws(seed, device)` hands out tensors on `device`. Call n of its methods (n = 0, 1, ...) reads the
Philox4x32-10 outputs of counters (j mod 2^32, floor(j / 2^32), n, 0), j = 0, 1, ..., under the key of
`seed`; the element at row-major index e of the result takes its bits from counter j = floor(e / per),
words / bits (e mod per) of it. So a value depends only on (seed, call number, element index): never
on the device, the chunking or the other elements. Methods and their bits per value:

- `uniform`: float64 in [0, 1) from 53 bits (32 of one word, the top 21 of the next): exact, 2 per counter;
- `normal`: N(0, 1) by Box-Muller, r = sqrt(-2 log(1 - u1)), (r cos 2 pi u2, r sin 2 pi u2), 2 per counter
  (sqrt as exp(log(.) / 2) from this module's log and exp);
- `integers(lo, hi)`: lo + floor(x n / 2^32), x one 32-bit word, n = hi - lo + 1 <= 2^31 (multiply-shift):
  exact for n a power of two, otherwise each value has probability floor(2^32/n)/2^32 or ceil(2^32/n)/2^32,
  a relative bias below n / 2^32 (2^-24 for the n <= 256 the inputs use): negligible, 4 per counter;
- `bernoulli(p)`: x < p 2^32 (p a multiple of 2^-32: exact), 4 per counter; `sign_bits` / `signs`: one
  bit each (bit b of word w is element 32 w + b), 128 per counter;
- `positions(k, n)`: k distinct indices of range(n) as (a i + b) mod n, i < k, a and b drawn on the host,
  a made coprime to n (so i -> a i + b mod n is a bijection): an arithmetic progression mod n, not a
  uniformly random subset (enough for sprinkling outliers); one call number, no counters;
- `integer(lo, hi)`: one value on the host (Python int, the first word of counter 0), so scalar draws need
  no device round trip.

Device independence: only integer ops and correctly rounded float64 +, -, *, / (tensor by tensor),
floor, frexp, comparisons and where are used, each as its own torch op (never a fused op that could
become an FMA on one device only). torch.sqrt is not among them: with torch 2.11 on an H200, 0.8% of float64
square roots of uniforms differed between CUDA and the CPU (tests/gpu/test_draws_gpu.py). log, cos, sin and exp
are written here from those ops: log by frexp and
an atanh series, cos / sin by quadrant reduction of the angle in turns and Taylor series on [0, pi/4], exp by
2^k e^r (k = round(y / ln 2), Cody-Waite r, Taylor series); each is accurate to a few ulps (tests/unit/
test_draws.py checks 1e-14 relative against math).
"""

from __future__ import annotations

import math

import torch

from reference.philox import DEVICE_CHUNK, MASK32, philox4x32, seed_key

# Counters per chunk on the CPU: 16K keeps the float64 temporaries of the transforms in cache (measured
# fastest of 4K..64K for normals); elsewhere reference.philox's DEVICE_CHUNK.
CPU_CHUNK = 1 << 14

_TWO_M53 = 2.0**-53
# NUMERICS: §0.2 - ln 2 split (fdlibm ln2_hi / ln2_lo): k * LN2_HI is exact for |k| < 2^11.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e00
SQRT_HALF = 0.7071067811865476
HALF_PI = math.pi / 2
# Series coefficients (host constants, correctly rounded): atanh s = s sum_k s^2k / (2k + 1), |s| <= 0.1716
# (neglected term < 1e-19 relative); sin x = x sum_k (-1)^k x^2k / (2k + 1)!, cos x = sum_k (-1)^k x^2k / (2k)!
# on [0, pi/4] (neglected terms < 1e-17 relative); e^r = sum_k r^k / k!, k <= 13, |r| <= ln2 / 2 (neglected
# < 1e-17 relative).
_ATANH = [1.0 / (2 * k + 1) for k in range(11)]
_SIN = [(-1.0) ** k / math.factorial(2 * k + 1) for k in range(9)]
_COS = [(-1.0) ** k / math.factorial(2 * k) for k in range(9)]
_EXP = [1.0 / math.factorial(k) for k in range(14)]


def _horner(z: torch.Tensor, coeffs: list[float]) -> torch.Tensor:
    """sum_k coeffs[k] z^k by Horner's rule, one multiply and one add per step (separate ops, no FMA)."""
    p = torch.full_like(z, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p.mul_(z).add_(c)
    return p


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as float64 from its bit pattern (exact, k in [-1022, 1023]); no pow / ldexp kernel."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def log(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive finite float64 x: x = m 2^e, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh s,
    s = (m - 1) / (m + 1). log 1 = 0 exactly."""
    m, e = torch.frexp(x)  # m in [0.5, 1)
    # m < sqrt(1/2): m * 2, e - 1 (a 0 / 1 factor instead of torch.where, which is slow on the CPU).
    small = (m < SQRT_HALF).to(torch.float64)
    m = m * (small + 1.0)
    ef = e.to(torch.float64).sub_(small)
    s = torch.div(m - 1.0, m + 1.0)  # NUMERICS: §0.2 - tensor / tensor division (m - 1 is exact)
    t = _horner(s * s, _ATANH).mul_(s).mul_(2.0)
    # NUMERICS: §0.2 - e ln2_hi is exact; the small terms are summed first.
    return (ef * LN2_LO).add_(t).add_(ef.mul_(LN2_HI))


def _select(flag: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """flag ? a : b for float64 flag in {0, 1} and finite a, b >= 0: a flag + b (1 - flag), exact."""
    return (a * flag).add_(b * (1.0 - flag))


def cos_sin_turns(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos 2 pi t, sin 2 pi t) for float64 t in [0, 1): quadrant q = floor(4 t), f = 4 t - q (exact);
    f > 1/2 uses the complement 1 - f (exact) and swaps cos / sin; x = f pi/2 in [0, pi/4] gets the Taylor
    series; the quadrant swaps cos / sin (q odd) and sets the signs (cos < 0 for q = 1, 2; sin for q = 2, 3)."""
    t4 = t * 4.0
    q = torch.floor(t4)
    f = t4 - q
    swap = (f > 0.5).to(torch.float64)
    a = (1.0 - f).mul_(swap).add_(f * (1.0 - swap))
    x = a * HALF_PI
    z = x * x
    c = _horner(z, _COS)
    s = _horner(z, _SIN).mul_(x)
    c, s = _select(swap, s, c), _select(swap, c, s)  # cos / sin of f pi/2
    h = torch.floor(q * 0.5)  # 1 for q = 2, 3
    odd = q - h * 2.0
    cneg = odd + h - odd * h * 2.0  # odd xor h: 1 for q = 1, 2
    cos = _select(odd, s, c).mul_(1.0 - cneg * 2.0)
    sin = _select(odd, c, s).mul_(1.0 - h * 2.0)
    return cos, sin


def exp(y: torch.Tensor) -> torch.Tensor:
    """e^y for float64 y with |y| < 700: 2^k e^r, k = floor(y / ln 2 + 1/2), r = (y - k ln2_hi) - k ln2_lo."""
    k = torch.floor(y * INV_LN2 + 0.5)
    r = (y - k * LN2_HI) - k * LN2_LO
    return _horner(r, _EXP) * pow2(k.to(torch.int64))


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt of finite float64 x >= 0 as e^(log(x) / 2) with this module's exp and log (a few ulps; 0 for 0):
    torch.sqrt's float64 results are not the same on every device (module docstring)."""
    pos = (x > 0).to(torch.float64)
    one_for_zero = x + (1.0 - pos)  # log(1) = 0; the 0 / 1 factor below gives sqrt(0) = 0
    return exp(log(one_for_zero).mul_(0.5)).mul_(pos)


def _bits53(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The 53-bit integer hi 2^21 + (lo >> 11) of two words, as float64 (exact): times 2^-53, a uniform in [0, 1)."""
    return ((hi << 21) | (lo >> 11)).to(torch.float64)


class Draws:
    """Device-independent random tensors (see the module docstring), seeded by a 64-bit `seed`."""

    def __init__(self, seed: int, device: str | torch.device = "cpu") -> None:
        self.seed = int(seed)
        self.key = seed_key(self.seed)
        self.device = torch.device(device)
        self.calls = 0

    def _call(self) -> int:
        n = self.calls
        self.calls += 1
        return n & MASK32

    # NUMERICS: §5.7 - counter (j mod 2^32, floor(j / 2^32), call, 0) under the seed's key; element e reads
    # counter e // per: the order of the values is fixed by the element index, not by the chunking.
    def _draw(self, shape, per: int, fill, dtype: torch.dtype) -> torch.Tensor:
        """A tensor of `shape` whose element e is value e % per of counter e // per: `fill(words, o)` writes
        the values of a chunk of counters (its four word tensors) into `o`, their (counters, per) rows."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = math.prod(shape)
        call = self._call()
        n_ctr = -(-n // per)
        out = torch.empty((n_ctr, per), dtype=dtype, device=self.device)
        chunk = CPU_CHUNK if self.device.type == "cpu" else DEVICE_CHUNK
        for s in range(0, n_ctr, chunk):
            e = min(n_ctr, s + chunk)
            j = torch.arange(s, e, dtype=torch.int64, device=self.device)
            hi = (j >> 32) if e > (1 << 32) else 0
            fill(philox4x32((j & MASK32, hi, call, 0), self.key), out[s:e])
        return out.view(-1)[:n].view(shape)

    def uniform(self, shape) -> torch.Tensor:
        """float64 in [0, 1), multiples of 2^-53, each equally likely."""

        def fill(w, o):
            torch.mul(_bits53(w[0], w[1]), _TWO_M53, out=o[:, 0])
            torch.mul(_bits53(w[2], w[3]), _TWO_M53, out=o[:, 1])

        return self._draw(shape, 2, fill, torch.float64)

    def normal(self, shape, then=None) -> torch.Tensor:
        """float64 N(0, 1) by Box-Muller (u1 from words 0-1, u2 from words 2-3); `then`, an elementwise
        function, is applied chunk by chunk (while the values are in cache), e.g. exp for lognormals."""

        def fill(w, o):
            # NUMERICS: §0.2 - 1 - u in (0, 1] is exact; log, sqrt, cos, sin and the products round in float64.
            u1 = torch.mul(_bits53(w[0], w[1]), -_TWO_M53).add_(1.0)
            r = sqrt(log(u1).mul_(-2.0))
            cos, sin = cos_sin_turns(torch.mul(_bits53(w[2], w[3]), _TWO_M53))
            if then is None:
                torch.mul(r, cos, out=o[:, 0])
                torch.mul(r, sin, out=o[:, 1])
            else:
                o[:, 0] = then(r * cos)
                o[:, 1] = then(r * sin)

        return self._draw(shape, 2, fill, torch.float64)

    def integers(self, lo: int, hi: int, shape, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """Integers in [lo, hi] (multiply-shift of one 32-bit word; bias: module docstring)."""
        n = hi - lo + 1
        if not 1 <= n <= 1 << 31:
            raise ValueError(f"integers: range [{lo}, {hi}] must hold 1 to 2^31 values")

        def fill(w, o):
            for i in range(4):
                o[:, i] = (w[i] * n >> 32) + lo

        return self._draw(shape, 4, fill, dtype)

    def bernoulli(self, p: float, shape) -> torch.Tensor:
        """bool, True with probability p (p a multiple of 2^-32, so x < p 2^32 is exact)."""
        thr = p * 2.0**32
        if thr != math.floor(thr) or not 0 <= thr <= 2**32:
            raise ValueError(f"bernoulli: p={p} is not a multiple of 2^-32 in [0, 1]")

        def fill(w, o):
            for i in range(4):
                torch.lt(w[i], int(thr), out=o[:, i])

        return self._draw(shape, 4, fill, torch.bool)

    def sign_bits(self, shape) -> torch.Tensor:
        """int8 0 / 1, each with probability 1/2 (one Philox bit per element, 128 per counter: element
        128 j + 32 i + b is bit b of word i of counter j)."""
        shifts = torch.arange(32, dtype=torch.int64, device=self.device)

        def fill(w, o):
            for i in range(4):
                o[:, 32 * i : 32 * i + 32] = (w[i].unsqueeze(1) >> shifts) & 1

        return self._draw(shape, 128, fill, torch.int8)

    def signs(self, shape) -> torch.Tensor:
        """float64 -1 / +1 from `sign_bits` (0 -> -1, 1 -> +1)."""
        return self.sign_bits(shape).to(torch.float64).mul_(2).sub_(1)

    def _host_words(self) -> tuple[int, int, int, int]:
        return philox4x32((0, 0, self._call(), 0), self.key)

    def integer(self, lo: int, hi: int) -> int:
        """One integer in [lo, hi] on the host (no device work), as `integers` draws element 0."""
        n = hi - lo + 1
        if not 1 <= n <= 1 << 31:
            raise ValueError(f"integer: range [{lo}, {hi}] must hold 1 to 2^31 values")
        return lo + ((self._host_words()[0] * n) >> 32)

    def positions(self, k: int, n: int) -> torch.Tensor:
        """k distinct int64 indices of range(n): (a i + b) mod n for i < k, with gcd(a, n) = 1 (a drawn in
        [1, n), then stepped to the next coprime value), b in [0, n)."""
        if not 0 <= k <= n:
            raise ValueError(f"positions: k={k} not in [0, n={n}]")
        w = self._host_words()
        a = 1 + ((w[0] * max(n - 1, 1)) >> 32)
        while math.gcd(a, n) != 1:
            a = a % (n - 1) + 1
        b = (w[1] * n) >> 32
        i = torch.arange(k, dtype=torch.int64, device=self.device)
        return (i * a + b) % n
