"""Reference quantizer speed and peak extra memory on CPU, side by side with TE's Python references.

Usage:
    python benchmarks/bench_reference.py [--size 8192] [--te-root PATH] [--schemes nvfp4_rht,fp8_block,mxfp8]
                                         [--repeat 5] [--threads N]

--te-root is a TransformerEngine checkout or bare git directory. Its Python references
(tests/pytorch/references/blockwise_quantizer_reference.py and
transformer_engine/pytorch/custom_recipes/reference_nvfp4.py) are loaded from there at run time,
by tests/te_reference.py (the loader shared with tests/unit/test_te_parity.py), with small stand-ins
for the TE package modules they import; nothing of TE lives in this project.
Every measurement runs in this one process on the same bf16 input (rowwise + colwise copies). Per
scheme: one untimed warm-up call of each implementation, which also measures peak extra memory (the
highest resident set size sampled every 2 ms during the call, minus the resident size just before it,
input already allocated); then --repeat timed rounds, each round ours then TE's, so that a change of
machine load hits both. Reported: the median time of each, and ratio = TE median / ours median.
Goals (issue 18 item 4): fp8_block 1x128 ratio >= 1.5, nvfp4 + RHT ratio >= 5, mxfp8 <= 2 s;
extra memory <= 6x the input. Exit code 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference import QuantConfig, quantize  # noqa: E402
from tests import te_reference  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler:
    def __init__(self, period_s: float = 0.002):
        self.period_s, self.peak, self._stop = period_s, 0, threading.Event()

    def __enter__(self):
        gc.collect()
        self.base = rss()
        self.peak = self.base
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(self.period_s)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def measure(fn):
    """(seconds, peak extra bytes) of one call, with the memory sampler running."""
    with PeakSampler() as s:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
    del out
    gc.collect()
    return dt, s.extra


def timed(fn) -> float:
    """Seconds of one call (no sampler thread)."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    del out
    return dt


def load_te(root: Path):
    """Load TE's blockwise and NVFP4 Python references; returns (blockwise_quantize, nvfp4_quantize)."""
    te = te_reference.load(root)

    def te_block(x):
        return te.blockwise.BlockwiseQuantizerReference().quantize(
            x, torch.float8_e4m3fn, return_transpose=True, pow_2_scales=True, quant_tile_shape=(1, 128)
        )

    def te_nvfp4_rht(x):
        q = te.nvfp4.NVFP4QuantizerRef(te.utils.Fp4Formats.E2M1, rowwise=True, columnwise=True, with_rht=True)
        return q._quantize(x)

    return te_block, te_nvfp4_rht


OURS = {
    "nvfp4_rht": QuantConfig("nvfp4", rht=True),
    "fp8_block": QuantConfig("fp8_block", tile=(1, 128)),
    "mxfp8": QuantConfig("mxfp8"),
}
GOALS_S = {"mxfp8": 2.0}  # issue 18 item 4: at most this many seconds
GOALS_RATIO = {"fp8_block": 1.5, "nvfp4_rht": 5.0}  # issue 18 item 4: TE median / ours median at least this


@dataclass
class Result:
    scheme: str
    ours_s: list[float]
    ours_extra: int
    te_s: list[float] | None = None
    te_extra: int | None = None

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.te_s) / statistics.median(self.ours_s) if self.te_s else None


def run_scheme(name: str, x: torch.Tensor, te_fn, repeat: int) -> Result:
    """Warm-up (and memory) call of each implementation, then `repeat` alternating timed rounds."""
    cfg = OURS[name]

    def ours():
        return quantize(x, cfg, rowwise=True, colwise=True)

    res = Result(name, [], measure(ours)[1])
    if te_fn is not None:
        res.te_s, res.te_extra = [], measure(lambda: te_fn(x))[1]
    for _ in range(repeat):
        res.ours_s.append(timed(ours))
        if te_fn is not None:
            res.te_s.append(timed(lambda: te_fn(x)))
    return res


def verdict(res: Result, in_bytes: int) -> tuple[bool, str]:
    """(all goals met, one line naming each goal and whether it is met)."""
    parts, ok = [], True
    if res.scheme in GOALS_RATIO and res.ratio is not None:
        good = res.ratio >= GOALS_RATIO[res.scheme]
        parts.append(f"TE/ours >= {GOALS_RATIO[res.scheme]}: {'ok' if good else 'MISSED'}")
        ok &= good
    if res.scheme in GOALS_S:
        good = statistics.median(res.ours_s) <= GOALS_S[res.scheme]
        parts.append(f"time <= {GOALS_S[res.scheme]} s: {'ok' if good else 'MISSED'}")
        ok &= good
    good = res.ours_extra <= 6 * in_bytes
    parts.append(f"extra memory <= 6x input: {'ok' if good else 'MISSED'}")
    return ok and good, "; ".join(parts)


def table(results: list[Result], in_bytes: int) -> list[str]:
    """The report: one line per implementation (median, min, max, extra memory), the ratio and the goals."""
    lines = [f"{'scheme':<10} {'impl':<4} {'median_s':>9} {'min_s':>7} {'max_s':>7} {'extra_MiB':>10} "
             f"{'extra/in':>9} {'TE/ours':>8}"]
    for r in results:
        impls = [("ours", r.ours_s, r.ours_extra)] + ([("TE", r.te_s, r.te_extra)] if r.te_s else [])
        for impl, ts, extra in impls:
            ratio = f"{r.ratio:8.2f}" if impl == "ours" and r.ratio is not None else f"{'':>8}"
            lines.append(f"{r.scheme:<10} {impl:<4} {statistics.median(ts):9.3f} {min(ts):7.3f} {max(ts):7.3f} "
                         f"{extra / 2**20:10.0f} {extra / in_bytes:9.2f} {ratio}")
        lines.append(f"{'':<10} goals: {verdict(r, in_bytes)[1]}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--te-root", type=Path, default=None)
    ap.add_argument("--schemes", default=",".join(OURS))
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds per scheme (each: ours, then TE)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    te = {}
    if args.te_root:
        te_block, te_nvfp4 = load_te(args.te_root)
        te = {"fp8_block": te_block, "nvfp4_rht": te_nvfp4}
    x = torch.randn(args.size, args.size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    in_bytes = x.numel() * x.element_size()
    print(f"input bf16 {args.size}x{args.size} ({in_bytes / 2**20:.0f} MiB), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.repeat} alternating rounds, load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    results = [run_scheme(name, x, te.get(name), args.repeat) for name in args.schemes.split(",")]
    print("\n".join(table(results, in_bytes)))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0 if all(verdict(r, in_bytes)[0] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
