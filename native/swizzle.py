"""Native's own cuBLASLt scale swizzle: compact padded block scales -> the flat order cuBLASLt reads.

Source: docs/numerics.md §3 Layouts (the 128 x 4 swizzle tile, MXFP8 colwise T = S_c transposed), §5.9 (NVFP4:
each compact matrix as is; swizzled padding is 0). Written as a scatter through computed offsets (torch
index arithmetic, on the scales' own device, CPU included), independent of `reference.layouts.swizzle`
(a reshape and permute); tests/unit/test_native_launchers.py checks the two agree on many shapes.
"""

from __future__ import annotations

import functools

import torch

TILE_ROWS = 128  # NUMERICS: §3 Layouts - one swizzle tile is 128 rows x 4 columns of T, 512 bytes
TILE_COLS = 4
ROW_GROUP = 32  # rows i and i + 32, i + 64, i + 96 of a tile are stored side by side


@functools.lru_cache(maxsize=256)
def _offsets(rows: int, cols: int, transposed: bool, device: torch.device) -> torch.Tensor:
    """int64 [rows * cols]: the flat offset of each entry of the stored [rows, cols] scale tensor S in
    the swizzled order of T (T = S, or S transposed)."""
    a = torch.arange(rows, device=device, dtype=torch.int64).view(-1, 1)
    b = torch.arange(cols, device=device, dtype=torch.int64).view(1, -1)
    i, j = (b, a) if transposed else (a, b)  # entry (i, j) of T
    t_cols = rows if transposed else cols
    # NUMERICS: §3 Layouts - (i, j) -> (i//128 * (C/4) + j//4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
    tile = (i // TILE_ROWS) * (t_cols // TILE_COLS) + j // TILE_COLS
    inner = (i % ROW_GROUP) * (TILE_COLS * TILE_ROWS // ROW_GROUP) + ((i % TILE_ROWS) // ROW_GROUP) * TILE_COLS
    return (tile * (TILE_ROWS * TILE_COLS) + inner + j % TILE_COLS).reshape(-1)


def swizzled(scale: torch.Tensor, valid: tuple[int, int], *, transposed: bool) -> torch.Tensor:
    """The flat cuBLASLt order of a padded compact scale tensor S [R, C] (T = S^T when `transposed`), with
    every entry outside the valid region `valid` (of S) written as 0 (NUMERICS: §3 "swizzled padding must be 0")."""
    rows, cols = scale.shape
    t_rows, t_cols = (cols, rows) if transposed else (rows, cols)
    if t_rows % TILE_ROWS or t_cols % TILE_COLS:
        raise ValueError(f"swizzle needs T padded to [{TILE_ROWS}k, {TILE_COLS}k], got T [{t_rows}, {t_cols}]")
    vr, vc = valid
    s = scale.contiguous()
    inside = torch.zeros_like(s)
    inside[:vr, :vc] = s[:vr, :vc]
    out = torch.empty(rows * cols, dtype=s.dtype, device=s.device)
    out[_offsets(rows, cols, transposed, s.device)] = inside.reshape(-1)
    return out
