"""Reports people read: a self-contained HTML page, a markdown summary for a CI comment, JUnit XML.

Source: docs/design.md §6, reports/README.md ("Reports people read"), issue #39 item 5. `python -m harness report
DIR` writes them into DIR (`write_formats`; `--format` picks which). Every text a backend controls (its name, a
reason, a mismatch location) is escaped for the format it lands in: Jinja2's autoescape for HTML, `md_text` for
markdown, xml.etree for JUnit after `xml_text` (which drops what XML 1.0 cannot hold). The pass/fail of a pair in
the HTML, markdown and JUnit outputs is the CI policy's (`harness.report.unaccepted`, `--accept`).
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Sequence

import pandas as pd

from . import report
from .report import escape_text

FORMATS = ("html", "md", "junit")
FILES = {"html": "report.html", "md": "summary.md", "junit": "junit.xml"}
# Failing pairs listed one per line: in summary.md (a CI comment stays short) and in report.html.
MD_FAILING = 30
HTML_FAILING = 500
MD_WORST = 10
_TEXT_WIDTH = 300  # characters of a reason shown in markdown and HTML tables


def parse_formats(text: str) -> tuple[str, ...]:
    """`html,md,junit` (any subset; `none` for no file) -> the formats; ReportError for an unknown word."""
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if words == ["none"]:
        return ()
    bad = [w for w in words if w not in FORMATS]
    if bad or not words:
        raise report.ReportError(f"--format {escape_text(str(text))!r}: expected a comma list of "
                                 f"{', '.join(FORMATS)} (or none)")
    return tuple(dict.fromkeys(words))


def _cut(text: str, width: int = _TEXT_WIDTH) -> str:
    text = escape_text(str(text))
    return text if len(text) <= width else text[:width - 3] + "..."


# ---- what every format shows ------------------------------------------------------------------


def failing_pairs(df: pd.DataFrame, accept: Sequence[str], ps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The pairs outside `accept` (report.unaccepted), worst severity first, each with the `reason`,
    `tensor` and `first_mismatch` of its first failing (else first) conformance row."""
    bad = report.unaccepted(df, accept, ps)
    cols = [*bad.columns, "tensor", "reason", "first_mismatch"]
    if bad.empty:
        return pd.DataFrame(columns=cols)
    rows = df[df["kind"] == "conformance"].copy()
    rows["_bad"] = rows["status"].isin(["fail", "error"])
    rows = rows.sort_values("_bad", ascending=False, kind="stable").drop_duplicates(["case_id", "backend"])
    out = bad.merge(rows[["case_id", "backend", "tensor", "reason", "first_mismatch"]], how="left",
                    on=["case_id", "backend"]).fillna({"tensor": "", "reason": "", "first_mismatch": ""})
    rank = {s: i for i, s in enumerate(report.SEVERITIES)}
    out["_rank"] = -out["severity"].map(rank).fillna(len(rank))
    return out.sort_values("_rank", kind="stable").drop(columns="_rank").reset_index(drop=True)[cols]


def worst_pairs(ps: pd.DataFrame, n: int = MD_WORST) -> pd.DataFrame:
    """The `n` non-exact pairs of the worst severity, then the lowest worst_delta_sqnr_db."""
    ps = ps[ps["severity"].isin(report.SEVERITIES[1:])]
    if ps.empty:
        return ps
    rank = {s: i for i, s in enumerate(report.SEVERITIES)}
    ps = ps.assign(_rank=-ps["severity"].map(rank), _d=ps["worst_delta_sqnr_db"].fillna(float("inf")))
    return ps.sort_values(["_rank", "_d"], kind="stable").head(n).drop(columns=["_rank", "_d"])


def _counts(ps: pd.DataFrame) -> dict[str, int]:
    out = {s: int((ps["status"] == s).sum()) for s in ("pass", "fail", "skip", "error")}
    out.update({s: int((ps["severity"] == s).sum()) for s in report.SEVERITIES})
    return out


def _meta(d: Path) -> dict:
    try:
        m = json.loads((d / report.META).read_text())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


# ---- markdown ---------------------------------------------------------------------------------

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def md_text(text, width: int = _TEXT_WIDTH) -> str:
    """Backend text for a markdown table cell: escaped (escape_text), cut, markdown punctuation
    backslash-escaped, `<` `>` `&` as entities (no HTML reaches the comment)."""
    t = _cut(text, width).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", t)


def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(none)"
    cols = list(df.columns)

    def cell(v) -> str:
        if isinstance(v, float):
            return "-" if pd.isna(v) else f"{v:.3g}"
        return md_text(v)

    lines = ["| " + " | ".join(md_text(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines)


def markdown(df: pd.DataFrame, accept: Sequence[str], source: str, *, title: str = "",
             limit: int = MD_FAILING) -> str:
    """summary.md: verdict counts, the policy, the per (scheme, backend) table, the worst pairs, one line per
    failing pair (up to `limit`) and the grouped skip reasons (top 10)."""
    ps = report.pair_severity(df)
    c = _counts(ps)
    bad = failing_pairs(df, accept, ps)
    verdict = "PASS" if bad.empty else "FAIL"
    parts = [f"## numerics-harness: {verdict}" + (f" ({md_text(title)})" if title else ""), "",
             f"{len(ps)} (case, backend) pairs: " + ", ".join(f"{k} {c[k]}" for k in ("pass", "fail", "skip", "error"))
             + "; severities: " + ", ".join(f"{s} {c[s]}" for s in report.SEVERITIES), "",
             f"Policy: `--accept {','.join(accept)}` ({md_text(source)}): "
             + ("every pair within it." if bad.empty else f"**{len(bad)} pair(s) outside it.**"), "",
             "### Verdict per scheme x backend", "", _md_table(report.summary(df, ps))]
    worst = worst_pairs(ps)
    if len(worst):
        parts += ["", "### Worst pairs", "", _md_table(worst[["severity", "case_id", "backend", "classes",
                                                             "worst_delta_sqnr_db"]])]
    if len(bad):
        parts += ["", f"### Failing pairs ({len(bad)})", ""]
        for r in bad.head(limit).itertuples(index=False):
            parts.append(f"- **{md_text(r.severity or r.status)}** {md_text(r.case_id)} \\[{md_text(r.backend)}\\] "
                         f"{md_text(r.tensor)}: {md_text(r.reason, 200)}")
        if len(bad) > limit:
            parts.append(f"- ... and {len(bad) - limit} more (report.html lists them)")
    skips, total = report.skip_groups(df)
    if total:
        parts += ["", f"### Skip reasons ({int((df['status'] == 'skip').sum())} skipped, {total} distinct"
                  + (", top 10" if total > len(skips) else "") + ")", "", _md_table(skips)]
    return "\n".join(parts) + "\n"


# ---- JUnit ------------------------------------------------------------------------------------

_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text) -> str:
    """Text XML 1.0 can hold: escape_text (controls, surrogates), then any character XML forbids dropped as `?`."""
    return _XML_INVALID.sub("?", escape_text(str(text)))


def junit(df: pd.DataFrame, accept: Sequence[str] = report.DEFAULT_ACCEPT) -> bytes:
    """JUnit XML: one testsuite per backend, one testcase per (case, backend) (classname `numerics.<scheme>.
    <backend>`, name the case id); `<failure>` for a pair outside `accept` (message: its reason, type: its severity
    or status), `<skipped>` with the skip reason."""
    ps = report.pair_severity(df)
    bad = failing_pairs(df, accept, ps).set_index(["case_id", "backend"])
    skip_reason = (df[df["status"] == "skip"].drop_duplicates(["case_id", "backend"])
                   .set_index(["case_id", "backend"])["reason"])
    root = ET.Element("testsuites", name="numerics-harness")
    total = {"tests": 0, "failures": 0, "skipped": 0}
    for backend, group in ps.groupby("backend", sort=False):
        suite = ET.SubElement(root, "testsuite", name=xml_text(backend))
        n = {"tests": 0, "failures": 0, "skipped": 0}
        for r in group.itertuples(index=False):
            tc = ET.SubElement(suite, "testcase", classname=xml_text(f"numerics.{r.scheme}.{r.backend}"),
                               name=xml_text(r.case_id))
            n["tests"] += 1
            key = (r.case_id, r.backend)
            if key in bad.index:
                b = bad.loc[key]
                b = b.iloc[0] if isinstance(b, pd.DataFrame) else b
                f = ET.SubElement(tc, "failure", message=xml_text(_cut(b["reason"] or r.status)),
                                  type=xml_text(b["severity"] or r.status))
                f.text = xml_text(f"status {r.status}, severity {b['severity'] or '-'}\n{b['tensor']}: {b['reason']}\n"
                                  f"first mismatch: {b['first_mismatch']}")
                n["failures"] += 1
            elif r.status == "skip":
                ET.SubElement(tc, "skipped", message=xml_text(skip_reason.get(key, "")))
                n["skipped"] += 1
        for k, v in n.items():
            suite.set(k, str(v))
            total[k] += v
    for k, v in total.items():
        root.set(k, str(v))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


# ---- HTML -------------------------------------------------------------------------------------

_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>numerics-harness report: {{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.exact, .pass { background: #e6f4e6; } .convention, .equivalent { background: #fff6d6; }
.degraded { background: #ffe2c6; } .broken, .fail, .error { background: #ffd0d0; }
.verdict { font-size: 1.3em; font-weight: bold; }
code, .mono { font-family: ui-monospace, monospace; font-size: 0.95em; word-break: break-all; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
</style></head><body>
<h1>numerics-harness report</h1>
<p class="verdict {{ 'pass' if not failing else 'fail' }}">{{ 'PASS' if not failing else 'FAIL' }}:
policy <code>--accept {{ accept }}</code> ({{ source }}),
{{ 'every pair within it' if not failing else n_failing ~ ' pair(s) outside it' }}</p>
<p>{{ n_pairs }} (case, backend) pairs in <code>{{ title }}</code>:
{% for k, v in counts %}{{ k }} {{ v }}{{ ', ' if not loop.last }}{% endfor %}.
{% if meta %}Commit <code>{{ meta.commit }}</code>{{ ' (dirty tree)' if meta.dirty }}, created {{ meta.created }}{% if meta.selection %}, selection <code>{{ meta.selection }}</code>{% endif %}.{% endif %}</p>

<h2>Verdict per scheme x backend</h2>
<table><tr>{% for c in summary_cols %}<th>{{ c }}</th>{% endfor %}</tr>
{% for r in summary_rows %}<tr>{% for c, v in r %}<td class="{{ 'num ' if v is number }}{{ c if (v is number and v > 0 and c in severities) }}">{{ fmt(v) }}</td>{% endfor %}</tr>
{% endfor %}</table>

{% if groups %}<h2>Non-exact pairs by severity x class x input distribution</h2>
<table><tr>{% for c in group_cols %}<th>{{ c }}</th>{% endfor %}</tr>
{% for r in groups %}<tr class="{{ r[0][1] }}">{% for c, v in r %}<td{{ ' class=num' if v is number }}>{{ fmt(v) }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}

{% if failing %}<h2>Failing pairs ({{ n_failing }}{{ ', first ' ~ failing|length if n_failing > failing|length }})</h2>
<table><tr><th>severity</th><th>status</th><th>case</th><th>backend</th><th>tensor</th><th>reason</th><th>first mismatch</th></tr>
{% for r in failing %}<tr><td class="{{ r.severity }}">{{ r.severity or '-' }}</td><td class="{{ r.status }}">{{ r.status }}</td>
<td class="mono">{{ r.case_id }}</td><td>{{ r.backend }}</td><td>{{ r.tensor }}</td><td>{{ r.reason }}</td><td class="mono">{{ r.first_mismatch }}</td></tr>
{% endfor %}</table>{% endif %}

{% if skips %}<h2>Skip reasons ({{ n_skipped }} skipped, {{ skips|length }} distinct)</h2>
<table><tr><th>count</th><th>reason</th><th>backends</th></tr>
{% for r in skips %}<tr><td class="num">{{ r.count }}</td><td>{{ r.reason }}</td><td>{{ r.backends }}</td></tr>
{% endfor %}</table>{% endif %}

{% if plots %}<h2>Plots</h2>
{% for name, data in plots %}<h3>{{ name }}</h3><img alt="{{ name }}" src="data:image/png;base64,{{ data }}">
{% endfor %}{% endif %}
</body></html>
"""


def _fmt(v) -> str:
    if isinstance(v, float):
        return "-" if pd.isna(v) else (f"{v:.3g}" if v else "0")
    return _cut(v)


def html(df: pd.DataFrame, accept: Sequence[str], source: str, *, title: str = "", meta: dict | None = None,
         plots: Sequence[Path] = (), limit: int = HTML_FAILING) -> str:
    """report.html: self-contained (styles inline, plots as base64 PNGs), every text autoescaped by Jinja2."""
    import jinja2  # noqa: PLC0415

    env = jinja2.Environment(autoescape=True)
    ps = report.pair_severity(df)
    c = _counts(ps)
    bad = failing_pairs(df, accept, ps)
    summ = report.summary(df, ps)
    groups = report.verdict_groups(df, ps)
    skips, _ = report.skip_groups(df, None)
    meta = meta or {}
    sel = meta.get("selection") or {}
    info = {"commit": _cut(meta.get("git_commit") or "?", 60), "dirty": bool(meta.get("git_dirty")),
            "created": _cut(meta.get("created") or "?", 60),
            "selection": _cut(", ".join(f"{k}={v}" for k, v in sel.items()
                                        if k in ("tier", "cases", "filter", "shard", "backends") and v), 400)
            } if meta else None
    failing = [{k: _cut(v) if k in ("reason", "first_mismatch") else escape_text(str(v)) for k, v in r.items()}
               for r in bad.head(limit).to_dict("records")]
    rows = lambda frame: [list(zip(frame.columns, r, strict=True)) for r in frame.itertuples(index=False)]  # noqa: E731
    pngs = [(p.name, base64.b64encode(p.read_bytes()).decode("ascii")) for p in plots if Path(p).is_file()]
    return env.from_string(_HTML).render(
        title=escape_text(title), accept=",".join(accept), source=escape_text(source), failing=failing,
        n_failing=len(bad), n_pairs=len(ps), counts=[(k, c[k]) for k in ("pass", "fail", "skip", "error",
                                                                          *report.SEVERITIES)],
        meta=info, summary_cols=list(summ.columns), summary_rows=rows(summ), severities=report.SEVERITIES,
        group_cols=list(groups.columns), groups=rows(groups),
        skips=[{"count": int(r.count), "reason": _cut(r.reason), "backends": escape_text(r.backends)}
               for r in skips.itertuples(index=False)],
        n_skipped=int((df["status"] == "skip").sum()) if not df.empty else 0, plots=pngs, fmt=_fmt)


# ---- writing ----------------------------------------------------------------------------------


def write_formats(df: pd.DataFrame, out_dir: str | Path, formats: Sequence[str] = FORMATS, *,
                  accept: Sequence[str] = report.DEFAULT_ACCEPT, source: str = "default",
                  plots: Sequence[Path] = ()) -> list[Path]:
    """Write `formats` (FILES names them) into `out_dir`; returns the files written. The JUnit XML is parsed back
    before it is written (a ValueError, never a broken file, if it did not parse)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = _meta(out)
    written = []
    for f in formats:
        p = out / FILES[f]
        if f == "html":
            p.write_text(html(df, accept, source, title=str(out), meta=meta, plots=plots), encoding="utf-8")
        elif f == "md":
            p.write_text(markdown(df, accept, source, title=str(out)), encoding="utf-8")
        else:
            data = junit(df, accept)
            ET.fromstring(data)  # validate: it parses back
            p.write_bytes(data)
        written.append(p)
    return written
