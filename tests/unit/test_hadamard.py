"""Random Hadamard Transform (reference/hadamard.py), docs/numerics.md §5.6 and its §8 rows.

The oracle is a plain-Python loop: for each output, a Python float (IEEE fp64) accumulator starting
at +0.0 adds v_i * sigma_i * H[i, j] / 4 in the order i = 0..15, then numpy rounds to fp32 and
ml_dtypes to bf16.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from reference import QuantConfig, SpecViolation, hadamard, quantize

SIGMA = [+1, +1, +1, -1, +1, -1, -1, -1, -1, -1, -1, +1, -1, +1, -1, -1]  # docs/numerics.md §5.6


def h_entry(i: int, j: int) -> int:
    return -1 if bin(i & j).count("1") % 2 else 1


def rht_oracle(x: torch.Tensor) -> np.ndarray:
    """RHT(X^T) as float32 values of bf16 [K, M] for a bf16 X [M, K], by the definition."""
    xv = x.to(torch.float32).numpy().astype(np.float64)
    m, k = xv.shape
    out = np.zeros((k, m), dtype=np.float32)
    for col in range(k):
        for b in range(m // 16):
            v = [float(xv[16 * b + i, col]) for i in range(16)]
            for j in range(16):
                acc = 0.0
                for i in range(16):
                    acc += v[i] * SIGMA[i] * h_entry(i, j) / 4
                with np.errstate(over="ignore"):  # fp64 -> fp32 overflow is inf, as IEEE says
                    out[col, 16 * b + j] = np.float32(np.float32(acc).astype(ml_dtypes.bfloat16))
    return out


def bf16_col(values) -> torch.Tensor:
    """A [16, 1] bf16 column."""
    return torch.tensor(values, dtype=torch.float32).reshape(16, 1).to(torch.bfloat16)


def rht_of_col(values) -> list[float]:
    return hadamard.rht_transposed(bf16_col(values)).to(torch.float32).reshape(16).tolist()


def test_sylvester_orthogonality():
    h = hadamard.hadamard_matrix()
    assert torch.equal(h @ h.t(), 16 * torch.eye(16, dtype=torch.int64))
    assert all(h[i, j].item() == h_entry(i, j) for i in range(16) for j in range(16))


def test_sign_mask_matches_sign_vector():
    assert hadamard.sign_vector().tolist() == SIGMA
    assert hadamard.RHT_SIGN_MASK == 0xD7E8


def test_rht_matrix_is_orthogonal_after_scaling():
    w = hadamard.rht_matrix()
    assert torch.equal(w @ w.t(), torch.eye(16, dtype=torch.float64))


def e(i: int) -> list[float]:
    return [1.0 if t == i else 0.0 for t in range(16)]


def test_rht_e0():
    """docs/numerics.md §8: e_0 -> 0.25 * 1."""
    assert rht_of_col(e(0)) == [0.25] * 16


def test_rht_e3():
    """docs/numerics.md §8: e_3 -> -0.25 * H[3, :] = [-1/4, 1/4, 1/4, -1/4, ...]."""
    got = rht_of_col(e(3))
    assert got[:4] == [-0.25, 0.25, 0.25, -0.25]
    assert got == [-0.25 * h_entry(3, j) for j in range(16)]


def test_rht_all_ones():
    """docs/numerics.md §8: all-ones -> [-1,0,1,0,1,0,-1,0,1,2,1,0,1,0,1,-2]."""
    assert rht_of_col([1.0] * 16) == [-1, 0, 1, 0, 1, 0, -1, 0, 1, 2, 1, 0, 1, 0, 1, -2]


def test_rht_bf16_tie_to_even():
    """docs/numerics.md §8: e_0 + 2^-8 e_1 -> even j: 0.25 (tie to even), odd j: 0.2490234375."""
    v = e(0)
    v[1] = 2.0**-8
    got = rht_of_col(v)
    assert got[0::2] == [0.25] * 8
    assert got[1::2] == [0.2490234375] * 8


def test_zero_sums_are_positive_zero():
    """A zero output is +0 (accumulator starts at +0): all -0 inputs and exact cancellations."""
    out = hadamard.rht_transposed(bf16_col([-0.0] * 16))
    assert (out.view(torch.int16) == 0).all()
    got = hadamard.rht_transposed(bf16_col([1.0] * 16)).to(torch.float32).reshape(16)
    zeros = got == 0
    assert zeros.any()
    assert (got[zeros].view(torch.int32) == 0).all()


def test_all_negative_zero_products_sum_to_positive_zero():
    """v_i = -sigma_i * 0.0 makes every term of output j = 0 a -0; summed from +0 in order the result is +0."""
    out = hadamard.rht_transposed(bf16_col([-s * 0.0 for s in SIGMA]))
    assert out[0, 0].view(torch.int16).item() == 0
    assert (out.view(torch.int16) == 0).all()


def test_zero_sums_are_positive_zero_whatever_the_matmul_start(monkeypatch):
    """A matmul whose accumulator starts from the first product (not +0) gives -0 for all -0 products; the
    chunks of +-0 inputs are still +0, and cancellations stay +0."""

    def first_product_matmul(a, b):  # a (16 j, 16 i), b (nb, 16 i, K): acc = term 0, then + terms 1..15
        acc = a[None, :, 0, None] * b[:, 0:1, :]
        for i in range(1, a.shape[1]):
            acc = acc + a[None, :, i, None] * b[:, i : i + 1, :]
        return acc

    cols = [[-s * 0.0 for s in SIGMA], [-0.0] * 16, [1.0] * 16, [0.0] * 15 + [-0.0]]
    x = torch.tensor(cols, dtype=torch.float32).t().contiguous().to(torch.bfloat16)
    monkeypatch.setattr(torch, "matmul", first_product_matmul)
    got = hadamard.rht_transposed(x).to(torch.float32)
    monkeypatch.undo()
    assert first_product_matmul(torch.ones(16, 16), torch.full((1, 16, 1), -0.0)).signbit().all()
    np.testing.assert_array_equal(got.numpy().view(np.int32), rht_oracle(x).view(np.int32))
    assert not got.signbit()[[0, 1, 3]].any()


def test_linearity_on_exact_inputs():
    """RHT(a X + b Y) = a RHT(X) + b RHT(Y) when every value is exact (small integers)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-8, 9, (32, 8), generator=g).to(torch.bfloat16)
    y = torch.randint(-8, 9, (32, 8), generator=g).to(torch.bfloat16)
    rx = hadamard.rht_transposed(x).to(torch.float64)
    ry = hadamard.rht_transposed(y).to(torch.float64)
    rxy = hadamard.rht_transposed((2 * x.float() - 3 * y.float()).to(torch.bfloat16)).to(torch.float64)
    assert torch.equal(rxy, 2 * rx - 3 * ry)
    # and equals the exact product W^T v per 16-row chunk (all values are small multiples of 1/4)
    w = torch.tensor([[SIGMA[i] * h_entry(i, j) / 4 for j in range(16)] for i in range(16)], dtype=torch.float64)
    v = x.to(torch.float64).reshape(2, 16, 8)  # (chunk, i, column)
    exact = torch.einsum("ij,bic->cbj", w, v).reshape(8, 32)
    assert torch.equal(rx, exact)


def test_matches_oracle_on_random_bf16():
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(64, 24, generator=g) * torch.exp(3 * torch.randn(64, 24, generator=g))).to(torch.bfloat16)
    got = hadamard.rht_transposed(x).to(torch.float32).numpy()
    np.testing.assert_array_equal(got.view(np.int32), rht_oracle(x).view(np.int32))


def test_order_matters_wide_span_matches_ordered_oracle():
    """Chunks whose magnitudes span > 2^41 are summed in the contract order i = 0..15 (not exactly)."""
    cols = [
        [2.0**60, 1.0, -(2.0**60)] + [0.0] * 13,  # 2^58 + 1/4 loses the 1/4, exact sum would keep it
        [1.0, 2.0**60, 2.0**-3] + [-(2.0**60)] + [0.0] * 12,
        [2.0**-100] + [3.0 * 2.0**-60] * 5 + [2.0**30] * 10,
        [2.0**-133, 2.0**-90] + [1.5 * 2.0**120] + [0.0] * 13,  # bf16 subnormal
        [(-1) ** i * 2.0 ** (7 * i - 50) for i in range(16)],
    ]
    x = torch.tensor(cols, dtype=torch.float32).t().contiguous().to(torch.bfloat16)  # (16, 5)
    got = hadamard.rht_transposed(x).to(torch.float32).numpy()
    want = rht_oracle(x)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
    # column 0, output j = 0: the exact sum is 2^58 + 1/4 - 2^58 = 1/4; in order, 2^58 + 1/4 rounds to 2^58
    assert got[0, 0] == 0.0


def test_result_does_not_depend_on_the_matmul_order(monkeypatch):
    """Chunks the fast matmul might round differently are recomputed in the contract order: with a
    matmul that sums i = 15..0 instead, the bytes still match the ordered oracle."""

    def reversed_matmul(a, b):  # a (16 j, 16 i), b (nb, 16 i, K) -> (nb, 16 j, K), summed i = 15..0
        acc = torch.zeros(b.shape[0], a.shape[0], b.shape[2], dtype=b.dtype)
        for i in reversed(range(a.shape[1])):
            acc = acc + a[None, :, i, None] * b[:, i : i + 1, :]
        return acc

    cols = [
        [2.0**60, 1.0, -(2.0**60)] + [0.0] * 13,
        [1.0] + [0.0] * 14 + [2.0**70],
        [2.0**-100] + [3.0 * 2.0**-60] * 5 + [2.0**30] * 10,
        [float(v) for v in range(16)],
    ]
    x = torch.tensor(cols, dtype=torch.float32).t().contiguous().to(torch.bfloat16)
    monkeypatch.setattr(torch, "matmul", reversed_matmul)
    got = hadamard.rht_transposed(x).to(torch.float32).numpy()
    monkeypatch.undo()
    np.testing.assert_array_equal(got.view(np.int32), rht_oracle(x).view(np.int32))


def test_ordered_sum_flags():
    """Flag chunks whose non-zero exponents span more than 40 binades, or that hold inf/NaN."""

    def col(*vals):
        return torch.tensor(list(vals) + [0.0] * (16 - len(vals))).reshape(1, 16, 1).to(torch.bfloat16)

    flag = lambda *v: bool(hadamard._chunk_span(col(*v))[0].item())  # noqa: E731
    zero = lambda *v: hadamard._chunk_span(col(*v))[1] is not None  # noqa: E731
    assert not flag()  # all zero
    assert zero() and zero(-0.0, -0.0) and not zero(2.0**-133) and not zero(-0.0, float("nan"))
    assert not flag(1.0, 2.0**-40)  # span 40
    assert not flag(1.5, 2.0**-40)
    assert flag(1.0, 2.0**-41)  # span 41
    assert flag(float("inf"), 1.0) and flag(float("nan"))
    assert not flag(2.0**-126, 2.0**-133)  # bf16 subnormal counted at its lowest exponent
    assert flag(2.0**-90, 2.0**-133)


def test_nonfinite_inputs_match_oracle():
    inf, nan = float("inf"), float("nan")
    cols = [
        [inf] + [1.0] * 15,
        [inf, -inf] + [0.0] * 14,
        [nan] + [2.0] * 15,
        [3.0e38] * 16,  # fp32 overflow of the sum (bf16 max is ~3.39e38)
    ]
    x = torch.tensor(cols, dtype=torch.float32).t().contiguous().to(torch.bfloat16)
    got = hadamard.rht_transposed(x).to(torch.float32).numpy()
    want = rht_oracle(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.int32), want[ok].view(np.int32))


def test_chunking_does_not_matter():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(96, 40, generator=g).to(torch.bfloat16)
    a = hadamard.rht_transposed(x, chunk_rows=16)
    b = hadamard.rht_transposed(x, chunk_rows=1024)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_rht_needs_bf16():
    with pytest.raises(SpecViolation, match="bfloat16"):
        hadamard.rht_transposed(torch.ones(16, 16))
    with pytest.raises(SpecViolation, match=r"RHT.*bfloat16.*§5\.6"):
        quantize(torch.ones(16, 16), QuantConfig("nvfp4", rht=True), rowwise=True, colwise=True)


def test_rht_needs_16_row_chunks():
    with pytest.raises(SpecViolation, match="16-row"):
        hadamard.rht_transposed(torch.ones(8, 16, dtype=torch.bfloat16))
