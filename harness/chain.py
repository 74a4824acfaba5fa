"""Comparison along a module case's chain: every stage of every step, and the first stage that left the golden.

Source: docs/numerics.md §9.8 (what is compared how), §9.1 (the stages and which GEMM consumes which copy),
§6 and harness/tolerance.py (the GEMM bounds), §9.2 (the norms). Stages are searched in the order the step
computes them (`reference.linear.StepResult.STAGES`), step by step:

  stage                  compared                                  bound
  x_q, w_q, dy_q         data, scales, amax of both copies         exact bytes (harness.compare localisation)
  fprop, dgrad, wgrad    the GEMM output                           tolerance.gemm_bound of the GEMM (below)
  ln_out                 the norm output                           NORM bound (below)
  dx, dgamma, dbeta      the norm backward                         NORM bound + what dgrad's bound carries
  dbias                  column sums of dY                         M tokens of fp32 accumulation + one RN_act
  weight_grad, main_grad the accumulated gradient                  the sum of the steps' wgrad bounds + RN_act

GEMM bounds (harness/tolerance.py, applied per GEMM of the step; K is the GEMM's inner dimension):
  fprop  TN, a = X rowwise, b = W rowwise, shape (M, N, K)     out act, + bias
  dgrad  NN, a = dY rowwise, b = W colwise, shape (M, K, N)    out act
  wgrad  NT, a = dY colwise, b = X colwise, shape (N, K, M)    out act, or fp32 into main_grad (C = the
         previous main_grad: the bound adds the previous step's main_grad bound)
The table row is the recipe's scheme (per-tensor FP8: Hopper fast accumulation in fprop, the split
accumulator in dgrad and wgrad, as TE's module code sets them; blockwise, MXFP8, NVFP4: their rows), S is
Σ|â||b̂| of the golden's consumed copies.

NORM bound (docs/numerics.md §9.2: TE's Welford order and rsqrtf are not reproducible bit for bit):
|c − g| ≤ 2·u_act·|g| + NORM_ULPS·u32·max_row|g| per row, NORM_ULPS = 16 fp32 ulps of the row's largest value
(the statistics' order, rsqrtf's 2 ulp and the FMA), plus, for the backward, 3·rsigma·|gamma|·max_row(dgrad
bound) for dx and Σ_rows dgrad bound·|y| (dgamma), Σ_rows dgrad bound (dbeta): an error dgrad was allowed
propagated through §9.2's formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference.linear import GEMM_LAYOUTS, ModuleRun, StepResult
from reference.types import QuantizedTensor

from .compare import TensorResult, compare_output, compare_quantized

NORM_ULPS = 16
U32 = 2.0**-24
QUANTIZED = {"x_q": "X", "w_q": "W", "dy_q": "dY"}
# Which GEMM consumes which copy (docs/numerics.md §9.1).
CONSUMER = {
    ("x_q", "rowwise"): "fprop", ("w_q", "rowwise"): "fprop", ("dy_q", "rowwise"): "dgrad",
    ("w_q", "colwise"): "dgrad", ("dy_q", "colwise"): "wgrad", ("x_q", "colwise"): "wgrad",
}
_KIND_WORD = {"data": "data", "scale": "scales", "amax": "amax"}


@dataclass
class StageResult:
    """One stage of one step: its TensorResults (one per field of a quantized operand, else one)."""

    step: int
    stage: str
    results: list[TensorResult] = field(default_factory=list)
    missing: bool = False  # the candidate returned None for this stage: not compared, listed in the summary

    @property
    def status(self) -> str:
        return "fail" if any(r.status == "fail" for r in self.results) else "pass"

    def first_failure(self) -> TensorResult | None:
        return next((r for r in self.results if r.status == "fail"), None)


def _u(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def _gemm_case(case, gemm: str, a_cfg, b_cfg, m: int, n: int, k: int, out_dtype: str, bias: bool, acc: bool):
    """A gemm Case standing for one GEMM of the step (harness.tolerance reads scheme, shape, layout, dtypes)."""
    from .cases import Case  # noqa: PLC0415

    return Case("gemm", config=a_cfg, b_config=b_cfg, shape=(m, n, k), in_dtype=case.in_dtype,
                out_dtype=out_dtype, layout=GEMM_LAYOUTS[gemm], accumulate=acc, bias=bias)


def _norm_bound(g: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    g64 = g.detach().to(torch.float64).abs()
    g64 = torch.nan_to_num(g64, nan=0.0, posinf=0.0)
    row = g64.amax(dim=-1, keepdim=True) if g64.dim() > 1 else g64.amax()
    return 2 * _u(act) * g64 + NORM_ULPS * U32 * row


def _dtype_name(dt: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dt]


class _Carry:
    """Bounds carried across stages and steps (dgrad's for the norm backward, wgrad's for the sums)."""

    def __init__(self) -> None:
        self.dgrad: torch.Tensor | None = None
        self.grad_sum: torch.Tensor | None = None  # weight_grad / main_grad


def _gemm_bounds(case, gs: StepResult, carry: _Carry, bias) -> dict[str, torch.Tensor]:
    from .tolerance import gemm_bound  # noqa: PLC0415

    rec = case.module.recipe
    cfg = rec.configs()
    act = gs.fprop.dtype
    m, k = gs.x_q.shape[-2], gs.x_q.shape[-1]
    n = gs.w_q.shape[0]
    out: dict[str, torch.Tensor] = {}
    c = _gemm_case(case, "fprop", cfg["input"], cfg["weight"], m, n, k, _dtype_name(act), bias is not None, False)
    out["fprop"] = gemm_bound(c, gs.x_q, gs.w_q, gs.fprop, bias=bias)
    c = _gemm_case(case, "dgrad", cfg["grad_output"], cfg["weight"], m, k, n, _dtype_name(act), False, False)
    out["dgrad"] = gemm_bound(c, gs.dy_q, gs.w_q, gs.dgrad)
    acc = gs.gemms["wgrad"].accumulate
    wdt = gs.wgrad.dtype
    c = _gemm_case(case, "wgrad", cfg["grad_output"], cfg["input"], n, k, m, _dtype_name(wdt), False, acc)
    wb = gemm_bound(c, gs.dy_q, gs.x_q, gs.wgrad)
    if acc and carry.grad_sum is not None:
        wb = wb + carry.grad_sum  # C = the previous main_grad, itself within its bound
    out["wgrad"] = wb
    return out


def compare_step(case, gs: StepResult, cs: StepResult, hp: dict, carry: _Carry, bias) -> list[StageResult]:
    """The stages of one step, golden `gs` vs candidate `cs`, in chain order. `hp`: the high-precision
    tensors each quantized operand came from ({"x_q": X source, "w_q": W, "dy_q": dY})."""
    act = gs.fprop.dtype
    out: list[StageResult] = []
    bounds = _gemm_bounds(case, gs, carry, bias)
    grad = gs.main_grad if gs.main_grad is not None else gs.weight_grad
    grad_bound = None
    if gs.main_grad is not None:
        grad_bound = bounds["wgrad"]  # the GEMM wrote main_grad (its bound carries the previous one)
    elif grad is not None:
        # NUMERICS: §9.3 weight.grad = RN_act(previous + dW): both within their bounds, one more rounding.
        prev = carry.grad_sum if carry.grad_sum is not None else 0.0
        grad_bound = prev + bounds["wgrad"] + 2 * _u(grad.dtype) * grad.to(torch.float64).abs()
    for name, gv in gs.stages():
        cv = getattr(cs, name, None)
        sr = StageResult(gs.step, name)
        out.append(sr)
        if cv is None:  # e.g. TE's modules keep their quantized operands inside autograd
            sr.missing = True
            continue
        if name in QUANTIZED:
            sr.results += compare_quantized(gv, cv, hp[name])
            continue
        if name in bounds:
            bound = bounds[name]
        elif name == "dx" and gs.ln_out is None:
            bound = bounds["dgrad"]  # Linear: dx is the dgrad output
        elif name == "ln_out":
            bound = _norm_bound(gv, act)
        elif name in ("dx", "dgamma", "dbeta"):
            bound = _norm_bound(gv, gv.dtype) + _norm_backward_carry(name, gs, bounds["dgrad"], hp)
        elif name == "dbias":
            # NUMERICS: §9.3 dbias: fp32 sums over M tokens in some order, then one RN_act.
            m = gs.fprop.shape[0]
            bound = m * U32 * hp["dy_q"].to(torch.float64).abs().sum(0) + 2 * _u(act) * gv.to(torch.float64).abs()
        elif name in ("weight_grad", "main_grad"):
            bound = grad_bound
        else:  # pragma: no cover - a stage StepResult adds later: exact until it has a bound
            bound = None
        sr.results.append(compare_output(gv, cv, name, bound))
    if grad_bound is not None:
        carry.grad_sum = grad_bound
    return out


def _norm_backward_carry(name: str, gs: StepResult, dgrad_bound: torch.Tensor, hp: dict) -> torch.Tensor:
    """What an error dgrad was allowed adds to dx / dgamma / dbeta (module docstring)."""
    if gs.ln_rsigma is None:
        return torch.zeros((), dtype=torch.float64)
    rs = gs.ln_rsigma.to(torch.float64).unsqueeze(-1)  # [M, 1]
    gamma = hp["gamma"].to(rs.device, torch.float64).abs()  # [K] (zero-centred: + 1 applied)
    if name == "dx":
        return 3 * rs * gamma * dgrad_bound.amax(dim=-1, keepdim=True)
    x = hp["x"].to(torch.float64)
    mu = 0.0 if gs.ln_mu is None else gs.ln_mu.to(torch.float64).unsqueeze(-1)
    y = ((x - mu) * rs).abs()
    if name == "dgamma":
        return (dgrad_bound * y).sum(0)
    return dgrad_bound.sum(0)


def compare_runs(case, golden: ModuleRun, candidate: ModuleRun, hp_steps: list[dict], bias=None) -> list[StageResult]:
    """Every stage of every step (see the module docstring); `hp_steps[i]` as compare_step's `hp`."""
    if len(candidate.steps) != len(golden.steps):
        raise ValueError(f"the candidate ran {len(candidate.steps)} steps, the golden {len(golden.steps)}")
    carry = _Carry()
    out: list[StageResult] = []
    for gs, cs, hp in zip(golden.steps, candidate.steps, hp_steps, strict=True):
        out += compare_step(case, gs, cs, hp, carry, bias)
    return out


def describe(sr: StageResult) -> str:
    """"step 2, wgrad: colwise dY scales differ in block [3, 1] (...)" for a failing stage."""
    tr = sr.first_failure()
    head = f"step {sr.step}, "
    if tr is None:
        return head + f"{sr.stage}: passes"
    fm = tr.first_mismatch or {}
    if sr.stage in QUANTIZED:
        orient, kind = tr.tensor.split("_", 1)
        consumer = CONSUMER[(sr.stage, orient)]
        where = ""
        if "block" in fm:
            where = f" in block {fm['block']}"
        elif "index" in fm:
            where = f" at {fm['index']}"
        what = f"{orient} {QUANTIZED[sr.stage]} {_KIND_WORD.get(kind, kind)} differ{where}"
        cls = fm.get("class")
        return head + f"{consumer}: {what} ({tr.n_mismatch} of {tr.n}{', ' + cls if cls else ''})"
    kind = "exceeds its bound" if tr.detail.get("mode") == "tolerance" else "differs"
    at = f" at {fm['index']}" if "index" in fm else ""
    vals = ""
    if "golden" in fm:
        vals = f" (golden {fm['golden']:.6g}, candidate {fm['candidate']:.6g}"
        vals += f", bound {fm['bound']:.3g})" if "bound" in fm else ")"
    return head + f"{sr.stage}: {tr.n_mismatch} of {tr.n} elements {kind}{at}{vals}"


def first_departure(stages: list[StageResult]) -> StageResult | None:
    """The first failing stage in chain order, or None."""
    return next((s for s in stages if s.status == "fail"), None)


def n_differ(tr: TensorResult) -> int:
    """How many elements differ in their bits, within the bound or not (the ULP histogram's non-zero part)."""
    if tr.ulp_hist and "0" in tr.ulp_hist:
        return tr.n - int(tr.ulp_hist["0"])
    return tr.n_mismatch


def first_difference(stages: list[StageResult]) -> StageResult | None:
    """The first stage whose bits differ at all (within its bound or not), or None."""
    return next((s for s in stages if any(n_differ(r) for r in s.results)), None)


def run_to(run: ModuleRun, device) -> ModuleRun:
    """`run` with every StepResult tensor and QuantizedTensor on `device` (compared where the golden lives)."""
    import dataclasses  # noqa: PLC0415

    def mv(v):
        return v.to(device) if isinstance(v, (torch.Tensor, QuantizedTensor)) else v

    steps = [dataclasses.replace(s, **{f.name: mv(getattr(s, f.name)) for f in dataclasses.fields(s)})
             for s in run.steps]
    return ModuleRun(steps=steps, state=run.state)


def hp_inputs(case, spec_steps, golden: ModuleRun, params) -> list[dict]:
    """Per step the high-precision tensors compare_step needs: each quantized operand's source (X = ln_out
    or x, the W that was quantized last (the cached one), dY), x and gamma (+1 when zero-centred)."""
    out = []
    w = params.weight
    w_src = w
    gamma = None
    if params.ln_weight is not None:
        gamma = params.ln_weight.to(torch.float32)
        if case.module.zero_centered_gamma:
            gamma = gamma + 1
    k = w.shape[1]
    for inp, gs in zip(spec_steps, golden.steps, strict=True):
        if inp.weight is not None:
            w = inp.weight
        if gs.weight_requantized:
            w_src = w
        x2d = inp.x.reshape(-1, k)
        out.append({"x_q": gs.ln_out if gs.ln_out is not None else x2d, "w_q": w_src,
                    "dy_q": inp.dy.reshape(-1, w.shape[0]), "x": x2d, "gamma": gamma})
    return out


def summary(stages: list[StageResult]) -> tuple[str, str]:
    """(status, reason) of the whole chain: the first departure, or where bits first differed within bounds;
    plus the stages the candidate did not return (not compared)."""
    missing = sorted({s.stage for s in stages if s.missing}, key=StepResult.STAGES.index)
    note = f"; not returned by the candidate: {', '.join(missing)}" if missing else ""
    if missing and all(s.missing for s in stages):
        return "fail", "the candidate returned no stage of the chain"
    bad = first_departure(stages)
    if bad is not None:
        return "fail", "first departure: " + describe(bad) + note
    diff = first_difference(stages)
    if diff is not None:
        tr = next(r for r in diff.results if n_differ(r))
        return "pass", (f"bits first differ (within bounds) at step {diff.step}, {diff.stage}: {n_differ(tr)} of {tr.n}"
                        + note)
    return "pass", note[2:]

