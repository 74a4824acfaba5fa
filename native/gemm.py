"""Native GEMMs on quantized operands: cuBLASLt (through nvmath) and a portable block-scaled kernel.

Source: docs/numerics.md §6 (GEMM semantics, scale modes, arch table, exact-representable mode), §3-§5
layouts, docs/design.md §3-§4 (same signature as `reference.gemm`, `Unsupported` for hardware gaps).

`gemm(a, b, *, layout="TN", out_dtype=torch.bfloat16, bias=None, c=None, method="auto", out=None)`, with a, b
QuantizedTensors holding CUDA tensors, computes out [M, N] exactly as `reference.gemm` defines the
layouts (docs/adapters.md §3): "TN" consumes both rowwise copies (a [M, K], b [N, K]); "NN" a's rowwise and
b's colwise copy (b logical [K, N]); "NT" both colwise copies (a [K, M], b [K, N]).

Methods:
- "cublaslt": one cublasLtMatmul (native/cublaslt.py) with the scale mode of docs/numerics.md §6 -
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
- `gemm_epilogue(a, b, *, epilogue, ...)` (docs/numerics.md §12.2): GELU_AUX[_BIAS] / DGELU / BGRADA in the same
  cublasLtMatmul, where the GEMM runs on cuBLASLt; Unsupported on the portable kernel.
- "auto": "cublaslt" where the docs/numerics.md §6 table allows it on this device and cuBLAS (and nvmath is
  importable), else "portable". The choice depends only on (scheme, GPU arch, cuBLAS version),
  never on shapes or values: `resolve_method()` returns it with the reason, for reports.
  On an sm_90 GPU: per-tensor and fp8_block -> cublaslt; mxfp8 and nvfp4 -> portable.

Accumulate (`c`, beta = 1) and bias: cuBLASLt runs them in its epilogue (D = RN_out(Y + C + bias),
fp32, its internal rounding order undocumented). Where cuBLASLt cannot take the tensors as given (a
bias that is not exactly bf16, a C whose dtype differs from out_dtype) the epilogue is emulated:
cuBLASLt writes fp32 Y, then PyTorch applies reference.gemm's epilogue order. The portable kernel follows docs/numerics.md §6 per scheme (fp8_block:
bias, RN_out, then RN_out(C + RN_out(Y)); the others: RN(Y + C), RN(. + bias), RN_out, all in fp32
- the same order as reference.gemm's epilogue).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from reference.formats import FORMATS, QuantConfig
from reference.gemm import EPILOGUES, epilogue_rule
from reference.layouts import CopyGeometry, gemm_layout, geometry_of
from reference.spec import check_gemm
from reference.types import QuantizedTensor, SpecViolation, Unsupported

from .kernels import Patched
from .launch import PreparedLaunch, device_index, launch, raw_stream
from .launchers import CublasLtMode, launcher
from .plan import GEMM_PLANS, current_device, empty_from

METHODS = ("auto", "cublaslt", "cublaslt_fast_accum", "portable")
OUT_DTYPES = (torch.bfloat16, torch.float32)

CU_FILE = "block_scaled_gemm.cu"
KERNEL = "block_scaled_gemm"
TILE_M = TILE_N = 64  # must match BM / BN in block_scaled_gemm.cu
BLOCK_DIM = (16, 16, 1)  # TX, TY


# --------------------------------------------------------------------------------------------
# Operand views: one consumed copy, addressed as (outer index i, contraction index k)
# --------------------------------------------------------------------------------------------


@dataclass
class OperandView:
    """One consumed copy of a QuantizedTensor, as the kernels read it (docs/numerics.md §1, §3, §4, §5.9).

    Element (i, k) (i = output row m for a / column n for b, k = contraction index) lives at
    data[i * i_stride + k * k_stride] (8-bit codes) or in byte i * i_stride + k // 2 (4-bit, K-packed,
    even k in the low nibble). Its block scale is scale[(i // s_idiv) * s_istride + kb * s_kstride].
    """

    q: QuantizedTensor
    orientation: str
    geometry: CopyGeometry
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
        return self.k_stride == 1

    @property
    def is_2d(self) -> bool:
        """One scale entry governs a 2-D tile of this copy (docs/numerics.md §4 128x128: §6 scale order)."""
        sb = self.geometry.scale_block
        return sb is not None and sb[0] > 1 and sb[1] > 1


def operand_view(q: QuantizedTensor, orientation: str, name: str) -> OperandView:
    """The (i, k) addressing of `q`'s `orientation` copy, from its `CopyGeometry`: contraction over the
    logical K (rowwise) or M (colwise), i.e. along the stored rows or columns of the data."""
    g = geometry_of(q, orientation)
    data = getattr(q, f"{orientation}_data")
    scale = getattr(q, f"{orientation}_scale")
    if data is None or scale is None:
        raise SpecViolation(
            f"{name}: the GEMM layout consumes the {orientation} copy, but this QuantizedTensor "
            f"({q.config.id}, shape {tuple(q.shape)}) has none; quantize with {orientation}=True"
        )
    data, scale = data.contiguous(), scale.contiguous()
    outer, k = (q.m, q.k) if orientation == "rowwise" else (q.k, q.m)
    row_bytes = g.data_shape[1]
    # NUMERICS: §1 / §4 / §5.9 the contraction runs along the stored rows' columns (rowwise copies and
    # transposed colwise ones; 4-bit codes packed along it), or down the rows (§3 MXFP8 colwise [M, K]).
    i_st, k_st = (1, row_bytes) if g.along_rows else (row_bytes, 1)
    sb = g.scale_block
    if sb is None:
        s = (1, 0, 0)  # NUMERICS: §1 one sinv [1] for the whole copy
    else:
        ld_s = scale.shape[1]
        # Scale entry of data (r, c) is (r // sb[0], c // sb[1]) ((j, i) when stored block-major, §4 1-D).
        if g.along_rows:  # r = k, c = i: entry (kb, i)
            s = (sb[1], 1, ld_s)
        elif g.block_major:  # r = i, c = k: entry (kb, i // sb[0])
            s = (sb[0], 1, ld_s)
        else:  # r = i, c = k: entry (i // sb[0], kb)
            s = (sb[0], ld_s, 1)
    return OperandView(q, orientation, g, outer, k, data, i_st, k_st, scale, *s, getattr(q, f"{orientation}_amax"))


def _check_operands(a, b, layout: str, out_dtype, bias, c, method: str) -> tuple[OperandView, OperandView]:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid: expected one of {METHODS}")
    check_gemm(a, b, layout=layout, out_dtype=out_dtype, bias=bias, c=c)  # the spec rules, as the reference
    if out_dtype not in OUT_DTYPES:
        # A backend gap, not bad input: the reference defines fp16 outputs; native GEMMs write bf16 or
        # fp32 (the cuBLASLt block-scaled modes and the portable kernel's epilogue).
        raise Unsupported(f"native GEMMs write bf16 or fp32 outputs; out_dtype={out_dtype} is not implemented")
    lay = gemm_layout(layout)
    av, bv = operand_view(a, lay.a, "a"), operand_view(b, lay.b, "b")
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


def cublaslt_gap(config: QuantConfig, device) -> str | None:
    """Why the docs/numerics.md §6 cuBLASLt row of `config`'s scheme cannot run on `device` (None: it can); cached."""
    return _cublaslt_gap(launcher(config.scheme).CUBLASLT, device_index(torch.device(device)))


@functools.lru_cache(maxsize=None)
def _cublaslt_gap(mode: CublasLtMode, device: int) -> str | None:
    from . import cublaslt

    ok, why = cublaslt.available()
    if not ok:
        return why
    cc = _cc(device)
    sm = f"sm_{cc[0]}{cc[1]}"
    if mode.only_cc is not None and cc != mode.only_cc:
        return (f"{mode.label} cuBLASLt GEMM runs on sm_{mode.only_cc[0]}{mode.only_cc[1]} only (this GPU is {sm}); "
                "use method='portable'")  # fmt: skip
    if cc < mode.min_cc:
        return (f"{mode.label} cuBLASLt GEMM needs sm_{mode.min_cc[0]}{mode.min_cc[1]}+ (this GPU is {sm}); "
                "use method='portable'")  # fmt: skip
    ver = cublaslt.version()
    if ver < mode.cublas_min:
        need = cublaslt.version_string(mode.cublas_min)
        return f"{mode.family} cuBLASLt GEMM needs cuBLAS >= {need}, found {cublaslt.version_string(ver)}; use method='portable'"
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
    mode = launcher(config.scheme).CUBLASLT
    if method == "cublaslt_fast_accum" and not mode.fast_accum:
        raise Unsupported(
            f"fast accumulation is a per-tensor FP8 option (docs/numerics.md §6); {config.id} uses the split accumulator"
        )
    if method in ("cublaslt", "cublaslt_fast_accum"):
        gap = cublaslt_gap(config, device)
        if gap:
            raise Unsupported(gap)
        return method, f"{method}: {mode.family} scale mode on sm_{''.join(map(str, _cc(device)))}"
    if method == "portable":
        gap = portable_gap()
        if gap:
            raise Unsupported(gap)
        return "portable", "portable block-scaled kernel (docs/numerics.md §6 portable order)"
    gap = cublaslt_gap(config, device)
    if gap is None:
        return "cublaslt", f"auto -> cublaslt ({mode.family} on sm_{''.join(map(str, _cc(device)))})"
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
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [M, N] = a·bᵀ with the operands' scales (docs/numerics.md §6); see the module docstring.

    The first call of a signature (`_plan_key`) runs every check and records a `GemmPlan`; later calls skip the
    checks that plan already passed (docs/design.md §4.1). A call with exactly the objects of the previous planned
    call (`_Recent`) skips building the key too.

    `out` (in place, as TE's general_gemm takes one): a contiguous CUDA tensor [M, N] of `out_dtype` on the
    operands' device that receives the result and is returned (ValueError otherwise); it must not overlap the
    operands, bias or c. Without it every call returns a fresh tensor."""
    recent = _RECENT[0]
    if recent is not None:
        if recent.same(a, b, layout, out_dtype, bias, c, method):
            return recent.plan.run(a, b, out_dtype, bias, c, out)
        _RECENT[0] = None  # (another call: the memo lets go of its tensors)
    key = _plan_key(a, b, layout, out_dtype, bias, c, method)
    try:
        plan = GEMM_PLANS.get(key) if key is not None else None
    except TypeError:  # an unhashable out_dtype or method: no plan (the full path raises the spec's error)
        key = plan = None
    if plan is not None:
        _RECENT[0] = _Recent(plan, a, b, layout, out_dtype, bias, c, method)
        return plan.run(a, b, out_dtype, bias, c, out)
    av, bv = _check_operands(a, b, layout, out_dtype, bias, c, method)
    device = av.data.device
    if out is not None:
        check_out(out, (av.outer, bv.outer), out_dtype, device)
    resolved, _ = resolve_method(a.config, method, device)
    with torch.cuda.device(device):
        result = _dispatch(av, bv, resolved, out_dtype, bias, c, checked=False)
    if key is not None:
        GEMM_PLANS.put(key, GemmPlan(av, bv, resolved, out_dtype, bias, c))
    return result if out is None else out.copy_(result)


def check_out(out, shape: tuple[int, int], out_dtype, device: torch.device) -> None:
    """gemm(..., out=): a contiguous tensor [M, N] of out_dtype on the GEMM's device, else ValueError naming what
    differs."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out= takes a torch.Tensor, got {type(out).__name__}")
    wrong = [f"{what} is {got}, expected {want}" for what, got, want in (
        ("shape", tuple(out.shape), shape), ("dtype", out.dtype, out_dtype), ("device", out.device, device),
        ("contiguous", out.is_contiguous(), True)) if got != want]  # fmt: skip
    if wrong:
        raise ValueError(f"out= does not fit this GEMM: {'; '.join(wrong)}")


class _Recent:
    """The arguments of the last planned GEMM call and its plan, compared by identity (`same`): the same
    QuantizedTensor objects with the same consumed field tensors, config, shape and input dtype, the same bias / C
    objects and equal layout, out_dtype and method - everything its key was built from - so the call is that
    plan's signature again. The operands, bias and C are held by weak reference, their consumed tensors until the
    next GEMM call or the death of an operand (the memo keeps nothing alive beyond that); valid while all of them
    live and the plan cache is not cleared (`PlanCache.generation`). A tensor's shape changed in place (`resize_`,
    `set_`) between two such calls is not seen (the plan's launch reads the shapes it was built for); `t_()` /
    `as_strided_()` are (the run re-checks contiguity)."""

    __slots__ = ("plan", "generation", "a", "b", "bias", "c", "fields", "meta", "__weakref__")

    def __init__(self, plan, a, b, layout, out_dtype, bias, c, method):
        self.plan, self.generation = plan, GEMM_PLANS.generation
        dead = _dead_callback(self)
        self.a, self.b = weakref.ref(a, dead), weakref.ref(b, dead)
        self.bias = _NONE if bias is None else weakref.ref(bias, dead)
        self.c = _NONE if c is None else weakref.ref(c, dead)
        (da, sa, ma), (db, sb, mb) = plan.consumed
        self.fields = (getattr(a, da), getattr(a, sa), getattr(a, ma), getattr(b, db), getattr(b, sb), getattr(b, mb))
        self.meta = (layout, out_dtype, method, a.config, a.shape, a.hp_dtype, b.config, b.shape, b.hp_dtype)

    def same(self, a, b, layout, out_dtype, bias, c, method) -> bool:
        m = self.meta
        if not (self.a() is a and self.b() is b and self.bias() is bias and self.c() is c and out_dtype is m[1]
                and self.generation == GEMM_PLANS.generation and type(layout) is str and layout == m[0]
                and type(method) is str and method == m[2]):  # fmt: skip
            return False
        (da, sa, ma), (db, sb, mb) = self.plan.consumed
        f = self.fields
        return (getattr(a, da) is f[0] and getattr(a, sa) is f[1] and getattr(a, ma) is f[2]
                and getattr(b, db) is f[3] and getattr(b, sb) is f[4] and getattr(b, mb) is f[5]
                and a.config is m[3] and a.shape is m[4] and a.hp_dtype is m[5]
                and b.config is m[6] and b.shape is m[7] and b.hp_dtype is m[8])  # fmt: skip


def _dead_callback(recent: _Recent):
    """The weak-reference callback of `recent`'s objects: one died, so never match again (a dead reference reads
    None, as an absent bias would) and let go of the consumed tensors."""
    ref = weakref.ref(recent)  # (the callback must not keep the memo alive)

    def dead(_):
        r = ref()
        if r is not None:
            r.generation, r.fields = -1, ()

    return dead


def _none() -> None:
    return None


_NONE = _none  # the "weak reference" of an absent bias or C: dereferences to None
_RECENT: list[_Recent | None] = [None]  # (one slot: replaced whole, so a reader sees one consistent _Recent)


def _dispatch(av: OperandView, bv: OperandView, resolved: str, out_dtype, bias, c, *, checked: bool,
              portable: PreparedLaunch | None = None) -> torch.Tensor:  # fmt: skip
    """The GEMM of checked operand views by the resolved method (`checked`: the cuBLASLt operand gaps were
    found absent by an earlier call of this signature)."""
    if av.config.row_scaled or bv.config.row_scaled:
        return _row_scaled(av, bv, resolved, out_dtype, bias, c)
    if resolved == "portable":
        return _portable(av, bv, out_dtype, bias, c, prepared=portable)
    return _cublaslt(av, bv, out_dtype, bias, c, fast_accum=resolved == "cublaslt_fast_accum", checked=checked)


# ---- the cached call plan (native.plan) ---------------------------------------------------------


def _tensor_key(t) -> tuple | None:
    return None if t is None else (t.shape, t.dtype, t.device)


_FIELDS = {o: (f"{o}_data", f"{o}_scale", f"{o}_amax") for o in ("rowwise", "colwise")}


def _operand_key(q: QuantizedTensor, orientation: str) -> tuple:
    data, scale, amax = _FIELDS[orientation]
    # The shape's element types too: check_quantized takes only ints, and (256,) == (np.int64(256),).
    return (q.config, q.shape, tuple(map(type, q.shape)), q.hp_dtype, orientation, _tensor_key(getattr(q, data)),
            _tensor_key(getattr(q, scale)), _tensor_key(getattr(q, amax)))  # fmt: skip


def _plan_key(a, b, layout, out_dtype, bias, c, method) -> tuple | None:
    """The GEMM plan key (docs/design.md §4.1): everything check_gemm, _check_operands and resolve_method read -
    both configs, logical shapes and input dtypes, the consumed copies' shapes, dtypes and devices, the layout,
    out_dtype, method and the bias / C shapes, dtypes and devices; None when the call cannot have one."""
    if type(a) is not QuantizedTensor or type(b) is not QuantizedTensor or type(a.shape) is not tuple \
            or type(b.shape) is not tuple:  # fmt: skip
        return None
    try:
        lay = gemm_layout(layout)
        # (hashed once, by the cache's get: gemm() treats a TypeError there as "no plan")
        return (lay.name, out_dtype, method, _operand_key(a, lay.a), _operand_key(b, lay.b), _tensor_key(bias),
                _tensor_key(c))  # fmt: skip
    except (SpecViolation, AttributeError, TypeError):  # the full path raises the spec's error for such input
        return None


class GemmPlan:
    """One GEMM call signature, checked once: the consumed copies' addressing (`OperandView` without its tensors),
    the resolved method and, for the portable kernel, its prepared launch (docs/design.md §4.1)."""

    def __init__(self, av: OperandView, bv: OperandView, resolved: str, out_dtype, bias, c):
        self.views = tuple(
            (f"{v.orientation}_data", f"{v.orientation}_scale", f"{v.orientation}_amax", v.orientation, v.geometry,
             v.outer, v.k, v.i_stride, v.k_stride, v.s_idiv, v.s_istride, v.s_kstride)
            for v in (av, bv)
        )  # fmt: skip
        self.resolved = resolved
        self.device = av.data.device
        self.index = device_index(self.device)
        self.portable = None
        if resolved == "portable" and not (av.config.row_scaled or bv.config.row_scaled):
            self.portable = _prepare_portable(av, bv, out_dtype, bias, c, self.index)
        self.matmul = _prepare_matmul(av, bv, resolved, out_dtype, bias, c, self.index)
        self.out_shape = (av.outer, bv.outer)
        self._out_like: dict = {}  # the template of a fresh output (`empty_from`), made by the first one
        self.fields = tuple(name for spec in self.views for name in spec[:2])  # a_data, a_scale, b_data, b_scale
        self.consumed = tuple(spec[:3] for spec in self.views)  # each operand's consumed data, scale, amax fields
        if self.portable is not None:  # the parameter slot of each patched role (written straight into the block)
            slot = {mk.role: i for i, mk in self.portable.patched}
            self._slots = tuple(slot[r] for r in ("a_data", "a_scale", "b_data", "b_scale", "out"))
            self._optional = tuple((slot[r], r) for r in ("amax_a", "amax_b", "bias", "c") if r in slot)

    def _view(self, q: QuantizedTensor, spec) -> OperandView:
        data_f, scale_f, amax_f, orientation, g, outer, k, i_st, k_st, s_idiv, s_is, s_ks = spec
        return OperandView(q, orientation, g, outer, k, getattr(q, data_f).contiguous(), i_st, k_st,
                           getattr(q, scale_f).contiguous(), s_idiv, s_is, s_ks, getattr(q, amax_f))  # fmt: skip

    def run(self, a: QuantizedTensor, b: QuantizedTensor, out_dtype, bias, c, out=None) -> torch.Tensor:
        """This signature's GEMM into a fresh tensor or into `out` (checked per call: `check_out`)."""
        if out is not None:
            if not (type(out) is torch.Tensor and out.dtype is out_dtype and out.shape == self.out_shape
                    and out.device == self.device and out.is_contiguous()):  # fmt: skip
                check_out(out, self.out_shape, out_dtype, self.device)
        if self.matmul is not None or self.portable is not None:
            a_data, a_scale, b_data, b_scale = self.fields
            ts = (t0 := getattr(a, a_data), t1 := getattr(a, a_scale), t2 := getattr(b, b_data), t3 := getattr(b, b_scale))
            # (else the views' .contiguous() copies: the general path)
            if t0.is_contiguous() and t1.is_contiguous() and t2.is_contiguous() and t3.is_contiguous():
                call = self._matmul if self.matmul is not None else self._portable
                if current_device() != self.index:
                    with torch.cuda.device(self.device):
                        return call(ts, a, b, out_dtype, bias, c, out)
                return call(ts, a, b, out_dtype, bias, c, out)
        av, bv = self._view(a, self.views[0]), self._view(b, self.views[1])
        if current_device() != self.index:
            with torch.cuda.device(self.device):
                result = _dispatch(av, bv, self.resolved, out_dtype, bias, c, checked=True, portable=self.portable)
        else:
            result = _dispatch(av, bv, self.resolved, out_dtype, bias, c, checked=True, portable=self.portable)
        return result if out is None else out.copy_(result)

    def _fresh_out(self, out_dtype) -> torch.Tensor:
        """A fresh contiguous [M, N] output of out_dtype (the plan key's)."""
        return empty_from(self._out_like, self.device, self.out_shape, out_dtype)

    def _matmul(self, ts, a, b, out_dtype, bias, c, out=None) -> torch.Tensor:
        """The prepared cublasLtMatmul (`_prepare_matmul`): one output allocation (none with `out`), one call."""
        if out is None:
            out = self._fresh_out(out_dtype)
        a_data, a_scale, b_data, b_scale = ts
        self.matmul(a_data.data_ptr(), a_scale.data_ptr(), b_data.data_ptr(), b_scale.data_ptr(), out.data_ptr(),
                    raw_stream(self.index))  # fmt: skip
        return out

    def _portable(self, ts, a, b, out_dtype, bias, c, out=None) -> torch.Tensor:
        """`_portable`'s planned launch without building the operand views: one output allocation (none with
        `out`), one launch (the amaxes, bias and C widened to fp32 exactly as `_portable` does; only its
        temporaries are recorded on the stream)."""
        device = self.device
        if out is None:
            out = self._fresh_out(out_dtype)
        a_data, a_scale, b_data, b_scale = ts
        prepared = self.portable
        buf, pointers = prepared.block()  # this thread's parameter block: the pointers go straight into their slots
        s0, s1, s2, s3, s4 = self._slots
        buf[s0], buf[s1], buf[s2], buf[s3], buf[s4] = (a_data.data_ptr(), a_scale.data_ptr(), b_data.data_ptr(),
                                                       b_scale.data_ptr(), out.data_ptr())  # fmt: skip
        temps = []
        for i, role in self._optional:
            if role == "amax_a" or role == "amax_b":
                t = getattr(a, self.views[0][2]) if role == "amax_a" else getattr(b, self.views[1][2])
                # as _portable: the global amaxes as fp32 on the GEMM's device (an fp32 one there as it is)
                if not (t.dtype is torch.float32 and t.device == device and t.is_contiguous()):
                    t = t.to(device=device, dtype=torch.float32).contiguous()
                    temps.append(t)
            else:
                t = bias if role == "bias" else c
                # NUMERICS: §6 - as _portable: bias and C widened to fp32 (exact)
                if not (t.dtype is torch.float32 and t.is_contiguous()):
                    t = t.to(torch.float32).contiguous()
                    temps.append(t)
            buf[i] = t.data_ptr()
        prepared.fire(pointers, raw_stream(self.index))
        for t in temps:  # keep the temporaries alive until the kernel has run on torch's stream
            t.record_stream(torch.cuda.current_stream(device))
        return out


def _prepare_matmul(av: OperandView, bv: OperandView, resolved: str, out_dtype, bias, c, index: int):
    """A `cublaslt.PreparedMatmul` for a planned signature whose `_cublaslt` call is exactly one scaled_matmul with
    the consumed copies' scales as stored (fp32) and a constant alpha: the per-tensor and blockwise FP8 schemes
    (`lt_alpha` 1; `lt_scale` the stored scale), no bias or C, non-empty; None otherwise (the general path)."""
    if not resolved.startswith("cublaslt") or bias is not None or c is not None or 0 in (av.outer, bv.outer, av.k):
        return None
    if av.config.row_scaled or bv.config.row_scaled or out_dtype not in OUT_DTYPES:
        return None
    scheme = launcher(av.config.scheme)
    if scheme.CUBLASLT.family not in ("per_tensor", "fp8_block"):
        return None
    from . import cublaslt as lt_mod

    la, lb = _lt_operand(av, lt_mod), _lt_operand(bv, lt_mod)
    for lt_op, v in ((la, av), (lb, bv)):  # the scale cuBLASLt reads is the stored tensor itself
        if lt_op.scale.dtype != torch.float32 or lt_op.scale.data_ptr() != v.scale.data_ptr():
            return None
    return lt_mod.PreparedMatmul(la, lb, av.k, out_dtype, alpha=scheme.lt_alpha(av, bv),
                                 fast_accum=resolved == "cublaslt_fast_accum", device=index)  # fmt: skip


def _row_scaled(av: OperandView, bv: OperandView, resolved: str, out_dtype, bias, c) -> torch.Tensor:
    """A GEMM with a row-scaled NVFP4 operand in the order of TE's kernel path (docs/numerics.md §5.10).

    The per-tensor GEMM (`resolved` method) runs with both amaxes replaced by 1 and an fp32 output:
    y32 = RN(alpha_1 * sum), alpha_1 = fl(1/(36 * e4m3_max_a * e4m3_max_b)). Then, per (m, n), with
    A_a the amax vector of a's consumed copy ([M] or [1]) and A_b of b's ([N] or [1]):
    NUMERICS: §5.10 - one vector side: y = RN(y32 * RN(A_a[m] * A_b[n])); both: y = RN(RN(y32 * A_a[m]) *
    A_b[n]); y = RN(y + bias) in fp32; RN_out; with C, D = RN_out(RN(C + RN_out(y))). Each step is one
    torch elementwise op on the GPU (one fp32 rounding each, nothing fused).
    """
    one = torch.ones(1, dtype=torch.float32, device=av.data.device)
    ua, ub = dataclasses.replace(av, amax=one), dataclasses.replace(bv, amax=one)
    if resolved == "portable":
        y32 = _portable(ua, ub, torch.float32, None, None)
    else:
        y32 = _cublaslt(ua, ub, torch.float32, None, None, fast_accum=resolved == "cublaslt_fast_accum")
    ra = av.amax.to(torch.float32).reshape(-1, 1)  # (M or 1, 1)
    rb = bv.amax.to(torch.float32).reshape(1, -1)  # (1, N or 1)
    if av.config.row_scaled and bv.config.row_scaled:
        y = (y32 * ra) * rb  # NUMERICS: §5.10 - two fp32 multiplies, a's rows first
    else:
        y = y32 * (ra * rb)  # NUMERICS: §5.10 - the two amaxes folded into one fp32 factor first
    if bias is not None:
        y = y + bias.to(torch.float32)[None, :]  # NUMERICS: §5.10 - bias in fp32 after the scales
    z = y.to(out_dtype)
    if c is not None:
        # NUMERICS: §5.10 - TE adds the rounded output into C (out.add_): one fp32 add, then RN_out.
        z = (c.to(torch.float32) + z.to(torch.float32)).to(out_dtype)
    return z


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
    d["SCALE_B_FIRST"] = int(_tile_scaled(a_config) and not _tile_scaled(b_config))
    d["OUT_BF16"] = int(out_dtype == torch.bfloat16)
    if a_config.scheme_row.global_amax:
        # NUMERICS: §5.8 / §5.10 - the alpha constant of a global-amax scheme (NVFP4) from both operands:
        # fl(1/(36 * e4m3_max_a * e4m3_max_b)), each operand's own E4M3 maximum (448, or 256 for 4over6).
        recip_alpha = launcher(a_config.scheme).recip_alpha_range(a_config.e4m3_max, b_config.e4m3_max)
        d["NVFP4_RECIP_ALPHA"] = float(recip_alpha)
    return d


def _tile_scaled(config: QuantConfig) -> bool:
    """One scale entry per 2-D tile (docs/numerics.md §4 128x128; the §6 scale order of a 1-D x 2-D GEMM)."""
    return config.is_2d and config.scheme_row.scale_per_tile


def _portable_args(av: OperandView, bv: OperandView, a_data, a_scale, b_data, b_scale, amax_a, amax_b, bias32, c32,
                   out, out_dtype) -> tuple:  # fmt: skip
    """block_scaled_gemm's arguments: the views' addressing and the given tensors (or their `Patched` markers)."""
    # NUMERICS: §6 epilogue - fp8_block: bias, RN_out, D = RN_out(C + RN_out(Y)); the others:
    # RN(Y + C) in fp32, then RN(. + bias), then RN_out (reference.gemm's order).
    epilogue = int(av.config.scheme_row.round_before_accumulate)
    return (
        a_data, np.int64(av.i_stride), np.int64(av.k_stride), a_scale,
        np.int64(av.s_idiv), np.int64(av.s_istride), np.int64(av.s_kstride),
        b_data, np.int64(bv.i_stride), np.int64(bv.k_stride), b_scale,
        np.int64(bv.s_idiv), np.int64(bv.s_istride), np.int64(bv.s_kstride),
        amax_a, amax_b, bias32, c32, np.int32(epilogue), out,
        np.int64(av.outer), np.int64(bv.outer), np.int64(av.k),
    )  # fmt: skip


def _portable_module(av: OperandView, bv: OperandView, out_dtype, index: int):
    with torch.cuda.device(index):
        from ._compile import load_module

        return load_module(CU_FILE, kernel_defines(av.config, bv.config, out_dtype))


def _prepare_portable(av: OperandView, bv: OperandView, out_dtype, bias, c, index: int) -> PreparedLaunch | None:
    """The portable kernel's launch for this signature, every pointer patched per call (None for an empty output)."""
    m, n = av.outer, bv.outer
    if m == 0 or n == 0:
        return None

    def ptr(role, dtype, present=True):
        return Patched(role, dtype) if present else None

    f32, u8 = torch.float32, torch.uint8  # the dtypes _portable passes (amaxes, bias and C widened to fp32)
    args = _portable_args(av, bv, ptr("a_data", u8), ptr("a_scale", av.scale.dtype), ptr("b_data", u8),
                          ptr("b_scale", bv.scale.dtype), ptr("amax_a", f32, av.amax is not None),
                          ptr("amax_b", f32, bv.amax is not None), ptr("bias", f32, bias is not None),
                          ptr("c", f32, c is not None), ptr("out", out_dtype), out_dtype)  # fmt: skip
    grid = (math.ceil(n / TILE_N), math.ceil(m / TILE_M), 1)
    return PreparedLaunch(_portable_module(av, bv, out_dtype, index), KERNEL, grid, BLOCK_DIM, args, index)


def _portable(av: OperandView, bv: OperandView, out_dtype, bias, c, *, prepared: PreparedLaunch | None = None
              ) -> torch.Tensor:  # fmt: skip
    m, n = av.outer, bv.outer
    device = av.data.device
    out = torch.empty((m, n), dtype=out_dtype, device=device)
    if m == 0 or n == 0:
        return out
    bias32 = None if bias is None else bias.to(torch.float32).contiguous()  # exact widening
    c32 = None if c is None else c.to(torch.float32).contiguous()  # exact for bf16/fp16/fp32 C
    index = device_index(device)
    # The kernel reads the global amaxes only in builds with an alpha (docs/numerics.md §5.8: nvfp4).
    amax_a = None if av.amax is None else av.amax.to(device=device, dtype=torch.float32).contiguous()
    amax_b = None if bv.amax is None else bv.amax.to(device=device, dtype=torch.float32).contiguous()
    if prepared is None:
        module = _portable_module(av, bv, out_dtype, index)
        grid = (math.ceil(n / TILE_N), math.ceil(m / TILE_M), 1)
        args = _portable_args(av, bv, av.data, av.scale, bv.data, bv.scale, amax_a, amax_b, bias32, c32, out, out_dtype)
        launch(module, KERNEL, grid, BLOCK_DIM, args, index)
    else:  # a planned signature: the same arguments, the pointers patched (the roles of _prepare_portable)
        named = {"a_data": av.data.data_ptr(), "a_scale": av.scale.data_ptr(), "b_data": bv.data.data_ptr(),
                 "b_scale": bv.scale.data_ptr(), "out": out.data_ptr()}  # fmt: skip
        for role, t in (("amax_a", amax_a), ("amax_b", amax_b), ("bias", bias32), ("c", c32)):
            if t is not None:
                named[role] = t.data_ptr()
        prepared([named[mk.role] for _, mk in prepared.patched], raw_stream(index))
    # Keep the temporaries alive until the kernel has run on torch's stream.
    for t in (amax_a, amax_b, bias32, c32):
        if t is not None:
            t.record_stream(torch.cuda.current_stream(device))
    return out


# ---- cuBLASLt -------------------------------------------------------------------------------


def _lt_operand(v: OperandView, lt_mod):
    """An LtOperand for one view: the scale tensor in the layout cuBLASLt expects for its mode."""
    lt = launcher(v.config.scheme).lt_scale(v)
    # Leading dimension in elements: codes per stored row (4-bit codes are packed two to a byte).
    ld = v.i_stride * v.geometry.codes_per_byte if v.k_contiguous else v.k_stride
    return lt_mod.LtOperand(v.data, v.element, v.outer, v.k_contiguous, ld, lt.scale, lt.mode)


def _bf16_exact(t: torch.Tensor) -> bool:
    return bool(torch.equal(t.to(torch.bfloat16).to(t.dtype), t))


def _cublaslt_operand_gap(av: OperandView, bv: OperandView) -> None:
    """Unsupported when cuBLASLt cannot take these operands (element pair, layout, alignment; docs/numerics.md §6)."""
    m, n, k = av.outer, bv.outer, av.k
    mode = launcher(av.config.scheme).CUBLASLT
    if av.element == "e5m2" and bv.element == "e5m2":
        raise Unsupported("cuBLASLt FP8 GEMMs do not support e5m2 x e5m2 (cuBLAS FP8 type table); use method='portable'")
    if not (av.k_contiguous and bv.k_contiguous) and not mode.any_layout:
        raise Unsupported(f"{mode.family} cuBLASLt GEMM needs K-contiguous operands (TN only, docs/numerics.md §6)")
    if mode.aligned and (k % 16 or m % 8 or n % 8):
        # TE cublaslt_gemm.cu: lda, ldb % 16 == 0 and the outer dims % 8 == 0 for block scaling.
        raise Unsupported(
            f"{mode.family} cuBLASLt GEMM needs K % 16 == 0 and M, N % 8 == 0 (got M={m}, N={n}, K={k}); "
            "use method='portable'"
        )


def _cublaslt(av: OperandView, bv: OperandView, out_dtype, bias, c, *, fast_accum: bool,
              checked: bool = False) -> torch.Tensor:  # fmt: skip
    from . import cublaslt as lt_mod

    m, n, k = av.outer, bv.outer, av.k
    device = av.data.device
    scheme = launcher(av.config.scheme)
    if not checked:  # (a planned signature passed it on its first call)
        _cublaslt_operand_gap(av, bv)
    alpha = scheme.lt_alpha(av, bv)  # exact fp32 value, host pointer mode
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
    # Emulated epilogue: fp32 Y from cuBLASLt, then reference.gemm's epilogue order: RN(Y + C), RN(. + bias),
    # RN_out, or for the blockwise order RN_out(C + RN_out(Y + bias)).
    y = torch.empty((m, n), dtype=torch.float32, device=device)
    lt_mod.scaled_matmul(la, lb, k, y, alpha=alpha, fast_accum=fast_accum)
    if av.config.scheme_row.round_before_accumulate:
        if bias is not None:
            y = y + bias.to(torch.float32)  # NUMERICS: §6 blockwise bias in fp32, then RN_out
        z = y.to(out_dtype)
        return z if c is None else (c.to(torch.float32) + z.to(torch.float32)).to(out_dtype)
    if c is not None:
        y = y + c.to(torch.float32)  # NUMERICS: §6 C added in fp32
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(out_dtype)


# ---- epilogues (docs/numerics.md §12.2) -----------------------------------------------------

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
    method: str = "auto",
) -> dict[str, torch.Tensor]:
    """The GEMM with a cuBLASLt epilogue, as `reference.gemm.gemm_epilogue` (docs/numerics.md §12.2): {"out",
    "aux"} (gelu_aux), {"out"} (dgelu, reading `aux`), {"out", "bgrad"} (bgradb).

    One cublasLtMatmul with GELU_AUX[_BIAS] / DGELU / BGRADA (our b is cuBLAS's A). Only where the GEMM itself
    runs on cuBLASLt (the §6 table: per-tensor FP8 on sm_89+, fp8_block on sm_90, the block-scaled FP8 / FP4
    modes on sm_100+) and cuBLASLt takes the tensors as given; Unsupported elsewhere (the portable kernel has no
    transcendental epilogue), and whenever cuBLASLt refuses the combination.
    """
    if epilogue is None:
        raise SpecViolation(f"epilogue=None is invalid: expected one of {EPILOGUES}", rule="epilogue")
    epilogue_rule(epilogue, bias=bias is not None)  # the spec rules on names, as the reference
    av, bv = _check_operands(a, b, layout, out_dtype, bias, c, method)
    m, n, k = av.outer, bv.outer, av.k
    if epilogue == "dgelu" and (aux is None or tuple(aux.shape) != (m, n)):
        raise SpecViolation(f"epilogue 'dgelu' needs aux [M, N] = {[m, n]}, got "
                            f"{None if aux is None else list(aux.shape)}", rule="epilogue")
    device = av.data.device
    if method == "portable":
        raise Unsupported(f"native GEMM epilogue {epilogue!r}: the portable kernel has none (cuBLASLt only)")
    resolved, why = resolve_method(a.config, method, device)
    if resolved == "portable":
        raise Unsupported(f"native GEMM epilogue {epilogue!r} runs on cuBLASLt only; {a.config.id} resolves to "
                          f"the portable kernel here ({why})")
    _cublaslt_operand_gap(av, bv)
    if bias is not None and not (bias.dtype == torch.bfloat16 or _bf16_exact(bias)):
        raise Unsupported(f"native GEMM epilogue {epilogue!r}: cuBLASLt's FP8 bias is bf16 and this bias is not "
                          "exactly bf16 (the plain GEMM emulates that epilogue; GELU cannot be emulated exactly)")
    if c is not None and c.dtype != out_dtype:
        raise Unsupported(f"native GEMM epilogue {epilogue!r}: C in {c.dtype} with out_dtype {out_dtype} "
                          "(cuBLASLt reads C in D's type)")
    if aux is not None and epilogue == "dgelu":
        if aux.device != device:
            raise SpecViolation(f"aux is on {aux.device}, the operands on {device}")
        if aux.dtype not in OUT_DTYPES:
            raise Unsupported(f"native GEMM epilogue 'dgelu': aux in {aux.dtype} (cuBLASLt's aux is bf16 or fp32)")
    from . import cublaslt as lt_mod

    scheme = launcher(av.config.scheme)
    with torch.cuda.device(device):
        la, lb = _lt_operand(av, lt_mod), _lt_operand(bv, lt_mod)
        # NUMERICS: §12.2 - C (beta = 1) and the bias enter the epilogue input pre = RN(alpha*AB + C + bias).
        out = c.contiguous().clone() if c is not None else torch.empty((m, n), dtype=out_dtype, device=device)
        outs = {"out": out}
        lt_aux = bgrad = None
        if epilogue == "gelu_aux":
            lt_aux = outs["aux"] = torch.empty((m, n), dtype=out_dtype, device=device)  # RN_out(pre)
        elif epilogue == "dgelu":
            lt_aux = aux.contiguous()
        else:
            bgrad = outs["bgrad"] = torch.empty((n,), dtype=out_dtype, device=device)
        bias_lt = None if bias is None else bias.to(torch.bfloat16).contiguous()  # exact (checked above)
        lt_mod.scaled_matmul(la, lb, k, out, accumulate=c is not None, bias=bias_lt, alpha=scheme.lt_alpha(av, bv),
                             epilogue=epilogue, aux=lt_aux, bgrad=bgrad)
    return outs
