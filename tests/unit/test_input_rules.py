"""Documented input behaviour of reference.quantize (reference/quantization.py docstring, docs/design.md §3)."""

import pytest
import torch

from reference import QuantConfig, SpecViolation, dequantize, quantize

ALL = {
    "fp8_current": QuantConfig("fp8_current"),
    "fp8_delayed": QuantConfig("fp8_delayed"),
    "fp8_block-1x128": QuantConfig("fp8_block"),
    "fp8_block-128x128": QuantConfig("fp8_block", tile=(128, 128)),
    "mxfp8-1x32": QuantConfig("mxfp8"),
    "mxfp8-32x32": QuantConfig("mxfp8", tile=(32, 32)),
    "nvfp4-1x16": QuantConfig("nvfp4"),
    "nvfp4-16x16": QuantConfig("nvfp4", tile=(16, 16)),
    "nvfp4-rht": QuantConfig("nvfp4", rht=True),
}


def same(q1, q2):
    for name in q1.TENSOR_FIELDS:
        a, b = getattr(q1, name), getattr(q2, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), name


@pytest.mark.parametrize("name", ALL)
def test_leading_dims_flatten_into_m(name):
    cfg = ALL[name]
    x = torch.randn(2, 3, 32, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q3 = quantize(x, cfg, rowwise=True, colwise=True, rng=(5, 0) if cfg.stochastic else None)
    q2 = quantize(x.reshape(-1, 64), cfg, rowwise=True, colwise=True, rng=(5, 0) if cfg.stochastic else None)
    same(q3, q2)
    assert q3.shape == (2, 3, 32, 64) and q3.m == 192 and q3.k == 64
    assert dequantize(q3).shape == (192, 64)


@pytest.mark.parametrize("name", ALL)
def test_non_contiguous_views_are_read_by_value(name):
    cfg = ALL[name]
    base = torch.randn(128, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    view = base.t()[:, :128]  # (256, 128) non-contiguous
    assert not view.is_contiguous()
    same(quantize(view, cfg, rowwise=True, colwise=True), quantize(view.contiguous(), cfg, rowwise=True, colwise=True))


@pytest.mark.parametrize("name", ["fp8_current", "fp8_block-1x128", "fp8_block-128x128"])
def test_one_d_input_is_one_row(name):
    x = torch.randn(200)
    same(quantize(x, ALL[name]), quantize(x.reshape(1, 200), ALL[name]))


@pytest.mark.parametrize(
    "name,shape,dim",
    [
        ("mxfp8-1x32", (64, 100), "K=100"),
        ("mxfp8-1x32", (40, 64), "M=40"),
        ("mxfp8-32x32", (96, 48), "K=48"),
        ("nvfp4-1x16", (32, 24), "K=24"),
        ("nvfp4-16x16", (8, 32), "M=8"),
    ],
)
def test_tile_incompatible_shapes_name_the_dim_and_rule(name, shape, dim):
    with pytest.raises(SpecViolation) as ei:
        quantize(torch.randn(*shape), ALL[name], rowwise=True, colwise=True)
    msg = str(ei.value)
    assert dim in msg and "multiple of" in msg and "partial blocks" in msg


@pytest.mark.parametrize("name", ["fp8_current", "fp8_block-1x128"])
def test_partial_tiles_are_allowed_where_the_scheme_pads(name):
    q = quantize(torch.randn(3, 200), ALL[name], rowwise=True, colwise=True)
    assert q.rowwise_data.shape == (3, 200) and q.colwise_data.shape == (200, 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn, torch.uint8])
def test_unsupported_dtypes(dtype):
    x = torch.zeros(32, 32).to(dtype)
    with pytest.raises(SpecViolation, match="input dtype .* is not allowed; expected one of"):
        quantize(x, ALL["mxfp8-1x32"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rht_needs_bfloat16(dtype):
    with pytest.raises(SpecViolation, match=r"RHT needs a bfloat16 input \(docs/numerics.md §5.6\)"):
        quantize(torch.randn(32, 32).to(dtype), ALL["nvfp4-rht"], colwise=True)


@pytest.mark.parametrize("shape", [(0, 32), (32, 0), (0,)])
def test_empty_tensors_raise(shape):
    with pytest.raises(SpecViolation, match="empty tensor"):
        quantize(torch.zeros(shape), ALL["fp8_current"])


def test_zero_dim_and_non_tensor_and_no_orientation():
    with pytest.raises(SpecViolation, match="0-d"):
        quantize(torch.tensor(1.0), ALL["fp8_current"])
    with pytest.raises(SpecViolation, match="torch.Tensor"):
        quantize([1.0, 2.0], ALL["fp8_current"])
    with pytest.raises(SpecViolation, match="both were False"):
        quantize(torch.ones(4, 4), ALL["fp8_current"], rowwise=False, colwise=False)
    with pytest.raises(TypeError, match="QuantConfig"):
        quantize(torch.ones(4, 4), "fp8_current")


def test_stochastic_rounding_needs_a_seed():
    with pytest.raises(SpecViolation, match=r"rng=\(seed, stream\)"):
        quantize(torch.ones(16, 16), QuantConfig("nvfp4", stochastic=True))
    with pytest.raises(ValueError, match="SRSeed.stream"):
        quantize(torch.ones(16, 16), QuantConfig("nvfp4", stochastic=True), rng=(1, -1))


def test_sr_seed_coercion_is_by_value_and_checks_every_call():
    """SRSeed.coerce memoizes (int, int) pairs (issue #18 per-call cost): the same value for equal pairs and for the
    other accepted forms, out-of-range pairs refused on every call (a cached miss would hide the second), and a
    non-int pair (a bool, a float) converted by int() as before."""
    from reference.types import SRSeed

    a, b = SRSeed.coerce((7, 3)), SRSeed.coerce((7, 3))
    assert a == b == SRSeed(7, 3) == SRSeed.coerce((7.0, 3)) and SRSeed.coerce(7) == SRSeed(7, 0)
    assert SRSeed.coerce((True, 3)) == SRSeed(1, 3)
    for _ in range(2):
        with pytest.raises(ValueError, match="SRSeed.stream"):
            SRSeed.coerce((1, 1 << 32))
        with pytest.raises(ValueError, match="SRSeed.seed"):
            SRSeed.coerce((-1, 0))


def test_dequantize_argument_errors():
    q = quantize(torch.ones(32, 32), ALL["mxfp8-1x32"])
    with pytest.raises(ValueError, match="no colwise copy"):
        dequantize(q, "colwise")
    with pytest.raises(ValueError, match="orientation='diagonal'"):
        dequantize(q, "diagonal")
    with pytest.raises(ValueError, match="dtype=torch.int8"):
        dequantize(q, "rowwise", torch.int8)
