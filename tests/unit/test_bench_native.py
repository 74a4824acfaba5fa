"""benchmarks/bench_native.py's tables on the CPU: byte counts, goals, host-cost columns, --dry-run.

The GPU timings themselves need a device (the lead runs the script); these tests prove the table-building
code is right on hand-computed numbers and that the script's CPU path does not crash.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_native as bn  # noqa: E402

import reference  # noqa: E402

ROWS = {r.name: r for r in bn.ROWS}
X_BYTES = 256 * 256 * 2  # bf16 256x256


def out_bytes(row) -> int:
    x = torch.zeros(256, 256, dtype=torch.bfloat16)
    amax = torch.ones(1) if row.given_amax else None
    q = reference.quantize(x, row.config, rowwise=True, colwise=True,
                           rng=bn.SEED if row.config.stochastic else None, amax=amax)
    return bn.output_bytes(q)


@pytest.mark.parametrize(
    "name, outputs, reads",
    [
        # E2M1 codes 2 x [256, 128] bytes; UE4M3 scales 2 x [roundup(256,128), roundup(16,4)]; two fp32 amaxes.
        ("nvfp4 1x16 row+col", 2 * 256 * 128 + 2 * 256 * 16 + 2 * 4, 2),
        ("nvfp4 1x16 RHT+SR row+col", 2 * 256 * 128 + 2 * 256 * 16 + 2 * 4, 2),
        ("nvfp4 1x16 given amax row+col", 2 * 256 * 128 + 2 * 256 * 16 + 2 * 4, 1),
        # E4M3 codes 2 x 256^2; fp32 sinv rowwise [2, 256] and colwise [2, 256].
        ("fp8_block 1x128 row+col", 2 * 256 * 256 + 2 * 2 * 256 * 4, 1),
        # E4M3 codes 2 x 256^2; E8M0 scales rowwise [256, 8], colwise [8, 256].
        ("mxfp8 1x32 row+col", 2 * 256 * 256 + 2 * 8 * 256, 1),
    ],
)
def test_byte_counts(name, outputs, reads):
    row = ROWS[name]
    assert out_bytes(row) == outputs
    assert bn.input_reads(row) == reads
    assert bn.byte_counts(row, X_BYTES, outputs) == (X_BYTES + outputs, reads * X_BYTES + outputs)


def test_goals_are_the_issues():
    # Issue 18: own amax 1-D >= 0.80 and RHT + SR >= 0.50 on 2|X| + outputs, given amax >= 0.70 on one read.
    assert ROWS["nvfp4 1x16 row+col"].goal == 0.80
    assert ROWS["nvfp4 1x16 RHT+SR row+col"].goal == 0.50
    assert ROWS["nvfp4 1x16 given amax row+col"].goal == 0.70 and ROWS["nvfp4 1x16 given amax row+col"].given_amax
    assert bn.HOST_GOAL_US == 15.0 and bn.B2B_GOAL == 0.95


def test_quant_record_fractions_and_host_cost():
    row = ROWS["nvfp4 1x16 row+col"]
    t = bn.Timing(stream_ms=0.004, event_ms=0.008, host_ms=0.05, kernel_ms=0.003, issue_us=16.0, queued_ms=0.0032)
    rec = bn.quant_record(row, "256x256", X_BYTES, 73736, t, bw_gbps=100.0)
    # contract = 2*131072 + 73736 = 335880 B; in 4 us that is 83.97 GB/s = 0.8397 of 100 GB/s.
    assert rec["bytes"] == 335880 and rec["bytes_1read"] == 204808
    assert rec["frac"] == pytest.approx(0.8397, rel=1e-12)
    assert rec["frac_1read"] == pytest.approx(0.51202, rel=1e-12)
    assert rec["frac_kernel"] == pytest.approx(335880 / 3e-6 / 1e9 / 100.0, rel=1e-12)
    assert rec["queued_ms"] == 0.0032 and rec["frac_queued"] == pytest.approx(335880 / 3.2e-6 / 1e9 / 100.0, rel=1e-12)
    assert rec["ovh_us"] == pytest.approx(1.0, rel=1e-9)  # 4 us back to back - 3 us kernel
    assert rec["meets_goal"] is True and rec["meets_host_goal"] is False  # 16 us > 15 us
    assert rec["meets_b2b_goal"] is None  # the b2b goal is the FP8 quantizers'
    line = bn.quant_line(rec)
    assert "0.84" in line and "0.80" in line and "meets goal" in line and "HOST OVER" in line
    assert "   0.004    0.003 " in line and " 1.05 " in line  # strm_ms then q_ms; frac_q after the goal


def test_fp8_b2b_goal():
    row = ROWS["fp8_block 1x128 row+col"]
    for kern, ok in ((0.0095, True), (0.0094, False)):  # b2b/k = 0.95 exactly, then 0.94
        t = bn.Timing(stream_ms=0.01, event_ms=0.01, host_ms=0.01, kernel_ms=kern, issue_us=5.0)
        rec = bn.quant_record(row, "256x256", X_BYTES, 135168, t, bw_gbps=100.0)
        assert rec["meets_b2b_goal"] is ok and rec["meets_host_goal"] is True
    no_profile = bn.Timing(stream_ms=0.01, event_ms=0.01, host_ms=0.01, kernel_ms=None, issue_us=5.0)
    rec = bn.quant_record(row, "256x256", X_BYTES, 135168, no_profile, bw_gbps=100.0)
    assert rec["frac_kernel"] is None and rec["ovh_us"] is None and rec["meets_b2b_goal"] is None
    assert rec["queued_ms"] is None and rec["frac_queued"] is None  # not measured
    assert "-" in bn.quant_line(rec)


def test_per_call_ms_splits_activities_by_call():
    from timing import per_call_ms

    # three calls of two activities each (a memset and a kernel), in issue order, (start, end) in us: apart, with a
    # gap between them (not activity), and a programmatic kernel started 40 us before the one before it ends
    calls = [(0.0, 1.0), (3.0, 703.0), (1000.0, 1001.0), (1001.0, 1961.0), (2000.0, 2500.0), (2460.0, 2760.0)]
    assert per_call_ms(calls, 3) == pytest.approx([0.701, 0.961, 0.760], rel=1e-12)
    assert per_call_ms(calls[:5], 3) is None  # 5 activities: which belongs to which call?
    assert per_call_ms([], 3) is None


def test_busy_us_counts_overlapping_activities_once():
    from timing import busy_us

    assert busy_us([]) == 0.0
    assert busy_us([(10.0, 20.0), (30.0, 35.0)]) == 15.0  # apart: the sum, the gap not counted
    assert busy_us([(10.0, 20.0), (15.0, 25.0)]) == 15.0  # overlapping: once
    assert busy_us([(15.0, 25.0), (10.0, 20.0)]) == 15.0  # in any order
    assert busy_us([(10.0, 40.0), (12.0, 18.0), (20.0, 30.0), (39.0, 45.0)]) == 35.0  # nested and chained
    assert busy_us([(10.0, 20.0), (20.0, 30.0)]) == 20.0  # touching


def test_time_call_alternates_stream_and_profiled_runs(monkeypatch):
    """Each back-to-back run is followed by a profiled run; the kernel time is the median of the runs' means and its
    range spans every run's least and most call."""
    from timing import KernelTime

    order, kts = [], iter([KernelTime(0.9, 0.8, 1.0), KernelTime(0.7, 0.6, 0.75), KernelTime(0.8, None, None)])
    monkeypatch.setattr(bn.torch.cuda, "synchronize", lambda: None)
    holds = []

    def fake_stream_ms(fn, iters, runs, hold_s=None):
        order.append("stream" if hold_s is None else "queued")
        if hold_s is not None:
            holds.append(hold_s)
        return [1.0 + len(order)]

    monkeypatch.setattr(bn, "stream_ms", fake_stream_ms)
    monkeypatch.setattr(bn, "hold_estimate", lambda fn, iters: 0.25)
    monkeypatch.setattr(bn, "kernel_time", lambda fn, iters: order.append("profile") or next(kts))
    for name in ("event_ms", "host_ms", "issue_us"):
        monkeypatch.setattr(bn, name, lambda fn, iters: [5.0])
    t = bn.time_call(lambda: None, iters=4, warmup=0, profile=True, queued=True)
    assert order == ["stream", "queued", "profile"] * bn.ALTERNATIONS and holds == [0.25] * bn.ALTERNATIONS
    assert t.stream_ms == 5.0 and t.queued_ms == 6.0  # medians of (2, 5, 8) and (3, 6, 9)
    assert t.kernel_ms == 0.8  # the median of (0.9, 0.7, 0.8)
    assert t.kernel_range == (0.6, 1.0)  # the third run's calls did not split evenly: no range from it
    order.clear()
    plain = bn.time_call(lambda: None, iters=4, warmup=0, profile=False)
    assert plain.kernel_ms is None and plain.queued_ms is None
    assert order == ["stream"] * bn.ALTERNATIONS


def test_gemm_record_host_goal():
    t = bn.Timing(stream_ms=2.0, event_ms=2.0, host_ms=2.0, kernel_ms=1.9, issue_us=80.0, kernel_range=(1.7, 2.25))
    nat = bn.gemm_record("native", 2 * 8192**3, t, torch_issue_us=70.0)
    assert (nat["kernel_min_ms"], nat["kernel_max_ms"]) == (1.7, 2.25) and " 1.700-2.250 " in bn.gemm_line(nat)
    assert nat["tflops"] == pytest.approx(2 * 8192**3 / 2e-3 / 1e12, rel=1e-12)
    assert nat["ovh_us"] == pytest.approx(100.0, rel=1e-9) and nat["meets_host_goal"] is False
    assert "HOST OVER" in bn.gemm_line(nat)
    assert bn.gemm_record("native", 1, t, torch_issue_us=80.0)["meets_host_goal"] is True
    assert bn.gemm_record("torch", 1, t, torch_issue_us=None)["meets_host_goal"] is None


def test_dry_run_prints_every_row(capsys):
    assert bn.main(["--dry-run", "--size", "256"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for r in bn.ROWS:
        (line,) = [ln for ln in lines if ln.startswith(r.name + " ")]
        assert f"{r.goal:.2f}" in line if r.goal is not None else " - " in line
    assert any(ln.startswith("GEMM (M=N=K)") for ln in lines) and "torch._scaled_mm" in out
