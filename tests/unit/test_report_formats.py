"""The outputs people read (report.html, summary.md, junit.xml), the CI policy (--accept) and the plots' limits.

Source: issue #39 items 3 and 5; docs/numerics.md §11 (severities, the default policy), reports/README.md.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from harness import cli, plots, report, report_formats

from .test_report import acc, row, write_report

EVIL = "<script>alert(1)</script>&\x1b[31m|`*x*`\ufffe"


def mixed_rows() -> list[dict]:
    """exact, equivalent (fail), convention (fail), a GEMM inside its tolerance (pass, equivalent), an error, skips."""
    return [row("a", severity="exact"), acc("a"),
            row("b", backend="k", status="fail", severity="equivalent", n_mismatch=1, reason="1 of 64 differ"),
            row("c", backend="k", status="fail", severity="convention", n_mismatch=2, matches_convention="torchao_rceil"),
            row("g", backend="k", status="pass", severity="equivalent", op="gemm", tensor="out"),
            row("e", backend="k", status="error", severity="broken", tensor="case", reason="RuntimeError: boom"),
            *[row(f"s{i}", backend="k", status="skip", tensor="case", reason=f"no {i % 12}") for i in range(40)]]


@pytest.mark.parametrize(("accept", "bad"), [
    (("pass",), {"b", "c", "e"}),  # the default: today's rule (fail and error fail; the GEMM passes)
    (("exact",), {"b", "c", "g", "e"}),
    (("pass", "convention"), {"b", "e"}),
    (("exact", "convention", "equivalent"), {"e"}),
    (("exact", "broken", "equivalent", "convention"), set()),
    (("broken",), {"a", "b", "c", "g"}),
])
def test_unaccepted_pairs_follow_the_accept_list_skips_never_fail(tmp_path, accept, bad):
    df = report.read_results(write_report(tmp_path / "r", mixed_rows()))
    assert set(report.unaccepted(df, accept)["case_id"]) == bad


def test_parse_accept_and_the_project_file(tmp_path):
    assert report.parse_accept("exact, convention") == ("exact", "convention")
    assert report.parse_accept(["pass"]) == ("pass",)
    for bad in ("exact,skip", "exactly", "", ["exact", 3]):
        with pytest.raises(report.ReportError):
            report.parse_accept(bad)
    assert report.accept_policy(None, tmp_path) == (("pass",), "default")
    (tmp_path / "pyproject.toml").write_text('[tool.numerics-harness]\naccept = ["exact", "convention"]\n')
    assert report.accept_policy(None, tmp_path) == (("exact", "convention"), str(tmp_path / "pyproject.toml"))
    assert report.accept_policy("degraded", tmp_path) == (("degraded",), "--accept")  # the flag wins
    (tmp_path / "pyproject.toml").write_text('[tool.numerics-harness]\naccept = ["nope"]\n')
    with pytest.raises(report.ReportError, match="pyproject.toml"):
        report.accept_policy(None, tmp_path)


def test_report_exit_codes_follow_the_policy(tmp_path, capsys, monkeypatch):
    d = write_report(tmp_path / "r", mixed_rows())
    monkeypatch.chdir(tmp_path)
    base = ["report", str(d), "--no-plots", "--format", "none"]
    assert cli.main(base) == 0  # no policy given: report exits 0, as before
    assert cli.main([*base, "--accept", "pass"]) == 1
    assert cli.main([*base, "--accept", "exact,broken,equivalent,convention"]) == 0
    assert cli.main([*base, "--accept", "exact,skip"]) == 2
    assert "skips never fail" in capsys.readouterr().err
    (tmp_path / "pyproject.toml").write_text('[tool.numerics-harness]\naccept = "exact,convention,equivalent,broken"\n')
    assert cli.main(base) == 0
    assert "accept exact,convention,equivalent,broken (pyproject.toml): every" in capsys.readouterr().out
    assert cli.main([*base, "--accept", "exact"]) == 1  # the flag wins


def test_skips_print_grouped_after_the_verdict_and_short(tmp_path):
    df = report.read_results(write_report(tmp_path / "r", mixed_rows()))
    text = report.format_summary(df)
    assert text.index("worst_delta_sqnr_db") < text.index("skip reasons")
    assert "skip reasons: 40 skipped rows, 12 distinct reasons (the 10 most frequent)\n" in text
    assert "... and 2 more reasons" in text
    assert len(text.split("skip reasons", 1)[1].splitlines()) == 1 + 2 + 10 + 1


def test_summary_md_html_and_junit_escape_backend_text(tmp_path):
    rows = [*mixed_rows(), row("x", backend="evil", status="fail", severity="degraded", reason=EVIL,
                               first_mismatch={"where": EVIL}),
            row("y", backend="evil", status="skip", tensor="case", reason=EVIL)]
    d = write_report(tmp_path / "r", rows)
    df = report.read_results(d)
    files = report_formats.write_formats(df, d, accept=("pass",))
    assert [p.name for p in files] == ["report.html", "summary.md", "junit.xml"]
    html = (d / "report.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html and "\x1b" not in html
    assert "FAIL" in html and "Failing pairs (4)" in html
    md = (d / "summary.md").read_text()
    assert md.startswith("## numerics-harness: FAIL") and "<script>" not in md and "&lt;script&gt;" in md
    assert "**4 pair(s) outside it.**" in md and "### Skip reasons (41 skipped, 13 distinct, top 10)" in md
    assert "\\|" in md and "\x1b" not in md
    root = ET.parse(d / "junit.xml").getroot()
    assert root.attrib == {"name": "numerics-harness", "tests": "47", "failures": "4", "skipped": "41"}
    cases = {(tc.get("classname"), tc.get("name")): tc for s in root for tc in s}
    evil = cases[("numerics.fp8_current.evil", "x")]
    assert evil.find("failure").get("type") == "degraded" and "<script>" in evil.find("failure").get("message")
    assert cases[("numerics.fp8_current.k", "s3")].find("skipped").get("message") == "no 3"
    assert cases[("numerics.fp8_current.k", "g")].find("failure") is None  # inside the tolerance: passes
    assert cases[("numerics.fp8_current.k", "e")].find("failure").get("type") == "broken"


def test_html_embeds_plots_and_formats_parse(tmp_path):
    pytest.importorskip("matplotlib")
    d = write_report(tmp_path / "r", [row("a", ulp_hist={"0": 60, "1": 4}, mismatch_frac=4 / 64), acc("a")])
    df = report.read_results(d)
    written, _ = plots.write_plots(df, d / "plots")
    report_formats.write_formats(df, d, ("html",), plots=written)
    html = (d / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(written) >= 2
    assert report_formats.parse_formats("md,junit") == ("md", "junit") and report_formats.parse_formats("none") == ()
    with pytest.raises(report.ReportError):
        report_formats.parse_formats("pdf")


def test_plots_skip_an_empty_heatmap_and_keep_the_ulp_chart_compact(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    clean = [row(f"c{i}", backend=f"b{i}", mismatch_frac=0.0, ulp_hist={"0": 64}, shape=f"{i}x8") for i in range(60)]
    d = write_report(tmp_path / "clean", [*clean, acc("c0")])
    files, _ = plots.write_plots(report.read_results(d), d / "plots")
    assert {p.name for p in files} == {"sqnr_by_toggle.png"}  # no heatmap, no ULP chart: nothing off the golden
    off = [row(f"c{i}", backend=f"b{i}", mismatch_frac=0.5, ulp_hist={"0": 32, "1": 32}) for i in range(60)]
    d = write_report(tmp_path / "off", off)
    files, _ = plots.write_plots(report.read_results(d), d / "plots")
    w, h = Image.open(d / "plots" / "ulp_hist.png").size
    assert h <= 100 * (0.4 * plots.ULP_MAX_ROWS + 2) and w < 2000


# ---- kernel against kernel (#39 item 4) -------------------------------------------------------


def test_pair_diff_compares_backend_a_of_old_with_backend_b_of_new(tmp_path, capsys):
    d = write_report(tmp_path / "r", [row("a"), row("a", backend="k"), row("b"),
                                      row("b", backend="k", status="fail", severity="equivalent", n_mismatch=3)])
    df = report.read_results(d)
    diffs, notes = report.pair_diff(df, df, "reference", "k")
    assert diffs == ["b: reference pass/-, k fail/equivalent", "b rowwise_data: mismatches vs golden reference 0, k 3"]
    assert report.pair_diff(df, df, "reference", "reference") == ([], [])
    assert cli.main(["diff", str(d), str(d), "--pair", "reference:k"]) == 1
    assert cli.main(["diff", str(d), str(d), "--pair", "k:k"]) == 0
    assert cli.main(["diff", str(d), str(d), "--bitwise"]) == 2  # --bitwise needs --pair


def test_bitwise_diff_counts_differing_elements_per_tensor(tmp_path, capsys):
    import torch

    from harness.artefacts import plain_outputs, save_outputs

    d = write_report(tmp_path / "r", [row("c1"), row("c1", backend="k")])
    x = torch.arange(8, dtype=torch.uint8)
    s = torch.tensor([0.5, -0.0])
    save_outputs(d, "c1", "reference", plain_outputs({"q": {"data": x, "scale": s}}))
    y = x.clone()
    y[[1, 5]] += 1
    save_outputs(d, "c1", "k", plain_outputs({"q": {"data": y, "scale": torch.tensor([0.5, 0.0])}}))
    diffs, _ = report.bitwise_diff(d, d, "reference", "k")
    assert diffs == ["c1: q.data 2 of 8 elements differ; q.scale 1 of 2 elements differ"]  # -0.0 != 0.0 in bytes
    assert report.bitwise_diff(d, d, "k", "k") == ([], [])
    capsys.readouterr()
    assert cli.main(["diff", str(d), str(d), "--pair", "reference:k", "--bitwise"]) == 1
    assert "DIFFERS: c1: q.data 2 of 8 elements differ" in capsys.readouterr().out
    assert cli.main(["diff", str(tmp_path), str(d), "--pair", "a:b", "--bitwise"]) == 2  # no outputs/ there
