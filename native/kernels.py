"""The parameter list of every `extern "C" __global__` kernel in native/cuda/*.cu, declared once, and the
check of a launch's arguments against it.

Source: docs/design.md §2 (tensors cross zero-copy as raw device pointers; kernels run on torch's stream).
Every argument crosses into CUDA through an untyped 8-byte slot (`native.launch`), so a wrong count,
order or type would be read as garbage by the kernel: `Signature.slots` checks the count and each
argument against the declared C type and says which parameter is wrong. The declarations are written
in C (typedefs as in the sources); tests/unit/test_native_kernels.py parses the sources (expanding the
instantiation macros) and checks that every kernel is declared here with the same names and types.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

# The typedefs of native/cuda (common.cuh, nvfp4.cuh, block_scaled_gemm.cu, norms.cu), spelled out.
TYPEDEFS = {"u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int", "u64": "unsigned long long",
            "i64": "long long"}  # fmt: skip
# Scalar C type -> the numpy type of its slot value.
SCALARS: dict[str, type] = {
    "int": np.int32,
    "unsigned int": np.uint32,
    "long long": np.int64,
    "unsigned long long": np.uint64,
    "float": np.float32,
}
# Pointee C type -> the torch dtypes a tensor passed for it may have (None: any).
POINTEES: dict[str, tuple[torch.dtype, ...] | None] = {
    "float": (torch.float32,),
    "__nv_bfloat16": (torch.bfloat16,),
    "__half": (torch.float16,),
    "unsigned char": (torch.uint8,),
    # The NVFP4 amax slots are fp32 tensors whose bits the kernels combine as u32 (all values >= +0).
    "unsigned int": (torch.float32, torch.int32, torch.uint32),
    "void": None,
}
# Input / output element type of each kernel-name suffix (the NH_* / NVFP4_INSTANTIATE macros).
SUFFIX_TYPES = {"f32": "float", "bf16": "__nv_bfloat16", "f16": "__half"}
_MASK64 = (1 << 64) - 1


def canonical_type(text: str) -> str:
    """A C parameter type with `__restrict__` dropped, typedefs spelled out and one space between words
    ("const u8 *" -> "const unsigned char*")."""
    text = text.replace("__restrict__", " ").replace("*", " * ")
    words = [TYPEDEFS.get(w, w) for w in text.split()]
    return " ".join(words).replace(" *", "*")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name and canonical C type."""

    name: str
    ctype: str

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def pointee(self) -> str:
        return self.ctype[:-1].removeprefix("const ").strip()


def parse_params(text: str) -> tuple[Param, ...]:
    """'const float* x, i64 n' -> (Param('x', 'const float*'), Param('n', 'long long'))."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(.*?[\s*])(\w+)", item, flags=re.S)
        if m is None:
            raise ValueError(f"cannot parse kernel parameter {item!r}")
        out.append(Param(m.group(2), canonical_type(m.group(1))))
    return tuple(out)


def _slot_converter(kernel: str, index: int, p: Param) -> Callable[[object], int]:
    """A function: argument -> its 8-byte slot value, raising a clear error for a value of another type."""
    where = f"kernel {kernel} argument {index} ({p.ctype} {p.name})"
    if p.pointer:
        allowed = POINTEES[p.pointee]

        def pointer(a) -> int:
            if a is None:
                return 0  # a null pointer (the kernels skip copies that are not requested)
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"{where}: expected a CUDA tensor or None, got {type(a).__name__}")
            if allowed is not None and a.dtype not in allowed:
                raise TypeError(f"{where}: expected a tensor of {' or '.join(map(str, allowed))}, got {a.dtype}")
            if not a.is_cuda:
                raise ValueError(f"{where}: tensor on {a.device}: expected a CUDA tensor")
            return a.data_ptr()

        return pointer
    np_type = SCALARS[p.ctype]
    info = np.iinfo(np_type) if np_type is not np.float32 else None

    def scalar(a) -> int:
        if type(a) is np_type:
            v = a
        elif info is not None and isinstance(a, int) and info.min <= a <= info.max:
            v = np_type(a)  # a Python int (or bool) in range takes the parameter's type; a numpy scalar must be exact
        else:
            raise TypeError(f"{where}: expected {np_type.__name__} (or an int in its range), got {a!r}")
        if info is None:
            return int(v.view(np.uint32))  # a float's bit pattern in the slot's low bytes
        return int(v) & _MASK64  # two's complement; a 4-byte parameter reads the low bytes

    return scalar


@dataclass(frozen=True)
class Patched:
    """A launch argument written per call into a prepared launch (`native.launch.PreparedLaunch`): a pointer
    (`dtype`: the dtype of every tensor it will point to, checked against the parameter once) or an integer
    scalar (`dtype` None: the caller's int, as two's complement, like a scalar slot)."""

    role: str
    dtype: torch.dtype | None = None


class Signature:
    """One kernel's declared parameters and the converters that check a launch's arguments."""

    def __init__(self, name: str, params: tuple[Param, ...]):
        self.name = name
        self.params = params
        self._convert = tuple(_slot_converter(name, i, p) for i, p in enumerate(params))

    def slots(self, args: Sequence) -> list[int]:
        """The 8-byte slot values of `args`, after checking their count and types."""
        if len(args) != len(self._convert):
            raise TypeError(
                f"kernel {self.name} takes {len(self.params)} arguments "
                f"({', '.join(p.name for p in self.params)}), got {len(args)}"
            )
        return [f(a) for f, a in zip(self._convert, args, strict=True)]

    def prepare(self, args: Sequence) -> tuple[list[int], tuple[tuple[int, Patched], ...]]:
        """(slot values, ((index, marker), ...)) of an argument template whose `Patched` entries are written per
        call: every other argument is checked and converted as `slots` does; a patched pointer's dtype is checked
        against the parameter now (its slot holds 0 until patched), a patched scalar must be an integer type."""
        if len(args) != len(self._convert):
            raise TypeError(
                f"kernel {self.name} takes {len(self.params)} arguments "
                f"({', '.join(p.name for p in self.params)}), got {len(args)}"
            )
        slots, patched = [], []
        for i, (p, f, a) in enumerate(zip(self.params, self._convert, args, strict=True)):
            if not isinstance(a, Patched):
                slots.append(f(a))
                continue
            where = f"kernel {self.name} argument {i} ({p.ctype} {p.name})"
            if p.pointer:
                allowed = POINTEES[p.pointee]
                if allowed is not None and a.dtype not in allowed:
                    raise TypeError(f"{where}: patched pointer to {a.dtype}; expected "
                                    f"{'any dtype' if allowed is None else ' or '.join(map(str, allowed))}")  # fmt: skip
            elif a.dtype is not None or SCALARS[p.ctype] is np.float32:
                raise TypeError(f"{where}: only integer scalars and pointers can be patched per call")
            slots.append(0)
            patched.append((i, a))
        return slots, tuple(patched)

    def __repr__(self) -> str:
        return f"{self.name}({', '.join(f'{p.ctype} {p.name}' for p in self.params)})"


KERNELS: dict[str, Signature] = {}


def _declare(name: str, params: str, **types: str) -> None:
    """Declare `name` (with {sfx}: once per SUFFIX_TYPES entry, `{T}` its element type)."""
    for sfx, ctype in SUFFIX_TYPES.items() if "{sfx}" in name else [("", "")]:
        full = name.format(sfx=sfx)
        if full in KERNELS:
            raise ValueError(f"kernel {full} is declared twice")
        KERNELS[full] = Signature(full, parse_params(params.format(T=ctype, **types)))


# fp8_per_tensor.cu (NH_AMAX, NH_CAST, delayed_update, NH_DEQUANT)
_declare("tensor_amax_{sfx}", "const {T}* x, i64 n, int vec_ok, float* amax")
_declare("per_tensor_cast_{sfx}",
         "const {T}* x, i64 M, i64 K, int vec_in, int vec_row, int vec_col, const float* amax_in, float* scale, "
         "float* sinv, float* amax_acc, float* amax_copy, float* sinv_copy, float* amax_store, float* history, "
         "unsigned int* done, unsigned char* q_row, unsigned char* q_col")  # fmt: skip
_declare("delayed_update", "const float* hist, float* h_out, float* scale, const float* reduced, int has_reduced")
_declare("fill_given", "const float* given, float* slot0, float* slot1, unsigned int* zero, i64 n_words")
_declare("per_tensor_dequantize_{sfx}", "const unsigned char* q, const float* sinv, i64 M, i64 K, int colwise, {T}* out")
# mxfp8.cu (NH_MX_QUANTIZE, NH_MX_DEQUANTIZE)
_declare("mxfp8_quantize_{sfx}",
         "const {T}* x, i64 M, i64 K, int vec_in, int vec_out, unsigned char* q_row, unsigned char* s_r, i64 ld_r, "
         "unsigned char* q_col, unsigned char* s_c, i64 ld_c")  # fmt: skip
_declare("mxfp8_dequantize_{sfx}",
         "const unsigned char* q, const unsigned char* s, i64 ld_s, i64 M, i64 K, int colwise, {T}* out")
# fp8_block.cu (NH_BLOCK_QUANTIZE, NH_BLOCK_DEQUANTIZE)
_declare("fp8_block_quantize_{sfx}",
         "const {T}* x, i64 M, i64 K, int vec_in, int vec_row, int vec_col, unsigned char* q_row, float* s_row, "
         "i64 ld_sr, unsigned char* q_col, float* s_col, i64 ld_sc")  # fmt: skip
_declare("fp8_block_dequantize_{sfx}",
         "const unsigned char* q, const float* sinv, i64 ld_s, i64 M, i64 K, int colwise, {T}* out")
# nvfp4.cu (NVFP4_INSTANTIATE, nvfp4_scale_padding, nvfp4_rht_amax, nvfp4_dequantize).
_declare("nvfp4_amax_{sfx}", "const void* x, i64 m_rows, i64 k_cols, u32* out, u32* out2")
_declare("nvfp4_quantize_{sfx}",
         "const void* x, i64 m_rows, i64 k_cols, u64 seed, u8* row_data, u8* row_scale, i64 row_scale_stride, "
         "const float* row_amax, u32 row_stream, u8* col_data, u8* col_scale, i64 col_scale_stride, "
         "const float* col_amax, u32 col_stream, u32* drawn")  # fmt: skip
_declare("nvfp4_scale_padding",
         "u8* row_scale, i64 row_stride, i64 row_scale_rows, u8* col_scale, i64 col_stride, i64 col_scale_rows, "
         "i64 m_rows, i64 k_cols")  # fmt: skip
_declare("nvfp4_rht_amax", "const void* x, i64 m_rows, i64 k_cols, u32* out_rht, u32* out_plain")
_declare("nvfp4_dequantize",
         "const u8* data, const u8* scale, i64 scale_stride, const float* amax_g, i64 rows, i64 cols, float* out")
# nvfp4.cu variants (NVFP4_VARIANT_INSTANTIATE, nvfp4_dequantize_rows; docs/numerics.md §5.10): both copies of X
# [m, k] in one launch (NVFP4_VARIANT_PARAMS: the rowwise copy's data, scale, its stride and padded rows, A_g, then
# the columnwise copy's; null data: a copy not requested).
_NVFP4_COPIES = ("const void* x, i64 m, i64 k, u8* r_data, u8* r_scale, i64 r_stride, i64 r_scale_rows, "
                 "float* r_amax, u8* c_data, u8* c_scale, i64 c_stride, i64 c_scale_rows, float* c_amax")  # fmt: skip
_declare("nvfp4_row_amax_{sfx}", "{copies}", copies=_NVFP4_COPIES)
_declare("nvfp4_quantize_rows_{sfx}", "{copies}", copies=_NVFP4_COPIES)
_declare("nvfp4_4over6_{sfx}", "{copies}, int per_row", copies=_NVFP4_COPIES)
_declare("nvfp4_dequantize_rows",
         "const u8* data, const u8* scale, i64 scale_stride, const float* amax_rows, i64 rows, i64 cols, float* out")
# norms.cu (NORMS_INSTANTIATE): LayerNorm / RMSNorm forward and backward, the dgamma / dbeta and dbias column sums.
_declare("norm_forward_{sfx}",
         "const {T}* x, const {T}* gamma, const {T}* beta, i64 M, i64 K, float eps, int rms, int zero_centered, "
         "{T}* out, float* out32, float* mu, float* rsigma")  # fmt: skip
_declare("norm_backward_{sfx}",
         "const {T}* dz, const {T}* x, const float* mu, const float* rsigma, const {T}* gamma, i64 M, i64 K, int rms, "
         "int zero_centered, {T}* dx")  # fmt: skip
_declare("norm_columns_{sfx}",
         "const {T}* dz, const {T}* x, const float* mu, const float* rsigma, i64 M, i64 K, int rms, {T}* dgamma, "
         "{T}* dbeta")  # fmt: skip
_declare("column_sum_{sfx}", "const {T}* x, i64 M, i64 K, {T}* out")
# block_scaled_gemm.cu
_declare("block_scaled_gemm",
         "const u8* a_data, i64 a_is, i64 a_ks, const void* a_scale, i64 a_s_idiv, i64 a_s_is, i64 a_s_ks, "
         "const u8* b_data, i64 b_is, i64 b_ks, const void* b_scale, i64 b_s_idiv, i64 b_s_is, i64 b_s_ks, "
         "const float* amax_a, const float* amax_b, const float* bias, const float* c_in, int epilogue, void* out, "
         "i64 M, i64 N, i64 K")  # fmt: skip


def signature(name: str) -> Signature:
    """The declared signature of kernel `name` (TypeError if it has none)."""
    sig = KERNELS.get(name)
    if sig is None:
        raise TypeError(f"kernel {name!r} has no declared parameter list (native/kernels.py KERNELS)")
    return sig
