"""Native FP8 quantizers (fp8_current, fp8_delayed, mxfp8, fp8_block) against the golden reference, byte for byte.

Source: docs/numerics.md §1-§4, §0.3 (a GPU test must see a subnormal result survive), §8 vectors.
Every toggle (pow2 / fp32 scales, eps, e8m0 ceil / floor, e4m3 / e5m2, 1-D / 2-D tiles, rowwise /
colwise copies), fp32 / bf16 / fp16 inputs, shapes that are not multiples of 128 (fp8_block partial
tiles), tall / skinny, misaligned and non-contiguous inputs, 8192x8192. Small cases compare with the
reference on CPU; the 8192x8192 cases with the reference on the GPU (identical bits by contract).
"""

from __future__ import annotations

import math
import struct
import zlib

import pytest
import torch

import native
import reference
from reference import casts
from reference.formats import E4M3, QuantConfig
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor, SpecViolation

from .poison import assert_padded_scales_from_empty, dirty_empty

pytestmark = pytest.mark.gpu

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def _f(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _b(v: torch.Tensor) -> list[int]:
    """fp32 bit patterns of a tensor, as unsigned ints."""
    return [int(u) & 0xFFFFFFFF for u in v.detach().cpu().to(torch.float32).contiguous().view(torch.int32).flatten()]


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def make_input(dist: str, shape: tuple[int, int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Seeded CPU input of `dtype`. dist: normal | scaled | special | grid."""
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    if dist in ("scaled", "special", "grid"):
        # Per-row and per-32-column powers of two, so row blocks and column blocks both see many binades.
        er = torch.randint(-24, 25, (m, 1), generator=g)
        ec = torch.randint(-24, 25, (1, math.ceil(k / 32)), generator=g).repeat_interleave(32, dim=1)[:, :k]
        x = x * torch.pow(2.0, (er + ec).to(torch.float64))
    if dist == "grid":
        # E4M3 grid points and midpoints between neighbours (ties after a power-of-two scale).
        codes = torch.randint(0, 0x7E, (m, k), generator=g)
        lo = casts.decode(codes.to(torch.uint8), E4M3).to(torch.float64)
        hi = casts.decode((codes + 1).to(torch.uint8), E4M3).to(torch.float64)
        pick = torch.randint(0, 3, (m, k), generator=g)
        v = torch.where(pick == 0, lo, torch.where(pick == 1, (lo + hi) / 2, hi))
        sign = torch.where(torch.rand(m, k, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        e = torch.randint(-6, 7, (m, 1), generator=g).to(torch.float64)
        x = sign * v * torch.pow(2.0, e)
    if dist == "special":
        r = torch.rand(m, k, generator=g)
        specials = [float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40, -1e-45, 3.4e38, -1e30]
        for i, s in enumerate(specials):
            x = torch.where((r >= 0.004 * i) & (r < 0.004 * (i + 1)), torch.tensor(s, dtype=torch.float64), x)
        if m > 2:
            x[1] = 0.0  # an all-zero row
            x[2] = torch.randn(k, generator=g, dtype=torch.float64) * 1e-37  # a row of tiny blocks -> v_inf
        if k > 3:
            x[:, 3] = -0.0  # a column of -0.0
    return x.to(torch.float32).to(dtype)


# --------------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------------


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t.contiguous()


def assert_same(cand: QuantizedTensor, gold: QuantizedTensor, what: str = "") -> None:
    """Every field (data, scales incl. zero padding, amax) identical bit for bit."""
    for name in QuantizedTensor.TENSOR_FIELDS:
        a, b = getattr(cand, name), getattr(gold, name)
        assert (a is None) == (b is None), f"{what} {name}: native {'None' if a is None else 'set'}, reference {'None' if b is None else 'set'}"
        if a is None:
            continue
        a = a.detach().cpu()
        b = b.detach().cpu()
        assert a.dtype == b.dtype, f"{what} {name}: dtype {a.dtype} != {b.dtype}"
        assert tuple(a.shape) == tuple(b.shape), f"{what} {name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        diff = _as_bits(a) != _as_bits(b)
        if bool(diff.any()):
            idx = tuple(int(i) for i in diff.nonzero()[0])
            n = int(diff.sum())
            raise AssertionError(
                f"{what} {name}: {n} of {diff.numel()} differ; first at {idx}: native {a[idx].item()!r} "
                f"({int(_as_bits(a)[idx]) & 0xFFFFFFFF:#x}) vs reference {b[idx].item()!r} "
                f"({int(_as_bits(b)[idx]) & 0xFFFFFFFF:#x})"
            )


def check_vs_reference(x_cpu: torch.Tensor, cfg: QuantConfig, rowwise=True, colwise=True, ref_device="cpu"):
    gold = reference.quantize(x_cpu.to(ref_device), cfg, rowwise=rowwise, colwise=colwise)
    cand = native.quantize(x_cpu.cuda(), cfg, rowwise=rowwise, colwise=colwise)
    torch.cuda.synchronize()
    assert_same(cand, gold, f"{cfg.id} {tuple(x_cpu.shape)} {x_cpu.dtype}")
    return cand, gold


# --------------------------------------------------------------------------------------------
# configs and shapes
# --------------------------------------------------------------------------------------------

CURRENT = [
    QuantConfig("fp8_current"),
    QuantConfig("fp8_current", element="e5m2"),
    QuantConfig("fp8_current", pow2_scales=True),
    QuantConfig("fp8_current", pow2_scales=True, eps=1.0),
]
BLOCK = [
    QuantConfig("fp8_block"),
    QuantConfig("fp8_block", pow2_scales=False),
    QuantConfig("fp8_block", element="e5m2", pow2_scales=False, eps=1e-3),
    QuantConfig("fp8_block", tile=(128, 128)),
    QuantConfig("fp8_block", tile=(128, 128), element="e5m2", pow2_scales=False),
]
MX = [
    QuantConfig("mxfp8"),
    QuantConfig("mxfp8", element="e5m2"),
    QuantConfig("mxfp8", e8m0_rule="floor"),
    QuantConfig("mxfp8", element="e5m2", e8m0_rule="floor"),
    QuantConfig("mxfp8", tile=(32, 32)),
    QuantConfig("mxfp8", tile=(32, 32), element="e5m2", e8m0_rule="floor"),
]
DELAYED = [QuantConfig("fp8_delayed"), QuantConfig("fp8_delayed", element="e5m2"), QuantConfig("fp8_delayed", amax_history_len=8)]
DELAYED += [
    QuantConfig("fp8_delayed", amax_history_len=4, **kw)
    for kw in ({}, {"margin": 1}, {"element": "e5m2"}, {"amax_compute_algo": "most_recent"})
]
# (160, 288): interior 128x128 tiles (the kernels' FULL build) and edge tiles in one launch, vector-aligned.
ANY_SHAPES = [(1, 1), (3, 200), (130, 257), (160, 288), (256, 384), (257, 129), (2048, 24)]
MX_SHAPES = [(32, 32), (64, 96), (96, 4128), (160, 288), (256, 384), (4096, 32)]
DISTS = ["normal", "scaled", "special", "grid"]


def _seed(cfg: QuantConfig, shape, dist: str) -> int:
    return zlib.crc32(f"{cfg.id}-{shape}-{dist}".encode()) & 0xFFFF


def _cases(configs, shapes):
    out = []
    for cfg in configs:
        for dt in DTYPES:
            for shape in shapes:
                for dist in DISTS:
                    out.append(pytest.param(cfg, dt, shape, dist, id=f"{cfg.id}-{dt}-{shape[0]}x{shape[1]}-{dist}"))
    return out


@pytest.mark.parametrize("cfg, dt, shape, dist", _cases(CURRENT, ANY_SHAPES))
def test_fp8_current_matches_reference(cfg, dt, shape, dist):
    check_vs_reference(make_input(dist, shape, DTYPES[dt], _seed(cfg, shape, dist)), cfg)


@pytest.mark.parametrize("cfg, dt, shape, dist", _cases(BLOCK, ANY_SHAPES))
def test_fp8_block_matches_reference(cfg, dt, shape, dist):
    check_vs_reference(make_input(dist, shape, DTYPES[dt], _seed(cfg, shape, dist)), cfg)


@pytest.mark.parametrize("cfg, dt, shape, dist", _cases(MX, MX_SHAPES))
def test_mxfp8_matches_reference(cfg, dt, shape, dist):
    check_vs_reference(make_input(dist, shape, DTYPES[dt], _seed(cfg, shape, dist)), cfg)


@pytest.mark.parametrize(
    "cfg",
    [CURRENT[0], BLOCK[0], BLOCK[3], MX[0], MX[4], QuantConfig("fp8_delayed")],
    ids=lambda c: c.id,
)
@pytest.mark.parametrize("rowwise, colwise", [(True, False), (False, True)], ids=["rowwise", "colwise"])
def test_single_orientation(cfg, rowwise, colwise):
    x = make_input("special", (160, 224), torch.bfloat16, 7)
    check_vs_reference(x, cfg, rowwise=rowwise, colwise=colwise)


@pytest.mark.parametrize("cfg", [BLOCK[0], BLOCK[1], BLOCK[3], MX[0], MX[4]], ids=lambda c: c.id)
@pytest.mark.parametrize("shape", [(130, 258), (258, 130), (34, 4130)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rowwise, colwise", [(True, True), (True, False), (False, True)], ids=["both", "row", "col"])
def test_scale_padding_written_over_dirty_memory(cfg, shape, rowwise, colwise, monkeypatch):
    """Outputs come from torch.empty (here: filled with 0xAB): every byte, the scales' zero padding
    (NUMERICS layouts) included, is the kernel's to write."""
    if cfg.scheme == "mxfp8":
        shape = tuple(32 * math.ceil(n / 32) for n in shape)  # mxfp8 needs multiples of 32
    x = make_input("scaled", shape, torch.bfloat16, 13)
    gold = reference.quantize(x, cfg, rowwise=rowwise, colwise=colwise)
    xd = x.cuda()
    dirty: list = []
    # The full path allocates each output by torch.empty; a plan that an earlier test in this process recorded for
    # the same signature would allocate one block instead (its bytes are poisoned too, but its shape is not a scale's).
    native.clear_plans()
    monkeypatch.setattr(torch, "empty", dirty_empty(torch.empty, dirty))
    cand = native.quantize(xd, cfg, rowwise=rowwise, colwise=colwise)
    monkeypatch.undo()
    assert_padded_scales_from_empty(cfg, shape, rowwise, colwise, dirty)
    assert_same(cand, gold, f"{cfg.id} {shape} after poisoning")


@pytest.mark.parametrize(
    "cfg, shape",
    [
        (CURRENT[0], (20000, 3)),
        (CURRENT[0], (3, 20000)),
        (BLOCK[0], (20000, 3)),
        (BLOCK[0], (3, 20000)),
        (BLOCK[3], (5000, 130)),
        (MX[0], (65536, 32)),
        (MX[0], (32, 65536)),
        (MX[4], (32, 8192)),
    ],
    ids=lambda v: v.id if isinstance(v, QuantConfig) else f"{v[0]}x{v[1]}",
)
def test_tall_and_skinny(cfg, shape):
    check_vs_reference(make_input("scaled", shape, torch.bfloat16, 11), cfg)


@pytest.mark.parametrize("cfg", [CURRENT[0], BLOCK[0], BLOCK[3], MX[0]], ids=lambda c: c.id)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_misaligned_and_noncontiguous_inputs(cfg, dt):
    m, k = 96, 160
    base = make_input("scaled", (1, m * k + 1), DTYPES[dt], 3).flatten().cuda()
    x = base[1:].view(m, k)  # storage offset of one element: the scalar (non-vector) load path
    assert x.data_ptr() % 16 != 0
    gold = reference.quantize(x.cpu(), cfg, rowwise=True, colwise=True)
    assert_same(native.quantize(x, cfg, rowwise=True, colwise=True), gold, "misaligned")
    xt = make_input("scaled", (k, m), DTYPES[dt], 4).cuda().t()  # non-contiguous view
    gold = reference.quantize(xt.cpu(), cfg, rowwise=True, colwise=True)
    assert_same(native.quantize(xt, cfg, rowwise=True, colwise=True), gold, "transposed view")
    x3 = make_input("normal", (4 * 32, k), DTYPES[dt], 5).view(4, 32, k)  # leading dims flatten into M
    cand = native.quantize(x3.cuda(), cfg, rowwise=True, colwise=True)
    gold = reference.quantize(x3, cfg, rowwise=True, colwise=True)
    assert cand.shape == gold.shape == (4, 32, k)
    assert_same(cand, gold, "3-D")


@pytest.mark.parametrize(
    "cfg",
    [CURRENT[0], BLOCK[0], MX[0], QuantConfig("fp8_delayed")],
    ids=lambda c: c.id,
)
def test_large_8192_bf16_rowwise_and_colwise(cfg):
    x = make_input("scaled", (8192, 8192), torch.bfloat16, 1).cuda()
    gold = reference.quantize(x, cfg, rowwise=True, colwise=True)  # reference on the GPU (same bits)
    cand = native.quantize(x, cfg, rowwise=True, colwise=True)
    torch.cuda.synchronize()
    assert_same(cand, gold, "8192x8192")


def test_large_8192_fp8_block_2d_fp32_input():
    cfg = BLOCK[4]
    x = make_input("special", (8192, 8192), torch.float32, 2).cuda()
    gold = reference.quantize(x, cfg, rowwise=True, colwise=True)
    cand = native.quantize(x, cfg, rowwise=True, colwise=True)
    assert_same(cand, gold, "8192x8192 2-D")


# --------------------------------------------------------------------------------------------
# E8M0 exponent rules over many amax bit patterns
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", MX[:4], ids=lambda c: c.id)
def test_mxfp8_exponent_rules_over_amax_bit_patterns(cfg):
    g = torch.Generator().manual_seed(5)
    n = 8192
    bits = torch.randint(0, 0x7F800000, (n,), generator=g, dtype=torch.int64)
    # Include the edges: subnormals, powers of two, fp8_max * 2^j and its neighbours, FLT_MAX, +inf, 0.
    fmax = cfg.element_format.max_finite
    edge = [0, 1, 0x00400000, 0x00400001, 0x007FFFFF, 0x00800000, 0x3F800000, 0x7F000000, 0x7F7FFFFF, 0x7F800000]
    for j in range(-140, 120, 3):
        if math.ldexp(fmax, j) >= 2.0**128:
            continue
        v = struct.unpack("<I", struct.pack("<f", math.ldexp(fmax, j)))[0]
        edge += [v, max(v - 1, 0), min(v + 1, 0x7F7FFFFF)]
    bits[: len(edge)] = torch.tensor(edge, dtype=torch.int64)
    amax = bits.to(torch.int32).view(torch.float32)  # (n,)
    x = torch.zeros(n, 32, dtype=torch.float32)
    x[:, 5] = amax
    x[:, 6] = -amax / 3
    x = x.view(n, 32)
    check_vs_reference(x, cfg, rowwise=True, colwise=False)
    check_vs_reference(x.t().contiguous(), cfg, rowwise=False, colwise=True)


# --------------------------------------------------------------------------------------------
# dequantize
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", CURRENT[:2] + BLOCK + MX[:1] + MX[4:5] + [QuantConfig("fp8_delayed")], ids=lambda c: c.id)
@pytest.mark.parametrize("out", ["f32", "bf16", "f16"])
def test_dequantize_matches_reference(cfg, out):
    shape = (96, 160) if cfg.scheme == "mxfp8" else (130, 257)
    x = make_input("special", shape, torch.bfloat16, 9)
    gold = reference.quantize(x, cfg, rowwise=True, colwise=True)
    on_gpu = gold.to("cuda")
    for orientation in ("rowwise", "colwise"):
        want = reference.dequantize(gold, orientation, DTYPES[out])
        got = native.dequantize(on_gpu, orientation, DTYPES[out]).cpu()
        assert got.shape == want.shape == shape
        ints = torch.int32 if out == "f32" else torch.int16
        nan_g, nan_w = torch.isnan(got), torch.isnan(want)
        # NaN payloads are not part of the contract (the GPU writes its canonical NaN): compare NaN
        # positions, and the bits of every other lane.
        assert torch.equal(nan_g, nan_w), f"{orientation} {out}: NaN positions differ"
        same = (got.view(ints) == want.view(ints)) | nan_w
        assert bool(same.all()), f"{orientation} {out}: {int((~same).sum())} differ"


# --------------------------------------------------------------------------------------------
# fp8_delayed: cast with a state, history update
# --------------------------------------------------------------------------------------------


def _state(cfg, history, scale, device):
    st = AmaxHistory(cfg, device=device)
    st.history = torch.tensor(history, dtype=torch.float32, device=device)
    st.scale = torch.tensor([scale], dtype=torch.float32, device=device)
    return st


def test_delayed_steps_match_reference():
    cfg = QuantConfig("fp8_delayed", amax_history_len=8)
    ref_state = AmaxHistory(cfg)
    gpu_state = AmaxHistory(cfg, device="cuda")
    for step in range(6):
        for micro in range(2):
            x = make_input("scaled" if step % 2 else "special", (100, 72), torch.bfloat16, 100 * step + micro)
            gold = reference.quantize(x, cfg, rowwise=True, colwise=True, state=ref_state)
            cand = native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, state=gpu_state)
            assert_same(cand, gold, f"step {step}.{micro}")
            assert _b(gpu_state.history) == _b(ref_state.history)
        reduced = None if step != 3 else torch.tensor([2.0 ** 20])
        ref_state.update(reduced)
        native.update_amax_history(gpu_state, reduced)
        assert _b(gpu_state.history) == _b(ref_state.history), f"history after step {step}"
        assert _b(gpu_state.scale) == _b(ref_state.scale), f"scale after step {step}"


@pytest.mark.parametrize(
    "cfg_kw, history, scale, want_hist, want_scale_bits",
    [
        # docs/numerics.md §8 delayed rows (L = 4, fp8_max 448).
        ({}, [5, 1, 2, 3], 1.0, [0, 2, 3, 5], 0x42B33333),
        ({"margin": 1}, [5, 1, 2, 3], 1.0, [0, 2, 3, 5], 0x42333333),
        ({"element": "e5m2"}, [5, 1, 2, 3], 1.0, [0, 2, 3, 5], 0x46333333),
        ({}, [1, 7, 2, 3], 1.0, [0, 2, 3, 1], 0x42800000),  # A = 7 (old H[1] counts): s = 64
        ({"amax_compute_algo": "most_recent"}, [1, 7, 2, 3], 1.0, [0, 2, 3, 1], 0x43E00000),  # s = 448
        ({}, [0, 7, 2, 3], 0.5, [0, 7, 2, 3], 0x3F000000),  # zero amax: nothing changes
        ({}, [1e-37, 0, 0, 0], 1.0, [0, 0, 0, 1e-37], 0x7F7FFFFF),  # s = FLT_MAX
        ({}, [float("inf"), 1, 2, 3], 0.5, [0, 2, 3, float("inf")], 0x3F000000),  # inf freezes the scale
    ],
)
def test_delayed_update_numerics_vectors(cfg_kw, history, scale, want_hist, want_scale_bits):
    cfg = QuantConfig("fp8_delayed", amax_history_len=4, **cfg_kw)
    st = _state(cfg, history, scale, "cuda")
    native.update_amax_history(st)
    assert _b(st.history) == _b(torch.tensor(want_hist, dtype=torch.float32))
    assert _b(st.scale) == [want_scale_bits]
    assert st.history.is_cuda and st.scale.is_cuda


def test_delayed_cast_is_the_saturating_cast_with_scale_one():
    # A fresh state has scale 1: q = sat_fp8(x). docs/numerics.md §8 sat_e4m3 / sat_e5m2 rows, fp32 input.
    e4 = [448, 464, 465, 1e6, float("inf"), -float("inf"), float("nan"), _f(0xFFC00000), -0.0,
          2.0**-9, 2.0**-10, 2.0**-10 + 2.0**-20, 1.5 * 2.0**-9, 17, 19]
    want4 = [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x7F, 0x80, 0x01, 0x00, 0x01, 0x02, 0x58, 0x5A]
    e5 = [57344, 61439, 61440, float("inf"), float("nan"), 2.0**-16, 2.0**-17, 3 * 2.0**-17, -0.0]
    want5 = [0x7B, 0x7B, 0x7B, 0x7B, 0x7F, 0x01, 0x00, 0x02, 0x80]
    for element, vals, want in (("e4m3", e4, want4), ("e5m2", e5, want5)):
        cfg = QuantConfig("fp8_delayed", element=element)
        x = torch.tensor([vals], dtype=torch.float32, device="cuda")
        q = native.quantize(x, cfg, rowwise=True, colwise=True)
        assert q.rowwise_data.cpu().flatten().tolist() == want
        assert q.colwise_data.cpu().flatten().tolist() == want
        assert _b(q.rowwise_scale) == [0x3F800000]


# --------------------------------------------------------------------------------------------
# docs/numerics.md §8 vectors and subnormal survival (§0.3)
# --------------------------------------------------------------------------------------------


def test_current_scaling_vectors():
    x = torch.tensor([[3.0, 1.0, -0.5, 0.0]], device="cuda")
    q = native.quantize(x, QuantConfig("fp8_current"), rowwise=True, colwise=True)
    # s = RN(448/3) = 0x43155555 (a reciprocal-multiply gives ...56); sinv = 0x3BDB6DB7; 3*s = 448 -> 0x7E.
    assert _b(q.rowwise_scale) == [0x3BDB6DB7] and _b(q.rowwise_amax) == [_b(torch.tensor(3.0))[0]]
    assert q.rowwise_data.cpu().flatten().tolist()[0] == 0x7E
    qp = native.quantize(x, QuantConfig("fp8_current", pow2_scales=True))
    assert _b(qp.rowwise_scale) == [0x3C000000]  # s = 128, sinv = 2^-7
    q35 = native.quantize(torch.tensor([[3.5, -1.0]], device="cuda"), QuantConfig("fp8_current"))
    assert _b(q35.rowwise_scale) == [0x3C000000]  # amax 3.5: s = 128 exactly
    for special in (0.0, float("inf"), float("nan")):
        qs = native.quantize(torch.tensor([[special, 0.0]], device="cuda"), QuantConfig("fp8_current"))
        assert _b(qs.rowwise_scale) == [0x3F800000], special  # s = 1, sinv = 1
    # eps 1.0, amax 0.5 -> s = 448; amax 1000 with pow2 -> s = 0.25, sinv = 4.
    qe = native.quantize(torch.tensor([[0.5]], device="cuda"), QuantConfig("fp8_current", eps=1.0))
    assert _b(qe.rowwise_scale) == _b(torch.div(torch.tensor(1.0), torch.tensor(448.0)))
    qe2 = native.quantize(torch.tensor([[1000.0]], device="cuda"), QuantConfig("fp8_current", eps=1.0, pow2_scales=True))
    assert _b(qe2.rowwise_scale) == [0x40800000]


def test_subnormal_sinv_survives_fp8_current():
    # docs/numerics.md §0.3 / §8: amax 1e-37 -> s = FLT_MAX, sinv = RN(1/FLT_MAX) = 0x00200000 (flushed to 0 under FTZ).
    x = torch.tensor([[1e-37, -5e-38]], dtype=torch.float32, device="cuda")
    q = native.quantize(x, QuantConfig("fp8_current"), rowwise=True, colwise=True)
    assert _b(q.rowwise_scale) == [0x00200000] and _b(q.colwise_scale) == [0x00200000]
    qp = native.quantize(x, QuantConfig("fp8_current", pow2_scales=True))
    assert _b(qp.rowwise_scale) == [0x00400000]  # pow2: s = 2^127, sinv = 2^-127
    # Dequantization multiplies by the subnormal sinv and keeps a subnormal result.
    xd = native.dequantize(q, "rowwise", torch.float32).cpu()
    want = reference.dequantize(q.to("cpu"), "rowwise", torch.float32)
    assert _b(xd) == _b(want) and float(xd[0, 0]) != 0.0


def test_subnormal_sinv_survives_fp8_block():
    # docs/numerics.md §8: a 1x128 block with amax 1e-37, fp32 scales: fp32 input s = FLT_MAX, sinv 0x00200000;
    # bf16 input s = BF16_MAX, sinv 0x00202020; pow2: s = 2^127, sinv 2^-127 (0x00400000).
    row = torch.zeros(1, 128)
    row[0, 0], row[0, 7] = 1e-37, -3e-38
    for dtype, cfg, want in (
        (torch.float32, QuantConfig("fp8_block", pow2_scales=False), 0x00200000),
        (torch.bfloat16, QuantConfig("fp8_block", pow2_scales=False), 0x00202020),
        (torch.float32, QuantConfig("fp8_block"), 0x00400000),
        (torch.bfloat16, QuantConfig("fp8_block"), 0x00400000),
    ):
        x = row.to(dtype).cuda()
        q = native.quantize(x, cfg, rowwise=True, colwise=False)
        assert _b(q.rowwise_scale[0, 0]) == [want], (dtype, cfg.id)
        assert_same(q, reference.quantize(x.cpu(), cfg, rowwise=True), f"tiny block {dtype}")


def test_subnormal_products_survive_mxfp8():
    # e = 0 for a tiny block: P(0) = 2^127 scales subnormal inputs up, D(0) = 2^-127 decodes to subnormals.
    x = torch.zeros(32, 32)
    x[0, 0] = 1e-40  # subnormal fp32 input, block amax 1e-40 -> e = 0, x * 2^127 is a normal fp8 value
    x[1, 0] = float("inf")  # e = 254 (P = 2^-127, a subnormal multiplier); inf saturates to 0x7E
    x[1, 1] = 1.0
    q = native.quantize(x.cuda(), QuantConfig("mxfp8"), rowwise=True, colwise=False)
    assert int(q.rowwise_scale[0, 0]) == 0 and int(q.rowwise_scale[1, 0]) == 254
    assert int(q.rowwise_data[0, 0]) != 0  # survived the subnormal input
    assert int(q.rowwise_data[1, 0]) == 0x7E
    assert_same(q, reference.quantize(x, QuantConfig("mxfp8"), rowwise=True), "mxfp8 subnormal")
    xd = native.dequantize(q, "rowwise", torch.float32).cpu()  # D(0) = 2^-127 is subnormal
    assert float(xd[0, 0]) != 0.0
    assert _b(xd) == _b(reference.dequantize(q.to("cpu"), "rowwise", torch.float32))


def test_mxfp8_vectors():
    # docs/numerics.md §8: amax 112 -> e 125 (P = 4): 112, 1, -3, 0.01 -> 7E 48 D4 12;
    # amax 120 -> ceil 126 (P = 2): 77 40 CC 0A; floor 125 (P = 4): 120 -> 0x7E (clipped).
    x = torch.zeros(64, 32)
    x[0, :4] = torch.tensor([112.0, 1.0, -3.0, 0.01])
    x[32, :4] = torch.tensor([120.0, 1.0, -3.0, 0.01])
    qc = native.quantize(x.cuda(), QuantConfig("mxfp8"), rowwise=True, colwise=True)
    qf = native.quantize(x.cuda(), QuantConfig("mxfp8", e8m0_rule="floor"), rowwise=True, colwise=True)
    assert qc.rowwise_data[0, :4].cpu().tolist() == [0x7E, 0x48, 0xD4, 0x12] and int(qc.rowwise_scale[0, 0]) == 125
    assert qc.rowwise_data[32, :4].cpu().tolist() == [0x77, 0x40, 0xCC, 0x0A] and int(qc.rowwise_scale[32, 0]) == 126
    assert int(qf.rowwise_data[32, 0]) == 0x7E and int(qf.rowwise_scale[32, 0]) == 125
    assert int(qc.colwise_scale[0, 0]) == 125 and int(qc.colwise_scale[1, 0]) == 126  # column 0 blocks
    # Exponents: amax 113, 150, 448, 449, 0, +inf -> ceil/floor 126/125, 126/126, 127/127, 128/127, 0/0, 254/254.
    amaxes = [113.0, 150.0, 448.0, 449.0, 0.0, float("inf")]
    xe = torch.zeros(len(amaxes), 32)
    xe[:, 0] = torch.tensor(amaxes)
    xe = torch.cat([xe, torch.zeros(32 - len(amaxes), 32)])
    ec = native.quantize(xe.cuda(), QuantConfig("mxfp8")).rowwise_scale[: len(amaxes), 0].cpu().tolist()
    ef = native.quantize(xe.cuda(), QuantConfig("mxfp8", e8m0_rule="floor")).rowwise_scale[: len(amaxes), 0].cpu().tolist()
    assert ec == [126, 126, 127, 128, 0, 254] and ef == [125, 126, 127, 127, 0, 254]
    # E5M2: amax 1.0, 1.9, 61440 -> 112/112, 113/112, 128/127.
    x5 = torch.zeros(32, 32)
    x5[:3, 0] = torch.tensor([1.0, 1.9, 61440.0])
    c5 = native.quantize(x5.cuda(), QuantConfig("mxfp8", element="e5m2")).rowwise_scale[:3, 0].cpu().tolist()
    f5 = native.quantize(x5.cuda(), QuantConfig("mxfp8", element="e5m2", e8m0_rule="floor")).rowwise_scale[:3, 0].cpu().tolist()
    assert c5 == [112, 113, 128] and f5 == [112, 112, 127]


def test_fp8_block_bf16_vector():
    # docs/numerics.md §8: bf16 block with amax 3: 3, 1, -0.5, 2.9 -> pow2 s = 128: 7C 70 E8 7C;
    # fp32 scales (s = 0x43155555): 7E 71 E9 7E.
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    x[0, :4] = torch.tensor([3.0, 1.0, -0.5, 2.9]).to(torch.bfloat16)
    qp = native.quantize(x.cuda(), QuantConfig("fp8_block"))
    qf = native.quantize(x.cuda(), QuantConfig("fp8_block", pow2_scales=False))
    assert qp.rowwise_data[0, :4].cpu().tolist() == [0x7C, 0x70, 0xE8, 0x7C]
    assert qf.rowwise_data[0, :4].cpu().tolist() == [0x7E, 0x71, 0xE9, 0x7E]
    assert _b(qf.rowwise_scale[0, 0]) == [0x3BDB6DB7]
    # Layout row "blockwise 1-D x [3, 200]": sinv [2, 4], data_T [200, 3], sinv_T [1, 200].
    q = native.quantize(torch.randn(3, 200, device="cuda"), QuantConfig("fp8_block"), rowwise=True, colwise=True)
    assert tuple(q.rowwise_scale.shape) == (2, 4) and tuple(q.colwise_data.shape) == (200, 3)
    assert tuple(q.colwise_scale.shape) == (1, 200)


def test_2d_relations():
    x = make_input("scaled", (256, 384), torch.bfloat16, 21).cuda()
    qb = native.quantize(x, QuantConfig("fp8_block", tile=(128, 128)), rowwise=True, colwise=True)
    assert torch.equal(qb.colwise_data, qb.rowwise_data.t())
    assert torch.equal(qb.colwise_scale[:3, :2], qb.rowwise_scale[:2, :3].t())
    qm = native.quantize(x, QuantConfig("mxfp8", tile=(32, 32)), rowwise=True, colwise=True)
    assert torch.equal(qm.colwise_data, qm.rowwise_data)


# --------------------------------------------------------------------------------------------
# interop: torch's current stream, errors
# --------------------------------------------------------------------------------------------


def test_runs_on_torchs_current_stream():
    x = make_input("scaled", (1024, 1024), torch.bfloat16, 31)
    gold = reference.quantize(x, QuantConfig("mxfp8"), rowwise=True, colwise=True)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xs = x.to("cuda", non_blocking=False)
        cand = native.quantize(xs, QuantConfig("mxfp8"), rowwise=True, colwise=True)
        # Work queued on the same stream sees the finished result without a device-wide sync.
        doubled = cand.rowwise_data.to(torch.int32) * 2
    s.synchronize()
    assert_same(cand, gold, "side stream")
    assert torch.equal(doubled.cpu(), gold.rowwise_data.to(torch.int32) * 2)


def test_bad_input_raises_spec_violation():
    with pytest.raises(SpecViolation, match="CUDA"):
        native.quantize(torch.ones(32, 32), QuantConfig("mxfp8"))
    with pytest.raises(SpecViolation, match="K=48"):
        native.quantize(torch.ones(32, 48, device="cuda"), QuantConfig("mxfp8"))
    with pytest.raises(SpecViolation, match="dtype"):
        native.quantize(torch.ones(4, 4, dtype=torch.float64, device="cuda"), QuantConfig("fp8_block"))
    with pytest.raises(SpecViolation, match="empty"):
        native.quantize(torch.ones(0, 4, device="cuda"), QuantConfig("fp8_current"))
    with pytest.raises(SpecViolation):
        native.quantize(torch.ones(4, 4, device="cuda"), QuantConfig("fp8_current"), rowwise=False, colwise=False)


def test_supports_on_gpu():
    for cfg in CURRENT + BLOCK + MX:
        assert native.supports("quantize", cfg, "cuda") == (True, "")
    ok, why = native.supports("quantize", QuantConfig("mxfp8"), "cpu")
    assert not ok and "CUDA" in why


def precompile() -> None:
    """Build every module these tests load, in parallel threads (NVRTC releases the GIL), so that
    pytest-xdist workers find warm cubins: `python -m tests.gpu.test_native_fp8`."""
    from concurrent.futures import ThreadPoolExecutor

    from native import _compile
    from native.launchers import launcher

    arch = _compile.device_arch()
    jobs = {(launcher(c.scheme).CU_FILE, c.id): c for c in CURRENT + BLOCK + MX + DELAYED}
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda kv: _compile.compile_cubin(kv[0][0], _compile.defines_for(kv[1]), arch), jobs.items()))
    print(f"precompiled {len(jobs)} modules for {arch}")


def bench() -> None:
    """Quick speed probe (not a test): bf16 8192x8192 rowwise+colwise, fraction of device copy bandwidth."""
    x = torch.randn(8192, 8192, device="cuda").to(torch.bfloat16)
    n = x.numel()

    def timed(fn, reps=20) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps / 1e3

    t_copy = timed(lambda: x.clone())
    copy_bw = 2 * 2 * n / t_copy
    print(f"copy: {t_copy * 1e6:.1f} us, {copy_bw / 1e12:.2f} TB/s (read + write)")
    for cfg in (QuantConfig("mxfp8"), QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128)),
                QuantConfig("fp8_current")):
        t = timed(lambda c=cfg: native.quantize(x, c, rowwise=True, colwise=True))
        moved = 2 * n + 2 * n  # bf16 read once + two uint8 copies written (scales negligible)
        print(f"{cfg.id}: {t * 1e6:.1f} us, {moved / t / 1e12:.2f} TB/s, {moved / t / copy_bw:.2f} of copy")


if __name__ == "__main__":
    import sys

    bench() if "--bench" in sys.argv else precompile()
