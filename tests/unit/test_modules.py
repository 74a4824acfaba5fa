"""Reference Linear / LayerNormLinear training steps (reference.linear, reference.norms; docs/numerics.md §9).

Hand-derived values on exact-representable inputs, the weight cache, SR seeds per step, amax
histories and wgrad accumulation over 3 steps, determinism, and an independent numpy / ml_dtypes
oracle for a current-scaling step.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from reference import dequantize, quantize
from reference.linear import (
    MODULES,
    ModuleParams,
    ModuleSpec,
    StepInput,
    run_module,
    sr_seed,
)
from reference.norms import norm_backward, norm_forward, ordered_sum
from reference.recipes import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from reference.types import SpecViolation, SRSeed
from tests.unit.oracles import np_compute_scale, oracle_codes

F32, BF16 = torch.float32, torch.bfloat16
# Values v with 128 v an E4M3 code and 16384 v an E5M2 code; amax 3.5 gives the power-of-two scales
# s = 448 / 3.5 = 128 (E4M3) and 57344 / 3.5 = 16384 (E5M2): quantization is lossless.
GRID = (0.0, 0.25, -0.25, 0.5, -0.5, 0.75, -0.75, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0, 3.0, -3.0)


def grid_tensor(shape, seed: int, dtype=F32) -> torch.Tensor:
    """Values drawn from GRID, with element [0, 0] = 3.5 (the amax)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(GRID), shape, generator=g)
    t = torch.tensor(GRID, dtype=torch.float64)[idx]
    t[0, 0] = 3.5
    return t.to(dtype)


def small_linear(recipe=None, *, bias=True, dtype=F32, fuse=False, seed=0):
    """Linear 64 -> 32 on 32 tokens with grid values (x [32, 64], W [32, 64], dY [32, 32])."""
    w = grid_tensor((32, 64), 1, dtype)
    b = torch.tensor([0.25 * (i - 16) for i in range(32)], dtype=dtype) if bias else None
    spec = ModuleSpec("linear", recipe or Float8CurrentScaling(), dtype, fuse_wgrad_accumulation=fuse, seed=seed)
    return spec, ModuleParams(weight=w, bias=b)


def f64(t):
    return t.to(torch.float64)


# ---- the small Linear: every stage exact, checked by hand --------------------------------------


def test_small_linear_every_stage_exact():
    spec, params = small_linear()
    x = grid_tensor((32, 64), 2)
    dy = grid_tensor((32, 32), 3)
    x[1] = 0.0
    x[1, :4] = torch.tensor([0.25, -0.75, 1.0, 0.0])
    x[:, 63] = 0.0
    x[1, 63] = 0.5
    dy[1] = 0.0
    dy[1, 2] = 2.0
    s = run_module(spec, params, [StepInput(x, dy)]).steps[0]
    w, b = params.weight, params.bias

    # Quantized operands: sinv = 2^-7 (E4M3, amax 3.5) and 2^-14 (E5M2), codes by hand.
    for q in (s.x_q, s.w_q):
        assert q.rowwise_scale.item() == 2.0**-7 and q.colwise_scale.item() == 2.0**-7
        assert q.rowwise_amax.item() == 3.5
    assert s.dy_q.rowwise_scale.item() == 2.0**-14
    assert s.x_q.rowwise_data[0, 0] == 0x7E  # 3.5 * 128 = 448 = 1.75 * 2^8
    # 0.25*128 = 32 = 2^5 -> E 12 -> 0x60; -0.75*128 = -96 = -1.5*2^6 -> 0xEC; 1.0*128 = 2^7 -> 0x70.
    assert s.x_q.rowwise_data[1, :4].tolist() == [0x60, 0xEC, 0x70, 0x00]
    assert s.dy_q.rowwise_data[0, 0] == 0x7B  # 3.5 * 2^14 = 57344, E5M2 max
    assert torch.equal(s.x_q.colwise_data, s.x_q.rowwise_data.t())  # data_T
    for q, hp in ((s.x_q, x), (s.w_q, w), (s.dy_q, dy)):
        assert torch.equal(dequantize(q, "rowwise", F32), hp)  # lossless
        assert torch.equal(dequantize(q, "colwise", F32), hp)

    # By hand: x[1] = (0.25, -0.75, 1, 0, ..., 0, 0.5), dy[1] = 2 e_2, x[:, 63] = 0.5 e_1:
    # y[1, n] = 0.25 w[n,0] - 0.75 w[n,1] + w[n,2] + 0.5 w[n,63] + b[n]; dgrad[1] = 2 w[2];
    # wgrad[:, 63] = sum_m dy[m, :] x[m, 63] = 0.5 dy[1] = e_2.
    hand = 0.25 * w[:, 0] - 0.75 * w[:, 1] + w[:, 2] + 0.5 * w[:, 63] + b
    assert torch.equal(s.fprop[1], hand)
    assert torch.equal(s.dgrad[1], 2.0 * w[2])
    assert torch.equal(s.wgrad[:, 63], torch.eye(32)[2])
    assert s.fprop.dtype == F32
    # Whole matrices: exact sums, so they equal the fp64 products of the high-precision tensors.
    assert torch.equal(f64(s.fprop), f64(x) @ f64(w).t() + f64(b))
    assert torch.equal(f64(s.dgrad), f64(dy) @ f64(w))
    assert torch.equal(s.dx, s.dgrad)
    assert torch.equal(f64(s.wgrad), f64(dy).t() @ f64(x))
    assert torch.equal(f64(s.dbias), f64(dy).sum(0))
    assert torch.equal(s.weight_grad, s.wgrad)
    assert s.main_grad is None
    assert s.gemms["fprop"].split_accumulator is False and s.gemms["dgrad"].split_accumulator is True
    assert [n for n, _ in s.stages()] == [
        "x_q", "w_q", "fprop", "dy_q", "dgrad", "dx", "wgrad", "dbias", "weight_grad",
    ]


def test_fp32_activation_bias_is_rounded_to_bf16_for_the_fp8_gemm():
    """TE linear.py: an FP8 GEMM takes no fp32 bias, so the bias goes through bf16 (8 bits)."""
    spec, params = small_linear()
    params.bias = torch.full((32,), 1.0 + 2.0**-10, dtype=F32)  # rounds to 1.0 in bf16
    x = torch.zeros(32, 64)
    x[0, 0] = 3.5
    s = run_module(spec, params, [StepInput(x, grid_tensor((32, 32), 3))]).steps[0]
    assert torch.equal(s.fprop[1], torch.ones(32))
    bf = ModuleSpec("linear", Float8CurrentScaling(), BF16)
    p2 = ModuleParams(params.weight.to(BF16), torch.full((32,), 1.0 + 2.0**-7, dtype=BF16))
    s2 = run_module(bf, p2, [StepInput(x.to(BF16), grid_tensor((32, 32), 3, BF16))]).steps[0]
    assert torch.equal(s2.fprop[1], torch.full((32,), 1.0 + 2.0**-7, dtype=BF16))  # bf16 bias kept


# ---- weight cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe", [Float8CurrentScaling(), DelayedScaling(amax_history_len=4)], ids=["current", "delayed"]
)
def test_weight_cache_reuses_the_cached_quantized_weight(recipe):
    spec, params = small_linear(recipe)
    w0 = params.weight
    w1 = grid_tensor((32, 64), 11)  # an "optimizer update": different values, same amax
    x, dy = grid_tensor((32, 64), 2), grid_tensor((32, 32), 3)
    steps = [
        StepInput(x, dy, is_first_microbatch=True),
        StepInput(x, dy, is_first_microbatch=False, weight=w1),
        StepInput(x, dy, is_first_microbatch=None),
    ]
    r = run_module(spec, params, steps).steps
    assert [s.weight_requantized for s in r] == [True, False, True]
    assert r[1].w_q is r[0].w_q  # the cached object itself
    if isinstance(recipe, Float8CurrentScaling):
        # Step 1 computes with the cached W0 although the high-precision weight is W1; step 2 with W1.
        assert torch.equal(f64(r[1].fprop), f64(x) @ f64(w0).t() + f64(params.bias))
        assert torch.equal(f64(r[1].dgrad), f64(dy) @ f64(w0))
        assert torch.equal(f64(r[2].fprop), f64(x) @ f64(w1).t() + f64(params.bias))
        assert not torch.equal(r[1].fprop, r[2].fprop)
    else:
        # Delayed: step 0 quantizes W with scale 1 and records amax 3.5 -> scale 128. Step 1 does
        # not quantize W: its H[0] stays 0, so the update changes nothing (docs/numerics.md §2.3).
        assert r[0].scales["weight"].item() == 128.0
        assert r[1].scales["weight"].item() == 128.0
        assert r[1].histories["weight"].tolist() == r[0].histories["weight"].tolist() == [0.0, 0.0, 0.0, 3.5]
        assert r[1].w_q.rowwise_scale.item() == 1.0  # the cached copy keeps its old sinv
        assert r[2].w_q.rowwise_scale.item() == 2.0**-7  # requantized with the updated scale
        assert r[2].histories["weight"].tolist() == [0.0, 0.0, 3.5, 3.5]


def test_weight_cache_miss_with_false_quantizes_and_caches():
    spec, params = small_linear()
    x, dy = grid_tensor((32, 64), 2), grid_tensor((32, 32), 3)
    run = run_module(spec, params, [StepInput(x, dy, is_first_microbatch=False)] * 2)
    assert [s.weight_requantized for s in run.steps] == [True, False]
    assert run.state.weight_cache is run.steps[0].w_q


# ---- stochastic rounding seeds -------------------------------------------------------------------


def nvfp4_case(seed: int, steps: int = 3):
    spec = ModuleSpec("linear", NVFP4BlockScaling(), BF16, seed=seed)
    g = torch.Generator().manual_seed(5)
    params = ModuleParams(weight=torch.randn(32, 64, generator=g).to(BF16))
    x = torch.randn(32, 64, generator=g).to(BF16)
    dy = torch.randn(32, 32, generator=g).to(BF16)
    return spec, params, [StepInput(x, dy) for _ in range(steps)]  # the same dY every step


def test_sr_bits_differ_per_step_and_replay_from_the_seed():
    spec, params, steps = nvfp4_case(seed=1234)
    a = run_module(spec, params, steps).steps
    b = run_module(spec, params, steps).steps
    cfg = spec.recipe.config("grad_output")
    assert cfg.stochastic
    for i, s in enumerate(a):
        # Documented derivation: stream 2 * (3 * step + role index 2); colwise uses stream + 1.
        assert s.sr_seeds == {"grad_output": SRSeed(1234, 2 * (3 * i + 2))}
        assert sr_seed(1234, i, "grad_output") == SRSeed(1234, 2 * (3 * i + 2))
        direct = quantize(steps[i].dy, cfg, rowwise=True, colwise=True, rng=SRSeed(1234, 6 * i + 4))
        for o in ("rowwise", "colwise"):
            assert torch.equal(getattr(s.dy_q, f"{o}_data"), getattr(direct, f"{o}_data"))
            assert torch.equal(getattr(b[i].dy_q, f"{o}_data"), getattr(s.dy_q, f"{o}_data"))  # rerun: same bits
    for o in ("rowwise_data", "colwise_data"):
        codes = [getattr(s.dy_q, o) for s in a]
        assert not torch.equal(codes[0], codes[1]) and not torch.equal(codes[1], codes[2])  # fresh bits per step
        assert not torch.equal(codes[0], codes[2])
    # X and W are round-to-nearest: identical every step.
    assert torch.equal(a[0].x_q.rowwise_data, a[2].x_q.rowwise_data)
    assert all(s.sr_seeds.keys() == {"grad_output"} for s in a)
    other = run_module(ModuleSpec("linear", NVFP4BlockScaling(), BF16, seed=1235), params, steps).steps
    assert not torch.equal(other[0].dy_q.rowwise_data, a[0].dy_q.rowwise_data)
    assert not torch.equal(other[0].dgrad, a[0].dgrad)


def test_sr_streams_are_distinct_per_step_role_copy():
    seen = set()
    for step in range(50):
        for role in ("input", "weight", "grad_output"):
            s = sr_seed(9, step, role)
            seen |= {s.stream, s.stream + 1}
    assert len(seen) == 50 * 3 * 2


# ---- delayed scaling: amax history over 3 steps ------------------------------------------------


def test_amax_history_evolves_over_three_steps():
    """L = 2, fp8_max 448 (E4M3) / 57344 (E5M2). Input amaxes 2, 7, 3; dY amaxes 1, 4, 0.5; W amax 3.5."""
    recipe = DelayedScaling(amax_history_len=2)
    spec, params = small_linear(recipe, bias=False)
    xs = [torch.zeros(32, 64) for _ in range(3)]
    dys = [torch.zeros(32, 32) for _ in range(3)]
    for i, (ax, ady) in enumerate(((2.0, 1.0), (7.0, 4.0), (3.0, 0.5))):
        xs[i][3, 5] = -ax
        xs[i][4, 6] = 1.0
        dys[i][2, 1] = ady
    r = run_module(spec, params, [StepInput(x, d) for x, d in zip(xs, dys, strict=True)]).steps
    # input: step 0 H -> [0, 2], s = 448/2 = 224; step 1 H -> [0, 7], s = 448/7 = 64;
    # step 2 H -> [0, 3], A = max(7, 3) = 7 (old H[1] still counts), s = 64.
    assert [s.histories["input"].tolist() for s in r] == [[0.0, 2.0], [0.0, 7.0], [0.0, 3.0]]
    assert [s.scales["input"].item() for s in r] == [224.0, 64.0, 64.0]
    # Each step quantizes with the scale of the previous update: sinv 1, RN(1/224), 1/64.
    sinv_224 = float(np.float32(1.0) / np.float32(224.0))
    assert [s.x_q.rowwise_scale.item() for s in r] == [1.0, sinv_224, 2.0**-6]
    # Step 1: -7 * 224 = -1568 saturates to -448 (0xFE); 1.0 * 224 = 224 = 1.75 * 2^7 -> 0x76.
    assert r[1].x_q.rowwise_data[3, 5] == 0xFE and r[1].x_q.rowwise_data[4, 6] == 0x76
    # grad_output (E5M2, 57344): H [0,1], [0,4], [0,0.5]; s = 57344, 14336, 14336 (A = max(4, 0.5)).
    assert [s.histories["grad_output"].tolist() for s in r] == [[0.0, 1.0], [0.0, 4.0], [0.0, 0.5]]
    assert [s.scales["grad_output"].item() for s in r] == [57344.0, 14336.0, 14336.0]
    rn = [float(np.float32(1.0) / np.float32(v)) for v in (57344.0, 14336.0)]  # RN32(1/s)
    assert [s.dy_q.rowwise_scale.item() for s in r] == [1.0, *rn]
    # weight: 3.5 every step; s = 128 from step 0 on.
    assert [s.scales["weight"].item() for s in r] == [128.0] * 3


# ---- wgrad accumulation over 3 steps -------------------------------------------------------------


@pytest.mark.parametrize("fuse", [False, True], ids=["weight_grad", "main_grad"])
def test_wgrad_accumulates_over_three_steps(fuse):
    spec, params = small_linear(fuse=fuse)
    steps = [StepInput(grid_tensor((32, 64), 20 + i), grid_tensor((32, 32), 30 + i)) for i in range(3)]
    run = run_module(spec, params, steps)
    total = torch.zeros(32, 64, dtype=torch.float64)
    for i, s in enumerate(run.steps):
        dw = f64(steps[i].dy).t() @ f64(steps[i].x)
        total += dw
        acc = s.main_grad if fuse else s.weight_grad
        assert acc.dtype == F32
        assert torch.equal(f64(acc), total), i
        if fuse:
            assert torch.equal(f64(s.wgrad), total)  # the GEMM writes C + dYᵀX into main_grad
            assert s.gemms["wgrad"].accumulate and s.weight_grad is None
        else:
            assert torch.equal(f64(s.wgrad), dw)
    assert not torch.equal(run.steps[0].wgrad, run.steps[1].wgrad)


def test_fused_main_grad_is_overwritten_on_the_first_microbatch():
    """TE linear.py: accumulate_wgrad_into_param_main_grad = fuse and not is_first_microbatch."""
    spec, params = small_linear(fuse=True)
    x, dy = grid_tensor((32, 64), 2), grid_tensor((32, 32), 3)
    first = run_module(spec, params, [StepInput(x, dy)])  # main_grad = dW
    run = run_module(spec, params, [StepInput(x, dy, True), StepInput(x, dy, False)], state=first.state)
    dw = f64(dy).t() @ f64(x)
    assert not run.steps[0].gemms["wgrad"].accumulate
    assert torch.equal(f64(run.steps[0].main_grad), dw)  # overwritten, not 2 dW
    assert torch.equal(f64(run.steps[1].main_grad), 2 * dw)


def test_bf16_weight_grad_accumulates_with_one_rounding_per_step():
    spec = ModuleSpec("linear", Float8CurrentScaling(), BF16)
    x = torch.zeros(32, 64, dtype=BF16)
    x[0, 0] = 3.5
    dy = torch.zeros(32, 32, dtype=BF16)
    dy[0, 0] = 3.5
    dy2 = dy.clone()
    dy2[0, 0], dy2[1, 0] = 3.5 * 2.0**-9, 3.5  # dW[0, 0] = 12.25 * 2^-9 (amax stays 3.5)
    params = ModuleParams(weight=grid_tensor((32, 64), 1, BF16))
    r = run_module(spec, params, [StepInput(x, dy), StepInput(x, dy2)]).steps
    assert r[0].weight_grad[0, 0].item() == 12.25
    # 12.25 + 12.25 * 2^-9 = 12.2739...: bf16 spacing at 12 is 2^-4, so it rounds to 12.25.
    assert r[1].wgrad[0, 0].item() == 12.25 * 2.0**-9
    assert r[1].weight_grad[0, 0].item() == 12.25


# ---- norms ---------------------------------------------------------------------------------------


def test_ordered_sum_is_a_pairwise_tree():
    # [1, 1, 2^53]: padded to 4, element i + element i + 2: [1 + 2^53, 1 + 0] = [2^53 (tie to even), 1],
    # then 2^53 + 1 = 2^53 (tie to even). A left-to-right sum gives (1 + 1) + 2^53 = 2^53 + 2 (exact).
    x = torch.tensor([[1.0, 1.0, 2.0**53]], dtype=torch.float64)
    assert ordered_sum(x, 1).item() == 2.0**53
    assert ordered_sum(x.t(), 0).item() == 2.0**53
    assert ordered_sum(torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]]), 1).tolist() == [15.0]


@pytest.mark.parametrize("zero_centered", [False, True])
def test_layernorm_by_hand(zero_centered):
    """Rows c + a * (+1, -1, ...): mu = c, var = a^2, y = +-1 exactly (eps 0)."""
    k = 16
    signs = torch.tensor([1.0, -1.0] * (k // 2))
    x = torch.stack([3.0 + 2.0 * signs, -1.0 + 0.5 * signs])  # (2, K)
    gamma = torch.full((k,), 1.5) - (1.0 if zero_centered else 0.0)
    beta = torch.full((k,), 0.25)
    f = norm_forward(x, gamma, beta, normalization="LayerNorm", eps=0.0, zero_centered_gamma=zero_centered,
                     out_dtype=F32)
    assert f.mu.tolist() == [3.0, -1.0] and f.rsigma.tolist() == [0.5, 2.0]
    assert torch.equal(f.out, (1.5 * signs + 0.25).expand(2, k))
    # backward with dz = 1: dyg = 1.5, mdy = 1.5, mdyy = 0 -> dx = rs * (1.5 - 1.5) = 0;
    # dgamma = sum over rows dz * y = 2 * signs; dbeta = 2.
    b = norm_backward(torch.ones(2, k), x, f, gamma, normalization="LayerNorm", zero_centered_gamma=zero_centered)
    assert torch.equal(b.dx, torch.zeros(2, k))
    assert torch.equal(b.dgamma, 2.0 * signs) and torch.equal(b.dbeta, torch.full((k,), 2.0))


def test_rmsnorm_by_hand():
    k = 16
    x = torch.tensor([[2.0, -2.0] * (k // 2)])
    f = norm_forward(x, torch.full((k,), 3.0), None, normalization="RMSNorm", eps=0.0, zero_centered_gamma=False,
                     out_dtype=F32)
    assert f.mu is None and f.rsigma.item() == 0.5
    assert torch.equal(f.out, torch.tensor([[3.0, -3.0] * (k // 2)]))
    # dz = y: dyg = 3 y, mdyy = 3 mean(y^2) = 3 -> dx = 0.5 * (3 y - 3 y) = 0; dgamma = y^2 = 1.
    dz = torch.tensor([[1.0, -1.0] * (k // 2)])
    b = norm_backward(dz, x, f, torch.full((k,), 3.0), normalization="RMSNorm", zero_centered_gamma=False)
    assert torch.equal(b.dx, torch.zeros(1, k)) and torch.equal(b.dgamma, torch.ones(k)) and b.dbeta is None


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norms_against_fp64_autograd(norm, zero_centered):
    """Within a few fp32 ulps of torch's fp64 functional norm and its autograd gradients."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 80, generator=g) * 3 + 1
    gamma, beta, dz = torch.randn(80, generator=g), torch.randn(80, generator=g), torch.randn(24, 80, generator=g)
    f = norm_forward(x, gamma, beta, normalization=norm, eps=1e-5, zero_centered_gamma=zero_centered, out_dtype=F32)
    b = norm_backward(dz, x, f, gamma, normalization=norm, zero_centered_gamma=zero_centered)
    xx, gg, bb = (t.double().requires_grad_() for t in (x, gamma, beta))
    ge = gg + 1 if zero_centered else gg
    if norm == "LayerNorm":
        o = torch.nn.functional.layer_norm(xx, (80,), ge, bb, 1e-5)
    else:
        o = torch.nn.functional.rms_norm(xx, (80,), ge, 1e-5)
    o.backward(dz.double())
    tol = 2.0**-20  # a few fp32 ulps at these magnitudes (|out| < 16)
    assert (f64(f.out) - o.detach()).abs().max() < 8 * tol
    assert (f64(b.dx) - xx.grad).abs().max() < 8 * tol
    assert (f64(b.dgamma) - gg.grad).abs().max() < 16 * tol
    if norm == "LayerNorm":
        assert (f64(b.dbeta) - bb.grad).abs().max() < 16 * tol


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_small_layernorm_linear_every_stage_exact_equals_fp64_autograd(norm):
    """Rows c + a * (+-1) with a a power of two (eps 0): y = +-1 and rsigma = 1/a exactly, ln_out = gamma * y
    on the grid, every quantization lossless and every sum exact, so the whole chain is the exact real
    result. Oracle: torch's fp64 autograd of the unquantized module (no shared code); its Welford mean
    rounds in fp64, so it is matched to 1e-12 relative, 2^12 times finer than an fp32 ulp."""
    k, n, m = 64, 32, 32
    signs = torch.tensor([1.0, -1.0] * (k // 2))
    a = torch.tensor([2.0 ** (i % 5 - 2) for i in range(m)])[:, None]  # 1/4 .. 4
    c = torch.tensor(GRID * 3)[:m, None] if norm == "LayerNorm" else torch.zeros(m, 1)
    x = c + a * signs * torch.where(torch.arange(m)[:, None] % 2 == 0, 1.0, -1.0)
    gamma = grid_tensor((1, k), 4)[0]
    params = ModuleParams(grid_tensor((n, k), 1), torch.tensor([0.25 * (i - 16) for i in range(n)]),
                          gamma, torch.zeros(k))
    dy = grid_tensor((m, n), 3)
    spec = ModuleSpec("layernorm_linear", Float8CurrentScaling(), F32, normalization=norm, eps=0.0)
    s = run_module(spec, params, [StepInput(x, dy)]).steps[0]
    assert s.x_q.rowwise_scale.item() == 2.0**-7 and torch.equal(dequantize(s.x_q, "rowwise", F32), s.ln_out)
    assert torch.equal(s.ln_rsigma, 1.0 / a[:, 0])
    xx, gg, bb, ww, bi = (f64(t).requires_grad_() for t in (x, gamma, params.ln_bias, params.weight, params.bias))
    if norm == "LayerNorm":
        ln = torch.nn.functional.layer_norm(xx, (k,), gg, bb, 0.0)
    else:
        ln = torch.nn.functional.rms_norm(xx, (k,), gg, 0.0)
    y = ln @ ww.t() + bi
    y.backward(f64(dy))
    row_sign = torch.where(torch.arange(m)[:, None] % 2 == 0, 1.0, -1.0)
    assert torch.equal(s.ln_out, gamma * signs * row_sign)  # by hand: y = +-1 exactly

    def close(ours, oracle):
        return torch.allclose(f64(ours), oracle.detach(), rtol=1e-12, atol=1e-12)

    assert close(s.ln_out, ln) and close(s.fprop, y) and close(s.dx, xx.grad)
    assert close(s.wgrad, ww.grad) and close(s.dbias, bi.grad) and close(s.dgamma, gg.grad)
    if norm == "LayerNorm":
        assert close(s.dbeta, bb.grad)
    assert (s.dx.abs() > 1).any()


def test_layernorm_linear_chain():
    """ln_out feeds the input quantizer; dgrad feeds the norm backward (TE layernorm_linear.py)."""
    g = torch.Generator().manual_seed(4)
    k, n = 64, 32
    params = ModuleParams(
        weight=torch.randn(n, k, generator=g).to(BF16), bias=torch.randn(n, generator=g).to(BF16),
        ln_weight=torch.randn(k, generator=g).to(BF16), ln_bias=torch.randn(k, generator=g).to(BF16),
    )
    x, dy = torch.randn(2, 16, k, generator=g).to(BF16), torch.randn(2, 16, n, generator=g).to(BF16)
    for recipe in (Float8CurrentScaling(), DelayedScaling()):
        spec = ModuleSpec("layernorm_linear", recipe, BF16)
        s = run_module(spec, params, [StepInput(x, dy)]).steps[0]
        f = norm_forward(x.reshape(-1, k), params.ln_weight, params.ln_bias, normalization="LayerNorm", eps=1e-5,
                         zero_centered_gamma=False, out_dtype=BF16)
        assert torch.equal(s.ln_out, f.out)
        # Current scaling quantizes the bf16 ln_out; delayed is fused into the norm (fp32 output).
        src = f.out if isinstance(recipe, Float8CurrentScaling) else f.out_fp32
        direct = quantize(src, recipe.config("input"), rowwise=True, colwise=True)
        assert torch.equal(s.x_q.rowwise_data, direct.rowwise_data)
        nb = norm_backward(s.dgrad, x.reshape(-1, k), f, params.ln_weight, normalization="LayerNorm",
                           zero_centered_gamma=False)
        assert torch.equal(s.dx, nb.dx) and torch.equal(s.dgamma, nb.dgamma) and torch.equal(s.dbeta, nb.dbeta)
        assert s.dx.dtype == BF16 and s.dgamma.dtype == BF16
        assert [n for n, _ in s.stages()][:3] == ["ln_out", "x_q", "w_q"]
    # The two quantization sources differ somewhere for this input (the fused path is not ln_out's).
    fp32_src = quantize(f.out_fp32, Float8CurrentScaling().config("input"))
    bf16_src = quantize(f.out, Float8CurrentScaling().config("input"))
    assert not torch.equal(fp32_src.rowwise_data, bf16_src.rowwise_data)


# ---- every recipe: determinism, shapes ------------------------------------------------------------

RECIPES = {
    "delayed": DelayedScaling(amax_history_len=8),
    "current": Float8CurrentScaling(),
    "mxfp8": MXFP8BlockScaling(),
    "mxfp8_2d": MXFP8BlockScaling(enable_2d_quantization=True),
    "block": Float8BlockScaling(),
    "nvfp4": NVFP4BlockScaling(),
    "nvfp4_plain": NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True),
}


def _case(module: str, recipe, norm: str):
    g = torch.Generator().manual_seed(8)
    k, n = 128, 64
    params = ModuleParams(
        weight=torch.randn(n, k, generator=g).to(BF16) * 0.1, bias=torch.randn(n, generator=g).to(BF16),
        ln_weight=torch.randn(k, generator=g).to(BF16), ln_bias=torch.randn(k, generator=g).to(BF16),
    )
    steps = [
        StepInput(torch.randn(2, 64, k, generator=g).to(BF16), torch.randn(2, 64, n, generator=g).to(BF16), mb)
        for mb in (True, False, False)
    ]
    return ModuleSpec(module, recipe, BF16, normalization=norm, zero_centered_gamma=True, seed=77), params, steps


def _bits(v):
    if isinstance(v, torch.Tensor):
        return [v]
    return [getattr(v, f) for f in v.TENSOR_FIELDS if getattr(v, f) is not None]


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("recipe", list(RECIPES), ids=list(RECIPES))
def test_same_bits_when_run_twice(module, recipe):
    norm = "RMSNorm" if recipe in ("mxfp8", "nvfp4") else "LayerNorm"
    spec, params, steps = _case(module, RECIPES[recipe], norm)
    a, b = run_module(spec, params, steps).steps, run_module(spec, params, steps).steps
    for sa, sb in zip(a, b, strict=True):
        assert [n for n, _ in sa.stages()] == [n for n, _ in sb.stages()]
        for (name, va), (_, vb) in zip(sa.stages(), sb.stages(), strict=True):
            for ta, tb in zip(_bits(va), _bits(vb), strict=True):
                assert torch.equal(ta.view(torch.uint8), tb.view(torch.uint8)), (recipe, sa.step, name)
    s = a[0]
    m = 128
    assert s.fprop.shape == (m, 64) and s.dx.shape == (m, 128) and s.wgrad.shape == (64, 128)
    assert s.fprop.dtype == s.dx.dtype == s.wgrad.dtype == BF16
    # Output quality: the fprop is close to the high-precision product of what the GEMM consumed.
    xin = (s.ln_out if module == "layernorm_linear" else steps[0].x.reshape(m, 128)).double()
    y = xin @ params.weight.double().t() + params.bias.double()
    rel = ((s.fprop.double() - y).norm() / y.norm()).item()
    assert rel < (0.2 if recipe.startswith("nvfp4") else 0.1), rel


# ---- current scaling against an independent oracle -------------------------------------------------


def _np_quantize(v: np.ndarray, element: str):
    fmt_max = {"e4m3": 448.0, "e5m2": 57344.0}[element]
    amax = np.float32(np.nanmax(np.abs(v)))
    s, sinv = np_compute_scale(amax, fmt_max, False, 0.0, np.finfo(np.float32).max)
    codes = oracle_codes((v.astype(np.float32) * s).astype(np.float32), element)
    dml = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[element]
    return codes, np.float32(sinv), codes.view(dml).astype(np.float64)


def _np_round_bf16(v: np.ndarray) -> np.ndarray:
    """fp64 -> bf16 bits with ONE round-to-nearest-even (ml_dtypes goes through fp32: two roundings).

    Candidates: the fp32-path result and its two bf16 neighbours; the nearest in exact fp64 distance
    wins (a candidate within an ulp of v differs from it exactly), ties to the even code.
    """
    b = v.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int64)
    cands = np.stack([b - 1, b, b + 1]) & 0xFFFF
    vals = cands.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    dist = np.where(np.isfinite(vals), np.abs(vals - v[None]), np.inf)
    best = dist.min(axis=0)
    tie_odd = (dist == best[None]) & ((cands & 1) == 1) & ((dist == best[None]).sum(0) > 1)[None]
    score = np.where(tie_odd, np.inf, dist)
    return np.take_along_axis(cands, score.argmin(axis=0)[None], 0)[0].astype(np.uint16)


def _np_gemm(a_dec, sa, b_dec, sb, bias=None):
    """bf16 bits of sum_k a b (fp64, exact: small integers times powers of two) * sinv_a * sinv_b.

    With a bias (cuBLASLt BIAS epilogue): RN32, add the bias in fp32, then RN_bf16; else one rounding.
    """
    y = (a_dec @ b_dec.T) * (np.float64(sa) * np.float64(sb))
    if bias is None:
        return _np_round_bf16(y)
    y = (y.astype(np.float32) + bias.astype(np.float32)).astype(np.float32)
    return y.astype(ml_dtypes.bfloat16).view(np.uint16)  # fp32 -> bf16: one rounding


def test_current_scaling_step_against_numpy_oracle():
    spec, params, steps = _case("linear", Float8CurrentScaling(), "LayerNorm")
    s = run_module(spec, params, steps[:1]).steps[0]
    x = steps[0].x.reshape(-1, 128).float().numpy()
    dy = steps[0].dy.reshape(-1, 64).float().numpy()
    w = params.weight.float().numpy()
    xc, xs, xd = _np_quantize(x, "e4m3")
    wc, ws, wd = _np_quantize(w, "e4m3")
    dc, ds, dd = _np_quantize(dy, "e5m2")  # HYBRID: gradients in E5M2
    for q, codes, sinv in ((s.x_q, xc, xs), (s.w_q, wc, ws), (s.dy_q, dc, ds)):
        assert np.array_equal(q.rowwise_data.numpy(), codes)
        assert np.array_equal(q.colwise_data.numpy(), codes.T)
        assert q.rowwise_scale.item() == float(sinv)
    bias = params.bias.float().numpy()
    y = _np_gemm(xd, xs, wd, ws, bias=bias)
    dgrad = _np_gemm(dd, ds, wd.T, ws)
    wgrad = _np_gemm(dd.T, ds, xd.T, xs)
    def bits(t):
        return t.view(torch.int16).numpy().view(np.uint16)

    assert np.array_equal(bits(s.fprop), y)
    assert np.array_equal(bits(s.dgrad), dgrad)
    assert np.array_equal(bits(s.wgrad), wgrad)
    assert np.array_equal(bits(s.dbias), _np_round_bf16(dy.astype(np.float64).sum(0)))  # bf16 sums exact in fp64
    assert math.isfinite(float(s.fprop.float().abs().max()))


def test_spec_and_inputs_are_checked():
    with pytest.raises(ValueError, match="module="):
        ModuleSpec("mlp")
    with pytest.raises(ValueError, match="normalization="):
        ModuleSpec("layernorm_linear", normalization="BatchNorm")
    spec, params = small_linear()
    with pytest.raises(ValueError, match="expected torch.float32"):
        run_module(spec, params, [StepInput(torch.zeros(32, 64, dtype=BF16), torch.zeros(32, 32))])
    with pytest.raises(SpecViolation, match="RHT needs a bfloat16 input"):  # TE's test skips RHT for fp32
        run_module(ModuleSpec("linear", NVFP4BlockScaling(), F32), params,
                   [StepInput(torch.zeros(32, 64), torch.zeros(32, 32))])
    with pytest.raises(ValueError, match="ln_weight"):
        run_module(ModuleSpec("layernorm_linear", Float8CurrentScaling(), F32), params,
                   [StepInput(torch.zeros(32, 64), torch.zeros(32, 32))])


# ---- CUDA vs CPU (gpu-marked: the lead's GPU run) ---------------------------------------------------


def _to(v, device):
    return v.to(device) if v is not None else None


@pytest.mark.gpu
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("recipe", list(RECIPES), ids=list(RECIPES))
def test_same_bits_on_cuda_and_cpu(module, recipe, cuda_device):
    """docs/numerics.md §9: every stage byte-identical on both devices (the GEMMs' fp64 sums are exact
    for these inputs: small codes times power-of-two or 4-bit scales; the norm sums are fixed trees)."""
    norm = "RMSNorm" if recipe in ("mxfp8", "nvfp4") else "LayerNorm"
    spec, params, steps = _case(module, RECIPES[recipe], norm)
    cpu = run_module(spec, params, steps).steps
    p_dev = ModuleParams(*(_to(getattr(params, f), cuda_device) for f in ("weight", "bias", "ln_weight", "ln_bias")))
    s_dev = [StepInput(s.x.to(cuda_device), s.dy.to(cuda_device), s.is_first_microbatch) for s in steps]
    dev = run_module(spec, p_dev, s_dev).steps
    for sc, sd in zip(cpu, dev, strict=True):
        for (name, vc), (_, vd) in zip(sc.stages(), sd.stages(), strict=True):
            for tc, td in zip(_bits(vc), _bits(vd), strict=True):
                assert torch.equal(tc.view(torch.uint8), td.cpu().view(torch.uint8)), (recipe, sc.step, name)
