"""Stochastic rounding to E2M1 and the assignment of Philox random bytes to elements.

Source: docs/numerics.md §5.7 - the rounding rule is TE's software rule (common/util/ptx.cuh,
stochastic_round_fp4_e2m1); the bit assignment is this project's contract, chosen so the reference
replays a kernel's bits exactly, independently of any thread mapping.
"""

from __future__ import annotations

import math

import torch

from . import casts, fp32, philox
from .formats import E2M1

# NUMERICS: §5.7 - one Philox call serves GROUP = 16 consecutive elements: its four 32-bit words (x0, x1, x2, x3)
# in turn, 4 elements a word, one byte per element (TE's get_rbits order, common/cast/nvfp4/core_nvfp4.cuh).
WORDS = 4  # output words of one Philox4x32 call
_BYTE_BITS = 8  # r in 0..255, u = r / 2^8
PER_WORD = 32 // _BYTE_BITS  # elements per word
GROUP = WORDS * PER_WORD  # elements per Philox call


def e2m1_grid(device: torch.device | str | None = None) -> torch.Tensor:
    """The non-negative E2M1 values in code order, fp32 [8] (0, .5, 1, 1.5, 2, 3, 4, 6)."""
    codes = torch.arange(E2M1.max_code + 1, dtype=torch.uint8)
    return casts.decode(codes, E2M1).to(device)


# fp32 field widths, from torch.finfo: eps = 2^-23, max = (2 - 2^-23) * 2^127.
_FP32_MAN_BITS = 1 - math.frexp(torch.finfo(torch.float32).eps)[1]
_FP32_BIAS = math.frexp(torch.finfo(torch.float32).max)[1] - 1
_FP32_MAG_MASK = (1 << 31) - 1
_NEG_INF_BITS = int(fp32.bits(torch.tensor(float("-inf"))))
_MIN_NORMAL_BITS = int(fp32.bits(torch.tensor(E2M1.min_normal)))


def _step_exponent(mag: torch.Tensor) -> torch.Tensor:
    """log2 step(v) from fp32 magnitude bits (int32): step(v) = 2 if v >= 4, 1 if v >= 2, else 0.5.

    Derived from the format row: the grid spacing is 2^(clamp(floor(log2 v), emin, emax) - man_bits)
    (0.5 below 2, including the subnormal range; emax's spacing, 2, beyond max and for inf/NaN).
    """
    e = (mag >> _FP32_MAN_BITS) - _FP32_BIAS  # floor(log2 v) for normal v; fp32 subnormals/0 give -127
    return torch.clamp(e, E2M1.emin, E2M1.emax) - E2M1.man_bits


def e2m1_sr(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Stochastically rounded E2M1 codes (uint8, sign in bit 3) of fp32 y with random bytes r (0..255).

    NUMERICS: §5.7 rounding rule - a = |y|, u = r/256 (exact), t = RN(a + u*step(a)) (u*step is
    exact, so one fp32 add), q = fmin(floor(t / step(t)) * step(t), 6) (exact); y's sign bit is
    kept (-0.0 -> 0x8), NaN -> 0x7 (+6), |y| > 6 -> +-6.
    Computed on the fp32 bits: floor(t / step(t)) * step(t) keeps t's exponent and its top
    man_bits mantissa bits when t >= min_normal (1.0), so q's code is read from those bits and
    saturated at max_code (this also maps t >= 8, inf and NaN to 6); below 1.0, q = 0.5 * floor(2t).
    """
    b = fp32.bits(y)
    mag = b & _FP32_MAG_MASK  # bits of a = |y|; NaN stays NaN (positive)
    # u * step(a) = r * 2^(log2 step(a) - 8): an integer below 2^8 times a power of two, exact.
    scale = _step_exponent(mag)
    scale.add_(_FP32_BIAS - _BYTE_BITS).bitwise_left_shift_(_FP32_MAN_BITS)  # bits of 2^(log2 step - 8)
    t = r * scale.view(torch.float32)  # u * step(a), a new fp32 tensor (r's integers convert exactly)
    t.add_(mag.view(torch.float32))  # NUMERICS: §5.7 - the only rounding point, t = RN(a + u*step(a))
    tb = t.view(torch.int32)  # t >= 0 (or NaN with the sign clear): int order = float order
    # t >= 1: code = (biased E2M1 exponent << man_bits) | top mantissa bits, saturated at max_code.
    code = torch.bitwise_right_shift(tb, _FP32_MAN_BITS - E2M1.man_bits, out=scale)
    code.sub_((_FP32_BIAS - E2M1.bias) << E2M1.man_bits).clamp_max_(E2M1.max_code)
    # t < 1: q = floor(t / min_subnormal) * min_subnormal, code = floor(t / min_subnormal).
    low = (t * (1.0 / E2M1.min_subnormal)).floor_().to(torch.int32)  # exact: power-of-two scaling
    code = torch.where(tb < _MIN_NORMAL_BITS, low, code)
    # NUMERICS: §5.7 - sign bit copied from y for every non-NaN value (negative non-NaN floats are
    # exactly the int32 bit patterns <= bits(-inf)); NaN -> 0x7.
    out = code.to(torch.uint8)
    out |= (b <= _NEG_INF_BITS).to(torch.uint8) << (E2M1.bits - 1)
    return out


def copy_stream(stream: int, orientation: str) -> int:
    """NUMERICS: §5.7 - the rowwise copy draws from `stream`, the columnwise copy from stream + 1 (mod 2^32)."""
    if orientation == "rowwise":
        return int(stream) & philox.MASK32
    if orientation == "colwise":
        return (int(stream) + 1) & philox.MASK32
    raise ValueError(f"orientation={orientation!r} is invalid: expected 'rowwise' or 'colwise'")


def group_bytes(groups: torch.Tensor, seed: int, stream: int) -> torch.Tensor:
    """uint8 [..., 16]: the random bytes r of the 16 elements L = 16g .. 16g + 15 of each group g (int64 [...]).

    NUMERICS: §5.7 - one Philox4x32-10 call per group (counter (g lo, g hi, stream, 0), key from the 64-bit
    seed); element L takes word w = floor((L mod 16) / 4) of (x0, x1, x2, x3) and of it byte i = L mod 4,
    bits [8i+7 : 8i].
    """
    words = philox.words_of_groups(groups, seed, stream)  # int64 [..., 4]
    shifts = torch.arange(0, 32, _BYTE_BITS, dtype=torch.int64, device=words.device)  # byte i at bit 8i
    r = (words[..., None] >> shifts) & ((1 << _BYTE_BITS) - 1)  # [..., word, byte]: element 4w + i
    return r.reshape(*groups.shape, GROUP).to(torch.uint8)


def element_bytes(lin: torch.Tensor, seed: int, stream: int) -> torch.Tensor:
    """uint8 r of each element index L (int64 tensor, any shape, L >= 0), one Philox call per element.

    The contract's rule element by element (NUMERICS: §5.7 - g = floor(L/16), word floor((L mod 16)/4), byte
    L mod 4); random_bytes draws the same bytes once per group. For tests and spot checks.
    """
    lin = lin.to(torch.int64)
    words = philox.words_of_groups(lin // GROUP, seed, stream)  # int64 [..., 4]
    w = torch.gather(words, -1, ((lin % GROUP) // PER_WORD)[..., None])[..., 0]
    return ((w >> (_BYTE_BITS * (lin % PER_WORD))) & ((1 << _BYTE_BITS) - 1)).to(torch.uint8)


def random_bytes(
    cols: int, row0: int, row1: int, seed: int, stream: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """uint8 [row1 - row0, cols]: r for rows row0..row1-1 of a copy with `cols` columns (any cols >= 1).

    NUMERICS: §5.7 - index in the copy's own logical layout, L = row * cols + col (rowwise: row m,
    col k of X; columnwise: row k, col m of the [K, M] source); group g = L // 16 of one Philox call, so
    a group may span two rows when cols % 16 != 0 (the groups overlapping the window are drawn whole).
    """
    lin0, lin1 = row0 * cols, row1 * cols
    g0, g1 = lin0 // GROUP, -(-lin1 // GROUP)
    groups = torch.arange(g0, g1, dtype=torch.int64, device=device)
    flat = group_bytes(groups, seed, stream).reshape(-1)
    return flat[lin0 - g0 * GROUP : lin1 - g0 * GROUP].reshape(row1 - row0, cols)


def random_bytes_blocked(
    cols: int, rows: int, b0: int, b1: int, blk: int, seed: int, stream: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """uint8 (b1 - b0, rows, blk): r for a copy [rows, cols] in the blocked layout [b, row, j] = (row, (b0 + b)*blk + j).

    Used for the columnwise copy (rows = K, cols = M), processed one chunk of column blocks at a
    time. NUMERICS: §5.7 - L = row * cols + col, g = L // 16, word (L mod 16) // 4, byte L mod 4: with cols and
    blk multiples of 16, each block row holds blk / 16 whole groups.
    """
    if cols % GROUP or blk % GROUP:
        raise ValueError(f"random_bytes_blocked needs cols and blk multiples of {GROUP}, got {cols}, {blk}")
    gpb = blk // GROUP  # groups per block
    row_g = torch.arange(rows, dtype=torch.int64, device=device) * (cols // GROUP)  # (rows,)
    blk_g = torch.arange(b0, b1, dtype=torch.int64, device=device) * gpb  # (nb,)
    in_blk = torch.arange(gpb, dtype=torch.int64, device=device)  # (blk/16,)
    groups = blk_g[:, None, None] + row_g[None, :, None] + in_blk[None, None, :]  # (nb, rows, blk/16)
    return group_bytes(groups, seed, stream).reshape(b1 - b0, rows, blk)
