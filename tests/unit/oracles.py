"""Independent oracles shared by several test files (written apart from the code under test)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

from reference import nvfp4
from reference.formats import FORMATS

ML_FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def np_compute_scale(a, fp8_max, pow2, eps, v_inf):
    """docs/numerics.md §1 compute_scale in numpy float32 scalars; pow2 via frexp (not the bit mask)."""
    with np.errstate(over="ignore", divide="ignore"):
        a = np.float32(a)
        if a < np.float32(eps):
            a = np.float32(eps)
        if a == 0 or not np.isfinite(a):
            s = np.float32(1.0)
        else:
            s = np.float32(fp8_max) / a
            if np.isinf(s):
                s = np.float32(v_inf)
            if pow2:
                s = np.float32(math.ldexp(1.0, math.frexp(float(s))[1] - 1))
        return s, np.float32(1.0) / s


def scaled_by_encode_factor(q, x: torch.Tensor, o: str) -> torch.Tensor:
    """x times the encode factor the reference used, in the copy's data coordinates (fp64)."""
    cfg = q.config
    x2 = x.reshape(-1, x.shape[-1]).to(torch.float64)
    m, k = x2.shape
    sc = getattr(q, f"{o}_scale").to(torch.float64)
    if cfg.scheme == "nvfp4":
        ch = nvfp4.scale_chain(x.reshape(-1, x.shape[-1]), cfg, o)
        return ch["source"].to(torch.float64) * ch["f"].to(torch.float64).repeat_interleave(16, dim=1)
    if cfg.scheme == "mxfp8":
        mult = torch.ldexp(torch.ones_like(sc), (127 - sc).to(torch.int32))  # P(e) = 2^(127 - e)
        if o == "rowwise":
            return x2 * mult[:m, : k // 32].repeat_interleave(32, dim=1)
        return x2 * mult[: m // 32, :k].repeat_interleave(32, dim=0)
    src = x2 if o == "rowwise" else x2.t()
    r, c = src.shape
    if cfg.scheme in ("fp8_current", "fp8_delayed"):
        return src / sc.reshape(())
    b = 128
    if cfg.is_2d:
        sinv = sc.repeat_interleave(b, 0).repeat_interleave(b, 1)[:r, :c]
    else:
        sinv = sc.t().repeat_interleave(b, 1)[:r, :c]  # stored [c // 128, r] in data coordinates
    return src / sinv


def wide_range_input(seed: int, shape, dtype, *, row_exp, row_exp_f16, col_exp, inf_frac) -> torch.Tensor:
    """Per-row magnitudes 2^[row_exp) (2^[row_exp_f16) for fp16), per-column spread 2^[col_exp),
    5% zeros, 1% NaN and `inf_frac` inf: an input that exercises every scale-rule branch."""
    r = np.random.default_rng(seed)
    lo, hi = row_exp_f16 if dtype == torch.float16 else row_exp
    x = r.standard_normal(shape) * 2.0 ** r.integers(lo, hi, size=(shape[0], 1)).astype(np.float64)
    x *= 2.0 ** r.integers(col_exp[0], col_exp[1], size=(1, shape[1]))
    x[r.random(shape) < 0.05] = 0.0
    x[r.random(shape) < 0.01] = np.nan
    x[r.random(shape) < inf_frac] = np.inf
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


def oracle_codes(v: np.ndarray, element: str) -> np.ndarray:
    """sat_fp8 by ml_dtypes after clamping; NaN -> 0x7F (docs/numerics.md §0.2.3)."""
    fmt = FORMATS[element]
    nan = np.isnan(v)
    c = np.clip(np.where(nan, np.float32(0), v), -fmt.max_finite, fmt.max_finite).astype(np.float32)
    out = c.astype(ML_FP8[element]).view(np.uint8).copy()
    out[nan] = 0x7F
    return out
