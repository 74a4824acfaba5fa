"""CUDA timing of one benchmark call, five ways; shared by benchmarks/bench_native.py and bench_gemm.py.

- event_ms: CUDA events around one call, the GPU idle before it (synchronize), so the interval
  includes the call's launch latency and whatever host work precedes its first kernel;
- stream_ms: `iters` calls issued back to back between two events, divided by `iters`: the
  throughput a caller that keeps the GPU fed sees (host cost counts only where it exceeds GPU time);
- host_ms: host clock around synchronize -> call -> synchronize (all Python overhead included);
- kernel_time: the call's GPU activity (kernels, memsets, copies) from CUPTI via torch.profiler, over as many calls as
  the other timings (mean, and the least and most of one call: a power-capped 8192^3 FP8 GEMM's kernel took 0.70 -
  0.96 ms within 20 calls on an H200, so five calls' mean could come out above another run's back-to-back time);
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


def stream_ms(fn, iters: int, runs: int = 3) -> list[float]:
    """Per-call time of `iters` calls issued back to back between two events, for each of `runs` runs."""
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
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
        held = None
        if hold_s:
            torch.cuda._sleep(int(hold_s * SPIN_HZ))
            held = torch.cuda.Event()
            held.record()  # complete once the spin has ended
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = time.perf_counter() - t0
        if held is not None and held.query():
            raise RuntimeError(f"issue_us: the GPU was idle before the last of {iters} calls was issued ({dt:.4f} s "
                               f"of issuing, held {hold_s:.4f} s)")
        out.append(dt * 1e6 / iters)
        torch.cuda.synchronize()
    return out


@dataclass(frozen=True)
class KernelTime:
    """A call's GPU activity over profiled calls: the mean per call, and the least and most of one call (None where
    the calls' activities do not split evenly into calls)."""

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
    busy_us = sum(r.elapsed_us() for r in ranges)
    if busy_us <= 0:
        return None
    each = per_call_ms([r.elapsed_us() for r in ranges], calls)
    low, high = (None, None) if each is None else (min(each), max(each))
    return KernelTime(mean_ms=busy_us / 1e3 / calls, low_ms=low, high_ms=high)


def per_call_ms(durations_us: list[float], calls: int) -> list[float] | None:
    """Each call's GPU activity in ms from the activities' durations in issue order, or None where they do not split
    into `calls` equal runs (a call whose activities vary: then which activity belongs to which call is unknown)."""
    if not durations_us or len(durations_us) % calls:
        return None
    per = len(durations_us) // calls
    return [sum(durations_us[i:i + per]) / 1e3 for i in range(0, len(durations_us), per)]
