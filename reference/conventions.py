"""The convention catalogue: other frameworks' quantization rules the golden can follow bit for bit.

Source: docs/numerics.md (§10). `te` (TransformerEngine's kernels, docs/numerics.md §0-§5) is
the default and the contract; every other row names a framework function, the schemes and tiles it
covers, and what it changes. A `QuantConfig` selects one with its `convention` field; the scheme
modules (mxfp8.py, nvfp4.py, per_tensor.py, blockwise.py) apply the rules where they differ, each
marked `# NUMERICS: §10.x`. `fixed` lists config fields the convention needs at one value (the
convention, not the field, decides that part of the rule); `defaults` are field values its framework
uses unless told otherwise. `with_convention` applies both, `applicable` lists the conventions a
case can be re-run under. This module imports nothing from the rest of `reference` (formats.py
calls `check` while validating a config).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

DEFAULT = "te"

TORCHAO = "torchao 0.18.0"
VLLM = "vLLM main (2025), SGLang and DeepSeek-V3 share the rule"


@dataclass(frozen=True)
class Convention:
    """One row: a named rule set, where it comes from, what it applies to and what it changes."""

    name: str
    framework: str  # project and version the rule was read from
    source: str  # file and function of that framework
    schemes: tuple[str, ...]  # schemes it applies to
    tiles: tuple[tuple[int, int] | None, ...] | None  # allowed tiles (None: every tile of the scheme)
    changes: str  # what differs from `te`, in one sentence
    section: str  # its sub-section of docs/numerics.md
    fixed: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def _ro(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(dict(kw))


_MX_1D = ((1, 32),)

CATALOGUE: tuple[Convention, ...] = (
    Convention(
        "te", "TransformerEngine d0067d0 (CUDA kernels)", "docs/numerics.md §0-§5 (transformer_engine/common/...)",
        ("fp8_current", "fp8_delayed", "mxfp8", "fp8_block", "nvfp4"), None,
        "nothing: the contract itself", "§10.1",
    ),
    Convention(
        "ocp_mx", "OCP MX v1.0 spec §6.3; microsoft/microxcaling", "mx/mx_ops.py _quantize_mx, _shared_exponents",
        ("mxfp8",), _MX_1D,
        "E8M0 floor exponent, and a block holding NaN or Inf becomes a NaN block (scale 0xFF, every element NaN)",
        "§10.2", fixed=_ro(e8m0_rule="floor"),
    ),
    Convention(
        "torchao_floor", TORCHAO, "torchao/prototype/mx_formats/mx_tensor.py to_mx, ScaleCalculationMode.FLOOR",
        ("mxfp8",), _MX_1D,
        "floor exponent from amax's exponent bits, NaN-propagating amax, scale clamped to >= 2^-126, "
        "x / scale, torch's NaN cast (sign kept)",
        "§10.3", fixed=_ro(e8m0_rule="ceil"),
    ),
    Convention(
        "torchao_ceil", TORCHAO, "torchao/prototype/mx_formats/mx_tensor.py to_mx, ScaleCalculationMode.CEIL",
        ("mxfp8",), _MX_1D,
        "as torchao_floor, exponent ceil(log2 amax) - emax_elem (one higher whenever amax is not a power of two)",
        "§10.3", fixed=_ro(e8m0_rule="ceil"),
    ),
    Convention(
        "torchao_even", TORCHAO, "torchao/prototype/mx_formats/mx_tensor.py to_mx, ScaleCalculationMode.EVEN",
        ("mxfp8",), _MX_1D,
        "as torchao_floor, amax first rounded to the element's mantissa width (carry into the exponent)",
        "§10.3", fixed=_ro(e8m0_rule="ceil"),
    ),
    Convention(
        "torchao_rceil", TORCHAO,
        "torchao/prototype/mx_formats/mx_tensor.py to_mx -> _to_mx_rceil (eager fallback), ScaleCalculationMode.RCEIL",
        ("mxfp8",), _MX_1D,
        "e = ceil(log2f(RN(amax / fp8_max))) (a true division and torch's fp32 log2), multiplier 1.0 for e = 0, "
        "NaN-propagating amax",
        "§10.4", fixed=_ro(e8m0_rule="ceil"),
    ),
    Convention(
        "torchao_nvfp4", TORCHAO,
        "torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize, per_tensor_amax_to_scale",
        ("nvfp4",), ((1, 16),),
        "per-tensor scale A_g/2688, block scale (A_b/6)/that clamped to [2^-6, 448], encode factor "
        "(1/pts)/s_blk, NaN-propagating amaxes, torchao's E2M1 bit cast",
        "§10.5", fixed=_ro(rht=False, stochastic=False),
    ),
    Convention(
        "torchao_float8", TORCHAO,
        "torchao/float8/float8_utils.py tensor_to_amax, amax_to_scale, to_fp8_saturated "
        "(float8_scaling_utils.hp_tensor_to_float8_dynamic, tensorwise)",
        ("fp8_current",), None,
        "s = RN32(RN64(fp8_max / max(amax, 1e-12))) in float64, NaN-propagating amax, no special cases, "
        "torch's NaN cast (sign kept)",
        "§10.6", fixed=_ro(pow2_scales=False, eps=0.0),
    ),
    Convention(
        "vllm_group", VLLM,
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py per_token_group_quant_fp8 "
        "(_per_token_group_quant_fp8, use_ue8m0=False)",
        ("fp8_block",), ((1, 128),),
        "sinv = RN(max(amax, eps) / fp8_max), q = sat(RN(x / sinv)): a true division by the decode scale",
        "§10.7", fixed=_ro(pow2_scales=False), defaults=_ro(eps=1e-10),
    ),
    Convention(
        "vllm_group_ue8m0", VLLM,
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py per_token_group_quant_fp8 "
        "(_per_token_group_quant_fp8, use_ue8m0=True)",
        ("fp8_block",), ((1, 128),),
        "as vllm_group with sinv rounded up to a power of two (2^ceil(log2 sinv))",
        "§10.7", fixed=_ro(pow2_scales=True), defaults=_ro(eps=1e-10),
    ),
)

CONVENTIONS: dict[str, Convention] = {c.name: c for c in CATALOGUE}
NAMES: tuple[str, ...] = tuple(CONVENTIONS)


def get(name: str) -> Convention:
    """The catalogue row `name` (ValueError naming the known ones otherwise)."""
    try:
        return CONVENTIONS[name]
    except KeyError:
        raise ValueError(f"convention {name!r} is unknown: expected one of {', '.join(NAMES)}") from None


def problem(config: Any) -> str | None:
    """Why `config` (a QuantConfig) cannot follow its convention, or None if it can."""
    name = config.convention
    if not isinstance(name, str) or name not in CONVENTIONS:
        return f"expected one of {', '.join(NAMES)}"
    conv = CONVENTIONS[name]
    if config.scheme not in conv.schemes:
        return f"{name} applies to {', '.join(conv.schemes)}, not {config.scheme} ({conv.section})"
    if conv.tiles is not None and config.tile not in conv.tiles:
        return f"{name} applies to tiles {conv.tiles}, not {config.tile} ({conv.section})"
    for k, v in conv.fixed.items():
        if getattr(config, k) != v:
            return f"{name} needs {k}={v!r} (its own rule replaces that field), got {getattr(config, k)!r}"
    return None


def check(config: Any) -> None:
    """Raise ValueError if `config` cannot follow its convention (called by QuantConfig validation)."""
    why = problem(config)
    if why is not None:
        raise ValueError(f"QuantConfig.convention={config.convention!r} is invalid: {why}")


def with_convention(config: Any, name: str) -> Any:
    """`config` under convention `name`, with the fields the convention fixes (and its defaults) applied.

    `te` returns the config with every convention-fixed field of its former convention left as is.
    Raises ValueError if the scheme or tile does not fit (see `applicable`).
    """
    conv = get(name)
    unset = {f.name: f.default for f in dataclasses.fields(config)}
    # A framework default fills a field only where the config left the field at its own default.
    kw = {k: v for k, v in conv.defaults.items() if getattr(config, k) == unset[k]}
    return dataclasses.replace(config, convention=name, **{**kw, **conv.fixed})


def applicable(config: Any) -> list[str]:
    """Conventions other than `te` and the config's own that the golden can be re-run under for this case."""
    out = []
    for conv in CATALOGUE:
        if conv.name in (DEFAULT, config.convention):
            continue
        try:
            with_convention(config, conv.name)
        except ValueError:
            continue
        out.append(conv.name)
    return out
