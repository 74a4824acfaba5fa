"""The cached call plans of native.quantize / native.gemm (native/plan.py, docs/design.md §4.1), on the CPU.

What is pure Python is checked here without a GPU: the prepared parameter block against `Signature.slots`'
bytes (an independent packing of the same arguments), the output block's layout, the cache bound, the plan
keys, and - for every scheme and variant - that a plan launches exactly what today's quantize_2d launches
(kernel, grid, block, every scalar slot, and which tensor every pointer is), recorded on the CPU with the
launches replaced. The GPU side (bits, per-call values, errors) is tests/gpu/test_native_plan.py.
"""

from __future__ import annotations

import ctypes
import sys
from unittest import mock

import numpy as np
import pytest
import torch

import native.launch as launch_mod
from native import fp8_block, mxfp8, nvfp4, per_tensor
from native import plan as plan_mod
from native.kernels import Patched, signature
from native.launch import PreparedLaunch, pack_params
from native.plan import ALIGN, Buffer, OutputBlock, PlanCache
from reference.formats import QuantConfig
from reference.per_tensor import AmaxHistory
from reference.types import SRSeed


def fake_cuda(dtype: torch.dtype, ptr: int):
    """A stand-in CUDA tensor for Signature.slots: the dtype and pointer are all a slot reads."""
    t = mock.Mock(spec=torch.Tensor)
    t.dtype, t.is_cuda = dtype, True
    t.data_ptr.return_value = ptr
    return t


def read_slots(address: int, n: int) -> list[int]:
    pointers = (ctypes.c_uint64 * n).from_address(address)
    return [ctypes.c_uint64.from_address(p).value for p in pointers]


# ---- the prepared parameter block -----------------------------------------------------------------------------


def test_prepared_block_has_the_bytes_of_pack_params():
    name = "nvfp4_quantize_bf16"
    ptrs = {"x": 0x7F00_0000_1000, "row_data": 0x7F00_0000_2000, "row_scale": 0x7F00_0000_3000,
            "row_amax": 0x7F00_0000_3100, "col_data": 0x7F00_0000_4000, "drawn": 0x7F00_0000_5000}  # fmt: skip
    seed, row_stream = 0xFEDC_BA98_7654_3210, 0xFFFF_FFFF
    template = [Patched("x", torch.bfloat16), np.int64(256), np.int64(-3), Patched("seed"),
                Patched("row_data", torch.uint8), Patched("row_scale", torch.uint8), np.int64(16),
                Patched("row_amax", torch.float32), Patched("row_stream"), Patched("col_data", torch.uint8), None,
                np.int64(0), None, np.uint32(7), Patched("_drawn", torch.int32)]  # fmt: skip
    prepared = PreparedLaunch(None, name, 3, 256, template, 0, fn=0)
    values = [ptrs["x"], seed, ptrs["row_data"], ptrs["row_scale"], ptrs["row_amax"], row_stream, ptrs["col_data"],
              ptrs["drawn"]]  # fmt: skip
    got = read_slots(prepared.params(values), 15)
    args = [fake_cuda(torch.bfloat16, ptrs["x"]), np.int64(256), np.int64(-3), np.uint64(seed),
            fake_cuda(torch.uint8, ptrs["row_data"]), fake_cuda(torch.uint8, ptrs["row_scale"]), np.int64(16),
            fake_cuda(torch.float32, ptrs["row_amax"]), np.uint32(row_stream), fake_cuda(torch.uint8, ptrs["col_data"]),
            None, np.int64(0), None, np.uint32(7), fake_cuda(torch.int32, ptrs["drawn"])]  # fmt: skip
    assert got == signature(name).slots(args) == read_slots(pack_params(name, args), 15)
    assert got[2] == (1 << 64) - 3  # two's complement, as the slot of an i64
    # A second call patches only its slots: the fixed ones keep their values.
    got2 = read_slots(prepared.params([1, 2, 3, 4, 5, 6, 7, 8]), 15)
    assert got2 == [1, 256, (1 << 64) - 3, 2, 3, 4, 16, 5, 6, 7, 0, 0, 0, 7, 8]


def test_prepare_checks_what_slots_checks():
    sig = signature("tensor_amax_bf16")
    with pytest.raises(TypeError, match="argument 0"):  # a float32 tensor for a bf16 parameter
        sig.prepare([Patched("x", torch.float32), np.int64(4), 1, Patched("amax", torch.float32)])
    with pytest.raises(TypeError, match="argument 1"):  # a fixed scalar of the wrong type, as slots()
        sig.prepare([Patched("x", torch.bfloat16), np.int32(4), 1, Patched("amax", torch.float32)])
    with pytest.raises(TypeError, match="takes 4 arguments"):
        sig.prepare([Patched("x", torch.bfloat16)])
    with pytest.raises(TypeError, match="only integer scalars"):  # a float scalar cannot be patched
        signature("norm_forward_f32").prepare([None] * 3 + [1, 1, Patched("eps"), 0, 0] + [None] * 4)
    slots, patched = sig.prepare([Patched("x", torch.bfloat16), np.int64(4), 1, None])
    assert slots == [0, 4, 1, 0] and [(i, m.role) for i, m in patched] == [(0, "x")]


# ---- the output block -----------------------------------------------------------------------------------------


def _cpu_memset(monkeypatch):
    """The block's memset on the host, and host blocks aligned as torch's CUDA allocator aligns them."""
    monkeypatch.setattr(plan_mod, "memset_zero", lambda ptr, n, index: ctypes.memset(ptr, 0, n))

    def aligned_block(n, device, like):
        raw = torch.empty(n + ALIGN, dtype=torch.uint8, device=device)
        return raw[(-raw.data_ptr()) % ALIGN:][:n]

    monkeypatch.setattr(plan_mod, "_raw_block", aligned_block)


def _fake_per_tensor_launches(monkeypatch):
    """A per-tensor plan built and run on the CPU: no module, function or stream; the block's memset on the host."""
    monkeypatch.setattr(per_tensor, "module_for", lambda *a: "module")
    monkeypatch.setattr(launch_mod, "function", lambda *a: 0)
    monkeypatch.setattr(per_tensor, "raw_stream", lambda index: 0)
    _cpu_memset(monkeypatch)


def test_output_block_layout_and_views(monkeypatch):
    _cpu_memset(monkeypatch)
    block = OutputBlock([
        Buffer("rowwise_data", (3, 5), torch.uint8),
        Buffer("_bits", (2,), torch.float32, zero=True, parts=(("rowwise_amax", 0, 1), ("_a_c", 1, 1)), field=False),
        Buffer("rowwise_scale", (7, 4), torch.float32, zero=True),
    ])  # fmt: skip
    # Zero-filled buffers first, each at an ALIGN-byte offset; the memset covers exactly them.
    assert block.offsets == {"_bits": 0, "rowwise_amax": 0, "_a_c": 4, "rowwise_scale": 256, "rowwise_data": 512,
                             "_block": 0}  # fmt: skip
    assert block.zero_bytes == 256 + 7 * 4 * 4 and block.nbytes == 768
    raw = torch.full((4096,), 0xAB, dtype=torch.uint8)
    base_addr = (raw.data_ptr() + ALIGN - 1) // ALIGN * ALIGN
    aligned = raw[base_addr - raw.data_ptr():]
    monkeypatch.setattr(plan_mod, "_raw_block", lambda n, device, like: aligned[:n])
    base, views = block.allocate(torch.device("cpu"), 0)
    assert base == base_addr and sorted(views) == ["rowwise_amax", "rowwise_data", "rowwise_scale"]
    assert views["rowwise_amax"].shape == (1,) and views["rowwise_amax"].dtype == torch.float32
    assert views["rowwise_scale"].shape == (7, 4) and views["rowwise_scale"].is_contiguous()
    assert views["rowwise_data"].shape == (3, 5) and views["rowwise_data"].dtype == torch.uint8
    for name, v in views.items():
        assert v.data_ptr() == base + block.offsets[name]
    assert int(views["rowwise_scale"].count_nonzero()) == 0 and float(views["rowwise_amax"]) == 0.0
    assert int((views["rowwise_data"] == 0xAB).sum()) == 15  # not zero-filled
    # A block that is not ALIGN-aligned is refused (the caller takes the full path).
    monkeypatch.setattr(plan_mod, "_raw_block", lambda n, device, like: aligned[16:16 + n])
    assert block.allocate(torch.device("cpu"), 0) is None


def test_raw_block_is_a_fresh_contiguous_uint8_block_from_one_template_per_device():
    like = {}
    a, b = (plan_mod._raw_block(1000, torch.device("cpu"), like) for _ in range(2))
    for t in (a, b):
        assert (t.shape, t.stride(), t.dtype, t.device.type) == ((1000,), (1,), torch.uint8, "cpu")
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() >= 1000
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()  # fresh storage per call
    assert list(like) == [torch.device("cpu")] and like[torch.device("cpu")].untyped_storage().nbytes() == 1
    m = plan_mod._raw_block(1000, torch.device("meta"), like)
    assert (m.shape, m.device.type, len(like)) == ((1000,), "meta", 2)


def test_every_allocation_is_fresh(monkeypatch):
    _cpu_memset(monkeypatch)
    block = OutputBlock([Buffer("rowwise_data", (64, 64), torch.uint8)])
    (_, a), (_, b) = (block.allocate(torch.device("cpu"), 0) for _ in range(2))
    assert a["rowwise_data"].untyped_storage().data_ptr() != b["rowwise_data"].untyped_storage().data_ptr()


# ---- the cache ------------------------------------------------------------------------------------------------


def test_plan_cache_is_bounded_and_evicts_the_oldest_recorded_plan():
    cache = PlanCache(maxsize=3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"  # a hit does not reorder: a is still the oldest recorded
    cache.put("d", "D")  # evicts a
    assert "a" not in cache and len(cache) == 3 and [cache.get(k) for k in "bcd"] == ["B", "C", "D"]
    cache.put("b", "B2")  # recording a key again makes it the newest
    cache.put("e", "E")  # evicts c
    assert [cache.get(k) for k in "bcde"] == ["B2", None, "D", "E"] and len(cache) == 3
    cache.enabled = False
    cache.put("f", "F")
    assert "f" not in cache
    cache.enabled = True
    cache.clear()
    assert len(cache) == 0 and cache.get("b") is None and plan_mod.MAX_PLANS >= 100
    cache.put("g", "G")  # get is still bound to the (cleared) map
    assert cache.get("g") == "G"


def test_clear_plans_and_use_plans():
    import native

    plan_mod.QUANTIZE_PLANS.put("k", 1)
    plan_mod.GEMM_PLANS.put("k", 1)
    native.clear_plans()
    assert len(plan_mod.QUANTIZE_PLANS) == len(plan_mod.GEMM_PLANS) == 0
    native.use_plans(False)
    try:
        plan_mod.QUANTIZE_PLANS.put("k", 1)
        assert plan_mod.QUANTIZE_PLANS.get("k") is None
    finally:
        native.use_plans(True)
    assert plan_mod.QUANTIZE_PLANS.enabled and plan_mod.GEMM_PLANS.enabled


# ---- the keys -------------------------------------------------------------------------------------------------


def _fake_cuda_input(shape=(64, 128), dtype=torch.bfloat16, ptr=0x7F00_0000_0000, contiguous=True):
    x = mock.Mock(spec=torch.Tensor)
    x.shape, x.dtype, x.device = torch.Size(shape), dtype, torch.device("cuda", 0)
    x.is_contiguous.return_value = contiguous
    x.data_ptr.return_value = ptr
    return x


def test_quantize_key_holds_every_input_the_checks_read():
    q = sys.modules["native.quantize"]

    cfg = QuantConfig("nvfp4")

    def key(x=None, config=cfg, rowwise=True, colwise=False, rng=None, state=None, amax=None):
        return q._plan_key(_fake_cuda_input() if x is None else x, config, rowwise, colwise, rng, state, amax)

    base = key()
    assert base is not None and base == key()
    others = [key(x=_fake_cuda_input((64, 256))), key(x=_fake_cuda_input(dtype=torch.float32)),
              key(config=QuantConfig("nvfp4", tile=(16, 16))), key(colwise=True), key(rowwise=False, colwise=True),
              key(rng=(1, 2)), key(state=object()), key(amax=torch.ones(1)),
              key(x=_fake_cuda_input(ptr=0x7F00_0000_0008)), key(x=_fake_cuda_input(contiguous=False))]  # fmt: skip
    assert len({base, *others}) == len(others) + 1
    # A misaligned input that is not contiguous is copied (aligned) first: the key does not read its pointer.
    assert key(x=_fake_cuda_input(ptr=8, contiguous=False)) == key(x=_fake_cuda_input(ptr=16, contiguous=False))
    # Not a CUDA tensor, not a tensor, not a QuantConfig: no plan (the full path raises the spec's error).
    assert q._plan_key(torch.ones(4, 16), cfg, True, False, None, None, None) is None
    assert q._plan_key([1.0], cfg, True, False, None, None, None) is None
    assert q._plan_key(_fake_cuda_input(), "nvfp4", True, False, None, None, None) is None


def test_gemm_key_holds_every_input_the_checks_read():
    import reference

    g = sys.modules["native.gemm"]

    cfg = QuantConfig("fp8_current")
    x = torch.randn(32, 64)
    a = reference.quantize(x, cfg, rowwise=True, colwise=True)
    b = reference.quantize(torch.randn(16, 64), cfg, rowwise=True, colwise=True)
    base = g._plan_key(a, b, "TN", torch.bfloat16, None, None, "auto")
    assert base is not None and base == g._plan_key(a, b, "TN", torch.bfloat16, None, None, "auto")
    b_wide = reference.quantize(torch.randn(24, 64), cfg, rowwise=True)
    others = [g._plan_key(a, b_wide, "TN", torch.bfloat16, None, None, "auto"),
              g._plan_key(a, b, "TN", torch.float32, None, None, "auto"),
              g._plan_key(a, b, "TN", torch.bfloat16, torch.ones(16), None, "auto"),
              g._plan_key(a, b, "TN", torch.bfloat16, torch.ones(16, dtype=torch.bfloat16), None, "auto"),
              g._plan_key(a, b, "TN", torch.bfloat16, None, torch.ones(32, 16), "auto"),
              g._plan_key(a, b, "TN", torch.bfloat16, None, None, "portable"),
              g._plan_key(reference.quantize(x.bfloat16(), cfg), b, "TN", torch.bfloat16, None, None, "auto")]
    assert len({base, *others}) == len(others) + 1
    # Bad layouts, non-QuantizedTensors and unhashable fields get no key (the full path raises the spec error).
    assert g._plan_key(a, b, "XX", torch.bfloat16, None, None, "auto") is None
    assert g._plan_key(a, b, ["TN"], torch.bfloat16, None, None, "auto") is None
    assert g._plan_key(a, "b", "TN", torch.bfloat16, None, None, "auto") is None
    bad = reference.quantize(x, cfg)
    bad.shape = [32, 64]
    assert g._plan_key(bad, b, "TN", torch.bfloat16, None, None, "auto") is None
    bad.shape = (np.int64(32), np.int64(64))  # equal to (32, 64), but check_quantized refuses it: another key
    assert g._plan_key(bad, b, "TN", torch.bfloat16, None, None, "auto") not in (None, base)
    # An unhashable out_dtype or method: the key cannot be looked up; gemm raises the full path's error.
    import native

    with pytest.raises(reference.types.SpecViolation, match=r"out_dtype=\[torch.bfloat16\] is invalid"):
        native.gemm(a, b, out_dtype=[torch.bfloat16])
    with pytest.raises(ValueError, match=r"method=\['auto'\] is invalid"):
        native.gemm(a, b, method=["auto"])


# ---- a plan launches what quantize_2d launches ----------------------------------------------------------------


def _geometry(grid, block) -> tuple:
    return (*launch_mod._dims(grid), *launch_mod._dims(block), 0)


def _role(t, x2d, fields, named=None) -> str:
    if t is x2d:
        return "x"
    for role, v in (named or {}).items():  # a per-call tensor of the caller (a given amax, the state's history)
        if t is v:
            return role
    for name, v in fields.items():  # the field itself, or another view of exactly its memory
        if v is not None and (v.data_ptr(), v.shape, v.dtype) == (t.data_ptr(), t.shape, t.dtype):
            return name
    return f"internal:{t.dtype}"


def _today(calls, x2d, fields, named=None) -> list[tuple]:
    """(kernel, geometry, slots) of recorded launches, every tensor slot replaced by its role (`named`: role ->
    a caller's tensor passed by identity)."""
    out = []
    for name, geometry, args in calls:
        template = [Patched(_role(a, x2d, fields, named), a.dtype) if isinstance(a, torch.Tensor) else a for a in args]
        slots, patched = signature(name).prepare(template)
        for i, m in patched:
            slots[i] = m.role
        out.append((name, geometry, slots))
    return out


def _planned(plan, named_scalars) -> list[tuple]:
    """(kernel, geometry, slots) of a plan's steps, pointers as roles, per-call scalars filled in."""
    out = []
    for step in plan.steps:
        pl = step.launch
        slots = list(pl.fixed)
        for i, m in pl.patched:
            if m.role in named_scalars:
                slots[i] = named_scalars[m.role]
            elif m.role.startswith("_") or m.role == "scale_in":
                slots[i] = f"internal:{m.dtype}"
            else:
                slots[i] = m.role
        out.append((pl.name, pl.geometry, slots))
    return out


def _check_bound_steps(plan, monkeypatch) -> None:
    """Every step bound to a block (`Step.bind`, the out= path) launches the bytes the step itself writes for the
    same base and per-call values, with the same kernel and geometry, and writes only the per-call slots."""
    fired, kinds = [], []
    monkeypatch.setattr(launch_mod, "launch_kernel", lambda: lambda *a: (fired.append(a), kinds.append("plain")))
    monkeypatch.setattr(launch_mod, "programmatic_launch", lambda: lambda config, fn, stream, params: (
        fired.append((fn, *config.geometry, stream, params, 0)), kinds.append("programmatic")))  # fmt: skip
    base = 0x7E00_0000_0000
    for step in plan.steps:
        n = len(step.launch.fixed)
        roles = [s for s in step.sources if type(s) is not int]
        named = {role: 0x7F00_0000_0000 + 0x100 * j for j, role in enumerate(roles)}
        bound = step.bind(base)
        for values in (named, {r: v + 0x40 for r, v in named.items()}):  # a second call: new per-call values
            fired.clear()
            kinds.clear()
            bound(None, values, 77)
            (fn, *geometry, stream, pointers, extra), = fired
            assert kinds == ["programmatic" if step.launch.programmatic else "plain"], step.launch.name
            assert (fn, tuple(geometry), stream, extra) == (step.launch._fn, step.launch.geometry, 77, 0)
            assert read_slots(pointers, n) == read_slots(step.launch.params(step.values(base, values)), n)
        assert len(bound.named) == len(roles)


def _block_fields(plan, monkeypatch) -> dict:
    _cpu_memset(monkeypatch)
    return {k: v for k, v in plan.block.allocate(torch.device("cpu"), 0)[1].items() if not k.startswith("_")}


def _same_fields(planned: dict, today: dict) -> None:
    today = {k: v for k, v in today.items() if v is not None}
    assert sorted(planned) == sorted(today)
    for k, v in today.items():
        assert (tuple(planned[k].shape), planned[k].dtype) == (tuple(v.shape), v.dtype), k


FP8_CASES = [
    (QuantConfig("fp8_current"), {}), (QuantConfig("fp8_current"), {"given": True}),
    (QuantConfig("fp8_current", pow2_scales=True, eps=2.0**-20), {}), (QuantConfig("fp8_delayed"), {"state": True}),
    (QuantConfig("mxfp8"), {}), (QuantConfig("mxfp8", element="e5m2"), {}), (QuantConfig("fp8_block"), {}),
    (QuantConfig("fp8_block", tile=(128, 128)), {}),
]  # fmt: skip
COPIES = [(True, False), (False, True), (True, True)]


@pytest.mark.parametrize("config, extra", FP8_CASES, ids=lambda v: getattr(v, "id", str(v)))
@pytest.mark.parametrize("rowwise, colwise", COPIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(64, 128), (40, 72)])
def test_fp8_plans_launch_what_quantize_2d_launches(monkeypatch, config, extra, rowwise, colwise, dtype, shape):
    if config.scheme == "mxfp8" and shape[0] % 32:
        pytest.skip("mxfp8 has no partial blocks")
    mod = {"fp8_current": per_tensor, "fp8_delayed": per_tensor, "mxfp8": mxfp8, "fp8_block": fp8_block}[config.scheme]
    calls = []
    monkeypatch.setattr(mod, "module_for", lambda *a: "module")
    monkeypatch.setattr(mod, "device_index", lambda dev: 0)
    monkeypatch.setattr(mod, "launch", lambda m, name, grid, block, args, index: calls.append(
        (name, _geometry(grid, block), args)))
    monkeypatch.setattr(launch_mod, "function", lambda *a: 0)
    monkeypatch.setattr(mod, "programmatic_supported", lambda index: True)  # (device 0: any GPU or none)
    if mod is per_tensor:
        monkeypatch.setattr(per_tensor, "grid_stride_blocks", lambda n, t, i: max(1, min(-(-n // t), 132 * 32)))
    m, k = shape
    own_amax = config.scheme == "fp8_current" and not extra.get("given")
    clearable = config.scheme == "fp8_delayed" or own_amax  # (a large X: the slots cleared by fill_given)
    # (fp8_current's own amax: below per_tensor.CLEAR_LAUNCH_MIN_X_BYTES, set to one byte more than the test's X)
    monkeypatch.setattr(per_tensor, "CLEAR_LAUNCH_MIN_X_BYTES", m * k * dtype.itemsize + 1)
    for offset in (0, 2):  # a 16-byte aligned input, and one that is not (the vector-width flags)
        calls.clear()
        x2d = torch.randn(m * k + 8).to(dtype)[offset:offset + m * k].view(m, k)
        aligned = x2d.data_ptr() % 16 == 0
        kw = {}
        if extra.get("given"):
            kw["amax"] = torch.tensor([2.5])
        if extra.get("state"):
            kw["state"] = AmaxHistory(config)
        fields = mod.quantize_2d(x2d, config, rowwise=rowwise, colwise=colwise, **kw)
        plan = mod.plan_quantize(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=aligned,
                                 given="amax" in kw, index=0)  # fmt: skip
        # The caller's given amax and the state's history reach the cast kernel as they are (no copy).
        named = {"given": kw.get("amax"), "history": kw["state"].history if "state" in kw else None}
        assert _planned(plan, {}) == _today(calls, x2d, fields, named)
        _same_fields(_block_fields(plan, monkeypatch), fields)
        _check_bound_steps(plan, monkeypatch)
        # Programmatic: fp8_current's cast after its own amax kernel (fp8_per_tensor.cu: X is complete when it
        # starts, and it waits for the amax), and the one launch of mxfp8 and fp8_block (their kernels wait for the
        # grid before it first); the per-tensor casts that are a call's first launch are ordinary ones (they read X
        # before they wait).
        names = [step.launch.name for step in plan.steps]
        one_launch = config.scheme in ("mxfp8", "fp8_block")
        cast = [f"per_tensor_cast_{per_tensor.SUFFIX[dtype]}"] if own_amax else names if one_launch else []
        assert [step.launch.name for step in plan.steps if step.launch.programmatic] == cast
        assert not plan.clears and not getattr(plan, "clear_launch", False)
        monkeypatch.setattr(mod, "programmatic_supported", lambda index: False)  # a device before sm_90: none
        old = mod.plan_quantize(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=aligned,
                                given="amax" in kw, index=0)  # fmt: skip
        assert _planned(old, {}) == _planned(plan, {}) and not any(s.launch.programmatic for s in old.steps)
        monkeypatch.setattr(mod, "programmatic_supported", lambda index: True)
    if clearable:
        _check_per_tensor_clear_launch(monkeypatch, config, rowwise, colwise, dtype, m, k)


def _clearing_fill(plan, first, rowwise: bool, colwise: bool) -> int:
    """`first` (a planned step) is fill_given with no given amax and no slots: the clearing alone of the block's
    zeroed words, at its grid; no copy's codes lie in those words. Returns their count."""
    name, geometry, slots = first
    n_words = -(-plan.block.zero_bytes // 4)
    assert (name, slots) == ("fill_given", [0, 0, 0, "internal:torch.int32", n_words])
    assert geometry == _geometry(-(-n_words // 256), 256)
    assert all(plan.block.offsets[f"{o}_data"] >= 4 * n_words for o, on in (("rowwise", rowwise), ("colwise", colwise))
               if on)  # fmt: skip
    return n_words


def _check_per_tensor_clear_launch(monkeypatch, config, rowwise, colwise, dtype, m, k) -> None:
    """An own-amax fp8_current or an fp8_delayed plan for an X at per_tensor.CLEAR_LAUNCH_MIN_X_BYTES: first, ONE
    programmatic launch (fill_given, no given amax) clears exactly the scalar slots (the amax kernel's atomicMax
    target, the delayed cast's amax and CTA counter) in place of the block's memset; then the small-X plan's kernels
    (the amax kernel and the cast, or the cast), every one programmatic. A device before sm_90: the same launches,
    none programmatic."""
    monkeypatch.setattr(per_tensor, "CLEAR_LAUNCH_MIN_X_BYTES", m * k * dtype.itemsize)
    small = None
    sfx = per_tensor.SUFFIX[dtype]
    kernels = [f"per_tensor_cast_{sfx}"] if config.scheme == "fp8_delayed" else [f"tensor_amax_{sfx}",
                                                                                  f"per_tensor_cast_{sfx}"]  # fmt: skip
    for pdl in (True, False):
        monkeypatch.setattr(per_tensor, "programmatic_supported", lambda index, pdl=pdl: pdl)
        plan = per_tensor.plan_quantize(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=True,
                                        given=False, index=0)  # fmt: skip
        assert plan.clear_launch and plan.clears
        planned = _planned(plan, {})
        n_words = _clearing_fill(plan, planned[0], rowwise, colwise)
        assert plan.block.offsets["slots"] == 0 and n_words == 5 * per_tensor.SCALAR_SLOT  # exactly the scalar slots
        assert [n for n, *_ in planned[1:]] == kernels
        assert [step.launch.programmatic for step in plan.steps] == [pdl] * (1 + len(kernels))
        _check_bound_steps(plan, monkeypatch)
        if small is None:
            small = planned
        assert planned == small
    monkeypatch.setattr(per_tensor, "CLEAR_LAUNCH_MIN_X_BYTES", m * k * dtype.itemsize + 1)
    plan = per_tensor.plan_quantize(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=True, given=False,
                                    index=0)  # fmt: skip
    assert _planned(plan, {}) == small[1:] and not plan.clears  # the memset's plan: the same kernels, no fill


NVFP4_CASES = [
    QuantConfig("nvfp4"), QuantConfig("nvfp4", tile=(16, 16)), QuantConfig("nvfp4", rht=True),
    QuantConfig("nvfp4", stochastic=True), QuantConfig("nvfp4", rht=True, stochastic=True),
    QuantConfig("nvfp4", tile=(16, 16), stochastic=True), QuantConfig("nvfp4", variant="4over6"),
    QuantConfig("nvfp4", tile=(16, 16), variant="4over6"), QuantConfig("nvfp4", variant="row_scaled"),
]  # fmt: skip


def _variants_available():
    out = list(NVFP4_CASES)
    try:
        out.append(QuantConfig("nvfp4", variant="row_scaled_4over6"))
    except ValueError:
        pass
    return out


@pytest.mark.parametrize("config", _variants_available(), ids=lambda c: c.id)
@pytest.mark.parametrize("rowwise, colwise", COPIES)
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("large", [False, True], ids=["small-x", "large-x"])
def test_nvfp4_plans_launch_what_quantize_with_launches(monkeypatch, config, rowwise, colwise, given, dtype, large):
    """(large: X at per_tensor.CLEAR_LAUNCH_MIN_X_BYTES, set to the test's X, where an own-amax plan clears by a
    launch.)"""
    if config.rht and dtype != torch.bfloat16:
        pytest.skip("RHT needs bfloat16 (reference.spec)")
    if given and (config.rht or config.row_scaled):
        pytest.skip("no given amax with RHT or row-scaled (reference.spec.check_given_amax)")
    if colwise and config.variant == "row_scaled_4over6":
        pytest.skip("row-scaled 4over6 has no columnwise copy (reference.spec.copies_rule)")
    monkeypatch.setattr(nvfp4, "module_for", lambda *a: "module")
    monkeypatch.setattr(per_tensor, "module_for", lambda *a: "module")
    monkeypatch.setattr(per_tensor, "grid_stride_blocks", lambda n, t, i: max(1, min(-(-n // t), 132 * 32)))
    monkeypatch.setattr(launch_mod, "function", lambda *a: 0)
    for mod in (nvfp4, per_tensor):  # (device 0 may be any GPU, or none)
        monkeypatch.setattr(mod, "programmatic_supported", lambda index: True)
    calls = []

    def record(name, n_units, args, max_blocks=nvfp4.MAX_BLOCKS, units_per_block=nvfp4.THREADS):
        if n_units > 0:  # as CupyLauncher
            calls.append((name, _geometry(min(-(-n_units // units_per_block), max_blocks), nvfp4.THREADS), args))

    m, k = 64, 160
    monkeypatch.setattr(per_tensor, "CLEAR_LAUNCH_MIN_X_BYTES", m * k * dtype.itemsize + (0 if large else 1))
    x2d = torch.randn(m, k).to(dtype)
    seed = SRSeed(0xDEAD_BEEF_1234, 0xFFFF_FFFF) if config.stochastic else None
    amax = torch.tensor([3.0]) if given else None
    if config.variant is not None:
        fields = nvfp4.quantize_variant_with(record, x2d, config, rowwise=rowwise, colwise=colwise, given=amax)
    else:
        fields = nvfp4.quantize_with(record, x2d, config, rowwise=rowwise, colwise=colwise, seed=seed, given=amax)
    plan = nvfp4.plan_quantize(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=True, given=given,
                               index=0)  # fmt: skip
    named = {}
    if seed is not None:  # NUMERICS: §5.7 the colwise stream is stream + 1 (mod 2^32)
        named = {"seed": seed.seed, "row_stream": seed.stream, "col_stream": (seed.stream + 1) & 0xFFFFFFFF}
    planned = _planned(plan, named)
    clear_launch = not given and config.variant is None and large
    assert plan.clear_launch == clear_launch
    if clear_launch:  # first, ONE launch clears the A_g slots and the tile counter
        first, *planned = planned
        _clearing_fill(plan, first, rowwise, colwise)
        assert plan.clears
        # The cleared words are exactly both A_g slots (the amax kernel's atomicMax targets) and the tile counter.
        a_g = plan.block.offsets
        assert {n for n in ("_bits", "_drawn") if a_g[n] < plan.block.zero_bytes} == {"_bits", "_drawn"}
    elif given:  # NUMERICS: §5.1 - first, ONE launch puts the given amax in both A_g slots and clears the tile counter
        (name, geometry, slots), *planned = planned
        a_g = plan.block.offsets
        slot0, slot1 = ("rowwise_amax" if rowwise else "internal:torch.float32",
                        "colwise_amax" if colwise else "internal:torch.float32")  # fmt: skip
        n_words = -(-plan.block.zero_bytes // 4)
        block = "internal:torch.int32" if n_words else 0  # (a null pointer: nothing to clear)
        assert (name, slots) == ("fill_given", ["given", slot0, slot1, block, n_words])
        assert geometry == _geometry(-(-max(n_words, 1) // 256), 256) and plan.clears
        # The cleared words are exactly the quantize kernel's tile counter, never an A_g slot or a scale: every NVFP4
        # quantize kernel zeroes its scales' padding itself (§5.9), the variant kernels have no counter.
        zero = set() if config.variant else {"_drawn"}
        assert 4 * n_words <= min(a_g["_bits"], *(a_g[s] for s in plan._given_slots))
        assert (n_words == 0) == (not zero) and all(a_g[n] < plan.block.zero_bytes for n in zero)
        assert all(a_g[f"{o}_scale"] >= plan.block.zero_bytes for o, on in (("rowwise", rowwise), ("colwise", colwise))
                   if on)  # fmt: skip
    else:
        assert not plan.clears
    assert planned == _today(calls, x2d, fields)
    _same_fields(_block_fields(plan, monkeypatch), fields)
    _check_bound_steps(plan, monkeypatch)
    # Programmatic launches (native/launch.py): fill_given, which waits for the grid before it first, always the
    # call's first launch; the amax kernel right after it, and the tiled quantize kernel right after one of them
    # (nvfp4.cu, fp8_per_tensor.cu: X is complete when they start, and they wait before they touch what the kernel
    # before writes). Every other kernel (the variants', the scales' padding) is an ordinary launch.
    names = [step.launch.name for step in plan.steps]
    quantize = [n for n in names if n.startswith("nvfp4_quantize_") and not n.startswith("nvfp4_quantize_rows")]
    amax = [n for n in names if n in ("nvfp4_rht_amax", f"nvfp4_amax_{nvfp4._SUFFIX[dtype]}")] if clear_launch else []
    fill = ["fill_given"] if given or clear_launch else []
    assert [step.launch.name for step in plan.steps if step.launch.programmatic] == fill + amax + quantize
    assert not fill or names[0] == "fill_given"
    for i, step in enumerate(plan.steps):
        if step.launch.programmatic and step.launch.name != "fill_given":
            assert i > 0 and names[i - 1] in ("fill_given", "nvfp4_rht_amax", f"nvfp4_amax_{nvfp4._SUFFIX[dtype]}")
            assert step.launch.name in quantize or names[i - 1] == "fill_given"  # an amax kernel: right after the fill
    # A device before sm_90 (no griddepcontrol): the same launches, none programmatic.
    for mod in (nvfp4, per_tensor):
        monkeypatch.setattr(mod, "programmatic_supported", lambda index: False)
    old = nvfp4.plan_quantize(config, m, k, dtype, rowwise=rowwise, colwise=colwise, aligned=True, given=given,
                              index=0)  # fmt: skip
    assert _planned(old, named) == _planned(plan, named) and not any(s.launch.programmatic for s in old.steps)


def test_every_launcher_module_plans_its_quantize():
    from native.launchers import MODULES, launcher

    for scheme in MODULES:
        mod = launcher(scheme)
        assert callable(mod.plan_quantize) and issubclass(mod.QuantizePlan, plan_mod.QuantizePlan), scheme


def _fake_portable_launches(monkeypatch, g) -> list:
    """native.gemm's portable launches recorded on the CPU (no module, device 0, stream 55): the list of fired
    argument tuples."""
    monkeypatch.setattr(g, "_portable_module", lambda *a: None)
    monkeypatch.setattr(g, "device_index", lambda dev: 0)
    monkeypatch.setattr(g, "current_device", lambda: 0)
    monkeypatch.setattr(g, "raw_stream", lambda index: 55)
    fired: list = []
    monkeypatch.setattr(launch_mod, "launch_kernel", lambda: lambda *args: fired.append(args))
    return fired


def _portable_operands(cfgs, with_bias_c: bool, c_dtype: torch.dtype):
    """native.gemm and quantized 64x128 / 32x128 operands of `cfgs` with their rowwise views (+ bias and C)."""
    import reference

    g = sys.modules["native.gemm"]
    scheme, a_kw, b_kw = cfgs
    a = reference.quantize(torch.randn(64, 128), QuantConfig(scheme, **a_kw))
    b = reference.quantize(torch.randn(32, 128), QuantConfig(scheme, **b_kw))
    av, bv = g.operand_view(a, "rowwise", "a"), g.operand_view(b, "rowwise", "b")
    bias = torch.ones(32) if with_bias_c else None
    c = torch.ones(64, 32, dtype=c_dtype) if with_bias_c else None
    return g, a, b, av, bv, bias, c


@pytest.mark.parametrize("with_bias_c", [False, True])
@pytest.mark.parametrize("cfgs", [("fp8_current", {}, {}), ("nvfp4", {}, {}), ("mxfp8", {}, {}),
                                  ("fp8_block", {}, {"tile": (128, 128)})], ids=lambda c: c[0])  # fmt: skip
def test_portable_gemm_plan_launches_what_portable_launches(monkeypatch, cfgs, with_bias_c):
    """The portable GEMM's prepared launch holds _portable's arguments: every scalar slot, each pointer's role."""
    g, a, b, av, bv, bias, c = _portable_operands(cfgs, with_bias_c, torch.bfloat16)
    monkeypatch.setattr(g, "_portable_module", lambda *a: None)
    prepared = g._prepare_portable(av, bv, torch.bfloat16, bias, c, 0)
    assert prepared.geometry == (1, 1, 1, 16, 16, 1, 0)  # (ceil(32 / 64), ceil(64 / 64)) tiles of 16x16 threads
    ptrs = {"a_data": 0x1000, "a_scale": 0x2000, "b_data": 0x3000, "b_scale": 0x4000, "amax_a": 0x5000,
            "amax_b": 0x6000, "bias": 0x7000, "c": 0x8000, "out": 0x9000}  # fmt: skip
    got = read_slots(prepared.params([ptrs[m.role] for _, m in prepared.patched]), 23)

    def t(role, dtype, present=True):
        return fake_cuda(dtype, ptrs[role]) if present else None

    args = g._portable_args(av, bv, t("a_data", torch.uint8), t("a_scale", av.scale.dtype), t("b_data", torch.uint8),
                            t("b_scale", bv.scale.dtype), t("amax_a", torch.float32, av.amax is not None),
                            t("amax_b", torch.float32, bv.amax is not None), t("bias", torch.float32, with_bias_c),
                            t("c", torch.float32, with_bias_c), t("out", torch.bfloat16), torch.bfloat16)  # fmt: skip
    assert got == signature("block_scaled_gemm").slots(args)


def test_cublaslt_sets_a_pointer_attribute_only_when_it_changes():
    """A cuBLASLt descriptor keeps its attributes: a call whose scale pointer equals the last one set skips the set."""
    import types

    from native import cublaslt

    calls = []

    def setter(obj, attr, address, size):
        calls.append((obj, attr, ctypes.c_uint64.from_address(address).value, size))

    lt = types.SimpleNamespace(matmul_desc_set_attribute=setter, get_matmul_desc_attribute_dtype=lambda attr: np.uint64)
    plan = cublaslt._Plan(desc=7, layouts=(1, 2, 3), heur=None)
    for value in (0x1000, 0x1000, 0x2000, 0x2000, 0x1000):
        cublaslt._set_pointer(lt, plan, "A_SCALE_POINTER", value)
    cublaslt._set_pointer(lt, plan, "B_SCALE_POINTER", 0x1000)
    assert calls == [(7, "A_SCALE_POINTER", 0x1000, 8), (7, "A_SCALE_POINTER", 0x2000, 8),
                     (7, "A_SCALE_POINTER", 0x1000, 8), (7, "B_SCALE_POINTER", 0x1000, 8)]  # fmt: skip


def test_a_one_launch_plan_allocates_then_launches_its_step_with_x_on_the_plans_stream(monkeypatch):
    """native.plan.QuantizePlan._outputs with OneLaunchPlan._run (the mxfp8 and fp8_block plans): a fresh call
    allocates the block and launches steps[0] once with x's pointer on raw_stream(index), its Outputs holding the
    block's base and views; an unaligned block (allocate -> None) means the full path; a call into earlier
    Outputs allocates nothing, clears the zero-filled bytes of ITS block and launches with ITS base."""
    from native import plan

    calls = []

    class Block:
        public = None

        def __init__(self, got, zero_bytes=0):
            self.got, self.zero_bytes = got, zero_bytes

        def allocate(self, device, index, clear=True):
            calls.append(("allocate", device, index) + (() if clear else ("no clear",)))
            return self.got

    class FakeStep:
        def __init__(self, bound=None):
            self.bound = bound

        def bind(self, base):
            calls.append(("bind", base))
            return FakeStep(bound=base)

        def __call__(self, base, named, stream):
            calls.append(("launch", base, named, stream) if self.bound is None else ("bound", self.bound, named, stream))

    class FakePlan(plan.OneLaunchPlan):
        index = 3
        steps = (FakeStep(),)

    monkeypatch.setattr(plan, "raw_stream", lambda index: 1000 + index)
    monkeypatch.setattr(plan, "memset_zero", lambda ptr, n, index: calls.append(("memset", ptr, n, index)))
    x = torch.zeros(4, 8)
    named = {plan.X: x.data_ptr()}
    p = FakePlan()
    p.block = Block((4096, {"rowwise_data": "fields"}), zero_bytes=512)
    got = p._outputs(x, None, None, None, None)
    assert (got.plan, got.base, got.fields, got.public()) == (p, 4096, {"rowwise_data": "fields"}, {"rowwise_data": "fields"})
    # (the fresh block's zero-filled bytes are cleared by allocate itself: test_output_block_layout_and_views)
    assert calls == [("allocate", x.device, 3), ("launch", 4096, named, 1003)]
    calls[:] = []
    assert p._outputs(x, None, None, None, got) is got  # the steps bound to the block once, then launched
    assert calls == [("bind", 4096), ("memset", 4096, 512, 3), ("bound", 4096, named, 1003)]
    calls[:] = []
    assert p._outputs(x, None, None, None, got) is got
    assert calls == [("memset", 4096, 512, 3), ("bound", 4096, named, 1003)]
    p.block, calls[:] = Block(None), []
    assert p._outputs(x, None, None, None, None) is None and calls == [("allocate", x.device, 3)]
    calls[:] = []
    assert p._outputs(x, None, None, None, got) is got  # zero_bytes 0: no memset
    assert calls == [("bound", 4096, named, 1003)]


# ---- out=: the in-place call ----------------------------------------------------------------------------------


class _RecordingPlan:
    """A stand-in plan: records run(x2d, seed, given, state, into) (what quantize passes per call)."""

    def __init__(self, public=None):
        self.calls = []
        self.block = mock.Mock(public=public)
        self.steps = ()

    def run(self, x2d, seed, given, state, into=None):
        self.calls.append((x2d, seed, given, state, into))
        return into


def _stamped(x, config, plan, **kwargs):
    """A QuantizedTensor as a planned call of (x, config, kwargs) returns it: its fields views of a block, stamped."""
    q_mod = sys.modules["native.quantize"]
    fields = {"rowwise_data": torch.zeros(64, 128, dtype=torch.uint8), "rowwise_scale": torch.zeros(64, 8)}
    q = q_mod.QuantizedTensor(config=config, shape=tuple(x.shape), hp_dtype="bfloat16", **fields)
    args = dict(rowwise=True, colwise=False, rng=None, state=None, amax=None) | kwargs
    key = q_mod._plan_key(x, config, *args.values())
    setattr(q, plan_mod.STAMP, plan_mod.Outputs(plan, 0x7F00_1000_0000, fields, key))
    return q


def test_out_runs_the_stamped_plan_into_its_outputs_with_the_per_call_values():
    import native

    cfg = QuantConfig("nvfp4", stochastic=True)
    x = _fake_cuda_input()
    plan = _RecordingPlan()
    q = _stamped(x, cfg, plan, rng=(1, 2))
    got = getattr(q, plan_mod.STAMP)
    for rng in [(5, 6), SRSeed(7, 8)]:  # the seed of each call, coerced as the planned path coerces it
        assert native.quantize(x, cfg, rng=rng, out=q) is q
        assert plan.calls[-1] == (x, SRSeed.coerce(rng), None, None, got)
    x_other = _fake_cuda_input(ptr=0x7F00_0000_0100)  # another tensor of the same signature: its pointer is read
    assert native.quantize(x_other, cfg, rng=(1, 2), out=q) is q and plan.calls[-1][0] is x_other
    # The per-call checks of the planned path still run: an SR seed out of range is refused before any launch.
    n = len(plan.calls)
    with pytest.raises(ValueError):
        native.quantize(x, cfg, rng=(-1, 0), out=q)
    assert len(plan.calls) == n


def test_out_passes_a_given_amax_and_the_state_per_call():
    import native

    cfg = QuantConfig("fp8_current")
    x = _fake_cuda_input()
    plan = _RecordingPlan()
    q = _stamped(x, cfg, plan, amax=torch.ones(1))
    for v in (2.0, 3.5):
        native.quantize(x, cfg, amax=torch.tensor([v]), out=q)
        assert float(plan.calls[-1][2]) == v
    delayed = QuantConfig("fp8_delayed")
    plan_d = _RecordingPlan()
    state = AmaxHistory(delayed)
    q_d = _stamped(x, delayed, plan_d, state=state)
    other = AmaxHistory(delayed)
    native.quantize(x, delayed, state=other, out=q_d)
    assert plan_d.calls[-1][3] is other


def test_out_refuses_what_no_plan_allocated_or_another_signature_did():
    import native
    import reference

    cfg = QuantConfig("mxfp8")
    x = _fake_cuda_input()
    plan = _RecordingPlan()
    q = _stamped(x, cfg, plan)
    with pytest.raises(ValueError, match="got Tensor"):
        native.quantize(x, cfg, out=torch.zeros(4))
    fresh = reference.quantize(torch.randn(64, 128), cfg)  # a QuantizedTensor no plan allocated
    with pytest.raises(ValueError, match="no call plan allocated"):
        native.quantize(x, cfg, out=fresh)
    cases = [
        (dict(x=_fake_cuda_input((64, 256))), r"x\.shape is torch.Size\(\[64, 256\]\) here, torch.Size\(\[64, 128\]\)"),
        (dict(x=_fake_cuda_input(dtype=torch.float32)), r"x\.dtype is torch.float32 here, torch.bfloat16 for out"),
        (dict(config=QuantConfig("mxfp8", element="e5m2")), r"config is .* here, .* for out"),
        (dict(config=QuantConfig("fp8_block")), r"config is"),
        (dict(colwise=True), r"colwise is True here, False for out"),
        (dict(x=_fake_cuda_input(ptr=0x7F00_0000_0008)), r"16-byte aligned .* is False here, True for out"),
        (dict(x=_fake_cuda_input(contiguous=False)), r"is_contiguous\(\) is False here, True for out"),
    ]
    for kwargs, message in cases:
        args = dict(x=x, config=cfg, colwise=False) | kwargs
        with pytest.raises(ValueError, match=message):
            native.quantize(args["x"], args["config"], colwise=args["colwise"], out=q)
    with pytest.raises(ValueError, match="another call signature: rng is None is False here, True for out"):
        native.quantize(x, cfg, rng=(1, 2), out=q)
    # A field replaced after the call: its memory is no longer what the plan writes.
    q.rowwise_scale = torch.zeros(64, 8)
    with pytest.raises(ValueError, match="out.rowwise_scale is not the tensor its call plan allocated"):
        native.quantize(x, cfg, out=q)
    # Not a CUDA tensor: the full path's errors.
    with pytest.raises(reference.types.SpecViolation, match="the native backend quantizes CUDA tensors; x is on cpu"):
        native.quantize(torch.ones(64, 128), cfg, out=q)
    with pytest.raises(reference.types.SpecViolation, match="multiple of 32"):
        native.quantize(torch.ones(64, 100), cfg, out=q)
    assert plan.calls == []


def test_a_copy_of_a_stamped_tensor_is_no_plans_output():
    import copy
    import pickle

    x = _fake_cuda_input()
    q = _stamped(x, QuantConfig("mxfp8"), _RecordingPlan())
    assert getattr(copy.copy(q), plan_mod.STAMP) is getattr(q, plan_mod.STAMP)  # the same tensors
    assert getattr(copy.deepcopy(q), plan_mod.STAMP) is None
    assert getattr(pickle.loads(pickle.dumps(q)), plan_mod.STAMP) is None


# ---- the fp8_delayed per-call work of a plan ------------------------------------------------------------------


def _cast_slots(plan, base: int, named: dict) -> dict:
    """The cast step's argument of each per_tensor_cast parameter (by name) for a block at `base`."""
    step = plan.steps[-1]
    assert step.launch.name.startswith("per_tensor_cast_")
    fixed = read_slots(step.launch.params(step.values(base, named)), len(step.launch.fixed))
    return dict(zip([p.name for p in signature(step.launch.name).params], fixed, strict=True))


@pytest.mark.parametrize("rowwise, colwise", COPIES)
def test_a_delayed_plan_has_the_cast_record_h0_and_the_colwise_amax_and_sinv(monkeypatch, rowwise, colwise):
    """per_tensor.QuantizePlan for fp8_delayed: ONE launch per call and nothing after it. The cast reads the state's
    scale, accumulates the amax into the amax field, and its last CTA (counted in a zeroed internal slot) records
    H[0] <- fmax(H[0], amax) in the state's own fp32 history (its data_ptr, per call; docs/numerics.md §2) and
    writes the colwise copy's own amax / sinv (separate memory, equal values)."""
    cfg = QuantConfig("fp8_delayed")
    _fake_per_tensor_launches(monkeypatch)
    monkeypatch.setattr(per_tensor, "record", mock.Mock(side_effect=AssertionError("record() after the launch")))
    plan = per_tensor.plan_quantize(cfg, 32, 64, torch.bfloat16, rowwise=rowwise, colwise=colwise, aligned=True,
                                    given=False, index=0)  # fmt: skip
    assert len(plan.steps) == 1
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    base, fields = plan.block.allocate(x.device, 0)
    seen = []
    out = mock.Mock(base=base, fields=fields, steps=(lambda b, named, stream: seen.append(dict(named)),))
    for _ in range(2):  # a new state (history, scale) per call: both read per call
        state = AmaxHistory(cfg)
        state.scale = torch.tensor([4.0])
        plan._run(x, None, None, state, out)
        named = seen.pop()
        assert named == {plan_mod.X: x.data_ptr(), "scale_in": state.scale.data_ptr(),
                         "history": state.history.data_ptr()}  # fmt: skip
        args = _cast_slots(plan, base, named)
        off = plan.block.offsets
        o = "rowwise" if rowwise else "colwise"
        assert (args["amax_in"], args["scale"], args["history"]) == (0, state.scale.data_ptr(), state.history.data_ptr())
        assert (args["amax_acc"], args["sinv"]) == (fields[f"{o}_amax"].data_ptr(), fields[f"{o}_scale"].data_ptr())
        assert args["done"] == base + off["_done"] and off["_done"] not in {
            v.data_ptr() - base for v in fields.values()}  # fmt: skip
        assert off["_done"] < plan.block.zero_bytes  # cleared with the amax before every call
        assert args["amax_store"] == 0
        if rowwise and colwise:
            assert (args["amax_copy"], args["sinv_copy"]) == (fields["colwise_amax"].data_ptr(),
                                                               fields["colwise_scale"].data_ptr())  # fmt: skip
            assert len({args["amax_acc"], args["amax_copy"], args["sinv"], args["sinv_copy"]}) == 4
        else:
            assert (args["amax_copy"], args["sinv_copy"]) == (0, 0)  # one copy: nothing to copy on
    # The state's checks hold on every call (a config equal to the plan's is remembered, never a different one).
    for _ in range(2):
        plan._run(x, None, None, AmaxHistory(QuantConfig("fp8_delayed")), out)
    for bad, match in ((AmaxHistory(QuantConfig("fp8_delayed", margin=1)), "was built for"),
                       (mock.Mock(config=cfg), "must be a reference.per_tensor.AmaxHistory")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            plan._run(x, None, None, bad, out)
    with pytest.raises(ValueError, match="a given amax is for fp8_current"):
        plan._run(x, None, torch.tensor([1.0]), AmaxHistory(cfg), out)


def test_a_delayed_plan_records_a_history_the_kernel_cannot_after_the_launch(monkeypatch):
    """A history that is not fp32 on the cast's device (here fp64): the cast gets a null history and record() runs
    after the launch, H[0] <- fmax(H[0], amax) on the state's own tensor (NaN in H[0] ignored, docs/numerics.md
    §2 / §0.1)."""
    cfg = QuantConfig("fp8_delayed")
    _fake_per_tensor_launches(monkeypatch)
    plan = per_tensor.plan_quantize(cfg, 32, 64, torch.bfloat16, rowwise=True, colwise=True, aligned=True,
                                    given=False, index=0)  # fmt: skip
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    base, fields = plan.block.allocate(x.device, 0)
    x_amax, events = [0.0], []

    def kernel(b, named, stream):  # what the cast writes into the amax field
        events.append(("launch", named["history"]))
        ctypes.c_float.from_address(b + plan.block.offsets[plan.amax]).value = x_amax[0]

    out = mock.Mock(base=base, fields=fields, steps=(kernel,))
    state = AmaxHistory(cfg)
    state.history = state.history.to(torch.float64)
    for amax, h0_before, h0_after in ((3.0, 0.0, 3.0), (2.0, 3.0, 3.0), (5.0, float("nan"), 5.0)):
        state.history[0], x_amax[0] = h0_before, amax
        plan._run(x, None, None, state, out)
        assert events.pop() == ("launch", 0) and float(state.history[0]) == h0_after
        assert state.history.dtype == torch.float64


@pytest.mark.parametrize("rowwise, colwise", COPIES)
def test_an_fp8_current_plan_has_the_cast_read_the_given_amax_itself(monkeypatch, rowwise, colwise):
    """fp8_current with a given amax (TE's quantize_with_amax, docs/numerics.md §1): no copy and no amax pass - the
    cast's amax_in is the caller's tensor (per call) and the cast stores it in the result's amax (amax_store) and,
    with both copies, in the colwise amax; never an alias of the caller's tensor."""
    cfg = QuantConfig("fp8_current")
    _fake_per_tensor_launches(monkeypatch)
    plan = per_tensor.plan_quantize(cfg, 32, 64, torch.bfloat16, rowwise=rowwise, colwise=colwise, aligned=True,
                                    given=True, index=0)  # fmt: skip
    assert [s.launch.name for s in plan.steps] == ["per_tensor_cast_bf16"]
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    base, fields = plan.block.allocate(x.device, 0)
    seen = []
    out = mock.Mock(base=base, fields=fields, steps=(lambda b, named, stream: seen.append(dict(named)),))
    o = "rowwise" if rowwise else "colwise"
    for value in (2.5, float("inf"), 0.0):
        given = torch.tensor([value])
        plan._run(x, None, given, None, out)
        named = seen.pop()
        assert named == {plan_mod.X: x.data_ptr(), "given": given.data_ptr()}
        args = _cast_slots(plan, base, named)
        assert args["amax_in"] == given.data_ptr() and args["amax_store"] == fields[f"{o}_amax"].data_ptr()
        assert (args["amax_acc"], args["history"], args["done"]) == (0, 0, 0)
        assert args["amax_copy"] == (fields["colwise_amax"].data_ptr() if rowwise and colwise else 0)
        assert given.data_ptr() not in {v.data_ptr() for v in fields.values()}
    with pytest.raises(ValueError, match="state is only for fp8_delayed"):
        plan._run(x, None, torch.tensor([1.0]), AmaxHistory(QuantConfig("fp8_delayed")), out)


# ---- the planned GEMM calls -----------------------------------------------------------------------------------


@pytest.mark.parametrize("with_bias_c", [False, True])
@pytest.mark.parametrize("cfgs", [("fp8_current", {}, {}), ("nvfp4", {}, {}), ("mxfp8", {}, {}),
                                  ("fp8_block", {}, {"tile": (128, 128)})], ids=lambda c: c[0])  # fmt: skip
def test_a_planned_portable_gemm_launches_what_portable_launches(monkeypatch, cfgs, with_bias_c):
    """GemmPlan.run's portable call (no operand views built): one launch of the prepared kernel with the bytes of
    _portable's arguments for these operands and its fresh output, on the plan's stream; fresh outputs per call."""
    g, a, b, av, bv, bias, c = _portable_operands(cfgs, with_bias_c, torch.float32)
    fired = _fake_portable_launches(monkeypatch, g)
    plan = g.GemmPlan(av, bv, "portable", torch.bfloat16, bias, c)
    assert plan.matmul is None and plan.portable is not None
    outs = []
    for _ in range(2):
        out = plan.run(a, b, torch.bfloat16, bias, c)
        assert out.shape == (64, 32) and out.stride() == (32, 1) and out.dtype == torch.bfloat16
        (_, *geometry, stream, pointers, _), = fired
        fired.clear()
        assert tuple(geometry) == plan.portable.geometry and stream == 55

        def t(tensor, dtype=None):
            return None if tensor is None else fake_cuda(dtype or tensor.dtype, tensor.data_ptr())

        args = g._portable_args(av, bv, t(a.rowwise_data), t(a.rowwise_scale), t(b.rowwise_data), t(b.rowwise_scale),
                                t(a.rowwise_amax), t(b.rowwise_amax), t(bias), t(c), t(out), torch.bfloat16)  # fmt: skip
        assert read_slots(pointers, 23) == signature("block_scaled_gemm").slots(args)
        outs.append(out)
    assert outs[0].data_ptr() != outs[1].data_ptr()
    # A non-contiguous consumed copy takes the general path (its view copies it): _portable's launch.
    a.rowwise_data = a.rowwise_data.t().contiguous().t()
    monkeypatch.setattr(g, "_portable", lambda *args, **kw: "general path")
    assert plan.run(a, b, torch.bfloat16, bias, c) == "general path" and fired == []


class _FakeLt:
    """The calls scaled_matmul / PreparedMatmul make to nvmath's cuBLASLt binding, recorded."""

    class cuBLASLtError(Exception):  # noqa: N801 - the binding's name
        pass

    MatmulDescAttribute = mock.Mock(A_SCALE_POINTER="A_SCALE_POINTER", B_SCALE_POINTER="B_SCALE_POINTER",
                                    BIAS_POINTER="BIAS_POINTER")  # fmt: skip

    def __init__(self):
        self.calls = []

    def get_matmul_desc_attribute_dtype(self, attr):
        return np.uint64

    def matmul_desc_set_attribute(self, desc, attr, address, size):
        self.calls.append(("set", desc, attr, ctypes.c_uint64.from_address(address).value, size))

    def matmul(self, handle, desc, alpha, a, lay_a, b, lay_b, beta, c, lay_c, d, lay_d, algo, ws, ws_size, stream):
        self.calls.append(("matmul", handle, desc, ctypes.c_float.from_address(alpha).value, a, lay_a, b, lay_b,
                           ctypes.c_float.from_address(beta).value, c, lay_c, d, lay_d, algo, ws, ws_size, stream))  # fmt: skip


def test_a_prepared_matmul_makes_the_calls_of_scaled_matmul(monkeypatch):
    """cublaslt.PreparedMatmul (a planned per-tensor / blockwise GEMM): the descriptor set of scaled_matmul's key,
    the same scale-pointer sets (skipped when unchanged, shared memo) and the same cublasLtMatmul arguments."""
    from native import cublaslt

    fake = _FakeLt()
    keys = []
    desc = cublaslt._Plan(desc=7, layouts=(21, 22, 23), heur=mock.Mock(ptr=0xA160))

    def plan(lt, key, *args):
        keys.append(key)
        return desc

    monkeypatch.setattr(cublaslt, "_lt", lambda: fake)
    monkeypatch.setattr(cublaslt, "_plan", plan)
    monkeypatch.setattr(cublaslt, "_handle", lambda device: 0x4A)
    monkeypatch.setattr(cublaslt, "_workspace", lambda device: mock.Mock(data_ptr=lambda: 0x3000))
    monkeypatch.setattr(cublaslt, "raw_stream", lambda device: 99)
    la = cublaslt.LtOperand(fake_cuda(torch.uint8, 0x1000), "e4m3", 64, True, 128, fake_cuda(torch.float32, 0x1100),
                            "SCALAR_32F")  # fmt: skip
    lb = cublaslt.LtOperand(fake_cuda(torch.uint8, 0x2000), "e4m3", 32, True, 128, fake_cuda(torch.float32, 0x2100),
                            "SCALAR_32F")  # fmt: skip
    out = mock.Mock(shape=(64, 32), dtype=torch.bfloat16, device=torch.device("cuda", 0))
    out.is_contiguous.return_value = True
    out.data_ptr.return_value = 0x9000
    cublaslt.scaled_matmul(la, lb, 128, out, alpha=1.0, fast_accum=True)
    full = list(fake.calls)
    prepared = cublaslt.PreparedMatmul(la, lb, 128, torch.bfloat16, alpha=1.0, fast_accum=True, device=0)
    assert keys[0] == keys[1]  # the same cached descriptor set
    desc.pointers.clear()
    fake.calls.clear()
    prepared(0x1000, 0x1100, 0x2000, 0x2100, 0x9000, 99)
    assert fake.calls == full and [c[2] for c in full if c[0] == "set"] == ["A_SCALE_POINTER", "B_SCALE_POINTER"]
    assert full[-1] == ("matmul", 0x4A, 7, 1.0, 0x2000, 21, 0x1000, 22, 0.0, 0x9000, 23, 0x9000, 23, 0xA160, 0x3000,
                        cublaslt.WORKSPACE_BYTES, 99)  # fmt: skip
    fake.calls.clear()  # the same scales again: no attribute set; a new b scale: only A_SCALE (b's) is set
    prepared(0x1800, 0x1100, 0x2800, 0x2100, 0x9800, 99)
    prepared(0x1800, 0x1100, 0x2800, 0x2200, 0x9800, 99)
    assert [c[0] for c in fake.calls] == ["matmul", "set", "matmul"] and fake.calls[1][2:4] == ("A_SCALE_POINTER", 0x2200)
    fake.calls.clear()  # scaled_matmul shares the memo: it sets b's scale back, not a's
    cublaslt.scaled_matmul(la, lb, 128, out, alpha=1.0, fast_accum=True)
    assert [c[2:4] for c in fake.calls if c[0] == "set"] == [("A_SCALE_POINTER", 0x2100)]


def test_a_gemm_plan_prepares_a_matmul_only_for_stored_fp32_scales(monkeypatch):
    """_prepare_matmul: per-tensor and blockwise FP8 on cuBLASLt without bias / C get a PreparedMatmul; the portable
    method, MXFP8 / NVFP4 (swizzled scales, a computed alpha), a bias or C get none (the general path)."""
    import native.cublaslt  # (imported here: native.gemm imports it lazily, and no earlier test may have run)
    import reference

    g = sys.modules["native.gemm"]
    made = []
    monkeypatch.setattr(native.cublaslt, "PreparedMatmul", lambda *a, **kw: made.append(kw) or "prepared")

    def views(scheme, **kw):
        a = reference.quantize(torch.randn(64, 128), QuantConfig(scheme, **kw))
        b = reference.quantize(torch.randn(32, 128), QuantConfig(scheme, **kw))
        return g.operand_view(a, "rowwise", "a"), g.operand_view(b, "rowwise", "b")

    av, bv = views("fp8_current")
    assert g._prepare_matmul(av, bv, "cublaslt_fast_accum", torch.bfloat16, None, None, 0) == "prepared"
    assert made[-1] == {"alpha": 1.0, "fast_accum": True, "device": 0}
    assert g._prepare_matmul(*views("fp8_block"), "cublaslt", torch.float32, None, None, 0) == "prepared"
    assert made[-1] == {"alpha": 1.0, "fast_accum": False, "device": 0}
    assert g._prepare_matmul(av, bv, "portable", torch.bfloat16, None, None, 0) is None
    assert g._prepare_matmul(av, bv, "cublaslt", torch.bfloat16, torch.ones(32), None, 0) is None
    assert g._prepare_matmul(av, bv, "cublaslt", torch.bfloat16, None, torch.ones(64, 32), 0) is None
    monkeypatch.setattr(sys.modules["native.swizzle"], "swizzled", lambda scale, *a, **kw: scale.clone())
    assert g._prepare_matmul(*views("mxfp8"), "cublaslt", torch.bfloat16, None, None, 0) is None
    assert g._prepare_matmul(*views("nvfp4"), "cublaslt", torch.bfloat16, None, None, 0) is None
    assert len(made) == 2


@pytest.mark.parametrize("rowwise, colwise", COPIES)
@pytest.mark.parametrize("config", [QuantConfig("nvfp4"), QuantConfig("nvfp4", variant="4over6")], ids=lambda c: c.id)
def test_a_given_amax_reaches_both_a_g_slots_by_one_launch_that_leaves_the_scales(monkeypatch, config, rowwise,
                                                                                  colwise):
    """An NVFP4 plan's given amax (TE's quantize_with_amax, docs/numerics.md §5.1): no cudaMemcpyAsync and no
    memset; its first step, fill_given, gets the caller's pointer (per call) and the block's A_g slots and zero
    words. Emulating that kernel on the host from the step's own slots (fresh block and out=): both A_g slots hold
    the given value bit for bit, the scales are not cleared (the quantize kernels write every scale byte, padding
    included), the kernels after it read the slots."""
    monkeypatch.setattr(nvfp4, "module_for", lambda *a: "module")
    monkeypatch.setattr(per_tensor, "module_for", lambda *a: "module")
    monkeypatch.setattr(per_tensor, "grid_stride_blocks", lambda n, t, i: 1)
    monkeypatch.setattr(launch_mod, "function", lambda *a: 0)
    monkeypatch.setattr(nvfp4, "raw_stream", lambda index: 0)
    monkeypatch.setattr(plan_mod, "current_device", lambda: 0)
    _cpu_memset(monkeypatch)
    monkeypatch.setattr(plan_mod, "memset_zero", mock.Mock(side_effect=AssertionError("a memset")))
    plan = nvfp4.plan_quantize(config, 32, 64, torch.bfloat16, rowwise=rowwise, colwise=colwise, aligned=True,
                               given=True, index=0)  # fmt: skip
    fill, *rest = plan.steps
    assert fill.launch.name == "fill_given"
    names = [p.name for p in signature("fill_given").params]
    events = []

    def launch_kernel(fn, *geometry_stream_params):  # the launches, fill_given emulated on the host from its slots
        *geometry, stream, pointers, _ = geometry_stream_params
        if tuple(geometry) != fill.launch.geometry or events:
            events.append("launch")
            return
        args = dict(zip(names, read_slots(pointers, 5), strict=True))
        events.append("fill")
        value = ctypes.c_uint32.from_address(args["given"]).value
        for slot in ("slot0", "slot1"):
            ctypes.c_uint32.from_address(args[slot]).value = value
        if args["n_words"]:
            ctypes.memset(args["zero"], 0, 4 * args["n_words"])

    monkeypatch.setattr(launch_mod, "launch_kernel", lambda: launch_kernel)
    monkeypatch.setattr(launch_mod, "programmatic_launch", lambda: lambda config, fn, stream, params: launch_kernel(
        fn, *config.geometry, stream, params, 0))  # (the quantize kernel's)  # fmt: skip
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    got = None
    for value in (2.5, float("inf"), 0.0, 2.0**127 * 1.5):
        events.clear()
        got = plan.run(x, None, torch.tensor([value]), None, into=got)
        assert events == ["fill"] + ["launch"] * len(rest)
        bits = (ctypes.c_float * 2).from_address(got.base + plan.block.offsets["_bits"])
        assert list(bits) == [value, value]
        for o in [c for c, on in (("rowwise", rowwise), ("colwise", colwise)) if on]:
            assert float(got.fields[f"{o}_amax"]) == value, o
            if value != 2.5:  # out=: the previous call's scales (no kernel runs here) are still there, not cleared
                assert got.fields[f"{o}_scale"].unique().tolist() == [7], o
            got.fields[f"{o}_scale"].fill_(7)
    # Every NVFP4 quantize kernel writes every scale byte, padding included: the fill clears at most the tile counter.
    assert plan.block.zero_bytes <= (0 if config.variant is not None else 4)


def test_given_on_moves_a_given_amax_only_when_it_is_elsewhere():
    here = torch.tensor([1.5])
    assert plan_mod.given_on(here, here.device) is here
    elsewhere = mock.Mock(device=torch.device("cuda", 1))
    elsewhere.to.return_value = "moved"
    assert plan_mod.given_on(elsewhere, torch.device("cuda", 0)) == "moved"
    elsewhere.to.assert_called_once_with(device=torch.device("cuda", 0))


# ---- GEMM: the identity memo of the last planned call, out= --------------------------------------------------


class _RecordingGemmPlan:
    """A GEMM plan that records its calls (the consumed fields of a TN call)."""

    consumed = (("rowwise_data", "rowwise_scale", "rowwise_amax"),) * 2

    def __init__(self):
        self.calls = []

    def run(self, a, b, out_dtype, bias, c, out=None):
        self.calls.append((a, b, out_dtype, bias, c, out))
        return "result"


def test_a_gemm_call_with_the_last_planned_calls_objects_builds_no_key(monkeypatch):
    """native.gemm's _Recent: a call with exactly the objects of the last planned call (operands, their consumed
    tensors, config, shape, input dtype, bias, C; equal layout, out_dtype, method) runs that plan without building
    the key; any of them replaced, a referenced object dead or the cache cleared sends the call back to the key."""
    import gc
    import weakref

    import reference

    g = sys.modules["native.gemm"]
    plan_mod.clear_plans()
    cfg = QuantConfig("fp8_current")
    a, b = reference.quantize(torch.randn(64, 128), cfg), reference.quantize(torch.randn(32, 128), cfg)
    bias = torch.ones(32)
    plan = _RecordingGemmPlan()
    keys = []
    real_key = g._plan_key

    def counting_key(*args):
        keys.append(None)  # (counted, not kept: the operands must be free to die)
        return real_key(*args)

    monkeypatch.setattr(g, "_plan_key", counting_key)

    def put(*args):
        plan_mod.GEMM_PLANS.put(real_key(*args), plan)

    put(a, b, "TN", torch.bfloat16, bias, None, "auto")
    for i in range(3):  # the first call finds the plan by its key; the next ones by the memo
        assert g.gemm(a, b, bias=bias) == "result" and len(plan.calls) == i + 1 and len(keys) == 1
    assert plan.calls[-1] == (a, b, torch.bfloat16, bias, None, None)
    out = torch.empty(64, 32, dtype=torch.bfloat16)
    g.gemm(a, b, bias=bias, out=out)
    assert plan.calls[-1][5] is out and len(keys) == 1

    def misses(call, *, planned=True) -> None:
        n_keys, n_calls = len(keys), len(plan.calls)
        try:
            call()
        except Exception:  # (no plan for that key: the full path, which needs a GPU here)
            assert not planned
        assert len(keys) == n_keys + 1, "the memo must not match"
        assert len(plan.calls) == n_calls + planned

    misses(lambda: g.gemm(a, b, bias=torch.ones(32)))  # another bias object (an equal key: the same plan)
    misses(lambda: g.gemm(a, b, bias=bias))  # (the key finds the plan again and re-arms the memo)
    misses(lambda: g.gemm(a, b, bias=bias, out_dtype=torch.float32), planned=False)
    misses(lambda: g.gemm(a, b, bias=bias, method="portable"), planned=False)
    misses(lambda: g.gemm(a, b, bias=bias, layout="NN"), planned=False)
    assert g._RECENT[0] is None  # a call that does not match drops the memo (it lets go of its tensors)
    n_keys = len(keys)
    g.gemm(a, b, bias=bias)
    assert len(keys) == n_keys + 1 and g._RECENT[0] is not None
    for field, value in (("rowwise_data", a.rowwise_data.clone()), ("rowwise_scale", a.rowwise_scale.clone()),
                         ("rowwise_amax", a.rowwise_amax.clone()), ("shape", tuple(list(a.shape))),
                         ("config", QuantConfig("fp8_current"))):  # fmt: skip
        setattr(a, field, value)  # equal, but another object: the key (equal) finds the plan, the memo does not
        misses(lambda: g.gemm(a, b, bias=bias))
        g.gemm(a, b, bias=bias)
    n_keys = len(keys)
    b.rowwise_amax = b.rowwise_amax.clone()
    misses(lambda: g.gemm(a, b, bias=bias))
    assert len(keys) == n_keys + 1
    # A dead referenced object: its weak reference reads None, as an absent bias would - never a match.
    bias2 = torch.ones(32)
    put(a, b, "TN", torch.bfloat16, bias2, None, "auto")
    g.gemm(a, b, bias=bias2)
    g.gemm(a, b, bias=bias2)  # (memo armed for bias2)
    del bias2
    gc.collect()
    misses(lambda: g.gemm(a, b), planned=False)  # bias=None: no plan without a bias here, so the full path
    # The memo keeps no operand alive: a dead operand frees the memo's hold on its tensors.
    a2, b2 = reference.quantize(torch.randn(64, 128), cfg), reference.quantize(torch.randn(32, 128), cfg)
    g.gemm(a2, b2, bias=bias)
    recent, alive = g._RECENT[0], weakref.ref(a2.rowwise_data)
    assert recent.same(a2, b2, "TN", torch.bfloat16, bias, None, "auto")
    plan.calls.clear()  # (the recording plan's references)
    del a2
    gc.collect()
    assert recent.fields == () and recent.generation == -1 and alive() is None
    # A cleared cache invalidates the memo.
    g.gemm(a, b, bias=bias)
    n_keys = len(keys)
    plan_mod.clear_plans()
    with pytest.raises(Exception):  # noqa: B017 - the full path (no GPU here): what matters is the key
        g.gemm(a, b, bias=bias)
    assert len(keys) == n_keys + 1
    plan_mod.clear_plans()


@pytest.mark.parametrize("cfgs", [("fp8_current", {}, {}), ("nvfp4", {}, {})], ids=lambda c: c[0])
def test_a_planned_gemm_writes_into_out_or_refuses_it(monkeypatch, cfgs):
    """GemmPlan.run(..., out=): the portable launch's out pointer is the caller's tensor, which comes back (no
    allocation); the prepared cuBLASLt matmul's too; a tensor of another shape / dtype / device, a non-contiguous
    one or a non-tensor raises ValueError naming what differs."""
    g, a, b, av, bv, bias, c = _portable_operands(cfgs, False, torch.float32)
    fired = _fake_portable_launches(monkeypatch, g)
    bads = ((torch.zeros(64, 33, dtype=torch.bfloat16), r"shape is \(64, 33\), expected \(64, 32\)"),
            (torch.zeros(64, 32), "dtype is torch.float32, expected torch.bfloat16"),
            (torch.zeros(32, 64, dtype=torch.bfloat16).t(), "contiguous is False"),
            (torch.zeros(64, 32, dtype=torch.bfloat16, device="meta"), "device is meta"),
            ("out", "takes a torch.Tensor, got str"))  # fmt: skip
    outs = [torch.zeros(64, 32, dtype=torch.bfloat16) for _ in range(3)]
    for alloc in ("empty", "empty_like"):
        monkeypatch.setattr(torch, alloc, mock.Mock(side_effect=AssertionError("allocated")))
    plan = g.GemmPlan(av, bv, "portable", torch.bfloat16, None, None)
    out_slot = [p.name for p in signature("block_scaled_gemm").params].index("out")
    for out in outs[:2]:
        assert plan.run(a, b, torch.bfloat16, None, None, out) is out
        (*_, pointers, _), = fired
        fired.clear()
        assert read_slots(pointers, len(plan.portable.fixed))[out_slot] == out.data_ptr()
    for bad, match in bads:
        with pytest.raises(ValueError, match=match):
            plan.run(a, b, torch.bfloat16, None, None, bad)
    assert fired == []
    made = []
    plan.matmul = lambda *args: made.append(args)
    out = outs[2]
    assert plan.run(a, b, torch.bfloat16, None, None, out) is out
    assert made == [(a.rowwise_data.data_ptr(), a.rowwise_scale.data_ptr(), b.rowwise_data.data_ptr(),
                     b.rowwise_scale.data_ptr(), out.data_ptr(), 55)]  # fmt: skip
