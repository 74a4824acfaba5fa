"""The NVFP4 element rounding of native/cuda/nvfp4.cuh, compiled for the CPU, against the reference.

Source: docs/numerics.md §0.5 e2m1_rn, §5.7 (SR rule). nvfp4.cuh's rounding code is __host__ __device__;
the kernels run the device build and this test replays the same source on the host (nvcc, no GPU)
over every bf16 bit pattern, every E2M1 midpoint and its fp32 neighbours, specials and random fp32
patterns, with random SR bytes, and compares each code with reference.nvfp4.e2m1_rn and
reference.stochastic.e2m1_sr: the per-element functions and the word encodes the kernels run (e2m1_rn_word,
e2m1_sr_word, 8 inputs a word); and nvfp4.cu's SR block encode with its one Philox draw a block (§5.7) against
reference.quantize. Skipped where nvcc is missing (CI has it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from native import _compile
from reference import QuantConfig, fp32, hadamard, quantize, stochastic
from reference.nvfp4 import e2m1_rn
from tests.unit.host_build import build_host_program

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _build(source: str, exe: Path) -> Path:
    """Build tests/unit/host/<source> as a host program with the kernels' nvfp4 defines."""
    return build_host_program(source, exe, _compile.defines_for(QuantConfig("nvfp4")))


@pytest.fixture(scope="module")
def replay(tmp_path_factory) -> Path:
    return _build("nvfp4_rounding.cpp", tmp_path_factory.mktemp("nvfp4_host") / "nvfp4_rounding")


@pytest.fixture(scope="module")
def rht_replay(tmp_path_factory) -> Path:
    return _build("nvfp4_rht.cpp", tmp_path_factory.mktemp("nvfp4_host") / "nvfp4_rht")


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
    out = torch.from_numpy(np.frombuffer(dst.read_bytes(), dtype=np.uint8).reshape(-1, 4).copy())
    assert out.shape[0] == x.numel()
    rn, sr = e2m1_rn(x), stochastic.e2m1_sr(x, r)
    for col, want, name in ((0, rn, "e2m1_rn"), (1, sr, "e2m1_sr"), (2, rn, "e2m1_rn_word"), (3, sr, "e2m1_sr_word")):
        bad = (out[:, col] != want.to(torch.uint8)).nonzero().flatten()
        assert bad.numel() == 0, (
            f"{name}: {bad.numel()} of {x.numel()} differ; first input bits "
            f"{int(fp32.bits(x[bad[0]])) & 0xFFFFFFFF:#010x} r={int(r[bad[0]])}: host {int(out[bad[0], col])} "
            f"vs reference {int(want[bad[0]])}"
        )


# rht_path's values (nvfp4.cuh RhtPath).
RHT_PATHS = {0: "fp32 butterfly", 1: "fp64 butterfly", 2: "fp64 ordered"}


def _rht_chunks() -> torch.Tensor:
    """bf16 chunks (N, 16) that reach every path of rht16: exponent spreads around the fp32 (12) and
    fp64 (41) exactness bounds, fp32 overflow, inf / NaN (alone, mixed with -inf), signed zeros,
    subnormals, all-zero chunks, and plain Gaussian chunks."""
    g = torch.Generator().manual_seed(5)
    n = 4096
    sig = torch.randint(128, 256, (n, 16), generator=g).to(torch.float64) / 128
    sgn = torch.where(torch.rand(n, 16, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    spread = torch.tensor([0, 6, 11, 12, 13, 20, 40, 41, 42, 60, 200], dtype=torch.float64)
    span = spread[torch.arange(n) % spread.numel()].unsqueeze(1)
    lo = torch.randint(-133, 120, (n, 1), generator=g).to(torch.float64)
    e = lo + torch.floor(torch.rand(n, 16, generator=g, dtype=torch.float64) * (span + 1))
    e[:, 0], e[:, 1] = lo[:, 0], (lo + span)[:, 0]  # both ends of the span present
    x = sgn * sig * torch.pow(2.0, e.clamp(max=127))
    x[::7, 3] = 0.0
    x[::11, 5] = -0.0
    x[1::13] = torch.randn(x[1::13].shape, generator=g, dtype=torch.float64)
    specials = torch.zeros(8, 16, dtype=torch.float64)
    specials[1] = -0.0
    specials[2, 4] = float("inf")
    specials[3, 4], specials[3, 9] = float("inf"), float("-inf")
    specials[4, 0] = float("nan")
    specials[5] = 3.0e38  # fp32 partial sums would overflow
    specials[6, ::2] = -0.0
    specials[6, 1] = 2.0**-133  # bf16 subnormal
    specials[7] = torch.randn(16, generator=g, dtype=torch.float64) * 2.0**-128
    # Output 0 sums the terms t_i = sigma_i v_i / 4 with coefficient +1: two chunks whose exact sum
    # lies just above a bf16 tie, where a sum that drops the finest term lands on the tie and rounds
    # to even instead. (a) Spread 15: the fp32 butterfly's ((t4+t5)+(t6+t7)) drops 2^-19; only the
    # exact paths give 2^-4 (1 + 2^-7). (b) Spread 54: the ordered fp64 sum drops every 2^-54 (the
    # contract: 1.0), a butterfly keeps their sum (1 + 2^-7).
    t_a = [15.875] * 7 + [2.0**-12 + 2.0**-19] + [-15.875] * 7 + [2.0**-4]
    t_b = [1.0, 2.0**-8, 2.0**-24] + [2.0**-54] * 13
    sigma = hadamard.sign_vector().to(torch.float64)
    crafted = torch.tensor([t_a, t_b], dtype=torch.float64) * 4 * sigma
    return torch.cat([x, specials, crafted, -crafted]).to(torch.bfloat16)


def _rht_replay(rht_replay, tmp_path, chunks: torch.Tensor) -> np.ndarray:
    """The host replay's record per chunk (nvfp4_rht.cpp): outputs, rht_path, the packed words' path, rht16_amax."""
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(fp32.bits(chunks.to(torch.float32)).numpy().astype(np.uint32).tobytes())
    proc = subprocess.run([str(rht_replay), str(src), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rec = np.frombuffer(dst.read_bytes(), dtype=[("h", "<u4", (16,)), ("path", "u1"), ("packed_path", "u1"),
                                                 ("amax", "<u4")])  # fmt: skip
    assert rec.shape[0] == chunks.shape[0]
    return rec


def test_rht16_host_replay_matches_reference_on_every_path(rht_replay, tmp_path):
    """docs/numerics.md §5.6: rht16 (all three paths: exact fp32 / fp64 butterflies, ordered fp64 sums)
    equals reference.hadamard on the same chunks, bit for bit (NaN: any NaN)."""
    chunks = _rht_chunks()
    rec = _rht_replay(rht_replay, tmp_path, chunks)
    paths = np.bincount(rec["path"], minlength=len(RHT_PATHS))
    assert all(paths[i] > 0 for i in RHT_PATHS), f"paths taken: { {name: int(paths[i]) for i, name in RHT_PATHS.items()} }"
    host = torch.from_numpy(rec["h"].astype(np.int64)).to(torch.int32).view(torch.float32)
    # hadamard.rht_rows transforms the 16-row chunks of an [M, K] input: chunk n is column n.
    want = hadamard.rht_rows(chunks.t().contiguous()).t().to(torch.float32)
    both_nan = torch.isnan(host) & torch.isnan(want)
    bad = ((fp32.bits(host) != fp32.bits(want)) & ~both_nan).any(dim=1).nonzero().flatten()
    assert bad.numel() == 0, (
        f"{bad.numel()} of {chunks.shape[0]} chunks differ; first chunk {int(bad[0])} "
        f"(path {RHT_PATHS[int(rec['path'][bad[0]])]}): {chunks[bad[0]].tolist()}"
    )


def test_post_rht_amax_pieces_match_rht16_and_the_reference(rht_replay, tmp_path):
    """docs/numerics.md §5.6, §0.1: the post-RHT amax pass's pieces on the host. rht16_amax(v) (the fp32 path's
    unscaled butterfly, rounded once) is the NaN-ignoring amax of the reference's bf16 RHT outputs of the chunk, and
    the path chosen from the packed words (bf16_pair_low_exponents, each chunk in the low or the high halves) is
    rht_path's, on every path. Chunk pairs include a zero chunk beside a non-zero one and subnormals beside zeros."""
    chunks = _rht_chunks()
    extra = torch.zeros(6, 16, dtype=torch.bfloat16)
    extra[1, 3] = 2.0**-133  # the smallest subnormal beside a zero chunk (its pair)
    extra[2, :8] = -(2.0**-133)
    extra[3] = 2.0**-126
    extra[4, 0], extra[5, 15] = 3.0e38, 2.0**-100  # an overflowing chunk beside a tiny one
    chunks = torch.cat([chunks, extra])
    rec = _rht_replay(rht_replay, tmp_path, chunks)
    assert np.array_equal(rec["packed_path"], rec["path"]), (
        f"{int((rec['packed_path'] != rec['path']).sum())} chunks take another path from the packed words; first "
        f"{int(np.argmax(rec['packed_path'] != rec['path']))}")
    want = hadamard.rht_rows(chunks.t().contiguous()).t().to(torch.float32)
    want_amax = torch.where(torch.isnan(want), 0.0, want.abs()).amax(dim=1)  # §0.1: NaN ignored
    got = torch.from_numpy(rec["amax"].astype(np.int64)).to(torch.int32).view(torch.float32)
    bad = (fp32.bits(got) != fp32.bits(want_amax)).nonzero().flatten()
    paths = np.bincount(rec["path"], minlength=len(RHT_PATHS))
    assert all(paths[i] > 0 for i in RHT_PATHS)
    assert bad.numel() == 0, (
        f"{bad.numel()} of {chunks.shape[0]} chunk amaxes differ; first chunk {int(bad[0])} "
        f"(path {RHT_PATHS[int(rec['path'][bad[0]])]}): {float(got[bad[0]])} vs {float(want_amax[bad[0]])}"
    )


def test_sign_words_from_loaded_16_bit_words_match_the_widened_values(tmp_path):
    """The quantize kernel's sign words of 16-bit inputs, gathered from the words as loaded by byte permutes
    (nvfp4.cu row_signs_16 / column_signs_16, nvfp4.cuh sign_masks_16 with byte_perm_sx's host emulation of PRMT),
    equal the funnel-shifted signs of the widened values (block_signs) for every pattern of the 16 sign bits of a
    codes word, bf16 and f16, other bits random. docs/numerics.md §5.4 (code sign bit = the input's sign)."""
    # nvfp4.cu's kernels still build for the device: their PTX needs sm_80+ (as the variants' host replay).
    exe = build_host_program("nvfp4_sign_words.cpp", tmp_path / "sign_words", _compile.defines_for(QuantConfig("nvfp4")),
                             extra=("-arch=sm_90",))
    out = tmp_path / "out.bin"
    proc = subprocess.run([str(exe), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    row_bad, col_bad, words = np.frombuffer(out.read_bytes(), dtype="<u8").tolist()
    assert words == 2 * 6 * (1 << 16)
    assert (row_bad, col_bad) == (0, 0), f"sign bits that differ: rowwise {row_bad}, colwise {col_bad} of {words} words"


def test_scale_padding_zeroes_exactly_the_padding_for_any_grid(tmp_path):
    """The scales' zero padding (nvfp4.cu zero_scale_padding, docs/numerics.md §5.9: padding is zero), replayed on the
    host for every thread of grids of 1, 5 and 256 threads over a scale tensor holding 0xAB: each copy's padded
    [rows, stride] tensor (reference.layouts) of NVFP4 shapes with and without padding ends with every byte outside
    the valid [rows, K/16] region zero and every byte inside it untouched."""
    from reference.layouts import copy_geometry

    exe = build_host_program("nvfp4_scale_padding.cpp", tmp_path / "scale_padding",
                             _compile.defines_for(QuantConfig("nvfp4")), extra=("-arch=sm_90",))  # fmt: skip
    cfg = QuantConfig("nvfp4")
    cases = []
    for m, k in [(16, 16), (48, 80), (144, 208), (128, 128), (400, 656), (16, 4112), (256, 64)]:
        for o in ("rowwise", "colwise"):
            g = copy_geometry(cfg, o, m, k)
            for threads in (1, 5, 256):
                cases.append((g.scale_padded_shape, g.scale_valid_shape, threads))
    lines = "".join(f"{p[0]} {p[1]} {v[0]} {v[1]} {t}\n" for p, v, t in cases)
    out = tmp_path / "out.bin"
    proc = subprocess.run([str(exe), str(out)], input=lines, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data, at = out.read_bytes(), 0
    padded_somewhere = 0
    for padded, valid, threads in cases:
        buf = np.frombuffer(data, dtype=np.uint8, count=padded[0] * padded[1], offset=at).reshape(padded)
        at += buf.size
        want = np.zeros(padded, dtype=np.uint8)
        want[: valid[0], : valid[1]] = 0xAB
        assert np.array_equal(buf, want), f"padded {padded}, valid {valid}, {threads} threads"
        padded_somewhere += tuple(padded) != tuple(valid)
    assert at == len(data) and 0 < padded_somewhere < len(cases)  # shapes with padding and shapes without


# ---- the SR draw of the quantize kernel's blocks (§5.7) --------------------------------------------------------


def _sr_inputs(seed: int, m: int, k: int) -> torch.Tensor:
    """fp32 [m, k]: scaled normals, near-ties (multiples of 0.25, where most bytes decide), an all-zero row,
    subnormals, a NaN and an inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 6, (m, 1), generator=g).float())
    ties = torch.randint(-24, 25, (m, k), generator=g).to(torch.float32) * 0.25
    x = torch.where(torch.rand(m, k, generator=g) < 0.4, ties, x)
    x[1] = 0.0
    x[2, :16] = torch.randint(-8, 9, (16,), generator=g).float() * 2.0**-140  # subnormals
    x[4, 3], x[5, 40] = float("nan"), float("inf")
    return x


@pytest.fixture(scope="module")
def sr_replay(tmp_path_factory) -> Path:
    """nvfp4_sr_draw.cpp with the defines of the 1x16 SR build (nvfp4.cu's kernels still build for the device: its
    PTX needs sm_80+, hence -arch=sm_90)."""
    exe = tmp_path_factory.mktemp("nvfp4_host") / "sr_draw"
    defines = _compile.defines_for(QuantConfig("nvfp4", stochastic=True))
    return build_host_program("nvfp4_sr_draw.cpp", exe, defines, extra=("-arch=sm_90",))


@pytest.mark.parametrize(
    "seed,stream", [(0, 0), (2**40 + 17, 6), (2**64 - 1, 0xFFFFFFFF)], ids=["zero", "seed-hi-word", "max-wrap"]
)
def test_sr_block_draw_host_replay_matches_reference(sr_replay, seed, stream, tmp_path):
    """encode_block<true> of nvfp4.cu (one Philox call per 16-element block, words x0..x3 to elements 0-3, 4-7, 8-11,
    12-15) on the host, both copies of X (the columnwise one read through strides, stream + 1 mod 2^32), against
    reference.quantize with SR, codes and scales bit for bit."""
    cfg = QuantConfig("nvfp4", stochastic=True)
    for i, (m, k) in enumerate([(48, 64), (32, 80)]):
        x = _sr_inputs(i, m, k)
        q = quantize(x, cfg, rowwise=True, colwise=True, rng=(seed, stream))
        fin = tmp_path / "in"
        fin.write_bytes(x.contiguous().numpy().tobytes())
        for orientation, (rows, cols, rs, cs), s in (("rowwise", (m, k, k, 1), stream),
                                                     ("colwise", (k, m, 1, k), (stream + 1) & 0xFFFFFFFF)):  # fmt: skip
            fout = tmp_path / f"out_{orientation}"
            r = subprocess.run([str(sr_replay), str(fin), str(fout), str(rows), str(cols), str(rs), str(cs), str(seed),
                                str(s)], capture_output=True)  # fmt: skip
            assert r.returncode == 0, r.stderr
            raw = np.frombuffer(fout.read_bytes(), dtype=np.uint8)
            data = torch.from_numpy(raw[: rows * cols // 2].reshape(rows, cols // 2).copy())
            scale = torch.from_numpy(raw[rows * cols // 2 :].reshape(rows, cols // 16).copy())
            where = f"{orientation} {m}x{k} seed={seed:#x} stream={s:#x}"
            assert torch.equal(scale, getattr(q, f"{orientation}_scale")[:rows, : cols // 16]), where
            assert torch.equal(data, getattr(q, f"{orientation}_data")), where
