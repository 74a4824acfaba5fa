"""The golden side of a case: its inputs (drawn on the CPU, cached per input group) and the reference outputs.

Source: docs/design.md §5 (data flow), docs/numerics.md §0.2.8 (the reference gives the same bits on CPU and
CUDA). Where the golden runs (`golden="same"`, the API default, `"cpu"`, or `"auto"`, the default of the CLI
and the pytest plugin): inputs are always drawn on the CPU (harness.inputs); with "same" the reference then
runs on the candidate's device and the comparison and accuracy metrics are computed there, so a GPU sweep
keeps its big tensors on the GPU; "auto" does so for large cases and keeps small ones on the CPU
(AUTO_CPU_WORK), where their golden and checks are not bound by kernel launches and synchronisations.
A GEMM whose bits could depend on the device (an fp64 sum that rounds in a library's order) is
computed on the CPU (`reference.gemm.device_independent`), so every golden byte is the CPU's. What each op computes is in
harness.ops (one table).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from reference.types import QuantizedTensor

from . import backends as backends_mod
from .rows import exc_text

# Where the golden reference runs: on the candidate's device, always on the CPU, or by the case's size.
GOLDEN_DEVICES = ("auto", "same", "cpu")
# The default of `harness run` / `repro` and of the pytest plugin.
DEFAULT_GOLDEN = "auto"
# "auto": the largest case work (harness.cases.Case.work: elements, or M*N*K for a GEMM) whose golden
# runs on the CPU. Measured on a nightly shard with 8 workers sharing one H200: the golden and checks of a
# quantize case of <= 2^18 elements took 31-41 ms on the GPU and 1.5-21 ms on one CPU core, a GEMM of <= 2^26
# 69-86 ms vs 3-46 ms, a module step of 2^22 402 ms vs 69 ms; an 8192x4096 quantize 0.16 s vs 14 s.
AUTO_CPU_WORK = {"quantize": 1 << 20, "dequantize": 1 << 20, "grouped_quantize": 1 << 20, "gemm": 1 << 26,
                 "linear": 1 << 22}


def check_golden(golden: str) -> None:
    if golden not in GOLDEN_DEVICES:
        raise ValueError(f"golden={golden!r} is invalid: expected one of {GOLDEN_DEVICES}")


def normalized(device: str | torch.device) -> torch.device:
    """`device` with an explicit index for CUDA ("cuda" -> "cuda:<current>"), so devices compare equal."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


def golden_on_cpu(device: str | torch.device, golden: str = "same", case=None) -> bool:
    """Whether the golden for `case` with a candidate on `device` runs on the CPU (no CUDA call)."""
    check_golden(golden)
    small = golden == "auto" and case is not None and case.work <= AUTO_CPU_WORK.get(case.op, 0)
    return golden == "cpu" or small or torch.device(device).type == "cpu"


def golden_device(device: str | torch.device, golden: str = "same", case=None) -> torch.device:
    """The device the golden reference runs on for `case` with a candidate on `device` (see GOLDEN_DEVICES;
    "auto" without a case is "same")."""
    return torch.device("cpu") if golden_on_cpu(device, golden, case) else normalized(device)


def sync(device: str | torch.device) -> None:
    if backends_mod.device_type(device) == "cuda":
        torch.cuda.synchronize(torch.device(device))


def fresh_copy(value: Any, device: str | torch.device) -> Any:
    """A private copy of a tensor or QuantizedTensor on `device` (never the object itself), so a
    backend that writes into what it is handed cannot reach the golden or the next backend."""
    if isinstance(value, torch.Tensor):
        return value.to(device, copy=True)
    if isinstance(value, QuantizedTensor):
        kw = {n: fresh_copy(getattr(value, n), device) for n in QuantizedTensor.TENSOR_FIELDS}
        return dataclasses.replace(value, extra=dict(value.extra), **kw)
    return value


def same_bits(a: Any, b: Any) -> bool:
    """Whether two tensors (or QuantizedTensors, or None) hold the same bytes (NaN payloads included)."""
    if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor):
        return all(same_bits(getattr(a, n), getattr(b, n)) for n in QuantizedTensor.TENSOR_FIELDS)
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().to(b.device).contiguous(), b.detach().contiguous()
    if a.numel() == 0:
        return True
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@dataclass
class Golden:
    """Inputs (CPU, as generated) and reference outputs of one case (on `device`)."""

    inputs: dict
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    on_device: dict = field(default_factory=dict)  # the inputs moved to `device`
    quantized: QuantizedTensor | None = None  # quantize / dequantize ops
    state: Any = None  # fp8_delayed AmaxHistory after the golden run
    dequantized: dict = field(default_factory=dict)  # dequantize op: orientation -> tensor
    qa: QuantizedTensor | None = None  # gemm operands
    qb: QuantizedTensor | None = None
    out: torch.Tensor | None = None  # gemm output
    epilogue: dict = field(default_factory=dict)  # gemm epilogue: "pre" (fp32 input) and "aux" / "bgrad"
    truth: torch.Tensor | None = None  # gemm: fp64 GEMM of the high-precision operands
    accuracy: dict = field(default_factory=dict)  # accuracy row -> (golden SQNR, golden approximation), harness.ops
    wall_ms: float | None = None  # the reference run (golden_ms)
    inputs_ms: float | None = None  # generating or reusing the inputs and moving them (inputs_ms)
    error: str | None = None


def _tensor_copies(inputs: Mapping, fn: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


class InputCache:
    """The last generated inputs of this process: consecutive cases with one harness.inputs.input_key
    share a generation (sweeps run such cases back to back).

    The inputs are generated on the golden's `device` (harness.inputs.generate: the same bytes on every
    device, so the GPU draws them and the host only launches) and copied to the CPU once per group,
    eagerly: the harness reads the CPU inputs for nearly every case (comparison, CPU golden GEMMs,
    accuracy truths, artefacts), so a lazy copy would save nothing and would sync mid-case.
    No backend ever sees (or changes) a kept tensor: `inputs` hands out fresh copies on `device`, and
    on a CPU device the CPU inputs are those copies. Off the CPU, the CPU inputs are the kept tensors
    themselves; the harness only reads them (comparison, CPU golden fallbacks).
    """

    def __init__(self) -> None:
        self.key: Any = None
        self.cpu: dict | None = None  # the kept CPU inputs
        self.moved: dict = {}  # device -> the kept inputs there (the generation's device, or copies)

    def clear(self) -> None:
        self.key, self.cpu, self.moved = None, None, {}

    def inputs(self, case, device: torch.device) -> tuple[dict, dict]:
        """(inputs on the CPU, the inputs on `device`) of `case`."""
        from .inputs import generate, input_key  # noqa: PLC0415 - harness core module, imported when used

        key = input_key(case)
        if self.cpu is None or self.key != key:
            self.clear()  # drop the old tensors before generating the new ones
            made = generate(case, device=device)
            self.key = key
            if device.type == "cpu":
                self.cpu = made
            else:
                self.cpu = _tensor_copies(made, lambda t: t.cpu())
                self.moved[device] = made
        if device.type == "cpu":
            fresh = _tensor_copies(self.cpu, torch.clone)
            return fresh, fresh
        if device not in self.moved:
            self.moved[device] = _tensor_copies(self.cpu, lambda t: t.to(device))
        return dict(self.cpu), _tensor_copies(self.moved[device], torch.clone)


# This process's input cache (each sweep worker is its own process).
INPUTS = InputCache()


def prepare(case, inputs: Mapping | None = None, device: str | torch.device = "cpu",
            cache: InputCache | None = None) -> Golden:
    """Generate the inputs on `device` (unless given; InputCache keeps their CPU copy) and run the golden
    reference there (harness.ops); errors are kept, not raised."""
    from .ops import op_for  # noqa: PLC0415 - ops builds on this module

    dev = normalized(device)
    t_in = time.perf_counter()
    try:
        if inputs is not None:
            inputs = dict(inputs)
            on_device = _tensor_copies(inputs, lambda t: t.to(dev))
        else:
            inputs, on_device = (INPUTS if cache is None else cache).inputs(case, dev)
    except Exception as e:  # noqa: BLE001 - reported as an error row for every backend
        return Golden(inputs={}, error=f"inputs.generate raised {exc_text(e)}")
    g = Golden(inputs=inputs, device=dev, on_device=on_device, inputs_ms=(time.perf_counter() - t_in) * 1e3)
    t0 = time.perf_counter()
    try:
        op_for(case).golden(case, g)
        sync(g.device)  # golden_ms covers the device work
    except Exception as e:  # noqa: BLE001
        g.error = f"golden reference raised {exc_text(e)}"
    g.wall_ms = (time.perf_counter() - t0) * 1e3
    return g
