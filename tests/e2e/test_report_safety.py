"""Tamper-proof, loss-free sweeps, the report side (issue #38): a cases file nested too deeply, repro.sh quoting,
unusable --out paths, a full disk, --resume only of the same selection, merge under the run lock and only of whole
shard sets. Commands go through `harness.cli.main` in this process (exit code, stdout, stderr); the sweeps run a few
tiny fp8_current cases of the test's own cases file on the CPU."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness import artefacts, cli, report
from harness.backends import backend_identity

TINY = """
[[grid]]
scheme = "fp8_current"
element = ["e4m3", "e5m2"]
orientation = "rowwise"
in_dtype = "float32"
shape = [[8, 32], [16, 32]]
distribution = "normal"
seed = 1
"""


def main(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def tiny(tmp_path: Path, text: str = TINY) -> Path:
    f = tmp_path / "tiny.toml"
    f.write_text(text)
    return f


def run(capsys, cases: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return main(capsys, "run", "--cases", str(cases), "--backend", "reference", "--device", "cpu", "--out", str(out),
                "--no-progress", *extra)


def pairs(d: Path) -> set[tuple[str, str]]:
    df = report.read_results(d)
    return set(zip(df["case_id"], df["backend"], strict=True))


def row(case_id: str) -> dict:
    return {"case_id": case_id, "backend": "reference", "tensor": "rowwise_data", "status": "pass",
            "kind": "conformance", "scheme": "fp8_current", "op": "quantize", "n": 64, "n_mismatch": 0}


# ---- a cases file nested too deeply --------------------------------------------------------------


def test_a_cases_file_nested_too_deeply_is_a_one_line_error(tmp_path, capsys):
    deep_arrays = tmp_path / "deep_arrays.toml"
    deep_arrays.write_text("[[grid]]\nscheme = \"fp8_current\"\nshape = " + "[" * 100_000 + "]" * 100_000 + "\n")
    deep_inline = tmp_path / "deep_inline.toml"
    deep_inline.write_text("x = " + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n")
    deep_expand = tmp_path / "deep_expand.toml"  # TOML reads it; expanding the grid recursed per level
    deep_expand.write_text("[[grid]]\nscheme = \"fp8_current\"\nshape = " + "[" * 5000 + "]" * 5000 + "\n")
    for f in (deep_arrays, deep_inline, deep_expand):
        line = (f"error: cases file {f}: nested too deeply (tables or arrays nested beyond Python's recursion "
                "limit); grid values are flat lists of values or shapes\n")
        rc, _, err = main(capsys, "run", "--cases", str(f), "--out", str(tmp_path / "o"), "--device", "cpu",
                          "--no-progress")
        assert (rc, err) == (2, line)
        assert main(capsys, "list", "--cases", str(f)) == (2, "", line)
    assert not (tmp_path / "o").exists()


# ---- repro.sh: every path and argument is data ---------------------------------------------------


def test_repro_sh_quotes_every_path_and_argument_and_runs_nothing_they_hold(tmp_path, monkeypatch):
    hostile = tmp_path / "a$(touch PWNED)b `touch PWNED2` 'q\""
    hostile.mkdir()
    hostile = hostile.resolve()
    (hostile / "evil_mod.py").write_text("backend = None\n")
    monkeypatch.syspath_prepend(str(hostile))
    root = tmp_path / "root$(touch PWNED3)"
    root.mkdir()
    root = root.resolve()
    monkeypatch.setattr(artefacts, "REPO_ROOT", root)
    case = SimpleNamespace(id="quantize-$(touch PWNED4)-'x'\n`touch PWNED5`", source="")
    spec = "evil_mod:backend"
    d = artefacts.save_failure(tmp_path / "out", case, spec, [row("c")], inputs={"x": torch.zeros(2)})
    script = d / "repro.sh"
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert f"export PYTHONPATH={shlex.quote(str(hostile) + ':')}\"$PYTHONPATH\"" in text
    assert f"root={shlex.quote(str(root))}\n" in text
    assert text.endswith(f"\npython -m harness repro {shlex.quote(case.id)} --backend evil_mod:backend "
                         '--inputs "$here/inputs.pt" "$@"\n')
    artefacts.save_failure(tmp_path / "out", case, spec, [row("c")], inputs={"x": torch.zeros(2)})
    assert script.read_text() == text  # the same backend again: its line once
    assert "# Repro of quantize-$(touch PWNED4)-'x'\\n`touch PWNED5` (" in text  # one comment line
    # Run it with a `python` that only records what it was given.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text('#!/bin/sh\nprintf "%s\\0" "$PYTHONPATH" "$@" > "$RECORD"\n')
    (fake / "python").chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    record = tmp_path / "record"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "RECORD": str(record), "HOME": str(tmp_path)}
    for shell in ("sh", "bash"):
        proc = subprocess.run([shell, str(script), "--device", "cpu"], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        got = record.read_text().split("\0")[:-1]
        assert got == [f"{hostile}:{root}", "-m", "harness", "repro", case.id, "--backend", spec, "--inputs",
                       f"{d}/inputs.pt", "--device", "cpu"]
    assert not [p for p in tmp_path.rglob("PWNED*")] and not list(Path.cwd().glob("PWNED*"))


# ---- unusable --out paths and a full disk: one line, exit 2; the finished pairs resume -----------


def test_unusable_out_paths_are_one_line_errors_before_anything_runs(tmp_path, capsys):
    f = tiny(tmp_path)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a_file").write_text("x")
    for out, line in [
        (tmp_path / "gone", f"--out {str(tmp_path / 'gone')!r} is a symbolic link to {str(tmp_path / 'nowhere')!r}, "
                            "which does not exist; create that directory or choose another --out"),
        (tmp_path / "a_file" / "out", f"--out {str(tmp_path / 'a_file' / 'out')!r}: {str(tmp_path / 'a_file')!r} is "
                                      "a file, not a directory; choose another --out"),
    ]:
        assert run(capsys, f, out) == (2, "", f"error: {line}\n")
    rc, _, err = run(capsys, f, Path("/proc/harness-out"))  # mkdir there fails even for root
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("error: cannot create the report directory '/proc/harness-out': " if os.geteuid() == 0 else
                          "error: --out '/proc/harness-out': no permission to write in '/proc'; choose another --out")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_out_directory_is_a_one_line_error(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    rc, _, err = main(capsys, "run", "--cases", str(tiny(tmp_path)), "--out", str(ro / "out"), "--device", "cpu")
    assert (rc, err) == (2, f"error: --out {str(ro / 'out')!r}: no permission to write in {str(ro)!r}; choose "
                            "another --out\n")


def test_a_full_disk_stops_the_run_in_one_line_and_resume_finishes_it(tmp_path, capsys, monkeypatch):
    f, out = tiny(tmp_path), tmp_path / "out"
    real, appended = os.write, []

    def disk_fills_after_two_pairs(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target == str(out / report.RESULTS):
            if len(appended) >= 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            appended.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", disk_fills_after_two_pairs)
    rc, _, err = run(capsys, f, out)
    monkeypatch.setattr(os, "write", real)
    assert rc == 2 and err.endswith(f"error: cannot append to {out / report.RESULTS}: No space left on device; it "
                                    "keeps the 2 (case, backend) pairs finished before, whole: free space (or fix "
                                    "the error) and continue with --resume\n"), err
    assert "Traceback" not in err and report.check_results(out) > 0 and len(pairs(out)) == 2
    rc, _, err = run(capsys, f, out, "--resume")
    assert rc == 0 and "(resume: 2 already done)" in err, err
    assert len(pairs(out)) == 4


# ---- --resume continues only the selection the report was made with ------------------------------


def test_resume_refuses_another_selection_in_one_line_and_resume_any_mixes_them(tmp_path, capsys):
    f, out = tiny(tmp_path), tmp_path / "out"
    rc, _, err = run(capsys, f, out, "--filter", "e4m3")
    assert rc == 0, err
    sel = json.loads((out / report.META).read_text())["selection"]
    assert sel == {"tier": None, "cases": str(f), "cases_sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
                   "filter": "e4m3", "shard": None, "golden_device": "auto", "backends": ["reference"],
                   "backend_code": [{"spec": "reference", "sha256": None, "version": backend_identity("reference")[
                       "version"]}]}
    before = (out / report.RESULTS).read_bytes()
    rc, _, err = run(capsys, f, out, "--filter", "e5m2", "--resume")
    assert rc == 2 and err == (f"error: --resume: the report at {out} was made with --filter 'e4m3', this run has "
                               "--filter 'e5m2'; use another --out, or --force to replace it (--resume-any mixes "
                               "them)\n")
    f.write_text(TINY.replace("seed = 1", "seed = 2"))
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    rc, _, err = run(capsys, f, out, "--filter", "e4m3", "--resume")
    assert rc == 2 and err == (f"error: --resume: the report at {out} was made with --cases {str(f)!r} with content "
                               f"sha256 {sel['cases_sha256'][:12]}, this run has --cases {str(f)!r} with content "
                               f"sha256 {digest[:12]}; use another --out, or --force to replace it (--resume-any "
                               "mixes them)\n")
    assert (out / report.RESULTS).read_bytes() == before  # refused before anything was written
    rc, _, err = run(capsys, f, out, "--filter", "e4m3", "--resume-any")
    assert rc == 2 and err == "error: --resume-any goes with --resume (it lets --resume continue a report of another " \
                              "selection)\n"
    rc, _, err = run(capsys, f, out, "--resume", "--resume-any")
    assert rc == 0, err
    ids = {c for c, _ in pairs(out)}
    assert len(ids) == 6 and sum("e5m2" in c for c in ids) == 2  # 2 e4m3 of seed 1, then all 4 of seed 2
    meta = json.loads((out / report.META).read_text())
    assert meta["resumed_other_selection"].startswith("made with --cases") and meta["selection"]["filter"] is None


# ---- merge ---------------------------------------------------------------------------------------


def shard(d: Path, shard: str | None, case_ids: list[str], finished=True, **sel) -> Path:
    selection = {"tier": "smoke", "cases": None, "cases_sha256": "ab" * 32, "filter": "e4m3", "shard": shard,
                 "golden_device": "auto", "backends": ["reference"], **sel}
    with report.ReportWriter(d, {"options": {"shard": shard}, "selection": selection}) as w:
        for c in case_ids:
            w.write([row(c)])
        w.write_meta(finished=finished, **({} if finished else {"stopped": "interrupted"}))
    return d


def test_merge_refuses_an_out_in_use_or_a_file_and_a_shard_in_use(tmp_path, capsys):
    s0, s1 = shard(tmp_path / "s0", "0/2", ["a"]), shard(tmp_path / "s1", "1/2", ["b"])
    out = tmp_path / "out"
    out.mkdir()
    held = report._lock_dir(out)  # a running sweep's lock
    try:
        rc, _, err = main(capsys, "merge", str(out), str(s0), str(s1))
        assert (rc, err) == (2, f"error: {out} is in use by another run (pid {os.getpid()}); wait for it to end or "
                                "choose another OUT\n")
    finally:
        os.close(held)
    (tmp_path / "a_file").write_text("x")
    rc, _, err = main(capsys, "merge", str(tmp_path / "a_file"), str(s0), str(s1))
    assert (rc, err) == (2, f"error: merge OUT {str(tmp_path / 'a_file')!r} is a file; the report is a "
                            "directory (results.csv and run_meta.json are written inside it)\n")
    held = report._lock_dir(s1)  # a sweep still writing s1
    try:
        rc, _, err = main(capsys, "merge", str(out), str(s0), str(s1))
    finally:
        os.close(held)
    assert (rc, err) == (2, f"error: shard {s1} is in use by a running sweep (pid {os.getpid()}); merge it when that "
                            "run ends\n")
    rc, _, err = main(capsys, "merge", str(out), str(s0), str(s1))
    assert rc == 0, err
    assert pairs(out) == {("a", "reference"), ("b", "reference")}


def test_merge_refuses_shards_that_are_not_one_whole_sweep_unless_allow_incomplete(tmp_path, capsys):
    s = tmp_path
    a0, a0_again = shard(s / "a0", "0/3", ["a"]), shard(s / "a0b", "0/3", ["x"])
    a2 = shard(s / "a2", "2/3", ["c"], filter="e5m2")
    stopped = shard(s / "stopped", None, ["d"], finished=False)
    rc, _, err = main(capsys, "merge", str(s / "out"), str(a0), str(a0_again), str(a2), str(stopped))
    assert (rc, err) == (2, (
        f"error: merge: the shards are not one whole sweep: {stopped} is a sweep that did not finish (interrupted; "
        f"continue it with --resume); --shard 1/3 of 3 missing; --shard 0/3 given 2 times ({a0}, {a0_again}); {a2} "
        f"was made with --filter 'e5m2', {a0} with --filter 'e4m3'; merge every shard of one selection (or pass "
        "--allow-incomplete)\n"))
    assert not (s / "out" / report.RESULTS).exists()
    b = shard(s / "b", "0/2", ["e"], backends=["torch"])
    rc, _, err = main(capsys, "merge", str(s / "out"), str(a0), str(b))
    assert (rc, err) == (2, (
        f"error: merge: the shards are not one whole sweep: the shards split the selection in different numbers of "
        f"slices: {a0} is --shard 0/3, {b} is --shard 0/2; {b} was made with --backend torch, {a0} with --backend "
        "reference; merge every shard of one selection (or pass --allow-incomplete)\n"))
    rc, _, err = main(capsys, "merge", str(s / "out"), str(a0), str(a2), "--allow-incomplete")
    assert rc == 0 and err == (f"merge: --shard 1/3 of 3 missing\nmerge: {a2} was made with --filter 'e5m2', {a0} "
                               "with --filter 'e4m3'\n"), err
    assert pairs(s / "out") == {("a", "reference"), ("c", "reference")}
    assert json.loads((s / "out" / report.META).read_text())["merge_notes"] == [
        "--shard 1/3 of 3 missing", f"{a2} was made with --filter 'e5m2', {a0} with --filter 'e4m3'"]
    whole = [shard(s / f"w{i}", f"{i}/3", [f"w{i}"]) for i in range(3)]
    rc, _, err = main(capsys, "merge", str(s / "whole"), *map(str, reversed(whole)))
    assert rc == 0 and err == "", err
