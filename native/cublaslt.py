"""cuBLASLt scaled GEMMs through `nvmath.bindings.cublasLt` (no hand-written ctypes).

Source: docs/numerics.md §6 (scale modes, arch / cuBLAS table), TE `common/gemm/cublaslt_gemm.cu`
(scale pointers, modes, fast-accumulation flag), PyTorch `aten/src/ATen/cuda/CUDABlas.cpp`
`scaled_gemm` (the descriptor set that `torch._scaled_mm` uses, mirrored here so that per-tensor FP8
results are bit-identical to it).

Column-major mapping. Our GEMM is row-major: out[m, n] = sum_k a[m, k] * b[n, k], out [M, N]
row-major. cuBLASLt is column-major, so we ask it for D = out^T (an N x M column-major matrix, ld N,
which is the same memory as row-major [M, N]):

    D (N x M) = op(A_cublas) (N x K) . op(B_cublas) (K x M),   m = N, n = M, k = K
    A_cublas = our b:  K-contiguous storage [N, K] (ld) -> column-major K x N, TRANSA = T
                       N-contiguous storage [K, N] (ld) -> column-major N x K, TRANSA = N
    B_cublas = our a:  K-contiguous storage [M, K] (ld) -> column-major K x M, TRANSB = N
                       M-contiguous storage [K, M] (ld) -> column-major M x K, TRANSB = T
    A_SCALE = b's scales, B_SCALE = a's scales; bias (length m = N) broadcasts along our rows.

"TN" in cuBLAS terms (TRANSA = T, TRANSB = N) is therefore the K-contiguous case for both operands,
the only one FP8 supports on sm_89/sm_90 and NVFP4 everywhere; this is exactly what
`torch._scaled_mm(a [M, K], b.t())` passes (mat2 -> A, mat1 -> B), hence the bit equality.
Accumulation (beta = 1) runs in place: C = D = out, pre-filled with C.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from reference.types import Unsupported

from .launch import raw_stream

# cudaDataType_t values (CUDA library_types.h; nvmath._utils.CudaDataType mirrors them).
CUDA_R_32F = 0
CUDA_R_16BF = 14
CUDA_R_8F_E4M3 = 28
CUDA_R_8F_E5M2 = 29
CUDA_R_4F_E2M1 = 33

ELEMENT_CUDA_TYPE = {"e4m3": CUDA_R_8F_E4M3, "e5m2": CUDA_R_8F_E5M2, "e2m1": CUDA_R_4F_E2M1}
OUT_CUDA_TYPE = {torch.bfloat16: CUDA_R_16BF, torch.float32: CUDA_R_32F}

# Scale-mode names (cublasLtMatmulMatrixScale_t), resolved to the nvmath enum lazily.
SCALAR_32F = "SCALAR_32F"
VEC128_32F = "VEC128_32F"
BLK128x128_32F = "BLK128x128_32F"
VEC32_UE8M0 = "VEC32_UE8M0"
VEC16_UE4M3 = "VEC16_UE4M3"

# docs/numerics.md §12.2 epilogue names -> cublasLtEpilogue_t names. Our b is cuBLAS's A (module docstring), so the
# bias gradient over b's [N, K] view is BGRADA (sized by the rows of D = out^T, N, reduced over k); GELU_AUX takes
# the bias form when a bias is given.
EPILOGUE_NAMES = {"gelu_aux": "GELU_AUX", "dgelu": "DGELU", "bgradb": "BGRADA"}
AUX_EPILOGUES = ("gelu_aux", "dgelu")  # an aux matrix [M, N] (ld N): written (gelu_aux) or read (dgelu)

# cuBLASLt workspace: the size PyTorch's cuBLASLt path uses on Hopper (32 MiB), so the heuristic
# sees the same limit as torch._scaled_mm (the algorithm choice can depend on it).
WORKSPACE_BYTES = 32 * 1024 * 1024

_LOCK = threading.RLock()
_HANDLES: dict[int, int] = {}
_WORKSPACES: dict[int, torch.Tensor] = {}


_BINDING: list = []  # the binding module once imported (a failed import is retried and reported every call)


def _lt():
    """The nvmath cuBLASLt binding module, or Unsupported saying why it cannot be imported."""
    if _BINDING:
        return _BINDING[0]
    try:
        from nvmath.bindings import cublasLt
    except Exception as e:  # ImportError, or a missing libcublasLt at load time
        raise Unsupported(
            f"cuBLASLt GEMMs need nvmath-python (nvmath.bindings.cublasLt): import failed ({e!r}); "
            "install the 'gpu' extra or use method='portable'"
        ) from e
    _BINDING.append(cublasLt)
    return cublasLt


def available() -> tuple[bool, str]:
    """(True, version string) if nvmath's cuBLASLt binding loads and a CUDA device is visible."""
    if not torch.cuda.is_available():
        return False, "no CUDA device visible (torch.cuda.is_available() is False)"
    try:
        lt = _lt()
        v = int(lt.get_version())
    except Unsupported as e:
        return False, str(e)
    except Exception as e:  # the library itself failed to load
        return False, f"cuBLASLt could not be loaded through nvmath ({e!r})"
    return True, f"cuBLASLt {version_string(v)}"


def version() -> int:
    """cublasLtGetVersion(), e.g. 130100 for 13.1.0 (raises Unsupported without nvmath)."""
    return int(_lt().get_version())


def version_string(v: int) -> str:
    return f"{v // 10000}.{(v // 100) % 100}.{v % 100}"


def _handle(device: int) -> int:
    lt = _lt()
    with _LOCK:
        h = _HANDLES.get(device)
        if h is None:
            with torch.cuda.device(device):
                h = int(lt.create())
            _HANDLES[device] = h
        return h


def _workspace(device: int) -> torch.Tensor:
    with _LOCK:
        ws = _WORKSPACES.get(device)
        if ws is None:
            ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device("cuda", device))
            _WORKSPACES[device] = ws
        return ws


_ATTR_DTYPES: dict = {}


def _set_attr(setter, dtype_of, obj: int, attr, value) -> None:
    """Set one descriptor attribute from a Python value, typed by the binding's own dtype table (cached)."""
    dtype = _ATTR_DTYPES.get((dtype_of, attr))
    if dtype is None:
        dtype = _ATTR_DTYPES[(dtype_of, attr)] = np.dtype(dtype_of(attr))
    buf = np.asarray([value], dtype=dtype)
    setter(obj, attr, buf.ctypes.data, buf.itemsize)


@dataclass
class LtOperand:
    """One GEMM operand as cuBLASLt sees it.

    `data` holds codes (uint8; FP4 packed along K). `k_contiguous`: storage [outer, K] with row
    stride `ld` elements; else storage [K, outer] with row stride `ld`. `scale` is the scale tensor
    in the layout cuBLASLt expects for `scale_mode` (fp32 [1], fp32 blockwise, swizzled bytes).
    """

    data: torch.Tensor
    element: str  # "e4m3" | "e5m2" | "e2m1"
    outer: int  # M for a, N for b
    k_contiguous: bool
    ld: int
    scale: torch.Tensor
    scale_mode: str


def _check_status(lt, fn, *args) -> None:
    try:
        fn(*args)
    except lt.cuBLASLtError as e:
        raise Unsupported(f"cuBLASLt refused the GEMM: {e}") from e


@dataclass
class _Plan:
    """Descriptors and the heuristic's algorithm for one GEMM shape/type/mode combination."""

    desc: int
    layouts: tuple[int, int, int]
    heur: object  # nvmath MatmulHeuristicResult (its first member is the algo struct)
    pointers: dict = field(default_factory=dict)  # pointer attribute -> the value last set on `desc` by a call


def _set_pointer(lt, plan: _Plan, attr, value: int) -> None:
    """Set a pointer attribute of the plan's descriptor unless a call already set it to this value (under _LOCK)."""
    if plan.pointers.get(attr) != value:
        _set_desc(lt, plan.desc, attr, value)
        plan.pointers[attr] = value


_PLANS: dict[tuple, _Plan] = {}


def _plan(lt, key: tuple, a: LtOperand, b: LtOperand, k: int, out_dtype, bias_dtype, fast_accum: bool, device: int,
          epilogue: tuple | None = None):
    """Build (or reuse) the descriptor set and algorithm for `key`; pointers are set per call.

    `epilogue`: None, or (§12.2 name, aux tensor or None, bgrad tensor or None) for `_set_epilogue`."""
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    from nvmath.bindings import cublas  # ComputeType / Operation enums

    D = lt.MatmulDescAttribute
    scale_enum = lt.MatmulMatrixScale
    op_t, op_n = int(cublas.Operation.T), int(cublas.Operation.N)
    # NUMERICS: §6 - fp32 accumulation (CUBLAS_COMPUTE_32F), fp32 scale type, like TE and torch.
    desc = lt.matmul_desc_create(int(cublas.ComputeType.COMPUTE_32F), CUDA_R_32F)
    layouts: list[int] = []
    pref = 0
    ok = False
    try:
        _set_desc(lt, desc, D.TRANSA, op_t if b.k_contiguous else op_n)
        _set_desc(lt, desc, D.TRANSB, op_n if a.k_contiguous else op_t)
        _set_desc(lt, desc, D.A_SCALE_MODE, int(getattr(scale_enum, b.scale_mode)))
        _set_desc(lt, desc, D.B_SCALE_MODE, int(getattr(scale_enum, a.scale_mode)))
        # The heuristic sees real scale pointers (set again on every call).
        _set_desc(lt, desc, D.A_SCALE_POINTER, b.scale.data_ptr())
        _set_desc(lt, desc, D.B_SCALE_POINTER, a.scale.data_ptr())
        # NUMERICS: §6 - fast accumulation exists for FP8 only; FP4 and block scaling keep it off.
        _set_desc(lt, desc, D.FAST_ACCUM, 1 if fast_accum else 0)
        if epilogue is not None:
            _check_status(lt, _set_epilogue, lt, desc, b.outer, bias_dtype, *epilogue)
        elif bias_dtype is not None:
            _set_desc(lt, desc, D.BIAS_DATA_TYPE, OUT_CUDA_TYPE[bias_dtype])
            _set_desc(lt, desc, D.EPILOGUE, int(lt.Epilogue.BIAS))
        # cuBLAS A (our b) and B (our a) layouts, column-major; C = D = out^T (N x M, ld N).
        a_rows, a_cols = (k, b.outer) if b.k_contiguous else (b.outer, k)
        b_rows, b_cols = (k, a.outer) if a.k_contiguous else (a.outer, k)
        layouts.append(lt.matrix_layout_create(ELEMENT_CUDA_TYPE[b.element], a_rows, a_cols, b.ld))
        layouts.append(lt.matrix_layout_create(ELEMENT_CUDA_TYPE[a.element], b_rows, b_cols, a.ld))
        layouts.append(lt.matrix_layout_create(OUT_CUDA_TYPE[out_dtype], b.outer, a.outer, b.outer))
        pref = lt.matmul_preference_create()
        _set_attr(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
                  lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, WORKSPACE_BYTES)
        heur = lt.MatmulHeuristicResult()
        count = np.zeros(1, dtype=np.int32)
        lay_a, lay_b, lay_c = layouts
        _check_status(lt, lt.matmul_algo_get_heuristic, _handle(device), desc, lay_a, lay_b, lay_c, lay_c, pref, 1,
                      heur.ptr, count.ctypes.data)
        if int(count[0]) == 0:
            raise Unsupported(
                f"cuBLASLt found no algorithm for {a.element} x {b.element} scales "
                f"{a.scale_mode}/{b.scale_mode}, M={a.outer} N={b.outer} K={k}, out {out_dtype}"
            )
        plan = _Plan(desc, (lay_a, lay_b, lay_c), heur)
        _PLANS[key] = plan
        ok = True
        return plan
    finally:
        if pref:
            lt.matmul_preference_destroy(pref)
        if not ok:
            for lay in layouts:
                lt.matrix_layout_destroy(lay)
            lt.matmul_desc_destroy(desc)


def _plan_key(device: int, a: LtOperand, b: LtOperand, k: int, fast_accum: bool, bias_dtype, out_dtype,
              ep: tuple | None) -> tuple:  # fmt: skip
    """The descriptor-set key of `_PLANS`: everything `_plan` reads."""
    return (device, a.element, b.element, a.outer, b.outer, k, a.k_contiguous, b.k_contiguous, a.ld, b.ld,
            a.scale_mode, b.scale_mode, fast_accum, bias_dtype, out_dtype,
            None if ep is None else (ep[0], *(None if t is None else t.dtype for t in ep[1:])))  # fmt: skip


class PreparedMatmul:
    """`scaled_matmul` without bias, C or epilogue for one signature, prepared once (a GEMM call plan,
    docs/design.md §4.1): the same cached descriptor set, algorithm, handle, workspace, alpha and beta = 0; a call
    sets the two scale-pointer attributes (only when they differ from the ones last set on the shared descriptor,
    through a preallocated attribute buffer) and runs the same cublasLtMatmul with the data and out pointers."""

    def __init__(self, a: LtOperand, b: LtOperand, k: int, out_dtype: torch.dtype, *, alpha: float, fast_accum: bool,
                 device: int):  # fmt: skip
        lt = self._lt = _lt()
        with _LOCK:
            self.plan = _plan(lt, _plan_key(device, a, b, k, fast_accum, None, out_dtype, None), a, b, k, out_dtype,
                              None, fast_accum, device)  # fmt: skip
        self.handle = _handle(device)
        self._ws = _workspace(device)  # kept alive with the plan
        self.ws_ptr = self._ws.data_ptr()
        self.alpha_h = np.asarray([alpha], dtype=np.float32)  # host pointer mode, as scaled_matmul
        self.beta_h = np.zeros(1, dtype=np.float32)
        self.alpha_ptr, self.beta_ptr = self.alpha_h.ctypes.data, self.beta_h.ctypes.data
        D = lt.MatmulDescAttribute
        # (attribute, its value buffer typed by the binding's table, the buffer's address): A_SCALE = b's scale.
        self.scale_attrs = tuple((attr, buf, buf.ctypes.data) for attr in (D.A_SCALE_POINTER, D.B_SCALE_POINTER)
                                 for buf in [np.zeros(1, dtype=np.dtype(lt.get_matmul_desc_attribute_dtype(attr)))])  # fmt: skip
        self.scale_attr_names = tuple(attr for attr, _, _ in self.scale_attrs)  # (for the per-call test)

    def __call__(self, a_data: int, a_scale: int, b_data: int, b_scale: int, out: int, stream: int) -> None:
        lt, plan = self._lt, self.plan
        lay_a, lay_b, lay_c = plan.layouts
        attr_a, attr_b = self.scale_attr_names
        with _LOCK:
            pointers = plan.pointers
            if pointers.get(attr_a) != b_scale or pointers.get(attr_b) != a_scale:  # else both are set already
                for (attr, buf, addr), value in zip(self.scale_attrs, (b_scale, a_scale), strict=True):
                    if pointers.get(attr) != value:  # as _set_pointer
                        buf[0] = value
                        lt.matmul_desc_set_attribute(plan.desc, attr, addr, buf.itemsize)
                        pointers[attr] = value
            try:
                lt.matmul(self.handle, plan.desc, self.alpha_ptr, b_data, lay_a, a_data, lay_b, self.beta_ptr, out,
                          lay_c, out, lay_c, plan.heur.ptr, self.ws_ptr, WORKSPACE_BYTES, stream)  # fmt: skip
            except lt.cuBLASLtError as e:
                raise Unsupported(f"cuBLASLt refused the GEMM: {e}") from e


def _set_desc(lt, desc: int, attr, value) -> None:
    _set_attr(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, attr, value)


def _set_epilogue(lt, desc: int, n: int, bias_dtype, name: str, aux: torch.Tensor | None,
                  bgrad: torch.Tensor | None) -> None:
    """The §12.2 epilogue `name` on `desc`: GELU_AUX[_BIAS] / DGELU with the aux matrix (D's shape N x M
    column-major, ld N = `n`, in aux's dtype), or BGRADA with the bias-gradient vector [N] as the bias output."""
    D = lt.MatmulDescAttribute
    cu = EPILOGUE_NAMES[name] + ("_BIAS" if name == "gelu_aux" and bias_dtype is not None else "")
    _set_desc(lt, desc, D.EPILOGUE, int(getattr(lt.Epilogue, cu)))
    if bias_dtype is not None:
        _set_desc(lt, desc, D.BIAS_DATA_TYPE, OUT_CUDA_TYPE[bias_dtype])
    if name in AUX_EPILOGUES:
        _set_desc(lt, desc, D.EPILOGUE_AUX_DATA_TYPE, OUT_CUDA_TYPE[aux.dtype])
        _set_desc(lt, desc, D.EPILOGUE_AUX_LD, n)
        _set_desc(lt, desc, D.EPILOGUE_AUX_POINTER, aux.data_ptr())  # the heuristic sees real pointers
    if bgrad is not None:
        _set_desc(lt, desc, D.BIAS_DATA_TYPE, OUT_CUDA_TYPE[bgrad.dtype])
        _set_desc(lt, desc, D.BIAS_POINTER, bgrad.data_ptr())


def scaled_matmul(
    a: LtOperand,
    b: LtOperand,
    k: int,
    out: torch.Tensor,
    *,
    accumulate: bool = False,
    bias: torch.Tensor | None = None,
    alpha: float = 1.0,
    fast_accum: bool = False,
    epilogue: str | None = None,
    aux: torch.Tensor | None = None,
    bgrad: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[M, N] (=) a . b^T with block/tensor scales, in one cublasLtMatmul (see module docstring).

    `out` is a contiguous row-major [M, N] bf16/fp32 tensor; with `accumulate` it already holds C
    (beta = 1, C = D in place). `bias` is a [N] tensor (bf16, or fp32 where cuBLASLt takes it).
    `alpha` is a host fp32 value (NVFP4's global alpha, docs/numerics.md §5.8). `fast_accum` sets
    CUBLASLT_MATMUL_DESC_FAST_ACCUM (Hopper FP8 fast accumulation; TE uses it for fprop).
    Descriptors and the heuristic's algorithm are cached per shape/type/mode (like a plan); the
    data, scale and bias pointers are set on every call.

    `epilogue` (docs/numerics.md §12.2): "gelu_aux" writes GELU of the epilogue input to `out` and the input
    itself to `aux` (contiguous [M, N]); "dgelu" reads `aux` (the forward's pre-activation, [M, N]) and writes
    the product with GELU' to `out`; "bgradb" writes the bias gradient over b's [N, K] view to `bgrad` ([N]).
    """
    lt = _lt()
    device = out.device.index if out.device.index is not None else torch.cuda.current_device()
    m_, n_ = out.shape
    if (m_, n_) != (a.outer, b.outer) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{a.outer}, {b.outer}] tensor, got {tuple(out.shape)}")
    if out.dtype not in OUT_CUDA_TYPE:
        raise Unsupported(f"cuBLASLt path supports out_dtype bfloat16 or float32, got {out.dtype}")
    bias_dtype = None if bias is None else bias.dtype
    ep = _check_epilogue(epilogue, out, bias, aux, bgrad)
    key = _plan_key(device, a, b, k, fast_accum, bias_dtype, out.dtype, ep)
    D = lt.MatmulDescAttribute
    alpha_h = np.asarray([alpha], dtype=np.float32)
    beta_h = np.asarray([1.0 if accumulate else 0.0], dtype=np.float32)
    ws = _workspace(device)
    stream = raw_stream(device)  # torch's current stream
    with _LOCK:
        plan = _plan(lt, key, a, b, k, out.dtype, bias_dtype, fast_accum, device, ep)
        _set_pointer(lt, plan, D.A_SCALE_POINTER, b.scale.data_ptr())
        _set_pointer(lt, plan, D.B_SCALE_POINTER, a.scale.data_ptr())
        if bias is not None:
            _set_pointer(lt, plan, D.BIAS_POINTER, bias.data_ptr())
        if aux is not None:
            _set_pointer(lt, plan, D.EPILOGUE_AUX_POINTER, aux.data_ptr())
        if bgrad is not None:
            _set_pointer(lt, plan, D.BIAS_POINTER, bgrad.data_ptr())
        lay_a, lay_b, lay_c = plan.layouts
        # The cuBLASLt algo struct is the first member of cublasLtMatmulHeuristicResult_t.
        _check_status(
            lt, lt.matmul, _handle(device), plan.desc, alpha_h.ctypes.data, b.data.data_ptr(), lay_a,
            a.data.data_ptr(), lay_b, beta_h.ctypes.data, out.data_ptr(), lay_c, out.data_ptr(), lay_c,
            plan.heur.ptr, ws.data_ptr(), WORKSPACE_BYTES, stream,
        )
    return out


def _check_epilogue(epilogue: str | None, out: torch.Tensor, bias, aux, bgrad) -> tuple | None:
    """(name, aux, bgrad) for `_plan`, after checking the tensors an epilogue needs (ValueError otherwise)."""
    if epilogue is None:
        if aux is not None or bgrad is not None:
            raise ValueError("aux and bgrad are epilogue tensors; pass epilogue=")
        return None
    if epilogue not in EPILOGUE_NAMES:
        raise ValueError(f"epilogue={epilogue!r} is invalid: expected one of {tuple(EPILOGUE_NAMES)}")
    if epilogue in AUX_EPILOGUES:
        if aux is None or tuple(aux.shape) != tuple(out.shape) or not aux.is_contiguous() or aux.dtype not in OUT_CUDA_TYPE:
            raise ValueError(f"epilogue {epilogue!r} needs a contiguous bf16/fp32 aux of shape {tuple(out.shape)}")
    elif aux is not None:
        raise ValueError(f"epilogue {epilogue!r} takes no aux")
    if epilogue == "bgradb":
        if bgrad is None or tuple(bgrad.shape) != (out.shape[1],) or not bgrad.is_contiguous() or bgrad.dtype not in OUT_CUDA_TYPE:
            raise ValueError(f"epilogue 'bgradb' needs a contiguous bf16/fp32 bgrad of shape ({out.shape[1]},)")
    elif bgrad is not None:
        raise ValueError(f"epilogue {epilogue!r} takes no bgrad")
    if bias is not None and epilogue != "gelu_aux":
        raise ValueError(f"epilogue {epilogue!r} takes no bias (cuBLASLt's bias pointer is its output or unused)")
    return (epilogue, aux, bgrad)
