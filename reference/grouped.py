"""Grouped (split) quantization: one tensor split along M into groups, each quantized on its own (MoE).

Source: docs/numerics.md §12.1; TE `tex.split_quantize(x, split_sections, quantizers)` and its tests
(`tests/pytorch/nvfp4/test_nvfp4_group_quantize.py`: every split equals its own quantizer's output on
`torch.split(x, split_sections)[i]`, empty splits allowed).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .formats import QuantConfig
from .quantization import quantize as quantize_one
from .spec import dtype_name, quantize_rule
from .types import QuantizedTensor, SpecViolation, SRSeed

# The schemes TE quantizes by groups (split_quantize's MXFP8 and NVFP4 paths).
GROUPED_SCHEMES = ("mxfp8", "nvfp4")
# Group g rounds stochastically with stream + STREAMS_PER_GROUP * g (its copies use that and + 1, §5.7).
STREAMS_PER_GROUP = 2


def splits_rule(config: QuantConfig, shape: Sequence[int], splits: Sequence[int], dtype: str) -> None:
    """The grouped-quantize rules on names and shapes; SpecViolation if broken (docs/numerics.md §12.1).

    The scheme groups (GROUPED_SCHEMES); the input is 2-D [M, K]; the splits are ints >= 0 summing to M;
    every non-empty group [s, K] passes the scheme's own quantize rules (e.g. NVFP4: s % 16 == 0).
    """
    if config.scheme not in GROUPED_SCHEMES:
        raise SpecViolation(f"{config.id}: grouped quantization exists for {GROUPED_SCHEMES}, not {config.scheme}",
                            rule="grouped")
    if len(shape) != 2:
        raise SpecViolation(f"grouped quantization splits a 2-D [M, K] tensor along M, got shape {tuple(shape)}",
                            rule="grouped")
    if not splits or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in splits):
        raise SpecViolation(f"splits={list(splits)!r} is invalid: expected a non-empty list of ints >= 0",
                            rule="grouped")
    if sum(splits) != shape[0]:
        raise SpecViolation(f"splits={list(splits)} sum to {sum(splits)}, expected M = {shape[0]}", rule="grouped")
    for g, s in enumerate(splits):
        if s:
            quantize_rule(config, (s, shape[1]), dtype, what=f"group {g}")


def group_rng(rng: SRSeed | tuple[int, int] | int | None, g: int) -> SRSeed | None:
    """The SR seed of group g: (seed, stream + 2g) (docs/numerics.md §12.1)."""
    s = SRSeed.coerce(rng)
    if s is None:
        return None
    # NUMERICS: §12.1 - each group is an independent quantization, so it gets its own pair of streams.
    return SRSeed(s.seed, (s.stream + STREAMS_PER_GROUP * g) % 2**32)


def quantize(
    x_hp: torch.Tensor,
    config: QuantConfig,
    splits: Sequence[int],
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
) -> list[QuantizedTensor | None]:
    """One QuantizedTensor per group (None for an empty group): group g = quantize(x[o_g : o_g + s_g]).

    NUMERICS: §12.1 - each group has its own amaxes (NVFP4 global amax, post-RHT amax with RHT), its own
    scales in its own padded layout, and its own SR streams; nothing is shared between groups.
    """
    if not isinstance(x_hp, torch.Tensor):
        raise SpecViolation(f"x must be a torch.Tensor, got {type(x_hp).__name__}")
    splits = [int(s) if not isinstance(s, bool) else s for s in splits]
    splits_rule(config, tuple(x_hp.shape), splits, dtype_name(x_hp.dtype))
    out: list[QuantizedTensor | None] = []
    offset = 0
    for g, s in enumerate(splits):
        if s == 0:
            out.append(None)
            continue
        part = x_hp[offset : offset + s]  # (s, K)
        out.append(quantize_one(part, config, rowwise=rowwise, colwise=colwise, rng=group_rng(rng, g)))
        offset += s
    return out
