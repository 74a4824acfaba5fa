"""TE's Linear and LayerNormLinear training steps under a recipe of `reference.recipes`, every intermediate kept.

Source: docs/numerics.md §9; TE (d0067d0) transformer_engine/pytorch/module/linear.py (`_linear_forward_impl`,
`_linear_backward`), layernorm_linear.py, base.py (`grad_output_preprocess`, `quantize_weight`),
quantization.py (`reduce_and_update_fp8_tensors` at autocast exit), csrc/extensions/normalization.cpp
(fused norm + quantize paths). Per step, with tokens M (leading dims flattened), K = in_features,
N = out_features:

    [norm]  ln_out = norm(x)                          (layernorm_linear only; reference.norms)
    fprop   y  = gemm(X rowwise, W rowwise, "TN") + bias          -> [M, N] activation dtype
    dgrad   dX = gemm(dY rowwise, W colwise, "NN")                -> [M, K] activation dtype
    wgrad   dW = gemm(dY colwise, X colwise, "NT") (+ main_grad)  -> [N, K]
    [norm]  dx, dgamma, dbeta = norm_backward(dX)
    dbias = column sums of dY

`run_module(spec, params, steps)` runs a whole case (all steps) and returns a `ModuleRun`: one
`StepResult` per step (every quantized operand, GEMM output and gradient, in chain order through
`StepResult.stages()`) and the final `ModuleState` (weight cache, amax histories, accumulated grads).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from . import norms
from .gemm import gemm, round_out
from .per_tensor import AmaxHistory
from .quantization import quantize
from .recipes import GEMMS, ROLES, DelayedScaling, _Recipe
from .types import QuantizedTensor, SRSeed

MODULES = ("linear", "layernorm_linear")
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Per GEMM: layout and the copies it consumes (docs/numerics.md §6; docs/numerics.md §9.1).
GEMM_LAYOUTS = {"fprop": "TN", "dgrad": "NN", "wgrad": "NT"}
GEMM_OPERANDS = {
    "fprop": (("input", "rowwise"), ("weight", "rowwise")),
    "dgrad": (("grad_output", "rowwise"), ("weight", "colwise")),
    "wgrad": (("grad_output", "colwise"), ("input", "colwise")),
}
_SEED_LIMIT = 2**64


@dataclass(frozen=True)
class Kernels:
    """The quantizer, GEMM and delayed-scaling update a step calls (default: this package's own).

    The torch backend and tests inject other kernels into this orchestration (native/linear.py has its own
    orchestration of docs/numerics.md §9, §9.8). `update_amax_history(h)` None means `h.update()`
    (docs/numerics.md §2).
    """

    quantize: Callable = quantize
    gemm: Callable = gemm
    update_amax_history: Callable | None = None


REFERENCE_KERNELS = Kernels()
_STREAMS_PER_ROLE = 2  # rowwise stream, colwise stream + 1 (SRSeed)


@dataclass(frozen=True)
class ModuleSpec:
    """What a module case fixes besides its tensors (TE constructor and autocast arguments).

    `module` linear | layernorm_linear; `recipe` one of reference.recipes; `normalization`,
    `eps`, `zero_centered_gamma` for layernorm_linear; `activation_dtype` is the dtype of x, dY,
    the parameters and the GEMM outputs; `fuse_wgrad_accumulation` accumulates wgrad into an fp32
    `main_grad` inside the GEMM; `seed` is the case seed of the SR streams (docs/numerics.md §9.5).
    """

    module: str = "linear"
    recipe: _Recipe = field(default_factory=DelayedScaling)
    activation_dtype: torch.dtype = torch.bfloat16
    normalization: str = "LayerNorm"
    eps: float = 1e-5
    zero_centered_gamma: bool = False
    fuse_wgrad_accumulation: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.module not in MODULES:
            raise ValueError(f"module={self.module!r} is invalid: expected one of {MODULES}")
        if not isinstance(self.recipe, _Recipe):
            raise ValueError(f"recipe={self.recipe!r} is invalid: expected a reference.recipes recipe")
        if self.activation_dtype not in ACTIVATION_DTYPES:
            raise ValueError(
                f"activation_dtype={self.activation_dtype} is invalid: expected one of {ACTIVATION_DTYPES}"
            )
        if self.normalization not in norms.NORMALIZATIONS:
            raise ValueError(f"normalization={self.normalization!r} is invalid: expected one of {norms.NORMALIZATIONS}")
        if not (0 <= int(self.seed) < _SEED_LIMIT):
            raise ValueError(f"seed={self.seed!r} is invalid: must be in [0, 2^64)")


@dataclass
class ModuleParams:
    """The parameters: `weight` [N, K], `bias` [N] or None, `ln_weight` / `ln_bias` [K] (LayerNormLinear;
    `ln_bias` only for LayerNorm). All in the activation dtype."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    ln_weight: torch.Tensor | None = None
    ln_bias: torch.Tensor | None = None


@dataclass(frozen=True)
class StepInput:
    """One training step: `x` [..., K], `dy` [..., N] (the gradient of y), `is_first_microbatch`
    (True / False / None, as TE's forward argument) and `weight`, the high-precision weight of this
    step if it changed (an optimizer update); None keeps the current one."""

    x: torch.Tensor
    dy: torch.Tensor
    is_first_microbatch: bool | None = None
    weight: torch.Tensor | None = None


@dataclass(frozen=True)
class GemmInfo:
    """How one GEMM ran: layout, output dtype, TE's split-accumulator choice, accumulate into C."""

    layout: str
    out_dtype: torch.dtype
    split_accumulator: bool
    accumulate: bool


@dataclass
class StepResult:
    """Every intermediate of one step, 2-D over tokens (leading dims of x flattened into M).

    - `ln_out` [M, K], `ln_mu` / `ln_rsigma` fp32 [M]: the norm (layernorm_linear; else None);
    - `x_q`, `w_q`, `dy_q`: QuantizedTensor with both copies (rowwise and colwise) of X (= ln_out
      or x), W (the cached one when the cache was used: `weight_requantized` False) and dY;
    - `fprop` y [M, N], `dgrad` [M, K] (d ln_out for layernorm_linear), `dx` [M, K] (the module's
      input gradient), `wgrad` [N, K] (this step's wgrad GEMM output; with fused accumulation the
      GEMM writes main_grad + dYᵀX), `dbias` [N], `dgamma` / `dbeta` [K];
    - `weight_grad` (weight.grad after the step) or `main_grad` (fp32, fuse_wgrad_accumulation);
    - `scales` / `histories`: per role the delayed-scaling scale fp32 [1] and amax history after the
      end-of-step update (fp8_delayed only);
    - `sr_seeds`: the SRSeed of each stochastically rounded role; `gemms`: GemmInfo per GEMM.
    """

    step: int
    is_first_microbatch: bool | None
    weight_requantized: bool
    x_q: QuantizedTensor
    w_q: QuantizedTensor
    dy_q: QuantizedTensor
    fprop: torch.Tensor
    dgrad: torch.Tensor
    dx: torch.Tensor
    wgrad: torch.Tensor
    dbias: torch.Tensor | None = None
    ln_out: torch.Tensor | None = None
    ln_mu: torch.Tensor | None = None
    ln_rsigma: torch.Tensor | None = None
    dgamma: torch.Tensor | None = None
    dbeta: torch.Tensor | None = None
    weight_grad: torch.Tensor | None = None
    main_grad: torch.Tensor | None = None
    scales: dict[str, torch.Tensor] = field(default_factory=dict)
    histories: dict[str, torch.Tensor] = field(default_factory=dict)
    sr_seeds: dict[str, SRSeed] = field(default_factory=dict)
    gemms: dict[str, GemmInfo] = field(default_factory=dict)

    STAGES = (
        "ln_out", "x_q", "w_q", "fprop", "dy_q", "dgrad", "dx", "dgamma", "dbeta", "wgrad", "dbias",
        "weight_grad", "main_grad",
    )

    def stages(self) -> list[tuple[str, torch.Tensor | QuantizedTensor]]:
        """(name, value) in the order the step computes them, skipping those the case does not have."""
        return [(n, getattr(self, n)) for n in self.STAGES if getattr(self, n) is not None]


@dataclass
class ModuleState:
    """What carries over between steps: the cached quantized weight, the amax histories of the
    fp8_delayed roles, weight.grad or main_grad, and the current high-precision weight."""

    weight: torch.Tensor
    weight_cache: QuantizedTensor | None = None
    histories: dict[str, AmaxHistory] = field(default_factory=dict)
    weight_grad: torch.Tensor | None = None
    main_grad: torch.Tensor | None = None


@dataclass
class ModuleRun:
    """A whole case: `steps` (one StepResult per step) and the final `state`."""

    steps: list[StepResult]
    state: ModuleState


def sr_seed(seed: int, step: int, role: str) -> SRSeed:
    """The SR seed of (step, role): stream 2*(3*step + role index); the colwise copy uses stream + 1.

    NUMERICS: docs/numerics.md §9.5 - one Philox stream per (step, role, copy), all from the case
    seed, so every step draws fresh bits and a rerun with the same seed draws the same ones.
    """
    if role not in ROLES:
        raise ValueError(f"role={role!r} is invalid: expected one of {ROLES}")
    stream = _STREAMS_PER_ROLE * (len(ROLES) * step + ROLES.index(role))
    return SRSeed(int(seed), stream)


def initial_state(spec: ModuleSpec, params: ModuleParams) -> ModuleState:
    """The state before step 0: no cached weight, fresh histories (scale 1, zeros), main_grad zeros."""
    w = params.weight
    hist = {}
    if isinstance(spec.recipe, DelayedScaling):
        hist = {role: AmaxHistory(spec.recipe.config(role), device=w.device) for role in ROLES}
    main = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if spec.fuse_wgrad_accumulation else None
    return ModuleState(weight=w, histories=hist, main_grad=main)


def check_step(spec: ModuleSpec, params: ModuleParams, inp: StepInput, state: ModuleState) -> None:
    """The step's input rules (dtypes, shapes, the norm weight of a LayerNormLinear): ValueError naming the field.
    A rule on names and shapes, shared with native.linear like reference.spec's checks (docs/numerics.md §9.7)."""
    act = spec.activation_dtype
    n, k = state.weight.shape
    for name, t, last in (("x", inp.x, k), ("dy", inp.dy, n)):
        if t.dtype != act or t.shape[-1] != last:
            raise ValueError(f"{name} is {t.dtype} {tuple(t.shape)}; expected {act} [..., {last}] ({spec})")
    if inp.x.shape[:-1] != inp.dy.shape[:-1]:
        raise ValueError(f"x {tuple(inp.x.shape)} and dy {tuple(inp.dy.shape)} have different leading dims")
    if inp.weight is not None and (inp.weight.shape != state.weight.shape or inp.weight.dtype != act):
        raise ValueError(f"step weight is {inp.weight.dtype} {tuple(inp.weight.shape)}; expected {act} [{n}, {k}]")
    if state.weight.dtype != act:
        raise ValueError(f"weight is {state.weight.dtype}; expected the activation dtype {act}")
    if spec.module == "layernorm_linear" and params.ln_weight is None:
        raise ValueError("layernorm_linear needs params.ln_weight (and ln_bias for LayerNorm)")


def _quantize(x: torch.Tensor, spec: ModuleSpec, role: str, step: int, state: ModuleState, seeds: dict,
              kernels: Kernels = REFERENCE_KERNELS):
    """Both copies of one role's tensor with the recipe's config, SR seed and delayed-scaling state."""
    cfg = spec.recipe.config(role)
    rng = None
    if cfg.stochastic:
        rng = sr_seed(spec.seed, step, role)
        seeds[role] = rng
    # NUMERICS: numerics.md §9.1 every role is quantized rowwise and colwise (TE set_usage(rowwise=True,
    # columnwise=True) when the backward needs both); fp8_delayed reads the role's scale, records amax in H[0].
    return kernels.quantize(x, cfg, rowwise=True, colwise=True, rng=rng, state=state.histories.get(role))


def _gemm_bias(bias: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """The bias as the fprop GEMM gets it (TE linear.py: FP8 GEMMs take no fp32 bias, so bf16)."""
    # NUMERICS: numerics.md §9.1 TE casts the bias to the activation dtype, or to bf16 when that is fp32 and
    # the GEMM is quantized ("cuBLAS does not support FP8 GEMM with FP32 bias"): one RN_bf16.
    return bias.to(torch.bfloat16 if act == torch.float32 else act)


def _end_of_step(state: ModuleState, roles: tuple[str, ...], scales: dict, histories: dict,
                 kernels: Kernels = REFERENCE_KERNELS) -> None:
    """The fused delayed-scaling update of `roles`, and a snapshot of their scale and history after it."""
    for role in roles:
        h = state.histories.get(role)
        if h is None:
            continue
        if kernels.update_amax_history is None:
            h.update()  # NUMERICS: §2 fused end-of-step update (roll, A_max, scale)
        else:
            kernels.update_amax_history(h)
        scales[role] = h.scale.clone()
        histories[role] = h.history.clone()


def module_step(spec: ModuleSpec, params: ModuleParams, inp: StepInput, state: ModuleState, step: int,
                kernels: Kernels = REFERENCE_KERNELS) -> StepResult:
    """One forward + backward of the module; updates `state` in place (docs/numerics.md §9).
    `kernels`: whose quantize / gemm / amax update run the step (`Kernels`)."""
    kg = kernels.gemm
    check_step(spec, params, inp, state)
    if inp.weight is not None:
        state.weight = inp.weight
    act = spec.activation_dtype
    rec = spec.recipe
    n, k = state.weight.shape
    x2d = inp.x.reshape(-1, k)
    dy2d = inp.dy.reshape(-1, n)
    seeds: dict[str, SRSeed] = {}
    scales: dict[str, torch.Tensor] = {}
    histories: dict[str, torch.Tensor] = {}

    # ---- forward ----
    ln = None
    x_src = x2d
    if spec.module == "layernorm_linear":
        ln = norms.norm_forward(
            x2d, params.ln_weight, params.ln_bias, normalization=spec.normalization, eps=spec.eps,
            zero_centered_gamma=spec.zero_centered_gamma, out_dtype=act,
        )
        # NUMERICS: numerics.md §9.2 TE normalization.cpp: a delayed-scaling quantizer is fused into the norm kernel
        # (FULLY_FUSED: codes from the fp32 norm output, amax of it); every other recipe quantizes
        # the activation-dtype ln_out (UNFUSED / FUSED_NORM_AMAX: amax of the rounded value).
        x_src = ln.out_fp32 if isinstance(rec, DelayedScaling) else ln.out
    x_q = _quantize(x_src, spec, "input", step, state, seeds, kernels)

    # NUMERICS: numerics.md §9.4 weight cache - True: quantize and cache; False: reuse the cache (quantize on a
    # miss, as TE quantize_weight does); None: quantize every step, no cache.
    mb = inp.is_first_microbatch
    requant = mb is None or mb or state.weight_cache is None
    if requant:
        w_q = _quantize(state.weight, spec, "weight", step, state, seeds, kernels)
        state.weight_cache = w_q if mb is not None else None
    else:
        w_q = state.weight_cache
    bias = None if params.bias is None else _gemm_bias(params.bias, act)
    # NUMERICS: §6 fprop TN: rowwise X and W; out in the activation dtype, bias in the epilogue.
    y = kg(x_q, w_q, layout="TN", out_dtype=act, bias=bias)
    # NUMERICS: numerics.md §9.6 TE updates the forward slots (input, weight) when the autocast context exits.
    _end_of_step(state, ("input", "weight"), scales, histories, kernels)

    # ---- backward ----
    dy_q = _quantize(dy2d, spec, "grad_output", step, state, seeds, kernels)
    dbias = None
    if params.bias is not None:
        # NUMERICS: numerics.md §9.3 dbias = column sums of the high-precision dY, one rounding to the activation
        # dtype (TE bgrad_quantize / grad_output.sum(dim=0): fp32 accumulation in a launch order).
        dbias = round_out(norms.ordered_sum(dy2d, 0), act)
    # NUMERICS: §6 dgrad NN: dY rowwise, W colwise; out in the activation dtype.
    dgrad = kg(dy_q, w_q, layout="NN", out_dtype=act)
    dx, dgamma, dbeta = dgrad, None, None
    if ln is not None:
        nb = norms.norm_backward(
            dgrad, x2d, ln, params.ln_weight, normalization=spec.normalization,
            zero_centered_gamma=spec.zero_centered_gamma,
        )
        dx, dgamma, dbeta = nb.dx, nb.dgamma, nb.dbeta
    gemms = {g: GemmInfo(GEMM_LAYOUTS[g], act, rec.split_accumulator(g), False) for g in GEMMS}
    # NUMERICS: numerics.md §9.3 wgrad NT: dY colwise, X colwise. Fused: out = main_grad (fp32), accumulated unless
    # is_first_microbatch is True (TE linear.py accumulate_wgrad_into_param_main_grad).
    weight_grad = main_grad = None
    if spec.fuse_wgrad_accumulation:
        accumulate = mb is None or not mb
        wgrad = kg(dy_q, x_q, layout="NT", out_dtype=torch.float32, c=state.main_grad if accumulate else None)
        state.main_grad = main_grad = wgrad
        gemms["wgrad"] = GemmInfo("NT", torch.float32, rec.split_accumulator("wgrad"), accumulate)
    else:
        wgrad = kg(dy_q, x_q, layout="NT", out_dtype=act)
        if state.weight_grad is None:
            state.weight_grad = wgrad
        else:
            # NUMERICS: numerics.md §9.3 torch autograd accumulates .grad elementwise in the parameter dtype:
            # fp32 add of the widened values, then one rounding to that dtype.
            state.weight_grad = (state.weight_grad.to(torch.float32) + wgrad.to(torch.float32)).to(act)
        weight_grad = state.weight_grad
    # NUMERICS: numerics.md §9.6 the backward slot (grad_output) is updated at the end of the backward pass.
    _end_of_step(state, ("grad_output",), scales, histories, kernels)
    return StepResult(
        step=step, is_first_microbatch=mb, weight_requantized=requant, x_q=x_q, w_q=w_q, dy_q=dy_q,
        fprop=y, dgrad=dgrad, dx=dx, wgrad=wgrad, dbias=dbias,
        ln_out=None if ln is None else ln.out, ln_mu=None if ln is None else ln.mu,
        ln_rsigma=None if ln is None else ln.rsigma, dgamma=dgamma, dbeta=dbeta,
        weight_grad=weight_grad, main_grad=main_grad, scales=scales, histories=histories,
        sr_seeds=seeds, gemms=gemms,
    )


def run_module(
    spec: ModuleSpec, params: ModuleParams, steps: list[StepInput], state: ModuleState | None = None,
    kernels: Kernels = REFERENCE_KERNELS,
) -> ModuleRun:
    """Run every step of a module case in order and return all intermediates (docs/numerics.md §9)."""
    st = initial_state(spec, params) if state is None else state
    results = [module_step(spec, params, inp, st, i, kernels) for i, inp in enumerate(steps)]
    return ModuleRun(steps=results, state=st)
