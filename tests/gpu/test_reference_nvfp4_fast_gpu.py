"""The reference's fast NVFP4 paths on CUDA: e2m1_rn on every fp32 pattern, the RHT's zero sums under cuBLAS.

Source: docs/numerics.md §0.5 e2m1_rn (the threshold table), §0.2.8 (identical bytes on CPU and CUDA), §5.6 (the
RHT: fp64 sums from +0, so a zero sum is +0). reference.nvfp4.e2m1_rn rounds with one fp32 addition of a magic
number; here it is checked on the GPU against the threshold table for all 2^32 fp32 bit patterns (the CPU run of
that check takes minutes, tests/unit/test_nvfp4.py samples it). reference.hadamard takes its fp64 sums with a
matmul (cuBLAS here) and sets the sums of chunks of +-0 inputs to +0 itself: the bytes must equal the CPU's.
"""

from __future__ import annotations

import pytest
import torch

from reference import fp32, hadamard, nvfp4
from tests.unit.test_hadamard import SIGMA

pytestmark = pytest.mark.gpu

_SPAN = 1 << 26  # bit patterns per step


def _threshold_codes(y: torch.Tensor) -> torch.Tensor:
    """The §0.5 table on the device: magnitude code = number of thresholds <= |y| (bits), sign copied off NaN."""
    mag = y.view(torch.int32) & 0x7FFFFFFF
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for t in fp32.bits(nvfp4.e2m1_thresholds()).tolist():
        code += mag >= t
    neg = torch.signbit(y) & ~torch.isnan(y)
    return code | (neg.to(torch.uint8) << 3)


def test_e2m1_rn_on_every_fp32_pattern_on_cuda(cuda_device):
    bad = 0
    for start in range(-(1 << 31), 1 << 31, _SPAN):
        y = torch.arange(start, start + _SPAN, dtype=torch.int64, device=cuda_device).to(torch.int32).view(torch.float32)
        bad += int((nvfp4.e2m1_rn(y) != _threshold_codes(y)).sum())
    assert bad == 0


def test_rht_zero_sums_match_the_cpu_on_cuda(cuda_device):
    """Columns of -0 (every product -0), of +-0, cancellations, a wide span and inf/NaN: CUDA bytes = CPU bytes."""
    cols = [
        [-s * 0.0 for s in SIGMA],
        [-0.0] * 16,
        [0.0] * 15 + [-0.0],
        [1.0] * 16,
        [2.0**60, 1.0, -(2.0**60)] + [0.0] * 13,
        [float("inf")] + [1.0] * 15,
    ]
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.tensor(cols, dtype=torch.float32).t(), torch.randn(16, 64, generator=g)], dim=1)
    x = torch.cat([x, -x], dim=0).to(torch.bfloat16)  # (32, 70)
    cpu = hadamard.rht_transposed(x)
    dev = hadamard.rht_transposed(x.to(cuda_device)).cpu()
    assert torch.equal(cpu.contiguous().view(torch.int16), dev.contiguous().view(torch.int16))
    assert not cpu[:3].signbit().any()
