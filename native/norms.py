"""Native LayerNorm / RMSNorm forward and backward and the bias-gradient column sum: the launcher of
native/cuda/norms.cu, from torch CUDA tensors.

Source: docs/numerics.md §9.2 (the norms: every sum the fp64 pairwise tree S, every fp32 rounding point named),
§9.3 (dbias). Same signatures, fields and bits as `reference.norms.norm_forward` / `norm_backward` and the
reference step's dbias, computed by our own kernels (built through `native._compile`, run on torch's current
stream, `native.launch`; their arithmetic is native/cuda/norms.cuh, which tests/unit/host/ also replays on the
CPU). The kernels are typed by one element type: x, gamma, beta, dz and the outputs
(ln_out, dx, dgamma, dbeta, dbias) share a dtype, as they do in a module step (the activation dtype); mu,
rsigma and the unrounded ln_out are fp32.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from reference.norms import NORMALIZATIONS, NormBackward, NormForward  # contract names and result types
from reference.types import Unsupported

from .launch import device_index, grid_stride_blocks, launch, sm_count

CU_FILE = "norms.cu"
THREADS = 256  # a CTA per row, a thread per column (norms.cu NORM_THREADS)
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


@functools.cache
def _module(index: int):
    """norms.cu compiled for CUDA device `index` (it uses no format define)."""
    from . import _compile

    with torch.cuda.device(index):
        return _compile.load_module(CU_FILE, {}, arch=_compile.device_arch(index))


def _check(where: str, normalization: str, dtype: torch.dtype, **tensors: torch.Tensor | None) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r} is invalid: expected one of {NORMALIZATIONS}")
    if dtype not in _SUFFIX:
        raise ValueError(f"{where}: dtype {dtype} is not supported: expected one of {tuple(_SUFFIX)}")
    given = {name: t for name, t in tensors.items() if t is not None}
    for name, t in given.items():
        if t.dtype != dtype:
            raise ValueError(f"{where}: {name} is {t.dtype}; the norm kernels take one dtype ({dtype}) for x, gamma, "
                             "beta, dz and their outputs")
    for name, t in given.items():
        if not t.is_cuda:
            raise Unsupported(f"{where} runs on CUDA only ({name} is on {t.device})")


def _row_blocks(m: int, index: int) -> int:
    return max(1, min(m, sm_count(index) * 32))  # a CTA per row, grid-stride beyond


def norm_forward(x2d: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, *, normalization: str,
                 eps: float, zero_centered_gamma: bool, out_dtype: torch.dtype) -> NormForward:
    """LayerNorm / RMSNorm of the rows of a CUDA x2d [M, K] (docs/numerics.md §9.2); out_dtype must be x's."""
    rms = normalization == "RMSNorm"
    _check("native.norms.norm_forward", normalization, x2d.dtype, x=x2d, gamma=gamma, beta=None if rms else beta)
    m, k = x2d.shape
    if tuple(gamma.shape) != (k,) or (not rms and (beta is None or tuple(beta.shape) != (k,))):
        raise ValueError(f"gamma {tuple(gamma.shape)} / beta {None if beta is None else tuple(beta.shape)} must be "
                         f"[{k}] for x {tuple(x2d.shape)} ({normalization})")
    if out_dtype != x2d.dtype:
        raise ValueError(f"native.norms.norm_forward writes ln_out in x's dtype {x2d.dtype}, not {out_dtype}")
    if k == 0:
        raise ValueError("native.norms.norm_forward needs K >= 1 (the mean of an empty row is undefined)")
    dev = x2d.device
    x = x2d.contiguous()
    out = torch.empty((m, k), dtype=x.dtype, device=dev)
    out32 = torch.empty((m, k), dtype=torch.float32, device=dev)
    mu = None if rms else torch.empty(m, dtype=torch.float32, device=dev)
    rs = torch.empty(m, dtype=torch.float32, device=dev)
    if m:
        index = device_index(dev)
        # NUMERICS: numerics.md §9.2 eps enters as RN32(eps), the fp32 scalar the reference adds.
        args = [x, gamma.contiguous(), None if rms else beta.contiguous(), np.int64(m), np.int64(k), np.float32(eps),
                int(rms), int(bool(zero_centered_gamma)), out, out32, mu, rs]
        launch(_module(index), f"norm_forward_{_SUFFIX[x.dtype]}", _row_blocks(m, index), THREADS, args, index)
    return NormForward(out=out, out_fp32=out32, mu=mu, rsigma=rs)


def norm_backward(dz: torch.Tensor, x2d: torch.Tensor, fwd: NormForward, gamma: torch.Tensor, *,
                  normalization: str, zero_centered_gamma: bool) -> NormBackward:
    """dx, dgamma, dbeta from a CUDA dz [M, K] = d ln_out and forward's mu / rsigma (docs/numerics.md §9.2)."""
    rms = normalization == "RMSNorm"
    _check("native.norms.norm_backward", normalization, x2d.dtype, dz=dz, x=x2d, gamma=gamma)
    m, k = x2d.shape
    if tuple(dz.shape) != (m, k) or tuple(gamma.shape) != (k,):
        raise ValueError(f"dz {tuple(dz.shape)} / gamma {tuple(gamma.shape)} do not fit x {tuple(x2d.shape)}")
    if (fwd.mu is None) != rms or fwd.rsigma.dtype != torch.float32:
        raise ValueError(f"the forward statistics do not belong to a {normalization} forward")
    dev = x2d.device
    x, dzc = x2d.contiguous(), dz.contiguous()
    mu = None if rms else fwd.mu.contiguous()
    rs = fwd.rsigma.contiguous()
    dx = torch.empty((m, k), dtype=x.dtype, device=dev)
    dgamma = torch.empty(k, dtype=x.dtype, device=dev)
    dbeta = None if rms else torch.empty(k, dtype=x.dtype, device=dev)
    if k:
        index = device_index(dev)
        mod, sfx = _module(index), _SUFFIX[x.dtype]
        if m:
            launch(mod, f"norm_backward_{sfx}", _row_blocks(m, index), THREADS,
                   [dzc, x, mu, rs, gamma.contiguous(), np.int64(m), np.int64(k), int(rms),
                    int(bool(zero_centered_gamma)), dx], index)  # fmt: skip
        launch(mod, f"norm_columns_{sfx}", grid_stride_blocks(k, THREADS, index), THREADS,
               [dzc, x, mu, rs, np.int64(m), np.int64(k), int(rms), dgamma, dbeta], index)  # fmt: skip
    return NormBackward(dx=dx, dgamma=dgamma, dbeta=dbeta)


def column_sum(x2d: torch.Tensor) -> torch.Tensor:
    """RN_x(S over the rows of a CUDA x2d [M, N]) [N], in x's dtype: the module's dbias (docs/numerics.md §9.3)."""
    _check("native.norms.column_sum", "LayerNorm", x2d.dtype, x=x2d)
    m, n = x2d.shape
    out = torch.empty(n, dtype=x2d.dtype, device=x2d.device)
    if n:
        index = device_index(x2d.device)
        launch(_module(index), f"column_sum_{_SUFFIX[x2d.dtype]}", grid_stride_blocks(n, THREADS, index), THREADS,
               [x2d.contiguous(), np.int64(m), np.int64(n), out], index)  # fmt: skip
    return out
