"""The cause catalogue: why a quantizer's bytes differ from the golden's, named from the bytes and the inputs.

Source: docs/numerics.md §13 (the catalogue, generated from `CATALOGUE` below: one source of truth), §11
(severities), §0.5 / §1 / §3 / §5 (the contract each cause deviates from). `harness.compare` calls
`attribute` for every copy that fails; the elements a cause explains get its `cls` as their mismatch class
(reports/README.md), and the row's examples carry its explanation.

How a cause is identified. Most causes are a *deviation* of the contract: `Knobs` switches one step of a small
re-implementation of the golden (`model`, for fp8_current, mxfp8 and nvfp4 with the `te` convention and no
NVFP4 variant) from the contract's rule to the deviant one. `model(knobs=Knobs())` gives the golden's bytes
exactly (checked before any cause is tried: where it does not, no cause is named). For each failing copy every
applicable variant is re-run on the same input, and a variant *explains* a mismatching element (data code,
scale entry, amax) where the candidate equals the variant's output. A variant is accepted when it explains at
least one element and the candidate agrees with it on at least `ACCEPT_FRACTION` of the elements the variant
changes (so a single flipped tie is not called "ties away from zero": that variant changes every tie). The best
accepted variant (most elements explained; ties in catalogue order) is kept and the search repeats on top of
it, up to `MAX_CAUSES`, so two bugs in one kernel are both named. The layout causes are direct byte tests of
`harness.compare` (a transposed, untransposed, swizzled or nibble-swapped copy, scales without their padding).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from reference import casts, fp32, hadamard, philox, stochastic
from reference.formats import E2M1, E4M3, FLT_MAX, UE8M0, QuantConfig, ScalarFormat

# A variant is accepted when the candidate agrees with it on at least this fraction of the elements it changes.
ACCEPT_FRACTION = 0.5
MAX_CAUSES = 3  # causes composed per copy
# A cause must explain at least this many elements: one element (a single flipped tie, one NaN) fits several
# causes equally, and its symptom class (tie_flip, nonfinite_policy, ...) says more. One fp32 value (a per-tensor
# scale, an amax) reproduced bit for bit is evidence enough.
MIN_EXPLAINED = 2
# Above this many input elements a copy's causes are selected on a band of its rows (CROP_ROWS) and only the
# accepted composition is re-run on the whole copy for the counts.
FULL_SEARCH_ELEMENTS = 1 << 18
CROP_ROWS = 256
MODELLED_SCHEMES = ("fp8_current", "mxfp8", "nvfp4")
_IN_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ----------------------------------------------------------------------------------------------
# The deviations a model re-run can take
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Knobs:
    """One setting per contract step; the defaults are the contract (docs/numerics.md §0-§5)."""

    rounding: str = "rne"  # element cast: rne | rtz (toward zero) | away (away from zero) | half_away (ties away)
    product: str = "fp32"  # the scaled value x*f rounded once more to: fp32 (no) | bfloat16 | float16 | input
    clamp: str = "sat"  # overflow: sat (to +-max) | none (NaN code, E5M2 Inf) | inf (E5M2 Inf code)
    nan_code: str = "canonical"  # NaN element: canonical (0x7F, E2M1 0x7) | signed (sign kept) | zero
    inf_input: str = "saturate"  # +-Inf element: saturate | nan (0x7F) | nan_signed (0x7F / 0xFF)
    zero_sign: str = "keep"  # keep | positive (every zero code +0) | positive_exact (only exact +-0.0 inputs)
    ftz_out: bool = False  # subnormal element codes written as zero
    daz_in: bool = False  # subnormal inputs read as zero
    amax: str = "ignore_nan"  # ignore_nan | propagate (stored amax NaN, scale special-cased) | propagate_scale
    inf_amax: str = "one"  # scale of an Inf amax: one (contract) | zero (fp8_max / inf, unguarded)
    # per-tensor scale (fp8_current) and NVFP4's global scale
    scale_op: str = "div"  # div (RN(c / A)) | recip_mul (RN(c * RN(1 / A)))
    scale_precision: str = "fp32"  # fp32 | input: every scale step rounded to the input dtype too
    sinv_precision: str = "fp32"  # fp32 | input: the stored decode scale rounded to the input dtype
    scale_store: str = "decode"  # decode (sinv, D(e)) | encode (s, P(e)): the scale stored instead of its inverse
    encode_op: str = "mul"  # mul (x * s) | div (x / sinv) | nvfp4: f = RN(S_enc / s_blk)
    scale_ulp: int = 0  # fp8_current: s moved this many fp32 ulps
    scale_exp: int = 0  # fp8_current: s * 2^k; mxfp8: e + k; nvfp4: s_blk code + k
    # mxfp8
    e8m0_rule: str = ""  # "" (the config's) | ceil | floor | even | ceil_log2
    zero_block_factor: float = 0.0  # 0 (contract P(0) = 2^127) | the factor an e = 0 block is multiplied by
    # nvfp4
    block_order: str = "contract"  # contract: RN(A_b * RN(S_enc * fl(1/6))) | div6: RN(RN(A_b / 6) * S_enc)
    block_round: str = "rne"  # E4M3 block scale: rne | rtz (rounded down) | away (rounded up)
    zero_block: str = "contract"  # contract (s_blk = 0: f = FLT_MAX, codes saturate to +-6) | zeroed (codes 0)
    global_amax: str = "contract"  # contract | shared (the RHT copy uses amax(X)) | none (S_enc = 1)
    rht: str = "contract"  # contract | missing (the RHT copy quantizes X^T)
    sr_bits: str = "contract"  # contract | byte_reversed | streams_swapped | per_element | x0_only | x_index | off
    block: int = 0  # block length (0: the config's)


class NotModelled(Exception):
    """The model has no rule for this config, copy or variant."""


def modelled(cfg: QuantConfig) -> bool:
    """Whether `model` reproduces the golden of `cfg` (the te convention, no NVFP4 variant)."""
    return cfg.scheme in MODELLED_SCHEMES and cfg.convention == "te" and cfg.variant is None


# ----------------------------------------------------------------------------------------------
# The element cast with its deviations (docs/numerics.md §0.5)
# ----------------------------------------------------------------------------------------------


def _round_to(t: torch.Tensor, precision: str, hp_dtype: str) -> torch.Tensor:
    """t (fp32) rounded to `precision` (fp32: unchanged; input: the input dtype) and widened back."""
    name = hp_dtype if precision == "input" else precision
    if name == "fp32" or name == "float32":
        return t
    return t.to(_IN_DTYPES[name]).to(torch.float32)


def cast(y: torch.Tensor, fmt: ScalarFormat, kn: Knobs, rounding: str | None = None) -> torch.Tensor:
    """Codes (uint8) of fp32 `y` in `fmt`: docs/numerics.md §0.5 with the deviations of `kn`.

    With the defaults this is sat_e4m3 / sat_e5m2 / e2m1_rn exactly (RNE on the format's grid, saturate,
    NaN to the canonical code, the sign bit copied). Exact fp32 arithmetic on the magnitude's grid position."""
    rounding = rounding or kn.rounding
    y = y.to(torch.float32)
    a = y.abs()
    nan, inf = torch.isnan(a), torch.isinf(a)
    pos = torch.isfinite(a) & (a > 0)
    # fp32 is exact here: a / q and its floor for a power-of-two q, once a is capped at twice the max (anything
    # above the max saturates, or overflows, alike)
    safe = torch.where(pos, torch.clamp(a, max=2 * fmt.max_finite), torch.ones_like(a))
    _, e = torch.frexp(safe)
    e = torch.clamp(e.to(torch.int64) - 1, min=fmt.emin)
    q = torch.ldexp(torch.ones_like(safe), (e - fmt.man_bits).to(torch.int32))
    ratio = safe / q
    k = torch.floor(ratio)
    frac = ratio - k
    if rounding == "rne":
        up = (frac > 0.5) | ((frac == 0.5) & (torch.remainder(k, 2) == 1))
    elif rounding == "rtz":
        up = torch.zeros_like(pos)
    elif rounding == "away":
        up = frac > 0
    elif rounding == "half_away":
        up = frac >= 0.5
    else:
        raise NotModelled(f"rounding={rounding}")
    # The code of k' * 2^(e - man) is ((e + bias - 1) << man) + k' (subnormals: e = emin, code k'; a carry into
    # the next binade adds up correctly), saturated at max_code.
    kk = torch.where(up, k + 1, k).to(torch.int64)
    code = torch.where(pos, ((e + (fmt.bias - 1)) << fmt.man_bits) + kk, torch.zeros_like(kk))
    over = code > fmt.max_code
    code = torch.where(over | inf, torch.full_like(code, fmt.max_code), code)
    sign = torch.signbit(y)
    if kn.zero_sign == "positive":
        sign = sign & (code != 0)
    elif kn.zero_sign == "positive_exact":
        sign = sign & (y != 0)
    if kn.ftz_out:
        code = torch.where((code >> fmt.man_bits) == 0, torch.zeros_like(code), code)
    special_code = fmt.inf_code if fmt.inf_code is not None else fmt.nan_code
    if special_code is not None and fmt.bits == 8:
        if kn.clamp == "none":
            code = torch.where(over | inf, torch.full_like(code, special_code), code)
        elif kn.clamp == "inf" and fmt.inf_code is not None:
            code = torch.where(over | inf, torch.full_like(code, fmt.inf_code), code)
    code = code | (sign.to(torch.int64) << (fmt.bits - 1))
    if kn.inf_input in ("nan", "nan_signed") and fmt.nan_code is not None:
        inf_nan = torch.full_like(code, fmt.nan_code)
        if kn.inf_input == "nan_signed":
            inf_nan = inf_nan | (sign.to(torch.int64) << (fmt.bits - 1))
        code = torch.where(inf, inf_nan, code)
    canonical = fmt.nan_code if fmt.nan_code is not None else fmt.max_code
    if kn.nan_code == "signed":
        nan_code = torch.full_like(code, canonical) | (torch.signbit(y).to(torch.int64) << (fmt.bits - 1))
    else:
        nan_code = torch.full_like(code, 0 if kn.nan_code == "zero" else canonical)
    code = torch.where(nan, nan_code, code)
    return code.to(torch.uint8)


def _daz(x: torch.Tensor, hp_dtype: str) -> torch.Tensor:
    """x (fp32) with the input dtype's subnormals read as (signed) zero."""
    tiny = torch.finfo(_IN_DTYPES.get(hp_dtype, torch.float32)).tiny
    return torch.where(x.abs() < tiny, x * 0, x)


def _amax(a: torch.Tensor, kn: Knobs, dim=None) -> torch.Tensor:
    """max |x| (a = |x| fp32): NaN ignored (the contract, §0.1), or propagated."""
    if kn.amax == "ignore_nan":
        a = torch.nan_to_num(a, nan=0.0, posinf=math.inf)
    if a.numel() == 0:
        return torch.zeros((), dtype=torch.float32)
    return a.amax() if dim is None else a.amax(dim=dim)


def _fmin(a: torch.Tensor, b: float, kn: Knobs) -> torch.Tensor:
    """fmin(a, b) (NaN ignored, the contract) or, with a NaN-propagating amax, a NaN-propagating min."""
    bt = fp32.scalar(b, a)
    return torch.minimum(a, bt) if kn.amax == "propagate_scale" else torch.fmin(a, bt)


# ----------------------------------------------------------------------------------------------
# The model: the golden's copy with deviations, in the golden's layout
# ----------------------------------------------------------------------------------------------


@dataclass
class Crop:
    """Rows r0.. of the full input `full` (the model then quantizes only those rows, with the full tensor's amax)."""

    full: torch.Tensor
    r0: int
    cache: dict = field(default_factory=dict)

    def amax(self, key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


@dataclass
class Copy:
    """One copy as the comparison sees it: codes (unpacked, the golden's data layout), the full scale tensor,
    the amax (or None)."""

    data: torch.Tensor
    scale: torch.Tensor
    amax: torch.Tensor | None


def _roundup(n: int, a: int) -> int:
    return -(-n // a) * a


def _fp8_current(x2d: torch.Tensor, cfg: QuantConfig, kn: Knobs, o: str, hp: str, crop: Crop | None) -> Copy:
    fmt = cfg.element_format
    x = x2d.to(torch.float32)
    if kn.daz_in:
        x = _daz(x, hp)

    def full_amax() -> torch.Tensor:
        xf = crop.full.to(torch.float32)
        return _amax((_daz(xf, hp) if kn.daz_in else xf).abs(), kn).reshape(1)

    a = crop.amax((kn.daz_in, kn.amax), full_amax) if crop is not None else _amax(x.abs(), kn).reshape(1)
    # NUMERICS: §1 compute_scale steps 1-6, with the deviations of kn.
    eps = fp32.scalar(cfg.eps, a)
    ae = torch.where(a < eps, eps, a)
    special = (ae == 0) | torch.isinf(ae) | torch.isnan(ae)
    if kn.scale_op == "div":
        s = fp32.div(fmt.max_finite, ae, like=ae)
    else:  # 448 * (1 / A): what `448 / amax` typed in PyTorch computes
        s = fp32.div(1.0, ae, like=ae) * fp32.scalar(fmt.max_finite, ae)
    s = _round_to(s, kn.scale_precision, hp)
    s = torch.where(torch.isinf(s), fp32.scalar(FLT_MAX, s), s)
    if cfg.pow2_scales:
        s = fp32.from_bits(fp32.bits(s) & fp32.bits(fp32.from_bits(0xFF800000)))
    s = torch.where(special, torch.ones_like(s), s)
    if kn.inf_amax == "zero":
        s = torch.where(torch.isinf(ae), torch.zeros_like(s), s)
    if kn.amax == "propagate_scale":
        s = torch.where(torch.isnan(ae), torch.full_like(s, math.nan), s)
    if kn.scale_ulp:
        target = torch.full_like(s, math.inf if kn.scale_ulp > 0 else 0.0)
        for _ in range(abs(kn.scale_ulp)):
            s = torch.nextafter(s, target)
    if kn.scale_exp:
        s = s * fp32.scalar(2.0**kn.scale_exp, s)
    sinv = _round_to(fp32.div(1.0, s, like=s), kn.sinv_precision, hp)
    y = x * s if kn.encode_op == "mul" else torch.div(x, sinv)
    codes = cast(_round_to(y, kn.product, hp), fmt, kn)
    data = codes if o == "rowwise" else codes.t().contiguous()
    return Copy(data, (sinv if kn.scale_store == "decode" else s).clone(), a.clone())


def _e8m0(a: torch.Tensor, blocks: torch.Tensor, cfg: QuantConfig, kn: Knobs, hp: str) -> torch.Tensor:
    """The block exponents (int64) by the rule of kn (or the config's): docs/numerics.md §3, §10.3."""
    from reference import mxfp8  # noqa: PLC0415

    fmt = cfg.element_format
    rule = kn.e8m0_rule or cfg.e8m0_rule
    if rule == "ceil":
        t = a * fp32.scalar(fp32.reciprocal_const(fmt.max_finite), a)
        e = casts.e8m0_up(_round_to(t, kn.scale_precision, hp))
    elif rule == "floor":
        e = casts.e8m0_floor(a, fmt)
    elif rule in ("even", "ceil_log2"):  # torchao's EVEN / CEIL exponent (docs/numerics.md §10.3)
        e, _ = mxfp8._torchao_pow2_blocks(blocks, a, fmt, "ceil" if rule == "ceil_log2" else "even")
    else:
        raise NotModelled(f"e8m0_rule={rule}")
    e = e.to(torch.int64)
    if kn.scale_exp:
        e = torch.where(e == UE8M0.nan_code, e, torch.clamp(e + kn.scale_exp, 0, UE8M0.max_code))
    return e


def _tiles_amax(x: torch.Tensor, b: int, two_d: bool, kn: Knobs) -> torch.Tensor:
    """Per block of b along the rows of x [R, C]: its amax [R, C/b] (2-D: the b x b tile's, on each row)."""
    r, c = x.shape
    if c % b or (two_d and r % b):
        raise NotModelled("shape not a multiple of the block")
    if two_d:
        t = _amax(x.abs().reshape(r // b, b, c // b, b), kn, dim=(1, 3))
        return t.repeat_interleave(b, dim=0)
    return _amax(x.abs().reshape(r, c // b, b), kn, dim=2)


def _mxfp8(x2d: torch.Tensor, cfg: QuantConfig, kn: Knobs, o: str, hp: str) -> Copy:
    fmt = cfg.element_format
    b = kn.block or cfg.block
    src = x2d if o == "rowwise" else x2d.t()
    x = src.to(torch.float32)
    if kn.daz_in:
        x = _daz(x, hp)
    r, c = x.shape
    a = _tiles_amax(x, b, cfg.is_2d, kn)  # (R, C/b)
    blocks = x.reshape(r, c // b, b)
    e = _e8m0(a, blocks, cfg, kn, hp)
    p = casts.e8m0_multiplier(e)  # NUMERICS: §3 P(e) = 2^(127 - e)
    if kn.zero_block_factor:
        p = torch.where(e == 0, fp32.scalar(kn.zero_block_factor, p), p)
    codes = cast(_round_to(blocks * p[..., None], kn.product, hp), fmt, kn).reshape(r, c)
    stored = e if kn.scale_store == "decode" else torch.where(e <= UE8M0.max_code, UE8M0.max_code - e, e)
    m, k = x2d.shape
    if o == "rowwise":
        scale = torch.zeros(_roundup(m, 128), _roundup(k // b, 4), dtype=torch.uint8)
        scale[:m, : k // b] = stored.to(torch.uint8)
        return Copy(codes, scale, None)
    scale = torch.zeros(_roundup(m // b, 4), _roundup(k, 128), dtype=torch.uint8)
    scale[: m // b, :k] = stored.t().to(torch.uint8)
    return Copy(codes.t().contiguous(), scale, None)


def _sr_bytes(o: str, kn: Knobs, rng, m0: int, m1: int, m: int, k: int, blk: int) -> torch.Tensor:
    """The random bytes of rows m0..m1 of X's copy `o` (rowwise [m1 - m0, K], colwise [K, m1 - m0]) of an [M, K]
    input (docs/numerics.md §5.7: index L in the copy's own [M, K] / [K, M] layout), with the bit-assignment
    deviations of kn."""
    from reference.types import SRSeed  # noqa: PLC0415

    seed = SRSeed.coerce(rng)
    if seed is None:
        raise NotModelled("a stochastic copy needs its (seed, stream)")
    other = "colwise" if o == "rowwise" else "rowwise"
    stream = stochastic.copy_stream(seed.stream, other if kn.sr_bits == "streams_swapped" else o)
    if kn.sr_bits in ("per_element", "x0_only"):
        if o == "rowwise":
            ell = torch.arange(m0 * k, m1 * k, dtype=torch.int64).reshape(m1 - m0, k)
        else:
            ell = torch.arange(k, dtype=torch.int64)[:, None] * m + torch.arange(m0, m1, dtype=torch.int64)[None, :]
        if kn.sr_bits == "per_element":  # one counter per element, byte 0 of its x0
            x0 = philox.words_of_groups(ell, seed.seed, stream)[..., 0].reshape(ell.shape)
            return (x0 & 0xFF).to(torch.uint8)
        # x0_only: the rule before issue #44 - one call per 4 elements, byte L mod 4 of x0 only
        x0 = philox.words_of_groups(ell // stochastic.PER_WORD, seed.seed, stream)[..., 0].reshape(ell.shape)
        return ((x0 >> (8 * (ell % stochastic.PER_WORD))) & 0xFF).to(torch.uint8)
    if o == "rowwise" or kn.sr_bits == "x_index":  # x_index: the colwise copy indexed as X [M, K]
        if o == "rowwise" and kn.sr_bits == "x_index":
            raise NotModelled("x_index is a colwise deviation")
        r = stochastic.random_bytes(k, m0, m1, seed.seed, stream)
        r = r if o == "rowwise" else r.t()
    else:
        r = stochastic.random_bytes_blocked(m, k, m0 // blk, m1 // blk, blk, seed.seed, stream)  # (nb, K, blk)
        r = r.permute(1, 0, 2).reshape(k, m1 - m0)
    if kn.sr_bits == "byte_reversed":  # byte 3 - i of its word for element i (words lie along a copy row)
        r = r.contiguous().reshape(-1, stochastic.PER_WORD).flip(-1).reshape(r.shape)
    return r.contiguous()


def _nvfp4(x2d: torch.Tensor, cfg: QuantConfig, kn: Knobs, o: str, hp: str, rng, crop: Crop | None) -> Copy:
    b = kn.block or cfg.block
    m, k = x2d.shape
    x_all = x2d.to(torch.float32)
    if kn.daz_in:
        x_all = _daz(x_all, hp)
    rht = o == "colwise" and cfg.rht and kn.rht == "contract"
    if rht:
        src = hadamard.rht_transposed(x2d).to(torch.float32)  # NUMERICS: §5.6 the bf16 RHT(X^T) [K, M]
    else:
        src = x_all if o == "rowwise" else x_all.t()
    # NUMERICS: §5.1 - A_g = amax(X) shared by the copies, or the post-RHT amax of the RHT copy.
    own = rht and kn.global_amax != "shared"

    def full_amax() -> torch.Tensor:
        xf = crop.full
        t = hadamard.rht_transposed(xf).to(torch.float32) if own else xf.to(torch.float32)
        return _amax((_daz(t, hp) if kn.daz_in and not own else t).abs(), kn).reshape(1)

    if crop is not None:
        a_g = crop.amax(("nvfp4", own, kn.daz_in, kn.amax), full_amax)
    else:
        a_g = _amax((src if own else x_all).abs(), kn).reshape(1)
    if kn.scale_op == "div":
        s_enc = fp32.div(E2M1.max_finite * E4M3.max_finite, a_g, like=a_g)
    else:
        s_enc = fp32.div(1.0, a_g, like=a_g) * fp32.scalar(E2M1.max_finite * E4M3.max_finite, a_g)
    s_enc = _round_to(_fmin(s_enc, FLT_MAX, kn), kn.scale_precision, hp)
    fix = (a_g == 0) | ((s_enc == 0) & ~(torch.isinf(a_g) & (kn.inf_amax == "zero")))
    s_enc = torch.where(fix, torch.ones_like(s_enc), s_enc)
    if kn.global_amax == "none":
        s_enc = torch.ones_like(s_enc)
    s_dec = fp32.div(1.0, s_enc, like=s_enc)
    r, c = src.shape
    a_b = _tiles_amax(src, b, cfg.is_2d, kn)  # (R, C/b)
    # NUMERICS: §5.2 - d = fmin(RN(A_b * RN(S_enc * fl(1/6))), FLT_MAX), s_blk = sat_e4m3(d).
    if kn.block_order == "contract":
        mult = _round_to(s_enc * fp32.scalar(fp32.reciprocal_const(E2M1.max_finite), s_enc), kn.scale_precision, hp)
        d = a_b * mult
    else:
        d = fp32.div(a_b, E2M1.max_finite) * s_enc
    d = _round_to(_fmin(d, FLT_MAX, kn), kn.scale_precision, hp)
    s_blk = cast(d, E4M3, Knobs(), rounding=kn.block_round).to(torch.int64)
    if kn.scale_exp:
        s_blk = torch.where(s_blk == E4M3.nan_code, s_blk, torch.clamp(s_blk + kn.scale_exp, 0, E4M3.max_code))
    sv = casts.decode(s_blk.to(torch.uint8), E4M3)
    # NUMERICS: §5.3 - f = fmin(RN(1 / RN(s_blk * S_dec)), FLT_MAX); s_blk = 0 -> FLT_MAX.
    f = fp32.div(1.0, sv * s_dec, like=sv) if kn.encode_op == "mul" else fp32.div(s_enc, sv, like=sv)
    f = _fmin(f, FLT_MAX, kn)
    f = torch.where(s_blk == 0, fp32.scalar(FLT_MAX, f), f)
    y = _round_to(src.reshape(r, c // b, b) * f[..., None], kn.product, hp).reshape(r, c)
    if cfg.stochastic and kn.sr_bits != "off":
        m0 = crop.r0 if crop is not None else 0
        m_full = crop.full.shape[0] if crop is not None else m
        r8 = _sr_bytes(o, kn, rng, m0, m0 + m, m_full, k, cfg.block)
        codes = stochastic.e2m1_sr(y, r8.to(torch.float32))
    else:
        codes = cast(y, E2M1, kn)
    if kn.zero_block == "zeroed":  # a block whose stored scale is 0 written as +0 codes
        codes = torch.where((s_blk == 0).repeat_interleave(b, 1), torch.zeros_like(codes), codes)
    scale = torch.zeros(_roundup(r, 128), _roundup(c // b, 4), dtype=torch.uint8)
    scale[:r, : c // b] = s_blk.to(torch.uint8)
    return Copy(codes, scale, a_g.clone())


def model(x2d: torch.Tensor, cfg: QuantConfig, orientation: str, knobs: Knobs = Knobs(), *, hp_dtype: str = "float32",
          rng=None, crop: Crop | None = None) -> Copy:
    """Copy `orientation` of `x2d` (CPU) as the golden computes it, with the deviations of `knobs`. With `crop`,
    x2d is rows crop.r0.. of crop.full: the copy of those rows alone (their blocks), with the full tensor's amax
    and SR indices."""
    if not modelled(cfg):
        raise NotModelled(cfg.id)
    if cfg.scheme == "fp8_current":
        return _fp8_current(x2d, cfg, knobs, orientation, hp_dtype, crop)
    if cfg.scheme == "mxfp8":
        return _mxfp8(x2d, cfg, knobs, orientation, hp_dtype)
    return _nvfp4(x2d, cfg, knobs, orientation, hp_dtype, rng, crop)


# ----------------------------------------------------------------------------------------------
# The catalogue (docs/numerics.md §13 is generated from it)
# ----------------------------------------------------------------------------------------------


def _always(cfg: QuantConfig, hp: str) -> bool:
    return True


def _half_input(cfg: QuantConfig, hp: str) -> bool:
    return hp in ("bfloat16", "float16")


def _fp8_element(cfg: QuantConfig, hp: str) -> bool:
    return cfg.element_format.bits == 8


def _e4m3(cfg: QuantConfig, hp: str) -> bool:
    return cfg.element_format.name == "e4m3"


def _e5m2(cfg: QuantConfig, hp: str) -> bool:
    return cfg.element_format.name == "e5m2"


def _deterministic(cfg: QuantConfig, hp: str) -> bool:
    return not cfg.stochastic


def _rht(cfg: QuantConfig, hp: str) -> bool:
    return cfg.rht


def _sr(cfg: QuantConfig, hp: str) -> bool:
    return cfg.stochastic


@dataclass(frozen=True)
class Cause:
    """One row of the catalogue (docs/numerics.md §13)."""

    id: str
    family: str
    schemes: tuple[str, ...]
    test: str  # how it is identified from the bytes and the inputs
    explanation: str  # one line for the kernel author
    variants: tuple[dict, ...] = ()  # Knobs fields of each model re-run (empty: a direct byte test)
    cls: str = ""  # the mismatch class its elements get (default: the id)
    applies: Callable[[QuantConfig, str], bool] = _always  # (config, input dtype) -> whether to try it

    @property
    def mismatch_class(self) -> str:
        return self.cls or self.id


_ALL = MODELLED_SCHEMES
_RERUN = "re-run with "

CATALOGUE: tuple[Cause, ...] = (
    # -- rounding mode
    Cause("round_toward_zero", "rounding", _ALL, _RERUN + "the element cast truncating (round toward zero)",
          "element codes are truncated toward zero instead of rounded to nearest, ties to even",
          ({"rounding": "rtz"},), applies=_deterministic),
    Cause("ties_away_from_zero", "rounding", _ALL, _RERUN + "exact midpoints rounded away from zero",
          "exact midpoints are rounded away from zero (round-half-away) instead of to the even code",
          ({"rounding": "half_away"},), applies=_deterministic),
    Cause("round_away_from_zero", "rounding", _ALL, _RERUN + "the element cast rounding the magnitude up",
          "element codes are rounded away from zero (magnitude up) instead of to nearest even",
          ({"rounding": "away"},), applies=_deterministic),
    # -- scale arithmetic
    Cause("scale_reciprocal_multiply", "scale", ("fp8_current", "nvfp4"),
          _RERUN + "c * RN(1/amax) in place of the true division RN(c/amax)",
          "the scale is c * (1/amax) (reciprocal, then multiply: what `448 / amax` on a tensor computes in eager "
          "PyTorch) instead of the true division c / amax (docs/numerics.md §0.2.2)",
          ({"scale_op": "recip_mul"},)),
    Cause("encode_by_division", "scale", ("fp8_current", "nvfp4"),
          _RERUN + "x / sinv (fp8) or f = S_enc / s_blk (nvfp4) as the encode step",
          "the elements are divided by the decode scale (x / sinv; NVFP4 f = S_enc / s_blk) instead of multiplied "
          "by the contract's encode factor",
          ({"encode_op": "div"},)),
    Cause("scale_in_input_precision", "scale", _ALL, _RERUN + "every scale step rounded to the input dtype",
          "the scale is computed in the input's precision (bf16/fp16, e.g. `448 / amax` on a bf16 amax) instead of "
          "fp32",
          ({"scale_precision": "input"}, {"scale_precision": "input", "sinv_precision": "input"},
           {"scale_precision": "input", "product": "input"},
           {"scale_precision": "input", "sinv_precision": "input", "product": "input"}), applies=_half_input),
    Cause("scale_stored_not_inverse", "scale", ("fp8_current", "mxfp8"),
          _RERUN + "the encode scale (s, P(e)) stored in the scale field",
          "the stored scale is the encode scale s (E8M0: P(e), byte 254 - e) instead of its inverse, the decode "
          "scale sinv = 1/s (D(e))",
          ({"scale_store": "encode"},)),
    Cause("e8m0_floor", "scale", ("mxfp8",), _RERUN + "e = e8m0_floor(amax) (OCP MX)",
          "block exponents are floor(log2 amax) - emax_elem (OCP MX's rule) where the case asks for ceil (TE/cuBLAS)",
          ({"e8m0_rule": "floor"},), applies=lambda cfg, hp: cfg.e8m0_rule != "floor"),
    Cause("e8m0_ceil", "scale", ("mxfp8",), _RERUN + "e = e8m0_up(RN(amax * fl(1/max))) (TE's ceil)",
          "block exponents are rounded up (TE/cuBLAS ceil) where the case asks for the OCP floor rule",
          ({"e8m0_rule": "ceil"},), applies=lambda cfg, hp: cfg.e8m0_rule != "ceil"),
    Cause("e8m0_even", "scale", ("mxfp8",), _RERUN + "torchao's EVEN exponent (amax rounded to the element's mantissa)",
          "block exponents follow torchao's EVEN mode (amax rounded to the element mantissa, then floored)",
          ({"e8m0_rule": "even"},)),
    Cause("e8m0_ceil_log2", "scale", ("mxfp8",), _RERUN + "e = ceil(log2 amax) - emax_elem (torchao CEIL)",
          "block exponents are ceil(log2 amax) - emax_elem (torchao CEIL), one higher than TE's ceil when amax's "
          "significand is in (1, 1.75]",
          ({"e8m0_rule": "ceil_log2"},)),
    Cause("block_scale_rounded_down", "scale", ("nvfp4",), _RERUN + "the E4M3 block scale truncated",
          "the E4M3 block scale s_blk is rounded down (toward zero) instead of to nearest even",
          ({"block_round": "rtz"},)),
    Cause("block_scale_rounded_up", "scale", ("nvfp4",), _RERUN + "the E4M3 block scale rounded up",
          "the E4M3 block scale s_blk is rounded up instead of to nearest even",
          ({"block_round": "away"},)),
    Cause("block_scale_order", "scale", ("nvfp4",), _RERUN + "d = RN(RN(A_b / 6) * S_enc)",
          "the block scale is RN(RN(A_b/6) * S_enc) (4over6's order) instead of RN(A_b * RN(S_enc * fl(1/6))) "
          "(docs/numerics.md §5.2)",
          ({"block_order": "div6"},)),
    Cause("zero_scale_factor", "scale", ("mxfp8",), _RERUN + "an e = 0 block multiplied by 1.0 or 2^126",
          "an E8M0 e = 0 block is multiplied by 1.0 (TE's exp2f_rcp) or 2^126 (a clamped scale) instead of "
          "P(0) = 2^127 (docs/numerics.md §7.29)",
          ({"zero_block_factor": 1.0}, {"zero_block_factor": 2.0**126})),
    Cause("zero_scale_block_zeroed", "scale", ("nvfp4",), _RERUN + "blocks of stored scale 0 written as +0 codes",
          "a block whose E4M3 scale s_blk is 0 is written as +0 codes, where the contract's encode factor is "
          "FLT_MAX and its non-zero values saturate to +-6 (0x7 / 0xF), which decode to 0 (docs/numerics.md §5.3)",
          ({"zero_block": "zeroed"},)),
    Cause("scale_one_step_off", "scale", _ALL, _RERUN + "the scale one fp32 ulp, one exponent or one E4M3 code off",
          "the scale is one step off the contract's (fp32 s one ulp or a factor of 2 away, E8M0 e +-1, E4M3 block "
          "scale one code): a different rounding or order in the scale computation",
          ({"scale_ulp": 1}, {"scale_ulp": -1}, {"scale_exp": 1}, {"scale_exp": -1})),
    Cause("double_rounding", "rounding", _ALL, _RERUN + "x*scale rounded to bf16 or fp16 before the cast",
          "the scaled value x*scale is rounded to bf16/fp16 first and then to the element format (two roundings)",
          ({"product": "bfloat16"}, {"product": "float16"})),
    # -- special values
    Cause("nan_propagated", "special", _ALL, _RERUN + "a NaN-propagating amax",
          "a NaN input propagates through the amax into the scale, making its whole block (or tensor) NaN, where the "
          "contract's amax skips NaN (docs/numerics.md §0.1)",
          ({"amax": "propagate_scale"}, {"amax": "propagate"})),
    Cause("nan_sign", "special", ("fp8_current", "mxfp8"), _RERUN + "NaN codes keeping the input's sign",
          "NaN elements keep their sign (0xFF) where the contract writes 0x7F",
          ({"nan_code": "signed"},), applies=_fp8_element),
    Cause("nan_as_zero", "special", _ALL, _RERUN + "NaN elements written as code 0",
          "NaN elements are written as zero (TE's Python E2M1 reference, docs/numerics.md §7.7) instead of the NaN "
          "code (E2M1: 0x7)",
          ({"nan_code": "zero"},), applies=_deterministic),
    Cause("inf_as_nan", "special", ("fp8_current", "mxfp8"), _RERUN + "Inf elements written as NaN",
          "Inf inputs become NaN codes instead of saturating to +-max",
          ({"inf_input": "nan"}, {"inf_input": "nan_signed"}), applies=_fp8_element),
    Cause("inf_amax_zero_scale", "special", ("fp8_current", "nvfp4"), _RERUN + "scale = c / inf = 0 for an Inf amax",
          "an Inf amax gives scale 0 (c / inf, unguarded; TE's fused RHT kernel's S_enc, docs/numerics.md §7.8) instead "
          "of 1",
          ({"inf_amax": "zero"},)),
    Cause("negative_zero", "special", _ALL, _RERUN + "zero results written as +0",
          "-0.0 (and negatives that round to zero) are written as +0 (0x00 / E2M1 0x0) where the contract keeps "
          "the sign (docs/numerics.md §7.7)",
          ({"zero_sign": "positive"}, {"zero_sign": "positive_exact"}), applies=_deterministic),
    # -- saturation
    Cause("no_saturation", "saturation", ("fp8_current", "mxfp8"), _RERUN + "an unclamped E4M3 cast (overflow to NaN)",
          "E4M3 values above the format max become NaN (an unclamped cast) instead of saturating to +-max",
          ({"clamp": "none"},), applies=_e4m3),
    Cause("inf_instead_of_max", "saturation", ("fp8_current", "mxfp8"), _RERUN + "overflow and Inf to the E5M2 Inf code",
          "overflowing values and Inf inputs are written as E5M2 Inf instead of +-max",
          ({"clamp": "inf"},), applies=_e5m2),
    # -- denormals
    Cause("subnormal_flush", "denormal", _ALL, _RERUN + "subnormal outputs and/or inputs flushed to zero",
          "subnormal values are flushed to zero (FTZ on the element codes, DAZ on the inputs), where the contract "
          "keeps them (docs/numerics.md §0.1, §0.3)",
          ({"ftz_out": True}, {"daz_in": True}, {"ftz_out": True, "daz_in": True})),
    # -- block geometry
    Cause("block_size", "geometry", ("mxfp8", "nvfp4"), _RERUN + "blocks of twice or half the contract's length",
          "blocks have the wrong length (twice or half of the scheme's 32 / 16)",
          ({"block": "double"}, {"block": "half"})),
    Cause("block_axis", "geometry", ("mxfp8", "nvfp4"),
          "direct: the colwise copy equals the rowwise copy (MXFP8) or its transpose (NVFP4)",
          "the columnwise copy was quantized with the rowwise blocks (along K) instead of along M",
          cls="layout_transposition"),
    # -- global amax (NVFP4)
    Cause("global_amax_shared", "global_amax", ("nvfp4",), _RERUN + "the RHT copy scaled by amax(X)",
          "the RHT (columnwise) copy uses the shared pre-RHT amax(X) instead of its own post-RHT amax",
          ({"global_amax": "shared"},), applies=_rht),
    Cause("global_amax_missing", "global_amax", ("nvfp4",), _RERUN + "S_enc = 1 (no global scale)",
          "the global encode scale S_enc = 2688 / A_g is missing (taken as 1): single-level scaling",
          ({"global_amax": "none"},)),
    # -- RHT
    Cause("rht_missing", "rht", ("nvfp4",), _RERUN + "the RHT copy quantizing X^T",
          "the random Hadamard transform is missing: the columnwise copy quantizes X^T instead of RHT(X^T)",
          ({"rht": "missing"},), applies=_rht),
    # -- stochastic rounding
    Cause("sr_bit_assignment", "sr", ("nvfp4",),
          _RERUN + "the random bytes reversed, per element, x0 only, the streams swapped or indexed by X",
          "stochastic-rounding bytes are assigned differently from docs/numerics.md §5.7 (byte order within a "
          "word, one counter per element, only word x0 of a call per 4 elements (the rule before 2026-12), the "
          "copies' streams swapped, or the colwise copy indexed as X)",
          ({"sr_bits": "byte_reversed"}, {"sr_bits": "streams_swapped"}, {"sr_bits": "per_element"},
           {"sr_bits": "x0_only"}, {"sr_bits": "x_index"}), applies=_sr),
    Cause("sr_missing", "sr", ("nvfp4",), _RERUN + "round to nearest in place of SR",
          "stochastic rounding is not applied: the copy rounds to nearest even",
          ({"sr_bits": "off"},), applies=_sr),
    # -- layout (direct byte tests in harness.compare)
    Cause("layout_transposed", "layout", _ALL, "direct: the field equals the golden's transposed or the other copy",
          "the tensor holds the golden's values transposed (or the other orientation's copy): wrong layout",
          cls="layout_transposition"),
    Cause("layout_untransposed", "layout", _ALL,
          "direct: the field's bytes, in order, are the golden's transposed (or the other copy's)",
          "the copy has the right shape but its bytes are in the other orientation's order: a transpose is missing",
          cls="layout_transposition"),
    Cause("scales_swizzled", "layout", ("mxfp8", "nvfp4"), "direct: un-swizzling the scales gives the golden's",
          "block scales are in cuBLASLt's swizzled 128x4 order (docs/numerics.md §3 Layouts) instead of compact",
          cls="layout_transposition"),
    Cause("nibble_order", "layout", ("nvfp4",), "direct: the bytes are the golden's with the two nibbles exchanged",
          "FP4 nibbles are swapped: element 2j sits in the high nibble (docs/numerics.md §5.4 puts it low)",
          cls="layout_transposition"),
    Cause("scale_padding_missing", "layout", ("mxfp8", "nvfp4"),
          "direct: the scale tensor's leading entries, in order, are the golden's valid region",
          "block scales are packed without the padding of their rows (row stride = the valid width, docs/numerics.md "
          "§3 / §5.9)",
          cls="layout_transposition"),
    Cause("padding", "layout", ("mxfp8", "nvfp4"), "direct: the padding differs and the candidate claims zero padding",
          "the scale padding is not zero although the candidate claims to zero-fill it"),
)
BY_ID: dict[str, Cause] = {c.id: c for c in CATALOGUE}
CLASSES = tuple(dict.fromkeys(c.mismatch_class for c in CATALOGUE))  # the mismatch classes causes give


def explanation(cause_id: str) -> str:
    c = BY_ID.get(cause_id)
    return c.explanation if c else ""


def _knobs(cfg: QuantConfig, variant: dict) -> Knobs | None:
    """The Knobs of a catalogue variant for `cfg` ("double" / "half" block lengths resolved); None if void."""
    v = dict(variant)
    if v.get("block") in ("double", "half"):
        b = cfg.block or 0
        v["block"] = b * 2 if v["block"] == "double" else b // 2
        if v["block"] < 2:
            return None
    return Knobs(**v)


def candidates(cfg: QuantConfig, hp_dtype: str) -> list[tuple[Cause, Knobs]]:
    """(cause, knobs) of every model variant that applies to `cfg` and the input dtype, in catalogue order."""
    if not modelled(cfg):
        return []
    out = []
    for c in CATALOGUE:
        if cfg.scheme not in c.schemes or not c.variants or not c.applies(cfg, hp_dtype):
            continue
        for v in c.variants:
            kn = _knobs(cfg, v)
            if kn is not None:
                out.append((c, kn))
    return out


# ----------------------------------------------------------------------------------------------
# Attribution: which mismatching elements each cause explains
# ----------------------------------------------------------------------------------------------


@dataclass
class Field:
    """One compared field of a copy: the golden's and the candidate's values as comparable keys."""

    name: str
    golden: torch.Tensor  # int64 keys in the compared region
    candidate: torch.Tensor | None  # None: the candidate's field has another shape
    cand_full: torch.Tensor | None  # the candidate's whole field (keys), for a shape mismatch
    mism: torch.Tensor  # bool, where the candidate differs (all True when shapes differ)
    decisive: bool = False  # an fp32 value (per-tensor scale, amax): one bit-exact match names a cause


@dataclass
class Attribution:
    """Per field: the catalogue index of the cause each compared element is explained by (-1: none), or a
    whole-field cause for a field of another shape; and the causes accepted, in order."""

    index: dict[str, torch.Tensor] = field(default_factory=dict)
    whole: dict[str, str] = field(default_factory=dict)
    accepted: list[str] = field(default_factory=list)


def _keys(t: torch.Tensor) -> torch.Tensor:
    """Comparable keys: fp32 bits (int32) with every NaN one key; integer codes as they are (uint8)."""
    if t.is_floating_point():
        t = t.to(torch.float32)
        k = fp32.bits(t)
        return torch.where(torch.isnan(t), torch.full_like(k, 0x7FC00000), k)
    return t


def _fields(golden, candidate, orientation: str, valid: tuple[int, ...], codes) -> list[Field]:
    out = []
    for kind in ("data", "scale", "amax"):
        name = f"{orientation}_{kind}"
        g, c = getattr(golden, name), getattr(candidate, name)
        if g is None or c is None:
            continue
        g, c = g.to("cpu"), c.to("cpu")
        if kind == "data":
            g, c = codes(g), codes(c)
        elif kind == "scale":
            sl = tuple(slice(0, v) for v in valid)
            g = g[sl]
            c = c[sl] if c.dim() == g.dim() and all(cs >= v for cs, v in zip(c.shape, valid, strict=False)) else c
        else:
            g, c = g.reshape(-1), c.reshape(-1)
        gk, ck = _keys(g), _keys(c)
        decisive = g.is_floating_point() and g.numel() <= 1
        if ck.shape == gk.shape:
            out.append(Field(name, gk, ck, None, gk != ck, decisive))
        else:
            out.append(Field(name, gk, None, ck, torch.ones(gk.shape, dtype=torch.bool), decisive))
    return out


def _model_keys(cp: Copy, flds: list[Field], valid: tuple[int, ...]) -> dict[str, tuple[torch.Tensor | None, torch.Tensor]]:
    """Per field: (the model's keys in the compared region, or None where its shape is not the golden's; the
    model's whole field as keys)."""
    out = {}
    for f in flds:
        kind = f.name.split("_", 1)[1]
        t = {"data": cp.data, "scale": cp.scale, "amax": cp.amax}[kind]
        if t is None:
            out[f.name] = (None, torch.empty(0, dtype=torch.int64))
            continue
        full = _keys(t.reshape(-1) if kind == "amax" else t)
        region = full
        if kind == "scale":
            if full.dim() == len(valid) and all(s >= v for s, v in zip(full.shape, valid, strict=False)):
                region = full[tuple(slice(0, v) for v in valid)]
            else:
                region = None
        out[f.name] = (region if region is not None and region.shape == f.golden.shape else None, full)
    return out


def _explained(flds: list[Field], mk: dict) -> tuple[dict[str, torch.Tensor], dict[str, bool]]:
    """Per field: mismatching elements where the candidate equals the model; whole fields it equals."""
    per, whole = {}, {}
    for f in flds:
        region, full = mk[f.name]
        if f.candidate is None:
            whole[f.name] = f.cand_full is not None and full.shape == f.cand_full.shape and torch.equal(full, f.cand_full)
            per[f.name] = torch.full(f.golden.shape, whole[f.name], dtype=torch.bool)
        elif region is None:
            per[f.name] = torch.zeros(f.golden.shape, dtype=torch.bool)
        else:
            per[f.name] = f.mism & (f.candidate == region)
    return per, whole


def _changed(flds: list[Field], mk: dict, base: dict) -> tuple[int, int]:
    """(elements where the model differs from the base model, those where the candidate agrees with it)."""
    changed = agree = 0
    for f in flds:
        r, full = mk[f.name]
        rb, fullb = base[f.name]
        if r is None or rb is None:
            if not (full.shape == fullb.shape and torch.equal(full, fullb)):
                n = f.golden.numel()
                changed += n
                if f.candidate is None and f.cand_full is not None and full.shape == f.cand_full.shape \
                        and torch.equal(full, f.cand_full):
                    agree += n
            continue
        d = r != rb
        changed += int(d.sum())
        if f.candidate is not None:
            agree += int((d & (f.candidate == r)).sum())
    return changed, agree


def _merge(base: Knobs, kn: Knobs) -> Knobs | None:
    """base with kn's non-default fields; None where they set one field differently."""
    default = Knobs()
    out = {}
    for fd in dataclasses.fields(Knobs):
        v, b = getattr(kn, fd.name), getattr(base, fd.name)
        d = getattr(default, fd.name)
        if v != d and b != d and v != b:
            return None
        out[fd.name] = v if v != d else b
    return Knobs(**out)


def _slices(cfg: QuantConfig, name: str, r0: int, r1: int) -> tuple | None:
    """The part of field `name` (data codes or the scale's valid region, in the golden's layout) that rows
    r0..r1 of X make; None for a field of the whole tensor (per-tensor scale, amax)."""
    o, kind = name.split("_", 1)
    if kind == "amax" or (kind == "scale" and cfg.tile is None):
        return None
    b = cfg.block
    rows = slice(r0, r1)
    if kind == "data":
        return (rows, slice(None)) if o == "rowwise" or cfg.scheme == "mxfp8" else (slice(None), rows)
    if o == "rowwise":
        return (rows, slice(None))
    return (slice(r0 // b, r1 // b), slice(None)) if cfg.scheme == "mxfp8" else (slice(None), slice(r0 // b, r1 // b))


def _bands(m: int, k: int) -> list[tuple[int, int]]:
    """Rows r0..r1 of X processed at a time: the whole input up to FULL_SEARCH_ELEMENTS elements, else bands of a
    multiple of 128 rows (whole blocks, tiles and RHT chunks) of about that many elements."""
    if m * k <= FULL_SEARCH_ELEMENTS:
        return [(0, m)]
    rows = max(128, (FULL_SEARCH_ELEMENTS // max(k, 1)) // 128 * 128)
    return [(r0, min(m, r0 + rows)) for r0 in range(0, m, rows)]


def _first_row(flds: list[Field], cfg: QuantConfig) -> int:
    """The row of X behind the first mismatching data element (0 if the data match)."""
    for f in flds:
        if f.name.endswith("_data") and f.candidate is not None and bool(f.mism.any()):
            i, j = (int(t) for t in f.mism.nonzero()[0])
            return i if f.name.startswith("rowwise") or cfg.scheme == "mxfp8" else j
    return 0


def _cropped(flds: list[Field], cfg: QuantConfig, r0: int, r1: int) -> list[Field]:
    out = []
    for f in flds:
        sl = _slices(cfg, f.name, r0, r1)
        if f.candidate is None:
            continue  # a field of another shape is judged whole, on the full copy
        if sl is None:
            out.append(f)
        else:
            out.append(Field(f.name, f.golden[sl], f.candidate[sl], None, f.mism[sl], f.decisive))
    return out


def _search(flds: list[Field], keys_of: Callable[[Knobs], dict | None], cands: list[tuple[Cause, Knobs]]
            ) -> list[tuple[Cause, Knobs]]:
    """The causes accepted, in order, each with the composed Knobs (module docstring)."""
    accepted: list[tuple[Cause, Knobs]] = []
    base_kn = Knobs()
    base = keys_of(base_kn)
    done = {f.name: torch.zeros(f.golden.shape, dtype=torch.bool) for f in flds}
    total = sum(int(f.mism.sum()) for f in flds)
    useful: set[str] | None = None  # after the first round: the causes that explained something alone
    for _ in range(MAX_CAUSES):
        best, explains = None, set()
        for cause, kn in cands:
            if any(cause.id == a.id for a, _ in accepted) or (useful is not None and cause.id not in useful):
                continue
            merged = _merge(base_kn, kn)
            if merged is None or merged == base_kn:
                continue
            mk = keys_of(merged)
            if mk is None:
                continue
            per, _ = _explained(flds, mk)
            gain = sum(int((per[n] & ~done[n]).sum()) for n in per)
            if gain > 0:
                explains.add(cause.id)
            decisive = any(f.decisive and bool((per[f.name] & ~done[f.name]).any()) for f in flds)
            if gain < (1 if accepted or decisive else MIN_EXPLAINED):
                continue
            changed, agree = _changed(flds, mk, base)
            if changed and agree < ACCEPT_FRACTION * changed:
                continue
            key = (gain, agree / changed if changed else 1.0)  # then catalogue order (more specific first)
            if best is None or key > best[0]:
                best = (key, cause, merged, mk, per)
        useful = explains if useful is None else useful
        if best is None:
            break
        _, cause, base_kn, base, per = best
        accepted.append((cause, base_kn))
        for n, hit in per.items():
            done[n] |= hit
        if sum(int(d.sum()) for d in done.values()) >= total:
            break
    return accepted


def attribute(golden, candidate, x2d: torch.Tensor, orientation: str, valid: tuple[int, ...], codes,
              rng=None) -> Attribution | None:
    """Which cause of the catalogue explains each mismatching element of copy `orientation`; None where no cause
    is found or the model cannot reproduce the golden (module docstring). A copy of more than FULL_SEARCH_ELEMENTS
    elements is processed in bands of rows (`_bands`): the causes are searched on the band of the first
    mismatch, then the accepted ones are re-run band by band for the counts (a field of another shape than the
    golden's is then not judged)."""
    cfg, hp = golden.config, golden.hp_dtype
    cands = candidates(cfg, hp)
    if not cands:
        return None
    flds = _fields(golden, candidate, orientation, valid, codes)
    if not any(bool(f.mism.any()) for f in flds):
        return None
    x = x2d.detach().to("cpu")
    m, k = x.shape
    bands = _bands(m, k)
    amax_cache: dict = {}

    def band(r0: int, r1: int) -> tuple[list[Field], Callable[[Knobs], dict | None]]:
        whole = (r0, r1) == (0, m)
        fl = flds if whole else _cropped(flds, cfg, r0, r1)
        vshape = valid if whole else next((tuple(f.golden.shape) for f in fl if f.name.endswith("_scale")), valid)
        crop = None if whole else Crop(x, r0, amax_cache)
        cache: dict[Knobs, dict | None] = {}

        def keys_of(kn: Knobs) -> dict | None:
            if kn not in cache:
                try:
                    cp = model(x[r0:r1], cfg, orientation, kn, hp_dtype=hp, rng=rng, crop=crop)
                    cache[kn] = _model_keys(cp, fl, vshape)
                except NotModelled:
                    cache[kn] = None
            return cache[kn]

        return fl, keys_of

    runs = [band(r0, r1) for r0, r1 in bands]
    first = _first_row(flds, cfg)
    search = next(i for i, (r0, r1) in enumerate(bands) if r0 <= first < r1 or r1 == m)
    fl, keys_of = runs[search]  # the model must give the golden's bytes (on the searched band) to name a cause
    base = keys_of(Knobs())
    if base is None or any(base[f.name][0] is None or not torch.equal(base[f.name][0], f.golden) for f in fl):
        return None
    accepted = _search(*runs[search], cands)
    if not accepted:
        return None
    # Counts on the whole copy: each element goes to the first accepted cause whose composition explains it.
    out = Attribution(index={f.name: torch.full(f.golden.shape, -1, dtype=torch.int8) for f in flds})
    index_of = {c.id: i for i, c in enumerate(CATALOGUE)}
    for (r0, r1), (fl, keys_of) in zip(bands, runs, strict=True):
        done = {f.name: torch.zeros(f.golden.shape, dtype=torch.bool) for f in fl}
        for cause, kn in accepted:
            mk = keys_of(kn)
            if mk is None:
                continue
            per, whole = _explained(fl, mk)
            for n, hit in per.items():
                new = hit & ~done[n]
                sl = _slices(cfg, n, r0, r1) if len(bands) > 1 else None
                view = out.index[n] if sl is None else out.index[n][sl]
                view[new] = index_of[cause.id]
                done[n] |= hit
                if whole.get(n) and n not in out.whole:
                    out.whole[n] = cause.id
    out.accepted = [c.id for c, _ in accepted]
    return out if any(bool((i >= 0).any()) for i in out.index.values()) else None


# ----------------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------------


def annotate(examples: dict, cause_ids: dict[str, str] | None = None) -> dict:
    """`examples` (harness.classify.examples) with each class that a cause gives carrying its `cause` id and
    `explanation`: the class name itself for most causes; `cause_ids` maps a shared class (layout_transposition)
    to the cause found for this tensor."""
    cause_ids = cause_ids or {}
    for cls, entry in examples.items():
        if not isinstance(entry, dict):
            continue
        cid = cause_ids.get(cls) or (cls if cls in BY_ID and BY_ID[cls].mismatch_class == cls else "")
        if cid:
            entry["cause"] = cid
            entry["explanation"] = BY_ID[cid].explanation
    return examples


def cause_note(classes: dict, examples: Any, n_mismatch: int | None) -> str:
    """One sentence for a failing row: each cause with its count, explanation and one example, then how many
    mismatches no cause explains (`other` and the other symptom classes)."""
    if not isinstance(examples, dict):
        return ""
    parts, explained = [], 0
    for cls, entry in examples.items():
        if not isinstance(entry, dict) or not entry.get("cause"):
            continue
        n = int((classes or {}).get(cls, entry.get("count", 0)) or 0)
        explained += n
        ex = ""
        for p in (entry.get("patterns") or {}).values():
            exs = (p or {}).get("examples") or []
            if exs:
                e = exs[0]
                keys = [k for k in ("index", "golden", "candidate", "input", "reason") if k in e]
                ex = " ".join(f"{k}={e[k]}" for k in keys)
                break
        parts.append(f"{entry['cause']} explains {n} ({entry.get('explanation', '')}{'; e.g. ' + ex if ex else ''})")
    if not parts:
        return ""
    total = int(n_mismatch or sum(int(v) for v in (classes or {}).values()))
    rest = max(0, total - explained)
    return "cause: " + "; ".join(parts) + f"; {rest} of {total} mismatches unexplained"


def markdown_table() -> str:
    """The catalogue as the markdown table of docs/numerics.md §13 (tests/unit/test_bug_zoo.py checks it)."""
    lines = ["| id | family | schemes | class | identified by | explanation |", "|---|---|---|---|---|---|"]
    for c in CATALOGUE:
        lines.append(f"| `{c.id}` | {c.family} | {', '.join(c.schemes)} | `{c.mismatch_class}` | {c.test} | "
                     f"{c.explanation} |")
    return "\n".join(lines)
