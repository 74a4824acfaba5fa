"""The native backend's Linear / LayerNormLinear training step: its own orchestration and its own kernels.

Source: docs/numerics.md §9 (§9.1 the step, §9.2 norms, §9.3 dbias and wgrad accumulation, §9.4 weight cache,
§9.5 SR seeds, §9.6 delayed-scaling state), written from the contract, not from reference/linear.py: only its
contract types (ModuleSpec, ModuleParams, StepInput, StepResult, ModuleState, ModuleRun, GemmInfo) are shared.
Every number of a step is native's: native.quantize, native.gemm (cuBLASLt or, where this GPU lacks the scale
mode, the portable block-scaled kernel: method "auto"), native.update_amax_history, and the norm / dbias
kernels of native/cuda/norms.cu (`native.norms`). The only torch arithmetic left is elementwise and named: the
fprop bias cast and the weight.grad accumulation (§9.1, §9.3).
CUDA only; the harness checks it with the gpu-marked tests. `with_kernels` replaces any of the kernels (CPU
tests of the orchestration inject reference quantize / gemm and CPU stand-ins for the norms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from reference.formats import SCHEMES
from reference.linear import (
    GemmInfo,
    ModuleParams,
    ModuleRun,
    ModuleSpec,
    ModuleState,
    StepInput,
    StepResult,
    check_step,
)
from reference.per_tensor import AmaxHistory
from reference.types import SRSeed, Unsupported

# NUMERICS: numerics.md §9.5 role r = 0, 1, 2 in this order indexes the SR streams; §9.1 the three GEMMs.
ROLES = ("input", "weight", "grad_output")
GEMMS = ("fprop", "dgrad", "wgrad")
LAYOUTS = {"fprop": "TN", "dgrad": "NN", "wgrad": "NT"}  # docs/numerics.md §9.1, §6


@dataclass(frozen=True)
class Kernels:
    """What a step calls; None means native's own. quantize / gemm / update_amax_history as in `native`;
    norm_forward / norm_backward / column_sum as in `native.norms`."""

    quantize: Callable | None = None
    gemm: Callable | None = None
    update_amax_history: Callable | None = None
    norm_forward: Callable | None = None
    norm_backward: Callable | None = None
    column_sum: Callable | None = None


def kernels(with_kernels=None) -> Kernels:
    """Native's kernels, each replaced by the attribute of the same name of `with_kernels` when it has one
    that is not None (a `Kernels`, or any object with some of these attributes, e.g. reference.linear.Kernels)."""
    from . import gemm, norms, quantize, update_amax_history  # noqa: PLC0415 - the package imports CuPy lazily

    own = {"quantize": quantize, "gemm": gemm, "update_amax_history": update_amax_history,
           "norm_forward": norms.norm_forward, "norm_backward": norms.norm_backward, "column_sum": norms.column_sum}
    return Kernels(**{n: getattr(with_kernels, n, None) or f for n, f in own.items()})


def sr_seed(seed: int, step: int, role: str) -> SRSeed:
    """NUMERICS: numerics.md §9.5 SRSeed(case seed, stream 2*(3*step + r)); the colwise copy draws stream + 1
    (§5.7, inside the quantizer)."""
    return SRSeed(int(seed), 2 * (3 * step + ROLES.index(role)))


def _delayed(spec: ModuleSpec, role: str) -> bool:
    """The role's quantizer takes its scale from an amax history (delayed scaling, docs/numerics.md §2)."""
    return SCHEMES[spec.recipe.config(role).scheme].amax_history


def initial_state(spec: ModuleSpec, params: ModuleParams) -> ModuleState:
    """NUMERICS: numerics.md §9.6 one AmaxHistory per delayed-scaling role (scale 1, zero history); §9.3 main_grad
    zeros (fp32) with fuse_wgrad_accumulation; no cached weight."""
    w = params.weight
    hist = {r: AmaxHistory(spec.recipe.config(r), device=w.device) for r in ROLES if _delayed(spec, r)}
    main = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if spec.fuse_wgrad_accumulation else None
    return ModuleState(weight=w, histories=hist, main_grad=main)


class _Step:
    """One forward + backward (docs/numerics.md §9.1) with kernels `kn`; updates `state` in place."""

    def __init__(self, spec: ModuleSpec, state: ModuleState, step: int, kn: Kernels):
        self.spec, self.state, self.step, self.kn = spec, state, step, kn
        self.seeds: dict[str, SRSeed] = {}
        self.scales: dict[str, torch.Tensor] = {}
        self.histories: dict[str, torch.Tensor] = {}

    def quantize(self, t: torch.Tensor, role: str):
        """NUMERICS: numerics.md §9.1 both copies of the role's tensor by recipe.config(role); §9.5 its SR seed;
        §9.6 a delayed-scaling role reads its scale and records its amax in its history."""
        cfg = self.spec.recipe.config(role)
        rng = None
        if cfg.stochastic:
            rng = self.seeds[role] = sr_seed(self.spec.seed, self.step, role)
        return self.kn.quantize(t, cfg, rowwise=True, colwise=True, rng=rng, state=self.state.histories.get(role))

    def update(self, roles: tuple[str, ...]) -> None:
        """NUMERICS: numerics.md §9.6 the fused end-of-step update (§2) of each delayed-scaling role in `roles`,
        then a snapshot of its scale and history."""
        for role in roles:
            h = self.state.histories.get(role)
            if h is not None:
                self.kn.update_amax_history(h)
                self.scales[role], self.histories[role] = h.scale.clone(), h.history.clone()


def module_step(spec: ModuleSpec, params: ModuleParams, inp: StepInput, state: ModuleState, step: int,
                kn: Kernels) -> StepResult:
    """One step of docs/numerics.md §9.1 in its order; updates `state` (cache, histories, grads) in place."""
    check_step(spec, params, inp, state)
    if inp.weight is not None:
        state.weight = inp.weight  # an optimizer update of the high-precision weight (§9.4)
    act = spec.activation_dtype
    n, k = state.weight.shape
    x2d, dy2d = inp.x.reshape(-1, k), inp.dy.reshape(-1, n)
    run = _Step(spec, state, step, kn)
    mb = inp.is_first_microbatch

    # ---- forward ----
    ln = None
    x_src = x2d
    if spec.module == "layernorm_linear":
        ln = kn.norm_forward(x2d, params.ln_weight, params.ln_bias, normalization=spec.normalization, eps=spec.eps,
                             zero_centered_gamma=spec.zero_centered_gamma, out_dtype=act)
        # NUMERICS: numerics.md §9.2 a delayed-scaling input quantizer is fused into TE's norm kernel and quantizes
        # the fp32 out32; every other quantizer gets the act-rounded ln_out.
        x_src = ln.out_fp32 if _delayed(spec, "input") else ln.out
    x_q = run.quantize(x_src, "input")
    # NUMERICS: numerics.md §9.4 True: quantize W and cache it; False: the cached W as is (a miss quantizes and
    # caches); None: quantize, cache nothing.
    requant = mb is None or mb or state.weight_cache is None
    if requant:
        w_q = run.quantize(state.weight, "weight")
        state.weight_cache = None if mb is None else w_q
    else:
        w_q = state.weight_cache
    bias = None
    if params.bias is not None:
        # NUMERICS: numerics.md §9.1 the fprop bias is cast to act, or to bf16 when act is fp32: one RN.
        bias = params.bias.to(torch.bfloat16 if act == torch.float32 else act)
    y = kn.gemm(x_q, w_q, layout=LAYOUTS["fprop"], out_dtype=act, bias=bias)  # NUMERICS: §9.1 X, W rowwise
    run.update(("input", "weight"))  # NUMERICS: numerics.md §9.6 forward roles at the autocast exit

    # ---- backward ----
    dy_q = run.quantize(dy2d, "grad_output")
    # NUMERICS: numerics.md §9.3 dbias = RN_act(S over tokens of the high-precision dY) (native.norms.column_sum).
    dbias = None if params.bias is None else kn.column_sum(dy2d)
    dgrad = kn.gemm(dy_q, w_q, layout=LAYOUTS["dgrad"], out_dtype=act)  # NUMERICS: §9.1 dY rowwise, W colwise
    dx, dgamma, dbeta = dgrad, None, None
    if ln is not None:
        nb = kn.norm_backward(dgrad, x2d, ln, params.ln_weight, normalization=spec.normalization,
                              zero_centered_gamma=spec.zero_centered_gamma)
        dx, dgamma, dbeta = nb.dx, nb.dgamma, nb.dbeta
    rec = spec.recipe
    gemms = {g: GemmInfo(LAYOUTS[g], act, rec.split_accumulator(g), False) for g in GEMMS}
    weight_grad = main_grad = None
    if spec.fuse_wgrad_accumulation:
        # NUMERICS: numerics.md §9.3 fused: the wgrad GEMM writes fp32 main_grad with C = main_grad (§6 accumulate
        # epilogue), except with is_first_microbatch True, where it overwrites it.
        accumulate = not mb
        wgrad = kn.gemm(dy_q, x_q, layout=LAYOUTS["wgrad"], out_dtype=torch.float32,
                        c=state.main_grad if accumulate else None)
        state.main_grad = main_grad = wgrad
        gemms["wgrad"] = GemmInfo(LAYOUTS["wgrad"], torch.float32, rec.split_accumulator("wgrad"), accumulate)
    else:
        wgrad = kn.gemm(dy_q, x_q, layout=LAYOUTS["wgrad"], out_dtype=act)  # NUMERICS: §9.1 dY, X colwise
        if state.weight_grad is None:
            state.weight_grad = wgrad
        else:
            # NUMERICS: numerics.md §9.3 weight.grad += dW as torch autograd does in the parameter dtype: one fp32
            # add of the exactly widened values, then one RN_act (a no-op for fp32).
            # A new tensor each step: the earlier steps' results keep their own weight_grad / wgrad.
            state.weight_grad = (state.weight_grad.to(torch.float32) + wgrad.to(torch.float32)).to(act)
        weight_grad = state.weight_grad
    run.update(("grad_output",))  # NUMERICS: numerics.md §9.6 the backward role at the end of the backward
    return StepResult(
        step=step, is_first_microbatch=mb, weight_requantized=requant, x_q=x_q, w_q=w_q, dy_q=dy_q,
        fprop=y, dgrad=dgrad, dx=dx, wgrad=wgrad, dbias=dbias,
        ln_out=None if ln is None else ln.out, ln_mu=None if ln is None else ln.mu,
        ln_rsigma=None if ln is None else ln.rsigma, dgamma=dgamma, dbeta=dbeta,
        weight_grad=weight_grad, main_grad=main_grad, scales=run.scales, histories=run.histories,
        sr_seeds=run.seeds, gemms=gemms,
    )


def run_module(spec: ModuleSpec, params: ModuleParams, steps: list[StepInput], *,
               with_kernels=None) -> ModuleRun:
    """Every step of a module case, in order, from a fresh state (docs/numerics.md §9). The tensors must be on
    a CUDA device unless `with_kernels` replaces every kernel (`kernels`)."""
    kn = kernels(with_kernels)
    own = kernels()
    if params.weight.device.type != "cuda" and any(getattr(kn, f) is getattr(own, f) for f in Kernels.__annotations__):
        raise Unsupported(f"native.linear runs on CUDA only (the weight is on {params.weight.device})")
    state = initial_state(spec, params)
    return ModuleRun(steps=[module_step(spec, params, inp, state, i, kn) for i, inp in enumerate(steps)], state=state)
