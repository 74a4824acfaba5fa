"""Native per-tensor FP8 (`fp8_current`, `fp8_delayed`): the kernels of native/cuda/fp8_per_tensor.cu.

Source: docs/numerics.md §1 (current scaling: amax pass, scale, one cast pass), §2 (delayed scaling: cast
with the slot's scale, H[0] accumulation, the fused end-of-step update), §6 (cuBLASLt SCALAR_32F row).
The launcher module of both per-tensor schemes (`native.launchers`): quantize_2d / dequantize and the
GEMM entries take CUDA tensors; the amax-history record and update are native's own (the cast kernel's last
CTA, or an fmax here for a history elsewhere; the `delayed_update` kernel), cross-checked against
`reference.per_tensor.AmaxHistory` in tests. A call plan (`QuantizePlan`) launches the cast programmatically after
the amax kernel or its clearing `fill_given` (sm_90 on; docs/design.md §4.1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from reference.formats import QuantConfig
from reference.per_tensor import AmaxHistory  # the state's type (its fields), never its numerics
from reference.types import QuantizedTensor

from .kernels import Patched
from .launch import (
    PreparedLaunch,
    device_index,
    grid_stride_blocks,
    launch,
    module_for,
    programmatic_supported,
    raw_stream,
)
from .launchers import CublasLtMode, LtScale
from .plan import Buffer, OutputBlock, Step, X, given_on
from .plan import QuantizePlan as QuantizePlanBase

CU_FILE = "fp8_per_tensor.cu"
PLAN_MODULES: tuple = ()  # (CUDA file, config) builds a call plan launches besides its own: none
TILE = 128  # the cast kernel's CTA tile (common.cuh kTile)
THREADS = 256  # the cast kernel's CTA size (common.cuh kThreads)
ELEMENTWISE_THREADS = 256
SCALAR_SLOT = 4  # fp32 elements per scalar slot in the per-tensor buffer (16 bytes: aligned scale pointers)
DONE = 1  # the element of the scalar buffer that counts the delayed cast's finished CTAs (in the amax's slot)
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

# NUMERICS: §6 table - per-tensor FP8 on cuBLASLt: SCALAR_32F, sm_89+, cuBLAS >= 12.0, TN only;
# fast accumulation is a per-tensor option.
CUBLASLT = CublasLtMode(family="per_tensor", label="per-tensor FP8", min_cc=(8, 9), cublas_min=120000, fast_accum=True)


def scheme_defines(config) -> dict[str, int | float | str]:
    """fp8_delayed: the history-update defines of fp8_per_tensor.cu (fp8_current: none)."""
    if config.scheme != "fp8_delayed":
        return {}
    from ._compile import fp32_bits

    return {
        "AMAX_HISTORY_LEN": config.amax_history_len,
        "AMAX_ALGO_MAX": int(config.amax_compute_algo == "max"),
        "MARGIN": config.margin,
        # NUMERICS: §2 step 1 - S_max = RN(fp8_max * 2^-margin) (exact for an integer margin in range);
        # passed as bits so that any margin, even one that overflows to inf, has a define.
        "DELAYED_SCALE_MAX_BITS": fp32_bits(math.ldexp(config.element_format.max_finite, -config.margin)),
    }


def nvcc_check_configs(scheme: str) -> tuple[QuantConfig, ...]:
    """The configs the nvcc check builds for `scheme`: fp8_current with pow2 scales and eps (both paths)."""
    if scheme == "fp8_current":
        return (QuantConfig("fp8_current", pow2_scales=True, eps=2.0**-20),)
    return (QuantConfig(scheme),)


def _aligned(t: torch.Tensor | None, nbytes: int = 16) -> bool:
    return t is not None and t.data_ptr() % nbytes == 0


def vec_flags(x2d: torch.Tensor, q_row: torch.Tensor | None, q_col: torch.Tensor | None) -> tuple[int, int, int]:
    """(vec_in, vec_row, vec_col): 16-byte input rows, 8-byte rowwise stores, 16-byte transposed stores
    (the tiled kernels of fp8_per_tensor.cu and fp8_block.cu)."""
    m, k = x2d.shape
    vec_in = _aligned(x2d) and (k * x2d.element_size()) % 16 == 0
    vec_row = q_row is None or (_aligned(q_row, 8) and k % 8 == 0)
    vec_col = q_col is None or (_aligned(q_col) and m % 16 == 0)
    return int(vec_in), int(vec_row), int(vec_col)


def n_tiles(m: int, k: int) -> int:
    return math.ceil(m / TILE) * math.ceil(k / TILE)


def recordable(history: torch.Tensor, dev: torch.device) -> bool:
    """Whether the cast kernel records H[0] itself: an fp32 history on the cast's device (its element 0 is at
    data_ptr); any other history takes `record` after the launch."""
    return history.dtype is torch.float32 and history.device == dev


def record(state: AmaxHistory, amax: torch.Tensor) -> None:
    """H[0] <- fmax(H[0], amax) on the state's own device (NUMERICS: §2 "H_j[0] <- fmax(H_j[0], amax(x))";
    fmax ignores a NaN entry, §0.1)."""
    h0 = state.history[0:1]
    h0.copy_(torch.fmax(h0, amax.to(device=h0.device, dtype=torch.float32).reshape(1)))


def _state(config, state, dev: torch.device) -> AmaxHistory | None:
    """The fp8_delayed state to read (a fresh one, scale 1.0, when None; as in the reference)."""
    if config.scheme != "fp8_delayed":
        if state is not None:
            raise ValueError(f"{config.id}: state is only for fp8_delayed (got {type(state).__name__})")
        return None
    if state is None:
        return AmaxHistory(config, device=dev)  # documented: a fresh AmaxHistory (scale 1.0), then discarded
    if not isinstance(state, AmaxHistory):
        raise ValueError(f"{config.id}: state must be a reference.per_tensor.AmaxHistory, got {type(state).__name__}")
    if state.config is not config and state.config != config:  # (identity first: a dataclass == compares fields)
        raise ValueError(f"{config.id}: state was built for {state.config.id}, not for this config")
    return state


def quantize_2d(x2d: torch.Tensor, config, *, rowwise: bool, colwise: bool, rng=None, state=None,
                amax: torch.Tensor | None = None) -> dict:
    """fp8_current (docs/numerics.md §1: amax pass, scale, one cast pass) and fp8_delayed (§2: cast with state.scale).

    `amax` (fp8_current, checked by `reference.spec.check_given_amax`): a given tensor amax that replaces the amax
    pass (TE's quantize_with_amax); the cast kernel derives the scale from it and reads X once.
    """
    given = amax  # the name `amax` is the amax slot below
    dev = x2d.device
    index = device_index(dev)
    m, k = x2d.shape
    mod = module_for(CU_FILE, config, index)
    sfx = SUFFIX[x2d.dtype]
    delayed = _state(config, state, dev)
    # One zeroed fp32 buffer (one memset) holds every scalar, each slot 16-byte aligned:
    # amax (+0: the start of every amax, docs/numerics.md §0.1), scale, sinv, and the colwise copy's amax and sinv.
    # slots[DONE]: the delayed cast's CTA counter (the last CTA records the amax; zeroed with the rest).
    slots = torch.zeros(5 * SCALAR_SLOT, dtype=torch.float32, device=dev)
    amax, scale, sinv, amax_c, sinv_c = (slots[i * SCALAR_SLOT:i * SCALAR_SLOT + 1] for i in range(5))
    done = history = amax_store = None
    q_row = torch.empty((m, k), dtype=torch.uint8, device=dev) if rowwise else None  # (M, K)
    q_col = torch.empty((k, m), dtype=torch.uint8, device=dev) if colwise else None  # (K, M)
    vec_in, vec_row, vec_col = vec_flags(x2d, q_row, q_col)
    both = rowwise and colwise
    if given is not None and delayed is not None:
        raise ValueError(f"{config.id}: a given amax is for fp8_current (fp8_delayed scales from its state)")
    if given is not None:
        # NUMERICS: §1 - a given amax (TE's quantize_with_amax) replaces amax(X) in the scale rule; no amax pass.
        # The cast kernel reads it in stream order and stores it in the result's amax (never an alias of it).
        given = given_on(given, dev)
        amax_in, amax_store = given, amax
        amax_acc, copy_amax, copy_sinv = None, (amax_c if both else None), (sinv_c if both else None)
    elif delayed is None:
        n = m * k
        grid = grid_stride_blocks(math.ceil(n / 8), ELEMENTWISE_THREADS, index)
        launch(mod, f"tensor_amax_{sfx}", grid, THREADS, (x2d, np.int64(n), int(_aligned(x2d)), amax), index)
        # The cast kernel derives the scale from the amax itself (docs/numerics.md §1) and stores scale, sinv
        # and the second copy's amax / sinv (no separate scale launch).
        amax_in, amax_acc, copy_amax, copy_sinv = amax, None, (amax_c if both else None), (sinv_c if both else None)
    else:
        scale = delayed.scale.to(device=dev, dtype=torch.float32).contiguous()
        # NUMERICS: §2 sinv = RN(1/scale); amax of the unscaled input. The cast's last CTA records H[0] (an fp32
        # history on this device; else record() below) and the colwise copy's own amax / sinv.
        amax_in, amax_acc = None, amax
        copy_amax, copy_sinv = (amax_c, sinv_c) if both else (None, None)
        done = slots[DONE:DONE + 1]
        history = delayed.history if recordable(delayed.history, dev) else None
    launch(mod, f"per_tensor_cast_{sfx}", n_tiles(m, k), THREADS,
           (x2d, np.int64(m), np.int64(k), vec_in, vec_row, vec_col, amax_in, scale, sinv, amax_acc, copy_amax,
            copy_sinv, amax_store, history, done, q_row, q_col), index)  # fmt: skip
    if delayed is not None and history is None:
        record(delayed, amax)  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) on the state's own device
    out: dict = {}
    # NUMERICS: §1 the transposed copy shares sinv and the amax (as separate tensors of equal value).
    if rowwise:
        out.update(rowwise_data=q_row, rowwise_scale=sinv, rowwise_amax=amax)
    if colwise:
        out.update(colwise_data=q_col, colwise_scale=sinv_c if both else sinv, colwise_amax=amax_c if both else amax)
    return out


def launch_dequantize(cu_file: str, kernel: str, q: QuantizedTensor, orientation: str, dtype: torch.dtype, *,
                      scale_ld: bool) -> torch.Tensor:
    """One grid-stride dequantize launch of `kernel`_<dtype> over a copy: arguments (data, scale, [scale row
    stride,] M, K, colwise, out), out [M, K] in `dtype`. Shared by the per-tensor, fp8_block and mxfp8 launchers."""
    data = getattr(q, f"{orientation}_data").contiguous()
    scale = getattr(q, f"{orientation}_scale").contiguous()
    dev = data.device
    index = device_index(dev)
    m, k = q.m, q.k
    out = torch.empty((m, k), dtype=dtype, device=dev)  # (M, K)
    ld = (np.int64(scale.shape[1]),) if scale_ld else ()
    launch(module_for(cu_file, q.config, index), f"{kernel}_{SUFFIX[dtype]}",
           grid_stride_blocks(m * k, ELEMENTWISE_THREADS, index), ELEMENTWISE_THREADS,
           (data, scale, *ld, np.int64(m), np.int64(k), int(orientation == "colwise"), out), index)  # fmt: skip
    return out


def dequantize(q: QuantizedTensor, orientation: str, dtype: torch.dtype) -> torch.Tensor:
    """x_hat = RN_out(RN(dec(q) * sinv)) as [M, K] (docs/numerics.md §1; the colwise copy is read transposed)."""
    return launch_dequantize(CU_FILE, "per_tensor_dequantize", q, orientation, dtype, scale_ld=False)


def update_amax_history(state: AmaxHistory, reduced_amax: torch.Tensor | float | None = None) -> None:
    """The fused end-of-step fp8_delayed update on the GPU (docs/numerics.md §2 steps 1-6; the `delayed_update`
    kernel). `state.history` and `state.scale` are replaced by the new tensors, on the state's own device."""
    config = state.config
    home = state.history.device
    dev = home if home.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    index = device_index(dev)
    with torch.cuda.device(dev):
        hist = state.history.to(device=dev, dtype=torch.float32).contiguous()  # (L,)
        h_out = torch.empty_like(hist)
        scale = state.scale.to(device=dev, dtype=torch.float32).clone()
        has_r = reduced_amax is not None
        r = (
            torch.as_tensor(reduced_amax, dtype=torch.float32).reshape(1).to(dev)
            if has_r
            else torch.zeros(1, dtype=torch.float32, device=dev)
        )
        launch(module_for(CU_FILE, config, index), "delayed_update", 1, 1024, (hist, h_out, scale, r, int(has_r)),
               index)  # fmt: skip
    state.history = h_out.to(home)
    state.scale = scale.to(home)


def lt_scale(view) -> LtScale:
    """The fp32 sinv [1] as cuBLASLt's SCALAR_32F scale (docs/numerics.md §1, §6)."""
    return LtScale(view.scale.to(torch.float32).reshape(1), "SCALAR_32F")


def lt_alpha(a_view, b_view) -> float:
    """cuBLASLt's alpha: 1 (the per-tensor scales are the SCALAR_32F scale pointers)."""
    return 1.0


# ---- the cached call plan (native.plan) ----------------------------------------------------------------------

FILL_CONFIG = QuantConfig("fp8_current")  # the build of fp8_per_tensor.cu whose fill_given other plans launch
# A plan that zeroes slots per call (an own amax: NVFP4 in native/nvfp4.py, fp8_current; fp8_delayed) for an X of at
# least this many bytes clears them with fill_given (programmatic) and launches its next kernel programmatically after
# it: 1.2-3.2 us less GPU time a call than the block's cudaMemsetAsync and an ordinary launch (H200, 8192^2 bf16), for
# ~3 us more host time (a cuLaunchKernelEx, 4.5-6 us, against a memset's 1.3-2.4: docs/performance.md §3.2). Below it
# the call's GPU work (an own-amax NVFP4 call at 4096^2 bf16, 32 MiB: ~30 us) is shorter than its host work (~35-40 us
# fresh), so the host sets the pace and the memset wins.
CLEAR_LAUNCH_MIN_X_BYTES = 48 << 20


def clears_by_launch(x_bytes: int) -> bool:
    """Whether a plan for an X of `x_bytes` clears its zeroed slots by fill_given (CLEAR_LAUNCH_MIN_X_BYTES)."""
    return x_bytes >= CLEAR_LAUNCH_MIN_X_BYTES


def fill_given(block: OutputBlock, slots: tuple[str | None, str | None], index: int, *,
               given: bool = True, module=None) -> PreparedLaunch:  # fmt: skip
    """The `fill_given` launch of a plan whose kernels read a given amax from its own slots (NVFP4's A_g,
    docs/numerics.md §5.1): the caller's amax (role "given", per call) into the block's parts `slots` and the
    block's zero-filled buffers cleared, in one launch (the plan sets `clears`). Launched programmatically on sm_90
    and later (the kernel waits for the grid before it first, then lets the next one start: the gap after the
    previous call's quantize kernel, which lets dependents start as its CTAs finish their tiles, is hidden).
    given=False (no slots): the clearing alone, a plan's first launch (an own amax: NVFP4, fp8_current; fp8_delayed)
    in place of the block's cudaMemsetAsync, so that its next kernel can be launched programmatically after it.
    `module`: the build of fp8_per_tensor.cu to launch it from (every build has it; default FILL_CONFIG's)."""
    n_words = -(-block.zero_bytes // 4)  # (rounding up stays in the ALIGN padding before the next buffer)
    assert all(s is None or block.offsets[s] >= 4 * n_words for s in slots)  # the slots lie outside the cleared bytes
    assert given or slots == (None, None)
    args = (Patched("given", torch.float32) if given else None,
            *(None if s is None else Patched(s, torch.float32) for s in slots),
            Patched("_block", torch.int32) if n_words else None, np.int64(n_words))  # fmt: skip
    return PreparedLaunch(module or module_for(CU_FILE, FILL_CONFIG, index), "fill_given",
                          grid_stride_blocks(max(n_words, 1), ELEMENTWISE_THREADS, index), ELEMENTWISE_THREADS, args,
                          index, programmatic=programmatic_supported(index))  # fmt: skip


class QuantizePlan(QuantizePlanBase):
    """quantize_2d above for one (config, M, K, dtype, copies, x alignment, given amax) signature: the same
    launches with the same arguments, prepared once (docs/design.md §4.1)."""

    def __init__(self, config, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool, aligned: bool,
                 given: bool, index: int):  # fmt: skip
        self.index = index
        self.config = config
        self.delayed = config.scheme == "fp8_delayed"
        self._equal = config  # the last state config found equal to `config` (_run)
        self.given = given
        self.both = both = rowwise and colwise
        mod = module_for(CU_FILE, config, index)
        sfx = SUFFIX[dtype]
        # The scalar slots of quantize_2d (one zeroed fp32 buffer, 16-byte slots): amax, scale, sinv, amax_c, sinv_c,
        # named by the fields they become.
        row_or_col = "rowwise" if rowwise else "colwise"
        names = (f"{row_or_col}_amax", "_scale", f"{row_or_col}_scale",
                 "colwise_amax" if both else "_amax_c", "colwise_scale" if both else "_sinv_c")  # fmt: skip
        self.amax, _, self.sinv, self.amax_c, self.sinv_c = names
        parts = tuple((n, i * SCALAR_SLOT, 1) for i, n in enumerate(names)) + (("_done", DONE, 1),)
        buffers = [Buffer("slots", (5 * SCALAR_SLOT,), torch.float32, zero=True, field=False, parts=parts)]
        if rowwise:
            buffers.append(Buffer("rowwise_data", (m, k), torch.uint8))
        if colwise:
            buffers.append(Buffer("colwise_data", (k, m), torch.uint8))
        self.block = block = OutputBlock(buffers)
        # vec_flags on ALIGN-aligned outputs (OutputBlock) and an input of the given alignment.
        vec_in = int(aligned and (k * dtype.itemsize) % 16 == 0)
        vec_row, vec_col = int(not rowwise or k % 8 == 0), int(not colwise or m % 16 == 0)

        def ptr(name, dtype=torch.float32):
            return Patched(name, dtype)

        steps = []
        pdl = programmatic_supported(index)
        # The zeroed slots (the amax kernel's atomicMax target, the delayed cast's amax and CTA counter) are cleared per
        # call by the block's memset, or for a large X (not a given amax: nothing it reads is zeroed) by fill_given,
        # the call's first launch (programmatic: it waits for the grid before it, X may be that kernel's).
        self.clear_launch = not given and clears_by_launch(m * k * dtype.itemsize)
        if self.clear_launch:
            steps.append(fill_given(block, (None, None), index, given=False, module=mod))
            self.clears = True
        x = ptr(X, dtype)
        copy_amax, copy_sinv = (ptr(self.amax_c), ptr(self.sinv_c)) if both else (None, None)
        if self.delayed:
            # NUMERICS: §2 - the cast's last CTA records H[0] ("history": the state's, per call; 0 when record()
            # runs after the launch) and the colwise copy's amax / sinv.
            cast_slots = (None, ptr("scale_in"), ptr(self.sinv), ptr(self.amax), copy_amax, copy_sinv, None,
                          ptr("history"), ptr("_done"))  # fmt: skip
        elif given:
            # NUMERICS: §1 - the cast reads the caller's amax ("given", per call) and stores it in the amax slot.
            cast_slots = (ptr("given"), ptr("_scale"), ptr(self.sinv), None, copy_amax, copy_sinv, ptr(self.amax),
                          None, None)  # fmt: skip
        else:
            n = m * k
            # NUMERICS: §1 - amax(X) into the cleared slot; after fill_given the amax kernel is programmatic (it reads
            # X, then waits for the grid before it before its atomic).
            grid = grid_stride_blocks(math.ceil(n / 8), ELEMENTWISE_THREADS, index)
            steps.append(PreparedLaunch(mod, f"tensor_amax_{sfx}", grid, THREADS,
                                        (x, np.int64(n), int(aligned), ptr(self.amax)), index,
                                        programmatic=self.clear_launch and pdl))  # fmt: skip
            cast_slots = (ptr(self.amax), ptr("_scale"), ptr(self.sinv), None, copy_amax, copy_sinv, None, None, None)
        # The cast is programmatic (sm_90 on) after the amax kernel or fill_given: X was complete when that kernel
        # started (an ordinary launch after the memset, or programmatic after fill_given, which waited for the grid
        # before it), so the cast's CTAs read their tile as that kernel's finish, then wait for the grid before they
        # read the amax or scale or touch the slots (fp8_per_tensor.cu). As the call's first launch (a given amax, a
        # delayed call after the memset) it is an ordinary one: the kernel before it may write X or what it reads.
        steps.append(PreparedLaunch(mod, f"per_tensor_cast_{sfx}", n_tiles(m, k), THREADS,
                                    (x, np.int64(m), np.int64(k), vec_in, vec_row, vec_col, *cast_slots,
                                     ptr("rowwise_data", torch.uint8) if rowwise else None,
                                     ptr("colwise_data", torch.uint8) if colwise else None), index,
                                    programmatic=pdl and bool(steps)))  # fmt: skip
        self.steps = tuple(Step(s, block) for s in steps)

    def _run(self, x2d, seed, given, state, out) -> None:
        dev = x2d.device
        named = {X: x2d.data_ptr()}
        if self.delayed:
            if type(state) is AmaxHistory and (state.config is self.config or state.config is self._equal):
                delayed = state  # (what _state returns for it, without comparing configs field by field again)
            else:
                delayed = _state(self.config, state, dev)  # per call: the state's checks and a fresh one for None
                if delayed is state:
                    self._equal = state.config  # a config found equal to the plan's (held: its identity stays valid)
            if given is not None:
                raise ValueError(f"{self.config.id}: a given amax is for fp8_current (fp8_delayed scales from its state)")
            scale_in = delayed.scale
            if not (scale_in.dtype is torch.float32 and scale_in.device == dev and scale_in.is_contiguous()):
                scale_in = scale_in.to(device=dev, dtype=torch.float32).contiguous()  # NUMERICS: §2 sinv = RN(1/scale)
            named["scale_in"] = scale_in.data_ptr()
            history = delayed.history
            own = recordable(history, dev)  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) by the cast's last CTA
            named["history"] = history.data_ptr() if own else 0
        else:
            if state is not None:
                _state(self.config, state, dev)  # (raises: state is only for fp8_delayed)
            if given is not None:
                # NUMERICS: §1 - a given amax (TE's quantize_with_amax) replaces amax(X); no amax pass, no copy: the
                # cast kernel reads it in stream order (kept alive by this frame until the launch is enqueued).
                given = given_on(given, dev)
                named["given"] = given.data_ptr()
        base, stream = out.base, raw_stream(self.index)
        for step in out.steps:
            step(base, named, stream)
        if self.delayed and not own:
            record(delayed, out.fields[self.amax])  # NUMERICS: §2 H[0] <- fmax(H[0], amax(x)) on the state's device


def plan_quantize(config, m: int, k: int, dtype: torch.dtype, *, rowwise: bool, colwise: bool, aligned: bool,
                  given: bool, index: int) -> QuantizePlan:
    """The call plan of quantize_2d for this signature (native.plan)."""
    return QuantizePlan(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=aligned, given=given,
                        index=index)
