"""`quantize` / `dequantize`: input checks shared by every scheme, then dispatch to the scheme module.

Source: DESIGN.md §3 (signatures, errors), NUMERICS.md §0.1 (a tensor [..., K] is a 2-D [M, K]).
Documented input behaviour:
- dtype must be float32, bfloat16 or float16 (the scheme row lists which); RHT needs bfloat16;
- more-than-2-D inputs flatten their leading dims into M; a 1-D input is [1, K];
- non-contiguous views are read as their logical values (a contiguous copy is taken);
- empty tensors and shapes that break the scheme's tile rule raise SpecViolation.
"""

from __future__ import annotations

import importlib

import torch

from .formats import SCHEMES, QuantConfig
from .types import QuantizedTensor, SpecViolation, SRSeed

# Scheme name -> module implementing `quantize_2d(x2d, config, *, rowwise, colwise, rng, state) -> dict`
# and `dequantize(q, orientation, dtype) -> Tensor`.
_SCHEME_MODULES = {
    "fp8_current": "per_tensor",
    "fp8_delayed": "per_tensor",
    "mxfp8": "mxfp8",
    "fp8_block": "blockwise",
    "nvfp4": "nvfp4",
}

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def scheme_module(scheme: str):
    return importlib.import_module(f"{__package__}.{_SCHEME_MODULES[scheme]}")


def check_input(x: torch.Tensor, config: QuantConfig, *, rowwise: bool, colwise: bool) -> torch.Tensor:
    """Validate `x` against `config` and return it as a contiguous 2-D [M, K] tensor."""
    if not isinstance(config, QuantConfig):
        raise TypeError(f"config must be a QuantConfig, got {type(config).__name__}")
    if not isinstance(x, torch.Tensor):
        raise SpecViolation(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not (rowwise or colwise):
        raise SpecViolation("quantize needs rowwise=True or colwise=True; both were False")
    name = DTYPE_NAMES.get(x.dtype)
    sch = SCHEMES[config.scheme]
    if name is None or name not in sch.input_dtypes:
        raise SpecViolation(
            f"{config.scheme}: input dtype {x.dtype} is not allowed; expected one of {sch.input_dtypes}"
        )
    if config.rht and x.dtype != torch.bfloat16:
        raise SpecViolation(f"{config.id}: RHT needs a bfloat16 input (NUMERICS.md §5.6), got {x.dtype}")
    if x.dim() == 0:
        raise SpecViolation(f"{config.scheme}: a 0-d tensor cannot be quantized; expected [..., K]")
    if x.numel() == 0:
        raise SpecViolation(f"{config.scheme}: empty tensor of shape {tuple(x.shape)} cannot be quantized")
    k = x.shape[-1]
    x2d = x.reshape(-1, k).contiguous()
    m = x2d.shape[0]
    if not sch.partial_tiles:
        blk = config.block
        assert blk is not None
        for dim_name, n in (("M", m), ("K", k)):
            if n % blk:
                raise SpecViolation(
                    f"{config.id}: {dim_name}={n} (shape {tuple(x.shape)}) is not a multiple of {blk}; "
                    f"{config.scheme} does not support partial blocks (NUMERICS.md §3/§5.5)"
                )
    return x2d


def quantize(
    x_hp: torch.Tensor,
    config: QuantConfig,
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
    state=None,
) -> QuantizedTensor:
    """Quantize `x_hp` by `config` (golden reference; same bits on CPU and CUDA).

    `rng` is the stochastic-rounding (seed, stream) pair (required when config.stochastic);
    `state` is the fp8_delayed `AmaxHistory` (scale source and amax sink; a fresh one if None).
    """
    x2d = check_input(x_hp, config, rowwise=rowwise, colwise=colwise)
    seed = SRSeed.coerce(rng)
    if config.stochastic and seed is None:
        raise SpecViolation(f"{config.id}: stochastic rounding needs rng=(seed, stream) (NUMERICS.md §5.7)")
    fields = scheme_module(config.scheme).quantize_2d(
        x2d, config, rowwise=rowwise, colwise=colwise, rng=seed, state=state
    )
    return QuantizedTensor(config=config, shape=tuple(x_hp.shape), hp_dtype=DTYPE_NAMES[x_hp.dtype], **fields)


def dequantize(q: QuantizedTensor, orientation: str = "rowwise", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_hat of one copy, as TE computes it, in the logical [M, K] orientation of the input.

    A colwise copy is transposed back to [M, K]; with RHT its values are in the Hadamard domain.
    """
    if orientation not in ("rowwise", "colwise"):
        raise ValueError(f"orientation={orientation!r} is invalid: expected 'rowwise' or 'colwise'")
    if not q.has(orientation):
        raise ValueError(f"this QuantizedTensor has no {orientation} copy (quantize with {orientation}=True)")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype={dtype} is invalid: expected float32, bfloat16 or float16")
    return scheme_module(q.config.scheme).dequantize(q, orientation, dtype)
