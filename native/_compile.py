"""Compile `native/cuda/*.cu` with NVRTC, cache the cubins on disk, load them as CuPy modules.

Source: docs/numerics.md §0.3 (kernel rules), docs/design.md §2 (format numbers reach kernels only as defines
from `defines_for`) and §7 (this file is the ONLY place compile options live).

Never `cupy.RawModule(code=...)` / `cupy.RawKernel`: CuPy appends `-ftz=true` to every compilation
it does, after the user's options, so subnormal results flush to zero. We call NVRTC through CuPy's
own bindings (`cupy_backends.cuda.libs.nvrtc`), write the cubin to a cache keyed by sha256 of
(source, included headers, options, arch, NVRTC version) and load it with `cupy.RawModule(path=...)`.

CLI: `python -m native._compile --nvcc-check [--arch sm_90 --arch sm_100a]` compiles every
`native/cuda/*.cu` with nvcc under the same semantic options, with the defines of one
representative config per scheme the file serves, and exits non-zero on any failure. A `.cu` file
names the schemes it serves on a line `// schemes: fp8_current fp8_delayed` (no line: all schemes).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from reference.formats import (
    FLT_MAX,
    FORMATS,
    INPUT_DTYPE_MAX,
    SCHEME_NAMES,
    SCHEMES,
    UE8M0,
    QuantConfig,
    ScalarFormat,
)

CUDA_DIR = Path(__file__).resolve().parent / "cuda"

# NUMERICS: §0.3 - no FTZ/DAZ, IEEE division and sqrt, no FMA contraction; never --use_fast_math.
SEMANTIC_OPTIONS: tuple[str, ...] = ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false")
LANGUAGE_OPTIONS: tuple[str, ...] = ("-std=c++17",)
DEFAULT_CHECK_ARCHS: tuple[str, ...] = ("sm_90", "sm_100a")

_SCHEMES_LINE = re.compile(r"^\s*//\s*schemes:\s*(.+)$", re.MULTILINE)
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_ARCH = re.compile(r"^sm_(\d+)([af]?)$")


# --------------------------------------------------------------------------------------------
# Defines: format numbers from the formats.py rows
# --------------------------------------------------------------------------------------------


def _fp32(v: float) -> float:
    """`v` rounded to fp32 (RN), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def float_literal(v: float) -> str:
    """An exact C++17 float literal (hex float, `f` suffix) for a value representable in fp32."""
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"float define {v!r} is not finite; pass the bit pattern as an int instead")
    f = _fp32(v)
    if f != v:
        raise ValueError(f"float define {v!r} is not exactly representable in fp32 (nearest {f!r})")
    return f"{f.hex()}f"


def recip(c: float) -> float:
    """fl(1/c): RN of the exact quotient, e.g. fl(1/448) = 0x3B124925 (docs/numerics.md §0.1)."""
    if _fp32(c) != c:
        raise ValueError(f"reciprocal constant of {c!r}: {c!r} is not exactly representable in fp32")
    with np.errstate(all="ignore"):
        return float(np.float32(1.0) / np.float32(c))  # one IEEE fp32 division of exact operands: RN(1/c)


def fp32_bits(v: float) -> int:
    """The fp32 bit pattern of RN(v) (inf on overflow), as an unsigned int."""
    return struct.unpack("<I", struct.pack("<f", struct.unpack("<f", struct.pack("<f", v))[0]))[0]


def _format_defines(prefix: str, fmt: ScalarFormat) -> dict[str, int | float | str]:
    """Bit-field numbers of one scalar format, as `<PREFIX>_*` defines (docs/numerics.md §0.4)."""
    nan_code = fmt.nan_code if fmt.nan_code is not None else fmt.max_code  # E2M1: NaN -> +max (§0.5)
    return {
        f"{prefix}_BITS": fmt.bits,
        f"{prefix}_EXP_BITS": fmt.exp_bits,
        f"{prefix}_MAN_BITS": fmt.man_bits,
        f"{prefix}_BIAS": fmt.bias,
        f"{prefix}_EMAX": fmt.emax,
        f"{prefix}_MAX": float(fmt.max_finite),
        f"{prefix}_RECIP_MAX": recip(fmt.max_finite),
        f"{prefix}_MIN_SUBNORMAL": float(fmt.min_subnormal),
        f"{prefix}_MAX_CODE": fmt.max_code,
        f"{prefix}_NAN_CODE": nan_code,
        f"{prefix}_SIGN_MASK": fmt.sign_mask,
    }


def _fp8_interp(fmt: ScalarFormat) -> str | None:
    """The cuda_fp8.h interpretation matching an 8-bit element row, or None for other formats."""
    if fmt.bits != 8 or not fmt.signed:
        return None
    return f"__NV_E{fmt.exp_bits}M{fmt.man_bits}"


def defines_for(config: QuantConfig) -> dict[str, int | float | str]:
    """Every format number a kernel for `config` may need, as `-D` defines (docs/design.md §2).

    Ints are emitted as decimal, floats as exact hex float literals (`float_literal`), strings as is.
    Names: SCHEME_<NAME> = 1; ELEM_* (element format row); SCALE_FP32 | SCALE_UE8M0 | SCALE_E4M3 = 1
    and SCALE_* (scale format row, not for fp32); TILE_ROWS, BLOCK (0 for per-tensor), IS_2D; POW2,
    EPS, E8M0_CEIL, E8M0_BIAS/MAX_CODE/NAN_CODE, FP32_MAX, INPUT_MAX_{FLOAT32,BFLOAT16,FLOAT16}; fp8_delayed: AMAX_HISTORY_LEN, AMAX_ALGO_MAX,
    MARGIN, DELAYED_SCALE_MAX_BITS;
    nvfp4: RHT, STOCHASTIC, NVFP4_GLOBAL_MAX (= E2M1 max * E4M3 max), NVFP4_RECIP_GLOBAL_MAX,
    NVFP4_RECIP_ALPHA (fl(1/global_max^2)).
    """
    if not isinstance(config, QuantConfig):
        raise TypeError(f"defines_for needs a QuantConfig, got {type(config).__name__}")
    sch = SCHEMES[config.scheme]
    elem = FORMATS[config.element]
    d: dict[str, int | float | str] = {f"SCHEME_{config.scheme.upper()}": 1}
    d.update(_format_defines("ELEM", elem))
    interp = _fp8_interp(elem)
    if interp is not None:
        d["ELEM_FP8_INTERP"] = interp
    if sch.scale_format == "fp32":
        d["SCALE_FP32"] = 1
    else:
        sfmt = FORMATS[sch.scale_format]  # "ue8m0" (mxfp8) or "e4m3" (nvfp4 block scale)
        d[f"SCALE_{sch.scale_format.upper()}"] = 1
        d.update(_format_defines("SCALE", sfmt))
        if _fp8_interp(sfmt) is not None:
            d["SCALE_FP8_INTERP"] = _fp8_interp(sfmt)
    tile = config.tile
    d["TILE_ROWS"] = 0 if tile is None else tile[0]
    d["BLOCK"] = 0 if tile is None else tile[1]
    d["IS_2D"] = int(config.is_2d)
    d["POW2"] = int(config.pow2_scales)
    d["EPS"] = _fp32(float(config.eps)) if config.eps else 0.0  # NUMERICS: §1 step 1, eps as fp32
    d["E8M0_CEIL"] = int(config.e8m0_rule == "ceil")
    d["E8M0_BIAS"] = UE8M0.bias
    d["E8M0_MAX_CODE"] = UE8M0.max_code
    d["E8M0_NAN_CODE"] = UE8M0.nan_code  # type: ignore[assignment]
    d["FP32_MAX"] = FLT_MAX
    # NUMERICS: §4 v_inf = max finite of the INPUT dtype (kernels are instantiated per input dtype).
    for dtype_name, vmax in INPUT_DTYPE_MAX.items():
        d[f"INPUT_MAX_{dtype_name.upper()}"] = float(vmax)
    # The scheme's own defines (fp8_delayed: the history update; nvfp4: the global scale and RHT constants).
    d.update(_launcher(config.scheme).scheme_defines(config))
    return d


def define_value(value: int | float | str | bool) -> str:
    """The text of one define's value: int as decimal, float as an exact hex literal, str as is."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_literal(value)
    if isinstance(value, str):
        if any(c in value for c in "\n\r"):
            raise ValueError(f"define value {value!r} contains a newline")
        return value
    raise TypeError(f"define value {value!r} has type {type(value).__name__}; expected int, float or str")


def define_options(defines: Mapping[str, int | float | str]) -> list[str]:
    """`-DNAME=value` options in sorted name order (stable cache keys)."""
    out = []
    for name in sorted(defines):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"define name {name!r} is not a C identifier")
        out.append(f"-D{name}={define_value(defines[name])}")
    return out


# --------------------------------------------------------------------------------------------
# Sources, headers, options
# --------------------------------------------------------------------------------------------


def cu_path(cu_file_name: str) -> Path:
    p = (CUDA_DIR / cu_file_name).resolve()
    if p.parent != CUDA_DIR or not p.is_file():
        raise FileNotFoundError(f"no CUDA source {cu_file_name!r} in {CUDA_DIR}")
    return p


def local_headers(source: Path) -> list[Path]:
    """Every `#include "..."` reachable from `source` inside native/cuda, sorted (for the cache key)."""
    seen: dict[Path, None] = {}
    todo = [source]
    while todo:
        cur = todo.pop()
        for name in _LOCAL_INCLUDE.findall(cur.read_text()):
            h = (cur.parent / name).resolve()
            if not h.is_file():
                h = (CUDA_DIR / name).resolve()
            if h.is_file() and h not in seen:
                seen[h] = None
                todo.append(h)
    return sorted(seen)


def file_schemes(source: Path) -> tuple[str, ...]:
    """The schemes a `.cu` file serves, from its `// schemes: ...` line (none: every scheme)."""
    m = _SCHEMES_LINE.search(source.read_text())
    if not m:
        return SCHEME_NAMES
    names = tuple(m.group(1).replace(",", " ").split())
    bad = [n for n in names if n not in SCHEMES]
    if bad:
        raise ValueError(f"{source.name}: unknown scheme(s) {bad} on its '// schemes:' line")
    return names


def representative_configs(scheme: str) -> tuple[QuantConfig, ...]:
    """The configs of a scheme for the nvcc check, switching on every compile-time code path the scheme has
    between them (its launcher module's choice)."""
    return _launcher(scheme).nvcc_check_configs(scheme)


def _launcher(scheme: str):
    from .launchers import launcher  # lazily: the launcher modules import this one's users

    return launcher(scheme)


def _cuda_include_candidates() -> list[Path]:
    cands: list[Path] = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "include")
    try:  # lazily: no cupy on CPU-only machines
        import cupy

        p = cupy.cuda.get_cuda_path()
        if p:
            cands.append(Path(p) / "include")
    except Exception:
        pass
    try:
        import nvidia  # namespace package of the nvidia-* pip wheels

        for base in getattr(nvidia, "__path__", []):
            for sub in ("cu13/include", "cuda_runtime/include", "cuda_nvrtc/include", "cu12/include"):
                cands.append(Path(base) / sub)
    except Exception:
        pass
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(Path(nvcc).resolve().parent.parent / "include")
    cands += [Path("/usr/local/cuda/include"), Path("/usr/include")]
    return cands


def cuda_include_dir() -> Path:
    """A CUDA include directory holding cuda_fp8.h (NVRTC needs cuda_fp8.h / cuda_bf16.h / cuda_fp16.h)."""
    for c in _cuda_include_candidates():
        if (c / "cuda_fp8.h").is_file() and (c / "cuda_bf16.h").is_file():
            return c
    raise RuntimeError(
        "no CUDA include directory with cuda_fp8.h found; set CUDA_PATH to a CUDA toolkit "
        f"(looked in: {', '.join(str(c) for c in _cuda_include_candidates())})"
    )


def nvrtc_options(arch: str, defines: Mapping[str, int | float | str], include_dirs: list[Path]) -> list[str]:
    """The complete NVRTC option list (docs/numerics.md §0.3)."""
    if not _ARCH.match(arch):
        raise ValueError(f"arch {arch!r} is invalid: expected sm_XX, sm_XXa or sm_XXf")
    return [
        f"--gpu-architecture={arch}",
        *SEMANTIC_OPTIONS,
        *LANGUAGE_OPTIONS,
        *define_options(defines),
        *(f"-I{d}" for d in include_dirs),
    ]


def nvcc_command(source: Path, out: Path, arch: str, defines: Mapping[str, int | float | str]) -> list[str]:
    """The nvcc command that mirrors `nvrtc_options` for one real arch (CI's --nvcc-check)."""
    m = _ARCH.match(arch)
    if not m:
        raise ValueError(f"arch {arch!r} is invalid: expected sm_XX, sm_XXa or sm_XXf")
    num, suffix = m.group(1), m.group(2)
    return [
        shutil.which("nvcc") or "nvcc",
        "-cubin",
        "-gencode",
        f"arch=compute_{num}{suffix},code=sm_{num}{suffix}",
        *SEMANTIC_OPTIONS,
        *LANGUAGE_OPTIONS,
        *define_options(defines),
        f"-I{CUDA_DIR}",
        "-o",
        str(out),
        str(source),
    ]


def device_arch(device_id: int | None = None) -> str:
    """`sm_XY` for a CUDA device (arch-specific `sm_XYa` from compute capability 10.0 on); `device_id` None:
    CuPy's current device (the one `load_module` loads into).

    torch answers (its cached device properties): in `harness run`'s own process CuPy's first runtime call
    waited 2.6-2.8 s behind the 24 workers creating their CUDA contexts on 2x H200, torch's 2 ms (issue #19).
    """
    import torch

    if device_id is None:
        import cupy

        device_id = cupy.cuda.Device().id
    major, minor = torch.cuda.get_device_capability(device_id)
    cc = 10 * major + minor  # e.g. 90, 100
    return f"sm_{cc}a" if cc >= 100 else f"sm_{cc}"


def cache_dir() -> Path:
    base = os.environ.get("NUMERICS_HARNESS_CACHE") or str(Path.home() / ".cache" / "numerics-harness")
    return Path(base) / "cubin"


# --------------------------------------------------------------------------------------------
# NVRTC compile + load
# --------------------------------------------------------------------------------------------

_MODULES: dict[tuple, object] = {}
_LOCK = threading.Lock()


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception as e:  # pragma: no cover - depends on the machine
        raise RuntimeError(f"NVRTC through CuPy is unavailable ({e}); install the 'gpu' extra (cupy)") from e
    return nvrtc


def cache_key(source: Path, options: list[str], arch: str, nvrtc_version: tuple[int, int]) -> str:
    """sha256 of (source, included headers, options, arch, NVRTC version)."""
    h = hashlib.sha256()
    h.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    for hdr in local_headers(source):
        h.update(hdr.name.encode() + b"\0" + hdr.read_bytes() + b"\0")
    h.update("\0".join(options).encode() + b"\0")
    h.update(arch.encode() + b"\0" + repr(nvrtc_version).encode())
    return h.hexdigest()


def compile_cubin(cu_file_name: str, defines: Mapping[str, int | float | str], arch: str) -> Path:
    """Compile one `.cu` with NVRTC (or reuse the cached cubin) and return the cubin's path."""
    nvrtc = _nvrtc()
    source = cu_path(cu_file_name)
    options = nvrtc_options(arch, defines, [CUDA_DIR, cuda_include_dir()])
    version = tuple(nvrtc.getVersion())
    key = cache_key(source, options, arch, version)
    out = cache_dir() / f"{source.stem}-{arch}-{key[:24]}.cubin"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # One process compiles a given cubin; concurrent ones (pytest-xdist workers, harness workers)
    # wait on the lock and then load the file instead of compiling the same module again.
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            return out
        return _nvrtc_compile(nvrtc, source, options, arch, out)


def compile_many(items: list[tuple[str, Mapping[str, int | float | str]]], arch: str,
                 workers: int | None = None) -> list[Path]:
    """`compile_cubin` of every (cu_file_name, defines) in a thread pool; the cubin paths, in order.

    NVRTC compiles without holding the GIL, so threads compile in parallel; cached cubins return at once.
    """
    if not items:
        return []
    from concurrent.futures import ThreadPoolExecutor

    n = max(1, min(len(items), workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="nvrtc") as pool:
        return list(pool.map(lambda it: compile_cubin(it[0], it[1], arch), items))


def _nvrtc_compile(nvrtc, source: Path, options: list[str], arch: str, out: Path) -> Path:
    prog = nvrtc.createProgram(source.read_text(), source.name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except Exception as e:
            log = nvrtc.getProgramLog(prog)
            raise RuntimeError(f"NVRTC failed on {source.name} for {arch}: {e}\n{log}\noptions: {options}") from e
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.stem, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(cubin)
    os.replace(tmp, out)  # atomic: concurrent workers never read a partial cubin
    return out


def module_key(cu_file_name: str, defines: Mapping[str, int | float | str]) -> tuple:
    """What makes two modules of one arch the same: the file and its defines as compiled (sorted)."""
    return cu_file_name, tuple(sorted((k, define_value(v)) for k, v in defines.items()))


def load_module(cu_file_name: str, defines: Mapping[str, int | float | str], *, arch: str | None = None):
    """The `cupy.RawModule` of `cu_file_name` built with `defines`, one per (file, defines, arch).

    NUMERICS: §0.3 - compiled by NVRTC with -ftz=false etc. and loaded from the cubin file;
    never `RawModule(code=...)`.
    """
    import cupy

    arch = arch or device_arch()
    key = (*module_key(cu_file_name, defines), arch)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            path = compile_cubin(cu_file_name, defines, arch)
            mod = cupy.RawModule(path=str(path))
            _MODULES[key] = mod
    return mod


# --------------------------------------------------------------------------------------------
# nvcc check (CI, no GPU needed)
# --------------------------------------------------------------------------------------------


def nvcc_check(archs: list[str], files: list[str] | None = None, verbose: bool = True) -> list[str]:
    """Compile every `.cu` (or `files`) with nvcc for each arch and scheme; return the failures."""
    sources = sorted(CUDA_DIR.glob("*.cu")) if not files else [cu_path(f) for f in files]
    failures: list[str] = []
    if shutil.which("nvcc") is None:
        return ["nvcc not found on PATH"]
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            for scheme in file_schemes(src):
                for cfg, arch in ((c, a) for c in representative_configs(scheme) for a in archs):
                    cmd = nvcc_command(src, Path(tmp) / f"{src.stem}-{cfg.id}-{arch}.cubin", arch, defines_for(cfg))
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    tag = f"{src.name} [{cfg.id}] {arch}"
                    if r.returncode != 0:
                        failures.append(f"{tag}: nvcc exit {r.returncode}\n{r.stderr}{r.stdout}")
                        if verbose:
                            print(f"FAIL {tag}\n{r.stderr}{r.stdout}", flush=True)
                    elif verbose:
                        print(f"ok   {tag}", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m native._compile", description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc-check", action="store_true", help="compile every native/cuda/*.cu with nvcc")
    ap.add_argument("--arch", action="append", help="real arch, e.g. sm_90 or sm_100a (repeatable)")
    ap.add_argument("--file", action="append", help="only this .cu file (repeatable)")
    ap.add_argument("--print-defines", metavar="SCHEME", help="print defines_for(the first nvcc-check config)")
    args = ap.parse_args(argv)
    if args.print_defines:
        for o in define_options(defines_for(representative_configs(args.print_defines)[0])):
            print(o)
        return 0
    if not args.nvcc_check:
        ap.print_help()
        return 2
    sources = sorted(CUDA_DIR.glob("*.cu")) if not args.file else args.file
    if not sources:
        print(f"no .cu files in {CUDA_DIR}", file=sys.stderr)
        return 1
    failures = nvcc_check(args.arch or list(DEFAULT_CHECK_ARCHS), args.file)
    if failures:
        print(f"{len(failures)} nvcc failure(s)", file=sys.stderr)
        return 1
    print("nvcc check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
