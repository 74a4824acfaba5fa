"""Native quantizer throughput as a fraction of the GPU's device-to-device copy bandwidth, and per-call host cost.

Usage:
    python benchmarks/bench_native.py [--size 8192] [--iters 50] [--warmup 5] [--copy-mib 1024]
                                      [--out FILE.csv] [--only SUBSTRING] [--no-profile] [--no-verify]
                                      [--no-gemm] [--gemm-size N] [--check-goals] [--dry-run]
    python -m harness bench bench_native -- --out reports/bench_native.csv

One process, one GPU. First the copy bandwidth: `dst.copy_(src)` of a large uint8 tensor, bytes
read + written, CUDA events, median of max(20, --iters) after warm-up. Then each native quantizer
(`native.quantize`, bf16 input [size, size], rowwise + colwise) is timed five ways:
- stream_ms: --iters calls issued back to back between two CUDA events, divided by --iters (median of 3
  such runs, each followed by kernel_ms's profiled run): the throughput a caller that keeps the GPU fed
  sees, host overhead included wherever it is larger than the GPU time (the headline, set against the goals);
- queued_ms: the same with the GPU held while the calls are issued (timing.stream_ms hold_s, timing.hold_estimate):
  the calls run back to back from a full queue, so it is the GPU's back-to-back time (launch gaps included)
  whatever the host's speed; frac_q = contract bytes / queued_ms / copy bandwidth. Where frac_q exceeds frac, the
  host set the pace of the stream_ms runs (a slow host: the given-amax row's host issued 42-81 us a call against
  72 us of GPU time on the H200 hosts of issue 18's twenty-first session). The spin before them does not flatter
  the calls: on one H200 (NVFP4 own and given amax, mxfp8; bf16 8192^2) held runs with 0, 10, 30 or 100 calls queued
  between the spin and the first event, and unheld runs started behind 5 or 100 queued calls, agreed within 0.6 us
  a call, but for two unheld given-amax runs 2 and 4 us above (host-paced);
- event_ms: CUDA events recorded around one whole call, the GPU idle before it (synchronize), so
  the interval includes the call's whole launch latency;
- host_ms: host clock around synchronize -> call -> synchronize (Python overhead fully counted);
- kernel_ms: the call's GPU activity (kernels, memsets) from torch.profiler (CUPTI), i.e. what the
  kernels alone cost (the time at least one runs: a programmatic kernel's start in the tail of the kernel
  before it counts once, timing.busy_us): a run of --iters profiled calls follows each stream_ms run (the
  median of the 3 runs' means), with the least and most of one call (kernel_min_ms, kernel_max_ms; omitted with --no-profile or when
  the profiler fails);
- issue_us: host clock per call of --iters calls issued without waiting (the call's CPU-side cost).
Medians over --iters calls after --warmup calls (the first call also compiles with NVRTC; its
time is reported as first_s).

Bytes (issue 18, docs/numerics.md §5.1). "1read" = the input read once plus every output byte written
(codes, scales with their zero padding, amaxes). "contract" = the bytes the contract requires: an NVFP4
call that computes its own global amax must read X twice (amax pass, then quantize pass; 8192^2 bf16
does not stay on chip between them), so contract = 2|X| + outputs for own-amax NVFP4 rows and = 1read
for every other row (a given amax, TE's quantize_with_amax, reads X once). frac = contract bytes /
stream_ms / copy bandwidth is set against the goals: mxfp8, fp8_block 1x128 >= 0.80, fp8_current
>= 0.45; NVFP4 own amax 1-D >= 0.80, RHT + SR >= 0.50, given amax 1-D >= 0.70 (fp8_block 128x128,
nvfp4 16x16 and fp8_delayed have no goal; fp8_delayed's calls share one AmaxHistory on the device, as a
TE slot's). frac_1r is the same on the one-read count, frac_k on kernel time.
The given-amax row runs only where native supports it (native.supports, then one small call that
must not raise Unsupported); otherwise it prints why it is skipped.

Host cost per call: ovh_us = (stream_ms - kernel_ms) in microseconds, what back-to-back calls add to
kernel-only time (CUDA events vs CUPTI), and b2b/k = frac / frac_k (goal for FP8 quantizers: >= 0.95,
"back-to-back within 5% of kernel-only"); issue_us against the goal <= 15 us per quantize call. The two come from
different (alternating) runs: where one call's kernel time spreads wider than ovh_us (kern_rng, printed for the
GEMMs, whose 8192^3 FP8 kernels are power-capped: 0.70 - 0.96 ms within 20 calls on an H200), ovh_us is within
noise, even negative; issue_us and bench_host.py (alternating, the GPU held) measure the host cost itself. (The
profiled run's own span is no back-to-back time: the profiler adds ~80-90 us of host time to a native call.)
The GEMM table (--no-gemm skips it) times native.gemm (per-tensor FP8 and fp8_block 1x128 x 128x128,
cuBLASLt, [--gemm-size]^3) next to torch._scaled_mm on the same operands, with the same columns; the
goal: native issue_us <= torch._scaled_mm's.
Before timing, each quantizer's output on a 256x256 input is compared with reference.quantize
(harness.compare, padding masked) and the verdict is printed (--no-verify skips it).
--dry-run needs no GPU: it runs reference.quantize on the CPU for the byte counts and fills the
timing columns with placeholders, so CI proves the tables build (tests/unit/test_bench_native.py).
Exit code: 0, or 1 with --check-goals when a goal (throughput, host cost, b2b/k) is missed or a verification
fails; 2 without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import event_ms, held, hold_estimate, host_ms, issue_us, kernel_time, stream_ms  # noqa: E402

from reference import QuantConfig, QuantizedTensor  # noqa: E402
from reference.per_tensor import AmaxHistory  # noqa: E402
from reference.scaling import amax as ref_amax  # noqa: E402

SEED = (0x5EED_0123_4567, 11)  # SR (seed, stream) for stochastic configs
DEVICE = "cuda"
HOST_GOAL_US = 15.0  # issue 18 item 2: per native quantize call
B2B_GOAL = 0.95  # issue 18 item 2: back-to-back frac within 5% of kernel-only frac, every FP8 quantizer
ALTERNATIONS = 3  # back-to-back runs of --iters calls, each followed by a profiled run of as many (time_call)


@dataclass(frozen=True)
class Row:
    name: str
    config: QuantConfig
    goal: float | None  # minimum fraction of copy bandwidth on the contract's bytes, None: no goal
    rowwise: bool = True
    colwise: bool = True
    given_amax: bool = False  # quantize(..., amax=amax(X)): X read once
    delayed: bool = False  # fp8_delayed: quantize(..., state=...), one AmaxHistory kept across the row's calls

    def state(self, device):
        """A fresh fp8_delayed state on `device` (delayed rows; None otherwise)."""
        return AmaxHistory(self.config, device=device) if self.delayed else None


ROWS = (
    Row("mxfp8 1x32 row+col", QuantConfig("mxfp8"), 0.80),
    Row("fp8_block 1x128 row+col", QuantConfig("fp8_block"), 0.80),
    Row("fp8_block 128x128 row+col", QuantConfig("fp8_block", tile=(128, 128)), None),
    Row("nvfp4 1x16 row+col", QuantConfig("nvfp4"), 0.80),
    Row("nvfp4 1x16 given amax row+col", QuantConfig("nvfp4"), 0.70, given_amax=True),
    Row("nvfp4 1x16 RHT+SR row+col", QuantConfig("nvfp4", rht=True, stochastic=True), 0.50),
    Row("nvfp4 16x16 row+col", QuantConfig("nvfp4", tile=(16, 16)), None),
    Row("fp8_current e4m3 row+col", QuantConfig("fp8_current"), 0.45),
    Row("fp8_delayed e4m3 row+col", QuantConfig("fp8_delayed"), None, delayed=True),
)

CSV_COLUMNS = (
    "name", "config", "shape", "in_dtype", "bytes_1read", "bytes", "first_s", "stream_ms", "queued_ms", "event_ms",
    "host_ms", "kernel_ms", "kernel_min_ms", "kernel_max_ms", "issue_us", "ovh_us", "gbps", "frac_1read", "frac",
    "frac_queued", "frac_event", "frac_kernel", "b2b_over_kernel",
    "copy_gbps", "goal", "meets_goal", "meets_host_goal", "meets_b2b_goal", "verify",
)  # fmt: skip


@dataclass
class Timing:
    """One call's timings (benchmarks/timing.py); kernel_ms None when the profiler is off or failed, kernel_range
    (the least and most of one call's GPU activity) None also where the calls' activities did not split evenly;
    queued_ms None where it was not measured (the GEMM rows)."""

    stream_ms: float
    event_ms: float
    host_ms: float
    kernel_ms: float | None
    issue_us: float
    first_s: float = 0.0
    kernel_range: tuple[float, float] | None = None
    queued_ms: float | None = None

    @property
    def ovh_us(self) -> float | None:
        """What back-to-back calls add to kernel-only time, per call: stream_ms - kernel_ms in microseconds."""
        return None if self.kernel_ms is None else (self.stream_ms - self.kernel_ms) * 1e3


# --------------------------------------------------------------------------------------------
# copy bandwidth and bytes moved (the timing itself: benchmarks/timing.py)
# --------------------------------------------------------------------------------------------


def copy_gbps(nbytes: int, iters: int, warmup: int) -> tuple[float, float]:
    """(GB/s, median ms) of a device-to-device copy of `nbytes`: bytes read + written per copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    ms = statistics.median(event_ms(lambda: dst.copy_(src), max(20, iters)))
    return 2 * nbytes / (ms * 1e-3) / 1e9, ms


def output_bytes(q: QuantizedTensor) -> int:
    """Every output byte the call writes: codes, scales (with padding), amaxes."""
    return sum(t.numel() * t.element_size() for n in QuantizedTensor.TENSOR_FIELDS if (t := getattr(q, n)) is not None)


def input_reads(row: Row) -> int:
    """How often the contract makes the call read X: twice for NVFP4 with its own global amax, else once.

    docs/numerics.md §5.1: A_g = amax(X) must be known before the first block is encoded, and 8192^2 bf16
    does not stay on chip between the two passes; a given amax (TE's quantize_with_amax) skips the first.
    """
    return 2 if row.config.scheme == "nvfp4" and not row.given_amax else 1


def byte_counts(row: Row, in_bytes: int, out_bytes: int) -> tuple[int, int]:
    """(one-read bytes |X| + outputs, the contract's bytes reads·|X| + outputs)."""
    return in_bytes + out_bytes, input_reads(row) * in_bytes + out_bytes


def quant_record(row: Row, shape: str, in_bytes: int, out_bytes: int, t: Timing, bw_gbps: float,
                 verify: str = "-") -> dict:
    """One quantizer's CSV record: byte counts, fractions of copy bandwidth, host cost, goals."""
    one, contract = byte_counts(row, in_bytes, out_bytes)

    def frac(nbytes: int, ms: float | None) -> float | None:
        return None if not ms else nbytes / (ms * 1e-3) / 1e9 / bw_gbps

    fr, fk = frac(contract, t.stream_ms), frac(contract, t.kernel_ms)
    fp8 = row.config.scheme in ("mxfp8", "fp8_block", "fp8_current", "fp8_delayed")
    b2b = None if fk is None else fr / fk
    return {
        "name": row.name, "config": row.config.id, "shape": shape, "in_dtype": "bfloat16", "bytes_1read": one,
        "bytes": contract, "first_s": round(t.first_s, 4), "stream_ms": t.stream_ms, "queued_ms": t.queued_ms,
        "event_ms": t.event_ms,
        "host_ms": t.host_ms, "kernel_ms": t.kernel_ms, **_kernel_range(t), "issue_us": t.issue_us,
        "ovh_us": t.ovh_us,
        "gbps": contract / (t.stream_ms * 1e-3) / 1e9, "frac_1read": frac(one, t.stream_ms), "frac": fr,
        "frac_queued": frac(contract, t.queued_ms),
        "frac_event": frac(contract, t.event_ms), "frac_kernel": fk, "b2b_over_kernel": b2b, "copy_gbps": bw_gbps,
        "goal": row.goal, "meets_goal": None if row.goal is None else fr >= row.goal,
        "meets_host_goal": t.issue_us <= HOST_GOAL_US,
        "meets_b2b_goal": None if not fp8 or b2b is None else b2b >= B2B_GOAL,
        "verify": verify,
    }  # fmt: skip


def _kernel_range(t: Timing) -> dict:
    low, high = t.kernel_range or (None, None)
    return {"kernel_min_ms": low, "kernel_max_ms": high}


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def quant_header(n: int) -> str:
    return (f"{'quantizer (bf16 %dx%d)' % (n, n):<31} {'MiB_1r':>7} {'MiB':>7} {'first_s':>7} {'strm_ms':>8} "
            f"{'q_ms':>8} {'event_ms':>8} {'kern_ms':>8} {'issue_us':>8} {'ovh_us':>7} {'frac_1r':>7} {'frac':>6} "
            f"{'goal':>5} {'frac_q':>6} {'frac_k':>6} {'b2b/k':>6}  "
            f"verdict / host (issue <= {HOST_GOAL_US:g} us, FP8 b2b/k >= {B2B_GOAL}) / verify")


def quant_line(r: dict) -> str:
    """The printed row of a quant_record: achieved fraction next to the goal, host cost next to its goal."""
    verdict = "-" if r["meets_goal"] is None else ("meets goal" if r["meets_goal"] else "BELOW GOAL")
    host = "host ok" if r["meets_host_goal"] else "HOST OVER"
    b2b = {None: "", True: ", b2b ok", False: ", B2B BELOW"}[r["meets_b2b_goal"]]
    return (f"{r['name']:<31} {r['bytes_1read'] / 2**20:>7.1f} {r['bytes'] / 2**20:>7.1f} {r['first_s']:>7.2f} "
            f"{r['stream_ms']:>8.3f} {_fmt(r['queued_ms'], '8.3f'):>8} {r['event_ms']:>8.3f} "
            f"{_fmt(r['kernel_ms'], '8.3f'):>8} {r['issue_us']:>8.1f} {_fmt(r['ovh_us'], '7.1f'):>7} "
            f"{r['frac_1read']:>7.2f} {r['frac']:>6.2f} {_fmt(r['goal'], '5.2f'):>5} "
            f"{_fmt(r['frac_queued'], '6.2f'):>6} "
            f"{_fmt(r['frac_kernel'], '6.2f'):>6} {_fmt(r['b2b_over_kernel'], '6.3f'):>6}  "
            f"{verdict} / {host}{b2b} / {r['verify']}")


GEMM_HEADER = (f"{'GEMM (M=N=K)':<44} {'strm_ms':>8} {'TFLOP/s':>8} {'kern_ms':>8} {'kern_rng':>11} {'ovh_us':>7} "
               f"{'issue_us':>8}  "
               "host goal: native issue_us <= torch._scaled_mm's")


def gemm_record(name: str, flop: int, t: Timing, torch_issue_us: float | None) -> dict:
    """One GEMM contender: throughput, back-to-back overhead over kernel time, host cost vs torch's."""
    return {
        "name": name, "stream_ms": t.stream_ms, "tflops": flop / (t.stream_ms * 1e-3) / 1e12, "kernel_ms": t.kernel_ms,
        **_kernel_range(t),
        "ovh_us": t.ovh_us, "issue_us": t.issue_us,
        "meets_host_goal": None if torch_issue_us is None else t.issue_us <= torch_issue_us,
    }  # fmt: skip


def gemm_line(r: dict) -> str:
    goal = {None: "", True: "host ok", False: "HOST OVER"}[r["meets_host_goal"]]
    rng = "-" if r["kernel_min_ms"] is None else f"{r['kernel_min_ms']:.3f}-{r['kernel_max_ms']:.3f}"
    return (f"{r['name']:<44} {r['stream_ms']:>8.3f} {r['tflops']:>8.1f} {_fmt(r['kernel_ms'], '8.3f'):>8} "
            f"{rng:>11} {_fmt(r['ovh_us'], '7.1f'):>7} {r['issue_us']:>8.1f}  {goal}")


# --------------------------------------------------------------------------------------------
# verification (native vs reference on a small input) and the given-amax guard
# --------------------------------------------------------------------------------------------


def verify(native, row: Row) -> str:
    """'ok' if native == reference.quantize on a 256x256 bf16 input (padding masked), else what differs."""
    import reference
    from harness.compare import compare_quantized

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(256, 256, generator=gen) * 3).to(torch.bfloat16)
    rng = SEED if row.config.stochastic else None
    amax = ref_amax(x).reshape(1) if row.given_amax else None
    try:
        golden = reference.quantize(x, row.config, rowwise=row.rowwise, colwise=row.colwise, rng=rng, amax=amax,
                                    state=row.state("cpu"))  # fmt: skip
        cand = native.quantize(x.to(DEVICE), row.config, rowwise=row.rowwise, colwise=row.colwise, rng=rng,
                               amax=None if amax is None else amax.to(DEVICE), state=row.state(DEVICE)).to("cpu")
        bad = [f"{r.tensor}:{r.n_mismatch}/{r.n}" for r in compare_quantized(golden, cand, x) if r.status != "pass"]
    except Exception as ex:
        return f"ERROR {type(ex).__name__}: {str(ex).splitlines()[0][:80]}"
    return "ok" if not bad else "MISMATCH " + " ".join(bad)


def row_supported(native, row: Row) -> tuple[bool, str]:
    """native.supports for the row's config; a given-amax row also needs one small call that runs."""
    ok, why = native.supports("quantize", row.config, DEVICE)
    if not ok or not row.given_amax:
        return ok, why
    from reference.types import Unsupported

    x = torch.ones(128, 128, dtype=torch.bfloat16, device=DEVICE)
    try:
        native.quantize(x, row.config, rowwise=row.rowwise, colwise=row.colwise,
                        amax=torch.ones(1, dtype=torch.float32, device=DEVICE))
    except Unsupported as ex:
        return False, str(ex).splitlines()[0]
    return True, ""


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------


def time_call(call, iters: int, warmup: int, profile: bool, queued: bool = False) -> Timing:
    """The Timing of `call` (queued: with queued_ms)."""
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(warmup):
        call()
    hold = hold_estimate(call, iters) if queued else None
    # The back-to-back runs (held and not) and the profiled runs alternate (ALTERNATIONS of each), so a GPU whose
    # clock drifts (a power-capped GEMM) moves them all.
    streams, queues, kts = [], [], []
    for _ in range(ALTERNATIONS):
        streams += stream_ms(call, iters, runs=1)
        if queued:
            got, hold = held(lambda h: stream_ms(call, iters, runs=1, hold_s=h), hold)
            queues += got
        if profile and (kt := kernel_time(call, iters)) is not None:
            kts.append(kt)
    ranges = [(k.low_ms, k.high_ms) for k in kts if k.low_ms is not None]
    return Timing(
        stream_ms=statistics.median(streams), event_ms=statistics.median(event_ms(call, iters)),
        host_ms=statistics.median(host_ms(call, iters)),
        kernel_ms=statistics.median(k.mean_ms for k in kts) if kts else None,
        issue_us=statistics.median(issue_us(call, iters)), first_s=first_s,
        kernel_range=(min(lo for lo, _ in ranges), max(hi for _, hi in ranges)) if ranges else None,
        queued_ms=statistics.median(queues) if queues else None,
    )  # fmt: skip


def gemm_contenders(n: int, dev):
    """[(name, call, is_torch)] on the same operands: per-tensor FP8 native vs torch._scaled_mm, fp8_block native."""
    from bench_gemm import random_qt

    import native

    pt = QuantConfig("fp8_current")
    a, b = random_qt(pt, n, n, dev), random_qt(pt, n, n, dev)
    a8, b8 = a.rowwise_data.view(torch.float8_e4m3fn), b.rowwise_data.view(torch.float8_e4m3fn)
    sa, sb = a.rowwise_scale.reshape(()), b.rowwise_scale.reshape(())
    x = random_qt(QuantConfig("fp8_block"), n, n, dev)
    w = random_qt(QuantConfig("fp8_block", tile=(128, 128)), n, n, dev)
    return [
        (f"per-tensor fp8 native.gemm {n}^3", lambda: native.gemm(a, b, method="cublaslt"), False),
        (f"per-tensor fp8 torch._scaled_mm {n}^3",
         lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), True),
        (f"fp8_block 1x128 x 128x128 native.gemm {n}^3", lambda: native.gemm(x, w, method="cublaslt"), False),
    ]


def dry_run(args, rows: list[Row]) -> int:
    """The tables with the CPU reference's byte counts and placeholder timings (no GPU needed)."""
    import reference

    n = args.size
    x = (torch.randn(n, n, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    in_bytes = x.numel() * x.element_size()
    bw = 1000.0
    print(f"# DRY RUN: byte counts from reference.quantize on the CPU; every timing is a placeholder "
          f"(copy bandwidth {bw} GB/s, stream 1 ms, queued 0.95 ms, kernel 0.9 ms; GEMM kernel 0.99 ms, one call's "
          f"0.9 - 1.1 ms)")
    print(quant_header(n))
    for row in rows:
        amax = ref_amax(x).reshape(1) if row.given_amax else None
        q = reference.quantize(x, row.config, rowwise=row.rowwise, colwise=row.colwise,
                               rng=SEED if row.config.stochastic else None, amax=amax, state=row.state("cpu"))
        t = Timing(stream_ms=1.0, event_ms=1.1, host_ms=1.2, kernel_ms=0.9, issue_us=10.0, queued_ms=0.95)
        print(quant_line(quant_record(row, f"{n}x{n}", in_bytes, output_bytes(q), t, bw)))
    if not args.no_gemm:
        print(GEMM_HEADER)
        for name, issue, torch_us in (("per-tensor fp8 native.gemm", 15.0, 20.0),
                                      ("per-tensor fp8 torch._scaled_mm", 20.0, None)):
            t = Timing(stream_ms=1.0, event_ms=1.0, host_ms=1.0, kernel_ms=0.99, issue_us=issue, kernel_range=(0.9, 1.1))
            print(gemm_line(gemm_record(name, 2 * n**3, t, torch_us)))
    return 0


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring for the method.")
    ap.add_argument("--size", type=int, default=8192, help="quantizer input is bf16 [size, size] (default 8192)")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per row, median reported (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before timing (default 5)")
    ap.add_argument("--copy-mib", type=int, default=1024, help="size of the copy-bandwidth buffer in MiB (default 1024)")
    ap.add_argument("--out", default=None, help="also write the table as CSV to this file")
    ap.add_argument("--only", default=None, help="run only rows whose name contains this substring")
    ap.add_argument("--no-profile", action="store_true", help="skip the torch.profiler kernel-time column")
    ap.add_argument("--no-verify", action="store_true", help="skip the native-vs-reference check")
    ap.add_argument("--no-gemm", action="store_true", help="skip the GEMM host-cost table")
    ap.add_argument("--gemm-size", type=int, default=None, help="M=N=K of the GEMM table (default --size)")
    ap.add_argument("--check-goals", action="store_true", help="exit 1 if a goal is missed or a verification fails")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: CPU byte counts, placeholder timings")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.size < 16 or args.size % 128:
        ap.error("--iters must be >= 1 and --size a positive multiple of 128")
    rows = [r for r in ROWS if not args.only or args.only in r.name]
    if not rows:
        print(f"--only {args.only!r} matches no row; rows: {', '.join(r.name for r in ROWS)}", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(args, rows)
    if not torch.cuda.is_available():
        print("bench_native needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import native
    from reference.scaling import amax as ref_amax

    torch.manual_seed(0)
    dev = torch.device(DEVICE)
    props = torch.cuda.get_device_properties(dev)
    try:
        import cupy

        cupy_v = cupy.__version__
    except Exception:
        cupy_v = "not importable"
    print(f"# {props.name} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB)  "
          f"torch {torch.__version__}  CUDA {torch.version.cuda}  cupy {cupy_v}", flush=True)

    bw, copy_ms = copy_gbps(args.copy_mib << 20, args.iters, args.warmup)
    print(f"# copy bandwidth: {bw:.1f} GB/s (read + write of {args.copy_mib} MiB in {copy_ms:.3f} ms, "
          f"median of {max(20, args.iters)})", flush=True)

    n = args.size
    x = torch.randn(n, n, device=dev, dtype=torch.float32).mul_(3).to(torch.bfloat16)  # (N, N) bf16
    in_bytes = x.numel() * x.element_size()
    x_amax = ref_amax(x).reshape(1)  # the given amax: exact (max of |x|), fp32 [1]
    bw_in, ms_in = copy_gbps(in_bytes, args.iters, args.warmup)
    print(f"# copy bandwidth at the input size ({in_bytes / 2**20:.1f} MiB): {bw_in:.1f} GB/s ({ms_in:.3f} ms); "
          "fractions below use the large copy", flush=True)

    print(quant_header(n), flush=True)
    results, failed = [], False
    for row in rows:
        ok, why = row_supported(native, row)
        if not ok:
            print(f"{row.name:<31} skipped: {why}", flush=True)
            results.append({"name": row.name, "config": row.config.id, "verify": f"skipped: {why}"})
            continue
        rng = SEED if row.config.stochastic else None
        amax = x_amax if row.given_amax else None
        state = row.state(DEVICE)

        def call(row=row, rng=rng, amax=amax, state=state):
            return native.quantize(x, row.config, rowwise=row.rowwise, colwise=row.colwise, rng=rng, amax=amax,
                                   state=state)  # fmt: skip

        ver = "-" if args.no_verify else verify(native, row)
        try:
            q = call()
            out_bytes = output_bytes(q)
            del q
            t = time_call(call, args.iters, args.warmup, not args.no_profile, queued=True)
        except Exception as ex:
            failed = True
            print(f"{row.name:<31} ERROR {type(ex).__name__}: {str(ex).splitlines()[0][:100]}", flush=True)
            results.append({"name": row.name, "config": row.config.id, "verify": f"ERROR {type(ex).__name__}"})
            continue
        rec = quant_record(row, f"{n}x{n}", in_bytes, out_bytes, t, bw, ver)
        failed |= (rec["meets_goal"] is False or rec["meets_b2b_goal"] is False or not rec["meets_host_goal"]
                   or (ver != "ok" and ver != "-"))
        print(quant_line(rec), flush=True)
        results.append(rec)
    print("# frac = contract bytes / strm_ms / copy bandwidth (back-to-back calls; the goals' measure); frac_1r on "
          "the one-read count; frac_q on q_ms (the calls issued with the GPU held); frac_k kernel time only; "
          "ovh_us = strm - kern; issue_us = host clock per call issued back to back", flush=True)
    if not args.no_gemm:
        g = args.gemm_size or n
        print(GEMM_HEADER, flush=True)
        timed = []
        for name, fn, is_torch in gemm_contenders(g, dev):
            try:
                timed.append((name, time_call(fn, args.iters, args.warmup, not args.no_profile), is_torch))
            except Exception as ex:  # Unsupported, or torch lacking the path
                print(f"{name:<44} ERROR {type(ex).__name__}: {str(ex).splitlines()[0][:80]}", flush=True)
        torch_us = next((t.issue_us for _, t, is_torch in timed if is_torch), None)
        for name, t, is_torch in timed:
            rec = gemm_record(name, 2 * g**3, t, None if is_torch else torch_us)
            failed |= rec["meets_host_goal"] is False
            print(gemm_line(rec), flush=True)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for r in results:
                w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
        print(f"# wrote {out}", flush=True)
    return 1 if (args.check_goals and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
