"""The single source of truth for every scalar format and quantization scheme.

Every number that changes output bits lives in a row of this module: the reference reads the
fields, native kernels receive them as ``-D`` defines (``native/_compile.py``), the harness stores
only the names. Source: docs/numerics.md §0.4 (format table), §1-§5 (schemes), docs/design.md §2-§3.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, fields

from . import conventions

# --------------------------------------------------------------------------------------------
# Scalar formats
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalarFormat:
    """One scalar number format, described by its bit fields (docs/numerics.md §0.4)."""

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

# Finite maxima of the high-precision input dtypes (docs/numerics.md §0.1, §4 value_for_inf).
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


# Optional QuantConfig fields a scheme may take (Scheme.options); a scheme without an option keeps
# that field at its default. "delayed" is the amax-history group (amax_history_len,
# amax_compute_algo, margin), which also appears in the config id.
OPTIONS = ("pow2_scales", "eps", "e8m0_rule", "rht", "stochastic", "delayed", "variant")
GEMM_METHODS = ("exact", "blockwise_order", "block_sum")


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme: formats, tiles, layout geometry and behaviour (docs/numerics.md §1-§6).

    Geometry fields are read by `layouts.CopyGeometry` (the only place they become shapes); behaviour
    fields name the reference module and GEMM methods, so code outside the scheme's own module asks
    the row, never the scheme's name.
    """

    name: str
    elements: tuple[str, ...]  # allowed element formats, first is the default
    scale_format: str  # "fp32", "ue8m0" or "e4m3"
    tiles: tuple[tuple[int, int] | None, ...]  # allowed tiles, first is the default
    pow2_default: bool
    partial_tiles: bool  # shapes that are not multiples of the tile are zero-padded
    module: str  # reference module with quantize_2d / dequantize / gemm_operand (reference/<module>.py)
    gemm_methods: tuple[str, ...]  # reference GEMM methods; the first is what "auto" runs
    exact_accumulate: bool  # accumulating into C has a defined order (docs/numerics.md §6)
    options: tuple[str, ...]  # the OPTIONS this scheme takes
    colwise_transposed: bool = True  # the colwise copy's data is stored [K, M] (False: [M, K], §3)
    swizzled_scales: bool = False  # scales pad to the cuBLASLt swizzle tile 128 x 4 (§3, §5.9)
    scale_per_tile: bool = False  # a 2-D tile stores one scale entry (False: one per row of the tile)
    block_major_scales: bool = False  # 1-D scales stored [block, row] (§4: TE's transposed sinv)
    stores_amax: bool = False  # each copy carries its fp32 amax [1]
    global_amax: bool = False  # that amax is the second-level scale source (consumed by dequantize / GEMM)
    gemm_2d_x_2d: bool = True  # a GEMM of two 2-D-tiled operands is allowed (§6)
    round_before_accumulate: bool = False  # GEMM epilogue D = RN_out(C + RN_out(Y + bias)) (§6 blockwise)
    given_amax: bool = False  # quantize(..., amax=A) replaces amax(X) (TE's quantize_with_amax; §1, §5.1)
    input_dtypes: tuple[str, ...] = INPUT_DTYPES

    @property
    def per_tensor(self) -> bool:
        """One fp32 scale for the whole tensor (no tiles)."""
        return self.tiles == (None,)

    @property
    def amax_history(self) -> bool:
        """Scales come from an amax history (docs/numerics.md §2 delayed scaling), not the tensor's own amax."""
        return "delayed" in self.options

    @property
    def scale_scalar_format(self) -> "ScalarFormat | None":
        """The format of stored scale bytes (None: fp32 sinv)."""
        return FORMATS.get(self.scale_format)

    def reference_module(self):
        """The reference module implementing this scheme (reference/<module>.py)."""
        return importlib.import_module(f"{__package__}.{self.module}")


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        # NUMERICS: §1 per-tensor current scaling, any shape.
        Scheme("fp8_current", ("e4m3", "e5m2"), "fp32", (None,), False, True, "per_tensor", ("exact",), False,
               ("pow2_scales", "eps"), stores_amax=True, given_amax=True),
        # NUMERICS: §2 delayed scaling, any shape.
        Scheme("fp8_delayed", ("e4m3", "e5m2"), "fp32", (None,), False, True, "per_tensor", ("exact",), False,
               ("delayed",), stores_amax=True),
        # NUMERICS: §3 MXFP8; M and K multiples of 32 (partial blocks not supported here); colwise
        # copy not transposed; E8M0 scales in the swizzle-padded layout.
        Scheme("mxfp8", ("e4m3", "e5m2"), "ue8m0", ((1, 32), (32, 32)), True, False, "mxfp8",
               ("block_sum", "exact"), False, ("e8m0_rule",), colwise_transposed=False, swizzled_scales=True),
        # NUMERICS: §4 blockwise; edge blocks zero-padded, any shape; pow2 on by default; 1-D sinv
        # stored [block, row]; one sinv per 128x128 tile; no 2-D x 2-D GEMM (§6); §6 defines C accumulation.
        Scheme("fp8_block", ("e4m3", "e5m2"), "fp32", ((1, 128), (128, 128)), True, True, "blockwise",
               ("blockwise_order", "exact"), True, ("pow2_scales", "eps"), scale_per_tile=True,
               block_major_scales=True, gemm_2d_x_2d=False,
               round_before_accumulate=True),
        # NUMERICS: §5 NVFP4; M and K multiples of 16; global amax per copy; §6 defines C accumulation.
        Scheme("nvfp4", ("e2m1",), "e4m3", ((1, 16), (16, 16)), False, False, "nvfp4", ("block_sum", "exact"), True,
               ("rht", "stochastic", "variant"), swizzled_scales=True, stores_amax=True, global_amax=True,
               given_amax=True),
    )
}

# NUMERICS: §5.6 - the Random Hadamard Transform of the NVFP4 columnwise copy: 16-point Sylvester
# matrix scaled by 1/sqrt(16) = 1/4, fixed sign vector sigma = (+,+,+,-,+,-,-,-,-,-,-,+,-,+,-,-)
# as a mask (bit i set <=> sigma_i = -1).
RHT_SIZE = 16
RHT_SIGN_MASK = 0xD7E8
RHT_SCALE = 0.25

# NVFP4 variants (docs/numerics.md §5.10). One field spells the closed set TE offers: 4over6 alone,
# row-scaled alone, and row-scaled combined with 4over6 (TE's kernel dispatch treats the pair as
# one mode; two flags would admit nothing more and would split one id fragment in two).
VARIANTS = ("4over6", "row_scaled", "row_scaled_4over6")
FOUR_OVER_SIX_VARIANTS = ("4over6", "row_scaled_4over6")
ROW_SCALED_VARIANTS = ("row_scaled", "row_scaled_4over6")
# NUMERICS: §5.10 - the E4M3 maximum that sets S_enc = 6 * e4m3_max / A_g (256 only for 4over6).
NVFP4_E4M3_MAXES = (448, 256)
# NUMERICS: §5.10 - the 4over6 candidate error (mean absolute or squared error, every step RN).
ERR_MODES = ("mae", "mse")


class _Unset:
    def __repr__(self) -> str:  # pragma: no cover - cosmetic
        return "<default>"


_UNSET: object = _Unset()


def _bad(field_name: str, value: object, rule: str) -> ValueError:
    return ValueError(f"QuantConfig.{field_name}={value!r} is invalid: {rule}")


# Documented ranges of the fp8_delayed fields (QuantConfig docstring says why).
MARGIN_RANGE = (-64, 64)
AMAX_HISTORY_LEN_RANGE = (1, 65536)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _tile(tile: object) -> tuple[int, ...]:
    """A tile as a tuple of ints; non-integer entries (1.5, True, "32") are rejected, never truncated."""
    try:
        items = tuple(tile)  # type: ignore[arg-type]
    except TypeError:
        raise _bad("tile", tile, "expected None or a pair of ints (rows, cols)") from None
    if not all(_is_int(t) for t in items):
        raise _bad("tile", tile, "entries must be ints (not floats or bools)")
    return items


def _takers(option: str, sep: str = ", ") -> str:
    """The schemes that take `option` (for error messages)."""
    return sep.join(s.name for s in SCHEMES.values() if option in s.options)


@dataclass(frozen=True)
class QuantConfig:
    """Everything that changes output bits, validated on construction (docs/design.md §3).

    Fields left unset take the scheme's defaults (first allowed element and tile, the scheme's
    pow2 default); options a scheme does not take (`Scheme.options`) must keep their defaults.
    `amax_history_len`, `amax_compute_algo` and `margin` belong to fp8_delayed; `variant` names
    optional NVFP4 variants (docs/numerics.md §5.10: "4over6", "row_scaled", "row_scaled_4over6"),
    with `e4m3_max` (448, or 256 for 4over6) and `err_mode` ("mae" / "mse", 4over6 only). Numbers
    are never bools.

    Ranges: `amax_history_len` in [1, 65536] (a history is a real buffer; TE's are 1..1024);
    `margin` in [-64, 64]: S_max = fp8_max * 2^-margin (docs/numerics.md §2) stays a normal fp32 with
    room to spare, while margin 10**6 would make S_max 0, every scale 0 and the output all NaN.
    Negative margins (S_max above fp8_max) are legal in TE and used in tests.
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
    e4m3_max: int = 448
    err_mode: str = "mae"
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
            object.__setattr__(self, "tile", _tile(self.tile))
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
        self._validate_variant(sch)
        if self.rht and "rht" not in sch.options:
            raise _bad("rht", self.rht, f"the Random Hadamard Transform exists only for {_takers('rht')} (docs/numerics.md §5.6)")
        if self.stochastic and "stochastic" not in sch.options:
            raise _bad("stochastic", self.stochastic, f"stochastic rounding exists only for {_takers('stochastic')} (docs/numerics.md §5.7)")
        if self.rht and self.is_2d:
            raise _bad("rht", self.rht, f"RHT is never applied to 2-D ({self.tile[0]}x{self.tile[1]}, weight) tiles (docs/numerics.md §5.6)")
        if self.pow2_scales != sch.pow2_default and "pow2_scales" not in sch.options:
            if sch.pow2_default:
                raise _bad("pow2_scales", self.pow2_scales,
                           f"{self.scheme} scales are {sch.scale_format.upper()}, always powers of two")
            raise _bad("pow2_scales", self.pow2_scales,
                       f"power-of-two scales are an option of {_takers('pow2_scales', ' and ')} only")
        if self.e8m0_rule not in E8M0_RULES:
            raise _bad("e8m0_rule", self.e8m0_rule, f"expected one of {E8M0_RULES}")
        if self.e8m0_rule != "ceil" and "e8m0_rule" not in sch.options:
            raise _bad("e8m0_rule", self.e8m0_rule, f"the E8M0 rule applies to {_takers('e8m0_rule')} only")
        if not _is_number(self.eps) or not math.isfinite(self.eps) or self.eps < 0:
            raise _bad("eps", self.eps, "must be a finite float >= 0 (not a bool)")
        if self.eps != 0 and "eps" not in sch.options:
            raise _bad("eps", self.eps, f"eps applies to compute_scale schemes ({_takers('eps')}) only")
        lo, hi = AMAX_HISTORY_LEN_RANGE
        if not _is_int(self.amax_history_len) or not lo <= self.amax_history_len <= hi:
            raise _bad("amax_history_len", self.amax_history_len, f"must be an int >= {lo} and <= {hi} (not a bool)")
        if self.amax_compute_algo not in AMAX_ALGOS:
            raise _bad("amax_compute_algo", self.amax_compute_algo, f"expected one of {AMAX_ALGOS}")
        lo, hi = MARGIN_RANGE
        if not _is_int(self.margin):
            raise _bad("margin", self.margin, "must be an int, not a bool (docs/numerics.md §2: S_max = fp8_max * 2^-margin)")
        if not lo <= self.margin <= hi:
            raise _bad("margin", self.margin, f"must be in [{lo}, {hi}]: fp8_max * 2^-margin must stay a normal fp32 "
                       "(margin 10**6 gives S_max = 0, scale 0 and an all-NaN output; docs/numerics.md §2)")
        conventions.check(self)

    def _validate_variant(self, sch: Scheme) -> None:
        """NUMERICS: §5.10 - the variants and TE's exclusions (no RHT or SR; row-scaled 1-D only)."""
        if not _is_int(self.e4m3_max) or self.e4m3_max not in NVFP4_E4M3_MAXES:
            raise _bad("e4m3_max", self.e4m3_max, f"expected an int in {NVFP4_E4M3_MAXES} (docs/numerics.md §5.10)")
        if self.err_mode not in ERR_MODES:
            raise _bad("err_mode", self.err_mode, f"expected one of {ERR_MODES} (docs/numerics.md §5.10)")
        if self.variant is None:
            if self.e4m3_max != 448 or self.err_mode != "mae":
                which = "e4m3_max" if self.e4m3_max != 448 else "err_mode"
                raise _bad(which, getattr(self, which), "applies to the 4over6 variants only (docs/numerics.md §5.10)")
            return
        if self.variant not in VARIANTS:
            raise _bad("variant", self.variant, f"expected None or one of {VARIANTS} (docs/numerics.md §5.10)")
        if "variant" not in sch.options:
            raise _bad("variant", self.variant, f"variants exist only for {_takers('variant')} (docs/numerics.md §5.10)")
        if self.variant not in FOUR_OVER_SIX_VARIANTS and (self.e4m3_max != 448 or self.err_mode != "mae"):
            which = "e4m3_max" if self.e4m3_max != 448 else "err_mode"
            raise _bad(which, getattr(self, which), "applies to the 4over6 variants only (docs/numerics.md §5.10)")
        if self.rht:
            raise _bad("rht", self.rht, f"variant {self.variant!r} takes no RHT (TE's check; docs/numerics.md §5.10)")
        if self.stochastic:
            raise _bad("stochastic", self.stochastic,
                       f"variant {self.variant!r} takes no stochastic rounding (TE's check; docs/numerics.md §5.10)")
        if self.variant in ROW_SCALED_VARIANTS and self.is_2d:
            raise _bad("tile", self.tile, f"variant {self.variant!r} is 1-D only (TE's check; docs/numerics.md §5.10)")
        if self.convention != conventions.DEFAULT:
            raise _bad("convention", self.convention, f"variant {self.variant!r} is defined for convention "
                       f"{conventions.DEFAULT!r} only (docs/numerics.md §5.10)")

    @property
    def four_over_six(self) -> bool:
        """The 4over6 candidate selection is on (docs/numerics.md §5.10)."""
        return self.variant in FOUR_OVER_SIX_VARIANTS

    @property
    def row_scaled(self) -> bool:
        """Each row (rowwise) / column (colwise) has its own global amax (docs/numerics.md §5.10)."""
        return self.variant in ROW_SCALED_VARIANTS

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
        if self.variant is not None:
            parts.append(self.variant)
        if self.e4m3_max != 448:
            parts.append(f"e{self.e4m3_max}")
        if self.err_mode != "mae":
            parts.append(self.err_mode)
        if self.pow2_scales != self.scheme_row.pow2_default:
            parts.append("pow2" if self.pow2_scales else "fp32scale")
        if self.e8m0_rule != "ceil":
            parts.append(self.e8m0_rule)
        if self.eps:
            parts.append(f"eps{self.eps!r}")  # shortest repr that round-trips (e.g. 2^-20 = 9.5367431640625e-07)
        if self.scheme_row.amax_history:
            parts.append(f"h{self.amax_history_len}-{self.amax_compute_algo}-m{self.margin}")
        if self.convention != conventions.DEFAULT:
            parts.append(f"conv_{self.convention}")
        return "-".join(parts)
