"""benchmarks/bench_host.py on the CPU: argument parsing, the goals, the table and --dry-run (no GPU needed).

The timings need a device (the lead runs the script); these tests prove the rows are valid calls (each runs on the
CPU reference in --dry-run), that the goals are the issue's and that PASS / MISS and the exit codes follow them.
"""

from __future__ import annotations

import csv
import statistics
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
    # The pieces of a fresh call: alloc + launch = floor, flagged only when above the goal.
    assert {(r["alloc_us"], r["launch_us"], r["floor_us"], r["floor"]) for r in rows if r["kind"] == "quantize"} \
        == {("5.0", "4.0", "9.0", "")}  # fmt: skip
    # GEMM rows: the in-place native.gemm(..., out=) column against _scaled_mm's goal; none for _scaled_mm itself.
    assert {(r["name"].startswith("native.gemm"), r["out_us"], r["out_result"]) for r in rows if r["kind"] == "gemm"} \
        == {(True, "16.0", "PASS"), (False, "", "n/a")}  # fmt: skip
    # --only filters rows; --check-goals fails on a MISS.
    assert bh.main(["--dry-run", "--size", "128", "--only", "mxfp8"]) == 0
    text = capsys.readouterr().out
    assert "mxfp8 1x32" in text and "fp8_block 1x128 " not in text
    miss = bh.record("quantize", "slow", 100.0, 16.0, bh.QUANTIZE_GOAL_US)
    assert miss["result"] == "MISS" and "MISS" in bh.table([miss])
    over = bh.record("quantize", "pieces", 100.0, 30.0, bh.QUANTIZE_GOAL_US, out=14.0, alloc=9.5, launch=5.75)
    assert (over["floor_us"], over["floor"]) == (15.25, "> goal") and "> goal" in bh.table([over])
    under = bh.record("quantize", "pieces", 100.0, 30.0, bh.QUANTIZE_GOAL_US, out=14.0, alloc=9.5, launch=5.5)
    assert (under["floor_us"], under["floor"]) == (15.0, "")
    both = bh.record("quantize", "in place", 100.0, 16.0, bh.QUANTIZE_GOAL_US, out=12.0)
    assert (both["result"], both["out_result"]) == ("MISS", "PASS") and "12.0" in bh.table([both])


def test_measure_alternating_interleaves_runs_and_holds_longer_after_a_stall(monkeypatch):
    """Runs alternate between the calls (a, b, a, b, ...); a run whose issuing outlasted its hold (issue_us raises
    timing.HoldTooShort) is run again with a 4x longer hold, which later runs of that call keep; a call that stalls
    every time raises."""
    import timing

    log, stalls = [], {"b": 1}

    def fake_issue_us(call, iters, runs, hold_s):
        name = call()
        log.append((name, hold_s))
        if stalls.get(name, 0) > 0:
            stalls[name] -= 1
            raise timing.HoldTooShort("issue_us: the GPU was idle before the last call")
        return [{"a": 1.0, "b": 2.0}[name] + len(log)]

    monkeypatch.setattr(bh, "issue_us", fake_issue_us)
    monkeypatch.setattr(bh.torch.cuda, "synchronize", lambda: None)
    args = bh.parse(["--runs", "2", "--warmup", "0"])
    a, b = bh.measure_alternating([lambda: "a", lambda: "b"], args)
    assert [n for n, _ in log] == ["a", "b", "b", "a", "b"]
    hold_a, hold_b = log[0][1], log[1][1]
    assert log[2][1] == 4 * hold_b and log[4][1] == 4 * hold_b and log[3][1] == hold_a
    assert (a, b) == (statistics.median([1.0 + 1, 1.0 + 4]), statistics.median([2.0 + 3, 2.0 + 5]))
    log.clear()
    stalls["b"] = timing.HOLD_RETRIES + 1
    with pytest.raises(timing.HoldTooShort, match="GPU was idle"):
        bh.measure_alternating([lambda: "b"], args)
    assert len(log) == timing.HOLD_RETRIES + 1
