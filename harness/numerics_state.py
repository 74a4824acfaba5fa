"""Process-wide numerics state that a backend could change behind the harness's back.

Source: the issue's isolation requirement (a backend that calls `torch.set_flush_denormal(True)`
changed every later golden result). `snapshot()` reads each setting; `restore(s)` puts a snapshot
back; harness.runner takes one before each backend call, compares after, restores, and records a
change as an error of that backend. Flush-to-zero has no getter in torch: it is probed by
multiplying the smallest fp32 subnormal by 1 (0 when denormals are flushed; docs/numerics.md §0.1:
subnormals are never flushed, §0.2 rule 7: no TF32).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

_TINY = 2.0**-149  # the smallest fp32 subnormal


def _flushes_denormals() -> bool:
    x = torch.tensor([_TINY], dtype=torch.float32)
    return bool((x * 1.0).item() == 0.0)


class Setting(NamedTuple):
    read: Callable[[], object]
    write: Callable[[object], object]


def _set_deterministic(value) -> None:
    on, warn_only = value
    torch.use_deterministic_algorithms(on, warn_only=warn_only)


def _cuda_flag(obj, name: str) -> Setting:
    return Setting(lambda: getattr(obj, name), lambda v: setattr(obj, name, v))


SETTINGS: dict[str, Setting] = {
    "flush_denormal": Setting(_flushes_denormals, torch.set_flush_denormal),
    "default_dtype": Setting(torch.get_default_dtype, torch.set_default_dtype),
    "float32_matmul_precision": Setting(torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "cuda.matmul.allow_tf32": _cuda_flag(torch.backends.cuda.matmul, "allow_tf32"),
    "cuda.matmul.allow_fp16_reduced_precision_reduction":
        _cuda_flag(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
    "cuda.matmul.allow_bf16_reduced_precision_reduction":
        _cuda_flag(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
    "cudnn.allow_tf32": _cuda_flag(torch.backends.cudnn, "allow_tf32"),
    "cudnn.deterministic": _cuda_flag(torch.backends.cudnn, "deterministic"),
    "cudnn.benchmark": _cuda_flag(torch.backends.cudnn, "benchmark"),
    "deterministic_algorithms": Setting(
        lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
        _set_deterministic),
}


def snapshot() -> dict[str, object]:
    """The current value of every setting in SETTINGS."""
    return {name: s.read() for name, s in SETTINGS.items()}


def changes(before: dict[str, object]) -> list[str]:
    """`name: old -> new` for each setting that differs from `before`."""
    now = snapshot()
    return [f"{k}: {before[k]} -> {now[k]}" for k in SETTINGS if now[k] != before[k]]


def restore(before: dict[str, object]) -> None:
    """Put every setting that changed back to its value in `before`."""
    now = snapshot()
    for k, s in SETTINGS.items():
        if now[k] != before[k]:
            s.write(before[k])
