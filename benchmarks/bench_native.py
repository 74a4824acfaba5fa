"""Native quantizer throughput as a fraction of the GPU's device-to-device copy bandwidth.

Usage:
    python benchmarks/bench_native.py [--size 8192] [--iters 50] [--warmup 5] [--copy-mib 1024]
                                      [--out FILE.csv] [--only SUBSTRING] [--no-profile] [--no-verify]
                                      [--check-goals]
    python -m harness bench bench_native -- --out reports/bench_native.csv

One process, one GPU. First the copy bandwidth: `dst.copy_(src)` of a large uint8 tensor, bytes
read + written, CUDA events, median of max(20, --iters) after warm-up. Then each native quantizer
(`native.quantize`, bf16 input [size, size], rowwise + colwise) is timed four ways:
- stream_ms: --iters calls issued back to back between two CUDA events, divided by --iters
  (median of 3 such runs): the throughput a caller that keeps the GPU fed sees, host overhead
  included wherever it is larger than the GPU time (the headline, set against the goals);
- event_ms: CUDA events recorded around one whole call, the GPU idle before it (synchronize), so
  the interval includes the call's whole launch latency;
- host_ms: host clock around synchronize -> call -> synchronize (Python overhead fully counted);
- kernel_ms: the sum of the call's GPU activity (kernels, memsets) from torch.profiler (CUPTI),
  i.e. what the kernels alone cost (omitted with --no-profile or when the profiler fails).
Medians over --iters calls after --warmup calls (the first call also compiles with NVRTC; its
time is reported as first_s). "Bytes" is the minimum traffic: the input read once plus every
output byte written (codes, scales with their zero padding, amaxes). frac = bytes / stream_ms / copy
bandwidth, set against the issue's goals: mxfp8, fp8_block 1x128 and nvfp4 1-D >= 0.80, nvfp4
RHT + SR >= 0.60, fp8_current >= 0.45 (fp8_block 128x128 and nvfp4 16x16 have no goal).
Before timing, each quantizer's output on a 256x256 input is compared with reference.quantize
(harness.compare, padding masked) and the verdict is printed (--no-verify skips it).
Exit code: 0, or 1 with --check-goals when a goal is missed or a verification fails; 2 without a GPU.
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

from timing import event_ms, host_ms, kernel_ms, stream_ms  # noqa: E402

from reference import QuantConfig, QuantizedTensor  # noqa: E402

SEED = (0x5EED_0123_4567, 11)  # SR (seed, stream) for stochastic configs
DEVICE = "cuda"


@dataclass(frozen=True)
class Row:
    name: str
    config: QuantConfig
    goal: float | None  # minimum fraction of copy bandwidth (the issue's goals), None: no goal
    rowwise: bool = True
    colwise: bool = True


ROWS = (
    Row("mxfp8 1x32 row+col", QuantConfig("mxfp8"), 0.80),
    Row("fp8_block 1x128 row+col", QuantConfig("fp8_block"), 0.80),
    Row("fp8_block 128x128 row+col", QuantConfig("fp8_block", tile=(128, 128)), None),
    Row("nvfp4 1x16 row+col", QuantConfig("nvfp4"), 0.80),
    Row("nvfp4 1x16 RHT+SR row+col", QuantConfig("nvfp4", rht=True, stochastic=True), 0.60),
    Row("nvfp4 16x16 row+col", QuantConfig("nvfp4", tile=(16, 16)), None),
    Row("fp8_current e4m3 row+col", QuantConfig("fp8_current"), 0.45),
)

CSV_COLUMNS = (
    "name", "config", "shape", "in_dtype", "bytes", "first_s", "stream_ms", "event_ms", "host_ms", "kernel_ms",
    "gbps", "frac", "frac_event", "frac_kernel", "copy_gbps", "goal", "meets_goal", "verify",
)  # fmt: skip


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


# --------------------------------------------------------------------------------------------
# verification (native vs reference on a small input)
# --------------------------------------------------------------------------------------------


def verify(native, row: Row) -> str:
    """'ok' if native == reference.quantize on a 256x256 bf16 input (padding masked), else what differs."""
    import reference
    from harness.compare import compare_quantized

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(256, 256, generator=gen) * 3).to(torch.bfloat16)
    rng = SEED if row.config.stochastic else None
    try:
        golden = reference.quantize(x, row.config, rowwise=row.rowwise, colwise=row.colwise, rng=rng)
        cand = native.quantize(x.to(DEVICE), row.config, rowwise=row.rowwise, colwise=row.colwise, rng=rng).to("cpu")
        bad = [f"{r.tensor}:{r.n_mismatch}/{r.n}" for r in compare_quantized(golden, cand, x) if r.status != "pass"]
    except Exception as ex:
        return f"ERROR {type(ex).__name__}: {str(ex).splitlines()[0][:80]}"
    return "ok" if not bad else "MISMATCH " + " ".join(bad)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


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
    ap.add_argument("--check-goals", action="store_true", help="exit 1 if a goal is missed or a verification fails")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.size < 16 or args.size % 128:
        ap.error("--iters must be >= 1 and --size a positive multiple of 128")
    if not torch.cuda.is_available():
        print("bench_native needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import native

    rows = [r for r in ROWS if not args.only or args.only in r.name]
    if not rows:
        print(f"--only {args.only!r} matches no row; rows: {', '.join(r.name for r in ROWS)}", file=sys.stderr)
        return 2
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
    bw_in, ms_in = copy_gbps(in_bytes, args.iters, args.warmup)
    print(f"# copy bandwidth at the input size ({in_bytes / 2**20:.1f} MiB): {bw_in:.1f} GB/s ({ms_in:.3f} ms); "
          "fractions below use the large copy", flush=True)

    header = (f"{'quantizer (bf16 %dx%d)' % (n, n):<30} {'MiB':>7} {'first_s':>7} {'strm_ms':>8} {'event_ms':>9} "
              f"{'host_ms':>8} {'kern_ms':>8} {'GB/s':>7} {'frac':>6} {'frac_e':>6} {'frac_k':>6} {'goal':>5}  "
              "verdict / verify")
    print(header, flush=True)
    results, failed = [], False
    for row in rows:
        cfg = row.config
        rng = SEED if cfg.stochastic else None

        def call(row=row, rng=rng):
            return native.quantize(x, row.config, rowwise=row.rowwise, colwise=row.colwise, rng=rng)

        ver = "-" if args.no_verify else verify(native, row)
        try:
            t0 = time.perf_counter()
            q = call()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            nbytes = in_bytes + output_bytes(q)
            del q
            for _ in range(args.warmup):
                call()
            st = statistics.median(stream_ms(call, args.iters))
            ev = statistics.median(event_ms(call, args.iters))
            ho = statistics.median(host_ms(call, args.iters))
            ke = None if args.no_profile else kernel_ms(call)
        except Exception as ex:
            failed = True
            print(f"{row.name:<30} ERROR {type(ex).__name__}: {str(ex).splitlines()[0][:100]}", flush=True)
            results.append({"name": row.name, "config": cfg.id, "verify": f"ERROR {type(ex).__name__}"})
            continue
        gbps = nbytes / (st * 1e-3) / 1e9
        frac = gbps / bw
        frac_e = nbytes / (ev * 1e-3) / 1e9 / bw
        frac_k = None if ke is None else nbytes / (ke * 1e-3) / 1e9 / bw
        meets = None if row.goal is None else frac >= row.goal
        verdict = "-" if meets is None else ("meets goal" if meets else "BELOW GOAL")
        if meets is False or (ver != "ok" and ver != "-"):
            failed = True
        print(f"{row.name:<30} {nbytes / 2**20:>7.1f} {first_s:>7.2f} {st:>8.3f} {ev:>9.3f} {ho:>8.3f} "
              f"{_fmt(ke, '8.3f'):>8} {gbps:>7.0f} {frac:>6.2f} {frac_e:>6.2f} {_fmt(frac_k, '6.2f'):>6} "
              f"{_fmt(row.goal, '5.2f'):>5}  {verdict} / {ver}", flush=True)
        results.append({
            "name": row.name, "config": cfg.id, "shape": f"{n}x{n}", "in_dtype": "bfloat16", "bytes": nbytes,
            "first_s": round(first_s, 4), "stream_ms": st, "event_ms": ev, "host_ms": ho, "kernel_ms": ke,
            "gbps": gbps, "frac": frac, "frac_event": frac_e, "frac_kernel": frac_k, "copy_gbps": bw, "goal": row.goal,
            "meets_goal": meets, "verify": ver,
        })  # fmt: skip
    print("# frac = bytes / strm_ms / copy bandwidth (back-to-back calls; the goals' measure); frac_e uses one "
          "call on an idle GPU (event_ms); frac_k kernel time only; host_ms - kern_ms ~ the call's CPU-side cost",
          flush=True)
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
