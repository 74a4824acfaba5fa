"""native.linear's own step orchestration on the CPU, against the golden step bit for bit.

Source: docs/numerics.md §9 (the step), §9.8 (native computes every stage itself). native/linear.py writes the
step from the contract; here its kernels are replaced (`with_kernels`) by the reference quantizer, GEMM and
amax update and by reference.norms as CPU stand-ins for native/cuda/norms.cu, so any difference from
reference.linear.run_module is an orchestration difference: step order, which tensor feeds which quantizer
and GEMM, weight cache, SR seeds, delayed-scaling updates, bias cast, wgrad accumulation / main_grad. The
norm and dbias kernels themselves are checked against reference.norms on the GPU
(tests/gpu/test_native_norms.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import reference
from harness.cases import Case
from harness.module_inputs import generate_module, module_args
from native import linear as native_linear
from native import norms as native_norms
from reference import norms as ref_norms
from reference.gemm import round_out
from reference.linear import StepInput, run_module
from reference.per_tensor import AmaxHistory
from reference.types import SRSeed, Unsupported


def _reference_dbias(dy2d: torch.Tensor) -> torch.Tensor:
    """The CPU stand-in of native.norms.column_sum: RN_act(S over tokens) (docs/numerics.md §9.3)."""
    return round_out(ref_norms.ordered_sum(dy2d, 0), dy2d.dtype)


def _cpu_kernels(updates: list | None = None) -> native_linear.Kernels:
    def update(h):
        if updates is not None:
            updates.append(h.config.id)
        h.update()

    return native_linear.Kernels(quantize=reference.quantize, gemm=reference.gemm, update_amax_history=update,
                                 norm_forward=ref_norms.norm_forward, norm_backward=ref_norms.norm_backward,
                                 column_sum=_reference_dbias)


def _bits_equal(a, b, where: str) -> None:
    """a and b identical: tensors in dtype, shape and bits (NaN payloads too); dataclasses field by field."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, (where, a.dtype, b.dtype)
        if a.is_floating_point():
            width = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[a.element_size() * 8]
            a, b = a.contiguous().view(width), b.contiguous().view(width)
        assert torch.equal(a, b), where
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            _bits_equal(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, a.keys(), b.keys())
        for k in a:
            _bits_equal(a[k], b[k], f"{where}[{k}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _bits_equal(x, y, f"{where}[{i}]")
    elif isinstance(a, AmaxHistory):
        assert isinstance(b, AmaxHistory) and a.config == b.config, where
        _bits_equal((a.scale, a.history), (b.scale, b.history), where)
    else:
        assert a == b, (where, a, b)


CASES = [
    "linear-delayed-bf16-t64-k128-n64-bias-st3-mb_cache_update-normal-s0",
    "layernorm_linear-LayerNorm-delayed-f32-t64-k128-n64-fuse-st3-mb_cache-normal-s1",
    "layernorm_linear-RMSNorm-delayed-bf16-t64-k128-n64-bias-st3-mb_cache-normal-s4",  # quantizes the fp32 out32
    "layernorm_linear-RMSNorm-zcg-current-bf16-t64-k128-n64-bias-fuse-st3-mb_none-normal-s2",
    "layernorm_linear-LayerNorm-zcg-mxfp8-bf16-t64-k128-n64-bias-st3-mb_cache-normal-s0",
    "linear-block-f32-t64-k128-n64-bias-fuse-st3-mb_cache_update-normal-s0",
    "layernorm_linear-RMSNorm-nvfp4-bf16-t64-k128-n64-bias-fuse-st3-mb_cache_update-normal-s3",
    "layernorm_linear-LayerNorm-nvfp4-nrht-n2d-f32-t64-k128-n64-bias-st3-mb_none-normal-s0",
]
# is_first_microbatch per step, with a new high-precision weight before every step > 0 (docs/numerics.md §9.4):
# cache then reuse; a miss at step 0 (False without a cache); None between cached steps drops the cache.
PATTERNS = [(True, False, False), (False, False, True), (True, None, False)]


def _with_pattern(steps: list[StepInput], pattern, n: int, k: int, dtype) -> list[StepInput]:
    g = torch.Generator().manual_seed(7)
    return [StepInput(s.x, s.dy, mb, None if i == 0 else (torch.randn(n, k, generator=g) * 0.023).to(dtype))
            for i, (s, mb) in enumerate(zip(steps, pattern, strict=True))]


@pytest.mark.parametrize("case_id", CASES)
def test_native_step_equals_the_golden_step_bit_for_bit_with_reference_kernels(case_id):
    c = Case.from_id(case_id)
    spec, params, steps = module_args(c, generate_module(c))
    updates: list = []
    cand = native_linear.run_module(spec, params, steps, with_kernels=_cpu_kernels(updates))
    gold = run_module(spec, params, steps)
    _bits_equal(cand, gold, "run")
    delayed = c.module.recipe.config("input").scheme == "fp8_delayed"
    # NUMERICS: docs/numerics.md §9.6 three updates a step (input, weight after the forward, grad_output after).
    assert len(updates) == (3 * len(steps) if delayed else 0)
    # every stage a fresh tensor: no step's result aliases a later step's accumulation
    if not spec.fuse_wgrad_accumulation:
        assert cand.steps[0].weight_grad.data_ptr() != cand.steps[1].weight_grad.data_ptr()


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: "-".join(map(str, p)))
@pytest.mark.parametrize("case_id", [CASES[0], CASES[3], CASES[5], CASES[6]])
def test_weight_cache_patterns_with_weight_updates_match_the_golden(case_id, pattern):
    c = Case.from_id(case_id)
    spec, params, steps = module_args(c, generate_module(c))
    n, k = params.weight.shape
    steps = _with_pattern(steps, pattern, n, k, spec.activation_dtype)
    cand = native_linear.run_module(spec, params, steps, with_kernels=_cpu_kernels())
    gold = run_module(spec, params, steps)
    _bits_equal(cand, gold, "run")
    # docs/numerics.md §9.4: W is requantized unless a cache exists and is_first_microbatch is False.
    cached = False
    for s, mb in zip(cand.steps, pattern, strict=True):
        assert s.weight_requantized == (mb is None or mb or not cached)
        cached = mb is not None
    # the fused wgrad overwrites main_grad exactly when is_first_microbatch is True (§9.3)
    if spec.fuse_wgrad_accumulation:
        assert [s.gemms["wgrad"].accumulate for s in cand.steps] == [not mb for mb in pattern]


def test_sr_seeds_are_per_step_role_and_copy_from_the_case_seed():
    c = Case.from_id(CASES[6])  # NVFP4: dY stochastically rounded
    spec, params, steps = module_args(c, generate_module(c))
    run = native_linear.run_module(spec, params, steps, with_kernels=_cpu_kernels())
    # docs/numerics.md §9.5: stream 2*(3*step + 2) for grad_output; rowwise stream, colwise stream + 1
    assert [s.sr_seeds["grad_output"] for s in run.steps] == [SRSeed(c.seed, 4), SRSeed(c.seed, 10),
                                                              SRSeed(c.seed, 16)]
    assert native_linear.sr_seed(5, 1, "weight") == SRSeed(5, 8) and native_linear.sr_seed(5, 0, "input") == SRSeed(5, 0)


def test_native_kernels_are_the_default_and_cpu_tensors_are_refused():
    import native

    kn = native_linear.kernels()
    assert (kn.quantize, kn.gemm, kn.update_amax_history) == (native.quantize, native.gemm,
                                                                native.update_amax_history)
    assert (kn.norm_forward, kn.norm_backward, kn.column_sum) == (native_norms.norm_forward,
                                                                  native_norms.norm_backward,
                                                                  native_norms.column_sum)
    # a partial replacement keeps native's own for the rest (reference.linear.Kernels has no norm fields)
    part = native_linear.kernels(reference.linear.Kernels())
    assert part.quantize is reference.quantize and part.norm_forward is native_norms.norm_forward
    c = Case.from_id(CASES[1])
    spec, params, steps = module_args(c, generate_module(c))
    for with_kernels in (None, reference.linear.Kernels()):  # the second leaves the norms native
        with pytest.raises(Unsupported, match="CUDA only"):
            native_linear.run_module(spec, params, steps, with_kernels=with_kernels)


def test_native_norms_check_dtypes_then_device():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    g = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one dtype"):
        native_norms.norm_forward(x, g.float(), g, normalization="LayerNorm", eps=1e-5, zero_centered_gamma=False,
                                  out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="normalization"):
        native_norms.norm_forward(x, g, g, normalization="BatchNorm", eps=1e-5, zero_centered_gamma=False,
                                  out_dtype=torch.bfloat16)
    with pytest.raises(Unsupported, match="CUDA only"):
        native_norms.norm_forward(x, g, None, normalization="RMSNorm", eps=1e-5, zero_centered_gamma=False,
                                  out_dtype=torch.bfloat16)
    with pytest.raises(Unsupported, match="CUDA only"):
        native_norms.column_sum(x)
