"""LayerNorm and RMSNorm, forward and backward, with TE's fp32 arithmetic in a device-independent order.

Source: docs/numerics.md §9.2; TE (d0067d0) common/normalization/layernorm/ln_fwd_kernels.cuh,
ln_bwd_kernels.cuh, rmsnorm/rmsnorm_fwd_kernels.cuh, rmsnorm_bwd_kernels.cuh. TE forms the row
statistics with a Welford merge and `rsqrtf`, whose order and last bit depend on the launch; here every
row and column sum is an fp64 pairwise tree (`ordered_sum`) and every fp32 rounding point is named, so
the result is the same on every device and within a few fp32 ulps of TE's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fp32
from .gemm import round_out

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
_F32 = torch.float32
_F64 = torch.float64


def ordered_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum of `x` along `dim` in fp64 by a fixed pairwise tree: identical bits on every device.

    NUMERICS: numerics.md §9.2 - the length is zero-padded to a power of two 2^p, then p times element i is
    added to element i + half (elementwise IEEE fp64 adds, no library reduction order involved).
    """
    v = x.to(_F64).movedim(dim, -1)
    n = v.shape[-1]
    p = 1 << max(0, (n - 1).bit_length())
    if p != n:
        v = torch.nn.functional.pad(v, (0, p - n))
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = v[..., :h] + v[..., h:]
    return v[..., 0]


def _mean32(x: torch.Tensor, n: int) -> torch.Tensor:
    """RN32(ordered_sum(x) / n) along the last dim; the fp64 quotient is then rounded once to fp32."""
    s = ordered_sum(x, -1)
    return torch.div(s, torch.full_like(s, float(n))).to(_F32)


def _rsigma(v32: torch.Tensor) -> torch.Tensor:
    """RN32(1 / sqrt(v)) from fp32 v, via correctly rounded fp64 sqrt and division (TE: rsqrtf)."""
    r = torch.sqrt(v32.to(_F64))
    return torch.div(torch.ones_like(r), r).to(_F32)


def _gamma(gamma: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    """fp32 gamma; with zero_centered_gamma, RN32(gamma + 1) (TE: `g_ij += 1` in compute_t)."""
    g = gamma.to(_F32)
    return g + 1.0 if zero_centered_gamma else g  # NUMERICS: numerics.md §9.2 one fp32 add


def _check(normalization: str, x2d: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, need_beta: bool
           ) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r} is invalid: expected one of {NORMALIZATIONS}")
    k = x2d.shape[-1]
    if tuple(gamma.shape) != (k,):
        raise ValueError(f"gamma has shape {tuple(gamma.shape)}, expected [{k}] for x of shape {tuple(x2d.shape)}")
    if need_beta and normalization == "LayerNorm" and (beta is None or tuple(beta.shape) != (k,)):
        raise ValueError(f"LayerNorm needs beta of shape [{k}], got {None if beta is None else tuple(beta.shape)}")


@dataclass
class NormForward:
    """Forward result: `out` (ln_out, out_dtype), `out_fp32` (the fp32 value before that rounding),
    `mu` fp32 [M] (None for RMSNorm), `rsigma` fp32 [M]."""

    out: torch.Tensor
    out_fp32: torch.Tensor
    mu: torch.Tensor | None
    rsigma: torch.Tensor


@dataclass
class NormBackward:
    """Backward result: `dx` (x's dtype), `dgamma` and `dbeta` (gamma's dtype; dbeta None for RMSNorm)."""

    dx: torch.Tensor
    dgamma: torch.Tensor
    dbeta: torch.Tensor | None


def _normalized(xf: torch.Tensor, mu: torch.Tensor | None, rs: torch.Tensor) -> torch.Tensor:
    """y = RN32(rs * RN32(x - mu)) (LayerNorm) or RN32(x * rs) (RMSNorm), recomputed alike in backward."""
    # NUMERICS: numerics.md §9.2 TE `y_ij = rs * (x_ij - mu)` / `rs * x_ij`: fp32 subtract, fp32 multiply.
    d = xf if mu is None else xf - mu[:, None]
    return d * rs[:, None]


def norm_forward(
    x2d: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None,
    *,
    normalization: str,
    eps: float,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
) -> NormForward:
    """LayerNorm / RMSNorm of the rows of x2d [M, K] (docs/numerics.md §9.2).

    LayerNorm: mu = RN32(S(x)/K); var = RN32(S((x - mu)^2)/K) with the differences and squares in
    fp64; rsigma = RN32(1/sqrt(RN32(var + eps))); y = RN32(rsigma * RN32(x - mu));
    out = RN_out(FMA32(g, y, beta)). RMSNorm: ms = RN32(S(x^2)/K); rsigma = RN32(1/sqrt(RN32(ms + eps)));
    y = RN32(x * rsigma); out = RN_out(RN32(g * y)). S = `ordered_sum`; g = gamma (+1 if zero-centred).
    """
    _check(normalization, x2d, gamma, beta, need_beta=True)
    k = x2d.shape[-1]
    xf = x2d.to(_F32)  # NUMERICS: §0.1 widening to fp32 is exact
    x64 = xf.to(_F64)
    eps32 = fp32.scalar(eps, xf)
    if normalization == "LayerNorm":
        # NUMERICS: numerics.md §9.2 fp32 statistics: mean, then the centred second moment (TE: Welford, fp32).
        mu = _mean32(x64, k)
        d = x64 - mu.to(_F64)[:, None]
        var = _mean32(d * d, k)  # an explicit product, never pow (its kernels differ by device)
    else:
        # NUMERICS: numerics.md §9.2 RMSNorm: TE's rn*m2 + mu*mu is the mean of squares; here summed directly.
        mu = None
        var = _mean32(x64 * x64, k)  # x^2 exact in fp64 (2 x 24 bits)
    rs = _rsigma(var + eps32)  # NUMERICS: numerics.md §9.2 RN32(var + eps), then RN32(1/sqrt(.))
    y = _normalized(xf, mu, rs)
    g = _gamma(gamma, zero_centered_gamma)[None, :]
    if normalization == "LayerNorm":
        # NUMERICS: numerics.md §9.2 TE `g_ij * y_ij + b_ij` is contracted by nvcc (default -fmad=true): one FMA32.
        out32 = fp32.fma32(g.expand_as(y), y, beta.to(_F32)[None, :].expand_as(y))
    else:
        out32 = g * y  # NUMERICS: numerics.md §9.2 one fp32 multiply
    # NUMERICS: numerics.md §9.2 ln_out = output_t(temp_output): one rounding from fp32 to the output dtype.
    return NormForward(out=out32.to(out_dtype), out_fp32=out32, mu=mu, rsigma=rs)


def norm_backward(
    dz: torch.Tensor,
    x2d: torch.Tensor,
    fwd: NormForward,
    gamma: torch.Tensor,
    *,
    normalization: str,
    zero_centered_gamma: bool,
) -> NormBackward:
    """dx, dgamma, dbeta from dz [M, K] = d ln_out (docs/numerics.md §9.2; TE ln_bwd / rmsnorm_bwd kernels).

    y as in forward; dyg = RN32(g * dz). LayerNorm: mdy = RN32(S(dyg)/K), mdyy = RN32(S(dyg*y)/K),
    dx = RN_x(RN32(rsigma * RN32(dyg - FMA32(mdyy, y, mdy)))). RMSNorm: mdyy likewise,
    dx = RN_x(RN32(rsigma * FMA32(-mdyy, y, dyg))). dgamma = RN_g(S_rows(dz*y)),
    dbeta = RN_g(S_rows(dz)), each one rounding from fp64 (products exact).
    """
    _check(normalization, x2d, gamma, None, need_beta=False)
    k = x2d.shape[-1]
    xf = x2d.to(_F32)
    dzf = dz.to(_F32)  # NUMERICS: §0.1 exact widening
    y = _normalized(xf, fwd.mu, fwd.rsigma)
    g = _gamma(gamma, zero_centered_gamma)[None, :]
    dyg = g * dzf  # NUMERICS: numerics.md §9.2 TE `dy_tmp = (gamma + shift) * dz`: one fp32 multiply
    mdyy = _mean32(dyg.to(_F64) * y.to(_F64), k)[:, None]  # product exact in fp64
    if normalization == "LayerNorm":
        mdy = _mean32(dyg, k)[:, None]
        # NUMERICS: numerics.md §9.2 TE `rs * (dy - (mdyy * y + mdy))`: the inner a*b+c contracted to one FMA32.
        inner = fp32.fma32(mdyy.expand_as(y), y, mdy.expand_as(y))
        dx32 = (dyg - inner) * fwd.rsigma[:, None]
    else:
        # NUMERICS: numerics.md §9.2 TE `rs * (dy - mdyy * y)`: dy - a*b contracted to FMA32(-a, b, dy).
        dx32 = fp32.fma32(-mdyy.expand_as(y), y, dyg) * fwd.rsigma[:, None]
    dz64 = dzf.to(_F64)
    # NUMERICS: numerics.md §9.2 dgamma / dbeta: column sums of dz*y (exact products) and dz, one rounding each.
    dgamma = round_out(ordered_sum(dz64 * y.to(_F64), 0), gamma.dtype)
    dbeta = round_out(ordered_sum(dz64, 0), gamma.dtype) if normalization == "LayerNorm" else None
    return NormBackward(dx=dx32.to(x2d.dtype), dgamma=dgamma, dbeta=dbeta)
