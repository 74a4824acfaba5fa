"""Fault injection: sweeps survive backends that raise, exit, segfault, hang, mutate or flip numerics state.

Every selected (case, backend) gets exactly its rows, once; nothing keeps running afterwards; exit
codes say what happened. Each CLI run gets its own session (start_new_session), so its processes are
found by session id in /proc after it ends. The misbehaving backends are in tests/misbehaving.py.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import report
from harness.cases import parse_cases
from tests import misbehaving

ROOT = Path(__file__).resolve().parents[2]
CASE_TIMEOUT = 15  # seconds: the `hang` case's limit; every other case takes well under 2 s, 10 on a loaded host
RUN_LIMIT = 240  # seconds: no run of this suite may take longer (then it is killed and the test fails)
TIMING = ["wall_ms", "inputs_ms", "golden_ms", "check_ms", "worker", "device"]

FAULT_CASES = """
[[grid]]
scheme = "fp8_current"
element = "e4m3"
orientation = "rowwise"
in_dtype = "float32"
shape = [{shapes}]
distribution = "normal"
seed = 1
""".format(shapes=", ".join(f"[{m}, 32]" for m in [*misbehaving.FAULTS, 144]))

KILL_CASES = """
[[grid]]
scheme = "fp8_current"
element = ["e4m3", "e5m2"]
orientation = "rowwise"
in_dtype = "float32"
shape = [[8, 32], [24, 32], [40, 32], [56, 32], [72, 32], [88, 32], [104, 32], [120, 32]]
distribution = ["normal", "uniform"]
seed = 2
"""


def _env(**extra: str) -> dict:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["NUMERICS_HARNESS_PROGRESS"] = "0"
    return env


def _session(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid`."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(d.name))
    return pids


def assert_no_orphans(sid: int, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid in left:  # do not leak them into the rest of the suite
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the run still alive: {left}"


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT at its default, as for a command typed into a terminal. A test run started
    in the background of a non-interactive shell (`.ci/run &`) has SIGINT ignored, the child would inherit that,
    and Python then leaves Ctrl-C ignored: the run finished with rc 0 instead of stopping with 130."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=_env(**env), start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"run took longer than {RUN_LIMIT} s: {proc.args}")
    assert_no_orphans(proc.pid)
    return proc.returncode, out, err


def harness_run(tmp_path: Path, cases: str, out: Path, *extra: str, **env: str) -> subprocess.Popen:
    f = tmp_path / "cases" / "faults.toml"
    f.parent.mkdir(exist_ok=True)
    f.write_text(cases)
    return start(["-m", "harness", "run", "--cases", str(f), "--device", "cpu", "--out", str(out), "--no-progress",
                  *extra], ROOT, **env)


def check_fault_rows(df: pd.DataFrame, case_ids: list[str], backends: list[str]) -> None:
    """Every (case, backend) has exactly its rows, once: a fault's one error row, else the reference's tensors."""
    assert not df.duplicated(["case_id", "backend", "tensor"]).any(), "duplicate rows"
    assert set(zip(df["case_id"], df["backend"], strict=True)) == {(c, b) for c in case_ids for b in backends}
    cases = {c.id: c for c in parse_cases(FAULT_CASES, "f.toml")}
    for cid in case_ids:
        ref = df[(df["case_id"] == cid) & (df["backend"] == "reference")]
        assert (ref["status"].isin(["pass", "info"])).all() and len(ref) >= 3, ref[["tensor", "status", "reason"]]
        rows = df[(df["case_id"] == cid) & (df["backend"] == "chaos")]
        fault = misbehaving.FAULTS.get(cases[cid].shape[0])
        expected = misbehaving.EXPECTED.get(fault)
        if expected is None:
            assert sorted(rows["tensor"]) == sorted(ref["tensor"]), (fault, rows[["tensor", "status", "reason"]])
            assert rows["status"].isin(["pass", "info"]).all(), (fault, rows[["tensor", "status", "reason"]])
        else:
            status, prefix = expected
            assert len(rows) == 1, (fault, rows[["tensor", "status", "reason"]])
            (row,) = rows.itertuples(index=False)
            assert row.status == status and row.reason.startswith(prefix.format(name="chaos")), (fault, row.reason)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_cli_sweep_records_every_fault_as_its_own_row_and_resume_keeps_the_verdict(tmp_path, workers):
    out = tmp_path / "rep"
    rc, _, err = finish(harness_run(tmp_path, FAULT_CASES, out, "--backend", "tests.misbehaving:chaos,reference",
                                    "--workers", str(workers), "--case-timeout", str(CASE_TIMEOUT)))
    assert rc == 1, err
    df = report.read_results(out)  # recorded, and a whole report
    ids = [c.id for c in parse_cases(FAULT_CASES, "f.toml")]
    check_fault_rows(df, ids, ["chaos", "reference"])
    # Resuming a finished run with errors: nothing runs again, the verdict and the counts stay.
    rc, stdout, err = finish(harness_run(tmp_path, FAULT_CASES, out, "--backend", "tests.misbehaving:chaos,reference",
                                         "--workers", str(workers), "--resume"))
    assert rc == 1, err
    assert f"({2 * len(ids)} (case, backend) pairs); pass" in stdout and "pass 11, fail 0, skip 0, error 7" in stdout, stdout
    assert report.read_results(out).equals(df)


@pytest.mark.slow
def test_pytest_xdist_records_every_fault_and_a_crashed_worker_case_reaches_the_csv(tmp_path):
    pytest.importorskip("xdist")  # the `test` extra
    pytest.importorskip("pytest_timeout")
    cases = tmp_path / "cases" / "faults.toml"
    cases.parent.mkdir()
    cases.write_text(FAULT_CASES)
    proc = start(["-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider", "-q", "-n", "2",
                  "--rootdir", str(tmp_path), str(cases), "--backend", "tests.misbehaving:chaos",
                  "--report-dir", str(tmp_path / "rep"), "--case-timeout", str(CASE_TIMEOUT)], tmp_path)
    rc, stdout, err = finish(proc)
    assert rc == 1, stdout + err  # failed items, not an internal error
    df = report.read_results(tmp_path / "rep")
    ids = [c.id for c in parse_cases(FAULT_CASES, "f.toml")]
    assert not df.duplicated(["case_id", "backend", "tensor"]).any()
    assert set(df["case_id"]) == set(ids) and set(df["backend"]) == {"chaos"}
    cases_by_id = {c.id: c for c in parse_cases(FAULT_CASES, "f.toml")}
    for cid in ids:
        rows = df[df["case_id"] == cid]
        fault = misbehaving.FAULTS.get(cases_by_id[cid].shape[0])
        expected = misbehaving.EXPECTED.get(fault)
        if expected is None:
            assert rows["status"].isin(["pass", "info"]).all() and len(rows) >= 3, (fault, rows)
            continue
        (row,) = rows.itertuples(index=False)
        prefix = "crash: " if fault in ("exit", "segfault") else expected[1].format(name="chaos")
        assert row.status == "error" and row.reason.startswith(prefix), (fault, row.reason)


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=TIMING).sort_values(["case_id", "backend", "tensor"]).reset_index(drop=True)


@pytest.mark.slow
def test_three_kill_9_then_resume_gives_the_pairs_and_rows_of_a_clean_run(tmp_path):
    backends = ["--backend", "tests.misbehaving:nap,reference", "--workers", "2"]
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    rc, _, err = finish(harness_run(tmp_path, KILL_CASES, clean, *backends))
    assert rc == 0, err
    rng = random.Random(14)
    for i in range(3):
        proc = harness_run(tmp_path, KILL_CASES, killed, *backends, *(["--resume"] if i else []))
        csv = killed / report.RESULTS
        deadline = time.monotonic() + RUN_LIMIT
        # A random moment once rows are arriving (or before, if this run has nothing left to do).
        while proc.poll() is None and time.monotonic() < deadline and not (
                csv.exists() and csv.stat().st_size > 0 and csv.read_text().count("\n") > 1 + 4 * i):
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.0))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=RUN_LIMIT)
        assert_no_orphans(proc.pid)  # the workers died with the main process
    rc, _, err = finish(harness_run(tmp_path, KILL_CASES, killed, *backends, "--resume"))
    assert rc == 0, err
    a, b = report.read_results(clean), report.read_results(killed)
    assert not b.duplicated(["case_id", "backend", "tensor"]).any()
    pd.testing.assert_frame_equal(_rows(a), _rows(b))


@pytest.mark.slow
def test_a_second_run_on_the_same_out_refuses_and_no_row_is_lost(tmp_path):
    out = tmp_path / "rep"
    backends = ["--backend", "tests.misbehaving:nap", "--workers", "1"]
    # 32 cases x 0.6 s: the first run holds the directory while the others try it.
    first = harness_run(tmp_path, KILL_CASES, out, *backends, **{misbehaving.Nap.NAP_ENV: "0.6"})
    deadline = time.monotonic() + RUN_LIMIT
    while not (out / report.RESULTS).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    others = [harness_run(tmp_path, KILL_CASES, out, *backends, *extra) for extra in ([], ["--resume"], ["--force"])]
    for proc in others:
        rc, _, err = finish(proc)
        assert first.poll() is None, "the first run ended before the others tried: the test proves nothing"
        assert rc == 2 and "in use by another run" in err, err
        assert err.count("\n") == 1, err  # one line, no traceback
    rc, _, err = finish(first)
    assert rc == 0, err
    df = report.read_results(out)
    n = len(parse_cases(KILL_CASES, "k.toml"))
    assert len(df.drop_duplicates(["case_id", "backend"])) == n and not df.duplicated(["case_id", "tensor"]).any()
    # The directory now holds a report: a fresh run refuses it without --force.
    rc, _, err = finish(harness_run(tmp_path, KILL_CASES, out, *backends))
    assert rc == 2 and "holds a previous report" in err and "--force" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_and_sigterm_stop_within_seconds_with_a_whole_csv_and_the_resume_hint(tmp_path, sig, rc):
    out = tmp_path / "rep"
    proc = harness_run(tmp_path, KILL_CASES, out, "--backend", "tests.misbehaving:nap", "--workers", "2",
                       **{misbehaving.Nap.NAP_ENV: "0.5"})
    csv = out / report.RESULTS
    deadline = time.monotonic() + RUN_LIMIT
    while not (csv.exists() and csv.read_text().count("\n") > 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal: the test proves nothing"
    # Ctrl-C reaches the whole foreground process group; SIGTERM (a scheduler's stop) only the main process.
    t0 = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    got, _, err = finish(proc)
    assert time.monotonic() - t0 < 20, "did not stop within seconds"
    assert got == rc, err
    assert "--resume" in err.splitlines()[-1], err
    df = report.read_results(out)  # consistent: whole rows only
    assert 0 < len(df) < len(parse_cases(KILL_CASES, "k.toml"))
    assert not df.duplicated(["case_id", "backend", "tensor"]).any()


@pytest.mark.slow
def test_a_backend_that_cannot_load_in_the_workers_gives_error_rows_not_a_hang(tmp_path):
    out = tmp_path / "rep"
    rc, _, err = finish(harness_run(tmp_path, FAULT_CASES, out, "--backend",
                                    "tests.misbehaving:unloadable_in_workers,reference", "--workers", "2"))
    assert rc == 1, err
    df = report.read_results(out)
    bad = df[df["backend"] == "unloadable_in_workers"]
    assert len(bad) == len(parse_cases(FAULT_CASES, "f.toml")) and (bad["status"] == "error").all()
    assert bad["reason"].str.startswith("worker could not load backend 'tests.misbehaving:unloadable_in_workers': "
                                        "RuntimeError: no GPU driver in this worker").all()
    assert df[df["backend"] == "reference"]["status"].isin(["pass", "info"]).all()
