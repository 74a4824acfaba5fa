"""harness/adapters/build.py: a library's natural outputs -> the contract's copy, on hand-checked small shapes."""

from __future__ import annotations

import pytest
import torch

from harness.adapters import build
from reference import QuantConfig, quantize
from reference.spec import check_quantized


def test_mxfp8_scales_pad_and_orient():
    cfg = QuantConfig("mxfp8")
    g = build.geometry(cfg, "rowwise", 32, 64)
    s = torch.tensor([[1, 2]] * 32, dtype=torch.uint8)  # [M, K/32]
    out = build.scales(s, g)
    assert out.shape == (128, 4) and out[:32, :2].eq(s).all() and out[32:].eq(0).all() and out[:, 2:].eq(0).all()
    # colwise from the library's X^T [K, M/32]: stored S_c [M/32, K] = its transpose, padded to [4, 128]
    gc = build.geometry(cfg, "colwise", 32, 64)
    st = torch.arange(64, dtype=torch.uint8).reshape(64, 1)
    out = build.scales(st, gc)
    assert out.shape == (4, 128) and out[0, :64].tolist() == list(range(64)) and out[1:].eq(0).all()
    # by="logical": [M/32, K] as it is
    assert torch.equal(build.scales(st.t(), gc, by="logical"), out)


def test_blockwise_1d_rowwise_scale_is_stored_transposed():
    cfg = QuantConfig("fp8_block", pow2_scales=False)
    g = build.geometry(cfg, "rowwise", 3, 256)
    s = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.bfloat16)  # [M, K/128] decode scales
    out = build.scales(s, g)
    assert out.dtype == torch.float32 and out.shape == (2, 4)
    assert out.tolist() == [[1.0, 3.0, 5.0, 0.0], [2.0, 4.0, 6.0, 0.0]]


def test_e8m0_and_e4m3_conversions_are_exact_or_raise():
    assert build.e8m0_bytes(torch.tensor([1.0, 0.5, 2.0 ** -127, 2.0 ** 127])).tolist() == [127, 126, 0, 254]
    assert build.e8m0_bytes(torch.tensor([0, -3], dtype=torch.int32)).tolist() == [127, 124]
    with pytest.raises(ValueError, match="not a power of two"):
        build.e8m0_bytes(torch.tensor([3.0]))
    assert build.e4m3_bytes(torch.tensor([448.0, 0.0, 2.0 ** -9])).tolist() == [0x7E, 0x00, 0x01]
    with pytest.raises(ValueError, match="not an E4M3 value"):
        build.e4m3_bytes(torch.tensor([0.3]))


def test_nvfp4_codes_packing_and_nibble_order():
    cfg = QuantConfig("nvfp4")
    g = build.geometry(cfg, "rowwise", 16, 32)
    codes = torch.arange(32, dtype=torch.uint8).remainder(16).repeat(16, 1)  # unpacked [16, 32]
    packed = build.codes(codes, g)
    assert packed.shape == (16, 16) and packed[0, 0] == 0x10 and packed[0, 1] == 0x32
    swapped = ((packed & 0xF) << 4) | (packed >> 4)
    assert torch.equal(build.codes(swapped, g, nibbles="high_first"), packed)
    with pytest.raises(ValueError, match="cannot be transposed"):
        build.codes(packed, build.geometry(cfg, "colwise", 16, 32), by="logical")


def test_global_amax_exact_or_value_error():
    a = torch.tensor([3.0])
    assert build.global_amax(amax=a.to(torch.bfloat16)).tolist() == [3.0]
    # A power of two: 2688/A is exact, and its neighbours give other quotients -> recovered
    s = torch.div(torch.tensor([2688.0]), torch.tensor([4.0]))
    assert build.global_amax(global_scale=s).tolist() == [4.0]
    # A decode factor A/2688 often has two fp32 preimages: 1.5 and nextafter(1.5) both give RN(1.5/2688)
    d = torch.div(torch.tensor([1.5]), torch.tensor([2688.0]))
    with pytest.raises(ValueError, match="not recoverable exactly"):
        build.global_amax(decode_scale=d)
    # ...but an amax taken in bf16 is unique among bf16 values
    a16 = torch.tensor([1.5])
    got = build.global_amax(decode_scale=torch.div(a16, torch.tensor([2688.0])), amax_dtype=torch.bfloat16)
    assert torch.equal(got, a16)
    with pytest.raises(ValueError, match="exactly one of"):
        build.global_amax()


def test_put_copy_rebuilds_the_golden_from_its_own_parts():
    """The golden's codes/scales handed back in library form (float8, logical scales) give the golden."""
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    for cfg in (QuantConfig("mxfp8"), QuantConfig("nvfp4"), QuantConfig("fp8_current"),
                QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))):
        gold = quantize(x, cfg, rowwise=True, colwise=True)
        q = build.empty(cfg, x)
        for o in ("rowwise", "colwise"):
            g = build.geometry(cfg, o, 64, 128)
            s = getattr(gold, f"{o}_scale")
            if not g.per_tensor:
                r, c = g.scale_valid_shape
                s = s[:r, :c].t() if g.block_major else s[:r, :c]  # back to the source's [rows, blocks]
            data = getattr(gold, f"{o}_data")
            if cfg.scheme == "mxfp8" and o == "colwise":  # the library's X^T form
                data, s = data.t(), s.t()
            build.put_copy(q, o, data=data, scale=s, amax=getattr(gold, f"{o}_amax"))
            check_quantized(q, o)
            for f in ("data", "scale", "amax"):
                a, b = getattr(q, f"{o}_{f}"), getattr(gold, f"{o}_{f}")
                assert (a is None and b is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (cfg.id, o, f)
