"""Severities (docs/numerics.md §11): each injected into a reference-derived candidate and judged end to end."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import reference
from harness import backends, report, runner, verdict
from harness.cases import Case
from harness.inputs import generate
from reference import QuantConfig, casts, conventions


class _Injected:
    """A backend returning a fixed QuantizedTensor (the golden's, altered by the test)."""

    name = "injected"

    def __init__(self, q):
        self.q = q

    def supports(self, op, config, device):
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        return self.q


def _case(scheme="fp8_current", shape=(128, 256), dist="normal", orientation="rowwise", seed=0):
    return Case("quantize", QuantConfig(scheme), shape, "bfloat16", dist, seed, orientation)


def _golden(case):
    x = generate(case)["x"]
    return x, reference.quantize(x, case.config, rowwise=True)


def _run(case, q):
    rows = runner.run_case(case, _Injected(q), "cpu")
    sev = {r["severity"] for r in rows}
    assert len(sev) == 1, rows  # one severity per (case, backend), on every row
    return rows, sev.pop()


def _row(rows, tensor):
    return next(r for r in rows if r["tensor"] == tensor)


def _with_data(q, codes):
    return dataclasses.replace(q, rowwise_data=codes.to(torch.uint8))


def test_the_golden_itself_is_exact_and_has_no_delta():
    rows = runner.run_case(_case(), "reference", "cpu")
    assert {r["severity"] for r in rows} == {"exact"}
    assert _row(rows, "accuracy_rowwise")["delta_sqnr_db"] is None
    assert {r["matches_convention"] for r in rows} == {""}


def test_a_copy_of_the_golden_is_exact_with_zero_delta():
    case = _case()
    _, q = _golden(case)
    rows, sev = _run(case, q)
    assert sev == "exact" and _row(rows, "accuracy_rowwise")["delta_sqnr_db"] == 0.0


def test_one_code_moved_to_its_almost_equally_close_neighbour_is_equivalent():
    """The element whose input lies nearest a rounding midpoint, moved to the other neighbour: bits
    differ, the value is one code step away, and the SQNR against the truth moves by < 1e-4 dB."""
    case = _case()
    x, q = _golden(case)
    codes = q.rowwise_data.to(torch.int64)
    d_g = reference.dequantize(q, "rowwise", torch.float32).double()
    xd = x.to(torch.float64)
    toward = torch.where(xd > d_g, 1, -1) * torch.where(codes & 0x80 != 0, -1, 1)  # magnitude step toward x
    alt = torch.clamp((codes & 0x7F) + toward, 0, 0x7E) | (codes & 0x80)
    d_alt = reference.dequantize(_with_data(q, alt), "rowwise", torch.float32).double()
    # The other neighbour must be strictly farther from x (gap > 0): where it is as close or closer (a tie, or
    # a code the fp32 scaled domain rounded away from the x-domain nearest), the SQNR moves by >= 0. The
    # harness.draws input has such an element nearest; the old torch.Generator input had none.
    gap = ((xd - d_alt).abs() - (xd - d_g).abs())
    gap = gap.masked_fill((alt == codes) | (gap <= 0), math.inf)
    i = int(gap.reshape(-1).argmin())
    cand = codes.clone().reshape(-1)
    cand[i] = alt.reshape(-1)[i]
    rows, sev = _run(case, _with_data(q, cand.reshape(codes.shape)))
    data = _row(rows, "rowwise_data")
    assert data["status"] == "fail" and data["n_mismatch"] == 1
    assert data["ulp_hist"]["1"] == 1
    d = _row(rows, "accuracy_rowwise")["delta_sqnr_db"]
    assert -1e-4 < d < 0
    assert sev == "equivalent"
    assert _row(rows, "rowwise_data")["matches_convention"] == ""


def test_truncating_every_code_is_degraded():
    """Every non-zero magnitude one code lower (round toward zero): within one step, far less accurate."""
    case = _case()
    _, q = _golden(case)
    codes = q.rowwise_data.to(torch.int64)
    mag = codes & 0x7F
    cand = torch.where(mag > 0, (mag - 1) | (codes & 0x80), codes)
    rows, sev = _run(case, _with_data(q, cand))
    assert sev == "degraded"
    assert _row(rows, "accuracy_rowwise")["delta_sqnr_db"] < -verdict.EQUIVALENT_DB


def test_a_nan_where_the_golden_is_finite_is_broken():
    case = _case()
    _, q = _golden(case)
    cand = q.rowwise_data.clone()
    cand[3, 5] = 0x7F  # E4M3 NaN (docs/numerics.md §0.2)
    rows, sev = _run(case, dataclasses.replace(q, rowwise_data=cand))
    assert sev == "broken"
    data = _row(rows, "rowwise_data")
    assert data["status"] == "fail" and "1 non-finite values where the golden's are finite" in data["reason"]
    assert not any(r["status"] == "error" for r in rows)


def test_transposed_scales_are_broken_with_their_layout_named_and_no_error_row():
    case = _case("mxfp8", (64, 128))
    _, q = _golden(case)
    valid = q.rowwise_scale[:64, :4]  # valid region [M, K/32]
    rows, sev = _run(case, dataclasses.replace(q, rowwise_scale=valid.t().contiguous()))
    assert sev == "broken"
    assert not any(r["status"] == "error" for r in rows)
    scale = _row(rows, "rowwise_scale")
    assert scale["status"] == "fail" and scale["mismatch_classes"] == {"layout_transposition": 64 * 4}
    assert "rowwise_scale is the golden transposed (wrong layout)" in scale["reason"]
    assert _row(rows, "rowwise_data")["status"] == "pass"  # the conformance rows are kept
    acc = _row(rows, "accuracy_rowwise")
    assert acc["status"] == "info" and acc["reason"].startswith("not measured: rowwise_scale")


# torchao_nvfp4 differs from te only where x*f lies next to a midpoint: seed 14 has such elements (32 codes
# differ) under the harness.draws inputs; seed 0 had them under the old torch.Generator inputs, no longer.
@pytest.mark.parametrize("scheme,name,seed", [("mxfp8", "torchao_ceil", 0), ("mxfp8", "torchao_even", 0),
                                              ("fp8_block", "vllm_group", 0), ("nvfp4", "torchao_nvfp4", 14)])
def test_a_candidate_following_another_convention_is_convention_with_its_name(scheme, name, seed):
    case = _case(scheme, seed=seed)
    x, g = _golden(case)
    q = reference.quantize(x, conventions.with_convention(case.config, name), rowwise=True)
    q = dataclasses.replace(q, config=case.config)  # a kernel returns the config it was handed
    assert not reference.quantize(x, case.config).rowwise_data.equal(q.rowwise_data)  # it differs from `te`
    rows, sev = _run(case, q)
    assert sev == "convention"
    assert {r["matches_convention"] for r in rows} == {name}
    assert _row(rows, "rowwise_data")["status"] == "fail"  # still a byte mismatch against the `te` golden


def test_a_convention_match_outranks_non_finite_values_on_special_inputs():
    """torchao's floor mode makes a block holding NaN all NaN (docs/numerics.md §10.3): bit-exact
    under torchao_floor, so `convention`, not `broken`."""
    case = _case("mxfp8", dist="special")
    x, _ = _golden(case)
    q = reference.quantize(x, conventions.with_convention(case.config, "torchao_floor"), rowwise=True)
    rows, sev = _run(case, dataclasses.replace(q, config=case.config))
    assert sev == "convention" and rows[0]["matches_convention"] in ("ocp_mx", "torchao_floor")


def test_ignored_fields_name_what_a_convention_replaced_of_the_case():
    floor, ceil = QuantConfig("mxfp8", e8m0_rule="floor"), QuantConfig("mxfp8")
    assert verdict.ignored_fields(floor, "torchao_rceil") == ["e8m0_rule=floor"]
    assert verdict.ignored_fields(floor, "torchao_floor") == []  # FLOOR realises the floor rule
    assert verdict.ignored_fields(floor, "ocp_mx") == []
    assert verdict.ignored_fields(ceil, "torchao_rceil") == []
    assert verdict.ignored_fields(ceil, "torchao_floor") == ["e8m0_rule=ceil"]
    assert verdict.ignored_fields(ceil, "torchao_even") == ["e8m0_rule=ceil"]  # EVEN is no rule of ours
    assert verdict.ignored_fields(ceil, "ocp_mx") == ["e8m0_rule=ceil"]
    block = QuantConfig("fp8_block", tile=(1, 128), pow2_scales=True)
    assert verdict.ignored_fields(block, "vllm_group") == ["pow2_scales=True", "eps=0.0"]
    assert verdict.ignored_fields(block, "vllm_group_ue8m0") == ["eps=0.0"]


def test_declared_conventions_are_tried_first_those_honouring_the_case_before_the_rest():
    floor, ceil = QuantConfig("mxfp8", e8m0_rule="floor"), QuantConfig("mxfp8")
    assert verdict.convention_order(ceil) == conventions.applicable(ceil)  # undeclared: catalogue order
    assert verdict.convention_order(ceil, ("torchao_rceil", "torchao_floor"))[:2] == ["torchao_rceil", "torchao_floor"]
    assert verdict.convention_order(floor, ("torchao_rceil", "torchao_floor"))[:3] == [
        "torchao_floor", "torchao_rceil", "ocp_mx"]
    assert verdict.convention_order(ceil, ("vllm_group", "nonsense")) == conventions.applicable(ceil)

    class Declares:
        conventions = ("torchao_even", "nonsense")

    assert verdict.declared_conventions(Declares()) == ("torchao_even",)
    assert verdict.declared_conventions(object()) == ()


def test_a_declared_convention_wins_where_the_catalogue_would_name_another_that_also_matches():
    """On normal blocks ocp_mx and torchao_floor give the same bytes (docs/numerics.md §10.2, §10.3): the
    catalogue names ocp_mx first, a backend declaring torchao_floor gets torchao_floor. Both ignore the
    case's ceil rule, and the reason says so."""
    case = Case("quantize", QuantConfig("mxfp8"), (128, 256), "bfloat16", "normal", 0, "rowwise")
    x, _ = _golden(case)
    q = dataclasses.replace(reference.quantize(x, conventions.with_convention(case.config, "torchao_floor")),
                            config=case.config)
    rows, sev = _run(case, q)
    assert sev == "convention" and rows[0]["matches_convention"] == "ocp_mx"

    class Declared(_Injected):
        conventions = ("torchao_floor",)

    rows = runner.run_case(case, Declared(q), "cpu")
    assert {r["matches_convention"] for r in rows} == {"torchao_floor"}
    first_fail = next(r for r in rows if r["status"] == "fail")
    assert first_fail["reason"].startswith("bit-exact under torchao_floor: the candidate ignored e8m0_rule=ceil; ")


def test_a_kernel_ignoring_the_case_rule_is_reported_truthfully():
    """An RCEIL kernel handed a floor case: bit-exact under torchao_rceil, and the report says it ignored
    e8m0_rule=floor instead of a plain convention match."""
    case = Case("quantize", QuantConfig("mxfp8", e8m0_rule="floor"), (128, 256), "bfloat16", "normal", 0, "rowwise")
    x, _ = _golden(case)
    q = dataclasses.replace(reference.quantize(x, conventions.with_convention(case.config, "torchao_rceil")),
                            config=case.config)
    rows, sev = _run(case, q)
    assert sev == "convention" and {r["matches_convention"] for r in rows} == {"torchao_rceil"}
    reasons = [r["reason"] for r in rows if r["status"] == "fail"]
    assert reasons[0].startswith("bit-exact under torchao_rceil: the candidate ignored e8m0_rule=floor; ")
    assert sum("bit-exact under" in r for r in reasons) == 1
    # A FLOOR kernel honours the floor case: on normal blocks it is te/floor byte for byte (§10.3).
    q = dataclasses.replace(reference.quantize(x, conventions.with_convention(case.config, "torchao_floor")),
                            config=case.config)
    assert _run(case, q)[1] == "exact"


def test_an_exception_is_broken():
    class Raises(_Injected):
        def quantize(self, x, config, **kw):
            raise RuntimeError("boom")

    rows = runner.run_case(_case(), Raises(None), "cpu")
    assert [(r["status"], r["severity"]) for r in rows] == [("error", "broken")]


def test_code_step_is_the_larger_gap_to_the_neighbouring_codes():
    """E4M3 with sinv = 1: code 0x38 (1.0) has neighbours 0.9375 and 1.125; 0x00 has 0 and 2^-9."""
    cfg = QuantConfig("fp8_current")
    q = reference.quantize(torch.ones(1, 16) * 448, cfg)  # sinv = 1
    assert float(q.rowwise_scale[0]) == 1.0
    q = dataclasses.replace(q, rowwise_data=torch.tensor([[0x38, 0x00, 0xB8, 0x7E] * 4], dtype=torch.uint8))
    step = verdict.code_step(q, "rowwise")[0, :4].tolist()
    assert step == [0.125, 2.0**-9, 0.125, 32.0]


def test_delta_db_is_zero_for_equal_values_including_infinities():
    assert verdict.delta_db(math.inf, math.inf) == 0.0
    assert verdict.delta_db(30.0, 31.5) == -1.5
    assert verdict.delta_db(None, 3.0) is None


def test_delta_db_is_capped_so_a_lossless_golden_gives_a_finite_delta():
    """docs/numerics.md §11: both SQNRs are capped at SQNR_CEILING_DB (fp32's resolution), so a candidate at
    108 dB against a lossless golden is 32 dB below it, not -inf; above the ceiling nothing differs."""
    assert verdict.SQNR_CEILING_DB == 140.0
    assert verdict.delta_db(108.0, math.inf) == 108.0 - 140.0
    assert verdict.delta_db(30.0, math.inf) == -110.0
    assert verdict.delta_db(150.0, math.inf) == 0.0 and verdict.delta_db(math.inf, 145.0) == 0.0
    assert verdict.delta_db(-math.inf, 20.0) == -math.inf  # no signal left: still unbounded


# ---- supports(case), one copy of a both-copies case, skip prefix ------------------------------------


class _RowwiseOnly:
    """A new-style adapter: supports(case, device); bf16 only, rowwise only."""

    name = "rowwise_only"

    def supports(self, case, device):
        if case.in_dtype != "bfloat16":
            return False, f"{self.name}: bf16 input only, not {case.in_dtype}"
        if case.orientation != "rowwise":
            return False, f"{self.name}: the rowwise copy only"
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        assert rowwise and not colwise
        return reference.quantize(x, config, rowwise=True, colwise=False)


def test_supports_takes_the_case_and_the_old_form_is_still_asked_per_config():
    b = _RowwiseOnly()
    assert backends.asks_for_case(b) and not backends.asks_for_case(_Injected(None))
    assert backends.supports_case(b, _case(), "cpu") == (True, "")
    f32 = dataclasses.replace(_case(), in_dtype="float32")
    assert backends.supports_case(b, f32, "cpu") == (False, "rowwise_only: bf16 input only, not float32")
    assert backends.supports_case(backends.get_backend("torch"), _case("mxfp8"), "cpu")[0] is False


def test_a_dtype_skip_happens_before_the_golden_runs(monkeypatch):
    def no_golden(*a, **k):
        raise AssertionError("the golden ran for a skipped case")

    monkeypatch.setattr(runner, "prepare", no_golden)
    rows = runner.run_case(dataclasses.replace(_case(), in_dtype="float32"), _RowwiseOnly(), "cpu")
    assert [(r["status"], r["reason"]) for r in rows] == [("skip", "rowwise_only: bf16 input only, not float32")]


def test_a_kernel_taking_one_copy_of_a_both_copies_case_runs_it_and_skips_the_other():
    rows = runner.run_case(_case("mxfp8", orientation="both"), _RowwiseOnly(), "cpu")
    by = {r["tensor"]: r for r in rows}
    assert by["rowwise_data"]["status"] == "pass" and by["rowwise_scale"]["status"] == "pass"
    assert "colwise_data" not in by and "accuracy_colwise" not in by
    assert by["colwise_copy"]["status"] == "skip"
    assert by["colwise_copy"]["reason"] == "colwise copy: rowwise_only: the rowwise copy only"
    assert by["rowwise_data"]["severity"] == "exact"


def test_an_unsupported_raised_with_the_backend_name_is_not_prefixed_twice():
    class Raises(_Injected):
        name = "k"

        def quantize(self, x, config, **kw):
            from reference import Unsupported

            raise Unsupported("k: no e5m2")

    rows = runner.run_case(_case(), Raises(None), "cpu")
    assert rows[0]["reason"] == "k: no e5m2"


# ---- the summary --------------------------------------------------------------------------------


def test_summary_counts_severities_groups_non_exact_pairs_and_lists_skips(tmp_path):
    case = _case()
    x, q = _golden(case)
    nan = q.rowwise_data.clone()
    nan[0, 0] = 0x7F
    rows = []
    rows += runner.run_case(case, _Injected(dataclasses.replace(q, rowwise_data=nan)), "cpu")
    rows += runner.run_case(case, "reference", "cpu")
    rows += runner.run_case(dataclasses.replace(case, in_dtype="float32"), _RowwiseOnly(), "cpu")
    with report.ReportWriter(tmp_path) as w:
        w.write(rows)
    df = report.read_results(tmp_path)
    s = report.summary(df).set_index("backend")
    assert s.loc["injected", "broken"] == 1 and s.loc["reference", "exact"] == 1
    assert math.isnan(s.loc["reference", "worst_delta_sqnr_db"])  # the golden run itself: no delta
    assert s.loc["injected", "worst_delta_sqnr_db"] < 0
    g = report.verdict_groups(df)
    assert g[["severity", "classes", "distribution", "backend", "count"]].values.tolist() == [
        ["broken", "nonfinite_policy", "normal", "injected", 1]]  # a NaN code where the golden is finite (classify.py)
    sk = report.skip_reasons(df)
    assert sk.values.tolist() == [["rowwise_only", 1, "rowwise_only: bf16 input only, not float32"]]
    text = report.format_summary(df)
    assert "worst_delta_sqnr_db" in text and "skip reasons:" in text and "severity x class" in text


def test_a_nan_code_in_an_fp4_copy_cannot_exist_so_code_step_handles_packed_nibbles():
    case = _case("nvfp4")
    _, q = _golden(case)
    step = verdict.code_step(q, "rowwise")
    assert step.shape == (128, 256) and bool((step > 0).all())
    assert casts.unpack_nibbles(q.rowwise_data).shape == (128, 256)


def test_error_rows_are_broken_wherever_they_are_made_and_pytest_failures_name_the_severity():
    from harness import pytest_plugin  # noqa: PLC0415
    from harness.rows import pair_base, status_row  # noqa: PLC0415

    case = _case()
    base = pair_base(case, "k", "cpu", "w0")
    assert status_row(base, "error", "crash: signal SIGSEGV (-11)")["severity"] == "broken"
    assert "severity" not in status_row(base, "skip", "k: no")
    _, q = _golden(case)
    codes = q.rowwise_data.clone()
    codes[0, 0] = 0x7F
    rows = runner.run_case(case, _Injected(dataclasses.replace(q, rowwise_data=codes)), "cpu")
    text = pytest_plugin.failure_message(case, "tests.unit.test_verdict:_Injected", rows)
    assert text.splitlines()[0] == f"case {case.id} [injected] failed; severity broken"


def test_list_with_a_backend_shows_what_supports_case_answers(capsys):
    from harness import cli  # noqa: PLC0415

    spec = "tests.unit.test_verdict:_RowwiseOnly"
    ids = ["quantize-mxfp8-e4m3-1x32-both-bf16-1024x32-outliers-s0", "quantize-mxfp8-e4m3-1x32-rowwise-f32-64x96-ties-s0"]
    assert cli.main(["list", "--tier", "smoke", "--filter", "|".join(ids), "--backend", spec, "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"{ids[0]}  rowwise_only:rowwise" in lines and f"{ids[1]}  rowwise_only:skip" in lines


@pytest.mark.parametrize("scheme, shape", [("mxfp8", (64, 256)), ("nvfp4", (64, 128))])
@pytest.mark.parametrize("as_flat", [True, False])
def test_swizzled_scales_are_broken_with_their_layout_named_and_never_crash(scheme, shape, as_flat):
    """A reference-derived candidate returning both copies' block scales in cuBLASLt's swizzled order
    (reference.layouts.swizzle_scales) instead of the compact one: broken, the layout named, the data
    rows kept (passing), the accuracy rows not measured, no error row."""
    from reference.layouts import swizzle_scales

    case = _case(scheme, shape, orientation="both")
    x = generate(case)["x"]
    g = reference.quantize(x, case.config, rowwise=True, colwise=True)
    sw = {o: swizzle_scales(g, o) for o in ("rowwise", "colwise")}
    q = dataclasses.replace(g, **{f"{o}_scale": (t if as_flat else t.reshape(getattr(g, f"{o}_scale").shape))
                                  for o, t in sw.items()})
    rows, sev = _run(case, q)
    assert sev == "broken" and not any(r["status"] == "error" for r in rows)
    for o in ("rowwise", "colwise"):
        scale = _row(rows, f"{o}_scale")
        assert scale["status"] == "fail" and set(scale["mismatch_classes"]) == {"layout_transposition"}
        assert _row(rows, f"{o}_data")["status"] == "pass"
        acc = _row(rows, f"accuracy_{o}")
        assert acc["status"] == "info" and acc["reason"].startswith(f"not measured: {o}_scale")
    assert ("broken: rowwise_scale is the golden swizzled (128x4 tiles) (wrong layout); "
            "colwise_scale is the golden swizzled (128x4 tiles) (wrong layout)") in _row(rows, "rowwise_scale")["reason"]
