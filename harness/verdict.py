"""Verdicts: one severity per (case, backend), its accuracy against the golden's, the convention it follows.

Source: docs/numerics.md §11 (the severities, their rules and the bound), §10 (the convention catalogue
`reference.conventions`, re-run when a quantizer is not exact). The harness.ops compare functions
gather the `Evidence` of one candidate; `judge` turns it into the `severity`, `delta_sqnr_db` and
`matches_convention` columns of every row of the pair.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

import reference
from reference import casts, conventions
from reference.types import QuantizedTensor

from . import causes

# Best first (docs/numerics.md §11).
SEVERITIES = ("exact", "convention", "equivalent", "degraded", "broken")
# NUMERICS: §11 - `equivalent` needs the candidate's SQNR against the truth at most this far below the golden's.
EQUIVALENT_DB = 0.01
# ULP buckets (harness.compare.ULP_BUCKETS) that are "within one code step" of the golden.
ONE_STEP_BUCKETS = ("0", "0*", "1")


@dataclass
class Evidence:
    """What the comparison of one candidate found, beyond the rows (filled by harness.ops)."""

    broken: list[str] = field(default_factory=list)  # why the candidate is broken (non-finite, layout, ...)
    within_step: bool = True  # every finite golden value is matched within one code step
    identical: bool = True  # every compared value has the golden's bits
    matches_convention: str = ""
    ignored: list[str] = field(default_factory=list)  # `field=value` of the case the matching convention replaced
    preferred: tuple[str, ...] = ()  # the candidate's declared conventions (declared_conventions), tried first


def delta_db(candidate: float | None, golden: float | None) -> float | None:
    """candidate SQNR − golden SQNR (dB), both against the truth; 0 when equal (both +inf included)."""
    if candidate is None or golden is None:
        return None
    if candidate == golden or (math.isnan(candidate) and math.isnan(golden)):
        return 0.0
    if math.isnan(candidate) or math.isnan(golden):
        return None
    return candidate - golden


# ----------------------------------------------------------------------------------------------
# One code step (quantizers)
# ----------------------------------------------------------------------------------------------


def _codes(q: QuantizedTensor, o: str) -> torch.Tensor:
    t = getattr(q, f"{o}_data").to("cpu")
    return casts.unpack_nibbles(t) if q.config.element_format.bits == 4 else t


def _with_codes(q: QuantizedTensor, o: str, codes: torch.Tensor) -> QuantizedTensor:
    data = casts.pack_nibbles(codes.to(torch.uint8)) if q.config.element_format.bits == 4 else codes.to(torch.uint8)
    return dataclasses.replace(q, **{f"{o}_data": data.to(getattr(q, f"{o}_data").device)})


def code_step(q: QuantizedTensor, o: str) -> torch.Tensor:
    """Per element of copy `o`: the larger distance from its dequantized value to those of its two
    neighbouring codes (same sign, magnitude ±1, clamped to [0, max finite code]), in fp64 [M, K]."""
    fmt = q.config.element_format
    c = _codes(q, o).to(torch.int64)
    sign = c & fmt.sign_mask
    mag = c & ~fmt.sign_mask if fmt.signed else c
    up = torch.clamp(mag + 1, max=fmt.max_code) | sign
    down = torch.clamp(mag - 1, min=0) | sign
    d0 = reference.dequantize(q, o, torch.float32).to(torch.float64).cpu()
    du = reference.dequantize(_with_codes(q, o, up), o, torch.float32).to(torch.float64).cpu()
    dd = reference.dequantize(_with_codes(q, o, down), o, torch.float32).to(torch.float64).cpu()
    return torch.maximum((du - d0).abs(), (d0 - dd).abs())


def within_one_step(golden: torch.Tensor, candidate: torch.Tensor, step: torch.Tensor) -> bool:
    """|candidate − golden| <= step wherever the golden is finite (non-finite candidates there fail).
    Computed on the golden's device (a GPU sweep moves no tensor to the host)."""
    dev = golden.device
    g = golden.detach().to(torch.float64).reshape(-1)
    c = candidate.detach().to(dev, torch.float64).reshape(-1)
    s = step.detach().to(dev, torch.float64).reshape(-1)
    fin = torch.isfinite(g)
    ok = torch.isfinite(c) & ((c - g).abs() <= s)
    return bool((ok | ~fin).all())


def nonfinite_where_finite(golden: torch.Tensor, candidate: torch.Tensor) -> int:
    """How many positions are non-finite in `candidate` and finite in `golden` (on the golden's device)."""
    g = golden.detach()
    c = candidate.detach().to(g.device)
    return int((torch.isfinite(g) & ~torch.isfinite(c)).sum())


def ulps_within_step(ulp_hist: Mapping | None) -> bool:
    """A conformance row's ULP histogram holds only distances of at most one unit."""
    return not any(v for k, v in (ulp_hist or {}).items() if k not in ONE_STEP_BUCKETS)


# ----------------------------------------------------------------------------------------------
# Conventions (docs/numerics.md §10)
# ----------------------------------------------------------------------------------------------


def _same_data(golden: QuantizedTensor, candidate: QuantizedTensor) -> bool:
    """Every data field of `golden` has the candidate's shape and bytes (scales, with their padding, are
    left to the full comparison)."""
    from .golden import same_bits  # noqa: PLC0415

    for o in ("rowwise", "colwise"):
        g, c = getattr(golden, f"{o}_data"), getattr(candidate, f"{o}_data")
        if g is not None and (c is None or not same_bits(g, c.to(g.device))):
            return False
    return True


def declared_conventions(backend: Any) -> tuple[str, ...]:
    """The catalogue conventions `backend` says its kernel follows: its optional `conventions` attribute
    (a name or a tuple of names, most likely first; docs/adapters.md §4), unknown names dropped."""
    names = getattr(backend, "conventions", ()) or ()
    names = (names,) if isinstance(names, str) else tuple(names)
    return tuple(n for n in names if isinstance(n, str) and n in conventions.CONVENTIONS)


# The value each torchao MX mode realises of `e8m0_rule` (docs/numerics.md §3), which its catalogue row
# fixes at `ceil` only as unused: FLOOR is the floor rule for finite normal amax (§10.3), RCEIL TE's ceil
# of amax / fp8_max (§10.4); CEIL (ceil of log2 amax) and EVEN realise neither. Every other field
# counts as ignored where the convention's config replaced the case's value.
_REALISES: dict[str, dict[str, Any]] = {
    "torchao_floor": {"e8m0_rule": "floor"},
    "torchao_ceil": {"e8m0_rule": None},
    "torchao_even": {"e8m0_rule": None},
    "torchao_rceil": {"e8m0_rule": "ceil"},
}


def ignored_fields(config: Any, name: str) -> list[str]:
    """`field=value` of `config` that a kernel following convention `name` does not honour: fields the
    convention's config replaced, and a rule its own rule does not realise (docs/numerics.md §11)."""
    under = conventions.with_convention(config, name)
    realises = _REALISES.get(name, {})
    out = []
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if f.name == "convention":
            continue
        if (realises[f.name] != v) if f.name in realises else (getattr(under, f.name) != v):
            out.append(f"{f.name}={v}")
    return out


def convention_order(config: Any, preferred: Sequence[str] = ()) -> list[str]:
    """`reference.conventions.applicable(config)` in the order they are tried: the candidate's declared
    conventions first (those that honour every field of the case before those that ignore one, then in
    the declared order), then the rest in catalogue order."""
    names = conventions.applicable(config)
    rank = {n: i for i, n in enumerate(preferred)}
    cat = {n: i for i, n in enumerate(names)}
    return sorted(names, key=lambda n: (0, len(ignored_fields(config, n)), rank[n]) if n in rank else (1, 0, cat[n]))


def matching_convention(case: Any, x: torch.Tensor, candidate: QuantizedTensor, quantize,
                        preferred: Sequence[str] = ()) -> str:
    """The first convention of `convention_order(case.config, preferred)` under which the golden (re-run
    through `quantize(x, config)`) equals `candidate` on every compared field; '' if none."""
    from .compare import compare_quantized  # noqa: PLC0415

    for name in convention_order(case.config, preferred):
        try:
            cfg = conventions.with_convention(case.config, name)
            g = quantize(x, cfg)
        except Exception:  # noqa: BLE001 - a convention that cannot run this input does not match
            continue
        if not _same_data(g, candidate):  # cheap reject before locating every mismatch
            continue
        try:
            results = compare_quantized(g, dataclasses.replace(candidate, config=cfg), x, causes=False)
        except Exception:  # noqa: BLE001
            continue
        if all(tr.status == "pass" for tr in results):
            return name
    return ""


def find_convention(ev: Evidence, case: Any, x: torch.Tensor, candidate: QuantizedTensor, quantize) -> None:
    """Set `ev.matches_convention` (trying `ev.preferred` first) and `ev.ignored`, the case fields that
    convention replaced."""
    ev.matches_convention = matching_convention(case, x, candidate, quantize, ev.preferred)
    ev.ignored = ignored_fields(case.config, ev.matches_convention) if ev.matches_convention else []


def convention_note(ev: Evidence) -> str:
    """The report's words for a convention match: "bit-exact under X", and what of the case it ignored."""
    if not ev.matches_convention:
        return ""
    note = f"bit-exact under {ev.matches_convention}"
    return f"{note}: the candidate ignored {', '.join(ev.ignored)}" if ev.ignored else note


# ----------------------------------------------------------------------------------------------
# The verdict of one (case, backend)
# ----------------------------------------------------------------------------------------------


def severity(rows: Sequence[Mapping], ev: Evidence) -> str:
    """The severity of one (case, backend) from its rows and evidence (docs/numerics.md §11)."""
    statuses = {r.get("status") for r in rows}
    if "error" in statuses:
        return "broken"
    conf = [r for r in rows if r.get("kind") == "conformance"]
    if not conf or statuses <= {"skip"}:
        return ""
    if all(r.get("status") in ("pass", "skip") for r in conf) and ev.identical:
        return "exact"
    if ev.matches_convention:
        return "convention"
    if ev.broken:
        return "broken"
    deltas = [r.get("delta_sqnr_db") for r in rows if r.get("kind") == "accuracy"]
    deltas = [d for d in deltas if d is not None]
    worst = min(deltas) if deltas else None
    if ev.within_step and worst is not None and worst >= -EQUIVALENT_DB:
        return "equivalent"
    return "degraded"


def judge(rows: Sequence[Mapping], ev: Evidence) -> list[dict]:
    """`rows` with `severity` and `matches_convention` set on each, and the broken findings (or the
    convention note) in the reason of the pair's first failing conformance row."""
    sev = severity(rows, ev)
    out = [dict(r, severity=sev, matches_convention=ev.matches_convention) for r in rows]
    for r in out:  # every failing conformance row names the causes found (docs/numerics.md §13)
        if r.get("kind") == "conformance" and r.get("status") == "fail":
            cn = causes.cause_note(r.get("mismatch_classes") or {}, r.get("mismatch_examples"), r.get("n_mismatch"))
            if cn:
                r["reason"] = f"{r['reason']}; {cn}" if r.get("reason") else cn
    note = ""
    if sev == "broken" and ev.broken:
        note = "broken: " + "; ".join(ev.broken)
    elif sev == "convention":
        note = convention_note(ev)
    if note:
        for r in out:
            if r.get("kind") == "conformance" and r.get("status") in ("fail", "error"):
                if not r.get("reason"):
                    r["reason"] = note
                else:  # the convention first: it explains the mismatches after it
                    r["reason"] = f"{note}; {r['reason']}" if sev == "convention" else f"{r['reason']}; {note}"
                break
    return out
