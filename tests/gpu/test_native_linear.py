"""The native module step on the GPU (native/linear.py; docs/numerics.md §9, §9.8).

Run by the lead on a GPU machine (`pytest -m gpu tests/gpu/test_native_linear.py`). Every recipe, both modules,
3 steps with the weight cache: the native backend's run (native quantizers, GEMMs, amax update) compared along
the chain with the golden run on the same device (harness.chain). Quantized operands must match byte for
byte and every GEMM and gradient must stay within its bound; where this GPU lacks a GEMM (e.g. MXFP8 on
sm_90 without the portable kernel) the case must be a skip with the reason.
"""

from __future__ import annotations

import pytest
import torch

from harness.cases import Case
from harness.runner import run_case

pytestmark = pytest.mark.gpu

IDS = [
    "linear-delayed-bf16-t2x64-k128-n256-bias-st3-mb_cache-normal-s0",
    "layernorm_linear-LayerNorm-current-bf16-t2x64-k128-n256-st3-mb_cache_update-normal-s1",
    "linear-mxfp8-bf16-t2x64-k256-n128-fuse-st3-mb_none-normal-s0",
    "layernorm_linear-RMSNorm-block-f32-t2x64-k128-n256-bias-st3-mb_cache-normal-s0",
    "linear-nvfp4-bf16-t2x64-k128-n256-st3-mb_cache-normal-s0",
    "layernorm_linear-RMSNorm-nvfp4-nrht-n2d-f32-t2x64-k256-n128-st3-mb_cache-normal-s2",
]


@pytest.mark.parametrize("case_id", IDS)
def test_native_module_step_follows_the_golden_chain(case_id):
    rows = run_case(Case.from_id(case_id), "native", "cuda")
    if len(rows) == 1 and rows[0]["status"] == "skip":
        pytest.skip(rows[0]["reason"])
    chain = next(r for r in rows if r["tensor"] == "chain")
    assert chain["status"] == "pass", chain["reason"]
    quantized = [r for r in rows if r["tensor"].split(".")[1:2] in (["x_q"], ["w_q"], ["dy_q"])]
    assert quantized and all(r["n_mismatch"] == 0 for r in quantized), [r["reason"] for r in quantized if r["n_mismatch"]]


def test_native_run_module_runs_on_cuda_tensors():
    from harness.module_inputs import generate_module, module_args
    from native.linear import run_module

    c = Case.from_id("linear-current-bf16-t2x64-k128-n256-st1-mb_cache-normal-s0")
    t = {k: v.to("cuda") for k, v in generate_module(c).items()}
    run = run_module(*module_args(c, t))
    s = run.steps[0]
    assert s.fprop.device.type == "cuda" and s.fprop.shape == (128, 256) and s.x_q.rowwise_data.device.type == "cuda"
    assert torch.isfinite(s.wgrad.float()).all()
