"""The 16-point Random Hadamard Transform applied to the columnwise NVFP4 copy (bf16 in, bf16 out).

Source: docs/numerics.md §5.6; TE common/hadamard_transform/, pytorch/tensor/nvfp4_tensor.py.
For column k of X and 16-row chunk b, with v_i = X[16b+i, k]:
    RHT(X^T)[k, 16b+j] = RN_bf16(RN(sum_{i=0..15} v_i * sigma_i * H[i, j] / 4))
with the sum accumulated in fp64 in the order i = 0..15, starting from +0.
"""

from __future__ import annotations

import math

import torch

from .formats import RHT_SCALE, RHT_SIGN_MASK, RHT_SIZE
from .types import SpecViolation

# The fp64 sum of 16 bf16 terms is exact when the non-zero exponents of the chunk span <= 41
# binades (8 significant bits + 4 bits of growth over 16 terms + 41 = 53). One binade of margin.
_EXACT_SPAN = 40
_BF16_MAG_MASK = (1 << 15) - 1  # all but the sign bit
_BF16_MAN_BITS = 1 - math.frexp(torch.finfo(torch.bfloat16).eps)[1]  # eps = 2^-7
_BF16_INF_BITS = int(torch.tensor(float("inf"), dtype=torch.bfloat16).view(torch.int16))
# floor(log2|v|) + 127 of the smallest bf16 subnormal (2^-133), a lower bound for every subnormal.
_BF16_SUBNORMAL_EXP = 1 - _BF16_MAN_BITS


def hadamard_matrix(n: int = RHT_SIZE) -> torch.Tensor:
    """Sylvester H[i, j] = (-1)^popcount(i AND j), int64 [n, n] of +-1 (docs/numerics.md §5.6)."""
    i = torch.arange(n, dtype=torch.int64)
    a = i[:, None] & i[None, :]
    parity = torch.zeros_like(a)
    while bool((a != 0).any()):
        parity ^= a & 1
        a = a >> 1
    return 1 - 2 * parity


def sign_vector(n: int = RHT_SIZE, mask: int = RHT_SIGN_MASK) -> torch.Tensor:
    """sigma_i = -1 where bit i of `mask` is set, else +1 (int64 [n])."""
    bits = (mask >> torch.arange(n, dtype=torch.int64)) & 1
    return 1 - 2 * bits


def rht_matrix(device: torch.device | str | None = None) -> torch.Tensor:
    """W[i, j] = sigma_i * H[i, j] / 4 as fp64 [16, 16] (every entry is +-1/4, exact)."""
    w = sign_vector()[:, None] * hadamard_matrix()
    # NUMERICS: §5.6 - scale 1/4: a power of two, so v_i * W[i, j] is exact in fp64.
    return (w.to(torch.float64) * RHT_SCALE).to(device)  # exact: a power of two


def sequential_sum(v64: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(N, 16) fp64: sum_i v[:, i] * W[i, :] accumulated in fp64 in the order i = 0..15, from +0 (v64: (N, 16))."""
    # NUMERICS: §5.6 - fp64 sum in order i = 0..15; the accumulator starts at +0.
    acc = torch.zeros_like(v64)
    for i in range(RHT_SIZE):  # fixed tiny count
        acc = acc + v64[:, i : i + 1] * w[i]
    return acc


def _chunk_span(xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(flagged, zero) of the chunks of xb (bf16 (nb, 16, K), summed over dim 1): (nb, K) bool each.

    flagged: the fp64 sum may round or is non-finite; zero: every input is +-0 (the sum is a zero),
    None when no chunk is. Read from the bf16 magnitude bits, which order like the magnitudes:
    compare the exponent fields of the largest and the smallest non-zero magnitude (a subnormal
    counts as the lowest possible exponent, which only widens the span).
    """
    mag = xb.view(torch.int16) & _BF16_MAG_MASK  # (nb, 16, K)
    hi = mag.amax(dim=1)  # (nb, K); >= inf bits: inf or NaN present; 0: all zero
    mag -= 1
    mag &= _BF16_MAG_MASK  # 0 becomes the largest pattern, so the min skips zeros
    e_lo = (mag.amin(dim=1).to(torch.int32) + 1) >> _BF16_MAN_BITS  # smallest non-zero; 256: all zero (no span)
    # Exponent field + (1 - subnormal exponent), and 0 for a subnormal: e_lo - subnormal exponent.
    e_lo += e_lo.clamp(max=1) * -_BF16_SUBNORMAL_EXP
    flagged = (hi >= _BF16_INF_BITS) | ((hi >> _BF16_MAN_BITS) - e_lo > _EXACT_SPAN + _BF16_SUBNORMAL_EXP)
    return flagged, (hi == 0) if int(hi.amin()) == 0 else None


def rht_rows(x_rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """RHT of a bf16 row chunk X[r0:r1] (R, K), R % 16 == 0, as bf16 (R, K): out[16b + j, k] = RHT(X^T)[k, 16b + j].

    The result is RHT(X^T) transposed back to X's orientation: row 16b + j holds output j of
    every column's chunk b. The fp64 sum is taken by a matmul where every partial sum is provably
    exact (then the order cannot matter); chunks that could round (exponent span > 2^40) or that
    hold inf/NaN are redone in the contract's order. Written into `out` (bf16 (R, K)) when given.
    """
    r, k = x_rows.shape
    xb = x_rows.reshape(r // RHT_SIZE, RHT_SIZE, k)  # (nb, 16 i, K)
    w = rht_matrix(x_rows.device)  # (16 i, 16 j)
    v64 = torch.empty(xb.shape, dtype=torch.float64, device=xb.device).copy_(xb)  # exact widening
    acc = torch.matmul(w.t(), v64)  # (nb, 16 j, K); exact where not flagged
    flagged, zero = _chunk_span(xb)  # (nb, K)
    if bool(flagged.any()):
        b_idx, k_idx = flagged.nonzero(as_tuple=True)
        acc[b_idx, :, k_idx] = sequential_sum(v64[b_idx, :, k_idx], w)
    if out is None:
        out = torch.empty_like(x_rows)
    ob = out.view(xb.shape)
    # NUMERICS: §5.6 - fp64 -> RN fp32 -> RN bf16 (two rounding points, in that order; the second by the copy).
    ob.copy_(acc.to(torch.float32))
    # NUMERICS: §5.6 - the accumulator starts at +0, so a zero sum is +0, never -0 (RN: x + (-x) = +0).
    # An exact sum with a non-zero term that comes to 0 comes from such a cancellation, so only a
    # chunk of +-0 inputs can give -0 (products -0, summed by the matmul without the +0 start).
    if zero is not None:
        ob.masked_fill_(zero[:, None, :], 0.0)
    return out


def check_rht_input(x2d: torch.Tensor) -> None:
    """RHT needs a bf16 2-D input with M a multiple of 16 (docs/numerics.md §5.6)."""
    if x2d.dtype != torch.bfloat16:
        raise SpecViolation(f"RHT needs a bfloat16 input (docs/numerics.md §5.6), got {x2d.dtype}")
    if x2d.dim() != 2 or x2d.shape[0] % RHT_SIZE:
        raise SpecViolation(
            f"RHT works on 16-row chunks of a 2-D [M, K] input (docs/numerics.md §5.6); got shape {tuple(x2d.shape)}"
        )


def rht_transposed(x2d: torch.Tensor, *, chunk_rows: int = 1024) -> torch.Tensor:
    """RHT(X^T): the bf16 [K, M] source of the columnwise copy, for a bf16 X [M, K] (a transposed view)."""
    check_rht_input(x2d)
    out = torch.empty_like(x2d)
    for r0 in range(0, x2d.shape[0], chunk_rows):
        rht_rows(x2d[r0 : r0 + chunk_rows], out[r0 : r0 + chunk_rows])
    return out.t()
