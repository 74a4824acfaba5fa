"""Builds the host replays of tests/unit/host/: the kernel build's nvcc command and defines, as a host program.

Source: native/_compile.nvcc_command (the one place that knows the kernel build); used by
test_nvfp4_host_replay.py, test_nvfp4_variants_host_replay.py and test_native_norms_host_replay.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from native import _compile

HOST_DIR = Path(__file__).parent / "host"
ROOT = Path(__file__).parents[2]


def build_host_program(source: str, exe: Path, defines: dict, extra: tuple[str, ...] = ()) -> Path:
    """Compile tests/unit/host/<source> with the kernels' options and `defines` into the host executable `exe`.

    The cubin target (-cubin, -gencode <arch>) is dropped; -O2, no FP contraction on the host (-ffp-contract=off:
    every rounding point as written) and `extra` are added; the source is compiled as CUDA (`-x cu` must precede
    it, the last argument) so the headers' __host__ __device__ code and cuda_fp8.h build."""
    host_cmd, skip = [], False
    for a in _compile.nvcc_command(HOST_DIR / source, exe, "sm_90", defines):
        if skip:
            skip = False
        elif a in ("-cubin", "-gencode"):
            skip = a == "-gencode"
        else:
            host_cmd.append(a)
    host_cmd[-1:-1] = ["-O2", *extra, "-Xcompiler", "-ffp-contract=off", "-x", "cu"]
    r = subprocess.run(host_cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, f"nvcc failed: {' '.join(host_cmd)}\n{r.stderr[-3000:]}"
    return exe
