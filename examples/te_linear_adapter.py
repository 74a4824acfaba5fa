"""An adapter that runs TransformerEngine's `te.Linear` / `te.LayerNormLinear` under `te.autocast` as a backend.

NOT RUNNABLE HERE: TransformerEngine is not installable on the machines this project is developed on (it
needs a CUDA toolkit build and a recent GPU); the adapter is written against TE's public PyTorch API and its
test (tests/unit/test_chain.py) is skipped where `transformer_engine` cannot be imported. On a machine
with TE and a GPU:

    python -m harness run --tier modules --backend examples.te_linear_adapter:backend --device cuda --out reports/te

What it returns per step (docs/numerics.md §9.7, §9.8): the module output (`fprop`), `ln_out`
(`return_layernorm_output=True`), x.grad (`dx`), weight.grad or main_grad, and the per-step bias, gamma
and beta gradients (zeroed before every backward). TE keeps its quantized operands and the dgrad / wgrad
GEMM outputs inside the autograd function, so `x_q`, `w_q`, `dy_q`, `dgrad` and `wgrad` are None: the chain
comparison lists them as not returned and checks the rest. TE draws SR bits from PyTorch's generator
(docs/numerics.md §7.12, §9.5), so NVFP4 cases with stochastic rounding on dY differ from the golden at
dY and must be compared with a tolerance of their own; use `nvfp4-nsr` recipes for a bitwise check.
"""

from __future__ import annotations

import torch

from reference.linear import ModuleRun, StepResult
from reference.recipes import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from reference.types import Unsupported


def _te():
    try:
        import transformer_engine.pytorch as te  # noqa: PLC0415
        from transformer_engine.common import recipe as te_recipe  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001 - any import failure means TE is not usable here
        raise Unsupported(f"TransformerEngine cannot be imported ({type(e).__name__}: {e})") from None
    return te, te_recipe


def te_recipe_of(r, te_recipe):
    """Our recipe (reference.recipes) as TE's recipe object (the field names are TE's)."""
    fmt = {"e4m3": te_recipe.Format.E4M3, "hybrid": te_recipe.Format.HYBRID}
    if isinstance(r, DelayedScaling):
        return te_recipe.DelayedScaling(fp8_format=fmt[r.fp8_format], margin=r.margin,
                                        amax_history_len=r.amax_history_len, amax_compute_algo=r.amax_compute_algo)
    if isinstance(r, Float8CurrentScaling):
        return te_recipe.Float8CurrentScaling(fp8_format=fmt[r.fp8_format])
    if isinstance(r, MXFP8BlockScaling):
        if r.enable_2d_quantization or r.e8m0_rule != "ceil":
            raise Unsupported("TE's MXFP8BlockScaling has no 2-D weights or floor rule")
        return te_recipe.MXFP8BlockScaling(fp8_format=fmt[r.fp8_format])
    if isinstance(r, Float8BlockScaling):
        return te_recipe.Float8BlockScaling(fp8_format=fmt[r.fp8_format], x_block_scaling_dim=r.x_block_scaling_dim,
                                            w_block_scaling_dim=r.w_block_scaling_dim,
                                            grad_block_scaling_dim=r.grad_block_scaling_dim)
    if isinstance(r, NVFP4BlockScaling):
        return te_recipe.NVFP4BlockScaling(disable_rht=r.disable_rht,
                                           disable_stochastic_rounding=r.disable_stochastic_rounding,
                                           disable_2d_quantization=r.disable_2d_quantization)
    raise Unsupported(f"no TE recipe for {r!r}")


class TELinearBackend:
    """`run_module` through te.Linear / te.LayerNormLinear (see the module docstring)."""

    name = "te"

    def supports(self, op, config, device):
        if op != "linear":
            return False, "te: this adapter runs module cases (op linear) only"
        if torch.device(device).type != "cuda":
            return False, f"te: TransformerEngine runs on CUDA only (device is {device})"
        try:
            _te()
        except Unsupported as e:
            return False, f"te: {e}"
        return True, ""

    def run_module(self, spec, params, steps):
        te, te_recipe = _te()
        n, k = params.weight.shape
        act = spec.activation_dtype
        common = dict(bias=params.bias is not None, params_dtype=act, device=params.weight.device,
                      fuse_wgrad_accumulation=spec.fuse_wgrad_accumulation)
        if spec.module == "linear":
            mod = te.Linear(k, n, **common)
        else:
            mod = te.LayerNormLinear(k, n, eps=spec.eps, normalization=spec.normalization,
                                     zero_centered_gamma=spec.zero_centered_gamma, return_layernorm_output=True,
                                     **common)
        with torch.no_grad():
            mod.weight.copy_(params.weight)
            if params.bias is not None:
                mod.bias.copy_(params.bias)
            if spec.module == "layernorm_linear":
                mod.layer_norm_weight.copy_(params.ln_weight)
                if params.ln_bias is not None:
                    mod.layer_norm_bias.copy_(params.ln_bias)
        if spec.fuse_wgrad_accumulation:
            mod.weight.main_grad = torch.zeros((n, k), dtype=torch.float32, device=params.weight.device)
        recipe = te_recipe_of(spec.recipe, te_recipe)
        out = []
        for i, inp in enumerate(steps):
            if inp.weight is not None:
                with torch.no_grad():
                    mod.weight.copy_(inp.weight)
            for p in (getattr(mod, "bias", None), getattr(mod, "layer_norm_weight", None),
                      getattr(mod, "layer_norm_bias", None)):
                if isinstance(p, torch.Tensor):
                    p.grad = None  # per-step gradients, as the golden reports them
            x = inp.x.detach().clone().requires_grad_(True)
            with te.autocast(enabled=True, recipe=recipe):
                y = mod(x, is_first_microbatch=inp.is_first_microbatch)
            ln_out = None
            if isinstance(y, tuple):
                y, ln_out = y
            y.backward(inp.dy)
            grad = lambda p: None if p is None or p.grad is None else p.grad.detach().clone()  # noqa: E731
            out.append(StepResult(
                step=i, is_first_microbatch=inp.is_first_microbatch, weight_requantized=True,
                x_q=None, w_q=None, dy_q=None, fprop=y.detach().reshape(-1, n), dgrad=None,
                dx=x.grad.detach().reshape(-1, k), wgrad=None, dbias=grad(getattr(mod, "bias", None)),
                ln_out=None if ln_out is None else ln_out.detach().reshape(-1, k),
                dgamma=grad(getattr(mod, "layer_norm_weight", None)), dbeta=grad(getattr(mod, "layer_norm_bias", None)),
                weight_grad=None if spec.fuse_wgrad_accumulation else grad(mod.weight),
                main_grad=mod.weight.main_grad.detach().clone() if spec.fuse_wgrad_accumulation else None,
            ))
        return ModuleRun(steps=out, state=None)


backend = TELinearBackend()
