"""Report writing, schema, resume after a kill, summary, diff exit codes, merge, progress bar, plots."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from harness import cli, plots, report
from harness.progress import Progress

ROOT = Path(__file__).resolve().parents[2]


def row(case_id="c1", backend="reference", tensor="rowwise_data", status="pass", **kw) -> dict:
    r = {"case_id": case_id, "backend": backend, "tensor": tensor, "status": status, "kind": "conformance",
         "scheme": kw.pop("scheme", "fp8_current"), "op": "quantize", "n": 64, "n_mismatch": 0, "shape": "8x8",
         "element": "e4m3", "tile": "", "seed": 1, "distribution": "normal"}
    r.update(kw)
    return r


def acc(case_id="c1", backend="reference", sqnr=30.0, **kw) -> dict:
    return row(case_id, backend, "accuracy_rowwise", "info", kind="accuracy", sqnr_db=sqnr, n_mismatch=None, **kw)


def write_report(d: Path, rows: list[dict]) -> Path:
    with report.ReportWriter(d, {"test": True}) as w:
        for r in rows:
            w.write([r])
    return d


# ---- schema ----------------------------------------------------------------------------------


def readme_columns() -> list[str]:
    text = (ROOT / "reports" / "README.md").read_text()
    section = text.split("## Columns", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def test_columns_match_reports_readme_schema_table_in_order():
    assert readme_columns() == list(report.COLUMNS)


def test_columns_hold_every_field_the_issue_requires():
    required = ("case_id scheme op backend tensor status reason n n_mismatch max_abs max_rel sqnr_db rmse "
                "mismatch_frac mismatch_classes first_mismatch ulp_hist element tile rht stochastic pow2_scales "
                "e8m0_rule orientation shape in_dtype out_dtype layout distribution seed wall_ms worker").split()
    assert [c for c in required if c not in report.COLUMNS] == []
    assert len(set(report.COLUMNS)) == len(report.COLUMNS)


def test_unknown_row_key_is_rejected_with_its_name():
    with pytest.raises(KeyError, match="bogus"):
        report.normalize_row({"case_id": "x", "bogus": 1})


# ---- writing and reading ---------------------------------------------------------------------


def test_writer_appends_rows_pandas_reads_them_back_with_json_cells(tmp_path):
    first = {"index": [3, 5], "golden": "0x7E", "candidate": "0x7D", "x": float("nan")}
    rows = [row(tensor="rowwise_data", status="fail", n_mismatch=2, mismatch_frac=2 / 64,
                mismatch_classes={"tie_flip": 2}, first_mismatch=first, ulp_hist={"0": 62, "1": 2},
                reason="2 of 64 differ, with, commas and \"quotes\""),
            acc(sqnr=31.5)]
    w = report.ReportWriter(tmp_path, {"commit": "abc"})
    w.write(rows[:1])
    # Flushed per case: readable while the writer is still open.
    assert len(pd.read_csv(tmp_path / report.RESULTS)) == 1
    w.write(rows[1:])
    w.close()
    df = report.read_results(tmp_path)
    assert list(df.columns) == list(report.COLUMNS)
    assert df["status"].tolist() == ["fail", "info"]
    assert df.loc[0, "reason"] == "2 of 64 differ, with, commas and \"quotes\""
    assert json.loads(df.loc[0, "mismatch_classes"]) == {"tie_flip": 2}
    fm = json.loads(df.loc[0, "first_mismatch"])
    assert fm["index"] == [3, 5] and fm["x"] == "nan"
    assert json.loads(df.loc[0, "ulp_hist"]) == {"0": 62, "1": 2}
    assert df.loc[0, "n_mismatch"] == 2 and df.loc[1, "sqnr_db"] == 31.5
    assert pd.isna(df.loc[1, "n_mismatch"])
    meta = json.loads((tmp_path / report.META).read_text())
    assert meta["commit"] == "abc"
    # A fresh (non-resume) writer refuses the previous report; with force it starts a new file.
    with pytest.raises(report.ReportError, match="holds a previous report"):
        report.ReportWriter(tmp_path, {})
    report.ReportWriter(tmp_path, {}, force=True).close()
    assert not (tmp_path / report.RESULTS).exists() or (tmp_path / report.RESULTS).stat().st_size == 0


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from harness import report
    w = report.ReportWriter({out!r}, {{"run": 1}})
    for cid in ("case_a", "case_b"):
        w.write([{{"case_id": cid, "backend": "reference", "tensor": t, "status": "pass", "kind": "conformance"}}
                 for t in ("rowwise_data", "rowwise_scale")])
    # A torn write (the process dies in the middle of a line), then SIGKILL: no close, no cleanup.
    os.write(w._fd, b"case_c,fp8_current,quantize,reference,rowwise_da")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_resume_after_a_killed_run_keeps_finished_cases_and_drops_the_torn_line(tmp_path):
    out = tmp_path / "rep"
    script = _KILLED_WRITER.format(root=str(ROOT), out=str(out))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    w = report.ReportWriter(out, {"run": 2}, resume=True)
    assert w.completed == {("case_a", "reference"), ("case_b", "reference")}
    assert w.is_complete("case_a", "reference") and not w.is_complete("case_c", "reference")
    w.write([row("case_c", tensor="rowwise_data")])
    w.close()
    df = report.read_results(out)
    assert df["case_id"].tolist() == ["case_a", "case_a", "case_b", "case_b", "case_c"]
    assert (out / report.RESULTS).read_text().count("case_id,") == 1  # header written once
    assert json.loads((out / report.META).read_text())["resumed"] == 1


# ---- summary, diff, merge --------------------------------------------------------------------


def test_summary_counts_cases_by_their_worst_row_and_reports_worst_delta_sqnr():
    df = pd.DataFrame([report.normalize_row(r) for r in [
        row("a", severity="degraded"), row("a", tensor="rowwise_scale", status="fail", severity="degraded"),
        acc("a", sqnr=20.0, delta_sqnr_db=-1.5, severity="degraded"),
        row("b", severity="exact"), acc("b", sqnr=35.0, delta_sqnr_db=0.0, severity="exact"),
        row("c", tensor="case", status="skip", n=None, n_mismatch=None),
        row("d", tensor="case", status="error", n=None, n_mismatch=None),
        row("e", scheme="mxfp8"),
    ]], columns=list(report.COLUMNS))
    for c in ("sqnr_db", "delta_sqnr_db"):
        df[c] = pd.to_numeric(df[c])
    s = report.summary(df).set_index(["scheme", "backend"])
    r = s.loc[("fp8_current", "reference")]
    assert (r["cases"], r["pass"], r["fail"], r["skip"], r["error"]) == (4, 1, 1, 1, 1)
    assert (r["exact"], r["degraded"], r["equivalent"]) == (1, 1, 0)
    assert r["worst_delta_sqnr_db"] == -1.5
    assert s.loc[("mxfp8", "reference")]["pass"] == 1
    assert "worst_delta_sqnr_db" in report.format_table(report.summary(df))


def test_worst_status_orders_pass_info_skip_fail_error():
    assert report.worst_status(["pass", "info"]) == "pass"
    assert report.worst_status(["info", "skip"]) == "skip"
    assert report.worst_status(["skip", "fail", "pass"]) == "fail"
    assert report.worst_status(["fail", "error"]) == "error"


def test_diff_of_identical_reports_is_clean_and_exits_0(tmp_path, capsys):
    rows = [row("a"), acc("a", sqnr=30.0), row("b")]
    old, new = write_report(tmp_path / "old", rows), write_report(tmp_path / "new", rows)
    assert cli.main(["diff", str(old), str(new)]) == 0
    assert "0 regression(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "new_rows, expect",
    [
        pytest.param([row("a", status="fail", n_mismatch=3), acc("a", sqnr=30.0)], "status pass -> fail", id="status"),
        pytest.param([row("a", n_mismatch=0), acc("a", sqnr=29.4)], "SQNR 30.00 -> 29.40", id="sqnr-drop-0.6dB"),
        pytest.param([row("a", tensor="case", status="error", n=None, n_mismatch=None)], "status pass -> error",
                     id="error"),
    ],
)
def test_diff_flags_regressions_and_exits_1(tmp_path, capsys, new_rows, expect):
    old = write_report(tmp_path / "old", [row("a"), acc("a", sqnr=30.0)])
    new = write_report(tmp_path / "new", new_rows)
    assert cli.main(["diff", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and expect in out


def test_diff_counts_more_mismatches_but_not_small_sqnr_moves_or_improvements(tmp_path):
    old = pd.DataFrame([report.normalize_row(r) for r in [
        row("a", status="fail", n_mismatch=2), acc("a", sqnr=30.0), row("b", status="fail", n_mismatch=5)]])
    new = pd.DataFrame([report.normalize_row(r) for r in [
        row("a", status="fail", n_mismatch=4), acc("a", sqnr=29.6), row("b", status="pass", n_mismatch=0)]])
    for df in (old, new):
        for c in ("n_mismatch", "sqnr_db"):
            df[c] = pd.to_numeric(df[c])
    regressions, _ = report.diff(old, new)
    assert len(regressions) == 1 and regressions[0].startswith("mismatches 2 -> 4")


def test_merge_joins_shards_and_prefer_last_keeps_the_last_shards_rows_of_a_repeated_pair(tmp_path, capsys):
    s0 = write_report(tmp_path / "s0", [row("a"), acc("a"), row("b", status="fail", n_mismatch=1),
                                        row("b", tensor="rowwise_scale", status="fail")])
    s1 = write_report(tmp_path / "s1", [row("c"), row("b")])
    capsys.readouterr()
    assert cli.main(["merge", str(tmp_path / "all"), str(s0), str(s1)]) == 2  # a pair in two shards: say whose
    assert capsys.readouterr().err == (
        f"error: merge: 1 (case_id, backend) pair(s) are in more than one shard, e.g. b [reference] in {s0} and "
        f"{s1}; pass --prefer first or --prefer last to say whose rows win\n")
    assert not (tmp_path / "all" / report.RESULTS).exists()
    assert cli.main(["merge", str(tmp_path / "all"), str(s0), str(s1), "--prefer", "last"]) == 0
    df = report.read_results(tmp_path / "all")
    assert sorted(zip(df["case_id"], df["tensor"], strict=True)) == [("a", "accuracy_rowwise"), ("a", "rowwise_data"),
                                                        ("b", "rowwise_data"), ("c", "rowwise_data")]
    assert df[df["case_id"] == "b"]["status"].tolist() == ["pass"]  # the whole pair from s1, not a mixture
    meta = json.loads((tmp_path / "all" / report.META).read_text())
    assert [m["dir"] for m in meta["merged_from"]] == [str(s0), str(s1)] and meta["prefer"] == "last"
    assert meta["merge_notes"] == ["1 (case_id, backend) pair(s) in more than one shard: the last shard's rows kept "
                                   "(--prefer)"]
    assert cli.main(["merge", str(tmp_path / "first"), str(s0), str(s1), "--prefer", "first"]) == 0
    df = report.read_results(tmp_path / "first")
    assert df[df["case_id"] == "b"][["tensor", "status"]].values.tolist() == [["rowwise_data", "fail"],
                                                                              ["rowwise_scale", "fail"]]


# ---- report command and plots ----------------------------------------------------------------


def test_report_command_prints_summary_and_writes_pngs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rows = [row("a", shape="32x64", mismatch_frac=0.0, ulp_hist={"0": 60, "1": 4}),
            row("b", shape="64x64", status="fail", n_mismatch=3, mismatch_frac=3 / 4096, ulp_hist={"0": 4093, "2": 3}),
            acc("a", sqnr=31.0), acc("b", sqnr=28.5, tile="1x32", scheme="mxfp8")]
    d = write_report(tmp_path / "r", rows)
    assert cli.main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "worst_delta_sqnr_db" in out and "fp8_current" in out
    for name in ("mismatch_heatmap.png", "ulp_hist.png", "sqnr_by_toggle.png"):
        p = d / "plots" / name
        assert p.exists() and p.read_bytes()[:4] == b"\x89PNG"


def test_plots_keep_special_inputs_apart_histogram_per_unit_and_show_delta_sqnr(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    seen: dict[str, list] = {"titles": []}
    real = plots._title

    def spy(ax, text, fontsize=10):
        seen["titles"].append(text)
        real(ax, text, fontsize)

    monkeypatch.setattr(plots, "_title", spy)
    rows = [row("a", ulp_hist={"0": 60, "1": 4}), row("a", tensor="rowwise_scale", ulp_hist={"0": 3, "2": 1}),
            acc("a", sqnr=31.0, delta_sqnr_db=-0.5, backend="k"),
            acc("b", sqnr=3.0, delta_sqnr_db=0.0, backend="k", distribution="special")]
    d = write_report(tmp_path / "r", rows)
    files, _ = plots.write_plots(report.read_results(d), d / "plots")
    assert {p.name for p in files} >= {"ulp_hist.png", "sqnr_by_toggle.png", "delta_sqnr_by_toggle.png"}
    t = seen["titles"]
    assert any(x.startswith("ULP distance histogram: elements per bucket") for x in t)  # one compact chart
    assert any(x.endswith("(special values)") for x in t) and any(x.endswith("(finite inputs)") for x in t)
    assert any(x.startswith("accuracy against the golden's") for x in t)
    assert plots.ulp_unit("dequant_rowwise", "bfloat16") == "bfloat16 ULPs" and plots.ulp_unit("state_scale") == "fp32 ULPs"


def test_long_plot_titles_wrap_instead_of_being_clipped():
    class Ax:
        def set_title(self, text, fontsize):
            self.text = text

    ax = Ax()
    plots._title(ax, "ULP distance histogram: fp8_current/harness.adapters.torchao:float8, element codes")
    assert ax.text == "ULP distance histogram:\nfp8_current/harness.adapters.torchao:float8, element codes"


def test_report_without_matplotlib_says_so_and_skips_plots(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    d = write_report(tmp_path / "r", [row("a"), acc("a")])
    assert cli.main(["report", str(d)]) == 0
    assert plots.NO_MATPLOTLIB in capsys.readouterr().out
    assert not (d / "plots").exists()


def test_report_on_missing_dir_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nothing")]) == 2
    assert "no report at" in capsys.readouterr().err


# ---- progress bar ----------------------------------------------------------------------------


def test_progress_is_off_for_a_non_tty_and_draws_when_forced(monkeypatch):
    monkeypatch.delenv("NUMERICS_HARNESS_PROGRESS", raising=False)
    quiet = io.StringIO()
    p = Progress(3, stream=quiet)
    p.update(1, "pass")
    p.close()
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    p = Progress(2, stream=loud, force=True)
    p.update(1, "pass")
    p.update(1, "fail")
    p.close()
    text = loud.getvalue()
    assert "\r" in text and "2/2" in text and "pass 1 fail 1" in text and text.endswith("\n")
    monkeypatch.setenv("NUMERICS_HARNESS_PROGRESS", "1")
    assert Progress(1, stream=io.StringIO()).on


def test_sqnr_nan_cells_read_back_as_nan(tmp_path):
    d = write_report(tmp_path / "r", [acc("a", sqnr=float("nan"))])
    assert math.isnan(report.read_results(d).loc[0, "sqnr_db"])
    assert os.path.getsize(d / report.RESULTS) > 0


def test_csv_text_reads_back_as_pandas_own_rendering_does():
    # rows_to_csv_text writes with the stdlib csv module; pandas.read_csv must see what it sees in
    # DataFrame.to_csv's rendering of the same rows: text, JSON cells, NaN/inf, bools, ints, quoting.
    first = {"index": [3, 5], "golden": "0x7E", "x": float("nan")}
    rows = [row(tensor="rowwise_data", status="fail", n_mismatch=2, mismatch_frac=2 / 64, max_abs=float("inf"),
                mismatch_classes={"tie_flip": 2}, first_mismatch=first, ulp_hist={"0": 62, "1": 2},
                reason='line one\nline "two", with commas', rht=True, wall_ms=0.1),
            acc(sqnr=31.5), acc(sqnr=float("nan")), row(tensor="case", status="skip", reason="", rht=False, seed=7)]
    ours = report.rows_to_csv_text(rows, header=True)
    theirs = pd.DataFrame([report.normalize_row(r) for r in rows], columns=list(report.COLUMNS)).to_csv(
        index=False, lineterminator="\n")
    a, b = pd.read_csv(io.StringIO(ours)), pd.read_csv(io.StringIO(theirs))
    pd.testing.assert_frame_equal(a, b)
    # a newline is a control character: written visibly (report.sanitize_cell), the line stays one CSV line
    assert a.loc[0, "reason"] == 'line one\\nline "two", with commas' and a.loc[0, "max_abs"] == float("inf")
    assert report.rows_to_csv_text(rows[1:2], header=False).count("\n") == 1


def test_a_report_from_before_the_timing_columns_reads_and_resumes(tmp_path):
    old_cols = [c for c in report.COLUMNS if c not in report.LATER_COLUMNS]
    rows = [report.normalize_row(row("case_a", tensor=t, wall_ms=1.5)) for t in ("rowwise_data", "rowwise_scale")]
    pd.DataFrame(rows, columns=old_cols).to_csv(tmp_path / report.RESULTS, index=False, lineterminator="\n")
    df = report.read_results(tmp_path)
    assert list(df.columns) == list(report.COLUMNS) and df["check_ms"].isna().all() and (df["wall_ms"] == 1.5).all()
    w = report.ReportWriter(tmp_path, {}, resume=True)  # upgrades the header, keeps the rows
    assert w.completed == {("case_a", "reference")}
    w.write([row("case_b", tensor="rowwise_data", wall_ms=2.0, inputs_ms=3.0, golden_ms=4.0, check_ms=5.0)])
    w.close()
    df = report.read_results(tmp_path)
    assert df["case_id"].tolist() == ["case_a", "case_a", "case_b"]
    assert df["wall_ms"].tolist() == [1.5, 1.5, 2.0] and df.loc[2, "check_ms"] == 5.0 and pd.isna(df.loc[0, "check_ms"])
    assert report.time_split(df) == {"inputs": 0.003, "golden": 0.004, "backends": 0.005}


# ---- corrupt reports, resume of a cut pair, locks, refusals -----------------------------------------


def _good(tmp_path: Path) -> Path:
    return write_report(tmp_path / "good", [row("c1"), acc("c1"), row("c2"), acc("c2")])


@pytest.mark.parametrize("damage, line, words", [
    (lambda t: t.replace("\nc2,", "\nthis is not a row\nc2,", 1), 4, "1 cells, expected"),
    (lambda t: t + "c3,fp8_current,quantize\n", 6, "3 cells, expected"),
    (lambda t: t[:-7], 5, "cut short"),
    (lambda t: t.replace("case_id,", "case,", 1), 1, "header"),
    (lambda t: t.replace(",pass,", ",passed,", 1), 2, "status 'passed'"),
])
def test_a_corrupt_results_csv_is_an_error_naming_its_line(tmp_path, capsys, damage, line, words):
    p = _good(tmp_path) / report.RESULTS
    p.write_text(damage(p.read_text()))
    with pytest.raises(report.CorruptReport, match=rf"line {line}: .*{re.escape(words)}"):
        report.read_results(p.parent)
    assert cli.main(["report", str(p.parent), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"line {line}" in err and err.count("\n") == 1


def test_a_binary_results_csv_is_an_error_naming_its_line(tmp_path):
    p = _good(tmp_path) / report.RESULTS
    data = p.read_bytes()
    at = data.index(b"\n") + 10  # inside line 2
    p.write_bytes(data[:at] + b"\xff\xfe\x00\x01" + data[at:])
    with pytest.raises(report.CorruptReport, match=r"line 2: not UTF-8"):
        report.read_results(p.parent)


def test_resume_drops_a_cut_pair_whole_and_refuses_a_garbage_line(tmp_path):
    d = _good(tmp_path)
    p = d / report.RESULTS
    text = p.read_text()
    p.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 9])  # c2's accuracy row cut after 8 characters
    w = report.ReportWriter(d, {}, resume=True)
    assert w.completed == {("c1", "reference")}  # c2 lost its accuracy row: it runs again, whole
    assert w.notes and "re-running c2 [reference]" in w.notes[0]
    w.close()
    assert report.read_results(d)["case_id"].tolist() == ["c1", "c1"]
    p.write_text(p.read_text() + "garbage\n" + text.splitlines(keepends=True)[3])
    with pytest.raises(report.CorruptReport, match="line 4"):
        report.ReportWriter(d, {}, resume=True)


def test_a_report_directory_is_locked_and_a_fresh_run_refuses_a_previous_report(tmp_path):
    d = _good(tmp_path)
    with pytest.raises(report.ReportError, match=r"holds a previous report \(results.csv, run_meta.json\)"):
        report.ReportWriter(d, {})
    w = report.ReportWriter(d, {}, resume=True)
    with pytest.raises(report.ReportError, match=rf"in use by another run \(pid {os.getpid()}\)"):
        report.ReportWriter(d, {}, resume=True)
    w.close()
    report.ReportWriter(d, {}, resume=True).close()  # the lock went with the writer
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(report.ReportError, match="is a file"):
        report.ReportWriter(f, {})


def test_diff_counts_pairs_missing_from_new_as_regressions(tmp_path, capsys):
    old = _good(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / report.RESULTS).write_text(",".join(report.COLUMNS) + "\n")  # a header only
    regressions, _ = report.diff(report.read_results(old), report.read_results(empty))
    assert sorted(regressions) == ["missing from NEW: c1 [reference] (was pass)",
                                   "missing from NEW: c2 [reference] (was pass)"]
    assert cli.main(["diff", str(old), str(empty)]) == 1
    assert "2 regression(s)" in capsys.readouterr().out


def _pair_severity_one_by_one(df: pd.DataFrame) -> pd.DataFrame:
    """pair_severity's meaning, pair by pair (the oracle for its column operations)."""
    out = []
    for (case_id, backend), rows in df.groupby(["case_id", "backend"], sort=False):
        names: set[str] = set()
        for cell in rows["mismatch_classes"]:
            if cell:
                try:
                    names |= set(json.loads(cell))
                except ValueError:
                    names.add(str(cell))
        if (rows["status"] == "error").any():
            names.add("exception")
        deltas = rows.loc[rows["kind"] == "accuracy", "delta_sqnr_db"].dropna()
        first = rows.iloc[0]
        out.append({"case_id": case_id, "backend": backend, "scheme": first["scheme"],
                    "distribution": first["distribution"], "status": report.worst_status(rows["status"]),
                    "severity": str(first["severity"]), "matches_convention": str(first["matches_convention"]),
                    "classes": ",".join(sorted(names)) or "-",
                    "worst_delta_sqnr_db": float(deltas.min()) if len(deltas) else math.nan})
    return pd.DataFrame(out)


def _mixed_rows(seed: int = 3) -> pd.DataFrame:
    """400 report rows of 240 possible pairs with every status (an unknown one too), kinds, classes and deltas."""
    import random

    rnd = random.Random(seed)
    rows = []
    for _ in range(400):
        case, backend = f"c{rnd.randrange(120)}", rnd.choice(["native", "mine"])
        rows.append({"case_id": case, "backend": backend, "scheme": "s" + case[-1], "distribution": "normal",
                     "kind": rnd.choice(["conformance", "accuracy"]),
                     "status": rnd.choice(["pass", "pass", "info", "skip", "fail", "error", "odd"]),
                     "severity": rnd.choice(["exact", "degraded", ""]), "matches_convention": rnd.choice(["", "te"]),
                     "mismatch_classes": rnd.choice(["", "", '["tie_flip"]', '["other", "nan_sign"]', "not json"]),
                     "delta_sqnr_db": rnd.choice([math.nan, -1.5, 0.0, 2.25])})
    return pd.DataFrame(rows)


def test_pair_severity_equals_the_pair_by_pair_definition_on_mixed_rows():
    df = _mixed_rows()
    want = _pair_severity_one_by_one(df)
    got = report.pair_severity(df)
    assert len(got) == len(want) > 100 and set(got["status"]) >= {"pass", "fail", "error", "odd"}
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_dtype=False)


def test_case_status_equals_worst_status_pair_by_pair():
    """case_status's column operations against its meaning: per (case_id, backend) in order of first appearance,
    the first row's scheme and worst_status of the rows (info alone is a pass, an unknown status ranks as error
    and is kept as written); a frame with a non-range index gives the same."""
    df = _mixed_rows(5)
    want = pd.DataFrame([{"case_id": c, "backend": b, "scheme": rows["scheme"].iloc[0],
                          "status": report.worst_status(rows["status"])}
                         for (c, b), rows in df.groupby(["case_id", "backend"], sort=False)])
    got = report.case_status(df)
    assert len(got) > 100 and set(got["status"]) >= {"pass", "skip", "fail", "error", "odd"}
    pd.testing.assert_frame_equal(got, want)
    shuffled_index = df.set_axis(range(len(df) * 2, 0, -2))
    pd.testing.assert_frame_equal(report.case_status(shuffled_index), want)


def test_read_results_checks_the_file_unless_its_writer_says_it_is_checked(tmp_path):
    """harness run reads its own report back under the lock with checked=True (no second full csv pass):
    the same frame as the checked read; a file nobody checked is still refused line by line."""
    d = _good(tmp_path)
    pd.testing.assert_frame_equal(report.read_results(d, checked=True), report.read_results(d))
    p = d / report.RESULTS
    n = len(p.read_text().splitlines())
    p.write_text(p.read_text() + "garbage\n")
    with pytest.raises(report.CorruptReport, match=f"line {n + 1}: 1 cells"):
        report.read_results(d)


# ---- hostile text, a report removed under its writer, a full disk (issue #38) -----------------

HOSTILE = {  # what a backend controls -> the cell the report holds (report.sanitize_cell)
    "NUL \x00 byte": "NUL \\x00 byte",
    "\x1b[31mred\x1b[0m": "\\x1b[31mred\\x1b[0m",
    "lone \ud800 surrogate": "lone \\ud800 surrogate",
    '=HYPERLINK("http://x.example","click")': '\'=HYPERLINK("http://x.example","click")',
    "+cmd|' /C calc'!A0": "'+cmd|' /C calc'!A0",
    "-2+3": "'-2+3",
    "@SUM(A1)": "'@SUM(A1)",
    "\t=1": "'\\t=1",
    "\r=1": "'\\r=1",
    "two\nlines\x85and C1": "two\\nlines\\x85and C1",
    "bidi \u202e override": "bidi \\u202e override",
    "-3.5": "-3.5",  # a number stays a number
    "-inf": "-inf",
    "plain text, with commas": "plain text, with commas",
}


@pytest.mark.parametrize("text, cell", HOSTILE.items(), ids=range(len(HOSTILE)))
def test_sanitize_cell_escapes_controls_and_surrogates_and_quotes_formulas(text, cell):
    assert report.sanitize_cell(text) == cell
    assert report.sanitize_cell(cell) == cell  # idempotent: rows shipped as normalized rows pass unchanged
    cell.encode("utf-8")  # never raises (no surrogate left)


def test_normalize_row_sanitizes_text_columns_and_leaves_numbers_alone():
    n = report.normalize_row(row(reason="=1+1", backend="b\x1b", max_abs=-3.5, sqnr_db="-inf", delta_sqnr_db=-0.25,
                                 seed=-1, rht=True, shape="-8x8"))
    assert (n["reason"], n["backend"], n["shape"]) == ("'=1+1", "b\\x1b", "'-8x8")
    assert (n["max_abs"], n["sqnr_db"], n["delta_sqnr_db"], n["seed"], n["rht"]) == (-3.5, "-inf", -0.25, -1, True)


def test_hostile_reasons_and_backend_names_round_trip_through_the_writer_report_diff_and_resume(tmp_path, capsys):
    rows = [row("c1", backend="evil\x1b[2J", tensor="case", status="error", kind="conformance", reason=text,
                n=None, n_mismatch=None) for text in HOSTILE]
    rows = [dict(r, case_id=f"c{i}") for i, r in enumerate(rows)]
    d = write_report(tmp_path / "r", rows)
    df = report.read_results(d)
    assert df["reason"].tolist() == list(HOSTILE.values())
    assert set(df["backend"]) == {"evil\\x1b[2J"}
    assert cli.main(["report", str(d), "--no-plots", "--show", "100"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x00" not in out
    assert "  error c1 [evil\\x1b[2J] case: \\x1b[31mred\\x1b[0m" in out.splitlines()
    assert "  error c2 [evil\\x1b[2J] case: lone \\ud800 surrogate" in out.splitlines()
    new = write_report(tmp_path / "new", rows[1:])
    assert cli.main(["diff", str(d), str(new)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == "REGRESSION: missing from NEW: c0 [evil\\x1b[2J] (was error)"
    with report.ReportWriter(d, {"test": True}, resume=True) as w:  # the raw name finds its sanitized pair
        assert w.is_complete("c3", "evil\x1b[2J") and len(w.completed) == len(HOSTILE)


def test_report_prints_raw_escapes_of_a_report_written_before_the_sanitizer_visibly(tmp_path, capsys):
    r = report.normalize_row(row("c1", status="fail", reason="x"))
    r["reason"] = "\x1b]0;title\x07 then \x1b[31mred"  # a hand-written or older results.csv
    (tmp_path / report.RESULTS).write_text(",".join(report.COLUMNS) + "\n" + report.rows_to_csv_text([], False)
                                           + ",".join(f'"{r[c]}"' for c in report.COLUMNS) + "\n")
    assert cli.main(["report", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "  fail  c1 [reference] rowwise_data: \\x1b]0;title\\x07 then \\x1b[31mred" in out


def test_a_cell_over_the_limit_is_cut_and_the_report_still_reads(tmp_path):
    big = "x" * (report.CELL_LIMIT + 10)
    d = write_report(tmp_path / "r", [row(reason=big, first_mismatch={"chain": big})])
    df = report.read_results(d)
    assert df.loc[0, "reason"].endswith(f"... (cut: {len(big)} characters, over report.CELL_LIMIT)")
    assert len(df.loc[0, "reason"]) <= report.CELL_LIMIT
    cell = report.to_json({"chain": big})
    assert json.loads(df.loc[0, "first_mismatch"]) == {"cut": f"{len(cell)} characters, over report.CELL_LIMIT"}


def _pairs_on_disk(d: Path) -> list[tuple[str, str]]:
    df = report.read_results(d)
    return sorted(set(zip(df["case_id"], df["backend"], strict=True)))


@pytest.mark.parametrize("how", ["removed", "replaced", "directory removed"])
def test_a_results_csv_removed_or_replaced_under_the_writer_is_written_again_whole(tmp_path, capsys, how):
    d = tmp_path / "r"
    with report.ReportWriter(d, {"test": True}) as w:
        for c in ("a", "b", "c"):
            w.write([row(c), acc(c)])
        if how == "removed":
            (d / report.RESULTS).unlink()
        elif how == "replaced":
            (tmp_path / "other.csv").write_text("not,a,report\n")
            os.replace(tmp_path / "other.csv", d / report.RESULTS)
        else:
            import shutil  # noqa: PLC0415

            shutil.rmtree(d)
        w.write([row("d"), acc("d")])
        w.write([row("e")])
    assert _pairs_on_disk(d) == [(c, "reference") for c in "abcde"]
    assert len(report.read_results(d)) == 9
    size = sum(len(report.rows_to_csv_text([row(c), acc(c)], header=c == "a")) for c in "abc")
    note = (f"{d / report.RESULTS} was {how.split()[-1]} while the sweep wrote it; wrote it again from the writer's "
            f"own copy (6 rows, {size} bytes)")
    assert json.loads((d / report.META).read_text())["report_restored"] == [note]
    assert capsys.readouterr().err == f"harness: {note}\n"


def test_a_resumed_report_removed_under_the_writer_keeps_the_rows_it_had(tmp_path):
    d = write_report(tmp_path / "r", [row("a"), row("b")])
    with report.ReportWriter(d, {"test": True}, resume=True) as w:
        (d / report.RESULTS).unlink()
        w.write([row("c")])
    assert _pairs_on_disk(d) == [("a", "reference"), ("b", "reference"), ("c", "reference")]


@pytest.mark.parametrize("short", [False, True], ids=["enospc", "short-write-then-enospc"])
def test_a_full_disk_is_a_report_error_naming_the_file_and_the_finished_pairs_stay_resumable(tmp_path, monkeypatch,
                                                                                            short):
    import errno  # noqa: PLC0415

    d = tmp_path / "r"
    real = os.write
    with report.ReportWriter(d, {"test": True}) as w:
        for c in ("a", "b", "c"):
            w.write([row(c), acc(c)])

        def full(fd, data):
            if fd != w._fd:
                return real(fd, data)
            if short and len(data) > 10:
                return real(fd, bytes(data)[:len(data) // 2])  # half a pair, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(report.ReportError) as e:
            w.write([row("d"), acc("d")])
        monkeypatch.setattr(os, "write", real)
    assert str(e.value) == (f"cannot append to {d / report.RESULTS}: No space left on device; it keeps the 3 (case, "
                            "backend) pairs finished before, whole: free space (or fix the error) and continue with "
                            "--resume")
    assert report.check_results(d) == 6 and _pairs_on_disk(d) == [(c, "reference") for c in "abc"]
    with report.ReportWriter(d, {"test": True}, resume=True) as w:
        assert not w.notes and not w.is_complete("d", "reference")
        w.write([row("d"), acc("d")])
    assert _pairs_on_disk(d) == [(c, "reference") for c in "abcd"]


# ---- the selection a report records: --resume refuses another ---------------------------------


def _sel(**kw) -> dict:
    base = {"tier": None, "cases": "cases/mine.toml", "cases_sha256": "ab" * 32, "filter": "e4m3", "shard": None,
            "golden_device": "auto", "backends": ["reference", "torch"]}
    return {"selection": {**base, **kw}}


@pytest.mark.parametrize("new, says", [
    (_sel(backends=["torch", "reference"]), None),  # the order of --backend is not the selection
    (_sel(cases="elsewhere/mine.toml"), None),  # the same content at another path
    (_sel(filter="e5m2"), "made with --filter 'e4m3', this run has --filter 'e5m2'"),
    (_sel(filter=None), "made with --filter 'e4m3', this run has no --filter"),
    (_sel(shard="1/4"), "made with no --shard, this run has --shard '1/4'"),
    (_sel(cases_sha256="cd" * 32), "made with --cases 'cases/mine.toml' with content sha256 abababababab, this run "
                                   "has --cases 'cases/mine.toml' with content sha256 cdcdcdcdcdcd"),
    (_sel(cases=None, tier="smoke", cases_sha256="cd" * 32), "made with --cases 'cases/mine.toml', this run has "
                                                             "--tier 'smoke'"),
    (_sel(golden_device="cpu", backends=["native"]), "made with --golden-device 'auto' and --backend reference,torch, "
                                                     "this run has --golden-device 'cpu' and --backend native"),
])
def test_check_resume_names_what_changed_in_the_selection(new, says):
    from harness.meta import check_resume  # noqa: PLC0415

    assert check_resume(_sel(), new) == says


def test_check_resume_reads_the_options_of_a_report_made_before_the_selection_was_recorded():
    from harness.meta import check_resume  # noqa: PLC0415

    old = {"options": {"tier": None, "cases": None, "filter": "e4m3", "shard": None, "golden_device": "auto",
                       "backends": ["reference"]}}
    new = {"selection": {"tier": "smoke", "cases": None, "cases_sha256": "ab", "filter": "e4m3", "shard": None,
                         "golden_device": "auto", "backends": ["pkg.mod:obj"]}}
    assert check_resume(old, new) is None  # no digest, backend names are not specs: not compared
    assert check_resume(old, {"selection": {**new["selection"], "shard": "0/2"}}) == (
        "made with no --shard, this run has --shard '0/2'")
    assert check_resume({"merged_from": []}, new) is None


def test_resume_with_another_selection_refuses_before_touching_the_report_unless_resume_any(tmp_path):
    d = tmp_path / "r"
    with report.ReportWriter(d, _sel()) as w:
        w.write([row("a")])
        w.write([row("b")])
    before = (d / report.RESULTS).read_bytes() + b"cut"
    (d / report.RESULTS).write_bytes(before)  # a cut last line: resume would drop it, a refusal leaves it
    with pytest.raises(report.ReportError) as e:
        report.ReportWriter(d, _sel(filter="e5m2"), resume=True)
    assert str(e.value) == (f"--resume: the report at {d} was made with --filter 'e4m3', this run has --filter "
                            "'e5m2'; use another --out, or --force to replace it (--resume-any mixes them)")
    assert (d / report.RESULTS).read_bytes() == before
    with report.ReportWriter(d, _sel(filter="e5m2"), resume=True, resume_any=True) as w:
        assert w.is_complete("a", "reference") and not w.is_complete("b", "reference")  # b's line was cut
    meta = json.loads((d / report.META).read_text())
    assert meta["resumed_other_selection"] == "made with --filter 'e4m3', this run has --filter 'e5m2'"
    assert meta["selection"]["filter"] == "e5m2" and meta["resumed"] == 1


# ---- report directories that cannot be used ----------------------------------------------------


def test_check_out_dir_names_a_dangling_link_a_file_above_and_an_unwritable_directory(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a_file").write_text("x")
    cases = [
        (tmp_path / "gone", f"--out {str(tmp_path / 'gone')!r} is a symbolic link to {str(tmp_path / 'nowhere')!r}, "
                            "which does not exist; create that directory or choose another --out"),
        (tmp_path / "gone" / "sub", f"--out {str(tmp_path / 'gone' / 'sub')!r}: {str(tmp_path / 'gone')!r} is a "
                                    f"symbolic link to {str(tmp_path / 'nowhere')!r}, which does not exist; create "
                                    "that directory or choose another --out"),
        (tmp_path / "a_file", f"--out {str(tmp_path / 'a_file')!r} is a file; the report is a directory "
                              "(results.csv and run_meta.json are written inside it)"),
        (tmp_path / "a_file" / "sub" / "out", f"--out {str(tmp_path / 'a_file' / 'sub' / 'out')!r}: "
                                              f"{str(tmp_path / 'a_file')!r} is a file, not a directory; choose "
                                              "another --out"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        cases.append((ro / "out", f"--out {str(ro / 'out')!r}: no permission to write in {str(ro)!r}; choose "
                                  "another --out"))
    for path, message in cases:
        with pytest.raises(report.ReportError) as e:
            report.check_out_dir(path)
        assert str(e.value) == message
        with pytest.raises(report.ReportError):
            report.ReportWriter(path, {})
    assert not (tmp_path / "nowhere").exists()


def test_a_report_directory_the_system_refuses_is_a_report_error_naming_it(tmp_path):
    target = Path("/proc/harness-out")  # mkdir there fails even for root
    with pytest.raises(report.ReportError) as e:
        report.ReportWriter(target, {})
    if os.geteuid() == 0:  # past check_out_dir: the mkdir's own error
        assert str(e.value).startswith(f"cannot create the report directory '{target}': ")
        assert str(e.value).endswith("; choose another --out")
    else:
        assert str(e.value) == (f"report directory '{target}': no permission to write in '/proc'; choose another "
                                "report directory")
