"""The linear op: case ids and grids, the run_module protocol, and the chain comparison (harness.chain).

Faults are injected at one stage of otherwise golden candidates; the report must name that stage
(docs/numerics.md §9.8). The native step is exercised on the CPU with the reference kernels injected
(native.linear's own orchestration, reference norms as CPU stand-ins; the gpu tests run native kernels).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import reference
from harness.cases import Case, CaseFileError, load_cases, parse_cases
from harness.chain import CONSUMER, NORM_ULPS, compare_runs, hp_inputs, summary
from harness.linear_case import make_recipe, parse_recipe_id, recipe_id
from harness.module_inputs import generate_module, module_args
from harness.runner import run_case
from reference.linear import REFERENCE_KERNELS, Kernels, run_module
from reference.recipes import RECIPES, NVFP4BlockScaling
from reference.types import Unsupported

SMALL = "linear-mxfp8-bf16-t64-k128-n64-st3-mb_cache-normal-s0"


def chain_row(rows):
    return next(r for r in rows if r["tensor"] == "chain")


class Faulty:
    """The reference step with one kernel or one result replaced (the fault)."""

    name = "faulty"

    def __init__(self, gemm=None, quantize=None, edit=None):
        self.kernels = Kernels(quantize=quantize or reference.quantize, gemm=gemm or reference.gemm)
        self.edit = edit

    def supports(self, op, config, device):
        return True, ""

    def run_module(self, spec, params, steps):
        run = run_module(spec, params, steps, kernels=self.kernels)
        if self.edit is not None:
            self.edit(run)
        return run


# ---- case ids and grids ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["delayed", "current", "mxfp8", "block", "nvfp4"])
def test_recipe_ids_round_trip_every_toggle(name):
    seen = set()
    for fmt in (None, "e4m3", "hybrid"):
        for two_d in (None, True, False):
            for rht in (None, False):
                for pow2 in (None, True, False):
                    try:
                        r = make_recipe(name, {"fp8_format": fmt, "two_d": two_d, "rht": rht, "pow2_scales": pow2})
                    except ValueError:
                        continue
                    assert parse_recipe_id(recipe_id(r)) == r
                    seen.add(recipe_id(r))
    expected = {"delayed": {"delayed", "delayed-e4m3"}, "current": {"current", "current-e4m3", "current-pow2",
                "current-e4m3-pow2"}, "mxfp8": {"mxfp8", "mxfp8-2d", "mxfp8-hybrid", "mxfp8-hybrid-2d"},
                "block": {"block", "block-w1d", "block-f32scales", "block-f32scales-w1d", "block-hybrid",
                          "block-hybrid-w1d", "block-hybrid-f32scales", "block-hybrid-f32scales-w1d"},
                "nvfp4": {"nvfp4", "nvfp4-n2d", "nvfp4-nrht", "nvfp4-nrht-n2d"}}[name]
    assert seen == expected


def test_recipe_toggle_that_does_not_apply_is_rejected():
    with pytest.raises(ValueError, match="rht=True does not apply to recipe 'delayed'"):
        make_recipe("delayed", {"rht": True})
    assert make_recipe("delayed", {"rht": False}) == make_recipe("delayed", {})
    assert make_recipe("nvfp4", {"rht": False, "two_d": False}) == NVFP4BlockScaling(disable_rht=True,
                                                                                     disable_2d_quantization=True)


def test_linear_case_id_round_trips_and_reads():
    c = Case.from_id("layernorm_linear-RMSNorm-zcg-nvfp4-nrht-bf16-t2x64-k128-n256-bias-fuse-st3-mb_cache_update-normal-s7")
    assert c.op == "linear" and c.shape == (2, 64, 128, 256) and c.features == (128, 256) and c.bias
    s = c.module
    assert (s.module, s.normalization, s.zero_centered_gamma, s.steps, s.microbatch, s.fuse_wgrad_accumulation) == (
        "layernorm_linear", "RMSNorm", True, 3, "cache_update", True)
    assert s.recipe == NVFP4BlockScaling(disable_rht=True) and c.seed == 7
    assert c.config == s.recipe.config("input")
    with pytest.raises(ValueError, match="not canonical"):
        Case.from_id("linear-nvfp4-n2d-nrht-bf16-t64-k128-n64-st1-mb_cache-normal-s0")
    with pytest.raises(ValueError, match="spec forbids"):  # RHT needs bf16 (docs/numerics.md §5.6)
        Case.from_id("linear-nvfp4-f32-t64-k128-n64-st1-mb_cache-normal-s0")


def test_modules_tier_holds_te_nvfp4_matrix():
    cases = load_cases("modules")
    assert len(cases) == len(set(cases)) == 196
    nv = [c for c in cases if isinstance(c.module.recipe, NVFP4BlockScaling) and c.source.endswith(":11")]
    # Linear: 3 of TE's 5 feature shapes (the other 2 are nightly) x 2 dtypes x 2 step counts x RHT x 2-D,
    # less fp32 with RHT (TE skips it; docs/numerics.md §9.1): 3 * (2*2*4 - 2*2) = 36.
    assert len(nv) == 36
    assert {c.features for c in nv} == {(128, 256), (256, 128), (512, 512)}
    ln = [c for c in cases if c.module.module == "layernorm_linear" and c.source.endswith(":22")]
    assert {c.module.normalization for c in ln} == {"LayerNorm", "RMSNorm"}
    assert {type(c.module.recipe).__name__ for c in cases} == set(RECIPES)
    for c in cases:
        assert Case.from_id(c.id) == c
    big = [c for c in load_cases("nightly") if c.op == "linear" and c.features in ((768, 3072), (1024, 4096))]
    assert len(big) == 72 and {c.shape[:2] for c in big} == {(32, 128)}


def test_linear_grid_errors_name_the_field():
    with pytest.raises(CaseFileError, match="features"):
        parse_cases('[[grid]]\nop = "linear"\nrecipe = "current"\ntokens = [64]\n')
    with pytest.raises(CaseFileError, match="microbatch"):
        parse_cases('[[grid]]\nop = "linear"\nrecipe = "current"\ntokens = [64]\nfeatures = [128, 64]\n'
                    'microbatch = "sometimes"\n')


def test_inputs_are_fresh_per_step_and_seeded():
    c = Case.from_id("linear-current-bf16-t64-k128-n64-st3-mb_cache_update-normal-s3")
    a, b = generate_module(c), generate_module(c)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["x"].shape == (3, 64, 128) and a["dy"].shape == (3, 64, 64) and a["weight_updates"].shape == (3, 64, 128)
    assert not torch.equal(a["x"][0], a["x"][1]) and not torch.equal(a["dy"][1], a["dy"][2])
    spec, params, steps = module_args(c, a)
    assert [s.is_first_microbatch for s in steps] == [True, False, False]
    assert steps[0].weight is None and torch.equal(steps[2].weight, a["weight_updates"][2])


# ---- the golden itself, and the native path with reference kernels ---------------------------------


def test_reference_backend_passes_every_stage():
    rows = run_case(Case.from_id(SMALL), "reference")
    assert chain_row(rows)["status"] == "pass" and chain_row(rows)["reason"] == ""
    conf = [r for r in rows if r["kind"] == "conformance" and r["tensor"] != "chain"]
    # 3 steps x (x_q, w_q, dy_q: 6 fields each (data, scale, amax per copy; mxfp8 has no amax) + 6 outputs)
    assert {r["status"] for r in conf} == {"pass"} and all(r["n_mismatch"] == 0 for r in conf)
    assert {r["tensor"].split(".")[1] for r in conf} == {"x_q", "w_q", "dy_q", "fprop", "dgrad", "dx", "wgrad",
                                                         "weight_grad"}


def test_native_step_with_reference_kernels_matches_the_golden_bit_for_bit():
    from native.linear import run_module as native_run

    c = Case.from_id("layernorm_linear-LayerNorm-delayed-bf16-t64-k128-n64-bias-fuse-st3-mb_cache-normal-s0")
    spec, params, steps = module_args(c, generate_module(c))
    gold = run_module(spec, params, steps)
    updates = []
    from native.linear import Kernels as NativeKernels
    from reference.gemm import round_out
    from reference.norms import norm_backward, norm_forward, ordered_sum

    kern = NativeKernels(quantize=reference.quantize, gemm=reference.gemm,
                         update_amax_history=lambda h: (updates.append(1), h.update()),
                         norm_forward=norm_forward, norm_backward=norm_backward,  # CPU stand-ins of native.norms
                         column_sum=lambda t: round_out(ordered_sum(t, 0), t.dtype))
    cand = native_run(spec, params, steps, with_kernels=kern)
    assert len(updates) == 3 * 3  # input and weight after the forward, grad_output after the backward
    stages = compare_runs(c, gold, cand, hp_inputs(c, steps, gold, params), params.bias)
    assert all(r.n_mismatch == 0 for s in stages for r in s.results)
    assert summary(stages) == ("pass", "")
    with pytest.raises(Unsupported, match="CUDA only"):
        native_run(spec, params, steps)
    assert REFERENCE_KERNELS.quantize is reference.quantize


# ---- injected faults: reported at their stage -------------------------------------------------


def _rowwise_w_dgrad(a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None, method="auto"):
    """dgrad (NN) computed from the ROWWISE copy of W instead of the colwise one (the fault)."""
    if layout != "NN":
        return reference.gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=c)
    dy = reference.dequantize(a, "rowwise", torch.float32).to(torch.float64)
    w = reference.dequantize(b, "rowwise", torch.float32).to(torch.float64)
    return (dy @ w).to(torch.float32).to(out_dtype)


def test_dgrad_with_the_rowwise_weight_is_reported_at_dgrad():
    # NVFP4 with 1-D weight tiles: W's rowwise and colwise copies have different scales and codes. (With
    # 2-D tiles, per-tensor FP8 or MXFP8 away from subnormals both copies dequantize to the same values:
    # the same power-of-two-scaled rounding, so this fault cannot show there.)
    rows = run_case(Case.from_id("linear-nvfp4-n2d-bf16-t64-k128-n64-st1-mb_cache-normal-s0"),
                    Faulty(gemm=_rowwise_w_dgrad))
    ch = chain_row(rows)
    assert ch["status"] == "fail"
    assert ch["reason"].startswith("first departure: step 0, dgrad: "), ch["reason"]
    assert "exceeds its bound" in ch["reason"]
    by = {r["tensor"]: r["status"] for r in rows if r["kind"] == "conformance"}
    # every stage before dgrad in step 0 is still golden
    assert all(by[t] == "pass" for t in by if t.startswith(("s0.x_q", "s0.w_q", "s0.dy_q", "s0.fprop")))
    assert by["s0.dgrad"] == "fail" and by["s0.wgrad"] == "pass"


def test_one_colwise_dy_scale_at_step_2_is_reported_at_wgrad_with_its_block():
    calls = []

    def quantize(x, config, **kw):
        q = reference.quantize(x, config, **kw)
        if x.shape[-1] == 64:  # dY [M, N=64] (x and W have K = 128)
            calls.append(1)
            if len(calls) == 3:  # step 2
                s = q.colwise_scale.clone()
                s[1, 3] += 1  # one E8M0 exponent up: colwise scales [M/32 (padded), N]: tokens 32-63, column 3
                q = dataclasses.replace(q, colwise_scale=s)
        return q

    rows = run_case(Case.from_id(SMALL), Faulty(quantize=quantize))
    reason = chain_row(rows)["reason"]
    # +1 on this exponent is what another E8M0 rule gives for the block, so compare names it scale_rule (classify.py)
    assert reason == "first departure: step 2, wgrad: colwise dY scales differ in block [1, 3] (1 of 128, scale_rule)"
    assert CONSUMER[("dy_q", "colwise")] == "wgrad"
    bad = [r["tensor"] for r in rows if r["status"] == "fail"]
    assert bad[:2] == ["chain", "s2.dy_q.colwise_scale"]  # the chain verdict first, then the stage


def test_weight_grad_overwritten_instead_of_accumulated_is_reported_at_step_1():
    def edit(run):
        for s in run.steps[1:]:
            s.weight_grad = s.wgrad  # forgot to add the previous weight.grad

    rows = run_case(Case.from_id(SMALL), Faulty(edit=edit))
    reason = chain_row(rows)["reason"]
    assert reason.startswith("first departure: step 1, weight_grad: "), reason


def test_one_ulp_in_fprop_passes_within_its_bound_and_ten_percent_fails():
    def nudge(bits: bool):
        def edit(run):
            y = run.steps[0].fprop.clone()
            if bits:  # the next bf16 code: one ulp away
                y.view(torch.int16)[0, 0] += 1
            else:
                y[0, 0] = y[0, 0] * 1.1 + 1.0
            run.steps[0].fprop = y
        return edit

    rows = run_case(Case.from_id(SMALL), Faulty(edit=nudge(True)))
    ch = chain_row(rows)
    assert (ch["status"], ch["reason"]) == ("pass", "bits first differ (within bounds) at step 0, fprop: 1 of 4096")
    rows = run_case(Case.from_id(SMALL), Faulty(edit=nudge(False)))
    reason = chain_row(rows)["reason"]
    assert reason.startswith("first departure: step 0, fprop: 1 of 4096 elements exceeds its bound at [0, 0]"), reason


def test_norm_bound_is_fp32_ulps_of_the_row_plus_one_rounding():
    from harness.chain import _norm_bound

    g = torch.tensor([[1.0, -4.0], [0.5, 0.25]], dtype=torch.bfloat16)
    b = _norm_bound(g, torch.bfloat16)
    u = 2.0**-8
    expected = torch.tensor([[2 * u * 1 + NORM_ULPS * 2**-24 * 4, 2 * u * 4 + NORM_ULPS * 2**-24 * 4],
                             [2 * u * 0.5 + NORM_ULPS * 2**-24 * 0.5, 2 * u * 0.25 + NORM_ULPS * 2**-24 * 0.5]],
                            dtype=torch.float64)
    assert torch.equal(b, expected)


def test_torch_backend_says_why_it_cannot_run_a_module_case_on_cpu():
    rows = run_case(Case.from_id("linear-current-bf16-t64-k128-n64-st1-mb_cache-normal-s0"), "torch")
    assert len(rows) == 1 and rows[0]["status"] == "skip" and "CUDA" in rows[0]["reason"]


def test_stages_a_candidate_does_not_return_are_listed_not_failed():
    def strip(run):  # what the TE adapter can return (examples/te_linear_adapter.py)
        for s in run.steps:
            s.x_q = s.w_q = s.dy_q = s.dgrad = s.wgrad = None

    rows = run_case(Case.from_id(SMALL), Faulty(edit=strip))
    ch = chain_row(rows)
    assert (ch["status"], ch["reason"]) == ("pass", "not returned by the candidate: x_q, w_q, dy_q, dgrad, wgrad")
    assert {r["tensor"] for r in rows if r["kind"] == "conformance"} == {
        "chain", *(f"s{i}.{t}" for i in range(3) for t in ("fprop", "dx", "weight_grad"))}


def test_te_adapter_maps_every_recipe():
    pytest.importorskip("transformer_engine", reason="TransformerEngine is not installable here (no TE build)")
    from transformer_engine.common import recipe as te_recipe

    from examples.te_linear_adapter import te_recipe_of

    for cls in RECIPES.values():
        assert te_recipe_of(cls(), te_recipe) is not None


def test_te_adapter_without_te_is_a_clear_skip():
    from examples.te_linear_adapter import backend

    ok, why = backend.supports("linear", Case.from_id(SMALL).config, "cpu")
    assert not ok and "CUDA only" in why


def test_native_backend_refuses_module_cases_off_cuda_and_lists_their_kernels():
    from harness.backends import NativeBackend

    c = Case.from_id("linear-nvfp4-bf16-t64-k128-n64-st1-mb_cache-normal-s0")
    ok, why = NativeBackend().supports("linear", c.config, "cpu")
    assert not ok and "CUDA only" in why
    rows = run_case(c, "native", "cpu")
    assert [r["status"] for r in rows] == ["skip"]
