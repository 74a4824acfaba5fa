"""GEMM references for TE's three training GEMMs (fprop TN, dgrad NN, wgrad NT) of every scheme.

Source: docs/numerics.md §6 (GEMM semantics, blockwise FMA order, accumulate, exact-representable mode),
§5.8 (NVFP4 alpha), §3/§4/§5.9 (which copy and scales a GEMM consumes); TE
tests/pytorch/references/blockwise_fp8_gemm_reference.py (blockwise order, bias then RN_out then
accumulate) and transformer_engine/pytorch/custom_recipes/reference_nvfp4.py `qgemm` (alpha, C
added in fp32).

Layouts (docs/numerics.md §6): out[m, n] = sum_k A[m, k] * B[n, k] over K-contiguous operand rows.
- "TN": a logical [M, K], b logical [N, K]; both rowwise copies.
- "NN": a logical [M, K] rowwise; b logical [K, N], its colwise copy (blocks along K).
- "NT": a logical [K, M], b logical [K, N]; both colwise copies.

Methods:
- "exact": each consumed copy is dequantized with its block scales in fp64 (exact: a decoded
  element times an fp32 scale has at most 24 + 4 significant bits); one fp64 matmul (fp64
  accumulation: exact while a sum's terms span at most 53 bits, otherwise fp64 rounding);
  then the global factors (per-tensor sinv_a * sinv_b, NVFP4 alpha); then ONE rounding RN_out.
- "blockwise_order" (fp8_block): docs/numerics.md §6 per-128-deep-K-block FMA32 order.
- "block_sum" (mxfp8 / nvfp4): sum over K blocks of scale_a * scale_b * (block dot product) in fp64,
  alpha applied, one rounding.
- "auto": per-tensor -> exact, fp8_block -> blockwise_order, mxfp8 / nvfp4 -> block_sum.

Epilogue (identical for every method of a scheme, so exact-representable inputs give equal bits):
- fp8_block: bias added in fp32, then RN_out, then D = RN_out(C + RN_out(Y)) (docs/numerics.md §6).
- nvfp4: D = RN_out(RN(RN(Y) + C)) (C added in fp32, §6), then bias added in fp32 before RN_out.
- per-tensor and mxfp8 (tolerance only in §6): the same fp32 epilogue as nvfp4, i.e. cuBLASLt's
  documented D = alpha*AB + beta*C, then the BIAS epilogue, then the output conversion.
- Without bias and C the fp64 result is rounded once to out_dtype (via round-to-odd fp32).

Exact-representable mode (§6): `exact_representable_ok(a, b, layout=...)` checks the conditions
(every scaled product a multiple of one power of two q, sum |t| <= 2^24 q per output, alpha a power
of two, everything inside the fp32 range); when it holds, every method returns the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import casts, fp32, spec
from .formats import E2M1, E4M3, FLT_MAX, GEMM_METHODS, SCHEMES
from .layouts import GEMM_LAYOUTS, copy_geometry
from .types import QuantizedTensor, SpecViolation

# NUMERICS: §6 - the one layout table lives in layouts.GEMM_LAYOUTS; these views keep the old names.
LAYOUTS = {name: lay.consumes for name, lay in GEMM_LAYOUTS.items()}
METHODS = ("auto",) + GEMM_METHODS
AUTO_METHOD = {name: row.gemm_methods[0] for name, row in SCHEMES.items()}
METHODS_FOR_SCHEME = {name: tuple(m for m in GEMM_METHODS if m in row.gemm_methods) for name, row in SCHEMES.items()}
OUT_DTYPES = spec.OUT_DTYPES
# Decoders of stored scale bytes by scale format (fp32 sinv is used as is).
_SCALE_DECODE = {"fp32": lambda s: s.to(torch.float32), "ue8m0": casts.e8m0_decode,
                 "e4m3": lambda s: casts.decode(s, E4M3)}

# fp64 elements per (block, M, N) partial-product chunk: bounds memory of the per-block paths.
_CHUNK_ELEMENTS = 1 << 23
_F32 = torch.finfo(torch.float32)
_F64_SIG_BITS = 1 - int(math.log2(torch.finfo(torch.float64).eps))  # 53 significant bits
_FP32_SIG_BITS = 1 - int(math.log2(_F32.eps))  # 24
# 2^-149: the fp32 subnormal grid, below which no partial sum is exact.
_FP32_MIN_SUBNORMAL_EXP = int(math.log2(_F32.smallest_normal)) + int(math.log2(_F32.eps))
# NUMERICS: §6 exact-representable mode: sum |t| <= 2^24 q (2^13 q for Hopper fast accumulation).
EXACT_SUM_BITS = _FP32_SIG_BITS
EXACT_SUM_BITS_FAST_ACCUM = 13


@dataclass(frozen=True)
class Operand:
    """One GEMM operand as consumed: K-contiguous rows and per-(row, K-block) decode scales.

    `values` (R, K) fp64 are the exact decoded elements; `scale` (R, nb) fp32 the exact block decode
    scales (None for per-tensor); `global_scale` the per-tensor sinv (fp32 [1]); `amax` the NVFP4
    global amax of the consumed copy ([1], or [R] when row-scaled); `rht` whether that copy is in the
    Hadamard domain; `e4m3_max` the NVFP4 copy's E4M3 maximum (448, or 256 for 4over6, §5.10).
    """

    name: str
    orientation: str
    values: torch.Tensor
    scale: torch.Tensor | None
    block: int | None
    two_d: bool
    global_scale: torch.Tensor | None
    amax: torch.Tensor | None
    rht: bool
    e4m3_max: int = 448
    row_scaled: bool = False

    @property
    def rows(self) -> int:
        return self.values.shape[0]

    @property
    def depth(self) -> int:
        return self.values.shape[1]


# ---- operand extraction ------------------------------------------------------------------------


def operand(q: QuantizedTensor, orientation: str, *, name: str = "a", layout: str = "TN") -> Operand:
    """Decode the copy `orientation` of `q` into its K-contiguous GEMM form (docs/numerics.md §1, §3, §4, §5.9).

    Generic over the copy's `CopyGeometry`: the consumed rows are data rows, or data columns when
    the blocks run along data rows (MXFP8 colwise, §3); scales are brought to one entry per
    (consumed row, K block).
    """
    lay = spec.gemm_layout(layout)
    spec.check_quantized(q, orientation, name=name,
                         why=f"layout {lay.name} consumes {name}'s {orientation} copy (quantize it with {orientation}=True)")
    cfg, row = q.config, q.config.scheme_row
    g = copy_geometry(cfg, orientation, q.m, q.k)
    data, scale = getattr(q, f"{orientation}_data"), getattr(q, f"{orientation}_scale")
    codes = casts.unpack_nibbles(data) if g.codes_per_byte == 2 else data  # NUMERICS: §5.4 two codes per byte
    vals = casts.decode(codes, cfg.element_format)  # data coordinates [rows, cols]
    sc: torch.Tensor | None = None
    gscale: torch.Tensor | None = None
    if g.per_tensor:
        gscale = scale.reshape(1).to(torch.float32)  # NUMERICS: §1 one sinv for data and data_T
    else:
        vr, vc = g.scale_valid_shape
        s = _SCALE_DECODE[row.scale_format](scale[:vr, :vc])
        if g.block_major:
            s = s.t()  # NUMERICS: §4 1-D sinv stored [K block, row] -> [row, K block]
        if g.along_rows:
            vals, s = vals.t(), s.t()  # NUMERICS: §3 MXFP8 colwise: data [M, K], S_c [mb, k] -> (K, nb)
        if g.scale_block[0] > 1 and g.scale_block[1] > 1:
            s = s.repeat_interleave(cfg.block, dim=0)[: vals.shape[0]]  # NUMERICS: §4 2-D: one sinv per tile
        sc = s
    # NUMERICS: §5.2 the NVFP4 global amax (alpha, §5.8) travels with the operand.
    # NUMERICS: §5.10 row-scaled - one amax per consumed row ([M] or [K]).
    amax = getattr(q, f"{orientation}_amax").reshape(-1).to(torch.float32) if row.global_amax else None
    vals = vals.to(torch.float64).contiguous()
    return Operand(
        name=name,
        orientation=orientation,
        values=vals,
        scale=None if sc is None else sc.to(torch.float32).contiguous(),
        block=cfg.block,
        two_d=cfg.is_2d,
        global_scale=gscale,
        amax=amax,
        rht=cfg.rht and orientation == "colwise",  # NUMERICS: §5.6 RHT only on the colwise copy
        e4m3_max=cfg.e4m3_max,
        row_scaled=cfg.row_scaled,
    )


def operands(a: QuantizedTensor, b: QuantizedTensor, layout: str) -> tuple[Operand, Operand, str]:
    """Both operands of a GEMM in K-contiguous form, after the spec checks (`spec.check_gemm`); and the scheme."""
    spec.check_gemm(a, b, layout=layout, out_dtype=torch.float32)
    return _operands(a, b, layout)


def _operands(a: QuantizedTensor, b: QuantizedTensor, layout: str) -> tuple[Operand, Operand, str]:
    lay = GEMM_LAYOUTS[layout]
    return operand(a, lay.a, name="a", layout=layout), operand(b, lay.b, name="b", layout=layout), a.config.scheme


# ---- arithmetic ---------------------------------------------------------------------------------


def _expand(sc: torch.Tensor, block: int, depth: int) -> torch.Tensor:
    """(R, nb) block scales -> (R, K) per-element scales."""
    return sc.repeat_interleave(block, dim=1)[:, :depth]


def _dequantized(op: Operand) -> torch.Tensor:
    """(R, K) fp64 dec * block scale; exact (<= 4 + 24 significant bits, fp64 range)."""
    if op.scale is None:
        return op.values
    return op.values * _expand(op.scale.to(torch.float64), op.block, op.depth)


def _alpha(oa: Operand, ob: Operand, scheme: str) -> torch.Tensor:
    """The global-amax alpha of the two consumed copies (docs/numerics.md §5.8; the scheme module's gemm_alpha)."""
    gemm_alpha = SCHEMES[scheme].reference_module().gemm_alpha  # the scheme module owns §5.8
    if oa.row_scaled or ob.row_scaled:
        # NUMERICS: §5.10 row-scaled GEMM - TE runs the per-tensor GEMM with both amaxes set to 1.
        one = torch.ones(1, dtype=torch.float32, device=oa.amax.device)
        return gemm_alpha(one, one, oa.e4m3_max, ob.e4m3_max).reshape(()).to(torch.float32)
    return gemm_alpha(oa.amax, ob.amax, oa.e4m3_max, ob.e4m3_max).reshape(()).to(torch.float32)


def _global_factor(oa: Operand, ob: Operand, scheme: str) -> torch.Tensor | None:
    """The factor applied after the K sum, as fp64 (exact): sinv_a * sinv_b or alpha."""
    if oa.global_scale is not None:
        # NUMERICS: §6 per-tensor Y = sinv_a * sinv_b * sum dec*dec (product of two fp32 is exact in fp64).
        return oa.global_scale.to(torch.float64).reshape(()) * ob.global_scale.to(torch.float64).reshape(())
    if oa.amax is not None:
        return _alpha(oa, ob, scheme).to(torch.float64)
    return None


def _exact(oa: Operand, ob: Operand, scheme: str) -> torch.Tensor:
    """'exact': fp64 matmul of the dequantized copies, global factor, (M, N) fp64 (docs/numerics.md §6)."""
    # NUMERICS: §6 pure reference - fp64 sum (no TF32, no fp32 matmul), global factor, one RN_out.
    y = _dequantized(oa) @ _dequantized(ob).t()  # (M, N) fp64 accumulation
    g = _global_factor(oa, ob, scheme)
    return y if g is None else y * g


def _blocked(op: Operand, nb: int) -> torch.Tensor:
    """(R, K) values -> (R, nb, block), zero-padding a partial last K block (docs/numerics.md §4 edge blocks)."""
    pad = nb * op.block - op.depth
    v = op.values if pad == 0 else torch.nn.functional.pad(op.values, (0, pad))
    return v.reshape(op.rows, nb, op.block)


def _block_chunks(nb: int, m: int, n: int):
    step = max(1, _CHUNK_ELEMENTS // max(1, m * n))
    for b0 in range(0, nb, step):
        yield b0, min(nb, b0 + step)


def _block_partials(va: torch.Tensor, vb: torch.Tensor, b0: int, b1: int) -> torch.Tensor:
    """(b1-b0, M, N) fp64 per-K-block dot products of unscaled decoded values."""
    return torch.einsum("mbk,nbk->bmn", va[:, b0:b1], vb[:, b0:b1])


def _block_sum(oa: Operand, ob: Operand, scheme: str) -> torch.Tensor:
    """'block_sum': sum over K blocks of s_a * s_b * sum_k dec_a * dec_b in fp64, then alpha (docs/numerics.md §6).

    MXFP8: 32-wide blocks, D(e_a) * D(e_b); NVFP4: 16-wide blocks, s_a * s_b, alpha (§5.8). Every
    block term is exact in fp64; their fp64 sum is exact unless the terms span more than 53 bits.
    """
    if oa.depth % oa.block:
        raise SpecViolation(f"{scheme}: K={oa.depth} is not a multiple of the block {oa.block}")
    nb = oa.depth // oa.block
    va, vb = _blocked(oa, nb), _blocked(ob, nb)  # (M, nb, blk), (N, nb, blk)
    sa, sb = oa.scale.to(torch.float64), ob.scale.to(torch.float64)  # (M, nb), (N, nb)
    m, n = oa.rows, ob.rows
    y = torch.zeros((m, n), dtype=torch.float64, device=va.device)
    for b0, b1 in _block_chunks(nb, m, n):  # memory chunks only, in increasing K order
        p = _block_partials(va, vb, b0, b1)  # (nbc, M, N)
        p = p * (sa[:, b0:b1].t()[:, :, None] * sb[:, b0:b1].t()[:, None, :])  # exact: pow2 / 4-bit scales
        # NUMERICS: §6 - the block terms are added to y one at a time in increasing K order (elementwise
        # fp64 adds: the same bits on every device, also where the K sum rounds).
        for t in p:
            y = y + t
    g = _global_factor(oa, ob, scheme)
    return y if g is None else y * g  # NUMERICS: §6 alpha applied after the sum; RN_out once (epilogue)


def _blockwise_order(oa: Operand, ob: Operand) -> torch.Tensor:
    """'blockwise_order' for fp8_block, fp32 (M, N) before the epilogue (docs/numerics.md §6 Blockwise FP8).

    y = 0; for kb = 0, 1, ... (128-deep K blocks, increasing):
      p = RN(exact block sum)   (the block sum is formed in fp64: exact for E4M3, and for E5M2 unless
                                 one block's products span more than 53 bits)
      1Dx1D, 1D(a)x2D(b): y <- FMA32(RN(p * sinv_a), sinv_b, y)
      2D(a)x1D(b):        y <- FMA32(RN(p * sinv_b), sinv_a, y)
    """
    nb = -(-oa.depth // oa.block)
    va, vb = _blocked(oa, nb), _blocked(ob, nb)
    sa, sb = oa.scale, ob.scale  # (M, nb), (N, nb) fp32
    m, n = oa.rows, ob.rows
    # NUMERICS: §6 - the 1-D operand's scale is applied first, a's when both are 1-D.
    b_first = oa.two_d and not ob.two_d
    y = torch.zeros((m, n), dtype=torch.float32, device=va.device)
    for b0, b1 in _block_chunks(nb, m, n):
        p = _block_partials(va, vb, b0, b1).to(torch.float32)  # NUMERICS: §6 p = RN(block sum)
        # The K blocks are a sequential dependency of the contract (FMA chain), hence this loop.
        for j in range(b1 - b0):
            kb = b0 + j
            s_a = sa[:, kb : kb + 1].expand(m, n)  # (M, N)
            s_b = sb[:, kb].reshape(1, n).expand(m, n)  # (M, N)
            first, second = (s_b, s_a) if b_first else (s_a, s_b)
            t = p[j] * first  # NUMERICS: §6 RN(p * sinv_first), one fp32 multiply
            y = fp32.fma32(t, second, y)  # NUMERICS: §6 FMA32(., sinv_second, y), one rounding
    return y


# ---- output rounding and epilogue --------------------------------------------------------------


def _to_fp32_round_to_odd(y: torch.Tensor) -> torch.Tensor:
    """fp64 -> fp32 rounding to odd (truncate, then set the last bit if inexact).

    Rounding to odd at >= 2 extra bits, followed by RNE to a narrower format, equals one direct
    RNE: fp32 has 24 bits versus bf16's 8 and fp16's 11, and covers both formats' exponent ranges.
    """
    r = y.to(torch.float32)
    r64 = r.to(torch.float64)
    inexact = (r64 != y) & torch.isfinite(y)
    toward_zero = inexact & (r64.abs() > y.abs())
    r = torch.where(toward_zero, torch.nextafter(r, torch.zeros_like(r)), r)
    b = fp32.bits(r)
    b = torch.where(inexact, b | 1, b)
    return fp32.from_bits(b)


def round_out(y: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """RN_out: one round-to-nearest-even from fp64 or fp32 `y` to `out_dtype` (docs/numerics.md §0.1)."""
    if y.dtype == torch.float64 and out_dtype != torch.float32:
        # torch rounds fp64 -> bf16/fp16 through fp32 with RNE twice; round to odd first instead.
        y = _to_fp32_round_to_odd(y)
    return y.to(out_dtype)


def _epilogue(
    y: torch.Tensor, scheme: str, out_dtype: torch.dtype, bias: torch.Tensor | None, c: torch.Tensor | None
) -> torch.Tensor:
    """Bias, accumulate and the output rounding, per scheme (see the module docstring)."""
    if SCHEMES[scheme].round_before_accumulate:
        if bias is not None:
            # NUMERICS: §6 blockwise step 3 - bias added in fp32, then RN_out (TE reference: y += bias).
            y = y.to(torch.float32) + bias[None, :]
        z = round_out(y, out_dtype)
        if c is not None:
            # NUMERICS: §6 D = RN_out(C + RN_out(Y)); the sum of two out-dtype values is exact in fp64.
            z = round_out(c.to(torch.float64) + z.to(torch.float64), out_dtype)
        return z
    if c is not None:
        # NUMERICS: §6 NVFP4 D = RN_out(C + Y) added in fp32 (TE reference_nvfp4 qgemm: y += out.float()).
        y = y.to(torch.float32) + c.to(torch.float32)
    if bias is not None:
        # Bias in fp32 before the final rounding (cuBLASLt BIAS epilogue after alpha*AB + beta*C).
        y = y.to(torch.float32) + bias[None, :]
    return round_out(y, out_dtype)


def _resolve_method(method: str, scheme: str) -> str:
    if method not in METHODS:
        raise SpecViolation(f"method={method!r} is invalid: expected one of {METHODS}")
    if method == "auto":
        return AUTO_METHOD[scheme]
    if method not in METHODS_FOR_SCHEME[scheme]:
        raise SpecViolation(
            f"method={method!r} does not apply to {scheme}: expected one of {('auto',) + METHODS_FOR_SCHEME[scheme]}"
        )
    return method


def gemm(
    a: QuantizedTensor,
    b: QuantizedTensor,
    *,
    layout: str = "TN",
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """out[m, n] = sum_k A[m, k] * B[n, k] (+ bias[n]) (+ c[m, n]) as [M, N] in out_dtype (docs/numerics.md §6).

    See the module docstring for layouts, methods and the epilogue order.
    """
    spec.check_gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=c)
    oa, ob, scheme = _operands(a, b, layout)
    meth = _resolve_method(method, scheme)
    dev = oa.values.device
    if ob.values.device != dev:
        raise SpecViolation(f"a is on {dev} and b on {ob.values.device}: both operands must be on one device")
    bias = None if bias is None else bias.to(device=dev, dtype=torch.float32)  # exact widening
    c = None if c is None else c.to(device=dev)
    if meth == "exact":
        y = _exact(oa, ob, scheme)
    elif meth == "block_sum":
        y = _block_sum(oa, ob, scheme)
    else:
        y = _blockwise_order(oa, ob)
    if oa.row_scaled or ob.row_scaled:
        return _row_scaled_output(y, oa, ob, out_dtype, bias, c)
    return _epilogue(y, scheme, out_dtype, bias, c)


def _row_scaled_output(
    y: torch.Tensor, oa: Operand, ob: Operand, out_dtype: torch.dtype, bias: torch.Tensor | None,
    c: torch.Tensor | None,
) -> torch.Tensor:
    """The row-scaled NVFP4 GEMM output in the order of TE's kernel path (pytorch/cpp_extensions/gemm.py).

    NUMERICS: §5.10 row-scaled GEMM - y32 = RN(alpha_1 * sum) (fp32 GEMM output, amaxes set to 1);
    one vector side: y = RN(y32 * RN(A_a[m] * A_b[n])); both: y = RN(RN(y32 * A_a[m]) * A_b[n]);
    then RN(y + bias) in fp32, RN_out, and with C: D = RN_out(RN(C + RN_out(y))).
    """
    y32 = y.to(torch.float32)  # NUMERICS: §5.10 - one rounding of the fp64 reference sum to fp32
    ra = oa.amax.reshape(-1, 1)  # (M or 1, 1)
    rb = ob.amax.reshape(1, -1)  # (1, N or 1)
    if oa.row_scaled and ob.row_scaled:
        y32 = (y32 * ra) * rb  # NUMERICS: §5.10 - two fp32 multiplies, a's rows first
    else:
        y32 = y32 * (ra * rb)  # NUMERICS: §5.10 - the two amaxes folded into one fp32 factor first
    if bias is not None:
        y32 = y32 + bias[None, :]  # NUMERICS: §5.10 - bias added in fp32 after the scales
    z = round_out(y32, out_dtype)
    if c is not None:
        # NUMERICS: §5.10 - TE adds the rounded output into C (out.add_): one fp32 add, then RN_out.
        z = round_out(c.to(torch.float32) + z.to(torch.float32), out_dtype)
    return z


# ---- exact-representable mode -----------------------------------------------------------------


def _lsb_bits(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For finite non-zero fp64 u = odd * 2^e: (e, the exponent of the lowest set significand bit,
    and the number of significant bits of odd)."""
    mant, e = torch.frexp(u)  # u = mant * 2^e, 0.5 <= |mant| < 1
    i = torch.ldexp(mant.abs(), torch.full_like(e, _F64_SIG_BITS)).to(torch.int64)  # exact integer significand
    low = i & (-i)  # lowest set bit, a power of two 2^(el - 1)
    _, el = torch.frexp(low.to(torch.float64))
    tz = el.to(torch.int64) - 1
    return e.to(torch.int64) - _F64_SIG_BITS + tz, _F64_SIG_BITS - tz


def _min_lsb(u: torch.Tensor) -> int | None:
    nz = u[u != 0]
    if nz.numel() == 0:
        return None
    return int(_lsb_bits(nz)[0].min())


def fp64_sums_exact(a: QuantizedTensor, b: QuantizedTensor, layout: str = "TN", method: str = "auto"
                    ) -> tuple[bool, str]:
    """Whether every fp64 product and partial sum `gemm(a, b, method=method)` forms is exact: (ok, reason).

    When it holds, the fp64 summation order (the CPU BLAS's, cuBLAS's, einsum's) cannot change the
    result, so `gemm` gives the same bits on every device (docs/numerics.md §0.2.8). Terms:
    "blockwise_order" sums unscaled codes per 128-deep K block; "exact" and "block_sum" sum the
    block-scaled values (the per-tensor sinv is applied after the sum). Every partial sum is a
    subset sum of one output's terms t_k, all multiples of 2^q (q = min lsb of a + min lsb of b),
    so it is exact when sum_k |t_k| < 2^(q + 52); products are exact when the significand bits add
    up to at most 53.
    """
    oa, ob, scheme = operands(a, b, layout)
    return _sums_exact(oa, ob, _resolve_method(method, scheme))


_NON_FINITE = "an operand holds a non-finite value"


def _sums_exact(oa: Operand, ob: Operand, meth: str) -> tuple[bool, str]:
    """`fp64_sums_exact` of extracted operands under the resolved method `meth`."""

    def terms(op: Operand) -> torch.Tensor:
        return op.values if meth == "blockwise_order" else _dequantized(op)

    ua, ub = terms(oa), terms(ob)
    if not (bool(torch.isfinite(ua).all()) and bool(torch.isfinite(ub).all())):
        return False, _NON_FINITE
    nza, nzb = ua[ua != 0], ub[ub != 0]
    if nza.numel() == 0 or nzb.numel() == 0:
        return True, "an operand is all zero"
    la, sig_a = _lsb_bits(nza)
    lb, sig_b = _lsb_bits(nzb)
    if meth == "exact" and int(sig_a.max()) + int(sig_b.max()) > _F64_SIG_BITS:
        return False, (f"products of {int(sig_a.max())}-bit by {int(sig_b.max())}-bit significands round in fp64 "
                       f"(e.g. fp32 block scales that are not powers of two)")
    q = int(la.min()) + int(lb.min())
    s = float((ua.abs() @ ub.abs().t()).max())  # exact when below the bound (all multiples of 2^q)
    if s >= math.ldexp(1.0, q + _F64_SIG_BITS - 1):
        return False, f"a K sum spans more than 52 bits (max sum |t| = {s:.3e}, lsb 2^{q})"
    return True, f"lsb 2^{q}, max sum |t| = {s:.3e}"


def _block_terms_exact(a: QuantizedTensor, b: QuantizedTensor, block: int) -> bool:
    """Whether every `block`-deep sum of products dec(a)·dec(b) is exact in fp64 by the element formats alone:
    each product is a multiple of min_subnormal_a · min_subnormal_b and each sum is at most
    block · max_a · max_b in magnitude (E4M3: 128 · 448² · 2^18 < 2^43; E2M1 tiny; E5M2 can exceed 2^53)."""
    fa, fb = a.config.element_format, b.config.element_format
    span = block * fa.max_finite * fb.max_finite / (fa.min_subnormal * fb.min_subnormal)
    return span < 2.0**_F64_SIG_BITS


def device_independent(a: QuantizedTensor, b: QuantizedTensor, layout: str = "TN", method: str = "auto"
                       ) -> tuple[bool, str]:
    """Whether `gemm(a, b, method=method)` gives the same bits on every device: (ok, reason).

    True when every fp64 sum is exact (`fp64_sums_exact`), and also for the block methods ("block_sum",
    "blockwise_order") whenever each K block's own sum is exact by the formats (`_block_terms_exact`): their
    block terms are then exact and are added in a fixed sequential order (docs/numerics.md §6, §0.2.8).
    Non-finite operands are not (NaN payloads may differ between devices).
    """
    oa, ob, scheme = operands(a, b, layout)  # extracted once for both checks
    meth = _resolve_method(method, scheme)
    ok, why = _sums_exact(oa, ob, meth)
    if ok or why == _NON_FINITE or meth not in ("block_sum", "blockwise_order"):
        return ok, why
    if not _block_terms_exact(a, b, oa.block):
        return False, f"a {oa.block}-deep block sum of {a.config.element_format.name} x " \
                      f"{b.config.element_format.name} products can round in fp64 ({why})"
    return True, f"exact {oa.block}-deep block terms added in K order ({why})"


def exact_representable_ok(
    a: QuantizedTensor, b: QuantizedTensor, *, layout: str = "TN", fast_accum: bool = False
) -> tuple[bool, str]:
    """Whether (a, b) meet docs/numerics.md §6's exact-representable conditions: (ok, reason).

    Checks, with t = dec(a) * dec(b) * scale_a * scale_b (per-tensor: sinv; fp8_block: block sinv;
    MXFP8: D(e); NVFP4: s_blk) and q = 2^(min lsb of the scaled a values + min lsb of the scaled b
    values), a common power of two dividing every t:
      1. sum_k |t_k| <= 2^24 q for every output (2^13 q with `fast_accum`, Hopper FP8 fast accumulation);
      2. NVFP4: alpha is a power of two;
      3. fp32 range: q (times alpha) >= 2^-149 and 2^24 q (times alpha) <= FLT_MAX; per-tensor:
         sinv_a * sinv_b is exact in fp32 (cuBLASLt may pre-multiply them); per-tensor and fp8_block:
         a partial sum times one scale stays in [2^-149 grid, FLT_MAX].
    Then every partial sum in any order or blocking is exact, and every method of `gemm` (and every
    correct kernel) returns RN_out(Y) bit for bit. Non-finite values fail the check.
    """
    oa, ob, scheme = operands(a, b, layout)
    ua, ub = _dequantized(oa), _dequantized(ob)
    if oa.global_scale is not None:
        ua = ua * oa.global_scale.to(torch.float64)
        ub = ub * ob.global_scale.to(torch.float64)
    if not (bool(torch.isfinite(ua).all()) and bool(torch.isfinite(ub).all())):
        return False, "an operand holds a non-finite value (NaN/Inf code or scale)"
    la, lb = _min_lsb(ua), _min_lsb(ub)
    if la is None or lb is None:
        return True, "an operand is all zero: Y = 0 exactly"
    q_exp = la + lb
    sum_bits = EXACT_SUM_BITS_FAST_ACCUM if fast_accum else EXACT_SUM_BITS
    bound = math.ldexp(1.0, q_exp + sum_bits)
    s = (ua.abs() @ ub.abs().t()).max().item()  # exact when within the bound (all multiples of q)
    if s > bound:
        return False, f"max_n sum_k |t_k| = {s!r} exceeds 2^{sum_bits} q = 2^{q_exp + sum_bits}"
    g_exp = 0
    if oa.amax is not None:
        alpha = float(_alpha(oa, ob, scheme))
        mant, g_exp = math.frexp(alpha)
        if alpha <= 0 or mant != 0.5:
            return False, f"alpha = {alpha!r} is not a power of two (docs/numerics.md §6: use A_g = 2688 or 21504)"
        g_exp -= 1
    if q_exp + g_exp < _FP32_MIN_SUBNORMAL_EXP or q_exp < _FP32_MIN_SUBNORMAL_EXP:
        return False, f"q = 2^{q_exp} (alpha 2^{g_exp}) is below the fp32 grid 2^{_FP32_MIN_SUBNORMAL_EXP}"
    if max(bound, math.ldexp(bound, g_exp)) > FLT_MAX:
        return False, f"2^{sum_bits} q = 2^{q_exp + sum_bits} (alpha 2^{g_exp}) exceeds the fp32 range"
    if oa.global_scale is not None:
        sa, sb = oa.global_scale.to(torch.float64), ob.global_scale.to(torch.float64)
        prod = sa * sb
        if bool((prod.to(torch.float32).to(torch.float64) != prod).any()):
            return False, "sinv_a * sinv_b is not exact in fp32"
        scales = torch.cat([sa, sb])
    elif SCHEMES[scheme].scale_format == "fp32":  # fp32 block sinv (not a pow2 byte format)
        scales = torch.cat([oa.scale.reshape(-1), ob.scale.reshape(-1)]).to(torch.float64)
    else:
        scales = None
    if scales is not None:
        smin, smax = float(scales.min()), float(scales.max())
        if (
            smin <= 0
            or bound / smin > FLT_MAX
            or math.ldexp(1.0, q_exp) / smax < math.ldexp(1.0, _FP32_MIN_SUBNORMAL_EXP)
        ):
            return False, "a partial sum times one scale leaves the fp32 range (scales too small or too large)"
    return True, f"q = 2^{q_exp}, max sum |t| = {s!r} <= 2^{q_exp + sum_bits}"


# ---- cuBLASLt epilogues: GELU with its auxiliary output, dGELU, bias gradient ---------------------
# Source: docs/numerics.md §12.2; cuBLASLt `cublasLtEpilogue_t` (GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADB).

EPILOGUES = ("gelu_aux", "dgelu", "bgradb")
AUX_INPUT_EPILOGUES = ("dgelu",)  # epilogues that read the forward's pre-activation (the aux matrix)
NO_BIAS_EPILOGUES = ("dgelu", "bgradb")  # the bias pointer is an output (bgradb) or unused (dgelu)
GELU_K = math.sqrt(2.0 / math.pi)  # tanh approximation: 0.5 z (1 + tanh(k (z + c z^3)))
GELU_C = 0.044715


def epilogue_rule(epilogue: str | None, *, bias: bool) -> None:
    """The epilogue rules on names (docs/numerics.md §12.2); SpecViolation if broken."""
    if epilogue is None:
        return
    if epilogue not in EPILOGUES:
        raise SpecViolation(f"epilogue={epilogue!r} is invalid: expected one of {EPILOGUES}", rule="epilogue")
    if bias and epilogue in NO_BIAS_EPILOGUES:
        raise SpecViolation(f"epilogue={epilogue!r} takes no bias input (cuBLASLt: the bias pointer is "
                            "the bias-gradient output or unused; docs/numerics.md §12.2)", rule="epilogue")


def gelu(z: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation, in fp64 (docs/numerics.md §12.2: cuBLASLt's GELU epilogue)."""
    z = z.to(torch.float64)
    return 0.5 * z * (1.0 + torch.tanh(GELU_K * (z + GELU_C * z * z * z)))


def dgelu(z: torch.Tensor) -> torch.Tensor:
    """d GELU / dz of the tanh approximation, in fp64 (docs/numerics.md §12.2)."""
    z = z.to(torch.float64)
    t = torch.tanh(GELU_K * (z + GELU_C * z * z * z))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * z * z)


def operand_row_sums(q: QuantizedTensor, orientation: str, *, layout: str = "TN", absolute: bool = False
                     ) -> torch.Tensor:
    """Σ_k (or Σ_k |.| with `absolute`) of the dequantized consumed copy, per row of its [rows, K] view, in fp64."""
    op = operand(q, orientation, layout=layout)
    v = _dequantized(op)  # (rows, K) fp64, global factors not applied
    if absolute:
        v = v.abs()
    if op.global_scale is not None:
        v = v * op.global_scale.to(torch.float64)
    if op.amax is not None:
        # NUMERICS: §12.2 - NVFP4: the operand's share of alpha, A_g / (6 * 448), applied in fp64.
        v = v * (op.amax.to(torch.float64) / (E2M1.max_finite * E4M3.max_finite))
    return v.sum(dim=1)


def gemm_epilogue(
    a: QuantizedTensor,
    b: QuantizedTensor,
    *,
    epilogue: str,
    layout: str = "TN",
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
    aux: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The GEMM with a cuBLASLt epilogue (docs/numerics.md §12.2); returns {"out", and "aux" or "bgrad"}.

    - "gelu_aux": pre = RN(α·AB + β·C + bias) (the fp32 epilogue input, as `gemm(out_dtype=float32)`);
      out = RN_out(GELU(pre)) with GELU evaluated in fp64; aux = RN_out(pre), the plain GEMM's output.
    - "dgelu": out = RN_out(RN(α·AB + β·C) · GELU'(aux)), `aux` [M, N] the forward's pre-activation, GELU' in fp64.
    - "bgradb": out = the plain GEMM; bgrad[n] = RN_out(Σ_k b̂[n, k]) over B's consumed copy (dequantized,
      NVFP4 with its half of α), summed in fp64.
    """
    epilogue_rule(epilogue, bias=bias is not None)
    if epilogue == "bgradb":
        out = gemm(a, b, layout=layout, out_dtype=out_dtype, c=c)
        lay = GEMM_LAYOUTS[layout]
        # NUMERICS: §12.2 - the bias gradient: one fp64 sum per row of B's [N, K] view, one RN_out.
        return {"out": out, "bgrad": round_out(operand_row_sums(b, lay.b, layout=layout), out_dtype)}
    # NUMERICS: §12.2 - the epilogue's input is the fp32 value after alpha, beta*C and bias.
    pre = gemm(a, b, layout=layout, out_dtype=torch.float32, bias=bias, c=c)
    if epilogue == "gelu_aux":
        return {"out": round_out(gelu(pre), out_dtype), "aux": round_out(pre.to(torch.float64), out_dtype)}
    if aux is None or tuple(aux.shape) != tuple(pre.shape):
        raise SpecViolation(f"epilogue 'dgelu' needs aux [M, N] = {list(pre.shape)}, got "
                            f"{None if aux is None else list(aux.shape)}", rule="epilogue")
    return {"out": round_out(pre.to(torch.float64) * dgelu(aux.to(pre.device)), out_dtype)}
