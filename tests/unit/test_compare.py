"""harness.compare: every fault class injected into a copy of a reference result is classified and
located; metrics and ULP histograms on known vectors; GEMM/dequantized output comparison.

Tie positions are found with ml_dtypes' code tables and the reference's stored scales, not with
the code under test (docs/numerics.md §0.5 ties, §3-§5 scale chains).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import reference
from harness.cases import Case
from harness.compare import (
    TensorResult,
    compare_gemm,
    compare_output,
    compare_quantized,
    is_midpoint,
    metrics,
    ulp_hist_codes,
    ulp_hist_float,
)
from harness.inputs import generate
from reference import casts
from reference.formats import E2M1, E4M3, E5M2, QuantConfig
from reference.types import QuantizedTensor

from .oracles import scaled_by_encode_factor

Q = QuantConfig
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m1": ml_dtypes.float4_e2m1fn}
FMT = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}


def _golden(cfg, shape, dist="normal", dt="bfloat16", seed=0):
    x = generate(Case("quantize", cfg, shape, dt, dist, seed, "both"))["x"]
    return x, reference.quantize(x, cfg, rowwise=True, colwise=True, rng=(seed, 0))


def _clone(q: QuantizedTensor) -> QuantizedTensor:
    kw = {n: (None if getattr(q, n) is None else getattr(q, n).clone()) for n in QuantizedTensor.TENSOR_FIELDS}
    return QuantizedTensor(q.config, q.shape, q.hp_dtype, extra=dict(q.extra), **kw)


def _by_name(results: list[TensorResult]) -> dict[str, TensorResult]:
    return {r.tensor: r for r in results}


def _codes(q, o):
    d = getattr(q, f"{o}_data")
    return casts.unpack_nibbles(d) if q.config.scheme == "nvfp4" else d


def _set_code(q, o, r, c, code):
    d = getattr(q, f"{o}_data")
    if q.config.scheme == "nvfp4":
        u = casts.unpack_nibbles(d)
        u[r, c] = code
        setattr(q, f"{o}_data", casts.pack_nibbles(u))
    else:
        d[r, c] = code


def _mids(element):
    n = 16 if element == "e2m1" else 256
    g = np.arange(n, dtype=np.uint8).view(ML[element]).astype(np.float64)
    g = np.unique(np.abs(g[np.isfinite(g)]))
    return (g[:-1] + g[1:]) / 2


# ---- identical results pass ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, shape",
    [(Q("fp8_current"), (64, 96)), (Q("fp8_delayed"), (64, 96)), (Q("mxfp8", tile=(32, 32)), (64, 96)),
     (Q("fp8_block"), (130, 200)), (Q("fp8_block", tile=(128, 128)), (130, 200)), (Q("nvfp4", rht=True), (64, 128))],
    ids=lambda v: v.id if isinstance(v, QuantConfig) else "x".join(map(str, v)),
)
def test_identical_results_pass(cfg, shape):
    x, g = _golden(cfg, shape, "special")
    res = compare_quantized(g, _clone(g), x)
    want = [f"{o}_{k}" for o in ("rowwise", "colwise") for k in ("data", "scale", "amax") if getattr(g, f"{o}_{k}") is not None]
    assert [r.tensor for r in res] == want
    for r in res:
        assert r.status == "pass" and r.n_mismatch == 0 and r.first_mismatch is None, r.tensor
        assert r.ulp_hist["0"] == r.n


# ---- tie_flip ------------------------------------------------------------------------------------

TIE_CASES = [
    (Q("mxfp8"), (64, 96), "rowwise"),
    (Q("mxfp8", element="e5m2"), (64, 96), "colwise"),
    (Q("fp8_block"), (130, 200), "colwise"),
    (Q("fp8_block", tile=(128, 128), pow2_scales=False), (130, 200), "rowwise"),
    (Q("fp8_current"), (64, 96), "rowwise"),
    (Q("nvfp4"), (64, 128), "rowwise"),
    (Q("nvfp4", tile=(16, 16)), (64, 128), "colwise"),
]


def _expected_location(cfg, o, r, c, rows, cols):
    """(logical row, col, block, element) of data position (r, c), from docs/numerics.md layouts."""
    transposed = o == "colwise" and cfg.scheme != "mxfp8"
    row, col = (c, r) if transposed else (r, c)
    if cfg.tile is None:
        return row, col, [0, 0], r * cols + c
    b = cfg.block
    if cfg.is_2d:
        return row, col, [r // b, c // b], (r % b) * b + c % b
    if cfg.scheme == "mxfp8" and o == "colwise":
        return row, col, [r // b, c], r % b
    return row, col, [r, c // b], c % b


@pytest.mark.parametrize("cfg, shape, o", TIE_CASES, ids=lambda v: v.id if isinstance(v, QuantConfig) else str(v))
def test_tie_flip_is_classified_and_located(cfg, shape, o):
    x, g = _golden(cfg, shape, "ties", seed=3)
    y = scaled_by_encode_factor(g, x, o)
    on_mid = torch.from_numpy(np.isin(y.abs().numpy(), _mids(cfg.element)))
    rows, cols = y.shape
    pos = int(on_mid.reshape(-1).nonzero()[rows * cols // 3 % int(on_mid.sum())][0])  # a tie in the middle
    r, c = divmod(pos, cols)
    fmt = FMT[cfg.element]
    code = int(_codes(g, o)[r, c])
    mag, sign = code & ~fmt.sign_mask & 0xFF, code & fmt.sign_mask
    val = float(casts.decode(torch.tensor([code], dtype=torch.uint8), fmt)[0])
    other = sign | (mag + 1 if abs(float(y[r, c])) > abs(val) else mag - 1)  # the other neighbour
    cand = _clone(g)
    _set_code(cand, o, r, c, other)
    res = _by_name(compare_quantized(g, cand, x))
    tr = res[f"{o}_data"]
    assert tr.status == "fail" and tr.n_mismatch == 1 and tr.mismatch_classes == {"tie_flip": 1}
    fm = tr.first_mismatch
    row, col, block, elem = _expected_location(cfg, o, r, c, rows, cols)
    assert fm["index"] == [r, c] and fm["row"] == row and fm["col"] == col
    assert fm["block"] == block and fm["element"] == elem and fm["class"] == "tie_flip"
    assert fm["scaled"] == float(y[r, c]) and fm["input"] == float(x.to(torch.float32)[row, col])
    assert float(x.to(torch.float32)[row, col]) in fm["input_block"]["values"]
    assert fm["golden_chain"] and fm["candidate_chain"]
    assert tr.ulp_hist["1"] == 1
    assert all(r.status == "pass" for n, r in res.items() if n != f"{o}_data")


def test_non_adjacent_change_on_a_tie_is_other():
    x, g = _golden(Q("mxfp8"), (64, 96), "ties", seed=3)
    cand = _clone(g)
    y = scaled_by_encode_factor(g, x, "rowwise")
    on_mid = np.isin(y.abs().numpy(), _mids("e4m3"))
    r, c = (int(v) for v in np.argwhere(on_mid)[5])
    cand.rowwise_data[r, c] = (int(g.rowwise_data[r, c]) & 0x80) | ((int(g.rowwise_data[r, c]) & 0x7F) ^ 0x08)
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"other": 1} and tr.first_mismatch["index"] == [r, c]


def test_other_on_plain_input():
    x, g = _golden(Q("fp8_block"), (130, 200), "normal")
    cand = _clone(g)
    cand.colwise_data[7, 129] = (int(cand.colwise_data[7, 129]) + 3) % 0x7E
    tr = _by_name(compare_quantized(g, cand, x))["colwise_data"]
    assert tr.mismatch_classes == {"other": 1}
    fm = tr.first_mismatch
    assert fm["index"] == [7, 129] and (fm["row"], fm["col"]) == (129, 7)  # colwise data is [K, M]
    assert fm["block"] == [7, 1] and fm["element"] == 1
    assert fm["golden_chain"]["scale_index"] == [1, 7]  # sinv [ceil(M/128), K], entry [mb, k]


# ---- scale_off_by_one and block_scale_cascade ----------------------------------------------------


def test_mxfp8_scale_off_by_one_located():
    x, g = _golden(Q("mxfp8"), (64, 96))
    amax = x.to(torch.float32).abs().reshape(64, 3, 32).amax(dim=2)
    mant, _ = torch.frexp(amax)  # amax = mant * 2^e, mant in [0.5, 1)
    # A block whose amax significand lies in (1.75, 1.9375): TE's ceil(log2(amax/448)) equals torchao's
    # ceil(log2 amax) - 8 there, floor is one lower and torchao's EVEN does not carry, so +1 is no rule's scale.
    r, kb = (int(t) for t in ((mant * 2 > 1.75) & (mant * 2 < 1.9375)).nonzero()[0])
    cand = _clone(g)
    cand.rowwise_scale[r, kb] += 1
    res = _by_name(compare_quantized(g, cand, x))
    tr = res["rowwise_scale"]
    assert tr.mismatch_classes == {"scale_off_by_one": 1} and tr.n == 64 * 3
    fm = tr.first_mismatch
    assert fm["index"] == [r, kb] and fm["row"] == r and fm["col"] == 32 * kb and fm["block"] == [r, kb]
    assert fm["golden"] == f"0x{int(g.rowwise_scale[r, kb]):02X}"
    assert len(fm["input_block"]["values"]) == 32
    assert res["rowwise_data"].status == "pass"  # codes unchanged


def test_mxfp8_scale_one_up_that_is_torchao_ceil_is_scale_rule():
    x, g = _golden(Q("mxfp8"), (64, 96))
    # Block [3, 2] of the harness.draws input (it was [17, 2] with amax 1.71875 under the old torch.Generator).
    assert float(x[3, 64:96].to(torch.float32).abs().max()) == 1.640625
    # TE ceil: ceil(log2(1.640625 / 448)) = ceil(-8.09) = -8 -> 0x77; torchao CEIL (docs/numerics.md §10.3):
    # ceil(log2 1.640625) - 8 = -7 -> 0x78.
    assert int(g.rowwise_scale[3, 2]) == 0x77
    cand = _clone(g)
    cand.rowwise_scale[3, 2] = 0x78
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.mismatch_classes == {"scale_rule": 1}
    (ex,) = tr.examples["scale_rule"]["patterns"]["finite_block"]["examples"]
    assert ex["rule"] == "convention=torchao_ceil" and ex["golden"] == "0x77" and ex["candidate"] == "0x78"
    assert ex["block_amax"] == 1.640625 and ex["index"] == [3, 2]


def test_mxfp8_block_scale_cascade():
    cfg = Q("mxfp8")
    x, g = _golden(cfg, (64, 96), "uniform")
    cand = _clone(g)
    mb, k = 1, 50  # colwise block: rows 32..63 of column 50
    e = int(g.colwise_scale[mb, k]) + 1
    cand.colwise_scale[mb, k] = e
    col = x.to(torch.float32)[32:64, k]
    cand.colwise_data[32:64, k] = casts.saturating_cast(col * casts.e8m0_multiplier(torch.tensor([e], dtype=torch.uint8)), E4M3)
    changed = int((cand.colwise_data != g.colwise_data).sum())
    assert changed > 5
    res = _by_name(compare_quantized(g, cand, x))
    assert res["colwise_scale"].mismatch_classes == {"scale_off_by_one": 1}
    tr = res["colwise_data"]
    assert tr.mismatch_classes == {"block_scale_cascade": changed}
    fm = tr.first_mismatch
    assert fm["block"] == [1, 50] and 32 <= fm["row"] < 64 and fm["col"] == 50
    assert fm["golden_chain"]["e8m0"] + 1 == fm["candidate_chain"]["e8m0"] == e


@pytest.mark.parametrize("pow2", [True, False])
def test_fp8_block_scale_off_by_one(pow2):
    x, g = _golden(Q("fp8_block", pow2_scales=pow2), (130, 200))
    cand = _clone(g)
    if pow2:
        cand.rowwise_scale[1, 5] *= 2  # one step of a power-of-two scale
    else:
        cand.rowwise_scale[1, 5] = torch.nextafter(g.rowwise_scale[1, 5], torch.tensor(1.0))
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.mismatch_classes == {"scale_off_by_one": 1}
    fm = tr.first_mismatch
    assert fm["index"] == [1, 5] and fm["row"] == 5 and fm["col"] == 128  # entry [kb, m]: row 5, K block 1
    cand.rowwise_scale[1, 5] = g.rowwise_scale[1, 5] * 3
    assert _by_name(compare_quantized(g, cand, x))["rowwise_scale"].mismatch_classes == {"other": 1}


def test_nvfp4_scale_and_amax_changes():
    cfg = Q("nvfp4")
    x, g = _golden(cfg, (64, 128))
    cand = _clone(g)
    cand.rowwise_scale[3, 4] += 1
    assert _by_name(compare_quantized(g, cand, x))["rowwise_scale"].mismatch_classes == {"scale_off_by_one": 1}
    cand = _clone(g)
    cand.rowwise_amax = torch.nextafter(g.rowwise_amax, torch.full_like(g.rowwise_amax, math.inf))
    u = casts.unpack_nibbles(cand.rowwise_data)
    u[10, 20] ^= 1
    cand.rowwise_data = casts.pack_nibbles(u)
    res = _by_name(compare_quantized(g, cand, x))
    assert res["rowwise_amax"].mismatch_classes == {"other": 1}
    assert res["rowwise_data"].mismatch_classes == {"block_scale_cascade": 1}  # the global scale chain differs
    assert res["rowwise_data"].first_mismatch["index"] == [10, 20]


# ---- nan_sign ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [Q("mxfp8"), Q("fp8_current", element="e5m2"), Q("fp8_block")], ids=lambda c: c.id)
def test_nan_sign(cfg):
    x, g = _golden(cfg, (128, 128), "special")
    fmt = cfg.element_format
    d = g.rowwise_data
    nan_pos = (d == fmt.nan_code).nonzero()
    assert nan_pos.shape[0] > 0
    r, c = (int(v) for v in nan_pos[0])
    cand = _clone(g)
    cand.rowwise_data[r, c] = fmt.nan_code | fmt.sign_mask  # 0x7F -> 0xFF
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_data"]
    assert tr.mismatch_classes == {"nan_sign": 1}
    assert tr.first_mismatch["index"] == [r, c] and tr.first_mismatch["class"] == "nan_sign"
    assert tr.ulp_hist["nan"] == 1


# ---- padding -------------------------------------------------------------------------------------


def test_padding_is_informational_unless_claimed():
    x, g = _golden(Q("mxfp8"), (64, 96))
    cand = _clone(g)
    assert cand.rowwise_scale.shape == (128, 4)
    cand.rowwise_scale[100, 0] = 7
    cand.rowwise_scale[0, 3] = 9
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.status == "pass" and tr.detail["padding_mismatches"] == 2 and tr.n == 64 * 3
    tr = _by_name(compare_quantized(g, cand, x, strict_padding=True))["rowwise_scale"]
    assert tr.status == "fail" and tr.mismatch_classes == {"padding": 2}
    assert tr.first_mismatch["class"] == "padding" and tr.first_mismatch["index"] == [0, 3]
    cand.extra["zero_fills_padding"] = True
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.mismatch_classes == {"padding": 2}


# ---- layout_transposition ------------------------------------------------------------------------


def test_swapped_orientation_is_layout_transposition():
    x, g = _golden(Q("mxfp8"), (64, 64))
    cand = _clone(g)
    cand.rowwise_data, cand.colwise_data = g.colwise_data.clone(), g.rowwise_data.clone()
    res = _by_name(compare_quantized(g, cand, x))
    for o in ("rowwise", "colwise"):
        tr = res[f"{o}_data"]
        assert tr.status == "fail" and set(tr.mismatch_classes) == {"layout_transposition"}
        assert tr.mismatch_classes["layout_transposition"] == tr.n_mismatch > 0


def test_transposed_data_and_untransposed_scales():
    x, g = _golden(Q("fp8_block"), (128, 128))
    cand = _clone(g)
    cand.rowwise_data = g.rowwise_data.t().contiguous()
    assert _by_name(compare_quantized(g, cand, x))["rowwise_data"].mismatch_classes.keys() == {"layout_transposition"}
    x, g = _golden(Q("fp8_block"), (64, 256))
    assert g.rowwise_scale.shape == (2, 64)  # NUMERICS: §4 1-D rowwise sinv stored [kb, m]
    cand = _clone(g)
    cand.rowwise_scale = torch.zeros(64, 4)
    cand.rowwise_scale[:, :2] = g.rowwise_scale.t()
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.mismatch_classes == {"layout_transposition": tr.n}


def test_wrong_dtype_is_reported():
    x, g = _golden(Q("mxfp8"), (64, 96))
    cand = _clone(g)
    cand.rowwise_scale = casts.e8m0_decode(g.rowwise_scale)  # decoded floats instead of E8M0 bytes
    tr = _by_name(compare_quantized(g, cand, x))["rowwise_scale"]
    assert tr.status == "fail" and "dtype" in tr.detail


def test_missing_field_and_wrong_shape():
    x, g = _golden(Q("mxfp8"), (64, 96))
    cand = _clone(g)
    cand.colwise_scale = None
    cand.rowwise_data = g.rowwise_data[:, :64].clone()
    res = _by_name(compare_quantized(g, cand, x))
    assert res["colwise_scale"].status == "fail" and "no colwise_scale" in res["colwise_scale"].detail["reason"]
    assert res["rowwise_data"].mismatch_classes == {"other": 64 * 96}


def test_is_midpoint_known_values():
    y = torch.tensor([0.25, 0.75, 5.0, 2.5, 7.0, 1.0, 0.3, -1.25, 0.0])
    assert is_midpoint(y, E2M1).tolist() == [True, True, True, True, False, False, False, True, False]
    y = torch.tensor([464.0, 17.0, 19.0, 2.0**-10, 1.5 * 2.0**-9, 440.0, 432.0])
    assert is_midpoint(y, E4M3).tolist() == [False, True, True, True, True, False, True]  # 1.5*2^-9 ties to 0x02


# ---- metrics and ULP histograms ------------------------------------------------------------------


def test_metrics_known_vectors():
    m = metrics(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert m["max_abs"] == 1.0 and m["max_rel"] == pytest.approx(1 / 3)
    assert m["rmse"] == pytest.approx(math.sqrt(1 / 3))
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(14.0))
    assert metrics(torch.ones(4), torch.ones(4))["sqnr_db"] == math.inf
    assert metrics(torch.ones(2), torch.zeros(2))["sqnr_db"] == -math.inf
    assert metrics(torch.tensor([1.0, 0.5]), torch.tensor([0.0, 0.5]))["max_rel"] == 0.0  # truth 0 skipped


def test_metrics_non_finite_are_counted_not_raised():
    nan, inf = float("nan"), float("inf")
    a = torch.tensor([1.0, nan, inf, 2.0, -inf, nan])
    t = torch.tensor([1.0, nan, inf, 3.0, inf, 0.0])
    m = metrics(a, t)
    assert m["n"] == 6 and m["n_nonfinite"] == 4 and m["n_nonfinite_mismatch"] == 2
    assert m["max_abs"] == 1.0 and m["sqnr_db"] == pytest.approx(10 * math.log10(10.0))
    m = metrics(torch.tensor([nan]), torch.tensor([1.0]))
    assert math.isnan(m["max_abs"]) and m["n_nonfinite_mismatch"] == 1


def test_ulp_histograms():
    g = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.bfloat16)
    up = lambda v, n: torch.tensor(v, dtype=torch.bfloat16).view(torch.int16) + n  # noqa: E731
    c = torch.stack([
        torch.tensor(1.0, dtype=torch.bfloat16), up(1.0, 1).view(torch.bfloat16), torch.tensor(-0.0, dtype=torch.bfloat16),
        up(1.0, 3).view(torch.bfloat16), up(1.0, 40).view(torch.bfloat16), torch.tensor(float("nan"), dtype=torch.bfloat16),
    ])
    h = ulp_hist_float(g, c)
    assert h == {"0": 1, "0*": 1, "1": 1, "2": 0, "3-4": 1, "5-16": 0, "17+": 1, "nan": 1}
    codes_g = torch.tensor([0x38, 0x38, 0x00, 0x7F, 0xB8], dtype=torch.uint8)
    codes_c = torch.tensor([0x38, 0x39, 0x80, 0xFF, 0x36], dtype=torch.uint8)
    h = ulp_hist_codes(codes_g, codes_c, E4M3)
    assert h["0"] == 1 and h["1"] == 1 and h["0*"] == 1 and h["nan"] == 1 and h["17+"] == 1


# ---- outputs: dequantized and GEMM ---------------------------------------------------------------


def test_compare_output_exact():
    g = torch.randn(16, 16).to(torch.bfloat16)
    assert compare_output(g, g.clone()).status == "pass"
    c = g.clone()
    c[3, 4] = torch.nextafter(c[3, 4].float(), torch.tensor(100.0)).to(torch.bfloat16)
    c.view(torch.int16)[3, 4] = g.view(torch.int16)[3, 4] + 1
    tr = compare_output(g, c)
    assert tr.status == "fail" and tr.n_mismatch == 1 and tr.first_mismatch["index"] == [3, 4]
    assert tr.first_mismatch["ulps"] == 1 and tr.ulp_hist["1"] == 1
    tr = compare_output(g, g.t().contiguous())
    assert tr.mismatch_classes == {"layout_transposition": tr.n_mismatch}
    assert compare_output(g, g.float()).status == "fail"  # a different dtype is a failure


def _gemm_case(cfg, layout, out="bfloat16", dist="normal", b_cfg=None, shape=(64, 96, 256)):
    case = Case("gemm", cfg, shape, "bfloat16", dist, 1, layout=layout, out_dtype=out, b_config=b_cfg, bias=True)
    d = generate(case)
    ca, cb = case.consumed
    qa = reference.quantize(d["a"], case.config, rowwise=ca == "rowwise", colwise=ca == "colwise")
    qb = reference.quantize(d["b"], case.b_config, rowwise=cb == "rowwise", colwise=cb == "colwise")
    return case, d, qa, qb


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize(
    "cfg, b_cfg",
    [(Q("fp8_current"), None), (Q("mxfp8"), None), (Q("fp8_block"), Q("fp8_block", tile=(128, 128))), (Q("nvfp4"), None)],
    ids=lambda v: v.id if isinstance(v, QuantConfig) else "same",
)
def test_compare_gemm_tolerance_accepts_another_accumulation_order(cfg, b_cfg, layout):
    case, d, qa, qb = _gemm_case(cfg, layout, b_cfg=b_cfg)
    golden = reference.gemm(qa, qb, layout=layout, out_dtype=torch.bfloat16, bias=d["bias"])
    ca, cb = case.consumed
    a = reference.dequantize(qa, ca, torch.float32)
    b = reference.dequantize(qb, cb, torch.float32)
    y = {"TN": lambda: a @ b.t(), "NN": lambda: a @ b, "NT": lambda: a.t() @ b}[layout]()  # fp32 accumulation
    cand = (y + d["bias"].float()).to(torch.bfloat16)
    tr = compare_gemm(golden, cand, None, case, False, a=qa, b=qb, bias=d["bias"])
    assert tr.status == "pass", tr.first_mismatch
    assert tr.detail["mode"] == "tolerance" and tr.detail["max_bound"] > 0
    s = {"TN": lambda: a.abs() @ b.abs().t(), "NN": lambda: a.abs() @ b.abs(), "NT": lambda: a.abs().t() @ b.abs()}[layout]()
    bad = cand.clone()
    bad[5, 7] = (golden[5, 7].float() + s[5, 7] / 4).to(torch.bfloat16)  # far outside any accumulation error
    tr = compare_gemm(golden, bad, None, case, False, a=qa, b=qb)
    assert tr.status == "fail" and tr.n_mismatch == 1 and tr.first_mismatch["index"] == [5, 7]
    assert tr.first_mismatch["bound"] < abs(float(bad[5, 7]) - float(golden[5, 7]))


def test_compare_gemm_exact_and_truth_metrics():
    case, d, qa, qb = _gemm_case(Q("mxfp8"), "TN", dist="exact_representable", out="float32")
    golden = reference.gemm(qa, qb, layout="TN", out_dtype=torch.float32, bias=d["bias"])
    truth = d["a"].double() @ d["b"].double().t() + d["bias"].double()
    tr = compare_gemm(golden, golden.clone(), truth, case, True)
    assert tr.status == "pass" and tr.detail["mode"] == "exact"
    assert tr.detail["candidate_vs_truth"]["max_abs"] == 0.0  # exact-representable: no error at all
    c = golden.clone()
    c.view(torch.int32)[1, 2] += 1
    tr = compare_gemm(golden, c, truth, case, True)
    assert tr.status == "fail" and tr.first_mismatch["index"] == [1, 2] and tr.first_mismatch["ulps"] == 1


def test_compare_gemm_needs_operands_in_tolerance_mode():
    case, d, qa, qb = _gemm_case(Q("mxfp8"), "TN")
    golden = reference.gemm(qa, qb, layout="TN", out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="consumed operands"):
        compare_gemm(golden, golden, None, case, False)


def test_float_output_nan_payload_and_sign_are_not_part_of_the_contract():
    nan_pos = torch.tensor([float("nan"), 1.0, 2.0])
    other_nan = torch.tensor([1.0, 1.0, 2.0]).view(torch.int32)
    other_nan[0] = -4194304 + 5  # 0xFFC00005: a negative NaN with a payload
    cand = other_nan.view(torch.float32)
    assert torch.isnan(cand[0])
    tr = compare_output(nan_pos, cand)
    assert tr.status == "pass" and tr.n_mismatch == 0
    # ...but NaN against a number is a mismatch, located.
    tr = compare_output(nan_pos, torch.tensor([0.0, 1.0, 2.0]))
    assert tr.status == "fail" and tr.n_mismatch == 1 and tr.first_mismatch["index"] == [0]
