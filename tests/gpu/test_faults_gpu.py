"""A case that kills the worker's CUDA context is one error row; a fresh worker runs the rest (harness/pool.py).

Needs a GPU: the fault is a device-side assert (tests.misbehaving.kill_cuda_context), a sticky error after which
every CUDA call of that process fails, so the worker must retire and a fresh process take the next pair.
"""

from __future__ import annotations

import pytest
import torch

from harness import report
from tests.e2e.test_faults import ROOT, finish, start

pytestmark = pytest.mark.gpu

CASES = """
[[grid]]
scheme = "fp8_current"
element = "e4m3"
orientation = "rowwise"
in_dtype = "float32"
shape = [[16, 32], [32, 32], [48, 32]]
seed = 3
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_dead_cuda_context_is_one_error_row_and_the_sweep_goes_on(tmp_path):
    f = tmp_path / "cuda_faults.toml"
    f.write_text(CASES)
    out = tmp_path / "rep"
    rc, stdout, err = finish(start(["-m", "harness", "run", "--cases", str(f), "--device", "cuda", "--out", str(out),
                                    "--no-progress", "--workers", "1", "--case-timeout", "300",
                                    "--backend", "tests.misbehaving:cuda_chaos,reference"], ROOT))
    assert rc == 1, err  # one error row
    df = report.read_results(out)
    bad = df[df["case_id"].str.contains("-32x32-") & (df["backend"] == "cuda_chaos")]
    assert len(bad) == 1 and bad["status"].iloc[0] == "error", bad[["tensor", "status", "reason"]]
    assert "device-side assert" in bad["reason"].iloc[0] or "CUDA" in bad["reason"].iloc[0], bad["reason"].iloc[0]
    rest = df.drop(bad.index)
    # Every other pair, the reference on the same case included, ran in a live context and passed.
    assert set(rest["status"]) <= {"pass", "info"}, rest[["case_id", "backend", "tensor", "status", "reason"]]
    assert len(set(zip(rest["case_id"], rest["backend"], strict=True))) == 5


def context_flags() -> int:
    """Worker task: the scheduling flags of this process's current CUDA context (cuCtxGetFlags)."""
    import ctypes

    torch.zeros(1, device="cuda")
    flags = ctypes.c_uint()
    assert ctypes.CDLL("libcuda.so.1").cuCtxGetFlags(ctypes.byref(flags)) == 0
    return flags.value & 0x07  # CU_CTX_SCHED_MASK


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sweep_workers_wait_for_the_gpu_by_yielding_their_core():
    """harness.pool.yield_while_waiting: a worker's context is created with CU_CTX_SCHED_YIELD (2), where the
    driver's default on a many-core host spins (issue #19); a process that does not ask keeps the default (0)."""
    from harness import pool

    with pool.WorkerPool(1, "cuda") as workers:
        assert workers.start().pool.schedule(context_flags).result(timeout=120) == 2
    from harness import forkserver

    ctx = forkserver.context()
    with ctx.Pool(1) as plain:  # a process of the same start method that never asked
        assert plain.apply(context_flags) == 0
