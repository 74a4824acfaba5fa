"""The processes `harness run` starts its workers from: on Linux a forkserver, started first thing.

Source: issue #19 (the nightly tier on 2x H200: 24 spawned workers each imported torch and the harness, the
first tasks started 7-10 s after the command). The forkserver imports PRELOAD once, while the command's own
process imports torch and selects the cases (harness.cli starts it before it parses its arguments), and the
workers fork from it in milliseconds. It is started with the workers' heap policy in its environment, and each
worker sets that policy again (`apply_heap_policy`) since the forkserver may predate the values of a later
sweep. This module imports neither torch nor the rest of the harness: it runs before them.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import sys

# Heap policy of sweep workers (host speed, not numerics). glibc serves blocks of 32 MB and more with
# mmap and unmaps them on free, so every large temporary arrives as fresh pages that the kernel faults
# in and zeroes: on 2 cores, generating 20 large nightly input groups took 69 s, 42 s of it in the
# kernel, and 29 s with this policy. Workers keep freed memory in their heap instead; the peak resident
# size is the same (2.35 vs 2.44 GB there) but stays held. Values the user exported win.
WORKER_HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
# The mallopt(3) parameter of each variable: glibc reads the variables when a process starts, so a worker
# forked from the forkserver (which started earlier, maybe with other values) sets them again itself.
_MALLOPT = {"MALLOC_MMAP_MAX_": -4, "MALLOC_TRIM_THRESHOLD_": -1}  # M_MMAP_MAX, M_TRIM_THRESHOLD
_INT_MAX = (1 << 31) - 1
# Modules the forkserver imports once, so that every worker forked from it starts with torch and the harness
# loaded. None of them initializes CUDA at import, so a forked worker can still create its own context.
PRELOAD = ["harness.pool"]


def start_method() -> str:
    """forkserver on Linux (one process imports PRELOAD, workers are forked from it), else spawn."""
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def context():
    """The multiprocessing context workers (and the environment probe) start from."""
    ctx = multiprocessing.get_context(start_method())
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)  # read when the forkserver starts (once per process)
    return ctx


def start() -> None:
    """Start the forkserver now, with the heap policy in its environment (no-op where workers are spawned or
    it runs already); it imports PRELOAD while the caller goes on."""
    if context().get_start_method() == "forkserver":
        from multiprocessing import forkserver  # noqa: PLC0415

        with worker_heap_env():
            forkserver.ensure_running()


def heap_policy() -> dict[str, str]:
    """The heap policy workers take: WORKER_HEAP_ENV with the values this process's environment exports."""
    return {k: os.environ.get(k, v) for k, v in WORKER_HEAP_ENV.items()}


def apply_heap_policy(policy: dict[str, str]) -> None:
    """In a worker: export `policy` and, on glibc, set it with mallopt (values above INT_MAX clamped)."""
    os.environ.update(policy)
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # not glibc: the variables, exported when the worker started, are all there is
    for k, v in policy.items():
        with contextlib.suppress(ValueError):
            mallopt(_MALLOPT[k], min(max(int(v), 0), _INT_MAX))


@contextlib.contextmanager
def worker_heap_env():
    """os.environ with WORKER_HEAP_ENV's unset entries added while workers (or the forkserver) may start."""
    added = {k: v for k, v in WORKER_HEAP_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)
