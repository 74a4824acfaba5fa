"""Per-call host cost of native.quantize and native.gemm, with the call plans off (before) and on (after).

Usage:
    python benchmarks/bench_host.py [--size 256] [--iters 100] [--runs 5] [--only SUBSTRING] [--out FILE.csv]
                                    [--check-goals] [--dry-run]

Issue #18 item 2: <= 15 us per native quantize call; <= torch._scaled_mm's host cost per native GEMM call. One
process, one GPU, bf16 input [size, size] (rowwise + colwise), GEMMs TN [size]^3 with bf16 output. Each row is
timed as issue_us (benchmarks/timing.py): host-clock microseconds per call over --iters calls issued back to back
without waiting for the GPU, the median of --runs runs, after a warm-up (the first call compiles). Each run first
queues a spin kernel longer than its issuing (issue_us's hold), so the GPU runs none of the calls meanwhile and a
call whose GPU work outlasts its host work (SR's Philox on a tile, several small kernels) still shows its host
cost, not the GPU's; --iters calls' launches must fit the driver's launch queue. "before" runs
with `native.use_plans(False)` (every call takes the full path: the spec checks, then the launcher), "after" with
the plans on (docs/design.md §4.1). The GEMM goal is torch._scaled_mm's issue_us on fp8 tensorwise operands of the
same shapes, measured in the same run. "out_us" (quantize rows) is the in-place call `native.quantize(...,
out=q)` into the outputs of an earlier planned call (docs/design.md §4.1): no allocation, the same kernels; a
separate column with its own result ("out"), since a caller must opt in to overwriting q. For GEMM rows it is
`native.gemm(..., out=y)` into a caller's [size, size] bf16 tensor (TE's general_gemm takes `out`). --dry-run needs
no GPU: it checks every row's call on the CPU reference and prints the table with placeholder timings
(tests/unit/test_native_plan_bench.py). Exit code: 0; 1 with --check-goals when a
goal is missed; 2 without a GPU.

Where a quantize call's host time goes (docs/performance.md §3.1): "alloc_us" is the plan's fresh
output block alone (`OutputBlock.allocate` without its clear: one allocation, a view per further dtype, an
as_strided view per QuantizedTensor field), "launch_us" the plan's launches alone into the outputs of an earlier
call (its memset or clearing launch, then its kernels: what out= costs without its Python front), and "floor_us"
their sum: what a fresh-output call costs in these two pieces before any argument is read; "floor" says "> goal"
where the pieces alone exceed the goal. The fresh call, out= and the two pieces are timed with their runs
alternating, so a host that drifts mid-row moves all four. A line after the first such row gives one launch
of that row's last kernel alone (cuLaunchKernel, or cuLaunchKernelEx for a programmatic one such as NVFP4's
quantize kernel: the driver's cost of a launch on this host). Each GEMM row's goal is
torch._scaled_mm timed in the same runs, alternating with the native calls, next to the separate torch._scaled_mm
row.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import held, hold_estimate, issue_us  # noqa: E402

from reference import QuantConfig  # noqa: E402

QUANTIZE_GOAL_US = 15.0  # issue 18 item 2: per native quantize call
SEED = (0x5EED_0123_4567, 11)
CSV_COLUMNS = ("kind", "name", "before_us", "after_us", "out_us", "goal_us", "result", "out_result", "alloc_us",
               "launch_us", "floor_us", "floor")  # fmt: skip


@dataclass(frozen=True)
class QuantRow:
    name: str
    config: QuantConfig
    given_amax: bool = False
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)


QUANT_ROWS = (
    QuantRow("fp8_delayed e4m3", QuantConfig("fp8_delayed")),
    QuantRow("fp8_current e4m3", QuantConfig("fp8_current")),
    QuantRow("fp8_current given amax", QuantConfig("fp8_current"), given_amax=True),
    QuantRow("mxfp8 1x32", QuantConfig("mxfp8")),
    QuantRow("fp8_block 1x128", QuantConfig("fp8_block")),
    QuantRow("fp8_block 128x128", QuantConfig("fp8_block", tile=(128, 128))),
    QuantRow("nvfp4 1x16", QuantConfig("nvfp4")),
    QuantRow("nvfp4 16x16", QuantConfig("nvfp4", tile=(16, 16))),
    QuantRow("nvfp4 RHT", QuantConfig("nvfp4", rht=True)),
    QuantRow("nvfp4 SR", QuantConfig("nvfp4", stochastic=True)),
    QuantRow("nvfp4 RHT+SR", QuantConfig("nvfp4", rht=True, stochastic=True)),
    QuantRow("nvfp4 given amax", QuantConfig("nvfp4"), given_amax=True),
    QuantRow("nvfp4 4over6", QuantConfig("nvfp4", variant="4over6")),
    QuantRow("nvfp4 row-scaled", QuantConfig("nvfp4", variant="row_scaled")),
)
# (name, a's config, b's config) of the native GEMM rows; TN, bf16 out, method auto.
GEMM_ROWS = (
    ("fp8_current", QuantConfig("fp8_current"), QuantConfig("fp8_current")),
    ("mxfp8", QuantConfig("mxfp8"), QuantConfig("mxfp8")),
    ("fp8_block 1x128 x 128x128", QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))),
    ("nvfp4", QuantConfig("nvfp4"), QuantConfig("nvfp4")),
)
TORCH_GEMM = "torch._scaled_mm fp8 tensorwise"


def quant_args(row: QuantRow, x: torch.Tensor) -> dict:
    """The per-call keyword arguments of `row` on x: rng (SR), state (fp8_delayed), amax (a given amax)."""
    from reference.per_tensor import AmaxHistory

    amax = x.abs().to(torch.float32).amax().reshape(1) if row.given_amax else None
    rng = SEED if row.config.stochastic else None
    state = AmaxHistory(row.config, device=x.device) if row.config.scheme == "fp8_delayed" else None
    return {"rng": rng, "state": state, "amax": amax}


def quant_call(q, row: QuantRow, x: torch.Tensor, **extra):
    """A no-argument call of `q` (native.quantize or reference.quantize) for `row` on x (both copies); `extra`:
    more keyword arguments (out=)."""
    kw = quant_args(row, x)
    return lambda: q(x, row.config, rowwise=True, colwise=True, **kw, **extra)


def result(after: float | None, goal: float | None) -> str:
    if after is None or goal is None:
        return "n/a"
    return "PASS" if after <= goal else "MISS"


def record(kind: str, name: str, before: float | None, after: float | None, goal: float | None,
           out: float | None = None, alloc: float | None = None, launch: float | None = None) -> dict:  # fmt: skip
    floor = None if alloc is None or launch is None else alloc + launch
    over = floor is not None and goal is not None and floor > goal
    return {"kind": kind, "name": name, "before_us": before, "after_us": after, "out_us": out, "goal_us": goal,
            "result": result(after, goal), "out_result": result(out, goal), "alloc_us": alloc, "launch_us": launch,
            "floor_us": floor, "floor": "> goal" if over else ""}  # fmt: skip


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


def table(records: list[dict]) -> str:
    lines = [f"{'kind':8} {'name':34} {'before_us':>10} {'after_us':>10} {'out_us':>8} {'goal_us':>8}  result  out   "
             f"{'alloc_us':>8} {'launch_us':>9} {'floor_us':>8}  floor"]  # fmt: skip
    for r in records:
        lines.append(f"{r['kind']:8} {r['name']:34} {_fmt(r['before_us']):>10} {_fmt(r['after_us']):>10} "
                     f"{_fmt(r['out_us']):>8} {_fmt(r['goal_us']):>8}  {r['result']:6}  {r['out_result']:4}  "
                     f"{_fmt(r['alloc_us']):>8} {_fmt(r['launch_us']):>9} {_fmt(r['floor_us']):>8}  "
                     f"{r['floor']}".rstrip())  # fmt: skip
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring for the method.")
    ap.add_argument("--size", type=int, default=256, help="quantize input [size, size], GEMMs [size]^3 (default 256)")
    ap.add_argument("--iters", type=int, default=100,
                    help="calls per timed run (default 100: their launches must fit the driver's queue)")  # fmt: skip
    ap.add_argument("--runs", type=int, default=5, help="timed runs per row, median reported (default 5)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls before timing (default 20)")
    ap.add_argument("--only", default=None, help="run only rows whose name contains this substring")
    ap.add_argument("--out", default=None, help="also write the table as CSV to this file")
    ap.add_argument("--check-goals", action="store_true", help="exit 1 if a goal is missed")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: check the rows on the CPU, placeholder timings")
    args = ap.parse_args(argv)
    if args.size <= 0 or args.size % 128 or args.iters <= 0 or args.runs <= 0 or args.warmup < 0:
        ap.error("--size must be a positive multiple of 128; --iters, --runs positive; --warmup >= 0")
    return args


def wanted(args, name: str) -> bool:
    return args.only is None or args.only in name


def dry_run(args) -> list[dict]:
    """Every quantize row's call on the CPU reference (so the rows are valid calls), placeholder timings."""
    import reference

    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = []
    for row in QUANT_ROWS:
        if wanted(args, row.name):
            quant_call(reference.quantize, row, x)()
            out.append(record("quantize", row.name, 100.0, 10.0, QUANTIZE_GOAL_US, out=8.0, alloc=5.0, launch=4.0))
    gemms = [name for name, _, _ in GEMM_ROWS if wanted(args, name)]
    if gemms or wanted(args, TORCH_GEMM):
        out.append(record("gemm", TORCH_GEMM, 20.0, 20.0, None))
    for name in gemms:
        out.append(record("gemm", f"native.gemm {name}", 150.0, 18.0, 20.0, out=16.0))
    return out


def measure(call, args) -> float:
    """Median issue_us of `call` over args.runs runs, each with the GPU held (timing.issue_us hold_s) for
    timing.hold_estimate (three times as long as 5 synchronized calls after the warm-up took per call, plus 2 ms;
    timing.held holds 4x longer where the issuing outlasted it): the host's cost alone, whatever the call's GPU
    work."""
    return measure_alternating([call], args)[0]


def measure_alternating(calls, args) -> list[float]:
    """`measure` of each call, their runs alternating (run 1 of each call, then run 2, ...): calls compared with
    one another see the same drift of the host."""
    holds = []
    for call in calls:
        for _ in range(args.warmup):
            call()
        holds.append(hold_estimate(call, args.iters))
    runs = [[] for _ in calls]
    for _ in range(args.runs):
        for i, call in enumerate(calls):
            got, holds[i] = held(lambda h, call=call: issue_us(call, args.iters, 1, hold_s=h), holds[i])
            runs[i].extend(got)
    return [statistics.median(got) for got in runs]


def plan_pieces(row: QuantRow, x: torch.Tensor, q) -> list:
    """The two pieces of the plan that allocated q (a planned call's result), as no-argument calls: a fresh output
    block without its clear, and the plan's launches into q's outputs (see the module docstring)."""
    from native.plan import STAMP
    from reference.types import SRSeed

    got = getattr(q, STAMP)
    plan, kw = got.plan, quant_args(row, x)
    seed = SRSeed.coerce(kw["rng"])
    return [lambda: plan.block.allocate(x.device, plan.index, clear=False),
            lambda: plan.run(x, seed, kw["amax"], kw["state"], into=got)]  # fmt: skip


def bound_launch_us(q, args) -> tuple[str, str, float]:
    """(kernel name, launch call, issue_us of one launch) of the last kernel of the plan that allocated q, fired alone
    as its out= calls fire it (`native.launch.BoundLaunch.fire`: q's pointers, the last call's x and seed;
    cuLaunchKernel, or cuLaunchKernelEx for a programmatic one): the driver's cost of a launch on this host. Its work
    is the last call's again (idempotent), or none where a tile counter is spent."""
    from native.launch import BoundLaunch, raw_stream
    from native.plan import STAMP

    step = getattr(q, STAMP).steps[-1]
    if not isinstance(step, BoundLaunch):
        raise ValueError("bound_launch_us needs a result that an out= call has written (its launches bound)")
    stream = raw_stream(step.index)
    call = "cuLaunchKernel" if step.programmatic_config is None else "cuLaunchKernelEx"
    return step.name, call, measure(lambda: step.fire(stream), args)


def measure_without_plans(call, args) -> float:
    """`measure` with `native.use_plans(False)`: every call takes the full path (the "before" column)."""
    import native

    native.use_plans(False)
    try:
        return measure(call, args)
    finally:
        native.use_plans(True)


def gpu_run(args) -> list[dict]:
    import native
    from native.plan import STAMP

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    n = args.size
    x = (torch.randn(n, n, generator=g) * 3).to(torch.bfloat16).to(dev)
    out, launched = [], False
    for row in QUANT_ROWS:
        if not wanted(args, row.name):
            continue
        ok, why = native.supports("quantize", row.config, dev)
        if not ok:
            print(f"# skip {row.name}: {why}", flush=True)
            continue
        call = quant_call(native.quantize, row, x)
        before = measure_without_plans(call, args)
        call()  # (plans on again: the signature's first call records its plan)
        q = call()  # a planned call's outputs: out= writes them again per call
        if getattr(q, STAMP, None) is None:  # (the call took the full path: its outputs are no plan's)
            print(f"# {row.name}: the planned call took the full path: no out= or piece timings", flush=True)
            out.append(record("quantize", row.name, before, measure(call, args), QUANTIZE_GOAL_US))
        else:  # the fresh call, out= and the pieces, their runs alternating
            after, in_place, alloc, launch = measure_alternating(
                [call, quant_call(native.quantize, row, x, out=q), *plan_pieces(row, x, q)], args)  # fmt: skip
            out.append(record("quantize", row.name, before, after, QUANTIZE_GOAL_US, out=in_place, alloc=alloc,
                              launch=launch))  # fmt: skip
            if not launched:
                name, call, t = bound_launch_us(q, args)
                print(f"# one {call} ({row.name}'s {name}, parameters bound): {t:.1f} us", flush=True)
                launched = True
        print(table(out[-1:]).splitlines()[1], flush=True)
    gemms = [r for r in GEMM_ROWS if wanted(args, r[0])]
    if not gemms and not wanted(args, TORCH_GEMM):
        return out
    pt = QuantConfig("fp8_current")
    a = native.quantize((torch.randn(n, n, generator=g)).to(torch.bfloat16).to(dev), pt)
    b = native.quantize((torch.randn(n, n, generator=g)).to(torch.bfloat16).to(dev), pt)
    a8, b8 = a.rowwise_data.view(torch.float8_e4m3fn), b.rowwise_data.view(torch.float8_e4m3fn)
    sa, sb = a.rowwise_scale.reshape(()), b.rowwise_scale.reshape(())

    def torch_mm():
        return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    t = measure(torch_mm, args)
    out.append(record("gemm", TORCH_GEMM, t, t, None))
    print(table(out[-1:]).splitlines()[1], flush=True)
    for name, a_cfg, b_cfg in gemms:
        ok, why = native.supports("gemm", a_cfg, dev)
        if not ok:
            print(f"# skip native.gemm {name}: {why}", flush=True)
            continue
        qa = native.quantize(torch.randn(n, n, generator=g).to(torch.bfloat16).to(dev), a_cfg)
        qb = native.quantize(torch.randn(n, n, generator=g).to(torch.bfloat16).to(dev), b_cfg)
        before = measure_without_plans(lambda qa=qa, qb=qb: native.gemm(qa, qb, layout="TN"), args)
        into = torch.empty(n, n, dtype=torch.bfloat16, device=dev)  # the in-place call's output (planned)
        goal, after, in_place = measure_alternating(
            [torch_mm, lambda qa=qa, qb=qb: native.gemm(qa, qb, layout="TN"),
             lambda qa=qa, qb=qb, y=into: native.gemm(qa, qb, layout="TN", out=y)], args)  # fmt: skip
        out.append(record("gemm", f"native.gemm {name} ({_method(a_cfg, dev)})", before, after, goal, out=in_place))
        print(table(out[-1:]).splitlines()[1], flush=True)
    return out


def _method(config: QuantConfig, dev) -> str:
    from native.gemm import resolve_method

    return resolve_method(config, "auto", dev)[0]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    if args.dry_run:
        print("# DRY RUN: rows checked on the CPU reference; every timing is a placeholder")
        records = dry_run(args)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: bench_host needs a GPU (or --dry-run)", file=sys.stderr)
            return 2
        print(f"# {torch.cuda.get_device_name()}; quantize bf16 [{args.size}, {args.size}] rowwise+colwise; GEMM TN "
              f"[{args.size}]^3 bf16 out; issue_us median of {args.runs} x {args.iters} calls", flush=True)  # fmt: skip
        records = gpu_run(args)
    print(table(records))
    print(f"# {time.perf_counter() - t0:.1f} s")
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            w.writerows(records)
    missed = [r["name"] for r in records if r["result"] == "MISS"]
    if missed:
        print(f"# goals missed: {', '.join(missed)}")
    return 1 if args.check_goals and missed else 0


if __name__ == "__main__":
    sys.exit(main())
