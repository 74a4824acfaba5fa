"""Native GEMMs on quantized operands: cuBLASLt (through nvmath) and a portable block-scaled kernel.

Source: NUMERICS.md §6 (GEMM semantics, scale modes, arch table, exact-representable mode), §3-§5
layouts, DESIGN.md §3-§4 (same signature as `reference.gemm`, `Unsupported` for hardware gaps).

`gemm(a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None, method="auto")`, with a, b
QuantizedTensors holding CUDA tensors, computes out [M, N] exactly as `reference.gemm` defines the
layouts (interfaces.md): "TN" consumes both rowwise copies (a [M, K], b [N, K]); "NN" a's rowwise and
b's colwise copy (b logical [K, N]); "NT" both colwise copies (a [K, M], b [K, N]).

Methods:
- "cublaslt": one cublasLtMatmul (native/cublaslt.py) with the scale mode of NUMERICS §6 -
  SCALAR_32F (per-tensor FP8, sm_89+), VEC128_32F / BLK128x128_32F (fp8_block, sm_90 only,
  cuBLAS >= 12.9, 2Dx2D rejected), VEC32_UE8M0 (mxfp8, sm_100+), VEC16_UE4M3 + alpha (nvfp4, sm_100+).
  Split accumulator (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 0). Per-tensor results equal
  `torch._scaled_mm(a, b.t(), sinv_a, sinv_b, use_fast_accum=False)` bit for bit.
- "cublaslt_fast_accum": the same with Hopper fast accumulation on (per-tensor FP8 only; TE's fprop
  default); bit-equal to `torch._scaled_mm(..., use_fast_accum=True)`.
- "portable": `native/cuda/block_scaled_gemm.cu` on any GPU: codes and block scales decoded in the
  kernel, fp32 accumulation in the documented order of that file's header (per output element,
  K blocks in increasing order, each block's partial sum in fp32 in increasing k, then the §6 scale
  application - fp8_block exactly FMA32(RN(p·sinv_first), sinv_second, y) - then alpha, bias, RN_out).
- "auto": "cublaslt" where the NUMERICS §6 table allows it on this device and cuBLAS (and nvmath is
  importable), else "portable". The choice depends only on (scheme, GPU arch, cuBLAS version),
  never on shapes or values: `resolve_method()` returns it with the reason, for reports.
  On an sm_90 GPU: per-tensor and fp8_block -> cublaslt; mxfp8 and nvfp4 -> portable.

Accumulate (`c`, beta = 1) and bias: cuBLASLt runs them in its epilogue (D = RN_out(Y + C + bias),
fp32, its internal rounding order undocumented). Where cuBLASLt cannot take the tensors as given (a
bias that is not exactly bf16, a C whose dtype differs from out_dtype) the epilogue is emulated:
cuBLASLt writes fp32 Y, then PyTorch applies reference.gemm's epilogue order. The portable kernel follows NUMERICS §6 per scheme (fp8_block:
bias, RN_out, then RN_out(C + RN_out(Y)); the others: RN(Y + C), RN(. + bias), RN_out, all in fp32
- the same order as reference.gemm's epilogue).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from reference import spec
from reference.formats import FORMATS, SCHEMES, QuantConfig
from reference.layouts import GEMM_LAYOUTS, copy_geometry
from reference.types import QuantizedTensor, SpecViolation, Unsupported

from .launch import launch

METHODS = ("auto", "cublaslt", "cublaslt_fast_accum", "portable")
OUT_DTYPES = (torch.bfloat16, torch.float32)
# Layout -> (orientation consumed from a, from b): a view of reference.layouts.GEMM_LAYOUTS.
LAYOUTS = {name: lay.consumes for name, lay in GEMM_LAYOUTS.items()}
PER_TENSOR = tuple(name for name, row in SCHEMES.items() if row.per_tensor)

CU_FILE = "block_scaled_gemm.cu"
KERNEL = "block_scaled_gemm"
TILE_M = TILE_N = 64  # must match BM / BN in block_scaled_gemm.cu
BLOCK_DIM = (16, 16, 1)  # TX, TY

# NUMERICS: §6 table - minimum cuBLAS (cublasLtGetVersion) per scale mode.
CUBLAS_MIN = {"per_tensor": 120000, "fp8_block": 120900, "mxfp8": 120800, "nvfp4": 120800}


def _family(scheme: str) -> str:
    return "per_tensor" if SCHEMES[scheme].per_tensor else scheme


# --------------------------------------------------------------------------------------------
# Operand views: one consumed copy, addressed as (outer index i, contraction index k)
# --------------------------------------------------------------------------------------------


@dataclass
class OperandView:
    """One consumed copy of a QuantizedTensor, as the kernels read it (NUMERICS §1, §3, §4, §5.9).

    Element (i, k) (i = output row m for a / column n for b, k = contraction index) lives at
    data[i * i_stride + k * k_stride] (8-bit codes) or in byte i * i_stride + k // 2 (4-bit, K-packed,
    even k in the low nibble). Its block scale is scale[(i // s_idiv) * s_istride + kb * s_kstride].
    """

    q: QuantizedTensor
    orientation: str
    outer: int
    k: int
    data: torch.Tensor
    i_stride: int
    k_stride: int
    scale: torch.Tensor
    s_idiv: int
    s_istride: int
    s_kstride: int
    amax: torch.Tensor | None

    @property
    def config(self) -> QuantConfig:
        return self.q.config

    @property
    def element(self) -> str:
        return self.q.config.element

    @property
    def k_contiguous(self) -> bool:
        return self.k_stride == 1  # FP4 copies are packed along K: always K-contiguous

    @property
    def is_2d(self) -> bool:
        return _is_2d_fp8_block(self.q.config)


def _is_2d_fp8_block(config: QuantConfig) -> bool:
    """A 128x128 fp8_block operand (its scale applies to a 2-D tile; NUMERICS §6 scale order)."""
    return config.is_2d and config.scheme_row.scale_per_tile


def operand_view(q: QuantizedTensor, orientation: str, name: str) -> OperandView:
    """The (i, k) addressing of `q`'s `orientation` copy; contraction over K (rowwise) or M (colwise)."""
    data = getattr(q, f"{orientation}_data")
    scale = getattr(q, f"{orientation}_scale")
    if data is None or scale is None:
        raise SpecViolation(
            f"{name}: the GEMM layout consumes the {orientation} copy, but this QuantizedTensor "
            f"({q.config.id}, shape {tuple(q.shape)}) has none; quantize with {orientation}=True"
        )
    data = data.contiguous()
    scale = scale.contiguous()
    amax = getattr(q, f"{orientation}_amax")
    # NUMERICS: §1, §3, §4, §5.9 - the copy's geometry (reference.layouts.CopyGeometry): the
    # contraction runs along data columns, or along data rows where the blocks do (MXFP8 colwise).
    g = copy_geometry(q.config, orientation, q.m, q.k)
    outer, k = (g.cols, g.rows) if g.along_rows else (g.rows, g.cols)
    ld_s = scale.shape[-1] if scale.dim() == 2 else 0
    if g.along_rows:
        i_st, k_st = 1, g.cols  # data [K, outer] row-major: (i, k) at k * cols + i
    else:
        i_st, k_st = g.cols // g.codes_per_byte, 1  # bytes per data row; FP4 packs two codes per byte
    if g.per_tensor:
        s = (1, 0, 0)  # one sinv [1] shared
    elif g.block_major or g.along_rows:
        s = (1, 1, ld_s)  # scale entry [kb, i]: fp8_block 1-D sinv, MXFP8 S_c
    else:
        s = (g.scale_block[0], ld_s, 1)  # scale entry [i // rows per entry, kb]
    return OperandView(q, orientation, outer, k, data, i_st, k_st, scale, *s, amax)


def _check_operands(a, b, layout: str, out_dtype, bias, c, method: str) -> tuple[OperandView, OperandView]:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid: expected one of {METHODS}")
    if out_dtype == torch.float16:
        # A backend gap, not bad input: the reference defines fp16 outputs; native GEMMs write bf16 or
        # fp32 (the cuBLASLt block-scaled modes and the portable kernel's epilogue).
        raise Unsupported("native GEMMs write bf16 or fp32 outputs; out_dtype=torch.float16 is not implemented")
    # The spec rules, with the reference's exceptions and messages (reference.spec).
    spec.check_gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=c)
    oa, ob = LAYOUTS[layout]
    av = operand_view(a, oa, "a")
    bv = operand_view(b, ob, "b")
    tensors = [av.data, av.scale, bv.data, bv.scale] + [t for t in (bias, c) if t is not None]
    if not torch.cuda.is_available():
        raise Unsupported("native.gemm needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    devices = {t.device for t in tensors}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise SpecViolation(
            f"native.gemm needs every operand tensor on one CUDA device; got {sorted(str(d) for d in devices)}"
        )
    return av, bv


# --------------------------------------------------------------------------------------------
# Method choice and supports()
# --------------------------------------------------------------------------------------------


def _cc(device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def cublaslt_gap(family: str, device) -> str | None:
    """Why the NUMERICS §6 cuBLASLt row cannot run on `device` (None: it can); cached per process."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cublaslt_gap(family, index)


@functools.lru_cache(maxsize=None)
def _cublaslt_gap(family: str, device: int) -> str | None:
    from . import cublaslt

    ok, why = cublaslt.available()
    if not ok:
        return why
    major, minor = _cc(device)
    sm = f"sm_{major}{minor}"
    ver = cublaslt.version()
    if family == "per_tensor" and (major, minor) < (8, 9):
        return f"per-tensor FP8 cuBLASLt GEMM needs sm_89+ (this GPU is {sm}); use method='portable'"
    if family == "fp8_block" and (major, minor) != (9, 0):
        return f"FP8 block-scaled (VEC128/BLK128x128) cuBLASLt GEMM runs on sm_90 only (this GPU is {sm}); use method='portable'"
    if family == "mxfp8" and major < 10:
        return f"MXFP8 cuBLASLt GEMM needs sm_100+ (this GPU is {sm}); use method='portable'"
    if family == "nvfp4" and major < 10:
        return f"NVFP4 cuBLASLt GEMM needs sm_100+ (this GPU is {sm}); use method='portable'"
    if ver < CUBLAS_MIN[family]:
        need = cublaslt.version_string(CUBLAS_MIN[family])
        return f"{family} cuBLASLt GEMM needs cuBLAS >= {need}, found {cublaslt.version_string(ver)}; use method='portable'"
    return None


def portable_gap() -> str | None:
    """Why the portable kernel cannot run here (None: it can)."""
    if not torch.cuda.is_available():
        return "no CUDA device visible (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401

        from . import _compile  # noqa: F401
    except Exception as e:
        return f"the portable GEMM kernel needs CuPy and native._compile ({e!r}); install the 'gpu' extra"
    return None


def resolve_method(config: QuantConfig, method: str = "auto", device=None) -> tuple[str, str]:
    """(method that runs, why) for a scheme on `device`; raises Unsupported if it cannot run."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid: expected one of {METHODS}")
    if not torch.cuda.is_available():
        raise Unsupported("native.gemm needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    family = _family(config.scheme)
    if method == "cublaslt_fast_accum" and family != "per_tensor":
        raise Unsupported(
            f"fast accumulation is a per-tensor FP8 option (NUMERICS.md §6); {config.id} uses the split accumulator"
        )
    if method in ("cublaslt", "cublaslt_fast_accum"):
        gap = cublaslt_gap(family, device)
        if gap:
            raise Unsupported(gap)
        return method, f"{method}: {family} scale mode on sm_{''.join(map(str, _cc(device)))}"
    if method == "portable":
        gap = portable_gap()
        if gap:
            raise Unsupported(gap)
        return "portable", "portable block-scaled kernel (NUMERICS.md §6 portable order)"
    gap = cublaslt_gap(family, device)
    if gap is None:
        return "cublaslt", f"auto -> cublaslt ({family} on sm_{''.join(map(str, _cc(device)))})"
    pgap = portable_gap()
    if pgap:
        raise Unsupported(f"no native GEMM for {config.id}: {gap}; portable: {pgap}")
    return "portable", f"auto -> portable ({gap})"


def supports_gemm(config: QuantConfig, device=None, method: str = "auto") -> tuple[bool, str]:
    """(True, which method runs and why) or (False, reason); never raises for a missing GPU/library."""
    try:
        _, why = resolve_method(config, method, device)
    except Unsupported as e:
        return False, str(e)
    except Exception as e:  # e.g. a broken CUDA install
        return False, f"native GEMM unavailable: {e!r}"
    return True, why


# --------------------------------------------------------------------------------------------
# gemm
# --------------------------------------------------------------------------------------------


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
    """out [M, N] = a·bᵀ with the operands' scales (NUMERICS.md §6); see the module docstring."""
    av, bv = _check_operands(a, b, layout, out_dtype, bias, c, method)
    device = av.data.device
    resolved, _ = resolve_method(a.config, method, device)
    with torch.cuda.device(device):
        if resolved == "portable":
            return _portable(av, bv, out_dtype, bias, c)
        return _cublaslt(av, bv, out_dtype, bias, c, fast_accum=resolved == "cublaslt_fast_accum")


def _alpha(av: OperandView, bv: OperandView) -> torch.Tensor | None:
    """NVFP4 global alpha from the consumed copies' amaxes (NUMERICS §5.8), fp32 [1] on the device."""
    if not av.config.scheme_row.global_amax:
        return None
    if av.amax is None or bv.amax is None:
        raise SpecViolation("nvfp4 GEMM needs the amax of each consumed copy (NUMERICS.md §5.8 alpha)")
    from reference.nvfp4 import gemm_alpha

    return gemm_alpha(av.amax, bv.amax).reshape(1).to(torch.float32).contiguous()


# ---- portable kernel ------------------------------------------------------------------------


def _element_defines(prefix: str, element: str) -> dict[str, int]:
    """B_* element-format defines for block_scaled_gemm.cu, from the formats.py row."""
    fmt = FORMATS[element]
    all_ones = (1 << fmt.exp_bits) - 1
    has_inf = int(fmt.inf_code is not None)
    # A format whose only NaN encoding is its max code (E2M1) has no NaN code to decode.
    nan = fmt.nan_code if (fmt.nan_code is not None and not has_inf and fmt.nan_code != fmt.max_code) else -1
    assert not has_inf or ((fmt.max_code >> fmt.man_bits) & all_ones) != all_ones
    return {
        f"{prefix}_BITS": fmt.bits,
        f"{prefix}_EXP_BITS": fmt.exp_bits,
        f"{prefix}_MAN_BITS": fmt.man_bits,
        f"{prefix}_BIAS": fmt.bias,
        f"{prefix}_HAS_INF": has_inf,
        f"{prefix}_NAN_CODE": nan,
    }


def kernel_defines(a_config: QuantConfig, b_config: QuantConfig, out_dtype: torch.dtype) -> dict[str, int | float | str]:
    """defines_for(a's config) + B's element format + the GEMM options of block_scaled_gemm.cu."""
    from ._compile import defines_for

    d = dict(defines_for(a_config))
    d.update(_element_defines("A", a_config.element))
    d.update(_element_defines("B", b_config.element))
    # NUMERICS: §6 blockwise - 2D(a) x 1D(b) applies b's (the 1-D operand's) scale first.
    d["SCALE_B_FIRST"] = int(_is_2d_fp8_block(a_config) and not _is_2d_fp8_block(b_config))
    d["OUT_BF16"] = int(out_dtype == torch.bfloat16)
    return d


def _portable(av: OperandView, bv: OperandView, out_dtype, bias, c) -> torch.Tensor:
    import numpy as np

    from ._compile import load_module

    m, n, k = av.outer, bv.outer, av.k
    device = av.data.device
    out = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return out
    alpha = _alpha(av, bv)
    bias32 = None if bias is None else bias.to(torch.float32).contiguous()  # exact widening
    c32 = None if c is None else c.to(torch.float32).contiguous()  # exact for bf16/fp16/fp32 C
    # NUMERICS: §6 epilogue - fp8_block: bias, RN_out, D = RN_out(C + RN_out(Y)); the others:
    # RN(Y + C) in fp32, then RN(. + bias), then RN_out (reference.gemm's order).
    epilogue = 1 if av.config.scheme_row.round_before_accumulate else 0
    dev_index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(dev_index):
        module = load_module(CU_FILE, kernel_defines(av.config, bv.config, out_dtype))
    grid = (math.ceil(n / TILE_N), math.ceil(m / TILE_M), 1)
    args = (
        av.data, np.int64(av.i_stride), np.int64(av.k_stride), av.scale,
        np.int64(av.s_idiv), np.int64(av.s_istride), np.int64(av.s_kstride),
        bv.data, np.int64(bv.i_stride), np.int64(bv.k_stride), bv.scale,
        np.int64(bv.s_idiv), np.int64(bv.s_istride), np.int64(bv.s_kstride),
        alpha, bias32, c32, np.int32(epilogue), out,
        np.int64(m), np.int64(n), np.int64(k),
    )  # fmt: skip
    launch(module, KERNEL, grid, BLOCK_DIM, args, dev_index)
    # Keep the temporaries alive until the kernel has run on torch's stream.
    for t in (alpha, bias32, c32):
        if t is not None:
            t.record_stream(torch.cuda.current_stream(device))
    return out


# ---- cuBLASLt -------------------------------------------------------------------------------


def _lt_operand(v: OperandView, lt_mod):
    """An LtOperand for one view: the scale tensor in the layout cuBLASLt expects for its mode."""
    scheme = v.config.scheme
    if v.config.scheme_row.per_tensor:
        scale, mode = v.scale.to(torch.float32).reshape(1), lt_mod.SCALAR_32F
    elif scheme == "fp8_block":
        # NUMERICS: §4 - the stored sinv layouts are the ones cuBLASLt reads (TE passes them
        # unchanged): 1-D [ceil(K/128), roundup(outer,4)] entry [kb, i]; 2-D [ceil(outer/128),
        # roundup(ceil(K/128),4)] entry [ib, kb].
        scale, mode = v.scale, (lt_mod.BLK128x128_32F if v.config.is_2d else lt_mod.VEC128_32F)
    else:
        from reference.layouts import swizzle_scales

        # NUMERICS: §3 / §5.9 swizzled scales (MXFP8 colwise: S_c transposed; NVFP4 as is).
        scale = swizzle_scales(v.q, v.orientation).contiguous()
        mode = lt_mod.VEC32_UE8M0 if scheme == "mxfp8" else lt_mod.VEC16_UE4M3
    if v.k_contiguous:
        ld = v.i_stride * copy_geometry(v.config, v.orientation, v.q.m, v.q.k).codes_per_byte  # in elements
    else:
        ld = v.k_stride
    return lt_mod.LtOperand(v.data, v.element, v.outer, v.k_contiguous, ld, scale, mode)


def _bf16_exact(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.to(torch.bfloat16).to(t.dtype), t))


def _cublaslt(av: OperandView, bv: OperandView, out_dtype, bias, c, *, fast_accum: bool) -> torch.Tensor:
    from . import cublaslt as lt_mod

    m, n, k = av.outer, bv.outer, av.k
    device = av.data.device
    family = _family(av.config.scheme)
    if av.element == "e5m2" and bv.element == "e5m2":
        raise Unsupported("cuBLASLt FP8 GEMMs do not support e5m2 x e5m2 (cuBLAS FP8 type table); use method='portable'")
    if not (av.k_contiguous and bv.k_contiguous) and (family != "mxfp8"):
        raise Unsupported(f"{family} cuBLASLt GEMM needs K-contiguous operands (TN only, NUMERICS.md §6)")
    if family == "fp8_block" and (k % 16 or m % 8 or n % 8):
        # TE cublaslt_gemm.cu: lda, ldb % 16 == 0 and the outer dims % 8 == 0 for block scaling.
        raise Unsupported(
            f"fp8_block cuBLASLt GEMM needs K % 16 == 0 and M, N % 8 == 0 (got M={m}, N={n}, K={k}); use method='portable'"
        )
    alpha_t = _alpha(av, bv)
    alpha = float(alpha_t.item()) if alpha_t is not None else 1.0  # exact fp32 value, host pointer mode
    la, lb = _lt_operand(av, lt_mod), _lt_operand(bv, lt_mod)

    bias_lt = None
    if bias is not None and (bias.dtype == torch.bfloat16 or _bf16_exact(bias)):
        bias_lt = bias.to(torch.bfloat16).contiguous()  # exact
    c_native = c is not None and (c.dtype == out_dtype or (out_dtype == torch.float32 and c.dtype != torch.float64))
    emulate = (bias is not None and bias_lt is None) or (c is not None and not c_native)
    if not emulate:
        if c is not None:
            out = c.to(out_dtype).contiguous().clone()  # exact (same dtype, or widening to fp32)
        else:
            out = torch.empty((m, n), dtype=out_dtype, device=device)
        return lt_mod.scaled_matmul(la, lb, k, out, accumulate=c is not None, bias=bias_lt, alpha=alpha, fast_accum=fast_accum)
    # Emulated epilogue: fp32 Y from cuBLASLt, then RN(Y + C), RN(. + bias), RN_out (reference.gemm's
    # order for every scheme cuBLASLt runs here but fp8_block, whose order is RN_out(C + RN_out(Y + bias))).
    y = torch.empty((m, n), dtype=torch.float32, device=device)
    lt_mod.scaled_matmul(la, lb, k, y, alpha=alpha, fast_accum=fast_accum)
    if family == "fp8_block":
        if bias is not None:
            y = y + bias.to(torch.float32)  # NUMERICS: §6 blockwise bias in fp32, then RN_out
        z = y.to(out_dtype)
        return z if c is None else (c.to(torch.float32) + z.to(torch.float32)).to(out_dtype)
    if c is not None:
        y = y + c.to(torch.float32)  # NUMERICS: §6 C added in fp32
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)
