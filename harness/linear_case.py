"""The `linear` op's case model: a Linear / LayerNormLinear training case, its recipe and its readable id.

Source: docs/numerics.md §9 (the module step), reference/recipes.py (the recipes and their toggles), TE
tests/pytorch/nvfp4/test_nvfp4_module_exact.py (the matrix: features, dtype, steps, RHT, 2-D, the
`is_first_microbatch=(step == 0)` weight cache). `harness.cases` builds `Case(op="linear", module=LinearSpec)`
from a grid; the keys are in cases/README.md.

A linear case id reads
  <module>[-<normalization>][-zcg]-<recipe id>-<dtype>-t<tokens>-k<K>-n<N>[-bias][-fuse]-st<steps>-mb_<pattern>
  -<distribution>-s<seed>
with the recipe id its short name plus its non-default toggles (`recipe_id`), e.g.
`layernorm_linear-RMSNorm-nvfp4-nrht-bf16-t2x64-k128-n256-st1-mb_cache-normal-s0`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from reference.recipes import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    _Recipe,
)
from reference.spec import gemm_rule, quantize_rule
from reference.types import SpecViolation

LINEAR_MODULES = ("linear", "layernorm_linear")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
# Per step: `none` is_first_microbatch=None (quantize W every step); `cache` True at step 0, then False (TE's
# module test); `cache_update` as `cache`, and the high-precision W changes before every later step (an
# optimizer update the cached quantized W must ignore, docs/numerics.md §9.4).
MICROBATCH_PATTERNS = ("none", "cache", "cache_update")
RECIPE_NAMES: dict[str, type] = {
    "delayed": DelayedScaling,
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
    "block": Float8BlockScaling,
    "nvfp4": NVFP4BlockScaling,
}
_NAME_OF = {cls: name for name, cls in RECIPE_NAMES.items()}
_DEFAULT = "default"
_DELAYED_HISTORY = DelayedScaling().amax_history_len


@dataclass(frozen=True)
class LinearSpec:
    """What a linear case fixes besides shapes, dtype and seed (docs/numerics.md §9)."""

    module: str
    recipe: _Recipe
    normalization: str | None = None
    zero_centered_gamma: bool = False
    steps: int = 1
    microbatch: str = "cache"
    fuse_wgrad_accumulation: bool = False

    def __post_init__(self) -> None:
        if self.module not in LINEAR_MODULES:
            raise ValueError(f"module={self.module!r} is invalid: expected one of {LINEAR_MODULES}")
        if type(self.recipe) not in _NAME_OF:
            raise ValueError(f"recipe={self.recipe!r} is invalid: expected one of reference.recipes")
        if (self.module == "layernorm_linear") != (self.normalization in NORMALIZATIONS):
            raise ValueError(f"normalization={self.normalization!r}: layernorm_linear takes one of {NORMALIZATIONS}, "
                             "linear none")
        if self.zero_centered_gamma and self.module != "layernorm_linear":
            raise ValueError("zero_centered_gamma applies to layernorm_linear only")
        if self.steps < 1:
            raise ValueError(f"steps={self.steps!r} is invalid: expected >= 1")
        if self.microbatch not in MICROBATCH_PATTERNS:
            raise ValueError(f"microbatch={self.microbatch!r} is invalid: expected one of {MICROBATCH_PATTERNS}")

    def is_first_microbatch(self, step: int) -> bool | None:
        """TE's forward argument at `step` (docs/numerics.md §9.4)."""
        return None if self.microbatch == "none" else step == 0


# ----------------------------------------------------------------------------------------------
# Recipes from toggles, and their ids
# ----------------------------------------------------------------------------------------------


def _off(v: Any) -> bool:
    return v is None or v is False or v == _DEFAULT


def make_recipe(name: str, toggles: Mapping[str, Any]) -> _Recipe:
    """The recipe `name` with the grid toggles (fp8_format, rht, stochastic, two_d, pow2_scales,
    amax_history_len); ValueError for a toggle the recipe does not have (set to anything but off)."""
    t = {k: v for k, v in toggles.items() if v is not None and v != _DEFAULT}
    used: set[str] = set()

    def take(key: str, default: Any) -> Any:
        used.add(key)
        return t.get(key, default)

    fmt_default = "hybrid" if name in ("delayed", "current") else "e4m3"
    if name == "delayed":
        r = DelayedScaling(fp8_format=take("fp8_format", fmt_default),
                           amax_history_len=take("amax_history_len", _DELAYED_HISTORY))
    elif name == "current":
        r = Float8CurrentScaling(fp8_format=take("fp8_format", fmt_default),
                                 use_power_2_scales=take("pow2_scales", False))
    elif name == "mxfp8":
        r = MXFP8BlockScaling(fp8_format=take("fp8_format", fmt_default), enable_2d_quantization=take("two_d", False))
    elif name == "block":
        r = Float8BlockScaling(fp8_format=take("fp8_format", fmt_default), use_f32_scales=not take("pow2_scales", True),
                               w_block_scaling_dim=2 if take("two_d", True) else 1)
    elif name == "nvfp4":
        r = NVFP4BlockScaling(disable_rht=not take("rht", True), disable_stochastic_rounding=not take("stochastic", True),
                              disable_2d_quantization=not take("two_d", True))
    else:
        raise ValueError(f"recipe={name!r} is invalid: expected one of {tuple(RECIPE_NAMES)}")
    for k, v in toggles.items():
        if k not in used and not _off(v):
            raise ValueError(f"recipe: {k}={v!r} does not apply to recipe {name!r}")
    return r


def recipe_id(r: _Recipe) -> str:
    """Short name plus the non-default toggles (see the module docstring)."""
    name = _NAME_OF[type(r)]
    parts = [name]
    if isinstance(r, DelayedScaling):
        parts += ["e4m3"] if r.fp8_format == "e4m3" else []
        parts += [f"h{r.amax_history_len}"] if r.amax_history_len != _DELAYED_HISTORY else []
    elif isinstance(r, Float8CurrentScaling):
        parts += (["e4m3"] if r.fp8_format == "e4m3" else []) + (["pow2"] if r.use_power_2_scales else [])
    elif isinstance(r, MXFP8BlockScaling):
        parts += (["hybrid"] if r.fp8_format == "hybrid" else []) + (["2d"] if r.enable_2d_quantization else [])
    elif isinstance(r, Float8BlockScaling):
        parts += ["hybrid"] if r.fp8_format == "hybrid" else []
        parts += ["f32scales"] if r.use_f32_scales else []
        parts += ["w1d"] if r.w_block_scaling_dim == 1 else []
    else:
        parts += (["nrht"] if r.disable_rht else []) + (["nsr"] if r.disable_stochastic_rounding else [])
        parts += ["n2d"] if r.disable_2d_quantization else []
    return "-".join(parts)


def parse_recipe_id(text: str) -> _Recipe:
    """The recipe of `recipe_id(r) == text` (ValueError when it does not parse)."""
    name, *opts = text.split("-")
    toggles: dict[str, Any] = {}
    for o in opts:
        if o in ("e4m3", "hybrid"):
            toggles["fp8_format"] = o
        elif re.fullmatch(r"h\d+", o):
            toggles["amax_history_len"] = int(o[1:])
        elif o == "pow2":
            toggles["pow2_scales"] = True
        elif o == "f32scales":
            toggles["pow2_scales"] = False
        elif o == "2d":
            toggles["two_d"] = True
        elif o in ("w1d", "n2d"):
            toggles["two_d"] = False
        elif o == "nrht":
            toggles["rht"] = False
        elif o == "nsr":
            toggles["stochastic"] = False
        else:
            raise ValueError(f"recipe id {text!r}: unknown option {o!r}")
    r = make_recipe(name, toggles)
    if recipe_id(r) != text:
        raise ValueError(f"recipe id {text!r} is not canonical; the canonical spelling is {recipe_id(r)!r}")
    return r


def recipe_toggles(r: _Recipe) -> dict[str, Any]:
    """The grid toggle values of a recipe (None where the recipe has no such toggle)."""
    v: dict[str, Any] = dict.fromkeys(("fp8_format", "rht", "stochastic", "two_d", "pow2_scales", "amax_history_len"))
    if isinstance(r, (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling)):
        v["fp8_format"] = r.fp8_format
    if isinstance(r, DelayedScaling):
        v["amax_history_len"] = r.amax_history_len
    elif isinstance(r, Float8CurrentScaling):
        v["pow2_scales"] = r.use_power_2_scales
    elif isinstance(r, MXFP8BlockScaling):
        v["two_d"] = r.enable_2d_quantization
    elif isinstance(r, Float8BlockScaling):
        v["pow2_scales"], v["two_d"] = not r.use_f32_scales, r.w_block_scaling_dim == 2
    else:
        v["rht"], v["stochastic"] = not r.disable_rht, not r.disable_stochastic_rounding
        v["two_d"] = not r.disable_2d_quantization
    return v


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------

_NOT_LINEAR = ("scheme", "element", "tile", "e8m0_rule", "eps", "amax_compute_algo", "margin", "orientation", "shape",
               "out_dtype", "layout", "accumulate")


def build_linear_case(combo: Mapping[str, Any], source: str = ""):
    """A linear Case from one grid combination (normalised values); ValueError for a bad combination."""
    from .cases import Case  # noqa: PLC0415 - harness.cases imports this module

    bad = [k for k in combo if k in _NOT_LINEAR or k.startswith("b_")]
    if bad:
        raise ValueError(f"linear: keys {bad} do not apply to op 'linear'")
    recipe = make_recipe(combo["recipe"], {k: combo.get(k) for k in
                                           ("fp8_format", "rht", "stochastic", "two_d", "pow2_scales",
                                            "amax_history_len")})
    module = combo.get("module", "linear")
    ln = module == "layernorm_linear"
    spec = LinearSpec(
        module=module,
        recipe=recipe,
        normalization=combo.get("normalization", "LayerNorm") if ln else None,
        zero_centered_gamma=bool(combo.get("zero_centered_gamma", False)) and ln,
        steps=combo.get("steps", 1),
        microbatch=combo.get("microbatch", "cache"),
        fuse_wgrad_accumulation=combo.get("fuse_wgrad_accumulation", False),
    )
    if "features" in combo and ("in_features" in combo or "out_features" in combo):
        raise ValueError("linear: give features = [K, N] or in_features / out_features, not both")
    k, n = combo["features"] if "features" in combo else (combo["in_features"], combo["out_features"])
    return Case(
        "linear",
        config=recipe.config("input"),
        shape=(*combo["tokens"], k, n),
        in_dtype=combo.get("in_dtype", "bfloat16"),
        distribution=combo.get("distribution", "normal"),
        seed=combo.get("seed", 0),
        bias=combo.get("bias", False),
        module=spec,
        source=source,
    )


def linear_id(case, tail: str) -> str:
    from .cases import DTYPE_SHORT  # noqa: PLC0415

    s = case.module
    *tokens, k, n = case.shape
    head = s.module + (f"-{s.normalization}" if s.normalization else "") + ("-zcg" if s.zero_centered_gamma else "")
    flags = ("-bias" if case.bias else "") + ("-fuse" if s.fuse_wgrad_accumulation else "")
    toks = "x".join(str(t) for t in tokens)
    return (f"{head}-{recipe_id(s.recipe)}-{DTYPE_SHORT[case.in_dtype]}-t{toks}-k{k}-n{n}{flags}"
            f"-st{s.steps}-mb_{s.microbatch}-{tail}")


def _linear_re():
    from .cases import DISTRIBUTIONS, DTYPE_SHORT  # noqa: PLC0415

    names = "|".join(RECIPE_NAMES)
    return re.compile(
        rf"(?P<module>{'|'.join(LINEAR_MODULES)})(?:-(?P<norm>{'|'.join(NORMALIZATIONS)}))?(?P<zcg>-zcg)?"
        rf"-(?P<recipe>(?:{names})(?:-(?:e4m3|hybrid|h\d+|pow2|f32scales|2d|w1d|n2d|nrht|nsr))*)"
        rf"-(?P<dt>{'|'.join(DTYPE_SHORT.values())})-t(?P<tokens>\d+(?:x\d+)*)-k(?P<k>\d+)-n(?P<n>\d+)"
        rf"(?P<bias>-bias)?(?P<fuse>-fuse)?-st(?P<steps>\d+)-mb_(?P<mb>{'|'.join(MICROBATCH_PATTERNS)})"
        rf"-(?P<dist>{'|'.join(DISTRIBUTIONS)})-s(?P<seed>\d+)"
    )


def parse_linear_id(case_id: str):
    """The linear Case of `case_id` (ValueError naming what does not parse)."""
    from .cases import DTYPE_SHORT, Case  # noqa: PLC0415

    m = _linear_re().fullmatch(case_id)
    if m is None:
        raise ValueError(
            f"case id {case_id!r} does not parse: expected '<module>[-<norm>][-zcg]-<recipe>-<dtype>-t<tokens>-k<K>"
            "-n<N>[-bias][-fuse]-st<steps>-mb_<pattern>-<distribution>-s<seed>'"
        )
    try:
        recipe = parse_recipe_id(m.group("recipe"))
        spec = LinearSpec(m.group("module"), recipe, m.group("norm"), m.group("zcg") is not None, int(m.group("steps")),
                          m.group("mb"), m.group("fuse") is not None)
        short = {v: k for k, v in DTYPE_SHORT.items()}
        case = Case("linear", config=recipe.config("input"),
                    shape=(*(int(t) for t in m.group("tokens").split("x")), int(m.group("k")), int(m.group("n"))),
                    in_dtype=short[m.group("dt")], distribution=m.group("dist"), seed=int(m.group("seed")),
                    bias=m.group("bias") is not None, module=spec)
    except ValueError as e:
        raise ValueError(f"case id {case_id!r} does not parse: {e}") from None
    if case.id != case_id:
        raise ValueError(f"case id {case_id!r} is not canonical; the canonical spelling is {case.id!r}")
    return case


def linear_violation(case) -> str | None:
    """Why the spec forbids a linear case, or None: every role's quantization of its tensor and the
    three GEMMs' operand rules (reference.spec), and TE's input draw (distribution normal)."""
    if case.distribution != "normal":
        return f"linear: inputs are drawn as TE's module test draws them (distribution normal), not {case.distribution}"
    *tokens, k, n = case.shape
    m = math.prod(tokens)
    r = case.module.recipe
    cfg = r.configs()
    try:
        for role, shape in (("input", (m, k)), ("weight", (n, k)), ("grad_output", (m, n))):
            quantize_rule(cfg[role], shape, case.in_dtype, what=role)
        for gemm, (a, b) in (("fprop", ("input", "weight")), ("dgrad", ("grad_output", "weight")),
                             ("wgrad", ("grad_output", "input"))):
            layout = {"fprop": "TN", "dgrad": "NN", "wgrad": "NT"}[gemm]
            gemm_rule(cfg[a], cfg[b], layout)
    except SpecViolation as e:
        return f"{e.rule}: {e}"
    return None


def linear_values(case) -> dict[str, Any]:
    """The grid keys' values of a linear case (for `exclude` entries and pairwise cover)."""
    s = case.module
    *tokens, k, n = case.shape
    v = recipe_toggles(s.recipe)
    v.update(module=s.module, normalization=s.normalization, zero_centered_gamma=s.zero_centered_gamma,
             recipe=_NAME_OF[type(s.recipe)], tokens=tuple(tokens), features=(k, n), in_features=k, out_features=n, steps=s.steps,
             microbatch=s.microbatch, fuse_wgrad_accumulation=s.fuse_wgrad_accumulation)
    return v
