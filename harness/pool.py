"""A sweep over worker processes (pebble): every (case, backend) isolated, timed out, and recorded.

Source: the issue's isolation requirements (docs/design.md §5: rows come back to this process, which alone
writes the report). What a worker does that could kill it stays in the worker:
- A pair that crashes its worker (a signal, `os._exit`, a dead CUDA context) becomes one `error`
  row, reason `crash: signal SIGSEGV (-11)` or `crash: exit code 3`; pebble starts a new worker and
  the rest of that task is scheduled again. Pairs that never started are never marked.
- A pair running longer than `case_timeout` seconds gets `error` / `timeout: ...`; its worker is
  killed (pebble cancels the running task) and replaced.
- A pair after which the CUDA context is unusable (a sticky error) keeps its error row; the worker
  then retires and a fresh one (a fresh context) takes the rest of the task.
- Workers die with this process (PR_SET_PDEATHSIG on Linux; a worker forked from the forkserver dies
  with it, and it exits when this process does), ignore SIGINT (pebble), and are stopped on any
  exception here (KeyboardInterrupt, SIGTERM through harness.cli).

Each task is one group of cases sharing an input generation (harness.runner.grouped), so a worker
generates the inputs once per group. At most `TASKS_PER_WORKER` tasks per worker are handed to pebble at a
time (the rest wait here, largest first, the groups with a CPU golden interleaved among the others by
harness.runner.interleaved so that GPUs do not idle through a CPU-bound end): with every group of the nightly tier (4,635)
scheduled at once, each look at the running tasks cost this process tens of milliseconds, and the GIL it
held slowed pebble's threads that hand the next task to a waiting worker. A worker announces each pair before running it and sends its
rows after, as length-prefixed pickles appended to the task's own log file: unlike a queue with a
feeder thread, what a worker wrote before it died is in the file, so the crash is pinned on the
pair that was running. Worker i is pinned to GPU i mod (visible GPUs); replacements go on round-robin.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import os
import pickle
import shutil
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pebble
import torch

from . import backends as backends_mod
from .artefacts import plain_outputs
from .forkserver import apply_heap_policy, context, heap_policy, worker_heap_env
from .golden import InputCache, check_golden, golden_on_cpu
from .rows import exc_text, pair_base, status_row
from .runner import GoldenOnce, SweepResult, grouped, interleaved, record, run_backend, todo
from .sandbox import DEFAULT_IMPORT_TIMEOUT, BackendFailed, BackendProcess, zygote

# A generous default for --case-timeout (seconds per (case, backend), golden included): the largest
# nightly cases take well under a minute on a 2-core host; 0 turns the limit off.
DEFAULT_CASE_TIMEOUT = 900.0
# Seconds past --case-timeout after which this process kills a worker whose pair has not ended: the worker times
# the backend's call itself (and kills the backend's process), so this fires only for a worker that stopped.
JUDGE_GRACE_S = 30.0
# A task whose worker dies before it starts any pair is scheduled again at most this many times.
MAX_SILENT_DEATHS = 3
_POLL_S = 0.2
# Tasks handed to pebble per worker (see the module docstring): one running and one queued behind it, so a
# worker that finishes never waits for this process to schedule its next task.
TASKS_PER_WORKER = 2
_HEADER = struct.Struct("<Q")
_PR_SET_PDEATHSIG = 1
# Hardware work queues per worker context (CUDA_DEVICE_MAX_CONNECTIONS; the driver's default is 8), unless the
# environment sets it. A worker runs one stream, so one queue changes no order it relies on; streams a backend
# adds still run in their order, one after another instead of overlapped. Creating a context and tearing it
# down is what it saves: 24 processes on a 2x H200 host (issue #19) created theirs in 4.5 s with 8 queues and
# 2.4 s with 1, and exited in 1.6 s vs 0.6 s (12 processes: 1.9-2.3 s vs 1.5 s, 0.8 s vs 0.3 s).
WORKER_CUDA_CONNECTIONS = "1"
# Exit code of a worker that retires itself (its CUDA context died on the pair it just recorded).
RETIRE_EXIT = 75

class WorkersDying(RuntimeError):
    """Workers die before running any case (e.g. the backend kills its process when it loads)."""


def visible_gpus() -> list[str]:
    """The GPU ids workers are pinned to (CUDA_VISIBLE_DEVICES entries, else 0..count-1)."""
    if not torch.cuda.is_available():
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [g.strip() for g in env.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def crash_text(exitcode: int | None) -> str:
    """`crash: signal SIGSEGV (-11)` / `crash: exit code 3` for a worker's exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"crash: signal {name} ({exitcode})"
    return f"crash: exit code {exitcode}"


# ----------------------------------------------------------------------------------------------
# Worker side
# ----------------------------------------------------------------------------------------------


class _Worker:
    """This worker process: its name, device, backends (loaded on first use) and input cache. `index` numbers
    the workers in start order (names stay unique across replacements); `slot` picks the GPU (`claim_slot`).
    The sweep's backend specs and golden device arrive with each task (`configure`): workers start before
    the parent knows them (`WorkerPool`)."""

    def __init__(self, index: int, gpus: Sequence[str], specs: dict[str, str], device: str, golden: str,
                 slot: int | None = None):
        self.name = f"w{index}"
        self.device = device
        self.golden = golden
        self.specs = specs
        self.backends: dict[str, BackendProcess] = {}
        self.failed: dict[str, str] = {}  # backend name -> why its process could not load it (not retried)
        self.case_timeout, self.import_timeout = DEFAULT_CASE_TIMEOUT, DEFAULT_IMPORT_TIMEOUT
        self.cache = InputCache()
        if gpus:
            slot = index if slot is None else slot
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]  # before CUDA starts
            os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", WORKER_CUDA_CONNECTIONS)

    def configure(self, specs: dict[str, str], golden: str, limits: tuple[float, float]) -> None:
        """Take the task's backend specs, golden device and (case, import) timeouts (the same for every task of a
        sweep)."""
        if specs != self.specs:
            for b in self.backends.values():
                b.kill()
            self.specs, self.backends, self.failed = specs, {}, {}
        self.golden = golden
        self.case_timeout, self.import_timeout = limits

    def warm_up(self) -> None:
        """Create this worker's CUDA context now, while the parent still selects the cases (a failure is
        left for the first pair to report), one that yields its CPU core while it waits (`yield_while_waiting`)."""
        if backends_mod.device_type(self.device) == "cuda":
            yield_while_waiting(torch.device(self.device).index or 0)
            with contextlib.suppress(Exception):
                torch.zeros(1, device=self.device)

    def backend(self, name: str) -> BackendProcess:
        """The backend's process, started (its import bounded by the import timeout, not charged to a case).
        Raises BackendFailed, at once for a backend that already failed to load in this worker."""
        if name in self.failed:
            raise BackendFailed(self.failed[name])
        b = self.backends.get(name)
        if b is None:
            b = self.backends[name] = BackendProcess(self.specs[name], self.device,
                                                     import_timeout=self.import_timeout)
        try:
            b.start()
        except BackendFailed as e:
            if b.starts <= 1:  # it never loaded here: every later pair gets this error at once
                self.failed[name] = str(e)
            raise
        return b


_WORKER: _Worker | None = None
_CU_CTX_SCHED_YIELD = 0x02  # cuda.h: CUctx_flags


def yield_while_waiting(ordinal: int) -> bool:
    """Ask the driver to create this process's primary context on device `ordinal` with CU_CTX_SCHED_YIELD (call it
    before the context exists): a thread waiting for the GPU then yields its core to other threads instead of
    spinning. The default (CU_CTX_SCHED_AUTO) spins wherever a process holds fewer contexts than the host has
    cores, so 24 workers waiting on two GPUs kept a 32-core host busy and slowed the CPU goldens and input
    draws of the others (issue #19). Where a core is free, a yielding wait returns as soon as a spinning one.
    Returns whether the driver took the flag (False without a CUDA driver)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return False
        return cuda.cuDevicePrimaryCtxSetFlags_v2(dev, _CU_CTX_SCHED_YIELD) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux), then check that the sweep's process
    `parent` is still alive. A forked worker's parent is the forkserver, which exits when `parent` does."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent and not _alive(parent):  # it died before the request took effect
        os._exit(1)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)


def not_inspectable() -> None:
    """Make this process non-dumpable (PR_SET_DUMPABLE 0): another process of the same user, such as a backend's,
    can then neither ptrace it nor open its /proc/<pid>/mem or fd/ entries (root still can)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE


def claim_slot(pids) -> int:
    """Take the first slot of the shared pid array `pids` whose worker is gone (0 or a dead pid) and write this
    process's pid there. Slot i runs on GPU i mod (visible GPUs), so a worker that replaces a crashed one takes
    its GPU and the workers stay balanced over the GPUs. With no free slot (not expected: the pool has as many
    slots as workers) it returns len(pids), a slot of its own."""
    with pids.get_lock():
        for i in range(len(pids)):
            if pids[i] == 0 or not _alive(pids[i]):
                pids[i] = os.getpid()
                return i
        return len(pids)


def _init_worker(parent: int, counter, pids, gpus, device, threads, heap) -> None:
    global _WORKER
    _die_with_parent(parent)
    apply_heap_policy(heap)
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    _WORKER = _Worker(index, gpus, {}, device, "same", slot=claim_slot(pids))
    # Backend processes fork from this worker's zygote, forked now: before CUDA, and with the pinned GPU set.
    zygote(max(1, threads))
    not_inspectable()
    torch.set_num_threads(max(1, threads))
    _WORKER.warm_up()


def _started() -> None:
    """The task `WorkerPool.start` schedules so that pebble starts its workers at once (it starts them on
    the first task)."""


def _put(fd: int, record: tuple) -> None:
    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, _HEADER.pack(len(data)) + data)


def context_dead(device: str) -> str | None:
    """Why this process's CUDA context can no longer be used (a sticky error such as an illegal address), or None."""
    if backends_mod.device_type(device) != "cuda" or not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any failure here means the context is gone
        return exc_text(e)
    return None


def run_items(items: Sequence[tuple[Any, list[str]]], log: str, specs: dict[str, str], golden: str,
              limits: tuple[float, float] = (DEFAULT_CASE_TIMEOUT, DEFAULT_IMPORT_TIMEOUT),
              keep_outputs: bool = False) -> None:
    """Worker: run each (case, backend names) of one task, logging `start` and `rows` records. Every backend
    runs in its own process (harness.sandbox); this process draws the inputs, computes the golden and judges.

    After a pair that left this worker's CUDA context unusable, the worker logs `retire` and exits: its rows are
    recorded, and pebble starts a fresh worker (a fresh context) for the rest of the task.
    """
    w = _WORKER
    w.configure(specs, golden, limits)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        for name in {n for _, names in items for n in names}:  # one `supports` request per backend and task
            with contextlib.suppress(BackendFailed):
                w.backend(name).ask_ahead([c for c, names in items if name in names], w.device)
        for case, names in items:
            once = GoldenOnce(case, w.device, w.golden, cache=w.cache)
            for name in names:
                kept: dict | None = {} if keep_outputs else None
                try:
                    backend = w.backend(name)  # before `start`: its import is not charged to the case
                except BackendFailed as e:
                    _put(fd, ("start", case.id, name))
                    rows = [status_row(pair_base(case, name, w.device, w.name), "error",
                                       f"worker could not load backend {w.specs[name]!r}: {e}")]
                else:
                    _put(fd, ("start", case.id, name))
                    rows = run_backend(case, once, backend, w.device, worker=w.name, timeout=w.case_timeout,
                                       keep=kept)
                # --keep-outputs: the candidate's tensors travel with its rows (this judge rebuilt them from bytes)
                _put(fd, ("rows", case.id, name, rows, plain_outputs(kept.pop("values")) if kept else None))
                dead = context_dead(w.device)
                if dead is not None:
                    _put(fd, ("retire", dead))
                    os.close(fd)
                    fd = None
                    os._exit(RETIRE_EXIT)
    finally:
        if fd is not None:
            os.close(fd)


# ----------------------------------------------------------------------------------------------
# Main side
# ----------------------------------------------------------------------------------------------


@dataclass
class _Task:
    items: list
    log: Path
    deaths: int = 0  # how many times a worker died on this task before starting a pair
    future: Any = None
    offset: int = 0
    done: set = field(default_factory=set)
    current: tuple | None = None  # (case_id, backend) announced and not finished
    retired: bool = False  # the worker exited on purpose after recording a pair (dead CUDA context)
    since: float = 0.0
    timed_out: bool = False

    def remaining(self, skip: tuple | None = None) -> list:
        out = []
        for case, names in self.items:
            left = [n for n in names if (case.id, n) not in self.done and (case.id, n) != skip]
            if left:
                out.append((case, left))
        return out


class WorkerPool:
    """The pebble pool of a sweep's `n_workers` worker processes, pinned to the visible GPUs (or the CPU).

    `start()` starts them at once, before the sweep's cases and backends are known: `harness run` does so
    first (`start(wait=False)`), so the workers fork and create their CUDA contexts while this process selects
    the cases (about as long: seconds on the nightly tier). A `PoolSweep` given the pool runs on it and, once
    every task is settled, tells its workers to end (`end()`) without waiting for them; `stop()` (also on leaving
    a `with` block) ends the workers of a pool that is still open and waits until they have exited.
    Workers start with the heap policy (`worker_heap_env`), replacements too: it is set while the pool is open.
    """

    def __init__(self, n_workers: int, device: str | None = None):
        if n_workers < 1:
            raise ValueError(f"n_workers={n_workers} is invalid: expected at least 1")
        self.n_workers = n_workers
        explicit = device is not None and backends_mod.device_type(device) == "cuda" and ":" in str(device)
        self.gpus = [] if explicit else (
            visible_gpus() if (device is None or backends_mod.device_type(device) == "cuda") else [])
        self.device = str(device) if explicit else ("cuda" if self.gpus else "cpu")
        self.pool = None
        self._pids = None  # the shared slot array: the live worker of each slot (`claim_slot`)
        self._env = contextlib.ExitStack()
        self._starting: concurrent.futures.Future | None = None

    def start(self, *, wait: bool = True) -> WorkerPool:
        """Start the workers (once). With `wait=False` they are started on a thread and this returns at once:
        creating a worker waits for the forkserver, which may still be importing torch and the harness, and
        harness run selects its cases meanwhile (issue #19: the command waited ~2.5 s for it on 2x H200). A later
        `start()` waits for that thread and raises what it raised."""
        if self.pool is None and self._starting is None:
            if not wait:
                ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="harness-workers")
                self._starting = ex.submit(self._start_now)
                ex.shutdown(wait=False)  # the thread ends with its one task
                return self
            self._start_now()
        if self._starting is not None:
            starting, self._starting = self._starting, None
            starting.result()
        return self

    def _start_now(self) -> None:
        ctx = context()
        threads = max(1, (os.cpu_count() or 1) // self.n_workers)
        counter = ctx.Value("i", 0)
        pids = ctx.Array("q", self.n_workers)  # the live worker of each slot (its GPU: slot mod GPUs)
        self._env.enter_context(worker_heap_env())
        self._pids = pids
        self.pool = pebble.ProcessPool(
            max_workers=self.n_workers, context=ctx, initializer=_init_worker,
            initargs=(os.getpid(), counter, pids, self.gpus, self.device, threads, heap_policy()))
        self.pool.schedule(_started)

    def end(self) -> None:
        """Tell every worker to exit (SIGTERM) and return without waiting for them; `stop()` waits. For a sweep
        whose every task is settled (issue #19): the CUDA driver tears the workers' contexts down one at a time,
        ~65 ms each on an H200 (24 workers: 1.6-2.2 s), and `harness run` writes its report meanwhile.
        A worker is a child process of ours whose pid is in the slot array: no other process is signalled."""
        if self._starting is not None:
            with contextlib.suppress(Exception):
                self.start()
        if self.pool is None:
            return
        self.pool.stop()  # first: a pool still running would replace the workers ended below
        slots = set(self._pids[:])  # (set with the pool, in _start_now)
        for p in multiprocessing.active_children():
            if p.pid in slots:
                with contextlib.suppress(Exception):
                    p.terminate()

    def stop(self) -> None:
        """End the workers and wait until they have exited (an interrupt, an error, a sweep that never ran, or
        one whose every task has been settled: nothing is left for them to write)."""
        self.end()
        if self.pool is not None:
            self.pool.join(timeout=10)
            self.pool = None
        self._env.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class PoolSweep:
    """One sweep over `n_workers` pebble workers (a `WorkerPool`, started here unless `workers` gives one
    already started); `run()` returns a runner.SweepResult."""

    def __init__(self, cases: Sequence, specs: Sequence[str] | Mapping[str, str], n_workers: int, *,
                 device: str | None = None, writer=None, out_dir=None, progress=None, golden: str = "same",
                 case_timeout: float = DEFAULT_CASE_TIMEOUT, import_timeout: float = DEFAULT_IMPORT_TIMEOUT,
                 workers: WorkerPool | None = None, keep_outputs: bool = False):
        check_golden(golden)  # before any worker starts
        self.keep_outputs = keep_outputs
        if workers is not None and workers.n_workers != n_workers:
            raise ValueError(f"n_workers={n_workers} but the given WorkerPool has {workers.n_workers} workers")
        self.workers = workers if workers is not None else WorkerPool(n_workers, device)
        self._owns_workers = workers is None
        self.cases, self.n_workers = cases, n_workers
        self.writer, self.out_dir, self.progress = writer, out_dir, progress
        self.golden, self.case_timeout = golden, float(case_timeout or 0)
        self.gpus, self.device = self.workers.gpus, self.workers.device
        self.import_timeout = float(import_timeout or 0)
        # name -> spec; given as specs alone, each backend's name is asked of its own process (harness.sandbox)
        self.specs = dict(specs) if isinstance(specs, Mapping) else backend_names(specs, self.device,
                                                                                  self.import_timeout)
        self.result = SweepResult()
        self.by_id: dict[str, Any] = {}
        self._tmp: Path | None = None
        self._n = 0

    # -- bookkeeping ------------------------------------------------------------------------------

    def _record(self, case_id: str, name: str, rows: list, outputs: dict | None = None) -> None:
        record(self.by_id[case_id], name, rows, self.specs.get(name, name), self.writer, self.out_dir,
               self.progress, self.result, outputs)

    def _error(self, case_id: str, name: str, reason: str) -> None:
        base = pair_base(self.by_id[case_id], name, self.device, "?")
        self._record(case_id, name, [status_row(base, "error", reason)])

    def _new_task(self, pool, items: list, deaths: int = 0) -> _Task:
        self._n += 1
        t = _Task(items, self._tmp / f"task{self._n}.log", deaths)
        t.future = pool.schedule(run_items, args=(items, str(t.log), self.specs, self.golden,
                                                  (self.case_timeout, self.import_timeout), self.keep_outputs))
        return t

    def _harvest(self, t: _Task) -> None:
        """Record every complete record the task's worker has appended since the last look."""
        try:
            with open(t.log, "rb") as f:
                f.seek(t.offset)
                data = f.read()
        except FileNotFoundError:
            return
        pos = 0
        while len(data) - pos >= _HEADER.size:
            (n,) = _HEADER.unpack_from(data, pos)
            if len(data) - pos - _HEADER.size < n:
                break  # a record still being written (or cut by a crash)
            rec = pickle.loads(data[pos + _HEADER.size: pos + _HEADER.size + n])
            pos += _HEADER.size + n
            if rec[0] == "start":
                t.current, t.since = (rec[1], rec[2]), time.monotonic()
            elif rec[0] == "retire":
                t.retired = True
            elif (rec[1], rec[2]) not in t.done:
                t.done.add((rec[1], rec[2]))
                t.current = None
                self._record(rec[1], rec[2], rec[3], rec[4] if len(rec) > 4 else None)
        t.offset += pos

    def _finish(self, pool, t: _Task) -> list[_Task]:
        """Settle a finished, crashed or timed-out task; returns the task scheduled for its rest."""
        if t.timed_out:
            cid, name = t.current
            self._error(cid, name, f"timeout: no result after {self.case_timeout:g} s (--case-timeout); "
                                   "its worker was killed")
            rest, deaths = t.remaining(skip=t.current), 0
        else:
            self._harvest(t)
            try:
                t.future.result()
                rest, deaths = t.remaining(), 0
                if rest:  # a task that returned without running every pair: not expected, so say so
                    for case, names in rest:
                        for n in names:
                            self._error(case.id, n, "worker returned without running this pair")
                    rest = []
            except pebble.ProcessExpired as e:
                if t.retired and t.current is None:
                    rest, deaths = t.remaining(), 0
                elif t.current is not None:
                    self._error(*t.current, crash_text(e.exitcode))
                    rest, deaths = t.remaining(skip=t.current), 0
                else:
                    rest, deaths = t.remaining(), t.deaths + 1
                    if deaths >= MAX_SILENT_DEATHS:
                        raise WorkersDying(f"workers died {deaths} times before running a case "
                                           f"({crash_text(e.exitcode)}); no row was written for them") from e
            except concurrent.futures.CancelledError:
                rest, deaths = t.remaining(), t.deaths
            except Exception as e:  # noqa: BLE001 - e.g. a case that cannot be sent to a worker
                if t.current is not None:
                    self._error(*t.current, f"worker failed: {exc_text(e)}")
                    rest, deaths = t.remaining(skip=t.current), 0
                else:
                    for case, names in t.remaining():
                        for n in names:
                            self._error(case.id, n, f"worker could not run this pair: {exc_text(e)}")
                    rest, deaths = [], 0
        return [self._new_task(pool, rest, deaths)] if rest else []

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> SweepResult:
        items = todo(self.cases, list(self.specs), self.writer)
        self.by_id = {c.id: c for c, _ in items}
        if not items:
            self.workers.stop()
            return self.result
        self._tmp = Path(tempfile.mkdtemp(prefix="harness-pool-"))
        active: list[_Task] = []
        try:
            pool = self.workers.start().pool
            waiting = collections.deque(interleaved(
                grouped(items), lambda g: golden_on_cpu(self.device, self.golden, g[0][0])))
            window = TASKS_PER_WORKER * self.n_workers
            while active or waiting:
                while waiting and len(active) < window:
                    active.append(self._new_task(pool, waiting.popleft()))
                concurrent.futures.wait([t.future for t in active], timeout=_POLL_S,
                                        return_when=concurrent.futures.FIRST_COMPLETED)
                now = time.monotonic()
                for t in list(active):
                    if not t.future.done():
                        self._harvest(t)
                        # the worker times its pair itself (killing the backend's process); this catches a worker
                        # that stopped answering (its golden, or a backend that stopped the worker)
                        late = t.current is not None and now - t.since > self.case_timeout + JUDGE_GRACE_S > \
                            JUDGE_GRACE_S
                        if not late or not t.future.cancel():
                            continue
                        t.timed_out = True
                    active.remove(t)
                    active += self._finish(pool, t)
            # Every task is settled and its rows recorded: end the workers (inside the caller's signal handling: a
            # SIGTERM / Ctrl-C meanwhile is an interrupted sweep, not a lost signal). A pool this sweep was given is
            # only told to end: its owner waits for it (`WorkerPool.stop`; harness run does so after the report).
            if self._owns_workers:
                self.workers.stop()
            else:
                self.workers.end()
        except BaseException:
            self.workers.stop()  # terminates every worker
            for t in active:  # keep what finished before the interrupt
                with contextlib.suppress(Exception):
                    self._harvest(t)
            raise
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return self.result


def backend_names(specs: Sequence[str], device: str, import_timeout: float = DEFAULT_IMPORT_TIMEOUT) -> dict[str, str]:
    """name -> spec, each name asked of the backend's own process (this process never imports a backend).
    Raises BackendFailed (one line) for a backend that cannot load and ValueError for two with one name."""
    out: dict[str, str] = {}
    for spec in specs:
        proc = BackendProcess(spec, device, import_timeout=import_timeout)
        try:
            name = proc.start()["name"]
        finally:
            proc.kill()
        if name in out:
            raise ValueError(f"backends {out[name]!r} and {spec!r} are both named {name!r}: rows are keyed by "
                             "backend name, so one would hide the other; rename one")
        out[name] = spec
    return out


def sweep_parallel(cases: Sequence, specs: Sequence[str], n_workers: int, *, device: str | None = None,
                   writer=None, out_dir=None, progress=None, golden: str = "same",
                   case_timeout: float = DEFAULT_CASE_TIMEOUT) -> SweepResult:
    """Run the sweep over `n_workers` isolated processes (see the module docstring)."""
    return PoolSweep(cases, specs, n_workers, device=device, writer=writer, out_dir=out_dir, progress=progress,
                     golden=golden, case_timeout=case_timeout).run()
