"""Issue 17's native features against the golden, bit for bit: a given amax (nvfp4, fp8_current), grouped (split)
quantization (mxfp8, nvfp4) and stochastic rounding on 16x16 NVFP4 tiles.

Source: docs/numerics.md §1 and §5.1 (a given amax: TE's quantize_with_amax; reduce_amax), §12.1 (grouped),
§5.7 (the 16x16 SR random bits: each copy in its own layout and stream). The reference runs on the CPU; native
on the GPU; every field (codes, scales with their zero padding, amax bits) must be equal.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import reference
from reference import grouped as ref_grouped
from reference import layouts
from reference.formats import QuantConfig
from reference.quantization import reduce_amax
from reference.types import QuantizedTensor, SpecViolation, SRSeed, Unsupported

pytestmark = pytest.mark.gpu

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SEEDS = (SRSeed(0x0123456789ABCDEF, 7), SRSeed(1, 0), SRSeed(0xFFFFFFFF00000001, 0xFFFFFFFE))
COPIES = {"both": (True, True), "rowwise": (True, False), "colwise": (False, True)}


@pytest.fixture(scope="module", autouse=True)
def _needs_cupy():
    pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def seed_of(*key) -> int:
    """A seed fixed across processes (Python's str hash is salted per process)."""
    return zlib.crc32(repr(key).encode())


def make_x(shape: tuple[int, int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Seeded CPU input whose 16-element blocks span 2^-10 .. 2^10 (the block scales take many values)."""
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    e = torch.randint(-10, 11, (m, -(-k // 16)), generator=g).repeat_interleave(16, dim=1)[:, :k]
    x = x * torch.pow(2.0, e.to(torch.float64))
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    return x.to(dtype)


def assert_same(golden: QuantizedTensor, cand: QuantizedTensor, label: str) -> None:
    """Every field of every copy equal (amax as fp32 bits); the candidate's scale padding is zero."""
    assert isinstance(cand, QuantizedTensor), f"{label}: native returned {type(cand).__name__}"
    assert cand.shape == golden.shape and cand.hp_dtype == golden.hp_dtype, label
    cfg = golden.config
    for o in ("rowwise", "colwise"):
        assert cand.has(o) == golden.has(o), f"{label}: {o} copy present {cand.has(o)}, golden {golden.has(o)}"
        if not golden.has(o):
            continue
        for f in ("data", "scale", "amax"):
            g = getattr(golden, f"{o}_{f}")
            c = getattr(cand, f"{o}_{f}")
            if g is None:
                assert c is None, f"{label}: {o}_{f} is not None"
                continue
            assert c.is_cuda, f"{label}: {o}_{f} is on {c.device}"
            c = c.cpu()
            assert c.shape == g.shape and c.dtype == g.dtype, f"{label}: {o}_{f} {c.shape} {c.dtype} vs {g.shape} {g.dtype}"
            if g.dtype == torch.float32:
                gb, cb = g.view(torch.int32), c.view(torch.int32)
                assert torch.equal(gb, cb), f"{label}: {o}_{f} bits {cb.flatten()[:4].tolist()} != {gb.flatten()[:4].tolist()}"
                continue
            bad = (g != c).nonzero()
            if bad.numel():
                i = tuple(bad[0].tolist())
                raise AssertionError(f"{label}: {o}_{f} differs at {bad.shape[0]} of {g.numel()} bytes; first {i}: "
                                     f"native {int(c[i]):#04x} golden {int(g[i]):#04x}")
            if f == "scale" and cfg.scheme in ("nvfp4", "mxfp8"):
                rows, cols = layouts.scale_valid_shape(cfg, o, golden.m, golden.k)
                pad = c.clone()
                pad[:rows, :cols] = 0
                assert int(pad.count_nonzero()) == 0, f"{label}: {o}_scale padding is not zero"


# ---- a given amax (docs/numerics.md §1, §5.1) ------------------------------------------------------

NVFP4_GIVEN = {
    "1x16": QuantConfig("nvfp4"),
    "16x16": QuantConfig("nvfp4", tile=(16, 16)),
    "1x16-sr": QuantConfig("nvfp4", stochastic=True),
    "16x16-sr": QuantConfig("nvfp4", tile=(16, 16), stochastic=True),
}
FP8_GIVEN = {
    "e4m3": QuantConfig("fp8_current"),
    "e5m2": QuantConfig("fp8_current", element="e5m2"),
    "e4m3-pow2": QuantConfig("fp8_current", pow2_scales=True),
}
# How the given amax relates to amax(X): equal, a larger reduced one, a smaller one (codes saturate), +inf, +0.
AMAX_KINDS = ("equal", "larger", "smaller", "inf", "zero")


def given_amax(x: torch.Tensor, kind: str) -> torch.Tensor:
    a = x.abs().to(torch.float32).nan_to_num(nan=0.0).amax().reshape(1)
    return {"equal": a, "larger": a * 3.5, "smaller": a * 0.25, "inf": torch.full((1,), float("inf")),
            "zero": torch.zeros(1)}[kind].to(torch.float32)


@pytest.mark.parametrize("kind", AMAX_KINDS)
@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cfg_name", list(NVFP4_GIVEN))
@pytest.mark.parametrize("shape", [(16, 16), (48, 80), (144, 1040), (256, 128)])
def test_nvfp4_given_amax_matches_golden(shape, cfg_name, dtype, copies, kind):
    import native

    cfg = NVFP4_GIVEN[cfg_name]
    rw, cw = COPIES[copies]
    x = make_x(shape, DTYPES[dtype], seed=seed_of(shape, dtype))
    a = given_amax(x, kind)
    for rng in SEEDS[:2] if cfg.stochastic else (None,):
        gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, rng=rng, amax=a)
        cand = native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, rng=rng, amax=a.cuda())
        assert_same(gold, cand, f"{cfg.id} {shape} {dtype} {copies} amax={kind} rng={rng}")


def test_nvfp4_given_amax_skips_the_amax_kernel_and_reads_x_once():
    """docs/numerics.md §5.1: with a given amax the launcher runs no amax pass: the quantize kernel, then (the shape
    pads both copies' scales) nvfp4_scale_padding, and the padding is zero."""
    from native import nvfp4

    cfg = QuantConfig("nvfp4")
    x = make_x((48, 80), torch.bfloat16, seed=3).cuda()
    real = nvfp4._launcher(cfg, x.device)
    names: list[str] = []

    def record(name, *args, **kwargs):
        names.append(name)
        return real(name, *args, **kwargs)

    a = torch.tensor([7.5], device="cuda")
    fields = nvfp4.quantize_with(record, x, cfg, rowwise=True, colwise=True, seed=None, given=a)
    assert names == ["nvfp4_quantize_bf16", "nvfp4_scale_padding"]  # (48 x 80 pads both copies' scales)
    gold = reference.quantize(x.cpu(), cfg, rowwise=True, colwise=True, amax=a.cpu())
    assert_same(gold, QuantizedTensor(cfg, (48, 80), "bfloat16", **fields), "recorded launch")
    names.clear()
    nvfp4.quantize_with(record, x, cfg, rowwise=True, colwise=True, seed=None)
    assert names == ["nvfp4_amax_bf16", "nvfp4_quantize_bf16", "nvfp4_scale_padding"]  # without one: the amax pass


@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("cfg_name", list(NVFP4_GIVEN))
def test_nvfp4_given_amax_out_writes_every_scale_byte_over_poison(cfg_name, copies):
    """A planned call with a given amax into out= whose scale tensors hold 0xAB everywhere, padding included (the
    shape pads both copies'): the call writes every scale byte, the zero padding too (docs/numerics.md §5.9); no
    launch clears the scales before the quantize kernel."""
    import native

    cfg = NVFP4_GIVEN[cfg_name]
    rw, cw = COPIES[copies]
    rng = SEEDS[0] if cfg.stochastic else None
    x = make_x((144, 208), torch.bfloat16, seed=11)
    a = given_amax(x, "larger")
    gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, rng=rng, amax=a)
    x_gpu, a_gpu = x.cuda(), a.cuda()
    native.clear_plans()
    native.quantize(x_gpu, cfg, rowwise=rw, colwise=cw, rng=rng, amax=a_gpu)  # the first call of its signature
    q = native.quantize(x_gpu, cfg, rowwise=rw, colwise=cw, rng=rng, amax=a_gpu)  # a plan's outputs: out= takes them
    for _ in range(2):  # twice: the second call's out= is the first's (already written) memory, poisoned again
        padded = 0
        for o in [o for o in ("rowwise", "colwise") if q.has(o)]:
            scale = getattr(q, f"{o}_scale")
            padded += scale.numel() - math.prod(layouts.scale_valid_shape(cfg, o, 144, 208))
            scale.fill_(0xAB)
        assert padded > 0, "the shape must pad a requested scale tensor"
        assert native.quantize(x_gpu, cfg, rowwise=rw, colwise=cw, rng=rng, amax=a_gpu, out=q) is q
        assert_same(gold, q, f"{cfg.id} {copies} given amax out= over 0xAB scales")


@pytest.mark.parametrize("kind", AMAX_KINDS)
@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cfg_name", list(FP8_GIVEN))
@pytest.mark.parametrize("shape", [(1, 1), (33, 70), (128, 128), (300, 257)])
def test_fp8_current_given_amax_matches_golden(shape, cfg_name, dtype, copies, kind):
    import native

    cfg = FP8_GIVEN[cfg_name]
    rw, cw = COPIES[copies]
    x = make_x(shape, DTYPES[dtype], seed=seed_of(shape, dtype, 1))
    a = given_amax(x, kind)
    gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, amax=a)
    cand = native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, amax=a.reshape(()).cuda())
    assert_same(gold, cand, f"{cfg.id} {shape} {dtype} {copies} amax={kind}")


def test_fp8_current_given_amax_skips_the_amax_kernel(monkeypatch):
    """docs/numerics.md §1: the cast kernel takes the given amax; tensor_amax is not launched."""
    import native
    from native import per_tensor

    names: list[str] = []
    real = per_tensor.launch

    def record(mod, name, *args, **kwargs):
        names.append(name)
        return real(mod, name, *args, **kwargs)

    monkeypatch.setattr(per_tensor, "launch", record)
    cfg = QuantConfig("fp8_current")
    x = make_x((64, 96), torch.float32, seed=5)
    native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, amax=torch.tensor([2.0]))
    assert names == ["per_tensor_cast_f32"]
    names.clear()
    native.quantize(x.cuda(), cfg, rowwise=True, colwise=True)
    assert names == ["tensor_amax_f32", "per_tensor_cast_f32"]


@pytest.mark.parametrize("cfg", [QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16)), QuantConfig("fp8_current")],
                         ids=lambda c: c.id)
def test_reduced_shard_amax_equals_the_whole_tensor_quantization(cfg):
    """docs/numerics.md §5.1: the max of the shards' amaxes is amax(X), so native with the reduced amax equals the
    golden without one (an oracle independent of the given-amax path)."""
    import native

    x = make_x((192, 160), torch.bfloat16, seed=11)
    shards = [native.quantize(x[i:i + 48].cuda(), cfg).rowwise_amax for i in range(0, 192, 48)]
    a = reduce_amax(shards)
    gold = reference.quantize(x, cfg, rowwise=True, colwise=True)
    assert_same(gold, native.quantize(x.cuda(), cfg, rowwise=True, colwise=True, amax=a), f"{cfg.id} reduced")


@pytest.mark.parametrize("bad", [torch.tensor([-1.0]), torch.tensor([float("nan")]), torch.zeros(2),
                                 torch.tensor([1.0], dtype=torch.float64)], ids=["neg", "nan", "shape", "f64"])
def test_native_rejects_a_bad_given_amax_as_the_reference_does(bad):
    import native

    x = make_x((32, 32), torch.float32, seed=1)
    for cfg in (QuantConfig("nvfp4"), QuantConfig("fp8_current")):
        with pytest.raises(SpecViolation) as gold:
            reference.quantize(x, cfg, amax=bad)
        with pytest.raises(SpecViolation) as cand:  # a host amax: its value is checked (docs/numerics.md §5.1)
            native.quantize(x.cuda(), cfg, amax=bad)
        assert str(cand.value) == str(gold.value)
    if bad.numel() == 1 and bad.dtype == torch.float32:  # a device amax's value is taken as given (no sync)
        native.quantize(x.cuda(), QuantConfig("fp8_current"), amax=bad.cuda())


# ---- grouped (split) quantization (docs/numerics.md §12.1) ------------------------------------------

GROUPED = {
    "nvfp4": QuantConfig("nvfp4"),
    "nvfp4-16x16": QuantConfig("nvfp4", tile=(16, 16)),
    "nvfp4-sr": QuantConfig("nvfp4", stochastic=True),
    "nvfp4-16x16-sr": QuantConfig("nvfp4", tile=(16, 16), stochastic=True),
    "nvfp4-rht": QuantConfig("nvfp4", rht=True),
    "nvfp4-rht-sr": QuantConfig("nvfp4", rht=True, stochastic=True),
    "mxfp8": QuantConfig("mxfp8"),
    "mxfp8-e5m2": QuantConfig("mxfp8", element="e5m2"),
}
SPLITS = {  # (K, splits): empty groups first, inside and last; groups smaller and larger than a 128-row tile
    "nvfp4": (80, [0, 48, 16, 0, 144, 32, 0]),
    "mxfp8": (96, [64, 0, 32, 160, 0]),
}


@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cfg_name", list(GROUPED))
def test_grouped_quantize_matches_golden(cfg_name, dtype, copies):
    from native import grouped

    cfg = GROUPED[cfg_name]
    if cfg.rht and dtype != "bfloat16":
        pytest.skip("RHT takes bfloat16 input (docs/numerics.md §5.6)")
    rw, cw = COPIES[copies]
    k, splits = SPLITS[cfg.scheme]
    x = make_x((sum(splits), k), DTYPES[dtype], seed=seed_of(cfg_name, dtype))
    x[:32] *= 2.0**-6  # the first non-empty group's amax far below the others': the groups' scales differ
    for rng in SEEDS if cfg.stochastic else (None,):
        gold = ref_grouped.quantize(x, cfg, splits, rowwise=rw, colwise=cw, rng=rng)
        cand = grouped.quantize(x.cuda(), cfg, splits, rowwise=rw, colwise=cw, rng=rng)
        assert len(cand) == len(splits)
        for g, (s, gq, cq) in enumerate(zip(splits, gold, cand, strict=True)):
            if s == 0:
                assert cq is None and gq is None, f"group {g} is empty"
                continue
            assert_same(gq, cq, f"{cfg.id} {dtype} {copies} rng={rng} group {g}")


def test_grouped_groups_have_their_own_amax_and_streams():
    """docs/numerics.md §12.1: group g is the native quantization of its own rows with (seed, stream + 2g)."""
    import native
    from native import grouped

    cfg = QuantConfig("nvfp4", stochastic=True)
    x = make_x((64, 32), torch.bfloat16, seed=9).cuda()
    rng = SRSeed(42, 10)
    out = grouped.quantize(x, cfg, [16, 0, 48], rowwise=True, colwise=True, rng=rng)
    alone = native.quantize(x[16:], cfg, rowwise=True, colwise=True, rng=SRSeed(42, 14))
    assert torch.equal(out[2].rowwise_data, alone.rowwise_data) and torch.equal(out[2].colwise_data, alone.colwise_data)
    assert torch.equal(out[2].rowwise_amax, x[16:].abs().float().amax().reshape(1))


@pytest.mark.parametrize("splits", [[16, 16], [32, 8, 24], [-16, 80]], ids=["sum", "tile", "negative"])
def test_grouped_rejects_bad_splits_as_the_reference_does(splits):
    from native import grouped

    x = make_x((64, 32), torch.bfloat16, seed=2)
    with pytest.raises(SpecViolation) as gold:
        ref_grouped.quantize(x, QuantConfig("nvfp4"), splits)
    with pytest.raises(SpecViolation) as cand:
        grouped.quantize(x.cuda(), QuantConfig("nvfp4"), splits)
    assert str(cand.value) == str(gold.value)


def test_native_backend_runs_grouped_cases():
    """The harness's native backend takes grouped cases (no skip) and returns one QuantizedTensor per group."""
    from harness.backends import NativeBackend

    b = NativeBackend()
    cfg = QuantConfig("mxfp8")
    assert b.supports("grouped_quantize", cfg, "cuda") == (True, "")
    with pytest.raises(SpecViolation, match="grouped quantization exists for"):
        b.grouped_quantize(torch.zeros(32, 32, device="cuda"), QuantConfig("fp8_current"), [32])
    x = make_x((96, 64), torch.bfloat16, seed=4)
    out = b.grouped_quantize(x.cuda(), cfg, [32, 64], rowwise=True, colwise=True)
    for gq, cq in zip(ref_grouped.quantize(x, cfg, [32, 64], rowwise=True, colwise=True), out, strict=True):
        assert_same(gq, cq, "backend")


# ---- stochastic rounding on 16x16 tiles (docs/numerics.md §5.7) --------------------------------------


@pytest.mark.parametrize("copies", list(COPIES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(16, 16), (48, 80), (144, 1040), (272, 64)])
def test_nvfp4_16x16_sr_matches_golden(shape, dtype, copies):
    import native

    cfg = QuantConfig("nvfp4", tile=(16, 16), stochastic=True)
    assert native.supports("quantize", cfg, "cuda") == (True, "")
    rw, cw = COPIES[copies]
    x = make_x(shape, DTYPES[dtype], seed=seed_of(shape, dtype, 2))
    for rng in SEEDS:
        gold = reference.quantize(x, cfg, rowwise=rw, colwise=cw, rng=rng)
        cand = native.quantize(x.cuda(), cfg, rowwise=rw, colwise=cw, rng=rng)
        assert_same(gold, cand, f"{cfg.id} {shape} {dtype} {copies} rng={rng}")


def test_nvfp4_16x16_sr_colwise_is_its_own_draw():
    """docs/numerics.md §5.7: the 16x16 columnwise scales are the transpose of the rowwise ones, the codes an
    independent SR of X^T (stream + 1), so they differ from the rowwise codes transposed somewhere."""
    import native

    cfg = QuantConfig("nvfp4", tile=(16, 16), stochastic=True)
    x = make_x((64, 64), torch.float32, seed=8).cuda()
    q = native.quantize(x, cfg, rowwise=True, colwise=True, rng=SEEDS[0])
    # The 16x16 tile grid T [4, 4]: rowwise_scale[16 mb + i, kb] = T[mb, kb], colwise_scale[16 kb + i, mb] = T[mb, kb].
    assert torch.equal(q.colwise_scale[:64:16, :4], q.rowwise_scale[:64:16, :4].t())

    def codes(data):  # unpacked E2M1 codes, [rows, 2 * cols]: even element in the low nibble (§5.4)
        return torch.stack([data & 0xF, data >> 4], dim=-1).reshape(data.shape[0], -1)

    assert not torch.equal(codes(q.colwise_data), codes(q.rowwise_data).t())


# ---- the harness cases with --backend native ----------------------------------------------------------

GROUPED_IDS = [
    "grouped_quantize-mxfp8-e4m3-1x32-both-bf16-256x128-g96_0_160-normal-s0",
    "grouped_quantize-mxfp8-e4m3-1x32-both-bf16-256x128-g64_64_64_64-special-s0",
    "grouped_quantize-nvfp4-e2m1-1x16-rht-both-bf16-256x128-g0_128_128-normal-s0",
    "grouped_quantize-nvfp4-e2m1-1x16-rht-sr-rowwise-bf16-256x128-g32_0_224-normal-s0",
]


@pytest.mark.parametrize("case_id", GROUPED_IDS)
def test_harness_grouped_cases_pass_on_native(case_id):
    from harness.cases import Case
    from harness.runner import run_case

    rows = run_case(Case.from_id(case_id), "native", "cuda")
    # Conformance rows pass; the accuracy rows are informational ("info"), and the pair is exact.
    bad = [(r["tensor"], r["status"], r["reason"]) for r in rows if r["status"] not in ("pass", "info")]
    assert rows and not bad, bad
    assert any(r["kind"] == "conformance" and r["status"] == "pass" for r in rows)
    assert {r["severity"] for r in rows} == {"exact"}


EPILOGUE_IDS = [
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_bf16-ep_gelu_aux-normal-s0",
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_bf16-bias-ep_gelu_aux-exact_representable-s0",
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_f32-ep_gelu_aux-normal-s0",
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_bf16-ep_dgelu-normal-s0",
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_f32-ep_dgelu-exact_representable-s0",
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_bf16-ep_bgradb-normal-s0",
    "gemm-TN-fp8_current-e4m3-bf16-128x96x256-out_f32-ep_bgradb-exact_representable-s0",
]


@pytest.mark.parametrize("case_id", EPILOGUE_IDS)
def test_harness_fp8_epilogue_cases_on_native_cublaslt(case_id):
    """docs/numerics.md §12.2: per-tensor FP8 TN on sm_89+ runs the epilogue in one cublasLtMatmul; every output
    within the derived bound (aux / bgradb's out as a plain GEMM). A cuBLASLt refusal is a skip naming it."""
    from harness.cases import Case
    from harness.runner import run_case

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("per-tensor FP8 cuBLASLt needs sm_89+")
    rows = run_case(Case.from_id(case_id), "native", "cuda")
    if len(rows) == 1 and rows[0]["status"] == "skip":
        assert "cuBLASLt refused" in rows[0]["reason"] or "cuBLASLt found no algorithm" in rows[0]["reason"], rows[0]
        pytest.skip(rows[0]["reason"])
    want = {"out", "aux"} if "gelu_aux" in case_id else {"out", "bgrad"} if "bgradb" in case_id else {"out"}
    assert {r["tensor"] for r in rows if r["status"] != "skip"} >= want, [(r["tensor"], r["status"]) for r in rows]
    bad = [(r["tensor"], r["status"], r["reason"]) for r in rows if r["tensor"] in want and r["status"] != "pass"]
    assert not bad, bad


def test_native_epilogues_refuse_the_portable_kernel():
    """Where the GEMM resolves to the portable kernel (or is asked for it) the epilogue is Unsupported, not emulated."""
    from native.gemm import gemm_epilogue

    cfg = QuantConfig("fp8_current")
    a = native_quantize(make_x((64, 32), torch.bfloat16, seed=1), cfg)
    b = native_quantize(make_x((32, 32), torch.bfloat16, seed=2), cfg)
    with pytest.raises(Unsupported, match="portable kernel has none"):
        gemm_epilogue(a, b, epilogue="gelu_aux", method="portable")
    with pytest.raises(SpecViolation, match="takes no bias"):
        gemm_epilogue(a, b, epilogue="dgelu", bias=torch.zeros(32, device="cuda"),
                      aux=torch.zeros(64, 32, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(SpecViolation, match="needs aux"):
        gemm_epilogue(a, b, epilogue="dgelu")


def native_quantize(x: torch.Tensor, cfg: QuantConfig) -> QuantizedTensor:
    import native

    return native.quantize(x.cuda(), cfg, rowwise=True, colwise=True)
