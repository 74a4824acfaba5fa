"""harness.draws and harness.inputs give the same bytes on CUDA as on the CPU (issue #19: inputs drawn on
the GPU through a device-independent generator), plus a timing print of 8192x8192 generations on CUDA.

Source: harness/draws.py (Philox counters per (seed, call, element); only integer ops and correctly rounded
float64 ops), harness/inputs.py (every helper tensor made on the generation device). Byte for byte: NaN
payloads included (inputs write their NaN bits explicitly).
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from harness import draws
from harness.cases import DISTRIBUTIONS, Case, load_cases
from harness.draws import Draws
from harness.inputs import generate, input_key
from reference.formats import QuantConfig

pytestmark = pytest.mark.gpu


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                     b.reshape(-1).view(torch.uint8))


# Over DEVICE_CHUNK counters (three chunks on CUDA, hundreds on the CPU), odd sizes: partial last chunks.
N_BIG = 2 * draws.DEVICE_CHUNK * 2 + 12345


@pytest.mark.parametrize("method", ["uniform", "normal", "integers", "bernoulli", "sign_bits", "signs", "positions",
                                    "lognormal"])
def test_every_draw_is_the_same_on_cuda_and_cpu(method):
    def run(device):
        d = Draws(0x1234_5678_9ABC, device)
        d.uniform(3)  # a later call number
        if method == "integers":
            return d.integers(-64, 64, N_BIG)
        if method == "bernoulli":
            return d.bernoulli(0.125, N_BIG)
        if method == "positions":
            return d.positions(100_000, 8192 * 8192)
        if method == "lognormal":
            return d.normal(N_BIG, then=lambda z: draws.exp(z * 2.0))
        return getattr(d, method)(N_BIG)

    assert _same_bytes(run("cuda"), run("cpu"))


def test_log_sqrt_exp_cos_sin_are_the_same_on_cuda_and_cpu():
    u = Draws(5).uniform(1 << 22)
    pos = torch.cat([1 - u, (1 - u) * 1e-300, (1 - u) * 2.0**900])  # log's domain: positive, finite
    for f, x in ((draws.log, pos), (draws.sqrt, torch.cat([pos, u * 0])), (draws.exp, u * 1300 - 650),
                 (lambda v: draws.cos_sin_turns(v)[0], u),
                 (lambda v: draws.cos_sin_turns(v)[1], u), (draws.pow2, torch.arange(-1022, 1024))):
        assert _same_bytes(f(x.cuda()), f(x))


def _sample() -> list[Case]:
    """The smallest nightly case of every (op, distribution, scheme, input dtype, shape class), one per input key,
    plus 4096x4096 quantize and GEMM cases of every distribution (they cross DEVICE_CHUNK). The smallest, not the
    first: the first were often 8192x8192, 5-19 s each to draw on the CPU, which made this file most of the GPU
    suite's time."""
    picked: dict = {}
    for c in load_cases("nightly"):
        big = max(math.prod(shape) for shape in c.operand_shapes.values())
        combo = (c.op, c.distribution, c.config.scheme, c.in_dtype, big > 1 << 16)
        if combo not in picked or big < picked[combo][0]:
            picked[combo] = (big, c)
    cases, keys = [], set()
    for _, c in picked.values():
        if input_key(c) not in keys:
            keys.add(input_key(c))
            cases.append(c)
    for dist in DISTRIBUTIONS:
        if dist == "exact_representable":
            cases.append(Case("gemm", QuantConfig("nvfp4"), (4096, 4096, 4096), "bfloat16", dist, 1, layout="TN",
                              out_dtype="bfloat16", b_config=QuantConfig("nvfp4"), accumulate=True, bias=True))
        else:
            cases.append(Case("quantize", QuantConfig("mxfp8"), (4096, 4096), "bfloat16", dist, 1, "both"))
    return cases


SAMPLE = _sample()


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_generate_gives_the_same_bytes_on_cuda_and_cpu(case):
    on_gpu, on_cpu = generate(case, "cuda"), generate(case, "cpu")
    assert on_gpu.keys() == on_cpu.keys()
    for name, v in on_cpu.items():
        if isinstance(v, torch.Tensor):
            assert on_gpu[name].device.type == "cuda", name
            assert _same_bytes(on_gpu[name], v), name
        else:
            assert on_gpu[name] == v, name


def test_sample_covers_every_distribution_op_and_dtype():
    assert {c.distribution for c in SAMPLE} == set(DISTRIBUTIONS)
    assert {"quantize", "dequantize", "gemm", "linear"} <= {c.op for c in SAMPLE}
    assert {"bfloat16", "float16", "float32"} <= {c.in_dtype for c in SAMPLE}


def test_print_cuda_generation_times_8192():
    """Not asserted: best-of-3 wall time of generate() of 8192x8192 cases on CUDA (synchronized)."""
    lines = []
    for dist in DISTRIBUTIONS:
        if dist == "exact_representable":
            case = Case("gemm", QuantConfig("mxfp8"), (8192, 8192, 8192), "bfloat16", dist, 0, layout="TN",
                        out_dtype="bfloat16", b_config=QuantConfig("mxfp8"))
        else:
            case = Case("quantize", QuantConfig("mxfp8"), (8192, 8192), "bfloat16", dist, 0, "both")
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            generate(case, "cuda")
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        lines.append(f"{dist:20s} {best * 1e3:8.1f} ms")
    print("\ngenerate() of 8192x8192 on CUDA, best of 3:\n" + "\n".join(lines))
