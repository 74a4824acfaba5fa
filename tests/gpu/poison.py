"""A torch.empty that hands out poisoned CUDA memory, for tests that every output byte is written.

The native quantizers allocate their outputs (codes, scales with their zero padding) with
torch.empty and rely on the kernels to write every byte; monkeypatching torch.empty with
`dirty_empty` makes a byte the kernels skip show up as 0xAB instead of a lucky zero.
"""

from __future__ import annotations

import torch

from reference import layouts

POISON = 0xAB


def dirty_empty(real_empty, shapes: list):
    """torch.empty whose CUDA memory is filled with POISON bytes; the shape of each CUDA tensor it
    hands out is appended to `shapes`."""

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        if t.is_cuda and t.is_contiguous() and t.numel():
            t.view(torch.uint8).fill_(POISON)
            shapes.append(tuple(t.shape))
        return t

    return empty


def assert_padded_scales_from_empty(cfg, shape: tuple[int, int], rowwise: bool, colwise: bool, shapes: list) -> None:
    """The case gives at least one requested scale tensor some padding, and every padded one was
    handed out by dirty_empty (its shape is in `shapes`), so its padding bytes started as POISON."""
    padded = [
        o for o, on in (("rowwise", rowwise), ("colwise", colwise))
        if on and layouts.scale_padded_shape(cfg, o, *shape) != layouts.scale_valid_shape(cfg, o, *shape)
    ]  # fmt: skip
    assert padded, "the shape must give at least one requested scale tensor some padding"
    for o in padded:
        assert layouts.scale_padded_shape(cfg, o, *shape) in shapes, f"{o} scales were not allocated by torch.empty"
