"""Call plans: what one `native.quantize` / `native.gemm` call signature needs, computed once per process.

Source: docs/design.md §4.1 (call plans), issue #18 item 2 (per-call host cost). The first call with a
key runs the full path (every `reference.spec` check, every error unchanged) and records a plan; later calls
with that key run only what can differ per call: per-call values (the SR seed, a given amax, the fp8_delayed
state, a GEMM's scales and alpha), ONE output allocation (`OutputBlock`: every output a view of it), the
pointer patching of prepared launches (`native.launch.PreparedLaunch`) and the launches on torch's current
stream. Plans live in two bounded caches (`PlanCache`, `MAX_PLANS` entries each); `clear_plans()` empties
them. A plan never holds a tensor of a call: every call allocates fresh outputs, except `quantize(..., out=q)`,
which writes again the block of an earlier planned call (`Outputs`, carried by q as `STAMP`) through launches
bound to it (`Step.bind`).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .launch import BoundLaunch, PreparedLaunch, raw_stream

MAX_PLANS = 256
ALIGN = 256  # every buffer of an OutputBlock starts on this many bytes (torch's CUDA blocks are 512-aligned)
X = "x"  # the role of the quantize input's pointer in a launch template


class PlanCache:
    """A bounded map key -> plan (per process), evicting the oldest RECORDED plan first: a hit does not reorder
    (an LRU's move_to_end costs a second hash of the key on every call); a plan evicted while still in use is
    recorded again by its signature's next call (one full-path call)."""

    def __init__(self, maxsize: int = MAX_PLANS):
        self.maxsize = maxsize
        self.enabled = True  # False: nothing is recorded (`use_plans` also empties the cache: every call is full)
        self.generation = 0  # + 1 on every clear: a memo of a plan (native.gemm's _Recent) is valid while it holds
        self._plans: dict = {}
        self._lock = threading.Lock()
        self.get = self._plans.get  # key -> plan or None (the dict's own method: no Python layer per call)

    def put(self, key, plan) -> None:
        if not self.enabled:
            return
        plans = self._plans
        with self._lock:  # (a miss's path; lookups stay lock-free: a dict's get is atomic)
            plans.pop(key, None)
            plans[key] = plan
            while len(plans) > self.maxsize:
                del plans[next(iter(plans))]

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()  # (in place: `get` stays bound to it)
            self.generation += 1

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key) -> bool:
        return key in self._plans


QUANTIZE_PLANS = PlanCache()
GEMM_PLANS = PlanCache()


def clear_plans() -> None:
    """Forget every cached quantize and GEMM plan of this process (tests; the next calls run the full path)."""
    QUANTIZE_PLANS.clear()
    GEMM_PLANS.clear()


def use_plans(enabled: bool) -> None:
    """Turn the plan caches on (the default) or off (every call takes the full path: before/after benchmarks)."""
    for cache in (QUANTIZE_PLANS, GEMM_PLANS):
        cache.enabled = bool(enabled)
        cache.clear()


@dataclass(frozen=True)
class Buffer:
    """One output region of a call: `shape` x `dtype`, zero-filled or not. `parts`: (field, first element,
    count) flat views returned instead of the whole buffer (e.g. two amax slots of one [2] buffer); `field`:
    whether the whole buffer is viewed under `name` too (False for scratch only the kernels use)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    zero: bool = False
    parts: tuple[tuple[str, int, int], ...] = ()
    field: bool = True


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


class OutputBlock:
    """Every output of one call in ONE allocation (`_raw_block`): buffers at ALIGN-byte offsets, the zero-filled
    ones first (one cudaMemsetAsync on torch's stream clears them), each returned field an `as_strided` view."""

    def __init__(self, buffers: Sequence[Buffer]):
        ordered = [b for b in buffers if b.zero] + [b for b in buffers if not b.zero]
        self.offsets: dict[str, int] = {}  # buffer or part name -> byte offset from the block's start
        self.views: list[tuple[str, torch.dtype, tuple, tuple, int]] = []  # (field, dtype, shape, strides, elem offset)
        self._dtypes: list[torch.dtype] = [torch.uint8]
        self._like: dict = {}  # device -> the template of a fresh block (`_raw_block`)
        off = zero_end = 0
        for b in ordered:
            size = b.dtype.itemsize
            self.offsets[b.name] = off
            for name, first, count in b.parts:
                self.offsets[name] = off + first * size
                if not name.startswith("_"):  # "_name": a slot the kernels alone use (an offset, no view)
                    self.views.append((name, b.dtype, (count,), (1,), (off // size) + first))
            if b.field:
                self.views.append((b.name, b.dtype, tuple(b.shape), _contiguous_strides(b.shape), off // size))
            off += math.prod(b.shape) * size
            if b.zero:
                zero_end = off
            off = -(-off // ALIGN) * ALIGN
        self.offsets["_block"] = 0  # the block's start (the zero-filled buffers: a kernel that clears them itself)
        self.nbytes = max(off, ALIGN)
        internal = [name for name, *_ in self.views if name.startswith("_")]
        # The QuantizedTensor fields among the views (None: all of them).
        self.public = tuple(name for name, *_ in self.views if not name.startswith("_")) if internal else None
        self.zero_bytes = zero_end
        for _, dtype, *_ in self.views:
            if dtype not in self._dtypes:
                self._dtypes.append(dtype)
        # (field, index into the typed views of a block, element size, shape, strides, element offset)
        self._fast = tuple((name, self._dtypes.index(dtype), dtype.itemsize, shape, strides, elem)
                           for name, dtype, shape, strides, elem in self.views)  # fmt: skip

    def allocate(self, device: torch.device, index: int, clear: bool = True) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(base pointer, field -> view) of a fresh block on `device` (current device `index`), zero-filled
        buffers cleared (`clear` False: the caller's first launch clears them); None if the allocator returned a
        block that is not ALIGN-aligned (the caller then takes the full path, whose vector-width choices read the
        real pointers)."""
        raw = _raw_block(self.nbytes, device, self._like)
        base = raw.data_ptr()
        if base % ALIGN:
            return None
        if self.zero_bytes and clear:
            memset_zero(base, self.zero_bytes, index)
        typed = [raw] + [raw.view(dtype) for dtype in self._dtypes[1:]]
        start = raw.storage_offset()  # bytes (0 for a fresh block); as_strided's offset counts from the storage
        as_strided = torch.as_strided  # (the function form: ~0.1 us less per view than the method, timeit on CPU)
        return base, {name: as_strided(typed[t], shape, strides, start // size + elem)
                      for name, t, size, shape, strides, elem in self._fast}  # fmt: skip


def _raw_block(nbytes: int, device: torch.device, like: dict) -> torch.Tensor:
    """A fresh uint8 block [nbytes] on `device` (`empty_from`, its templates in `like`)."""
    return empty_from(like, device, (nbytes,), torch.uint8)


def empty_from(templates: dict, device: torch.device, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty(shape, dtype=dtype, device=device), fresh and contiguous, as torch.empty_like of a template kept in
    `templates` (per device: one element expanded to `shape`, whose empty_like is contiguous): it skips torch.empty's
    argument parsing (0.5 - 2.4 us less host time a call, docs/performance.md §3.1). One shape and dtype per dict."""
    template = templates.get(device)
    if template is None:
        template = templates[device] = torch.empty(1, dtype=dtype, device=device).expand(shape)
    return torch.empty_like(template)


def memset_zero(ptr: int, nbytes: int, index: int) -> None:
    """cudaMemsetAsync(ptr, 0, nbytes) on torch's current stream of device `index` (the current device)."""
    _runtime().memsetAsync(ptr, 0, nbytes, raw_stream(index))


def given_on(given: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A given amax (`reference.spec.check_given_amax`: fp32 [1]) on `device`: itself, or a copy (kept alive by the
    caller until its copy from it is enqueued; torch's allocator orders any reuse after it on the stream)."""
    return given if given.device == device else given.to(device=device)


def current_device() -> int:
    """torch's current CUDA device (its internal getter when present: torch.cuda.current_device also re-checks
    the lazy initialization on every call)."""
    return _device_getter()()


@functools.cache
def _device_getter():
    return getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


@functools.cache
def _runtime():
    import cupy

    return cupy.cuda.runtime


class Step:
    """One prepared launch of a plan and where each patched slot's value comes from per call: a buffer or part
    of the plan's OutputBlock (base + its offset), or a named per-call value (`X`, an SR seed, a state's scale)."""

    def __init__(self, launch: PreparedLaunch, block: OutputBlock):
        self.launch = launch
        self.sources = tuple(block.offsets.get(m.role, m.role) for _, m in launch.patched)
        self._slots = tuple((i, s) for (i, _), s in zip(launch.patched, self.sources, strict=True))

    def values(self, base: int, named: dict) -> list[int]:
        return [base + s if type(s) is int else named[s] for s in self.sources]

    def bind(self, base: int) -> BoundLaunch:
        """This step with the block at `base` for good: only the named per-call values are written per call."""
        fixed = {i: base + s for i, s in self._slots if type(s) is int}
        return BoundLaunch(self.launch, fixed, [(i, s) for i, s in self._slots if type(s) is not int])

    def __call__(self, base: int, named: dict, stream: int) -> None:
        buf, pointers = self.launch.block()
        for i, s in self._slots:  # = launch(values(base, named), stream), without the intermediate list
            buf[i] = base + s if type(s) is int else named[s]
        self.launch.fire(pointers, stream)


class Outputs:
    """The outputs one planned call allocated: the plan, the block's base pointer, its views (`fields`, internal
    ones named "_..." included) and the call's key. The QuantizedTensor of the call carries it as `STAMP`, so
    that `native.quantize(..., out=q)` can write the same memory again (docs/design.md §4.1). A copy of it
    (pickle, deepcopy) is None: a copied QuantizedTensor has its own tensors, which no plan allocated."""

    __slots__ = ("plan", "base", "fields", "key", "steps")

    def __init__(self, plan: QuantizePlan, base: int, fields: dict, key=None):
        self.plan, self.base, self.fields, self.key = plan, base, fields, key
        self.steps = plan.steps  # what _run launches: the plan's steps (patched per call) or, once written again,
        # the steps bound to this block (`bind`: only x, the seed, ... written per call)

    def public(self) -> dict:
        """The QuantizedTensor fields (the views not named "_...")."""
        fields = self.fields
        return fields if self.plan.block.public is None else {n: fields[n] for n in self.plan.block.public}

    def __reduce__(self):
        return (_detached, ())


def _detached() -> None:
    return None


STAMP = "_native_outputs"  # the attribute of a QuantizedTensor that holds the Outputs a plan allocated


class QuantizePlan:
    """A plan of one quantize call signature: subclasses (one per launcher module) set `index`, `block` and
    `steps` and implement `_run(x2d, seed, given, state, out)`, which launches into `out` (an `Outputs`).
    `clears`: its first step clears the block's zero-filled buffers itself (no cudaMemsetAsync per call)."""

    index: int
    clears: bool = False

    def run(self, x2d: torch.Tensor, seed, given, state, into: Outputs | None = None) -> Outputs | None:
        """This call's outputs, on the plan's device: a fresh block, or `into`'s memory written again (its
        zero-filled buffers cleared first). None: take the full path (an unaligned fresh block)."""
        if current_device() != self.index:
            with torch.cuda.device(self.index):
                return self._outputs(x2d, seed, given, state, into)
        return self._outputs(x2d, seed, given, state, into)

    def _outputs(self, x2d, seed, given, state, into):
        if into is None:
            got = self.block.allocate(x2d.device, self.index, clear=not self.clears)
            if got is None:
                return None
            into = Outputs(self, *got)
        else:
            if into.steps is self.steps:
                into.steps = tuple(step.bind(into.base) for step in self.steps)
            if self.block.zero_bytes and not self.clears:
                memset_zero(into.base, self.block.zero_bytes, self.index)
        self._run(x2d, seed, given, state, into)
        return into

    def _run(self, x2d, seed, given, state, out: Outputs) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class OneLaunchPlan(QuantizePlan):
    """A plan whose call is one launch reading x (mxfp8, fp8_block): `steps[0]` into the outputs."""

    def _run(self, x2d, seed, given, state, out: Outputs) -> None:
        out.steps[0](out.base, {X: x2d.data_ptr()}, raw_stream(self.index))
