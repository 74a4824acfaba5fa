"""Native FP8 blockwise 1x128 / 128x128 (fp32 sinv per block): the kernels of native/cuda/fp8_block.cu.

Source: docs/numerics.md §4 (rowwise [M, K], colwise [K, M], the stored sinv layouts cuBLASLt reads as they
are), §6 (VEC128_32F / BLK128x128_32F on sm_90, the blockwise epilogue order). The launcher module of
"fp8_block" (`native.launchers`).
"""

from __future__ import annotations

import numpy as np
import torch

from reference.formats import QuantConfig
from reference.layouts import copy_geometry
from reference.types import QuantizedTensor

from .kernels import Patched
from .launch import PreparedLaunch, device_index, launch, module_for, programmatic_supported
from .launchers import CublasLtMode, LtScale
from .per_tensor import SUFFIX, THREADS, launch_dequantize, n_tiles, vec_flags
from .plan import Buffer, OneLaunchPlan, OutputBlock, Step, X

CU_FILE = "fp8_block.cu"
PLAN_MODULES: tuple = ()  # (CUDA file, config) builds a call plan launches besides its own: none
# NUMERICS: §6 table - VEC128_32F / BLK128x128_32F on sm_90 only, cuBLAS >= 12.9, TN only, aligned.
CUBLASLT = CublasLtMode(family="fp8_block", label="FP8 block-scaled (VEC128/BLK128x128)",
                        min_cc=(9, 0), only_cc=(9, 0), cublas_min=120900, aligned=True)


def scheme_defines(config) -> dict[str, int | float | str]:
    """No defines beyond `native._compile.defines_for`'s format rows."""
    return {}


def nvcc_check_configs(scheme: str) -> tuple[QuantConfig, ...]:
    """The configs the nvcc check builds: the scheme's defaults."""
    return (QuantConfig(scheme),)


def quantize_2d(x2d: torch.Tensor, config, *, rowwise: bool, colwise: bool, rng=None, state=None) -> dict:
    """FP8 blockwise 1x128 / 128x128 (docs/numerics.md §4): rowwise [M, K], colwise [K, M], fp32 sinv layouts."""
    dev = x2d.device
    index = device_index(dev)
    m, k = x2d.shape
    f32 = dict(dtype=torch.float32, device=dev)
    q_row = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None  # (M, K)
    q_col = torch.empty((k, m), dtype=torch.uint8, device=dev) if colwise else None  # (K, M)
    # The kernel writes every scale, the zero padding included (fp8_block.cu), so no memset is needed.
    s_r = torch.empty(copy_geometry(config, "rowwise", m, k).scale_padded_shape, **f32) if rowwise else None
    s_c = torch.empty(copy_geometry(config, "colwise", m, k).scale_padded_shape, **f32) if colwise else None
    vec_in, vec_row, vec_col = vec_flags(x2d, q_row, q_col)
    ld_r = s_r.shape[1] if s_r is not None else 0
    ld_c = s_c.shape[1] if s_c is not None else 0
    launch(module_for(CU_FILE, config, index), f"fp8_block_quantize_{SUFFIX[x2d.dtype]}", n_tiles(m, k), THREADS,
           (x2d, np.int64(m), np.int64(k), vec_in, vec_row, vec_col, q_row, s_r, np.int64(ld_r), q_col, s_c,
            np.int64(ld_c)), index)  # fmt: skip
    out: dict = {}
    if rowwise:
        out.update(rowwise_data=q_row, rowwise_scale=s_r, rowwise_amax=None)
    if colwise:
        out.update(colwise_data=q_col, colwise_scale=s_c, colwise_amax=None)
    return out


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(dec(q) * sinv)) as [M, K] (docs/numerics.md §4; the colwise copy is read transposed)."""
    return launch_dequantize(CU_FILE, "fp8_block_dequantize", q, orientation, dtype, scale_ld=True)


def lt_scale(view) -> LtScale:
    """NUMERICS: §4 - the stored sinv layouts are the ones cuBLASLt reads (TE passes them unchanged): 1-D
    [ceil(K/128), roundup(outer,4)] entry [kb, i]; 2-D [ceil(outer/128), roundup(ceil(K/128),4)] entry [ib, kb]."""
    return LtScale(view.scale, "BLK128x128_32F" if view.config.is_2d else "VEC128_32F")


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
        buffers, ptrs, lds = [], {}, {}
        for on, o, data_shape in ((rowwise, "rowwise", (m, k)), (colwise, "colwise", (k, m))):
            scale_shape = copy_geometry(config, o, m, k).scale_padded_shape if on else (0, 0)
            if on:
                buffers += [Buffer(f"{o}_data", data_shape, torch.uint8), Buffer(f"{o}_scale", scale_shape, torch.float32)]
            ptrs[o] = (Patched(f"{o}_data", torch.uint8), Patched(f"{o}_scale", torch.float32)) if on else (None, None)
            lds[o] = np.int64(scale_shape[1])
        self.block = block = OutputBlock(buffers)
        # vec_flags on ALIGN-aligned outputs and an input of the given alignment.
        vec_in = int(aligned and (k * dtype.itemsize) % 16 == 0)
        vec_row, vec_col = int(not rowwise or k % 8 == 0), int(not colwise or m % 16 == 0)
        launch = PreparedLaunch(module_for(CU_FILE, config, index), f"fp8_block_quantize_{SUFFIX[dtype]}",
                                n_tiles(m, k), THREADS,
                                (Patched(X, dtype), np.int64(m), np.int64(k), vec_in, vec_row, vec_col,
                                 *ptrs["rowwise"], lds["rowwise"], *ptrs["colwise"], lds["colwise"]), index,
                                programmatic=programmatic_supported(index))  # fmt: skip
        self.steps = (Step(launch, block),)


def plan_quantize(config, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool, aligned: bool,
                  given: bool, index: int) -> QuantizePlan:
    """The call plan of quantize_2d for this signature (native.plan)."""
    return QuantizePlan(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=aligned, given=given,
                        index=index)
