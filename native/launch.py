"""Kernel launches on torch's current CUDA stream, with as little host work per launch as possible.

Source: DESIGN.md §2 (kernels run on torch's current stream; tensors cross zero-copy). A tensor
argument is passed as its raw device pointer (`np.uint64(t.data_ptr())`): no DLPack view per
argument. The CuPy function handle of each (module, kernel, device) and CuPy's view of each torch
stream are cached, so a launch is: look up two dicts, pack the arguments, cuLaunchKernel (the stream
passed to the call, and CuPy's device switched only when the current one is another).
Memory safety follows torch's stream-ordered allocator: every launch is on the stream the tensors
were allocated on, so memory freed after a launch is reused only by work ordered after it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import numpy as np
import torch

NULL = np.uint64(0)
_FUNCTIONS: dict[tuple, object] = {}
_STREAMS: dict[tuple[int, int], object] = {}


def kernel_arg(a):
    """A kernel argument: a CUDA tensor as its device pointer, None as a null pointer, numpy scalars as is."""
    if a is None:
        return NULL
    if isinstance(a, torch.Tensor):
        if not a.is_cuda:
            raise ValueError(f"kernel argument on {a.device}: expected a CUDA tensor")
        return np.uint64(a.data_ptr())
    if isinstance(a, np.generic):
        return a
    raise TypeError(f"kernel argument {a!r}: expected a CUDA tensor, None or a numpy scalar (its C type)")


def _stream(cupy, device_index: int):
    """CuPy's view of torch's current stream on `device_index` (one object per torch stream)."""
    ptr = torch.cuda.current_stream(device_index).cuda_stream
    s = _STREAMS.get((device_index, ptr))
    if s is None:
        # CuPy 14 deprecates ExternalStream for Stream.from_external; ExternalStream is the path
        # verified on the H200, so it stays until from_external is tested there.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cupy.cuda.ExternalStream(ptr, device_index)
        _STREAMS[(device_index, ptr)] = s
    return s


@functools.cache
def _cupy():
    import cupy

    return cupy


def launch(module, name: str, grid: int | tuple, block: int | tuple, args: Sequence, device_index: int,
           shared_mem: int = 0) -> None:
    """Run kernel `name` of the CuPy RawModule `module` on torch's current stream of `device_index`."""
    cupy = _cupy()
    if cupy.cuda.runtime.getDevice() != device_index:  # callers normally run under torch.cuda.device already
        with cupy.cuda.Device(device_index):
            launch(module, name, grid, block, args, device_index, shared_mem)
        return
    key = (module, name, device_index)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        fn = _FUNCTIONS[key] = module.get_function(name)
    grid = grid if isinstance(grid, tuple) else (int(grid),)
    block = block if isinstance(block, tuple) else (int(block),)
    fn(grid, block, tuple(kernel_arg(a) for a in args), shared_mem=shared_mem, stream=_stream(cupy, device_index))
