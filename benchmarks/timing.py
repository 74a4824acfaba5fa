"""CUDA timing of one benchmark call, five ways; shared by benchmarks/bench_native.py and bench_gemm.py.

- event_ms: CUDA events around one call, the GPU idle before it (synchronize), so the interval
  includes the call's launch latency and whatever host work precedes its first kernel;
- stream_ms: `iters` calls issued back to back between two events, divided by `iters`: the
  throughput a caller that keeps the GPU fed sees (host cost counts only where it exceeds GPU time); with a hold
  (a spin kernel queued before the first event, still running when the last call is issued) the calls run from a
  full queue, so the time is the GPU's alone (its launch gaps included) however slowly the host issues;
- host_ms: host clock around synchronize -> call -> synchronize (all Python overhead included);
- kernel_time: the call's GPU activity (kernels, memsets, copies) from CUPTI via torch.profiler, over as many calls as
  the other timings (mean, and the least and most of one call: a power-capped 8192^3 FP8 GEMM's kernel took 0.70 -
  0.96 ms within 20 calls on an H200, so five calls' mean could come out above another run's back-to-back time);
  the time at least one activity runs, so activities that overlap (a kernel launched programmatically starts in
  the tail of the one before it and waits there: docs/design.md §4.1) count once, not each from its own start;
- issue_us: host clock per call over calls issued back to back without waiting for the GPU: the
  call's CPU-side cost (Python, checks, launches), hidden whenever the GPU is the slower side; with a hold (a
  spin kernel queued first) the GPU runs none of the calls while they are issued, so a call whose GPU work is
  longer than its host work still shows its host cost.
The others return one value per timed call (or run); the scripts report medians.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def event_ms(fn, iters: int) -> list[float]:
    """CUDA-event time of each call, the GPU idle before each (so launch gaps count)."""
    out = []
    for _ in range(iters):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return out


class HoldTooShort(RuntimeError):
    """A hold (a spin kernel queued first) ended before the last call was issued: the GPU may have set the pace."""


def _hold(hold_s: float | None) -> torch.cuda.Event | None:
    """Queue a spin kernel of at least hold_s seconds (torch.cuda._sleep) and return an event complete once it has
    ended; None without a hold."""
    if not hold_s:
        return None
    torch.cuda._sleep(int(hold_s * SPIN_HZ))
    spin_end = torch.cuda.Event(enable_timing=True)
    spin_end.record()
    return spin_end


def _check_held(spin_end: torch.cuda.Event | None, what: str, iters: int, issuing_s: float,
                hold_s: float | None) -> None:  # fmt: skip
    if spin_end is not None and spin_end.query():
        raise HoldTooShort(
            f"{what}: the GPU was idle before the last of {iters} calls was issued ({issuing_s:.4f} s "
            f"of issuing, held {hold_s:.4f} s)"
        )


def stream_ms(fn, iters: int, runs: int = 3, hold_s: float | None = None) -> list[float]:
    """Per-call time of `iters` calls issued back to back between two events, for each of `runs` runs.

    hold_s: first queue a spin kernel of at least that many seconds; the first event is the spin's end, so the calls
    run back to back from a full queue (the GPU's time alone, launch gaps included). Raises HoldTooShort when the
    spin had ended before the last call was issued."""
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        spin_end = s = _hold(hold_s)
        if s is None:  # no hold: the first event is now
            s = torch.cuda.Event(enable_timing=True)
            s.record()
        e = torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        _check_held(spin_end, "stream_ms", iters, time.perf_counter() - t0, hold_s)
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / iters)
    return out


def host_ms(fn, iters: int) -> list[float]:
    """Host-clock time of synchronize -> call -> synchronize (all Python overhead included)."""
    out = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


# Cycles per second assumed for torch.cuda._sleep's spin (above the boost clock of an H100 / H200, 1.98 GHz, so a
# hold lasts at least as long as asked).
SPIN_HZ = 2.5e9


def issue_us(fn, iters: int, runs: int = 3, hold_s: float | None = None) -> list[float]:
    """Host-clock microseconds per call of `iters` calls issued back to back (GPU idle before, not waited on).

    hold_s: first queue a spin kernel of at least that many seconds (torch.cuda._sleep), longer than the issuing,
    so the GPU runs none of the calls while they are issued: the time is the host's alone even where a call's GPU
    work is longer than its host work (without it the host waits for the GPU once the launch queue is full, and the
    time is the GPU's). The launches of `iters` calls must fit the driver's queue; raises RuntimeError when the
    spin had ended before the last call was issued (the GPU may have set the pace: hold longer)."""
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        spin_end = _hold(hold_s)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = time.perf_counter() - t0
        _check_held(spin_end, "issue_us", iters, dt, hold_s)
        out.append(dt * 1e6 / iters)
        torch.cuda.synchronize()
    return out


HOLD_RETRIES = 3  # a run whose issuing outlasted its hold is run again with a 4x longer hold, at most this often


def hold_estimate(fn, iters: int, probe: int = 5) -> float:
    """A hold (seconds) for issuing `iters` calls of fn: three times the synchronized time per call of `probe`
    calls (an upper bound of the host and the GPU side) times iters, plus 2 ms."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(probe):
        fn()
    torch.cuda.synchronize()
    return 3 * (time.perf_counter() - t0) / probe * iters + 2e-3


def held(measure, hold_s: float, retries: int = HOLD_RETRIES) -> tuple[list[float], float]:
    """(measure(hold), the hold used): measure(hold_s), run again with a 4x longer hold while it raises HoldTooShort
    (the host stalled past the hold), at most `retries` times."""
    for _ in range(retries):
        try:
            return measure(hold_s), hold_s
        except HoldTooShort:
            hold_s *= 4
    return measure(hold_s), hold_s


@dataclass(frozen=True)
class KernelTime:
    """A call's GPU activity over profiled calls (overlapping activities counted once): the mean per call, and the
    least and most of one call (None where the calls' activities do not split evenly into calls)."""

    mean_ms: float
    low_ms: float | None
    high_ms: float | None


def kernel_time(fn, calls: int = 20) -> KernelTime | None:
    """KernelTime of `calls` calls issued back to back in one torch.profiler run (CUDA activity only); None (and a
    printed reason) where the profiler fails or records no GPU activity. The profiler adds host time to each call
    (about 80-90 us a native quantize call on an H200 host): calls that keep the GPU fed without it may not with it,
    so the span of this run is no back-to-back time, and none is returned."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        ranges = sorted((e.time_range for e in prof.events() if e.device_type == DeviceType.CUDA),
                        key=lambda r: r.start)  # fmt: skip
    except Exception as ex:  # the profiler is optional: report, do not fail the benchmark
        print(f"# kernel_time unavailable ({type(ex).__name__}: {str(ex).splitlines()[0][:100]})", flush=True)
        return None
    intervals = [(r.start, r.end) for r in ranges]
    total_us = busy_us(intervals)
    if total_us <= 0:
        return None
    each = per_call_ms(intervals, calls)
    low, high = (None, None) if each is None else (min(each), max(each))
    return KernelTime(mean_ms=total_us / 1e3 / calls, low_ms=low, high_ms=high)


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals (us): the time at least one of them runs."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def per_call_ms(intervals: list[tuple[float, float]], calls: int) -> list[float] | None:
    """Each call's GPU activity in ms (busy_us of its own activities) from the (start, end) intervals in issue order,
    or None where they do not split into `calls` equal runs (a call whose activities vary: then which activity
    belongs to which call is unknown)."""
    if not intervals or len(intervals) % calls:
        return None
    per = len(intervals) // calls
    return [busy_us(intervals[i:i + per]) / 1e3 for i in range(0, len(intervals), per)]
