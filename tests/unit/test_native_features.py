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
from reference.layouts import copy_geometry
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


# ---- a given amax: the launch sequence, recorded on the CPU (no kernel runs) ----------------------------------


def _arg(kernel: str, args, name: str):
    from native.kernels import signature

    names = [p.name for p in signature(kernel).params]
    assert len(args) == len(names), f"{kernel}: {len(args)} arguments for {names}"
    return args[names.index(name)]


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
def test_nvfp4_given_amax_launches_only_the_quantize_kernel(tile):
    """docs/numerics.md §5.1: with a given amax there is no amax pass (X is read once, by the quantize kernel),
    both copies' A_g slots hold it; a shape whose scales have padding adds nvfp4_scale_padding after the quantize
    kernel (§5.9: it zeroes the padding of both scale tensors, by their padded extents; no torch.zeros and no clear),
    a shape without none."""
    from native import nvfp4

    calls = []

    def record(name, n_units, args, max_blocks=None, units_per_block=None):
        calls.append((name, list(args)))

    cfg = QuantConfig("nvfp4", tile=tile)
    x = torch.randn(48, 80).to(torch.bfloat16)
    fields = nvfp4.quantize_with(record, x, cfg, rowwise=True, colwise=True, seed=None,
                                 given=torch.tensor(7.5))  # fmt: skip
    assert [c[0] for c in calls] == ["nvfp4_quantize_bf16", "nvfp4_scale_padding"]
    args = calls[0][1]
    row_amax, col_amax = _arg(calls[0][0], args, "row_amax"), _arg(calls[0][0], args, "col_amax")
    assert row_amax.tolist() == [7.5] and col_amax.tolist() == [7.5]
    assert fields["rowwise_amax"] is row_amax and fields["colwise_amax"] is col_amax
    pad = calls[1][1]
    for o in ("rowwise", "colwise"):
        scale = fields[f"{o}_scale"]
        assert _arg(calls[0][0], args, f"{o[:3]}_scale") is scale and _arg(calls[1][0], pad, f"{o[:3]}_scale") is scale
        padded = copy_geometry(cfg, o, 48, 80).scale_padded_shape
        assert tuple(scale.shape) == padded and padded[0] > (48 if o == "rowwise" else 80)  # rows of padding
        assert int(_arg(calls[1][0], pad, f"{o[:3]}_scale_rows")) == padded[0]
        assert int(_arg(calls[1][0], pad, f"{o[:3]}_stride")) == padded[1]
    assert (int(_arg(calls[1][0], pad, "m_rows")), int(_arg(calls[1][0], pad, "k_cols"))) == (48, 80)
    calls.clear()
    nvfp4.quantize_with(record, x, cfg, rowwise=True, colwise=False, seed=None)
    assert [c[0] for c in calls] == ["nvfp4_amax_bf16", "nvfp4_quantize_bf16", "nvfp4_scale_padding"]  # amax pass
    assert calls[2][1][3] is None  # (no columnwise copy: a null scale, which the kernel skips)
    calls.clear()
    nvfp4.quantize_with(record, torch.randn(128, 128).to(torch.bfloat16), cfg, rowwise=True, colwise=True, seed=None,
                        given=torch.tensor(7.5))  # fmt: skip
    assert [c[0] for c in calls] == ["nvfp4_quantize_bf16"]  # [128, 8] scales both: no padding, no launch
    with pytest.raises(SpecViolation, match="RHT"):
        nvfp4.quantize_with(record, x, QuantConfig("nvfp4", rht=True), rowwise=True, colwise=True, seed=None,
                            given=torch.tensor([1.0]))  # fmt: skip


def test_fp8_current_given_amax_feeds_the_cast_kernel(monkeypatch):
    """docs/numerics.md §1: the cast kernel's amax_in holds the given amax; tensor_amax is not launched; both copies
    report it."""
    from native import per_tensor

    calls = []
    monkeypatch.setattr(per_tensor, "module_for", lambda *a: "module")
    monkeypatch.setattr(per_tensor, "device_index", lambda dev: 0)
    monkeypatch.setattr(per_tensor, "launch", lambda mod, name, grid, block, args, index: calls.append((name, args)))
    cfg = QuantConfig("fp8_current")
    fields = per_tensor.quantize_2d(torch.randn(33, 70), cfg, rowwise=True, colwise=True, amax=torch.tensor([2.5]))
    assert [c[0] for c in calls] == ["per_tensor_cast_f32"]
    name, args = calls[0]
    assert _arg(name, args, "amax_in").tolist() == [2.5]  # the caller's tensor, read by the kernel (no copy)
    assert _arg(name, args, "amax_acc") is None  # current scaling: no history accumulation
    assert fields["rowwise_amax"] is _arg(name, args, "amax_store")  # the kernel stores amax_in there
    assert fields["colwise_amax"] is _arg(name, args, "amax_copy")  # and there
    with pytest.raises(ValueError, match="fp8_current"):
        per_tensor.quantize_2d(torch.randn(4, 4), QuantConfig("fp8_delayed"), rowwise=True, colwise=False,
                               amax=torch.tensor([1.0]))  # fmt: skip


def test_a_device_amax_is_taken_as_given_without_reading_it_back():
    """docs/numerics.md §5.1: the value rules (>= +0, no NaN) apply to a host amax; a device amax is not read
    (a meta tensor has no value to read: a read would raise), its shape and dtype are still checked."""
    from reference.spec import check_given_amax

    cfg = QuantConfig("nvfp4")
    assert check_given_amax(torch.empty(1, device="meta"), cfg).shape == (1,)
    with pytest.raises(SpecViolation, match="shape"):
        check_given_amax(torch.empty(2, device="meta"), cfg)
    with pytest.raises(SpecViolation, match=">= \\+0"):
        check_given_amax(torch.tensor([-1.0]), cfg)


@pytest.mark.parametrize("rowwise, colwise", [(True, True), (True, False), (False, True)])
def test_row_scaled_row_amax_launches_a_cta_per_group_of_rows(rowwise, colwise):
    """nvfp4_row_amax (docs/numerics.md §5.10 row-scaled A_g) runs a CTA per unit: 8 rows of X (a warp each) for
    the rowwise copy, 32 columns of X for the columnwise one, rowwise units first; then quantize_rows, a thread
    per 1x16 block of each requested copy."""
    from native import nvfp4

    calls = []

    def record(name, n_units, args, max_blocks=nvfp4.MAX_BLOCKS, units_per_block=nvfp4.THREADS):
        calls.append((name, n_units, units_per_block))

    x = torch.randn(112, 80).to(torch.bfloat16)  # 14 units of 8 rows, 3 units of 32 columns (the last partial)
    nvfp4.quantize_variant_with(record, x, QuantConfig("nvfp4", variant="row_scaled"), rowwise=rowwise,
                                colwise=colwise)  # fmt: skip
    copies = int(rowwise) + int(colwise)
    assert calls == [("nvfp4_row_amax_bf16", (14 if rowwise else 0) + (3 if colwise else 0), 1),
                     ("nvfp4_quantize_rows_bf16", copies * 112 * 80 // 16, nvfp4.THREADS)]  # fmt: skip
