"""The NVFP4 variant kernels of native/cuda/nvfp4.cu (4over6, row-scaled; docs/numerics.md §5.10),
their per-unit code compiled for the CPU, against reference.nvfp4.

Source: docs/numerics.md §5.1-§5.5, §5.10. nvfp4.cu's variant code (`four6_block`, `four6_tile`,
`copy_row_amax`, and `encode_block` with a row's own A_g) is __host__ __device__; the GPU runs the
device build (tests/gpu/test_native_nvfp4_variants.py checks it there) and this test replays the same
source on the host (nvcc, no GPU, -ffp-contract=off) over fp32 inputs with normal values, near-ties,
zeros, subnormals, NaN and inf, both copies (the columnwise one read from X through strides), and
compares the amaxes, codes and scales with reference.quantize bit for bit. Skipped where nvcc is
missing (CI has it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from native import _compile
from reference import QuantConfig, quantize
from tests.unit.host_build import build_host_program

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

# (variant, tile, e4m3_max, err_mode): every kernel build the variants have, e4m3_max and err_mode
# each crossed with both tiles.
BUILDS = [
    ("4over6", (1, 16), 448, "mae"),
    ("4over6", (1, 16), 256, "mse"),
    ("4over6", (16, 16), 448, "mse"),
    ("4over6", (16, 16), 256, "mae"),
    ("row_scaled", (1, 16), 448, "mae"),
    ("row_scaled_4over6", (1, 16), 256, "mse"),
    ("row_scaled_4over6", (1, 16), 448, "mae"),
]


def _build(config: QuantConfig, exe: Path) -> Path:
    """tests/unit/host/nvfp4_variants.cpp as a host program with the kernels' defines for `config` (nvfp4.cu's
    kernels still build for the device: its PTX needs sm_80+, hence -arch=sm_90)."""
    return build_host_program("nvfp4_variants.cpp", exe, _compile.defines_for(config), extra=("-arch=sm_90",))


def _inputs(seed: int, m: int, k: int) -> torch.Tensor:
    """fp32 [m, k]: scaled normals, near-ties (multiples of 0.25), an all-zero row and 16x16 tile,
    subnormals, and a few NaN / inf elements (their blocks pick map6, §5.10)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-20, 20, (m, 1), generator=g).float())
    ties = torch.randint(-24, 25, (m, k), generator=g).to(torch.float32) * 0.25
    x = torch.where(torch.rand(m, k, generator=g) < 0.4, ties, x)
    x[1] = 0.0
    x[16:32, 16:32] = 0.0
    x[2, :16] = torch.randint(-8, 9, (16,), generator=g).float() * 2.0**-140  # subnormals
    x[2, 16:32] = torch.tensor([2.0**-149] * 8 + [6.0, 5.0, 3.5, 2.5, 0.75, 0.25, -1.25, -1.75])
    x[4, 3], x[5, 40], x[40 % m, 7] = float("nan"), float("inf"), -float("inf")
    return x


def _run(exe: Path, x: torch.Tensor, orientation: str, mode: int, per_row: int, tmp: Path):
    m, k = x.shape
    rows, cols, rs, cs = (m, k, k, 1) if orientation == "rowwise" else (k, m, 1, k)
    fin, fout = tmp / f"in_{orientation}", tmp / f"out_{orientation}"
    fin.write_bytes(x.contiguous().numpy().tobytes())
    r = subprocess.run([str(exe), str(fin), str(fout), str(rows), str(cols), str(rs), str(cs), str(mode),
                        str(per_row)], capture_output=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    raw = np.frombuffer(fout.read_bytes(), dtype=np.uint8)
    n_amax = rows if per_row else 1
    amax = raw[: 4 * n_amax].view(np.float32)
    data = raw[4 * n_amax : 4 * n_amax + rows * cols // 2].reshape(rows, cols // 2)
    scale = raw[4 * n_amax + rows * cols // 2 :].reshape(rows, cols // 16)
    return torch.from_numpy(amax.copy()), torch.from_numpy(data.copy()), torch.from_numpy(scale.copy())


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"{b[0]}-{b[1][0]}x{b[1][1]}-e{b[2]}-{b[3]}")
def test_variant_host_replay_matches_reference(build, tmp_path):
    variant, tile, e4m3_max, err_mode = build
    kw = {"e4m3_max": e4m3_max, "err_mode": err_mode} if "4over6" in variant else {}
    cfg = QuantConfig("nvfp4", tile=tile, variant=variant, **kw)
    exe = _build(cfg, tmp_path / "nvfp4_variants")
    colwise = variant != "row_scaled_4over6"  # §5.10: row-scaled 4over6 has no columnwise copy
    mode, per_row = int(cfg.four_over_six), int(cfg.row_scaled)
    for seed, (m, k) in enumerate([(48, 64), (32, 80)]):
        x = _inputs(seed, m, k)
        q = quantize(x, cfg, rowwise=True, colwise=colwise)
        for orientation in ("rowwise", "colwise") if colwise else ("rowwise",):
            amax, data, scale = _run(exe, x, orientation, mode, per_row, tmp_path)
            rows, cols = data.shape[0], data.shape[1] * 2
            where = f"{cfg.id} {orientation} {m}x{k}"
            assert torch.equal(amax, getattr(q, f"{orientation}_amax").reshape(-1)), where
            assert torch.equal(scale, getattr(q, f"{orientation}_scale")[:rows, : cols // 16]), where
            assert torch.equal(data, getattr(q, f"{orientation}_data")), where
