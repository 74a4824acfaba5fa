"""The geometry of every stored copy, the GEMM layout table, and the cuBLASLt swizzled scale layout.

Source: docs/numerics.md §1 (per-tensor sinv [1]), §3 Layouts (MXFP8 compact and swizzled scales),
§4 (blockwise transposed sinv storage, pow2 sinv -> E8M0), §5.9 (NVFP4), §6 (GEMM layouts), §8
(swizzle and layout vectors); TE common/cast/mxfp8/swizzle.cuh. `CopyGeometry` is the one place the
scheme rows' geometry fields become data shapes, scale shapes, scale indices and scale regions;
`GEMM_LAYOUTS` is the one table of the copies each GEMM layout consumes. The reference, the harness
and the native backend ask here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import fp32
from .formats import SCHEMES, UE8M0, QuantConfig, Scheme
from .types import QuantizedTensor, SpecViolation

# cuBLASLt swizzle tile: 128 rows x 4 columns of the compact scale matrix, stored as 512
# consecutive bytes (docs/numerics.md §3 Layouts).
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
        raise SpecViolation(f"orientation={orientation!r} is invalid: expected 'rowwise' or 'colwise'")


def _check_dims(m: int, k: int) -> None:
    if not (isinstance(m, int) and isinstance(k, int)) or m < 1 or k < 1:
        raise SpecViolation(f"scale shapes need positive int M, K; got M={m!r}, K={k!r}")


# ---- geometry of one copy ------------------------------------------------------------------


@dataclass(frozen=True)
class CopyGeometry:
    """Where everything of one stored copy lives, for a logical [M, K] input (docs/numerics.md §1, §3, §4, §5.9).

    Data coordinates (r, c) index the stored copy's codes, unpacked: [rows, cols] = [M, K], or
    [K, M] when `transposed`. `block` is the quantization block in data coordinates (the amax
    region; 2-D tiles (b, b)); `scale_block` the region one scale entry governs (a 2-D tile whose
    scale is repeated on each of its rows governs one row of it). Built from the scheme row's
    geometry fields only: this is the one place they become shapes.
    """

    config: QuantConfig
    orientation: str
    m: int
    k: int

    @property
    def scheme(self) -> Scheme:
        return self.config.scheme_row

    @property
    def per_tensor(self) -> bool:
        return self.scheme.per_tensor

    @property
    def transposed(self) -> bool:
        """The stored data is [K, M] (NUMERICS: §1 data_T, §4 colwise, §5.5 NVFP4 of x^T; not MXFP8 §3)."""
        return self.orientation == "colwise" and self.scheme.colwise_transposed

    @property
    def rows(self) -> int:
        return self.k if self.transposed else self.m

    @property
    def cols(self) -> int:
        return self.m if self.transposed else self.k

    @property
    def codes_per_byte(self) -> int:
        """Codes packed per stored byte along cols (NUMERICS: §5.4 two E2M1 codes per byte)."""
        return 8 // self.config.element_format.bits

    @property
    def data_shape(self) -> tuple[int, int]:
        return (self.rows, self.cols // self.codes_per_byte)

    @property
    def along_rows(self) -> bool:
        """The 1-D blocks run along data rows (the colwise copy of a non-transposed layout, §3)."""
        return self.orientation == "colwise" and not self.transposed

    @property
    def block(self) -> tuple[int, int]:
        """The quantization block (rows, cols) in data coordinates; per-tensor: the whole copy."""
        b = self.config.block
        if b is None:
            return (self.rows, self.cols)
        if self.config.is_2d:
            return (b, b)
        return (b, 1) if self.along_rows else (1, b)

    @property
    def scale_block(self) -> tuple[int, int] | None:
        """The data region (rows, cols) one scale entry governs; None for per-tensor."""
        b = self.config.block
        if b is None:
            return None
        if self.config.is_2d and self.scheme.scale_per_tile:
            return (b, b)  # NUMERICS: §4 one sinv per 128x128 tile
        # NUMERICS: §3 / §5.5 a 2-D tile's scale is stored on each of its rows (columns for S_c).
        return (b, 1) if self.along_rows else (1, b)

    @property
    def block_major(self) -> bool:
        """The scale tensor is stored [col block, row] (NUMERICS: §4 1-D sinv, TE's transposed scale_inv)."""
        return self.scheme.block_major_scales and not self.config.is_2d

    @property
    def swizzle_transposed(self) -> bool:
        """The swizzle input T is this copy's scale tensor transposed (NUMERICS: §3 MXFP8 colwise: S_c^T)."""
        return self.scheme.swizzled_scales and self.along_rows

    @property
    def scale_valid_shape(self) -> tuple[int, ...]:
        """The unpadded region of the compact scale tensor; (1,) for per-tensor."""
        sb = self.scale_block
        if sb is None:
            return (1,)  # NUMERICS: §1 one fp32 sinv shared by data and data_T
        g = (_ceil_div(self.rows, sb[0]), _ceil_div(self.cols, sb[1]))
        return (g[1], g[0]) if self.block_major else g

    @property
    def scale_padded_shape(self) -> tuple[int, ...]:
        """The stored (padded) shape of the compact scale tensor."""
        valid = self.scale_valid_shape
        if self.per_tensor:
            return valid
        rows, cols = valid
        if not self.scheme.swizzled_scales:
            # NUMERICS: §4 - only the fast dim is rounded up to 4.
            return (rows, _roundup(cols, COL_PAD))
        if self.swizzle_transposed:
            # NUMERICS: §3 - S_c [roundup(M/32, 4), roundup(K, 128)]: its transpose is the swizzle input.
            return (_roundup(rows, COL_PAD), _roundup(cols, ROW_PAD))
        # NUMERICS: §3 S_r [roundup(M,128), roundup(K/32,4)]; §5.9 NVFP4 both copies.
        return (_roundup(rows, ROW_PAD), _roundup(cols, COL_PAD))

    @property
    def scale_dtype(self) -> torch.dtype:
        return torch.float32 if self.scheme.scale_scalar_format is None else torch.uint8

    @property
    def amax_shape(self) -> tuple[int, ...] | None:
        """(1,) where the copy carries its fp32 amax, else None; a row-scaled NVFP4 copy carries one
        amax per row of the copy: [M] rowwise, [K] colwise (NUMERICS: §5.10 row-scaled)."""
        if not self.scheme.stores_amax:
            return None
        return (self.rows,) if self.config.row_scaled else (1,)

    def scale_index(self, r, c):
        """(i, j) into the compact scale tensor for data position(s) (r, c) (ints or tensors); None for per-tensor."""
        sb = self.scale_block
        if sb is None:
            return None
        i, j = r // sb[0], c // sb[1]
        return (j, i) if self.block_major else (i, j)

    def scale_region(self, i: int, j: int) -> tuple[int, int, int, int]:
        """Data rectangle (r0, r1, c0, c1) governed by scale entry (i, j) (clipped to the copy)."""
        sr, sc = self.scale_block or (self.rows, self.cols)
        rb, cb = (j, i) if self.block_major else (i, j)
        return rb * sr, min((rb + 1) * sr, self.rows), cb * sc, min((cb + 1) * sc, self.cols)

    def block_of(self, r: int, c: int) -> tuple[list[int], int]:
        """The quantization block [bi, bj] holding (r, c), and (r, c)'s row-major index inside it."""
        br, bc = self.block
        return [r // br, c // bc], (r % br) * bc + (c % bc)

    def logical(self, r: int, c: int) -> tuple[int, int]:
        """The logical [M, K] position of data position (r, c)."""
        return (c, r) if self.transposed else (r, c)


@functools.lru_cache(maxsize=4096)
def copy_geometry(config: QuantConfig, orientation: str, m: int, k: int) -> CopyGeometry:
    """The geometry of one copy of a logical [M, K] input (validated; cached)."""
    _check_orientation(orientation)
    _check_dims(m, k)
    return CopyGeometry(config, orientation, m, k)


def geometry_of(q: QuantizedTensor, orientation: str) -> CopyGeometry:
    return copy_geometry(q.config, orientation, q.m, q.k)


def scale_valid_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, ...]:
    """The unpadded region of the compact scale tensor of one copy (`CopyGeometry.scale_valid_shape`).

    Per-tensor: (1,). Blockwise 1-D rowwise: (ceil(K/128), M) (stored transposed, entry [kb, m]);
    1-D colwise: (ceil(M/128), K); 2-D rowwise (ceil(M/128), ceil(K/128)), colwise its transpose.
    MXFP8: rowwise (M, K/32), colwise (M/32, K). NVFP4: rowwise (M, K/16), colwise (K, M/16).
    """
    return copy_geometry(config, orientation, m, k).scale_valid_shape


def scale_padded_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, ...]:
    """The stored (padded) shape of the compact scale tensor of one copy (`CopyGeometry.scale_padded_shape`).

    docs/numerics.md §1, §3 Layouts, §4, §5.9: blockwise pads the fast (column) dim to a multiple of 4;
    MXFP8 and NVFP4 pad rows to 128 and columns to 4 (the swizzle tile).
    """
    return copy_geometry(config, orientation, m, k).scale_padded_shape


def data_shape(config: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, int]:
    """The stored shape of one copy's data (`CopyGeometry.data_shape`; docs/numerics.md §1, §3, §4, §5.9).

    Per-tensor and blockwise colwise copies are transposed [K, M]; MXFP8 colwise is NOT transposed
    [M, K]; NVFP4 packs two codes per byte: rowwise [M, K/2], colwise [K, M/2].
    """
    return copy_geometry(config, orientation, m, k).data_shape


# ---- GEMM layouts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmLayout:
    """One GEMM layout: out[m, n] = sum_k A[m, k] * B[n, k] over the consumed copies (docs/numerics.md §6).

    An operand consumed rowwise is logical [outer, K]; consumed colwise it is logical [K, outer]
    (TE's fprop TN, dgrad NN, wgrad NT).
    """

    name: str
    a: str  # orientation consumed from a
    b: str  # orientation consumed from b

    @property
    def consumes(self) -> tuple[str, str]:
        return (self.a, self.b)

    @property
    def copies(self) -> tuple[bool, bool, bool, bool]:
        """(a_rowwise, a_colwise, b_rowwise, b_colwise): the copies to quantize for this layout."""
        return (self.a == "rowwise", self.a == "colwise", self.b == "rowwise", self.b == "colwise")

    def quantize_flags(self, operand: str) -> dict[str, bool]:
        """rowwise= / colwise= keyword arguments that quantize exactly the consumed copy of `operand`."""
        o = self.a if operand == "a" else self.b
        return {"rowwise": o == "rowwise", "colwise": o == "colwise"}

    def operand_shapes(self, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The logical shapes of a and b for an [M, N] output contracting K."""
        a = (m, k) if self.a == "rowwise" else (k, m)
        b = (n, k) if self.b == "rowwise" else (k, n)
        return a, b


GEMM_LAYOUTS: dict[str, GemmLayout] = {
    lay.name: lay
    for lay in (
        GemmLayout("TN", "rowwise", "rowwise"),  # NUMERICS: §6 fprop: a [M, K], b [N, K]
        GemmLayout("NN", "rowwise", "colwise"),  # NUMERICS: §6 dgrad: a [M, K], b [K, N]
        GemmLayout("NT", "colwise", "colwise"),  # NUMERICS: §6 wgrad: a [K, M], b [K, N]
    )
}


def gemm_layout(name: str) -> GemmLayout:
    """The GemmLayout `name`; SpecViolation naming the choices otherwise."""
    try:
        return GEMM_LAYOUTS[name]
    except (KeyError, TypeError):
        raise SpecViolation(f"layout={name!r} is invalid: expected one of {tuple(GEMM_LAYOUTS)}") from None


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
    if not config.scheme_row.swizzled_scales:
        swz = " and ".join(s.name for s in SCHEMES.values() if s.swizzled_scales)
        raise SpecViolation(
            f"{config.id}: only {swz} scales have a cuBLASLt swizzled layout (docs/numerics.md §3, §5.9); "
            f"{config.scheme} scales are used in their compact layout"
        )
    g = copy_geometry(config, orientation, m, k)
    rows, cols = g.scale_padded_shape
    if g.swizzle_transposed:
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
    if geometry_of(q, orientation).swizzle_transposed:
        t = t.t()
    return swizzle(t.contiguous())


def unswizzle_scales(flat: torch.Tensor, config: QuantConfig, orientation: str, m: int, k: int) -> torch.Tensor:
    """Inverse of `swizzle_scales`: flat cuBLASLt scales -> the compact padded tensor of that copy."""
    _check_orientation(orientation)
    t = unswizzle(flat, _swizzle_input_shape(config, orientation, m, k))
    if copy_geometry(config, orientation, m, k).swizzle_transposed:
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
            f"or 0 padding; got e.g. {bad} (docs/numerics.md §4)"
        )
    return exp.to(torch.uint8)
