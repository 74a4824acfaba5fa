"""Comparison of a candidate against the golden reference: exact bytes, located and classified mismatches, metrics.

Source: docs/design.md §5 (quantizers compare bytes exactly; every mismatch located with the input
block and the scale-chain intermediates, and classified; GEMMs against a tolerance or bit for bit
in the exact-representable mode), docs/numerics.md §1-§5 (layouts and scale chains used to locate a
mismatch), §6 (GEMM modes). Scales are compared on their valid region only
(`reference.layouts.scale_valid_shape`); padding is compared separately and is informational
unless the candidate claims to zero-fill it (`candidate.extra["zero_fills_padding"]`).

Mismatch classes, in priority order for one element (the causes `other` used to hide are tested by
`harness.classify`; every class is listed with its count and examples per input pattern in
`TensorResult.examples`):
  nan_sign                both codes are NaN encodings (0x7F vs 0xFF, ...)
  layout_transposition    the whole candidate is the golden in another layout (transposed, the other
                          orientation, FP4 nibbles swapped, block scales in cuBLASLt's swizzled order);
                          `TensorResult.layout` says which
  nonfinite_policy        a NaN/Inf input (or one in the block, with its scale differing), or exactly
                          one side non-finite: NaN/Inf propagated vs ignored/saturated
  scale_floor             (scale tensors) the block amax is zero, or the candidate's decode scale is over
                          four times the golden's: a floor / eps clamp on the scale
  scale_rule              (scale tensors) the candidate's entry is the one another scale rule gives (the
                          other E8M0 rule, or an applicable convention of docs/numerics.md §10)
  block_scale_cascade     the element's scale (or a global scale/amax it depends on) differs too
  scale_off_by_one        (scale tensors) codes one step apart: E8M0/E4M3 ±1, fp32 1 ulp or x2
  subnormal_flush         the candidate is zero where the golden code (or output) is subnormal, or the
                          input is subnormal
  zero_scale_factor       (MXFP8 data) the block's E8M0 scale is e = 0 in both and the candidate's code is
                          the input times 1.0 (TE's exp2f_rcp(0)) or 2^126 (a scale clamped at fp32's
                          smallest normal, torchao FLOOR) where the contract multiplies by P(0) = 2^127
                          (docs/numerics.md §7.29)
  tie_flip                the scaled input is exactly a rounding midpoint and the codes are adjacent
  encode_factor_rounding  the scaled input lies within a few ulps of the midpoint of the two adjacent
                          codes (or the candidate's reported chain puts it off a tie): the candidate's
                          encode factor rounded differently
  decode_factor_rounding  (dequantized outputs) finite and at most 2 ulps of the output dtype apart
  padding                 (scale tensors) padding differs and the candidate claims zero padding
  <cause>                 an element explained by a cause of harness.causes (docs/numerics.md §13): re-running
                          the golden with that deviation gives the candidate's value (outranks the classes above)
  other                   anything else
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from reference import casts, fp32
from reference.formats import FLT_MAX, INPUT_DTYPE_MAX, UE8M0, QuantConfig
from reference.layouts import copy_geometry
from reference.types import QuantizedTensor

from . import causes as causes_mod
from . import classify, tolerance

# The symptom classes (what differs); the causes of harness.causes (why) add theirs, in catalogue order.
_SYMPTOM_CLASSES = (
    "nan_sign",
    "layout_transposition",
    "nonfinite_policy",
    "scale_floor",
    "scale_rule",
    "block_scale_cascade",
    "scale_off_by_one",
    "subnormal_flush",
    "zero_scale_factor",
    "tie_flip",
    "encode_factor_rounding",
    "decode_factor_rounding",
    "padding",
    "other",
)
MISMATCH_CLASSES = (*_SYMPTOM_CLASSES[:-1], *(c for c in causes_mod.CLASSES if c not in _SYMPTOM_CLASSES), "other")
# Encode factors other frameworks use for an E8M0 e = 0 block (the contract's P(0) is 2^127): TE's
# exp2f_rcp(0) = 1.0, and 2^126 from a scale clamped at fp32's smallest normal (torchao FLOOR).
ZERO_SCALE_FACTORS = (1.0, 2.0**126)
IMPLIED = "implied by the contract: recomputed from the candidate's stored scale and amax"
ULP_BUCKETS = ("0", "0*", "1", "2", "3-4", "5-16", "17+", "nan")  # "0*": same value, other bits (±0)
_BLOCK_WINDOW = 32  # input values shown around a mismatch (per-tensor schemes: a window of the row)


@dataclass
class TensorResult:
    """The comparison of one tensor (a QuantizedTensor field, a dequantized or GEMM output)."""

    tensor: str
    status: str  # "pass" | "fail"
    n: int
    n_mismatch: int
    mismatch_classes: dict = field(default_factory=dict)
    first_mismatch: dict | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    rmse: float = 0.0
    sqnr_db: float = math.inf
    ulp_hist: dict = field(default_factory=dict)
    detail: dict = field(default_factory=dict)
    # {class: {"count", "patterns": {pattern: {"count", "examples": [...]}}}} (harness.classify.examples)
    examples: dict = field(default_factory=dict)
    layout: str | None = None  # the candidate's layout where it is not the golden's (classify.layout_finding)

    @property
    def mismatch_frac(self) -> float:
        return self.n_mismatch / self.n if self.n else 0.0

    mismatch_fraction = mismatch_frac


layout_finding = classify.layout_finding  # the API the runner reads: layout_finding(results) -> str | None
class_counts = classify.class_counts  # {tensor: {class: count}}

# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------


def metrics(approx: torch.Tensor, truth: torch.Tensor, *, count_nonfinite: bool = False) -> dict:
    """max_abs, max_rel, rmse, sqnr_db of `approx` against `truth` (fp64), plus counts.

    Computed on truth's device (approx is moved there). Non-finite values never raise: positions
    where either side is NaN/Inf are left out of the error statistics and counted (`n_nonfinite`);
    `n_nonfinite_mismatch` counts those where the two sides disagree (NaN vs number, +Inf vs -Inf,
    ...). max_rel skips truth == 0. sqnr_db = 10 log10(Σ truth² / Σ err²): +inf for zero error,
    -inf for zero signal with non-zero error.

    count_nonfinite (conformance comparisons): a position where the two sides disagree on being
    non-finite is an unbounded error, so then max_abs = max_rel = rmse = +inf and sqnr_db = -inf;
    a failing row never reads max_abs=0, sqnr_db=inf. Accuracy rows (against the truth) keep the
    default, where saturating an Inf input is the contract.
    """
    t = truth.detach().to(torch.float64).reshape(-1)
    a = approx.detach().to(device=t.device, dtype=torch.float64).reshape(-1)
    if a.shape != t.shape:
        raise ValueError(f"metrics: shapes differ ({tuple(approx.shape)} vs {tuple(truth.shape)})")
    fin = torch.isfinite(a) & torch.isfinite(t)
    n_nonfinite = int((~fin).sum())
    out = {"n": int(a.numel()), "n_nonfinite": n_nonfinite, "n_nonfinite_mismatch": 0}
    if n_nonfinite:  # compact only when needed: boolean indexing copies the whole tensor
        same_nonfinite = (torch.isnan(a) & torch.isnan(t)) | (torch.isinf(a) & torch.isinf(t) & (a == t))
        out["n_nonfinite_mismatch"] = int((~fin & ~same_nonfinite).sum())
        a, t = a[fin], t[fin]
    if a.numel() == 0:
        out.update(max_abs=math.nan, max_rel=math.nan, rmse=math.nan, sqnr_db=math.nan)
        return out
    if count_nonfinite and out["n_nonfinite_mismatch"]:
        out.update(max_abs=math.inf, max_rel=math.inf, rmse=math.inf, sqnr_db=-math.inf)
        return out
    err = a - t
    sig = float((t * t).sum())
    noise = float((err * err).sum())
    if noise == 0:
        sqnr = math.inf
    elif sig == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(sig / noise)
    t_abs = t.abs()
    nz = t_abs > 0
    rel = err.abs() / torch.where(nz, t_abs, torch.ones_like(t_abs))
    out.update(
        max_abs=float(err.abs().max()),
        max_rel=float(torch.where(nz, rel, torch.zeros_like(rel)).max()),  # 0 when truth is all zero
        rmse=math.sqrt(noise / a.numel()),
        sqnr_db=sqnr,
    )
    return out


def _bucket(d: torch.Tensor) -> dict:
    """Histogram of non-negative integer distances into ULP_BUCKETS 1..17+."""
    edges = (("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-16", 5, 16), ("17+", 17, None))
    out = {}
    for name, lo, hi in edges:
        m = d >= lo if hi is None else (d >= lo) & (d <= hi)
        out[name] = int(m.sum())
    return out


def ulp_hist_codes(golden: torch.Tensor, candidate: torch.Tensor, fmt) -> dict:
    """Distances in code units (adjacent representable values) for sign-magnitude codes of `fmt`."""
    g = golden.to(torch.int64) & ((1 << fmt.bits) - 1)
    c = candidate.to(torch.int64) & ((1 << fmt.bits) - 1)
    hist = {k: 0 for k in ULP_BUCKETS}
    eq = g == c
    hist["0"] = int(eq.sum())
    nan = (_is_nan_code(g, fmt) | _is_nan_code(c, fmt)) & ~eq
    hist["nan"] = int(nan.sum())
    d = (_ordered_code(g, fmt) - _ordered_code(c, fmt)).abs()
    rest = ~eq & ~nan
    hist["0*"] = int((rest & (d == 0)).sum())
    hist.update(_bucket(d[rest & (d > 0)]))
    return hist


def _ordered_float(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ordered int64, bits) of a float tensor: adjacent values differ by 1, +0 and -0 both 0."""
    ity = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float64: torch.int64}
    bits = x.contiguous().view(ity[x.dtype]).to(torch.int64)
    nbits = x.element_size() * 8
    mag = bits & ((1 << (nbits - 1)) - 1)
    return torch.where(bits < 0, -mag, mag), bits


def ulp_hist_float(golden: torch.Tensor, candidate: torch.Tensor) -> dict:
    """Distances in ULPs of the golden tensor's dtype (candidate cast to it first)."""
    hist = {k: 0 for k in ULP_BUCKETS}
    c = candidate.to(golden.dtype)
    og, bg = _ordered_float(golden)
    oc, bc = _ordered_float(c)
    eq = bg == bc
    hist["0"] = int(eq.sum())
    nan = (torch.isnan(golden) | torch.isnan(c)) & ~eq
    hist["nan"] = int(nan.sum())
    d = (og - oc).abs()
    rest = ~eq & ~nan
    hist["0*"] = int((rest & (d == 0)).sum())
    hist.update(_bucket(d[rest & (d > 0)]))
    return hist


# ----------------------------------------------------------------------------------------------
# Code helpers
# ----------------------------------------------------------------------------------------------


def _is_nan_code(c: torch.Tensor, fmt) -> torch.Tensor:
    if fmt.nan_code is None:
        return torch.zeros_like(c, dtype=torch.bool)
    mag = c & ~fmt.sign_mask if fmt.signed else c
    if fmt.inf_code is not None:  # IEEE-like: exponent all ones, mantissa non-zero
        return mag > fmt.inf_code
    return mag == fmt.nan_code


def _ordered_code(c: torch.Tensor, fmt) -> torch.Tensor:
    if not fmt.signed:
        return c
    mag = c & ~fmt.sign_mask
    return torch.where((c & fmt.sign_mask) != 0, -mag, mag)


def is_midpoint(y: torch.Tensor, fmt) -> torch.Tensor:
    """|y| is exactly halfway between two adjacent finite grid values of `fmt`.

    NUMERICS: §0.5 - the quantum at magnitude a is 2^(max(floor(log2 a), emin) - man_bits); a tie
    is a / quantum = n + 1/2 exactly (float64 arithmetic, exact here). Midpoints past max (464 for
    E4M3) are not ties a candidate could flip: both sides saturate to max.
    """
    a = y.to(torch.float64).abs()
    ok = torch.isfinite(a) & (a > 0)
    safe = torch.where(ok, a, torch.ones_like(a))
    _, e = torch.frexp(safe)
    expo = torch.clamp(e.to(torch.int64) - 1, min=fmt.emin)
    q = torch.ldexp(torch.ones_like(safe), (expo - fmt.man_bits).to(torch.int32))
    r = safe / q
    return ok & (r - torch.floor(r) == 0.5) & (a < fmt.max_finite)


def _scale_format(cfg: QuantConfig):
    """The format of the stored scale bytes (None: fp32 sinv)."""
    return cfg.scheme_row.scale_scalar_format


def _hex(v: int, width: int = 2) -> str:
    return f"0x{int(v) & ((1 << (4 * width)) - 1):0{width}X}"


def _f32_hex(v: torch.Tensor) -> str:
    return _hex(int(fp32.bits(v.reshape(1))[0]), 8)


def _valid_shape(cfg: QuantConfig, orientation: str, m: int, k: int) -> tuple[int, ...]:
    return copy_geometry(cfg, orientation, m, k).scale_valid_shape


# ----------------------------------------------------------------------------------------------
# One copy: its geometry (reference.layouts.CopyGeometry) plus the input it quantized
# ----------------------------------------------------------------------------------------------


class _Copy:
    """Where each stored element of one copy comes from, which scale entry it uses, its block.

    Geometry is `reference.layouts.CopyGeometry` (data coordinates = the stored copy's own
    [rows, cols], FP4 unpacked); this adds the input values behind the copy.
    """

    def __init__(self, cfg: QuantConfig, orientation: str, x2d: torch.Tensor, hp_dtype: str) -> None:
        self.cfg, self.o = cfg, orientation
        self.m, self.k = x2d.shape
        self.hp_dtype = hp_dtype
        self.geom = copy_geometry(cfg, orientation, self.m, self.k)
        self.transposed = self.geom.transposed
        self.rows, self.cols = self.geom.rows, self.geom.cols
        self.x2d = x2d
        self.br, self.bc = self.geom.block
        self.scale_index = self.geom.scale_index
        self.scale_block = self.geom.scale_region
        self.logical = self.geom.logical
        self.block_of = self.geom.block_of

    @functools.cached_property
    def src(self) -> torch.Tensor:
        """The high-precision values this copy quantized, in data coordinates (fp32; computed on
        first use, i.e. only when something differs: with RHT this is the Hadamard transform).
        A scheme module that transforms its input before quantizing exports `copy_source`."""
        copy_source = getattr(self.cfg.scheme_row.reference_module(), "copy_source", None)
        if copy_source is not None:
            return copy_source(self.x2d, self.cfg, self.o).to(torch.float32)
        x = self.x2d.to(torch.float32)
        return x.t() if self.transposed else x

    def input_block(self, src: torch.Tensor, r: int, c: int) -> dict:
        """The input values of the block holding (r, c) (its row segment for 2-D / per-tensor)."""
        if self.cfg.tile is None:
            c0 = max(0, c - _BLOCK_WINDOW // 2)
            seg = src[r, c0 : c0 + _BLOCK_WINDOW]
            return {"rows": [r, r + 1], "cols": [c0, c0 + seg.numel()], "values": seg.tolist()}
        r0, c0 = r // self.br * self.br, c // self.bc * self.bc
        if self.br > 1 and self.bc > 1:
            seg = src[r, c0 : c0 + self.bc]
            return {"rows": [r, r + 1], "cols": [c0, c0 + seg.numel()], "values": seg.tolist(),
                    "note": f"row {r} of the {self.br}x{self.bc} block"}
        blk = src[r0 : r0 + self.br, c0 : c0 + self.bc].reshape(-1)
        return {"rows": [r0, min(r0 + self.br, self.rows)], "cols": [c0, min(c0 + self.bc, self.cols)],
                "values": blk.tolist()}


# ----------------------------------------------------------------------------------------------
# Scale chains (golden: recomputed from the spec; candidate: from its stored values)
# ----------------------------------------------------------------------------------------------


def _block_amax(src: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """NaN-ignoring amax per br x bc block of src [rows, cols] (edge blocks zero-padded)."""
    from reference.scaling import amax  # noqa: PLC0415

    rows, cols = src.shape
    pr, pc = -(-rows // br) * br, -(-cols // bc) * bc
    p = torch.zeros(pr, pc, dtype=torch.float32)
    p[:rows, :cols] = src
    return amax(p.reshape(pr // br, br, pc // bc, bc), dim=(1, 3))  # (rows/br, cols/bc)


def _multiplier(q: QuantizedTensor, cp: _Copy, src: torch.Tensor, r: torch.Tensor, c: torch.Tensor
                ) -> tuple[torch.Tensor, dict]:
    """The encode factor the elements at data positions (r, c) were multiplied by (fp32), and notes."""
    cfg = q.config
    scale = getattr(q, f"{cp.o}_scale").to("cpu")
    notes: dict[str, Any] = {}
    row = cfg.scheme_row
    if row.per_tensor:
        sinv = scale.reshape(-1)[0].to(torch.float32)
        if not row.amax_history:  # current scaling: the scale follows from the stored amax
            from reference.scaling import compute_scale  # noqa: PLC0415

            a = getattr(q, f"{cp.o}_amax").to("cpu").reshape(())
            s, s_inv = compute_scale(a, cfg.element_format.max_finite, pow2=cfg.pow2_scales, eps=cfg.eps, v_inf=FLT_MAX)
            if fp32.bits(s_inv.reshape(1)) != fp32.bits(sinv.reshape(1)):
                s = fp32.div(1.0, sinv.reshape(()))
                notes["multiplier"] = "RN(1/sinv) (stored sinv does not match compute_scale(amax))"
        else:
            s = fp32.div(1.0, sinv.reshape(()))  # NUMERICS: §2 the state scale; exact when a power of two
            notes["multiplier"] = "RN(1/sinv): the delayed-scaling state scale is not stored"
        return s.expand(r.shape), notes
    i, j = cp.scale_index(r, c)
    if _scale_format(cfg) is UE8M0:
        return casts.e8m0_multiplier(scale[i, j]), notes  # NUMERICS: §3 P(e) = 2^(127 - e)
    if row.global_amax:
        mod = row.reference_module()  # two-level scaling: the scheme module owns §5.2-§5.3
        a_g = getattr(q, f"{cp.o}_amax").to("cpu").reshape(-1)
        a_g = a_g[r] if cfg.row_scaled else a_g.reshape(())  # NUMERICS: §5.10 row-scaled: A_g of the row
        s_enc, s_dec = mod.global_scale(a_g, cfg.e4m3_max)
        return mod.encode_factor(scale[i, j], s_dec), notes  # NUMERICS: §5.3
    # fp8_block: s is not stored; recompute it from the block amax (NUMERICS: §4, v_inf = input max).
    from reference.scaling import compute_scale  # noqa: PLC0415

    br, bc = (cfg.block, cfg.block) if cfg.is_2d else (1, cfg.block)
    a = _block_amax(src, br, bc)
    s, _ = compute_scale(a, cfg.element_format.max_finite, pow2=cfg.pow2_scales, eps=cfg.eps,
                         v_inf=INPUT_DTYPE_MAX[cp.hp_dtype])
    return s[r // br, c // bc], notes


def _chain(q: QuantizedTensor, cp: _Copy, r: int, c: int, src: torch.Tensor, golden: bool) -> dict:
    """The scale-chain values behind element (r, c) of a copy."""
    cfg = q.config
    scale = getattr(q, f"{cp.o}_scale")
    amax = getattr(q, f"{cp.o}_amax")
    out: dict[str, Any] = {}
    if amax is not None:
        amax = amax.reshape(-1)[r if cfg.row_scaled else 0].reshape(1)  # NUMERICS: §5.10 the row's A_g
        out["amax"] = float(amax[0])
        out["amax_bits"] = _f32_hex(amax[0].to(torch.float32))
    if scale is None:
        return out
    scale = scale.to("cpu")
    if cfg.tile is None:
        out["sinv"] = float(scale.reshape(-1)[0])
        out["sinv_bits"] = _f32_hex(scale.reshape(-1)[0])
        return out
    i, j = (int(t) for t in cp.scale_index(torch.tensor(r), torch.tensor(c)))
    out["scale_index"] = [i, j]
    if i >= scale.shape[0] or j >= scale.shape[1]:
        out["scale"] = "out of range of the stored scale tensor"
        return out
    v = scale[i, j]
    row = cfg.scheme_row
    if _scale_format(cfg) is UE8M0:
        out.update(e8m0=int(v), decode=float(casts.e8m0_decode(v.reshape(1))[0]),
                   multiplier=float(casts.e8m0_multiplier(v.reshape(1))[0]))
    elif row.global_amax:
        nvfp4 = row.reference_module()  # two-level scaling (docs/numerics.md §5.1-§5.3)
        out.update(s_blk=_hex(int(v)), s_blk_value=float(casts.decode(v.reshape(1), _scale_format(cfg))[0]))
        if amax is not None:
            s_enc, s_dec = nvfp4.global_scale(amax.to("cpu").reshape(()), cfg.e4m3_max)
            out.update(S_enc=float(s_enc), S_dec=float(s_dec),
                       f=float(nvfp4.encode_factor(v.reshape(1), s_dec.reshape(1))[0]))
        if golden:
            try:
                ch = nvfp4.scale_chain(cp.x2d, cfg, cp.o)
                bi, bj = r, c // cfg.block
                out.update(A_g=float(ch["A_g"]), m=float(ch["m"]), A_b=float(ch["A_b"][bi, bj]),
                           d=float(ch["d"][bi, bj]))
            except Exception as e:  # noqa: BLE001 - diagnostics only
                out["scale_chain_error"] = f"{type(e).__name__}: {e}"
    else:
        out.update(sinv=float(v), sinv_bits=_f32_hex(v))
        br, bc = (cfg.block, cfg.block) if cfg.is_2d else (1, cfg.block)
        a = _block_amax(src, br, bc)[r // br, c // bc]
        out["block_amax"] = float(a)
    return out


# ----------------------------------------------------------------------------------------------
# compare_quantized
# ----------------------------------------------------------------------------------------------


def _codes(q: QuantizedTensor, name: str) -> torch.Tensor:
    t = getattr(q, name).to("cpu")
    if 8 // q.config.element_format.bits == 2:
        return casts.unpack_nibbles(t)  # NUMERICS: §5.4 compare each FP4 code on its own
    return t


def _result(tensor: str, n: int, classes: dict, first: dict | None, met: dict, hist: dict, detail: dict,
            examples: dict | None = None, layout: str | None = None) -> TensorResult:
    n_mis = sum(v for k, v in classes.items())
    return TensorResult(
        tensor=tensor,
        status="fail" if n_mis else "pass",
        n=n,
        n_mismatch=n_mis,
        mismatch_classes={k: v for k, v in classes.items() if v},
        first_mismatch=first,
        max_abs=met.get("max_abs", 0.0),
        max_rel=met.get("max_rel", 0.0),
        rmse=met.get("rmse", 0.0),
        sqnr_db=met.get("sqnr_db", math.inf),
        ulp_hist=hist,
        detail=detail,
        examples=examples or {},
        layout=layout,
    )


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality of two tensors of one dtype (NaN payloads included)."""
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def _identical(n: int) -> tuple[dict, dict]:
    """Metrics and ULP histogram of two bit-identical tensors (skips decoding large tensors)."""
    hist = {k: 0 for k in ULP_BUCKETS}
    hist["0"] = n
    return {"max_abs": 0.0, "max_rel": 0.0, "rmse": 0.0, "sqnr_db": math.inf}, hist


def _missing(name: str, why: str, n: int = 0) -> TensorResult:
    return TensorResult(name, "fail", max(n, 1), max(n, 1), {"other": max(n, 1)}, {"field": name, "reason": why},
                        detail={"reason": why})


def _layout_swap(golden: QuantizedTensor, candidate: QuantizedTensor, name: str, cand: torch.Tensor,
                 gold: torch.Tensor) -> str | None:
    """Whether `cand` is the golden tensor transposed or the golden copy of the other orientation."""
    other = name.replace("rowwise", "@").replace("colwise", "rowwise").replace("@", "colwise")
    refs = [("golden transposed", gold.t() if gold.dim() == 2 else None)]
    if getattr(golden, other, None) is not None:
        og = _codes(golden, other) if name.endswith("_data") else getattr(golden, other).to("cpu")
        refs += [(f"golden {other}", og), (f"golden {other} transposed", og.t() if og.dim() == 2 else None)]
    for what, ref in refs:
        if ref is not None and ref.shape == cand.shape and torch.equal(ref, cand):
            if what == "golden transposed" and torch.equal(gold, cand):
                continue
            return what
    return None


def _same_field(golden: QuantizedTensor, candidate: QuantizedTensor, name: str) -> bool:
    """Fast path: the candidate field has the golden's shape, dtype and bytes (compared on the
    golden's device, so a GPU golden and a GPU candidate never leave the GPU)."""
    g, c = getattr(golden, name), getattr(candidate, name)
    return g.shape == c.shape and g.dtype == c.dtype and _same_bits(g, c.to(g.device))


def _whole_cause(att: causes_mod.Attribution | None, name: str) -> str:
    """The cause that explains a field of another shape as a whole ('' if none)."""
    return (att.whole.get(name, "") if att is not None else "") or ""


def _compare_data(golden, candidate, name, cp: _Copy, att: causes_mod.Attribution | None = None) -> TensorResult:
    cfg = golden.config
    fmt = cfg.element_format
    if _same_field(golden, candidate, name):
        n = getattr(golden, name).numel() * cp.geom.codes_per_byte  # FP4: two codes per byte
        return _result(name, n, {}, None, *_identical(n), {})
    g = _codes(golden, name)
    c = _codes(candidate, name)
    n = g.numel()
    if g.shape != c.shape:
        swap = _layout_swap(golden, candidate, name, c, g)
        whole = "" if swap else _whole_cause(att, name)
        cls = "layout_transposition" if swap else (causes_mod.BY_ID[whole].mismatch_class if whole else "other")
        why = f"candidate shape {tuple(c.shape)} != golden {tuple(g.shape)}" + (f" (it equals the {swap})" if swap else "")
        ex = classify.whole(cls, n, "shape", {"reason": why})
        causes_mod.annotate(ex, {cls: _layout_cause(cfg, name, swap)} if swap else ({cls: whole} if whole else None))
        return TensorResult(name, "fail", n, n, {cls: n}, {"field": name, "reason": why}, detail={"reason": why},
                            examples=ex)
    detail = {} if c.dtype == g.dtype else {"dtype": f"candidate {c.dtype} != golden {g.dtype}"}
    if not detail and torch.equal(g, c):
        return _result(name, n, {}, None, *_identical(n), {})
    c = c.to(g.dtype) if detail else c
    mism = g != c
    pos = mism.nonzero()  # (n_mis, 2), row-major order
    n_mis = pos.shape[0]
    rr, cc = pos[:, 0], pos[:, 1]
    gm, cm = g[rr, cc].to(torch.int64), c[rr, cc].to(torch.int64)  # only the mismatching codes
    met = metrics(casts.decode(c, fmt), casts.decode(g, fmt), count_nonfinite=True)
    hist = ulp_hist_codes(gm, cm, fmt)
    hist["0"] += n - n_mis
    swap = _layout_swap(golden, candidate, name, c, g)
    src = cp.src
    if fmt.bits == 4 and classify.nibbles_swapped(getattr(golden, name).to("cpu"), getattr(candidate, name).to("cpu")):
        swap = "golden with its nibbles swapped (element 2j in the high nibble; NUMERICS: §5.4 puts it low)"
    swap = swap or _flat_swap(golden, name, c, g)
    if swap:
        first = _locate(golden, candidate, name, cp, src, int(rr[0]), int(cc[0]), "layout_transposition", None)
        detail["layout"] = detail["reason"] = f"candidate equals the {swap}"
        ex = classify.whole("layout_transposition", n_mis, "layout", {k: first[k] for k in ("index", "golden", "candidate")})
        causes_mod.annotate(ex, {"layout_transposition": _layout_cause(cfg, name, swap)})
        return _result(name, n, {"layout_transposition": n_mis}, first, met, hist, detail, ex, f"data is the {swap}")
    cls, pat, pat_names, y, rules = _classify_data(golden, candidate, cp, src, rr, cc, gm, cm)
    cls = _apply_causes(cls, att, name, (rr, cc))
    counts = torch.bincount(cls, minlength=len(MISMATCH_CLASSES))
    classes = {k: int(counts[i]) for i, k in enumerate(MISMATCH_CLASSES)}
    first = _locate(golden, candidate, name, cp, src, int(rr[0]), int(cc[0]), MISMATCH_CLASSES[int(cls[0])], float(y[0]))

    def example(i: int) -> dict:
        r, c_ = int(rr[i]), int(cc[i])
        m, k = cp.logical(r, c_)
        ex = {"index": [r, c_], "row": m, "col": k, "block": cp.block_of(r, c_)[0],
              "golden": _hex(int(gm[i]), 1 if fmt.bits == 4 else 2), "candidate": _hex(int(cm[i]), 1 if fmt.bits == 4 else 2),
              "input": float(src[r, c_]), "scaled": float(y[i]),
              "golden_scale": _scale_entry(golden, cp, r, c_), "candidate_scale": _scale_entry(candidate, cp, r, c_)}
        reported = _reported(candidate, cp, r, c_)
        if reported:
            ex["candidate_reported_chain"] = reported
        return ex

    ex = causes_mod.annotate(classify.examples(cls, MISMATCH_CLASSES, pat, pat_names, example))
    return _result(name, n, classes, first, met, hist, detail, ex)


def _flat_swap(golden, name: str, c: torch.Tensor, g: torch.Tensor) -> str | None:
    """Whether the candidate, of the golden's shape, holds in row-major order the bytes of the golden transposed
    or of the other orientation's copy (or its transpose): a copy stored without its transpose."""
    if c.dim() != 2 or torch.equal(c, g):
        return None
    other = name.replace("rowwise", "@").replace("colwise", "rowwise").replace("@", "colwise")
    refs = [("golden transposed", g.t())]
    if getattr(golden, other, None) is not None:
        og = _codes(golden, other) if name.endswith("_data") else getattr(golden, other).to("cpu")
        refs += [(f"golden {other}", og), (f"golden {other} transposed", og.t() if og.dim() == 2 else og)]
    flat = c.reshape(-1)
    for what, ref in refs:
        if ref.numel() == flat.numel() and torch.equal(ref.contiguous().reshape(-1), flat):
            return f"{what} in row-major order, stored untransposed in the golden's shape {tuple(g.shape)}"
    return None


def _by_priority(shape, ranked: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """MISMATCH_CLASSES index per element: the first (class, mask) of `ranked` (highest priority first) whose
    mask holds there, else `other`."""
    idx = MISMATCH_CLASSES.index
    cls = torch.full(shape, idx("other"), dtype=torch.int64)
    for name, mask in reversed(ranked):
        cls = torch.where(mask, idx(name), cls)
    return cls


def _classify_data(golden, candidate, cp: _Copy, src, rr, cc, gm, cm):
    """Class and input pattern of each mismatching data element (codes gm, cm at data positions rr, cc).

    Priority: nan_sign > nonfinite_policy > block_scale_cascade > subnormal_flush > zero_scale_factor >
    tie_flip > encode_factor_rounding > other (a subnormal input flushed to zero is a flush, whatever the factor).
    """
    fmt = golden.config.element_format
    mag_mask = ~fmt.sign_mask if fmt.signed else (1 << fmt.bits) - 1
    nan_both = _is_nan_code(gm, fmt) & _is_nan_code(cm, fmt)
    chain_diff = _chain_differs(golden, candidate, cp, rr, cc)
    diff_scale = chain_diff if chain_diff is not None else torch.zeros(rr.shape, dtype=torch.bool)
    mult, _ = _multiplier(golden, cp, src, rr, cc)
    x = src[rr, cc]
    y = x * mult  # NUMERICS: §1-§5 one fp32 multiply x * (encode factor)
    gval, cval = casts.decode(gm, fmt), casts.decode(cm, fmt)
    same_sign = (gm & fmt.sign_mask) == (cm & fmt.sign_mask) if fmt.signed else torch.ones_like(nan_both)
    adjacent = same_sign & ((gm & mag_mask) - (cm & mag_mask)).abs().eq(1) & ~_is_nan_code(cm, fmt)
    # A tie flip: y is a midpoint and the candidate is the other of its two neighbours.
    y64 = y.to(torch.float64)
    other_side = (cval.to(torch.float64) - y64).abs() == (gval.to(torch.float64) - y64).abs()
    mid = is_midpoint(y, fmt)
    tie = mid & adjacent & other_side
    near = classify.near_midpoint(y, gval, cval) & adjacent & ~mid
    # The candidate's own chain (extra["<o>_chain"]), where it reports one: its scaled value off a tie.
    yc = _reported_scaled(candidate, cp, src, rr, cc)
    if yc is not None:
        yc64 = yc.to(torch.float64)
        toward_c = (cval.to(torch.float64) - yc64).abs() < (gval.to(torch.float64) - yc64).abs()
        near = near | (tie & toward_c & ~is_midpoint(yc, fmt))
        tie = tie & ~near
    nf_blk, sub_blk = classify.block_flags(src, cp.br, cp.bc, cp.hp_dtype)
    bi, bj = rr // cp.br, cc // cp.bc
    blk_nf, blk_sub = nf_blk[bi, bj], sub_blk[bi, bj]
    either = ~torch.isfinite(gval) | ~torch.isfinite(cval)  # NaN vs number, Inf vs NaN (both NaN: nan_sign)
    nonfinite = ~torch.isfinite(x) | either | (blk_nf & diff_scale)
    g_mag, c_mag = gm & mag_mask, cm & mag_mask
    g_sub = (g_mag != 0) & ((g_mag >> fmt.man_bits) == 0)  # NUMERICS: §0.4 exponent field 0: subnormal
    # E2M1's one "subnormal" code is 0.5, reached by rounding ordinary inputs in [0.25, 0.75): a candidate that
    # writes 0 there rounded differently (at the 0.25 midpoint, or truncating) and flushed nothing.
    g_sub &= fmt.man_bits > 1
    tiny = classify._TINY.get(cp.hp_dtype, classify._TINY["float32"])
    x_sub = (x.abs() > 0) & (x.abs() < tiny)
    flush = (c_mag == 0) & (g_mag != 0) & (g_sub | x_sub)
    zero_factor = _zero_scale_factor(golden, cp, x, gm, cm, rr, cc) & ~diff_scale
    cls = _by_priority(rr.shape, [("nan_sign", nan_both), ("nonfinite_policy", nonfinite),
                                  ("block_scale_cascade", diff_scale), ("subnormal_flush", flush),
                                  ("zero_scale_factor", zero_factor), ("tie_flip", tie),
                                  ("encode_factor_rounding", near)])
    pat, names = classify.pattern(blk_nf, blk_sub, diff_scale, mid | near | classify.near_midpoint(y, gval, cval))
    return cls, pat, names, y, None


def _zero_scale_factor(golden, cp: _Copy, x: torch.Tensor, gm: torch.Tensor, cm: torch.Tensor, rr, cc) -> torch.Tensor:
    """Elements of an E8M0 e = 0 block whose candidate code is sat(RN(x · f)), f one of ZERO_SCALE_FACTORS,
    and not the golden's.

    NUMERICS: §0.5 P(0) = 2^127 (the contract) against §7.29 TE's exp2f_rcp(0) = 1.0 (also torchao's RCEIL
    cast) and torchao's FLOOR cast, which divides by the scale clamped at fp32's smallest normal 2^-126 (§7).
    """
    if _scale_format(golden.config) is not UE8M0:
        return torch.zeros(rr.shape, dtype=torch.bool)
    i, j = cp.scale_index(rr, cc)
    e0 = getattr(golden, f"{cp.o}_scale").to("cpu")[i, j] == 0
    fmt, x32 = golden.config.element_format, x.to(torch.float32)
    hit = torch.zeros(rr.shape, dtype=torch.bool)
    for f in ZERO_SCALE_FACTORS:  # exact fp32 multiplies by powers of two (x * 2^126 stays finite: |x| < 2^-126 * 448)
        hit |= casts.saturating_cast(x32 * f, fmt) == cm
    return e0 & hit & (gm != cm)


def _scale_entry(q: QuantizedTensor, cp: _Copy, r: int, c: int) -> str | None:
    """The stored scale entry element (r, c) uses: its byte (E8M0, E4M3) or fp32 bits."""
    scale = getattr(q, f"{cp.o}_scale")
    if scale is None:
        return None
    scale = scale.to("cpu")
    if q.config.tile is None:
        return _f32_hex(scale.reshape(-1)[0].to(torch.float32))
    i, j = (int(t) for t in cp.scale_index(torch.tensor(r), torch.tensor(c)))
    if scale.dim() != 2 or i >= scale.shape[0] or j >= scale.shape[1]:
        return "out of range"
    v = scale[i, j]
    return _f32_hex(v.to(torch.float32)) if v.is_floating_point() else _hex(int(v))


def _reported_chain(q: QuantizedTensor, cp: _Copy) -> dict:
    chain = q.extra.get(f"{cp.o}_chain") if isinstance(q.extra, dict) else None
    return chain if isinstance(chain, dict) else {}


def _reported_at(t: Any, cp: _Copy, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor | None:
    """A reported chain value at data positions (r, c): a scalar, one per element (the data shape)
    or one per scale entry (indexed like the stored scale)."""
    if not isinstance(t, torch.Tensor):
        try:
            return torch.full(r.shape, float(t), dtype=torch.float64)
        except (TypeError, ValueError):
            return None
    t = t.detach().to("cpu")
    if t.numel() == 1:
        return t.reshape(()).expand(r.shape)
    if t.dim() == 2 and tuple(t.shape) == (cp.rows, cp.cols):
        return t[r, c]
    if t.dim() == 2 and cp.cfg.tile is not None:
        i, j = cp.scale_index(r, c)
        if int(i.max()) < t.shape[0] and int(j.max()) < t.shape[1]:
            return t[i, j]
    return None


def _reported(q: QuantizedTensor, cp: _Copy, r: int, c: int) -> dict:
    """The candidate's own chain values behind element (r, c) (docs/adapters.md §2 `extra`)."""
    out = {}
    for k, v in _reported_chain(q, cp).items():
        at = _reported_at(v, cp, torch.tensor([r]), torch.tensor([c]))
        if at is not None:
            out[k] = float(at.reshape(-1)[0])
    return out


def _reported_scaled(q: QuantizedTensor, cp: _Copy, src, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor | None:
    """The candidate's scaled values at (r, c) from its reported chain: `scaled` itself, or the input
    times its `encode_factor`, or divided by its `decode_scale` (a true division), fp32."""
    chain = _reported_chain(q, cp)
    for key, make in (("scaled", lambda v: v),
                      ("encode_factor", lambda v: src[r, c] * v.to(torch.float32)),
                      ("decode_scale", lambda v: src[r, c] / v.to(torch.float32))):
        if key in chain:
            v = _reported_at(chain[key], cp, r, c)
            if v is not None:
                return make(v).to(torch.float32)
    return None


def _chain_differs(golden, candidate, cp: _Copy, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor | None:
    """At data positions (r, c): does the scale entry (or a global scale / amax it depends on) differ?"""
    cfg = golden.config
    gs, cs = getattr(golden, f"{cp.o}_scale"), getattr(candidate, f"{cp.o}_scale")
    if gs is None or cs is None:
        return None
    gs, cs = gs.to("cpu"), cs.to("cpu")
    glob = torch.zeros((), dtype=torch.bool)
    ga, ca = getattr(golden, f"{cp.o}_amax"), getattr(candidate, f"{cp.o}_amax")
    if cfg.scheme_row.global_amax and ga is not None and ca is not None:
        glob = torch.tensor(not torch.equal(fp32.bits(ga.to("cpu")), fp32.bits(ca.to("cpu"))))
    if cfg.tile is None:
        if gs.shape != cs.shape:
            return None
        return (glob | torch.tensor(not torch.equal(fp32.bits(gs), fp32.bits(cs)))).expand(r.shape)
    i, j = cp.scale_index(r, c)
    if gs.dim() != 2 or cs.dim() != 2 or int(i.max()) >= min(gs.shape[0], cs.shape[0]) \
            or int(j.max()) >= min(gs.shape[1], cs.shape[1]):
        return None
    gv, cv = gs[i, j], cs[i, j]
    if gv.dtype == torch.float32:
        gv, cv = fp32.bits(gv), fp32.bits(cv.to(torch.float32))
    return (gv != cv) | glob


def _locate(golden, candidate, name, cp: _Copy, src, r: int, c: int, cls: str, y: float | None) -> dict:
    """Location and context of one mismatching element at data position (r, c)."""
    fmt = golden.config.element_format
    m, k = cp.logical(r, c)
    block, elem = cp.block_of(r, c)
    g, cand = _codes(golden, name), _codes(candidate, name)
    gv, cv = int(g[r, c]), int(cand[r, c])
    out = {
        "field": name,
        "class": cls,
        "index": [r, c],
        "row": m,
        "col": k,
        "block": block,
        "element": elem,
        "golden": _hex(gv, 1 if fmt.bits == 4 else 2),
        "candidate": _hex(cv, 1 if fmt.bits == 4 else 2),
        "golden_value": float(casts.decode(torch.tensor([gv], dtype=torch.uint8), fmt)[0]),
        "candidate_value": float(casts.decode(torch.tensor([cv], dtype=torch.uint8), fmt)[0]),
        "input": float(src[r, c]),
        "input_block": cp.input_block(src, r, c),
        "golden_chain": _chain(golden, cp, r, c, src, True),
        "candidate_chain": {"source": IMPLIED, **_chain(candidate, cp, r, c, src, False)},
    }
    reported = _reported(candidate, cp, r, c)
    if reported:
        out["candidate_reported_chain"] = {"source": f"the candidate's extra['{cp.o}_chain']", **reported}
    if y is not None:
        out["scaled"] = y
    return out


def _scale_step_apart(g: torch.Tensor, c: torch.Tensor, sfmt) -> torch.Tensor:
    if sfmt is None:  # fp32 sinv: 1 ulp apart, or a factor of two for powers of two
        gb, cb = fp32.bits(g).to(torch.int64), fp32.bits(c).to(torch.int64)
        same_sign = (gb < 0) == (cb < 0)
        d = (gb - cb).abs()
        pow2 = ((gb & 0x7FFFFF) == 0) & ((cb & 0x7FFFFF) == 0)
        return same_sign & ((d == 1) | (pow2 & (d == (1 << 23))))
    g64, c64 = g.to(torch.int64), c.to(torch.int64)
    same_sign = ((g64 & sfmt.sign_mask) == (c64 & sfmt.sign_mask)) if sfmt.signed else torch.ones_like(g64, dtype=torch.bool)
    return same_sign & ((g64 - c64).abs() == 1) & ~_is_nan_code(c64, sfmt) & ~_is_nan_code(g64, sfmt)


SWIZZLED = "scales are the golden's swizzled (128x4 tiles)"
UNPADDED = "scales are the golden's packed without the padding of their rows"


def _unswizzle(flat: torch.Tensor, t_shape: tuple[int, int]) -> torch.Tensor:
    """The padded compact matrix T [R, C] read back from the flat cuBLASLt swizzled order, by gathering
    each entry from its offset (the harness's own inverse; reference.layouts and native/swizzle.py have theirs)."""
    r, c = t_shape
    i = torch.arange(r, dtype=torch.int64).view(-1, 1)
    j = torch.arange(c, dtype=torch.int64).view(1, -1)
    # NUMERICS: §3 Layouts (§5.9 for NVFP4) - entry (i, j) of T sits at offset
    # (i//128 * (C/4) + j//4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4.
    off = (i // 128 * (c // 4) + j // 4) * 512 + (i % 32) * 16 + (i % 128) // 32 * 4 + j % 4
    return flat.reshape(-1)[off]


def _is_swizzled(g_full: torch.Tensor, g: torch.Tensor, c_full: torch.Tensor, cp: _Copy, as_bits) -> bool:
    """Whether the candidate's scale tensor (any shape with the padded element count) holds, in cuBLASLt's
    swizzled order, the golden's valid region: a kernel that returned what it hands to the GEMM."""
    if not cp.cfg.scheme_row.swizzled_scales or g_full.dim() != 2 or c_full.numel() != g_full.numel():
        return False
    t_shape = tuple(g_full.shape[::-1]) if cp.geom.swizzle_transposed else tuple(g_full.shape)
    if t_shape[0] % 128 or t_shape[1] % 4:
        return False
    t = _unswizzle(c_full.to(g_full.dtype), t_shape)
    s = t.t() if cp.geom.swizzle_transposed else t  # NUMERICS: §3 - MXFP8 colwise swizzles S_c^T
    if not torch.equal(as_bits(s[: g.shape[0], : g.shape[1]]), as_bits(g)):
        return False
    # NUMERICS: §3 Layouts - swizzled padding is 0: a compact tensor with a few entries off (most of a small
    # tensor's padded scales are zero) must not read as swizzled.
    pad = torch.ones(s.shape, dtype=torch.bool)
    pad[: g.shape[0], : g.shape[1]] = False
    return not bool((as_bits(s)[pad] != 0).any())


def _compare_scale(golden, candidate, name, cp: _Copy, strict_padding: bool,
                   att: causes_mod.Attribution | None = None) -> TensorResult:
    cfg = golden.config
    sfmt = _scale_format(cfg)
    valid = _valid_shape(cfg, cp.o, cp.m, cp.k)
    if _same_field(golden, candidate, name):  # valid region and padding identical
        n = math.prod(valid)
        detail = {"valid_shape": list(valid)}
        if getattr(golden, name).numel() > n:
            detail["padding_mismatches"] = 0
        return _result(name, n, {}, None, *_identical(n), detail)
    g_full, c_full = getattr(golden, name).to("cpu"), getattr(candidate, name).to("cpu")
    sl = tuple(slice(0, v) for v in valid)
    g = g_full[sl]
    n = g.numel()
    as_bits = (lambda t: fp32.bits(t)) if sfmt is None else (lambda t: t.to(torch.int64))
    if c_full.dim() != g_full.dim() or any(cs < v for cs, v in zip(c_full.shape, valid, strict=False)):
        if _is_swizzled(g_full, g, c_full, cp, as_bits):  # e.g. a flat [R*C] swizzled tensor
            why = (f"candidate shape {tuple(c_full.shape)} holds the golden's scales in cuBLASLt's swizzled order "
                   f"(golden compact {tuple(g_full.shape)})")
            ex = causes_mod.annotate(classify.whole("layout_transposition", n, "shape", {"reason": why}),
                                     {"layout_transposition": "scales_swizzled"})
            return TensorResult(name, "fail", n, n, {"layout_transposition": n}, {"field": name, "reason": why},
                                detail={"reason": why, "layout": "golden swizzled (128x4 tiles)"}, layout=SWIZZLED,
                                examples=ex)
        swap = None
        if c_full.dim() == 2 and g.dim() == 2 and c_full.shape[0] >= g.shape[1] and c_full.shape[1] >= g.shape[0]:
            if torch.equal(c_full[: g.shape[1], : g.shape[0]], g.t()):
                swap = "golden transposed"
        other = name.replace("rowwise", "@").replace("colwise", "rowwise").replace("@", "colwise")
        og = getattr(golden, other, None)
        if swap is None and og is not None and og.shape == c_full.shape and torch.equal(og.to("cpu"), c_full):
            swap = f"golden {other}"  # e.g. MXFP8 colwise scales computed along the rowwise blocks
        whole = "" if swap else _whole_cause(att, name)
        cls = "layout_transposition" if swap else (causes_mod.BY_ID[whole].mismatch_class if whole else "other")
        why = f"candidate shape {tuple(c_full.shape)} does not cover the valid region {valid} (golden padded {tuple(g_full.shape)})"
        if swap:
            why += f" (it holds the {swap}'s scales)" if swap != "golden transposed" else \
                " (it holds the golden's scales transposed)"
        ex = classify.whole(cls, n, "shape", {"reason": why})
        causes_mod.annotate(ex, {cls: _layout_cause(cfg, name, swap)} if swap else ({cls: whole} if whole else None))
        layout = None
        if swap:
            layout = "scales are the golden's transposed" if swap == "golden transposed" else f"scales are the {swap}"
        detail = {"reason": why}
        if swap:
            detail["layout"] = swap
        return TensorResult(name, "fail", n, n, {cls: n}, {"field": name, "reason": why}, detail=detail,
                            examples=ex, layout=layout)
    detail: dict[str, Any] = {"valid_shape": list(valid)}
    if c_full.dtype != g_full.dtype:
        detail["dtype"] = f"candidate {c_full.dtype} != golden {g_full.dtype}"
        c_full = c_full.to(g_full.dtype)
    c = c_full[sl]
    mism = as_bits(g) != as_bits(c)
    classes = {k: 0 for k in MISMATCH_CLASSES}
    first_pad = None
    # Padding, compared separately (informational unless the candidate claims zero-filled padding).
    if c_full.shape == g_full.shape and g_full.numel() > n:
        pad = torch.ones(g_full.shape, dtype=torch.bool)
        pad[sl] = False
        pad_mism = pad & (as_bits(g_full) != as_bits(c_full))
        detail["padding_mismatches"] = int(pad_mism.sum())
        if strict_padding and detail["padding_mismatches"]:
            classes["padding"] = detail["padding_mismatches"]
            pos = pad_mism.reshape(-1).nonzero()[0, 0]
            first_pad = {"field": name, "class": "padding",
                         "index": [int(t) for t in torch.unravel_index(pos, g_full.shape)],
                         "note": f"outside the valid region {list(valid)}; the candidate claims zero padding"}
    dec = (lambda t: t.to(torch.float32)) if sfmt is None else (
        (lambda t: casts.e8m0_decode(t)) if sfmt is UE8M0 else (lambda t: casts.decode(t, sfmt)))
    n_mis = int(mism.sum())
    if n_mis:
        met = metrics(dec(c), dec(g), count_nonfinite=True)
        hist = ulp_hist_float(g, c) if sfmt is None else ulp_hist_codes(g, c, sfmt)
    else:
        met, hist = _identical(n)
    first, ex, layout = None, {}, None
    if n_mis:
        swizzled = _is_swizzled(g_full, g, c_full, cp, as_bits)
        unpadded = not swizzled and g.dim() == 2 and g.shape != g_full.shape and c_full.numel() >= n and \
            torch.equal(as_bits(c_full.reshape(-1)[:n]), as_bits(g.reshape(-1)))
        if swizzled or unpadded or (g.dim() == 2 and c_full.dim() == 2 and g.shape[0] != g.shape[1]
                                    and c_full.shape[0] >= g.shape[1] and c_full.shape[1] >= g.shape[0]
                                    and torch.equal(as_bits(c_full[: g.shape[1], : g.shape[0]]), as_bits(g.t()))):
            classes["layout_transposition"] = n_mis
            cls_t = torch.full(g.shape, MISMATCH_CLASSES.index("layout_transposition"))
            layout = detail["reason"] = SWIZZLED if swizzled else UNPADDED if unpadded else \
                "scales are the golden's transposed"
            if swizzled:
                detail["layout"] = "golden swizzled (128x4 tiles)"  # the row reason's words (harness.ops.layout_finding)
            elif unpadded:
                detail["layout"] = "golden's valid region packed without its row padding"
            pos = mism.reshape(-1).nonzero()[0, 0]
            idx = [int(t) for t in torch.unravel_index(pos, g.shape)]
            ex = classify.whole("layout_transposition", n_mis, "layout", {"index": idx})
            causes_mod.annotate(ex, {"layout_transposition": _layout_cause(cfg, name, layout)})
        else:
            cls_t, pat_t, pat_names, rule_names = _classify_scale(golden, candidate, cp, g, c, sfmt, as_bits, dec)
            cls_t = _apply_causes(cls_t, att, name, None)
            sel = mism.reshape(-1)
            counts = torch.bincount(cls_t.reshape(-1)[sel], minlength=len(MISMATCH_CLASSES))
            for i, k in enumerate(MISMATCH_CLASSES):
                classes[k] += int(counts[i])
            flat = sel.nonzero().reshape(-1)
            show = (lambda t, p: _f32_hex(t.reshape(-1)[p])) if sfmt is None else (lambda t, p: _hex(int(t.reshape(-1)[p])))
            blk_amax = functools.cache(lambda: _block_amax(cp.src, cp.br, cp.bc))
            g_dec, c_dec = dec(g).reshape(-1), dec(c).reshape(-1)

            def example(k: int) -> dict:
                p = int(flat[k])
                ix = [int(t) for t in torch.unravel_index(torch.tensor(p), g.shape)]
                e = {"index": ix, "golden": show(g, p), "candidate": show(c, p),
                     "golden_value": float(g_dec[p]), "candidate_value": float(c_dec[p])}
                if cp.cfg.tile is not None:
                    r0, _, c0, _ = cp.scale_block(*ix)
                    e.update(row=cp.logical(r0, c0)[0], col=cp.logical(r0, c0)[1],
                             block_amax=float(blk_amax()[r0 // cp.br, c0 // cp.bc]))
                if rule_names[p]:
                    e["rule"] = rule_names[p]
                return e

            ex = causes_mod.annotate(classify.examples(cls_t.reshape(-1)[sel], MISMATCH_CLASSES, pat_t.reshape(-1)[sel],
                                                       pat_names, example))
            pos = flat[0]
        if first is None:
            idx = [int(t) for t in torch.unravel_index(pos, g.shape)]
            first = {"field": name, "class": MISMATCH_CLASSES[int(cls_t.reshape(-1)[pos])], "index": idx}
            first.update(_scale_context(golden, candidate, cp, cp.src, idx, g, c, sfmt))
    if first_pad is not None:  # the padding's own example (docs/numerics.md §13 cause `padding`)
        ex = {**ex, **causes_mod.annotate(classify.whole("padding", classes["padding"], "padding",
                                                         {k: first_pad[k] for k in ("index", "note")}))}
    return _result(name, n, classes, first or first_pad, met, hist, detail, ex, layout)


def _classify_scale(golden, candidate, cp: _Copy, g, c, sfmt, as_bits, dec):
    """Class and input pattern of every entry of the valid scale region (used where they differ), and
    the other rule each entry matches ('' where none).

    Priority: nan_sign > nonfinite_policy > scale_floor > scale_rule > scale_off_by_one > subnormal_flush > other.
    """
    if sfmt is None:
        nan_both = torch.isnan(g) & torch.isnan(c)
    else:
        nan_both = _is_nan_code(g.to(torch.int64), sfmt) & _is_nan_code(c.to(torch.int64), sfmt)
    step = _scale_step_apart(g, c, sfmt)
    gd, cd = dec(g).to(torch.float64), dec(c).to(torch.float64)
    # The input block behind each scale entry.
    nf_blk, sub_blk = classify.block_flags(cp.src, cp.br, cp.bc, cp.hp_dtype)
    amax_blk = _block_amax(cp.src, cp.br, cp.bc)
    if cp.cfg.tile is None:
        e_nf, e_sub = nf_blk.reshape(-1)[:1].expand(g.shape), sub_blk.reshape(-1)[:1].expand(g.shape)
        e_amax = amax_blk.reshape(-1)[:1].expand(g.shape)
    else:
        ii, jj = torch.meshgrid(torch.arange(g.shape[0]), torch.arange(g.shape[1]), indexing="ij")
        sr, sc = cp.geom.scale_block or (cp.rows, cp.cols)  # the data origin of each entry, as CopyGeometry.scale_region
        rb, cb = (jj, ii) if cp.geom.block_major else (ii, jj)
        bi, bj = (rb * sr) // cp.br, (cb * sc) // cp.bc
        e_nf, e_sub, e_amax = nf_blk[bi, bj], sub_blk[bi, bj], amax_blk[bi, bj]
    nonfinite = e_nf | ~torch.isfinite(gd) | ~torch.isfinite(cd)
    # NUMERICS: §1 step 2 (eps), §3 (E8M0 of a zero block), §10.5 (the 2^-6 clamp): a scale floor shows as a
    # zero block, or a decode scale over four times the golden's (a rounding rule moves it by at most x2).
    fin = torch.isfinite(gd) & torch.isfinite(cd)
    floor = (e_amax == 0) | (fin & (cd > 4 * gd))
    mism = as_bits(g) != as_bits(c)
    rule = torch.zeros(g.shape, dtype=torch.bool)
    rule_names = [""] * g.numel()
    if bool((mism & ~floor & ~nonfinite & ~nan_both).any()):
        hp_shape = tuple(cp.x2d.shape)
        rules = classify.rule_scales(cp.x2d, hp_shape, cp.cfg, cp.o)
        rule, rule_names = classify.scale_rule_matches(c, g, rules, as_bits)
    zero_c = cd == 0
    g_sub = (gd > 0) & (gd < (sfmt.min_normal if sfmt is not None and sfmt is not UE8M0 else classify._TINY["float32"]))
    flush = zero_c & (g_sub | e_sub)
    cls = _by_priority(g.shape, [("nan_sign", nan_both), ("nonfinite_policy", nonfinite), ("scale_floor", floor),
                                 ("scale_rule", rule), ("scale_off_by_one", step), ("subnormal_flush", flush)])
    pat, names = classify.pattern(e_nf, e_sub, None, None)
    return cls, pat, names, rule_names


def _scale_context(golden, candidate, cp: _Copy, src, idx, g, c, sfmt) -> dict:
    def show(t):
        v = t[tuple(idx)]
        return _f32_hex(v) if sfmt is None else _hex(int(v))

    out = {"golden": show(g), "candidate": show(c)}
    if golden.config.tile is None:
        out["input_block"] = cp.input_block(src, 0, 0)
        out["golden_chain"] = _chain(golden, cp, 0, 0, src, True)
        out["candidate_chain"] = {"source": IMPLIED, **_chain(candidate, cp, 0, 0, src, False)}
        return out
    i, j = idx
    r0, r1, c0, c1 = cp.scale_block(i, j)
    m, k = cp.logical(r0, c0)
    out.update(row=m, col=k, block=[r0 // cp.br, c0 // cp.bc], data_rows=[r0, r1], data_cols=[c0, c1])
    out["input_block"] = cp.input_block(src, r0, c0)
    out["golden_chain"] = _chain(golden, cp, r0, c0, src, True)
    out["candidate_chain"] = {"source": IMPLIED, **_chain(candidate, cp, r0, c0, src, False)}
    reported = _reported(candidate, cp, r0, c0)
    if reported:
        out["candidate_reported_chain"] = {"source": f"the candidate's extra['{cp.o}_chain']", **reported}
    return out


def _compare_amax(golden, candidate, name, att: causes_mod.Attribution | None = None) -> TensorResult:
    g, c = getattr(golden, name).to("cpu").reshape(-1), getattr(candidate, name).to("cpu").reshape(-1)
    n = g.numel()
    if g.shape != c.shape:
        why = f"candidate shape {tuple(c.shape)} != golden {tuple(g.shape)}"
        return TensorResult(name, "fail", n, n, {"other": n}, {"field": name, "reason": why}, detail={"reason": why})
    gb, cb = fp32.bits(g), fp32.bits(c)
    mism = gb != cb
    classes = {}
    first, ex = None, {}
    if bool(mism.any()):
        nan_both = torch.isnan(g) & torch.isnan(c)
        nonfinite = ~nan_both & (~torch.isfinite(g) | ~torch.isfinite(c))  # NaN/Inf propagated vs ignored
        cls = _by_priority(g.shape, [("nan_sign", nan_both), ("nonfinite_policy", nonfinite)])
        cls = _apply_causes(cls, att, name, None)
        counts = torch.bincount(cls[mism], minlength=len(MISMATCH_CLASSES))
        classes = {k: int(counts[i]) for i, k in enumerate(MISMATCH_CLASSES) if int(counts[i])}
        pos = mism.nonzero().reshape(-1)

        def example(k: int) -> dict:
            i = int(pos[k])
            return {"index": [i], "golden": float(g[i]), "candidate": float(c[i]),
                    "golden_bits": _f32_hex(g[i]), "candidate_bits": _f32_hex(c[i])}

        i = int(pos[0])
        first = {"field": name, "class": MISMATCH_CLASSES[int(cls[i])], **example(0)}
        pat = torch.zeros(pos.shape, dtype=torch.int64)
        ex = causes_mod.annotate(classify.examples(cls[pos], MISMATCH_CLASSES, pat, ["amax"], example))
    return _result(name, n, classes, first, metrics(c, g, count_nonfinite=True),
                   ulp_hist_float(g.to(torch.float32), c.to(torch.float32)), {}, ex)


def compare_quantized(golden: QuantizedTensor, candidate: QuantizedTensor, x: torch.Tensor, *,
                      strict_padding: bool | None = None, rng=None, causes: bool = True) -> list[TensorResult]:
    """One TensorResult per field the golden QuantizedTensor has (data, scale, amax per orientation).

    Data bytes are compared exactly (FP4 nibble by nibble), scales on the valid region, amax by
    bits. `x` is the high-precision input both were quantized from. Padding mismatches are
    counted in `detail["padding_mismatches"]`; they fail only with strict_padding (default: the
    candidate's `extra["zero_fills_padding"]`). With `causes`, the mismatches of a failing copy are
    attributed to the causes of harness.causes (docs/numerics.md §13; `rng` is the case's SR (seed,
    stream), needed for a stochastic copy's causes): each explained element gets its cause's class.
    """
    if strict_padding is None:
        strict_padding = bool(candidate.extra.get("zero_fills_padding", False))
    x2d = x.detach().to("cpu").reshape(-1, x.shape[-1])
    out: list[TensorResult] = []
    for o in ("rowwise", "colwise"):
        if getattr(golden, f"{o}_data") is None:
            continue
        cp = _Copy(golden.config, o, x2d, golden.hp_dtype)
        att = _attribution(golden, candidate, cp, rng) if causes else None
        for kind in ("data", "scale", "amax"):
            name = f"{o}_{kind}"
            if getattr(golden, name) is None:
                continue
            if getattr(candidate, name) is None:
                out.append(_missing(name, f"the candidate has no {name}", getattr(golden, name).numel()))
                continue
            if kind == "data":
                out.append(_compare_data(golden, candidate, name, cp, att))
            elif kind == "scale":
                out.append(_compare_scale(golden, candidate, name, cp, strict_padding, att))
            else:
                out.append(_compare_amax(golden, candidate, name, att))
    return out


def _attribution(golden, candidate, cp: _Copy, rng) -> causes_mod.Attribution | None:
    """harness.causes.attribute for copy cp.o, run only when one of its fields differs from the golden's."""
    names = [f"{cp.o}_{k}" for k in ("data", "scale", "amax")]
    pairs = [n for n in names if getattr(golden, n) is not None and getattr(candidate, n) is not None]
    if all(_same_field(golden, candidate, n) for n in pairs):
        return None

    def codes(t: torch.Tensor) -> torch.Tensor:
        return casts.unpack_nibbles(t) if golden.config.element_format.bits == 4 else t

    try:
        return causes_mod.attribute(golden, candidate, cp.x2d, cp.o, _valid_shape(cp.cfg, cp.o, cp.m, cp.k), codes,
                                    rng)
    except Exception:  # noqa: BLE001 - diagnostics only: a cause search that fails names no cause
        return None


def _apply_causes(cls: torch.Tensor, att: causes_mod.Attribution | None, name: str, where) -> torch.Tensor:
    """`cls` (MISMATCH_CLASSES indices of the elements selected by `where` from the field's attribution map)
    with each element a cause explains given that cause's class."""
    if att is None or name not in att.index:
        return cls
    idx = att.index[name]
    sel = (idx[where] if where is not None else idx).to(torch.int64)
    mapped = torch.tensor([MISMATCH_CLASSES.index(c.mismatch_class) for c in causes_mod.CATALOGUE] + [-1],
                          dtype=torch.int64)[sel]  # -1 (no cause) picks the appended -1
    return torch.where(sel >= 0, mapped, cls)


def _layout_cause(cfg: QuantConfig, name: str, what: str) -> str:
    """The catalogue cause (harness.causes) of a layout finding `what` on field `name`."""
    if "nibbles" in what:
        return "nibble_order"
    if "swizzled" in what:
        return "scales_swizzled"
    if "padding" in what:
        return "scale_padding_missing"
    if "untransposed" in what:
        return "layout_untransposed"
    other = "colwise" if name.startswith("rowwise") else "rowwise"
    if f"golden {other}" in what:
        if cfg.scheme in ("mxfp8", "nvfp4") and (cfg.scheme == "mxfp8") != ("transposed" in what):
            return "block_axis"
        return "layout_transposed" if "transposed" in what else "layout_untransposed"
    return "layout_transposed"


# ----------------------------------------------------------------------------------------------
# Outputs: dequantized tensors and GEMMs
# ----------------------------------------------------------------------------------------------


def compare_output(golden_out: torch.Tensor, candidate_out: torch.Tensor, tensor: str = "out",
                   bound: torch.Tensor | None = None) -> TensorResult:
    """Exact bits (bound None) or |candidate − golden| <= bound, with ULPs in the golden dtype.

    A NaN matches any NaN: docs/numerics.md fixes the NaN *codes* of the narrow formats (compared in
    compare_quantized), not the payload or sign of a NaN in a float output, which differs between
    CPU and GPU arithmetic (e.g. 0·inf).
    """
    g = golden_out.detach()  # compared where the golden lives
    c = candidate_out.detach().to(g.device)
    n = g.numel()
    if g.shape != c.shape:
        swap = g.dim() == 2 and c.shape == g.t().shape and torch.equal(c.to(g.dtype), g.t())
        cls = "layout_transposition" if swap else "other"
        why = f"candidate shape {tuple(c.shape)} != golden {tuple(g.shape)}" + (" (it equals the golden transposed)" if swap else "")
        return TensorResult(tensor, "fail", n, n, {cls: n}, {"reason": why}, detail={"reason": why})
    detail: dict[str, Any] = {"mode": "exact" if bound is None else "tolerance"}
    if c.dtype != g.dtype:
        detail["dtype"] = f"candidate {c.dtype} != golden {g.dtype}"
    cg = c.to(g.dtype)
    if bound is None and c.dtype == g.dtype and _same_bits(g, c):
        return _result(tensor, n, {}, None, *_identical(n), detail)
    _, gb = _ordered_float(g)
    _, cb = _ordered_float(cg)
    nan_both = torch.isnan(g) & torch.isnan(cg)
    if bound is None:
        mism = (gb != cb) & ~nan_both
    else:
        g64, c64 = g.to(torch.float64), c.to(torch.float64)
        fin = torch.isfinite(g64) & torch.isfinite(c64)
        same_nonfinite = nan_both | (torch.isinf(g64) & (g64 == c64))
        bound = bound.to(device=g.device, dtype=torch.float64)
        b = bound.expand_as(g64)
        within = (c64 - g64).abs() <= b
        mism = torch.where(fin, ~within, ~same_nonfinite)
        excess = torch.where(fin, (c64 - g64).abs() - b, torch.zeros_like(g64))
        detail["max_bound"] = float(b.max()) if b.numel() else 0.0
        detail["max_excess"] = float(excess.max()) if excess.numel() else 0.0
    if "dtype" in detail:
        mism = torch.ones_like(mism)
    n_mis = int(mism.sum())
    classes: dict[str, int] = {}
    first, ex, layout = None, {}, None
    if n_mis:
        pos_all = mism.reshape(-1).nonzero().reshape(-1)
        gf, cf = g.reshape(-1)[pos_all], cg.reshape(-1)[pos_all]
        if g.dim() == 2 and g.shape[0] == g.shape[1] and not torch.equal(gb, cb) and torch.equal(cb, gb.t()):
            cls = torch.full(pos_all.shape, MISMATCH_CLASSES.index("layout_transposition"))
            layout = detail["reason"] = "output is the golden's transposed"
        else:
            cls = _classify_output(gf, cf, "dtype" in detail)
        counts = torch.bincount(cls, minlength=len(MISMATCH_CLASSES))
        classes = {k: int(counts[i]) for i, k in enumerate(MISMATCH_CLASSES) if int(counts[i])}
        og, _ = _ordered_float(gf)
        oc, _ = _ordered_float(cf)

        def example(k: int) -> dict:
            p = int(pos_all[k])
            e = {"index": [int(t) for t in torch.unravel_index(torch.tensor(p), g.shape)],
                 "golden": float(gf[k]), "candidate": float(c.reshape(-1)[p]), "ulps": int((og[k] - oc[k]).abs())}
            if bound is not None:
                e["bound"] = float(b.reshape(-1)[p])
            return e

        first = {"class": MISMATCH_CLASSES[int(cls[0])], **example(0)}
        g_sub = (gf != 0) & (gf.abs() < torch.finfo(g.dtype).tiny) if g.is_floating_point() else torch.zeros_like(cls, dtype=torch.bool)
        nonfin = ~torch.isfinite(gf) | ~torch.isfinite(cf)
        pat = torch.where(nonfin, 2, torch.where(g_sub, 1, 0))
        ex = classify.examples(cls, MISMATCH_CLASSES, pat, ["finite", "subnormal", "nonfinite"], example)
    met = metrics(c, g, count_nonfinite=True)
    return _result(tensor, n, classes, first, met, ulp_hist_float(g, cg), detail, ex, layout)


def _classify_output(gf: torch.Tensor, cf: torch.Tensor, dtype_differs: bool) -> torch.Tensor:
    """Classes of mismatching float outputs (golden gf, candidate cf in the golden's dtype).

    nonfinite_policy: exactly one side NaN, or Inf against a number / the other Inf;
    subnormal_flush: the candidate is zero where the golden is subnormal in its dtype;
    decode_factor_rounding: both finite and at most 2 ulps apart (NUMERICS: §5.8 the decode factor
    and its product order are the contract, one rounding apart when taken in another order); other.
    """
    if dtype_differs:
        return _by_priority(gf.shape, [])
    fin = torch.isfinite(gf) & torch.isfinite(cf)
    og, _ = _ordered_float(gf)
    oc, _ = _ordered_float(cf)
    close = fin & ((og - oc).abs() <= 2) & (gf != 0) & (cf != 0)
    tiny = torch.finfo(gf.dtype).tiny
    flush = (cf == 0) & (gf != 0) & (gf.abs() < tiny)
    return _by_priority(gf.shape, [("nonfinite_policy", ~fin), ("subnormal_flush", flush),
                                   ("decode_factor_rounding", close)])


def compare_dequantized(golden_q: QuantizedTensor, orientation: str, golden_out: torch.Tensor,
                        candidate_out: torch.Tensor, tensor: str) -> TensorResult:
    """A dequantized copy against the golden's, bit for bit (compare_output), with every example (and
    the first mismatch) showing the code, the scale byte and the decode chain behind it.

    Source: docs/numerics.md §1-§5 (decode: value(code) x decode scale; §5.8 for NVFP4's two levels).
    """
    tr = compare_output(golden_out, candidate_out, tensor)
    if tr.status == "pass" or tr.layout or golden_out.shape != candidate_out.shape:
        return tr
    q = golden_q
    x2d = torch.zeros(q.shape[0] if len(q.shape) == 2 else math.prod(q.shape[:-1]), q.shape[-1])
    cp = _Copy(q.config, orientation, x2d, q.hp_dtype)
    codes = _codes(q, f"{orientation}_data")
    fmt = q.config.element_format

    def enrich(e: dict) -> None:
        idx = e.get("index")
        if not idx or len(idx) != 2:
            return
        m, k = idx
        r, c = (k, m) if cp.transposed else (m, k)
        code = int(codes[r, c])
        e["code"] = _hex(code, 1 if fmt.bits == 4 else 2)
        e["code_value"] = float(casts.decode(torch.tensor([code], dtype=torch.uint8), fmt)[0])
        e["scale"] = _scale_entry(q, cp, r, c)
        ch = _chain(q, cp, r, c, x2d if not cp.transposed else x2d.t(), False)  # stored values only
        e["decode_chain"] = {k: v for k, v in ch.items() if k not in ("block_amax", "scale_chain_error", "A_g", "m", "A_b", "d")}

    for cls in tr.examples.values():
        for p in cls["patterns"].values():
            for e in p["examples"]:
                enrich(e)
    if tr.first_mismatch:
        enrich(tr.first_mismatch)
    return tr


def compare_gemm(golden_out: torch.Tensor, candidate_out: torch.Tensor, truth: torch.Tensor | None, case,
                 exact: bool, *, a=None, b=None, bias: torch.Tensor | None = None,
                 c: torch.Tensor | None = None) -> TensorResult:
    """A GEMM (or dequantized) output against the golden one.

    exact=True: bit equality (exact-representable GEMM inputs, docs/numerics.md §6; dequantization).
    exact=False: |candidate − golden| <= tolerance.gemm_bound(case, a, b, golden) per element;
    `a`, `b` are the consumed operands (the golden QuantizedTensors or their dequantized logical
    tensors) and are required, since the bound scales with Σ|a||b|. `truth` (high-precision
    result, optional) only adds accuracy metrics to `detail`.
    """
    bound = None
    if not exact:
        if a is None or b is None:
            raise ValueError(
                "compare_gemm(exact=False) needs the consumed operands: pass a=<golden qa>, b=<golden qb> "
                "(QuantizedTensors or dequantized tensors); the tolerance bound scales with sum |a||b| "
                "(harness/tolerance.py)"
            )
        bound = tolerance.gemm_bound(case, a, b, golden_out, bias=bias, c=c)
    tr = compare_output(golden_out, candidate_out, "out", bound)
    if truth is not None and truth.shape == candidate_out.shape:
        tr.detail["candidate_vs_truth"] = metrics(candidate_out, truth)
        tr.detail["golden_vs_truth"] = metrics(golden_out, truth)
    return tr
