"""reference.spec: one rule, one exception, one message (docs/design.md §3; issue 13 item 3, issue 14 item 7)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference import QuantConfig, SpecViolation, dequantize, gemm, quantize, spec

CONFIGS = {
    "fp8_current": QuantConfig("fp8_current"),
    "mxfp8": QuantConfig("mxfp8"),
    "fp8_block": QuantConfig("fp8_block"),
    "nvfp4": QuantConfig("nvfp4"),
}


def _q(name, rowwise=True, colwise=True):
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(7))
    return quantize(x, CONFIGS[name], rowwise=rowwise, colwise=colwise)


def _tampered(q, **fields):
    return dataclasses.replace(q, **fields)


# ---- dequantize rejects a tampered QuantizedTensor, naming the field ---------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_truncated_data_names_the_field(name):
    q = _q(name)
    bad = _tampered(q, rowwise_data=q.rowwise_data[:-1])
    with pytest.raises(SpecViolation, match=r"q\.rowwise_data has shape .*expected"):
        dequantize(bad, "rowwise")


@pytest.mark.parametrize("name", CONFIGS)
def test_truncated_scale_names_the_field(name):
    q = _q(name)
    bad = _tampered(q, colwise_scale=q.colwise_scale.reshape(-1)[:-1])
    with pytest.raises(SpecViolation, match=r"q\.colwise_scale has shape"):
        dequantize(bad, "colwise")


@pytest.mark.parametrize("name", CONFIGS)
def test_wrong_dtype_names_the_field(name):
    q = _q(name)
    bad = _tampered(q, rowwise_data=q.rowwise_data.to(torch.int16))
    with pytest.raises(SpecViolation, match=r"q\.rowwise_data has dtype torch.int16, expected torch.uint8"):
        dequantize(bad, "rowwise")
    want = q.rowwise_scale.dtype
    other = torch.float16 if want == torch.float32 else torch.float32
    bad = _tampered(q, rowwise_scale=q.rowwise_scale.to(other))
    with pytest.raises(SpecViolation, match=rf"q\.rowwise_scale has dtype {other}, expected {want}"):
        dequantize(bad, "rowwise")


def test_missing_copy_and_missing_scale_and_missing_nvfp4_amax():
    q = _q("nvfp4", colwise=False)
    with pytest.raises(SpecViolation, match="no colwise copy"):
        dequantize(q, "colwise")
    with pytest.raises(SpecViolation, match=r"q\.rowwise_scale is None"):
        dequantize(_tampered(q, rowwise_scale=None), "rowwise")
    # docs/numerics.md §5.2: the NVFP4 global amax is consumed by dequantize (S_dec): it must be there.
    with pytest.raises(SpecViolation, match=r"q\.rowwise_amax is None"):
        dequantize(_tampered(q, rowwise_amax=None), "rowwise")
    # A per-tensor amax is informational: absent is fine, present must be fp32 [1].
    p = _q("fp8_current")
    assert torch.equal(dequantize(_tampered(p, rowwise_amax=None)), dequantize(p))
    with pytest.raises(SpecViolation, match=r"q\.rowwise_amax has shape \(2,\)"):
        dequantize(_tampered(p, rowwise_amax=torch.zeros(2)))


def test_bad_shape_and_hp_dtype_and_config():
    q = _q("mxfp8")
    with pytest.raises(SpecViolation, match=r"q\.shape=\(64, 0\) is invalid"):
        dequantize(_tampered(q, shape=(64, 0)))
    with pytest.raises(SpecViolation, match=r"q\.hp_dtype='float64' is invalid"):
        dequantize(_tampered(q, hp_dtype="float64"))
    with pytest.raises(SpecViolation, match=r"q\.config must be a QuantConfig"):
        dequantize(_tampered(q, config="mxfp8"))
    with pytest.raises(SpecViolation, match="must be a QuantizedTensor"):
        dequantize(q.rowwise_data)
    # A shape that disagrees with the stored data: the data is then the wrong size.
    with pytest.raises(SpecViolation, match=r"q\.rowwise_data has shape \(64, 128\), expected \(32, 128\)"):
        dequantize(_tampered(q, shape=(32, 128)))


# ---- gemm validates its operands through the same rules ---------------------------------------


def test_gemm_names_the_operand_field():
    a, b = _q("mxfp8"), _q("mxfp8")
    with pytest.raises(SpecViolation, match=r"b\.rowwise_scale has shape"):
        gemm(a, _tampered(b, rowwise_scale=b.rowwise_scale[:, :2]))
    with pytest.raises(SpecViolation, match=r"a\.colwise_data is None: layout NT consumes a's colwise copy"):
        gemm(_tampered(a, colwise_data=None), b, layout="NT")
    with pytest.raises(SpecViolation, match=r"layout='XY' is invalid"):
        gemm(a, b, layout="XY")
    with pytest.raises(SpecViolation, match="differ: a GEMM takes one scheme"):
        gemm(a, _q("nvfp4"))
    with pytest.raises(SpecViolation, match=r"bias must be .* \[N\] = \[64\]"):
        gemm(a, b, bias=torch.zeros(3))


def test_gemm_rules_on_configs_alone():
    blk2 = QuantConfig("fp8_block", tile=(128, 128))
    with pytest.raises(SpecViolation, match="2-D x 2-D fp8_block GEMM is not allowed"):
        spec.gemm_rule(blk2, blk2, "TN")
    spec.gemm_rule(QuantConfig("fp8_block"), blk2, "TN")  # 1-D x 2-D is allowed
    spec.gemm_rule(QuantConfig("nvfp4", tile=(16, 16)), QuantConfig("nvfp4", tile=(16, 16)), "TN")
    rht = QuantConfig("nvfp4", rht=True)
    with pytest.raises(SpecViolation, match="only one consumed copy is in the Hadamard domain"):
        spec.gemm_rule(rht, QuantConfig("nvfp4"), "NT")
    spec.gemm_rule(rht, rht, "NT")
    spec.gemm_rule(rht, QuantConfig("nvfp4"), "TN")  # TN consumes rowwise copies: no RHT involved


def test_quantize_rule_on_names_and_shapes():
    mx = QuantConfig("mxfp8")
    with pytest.raises(SpecViolation, match=r"x K=48 \(shape \(64, 48\)\) is not a multiple of 32"):
        spec.quantize_rule(mx, (64, 48), "float32")
    with pytest.raises(SpecViolation, match=r"operand b M=6 \(shape \(2, 3, 64\)\)"):
        spec.quantize_rule(mx, (2, 3, 64), "float32", what="operand b")
    spec.quantize_rule(QuantConfig("fp8_block"), (3, 200), "float16")  # partial tiles are padded
    with pytest.raises(SpecViolation, match="RHT needs a bfloat16 input"):
        spec.quantize_rule(QuantConfig("nvfp4", rht=True), (16, 16), "float32")
    with pytest.raises(SpecViolation, match="input dtype float64 is not allowed"):
        spec.quantize_rule(mx, (32, 32), "float64")


def test_the_tensor_check_is_the_name_check():
    """check_quantize on a tensor says exactly what quantize_rule says on its shape and dtype."""
    mx = QuantConfig("mxfp8")
    with pytest.raises(SpecViolation) as by_name:
        spec.quantize_rule(mx, (40, 64), "bfloat16")
    with pytest.raises(SpecViolation) as by_tensor:
        quantize(torch.zeros(40, 64, dtype=torch.bfloat16), mx)
    assert str(by_name.value) == str(by_tensor.value)


# ---- QuantConfig: bools, non-integer tiles, documented ranges -----------------------------------

BAD_CONFIGS = [
    (dict(scheme="fp8_current", eps=True), "eps", "bool"),
    (dict(scheme="fp8_delayed", margin=True), "margin", "bool"),
    (dict(scheme="fp8_delayed", amax_history_len=True), "amax_history_len", "bool"),
    (dict(scheme="fp8_block", tile=(1.5, 32)), "tile", "ints"),
    (dict(scheme="fp8_block", tile=(True, 128)), "tile", "ints"),
    (dict(scheme="fp8_block", tile=128), "tile", "pair"),
    (dict(scheme="fp8_delayed", margin=10**6), "margin", "all-NaN"),
    (dict(scheme="fp8_delayed", margin=65), "margin", "[-64, 64]"),
    (dict(scheme="fp8_delayed", margin=-65), "margin", "[-64, 64]"),
    (dict(scheme="fp8_delayed", amax_history_len=65537), "amax_history_len", "<= 65536"),
]


@pytest.mark.parametrize("kwargs,field,fragment", BAD_CONFIGS, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_CONFIGS)])
def test_quantconfig_rejects(kwargs, field, fragment):
    with pytest.raises(ValueError) as ei:
        QuantConfig(**kwargs)
    assert f"QuantConfig.{field}=" in str(ei.value) and fragment in str(ei.value)


def test_quantconfig_range_edges_are_accepted():
    assert QuantConfig("fp8_delayed", margin=64).margin == 64
    assert QuantConfig("fp8_delayed", margin=-64).margin == -64
    assert QuantConfig("fp8_delayed", amax_history_len=65536).amax_history_len == 65536
    assert QuantConfig("fp8_block", tile=[128, 128]).tile == (128, 128)
    assert QuantConfig("fp8_current", eps=1).eps == 1


# ---- reference and native: the same bad input, the same exception and message ------------------


def _outcome(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the point is to compare what each side raises
        return type(e), str(e)
    return None


def _bad_calls():
    mx, nv = _q("mxfp8"), _q("nvfp4")
    return {
        "quantize-partial-block": ("quantize", (torch.zeros(40, 64), QuantConfig("mxfp8")), {}),
        "quantize-rht-fp32": ("quantize", (torch.zeros(16, 16), QuantConfig("nvfp4", rht=True)), {"colwise": True}),
        "quantize-sr-no-seed": ("quantize", (torch.zeros(16, 16), QuantConfig("nvfp4", stochastic=True)), {}),
        "quantize-float64": ("quantize", (torch.zeros(32, 32, dtype=torch.float64), QuantConfig("mxfp8")), {}),
        "dequantize-truncated": ("dequantize", (_tampered(mx, rowwise_data=mx.rowwise_data[:3]), "rowwise"), {}),
        "dequantize-no-amax": ("dequantize", (_tampered(nv, colwise_amax=None), "colwise"), {}),
        "dequantize-orientation": ("dequantize", (mx, "diagonal"), {}),
        "gemm-two-schemes": ("gemm", (mx, nv), {}),
        "gemm-missing-copy": ("gemm", (mx, _tampered(mx, colwise_data=None)), {"layout": "NN"}),
        "gemm-layout": ("gemm", (mx, mx), {"layout": "XY"}),
        "gemm-bias": ("gemm", (mx, mx), {"bias": torch.zeros(5)}),
        "gemm-not-quantized": ("gemm", (mx.rowwise_data, mx), {}),
    }


@pytest.mark.parametrize("case", list(_bad_calls()))
def test_native_raises_what_the_reference_raises(case):
    import native
    import reference

    native_fns = {"quantize": native.quantize, "dequantize": native.dequantize, "gemm": native.gemm}
    op, args, kw = _bad_calls()[case]
    ref = _outcome(getattr(reference, op), *args, **kw)
    nat = _outcome(native_fns[op], *args, **kw)
    assert ref is not None and issubclass(ref[0], ValueError)
    assert nat == ref


# ---- native's operand addressing agrees with the golden operand decode (CPU, no kernels) -------

VIEW_CONFIGS = [
    QuantConfig("fp8_current"),
    QuantConfig("mxfp8"),
    QuantConfig("mxfp8", tile=(32, 32)),
    QuantConfig("fp8_block"),
    QuantConfig("fp8_block", tile=(128, 128)),
    QuantConfig("nvfp4"),
    QuantConfig("nvfp4", tile=(16, 16)),
]


@pytest.mark.parametrize("cfg", VIEW_CONFIGS, ids=[c.id for c in VIEW_CONFIGS])
@pytest.mark.parametrize("o", ["rowwise", "colwise"])
def test_native_operand_view_addresses_what_the_reference_decodes(cfg, o):
    """Element (i, k) and its block scale, gathered through native.gemm.operand_view's strides, are the
    golden reference.gemm.operand's values[i, k] and scale[i, k // block] (an independent decode)."""
    from native.gemm import operand_view
    from reference import casts
    from reference.gemm import _SCALE_DECODE, operand

    m, k = (160, 200) if cfg.scheme_row.partial_tiles else (64, 96)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(11)) * 3
    q = quantize(x, cfg, rowwise=True, colwise=True)
    v = operand_view(q, o, "a")
    want = operand(q, o)
    outer, depth = want.values.shape
    assert (v.outer, v.k) == (outer, depth)
    i = torch.arange(outer).reshape(-1, 1).expand(outer, depth)
    kk = torch.arange(depth).reshape(1, -1).expand(outer, depth)
    flat = v.data.reshape(-1)
    if 8 // cfg.element_format.bits == 2:  # packed along K, even k in the low nibble
        byte = flat[i * v.i_stride + kk // 2].to(torch.int64)
        codes = torch.where(kk % 2 == 0, byte & 0xF, byte >> 4).to(torch.uint8)
    else:
        codes = flat[i * v.i_stride + kk * v.k_stride]
    assert torch.equal(casts.decode(codes, cfg.element_format).to(torch.float64), want.values)
    if want.scale is None:
        assert (v.s_idiv, v.s_istride, v.s_kstride) == (1, 0, 0)
        return
    nb = want.scale.shape[1]
    ii = torch.arange(outer).reshape(-1, 1).expand(outer, nb)
    kb = torch.arange(nb).reshape(1, -1).expand(outer, nb)
    s = v.scale.reshape(-1)[(ii // v.s_idiv) * v.s_istride + kb * v.s_kstride]
    assert torch.equal(_SCALE_DECODE[cfg.scheme_row.scale_format](s), want.scale)
