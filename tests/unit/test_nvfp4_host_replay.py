"""The NVFP4 element rounding of native/cuda/nvfp4.cuh, compiled for the CPU, against the reference.

Source: NUMERICS.md §0.5 e2m1_rn, §5.7 (SR rule). nvfp4.cuh's rounding code is __host__ __device__;
the kernels run the device build and this test replays the same source on the host (nvcc, no GPU)
over every bf16 bit pattern, every E2M1 midpoint and its fp32 neighbours, specials and random fp32
patterns, with random SR bytes, and compares each code with reference.nvfp4.e2m1_rn and
reference.stochastic.e2m1_sr. Skipped where nvcc is missing (CI has it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from native import _compile
from reference import QuantConfig, fp32, stochastic
from reference.nvfp4 import e2m1_rn

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("nvfp4_host") / "nvfp4_rounding"
    cmd = _compile.nvcc_command(HERE / "host" / "nvfp4_rounding.cpp", exe, "sm_90", _compile.defines_for(QuantConfig("nvfp4")))
    # The same defines and include path as the kernel build, but a host executable: drop the cubin target.
    drop = {"-cubin", "-gencode"}
    host_cmd, skip = [], False
    for a in cmd:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = a == "-gencode"
            continue
        host_cmd.append(a)
    # A C++ source compiled as CUDA (nvfp4.cuh needs nvcc's __host__ __device__ and cuda_fp8.h); the
    # language flag must precede the source, the last argument.
    host_cmd[-1:-1] = ["-O2", "-Xcompiler", "-ffp-contract=off", "-x", "cu"]
    r = subprocess.run(host_cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, f"nvcc failed: {' '.join(host_cmd)}\n{r.stderr[-3000:]}"
    return exe


def _inputs() -> torch.Tensor:
    """fp32 inputs: every bf16 pattern, E2M1 midpoints and neighbours at several scales, specials, random."""
    bf16 = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
    grid = stochastic.e2m1_grid()
    mids = torch.cat([(grid[:-1] + grid[1:]) * 0.5, grid, torch.tensor([7.0, 8.0, 1e30])])
    scaled = torch.cat([mids * 2.0**k for k in range(-3, 4)])
    inf = torch.full_like(scaled, float("inf"))
    near = torch.cat([scaled, torch.nextafter(scaled, inf), torch.nextafter(scaled, -inf)])
    near = torch.cat([near, -near])
    g = torch.Generator().manual_seed(3)
    rnd = torch.randint(-(1 << 31), 1 << 31, (1 << 18,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    specials = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45, 6.0, -6.0])
    nan_payloads = torch.tensor([0x7F800001, 0xFFC00001 - (1 << 32), 0x7FFFFFFF], dtype=torch.int32).view(torch.float32)
    return torch.cat([bf16, near, rnd, specials, nan_payloads]).contiguous()


def test_e2m1_rn_and_sr_host_replay_match_reference(replay, tmp_path):
    x = _inputs()
    g = torch.Generator().manual_seed(4)
    r = torch.randint(0, 256, (x.numel(),), generator=g, dtype=torch.int64).to(torch.uint8)
    rec = np.zeros(x.numel(), dtype=[("b", "<u4"), ("r", "u1")])
    rec["b"] = fp32.bits(x).numpy().astype(np.uint32)
    rec["r"] = r.numpy()
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(rec.tobytes())
    proc = subprocess.run([str(replay), str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = torch.from_numpy(np.frombuffer(dst.read_bytes(), dtype=np.uint8).reshape(-1, 2).copy())
    assert out.shape[0] == x.numel()
    for col, want, name in ((0, e2m1_rn(x), "e2m1_rn"), (1, stochastic.e2m1_sr(x, r), "e2m1_sr")):
        bad = (out[:, col] != want.to(torch.uint8)).nonzero().flatten()
        assert bad.numel() == 0, (
            f"{name}: {bad.numel()} of {x.numel()} differ; first input bits "
            f"{int(fp32.bits(x[bad[0]])) & 0xFFFFFFFF:#010x} r={int(r[bad[0]])}: host {int(out[bad[0], col])} "
            f"vs reference {int(want[bad[0]])}"
        )
