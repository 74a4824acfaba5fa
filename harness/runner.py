"""Run cases: inputs (CPU) -> golden (reference) -> candidate (backend, its device) -> compare -> rows.

Source: DESIGN.md §5 (data flow; results recorded before any assertion; failures keep their
inputs), the issue's runner requirements. Per case and backend the rows are:
- conformance rows (kind `conformance`), one per compared tensor: candidate vs golden, exact bytes
  for quantizers and dequantizers, the tolerance table or the exact-representable mode for GEMMs;
- accuracy rows (kind `accuracy`, status `info`) for every backend, the reference included:
  the candidate's dequantized copies vs the high-precision input (the Hadamard-domain input for an
  RHT copy), or its GEMM output vs an fp64 GEMM of the high-precision operands;
- a single `skip` row (Unsupported, with its reason) or `error` row (the exception) when the
  backend cannot produce a candidate.

Where the golden runs (`golden="same"`, the default, or `"cpu"`): inputs are always drawn on the
CPU (harness.inputs); with "same" the reference then runs on the candidate's device and the
comparison and accuracy metrics are computed there, so a GPU sweep keeps its big tensors on the
GPU. The reference gives the same bits on CPU and CUDA (NUMERICS.md §0.2.8, asserted by
tests/gpu/test_reference_devices.py), except a GEMM whose fp64 sums are not exact: its golden output
is then computed on the CPU (`reference.gemm.fp64_sums_exact`), so every golden byte is the CPU's.
Accuracy metrics (fp64 sums) may differ in their last digits between devices.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import shlex
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

import reference
from reference.types import QuantizedTensor, Unsupported

from . import backends as backends_mod
from .report import FAILURES, worst_status

# The GEMM operand copies each layout consumes (interfaces: TN rowwise x rowwise, NN rowwise x
# colwise, NT colwise x colwise), as (a_rowwise, a_colwise, b_rowwise, b_colwise).
LAYOUT_COPIES = {
    "TN": (True, False, True, False),
    "NN": (True, False, False, True),
    "NT": (False, True, False, True),
}
# Distributions whose GEMM inputs are exactly representable (NUMERICS.md §6): compared bit for bit.
EXACT_GEMM_DISTRIBUTIONS = ("exact_representable",)
# NUMERICS: §6 - accumulating into C has a defined order only for fp8_block (RN_out(C + RN_out(Y)))
# and nvfp4 (RN_out(C + Y) in fp32); for the others it is "tolerance only" (cuBLASLt's FP8 epilogue,
# for one, rounds Y to the output type before adding C).
EXACT_ACCUMULATE_SCHEMES = ("fp8_block", "nvfp4")
REPO_ROOT = Path(__file__).resolve().parent.parent
# Where the golden reference runs: on the candidate's device, or always on the CPU.
GOLDEN_DEVICES = ("same", "cpu")
# The B operand of a stochastic GEMM draws SR bits from stream + 2 (A uses stream, stream + 1).
B_STREAM_OFFSET = 2


def _cases_mod():
    from . import cases  # noqa: PLC0415 - harness core module, imported when used

    return cases


def _inputs_mod():
    from . import inputs  # noqa: PLC0415

    return inputs


def _compare_mod():
    from . import compare  # noqa: PLC0415

    return compare


# ----------------------------------------------------------------------------------------------
# Row helpers
# ----------------------------------------------------------------------------------------------


def _copies(orientation: str | None) -> tuple[bool, bool]:
    o = orientation or "rowwise"
    if o not in ("rowwise", "colwise", "both"):
        raise ValueError(f"orientation={o!r} is invalid: expected rowwise, colwise or both")
    return o in ("rowwise", "both"), o in ("colwise", "both")


def case_columns(case: Any) -> dict:
    """The report columns that describe the case itself (DESIGN.md §2 spellings)."""
    cfg = case.config
    b_cfg = getattr(case, "b_config", None)
    return {
        "case_id": case.id,
        "scheme": cfg.scheme,
        "op": case.op,
        "element": cfg.element,
        "tile": "" if cfg.tile is None else f"{cfg.tile[0]}x{cfg.tile[1]}",
        "rht": cfg.rht,
        "stochastic": cfg.stochastic,
        "pow2_scales": cfg.pow2_scales,
        "e8m0_rule": cfg.e8m0_rule,
        "orientation": getattr(case, "orientation", "") or "",
        "shape": "x".join(str(int(d)) for d in case.shape),
        "in_dtype": case.in_dtype,
        "out_dtype": getattr(case, "out_dtype", None) or "",
        "layout": getattr(case, "layout", None) or "",
        "b_config": "" if b_cfg is None else b_cfg.id,
        "accumulate": bool(getattr(case, "accumulate", False)),
        "bias": bool(getattr(case, "bias", False)),
        "distribution": case.distribution,
        "seed": case.seed,
    }


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_mismatch(tr: Any) -> str:
    """One line for a failing TensorResult: counts, classes and the first mismatch's location."""
    parts = [f"{tr.tensor}: {tr.n_mismatch} of {tr.n} differ"]
    if getattr(tr, "mismatch_classes", None):
        parts.append("classes " + ", ".join(f"{k}={v}" for k, v in sorted(tr.mismatch_classes.items())))
    fm = getattr(tr, "first_mismatch", None)
    if fm:
        loc = {k: fm[k] for k in ("index", "row", "col", "element", "block", "tile", "location") if k in fm}
        parts.append("first at " + json.dumps(loc if loc else fm, default=str, sort_keys=True))
    detail = getattr(tr, "detail", None)
    if isinstance(detail, str) and detail:
        parts.append(detail)
    elif isinstance(detail, Mapping) and detail.get("reason"):
        parts.append(str(detail["reason"]))
    return _short("; ".join(parts))


def format_first_mismatch(fm, indent: str = "    ") -> str:
    """A located first mismatch as text: one `key: compact JSON` line per top-level field."""
    if isinstance(fm, str):
        try:
            fm = json.loads(fm)
        except ValueError:
            return indent + fm
    if not isinstance(fm, Mapping):
        return indent + json.dumps(fm, default=str)
    return "\n".join(f"{indent}{k}: {json.dumps(v, default=str)}" for k, v in fm.items())


def _num(v) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f


def result_row(base: Mapping, tr: Any, kind: str = "conformance") -> dict:
    """A report row from a compare.TensorResult."""
    n = getattr(tr, "n", None)
    nm = getattr(tr, "n_mismatch", None)
    status = tr.status
    return {
        **base,
        "tensor": tr.tensor,
        "kind": kind,
        "status": status,
        "reason": describe_mismatch(tr) if status == "fail" else "",
        "n": n,
        "n_mismatch": nm,
        "mismatch_frac": (nm / n) if (n and nm is not None) else None,
        "max_abs": _num(getattr(tr, "max_abs", None)),
        "max_rel": _num(getattr(tr, "max_rel", None)),
        "rmse": _num(getattr(tr, "rmse", None)),
        "sqnr_db": _num(getattr(tr, "sqnr_db", None)),
        "mismatch_classes": getattr(tr, "mismatch_classes", None) or {},
        "first_mismatch": getattr(tr, "first_mismatch", None),
        "ulp_hist": getattr(tr, "ulp_hist", None) or {},
    }


def accuracy_row(base: Mapping, tensor: str, approx: torch.Tensor, truth: torch.Tensor) -> dict:
    """An `info` row with compare.metrics(approx, truth) (SQNR, max abs/rel error, RMSE), on truth's device."""
    m = _compare_mod().metrics(approx, truth)
    return {
        **base,
        "tensor": tensor,
        "kind": "accuracy",
        "status": "info",
        "reason": "",
        "n": int(truth.numel()),
        **{k: _num(m.get(k)) for k in ("max_abs", "max_rel", "rmse", "sqnr_db")},
    }


def status_row(base: Mapping, status: str, reason: str, tensor: str = "case", kind: str = "conformance") -> dict:
    return {**base, "tensor": tensor, "kind": kind, "status": status, "reason": _short(reason, 1000)}


def _exc_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# ----------------------------------------------------------------------------------------------
# Golden side (computed once per case, on the golden device)
# ----------------------------------------------------------------------------------------------


def _check_golden(golden: str) -> None:
    if golden not in GOLDEN_DEVICES:
        raise ValueError(f"golden={golden!r} is invalid: expected one of {GOLDEN_DEVICES}")


def golden_device(device: str | torch.device, golden: str = "same") -> torch.device:
    """The device the golden reference runs on for a candidate on `device` (see GOLDEN_DEVICES)."""
    _check_golden(golden)
    return torch.device("cpu") if golden == "cpu" else _normalized(device)


def _normalized(device: str | torch.device) -> torch.device:
    """`device` with an explicit index for CUDA ("cuda" -> "cuda:<current>"), so devices compare equal."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


@dataclass
class Golden:
    """Inputs (CPU, as generated) and reference outputs of one case (on `device`)."""

    inputs: dict
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    on_device: dict = field(default_factory=dict)  # the inputs moved to `device`
    quantized: QuantizedTensor | None = None  # quantize / dequantize ops
    state: Any = None  # fp8_delayed AmaxHistory after the golden run
    dequantized: dict = field(default_factory=dict)  # dequantize op: orientation -> tensor
    qa: QuantizedTensor | None = None  # gemm operands
    qb: QuantizedTensor | None = None
    out: torch.Tensor | None = None  # gemm output
    truth: torch.Tensor | None = None  # gemm: fp64 GEMM of the high-precision operands
    wall_ms: float | None = None  # the reference run (golden_ms)
    inputs_ms: float | None = None  # generating or reusing the inputs and moving them (inputs_ms)
    error: str | None = None


def _sync(device: str | torch.device) -> None:
    if backends_mod.device_type(device) == "cuda":
        torch.cuda.synchronize(torch.device(device))


def _new_state(config, device):
    """A fresh fp8_delayed state (reference.per_tensor.AmaxHistory) on `device`."""
    from reference.per_tensor import AmaxHistory  # noqa: PLC0415

    return AmaxHistory(config, device=device)


def _quantize_with_state(quantize: Callable, x, config, device, rowwise, colwise, rng, update: Callable | None = None):
    """quantize(x); for fp8_delayed first one warm-up quantization and the end-of-step update (NUMERICS.md §2).

    The warm-up makes the measured quantization use a scale derived from the history (448/amax for
    e4m3) rather than the initial 1.0. `update(state)` is the backend's own fused update if it has
    one (`update_amax_history`), else the reference's `state.update()`. Returns (QuantizedTensor,
    state or None).
    """
    if config.scheme != "fp8_delayed":
        return quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=None), None
    state = _new_state(config, device)
    quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state)
    if update is not None:
        update(state)
    else:
        state.update()
    return quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state), state


def _b_rng(rng):
    if rng is None:
        return None
    seed, stream = (rng.seed, rng.stream) if hasattr(rng, "seed") else (int(rng[0]), int(rng[1]))
    return (seed, (stream + B_STREAM_OFFSET) % 2**32)


def gemm_truth(case, inputs: Mapping) -> torch.Tensor:
    """fp64 GEMM of the high-precision operands in the case's layout, plus bias and C (NUMERICS.md §6)."""
    a, b = inputs["a"].to(torch.float64), inputs["b"].to(torch.float64)
    layout = case.layout or "TN"
    if layout == "TN":  # a [M, K], b [N, K]
        y = a @ b.t()
    elif layout == "NN":  # a [M, K], b [K, N]
        y = a @ b
    elif layout == "NT":  # a [K, M], b [K, N]
        y = a.t() @ b
    else:
        raise ValueError(f"layout={layout!r} is invalid: expected TN, NN or NT")
    if inputs.get("bias") is not None:
        y = y + inputs["bias"].to(torch.float64)
    if inputs.get("c") is not None:
        y = y + inputs["c"].to(torch.float64)
    return y


def _out_dtype(case, default: torch.dtype) -> torch.dtype:
    return backends_mod.torch_dtype(getattr(case, "out_dtype", None), default)


def _gemm_golden(case, g: Golden, out_dtype: torch.dtype) -> torch.Tensor:
    """reference.gemm of the golden operands; recomputed on the CPU when its fp64 sums are not exact
    on another device (then the summation order could change the bits, NUMERICS.md §0.2.8)."""
    from reference.gemm import fp64_sums_exact  # noqa: PLC0415

    layout = case.layout or "TN"
    kw = dict(layout=layout, out_dtype=out_dtype, method="auto")
    if g.device.type == "cpu" or fp64_sums_exact(g.qa, g.qb, layout)[0]:
        return reference.gemm(g.qa, g.qb, bias=g.on_device.get("bias"), c=g.on_device.get("c"), **kw)
    return reference.gemm(g.qa.to("cpu"), g.qb.to("cpu"), bias=g.inputs.get("bias"), c=g.inputs.get("c"), **kw)


# This process's last generated inputs, [input_key, CPU inputs, {device: the inputs moved there}]:
# consecutive cases with one harness.inputs.input_key share a generation and one host-to-device
# copy (sweeps run such cases back to back, `_grouped`).
_LAST_INPUTS: list = []


def _tensor_copies(inputs: Mapping, fn: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _generate(case, device: torch.device) -> tuple[dict, dict]:
    """(inputs on the CPU, the inputs on `device`) of `case`: harness.inputs.generate(case) on the CPU,
    reusing the previous case's tensors (and their copy on `device`) when its input key is equal.

    No backend ever sees (or changes) a kept tensor: the `device` inputs are fresh copies, and on a
    CPU device the CPU inputs are those copies. Off the CPU, the CPU inputs are the kept tensors
    themselves; the harness only reads them (comparison, CPU golden fallbacks).
    """
    inputs_mod = _inputs_mod()
    key = inputs_mod.input_key(case)
    if not (_LAST_INPUTS and _LAST_INPUTS[0] == key):
        _LAST_INPUTS[:] = []  # drop the old tensors before generating the new ones
        _LAST_INPUTS[:] = [key, inputs_mod.generate(case, device="cpu"), {}]
    cpu, moved = _LAST_INPUTS[1], _LAST_INPUTS[2]
    if device.type == "cpu":
        fresh = _tensor_copies(cpu, torch.clone)
        return fresh, fresh
    if device not in moved:
        moved[device] = _tensor_copies(cpu, lambda t: t.to(device))
    return dict(cpu), _tensor_copies(moved[device], torch.clone)


def prepare(case, inputs: Mapping | None = None, device: str | torch.device = "cpu") -> Golden:
    """Generate the inputs on the CPU (unless given), move them to `device` and run the golden
    reference there; errors are kept, not raised."""
    dev = _normalized(device)
    t_in = time.perf_counter()
    try:
        if inputs is not None:
            inputs = dict(inputs)
            on_device = _tensor_copies(inputs, lambda t: t.to(dev))
        else:
            inputs, on_device = _generate(case, dev)
    except Exception as e:  # noqa: BLE001 - reported as an error row for every backend
        return Golden(inputs={}, error=f"inputs.generate raised {_exc_text(e)}")
    g = Golden(inputs=inputs, device=dev, on_device=on_device, inputs_ms=(time.perf_counter() - t_in) * 1e3)
    t0 = time.perf_counter()
    try:
        on, cfg, rng = g.on_device, case.config, inputs.get("rng")
        if case.op in ("quantize", "dequantize"):
            rw, cw = _copies(case.orientation)
            g.quantized, g.state = _quantize_with_state(reference.quantize, on["x"], cfg, g.device, rw, cw, rng)
            if case.op == "dequantize":
                dt = _out_dtype(case, torch.float32)
                for o in ("rowwise", "colwise"):
                    if g.quantized.has(o):
                        g.dequantized[o] = reference.dequantize(g.quantized, o, dt)
        elif case.op == "gemm":
            a_rw, a_cw, b_rw, b_cw = LAYOUT_COPIES[case.layout or "TN"]
            b_cfg = case.b_config or cfg
            g.qa = reference.quantize(on["a"], cfg, rowwise=a_rw, colwise=a_cw, rng=rng)
            g.qb = reference.quantize(on["b"], b_cfg, rowwise=b_rw, colwise=b_cw, rng=_b_rng(rng))
            g.out = _gemm_golden(case, g, _out_dtype(case, torch.bfloat16))
            g.truth = gemm_truth(case, on)
        else:
            raise ValueError(f"case op {case.op!r} is invalid: expected quantize, dequantize or gemm")
        _sync(g.device)  # golden_ms covers the device work
    except Exception as e:  # noqa: BLE001
        g.error = f"golden reference raised {_exc_text(e)}"
    g.wall_ms = (time.perf_counter() - t0) * 1e3
    return g


# ----------------------------------------------------------------------------------------------
# Candidate side
# ----------------------------------------------------------------------------------------------


def _accuracy_truth(case, x: torch.Tensor, orientation: str) -> torch.Tensor:
    """The high-precision values a copy approximates, as [M, K] (RHT copies: RHT(X^T)^T, NUMERICS.md §5.6)."""
    x2d = x.reshape(-1, x.shape[-1])
    if orientation == "colwise" and case.config.rht:
        from reference import hadamard  # noqa: PLC0415

        return hadamard.rht_transposed(x2d).t().to(torch.float32)
    return x2d.to(torch.float32)


def _state_rows(base: Mapping, golden_state, cand_state) -> list[dict]:
    """Exact comparison of the fp8_delayed state after the step (scale and history bits)."""
    rows = []
    for name in ("scale", "history"):
        g = getattr(golden_state, name).detach().to("cpu", torch.float32).reshape(-1)
        c = getattr(cand_state, name).detach().to("cpu", torch.float32).reshape(-1)
        gb, cb = g.view(torch.int32), c.view(torch.int32)
        if gb.shape != cb.shape:
            rows.append(status_row(base, "fail", f"state_{name}: shape {tuple(cb.shape)} != golden {tuple(gb.shape)}",
                                   tensor=f"state_{name}"))
            continue
        diff = (gb != cb).nonzero().reshape(-1)
        first = None
        if diff.numel():
            i = int(diff[0])
            first = {"index": i, "golden": float(g[i]), "candidate": float(c[i]),
                     "golden_bits": f"0x{int(gb[i]) & 0xFFFFFFFF:08X}", "candidate_bits": f"0x{int(cb[i]) & 0xFFFFFFFF:08X}"}
        status = "fail" if diff.numel() else "pass"
        rows.append({
            **base, "tensor": f"state_{name}", "kind": "conformance", "status": status,
            "reason": f"state_{name}: {diff.numel()} of {gb.numel()} differ; first {json.dumps(first)}" if first else "",
            "n": int(gb.numel()), "n_mismatch": int(diff.numel()),
            "mismatch_frac": diff.numel() / max(1, gb.numel()), "first_mismatch": first,
        })
    return rows


def _is_exact_gemm(case) -> bool:
    if case.distribution not in EXACT_GEMM_DISTRIBUTIONS:
        return False
    return not case.accumulate or case.config.scheme in EXACT_ACCUMULATE_SCHEMES


def _run_candidate(case, golden: Golden, backend, device, base: dict) -> list[dict]:
    """Rows of one backend on one case (golden already computed)."""
    compare = _compare_mod()
    inputs, on = golden.inputs, golden.on_device
    cfg = case.config
    dev = _normalized(device)
    gdev = golden.out.device if case.op == "gemm" else golden.device
    # The reference on the golden's own device is the golden run itself (no second pass).
    reuse_golden = isinstance(backend, backends_mod.ReferenceBackend) and dev == gdev
    rows: list[dict] = []
    t0 = time.perf_counter()  # reset after the host-to-device copies below; wall_ms times the backend call
    if case.op in ("quantize", "dequantize"):
        rw, cw = _copies(case.orientation)
        x = inputs["x"]
        if case.op == "quantize":
            if reuse_golden:
                cand, state = golden.quantized, golden.state
                wall = golden.wall_ms
            else:
                x_dev = on["x"] if dev == golden.device else x.to(dev)
                update = getattr(backend, "update_amax_history", None)
                _sync(device)
                t0 = time.perf_counter()
                cand, state = _quantize_with_state(backend.quantize, x_dev, cfg, device, rw, cw,
                                                   inputs.get("rng"), update if callable(update) else None)
                _sync(device)
                wall = (time.perf_counter() - t0) * 1e3
            base["wall_ms"] = wall
            cand_g = cand.to(golden.device)  # compared where the golden lives
            for tr in compare.compare_quantized(golden.quantized, cand_g, x):
                rows.append(result_row(base, tr))
            if state is not None and golden.state is not None:
                rows += _state_rows(base, golden.state, state)
            for o in ("rowwise", "colwise"):
                if cand_g.has(o):
                    xh = reference.dequantize(cand_g, o, torch.float32)
                    rows.append(accuracy_row(base, f"accuracy_{o}", xh, _accuracy_truth(case, on["x"], o)))
        else:
            dt = _out_dtype(case, torch.float32)
            q_dev = golden.quantized.to(device)
            outs = {}
            _sync(device)
            t0 = time.perf_counter()
            for o in golden.dequantized:
                outs[o] = golden.dequantized[o] if reuse_golden else backend.dequantize(q_dev, o, dt)
            _sync(device)
            base["wall_ms"] = golden.wall_ms if reuse_golden else (time.perf_counter() - t0) * 1e3
            for o, out in outs.items():
                truth = _accuracy_truth(case, on["x"], o)
                # Dequantized outputs are compared bit for bit (a NaN matches any NaN, compare_output).
                rows.append(result_row(base, compare.compare_output(golden.dequantized[o], out, f"dequant_{o}")))
                rows.append(accuracy_row(base, f"accuracy_{o}", out.to(torch.float32), truth))
    else:
        if reuse_golden:
            out = golden.out
            base["wall_ms"] = golden.wall_ms
        else:
            qa, qb = golden.qa.to(dev), golden.qb.to(dev)
            bias, c = (None if t is None else t.to(dev) for t in (on.get("bias"), on.get("c")))
            _sync(device)
            t0 = time.perf_counter()
            out = backend.gemm(qa, qb, layout=case.layout or "TN", out_dtype=_out_dtype(case, torch.bfloat16),
                               bias=bias, c=c)
            _sync(device)
            base["wall_ms"] = (time.perf_counter() - t0) * 1e3
        tr = compare.compare_gemm(golden.out, out, golden.truth, case, _is_exact_gemm(case), a=golden.qa,
                                  b=golden.qb, bias=on.get("bias"), c=on.get("c"))
        rows.append(result_row(base, tr))
        rows.append(accuracy_row(base, "accuracy_out", out, golden.truth))
    return rows


def run_backend(case, golden: Golden | Callable[[], Golden], backend, device: str | torch.device, *,
                worker: str = "") -> list[dict]:
    """All rows of `backend` on `case`; never raises for a backend failure (error/skip rows instead).

    `golden` may be a zero-argument callable, called only when the backend supports the case.
    Rows carry the timing columns: inputs_ms and golden_ms from the golden, check_ms for the rest.
    """
    t0 = time.perf_counter()
    used: list[tuple[Golden, float]] = []

    def timed_golden() -> Golden:
        t = time.perf_counter()
        g = golden() if callable(golden) else golden
        used.append((g, time.perf_counter() - t))
        return g

    rows = _backend_rows(case, timed_golden, backend, device, worker)
    check_ms = (time.perf_counter() - t0 - sum(dt for _, dt in used)) * 1e3
    times = {"check_ms": check_ms}
    if used:
        times.update(inputs_ms=used[0][0].inputs_ms, golden_ms=used[0][0].wall_ms)
    return [{**r, **times} for r in rows]


def _backend_rows(case, golden: Callable[[], Golden], backend, device, worker: str) -> list[dict]:
    """run_backend's rows, before the timing columns."""
    base = {**case_columns(case), "backend": backend.name, "device": str(device), "worker": worker}
    for cfg in (case.config, getattr(case, "b_config", None)):
        if cfg is None:
            continue
        try:
            ok, why = backend.supports(case.op, cfg, device)
        except Exception as e:  # noqa: BLE001
            return [status_row(base, "error", f"{backend.name}.supports raised {_exc_text(e)}")]
        if not ok:
            return [status_row(base, "skip", why or f"{backend.name} does not support this case")]
    if not callable(getattr(backend, case.op, None)):
        return [status_row(base, "skip", f"{backend.name} has no {case.op}()")]
    golden = golden()
    if golden.error:
        return [status_row(base, "error", golden.error)]
    try:
        return _run_candidate(case, golden, backend, device, base)
    except Unsupported as e:
        return [status_row(base, "skip", f"{backend.name}: {e}")]
    except Exception as e:  # noqa: BLE001 - a backend raising on one case must not stop the sweep
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
        return [status_row(base, "error", f"{_exc_text(e)}{where}")]


def run_case(case, backend, device: str | torch.device = "cpu", *, inputs: Mapping | None = None,
             worker: str = "", golden: str = "same") -> list[dict]:
    """Rows of one backend on one case (interfaces: `harness.runner.run_case`); `golden`: GOLDEN_DEVICES."""
    backend = backends_mod.get_backend(backend)
    gdev = golden_device(device, golden)
    return run_backend(case, lambda: prepare(case, inputs, gdev), backend, device, worker=worker)


def run_case_backends(case, backends: Sequence, device, *, worker: str = "",
                      inputs: Mapping | None = None, golden: str = "same") -> dict[str, list[dict]]:
    """backend name -> rows; the golden side is computed at most once per case, and only if needed."""
    cache: list[Golden] = []
    gdev = golden_device(device, golden)

    def golden_once() -> Golden:
        if not cache:
            cache.append(prepare(case, inputs, gdev))
        return cache[0]

    return {b.name: run_backend(case, golden_once, b, device, worker=worker) for b in backends}


def case_verdict(rows: Iterable[Mapping]) -> str:
    return worst_status(r["status"] for r in rows)


# ----------------------------------------------------------------------------------------------
# Failure artifacts
# ----------------------------------------------------------------------------------------------


def safe_name(case_id: str) -> str:
    """A directory name for a case id (characters outside [A-Za-z0-9._=,+-] become '_')."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", case_id)


def repro_command(case_id: str, backend_spec: str, *, inputs_path: str | None = None, device: str | None = None) -> str:
    cmd = ["python", "-m", "harness", "repro", case_id, "--backend", backend_spec]
    if device:
        cmd += ["--device", device]
    text = " ".join(shlex.quote(c) for c in cmd)
    if inputs_path:
        text += f" --inputs {inputs_path}"
    return text


def save_failure(out_dir: str | os.PathLike, case, backend_spec: str, rows: Sequence[Mapping],
                 inputs: Mapping | None = None) -> Path:
    """Write `<out>/failures/<case_id>/`: inputs.pt (torch.save), rows, and repro.sh."""
    d = Path(out_dir) / FAILURES / safe_name(case.id)
    d.mkdir(parents=True, exist_ok=True)
    inputs_file = d / "inputs.pt"
    if not inputs_file.exists():
        try:
            data = dict(inputs) if inputs is not None else dict(_inputs_mod().generate(case, device="cpu"))
            torch.save({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in data.items()}, inputs_file)
        except Exception as e:  # noqa: BLE001 - the repro still regenerates inputs from the seed
            (d / "inputs_error.txt").write_text(f"could not save inputs: {_exc_text(e)}\n")
    (d / "case.txt").write_text(f"{case.id}\nsource: {getattr(case, 'source', '')}\n")
    safe_b = safe_name(backend_spec)
    with open(d / f"rows.{safe_b}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({k: v for k, v in r.items()}, default=str) + "\n")
    script = d / "repro.sh"
    lines = script.read_text().splitlines() if script.exists() else [
        "#!/bin/sh",
        f"# Repro of {case.id} (inputs saved beside this script; they are also regenerated from the seed).",
        'here="$(cd "$(dirname "$0")" && pwd)"',
        "# Run from the repository (set NUMERICS_HARNESS_ROOT when the checkout lives elsewhere).",
        f'cd "${{NUMERICS_HARNESS_ROOT:-{REPO_ROOT}}}" || exit 2',
    ]
    cmd = repro_command(case.id, backend_spec, inputs_path='"$here/inputs.pt"') + ' "$@"'
    if cmd not in lines:
        lines.append(cmd)
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return d


# ----------------------------------------------------------------------------------------------
# Sweeps (in process, or over worker processes each pinned to one GPU)
# ----------------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    counts: dict = field(default_factory=lambda: {"pass": 0, "fail": 0, "skip": 0, "error": 0})
    n_rows: int = 0
    failures: list = field(default_factory=list)  # (case_id, backend)

    def add(self, case_id: str, backend: str, rows: Sequence[Mapping]) -> str:
        v = case_verdict(rows)
        self.counts[v] = self.counts.get(v, 0) + 1
        self.n_rows += len(rows)
        if v in ("fail", "error"):
            self.failures.append((case_id, backend))
        return v

    @property
    def ok(self) -> bool:
        return not self.failures


def _handle(case, by_backend: Mapping[str, list[dict]], specs: Mapping[str, str], writer, out_dir, progress,
            result: SweepResult) -> None:
    for name, rows in by_backend.items():
        if writer is not None:
            writer.write(rows)  # recorded before anything else looks at them
        v = result.add(case.id, name, rows)
        if v in ("fail", "error") and out_dir is not None:
            save_failure(out_dir, case, specs.get(name, name), rows)
        if progress is not None:
            progress.update(1, v)


def _todo(cases, names, writer) -> list[tuple[Any, list[str]]]:
    todo = []
    for c in cases:
        left = [n for n in names if writer is None or not writer.is_complete(c.id, n)]
        if left:
            todo.append((c, left))
    return todo


def _grouped(todo: Sequence[tuple[Any, list[str]]]) -> list[list[tuple[Any, list[str]]]]:
    """`todo` grouped by harness.inputs.input_key: the cases of one group get identical inputs,
    generated once when the group runs back to back (`_generate`).

    Largest groups first (work ~ the product of the case shapes: M*K, or M*N*K for a GEMM; ties in
    order of first appearance), so workers do not end on one long group while the others idle.
    """
    groups = _inputs_mod().input_groups(todo, lambda item: item[0])
    return sorted(groups, key=lambda g: -sum(math.prod(c.shape) for c, _ in g))


def sweep(cases: Sequence, backends: Sequence, *, device, writer=None, out_dir=None, progress=None,
          worker: str = "main", golden: str = "same") -> SweepResult:
    """Run every (case, backend) in this process, writing rows as each case finishes."""
    result = SweepResult()
    by_name = {b.name: b for b in backends}
    specs = {b.name: backends_mod.backend_spec(b) for b in backends}
    for case, names in (item for group in _grouped(_todo(cases, list(by_name), writer)) for item in group):
        rows = run_case_backends(case, [by_name[n] for n in names], device, worker=worker, golden=golden)
        _handle(case, rows, specs, writer, out_dir, progress, result)
    return result


def visible_gpus() -> list[str]:
    """The GPU ids workers are pinned to (CUDA_VISIBLE_DEVICES entries, else 0..count-1)."""
    if not torch.cuda.is_available():
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [g.strip() for g in env.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


# Heap policy of sweep workers (host speed, not numerics). glibc serves blocks of 32 MB and more with
# mmap and unmaps them on free, so every large temporary arrives as fresh pages that the kernel faults
# in and zeroes: on 2 cores, generating 20 large nightly input groups took 69 s, 42 s of it in the
# kernel, and 29 s with this policy. Workers keep freed memory in their heap instead; the peak resident
# size is the same (2.35 vs 2.44 GB there) but stays held. Values the user exported win.
WORKER_HEAP_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


@contextlib.contextmanager
def _worker_heap_env():
    """os.environ with WORKER_HEAP_ENV's unset entries added, while worker processes start (spawn)."""
    added = {k: v for k, v in WORKER_HEAP_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _worker_main(index: int, gpu: str | None, specs: list[str], device: str, threads: int, golden: str, tasks,
                 results) -> None:
    """Worker process: pin to one GPU (CUDA_VISIBLE_DEVICES, set before CUDA starts), then serve tasks."""
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    torch.set_num_threads(max(1, threads))
    name = f"w{index}"
    try:
        bs = {b.name: b for b in (backends_mod.get_backend(s) for s in specs)}
    except Exception as e:  # noqa: BLE001
        results.put(("fatal", name, _exc_text(e)))
        return
    while True:
        group = tasks.get()  # cases sharing one input generation (_grouped), or None: stop
        if group is None:
            break
        for case, names in group:
            try:
                rows = run_case_backends(case, [bs[n] for n in names], device, worker=name, golden=golden)
            except Exception as e:  # noqa: BLE001 - should not happen: run_backend catches backend errors
                base = {**case_columns(case), "device": device, "worker": name}
                rows = {n: [status_row({**base, "backend": n}, "error", f"worker raised {_exc_text(e)}")]
                        for n in names}
            results.put(("rows", case, rows))
    results.put(("done", name, None))


def sweep_parallel(cases: Sequence, specs: Sequence[str], n_workers: int, *, device: str | None = None,
                   writer=None, out_dir=None, progress=None, golden: str = "same") -> SweepResult:
    """Run the sweep over `n_workers` processes; worker i is pinned to GPU i % n_gpus (CPU without GPUs).

    Cases sharing one input generation (`_grouped`) go to one worker as a single task. Rows come
    back to this process, which alone writes the report (no concurrent writers).
    """
    import multiprocessing as mp  # noqa: PLC0415

    _check_golden(golden)  # before any worker starts
    ctx = mp.get_context("spawn")
    gpus = visible_gpus() if (device is None or backends_mod.device_type(device) == "cuda") else []
    wdev = "cuda" if gpus else "cpu"
    threads = max(1, (os.cpu_count() or 1) // n_workers)
    names = [backends_mod.get_backend(s).name for s in specs]
    spec_by_name = dict(zip(names, specs, strict=True))
    tasks, results = ctx.Queue(), ctx.Queue()
    todo = _todo(cases, names, writer)
    for group in _grouped(todo):
        tasks.put(group)
    for _ in range(n_workers):
        tasks.put(None)
    procs = []
    with _worker_heap_env():
        for i in range(n_workers):
            gpu = gpus[i % len(gpus)] if gpus else None
            p = ctx.Process(target=_worker_main, args=(i, gpu, list(specs), wdev, threads, golden, tasks, results),
                            daemon=True)
            p.start()
            procs.append(p)
    result = SweepResult()
    pending = {c.id: (c, n) for c, n in todo}
    done_workers = 0
    while pending and done_workers < n_workers:
        try:
            kind, a, b = results.get(timeout=5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        if kind == "rows":
            pending.pop(a.id, None)
            _handle(a, b, spec_by_name, writer, out_dir, progress, result)
        elif kind == "fatal":
            raise RuntimeError(f"worker {a} could not load the backends: {b}")
        else:
            done_workers += 1
    for case, left in pending.values():  # a worker died mid-case
        base = {**case_columns(case), "device": wdev, "worker": "?"}
        rows = {n: [status_row({**base, "backend": n}, "error", "worker process died before finishing this case")]
                for n in left}
        _handle(case, rows, spec_by_name, writer, out_dir, progress, result)
    for p in procs:
        p.join(timeout=10)
    return result


def as_jsonable(rows: Sequence[Mapping]) -> list[dict]:
    """Rows normalized to COLUMNS with JSON cells encoded and non-finite floats as strings.

    Used to ship rows between processes (pytest-xdist user_properties); report.normalize_row
    accepts them back unchanged.
    """
    from .report import normalize_row  # noqa: PLC0415

    def fix(v):
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v

    return [{k: fix(v) for k, v in normalize_row(r).items()} for r in rows]
