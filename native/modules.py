"""Which compiled CUDA modules a native operation needs, and compiling them before a sweep starts.

Source: docs/design.md §2 (one cached module per (file, config, arch)); `native._compile` owns the
options and the cubin cache. Without this, a cold sweep compiles each module on the first case that
needs it, one after another; `precompile` compiles all of them at once in threads.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from reference.formats import QuantConfig
from reference.types import Unsupported

Module = tuple[str, dict[str, int | float | str]]  # (cu file name, defines)


def modules_for(op: str, config: QuantConfig, *, b_config: QuantConfig | None = None,
                out_dtype: torch.dtype = torch.bfloat16, device=None) -> list[Module]:
    """The (file, defines) modules `op` of `config` loads on `device` (a GEMM on cuBLASLt: none)."""
    from . import _compile

    if op in ("quantize", "dequantize", "grouped_quantize"):  # grouped: the quantize kernels once per group
        from .launchers import launcher

        mod = launcher(config.scheme)
        plan = [] if op == "dequantize" else [(f, _compile.defines_for(c)) for f, c in mod.PLAN_MODULES]
        return [(mod.CU_FILE, _compile.defines_for(config)), *plan]  # (quantize builds its call plan at first use)
    if op == "gemm":
        from .gemm import CU_FILE, kernel_defines, resolve_method

        try:
            method, _ = resolve_method(config, "auto", device)
        except Unsupported:
            return []
        return [(CU_FILE, kernel_defines(config, b_config or config, out_dtype))] if method == "portable" else []
    raise ValueError(f"op {op!r} is unknown: expected 'quantize', 'dequantize', 'grouped_quantize' or 'gemm'")


def precompile(modules: Iterable[Module], *, device=None, workers: int | None = None) -> int:
    """Compile (or find cached) every distinct module for `device`'s arch; returns how many distinct ones."""
    from . import _compile

    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    arch = _compile.device_arch(dev.index if dev.index is not None else torch.cuda.current_device())
    unique: dict[tuple, Module] = {}
    for name, defines in modules:
        unique.setdefault(_compile.module_key(name, defines), (name, dict(defines)))
    _compile.compile_many(list(unique.values()), arch, workers)
    return len(unique)
