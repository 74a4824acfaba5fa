"""One pass of every native kernel on small odd shapes, to run under compute-sanitizer.

Usage:
    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_native.py
    python benchmarks/sanitize_native.py --list            # the case names, nothing runs
    python benchmarks/sanitize_native.py --filter gemm     # only cases whose name contains "gemm"

Also worth a run (same command, other tools): `--tool racecheck` (shared-memory races, e.g. in the
transposing tiles), `--tool synccheck`, `--tool initcheck` (reads of never-written device memory).

Cases (each synchronizes; one line per case: PASS / FAIL / SKIP, then a summary):
- quantize (the full path, then a planned call and an out= call of the same signature) + dequantize,
  every scheme x toggle (element, pow2, eps, tile, E8M0 rule, RHT, SR,
  delayed history length / algo / margin, the NVFP4 4over6 and row-scaled variants) x orientation
  (rowwise, colwise, both), bf16 input on an odd shape; then the scheme's base config on every input
  dtype x several shapes, including a vector-friendly one and a misaligned (not 16-byte aligned) input
  view, dequantizing to fp32, bf16 and fp16. Inputs hold NaN, +-Inf, -0 and subnormals at a few positions.
- fp8_delayed: the fused history update (native.update_amax_history) with and without a reduced
  amax, for history lengths 1, 5, 1024 and 1537.
- GEMMs that run on sm_90: the portable kernel for every scheme (per-tensor, fp8_block 1Dx1D /
  1Dx2D / 2Dx1D, mxfp8, nvfp4 incl. RHT), every layout (TN, NN, NT), bf16 and fp32 output, with and
  without bias + C; cuBLASLt per-tensor (split and fast accumulation) and blockwise (VEC128 /
  BLK128x128). Operands are quantized by reference.quantize on the CPU and moved to the GPU, so a
  GEMM case does not depend on the quantizers. A GEMM method this machine cannot run is a SKIP.

PyTorch's caching allocator hides out-of-bounds accesses inside its pooled segments, so this
script sets PYTORCH_NO_CUDA_MEMORY_CACHING=1 before torch starts (unless --caching-allocator).
Kernels compile with NVRTC on first use (cached on disk; see native/_compile.py): running the
script once without the sanitizer first makes the sanitized run shorter but is not required.
Exit code: 0 all passed (skips allowed unless --fail-on-skip), 1 a case raised, 2 no GPU.
"""

from __future__ import annotations

import os
import sys

if "--caching-allocator" not in sys.argv:
    # Must happen before torch initialises CUDA: every tensor gets its own cudaMalloc, so the
    # sanitizer sees each buffer's real bounds.
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import argparse  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference import QuantConfig  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
SR_SEED = ((1 << 40) + 77, 5)
DEVICE = "cuda"
_ORIENTS = {"rowwise": (True, False), "colwise": (False, True), "both": (True, True)}


class Skip(Exception):
    """A case this machine cannot run (native.supports / Unsupported), with the reason."""


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def make_input(m: int, k: int, dtype: torch.dtype, seed: int, *, misaligned: bool = False) -> torch.Tensor:
    """A CUDA [m, k] tensor: normal * 3 with NaN, +-Inf, -0 and a subnormal at a few positions.

    `misaligned`: a contiguous view starting one element into its buffer (not 16-byte aligned),
    which sends the kernels down their scalar (non-vector) load paths.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    flat = x.view(-1)
    n = flat.numel()
    tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal of the input dtype
    for i, v in zip((0, n // 3, n // 2, (2 * n) // 3, n - 1), (float("nan"), float("inf"), -0.0, tiny, float("-inf")), strict=True):
        flat[i] = v
    x = x.to(dtype)
    if not misaligned:
        return x.to(DEVICE)
    buf = torch.empty(n + 8, dtype=dtype, device=DEVICE)
    view = buf[1 : 1 + n].view(m, k)
    view.copy_(x.to(DEVICE))
    return view


# --------------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------------


def _quantize_case(native, cfg: QuantConfig, m: int, k: int, dt: str, orient: str, out_dtypes, *,
                   misaligned: bool = False, state=None):
    def run():
        ok, why = native.supports("quantize", cfg, DEVICE)
        if not ok:
            raise Skip(why)
        x = make_input(m, k, DTYPES[dt], seed=m * 7 + k, misaligned=misaligned)
        row, col = _ORIENTS[orient]
        rng = SR_SEED if cfg.stochastic else None
        q = native.quantize(x, cfg, rowwise=row, colwise=col, rng=rng, state=state)
        torch.cuda.synchronize()
        # The same signature again: a planned call, then one into its outputs (out=): the plans' own launches
        # (NVFP4's quantize kernel launched programmatically, docs/design.md §4.1).
        planned = native.quantize(x, cfg, rowwise=row, colwise=col, rng=rng, state=state)
        native.quantize(x, cfg, rowwise=row, colwise=col, rng=rng, state=state, out=planned)
        torch.cuda.synchronize()
        for o, on in (("rowwise", row), ("colwise", col)):
            if on:
                for out in out_dtypes:
                    native.dequantize(q, o, out)
                    torch.cuda.synchronize()

    return run


def _delayed_update_case(native, cfg: QuantConfig, with_reduced: bool):
    def run():
        from reference.per_tensor import AmaxHistory

        ok, why = native.supports("quantize", cfg, DEVICE)
        if not ok:
            raise Skip(why)
        state = AmaxHistory(cfg, device=DEVICE)
        L = cfg.amax_history_len
        state.history.copy_(torch.linspace(0.5, 7.0, L, device=DEVICE))  # (L,) a non-trivial window
        for step in range(3):
            native.quantize(make_input(35, 67, torch.bfloat16, seed=step), cfg, rowwise=True, colwise=True, state=state)
            reduced = torch.tensor([2.5 * (step + 1)], device=DEVICE) if with_reduced else None
            native.update_amax_history(state, reduced)
            torch.cuda.synchronize()
        native.update_amax_history(state, torch.zeros(1, device=DEVICE) if with_reduced else None)
        torch.cuda.synchronize()

    return run


def quantize_cases(native) -> list[tuple[str, object]]:
    """(name, callable) for every quantizer / dequantizer kernel path."""
    cases: list[tuple[str, object]] = []
    # scheme -> (toggle configs, odd shape, dtype x shape sweep, base configs swept over dtypes/shapes)
    cur = [QuantConfig("fp8_current"), QuantConfig("fp8_current", element="e5m2"),
           QuantConfig("fp8_current", pow2_scales=True), QuantConfig("fp8_current", eps=0.5)]
    dly = [QuantConfig("fp8_delayed", amax_history_len=16),
           QuantConfig("fp8_delayed", element="e5m2", amax_history_len=5, amax_compute_algo="most_recent", margin=1)]
    blk = [QuantConfig("fp8_block"), QuantConfig("fp8_block", pow2_scales=False), QuantConfig("fp8_block", element="e5m2"),
           QuantConfig("fp8_block", eps=2.0**-20), QuantConfig("fp8_block", tile=(128, 128)),
           QuantConfig("fp8_block", tile=(128, 128), pow2_scales=False)]
    mxf = [QuantConfig("mxfp8"), QuantConfig("mxfp8", e8m0_rule="floor"), QuantConfig("mxfp8", element="e5m2"),
           QuantConfig("mxfp8", tile=(32, 32)), QuantConfig("mxfp8", tile=(32, 32), element="e5m2", e8m0_rule="floor")]
    nvf = [QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16)), QuantConfig("nvfp4", stochastic=True),
           QuantConfig("nvfp4", rht=True), QuantConfig("nvfp4", rht=True, stochastic=True)]
    # NUMERICS: §5.10 variants (one launch per kernel for both copies; row-scaled 4over6 has no colwise copy)
    nvv = [QuantConfig("nvfp4", variant="4over6"), QuantConfig("nvfp4", tile=(16, 16), variant="4over6"),
           QuantConfig("nvfp4", variant="4over6", e4m3_max=256, err_mode="mse"), QuantConfig("nvfp4", variant="row_scaled"),
           QuantConfig("nvfp4", variant="row_scaled_4over6")]
    plan = [
        (cur, (130, 257), [(3, 200), (130, 257), (160, 288), (64, 256)], cur[:1]),
        (dly, (130, 257), [(3, 200), (130, 257), (160, 288), (64, 256)], dly[:1]),
        (blk, (130, 257), [(3, 200), (130, 257), (160, 288), (256, 384)], [blk[0], blk[4]]),
        (mxf, (96, 160), [(32, 96), (64, 32), (160, 288), (96, 160)], [mxf[0], mxf[3]]),
        (nvf, (48, 80), [(16, 48), (48, 80)], nvf[:3]),
        (nvv, (48, 80), [(16, 48), (48, 80)], [nvv[0], nvv[3]]),
    ]
    outs = [torch.float32, torch.bfloat16, torch.float16]
    for configs, (m, k), sweep, bases in plan:
        for cfg in configs:
            for orient in ("rowwise",) if cfg.variant == "row_scaled_4over6" else _ORIENTS:
                cases.append((f"quantize {cfg.id} bf16 {m}x{k} {orient}",
                              _quantize_case(native, cfg, m, k, "bf16", orient, [torch.float32])))
        for base in bases:
            for i, (dt, (mm, kk)) in enumerate((d, s) for d in DTYPES for s in sweep):
                cases.append((f"quantize {base.id} {dt} {mm}x{kk} both",
                              _quantize_case(native, base, mm, kk, dt, "both", [outs[i % 3]])))
            for dt in DTYPES:
                mm, kk = sweep[-1]
                cases.append((f"quantize {base.id} {dt} {mm}x{kk} both misaligned",
                              _quantize_case(native, base, mm, kk, dt, "both", outs, misaligned=True)))
        for cfg in [c for c in configs if c.rht]:  # NUMERICS: §5.6 - RHT takes bf16 input only
            for mm, kk in sweep:
                cases.append((f"quantize {cfg.id} bf16 {mm}x{kk} both",
                              _quantize_case(native, cfg, mm, kk, "bf16", "both", outs)))
    for L in (1, 5, 1024, 1537):
        for algo in ("max", "most_recent"):
            cfg = QuantConfig("fp8_delayed", amax_history_len=L, amax_compute_algo=algo)
            for red in (False, True):
                cases.append((f"delayed_update {cfg.id} reduced={red}", _delayed_update_case(native, cfg, red)))
    return cases


def _gemm_case(native_gemm, ca, cb, mnk, layout, method, out_dtype, with_extra, bias_bf16=True):
    def run():
        import reference
        from native.gemm import supports_gemm
        from reference.types import Unsupported

        ok, why = supports_gemm(ca, torch.device(DEVICE), method)
        if not ok:
            raise Skip(why)
        m, n, k = mnk
        shapes = {"TN": ((m, k), (n, k)), "NN": ((m, k), (k, n)), "NT": ((k, m), (k, n))}[layout]
        qs = []
        for i, (cfg, shp) in enumerate(zip((ca, cb), shapes, strict=True)):
            g = torch.Generator().manual_seed(100 + i)
            x = (torch.randn(*shp, generator=g) * 2).to(torch.bfloat16)
            rng = (SR_SEED[0], SR_SEED[1] + 2 * i) if cfg.stochastic else None
            qs.append(reference.quantize(x, cfg, rowwise=True, colwise=True, rng=rng).to(DEVICE))
        g = torch.Generator().manual_seed(7)
        bias = c = None
        if with_extra:
            bias = torch.randn(n, generator=g).to(torch.bfloat16 if bias_bf16 else torch.float32).to(DEVICE)
            c = torch.randn(m, n, generator=g).to(out_dtype).to(DEVICE)
        try:
            native_gemm(qs[0], qs[1], layout=layout, out_dtype=out_dtype, bias=bias, c=c, method=method)
        except Unsupported as e:
            raise Skip(str(e)) from e
        torch.cuda.synchronize()

    return run


def gemm_cases(native) -> list[tuple[str, object]]:
    """(name, callable) for every GEMM method that runs on sm_90."""
    gemm = native.gemm
    pt, pt5 = QuantConfig("fp8_current"), QuantConfig("fp8_current", element="e5m2")
    dl = QuantConfig("fp8_delayed", amax_history_len=4)
    b1, b2, b1e5 = QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128)), QuantConfig("fp8_block", element="e5m2")
    mx, mx5, mx2 = QuantConfig("mxfp8"), QuantConfig("mxfp8", element="e5m2"), QuantConfig("mxfp8", tile=(32, 32))
    nv, nv2, nvr = QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16)), QuantConfig("nvfp4", rht=True, stochastic=True)
    all3 = ("TN", "NN", "NT")
    # (id, a, b, (M, N, K), layouts)
    portable = [
        ("per_tensor", pt, pt, (23, 41, 57), all3),
        ("per_tensor-e4m3xe5m2", pt, pt5, (23, 41, 57), all3),
        ("fp8_delayed", dl, dl, (23, 41, 57), ("TN",)),
        ("fp8_block-1dx1d", b1, b1, (72, 40, 200), all3),
        ("fp8_block-1dx2d", b1, b2, (72, 40, 200), ("TN", "NN")),
        ("fp8_block-2dx1d", b2, b1, (72, 40, 200), ("TN", "NT")),
        ("fp8_block-e4m3xe5m2", b1, b1e5, (72, 40, 200), ("NN",)),
        ("mxfp8", mx, mx, (64, 32, 96), all3),
        ("mxfp8-e5m2xe4m3", mx5, mx, (64, 32, 96), ("TN",)),
        ("mxfp8-1dx32x32", mx, mx2, (64, 32, 96), ("NN",)),
        ("nvfp4", nv, nv, (32, 48, 80), all3),
        ("nvfp4-1x16x16x16", nv, nv2, (32, 48, 80), ("TN",)),
        ("nvfp4-rht-sr", nvr, nvr, (32, 48, 80), ("TN", "NT")),
    ]
    cases: list[tuple[str, object]] = []
    for gid, ca, cb, mnk, layouts in portable:
        for layout in layouts:
            for out, extra in ((torch.bfloat16, False), (torch.float32, True)):
                name = f"gemm portable {gid} {layout} {'x'.join(map(str, mnk))} -> {str(out)[6:]}{' +bias+C' if extra else ''}"
                cases.append((name, _gemm_case(gemm, ca, cb, mnk, layout, "portable", out, extra)))
    lt = [
        ("per_tensor", pt, pt, (32, 48, 64), all3, ("cublaslt", "cublaslt_fast_accum")),
        ("per_tensor-e4m3xe5m2", pt, pt5, (32, 48, 64), ("TN", "NT"), ("cublaslt", "cublaslt_fast_accum")),
        ("fp8_block-1dx1d", b1, b1, (136, 72, 384), all3, ("cublaslt",)),
        ("fp8_block-1dx2d", b1, b2, (136, 72, 384), ("TN", "NN"), ("cublaslt",)),
        ("fp8_block-2dx1d", b2, b1, (136, 72, 384), ("TN", "NT"), ("cublaslt",)),
    ]
    for gid, ca, cb, mnk, layouts, methods in lt:
        for method in methods:
            for layout in layouts:
                for out, extra in ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, True)):
                    name = (f"gemm {method} {gid} {layout} {'x'.join(map(str, mnk))} -> {str(out)[6:]}"
                            f"{' +bias+C' if extra else ''}")
                    cases.append((name, _gemm_case(gemm, ca, cb, mnk, layout, method, out, extra)))
    # The emulated epilogue (a bias that is not exactly bf16: cuBLASLt writes fp32 Y, torch adds).
    cases.append(("gemm cublaslt per_tensor TN 32x48x64 -> bfloat16 +fp32 bias+C (emulated epilogue)",
                  _gemm_case(gemm, pt, pt, (32, 48, 64), "TN", "cublaslt", torch.bfloat16, True, bias_bf16=False)))
    return cases


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def all_cases(native) -> list[tuple[str, object]]:
    return quantize_cases(native) + gemm_cases(native)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring.")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    ap.add_argument("--filter", default=None, help="run only cases whose name contains this substring")
    ap.add_argument("--fail-on-skip", action="store_true", help="exit 1 if any case was skipped")
    ap.add_argument("--stop-on-fail", action="store_true", help="stop at the first failing case")
    ap.add_argument("--caching-allocator", action="store_true",
                    help="keep PyTorch's caching allocator (hides out-of-bounds accesses inside its pools)")
    args = ap.parse_args(argv)

    import native

    cases = [(n, f) for n, f in all_cases(native) if not args.filter or args.filter in n]
    if args.list:
        for n, _ in cases:
            print(n)
        print(f"{len(cases)} cases")
        return 0
    if not torch.cuda.is_available():
        print("sanitize_native needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.set_float32_matmul_precision("highest")
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name} (sm_{props.major}{props.minor})  torch {torch.__version__}  "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')}  "
          f"{len(cases)} cases", flush=True)
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    failures, t_all = [], time.perf_counter()
    for name, fn in cases:
        t0 = time.perf_counter()
        try:
            fn()
            torch.cuda.synchronize()
            status, note = "PASS", ""
        except Skip as e:
            status, note = "SKIP", str(e).splitlines()[0][:160]
        except Exception as e:
            status, note = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            failures.append((name, traceback.format_exc()))
        counts[status] += 1
        ms = (time.perf_counter() - t0) * 1e3
        print(f"{status} {name} ({ms:.0f} ms){'  ' + note if note else ''}", flush=True)
        if status == "FAIL" and args.stop_on_fail:
            break
    for name, tb in failures[:5]:
        print(f"\n--- FAIL {name}\n{tb}", file=sys.stderr)
    print(f"# {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"in {time.perf_counter() - t_all:.1f} s", flush=True)
    if counts["FAIL"] or (args.fail_on_skip and counts["SKIP"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
