"""The single source of truth for every scalar format and quantization scheme.

Every number that changes output bits lives in a row of this module: the reference reads the
fields, native kernels receive them as ``-D`` defines (``native/_compile.py``), the harness stores
only the names. Source: NUMERICS.md §0.4 (format table), §1-§5 (schemes), DESIGN.md §2-§3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from . import conventions

# --------------------------------------------------------------------------------------------
# Scalar formats
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalarFormat:
    """One scalar number format, described by its bit fields (NUMERICS.md §0.4)."""

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    signed: bool
    max_finite: float  # largest finite magnitude
    max_code: int  # bit pattern of +max_finite
    nan_code: int | None  # canonical NaN written by the GPU casts (None: no NaN code)
    inf_code: int | None  # +inf bit pattern (None: no Inf)

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def sign_mask(self) -> int:
        return (1 << (self.bits - 1)) if self.signed else 0

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal (also the exponent of the subnormal grid)."""
        return 1 - self.bias

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.man_bits)

    @property
    def emax(self) -> int:
        """Unbiased exponent of max_finite (OCP's emax_elem for the E8M0 `floor` rule)."""
        return math.frexp(self.max_finite)[1] - 1


E4M3 = ScalarFormat("e4m3", 4, 3, 7, True, 448.0, 0x7E, 0x7F, None)
E5M2 = ScalarFormat("e5m2", 5, 2, 15, True, 57344.0, 0x7B, 0x7F, 0x7C)
E2M1 = ScalarFormat("e2m1", 2, 1, 1, True, 6.0, 0x7, None, None)
UE8M0 = ScalarFormat("ue8m0", 8, 0, 127, False, 2.0**127, 0xFE, 0xFF, None)

FORMATS: dict[str, ScalarFormat] = {f.name: f for f in (E4M3, E5M2, E2M1, UE8M0)}

# Finite maxima of the high-precision input dtypes (NUMERICS.md §0.1, §4 value_for_inf).
FLT_MAX = 3.4028234663852886e38  # 0x7F7FFFFF
BF16_MAX = 3.3895313892515355e38  # 0x7F7F0000
F16_MAX = 65504.0
INPUT_DTYPE_MAX = {"float32": FLT_MAX, "bfloat16": BF16_MAX, "float16": F16_MAX}

# --------------------------------------------------------------------------------------------
# Schemes
# --------------------------------------------------------------------------------------------

SCHEME_NAMES = ("fp8_current", "fp8_delayed", "mxfp8", "fp8_block", "nvfp4")
ORIENTATIONS = ("rowwise", "colwise")
E8M0_RULES = ("ceil", "floor")
AMAX_ALGOS = ("max", "most_recent")
INPUT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme: element formats, scale format, tiles, scale rule (NUMERICS.md §1-§5)."""

    name: str
    elements: tuple[str, ...]  # allowed element formats, first is the default
    scale_format: str  # "fp32", "ue8m0" or "e4m3"
    tiles: tuple[tuple[int, int] | None, ...]  # allowed tiles, first is the default
    scale_rule: str  # "compute_scale", "delayed", "e8m0", "nvfp4_two_level"
    global_scale: bool  # has a second-level fp32 scale (NVFP4 global amax)
    pow2_default: bool
    partial_tiles: bool  # shapes that are not multiples of the tile are zero-padded
    input_dtypes: tuple[str, ...] = INPUT_DTYPES


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        # NUMERICS: §1 per-tensor current scaling, any shape.
        Scheme("fp8_current", ("e4m3", "e5m2"), "fp32", (None,), "compute_scale", False, False, True),
        # NUMERICS: §2 delayed scaling, any shape.
        Scheme("fp8_delayed", ("e4m3", "e5m2"), "fp32", (None,), "delayed", False, False, True),
        # NUMERICS: §3 MXFP8; M and K multiples of 32 (partial blocks not supported here).
        Scheme("mxfp8", ("e4m3", "e5m2"), "ue8m0", ((1, 32), (32, 32)), "e8m0", False, True, False),
        # NUMERICS: §4 blockwise; edge blocks zero-padded, any shape; pow2 on by default.
        Scheme("fp8_block", ("e4m3", "e5m2"), "fp32", ((1, 128), (128, 128)), "compute_scale", False, True, True),
        # NUMERICS: §5 NVFP4; M and K multiples of 16.
        Scheme("nvfp4", ("e2m1",), "e4m3", ((1, 16), (16, 16)), "nvfp4_two_level", True, False, False),
    )
}

# NUMERICS: §5.6 - the Random Hadamard Transform of the NVFP4 columnwise copy: 16-point Sylvester
# matrix scaled by 1/sqrt(16) = 1/4, fixed sign vector sigma = (+,+,+,-,+,-,-,-,-,-,-,+,-,+,-,-)
# as a mask (bit i set <=> sigma_i = -1).
RHT_SIZE = 16
RHT_SIGN_MASK = 0xD7E8
RHT_SCALE = 0.25

# Variants NUMERICS.md §5.10 lists as optional; not implemented yet, rejected by QuantConfig.
UNIMPLEMENTED_VARIANTS = ("4over6", "row_scaled")


class _Unset:
    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return "<default>"


_UNSET: object = _Unset()


def _bad(field_name: str, value: object, rule: str) -> ValueError:
    return ValueError(f"QuantConfig.{field_name}={value!r} is invalid: {rule}")


@dataclass(frozen=True)
class QuantConfig:
    """Everything that changes output bits, validated on construction (DESIGN.md §3).

    Fields left unset take the scheme's defaults (first allowed element and tile, the scheme's
    pow2 default). `amax_history_len`, `amax_compute_algo` and `margin` belong to fp8_delayed;
    `variant` names optional NVFP4 variants (NUMERICS.md §5.10), none implemented yet.
    """

    scheme: str
    element: str = field(default=_UNSET)  # type: ignore[assignment]
    tile: tuple[int, int] | None = field(default=_UNSET)  # type: ignore[assignment]
    rht: bool = False
    stochastic: bool = False
    pow2_scales: bool = field(default=_UNSET)  # type: ignore[assignment]
    e8m0_rule: str = "ceil"
    eps: float = 0.0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    margin: int = 0
    variant: str | None = None
    convention: str = conventions.DEFAULT  # reference/conventions.py; "te" keeps every id unchanged

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise _bad("scheme", self.scheme, f"expected one of {', '.join(SCHEME_NAMES)}")
        sch = SCHEMES[self.scheme]
        if self.element is _UNSET:
            object.__setattr__(self, "element", sch.elements[0])
        if self.tile is _UNSET:
            object.__setattr__(self, "tile", sch.tiles[0])
        elif self.tile is not None:
            object.__setattr__(self, "tile", tuple(int(t) for t in self.tile))
        if self.pow2_scales is _UNSET:
            object.__setattr__(self, "pow2_scales", sch.pow2_default)
        self._validate(sch)

    def _validate(self, sch: Scheme) -> None:
        if self.element not in sch.elements:
            raise _bad("element", self.element, f"{self.scheme} takes element in {sch.elements}")
        if self.tile not in sch.tiles:
            raise _bad("tile", self.tile, f"{self.scheme} takes tile in {sch.tiles}")
        for flag in ("rht", "stochastic", "pow2_scales"):
            if not isinstance(getattr(self, flag), bool):
                raise _bad(flag, getattr(self, flag), "must be a bool")
        if self.variant is not None:
            if self.variant in UNIMPLEMENTED_VARIANTS:
                raise _bad("variant", self.variant, "NVFP4 variant (NUMERICS.md §5.10) is not implemented yet")
            raise _bad("variant", self.variant, f"expected None (known, unimplemented: {UNIMPLEMENTED_VARIANTS})")
        if self.scheme != "nvfp4":
            if self.rht:
                raise _bad("rht", self.rht, "the Random Hadamard Transform exists only for nvfp4 (NUMERICS.md §5.6)")
            if self.stochastic:
                raise _bad("stochastic", self.stochastic, "stochastic rounding exists only for nvfp4 (NUMERICS.md §5.7)")
        else:
            if self.rht and self.tile == (16, 16):
                raise _bad("rht", self.rht, "RHT is never applied to 2-D (16x16, weight) tiles (NUMERICS.md §5.6)")
            if self.stochastic and self.tile == (16, 16):
                raise _bad(
                    "stochastic",
                    self.stochastic,
                    "16x16 (weight) tiles round to nearest: their colwise copy is the exact transpose (NUMERICS.md §5.5)",
                )
        if self.pow2_scales and self.scheme not in ("fp8_current", "fp8_block") and not sch.pow2_default:
            raise _bad("pow2_scales", self.pow2_scales, "power-of-two scales are an option of fp8_current and fp8_block only")
        if self.scheme == "mxfp8" and not self.pow2_scales:
            raise _bad("pow2_scales", self.pow2_scales, "mxfp8 scales are E8M0, always powers of two")
        if self.e8m0_rule not in E8M0_RULES:
            raise _bad("e8m0_rule", self.e8m0_rule, f"expected one of {E8M0_RULES}")
        if self.e8m0_rule != "ceil" and self.scheme != "mxfp8":
            raise _bad("e8m0_rule", self.e8m0_rule, "the E8M0 rule applies to mxfp8 only")
        if not isinstance(self.eps, (int, float)) or not math.isfinite(self.eps) or self.eps < 0:
            raise _bad("eps", self.eps, "must be a finite float >= 0")
        if self.eps != 0 and self.scheme not in ("fp8_current", "fp8_block"):
            raise _bad("eps", self.eps, "eps applies to compute_scale schemes (fp8_current, fp8_block) only")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise _bad("amax_history_len", self.amax_history_len, "must be an int >= 1")
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise _bad("amax_compute_algo", self.amax_compute_algo, f"expected one of {AMAX_ALGOS}")
        if not isinstance(self.margin, int):
            raise _bad("margin", self.margin, "must be an int (NUMERICS.md §2: S_max = fp8_max * 2^-margin)")
        conventions.check(self)

    # ---- derived facts -----------------------------------------------------------------------
    @property
    def scheme_row(self) -> Scheme:
        return SCHEMES[self.scheme]

    @property
    def element_format(self) -> ScalarFormat:
        return FORMATS[self.element]

    @property
    def is_2d(self) -> bool:
        return self.tile is not None and self.tile[0] > 1

    @property
    def block(self) -> int | None:
        """Block length along the quantized axis (32, 128, 16), None for per-tensor schemes."""
        return None if self.tile is None else self.tile[1]

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def id(self) -> str:
        """Readable, stable id fragment naming every non-default field."""
        parts = [self.scheme, self.element]
        if self.tile is not None:
            parts.append(f"{self.tile[0]}x{self.tile[1]}")
        if self.rht:
            parts.append("rht")
        if self.stochastic:
            parts.append("sr")
        if self.pow2_scales != self.scheme_row.pow2_default:
            parts.append("pow2" if self.pow2_scales else "fp32scale")
        if self.e8m0_rule != "ceil":
            parts.append(self.e8m0_rule)
        if self.eps:
            parts.append(f"eps{self.eps!r}")  # shortest repr that round-trips (e.g. 2^-20 = 9.5367431640625e-07)
        if self.scheme == "fp8_delayed":
            parts.append(f"h{self.amax_history_len}-{self.amax_compute_algo}-m{self.margin}")
        if self.convention != conventions.DEFAULT:
            parts.append(f"conv_{self.convention}")
        return "-".join(parts)
