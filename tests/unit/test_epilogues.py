"""GEMM epilogues (reference.gemm.gemm_epilogue, docs/numerics.md §12.2), their bounds (harness/tolerance.py),
the per-operand input dtype and the fp8_block e5m2 x e5m2 exclusion."""

from __future__ import annotations

import math

import pytest
import torch

import reference
from harness import runner
from harness.cases import Case, load_cases
from harness.tolerance import GELU_SLOPE_MAX
from reference import QuantConfig
from reference.gemm import dgelu, gelu, gemm_epilogue, round_out
from reference.spec import gemm_rule
from reference.types import SpecViolation


def _gelu_tanh(z: float) -> float:
    return 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))


def test_gelu_and_dgelu_by_hand():
    z = torch.tensor([0.0, 1.0, -1.0, 3.0, -3.0, 10.0, -10.0], dtype=torch.float64)
    # GELU_tanh(1) = 0.5 (1 + tanh(0.7978845608 * 1.044715)) = 0.8411919906; GELU(-z) = GELU(z) - z.
    assert gelu(z)[1].item() == pytest.approx(0.8411919906082768, abs=1e-15)
    assert gelu(z)[2].item() == pytest.approx(0.8411919906082768 - 1.0, abs=1e-15)
    assert gelu(z).tolist() == pytest.approx([_gelu_tanh(v) for v in z.tolist()], abs=1e-15)
    assert gelu(z)[0].item() == 0.0 and dgelu(z)[0].item() == 0.5
    # The derivative against a central difference of the fp64 formula.
    h = 1e-6
    fd = [(_gelu_tanh(v + h) - _gelu_tanh(v - h)) / (2 * h) for v in z.tolist()]
    assert dgelu(z).tolist() == pytest.approx(fd, abs=1e-8)
    # GELU_SLOPE_MAX bounds |GELU'| everywhere (dense grid).
    grid = torch.linspace(-20, 20, 400001, dtype=torch.float64)
    assert float(dgelu(grid).abs().max()) < GELU_SLOPE_MAX < float(dgelu(grid).abs().max()) + 0.01


def _operands(scheme="mxfp8", layout="TN"):
    case = Case("gemm", QuantConfig(scheme), (32, 64, 64), layout=layout, distribution="exact_representable")
    from harness.inputs import generate  # noqa: PLC0415

    inp = generate(case)
    from reference.layouts import gemm_layout  # noqa: PLC0415

    lay = gemm_layout(layout)
    qa = reference.quantize(inp["a"], case.config, **lay.quantize_flags("a"))
    qb = reference.quantize(inp["b"], case.config, **lay.quantize_flags("b"))
    return qa, qb


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_gelu_aux_is_the_plain_gemm_and_its_gelu(layout):
    qa, qb = _operands(layout=layout)
    bias = torch.linspace(-1, 1, 64).to(torch.bfloat16)
    got = gemm_epilogue(qa, qb, epilogue="gelu_aux", layout=layout, bias=bias)
    plain = reference.gemm(qa, qb, layout=layout, bias=bias)
    assert torch.equal(got["aux"], plain)  # aux = the pre-activation (bias included), RN_out
    pre = reference.gemm(qa, qb, layout=layout, bias=bias, out_dtype=torch.float32)
    assert torch.equal(got["out"], round_out(gelu(pre), torch.bfloat16))  # one rounding from fp64
    # Hand-check one element: out = RN_bf16(GELU_tanh(pre)).
    p = float(pre[3, 5])
    assert float(got["out"][3, 5]) == float(torch.tensor(_gelu_tanh(p)).to(torch.bfloat16))


def test_dgelu_multiplies_by_the_derivative_of_aux():
    qa, qb = _operands()
    aux = torch.tensor([-2.0, 0.0, 1.0]).repeat(22)[:64].expand(32, 64).to(torch.bfloat16)
    got = gemm_epilogue(qa, qb, epilogue="dgelu", aux=aux, out_dtype=torch.float32)["out"]
    pre = reference.gemm(qa, qb, out_dtype=torch.float32).to(torch.float64)
    # z = 0: GELU'(0) = 1/2 exactly, so out = pre / 2 exactly.
    assert torch.equal(got[:, 1::3], (pre[:, 1::3] / 2).to(torch.float32))
    d1 = (_gelu_tanh(1 + 1e-7) - _gelu_tanh(1 - 1e-7)) / 2e-7
    assert float(got[0, 2]) == pytest.approx(float(pre[0, 2]) * d1, rel=1e-6)
    with pytest.raises(SpecViolation, match="aux"):
        gemm_epilogue(qa, qb, epilogue="dgelu")


def test_bgradb_sums_b_over_k():
    qa, qb = _operands()
    got = gemm_epilogue(qa, qb, epilogue="bgradb", out_dtype=torch.float32)
    b_hat = reference.dequantize(qb, "rowwise", torch.float32).to(torch.float64)  # [N, K]
    assert torch.equal(got["bgrad"], b_hat.sum(dim=1).to(torch.float32))
    assert torch.equal(got["out"], reference.gemm(qa, qb, out_dtype=torch.float32))
    with pytest.raises(SpecViolation, match="no bias"):
        gemm_epilogue(qa, qb, epilogue="bgradb", bias=torch.zeros(64))


def test_bgradb_nvfp4_includes_the_operand_share_of_alpha():
    qa, qb = _operands("nvfp4")
    got = gemm_epilogue(qa, qb, epilogue="bgradb", out_dtype=torch.float32)["bgrad"]
    # exact_representable NVFP4 operands have A_g = 2688: the share A_g / 2688 = 1.
    assert float(qb.rowwise_amax) == 2688.0
    from reference.gemm import operand_row_sums  # noqa: PLC0415

    s = operand_row_sums(qb, "rowwise")
    assert torch.equal(got, s.to(torch.float32))


class _Perturbed:
    """The reference epilogue with its outputs nudged by `rel` (relative) in fp32 before the output rounding."""

    def __init__(self, rel, key="out"):
        self.name, self.rel, self.key = f"perturbed_{rel}", rel, key

    def supports(self, op, config, device):
        return True, ""

    def gemm(self, *a, **k):
        return reference.gemm(*a, **k)

    def gemm_epilogue(self, a, b, **kw):
        out = gemm_epilogue(a, b, **{**kw, "out_dtype": torch.float32})
        dt = kw["out_dtype"]
        return {k: (v.to(torch.float64) * (1 + (self.rel if k == self.key else 0))).to(dt) for k, v in out.items()}


@pytest.mark.parametrize("epilogue", ["gelu_aux", "dgelu", "bgradb"])
def test_bounds_pass_the_golden_and_fail_a_wrong_candidate(epilogue):
    case = Case("gemm", QuantConfig("mxfp8"), (64, 96, 128), epilogue=epilogue)
    rows = runner.run_case(case, "reference", "cpu")
    assert rows and all(r["status"] == "pass" for r in rows if r["kind"] == "conformance")
    key = "bgrad" if epilogue == "bgradb" else "out"
    good = runner.run_case(case, _Perturbed(2.0**-12, key), "cpu")  # inside the derived bound
    assert all(r["status"] == "pass" for r in good if r["kind"] == "conformance"), [r["reason"] for r in good]
    bad = runner.run_case(case, _Perturbed(0.05, key), "cpu")  # a 5% error is far outside it
    assert {r["tensor"]: r["status"] for r in bad if r["kind"] == "conformance"}[key] == "fail"


def test_backends_without_gemm_epilogue_skip_with_a_reason():
    case = Case("gemm", QuantConfig("mxfp8"), (64, 96, 128), epilogue="gelu_aux")

    class PlainOnly:
        name = "plain"

        def supports(self, op, config, device):
            return True, ""

        def gemm(self, *a, **k):
            return reference.gemm(*a, **k)

    rows = runner.run_case(case, PlainOnly(), "cpu")
    assert rows[0]["status"] == "skip" and "gemm_epilogue" in rows[0]["reason"]


def test_epilogue_and_b_in_dtype_ids_round_trip():
    case = Case("gemm", QuantConfig("nvfp4"), (64, 96, 128), layout="NT", epilogue="dgelu", b_in_dtype="float32")
    assert case.id == "gemm-NT-nvfp4-e2m1-1x16-bf16-b_f32-64x96x128-out_bf16-ep_dgelu-normal-s0"
    assert Case.from_id(case.id) == case
    # The same dtype for B is the default spelling (no -b_ part).
    assert Case("gemm", QuantConfig("nvfp4"), (64, 96, 128), b_in_dtype="bfloat16").b_in_dtype is None
    with pytest.raises(ValueError, match="gemm only"):
        Case("quantize", QuantConfig("nvfp4"), (64, 96), epilogue="dgelu")


def test_b_in_dtype_generates_b_in_its_dtype_and_runs():
    case = Case("gemm", QuantConfig("fp8_current"), (64, 96, 128), b_in_dtype="float32")
    from harness.inputs import generate  # noqa: PLC0415

    inp = generate(case)
    assert inp["a"].dtype == torch.bfloat16 and inp["b"].dtype == torch.float32
    assert all(r["status"] == "pass" for r in runner.run_case(case, "reference", "cpu") if r["kind"] == "conformance")
    # RHT needs bf16 for each operand: an fp32 B with an RHT copy is excluded.
    rht = Case("gemm", QuantConfig("nvfp4", rht=True), (64, 96, 128), layout="NT", b_in_dtype="float32")
    from harness.cases import spec_violation  # noqa: PLC0415

    assert "rht" in spec_violation(rht)


def test_fp8_block_e5m2_times_e5m2_is_excluded_and_mixed_pairs_are_generated():
    e5 = QuantConfig("fp8_block", element="e5m2")
    e4 = QuantConfig("fp8_block")
    with pytest.raises(SpecViolation, match="e5m2"):
        gemm_rule(e5, e5, "TN")
    gemm_rule(e4, e5, "TN")
    gemm_rule(e5, e4, "NN")
    gemm_rule(QuantConfig("mxfp8", element="e5m2"), QuantConfig("mxfp8", element="e5m2"), "TN")  # allowed there
    cases = [c for c in load_cases("gemm") if c.op == "gemm" and c.config.scheme == "fp8_block"]
    pairs = {(c.config.element, c.b_config.element) for c in cases}
    assert pairs == {("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")}
