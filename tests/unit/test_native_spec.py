"""The same bad input raises the same exception type with the same message from native and reference.

Source: docs/design.md §3 (SpecViolation names what was expected and what was given), issue 13 item 3: native
checks its inputs with `reference.spec` before any device work, so these run on the CPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import native
import reference
from reference.formats import QuantConfig
from reference.types import SpecViolation

BAD_QUANTIZE = [
    ("float64 input", torch.ones(32, 32, dtype=torch.float64), QuantConfig("mxfp8"), {}),
    ("partial mxfp8 block", torch.ones(32, 48), QuantConfig("mxfp8"), {}),
    ("partial nvfp4 rows", torch.ones(8, 32, dtype=torch.bfloat16), QuantConfig("nvfp4"), {}),
    ("RHT on fp32", torch.ones(32, 32), QuantConfig("nvfp4", rht=True), {}),
    ("empty", torch.ones(0, 4), QuantConfig("fp8_current"), {}),
    ("0-d", torch.tensor(1.0), QuantConfig("fp8_block"), {}),
    ("no copy", torch.ones(4, 4), QuantConfig("fp8_current"), {"rowwise": False, "colwise": False}),
    ("SR without a seed", torch.ones(32, 32), QuantConfig("nvfp4", stochastic=True), {}),
    ("not a tensor", [[1.0]], QuantConfig("fp8_current"), {}),
]


def _raised(fn, *args, **kw) -> tuple[type, str]:
    with pytest.raises(Exception) as e:
        fn(*args, **kw)
    return type(e.value), str(e.value)


@pytest.mark.parametrize("what, x, config, kw", BAD_QUANTIZE, ids=[b[0] for b in BAD_QUANTIZE])
def test_quantize_refuses_like_the_reference(what, x, config, kw):
    want = _raised(reference.quantize, x, config, **kw)
    assert want[0] is SpecViolation
    assert _raised(native.quantize, x, config, **kw) == want


def _tampered():
    cfg = QuantConfig("mxfp8")
    q = reference.quantize(torch.randn(64, 64), cfg, rowwise=True, colwise=False)
    yield "truncated data", dataclasses.replace(q, rowwise_data=q.rowwise_data[:32]), "rowwise"
    yield "scale dtype", dataclasses.replace(q, rowwise_scale=q.rowwise_scale.to(torch.int32)), "rowwise"
    yield "missing copy", q, "colwise"
    nv = reference.quantize(torch.randn(32, 32), QuantConfig("nvfp4"), rowwise=True)
    yield "nvfp4 without amax", dataclasses.replace(nv, rowwise_amax=None), "rowwise"


@pytest.mark.parametrize("what, q, orientation", list(_tampered()), ids=[t[0] for t in _tampered()])
def test_dequantize_refuses_a_tampered_tensor_like_the_reference(what, q, orientation):
    want = _raised(reference.dequantize, q, orientation)
    assert want[0] is SpecViolation
    assert _raised(native.dequantize, q, orientation) == want


def test_gemm_refuses_like_the_reference():
    blk1, blk2 = QuantConfig("fp8_block"), QuantConfig("fp8_block", tile=(128, 128))
    x = torch.randn(128, 256)
    a1, a2 = reference.quantize(x, blk1), reference.quantize(x, blk2)
    cases = [
        ((a2, a2), {}),  # 2-D x 2-D fp8_block
        ((a1, reference.quantize(torch.randn(128, 128), blk1)), {}),  # K mismatch
        ((a1, reference.quantize(x, QuantConfig("fp8_current"))), {}),  # two schemes
        ((a1, a1), {"layout": "NN"}),  # b has no colwise copy
        ((a1, a1), {"layout": "XY"}),
        ((a1, a1), {"bias": torch.ones(3)}),
        ((a1, a1), {"out_dtype": torch.int8}),
    ]
    for args, kw in cases:
        want = _raised(reference.gemm, *args, **kw)
        assert want[0] is SpecViolation, (kw, want)
        assert _raised(native.gemm, *args, **kw) == want, kw
