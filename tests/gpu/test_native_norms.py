"""Native LayerNorm / RMSNorm and dbias kernels (native/cuda/norms.cu) against reference.norms, bit for bit.

Source: docs/numerics.md §9.2 (every sum the fp64 pairwise tree S, every fp32 rounding point named: the
kernels reproduce them exactly), §9.3 (dbias), §9.8. The reference runs on the same CUDA tensors (its bits
are device independent by contract). Hidden sizes 64 .. 8192 and ones that are not powers of two (the tree's
zero padding; 1 and 3 elements; more than the 256 lanes of a CTA and fewer), token counts 1 .. 1000 (the
column trees), bf16 / fp16 / fp32, both norms, zero-centred gamma, several eps; rows with a large common
offset (cancellation in x - mu), constant rows (var = 0: rsigma = RN32(1/sqrt(eps))) and wide exponent
ranges. Every output comes from torch.empty: `dirty_empty` poisons it, so an element a kernel skips shows.
Run: `pytest -m gpu tests/gpu/test_native_norms.py`.
"""

from __future__ import annotations

import pytest
import torch

from harness.cases import Case
from harness.module_inputs import generate_module, module_args
from native import linear as native_linear
from native import norms as native_norms
from reference import norms as ref_norms
from reference.gemm import round_out
from reference.linear import run_module

from .poison import dirty_empty

pytestmark = pytest.mark.gpu

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
SHAPES = [(1, 1), (2, 3), (7, 64), (5, 100), (33, 255), (16, 256), (9, 257), (128, 768), (3, 1000), (64, 1024),
          (4, 3000), (32, 4096), (2, 5120), (17, 8192)]  # (M tokens, K hidden)


def _bits(t: torch.Tensor) -> torch.Tensor:
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def _assert_same(got: torch.Tensor | None, want: torch.Tensor | None, what: str) -> None:
    if want is None:
        assert got is None, what
        return
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    diff = (_bits(got) != _bits(want)).nonzero()
    assert diff.numel() == 0, (f"{what}: {diff.shape[0]} of {want.numel()} elements differ, first at "
                               f"{tuple(diff[0].tolist())}: {got[tuple(diff[0])].item()!r} vs {want[tuple(diff[0])].item()!r}")


def _inputs(m: int, k: int, dtype: torch.dtype, seed: int, zero_centered: bool):
    """x with a spread of row offsets and scales (cancellation, constant rows), gamma, beta, dz."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=g).float())
    x += torch.randn(m, 1, generator=g) * 64  # a large common offset: cancellation in x - mu
    if m > 2:
        x[1] = 3.25  # a constant row: var = 0
        lo, hi = (-10, 6) if dtype == torch.float16 else (-20, 20)  # fp16: no overflow to inf
        x[2] *= torch.exp2(torch.randint(lo, hi + 1, (k,), generator=g).float())  # a wide exponent range in one row
    gamma = torch.randn(k, generator=g) * 0.1 + (0.0 if zero_centered else 1.0)
    beta = torch.randn(k, generator=g) * 0.1
    dz = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-4, 5, (m, 1), generator=g).float())
    return [t.to(dtype).cuda() for t in (x, gamma, beta, dz)]


@pytest.fixture
def poisoned(monkeypatch):
    shapes: list = []
    monkeypatch.setattr(torch, "empty", dirty_empty(torch.empty, shapes))
    return shapes


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"m{s[0]}-k{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalization", ref_norms.NORMALIZATIONS)
def test_norm_forward_and_backward_match_the_reference_bit_for_bit(normalization, dtype, shape, poisoned):
    m, k = shape
    act = DTYPES[dtype]
    for zero_centered, eps in ((False, 1e-5), (True, 1e-6), (False, 0.5)):
        x, gamma, beta, dz = _inputs(m, k, act, seed=m * 10007 + k, zero_centered=zero_centered)
        beta = beta if normalization == "LayerNorm" else None
        kw = {"normalization": normalization, "eps": eps, "zero_centered_gamma": zero_centered, "out_dtype": act}
        want = ref_norms.norm_forward(x, gamma, beta, **kw)
        got = native_norms.norm_forward(x, gamma, beta, **kw)
        where = f"{normalization} {dtype} {shape} zcg={zero_centered} eps={eps}"
        for f in ("out", "out_fp32", "mu", "rsigma"):
            _assert_same(getattr(got, f), getattr(want, f), f"forward {f}, {where}")
        bkw = {"normalization": normalization, "zero_centered_gamma": zero_centered}
        want_b = ref_norms.norm_backward(dz, x, want, gamma, **bkw)
        got_b = native_norms.norm_backward(dz, x, got, gamma, **bkw)
        for f in ("dx", "dgamma", "dbeta"):
            _assert_same(getattr(got_b, f), getattr(want_b, f), f"backward {f}, {where}")
    assert (m, k) in poisoned and (k,) in poisoned  # ln_out / dx and dgamma came from the poisoned torch.empty


def test_constant_row_has_rsigma_of_eps_alone():
    """var = 0 exactly: rsigma = RN32(1/sqrt(RN32(eps))) and y = 0, so ln_out = beta (LayerNorm)."""
    x = torch.full((2, 96), 3.25, dtype=torch.float32, device="cuda")
    gamma = torch.ones(96, dtype=torch.float32, device="cuda")
    beta = torch.linspace(-1, 1, 96, dtype=torch.float32, device="cuda")
    got = native_norms.norm_forward(x, gamma, beta, normalization="LayerNorm", eps=0.25, zero_centered_gamma=False,
                                    out_dtype=torch.float32)
    assert got.mu.tolist() == [3.25, 3.25] and got.rsigma.tolist() == [2.0, 2.0]  # 1/sqrt(0.25) exactly
    assert torch.equal(got.out, beta.expand(2, 96))


@pytest.mark.parametrize("m", [1, 3, 128, 1000])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dbias_column_sum_matches_the_reference_bit_for_bit(dtype, m, poisoned):
    act = DTYPES[dtype]
    for n in (1, 64, 257, 4096):
        g = torch.Generator().manual_seed(m + n)
        dy = (torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-12, 13, (m, 1), generator=g).float()))
        dy = dy.to(act).cuda()
        want = round_out(ref_norms.ordered_sum(dy, 0), act)  # reference.linear's dbias (docs/numerics.md §9.3)
        _assert_same(native_norms.column_sum(dy), want, f"dbias {dtype} m={m} n={n}")
        assert (n,) in poisoned


def test_column_sum_of_no_rows_is_zero():
    got = native_norms.column_sum(torch.empty(0, 5, dtype=torch.bfloat16, device="cuda"))
    assert got.tolist() == [0.0] * 5


@pytest.mark.parametrize("case_id", [
    "layernorm_linear-LayerNorm-current-bf16-t2x64-k128-n256-bias-st3-mb_cache-normal-s1",
    "layernorm_linear-RMSNorm-zcg-delayed-bf16-t2x64-k256-n128-bias-fuse-st3-mb_cache-normal-s0",
    "layernorm_linear-LayerNorm-block-f32-t2x64-k128-n256-bias-st3-mb_none-normal-s2",
])
def test_native_module_norm_stages_equal_the_golden(case_id):
    """In a native module step on CUDA, ln_out / mu / rsigma and dbias equal the golden bits (their inputs are
    the case's), and the norm backward equals reference.norms on native's own dgrad."""
    c = Case.from_id(case_id)
    spec, params, steps = module_args(c, {k: v.cuda() for k, v in generate_module(c).items()})
    gold = run_module(spec, params, steps)
    cand = native_linear.run_module(spec, params, steps)
    for i, (s, g) in enumerate(zip(cand.steps, gold.steps, strict=True)):
        for f in ("ln_out", "ln_mu", "ln_rsigma", "dbias"):
            _assert_same(getattr(s, f), getattr(g, f), f"step {i} {f}")
        x2d = steps[i].x.reshape(-1, params.weight.shape[1])
        fwd = ref_norms.NormForward(out=s.ln_out, out_fp32=None, mu=s.ln_mu, rsigma=s.ln_rsigma)
        want = ref_norms.norm_backward(s.dgrad, x2d, fwd, params.ln_weight, normalization=spec.normalization,
                                       zero_centered_gamma=spec.zero_centered_gamma)
        for f_got, f_want in (("dx", "dx"), ("dgamma", "dgamma"), ("dbeta", "dbeta")):
            _assert_same(getattr(s, f_got), getattr(want, f_want), f"step {i} {f_got}")
