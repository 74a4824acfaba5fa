"""CPU tests of native/_compile.py: defines from the formats rows, the option set, cache keys, the nvcc
check, and that no source compiles through CuPy's own compiler (docs/numerics.md §0.3, docs/design.md §2, §7)."""

from __future__ import annotations

import ast
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from native import _compile
from reference.formats import E2M1, E4M3, E5M2, FLT_MAX, UE8M0, QuantConfig

ROOT = Path(__file__).resolve().parents[2]


def _literal_value(lit: str) -> float:
    """The value of a hex float literal such as '0x1.cp+8f'."""
    assert lit.endswith("f"), lit
    return float.fromhex(lit[:-1])


def _bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


# ---- defines from the rows -------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, fmt",
    [
        (QuantConfig("fp8_current"), E4M3),
        (QuantConfig("fp8_current", element="e5m2"), E5M2),
        (QuantConfig("mxfp8", element="e5m2"), E5M2),
        (QuantConfig("fp8_block"), E4M3),
        (QuantConfig("nvfp4"), E2M1),
    ],
    ids=lambda v: v.id if isinstance(v, QuantConfig) else v.name,
)
def test_element_defines_come_from_the_row(config, fmt):
    d = _compile.defines_for(config)
    assert d["ELEM_EXP_BITS"] == fmt.exp_bits
    assert d["ELEM_MAN_BITS"] == fmt.man_bits
    assert d["ELEM_BIAS"] == fmt.bias
    assert d["ELEM_EMAX"] == fmt.emax
    assert d["ELEM_MAX"] == fmt.max_finite
    assert d["ELEM_MAX_CODE"] == fmt.max_code
    assert d["ELEM_NAN_CODE"] == (fmt.nan_code if fmt.nan_code is not None else fmt.max_code)
    assert d[f"SCHEME_{config.scheme.upper()}"] == 1


def test_fp8_element_numbers_match_numerics_table():
    # docs/numerics.md §0.4: E4M3 max 448 = 0x7E, NaN 0x7F; E5M2 max 57344 = 0x7B; emax 8 / 15 (§0.5 floor rule).
    d4 = _compile.defines_for(QuantConfig("mxfp8"))
    d5 = _compile.defines_for(QuantConfig("mxfp8", element="e5m2"))
    assert (d4["ELEM_MAX"], d4["ELEM_MAX_CODE"], d4["ELEM_NAN_CODE"], d4["ELEM_EMAX"]) == (448.0, 0x7E, 0x7F, 8)
    assert (d5["ELEM_MAX"], d5["ELEM_MAX_CODE"], d5["ELEM_NAN_CODE"], d5["ELEM_EMAX"]) == (57344.0, 0x7B, 0x7F, 15)
    assert d4["ELEM_FP8_INTERP"] == "__NV_E4M3" and d5["ELEM_FP8_INTERP"] == "__NV_E5M2"
    # UE8M0 scale row (docs/numerics.md §0.4): bias 127, max code 0xFE, NaN 0xFF.
    assert (d4["SCALE_UE8M0"], d4["E8M0_BIAS"], d4["E8M0_MAX_CODE"], d4["E8M0_NAN_CODE"]) == (1, 127, 0xFE, 0xFF)
    assert d4["E8M0_BIAS"] == UE8M0.bias


@pytest.mark.parametrize(
    "config, name, bits",
    [
        (QuantConfig("mxfp8"), "ELEM_RECIP_MAX", 0x3B124925),  # docs/numerics.md §3 fl(1/448)
        (QuantConfig("mxfp8", element="e5m2"), "ELEM_RECIP_MAX", 0x37924925),  # fl(1/57344)
        (QuantConfig("nvfp4"), "ELEM_RECIP_MAX", 0x3E2AAAAB),  # §5.2 fl(1/6)
        (QuantConfig("nvfp4"), "NVFP4_RECIP_GLOBAL_MAX", 0x39C30C31),  # §5.8 fl(1/2688)
        (QuantConfig("nvfp4"), "NVFP4_RECIP_ALPHA", 0x34149B93),  # §5.8 fl(1/7225344)
        (QuantConfig("nvfp4"), "NVFP4_GLOBAL_MAX", 0x45280000),  # 2688
        (QuantConfig("fp8_block"), "FP32_MAX", 0x7F7FFFFF),
        (QuantConfig("fp8_block"), "INPUT_MAX_BFLOAT16", 0x7F7F0000),  # §4 v_inf for bf16 input
        (QuantConfig("fp8_block"), "INPUT_MAX_FLOAT16", 0x477FE000),  # 65504
    ],
    ids=lambda v: v.id if isinstance(v, QuantConfig) else (hex(v) if isinstance(v, int) else v),
)
def test_float_defines_are_exact_fp32_constants(config, name, bits):
    d = _compile.defines_for(config)
    assert _bits(d[name]) == bits
    # The emitted literal reads back to exactly that fp32 value.
    lit = _compile.define_value(d[name])
    assert _bits(_literal_value(lit)) == bits


def test_delayed_defines():
    # docs/numerics.md §2 step 1: S_max = fp8_max * 2^-margin (448 -> 0x43E00000, margin 1 -> 224, E5M2 57344).
    assert _compile.defines_for(QuantConfig("fp8_delayed"))["DELAYED_SCALE_MAX_BITS"] == 0x43E00000
    d = _compile.defines_for(QuantConfig("fp8_delayed", margin=1, amax_history_len=4, amax_compute_algo="most_recent"))
    assert (d["DELAYED_SCALE_MAX_BITS"], d["AMAX_HISTORY_LEN"], d["AMAX_ALGO_MAX"], d["MARGIN"]) == (0x43600000, 4, 0, 1)
    d5 = _compile.defines_for(QuantConfig("fp8_delayed", element="e5m2"))
    assert d5["DELAYED_SCALE_MAX_BITS"] == _bits(57344.0)


def test_toggles_reach_the_defines():
    base = _compile.defines_for(QuantConfig("fp8_block"))
    assert (base["POW2"], base["IS_2D"], base["BLOCK"], base["TILE_ROWS"], base["EPS"]) == (1, 0, 128, 1, 0.0)
    d = _compile.defines_for(QuantConfig("fp8_block", tile=(128, 128), pow2_scales=False, eps=1e-3))
    assert (d["POW2"], d["IS_2D"], d["TILE_ROWS"]) == (0, 1, 128)
    assert _bits(d["EPS"]) == _bits(1e-3)  # eps rounded once to fp32, as the reference's fp32 tensor
    assert _compile.defines_for(QuantConfig("mxfp8", e8m0_rule="floor"))["E8M0_CEIL"] == 0
    assert _compile.defines_for(QuantConfig("mxfp8"))["E8M0_CEIL"] == 1
    n = _compile.defines_for(QuantConfig("nvfp4", rht=True, stochastic=True))
    assert (n["RHT"], n["STOCHASTIC"], n["SCALE_E4M3"], n["SCALE_MAX"]) == (1, 1, 1, 448.0)
    assert _compile.defines_for(QuantConfig("fp8_current"))["SCALE_FP32"] == 1


def test_define_formatting():
    opts = _compile.define_options({"B": 2, "A": 448.0, "C": "__NV_E4M3", "D": True})
    assert opts == ["-DA=0x1.c000000000000p+8f", "-DB=2", "-DC=__NV_E4M3", "-DD=1"]
    with pytest.raises(ValueError, match="not exactly representable"):
        _compile.define_value(0.1)  # 0.1 is not an fp32 value
    with pytest.raises(ValueError, match="not finite"):
        _compile.define_value(float("inf"))
    with pytest.raises(ValueError, match="not a C identifier"):
        _compile.define_options({"1X": 1})
    # Subnormal fp32 values survive the literal exactly (e.g. 2^-149).
    assert _bits(_literal_value(_compile.define_value(2.0**-149))) == 1
    assert _compile.defines_for(QuantConfig("mxfp8"))["FP32_MAX"] == FLT_MAX


def test_module_key_ignores_define_order_and_spelling_but_not_values():
    k = _compile.module_key("mxfp8.cu", {"B": 2, "A": 448.0, "D": True})
    assert k == _compile.module_key("mxfp8.cu", {"D": 1, "A": 448.0, "B": 2})  # the same -D options
    assert k != _compile.module_key("mxfp8.cu", {"B": 2, "A": 57344.0, "D": True})
    assert k != _compile.module_key("fp8_block.cu", {"B": 2, "A": 448.0, "D": True})


# ---- options ---------------------------------------------------------------------------------


def test_nvrtc_options_are_the_contract_set():
    opts = _compile.nvrtc_options("sm_90", {"X": 1}, [Path("/inc")])
    assert opts[0] == "--gpu-architecture=sm_90"
    for o in ("-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false", "-std=c++17", "-DX=1", "-I/inc"):
        assert o in opts
    assert not any("fast_math" in o or o in ("-ftz=true", "-fmad=true") for o in opts)
    with pytest.raises(ValueError, match="arch"):
        _compile.nvrtc_options("compute_90", {}, [])


def test_nvcc_command_mirrors_the_semantic_options(tmp_path):
    cmd = _compile.nvcc_command(Path("x.cu"), tmp_path / "x.cubin", "sm_100a", {"X": 1})
    assert "-cubin" in cmd and "arch=compute_100a,code=sm_100a" in cmd
    for o in _compile.SEMANTIC_OPTIONS + _compile.LANGUAGE_OPTIONS:
        assert o in cmd
    assert "-DX=1" in cmd


def test_cache_key_covers_source_headers_options_arch(tmp_path, monkeypatch):
    monkeypatch.setattr(_compile, "CUDA_DIR", tmp_path)
    (tmp_path / "h.cuh").write_text("#define H 1\n")
    src = tmp_path / "k.cu"
    src.write_text('#include "h.cuh"\nextern "C" __global__ void k() {}\n')
    k0 = _compile.cache_key(src, ["-DA=1"], "sm_90", (13, 0))
    assert _compile.cache_key(src, ["-DA=2"], "sm_90", (13, 0)) != k0
    assert _compile.cache_key(src, ["-DA=1"], "sm_100a", (13, 0)) != k0
    assert _compile.cache_key(src, ["-DA=1"], "sm_90", (13, 1)) != k0
    (tmp_path / "h.cuh").write_text("#define H 2\n")
    assert _compile.cache_key(src, ["-DA=1"], "sm_90", (13, 0)) != k0


def test_device_arch_names_the_arch_from_torch_without_touching_cupy_for_an_explicit_device(monkeypatch):
    """An explicit device id is answered by torch (harness run's process: CuPy's first call there waited seconds
    behind the workers' context creation, issue #19); capability 10.0 on takes the arch-specific `a` suffix."""
    import torch

    monkeypatch.setitem(sys.modules, "cupy", None)  # importing cupy now raises ImportError
    seen = []
    for cap, arch in (((9, 0), "sm_90"), ((8, 9), "sm_89"), ((10, 0), "sm_100a"), ((12, 0), "sm_120a")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i, cap=cap: (seen.append(i), cap)[1])
        assert _compile.device_arch(1) == arch
    assert seen == [1, 1, 1, 1]
    with pytest.raises(ImportError):  # no id: CuPy's current device, the one load_module loads into
        _compile.device_arch()


def test_every_cu_file_names_known_schemes():
    files = sorted(_compile.CUDA_DIR.glob("*.cu"))
    assert files, "native/cuda has no .cu files"
    for f in files:
        assert _compile.file_schemes(f)  # raises on an unknown scheme name
    assert _compile.file_schemes(_compile.CUDA_DIR / "mxfp8.cu") == ("mxfp8",)
    assert _compile.file_schemes(_compile.CUDA_DIR / "fp8_per_tensor.cu") == ("fp8_current", "fp8_delayed")


# ---- no CuPy-compiled kernels anywhere (docs/numerics.md §0.3) ----------------------------------------

_FORBIDDEN_CALLS = {"RawKernel", "ElementwiseKernel", "ReductionKernel"}  # all compile through CuPy (-ftz=true)


def _bad_calls(tree: ast.AST) -> list[str]:
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else None)
        if name in _FORBIDDEN_CALLS:
            bad.append(f"{name}(...) at line {node.lineno}")
        if name == "RawModule":
            kws = {k.arg for k in node.keywords}
            if node.args or "code" in kws or "path" not in kws:
                bad.append(f"RawModule without path= at line {node.lineno}")
    return bad


def test_no_source_compiles_through_cupy():
    offenders = {}
    for sub in ("native", "harness", "reference", "benchmarks", "examples"):
        for py in sorted((ROOT / sub).rglob("*.py")):
            bad = _bad_calls(ast.parse(py.read_text(), filename=str(py)))
            if bad:
                offenders[str(py.relative_to(ROOT))] = bad
    assert not offenders, f"CuPy's compiler forces -ftz=true (docs/numerics.md §0.3): {offenders}"


def test_the_scanner_catches_forbidden_calls():
    src = "import cupy\ncupy.RawModule(code='x')\ncupy.RawKernel('x', 'k')\ncupy.RawModule(path='a.cubin')\n"
    assert _bad_calls(ast.parse(src)) == ["RawModule without path= at line 2", "RawKernel(...) at line 3"]


# ---- CPU-only behaviour ----------------------------------------------------------------------


def test_native_imports_and_declines_without_cupy():
    code = (
        "import sys; sys.modules['cupy'] = None; sys.modules['cupy_backends'] = None\n"
        "import torch, native\n"
        "from reference.formats import QuantConfig\n"
        "ok, why = native.supports('quantize', QuantConfig('mxfp8'), 'cuda')\n"
        "assert ok is False and why, (ok, why)\n"
        "ok, why = native.supports('quantize', QuantConfig('fp8_block'), 'cpu')\n"
        "assert ok is False and 'CUDA' in why, why\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_quantize_rejects_cpu_tensors_with_a_spec_violation():
    import torch

    import native
    from reference.types import SpecViolation

    with pytest.raises(SpecViolation, match="CUDA"):
        native.quantize(torch.ones(32, 32), QuantConfig("mxfp8"))
    with pytest.raises(SpecViolation, match="not a multiple of 32"):  # the reference's own checks run first
        native.quantize(torch.ones(33, 32), QuantConfig("mxfp8"))


# ---- nvcc check (CI runs it; nvcc 13 is on this machine) ---------------------------------------

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@needs_nvcc
def test_nvcc_check_compiles_a_kernel_file():
    assert _compile.main(["--nvcc-check", "--arch", "sm_90", "--file", "fp8_block.cu"]) == 0


@needs_nvcc
def test_nvcc_check_fails_on_a_broken_file(tmp_path, monkeypatch):
    shutil.copy(_compile.CUDA_DIR / "common.cuh", tmp_path / "common.cuh")
    (tmp_path / "broken.cu").write_text('// schemes: fp8_block\n#include "common.cuh"\nthis is not C++;\n')
    monkeypatch.setattr(_compile, "CUDA_DIR", tmp_path)
    assert _compile.main(["--nvcc-check", "--arch", "sm_90"]) == 1


@needs_nvcc
@pytest.mark.parametrize("config", [QuantConfig("nvfp4"), QuantConfig("nvfp4", stochastic=True)], ids=lambda c: c.id)
def test_the_nvfp4_quantize_kernel_does_not_spill_at_its_register_cap(config, tmp_path):
    """The tiled quantize kernel runs 3 CTAs an SM at 80 registers (quantize_ctas_per_sm); a spill puts local-memory
    traffic into its tile loop (docs/performance.md §4.5: the scales' zero padding in the kernel's tail made the bf16 SR
    builds spill, 68 bytes on sm_90). sm_90, bf16: RN and SR (the SR build is the one closest to the cap)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from sass_count import resource_usage  # ptxas -v of the nvcc mirror of the NVRTC build

    assert resource_usage(config, "sm_90", "nvfp4_quantize_bf16", tmp_path / "k.cubin")["spill"] == 0


def test_modules_for_names_the_file_and_defines_each_quantizer_loads():
    from native.modules import modules_for

    files = {"fp8_current": "fp8_per_tensor.cu", "fp8_delayed": "fp8_per_tensor.cu", "mxfp8": "mxfp8.cu",
             "fp8_block": "fp8_block.cu", "nvfp4": "nvfp4.cu"}
    for cfg in (QuantConfig("fp8_current"), QuantConfig("fp8_delayed"), QuantConfig("mxfp8", tile=(32, 32)),
                QuantConfig("fp8_block", element="e5m2"), QuantConfig("nvfp4", rht=True, stochastic=True)):
        want = [(files[cfg.scheme], _compile.defines_for(cfg))]
        assert modules_for("dequantize", cfg) == want
        # An NVFP4 call plan (built at a signature's first call) with a given amax, or an own amax over a large X,
        # launches fill_given first (fp8_per_tensor.cu, built for fp8_current): quantize may load that module too.
        fill = [("fp8_per_tensor.cu", _compile.defines_for(QuantConfig("fp8_current")))] * (cfg.scheme == "nvfp4")
        assert modules_for("quantize", cfg) == want + fill
    with pytest.raises(ValueError, match="'transpose'"):
        modules_for("transpose", QuantConfig("mxfp8"))


def test_compile_many_compiles_every_item_in_order_on_threads(monkeypatch):
    import threading

    seen = []

    def fake(name, defines, arch):
        seen.append((name, defines["N"], arch, threading.current_thread().name))
        return Path(f"/cache/{name}-{defines['N']}-{arch}.cubin")

    monkeypatch.setattr(_compile, "compile_cubin", fake)
    items = [(f"f{i}.cu", {"N": i}) for i in range(7)]
    paths = _compile.compile_many(items, "sm_90", workers=3)
    assert paths == [Path(f"/cache/f{i}.cu-{i}-sm_90.cubin") for i in range(7)]
    assert sorted((n, d, a) for n, d, a, _ in seen) == [(f"f{i}.cu", i, "sm_90") for i in range(7)]
    assert all(t.startswith("nvrtc") for *_, t in seen)  # the pool's threads, not the caller's
    assert _compile.compile_many([], "sm_90") == []
