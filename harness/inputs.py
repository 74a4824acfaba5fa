"""Named, seeded input generators: the high-precision tensors a case quantizes or multiplies.

Source: docs/design.md §5 (named, seeded distributions; plain `normal` alone proves little),
docs/numerics.md §1-§5 (scale chains the structured distributions are built around) and §6
(exact-representable GEMM mode). Everything is generated on `device` (CPU or CUDA): every random value
comes from a harness.draws.Draws seeded by a stable hash of (seed, distribution, shape, layout, tensor
name), every helper tensor (grids, masks, code tables) is made there, and only device-independent
arithmetic is used, so the bytes are the same on every device.

Distributions (x = generated values; "scaled domain" = x times the scheme's encode factor):
- normal, uniform [-1, 1), heavy_tail (random sign times lognormal, sigma 2), outliers (normal
  plus ~0.1% values of magnitude 2^6..2^12 at Draws.positions: an arithmetic progression mod the
  element count), per_tile_scales (normal, each tile of the consumed
  blocks times a random power of two over 2^±40, 2^±8 for float16).
- ties: in every block (inside T x T tiles, T = the block length, 32 for per-tensor schemes) one
  anchor per row and per column segment holds +-A* (the format max; fp8_delayed: max * 2^-margin;
  NVFP4: 6), which makes the decode scale an exact power of two 2^k; every other element is an
  exact rounding midpoint of the element grid times 2^k (the overflow midpoint, e.g. 464 for
  E4M3, is included only when A* exceeds it). NVFP4 also puts the global amax 2688 * 2^-g at
  element [0, 0] (S_enc = 2^g), so every block except the first has s_blk = 2^j exactly.
  fp8_delayed assumes the scale comes from this tensor's amax (the runner's warm-up step) or is
  1.0 (fresh state): both give scale 1 here. RHT copies are not on midpoints.
- special: per T x T tile one pattern: normal, +0, +-0, NaN sprinkled, +-Inf sprinkled, input-dtype
  subnormals, all +-max of the input dtype, tiny amax, a single non-zero per segment, all NaN,
  constant blocks (every element equals the block max). T is the block length, halved (down to 16)
  while the tensor has fewer than two tiles per pattern, so small tensors still see every pattern
  (each pattern then fills part of a block). special_nan: the same without the Inf pattern (NaN is
  the only non-finite value); special_inf: without the two NaN patterns (docs/numerics.md §11).
- exhaustive: every finite code of the element format (NVFP4: every E2M1 code times every E4M3
  block scale) times a power of two, with anchors as in `ties`, so quantization reproduces the
  codes exactly (NaN and Inf codes are left to `special`).
- exact_representable (GEMMs; docs/numerics.md §6): in each consumed block (along K) an anchor at
  K-offset 0 (A) or 1 (B) fixes a power-of-two scale, and the other operand is zero at that offset,
  so anchors never enter a product; every other value is +-2^-i times the block scale, so every
  product is a multiple of q = 2^-(La+Sa+Lb+Sb) (times the global factors) and every K-sum of
  |products| is <= 2^13 q. NVFP4 global amaxes are 2688 or 21504 (alpha a power of two). C and bias
  are small multiples of q, so Y + C + bias is exact in fp32.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

from reference import casts
from reference.formats import E4M3, QuantConfig
from reference.gemm import AUX_INPUT_EPILOGUES
from reference.layouts import GEMM_LAYOUTS
from reference.spec import TORCH_DTYPES

from .cases import DISTRIBUTIONS, Case
from .draws import Draws, exp, pow2

T = TypeVar("T")
PER_TENSOR_TILE = 32  # pattern tile of per-tensor schemes (they have no blocks)
# NUMERICS: §6 exact-representable mode - sum_k |t_k| <= 2^13 q (Hopper fast-accumulation bound).
EXACT_SUM_BITS = 13
EXACT_OUT_BITS = 14  # keep |Y| <= 2^14 so float16 outputs cannot overflow
# Quiet-NaN bit patterns of the input dtypes (IEEE binary32/binary16 and bfloat16 layouts): (view, bits, sign bit).
_NAN_BITS = {"bfloat16": (torch.int16, 0x7FC0, 15), "float16": (torch.int16, 0x7E00, 15), "float32": (torch.int32, 0x7FC00000, 31)}


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def draw_seed(case: Case, name: str) -> int:
    """The 63-bit seed of a tensor's draws: a stable hash of (seed, distribution, shape, layout, tensor name)."""
    key = f"{case.seed}|{case.distribution}|{'x'.join(map(str, case.shape))}|{case.layout}|{name}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & ((1 << 63) - 1)


def case_draws(case: Case, name: str, device: torch.device) -> Draws:
    """The random source of the case's tensor `name` on `device` (harness.draws: the same values on every device)."""
    return Draws(draw_seed(case, name), device)


def _dtype_limits(in_dtype: str) -> tuple[float, float, float]:
    """(max finite, min normal, min subnormal) of an input dtype (torch.finfo)."""
    fi = torch.finfo(TORCH_DTYPES[in_dtype])
    return float(fi.max), float(fi.smallest_normal), float(fi.smallest_normal * fi.eps)


def _delayed(cfg: QuantConfig) -> bool:
    """The scheme scales from an amax history (docs/numerics.md §2): the fresh state's scale is 1."""
    return cfg.scheme_row.amax_history


def _two_level(cfg: QuantConfig) -> bool:
    """The scheme has a global (second-level) scale from the copy's amax (docs/numerics.md §5.1-§5.3)."""
    return cfg.scheme_row.global_amax


def _block(cfg: QuantConfig) -> int:
    return cfg.block if cfg.block is not None else PER_TENSOR_TILE


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    return math.prod(shape[:-1]), shape[-1]


@functools.lru_cache(maxsize=256)
def _tile_diag(rt: int, ct: int, device: torch.device) -> torch.Tensor:
    """The `_Grid.diag` pattern of one rt x ct tile: (i, i mod ct) and (j mod rt, j). Cached: never
    mutate the returned tensor."""
    i = torch.arange(rt, dtype=torch.int32, device=device).unsqueeze(1)
    j = torch.arange(ct, dtype=torch.int32, device=device).unsqueeze(0)
    return (j == i % ct) | (i == j % rt)


class _Grid:
    """Tile geometry of a [rows, cols] tensor cut into tr x tc tiles (partial edge tiles allowed).

    `diag` marks one element of every row segment and of every column segment of each tile:
    (i, i mod c_t) and (j mod r_t, j), with r_t x c_t the tile's actual size.
    """

    def __init__(self, rows: int, cols: int, tr: int, tc: int, device: torch.device) -> None:
        self.rows, self.cols, self.tr, self.tc, self.device = rows, cols, tr, tc, device
        self.nti, self.ntj = -(-rows // tr), -(-cols // tc)

    @property
    def i(self) -> torch.Tensor:
        """(rows, 1) row offset inside the tile."""
        return (torch.arange(self.rows, device=self.device) % self.tr).unsqueeze(1)

    @property
    def j(self) -> torch.Tensor:
        """(1, cols) column offset inside the tile."""
        return (torch.arange(self.cols, device=self.device) % self.tc).unsqueeze(0)

    @functools.cached_property
    def diag(self) -> torch.Tensor:
        """(rows, cols) bool; built on first use (per_tile_scales never needs it) from the patterns of
        the (at most four) tile sizes, each tiled over its part of the tensor."""
        tr, tc = self.tr, self.tc
        if self.rows == 0 or self.cols == 0:
            return torch.zeros(self.rows, self.cols, dtype=torch.bool, device=self.device)
        fr, fc = self.rows // tr, self.cols // tc  # full tiles per column / row of tiles
        er, ec = self.rows - fr * tr, self.cols - fc * tc  # edge tile height / width (0: none)
        bands = []
        for n_r, rt in ((fr, tr), (1, er)):
            if n_r and rt:
                parts = [_tile_diag(rt, ct, self.device).repeat(n_r, n_c) for n_c, ct in ((fc, tc), (1, ec)) if n_c and ct]
                bands.append(torch.cat(parts, 1) if len(parts) > 1 else parts[0])
        return torch.cat(bands, 0) if len(bands) > 1 else bands[0]

    def per_tile(self, t: torch.Tensor) -> torch.Tensor:
        """[nti, ntj] per-tile values -> [rows, cols] (contiguous): each tile's value broadcast over the
        tile, the padded edge cut off."""
        full = t[:, None, :, None].expand(self.nti, self.tr, self.ntj, self.tc).reshape(self.nti * self.tr, self.ntj * self.tc)
        if full.shape == (self.rows, self.cols):
            return full
        return full[: self.rows, : self.cols].contiguous()

    def tile_index(self) -> torch.Tensor:
        """[nti, ntj] row-major tile numbers (spread with `per_tile`)."""
        return torch.arange(self.nti * self.ntj, device=self.device).reshape(self.nti, self.ntj)


def _grid_values(fmt, device: torch.device) -> torch.Tensor:
    """Non-negative finite values of an element format, ascending (float64), from casts.decode."""
    codes = torch.arange(0, fmt.max_code + 1, dtype=torch.int64, device=device)
    v = casts.decode(codes.to(torch.uint8), fmt).to(torch.float64)
    return v[torch.isfinite(v)]


def _midpoints(fmt, below: float, device: torch.device) -> torch.Tensor:
    """Rounding midpoints of `fmt` (including the overflow midpoint past max) strictly below `below`."""
    v = _grid_values(fmt, device)
    nxt = fmt.max_finite + 2.0 ** (fmt.emax - fmt.man_bits)  # the would-be next grid value past max
    v = torch.cat([v, torch.tensor([nxt], dtype=torch.float64, device=device)])
    mids = (v[:-1] + v[1:]) / 2
    return mids[mids < below]


@functools.lru_cache(maxsize=None)
def _code_values(fmt, device: torch.device) -> torch.Tensor:
    """The value of every code of `fmt` (float64, indexed by the code), from casts.decode. Cached: never
    mutate the returned tensor."""
    return casts.decode(torch.arange(1 << fmt.bits, device=device).to(torch.uint8), fmt).to(torch.float64)


def _finite_codes(fmt, device: torch.device) -> torch.Tensor:
    """Every finite code of `fmt` (both signs, NaN and Inf codes excluded), uint8."""
    codes = torch.arange(0, 1 << fmt.bits, dtype=torch.int64, device=device).to(torch.uint8)
    v = casts.decode(codes, fmt)
    return codes[torch.isfinite(v)]


def _anchor(cfg: QuantConfig) -> float:
    """A*: the scaled-domain block maximum that makes the decode scale an exact power of two."""
    fmt = cfg.element_format
    if _delayed(cfg):
        # NUMERICS: §2 - S_max = fp8_max * 2^-margin; amax = S_max gives scale 1 (as the fresh state).
        return math.ldexp(fmt.max_finite, -cfg.margin)
    return fmt.max_finite


def _k_range(cfg: QuantConfig, in_dtype: str, top: float, quantum: float) -> tuple[int, int]:
    """Exponents k such that top * 2^k fits the dtype (with headroom) and quantum * 2^k >= its min subnormal."""
    dmax, _, dsub = _dtype_limits(in_dtype)
    hi = min(20, math.floor(math.log2(dmax / (4 * top))))
    lo = max(-20, math.ceil(math.log2(dsub / quantum)))
    if in_dtype == "float16":
        lo, hi = max(lo, -6), min(hi, 6)
    return lo, max(lo, hi)


def _tile_scales(cfg: QuantConfig, grid: _Grid, lo: int, hi: int, d: Draws) -> torch.Tensor:
    """2^k per element (float64): k drawn once per tile (block schemes), once for the tensor
    (fp8_current), or 0 (fp8_delayed); the powers are formed per tile, then spread."""
    if _delayed(cfg):
        return pow2(torch.zeros(1, 1, dtype=torch.int64, device=d.device))
    if cfg.tile is None:
        return pow2(d.integers(lo, hi, (1, 1)))
    return grid.per_tile(pow2(d.integers(lo, hi, (grid.nti, grid.ntj))))


# ----------------------------------------------------------------------------------------------
# Unstructured distributions
# ----------------------------------------------------------------------------------------------


def _normal(rows, cols, d: Draws):
    return d.normal((rows, cols))


def _uniform(rows, cols, d: Draws):
    return d.uniform((rows, cols)).mul_(2).sub_(1)  # NUMERICS: §0.2 - exact: [-1, 1) on multiples of 2^-52


def _heavy_tail(rows, cols, d: Draws, in_dtype):
    dmax, _, _ = _dtype_limits(in_dtype)
    # e^(2 z) by harness.draws.exp (device-independent), chunk by chunk inside the normal draw.
    mag = d.normal((rows, cols), then=lambda z: exp(z * 2.0)).clamp_(max=min(dmax / 4, 1e30))
    return d.signs((rows, cols)).mul_(mag)


def _outliers(rows, cols, d: Draws):
    x = d.normal((rows, cols))
    n = rows * cols
    n_out = max(1, n // 1000)
    pos = d.positions(n_out, n)
    mag = pow2(d.integers(6, 12, n_out)) * (1 + d.uniform(n_out))
    x.view(-1)[pos] = mag * d.signs(n_out)
    return x


def _scale_tiles(cfg: QuantConfig, orientation: str) -> tuple[int, int]:
    """The tiles per_tile_scales scales together: the blocks of the consumed copy (2-D tiles as they are)."""
    b = _block(cfg)
    if cfg.is_2d:
        return tuple(cfg.tile)
    if orientation == "colwise":
        return b, 1  # blocks run along M for the consumed columnwise copy
    return 1, b


def _per_tile_scales(cfg, rows, cols, d: Draws, in_dtype, orientation):
    grid = _Grid(rows, cols, *_scale_tiles(cfg, orientation), d.device)
    span = 8 if in_dtype == "float16" else 40
    scale = grid.per_tile(pow2(d.integers(-span, span, (grid.nti, grid.ntj))))
    return d.normal((rows, cols)) * scale


# ----------------------------------------------------------------------------------------------
# Structured distributions: ties, exhaustive, special
# ----------------------------------------------------------------------------------------------


def _nvfp4_global(d: Draws, in_dtype: str) -> int:
    """g with S_enc = 2^g: the global amax is 2688 * 2^-g (docs/numerics.md §5.1); drawn on the host."""
    return d.integer(-2, 2)


def _ties(cfg, rows, cols, d: Draws, in_dtype):
    fmt = cfg.element_format
    a_star = _anchor(cfg)
    mids = _midpoints(fmt, a_star, d.device)  # NUMERICS: §0.5 ties round to the even code
    t = _block(cfg)
    grid = _Grid(rows, cols, t, t, d.device)
    y = mids[d.integers(0, mids.numel() - 1, (rows, cols))]
    y.masked_fill_(grid.diag, a_star)
    y *= d.signs((rows, cols))
    if _two_level(cfg):
        # NUMERICS: §5.1-§5.3 - S_enc = 2^gexp; a block with amax 6 * 2^(j - gexp) gets
        # d = RN(6 * 2^j * fl(1/6)) = 2^j exactly, s_blk = 2^j, f = 2^(gexp - j): y lands on x * f.
        gexp = _nvfp4_global(d, in_dtype)
        j = d.integers(-6, 0, (grid.nti, grid.ntj))
        x = y * grid.per_tile(pow2(j - gexp))
        x[0, 0] = math.ldexp(fmt.max_finite * E4M3.max_finite, -gexp)  # the global amax
        return x
    lo, hi = _k_range(cfg, in_dtype, max(a_star, fmt.max_finite), fmt.min_subnormal / 2)
    return y * _tile_scales(cfg, grid, lo, hi, d)


def _exhaustive(cfg, rows, cols, d: Draws, in_dtype):
    fmt = cfg.element_format
    if _two_level(cfg):
        t = cfg.block
        grid = _Grid(rows, cols, t, t, d.device)
        n_codes = 1 << fmt.bits
        off = grid.per_tile(d.integers(0, n_codes - 1, (grid.nti, grid.ntj), dtype=torch.int32))
        off += grid.i.to(torch.int32)
        off += grid.j.to(torch.int32)
        off %= n_codes  # every row and column segment holds all 16 codes
        v = _code_values(fmt, d.device)[off]
        # Block scales: every positive E4M3 code, the first tile at max (so A_g = 2688 * 2^-gexp).
        n_scales = E4M3.max_code
        s_code = (E4M3.max_code - grid.tile_index() % n_scales).to(torch.uint8)
        s = grid.per_tile(casts.decode(s_code, E4M3).to(torch.float64))
        gexp = _nvfp4_global(d, in_dtype)
        return v * s * math.ldexp(1.0, -gexp)
    a_star = _anchor(cfg)
    codes = _finite_codes(fmt, d.device)
    vals = casts.decode(codes, fmt).to(torch.float64)
    vals = vals[vals.abs() <= a_star]
    t = _block(cfg)
    grid = _Grid(rows, cols, t, t, d.device)
    off = d.integer(0, vals.numel() - 1)
    # Element m (row-major) holds vals[(m + off) % n]: the rolled table repeated.
    n = vals.numel()
    y = vals.roll(-off).repeat(-(-rows * cols // n))[: rows * cols].reshape(rows, cols)
    y = torch.where(grid.diag, a_star * d.signs((rows, cols)), y)
    lo, hi = _k_range(cfg, in_dtype, max(a_star, fmt.max_finite), fmt.min_subnormal)
    return y * _tile_scales(cfg, grid, lo, hi, d)


SPECIAL_PATTERNS = (
    "normal",
    "zeros",
    "signed_zeros",
    "nan_sprinkled",
    "inf_sprinkled",
    "subnormals",
    "all_max",
    "tiny_amax",
    "single_nonzero",
    "all_nan",
    "constant",
)


# The NaN-only and Inf-only variants of `special` (docs/numerics.md §11): one Inf input makes an NVFP4 tensor's
# global amax +inf, so in `special` every NVFP4 NaN case sits behind an Inf; these keep the two apart.
SPECIAL_VARIANTS = {
    "special": SPECIAL_PATTERNS,
    "special_nan": tuple(p for p in SPECIAL_PATTERNS if p != "inf_sprinkled"),
    "special_inf": tuple(p for p in SPECIAL_PATTERNS if p not in ("nan_sprinkled", "all_nan")),
}
SPECIAL_MIN_TILE = 16


def _special(cfg, rows, cols, d: Draws, in_dtype, seed, patterns: tuple[str, ...] = SPECIAL_PATTERNS):
    """(values float64, negative-NaN mask): one `patterns` entry (SPECIAL_PATTERNS, or a variant's) per T x T tile."""
    dmax, dmin_normal, dsub = _dtype_limits(in_dtype)
    t = _block(cfg)
    # Small tensors: shrink the tile (powers of two >= 16) until every pattern gets ~2 tiles.
    while t > SPECIAL_MIN_TILE and -(-rows // t) * -(-cols // t) < 2 * len(patterns):
        t //= 2
    grid = _Grid(rows, cols, t, t, d.device)
    pat = grid.per_tile(((grid.tile_index() + seed) % len(patterns)).to(torch.int8))
    n = rows * cols
    base = d.normal(n)
    sign_bit = d.sign_bits(n)  # widened to +-1.0 only where a pattern uses it
    sprinkle = d.bernoulli(0.125, n)
    sub_mant = d.integers(1, (1 << 6) - 1, n, dtype=torch.int8)
    const = pow2(d.integers(-8, 8, (grid.nti, grid.ntj)))  # per tile

    def sign(i):
        return sign_bit[i].to(torch.float64) * 2 - 1

    nan, inf = float("nan"), float("inf")
    # Each element takes the value of its tile's pattern (the patterns are disjoint), computed on
    # that pattern's elements only: f(i) gets their flat indices and returns their values.
    rule = {
        "zeros": lambda i: torch.zeros(i.numel(), dtype=torch.float64, device=d.device),
        "signed_zeros": lambda i: torch.where(sign_bit[i] == 0, -0.0, 0.0).to(torch.float64),
        "nan_sprinkled": lambda i: torch.where(sprinkle[i], nan, base[i]),
        "inf_sprinkled": lambda i: torch.where(sprinkle[i], sign(i) * inf, base[i]),
        # Subnormals of the input dtype: integer multiples (1..63) of its min subnormal, all < min normal.
        "subnormals": lambda i: sign(i) * torch.clamp(sub_mant[i].to(torch.float64) * dsub, max=dmin_normal / 2),
        "all_max": lambda i: sign(i) * dmax,
        "tiny_amax": lambda i: base[i] * dmin_normal,
        "single_nonzero": lambda i: torch.where(grid.diag.reshape(-1)[i], base[i], 0.0),
        "all_nan": lambda i: torch.full((i.numel(),), nan, dtype=torch.float64, device=d.device),
        "constant": lambda i: sign(i) * const[i // cols // t, i % cols // t],
    }
    pat = pat.reshape(-1)
    # In place: each pattern reads `base` only at its own elements, and the patterns are disjoint.
    x = base
    for k, name in enumerate(patterns):
        if name in rule:  # "normal" keeps base
            idx = (pat == k).nonzero().squeeze(1)
            x[idx] = rule[name](idx)
    neg_nan = torch.isnan(x) & (sign_bit == 0)
    return x.reshape(rows, cols), neg_nan.reshape(rows, cols)


# ----------------------------------------------------------------------------------------------
# Exact-representable GEMM operands (docs/numerics.md §6)
# ----------------------------------------------------------------------------------------------


def _exact_budget(k: int) -> tuple[int, int]:
    """(bits, stride): value/scale spread bits and the K stride of non-zero products, so that the
    number of non-zero products (<= ceil(K/stride)) times 2^bits is <= 2^EXACT_SUM_BITS."""
    lg = max(0, math.ceil(math.log2(max(k, 1))))
    bits = EXACT_SUM_BITS - lg
    if bits >= 0:
        return bits, 1
    return 0, 1 << (-bits)


def _exact_plan(cfg_a: QuantConfig, cfg_b: QuantConfig, k: int) -> dict:
    """Spread bits per operand (L: element levels, S: block-scale levels) and base exponents."""
    bits, stride = _exact_budget(k)
    plans = {}
    for role, cfg in (("a", cfg_a), ("b", cfg_b)):
        block_scaled = cfg.tile is not None
        s = bits // 4 if block_scaled else 0
        plans[role] = {"S": s}
    left = bits - plans["a"]["S"] - plans["b"]["S"]
    plans["a"]["L"] = left // 2
    plans["b"]["L"] = left - left // 2
    for role, cfg in (("a", cfg_a), ("b", cfg_b)):
        p = plans[role]
        if _two_level(cfg):
            p["L"] = min(p["L"], 3)  # E2M1 powers of two: 4, 2, 1, 0.5
            p["base"] = 2.0 ** (cfg.element_format.emax)  # 4
        else:
            p["base"] = 1.0
        p["stride"] = stride
    return plans


def _exact_klast(cfg: QuantConfig, lines: int, k: int, role: str, plan: dict, t0: int, s_dec: float,
                 d: Draws) -> torch.Tensor:
    """One operand in K-last form [lines, K] (blocks along K): anchors, zeros, +-2^-i values."""
    blk = cfg.block if cfg.block is not None else k
    own, other = (0, 1) if role == "a" else (1, 0)
    grid = _Grid(lines, k, cfg.tile[0] if cfg.is_2d else 1, blk, d.device)
    off = grid.j  # (1, K) offset inside the K block
    # Block-scale exponent t per tile (D = 2^-(t0 + t) * s_dec); per-tensor schemes: t = 0.
    if cfg.tile is None:
        scale = pow2(-torch.full((1, 1), t0, dtype=torch.int64, device=d.device)) * s_dec
    else:
        t = d.integers(0, plan["S"], (grid.nti, grid.ntj))
        scale = grid.per_tile(pow2(-(t + t0)) * s_dec)
    i = d.integers(0, plan["L"], (lines, k))
    # base * 2^-i from the table of the L + 1 levels (exact powers of two), then the random sign.
    v = (plan["base"] * pow2(-torch.arange(plan["L"] + 1, device=d.device)))[i]
    v *= d.signs((lines, k))
    v.masked_fill_(d.bernoulli(0.25, (lines, k)), 0.0)
    col = torch.arange(k, device=d.device).unsqueeze(0)
    if plan["stride"] > 1 and role == "a":
        v.masked_fill_(col % plan["stride"] != 0, 0.0)
    anchor = cfg.element_format.max_finite if _two_level(cfg) else _anchor(cfg)
    # The anchor columns (K-offset `own` in every block) take anchor * a random sign (drawn everywhere).
    at = (off[0] == own).nonzero().squeeze(1)
    v[:, at] = d.signs((lines, k))[:, at].mul_(anchor)
    v.masked_fill_(off == other, 0.0)
    if role == "b" and cfg.block is not None and k % blk == 1:
        v[:, k - 1] = 0.0  # a one-element last block cannot hold B's anchor: keep it all zero (scale 1)
    x = v * scale
    if _two_level(cfg):
        # NUMERICS: §5.1, §5.8 - global amax 2688 * s_dec at B's/A's anchor offset of block 0;
        # the rest of that tile is zero (its scale is 448, its anchors never meet the other operand).
        tile_rows = cfg.tile[0]
        x[:tile_rows, :blk] = torch.where(off[:, :blk] == own, x[:tile_rows, :blk], torch.zeros_like(x[:tile_rows, :blk]))
        x[0, own] = cfg.element_format.max_finite * E4M3.max_finite * s_dec
    return x


def _exact_gemm(case: Case, d: Draws) -> dict[str, torch.Tensor]:
    m, n, k = case.shape
    cfg_a, cfg_b = case.config, case.b_config
    plans = _exact_plan(cfg_a, cfg_b, k)
    s_dec = {}
    t0 = {}
    for role, cfg in (("a", cfg_a), ("b", cfg_b)):
        # NUMERICS: §6 - NVFP4 global amax 2688 (S_dec 1) or 21504 (S_dec 8): alpha is a power of two.
        s_dec[role] = (1.0, 8.0)[d.integer(0, 1)] if _two_level(cfg) else 1.0
    # Shift the block scales down so that |Y| <= 2^EXACT_OUT_BITS (float16 outputs).
    lg = max(0, math.ceil(math.log2(k)))
    top = lg + sum(math.log2(plans[r]["base"] * s_dec[r]) for r in ("a", "b"))
    shift = max(0, math.ceil(top - EXACT_OUT_BITS))
    for role, cfg in (("a", cfg_a), ("b", cfg_b)):
        share = shift // 2 if role == "a" else shift - shift // 2
        t0[role] = 0 if _delayed(cfg) else share
        if _two_level(cfg):
            # NUMERICS: §5.2 - s_blk = 2^-(t0 + t) must stay an E4M3 power of two (>= 2^-9).
            t0[role] = min(t0[role], -E4M3.emin + E4M3.man_bits)
            plans[role]["S"] = max(0, min(plans[role]["S"], -E4M3.emin + E4M3.man_bits - t0[role]))
    a_kl = _exact_klast(cfg_a, m, k, "a", plans["a"], t0["a"], s_dec["a"], d)  # (M, K)
    b_kl = _exact_klast(cfg_b, n, k, "b", plans["b"], t0["b"], s_dec["b"], d)  # (N, K)
    lay = GEMM_LAYOUTS[case.layout]
    out = {
        "a": a_kl if lay.a == "rowwise" else a_kl.t().contiguous(),  # TN/NN: [M, K]; NT: [K, M]
        "b": b_kl if lay.b == "rowwise" else b_kl.t().contiguous(),  # TN: [N, K]; NN/NT: [K, N]
    }
    # q: the common power of two of all products (x-domain), C and bias are small multiples of it.
    q = 1.0
    for role in ("a", "b"):
        p = plans[role]
        q *= p["base"] * 2.0 ** -(p["L"] + p["S"] + t0[role]) * s_dec[role]
    if case.accumulate:
        c = d.integers(-64, 64, (m, n)).to(torch.float64) * pow2(d.integers(0, 3, (m, n)))
        out["c"] = c * q
    if case.bias:
        bv = d.integers(-64, 64, n).to(torch.float64) * pow2(d.integers(0, 3, n))
        out["bias"] = bv * q
    return out


# ----------------------------------------------------------------------------------------------
# Public entry point
# ----------------------------------------------------------------------------------------------


def _cast(x: torch.Tensor, in_dtype: str, neg_nan: torch.Tensor | None = None) -> torch.Tensor:
    """float64 values -> in_dtype (one rounding through fp32 is exact for every structured value);
    NaN lanes get the canonical quiet NaN with their intended sign (torch's bf16 cast drops it)."""
    dt = TORCH_DTYPES[in_dtype]
    y = x.to(torch.float32).to(dt)
    nan = torch.isnan(y)
    if bool(nan.any()):
        ity, qnan, sbit = _NAN_BITS[in_dtype]
        neg = neg_nan if neg_nan is not None else torch.zeros_like(nan)
        bits = torch.where(neg, qnan - (1 << sbit), qnan).to(torch.int64)
        yb = y.view(ity).clone()
        yb[nan] = bits[nan].to(ity)
        y = yb.view(dt)
    return y


def _operand(case: Case, cfg: QuantConfig, shape: tuple[int, ...], orientation: str, name: str,
             device: torch.device, in_dtype: str | None = None) -> torch.Tensor:
    """One high-precision operand of `shape` for `cfg` (its consumed orientation), in `in_dtype` (default
    case.in_dtype; a GEMM's B operand: case.b_in_dtype), generated on `device`."""
    d = case_draws(case, name, device)
    dt = in_dtype or case.in_dtype
    rows, cols = _rows_cols(shape)
    dist = case.distribution
    neg_nan = None
    transpose = orientation == "colwise" and dist in ("exact_representable",)
    if transpose:
        rows, cols = cols, rows
    if dist == "normal":
        x = _normal(rows, cols, d)
    elif dist == "uniform":
        x = _uniform(rows, cols, d)
    elif dist == "heavy_tail":
        x = _heavy_tail(rows, cols, d, dt)
    elif dist == "outliers":
        x = _outliers(rows, cols, d)
    elif dist == "per_tile_scales":
        x = _per_tile_scales(cfg, rows, cols, d, dt, orientation)
    elif dist == "ties":
        x = _ties(cfg, rows, cols, d, dt)
    elif dist == "exhaustive":
        x = _exhaustive(cfg, rows, cols, d, dt)
    elif dist in SPECIAL_VARIANTS:
        x, neg_nan = _special(cfg, rows, cols, d, dt, case.seed, SPECIAL_VARIANTS[dist])
    elif dist == "exact_representable":
        plan = _exact_plan(cfg, cfg, cols)["a"]
        x = _exact_klast(cfg, rows, cols, "a", plan, 0, 1.0, d)
    else:  # pragma: no cover - Case validates the name
        raise ValueError(f"unknown distribution {dist!r}; expected one of {DISTRIBUTIONS}")
    if transpose:
        x = x.t().contiguous()
        neg_nan = None if neg_nan is None else neg_nan.t().contiguous()
    return _cast(x, dt, neg_nan).reshape(shape)


# Distributions whose values depend only on the draw seed key, the shape and the input dtype, not on
# the case's configs or orientation (the structured ones are built around a scheme's blocks).
CONFIG_FREE = ("normal", "uniform", "heavy_tail", "outliers")


def _config_key(distribution: str, cfg: QuantConfig, orientation: str | None) -> tuple:
    """What a distribution reads from one operand's config and consumed orientation: nothing
    (CONFIG_FREE); special only its pattern tile (`_block`), per_tile_scales only its tiles
    (`_scale_tiles`), ties and exhaustive the element format, the scheme's branches, the anchor
    (`_anchor`: fp8_delayed's margin), the block and whether there are block scales (`_tile_scales`);
    anything else (conservatively) the whole config and orientation. test_inputs checks equal keys
    give equal bytes."""
    if distribution in CONFIG_FREE:
        return ()
    if distribution in SPECIAL_VARIANTS:
        return ("block", _block(cfg))
    if distribution == "per_tile_scales":
        return ("tiles", _scale_tiles(cfg, orientation))
    if distribution in ("ties", "exhaustive"):
        return ("grid", cfg.scheme, cfg.element_format, _anchor(cfg), _block(cfg), cfg.tile is None)
    return (cfg, orientation)


def input_key(case: Case) -> tuple:
    """A key that determines `generate(case)`: cases with equal keys get identical inputs.

    Everything generate reads: the op family (x vs a/b), shape, layout, seed, distribution and input
    dtype (the `draw_seed` key and `_cast`); for GEMMs, accumulate / bias and the output dtype of C
    and bias; whether an SR seed is attached; and what the distribution reads from each operand's
    config and consumed orientation (`_config_key`). Used to reuse one generation for consecutive cases.
    """
    if case.op == "linear":  # harness.module_inputs: everything is drawn from the case itself
        return ("linear", case)
    gemm = case.op == "gemm"
    stochastic = case.config.stochastic or bool(gemm and case.b_config is not None and case.b_config.stochastic)
    dist = case.distribution
    key: tuple = (gemm, tuple(case.shape), case.layout, case.seed, dist, case.in_dtype, stochastic)
    if gemm:
        key += (case.accumulate, case.bias, case.out_dtype if (case.accumulate or case.bias) else None)
        if case.b_in_dtype is not None or case.epilogue in AUX_INPUT_EPILOGUES:
            key += (case.b_in_dtype, case.epilogue in AUX_INPUT_EPILOGUES, case.out_dtype)
    if not gemm:
        return key + _config_key(dist, case.config, case.orientation)
    if dist == "exact_representable":  # both configs shape both operands (_exact_gemm)
        return key + (case.config, case.b_config, case.orientation)
    ca, cb = GEMM_LAYOUTS[case.layout].consumes
    return key + _config_key(dist, case.config, ca) + _config_key(dist, case.b_config, cb)


def input_groups(items: Iterable[T], case: Callable[[T], Case] = lambda c: c) -> list[list[T]]:
    """`items` grouped by the input_key of `case(item)`, groups and members in order of first appearance."""
    groups: dict[tuple, list[T]] = {}
    for item in items:
        groups.setdefault(input_key(case(item)), []).append(item)
    return list(groups.values())


def _normal32(case: Case, name: str, shape, device: torch.device) -> torch.Tensor:
    """N(0, 1) rounded to fp32 (a GEMM's C, bias or aux before the cast to the output dtype)."""
    # NUMERICS: §0.2 - float64 -> fp32 -> output dtype, each a round-to-nearest-even cast, the same on every device.
    return case_draws(case, name, device).normal(shape).to(torch.float32)


def generate(case: Case, device: str | torch.device = "cpu") -> dict:
    """The case's inputs (docs/design.md §5), generated on `device` (the same bytes on every device):
    quantize/dequantize -> {"x"}; gemm -> {"a", "b"} in the layout's logical shapes, plus "c" [M, N]
    (accumulate) and "bias" [N] (bias) in the output dtype; "rng" = (seed, stream 0) when a config
    rounds stochastically (B uses stream + 2)."""
    dev = torch.device(device)
    if case.op == "linear":
        from .module_inputs import generate_module  # noqa: PLC0415

        return generate_module(case, dev)
    out: dict = {}
    if case.op != "gemm":  # quantize, dequantize, grouped_quantize
        out["x"] = _operand(case, case.config, case.shape, case.orientation, "x", dev)
        stochastic = case.config.stochastic
    else:
        shapes = case.operand_shapes
        out_dt = TORCH_DTYPES[case.out_dtype]
        if case.distribution == "exact_representable":
            exact = _exact_gemm(case, case_draws(case, "gemm", dev))
            out["a"] = _cast(exact["a"], case.in_dtype)
            out["b"] = _cast(exact["b"], case.b_in_dtype or case.in_dtype)
            for name in ("c", "bias"):
                if name in exact:
                    out[name] = exact[name].to(torch.float32).to(out_dt)
        else:
            ca, cb = GEMM_LAYOUTS[case.layout].consumes
            out["a"] = _operand(case, case.config, shapes["a"], ca, "a", dev)
            out["b"] = _operand(case, case.b_config, shapes["b"], cb, "b", dev, case.b_in_dtype)
            if case.accumulate:
                out["c"] = _normal32(case, "c", shapes["c"], dev).to(out_dt)
            if case.bias:
                out["bias"] = _normal32(case, "bias", shapes["bias"], dev).to(out_dt)
        if case.epilogue in AUX_INPUT_EPILOGUES:  # the forward's pre-activation, in the output dtype
            out["aux"] = _normal32(case, "aux", shapes["c"], dev).to(out_dt)
        stochastic = case.config.stochastic or case.b_config.stochastic
    if stochastic:
        out["rng"] = (case.seed, 0)
    return out
