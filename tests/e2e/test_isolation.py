"""Isolation: a backend's code runs in its own process, so nothing it does there changes a verdict, loses a row,
outlives the run or runs in the judge (issue #38; docs/design.md §9).

Each test runs `python -m harness run` as a user would (four share one run: `shared_run`), with backends from
tests/misbehaving.py that patch the judge in their process, lie through a tensor subclass, raise BaseExceptions,
return what the contract does not, start processes, write junk into their channel, or take a name that is not theirs,
and asserts the exact rows, exit code and message.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from harness import report
from harness.cases import parse_cases
from tests import misbehaving
from tests.e2e.test_faults import ROOT, finish, harness_run
from tests.slow_import_backend import IMPORT_LOG_ENV, SEGFAULT_ENV, SLOW_IMPORT_ENV

CASES = """
[[grid]]
scheme = "fp8_current"
element = "e4m3"
orientation = "rowwise"
in_dtype = "float32"
shape = [[8, 32], [24, 32], [40, 32]]
distribution = "normal"
seed = 3
"""
N_CASES = len(parse_cases(CASES, "c.toml"))
MARK = "HARNESS_TEST_RUN_MARK"


def tagged(mark: str) -> list[int]:
    """Live processes whose environment carries MARK=mark (every process a run starts inherits it)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    stat = (d / "stat").read_text()
                    if stat[stat.rindex(")") + 2] != "Z":
                        found.append(int(d.name))
            except OSError:
                continue
    return found


def run(tmp_path: Path, backends: str, *extra: str, cases: str = CASES, **env: str):
    """(rc, stdout, stderr, report dir) of a run; afterwards no process of it may be alive, whatever session it
    moved to (killed here if one is, so that none leaks into the suite)."""
    out = tmp_path / "rep"
    mark = uuid.uuid4().hex
    rc, stdout, err = finish(harness_run(tmp_path, cases, out, "--backend", backends, *extra, **{MARK: mark}, **env))
    deadline = time.monotonic() + 10
    while (left := tagged(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the run outlived it: {left}"
    return rc, stdout, err, out


def pair_rows(out: Path, backend: str):
    df = report.read_results(out)
    return df[df["backend"] == backend]


# The misbehaving backends that need only CASES and a failing verdict share one sweep, with the reference beside
# them (each test below asserts its own backend's rows and the reference's; one that disturbed another backend's
# verdict would show there too). Under xdist each worker that runs one of these tests runs the sweep once.
SHARED = ("patcher", "liar", "keyboard_interrupt", "generator_exit", "custom_stop", "garbage")


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("shared"), ",".join(f"tests.misbehaving:{n}" for n in SHARED) + ",reference",
               "--workers", "2")


@pytest.mark.slow
def test_a_backend_that_patches_the_judge_in_its_process_changes_no_verdict(shared_run):
    # patcher replaces harness.compare.compare_quantized, harness.verdict.judge and reference.quantize in its own
    # process, then returns wrong codes; the reference runs in the same sweep and must still pass everywhere.
    rc, _, err, out = shared_run
    assert rc == 1, err
    bad = pair_rows(out, "patcher")
    data = bad[bad["tensor"] == "rowwise_data"]
    assert len(data) == N_CASES and (data["status"] == "fail").all()
    assert (data["n_mismatch"] > 0).all() and set(bad["severity"]) == {"broken"}
    ref = pair_rows(out, "reference")
    assert len(set(ref["case_id"])) == N_CASES and ref["status"].isin(["pass", "info"]).all()


@pytest.mark.slow
def test_wrong_bytes_in_a_tensor_subclass_that_says_equal_fail(shared_run):
    rc, _, err, out = shared_run
    assert rc == 1, err
    data = pair_rows(out, "liar")
    data = data[data["tensor"] == "rowwise_data"]
    assert len(data) == N_CASES and (data["status"] == "fail").all() and (data["n_mismatch"] > 0).all()


@pytest.mark.slow
def test_every_base_exception_is_that_pairs_error_row_and_the_sweep_finishes(shared_run):
    rc, _, err, out = shared_run
    assert rc == 1, err  # not 130: only a signal to this process stops the sweep
    expected = {"keyboard_interrupt": "KeyboardInterrupt: from the kernel (at misbehaving.py:",
                "generator_exit": "GeneratorExit: from the kernel (at misbehaving.py:",
                "custom_stop": "CustomStop: from the kernel (at misbehaving.py:"}
    for name, prefix in expected.items():
        rows = pair_rows(out, name)
        assert len(rows) == N_CASES and (rows["status"] == "error").all(), rows[["status", "reason"]]
        assert rows["reason"].str.startswith(prefix).all(), rows["reason"].tolist()
    assert pair_rows(out, "reference")["status"].isin(["pass", "info"]).all()


@pytest.mark.slow
def test_outputs_of_the_wrong_type_or_dtype_are_error_rows_naming_what_came_back(tmp_path):
    expected = {
        "returns_none": "returns_none: quantize returned None; the contract expects a reference.types.QuantizedTensor "
                        "(docs/adapters.md §2)",
        "returns_numpy": "returns_numpy: quantize returned numpy.ndarray (8, 32) uint8; the contract expects a "
                         "reference.types.QuantizedTensor (docs/adapters.md §2)",
        "returns_int8": "returns_int8: quantize returned rowwise_data of dtype int8; the contract expects uint8 "
                        "(docs/adapters.md §2)",
        "returns_numpy_scale": "returns_numpy_scale: quantize returned a QuantizedTensor whose rowwise_scale is "
                               "numpy.ndarray (1,) float32; the contract expects a torch.Tensor",
    }
    one = CASES.replace("[[8, 32], [24, 32], [40, 32]]", "[[8, 32]]")
    rc, _, err, out = run(tmp_path, ",".join(f"tests.misbehaving:{n}" for n in expected), cases=one)
    assert rc == 1, err
    for name, reason in expected.items():
        (row,) = pair_rows(out, name).itertuples(index=False)
        assert (row.status, row.reason) == ("error", reason)
        assert "harness/" not in row.reason and ".py:" not in row.reason


@pytest.mark.slow
def test_processes_a_backend_starts_end_with_the_run(tmp_path):
    # spawner starts `sleep 300` in a session of its own and `sleep 301` in its group on every call; `run` fails
    # if any process carrying the run's environment is alive after it.
    rc, _, err, out = run(tmp_path, "tests.misbehaving:spawner", "--workers", "2")
    assert rc == 0, err
    assert pair_rows(out, "spawner")["status"].isin(["pass", "info"]).all()


@pytest.mark.slow
def test_junk_written_into_the_judges_channel_is_an_error_row(shared_run):
    rc, _, err, out = shared_run
    assert rc == 1, err
    rows = pair_rows(out, "garbage")
    assert len(rows) == N_CASES and (rows["status"] == "error").all()
    assert rows["reason"].str.startswith("its backend process sent a malformed reply (").all(), rows["reason"].tolist()
    assert rows["reason"].str.endswith("; it was killed").all()
    assert pair_rows(out, "reference")["status"].isin(["pass", "info"]).all()


@pytest.mark.parametrize("backends, message", [
    ("tests.misbehaving:same_name_a,tests.misbehaving:same_name_b",
     "error: backends 'tests.misbehaving:same_name_a' and 'tests.misbehaving:same_name_b' are both named 'twin': "
     "the report keys rows by backend name, so one would hide the other; rename one"),
    ("tests.misbehaving:named_reference",
     "error: backend 'tests.misbehaving:named_reference' is named 'reference', the name of the built-in backend; "
     "rename it"),
])
def test_two_backends_with_one_name_or_a_builtins_name_are_refused(tmp_path, backends, message):
    rc, stdout, err, out = run(tmp_path, backends)
    assert rc == 2 and err.strip().splitlines() == [message], err
    assert not (out / "results.csv").exists()


@pytest.mark.slow
def test_a_slow_import_is_not_charged_to_any_case(tmp_path):
    rc, _, err, out = run(tmp_path, "tests.slow_import_backend:slow", "--case-timeout", "1.5", "--workers", "2",
                          **{SLOW_IMPORT_ENV: "2.5"})
    assert rc == 0, err
    rows = pair_rows(out, "slow_import")
    assert len(set(rows["case_id"])) == N_CASES and rows["status"].isin(["pass", "info"]).all()


def test_an_import_past_import_timeout_is_one_line_and_exit_2(tmp_path):
    rc, _, err, out = run(tmp_path, "tests.slow_import_backend:slow", "--import-timeout", "1",
                          **{SLOW_IMPORT_ENV: "30"})
    assert rc == 2, err
    assert err.strip().splitlines() == [
        "error: --backend 'tests.slow_import_backend:slow' could not be loaded: no answer after 1 s (importing "
        "backend 'tests.slow_import_backend:slow'); its backend process was killed"]


@pytest.mark.parametrize("flag, value, message", [
    ("--case-timeout", "nan", "error: --case-timeout nan is invalid: expected a finite number of seconds >= 0 "
                              "(0 = no limit)"),
    ("--case-timeout", "inf", "error: --case-timeout inf is invalid: expected a finite number of seconds >= 0 "
                              "(0 = no limit)"),
    ("--import-timeout", "-1", "error: --import-timeout -1 is invalid: expected a finite number of seconds >= 0 "
                               "(0 = no limit)"),
])
def test_timeouts_must_be_finite_and_non_negative(tmp_path, flag, value, message):
    rc, _, err, _ = run(tmp_path, "reference", flag, value)
    assert rc == 2 and err.strip().splitlines() == [message], err


def test_workers_are_capped_with_a_clear_message(tmp_path):
    rc, _, err, _ = run(tmp_path, "reference", "--workers", "100000")
    assert rc == 2, err
    assert err.strip().startswith("error: --workers 100000 is invalid: expected 1 to 256 worker processes"), err


@pytest.mark.slow
def test_sighup_stops_like_sigterm_with_the_report_closed_and_no_leftovers(tmp_path, request):
    from tests.e2e.test_faults import KILL_CASES, start  # noqa: PLC0415

    f = tmp_path / "cases" / "k.toml"
    f.parent.mkdir()
    f.write_text(KILL_CASES)
    # TMPDIR short: the forkserver's AF_UNIX socket lives under it (at most 107 bytes), and tmp_path is too long for
    # that once pytest's base directory counter has three digits (/tmp/pytest-of-root/pytest-106/popen-gw1/...).
    tmp = Path(tempfile.mkdtemp(prefix="hup-"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    out = tmp_path / "rep"
    mark = uuid.uuid4().hex
    proc = start(["-m", "harness", "run", "--cases", str(f), "--device", "cpu", "--out", str(out), "--no-progress",
                  "--backend", "tests.misbehaving:nap", "--workers", "2"], ROOT,
                 **{MARK: mark, "TMPDIR": str(tmp), misbehaving.Nap.NAP_ENV: "0.4"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "results.csv").exists() and len((out / "results.csv").read_text().splitlines()) > 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGHUP)
    rc, _, err = finish(proc)
    assert rc == 129, err
    assert "terminated (SIGHUP)" in err and "--resume" in err
    df = report.read_results(out, checked=True)
    assert 0 < len(set(df["case_id"])) < len(parse_cases(KILL_CASES, "k.toml"))
    assert not [p for p in tmp.iterdir() if p.name.startswith("harness-pool-")]
    time.sleep(0.5)
    assert not tagged(mark)


ADAPTER = """
import reference


class Backend:
    name = "filed"

    def supports(self, op, config, device):
        return op == "quantize", ""

    def quantize(self, x, config, **kw):
        return reference.quantize(x, config, **kw)  # {version}


backend = Backend()
"""


@pytest.mark.slow
def test_resume_with_a_changed_adapter_file_is_refused_with_what_changed(tmp_path):
    # The backend is given as a file path (not on the import path); editing it between runs changes its code
    # digest in run_meta.json's selection, and --resume refuses to mix the two versions' rows in one report.
    f = tmp_path / "torchao.py"  # named after a library: loaded under a private name, it shadows nothing
    f.write_text(ADAPTER.format(version="v1"))
    spec = f"{f}:backend"
    rc, _, err, out = run(tmp_path, spec)
    assert rc == 0, err
    f.write_text(ADAPTER.format(version="v2"))
    rc, _, err, _ = run(tmp_path, spec, "--resume")
    assert rc == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and f"backend {spec!r} at code sha256 " in line and "this run has" in line, line
    rc, _, err, _ = run(tmp_path, spec, "--resume", "--resume-any")
    assert rc == 0, err


@pytest.mark.slow
def test_only_backend_processes_import_a_backend(tmp_path):
    # The module logs "pid sid" of every process that imports it: each must be a backend process (the leader of
    # a session of its own), never the command's process (`finish` knows its pid) nor a judge (which share the
    # command's session).
    log = tmp_path / "imports.log"
    out = tmp_path / "rep"
    f = tmp_path / "cases" / "c.toml"
    f.parent.mkdir()
    f.write_text(CASES)
    from tests.e2e.test_faults import start  # noqa: PLC0415

    proc = start(["-m", "harness", "run", "--cases", str(f), "--device", "cpu", "--out", str(out), "--no-progress",
                  "--backend", "tests.slow_import_backend:slow", "--workers", "2"], ROOT,
                 **{IMPORT_LOG_ENV: str(log)})
    rc, _, err = finish(proc)
    assert rc == 0, err
    imports = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert len(imports) >= 2  # the command's backend process, and at least one worker's
    assert all(pid == sid and pid != proc.pid and sid != proc.pid for pid, sid in imports), (proc.pid, imports)


def test_a_backend_that_segfaults_at_import_is_one_line_and_exit_2(tmp_path):
    rc, stdout, err, out = run(tmp_path, "tests.slow_import_backend:slow", **{SEGFAULT_ENV: "1"})
    assert rc == 2 and err.strip().splitlines() == [
        "error: --backend 'tests.slow_import_backend:slow' could not be loaded: crash: signal SIGSEGV (-11)"], err
    assert not (out / "results.csv").exists()


@pytest.mark.slow
def test_hostile_text_from_a_backend_is_stored_and_shown_escaped(tmp_path):
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    one = CASES.replace("[[8, 32], [24, 32], [40, 32]]", "[[8, 32]]")
    rc, _, err, out = run(tmp_path, "tests.misbehaving:hostile,tests.misbehaving:hostile_skip", cases=one)
    assert rc == 1, err
    escaped = '=HYPERLINK("http://x")\\x00\\x1b[2J\\x1b[31mred\\ud800 end'
    (row,) = pair_rows(out, "hostile").itertuples(index=False)
    assert row.status == "error" and row.reason.startswith(f"RuntimeError: {escaped} (at misbehaving.py:"), row.reason
    (row,) = pair_rows(out, "hostile_skip").itertuples(index=False)
    assert (row.status, row.reason) == ("skip", "'" + escaped)  # a formula cell is quoted
    raw = (out / "results.csv").read_bytes()
    assert b"\x00" not in raw and b"\x1b" not in raw and b",=HYPERLINK" not in raw
    shown = subprocess.run([sys.executable, "-m", "harness", "report", str(out), "--no-plots"], cwd=ROOT,
                           capture_output=True, text=True, errors="strict")
    assert shown.returncode == 0 and "\x1b" not in shown.stdout + shown.stderr
