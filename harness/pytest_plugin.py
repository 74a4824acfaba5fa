"""pytest plugin: collect cases/*.toml directly, one test item per case, rows into a CSV report.

Source: DESIGN.md §5 (under pytest-xdist, workers attach results to the test report and the
controller writes the files) and the issue's plugin requirements.

    pytest cases/smoke.toml --backend native -n 4 --report-dir reports/pytest

Options: `--backend` (name or spec, default reference), `--report-dir` (write results.csv and
run_meta.json there; failing cases also save inputs and a repro.sh), `--harness-device`,
`--harness-golden-device` (`same`: the golden runs on the candidate's device, or `cpu`).
Unsupported -> skip with its reason; a mismatch -> failure whose message locates the first
mismatch and ends with a repro command. Each xdist worker is pinned to GPU
`worker_index % device_count` when CUDA is present.
"""

from __future__ import annotations

import json
import os
import re

import pytest

ROWS_PROPERTY = "harness_rows"


def pytest_addoption(parser):
    group = parser.getgroup("numerics-harness", "low-precision numerics harness (cases/*.toml)")
    group.addoption("--backend", action="store", default="reference",
                    help="backend for cases/*.toml items: reference, native, torch, an entry-point name or "
                         "package.module:object (default: reference)")
    group.addoption("--report-dir", action="store", default=None,
                    help="write results.csv + run_meta.json for the collected cases into this directory")
    group.addoption("--harness-device", action="store", default=None,
                    help="device for the candidate backend (default: the pinned GPU, else cpu)")
    group.addoption("--harness-golden-device", action="store", default="same", choices=("same", "cpu"),
                    help="where the golden reference runs: the candidate's device (default) or the cpu "
                         "(harness/runner.py GOLDEN_DEVICES)")


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
    """Controller side: writes the rows each test report carries (xdist or not)."""

    def __init__(self, writer):
        self.writer = writer

    def pytest_runtest_logreport(self, report):
        if report.when != "call":  # the teardown report carries the same user_properties again
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == ROWS_PROPERTY:
                self.writer.write(json.loads(value))

    def pytest_unconfigure(self, config):
        self.writer.close()


def pytest_configure(config):
    worker = _worker_id(config)
    config._harness_worker = worker
    device = config.getoption("--harness-device")
    if device is None and worker != "main":
        device = _pin_gpu(worker)
    config._harness_device = device
    config._harness_backend = None
    report_dir = config.getoption("--report-dir")
    if report_dir and worker == "main":
        from .meta import run_meta  # noqa: PLC0415
        from .report import ReportWriter  # noqa: PLC0415

        opts = {"runner": "pytest", "backend": config.getoption("--backend"), "args": list(config.args),
                "xdist_workers": getattr(config.option, "numprocesses", None),
                "golden_device": config.getoption("--harness-golden-device")}
        config.pluginmanager.register(_Recorder(ReportWriter(report_dir, run_meta(opts))), "harness-recorder")


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".toml" and file_path.parent.name == "cases":
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseFile(pytest.File):
    """A cases/*.toml file: one CaseItem per generated case."""

    def collect(self):
        from .cases import load_cases  # noqa: PLC0415

        for case in load_cases(str(self.path)):
            yield CaseItem.from_parent(self, name=case.id, case=case)


class CaseFailure(Exception):
    """A case failed or errored; the message is the whole report (no traceback)."""


def _backend(config):
    if config._harness_backend is None:
        from .backends import get_backend  # noqa: PLC0415

        config._harness_backend = get_backend(config.getoption("--backend"))
    return config._harness_backend


def _device(config) -> str:
    if config._harness_device:
        return config._harness_device
    from .backends import default_device  # noqa: PLC0415

    return default_device()


def failure_message(case, backend_spec: str, rows, device: str | None = None) -> str:
    """Failure text: each failing/erroring row with its located first mismatch, then the repro command."""
    from .runner import format_first_mismatch, repro_command  # noqa: PLC0415

    lines = [f"case {case.id} [{rows[0]['backend'] if rows else backend_spec}] failed"]
    for r in rows:
        if r["status"] not in ("fail", "error"):
            continue
        lines.append(f"  {r['status']}: {r['tensor']}: {r.get('reason', '')}")
        fm = r.get("first_mismatch")
        if fm:
            lines.append("    first mismatch:")
            lines.append(format_first_mismatch(fm, " " * 6))
    lines.append(f"repro: {repro_command(case.id, backend_spec, device=device)}")
    return "\n".join(lines)


class CaseItem(pytest.Item):
    """One case run against the --backend; rows are attached to the report before any verdict."""

    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def runtest(self):
        from .backends import backend_spec  # noqa: PLC0415
        from .runner import as_jsonable, case_verdict, run_case, save_failure  # noqa: PLC0415

        backend = _backend(self.config)
        device = _device(self.config)
        rows = run_case(self.case, backend, device, worker=self.config._harness_worker,
                        golden=self.config.getoption("--harness-golden-device"))
        # Recorded before any assertion (DESIGN.md §5): the controller writes them.
        self.user_properties.append((ROWS_PROPERTY, json.dumps(as_jsonable(rows))))
        verdict = case_verdict(rows)
        spec = backend_spec(backend)
        report_dir = self.config.getoption("--report-dir")
        if verdict in ("fail", "error"):
            if report_dir:
                save_failure(report_dir, self.case, spec, rows)
            raise CaseFailure(failure_message(self.case, spec, rows))
        if verdict == "skip":
            pytest.skip("; ".join(r["reason"] for r in rows if r["status"] == "skip"))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"case {self.case.id}"
