"""Statistical verification of stochastic rounding for kernels that draw their own random bits.

Source: docs/numerics.md §12.3. A kernel whose SR bits are its own (TE draws them per CUDA thread,
docs/numerics.md §7.12) can never match the Philox contract of §5.7 byte for byte. A backend that says
so (`sr_bits = "own"`) gets this mode for every stochastic quantize case instead of the byte comparison
of its data: the harness draws `DRAWS` quantizations with fresh seeds and checks, per copy,

1. `neighbours`: every code is one of the two E2M1 grid neighbours of its scaled value y (with y's sign);
2. `unbiased`: the number of round-ups is binomial with p = (|y| − lo)/(hi − lo), tested on two
   contrasts over all elements (the plain sum and the sum weighted by p − 1/2, so a rule that is biased
   up for small p and down for large p cannot cancel out) against Z_BOUND standard deviations plus the
   resolution of R_BITS random bits; block-maximum elements are masked (their y sits at the top of the
   grid, and a y just above 6 saturates deterministically);
3. `beats_rtn`: the mean of the draws is closer to y than round-to-nearest (sum of |error| over the
   unmasked elements);
4. `draws_differ`: two draws are not identical wherever a draw can differ.

The scales and global amaxes do not depend on the random bits and are still compared byte for byte
(with the first draw). Only schemes with SR (today NVFP4) reach this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from reference import casts, nvfp4, stochastic
from reference.formats import FORMATS
from reference.types import SRSeed

from .compare import TensorResult

DRAWS = 64  # quantizations per case
Z_BOUND = 6.0  # standard deviations allowed per contrast: a false alarm below 2e-9 (normal tail)
R_BITS = 8  # random bits per element of the §5.7 rule: p is realised to within 2^-R_BITS
SR_BITS_OWN = "own"  # the value of a backend's `sr_bits` attribute that selects this mode
_E2M1 = FORMATS["e2m1"]


def bits_are_own(backend) -> bool:
    """True when the backend declares that its SR random bits are its own (`sr_bits = "own"`)."""
    return getattr(backend, "sr_bits", None) == SR_BITS_OWN


def applies(case, backend) -> bool:
    """This mode replaces the byte comparison of the data for stochastic quantize cases of own-bits backends."""
    return case.op == "quantize" and bool(case.config.stochastic) and bits_are_own(backend)


def seeds(rng, n: int = DRAWS) -> list[tuple[int, int]]:
    """n fresh (seed, stream) pairs derived from the case's SR seed: seed + 1 + i, same stream."""
    s = SRSeed.coerce(rng if rng is not None else (0, 0))
    return [((s.seed + 1 + i) % 2**64, s.stream) for i in range(n)]


def draw(quantize: Callable, x: torch.Tensor, config, *, rowwise: bool, colwise: bool, rng, n: int = DRAWS) -> list:
    """n quantizations of x, each with its own fresh seed (`seeds`)."""
    return [quantize(x, config, rowwise=rowwise, colwise=colwise, rng=sd) for sd in seeds(rng, n)]


# ----------------------------------------------------------------------------------------------
# The scaled values and the grid
# ----------------------------------------------------------------------------------------------


@dataclass
class Scaled:
    """One copy's scaled values y [R, C] (its own layout), their grid neighbours and the mask."""

    y: torch.Tensor  # fp32 RN(source * f)
    lo: torch.Tensor  # largest grid value <= |y| (6 for |y| > 6)
    hi: torch.Tensor  # smallest grid value >= |y| (6 for |y| > 6)
    p: torch.Tensor  # fp64 probability of rounding up, (|y| - lo) / (hi - lo), 0 where lo == hi
    tested: torch.Tensor  # bool: finite and not a block maximum


def scaled(x2d: torch.Tensor, config, orientation: str) -> Scaled:
    """The golden scaled values of one copy (docs/numerics.md §5.3, §5.4: y = RN(x * f))."""
    ch = nvfp4.scale_chain(x2d, config, orientation)
    src = ch["source"].to(torch.float32)
    rows, cols = src.shape
    blk = config.block
    # NUMERICS: §5.4 - y = RN(x * f), one fp32 multiply per element.
    y = (src.reshape(rows, cols // blk, blk) * ch["f"][:, :, None]).reshape(rows, cols)
    a = y.abs()
    grid = stochastic.e2m1_grid(y.device)
    top = grid[-1]
    idx = torch.searchsorted(grid, a.clamp(max=top).nan_to_num(0.0).contiguous(), right=True) - 1  # lo = grid[idx]
    lo = grid[idx.clamp(min=0)]
    hi = grid[(idx + (lo < a).long()).clamp(max=grid.numel() - 1)]
    lo = torch.where(a > top, top, lo)
    hi = torch.where(a > top, top, hi)
    span = (hi - lo).to(torch.float64)
    p = torch.where(span > 0, (a.to(torch.float64) - lo.to(torch.float64)) / span.clamp(min=1e-300), 0.0)
    # Block maxima: |x| equal to its block's amax (docs/numerics.md §12.3: masked from the mean test).
    blockmax = src.abs().reshape(rows, cols // blk, blk) == ch["A_b"][:, :, None]
    tested = torch.isfinite(y) & ~blockmax.reshape(rows, cols)
    return Scaled(y, lo, hi, p, tested)


def copy_codes(q, orientation: str) -> torch.Tensor:
    """The unpacked E2M1 codes [R, C] of one copy (uint8, sign in bit 3)."""
    return casts.unpack_nibbles(getattr(q, f"{orientation}_data"))


# ----------------------------------------------------------------------------------------------
# The checks
# ----------------------------------------------------------------------------------------------


def check_copy(name: str, codes: torch.Tensor, sc: Scaled) -> TensorResult:
    """The four checks of the module docstring on `codes` [N, R, C] (N draws) against the scaled values."""
    n_draws = codes.shape[0]
    grid = stochastic.e2m1_grid(codes.device)
    codes = codes.to(sc.y.device)
    mag = grid[(codes & _E2M1.max_code).long()]  # [N, R, C] |q|
    neg = (codes >> (_E2M1.bits - 1)).bool()
    y_neg = torch.signbit(sc.y) & ~torch.isnan(sc.y)
    finite = torch.isfinite(sc.y)
    on_lo, on_hi = mag == sc.lo, mag == sc.hi
    # 1. neighbours (every finite element, block maxima included): |q| in {lo, hi} and y's sign bit.
    bad = finite & ~((on_lo | on_hi) & (neg == y_neg))
    n_bad = int(bad.sum())
    detail: dict = {"draws": n_draws, "tested_elements": int(sc.tested.sum()), "neighbour_violations": n_bad}
    first = None
    if n_bad:
        d, r, c = (int(v) for v in bad.nonzero()[0])
        first = {"check": "neighbours", "draw": d, "row": r, "col": c, "y": float(sc.y[r, c]),
                 "lo": float(sc.lo[r, c]), "hi": float(sc.hi[r, c]), "code": f"0x{int(codes[d, r, c]):X}"}
    # 2. unbiased: round-ups k per element against N*p, two contrasts.
    t = sc.tested & (sc.hi > sc.lo)
    k = (on_hi & ~on_lo).sum(dim=0).to(torch.float64)[t]
    p = sc.p[t]
    var = n_draws * p * (1 - p)
    slack = n_draws * 2.0**-R_BITS
    contrasts = {}
    for cname, w in (("sum", torch.ones_like(p)), ("p_weighted", p - 0.5)):
        dev = float((w * (k - n_draws * p)).sum())
        bound = Z_BOUND * math.sqrt(float((w * w * var).sum())) + slack * float(w.abs().sum())
        contrasts[cname] = {"deviation": dev, "bound": bound, "ok": abs(dev) <= bound}
    detail["unbiased"] = contrasts
    unbiased = all(v["ok"] for v in contrasts.values())
    if first is None and not unbiased:
        first = {"check": "unbiased", **{c: {kk: v[kk] for kk in ("deviation", "bound")} for c, v in contrasts.items()}}
    # 3. beats round-to-nearest: mean of the draws vs RN, sum of |error| over the tested elements.
    sign = torch.where(y_neg, -1.0, 1.0)
    mean = (mag.to(torch.float64).mean(dim=0) * sign)[sc.tested]
    rtn = casts.decode(nvfp4.e2m1_rn(sc.y), _E2M1).to(torch.float64)[sc.tested]
    yt = sc.y.to(torch.float64)[sc.tested]
    err_sr, err_rtn = float((mean - yt).abs().sum()), float((rtn - yt).abs().sum())
    beats = err_sr < err_rtn or err_sr == err_rtn == 0.0
    detail["beats_rtn"] = {"mean_abs_err_sr": err_sr, "abs_err_rtn": err_rtn, "ok": beats}
    if first is None and not beats:
        first = {"check": "beats_rtn", "err_sr": err_sr, "err_rtn": err_rtn}
    # 4. two draws differ, wherever some element can round either way.
    can_differ = bool(t.any()) and n_draws >= 2
    differ = (not can_differ) or bool((codes[0] != codes[1]).any())
    detail["draws_differ"] = differ
    if first is None and not differ:
        first = {"check": "draws_differ", "detail": "draws 0 and 1 are identical"}
    failed = [c for c, ok in (("neighbours", n_bad == 0), ("unbiased", unbiased), ("beats_rtn", beats),
                              ("draws_differ", differ)) if not ok]
    n = int(finite.sum()) * n_draws
    return TensorResult(
        tensor=name, status="fail" if failed else "pass", n=n, n_mismatch=n_bad if n_bad else (n if failed else 0),
        mismatch_classes={f"sr_{c}": 1 for c in failed}, first_mismatch=first, detail=detail,
    )


def check_draws(draws: list, x: torch.Tensor, config) -> list[TensorResult]:
    """One TensorResult `<orientation>_data_sr` per copy the draws hold."""
    x2d = x.detach().reshape(-1, x.shape[-1])
    out = []
    for o in ("rowwise", "colwise"):
        if getattr(draws[0], f"{o}_data", None) is None:
            continue
        codes = torch.stack([copy_codes(q, o).to("cpu") for q in draws])
        out.append(check_copy(f"{o}_data_sr", codes, scaled(x2d.to("cpu"), config, o)))
    return out
