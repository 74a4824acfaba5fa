"""Backend registry (names, entry points, module:object specs, errors) and the torch backend's quantizer.

Expected bytes come from docs/numerics.md §8 (current scaling, amax 3) and §0.5 (sat_e4m3, NaN -> 0x7F),
or from the golden reference (an independent implementation) for whole tensors.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import reference
from harness import backends
from harness.backends import UnknownBackend, get_backend
from reference import QuantConfig, Unsupported
from reference.per_tensor import AmaxHistory

# ---- registry ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, cls", [("reference", backends.ReferenceBackend), ("native", backends.NativeBackend),
                                       ("torch", backends.TorchBackend)])
def test_builtin_names_resolve(name, cls):
    b = get_backend(name)
    assert isinstance(b, cls) and b.name == name
    assert isinstance(b, backends.Backend)
    assert backends.backend_spec(b) == name


def test_unknown_backend_error_names_it_and_lists_the_known_ones():
    with pytest.raises(UnknownBackend, match=r"unknown backend 'no_such_backend'.*reference, native, torch"):
        get_backend("no_such_backend")


def test_module_object_spec_loads_an_instance_and_keeps_the_spec():
    b = get_backend("examples.my_kernel_adapter:backend")
    assert b.name == "my_kernel"
    assert backends.backend_spec(b) == "examples.my_kernel_adapter:backend"


def test_module_object_spec_accepts_a_class():
    b = get_backend("harness.backends:TorchBackend")
    assert isinstance(b, backends.TorchBackend)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz:backend", "cannot import module 'no_such_module_xyz'"),
        ("examples.my_kernel_adapter:nope", "has no attribute 'nope'"),
        ("examples.my_kernel_adapter:", "expected 'package.module:object'"),
    ],
)
def test_bad_module_object_specs_say_what_is_wrong(spec, message):
    with pytest.raises(UnknownBackend, match=message):
        get_backend(spec)


def test_an_object_that_is_not_a_backend_is_rejected():
    with pytest.raises(TypeError, match="no string `name`"):
        get_backend("harness.backends:OPS")  # a tuple, not a backend


def test_entry_point_backend_is_found_by_name(tmp_path, monkeypatch):
    (tmp_path / "ep_backend_mod.py").write_text(textwrap.dedent(
        """
        class EPBackend:
            name = "ep_demo"
            def supports(self, op, config, device):
                return op == "quantize", "quantize only"
            def quantize(self, x, config, **kw):
                raise NotImplementedError
        """
    ))
    dist = tmp_path / "ep_demo_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-demo-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{backends.ENTRY_POINT_GROUP}]\nep_demo = ep_backend_mod:EPBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ep_demo" in backends.backend_names()
    b = get_backend("ep_demo")
    assert b.name == "ep_demo" and b.supports("quantize", QuantConfig("fp8_current"), "cpu") == (True, "quantize only")
    sys.modules.pop("ep_backend_mod", None)


def test_parse_backend_list_keeps_order_and_drops_duplicates():
    assert backends.parse_backend_list(" reference,torch,reference ,") == ["reference", "torch"]
    with pytest.raises(UnknownBackend):
        backends.parse_backend_list(" , ")


# ---- supports() reasons ----------------------------------------------------------------------


def test_native_on_cpu_is_unsupported_with_a_reason():
    ok, why = get_backend("native").supports("quantize", QuantConfig("nvfp4"), "cpu")
    assert not ok and "CUDA" in why


def test_native_prepare_compiles_the_modules_of_distinct_supported_cases_once(monkeypatch):
    """prepare() asks `supports` once per distinct (op, config, b_config, out_dtype) and hands every
    module of the supported ones to one precompile call (the CUDA side is faked here)."""
    import native.modules
    from harness.cases import Case

    b = backends.NativeBackend()
    asked, got = [], []
    monkeypatch.setattr(b, "_native", lambda: object())
    monkeypatch.setattr(b, "supports", lambda op, cfg, dev: (asked.append((op, cfg.id)), (cfg.scheme != "nvfp4", ""))[1])
    monkeypatch.setattr(native.modules, "modules_for",
                        lambda op, cfg, *, b_config=None, out_dtype=None, device=None: [(f"{cfg.scheme}.cu", {"D": 1})])
    monkeypatch.setattr(native.modules, "precompile", lambda items, *, device=None: got.append(list(items)) or 7)
    mx, nv = QuantConfig("mxfp8"), QuantConfig("nvfp4")
    cases = [Case("quantize", mx, (32, 32), seed=s) for s in range(5)] + [Case("quantize", nv, (32, 32))]
    line = b.prepare(cases, "cuda")
    assert sorted(asked) == [("quantize", mx.id), ("quantize", nv.id)]  # not once per case
    assert got == [[("mxfp8.cu", {"D": 1})]]  # the unsupported nvfp4 case adds nothing
    assert line.startswith("native: 7 CUDA modules")


def test_torch_backend_supports_per_tensor_quantize_only_and_no_cpu_gemm():
    t = get_backend("torch")
    assert t.supports("quantize", QuantConfig("fp8_current"), "cpu") == (True, "")
    assert t.supports("dequantize", QuantConfig("fp8_delayed"), "cpu") == (True, "")
    ok, why = t.supports("quantize", QuantConfig("mxfp8"), "cpu")
    assert not ok and "mxfp8" in why
    ok, why = t.supports("gemm", QuantConfig("fp8_current"), "cpu")
    assert not ok and "CUDA" in why and "_scaled_mm" in why
    with pytest.raises(Unsupported, match="mxfp8"):
        t.quantize(torch.zeros(32, 32), QuantConfig("mxfp8"))


# ---- torch backend quantizer -----------------------------------------------------------------


def _bits(t: torch.Tensor) -> int:
    return int(t.reshape(-1)[0].view(torch.int32)) & 0xFFFFFFFF


def test_torch_quantize_matches_numerics_8_current_scaling_vector_amax_3():
    # docs/numerics.md §8: amax 3 -> s = 0x43155555 (true division), sinv = 0x3BDB6DB7;
    # 3*s = 448 exactly -> 0x7E; -3 -> 0xFE; NaN of either sign -> 0x7F (§0.5); -0.0 -> 0x80.
    x = torch.tensor([[3.0, -3.0, float("nan"), -float("nan"), -0.0, 0.0, 1.0, 2.0]])
    q = get_backend("torch").quantize(x, QuantConfig("fp8_current"), rowwise=True, colwise=True)
    assert _bits(q.rowwise_scale) == 0x3BDB6DB7
    assert q.rowwise_data[0, :6].tolist() == [0x7E, 0xFE, 0x7F, 0x7F, 0x80, 0x00]
    assert float(q.rowwise_amax) == 3.0
    assert torch.equal(q.colwise_data, q.rowwise_data.t())
    assert _bits(q.colwise_scale) == 0x3BDB6DB7


@pytest.mark.parametrize("amax, pow2, sinv_bits", [(0.0, False, 0x3F800000), (float("inf"), False, 0x3F800000),
                                                    (1e-37, False, 0x00200000), (1e-37, True, 0x00400000)])
def test_torch_scale_special_amax_follow_numerics_8(amax, pow2, sinv_bits):
    # docs/numerics.md §8: amax 0 / +inf -> s = 1, sinv = 1; amax 1e-37 -> s = FLT_MAX, sinv = 0x00200000
    # (subnormal, kept); pow2 -> s = 2^127, sinv = 0x00400000.
    x = torch.tensor([[amax, 0.0]])
    q = get_backend("torch").quantize(x, QuantConfig("fp8_current", pow2_scales=pow2))
    assert _bits(q.rowwise_scale) == sinv_bits


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_quantize_and_dequantize_agree_with_reference_bytes(element, dtype):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(48, 80, generator=g) * 3).to(dtype)
    x[0, :6] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-30]).to(dtype)
    x[1, :4] = torch.tensor([2.0**-12, -(2.0**-15), 448.0, 57344.0]).to(dtype)
    cfg = QuantConfig("fp8_current", element=element)
    ref = reference.quantize(x, cfg, rowwise=True, colwise=True)
    got = get_backend("torch").quantize(x, cfg, rowwise=True, colwise=True)
    for f in ref.TENSOR_FIELDS:
        assert torch.equal(getattr(got, f).view(torch.uint8), getattr(ref, f).view(torch.uint8)), f
    for o in ("rowwise", "colwise"):
        for out, ints in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
            a = get_backend("torch").dequantize(ref, o, out)
            b = reference.dequantize(ref, o, out)
            # Bit for bit, NaN lanes included (the backend writes the canonical NaN like the reference).
            assert torch.equal(a.view(ints), b.view(ints)), (o, out)


def test_torch_delayed_scaling_uses_the_state_scale_and_records_amax():
    cfg = QuantConfig("fp8_delayed", amax_history_len=4)
    x = torch.tensor([[5.0, -1.0, 2.0, 300.0]])
    st_t, st_r = AmaxHistory(cfg), AmaxHistory(cfg)
    st_t.scale = torch.tensor([2.0])
    st_r.scale = torch.tensor([2.0])
    got = get_backend("torch").quantize(x, cfg, state=st_t)
    ref = reference.quantize(x, cfg, state=st_r)
    assert float(got.rowwise_scale) == 0.5  # sinv = 1/scale
    assert got.rowwise_data.tolist() == ref.rowwise_data.tolist()  # 600 saturates to 448 (0x7E)
    assert got.rowwise_data[0, 3].item() == 0x7E
    assert st_t.history.tolist() == [300.0, 0.0, 0.0, 0.0] == st_r.history.tolist()


@pytest.mark.gpu
def test_torch_per_tensor_gemm_is_exact_on_exactly_representable_inputs(cuda_device):
    # Small integers with power-of-two scales: every product and partial sum is exact in fp32
    # (docs/numerics.md §6 exact-representable mode), so cuBLAS must give the fp64 result bit for bit.
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-4, 5, (64, 128), generator=g).float()
    b = torch.randint(-4, 5, (32, 128), generator=g).float()
    a[0, 0], b[0, 0] = 7.0, 7.0  # amax 7 -> s = 448/7 = 64, a power of two (exact)
    cfg = QuantConfig("fp8_current", pow2_scales=True)
    qa = reference.quantize(a, cfg).to(cuda_device)
    qb = reference.quantize(b, cfg).to(cuda_device)
    out = get_backend("torch").gemm(qa, qb, layout="TN", out_dtype=torch.float32)
    assert torch.equal(out.cpu(), (a.double() @ b.double().t()).float())


def test_auto_expands_to_every_backend_supporting_some_case_on_the_device(capsys):
    from harness import cli
    from harness.cases import Case

    fp8 = Case("quantize", QuantConfig("fp8_current"), (32, 32))
    mx = Case("quantize", QuantConfig("mxfp8"), (32, 32))
    names = [b.name for b in cli.resolve_backends("auto", [fp8, mx], "cpu")]
    assert names[:2] == ["reference", "torch"] and "native" not in names
    assert "native" in capsys.readouterr().err  # said why it was left out
    names = [b.name for b in cli.resolve_backends("auto", [mx], "cpu")]
    assert names == ["reference"]  # torch has no mxfp8 quantizer


def test_native_and_torch_skip_a_non_te_convention():
    """Only the golden (and a convention's own adapter) runs another framework's convention: native and
    torch implement `te`, so they skip such a config with a reason instead of being compared against it."""
    from harness import backends
    from reference import QuantConfig

    cfg = QuantConfig("mxfp8", convention="torchao_floor")
    ok, why = backends.get_backend("torch").supports("quantize", QuantConfig("fp8_current", convention="torchao_float8"), "cpu")
    assert not ok and "'te' convention" in why and "torchao_float8" in why
    import importlib

    nq = importlib.import_module("native.quantize")  # `native.quantize` the attribute is the function
    ok, why = nq.supports("quantize", cfg, "cuda")
    assert not ok and why == "native implements the 'te' convention only, not 'torchao_floor'"
