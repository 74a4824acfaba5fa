"""The native launcher registry, and native's own swizzle, NVFP4 alpha and amax-history record against the golden.

Source: docs/design.md §1 (native never calls golden numerics for results it returns; its own versions are
cross-checked against the reference in tests), docs/numerics.md §3 Layouts and §5.9 (swizzle), §5.8 (alpha),
§2 (H[0] <- fmax(H[0], amax)). Runs on the CPU: native's own code works on CPU tensors and numpy scalars.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import reference
from native import launchers, swizzle
from native import nvfp4 as native_nvfp4
from native import per_tensor as native_per_tensor
from native._compile import defines_for
from native.gemm import operand_view
from reference.formats import SCHEMES, QuantConfig
from reference.layouts import geometry_of, swizzle_scales
from reference.nvfp4 import gemm_alpha
from reference.per_tensor import AmaxHistory

NATIVE = Path(native_nvfp4.__file__).resolve().parent
INTERFACE = ("CU_FILE", "CUBLASLT", "quantize_2d", "dequantize", "lt_scale", "lt_alpha",
             "scheme_defines", "nvcc_check_configs", "plan_quantize", "PLAN_MODULES")


def test_every_scheme_has_a_launcher_with_the_whole_interface():
    assert set(launchers.MODULES) == set(SCHEMES)
    for scheme in SCHEMES:
        mod = launchers.launcher(scheme)
        missing = [a for a in INTERFACE if not hasattr(mod, a)]
        assert not missing, f"{mod.__name__} lacks {missing}"
        assert (NATIVE / "cuda" / mod.CU_FILE).is_file()
        assert scheme in Path(NATIVE / "cuda" / mod.CU_FILE).read_text().split("// schemes:")[1].splitlines()[0]
    with pytest.raises(ValueError, match="no native launcher"):
        launchers.launcher("fp4_nope")


def test_generic_native_modules_never_branch_on_a_scheme_name():
    """Per-scheme code lives in the launcher modules (native/<module>.py named in launchers.MODULES)."""
    per_scheme = {f"{m}.py" for m in launchers.MODULES.values()}
    branch = re.compile(r"\bscheme\s*(==|!=|\bin\b|\bnot in\b)|\bscheme_name\s*(==|!=)")
    for path in sorted(NATIVE.glob("*.py")):
        if path.name in per_scheme:
            continue
        code = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
        hits = [ln.strip() for ln in code if branch.search(ln) and "for scheme in" not in ln]
        assert not hits, f"{path.name}: {hits}"


# ---- swizzle --------------------------------------------------------------------------------


SWIZZLE_CONFIGS = [QuantConfig("mxfp8"), QuantConfig("mxfp8", tile=(32, 32)), QuantConfig("nvfp4"),
                   QuantConfig("nvfp4", tile=(16, 16))]
SWIZZLE_SHAPES = [(32, 32), (64, 96), (160, 32), (32, 640), (288, 416), (512, 128), (96, 1056)]


@pytest.mark.parametrize("config", SWIZZLE_CONFIGS, ids=lambda c: c.id)
@pytest.mark.parametrize("shape", SWIZZLE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_swizzle_equals_the_reference_with_dirty_padding(config, shape):
    """native.swizzle (a scatter through computed offsets) == reference.layouts.swizzle_scales (reshape and
    permute), byte for byte, both copies; padding holding garbage is written as 0 by both."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[0] * 7 + shape[1])) * 5
    q = reference.quantize(x, config, rowwise=True, colwise=True)
    gen = torch.Generator().manual_seed(3)
    for o in ("rowwise", "colwise"):
        g = geometry_of(q, o)
        scale = getattr(q, f"{o}_scale")
        vr, vc = g.scale_valid_shape
        dirty = torch.randint(1, 256, scale.shape, generator=gen, dtype=torch.int32).to(torch.uint8)
        dirty[:vr, :vc] = scale[:vr, :vc]
        setattr(q, f"{o}_scale", dirty)
        want = swizzle_scales(q, o)
        got = swizzle.swizzled(dirty, g.scale_valid_shape, transposed=g.swizzle_transposed)
        assert got.dtype == want.dtype and torch.equal(got, want), f"{config.id} {shape} {o}"


def test_swizzle_places_hand_checked_entries():
    """docs/numerics.md §3 Layouts: (i, j) -> (i//128 * (C/4) + j//4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4."""
    rows, cols = 256, 8
    t = torch.arange(rows * cols, dtype=torch.int32).reshape(rows, cols)
    flat = swizzle.swizzled(t, (rows, cols), transposed=False)
    for i, j, off in [(0, 0, 0), (0, 3, 3), (1, 0, 16), (32, 0, 4), (33, 2, 22), (127, 3, 31 * 16 + 3 * 4 + 3),
                      (0, 4, 512), (128, 0, 1024), (200, 5, (1 * 2 + 1) * 512 + 8 * 16 + 2 * 4 + 1)]:
        assert int(flat[off]) == int(t[i, j]), (i, j, off)
    # Transposed: entry (a, b) of S [4, 128] is entry (b, a) of T = S^T [128, 4] (one swizzle tile).
    s = torch.arange(4 * 128, dtype=torch.int32).reshape(4, 128)
    flat_t = swizzle.swizzled(s, (4, 128), transposed=True)
    for a, b in [(0, 0), (3, 1), (2, 33), (1, 127)]:
        i, j = b, a
        off = (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
        assert int(flat_t[off]) == int(s[a, b]), (a, b)


def test_swizzle_rejects_an_unpadded_matrix():
    with pytest.raises(ValueError, match=r"T \[100, 4\]"):
        swizzle.swizzled(torch.zeros(100, 4, dtype=torch.uint8), (100, 4), transposed=False)


# ---- NVFP4 alpha ----------------------------------------------------------------------------


def _fp32_values() -> np.ndarray:
    """Global amaxes across the fp32 range: zero, subnormals, normals of every binade, the largest, inf."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 0x7F800000, 4000, dtype=np.uint32)
    special = np.array([0.0, 1.4e-45, 1e-40, 1.1754944e-38, 1.0, 2688.0, 3.4028235e38, np.inf], dtype=np.float32)
    return np.concatenate([bits.view(np.float32), special])


def test_alpha_equals_the_reference_bit_for_bit():
    a = _fp32_values()
    b = np.roll(a, 17)
    want = gemm_alpha(torch.from_numpy(a.copy()), torch.from_numpy(b.copy())).numpy().view(np.uint32)
    got = np.array([native_nvfp4.alpha(x, y) for x, y in zip(a, b, strict=True)], dtype=np.float32).view(np.uint32)
    nan = np.isnan(want.view(np.float32)) & np.isnan(got.view(np.float32))
    assert np.array_equal(np.where(nan, 0, got), np.where(nan, 0, want))


def test_alpha_constant_is_the_kernel_define_and_hand_checked():
    """fl(1/7225344) (7225344 = (6 * 448)^2): the kernels' NVFP4_RECIP_ALPHA and the host value agree."""
    r = native_nvfp4.recip_alpha_range()
    assert float(r) == defines_for(QuantConfig("nvfp4"))["NVFP4_RECIP_ALPHA"]
    assert abs(float(r) * 7225344 - 1) < 2**-24
    assert float(native_nvfp4.alpha(2688.0, 2688.0)) == 1.0  # RN(7225344 * fl(1/7225344)) rounds back to 1


@pytest.mark.parametrize("e_a,e_b", [(448, 448), (256, 448), (448, 256), (256, 256)])
def test_alpha_takes_each_operands_e4m3_max(e_a, e_b):
    """§5.10: fl(1/(36 * e_a * e_b)) on the host (cuBLASLt) and as the portable kernel's define, and the
    host alpha equals reference.nvfp4.gemm_alpha bit for bit over the fp32 range."""
    from native.gemm import kernel_defines

    r = native_nvfp4.recip_alpha_range(e_a, e_b)
    assert float(r) == float(np.float32(1) / np.float32(36 * e_a * e_b))
    ca, cb = (QuantConfig("nvfp4", variant="4over6", e4m3_max=e) for e in (e_a, e_b))
    assert kernel_defines(ca, cb, torch.float32)["NVFP4_RECIP_ALPHA"] == float(r)
    a = _fp32_values()
    b = np.roll(a, 5)
    want = gemm_alpha(torch.from_numpy(a.copy()), torch.from_numpy(b.copy()), e_a, e_b).numpy().view(np.uint32)
    got = np.array([native_nvfp4.alpha(x, y, e_a, e_b) for x, y in zip(a, b, strict=True)],
                   dtype=np.float32).view(np.uint32)  # fmt: skip
    nan = np.isnan(want.view(np.float32)) & np.isnan(got.view(np.float32))
    assert np.array_equal(np.where(nan, 0, got), np.where(nan, 0, want))


def test_cublaslt_host_alpha_from_the_consumed_copies():
    cfg = QuantConfig("nvfp4")
    a = reference.quantize(torch.randn(64, 96) * 37, cfg, rowwise=True, colwise=True)
    b = reference.quantize(torch.randn(32, 96) * 0.01, cfg, rowwise=True, colwise=True)
    for oa, ob in (("rowwise", "rowwise"), ("colwise", "colwise")):
        av, bv = operand_view(a, oa, "a"), operand_view(b, ob, "b")
        want = float(gemm_alpha(getattr(a, f"{oa}_amax"), getattr(b, f"{ob}_amax")).reshape(()))
        assert native_nvfp4.lt_alpha(av, bv) == want


# ---- amax history ---------------------------------------------------------------------------


@pytest.mark.parametrize("h0, amax", [(0.0, 3.5), (7.0, 3.5), (3.5, 7.0), (float("nan"), 2.0), (2.0, float("inf")),
                                      (float("inf"), 1.0), (0.0, 0.0), (1e-45, 0.0), (5.0, float("nan"))])
def test_record_equals_the_reference(h0, amax):
    """H[0] <- fmax(H[0], amax) (docs/numerics.md §2; fmax ignores NaN), the rest of the history untouched."""
    cfg = QuantConfig("fp8_delayed", amax_history_len=4)
    ours, gold = AmaxHistory(cfg), AmaxHistory(cfg)
    for st in (ours, gold):
        st.history.copy_(torch.tensor([h0, 1.0, 2.0, 3.0]))
    native_per_tensor.record(ours, torch.tensor([amax]))
    gold.record(torch.tensor([amax]))
    assert torch.equal(ours.history.view(torch.int32), gold.history.view(torch.int32))
    assert torch.equal(ours.scale, gold.scale)


# ---- cuBLASLt rows ----------------------------------------------------------------------------


def test_cublaslt_rows_give_the_arch_and_version_reasons(monkeypatch):
    """docs/numerics.md §6 table, through each launcher's CublasLtMode (the strings reports carry as skip reasons)."""
    import importlib

    from native import cublaslt

    native_gemm = importlib.import_module("native.gemm")  # the module (native.gemm is also the function)

    cc, ver = [(9, 0)], [130000]
    monkeypatch.setattr(cublaslt, "available", lambda: (True, "cuBLASLt 13.0.0"))
    monkeypatch.setattr(cublaslt, "version", lambda: ver[0])
    monkeypatch.setattr(native_gemm, "_cc", lambda device: cc[0])

    def gap(cfg: QuantConfig, at: tuple[int, int], version: int = 130000):
        native_gemm._cublaslt_gap.cache_clear()
        cc[0], ver[0] = at, version
        return native_gemm._cublaslt_gap(launchers.launcher(cfg.scheme).CUBLASLT, 0)

    cur, dly, blk, mx, nv = (QuantConfig(s) for s in ("fp8_current", "fp8_delayed", "fp8_block", "mxfp8", "nvfp4"))
    assert [gap(c, (9, 0)) for c in (cur, dly, blk)] == [None, None, None]
    assert gap(mx, (9, 0)) == "MXFP8 cuBLASLt GEMM needs sm_100+ (this GPU is sm_90); use method='portable'"
    assert gap(nv, (9, 0)) == "NVFP4 cuBLASLt GEMM needs sm_100+ (this GPU is sm_90); use method='portable'"
    assert gap(cur, (8, 0)) == "per-tensor FP8 cuBLASLt GEMM needs sm_89+ (this GPU is sm_80); use method='portable'"
    assert gap(cur, (8, 9)) is None and gap(mx, (10, 0)) is None and gap(nv, (12, 0)) is None
    assert gap(blk, (10, 0)) == ("FP8 block-scaled (VEC128/BLK128x128) cuBLASLt GEMM runs on sm_90 only "
                                 "(this GPU is sm_100); use method='portable'")
    assert gap(blk, (9, 0), 120800) == ("fp8_block cuBLASLt GEMM needs cuBLAS >= 12.9.0, found 12.8.0; "
                                        "use method='portable'")
    assert gap(nv, (10, 0), 120700) == "nvfp4 cuBLASLt GEMM needs cuBLAS >= 12.8.0, found 12.7.0; use method='portable'"
    native_gemm._cublaslt_gap.cache_clear()


def test_native_imports_contract_types_and_rules_never_golden_numerics():
    """docs/design.md §1: native -> reference.formats / types / geometry / spec only (and AmaxHistory, the
    fp8_delayed state type, and the default convention's name). A golden swizzle, alpha, amax-history update or cast imported here could never
    show up as a mismatch."""
    import ast

    allowed_modules = {"reference.formats", "reference.types", "reference.spec"}
    allowed_names = {("reference.layouts", n) for n in ("CopyGeometry", "copy_geometry", "geometry_of", "gemm_layout")}
    allowed_names.add(("reference.per_tensor", "AmaxHistory"))
    allowed_names.add(("reference.conventions", "DEFAULT"))  # the name of the convention native implements
    # The grouped-quantize rules on names and shapes (docs/numerics.md §12.1), shared like reference.spec's.
    allowed_names |= {("reference.grouped", n) for n in ("GROUPED_SCHEMES", "splits_rule")}
    allowed_names |= {("reference.gemm", n) for n in ("EPILOGUES", "epilogue_rule")}  # §12.2 rules on names
    # The module step's contract types only (docs/numerics.md §9.7, §9.8): native.linear orchestrates the step
    # itself and computes its norms and dbias with its own kernels; of reference.linear / norms only the types,
    # the names and the step-input rule (check_step, on shapes and dtypes).
    allowed_names |= {("reference.linear", n) for n in ("GemmInfo", "ModuleParams", "ModuleRun", "ModuleSpec",
                                                        "ModuleState", "StepInput", "StepResult", "check_step")}
    allowed_names |= {("reference.norms", n) for n in ("NORMALIZATIONS", "NormForward", "NormBackward")}
    for path in sorted(NATIVE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "reference" for a in node.names), (path.name, ast.dump(node))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("reference"):
                for a in node.names:
                    ok = node.module in allowed_modules or (node.module, a.name) in allowed_names
                    assert ok, f"{path.name}: from {node.module} import {a.name}"


def test_nvfp4_tile_count_checks_the_kernels_32_bit_indices():
    """native.nvfp4.tile_count: the quantize kernel's tiles (128 rows x 128 bytes of a row) and the 32-bit row, column
    and tile indices it assumes (nvfp4.cu quantize_tiles) - refused with a SpecViolation naming the limit."""
    assert native_nvfp4.tile_count(8192, 8192, torch.bfloat16) == 64 * 128
    assert native_nvfp4.tile_count(130, 80, torch.float32) == 2 * 3
    assert native_nvfp4.tile_count((1 << 32) - 16, 16, torch.bfloat16) == (1 << 25)
    with pytest.raises(reference.SpecViolation, match="rows and columns in 32 bits"):
        native_nvfp4.tile_count(1 << 32, 16, torch.bfloat16)
    with pytest.raises(reference.SpecViolation, match="rows and columns in 32 bits"):
        native_nvfp4.tile_count(16, 1 << 32, torch.float32)
    with pytest.raises(reference.SpecViolation, match="31 bits"):
        native_nvfp4.tile_count(1 << 31, 1 << 14, torch.float32)
