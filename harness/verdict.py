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
# NUMERICS: §11 - SQNRs are compared capped at this ceiling: an fp32 result cannot be told from the truth beyond
# ~146 dB (24-bit significand, 6.02 * 24 + 1.76), so a lossless golden (+inf) and a candidate at 108 dB differ by
# 108 - 140 = -32 dB, not -inf.
SQNR_CEILING_DB = 140.0
# NUMERICS: §11 - a drop of more than this many dB below the golden is `broken` when the candidate is also below
# its element format's nominal SQNR plus this margin (nominal_db): 20 dB is 100x the golden's noise power (10x its
# RMS error, 3.3 bits, more than an E4M3 significand holds).
BROKEN_DB = 20.0
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
    # (tensor, element format, golden SQNR, candidate SQNR, elements clipped) over the elements the golden does
    # not clip (graded_accuracy); where present the severity grades these instead of the accuracy rows
    accuracy: list[tuple[str, str, float, float, int]] = field(default_factory=list)


def delta_db(candidate: float | None, golden: float | None) -> float | None:
    """candidate SQNR − golden SQNR (dB), both against the truth and capped at SQNR_CEILING_DB (docs/numerics.md
    §11); 0 when equal (both +inf included), finite whenever the candidate's SQNR is finite or +inf."""
    if candidate is None or golden is None:
        return None
    if candidate == golden or (math.isnan(candidate) and math.isnan(golden)):
        return 0.0
    if math.isnan(candidate) or math.isnan(golden):
        return None
    c, g = min(candidate, SQNR_CEILING_DB), min(golden, SQNR_CEILING_DB)
    return 0.0 if c == g else c - g


def nominal_db(element: str | None) -> float:
    """The SQNR of round-to-nearest with the element format's significand on a uniform relative error:
    10 log10(3 * 4^(man_bits + 1)) = 4.77 + 6.02 (man_bits + 1) dB (E4M3 28.9, E5M2 22.8, E2M1 16.8); +inf for
    an unknown format (docs/numerics.md §11)."""
    from reference.formats import FORMATS  # noqa: PLC0415

    fmt = FORMATS.get(str(element or ""))
    if fmt is None:
        return math.inf
    return 10 * math.log10(3 * 4.0 ** (fmt.man_bits + 1))


# ----------------------------------------------------------------------------------------------
# Grading where the golden's dequantization is not finite (docs/numerics.md §11)
# ----------------------------------------------------------------------------------------------


def graded_dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dequantized copy the severity grades against the truth: reference.dequantize, except that an NVFP4 copy
    whose global amax is +inf (any Inf input, docs/numerics.md §5.1: S_enc = 1) decodes with the encode's own
    S_dec, x = RN(v * RN(s_blk * S_dec)), where §5.8's factor RN(s_blk * A_g) / 2688 is inf (or NaN for s_blk = 0)
    everywhere: the golden would be infinite, so no candidate could be told from it."""
    cfg = q.config
    amax = getattr(q, f"{orientation}_amax")
    if not cfg.scheme_row.global_amax or amax is None or not bool(torch.isposinf(amax.to(torch.float32)).any()):
        return reference.dequantize(q, orientation, dtype)
    from reference import nvfp4  # noqa: PLC0415
    from reference.formats import E2M1, E4M3  # noqa: PLC0415

    data, scale = getattr(q, f"{orientation}_data"), getattr(q, f"{orientation}_scale")
    blk = cfg.block
    rows, cols = data.shape[0], data.shape[1] * 2
    a_g = amax.to(torch.float32).reshape(-1, 1) if cfg.row_scaled else amax.to(torch.float32).reshape(())
    _, s_dec = nvfp4.global_scale(a_g.to(data.device), cfg.e4m3_max)
    g = casts.decode(scale[:rows, : cols // blk], E4M3) * s_dec
    v = casts.decode(casts.unpack_nibbles(data), E2M1).reshape(rows, cols // blk, blk)
    xh = (v * g.unsqueeze(-1)).reshape(rows, cols).to(dtype)
    return xh if orientation == "rowwise" else xh.t().contiguous()


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
    d0 = graded_dequantize(q, o, torch.float32).to(torch.float64).cpu()
    du = graded_dequantize(_with_codes(q, o, up), o, torch.float32).to(torch.float64).cpu()
    dd = graded_dequantize(_with_codes(q, o, down), o, torch.float32).to(torch.float64).cpu()
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
    """How many positions are non-finite in `candidate` and finite in `golden`, or NaN in `candidate` where the
    golden is an infinity (it lost the value's sign and size: an Inf input written as NaN where the golden's
    decode overflows), on the golden's device."""
    g = golden.detach()
    c = candidate.detach().to(g.device)
    return int(((torch.isfinite(g) & ~torch.isfinite(c)) | (torch.isinf(g) & torch.isnan(c))).sum())


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


def graded_accuracy(q: QuantizedTensor, o: str, golden_deq: torch.Tensor, cand_deq: torch.Tensor,
                    truth: torch.Tensor) -> tuple[float, float, int]:
    """(golden SQNR, candidate SQNR, elements left out) of copy `o` against the truth over the elements the golden
    does not clip
    (docs/numerics.md §11): an element whose golden code is the format's largest while the truth lies beyond it
    (a saturated Inf, the input dtype's max in an NVFP4 tensor with A_g = +inf: S_enc = 1 caps values at 2688)
    has an error set by the range, not by the rounding, and would make both SQNRs read ~0 dB, hiding every other
    element. On the golden's device; `golden_deq` and `cand_deq` as graded_dequantize gives them, [M, K]."""
    from reference.layouts import copy_geometry  # noqa: PLC0415

    from .compare import metrics  # noqa: PLC0415

    fmt = q.config.element_format
    codes = _codes(q, o).to(golden_deq.device).to(torch.int64)
    if copy_geometry(q.config, o, q.m, q.k).transposed:
        codes = codes.t()
    g, t = golden_deq.to(torch.float64), truth.to(torch.float64).reshape(golden_deq.shape)
    # Clipped: the golden's largest code with the truth beyond that code's rounding interval (max plus half the top
    # step); a block maximum that merely rounds to max is not clipped, nor is a zero golden value (a block whose
    # scale underflowed to 0 saturates its codes by design, §5.3).
    top = casts.decode(torch.tensor([fmt.max_code, fmt.max_code - 1], dtype=torch.uint8), fmt).tolist()
    reach = 1 + (1 - top[1] / top[0]) / 2
    clipped = ((codes & ~fmt.sign_mask) == fmt.max_code) & (t.abs() > g.abs() * reach) & (g != 0)
    n_clipped = int(clipped.sum())
    if not n_clipped:
        return metrics(golden_deq, truth)["sqnr_db"], metrics(cand_deq, truth)["sqnr_db"], 0
    keep = ~clipped
    tk = truth.reshape(golden_deq.shape)[keep]
    cd = cand_deq.to(golden_deq.device)
    return metrics(golden_deq[keep], tk)["sqnr_db"], metrics(cd[keep], tk)["sqnr_db"], n_clipped


def _accuracy(rows: Sequence[Mapping], ev: Evidence) -> list[tuple[str, float | None, float | None, str]]:
    """(tensor, delta, candidate SQNR, element format) of each accuracy measurement the severity grades: the
    evidence's graded_accuracy where the compare function gathered it, else the accuracy rows."""
    if ev.accuracy:
        return [(t, delta_db(c, g), c, el) for t, el, g, c, _ in ev.accuracy]
    return [(r.get("tensor"), r.get("delta_sqnr_db"), r.get("sqnr_db"), r.get("element"))
            for r in rows if r.get("kind") == "accuracy"]


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
    if ev.broken or accuracy_broken(rows, ev):
        return "broken"
    deltas = [d for _, d, _, _ in _accuracy(rows, ev) if d is not None]
    worst = min(deltas) if deltas else None
    if worst is not None and worst >= 0:  # as accurate as the golden, or more: never degraded
        return "equivalent"
    if ev.within_step and worst is not None and worst >= -EQUIVALENT_DB:
        return "equivalent"
    return "degraded"


def accuracy_broken(rows: Sequence[Mapping], ev: Evidence | None = None) -> list[str]:
    """Why the accuracy makes a candidate `broken` (docs/numerics.md §11), one phrase per measurement: its SQNR is
    at most 0 dB (its error is as large as the signal: a zeroed tensor reads 0 dB) where the golden's is above, or
    it is more than BROKEN_DB below the golden's and below its format's nominal SQNR + BROKEN_DB."""
    out = []
    for tensor, d, c, element in _accuracy(rows, ev or Evidence()):
        if d is None or c is None or math.isnan(c) or d >= 0:
            continue
        if c <= 0:
            out.append(f"{tensor}: SQNR {c:.1f} dB, no better than zeros")
        elif d <= -BROKEN_DB and c < nominal_db(element) + BROKEN_DB:
            out.append(f"{tensor}: SQNR {c:.1f} dB, {-d:.1f} dB below the golden's")
    return out


def judge(rows: Sequence[Mapping], ev: Evidence) -> list[dict]:
    """`rows` with `severity` and `matches_convention` set on each, and the broken findings (or the
    convention note) in the reason of the pair's first failing conformance row."""
    sev = severity(rows, ev)
    out = [dict(r, severity=sev, matches_convention=ev.matches_convention) for r in rows]
    graded = {a[0]: a[2:] for a in ev.accuracy}
    for r in out:  # NUMERICS: §11 - the delta the severity graded, where the golden clips elements
        if r.get("kind") == "accuracy" and r.get("delta_sqnr_db") is not None and r.get("tensor") in graded:
            g, c, n_clipped = graded[r["tensor"]]
            if n_clipped:
                r["delta_sqnr_db"] = delta_db(c, g)
                r["reason"] = (f"delta_sqnr_db over the {int(r.get('n') or 0) - n_clipped} elements the golden does "
                               f"not clip ({n_clipped} clipped): golden {g:.2f} dB, candidate {c:.2f} dB")
    for r in out:  # every failing conformance row names the causes found (docs/numerics.md §13)
        if r.get("kind") == "conformance" and r.get("status") == "fail":
            cn = causes.cause_note(r.get("mismatch_classes") or {}, r.get("mismatch_examples"), r.get("n_mismatch"))
            if cn:
                r["reason"] = f"{r['reason']}; {cn}" if r.get("reason") else cn
    note = ""
    if sev == "broken" and (ev.broken or accuracy_broken(rows, ev)):
        note = "broken: " + "; ".join(ev.broken or accuracy_broken(rows, ev))
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
