"""Reference quantizer speed and peak extra memory on CPU, side by side with TE's Python references.

Usage:
    python benchmarks/bench_reference.py [--size 8192] [--te-root PATH] [--schemes nvfp4_rht,fp8_block,mxfp8]

--te-root is a TransformerEngine checkout or bare git directory. Its Python references
(tests/pytorch/references/blockwise_quantizer_reference.py and
transformer_engine/pytorch/custom_recipes/reference_nvfp4.py) are loaded from there at run time,
with small stand-ins for the TE package modules they import; nothing of TE lives in this project.
Every measurement runs in this one process, alternating ours and TE's on the same bf16 input.
Peak extra memory = the highest resident set size sampled every 2 ms during the call, minus the
resident size just before it (input already allocated).
"""

from __future__ import annotations

import argparse
import enum
import gc
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference import QuantConfig, quantize  # noqa: E402

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
    with PeakSampler() as s:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
    del out
    gc.collect()
    return dt, s.extra


# ---- loading TE's references from a checkout or git dir -------------------------------------


def te_source(root: Path, rel: str) -> str:
    if (root / rel).is_file():
        return (root / rel).read_text()
    return subprocess.run(
        ["git", f"--git-dir={root}", "show", f"HEAD:{rel}"], check=True, capture_output=True, text=True
    ).stdout


def load_module(name: str, source: str, filename: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod
    exec(compile(source, filename, "exec"), mod.__dict__)
    return mod


def load_te(root: Path):
    """Load TE's blockwise and NVFP4 Python references; returns (blockwise_quantize, nvfp4_quantize)."""
    for pkg in ("references", "transformer_engine", "transformer_engine.pytorch",
                "transformer_engine.pytorch.custom_recipes"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    load_module("references.quantize_scale_calc", te_source(root, "tests/pytorch/references/quantize_scale_calc.py"),
                "te:quantize_scale_calc.py")
    bw = load_module("references.blockwise_quantizer_reference",
                     te_source(root, "tests/pytorch/references/blockwise_quantizer_reference.py"),
                     "te:blockwise_quantizer_reference.py")
    load_module("transformer_engine.pytorch.custom_recipes.reference_utils",
                te_source(root, "transformer_engine/pytorch/custom_recipes/reference_utils.py"), "te:reference_utils.py")
    # Stand-in for the GEMM module, which the NVFP4 reference needs only for qgemm's annotations.
    gemm = types.ModuleType("transformer_engine.pytorch.custom_recipes.gemm")
    gemm.GEMMType = enum.Enum("GEMMType", "FPROP DGRAD WGRAD")
    gemm.MMParams = type("MMParams", (), {})
    sys.modules[gemm.__name__] = gemm
    sys.modules["transformer_engine.pytorch.custom_recipes"].gemm = gemm

    # Minimal stand-ins for the two base classes the NVFP4 reference subclasses (our code).
    qt = types.ModuleType("transformer_engine.pytorch.quantized_tensor")

    class QuantizedTensorStorage:  # noqa: D401 - stand-in
        pass

    class Quantizer:
        def __init__(self, *, rowwise: bool = True, columnwise: bool = True):
            self.rowwise_usage, self.columnwise_usage = rowwise, columnwise

    qt.QuantizedTensorStorage, qt.Quantizer = QuantizedTensorStorage, Quantizer
    sys.modules["transformer_engine.pytorch.quantized_tensor"] = qt
    nv = load_module("transformer_engine.pytorch.custom_recipes.reference_nvfp4",
                     te_source(root, "transformer_engine/pytorch/custom_recipes/reference_nvfp4.py"),
                     "te:reference_nvfp4.py")
    utils = sys.modules["transformer_engine.pytorch.custom_recipes.reference_utils"]

    def te_block(x):
        return bw.BlockwiseQuantizerReference().quantize(
            x, torch.float8_e4m3fn, return_transpose=True, pow_2_scales=True, quant_tile_shape=(1, 128)
        )

    def te_nvfp4_rht(x):
        q = nv.NVFP4QuantizerRef(utils.Fp4Formats.E2M1, rowwise=True, columnwise=True, with_rht=True)
        return q._quantize(x)

    return te_block, te_nvfp4_rht


OURS = {
    "nvfp4_rht": QuantConfig("nvfp4", rht=True),
    "fp8_block": QuantConfig("fp8_block", tile=(1, 128)),
    "mxfp8": QuantConfig("mxfp8"),
}
GOALS_S = {"mxfp8": 2.0}  # issue goal; nvfp4_rht and fp8_block: at most TE's time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--te-root", type=Path, default=None)
    ap.add_argument("--schemes", default=",".join(OURS))
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
          f"{torch.get_num_threads()} threads")
    print(f"{'scheme':<10} {'impl':<4} {'time_s':>8} {'extra_MiB':>10} {'extra/input':>12}")
    failed = False
    for name in args.schemes.split(","):
        cfg = OURS[name]
        t_ours, m_ours = measure(lambda cfg=cfg: quantize(x, cfg, rowwise=True, colwise=True))
        print(f"{name:<10} {'ours':<4} {t_ours:8.2f} {m_ours / 2**20:10.0f} {m_ours / in_bytes:12.2f}")
        goal = GOALS_S.get(name)
        if name in te:
            t_te, m_te = measure(lambda fn=te[name]: fn(x))
            print(f"{name:<10} {'TE':<4} {t_te:8.2f} {m_te / 2**20:10.0f} {m_te / in_bytes:12.2f}")
            goal = t_te
        ok_t = goal is None or t_ours <= goal
        ok_m = m_ours <= 6 * in_bytes
        failed |= not (ok_t and ok_m)
        print(f"{'':<10} goal: time <= {goal if goal is None else round(goal, 2)} s: {'ok' if ok_t else 'MISSED'}; "
              f"extra memory <= 6x input: {'ok' if ok_m else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
