"""Bit-level casts between fp32 and the narrow formats, generic in exponent/mantissa bits.

Source: docs/numerics.md §0.5 (GPU semantics the reference reproduces) and §0.4 (format table).
Every cast works on the format's row in `formats.py`; no format number appears here. The element
cast has one rounding step, done by the fp32 unit (IEEE RNE on CPU and CUDA alike); every other
step here (bit shifts, power-of-two scaling, float64 decode) is exact, so CPU and CUDA give the
same bits.
"""

from __future__ import annotations

import functools

import torch

from . import fp32
from .formats import UE8M0, ScalarFormat


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e in float64 for an integer tensor e (exact in the range used here)."""
    return torch.ldexp(torch.ones_like(e, dtype=torch.float64), e.to(torch.int32))


def _arith_cast(v: torch.Tensor, fmt: ScalarFormat) -> torch.Tensor:
    """The definition of saturating_cast, in fp32 arithmetic generic over (exp_bits, man_bits, bias).

    1. a = min(|v|, max): saturation first; max is on the grid, so rounding cannot pass it.
    2. RNE onto the grid by the fp32 unit itself: with E = floor(log2 a) read from the bits, the
       format's quantum is Q = 2^(max(E, emin) - man), and (a + C) - C with C = Q * 2^23 rounds a to
       a multiple of Q, ties to even (fp32's own RNE; exact for a < C, which step 1 guarantees).
    3. Encode: r * 2^(bias - 127) maps the format's grid exactly onto fp32's layout (its emin onto
       fp32's emin, so subnormals onto subnormals); the code is those bits >> (23 - man).
    """
    v = v.to(torch.float32)
    a = torch.clamp(v.abs(), max=fmt.max_finite)  # NaN stays NaN, fixed below
    exp_raw = fp32.bits(a) >> 23
    c = fp32.from_bits((torch.clamp(exp_raw, min=fmt.emin + 127) + (23 - fmt.man_bits)) << 23)
    # NUMERICS: §0.5 round to nearest even on the format's grid (subnormals included).
    r = (a + c) - c
    r = r * fp32.scalar(2.0 ** (fmt.bias - 127), r)
    code = (fp32.bits(r) >> (23 - fmt.man_bits)).to(torch.uint8)
    # NUMERICS: §0.5 the sign bit is copied from v (-0.0 and negative underflow give -0).
    code = code | (torch.signbit(v).to(torch.uint8) << (fmt.bits - 1))
    nan_code = fmt.nan_code if fmt.nan_code is not None else fmt.max_code
    return torch.where(torch.isnan(v), torch.full_like(code, nan_code), code)


_TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _torch_fp8_cast(v: torch.Tensor, fmt: ScalarFormat) -> torch.Tensor:
    """NUMERICS: §0.2.3 - clamp to ±max, then `.to(torch.float8_*)`, then overwrite NaN lanes.

    After the clamp only NaN inputs can yield a code above max_code (E4M3 0x7F/0xFF, E5M2
    0x7D-0x7F/0xFD-0xFF), so NaN lanes are found on the 1-byte codes.
    """
    c = torch.clamp(v.to(torch.float32), -fmt.max_finite, fmt.max_finite).to(_TORCH_FP8[fmt.name]).view(torch.uint8)
    return torch.where((c & ~fmt.sign_mask & 0xFF) > fmt.max_code, torch.full_like(c, fmt.nan_code), c)


def _grid_probe(fmt: ScalarFormat, device: torch.device | str = "cpu") -> torch.Tensor:
    """Every finite code's value, every midpoint, and one fp32 ulp either side of each (both signs)."""
    vals = decode(torch.arange(0, fmt.max_code + 1, dtype=torch.uint8), fmt).to(torch.float64)
    mids = ((vals[1:] + vals[:-1]) / 2).to(torch.float32)
    pts = torch.cat([vals.to(torch.float32), mids, torch.nextafter(mids, torch.tensor(0.0)),
                     torch.nextafter(mids, torch.tensor(float("inf"))),
                     torch.tensor([float("inf"), float("nan"), fmt.max_finite * 2, fmt.min_subnormal / 4])])
    return torch.cat([pts, -pts]).to(device)


_TORCH_CAST_OK: dict[tuple[str, str], bool] = {}


def torch_cast_agrees(fmt: ScalarFormat, device: torch.device | str = "cpu") -> bool:
    """Whether PyTorch's clamped float8 cast on this device type equals the arithmetic definition on every probe."""
    key = (fmt.name, torch.device(device).type)
    if key not in _TORCH_CAST_OK:
        p = _grid_probe(fmt, device)
        _TORCH_CAST_OK[key] = bool(torch.equal(_torch_fp8_cast(p, fmt), _arith_cast(p, fmt)))
    return _TORCH_CAST_OK[key]


def saturating_cast(v: torch.Tensor, fmt: ScalarFormat) -> torch.Tensor:
    """fp32 values to `fmt` codes (uint8): RNE, saturate to ±max, signed zero kept, NaN to one code.

    NUMERICS: §0.5 sat_e4m3/sat_e5m2/e2m1_rn - any finite |v| > max and ±inf give ±max (no cast
    produces Inf); NaN of either sign gives the positive NaN code (0x7F) or, for a format without
    NaN (E2M1), +max (0x7); the sign bit is copied from v.
    `_arith_cast` is the definition. For E4M3/E5M2 the faster clamped PyTorch cast is used only if
    it equals the definition on every code, midpoint and midpoint ±1 ulp (checked once per process
    and device type), so the reference never depends on a PyTorch version's cast behaviour.
    """
    if fmt.name in _TORCH_FP8 and torch_cast_agrees(fmt, v.device):
        return _torch_fp8_cast(v, fmt)
    return _arith_cast(v, fmt)


def saturating_cast_nan_free_(v: torch.Tensor, fmt: ScalarFormat, out: torch.Tensor | None = None) -> torch.Tensor:
    """saturating_cast of an fp32 tensor `v` that holds no NaN; `v` is scratch (clamped in place).

    NUMERICS: §0.2.3 - with no NaN lane the final "write 0x7F into every NaN lane" step changes nothing, so the
    clamped PyTorch cast alone gives saturating_cast's codes; the in-place clamp saves a temporary. The caller
    proves the absence of NaN (e.g. from a NaN-propagating amax of the same elements). `out` (uint8, v's
    shape) receives the codes directly when given, and is returned.
    """
    if fmt.name in _TORCH_FP8 and torch_cast_agrees(fmt, v.device):
        v = v.clamp_(-fmt.max_finite, fmt.max_finite)
        if out is None:
            return v.to(_TORCH_FP8[fmt.name]).view(torch.uint8)
        out.view(_TORCH_FP8[fmt.name]).copy_(v)  # the same conversion as .to(), written in place
        return out
    codes = _arith_cast(v, fmt)
    return codes if out is None else out.copy_(codes)


def saturating_cast_signed_nan(v: torch.Tensor, fmt: ScalarFormat) -> torch.Tensor:
    """saturating_cast, but a NaN lane becomes nan_code | its sign bit (0x7F / 0xFF): torch's own float8 cast.

    NUMERICS: §7.1 / §10 - the conventions of other frameworks cast clamp(v) with `.to(torch.float8_*)`,
    which keeps a NaN's sign; every non-NaN lane equals §0.5's cast. Not for E2M1 (no NaN code).
    """
    code = saturating_cast(v, fmt)
    sign = torch.signbit(v).to(torch.uint8) << (fmt.bits - 1)
    return torch.where(torch.isnan(v), sign | fmt.nan_code, code)


def decode(codes: torch.Tensor, fmt: ScalarFormat) -> torch.Tensor:
    """`fmt` codes (uint8, low `fmt.bits` bits) to their exact fp32 values (docs/numerics.md §0.4).

    A lookup in the table of every code's value (`_decode_values` of all 2^bits codes, built once
    per format and device), so a large tensor costs one gather.
    """
    c = codes.to(torch.int64) & ((1 << fmt.bits) - 1)
    return _decode_table(fmt, c.device)[c]


@functools.lru_cache(maxsize=None)
def _decode_table(fmt: ScalarFormat, device: torch.device) -> torch.Tensor:
    return _decode_values(torch.arange(1 << fmt.bits, dtype=torch.int64), fmt).to(device)


def _decode_values(c: torch.Tensor, fmt: ScalarFormat) -> torch.Tensor:
    """The exact fp32 value of each code in c (int64, low `fmt.bits` bits): docs/numerics.md §0.4."""
    neg = (c & fmt.sign_mask) != 0 if fmt.signed else torch.zeros_like(c, dtype=torch.bool)
    mag = c & ~fmt.sign_mask if fmt.signed else c
    ef = mag >> fmt.man_bits
    mf = (mag & ((1 << fmt.man_bits) - 1)).to(torch.float64)
    normal_val = (1.0 + mf / (1 << fmt.man_bits)) * _pow2(ef - fmt.bias)
    sub_val = mf * fmt.min_subnormal
    val = torch.where(ef == 0, sub_val, normal_val)
    all_ones = (1 << fmt.exp_bits) - 1
    if fmt.inf_code is not None:  # IEEE-like: exponent all ones is Inf (mantissa 0) or NaN
        val = torch.where((ef == all_ones) & (mf == 0), torch.full_like(val, float("inf")), val)
        val = torch.where((ef == all_ones) & (mf != 0), torch.full_like(val, float("nan")), val)
    elif fmt.nan_code is not None:  # "fn" formats: only the all-ones pattern is NaN
        val = torch.where(mag == fmt.nan_code, torch.full_like(val, float("nan")), val)
    val = torch.where(neg, -val, val)
    return val.to(torch.float32)


# ---- E8M0 ------------------------------------------------------------------------------------


def e8m0_up(t: torch.Tensor) -> torch.Tensor:
    """e8m0_up(t) for fp32 t >= 0: round up to a power of two, saturating (uint8 exponent).

    NUMERICS: §0.5 e8m0_up, source TE common/util/ptx_arch_spec.cuh - NaN -> 0xFF; +inf -> 0xFE;
    +0 -> 0; otherwise e = E + 1 if F != 0 and E != 0xFE and not (E == 0 and F <= 0x400000), else E.
    """
    b = fp32.bits(t).to(torch.int64) & 0x7FFFFFFF
    exp = (b >> 23) & 0xFF
    frac = b & 0x7FFFFF
    bump = (frac != 0) & (exp != 0xFE) & ~((exp == 0) & (frac <= 0x400000))
    e = exp + bump.to(torch.int64)
    e = torch.where(exp == 0xFF, torch.where(frac == 0, torch.full_like(e, 0xFE), torch.full_like(e, 0xFF)), e)
    return e.to(torch.uint8)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) for finite fp32 a > 0, read exactly from the bits (subnormals included)."""
    _, e = torch.frexp(a.to(torch.float64))
    return e.to(torch.int64) - 1


def e8m0_floor(amax: torch.Tensor, elem: ScalarFormat) -> torch.Tensor:
    """OCP MX rule: e = clamp(floor(log2 A) - emax_elem + 127, 0, 254); A = 0 -> 0, +inf -> 254.

    NUMERICS: §0.5 e8m0_floor, §7.14 (OCP MX v1.0).
    """
    a = amax.to(torch.float32)
    pos = (a > 0) & torch.isfinite(a)
    safe = torch.where(pos, a, torch.ones_like(a))
    e = floor_log2(safe) - elem.emax + UE8M0.bias
    e = torch.clamp(e, 0, UE8M0.max_code)
    e = torch.where(pos, e, torch.zeros_like(e))
    e = torch.where(torch.isinf(a), torch.full_like(e, UE8M0.max_code), e)
    e = torch.where(torch.isnan(a), torch.full_like(e, UE8M0.nan_code), e)
    return e.to(torch.uint8)


def e8m0_decode(e: torch.Tensor) -> torch.Tensor:
    """D(e) = 2^(e - 127) as fp32 (D(0) is the subnormal 2^-127); 0xFF decodes to NaN (docs/numerics.md §0.5)."""
    ei = e.to(torch.int64)
    val = _pow2(ei - UE8M0.bias).to(torch.float32)
    return torch.where(ei == UE8M0.nan_code, torch.full_like(val, float("nan")), val)


def e8m0_multiplier(e: torch.Tensor) -> torch.Tensor:
    """Quantization multiplier P(e) = 2^(127 - e) as fp32: P(0) = 2^127, P(254) = 2^-127, P(255) = NaN."""
    ei = e.to(torch.int64)
    val = _pow2(UE8M0.bias - ei).to(torch.float32)
    return torch.where(ei == UE8M0.nan_code, torch.full_like(val, float("nan")), val)


# ---- FP4 packing -----------------------------------------------------------------------------


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] 4-bit codes to [..., n] bytes: even element in the low nibble (docs/numerics.md §5.4)."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dimension, got shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8) & 0xF
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes to [..., 2n] 4-bit codes (inverse of pack_nibbles)."""
    p = packed.to(torch.uint8)
    out = torch.stack((p & 0xF, p >> 4), dim=-1)
    return out.reshape(*p.shape[:-1], p.shape[-1] * 2)
