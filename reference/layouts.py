"""Scale-tensor shapes for every scheme, and the cuBLASLt swizzled scale layout (exact inverses).

Source: NUMERICS.md §1 (per-tensor sinv [1]), §3 Layouts (MXFP8 compact and swizzled scales),
§4 (blockwise transposed sinv storage, pow2 sinv -> E8M0), §5.9 (NVFP4), §8 (swizzle and layout
vectors); TE common/cast/mxfp8/swizzle.cuh. This module is the single place the harness and the
native backend ask for scale shapes.
"""

from __future__ import annotations

import torch

from . import fp32
from .formats import UE8M0, QuantConfig
from .types import QuantizedTensor, SpecViolation

# cuBLASLt swizzle tile: 128 rows x 4 columns of the compact scale matrix, stored as 512
# consecutive bytes (NUMERICS.md §3 Layouts).
SWIZZLE_ROWS = 128
SWIZZLE_COLS = 4
_ROW_GROUP = 32  # rows interleaved inside one 128-row tile

# Every scale matrix pads its row count and/or column count to these multiples.
ROW_PAD = SWIZZLE_ROWS
COL_PAD = SWIZZLE_COLS


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _roundup(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _check_orientation(orientation: str) -> None:
    if orientation not in ("rowwise", "colwise"):
        raise ValueError(f"orientation={orientation!r} is invalid: expected 'rowwise' or 'colwise'")


def _check_dims(m: int, k: int) -> None:
    if not (isinstance(m, int) and isinstance(k, int)) or m < 1 or k < 1:
        raise SpecViolation(f"scale shapes need positive int M, K; got M={m!r}, K={k!r}")


# ---- shapes ----------------------------------------------------------------------------------


def scale_valid_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, ...]:
    """The unpadded region of the compact scale tensor of one copy of a logical [M, K] input.

    Per-tensor: (1,). Blockwise 1-D rowwise: (ceil(K/128), M) (stored transposed, entry [kb, m]);
    1-D colwise: (ceil(M/128), K); 2-D rowwise (ceil(M/128), ceil(K/128)), colwise its transpose.
    MXFP8: rowwise (M, K/32), colwise (M/32, K). NVFP4: rowwise (M, K/16), colwise (K, M/16).
    """
    _check_orientation(orientation)
    _check_dims(m, k)
    scheme = config.scheme
    if scheme in ("fp8_current", "fp8_delayed"):
        return (1,)  # NUMERICS: §1 one fp32 sinv shared by data and data_T
    blk = config.block
    assert blk is not None
    if scheme == "fp8_block":
        if config.is_2d:
            # NUMERICS: §4 2-D layouts - entry [mb, kb]; colwise is the transpose [kb, mb].
            rows, cols = _ceil_div(m, blk), _ceil_div(k, blk)
            return (rows, cols) if orientation == "rowwise" else (cols, rows)
        # NUMERICS: §4 1-D layouts - rowwise sinv stored transposed, entry [kb, m];
        # colwise (the 1x128 quantization of x^T) entry [mb, k].
        return (_ceil_div(k, blk), m) if orientation == "rowwise" else (_ceil_div(m, blk), k)
    if scheme == "mxfp8":
        # NUMERICS: §3 Layouts - S_r entry [m, kb]; S_c entry [mb, k] (not transposed).
        return (m, _ceil_div(k, blk)) if orientation == "rowwise" else (_ceil_div(m, blk), k)
    if scheme == "nvfp4":
        # NUMERICS: §5.9 - rowwise [M, K/16]; colwise is NVFP4 of x^T: [K, M/16] (2-D tiles too:
        # the tile scale is repeated on each of its rows, §5.5).
        return (m, _ceil_div(k, blk)) if orientation == "rowwise" else (k, _ceil_div(m, blk))
    raise ValueError(f"unknown scheme {scheme!r}")  # pragma: no cover - QuantConfig validates


def scale_padded_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, ...]:
    """The stored (padded) shape of the compact scale tensor of one copy of a logical [M, K] input.

    NUMERICS.md §1, §3 Layouts, §4, §5.9: blockwise pads the fast (column) dim to a multiple of 4;
    MXFP8 and NVFP4 pad rows to 128 and columns to 4 (the swizzle tile).
    """
    valid = scale_valid_shape(config, orientation, m, k)
    if config.scheme in ("fp8_current", "fp8_delayed"):
        return valid
    rows, cols = valid
    if config.scheme == "fp8_block":
        # NUMERICS: §4 - only the fast dim is rounded up to 4 (rows = block counts or K/M as is).
        return (rows, _roundup(cols, COL_PAD))
    if config.scheme == "mxfp8" and orientation == "colwise":
        # NUMERICS: §3 - S_c [roundup(M/32, 4), roundup(K, 128)]: its transpose is the swizzle input.
        return (_roundup(rows, COL_PAD), _roundup(cols, ROW_PAD))
    # NUMERICS: §3 S_r [roundup(M,128), roundup(K/32,4)]; §5.9 NVFP4 both copies.
    return (_roundup(rows, ROW_PAD), _roundup(cols, COL_PAD))


def data_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, int]:
    """The stored shape of one copy's data for a logical [M, K] input (NUMERICS.md §1, §3, §4, §5.9).

    Per-tensor and blockwise colwise copies are transposed [K, M]; MXFP8 colwise is NOT transposed
    [M, K]; NVFP4 packs two codes per byte: rowwise [M, K/2], colwise [K, M/2].
    """
    _check_orientation(orientation)
    _check_dims(m, k)
    scheme = config.scheme
    if scheme == "mxfp8" or orientation == "rowwise":
        rows, cols = m, k
    else:
        rows, cols = k, m  # NUMERICS: §1 data_T, §4 colwise [K, M], §5.5 NVFP4 of x^T
    if scheme == "nvfp4":
        return (rows, cols // 2)  # NUMERICS: §5.4 two E2M1 codes per byte
    return (rows, cols)


# ---- swizzle ---------------------------------------------------------------------------------


def _check_swizzle_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2:
        raise SpecViolation(f"swizzle needs a 2-D compact scale matrix, got shape {tuple(shape)}")
    r, c = int(shape[0]), int(shape[1])
    if r % SWIZZLE_ROWS or c % SWIZZLE_COLS or r == 0 or c == 0:
        raise SpecViolation(
            f"swizzle needs a padded matrix [R, C] with R % {SWIZZLE_ROWS} == 0 and C % {SWIZZLE_COLS} == 0, "
            f"got shape {(r, c)} (pad with layouts.scale_padded_shape)"
        )
    return r, c


def swizzle(t: torch.Tensor) -> torch.Tensor:
    """Padded compact scales T [R, C] -> the flat cuBLASLt order (1-D, same dtype).

    NUMERICS: §3 Layouts - entry (i, j) goes to offset (i//128 * (C/4) + j//4) * 512 + (i % 32) * 16
    + ((i % 128) // 32) * 4 + j % 4; i.e. view [R/128, 4, 32, C/4, 4], permute (0, 3, 2, 1, 4), flatten.
    """
    r, c = _check_swizzle_shape(tuple(t.shape))
    v = t.reshape(r // SWIZZLE_ROWS, SWIZZLE_ROWS // _ROW_GROUP, _ROW_GROUP, c // SWIZZLE_COLS, SWIZZLE_COLS)
    return v.permute(0, 3, 2, 1, 4).contiguous().reshape(-1)  # (R/128, C/4, 32, 4, 4) flattened


def unswizzle(flat: torch.Tensor, padded_shape: tuple[int, int]) -> torch.Tensor:
    """The exact inverse of `swizzle`: flat cuBLASLt order -> compact T [R, C] (padded_shape)."""
    r, c = _check_swizzle_shape(tuple(padded_shape))
    if flat.dim() != 1 or flat.numel() != r * c:
        raise SpecViolation(
            f"unswizzle needs a 1-D tensor of {r * c} elements for padded shape {(r, c)}, got shape {tuple(flat.shape)}"
        )
    v = flat.reshape(r // SWIZZLE_ROWS, c // SWIZZLE_COLS, _ROW_GROUP, SWIZZLE_ROWS // _ROW_GROUP, SWIZZLE_COLS)
    return v.permute(0, 3, 2, 1, 4).contiguous().reshape(r, c)  # inverse permutation of (0, 3, 2, 1, 4)


def _swizzle_input_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, int]:
    """Shape of the matrix T that is swizzled for one copy: S_r, S_c^T (MXFP8) or NVFP4's compact."""
    if config.scheme not in ("mxfp8", "nvfp4"):
        raise SpecViolation(
            f"{config.id}: only mxfp8 and nvfp4 scales have a cuBLASLt swizzled layout (NUMERICS.md §3, §5.9); "
            f"{config.scheme} scales are used in their compact layout"
        )
    rows, cols = scale_padded_shape(config, orientation, m, k)
    if config.scheme == "mxfp8" and orientation == "colwise":
        return (cols, rows)  # NUMERICS: §3 columnwise T = S_c transposed [roundup(K,128), roundup(M/32,4)]
    return (rows, cols)


def swizzle_scales(q: QuantizedTensor, orientation: str) -> torch.Tensor:
    """One copy's compact scales -> the flat cuBLASLt layout, padding forced to 0.

    NUMERICS: §3 Layouts (MXFP8 rowwise T = S_r, colwise T = S_c transposed), §5.9 (NVFP4: each
    compact matrix as is). "Swizzled padding must be 0": the compact padding is zeroed first (TE
    leaves it uninitialised, the reference already writes 0).
    """
    _check_orientation(orientation)
    cfg, m, k = q.config, q.m, q.k
    scale = getattr(q, f"{orientation}_scale")
    if scale is None:
        raise SpecViolation(f"{orientation}_scale is None: this QuantizedTensor has no {orientation} copy")
    padded = scale_padded_shape(cfg, orientation, m, k)
    _swizzle_input_shape(cfg, orientation, m, k)  # rejects schemes without a swizzled layout
    if tuple(scale.shape) != padded:
        raise SpecViolation(
            f"{orientation}_scale has shape {tuple(scale.shape)}, expected the padded compact shape {padded} "
            f"for {cfg.id} x [{m}, {k}] (layouts.scale_padded_shape)"
        )
    vr, vc = scale_valid_shape(cfg, orientation, m, k)
    t = torch.zeros_like(scale)
    t[:vr, :vc] = scale[:vr, :vc]
    if cfg.scheme == "mxfp8" and orientation == "colwise":
        t = t.t()
    return swizzle(t.contiguous())


def unswizzle_scales(flat: torch.Tensor, config: QuantConfig, orientation: str, m: int, k: int) -> torch.Tensor:
    """Inverse of `swizzle_scales`: flat cuBLASLt scales -> the compact padded tensor of that copy."""
    _check_orientation(orientation)
    t = unswizzle(flat, _swizzle_input_shape(config, orientation, m, k))
    if config.scheme == "mxfp8" and orientation == "colwise":
        t = t.t().contiguous()  # NUMERICS: §3 back from S_c^T to S_c
    return t


# ---- blockwise pow2 sinv as E8M0 --------------------------------------------------------------


def blockwise_sinv_to_e8m0(sinv: torch.Tensor) -> torch.Tensor:
    """Power-of-two blockwise sinv (fp32) -> E8M0 bytes e = (bits(sinv) >> 23) & 0xFF.

    NUMERICS: §4 last line (how sm_100+ runs pow2 blockwise tensors as MXFP8). Exact for every
    pow2 sinv: 2^-127 is the subnormal 0x00400000 whose exponent field 0 is E8M0 0 = 2^-127.
    Zero (padding) maps to byte 0. Anything else (not a positive power of two) is a SpecViolation.
    """
    b = fp32.bits(sinv).to(torch.int64) & 0xFFFFFFFF
    exp = (b >> 23) & 0xFF
    man = b & 0x7FFFFF
    d_zero = UE8M0.bias  # D(0) = 2^-127 is the fp32 subnormal with only mantissa bit 22 set
    sub_pow2 = (exp == 0) & (man == (1 << 22))
    positive = (b >> 31) == 0
    ok = positive & ((b == 0) | ((man == 0) & (exp != 0) & (exp != 0xFF)) | sub_pow2)
    if not bool(ok.all()):
        bad = sinv.reshape(-1)[~ok.reshape(-1)][:4].tolist()
        raise SpecViolation(
            f"blockwise_sinv_to_e8m0 needs positive power-of-two sinv (pow2_scales=True) >= 2^-{d_zero} "
            f"or 0 padding; got e.g. {bad} (NUMERICS.md §4)"
        )
    return exp.to(torch.uint8)
