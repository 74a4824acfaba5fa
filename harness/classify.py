"""Causes of a mismatch beyond the located first one: input patterns, cause classes, examples, layout.

Source: docs/design.md §5 (every mismatch located and classified) and reports/README.md (the
`mismatch_examples` column). `harness.compare` decides each mismatching element's class; this module
holds what those decisions read:

- the input pattern of an element's block: non-finite or subnormal values in it, whether the
  element's scale entry differs from the golden's, whether the scaled value lies near a rounding
  midpoint (`pattern`);
- the cause tests that name what `other` used to hide: encode/decode-factor rounding, scale floor /
  eps clamp, subnormal flush, non-finite policy, scale rounding rule (`near_midpoint`,
  `scale_rule_matches`);
- up to N examples per (class, pattern) (`examples`);
- the layout the candidate used, when it is not the golden's (`layout_finding`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from reference import conventions
from reference.formats import QuantConfig

EXAMPLES_PER_PATTERN = 3
NEAR_MIDPOINT_ULPS = 4  # fp32 ulps of the scaled value: "within a few ulps of a midpoint"
_TINY = {"float32": torch.finfo(torch.float32).tiny, "bfloat16": torch.finfo(torch.bfloat16).tiny,
         "float16": torch.finfo(torch.float16).tiny}


# ----------------------------------------------------------------------------------------------
# Input patterns
# ----------------------------------------------------------------------------------------------


def block_flags(src: torch.Tensor, br: int, bc: int, hp_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(non-finite, subnormal) per br x bc block of `src` [rows, cols]: does the block hold a NaN/Inf,
    does it hold a non-zero value below the input dtype's smallest normal (fp32's for an fp32 source)?"""
    rows, cols = src.shape
    br, bc = max(1, min(br, rows)), max(1, min(bc, cols))
    pr, pc = -(-rows // br) * br, -(-cols // bc) * bc
    p = torch.zeros(pr, pc, dtype=torch.float32)
    p[:rows, :cols] = src
    tiny = max(_TINY.get(hp_dtype, _TINY["float32"]), _TINY["float32"])
    a = p.abs()
    nonfinite = ~torch.isfinite(p)
    sub = (a > 0) & (a < tiny)
    shape = (pr // br, br, pc // bc, bc)
    return nonfinite.reshape(shape).any(dim=3).any(dim=1), sub.reshape(shape).any(dim=3).any(dim=1)


_BLOCKS = ("finite_block", "subnormal_block", "nonfinite_block")


def pattern(nonfinite: torch.Tensor, subnormal: torch.Tensor, scale_differs: torch.Tensor | None,
            near_mid: torch.Tensor | None) -> tuple[torch.Tensor, list[str]]:
    """(pattern index per element, pattern names): `<block>/<scale>[/<midpoint>]`.

    block: `nonfinite_block` (a NaN or Inf in the block), `subnormal_block` (a subnormal input),
    `finite_block`; scale: `same_scale` / `diff_scale` (the element's scale entry, or a global
    scale it depends on, against the golden's); midpoint: `near_midpoint` / `off_midpoint`.
    """
    blk = torch.where(nonfinite, 2, torch.where(subnormal, 1, 0)).to(torch.int64)
    names = list(_BLOCKS)
    idx = blk
    if scale_differs is not None:
        idx = idx * 2 + scale_differs.to(torch.int64)
        names = [f"{b}/{s}" for b in names for s in ("same_scale", "diff_scale")]
    if near_mid is not None:
        idx = idx * 2 + near_mid.to(torch.int64)
        names = [f"{b}/{m}" for b in names for m in ("off_midpoint", "near_midpoint")]
    return idx, names


def near_midpoint(y: torch.Tensor, g_val: torch.Tensor, c_val: torch.Tensor) -> torch.Tensor:
    """The scaled value y lies within NEAR_MIDPOINT_ULPS fp32 ulps of the midpoint of the golden's and
    the candidate's values (fp64, exact for these formats).

    NUMERICS: §0.5 - RN picks the nearer grid value, so two codes on either side of y differ by an
    encode-factor rounding when y is this close to their midpoint (a different multiplier order
    moves y by an ulp or two); an exact midpoint is a tie (`tie_flip`).
    """
    y64 = y.to(torch.float64)
    mid = (g_val.to(torch.float64) + c_val.to(torch.float64)) / 2
    yf = y.to(torch.float32)
    ulp = (torch.nextafter(yf.abs(), torch.full_like(yf, float("inf"))) - yf.abs()).to(torch.float64)
    ok = torch.isfinite(y64) & torch.isfinite(mid)
    return ok & ((y64 - mid).abs() <= NEAR_MIDPOINT_ULPS * ulp)


# ----------------------------------------------------------------------------------------------
# Scale rounding rules
# ----------------------------------------------------------------------------------------------


def alternative_rules(cfg: QuantConfig) -> list[tuple[str, QuantConfig]]:
    """The other scale rules a candidate may have followed: the other E8M0 rule (ceil/floor) and
    every applicable convention of docs/numerics.md §10 (torchao floor/ceil/even/rceil, fmax/amax
    true division of vllm_group and torchao_float8, ...)."""
    out: list[tuple[str, QuantConfig]] = []
    if cfg.scheme_row.scale_scalar_format is not None and cfg.scheme == "mxfp8":
        other = "floor" if cfg.e8m0_rule == "ceil" else "ceil"
        try:
            out.append((f"e8m0_rule={other}", QuantConfig(**{**cfg.to_dict(), "e8m0_rule": other})))
        except (TypeError, ValueError):
            pass
    for name in conventions.applicable(cfg):
        try:
            out.append((f"convention={name}", conventions.with_convention(cfg, name)))
        except ValueError:
            continue
    return out


def rule_scales(x: torch.Tensor, hp_shape: tuple, cfg: QuantConfig, orientation: str) -> list[tuple[str, torch.Tensor]]:
    """(rule name, the scale tensor of `orientation` the golden writes under that rule), CPU."""
    import reference  # noqa: PLC0415 - the golden, only when a scale differs

    out = []
    for name, alt in alternative_rules(cfg):
        try:
            q = reference.quantize(x.reshape(hp_shape), alt, rowwise=orientation == "rowwise",
                                   colwise=orientation == "colwise")
        except Exception:  # noqa: BLE001 - diagnostics only: a rule that cannot run on this input
            continue
        s = getattr(q, f"{orientation}_scale")
        if s is not None:
            out.append((name, s.to("cpu")))
    return out


def scale_rule_matches(cand: torch.Tensor, gold: torch.Tensor, rules: list[tuple[str, torch.Tensor]],
                       as_bits: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, list[str]]:
    """Per entry of the valid region: does the candidate equal some other rule's scale where the
    golden's differs, and the first such rule's name ('' where none)."""
    match = torch.zeros(gold.shape, dtype=torch.bool)
    names = [""] * gold.numel()
    cb = as_bits(cand)
    for name, s in rules:
        if s.dim() != gold.dim() or any(a < b for a, b in zip(s.shape, gold.shape, strict=False)):
            continue
        sl = tuple(slice(0, v) for v in gold.shape)
        hit = (as_bits(s[sl].to(cand.dtype)) == cb) & ~match
        for i in hit.reshape(-1).nonzero().reshape(-1).tolist():
            names[i] = name
        match |= hit
    return match, names


# ----------------------------------------------------------------------------------------------
# Examples
# ----------------------------------------------------------------------------------------------


def examples(cls: torch.Tensor, class_names: tuple[str, ...] | list[str], pat: torch.Tensor,
             pattern_names: list[str], make: Callable[[int], dict], per_pattern: int = EXAMPLES_PER_PATTERN) -> dict:
    """{class: {"count", "patterns": {pattern: {"count", "examples": [up to per_pattern]}}}} of the
    mismatches (class index `cls`, pattern index `pat`, one per mismatch in row-major order);
    `make(i)` builds the i-th mismatch's example. Classes in `class_names` order."""
    out: dict[str, Any] = {}
    if cls.numel() == 0:
        return out
    npat = len(pattern_names)
    key = cls.to(torch.int64) * npat + pat.to(torch.int64)
    counts = torch.bincount(key, minlength=len(class_names) * npat).reshape(len(class_names), npat)
    for ci, cname in enumerate(class_names):
        total = int(counts[ci].sum())
        if not total:
            continue
        pats = {}
        for pi, pname in enumerate(pattern_names):
            k = int(counts[ci, pi])
            if k:
                first = (key == ci * npat + pi).nonzero().reshape(-1)[:per_pattern].tolist()
                pats[pname] = {"count": k, "examples": [make(i) for i in first]}
        out[cname] = {"count": total, "patterns": pats}
    return out


def whole(cls: str, n: int, pat: str, example: dict) -> dict:
    """The examples of a tensor whose every element has one cause (a layout, a missing field)."""
    return {cls: {"count": n, "patterns": {pat: {"count": n, "examples": [example]}}}}


# ----------------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------------


def nibbles_swapped(gold_bytes: torch.Tensor, cand_bytes: torch.Tensor) -> bool:
    """The candidate's FP4 bytes are the golden's with the two nibbles exchanged (NUMERICS: §5.4 the
    even element goes in the low nibble)."""
    if gold_bytes.shape != cand_bytes.shape or torch.equal(gold_bytes, cand_bytes):
        return False
    g = gold_bytes.to(torch.int32)
    return torch.equal(((g & 0x0F) << 4) | (g >> 4), cand_bytes.to(torch.int32))


def layout_finding(results: Any) -> str | None:
    """What layout the candidate used where it is not the golden's, e.g. "rowwise_scale: scales are the
    golden's transposed"; None when no tensor of `results` (one TensorResult or several) shows one."""
    items: Iterable = results if isinstance(results, (list, tuple)) else [results]
    found = [f"{r.tensor}: {r.layout}" for r in items if getattr(r, "layout", None)]
    return "; ".join(found) if found else None


def class_counts(results: Any) -> dict[str, dict[str, int]]:
    """{tensor: {class: count}} of one TensorResult or several (only failing tensors)."""
    items: Iterable = results if isinstance(results, (list, tuple)) else [results]
    return {r.tensor: dict(r.mismatch_classes) for r in items if r.mismatch_classes}


# ----------------------------------------------------------------------------------------------
# Examples as text (repro output, pytest failure messages)
# ----------------------------------------------------------------------------------------------

EXAMPLES_SHOWN = 3  # examples per class in `python -m harness repro` and a pytest failure message


def _value_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.9g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value_text(u) for u in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value_text(u)}" for k, u in v.items()) + "}"
    return str(v)


def format_examples(examples: Any, n: int = EXAMPLES_SHOWN, indent: str = "") -> list[str]:
    """The `mismatch_examples` of a row (its dict, or its JSON text in a report) as lines: per class its
    count (and, for a cause, its explanation), then its first `n` examples (taken from its input patterns in
    turn), each `[pattern] key=value ...`."""
    import json  # noqa: PLC0415

    if isinstance(examples, str):
        try:
            examples = json.loads(examples) if examples.strip() else {}
        except ValueError:
            return []
    if not isinstance(examples, dict):
        return []
    lines = []
    for cls, entry in examples.items():
        if not isinstance(entry, dict):
            continue
        patterns = entry.get("patterns") or {}
        cause = entry.get("cause")
        why = ""
        if entry.get("explanation"):  # a cause of harness.causes (docs/numerics.md §13)
            why = f" - {'cause ' + cause + ': ' if cause and cause != cls else ''}{entry['explanation']}"
        lines.append(f"{indent}{cls}: {entry.get('count', '?')} element(s)"
                     + (f" in {len(patterns)} input pattern(s)" if len(patterns) > 1 else "") + why)
        # Round-robin over the patterns: each pattern's first example before any pattern's second.
        queue = [(pat, list((p or {}).get("examples", []))) for pat, p in patterns.items()]
        shown = []
        while len(shown) < n and any(exs for _, exs in queue):
            for pat, exs in queue:
                if exs and len(shown) < n:
                    shown.append((pat, exs.pop(0)))
        for pat, ex in shown:
            fields = " ".join(f"{k}={_value_text(v)}" for k, v in ex.items()) if isinstance(ex, dict) else str(ex)
            lines.append(f"{indent}  [{pat}] {fields}")
    return lines
