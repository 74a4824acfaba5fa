"""Native's own swizzle, amax-history record and argument checks on the GPU, and the in-kernel NVFP4 alpha.

Source: docs/design.md §1 (native's own versions, cross-checked against the golden), docs/numerics.md §3 Layouts,
§5.8 (alpha), §5.9, §2. The CPU versions of these checks are tests/unit/test_native_launchers.py.
"""

from __future__ import annotations

import pytest
import torch

import native
import reference
from native import swizzle
from native.launch import device_index, launch, module_for
from native.per_tensor import record
from reference.formats import QuantConfig
from reference.layouts import geometry_of, swizzle_scales
from reference.per_tensor import AmaxHistory

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy")


@pytest.mark.parametrize("config", [QuantConfig("mxfp8"), QuantConfig("nvfp4", tile=(16, 16))], ids=lambda c: c.id)
def test_swizzle_of_native_scales_on_the_device_equals_the_reference(config):
    x = torch.randn(288, 416, generator=torch.Generator().manual_seed(1)) * 9
    q = native.quantize(x.cuda(), config, rowwise=True, colwise=True)
    gold = reference.quantize(x, config, rowwise=True, colwise=True)
    for o in ("rowwise", "colwise"):
        g = geometry_of(q, o)
        got = swizzle.swizzled(getattr(q, f"{o}_scale"), g.scale_valid_shape, transposed=g.swizzle_transposed)
        assert got.is_cuda and torch.equal(got.cpu(), swizzle_scales(gold, o)), o


def test_record_on_a_device_state_equals_the_reference():
    cfg = QuantConfig("fp8_delayed", amax_history_len=3)
    ours, gold = AmaxHistory(cfg, device="cuda"), AmaxHistory(cfg)
    for a in (2.0, 1.0, float("nan"), float("inf")):
        record(ours, torch.tensor([a], device="cuda"))
        gold.record(torch.tensor([a]))
        assert torch.equal(ours.history.cpu(), gold.history)


def test_a_wrong_dtype_is_refused_before_the_kernel_runs():
    cfg = QuantConfig("fp8_current")
    index = device_index(torch.device("cuda"))
    mod = module_for("fp8_per_tensor.cu", cfg, index)
    x = torch.ones(16, dtype=torch.float32, device="cuda")
    amax = torch.zeros(1, dtype=torch.float32, device="cuda")
    with pytest.raises(TypeError, match=r"kernel tensor_amax_bf16 argument 0 \(const __nv_bfloat16\* x\)"):
        launch(mod, "tensor_amax_bf16", 1, 256, (x, 16, 1, amax), index)
    launch(mod, "tensor_amax_f32", 1, 256, (x, 16, 1, amax), index)
    assert amax.item() == 1.0


def test_portable_nvfp4_alpha_underflows_and_overflows_like_the_replay():
    """Global amaxes whose alpha is subnormal (tiny operands) or large: the kernel's alpha, computed from the two
    amax pointers, gives the bits of the documented-order replay (which uses reference.nvfp4.gemm_alpha)."""
    from .test_native_gemm import replay_portable

    cfg = QuantConfig("nvfp4")
    gen = torch.Generator().manual_seed(4)
    for scale_a, scale_b in ((1e-17, 1e-17), (1e18, 1e17), (3e-30, 4e25)):
        a = reference.quantize(torch.randn(64, 128, generator=gen) * scale_a, cfg)
        b = reference.quantize(torch.randn(32, 128, generator=gen) * scale_b, cfg)
        want = replay_portable(a, b, "TN", torch.float32)
        a_dev, b_dev = (reference.QuantizedTensor(q.config, q.shape, q.hp_dtype, rowwise_data=q.rowwise_data.cuda(),
                                                  rowwise_scale=q.rowwise_scale.cuda(),
                                                  rowwise_amax=q.rowwise_amax.cuda()) for q in (a, b))
        got = native.gemm(a_dev, b_dev, out_dtype=torch.float32, method="portable").cpu()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (scale_a, scale_b)
