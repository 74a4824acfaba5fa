"""Native MXFP8 (E4M3 / E5M2 data, UE8M0 scale per 32 elements): the kernels of native/cuda/mxfp8.cu.

Source: docs/numerics.md §3 (scale rule, both copies [M, K], compact E8M0 scales with zero padding, the
swizzled layout cuBLASLt reads), §6 (VEC32_UE8M0 on sm_100+). The launcher module of "mxfp8"
(`native.launchers`).
"""

from __future__ import annotations

import numpy as np
import torch

from reference.formats import QuantConfig
from reference.layouts import copy_geometry, geometry_of
from reference.types import QuantizedTensor

from . import swizzle
from .kernels import Patched
from .launch import PreparedLaunch, device_index, launch, module_for, programmatic_supported
from .launchers import CublasLtMode, LtScale
from .per_tensor import SUFFIX, THREADS, launch_dequantize, n_tiles
from .plan import Buffer, OneLaunchPlan, OutputBlock, Step, X

CU_FILE = "mxfp8.cu"
PLAN_MODULES: tuple = ()  # (CUDA file, config) builds a call plan launches besides its own: none
# NUMERICS: §6 table - VEC32_UE8M0 on sm_100+, cuBLAS >= 12.8; any layout (both copies are K-scaled).
CUBLASLT = CublasLtMode(family="mxfp8", label="MXFP8", min_cc=(10, 0), cublas_min=120800, any_layout=True)


def _vec_flags(x2d: torch.Tensor, q_row, q_col) -> tuple[int, int]:
    """(vec_in, vec_out): 16-byte input rows; 8-byte stores of both [M, K] outputs."""
    m, k = x2d.shape
    vec_in = x2d.data_ptr() % 16 == 0 and (k * x2d.element_size()) % 16 == 0
    vec_out = k % 8 == 0 and all(t is None or t.data_ptr() % 8 == 0 for t in (q_row, q_col))
    return int(vec_in), int(vec_out)


def scheme_defines(config) -> dict[str, int | float | str]:
    """No defines beyond `native._compile.defines_for`'s format rows."""
    return {}


def nvcc_check_configs(scheme: str) -> tuple[QuantConfig, ...]:
    """The configs the nvcc check builds: the scheme's defaults."""
    return (QuantConfig(scheme),)


def quantize_2d(x2d: torch.Tensor, config, *, rowwise: bool, colwise: bool, rng=None, state=None) -> dict:
    """MXFP8 (docs/numerics.md §3): both copies [M, K], compact E8M0 scales with zero padding."""
    dev = x2d.device
    index = device_index(dev)
    m, k = x2d.shape
    u8 = dict(dtype=torch.uint8, device=dev)
    q_row = torch.empty((m, k), **u8) if rowwise else None
    q_col = torch.empty((m, k), **u8) if colwise else None
    # The kernel writes every scale byte, the zero padding included (mxfp8.cu), so no memset is needed.
    s_r = torch.empty(copy_geometry(config, "rowwise", m, k).scale_padded_shape, **u8) if rowwise else None
    s_c = torch.empty(copy_geometry(config, "colwise", m, k).scale_padded_shape, **u8) if colwise else None
    vec_in, vec_out = _vec_flags(x2d, q_row, q_col)
    ld_r = s_r.shape[1] if s_r is not None else 0
    ld_c = s_c.shape[1] if s_c is not None else 0
    launch(module_for(CU_FILE, config, index), f"mxfp8_quantize_{SUFFIX[x2d.dtype]}", n_tiles(m, k), THREADS,
           (x2d, np.int64(m), np.int64(k), vec_in, vec_out, q_row, s_r, np.int64(ld_r), q_col, s_c, np.int64(ld_c)),
           index)  # fmt: skip
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=q_row, rowwise_scale=s_r, rowwise_amax=None)
    if colwise:
        out.update(colwise_data=q_col, colwise_scale=s_c, colwise_amax=None)
    return out


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(D(e) * dec(q))) as [M, K] (docs/numerics.md §3; both copies are [M, K])."""
    return launch_dequantize(CU_FILE, "mxfp8_dequantize", q, orientation, dtype, scale_ld=True)


def lt_scale(view) -> LtScale:
    """The consumed copy's E8M0 scales, swizzled (docs/numerics.md §3 Layouts: rowwise T = S_r, colwise T = S_c^T)."""
    g = geometry_of(view.q, view.orientation)
    return LtScale(swizzle.swizzled(view.scale, g.scale_valid_shape, transposed=g.swizzle_transposed),
                   "VEC32_UE8M0")  # fmt: skip


def lt_alpha(a_view, b_view) -> float:
    """cuBLASLt's alpha: 1 (the block scales carry everything)."""
    return 1.0


# ---- the cached call plan (native.plan) ----------------------------------------------------------------------


class QuantizePlan(OneLaunchPlan):
    """quantize_2d above for one (config, M, K, dtype, copies, x alignment) signature, prepared once
    (docs/design.md §4.1): the same launch with the same arguments, programmatic on sm_90 and later (the kernel
    waits for the grid before it first, then lets the next call's kernel start as its CTAs end)."""

    def __init__(self, config, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool, aligned: bool,
                 given: bool, index: int):  # fmt: skip
        self.index = index
        buffers, ptrs = [], {}
        for on, o in ((rowwise, "rowwise"), (colwise, "colwise")):
            if on:
                buffers += [Buffer(f"{o}_data", (m, k), torch.uint8),
                            Buffer(f"{o}_scale", copy_geometry(config, o, m, k).scale_padded_shape, torch.uint8)]
            ptrs[o] = (Patched(f"{o}_data", torch.uint8), Patched(f"{o}_scale", torch.uint8)) if on else (None, None)
        self.block = block = OutputBlock(buffers)
        # _vec_flags on ALIGN-aligned outputs and an input of the given alignment.
        vec_in = int(aligned and (k * dtype.itemsize) % 16 == 0)
        vec_out = int(k % 8 == 0)
        ld_r = copy_geometry(config, "rowwise", m, k).scale_padded_shape[1] if rowwise else 0
        ld_c = copy_geometry(config, "colwise", m, k).scale_padded_shape[1] if colwise else 0
        launch = PreparedLaunch(module_for(CU_FILE, config, index), f"mxfp8_quantize_{SUFFIX[dtype]}", n_tiles(m, k),
                                THREADS, (Patched(X, dtype), np.int64(m), np.int64(k), vec_in, vec_out, *ptrs["rowwise"],
                                          np.int64(ld_r), *ptrs["colwise"], np.int64(ld_c)), index,
                                programmatic=programmatic_supported(index))  # fmt: skip
        self.steps = (Step(launch, block),)


def plan_quantize(config, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool, aligned: bool,
                  given: bool, index: int) -> QuantizePlan:
    """The call plan of quantize_2d for this signature (native.plan)."""
    return QuantizePlan(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=aligned, given=given,
                        index=index)
