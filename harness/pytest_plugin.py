"""pytest plugin: collect cases/*.toml directly, one test item per case, rows into a CSV report.

Source: docs/design.md §5 (under pytest-xdist, workers attach results to the test report and the
controller writes the files) and the issue's plugin requirements.

    pytest cases/smoke.toml --backend native -n 4 --report-dir reports/pytest

Options: `--backend` (name or spec, default reference; one that cannot be loaded is a usage error),
`--report-dir` (write results.csv and run_meta.json there, replacing a previous report; failing cases
also save inputs and a repro.sh), `--harness-device`, `--harness-golden-device` (`same`: the golden
runs on the candidate's device, or `cpu`), `--case-timeout` (seconds per case through pytest-timeout,
default harness.pool.DEFAULT_CASE_TIMEOUT; 0 = none; an explicit `--timeout` wins). Unsupported ->
skip with its reason; a mismatch -> failure whose message locates the first mismatch and ends with a
repro command. A timeout becomes an `error` row `timeout: ...`; a case that kills its xdist worker
(signal, `os._exit`) an `error` row `crash: ...` written by the controller. pytest-timeout's default
`signal` method interrupts Python code; for a kernel hung in C use `--timeout-method=thread` under
xdist (the worker is killed and the case recorded as a crash). Without xdist a case that kills its
process ends the pytest run with it: run untrusted kernels with `-n` (or `python -m harness run`).
Each xdist worker is pinned to GPU `worker_index % device_count` when CUDA is present.
"""

from __future__ import annotations

import json
import os
import re

import pytest

ROWS_PROPERTY = "harness_rows"
# Seconds per case (harness.pool.DEFAULT_CASE_TIMEOUT, not imported here to keep pebble out of collection).
DEFAULT_CASE_TIMEOUT = 900.0
# harness.golden.GOLDEN_DEVICES / DEFAULT_GOLDEN (not imported here: that module imports torch).
GOLDEN_DEVICES, DEFAULT_GOLDEN = ("auto", "same", "cpu"), "auto"


def pytest_addoption(parser):
    group = parser.getgroup("numerics-harness", "low-precision numerics harness (cases/*.toml)")
    group.addoption("--backend", action="store", default="reference",
                    help="backend for cases/*.toml items: reference, native, torch, an entry-point name or "
                         "package.module:object (default: reference)")
    group.addoption("--report-dir", action="store", default=None,
                    help="write results.csv + run_meta.json for the collected cases into this directory")
    group.addoption("--harness-device", action="store", default=None,
                    help="device for the candidate backend (default: the pinned GPU, else cpu)")
    group.addoption("--harness-golden-device", action="store", default=DEFAULT_GOLDEN, choices=GOLDEN_DEVICES,
                    help="where the golden reference runs: auto (default: the cpu for small cases, the "
                         "candidate's device for large ones), same (the candidate's device) or cpu "
                         "(harness/golden.py GOLDEN_DEVICES)")
    group.addoption("--case-timeout", action="store", type=float, default=DEFAULT_CASE_TIMEOUT,
                    help="seconds per case through pytest-timeout, recorded as error/timeout (default "
                         f"{DEFAULT_CASE_TIMEOUT:g}; 0 = none; an explicit --timeout wins)")


def _worker_id(config) -> str:
    wi = getattr(config, "workerinput", None)
    return wi.get("workerid", "gw0") if wi else "main"


def _pin_gpu(worker_id: str) -> str:
    """Pin this xdist worker to GPU index % count; returns the device string to use.

    Preferred: CUDA_VISIBLE_DEVICES = that one GPU, set before CUDA starts (torch counts GPUs through
    NVML without starting CUDA). If CUDA already started in this process, the variable would be
    ignored, so the worker uses torch.cuda.set_device on the full list instead.
    """
    import torch  # noqa: PLC0415

    n = torch.cuda.device_count()  # NVML-based before CUDA initialisation: does not start CUDA
    if n == 0:
        return "cpu"
    digits = re.sub(r"\D", "", worker_id)
    idx = (int(digits) if digits else 0) % n
    if not torch.cuda.is_initialized():
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = [g.strip() for g in before.split(",") if g.strip()] if before else [str(i) for i in range(n)]
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[idx % len(visible)]
        if torch.cuda.device_count() == 1:  # the variable took effect
            return "cuda:0"
        if before is None:  # too late for this process: undo and fall through
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    torch.cuda.set_device(idx)
    return f"cuda:{idx}"


class _Recorder:
    """Controller side: writes the rows each test report carries (xdist or not), and an error row for
    a case whose xdist worker crashed (that report carries no rows: xdist makes it, `when` "???")."""

    def __init__(self, writer, backend_name: str):
        self.writer = writer
        self.backend_name = backend_name

    def pytest_runtest_logreport(self, report):
        if report.when == "???":
            self._crashed(report)
            return
        if report.when != "call":  # the teardown report carries the same user_properties again
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == ROWS_PROPERTY:
                self.writer.write(json.loads(value))

    def _crashed(self, report) -> None:
        from .cases import Case  # noqa: PLC0415
        from .rows import pair_base, status_row  # noqa: PLC0415

        case_id = report.nodeid.split("::", 1)[-1]
        try:
            case = Case.from_id(case_id)
        except Exception:  # noqa: BLE001 - not a case item: nothing to record
            return
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "?")
        base = pair_base(case, self.backend_name, "", str(worker))
        self.writer.write([status_row(base, "error", f"crash: xdist worker {worker} died while running this case "
                                                     f"({report.longrepr})")])

    def pytest_unconfigure(self, config):
        self.writer.close()


def pytest_unconfigure(config):
    backend = getattr(config, "_harness_backend", None)
    if backend is not None:
        backend.kill()


def pytest_configure(config):
    from .sandbox import zygote  # noqa: PLC0415

    # The backend's process forks from this process's zygote: fork it before CUDA starts here (_pin_gpu asks the
    # driver; a process forked after that cannot use CUDA). The zygote holds one idle process until the end.
    zygote()
    worker = _worker_id(config)
    config._harness_worker = worker
    device = config.getoption("--harness-device")
    if device is None and worker != "main":
        device = _pin_gpu(worker)
    config._harness_device = device
    config._harness_backend = None
    report_dir = config.getoption("--report-dir")
    if report_dir or config.getoption("--backend") != "reference":
        _backend(config)  # an unknown or failing backend is one usage error, before any item runs
    if report_dir and worker == "main":
        backend = _backend(config)
        from .meta import run_meta  # noqa: PLC0415
        from .report import ReportWriter  # noqa: PLC0415

        opts = {"runner": "pytest", "backend": config.getoption("--backend"), "args": list(config.args),
                "xdist_workers": getattr(config.option, "numprocesses", None),
                "golden_device": config.getoption("--harness-golden-device")}
        # NOTE: unlike `python -m harness run`, pytest replaces a previous report in --report-dir (force).
        from .report import ReportError  # noqa: PLC0415

        try:
            writer = ReportWriter(report_dir, run_meta(opts, backends=[backend]), force=True)
        except ReportError as e:  # e.g. another run holds the directory
            raise pytest.UsageError(f"--report-dir: {e}") from None
        config.pluginmanager.register(_Recorder(writer, backend.name), "harness-recorder")


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".toml" and file_path.parent.name == "cases":
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    """A cases/*.toml file: one CaseItem per generated case."""

    def collect(self):
        from .cases import load_cases  # noqa: PLC0415

        timeout = self.config.getoption("--case-timeout")
        mark = None
        if timeout and self.config.pluginmanager.hasplugin("timeout") and self.config.getoption("timeout") is None:
            mark = pytest.mark.timeout(timeout)
        for case in load_cases(str(self.path)):
            item = CaseItem.from_parent(self, name=case.id, case=case)
            if mark is not None:
                item.add_marker(mark)
            yield item


class CaseFailure(Exception):
    """A case failed or errored; the message is the whole report (no traceback)."""


def _backend(config):
    """The --backend as a harness.sandbox.BackendProcess: its code runs in a process of its own (forked from this
    worker's zygote), never in the process that draws inputs, computes the golden and compares."""
    if config._harness_backend is None:
        from .sandbox import BackendFailed, BackendProcess  # noqa: PLC0415

        spec = config.getoption("--backend")
        proc = BackendProcess(spec, _device(config))
        try:
            proc.start()
        except BackendFailed as e:
            raise pytest.UsageError(f"--backend {spec!r} could not be loaded: {e}") from None
        config._harness_backend = proc
    return config._harness_backend


def _device(config) -> str:
    if config._harness_device:
        return config._harness_device
    from .backends import default_device  # noqa: PLC0415

    return default_device()


def failure_message(case, backend_spec: str, rows, device: str | None = None) -> str:
    """Failure text: each failing/erroring row with its located first mismatch, then the repro command."""
    from .artefacts import repro_command  # noqa: PLC0415
    from .classify import EXAMPLES_SHOWN, format_examples  # noqa: PLC0415
    from .rows import format_first_mismatch  # noqa: PLC0415

    sev = rows[0].get("severity") if rows else ""
    conv = rows[0].get("matches_convention") if rows else ""
    lines = [f"case {case.id} [{rows[0]['backend'] if rows else backend_spec}] failed"
             + (f"; severity {sev}" if sev else "") + (f" (bit-exact under convention {conv})" if conv else "")]
    for r in rows:
        if r["status"] not in ("fail", "error"):
            continue
        lines.append(f"  {r['status']}: {r['tensor']}: {r.get('reason', '')}")
        fm = r.get("first_mismatch")
        if fm:
            lines.append("    first mismatch:")
            lines.append(format_first_mismatch(fm, " " * 6))
        shown = format_examples(r.get("mismatch_examples"), indent=" " * 6)
        if shown:
            lines.append(f"    mismatch examples (up to {EXAMPLES_SHOWN} per class):")
            lines += shown
    lines.append(f"repro: {repro_command(case.id, backend_spec, device=device)}")
    return "\n".join(lines)


class CaseItem(pytest.Item):
    """One case run against the --backend; rows are attached to the report before any verdict."""

    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self):
        from .runner import as_jsonable, case_verdict, run_case, save_failure  # noqa: PLC0415

        backend = _backend(self.config)
        device = _device(self.config)
        try:
            rows = run_case(self.case, backend, device, worker=self.config._harness_worker,
                            golden=self.config.getoption("--harness-golden-device"),
                            timeout=self.config.getoption("--case-timeout") or None)
        except pytest.fail.Exception as e:  # pytest-timeout's signal method ends a slow case with Failed
            if "Timeout" in str(e):
                self._record_error(backend, device, f"timeout: {' '.join(str(e).split())[:200]}")
            raise
        # Recorded before any assertion (docs/design.md §5): the controller writes them.
        self.user_properties.append((ROWS_PROPERTY, json.dumps(as_jsonable(rows))))
        verdict = case_verdict(rows)
        spec = backend.spec
        report_dir = self.config.getoption("--report-dir")
        if verdict in ("fail", "error"):
            if report_dir:
                save_failure(report_dir, self.case, spec, rows)
            raise CaseFailure(failure_message(self.case, spec, rows))
        if verdict == "skip":
            pytest.skip("; ".join(r["reason"] for r in rows if r["status"] == "skip"))

    def _record_error(self, backend, device, reason: str) -> None:
        from .rows import as_jsonable, pair_base, status_row  # noqa: PLC0415

        row = status_row(pair_base(self.case, backend.name, str(device), self.config._harness_worker), "error", reason)
        self.user_properties.append((ROWS_PROPERTY, json.dumps(as_jsonable([row]))))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"case {self.case.id}"
