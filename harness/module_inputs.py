"""Inputs of a `linear` case and the reference.linear arguments built from them.

Source: docs/numerics.md §9; TE tests/pytorch/nvfp4/test_nvfp4_module_exact.py (a new x and dY drawn from
N(0, 1) every step; `is_first_microbatch=(step == 0)`), TE's default parameter init (weight N(0, 0.023²)).
Drawn on the requested device through harness.draws (the same bytes on every device), seeded by
harness.inputs.draw_seed(case, "module"): N(0, 1) in float64, scaled and shifted in float64, rounded to
fp32, then to the activation dtype:
- "x" [steps, *tokens, K] and "dy" [steps, *tokens, N]: N(0, 1), a fresh draw per step;
- "weight" [N, K]: N(0, 0.023²) (TE's init_method_normal(0.023));
- "weight_updates" [steps, N, K] (microbatch `cache_update` only): a new high-precision W before every
  step > 0 (row 0 is unused), N(0, 0.023²);
- "bias" [N] (bias cases): N(0, 0.1²), not TE's zeros, so the fprop epilogue adds something;
- "ln_weight" / "ln_bias" [K] (layernorm_linear; ln_bias for LayerNorm only): 1 + N(0, 0.1²) (zero-centred
  gamma: N(0, 0.1²)) and N(0, 0.1²), not TE's ones / zeros, so gamma and beta act.
"""

from __future__ import annotations

import torch

from reference.linear import ModuleParams, ModuleSpec, StepInput
from reference.spec import TORCH_DTYPES

WEIGHT_STD = 0.023  # TE get_default_init_method(): init_method_normal(0.023)
PARAM_STD = 0.1


def generate_module(case, device: str | torch.device = "cpu") -> dict:
    """The tensors of a linear case (see the module docstring), on `device`."""
    from .inputs import case_draws  # noqa: PLC0415 - harness.inputs imports this module lazily too

    s = case.module
    *tokens, k, n = case.shape
    act = TORCH_DTYPES[case.in_dtype]
    d = case_draws(case, "module", torch.device(device))

    def draw(shape, std=1.0, mean=0.0):
        # NUMERICS: §0.2 - separate float64 multiply and add (no fused op), then RN to fp32 and to the activation dtype.
        return d.normal(shape).mul_(std).add_(mean).to(torch.float32).to(act)

    out = {"x": draw((s.steps, *tokens, k)), "dy": draw((s.steps, *tokens, n)), "weight": draw((n, k), WEIGHT_STD)}
    if s.microbatch == "cache_update":
        out["weight_updates"] = draw((s.steps, n, k), WEIGHT_STD)
    if case.bias:
        out["bias"] = draw((n,), PARAM_STD)
    if s.module == "layernorm_linear":
        out["ln_weight"] = draw((k,), PARAM_STD, 0.0 if s.zero_centered_gamma else 1.0)
        if s.normalization == "LayerNorm":
            out["ln_bias"] = draw((k,), PARAM_STD)
    return out


def module_args(case, t: dict) -> tuple[ModuleSpec, ModuleParams, list[StepInput]]:
    """(spec, params, steps) of reference.linear.run_module from a case and its tensors `t` (any device)."""
    s = case.module
    spec = ModuleSpec(
        module=s.module, recipe=s.recipe, activation_dtype=TORCH_DTYPES[case.in_dtype],
        normalization=s.normalization or "LayerNorm", zero_centered_gamma=s.zero_centered_gamma,
        fuse_wgrad_accumulation=s.fuse_wgrad_accumulation, seed=case.seed,
    )
    params = ModuleParams(weight=t["weight"], bias=t.get("bias"), ln_weight=t.get("ln_weight"),
                          ln_bias=t.get("ln_bias"))
    updates = t.get("weight_updates")
    steps = [
        StepInput(t["x"][i], t["dy"][i], s.is_first_microbatch(i),
                  None if updates is None or i == 0 else updates[i])
        for i in range(s.steps)
    ]
    return spec, params, steps
