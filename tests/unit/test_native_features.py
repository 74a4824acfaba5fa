"""The host-side logic of native's issue-17 features, on the CPU: grouped offsets and seeds, the supports answers,
and the spec checks that run before any kernel (a given amax, grouped splits).

Source: docs/numerics.md §12.1 (grouped: rows o_g .. o_g + s_g - 1, seed (seed, stream + 2g)), §5.1 / §1 (a given
amax), §5.7 (SR on 16x16 tiles is no longer refused). The device results are tests/gpu/test_native_features.py.
"""

from __future__ import annotations

import pytest
import torch

import native
import reference
from harness.backends import NativeBackend
from native import grouped
from native.modules import modules_for
from reference import grouped as ref_grouped
from reference.formats import QuantConfig
from reference.types import SpecViolation, SRSeed


def test_group_rows_are_the_prefix_sums_of_the_splits():
    assert grouped.group_rows([0, 48, 16, 0, 144]) == [(0, 0), (0, 48), (48, 16), (64, 0), (64, 144)]
    assert grouped.group_rows([32]) == [(0, 32)]


def test_group_seed_adds_two_streams_per_group_mod_2_32():
    """docs/numerics.md §12.1: group g uses (seed, stream + 2g); hand-checked, wrapping at 2^32."""
    s = SRSeed(0xDEADBEEF12345678, 7)
    assert grouped.group_seed(s, 0) == SRSeed(0xDEADBEEF12345678, 7)
    assert grouped.group_seed(s, 3) == SRSeed(0xDEADBEEF12345678, 13)
    assert grouped.group_seed(SRSeed(1, 0xFFFFFFFE), 1) == SRSeed(1, 0)
    assert grouped.group_seed(SRSeed(1, 0xFFFFFFFE), 2) == SRSeed(1, 2)
    assert grouped.group_seed((5, 1), 4) == SRSeed(5, 9)
    assert grouped.group_seed(9, 1) == SRSeed(9, 2)  # an int seed has stream 0
    assert grouped.group_seed(None, 3) is None
    for g in range(6):  # the reference's own rule, an independent spelling of the same contract
        assert grouped.group_seed(s, g) == ref_grouped.group_rng(s, g)


@pytest.mark.parametrize("splits", [[16, 16], [32, 8, 24], [-16, 80], [], [True, 63]],
                         ids=["sum", "tile", "negative", "empty", "bool"])
def test_grouped_rejects_bad_splits_before_any_kernel_as_the_reference_does(splits):
    x = torch.randn(64, 32)
    with pytest.raises(SpecViolation) as gold:
        ref_grouped.quantize(x, QuantConfig("nvfp4"), splits)
    with pytest.raises(SpecViolation) as cand:
        grouped.quantize(x, QuantConfig("nvfp4"), splits)
    assert str(cand.value) == str(gold.value)


def test_grouped_rejects_a_scheme_without_groups_and_a_cpu_tensor():
    with pytest.raises(SpecViolation, match="grouped quantization exists for"):
        grouped.quantize(torch.randn(64, 32), QuantConfig("fp8_current"), [64])
    with pytest.raises(SpecViolation, match="native backend quantizes CUDA tensors"):
        grouped.quantize(torch.randn(64, 32), QuantConfig("mxfp8"), [32, 32])
    with pytest.raises(SpecViolation, match="must be a torch.Tensor"):
        grouped.quantize([[1.0]], QuantConfig("mxfp8"), [1])


def test_supports_grouped_as_quantize():
    """Grouped runs the quantize kernels: the same answer (a scheme without groups is splits_rule's SpecViolation,
    as in the reference backend, which supports every op)."""
    for cfg in (QuantConfig("mxfp8"), QuantConfig("nvfp4", rht=True), QuantConfig("fp8_block")):
        assert native.supports("grouped_quantize", cfg, "cpu") == native.supports("quantize", cfg, "cpu")
        ok, why = native.supports("grouped_quantize", cfg, "cpu")
        assert not ok and why == "native kernels need a CUDA device, got cpu"


def test_supports_no_longer_refuses_sr_on_16x16_tiles():
    """docs/numerics.md §5.7: the 16x16 SR copies follow the contract; the only refusal left on a CPU machine is
    the device's."""
    ok, why = native.supports("quantize", QuantConfig("nvfp4", tile=(16, 16), stochastic=True), "cpu")
    assert not ok and why == "native kernels need a CUDA device, got cpu"


@pytest.mark.parametrize("bad", [torch.tensor([-1.0]), torch.tensor([float("nan")]), torch.zeros(2), 2.0],
                         ids=["neg", "nan", "shape", "float"])
def test_native_checks_a_given_amax_as_the_reference_does(bad):
    x = torch.randn(32, 32)
    for cfg in (QuantConfig("nvfp4"), QuantConfig("fp8_current"), QuantConfig("mxfp8"),
                QuantConfig("nvfp4", rht=True)):
        xx = x.to(torch.bfloat16) if cfg.rht else x
        with pytest.raises(SpecViolation) as gold:
            reference.quantize(xx, cfg, amax=bad)
        with pytest.raises(SpecViolation) as cand:
            native.quantize(xx, cfg, amax=bad)
        assert str(cand.value) == str(gold.value)


def test_a_valid_given_amax_reaches_the_device_check():
    """A given amax is no longer Unsupported: a CPU x is refused only because native needs CUDA tensors."""
    with pytest.raises(SpecViolation, match="native backend quantizes CUDA tensors"):
        native.quantize(torch.randn(32, 32), QuantConfig("nvfp4"), amax=torch.tensor([3.0]))


def test_modules_for_grouped_are_the_quantize_modules():
    for cfg in (QuantConfig("mxfp8"), QuantConfig("nvfp4", stochastic=True)):
        assert modules_for("grouped_quantize", cfg) == modules_for("quantize", cfg)


def test_native_backend_has_grouped_quantize_and_refuses_the_cpu():
    b = NativeBackend()
    assert callable(b.grouped_quantize)
    ok, why = b.supports("grouped_quantize", QuantConfig("mxfp8"), "cpu")
    assert not ok and "CUDA" in why


# ---- GEMM epilogues (docs/numerics.md §12.2): the host-side descriptor choices and checks -------------------


def test_epilogue_names_map_to_cublaslt_with_b_as_cublas_a():
    """Our b is cuBLAS's A (native/cublaslt.py docstring): the bias gradient over b's [N, K] rows is BGRADA."""
    from native import cublaslt

    assert cublaslt.EPILOGUE_NAMES == {"gelu_aux": "GELU_AUX", "dgelu": "DGELU", "bgradb": "BGRADA"}
    from reference.gemm import EPILOGUES

    assert set(cublaslt.EPILOGUE_NAMES) == set(EPILOGUES)


def test_epilogue_tensor_checks():
    from native.cublaslt import _check_epilogue

    out = torch.empty(4, 6, dtype=torch.bfloat16)
    aux = torch.empty(4, 6, dtype=torch.bfloat16)
    bgrad = torch.empty(6, dtype=torch.float32)
    bias = torch.empty(6, dtype=torch.bfloat16)
    assert _check_epilogue(None, out, bias, None, None) is None
    assert _check_epilogue("gelu_aux", out, bias, aux, None) == ("gelu_aux", aux, None)
    assert _check_epilogue("dgelu", out, None, aux, None) == ("dgelu", aux, None)
    assert _check_epilogue("bgradb", out, None, None, bgrad) == ("bgradb", None, bgrad)
    bad = [
        (None, None, aux, None, "pass epilogue="),
        ("relu", None, None, None, "is invalid"),
        ("gelu_aux", None, None, None, "needs a contiguous"),
        ("gelu_aux", None, aux.t(), None, "needs a contiguous"),  # [6, 4]
        ("dgelu", None, aux.to(torch.float16), None, "needs a contiguous"),
        ("dgelu", bias, aux, None, "takes no bias"),
        ("bgradb", None, None, torch.empty(4), "needs a contiguous"),  # N = 6
        ("bgradb", bias, None, bgrad, "takes no bias"),
        ("bgradb", None, aux, bgrad, "takes no aux"),
        ("gelu_aux", None, aux, bgrad, "takes no bgrad"),
    ]
    for ep, b_, a_, g_, msg in bad:
        with pytest.raises(ValueError, match=msg):
            _check_epilogue(ep, out, b_, a_, g_)


def test_gemm_epilogue_spec_rules_before_any_device_work():
    from native.gemm import gemm_epilogue

    cfg = QuantConfig("fp8_current")
    a = reference.quantize(torch.randn(64, 32), cfg)
    b = reference.quantize(torch.randn(32, 32), cfg)
    for ep, kw, msg in (("relu", {}, "is invalid"), (None, {}, "is invalid"),
                        ("bgradb", {"bias": torch.zeros(32)}, "takes no bias input")):
        with pytest.raises(SpecViolation, match=msg):
            gemm_epilogue(a, b, epilogue=ep, **kw)


def test_native_backend_has_gemm_epilogue():
    assert callable(NativeBackend().gemm_epilogue)
