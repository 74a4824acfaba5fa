"""Grouped (split) quantization: reference/grouped.py, the grouped_quantize op and its case key (docs/numerics.md §12.1).

Each group must equal quantizing its slice alone (own amax, post-RHT amax with RHT, own SR streams);
a hand-checked NVFP4 vector shows two groups with different global amaxes.
"""

from __future__ import annotations

import pytest
import torch

import reference
from harness import runner
from harness.cases import Case, parse_cases
from reference import QuantConfig, grouped
from reference.types import SpecViolation

FIELDS = reference.QuantizedTensor.TENSOR_FIELDS


def _equal(q1, q2):
    for f in FIELDS:
        a, b = getattr(q1, f), getattr(q2, f)
        assert (a is None) == (b is None), f
        if a is not None:
            assert torch.equal(a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                               b.view(torch.uint8) if b.dtype != torch.uint8 else b), f


CONFIGS = [
    QuantConfig("mxfp8"), QuantConfig("mxfp8", element="e5m2", tile=(32, 32)),
    QuantConfig("nvfp4"), QuantConfig("nvfp4", rht=True), QuantConfig("nvfp4", tile=(16, 16)),
    QuantConfig("nvfp4", rht=True, stochastic=True),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
@pytest.mark.parametrize("splits", [(64, 0, 128, 64), (256,), (0, 256), (32, 224)], ids=str)
def test_each_group_equals_its_slice_quantized_alone(config, splits):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(256, 128, generator=g) * torch.logspace(-3, 3, 256)[:, None]).to(torch.bfloat16)
    rng = (11, 4) if config.stochastic else None
    got = grouped.quantize(x, config, splits, rowwise=True, colwise=True, rng=rng)
    assert len(got) == len(splits)
    offset = 0
    for i, s in enumerate(splits):
        if s == 0:
            assert got[i] is None
            continue
        sr = None if rng is None else (11, 4 + 2 * i)  # group i: streams 4 + 2i (rowwise) and 4 + 2i + 1
        _equal(got[i], reference.quantize(x[offset : offset + s], config, rowwise=True, colwise=True, rng=sr))
        offset += s


def test_nvfp4_groups_have_their_own_global_amax_by_hand():
    # Group 0 (16 rows) holds values up to 6, group 1 (16 rows) up to 24: A_g = 6 and 24.
    x = torch.zeros(32, 16)
    x[0, 0], x[0, 1] = 6.0, 3.0
    x[16, 0], x[16, 1] = 24.0, 12.0
    q0, q1 = grouped.quantize(x, QuantConfig("nvfp4"), [16, 16])
    assert float(q0.rowwise_amax) == 6.0 and float(q1.rowwise_amax) == 24.0
    # A_g = 6: S_enc = 2688/6 = 448, the block of row 0 has A_b = 6 -> s_blk = 448 (0x7E), 6 -> code 7.
    # A_g = 24: S_enc = 112, A_b = 24 -> d = RN(24 * RN(112/6)) = 448 -> 0x7E, 24 -> y = 6 -> code 7.
    assert int(q0.rowwise_scale[0, 0]) == 0x7E and int(q1.rowwise_scale[0, 0]) == 0x7E
    assert int(q0.rowwise_data[0, 0]) & 0xF == 0x7 and int(q1.rowwise_data[0, 0]) & 0xF == 0x7
    # Element 1: 3 of 6 (group 0) and 12 of 24 (group 1) both scale to y = 3.0, code 5 (the high nibble).
    assert int(q0.rowwise_data[0, 0]) >> 4 == 0x5 and int(q1.rowwise_data[0, 0]) >> 4 == 0x5
    # Quantized as one tensor, A_g = 24 for both groups: row 0's block (A_b = 6) gets
    # d = RN(6 * RN(112/6)) = 112 = 1.75 * 2^6, E4M3 0x6E, not group 0's 0x7E.
    whole = reference.quantize(x, QuantConfig("nvfp4"))
    assert int(whole.rowwise_scale[0, 0]) == 0x6E and int(whole.rowwise_scale[16, 0]) == 0x7E


@pytest.mark.parametrize(("config", "shape", "splits", "rule"), [
    (QuantConfig("nvfp4"), (64, 32), (32, 16), "sum"),
    (QuantConfig("nvfp4"), (64, 32), (40, 24), "group 0 M=40"),
    (QuantConfig("mxfp8"), (64, 64), (48, 16), "group 0 M=48"),
    (QuantConfig("fp8_current"), (64, 64), (32, 32), "grouped"),
    (QuantConfig("nvfp4"), (4, 16, 32), (32, 32), "2-D"),
    (QuantConfig("nvfp4"), (64, 32), (-16, 80), "ints"),
])
def test_splits_rule(config, shape, splits, rule):
    with pytest.raises(SpecViolation) as e:
        grouped.quantize(torch.zeros(shape), config, splits)
    assert rule in str(e.value)


def test_case_ids_round_trip_and_grids_exclude_bad_splits():
    case = Case("grouped_quantize", QuantConfig("nvfp4", rht=True), (128, 64), orientation="both",
                splits=(32, 0, 96))
    assert case.id == "grouped_quantize-nvfp4-e2m1-1x16-rht-both-bf16-128x64-g32_0_96-normal-s0"
    assert Case.from_id(case.id) == case
    with pytest.raises(ValueError, match="splits"):
        Case("grouped_quantize", QuantConfig("nvfp4"), (128, 64))
    with pytest.raises(ValueError, match="splits"):
        Case("quantize", QuantConfig("nvfp4"), (128, 64), splits=(128,))
    cl = parse_cases('[[grid]]\nop = "grouped_quantize"\nscheme = "mxfp8"\nshape = [[128, 64]]\n'
                     'splits = [[64, 64], [32, 96], [16, 112], [64, 32]]\n')
    assert [c.splits for c in cl] == [(64, 64), (32, 96)]
    assert cl.spec_excluded == 2


@pytest.mark.parametrize("config", [QuantConfig("mxfp8"), QuantConfig("nvfp4", rht=True, stochastic=True)],
                         ids=lambda c: c.id)
def test_the_op_compares_every_group(config):
    case = Case("grouped_quantize", config, (128, 64), orientation="both", splits=(32, 0, 96))
    rows = [r for r in runner.run_case(case, "reference", "cpu") if r["kind"] == "conformance"]
    tensors = {r["tensor"] for r in rows}
    assert {"g0_rowwise_data", "g0_colwise_scale", "g2_rowwise_data", "g2_colwise_data"} <= tensors
    assert not any(t.startswith("g1_") for t in tensors)  # the empty group
    assert all(r["status"] == "pass" for r in rows)


class _OneGroupWrong:
    name = "wrong"

    def supports(self, op, config, device):
        return True, ""

    def grouped_quantize(self, x, config, splits, *, rowwise=True, colwise=False, rng=None):
        # Quantizes the whole tensor once and slices it: one shared amax, which grouped quantization forbids.
        return [reference.quantize(x[:s], config, rowwise=rowwise, colwise=colwise) if s else None
                for s in splits][:-1] + [reference.quantize(x, config, rowwise=rowwise, colwise=colwise)]


def test_a_wrong_candidate_fails():
    case = Case("grouped_quantize", QuantConfig("nvfp4"), (128, 64), orientation="rowwise", splits=(32, 96))
    rows = [r for r in runner.run_case(case, _OneGroupWrong(), "cpu") if r["kind"] == "conformance"]
    by = {r["tensor"]: r["status"] for r in rows}
    assert by["g0_rowwise_data"] == "pass" and "fail" in {s for t, s in by.items() if t.startswith("g1_")}
    assert runner.run_case(case, "native", "cpu")[0]["status"] == "skip"
