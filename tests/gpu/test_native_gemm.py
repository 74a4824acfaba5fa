"""Native GEMMs (native/gemm.py, native/cublaslt.py, native/cuda/block_scaled_gemm.cu).

What is checked, and against what (docs/numerics.md §6):
- CPU: the operand addressing (OperandView) of every scheme x orientation reproduces
  `reference.dequantize` bit for bit; kernel defines come from the formats rows; spec violations.
- GPU, exact-representable mode: every native method equals an fp64 oracle built from
  `reference.dequantize` (and `reference.gemm` where it is implemented) bit for bit.
- GPU, random operands: the portable kernel equals a PyTorch replay of its documented order bit for
  bit; cuBLASLt per-tensor equals `torch._scaled_mm` bit for bit (same flags); cuBLASLt blockwise
  equals TE's hardware-partials order (one `_scaled_mm` per 128-K block + FMA32) bit for bit and
  `F.scaled_mm`'s blockwise path where torch has it.
- A subnormal result survives the portable kernel (the -ftz=false toolchain check of §0.3).
"""

from __future__ import annotations

import math

import pytest
import torch

import reference
from native.gemm import kernel_defines, operand_view, supports_gemm
from reference import casts, fp32
from reference.formats import E4M3, FORMATS, QuantConfig
from reference.layouts import gemm_layout, scale_padded_shape
from reference.types import QuantizedTensor, SpecViolation, Unsupported

native_gemm = __import__("native").gemm  # the function (it shadows the submodule name)

# (id, a config, b config): every scheme, both E4M3 and HYBRID e4m3 x e5m2, blockwise 1D/2D mixes.
CONFIGS = [
    ("fp8_current", QuantConfig("fp8_current"), QuantConfig("fp8_current")),
    ("fp8_current-hybrid", QuantConfig("fp8_current"), QuantConfig("fp8_current", element="e5m2")),
    ("fp8_block-1dx1d", QuantConfig("fp8_block"), QuantConfig("fp8_block")),
    ("fp8_block-1dx2d", QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))),
    ("fp8_block-2dx1d", QuantConfig("fp8_block", tile=(128, 128)), QuantConfig("fp8_block")),
    ("mxfp8", QuantConfig("mxfp8"), QuantConfig("mxfp8")),
    ("mxfp8-hybrid", QuantConfig("mxfp8", element="e5m2"), QuantConfig("mxfp8")),
    ("nvfp4", QuantConfig("nvfp4"), QuantConfig("nvfp4")),
]
CONFIG_IDS = [c[0] for c in CONFIGS]


def _has_reference(scheme: str) -> bool:
    try:
        reference.quantize(torch.ones(32, 32), QuantConfig(scheme))
    except NotImplementedError:
        return False
    except ImportError:
        return False
    return True


def _reference_gemm_ready() -> bool:
    try:
        reference.gemm(None, None)
    except NotImplementedError:
        return False
    except Exception:
        return True
    return True


# --------------------------------------------------------------------------------------------
# Test-side decoding of an OperandView (validated against reference.dequantize below)
# --------------------------------------------------------------------------------------------


def view_codes(v) -> torch.Tensor:
    """Codes [outer, K] (int64) read through the view's strides."""
    dev = v.data.device
    i = torch.arange(v.outer, device=dev).unsqueeze(1)
    k = torch.arange(v.k, device=dev).unsqueeze(0)
    flat = v.data.reshape(-1).to(torch.int64)
    if v.config.scheme == "nvfp4":
        byte = flat[i * v.i_stride + k // 2]
        return torch.where(k % 2 == 1, byte >> 4, byte & 0xF)
    return flat[i * v.i_stride + k * v.k_stride]


def view_scale_raw(v) -> torch.Tensor:
    """Stored block-scale entries [outer, n_kblocks] read through the view's scale addressing."""
    nkb = math.ceil(v.k / v.config.block)
    i = torch.arange(v.outer, device=v.data.device).unsqueeze(1)
    kb = torch.arange(nkb, device=v.data.device).unsqueeze(0)
    return v.scale.reshape(-1)[(i // v.s_idiv) * v.s_istride + kb * v.s_kstride]


def view_scales(v) -> torch.Tensor:
    """Decoded block scales [outer, n_kblocks] fp32 (per-tensor: [outer, 1])."""
    scheme = v.config.scheme
    if scheme in ("fp8_current", "fp8_delayed"):
        return v.scale.reshape(1, 1).expand(v.outer, 1).to(torch.float32)
    raw = view_scale_raw(v)
    if scheme == "fp8_block":
        return raw.to(torch.float32)
    if scheme == "mxfp8":
        return casts.e8m0_decode(raw)
    return casts.decode(raw, E4M3)


def view_decoded(v) -> tuple[torch.Tensor, torch.Tensor]:
    """(elements [outer, K] fp32 exact, scales [outer, nkb] fp32)."""
    return casts.decode(view_codes(v), FORMATS[v.element]), view_scales(v)


def view_dequantized(v) -> torch.Tensor:
    """RN(dec * scale) per element [outer, K] fp32 (per-tensor / fp8_block / mxfp8 dequantization)."""
    x, s = view_decoded(v)
    blk = v.k if v.config.scheme in ("fp8_current", "fp8_delayed") else v.config.block
    s_full = s.repeat_interleave(blk, dim=1)[:, : v.k]
    return x * s_full


# --------------------------------------------------------------------------------------------
# CPU tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        QuantConfig("fp8_current"),
        QuantConfig("fp8_block"),
        QuantConfig("fp8_block", tile=(128, 128)),
        QuantConfig("mxfp8"),
        QuantConfig("mxfp8", element="e5m2", tile=(32, 32)),
        QuantConfig("nvfp4"),
        QuantConfig("nvfp4", tile=(16, 16)),
    ],
    ids=lambda c: c.id,
)
@pytest.mark.parametrize("orientation", ["rowwise", "colwise"])
def test_operand_view_reproduces_reference_dequantize(config, orientation):
    """OperandView's (i, k) addressing of data and scales equals reference.dequantize, bit for bit."""
    if not _has_reference(config.scheme):
        pytest.skip(f"reference.quantize for {config.scheme} is not implemented yet")
    shape = (192, 320) if config.scheme == "fp8_block" else (96, 160)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 3
    q = reference.quantize(x, config, rowwise=True, colwise=True)
    v = operand_view(q, orientation, "a")
    deq = reference.dequantize(q, orientation, torch.float32)  # logical [R, C]
    expect = deq if orientation == "rowwise" else deq.t()  # as [outer, K]
    if config.scheme == "nvfp4":
        from reference.nvfp4 import decode_factor

        x_el, _ = view_decoded(v)
        g = decode_factor(view_scale_raw(v), v.amax.reshape(()))  # NUMERICS: §5.8 dequantization factor
        got = x_el * g.repeat_interleave(config.block, dim=1)
    else:
        got = view_dequantized(v)
    assert torch.equal(fp32.bits(got), fp32.bits(expect.contiguous()))


def test_kernel_defines_come_from_format_rows():
    """A / B element defines follow the formats.py rows (Inf/NaN encodings included)."""
    d = kernel_defines(QuantConfig("fp8_current"), QuantConfig("fp8_current", element="e5m2"), torch.bfloat16)
    e4, e5 = FORMATS["e4m3"], FORMATS["e5m2"]
    assert (d["A_EXP_BITS"], d["A_MAN_BITS"], d["A_BIAS"], d["A_HAS_INF"], d["A_NAN_CODE"]) == (
        e4.exp_bits, e4.man_bits, e4.bias, 0, e4.nan_code)
    assert (d["B_EXP_BITS"], d["B_MAN_BITS"], d["B_BIAS"], d["B_HAS_INF"], d["B_NAN_CODE"]) == (
        e5.exp_bits, e5.man_bits, e5.bias, 1, -1)
    assert d["OUT_BF16"] == 1 and d["SCALE_B_FIRST"] == 0 and d["BLOCK"] == 0
    # NUMERICS: §6 - only a 2-D (128x128) a with a 1-D b applies b's scale first.
    blk1, blk2 = QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))
    assert [kernel_defines(a, b, torch.float32)["SCALE_B_FIRST"] for a, b in
            ((blk2, blk1), (blk1, blk2), (blk2, blk2), (blk1, blk1))] == [1, 0, 0, 0]
    assert kernel_defines(blk1, blk1, torch.float32)["OUT_BF16"] == 0


def _blank(config, shape, orientations):
    """A QuantizedTensor with zero codes/scales for the given copies (shape checks only)."""
    from reference.layouts import data_shape

    m, k = shape
    kw = {}
    for o in orientations:
        kw[f"{o}_data"] = torch.zeros(data_shape(config, o, m, k), dtype=torch.uint8)
        sdt = torch.float32 if config.scheme in ("fp8_current", "fp8_delayed", "fp8_block") else torch.uint8
        kw[f"{o}_scale"] = torch.zeros(scale_padded_shape(config, o, m, k), dtype=sdt)
        kw[f"{o}_amax"] = torch.ones(1) if config.scheme in ("nvfp4", "fp8_current") else None
    return QuantizedTensor(config, shape, **kw)


def test_spec_violations_name_the_problem():
    blk1, blk2 = QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))
    with pytest.raises(SpecViolation, match="2-D x 2-D fp8_block GEMM is not allowed"):
        native_gemm(_blank(blk2, (128, 256), ["rowwise"]), _blank(blk2, (128, 256), ["rowwise"]))
    with pytest.raises(SpecViolation, match="colwise"):
        native_gemm(_blank(blk1, (128, 256), ["rowwise"]), _blank(blk1, (256, 128), ["rowwise"]), layout="NN")
    with pytest.raises(SpecViolation, match="K="):
        native_gemm(_blank(blk1, (128, 256), ["rowwise"]), _blank(blk1, (128, 128), ["rowwise"]))
    with pytest.raises(SpecViolation, match="a GEMM takes one scheme"):
        native_gemm(_blank(blk1, (128, 256), ["rowwise"]), _blank(QuantConfig("mxfp8"), (128, 256), ["rowwise"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_gpu_supports_says_why_and_gemm_raises_unsupported():
    ok, why = supports_gemm(QuantConfig("fp8_current"))
    assert not ok and "CUDA" in why
    with pytest.raises(Unsupported):
        native_gemm(_blank(QuantConfig("fp8_current"), (32, 32), ["rowwise"]),
                    _blank(QuantConfig("fp8_current"), (32, 32), ["rowwise"]))


# --------------------------------------------------------------------------------------------
# Hand-built operands (codes and scales chosen directly; no quantizer involved)
# --------------------------------------------------------------------------------------------

EXACT_VALUES = [0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0]


def build_operand(config, layout_dims, orientation, codes, scales, amax=None):
    """A QuantizedTensor of logical `layout_dims` whose `orientation` copy holds `codes` [outer, K]
    and block scales `scales` [outer, nkb] (raw storage values: fp32 sinv, E8M0 / E4M3 bytes).

    Layouts: docs/numerics.md §1 (data_T), §3 (MXFP8 colwise not transposed, S_c [kb, i]), §4 (1-D sinv
    [kb, i], 2-D [ib, kb]), §5.9 (NVFP4 [i, kb]).
    """
    r, c = layout_dims
    scheme = config.scheme
    dev = codes.device
    rowwise = orientation == "rowwise"
    if scheme == "nvfp4":
        data = casts.pack_nibbles(codes.to(torch.uint8))
    elif scheme == "mxfp8" and not rowwise:
        data = codes.t().contiguous().to(torch.uint8)
    else:
        data = codes.to(torch.uint8).contiguous()  # rowwise [R, C]; transposed copies [C, R] = [i, k]
    padded = scale_padded_shape(config, orientation, r, c)
    if scheme in ("fp8_current", "fp8_delayed"):
        scale = scales.reshape(1).to(torch.float32)
    else:
        st = torch.float32 if scheme == "fp8_block" else torch.uint8
        scale = torch.zeros(padded, dtype=st, device=dev)
        if scheme == "fp8_block" and not config.is_2d:
            scale[: scales.shape[1], : scales.shape[0]] = scales.t()
        elif scheme == "fp8_block":
            sub = scales[:: config.block]  # one row per 128-row tile of the outer dim
            scale[: sub.shape[0], : sub.shape[1]] = sub
        elif scheme == "mxfp8" and not rowwise:
            scale[: scales.shape[1], : scales.shape[0]] = scales.t()
        else:
            scale[: scales.shape[0], : scales.shape[1]] = scales
    kw = {f"{orientation}_data": data, f"{orientation}_scale": scale,
          f"{orientation}_amax": None if amax is None else amax.reshape(1).to(torch.float32)}
    return QuantizedTensor(config, (r, c), **kw)


def random_operand(config, outer, k, *, exact, gen, device, outer_is_rows, orientation, amax=None):
    """Codes [outer, K] and scales [outer, nkb], exact-representable or random, as a QuantizedTensor."""
    fmt = FORMATS[config.element]
    if exact:
        vals = torch.tensor(EXACT_VALUES, dtype=torch.float32)
        idx = torch.randint(0, len(EXACT_VALUES), (outer, k), generator=gen)
        codes = casts.saturating_cast(vals[idx], fmt).to(torch.int64)
    else:  # every finite code
        finite = casts.decode(torch.arange(1 << fmt.bits, dtype=torch.int64), fmt).isfinite()
        pool = torch.nonzero(finite).flatten()
        codes = pool[torch.randint(0, len(pool), (outer, k), generator=gen)]
    scheme = config.scheme
    nkb = 1 if scheme in ("fp8_current", "fp8_delayed") else math.ceil(k / config.block)
    span = 2 if exact else 6
    e = torch.randint(-span, span + 1, (outer, nkb), generator=gen)
    if scheme in ("fp8_current", "fp8_delayed"):
        scales = torch.ldexp(torch.ones(1), e[0, :1]) if exact else torch.rand(1, generator=gen) * 2 + 1e-3
    elif scheme == "fp8_block":
        if config.is_2d:  # one scale per 128-row tile of the outer dim
            e = e[:: config.block].repeat_interleave(config.block, dim=0)[:outer]
        scales = torch.ldexp(torch.ones(outer, nkb), e) if (exact or config.pow2_scales) else torch.rand(outer, nkb, generator=gen) + 0.5
    elif scheme == "mxfp8":
        scales = (127 + e).to(torch.uint8)
    else:  # nvfp4: E4M3 block scales; exact mode uses powers of two
        if exact:
            scales = casts.saturating_cast(torch.ldexp(torch.ones(outer, nkb), e.clamp(-1, 2)), E4M3)
        else:
            scales = casts.saturating_cast(torch.rand(outer, nkb, generator=gen) * 8 + 0.01, E4M3)
    dims = (outer, k) if outer_is_rows else (k, outer)
    q = build_operand(config, dims, orientation, codes.to(device), scales.to(device),
                      None if amax is None else amax.to(device))
    return q


def make_pair(a_cfg, b_cfg, layout, m, n, k, *, exact, seed, device, amax=2688.0):
    """(a, b) QuantizedTensors for `layout` holding only the consumed copies."""
    gen = torch.Generator().manual_seed(seed)
    oa, ob = gemm_layout(layout).consumes
    am = torch.tensor([amax]) if a_cfg.scheme == "nvfp4" else None
    a = random_operand(a_cfg, m, k, exact=exact, gen=gen, device=device, outer_is_rows=(oa == "rowwise"),
                       orientation=oa, amax=am)
    b = random_operand(b_cfg, n, k, exact=exact, gen=gen, device=device, outer_is_rows=(layout == "TN"),
                       orientation=ob, amax=am)
    return a, b


def exact_oracle(a, b, layout, out_dtype, bias=None, c=None):
    """RN_out of the exact Y (fp64; exact for exact-representable operands) + bias + C."""
    oa, ob = gemm_layout(layout).consumes
    va, vb = operand_view(a, oa, "a"), operand_view(b, ob, "b")
    if a.config.scheme == "nvfp4":
        from reference.nvfp4 import gemm_alpha

        xa, sa = view_decoded(va)
        xb, sb = view_decoded(vb)
        blk = a.config.block
        ha = xa.double() * sa.double().repeat_interleave(blk, dim=1)
        hb = xb.double() * sb.double().repeat_interleave(blk, dim=1)
        y = (ha @ hb.t()) * gemm_alpha(va.amax, vb.amax).double()
    else:
        ha = reference.dequantize(a, oa, torch.float32).double()
        hb = reference.dequantize(b, ob, torch.float32).double()
        ha = ha if oa == "rowwise" else ha.t()
        hb = hb if ob == "rowwise" else hb.t()
        y = ha @ hb.t()
    if bias is not None:
        y = y + bias.double()
    if c is not None:
        y = y + c.double()
    y32 = y.to(torch.float32)
    assert torch.equal(y32.double(), y), "oracle: not exact-representable (test construction error)"
    return y32.to(out_dtype)


def replay_portable(a, b, layout, out_dtype, bias=None, c=None):
    """PyTorch replay of block_scaled_gemm.cu's documented order (eager fp32 ops, FMA32 emulated)."""
    oa, ob = gemm_layout(layout).consumes
    va, vb = operand_view(a, oa, "a"), operand_view(b, ob, "b")
    xa, sa = view_decoded(va)
    xb, sb = view_decoded(vb)
    scheme = a.config.scheme
    m, n, k = va.outer, vb.outer, va.k
    per_tensor = scheme in ("fp8_current", "fp8_delayed")
    blk = k if per_tensor else a.config.block
    y = torch.zeros(m, n, dtype=torch.float32, device=xa.device)
    for kb in range(math.ceil(k / blk)):
        p = torch.zeros(m, n, dtype=torch.float32, device=xa.device)
        for kk in range(kb * blk, min(k, (kb + 1) * blk)):
            p = p + xa[:, kk : kk + 1] * xb[:, kk].unsqueeze(0)  # exact product, one RN
        s_a = sa[:, min(kb, sa.shape[1] - 1)].unsqueeze(1)
        s_b = sb[:, min(kb, sb.shape[1] - 1)].unsqueeze(0)
        if per_tensor:
            y = (p * s_a) * s_b
        elif scheme == "nvfp4":
            y = fp32.fma32(p, (s_a * s_b).expand(m, n), y)
        elif va.is_2d and not vb.is_2d:
            y = fp32.fma32(p * s_b, s_a.expand(m, n), y)
        else:
            y = fp32.fma32(p * s_a, s_b.expand(m, n), y)
    if scheme == "nvfp4":
        from reference.nvfp4 import gemm_alpha

        y = gemm_alpha(va.amax, vb.amax) * y
    if scheme == "fp8_block":  # bias, RN_out, then RN_out(C + RN_out(Y))
        if bias is not None:
            y = y + bias.to(torch.float32)
        if c is not None:
            y = c.to(torch.float32) + y.to(out_dtype).to(torch.float32)
        return y.to(out_dtype)
    if c is not None:  # RN(Y + C), RN(. + bias), RN_out
        y = y + c.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    gb, wb = _bits(got), _bits(want)
    bad = (gb != wb) & ~(got.isnan() & want.isnan())
    if bool(bad.any()):
        idx = torch.nonzero(bad)[0].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} outputs differ; first at {idx}: "
            f"got {got[tuple(idx)].item()!r}, want {want[tuple(idx)].item()!r}"
        )


# --------------------------------------------------------------------------------------------
# GPU: portable kernel
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_portable_subnormal_result_survives():
    """docs/numerics.md §0.3: y = 1 * 2^-127 must come out as 0x00400000, not flushed to zero."""
    dev = torch.device("cuda")
    cfg = QuantConfig("fp8_block")
    one = int(casts.saturating_cast(torch.tensor([1.0]), E4M3)[0])
    codes_a = torch.zeros(8, 128, dtype=torch.int64)
    codes_a[0, 0] = one
    codes_b = torch.zeros(8, 128, dtype=torch.int64)
    codes_b[:, 0] = one
    tiny = fp32.from_bits(0x00400000).reshape(1, 1)
    a = build_operand(cfg, (8, 128), "rowwise", codes_a.to(dev), tiny.expand(8, 1).contiguous().to(dev))
    b = build_operand(cfg, (8, 128), "rowwise", codes_b.to(dev), torch.ones(8, 1, device=dev))
    out = native_gemm(a, b, out_dtype=torch.float32, method="portable")
    assert int(fp32.bits(out[0, 0]).item()) == 0x00400000
    assert int(fp32.bits(out[1, 0]).item()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS, ids=CONFIG_IDS)
def test_portable_exact_representable_bit_exact(cfg_id, a_cfg, b_cfg, layout):
    """docs/numerics.md §6 exact-representable mode: portable == fp64 oracle (and reference.gemm) bit for bit."""
    dev = torch.device("cuda")
    m, n, k = (136, 72, 384) if a_cfg.scheme == "fp8_block" else (128, 96, 256)
    amax = 21504.0 if a_cfg.scheme == "nvfp4" and layout == "NT" else 2688.0  # alpha 64 / alpha 1
    a, b = make_pair(a_cfg, b_cfg, layout, m, n, k, exact=True, seed=11, device=dev, amax=amax)
    gen = torch.Generator().manual_seed(3)
    bias = (torch.randint(-8, 9, (n,), generator=gen).float() / 4).to(dev)
    for out_dtype in (torch.bfloat16, torch.float32):
        for with_bias in (False, True):
            bb = bias if with_bias else None
            got = native_gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bb, method="portable")
            want = exact_oracle(a, b, layout, out_dtype, bias=bb)
            assert_bits_equal(got, want, f"{cfg_id} {layout} {out_dtype} bias={with_bias}")
            if _reference_gemm_ready():
                ref = reference.gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bb)
                assert_bits_equal(got, ref.to(dev), f"reference.gemm {cfg_id} {layout}")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS, ids=CONFIG_IDS)
def test_portable_random_matches_documented_order(cfg_id, a_cfg, b_cfg):
    """Random codes and scales (every finite code): the kernel equals the replay of its order, incl. bias/C."""
    dev = torch.device("cuda")
    layout = "NN" if "hybrid" in cfg_id else "TN"
    m, n, k = (72, 80, 200) if a_cfg.scheme == "fp8_block" else (64, 96, 128)
    a, b = make_pair(a_cfg, b_cfg, layout, m, n, k, exact=False, seed=5, device=dev, amax=1234.5)
    gen = torch.Generator().manual_seed(9)
    bias = torch.randn(n, generator=gen).to(dev)
    c = torch.randn(m, n, generator=gen).to(dev)
    for out_dtype in (torch.bfloat16, torch.float32):
        cc = c.to(out_dtype)
        got = native_gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=cc, method="portable")
        want = replay_portable(a, b, layout, out_dtype, bias=bias, c=cc)
        assert_bits_equal(got, want, f"{cfg_id} {layout} {out_dtype}")
        plain = native_gemm(a, b, layout=layout, out_dtype=out_dtype, method="portable")
        assert_bits_equal(plain, replay_portable(a, b, layout, out_dtype), f"{cfg_id} no bias/C")


# --------------------------------------------------------------------------------------------
# GPU: cuBLASLt
# --------------------------------------------------------------------------------------------


def _need_cublaslt(config):
    ok, why = supports_gemm(config, method="cublaslt")
    if not ok:
        pytest.skip(why)


@pytest.mark.gpu
@pytest.mark.parametrize("fast_accum", [False, True], ids=["split_acc", "fast_acc"])
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["e4m3", "e4m3xe5m2"])
def test_cublaslt_per_tensor_equals_torch_scaled_mm(fast_accum, layout, hybrid):
    """Per-tensor FP8: native == torch._scaled_mm(a, b.t(), sinv_a, sinv_b, use_fast_accum) bit for bit."""
    a_cfg = QuantConfig("fp8_current")
    b_cfg = QuantConfig("fp8_current", element="e5m2" if hybrid else "e4m3")
    _need_cublaslt(a_cfg)
    dev = torch.device("cuda")
    m, n, k = 256, 192, 512
    a, b = make_pair(a_cfg, b_cfg, layout, m, n, k, exact=False, seed=21, device=dev)
    oa, ob = gemm_layout(layout).consumes
    va, vb = operand_view(a, oa, "a"), operand_view(b, ob, "b")
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    a8 = va.data.view(fp8[a_cfg.element]).reshape(m, k)
    b8 = vb.data.view(fp8[b_cfg.element]).reshape(n, k)
    method = "cublaslt_fast_accum" if fast_accum else "cublaslt"
    bias = torch.randn(n, device=dev).to(torch.bfloat16)
    for out_dtype in (torch.bfloat16, torch.float32):
        for bb in (None, bias) if out_dtype == torch.bfloat16 else (None,):
            want = torch._scaled_mm(a8, b8.t(), scale_a=va.scale.reshape(()), scale_b=vb.scale.reshape(()),
                                    bias=bb, out_dtype=out_dtype, use_fast_accum=fast_accum)
            got = native_gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bb, method=method)
            assert_bits_equal(got, want, f"{layout} {out_dtype} bias={bb is not None} {method}")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS[:5], ids=CONFIG_IDS[:5])
def test_cublaslt_exact_representable_bit_exact(cfg_id, a_cfg, b_cfg, layout):
    """Exact-representable mode: cuBLASLt (split and fast accumulation) == fp64 oracle bit for bit."""
    _need_cublaslt(a_cfg)
    dev = torch.device("cuda")
    m, n, k = (136, 72, 384) if a_cfg.scheme == "fp8_block" else (128, 96, 256)
    a, b = make_pair(a_cfg, b_cfg, layout, m, n, k, exact=True, seed=13, device=dev)
    methods = ["cublaslt", "cublaslt_fast_accum"] if a_cfg.scheme == "fp8_current" else ["cublaslt"]
    c = (torch.randint(-16, 17, (m, n), generator=torch.Generator().manual_seed(1)).float() / 8).to(dev)
    for method in methods:
        for out_dtype in (torch.bfloat16, torch.float32):
            got = native_gemm(a, b, layout=layout, out_dtype=out_dtype, method=method)
            assert_bits_equal(got, exact_oracle(a, b, layout, out_dtype), f"{cfg_id} {layout} {method} {out_dtype}")
        got = native_gemm(a, b, layout=layout, out_dtype=torch.float32, c=c, method=method)
        assert_bits_equal(got, exact_oracle(a, b, layout, torch.float32, c=c), f"{cfg_id} {layout} {method} +C")


def hardware_partials_blockwise(a, b, layout, out_dtype):
    """docs/numerics.md §6 / TE blockwise_fp8_gemm_reference: per 128-K block p from the tensor cores
    (torch._scaled_mm, scales 1, fp32 out, split accumulator), then FMA32 in the documented order."""
    oa, ob = gemm_layout(layout).consumes
    va, vb = operand_view(a, oa, "a"), operand_view(b, ob, "b")
    _, sa = view_decoded(va)
    _, sb = view_decoded(vb)
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    m, n, k = va.outer, vb.outer, va.k
    a8 = va.data.view(fp8[va.element]).reshape(m, k)
    b8 = vb.data.view(fp8[vb.element]).reshape(n, k)
    one = torch.ones((), device=a8.device)
    y = torch.zeros(m, n, dtype=torch.float32, device=a8.device)
    for kb in range(math.ceil(k / 128)):
        ks = slice(kb * 128, min(k, kb * 128 + 128))
        p = torch._scaled_mm(a8[:, ks].contiguous(), b8[:, ks].contiguous().t(), scale_a=one, scale_b=one,
                             out_dtype=torch.float32, use_fast_accum=False)
        s_a, s_b = sa[:, kb : kb + 1].expand(m, n), sb[:, kb].unsqueeze(0).expand(m, n)
        if va.is_2d and not vb.is_2d:
            y = fp32.fma32(p * s_b, s_a, y)
        else:
            y = fp32.fma32(p * s_a, s_b, y)
    return y.to(out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(256, 384, 512), (144, 80, 320)], ids=["aligned", "partial_k_block"])
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS[2:5], ids=CONFIG_IDS[2:5])
def test_cublaslt_blockwise_equals_hardware_partials(cfg_id, a_cfg, b_cfg, mnk):
    """Random blockwise operands: cuBLASLt == per-block tensor-core partials + FMA32 order, bit for bit."""
    _need_cublaslt(a_cfg)
    dev = torch.device("cuda")
    m, n, k = mnk
    a, b = make_pair(a_cfg, b_cfg, "TN", m, n, k, exact=False, seed=31, device=dev)
    for out_dtype in (torch.bfloat16, torch.float32):
        got = native_gemm(a, b, out_dtype=out_dtype, method="cublaslt")
        want = hardware_partials_blockwise(a, b, "TN", out_dtype)
        assert_bits_equal(got, want, f"{cfg_id} {out_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS[2:5], ids=CONFIG_IDS[2:5])
def test_cublaslt_blockwise_equals_torch_scaled_mm_blockwise(cfg_id, a_cfg, b_cfg):
    """Where torch has the blockwise path (F.scaled_mm / _scaled_mm with fp32 block scales): bit equal."""
    _need_cublaslt(a_cfg)
    scaled_mm = getattr(torch.nn.functional, "scaled_mm", None)
    if scaled_mm is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    try:
        from torch.nn.functional import ScalingType
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.functional.ScalingType")

    dev = torch.device("cuda")
    m, n, k = 256, 384, 512  # ceil(K/128) % 4 == 0 and M, N % 4 == 0: torch's unpadded scale strides
    a, b = make_pair(a_cfg, b_cfg, "TN", m, n, k, exact=False, seed=41, device=dev)
    va, vb = operand_view(a, "rowwise", "a"), operand_view(b, "rowwise", "b")
    a8 = va.data.view(torch.float8_e4m3fn)
    b8 = vb.data.view(torch.float8_e4m3fn)

    def torch_scale(v):
        # torch's blockwise checks (ScaledBlas.cpp): 1x128 scale [outer, K/128] with strides (1, outer);
        # 128x128 scale [roundup(K/128, 4), ceil(outer/128)] with strides (1, roundup(K/128, 4)).
        if v.is_2d:
            return v.scale.t(), ScalingType.BlockWise128x128  # our padded [ceil(outer/128), roundup(K/128,4)]
        return v.scale[:, : v.outer].t(), ScalingType.BlockWise1x128  # our [K/128, roundup(outer,4)]

    sa, ra = torch_scale(va)
    sb, rb = torch_scale(vb)
    try:
        want = scaled_mm(a8, b8.t(), sa, ra, sb, rb, output_dtype=torch.bfloat16)
    except Exception as e:  # torch rejects the combination on this build
        pytest.skip(f"torch.nn.functional.scaled_mm blockwise refused: {e}")
    got = native_gemm(a, b, out_dtype=torch.bfloat16, method="cublaslt")
    assert_bits_equal(got, want, f"{cfg_id} vs F.scaled_mm")


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["mxfp8", "nvfp4"])
def test_cublaslt_block_scaled_fp4_fp8_needs_sm100(scheme):
    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("sm_100+: the cuBLASLt MXFP8/NVFP4 path is available")
    cfg = QuantConfig(scheme)
    a, b = make_pair(cfg, cfg, "TN", 128, 128, 128, exact=True, seed=1, device=torch.device("cuda"))
    major, minor = torch.cuda.get_device_capability()
    with pytest.raises(Unsupported, match=rf"needs sm_100\+ \(this GPU is sm_{major}{minor}\); use method='portable'"):
        native_gemm(a, b, method="cublaslt")
    ok, why = supports_gemm(cfg)
    assert ok and why.startswith("auto -> portable")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS, ids=CONFIG_IDS)
def test_auto_random_within_tolerance_of_exact(cfg_id, a_cfg, b_cfg):
    """method='auto' on random operands: |got - exact| <= 2^-6 * sum|terms| + 1 ulp_out (sensible bound)."""
    dev = torch.device("cuda")
    m, n, k = 128, 128, 512
    a, b = make_pair(a_cfg, b_cfg, "TN", m, n, k, exact=False, seed=51, device=dev, amax=999.0)
    va, vb = operand_view(a, "rowwise", "a"), operand_view(b, "rowwise", "b")
    xa, sa = view_decoded(va)
    xb, sb = view_decoded(vb)
    blk = k if a_cfg.scheme.startswith("fp8_c") else a_cfg.block
    ha = xa.double() * sa.double().repeat_interleave(blk, dim=1)[:, :k]
    hb = xb.double() * sb.double().repeat_interleave(blk, dim=1)[:, :k]
    scale = 1.0
    if a_cfg.scheme == "nvfp4":
        from reference.nvfp4 import gemm_alpha

        scale = float(gemm_alpha(va.amax, vb.amax))
    exact = (ha @ hb.t()) * scale
    mag = (ha.abs() @ hb.abs().t()) * scale
    got = native_gemm(a, b, out_dtype=torch.float32).double()
    err = (got - exact).abs()
    assert bool((err <= mag * 2.0**-6 + 1e-30).all()), f"max err {float(err.max())}"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("cfg_id,a_cfg,b_cfg", CONFIGS, ids=CONFIG_IDS)
def test_auto_on_quantized_data_close_to_reference_gemm(cfg_id, a_cfg, b_cfg, layout):
    """End to end: reference.quantize(normal x) on the GPU, native auto vs reference.gemm auto (fp32 out):
    |diff| <= 2^-10 * (|A|.|B|^T) elementwise (fp32 accumulation-order differences only)."""
    if not (_has_reference(a_cfg.scheme) and _reference_gemm_ready()):
        pytest.skip("reference quantize/gemm not implemented yet")
    dev = torch.device("cuda")
    m, n, k = 128, 96, 256
    gen = torch.Generator().manual_seed(61)
    dims_a = (m, k) if gemm_layout(layout).consumes[0] == "rowwise" else (k, m)
    dims_b = {"TN": (n, k), "NN": (k, n), "NT": (k, n)}[layout]
    xa = (torch.randn(dims_a, generator=gen) * 2).to(dev)
    xb = torch.randn(dims_b, generator=gen).to(dev)
    a = reference.quantize(xa, a_cfg, rowwise=True, colwise=True)
    b = reference.quantize(xb, b_cfg, rowwise=True, colwise=True)
    bias = torch.randn(n, generator=gen).to(dev)
    got = native_gemm(a, b, layout=layout, out_dtype=torch.float32, bias=bias)
    want = reference.gemm(a, b, layout=layout, out_dtype=torch.float32, bias=bias)
    oa, ob = gemm_layout(layout).consumes
    ha = reference.dequantize(a, oa, torch.float32).double()
    hb = reference.dequantize(b, ob, torch.float32).double()
    ha = ha if oa == "rowwise" else ha.t()
    hb = hb if ob == "rowwise" else hb.t()
    mag = ha.abs() @ hb.abs().t() + bias.abs().double()
    err = (got.double() - want.double()).abs()
    assert bool((err <= mag * 2.0**-10).all()), f"max err {float(err.max())}, at mag {float(mag.flatten()[err.argmax()])}"


def test_fp16_output_is_a_backend_gap_not_bad_input():
    """Runs without a GPU: the dtype check comes before any device work."""
    import pytest as _pytest

    from native.gemm import gemm as native_gemm
    from reference import QuantConfig, Unsupported, quantize

    q = quantize(torch.ones(32, 32), QuantConfig("mxfp8"))
    with _pytest.raises(Unsupported, match="out_dtype=torch.float16"):
        native_gemm(q, q, layout="TN", out_dtype=torch.float16)
    with _pytest.raises(ValueError, match="out_dtype=torch.int8"):
        native_gemm(q, q, layout="TN", out_dtype=torch.int8)
