"""Per-tensor FP8 (fp8_current, fp8_delayed + AmaxHistory) against docs/numerics.md §1, §2 and §8.

Expected bytes are hand-derived in the comments (E4M3 code = s|EEEE|mmm, value (1 + m/8)·2^(E-7),
subnormal m·2^-9; E5M2 code = s|EEEEE|mm, value (1 + m/4)·2^(E-15)), or come from an independent
oracle: numpy float32 scalar arithmetic plus ml_dtypes float8 casts after clamping.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import reference
from reference.formats import E4M3, E5M2, FLT_MAX, QuantConfig
from reference.per_tensor import AmaxHistory

from .oracles import np_compute_scale as oracle_scale
from .oracles import oracle_codes

NAN, INF = float("nan"), float("inf")
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMT = {"e4m3": E4M3, "e5m2": E5M2}


def bits(t: torch.Tensor) -> int:
    """fp32 bit pattern of a one-element tensor."""
    return int(t.reshape(()).to(torch.float32).view(torch.int32)) & 0xFFFFFFFF


def f32(b: int) -> float:
    return float(np.array([b], dtype=np.uint32).view(np.float32)[0])


def codes(q: torch.Tensor) -> list[int]:
    return q.reshape(-1).tolist()


def current(x, **kw) -> reference.QuantizedTensor:
    t = torch.tensor([x], dtype=kw.pop("dtype", torch.float32)) if isinstance(x, list) else x
    return reference.quantize(t, QuantConfig("fp8_current", **kw), rowwise=True, colwise=True)


# ---- §8 current scaling rows ----------------------------------------------------------------


@pytest.mark.parametrize(
    "amax, kw, s_bits, sinv_bits",
    [
        pytest.param(3.5, {}, 0x43000000, 0x3C000000, id="3.5"),
        pytest.param(3.0, {}, 0x43155555, 0x3BDB6DB7, id="3"),
        pytest.param(3.0, {"pow2": True}, 0x43000000, 0x3C000000, id="3-pow2"),
        pytest.param(0.0, {}, 0x3F800000, 0x3F800000, id="0"),
        pytest.param(INF, {}, 0x3F800000, 0x3F800000, id="inf"),
        pytest.param(NAN, {}, 0x3F800000, 0x3F800000, id="nan"),
        pytest.param(1e-37, {}, 0x7F7FFFFF, 0x00200000, id="1e-37"),
        pytest.param(1e-37, {"pow2": True}, 0x7F000000, 0x00400000, id="1e-37-pow2"),
        pytest.param(0.5, {"eps": 1.0}, 0x43E00000, 0x3B124925, id="eps1-0.5"),
        pytest.param(1000.0, {"eps": 1.0, "pow2": True}, 0x3E800000, 0x40800000, id="eps1-1000-pow2"),
    ],
)
def test_current_scale_rows(amax, kw, s_bits, sinv_bits):
    # The §8 rows on the (s, sinv) pair itself, as fp8_current calls it (v_inf = FLT_MAX, fp8_max 448).
    from reference.scaling import compute_scale

    s, sinv = compute_scale(
        torch.tensor([amax]), E4M3.max_finite, pow2=kw.get("pow2", False), eps=kw.get("eps", 0.0), v_inf=FLT_MAX
    )
    assert (bits(s), bits(sinv)) == (s_bits, sinv_bits)


def test_current_amax_3_5():
    # s = RN(448/3.5) = 128 (0x43000000), sinv = 2^-7 (0x3C000000).
    # 3.5·128 = 448 -> 0x7E; -1·128 = -2^7 -> E=14: 0xF0; 0.25·128 = 2^5 -> E=12: 0x60; 0 -> 0x00.
    q = current([3.5, -1.0, 0.25, 0.0])
    assert bits(q.rowwise_scale) == 0x3C000000
    assert codes(q.rowwise_data) == [0x7E, 0xF0, 0x60, 0x00]
    assert bits(q.rowwise_amax) == bits(torch.tensor(3.5))


def test_current_amax_3_true_division():
    # s = RN(448/3) = 0x43155555 (149.33333); the reciprocal-multiply path would give ...56, and
    # RN(1/0x43155556) = 0x3BDB6DB6, so the sinv byte pattern tells the two apart.
    q = current([3.0, 1.0])
    assert bits(q.rowwise_scale) == 0x3BDB6DB7
    assert np.float32(1.0) / np.float32(f32(0x43155556)) != np.float32(f32(0x3BDB6DB7))
    # 3·s = 447.99998 (exact) -> 448 = 0x7E; 1·s = 149.33 -> nearest of 144/160 is 144 = 1.125·2^7: 0x71.
    assert codes(q.rowwise_data) == [0x7E, 0x71]


def test_current_multiplies_by_s_never_divides_by_sinv():
    # docs/numerics.md §1: q = sat(RN(x·s)). x = 0x3FB92492 (1.4464285), s = 0x43155555 (amax 3):
    # exact x·s = 215.9999876 -> RN 0x4357FFFF, below the midpoint 216 of 208/224 -> 208 = 1.625·2^7: 0x75.
    # RN(x / sinv) would be 216.0 exactly, a tie -> even 224: 0x76.
    q = current([3.0, f32(0x3FB92492)])
    assert codes(q.rowwise_data) == [0x7E, 0x75]


def test_current_amax_3_pow2():
    # pow2: s = 2^floor(log2 149.33) = 128, sinv = 2^-7; 3·128 = 384 = 1.5·2^8: 0x7C; 128: 0x70.
    q = current([3.0, 1.0], pow2_scales=True)
    assert bits(q.rowwise_scale) == 0x3C000000
    assert codes(q.rowwise_data) == [0x7C, 0x70]


@pytest.mark.parametrize(
    "x, expected, amax",
    [
        # amax 0: s = 1; +0 -> 0x00, -0 -> 0x80.
        pytest.param([0.0, -0.0], [0x00, 0x80], 0.0, id="amax0"),
        # amax +inf: s = 1; inf -> 0x7E (saturate); 1.5 = 1.1b: 0x3C; -2 = 2^1: 0xC0.
        pytest.param([INF, 1.5, -2.0], [0x7E, 0x3C, 0xC0], INF, id="amax_inf"),
        # all NaN: amax ignores NaN -> 0 -> s = 1; NaN of either sign -> 0x7F.
        pytest.param([NAN, -NAN], [0x7F, 0x7F], 0.0, id="all_nan_amax0"),
    ],
)
def test_current_special_amax_scale_one(x, expected, amax):
    q = current(x)
    assert bits(q.rowwise_scale) == 0x3F800000
    assert codes(q.rowwise_data) == expected
    assert bits(q.rowwise_amax) == bits(torch.tensor(amax))


@pytest.mark.parametrize(
    "pow2, sinv, expected",
    [
        # s = RN(448/1e-37) = +inf -> FLT_MAX; sinv = RN(1/FLT_MAX) = 0x00200000 (subnormal).
        # fp32(1e-37)·FLT_MAX = 34.03 -> nearest of 32/36 is 36 = 1.125·2^5: 0x61.
        pytest.param(False, 0x00200000, [0x61, 0x00], id="fp32"),
        # pow2: s = 2^127, sinv = 2^-127 = 0x00400000; 1e-37·2^127 = 17.01 -> 18 = 1.125·2^4: 0x59.
        pytest.param(True, 0x00400000, [0x59, 0x00], id="pow2"),
    ],
)
def test_current_amax_1e_37_overflows_to_flt_max(pow2, sinv, expected):
    q = current([1e-37, 0.0], pow2_scales=pow2)
    assert bits(q.rowwise_scale) == sinv
    assert codes(q.rowwise_data) == expected


@pytest.mark.parametrize(
    "pow2, sinv, expected",
    [
        # A = 2^-127 (fp32 subnormal input): 448/A overflows -> s = FLT_MAX = 2^128 - 2^104.
        # 2^-127·s = 2 - 2^-23 -> 2.0 = 2^1: 0x40; -2^-128·s = -(1 - 2^-24) -> -1.0: 0xB8.
        pytest.param(False, 0x00200000, [0x40, 0xB8], id="fp32"),
        # pow2: s = 2^127: 1.0 -> 0x38, -0.5 -> 0xB0.
        pytest.param(True, 0x00400000, [0x38, 0xB0], id="pow2"),
    ],
)
def test_current_subnormal_inputs(pow2, sinv, expected):
    q = current([2.0**-127, -(2.0**-128)], pow2_scales=pow2)
    assert bits(q.rowwise_scale) == sinv
    assert codes(q.rowwise_data) == expected


def test_current_eps_raises_small_amax():
    # eps 1.0, amax 0.5: A = 1 -> s = 448, sinv = fl(1/448) = 0x3B124925.
    # 0.5·448 = 224 = 1.75·2^7: 0x76; -0.25·448 = -112 = -1.75·2^6: 0xEE.
    q = current([0.5, -0.25], eps=1.0)
    assert bits(q.rowwise_scale) == 0x3B124925
    assert codes(q.rowwise_data) == [0x76, 0xEE]


def test_current_eps_pow2_amax_1000():
    # eps 1.0 does not bind; s = RN(448/1000) = 0.448 -> pow2 0.25, sinv = 4 (0x40800000).
    # 1000·0.25 = 250 -> nearest of 240/256 is 256 = 2^8: 0x78.
    q = current([1000.0], eps=1.0, pow2_scales=True)
    assert bits(q.rowwise_scale) == 0x40800000
    assert codes(q.rowwise_data) == [0x78]


def test_current_hybrid_e5m2_uses_57344():
    # HYBRID gradients: fp8_max = 57344; s = 57344/3.5 = 16384, sinv = 2^-14 (0x38800000).
    # 3.5·16384 = 57344: 0x7B; -16384 = -2^14 -> E=29: 0xF4.
    q = current([3.5, -1.0], element="e5m2")
    assert bits(q.rowwise_scale) == 0x38800000
    assert codes(q.rowwise_data) == [0x7B, 0xF4]


def test_current_all_max_block():
    # amax 448: s = RN(448/448) = 1, codes ±max.
    q = current([448.0, -448.0])
    assert bits(q.rowwise_scale) == 0x3F800000
    assert codes(q.rowwise_data) == [0x7E, 0xFE]


# The amax is +inf, so s = 1 and the codes are the plain saturating casts.
SPECIAL = [0.0, -0.0, NAN, -NAN, INF, -INF, 2.0**-149, -1e-40, 464.0, 1e6, 2.0**-9, 2.0**-10]
SPECIAL_CODES = {
    # 2^-149 and -1e-40 underflow to ±0; 464 ties to the even 448; 2^-9 = min subnormal 0x01;
    # 2^-10 is half of it and ties to 0.
    "e4m3": [0x00, 0x80, 0x7F, 0x7F, 0x7E, 0xFE, 0x00, 0x80, 0x7E, 0x7E, 0x01, 0x00],
    # E5M2: ±inf -> ±57344 (0x7B/0xFB); 464 -> nearest of 448/512 is 448 = 1.75·2^8 (E=23): 0x5F;
    # 2^-9 normal (E=6): 0x18; 2^-10 (E=5): 0x14.
    "e5m2": [0x00, 0x80, 0x7F, 0x7F, 0x7B, 0xFB, 0x00, 0x80, 0x5F, 0x7B, 0x18, 0x14],
}


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scheme", ["fp8_current", "fp8_delayed"])
def test_special_value_corpus(scheme, element):
    x = torch.tensor([SPECIAL])
    q = reference.quantize(x, QuantConfig(scheme, element=element), rowwise=True, colwise=True)
    assert bits(q.rowwise_scale) == 0x3F800000  # current: amax inf -> s = 1; delayed: fresh scale 1
    assert codes(q.rowwise_data) == SPECIAL_CODES[element]
    assert codes(q.colwise_data) == SPECIAL_CODES[element]
    assert bits(q.rowwise_amax) == 0x7F800000


# ---- layout ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["fp8_current", "fp8_delayed"])
def test_layout_transpose_and_shapes(scheme):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 53, generator=g) * 3
    q = reference.quantize(x, QuantConfig(scheme), rowwise=True, colwise=True)
    assert q.rowwise_data.shape == (37, 53) and q.rowwise_data.dtype == torch.uint8
    assert q.colwise_data.shape == (53, 37) and q.colwise_data.dtype == torch.uint8
    assert torch.equal(q.colwise_data, q.rowwise_data.T)
    for f in ("rowwise_scale", "colwise_scale", "rowwise_amax", "colwise_amax"):
        t = getattr(q, f)
        assert t.shape == (1,) and t.dtype == torch.float32, f
    assert bits(q.colwise_scale) == bits(q.rowwise_scale)
    qc = reference.quantize(x, QuantConfig(scheme), rowwise=False, colwise=True)
    assert qc.rowwise_data is None and torch.equal(qc.colwise_data, q.colwise_data)


def test_leading_dims_flatten():
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 11
    q3 = reference.quantize(x, QuantConfig("fp8_current"))
    q2 = reference.quantize(x.reshape(6, 4), QuantConfig("fp8_current"))
    assert torch.equal(q3.rowwise_data, q2.rowwise_data)


# ---- independent oracle ----------------------------------------------------------------------


def oracle_amax(v: np.ndarray) -> np.float32:
    a = np.abs(v[~np.isnan(v)])
    return np.float32(max(0.0, float(a.max()))) if a.size else np.float32(0.0)


def random_input(seed: int, shape, dtype) -> torch.Tensor:
    r = np.random.default_rng(seed)
    lo, hi = (-20, 12) if dtype == torch.float16 else (-135, 100)
    x = r.standard_normal(shape).astype(np.float64) * 2.0 ** r.integers(lo, hi)
    x[r.random(shape) < 0.05] = 0.0
    x[r.random(shape) < 0.02] = np.nan
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


@pytest.mark.parametrize("seed", range(12))
def test_current_matches_oracle(seed):
    r = np.random.default_rng(1000 + seed)
    element = ["e4m3", "e5m2"][seed % 2]
    pow2 = bool(seed % 3 == 0)
    eps = [0.0, 0.0, 1e-3][seed % 3]
    dtype = [torch.float32, torch.bfloat16, torch.float16][seed % 3]
    shape = (int(r.integers(1, 40)), int(r.integers(1, 70)))
    x = random_input(seed, shape, dtype)
    q = reference.quantize(x, QuantConfig("fp8_current", element=element, pow2_scales=pow2, eps=eps), colwise=True)
    xs = x.float().numpy()
    a = oracle_amax(xs)
    s, sinv = oracle_scale(a, FMT[element].max_finite, pow2, eps, FLT_MAX)
    exp = oracle_codes(xs * s, element)
    assert np.array_equal(q.rowwise_data.numpy(), exp)
    assert np.array_equal(q.colwise_data.numpy(), exp.T)
    assert bits(q.rowwise_scale) == int(np.array([sinv]).view(np.uint32)[0])
    assert bits(q.rowwise_amax) == int(np.array([a]).view(np.uint32)[0])
    # Dequantization: RN_out(RN(dec(q)·sinv)).
    for out_dtype, ml_out in ((torch.float32, np.float32), (torch.bfloat16, ml_dtypes.bfloat16)):
        ref = (exp.view(ML[element]).astype(np.float32) * sinv).astype(ml_out).astype(np.float32)
        for o in ("rowwise", "colwise"):
            got = reference.dequantize(q, o, out_dtype)
            assert got.dtype == out_dtype and got.shape == shape
            assert np.array_equal(got.float().numpy(), ref, equal_nan=True), (o, out_dtype)


# ---- delayed scaling -------------------------------------------------------------------------


def delayed_cfg(L=4, **kw) -> QuantConfig:
    return QuantConfig("fp8_delayed", amax_history_len=L, **kw)


def state_with(cfg, history, scale=1.0) -> AmaxHistory:
    st = AmaxHistory(cfg)
    st.history = torch.tensor(history, dtype=torch.float32)
    st.scale = torch.tensor([scale], dtype=torch.float32)
    return st


def test_amax_history_init():
    st = AmaxHistory(delayed_cfg(L=7))
    assert st.scale.shape == (1,) and st.scale.dtype == torch.float32 and bits(st.scale) == 0x3F800000
    assert st.history.shape == (7,) and st.history.dtype == torch.float32
    assert bits(st.history.abs().max()) == 0
    with pytest.raises(ValueError, match="fp8_delayed"):
        AmaxHistory(QuantConfig("fp8_current"))


@pytest.mark.parametrize(
    "kw, scale_bits",
    [
        # S_max = 448, A_max = fmax(1, 2, 3, 5) = 5: s = RN(448/5) = 89.6 (0x42B33333).
        pytest.param({}, 0x42B33333, id="e4m3"),
        # margin 1: S_max = 224, s = 44.8 (0x42333333).
        pytest.param({"margin": 1}, 0x42333333, id="margin1"),
        # E5M2 slot: S_max = 57344, s = 11468.8 (0x46333333).
        pytest.param({"element": "e5m2"}, 0x46333333, id="e5m2"),
    ],
)
def test_delayed_update_rolls_and_takes_max(kw, scale_bits):
    st = state_with(delayed_cfg(**kw), [5, 1, 2, 3])
    st.update()
    assert st.history.tolist() == [0, 2, 3, 5]
    assert bits(st.scale) == scale_bits


def test_delayed_old_h1_counts_then_drops():
    # a = [H1, H2, H3, last] = [7, 2, 3, 1]: max A = 7, s = 64; new H = [0, 2, 3, 1].
    st = state_with(delayed_cfg(), [1, 7, 2, 3])
    st.update()
    assert bits(st.scale) == bits(torch.tensor(64.0)) and st.history.tolist() == [0, 2, 3, 1]
    # most_recent: A = last = 1, s = 448.
    st = state_with(delayed_cfg(amax_compute_algo="most_recent"), [1, 7, 2, 3])
    st.update()
    assert bits(st.scale) == bits(torch.tensor(448.0)) and st.history.tolist() == [0, 2, 3, 1]


def test_delayed_zero_amax_step_changes_nothing():
    st = state_with(delayed_cfg(), [0, 7, 2, 3], scale=0.5)
    st.update()
    assert st.history.tolist() == [0, 7, 2, 3] and bits(st.scale) == bits(torch.tensor(0.5))


def test_delayed_tiny_amax_gives_flt_max():
    # 448 / 1e-37 overflows -> FLT_MAX.
    st = state_with(delayed_cfg(), [1e-37, 0, 0, 0])
    st.update()
    assert bits(st.scale) == 0x7F7FFFFF
    assert bits(st.history[3]) == bits(torch.tensor(1e-37)) and st.history[:3].tolist() == [0, 0, 0]


def test_delayed_inf_amax_freezes_scale():
    st = state_with(delayed_cfg(), [INF, 1, 2, 3], scale=0.5)
    st.update()
    assert st.history.tolist() == [0, 2, 3, INF] and bits(st.scale) == bits(torch.tensor(0.5))
    # Still frozen while the inf is in the window (max), and released once it rolls out.
    for _ in range(3):
        st.history[0] = 4.0
        st.update()
        assert bits(st.scale) == bits(torch.tensor(0.5))
    st.history[0] = 4.0
    st.update()  # window [4, 4, 4, 4]: the inf has left
    assert bits(st.scale) == bits(torch.tensor(112.0))


def test_delayed_nan_entries_ignored():
    # a = [NaN, 2, 3, 1] -> A_max = 3, s = RN(448/3) = 0x43155555.
    st = state_with(delayed_cfg(), [1, NAN, 2, 3])
    st.update()
    assert bits(st.scale) == 0x43155555


def test_delayed_reduced_amax():
    # R != 0 replaces H[0] as `last`: a = [1, 2, 3, 8] -> s = 448/8 = 56.
    st = state_with(delayed_cfg(), [5, 1, 2, 3])
    st.update(reduced_amax=torch.tensor([8.0]))
    assert bits(st.scale) == bits(torch.tensor(56.0)) and st.history.tolist() == [0, 2, 3, 8]
    # R == 0 falls back to H[0] = 5.
    st = state_with(delayed_cfg(), [5, 1, 2, 3])
    st.update(reduced_amax=0.0)
    assert bits(st.scale) == 0x42B33333 and st.history.tolist() == [0, 2, 3, 5]


def test_delayed_history_len_1():
    st = state_with(delayed_cfg(L=1), [7.0])
    st.update()
    assert st.history.tolist() == [0.0] and bits(st.scale) == bits(torch.tensor(64.0))


def test_delayed_quantize_uses_scale_and_records_amax():
    cfg = delayed_cfg()
    st = state_with(cfg, [0, 0, 0, 0], scale=64.0)
    # sinv = RN(1/64) = 2^-6; 10·64 = 640 saturates to 448 (stale scale) -> 0x7E;
    # -0.5·64 = -32 = -2^5: 0xE0; 0.125·64 = 8 = 2^3 -> E=10: 0x50.
    q = reference.quantize(torch.tensor([[10.0, -0.5, 0.125]]), cfg, state=st)
    assert bits(q.rowwise_scale) == 0x3C800000
    assert codes(q.rowwise_data) == [0x7E, 0xE0, 0x50]
    assert st.history[0].item() == 10.0 and bits(q.rowwise_amax) == bits(torch.tensor(10.0))
    # A second micro-batch with a smaller amax keeps fmax(10, 3) = 10; NaN is ignored.
    reference.quantize(torch.tensor([[3.0, NAN]]), cfg, state=st)
    assert st.history.tolist() == [10, 0, 0, 0]
    st.update()
    assert bits(st.scale) == bits(torch.tensor(44.8))  # RN(448/10)
    q = reference.quantize(torch.tensor([[10.0]]), cfg, state=st)
    assert bits(q.rowwise_scale) == int(np.array([np.float32(1) / np.float32(44.8)]).view(np.uint32)[0])


def test_delayed_state_none_is_fresh_scale_one():
    q = reference.quantize(torch.tensor([[3.0, -600.0]]), delayed_cfg())
    assert bits(q.rowwise_scale) == 0x3F800000
    # 3 = 1.5·2^1 -> E=8, m=4: 0x44; -600 saturates: 0xFE.
    assert codes(q.rowwise_data) == [0x44, 0xFE]


def test_delayed_state_config_mismatch():
    st = AmaxHistory(delayed_cfg(L=4))
    with pytest.raises(ValueError, match="state was built for"):
        reference.quantize(torch.ones(2, 2), delayed_cfg(L=8), state=st)
    with pytest.raises(ValueError, match="only for fp8_delayed"):
        reference.quantize(torch.ones(2, 2), QuantConfig("fp8_current"), state=st)


class OracleHistory:
    """docs/numerics.md §2 written out with Python lists and numpy float32 scalars."""

    def __init__(self, cfg: QuantConfig):
        self.cfg = cfg
        self.scale = np.float32(1.0)
        self.h = [np.float32(0.0)] * cfg.amax_history_len

    def record(self, a):
        self.h[0] = np.fmax(self.h[0], np.float32(a))

    def update(self, r=None):
        s_max = np.float32(math.ldexp(FMT[self.cfg.element].max_finite, -self.cfg.margin))
        last = np.float32(r) if (r is not None and r != 0) else self.h[0]
        if last == 0:
            return
        a = self.h[1:] + [last]
        finite = [v for v in a if not np.isnan(v)]
        a_max = max(finite) if finite else np.float32(NAN)
        big_a = a_max if self.cfg.amax_compute_algo == "max" else last
        self.h = [np.float32(0.0)] + a[1:]
        if np.isfinite(big_a) and big_a > 0:
            with np.errstate(over="ignore"):
                s = s_max / big_a
            self.scale = np.float32(FLT_MAX) if np.isinf(s) else s


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(dict(amax_history_len=5), id="max-L5"),
        pytest.param(dict(amax_history_len=3, amax_compute_algo="most_recent", margin=2), id="recent-L3-m2"),
        pytest.param(dict(amax_history_len=1, element="e5m2"), id="max-L1-e5m2"),
        pytest.param(dict(amax_history_len=6, margin=-1, element="e5m2"), id="max-L6-m-1"),
    ],
)
def test_delayed_sequence_matches_oracle(kw):
    cfg = QuantConfig("fp8_delayed", **kw)
    st, orc = AmaxHistory(cfg), OracleHistory(cfg)
    r = np.random.default_rng(7)
    for step in range(14):
        for _ in range(int(r.integers(0, 3))):  # micro-batches (0: a step with no quantization)
            kind = r.integers(0, 6)
            x = (r.standard_normal((3, 5)) * 2.0 ** r.integers(-140, 60)).astype(np.float32)
            if kind == 0:
                x[:] = 0
            elif kind == 1:
                x[0, 0] = INF
            elif kind == 2:
                x[1, :] = NAN
            q = reference.quantize(torch.from_numpy(x), cfg, state=st, colwise=True)
            s = orc.scale
            exp = oracle_codes(x * s, cfg.element)
            assert np.array_equal(q.rowwise_data.numpy(), exp), step
            assert np.array_equal(q.colwise_data.numpy(), exp.T), step
            assert bits(q.rowwise_scale) == int(np.array([np.float32(1) / s]).view(np.uint32)[0]), step
            orc.record(oracle_amax(x))
        red = None
        if r.random() < 0.3:
            red = float(r.choice([0.0, 2.0 ** r.integers(-5, 20)]))
        st.update(reduced_amax=red)
        orc.update(red)
        assert np.array_equal(st.history.numpy().view(np.uint32), np.array(orc.h, dtype=np.float32).view(np.uint32)), (
            step
        )
        assert bits(st.scale) == int(np.array([orc.scale]).view(np.uint32)[0]), step
