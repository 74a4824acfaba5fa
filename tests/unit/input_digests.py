"""Frozen SHA-256 digests of harness.inputs.generate outputs (the bit-identity oracle of test_input_digests).

Source: issue #18 item 3 / #19 (inputs drawn on the GPU through a device-independent generator).
`data/input_digests.json` was rewritten on 2026-11-26 by running this module on branch `draw` (on main
c5bb808, with the harness/draws.py port of harness/inputs.py and harness/module_inputs.py), so the digests
pin the Draws-based generator: Philox4x32-10 counters per (seed, call, element), the same bytes on CPU and
CUDA (tests/gpu/test_draws_gpu.py). The earlier digests (torch.Generator on the CPU, base 460c2fa) are gone
with that generator. The six smoke cases of the `special_nan` / `special_inf` distributions were added later
(branch `causes`, with `compute` on those cases alone; every earlier entry unchanged):

    PYTHONPATH=$PWD python -m tests.unit.input_digests      # rewrites tests/unit/data/input_digests.json

    PYTHONPATH=$PWD python -m tests.unit.input_digests --time 3  # best-of-3 wall seconds of generate()

Do not rerun it to make test_input_digests pass: a changed digest means a changed input bit.

The sample: every smoke case, every 50th case of the nightly tier, and the first nightly case of every
(op, distribution, scheme, input dtype) so every generator and branch (quantize, dequantize,
grouped_quantize, gemm incl. exact_representable, linear/module inputs) is covered.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import torch

DATA = Path(__file__).with_name("data") / "input_digests.json"
NIGHTLY_STRIDE = 50
# Cases with more input elements than this have their digests checked on a GPU (tests/gpu/test_input_digests_gpu.py:
# the draws give the same bytes on every device); drawn on the 2-core CPU they took ~5 of the CPU suite's minutes.
CPU_ELEMENTS = 1 << 22


def elements(case) -> int:
    """Input elements of a case: the sum over its operands (a linear case: over its module's inputs)."""
    return sum(math.prod(s) for s in case.operand_shapes.values())


def digest(inputs: dict) -> str:
    """SHA-256 over every entry of a generate() dict in key order: name, dtype, shape and raw bytes
    (tensors, which must be on the CPU: the table was written there) or repr (other values, e.g. the "rng" tuple)."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        v = inputs[name]
        h.update(name.encode() + b"\0")
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}|{tuple(v.shape)}|{v.device.type}\0".encode())
            h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode() + b"\0")
    return h.hexdigest()


def sample() -> list[tuple[str, object]]:
    """(tier, case) pairs of the sample, in order, without repeated ids."""
    from harness.cases import load_cases  # noqa: PLC0415

    picked: dict[str, tuple[str, object]] = {}
    for c in load_cases("smoke"):
        picked.setdefault(c.id, ("smoke", c))
    nightly = load_cases("nightly")
    for c in nightly[::NIGHTLY_STRIDE]:
        picked.setdefault(c.id, ("nightly", c))
    seen = set()
    for c in nightly:
        combo = (c.op, c.distribution, c.config.scheme, c.in_dtype)
        if combo not in seen:
            seen.add(combo)
            picked.setdefault(c.id, ("nightly", c))
    return list(picked.values())


def compute(pairs) -> dict[str, dict]:
    """{case id: {"tier", "digest"}}; cases sharing an input_key are generated once."""
    from harness.inputs import generate, input_key  # noqa: PLC0415

    by_key: dict = {}
    out = {}
    for tier, c in pairs:
        k = input_key(c)
        if k not in by_key:
            by_key[k] = digest(generate(c))
        out[c.id] = {"tier": tier, "digest": by_key[k]}
    return out


def timing(pairs, repeat: int = 1) -> tuple[float, float]:
    """(wall, CPU) seconds of generate() over the sample's distinct input keys (single thread), best of
    `repeat` (the CPU time is the one to compare on a shared, loaded host)."""
    import time  # noqa: PLC0415

    from harness.inputs import generate, input_key  # noqa: PLC0415

    cases = list({input_key(c): c for _, c in pairs}.values())
    wall = cpu = math.inf
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        for c in cases:
            generate(c)
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--time"]:
        wall, cpu = timing(sample(), int(sys.argv[2]) if len(sys.argv) > 2 else 1)
        print(f"generate() over the sample: {wall:.2f} s wall, {cpu:.2f} s CPU")
        sys.exit(0)
    table = compute(sample())
    DATA.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} digests to {DATA}")
