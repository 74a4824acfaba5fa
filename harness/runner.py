"""Run cases in this process: inputs (CPU) -> golden (reference) -> candidate (backend, its device) -> rows.

Source: docs/design.md §5 (data flow; results recorded before any assertion; failures keep their
inputs), the issue's runner requirements. Per case and backend the rows are:
- conformance rows (kind `conformance`), one per compared tensor: candidate vs golden, exact bytes
  for quantizers and dequantizers, the tolerance table or the exact-representable mode for GEMMs;
- accuracy rows (kind `accuracy`, status `info`) for every backend, the reference included:
  the candidate's dequantized copies vs the high-precision input (the Hadamard-domain input for an
  RHT copy), or its GEMM output vs an fp64 GEMM of the high-precision operands;
- a single `skip` row (Unsupported, with its reason) or `error` row (the exception; `mutated its
  input`; `changed process-wide numerics state`; `crash: ...` for SystemExit) when the backend cannot
  produce a trustworthy candidate.

Each backend gets private copies of its inputs (harness.ops `handed`), compared bit for bit with the
originals after the call; process-wide numerics state (harness.numerics_state) is checked and
restored after each backend. The golden side is harness.golden, the per-op functions harness.ops,
the process pool of a CLI sweep harness.pool, failure artefacts harness.artefacts.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from reference.linear import ModuleRun
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor, Unsupported

from . import backends as backends_mod
from . import numerics_state
from .artefacts import repro_command, safe_name, save_failure  # noqa: F401 - harness.runner API
from .golden import GOLDEN_DEVICES, Golden, InputCache, check_golden, golden_device, prepare  # noqa: F401
from .ops import Output, call_context, gemm_truth, op_for, output_problem  # noqa: F401
from .report import worst_status  # noqa: F401
from .rows import (  # noqa: F401 - harness.runner API
    Row,
    accuracy_row,
    as_jsonable,
    case_columns,
    case_verdict,
    describe_mismatch,
    exc_text,
    format_first_mismatch,
    pair_base,
    result_row,
    status_row,
)
from .verdict import declared_conventions, judge


def crash_reason(e: BaseException) -> str:
    """`crash: ...` for a SystemExit raised by a backend (the pool words process deaths the same way)."""
    return f"crash: exit code {e.code!r} (SystemExit raised)" if isinstance(e, SystemExit) else f"crash: {exc_text(e)}"


def run_backend(case, golden: Golden | Callable[[], Golden], backend, device, *, worker: str = "",
                timeout: float | None = None, keep: dict | None = None) -> list[Row]:
    """All rows of `backend` on `case`; never raises for a backend failure (error/skip rows instead).

    `golden` may be a zero-argument callable, called only when the backend supports the case. `backend` is
    a harness.sandbox.BackendProcess (its code runs in its own process; `timeout` seconds, golden included,
    bound its call) or, through the API, an object run in this process.
    Rows carry the timing columns: inputs_ms and golden_ms from the golden, check_ms for the rest.
    `keep`: a dict that receives the candidate's outputs as `keep["values"]` (harness run --keep-outputs).
    """
    t0 = time.perf_counter()
    deadline = None if not timeout else time.monotonic() + timeout
    used: list[tuple[Golden, float]] = []

    def timed_golden() -> Golden:
        t = time.perf_counter()
        g = golden() if callable(golden) else golden
        used.append((g, time.perf_counter() - t))
        return g

    base = pair_base(case, backend.name, str(device), worker)
    state = numerics_state.snapshot()
    try:
        rows = _backend_rows(case, timed_golden, backend, device, base, deadline, timeout, keep)
    finally:
        changed = numerics_state.changes(state)
        numerics_state.restore(state)
    if changed:
        # NUMERICS: §0.1 / §0.2 rule 7 - no FTZ/DAZ, no TF32: a backend changing them would alter every later result.
        rows = [status_row(base, "error", f"{backend.name} changed process-wide numerics state ("
                           + "; ".join(changed) + "); restored")]
    check_ms = (time.perf_counter() - t0 - sum(dt for _, dt in used)) * 1e3
    times = {"check_ms": check_ms}
    if used:
        times.update(inputs_ms=used[0][0].inputs_ms, golden_ms=used[0][0].wall_ms)
    if any(r.get("status") == "error" for r in rows):
        rows = [dict(r, severity="broken") for r in rows]  # NUMERICS: §11 - an exception is broken
    return [Row(**r, **times) for r in rows]


def _support(backend, case, device) -> tuple[Any, str, tuple[str, str] | None]:
    """(ok, why, split) from the backend's own process (harness.sandbox) or, for an object given to the API, here."""
    if getattr(backend, "isolated", False):
        return backend.supports(case, device)
    return backends_mod.support(backend, case, device)


def _implements(backend, method: str) -> bool:
    return backend.has(method) if getattr(backend, "isolated", False) else callable(getattr(backend, method, None))


def _backend_rows(case, golden: Callable[[], Golden], backend, device, base: Row, deadline: float | None,
                  timeout: float | None = None, keep: dict | None = None) -> list[Row]:
    """run_backend's rows, before the timing columns."""
    try:
        ok, why, split = _support(backend, case, device)
    except Exception as e:  # noqa: BLE001
        return [status_row(base, "error", f"{backend.name}.supports raised {exc_text(e)}")]
    except SystemExit as e:
        return [status_row(base, "error", crash_reason(e))]
    if ok == "error":
        return [status_row(base, "error", why)]
    if not ok and split is None:
        return [status_row(base, "skip", why or f"{backend.name} does not support this case")]
    method = op_for(case).method or case.op  # the linear op calls run_module
    if not _implements(backend, method):
        return [status_row(base, "skip", f"{backend.name} has no {method}()")]
    g = golden()
    if g.error:
        return [status_row(base, "error", g.error)]
    skipped: list[Row] = []
    if split is not None:  # one copy of a both-copies case: run it, skip the other
        orientation, other_why = split
        other = "colwise" if orientation == "rowwise" else "rowwise"
        case, g = dataclasses.replace(case, orientation=orientation), _one_copy_golden(g, orientation)
        skipped = [status_row(base, "skip", f"{other} copy: {other_why or 'not supported'}", tensor=f"{other}_copy")]
    if getattr(backend, "isolated", False):
        return _run_isolated(case, g, backend, device, base, deadline, timeout, keep) + skipped
    try:
        return _run_candidate(case, g, backend, device, base, keep) + skipped
    except Unsupported as e:
        return [status_row(base, "skip", backends_mod.skip_reason(backend, e))]
    except SystemExit as e:  # a backend calling sys.exit must not end the sweep
        return [status_row(base, "error", crash_reason(e))]
    except Exception as e:  # noqa: BLE001 - a backend raising on one case must not stop the sweep
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
        return [status_row(base, "error", f"{exc_text(e)}{where}")]


def _one_copy_golden(g: Golden, orientation: str) -> Golden:
    """The golden side with only copy `orientation` (the other's fields None)."""
    other = "colwise" if orientation == "rowwise" else "rowwise"
    q = g.quantized
    if q is not None:
        q = dataclasses.replace(q, **{f"{other}_{k}": None for k in ("data", "scale", "amax")})
    return dataclasses.replace(g, quantized=q, dequantized={k: v for k, v in g.dequantized.items() if k == orientation})


def _run_candidate(case, golden: Golden, backend, device, base: Row, keep: dict | None = None) -> list[Row]:
    """Rows of one backend on one case (golden already computed), through harness.ops, with their verdict."""
    op = op_for(case)
    dev = golden_device(device)
    # The reference on the golden's own device is the golden run itself (no second pass).
    if isinstance(backend, backends_mod.ReferenceBackend) and dev == op.golden_device(golden):
        out = op.from_golden(case, golden)
    else:
        handed = op.handed(case, golden, dev)
        out = op.candidate(case, backend, device, {k: copy for k, (copy, _) in handed.items()},
                           call_context(case, golden))
        out.evidence.preferred = declared_conventions(backend)  # tried first (docs/adapters.md §4)
        mutated = [k for k, (copy, original) in handed.items() if not _same(copy, original)]
        if mutated:
            return [status_row(base, "error", f"{backend.name} mutated its input ({', '.join(mutated)})")]
    if keep is not None:
        keep["values"] = out.values
    base = Row(**base, wall_ms=out.wall_ms)
    return [Row(**r) for r in judge(op.compare(case, golden, out, base), out.evidence)]


def _run_isolated(case, golden: Golden, backend, device, base: Row, deadline: float | None,
                  timeout: float | None, keep: dict | None = None) -> list[Row]:
    """Rows of a backend run in its own process (harness.sandbox): its inputs go out as bytes, its outputs come
    back as bytes rebuilt into plain tensors here, and only this process compares and grades them."""
    op = op_for(case)
    dev = golden_device(device)
    if backend.builtin == "reference" and dev == op.golden_device(golden):  # the golden run itself
        out = op.from_golden(case, golden)
    else:
        given = {k: original for k, (_, original) in op.handed(case, golden, dev).items()}
        left = None if deadline is None else max(1e-3, deadline - time.monotonic())
        r = backend.call(case, device, given, call_context(case, golden), left)
        if r.kind == "timeout":
            return [status_row(base, "error", f"timeout: no result after {timeout:g} s (--case-timeout); its "
                                              "backend process was killed")]
        if r.kind in ("skip", "error"):
            return [status_row(base, r.kind, r.reason or f"{backend.name}: no reason given")]
        problem = output_problem(case, r.values, golden) or _device_problem(case, r.devices, device)
        if problem:
            return [status_row(base, "error", f"{backend.name}: {problem}")]
        out = Output(place(r.values, device), r.wall_ms)
        out.evidence.preferred = declared_conventions(backend)  # tried first (docs/adapters.md §4)
    if keep is not None:
        keep["values"] = out.values
    base = Row(**base, wall_ms=out.wall_ms)
    return [Row(**r) for r in judge(op.compare(case, golden, out, base), out.evidence)]


def _device_problem(case, devices: Sequence[str], device) -> str | None:
    """A tensor returned on another kind of device than the case's inputs (docs/adapters.md §2)."""
    want = backends_mod.device_type(device)
    bad = sorted({d for d in devices if d.split(":")[0] != want})
    if bad:
        return f"{case.op} returned a tensor on {bad[0]}; the contract expects outputs on the input's device ({device})"
    return None


def place(v: Any, device) -> Any:
    """Decoded outputs (plain CPU tensors) moved to the candidate's `device`, where the backend returned them."""
    if backends_mod.device_type(device) == "cpu":
        return v
    if isinstance(v, (torch.Tensor, QuantizedTensor)):
        return v.to(device)
    if isinstance(v, AmaxHistory):
        v.scale, v.history = v.scale.to(device), v.history.to(device)
        return v
    if isinstance(v, ModuleRun):
        from .chain import run_to  # noqa: PLC0415

        return run_to(v, device)
    if isinstance(v, list):
        return [place(x, device) for x in v]
    if isinstance(v, dict):
        return {k: place(x, device) for k, x in v.items()}
    return v


def _same(copy, original) -> bool:
    from .golden import same_bits  # noqa: PLC0415

    return same_bits(copy, original)


def run_case(case, backend, device="cpu", *, inputs: Mapping | None = None, worker: str = "",
             golden: str = "same", timeout: float | None = None) -> list[Row]:
    """Rows of one backend on one case (docs/design.md §5: `harness.runner.run_case`); `golden`: GOLDEN_DEVICES.
    `backend`: a harness.sandbox.BackendProcess (isolated), or a name, spec or object run in this process."""
    if not getattr(backend, "isolated", False):
        backend = backends_mod.get_backend(backend)
    gdev = golden_device(device, golden, case)
    return run_backend(case, lambda: prepare(case, inputs, gdev), backend, device, worker=worker, timeout=timeout)


class GoldenOnce:
    """The golden side of one case, computed on first use and shared by its backends."""

    def __init__(self, case, device, golden: str = "same", inputs: Mapping | None = None,
                 cache: InputCache | None = None):
        self.case, self.inputs, self.cache = case, inputs, cache
        self.device = golden_device(device, golden, case)
        self.value: Golden | None = None

    def __call__(self) -> Golden:
        if self.value is None:
            self.value = prepare(self.case, self.inputs, self.device, cache=self.cache)
        return self.value


def run_case_backends(case, backends: Sequence, device, *, worker: str = "",
                      inputs: Mapping | None = None, golden: str = "same") -> dict[str, list[Row]]:
    """backend name -> rows; the golden side is computed at most once per case, and only if needed."""
    once = GoldenOnce(case, device, golden, inputs)
    return {b.name: run_backend(case, once, b, device, worker=worker) for b in backends}


# ----------------------------------------------------------------------------------------------
# In-process sweeps (the CLI runs its sweeps through harness.pool)
# ----------------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    counts: dict = field(default_factory=lambda: {"pass": 0, "fail": 0, "skip": 0, "error": 0})
    n_rows: int = 0
    failures: list = field(default_factory=list)  # (case_id, backend)

    def add(self, case_id: str, backend: str, rows: Sequence[Mapping]) -> str:
        v = case_verdict(rows)
        self.counts[v] = self.counts.get(v, 0) + 1
        self.n_rows += len(rows)
        if v in ("fail", "error"):
            self.failures.append((case_id, backend))
        return v

    @property
    def ok(self) -> bool:
        return not self.failures


def record(case, name: str, rows: Sequence[Mapping], spec: str, writer, out_dir, progress, result: SweepResult,
           outputs: Mapping | None = None) -> None:
    """Write one (case, backend)'s rows first, then count them, save a failure, advance the bar; `outputs`
    (plain tensors, harness.artefacts.plain_outputs) go to OUT/outputs/ (harness run --keep-outputs)."""
    if writer is not None:
        writer.write(rows)  # recorded before anything else looks at them
    if outputs and out_dir is not None:
        from .artefacts import save_outputs  # noqa: PLC0415

        save_outputs(out_dir, case.id, name, outputs)
    v = result.add(case.id, name, rows)
    if v in ("fail", "error") and out_dir is not None:
        save_failure(out_dir, case, spec, rows)
    if progress is not None:
        progress.update(1, v)


def todo(cases, names, writer) -> list[tuple[Any, list[str]]]:
    """(case, backend names left to run) for every case with a pair the report does not hold yet."""
    out = []
    for c in cases:
        left = [n for n in names if writer is None or not writer.is_complete(c.id, n)]
        if left:
            out.append((c, left))
    return out


def grouped(items: Sequence[tuple[Any, list[str]]]) -> list[list[tuple[Any, list[str]]]]:
    """`items` grouped by harness.inputs.input_key: the cases of one group get identical inputs,
    generated once when the group runs back to back (harness.golden.InputCache).

    Largest groups first (the sum of their cases' `Case.work`: M*K, or M*N*K for a GEMM; ties in
    order of first appearance), so workers do not end on one long group while the others idle.
    """
    from .inputs import input_groups  # noqa: PLC0415

    groups = input_groups(items, lambda item: item[0])
    return sorted(groups, key=lambda g: -sum(c.work for c, _ in g))


# A case's share of a sweep's time, for `interleaved`: its Case.work to this power. On the nightly tier (2x H200
# host, native backend) a case took ~5 ms at 2^10 elements and ~90 ms at 2^28 with a CPU golden, ~0.4 s at
# 2^24 and ~1.8 s at 2^32 with a GPU golden: fixed costs make time grow about as the cube root of the work.
CASE_COST_POWER = 1 / 3


def interleaved(groups: Sequence[list], on_cpu: Callable[[list], bool]) -> list[list]:
    """`groups` (largest first, from `grouped`) with those whose golden runs on the CPU (`on_cpu`) spread
    among the others, each kind in its own order.

    With every group largest first, a GPU sweep ran its GPU-bound groups (a GPU golden) first and its CPU-bound
    ones (small cases with a CPU golden, harness.golden AUTO_CPU_WORK) last: on the nightly tier the GPUs
    idled through the last fifth of the run (issue #19). Merged here so that each kind has handed out the same
    share of its estimated time (`Case.work` ** CASE_COST_POWER per case) at every point, the CPU-bound groups fill the
    workers that would queue on the GPU, and both kinds still end on their smallest groups.
    """
    def cost(g: list) -> float:
        return sum(c.work ** CASE_COST_POWER for c, _ in g)

    kinds: tuple[list, list] = ([], [])
    for g in groups:
        kinds[bool(on_cpu(g))].append(g)
    totals = [max(1.0, sum(cost(g) for g in k)) for k in kinds]
    done, pos, out = [0, 0], [0, 0], []
    while pos[0] < len(kinds[0]) or pos[1] < len(kinds[1]):
        # the kind whose share handed out so far is smaller goes next (ties: the GPU-bound kind)
        k = 1 if pos[0] == len(kinds[0]) else 0 if pos[1] == len(kinds[1]) else int(
            done[1] * totals[0] < done[0] * totals[1])
        g = kinds[k][pos[k]]
        done[k] += cost(g)
        pos[k] += 1
        out.append(g)
    return out


def sweep(cases: Sequence, backends: Sequence, *, device, writer=None, out_dir=None, progress=None,
          worker: str = "main", golden: str = "same") -> SweepResult:
    """Run every (case, backend) in this process, writing rows as each pair finishes (no isolation:
    a backend that kills its process ends the sweep; `python -m harness run` uses harness.pool)."""
    result = SweepResult()
    by_name = {b.name: b for b in backends}
    specs = {b.name: backends_mod.backend_spec(b) for b in backends}
    for case, names in (item for group in grouped(todo(cases, list(by_name), writer)) for item in group):
        once = GoldenOnce(case, device, golden)
        for n in names:
            rows = run_backend(case, once, by_name[n], device, worker=worker)
            record(case, n, rows, specs[n], writer, out_dir, progress, result)
    return result
