"""The shipped torchao adapters (harness/adapters/torchao.py): in-process against the golden under their
convention, and one real `python -m harness run` on a tiny case file with its pass/fail/skip counts.

Skips cleanly without torchao (the `[torchao]` extra); CI installs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness import runner
from harness.backends import asks_for_case, get_backend
from harness.cases import Case
from reference import QuantConfig, Unsupported, quantize
from reference.conventions import with_convention

pytest.importorskip("torchao")

from harness.adapters import torchao as adapters  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NAN, INF = float("nan"), float("inf")


def sample(dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g)
    x[3, 5], x[7, 1], x[9, :] = NAN, INF, 1e-39
    return x.to(dtype)


def same(a, b) -> bool:
    for f in a.TENSOR_FIELDS:
        u, v = getattr(a, f), getattr(b, f)
        if (u is None) != (v is None):
            return False
        if u is not None and not torch.equal(u.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)):
            return False
    return True


@pytest.mark.parametrize(
    "spec, config, convention",
    [
        ("mx", QuantConfig("mxfp8"), "torchao_rceil"),
        ("mx_floor", QuantConfig("mxfp8", element="e5m2"), "torchao_floor"),
        ("mx_ceil", QuantConfig("mxfp8"), "torchao_ceil"),
        ("mx_even", QuantConfig("mxfp8"), "torchao_even"),
        ("nvfp4", QuantConfig("nvfp4"), "torchao_nvfp4"),
        ("float8", QuantConfig("fp8_current", element="e5m2"), "torchao_float8"),
    ],
)
def test_adapter_equals_golden_under_its_convention(spec, config, convention):
    backend = get_backend(f"harness.adapters.torchao:{spec}")
    for dtype in (torch.float32, torch.bfloat16):
        x = sample(dtype)
        cand = backend.quantize(x, config, rowwise=True, colwise=True)
        assert same(cand, quantize(x, with_convention(config, convention), rowwise=True, colwise=True)), dtype
        # ...and not under te: the sample holds NaN, Inf and tiny blocks, where every torchao cast differs.
        assert not same(cand, quantize(x, config, rowwise=True, colwise=True)), dtype
        # A config naming the convention runs the same cast.
        assert same(cand, backend.quantize(x, with_convention(config, convention), rowwise=True, colwise=True))


def test_mx_mode_follows_the_case_convention():
    assert adapters.mx.mode_for(QuantConfig("mxfp8")) == "rceil"
    assert adapters.mx.mode_for(QuantConfig("mxfp8", convention="torchao_even")) == "even"
    assert adapters.mx_floor.mode_for(QuantConfig("mxfp8")) == "floor"
    # `mx` honours the case's e8m0 rule with torchao's matching mode; `mx_rceil` is RCEIL whatever the rule.
    assert adapters.mx.mode_for(QuantConfig("mxfp8", e8m0_rule="floor")) == "floor"
    assert adapters.mx_rceil.mode_for(QuantConfig("mxfp8", e8m0_rule="floor")) == "rceil"
    assert adapters.mx.conventions == ("torchao_rceil", "torchao_floor")
    assert adapters.mx_even.conventions == ("torchao_even",)
    assert (adapters.nvfp4.conventions, adapters.float8.conventions) == (("torchao_nvfp4",), ("torchao_float8",))


def test_mx_under_the_floor_rule_is_te_floor_on_normal_blocks():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    cfg = QuantConfig("mxfp8", e8m0_rule="floor")
    assert same(adapters.mx.quantize(x, cfg, rowwise=True, colwise=True), quantize(x, cfg, rowwise=True, colwise=True))
    # RCEIL on the same case is another rule: the scales differ.
    assert not same(adapters.mx_rceil.quantize(x, cfg), quantize(x, cfg))


def test_mx_refuses_a_rule_torchao_has_no_mode_for(monkeypatch):
    monkeypatch.setattr(adapters, "RULE_MODES", {"ceil": "rceil"})
    case = Case("quantize", QuantConfig("mxfp8", e8m0_rule="floor"), (64, 128))
    assert adapters.mx.supports(case, "cpu") == (
        False, "torchao_mx: torchao 0.18 has no ScaleCalculationMode for e8m0_rule=floor")
    # A fixed-mode object runs it (and the report says which field it ignored).
    assert adapters.mx_rceil.supports(case, "cpu") == (True, "")


@pytest.mark.parametrize("spec, dist, expected", [
    ("mx_rceil", "normal", ("convention", "torchao_rceil", "bit-exact under torchao_rceil: the candidate ignored "
                                                           "e8m0_rule=floor")),
    ("mx", "normal", ("exact", "", None)),
    ("mx", "special", ("convention", "torchao_floor", "bit-exact under torchao_floor; ")),
])
def test_the_e8m0_rule_of_the_case_through_the_harness(spec, dist, expected):
    """`mx` runs a floor case with torchao's FLOOR (exact on normal blocks, torchao_floor on special
    ones); `mx_rceil` ignores the rule, and the report says so."""
    case = Case("quantize", QuantConfig("mxfp8", e8m0_rule="floor"), (64, 128), "float32", dist, 0, "rowwise")
    rows = runner.run_case(case, get_backend(f"harness.adapters.torchao:{spec}"), "cpu")
    sev, conv, note = expected
    assert {r["severity"] for r in rows} == {sev} and {r["matches_convention"] for r in rows} == {conv}
    if note:
        assert next(r for r in rows if r["status"] == "fail")["reason"].startswith(note)


def test_supports_takes_the_case_and_unsupported():
    mx, nv, f8 = adapters.mx, adapters.nvfp4, adapters.float8
    assert asks_for_case(mx) and asks_for_case(nv) and asks_for_case(f8)

    def case(config, op="quantize", in_dtype="bfloat16"):
        return Case(op, config, (64, 128), in_dtype=in_dtype)

    assert mx.supports(case(QuantConfig("mxfp8")), "cpu") == (True, "")
    ok, why = mx.supports(case(QuantConfig("mxfp8", tile=(32, 32))), "cpu")
    assert not ok and "1x32 mxfp8 only" in why
    ok, why = mx.supports(case(QuantConfig("mxfp8"), op="dequantize"), "cpu")
    assert (ok, why) == (False, "torchao_mx: only quantize is adapted (torchao's dequantize is not)")
    ok, why = mx.supports(case(QuantConfig("mxfp8", e8m0_rule="floor", convention="ocp_mx")), "cpu")
    assert not ok and "not ocp_mx" in why
    ok, why = nv.supports(case(QuantConfig("nvfp4", rht=True)), "cpu")
    assert not ok and "no RHT" in why
    ok, why = f8.supports(case(QuantConfig("fp8_current", pow2_scales=True)), "cpu")
    assert not ok and "no pow2" in why
    # float16 input: refused by the MX and NVFP4 casts from the case alone, taken by float8's.
    for be, cfg in ((mx, QuantConfig("mxfp8")), (nv, QuantConfig("nvfp4"))):
        assert be.supports(case(cfg, in_dtype="float16"), "cpu") == (
            False, f"{be.name}: torchao's cast takes float32 or bfloat16 input, not float16")
    assert f8.supports(case(QuantConfig("fp8_current"), in_dtype="float16"), "cpu") == (True, "")
    # A direct caller gets the same refusals at call time.
    with pytest.raises(Unsupported, match="float32 or bfloat16 input, not torch.float16"):
        mx.quantize(torch.zeros(32, 32, dtype=torch.float16), QuantConfig("mxfp8"))
    with pytest.raises(Unsupported, match="1x16, round-to-nearest"):
        nv.quantize(torch.zeros(16, 16), QuantConfig("nvfp4", tile=(16, 16)))
    assert f8.package == "torchao" and f8.package_version == adapters.version() is not None


def test_missing_torchao_is_a_clear_skip(monkeypatch):
    monkeypatch.setattr(adapters, "version", lambda: None)
    ok, why = adapters.nvfp4.supports(Case("quantize", QuantConfig("nvfp4"), (64, 128)), "cpu")
    assert not ok and "pip install 'numerics-harness[torchao]'" in why


def test_extra_keeps_torchao_scales():
    q = adapters.float8.quantize(torch.tensor([[3.0, -1.0]]), QuantConfig("fp8_current"))
    s = q.extra["torchao"]["scale"]
    assert torch.equal(q.rowwise_scale, torch.reciprocal(s.reshape(1)))


CASES = """
tier = "adapters"

[[grid]]
scheme = "mxfp8"
element = "e4m3"
orientation = "rowwise"
in_dtype = "float32"
shape = [[256, 128]]
distribution = ["normal", "special"]

[[grid]]
scheme = "mxfp8"
in_dtype = "float16"
shape = [[64, 96]]

[[grid]]
scheme = "nvfp4"
shape = [[64, 128]]
"""


def test_mx_adapter_through_harness_run(tmp_path):
    cases = tmp_path / "adapters.toml"
    cases.write_text(CASES)
    out = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMERICS_HARNESS_PROGRESS": "0"}
    p = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--cases", str(cases), "--backend", "harness.adapters.torchao:mx",
         "--device", "cpu", "--out", str(out), "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert "pass 1, fail 1, skip 2, error 0" in p.stdout, p.stdout + p.stderr
    df = pd.read_csv(out / "results.csv")
    status = df.groupby("case_id").status.first().to_dict()
    assert status == {
        "quantize-mxfp8-e4m3-1x32-rowwise-f32-256x128-normal-s0": "pass",
        "quantize-mxfp8-e4m3-1x32-rowwise-f32-256x128-special-s0": "fail",
        "quantize-mxfp8-e4m3-1x32-rowwise-f16-64x96-normal-s0": "skip",
        "quantize-nvfp4-e2m1-1x16-rowwise-bf16-64x128-normal-s0": "skip",
    }
    skips = df[df.status == "skip"]
    assert set(skips.reason) == {
        "torchao_mx: torchao's cast takes float32 or bfloat16 input, not float16",
        "torchao_mx: torchao's MX cast is 1x32 mxfp8 only, not nvfp4-e2m1-1x16",
    }
    # Refused from the case alone: no input was drawn and the golden never ran for the skips.
    assert skips.golden_ms.isna().all() and skips.inputs_ms.isna().all()
    assert df[df.status != "skip"].golden_ms.notna().all()
    # `list --backend` gives the same answer as `run`, case by case.
    p = subprocess.run(
        [sys.executable, "-m", "harness", "list", "--cases", str(cases), "--backend", "harness.adapters.torchao:mx"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    listed = dict(line.split() for line in p.stdout.splitlines() if line.startswith("quantize-"))
    assert listed == {k: "torchao_mx:" + ("skip" if v == "skip" else "yes") for k, v in status.items()}, p.stdout
    # The special-value case fails on a NaN block: torchao writes scale 0xFF where te ignores the NaN.
    fail = df[(df.status == "fail") & (df.tensor == "rowwise_scale")].first_mismatch.iloc[0]
    assert '"candidate":"0xFF"' in fail


# ---- the example adapters of real libraries (examples/*_adapter.py): skipped without the library ----------


def _library_case(spec, case):
    rows = runner.run_case(case, get_backend(f"{ROOT}/examples/{spec}"), "cpu")
    return {r["tensor"]: r for r in rows if r["status"] in ("pass", "fail", "error")}


def test_modelopt_adapter_known_findings():
    pytest.importorskip("modelopt.torch.quantization.qtensor", reason="nvidia-modelopt 0.47 is not installed")
    ok = _library_case("modelopt_adapter.py:backend",
                       Case("quantize", QuantConfig("nvfp4"), (256, 256), "bfloat16", "normal", 0, "both"))
    assert {r["severity"] for r in ok.values()} == {"exact"}
    # A scale computed in bf16 from a bf16 input (amax / 448 in the input dtype): not exact.
    bf16 = _library_case("modelopt_adapter.py:backend",
                         Case("quantize", QuantConfig("fp8_current"), (1024, 16), "bfloat16", "uniform", 0, "rowwise"))
    assert bf16["rowwise_scale"]["status"] == "fail" and bf16["rowwise_scale"]["severity"] != "exact"
    # Inf/NaN input: ModelOpt's scale goes non-finite, the codes NaN.
    special = _library_case("modelopt_adapter.py:backend",
                            Case("quantize", QuantConfig("fp8_current"), (256, 96), "float32", "special", 0, "rowwise"))
    assert special["rowwise_scale"]["severity"] == "broken"
    # named by the cause catalogue (numerics.md §13): the NaN input propagates through the amax into the scale
    assert special["rowwise_scale"]["mismatch_classes"] == {"nan_propagated": 1}
    assert "cause: nan_propagated explains 1" in special["rowwise_scale"]["reason"]


def test_compressed_tensors_adapter_known_findings():
    pytest.importorskip("compressed_tensors", reason="compressed-tensors 0.20 is not installed")
    ok = _library_case("compressed_tensors_adapter.py:backend",
                       Case("quantize", QuantConfig("mxfp8"), (256, 256), "float32", "normal", 0, "both"))
    assert {r["severity"] for r in ok.values()} == {"exact"}
    bf16 = _library_case("compressed_tensors_adapter.py:backend",
                         Case("quantize", QuantConfig("fp8_current"), (1024, 16), "bfloat16", "uniform", 0, "rowwise"))
    assert bf16["rowwise_scale"]["severity"] != "exact"
    # A block whose amax is exactly 448 * 2^k gets exponent 127 + k + 1 (TE: 127 + k).
    backend = get_backend(f"{ROOT}/examples/compressed_tensors_adapter.py:backend")
    x = torch.zeros(32, 64)
    x[0, 3], x[0, 40] = 448.0, 448.0 * 4
    assert backend.quantize(x, QuantConfig("mxfp8")).rowwise_scale[0, :2].tolist() == [128, 130]
    assert quantize(x, QuantConfig("mxfp8")).rowwise_scale[0, :2].tolist() == [127, 129]


def test_fouroversix_adapter_known_findings():
    pytest.importorskip("fouroversix", reason="fouroversix 1.0.5 is not installed")
    ok = _library_case("fouroversix_adapter.py:backend",
                       Case("quantize", QuantConfig("nvfp4"), (128, 128), "bfloat16", "normal", 0, "both"))
    assert {r["severity"] for r in ok.values()} == {"exact"}
    # Blocks whose E4M3 scale is 0 (tiny blocks): the contract saturates codes to +-6 (0x7 / 0xF),
    # fouroversix writes zeros. The scales agree; the data row fails.
    tiny = _library_case("fouroversix_adapter.py:backend",
                         Case("quantize", QuantConfig("nvfp4"), (32, 512), "float32", "per_tile_scales", 0, "rowwise"))
    assert tiny["rowwise_scale"]["status"] == "pass" and tiny["rowwise_data"]["status"] == "fail"
