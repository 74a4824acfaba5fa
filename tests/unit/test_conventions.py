"""The convention catalogue (reference/conventions.py, docs/numerics.md §10).

Three kinds of check: the catalogue and QuantConfig plumbing (ids, validation, `with_convention`,
`applicable`); hand-computed vectors for every rule that differs from `te`; and, where the framework
is pip-installable (torchao 0.18), its own functions run on many inputs (normal, heavy tails,
tiny/subnormal, zeros, NaN/Inf, exact ties, amax just above a power of two) against the golden under
the convention, byte for byte (data and scales). vLLM's rule (vllm/model_executor/layers/quantization/
utils/fp8_utils.py, _per_token_group_quant_fp8) is checked on vectors derived from its formula with
numpy's fp32 arithmetic as the oracle.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from reference import QuantConfig, quantize
from reference import conventions as cv
from reference.blockwise import pow2_up
from reference.nvfp4 import e2m1_torchao

NAN = float("nan")
INF = float("inf")


def f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def bits32(t: torch.Tensor) -> list[int]:
    return [int(b) & 0xFFFFFFFF for b in t.to(torch.float32).reshape(-1).view(torch.int32).tolist()]


def mx_block(values: list[float], rows: int = 32, k: int = 32) -> torch.Tensor:
    """A [rows, k] fp32 tensor whose row 0 starts with `values` (zeros elsewhere)."""
    x = torch.zeros(rows, k, dtype=torch.float32)
    x[0, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def row0(q, n: int) -> tuple[int, list[int]]:
    return int(q.rowwise_scale[0, 0]), q.rowwise_data[0, :n].tolist()


# ---- catalogue and QuantConfig -----------------------------------------------------------------


def test_catalogue_names_and_rows():
    assert cv.NAMES == (
        "te", "ocp_mx", "torchao_floor", "torchao_ceil", "torchao_even", "torchao_rceil",
        "torchao_nvfp4", "torchao_float8", "vllm_group", "vllm_group_ue8m0",
    )
    for c in cv.CATALOGUE:
        assert c.framework and c.source and c.changes and c.section.startswith("§10."), c.name
    assert cv.get("torchao_rceil").schemes == ("mxfp8",)
    with pytest.raises(ValueError, match="unknown: expected one of te, ocp_mx"):
        cv.get("tf32")


def test_default_convention_keeps_ids():
    # Every id stays what it was: "te" adds nothing, another convention appends conv_<name>.
    assert QuantConfig("mxfp8").convention == "te"
    assert QuantConfig("mxfp8", convention="te").id == QuantConfig("mxfp8").id == "mxfp8-e4m3-1x32"
    assert QuantConfig("mxfp8", convention="torchao_floor").id == "mxfp8-e4m3-1x32-conv_torchao_floor"
    assert QuantConfig("mxfp8", e8m0_rule="floor", convention="ocp_mx").id == "mxfp8-e4m3-1x32-floor-conv_ocp_mx"
    cfg = QuantConfig("fp8_block", pow2_scales=False, eps=1e-10, convention="vllm_group")
    assert cfg.id == "fp8_block-e4m3-1x128-fp32scale-eps1e-10-conv_vllm_group"


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(scheme="nvfp4", convention="torchao_floor"), "applies to mxfp8, not nvfp4"),
        (dict(scheme="mxfp8", tile=(32, 32), convention="torchao_rceil"), r"applies to tiles \(\(1, 32\),\)"),
        (dict(scheme="mxfp8", convention="ocp_mx"), "needs e8m0_rule='floor'"),
        (dict(scheme="mxfp8", e8m0_rule="floor", convention="torchao_floor"), "needs e8m0_rule='ceil'"),
        (dict(scheme="fp8_block", convention="vllm_group"), "needs pow2_scales=False"),
        (dict(scheme="fp8_block", tile=(128, 128), pow2_scales=False, convention="vllm_group"), "applies to tiles"),
        (dict(scheme="nvfp4", rht=True, convention="torchao_nvfp4"), "needs rht=False"),
        (dict(scheme="fp8_current", eps=1e-6, convention="torchao_float8"), "needs eps=0.0"),
        (dict(scheme="fp8_delayed", convention="torchao_float8"), "applies to fp8_current"),
        (dict(scheme="mxfp8", convention="vllm"), "expected one of te, ocp_mx"),
    ],
)
def test_convention_validation(kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        QuantConfig(**kw)
    assert "QuantConfig.convention=" in str(e.value)


def test_applicable_and_with_convention():
    mx = QuantConfig("mxfp8")
    assert cv.applicable(mx) == ["ocp_mx", "torchao_floor", "torchao_ceil", "torchao_even", "torchao_rceil"]
    assert cv.with_convention(mx, "ocp_mx") == QuantConfig("mxfp8", e8m0_rule="floor", convention="ocp_mx")
    # A floor case can still be re-run under torchao's modes: the convention resets the field it replaces.
    assert cv.with_convention(QuantConfig("mxfp8", e8m0_rule="floor"), "torchao_ceil").e8m0_rule == "ceil"
    assert cv.applicable(QuantConfig("mxfp8", tile=(32, 32))) == []
    assert cv.applicable(QuantConfig("nvfp4")) == ["torchao_nvfp4"]
    assert cv.applicable(QuantConfig("nvfp4", rht=True)) == ["torchao_nvfp4"]  # with_convention turns RHT off
    assert cv.applicable(QuantConfig("nvfp4", tile=(16, 16))) == []
    assert cv.applicable(QuantConfig("fp8_current", pow2_scales=True)) == ["torchao_float8"]
    assert cv.applicable(QuantConfig("fp8_delayed")) == []
    blk = QuantConfig("fp8_block")
    assert cv.applicable(blk) == ["vllm_group", "vllm_group_ue8m0"]
    v = cv.with_convention(blk, "vllm_group")
    assert (v.pow2_scales, v.eps, v.convention) == (False, 1e-10, "vllm_group")
    # vLLM's default eps fills only an unset eps; an explicit one is kept.
    assert cv.with_convention(QuantConfig("fp8_block", eps=1e-6), "vllm_group_ue8m0").eps == 1e-6
    assert cv.applicable(v) == ["vllm_group_ue8m0"]
    assert cv.with_convention(v, "te") == dataclasses.replace(v, convention="te")


# ---- MXFP8: hand-computed vectors ---------------------------------------------------------------


def test_rceil_log2f_and_division_differ_from_te_ceil():
    # A = 458752.03125 = 448 * 1024 + 2^-5 (0x48E00001). te: RN(A * fl(1/448)) = nextafter(1024) -> e8m0_up 138.
    # torchao RCEIL: RN(A / 448) = nextafter(1024) too, but log2f of it is exactly 10.0 -> e = 137.
    a = f32(0x48E00001)
    assert a == 458752.03125
    x = mx_block([a, 1.0])
    e, codes = row0(quantize(x, QuantConfig("mxfp8")), 2)
    assert (e, codes) == (138, [0x76, 0x00])  # 224.00002 -> 224; 2^-11 below half the min subnormal
    e, codes = row0(quantize(x, QuantConfig("mxfp8", convention="torchao_rceil")), 2)
    assert (e, codes) == (137, [0x7E, 0x00])  # 448.00003 saturates; 2^-10 ties to even 0


def test_tiny_blocks_multiplier_and_scale_floor():
    # amax 1.5 * 2^-130 (subnormal): every rule gives e = 0, but the element step differs.
    x = mx_block([1.5 * 2.0**-130])
    assert row0(quantize(x, QuantConfig("mxfp8")), 1) == (0, [0x24])  # x * 2^127 = 0.1875
    assert row0(quantize(x, QuantConfig("mxfp8", e8m0_rule="floor")), 1) == (0, [0x24])
    assert row0(quantize(x, QuantConfig("mxfp8", convention="torchao_rceil")), 1) == (0, [0x00])  # x * 1.0
    for mode in ("floor", "ceil", "even"):
        # divided by the clamped 2^-126: 1.5 * 2^-4 = 0.09375 -> 0x1C, while the byte says 2^-127
        assert row0(quantize(x, QuantConfig("mxfp8", convention=f"torchao_{mode}")), 1) == (0, [0x1C]), mode


@pytest.mark.parametrize(
    "amax, expected",
    [
        # amax: (te ceil, te floor, torchao floor, ceil, even, rceil) for E4M3 (emax 8)
        (448.0, (127, 127, 127, 128, 127, 127)),
        (480.0, (128, 127, 127, 128, 127, 128)),  # 1.875 * 2^8: even adds 2^-4 to 1.875 -> no carry
        (496.0, (128, 127, 127, 128, 128, 128)),  # 1.9375 * 2^8: the carry moves even up a binade
        (256.0, (127, 127, 127, 127, 127, 127)),
        (0.0, (0, 0, 0, 0, 0, 0)),
    ],
)
def test_mx_exponent_per_rule(amax, expected):
    x = mx_block([amax, -0.5 * amax])
    got = (
        row0(quantize(x, QuantConfig("mxfp8")), 1)[0],
        row0(quantize(x, QuantConfig("mxfp8", e8m0_rule="floor")), 1)[0],
        *(row0(quantize(x, QuantConfig("mxfp8", convention=f"torchao_{m}")), 1)[0]
          for m in ("floor", "ceil", "even", "rceil")),
    )
    assert got == expected


def test_mx_non_finite_policies():
    x = mx_block([1.0, -2.0, NAN, 0.0])
    # te: NaN ignored (amax 2, floor/ceil e = 120), the NaN element alone becomes 0x7F.
    assert row0(quantize(x, QuantConfig("mxfp8")), 4) == (120, [0x70, 0xF8, 0x7F, 0x00])
    # torchao FLOOR: NaN amax -> e = 255 and scale +inf: finite elements x / inf = +-0, the NaN stays NaN.
    assert row0(quantize(x, QuantConfig("mxfp8", convention="torchao_floor")), 4) == (255, [0x00, 0x80, 0x7F, 0x00])
    # torchao RCEIL: e = 255, multiplier = the NaN descale: every element NaN.
    e, codes = row0(quantize(x, QuantConfig("mxfp8", convention="torchao_rceil")), 4)
    assert e == 255 and all(c & 0x7F == 0x7F for c in codes)
    # OCP MX: a NaN (or Inf) block is a NaN block.
    ocp = QuantConfig("mxfp8", e8m0_rule="floor", convention="ocp_mx")
    assert row0(quantize(x, ocp), 4) == (255, [0x7F] * 4)
    assert row0(quantize(mx_block([1.0, INF]), ocp), 2) == (255, [0x7F, 0x7F])
    # Inf under te: e = 254 and the inf saturates; torchao FLOOR: e from inf's exponent field, 128 - 8 + 127.
    assert row0(quantize(mx_block([1.0, INF]), QuantConfig("mxfp8")), 2) == (254, [0x00, 0x7E])
    assert row0(quantize(mx_block([1.0, INF]), QuantConfig("mxfp8", convention="torchao_floor")), 2) == (247, [0x00, 0x7E])
    # A finite block: ocp_mx equals the te floor rule byte for byte.
    g = torch.Generator().manual_seed(3)
    y = torch.randn(64, 128, generator=g) * 100
    a, b = quantize(y, ocp, colwise=True), quantize(y, QuantConfig("mxfp8", e8m0_rule="floor"), colwise=True)
    for f in ("rowwise_data", "rowwise_scale", "colwise_data", "colwise_scale"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


# ---- NVFP4 and float8: hand-computed vectors ----------------------------------------------------


def test_torchao_e2m1_nan_codes():
    # Non-NaN lanes are e2m1_rn; a NaN runs through the normal-number branch of torchao's bit cast.
    y = torch.tensor([0.25, 0.26, 2.5, -5.0, 6.0, -0.0])
    assert e2m1_torchao(y).tolist() == [0x0, 0x1, 0x4, 0xE, 0x7, 0x8]
    nan_pos, nan_neg, nan_max = f32(0x7FC00000), f32(0xFFC00000), f32(0x7FFFFFFF)
    # 0x7FC00000: (mag - 126<<23 + 2^21 - 1 + 1) >> 22 = 0x103 -> low byte 3; 0x7FFFFFFF -> 0x104 -> 4.
    got = e2m1_torchao(torch.tensor([nan_pos, nan_neg, nan_max], dtype=torch.float32)).tolist()
    assert got == [0x3, 0xB, 0x4]


def test_torchao_nvfp4_block_vector():
    x = torch.zeros(16, 16)
    x[0, :4] = torch.tensor([6.0, 3.0, -1.5, 0.0])
    q = quantize(x, QuantConfig("nvfp4", convention="torchao_nvfp4"))
    # A_g = 6: pts = RN(6/2688); block 0: (6/6)/pts = 448.000... -> 0x7E; zero blocks clamp to 2^-6 (0x08).
    assert q.rowwise_scale[0, 0] == 0x7E and q.rowwise_scale[1, 0] == 0x08
    assert q.rowwise_data[0, :2].tolist() == [0x7 | 0x5 << 4, 0xB]  # 6 -> 7, 3 -> 5, -1.5 -> 0xB, 0 -> 0
    te = quantize(x, QuantConfig("nvfp4"))
    assert te.rowwise_scale[1, 0] == 0x00 and te.rowwise_data[0, :2].tolist() == q.rowwise_data[0, :2].tolist()
    assert bits32(q.rowwise_amax) == bits32(torch.tensor([6.0]))


def test_torchao_float8_scale_vectors():
    cfg = QuantConfig("fp8_current", convention="torchao_float8")
    # amax 3: RN32(RN64(448 * RN64(1/3))) = 0x43155555 (as TE's RN32(448/3)); sinv = RN(1/s).
    q = quantize(torch.tensor([[3.0, -1.0]]), cfg)
    s = np.float32(448.0 * (1.0 / 3.0))
    assert bits32(q.rowwise_scale) == bits32(torch.tensor([np.float32(1.0) / s]))
    assert q.rowwise_data.tolist() == [[0x7E, 0xF1]]  # 448, -149.33 -> -144
    # All zeros: no special case, amax clamps to 1e-12 (float64): s = RN32(448 * RN64(1/1e-12)); te gives s = 1.
    z = quantize(torch.zeros(2, 8), cfg)
    s0 = np.float32(448.0 * (1.0 / 1e-12))
    assert bits32(z.rowwise_scale) == bits32(torch.tensor([np.float32(1.0) / s0]))
    assert bits32(quantize(torch.zeros(2, 8), QuantConfig("fp8_current")).rowwise_scale) == [0x3F800000]


# ---- vLLM per-token-group (hand vectors; oracle: numpy fp32 arithmetic) ------------------------


def vllm_cfg(ue8m0: bool = False, eps: float = 1e-10) -> QuantConfig:
    name = "vllm_group_ue8m0" if ue8m0 else "vllm_group"
    return QuantConfig("fp8_block", pow2_scales=ue8m0, eps=eps, convention=name)


def block_row(values: list[float], k: int = 128) -> torch.Tensor:
    x = torch.zeros(1, k)
    x[0, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def test_vllm_group_division_by_the_decode_scale():
    # The docs/numerics.md §8 blockwise vector: amax 3, sinv = RN(3/448); q = RN(x / sinv).
    q = quantize(block_row([3.0, 1.0, -0.5, 2.9]), vllm_cfg())
    assert bits32(q.rowwise_scale[:1, :1]) == bits32(torch.tensor([np.float32(3.0) / np.float32(448.0)]))
    assert q.rowwise_data[0, :4].tolist() == [0x7E, 0x71, 0xE9, 0x7E]
    # ue8m0: RN(3/448) = 0.0067 rounded up to 2^-7; q = x * 128.
    q = quantize(block_row([3.0, 1.0, -0.5, 2.9]), vllm_cfg(ue8m0=True))
    assert bits32(q.rowwise_scale[:1, :1]) == [0x3C000000]
    assert q.rowwise_data[0, :4].tolist() == [0x7C, 0x70, 0xE8, 0x7C]


def test_vllm_group_true_division_lands_on_a_tie():
    # A = 0x3FD1BA56, x = 0x3F5937D9: x / RN(A/448) = 232.000003 -> RN32 232.0, the E4M3 midpoint of 224
    # and 240, ties to even 224 (0x76); TE's x * RN(448/A) = 232.00002 -> 240 (0x77).
    a, x = f32(0x3FD1BA56), f32(0x3F5937D9)
    sinv = np.float32(a) / np.float32(448.0)
    assert np.float32(x) / sinv == np.float32(232.0)
    assert np.float32(x) * (np.float32(448.0) / np.float32(a)) > np.float32(232.0)
    assert quantize(block_row([a, x]), vllm_cfg()).rowwise_data[0, :2].tolist() == [0x7E, 0x76]
    assert quantize(block_row([a, x]), QuantConfig("fp8_block", pow2_scales=False)).rowwise_data[0, :2].tolist() == [
        0x7E, 0x77]


def test_vllm_group_eps_floor():
    # An all-zero group: A = eps = fp32(1e-10); te's compute_scale gives sinv = 1 instead.
    q = quantize(torch.zeros(2, 256), vllm_cfg(), colwise=True)
    expect = np.float32(np.float32(1e-10) / np.float32(448.0))
    assert set(bits32(q.rowwise_scale[:2, :2])) == set(bits32(torch.tensor([expect])))
    assert int(q.rowwise_data.abs().sum()) == 0
    q = quantize(torch.zeros(2, 256), vllm_cfg(ue8m0=True))
    assert set(bits32(q.rowwise_scale[:2, :2])) == {0x2A800000}  # 2.23e-13 -> 2^-42
    assert bits32(quantize(torch.zeros(2, 256), QuantConfig("fp8_block")).rowwise_scale[:2, :2]) == [0x3F800000] * 4


def test_pow2_up_exact():
    v = torch.tensor([1.0, f32(0x3F800001), 0.75, 2.0**-140, f32(0x00300000), 0.0, INF, 3e38])
    assert bits32(pow2_up(v)) == [0x3F800000, 0x40000000, 0x3F800000, bits32(torch.tensor([2.0**-140]))[0],
                                  0x00400000, 0, 0x7F800000, 0x7F800000]


# ---- against torchao's own functions ------------------------------------------------------------


def torchao_inputs(k: int = 256) -> dict[str, torch.Tensor]:
    """Named [64, k] fp32 inputs: the patterns where the conventions differ."""
    g = torch.Generator().manual_seed(0)
    n = lambda: torch.randn(64, k, generator=g)  # noqa: E731
    special = n()
    special[0] = 0.0
    special[1, 3], special[2, 5], special[3, 7], special[4] = NAN, INF, -INF, -NAN
    special[5, 0] = 448.0 * 8
    special[6, :32] = f32(0x43E00001)  # just above 448
    special[7] = 3.4e38
    special[8, :40] = f32(0x48E00001)  # 448 * 1024 + ulp: log2f rounds down
    ties = (torch.randint(0, 255, (64, k), generator=g).float() + 0.5) * 2.0**-4
    ties[:, 0] = 448.0
    return {
        "normal": n(), "heavy_tail": n() ** 5 * 100, "tiny": n() * 1e-38, "subnormal": n() * 1e-42,
        "zeros": torch.zeros(64, k), "special": special, "ties": ties,
    }


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
def test_mx_modes_match_torchao_to_mx(mode, element, dtype):
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[element]
    cfg = QuantConfig("mxfp8", element=element, convention=f"torchao_{mode}")
    for name, x in torchao_inputs().items():
        x = x.to(dtype)
        q = quantize(x, cfg, rowwise=True, colwise=True)
        s, d = to_mx(x, fp8, 32, ScaleCalculationMode(mode))
        assert same_bytes(q.rowwise_data, d), name
        assert same_bytes(q.rowwise_scale[:64, :8], s), name
        # torchao's colwise (dim1) cast is to_mx of X^T; ours stores data [M, K] and S_c [M/32, K].
        s, d = to_mx(x.t().contiguous(), fp8, 32, ScaleCalculationMode(mode))
        assert same_bytes(q.colwise_data, d.view(torch.uint8).t()), name
        assert same_bytes(q.colwise_scale[:2, :256], s.view(torch.uint8).t()), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_nvfp4_matches_torchao(dtype):
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    cfg = QuantConfig("nvfp4", convention="torchao_nvfp4")
    inputs = torchao_inputs()
    inputs["one_tiny_block"] = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    inputs["one_tiny_block"][9, :16] = 1e-20
    for name, x in inputs.items():
        x = x.to(dtype)
        q = quantize(x, cfg, rowwise=True, colwise=True)
        pts = per_tensor_amax_to_scale(torch.max(torch.abs(x)))
        for orientation, src in (("rowwise", x), ("colwise", x.t().contiguous())):
            s, d = nvfp4_quantize(src, 16, pts)
            rows, cols = src.shape
            assert same_bytes(getattr(q, f"{orientation}_data"), d), (name, orientation)
            assert same_bytes(getattr(q, f"{orientation}_scale")[:rows, : cols // 16], s), (name, orientation)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_float8_matches_torchao(element, dtype):
    pytest.importorskip("torchao")
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[element]
    cfg = QuantConfig("fp8_current", element=element, convention="torchao_float8")
    inputs = torchao_inputs()
    for i, v in enumerate((NAN, -NAN, INF, -INF)):
        inputs[f"one_{i}"] = torch.randn(32, 64, generator=torch.Generator().manual_seed(i))
        inputs[f"one_{i}"][1, 3] = v
    inputs["below_eps"] = torch.randn(32, 64, generator=torch.Generator().manual_seed(9)) * 1e-13
    for name, x in inputs.items():
        x = x.to(dtype)
        q = quantize(x, cfg, colwise=True)
        t = hp_tensor_to_float8_dynamic(x, fp8, LinearMMConfig())
        assert same_bytes(q.rowwise_data, t._data), name
        assert same_bytes(q.colwise_data, t._data.view(torch.uint8).t()), name
        # torchao stores s; our layout stores sinv = RN(1/s).
        assert same_bytes(q.rowwise_scale, torch.reciprocal(t._scale.to(torch.float32).reshape(1))), name
