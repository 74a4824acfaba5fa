"""`python -m harness` end to end on a handful of smoke-tier cases (reference and torch backends).

The main run is a real `python -m harness run` subprocess; the follow-up commands (report, list,
repro, resume, shards + merge, diff, usage errors) go through `harness.cli.main` in this process to
keep the file fast. The cases are picked by id from cases/smoke.toml (a few fp8_current quantizers,
one block-scaled quantizer, one GEMM when the tier has them) and selected with --filter. The
whole smoke tier and the multi-process `--workers` path are `slow` tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import cli, report
from harness.cases import load_cases

ROOT = Path(__file__).resolve().parents[2]


def harness(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMERICS_HARNESS_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def main(capsys, *args: str) -> tuple[int, str, str]:
    """cli.main in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def pick_ids() -> list[str]:
    cases = load_cases("smoke")
    fp8 = [c for c in cases if c.config.scheme == "fp8_current" and c.op == "quantize"][:3]
    other = [c for c in cases if c.config.scheme in ("mxfp8", "nvfp4") and c.op == "quantize"][:1]
    gemm = [c for c in cases if c.op == "gemm" and c.config.scheme == "fp8_current"][:1]
    picked = fp8 + other + gemm
    assert len(fp8) >= 2 and other, "the smoke tier should hold fp8_current and block-scaled quantize cases"
    return [c.id for c in picked]


@pytest.fixture(scope="module")
def ids() -> list[str]:
    return pick_ids()


def id_filter(ids: list[str]) -> str:
    return "^(" + "|".join(re.escape(i) for i in ids) + ")$"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, ids):
    out = tmp_path_factory.mktemp("e2e") / "smoke"
    proc = harness("run", "--tier", "smoke", "--backend", "reference,torch", "--filter", id_filter(ids),
                   "--out", str(out), "--device", "cpu")
    return out, proc


def test_run_writes_conformance_and_accuracy_rows_for_reference_and_torch(smoke_run, ids):
    out, proc = smoke_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    df = report.read_results(out)
    assert set(df["case_id"]) == set(ids)
    assert set(df["backend"]) == {"reference", "torch"}
    ref = df[df["backend"] == "reference"]
    assert (ref[ref["kind"] == "accuracy"]["status"] == "info").all()
    assert set(ref[ref["kind"] == "accuracy"]["case_id"]) == set(ids)  # the reference's accuracy report
    assert (ref[ref["kind"] == "conformance"]["status"] == "pass").all()
    torch_rows = df[df["backend"] == "torch"]
    for cid in ids:
        rows = torch_rows[torch_rows["case_id"] == cid]
        scheme, op = rows["scheme"].iloc[0], rows["op"].iloc[0]
        if scheme == "fp8_current" and op != "gemm":
            assert (rows[rows["kind"] == "conformance"]["status"] == "pass").all(), rows[["tensor", "reason"]]
        else:  # block-scaled quantizers and CPU GEMMs are torch gaps: skips with a reason
            assert rows["status"].tolist() == ["skip"] and rows["reason"].iloc[0]
    meta = json.loads((out / report.META).read_text())
    assert meta["options"]["backends"] == ["reference", "torch"] and meta["finished"] is True
    assert meta["options"]["golden_device"] == "auto"
    assert "torch" in meta and "git_commit" in meta
    assert "worst_delta_sqnr_db" in proc.stdout and "skip reasons:" in proc.stdout
    assert [a["name"] for a in meta["adapters"]] == ["reference", "torch"]
    assert meta["adapters"][0]["module"] == "harness.backends"


def test_report_list_and_repro_commands(smoke_run, ids, capsys):
    out, _ = smoke_run
    rc, text, err = main(capsys, "report", str(out))
    assert rc == 0, err
    assert "fp8_current" in text and "worst_delta_sqnr_db" in text
    assert (out / "plots" / "sqnr_by_toggle.png").exists()
    rc, text, _ = main(capsys, "list", "--tier", "smoke", "--filter", id_filter(ids), "--backend", "torch",
                       "--device", "cpu")
    assert rc == 0 and len(text.splitlines()) == len(ids)
    assert f"{ids[0]}  torch:yes" in text
    rc, text, err = main(capsys, "repro", ids[0], "--backend", "torch", "--device", "cpu")
    assert rc == 0, text + err
    assert f"== {ids[0]} [torch on cpu]" in text and "pass" in text


def test_resume_skips_finished_cases(smoke_run, ids, capsys):
    out, _ = smoke_run
    before = report.read_results(out)
    rc, _, err = main(capsys, "run", "--tier", "smoke", "--backend", "reference,torch", "--filter", id_filter(ids),
                      "--out", str(out), "--device", "cpu", "--resume", "--no-progress")
    assert rc == 0, err
    assert f"resume: {2 * len(ids)} already done" in err
    assert len(report.read_results(out)) == len(before)


def test_shards_merge_back_to_the_full_run_and_diff_is_clean(smoke_run, ids, tmp_path, capsys):
    out, _ = smoke_run
    shards = []
    for i in range(2):
        d = tmp_path / f"shard{i}"
        rc, _, err = main(capsys, "run", "--tier", "smoke", "--backend", "reference,torch", "--filter",
                          id_filter(ids), "--shard", f"{i}/2", "--out", str(d), "--device", "cpu", "--no-progress")
        assert rc == 0, err
        shards.append(d)
    parts = [set(report.read_results(d)["case_id"]) for d in shards]
    assert parts[0] and parts[1] and not (parts[0] & parts[1])
    merged = tmp_path / "merged"
    assert main(capsys, "merge", str(merged), *map(str, shards))[0] == 0
    key = ["case_id", "backend", "tensor"]
    full = report.read_results(out)
    got = report.read_results(merged)
    assert sorted(map(tuple, got[key].values.tolist())) == sorted(map(tuple, full[key].values.tolist()))
    rc, text, _ = main(capsys, "diff", str(out), str(merged))
    assert rc == 0, text


def test_diff_exits_1_on_a_regression(smoke_run, tmp_path):
    out, _ = smoke_run
    df = pd.read_csv(out / report.RESULTS, dtype=str, keep_default_na=False)
    i = df.index[(df["status"] == "pass")][0]
    df.loc[i, "status"] = "fail"
    df.loc[i, "n_mismatch"] = "7"
    bad = tmp_path / "bad"
    bad.mkdir()
    df.to_csv(bad / report.RESULTS, index=False)
    proc = harness("diff", str(out), str(bad))  # the real exit status of the process
    assert proc.returncode == 1
    assert f"status pass -> fail: {df.loc[i, 'case_id']}" in proc.stdout


def test_third_party_adapter_runs_from_the_cli(ids, tmp_path, capsys):
    fp8 = [i for i in ids if "fp8_current" in i and not i.startswith("gemm")]
    rc, text, err = main(capsys, "run", "--tier", "smoke", "--backend", "examples.my_kernel_adapter:backend",
                         "--filter", id_filter(fp8), "--out", str(tmp_path / "mine"), "--device", "cpu", "--no-progress")
    assert rc == 0, text + err
    df = report.read_results(tmp_path / "mine")
    assert set(df["backend"]) == {"my_kernel"} and (df[df["kind"] == "conformance"]["status"] == "pass").all()


def test_usage_errors_exit_2_and_name_the_problem(tmp_path, capsys):
    rc, _, err = main(capsys, "run", "--tier", "smoke", "--backend", "reference,bogus_backend", "--out",
                      str(tmp_path / "x"))
    assert rc == 2 and "unknown backend 'bogus_backend'" in err
    rc, _, err = main(capsys, "run", "--tier", "smoke", "--shard", "2/2", "--out", str(tmp_path / "x"))
    assert rc == 2 and "--shard" in err
    rc, _, err = main(capsys, "run", "--tier", "no_such_tier", "--out", str(tmp_path / "x"))
    assert rc == 2 and "no_such_tier" in err
    rc, _, err = main(capsys, "bench", "no_such_bench")
    assert rc == 2 and "benchmarks/no_such_bench.py" in err
    rc, text, _ = main(capsys, "bench", "--list")
    assert rc == 0 and "bench_reference" in text


@pytest.mark.slow
def test_workers_split_the_cases_and_the_parent_writes_one_report(ids, tmp_path):
    out = tmp_path / "w"
    proc = harness("run", "--tier", "smoke", "--backend", "reference,torch", "--filter", id_filter(ids[:2]),
                   "--out", str(out), "--workers", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    df = report.read_results(out)
    assert set(df["case_id"]) == set(ids[:2])
    assert set(df["worker"]) <= {"w0", "w1"}
    assert len(df.drop_duplicates(["case_id", "backend", "tensor"])) == len(df)


@pytest.mark.slow
def test_main_job_smoke_tier_reference_and_torch(tmp_path):
    # Its 3-minute wall-time goal is measured outside the tests (speed goals are not timed tests).
    proc = harness("run", "--tier", "smoke", "--backend", "reference,torch", "--out", str(tmp_path / "smoke"),
                   "--device", "cpu", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    df = report.read_results(tmp_path / "smoke")
    assert set(df["backend"]) == {"reference", "torch"}
    assert len(set(df["case_id"])) == len(load_cases("smoke"))


def test_filter_is_a_regex_or_a_substring_and_shards_are_0_based():
    from harness import cli

    ids = ["quantize-fp8_current-a", "quantize-mxfp8-b", "gemm-TN-fp8_current(c"]
    assert cli.filter_ids(ids, "^quantize-.*current") == [True, False, False]
    assert cli.filter_ids(ids, r"current\(c") == [False, False, True]
    with pytest.raises(cli.UsageError, match="not a valid regular expression"):
        cli.filter_ids(ids, "current(c")
    assert cli.filter_ids(ids, None) == [True, True, True]
    assert cli.parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "x/2", "1/0"):
        with pytest.raises(cli.UsageError):
            cli.parse_shard(bad)


def test_backend_prepare_runs_once_before_the_sweep_and_its_failure_does_not_stop_it(ids, tmp_path, capsys,
                                                                                     monkeypatch):
    class Ready:
        name = "ready"

        def prepare(self, cases, device):
            return f"ready: {len(cases)} cases on {device}"

    class Broken:
        name = "broken"

        def prepare(self, cases, device):
            raise RuntimeError("NVRTC exploded\nsecond line")

    class Plain:
        name = "plain"

    cli._prepare([Ready(), Broken(), Plain()], ["c1", "c2"], "cpu")
    err = capsys.readouterr().err.splitlines()
    assert err == ["harness: ready: 2 cases on cpu",
                   "harness: broken: prepare failed (RuntimeError: NVRTC exploded); going on"]

    calls = []
    real = cli._prepare
    monkeypatch.setattr(cli, "_prepare", lambda b, c, d: (calls.append(([x.name for x in b], len(c), d)), real(b, c, d)))
    fp8 = [i for i in ids if "fp8_current" in i and not i.startswith("gemm")][:1]
    rc, text, e = main(capsys, "run", "--tier", "smoke", "--backend", "reference", "--filter", id_filter(fp8),
                       "--out", str(tmp_path / "p"), "--device", "cpu", "--no-progress")
    assert rc == 0, text + e
    assert calls == [(["reference"], 1, "cpu")]
    rc, text, e = main(capsys, "run", "--tier", "smoke", "--backend", "reference", "--filter", id_filter(fp8),
                       "--out", str(tmp_path / "p"), "--device", "cpu", "--no-progress", "--resume")
    assert rc == 0 and len(calls) == 1  # nothing left to run: no preparation


def test_shards_partition_the_selection_and_keep_cases_sharing_an_input_together():
    from collections import Counter

    from harness import cli
    from harness.inputs import input_key

    whole = cli.select_cases("gemm", None, None, None)
    shards = [cli.select_cases("gemm", None, None, f"{i}/3") for i in range(3)]
    ids = [c.id for s in shards for c in s]
    assert sorted(ids) == sorted(c.id for c in whole) and len(set(ids)) == len(ids)
    owner = {}
    for i, s in enumerate(shards):
        for c in s:
            assert owner.setdefault(input_key(c), i) == i, c.id  # one input, one shard
    biggest = max(Counter(input_key(c) for c in whole).values())
    assert max(map(len, shards)) - min(map(len, shards)) <= biggest  # balanced within one group


def test_bad_run_arguments_are_one_line_usage_errors(tmp_path, capsys, monkeypatch):
    (tmp_path / "raising_backend.py").write_text("raise ImportError('no such library: libkernel.so')\n")
    (tmp_path / "crashing_backend.py").write_text("raise RuntimeError('CUDA driver too old')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    binary = tmp_path / "cases" / "binary.toml"
    binary.parent.mkdir()
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    out = str(tmp_path / "out")
    sel = ["--tier", "smoke", "--filter", "fp8_current-e4m3"]
    for args, words in [
        (["--backend", "", "--out", out, *sel], "names no backend"),
        (["--backend", " , ", "--out", out, *sel], "names no backend"),
        (["--backend", "raising_backend:backend", "--out", out, *sel], "cannot import module 'raising_backend'"),
        (["--backend", "crashing_backend:backend", "--out", out, *sel],
         "could not be loaded: RuntimeError: CUDA driver too old"),
        (["--out", str(a_file), *sel], "is a file"),
        (["--out", str(tmp_path / "x.csv"), *sel], "names a CSV file"),
        (["--cases", str(binary), "--out", out], "not a UTF-8 TOML cases file"),
        (["--tier", "smoke", "--filter", "e4m3(", "--out", out], "not a valid regular expression"),
        (["--workers", "0", "--out", out, *sel], "--workers 0 is invalid"),
        (["--case-timeout", "-1", "--out", out, *sel], "--case-timeout -1 is invalid"),
        (["--resume", "--force", "--out", out, *sel], "exclude each other"),
    ]:
        rc, _, err = main(capsys, "run", *args)
        assert rc == 2 and err.startswith("error: ") and words in err, (args, err)
        assert err.count("\n") == 1, err  # one line: no traceback
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "out").exists()  # nothing ran
    rc, _, err = main(capsys, "repro", "quantize-fp8_current-e4m3-rowwise-f32-16x32-normal-s1", "--inputs", str(binary))
    assert rc == 2 and "is not an inputs.pt saved by a run" in err and err.count("\n") == 1, err


def test_a_run_selecting_no_case_says_what_the_spec_rules_excluded(tmp_path, capsys):
    f = tmp_path / "cases" / "none.toml"
    f.parent.mkdir()
    f.write_text('[[grid]]\nscheme = "mxfp8"\ntile = [[1, 16], [1, 8]]\nshape = [32, 64]\n')  # MXFP8 tiles are 1x32/32x32
    rc, _, err = main(capsys, "run", "--cases", str(f), "--out", str(tmp_path / "o"))
    assert rc == 2 and "the spec rules excluded all 2 grid combinations (config.tile 2 (scheme=mxfp8, tile=1x16|1x8))" \
        in err, err
    rc, _, err = main(capsys, "run", "--tier", "smoke", "--filter", "no-such-case", "--out", str(tmp_path / "o"))
    assert rc == 2 and "--filter 'no-such-case' and --shard None kept none" in err, err


def test_an_empty_selection_names_the_grid_values_the_spec_rules_excluded(tmp_path, capsys):
    """One line, exit codes unchanged (run 2, list 0): the filter matched only combinations the spec
    forbids, and each rule is named with the values it excluded."""
    f = tmp_path / "mixed.toml"
    f.write_text('[[grid]]\nscheme = ["nvfp4", "mxfp8"]\nelement = ["e4m3", "e5m2", "e2m1"]\n'
                 'shape = [[32, 64], [64, 64]]\n')
    rc, _, err = main(capsys, "run", "--cases", str(f), "--filter", "nvfp4.*e5m2", "--out", str(tmp_path / "o"))
    assert rc == 2 and err == (
        f"error: no cases selected: {f} has 6 cases; --filter 'nvfp4.*e5m2' matched none of them but 2 grid "
        "combinations, all excluded by config.element 2 (scheme=nvfp4, element=e5m2)\n"), err
    rc, out, err = main(capsys, "list", "--cases", str(f), "--filter", "nvfp4-e(4m3|5m2)")
    assert rc == 0 and out == "" and err == (
        f"0 cases: {f} has 6 cases; --filter 'nvfp4-e(4m3|5m2)' matched none of them but 4 grid combinations, "
        "all excluded by config.element 4 (scheme=nvfp4, element=e4m3|e5m2)\n"), err
    t = tmp_path / "tiles.toml"
    t.write_text('[[grid]]\nscheme = "mxfp8"\ntile = [[1, 16], [1, 8]]\nshape = [32, 64]\n')
    rc, _, err = main(capsys, "list", "--cases", str(t))
    assert rc == 0 and err == (f"0 cases: {t}: the spec rules excluded all 2 grid combinations "
                               "(config.tile 2 (scheme=mxfp8, tile=1x16|1x8))\n"), err


def test_keep_outputs_accept_and_bitwise_diff_from_the_cli(ids, tmp_path, capsys):
    """run --keep-outputs saves each candidate's tensors; --accept sets the exit status; diff --pair --bitwise."""
    fp8 = [i for i in ids if "fp8_current" in i and i.startswith("quantize")][:2]
    out = tmp_path / "k"
    args = ["run", "--tier", "smoke", "--backend", "reference,examples.my_kernel_adapter:backend", "--filter",
            id_filter(fp8), "--out", str(out), "--device", "cpu", "--no-progress", "--keep-outputs"]
    rc, text, err = main(capsys, *args, "--accept", "exact")
    assert rc == 0, text + err
    assert "accept exact (--accept): every (case, backend) pair within it" in text
    assert len(list((out / "outputs").glob("*/*.pt"))) == 2 * len(fp8)
    rc, text, _ = main(capsys, "diff", str(out), str(out), "--pair", "reference:my_kernel", "--bitwise")
    assert rc == 0 and "0 case(s) whose bytes differ" in text, text
    rc, _, err = main(capsys, *args, "--force", "--accept", "nope")
    assert rc == 2 and "nope is not one of" in err
    rc, text, _ = main(capsys, "report", str(out), "--no-plots", "--accept", "degraded")
    assert rc == 1 and (out / "junit.xml").exists() and (out / "summary.md").exists() and (out / "report.html").exists()
