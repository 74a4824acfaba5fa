"""The sm_90 word encode of native/cuda/nvfp4.cuh (e2m1_rn_word: three roundings and a minimum) over all 2^32
fp32 bit patterns, compiled for the CPU: equal to the per-element software path (rne_sat_mag) everywhere, and to
the reference at both ends of every run of equal codes; its unclamped form (e2m1_rn_word_bounded, the kernels'
path for blocks with every |y| < 7) equal to it on every word of patterns below 7 in magnitude.

Source: docs/numerics.md §0.5 e2m1_rn, §5.4 (packing); docs/performance.md §4.7 (why the encode changed).
tests/unit/host/nvfp4_encode_exhaustive.cpp compares the packed words of the two paths for every pattern
(patterns 8j..8j+7 fill a word, rotated by j so each lane sees every low-bit residue; NaN lanes are fixed up by
the kernels and masked) and writes the runs of the per-element code in pattern order. A run's code is constant
over it, and the reference (RN onto the E2M1 grid) is monotone in |v| for each sign, so checking the reference at
both ends of every run covers every pattern. Skipped where nvcc is missing (CI has it).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from native import _compile
from reference import QuantConfig, fp32
from reference.nvfp4 import e2m1_rn
from tests.unit.host_build import build_host_program

pytestmark = [pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH"), pytest.mark.slow]

NAN = 0xFF  # the replay's code for a NaN pattern


def test_word_encode_matches_software_path_and_reference_on_every_fp32_pattern(tmp_path):
    # -O3 -march=native: a host build of the same source (no fast-math, no contraction); ~20-30 s on one core.
    exe = build_host_program("nvfp4_encode_exhaustive.cpp", tmp_path / "exhaustive",
                             _compile.defines_for(QuantConfig("nvfp4")), extra=("-Xcompiler", "-O3,-march=native"))
    out = tmp_path / "out.bin"
    proc = subprocess.run([str(exe), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    raw = out.read_bytes()
    mismatches, bounded_bad, bounded_words = map(int, np.frombuffer(raw[:24], dtype=np.uint64))
    assert mismatches == 0, f"{mismatches} words of the 2^29 differ between e2m1_rn_word and rne_sat_mag"
    # The unclamped path (|y| < 7): every word of 8 patterns below 7 in magnitude, 0x40E00000 / 8 of each sign.
    assert bounded_words == 2 * (0x40E00000 // 8)
    assert bounded_bad == 0, f"{bounded_bad} of them differ between e2m1_rn_word_bounded and rne_sat_mag"

    runs = np.frombuffer(raw[24:], dtype=np.uint32).reshape(-1, 2).astype(np.int64)
    starts, codes = runs[:, 0], runs[:, 1]
    ends = np.append(starts[1:] - 1, (1 << 32) - 1)
    # +0 .. +inf: codes 0..7 in order, then the positive NaNs; -0 .. -inf: codes 8..15, then the negative NaNs.
    assert codes.tolist() == [*range(8), NAN, *range(8, 16), NAN]
    assert starts[0] == 0 and starts[9] == 0x80000000

    def ref(bits: np.ndarray) -> list[int]:
        x = fp32.from_bits(torch.from_numpy(bits.astype(np.uint32).view(np.int32)))
        return e2m1_rn(x).tolist()

    finite = codes != NAN
    for at in (starts, ends):
        assert ref(at[finite]) == codes[finite].tolist()
        nan_bits = at[~finite]
        assert torch.isnan(fp32.from_bits(torch.from_numpy(nan_bits.astype(np.uint32).view(np.int32)))).all()
    # The code changes exactly at the E2M1 midpoints (ties to the even code) and at the NaN range.
    assert [hex(b) for b in starts[1:8]] == [hex(b) for b in (0x3E800001, 0x3F400000, 0x3FA00001, 0x3FE00000,
                                                               0x40200001, 0x40600000, 0x40A00001)]


def test_sr_word_encode_matches_software_path_on_every_fp32_pattern(tmp_path):
    """e2m1_sr_word (docs/numerics.md §5.7): its floor code by three lines rounded toward zero equals floor_mag for
    every t in [+0, 8), and its packed word equals the per-element e2m1_sr_not_nan codes for every fp32 pattern y in
    [+0, 6] and every 16th word of the others (random bytes from a counter hash; the reference comparison is
    test_nvfp4_host_replay.s). ~30-40 s on one core."""
    exe = build_host_program("nvfp4_sr_exhaustive.cpp", tmp_path / "sr_exhaustive",
                             _compile.defines_for(QuantConfig("nvfp4")), extra=("-Xcompiler", "-O3,-march=native"))
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    floor_bad, word_bad = map(int, proc.stdout.split())
    assert floor_bad == 0, f"{floor_bad} t patterns in [0, 8) where min_lines_biased (rounding down) differs from floor_mag"
    assert word_bad == 0, f"{word_bad} words differ between e2m1_sr_word and e2m1_sr_not_nan"
