"""QuantConfig: scheme defaults, validation naming the field, value and rule (docs/design.md §3)."""

import dataclasses

import pytest

from reference import SCHEMES, QuantConfig
from reference.formats import E4M3, E5M2, FORMATS


def test_scheme_defaults():
    assert QuantConfig("nvfp4").element == "e2m1" and QuantConfig("nvfp4").tile == (1, 16)
    assert QuantConfig("mxfp8").tile == (1, 32) and QuantConfig("mxfp8").e8m0_rule == "ceil"
    assert QuantConfig("fp8_block").pow2_scales is True and QuantConfig("fp8_block").tile == (1, 128)
    assert QuantConfig("fp8_current").pow2_scales is False and QuantConfig("fp8_current").tile is None
    assert QuantConfig("fp8_delayed").amax_history_len == 1024


def test_frozen_and_tile_normalised():
    c = QuantConfig("mxfp8", tile=[32, 32])
    assert c.tile == (32, 32) and c.is_2d
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.scheme = "nvfp4"


BAD = [
    (dict(scheme="fp9"), "scheme", "fp9"),
    (dict(scheme="mxfp8", element="e2m1"), "element", "e2m1"),
    (dict(scheme="nvfp4", tile=(1, 32)), "tile", "(1, 32)"),
    (dict(scheme="mxfp8", rht=True), "rht", "nvfp4"),
    (dict(scheme="fp8_block", stochastic=True), "stochastic", "nvfp4"),
    (dict(scheme="nvfp4", tile=(16, 16), rht=True), "rht", "2-D"),
    (dict(scheme="nvfp4", variant="8over6"), "variant", "row_scaled_4over6"),
    (dict(scheme="mxfp8", variant="4over6"), "variant", "nvfp4"),
    (dict(scheme="nvfp4", variant="4over6", rht=True), "rht", "no RHT"),
    (dict(scheme="nvfp4", variant="4over6", stochastic=True), "stochastic", "no stochastic"),
    (dict(scheme="nvfp4", variant="row_scaled", stochastic=True), "stochastic", "no stochastic"),
    (dict(scheme="nvfp4", variant="row_scaled", tile=(16, 16)), "tile", "1-D only"),
    (dict(scheme="nvfp4", variant="row_scaled_4over6", tile=(16, 16)), "tile", "1-D only"),
    (dict(scheme="nvfp4", variant="4over6", e4m3_max=255), "e4m3_max", "(448, 256)"),
    (dict(scheme="nvfp4", variant="4over6", e4m3_max=True), "e4m3_max", "int"),
    (dict(scheme="nvfp4", variant="4over6", err_mode="MAE"), "err_mode", "mae"),
    (dict(scheme="nvfp4", e4m3_max=256), "e4m3_max", "4over6 variants only"),
    (dict(scheme="nvfp4", variant="row_scaled", err_mode="mse"), "err_mode", "4over6 variants only"),
    (dict(scheme="nvfp4", variant="4over6", convention="torchao_nvfp4"), "convention", "'te' only"),
    (dict(scheme="mxfp8", e8m0_rule="nearest"), "e8m0_rule", "nearest"),
    (dict(scheme="fp8_block", e8m0_rule="floor"), "e8m0_rule", "mxfp8 only"),
    (dict(scheme="fp8_current", eps=-1.0), "eps", "-1.0"),
    (dict(scheme="fp8_current", eps=float("nan")), "eps", "finite"),
    (dict(scheme="mxfp8", pow2_scales=False), "pow2_scales", "E8M0"),
    (dict(scheme="nvfp4", pow2_scales=True), "pow2_scales", "fp8_current and fp8_block"),
    (dict(scheme="fp8_delayed", amax_history_len=0), "amax_history_len", ">= 1"),
    (dict(scheme="fp8_delayed", amax_compute_algo="mean"), "amax_compute_algo", "mean"),
    (dict(scheme="fp8_delayed", margin=0.5), "margin", "int"),
    (dict(scheme="mxfp8", rht="yes"), "rht", "bool"),
]


@pytest.mark.parametrize("kwargs,field,fragment", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_invalid_fields_name_field_value_and_rule(kwargs, field, fragment):
    with pytest.raises(ValueError) as ei:
        QuantConfig(**kwargs)
    msg = str(ei.value)
    assert f"QuantConfig.{field}=" in msg and fragment in msg


def test_ids_are_distinct_across_a_grid():
    ids = set()
    n = 0
    for sch in SCHEMES.values():
        for el in sch.elements:
            for tile in sch.tiles:
                cfg = QuantConfig(sch.name, element=el, tile=tile)
                ids.add(cfg.id)
                n += 1
    assert len(ids) == n


def test_format_rows_match_their_bit_definitions():
    for fmt in (E4M3, E5M2):
        # max finite: top exponent with all-ones mantissa minus the NaN code (E4M3) or next-to-top exponent (E5M2)
        assert fmt.max_code <= (1 << (fmt.bits - 1)) - 1
    assert FORMATS["e4m3"].max_finite == 1.75 * 2**8 and FORMATS["e5m2"].max_finite == 1.75 * 2**15
    assert FORMATS["e2m1"].max_finite == 1.5 * 2**2 and FORMATS["ue8m0"].max_finite == 2.0**127
    assert FORMATS["e4m3"].min_subnormal == 2**-9 and FORMATS["e5m2"].min_subnormal == 2**-16
    assert FORMATS["e2m1"].min_subnormal == 0.5 and FORMATS["e4m3"].min_normal == 2**-6


def test_scheme_rows_carry_behaviour():
    """The row names its reference module, GEMM methods (auto first) and accumulate flag (docs/numerics.md §6)."""
    from reference import blockwise, mxfp8, nvfp4, per_tensor

    mods = {"fp8_current": per_tensor, "fp8_delayed": per_tensor, "mxfp8": mxfp8, "fp8_block": blockwise,
            "nvfp4": nvfp4}
    for name, row in SCHEMES.items():
        mod = row.reference_module()
        assert mod is mods[name]
        assert callable(mod.quantize_2d) and callable(mod.dequantize)
    auto = {n: r.gemm_methods[0] for n, r in SCHEMES.items()}
    assert auto == {"fp8_current": "exact", "fp8_delayed": "exact", "fp8_block": "blockwise_order",
                    "mxfp8": "block_sum", "nvfp4": "block_sum"}
    # docs/numerics.md §6: only fp8_block (RN_out(C + RN_out(Y))) and nvfp4 (RN_out(C + Y)) define accumulation.
    assert {n for n, r in SCHEMES.items() if r.exact_accumulate} == {"fp8_block", "nvfp4"}
    assert {n for n, r in SCHEMES.items() if r.per_tensor} == {"fp8_current", "fp8_delayed"}
    assert {n for n, r in SCHEMES.items() if r.round_before_accumulate} == {"fp8_block"}
    assert {n for n, r in SCHEMES.items() if not r.gemm_2d_x_2d} == {"fp8_block"}


def test_options_follow_the_row():
    """A field a scheme does not take keeps its default; the message names the schemes that take it."""
    with pytest.raises(ValueError, match=r"QuantConfig.eps=0.5 .*\(fp8_current, fp8_block\)"):
        QuantConfig("mxfp8", eps=0.5)
    with pytest.raises(ValueError, match=r"QuantConfig.e8m0_rule='floor' .*mxfp8 only"):
        QuantConfig("nvfp4", e8m0_rule="floor")
    assert QuantConfig("fp8_delayed", margin=3).id.endswith("-h1024-max-m3")
    assert "-h" not in QuantConfig("fp8_current").id
