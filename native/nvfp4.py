"""Native NVFP4 quantize / dequantize / GEMM scales: the launcher module of "nvfp4" (`native.launchers`),
driving the kernels of native/cuda/nvfp4.cu from torch CUDA tensors; its own swizzle (`native.swizzle`)
and GEMM alpha (§5.8, numpy fp32 on the host for cuBLASLt; block_scaled_gemm.cu computes it in-kernel).

Source: docs/numerics.md §5 (NVFP4: 5.1-5.4 scale chain and codes, 5.5 copies and 2-D tiles, 5.6 RHT,
5.7 SR, 5.8 dequantization, 5.9 layouts), §0.3 (kernel rules). Same fields and bits as
`reference.nvfp4`; kernels are built only through `native._compile` and run on torch's current
stream, reading and writing torch tensors in place (raw device pointers, `native.launch`).

Passes per call (the copy modes RHT / SR / 2-D are compile-time, from defines_for(config)):
1. amax(X) (the rowwise copy's A_g; also the columnwise one's without RHT), a grid-stride kernel
   with a thread per GROUP 16-element blocks; or, when the columnwise copy uses RHT, one pass over
   the quantize tiles giving both amax(X) and the post-RHT amax (the RHT is recomputed in pass 2,
   not stored): one wave of CTAs (`RHT_AMAX_CTAS_PER_SM` per SM), a warp per 16-row m-block of a tile, each
   lane reading its word column's 16 rows straight from X (no shared memory, no barrier). Both write one
   zeroed [3] buffer (slot 0 the rowwise A_g, slot 1 the columnwise; slot 2 is pass 2's tile counter). Both load
   X at L2 evict-first priority (native/cuda/l2_policy.cuh), so the previous call's dirty outputs are written back
   during pass 2, not during this DRAM-bound pass;
2. one tiled kernel quantizes the requested copies: one wave of resident CTAs (`quantize_ctas_per_sm` per
   SM), each walking 128-row tiles of X (its first tile by block index, each later one drawn from the zeroed
   counter, so the CTAs of an SM finish together), reads each tile once into shared memory (double-buffered: the
   next tile's copies are in flight while it encodes one) and encodes its rowwise blocks and its column
   segments (the blocks of X^T) from there; 2-D builds reduce the 16x16 tile amaxes from the same tile
   (no separate pass). It writes the codes and the scale of every block; `nvfp4_scale_padding`, launched after
   it only for a shape that leaves some, the scales' zero padding: every output byte is written, so the outputs
   come from torch.empty. A call plan launches it programmatically
   (native/launch.py, docs/design.md §4.1): its CTAs copy their first tile while pass 1 (or fill_given) ends,
   then wait for A_g and the tile counter. A given-amax plan's first launch is fill_given (the given amax into
   both A_g slots, the counter cleared); so is an own-amax plan's for a large X (per_tensor.CLEAR_LAUNCH_MIN_X_BYTES:
   the slots and counter cleared, in place of the block's memset), pass 1 then launched programmatically after it:
   it reads X, then waits for the cleared slots before its atomics.
A given amax (TE's quantize_with_amax, §5.1; never with RHT) replaces pass 1: X is read once, by pass 2.

The §5.10 variants (4over6, row-scaled) take their own simple kernels (`quantize_variant_with`): amax(X), or
one amax per row of each copy (a CTA per group of rows, `row_amax_units`), then one thread per block (per 16x16
tile in 2-D builds) reading the copy from X through strides, both copies in one launch per kernel (issue #18:
per-call host cost), which also zeroes the scales' padding; row-scaled copies dequantize with each row's A_g
(`dequantize_rows_with`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from reference.formats import FORMATS, RHT_SCALE, RHT_SIGN_MASK, RHT_SIZE, QuantConfig
from reference.layouts import copy_geometry, geometry_of
from reference.types import QuantizedTensor, SpecViolation, SRSeed

from . import swizzle
from .kernels import Patched
from .launch import PreparedLaunch, device_index, launch, module_for, programmatic_supported, raw_stream, sm_count
from .launchers import CublasLtMode, LtScale
from .per_tensor import CU_FILE as PER_TENSOR_CU_FILE
from .per_tensor import FILL_CONFIG, clears_by_launch, fill_given
from .plan import Buffer, OutputBlock, Step, X, given_on
from .plan import QuantizePlan as QuantizePlanBase

CU_FILE = "nvfp4.cu"
# (CUDA file, config) builds a call plan launches besides its own: the first launch of a given-amax plan, and of an
# own-amax one at per_tensor.CLEAR_LAUNCH_MIN_X_BYTES, fill_given.
PLAN_MODULES = ((PER_TENSOR_CU_FILE, FILL_CONFIG),)
# NUMERICS: §6 table - VEC16_UE4M3 + alpha on sm_100+, cuBLAS >= 12.8, TN only.
CUBLASLT = CublasLtMode(family="nvfp4", label="NVFP4", min_cc=(10, 0), cublas_min=120800)

THREADS = 256  # a multiple of 32: the amax reductions use full-warp shuffles (nvfp4.cu NVFP4_THREADS)
MAX_BLOCKS = 1 << 20  # kernels are grid-stride loops; this only caps the launch size
REDUCE_BLOCKS = 1024  # amax kernels: few blocks, one atomic each
GROUP = 4  # 16-element blocks per thread (nvfp4.cu GROUP)
WARP = 32
TILE_M = 128  # rows of X per quantize tile (nvfp4.cu TILE_M)
TILE_BYTES = 128  # bytes of X per tile row (nvfp4.cu TILE_WORDS * 4): 64 16-bit or 32 fp32 columns

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
# NUMERICS: §5.10 - the 4over6 map-to-4 candidate expands the block scale by 1.5 (exact).
MAP4_EXPAND = 1.5
_MASK32 = 0xFFFFFFFF

# A launcher runs kernel `name` over `n_units` work units with positional `args`: torch tensors
# (passed as device pointers), None (a null pointer) or numpy scalars (their C type is the param's).
# CTAs have THREADS threads; `units_per_block` is how many units one CTA covers per grid-stride step
# (THREADS for the thread-per-unit kernels, 1 for the quantize kernel: a tile per CTA and step), and
# `max_blocks` caps the grid (the kernels are grid-stride loops).
Launcher = Callable[..., None]


def scheme_defines(config: QuantConfig) -> dict[str, int | float | str]:
    """nvfp4.cu's own defines: the copy modes and the global-scale and RHT constants."""
    from ._compile import recip

    # NUMERICS: §5.10 - 6 * e4m3_max (exact): 2688 (E2M1 max * E4M3 max) for every config but a 4over6
    # variant with e4m3_max = 256 (1536), which sets S_enc, the candidate error and the dequantization.
    gmax = config.element_format.max_finite * config.e4m3_max
    return {
        "RHT": int(config.rht),
        "STOCHASTIC": int(config.stochastic),
        # NUMERICS: §5.10 the 4over6 kernel's error mode and map-to-4 expansion.
        "NVFP4_ERR_MSE": int(config.err_mode == "mse"),
        "NVFP4_MAP4_EXPAND": MAP4_EXPAND,
        "NVFP4_GLOBAL_MAX": float(gmax),
        "NVFP4_RECIP_GLOBAL_MAX": recip(gmax),
        "NVFP4_RECIP_ALPHA": recip(gmax * gmax),
        # NUMERICS: §5.6 the RHT constants, from the formats.py row.
        "NVFP4_RHT_SIZE": RHT_SIZE,
        "NVFP4_RHT_SIGN_MASK": RHT_SIGN_MASK,
        "NVFP4_RHT_SCALE": RHT_SCALE,
        "NVFP4_QUANT_MIN_BLOCKS": quantize_ctas_per_sm(config),
        "NVFP4_RHT_AMAX_MIN_BLOCKS": RHT_AMAX_CTAS_PER_SM,
    }


def quantize_ctas_per_sm(config: QuantConfig) -> int:
    """Resident quantize CTAs per SM, the quantize kernel's __launch_bounds__ minimum (NVFP4_QUANT_MIN_BLOCKS) and
    its grid per SM: 3 (<= 80 registers a thread; 37 KiB of shared memory each). With tiles drawn from a counter, 4
    CTAs (64 registers) were no faster: the same ncu issue rate and 2.5% slower back to back on an H200
    (docs/performance.md §4.2); SR builds need 80 anyway (their Philox path spills at 64)."""
    del config  # every config: RN, SR, RHT, 2-D
    return 3


# Resident post-RHT amax CTAs per SM (nvfp4.cu nvfp4_rht_amax's __launch_bounds__ minimum) and its grid per SM: 3
# (80 registers, no spill; at 64 registers for 4 the kernel spills). A grid of 6 / 12 / 24 / 62 CTAs per SM was
# slower back to back on an H200 (RHT + SR call 283 -> 285 / 288 / 293 / 310 us; docs/performance.md §4.4).
RHT_AMAX_CTAS_PER_SM = 3


def nvcc_check_configs(scheme: str) -> tuple[QuantConfig, ...]:
    """The configs the nvcc check builds: 1-D with RHT and stochastic rounding, and 2-D RN 4over6 with the MSE
    error (IS_2D, NVFP4_ERR_MSE): the compile-time modes (defines_for) the first leaves off."""
    return (QuantConfig(scheme, rht=True, stochastic=True),
            QuantConfig(scheme, tile=(16, 16), variant="4over6", err_mode="mse"))


class CupyLauncher:
    """Launches nvfp4.cu kernels of one config on torch's current stream (`native.launch`)."""

    def __init__(self, config: QuantConfig, device: torch.device):
        self._device_index = device_index(device)
        self._module = module_for(CU_FILE, config, self._device_index)

    def __call__(
        self, name: str, n_units: int, args: Sequence, max_blocks: int = MAX_BLOCKS, units_per_block: int = THREADS
    ) -> None:
        if n_units <= 0:
            return
        grid = min(-(-n_units // units_per_block), max_blocks)
        launch(self._module, name, grid, THREADS, args, self._device_index)


@functools.cache
def _cached_launcher(config: QuantConfig, device_index: int) -> CupyLauncher:
    return CupyLauncher(config, torch.device("cuda", device_index))


def _launcher(config: QuantConfig, device: torch.device) -> Launcher:
    return _cached_launcher(config, device_index(device))


def _i64(v: int) -> np.int64:
    return np.int64(v)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _contiguous_units(n_blocks: int) -> int:
    """Threads covering n_blocks consecutive blocks: whole warps of GROUP-block units (nvfp4.cu contiguous_units)."""
    return _cdiv(n_blocks, GROUP * WARP) * WARP


def _copy_rows(orientation: str, m: int, k: int) -> int:
    """Rows of one copy of X [m, k]: the rowwise copy is X, the colwise one X^T [k, m]."""
    return m if orientation == "rowwise" else k


def _variant_copies(copies: Sequence) -> list:
    """The variant kernels' arguments of both copies (nvfp4.cu NVFP4_VARIANT_PARAMS after x, m, k): per copy its
    (data, scale, scale row stride, scale rows, A_g) or, for a copy not requested, None (null pointers)."""
    out: list = []
    for c in copies:
        out += [None, None, _i64(0), _i64(0), None] if c is None else list(c)
    return out


ROW_AMAX_WARPS = THREADS // WARP  # rows of X per row-amax CTA unit of the rowwise copy (nvfp4.cu ROW_AMAX_WARPS)


def row_amax_units(m: int, k: int, rowwise: bool, colwise: bool) -> int:
    """CTA units of nvfp4_row_amax over X [m, k]: ROW_AMAX_WARPS rows of X each for the rowwise copy, then WARP
    columns of X (rows of X^T) each for the columnwise copy (nvfp4.cu row_amax_of_rows / row_amax_of_columns)."""
    return (_cdiv(m, ROW_AMAX_WARPS) if rowwise else 0) + (_cdiv(k, WARP) if colwise else 0)


def _variant_launches(config: QuantConfig, sfx: str, m: int, k: int, rowwise: bool, colwise: bool,
                      args: list) -> list[tuple[str, int, list, int]]:
    """The variant kernels after amax(X) (nvfp4.cu NVFP4_VARIANT_INSTANTIATE), each over both copies at once:
    (kernel, units, arguments, units per CTA), `args` being x, m, k and `_variant_copies`. Units: a CTA's rows of
    each requested copy (row amax, `row_amax_units`), a thread's 1x16 block (quantize_rows, 1-D 4over6) or 16x16
    tile (2-D 4over6); each copy holds m * k elements."""
    elems = (int(bool(rowwise)) + int(bool(colwise))) * m * k
    out = []
    if config.row_scaled:
        # NUMERICS: §5.10 row-scaled - A_g of each row of the copy (a row, or a column of X).
        out.append((f"nvfp4_row_amax_{sfx}", row_amax_units(m, k, rowwise, colwise), args, 1))
    if config.four_over_six:
        out.append((f"nvfp4_4over6_{sfx}", elems // (config.block * config.tile[0]), [*args, np.int32(config.row_scaled)],
                    THREADS))  # fmt: skip
    else:
        out.append((f"nvfp4_quantize_rows_{sfx}", elems // config.block, args, THREADS))
    return out


def tile_count(m: int, k: int, dtype: torch.dtype) -> int:
    """Tiles of the quantize (and RHT amax) kernels over X [m, k]: TILE_M rows x TILE_BYTES of a row each. The
    kernels number them, and X's rows and columns, in 32 bits (nvfp4.cu quantize_tiles, nvfp4_rht_amax):
    at most 2^31 - 1 tiles (X below ~2^44 elements) and m, k below 2^32."""
    n = _cdiv(m, TILE_M) * _cdiv(k, TILE_BYTES // dtype.itemsize)
    # (unreachable with today's memory sizes: kept so the kernel's assumptions are checked)
    if m >= 1 << 32 or k >= 1 << 32:
        raise SpecViolation(f"native.nvfp4: X [{m}, {k}]; the quantize kernel indexes rows and columns in 32 bits")
    if n >= 1 << 31:
        raise SpecViolation(f"native.nvfp4: X [{m}, {k}] has {n} quantize tiles; the kernel numbers them in 31 bits")
    return n


@functools.cache
def _wave_blocks(ctas_per_sm: int, index: int | None) -> int:
    """The grid cap of a kernel launched as one wave of resident CTAs (`ctas_per_sm` a SM) on CUDA device `index`,
    each walking its tiles: the quantize kernel (quantize_ctas_per_sm) and the post-RHT amax kernel
    (RHT_AMAX_CTAS_PER_SM; docs/design.md §4.2). MAX_BLOCKS without a device (CPU-only tests of the launch
    arguments)."""
    if index is None or not torch.cuda.is_available():
        return MAX_BLOCKS
    return sm_count(index) * ctas_per_sm


def quantize_with(
    launch: Launcher, x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool, seed: SRSeed | None,
    given: torch.Tensor | None = None,
) -> dict:
    """QuantizedTensor fields of NVFP4(x2d), every kernel run through `launch` (docs/numerics.md §5).

    Without RHT both copies use A_g = amax(X) (§5.1), or the `given` amax (TE's quantize_with_amax: no amax
    pass, X is read once; never with RHT); with RHT the columnwise copy uses the amax of the bf16 RHT(X^T)
    (§5.6). SR: rowwise stream, columnwise stream + 1 (§5.7).
    """
    m, k = x2d.shape
    blk = config.block
    dev = x2d.device
    sfx = _SUFFIX[x2d.dtype]
    sr = seed is not None
    seed_u64 = np.uint64(seed.seed if sr else 0)
    stream_row = np.uint32(seed.stream & _MASK32 if sr else 0)
    stream_col = np.uint32((seed.stream + 1) & _MASK32 if sr else 0)  # NUMERICS: §5.7 colwise stream + 1
    out: dict = {}

    n_tiles = tile_count(m, k, x2d.dtype)  # quantize (and RHT amax) tiles
    index = device_index(dev) if dev.type == "cuda" else None  # (None: CPU-only tests of the launches)
    # NUMERICS: §0.1 amax, combined with an integer max on the fp32 bits (all values >= +0). One
    # zeroed [3] buffer holds both copies' A_g (slot 0 rowwise, slot 1 columnwise; the outputs are
    # views of them) and the quantize kernel's tile counter (slot 2, zero before the launch).
    bits = torch.zeros(3, dtype=torch.float32, device=dev)  # the kernels combine the fp32 bits as u32
    a_x, a_c, drawn = bits[0:1], bits[1:2], bits[2:3].view(torch.int32)

    # Every output comes from torch.empty: the quantize kernel writes the codes and the scales of
    # every block, nvfp4_scale_padding the scales' zero padding. A copy that is not requested gets null
    # pointers (the kernels skip it).
    copies, scales = [], []
    for on, orientation, a_g, stream in ((rowwise, "rowwise", a_x, stream_row), (colwise, "colwise", a_c, stream_col)):
        if not on:
            copies += [None, None, _i64(0), None, np.uint32(0)]
            scales.append(None)
            continue
        g = copy_geometry(config, orientation, m, k)
        data = torch.empty(g.data_shape, dtype=torch.uint8, device=dev)
        scale = torch.empty(g.scale_padded_shape, dtype=torch.uint8, device=dev)
        copies += [data, scale, _i64(scale.shape[1]), a_g, stream]
        scales.append(scale)
        out.update({f"{orientation}_data": data, f"{orientation}_scale": scale, f"{orientation}_amax": a_g})

    if given is not None:
        if config.rht:
            raise SpecViolation(f"{config.id}: a given amax does not apply with RHT (docs/numerics.md §5.6)")
        # NUMERICS: §5.1 - the given amax is A_g of both copies (TE's quantize_with_amax); no pass over X.
        bits[:2].copy_(given.to(device=dev, dtype=torch.float32).reshape(1).expand(2))
    elif colwise and config.rht:
        # NUMERICS: §5.6 - the columnwise A_g is the amax of the bf16 RHT output; the same pass
        # gives amax(X), the rowwise copy's A_g.
        launch("nvfp4_rht_amax", n_tiles, [x2d, _i64(m), _i64(k), a_c, a_x],
               max_blocks=_wave_blocks(RHT_AMAX_CTAS_PER_SM, index),
               units_per_block=1)  # fmt: skip
    else:
        launch(f"nvfp4_amax_{sfx}", _contiguous_units(m * k // blk), [x2d, _i64(m), _i64(k), a_x, a_c],
               max_blocks=REDUCE_BLOCKS)  # fmt: skip

    # The columnwise copy is X^T [K, M], read from the same shared-memory tiles of X (the kernel applies
    # the RHT in RHT builds); 2-D builds reduce the 16x16 tile amaxes (NUMERICS: §5.5) in the same kernel.
    launch(f"nvfp4_quantize_{sfx}", n_tiles, [x2d, _i64(m), _i64(k), seed_u64, *copies, drawn], units_per_block=1,
           max_blocks=_wave_blocks(quantize_ctas_per_sm(config), index))  # fmt: skip
    if padding := scale_padding_launch(config, m, k, scales):
        launch("nvfp4_scale_padding", *padding, max_blocks=REDUCE_BLOCKS)
    return out


def scale_padding_launch(config: QuantConfig, m: int, k: int, scales: Sequence) -> tuple[int, list] | None:
    """(work units, arguments) of nvfp4_scale_padding for the copies' scale tensors `scales` (rowwise, colwise: a
    tensor, a plan's `Patched` buffer, or None for a copy not requested), or None when no requested copy's scales
    have padding at this shape (NUMERICS: §5.9, zero padding). The last launch of a call, after the quantize kernel
    (which thus still follows the kernel it waits for: the amax pass or fill_given); an ordinary launch."""
    args, n_units = [], 0
    for o, scale in zip(("rowwise", "colwise"), scales, strict=True):
        if scale is None:
            args += [None, _i64(0), _i64(0)]
            continue
        g = copy_geometry(config, o, m, k)
        rows, stride = g.scale_padded_shape
        args += [scale, _i64(stride), _i64(rows)]
        if tuple(g.scale_padded_shape) != tuple(g.scale_valid_shape):
            n_units = max(n_units, rows, (rows - g.scale_valid_shape[0]) * stride)  # the kernel's two grid-stride loops
    return (n_units, [*args, _i64(m), _i64(k)]) if n_units else None


def quantize_2d(
    x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool, rng: SRSeed | None = None, state=None,
    amax: torch.Tensor | None = None,
) -> dict:
    """NVFP4 copies of a CUDA [M, K] tensor, already checked by `reference.spec.check_quantize`, as
    QuantizedTensor fields (docs/numerics.md §5; `state` unused); `amax` a given global amax, checked by
    `reference.spec.check_given_amax` (§5.1)."""
    if not x2d.is_cuda:
        raise SpecViolation(f"{config.id}: native.nvfp4 needs a CUDA tensor, got device {x2d.device}")
    seed = SRSeed.coerce(rng) if config.stochastic else None
    if config.stochastic and seed is None:  # (reference.spec checks this for native.quantize; direct callers too)
        raise SpecViolation(f"{config.id}: stochastic rounding needs rng=(seed, stream) (docs/numerics.md §5.7)")
    x2d = x2d.contiguous()
    if x2d.data_ptr() % 16:  # the kernels use 16-byte vector loads along rows
        x2d = x2d.clone()
    if config.variant is not None:
        return quantize_variant_with(_launcher(config, x2d.device), x2d, config, rowwise=rowwise, colwise=colwise,
                                     given=amax)
    return quantize_with(_launcher(config, x2d.device), x2d, config, rowwise=rowwise, colwise=colwise, seed=seed,
                         given=amax)


def quantize_variant_with(launch: Launcher, x2d: torch.Tensor, config: QuantConfig, *, rowwise: bool,
                          colwise: bool, given: torch.Tensor | None = None) -> dict:
    """QuantizedTensor fields of a 4over6 / row-scaled NVFP4 variant of x2d (docs/numerics.md §5.10).

    Each copy is quantized from its own source, X [M, K] or X^T [K, M] read through strides (so the
    16x16 4over6 colwise copy is not the rowwise transpose). A_g: amax(X) for both copies (§5.1), or
    row-scaled one per row of the copy ([M] rowwise, [K] colwise: the columns of X). No RHT and no SR
    (QuantConfig rejects them). The quantize kernel writes every block and zeroes the scales' padding (§5.9).
    A `given` amax (4over6 only: row-scaled takes none, reference.spec) replaces amax(X) for both copies.
    """
    m, k = x2d.shape
    dev = x2d.device
    sfx = _SUFFIX[x2d.dtype]
    out: dict = {}
    if not config.row_scaled and given is not None:
        # NUMERICS: §5.1 - the given amax is A_g of both copies (TE's quantize_with_amax); no pass over X.
        bits = given.to(device=dev, dtype=torch.float32).reshape(1).repeat(2)
    elif not config.row_scaled:
        # NUMERICS: §0.1 / §5.1 - A_g = amax(X), NaN ignored, into both slots (the copies' amaxes).
        bits = torch.zeros(2, dtype=torch.float32, device=dev)
        launch(f"nvfp4_amax_{sfx}", _contiguous_units(m * k // config.block), [x2d, _i64(m), _i64(k), bits[0:1],
               bits[1:2]], max_blocks=REDUCE_BLOCKS)  # fmt: skip
    copies: list = []
    for slot, (on, orientation) in enumerate(((rowwise, "rowwise"), (colwise, "colwise"))):
        if not on:
            copies.append(None)
            continue
        g = copy_geometry(config, orientation, m, k)
        data = torch.empty(g.data_shape, dtype=torch.uint8, device=dev)
        scale = torch.empty(g.scale_padded_shape, dtype=torch.uint8, device=dev)  # the kernel zeroes its padding
        # NUMERICS: §5.10 row-scaled - A_g of each row of the copy (a row, or a column of X).
        a_g = torch.empty(_copy_rows(orientation, m, k), dtype=torch.float32, device=dev) if config.row_scaled \
            else bits[slot : slot + 1]
        copies.append((data, scale, _i64(scale.shape[1]), _i64(scale.shape[0]), a_g))
        out.update({f"{orientation}_data": data, f"{orientation}_scale": scale, f"{orientation}_amax": a_g})
    # One launch per kernel for both copies (issue #18: per-call host cost).
    for name, n_units, args, per_cta in _variant_launches(config, sfx, m, k, rowwise, colwise,
                                                          [x2d, _i64(m), _i64(k), *_variant_copies(copies)]):  # fmt: skip
        launch(name, n_units, args, units_per_block=per_cta)
    return out


def dequantize_with(launch: Launcher, q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(v * g)) of one copy as [M, K] (docs/numerics.md §5.8); colwise transposed back."""
    data = getattr(q, f"{orientation}_data").contiguous()
    scale = getattr(q, f"{orientation}_scale").contiguous()
    a_g = getattr(q, f"{orientation}_amax").to(device=data.device, dtype=torch.float32).contiguous()
    blk = q.config.block
    rows, cols = data.shape[0], data.shape[1] * 2
    out = torch.empty((rows, cols), dtype=torch.float32, device=data.device)
    launch(
        "nvfp4_dequantize", rows * (cols // blk), [data, scale, _i64(scale.shape[1]), a_g, _i64(rows), _i64(cols), out]
    )
    xh = out.to(dtype)  # NUMERICS: §5.8 - RN(v * g) in fp32 by the kernel, then one RN_out
    return xh if orientation == "rowwise" else xh.t().contiguous()


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """TE's dequantization of one NVFP4 copy of a CUDA QuantizedTensor, as [M, K] (docs/numerics.md §5.8)."""
    data = getattr(q, f"{orientation}_data")
    if data is None:
        raise ValueError(f"this QuantizedTensor has no {orientation} copy (quantize with {orientation}=True)")
    if not data.is_cuda:
        raise SpecViolation(f"native.nvfp4.dequantize needs CUDA tensors, got device {data.device}")
    if q.config.row_scaled:
        return dequantize_rows_with(_launcher(q.config, data.device), q, orientation, dtype)
    return dequantize_with(_launcher(q.config, data.device), q, orientation, dtype)


def dequantize_rows_with(launch: Launcher, q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """Row-scaled x_hat = RN_out(RN(v * g)), g from each row's own A_g (docs/numerics.md §5.8, §5.10)."""
    data = getattr(q, f"{orientation}_data").contiguous()
    scale = getattr(q, f"{orientation}_scale").contiguous()
    a_g = getattr(q, f"{orientation}_amax").to(device=data.device, dtype=torch.float32).reshape(-1).contiguous()
    rows, cols = data.shape[0], data.shape[1] * 2
    if a_g.numel() != rows:
        raise SpecViolation(f"{q.config.id}: the {orientation} amax has {a_g.numel()} entries, expected one per "
                            f"row of the copy ({rows}; docs/numerics.md §5.10)")  # fmt: skip
    out = torch.empty((rows, cols), dtype=torch.float32, device=data.device)
    launch("nvfp4_dequantize_rows", rows * (cols // q.config.block),
           [data, scale, _i64(scale.shape[1]), a_g, _i64(rows), _i64(cols), out])  # fmt: skip
    xh = out.to(dtype)  # NUMERICS: §5.8 - RN(v * g) in fp32 by the kernel, then one RN_out
    return xh if orientation == "rowwise" else xh.t().contiguous()


# ---- GEMM ------------------------------------------------------------------------------------


def recip_alpha_range(e4m3_max_a: int | None = None, e4m3_max_b: int | None = None) -> np.float32:
    """fl(1 / (E2M1 max * E4M3 max)^2) = fl(1/7225344), from the format rows (NUMERICS: §5.8; the kernels'
    NVFP4_RECIP_ALPHA define); with a 4over6 operand each side's own e4m3_max, fl(1/(36 * e_a * e_b))
    (NUMERICS: §5.10: fl(1/4128768) or fl(1/2359296))."""
    from ._compile import recip

    e4m3 = FORMATS["e4m3"].max_finite
    range_a = FORMATS["e2m1"].max_finite * (e4m3 if e4m3_max_a is None else e4m3_max_a)  # 2688 or 1536, exact
    range_b = FORMATS["e2m1"].max_finite * (e4m3 if e4m3_max_b is None else e4m3_max_b)
    return np.float32(recip(range_a * range_b))  # 7225344, 4128768 and 2359296 are exact in fp32


def alpha(amax_a: float | np.floating, amax_b: float | np.floating, e4m3_max_a: int | None = None,
          e4m3_max_b: int | None = None) -> np.float32:
    """alpha = RN(RN(A_g,a * A_g,b) * fl(1/7225344)) in fp32 host arithmetic (NUMERICS: §5.8 - multiply by the
    reciprocal, never divide; both products one RN each; §5.10 each operand's e4m3_max). numpy float32
    arithmetic keeps subnormals."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.float32(np.float32(amax_a) * np.float32(amax_b)) * recip_alpha_range(e4m3_max_a, e4m3_max_b)


def lt_scale(view) -> LtScale:
    """The consumed copy's E4M3 block scales, swizzled (docs/numerics.md §5.9: each compact matrix as is)."""
    g = geometry_of(view.q, view.orientation)
    return LtScale(swizzle.swizzled(view.scale, g.scale_valid_shape, transposed=g.swizzle_transposed),
                   "VEC16_UE4M3")  # fmt: skip


def lt_alpha(a_view, b_view) -> float:
    """cuBLASLt's host alpha from the consumed copies' global amaxes (docs/numerics.md §5.8)."""
    a = a_view.amax.reshape(1).to(torch.float32).cpu().numpy()[0]
    b = b_view.amax.reshape(1).to(torch.float32).cpu().numpy()[0]
    return float(alpha(a, b, a_view.config.e4m3_max, b_view.config.e4m3_max))  # NUMERICS: §5.10 per operand


# ---- the cached call plans (native.plan) ---------------------------------------------------------------------


def _grid(n_units: int, units_per_block: int = THREADS, max_blocks: int = MAX_BLOCKS) -> int:
    """CupyLauncher's grid for `n_units` work units."""
    return min(-(-n_units // units_per_block), max_blocks)


class QuantizePlan(QuantizePlanBase):
    """quantize_2d above (quantize_with, or quantize_variant_with for a §5.10 variant) for one (config, M, K, dtype,
    copies, x alignment, given amax) signature: the same launches with the same arguments, prepared once
    (docs/design.md §4.1); the SR seed and streams are patched per call."""

    def __init__(self, config: QuantConfig, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool,
                 aligned: bool, given: bool, index: int):  # fmt: skip
        self.index = index
        self.config = config
        self.aligned = aligned
        self.given = given
        self.sr = config.stochastic
        self.variant = config.variant is not None
        mod = module_for(CU_FILE, config, index)
        self._mod = mod
        self.clear_launch = not given and not self.variant and clears_by_launch(m * k * dtype.itemsize)
        if self.variant:
            buffers, steps = self._variant(config, m, k, dtype, rowwise, colwise, given)
        else:
            buffers, steps = self._plain(config, m, k, dtype, rowwise, colwise, given)
        self.block = block = OutputBlock(buffers)
        if given:  # NUMERICS: §5.1 - one launch puts the given amax in both A_g slots and clears the tile counter
            steps, self.clears = [fill_given(block, self._given_slots, index), *steps], True
        elif self.clear_launch:  # the A_g slots and the tile counter cleared by a launch (programmatic, sm_90 on)
            steps, self.clears = [fill_given(block, (None, None), index, given=False), *steps], True
        self.steps = tuple(Step(s, block) for s in steps)

    def _launch(self, name: str, n_units: int, args, *, max_blocks: int = MAX_BLOCKS, units_per_block: int = THREADS,
                programmatic: bool = False) -> list[PreparedLaunch]:  # fmt: skip
        if n_units <= 0:  # as CupyLauncher: nothing to launch
            return []
        return [PreparedLaunch(self._mod, name, _grid(n_units, units_per_block, max_blocks), THREADS, args, self.index,
                               programmatic=programmatic)]  # fmt: skip

    def _plain(self, config, m, k, dtype, rowwise, colwise, given):
        """quantize_with's buffers and launches."""
        blk = config.block
        sfx = _SUFFIX[dtype]
        x = Patched(X, dtype)
        a_x = "rowwise_amax" if rowwise else "_a_x"
        a_c = "colwise_amax" if colwise else "_a_c"
        bits = Buffer("_bits", (2,), torch.float32, zero=not given, parts=((a_x, 0, 1), (a_c, 1, 1)), field=False)
        self._given_slots = (a_x, a_c)
        buffers = [bits]
        copies, scales = [], []
        for on, o, a_g, stream in ((rowwise, "rowwise", a_x, "row_stream"), (colwise, "colwise", a_c, "col_stream")):
            if not on:
                copies += [None, None, _i64(0), None, np.uint32(0)]
                scales.append(None)
                continue
            g = copy_geometry(config, o, m, k)
            buffers += [Buffer(f"{o}_data", g.data_shape, torch.uint8),
                        Buffer(f"{o}_scale", g.scale_padded_shape, torch.uint8)]  # fmt: skip
            copies += [Patched(f"{o}_data", torch.uint8), Patched(f"{o}_scale", torch.uint8),
                       _i64(g.scale_padded_shape[1]), Patched(a_g, torch.float32),
                       Patched(stream) if self.sr else np.uint32(0)]  # fmt: skip
            scales.append(Patched(f"{o}_scale", torch.uint8))
        # The quantize kernel's tile counter (zeroed per call, with an own amax's A_g slots: by the block's memset, or
        # the plan's first launch, fill_given).
        buffers.append(Buffer("_drawn", (1,), torch.int32, zero=True, field=False))
        n_tiles = tile_count(m, k, dtype)
        # An own amax's kernel is programmatic only after the plan's clearing launch (fill_given, clear_launch).
        amax_programmatic = self.clear_launch and programmatic_supported(self.index)
        steps = []
        if given:
            pass  # NUMERICS: §5.1 - the given amax is A_g of both copies; no pass over X (copied per call)
        elif colwise and config.rht:
            # NUMERICS: §5.6 - one pass gives the post-RHT amax (colwise A_g) and amax(X) (rowwise A_g).
            steps += self._launch("nvfp4_rht_amax", n_tiles, [x, _i64(m), _i64(k), Patched(a_c, torch.float32),
                                  Patched(a_x, torch.float32)],
                                  max_blocks=_wave_blocks(RHT_AMAX_CTAS_PER_SM, self.index), units_per_block=1,
                                  programmatic=amax_programmatic)  # fmt: skip
        else:
            steps += self._launch(f"nvfp4_amax_{sfx}", _contiguous_units(m * k // blk),
                                  [x, _i64(m), _i64(k), Patched(a_x, torch.float32), Patched(a_c, torch.float32)],
                                  max_blocks=REDUCE_BLOCKS, programmatic=amax_programmatic)  # fmt: skip
        seed = Patched("seed") if self.sr else np.uint64(0)
        # Launched programmatically (native/launch.py; sm_90 on). The kernel before it is the amax kernel or
        # fill_given, and X was complete when that kernel started: an amax kernel is an ordinary launch after the
        # block's memset, or (clear_launch) programmatic after fill_given, which waits for the grid before it (any
        # kernel: X may be its) and only then lets the next kernel start; neither writes X. (Such an amax kernel reads X
        # before its own wait, which it passes before its atomics into the cleared A_g slots.) The quantize kernel's
        # CTAs start as that kernel's finish, copy their first tile, then wait for A_g and the tile counter.
        steps += self._launch(f"nvfp4_quantize_{sfx}", n_tiles, [x, _i64(m), _i64(k), seed, *copies,
                              Patched("_drawn", torch.int32)], units_per_block=1,
                              max_blocks=_wave_blocks(quantize_ctas_per_sm(config), self.index),
                              programmatic=programmatic_supported(self.index))  # fmt: skip
        if padding := scale_padding_launch(config, m, k, scales):
            steps += self._launch("nvfp4_scale_padding", *padding, max_blocks=REDUCE_BLOCKS)
        return buffers, steps

    def _variant(self, config, m, k, dtype, rowwise, colwise, given):
        """quantize_variant_with's buffers and launches (4over6, row-scaled; docs/numerics.md §5.10)."""
        sfx = _SUFFIX[dtype]
        x = Patched(X, dtype)
        buffers, steps = [], []
        slot_names = self._given_slots = ("rowwise_amax" if rowwise else "_a0", "colwise_amax" if colwise else "_a1")
        if not config.row_scaled:
            buffers.append(Buffer("_bits", (2,), torch.float32, zero=not given, field=False,
                                  parts=((slot_names[0], 0, 1), (slot_names[1], 1, 1))))  # fmt: skip
        if not config.row_scaled and not given:
            steps += self._launch(f"nvfp4_amax_{sfx}", _contiguous_units(m * k // config.block),
                                  [x, _i64(m), _i64(k), Patched(slot_names[0], torch.float32),
                                   Patched(slot_names[1], torch.float32)], max_blocks=REDUCE_BLOCKS)  # fmt: skip
        copies: list = []
        for slot, (on, o) in enumerate(((rowwise, "rowwise"), (colwise, "colwise"))):
            if not on:
                copies.append(None)
                continue
            g = copy_geometry(config, o, m, k)
            buffers += [Buffer(f"{o}_data", g.data_shape, torch.uint8),
                        Buffer(f"{o}_scale", g.scale_padded_shape, torch.uint8)]  # fmt: skip
            if config.row_scaled:
                # NUMERICS: §5.10 row-scaled - A_g of each row of the copy.
                buffers.append(Buffer(f"{o}_amax", (_copy_rows(o, m, k),), torch.float32))
            a_g = Patched(f"{o}_amax" if config.row_scaled else slot_names[slot], torch.float32)
            copies.append((Patched(f"{o}_data", torch.uint8), Patched(f"{o}_scale", torch.uint8),
                           _i64(g.scale_padded_shape[1]), _i64(g.scale_padded_shape[0]), a_g))  # fmt: skip
        for name, n_units, args, per_cta in _variant_launches(config, sfx, m, k, rowwise, colwise,
                                                              [x, _i64(m), _i64(k), *_variant_copies(copies)]):  # fmt: skip
            steps += self._launch(name, n_units, args, units_per_block=per_cta)
        return buffers, steps

    def _run(self, x2d, seed, given, state, out) -> None:
        if self.sr and seed is None:  # (reference.spec checks this for native.quantize; as quantize_2d)
            raise SpecViolation(f"{self.config.id}: stochastic rounding needs rng=(seed, stream) (docs/numerics.md §5.7)")
        if not self.aligned:  # the kernels use 16-byte vector loads along rows (quantize_2d clones such an X)
            x2d = x2d.clone()
        named = {X: x2d.data_ptr()}
        if given is not None:
            # NUMERICS: §5.1 - the given amax is A_g of both copies (TE's quantize_with_amax); no pass over X: the
            # first step (fill_given) copies it into both slots (kept alive by this frame until it is enqueued).
            given = given_on(given, x2d.device)
            named["given"] = given.data_ptr()
        if self.sr:
            named.update(seed=seed.seed, row_stream=seed.stream & _MASK32,
                         col_stream=(seed.stream + 1) & _MASK32)  # NUMERICS: §5.7 colwise stream + 1
        stream = raw_stream(self.index)
        base = out.base
        for step in out.steps:
            step(base, named, stream)


def plan_quantize(config: QuantConfig, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool,
                  aligned: bool, given: bool, index: int) -> QuantizePlan:
    """The call plan of quantize_2d for this signature (native.plan)."""
    return QuantizePlan(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=aligned, given=given,
                        index=index)
