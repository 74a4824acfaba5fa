"""Native grouped (split) quantization: one CUDA tensor split along M, each group quantized by the scheme's
kernels on its own (MoE; TE `tex.split_quantize`). Same signature and return type as `reference.grouped.quantize`.

Source: docs/numerics.md §12.1 (each group its own amaxes, scales, layout and SR streams). This first version
launches the scheme's quantize kernels group by group (`native.quantize` on each group's rows, a view of X:
the rows of a group are contiguous); one launch over all groups is left to a later kernel. The split rules on
names and shapes are `reference.grouped.splits_rule` (shared by the reference, native and the case
generator, like `reference.spec`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference.grouped import GROUPED_SCHEMES, splits_rule
from reference.spec import dtype_name
from reference.types import QuantizedTensor, SpecViolation, SRSeed

from .quantize import quantize as quantize_one

__all__ = ["GROUPED_SCHEMES", "group_seed", "quantize"]

# NUMERICS: §12.1 - group g rounds stochastically with (seed, stream + 2g): its rowwise copy draws stream + 2g,
# its columnwise copy stream + 2g + 1 (§5.7), so no two groups share random bits.
STREAMS_PER_GROUP = 2
_MASK32 = 0xFFFFFFFF


def group_seed(rng: SRSeed | tuple[int, int] | int | None, g: int) -> SRSeed | None:
    """The SR seed of group g, (seed, (stream + 2g) mod 2^32); None without one (docs/numerics.md §12.1)."""
    s = SRSeed.coerce(rng)
    if s is None:
        return None
    return SRSeed(s.seed, (s.stream + STREAMS_PER_GROUP * g) & _MASK32)


def group_rows(splits: Sequence[int]) -> list[tuple[int, int]]:
    """(first row, row count) of every group: o_g = s_0 + ... + s_{g-1} (docs/numerics.md §12.1)."""
    out, offset = [], 0
    for s in splits:
        out.append((offset, s))
        offset += s
    return out


def quantize(
    x_hp: torch.Tensor,
    config,
    splits: Sequence[int],
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
) -> list[QuantizedTensor | None]:
    """One QuantizedTensor per group (None for an empty group): group g = native.quantize(x[o_g : o_g + s_g]),
    with SR seed `group_seed(rng, g)`. SpecViolation for splits that break §12.1's rules (as the reference)."""
    if not isinstance(x_hp, torch.Tensor):
        raise SpecViolation(f"x must be a torch.Tensor, got {type(x_hp).__name__}")
    splits = [int(s) if not isinstance(s, bool) else s for s in splits]
    splits_rule(config, tuple(x_hp.shape), splits, dtype_name(x_hp.dtype))
    out: list[QuantizedTensor | None] = []
    for g, (first, size) in enumerate(group_rows(splits)):
        if size == 0:
            out.append(None)  # NUMERICS: §12.1 - an empty group has no output
            continue
        out.append(quantize_one(x_hp[first:first + size], config, rowwise=rowwise, colwise=colwise,
                                rng=group_seed(rng, g)))  # fmt: skip
    return out
