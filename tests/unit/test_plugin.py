"""The pytest plugin collects cases/*.toml directly: one item per case, skips, located failures, CSV rows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import report
from harness.cases import parse_cases

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

TINY = """
[[grid]]
scheme = "fp8_current"
element = ["e4m3", "e5m2"]
shape = [32, 64]
orientation = "both"
distribution = "normal"
seed = 3

[[grid]]
scheme = "mxfp8"
shape = [32, 64]
"""

# The reference with one data byte flipped (a located mismatch every time), loaded by its spec.
FLIPPER = "tests.unit.test_runner:_FlipByte"


QUIET = ("-p", "no:cacheprovider", "-p", "no:benchmark")


@pytest.fixture
def tiny(pytester):
    pytester.makeconftest('pytest_plugins = ["harness.pytest_plugin"]\n')
    d = pytester.mkdir("cases")
    (d / "tiny.toml").write_text(TINY)
    return [c.id for c in parse_cases(TINY, "tiny.toml")]


def test_collects_one_item_per_case_named_by_case_id(pytester, tiny):
    assert len(tiny) == 3
    result = pytester.runpytest("cases/tiny.toml", "--collect-only", "-q", *QUIET)
    result.assert_outcomes()
    collected = [ln.split("::", 1)[1] for ln in result.outlines if ln.startswith("cases/tiny.toml::")]
    assert collected == tiny


def test_torch_backend_passes_fp8_skips_mxfp8_and_the_controller_writes_rows(pytester, tiny):
    result = pytester.runpytest("cases/tiny.toml", "--backend", "torch", "--report-dir", "rep", "-rs", *QUIET)
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*torch: no PyTorch quantize op for mxfp8*"])
    df = report.read_results(pytester.path / "rep")
    assert set(df["case_id"]) == set(tiny) and set(df["backend"]) == {"torch"}
    assert df[df["scheme"] == "mxfp8"]["status"].tolist() == ["skip"]
    assert len(df.drop_duplicates(["case_id", "backend", "tensor"])) == len(df)  # each row once
    assert (pytester.path / "rep" / report.META).exists()


def test_a_mismatch_fails_with_the_located_first_mismatch_and_a_repro_command(pytester, tiny):
    result = pytester.runpytest("cases/tiny.toml", "-k", "fp8_current", "--backend", FLIPPER,
                                "--report-dir", "rep", *QUIET)
    result.assert_outcomes(failed=2)
    text = result.stdout.str()
    assert "rowwise_data: 1 of 2048 differ" in text
    assert "first mismatch:" in text
    assert f"repro: python -m harness repro {tiny[0]} --backend {FLIPPER}" in text
    df = report.read_results(pytester.path / "rep")  # recorded although the tests failed
    assert (df[df["tensor"] == "rowwise_data"]["status"] == "fail").all()
    assert (pytester.path / "rep" / "failures").is_dir()


def test_unknown_backend_is_one_usage_error_named_once(pytester, tiny):
    result = pytester.runpytest("cases/tiny.toml", "--backend", "nope_backend", *QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert text.count("unknown backend 'nope_backend'") == 1 and "Traceback" not in text


def test_a_case_over_its_timeout_is_an_error_row_named_timeout(pytester, tiny, monkeypatch):
    pytest.importorskip("pytest_timeout")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("cases/tiny.toml", "-k", "fp8_current and e4m3", "--backend", "tests.misbehaving:hang",
                                           "--case-timeout", "2", "--report-dir", "rep", *QUIET, timeout=240)
    result.assert_outcomes(failed=1)
    (r,) = report.read_results(pytester.path / "rep").itertuples(index=False)
    assert r.status == "error" and r.reason.startswith("timeout: Timeout") and r.backend == "hang"


@pytest.mark.slow
def test_under_xdist_workers_attach_rows_and_the_controller_writes_the_csv(pytester, tiny, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("cases/tiny.toml", "-n", "2", "--backend", "reference",
                                           "--report-dir", "rep", *QUIET, timeout=240)
    result.assert_outcomes(passed=3)
    df = report.read_results(pytester.path / "rep")
    assert set(df["case_id"]) == set(tiny)
    assert set(df["worker"]) <= {"gw0", "gw1"}
    assert len(df.drop_duplicates(["case_id", "backend", "tensor"])) == len(df)


def test_xdist_worker_pins_its_gpu_by_worker_index(monkeypatch):
    import torch

    from harness import pytest_plugin

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    # CUDA not started: the variable takes effect (torch then counts 1 GPU); gw6 -> GPU 6 % 4 = 2.
    monkeypatch.setattr(torch.cuda, "device_count",
                        lambda: 1 if os.environ.get("CUDA_VISIBLE_DEVICES") else 4)
    assert pytest_plugin._pin_gpu("gw6") == "cuda:0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    # CUDA already started: the variable is ignored, so the worker selects the device instead.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert pytest_plugin._pin_gpu("gw5") == "cuda:1" and chosen == [1]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    # No GPU: CPU.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert pytest_plugin._pin_gpu("gw0") == "cpu"
