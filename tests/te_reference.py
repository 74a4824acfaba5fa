"""TransformerEngine's Python references, loaded at run time from a TE checkout or bare git directory.

TE cannot be installed here (it needs CUDA to build), so its reference files are read from a source tree
(`tests/pytorch/references/blockwise_quantizer_reference.py`, `quantize_scale_calc.py`,
`transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`, `reference_utils.py`) and executed as
modules, with small stand-ins for the TE package modules they import (the GEMM enums and the two
quantizer base classes). Nothing of TE lives in this project. Used by `benchmarks/bench_reference.py`
and `tests/unit/test_te_parity.py`.
"""

from __future__ import annotations

import enum
import functools
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

# The mirror of TE's repository on the development machines (a bare git directory); `TE_ROOT` overrides it.
DEFAULT_ROOT = Path("/work/.mirror/NVIDIA+TransformerEngine/repo")

NVFP4_REF = "transformer_engine/pytorch/custom_recipes/reference_nvfp4.py"
UTILS_REF = "transformer_engine/pytorch/custom_recipes/reference_utils.py"
BLOCKWISE_REF = "tests/pytorch/references/blockwise_quantizer_reference.py"
SCALE_CALC_REF = "tests/pytorch/references/quantize_scale_calc.py"


@dataclass(frozen=True)
class References:
    """The loaded TE reference modules."""

    blockwise: types.ModuleType  # blockwise_quantizer_reference (BlockwiseQuantizerReference)
    nvfp4: types.ModuleType  # reference_nvfp4 (NVFP4QuantizerRef)
    utils: types.ModuleType  # reference_utils (Fp4Formats)


def te_root() -> Path:
    """The TE source root: `TE_ROOT` from the environment, else the mirror."""
    return Path(os.environ.get("TE_ROOT", DEFAULT_ROOT))


def has_sources(root: Path) -> bool:
    """Whether `root` is a checkout or git directory holding TE's NVFP4 reference."""
    if (root / NVFP4_REF).is_file():
        return True
    if not root.is_dir():
        return False
    probe = subprocess.run(["git", f"--git-dir={root}", "cat-file", "-e", f"HEAD:{NVFP4_REF}"], capture_output=True)
    return probe.returncode == 0


def source(root: Path, rel: str) -> str:
    """The text of `rel` from a checkout (work tree) or, failing that, from HEAD of a git directory."""
    if (root / rel).is_file():
        return (root / rel).read_text()
    return subprocess.run(
        ["git", f"--git-dir={root}", "show", f"HEAD:{rel}"], check=True, capture_output=True, text=True
    ).stdout


def _module(name: str, text: str, filename: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = filename
    sys.modules[name] = mod
    exec(compile(text, filename, "exec"), mod.__dict__)
    return mod


def _stand_ins() -> None:
    """Package stubs, the GEMM module (only qgemm's annotations use it) and the two base classes."""
    for pkg in ("references", "transformer_engine", "transformer_engine.pytorch",
                "transformer_engine.pytorch.custom_recipes"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    gemm = types.ModuleType("transformer_engine.pytorch.custom_recipes.gemm")
    gemm.GEMMType = enum.Enum("GEMMType", "FPROP DGRAD WGRAD")
    gemm.MMParams = type("MMParams", (), {})
    sys.modules[gemm.__name__] = gemm
    sys.modules["transformer_engine.pytorch.custom_recipes"].gemm = gemm

    qt = types.ModuleType("transformer_engine.pytorch.quantized_tensor")

    class QuantizedTensorStorage:  # stand-in
        pass

    class Quantizer:  # stand-in: only the usage flags the NVFP4 reference reads
        def __init__(self, *, rowwise: bool = True, columnwise: bool = True):
            self.rowwise_usage, self.columnwise_usage = rowwise, columnwise

    qt.QuantizedTensorStorage, qt.Quantizer = QuantizedTensorStorage, Quantizer
    sys.modules[qt.__name__] = qt


@functools.lru_cache(maxsize=None)
def load(root: Path) -> References:
    """Load TE's blockwise and NVFP4 Python references from `root` (once per root).

    The stand-ins and TE's modules sit in `sys.modules` only while TE's files execute (their imports are all
    at module level); afterwards `sys.modules` is as before, so `import transformer_engine` still fails where
    TE is not installed (tests that skip without TE keep skipping) and an installed TE is left untouched.
    """
    before = dict(sys.modules)
    try:
        _stand_ins()
        _module("references.quantize_scale_calc", source(root, SCALE_CALC_REF), "te:quantize_scale_calc.py")
        bw = _module("references.blockwise_quantizer_reference", source(root, BLOCKWISE_REF),
                     "te:blockwise_quantizer_reference.py")
        utils = _module("transformer_engine.pytorch.custom_recipes.reference_utils", source(root, UTILS_REF),
                        "te:reference_utils.py")
        nv = _module("transformer_engine.pytorch.custom_recipes.reference_nvfp4", source(root, NVFP4_REF),
                     "te:reference_nvfp4.py")
    finally:
        for name in set(sys.modules) - set(before):
            del sys.modules[name]
        sys.modules.update(before)  # entries a stand-in replaced (where TE itself is installed)
    return References(blockwise=bw, nvfp4=nv, utils=utils)
