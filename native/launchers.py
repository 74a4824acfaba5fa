"""The native launcher registry: scheme name (the keys of `reference.formats.SCHEMES`) -> the module that
launches that scheme's kernels.

Source: docs/design.md §2-§4 (native is a drop-in backend; format numbers reach kernels as defines), docs/numerics.md
§6 (the cuBLASLt table). Generic native code (`native.quantize`, `native.gemm`, `native.modules`) asks
`launcher(config.scheme)` and never branches on a scheme's name; everything that differs per scheme lives
in its launcher module, which provides:

- `CU_FILE`: its CUDA source under native/cuda (built with `native._compile.defines_for(config)`);
- `quantize_2d(x2d, config, *, rowwise, colwise, rng, state) -> dict` of QuantizedTensor fields, and
  `dequantize(q, orientation, dtype) -> [M, K]`, on CUDA tensors already checked by `reference.spec`;
- `CUBLASLT` (a `CublasLtMode`: its docs/numerics.md §6 cuBLASLt row), `lt_scale(view) -> LtScale` (the scale
  tensor and scale mode cuBLASLt reads for one consumed copy), `lt_alpha(a_view, b_view) -> float`;
- `scheme_defines(config)` (its own compile-time defines) and `nvcc_check_configs(scheme)`;
- `plan_quantize(config, m, k, dtype, *, rowwise, colwise, aligned, given, index)`: quantize_2d's launches for one
  call signature, prepared once (`native.plan.QuantizePlan`, docs/design.md §4.1), and `PLAN_MODULES`, the
  (CUDA file, config) builds such a plan launches besides its own (`native.modules.modules_for` names them).
The GEMM epilogue order is the scheme row's (`Scheme.round_before_accumulate`, docs/numerics.md §6).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType

import torch

from reference.formats import SCHEMES

# Scheme -> launcher module (native/<module>.py).
MODULES: dict[str, str] = {
    "fp8_current": "per_tensor",
    "fp8_delayed": "per_tensor",
    "mxfp8": "mxfp8",
    "fp8_block": "fp8_block",
    "nvfp4": "nvfp4",
}
assert set(MODULES) == set(SCHEMES), "every scheme of reference.formats.SCHEMES needs a native launcher"


@dataclass(frozen=True)
class CublasLtMode:
    """One row of docs/numerics.md §6's cuBLASLt table: where the scheme's scale mode runs and what it needs."""

    family: str  # the row's name in reports and messages ("per_tensor", "mxfp8", ...)
    label: str  # how the arch messages name it ("per-tensor FP8", "MXFP8", ...)
    min_cc: tuple[int, int]  # lowest compute capability
    cublas_min: int  # lowest cublasLtGetVersion()
    only_cc: tuple[int, int] | None = None  # the one compute capability it runs on (fp8_block: sm_90)
    fast_accum: bool = False  # Hopper fast accumulation is an option (per-tensor FP8)
    any_layout: bool = False  # both operands need not be K-contiguous (TN only otherwise)
    aligned: bool = False  # K % 16 == 0 and M, N % 8 == 0 (TE cublaslt_gemm.cu, block scaling)


@dataclass(frozen=True)
class LtScale:
    """The scale tensor of one consumed copy in the layout cuBLASLt reads, and its scale mode name."""

    scale: torch.Tensor
    mode: str  # a `cublasLtMatmulMatrixScale_t` name, e.g. "VEC32_UE8M0"


@functools.cache
def launcher(scheme: str) -> ModuleType:
    """The launcher module of `scheme` (ValueError for a name that is not a scheme)."""
    try:
        name = MODULES[scheme]
    except KeyError:
        raise ValueError(f"scheme {scheme!r} has no native launcher (schemes: {', '.join(MODULES)})") from None
    return importlib.import_module(f"{__package__}.{name}")
