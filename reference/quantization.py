"""`quantize` / `dequantize`: input checks shared by every scheme, then dispatch to the scheme module.

Source: docs/design.md §3 (signatures, errors), docs/numerics.md §0.1 (a tensor [..., K] is a 2-D [M, K]).
Documented input behaviour:
- dtype must be float32, bfloat16 or float16 (the scheme row lists which); RHT needs bfloat16;
- more-than-2-D inputs flatten their leading dims into M; a 1-D input is [1, K];
- non-contiguous views are read as their logical values (a contiguous copy is taken);
- empty tensors and shapes that break the scheme's tile rule raise SpecViolation.
"""

from __future__ import annotations

import torch

from .formats import SCHEMES, QuantConfig
from .spec import DTYPE_NAMES, check_dequantize, check_given_amax, check_quantize, reduce_amax
from .types import QuantizedTensor, SRSeed

__all__ = ["dequantize", "quantize", "reduce_amax", "scheme_module"]


def scheme_module(scheme: str):
    """The reference module of `scheme` (its row's `module`)."""
    return SCHEMES[scheme].reference_module()


def quantize(
    x_hp: torch.Tensor,
    config: QuantConfig,
    *,
    rowwise: bool = True,
    colwise: bool = False,
    rng: SRSeed | tuple[int, int] | int | None = None,
    state=None,
    amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize `x_hp` by `config` (golden reference; same bits on CPU and CUDA).

    `rng` is the stochastic-rounding (seed, stream) pair (required when config.stochastic);
    `state` is the fp8_delayed `AmaxHistory` (scale source and amax sink; a fresh one if None);
    `amax` a given tensor amax (fp32 [] or [1], >= 0) used instead of amax(X) (TE's
    quantize_with_amax; fp8_current and nvfp4; `reduce_amax` makes one from shard amaxes).
    """
    x2d, seed = check_quantize(x_hp, config, rowwise=rowwise, colwise=colwise, rng=rng)
    extra = {} if amax is None else {"amax": check_given_amax(amax, config)}
    fields = scheme_module(config.scheme).quantize_2d(
        x2d, config, rowwise=rowwise, colwise=colwise, rng=seed, state=state, **extra
    )
    return QuantizedTensor(config=config, shape=tuple(x_hp.shape), hp_dtype=DTYPE_NAMES[x_hp.dtype], **fields)


def dequantize(q: QuantizedTensor, orientation: str = "rowwise", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_hat of one copy, as TE computes it, in the logical [M, K] orientation of the input.

    A colwise copy is transposed back to [M, K]; with RHT its values are in the Hadamard domain.
    A tampered `q` (missing, truncated or mistyped fields) is a SpecViolation naming the field.
    """
    check_dequantize(q, orientation, dtype)
    return scheme_module(q.config.scheme).dequantize(q, orientation, dtype)
