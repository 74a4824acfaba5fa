"""The input digests of the sample's larger cases, drawn on the GPU (tests/unit/test_input_digests.py checks the
rest on the CPU).

Source: tests/unit/input_digests.py (the frozen table, written on the CPU); harness/draws.py (the same bytes on
every device, tests/gpu/test_draws_gpu.py): a case of more than CPU_ELEMENTS input elements is generated on CUDA,
copied to the CPU and hashed against the table.
"""

from __future__ import annotations

import json

import pytest
import torch

from harness.cases import load_cases
from harness.inputs import generate, input_key

from ..unit.input_digests import CPU_ELEMENTS, DATA, digest, elements

pytestmark = pytest.mark.gpu
TABLE = json.loads(DATA.read_text())


def _large_cases() -> list:
    want: dict = {}
    for cid, row in TABLE.items():
        want.setdefault(row["tier"], set()).add(cid)
    cases = [c for tier, ids in want.items() for c in load_cases(tier) if c.id in ids]
    return sorted((c for c in cases if elements(c) > CPU_ELEMENTS), key=lambda c: c.id)


def test_large_cases_drawn_on_the_gpu_match_the_frozen_digests():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    cases = _large_cases()
    assert len(cases) > 30  # the sample's 8192^2 quantize, large GEMM and linear cases
    done: dict = {}
    bad = []
    for case in cases:
        k = input_key(case)
        if k not in done:
            inputs = generate(case, "cuda")
            done[k] = digest({n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in inputs.items()})
        if done[k] != TABLE[case.id]["digest"]:
            bad.append(case.id)
    assert not bad, f"{len(bad)} of {len(cases)} large cases changed input bits, e.g. {bad[:5]}"
