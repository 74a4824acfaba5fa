"""CUDA timing of one benchmark call, four ways; shared by benchmarks/bench_native.py and bench_gemm.py.

- event_ms: CUDA events around one call, the GPU idle before it (synchronize), so the interval
  includes the call's launch latency and whatever host work precedes its first kernel;
- stream_ms: `iters` calls issued back to back between two events, divided by `iters`: the
  throughput a caller that keeps the GPU fed sees (host cost counts only where it exceeds GPU time);
- host_ms: host clock around synchronize -> call -> synchronize (all Python overhead included);
- kernel_ms: the call's GPU activity (kernels, memsets, copies) from CUPTI via torch.profiler;
- issue_us: host clock per call over calls issued back to back without waiting for the GPU: the
  call's CPU-side cost (Python, checks, launches), hidden whenever the GPU is the slower side.
Each returns one value per timed call (or run); the scripts report medians.
"""

from __future__ import annotations

import time

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


def issue_us(fn, iters: int, runs: int = 3) -> list[float]:
    """Host-clock microseconds per call of `iters` calls issued back to back (GPU idle before, not waited on)."""
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / iters)
        torch.cuda.synchronize()
    return out


def kernel_ms(fn, calls: int = 5) -> float | None:
    """Mean GPU activity per call (kernels + memsets + copies, from CUPTI via torch.profiler)."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        total_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    except Exception as ex:  # the profiler is optional: report, do not fail the benchmark
        print(f"# kernel_ms unavailable ({type(ex).__name__}: {str(ex).splitlines()[0][:100]})", flush=True)
        return None
    return total_us / 1e3 / calls if total_us > 0 else None
