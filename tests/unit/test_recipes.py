"""reference.recipes: TE recipes -> QuantConfig per role (TE common/recipe/__init__.py defaults, docs/numerics.md §5.5)."""

from __future__ import annotations

import dataclasses

import pytest

from reference.formats import QuantConfig
from reference.recipes import (
    RECIPES,
    ROLES,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)


def test_delayed_scaling_defaults_hybrid():
    r = DelayedScaling()
    assert r.config("input") == QuantConfig(
        "fp8_delayed", element="e4m3", amax_history_len=1024, amax_compute_algo="max"
    )
    assert r.config("weight") == QuantConfig("fp8_delayed", element="e4m3")
    assert r.config("grad_output") == QuantConfig("fp8_delayed", element="e5m2")


def test_delayed_scaling_fields_and_e4m3_format():
    r = DelayedScaling(margin=2, fp8_format="e4m3", amax_history_len=16, amax_compute_algo="most_recent")
    expected = QuantConfig(
        "fp8_delayed", element="e4m3", amax_history_len=16, amax_compute_algo="most_recent", margin=2
    )
    assert r.configs() == {role: expected for role in ROLES}


def test_current_scaling_defaults_and_pow2():
    r = Float8CurrentScaling()
    assert r.config("input") == QuantConfig("fp8_current", element="e4m3", pow2_scales=False, eps=0.0)
    assert r.config("grad_output") == QuantConfig("fp8_current", element="e5m2", pow2_scales=False)
    r2 = Float8CurrentScaling(use_power_2_scales=True, fp8_format="e4m3")
    assert r2.config("grad_output") == QuantConfig("fp8_current", element="e4m3", pow2_scales=True)
    # TE MMParams defaults: fprop fast accumulation, dgrad/wgrad split accumulator.
    assert [r.split_accumulator(g) for g in ("fprop", "dgrad", "wgrad")] == [False, True, True]


def test_mxfp8_defaults_e4m3_everywhere_and_2d_weights():
    r = MXFP8BlockScaling()
    assert r.configs() == {role: QuantConfig("mxfp8", element="e4m3", tile=(1, 32)) for role in ROLES}
    r2 = MXFP8BlockScaling(fp8_format="hybrid", enable_2d_quantization=True, e8m0_rule="floor")
    assert r2.config("weight") == QuantConfig("mxfp8", element="e4m3", tile=(32, 32), e8m0_rule="floor")
    assert r2.config("input") == QuantConfig("mxfp8", element="e4m3", tile=(1, 32), e8m0_rule="floor")
    assert r2.config("grad_output") == QuantConfig("mxfp8", element="e5m2", tile=(1, 32), e8m0_rule="floor")


def test_float8_block_scaling_defaults():
    r = Float8BlockScaling()
    assert r.config("input") == QuantConfig("fp8_block", element="e4m3", tile=(1, 128), pow2_scales=True)
    assert r.config("weight") == QuantConfig("fp8_block", element="e4m3", tile=(128, 128), pow2_scales=True)
    assert r.config("grad_output") == QuantConfig("fp8_block", element="e4m3", tile=(1, 128), pow2_scales=True)
    assert all(r.split_accumulator(g) for g in ("fprop", "dgrad", "wgrad"))


def test_float8_block_scaling_f32_scales_and_hybrid():
    r = Float8BlockScaling(use_f32_scales=True, fp8_format="hybrid")
    assert r.config("grad_output") == QuantConfig("fp8_block", element="e5m2", tile=(1, 128), pow2_scales=False)
    assert r.config("weight").pow2_scales is False


@pytest.mark.parametrize(
    "dims", [dict(x_block_scaling_dim=2), dict(grad_block_scaling_dim=2), dict(x_block_scaling_dim=3)], ids=str
)
def test_float8_block_scaling_rejects_2d_by_2d_and_bad_dims(dims):
    with pytest.raises(ValueError, match="block_scaling_dim"):
        Float8BlockScaling(**dims)


def test_float8_block_scaling_2d_input_with_1d_weight_allowed():
    r = Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1)
    assert r.config("input").tile == (128, 128)
    assert r.config("weight").tile == (1, 128)


def test_nvfp4_defaults():
    r = NVFP4BlockScaling()
    assert r.config("input") == QuantConfig("nvfp4", tile=(1, 16), rht=True, stochastic=False)
    assert r.config("weight") == QuantConfig("nvfp4", tile=(16, 16), rht=False, stochastic=False)
    assert r.config("grad_output") == QuantConfig("nvfp4", tile=(1, 16), rht=True, stochastic=True)


@pytest.mark.parametrize(
    "toggle,role,expected",
    [
        ("disable_rht", "input", QuantConfig("nvfp4", tile=(1, 16))),
        ("disable_rht", "grad_output", QuantConfig("nvfp4", tile=(1, 16), stochastic=True)),
        ("disable_stochastic_rounding", "grad_output", QuantConfig("nvfp4", tile=(1, 16), rht=True)),
        ("disable_2d_quantization", "weight", QuantConfig("nvfp4", tile=(1, 16))),
        ("disable_2d_quantization", "input", QuantConfig("nvfp4", tile=(1, 16), rht=True)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_nvfp4_toggles(toggle, role, expected):
    assert NVFP4BlockScaling(**{toggle: True}).config(role) == expected


def test_pure_e5m2_and_bad_role_rejected():
    for cls in (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling, Float8BlockScaling):
        with pytest.raises(ValueError, match="pure E5M2"):
            cls(fp8_format="e5m2")
    with pytest.raises(ValueError, match="role"):
        DelayedScaling().config("output")
    with pytest.raises(ValueError, match="gemm"):
        DelayedScaling().split_accumulator("forward")


def test_recipes_are_frozen_and_registered():
    assert set(RECIPES) == {
        "DelayedScaling",
        "Float8CurrentScaling",
        "MXFP8BlockScaling",
        "Float8BlockScaling",
        "NVFP4BlockScaling",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        NVFP4BlockScaling().disable_rht = True  # type: ignore[misc]
