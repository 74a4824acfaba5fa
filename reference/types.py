"""Contract types shared by every backend: QuantizedTensor, the SR seed, and the two error kinds.

Source: docs/design.md §3. Data and scales use TE's compact layouts with TE's padded scale shapes
(docs/numerics.md §1-§5); padding is zero-filled by the reference and compared only on the valid region.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .formats import QuantConfig


class SpecViolation(ValueError):
    """Input that breaks the spec (shape not a multiple of the tile, wrong dtype, RHT on non-bf16).

    `rule` names the rule's family ("dtype", "rht", "shape", "gemm", "field", ...; reference.spec):
    the case generator counts exclusions by it.
    """

    def __init__(self, message: str = "", *, rule: str = "spec") -> None:
        super().__init__(message)
        self.rule = rule


class Unsupported(Exception):
    """A backend or hardware gap. The harness turns it into a skip with this reason, never a fallback."""


@dataclass(frozen=True)
class SRSeed:
    """The (seed, stream) pair that fixes stochastic-rounding bits (docs/numerics.md §5.7).

    The rowwise copy draws from `stream`, the columnwise copy from `stream + 1` (mod 2^32).
    """

    seed: int
    stream: int = 0

    def __post_init__(self) -> None:
        if not (0 <= int(self.seed) < 2**64):
            raise ValueError(f"SRSeed.seed={self.seed!r} is invalid: must be in [0, 2^64)")
        if not (0 <= int(self.stream) < 2**32):
            raise ValueError(f"SRSeed.stream={self.stream!r} is invalid: must be in [0, 2^32)")

    @classmethod
    def coerce(cls, rng: "SRSeed | tuple[int, int] | int | None") -> "SRSeed | None":
        if rng is None or isinstance(rng, SRSeed):
            return rng
        if isinstance(rng, int):
            return cls(rng, 0)
        if isinstance(rng, tuple) and len(rng) == 2:
            if type(rng[0]) is int and type(rng[1]) is int:  # the common form: memoized (issue #18 per-call cost)
                return _sr_seed_of_ints(rng[0], rng[1])
            return cls(int(rng[0]), int(rng[1]))
        raise ValueError(f"rng={rng!r} is invalid: expected SRSeed, (seed, stream) or an int seed")


@functools.lru_cache(maxsize=1024)
def _sr_seed_of_ints(seed: int, stream: int) -> SRSeed:
    """SRSeed(seed, stream) for plain ints, built (and range-checked) once per pair: an SRSeed is immutable and
    compares by value, and building one costs ~1 us, ~10% of a planned in-place quantize call. A pair out of range
    raises every time (lru_cache keeps no exceptions)."""
    return SRSeed(seed, stream)


@dataclass
class QuantizedTensor:
    """One quantized tensor: per orientation the codes, the decode scale (TE's scale_inv) and the amax.

    `shape` is the logical high-precision shape; `hp_dtype` the input dtype's name. Fields of an
    orientation that was not requested are None. Layout per scheme: docs/numerics.md §1 (data_T),
    §3.Layouts (MXFP8, colwise not transposed), §4 (blockwise), §5.9 (NVFP4).
    """

    config: QuantConfig
    shape: tuple[int, ...]
    hp_dtype: str = "float32"
    rowwise_data: torch.Tensor | None = None
    rowwise_scale: torch.Tensor | None = None
    rowwise_amax: torch.Tensor | None = None
    colwise_data: torch.Tensor | None = None
    colwise_scale: torch.Tensor | None = None
    colwise_amax: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    TENSOR_FIELDS = (
        "rowwise_data",
        "rowwise_scale",
        "rowwise_amax",
        "colwise_data",
        "colwise_scale",
        "colwise_amax",
    )

    @property
    def m(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n

    @property
    def k(self) -> int:
        return self.shape[-1]

    def has(self, orientation: str) -> bool:
        return getattr(self, f"{orientation}_data") is not None

    def to(self, device: str | torch.device) -> "QuantizedTensor":
        """A copy with every tensor moved to `device` (for comparing GPU output against CPU)."""
        kw = {n: (None if getattr(self, n) is None else getattr(self, n).to(device)) for n in self.TENSOR_FIELDS}
        return QuantizedTensor(self.config, self.shape, self.hp_dtype, extra=dict(self.extra), **kw)
