"""The shared scale rule and NaN-ignoring amax (docs/numerics.md §0.1 amax, §1 compute_scale).

Source: TE common/recipe/recipe_common.cuh (compute_scale), common/recipe/current_scaling.cu (amax).
"""

from __future__ import annotations

import torch

from . import fp32


def amax(x: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """fmax over |x|, starting from +0: NaN ignored, +inf kept, exact (fp32 result).

    NUMERICS: §0.1 amax and §0.2.5 - take |x| with NaN lanes replaced by 0, then max.
    """
    a = x.to(torch.float32).abs()
    # NaN lanes -> +0 in place (+inf kept): the same values as where(isnan(a), 0, a), in one pass.
    torch.nan_to_num_(a, nan=0.0, posinf=float("inf"))
    if a.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    if dim is None:
        return a.max()
    return a.amax(dim=dim)


def compute_scale(
    a: torch.Tensor, fp8_max: float, *, pow2: bool, eps: float, v_inf: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, sinv) from amax `a` (any shape, fp32), every step in fp32.

    NUMERICS: §1 compute_scale steps 1-6 (TE recipe_common.cuh):
    1. A < eps -> eps (NaN compares false and is kept); 2. A in {0, ±inf, NaN} -> s = 1;
    3. s = RN(fp8_max / A), a true division; 4. s = +inf -> v_inf;
    5. pow2: s = bits(s) & 0xFF800000; 6. sinv = RN(1 / s), subnormal results kept.
    """
    a = a.to(torch.float32)
    eps_t = fp32.scalar(eps, a)
    a = torch.where(a < eps_t, eps_t, a)
    special = (a == 0) | torch.isinf(a) | torch.isnan(a)
    s = fp32.div(fp8_max, a, like=a)
    s = torch.where(torch.isinf(s), fp32.scalar(v_inf, a), s)
    if pow2:
        s = fp32.from_bits(fp32.bits(s) & fp32.bits(fp32.from_bits(0xFF800000)))
    s = torch.where(special, torch.ones_like(s), s)
    sinv = fp32.div(1.0, s, like=s)
    return s, sinv
