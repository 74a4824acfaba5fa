"""The norm kernels' arithmetic (native/cuda/norms.cuh), compiled for the CPU, against reference.norms bit for bit.

Source: docs/numerics.md §9.2 (norms: the fp64 pairwise tree S, every fp32 rounding point), §9.3 (dbias).
norms.cuh is __host__ __device__: the kernels of norms.cu run its device build; tests/unit/host/norms_replay.cpp
runs the same source on the host (nvcc, no GPU), emulating one CTA's row sums lane by lane (256 lanes, each
its own stride tree, then the cross-lane levels) and the column sums as one lane over all rows, and writes
ln_out, out32, mu, rsigma, dx, dgamma, dbeta and the dbias column sum. The GPU test
(tests/gpu/test_native_norms.py) checks the kernels themselves. Skipped where nvcc is missing (CI has it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from reference import fp32
from reference import norms as ref_norms
from reference.gemm import round_out
from tests.unit.host_build import build_host_program

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_INT = {torch.float32: np.int32, torch.bfloat16: np.int16, torch.float16: np.int16}


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("norms_host") / "norms_replay"
    return build_host_program("norms_replay.cpp", exe, {})


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()


def _run(replay: Path, tmp: Path, x, gamma, beta, dz, *, rms: bool, zc: bool, eps: float) -> dict:
    dtype = x.dtype
    m, k = x.shape
    src, dst = tmp / "in.bin", tmp / "out.bin"
    src.write_bytes(_raw(x) + _raw(gamma) + _raw(beta) + _raw(dz))
    sfx = next(s for s, d in DTYPES.items() if d == dtype)
    eps_bits = int(fp32.bits(torch.tensor(eps, dtype=torch.float32))) & 0xFFFFFFFF
    args = [str(replay), sfx, str(m), str(k), str(int(rms)), str(int(zc)), hex(eps_bits), str(src), str(dst)]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    buf = memoryview(dst.read_bytes())
    out, pos = {}, 0
    for name, n, dt in (("out", m * k, dtype), ("out_fp32", m * k, torch.float32), ("mu", m, torch.float32),
                        ("rsigma", m, torch.float32), ("dx", m * k, dtype), ("dgamma", k, dtype), ("dbeta", k, dtype),
                        ("dbias", k, dtype)):
        size = n * torch.empty(0, dtype=dt).element_size()
        raw = np.frombuffer(buf[pos:pos + size], dtype=_INT[dt]).copy()
        out[name] = torch.from_numpy(raw).view(dt)
        pos += size
    assert pos == len(buf)
    return out


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    g, w = got.reshape(want.shape), want.contiguous()
    bits = torch.int16 if w.element_size() == 2 else torch.int32
    bad = (g.view(bits) != w.view(bits)).nonzero()
    assert bad.numel() == 0, (f"{what}: {bad.shape[0]} of {w.numel()} differ, first at {tuple(bad[0].tolist())}: "
                              f"{g[tuple(bad[0])].item()!r} vs {w[tuple(bad[0])].item()!r}")


def _inputs(m: int, k: int, dtype: torch.dtype, seed: int, zc: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=g).float())
    x += torch.randn(m, 1, generator=g) * 64  # cancellation in x - mu
    if m > 2:
        x[1] = 3.25  # var = 0
        lo, hi = (-10, 6) if dtype == torch.float16 else (-20, 20)
        x[2] *= torch.exp2(torch.randint(lo, hi + 1, (k,), generator=g).float())
    gamma = torch.randn(k, generator=g) * 0.1 + (0.0 if zc else 1.0)
    beta = torch.randn(k, generator=g) * 0.1
    dz = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-4, 5, (m, 1), generator=g).float())
    return [t.to(dtype) for t in (x, gamma, beta, dz)]


# (M, K): 1 and 3 elements, fewer lanes than 256, exactly 256, one more, non-powers of two, several elements per lane.
SHAPES = [(1, 1), (2, 3), (7, 64), (5, 100), (3, 255), (4, 256), (3, 257), (6, 1000), (3, 3000), (2, 8192)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"m{s[0]}-k{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalization", ref_norms.NORMALIZATIONS)
def test_host_replay_of_the_norm_arithmetic_matches_the_reference_bit_for_bit(replay, tmp_path, normalization,
                                                                               dtype, shape):
    m, k = shape
    act = DTYPES[dtype]
    rms = normalization == "RMSNorm"
    for zc, eps in ((False, 1e-5), (True, 1e-6), (False, 0.5)):
        x, gamma, beta, dz = _inputs(m, k, act, m * 10007 + k, zc)
        got = _run(replay, tmp_path, x, gamma, beta, dz, rms=rms, zc=zc, eps=eps)
        where = f"{normalization} {dtype} {shape} zcg={zc} eps={eps}"
        fwd = ref_norms.norm_forward(x, gamma, None if rms else beta, normalization=normalization, eps=eps,
                                     zero_centered_gamma=zc, out_dtype=act)
        bwd = ref_norms.norm_backward(dz, x, fwd, gamma, normalization=normalization, zero_centered_gamma=zc)
        for name, want in (("out", fwd.out), ("out_fp32", fwd.out_fp32), ("rsigma", fwd.rsigma), ("dx", bwd.dx),
                           ("dgamma", bwd.dgamma), ("dbias", round_out(ref_norms.ordered_sum(dz, 0), act))):
            _same(got[name], want, f"{name}, {where}")
        if not rms:
            _same(got["mu"], fwd.mu, f"mu, {where}")
            _same(got["dbeta"], bwd.dbeta, f"dbeta, {where}")


def test_dbias_rounds_once_from_fp64_to_bf16(replay, tmp_path):
    """Rows 1, 2^-8, 2^-40: S = 1 + 2^-8 + 2^-40 (exact in fp64) lies just above the bf16 midpoint 1 + 2^-8.
    One rounding gives 1 + 2^-7; fp64 -> fp32 -> bf16 would round to the midpoint first and then to even, 1.0."""
    dz = torch.tensor([[1.0], [2.0**-8], [2.0**-40]]).bfloat16()
    x, g = torch.ones(3, 1).bfloat16(), torch.ones(1).bfloat16()
    got = _run(replay, tmp_path, x, g, g, dz, rms=True, zc=False, eps=1e-5)
    assert got["dbias"].item() == 1.0 + 2.0**-7
    assert round_out(ref_norms.ordered_sum(dz, 0), torch.bfloat16).item() == 1.0 + 2.0**-7
    assert ref_norms.ordered_sum(dz, 0).float().bfloat16().item() == 1.0  # the double rounding it avoids
