"""`native.modules.precompile` and the native backend's `prepare`: every module a sweep needs is
compiled up front (in parallel) into the cubin cache, and the kernels then load from it.

Source: docs/design.md §2 (one cached module per (file, config, arch)), native/_compile.py (the cache).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import native
from harness.backends import NativeBackend
from harness.cases import Case
from native import _compile
from native.modules import modules_for, precompile
from reference import QuantConfig


def _cubins(d):
    return sorted(p.name for p in d.rglob("*.cubin"))


@pytest.mark.gpu
def test_precompile_fills_the_cache_that_quantize_and_gemm_then_use(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMERICS_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setattr(_compile, "_MODULES", {})  # this process loads modules afresh from the new cache
    # (`native.quantize` is the function; the modules are looked up by name)
    caches = [importlib.import_module("native.launch").module_for,
              importlib.import_module("native.nvfp4")._cached_launcher]
    for cached in caches:
        cached.cache_clear()
    cfgs = [QuantConfig("mxfp8"), QuantConfig("fp8_block", tile=(128, 128)), QuantConfig("nvfp4", rht=True)]
    items = [m for c in cfgs for m in modules_for("quantize", c)] * 2  # duplicates count once
    items += modules_for("gemm", QuantConfig("mxfp8"), out_dtype=torch.float32)  # portable on sm_90
    # one module per config, fp8_per_tensor.cu's fp8_current build for the NVFP4 plan's fill_given, the GEMM's
    assert precompile(items) == len(cfgs) + 1 + (1 if items[-1][0] == "block_scaled_gemm.cu" else 0)
    files = _cubins(tmp_path)
    assert len(files) == precompile(items)  # a second call finds every cubin in the cache
    x = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    for c in cfgs:
        native.quantize(x, c, rowwise=True, colwise=True)
    assert _cubins(tmp_path) == files  # nothing was compiled at first use
    for cached in caches:
        cached.cache_clear()  # later tests must not keep modules loaded from this temporary cache


@pytest.mark.gpu
def test_native_backend_prepare_covers_the_cases_it_supports(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMERICS_HARNESS_CACHE", str(tmp_path))
    cases = [Case("quantize", QuantConfig("fp8_current"), (32, 32)),
             Case("dequantize", QuantConfig("fp8_current"), (32, 32)),  # same module
             Case("quantize", QuantConfig("mxfp8", e8m0_rule="floor"), (32, 32)),
             Case("gemm", QuantConfig("fp8_current"), (32, 32, 32))]  # cuBLASLt: no module
    line = NativeBackend().prepare(cases, "cuda")
    assert line.startswith("native: 2 CUDA modules") and len(_cubins(tmp_path)) == 2
    assert NativeBackend().prepare(cases, "cpu") is None
