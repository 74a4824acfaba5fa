"""native.nvfp4 (CUDA kernels) against the golden reference.quantize / dequantize, byte for byte.

Source: docs/numerics.md §5 (NVFP4), §0.3 (a GPU test must see a subnormal result survive), §8 vectors.
Every toggle: 1x16 / 16x16 tiles, RHT, SR, rowwise / colwise copies, fp32 / bf16 / fp16 inputs
where the config allows them; shapes 16x16, 48x80, 2048x4096 and one large; special inputs (zeros,
-0, NaN, +-Inf, subnormals, tiny and huge global amax). The reference runs on CPU.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import reference
from reference import layouts
from reference.formats import QuantConfig
from reference.types import QuantizedTensor, SRSeed

from .poison import assert_padded_scales_from_empty, dirty_empty

pytestmark = pytest.mark.gpu

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CONFIGS = {
    "1x16": QuantConfig("nvfp4"),
    "16x16": QuantConfig("nvfp4", tile=(16, 16)),
    "1x16-sr": QuantConfig("nvfp4", stochastic=True),
    "1x16-rht": QuantConfig("nvfp4", rht=True),
    "1x16-rht-sr": QuantConfig("nvfp4", rht=True, stochastic=True),
}
SEED = SRSeed(0x0123456789ABCDEF, 7)


def _dtypes_for(cfg_name: str) -> list[str]:
    # NUMERICS: §5.6 - RHT takes bf16 input only.
    return ["bfloat16"] if CONFIGS[cfg_name].rht else list(DTYPES)


def make_input(kind: str, shape: tuple[int, int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Seeded CPU test input. `kind`: normal (per-row/block scales over many binades) or a special set."""
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    base = torch.randn(m, k, generator=g, dtype=torch.float64)
    # Block-to-block scale variation (2^-12 .. 2^12) so block scales span the E4M3 range.
    e = torch.randint(-12, 13, (m, k // 16), generator=g).repeat_interleave(16, dim=1)
    x = base * torch.pow(2.0, e.to(torch.float64))
    if kind == "normal":
        pass
    elif kind == "gauss":  # one scale: RHT chunks mostly take the kernel's exact fp32 path
        x = base
    elif kind in ("spread12", "spread13"):
        # Full 8-bit significands over 13 / 14 binades: RHT sums that just fit / no longer fit in
        # fp32 (the kernel's exact-fp32 bound is a spread of 12 binades).
        span = 13 if kind == "spread12" else 14
        sig = torch.randint(128, 256, (m, k), generator=g).to(torch.float64) / 128
        sgn = torch.where(torch.rand(m, k, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        x = sgn * sig * torch.pow(2.0, torch.randint(0, span, (m, k), generator=g).to(torch.float64))
    elif kind == "zeros":
        x = torch.zeros(m, k, dtype=torch.float64)
    elif kind == "signed_zeros":
        x = torch.where(torch.rand(m, k, generator=g) < 0.5, -0.0, 0.0).to(torch.float64)
        x[0, 3] = 1.5  # one non-zero block; all others +-0
    elif kind == "specials":
        r = torch.rand(m, k, generator=g)
        x = torch.where(r < 0.03, float("nan"), x)
        x = torch.where((r >= 0.03) & (r < 0.05), float("inf"), x)
        x = torch.where((r >= 0.05) & (r < 0.07), float("-inf"), x)
        x = torch.where((r >= 0.07) & (r < 0.12), -0.0, x)
    elif kind == "nan_only":
        x = torch.full((m, k), float("nan"), dtype=torch.float64)
        x[m - 1, k - 1] = -3.0
    elif kind == "subnormal":
        # Values near the bottom of the input dtype (fp32 / bf16 subnormals, fp16 subnormals).
        tiny = {torch.float32: 2.0**-140, torch.bfloat16: 2.0**-130, torch.float16: 2.0**-20}[dtype]
        x = base * tiny
    elif kind == "tiny_amax":
        x = base * 1e-38  # global amax below 2688 / FLT_MAX -> S_enc = FLT_MAX
        if dtype == torch.float16:
            x = base * 2.0**-24 * 4
    elif kind == "huge":
        big = {torch.float32: 1e37, torch.bfloat16: 1e37, torch.float16: 6e4}[dtype]
        x = torch.clamp(base, -1, 1) * big
        x[0, 0] = big * 3.3 if dtype != torch.float16 else 65504.0
    else:
        raise ValueError(kind)
    return x.to(dtype)


def assert_fields_equal(golden: QuantizedTensor, cand: dict, m: int, k: int, label: str) -> None:
    """Every field byte-equal; scale padding checked to be zero."""
    cfg = golden.config
    for o in ("rowwise", "colwise"):
        if not golden.has(o):
            assert cand.get(f"{o}_data") is None, f"{label}: unexpected {o} copy"
            continue
        for f in ("data", "scale", "amax"):
            g = getattr(golden, f"{o}_{f}")
            c = cand[f"{o}_{f}"].cpu()
            assert c.shape == g.shape and c.dtype == g.dtype, (
                f"{label}: {o}_{f} shape/dtype {c.shape} {c.dtype} vs {g.shape} {g.dtype}"
            )
            if f == "amax":
                gb, cb = g.view(torch.int32), c.view(torch.int32)
                assert torch.equal(gb, cb), f"{label}: {o}_amax bits {cb.tolist()} != golden {gb.tolist()}"
                continue
            if f == "scale":
                rows, cols = layouts.scale_valid_shape(cfg, o, m, k)
                pad = c.clone()
                pad[:rows, :cols] = 0
                assert int(pad.count_nonzero()) == 0, f"{label}: {o}_scale padding not zero"
            bad = (g != c).nonzero()
            if bad.numel():
                i = tuple(bad[0].tolist())
                raise AssertionError(
                    f"{label}: {o}_{f} mismatches at {bad.shape[0]} of {g.numel()} bytes; first {i}: "
                    f"native {int(c[i]):#04x} golden {int(g[i]):#04x}"
                )


def assert_dequant_equal(golden: QuantizedTensor, cand: QuantizedTensor, label: str, dtypes=(torch.float32,)) -> None:
    from native import nvfp4

    for o in ("rowwise", "colwise"):
        if not golden.has(o):
            continue
        for dt in dtypes:
            g = reference.dequantize(golden, o, dt)
            c = nvfp4.dequantize(cand, o, dt).cpu()
            assert c.shape == g.shape and c.dtype == dt
            # Bit-exact, except that any NaN matches any NaN (the payload of 0 * inf is not part of
            # the contract and differs between CPU and GPU).
            bits = torch.int32 if dt == torch.float32 else torch.int16
            both_nan = torch.isnan(g) & torch.isnan(c)
            nz = ((g.view(bits) != c.view(bits)) & ~both_nan).nonzero()
            assert nz.numel() == 0, (
                f"{label}: dequantize {o} {dt} mismatches at {nz.shape[0]} elements; first {tuple(nz[0].tolist())}"
            )


def run_case(cfg: QuantConfig, x_cpu: torch.Tensor, *, rowwise=True, colwise=True, dequant=True, label=""):
    from native import nvfp4

    rng = SEED if cfg.stochastic else None
    golden = reference.quantize(x_cpu, cfg, rowwise=rowwise, colwise=colwise, rng=rng)
    x_gpu = x_cpu.cuda()
    fields = nvfp4.quantize_2d(x_gpu, cfg, rowwise=rowwise, colwise=colwise, rng=rng, state=None)
    torch.cuda.synchronize()
    m, k = x_cpu.shape
    assert_fields_equal(golden, fields, m, k, label)
    if dequant:
        cand = QuantizedTensor(cfg, tuple(x_cpu.shape), golden.hp_dtype, **fields)
        assert_dequant_equal(golden, cand, label)
    return golden, fields


@pytest.fixture(scope="module", autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy")


# ---- toolchain ------------------------------------------------------------------------------


def test_subnormal_results_survive():
    """docs/numerics.md §0.3: no FTZ anywhere. S_dec = RN(1/FLT_MAX) = 0x00200000 must survive, and so must
    subnormal decode factors.

    A_g = 7e-36: S_enc = FLT_MAX (2688/A_g overflows), S_dec = 2^-128 (subnormal), m = RN(FLT_MAX *
    fl(1/6)), d = RN(7e-36 * m) = 396.99 -> s_blk 0x7C (384), f = RN(1/RN(384 * 2^-128)) = 8.86e35;
    y = (6.2, 2.07) -> codes 7, 4 -> byte 0x47. A flushed S_dec gives f = FLT_MAX and codes 7, 7.
    A_g = 1e-38 (a subnormal input): x_hat = 6 * RN(RN(s * 1e-38) * fl(1/2688)) is a subnormal.
    """
    from native import nvfp4

    cfg = CONFIGS["1x16"]
    x = torch.zeros(16, 16, dtype=torch.float32)
    x[0, 0], x[0, 1] = 7e-36, 7e-36 / 3
    _, fields = run_case(cfg, x, label="S_dec subnormal")
    assert int(fields["rowwise_scale"][0, 0]) == 0x7C
    assert int(fields["rowwise_data"][0, 0]) == 0x47

    x = torch.zeros(16, 16, dtype=torch.float32)
    x[0, 0], x[0, 1] = 1e-38, 1e-38 / 3
    _, fields = run_case(cfg, x, label="subnormal decode")
    q = QuantizedTensor(cfg, (16, 16), "float32", **fields)
    xh = nvfp4.dequantize(q, "rowwise", torch.float32).cpu()
    assert 0 < float(xh[0, 0]) < 1.1754944e-38, f"x_hat[0,0] = {float(xh[0, 0])!r}: flushed to zero or not subnormal"


# ---- §8 vectors on the device ---------------------------------------------------------------


def test_vector_block_a_g_21504():
    """docs/numerics.md §8: A_g = 21504, block [96, 8, 4, 12, 20, 28, 40, 56, 80, -0, -1, -96, 0...] -> 17 20 42 64 86 F8 00 00, s 0x40."""
    from native import nvfp4

    x = torch.zeros(16, 16, dtype=torch.float32)
    x[0] = torch.tensor([96, 8, 4, 12, 20, 28, 40, 56, 80, -0.0, -1, -96, 0, 0, 0, 0])
    x[1, 0] = 21504
    f = nvfp4.quantize_2d(x.cuda(), CONFIGS["1x16"], rowwise=True, colwise=False)
    assert f["rowwise_data"][0].cpu().tolist() == [0x17, 0x20, 0x42, 0x64, 0x86, 0xF8, 0x00, 0x00]
    assert int(f["rowwise_scale"][0, 0]) == 0x40
    assert f["rowwise_amax"].cpu().tolist() == [21504.0]


def test_vector_underflow_block():
    """docs/numerics.md §8: A_g = 1e6, block [1e-3, -1e-3, 5e-4, 0...] -> s_blk 0x00, f = FLT_MAX, codes 7, F, 7, 0."""
    from native import nvfp4

    x = torch.zeros(16, 16, dtype=torch.float32)
    x[0, :3] = torch.tensor([1e-3, -1e-3, 5e-4])
    x[1, 0] = 1e6
    f = nvfp4.quantize_2d(x.cuda(), CONFIGS["1x16"], rowwise=True, colwise=False)
    assert int(f["rowwise_scale"][0, 0]) == 0x00
    assert f["rowwise_data"][0, :2].cpu().tolist() == [0xF7, 0x07]


def test_vector_sr_bits_seed_42():
    """docs/numerics.md §8: seed 42 stream 0, group 0 x0 = 0x9CEAF053 -> bytes 83, 240, 234, 156 drive elements 0..3.

    With A_g = 2688 (S_enc = 1, m = fl(1/6)) and a block amax of 6 the block scale is 1.0 and f = 1,
    so y = x. y = 0.25 rounds up iff r >= 128 (the grid step at 0.25 is 0.5): r = 83 -> 0, r = 240 -> 0.5.
    """
    from native import nvfp4

    x = torch.zeros(16, 16, dtype=torch.float32)
    x[0, :4] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    x[0, 4] = 6.0
    x[1, 0] = 2688.0
    f = nvfp4.quantize_2d(x.cuda(), CONFIGS["1x16-sr"], rowwise=True, colwise=False, rng=SRSeed(42, 0))
    assert int(f["rowwise_scale"][0, 0]) == 0x38  # 1.0
    # bytes 83, 240, 234, 156: 83 < 128 -> 0; the others >= 128 -> 0.5 (code 1).
    assert f["rowwise_data"][0, :2].cpu().tolist() == [0x0 | (0x1 << 4), 0x1 | (0x1 << 4)]


# ---- against the reference ------------------------------------------------------------------

_SMALL = [(16, 16), (48, 80)]
_CASES = [
    pytest.param(c, d, s, kind, id=f"{c}-{d}-{s[0]}x{s[1]}-{kind}")
    for c in CONFIGS
    for d in _dtypes_for(c)
    for s in _SMALL
    for kind in ("normal", "gauss")
]


@pytest.mark.parametrize("cfg_name,dtype_name,shape,kind", _CASES)
def test_matches_reference_small(cfg_name, dtype_name, shape, kind):
    cfg = CONFIGS[cfg_name]
    seed = zlib.crc32(f"{cfg_name}-{dtype_name}-{shape}-{kind}".encode())
    x = make_input(kind, shape, DTYPES[dtype_name], seed=seed)
    run_case(cfg, x, label=f"{cfg.id} {dtype_name} {shape} {kind}")


@pytest.mark.parametrize("cfg_name", list(CONFIGS))
@pytest.mark.parametrize("orientation", ["rowwise", "colwise"])
def test_single_copy_matches_reference(cfg_name, orientation):
    cfg = CONFIGS[cfg_name]
    x = make_input("normal", (48, 80), torch.bfloat16, seed=11)
    run_case(
        cfg, x, rowwise=orientation == "rowwise", colwise=orientation == "colwise", label=f"{cfg.id} {orientation}"
    )


_SPECIAL_KINDS = [
    "zeros",
    "signed_zeros",
    "specials",
    "nan_only",
    "subnormal",
    "tiny_amax",
    "huge",
    "spread12",
    "spread13",
]
_SPECIAL_CASES = [
    pytest.param(c, d, kind, id=f"{c}-{d}-{kind}") for kind in _SPECIAL_KINDS for c in CONFIGS for d in _dtypes_for(c)
]


@pytest.mark.parametrize("cfg_name,dtype_name,kind", _SPECIAL_CASES)
def test_special_inputs_match_reference(cfg_name, dtype_name, kind):
    cfg = CONFIGS[cfg_name]
    x = make_input(kind, (48, 80), DTYPES[dtype_name], seed=5)
    run_case(cfg, x, label=f"{cfg.id} {dtype_name} {kind}")


@pytest.mark.parametrize("cfg_name", ["1x16", "16x16", "1x16-rht-sr"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(144, 208), (48, 4112)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("rowwise, colwise", [(True, True), (True, False), (False, True)], ids=["both", "row", "col"])
@pytest.mark.parametrize("given", [False, True], ids=["own-amax", "given-amax"])
def test_scale_padding_written_over_dirty_memory(cfg_name, dtype_name, shape, rowwise, colwise, given, monkeypatch):
    """The outputs come from torch.empty (here: filled with 0xAB): every byte, the scales' zero
    padding (docs/numerics.md §5.9) included, is the kernel's to write, with or without a given amax (no amax
    pass before the quantize kernel)."""
    from native import nvfp4

    cfg = CONFIGS[cfg_name]
    if dtype_name not in _dtypes_for(cfg_name):
        pytest.skip(f"{cfg.id} takes bf16 input only")
    if given and cfg.rht:
        pytest.skip("a given amax does not apply with RHT (docs/numerics.md §5.6)")
    x = make_input("normal", shape, DTYPES[dtype_name], 17)
    rng = SEED if cfg.stochastic else None
    amax = x.abs().float().amax().reshape(1) * 2 if given else None  # (a larger given amax: not amax(X))
    golden = reference.quantize(x, cfg, rowwise=rowwise, colwise=colwise, rng=rng, amax=amax)
    dirty: list = []
    x_gpu = x.cuda()
    monkeypatch.setattr(torch, "empty", dirty_empty(torch.empty, dirty))
    fields = nvfp4.quantize_2d(x_gpu, cfg, rowwise=rowwise, colwise=colwise, rng=rng,
                               amax=None if amax is None else amax.cuda())  # fmt: skip
    torch.cuda.synchronize()
    monkeypatch.undo()
    assert_padded_scales_from_empty(cfg, shape, rowwise, colwise, dirty)
    assert_fields_equal(golden, fields, *shape, f"{cfg.id} {dtype_name} {shape} after poisoning")


@pytest.mark.parametrize("kind", ["normal", "gauss"])
@pytest.mark.parametrize("cfg_name", list(CONFIGS))
def test_matches_reference_2048x4096(cfg_name, kind):
    cfg = CONFIGS[cfg_name]
    x = make_input(kind, (2048, 4096), torch.bfloat16, seed=3)
    run_case(cfg, x, label=f"{cfg.id} bf16 2048x4096 {kind}")


def test_matches_reference_2048x4096_fp32_fp16():
    for dt in (torch.float32, torch.float16):
        x = make_input("normal", (2048, 4096), dt, seed=4)
        run_case(CONFIGS["1x16-sr"], x, label=f"1x16-sr {dt} 2048x4096")
        run_case(CONFIGS["16x16"], x, label=f"16x16 {dt} 2048x4096")


def test_matches_reference_large():
    """One large bf16 tensor, activation-gradient recipe (RHT + SR on both copies), plus dequantize in bf16/fp16."""
    cfg = CONFIGS["1x16-rht-sr"]
    x = make_input("normal", (8192, 8192), torch.bfloat16, seed=9)
    golden, fields = run_case(cfg, x, dequant=False, label="large 8192x8192 rht-sr")
    cand = QuantizedTensor(cfg, tuple(x.shape), golden.hp_dtype, **fields)
    assert_dequant_equal(golden, cand, "large", dtypes=(torch.bfloat16, torch.float16))


def test_sr_streams_differ_and_are_unbiased():
    """SR bits depend on (seed, stream); the mean of SR-decoded values tracks the input (§5.7)."""
    from native import nvfp4

    cfg = CONFIGS["1x16-sr"]
    x = torch.full((256, 256), 0.3, dtype=torch.float32).cuda()
    x[0, 0] = 2688.0  # A_g = 2688 -> S_enc = 1
    a = nvfp4.quantize_2d(x, cfg, rowwise=True, colwise=False, rng=SRSeed(1, 0))
    b = nvfp4.quantize_2d(x, cfg, rowwise=True, colwise=False, rng=SRSeed(1, 2))
    assert not torch.equal(a["rowwise_data"], b["rowwise_data"])
    q = QuantizedTensor(cfg, (256, 256), "float32", **a)
    xh = nvfp4.dequantize(q, "rowwise", torch.float32)[1:].cpu()
    # Rows 1.. have block amax 0.3 -> s_blk = sat_e4m3(0.3 * fl(1/6)) and y near 6; mean of x_hat ~ 0.3.
    assert math.isclose(float(xh.mean()), 0.3, rel_tol=0.01), float(xh.mean())
