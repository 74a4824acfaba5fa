"""Kernel launches on torch's current CUDA stream, with as little host work per launch as possible.

Source: docs/design.md §2 (kernels run on torch's current stream; tensors cross zero-copy). Every
argument is first checked against the kernel's declared parameter list (`native.kernels`: count, and
each value against its C type), then takes one 8-byte slot of a small numpy buffer (one per thread): a
CUDA tensor its device pointer, None a null pointer, an integer its value (two's complement), a float
its bit pattern. The launch is one cuLaunchKernel through CuPy's driver binding, with the buffer's fixed
array of pointers to the slots: the driver reads each parameter's size (known from the cubin) from
the start of its slot, which on a little-endian host holds the value's low bytes, so a 4-byte
parameter reads the value itself. The function handle of each (module, kernel, device) is cached;
the stream is torch's current raw stream; CuPy's device is switched only when the current one is
another.
A prepared launch may be programmatic (`PreparedLaunch(..., programmatic=True)`): cuLaunchKernelEx with
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (CuPy binds no cuLaunchKernelEx: it is called from the
driver library through ctypes), so the kernel may start while the kernel before it in the stream is still
running, and must wait (PTX griddepcontrol.wait) before it touches anything that kernel writes
(docs/design.md §4.1).
Memory safety follows torch's stream-ordered allocator: every launch is on the stream the tensors
were allocated on, so memory freed after a launch is reused only by work ordered after it. The
driver copies the parameters during the call, so the next launch may reuse the buffer.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Sequence

import numpy as np
import torch

from .kernels import signature

SLOT_BYTES = 8
_MAX_ARGS = 64
_SLOT_OFFSETS = np.arange(0, SLOT_BYTES * _MAX_ARGS, SLOT_BYTES, dtype=np.uint64)
_FUNCTIONS: dict[tuple, int] = {}

if sys.byteorder != "little":  # pragma: no cover - every CUDA host is little-endian
    raise ImportError("native.launch packs kernel parameters for a little-endian host")


class _ParamBuffer(threading.local):
    """This thread's parameter buffer: _MAX_ARGS slots, then a pointer to each slot (fixed)."""

    def __init__(self):
        self.buf = np.zeros(2 * _MAX_ARGS, dtype=np.uint64)
        base = int(self.buf.ctypes.data)
        self.buf[_MAX_ARGS:] = _SLOT_OFFSETS + np.uint64(base)
        self.pointers = base + SLOT_BYTES * _MAX_ARGS  # cuLaunchKernel's kernelParams


_PARAMS = _ParamBuffer()


def pack_params(kernel: str, args: Sequence) -> int:
    """Check `args` against kernel `kernel`'s declared parameters (`native.kernels`), write their slots into
    this thread's buffer; the address of its pointer array (cuLaunchKernel's kernelParams), valid until
    the thread's next pack_params."""
    slots = signature(kernel).slots(args)
    n = len(slots)
    if n > _MAX_ARGS:
        raise ValueError(f"{n} kernel arguments; at most {_MAX_ARGS}")
    params = _PARAMS
    params.buf[:n] = slots
    return params.pointers


@functools.cache
def _cupy():
    import cupy

    return cupy


@functools.cache
def launch_kernel():
    """CuPy's cuLaunchKernel binding (resolved once: the attribute chain costs on every launch)."""
    return _cupy().cuda.driver.launchKernel


# cuda.h: CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; CUlaunchAttribute is the id, 4
# bytes of padding and a 64-byte value union (its int programmaticStreamSerializationAllowed first); CUlaunchConfig
# the grid and block dimensions, dynamic shared memory, stream, attributes and their count.
PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


class ProgrammaticConfig:
    """The cuLaunchKernelEx config of one launch geometry (grid x y z, block x y z, shared memory), programmatic
    stream serialization allowed; the stream is set per call (so one config serves one thread at a time)."""

    def __init__(self, geometry: tuple[int, ...]):
        self.geometry = tuple(geometry)
        gx, gy, gz, bx, by, bz, shared_mem = self.geometry
        self.attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        self.config = LaunchConfig(grid=(gx, gy, gz), block=(bx, by, bz), shared_mem=shared_mem,
                                   attrs=ctypes.pointer(self.attr), num_attrs=1)  # fmt: skip
        self.ref = ctypes.byref(self.config)


@functools.cache
def programmatic_launch():
    """cuLaunchKernelEx with a ProgrammaticConfig, called as (config, function, stream, kernelParams); a failure
    raises RuntimeError with its CUresult. Only the stream is written per call (the geometry was set once)."""
    ex = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    ex.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    ex.restype = ctypes.c_int

    def launch(config: ProgrammaticConfig, fn: int, stream: int, params: int) -> None:
        config.config.stream = stream
        err = ex(config.ref, fn, params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernelEx (programmatic stream serialization) failed: CUresult {err}")

    return launch


@functools.cache
def _raw_stream():
    """device index -> torch's current raw stream handle (torch's internal fast path when present)."""
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fast is not None:
        return fast
    return lambda device_index: torch.cuda.current_stream(device_index).cuda_stream


def _dims(d: int | tuple) -> tuple[int, int, int]:
    d = d if isinstance(d, tuple) else (d,)
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


def launch(module, name: str, grid: int | tuple, block: int | tuple, args: Sequence, device_index: int,
           shared_mem: int = 0) -> None:
    """Run kernel `name` of the CuPy RawModule `module` on torch's current stream of `device_index`."""
    cupy = _cupy()
    if cupy.cuda.runtime.getDevice() != device_index:  # callers normally run under torch.cuda.device already
        with cupy.cuda.Device(device_index):
            launch(module, name, grid, block, args, device_index, shared_mem)
        return
    cupy.cuda.driver.launchKernel(function(module, name, device_index), *_dims(grid), *_dims(block), int(shared_mem),
                                  _raw_stream()(device_index), pack_params(name, args), 0)  # fmt: skip


def function(module, name: str, device_index: int) -> int:
    """The CUfunction handle of kernel `name` of `module` on device `device_index` (cached)."""
    key = (module, name, device_index)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = module.get_function(name).kernel.ptr
    return fn


def raw_stream(device_index: int) -> int:
    """torch's current raw stream handle on `device_index`."""
    return _raw_stream()(device_index)


class PreparedLaunch:
    """One kernel launch whose arguments are fixed except its `Patched` slots (a call plan, `native.plan`).

    Built once from an argument template (`Signature.prepare` checks every fixed argument and the dtype of every
    pointer, exactly as `pack_params` would); each thread keeps its own parameter buffer with the fixed slot
    values written once, and a call writes only the patched slots (device pointers, an SR seed) before the
    same cuLaunchKernel as `launch`, on torch's current stream of the plan's device. `programmatic`: launched by
    `programmatic_launch` instead (the kernel waits for the one before it itself: griddepcontrol.wait).
    """

    def __init__(self, module, name: str, grid: int | tuple, block: int | tuple, args: Sequence, device_index: int,
                 shared_mem: int = 0, *, fn: int | None = None, programmatic: bool = False):  # fmt: skip
        slots, patched = signature(name).prepare(args)
        if len(slots) > _MAX_ARGS:
            raise ValueError(f"{len(slots)} kernel arguments; at most {_MAX_ARGS}")
        self.name = name
        self.fixed = tuple(slots)
        self.patched = patched  # ((slot index, Patched marker), ...)
        self.index = device_index
        self.geometry = (*_dims(grid), *_dims(block), int(shared_mem))
        self._fn = fn if fn is not None else (function(module, name, device_index) if module is not None else 0)
        self.programmatic = programmatic
        self._local = threading.local()

    def block(self):
        """This thread's parameter block: (slots, kernelParams address); the fixed slots hold their values."""
        local = self._local
        buf = getattr(local, "buf", None)
        if buf is None:  # the slots (fixed values written once), then a pointer to each slot
            n = len(self.fixed)
            buf = (ctypes.c_uint64 * (2 * max(n, 1)))(*self.fixed)
            base = ctypes.addressof(buf)
            for i in range(n):
                buf[n + i] = base + SLOT_BYTES * i
            local.buf, local.pointers = buf, base + SLOT_BYTES * n
        return buf, local.pointers

    def params(self, values: Sequence[int]) -> int:
        """Write `values` (one int per patched slot, in order) into this thread's block; its kernelParams address."""
        buf, pointers = self.block()
        for (i, _), v in zip(self.patched, values, strict=True):
            buf[i] = v
        return pointers

    def fire(self, pointers: int, stream: int) -> None:
        """cuLaunchKernel (or the programmatic launch, with this thread's config) with the block at `pointers` on
        `stream` (the caller's device is the plan's)."""
        if self.programmatic:
            config = getattr(self._local, "config", None)
            if config is None:
                config = self._local.config = ProgrammaticConfig(self.geometry)
            programmatic_launch()(config, self._fn, stream, pointers)
        else:
            launch_kernel()(self._fn, *self.geometry, stream, pointers, 0)

    def __call__(self, values: Sequence[int], stream: int) -> None:
        """Launch with the patched slots set to `values` on `stream`."""
        self.fire(self.params(values), stream)


class BoundLaunch:
    """A PreparedLaunch with some patched slots fixed for good (the output pointers of one `native.plan.Outputs`):
    its own parameter block, shared by every thread (a call writes only the `named` slots, then launches), so
    concurrent calls of one BoundLaunch must not happen (they would write the same outputs anyway)."""

    def __init__(self, launch: PreparedLaunch, fixed: dict[int, int], named: Sequence[tuple[int, str]]):
        n = len(launch.fixed)
        slots = list(launch.fixed)
        for i, v in fixed.items():
            slots[i] = v
        buf = (ctypes.c_uint64 * (2 * max(n, 1)))(*slots)
        base = ctypes.addressof(buf)
        for i in range(n):
            buf[n + i] = base + SLOT_BYTES * i
        self.buf, self.pointers = buf, base + SLOT_BYTES * n
        self.named = tuple(named)  # (slot index, role in the per-call dict)
        self.name, self.index, self.geometry, self._fn = launch.name, launch.index, launch.geometry, launch._fn
        # A programmatic launch's config (no concurrent calls, as the parameter block); None: cuLaunchKernel.
        self.programmatic_config = ProgrammaticConfig(self.geometry) if launch.programmatic else None

    def __call__(self, base: int, named: dict, stream: int) -> None:
        """Write the per-call slots from `named` and launch on `stream` (`base`: unused, as a Step's signature)."""
        buf = self.buf
        for i, role in self.named:
            buf[i] = named[role]
        self.fire(stream)

    def fire(self, stream: int) -> None:
        """Launch on `stream` with the parameter block as it stands (the last call's per-call slots)."""
        if self.programmatic_config is not None:
            programmatic_launch()(self.programmatic_config, self._fn, stream, self.pointers)
        else:
            launch_kernel()(self._fn, *self.geometry, stream, self.pointers, 0)


def device_index(device: torch.device) -> int:
    """The CUDA ordinal of `device` (torch's current device for a bare "cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def module_for(cu_file: str, config, index: int):
    """The compiled module of `cu_file` for `config` on CUDA device `index` (cached per file, config, device);
    its defines are `native._compile.defines_for(config)`."""
    from . import _compile

    with torch.cuda.device(index):
        arch = _compile.device_arch(index)
        return _compile.load_module(cu_file, _compile.defines_for(config), arch=arch)


@functools.cache
def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def programmatic_supported(index: int | None) -> bool:
    """Whether CUDA device `index` takes programmatic launches (compute capability 9.0 on: PTX griddepcontrol; the
    kernels' waits are no-ops before it); True without a device (CPU-only tests of the launches)."""
    if index is None or not torch.cuda.is_available():
        return True
    return torch.cuda.get_device_capability(index) >= (9, 0)


def grid_stride_blocks(n: int, threads: int, index: int) -> int:
    """CTAs for a grid-stride loop over `n` items with `threads` threads a CTA: enough to cover them, at most
    32 per SM."""
    return max(1, min(-(-n // threads), sm_count(index) * 32))
