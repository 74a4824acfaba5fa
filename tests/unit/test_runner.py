"""The runner: golden vs candidate rows, accuracy rows, skips, errors that do not stop a sweep, failure artifacts.

The third-party example adapter (examples/my_kernel_adapter.py) runs through the runner and passes on
fp8_current cases; its deliberately broken variant (reciprocal-then-multiply scale, docs/numerics.md
§0.2.2) fails with a located mismatch on the §8 vector amax = 3 (s = 0x43155555 vs 0x43155556).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

import reference
from harness import forkserver, ops, pool, report, runner
from harness.backends import get_backend
from harness.cases import Case
from harness.golden import InputCache
from reference import QuantConfig

ADAPTER = "examples.my_kernel_adapter:backend"
BROKEN = "examples.my_kernel_adapter:broken_backend"


def qcase(scheme="fp8_current", shape=(64, 96), op="quantize", orientation="both", dist="normal", seed=1,
          in_dtype="bfloat16", **cfg) -> Case:
    return Case(op, QuantConfig(scheme, **cfg), shape, in_dtype=in_dtype, distribution=dist, seed=seed,
                orientation=orientation)


def by_kind(rows, kind):
    return [r for r in rows if r.get("kind") == kind]


FP8_CURRENT_CASES = [
    qcase(element="e4m3"),
    qcase(element="e5m2", in_dtype="float32", shape=(32, 48)),
    qcase(dist="special", shape=(48, 64)),
    qcase(dist="ties", in_dtype="float16", orientation="rowwise"),
    qcase(dist="outliers", shape=(3, 5, 32), orientation="colwise"),
]


@pytest.mark.parametrize("case", FP8_CURRENT_CASES, ids=lambda c: c.id)
def test_example_adapter_passes_fp8_current_cases_through_the_runner(case):
    rows = runner.run_case(case, ADAPTER, "cpu")
    conf = by_kind(rows, "conformance")
    assert conf and all(r["status"] == "pass" for r in conf), [(r["tensor"], r["reason"]) for r in conf]
    tensors = {r["tensor"] for r in conf}
    rw, cw = ops.copies(case.orientation)
    assert ("rowwise_data" in tensors) == rw and ("colwise_data" in tensors) == cw
    acc = by_kind(rows, "accuracy")
    assert {r["tensor"] for r in acc} == {f"accuracy_{o}" for o, on in (("rowwise", rw), ("colwise", cw)) if on}
    assert all(r["status"] == "info" and r["backend"] == "my_kernel" for r in acc)


def test_broken_adapter_fails_with_a_located_mismatch_on_the_amax_3_vector():
    case = qcase(shape=(2, 32), in_dtype="float32", orientation="rowwise")
    x = torch.linspace(-1.0, 1.0, 64, dtype=torch.float32).reshape(2, 32)
    x[1, 7] = 3.0  # docs/numerics.md §8: amax 3 -> s = 0x43155555; reciprocal-multiply gives 0x43155556
    rows = runner.run_case(case, BROKEN, "cpu", inputs={"x": x})
    assert runner.case_verdict(rows) == "fail"
    scale = next(r for r in rows if r["tensor"] == "rowwise_scale")
    assert scale["status"] == "fail" and scale["n_mismatch"] == 1
    assert scale["first_mismatch"] is not None
    assert "rowwise_scale" in scale["reason"] and "1 of" in scale["reason"]
    # The same inputs through the correct adapter pass.
    assert runner.case_verdict(runner.run_case(case, ADAPTER, "cpu", inputs={"x": x})) == "pass"


def test_reference_backend_gets_accuracy_rows_with_sqnr():
    case = qcase(scheme="mxfp8", shape=(64, 64), orientation="both")
    rows = runner.run_case(case, "reference", "cpu")
    assert all(r["status"] == "pass" for r in by_kind(rows, "conformance"))
    acc = {r["tensor"]: r for r in by_kind(rows, "accuracy")}
    assert set(acc) == {"accuracy_rowwise", "accuracy_colwise"}
    for r in acc.values():
        # E4M3 keeps 3 mantissa bits: SQNR of normal data is around 30 dB, far above 20 and below 60.
        assert 20.0 < r["sqnr_db"] < 60.0 and r["n"] == 64 * 64 and r["max_abs"] > 0


def test_unsupported_becomes_a_skip_row_with_the_reason():
    rows = runner.run_case(qcase(scheme="nvfp4", shape=(32, 32), orientation="rowwise"), "torch", "cpu")
    assert len(rows) == 1 and rows[0]["status"] == "skip" and "nvfp4" in rows[0]["reason"]
    rows = runner.run_case(qcase(), "native", "cpu")
    assert len(rows) == 1 and rows[0]["status"] == "skip" and "CUDA" in rows[0]["reason"]


class _Flaky:
    """Raises on one shape, delegates to the reference otherwise."""

    name = "flaky"

    def supports(self, op, config, device):
        return True, ""

    def quantize(self, x, config, **kw):
        if x.shape[0] == 64:
            raise RuntimeError("kernel launch failed on purpose")
        return reference.quantize(x, config, **kw)


def test_a_backend_raising_on_one_case_gives_an_error_row_and_the_sweep_continues(tmp_path):
    cases = [qcase(shape=(64, 32), orientation="rowwise"), qcase(shape=(32, 32), orientation="rowwise")]
    with report.ReportWriter(tmp_path, {}) as w:
        res = runner.sweep(cases, [_Flaky()], device="cpu", writer=w, out_dir=tmp_path)
    assert res.counts["error"] == 1 and res.counts["pass"] == 1
    df = report.read_results(tmp_path)
    err = df[df["status"] == "error"]
    assert err["case_id"].tolist() == [cases[0].id]
    assert "RuntimeError: kernel launch failed on purpose" in err["reason"].iloc[0]
    assert set(df["case_id"]) == {c.id for c in cases}
    assert (tmp_path / "failures" / runner.safe_name(cases[0].id) / "repro.sh").exists()


class _FlipByte:
    """The reference with one data byte flipped: always a located failure at element (0, 0)."""

    name = "flip_byte"

    def supports(self, op, config, device):
        return True, ""

    def quantize(self, x, config, **kw):
        q = reference.quantize(x, config, **kw)
        q.rowwise_data[0, 0] ^= 1
        return q


class _HeapEnvProbe:
    """Skips every case, saying what its process's heap-policy variables are."""

    name = "heap_env_probe"

    def supports(self, op, config, device):
        import os

        return False, " ".join(f"{k}={os.environ.get(k)}" for k in sorted(forkserver.WORKER_HEAP_ENV))

    def quantize(self, x, config, **kw):  # never called: every case is skipped
        raise AssertionError("unreachable")


def test_sweep_workers_start_with_the_heap_policy_and_the_users_values_win(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    with report.ReportWriter(tmp_path, {}) as w:
        pool.sweep_parallel([qcase(shape=(16, 32))], ["tests.unit.test_runner:_HeapEnvProbe"], 1, device="cpu",
                              writer=w)
    (reason,) = report.read_results(tmp_path)["reason"]
    assert reason == "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=12345"
    assert "MALLOC_MMAP_MAX_" not in os.environ and os.environ["MALLOC_TRIM_THRESHOLD_"] == "12345"  # parent restored


def test_failing_case_saves_inputs_and_a_repro_script(tmp_path):
    spec = "tests.unit.test_runner:_FlipByte"
    case = qcase(shape=(16, 32), in_dtype="float32", orientation="rowwise", seed=5)
    with report.ReportWriter(tmp_path, {}) as w:
        res = runner.sweep([case], [get_backend(spec)], device="cpu", writer=w, out_dir=tmp_path)
    assert res.failures == [(case.id, "flip_byte")]
    df = report.read_results(tmp_path)  # written before anything looked at the verdict
    data = df[df["tensor"] == "rowwise_data"].iloc[0]
    assert data["status"] == "fail" and data["n_mismatch"] == 1 and data["first_mismatch"]
    d = tmp_path / "failures" / runner.safe_name(case.id)
    saved = torch.load(d / "inputs.pt", weights_only=False)
    assert torch.equal(saved["x"], runner.prepare(case).inputs["x"])
    script = (d / "repro.sh").read_text()
    assert f"python -m harness repro {case.id} --backend {spec}" in script
    assert len(list(d.glob("rows.*.jsonl"))) == 1


def test_fp8_delayed_compares_the_state_after_a_step():
    case = qcase(scheme="fp8_delayed", shape=(32, 64), orientation="both", amax_history_len=4)
    rows = runner.run_case(case, "torch", "cpu")
    states = {r["tensor"]: r for r in rows if r["tensor"].startswith("state_")}
    assert set(states) == {"state_scale", "state_history"}
    assert all(r["status"] == "pass" and r["n_mismatch"] == 0 for r in states.values())
    assert states["state_history"]["n"] == 4
    assert runner.case_verdict(rows) == "pass"


def test_dequantize_case_compares_output_bits_and_reports_accuracy():
    case = Case("dequantize", QuantConfig("fp8_current", element="e5m2"), (32, 64), in_dtype="bfloat16",
                distribution="normal", seed=2, orientation="both", out_dtype="bfloat16")
    rows = runner.run_case(case, "torch", "cpu")
    conf = {r["tensor"]: r for r in by_kind(rows, "conformance")}
    assert set(conf) == {"dequant_rowwise", "dequant_colwise"}
    assert all(r["status"] == "pass" for r in conf.values())
    assert {r["tensor"] for r in by_kind(rows, "accuracy")} == {"accuracy_rowwise", "accuracy_colwise"}


def test_gemm_case_on_the_reference_gives_a_conformance_and_an_accuracy_row():
    case = Case("gemm", QuantConfig("fp8_current"), (32, 48, 64), in_dtype="bfloat16", distribution="normal",
                seed=3, layout="NN", out_dtype="float32")
    rows = runner.run_case(case, "reference", "cpu")
    assert [r["kind"] for r in rows] == ["conformance", "accuracy"], rows
    assert rows[0]["status"] == "pass"
    acc = rows[1]
    assert acc["tensor"] == "accuracy_out" and acc["n"] == 32 * 48 and math.isfinite(acc["sqnr_db"])


def test_gemm_truth_follows_each_layout():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(5, 6, generator=g)
    expect = a.double() @ b.double().t()  # [M=4, N=5]
    for layout, inputs in (("TN", {"a": a, "b": b}), ("NN", {"a": a, "b": b.t()}), ("NT", {"a": a.t(), "b": b.t()})):
        case = Case("gemm", QuantConfig("fp8_current"), (4, 5, 6), layout=layout)
        assert torch.allclose(runner.gemm_truth(case, inputs), expect, rtol=0, atol=1e-12), layout


def test_inputs_that_break_the_golden_run_give_an_error_row_not_an_exception():
    rows = runner.run_case(qcase(), "reference", "cpu", inputs={"not_x": torch.zeros(1)})
    assert len(rows) == 1 and rows[0]["status"] == "error" and "golden reference raised KeyError" in rows[0]["reason"]


def test_rows_carry_every_case_column_and_only_report_columns():
    rows = runner.run_case(qcase(shape=(32, 32), orientation="rowwise"), "reference", "cpu")
    for r in rows:
        assert set(r) <= set(report.COLUMNS)
        report.normalize_row(r)
        assert r["scheme"] == "fp8_current" and r["shape"] == "32x32" and r["in_dtype"] == "bfloat16"
        assert r["device"] == "cpu" and r["wall_ms"] is not None


def test_rows_time_the_inputs_and_golden_once_per_case_and_each_backend_apart(monkeypatch):
    real_prepare = runner.prepare

    def slow_prepare(*a, **k):
        time.sleep(1.0)  # inside prepare, before the inputs: counted in neither inputs_ms nor check_ms
        return real_prepare(*a, **k)

    monkeypatch.setattr(runner, "prepare", slow_prepare)
    case = qcase(shape=(32, 32), orientation="rowwise", dist="ties")
    by = runner.run_case_backends(case, [get_backend("reference"), get_backend("torch")], "cpu")
    ref, tor = by["reference"], by["torch"]
    assert len({(r["inputs_ms"], r["golden_ms"]) for r in ref + tor}) == 1  # one golden, shared
    assert all(r["inputs_ms"] > 0 and r["golden_ms"] > 0 for r in ref)
    assert all(0 < r["check_ms"] < 1000 for r in ref + tor)  # the 1 s sleep is not a backend's time
    skip = runner.run_case(qcase(scheme="mxfp8", shape=(32, 32)), "torch", "cpu")  # skipped before any golden
    assert skip[0]["status"] == "skip" and skip[0]["check_ms"] >= 0 and "golden_ms" not in skip[0]


def test_exact_gemm_mode_follows_numerics_section_6_for_accumulate():
    from harness.cases import Case
    from harness.ops import is_exact_gemm as _is_exact_gemm

    base = "gemm-NT-{s}-bf16-128x64x256-out_bf16{acc}-{dist}-s0"
    for scheme in ("fp8_current-e4m3", "fp8_block-e4m3-1x128", "mxfp8-e4m3-1x32", "nvfp4-e2m1-1x16"):
        assert _is_exact_gemm(Case.from_id(base.format(s=scheme, acc="", dist="exact_representable")))
        assert not _is_exact_gemm(Case.from_id(base.format(s=scheme, acc="", dist="normal")))
    # With C: only the schemes whose accumulate order docs/numerics.md §6 defines stay bit-exact.
    assert _is_exact_gemm(Case.from_id(base.format(s="fp8_block-e4m3-1x128", acc="-acc", dist="exact_representable")))
    assert _is_exact_gemm(Case.from_id(base.format(s="nvfp4-e2m1-1x16", acc="-acc", dist="exact_representable")))
    assert not _is_exact_gemm(Case.from_id(base.format(s="fp8_current-e4m3", acc="-acc", dist="exact_representable")))
    assert not _is_exact_gemm(Case.from_id(base.format(s="mxfp8-e4m3-1x32", acc="-acc", dist="exact_representable")))


def test_golden_device_is_the_candidates_or_the_cpu_and_rejects_other_values():
    assert runner.golden_device("cpu") == torch.device("cpu")
    assert runner.golden_device("cuda:1", "cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="golden='gpu' is invalid"):
        runner.golden_device("cpu", "gpu")
    with pytest.raises(ValueError, match="golden='gpu' is invalid"):
        runner.run_case(qcase(), "reference", "cpu", golden="gpu")
    g = runner.prepare(qcase(shape=(32, 32)), device="cpu")
    assert g.device == torch.device("cpu") and g.on_device["x"] is g.inputs["x"]


def test_the_auto_golden_keeps_small_cases_on_the_cpu_and_large_ones_on_the_candidates_device():
    from harness import cases as harness_cases
    from harness import golden as golden_mod
    from harness import pytest_plugin

    cuda1 = torch.device("cuda", 1)
    limit = golden_mod.AUTO_CPU_WORK
    small, large = qcase(shape=(1024, 1024)), qcase(shape=(1024, 1040))
    assert math.prod(small.shape) == limit["quantize"] < math.prod(large.shape)
    assert runner.golden_device("cuda:1", "auto", small) == torch.device("cpu")
    assert runner.golden_device("cuda:1", "auto", large) == cuda1
    gemm = Case("gemm", QuantConfig("mxfp8"), (256, 256, 1024), in_dtype="bfloat16", layout="TN")
    assert math.prod(gemm.shape) == limit["gemm"] and runner.golden_device("cuda:1", "auto", gemm).type == "cpu"
    assert runner.golden_device("cuda:1", "auto", qcase(shape=(2048, 2048))) == cuda1
    assert runner.golden_device("cuda:1", "auto") == cuda1  # no case: the candidate's device
    assert runner.golden_device("cuda:1", "same", small) == cuda1
    assert set(limit) == set(harness_cases.OPS)  # every op has a limit
    # The CLI and the plugin offer the same choices with the same default.
    assert (pytest_plugin.GOLDEN_DEVICES, pytest_plugin.DEFAULT_GOLDEN) == (golden_mod.GOLDEN_DEVICES,
                                                                           golden_mod.DEFAULT_GOLDEN)
    from harness.cli import build_parser

    args = build_parser().parse_args(["run", "--tier", "smoke"])
    assert args.golden_device == "auto"



def test_consecutive_cases_with_one_input_key_share_a_generation_but_not_tensors(monkeypatch):
    from harness import inputs

    calls = []
    real = inputs.generate
    monkeypatch.setattr(inputs, "generate", lambda case, device="cpu": calls.append(case.id) or real(case, device))
    cache = InputCache()
    a, b = qcase(element="e4m3"), qcase(scheme="mxfp8", shape=(64, 96))  # normal: config-free, same key
    c = qcase(dist="ties")  # structured: its own key
    assert inputs.input_key(a) == inputs.input_key(b) != inputs.input_key(c)
    cpu = torch.device("cpu")
    xa, on_a = cache.inputs(a, cpu)
    assert on_a["x"] is xa["x"]  # on the CPU the golden's inputs are the case's own copies
    xa["x"].fill_(7.0)  # a backend scribbling on its input must not reach the next case
    xb = cache.inputs(b, cpu)[0]["x"]
    cache.inputs(c, cpu)
    assert calls == [a.id, c.id]
    assert torch.equal(xb, real(b)["x"]) and not torch.equal(xb, xa["x"])


def test_off_the_cpu_a_group_generates_its_inputs_once_on_the_device_and_each_case_gets_fresh_copies(monkeypatch):
    # Inputs are generated on the golden's device (harness.inputs.generate gives the same bytes on every
    # device) and copied to the CPU once per group. "meta" stands in for a GPU; the stand-in generation
    # records the device it is asked for and returns the real (CPU) tensors.
    from harness import inputs

    calls = []
    real = inputs.generate
    monkeypatch.setattr(inputs, "generate", lambda case, device="cpu": calls.append((case.id, device)) or real(case))
    cache = InputCache()
    meta = torch.device("meta")
    a, b = qcase(element="e4m3"), qcase(element="e5m2")  # one input key
    cpu_a, on_a = cache.inputs(a, meta)
    cpu_b, on_b = cache.inputs(b, meta)
    assert calls == [(a.id, meta)]  # one generation for the group, on the golden's device
    assert on_a["x"] is not on_b["x"] and torch.equal(on_a["x"], on_b["x"])  # fresh copies per case
    assert cpu_a["x"] is cpu_b["x"] is cache.cpu["x"]  # kept tensors, only read
    assert torch.equal(cpu_a["x"], real(a)["x"])
    g = runner.prepare(b, device=meta, cache=cache)
    assert g.inputs["x"] is cpu_a["x"] and g.on_device["x"] is not cache.moved[meta]["x"]


def test_sweeps_run_cases_of_one_input_key_back_to_back_largest_groups_first():
    a1, t1, a2 = qcase(element="e4m3"), qcase(dist="ties"), qcase(element="e5m2")
    u1, big = qcase(dist="uniform"), qcase(dist="special", shape=(256, 256))
    groups = runner.grouped([(a1, ["r"]), (t1, ["r"]), (a2, ["r"]), (u1, ["r"]), (big, ["r"])])
    # big (65536 elements) > a1 + a2 (2 x 6144) > t1 = u1 (6144 each, in order of first appearance)
    assert [[c.id for c, _ in g] for g in groups] == [[big.id], [a1.id, a2.id], [t1.id], [u1.id]]


# ---- isolation of backends from each other and from the golden -------------------------------------


def test_a_backend_writing_into_its_input_is_an_error_and_the_next_backend_is_not_affected():
    from tests import misbehaving

    case = qcase(shape=(16, 32), in_dtype="float32", orientation="rowwise")
    rows = runner.run_case_backends(case, [misbehaving.mutate, get_backend("reference")], "cpu")
    (bad,) = rows["mutate"]
    assert bad["status"] == "error" and bad["reason"] == "mutate mutated its input (x)"
    ref = rows["reference"]
    assert all(r["status"] in ("pass", "info") for r in ref)
    # The golden kept the unscaled input: the reference's accuracy is that of a clean run.
    clean = runner.run_case(case, "reference", "cpu")
    assert [r["sqnr_db"] for r in ref] == [r["sqnr_db"] for r in clean] and math.isfinite(ref[-1]["sqnr_db"])


@pytest.mark.parametrize("op", ["dequantize", "gemm"])
def test_quantized_operands_handed_to_a_backend_are_private_copies(op):
    """dequantize and gemm get QuantizedTensor copies: a backend scribbling on one is caught, the golden kept."""

    class Scribbler:
        name = "scribbler"

        def supports(self, op, config, device):
            return True, ""

        def dequantize(self, q, orientation, dtype):
            out = reference.dequantize(q, orientation, dtype)
            q.rowwise_data.zero_()
            return out

        def gemm(self, a, b, **kw):
            out = reference.gemm(a, b, **kw)
            b.rowwise_scale.zero_()
            return out

    if op == "dequantize":
        case = Case("dequantize", QuantConfig("mxfp8"), (32, 64), in_dtype="float32", orientation="rowwise")
        which = "q"
    else:
        case = Case.from_id("gemm-TN-mxfp8-e4m3-1x32-bf16-32x32x64-out_bf16-normal-s0")
        which = "b"
    rows = runner.run_case_backends(case, [Scribbler(), get_backend("reference")], "cpu")
    assert [(r["status"], r["reason"]) for r in rows["scribbler"]] == [
        ("error", f"scribbler mutated its input ({which})")]
    assert all(r["status"] in ("pass", "info") for r in rows["reference"])


@pytest.mark.parametrize("flip, words", [
    (lambda: torch.set_flush_denormal(True), "flush_denormal: False -> True"),
    (lambda: torch.set_default_dtype(torch.float64), "default_dtype: torch.float32 -> torch.float64"),
    (lambda: torch.set_float32_matmul_precision("medium"), "float32_matmul_precision: highest -> medium"),
    (lambda: torch.use_deterministic_algorithms(True), "deterministic_algorithms: (False, False) -> (True, False)"),
])
def test_a_backend_changing_numerics_state_is_an_error_and_the_state_is_restored(flip, words):
    from harness import numerics_state

    class Flipper:
        name = "flipper"

        def supports(self, op, config, device):
            return True, ""

        def quantize(self, x, config, **kw):
            flip()
            return reference.quantize(x, config, **kw)

    before = numerics_state.snapshot()
    case = qcase(shape=(16, 32), in_dtype="float32", orientation="rowwise")
    rows = runner.run_case_backends(case, [Flipper(), get_backend("reference")], "cpu")
    assert numerics_state.snapshot() == before
    (bad,) = rows["flipper"]
    assert bad["status"] == "error" and words in bad["reason"] and bad["reason"].endswith("restored")
    assert all(r["status"] in ("pass", "info") for r in rows["reference"])
    assert torch.tensor([2.0**-149]).mul(1.0).item() == 2.0**-149  # subnormals survive again


def test_system_exit_in_a_backend_is_an_error_row_not_the_end_of_the_process():
    from tests import misbehaving

    rows = runner.run_case(qcase(shape=(16, 32)), misbehaving.system_exit, "cpu")
    assert [(r["status"], r["reason"]) for r in rows] == [("error", "crash: exit code 4 (SystemExit raised)")]


def test_crash_text_names_the_signal_or_the_exit_code():
    assert pool.crash_text(-11) == "crash: signal SIGSEGV (-11)"
    assert pool.crash_text(-9) == "crash: signal SIGKILL (-9)"
    assert pool.crash_text(3) == "crash: exit code 3"


def test_a_worker_whose_cuda_context_died_records_the_pair_then_retires(tmp_path, monkeypatch):
    """pool.run_items in this process: after the pair, a dead context makes the worker log `retire` and exit."""

    class Retired(Exception):
        pass

    def fake_exit(code):
        raise Retired(code)

    monkeypatch.setattr(pool, "_WORKER", pool._Worker(0, [], {}, "cpu", "same"))
    monkeypatch.setattr(pool, "context_dead", lambda device: "RuntimeError: CUDA error: an illegal memory access")
    monkeypatch.setattr(pool.os, "_exit", fake_exit)
    log = tmp_path / "task.log"
    a, b = qcase(shape=(16, 32)), qcase(shape=(32, 32))
    with pytest.raises(Retired, match=str(pool.RETIRE_EXIT)):
        pool.run_items([(a, ["reference"]), (b, ["reference"])], str(log), {"reference": "reference"}, "same")
    t = pool._Task([(a, ["reference"]), (b, ["reference"])], log)
    sweep = pool.PoolSweep([a, b], ["reference"], 1, device="cpu")
    sweep.by_id = {a.id: a, b.id: b}
    sweep._harvest(t)
    assert t.done == {(a.id, "reference")} and t.retired and t.current is None  # b never started
    assert t.remaining() == [(b, ["reference"])] and sweep.result.counts["pass"] == 1


_OUTSIDE_ADAPTER = '''
import reference


class Flip:
    name = "outside_flip"

    def supports(self, case, device):
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        q = reference.quantize(x, config, rowwise=rowwise, colwise=colwise)
        q.rowwise_data[0, 0] ^= 1
        return q
'''


def test_repro_sh_runs_from_any_directory_and_finds_an_adapter_outside_the_repository(tmp_path, monkeypatch):
    """An adapter in the user's own directory (importable only from there) fails a case; its repro.sh,
    started from another directory with a bare PYTHONPATH, reloads the adapter and reproduces the failure."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from harness import artefacts, meta  # noqa: PLC0415

    user = tmp_path / "user_project"
    (user / "kernels").mkdir(parents=True)
    (user / "kernels" / "__init__.py").write_text("")
    (user / "kernels" / "outside.py").write_text(_OUTSIDE_ADAPTER)
    monkeypatch.syspath_prepend(str(user))
    spec = "kernels.outside:Flip"
    assert artefacts.import_root(spec) == user.resolve()
    case = qcase(shape=(16, 32), in_dtype="float32", orientation="rowwise", seed=5)
    out = tmp_path / "out"
    with report.ReportWriter(out, {}) as w:
        runner.sweep([case], [get_backend(spec)], device="cpu", writer=w, out_dir=out)
    script = out / "failures" / runner.safe_name(case.id) / "repro.sh"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    proc = subprocess.run(["sh", str(script)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert "outside_flip" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "rowwise_data" in proc.stdout + proc.stderr and proc.returncode == 1
    info = meta.adapter_info(get_backend(spec))
    assert info["module"] == "kernels.outside" and info["spec"] == spec and info["name"] == "outside_flip"


def test_a_replacement_worker_takes_the_gpu_of_the_worker_it_replaces(monkeypatch):
    """harness.pool.claim_slot: slot i runs on GPU i mod (visible GPUs); a worker started after a crash takes the
    dead worker's slot, so 4 workers on GPUs "0,1" stay two per GPU (a plain start counter would give 3 + 1)."""
    import multiprocessing as mp
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process
    pids = mp.get_context("spawn").Array("q", 4)
    pids[:] = [os.getpid(), dead.pid, os.getppid(), 0]
    assert pool.claim_slot(pids) == 1 and pids[1] == os.getpid()
    assert pool.claim_slot(pids) == 3  # the never-used slot next
    assert pool.claim_slot(pids) == 4  # none free: a slot of its own
    gpus = ["0", "1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pool._Worker(7, gpus, {}, "cuda", "same", slot=1)  # the 8th start, in slot 1
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert pool._Worker(8, gpus, {}, "cuda", "same", slot=2).name == "w8"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_a_gpu_worker_asks_for_one_hardware_queue_unless_the_environment_chose(monkeypatch):
    """harness.pool.WORKER_CUDA_CONNECTIONS: set before the worker's context exists (issue #19: halves the
    creation and teardown of 24 contexts); a value the user exported stands; a CPU worker leaves it alone."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    pool._Worker(0, [], {}, "cpu", "same")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ
    pool._Worker(0, ["0", "1"], {}, "cuda", "same")
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == pool.WORKER_CUDA_CONNECTIONS == "1"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    pool._Worker(1, ["0", "1"], {}, "cuda", "same")
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


def test_a_pool_sweep_hands_pebble_at_most_its_window_of_tasks_and_records_every_pair(monkeypatch):
    """Groups wait in this process, largest first, and enter pebble TASKS_PER_WORKER per worker at a time."""
    cases = [qcase(shape=(16, 16 * (i + 1)), seed=i) for i in range(7)]  # 7 input groups
    in_pebble: list[int] = []

    class Watched(pool.PoolSweep):
        def _new_task(self, p, items, deaths=0):
            t = super()._new_task(p, items, deaths)
            in_pebble.append(sum(not f.done() for f in self._futures) + 1)
            self._futures.append(t.future)
            return t

    monkeypatch.setattr(pool, "TASKS_PER_WORKER", 2)
    sweep = Watched(cases, ["reference"], 1, device="cpu")
    sweep._futures = []
    result = sweep.run()
    assert result.counts == {"pass": 7, "fail": 0, "skip": 0, "error": 0}
    assert len(in_pebble) == 7 and max(in_pebble) == 2  # one running, one queued; never all 7
    assert [len(items) for items in runner.grouped([(c, ["reference"]) for c in cases])] == [1] * 7


def test_a_worker_pool_starts_its_workers_before_the_sweep_and_the_sweep_ends_them():
    """harness.pool.WorkerPool: `harness run` starts the workers before it selects the cases; the sweep given
    the pool runs its pairs there (the backend specs travel with each task) and ends the workers."""
    import multiprocessing as mp

    before = {p.pid for p in mp.active_children()}
    workers = pool.WorkerPool(2, "cpu").start()
    started = {p.pid for p in mp.active_children()} - before
    assert len(started) == 2  # both running before any sweep exists
    with pytest.raises(ValueError, match="given WorkerPool has 2 workers"):
        pool.PoolSweep([qcase(shape=(16, 32))], ["reference"], 3, device="cpu", workers=workers)
    cases = [qcase(shape=(16, 32), seed=i) for i in range(3)]
    result = pool.PoolSweep(cases, ["reference"], 2, device="cpu", workers=workers).run()
    assert result.counts == {"pass": 3, "fail": 0, "skip": 0, "error": 0}
    # The sweep told the workers to end and left the waiting to the pool's owner (harness run: after its report).
    assert workers.pool is not None
    deadline = time.monotonic() + 60
    while started & {p.pid for p in mp.active_children()} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not started & {p.pid for p in mp.active_children()}  # they exited with nobody waiting
    workers.stop()
    assert workers.pool is None


def test_a_worker_pool_started_without_waiting_returns_at_once_and_reports_its_failure(monkeypatch):
    """start(wait=False) (harness run, while the forkserver may still be importing) returns before the workers
    exist; the next start() waits for them; a failure to start is raised there; stop() while starting waits
    for the start and then ends the workers."""
    import multiprocessing as mp
    import threading

    before = {p.pid for p in mp.active_children()}
    go = threading.Event()
    real = pool.WorkerPool._start_now
    monkeypatch.setattr(pool.WorkerPool, "_start_now", lambda self: (go.wait(60), real(self)))
    workers = pool.WorkerPool(2, "cpu")
    assert workers.start(wait=False) is workers and workers.pool is None
    go.set()
    assert workers.start().pool is not None
    assert len({p.pid for p in mp.active_children()} - before) == 2
    workers.stop()
    assert workers.pool is None and not {p.pid for p in mp.active_children()} - before

    go.clear()
    slow = pool.WorkerPool(1, "cpu").start(wait=False)
    threading.Timer(0.2, go.set).start()
    slow.stop()  # waits for the start, then ends the worker
    assert slow.pool is None and not {p.pid for p in mp.active_children()} - before

    def fail(self):
        raise OSError("no forkserver")

    monkeypatch.setattr(pool.WorkerPool, "_start_now", fail)
    broken = pool.WorkerPool(1, "cpu").start(wait=False)
    with pytest.raises(OSError, match="no forkserver"):
        broken.start()


def test_a_worker_pool_left_unused_is_stopped_on_leaving_its_block():
    import multiprocessing as mp

    before = {p.pid for p in mp.active_children()}
    with pool.WorkerPool(1, "cpu") as workers:
        workers.start()
        assert len({p.pid for p in mp.active_children()} - before) == 1
    assert workers.pool is None and not {p.pid for p in mp.active_children()} - before


_KILLED_PARENT = '''
import multiprocessing as mp, os, signal, time
from multiprocessing import forkserver
from harness import forkserver as fs, meta, pool
if __name__ == "__main__":
    fs.start()
    w = pool.WorkerPool(2, "cpu").start()
    probe = meta.EnvironmentProbe(fs.context())  # never read: harness run killed while it probes
    w.pool.schedule(time.sleep, args=(0.1,)).result(timeout=120)  # a worker ran a task: both are up
    pids = [p.pid for p in mp.active_children()] + [forkserver._forkserver._forkserver_pid]
    print(" ".join(str(p) for p in pids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
'''


def test_workers_probe_and_forkserver_end_when_the_sweep_process_is_killed(tmp_path):
    """A SIGKILLed `harness run` leaves no process behind: the workers end on their channel's EOF (or with the
    forkserver, PR_SET_PDEATHSIG), the environment probe after its one answer, and then the forkserver, whose
    alive pipe every child of it holds (a process pool's idle worker kept it, and the forkserver, forever)."""
    import subprocess

    script = tmp_path / "killed.py"
    script.write_text(_KILLED_PARENT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) >= 3  # 2 workers (and the probe unless it has answered), the forkserver
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(pool._alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if pool._alive(p)]


def test_interleaved_spreads_the_cpu_golden_groups_among_the_gpu_ones_by_their_share_of_estimated_time():
    """harness.runner.interleaved: each kind keeps its largest-first order, every group is handed out once, the
    GPU-bound kind goes first, and at every point the two kinds' shares of their estimated time (Case.work **
    CASE_COST_POWER per case) differ by at most the largest share of one group."""
    gpu = [[(qcase(shape=(1024, 1024 * (9 - i)), seed=i), ["n"])] for i in range(8)]
    cpu = [[(qcase(shape=(16, 16 * (41 - i)), seed=100 + i), ["n"])] for i in range(40)]
    groups = runner.grouped([item for g in gpu + cpu for item in g])
    small = {id(g) for g in groups if g[0][0].work <= 16 * 16 * 41}
    out = runner.interleaved(groups, lambda g: id(g) in small)
    assert sorted(map(id, out)) == sorted(map(id, groups))
    assert [g for g in out if id(g) in small] == [g for g in groups if id(g) in small]  # order kept
    assert [g for g in out if id(g) not in small] == [g for g in groups if id(g) not in small]
    assert id(out[0]) not in small and id(out[-1]) in small

    def cost(g):
        return sum(c.work ** runner.CASE_COST_POWER for c, _ in g)

    total = {k: sum(cost(g) for g in out if (id(g) in small) == k) for k in (False, True)}
    step = max(cost(g) / total[id(g) in small] for g in out)
    done = {False: 0.0, True: 0.0}
    for g in out:
        done[id(g) in small] += cost(g)
        assert abs(done[True] / total[True] - done[False] / total[False]) <= step + 1e-12
    # largest first alone would have put all 40 CPU-golden groups after the 8 GPU-golden ones
    assert max(i for i, g in enumerate(out) if id(g) not in small) > 8
