"""The golden reference gives identical bytes on CUDA and on CPU (docs/numerics.md §0.2.8).

Source: docs/numerics.md §0.2 (emulation rules that make the reference device-independent), §1-§5
(every scheme and toggle), §6 (GEMM methods). Inputs come from `harness.inputs.generate` (seeded on
the CPU, so both devices see the same bits); the same tensor is quantized by `reference.quantize`
on the CPU and on CUDA and every field (codes, scales, amaxes, padding) must be byte-identical;
then `reference.dequantize` of each copy; then `reference.gemm` (each method) of CPU-quantized
operands moved to CUDA as they are.

Covered: fp8_current (e4m3/e5m2, pow2 on/off, eps; whole-tensor special patterns: zeros, +-0,
NaN, Inf, subnormals, dtype max, tiny amax), fp8_delayed (several steps with micro-batches, updates
with and without a reduced amax, zero and inf steps), fp8_block (1x128 / 128x128, pow2 on/off,
e4m3/e5m2, eps, bf16/fp32/fp16 input, partial tiles), mxfp8 (1x32 / 32x32, ceil / floor, e4m3/e5m2),
nvfp4 (1x16 / 16x16, RHT, SR with a fixed 64-bit seed, fp32/bf16/fp16 input where allowed);
rowwise+colwise (and each alone); normal, heavy-tailed, tie-placed, exhaustive-code and special
inputs (zeros, -0, NaN of both signs, +-Inf, input-dtype subnormals, dtype max, tiny amax).

What is NOT expected to be bitwise equal across devices, and how it is handled:
1. NaN payloads of float outputs (dequantize, gemm). The contract fixes codes (a NaN input gives
   code 0x7F), not the payload of a NaN produced by fp32 arithmetic: CUDA returns the canonical
   NaN, x86 propagates the operand's payload. Float outputs therefore compare bit for bit except
   that a NaN matches any NaN. Quantized fields (codes, scales, amaxes) compare byte for byte.
2. `reference.gemm` takes fp64 sums with a matmul / einsum (cuBLAS on CUDA, the CPU BLAS on the
   CPU), whose summation orders differ. The results are equal when every fp64 product and partial
   sum is exact, and also for "block_sum" / "blockwise_order" whenever each block's own sum is exact
   by the formats (their block terms are added in a fixed K order, docs/numerics.md §6); each GEMM
   test checks this before asserting (`reference.gemm.device_independent`), and otherwise skips with
   the reason. Expected skips: method "exact" of fp8_block with fp32 (non-pow2) scales (28-bit x
   28-bit products round in fp64), and "exact" on inputs whose K sums span more than 52 bits
   (per_tile_scales, tiny-amax or subnormal blocks next to large ones). "block_sum" (MXFP8, NVFP4)
   and "blockwise_order" are asserted on them.
3. FP8 NaN codes in GEMM operands: NaN inputs are replaced by 0 before quantizing GEMM operands
   (NaN propagation through a BLAS, which may skip zero operands, is outside the contract).
"""

from __future__ import annotations

import pytest
import torch

import reference
from harness.cases import Case
from harness.inputs import generate
from reference.formats import QuantConfig
from reference.gemm import METHODS_FOR_SCHEME, device_independent
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor, SRSeed

DEVICE = "cuda"  # the device compared against the CPU
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SR_SEED = SRSeed((1 << 40) + 0x2345, 3)  # a seed with a non-zero high key word (docs/numerics.md §5.7)

# --------------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------------

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
             torch.float64: torch.int64, torch.uint8: torch.uint8, torch.int32: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns of a float tensor; integer and bool tensors compare as they are."""
    view = _INT_VIEW.get(t.dtype)
    return t.contiguous() if view is None else t.contiguous().view(view)


def assert_same(cpu: torch.Tensor | None, dev: torch.Tensor | None, what: str, *, nan_equal: bool = False) -> None:
    """Identical dtype, shape and bits (`nan_equal`: a NaN matches any NaN, see the module docstring)."""
    assert (cpu is None) == (dev is None), f"{what}: present on one device only (cpu {cpu is None}, {DEVICE} {dev is None})"
    if cpu is None:
        return
    assert torch.device(dev.device).type == torch.device(DEVICE).type, f"{what}: computed on {dev.device}, not {DEVICE}"
    dev = dev.cpu()
    assert (cpu.dtype, tuple(cpu.shape)) == (dev.dtype, tuple(dev.shape)), (
        f"{what}: cpu {cpu.dtype} {tuple(cpu.shape)} vs {DEVICE} {dev.dtype} {tuple(dev.shape)}"
    )
    bc, bd = _bits(cpu), _bits(dev)
    bad = bc != bd
    if nan_equal and cpu.is_floating_point():
        bad &= ~(torch.isnan(cpu) & torch.isnan(dev))
    if bool(bad.any()):
        idx = tuple(torch.nonzero(bad)[0].tolist())
        width = 2 * cpu.element_size()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ between cpu and {DEVICE}; first at {idx}: "
            f"cpu 0x{int(bc[idx]) & ((1 << 4 * width) - 1):0{width}X} ({cpu[idx].item()!r}), "
            f"{DEVICE} 0x{int(bd[idx]) & ((1 << 4 * width) - 1):0{width}X} ({dev[idx].item()!r})"
        )


def assert_same_quantized(qc: QuantizedTensor, qd: QuantizedTensor, what: str) -> None:
    """Every field of two QuantizedTensors byte-identical (padding included)."""
    assert (qc.config, tuple(qc.shape), qc.hp_dtype) == (qd.config, tuple(qd.shape), qd.hp_dtype), what
    for name in QuantizedTensor.TENSOR_FIELDS:
        assert_same(getattr(qc, name), getattr(qd, name), f"{what}: {name}")
    assert set(qc.extra) == set(qd.extra), f"{what}: extra keys {sorted(qc.extra)} vs {sorted(qd.extra)}"
    for key, v in qc.extra.items():
        if isinstance(v, torch.Tensor):
            assert_same(v, qd.extra[key], f"{what}: extra[{key!r}]")
        else:
            assert v == qd.extra[key], f"{what}: extra[{key!r}] {v!r} vs {qd.extra[key]!r}"


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def make_x(cfg: QuantConfig, shape: tuple[int, int], dist: str, dtype: str, seed: int = 0) -> torch.Tensor:
    """A CPU input from the harness generators (quantize case of `cfg`)."""
    return generate(Case("quantize", cfg, shape, in_dtype=dtype, distribution=dist, seed=seed))["x"]


def check_quantize(cfg: QuantConfig, x: torch.Tensor, what: str, *, orientations=("both",)) -> None:
    """reference.quantize / dequantize on the CPU and on DEVICE give the same bytes."""
    rng = SR_SEED if cfg.stochastic else None
    xd = x.to(DEVICE)
    for orient in orientations:
        row, col = orient in ("both", "rowwise"), orient in ("both", "colwise")
        qc = reference.quantize(x, cfg, rowwise=row, colwise=col, rng=rng)
        qd = reference.quantize(xd, cfg, rowwise=row, colwise=col, rng=rng)
        assert_same_quantized(qc, qd, f"{what} quantize[{orient}]")
        for o in [o for o, on in (("rowwise", row), ("colwise", col)) if on]:
            for out in (torch.float32, torch.bfloat16):
                assert_same(reference.dequantize(qc, o, out), reference.dequantize(qd, o, out),
                            f"{what} dequantize[{orient}] {o} -> {out}", nan_equal=True)


# --------------------------------------------------------------------------------------------
# Quantize + dequantize: every scheme and toggle
# --------------------------------------------------------------------------------------------

# (id, config, shape for normal / heavy / ties / exhaustive, shape for multi-tile special)
_QCONFIGS = [
    ("fp8_current-e4m3", QuantConfig("fp8_current"), (130, 257), (130, 257)),
    ("fp8_current-e5m2", QuantConfig("fp8_current", element="e5m2"), (130, 257), (130, 257)),
    ("fp8_current-e4m3-pow2", QuantConfig("fp8_current", pow2_scales=True), (130, 257), (130, 257)),
    ("fp8_current-e5m2-pow2", QuantConfig("fp8_current", element="e5m2", pow2_scales=True), (130, 257), (130, 257)),
    ("fp8_current-e4m3-eps", QuantConfig("fp8_current", eps=2.0**-20), (130, 257), (130, 257)),
    ("fp8_current-e4m3-pow2-eps", QuantConfig("fp8_current", pow2_scales=True, eps=0.5), (130, 257), (130, 257)),
    ("fp8_block-1x128", QuantConfig("fp8_block"), (130, 257), (260, 390)),
    ("fp8_block-1x128-fp32scale", QuantConfig("fp8_block", pow2_scales=False), (130, 257), (260, 390)),
    ("fp8_block-1x128-e5m2", QuantConfig("fp8_block", element="e5m2"), (3, 200), (260, 390)),
    ("fp8_block-1x128-eps", QuantConfig("fp8_block", pow2_scales=False, eps=2.0**-30), (3, 200), (260, 390)),
    ("fp8_block-128x128", QuantConfig("fp8_block", tile=(128, 128)), (130, 257), (260, 390)),
    ("fp8_block-128x128-fp32scale", QuantConfig("fp8_block", tile=(128, 128), pow2_scales=False), (130, 257), (260, 390)),
    ("fp8_block-128x128-e5m2", QuantConfig("fp8_block", tile=(128, 128), element="e5m2"), (3, 200), (260, 390)),
    ("mxfp8-1x32", QuantConfig("mxfp8"), (64, 96), (96, 128)),
    ("mxfp8-1x32-floor", QuantConfig("mxfp8", e8m0_rule="floor"), (64, 96), (96, 128)),
    ("mxfp8-1x32-e5m2", QuantConfig("mxfp8", element="e5m2"), (64, 96), (96, 128)),
    ("mxfp8-1x32-e5m2-floor", QuantConfig("mxfp8", element="e5m2", e8m0_rule="floor"), (64, 96), (96, 128)),
    ("mxfp8-32x32", QuantConfig("mxfp8", tile=(32, 32)), (64, 96), (96, 128)),
    ("mxfp8-32x32-e5m2-floor", QuantConfig("mxfp8", tile=(32, 32), element="e5m2", e8m0_rule="floor"), (64, 96), (96, 128)),
    ("nvfp4-1x16", QuantConfig("nvfp4"), (48, 80), (64, 80)),
    ("nvfp4-16x16", QuantConfig("nvfp4", tile=(16, 16)), (48, 80), (64, 80)),
    ("nvfp4-1x16-sr", QuantConfig("nvfp4", stochastic=True), (48, 80), (64, 80)),
    ("nvfp4-1x16-rht", QuantConfig("nvfp4", rht=True), (48, 80), (64, 80)),
    ("nvfp4-1x16-rht-sr", QuantConfig("nvfp4", rht=True, stochastic=True), (48, 80), (64, 80)),
]


def _quantize_params():
    """(id, config, shape, distribution, in_dtype, seed): base bf16 inputs, then dtype variants."""
    out = []
    for cid, cfg, shape, sshape in _QCONFIGS:
        dists = [("normal", shape), ("heavy_tail", shape), ("special", sshape), ("ties", shape)]
        if cfg.scheme != "nvfp4" or not cfg.rht:
            dists.append(("exhaustive", shape))
        for dist, shp in dists:
            out.append((cid, cfg, shp, dist, "bfloat16", 0))
        if cfg.rht:
            continue  # NUMERICS: §5.6 - RHT takes bf16 input only
        for dtype in ("float32", "float16"):
            for dist, shp in (("normal", shape), ("special", sshape)):
                out.append((cid, cfg, shp, dist, dtype, 1))
    return [pytest.param(*p[1:], id=f"{p[0]}-{p[3]}-{p[4]}-{'x'.join(map(str, p[2]))}") for p in out]


def test_every_quantize_input_builds_on_the_cpu():
    """Each GPU case's input is built on the CPU first; build them all here, so a parameter set this
    file cannot construct (e.g. a config id that does not round-trip) fails in CPU CI too."""
    params = _quantize_params()
    assert len(params) > 100
    for p in params:
        cfg, shape, dist, dtype, seed = p.values
        x = make_x(cfg, shape, dist, dtype, seed)
        assert (tuple(x.shape), x.dtype, x.device.type) == (shape, DTYPES[dtype], "cpu"), p.id


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,shape,dist,dtype,seed", _quantize_params())
def test_quantize_dequantize_same_bytes(cfg, shape, dist, dtype, seed):
    """Codes, scales, amaxes and both dequantizations: identical on the CPU and on CUDA."""
    x = make_x(cfg, shape, dist, dtype, seed)
    check_quantize(cfg, x, f"{cfg.id} {dist} {dtype} {shape}")


# Per-tensor schemes see one amax for the whole tensor: a single special tile makes the whole
# tensor one pattern (harness.inputs SPECIAL_PATTERNS, chosen by the seed).
_WHOLE_TENSOR_PATTERNS = 11


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize(
    "cfg",
    [QuantConfig("fp8_current"), QuantConfig("fp8_current", element="e5m2", pow2_scales=True),
     QuantConfig("fp8_current", eps=0.5)],
    ids=lambda c: c.id,
)
def test_per_tensor_whole_tensor_special_patterns(cfg, dtype):
    """fp8_current on all-zero, +-0, NaN, Inf, subnormal, dtype-max and tiny-amax tensors."""
    for seed in range(_WHOLE_TENSOR_PATTERNS):
        x = make_x(cfg, (31, 29), "special", dtype, seed)
        check_quantize(cfg, x, f"{cfg.id} special pattern {seed} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("cid,cfg,shape,_s", [pytest.param(*c, id=c[0]) for c in _QCONFIGS])
def test_single_orientation_same_bytes(cid, cfg, shape, _s):
    """rowwise-only and colwise-only calls (separate code paths) agree across devices too."""
    x = make_x(cfg, shape, "special", "bfloat16", 2)
    check_quantize(cfg, x, f"{cid} special", orientations=("rowwise", "colwise"))


# --------------------------------------------------------------------------------------------
# fp8_delayed: quantize steps, micro-batches and the fused history update
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize(
    "cfg",
    [
        QuantConfig("fp8_delayed", amax_history_len=4),
        QuantConfig("fp8_delayed", element="e5m2", amax_history_len=4, amax_compute_algo="most_recent", margin=1),
        QuantConfig("fp8_delayed", amax_history_len=1, margin=-2),
    ],
    ids=lambda c: c.id,
)
def test_delayed_steps_same_bytes(cfg, dtype):
    """State, codes and sinv after every step (docs/numerics.md §2), CPU state vs CUDA state."""
    sc, sd = AmaxHistory(cfg, device="cpu"), AmaxHistory(cfg, device=DEVICE)
    normal = make_x(cfg, (67, 130), "normal", dtype, 0)
    heavy = make_x(cfg, (67, 130), "heavy_tail", dtype, 1)
    special = make_x(cfg, (67, 130), "special", dtype, 2)  # holds +-Inf: the amax is inf
    zeros = torch.zeros(67, 130, dtype=DTYPES[dtype])
    tiny = make_x(cfg, (31, 29), "special", dtype, 7)  # harness pattern 7: tiny amax
    # (inputs quantized in this step, reduced amax passed to update)
    steps = [
        ((normal, heavy), None),  # two micro-batches: H[0] = fmax of both
        ((heavy,), None),
        ((normal,), torch.tensor([3.0])),  # a cross-rank reduced amax overrides H[0]
        ((zeros,), None),  # last = 0: nothing changes
        ((special,), None),  # amax inf: the scale freezes while inf is in the window
        ((tiny,), None),
        ((normal,), torch.tensor([0.0])),  # R = 0: H[0] is used
        ((heavy,), None),
    ]
    for i, (xs, reduced) in enumerate(steps):
        for j, x in enumerate(xs):
            qc = reference.quantize(x, cfg, rowwise=True, colwise=True, state=sc)
            qd = reference.quantize(x.to(DEVICE), cfg, rowwise=True, colwise=True, state=sd)
            assert_same_quantized(qc, qd, f"{cfg.id} step {i} batch {j}")
            for o in ("rowwise", "colwise"):
                assert_same(reference.dequantize(qc, o), reference.dequantize(qd, o),
                            f"{cfg.id} step {i} dequantize {o}", nan_equal=True)
        assert_same(sc.history, sd.history, f"{cfg.id} step {i} history before update")
        sc.update(reduced)
        sd.update(None if reduced is None else reduced.to(DEVICE))
        assert_same(sc.history, sd.history, f"{cfg.id} step {i} history after update")
        assert_same(sc.scale, sd.scale, f"{cfg.id} step {i} scale after update")


# --------------------------------------------------------------------------------------------
# GEMM: every method of reference.gemm
# --------------------------------------------------------------------------------------------


# (id, a config, b config, (M, N, K), layouts)
_GCONFIGS = [
    ("fp8_current", QuantConfig("fp8_current"), QuantConfig("fp8_current"), (23, 41, 57), ("TN", "NN", "NT")),
    ("fp8_current-hybrid", QuantConfig("fp8_current"), QuantConfig("fp8_current", element="e5m2"), (23, 41, 57),
     ("TN", "NN", "NT")),
    ("fp8_current-pow2", QuantConfig("fp8_current", pow2_scales=True), QuantConfig("fp8_current", pow2_scales=True),
     (23, 41, 57), ("TN",)),
    ("fp8_delayed", QuantConfig("fp8_delayed", amax_history_len=4), QuantConfig("fp8_delayed", amax_history_len=4),
     (23, 41, 57), ("TN", "NT")),
    ("fp8_block-1dx1d", QuantConfig("fp8_block"), QuantConfig("fp8_block"), (72, 40, 200), ("TN", "NN", "NT")),
    ("fp8_block-1dx1d-fp32scale", QuantConfig("fp8_block", pow2_scales=False),
     QuantConfig("fp8_block", pow2_scales=False), (72, 40, 200), ("TN", "NN", "NT")),
    ("fp8_block-1dx2d", QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128)), (72, 40, 200),
     ("TN", "NN")),
    ("fp8_block-2dx1d", QuantConfig("fp8_block", tile=(128, 128)), QuantConfig("fp8_block"), (72, 40, 200),
     ("TN", "NT")),
    ("fp8_block-hybrid", QuantConfig("fp8_block"), QuantConfig("fp8_block", element="e5m2"), (72, 40, 200), ("NN",)),
    ("mxfp8", QuantConfig("mxfp8"), QuantConfig("mxfp8"), (64, 32, 96), ("TN", "NN", "NT")),
    ("mxfp8-hybrid", QuantConfig("mxfp8", element="e5m2"), QuantConfig("mxfp8"), (64, 32, 96), ("TN", "NT")),
    ("mxfp8-32x32", QuantConfig("mxfp8"), QuantConfig("mxfp8", tile=(32, 32)), (64, 32, 96), ("TN", "NN")),
    ("nvfp4", QuantConfig("nvfp4"), QuantConfig("nvfp4"), (32, 48, 80), ("TN", "NN", "NT")),
    ("nvfp4-16x16", QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16)), (32, 48, 80), ("TN", "NN")),
    ("nvfp4-rht", QuantConfig("nvfp4", rht=True), QuantConfig("nvfp4", rht=True), (32, 48, 80), ("NT",)),
    ("nvfp4-rht-sr", QuantConfig("nvfp4", rht=True, stochastic=True), QuantConfig("nvfp4", rht=True, stochastic=True),
     (32, 48, 80), ("TN", "NT")),
]


def _gemm_params():
    out = []
    for gid, ca, cb, mnk, layouts in _GCONFIGS:
        for layout in layouts:
            for dist in ("normal", "heavy_tail", "special", "per_tile_scales"):
                for method in METHODS_FOR_SCHEME[ca.scheme]:
                    out.append(pytest.param(ca, cb, mnk, layout, dist, method, id=f"{gid}-{layout}-{dist}-{method}"))
    return out


def _gemm_operands(ca, cb, mnk, layout, dist):
    """CPU QuantizedTensors a, b (both copies) of harness gemm inputs; NaN -> 0 for FP8 (docstring 3)."""
    case = Case("gemm", ca, mnk, in_dtype="bfloat16", distribution=dist, seed=3, layout=layout, b_config=cb)
    inp = generate(case)
    qs = []
    for name, cfg, stream in (("a", ca, SR_SEED.stream), ("b", cb, SR_SEED.stream + 2)):
        x = inp[name]
        if cfg.scheme != "nvfp4":
            x = torch.nan_to_num(x, nan=0.0, posinf=float("inf"), neginf=float("-inf"))
        rng = SRSeed(SR_SEED.seed, stream) if cfg.stochastic else None
        qs.append(reference.quantize(x, cfg, rowwise=True, colwise=True, rng=rng))
    return qs


@pytest.mark.gpu
@pytest.mark.parametrize("ca,cb,mnk,layout,dist,method", _gemm_params())
def test_gemm_same_bits(ca, cb, mnk, layout, dist, method):
    """reference.gemm of identical operands: same bits on the CPU and on CUDA, every out dtype, with and
    without bias + C, where the bits are provably device-independent (module docstring, point 2)."""
    a, b = _gemm_operands(ca, cb, mnk, layout, dist)
    ok, why = device_independent(a, b, layout, method)
    if not ok:
        pytest.skip(f"not expected bitwise equal across devices: {why}")
    ad, bd = a.to(DEVICE), b.to(DEVICE)
    m, n, _ = mnk
    gen = torch.Generator().manual_seed(5)
    c32, bias32 = torch.randn(m, n, generator=gen), torch.randn(n, generator=gen)
    for out in (torch.bfloat16, torch.float32, torch.float16):
        for extra in (False, True):
            c = c32.to(out) if extra else None
            bias = bias32.to(out) if extra else None
            yc = reference.gemm(a, b, layout=layout, out_dtype=out, bias=bias, c=c, method=method)
            yd = reference.gemm(ad, bd, layout=layout, out_dtype=out,
                                bias=None if bias is None else bias.to(DEVICE),
                                c=None if c is None else c.to(DEVICE), method=method)
            assert_same(yc, yd, f"gemm {ca.id} x {cb.id} {layout} {dist} {method} -> {out} bias+C={extra}",
                        nan_equal=True)
