"""`python -m harness run|list|repro|report|diff|merge|bench`: the command-line face of the harness.

Source: docs/design.md §5-§6 and the issue's CLI requirements. Exit codes: 0 success; 1 the report holds a
failing or erroring case (run, after --resume too; repro) or a regression was found (diff); 2 bad usage
(unknown or unloadable backend, bad --out / --filter / --workers, an unreadable cases file, a report
directory in use or holding a previous report, a corrupt results.csv), printed as one line; 130 / 143
a run stopped by SIGINT / SIGTERM (finished pairs are in the report; --resume continues).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "benchmarks"


# The most worker processes `harness run` starts (each holds a golden, its inputs and one process per backend).
MAX_WORKERS = 256


class UsageError(Exception):
    """A bad argument; printed without a traceback, exit code 2."""


# ----------------------------------------------------------------------------------------------
# Case selection
# ----------------------------------------------------------------------------------------------


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'i/n' (0-based i) -> (i, n)."""
    if not text:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise UsageError(f"--shard {text!r} is invalid: expected i/n with 0 <= i < n (e.g. 0/4 .. 3/4)")
    return int(m.group(1)), int(m.group(2))


def filter_ids(ids: Sequence[str], pattern: str | None) -> list[bool]:
    """Which ids match `pattern`: a regular expression searched in the id, or a plain substring."""
    if not pattern:
        return [True] * len(ids)
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise UsageError(f"--filter {pattern!r} is not a valid regular expression: {e}") from None
    return [bool(rx.search(i)) or pattern in i for i in ids]


def select_cases(tier: str | None, cases_file: str | None, pattern: str | None, shard: str | None) -> list:
    """Cases of a tier or file, filtered by --filter, then the --shard slice.

    Shards partition the selection into whole groups of cases that share one input generation
    (harness.inputs.input_key), so a shard keeps the input reuse a whole run gets: each group, in
    order of first appearance, goes to the shard with the fewest cases so far (the lowest index on
    a tie), which keeps the shards within one group's size of each other.
    """
    from . import cases as cases_mod  # noqa: PLC0415
    from .inputs import input_groups  # noqa: PLC0415

    source = cases_file or tier or "smoke"
    if cases_file and not Path(cases_file).exists():
        raise UsageError(f"--cases {cases_file!r}: no such file")
    try:
        all_cases = cases_mod.load_cases(source)
    except cases_mod.CaseFileError as e:
        raise UsageError(str(e)) from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{source}: not a UTF-8 TOML cases file (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise UsageError(f"{source}: cannot read the cases file: {e.strerror or e}") from None
    keep = filter_ids([c.id for c in all_cases], pattern)
    picked = cases_mod.CaseList(c for c, k in zip(all_cases, keep, strict=True) if k)
    picked.spec_excluded, picked.user_excluded = all_cases.spec_excluded, all_cases.user_excluded
    picked.exclusion_reasons = all_cases.exclusion_reasons
    picked.excluded = getattr(all_cases, "excluded", [])
    picked.full_count = len(all_cases)
    sh = parse_shard(shard)
    if sh:
        i, n = sh
        shards: list[list] = [[] for _ in range(n)]
        for g in input_groups(picked):
            min(shards, key=len).extend(g)  # min() returns the first of equals: the lowest index
        picked[:] = shards[i]
    return picked


def why_no_cases(picked, source: str, pattern: str | None, shard: str | None) -> str:
    """Why a selection is empty, in one line: what the spec rules and `exclude` entries dropped (each
    rule with the grid values it excluded), then the filters."""
    total = getattr(picked, "full_count", 0)
    excluded = getattr(picked, "excluded", []) or []
    if total:
        hit = [e for e in excluded if pattern and re.search(pattern, excluded_label(e[0]))]
        if hit:
            n = f"{len(hit)} grid combination" + ("s, all" if len(hit) > 1 else ",")
            return f"{source} has {total} cases; --filter {pattern!r} matched none of them but {n} excluded by {_rules(hit)}"
        return f"{source} has {total} cases; --filter {pattern!r} and --shard {shard!r} kept none"
    reasons = getattr(picked, "exclusion_reasons", {}) or {}
    parts = []
    if getattr(picked, "spec_excluded", 0):
        why = _rules(excluded) if excluded else ", ".join(
            f"{k} {n}" for k, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        parts.append(f"the spec rules excluded all {picked.spec_excluded} grid combinations ({why})")
    if getattr(picked, "user_excluded", 0):
        parts.append(f"{picked.user_excluded} matched an `exclude` entry")
    return f"{source}: " + ("; ".join(parts) if parts else "its grids define no case")


def excluded_label(combo) -> str:
    """An id-like text of a grid combination the spec excluded (it has no Case, hence no id), for
    matching --filter: op, scheme, element, tile, the other set values, then as a case id ends."""
    from .cases import GRID_KEYS  # noqa: PLC0415

    text = _value_text
    head = ("op", "scheme", "element", "tile")
    tail = ("orientation", "in_dtype", "shape", "distribution")
    combo = {"op": "quantize", **combo}
    parts = [text(combo[k]) for k in head if k in combo]
    parts += [text(combo[k]) for k in GRID_KEYS if k in combo and k not in head + tail + ("seed",)
              and combo[k] not in (None, False, "default")]
    parts += [text(combo[k]) for k in tail if k in combo]
    return "-".join(parts) + f"-s{combo.get('seed', 0)}"


def _value_text(v) -> str:
    """A grid value as a case id writes it (shapes and tiles `AxB`, dtypes short)."""
    from .cases import DTYPE_SHORT  # noqa: PLC0415

    if isinstance(v, (tuple, list)):
        return "x".join(str(d) for d in v)
    return DTYPE_SHORT.get(v, v) if isinstance(v, str) else str(v)


def _rules(excluded) -> str:
    """`rule n (key=value, ...)` per spec-rule category of `excluded` ((combo, category, message)
    triples), most first: the values of the rule's own grid key and of op/scheme among those combos."""
    by: dict[str, list] = {}
    for combo, category, _ in excluded:
        by.setdefault(category, []).append(combo)
    out = []
    for category, combos in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        key = category.removeprefix("config.")
        vals = []
        for k in ("op", "scheme", key):
            seen = sorted({_value_text(c[k]) for c in combos if k in c})
            if seen and f"{k}=" not in " ".join(vals):
                vals.append(f"{k}={'|'.join(seen)}")
        out.append(f"{category} {len(combos)}" + (f" ({', '.join(vals)})" if vals else ""))
    return "; ".join(out)


# A backend name: it keys the report's rows and the --backend comma list, so printable, no comma, short.
_NAME_RE = re.compile(r"[A-Za-z0-9_.+\-:/@ ]{1,80}")


def _start_backend(spec: str, device: str, import_timeout: float):
    """A started harness.sandbox.BackendProcess for `spec` (its code runs in its own process, never here);
    any failure (unknown name, a module raising or hanging at import) is a one-line UsageError."""
    from . import backends as b  # noqa: PLC0415
    from .sandbox import BackendFailed, BackendProcess  # noqa: PLC0415

    if spec not in b.BUILTIN and ":" not in spec and spec not in b.entry_point_names():
        raise UsageError(f"unknown backend {spec!r}: expected one of {', '.join(b.backend_names())} "
                         f"(entry-point group {b.ENTRY_POINT_GROUP!r}), 'package.module:object' or "
                         "'path/to/file.py:object'")
    proc = BackendProcess(spec, device, import_timeout=import_timeout)
    try:
        proc.start()
    except BackendFailed as e:
        raise UsageError(f"--backend {spec!r} could not be loaded: {e}") from None
    if not _NAME_RE.fullmatch(proc.name):
        proc.kill()
        raise UsageError(f"--backend {spec!r} is named {ascii(proc.name)[:90]}: a backend name must be 1-80 "
                         "printable characters (letters, digits, _ . + - : / @ and spaces), no comma")
    return proc


def resolve_backends(text: str, cases: Sequence, device: str, import_timeout: float | None = None) -> list:
    """Started backend processes for --backend (comma list); `auto` = every backend supporting some case.
    Two backends with one name, or a backend taking a built-in's name, are refused (UsageError)."""
    from . import backends as b  # noqa: PLC0415
    from .sandbox import DEFAULT_IMPORT_TIMEOUT  # noqa: PLC0415

    timeout = DEFAULT_IMPORT_TIMEOUT if import_timeout is None else import_timeout
    try:
        names = b.parse_backend_list(text)
    except b.UnknownBackend as e:
        raise UsageError(str(e).strip("'\"")) from None
    if not names:
        raise UsageError(f"--backend {text!r} names no backend (e.g. reference, torch, native, package.module:object)")
    out = []
    try:
        for name in names:
            if name == "auto":
                for cand in b.backend_names():
                    try:
                        be = _start_backend(cand, device, timeout)
                    except UsageError as e:  # a broken plug-in does not stop `auto`
                        print(f"auto: skipping backend {cand!r}: {e}", file=sys.stderr)
                        continue
                    if cand == "reference" or any(m != "skip" for m in _support_marks(be, cases, device)):
                        out.append(be)
                    else:
                        be.kill()
                        print(f"auto: backend {cand!r} supports none of the selected cases on {device}",
                              file=sys.stderr)
            else:
                out.append(_start_backend(name, device, timeout))
        _check_names(out)
    except BaseException:
        for be in out:
            be.kill()
        raise
    return out


def _check_names(backends: Sequence) -> None:
    """Refuse two backends with one name, and a backend other than a built-in taking a built-in's name: rows are
    keyed by name, so one would silently hide the other (and a user backend named `reference` the golden)."""
    from .backends import BUILTIN  # noqa: PLC0415

    seen: dict[str, str] = {}
    for be in backends:
        if be.name in seen and seen[be.name] == be.spec:
            raise UsageError(f"--backend names {be.spec!r} twice")
        if be.name in seen:
            raise UsageError(f"backends {seen[be.name]!r} and {be.spec!r} are both named {be.name!r}: the report keys "
                             "rows by backend name, so one would hide the other; rename one")
        if be.name in BUILTIN and be.spec != be.name:
            raise UsageError(f"backend {be.spec!r} is named {be.name!r}, the name of the built-in backend; rename it")
        seen[be.name] = be.spec


def _support_marks(backend, cases: Sequence, device) -> list[str]:
    """Per case `yes`, `skip`, or the one copy (`rowwise` / `colwise`) a backend runs of a both-copies case,
    asked of the backend's own process in one request."""
    return ["yes" if ok is True else (split[0] if split else "skip")
            for ok, _, split in backend.supports_many(cases, device)]


def _device(arg: str | None) -> str:
    import torch  # noqa: PLC0415

    from .backends import default_device  # noqa: PLC0415

    if arg and arg != "auto":
        try:
            dev = torch.device(arg)
        except RuntimeError as e:
            raise UsageError(f"--device {arg!r} is invalid: {e}") from e
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"--device {arg!r}: no CUDA GPU is visible (torch.cuda.is_available() is False)")
        return arg
    return default_device()


# ----------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------


def _prepare(backends, cases, device) -> None:
    """Each backend's optional one-time `prepare` (e.g. native's parallel kernel compile), in its own process and
    bounded by --import-timeout; a failure is reported and the sweep goes on, so every case records its own
    outcome."""
    for b in backends:
        prep = getattr(b, "prepare", None)
        if not callable(prep):
            continue
        try:
            line = prep(cases, device)
        except Exception as e:  # noqa: BLE001 - a backend's preparation must not stop the sweep
            line = f"{b.name}: prepare failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); going on"
        if line:
            print(f"harness: {line}", file=sys.stderr)


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread so the sweep stops like it does on Ctrl-C."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = int(signum)
        self.label = signal.Signals(self.signum).name


# The signals that stop a sweep the way Ctrl-C does: the report closed, the workers and backend processes ended,
# a resume hint printed (a closed terminal sends SIGHUP).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _sigterm_raises():
    """While running, SIGTERM and SIGHUP raise Terminated (the default would end the process without the
    report's closing steps or stopping the workers)."""
    def handler(signum, frame):
        raise Terminated(signum)

    try:
        previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    except ValueError:  # not the main thread (an embedding caller): leave the signals alone
        yield
        return
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def _out_dir(args) -> Path:
    from .report import ReportError, check_out_dir  # noqa: PLC0415

    out = Path(args.out or Path("reports") / (Path(args.cases).stem if args.cases else (args.tier or "smoke")))
    if out.suffix == ".csv":
        raise UsageError(f"--out {str(out)!r} names a CSV file; --out is the report directory (results.csv and "
                         "run_meta.json are written inside it)")
    try:
        check_out_dir(out)  # a file, a dangling link, a path under a file, a directory it cannot write in
    except ReportError as e:
        raise UsageError(str(e)) from None
    return out


def cmd_run(args) -> int:
    from .forkserver import context as forkserver_context  # noqa: PLC0415
    from .meta import EnvironmentProbe  # noqa: PLC0415
    from .pool import DEFAULT_CASE_TIMEOUT, WorkerPool  # noqa: PLC0415
    from .sandbox import DEFAULT_IMPORT_TIMEOUT, zygote  # noqa: PLC0415

    if args.case_timeout is None:
        args.case_timeout = DEFAULT_CASE_TIMEOUT
    if args.import_timeout is None:
        args.import_timeout = DEFAULT_IMPORT_TIMEOUT
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UsageError(f"--workers {args.workers} is invalid: expected 1 to {MAX_WORKERS} worker processes "
                         f"(each holds a golden and one process per backend; this host has {os.cpu_count()} cores)")
    for flag, v in (("--case-timeout", args.case_timeout), ("--import-timeout", args.import_timeout)):
        if not math.isfinite(v) or v < 0:
            raise UsageError(f"{flag} {v:g} is invalid: expected a finite number of seconds >= 0 (0 = no limit)")
    if args.resume and args.force:
        raise UsageError("--resume and --force exclude each other (--force replaces the report --resume continues)")
    if args.resume_any and not args.resume:
        raise UsageError("--resume-any goes with --resume (it lets --resume continue a report of another selection)")
    from .report import accept_policy  # noqa: PLC0415

    accept_policy(args.accept)  # a bad --accept (or project accept) stops here, before any case runs
    out = _out_dir(args)
    # Backend processes fork from the zygote: fork it before this process asks CUDA anything (`_device`: a process
    # forked after the CUDA driver started in its parent cannot use CUDA) or starts threads (the workers' start).
    zygote()
    device = _device(args.device)
    # The workers start first, on a thread (harness.pool.WorkerPool.start): they fork from the forkserver once it
    # has imported torch and the harness, and create their CUDA contexts, while this process selects the cases and
    # prepares the backends; every return below stops them. The environment probe (about a second of GPU
    # queries) runs meanwhile in a process of its own; its answer joins run_meta.json when it comes.
    with _sigterm_raises(), WorkerPool(args.workers, args.device if args.device not in (None, "auto") else None) \
            as workers:
        return _run_with(args, out, device, workers.start(wait=False), EnvironmentProbe(forkserver_context()))


def _run_with(args, out: Path, device: str, workers, env) -> int:
    """cmd_run once its workers are starting; `env`: the harness.meta.EnvironmentProbe of this run."""
    cases = select_cases(args.tier, args.cases, args.filter, args.shard)
    if not cases:
        why = why_no_cases(cases, args.cases or args.tier or "smoke", args.filter, args.shard)
        print(f"error: no cases selected: {why}", file=sys.stderr)
        return 2
    backends = resolve_backends(args.backend, cases, device, args.import_timeout)
    try:
        return _sweep(args, out, device, workers, env, cases, backends)
    finally:
        for b in backends:
            b.kill()


def _sweep(args, out: Path, device: str, workers, env, cases, backends) -> int:
    """cmd_run once its cases are selected and its backends' processes answer (`backends`)."""
    from . import report  # noqa: PLC0415
    from .artefacts import repro_command  # noqa: PLC0415
    from .backends import backend_identity  # noqa: PLC0415
    from .meta import adapter_info, run_meta, selection  # noqa: PLC0415
    from .pool import PoolSweep, WorkersDying  # noqa: PLC0415
    from .progress import Progress  # noqa: PLC0415

    options = {k: v for k, v in vars(args).items() if k != "func"}
    options.update(device=device, backends=[b.name for b in backends], n_cases=len(cases))
    # The environment and the adapters' packages (importlib.metadata scans every installed distribution: 1.8 s
    # on the GPU host of issue #19) join run_meta.json on a thread, when the probe answers.
    meta = run_meta(options, env={})
    # What --resume continues and merge joins (harness.meta.check_resume: refused unless the same, or --resume-any).
    meta["selection"] = selection(tier=args.tier, cases_file=args.cases, filter=args.filter,
                                  shard=parse_shard(args.shard), golden_device=args.golden_device,
                                  backends=[b.spec for b in backends],
                                  backend_code=[backend_identity(b.spec) for b in backends])
    try:
        writer = report.ReportWriter(out, meta, resume=args.resume, force=args.force, resume_any=args.resume_any)
    except report.ReportError as e:
        raise UsageError(str(e)) from None
    ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="harness-meta")
    env_written = ex.submit(lambda: writer.write_meta(**env.result(), adapters=[adapter_info(b) for b in backends]))
    ex.shutdown(wait=False)
    for note in writer.notes:
        print(f"harness: {note}", file=sys.stderr)
    todo = sum(1 for c in cases for b in backends if not writer.is_complete(c.id, b.name))
    skipped = len(cases) * len(backends) - todo
    print(f"harness: {len(cases)} cases x {len(backends)} backends ({', '.join(b.name for b in backends)}) "
          f"on {device} -> {out}" + (f" (resume: {skipped} already done)" if skipped else ""), file=sys.stderr)
    progress = Progress(todo, force=args.progress, label="run")
    stopped = None
    try:
        with _sigterm_raises():
            try:
                if todo:
                    _prepare(backends, cases, device)
                specs = {b.name: b.spec for b in backends}
                for b in backends:  # the workers start their own; these answered for the selection and prepare
                    b.kill()
                PoolSweep(cases, specs, args.workers,
                          device=args.device if args.device not in (None, "auto") else None, writer=writer,
                          out_dir=out, progress=progress, golden=args.golden_device,
                          case_timeout=args.case_timeout, import_timeout=args.import_timeout, workers=workers,
                          keep_outputs=args.keep_outputs).run()
            except KeyboardInterrupt:
                stopped = ("interrupted", 130)
            except Terminated as e:
                stopped = (f"terminated ({e.label})", 128 + e.signum)
            except WorkersDying as e:
                stopped = (f"stopped: {e}", 1)
            progress.close()
            # The counts of the whole report (a resumed one included), written while the lock is held.
            df = report.read_results(out, checked=True)  # written here, under the report's lock
            cs = report.case_status(df)
            counts = {s: int((cs["status"] == s).sum()) for s in ("pass", "fail", "skip", "error")}
            env_written.result()  # one writer of run_meta.json at a time
            writer.write_meta(finished=stopped is None, counts=counts, **({"stopped": stopped[0]} if stopped else {}))
            # The sweep told its workers to end; their exits (one CUDA context torn down at a time) overlapped the
            # lines above. Wait for them here, where SIGTERM still raises Terminated.
            workers.stop()
    finally:
        progress.close()
        with contextlib.suppress(Exception):
            env_written.result()
        writer.close()
    if stopped:
        print(f"harness: {stopped[0]}; {len(cs)} (case, backend) pairs are in {out / report.RESULTS}; continue "
              f"with the same command and --resume", file=sys.stderr)
        return stopped[1]
    print(report.format_summary(df))
    print(report.format_time_split(df))
    print(f"\n{len(df)} rows in {out / report.RESULTS} ({len(cs)} (case, backend) pairs); pass {counts['pass']}, "
          f"fail {counts['fail']}, skip {counts['skip']}, error {counts['error']}")
    bad = cs[cs["status"].isin(["fail", "error"])]
    if len(bad):
        print(f"failing cases keep their inputs and a repro.sh under {out / report.FAILURES}/")
        specs = {b.name: b.spec for b in backends}
        for r in bad.head(10).itertuples(index=False):
            print(f"  {repro_command(r.case_id, specs.get(r.backend, r.backend))}")
        if len(bad) > 10:
            print(f"  ... and {len(bad) - 10} more")
    return _accept_exit(df, args.accept)


def _accept_exit(df, flag: str | None, *, policy_required: bool = False) -> int:
    """Print the CI policy's line (harness.report.unaccepted) and return the exit status it gives: 1 when a
    (case, backend) pair is outside `--accept` (or the project file's `accept`, or the default), else 0. With
    `policy_required` (harness report), no flag and no project setting means exit 0, as before."""
    from . import report  # noqa: PLC0415

    accept, source = report.accept_policy(flag)
    if policy_required and source == "default":
        return 0
    bad = report.unaccepted(df, accept)
    print(report.format_accept(bad, accept, source))
    return 1 if len(bad) else 0


def cmd_list(args) -> int:
    from . import backends as b  # noqa: PLC0415
    from .sandbox import DEFAULT_IMPORT_TIMEOUT, zygote  # noqa: PLC0415

    if args.backends:
        zygote()  # before CUDA starts here (see cmd_run)
        device = _device(args.device)
        from .cases import Case  # noqa: PLC0415

        probe = Case("quantize", _probe_config(), (128, 128))
        for name in b.backend_names():
            try:
                be = _start_backend(name, device, DEFAULT_IMPORT_TIMEOUT)
            except UsageError as e:
                print(f"{name:12s} cannot load: {str(e).split(': ', 1)[-1]}")
                continue
            try:
                ok, why, _ = be.supports_many([probe], device)[0]
            finally:
                be.kill()
            state = "ok" if ok is True else f"quantize(fp8_current): {why}"
            print(f"{name:12s} {state}")
        return 0
    cases = select_cases(args.tier, args.cases, args.filter, args.shard)
    if args.backend:
        zygote()  # before CUDA starts here (see cmd_run)
    device = _device(args.device) if args.backend else None
    bes = resolve_backends(args.backend, cases, device) if args.backend else []
    try:
        marks = {be.name: _support_marks(be, cases, device) for be in bes}
    finally:
        for be in bes:
            be.kill()
    for i, c in enumerate(cases):
        if bes:
            print(f"{c.id}  {' '.join(f'{n}:{m[i]}' for n, m in marks.items())}")
        else:
            print(c.id)
    if not cases:  # one line: why, with the grid values the spec rules excluded; still exit 0
        print(f"0 cases: {why_no_cases(cases, args.cases or args.tier or 'smoke', args.filter, args.shard)}",
              file=sys.stderr)
    else:
        print(f"{len(cases)} cases", file=sys.stderr)
    return 0


def _probe_config():
    from reference.formats import QuantConfig  # noqa: PLC0415

    return QuantConfig("fp8_current")


def cmd_repro(args) -> int:
    import torch  # noqa: PLC0415

    from . import runner  # noqa: PLC0415
    from .cases import Case  # noqa: PLC0415
    from .classify import EXAMPLES_SHOWN, format_examples  # noqa: PLC0415
    from .sandbox import DEFAULT_IMPORT_TIMEOUT, zygote  # noqa: PLC0415

    try:
        case = Case.from_id(args.case_id)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"cannot parse case id {args.case_id!r}: {e}") from e
    zygote()  # before CUDA starts here (see cmd_run)
    device = _device(args.device)
    inputs = None
    if args.inputs:
        if not Path(args.inputs).exists():
            raise UsageError(f"--inputs {args.inputs!r}: no such file")
        try:
            inputs = torch.load(args.inputs, weights_only=False)
        except Exception as e:  # noqa: BLE001 - not a torch.save file: one line, no traceback
            raise UsageError(f"--inputs {args.inputs!r} is not an inputs.pt saved by a run: {type(e).__name__}") from None
    worst = "pass"
    for name in args.backend.split(","):
        be = _start_backend(name.strip(), device, DEFAULT_IMPORT_TIMEOUT)
        try:
            rows = runner.run_case(case, be, device, inputs=inputs, worker="repro", golden=args.golden_device,
                                   timeout=args.case_timeout)
        finally:
            be.kill()
        print(f"== {case.id} [{be.name} on {device}]")
        for r in rows:
            metrics = " ".join(f"{k}={r[k]:.6g}" for k in ("max_abs", "max_rel", "sqnr_db", "delta_sqnr_db")
                               if isinstance(r.get(k), (int, float)))
            mm = f" {r.get('n_mismatch')}/{r.get('n')} mismatched" if r.get("n_mismatch") else ""
            print(f"  {r['status']:5s} {r['kind']:11s} {r['tensor']:16s}{mm} {metrics}".rstrip())
            if r.get("reason"):
                print(f"        {r['reason']}")
            if r.get("first_mismatch"):
                print("        first mismatch:\n" + runner.format_first_mismatch(r["first_mismatch"], " " * 10))
            shown = format_examples(r.get("mismatch_examples"), indent=" " * 10)
            if shown:
                print(f"        mismatch examples (up to {EXAMPLES_SHOWN} per class):\n" + "\n".join(shown))
        sev = rows[0].get("severity") if rows else ""
        if sev:
            conv = rows[0].get("matches_convention")
            print(f"  severity: {sev}" + (f" (bit-exact under convention {conv})" if conv else "")
                  + " (docs/numerics.md §11)")
        v = runner.case_verdict(rows)
        worst = v if runner.worst_status([worst, v]) == v else worst
        if args.out and v in ("fail", "error"):
            d = runner.save_failure(args.out, case, name.strip(), rows, inputs=inputs)
            print(f"  saved to {d}")
    return 1 if worst in ("fail", "error") else 0


def cmd_report(args) -> int:
    from . import (
        report,  # noqa: PLC0415
        report_formats,  # noqa: PLC0415
    )

    accept, source = report.accept_policy(args.accept)  # a bad --accept is an error before anything is printed
    formats = report_formats.parse_formats(args.format)
    try:
        df = report.read_results(args.dir)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from e
    if not args.quiet:  # run printed it already (README Quickstart: run && report --quiet)
        print(report.format_summary(df))
        print(report.format_time_split(df))
    cs = report.case_status(df)
    print(f"{'' if args.quiet else chr(10)}{len(df)} rows, {len(cs)} (case, backend) pairs in "
          f"{report.results_path(args.dir)}")
    bad = df[df["status"].isin(["fail", "error"])]
    for r in bad.drop_duplicates(["case_id", "backend"]).head(0 if args.quiet else args.show).itertuples(index=False):
        line = f"  {r.status:5s} {r.case_id} [{r.backend}] {r.tensor}: {r.reason}"
        print(report.escape_text(line))  # a report written before the sanitizer may hold raw escapes
    written = []
    if not args.no_plots:
        from . import plots  # noqa: PLC0415

        out = Path(args.plots_dir) if args.plots_dir else Path(args.dir) / "plots"
        written, message = plots.write_plots(df, out)
        if message:
            print(message)
        for p in written:
            print(f"plot: {p}")
    report_dir = report.results_path(args.dir).parent
    for p in report_formats.write_formats(df, report_dir, formats, accept=accept, source=source, plots=written):
        print(f"wrote: {p}")
    return _accept_exit(df, args.accept, policy_required=True)


def cmd_diff(args) -> int:
    from . import report  # noqa: PLC0415

    try:
        old, new = report.read_results(args.old), report.read_results(args.new)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from e
    if args.bitwise and not args.pair:
        raise UsageError("--bitwise goes with --pair A:B (the two backends whose saved outputs are compared)")
    if args.pair:
        return _pair_diff(args, old, new)
    regressions, notes = report.diff(old, new, sqnr_drop_db=args.sqnr_db)
    for n in notes:
        print(f"note: {n}")
    for r in regressions:
        print(f"REGRESSION: {r}")
    print(f"{len(regressions)} regression(s) between {args.old} and {args.new}")
    return 1 if regressions else 0


def _pair_diff(args, old, new) -> int:
    """diff --pair A:B [--bitwise]: exit 1 when the two backends differ (verdicts, or bytes with --bitwise)."""
    from . import report  # noqa: PLC0415

    a, b = report.parse_pair(args.pair)
    if args.bitwise:
        diffs, notes = report.bitwise_diff(args.old, args.new, a, b)
    else:
        diffs, notes = report.pair_diff(old, new, a, b)
    for n in notes:
        print(f"note: {n}")
    for d in diffs:
        print(f"DIFFERS: {d}")
    what = "case(s) whose bytes differ" if args.bitwise else "difference(s)"
    print(f"{len(diffs)} {what} between {a} ({args.old}) and {b} ({args.new})")
    return 1 if diffs else 0


def cmd_merge(args) -> int:
    from . import report  # noqa: PLC0415

    notes: list[str] = []
    try:
        df = report.merge(args.out, args.shards, prefer=args.prefer, allow_incomplete=args.allow_incomplete,
                          notes=notes)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    for n in notes:
        print(f"merge: {report.escape_text(n)}", file=sys.stderr)
    print(report.format_summary(df))
    print(f"\nmerged {len(args.shards)} shard(s), {len(df)} rows -> {report.results_path(args.out)}")
    return 0


def bench_scripts(bench_dir: Path = BENCH_DIR) -> dict[str, Path]:
    """name -> script for every benchmarks/bench_*.py (the native engineers ship them)."""
    if not bench_dir.is_dir():
        return {}
    return {p.stem: p for p in sorted(bench_dir.glob("bench_*.py"))}


def cmd_bench(args) -> int:
    scripts = bench_scripts(Path(args.bench_dir))
    if args.list or not scripts:
        if not scripts:
            print(f"no benchmark scripts in {args.bench_dir}/ (benchmarks/bench_*.py come with the native backend)",
                  file=sys.stderr)
            return 2
        for name, p in scripts.items():
            print(f"{name:28s} {p}")
        return 0
    names = [n.removesuffix(".py") for n in args.names] or list(scripts)
    names = [n if n in scripts or f"bench_{n}" not in scripts else f"bench_{n}" for n in names]
    missing = [n for n in names if n not in scripts]
    if missing:
        where = ", ".join(f"{args.bench_dir}/{n}.py" for n in missing)
        print(f"benchmark script(s) missing: {where}; available: {', '.join(scripts)}", file=sys.stderr)
        return 2
    print("bench: will run " + ", ".join(names), flush=True)
    rc = 0
    for n in names:
        cmd = [sys.executable, str(scripts[n]), *args.bench_args]
        print("bench: running " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, cwd=REPO_ROOT)
        if r.returncode != 0:
            print(f"bench: {n} exited with {r.returncode}", file=sys.stderr)
            rc = 1
    return rc


# ----------------------------------------------------------------------------------------------
# Parser
# ----------------------------------------------------------------------------------------------


def _selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", default=None, help="case tier (a file in cases/; default smoke)")
    p.add_argument("--cases", default=None, metavar="FILE", help="a cases TOML file instead of a tier")
    p.add_argument("--filter", default=None, metavar="PATTERN", help="regex (or substring) searched in case ids")
    p.add_argument("--shard", default=None, metavar="I/N", help="run the I-th of N balanced slices (0-based; cases sharing one input stay together)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if visible, else cpu)")


def _golden(p: argparse.ArgumentParser) -> None:
    from .golden import DEFAULT_GOLDEN, GOLDEN_DEVICES  # noqa: PLC0415

    p.add_argument("--golden-device", choices=GOLDEN_DEVICES, default=DEFAULT_GOLDEN,
                   help="where the golden reference runs (same bits everywhere): auto (default) on the cpu for "
                        "small cases and on the backend's device for large ones (harness/golden.py AUTO_CPU_WORK), "
                        "same: always on the backend's device, cpu: always on the cpu")


def _accept(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accept", default=None, metavar="WORDS",
                   help="CI policy: exit 0 when every (case, backend) pair is skipped or within this comma list of "
                        "pass, exact, convention, equivalent, degraded, broken (default: [tool.numerics-harness] "
                        "accept in ./pyproject.toml, else pass: fail and error pairs fail; docs/numerics.md §11)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness", description="Low-precision numerics verification harness")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a sweep and write results.csv + run_meta.json")
    _selection(p)
    p.add_argument("--backend", default="reference",
                   help="comma list: reference, native, torch, entry-point names, package.module:object, or auto")
    p.add_argument("--out", default=None, help="report directory (default reports/<tier>)")
    p.add_argument("--resume", action="store_true", help="keep the CSV and skip (case, backend) pairs already in it")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes (each pinned to one GPU; CPU without GPUs); every case runs in a worker, "
                        "so a crash or hang costs that case alone")
    p.add_argument("--case-timeout", type=float, default=None, metavar="SECONDS",
                   help="kill a (case, backend) running longer and record error/timeout (default "
                        "harness.pool.DEFAULT_CASE_TIMEOUT; 0 = no limit)")
    p.add_argument("--import-timeout", type=float, default=None, metavar="SECONDS",
                   help="bound on importing each backend in its process and on its prepare(), not charged to any "
                        "case (default harness.sandbox.DEFAULT_IMPORT_TIMEOUT; 0 = no limit)")
    p.add_argument("--force", action="store_true", help="replace a previous report in --out (a fresh run refuses it)")
    p.add_argument("--resume-any", action="store_true",
                   help="with --resume: continue a report made with another selection (tier, cases file, filter, "
                        "shard, golden device, backends), which --resume refuses")
    _golden(p)
    _accept(p)
    p.add_argument("--keep-outputs", action="store_true",
                   help="save each candidate's output tensors as DIR/outputs/<case>/<backend>.pt (for diff --bitwise)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("list", help="list the selected case ids (or --backends)")
    _selection(p)
    p.add_argument("--backend", default=None, help="also show which of these backends support each case")
    p.add_argument("--backends", action="store_true", help="list the registered backends")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("repro", help="re-run one case by id and print every row in full")
    p.add_argument("case_id")
    p.add_argument("--backend", default="reference", help="backend name or spec (comma list allowed)")
    p.add_argument("--device", default=None)
    p.add_argument("--inputs", default=None, help="inputs.pt saved by a failing run (default: regenerate)")
    _golden(p)
    p.add_argument("--out", default=None, help="save a failure directory here")
    p.add_argument("--case-timeout", type=float, default=0, metavar="SECONDS",
                   help="kill the backend's process after this long and record error/timeout (default 0: no limit)")
    p.set_defaults(func=cmd_repro)

    p = sub.add_parser("report", help="summary table and plots of a report directory")
    p.add_argument("dir")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--plots-dir", default=None, help="where to write PNGs (default DIR/plots)")
    p.add_argument("--show", type=int, default=20, help="failing cases to list")
    p.add_argument("--quiet", action="store_true", help="print no summary (run printed it), only the files written")
    p.add_argument("--format", default="html,md,junit", metavar="LIST",
                   help="files written into DIR: html (report.html), md (summary.md), junit (junit.xml), a comma "
                        "list, or none (default: all three)")
    _accept(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("diff", help="regressions from OLD to NEW (exit 1 if any)")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--sqnr-db", type=float, default=0.5, help="SQNR drop counted as a regression (dB)")
    p.add_argument("--pair", default=None, metavar="A:B",
                   help="compare backend A's rows in OLD with backend B's in NEW case by case (OLD and NEW may be "
                        "one report); exit 1 if their verdicts or mismatch counts differ")
    p.add_argument("--bitwise", action="store_true",
                   help="with --pair: compare the saved output bytes (run --keep-outputs) and list every case whose "
                        "bytes differ, with counts of differing elements per tensor")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("merge", help="join shard reports into OUT")
    p.add_argument("out")
    p.add_argument("shards", nargs="+")
    p.add_argument("--prefer", choices=("first", "last"), default=None,
                   help="a (case_id, backend) pair in several shards keeps the rows of the first or last of them "
                        "(without it such a pair is refused)")
    p.add_argument("--allow-incomplete", action="store_true",
                   help="merge shards that are not every --shard i/n of one selection, or runs that did not finish")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("bench", help="run benchmarks/bench_*.py scripts (args after -- are passed through)")
    p.add_argument("names", nargs="*", help="script names, e.g. bench_native or native (default: all)")
    p.add_argument("--list", action="store_true", help="list the scripts that would run")
    p.add_argument("--bench-dir", default=str(BENCH_DIR))
    p.set_defaults(func=cmd_bench, bench_args=[])
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    if argv[:1] == ["run"] and not {"-h", "--help"} & set(argv):
        from .forkserver import start  # noqa: PLC0415 - before build_parser imports torch

        start()  # the workers' forkserver imports torch and the harness meanwhile (harness/forkserver.py)
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        args.bench_args = passthrough
    elif passthrough:
        print(f"unexpected arguments after --: {passthrough}", file=sys.stderr)
        return 2
    from .report import ReportError  # noqa: PLC0415

    try:
        return int(args.func(args) or 0)
    except (UsageError, ReportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; rows of finished cases are in the report (use --resume to continue)", file=sys.stderr)
        return 130
    except Terminated as e:
        print(f"terminated ({e.label}); rows of finished cases are in the report (use --resume to continue)",
              file=sys.stderr)
        return 128 + e.signum


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
