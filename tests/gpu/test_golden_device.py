"""A golden computed on the GPU is the CPU golden: same bytes, same rows (harness.runner, golden="same").

Source: harness/runner.py (GOLDEN_DEVICES: the reference runs on the candidate's device and the
comparison happens there), docs/numerics.md §0.2.8 (the reference gives identical bits on CPU and CUDA),
reference.gemm.device_independent (a GEMM whose fp64 sums are not exact keeps a CPU golden output).

Cases: a deterministic slice of the smoke tier (every op and scheme; every 3rd case), plus GEMMs
whose fp64 sums are not exact (the CPU fallback). Metrics from fp64 sums (rmse, sqnr_db) may differ
in their last digits between devices; every verdict, count and class must be equal.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness import golden, runner
from harness.cases import Case, load_cases
from harness.inputs import generate
from reference import QuantConfig
from reference.gemm import device_independent

_SMOKE = [c for c in load_cases("smoke") if math.prod(c.shape) <= 1 << 20][::3]
# Operands whose K sums span more than 52 bits (found by device_independent on the CPU).
_WIDE = [
    Case("gemm", QuantConfig("mxfp8"), (64, 96, 128), in_dtype="bfloat16", distribution="per_tile_scales", seed=0,
         layout="TN", out_dtype="bfloat16"),
    Case("gemm", QuantConfig("fp8_current", element="e5m2"), (64, 96, 128), in_dtype="bfloat16",
         distribution="outliers", seed=0, layout="TN", out_dtype="bfloat16"),
]
CASES = _SMOKE + _WIDE
_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}


def _same_bits(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is None:
        return
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    assert (a.dtype, a.shape) == (b.dtype, b.shape), what
    if a.dtype in _INT:
        nan = torch.isnan(a) & torch.isnan(b)  # float outputs: a NaN matches any NaN (payloads differ)
        a, b = a.view(_INT[a.dtype]), b.view(_INT[b.dtype])
        bad = (a != b) & ~nan
    else:
        bad = a != b
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} of {a.numel()} differ"


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_golden_on_cuda_has_the_cpu_goldens_bytes(case):
    gc, gd = runner.prepare(case, device="cpu"), runner.prepare(case, device="cuda")
    assert gc.error is None and gd.error is None, (gc.error, gd.error)
    assert gd.device.type == "cuda"
    if case.op == "gemm":
        for name in ("qa", "qb"):
            qc, qd = getattr(gc, name), getattr(gd, name)
            for f in ("rowwise_data", "rowwise_scale", "rowwise_amax", "colwise_data", "colwise_scale", "colwise_amax"):
                _same_bits(getattr(qc, f), getattr(qd, f), f"{name}.{f}")
        same, why = device_independent(gd.qa, gd.qb, case.layout or "TN")
        assert gd.out.device.type == ("cuda" if same else "cpu"), why
        _same_bits(gc.out, gd.out, "gemm out")
        return
    for f in ("rowwise_data", "rowwise_scale", "rowwise_amax", "colwise_data", "colwise_scale", "colwise_amax"):
        _same_bits(getattr(gc.quantized, f), getattr(gd.quantized, f), f)
    assert gc.dequantized.keys() == gd.dequantized.keys()
    for o in gc.dequantized:
        _same_bits(gc.dequantized[o], gd.dequantized[o], f"dequantized {o}")


_KEYS = ("tensor", "kind", "status", "n", "n_mismatch", "mismatch_classes", "ulp_hist")
_METRICS = ("max_abs", "max_rel", "rmse", "sqnr_db")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rows_with_a_cuda_golden_equal_rows_with_a_cpu_golden(case, backend):
    same = runner.run_case(case, backend, "cuda")
    cpu = runner.run_case(case, backend, "cuda", golden="cpu")
    assert [{k: r.get(k) for k in _KEYS} for r in same] == [{k: r.get(k) for k in _KEYS} for r in cpu]
    for rs, rc in zip(same, cpu, strict=True):
        for k in _METRICS:
            a, b = rs.get(k), rc.get(k)
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                assert (a is None and b is None) or a == b or (a != a and b != b), (rs["tensor"], k, a, b)
            else:
                assert a == pytest.approx(b, rel=1e-9, abs=1e-300), (rs["tensor"], k, a, b)


@pytest.mark.gpu
def test_cases_of_one_input_key_share_one_device_copy_but_get_their_own_tensors(monkeypatch):
    monkeypatch.setattr(golden, "INPUTS", golden.InputCache())
    a, b = (Case("quantize", QuantConfig("mxfp8", element=e), (64, 96), in_dtype="bfloat16", distribution="normal",
                 seed=0, orientation="both") for e in ("e4m3", "e5m2"))
    ga = runner.prepare(a, device="cuda")
    kept = golden.INPUTS.moved[ga.device]["x"]
    ga.on_device["x"].fill_(7.0)  # a backend scribbling on its device input must not reach the next case
    gb = runner.prepare(b, device="cuda")
    assert golden.INPUTS.moved[gb.device]["x"] is kept  # moved once for the group
    assert gb.on_device["x"].data_ptr() not in (kept.data_ptr(), ga.on_device["x"].data_ptr())
    assert torch.equal(gb.on_device["x"].cpu(), gb.inputs["x"]) and torch.equal(gb.inputs["x"], generate(b)["x"])


@pytest.mark.gpu
def test_the_auto_golden_runs_small_cases_on_the_cpu_with_the_same_rows():
    """golden="auto" (the CLI default): a case at or below AUTO_CPU_WORK gets its golden on the CPU, a larger one
    on the GPU; the rows equal the "same" rows either way."""
    small = Case("quantize", QuantConfig("nvfp4"), (64, 96), in_dtype="bfloat16", distribution="normal", seed=2,
                 orientation="both")
    large = Case("quantize", QuantConfig("nvfp4"), (1024, 1040), in_dtype="bfloat16", distribution="normal", seed=2,
                 orientation="both")
    for case, where in ((small, "cpu"), (large, "cuda")):
        once = runner.GoldenOnce(case, "cuda", "auto")
        assert once().device.type == where
        auto = runner.run_case(case, "native", "cuda", golden="auto")
        same = runner.run_case(case, "native", "cuda")
        assert [{k: r.get(k) for k in _KEYS} for r in auto] == [{k: r.get(k) for k in _KEYS} for r in same]
        assert all(r["status"] in ("pass", "info") for r in auto)
