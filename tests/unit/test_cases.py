"""harness.cases: grid expansion, exclusions, pairwise covering, id round trips, file errors, tiers.

Source: docs/design.md §5, cases/README.md (schema), docs/design.md §5 (Case, from_id, load_cases, TIERS).
"""

from __future__ import annotations

import functools
import itertools
import math
import re

import pytest

from harness import cases as C
from harness.cases import Case, CaseFileError, case_values, load_cases, parse_cases, spec_violation
from reference.formats import QuantConfig

ALL_TIERS = sorted(C.TIERS)


@functools.lru_cache(maxsize=None)
def _tier(name: str, own_grids_only: bool = False) -> C.CaseList:
    """load_cases once per test module (the smoke tier's pairwise selection takes a second)."""
    return load_cases(name, tier=name if own_grids_only else None)


# ---- expansion counts and exclusions -------------------------------------------------------------


def test_full_product_count():
    text = """
[[grid]]
scheme = "mxfp8"
element = ["e4m3", "e5m2"]
tile = [[1, 32], "32x32"]
orientation = ["rowwise", "colwise", "both"]
shape = [[64, 96], [32, 32]]
distribution = ["normal", "ties"]
"""
    cs = parse_cases(text, "t.toml")
    assert len(cs) == 2 * 2 * 3 * 2 * 2
    assert cs.spec_excluded == 0 and cs.user_excluded == 0 and cs.duplicates == 0
    assert len(set(cs)) == len(cs)
    assert {c.config.tile for c in cs} == {(1, 32), (32, 32)}


def test_spec_exclusions_are_dropped_and_counted():
    text = """
[[grid]]
scheme = ["mxfp8", "nvfp4"]
element = ["e4m3", "e2m1"]
shape = [[64, 96], [48, 64]]
in_dtype = ["bfloat16", "float32"]
rht = [false, true]
"""
    cs = parse_cases(text, "t.toml")
    # Valid: mxfp8/e4m3 and nvfp4/e2m1 only; mxfp8 needs M, K % 32 (64x96 ok, 48x64 not);
    # nvfp4 needs % 16 (both ok); RHT only for nvfp4, and only with bfloat16 input.
    expected = set()
    for scheme, el, shape, dt, rht in itertools.product(
        ["mxfp8", "nvfp4"], ["e4m3", "e2m1"], [(64, 96), (48, 64)], ["bfloat16", "float32"], [False, True]
    ):
        ok = (scheme, el) in (("mxfp8", "e4m3"), ("nvfp4", "e2m1"))
        ok &= not (scheme == "mxfp8" and shape == (48, 64))
        ok &= not (rht and (scheme != "nvfp4" or dt != "bfloat16"))
        if ok:
            expected.add((scheme, shape, dt, rht))
    got = {(c.config.scheme, c.shape, c.in_dtype, c.config.rht) for c in cs}
    assert got == expected
    assert cs.spec_excluded == 32 - len(expected)
    assert sum(cs.exclusion_reasons.values()) == cs.spec_excluded
    assert cs.exclusion_reasons["config.element"] > 0
    assert cs.exclusion_reasons["shape"] > 0
    assert cs.exclusion_reasons["rht"] > 0


def test_gemm_spec_exclusions():
    text = """
[[grid]]
op = "gemm"
scheme = "fp8_block"
tile = [[1, 128], [128, 128]]
b_tile = [[1, 128], [128, 128]]
layout = ["TN", "NN", "NT"]
shape = [[64, 96, 130]]

[[grid]]
op = "gemm"
scheme = "nvfp4"
rht = [false, true]
b_rht = [false, true]
layout = ["TN", "NN", "NT"]
shape = [[32, 48, 64]]
"""
    cs = parse_cases(text, "t.toml")
    blk = [c for c in cs if c.config.scheme == "fp8_block"]
    assert len(blk) == 3 * 3  # 2-D x 2-D is forbidden in every layout
    assert not any(c.config.is_2d and c.b_config.is_2d for c in blk)
    nv = {(c.layout, c.config.rht, c.b_config.rht) for c in cs if c.config.scheme == "nvfp4"}
    # TN consumes rowwise copies (RHT irrelevant); NN consumes B colwise (no RHT allowed on B);
    # NT consumes both colwise copies (RHT on both or neither).
    assert nv == {("TN", a, b) for a in (False, True) for b in (False, True)} | {
        ("NN", False, False), ("NN", True, False), ("NT", False, False), ("NT", True, True)
    }
    assert cs.exclusion_reasons["gemm"] == 3 + 4


def test_user_exclusions_and_normalised_duplicates():
    text = """
[[grid]]
op = ["quantize", "gemm"]
scheme = "fp8_current"
element = ["e4m3", "e5m2"]
layout = ["TN", "NN"]
in_dtype = ["bf16", "fp32"]
shape = [[64, 64, 64]]
exclude = [{element = "e5m2", in_dtype = "float32"}, {op = "gemm", layout = "NN", element = "e4m3"}]
"""
    cs = parse_cases(text, "t.toml")
    q = [c for c in cs if c.op == "quantize"]
    g = [c for c in cs if c.op == "gemm"]
    # quantize: layout is normalised away, so 2 layouts give duplicates; e5m2+fp32 excluded.
    assert {(c.config.element, c.in_dtype) for c in q} == {("e4m3", "bfloat16"), ("e4m3", "float32"), ("e5m2", "bfloat16")}
    assert all(c.layout is None and c.orientation == "rowwise" for c in q)
    assert {(c.config.element, c.in_dtype, c.layout) for c in g} == {
        ("e4m3", "bfloat16", "TN"), ("e4m3", "float32", "TN"), ("e5m2", "bfloat16", "TN"), ("e5m2", "bfloat16", "NN")
    }
    assert cs.user_excluded == 2 * 2 + 2  # (e5m2, fp32) x 2 ops x 2 layouts, then (gemm, NN, e4m3) x 2 dtypes
    assert cs.duplicates == 3


def test_default_values_and_b_config_inheritance():
    text = """
[[grid]]
op = "gemm"
scheme = ["mxfp8", "nvfp4"]
tile = "default"
b_tile = ["default", "16x16"]
shape = [64, 32, 128]
"""
    cs = parse_cases(text, "t.toml")
    got = {(c.config.id, c.b_config.id) for c in cs}
    assert got == {
        ("mxfp8-e4m3-1x32", "mxfp8-e4m3-1x32"),
        ("nvfp4-e2m1-1x16", "nvfp4-e2m1-1x16"),
        ("nvfp4-e2m1-1x16", "nvfp4-e2m1-16x16"),
    }
    assert all(c.out_dtype == "bfloat16" and c.layout == "TN" and c.in_dtype == "bfloat16" for c in cs)


# ---- pairwise covering ---------------------------------------------------------------------------

PAIRWISE_GRID = """
cover = "pairwise"
[[grid]]
scheme = "nvfp4"
tile = [[1, 16], [16, 16]]
rht = [false, true]
stochastic = [false, true]
orientation = ["rowwise", "colwise", "both"]
in_dtype = ["float32", "bfloat16", "float16"]
shape = [[64, 128], [256, 256], [32, 512]]
distribution = ["normal", "ties", "special", "exhaustive", "outliers"]
seed = [0, 1]
"""


def _all_pairs(cases):
    vals = [case_values(c) for c in cases]
    keys = [k for k in C.GRID_KEYS if len({repr(v[k]) for v in vals}) > 1]
    pairs = set()
    for v in vals:
        for a, b in itertools.combinations(keys, 2):
            pairs.add((a, repr(v[a]), b, repr(v[b])))
    return pairs


def test_pairwise_covers_every_valid_pair():
    full = parse_cases(PAIRWISE_GRID.replace('cover = "pairwise"', 'cover = "full"'), "t.toml")
    pw = parse_cases(PAIRWISE_GRID, "t.toml")
    assert pw.full_count == len(full)
    assert 0 < len(pw) < len(full) / 10
    assert set(pw) <= set(full)
    missing = _all_pairs(full) - _all_pairs(pw)
    assert not missing, f"pairs not covered: {sorted(missing)[:5]}"
    # Spec exclusions still apply (16x16 tiles never take RHT; SR on them is legal, docs/numerics.md §5.7).
    assert not any(c.config.is_2d and c.config.rht for c in pw)


def test_pairwise_is_deterministic():
    a = parse_cases(PAIRWISE_GRID, "t.toml")
    b = parse_cases(PAIRWISE_GRID, "t.toml")
    assert [c.id for c in a] == [c.id for c in b]


def test_pairwise_select_small_exact():
    full = parse_cases(
        """
[[grid]]
scheme = "fp8_current"
element = ["e4m3", "e5m2"]
pow2_scales = [false, true]
in_dtype = ["float32", "bfloat16", "float16"]
shape = [[16, 16]]
""",
        "t.toml",
    )
    sel = C.pairwise_select(list(full))
    # 3 x 2 is the largest pair product: at least 6 rows are needed, all 6 (dtype, element) and
    # (dtype, pow2) pairs and the 4 (element, pow2) pairs must appear.
    assert 6 <= len(sel) < len(full)
    assert not (_all_pairs(full) - _all_pairs(sel))


# ---- ids -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", ALL_TIERS)
def test_id_round_trip_every_case_of_every_file(tier):
    cs = _tier(tier, tier == "nightly")  # nightly: its own grids (its includes are tested on their own)
    assert len(cs) > 0
    ids = [c.id for c in cs]
    assert len(set(ids)) == len(ids), "case ids must be unique"
    for c in cs:
        back = Case.from_id(c.id)
        assert back == c, c.id
        assert back.id == c.id


def test_id_example_from_the_brief():
    c = Case("quantize", QuantConfig("mxfp8", e8m0_rule="floor"), (256, 96), "bfloat16", orientation="both")
    assert c.id == "quantize-mxfp8-e4m3-1x32-floor-both-bf16-256x96-normal-s0"
    assert Case.from_id(c.id) == c


@pytest.mark.parametrize(
    "case",
    [
        Case("dequantize", QuantConfig("fp8_current", eps=1e-6, pow2_scales=True), (3, 4, 200), out_dtype="float16"),
        Case("quantize", QuantConfig("fp8_delayed", element="e5m2", margin=-1, amax_compute_algo="most_recent",
                                     amax_history_len=4), (16, 16), "float16", "ties", 7, "colwise"),
        Case("quantize", QuantConfig("fp8_block", tile=(128, 128), pow2_scales=False, eps=2.5e-07), (130, 129)),
        Case("quantize", QuantConfig("nvfp4", rht=True, stochastic=True), (32, 64), distribution="special"),
        Case("gemm", QuantConfig("fp8_block"), (128, 256, 512), layout="NN", b_config=QuantConfig("fp8_block", tile=(128, 128)),
             accumulate=True, bias=True, out_dtype="float32", distribution="exact_representable", seed=3),
        Case("gemm", QuantConfig("fp8_current", element="e5m2"), (8, 16, 32), layout="NT",
             b_config=QuantConfig("fp8_current", element="e4m3"), bias=True),
        Case("gemm", QuantConfig("nvfp4", stochastic=True), (32, 48, 64), layout="TN",
             b_config=QuantConfig("nvfp4", tile=(16, 16))),
    ],
    ids=lambda c: c.id,
)
def test_id_round_trip_hand_made(case):
    assert Case.from_id(case.id) == case


def test_readme_ids_parse():
    text = (C.CASES_DIR / "README.md").read_text()
    ids = re.findall(r"^((?:quantize|dequantize|gemm)-\S+-s\d+)$", text, flags=re.M)
    assert len(ids) == 3
    for i in ids:
        assert Case.from_id(i).id == i


@pytest.mark.parametrize(
    "bad, match",
    [
        ("quantize-mxfp9-e4m3-1x32-both-bf16-256x96-normal-s0", "does not parse"),
        ("quantize-mxfp8-e4m3-1x32-both-bf16-256x96-gaussian-s0", "does not parse"),
        ("quantize-mxfp8-e4m3-1x32-ceil-both-bf16-256x96-normal-s0", "does not parse"),
        ("quantize-mxfp8-e4m3-1x32-pow2-both-bf16-256x96-normal-s0", "not canonical"),
        ("quantize-mxfp8-e4m3-1x32-both-bf16-256x96-out_f32-normal-s0", "out_"),
        ("quantize-mxfp8-e4m3-1x32-both-bf16-48x96-normal-s0", "spec forbids"),
        ("quantize-nvfp4-e2m1-1x16-rht-both-f32-64x64-normal-s0", "spec forbids"),
        ("quantize-mxfp8-e2m1-1x32-both-bf16-64x96-normal-s0", "QuantConfig.element"),
        ("gemm-TN-fp8_block-e4m3-128x128-bf16-128x128x128-out_bf16-normal-s0", "spec forbids"),
    ],
)
def test_from_id_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        Case.from_id(bad)


def test_case_validates_direct_construction():
    with pytest.raises(ValueError, match="layout"):
        Case("quantize", QuantConfig("mxfp8"), (32, 32), layout="TN")
    with pytest.raises(ValueError, match="gemm"):
        Case("gemm", QuantConfig("mxfp8"), (32, 32))
    with pytest.raises(ValueError, match="orientation"):
        Case("gemm", QuantConfig("mxfp8"), (32, 32, 32), orientation="rowwise")
    with pytest.raises(ValueError, match="distribution"):
        Case("quantize", QuantConfig("mxfp8"), (32, 32), distribution="gaussian")
    # eps with more digits than '%g' keeps (2^-20, 2^-149): the id carries it exactly.
    for eps in (2.0**-20, 1.2345678e-7, 2.0**-149):
        c = Case("quantize", QuantConfig("fp8_block", eps=eps), (32, 32))
        assert Case.from_id(c.id) == c and Case.from_id(c.id).config.eps == eps
    c = Case("gemm", QuantConfig("mxfp8"), (32, 64, 96), layout="NT")
    assert c.operand_shapes == {"a": (96, 32), "b": (96, 64), "c": (32, 64), "bias": (64,)}
    assert c.consumed == ("colwise", "colwise")
    assert c.b_config == c.config and c.orientation == "both" and c.out_dtype == "bfloat16"
    assert spec_violation(c) is None


def test_source_is_not_part_of_identity():
    cs = parse_cases('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\n', "dir/x.toml")
    (c,) = cs
    assert c.source == "dir/x.toml:1"  # the [[grid]] header line
    assert Case.from_id(c.id) == c and Case.from_id(c.id).source == ""


# ---- file errors ---------------------------------------------------------------------------------


def _error(text: str) -> str:
    with pytest.raises(CaseFileError) as e:
        parse_cases(text, "cases/bad.toml")
    return str(e.value)


def test_malformed_toml_names_file_and_line():
    msg = _error('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32\n')
    assert msg.startswith("cases/bad.toml:3: malformed TOML"), msg
    msg = _error('[[grid]]\nscheme = mxfp8\nshape = [32, 32]\n')
    assert msg.startswith("cases/bad.toml:2: malformed TOML"), msg


def test_unknown_field_names_file_line_and_field():
    msg = _error('tier = "x"\n\n[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\n\n[[grid]]\nscheme = "nvfp4"\nshaep = [16, 16]\n')
    assert msg.startswith("cases/bad.toml:9:"), msg
    assert "[[grid]] #1" in msg and "'shaep'" in msg and "did you mean 'shape'" in msg


def test_unknown_scheme_and_bad_values_name_the_field():
    msg = _error('[[grid]]\nshape = [32, 32]\nscheme = ["mxfp8", "mxfp9"]\n')
    assert msg.startswith("cases/bad.toml:3:") and "'scheme'" in msg and "'mxfp9'" in msg
    msg = _error('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\nin_dtype = "float64"\n')
    assert msg.startswith("cases/bad.toml:4:") and "'in_dtype'" in msg
    msg = _error('[[grid]]\nscheme = "mxfp8"\nshape = [[32, 0]]\n')
    assert msg.startswith("cases/bad.toml:3:") and "'shape'" in msg
    msg = _error('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\nrht = "yes"\n')
    assert msg.startswith("cases/bad.toml:4:") and "'rht'" in msg and "bool" in msg
    msg = _error('[[grid]]\nscheme = "fp8_block"\nshape = [32, 32]\neps = -0.5\n')
    assert msg.startswith("cases/bad.toml:4:") and "'eps'" in msg and ">= 0" in msg


def test_bad_exclude_missing_field_and_top_level_key():
    msg = _error('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\nexclude = [{shap = [32, 32]}]\n')
    assert msg.startswith("cases/bad.toml:4:") and "'exclude'" in msg and "'shap'" in msg
    msg = _error('[[grid]]\nscheme = "mxfp8"\n')
    assert "[[grid]] #0" in msg and "'shape'" in msg and "cases/bad.toml:1" in msg
    msg = _error('tiers = "x"\n[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\n')
    assert msg.startswith("cases/bad.toml:1:") and "'tiers'" in msg
    msg = _error('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\ncover = "triples"\n')
    assert "'cover'" in msg
    assert "no [[grid]]" in _error('tier = "x"\n')


def test_include_and_tier_filter(tmp_path):
    (tmp_path / "a.toml").write_text('[[grid]]\nscheme = "mxfp8"\nshape = [32, 32]\n')
    (tmp_path / "b.toml").write_text(
        'include = ["a.toml"]\n[[grid]]\nscheme = "mxfp8"\nshape = [[32, 32], [64, 64]]\n'
        '[[grid]]\ntier = "other"\nscheme = "nvfp4"\nshape = [16, 16]\n'
    )
    cs = load_cases(tmp_path / "b.toml")
    assert sorted(c.shape for c in cs) == [(16, 16), (32, 32), (64, 64)]
    assert cs.duplicates == 1  # (32, 32) came first from a.toml
    assert [c.shape for c in load_cases(tmp_path / "b.toml", tier="other")] == [(16, 16)]
    (tmp_path / "c.toml").write_text('include = ["c.toml"]\n')
    with pytest.raises(CaseFileError, match="itself"):
        load_cases(tmp_path / "c.toml")
    with pytest.raises(CaseFileError, match="no such cases file"):
        load_cases(tmp_path / "missing.toml")


# ---- the shipped tiers ---------------------------------------------------------------------------

TOGGLES = ("element", "tile", "rht", "stochastic", "pow2_scales", "e8m0_rule", "amax_compute_algo", "margin")


def test_smoke_covers_scheme_x_toggle_x_orientation_and_layouts():
    smoke = _tier("smoke")
    quant = [c for c in smoke if c.op == "quantize"]
    got = {(c.config.scheme, t, repr(getattr(c.config, t)), c.orientation) for c in quant for t in TOGGLES}
    # Every (scheme, toggle value, orientation) that the nvfp4/fp8/mxfp8 format files can produce.
    fmt_cases = [c for t in ("fp8", "mxfp8", "nvfp4") for c in _tier(t) if c.op == "quantize"]
    want = {(c.config.scheme, t, repr(getattr(c.config, t)), c.orientation) for c in fmt_cases for t in TOGGLES}
    assert not (want - got), sorted(want - got)[:5]
    gemm = [c for c in smoke if c.op == "gemm"]
    assert {(c.config.scheme, c.layout) for c in gemm} == {(s, lay) for s in C.SCHEME_NAMES for lay in C.LAYOUTS}
    assert {c.config.scheme for c in smoke if c.op == "dequantize"} == set(C.SCHEME_NAMES)
    assert {c.distribution for c in smoke} == set(C.DISTRIBUTIONS)
    assert {c.out_dtype for c in gemm} == {"bfloat16", "float32", "float16"}
    assert {(c.accumulate, c.bias) for c in gemm} == {(a, b) for a in (False, True) for b in (False, True)}


def test_smoke_shapes_are_small_with_edge_shapes():
    smoke = _tier("smoke")
    assert len(smoke) < 400
    assert all(math.prod(c.shape) <= 256 * 256 * (300 if c.op == "gemm" else 1) for c in smoke if c.op != "linear")
    assert all(math.prod(c.shape) <= 128**3 for c in smoke if c.op == "linear")  # tokens x K x N
    blk = [c.shape for c in smoke if c.config.scheme == "fp8_block" and c.op == "quantize"]
    assert any(s[-1] % 128 or math.prod(s[:-1]) % 128 for s in blk), "fp8_block needs partial blocks"
    assert any(math.prod(s[:-1]) >= 16 * s[-1] for c in smoke for s in [c.shape] if c.op == "quantize")  # tall/skinny


def test_nightly_has_large_shapes_and_includes_every_format_file():
    nightly = _tier("nightly")
    shapes = {c.shape for c in nightly}
    assert (8192, 8192) in shapes and (4096, 8192) in shapes
    ids = {c.id for c in nightly}
    for tier in ("fp8", "mxfp8", "nvfp4", "gemm"):
        assert {c.id for c in _tier(tier)} <= ids
    assert nightly.spec_excluded > 0


def test_tiers_resolve_to_files():
    for tier, name in C.TIERS.items():
        assert C.resolve(tier) == C.CASES_DIR / name
        assert C.resolve(tier).exists()
