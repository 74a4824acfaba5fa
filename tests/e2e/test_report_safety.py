"""Tamper-proof, loss-free sweeps, the report side (issue #38): a cases file nested too deeply, repro.sh quoting.
Commands go through `harness.cli.main` in this process (exit code, stdout, stderr)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import torch

from harness import artefacts, cli


def main(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


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
