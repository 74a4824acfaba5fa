"""Per-tensor FP8: current scaling (`fp8_current`) and delayed scaling (`fp8_delayed`, `AmaxHistory`).

Source: docs/numerics.md §1 (compute_scale, current scaling, layout), §2 (delayed scaling, fused update);
TE common/recipe/current_scaling.cu, common/recipe/delayed_scaling.cu, common/cast/fp8/quantize_fp8.cuh.

Layout (§1): rowwise data uint8 [M, K]; colwise data uint8 [K, M], the byte-exact transpose of the
rowwise codes, with the same sinv; scale = sinv fp32 [1]; amax = amax(x) fp32 [1] for each copy.
Large inputs are processed in row chunks, so the extra memory stays a small multiple of one chunk.
Convention `torchao_float8` (docs/numerics.md §10.6) replaces the amax, the scale and the
NaN byte of fp8_current (`_torchao_scales`, `_cast`); the layout is unchanged.
"""

from __future__ import annotations

import math

import torch

from . import casts, fp32, scaling
from .formats import FLT_MAX, QuantConfig
from .types import QuantizedTensor

# Elements per row chunk: bounds the fp32 temporaries (a few chunk-sized tensors at a time).
CHUNK_ELEMENTS = 1 << 22


def _row_chunks(m: int, k: int):
    """(m0, m1) row ranges of about CHUNK_ELEMENTS elements each."""
    rows = max(1, CHUNK_ELEMENTS // max(k, 1))
    for m0 in range(0, m, rows):
        yield m0, min(m, m0 + rows)


def tensor_amax(x2d: torch.Tensor) -> torch.Tensor:
    """amax(x) over the whole tensor as fp32 [1] (NaN ignored, +inf kept), computed chunk by chunk.

    NUMERICS: §0.1 amax - any reduction order is exact; partial maxima are combined with max.
    """
    m, k = x2d.shape
    parts = [scaling.amax(x2d[m0:m1]).reshape(1) for m0, m1 in _row_chunks(m, k)]
    return torch.stack(parts).amax(dim=0)


class AmaxHistory:
    """State of one fp8_delayed slot: `scale` fp32 [1] (init 1.0) and `history` fp32 [L] (init 0).

    Source: docs/numerics.md §2 (fused-kernel semantics), TE common/recipe/delayed_scaling.cu.
    `quantize` reads `scale` and accumulates history[0] = fmax(history[0], amax(x)); `update()`
    runs the end-of-step fused update (steps 1-6).
    """

    def __init__(self, config: QuantConfig, device: str | torch.device = "cpu") -> None:
        if not isinstance(config, QuantConfig) or config.scheme != "fp8_delayed":
            raise ValueError(f"AmaxHistory needs an fp8_delayed QuantConfig, got {config!r}")
        self.config = config
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.history = torch.zeros(config.amax_history_len, dtype=torch.float32, device=device)

    @property
    def device(self) -> torch.device:
        return self.history.device

    def record(self, a: torch.Tensor) -> None:
        """H[0] <- fmax(H[0], a): accumulate the unscaled amax of one quantization of this step.

        NUMERICS: §2 "H_j[0] <- fmax(H_j[0], amax(x))", fmax ignores NaN (§0.1).
        """
        a = a.to(device=self.device, dtype=torch.float32).reshape(1)
        self.history[0:1] = torch.fmax(self.history[0:1], a)

    def update(self, reduced_amax: torch.Tensor | float | None = None) -> None:
        """End-of-step update of `history` and `scale` (docs/numerics.md §2 steps 1-6, the fused kernel).

        `reduced_amax` is the cross-rank MAX-reduced amax R of this step, if any (used when R != 0).
        """
        cfg = self.config
        h = self.history  # (L,)
        dev = h.device
        # NUMERICS: §2.1 S_max = fp8_max * 2^-margin, exact (power-of-two scaling).
        s_max = fp32.scalar(math.ldexp(cfg.element_format.max_finite, -cfg.margin), h).reshape(1)
        # NUMERICS: §2.2 last = R if R exists and R != 0, else H[0].
        last = h[0:1]
        if reduced_amax is not None:
            r = torch.as_tensor(reduced_amax, dtype=torch.float32).to(dev).reshape(1)
            last = torch.where(r != 0, r, last)
        nonzero = last != 0  # (1,) NUMERICS: §2.3 last = 0 -> nothing changes (no roll, scale kept)
        # NUMERICS: §2.4 a_i = H[i+1] (i < L-1), a_{L-1} = last; new history [0, a_1, ..., a_{L-1}].
        a = torch.cat([h[1:], last])  # (L,)
        rolled = torch.cat([torch.zeros(1, dtype=torch.float32, device=dev), a[1:]])
        # NUMERICS: §2.4 A_max = fmax over a_i (NaN ignored; an all-NaN window gives -inf -> scale kept).
        a_max = torch.where(torch.isnan(a), torch.full_like(a, float("-inf")), a).amax().reshape(1)
        # NUMERICS: §2.5 A = A_max for `max`, last for `most_recent`; §2.3 A = 0 when last = 0.
        big_a = a_max if cfg.amax_compute_algo == "max" else last
        big_a = torch.where(nonzero, big_a, torch.zeros_like(big_a))
        # NUMERICS: §2.6 s = RN(S_max / A) (true division) iff A finite and A > 0, else keep scale;
        # s = +inf -> FLT_MAX.
        use = torch.isfinite(big_a) & (big_a > 0)
        safe_a = torch.where(use, big_a, torch.ones_like(big_a))
        s = torch.where(use, fp32.div(s_max, safe_a), self.scale.to(dev))
        s = torch.where(torch.isinf(s), fp32.scalar(FLT_MAX, s), s)
        # In place, so views of the state buffers held elsewhere see the update.
        self.history.copy_(torch.where(nonzero, rolled, h))
        self.scale.copy_(s.to(self.scale.device))

    def __repr__(self) -> str:
        return f"AmaxHistory({self.config.id}, scale={self.scale.tolist()}, history[:4]={self.history[:4].tolist()})"


# NUMERICS: §10.6 - torchao/float8/float8_utils.py EPS: amax is clamped to >= 1e-12 (a float64 constant).
TORCHAO_FLOAT8_EPS = 1e-12


def _torchao_scales(x2d: torch.Tensor, config: QuantConfig):
    """(a, s, sinv) of fp8_current under `torchao_float8` (tensor_to_amax + amax_to_scale, tensorwise)."""
    # NUMERICS: §10.6 - amax = torch.max(torch.abs(x)) in x's dtype over the whole tensor: NaN propagates
    # (with the sign and payload torch's reduction gives it, which then flow into s and the NaN bytes).
    a_hp = torch.max(torch.abs(x2d))
    a = a_hp.to(torch.float32).reshape(1)
    # NUMERICS: §10.6 - s = fp8_max / clamp(amax, 1e-12) in float64, written Python-number / tensor, which
    # eager PyTorch evaluates as RN64(fp8_max * RN64(1 / amax)); then one rounding to fp32. No special
    # cases: amax = +inf gives s = 0, amax = NaN gives s = NaN.
    r = torch.reciprocal(torch.clamp(a_hp.to(torch.float64).reshape(1), min=TORCHAO_FLOAT8_EPS))
    s = (r * config.element_format.max_finite).to(torch.float32)
    # NUMERICS: §10.6 - torchao stores s and decodes by x / s; in our layout sinv = RN(1 / s) (§1).
    return a, s, fp32.div(1.0, s)


def _cast(y: torch.Tensor, config: QuantConfig) -> torch.Tensor:
    """sat_fp8 of the scaled values; `torchao_float8` keeps a NaN's sign (torch's cast, NUMERICS: §10.6)."""
    if config.convention == "torchao_float8":
        return casts.saturating_cast_signed_nan(y, config.element_format)
    return casts.saturating_cast(y, config.element_format)


def _scales(x2d: torch.Tensor, config: QuantConfig, state: AmaxHistory | None, given: torch.Tensor | None = None):
    """(a, s, sinv) as fp32 [1] tensors on x's device: the tensor amax (or the given one), the encode and decode scale."""
    fmt = config.element_format
    if config.convention == "torchao_float8":
        return _torchao_scales(x2d, config)
    # NUMERICS: §1 - a given amax (TE's quantize_with_amax) replaces amax(X) in compute_scale.
    a = tensor_amax(x2d) if given is None else given.to(device=x2d.device, dtype=torch.float32).reshape(1)
    if config.scheme == "fp8_current":
        if state is not None:
            raise ValueError(f"{config.id}: state is only for fp8_delayed (got {type(state).__name__})")
        # NUMERICS: §1 current scaling - s = compute_scale(A, fp8_max, pow2, eps, v_inf = FLT_MAX);
        # under HYBRID the config's element (e4m3 / e5m2) gives fp8_max.
        s, sinv = scaling.compute_scale(a, fmt.max_finite, pow2=config.pow2_scales, eps=config.eps, v_inf=FLT_MAX)
        return a, s, sinv
    if state is None:
        # Documented: without a state, a fresh AmaxHistory (scale 1.0) is used and then discarded.
        state = AmaxHistory(config, device=x2d.device)
    if not isinstance(state, AmaxHistory):
        raise ValueError(f"{config.id}: state must be a reference.per_tensor.AmaxHistory, got {type(state).__name__}")
    if state.config != config:
        raise ValueError(f"{config.id}: state was built for {state.config.id}, not for this config")
    # NUMERICS: §2 quantizing - s = the slot's scale, sinv = RN(1/scale) (true division).
    s = state.scale.to(x2d.device)
    sinv = fp32.div(1.0, s)
    # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) (unscaled amax, accumulated over the step).
    state.record(a)
    return a, s, sinv


def quantize_2d(
    x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool, rng=None, state=None, amax=None
) -> dict:
    """Per-tensor FP8 quantization of a contiguous [M, K] tensor (docs/numerics.md §1, §2).

    fp8_delayed reads `state.scale` and updates `state.history[0]`; with state=None a fresh
    AmaxHistory is used (scale 1.0) and discarded. `rng` is unused (no stochastic rounding here).
    `amax` (fp8_current only) is a given tensor amax used instead of amax(X).
    """
    m, k = x2d.shape
    a, s, sinv = _scales(x2d, config, state, amax)
    dev = x2d.device
    data = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None  # (M, K)
    data_t = torch.empty((k, m), dtype=torch.uint8, device=dev) if colwise else None  # (K, M)
    for m0, m1 in _row_chunks(m, k):
        # NUMERICS: §1 q = sat_fp8(RN(x*s)): exact widening to fp32, one fp32 multiply, no FMA.
        q = _cast(x2d[m0:m1].to(torch.float32) * s, config)  # (m1-m0, K)
        if data is not None:
            data[m0:m1] = q
        if data_t is not None:
            # NUMERICS: §1 data_T is the byte-exact transpose of the rowwise codes.
            data_t[:, m0:m1] = q.T.contiguous()  # blocked transpose, then row-contiguous stores
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=data, rowwise_scale=sinv.clone(), rowwise_amax=a.clone())
    if colwise:
        # NUMERICS: §1 the transposed copy shares sinv.
        out.update(colwise_data=data_t, colwise_scale=sinv.clone(), colwise_amax=a.clone())
    return out


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(dec(q) * sinv)) as [M, K] (the colwise copy is transposed back). docs/numerics.md §1."""
    fmt = q.config.element_format
    codes = getattr(q, f"{orientation}_data")
    sinv = getattr(q, f"{orientation}_scale").to(torch.float32)
    # NUMERICS: §1 dequantization - one fp32 multiply, then one rounding to the output dtype.
    x = (casts.decode(codes, fmt) * sinv).to(dtype)
    return x if orientation == "rowwise" else x.T.contiguous()
