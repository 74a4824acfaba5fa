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


def matching_convention(case: Any, x: torch.Tensor, candidate: QuantizedTensor, quantize) -> str:
    """The first convention of `reference.conventions.applicable(case.config)` under which the golden
    (re-run through `quantize(x, config)`) equals `candidate` on every compared field; '' if none."""
    from .compare import compare_quantized  # noqa: PLC0415

    for name in conventions.applicable(case.config):
        try:
            cfg = conventions.with_convention(case.config, name)
            g = quantize(x, cfg)
        except Exception:  # noqa: BLE001 - a convention that cannot run this input does not match
            continue
        if not _same_data(g, candidate):  # cheap reject before locating every mismatch
            continue
        try:
            results = compare_quantized(g, dataclasses.replace(candidate, config=cfg), x)
        except Exception:  # noqa: BLE001
            continue
        if all(tr.status == "pass" for tr in results):
            return name
    return ""


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
    """`rows` with `severity` and `matches_convention` set on each, and the broken findings in the
    reason of the pair's first failing conformance row."""
    sev = severity(rows, ev)
    out = [dict(r, severity=sev, matches_convention=ev.matches_convention) for r in rows]
    if sev == "broken" and ev.broken:
        note = "broken: " + "; ".join(ev.broken)
        for r in out:
            if r.get("kind") == "conformance" and r.get("status") in ("fail", "error"):
                r["reason"] = f"{r['reason']}; {note}" if r.get("reason") else note
                break
    return out
