"""benchmarks/bench_host.py on the CPU: argument parsing, the goals, the table and --dry-run (no GPU needed).

The timings need a device (the lead runs the script); these tests prove the rows are valid calls (each runs on the
CPU reference in --dry-run), that the goals are the issue's and that PASS / MISS and the exit codes follow them.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_host as bh  # noqa: E402


def test_arguments_parse_and_bad_ones_are_refused():
    args = bh.parse([])
    assert (args.size, args.iters, args.runs, args.warmup, args.only, args.dry_run) == (256, 100, 5, 20, None, False)
    args = bh.parse(["--size", "512", "--iters", "10", "--runs", "1", "--only", "nvfp4", "--dry-run", "--check-goals"])
    assert (args.size, args.iters, args.runs, args.only, args.dry_run, args.check_goals) == (512, 10, 1, "nvfp4",
                                                                                            True, True)
    for bad in (["--size", "100"], ["--iters", "0"], ["--runs", "-1"], ["--size", "x"]):
        with pytest.raises(SystemExit):
            bh.parse(bad)


def test_goals_and_results():
    assert bh.QUANTIZE_GOAL_US == 15.0  # issue 18 item 2
    assert bh.result(14.9, 15.0) == "PASS" and bh.result(15.0, 15.0) == "PASS" and bh.result(15.1, 15.0) == "MISS"
    assert bh.result(None, 15.0) == bh.result(3.0, None) == "n/a"
    names = [r.name for r in bh.QUANT_ROWS]
    for want in ("fp8_delayed", "fp8_current e4m3", "fp8_current given amax", "mxfp8", "fp8_block 1x128",
                 "nvfp4 1x16", "nvfp4 16x16", "nvfp4 RHT", "nvfp4 SR", "nvfp4 RHT+SR", "nvfp4 given amax",
                 "nvfp4 4over6", "nvfp4 row-scaled"):  # fmt: skip
        assert any(n.startswith(want) for n in names), want
    assert [r[0] for r in bh.GEMM_ROWS] == ["fp8_current", "mxfp8", "fp8_block 1x128 x 128x128", "nvfp4"]


def test_dry_run_builds_the_table(tmp_path, capsys):
    out = tmp_path / "host.csv"
    assert bh.main(["--dry-run", "--size", "128", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "DRY RUN" in text and "nvfp4 RHT+SR" in text and "torch._scaled_mm" in text
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(bh.QUANT_ROWS) + 1 + len(bh.GEMM_ROWS)
    assert {r["result"] for r in rows if r["kind"] == "quantize"} == {"PASS"}  # placeholder 10 us <= 15 us
    assert {(r["out_us"], r["out_result"]) for r in rows if r["kind"] == "quantize"} == {("8.0", "PASS")}
    # GEMM rows: the in-place native.gemm(..., out=) column against _scaled_mm's goal; none for _scaled_mm itself.
    assert {(r["name"].startswith("native.gemm"), r["out_us"], r["out_result"]) for r in rows if r["kind"] == "gemm"} \
        == {(True, "16.0", "PASS"), (False, "", "n/a")}  # fmt: skip
    # --only filters rows; --check-goals fails on a MISS.
    assert bh.main(["--dry-run", "--size", "128", "--only", "mxfp8"]) == 0
    text = capsys.readouterr().out
    assert "mxfp8 1x32" in text and "fp8_block 1x128 " not in text
    miss = bh.record("quantize", "slow", 100.0, 16.0, bh.QUANTIZE_GOAL_US)
    assert miss["result"] == "MISS" and "MISS" in bh.table([miss])
    both = bh.record("quantize", "in place", 100.0, 16.0, bh.QUANTIZE_GOAL_US, out=12.0)
    assert (both["result"], both["out_result"]) == ("MISS", "PASS") and "12.0" in bh.table([both])
