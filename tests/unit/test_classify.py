"""harness.compare / harness.classify: each divergence injected into a reference-derived candidate is named
with its class, an example and the input pattern; layouts are reported; every class is listed.

Expected values are hand-computed from docs/numerics.md (§0.5 casts, §1 scale rule, §3 E8M0, §4 blockwise,
§5.4 packing, §10 conventions) with numpy / ml_dtypes as the oracle, not with the code under test.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import reference
from harness.classify import class_counts, format_examples, layout_finding
from harness.compare import MISMATCH_CLASSES, compare_dequantized, compare_output, compare_quantized
from harness.compare import layout_finding as compare_layout_finding
from harness.rows import describe_mismatch
from reference.conventions import with_convention
from reference.formats import QuantConfig as Q
from reference.types import QuantizedTensor


def _clone(q: QuantizedTensor) -> QuantizedTensor:
    kw = {n: (None if getattr(q, n) is None else getattr(q, n).clone()) for n in QuantizedTensor.TENSOR_FIELDS}
    return QuantizedTensor(q.config, q.shape, q.hp_dtype, extra=dict(q.extra), **kw)


def _by_name(results):
    return {r.tensor: r for r in results}


def _f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def _e4m3(v: np.ndarray) -> np.ndarray:
    """Saturating RNE cast to E4M3 codes (ml_dtypes, after clamping to ±448: NUMERICS §0.5)."""
    return np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _examples(tr, cls):
    return [e for p in tr.examples[cls]["patterns"].values() for e in p["examples"]]


# ---- encode-factor rounding ------------------------------------------------------------------------


def _encode_factor_case():
    """fp8_block 1x128 (no pow2): amax A = 0x3FD1BA56, x = 0x3F5937D9 (docs/numerics.md §10.7)."""
    a, v = _f32(0x3FD1BA56), _f32(0x3F5937D9)
    x = torch.zeros(1, 128)
    x[0, 0], x[0, 1] = a, v
    cfg = Q("fp8_block", pow2_scales=False)
    return x, cfg, reference.quantize(x, cfg)


def test_encode_factor_rounding_one_ulp_off_a_midpoint():
    x, cfg, g = _encode_factor_case()
    s = np.float32(448) / np.float32(_f32(0x3FD1BA56))  # NUMERICS: §1 s = RN(fp8_max / amax)
    y = np.float32(_f32(0x3F5937D9)) * s
    assert y == np.float32(232.00002) and y != 232  # 1 ulp above the 224|240 midpoint
    assert int(g.rowwise_data[0, 1]) == 0x77  # 240: the golden rounds up
    # The candidate's encode factor rounded one ulp lower (another operation order): y' < 232 -> 224.
    s_c = np.nextafter(s, np.float32(0))
    cand = _clone(g)
    cand.rowwise_data = torch.from_numpy(_e4m3(x.numpy() * s_c).copy())
    assert int(cand.rowwise_data[0, 1]) == 0x76
    res = _by_name(compare_quantized(g, cand, x))
    assert res["rowwise_scale"].status == "pass"
    tr = res["rowwise_data"]
    assert tr.mismatch_classes == {"encode_factor_rounding": 1}
    assert list(tr.examples["encode_factor_rounding"]["patterns"]) == ["finite_block/same_scale/near_midpoint"]
    (ex,) = _examples(tr, "encode_factor_rounding")
    assert ex["index"] == [0, 1] and ex["golden"] == "0x77" and ex["candidate"] == "0x76"
    assert ex["scaled"] == float(y) and ex["golden_scale"] == ex["candidate_scale"]
    assert tr.first_mismatch["candidate_chain"]["source"].startswith("implied by the contract")


def test_exact_tie_is_tie_flip_unless_the_candidate_reports_its_scaled_value():
    # mxfp8 block with amax 448: E8M0 ceil(log2(448/448)) = 0 -> 127, multiplier 1; 232 is the midpoint of
    # 224 (0x76, even) and 240 (0x77): RNE gives 0x76.
    x = torch.zeros(32, 32)
    x[0, 0], x[0, 1] = 448.0, 232.0
    cfg = Q("mxfp8")
    g = reference.quantize(x, cfg)
    assert int(g.rowwise_scale[0, 0]) == 127 and int(g.rowwise_data[0, 1]) == 0x76
    cand = _clone(g)
    cand.rowwise_data[0, 1] = 0x77
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"tie_flip": 1}
    assert list(tr.examples["tie_flip"]["patterns"]) == ["finite_block/same_scale/near_midpoint"]
    # The adapter returns its own scaled values: 232.00002 was off the tie, so its encode factor differed.
    scaled = x.clone()
    scaled[0, 1] = float(np.float32(232.00002))
    cand.extra["rowwise_chain"] = {"scaled": scaled}
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"encode_factor_rounding": 1}
    (ex,) = _examples(tr, "encode_factor_rounding")
    assert ex["candidate_reported_chain"] == {"scaled": float(np.float32(232.00002))}
    assert tr.first_mismatch["candidate_reported_chain"]["scaled"] == float(np.float32(232.00002))


# ---- eps floor ---------------------------------------------------------------------------------------


def test_eps_floor_on_tiny_blocks():
    x = torch.zeros(2, 256)
    x[:, :128] = 1e-8  # block 0 of each row is tiny; block 1 normal
    x[:, 128:] = torch.linspace(-3, 3, 128)
    cfg = Q("fp8_block", pow2_scales=False)
    g = reference.quantize(x, cfg)
    cand = reference.quantize(x, Q("fp8_block", pow2_scales=False, eps=1e-4))  # max(amax, 1e-4) / 448
    res = _by_name(compare_quantized(g, cand, x))
    sc = res["rowwise_scale"]
    assert sc.mismatch_classes == {"scale_floor": 2}  # entries [kb=0, m=0] and [0, 1]
    exs = _examples(sc, "scale_floor")
    assert [e["index"] for e in exs] == [[0, 0], [0, 1]]
    a = float(np.float32(1e-8))
    assert exs[0]["block_amax"] == a
    assert math.isclose(exs[0]["golden_value"], a / 448, rel_tol=1e-6)
    assert math.isclose(exs[0]["candidate_value"], 1e-4 / 448, rel_tol=1e-6)
    data = res["rowwise_data"]
    assert data.mismatch_classes == {"block_scale_cascade": 256}  # both tiny blocks, every element
    assert list(data.examples["block_scale_cascade"]["patterns"]) == ["finite_block/diff_scale/off_midpoint"]


def test_all_zero_block_scale_is_scale_floor():
    x = torch.zeros(32, 32)
    cfg = Q("mxfp8")
    g = reference.quantize(x, cfg)
    cand = _clone(g)
    cand.rowwise_scale[0, 0] = 127  # a floor of 2^0 instead of the golden's zero-block scale
    assert int(g.rowwise_scale[0, 0]) != 127
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.mismatch_classes == {"scale_floor": 1}
    assert _examples(tr, "scale_floor")[0]["block_amax"] == 0.0


# ---- subnormal flush -------------------------------------------------------------------------------


def test_subnormal_code_flushed_to_zero():
    # fp8_current, amax 448 -> s = 1; 2^-8 is the E4M3 subnormal 0x02 (§0.4), -2^-9 is 0x81.
    x = torch.tensor([[448.0, 2.0**-8, -(2.0**-9), 1.0]])
    g = reference.quantize(x, Q("fp8_current"))
    assert g.rowwise_data.tolist() == [[0x7E, 0x02, 0x81, 0x38]]
    cand = _clone(g)
    cand.rowwise_data[0, 1], cand.rowwise_data[0, 2] = 0x00, 0x80  # a flush-to-zero kernel
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"subnormal_flush": 2}
    exs = _examples(tr, "subnormal_flush")
    assert [(e["index"], e["golden"], e["candidate"]) for e in exs] == [([0, 1], "0x02", "0x00"), ([0, 2], "0x81", "0x80")]
    assert list(tr.examples["subnormal_flush"]["patterns"]) == ["finite_block/same_scale/off_midpoint"]


def test_subnormal_input_flushed_before_scaling():
    # A bf16 block of subnormal inputs: E8M0 scales it up to normal codes; the candidate flushed the input.
    x = torch.full((32, 32), 2.0**-130, dtype=torch.bfloat16)
    x[0, 0] = 2.0**-129
    g = reference.quantize(x, Q("mxfp8"))
    assert int(g.rowwise_data[0, 1]) != 0
    cand = _clone(g)
    cand.rowwise_data[0, 1:] = 0  # row 0 of the rowwise copy
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"subnormal_flush": 31}
    assert list(tr.examples["subnormal_flush"]["patterns"]) == ["subnormal_block/same_scale/off_midpoint"]
    assert len(_examples(tr, "subnormal_flush")) == 3  # up to three per pattern
    assert _examples(tr, "subnormal_flush")[0]["input"] == 2.0**-130


# ---- non-finite policy ------------------------------------------------------------------------------


def test_nan_block_policy_of_ocp_mx():
    # Every block's amax is 448, so ceil and floor agree (§3) and only the NaN block differs: `te` ignores
    # the NaN (amax 448, finite codes, NaN -> 0x7F); ocp_mx (§10.2) makes the block NaN: scale 0xFF, all 0x7F.
    x = torch.linspace(-400, 400, 64 * 96).reshape(64, 96)
    x[:, ::32] = 448.0
    x[5, 40] = float("nan")
    cfg = Q("mxfp8")
    g = reference.quantize(x, cfg)
    cand = reference.quantize(x, with_convention(cfg, "ocp_mx"))
    res = _by_name(compare_quantized(g, cand, x))
    sc = res["rowwise_scale"]
    # The symptom is a non-finite policy; the cause (harness.causes) a NaN-propagating amax, named with its
    # explanation: re-running the golden with it gives the candidate's block.
    assert sc.mismatch_classes == {"nan_propagated": 1}
    (ex,) = _examples(sc, "nan_propagated")
    assert ex["index"] == [5, 1] and ex["candidate"] == "0xFF" and ex["golden"] == "0x7F"
    assert list(sc.examples["nan_propagated"]["patterns"]) == ["nonfinite_block"]
    assert "NaN input propagates" in sc.examples["nan_propagated"]["explanation"]
    data = res["rowwise_data"]
    assert data.mismatch_classes == {"nan_propagated": 31}  # the NaN itself is 0x7F on both sides
    ex = _examples(data, "nan_propagated")[0]
    assert ex["index"] == [5, 32] and ex["candidate"] == "0x7F" and ex["golden"] == "0x7E"
    assert set(data.examples["nan_propagated"]["patterns"]) <= {
        "nonfinite_block/diff_scale/off_midpoint", "nonfinite_block/diff_scale/near_midpoint"}
    # A failing row never reads max_abs = 0, sqnr = inf: the NaN the golden does not have counts.
    assert data.max_abs == math.inf and data.sqnr_db == -math.inf


def test_inf_saturated_vs_propagated():
    x = torch.tensor([[1.0, float("inf"), -2.0, 3.0]])
    g = reference.quantize(x, Q("fp8_current"))
    assert int(g.rowwise_data[0, 1]) == 0x7E  # §1: Inf saturates to 448
    cand = _clone(g)
    cand.rowwise_data[0, 1] = 0x7F  # a kernel that propagates it as NaN
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"nonfinite_policy": 1}
    assert list(tr.examples["nonfinite_policy"]["patterns"]) == ["nonfinite_block/same_scale/off_midpoint"]
    assert tr.max_abs == math.inf


# ---- layouts ------------------------------------------------------------------------------------


def test_transposed_scales_are_named():
    x = torch.linspace(-2, 2, 64 * 256).reshape(64, 256)
    g = reference.quantize(x, Q("fp8_block"))
    assert g.rowwise_scale.shape == (2, 64)
    cand = _clone(g)
    cand.rowwise_scale = g.rowwise_scale.t().contiguous()  # [m, kb] instead of TE's [kb, m]
    res = compare_quantized(g, cand, x)
    tr = _by_name(res)["rowwise_scale"]
    assert tr.mismatch_classes == {"layout_transposition": tr.n}
    assert tr.layout == "scales are the golden's transposed"
    assert layout_finding(res) == "rowwise_scale: scales are the golden's transposed"
    assert class_counts(res) == {"rowwise_scale": {"layout_transposition": 128}}
    assert "transposed" in tr.first_mismatch["reason"]
    assert "the golden's scales transposed" in describe_mismatch(tr)
    assert compare_layout_finding(res) == layout_finding(res)  # compare re-exports the runner's API


def test_transposed_data_and_swapped_nibbles_are_named():
    x = torch.linspace(-2, 2, 128 * 128).reshape(128, 128)
    g = reference.quantize(x, Q("fp8_block"))
    cand = _clone(g)
    cand.rowwise_data = g.rowwise_data.t().contiguous()
    res = compare_quantized(g, cand, x)
    assert layout_finding(res) == "rowwise_data: data is the golden transposed"
    assert "candidate equals the golden transposed" in describe_mismatch(_by_name(res)["rowwise_data"])
    x = torch.linspace(-5, 6, 32 * 64).reshape(32, 64)
    g = reference.quantize(x, Q("nvfp4"))
    cand = _clone(g)
    b = g.rowwise_data.to(torch.int32)
    cand.rowwise_data = (((b & 0x0F) << 4) | (b >> 4)).to(torch.uint8)  # element 2j in the high nibble
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes.keys() == {"layout_transposition"} and "nibbles swapped" in tr.layout
    assert layout_finding(tr).startswith("rowwise_data: data is the golden with its nibbles swapped")


def test_no_layout_finding_for_a_plain_mismatch():
    x = torch.linspace(-2, 2, 64 * 96).reshape(64, 96)
    g = reference.quantize(x, Q("mxfp8"))
    cand = _clone(g)
    cand.rowwise_data[3, 3] ^= 0x20
    res = compare_quantized(g, cand, x)
    assert layout_finding(res) is None and class_counts(res) == {"rowwise_data": {"other": 1}}


# ---- scale rounding rule ------------------------------------------------------------------------------


def test_e8m0_floor_instead_of_ceil_is_named_on_scales_and_data():
    x = torch.linspace(-3, 3, 64 * 96).reshape(64, 96)
    g = reference.quantize(x, Q("mxfp8"))
    cand = reference.quantize(x, Q("mxfp8", e8m0_rule="floor"))
    res = _by_name(compare_quantized(g, cand, x))
    sc = res["rowwise_scale"]
    # Hand count: floor(log2 amax) - 8 (§3 floor, emax(E4M3) = 8) vs ceil(log2(amax / 448)) = ceil(log2 amax
    # - 8.807): they differ exactly when amax's significand exceeds 1.75 = 448 / 2^8.
    amax = x.abs().reshape(64, 3, 32).amax(dim=2)
    sig = amax / torch.exp2(torch.floor(torch.log2(amax)))
    differ = int((sig > 1.75).sum())
    # Re-running the golden with the floor rule gives the candidate's scales and codes (harness.causes): the
    # scale entries (symptom scale_rule) and the codes of those blocks (symptom block_scale_cascade) name it.
    assert sc.mismatch_classes == {"e8m0_floor": differ} and differ > 0
    for ex in _examples(sc, "e8m0_floor"):
        assert ex["rule"] == "e8m0_rule=floor"
        assert int(ex["golden"], 16) == int(ex["candidate"], 16) + 1
    assert res["rowwise_data"].mismatch_classes.keys() == {"e8m0_floor"}


# ---- dequantized outputs --------------------------------------------------------------------------------


def test_dequantize_mismatch_shows_code_scale_and_decode_chain():
    x = torch.linspace(-3, 3, 64 * 96).reshape(64, 96)
    q = reference.quantize(x, Q("mxfp8"))
    gold = reference.dequantize(q, "rowwise", torch.float32)
    cand = gold.clone()
    cand[3, 5] = float("nan")  # a NaN where the golden is finite
    cand[7, 40] = torch.nextafter(gold[7, 40], torch.tensor(math.inf))  # one ulp off
    tr = compare_dequantized(q, "rowwise", gold, cand, "dequant_rowwise")
    assert tr.mismatch_classes == {"nonfinite_policy": 1, "decode_factor_rounding": 1}
    assert tr.max_abs == math.inf and tr.sqnr_db == -math.inf  # never max_abs=0, sqnr=inf
    (ex,) = _examples(tr, "decode_factor_rounding")
    code, e = int(q.rowwise_data[7, 40]), int(q.rowwise_scale[7, 1])
    assert ex["index"] == [7, 40] and ex["ulps"] == 1
    assert ex["code"] == f"0x{code:02X}" and ex["scale"] == f"0x{e:02X}"
    value = float(np.array([code], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)[0])
    assert ex["code_value"] == value
    assert ex["decode_chain"]["e8m0"] == e and ex["decode_chain"]["decode"] == 2.0 ** (e - 127)
    assert ex["golden"] == value * 2.0 ** (e - 127)  # NUMERICS: §3 x = value(code) * 2^(e - 127)
    assert tr.first_mismatch["code"] == f"0x{int(q.rowwise_data[3, 5]):02X}"


def test_output_subnormal_flush_and_transposed_output():
    gold = torch.tensor([[1.0, 1e-40], [3.0, 4.0]])
    cand = gold.clone()
    cand[0, 1] = 0.0
    tr = compare_output(gold, cand, "out")
    assert tr.mismatch_classes == {"subnormal_flush": 1}
    assert list(tr.examples["subnormal_flush"]["patterns"]) == ["subnormal"]
    tr = compare_output(gold, gold.t().contiguous(), "out")
    assert tr.mismatch_classes == {"layout_transposition": 2} and tr.layout == "output is the golden's transposed"


@pytest.mark.parametrize("cls", MISMATCH_CLASSES)
def test_every_class_is_documented(cls):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "reports" / "README.md").read_text()
    assert f"| `{cls}` |" in text


def test_amax_nan_propagated_vs_inf_is_named_nan_propagated():
    # te's amax ignores NaN (§7.2): an Inf input gives +Inf; a NaN-propagating candidate stores NaN. The symptom is
    # nonfinite_policy; re-running the golden with a NaN-propagating amax gives the candidate's amax bit for bit
    # (one fp32 value is evidence enough, harness.causes.MIN_EXPLAINED), so the cause names it.
    x = torch.tensor([[1.0, float("inf"), float("nan"), 3.0]])
    g = reference.quantize(x, Q("fp8_current"))
    assert float(g.rowwise_amax.reshape(-1)[0]) == math.inf
    cand = _clone(g)
    cand.rowwise_amax = torch.full_like(g.rowwise_amax, float("nan"))
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_amax"]
    assert tr.mismatch_classes == {"nan_propagated": 1}
    (ex,) = _examples(tr, "nan_propagated")
    assert ex["golden_bits"] == "0x7F800000" and math.isnan(ex["candidate"])
    assert _by_name(compare_quantized(g, cand, x, causes=False))["rowwise_amax"].mismatch_classes == {
        "nonfinite_policy": 1}


def test_torchao_nvfp4_encode_factor_order_is_not_a_tie_flip():
    # torchao computes f = RN(RN(1/pts) / s_blk), te RN(1 / RN(s_blk * S_dec)) (docs/numerics.md §10.5): on
    # normal inputs the scales agree and the codes differ only where x*f lies next to a midpoint.
    from harness.cases import Case
    from harness.inputs import generate

    cfg = Q("nvfp4")
    # Seed 14: its harness.draws input has elements next to (not on) a midpoint: 32 codes differ, all
    # encode_factor_rounding, the scales agree. Seed 0's did under the old torch.Generator inputs; its new one
    # has none (other seeds also put x*f exactly on a midpoint: tie_flip).
    x = generate(Case("quantize", cfg, (128, 256), "bfloat16", "normal", 14, "rowwise"))["x"]
    g = reference.quantize(x, cfg)
    cand = reference.quantize(x, with_convention(cfg, "torchao_nvfp4"))
    res = _by_name(compare_quantized(g, cand, x))
    assert res["rowwise_scale"].status == "pass" and res["rowwise_amax"].status == "pass"
    tr = res["rowwise_data"]
    # torchao's factor is RN(RN(1 / pts) / s_blk), a division by the block scale: the golden re-run with f =
    # RN(S_enc / s_blk) (harness.causes `encode_by_division`) gives these codes, so that cause names them; either
    # way no tie is flipped, and every example lies next to a midpoint.
    (cls,) = set(tr.mismatch_classes)
    assert cls == "encode_by_division" and tr.n_mismatch > 0
    assert _by_name(compare_quantized(g, cand, x, causes=False))["rowwise_data"].mismatch_classes.keys() == {
        "encode_factor_rounding"}
    e2m1 = ml_dtypes.float4_e2m1fn
    for ex in _examples(tr, cls):
        gv, cv = (float(np.array([int(ex[k], 16)], dtype=np.uint8).view(e2m1)[0]) for k in ("golden", "candidate"))
        mid = (gv + cv) / 2
        ulp = float(np.spacing(np.float32(abs(ex["scaled"]))))
        assert 0 < abs(ex["scaled"] - mid) <= 4 * ulp  # near, not on, the midpoint
        assert ex["golden_scale"] == ex["candidate_scale"]


def test_amax_over_fmax_true_division_is_scale_rule():
    # te: sinv = RN(1 / RN(448 / A)) = 0x3B6FB061; vllm_group (§10.7): sinv = RN(A / 448) = 0x3B6FB062 (numpy fp32).
    x, cfg, g = _encode_factor_case()
    a = np.float32(_f32(0x3FD1BA56))
    te_sinv, vllm_sinv = np.float32(1) / (np.float32(448) / a), a / np.float32(448)
    assert (int(te_sinv.view(np.uint32)), int(vllm_sinv.view(np.uint32))) == (0x3B6FB061, 0x3B6FB062)
    cand = reference.quantize(x, with_convention(cfg, "vllm_group"))
    res = _by_name(compare_quantized(g, cand, x))
    sc = res["rowwise_scale"]
    assert sc.mismatch_classes == {"scale_rule": 1}  # one ulp apart, but another rule's value: not off_by_one
    (ex,) = _examples(sc, "scale_rule")
    assert ex == {"index": [0, 0], "golden": "0x3B6FB061", "candidate": "0x3B6FB062", "golden_value": float(te_sinv),
                  "candidate_value": float(vllm_sinv), "row": 0, "col": 0, "block_amax": float(a),
                  "rule": "convention=vllm_group"}
    # x / sinv = 232 exactly ties to 224 (0x76); the golden's x * s = 232.00002 gives 240 (0x77).
    (dx,) = _examples(res["rowwise_data"], "block_scale_cascade")
    assert (dx["golden"], dx["candidate"], dx["index"]) == ("0x77", "0x76", [0, 1])


# ---- examples as text (repro output, pytest failure message) ----------------------------------------


def test_format_examples_shows_up_to_n_per_class_taking_the_patterns_in_turn():
    ex = {
        "tie_flip": {"count": 5, "patterns": {
            "finite_block/same_scale/near_midpoint": {"count": 4, "examples": [
                {"index": [0, 1], "golden": "0x76", "candidate": "0x77", "scaled": 232.0},
                {"index": [0, 9], "golden": "0x06", "candidate": "0x05"},
                {"index": [3, 2], "golden": "0x10", "candidate": "0x11"}]},
            "subnormal_block/same_scale/near_midpoint": {"count": 1, "examples": [
                {"index": [7, 7], "golden": "0x01", "candidate": "0x00", "input": 1e-40}]}}},
        "scale_floor": {"count": 1, "patterns": {"finite_block": {"count": 1, "examples": [
            {"index": [2], "golden": "0x00", "candidate": "0x08", "block_amax": 0.0}]}}},
    }
    assert format_examples(ex, n=2, indent="  ") == [
        "  tie_flip: 5 element(s) in 2 input pattern(s)",
        "    [finite_block/same_scale/near_midpoint] index=[0, 1] golden=0x76 candidate=0x77 scaled=232",
        "    [subnormal_block/same_scale/near_midpoint] index=[7, 7] golden=0x01 candidate=0x00 input=1e-40",
        "  scale_floor: 1 element(s)",
        "    [finite_block] index=[2] golden=0x00 candidate=0x08 block_amax=0",
    ]
    # The report's JSON text reads the same; three per class by default; nothing for a passing row.
    import json

    lines = format_examples(json.dumps(ex))
    assert len(lines) == 2 + 3 + 1 and lines[3] == "  [finite_block/same_scale/near_midpoint] index=[0, 9] golden=0x06 candidate=0x05"
    assert format_examples({}) == format_examples("") == format_examples(None) == []
    # A cause's class line carries its explanation; a shared class (layout) names the cause first.
    cause = {"round_toward_zero": {"count": 2, "cause": "round_toward_zero", "explanation": "truncated",
                                   "patterns": {"p": {"count": 2, "examples": [{"index": [0, 0]}]}}},
             "layout_transposition": {"count": 4, "cause": "nibble_order", "explanation": "swapped",
                                      "patterns": {"layout": {"count": 4, "examples": []}}}}
    assert format_examples(cause)[0] == "round_toward_zero: 2 element(s) - truncated"
    assert format_examples(cause)[2] == "layout_transposition: 4 element(s) - cause nibble_order: swapped"


class ThreeInjected:
    """The golden with three injected differences: two codes one step up, a NaN where the golden is finite."""

    name = "injected"

    def supports(self, op, config, device):
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        q = reference.quantize(x, config)
        d = q.rowwise_data.clone()
        d[0, 0] = (d[0, 0] & 0x80) | ((d[0, 0] & 0x7F) + 1)  # one step up
        d[1, 2] = (d[1, 2] & 0x80) | ((d[1, 2] & 0x7F) + 1)
        d[4, 5] = 0x7F  # NaN where the golden is finite
        q.rowwise_data = d
        return q


def test_failure_message_and_repro_show_the_examples_of_every_class(capsys):
    """A candidate with three injected differences (two codes one step up, a NaN where the golden is
    finite): the pytest failure text and `harness repro` both list each class with its count and the
    examples, every injected index among them."""
    from harness import cli, runner
    from harness.cases import Case
    from harness.pytest_plugin import failure_message

    case = Case("quantize", Q("fp8_current"), (32, 64), "float32", "normal", 0, "rowwise")
    rows = runner.run_case(case, ThreeInjected(), "cpu")
    data = next(r for r in rows if r["tensor"] == "rowwise_data")
    classes = data["mismatch_classes"]
    assert sum(classes.values()) == 3
    msg = failure_message(case, "injected", rows)
    assert "    mismatch examples (up to 3 per class):" in msg
    for cls, n in classes.items():
        assert f"      {cls}: {n} element(s)" in msg
    for idx in ("index=[0, 0]", "index=[1, 2]", "index=[4, 5]"):
        assert idx in msg
    assert msg.index("mismatch examples") < msg.index("repro: ")

    # repro runs the backend in a process of its own (docs/design.md §9): it is loaded there by its spec
    capsys.readouterr()
    rc = cli.main(["repro", case.id, "--backend", "tests.unit.test_classify:ThreeInjected", "--device", "cpu"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "        mismatch examples (up to 3 per class):" in text
    for cls, n in classes.items():
        assert f"          {cls}: {n} element(s)" in text
    assert all(idx in text for idx in ("index=[0, 0]", "index=[1, 2]", "index=[4, 5]"))


# ---- swizzled scales -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg, shape", [(Q("mxfp8"), (64, 256)), (Q("mxfp8", element="e5m2"), (160, 96)),
                                        (Q("nvfp4"), (64, 128)), (Q("nvfp4"), (144, 48))])
@pytest.mark.parametrize("as_flat", [True, False])
def test_swizzled_scales_are_named_on_both_copies(cfg, shape, as_flat):
    """A reference-derived candidate whose block scales are in cuBLASLt's swizzled order (as its GEMM
    reads them, reference.layouts.swizzle_scales: the oracle), flat or reshaped to the compact padded
    shape: every scale row names the layout, the data rows pass."""
    from reference.layouts import swizzle_scales

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    g = reference.quantize(x, cfg, rowwise=True, colwise=True)
    cand = _clone(g)
    for o in ("rowwise", "colwise"):
        flat = swizzle_scales(g, o)
        setattr(cand, f"{o}_scale", flat if as_flat else flat.reshape(getattr(g, f"{o}_scale").shape))
    res = _by_name(compare_quantized(g, cand, x))
    for o in ("rowwise", "colwise"):
        tr = res[f"{o}_scale"]
        assert tr.status == "fail" and tr.layout == "scales are the golden's swizzled (128x4 tiles)", (o, tr.layout)
        assert set(tr.mismatch_classes) == {"layout_transposition"} and tr.mismatch_classes["layout_transposition"] > 0
        assert res[f"{o}_data"].status == "pass"
    assert layout_finding(list(res.values())).startswith("rowwise_scale: scales are the golden's swizzled")


def test_harness_unswizzle_inverts_the_reference_swizzle_and_differs_from_a_plain_reshape():
    from harness.compare import _unswizzle
    from reference.layouts import swizzle

    # docs/numerics.md §8 vectors: in T [256, 8], entries (0,0) (1,0) (32,0) (0,1) (0,4) (128,0) (37,5) sit at
    # flat offsets 0, 16, 4, 1, 512, 1024, 597; unswizzling the offsets themselves gives each entry its offset.
    u = _unswizzle(torch.arange(256 * 8, dtype=torch.int64), (256, 8))
    vectors = {(0, 0): 0, (1, 0): 16, (32, 0): 4, (0, 1): 1, (0, 4): 512, (128, 0): 1024, (37, 5): 597}
    assert {ij: int(u[ij]) for ij in vectors} == vectors
    assert sorted(u.reshape(-1).tolist()) == list(range(256 * 8))  # a permutation
    t = torch.randint(0, 255, (384, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_unswizzle(swizzle(t), (384, 12)), t)  # the inverse of the reference's swizzle
    assert not torch.equal(swizzle(t).reshape(384, 12), t)


def test_a_plain_scale_mismatch_is_not_called_swizzled():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(2))
    g = reference.quantize(x, Q("mxfp8"))
    cand = _clone(g)
    cand.rowwise_scale = g.rowwise_scale.clone()
    cand.rowwise_scale[3, 1] += 1
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.layout is None and "layout_transposition" not in tr.mismatch_classes


def test_e8m0_zero_block_scaled_by_one_is_zero_scale_factor():
    """docs/numerics.md §7.29: an MXFP8 block with amax 3.08e-38 has e = 0 (§3); the contract multiplies by
    P(0) = 2^127, TE's kernels and torchao by exp2f_rcp(0) = 1.0, which casts these tiny normal inputs to 0.
    The subnormal input zeroed with them has the same cause (re-running the golden with the factor 1.0 gives all
    three), which outranks its symptom (subnormal_flush); zeroed alone it stays a subnormal_flush."""
    x = torch.zeros(32, 32)
    x[0, 0] = 3.08e-38  # the block max: RN32(3.08e-38 / 448) < 2^-127 -> e = 0
    x[0, 1] = 1.5e-38  # normal fp32 (> 1.18e-38): golden code of 1.5e-38 * 2^127 = 2.55 -> 0x42 (E4M3 2.5)
    x[0, 2] = 4.6e-39  # subnormal fp32
    g = reference.quantize(x, Q("mxfp8"))
    assert int(g.rowwise_scale[0, 0]) == 0
    assert int(g.rowwise_data[0, 1]) == int(_e4m3(np.array([1.5e-38 * 2.0**127], dtype=np.float32))[0]) != 0
    cand = _clone(g)
    cand.rowwise_data[0, :3] = 0  # sat(RN(x * 1.0)) is +0 for all three
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"zero_scale_factor": 3}
    exs = _examples(tr, "zero_scale_factor")
    assert [e["index"] for e in exs] == [[0, 0], [0, 1], [0, 2]]
    assert "2^127" in tr.examples["zero_scale_factor"]["explanation"]
    assert _by_name(compare_quantized(g, cand, x, causes=False))["rowwise_data"].mismatch_classes == {
        "zero_scale_factor": 2, "subnormal_flush": 1}  # the symptoms alone


def test_e8m0_zero_block_divided_by_the_smallest_normal_is_zero_scale_factor():
    """torchao's FLOOR cast clamps an e = 0 block's scale at 2^-126 (docs/numerics.md §7.23): codes of x * 2^126,
    one binade below the contract's x * 2^127 (1.5e-38 * 2^127 = 2.55 -> 0x42; * 2^126 = 1.28 -> 0x3A)."""
    x = torch.zeros(32, 32)
    x[0, 0], x[0, 1] = 3.08e-38, 1.5e-38
    g = reference.quantize(x, Q("mxfp8"))
    cand = _clone(g)
    half = _e4m3(np.array([3.08e-38 * 2.0**126, 1.5e-38 * 2.0**126], dtype=np.float32))
    assert int(g.rowwise_data[0, 1]) == 0x42 and int(half[1]) == 0x3A
    cand.rowwise_data[0, 0], cand.rowwise_data[0, 1] = int(half[0]), int(half[1])
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"zero_scale_factor": 2}


def test_nvfp4_truncation_is_named_and_never_a_subnormal_flush():
    """Issue #39: truncating NVFP4 codes showed as `other` plus `subnormal_flush` (E2M1's code 0.5 is a subnormal
    encoding, but ordinary inputs in [0.25, 0.75) round to it). The cause search names round_toward_zero; the
    symptoms alone (causes=False) no longer call a 0.5 -> 0 code a flush."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    g = reference.quantize(x, Q("nvfp4"))
    codes = torch.stack([g.rowwise_data & 0xF, g.rowwise_data >> 4], -1).reshape(32, 64).to(torch.int64)
    from reference import nvfp4

    ch = nvfp4.scale_chain(x, Q("nvfp4"), "rowwise")
    y = (ch["source"] * ch["f"].repeat_interleave(16, 1)).abs()
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    mag = codes & 7
    down = (grid[mag] > y) & (mag > 0)  # rounded up by RNE: truncation takes the code below
    cand_codes = torch.where(down, (mag - 1) | (codes & 8), codes).to(torch.uint8)
    assert bool((down & (mag == 1)).any())  # some 0.5 codes become 0
    cand = _clone(g)
    cand.rowwise_data = cand_codes[:, 0::2] | (cand_codes[:, 1::2] << 4)
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"round_toward_zero": int(down.sum())}
    assert "truncated toward zero" in tr.examples["round_toward_zero"]["explanation"]
    plain = _by_name(compare_quantized(g, cand, x, causes=False))["rowwise_data"]
    assert "subnormal_flush" not in plain.mismatch_classes
