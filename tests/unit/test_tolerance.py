"""harness.tolerance: the (scheme, op, out_dtype) table, its KeyError, and the GEMM bound.

The bound must hold for every legitimate accumulation (fp32 in another order, the reference's
other methods, an emulated 14-bit tensor-core accumulator) and follow the documented formula.
"""

from __future__ import annotations

import math

import pytest
import torch

import reference
from harness import tolerance as T
from harness.cases import Case
from harness.inputs import generate
from reference.formats import SCHEME_NAMES, QuantConfig

Q = QuantConfig
U32 = 2.0**-24


def test_every_scheme_and_out_dtype_has_a_gemm_row():
    for scheme in SCHEME_NAMES:
        for out in ("bfloat16", "float32", "float16"):
            assert isinstance(T.lookup(scheme, "gemm", out), T.GemmTolerance)


@pytest.mark.parametrize("key", [("nvfp4", "gemm", "float64"), ("mxfp8", "quantize", "bfloat16"), ("mxfp9", "gemm", "float32")])
def test_missing_key_raises_key_error_naming_it(key):
    with pytest.raises(KeyError) as e:
        T.lookup(*key)
    assert repr(key) in str(e.value)


def test_unit_roundoffs():
    assert T.unit_roundoff("bfloat16") == (2.0**-8, 2.0**-133)
    assert T.unit_roundoff("float16") == (2.0**-11, 2.0**-24)
    assert T.unit_roundoff("float32") == (2.0**-24, 2.0**-149)
    assert T.U32 == U32


def test_bound_follows_the_documented_formula():
    case = Case("gemm", Q("mxfp8"), (32, 32, 64), out_dtype="float32", layout="TN")
    a = torch.ones(32, 64)
    b = torch.full((32, 64), 0.5)
    golden = torch.full((32, 32), 32.0)
    s, k = 32.0, 64
    gamma = (k * U32 + 1 * U32 + 6 * U32) + (1 * U32 + 6 * U32)  # fp32 accumulation, one golden block
    want = 2 * (gamma * s + U32 * 2 * 32.0) + 2 * 2.0**-149
    got = T.gemm_bound(case, a, b, golden)
    assert got.shape == (32, 32) and got.dtype == torch.float64
    assert torch.allclose(got, torch.full_like(got, want), rtol=1e-12, atol=0)
    acc = T.gemm_bound(Case("gemm", Q("mxfp8"), (32, 32, 64), out_dtype="float32", accumulate=True), a, b, golden)
    assert float(acc[0, 0]) == pytest.approx(want + 2 * U32 * s)


def test_bound_grows_with_k_output_precision_and_fast_accumulation():
    def bound(scheme, layout, k, out):
        case = Case("gemm", Q(scheme), (32, 32, k), out_dtype=out, layout=layout)
        shapes = case.operand_shapes
        return float(T.gemm_bound(case, torch.ones(shapes["a"]), torch.ones(shapes["b"]), torch.zeros(32, 32))[0, 0])

    assert bound("mxfp8", "TN", 1024, "float32") > bound("mxfp8", "TN", 256, "float32")
    assert bound("mxfp8", "TN", 256, "bfloat16") == bound("mxfp8", "TN", 256, "float32")  # |y_g| = 0 here
    # Hopper FP8 fast accumulation (fprop, TN) is looser than the split accumulator (NN/NT).
    assert bound("fp8_current", "TN", 1024, "float32") > 4 * bound("fp8_current", "NN", 1024, "float32")
    assert bound("fp8_block", "TN", 1024, "float32") == bound("fp8_block", "NT", 1024, "float32")


def _emulated_tensor_core(a_kl: torch.Tensor, b_kl: torch.Tensor, chunk: int | None, bits: int = 14) -> torch.Tensor:
    """Sequential accumulation keeping `bits` significant bits, promoted to fp32 every `chunk` terms."""
    k = a_kl.shape[1]
    acc32 = torch.zeros(a_kl.shape[0], b_kl.shape[0], dtype=torch.float32)
    part = torch.zeros_like(acc32, dtype=torch.float64)
    for i in range(k):
        part = part + a_kl[:, i : i + 1].double() * b_kl[:, i].double().unsqueeze(0)
        m, e = torch.frexp(part)
        part = torch.ldexp(torch.round(m * 2.0**bits) / 2.0**bits, e)  # RN to `bits` significant bits
        if chunk is not None and (i + 1) % chunk == 0:
            acc32 = (acc32.double() + part).float()
            part = torch.zeros_like(part)
    return (acc32.double() + part).float()


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("scheme", ["fp8_current", "fp8_block"])
def test_bound_holds_for_an_emulated_hopper_accumulator(scheme, layout):
    cfg = Q(scheme)
    case = Case("gemm", cfg, (32, 32, 512), "bfloat16", "heavy_tail", 2, layout=layout, out_dtype="float32")
    d = generate(case)
    ca, cb = case.consumed
    qa = reference.quantize(d["a"], cfg, rowwise=ca == "rowwise", colwise=ca == "colwise")
    qb = reference.quantize(d["b"], cfg, rowwise=cb == "rowwise", colwise=cb == "colwise")
    golden = reference.gemm(qa, qb, layout=layout, out_dtype=torch.float32)
    a = reference.dequantize(qa, ca, torch.float32)
    b = reference.dequantize(qb, cb, torch.float32)
    a_kl = a if ca == "rowwise" else a.t()
    b_kl = b if layout == "TN" else b.t()
    chunk = T.lookup(scheme, "gemm", "float32").chunk[layout]
    cand = _emulated_tensor_core(a_kl, b_kl, chunk)
    bound = T.gemm_bound(case, qa, qb, golden)
    err = (cand.double() - golden.double()).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float(err.max()) > 0  # the emulation really differs from the golden


@pytest.mark.parametrize("out", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize(
    "a_cfg, b_cfg, method",
    [(Q("fp8_block"), Q("fp8_block", tile=(128, 128)), "exact"), (Q("mxfp8"), Q("mxfp8", tile=(32, 32)), "exact"),
     (Q("nvfp4"), Q("nvfp4"), "exact"), (Q("fp8_delayed"), Q("fp8_delayed", element="e5m2"), "exact")],
    ids=lambda v: v.id if isinstance(v, QuantConfig) else v,
)
def test_bound_holds_between_reference_methods(a_cfg, b_cfg, method, layout, out):
    case = Case("gemm", a_cfg, (64, 32, 320 if a_cfg.scheme != "mxfp8" and a_cfg.scheme != "nvfp4" else 256),
                "bfloat16", "outliers", 1, layout=layout, b_config=b_cfg, out_dtype=out, accumulate=True, bias=True)
    d = generate(case)
    ca, cb = case.consumed
    qa = reference.quantize(d["a"], a_cfg, rowwise=ca == "rowwise", colwise=ca == "colwise")
    qb = reference.quantize(d["b"], b_cfg, rowwise=cb == "rowwise", colwise=cb == "colwise")
    dt = getattr(torch, out)
    golden = reference.gemm(qa, qb, layout=layout, out_dtype=dt, bias=d["bias"], c=d["c"])
    other = reference.gemm(qa, qb, layout=layout, out_dtype=dt, bias=d["bias"], c=d["c"], method=method)
    bound = T.gemm_bound(case, qa, qb, golden, bias=d["bias"], c=d["c"])
    g64, o64 = golden.double(), other.double()
    fin = torch.isfinite(g64) & torch.isfinite(o64)
    assert torch.equal(g64[~fin], o64[~fin])  # float16 overflow: both sides give the same inf
    assert bool(((o64 - g64).abs()[fin] <= bound[fin]).all())
    assert math.isfinite(float(bound.max()))
