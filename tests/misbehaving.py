"""Backends that misbehave the way untrusted kernels do, for the fault-injection suite (tests/e2e/test_faults.py).

`chaos` is the reference except on the cases whose first dimension is listed in FAULTS: there it
raises, exits, segfaults, hangs, sleeps, writes into its input or flips process-wide numerics state.
One backend with one fault per case lets a single run (CLI or pytest) exercise every fault. Each
fault also has its own backend (`tests.misbehaving:<fault>`), misbehaving on every case.
"""

from __future__ import annotations

import ctypes
import os
import time

import torch

import reference

SLEEP_S = 1.0  # `sleep`: slower than a plain case, well inside the suite's --case-timeout

# First dimension of the case's input -> the fault `chaos` commits on it.
FAULTS = {
    16: "raise",
    32: "exit",
    48: "segfault",
    64: "system_exit",
    80: "hang",
    96: "sleep",
    112: "mutate",
    128: "flush_denormal",
}
# The status and reason prefix each fault must leave in the report (None: the case passes).
EXPECTED = {
    "raise": ("error", "RuntimeError: injected fault"),
    "exit": ("error", "crash: exit code 3"),
    "segfault": ("error", "crash: signal SIGSEGV (-11)"),
    "system_exit": ("error", "crash: exit code 4 (SystemExit raised)"),
    "hang": ("error", "timeout: "),
    "sleep": None,
    "mutate": ("error", "{name} mutated its input (x)"),
    "flush_denormal": ("error", "{name} changed process-wide numerics state (flush_denormal: False -> True)"),
}


def commit(fault: str, x: torch.Tensor) -> None:
    """Misbehave as `fault` says, before (or instead of) the real work; `mutate` happens after it."""
    if fault == "raise":
        raise RuntimeError("injected fault")
    if fault == "exit":
        os._exit(3)
    if fault == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if fault == "system_exit":
        raise SystemExit(4)
    if fault == "hang":
        while True:
            time.sleep(0.05)
    if fault == "sleep":
        time.sleep(SLEEP_S)
    if fault == "flush_denormal":
        torch.set_flush_denormal(True)


class Misbehaving:
    """The reference quantizer that commits `fault` on the cases `when(x)` picks."""

    def __init__(self, name: str, fault_of):
        self.name = name
        self.fault_of = fault_of  # x -> fault name or None

    def supports(self, op, config, device):
        return (op == "quantize", "" if op == "quantize" else "quantize only")

    def quantize(self, x, config, **kw):
        fault = self.fault_of(x)
        if fault is not None:
            commit(fault, x)
        q = reference.quantize(x, config, **kw)
        if fault == "mutate":
            x.mul_(2)  # after quantizing: its output is right, its input is not what it was given
        return q


chaos = Misbehaving("chaos", lambda x: FAULTS.get(int(x.shape[0])))
# One backend per fault, misbehaving on every case (e.g. tests.misbehaving:segfault).
for _fault in FAULTS.values():
    globals()[_fault] = Misbehaving(_fault, lambda x, f=_fault: f)


def kill_cuda_context(device: torch.device) -> None:
    """An out-of-bounds gather on the GPU: a device-side assert, a sticky error that leaves this process's CUDA
    context unusable (every later CUDA call fails), as a kernel's illegal address does."""
    t = torch.zeros(4, device=device)
    t[torch.tensor([1 << 20], device=device)].sum().item()


class CudaChaos(Misbehaving):
    """The reference quantizer on CUDA that kills its CUDA context on the cases whose first dimension is 32."""

    def __init__(self):
        super().__init__("cuda_chaos", lambda x: None)

    def quantize(self, x, config, **kw):
        if int(x.shape[0]) == 32:
            kill_cuda_context(x.device)
        return reference.quantize(x, config, **kw)


cuda_chaos = CudaChaos()


class Nap:
    """The reference quantizer, slower per call (NAP_ENV seconds, default 0.15): a sweep long enough to be
    killed in the middle."""

    name = "nap"
    NAP_ENV = "HARNESS_TEST_NAP_S"

    def supports(self, op, config, device):
        return (op == "quantize", "" if op == "quantize" else "quantize only")

    def quantize(self, x, config, **kw):
        time.sleep(float(os.environ.get(self.NAP_ENV, "0.15")))
        return reference.quantize(x, config, **kw)


nap = Nap()


def __getattr__(name: str):
    """`tests.misbehaving:unloadable_in_workers`: loads in the main process, raises in a sweep worker."""
    if name == "unloadable_in_workers":
        import multiprocessing  # noqa: PLC0415

        if multiprocessing.parent_process() is not None:
            raise RuntimeError("no GPU driver in this worker")
        return Misbehaving("unloadable_in_workers", lambda x: None)
    raise AttributeError(name)
