"""benchmarks/bench_native.py runs end to end on a GPU (small input, few iterations; no timing asserted).

Checks that every quantizer row prints (or prints why native skips it, e.g. a given amax without a kernel),
that the GEMM host-cost table prints next to torch._scaled_mm, and that the CSV carries both byte counts.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_bench_native_small_run(tmp_path, capsys):
    import bench_native as bn

    out = tmp_path / "bench.csv"
    assert bn.main(["--size", "256", "--iters", "3", "--warmup", "1", "--copy-mib", "16", "--gemm-size", "256",
                    "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for r in bn.ROWS:
        assert any(ln.startswith(r.name + " ") for ln in text.splitlines()), r.name
    assert "torch._scaled_mm" in text and "native.gemm" in text
    rows = {r["name"]: r for r in csv.DictReader(out.open())}
    own = rows["nvfp4 1x16 row+col"]
    assert int(own["bytes"]) - int(own["bytes_1read"]) == 256 * 256 * 2  # the second read of X
    assert own["verify"] == "ok" and float(own["issue_us"]) > 0


def test_issue_us_hold_times_the_host_not_the_gpu():
    """timing.issue_us with a hold: calls whose GPU work (a 1 ms spin each) far outlasts their host work are timed
    at their host cost (the spin queued first is still running when the last call is issued, which issue_us
    checks), and a hold that ends before the last call is issued raises instead of returning a time."""
    import torch
    from timing import issue_us

    spin = lambda: torch.cuda._sleep(2_000_000)  # noqa: E731 - >= 1 ms of GPU time a call at <= 2 GHz
    held = issue_us(spin, 50, runs=1, hold_s=0.5)[0]
    assert held < 200.0, f"{held:.1f} us a call with the GPU held: the GPU's pace (>= 1000 us), not the host's"
    with pytest.raises(RuntimeError, match="GPU was idle"):
        issue_us(lambda: torch.cuda._sleep(1), 200, runs=1, hold_s=1e-7)


def test_stream_ms_hold_times_the_gpu_not_the_host():
    """timing.stream_ms with a hold: calls whose host work (a 1 ms sleep) far outlasts their GPU work (a ~10 us spin)
    are timed at the GPU's back-to-back pace, where the plain run is the host's; a hold that ends before the last
    call is issued raises HoldTooShort instead of returning a time."""
    import time

    import torch
    from timing import HoldTooShort, stream_ms

    def call():
        time.sleep(0.001)
        torch.cuda._sleep(20_000)  # 8 - 20 us at 1 - 2.5 GHz

    plain = stream_ms(call, 30, runs=1)[0]
    queued = stream_ms(call, 30, runs=1, hold_s=0.5)[0]
    assert plain >= 0.9, f"{plain:.3f} ms a call unheld: the host's sleep sets the pace"
    assert queued < 0.2, f"{queued:.3f} ms a call held: the GPU's pace (~0.01 ms), not the host's (>= 1 ms)"
    with pytest.raises(HoldTooShort, match="GPU was idle"):
        stream_ms(call, 30, runs=1, hold_s=1e-7)


def test_kernel_time_per_call_activity():
    """timing.kernel_time: the mean GPU activity of a call of two kernels is their sum (idle time between calls does
    not count), its least and most bracket the mean; calls whose kernel count varies get no least and most."""
    import time

    import torch
    from timing import kernel_time

    spin = lambda n: torch.cuda._sleep(n)  # noqa: E731 - 1e6 cycles: 0.4 - 1 ms at 1 - 2.5 GHz
    spin(1_000_000)
    one = kernel_time(lambda: spin(1_000_000), 10)

    def pair_then_idle():
        spin(1_000_000)
        spin(2_000_000)
        torch.cuda.synchronize()
        time.sleep(0.002)  # GPU idle: not activity

    pair = kernel_time(pair_then_idle, 10)
    after = kernel_time(lambda: spin(1_000_000), 10)  # the clock may move between the rows (15 workers on one GPU)
    assert one is not None and pair is not None and after is not None
    slow, fast = sorted((one.mean_ms, after.mean_ms), reverse=True)
    assert 0.85 * 3 * fast <= pair.mean_ms <= 1.15 * 3 * slow, (one, pair, after)
    assert one.low_ms <= one.mean_ms <= one.high_ms and pair.low_ms <= pair.mean_ms <= pair.high_ms
    calls = iter(range(10))
    ragged = kernel_time(lambda: [spin(100_000) for _ in range(1 + next(calls) % 2)], 9)  # 1, 2, 1, ... kernels
    assert ragged is not None and ragged.low_ms is None and ragged.high_ms is None


def test_kernel_time_counts_overlapping_activity_once():
    """timing.kernel_time: two spins that run at once (one on a side stream) are the time at least one runs, about
    one spin's, not the sum of their durations (two spins'), as a programmatic kernel that starts in the tail of
    the kernel before it must not count that tail twice (docs/design.md §4.1)."""
    import torch
    from timing import kernel_time

    spin = lambda: torch.cuda._sleep(1_000_000)  # noqa: E731 - 0.4 - 1 ms at 1 - 2.5 GHz
    side = torch.cuda.Stream()

    def both():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        spin()
        with torch.cuda.stream(side):
            spin()
        main.wait_stream(side)

    spin()
    one = kernel_time(spin, 10)
    two = kernel_time(both, 10)
    assert one is not None and two is not None
    assert 0.9 * one.mean_ms <= two.mean_ms <= 1.5 * one.mean_ms, (one, two)  # summed, it reads ~2x


def test_bench_host_small_run(tmp_path, capsys):
    """benchmarks/bench_host.py end to end on the nvfp4 rows (few calls; no timing asserted): every quantize row has
    its out= time and both pieces of a fresh call (floor = alloc + launch), the GEMM row its own torch._scaled_mm
    goal measured alternately, and one bound launch of the first row's last kernel is timed."""
    import bench_host as bh

    out = tmp_path / "host.csv"
    assert bh.main(["--iters", "5", "--runs", "1", "--warmup", "2", "--only", "nvfp4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# one cuLaunchKernelEx (nvfp4 1x16's nvfp4_quantize_bf16, parameters bound): " in text  # (programmatic)
    rows = list(csv.DictReader(out.open()))
    quant = [r for r in rows if r["kind"] == "quantize"]
    assert [r["name"] for r in quant] == [r.name for r in bh.QUANT_ROWS if "nvfp4" in r.name]
    for r in quant:
        alloc, launch, floor = float(r["alloc_us"]), float(r["launch_us"]), float(r["floor_us"])
        assert alloc > 0 and launch > 0 and float(r["out_us"]) > 0 and floor == pytest.approx(alloc + launch), r
        assert r["floor"] == ("> goal" if floor > bh.QUANTIZE_GOAL_US else ""), r
    gemm = {r["name"]: r for r in rows if r["kind"] == "gemm"}
    assert set(gemm) == {bh.TORCH_GEMM, "native.gemm nvfp4 (portable)"}
    assert float(gemm["native.gemm nvfp4 (portable)"]["goal_us"]) > 0
