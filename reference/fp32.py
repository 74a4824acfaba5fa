"""IEEE binary32 arithmetic as the contract defines it: bit views, true division, FMA32 emulation.

Source: docs/numerics.md §0.1 (rounding points) and §0.2 (emulating in PyTorch without drifting).
Everything here runs eagerly on the tensor's own device and gives identical bits on CPU and CUDA.
"""

from __future__ import annotations

import torch


def bits(x: torch.Tensor) -> torch.Tensor:
    """The fp32 bit patterns of `x` as int32 (docs/numerics.md §0.2.8)."""
    return x.to(torch.float32).contiguous().view(torch.int32)


def from_bits(b: torch.Tensor | int, device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 values with the given int32 bit patterns (an int gives a 0-dim tensor)."""
    if isinstance(b, int):
        b = torch.tensor(b - (1 << 32) if b >= (1 << 31) else b, dtype=torch.int32, device=device)
    return b.to(torch.int32).contiguous().view(torch.float32)


def scalar(v: float, like: torch.Tensor) -> torch.Tensor:
    """`v` rounded to fp32, as a 0-dim tensor on `like`'s device.

    NUMERICS: §0.2.2 - divide by a tensor on the data's device, never a Python number (eager
    PyTorch turns `t / 3.0` into a reciprocal-then-multiply on CUDA).
    """
    return torch.tensor(v, dtype=torch.float32, device=like.device)


def div(num: torch.Tensor | float, den: torch.Tensor | float, like: torch.Tensor | None = None) -> torch.Tensor:
    """RN(num / den): a true IEEE fp32 division with both operands as fp32 tensors.

    NUMERICS: §0.1 "Division is always a true IEEE division"; §0.2.2 never `scalar / tensor`.
    """
    ref = like if like is not None else (num if isinstance(num, torch.Tensor) else den)
    assert isinstance(ref, torch.Tensor)
    n = num.to(torch.float32) if isinstance(num, torch.Tensor) else scalar(num, ref)
    d = den.to(torch.float32) if isinstance(den, torch.Tensor) else scalar(den, ref)
    n, d = torch.broadcast_tensors(n, d)
    return torch.div(n.contiguous(), d.contiguous())


def reciprocal_const(c: float) -> float:
    """fl(1/c): the fp32 constant RN(1/c), e.g. fl(1/448) = 0x3B124925 (docs/numerics.md §0.1)."""
    one = torch.tensor(1.0, dtype=torch.float32)
    return float(torch.div(one, torch.tensor(c, dtype=torch.float32)))


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """FMA32(a, b, c) = RN(a*b + c) with one rounding, emulated in float64.

    NUMERICS: §0.2.6 - p = a*b is exact in fp64; s = p + c with its TwoSum error e; r = RN32(s);
    if s sits exactly halfway between r and its fp32 neighbour on s's side and e != 0 points away
    from r, the true value lies past the midpoint and the neighbour is the correctly rounded result.
    """
    a64, b64, c64 = (t.to(torch.float64) for t in (a, b, c))
    p = a64 * b64  # exact: 24 + 24 bit significands
    s = p + c64
    # TwoSum error of s = p + c (Knuth), exact in fp64.
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    r = s.to(torch.float32)
    r64 = r.to(torch.float64)
    # Neighbour of r on s's side.
    toward = torch.where(s > r64, torch.full_like(r, float("inf")), torch.full_like(r, float("-inf")))
    nb = torch.nextafter(r, toward)
    mid = (r64 + nb.to(torch.float64)) / 2  # exact: fp32 midpoints are representable in fp64
    at_mid = (s == mid) & (s != r64)
    away = ((s - r64) > 0) & (err > 0) | ((s - r64) < 0) & (err < 0)
    out = torch.where(at_mid & away, nb, r)
    # Special values: let the fp32 IEEE result stand (inf/NaN propagate the same way).
    special = ~torch.isfinite(p) | ~torch.isfinite(c64) | ~torch.isfinite(s)
    if bool(special.any()):
        direct = (a.to(torch.float32) * b.to(torch.float32)).to(torch.float64) + c64
        out = torch.where(special, direct.to(torch.float32), out)
    return out
