"""Kernel parameter declarations (native/kernels.py) against the CUDA sources, and the launch-time check.

Source: docs/design.md §2 (tensors cross as raw pointers through 8-byte slots, `native.launch`). The
sources are parsed here with a small preprocessor of our own: backslash continuations joined, comments
dropped, the instantiation macros (NH_AMAX(f32, float), NVFP4_INSTANTIATE(...), ...) expanded with
their arguments and `##` pasting, object-like macros (NVFP4_PAD_PARAMS) substituted in parameter lists.
"""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from native import kernels as K
from native.launch import pack_params

CUDA_DIR = Path(__file__).resolve().parents[2] / "native" / "cuda"
_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)')
_FUNC_MACRO = re.compile(r"^\s*#\s*define\s+(\w+)\(([^)]*)\)\s*(.*)$")
_OBJ_MACRO = re.compile(r"^\s*#\s*define\s+(\w+)\s+(.*)$")


def _logical_lines(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text.replace("\\\n", " ").split("\n")


def _substitute(body: str, params: list[str], args: list[str]) -> str:
    for p, a in zip(params, args, strict=True):
        body = re.sub(rf"\b{re.escape(p)}\b", a, body)
    return re.sub(r"\s*##\s*", "", body)


def parse_kernels(text: str) -> dict[str, tuple[K.Param, ...]]:
    """Every extern "C" __global__ kernel of one source: name -> parameters (canonical C types)."""
    func_macros, obj_macros, plain = {}, {}, []
    for line in _logical_lines(text):
        if m := _FUNC_MACRO.match(line):
            func_macros[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], m.group(3))
        elif m := _OBJ_MACRO.match(line):
            obj_macros[m.group(1)] = m.group(2)
        elif not line.lstrip().startswith("#"):
            plain.append(line)
    code = "\n".join(plain)
    # Expand the invocations of macros whose body defines a kernel, e.g. "NH_AMAX(f32, float)".
    for name, (params, body) in func_macros.items():
        if "__global__" not in body:
            continue
        code = re.sub(rf"\b{name}\(([^()]*)\)",
                      lambda m, p=params, b=body: _substitute(b, p, [a.strip() for a in m.group(1).split(",")]), code)
    out = {}
    for m in _KERNEL.finditer(code):
        params = m.group(2)
        for name, body in obj_macros.items():
            params = re.sub(rf"\b{name}\b", body, params)
        assert m.group(1) not in out, f"kernel {m.group(1)} defined twice"
        out[m.group(1)] = K.parse_params(params)
    return out


def _source_kernels() -> dict[str, tuple[K.Param, ...]]:
    found: dict[str, tuple[K.Param, ...]] = {}
    for path in sorted(CUDA_DIR.glob("*.cu*")):
        for name, params in parse_kernels(path.read_text()).items():
            assert name not in found, f"{name} in two sources"
            found[name] = params
    return found


def test_parser_expands_instantiation_macros_and_object_macros():
    text = """
    #define PADS float* p, \\
        i64 n  // a comment
    #define INST(SUFFIX, T) \\
      extern "C" __global__ void __launch_bounds__(256, 2) k_##SUFFIX(const T* __restrict__ x, PADS) { f<T>(x); }
    INST(f32, float)
    INST(bf16, __nv_bfloat16)
    /* extern "C" __global__ void commented_out(int a) */
    extern "C" __global__ void plain(u8 *q, u32 s) {}
    """
    got = parse_kernels(text)
    assert got == {
        "k_f32": (K.Param("x", "const float*"), K.Param("p", "float*"), K.Param("n", "long long")),
        "k_bf16": (K.Param("x", "const __nv_bfloat16*"), K.Param("p", "float*"), K.Param("n", "long long")),
        "plain": (K.Param("q", "unsigned char*"), K.Param("s", "unsigned int")),
    }


def test_every_source_kernel_is_declared_with_its_exact_parameters():
    found = _source_kernels()
    assert len(found) == len(K.KERNELS) == 55  # 16 kernels x 3 dtypes + 7 without a dtype suffix
    assert sorted(found) == sorted(K.KERNELS)
    for name, params in found.items():
        assert K.KERNELS[name].params == params, f"{name}: source {params} != declared {K.KERNELS[name].params}"


def test_every_declared_type_has_a_slot_rule():
    for sig in K.KERNELS.values():
        for p in sig.params:
            assert (p.pointee in K.POINTEES) if p.pointer else (p.ctype in K.SCALARS), (sig.name, p)


def _read_slots(ptr: int, n: int) -> list[int]:
    ptrs = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_void_p))
    return [ctypes.c_uint64.from_address(ptrs[i]).value for i in range(n)]


def test_slots_hold_values_in_the_declared_type():
    # delayed_update(const float* hist, float* h_out, float* scale, const float* reduced, int has_reduced)
    assert _read_slots(pack_params("delayed_update", [None, None, None, None, np.int32(-1)]), 5) == [0, 0, 0, 0,
                                                                                                    (1 << 64) - 1]
    # A Python int in range takes the parameter's type; 4-byte parameters read the slot's low bytes.
    assert _read_slots(pack_params("delayed_update", [None] * 4 + [1]), 5)[4] == 1
    # nvfp4_quantize_f32: u64 seed at index 3, u32 row_stream at index 8.
    args = [None, np.int64(-5), 7, np.uint64((1 << 64) - 1), None, None, 0, None, np.uint32(0xDEADBEEF),
            None, None, 0, None, 0, None]
    slots = _read_slots(pack_params("nvfp4_quantize_f32", args), 15)
    assert slots[1] == (1 << 64) - 5 and slots[2] == 7 and slots[3] == (1 << 64) - 1 and slots[8] == 0xDEADBEEF
    # nvfp4_scale_padding: i64 strides and padded rows, null scales.
    pad = _read_slots(pack_params("nvfp4_scale_padding", [None, np.int64(-2), 9, None, 0, 3, 48, 80]), 8)
    assert pad == [0, (1 << 64) - 2, 9, 0, 0, 3, 48, 80]
    sig = K.Signature("f", K.parse_params("float v"))
    assert sig.slots([np.float32(1.5)]) == [0x3FC00000]


def test_wrong_count_and_types_fail_with_the_parameter_named():
    with pytest.raises(TypeError, match=r"kernel delayed_update takes 5 arguments \(hist, h_out, scale, reduced, "
                                        r"has_reduced\), got 4"):
        pack_params("delayed_update", [None] * 4)
    with pytest.raises(TypeError, match=r"argument 4 \(int has_reduced\): expected int32"):
        pack_params("delayed_update", [None] * 4 + [np.int64(1)])  # an int64 where the kernel reads int
    with pytest.raises(TypeError, match=r"argument 4 \(int has_reduced\)"):
        pack_params("delayed_update", [None] * 4 + [1 << 40])  # out of the int range
    with pytest.raises(TypeError, match=r"argument 4 \(int has_reduced\)"):
        pack_params("delayed_update", [None] * 4 + [1.0])
    with pytest.raises(TypeError, match=r"argument 0 \(const float\* hist\): expected a tensor of torch.float32, "
                                        r"got torch.bfloat16"):
        pack_params("delayed_update", [torch.zeros(2, dtype=torch.bfloat16)] + [None] * 3 + [0])
    with pytest.raises(TypeError, match=r"argument 0 \(const float\* hist\): expected a CUDA tensor or None, got int"):
        pack_params("delayed_update", [0] + [None] * 3 + [0])
    with pytest.raises(ValueError, match=r"argument 0 \(const float\* hist\): tensor on cpu: expected a CUDA tensor"):
        pack_params("delayed_update", [torch.zeros(2)] + [None] * 3 + [0])
    with pytest.raises(TypeError, match=r"argument 0 \(const __nv_bfloat16\* x\)"):
        pack_params("tensor_amax_bf16", [torch.zeros(2), 4, 1, None])  # fp32 input to the bf16 build
    with pytest.raises(TypeError, match=r"argument 1 \(long long n\): expected int64"):
        pack_params("tensor_amax_f32", [None, np.int32(4), 1, None])
    with pytest.raises(TypeError, match="has no declared parameter list"):
        pack_params("no_such_kernel", [])


def test_typed_pointers_accept_their_dtypes_up_to_the_cuda_check():
    """On the CPU a tensor of an accepted dtype gets past the type check and stops at the device check."""
    for name, index, dtype in [("tensor_amax_f16", 0, torch.float16), ("nvfp4_amax_f32", 3, torch.float32),
                               ("nvfp4_amax_f32", 0, torch.int8), ("mxfp8_dequantize_f32", 1, torch.uint8)]:
        args = [None] * len(K.KERNELS[name].params)
        for i, p in enumerate(K.KERNELS[name].params):
            if not p.pointer:
                args[i] = 0
        args[index] = torch.zeros(4, dtype=dtype)
        with pytest.raises(ValueError, match="expected a CUDA tensor"):
            pack_params(name, args)
