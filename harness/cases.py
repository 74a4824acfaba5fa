"""Cases as data: the `Case` model, readable round-tripping ids, and TOML grids expanded into cases.

Source: docs/design.md §5 (a Case is data; grids with exclusions applied at generation time; hardware
gaps are generated and skip later), docs/numerics.md §1-§6 (what the spec forbids), docs/design.md §5
(`Case`, `Case.from_id`, `load_cases`, `TIERS`).

TOML schema (also in cases/README.md)
-------------------------------------
A cases file holds optional top-level ``tier = "<label>"`` (default: the file stem), optional
``cover = "full" | "pairwise"`` (default for every grid, "full" unless given), optional
``include = ["other.toml", ...]`` (those files' cases first, paths relative to this file) and a
list of ``[[grid]]`` tables. Every key of a grid is a list whose product is taken (a scalar is a
one-element list; ``shape`` and ``tile`` take one list of ints or a list of them):

  op                 "quantize" | "dequantize" | "gemm"                         (default "quantize")
  scheme             fp8_current | fp8_delayed | mxfp8 | fp8_block | nvfp4     (required)
  element            e4m3 | e5m2 | e2m1 | "default" (the scheme's default)
  tile               [1, 32] / "1x32" / "none" / "default"
  rht, stochastic    bool
  pow2_scales        bool | "default"
  e8m0_rule          "ceil" | "floor"
  eps, amax_history_len, amax_compute_algo, margin    the other QuantConfig fields
  b_element, b_tile, b_rht, b_stochastic, b_pow2_scales, b_e8m0_rule
                     gemm only: the B operand's config = A's config with these fields replaced
  orientation        "rowwise" | "colwise" | "both"   (quantize/dequantize; gemm uses "both")
  shape              quantize/dequantize: x's shape [..., K]; gemm: [M, N, K]    (required)
  in_dtype           float32 | bfloat16 | float16 (aliases fp32/f32, bf16, fp16/f16) (default bfloat16)
  out_dtype          dequantize (default float32) and gemm (default bfloat16) output dtype
  layout             "TN" | "NN" | "NT"                                          (gemm, default "TN")
  accumulate, bias   bool (gemm: accumulate into an existing C; add a bias [N])
  distribution       one of DISTRIBUTIONS (harness/inputs.py)                   (default "normal")
  seed               int >= 0                                                    (default 0)

op = "linear" (a Linear / LayerNormLinear training case, docs/numerics.md §9) takes instead of scheme,
the config keys and shape: module, normalization, zero_centered_gamma, recipe, fp8_format, rht,
stochastic, two_d, pow2_scales, amax_history_len, tokens, features ([K, N]) or in_features and
out_features, in_dtype (the
activation dtype), bias, steps, microbatch, fuse_wgrad_accumulation, distribution ("normal"), seed
(cases/README.md; harness.module_inputs draws the inputs).

plus, not producted: ``exclude = [{key = value, ...}, ...]`` (a case is dropped when it matches
every key of one entry; values are compared after normalisation, e.g. dtype aliases, tiles),
``tier = "<label>"`` (default: the file's) and ``cover = "full" | "pairwise"``.

Keys that do not apply to an op are normalised away (a quantize case has no layout; a gemm case
has orientation "both") and the duplicates this makes are dropped and counted. Combinations the
spec forbids (QuantConfig raises ValueError; RHT with a non-bf16 input; a shape the scheme's tile
rule forbids; 2-D x 2-D fp8_block GEMMs; a GEMM consuming an RHT copy of only one operand) are
dropped silently and counted (`CaseList.spec_excluded`, `CaseList.exclusion_reasons`); anything
else that is wrong (an unknown key, scheme or value, malformed TOML) raises `CaseFileError` naming
the file, the line (or the grid's index) and the field.

``cover = "pairwise"`` keeps a subset of the grid's valid cases that contains every pair of
(key, value) assignments occurring in the full valid expansion: greedy all-pairs with a fixed
seed (PAIRWISE_SEED), deterministic for a given file.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from reference.formats import (
    AMAX_ALGOS,
    E8M0_RULES,
    ERR_MODES,
    FORMATS,
    INPUT_DTYPES,
    NVFP4_E4M3_MAXES,
    SCHEME_NAMES,
    VARIANTS,
    QuantConfig,
)
from reference.gemm import EPILOGUES, epilogue_rule
from reference.grouped import splits_rule
from reference.layouts import GEMM_LAYOUTS
from reference.spec import copies_rule, gemm_rule, quantize_rule
from reference.types import SpecViolation

from .linear_case import (
    LINEAR_MODULES,
    MICROBATCH_PATTERNS,
    NORMALIZATIONS,
    RECIPE_NAMES,
    LinearSpec,
    build_linear_case,
    linear_id,
    linear_values,
    linear_violation,
)
from .linear_case import (
    parse_linear_id as _parse_linear_id,
)


def _cases_dir() -> Path:
    """The directory of the shipped tier files: the `cases` package's data (importlib.resources), so an
    installed distribution finds them from any working directory; the package is installed as plain files,
    so its resource root is a directory."""
    return Path(str(resources.files("cases")))


CASES_DIR = _cases_dir()
# Tier name -> file under cases/ (load_cases("smoke") reads cases/smoke.toml).
TIERS: dict[str, str] = {
    "smoke": "smoke.toml",
    "fp8": "fp8.toml",
    "mxfp8": "mxfp8.toml",
    "nvfp4": "nvfp4.toml",
    "gemm": "gemm.toml",
    "nightly": "nightly.toml",
    "modules": "modules.toml",
}

OPS = ("quantize", "dequantize", "gemm", "grouped_quantize", "linear")
QUANTIZE_OPS = ("quantize", "grouped_quantize")  # ops without an output dtype
ORIENTATIONS = ("rowwise", "colwise", "both")
LAYOUTS = tuple(GEMM_LAYOUTS)
DISTRIBUTIONS = (
    "normal",
    "uniform",
    "heavy_tail",
    "outliers",
    "per_tile_scales",
    "ties",
    "special",
    "exhaustive",
    "exact_representable",
    "special_nan",
    "special_inf",
)
DTYPE_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_DTYPE_ALIASES = {
    **{d: d for d in INPUT_DTYPES},
    **{s: d for d, s in DTYPE_SHORT.items()},
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
}
PAIRWISE_SEED = 20240601
_PAIRWISE_SAMPLE = 64  # candidates scored per greedy step

CONFIG_KEYS = (
    "scheme",
    "element",
    "tile",
    "rht",
    "stochastic",
    "pow2_scales",
    "e8m0_rule",
    "eps",
    "amax_history_len",
    "amax_compute_algo",
    "margin",
    "variant",
    "e4m3_max",
    "err_mode",
)
B_OVERRIDABLE = ("element", "tile", "rht", "stochastic", "pow2_scales", "e8m0_rule", "variant", "e4m3_max", "err_mode")
B_KEYS = tuple(f"b_{k}" for k in B_OVERRIDABLE)
GRID_KEYS = (
    ("op",)
    + CONFIG_KEYS
    + B_KEYS
    + ("orientation", "shape", "in_dtype", "out_dtype", "layout", "accumulate", "bias", "distribution", "seed")
    + ("splits", "epilogue", "b_in_dtype")
)
# op = "linear" (docs/numerics.md §9): the module, the recipe and its toggles, the step pattern.
LINEAR_KEYS = (
    "module",
    "normalization",
    "zero_centered_gamma",
    "recipe",
    "fp8_format",
    "two_d",
    "tokens",
    "features",
    "in_features",
    "out_features",
    "steps",
    "microbatch",
    "fuse_wgrad_accumulation",
)
# The recipe toggles that reuse a config key's name (rht, stochastic: nvfp4; pow2_scales: current, block;
# amax_history_len: delayed).
LINEAR_TOGGLES = ("fp8_format", "rht", "stochastic", "two_d", "pow2_scales", "amax_history_len")
GRID_KEYS = GRID_KEYS + LINEAR_KEYS
_TABLE_EXTRA_KEYS = ("exclude", "tier", "cover")
_FILE_KEYS = ("grid", "tier", "cover", "description", "include")
COVERS = ("full", "pairwise")
_DEFAULT = "default"  # grid value meaning "the scheme's default" (element, tile, pow2_scales)


class CaseFileError(ValueError):
    """A cases file that cannot be read: malformed TOML, an unknown key, scheme or value."""


class _FieldError(ValueError):
    """A bad value for one grid field (turned into a CaseFileError with file/line/field)."""


# ----------------------------------------------------------------------------------------------
# The Case model
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One test case: op, config(s), shape, dtypes, input distribution and seed (docs/design.md §5).

    `shape` is x's shape for quantize/dequantize and (M, N, K) for gemm. For gemm, `config` is A's
    config and `b_config` B's (defaults to A's); the layout decides which copies are consumed
    (reference.layouts.GEMM_LAYOUTS) and `orientation` is "both". `source` ("file:line") is not part of the id
    nor of equality.
    """

    op: str
    config: QuantConfig
    shape: tuple[int, ...]
    in_dtype: str = "bfloat16"
    distribution: str = "normal"
    seed: int = 0
    orientation: str | None = None
    out_dtype: str | None = None
    layout: str | None = None
    b_config: QuantConfig | None = None
    accumulate: bool = False
    bias: bool = False
    splits: tuple[int, ...] | None = None
    epilogue: str | None = None
    b_in_dtype: str | None = None
    module: Any = None  # op "linear": a harness.cases.LinearSpec
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.op not in OPS:
            raise ValueError(f"Case.op={self.op!r} is invalid: expected one of {OPS}")
        if not isinstance(self.config, QuantConfig):
            raise ValueError(f"Case.config must be a QuantConfig, got {type(self.config).__name__}")
        put("shape", tuple(int(d) for d in self.shape))
        if not self.shape or any(d < 1 for d in self.shape):
            raise ValueError(f"Case.shape={self.shape!r} is invalid: expected positive dims")
        if self.in_dtype not in INPUT_DTYPES:
            raise ValueError(f"Case.in_dtype={self.in_dtype!r} is invalid: expected one of {INPUT_DTYPES}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"Case.distribution={self.distribution!r} is invalid: expected one of {DISTRIBUTIONS}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"Case.seed={self.seed!r} is invalid: expected an int >= 0")
        if self.op == "grouped_quantize":
            if self.splits is None:
                raise ValueError("Case.splits is required for grouped_quantize (sizes of the groups along M)")
            put("splits", tuple(int(v) for v in self.splits))
        elif self.splits is not None:
            raise ValueError(f"Case.splits applies to grouped_quantize only (op={self.op})")
        if self.op != "gemm" and (self.epilogue is not None or self.b_in_dtype is not None):
            raise ValueError(f"Case: epilogue and b_in_dtype apply to gemm only (op={self.op})")
        if self.epilogue is not None and self.epilogue not in EPILOGUES:
            raise ValueError(f"Case.epilogue={self.epilogue!r} is invalid: expected one of {EPILOGUES}")
        if self.b_in_dtype is not None and self.b_in_dtype not in INPUT_DTYPES:
            raise ValueError(f"Case.b_in_dtype={self.b_in_dtype!r} is invalid: expected one of {INPUT_DTYPES}")
        if self.op == "linear":
            if not isinstance(self.module, LinearSpec):
                raise ValueError("Case.module must be a LinearSpec for op 'linear'")
            if len(self.shape) < 3:
                raise ValueError(f"Case.shape={self.shape!r} is invalid for linear: expected (*tokens, K, N)")
            if self.config != self.module.recipe.config("input"):
                raise ValueError("Case.config of a linear case is its recipe's input config")
            if self.orientation is not None or self.layout is not None or self.b_config is not None:
                raise ValueError("Case: orientation, layout and b_config do not apply to linear")
            if self.accumulate or self.out_dtype is not None:
                raise ValueError("Case: accumulate and out_dtype do not apply to linear")
            put("bias", bool(self.bias))
            return
        if self.module is not None:
            raise ValueError(f"Case.module applies to op 'linear' only (op={self.op})")
        if self.op == "gemm":
            if self.b_in_dtype == self.in_dtype:
                put("b_in_dtype", None)  # one spelling: B's dtype is named only where it differs
            if len(self.shape) != 3:
                raise ValueError(f"Case.shape={self.shape!r} is invalid for gemm: expected (M, N, K)")
            if self.orientation not in (None, "both"):
                raise ValueError("Case.orientation does not apply to gemm (the layout picks the copies)")
            put("orientation", "both")
            put("out_dtype", self.out_dtype or "bfloat16")
            put("layout", self.layout or "TN")
            put("b_config", self.b_config or self.config)
            if self.layout not in LAYOUTS:
                raise ValueError(f"Case.layout={self.layout!r} is invalid: expected one of {LAYOUTS}")
            if not isinstance(self.b_config, QuantConfig) or self.b_config.scheme_row is not self.config.scheme_row:
                raise ValueError(f"Case.b_config must be a QuantConfig of scheme {self.config.scheme}")
        else:
            put("orientation", self.orientation or "rowwise")
            if self.orientation not in ORIENTATIONS:
                raise ValueError(f"Case.orientation={self.orientation!r} is invalid: expected one of {ORIENTATIONS}")
            if self.layout is not None or self.b_config is not None or self.accumulate or self.bias:
                raise ValueError(f"Case: layout, b_config, accumulate and bias apply to gemm only (op={self.op})")
            if self.op in QUANTIZE_OPS:
                if self.out_dtype is not None:
                    raise ValueError(f"Case.out_dtype does not apply to {self.op}")
            else:
                put("out_dtype", self.out_dtype or "float32")
        if self.out_dtype is not None and self.out_dtype not in INPUT_DTYPES:
            raise ValueError(f"Case.out_dtype={self.out_dtype!r} is invalid: expected one of {INPUT_DTYPES}")
        put("accumulate", bool(self.accumulate))
        put("bias", bool(self.bias))

    # ---- derived ------------------------------------------------------------------------------
    @functools.cached_property
    def id(self) -> str:
        """Readable id that `Case.from_id` parses back to an equal Case (see _ID_RE)."""
        dims = "x".join(str(d) for d in self.shape)
        tail = f"{self.distribution}-s{self.seed}"
        dt = DTYPE_SHORT[self.in_dtype]
        if self.op == "linear":
            return linear_id(self, tail)
        if self.op == "gemm":
            b = "" if self.b_config == self.config else f"-b-{self.b_config.id}"
            flags = ("-acc" if self.accumulate else "") + ("-bias" if self.bias else "")
            flags += f"-ep_{self.epilogue}" if self.epilogue else ""
            bdt = f"-b_{DTYPE_SHORT[self.b_in_dtype]}" if self.b_in_dtype else ""
            out = DTYPE_SHORT[self.out_dtype]
            return f"gemm-{self.layout}-{self.config.id}{b}-{dt}{bdt}-{dims}-out_{out}{flags}-{tail}"
        out = "" if self.op in QUANTIZE_OPS else f"-out_{DTYPE_SHORT[self.out_dtype]}"
        groups = "" if self.splits is None else "-g" + "_".join(str(v) for v in self.splits)
        return f"{self.op}-{self.config.id}-{self.orientation}-{dt}-{dims}{groups}{out}-{tail}"

    @property
    def work(self) -> int:
        """The case's size as the sweep weighs it: the product of its shape (elements; M*N*K for a GEMM)."""
        return math.prod(self.shape)

    @property
    def operand_shapes(self) -> dict[str, tuple[int, ...]]:
        """Logical operand shapes (docs/adapters.md §3): x for quantize; a, b (+ c [M, N], bias [N]) for gemm."""
        if self.op == "linear":
            *tokens, k, n = self.shape
            return {"x": (*tokens, k), "weight": (n, k), "dy": (*tokens, n)}
        if self.op != "gemm":
            return {"x": self.shape}
        m, n, k = self.shape
        a, b = GEMM_LAYOUTS[self.layout].operand_shapes(m, n, k)
        return {"a": a, "b": b, "c": (m, n), "bias": (n,)}

    @property
    def consumed(self) -> tuple[str, str] | None:
        """(A's, B's) consumed copy for gemm, None otherwise."""
        return GEMM_LAYOUTS[self.layout].consumes if self.op == "gemm" else None

    @property
    def features(self) -> tuple[int, int]:
        """(in_features K, out_features N) of a linear case."""
        return self.shape[-2], self.shape[-1]

    @classmethod
    def from_id(cls, case_id: str) -> "Case":
        """Parse an id made by `Case.id` (raises ValueError naming what does not parse)."""
        case = _parse_id(case_id)
        why = spec_violation(case)
        if why is not None:
            raise ValueError(f"case id {case_id!r} names a combination the spec forbids: {why}")
        return case


def _config_from_match(m: re.Match, p: str) -> QuantConfig:
    g = lambda name: m.group(p + name)  # noqa: E731
    kw: dict[str, Any] = {"element": g("element")}
    kw["tile"] = None if g("tile") is None else tuple(int(t) for t in g("tile").split("x"))
    kw["rht"] = g("rht") is not None
    kw["stochastic"] = g("sr") is not None
    if g("pow2") is not None:
        kw["pow2_scales"] = g("pow2") == "pow2"
    if g("rule") is not None:
        kw["e8m0_rule"] = g("rule")
    if g("eps") is not None:
        kw["eps"] = float(g("eps"))
    if g("variant") is not None:
        kw["variant"] = g("variant")
    if g("e4m3") is not None:
        kw["e4m3_max"] = int(g("e4m3"))
    if g("err") is not None:
        kw["err_mode"] = g("err")
    if g("hl") is not None:
        kw["amax_history_len"] = int(g("hl"))
        kw["amax_compute_algo"] = g("algo")
        kw["margin"] = int(g("margin"))
    return QuantConfig(g("scheme"), **kw)


def _cfg_re(p: str) -> str:
    alt = lambda xs: "|".join(re.escape(x) for x in xs)  # noqa: E731
    elements = [n for n in FORMATS if n != "ue8m0"]
    rules = [r for r in E8M0_RULES if r != "ceil"]
    return (
        rf"(?P<{p}scheme>{alt(SCHEME_NAMES)})-(?P<{p}element>{alt(elements)})"
        rf"(?:-(?P<{p}tile>\d+x\d+))?(?P<{p}rht>-rht)?(?P<{p}sr>-sr)?"
        rf"(?:-(?P<{p}variant>{alt(sorted(VARIANTS, key=len, reverse=True))}))?"
        rf"(?:-e(?P<{p}e4m3>{alt(str(e) for e in NVFP4_E4M3_MAXES if e != 448)}))?"
        rf"(?:-(?P<{p}err>{alt(e for e in ERR_MODES if e != 'mae')}))?"
        rf"(?:-(?P<{p}pow2>pow2|fp32scale))?(?:-(?P<{p}rule>{alt(rules)}))?"
        rf"(?:-eps(?P<{p}eps>[0-9.]+(?:e[+-]?\d+)?))?"
        rf"(?:-h(?P<{p}hl>\d+)-(?P<{p}algo>{alt(AMAX_ALGOS)})-m(?P<{p}margin>-?\d+))?"
    )


_DT_RE = "|".join(DTYPE_SHORT.values())
_TAIL_RE = rf"-(?P<dist>{'|'.join(DISTRIBUTIONS)})-s(?P<seed>\d+)"
_QUANT_ID_RE = re.compile(
    rf"(?P<op>grouped_quantize|quantize|dequantize)-{_cfg_re('a_')}-(?P<orient>{'|'.join(ORIENTATIONS)})"
    rf"-(?P<dt>{_DT_RE})-(?P<shape>\d+(?:x\d+)*)(?:-g(?P<splits>\d+(?:_\d+)*))?(?:-out_(?P<out>{_DT_RE}))?"
    rf"{_TAIL_RE}"
)
_GEMM_ID_RE = re.compile(
    rf"gemm-(?P<layout>{'|'.join(LAYOUTS)})-{_cfg_re('a_')}(?:-b-{_cfg_re('b_')})?-(?P<dt>{_DT_RE})"
    rf"(?:-b_(?P<bdt>{_DT_RE}))?-(?P<shape>\d+x\d+x\d+)-out_(?P<out>{_DT_RE})(?P<acc>-acc)?(?P<bias>-bias)?"
    rf"(?:-ep_(?P<ep>{'|'.join(EPILOGUES)}))?{_TAIL_RE}"
)
_SHORT_DTYPE = {s: d for d, s in DTYPE_SHORT.items()}


def _parse_id(case_id: str) -> Case:
    if not isinstance(case_id, str):
        raise ValueError(f"case id must be a str, got {type(case_id).__name__}")
    if case_id.startswith(("linear-", "layernorm_linear-")):
        return _parse_linear_id(case_id)
    m = _GEMM_ID_RE.fullmatch(case_id) if case_id.startswith("gemm-") else _QUANT_ID_RE.fullmatch(case_id)
    if m is None:
        raise ValueError(
            f"case id {case_id!r} does not parse: expected "
            "'<op>-<config id>-<orientation>-<dtype>-<shape>[-out_<dtype>]-<distribution>-s<seed>' or "
            "'gemm-<layout>-<config id>[-b-<config id>]-<dtype>-<MxNxK>-out_<dtype>[-acc][-bias]-<distribution>-s<seed>'"
        )
    try:
        cfg = _config_from_match(m, "a_")
        common = dict(
            config=cfg,
            shape=tuple(int(d) for d in m.group("shape").split("x")),
            in_dtype=_SHORT_DTYPE[m.group("dt")],
            distribution=m.group("dist"),
            seed=int(m.group("seed")),
        )
        if case_id.startswith("gemm-"):
            b_cfg = _config_from_match(m, "b_") if m.group("b_scheme") else cfg
            case = Case(
                "gemm",
                layout=m.group("layout"),
                b_config=b_cfg,
                out_dtype=_SHORT_DTYPE[m.group("out")],
                accumulate=m.group("acc") is not None,
                bias=m.group("bias") is not None,
                epilogue=m.group("ep"),
                b_in_dtype=None if m.group("bdt") is None else _SHORT_DTYPE[m.group("bdt")],
                **common,
            )
        else:
            out = m.group("out")
            if (m.group("op") == "dequantize") != (out is not None):
                raise ValueError("'-out_<dtype>' is required for dequantize and not allowed for quantize")
            splits = m.group("splits")
            case = Case(
                m.group("op"),
                orientation=m.group("orient"),
                out_dtype=None if out is None else _SHORT_DTYPE[out],
                splits=None if splits is None else tuple(int(v) for v in splits.split("_")),
                **common,
            )
    except ValueError as e:
        raise ValueError(f"case id {case_id!r} does not parse: {e}") from None
    if case.id != case_id:
        raise ValueError(f"case id {case_id!r} is not canonical; the canonical spelling is {case.id!r}")
    return case


def spec_violation(case: Case) -> str | None:
    """Why the spec forbids `case` ("<rule>: <reference.spec message>"), or None. QuantConfig already
    validated itself; the rules are reference.spec's, so a case is excluded exactly when the
    reference would raise SpecViolation for it."""
    if case.op == "linear":
        return linear_violation(case)
    try:
        if case.op == "grouped_quantize":
            splits_rule(case.config, case.shape, case.splits, case.in_dtype)
            return None
        if case.op != "gemm":
            quantize_rule(case.config, case.shape, case.in_dtype)
            copies_rule(case.config, rowwise=case.orientation != "colwise", colwise=case.orientation != "rowwise")
            return None
        shapes = case.operand_shapes
        lay = GEMM_LAYOUTS[case.layout]
        for name, cfg, copy, dt in (("a", case.config, lay.a, case.in_dtype),
                                    ("b", case.b_config, lay.b, case.b_in_dtype or case.in_dtype)):
            quantize_rule(cfg, shapes[name], dt, what=f"operand {name}")
            copies_rule(cfg, rowwise=copy == "rowwise", colwise=copy == "colwise")
        gemm_rule(case.config, case.b_config, case.layout)
        epilogue_rule(case.epilogue, bias=case.bias)
    except SpecViolation as e:
        return f"{e.rule}: {e}"
    ca = GEMM_LAYOUTS[case.layout].a
    if case.distribution == "exact_representable" and case.config.rht and ca == "colwise":
        return "gemm: exact_representable needs the consumed copies to quantize exactly, RHT copies do not"
    return None


def _reason_key(why: str) -> str:
    """A short category for counting exclusions ("config.tile", "shape", "rht", "gemm")."""
    m = re.match(r"QuantConfig\.(\w+)=", why)
    if m:
        return f"config.{m.group(1)}"
    return why.split(":", 1)[0]


def case_values(case: Case) -> dict[str, Any]:
    """The case's value for every grid key (normalised; B's fields for gemm, None elsewhere)."""
    cfg = case.config
    v: dict[str, Any] = {"op": case.op}
    for k in CONFIG_KEYS:
        v[k] = getattr(cfg, k)
    for k in B_OVERRIDABLE:
        v[f"b_{k}"] = getattr(case.b_config, k) if case.b_config is not None else None
    for k in ("orientation", "shape", "in_dtype", "out_dtype", "layout", "accumulate", "bias", "distribution", "seed",
              "splits", "epilogue", "b_in_dtype"):
        v[k] = getattr(case, k)
    for k in LINEAR_KEYS:
        v[k] = None
    if case.op == "linear":
        v.update(linear_values(case))
    return v


# ----------------------------------------------------------------------------------------------
# Grid value normalisation
# ----------------------------------------------------------------------------------------------


def _choice(name: str, allowed: Iterable[str]) -> Any:
    allowed = tuple(allowed)

    def norm(v: Any) -> Any:
        if not isinstance(v, str) or v not in allowed:
            hint = difflib.get_close_matches(str(v), allowed, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise _FieldError(f"{v!r} is not one of {allowed}{extra}")
        return v

    return norm


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _FieldError(f"{v!r} is not a bool (true/false)")
    return v


def _int(lo: int | None = None) -> Any:
    def norm(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _FieldError(f"{v!r} is not an int")
        if lo is not None and v < lo:
            raise _FieldError(f"{v!r} must be >= {lo}")
        return v

    return norm


def _eps(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _FieldError(f"{v!r} is not a finite float >= 0")
    return float(v)


def _element(v: Any) -> str:
    if v == _DEFAULT:
        return _DEFAULT
    return _choice("element", [n for n in FORMATS if n != "ue8m0"])(v)


def _tile(v: Any) -> Any:
    if v == _DEFAULT:
        return _DEFAULT
    if v == "none":
        return None
    if isinstance(v, str):
        m = re.fullmatch(r"(\d+)x(\d+)", v)
        if not m:
            raise _FieldError(f"{v!r} is not a tile: expected [r, c], 'RxC', 'none' or 'default'")
        return (int(m.group(1)), int(m.group(2)))
    if isinstance(v, list) and len(v) == 2 and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in v):
        return (v[0], v[1])
    raise _FieldError(f"{v!r} is not a tile: expected [r, c], 'RxC', 'none' or 'default'")


def _variant(v: Any) -> Any:
    """A QuantConfig variant (docs/numerics.md §5.10), or "none"."""
    if v == "none":
        return None
    return _choice("variant", VARIANTS)(v)


def _choice_int(name: str, allowed: tuple[int, ...]) -> Any:
    def norm(v: Any) -> int:
        if isinstance(v, bool) or v not in allowed:
            raise _FieldError(f"{v!r} is not one of {allowed}")
        return v

    return norm


def _pow2(v: Any) -> Any:
    return _DEFAULT if v == _DEFAULT else _bool(v)


def _dtype(v: Any) -> str:
    if not isinstance(v, str) or v not in _DTYPE_ALIASES:
        raise _FieldError(f"{v!r} is not a dtype: expected one of {INPUT_DTYPES} (or {sorted(set(_DTYPE_ALIASES) - set(INPUT_DTYPES))})")
    return _DTYPE_ALIASES[v]


def _shape(v: Any) -> tuple[int, ...]:
    if isinstance(v, str):
        if not re.fullmatch(r"\d+(x\d+)*", v):
            raise _FieldError(f"{v!r} is not a shape: expected [d0, d1, ...] or 'd0xd1'")
        v = [int(d) for d in v.split("x")]
    if not isinstance(v, list) or not v or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in v):
        raise _FieldError(f"{v!r} is not a shape: expected a non-empty list of positive ints")
    return tuple(v)


def _splits(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in v):
        raise _FieldError(f"{v!r} is not a list of group sizes: expected a non-empty list of ints >= 0")
    return tuple(v)


def _features(v: Any) -> tuple[int, int]:
    t = _shape(v)
    if len(t) != 2:
        raise _FieldError(f"{v!r} is not [in_features, out_features]")
    return t


_NORMALIZERS: dict[str, Any] = {
    "op": _choice("op", OPS),
    "scheme": _choice("scheme", SCHEME_NAMES),
    "element": _element,
    "tile": _tile,
    "rht": _bool,
    "stochastic": _bool,
    "pow2_scales": _pow2,
    "e8m0_rule": _choice("e8m0_rule", E8M0_RULES),
    "eps": _eps,
    "amax_history_len": _int(1),
    "amax_compute_algo": _choice("amax_compute_algo", AMAX_ALGOS),
    "margin": _int(),
    "variant": _variant,
    "e4m3_max": _choice_int("e4m3_max", NVFP4_E4M3_MAXES),
    "err_mode": _choice("err_mode", ERR_MODES),
    "b_variant": _variant,
    "b_e4m3_max": _choice_int("b_e4m3_max", NVFP4_E4M3_MAXES),
    "b_err_mode": _choice("b_err_mode", ERR_MODES),
    "b_element": _element,
    "b_tile": _tile,
    "b_rht": _bool,
    "b_stochastic": _bool,
    "b_pow2_scales": _pow2,
    "b_e8m0_rule": _choice("b_e8m0_rule", E8M0_RULES),
    "orientation": _choice("orientation", ORIENTATIONS),
    "shape": _shape,
    "in_dtype": _dtype,
    "out_dtype": _dtype,
    "layout": _choice("layout", LAYOUTS),
    "accumulate": _bool,
    "bias": _bool,
    "distribution": _choice("distribution", DISTRIBUTIONS),
    "seed": _int(0),
    "splits": _splits,
    "epilogue": _choice("epilogue", EPILOGUES),
    "b_in_dtype": _dtype,
    "module": _choice("module", LINEAR_MODULES),
    "normalization": _choice("normalization", NORMALIZATIONS),
    "zero_centered_gamma": _bool,
    "recipe": _choice("recipe", tuple(RECIPE_NAMES)),
    "fp8_format": _choice("fp8_format", ("e4m3", "hybrid", _DEFAULT)),
    "two_d": _pow2,
    "tokens": _shape,
    "features": _features,
    "in_features": _int(1),
    "out_features": _int(1),
    "steps": _int(1),
    "microbatch": _choice("microbatch", MICROBATCH_PATTERNS),
    "fuse_wgrad_accumulation": _bool,
}
_LIST_VALUED = ("shape", "tile", "b_tile", "splits", "tokens", "features")  # a flat list of ints is ONE value of these keys


def _as_list(key: str, raw: Any) -> list:
    if key in _LIST_VALUED and isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
        return [raw]
    if isinstance(raw, list):
        if not raw:
            raise _FieldError("empty list: give at least one value")
        return raw
    return [raw]


# ----------------------------------------------------------------------------------------------
# Source locations (tomllib has no line numbers)
# ----------------------------------------------------------------------------------------------


class _Locator:
    """Line numbers of `[[grid]]` headers and of `key =` lines inside them (1-based)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.headers = [i + 1 for i, ln in enumerate(self.lines) if re.match(r"\s*\[\[\s*grid\s*\]\]", ln)]
        self.sections = [i + 1 for i, ln in enumerate(self.lines) if re.match(r"\s*\[", ln)]

    def grid(self, idx: int) -> int | None:
        return self.headers[idx] if idx < len(self.headers) else None

    def key(self, idx: int | None, key: str) -> int | None:
        if idx is None:
            start, end = 1, (self.sections[0] - 1 if self.sections else len(self.lines))
        else:
            start = self.grid(idx)
            if start is None:
                return None
            later = [s for s in self.sections if s > start]
            end = later[0] - 1 if later else len(self.lines)
        rx = re.compile(rf"\s*{re.escape(key)}\s*=")
        for ln in range(start, end + 1):
            if rx.match(self.lines[ln - 1]):
                return ln
        return start if idx is not None else None


def _display(name: str) -> str:
    """A file name relative to the repository root when it lies inside it (for Case.source)."""
    try:
        return str(Path(name).resolve().relative_to(CASES_DIR.parent))
    except (ValueError, OSError):
        return name


def _err(name: str, loc: _Locator, idx: int | None, key: str | None, msg: str) -> CaseFileError:
    line = loc.key(idx, key) if key is not None else (loc.grid(idx) if idx is not None else None)
    where = f"{name}:{line}" if line else name
    table = f" [[grid]] #{idx}" if idx is not None else ""
    fld = f" field {key!r}" if key is not None else ""
    return CaseFileError(f"{where}:{table}{fld}: {msg}")


# ----------------------------------------------------------------------------------------------
# Expansion
# ----------------------------------------------------------------------------------------------


class CaseList(list):
    """The cases of a file (a list) plus how many combinations were dropped, and why.

    spec_excluded: combinations the spec forbids (silently dropped, counted; exclusion_reasons
    by category); user_excluded: matched an `exclude` entry; duplicates: equal to an earlier
    case after normalisation; full_count: valid cases before pairwise selection.
    """

    def __init__(self, items: Iterable[Case] = ()) -> None:
        super().__init__(items)
        self.spec_excluded = 0
        self.user_excluded = 0
        self.duplicates = 0
        self.full_count = 0
        self.exclusion_reasons: Counter = Counter()
        self.excluded: list[tuple[dict, str, str]] = []  # (grid combination, category, message) per spec exclusion
        self.grids: list[dict] = []

    def merge(self, other: "CaseList") -> None:
        """Append `other`'s cases (dropping ones already present) and add up its counts."""
        seen = set(self)
        for c in other:
            if c in seen:
                self.duplicates += 1
            else:
                seen.add(c)
                self.append(c)
        self.spec_excluded += other.spec_excluded
        self.user_excluded += other.user_excluded
        self.duplicates += other.duplicates
        self.full_count += other.full_count
        self.exclusion_reasons.update(other.exclusion_reasons)
        self.excluded.extend(other.excluded)
        self.grids.extend(other.grids)


def _config_kwargs(combo: Mapping[str, Any], prefix: str = "") -> dict:
    kw = {}
    for k in CONFIG_KEYS[1:]:
        v = combo.get(k, _DEFAULT)
        if prefix and k in B_OVERRIDABLE and f"b_{k}" in combo:
            v = combo[f"b_{k}"]
        if v is not _DEFAULT and v != _DEFAULT:
            kw[k] = v
    return kw


@functools.lru_cache(maxsize=4096)
def _config_cached(scheme: str, items: tuple) -> QuantConfig | str:
    try:
        return QuantConfig(scheme, **dict(items))
    except ValueError as e:
        return str(e)


def _config(scheme: str, kw: dict) -> QuantConfig:
    got = _config_cached(scheme, tuple(sorted(kw.items())))
    if isinstance(got, str):
        raise ValueError(got)
    return got


def build_case(combo: Mapping[str, Any], source: str = "") -> Case:
    """A Case from one grid combination (normalised values); ValueError when the spec forbids it."""
    op = combo.get("op", "quantize")
    if op == "linear":
        case = build_linear_case(combo, source)
        why = spec_violation(case)
        if why is not None:
            raise ValueError(why)
        return case
    cfg = _config(combo["scheme"], _config_kwargs(combo))
    kw: dict[str, Any] = dict(
        config=cfg,
        shape=combo["shape"],
        in_dtype=combo.get("in_dtype", "bfloat16"),
        distribution=combo.get("distribution", "normal"),
        seed=combo.get("seed", 0),
        source=source,
    )
    if op == "gemm":
        b_cfg = _config(combo["scheme"], _config_kwargs(combo, "b_"))
        kw.update(
            layout=combo.get("layout", "TN"),
            b_config=b_cfg,
            out_dtype=combo.get("out_dtype"),
            accumulate=combo.get("accumulate", False),
            bias=combo.get("bias", False),
            epilogue=combo.get("epilogue"),
            b_in_dtype=combo.get("b_in_dtype"),
        )
    else:
        kw.update(orientation=combo.get("orientation", "rowwise"))
        if op == "dequantize":
            kw.update(out_dtype=combo.get("out_dtype"))
        if op == "grouped_quantize":
            kw.update(splits=combo.get("splits"))
    if op == "gemm" and len(combo["shape"]) != 3:
        raise ValueError(f"shape: gemm needs [M, N, K], got {list(combo['shape'])}")
    case = Case(op, **kw)
    why = spec_violation(case)
    if why is not None:
        raise ValueError(why)
    return case


def _matches(values: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    return all(values.get(k) == v for k, v in entry.items())


def pairwise_select(cases: list[Case], seed: int = PAIRWISE_SEED) -> list[Case]:
    """A subset of `cases` containing every (key=value, key'=value') pair that occurs in `cases`.

    Greedy: take the first uncovered pair (in a fixed order), score up to _PAIRWISE_SAMPLE cases
    containing it (seeded sample) by how many uncovered pairs they add, keep the best.
    """
    if not cases:
        return []
    vals = [case_values(c) for c in cases]
    codes: dict[str, dict] = {k: {} for k in GRID_KEYS}
    rows = [[codes[k].setdefault((type(v[k]).__name__, v[k]), len(codes[k])) for k in GRID_KEYS] for v in vals]
    keys = [i for i, k in enumerate(GRID_KEYS) if len(codes[k]) > 1]
    if not keys:
        return [cases[0]]
    if len(keys) == 1:
        first: dict[int, int] = {}
        for idx, r in enumerate(rows):
            first.setdefault(r[keys[0]], idx)
        return [cases[i] for i in sorted(first.values())]
    sizes = {i: len(codes[GRID_KEYS[i]]) for i in keys}
    offsets, total = {}, 0
    for a, b in itertools.combinations(keys, 2):
        offsets[(a, b)] = total
        total += sizes[a] * sizes[b]
    case_pairs: list[frozenset[int]] = []
    by_pair: dict[int, list[int]] = {}
    for idx, r in enumerate(rows):
        ps = frozenset(off + r[a] * sizes[b] + r[b] for (a, b), off in offsets.items())
        case_pairs.append(ps)
        for pid in ps:
            by_pair.setdefault(pid, []).append(idx)
    rng = random.Random(seed)
    uncovered = set(by_pair)
    chosen: list[int] = []
    while uncovered:
        cands = by_pair[min(uncovered)]
        if len(cands) > _PAIRWISE_SAMPLE:
            cands = rng.sample(cands, _PAIRWISE_SAMPLE)
        best = max(cands, key=lambda i: (len(case_pairs[i] & uncovered), -i))
        chosen.append(best)
        uncovered -= case_pairs[best]
    return [cases[i] for i in sorted(set(chosen))]


def _expand_grid(table: Mapping, idx: int, name: str, loc: _Locator, file_cover: str, out: CaseList) -> None:
    if not isinstance(table, dict):
        raise _err(name, loc, idx, None, f"a [[grid]] entry must be a table, got {type(table).__name__}")
    lists: dict[str, list] = {}
    for key, raw in table.items():
        if key in _TABLE_EXTRA_KEYS:
            continue
        if key not in GRID_KEYS:
            hint = difflib.get_close_matches(key, GRID_KEYS + _TABLE_EXTRA_KEYS, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise _err(name, loc, idx, key, f"unknown field{extra}; known fields: {', '.join(GRID_KEYS)}")
        try:
            lists[key] = [_NORMALIZERS[key](v) for v in _as_list(key, raw)]
        except _FieldError as e:
            raise _err(name, loc, idx, key, str(e)) from None
    linear = lists.get("op") == ["linear"]
    if "linear" in lists.get("op", []) and not linear:
        raise _err(name, loc, idx, "op", "a linear grid takes op = \"linear\" alone (its keys differ)")
    if linear and "features" not in lists and not {"in_features", "out_features"} <= set(lists):
        raise _err(name, loc, idx, None, "a linear grid needs features = [K, N] or in_features and out_features")
    for req in ("recipe", "tokens") if linear else ("scheme", "shape"):
        if req not in lists:
            raise _err(name, loc, idx, None, f"missing required field {req!r}")
    cover = table.get("cover", file_cover)
    if cover not in COVERS:
        raise _err(name, loc, idx, "cover", f"{cover!r} is not one of {COVERS}")
    excludes = []
    raw_ex = table.get("exclude", [])
    if not isinstance(raw_ex, list):
        raise _err(name, loc, idx, "exclude", "expected a list of tables: exclude = [{key = value}, ...]")
    for j, entry in enumerate(raw_ex):
        if not isinstance(entry, dict) or not entry:
            raise _err(name, loc, idx, "exclude", f"entry #{j} must be a non-empty table {{key = value, ...}}")
        norm = {}
        for k, v in entry.items():
            if k not in GRID_KEYS:
                raise _err(name, loc, idx, "exclude", f"entry #{j}: unknown field {k!r}")
            try:
                norm[k] = _NORMALIZERS[k](v)
            except _FieldError as e:
                raise _err(name, loc, idx, "exclude", f"entry #{j} field {k!r}: {e}") from None
            if norm[k] == _DEFAULT:
                raise _err(name, loc, idx, "exclude", f"entry #{j} field {k!r}: 'default' cannot be matched")
        excludes.append(norm)
    source = f"{_display(name)}:{loc.grid(idx) or f'grid[{idx}]'}"
    keys = [k for k in GRID_KEYS if k in lists]
    stats = {"index": idx, "source": source, "product": 0, "spec_excluded": 0, "user_excluded": 0, "duplicates": 0}
    seen: set[Case] = set(out)
    valid: list[Case] = []
    for combo_vals in itertools.product(*(lists[k] for k in keys)):
        stats["product"] += 1
        combo = dict(zip(keys, combo_vals, strict=True))
        try:
            case = build_case(combo, source)
        except ValueError as e:
            stats["spec_excluded"] += 1
            out.exclusion_reasons[_reason_key(str(e))] += 1
            out.excluded.append((combo, _reason_key(str(e)), str(e)))
            continue
        if excludes and any(_matches(case_values(case), e) for e in excludes):
            stats["user_excluded"] += 1
            continue
        if case in seen:
            stats["duplicates"] += 1
            continue
        seen.add(case)
        valid.append(case)
    stats["valid"] = len(valid)
    picked = pairwise_select(valid) if cover == "pairwise" else valid
    stats["selected"] = len(picked)
    out.extend(picked)
    out.full_count += len(valid)
    out.spec_excluded += stats["spec_excluded"]
    out.user_excluded += stats["user_excluded"]
    out.duplicates += stats["duplicates"]
    out.grids.append(stats)


def parse_cases(text: str, name: str = "<string>", *, tier: str | None = None, _stack: tuple = ()) -> CaseList:
    """Cases from the text of a cases file (`name` is used in error messages and Case.source).

    A top-level `include = ["other.toml", ...]` (paths relative to this file) adds those files'
    cases first (their own tiers and covers apply; duplicates across files are dropped).
    """
    try:
        return _parse_cases(text, name, tier=tier, _stack=_stack)
    except RecursionError:  # tomllib recurses per nested array / inline table, the grid expansion per level
        raise CaseFileError(f"cases file {name}: nested too deeply (tables or arrays nested beyond Python's "
                            "recursion limit); grid values are flat lists of values or shapes") from None


def _parse_cases(text: str, name: str, *, tier: str | None, _stack: tuple) -> CaseList:
    loc = _Locator(text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        line = int(m.group(1)) if m else max(1, len(loc.lines))  # "at end of document": the last line
        raise CaseFileError(f"{name}:{line}: malformed TOML: {e}") from None
    for key in data:
        if key not in _FILE_KEYS:
            raise _err(name, loc, None, key, f"unknown top-level key; expected {_FILE_KEYS}")
    out = CaseList()
    includes = data.get("include", [])
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise _err(name, loc, None, "include", "expected a list of file names")
    for inc in includes:
        path = (Path(name).parent / inc).resolve()
        if path in _stack:
            raise _err(name, loc, None, "include", f"{inc!r} includes itself (cycle {[str(p) for p in _stack]})")
        if not path.exists():
            raise _err(name, loc, None, "include", f"{inc!r}: no such file ({path})")
        sub = parse_cases(path.read_text(), str(path), tier=tier, _stack=_stack + (path,))
        out.merge(sub)
    grids = data.get("grid", [])
    if not isinstance(grids, list) or (not grids and not includes):
        raise CaseFileError(f"{name}: no [[grid]] tables (a cases file needs at least one, or an include)")
    file_tier = data.get("tier", Path(name).stem)
    file_cover = data.get("cover", "full")
    if file_cover not in COVERS:
        raise _err(name, loc, None, "cover", f"{file_cover!r} is not one of {COVERS}")
    for idx, table in enumerate(grids):
        grid_tier = table.get("tier", file_tier) if isinstance(table, dict) else file_tier
        if not isinstance(grid_tier, str):
            raise _err(name, loc, idx, "tier", f"{grid_tier!r} is not a string")
        if tier is not None and grid_tier != tier:
            continue
        _expand_grid(table, idx, name, loc, file_cover, out)
    return out


def resolve(path_or_tier: str | Path) -> Path:
    """A tier name (TIERS) -> its file under cases/; anything else is a path."""
    if isinstance(path_or_tier, str) and path_or_tier in TIERS:
        return CASES_DIR / TIERS[path_or_tier]
    return Path(path_or_tier)


def load_cases(path_or_tier: str | Path, *, tier: str | None = None) -> CaseList:
    """Every case of a cases file or tier (docs/design.md §5); `tier` keeps only grids with that label."""
    path = resolve(path_or_tier)
    if not path.exists():
        raise CaseFileError(f"{path}: no such cases file (tiers: {', '.join(TIERS)})")
    return parse_cases(path.read_text(), str(path), tier=tier)
