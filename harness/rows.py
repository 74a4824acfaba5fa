"""Report rows: typed by the declared columns (harness.report.COLUMNS), built from comparison results.

Source: docs/design.md §6 (one row per (case, tensor), the column order declared once) and reports/README.md.
A row is a `Row` (a TypedDict whose keys are exactly COLUMNS); the builders here fill the columns they
know and leave the rest to the writer (harness.report.normalize_row), which rejects unknown keys.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence, TypedDict

import torch

from .report import COLUMNS, INT_COLUMNS, JSON_COLUMNS, NUMERIC_COLUMNS, normalize_row, worst_status


def _column_type(name: str) -> Any:
    if name in INT_COLUMNS:
        return int | None
    if name in NUMERIC_COLUMNS:
        return float | None
    if name in JSON_COLUMNS:
        return Any
    return Any if name in ("rht", "stochastic", "pow2_scales", "accumulate", "bias", "seed") else str


# The row type, generated from the one declaration of the columns (a row may leave any column out).
Row = TypedDict("Row", {c: _column_type(c) for c in COLUMNS}, total=False)


def case_columns(case: Any) -> Row:
    """The report columns that describe the case itself (docs/design.md §2 spellings)."""
    cfg = case.config
    b_cfg = getattr(case, "b_config", None)
    return Row(
        case_id=case.id,
        scheme=cfg.scheme,
        op=case.op,
        element=cfg.element,
        tile="" if cfg.tile is None else f"{cfg.tile[0]}x{cfg.tile[1]}",
        rht=cfg.rht,
        stochastic=cfg.stochastic,
        pow2_scales=cfg.pow2_scales,
        e8m0_rule=cfg.e8m0_rule,
        orientation=getattr(case, "orientation", "") or "",
        shape="x".join(str(int(d)) for d in case.shape),
        in_dtype=case.in_dtype,
        out_dtype=getattr(case, "out_dtype", None) or "",
        layout=getattr(case, "layout", None) or "",
        b_config="" if b_cfg is None else b_cfg.id,
        accumulate=bool(getattr(case, "accumulate", False)),
        bias=bool(getattr(case, "bias", False)),
        distribution=case.distribution,
        seed=case.seed,
    )


def pair_base(case: Any, backend: str, device: str, worker: str) -> Row:
    """The columns shared by every row of one (case, backend)."""
    return Row(**case_columns(case), backend=backend, device=str(device), worker=worker)


def short(text: str, limit: int = 400) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exc_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def describe_mismatch(tr: Any) -> str:
    """One line for a failing TensorResult: counts, classes and the first mismatch's location."""
    parts = [f"{tr.tensor}: {tr.n_mismatch} of {tr.n} differ"]
    if getattr(tr, "mismatch_classes", None):
        parts.append("classes " + ", ".join(f"{k}={v}" for k, v in sorted(tr.mismatch_classes.items())))
    fm = getattr(tr, "first_mismatch", None)
    if fm:
        loc = {k: fm[k] for k in ("index", "row", "col", "element", "block", "tile", "location") if k in fm}
        parts.append("first at " + json.dumps(loc if loc else fm, default=str, sort_keys=True))
    detail = getattr(tr, "detail", None)
    if isinstance(detail, str) and detail:
        parts.append(detail)
    elif isinstance(detail, Mapping) and detail.get("reason"):
        parts.append(str(detail["reason"]))
    return short("; ".join(parts))


def format_first_mismatch(fm, indent: str = "    ") -> str:
    """A located first mismatch as text: one `key: compact JSON` line per top-level field."""
    if isinstance(fm, str):
        try:
            fm = json.loads(fm)
        except ValueError:
            return indent + fm
    if not isinstance(fm, Mapping):
        return indent + json.dumps(fm, default=str)
    return "\n".join(f"{indent}{k}: {json.dumps(v, default=str)}" for k, v in fm.items())


def _num(v) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def result_row(base: Mapping, tr: Any, kind: str = "conformance") -> Row:
    """A report row from a compare.TensorResult."""
    n = getattr(tr, "n", None)
    nm = getattr(tr, "n_mismatch", None)
    status = tr.status
    return Row(
        **base,
        tensor=tr.tensor,
        kind=kind,
        status=status,
        reason=describe_mismatch(tr) if status == "fail" else "",
        n=n,
        n_mismatch=nm,
        mismatch_frac=(nm / n) if (n and nm is not None) else None,
        max_abs=_num(getattr(tr, "max_abs", None)),
        max_rel=_num(getattr(tr, "max_rel", None)),
        rmse=_num(getattr(tr, "rmse", None)),
        sqnr_db=_num(getattr(tr, "sqnr_db", None)),
        mismatch_classes=getattr(tr, "mismatch_classes", None) or {},
        first_mismatch=getattr(tr, "first_mismatch", None),
        mismatch_examples=getattr(tr, "examples", None) or {},
        ulp_hist=getattr(tr, "ulp_hist", None) or {},
    )


def accuracy_row(base: Mapping, tensor: str, approx: torch.Tensor, truth: torch.Tensor) -> Row:
    """An `info` row with compare.metrics(approx, truth) (SQNR, max abs/rel error, RMSE), on truth's device."""
    from .compare import metrics  # noqa: PLC0415 - the comparison module is imported when used

    m = metrics(approx, truth)
    return Row(**base, tensor=tensor, kind="accuracy", status="info", reason="", n=int(truth.numel()),
               **{k: _num(m.get(k)) for k in ("max_abs", "max_rel", "rmse", "sqnr_db")})


def status_row(base: Mapping, status: str, reason: str, tensor: str = "case", kind: str = "conformance") -> Row:
    """A single verdict row without measurements (skip, error, a crash or a timeout); an error is
    severity `broken` (docs/numerics.md §11), wherever it is recorded (runner, process pool, pytest)."""
    extra = {"severity": "broken"} if status == "error" and "severity" not in base else {}
    return Row(**base, tensor=tensor, kind=kind, status=status, reason=short(reason, 1000), **extra)


def case_verdict(rows: Iterable[Mapping]) -> str:
    return worst_status(r["status"] for r in rows)


def as_jsonable(rows: Sequence[Mapping]) -> list[dict]:
    """Rows normalized to COLUMNS with JSON cells encoded and non-finite floats as strings.

    Used to ship rows between processes (pytest-xdist user_properties); report.normalize_row
    accepts them back unchanged.
    """

    def fix(v):
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v

    return [{k: fix(v) for k, v in normalize_row(r).items()} for r in rows]
