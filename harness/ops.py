"""One table from a case's op to its golden, candidate and compare functions.

Source: docs/design.md §5 (inputs -> golden -> candidate -> compare -> rows), docs/numerics.md §2 (delayed
scaling step), §5.6 (RHT copies), §6 (GEMM layouts, exact modes). Per (case, backend):
- `golden(case, g)` fills the Golden (once per case, on the golden's device);
- `handed(case, g, device)` gives the backend's inputs: private copies, each with the original it
  must still equal afterwards (harness.runner checks them: `mutated its input`);
- `candidate(case, backend, device, given, ctx)` calls the backend and times the call (in the backend's own
  process for a harness.sandbox.BackendProcess; `ctx` is `call_context(case, g)`, plain data);
- `from_golden(case, g)` is the reference's own output when the candidate is the golden run itself;
- `compare(case, g, output, base)` gives the conformance and accuracy rows.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

import reference
from reference.layouts import gemm_layout
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor

from . import backends as backends_mod
from . import sr_stats
from .golden import Golden, fresh_copy, normalized, sync
from .rows import Row, accuracy_row, exc_text, result_row, status_row
from .verdict import (
    Evidence,
    code_step,
    delta_db,
    find_convention,
    graded_accuracy,
    graded_dequantize,
    nonfinite_where_finite,
    ulps_within_step,
    within_one_step,
)

# Distributions whose GEMM inputs are exactly representable (docs/numerics.md §6): compared bit for bit.
EXACT_GEMM_DISTRIBUTIONS = ("exact_representable",)
# The B operand of a stochastic GEMM draws SR bits from stream + 2 (A uses stream, stream + 1).
B_STREAM_OFFSET = 2


@dataclass
class Output:
    """What a candidate produced, and how long its call took (wall_ms)."""

    values: dict = field(default_factory=dict)
    wall_ms: float | None = None
    from_golden: bool = False  # the reference's own output on the golden's device (no candidate call)
    evidence: Evidence = field(default_factory=Evidence)  # filled by the op's compare (harness.verdict)


def copies(orientation: str | None) -> tuple[bool, bool]:
    o = orientation or "rowwise"
    if o not in ("rowwise", "colwise", "both"):
        raise ValueError(f"orientation={o!r} is invalid: expected rowwise, colwise or both")
    return o in ("rowwise", "both"), o in ("colwise", "both")


def _new_state(config, device):
    """A fresh fp8_delayed state (reference.per_tensor.AmaxHistory) on `device`."""
    from reference.per_tensor import AmaxHistory  # noqa: PLC0415

    return AmaxHistory(config, device=device)


def quantize_with_state(quantize: Callable, x, config, device, rowwise, colwise, rng, update: Callable | None = None):
    """quantize(x); for fp8_delayed first one warm-up quantization and the end-of-step update (docs/numerics.md §2).

    The warm-up makes the measured quantization use a scale derived from the history (448/amax for
    e4m3) rather than the initial 1.0. `update(state)` is the backend's own fused update if it has
    one (`update_amax_history`), else the reference's `state.update()`. Returns (QuantizedTensor,
    state or None).
    """
    if not config.scheme_row.amax_history:
        return quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=None), None
    state = _new_state(config, device)
    quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state)
    if update is not None:
        update(state)
    else:
        state.update()
    return quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng, state=state), state


def b_rng(rng):
    if rng is None:
        return None
    seed, stream = (rng.seed, rng.stream) if hasattr(rng, "seed") else (int(rng[0]), int(rng[1]))
    return (seed, (stream + B_STREAM_OFFSET) % 2**32)


def gemm_truth(case, inputs: Mapping) -> torch.Tensor:
    """fp64 GEMM of the high-precision operands in the case's layout, plus bias and C (docs/numerics.md §6)."""
    lay = gemm_layout(case.layout or "TN")
    a, b = inputs["a"].to(torch.float64), inputs["b"].to(torch.float64)
    a = a if lay.a == "rowwise" else a.t()  # [M, K]
    b = b if lay.b == "rowwise" else b.t()  # [N, K]
    y = a @ b.t()
    if inputs.get("bias") is not None:
        y = y + inputs["bias"].to(torch.float64)
    if inputs.get("c") is not None:
        y = y + inputs["c"].to(torch.float64)
    return y


def out_dtype(case, default: torch.dtype) -> torch.dtype:
    return backends_mod.torch_dtype(getattr(case, "out_dtype", None), default)


def is_exact_gemm(case) -> bool:
    if case.distribution not in EXACT_GEMM_DISTRIBUTIONS:
        return False
    # NUMERICS: §6 - accumulating into C has a defined order only where the scheme row says so
    # (fp8_block RN_out(C + RN_out(Y)), nvfp4 RN_out(C + Y) in fp32); elsewhere tolerance only.
    return not case.accumulate or case.config.scheme_row.exact_accumulate


def _accuracy_truth(case, x: torch.Tensor, orientation: str) -> torch.Tensor:
    """The high-precision values a copy approximates, as [M, K] (RHT copies: RHT(X^T)^T, docs/numerics.md §5.6)."""
    x2d = x.reshape(-1, x.shape[-1])
    if orientation == "colwise" and case.config.rht:
        from reference import hadamard  # noqa: PLC0415

        return hadamard.rht_transposed(x2d).t().to(torch.float32)
    return x2d.to(torch.float32)


def _timed(device, fn: Callable[[], Any]) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    value = fn()
    sync(device)
    return value, (time.perf_counter() - t0) * 1e3


def golden_accuracy(g: Golden, tensor: str, approx: Callable[[], torch.Tensor], truth: torch.Tensor
                    ) -> tuple[float, torch.Tensor]:
    """(the golden's SQNR against the truth, the golden's approximation) for accuracy row `tensor`,
    computed once per case and kept on the Golden (docs/numerics.md §11: always computed)."""
    from .compare import metrics  # noqa: PLC0415

    if tensor not in g.accuracy:
        y = approx()
        g.accuracy[tensor] = (metrics(y, truth)["sqnr_db"], y)
    return g.accuracy[tensor]


def _with_delta(row: Row, out: Output, golden_sqnr: float) -> Row:
    """An accuracy row with its delta_sqnr_db (none for the golden run itself)."""
    row["delta_sqnr_db"] = None if out.from_golden else delta_db(row.get("sqnr_db"), golden_sqnr)
    return row


def layout_finding(tr) -> str | None:
    """What a TensorResult says about the candidate's layout or shape, as one phrase, or None.

    Uses the transposed-equality check of harness.compare (class `layout_transposition`)."""
    detail = getattr(tr, "detail", None) or {}
    reason = str(detail.get("reason", ""))
    if "layout_transposition" in (tr.mismatch_classes or {}):
        what = str(detail.get("layout", "")).removeprefix("candidate equals the ")
        if not what and "(it equals the " in reason:
            what = reason.split("(it equals the ", 1)[1].rstrip(")")
        return f"{tr.tensor} is the {what or 'golden transposed'} (wrong layout)"
    if reason.startswith("candidate shape"):
        return f"{tr.tensor}: {reason} (wrong shape)"
    if "dtype" in detail:
        return f"{tr.tensor}: {detail['dtype']} (wrong dtype)"
    return None


def _not_measured(base: Mapping, tensor: str, why: str) -> Row:
    return status_row(base, "info", f"not measured: {why}", tensor=tensor, kind="accuracy")


# ----------------------------------------------------------------------------------------------
# quantize
# ----------------------------------------------------------------------------------------------


def _quantize_golden(case, g: Golden) -> None:
    rw, cw = copies(case.orientation)
    g.quantized, g.state = quantize_with_state(reference.quantize, g.on_device["x"], case.config, g.device, rw, cw,
                                               g.inputs.get("rng"))


def _x_handed(case, g: Golden, device) -> dict:
    dev = normalized(device)
    src = g.on_device["x"] if dev == g.device else g.inputs["x"]
    return {"x": (fresh_copy(src, dev), src)}


def _quantize_candidate(case, backend, device, given: Mapping, ctx: Mapping) -> Output:
    rw, cw = copies(case.orientation)
    if sr_stats.applies(case, backend):  # own SR bits: N draws, compared statistically (docs/numerics.md §12.3)
        draws, wall = _timed(device, lambda: sr_stats.draw(backend.quantize, given["x"], case.config, rowwise=rw,
                                                           colwise=cw, rng=ctx["rng"]))
        return Output({"q": draws[0], "state": None, "sr_draws": draws}, wall)
    update = getattr(backend, "update_amax_history", None)
    (q, state), wall = _timed(device, lambda: quantize_with_state(
        backend.quantize, given["x"], case.config, device, rw, cw, ctx["rng"],
        update if callable(update) else None))
    return Output({"q": q, "state": state}, wall)


def _quantize_from_golden(case, g: Golden) -> Output:
    return Output({"q": g.quantized, "state": g.state}, g.wall_ms, from_golden=True)


def _state_rows(base: Mapping, golden_state, cand_state) -> list[Row]:
    """Exact comparison of the fp8_delayed state after the step (scale and history bits)."""
    rows = []
    for name in ("scale", "history"):
        gv = getattr(golden_state, name).detach().to("cpu", torch.float32).reshape(-1)
        cv = getattr(cand_state, name).detach().to("cpu", torch.float32).reshape(-1)
        gb, cb = gv.view(torch.int32), cv.view(torch.int32)
        if gb.shape != cb.shape:
            rows.append(status_row(base, "fail", f"state_{name}: shape {tuple(cb.shape)} != golden {tuple(gb.shape)}",
                                   tensor=f"state_{name}"))
            continue
        diff = (gb != cb).nonzero().reshape(-1)
        first = None
        if diff.numel():
            i = int(diff[0])
            first = {"index": i, "golden": float(gv[i]), "candidate": float(cv[i]),
                     "golden_bits": f"0x{int(gb[i]) & 0xFFFFFFFF:08X}", "candidate_bits": f"0x{int(cb[i]) & 0xFFFFFFFF:08X}"}
        status = "fail" if diff.numel() else "pass"
        rows.append(Row(
            **base, tensor=f"state_{name}", kind="conformance", status=status,
            reason=f"state_{name}: {diff.numel()} of {gb.numel()} differ; first {json.dumps(first)}" if first else "",
            n=int(gb.numel()), n_mismatch=int(diff.numel()),
            mismatch_frac=diff.numel() / max(1, gb.numel()), first_mismatch=first,
        ))
    return rows


def _quantize_compare(case, g: Golden, out: Output, base: Mapping) -> list[Row]:
    from .compare import compare_quantized  # noqa: PLC0415

    ev = out.evidence
    cand_g = out.values["q"].to(g.device)  # compared where the golden lives
    results = compare_quantized(g.quantized, cand_g, g.inputs["x"], rng=g.inputs.get("rng"))
    if "sr_draws" in out.values:  # the data by statistics, scales and amaxes by bytes (docs/numerics.md §12.3)
        results = [tr for tr in results if not tr.tensor.endswith("_data")]
        results += sr_stats.check_draws(out.values["sr_draws"], g.inputs["x"], case.config)
    rows = [result_row(base, tr) for tr in results]
    ev.identical = all(tr.status == "pass" for tr in results)
    findings = {tr.tensor: f for tr in results if (f := layout_finding(tr))}
    ev.broken += list(findings.values())
    state = out.values["state"]
    if state is not None and g.state is not None:
        state_rows = _state_rows(base, g.state, state)
        ev.identical &= all(r["status"] == "pass" for r in state_rows)
        rows += state_rows
    for o in ("rowwise", "colwise"):
        if not (g.quantized.has(o) and cand_g.has(o)):
            continue
        tensor = f"accuracy_{o}"
        truth = _accuracy_truth(case, g.on_device["x"], o)
        g_sqnr, g_deq = golden_accuracy(g, tensor, lambda o=o: graded_dequantize(g.quantized, o, torch.float32),
                                        truth)
        bad = [t for t in findings if t.startswith(o)]
        if bad:  # NUMERICS: §11 - a wrong layout is reported, never dequantized as if it were right
            rows.append(_not_measured(base, tensor, f"{', '.join(bad)} not in the contract's layout"))
            continue
        try:
            xh = graded_dequantize(cand_g, o, torch.float32)
        except Exception as e:  # noqa: BLE001 - a candidate the contract cannot decode is broken, not an error
            ev.broken.append(f"{o} copy cannot be dequantized ({exc_text(e)})")
            rows.append(_not_measured(base, tensor, f"the candidate's {o} copy cannot be dequantized ({exc_text(e)})"))
            continue
        rows.append(_with_delta(accuracy_row(base, tensor, xh, truth), out, g_sqnr))
        ev.accuracy.append((tensor, case.config.element, *graded_accuracy(g.quantized, o, g_deq, xh, truth)))
        n_bad = nonfinite_where_finite(g_deq, xh)
        if n_bad:
            ev.broken.append(f"{o}: {n_bad} non-finite values where the golden's are finite")
        if not ev.identical and ev.within_step:
            ev.within_step = within_one_step(g_deq, xh, code_step(g.quantized, o))
    if not ev.identical and not findings:  # NUMERICS: §11 - a convention match outranks non-finite findings
        find_convention(ev, case, g.on_device["x"], cand_g, _convention_quantize(case, g))
    return rows


def _convention_quantize(case, g: Golden) -> Callable:
    """quantize(x, config) as the golden ran it (orientations, SR bits, delayed-scaling warm-up)."""
    rw, cw = copies(case.orientation)

    def run(x, config):
        return quantize_with_state(reference.quantize, x, config, g.device, rw, cw, g.inputs.get("rng"))[0]

    return run


# ----------------------------------------------------------------------------------------------
# dequantize
# ----------------------------------------------------------------------------------------------


def _dequantize_golden(case, g: Golden) -> None:
    _quantize_golden(case, g)
    dt = out_dtype(case, torch.float32)
    for o in ("rowwise", "colwise"):
        if g.quantized.has(o):
            g.dequantized[o] = reference.dequantize(g.quantized, o, dt)


def _dequantize_handed(case, g: Golden, device) -> dict:
    return {"q": (fresh_copy(g.quantized, device), g.quantized)}


def _dequantize_candidate(case, backend, device, given: Mapping, ctx: Mapping) -> Output:
    dt = out_dtype(case, torch.float32)
    outs, wall = _timed(device, lambda: {o: backend.dequantize(given["q"], o, dt) for o in ctx["orientations"]})
    return Output(outs, wall)


def _dequantize_from_golden(case, g: Golden) -> Output:
    return Output(dict(g.dequantized), g.wall_ms, from_golden=True)


def _dequantize_compare(case, g: Golden, out: Output, base: Mapping) -> list[Row]:
    from .compare import compare_dequantized  # noqa: PLC0415

    rows, ev = [], out.evidence
    for o, y in out.values.items():
        truth = _accuracy_truth(case, g.on_device["x"], o)
        # Dequantized outputs are compared bit for bit (a NaN matches any NaN, compare_output).
        tr = compare_dequantized(g.quantized, o, g.dequantized[o], y, f"dequant_{o}")
        rows.append(result_row(base, tr))
        _output_evidence(ev, tr, g.dequantized[o], y)
        tensor = f"accuracy_{o}"
        g_sqnr, _ = golden_accuracy(g, tensor, lambda o=o: g.dequantized[o].to(torch.float32), truth)
        if tuple(y.shape) != tuple(g.dequantized[o].shape):
            rows.append(_not_measured(base, tensor, f"candidate shape {tuple(y.shape)} is not the golden's"))
            continue
        rows.append(_with_delta(accuracy_row(base, tensor, y.to(torch.float32), truth), out, g_sqnr))
    return rows


def _output_evidence(ev: Evidence, tr, golden: torch.Tensor, candidate: torch.Tensor) -> None:
    """Evidence from one float output compared with compare_output (dequantize, gemm)."""
    exact_mode = (tr.detail or {}).get("mode", "exact") == "exact"
    ev.identical &= tr.status == "pass" and (exact_mode or tr.ulp_hist.get("0", 0) == tr.n)
    finding = layout_finding(tr)
    if finding:
        ev.broken.append(finding)
        return
    n_bad = nonfinite_where_finite(golden, candidate)
    if n_bad:
        ev.broken.append(f"{tr.tensor}: {n_bad} non-finite values where the golden's are finite")
    ev.within_step &= ulps_within_step(tr.ulp_hist)


# ----------------------------------------------------------------------------------------------
# gemm
# ----------------------------------------------------------------------------------------------


def _gemm_reference(case, g: Golden, dtype: torch.dtype) -> torch.Tensor:
    """reference.gemm of the golden operands; recomputed on the CPU when its bits could depend on the
    device (an fp64 sum that rounds in a library's order, docs/numerics.md §0.2.8, §6)."""
    from reference.gemm import device_independent  # noqa: PLC0415

    layout = case.layout or "TN"
    kw = dict(layout=layout, out_dtype=dtype, method="auto")
    if g.device.type == "cpu" or device_independent(g.qa, g.qb, layout)[0]:
        return reference.gemm(g.qa, g.qb, bias=g.on_device.get("bias"), c=g.on_device.get("c"), **kw)
    return reference.gemm(g.qa.to("cpu"), g.qb.to("cpu"), bias=g.inputs.get("bias"), c=g.inputs.get("c"), **kw)


def _gemm_golden(case, g: Golden) -> None:
    on, cfg, rng = g.on_device, case.config, g.inputs.get("rng")
    lay = gemm_layout(case.layout or "TN")
    g.qa = reference.quantize(on["a"], cfg, rng=rng, **lay.quantize_flags("a"))
    g.qb = reference.quantize(on["b"], case.b_config or cfg, rng=b_rng(rng), **lay.quantize_flags("b"))
    g.out = _gemm_reference(case, g, out_dtype(case, torch.bfloat16))
    g.truth = gemm_truth(case, on)
    if case.epilogue:  # docs/numerics.md §12.2: the plain output above is the aux / pre-activation
        _gemm_epilogue_golden(case, g)


def _gemm_epilogue_golden(case, g: Golden) -> None:
    """The epilogue's golden outputs (docs/numerics.md §12.2), on the CPU where the plain output was."""
    from reference.gemm import gemm_epilogue  # noqa: PLC0415

    dev = g.out.device
    on = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in g.on_device.items()}
    qa, qb = g.qa.to(dev), g.qb.to(dev)
    kw = dict(layout=case.layout, bias=on.get("bias"), c=on.get("c"))
    g.epilogue = gemm_epilogue(qa, qb, epilogue=case.epilogue, out_dtype=out_dtype(case, torch.bfloat16),
                               aux=on.get("aux"), **kw)
    g.epilogue["pre"] = reference.gemm(qa, qb, out_dtype=torch.float32, **kw)
    g.epilogue["plain"] = g.out
    g.out = g.epilogue["out"]


def _gemm_handed(case, g: Golden, device) -> dict:
    dev = normalized(device)
    given = {"a": (fresh_copy(g.qa, dev), g.qa), "b": (fresh_copy(g.qb, dev), g.qb)}
    for k in ("bias", "c", "aux"):
        if g.on_device.get(k) is not None:
            given[k] = (fresh_copy(g.on_device[k], dev), g.on_device[k])
    return given


def _gemm_candidate(case, backend, device, given: Mapping, ctx: Mapping) -> Output:
    if case.epilogue:  # docs/numerics.md §12.2: backends run epilogues through gemm_epilogue
        fn = getattr(backend, "gemm_epilogue", None)
        if not callable(fn):
            raise reference.Unsupported(f"{backend.name} has no gemm_epilogue() for epilogue {case.epilogue!r}")
        outs, wall = _timed(device, lambda: fn(
            given["a"], given["b"], epilogue=case.epilogue, layout=case.layout or "TN",
            out_dtype=out_dtype(case, torch.bfloat16), bias=given.get("bias"), c=given.get("c"), aux=given.get("aux")))
        return Output(dict(outs), wall)
    y, wall = _timed(device, lambda: backend.gemm(
        given["a"], given["b"], layout=case.layout or "TN", out_dtype=out_dtype(case, torch.bfloat16),
        bias=given.get("bias"), c=given.get("c")))
    return Output({"out": y}, wall)


def _gemm_from_golden(case, g: Golden) -> Output:
    extra = {k: g.epilogue[k] for k in ("aux", "bgrad") if k in g.epilogue}
    return Output({"out": g.out, **extra}, g.wall_ms, from_golden=True)


def _gemm_compare(case, g: Golden, out: Output, base: Mapping) -> list[Row]:
    from .compare import compare_gemm  # noqa: PLC0415

    y, on = out.values["out"], g.on_device
    if case.epilogue:
        return _epilogue_compare(case, g, out, base)
    tr = compare_gemm(g.out, y, g.truth, case, is_exact_gemm(case), a=g.qa, b=g.qb, bias=on.get("bias"),
                      c=on.get("c"))
    _output_evidence(out.evidence, tr, g.out, y)
    g_sqnr, _ = golden_accuracy(g, "accuracy_out", lambda: g.out, g.truth)
    if tuple(y.shape) != tuple(g.out.shape):
        return [result_row(base, tr), _not_measured(base, "accuracy_out", f"candidate shape {tuple(y.shape)} is not "
                                                                          "the golden's")]
    return [result_row(base, tr), _with_delta(accuracy_row(base, "accuracy_out", y, g.truth), out, g_sqnr)]


def _epilogue_compare(case, g: Golden, out: Output, base: Mapping) -> list[Row]:
    """Epilogue outputs (docs/numerics.md §12.2): the transcendental ones and the bias gradient against the
    derived bounds of harness/tolerance.py; the plain GEMM outputs (aux, bgradb's out) as a plain GEMM."""
    from reference.gemm import operand_row_sums  # noqa: PLC0415

    from . import tolerance  # noqa: PLC0415
    from .compare import compare_gemm, compare_output  # noqa: PLC0415

    on, ep, dev = g.on_device, g.epilogue, g.out.device
    bias, c = on.get("bias"), on.get("c")
    bias, c = (None if t is None else t.to(dev) for t in (bias, c))
    rows = []
    missing = [k for k in ("out", "aux", "bgrad") if k in ep and out.values.get(k) is None]
    if missing:
        return [status_row(base, "fail", f"{case.epilogue}: the candidate returned no {', '.join(missing)}",
                           tensor=missing[0])]
    y = out.values["out"].to(dev)
    if case.epilogue == "bgradb":
        rows.append(result_row(base, compare_gemm(g.out, y, None, case, is_exact_gemm(case), a=g.qa, b=g.qb, c=c)))
        lay = gemm_layout(case.layout)
        s = operand_row_sums(g.qb.to(dev), lay.b, layout=case.layout, absolute=True)
        bound = tolerance.bgrad_bound(case, s, ep["bgrad"])
        rows.append(result_row(base, compare_output(ep["bgrad"], out.values["bgrad"].to(dev), "bgrad", bound)))
        return rows
    bound = tolerance.epilogue_bound(case, g.qa, g.qb, g.out, pre=ep["pre"], aux=on.get("aux"), bias=bias, c=c)
    rows.append(result_row(base, compare_output(g.out, y, "out", bound)))
    if "aux" in ep:
        tr = compare_gemm(ep["aux"], out.values["aux"].to(dev), g.truth, case, is_exact_gemm(case), a=g.qa,
                          b=g.qb, bias=bias, c=c)
        tr.tensor = "aux"
        rows.append(result_row(base, tr))
    return rows


# ----------------------------------------------------------------------------------------------
# grouped_quantize (docs/numerics.md §12.1)
# ----------------------------------------------------------------------------------------------


def _grouped_golden(case, g: Golden) -> None:
    from reference import grouped  # noqa: PLC0415

    rw, cw = copies(case.orientation)
    g.quantized = grouped.quantize(g.on_device["x"], case.config, case.splits, rowwise=rw, colwise=cw,
                                   rng=g.inputs.get("rng"))


def _grouped_candidate(case, backend, device, given: Mapping, ctx: Mapping) -> Output:
    rw, cw = copies(case.orientation)
    groups, wall = _timed(device, lambda: backend.grouped_quantize(
        given["x"], case.config, list(case.splits), rowwise=rw, colwise=cw, rng=ctx["rng"]))
    return Output({"groups": groups}, wall)


def _grouped_from_golden(case, g: Golden) -> Output:
    return Output({"groups": g.quantized}, g.wall_ms)


def _grouped_compare(case, g: Golden, out: Output, base: Mapping) -> list[Row]:
    """Group i compared as its own quantize (tensors `g<i>_<field>`); empty groups are not compared (TE leaves
    their buffers unwritten); accuracy over the groups' dequantized copies stacked along M."""
    from .compare import compare_quantized  # noqa: PLC0415

    groups = list(out.values["groups"] or [])
    if len(groups) != len(case.splits):
        return [status_row(base, "fail", f"grouped_quantize returned {len(groups)} groups, expected "
                           f"{len(case.splits)} (splits {list(case.splits)})", tensor="groups")]
    x2d = g.inputs["x"].reshape(-1, g.inputs["x"].shape[-1])
    rows, deq, offset = [], {"rowwise": [], "colwise": []}, 0
    for i, (size, gold, cand) in enumerate(zip(case.splits, g.quantized, groups, strict=True)):
        if size == 0:
            continue
        if cand is None:
            rows.append(status_row(base, "fail", f"group {i} ({size} rows) is missing", tensor=f"g{i}"))
            offset += size
            continue
        cand_g = cand.to(g.device)
        for tr in compare_quantized(gold, cand_g, x2d[offset : offset + size]):
            tr.tensor = f"g{i}_{tr.tensor}"
            rows.append(result_row(base, tr))
        for o in deq:
            if cand_g.has(o):
                deq[o].append(reference.dequantize(cand_g, o, torch.float32))
        offset += size
    for o, parts in deq.items():
        if parts and len(parts) == sum(1 for s in case.splits if s):
            approx, truth = torch.cat(parts), _grouped_truth(case, g, o)
            if approx.shape == truth.shape:  # a group of the wrong shape has already failed its rows
                rows.append(accuracy_row(base, f"accuracy_{o}", approx, truth))
    return rows


def _grouped_truth(case, g: Golden, orientation: str) -> torch.Tensor:
    """Per-group accuracy truth (RHT copies are per group: RHT of each slice, docs/numerics.md §12.1)."""
    x2d = g.on_device["x"].reshape(-1, g.on_device["x"].shape[-1])
    parts, offset = [], 0
    for size in case.splits:
        if size:
            parts.append(_accuracy_truth(case, x2d[offset : offset + size], orientation))
        offset += size
    return torch.cat(parts)


# ----------------------------------------------------------------------------------------------
# linear: a Linear / LayerNormLinear training case (docs/numerics.md §9), compared along its chain
# ----------------------------------------------------------------------------------------------


def _linear_golden(case, g: Golden) -> None:
    from reference.linear import run_module  # noqa: PLC0415

    from .module_inputs import module_args  # noqa: PLC0415

    g.state = run_module(*module_args(case, g.on_device))  # the golden ModuleRun


def _linear_handed(case, g: Golden, device) -> dict:
    dev = normalized(device)
    src = g.on_device if dev == g.device else g.inputs
    return {k: (fresh_copy(v, dev), v) for k, v in src.items() if isinstance(v, torch.Tensor)}


def _linear_candidate(case, backend, device, given: Mapping, ctx: Mapping) -> Output:
    from .module_inputs import module_args  # noqa: PLC0415

    spec, params, steps = module_args(case, given)
    run, wall = _timed(device, lambda: backend.run_module(spec, params, steps))
    return Output({"run": run}, wall)


def _linear_from_golden(case, g: Golden) -> Output:
    return Output({"run": g.state}, g.wall_ms)


def _linear_compare(case, g: Golden, out: Output, base: Mapping) -> list[Row]:
    from .chain import compare_runs, hp_inputs, run_to, summary  # noqa: PLC0415
    from .module_inputs import module_args  # noqa: PLC0415

    spec, params, steps = module_args(case, g.on_device)
    run = run_to(out.values["run"], g.device)
    stages = compare_runs(case, g.state, run, hp_inputs(case, steps, g.state, params), params.bias)
    status, reason = summary(stages)
    n_bad = sum(s.status == "fail" for s in stages)
    rows = [Row(**base, tensor="chain", kind="conformance", status=status, reason=reason, n=len(stages),
                n_mismatch=n_bad, mismatch_frac=n_bad / max(1, len(stages)))]
    for sr in stages:
        for tr in sr.results:
            tr.tensor = f"s{sr.step}.{sr.stage}" + ("" if tr.tensor == sr.stage else f".{tr.tensor}")
            rows.append(result_row(base, tr))
    # accuracy: the last step's fprop against the fp64 product of the high-precision operands
    last, inp = run.steps[-1], steps[-1]
    xs = (last.ln_out if last.ln_out is not None else inp.x.reshape(-1, inp.x.shape[-1])).to(torch.float64)
    w = next((s.weight for s in reversed(steps) if s.weight is not None), params.weight)
    truth = xs @ w.to(xs.device, torch.float64).t()
    if params.bias is not None:
        truth = truth + params.bias.to(xs.device, torch.float64)
    rows.append(accuracy_row(base, "accuracy_fprop", last.fprop.to(truth.device, torch.float64), truth))
    return rows


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """The functions of one op (see the module docstring)."""

    golden: Callable[[Any, Golden], None]
    handed: Callable[[Any, Golden, Any], dict]
    candidate: Callable[[Any, Any, Any, Mapping, Mapping], Output]  # (case, backend, device, given, call_context)
    from_golden: Callable[[Any, Golden], Output]
    compare: Callable[[Any, Golden, Output, Mapping], list]
    method: str = ""  # the backend method the op calls (default: the op's name)

    def golden_device(self, g: Golden) -> torch.device:
        """Where the golden output lives (a GEMM's may have been computed on the CPU)."""
        return g.out.device if g.out is not None else g.device


OPS: dict[str, Op] = {
    "quantize": Op(_quantize_golden, _x_handed, _quantize_candidate, _quantize_from_golden, _quantize_compare),
    "dequantize": Op(_dequantize_golden, _dequantize_handed, _dequantize_candidate,
                     _dequantize_from_golden, _dequantize_compare),
    "gemm": Op(_gemm_golden, _gemm_handed, _gemm_candidate, _gemm_from_golden, _gemm_compare),
    "grouped_quantize": Op(_grouped_golden, _x_handed, _grouped_candidate, _grouped_from_golden, _grouped_compare),
    "linear": Op(_linear_golden, _linear_handed, _linear_candidate, _linear_from_golden, _linear_compare,
                 method="run_module"),
}


def _what(v: Any) -> str:
    from .wire import Bad, describe  # noqa: PLC0415

    return "None" if v is None else (v.what if isinstance(v, Bad) else describe(v))


def _quantized_problem(q: Any, golden: QuantizedTensor | None, what: str) -> str | None:
    """Why `q` is not a QuantizedTensor of the contract's field types (docs/adapters.md §2), or None."""
    if not isinstance(q, QuantizedTensor):
        return f"{what} returned {_what(q)}; the contract expects a reference.types.QuantizedTensor (docs/adapters.md §2)"
    for name in QuantizedTensor.TENSOR_FIELDS:
        v = getattr(q, name)
        if v is None:
            continue
        if not isinstance(v, torch.Tensor):
            return f"{what} returned a QuantizedTensor whose {name} is {_what(v)}; the contract expects a torch.Tensor"
        want = getattr(golden, name, None) if golden is not None else None
        if want is not None and v.dtype != want.dtype:
            return (f"{what} returned {name} of dtype {str(v.dtype).removeprefix('torch.')}; the contract expects "
                    f"{str(want.dtype).removeprefix('torch.')} (docs/adapters.md §2)")
    return None


def _tensor_problem(v: Any, what: str) -> str | None:
    if not isinstance(v, torch.Tensor):
        return f"{what} returned {_what(v)}; the contract expects a torch.Tensor"
    return None


def output_problem(case, values: Mapping, g: Golden) -> str | None:
    """Why a candidate's decoded outputs (harness.sandbox) are not of the types its op's contract returns, in one
    line naming what came back and what was expected; None when they are. Values are then compared as usual."""
    op = case.op
    if op == "quantize":
        why = _quantized_problem(values.get("q"), g.quantized, "quantize")
        if why is None and values.get("state") is not None and not isinstance(values["state"], AmaxHistory):
            why = f"update_amax_history left the state as {_what(values['state'])}"
        for q in values.get("sr_draws") or []:
            why = why or _quantized_problem(q, g.quantized, "quantize")
        return why
    if op == "dequantize":
        return next((w for o, y in values.items() if (w := _tensor_problem(y, f"dequantize({o!r})"))), None)
    if op == "gemm":
        name = "gemm_epilogue" if case.epilogue else "gemm"
        if case.epilogue and not all(isinstance(k, str) for k in values):
            return f"{name} returned a dict with keys that are not names"
        return next((w for k, y in values.items() if y is not None and (w := _tensor_problem(y, f"{name} {k!r}"))),
                    None)
    if op == "grouped_quantize":
        groups = values.get("groups")
        if not isinstance(groups, (list, tuple)):
            return f"grouped_quantize returned {_what(groups)}; the contract expects a list of QuantizedTensor"
        return next((w for q in groups if q is not None and (w := _quantized_problem(q, None, "grouped_quantize"))),
                    None)
    if op == "linear":
        from reference.linear import ModuleRun  # noqa: PLC0415

        run = values.get("run")
        if not isinstance(run, ModuleRun):
            return f"run_module returned {_what(run)}; the contract expects a reference.linear.ModuleRun"
    return None


def call_context(case, g: Golden) -> dict:
    """What a candidate call needs of the golden side besides its inputs: the SR seed and the copies to
    dequantize (plain data: it travels to the backend's process, harness.sandbox)."""
    return {"rng": g.inputs.get("rng"), "orientations": list(g.dequantized)}


def op_for(case) -> Op:
    try:
        return OPS[case.op]
    except KeyError:
        raise ValueError(f"case op {case.op!r} is invalid: expected {', '.join(OPS)}") from None
