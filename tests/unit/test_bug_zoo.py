"""The bug zoo: one in-process adapter per cause of the catalogue (docs/numerics.md §13), each injecting that one bug
into the golden, run end to end through harness.runner.run_case; the row must name the cause (its id and
explanation) and get the expected severity (docs/numerics.md §11), the same on f32 and bf16 inputs.

The bugs are written here from the reference's own pieces (reference.quantize's output, reference.nvfp4's scale
chain, plain torch arithmetic), never from harness.causes.model, so the catalogue's model re-run is checked
against an independent implementation of each bug.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Callable

import pytest
import torch

import reference
from harness import causes, runner, verdict
from harness.cases import Case
from harness.inputs import generate
from reference import QuantConfig as Q
from reference import casts, fp32, nvfp4, scaling, stochastic
from reference.formats import E4M3, FLT_MAX
from reference.layouts import geometry_of
from reference.types import QuantizedTensor

SHAPE = (64, 128)


# ---- the adapter -------------------------------------------------------------------------------------------


class Zoo:
    """An adapter whose quantize is the golden with one bug: `bug(x2d, config, golden) -> QuantizedTensor`."""

    def __init__(self, name: str, bug: Callable):
        self.name, self.bug = name, bug

    def supports(self, op, config, device):
        return True, ""

    def quantize(self, x, config, *, rowwise=True, colwise=False, rng=None, state=None):
        g = reference.quantize(x, config, rowwise=rowwise, colwise=colwise, rng=rng)
        return self.bug(x.reshape(-1, x.shape[-1]), config, g, rng)


# ---- helpers: the golden's scaled values and codes of one copy (from the reference) ----------------------


def _copies(q: QuantizedTensor):
    return [o for o in ("rowwise", "colwise") if q.has(o)]


def _codes(q: QuantizedTensor, o: str) -> torch.Tensor:
    d = getattr(q, f"{o}_data")
    return casts.unpack_nibbles(d) if q.config.element_format.bits == 4 else d.clone()


def _with_codes(q: QuantizedTensor, o: str, codes: torch.Tensor) -> QuantizedTensor:
    codes = codes.to(torch.uint8)
    data = casts.pack_nibbles(codes) if q.config.element_format.bits == 4 else codes
    return dataclasses.replace(q, **{f"{o}_data": data})


def _scaled(x2d: torch.Tensor, q: QuantizedTensor, o: str) -> torch.Tensor:
    """The golden's scaled values y = x * (encode factor) in copy o's data layout (docs/numerics.md §1, §3, §5.4)."""
    cfg = q.config
    if cfg.scheme == "fp8_current":
        s, _ = scaling.compute_scale(q.rowwise_amax if q.rowwise_amax is not None else q.colwise_amax,
                                     cfg.element_format.max_finite, pow2=cfg.pow2_scales, eps=cfg.eps, v_inf=FLT_MAX)
        y = x2d.to(torch.float32) * s
        return y if o == "rowwise" else y.t()
    if cfg.scheme == "mxfp8":
        m, k = x2d.shape
        e = getattr(q, f"{o}_scale")
        e = e[:m, : k // 32].repeat_interleave(32, 1) if o == "rowwise" else e[: m // 32, :k].repeat_interleave(32, 0)
        return x2d.to(torch.float32) * casts.e8m0_multiplier(e)
    ch = nvfp4.scale_chain(x2d, cfg, o)
    return ch["source"].to(torch.float32) * ch["f"].repeat_interleave(cfg.block, 1)


def _step_codes(codes: torch.Tensor, fmt, step: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.int64)
    sign = c & fmt.sign_mask
    mag = torch.clamp((c & ~fmt.sign_mask) + step, 0, fmt.max_code)
    nan = _is_nan(c, fmt)
    return torch.where(nan, c, mag | sign).to(torch.uint8)


def _is_nan(c: torch.Tensor, fmt) -> torch.Tensor:
    if fmt.nan_code is None:
        return torch.zeros_like(c, dtype=torch.bool)
    return (c & ~fmt.sign_mask) == fmt.nan_code if fmt.inf_code is None else (c & ~fmt.sign_mask) > fmt.inf_code


def _rounding(mode: str):
    """A bug that rounds the golden's scaled values differently: toward zero, away, ties away (the golden's code is
    RNE; the bug moves it to the neighbour its own rule picks)."""

    def bug(x2d, cfg, g, rng):
        fmt = cfg.element_format
        for o in _copies(g):
            y = _scaled(x2d, g, o).to(torch.float64)
            c = _codes(g, o)
            a = y.abs()
            v = casts.decode(c, fmt).to(torch.float64).abs()
            up = casts.decode(_step_codes(c, fmt, torch.ones_like(c, dtype=torch.int64)), fmt).to(torch.float64).abs()
            fin = torch.isfinite(a) & (a <= fmt.max_finite)
            if mode == "rtz":
                step = -(fin & (v > a)).to(torch.int64)
            elif mode == "away":
                step = (fin & (v < a) & (up > v)).to(torch.int64)
            else:  # ties away: a midpoint the golden rounded down (to the even code) goes up
                step = (fin & (v < a) & (up - a == a - v)).to(torch.int64)
            g = _with_codes(g, o, _step_codes(c, fmt, step))
        return g

    return bug


def _double_rounding(x2d, cfg, g, rng):
    """x * scale rounded to bf16 before the element cast (a kernel that multiplies in bf16)."""
    for o in _copies(g):
        y = _scaled(x2d, g, o).to(torch.bfloat16).to(torch.float32)
        fmt = cfg.element_format
        codes = nvfp4.e2m1_rn(y) if fmt.bits == 4 else casts.saturating_cast(y, fmt)
        g = _with_codes(g, o, codes)
    return g


# ---- scale arithmetic -----------------------------------------------------------------------------------


def _fp8_current_with(s_of: Callable, *, encode: str = "mul", store: str = "sinv", product=None, sinv_of=None):
    """fp8_current from a scale s = s_of(amax, x): q = sat(RN(x * s)) (or x / sinv); the stored scale sinv or s."""

    def bug(x2d, cfg, g, rng):
        fmt = cfg.element_format
        a = scaling.amax(x2d).reshape(1)
        s = s_of(a, x2d).to(torch.float32)
        sinv = sinv_of(s) if sinv_of else fp32.div(1.0, s)
        xf = x2d.to(torch.float32)
        y = xf * s if encode == "mul" else torch.div(xf, sinv)
        if product is not None:
            y = (x2d.to(product) * s.to(product)).to(torch.float32)
        codes = casts.saturating_cast(y, fmt)
        out = {}
        for o in _copies(g):
            out[f"{o}_data"] = codes if o == "rowwise" else codes.t().contiguous()
            out[f"{o}_scale"] = (sinv if store == "sinv" else s).clone()
        return dataclasses.replace(g, **out)

    return bug


def _recip_mul(a, x2d):
    return 448.0 / a  # NUMERICS: §0.2.2 - eager PyTorch: 448 * (1 / a), the bug


def _true_div(a, x2d):
    return fp32.div(448.0, a)


def _bf16_scale(a, x2d):
    return torch.tensor(448.0, dtype=torch.bfloat16) / a.to(torch.bfloat16)  # ModelOpt: the scale in bf16


def _nvfp4_with(*, s_enc_of=None, d_of=None, block=None, f_of=None, y_of=None, amax_of=None, rht_src=None):
    """NVFP4 re-implemented from reference.nvfp4's steps (docs/numerics.md §5.1-§5.4) with one step replaced."""

    def bug(x2d, cfg, g, rng):
        for o in _copies(g):
            src = nvfp4.copy_source(x2d, cfg, o) if rht_src is None else rht_src(x2d, cfg, o)
            src = src.to(torch.float32)
            a_g = amax_of(x2d, src) if amax_of is not None else getattr(g, f"{o}_amax").reshape(1)
            s_enc, s_dec = nvfp4.global_scale(a_g)
            if s_enc_of is not None:
                s_enc = s_enc_of(a_g)
                s_dec = fp32.div(1.0, s_enc)
            rows, cols = src.shape
            a_b = scaling.amax(src.reshape(rows, cols // 16, 16), dim=2)
            d, s_blk = nvfp4.block_scale(a_b, nvfp4.block_multiplier(s_enc))
            if d_of is not None:
                d = d_of(a_b, s_enc)
                s_blk = casts.saturating_cast(d, E4M3)
            if block is not None:
                s_blk = block(d)
            f = nvfp4.encode_factor(s_blk, s_dec) if f_of is None else f_of(s_blk, s_enc, s_dec)
            y = src.reshape(rows, cols // 16, 16) * f[..., None]
            codes = nvfp4.e2m1_rn(y if y_of is None else y_of(y)).reshape(rows, cols)
            scale = getattr(g, f"{o}_scale").clone()
            scale[:rows, : cols // 16] = s_blk
            g = dataclasses.replace(g, **{f"{o}_data": casts.pack_nibbles(codes), f"{o}_scale": scale,
                                          f"{o}_amax": getattr(g, f"{o}_amax").clone()})
        return g

    return bug


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def _nv_bf16_senc(a_g):
    return _bf16(nvfp4.global_scale(a_g)[0])


def _nv_bf16_d(a_b, s_enc):
    """ModelOpt-style: the block multiplier and the block scale in bf16 too."""
    m = _bf16(nvfp4.block_multiplier(s_enc))
    return _bf16(torch.fmin(a_b * m, fp32.scalar(FLT_MAX, m)))


def _nv_div6(a_b, s_enc):
    return fp32.div(a_b, 6.0) * s_enc  # RN(RN(A_b / 6) * S_enc): 4over6's order


def _nv_one_up(d):
    return torch.clamp(casts.saturating_cast(d, E4M3).to(torch.int64) + 1, max=E4M3.max_code).to(torch.uint8)


def _mx_block64(x2d, cfg, g, rng):
    """MXFP8 with 1x64 blocks: one exponent per 64 elements (scale [roundup(M,128), roundup(K/64,4)])."""
    m, k = x2d.shape
    xs = x2d.to(torch.float32).reshape(m, k // 64, 64)
    e = reference.mxfp8.exponent(scaling.amax(xs, dim=2), cfg)
    codes = casts.saturating_cast(xs * casts.e8m0_multiplier(e)[..., None], cfg.element_format).reshape(m, k)
    scale = torch.zeros(-(-m // 128) * 128, -(-(k // 64) // 4) * 4, dtype=torch.uint8)
    scale[:m, : k // 64] = e
    return dataclasses.replace(g, rowwise_data=codes, rowwise_scale=scale)


def _nv_colwise_rowblocks(x2d, cfg, g, rng):
    """The NVFP4 colwise copy as the rowwise codes transposed (blocks along K, not M)."""
    return dataclasses.replace(g, colwise_data=casts.pack_nibbles(_codes(g, "rowwise").t().contiguous()))


def _transposed_data(x2d, cfg, g, rng):
    """The rowwise copy's codes transposed ([K, M]; NVFP4 packed again along the new rows)."""
    return _with_codes(g, "rowwise", _codes(g, "rowwise").t().contiguous())


def _untransposed_codes(x2d, cfg, g, rng):
    """The colwise copy computed in its own [K, M] order and stored without the transpose MXFP8 needs, or (NVFP4)
    the rowwise codes in the colwise shape."""
    if cfg.scheme == "mxfp8":
        return dataclasses.replace(g, colwise_data=g.colwise_data.t().contiguous().reshape(g.colwise_data.shape))
    return dataclasses.replace(g, colwise_data=g.rowwise_data.reshape(g.colwise_data.shape).clone())


def _e4m3_round(mode: str):
    def block(d):
        c = casts.saturating_cast(d, E4M3)
        v = casts.decode(c, E4M3)
        step = -(v > d).to(torch.int64) if mode == "down" else (v < d).to(torch.int64)
        return torch.clamp(c.to(torch.int64) + step, 0, E4M3.max_code).to(torch.uint8)

    return block


def _mxfp8_with(e_of: Callable | None = None, factor_of: Callable | None = None, clamp: str = "sat",
                store: str = "decode", y_of=None):
    """MXFP8 from reference pieces (docs/numerics.md §3) with one step replaced."""

    def bug(x2d, cfg, g, rng):
        fmt = cfg.element_format
        m, k = x2d.shape
        for o in _copies(g):
            xs = x2d.to(torch.float32) if o == "rowwise" else x2d.to(torch.float32).t()
            r, c = xs.shape
            blocks = xs.reshape(r, c // 32, 32)
            a = scaling.amax(blocks, dim=2)
            e = reference.mxfp8.exponent(a, cfg) if e_of is None else e_of(a, blocks, cfg)
            p = casts.e8m0_multiplier(e) if factor_of is None else factor_of(e)
            y = blocks * p[..., None]
            if y_of is not None:
                y = y_of(y)
            codes = casts.saturating_cast(y, fmt)
            if clamp != "sat":  # no clamp: RN past the max overflows to NaN (E4M3) or Inf (E5M2)
                over = (y.abs() > fmt.max_finite + (fmt.max_finite - casts.decode(
                    torch.tensor([fmt.max_code - 1], dtype=torch.uint8), fmt)[0]) / 2) | torch.isinf(y)
                special = fmt.inf_code if (clamp == "inf" or fmt.inf_code is not None) else fmt.nan_code
                sign = torch.signbit(y).to(torch.uint8) << 7
                codes = torch.where(over, torch.full_like(codes, special) | sign, codes)
            codes = codes.reshape(r, c)
            stored = e.to(torch.uint8) if store == "decode" else (254 - e.to(torch.int64)).to(torch.uint8)
            scale = getattr(g, f"{o}_scale").clone()
            if o == "rowwise":
                scale[:m, : k // 32] = stored
            else:
                scale[: m // 32, :k] = stored.t()
                codes = codes.t()
            g = dataclasses.replace(g, **{f"{o}_data": codes.contiguous(), f"{o}_scale": scale})
        return g

    return bug


def _e8m0_rule(rule: str):
    """The block exponent by TE's ceil or OCP's floor rule, or torchao's EVEN / CEIL (ceil of log2 amax)."""
    def e_of(a, blocks, cfg):
        if rule in ("floor", "ceil"):
            return reference.mxfp8.exponent(a, dataclasses.replace(cfg, e8m0_rule=rule))
        mode = {"even": "even", "ceil_log2": "ceil"}[rule]
        return reference.mxfp8._torchao_pow2_blocks(blocks, a, cfg.element_format, mode)[0]

    return e_of


def _mx_half_exponent(a, blocks, cfg):
    t = (a * fp32.reciprocal_const(cfg.element_format.max_finite)).to(torch.float16).to(torch.float32)
    return casts.e8m0_up(t)


def _mx_one_up(a, blocks, cfg):
    return torch.clamp(reference.mxfp8.exponent(a, cfg).to(torch.int64) + 1, max=254).to(torch.uint8)


# ---- special values, denormals ---------------------------------------------------------------------------


def _map_codes(f: Callable):
    """A bug applied to every copy's codes: f(codes, x in the data layout, fmt) -> codes."""

    def bug(x2d, cfg, g, rng):
        fmt = cfg.element_format
        for o in _copies(g):
            xs = x2d if (o == "rowwise" or cfg.scheme == "mxfp8") else x2d.t()
            if cfg.rht and o == "colwise":
                xs = nvfp4.copy_source(x2d, cfg, o)
            g = _with_codes(g, o, f(_codes(g, o), xs.to(torch.float32), fmt))
        return g

    return bug


def _nan_sign(c, x, fmt):
    return torch.where(torch.isnan(x), c | (torch.signbit(x).to(torch.uint8) << 7), c)


def _nan_zero(c, x, fmt):
    return torch.where(torch.isnan(x), torch.zeros_like(c), c)


def _inf_nan(c, x, fmt):
    return torch.where(torch.isinf(x), torch.full_like(c, fmt.nan_code), c)


def _pos_zero(c, x, fmt):
    return torch.where((c & ~fmt.sign_mask & 0xFF) == 0, torch.zeros_like(c), c)


def _ftz(c, x, fmt):
    mag = c & ~fmt.sign_mask & 0xFF
    return torch.where((mag >> fmt.man_bits) == 0, c & fmt.sign_mask, c)


def _nan_propagating(x2d, cfg, g, rng):
    """amax by torch.max (NaN propagates): fp8_current's scale, an MXFP8 block's exponent, NVFP4's A_g go NaN."""
    if cfg.scheme == "fp8_current":
        return _fp8_current_with(lambda a, x: fp32.div(448.0, x.abs().to(torch.float32).max().reshape(1)))(
            x2d, cfg, g, rng)
    if cfg.scheme == "mxfp8":
        return _mxfp8_with(e_of=lambda a, blocks, c: reference.mxfp8.exponent(blocks.abs().amax(-1), c))(
            x2d, cfg, g, rng)
    amax = x2d.abs().to(torch.float32).max().reshape(1)  # NaN
    for o in _copies(g):
        rows = x2d.shape[0] if o == "rowwise" else x2d.shape[1]
        cols = x2d.numel() // rows
        scale = getattr(g, f"{o}_scale").clone()
        scale[:rows, : cols // 16] = E4M3.nan_code
        g = dataclasses.replace(g, **{f"{o}_data": torch.full_like(getattr(g, f"{o}_data"), 0x77),
                                      f"{o}_scale": scale, f"{o}_amax": amax.clone()})
    return g


def _inf_amax_zero(x2d, cfg, g, rng):
    if cfg.scheme == "fp8_current":
        return _fp8_current_with(lambda a, x: fp32.div(448.0, a))(x2d, cfg, g, rng)  # 448 / inf = 0, unguarded
    return _nvfp4_with(s_enc_of=lambda a_g: torch.where(torch.isinf(a_g), torch.zeros_like(a_g),
                                                        nvfp4.global_scale(a_g)[0]))(x2d, cfg, g, rng)


# ---- geometry, global amax, RHT, SR ----------------------------------------------------------------------


def _nvfp4_block32(x2d, cfg, g, rng):
    """NVFP4 with blocks of 32 (the scale tensor [roundup(M,128), roundup(K/32,4)])."""
    out = {}
    for o in _copies(g):
        src = nvfp4.copy_source(x2d, cfg, o).to(torch.float32)
        rows, cols = src.shape
        s_enc, s_dec = nvfp4.global_scale(getattr(g, f"{o}_amax").reshape(1))
        a_b = scaling.amax(src.reshape(rows, cols // 32, 32), dim=2)
        _, s_blk = nvfp4.block_scale(a_b, nvfp4.block_multiplier(s_enc))
        f = nvfp4.encode_factor(s_blk, s_dec)
        codes = nvfp4.e2m1_rn(src.reshape(rows, cols // 32, 32) * f[..., None]).reshape(rows, cols)
        scale = torch.zeros(-(-rows // 128) * 128, -(-(cols // 32) // 4) * 4, dtype=torch.uint8)
        scale[:rows, : cols // 32] = s_blk
        out.update({f"{o}_data": casts.pack_nibbles(codes), f"{o}_scale": scale})
    return dataclasses.replace(g, **out)


def _mx_colwise_rowblocks(x2d, cfg, g, rng):
    """The MXFP8 colwise copy quantized along the rowwise 1x32 blocks (its data is the rowwise copy's)."""
    r = reference.quantize(x2d, cfg, rowwise=True)
    return dataclasses.replace(g, colwise_data=r.rowwise_data.clone())


def _sr_bytes_reversed(x2d, cfg, g, rng):
    """SR with the 4 bytes of each word used in reverse order (element i of a word takes byte 3 - i)."""
    seed = reference.types.SRSeed.coerce(rng)
    for o in _copies(g):
        ch = nvfp4.scale_chain(x2d, cfg, o)
        rows, cols = ch["source"].shape
        y = ch["source"].to(torch.float32) * ch["f"].repeat_interleave(16, 1)
        r = stochastic.random_bytes(cols, 0, rows, seed.seed, stochastic.copy_stream(seed.stream, o))
        r = r.reshape(-1, 4).flip(-1).reshape(rows, cols)
        g = _with_codes(g, o, stochastic.e2m1_sr(y, r.to(torch.float32)))
    return g


def _sr_x0_only(x2d, cfg, g, rng):
    """SR with the bit rule before issue #44: one Philox call per 4 elements, byte L mod 4 of its word x0 only."""
    from reference import philox  # noqa: PLC0415

    seed = reference.types.SRSeed.coerce(rng)
    for o in _copies(g):
        ch = nvfp4.scale_chain(x2d, cfg, o)
        rows, cols = ch["source"].shape
        y = ch["source"].to(torch.float32) * ch["f"].repeat_interleave(16, 1)
        ell = torch.arange(rows * cols, dtype=torch.int64)
        x0 = philox.words_of_groups(ell // 4, seed.seed, stochastic.copy_stream(seed.stream, o))[..., 0]
        r = ((x0 >> (8 * (ell % 4))) & 0xFF).reshape(rows, cols)
        g = _with_codes(g, o, stochastic.e2m1_sr(y, r.to(torch.float32)))
    return g


def _sr_off(x2d, cfg, g, rng):
    rn = reference.quantize(x2d, dataclasses.replace(cfg, stochastic=False), rowwise=g.has("rowwise"),
                            colwise=g.has("colwise"))
    return dataclasses.replace(g, **{f"{o}_data": getattr(rn, f"{o}_data") for o in _copies(g)})


# ---- layouts ---------------------------------------------------------------------------------------------


def _untransposed(x2d, cfg, g, rng):
    """fp8_current's colwise copy as the rowwise bytes in the [K, M] shape: the transpose is missing."""
    return dataclasses.replace(g, colwise_data=g.rowwise_data.reshape(g.colwise_data.shape).clone())


def _transposed_scales(x2d, cfg, g, rng):
    m, k = x2d.shape
    return dataclasses.replace(g, rowwise_scale=g.rowwise_scale[:m, : k // 32].t().contiguous())


def _swizzled(x2d, cfg, g, rng):
    from reference.layouts import swizzle_scales

    return dataclasses.replace(g, **{f"{o}_scale": swizzle_scales(g, o) for o in _copies(g)})


def _nibbles(x2d, cfg, g, rng):
    b = g.rowwise_data.to(torch.int32)
    return dataclasses.replace(g, rowwise_data=(((b & 0x0F) << 4) | (b >> 4)).to(torch.uint8))


def _unpadded(x2d, cfg, g, rng):
    """Block scales written with the valid width as row stride into the padded buffer."""
    m, k = x2d.shape
    out = {}
    for o in _copies(g):
        full = getattr(g, f"{o}_scale")
        vr, vc = reference.layouts.scale_valid_shape(cfg, o, m, k)
        flat = torch.zeros(full.numel(), dtype=full.dtype)
        flat[: vr * vc] = full[:vr, :vc].reshape(-1)
        out[f"{o}_scale"] = flat.reshape(full.shape)
    return dataclasses.replace(g, **out)


def _dirty_padding(x2d, cfg, g, rng):
    s = g.rowwise_scale.clone()
    m, k = x2d.shape
    s[m:, :] = 0x11
    q = dataclasses.replace(g, rowwise_scale=s)
    q.extra["zero_fills_padding"] = True
    return q


# ---- the zoo -----------------------------------------------------------------------------------------------


# ---- inputs that show a bug --------------------------------------------------------------------------------


def _normal(dtype: str, shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(getattr(torch, dtype))


def _near_midpoints(dtype: str, shape) -> torch.Tensor:
    """fp8_current inputs whose x * s lies within an fp32 ulp of an E4M3 midpoint (amax 0x3FD1BA56, docs/numerics.md
    §10.7), where x * s and x / sinv round apart."""
    a = fp32.from_bits(torch.tensor([0x3FD1BA56]))
    s = fp32.div(448.0, a)
    vals = casts.decode(torch.arange(0, 0x7E, dtype=torch.uint8), E4M3).to(torch.float64)
    x = (((vals[1:] + vals[:-1]) / 2) / s.to(torch.float64)).to(torch.float32)
    x = torch.cat([x, torch.nextafter(x, torch.zeros(())), torch.nextafter(x, torch.full((), 9.0))])
    out = torch.zeros(shape).reshape(-1)
    out[: x.numel()] = x
    out[-1] = a
    return out.reshape(shape).to(getattr(torch, dtype))


def _tiny_blocks(dtype: str, shape) -> torch.Tensor:
    """Block amaxes of a few 1e-3: amax * fl(1/448) is an fp16 subnormal, where rounding it moves the exponent."""
    return _normal(dtype, shape, 1) * 1e-3


def _zero_scale_blocks(dtype: str, shape) -> torch.Tensor:
    """Rows of normal values with one element of 1e6 per row: A_g is 1e6, so the blocks without it have block
    scales d = A_b * S_enc / 6 below 2^-10 and store s_blk = 0 (docs/numerics.md §5.2)."""
    x = _normal(dtype, shape, 1).to(torch.float32)
    x[:, 0] = 1e6
    return x.to(getattr(torch, dtype))


def _zeroed_zero_scale_blocks(x2d, cfg, g, rng):
    """NVFP4 with the blocks of stored scale 0 written as +0 codes (fouroversix 1.0.5 does this)."""
    for o in _copies(g):
        valid = geometry_of(g, o).scale_valid_shape
        zero = (getattr(g, f"{o}_scale")[: valid[0], : valid[1]] == 0).repeat_interleave(16, 1)
        codes = _codes(g, o)
        g = _with_codes(g, o, torch.where(zero, torch.zeros_like(codes), codes))
    return g


def _block_scale_midpoints(dtype: str, shape) -> torch.Tensor:
    """NVFP4 with A_g = 2688 (S_enc = 1) and block amaxes A_b whose RN(A_b * fl(1/6)) and RN(A_b / 6) round to
    different E4M3 block scales (fp32 values next to 6 x an E4M3 midpoint; no bf16 value does this)."""
    vals = casts.decode(torch.arange(8, 0x7E, dtype=torch.uint8), E4M3).to(torch.float64)
    a = ((vals[1:] + vals[:-1]) / 2 * 6).to(torch.float32)
    a = torch.cat([a.view(torch.int32).add(k).view(torch.float32) for k in range(-3, 4)])
    m = nvfp4.block_multiplier(torch.ones(1))
    hits = a[casts.saturating_cast(a * m, E4M3) != casts.saturating_cast(fp32.div(a, 6.0), E4M3)]
    x = _normal("float32", shape, 4)  # the other blocks: rounding down would change them, the order does not
    rows, cols = shape
    x[::2, ::16] = hits[torch.arange(rows // 2 * (cols // 16)) % hits.numel()].reshape(rows // 2, cols // 16)
    x[0, 0] = 2688.0
    return x.to(getattr(torch, dtype))


def _carry_blocks(dtype: str, shape) -> torch.Tensor:
    """Normal values with each 1x32 block's max given a significand in [1.76, 2): floor and TE's ceil differ in
    every block; torchao's EVEN equals floor below 1.9375 and ceil above (docs/numerics.md §10.3)."""
    x = _normal("float32", shape, 2)
    g = torch.Generator().manual_seed(3)
    m, k = shape
    sig = 1.76 + 0.235 * torch.rand(m, k // 32, generator=g)
    x[:, ::32] = sig * torch.exp2(torch.randint(-2, 3, (m, k // 32), generator=g).float())
    return x.to(getattr(torch, dtype))


@dataclasses.dataclass(frozen=True)
class Entry:
    cause: str
    config: Q
    bug: Callable
    severity: str
    dist: str = "normal"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    orientation: str = "both"
    seed: int = 0
    shape: tuple[int, int] = SHAPE
    x: Callable | None = None  # x(dtype name, shape) -> the input (default: the case's distribution)


FP8, MX, NV = Q("fp8_current"), Q("mxfp8"), Q("nvfp4")
E5 = Q("fp8_current", element="e5m2")
MX_FLOOR, MX_FLOOR_E5 = Q("mxfp8", e8m0_rule="floor"), Q("mxfp8", element="e5m2", e8m0_rule="floor")
NV_RHT, NV_SR, NV_RHT_SR = Q("nvfp4", rht=True), Q("nvfp4", stochastic=True), Q("nvfp4", rht=True, stochastic=True)
BF16 = ("bfloat16",)

ZOO: tuple[Entry, ...] = (
    # rounding
    Entry("round_toward_zero", FP8, _rounding("rtz"), "degraded"),
    Entry("round_toward_zero", MX, _rounding("rtz"), "degraded"),
    Entry("round_toward_zero", NV, _rounding("rtz"), "degraded"),
    Entry("round_away_from_zero", FP8, _rounding("away"), "degraded"),
    Entry("round_away_from_zero", MX, _rounding("away"), "degraded"),
    Entry("round_away_from_zero", NV, _rounding("away"), "degraded"),
    # on exact midpoints either neighbour is as close: as accurate as the golden (§11), equivalent
    Entry("ties_away_from_zero", FP8, _rounding("half_away"), "equivalent", "ties"),
    Entry("ties_away_from_zero", MX, _rounding("half_away"), "equivalent", "ties"),
    Entry("ties_away_from_zero", NV, _rounding("half_away"), "equivalent", "ties"),
    Entry("double_rounding", FP8, _double_rounding, "degraded", dtypes=("float32",)),
    Entry("double_rounding", MX, _double_rounding, "degraded", dtypes=("float32",)),
    Entry("double_rounding", NV, _double_rounding, "equivalent", dtypes=("float32",)),  # -0.004 dB
    # scale arithmetic
    Entry("scale_reciprocal_multiply", FP8, _fp8_current_with(_recip_mul), "equivalent", seed=1),
    # NVFP4: an fp32 S_enc one ulp off moves codes only where x * f lies within an ulp of an E2M1 midpoint, which
    # random fp32 inputs (24-bit significands) never do; bf16 inputs do
    Entry("scale_reciprocal_multiply", NV, _nvfp4_with(s_enc_of=lambda a_g: 2688.0 / a_g), "equivalent", seed=4,
          shape=(128, 256), dtypes=BF16),
    # a bf16 x times this s never lands within an fp32 ulp of a midpoint: f32 only
    Entry("encode_by_division", FP8, _fp8_current_with(_true_div, encode="div"), "equivalent", dtypes=("float32",),
          x=_near_midpoints),
    # torchao_nvfp4 divides too (docs/numerics.md §10.5): on these inputs bit-exact under it, so `convention`
    Entry("encode_by_division", NV, _nvfp4_with(f_of=lambda s, se, sd: torch.fmin(
        fp32.div(se, casts.decode(s, E4M3)), fp32.scalar(FLT_MAX, se))), "convention", "uniform", seed=1,
          shape=(128, 256), dtypes=BF16),
    Entry("scale_in_input_precision", FP8, _fp8_current_with(_bf16_scale, product=torch.bfloat16), "degraded",
          dtypes=BF16),
    # an E8M0 exponent from a bf16 amax is the same in bf16 (but for one amax); fp16 rounds tiny t = amax / 448
    Entry("scale_in_input_precision", MX, _mxfp8_with(e_of=_mx_half_exponent), "equivalent", dtypes=("float16",),
          x=_tiny_blocks),
    Entry("scale_in_input_precision", NV, _nvfp4_with(s_enc_of=_nv_bf16_senc, d_of=_nv_bf16_d), "degraded",
          dtypes=BF16),
    Entry("scale_stored_not_inverse", FP8, _fp8_current_with(_true_div, store="s"), "broken"),
    Entry("scale_stored_not_inverse", MX, _mxfp8_with(store="encode"), "broken"),
    Entry("scale_one_step_off", FP8, _fp8_current_with(lambda a, x: torch.nextafter(
        fp32.div(448.0, a), torch.tensor([math.inf]))), "equivalent", seed=2),  # seed 2: 448 * (1/a) is 448 / a
    Entry("scale_one_step_off", MX, _mxfp8_with(e_of=_mx_one_up), "equivalent"),  # halves codes: ~0 dB
    Entry("scale_one_step_off", NV, _nvfp4_with(block=_nv_one_up), "degraded"),
    Entry("e8m0_floor", MX, _mxfp8_with(e_of=_e8m0_rule("floor")), "convention"),
    Entry("e8m0_ceil", MX_FLOOR, _mxfp8_with(e_of=_e8m0_rule("ceil")), "convention"),
    Entry("e8m0_even", MX, _mxfp8_with(e_of=_e8m0_rule("even")), "convention", x=_carry_blocks),  # torchao_even
    Entry("e8m0_ceil_log2", MX, _mxfp8_with(e_of=_e8m0_rule("ceil_log2")), "convention"),  # torchao_ceil
    Entry("block_scale_rounded_down", NV, _nvfp4_with(block=_e4m3_round("down")), "degraded"),
    Entry("block_scale_rounded_up", NV, _nvfp4_with(block=_e4m3_round("up")), "degraded"),
    # with S_enc = 1 torchao's RN(RN(A_b / 6) / pts) is this order (docs/numerics.md §10.5): bit-exact under it
    Entry("block_scale_order", NV, _nvfp4_with(d_of=_nv_div6), "convention", dtypes=("float32",),
          x=_block_scale_midpoints),
    Entry("zero_scale_factor", MX, _mxfp8_with(factor_of=lambda e: torch.where(
        e == 0, torch.ones(()), casts.e8m0_multiplier(e))), "equivalent", "special", dtypes=("float32",),
          shape=(128, 256)),  # tiny fp32 blocks (e = 0) need a whole 32x32 pattern tile
    # saturation
    Entry("no_saturation", MX_FLOOR, _mxfp8_with(e_of=_e8m0_rule("floor"), clamp="none"), "broken"),
    # amax = Inf gives s = 1 (§1): Inf and every |x| past E5M2's rounding range (61440) become +-Inf
    Entry("inf_instead_of_max", E5, _map_codes(lambda c, x, fmt: torch.where(
        x.abs() >= 61440, torch.full_like(c, fmt.inf_code) | (c & 0x80), c)), "broken", "special_inf"),
    Entry("inf_instead_of_max", MX_FLOOR_E5, _mxfp8_with(e_of=_e8m0_rule("floor"), clamp="inf"), "broken"),
    # special values
    Entry("nan_propagated", FP8, _nan_propagating, "broken", "special_nan"),
    Entry("nan_propagated", MX, _nan_propagating, "broken", "special_nan"),
    Entry("nan_propagated", NV, _nan_propagating, "broken", "special_nan"),
    Entry("nan_sign", FP8, _map_codes(_nan_sign), "equivalent", "special_nan"),
    Entry("nan_sign", MX, _map_codes(_nan_sign), "equivalent", "special_nan"),
    Entry("nan_as_zero", FP8, _map_codes(_nan_zero), "equivalent", "special_nan"),
    Entry("nan_as_zero", NV, _map_codes(_nan_zero), "equivalent", "special_nan"),
    Entry("nan_as_zero", MX, _map_codes(_nan_zero), "equivalent", "special_nan"),
    Entry("inf_as_nan", FP8, _map_codes(_inf_nan), "broken", "special_inf"),  # NaN where the golden is finite
    Entry("inf_as_nan", MX, _map_codes(_inf_nan), "broken", "special_inf"),  # NaN where the golden overflows
    Entry("inf_amax_zero_scale", FP8, _inf_amax_zero, "broken", "special_inf"),
    Entry("inf_amax_zero_scale", NV, _inf_amax_zero, "broken", "special_inf"),
    Entry("negative_zero", FP8, _map_codes(_pos_zero), "equivalent", "special"),
    Entry("negative_zero", MX, _map_codes(_pos_zero), "equivalent", "special"),
    Entry("negative_zero", NV, _map_codes(_pos_zero), "equivalent", "special_nan"),
    # its codes +-6 decode to 0, as the contract's do: the dequantized values are the golden's
    Entry("zero_scale_block_zeroed", NV, _zeroed_zero_scale_blocks, "equivalent", x=_zero_scale_blocks),
    # denormals
    Entry("subnormal_flush", FP8, _map_codes(_ftz), "degraded", "heavy_tail"),
    Entry("subnormal_flush", MX, _map_codes(_ftz), "degraded", "heavy_tail"),
    Entry("subnormal_flush", NV, _map_codes(_ftz), "degraded"),
    # geometry
    Entry("block_size", NV, _nvfp4_block32, "broken"),
    Entry("block_size", MX, _mx_block64, "broken", orientation="rowwise"),
    Entry("block_axis", MX, _mx_colwise_rowblocks, "broken"),
    Entry("block_axis", NV, _nv_colwise_rowblocks, "broken"),
    # global amax, RHT, SR
    Entry("global_amax_shared", NV_RHT, _nvfp4_with(amax_of=lambda x2d, src: scaling.amax(x2d).reshape(1)),
          "degraded", dtypes=BF16),
    # decoded with the stored A_g the values are off by A_g / 2688: the signal is lost
    Entry("global_amax_missing", NV, _nvfp4_with(s_enc_of=lambda a_g: torch.ones_like(a_g)), "broken"),
    Entry("rht_missing", NV_RHT, _nvfp4_with(rht_src=lambda x2d, cfg, o: x2d if o == "rowwise" else x2d.t(),
                                             amax_of=lambda x2d, src: scaling.amax(x2d).reshape(1)),
          "broken", dtypes=BF16),  # against the Hadamard-domain truth the copy is noise
    # other random bytes: another draw, whose SQNR moves by ~0.1 dB either way (more than the 0.01 dB bound)
    # Other SR bits move the SQNR by ~0.1 dB either way: with this seed's draws (the 16-element groups of §5.7)
    # the candidate is as accurate as the golden, so `equivalent`; another seed may make it `degraded`.
    Entry("sr_bit_assignment", NV_SR, _sr_bytes_reversed, "equivalent"),
    Entry("sr_bit_assignment", NV_SR, _sr_x0_only, "equivalent"),
    Entry("sr_bit_assignment", NV_RHT_SR, _sr_bytes_reversed, "degraded", dtypes=BF16),
    Entry("sr_missing", NV_SR, _sr_off, "equivalent", dtypes=BF16),  # round to nearest: more accurate
    # layout
    Entry("layout_untransposed", FP8, _untransposed, "broken"),
    Entry("layout_untransposed", MX, _untransposed_codes, "broken"),
    Entry("layout_untransposed", NV, _untransposed_codes, "broken"),
    Entry("layout_transposed", MX, _transposed_scales, "broken", orientation="rowwise"),
    Entry("layout_transposed", FP8, _transposed_data, "broken", orientation="rowwise"),
    Entry("layout_transposed", NV, _transposed_data, "broken", orientation="rowwise", shape=(64, 128)),
    Entry("scales_swizzled", NV, _swizzled, "broken"),
    Entry("scales_swizzled", MX, _swizzled, "broken"),
    Entry("nibble_order", NV, _nibbles, "broken", orientation="rowwise"),
    Entry("scale_padding_missing", MX, _unpadded, "broken", shape=(64, 96)),  # K/32 = 3 entries, padded to 4
    Entry("scale_padding_missing", NV, _unpadded, "broken", shape=(64, 96)),  # K/16 = 6 entries, padded to 8
    Entry("padding", NV, _dirty_padding, "equivalent", orientation="rowwise"),  # the values are the golden's
    Entry("padding", MX, _dirty_padding, "equivalent", orientation="rowwise"),
)


def _id(e: Entry) -> str:
    return f"{e.cause}-{e.config.id}-{e.dist}"


def _run(e: Entry, dtype: str):
    case = Case("quantize", e.config, e.shape, dtype, e.dist, e.seed, e.orientation)
    inputs = None
    if e.x is not None:
        inputs = {"x": e.x(dtype, e.shape)}
        if e.config.stochastic:
            inputs["rng"] = (e.seed, 0)
    return runner.run_case(case, Zoo(f"zoo_{e.cause}", e.bug), "cpu", inputs=inputs)


def _named(rows, cause: str) -> list[dict]:
    """The failing conformance rows whose examples name `cause` (with its explanation) and whose reason says so."""
    out = []
    for r in rows:
        if r.get("kind") != "conformance" or r.get("status") != "fail":
            continue
        for entry in (r.get("mismatch_examples") or {}).values():
            if isinstance(entry, dict) and entry.get("cause") == cause:
                assert entry["explanation"] == causes.BY_ID[cause].explanation
                assert f"cause: {cause} explains" in r["reason"] or f"; {cause} explains" in r["reason"], r["reason"]
                out.append(r)
    return out


@pytest.mark.parametrize("entry", ZOO, ids=_id)
def test_each_injected_cause_is_named_with_its_severity_on_f32_and_bf16(entry):
    sev = {}
    for dt in entry.dtypes:
        rows = _run(entry, dt)
        assert not any(r["status"] == "error" for r in rows), [r["reason"] for r in rows if r["status"] == "error"]
        named = _named(rows, entry.cause)
        assert named, (dt, [(r["tensor"], r.get("mismatch_classes"), r.get("reason")) for r in rows
                            if r.get("status") == "fail"])
        sev[dt] = rows[0]["severity"]
    assert set(sev.values()) == {entry.severity}, sev  # the same severity on every input dtype (§11)


def test_the_zoo_covers_every_cause_of_the_modelled_schemes():
    """Every (cause, scheme) of the catalogue has a zoo entry, except where the scheme's contract makes the bug
    invisible (each with its reason)."""
    have = {(e.cause, e.config.scheme) for e in ZOO}
    invisible = {
        # Per-tensor current scaling never overflows (s = 448 / amax); an Inf input saturated is inf_as_nan's.
        ("no_saturation", "fp8_current"),
    }
    missing = [(c.id, s) for c in causes.CATALOGUE for s in c.schemes if (c.id, s) not in have | invisible]
    assert not missing, missing


def test_the_catalogue_section_of_numerics_md_is_the_table():
    text = (Path(__file__).resolve().parents[2] / "docs" / "numerics.md").read_text()
    assert causes.markdown_table() in text
    assert re.search(r"^## §13 Cause catalogue$", text, re.M)


def test_the_model_reproduces_the_golden_on_every_modelled_config():
    """harness.causes.model with no deviation gives reference.quantize's bytes (the precondition for naming any
    cause), both copies, special inputs included."""
    for cfg in (FP8, E5, Q("fp8_current", pow2_scales=True), MX, MX_FLOOR_E5, Q("mxfp8", tile=(32, 32)), NV,
                Q("nvfp4", tile=(16, 16)), NV_RHT, NV_SR, NV_RHT_SR):
        for dist in ("normal", "special", "ties"):
            case = Case("quantize", cfg, SHAPE, "bfloat16", dist, 0, "both")
            inp = generate(case)
            g = reference.quantize(inp["x"], cfg, rowwise=True, colwise=True, rng=inp.get("rng"))
            for o in ("rowwise", "colwise"):
                m = causes.model(inp["x"], cfg, o, hp_dtype="bfloat16", rng=inp.get("rng"))
                assert torch.equal(_codes(g, o), m.data), (cfg.id, dist, o)
                assert torch.equal(causes._keys(getattr(g, f"{o}_scale")), causes._keys(m.scale)), (cfg.id, dist, o)


def test_a_single_deviating_element_keeps_its_symptom_class():
    """One flipped tie fits several causes (ties away, away from zero): MIN_EXPLAINED keeps it a tie_flip."""
    x = torch.zeros(32, 32)
    x[0, 0], x[0, 1] = 448.0, 232.0
    g = reference.quantize(x, MX)
    cand = dataclasses.replace(g, rowwise_data=g.rowwise_data.clone())
    cand.rowwise_data[0, 1] = 0x77
    from harness.compare import compare_quantized

    tr = {t.tensor: t for t in compare_quantized(g, cand, x)}["rowwise_data"]
    assert tr.mismatch_classes == {"tie_flip": 1}


def test_two_bugs_in_one_kernel_are_both_named():
    """Truncation and a flush of subnormal codes: the search composes the two causes."""
    case = Case("quantize", FP8, SHAPE, "float32", "special", 0, "rowwise")

    def bug(x2d, cfg, g, rng):
        g = _rounding("rtz")(x2d, cfg, g, rng)
        return _map_codes(_ftz)(x2d, cfg, g, rng)

    rows = runner.run_case(case, Zoo("two", bug), "cpu")
    data = next(r for r in rows if r["tensor"] == "rowwise_data")
    assert {"round_toward_zero", "subnormal_flush"} <= set(data["mismatch_classes"]), data["mismatch_classes"]
    assert "mismatches unexplained" in data["reason"]


# ---- severities that used to be wrong (issue #39 item 2) -------------------------------------------------


def _nv_inf_case(dtype="bfloat16"):
    return Case("quantize", NV, SHAPE, dtype, "special_inf", 0, "rowwise")


def test_an_inf_input_makes_the_nvfp4_golden_infinite_so_it_is_graded_against_the_truth():
    """docs/numerics.md §11: with A_g = +inf, §5.8's decode is inf everywhere; graded_dequantize decodes with
    S_dec = 1 instead, so all-NaN scales and a zeroed copy are broken, never equivalent with delta 0."""
    case = _nv_inf_case()
    x = generate(case)["x"]
    g = reference.quantize(x, NV)
    assert float(g.rowwise_amax) == math.inf
    assert not bool(torch.isfinite(reference.dequantize(g, "rowwise")).any())  # the contract decode: all inf/NaN
    assert bool(torch.isfinite(verdict.graded_dequantize(g, "rowwise")).all())

    def nan_scales(x2d, cfg, q, rng):
        s = q.rowwise_scale.clone()
        s[:] = E4M3.nan_code
        return dataclasses.replace(q, rowwise_scale=s)

    def zeroed(x2d, cfg, q, rng):
        return dataclasses.replace(q, rowwise_data=torch.zeros_like(q.rowwise_data))

    for bug in (nan_scales, zeroed):
        rows = runner.run_case(case, Zoo(bug.__name__, bug), "cpu")
        assert rows[0]["severity"] == "broken", (bug.__name__, [r.get("reason") for r in rows])
        acc = next(r for r in rows if r["tensor"] == "accuracy_rowwise")
        assert acc["delta_sqnr_db"] != 0.0


def test_more_accurate_than_a_zero_golden_scale_is_not_degraded():
    """An NVFP4 block whose golden scale underflows to 0 (docs/numerics.md §5.2: every code decodes to 0): a
    candidate that keeps it with the smallest subnormal scale is not within one code step (the golden's step is
    0) but more accurate, so equivalent (§11)."""
    x = torch.zeros(16, 32)
    x[0, 0] = 1e6  # A_g: S_enc = 2688e-6
    x[1, :16] = torch.linspace(0.2, 0.4, 16)  # block (1, 0): d = A_b * S_enc / 6 = 1.8e-4 < 2^-10 -> s_blk 0
    g = reference.quantize(x, NV)
    assert int(g.rowwise_scale[1, 0]) == 0

    def keep(x2d, cfg, q, rng):
        s = q.rowwise_scale.clone()
        s[1, 0] = 0x01  # E4M3 2^-9
        f = nvfp4.encode_factor(s[1, 0].reshape(1), nvfp4.global_scale(q.rowwise_amax.reshape(1))[1])
        codes = casts.unpack_nibbles(q.rowwise_data)
        codes[1, :16] = nvfp4.e2m1_rn(x2d[1, :16].to(torch.float32) * f)
        return dataclasses.replace(q, rowwise_scale=s, rowwise_data=casts.pack_nibbles(codes))

    case = Case("quantize", NV, (16, 32), "float32", "normal", 0, "rowwise")
    cand = keep(x, NV, g, None)
    step = verdict.code_step(g, "rowwise")
    assert not verdict.within_one_step(verdict.graded_dequantize(g, "rowwise"),
                                       verdict.graded_dequantize(cand, "rowwise"), step)  # the old rule: degraded
    rows = runner.run_case(case, Zoo("keep", keep), "cpu", inputs={"x": x})
    acc = next(r for r in rows if r["tensor"] == "accuracy_rowwise")
    assert acc["delta_sqnr_db"] > 0
    assert rows[0]["severity"] == "equivalent"


def test_a_drop_of_more_than_twenty_db_is_broken_and_a_zeroed_copy_too():
    """docs/numerics.md §11: a 108 dB candidate against a lossless golden is degraded (-32 dB, far above what E4M3
    resolves); one at the format's own noise level on that input (a drop of over 100 dB) is broken; so is 0 dB."""
    rows_ok = [{"kind": "accuracy", "tensor": "accuracy_rowwise", "element": "e4m3", "sqnr_db": 108.0,
                "delta_sqnr_db": verdict.delta_db(108.0, math.inf)}]
    assert not verdict.accuracy_broken(rows_ok)
    rows_bad = [dict(rows_ok[0], sqnr_db=28.0, delta_sqnr_db=verdict.delta_db(28.0, math.inf))]
    assert verdict.delta_db(28.0, math.inf) == -112.0 and verdict.accuracy_broken(rows_bad)
    rows_zero = [dict(rows_ok[0], sqnr_db=0.0, delta_sqnr_db=-19.0)]
    assert verdict.accuracy_broken(rows_zero)
    assert round(verdict.nominal_db("e4m3"), 1) == 28.9 and round(verdict.nominal_db("e2m1"), 1) == 16.8

    def zero(x2d, cfg, q, rng):
        return dataclasses.replace(q, rowwise_data=torch.zeros_like(q.rowwise_data))

    rows = runner.run_case(Case("quantize", FP8, SHAPE, "float32", "exhaustive", 0, "rowwise"), Zoo("z", zero), "cpu")
    assert rows[0]["severity"] == "broken"
