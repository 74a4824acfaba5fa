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


# ----------------------------------------------------------------------------------------------
# Backends that attack the judge, lie about their output or return what the contract does not (issue #38)
# ----------------------------------------------------------------------------------------------


def _wrong(q):
    """`q` with every rowwise code one step off (a wrong kernel)."""
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(q, rowwise_data=q.rowwise_data ^ 1)


class Patcher(Misbehaving):
    """A wrong kernel that, in its own process, replaces the comparison, the verdict and the golden quantizer
    with ones that say `pass` / `exact`, as a kernel rewarded for passing might."""

    def __init__(self):
        super().__init__("patcher", lambda x: None)

    def quantize(self, x, config, **kw):
        import harness.compare  # noqa: PLC0415
        import harness.ops  # noqa: PLC0415
        import harness.verdict  # noqa: PLC0415

        q = _real_quantize(x, config, **kw)

        def all_pass(golden, cand, x_hp, *a, **k):
            return [r for r in _real_compare(golden, golden, x_hp, *a, **k)]

        _real_compare = harness.compare.compare_quantized
        harness.compare.compare_quantized = all_pass
        reference.quantize = lambda x, config, **kw: _wrong(_real_quantize(x, config, **kw))
        harness.verdict.judge = lambda rows, ev: [dict(r, status="pass", severity="exact") for r in rows]
        return _wrong(q)


_real_quantize = reference.quantize
patcher = Patcher()


class LyingTensor(torch.Tensor):
    """A tensor subclass whose equality checks always answer "equal"."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.Tensor.equal, torch.allclose):
            return True
        if func in (torch.Tensor.__eq__, torch.eq):
            out = super().__torch_function__(func, types, args, kwargs or {})
            return torch.ones_like(out, dtype=torch.bool).as_subclass(torch.Tensor)
        return super().__torch_function__(func, types, args, kwargs or {})


class Liar(Misbehaving):
    """Wrong codes inside a LyingTensor."""

    def __init__(self):
        super().__init__("liar", lambda x: None)

    def quantize(self, x, config, **kw):
        q = _wrong(reference.quantize(x, config, **kw))
        import dataclasses  # noqa: PLC0415

        return dataclasses.replace(q, rowwise_data=q.rowwise_data.as_subclass(LyingTensor))


liar = Liar()


class CustomStop(BaseException):
    """A BaseException of a backend's own (not Exception, not KeyboardInterrupt)."""


class Raises(Misbehaving):
    """Raises a BaseException (KeyboardInterrupt, GeneratorExit, CustomStop) on every call."""

    def __init__(self, name: str, exc: BaseException):
        super().__init__(name, lambda x: None)
        self.exc = exc

    def quantize(self, x, config, **kw):
        raise self.exc


keyboard_interrupt = Raises("keyboard_interrupt", KeyboardInterrupt("from the kernel"))
generator_exit = Raises("generator_exit", GeneratorExit("from the kernel"))
custom_stop = Raises("custom_stop", CustomStop("from the kernel"))


class Returns(Misbehaving):
    """Returns `make(q)`, q the right QuantizedTensor: None, a numpy array, int8 codes..."""

    def __init__(self, name: str, make):
        super().__init__(name, lambda x: None)
        self.make = make

    def quantize(self, x, config, **kw):
        return self.make(reference.quantize(x, config, **kw))


def _int8_codes(q):
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(q, rowwise_data=q.rowwise_data.view(torch.int8))


def _numpy_scale(q):
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(q, rowwise_scale=q.rowwise_scale.numpy())


returns_none = Returns("returns_none", lambda q: None)
returns_numpy = Returns("returns_numpy", lambda q: q.rowwise_data.numpy())
returns_int8 = Returns("returns_int8", _int8_codes)
returns_numpy_scale = Returns("returns_numpy_scale", _numpy_scale)


class Spawner(Misbehaving):
    """The reference, after starting a process that would outlive the run: one in its own session (setsid),
    and one in this process's group. Both carry the environment of the run (the tests find them by it)."""

    def __init__(self):
        super().__init__("spawner", lambda x: None)

    def quantize(self, x, config, **kw):
        import subprocess  # noqa: PLC0415

        subprocess.Popen(["sleep", "300"], start_new_session=True)
        subprocess.Popen(["sleep", "301"])
        return reference.quantize(x, config, **kw)


spawner = Spawner()


class Garbage(Misbehaving):
    """Writes junk into every socket it holds (its channel to the judge) before answering."""

    def __init__(self):
        super().__init__("garbage", lambda x: None)

    def quantize(self, x, config, **kw):
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    os.write(int(fd), b"\xff" * 64)
            except OSError:
                pass
        return reference.quantize(x, config, **kw)


garbage = Garbage()
# Two backends that claim one name, and one that claims the golden's.
same_name_a = Misbehaving("twin", lambda x: None)
same_name_b = Misbehaving("twin", lambda x: None)
named_reference = Misbehaving("reference", lambda x: None)
# A message built to damage a report: NUL, a terminal escape, a lone surrogate, a spreadsheet formula.
HOSTILE = "=HYPERLINK(\"http://x\")\x00\x1b[2J\x1b[31mred\ud800 end"
hostile = Raises("hostile", RuntimeError(HOSTILE))


class HostileSkip(Misbehaving):
    """Declines every case with HOSTILE as its reason (a skip row's reason is the backend's text, verbatim)."""

    def __init__(self):
        super().__init__("hostile_skip", lambda x: None)

    def supports(self, op, config, device):
        return False, HOSTILE


hostile_skip = HostileSkip()
