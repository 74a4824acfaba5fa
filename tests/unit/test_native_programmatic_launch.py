"""native.launch's programmatic launch (cuLaunchKernelEx with programmatic stream serialization), on the CPU: the
ctypes structures against cuda.h's layout, and the config one call hands the driver.

Source: native/launch.py (programmatic_launch), docs/design.md §4.1; CUDA driver API cuLaunchKernelEx,
CUlaunchConfig, CUlaunchAttribute (cuda.h). The device behaviour (a planned NVFP4 call right after the kernel that
writes X) is tests/gpu/test_native_plan.py.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

import native.launch as launch_mod

from .host_build import build_host_program

# Hand-checked from cuda.h (CUDA 12.x / 13.x): the attribute's id, 4 bytes of padding, its 64-byte value union;
# the config's seven unsigned ints, then (8-byte aligned) the stream, the attributes and their count.
LAYOUT = {"attribute_size": 72, "attribute_value_offset": 8, "config_size": 56, "config_block_offset": 12,
          "config_shared_mem_offset": 24, "config_stream_offset": 32, "config_attrs_offset": 40,
          "config_num_attrs_offset": 48, "programmatic_stream_serialization": 6}  # fmt: skip


def _ctypes_layout() -> dict[str, int]:
    a, c = launch_mod.LaunchAttribute, launch_mod.LaunchConfig
    return {"attribute_size": ctypes.sizeof(a), "attribute_value_offset": a.value.offset,
            "config_size": ctypes.sizeof(c), "config_block_offset": c.block.offset,
            "config_shared_mem_offset": c.shared_mem.offset, "config_stream_offset": c.stream.offset,
            "config_attrs_offset": c.attrs.offset, "config_num_attrs_offset": c.num_attrs.offset,
            "programmatic_stream_serialization": launch_mod.PROGRAMMATIC_STREAM_SERIALIZATION}  # fmt: skip


def test_the_ctypes_structures_have_the_hand_checked_layout():
    assert _ctypes_layout() == LAYOUT


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_ctypes_structures_have_cuda_h_layout(tmp_path):
    exe = build_host_program("launch_config.cpp", tmp_path / "launch_config", {})
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    header = {name: int(value) for name, value in (line.split() for line in out.splitlines())}
    assert header == _ctypes_layout()


class _FakeDriver:
    """libcuda with a cuLaunchKernelEx that records what the config holds at the call and returns `result`."""

    def __init__(self, result: int = 0):
        self.calls: list[dict] = []
        self.result = result

        def ex(config_ref, fn, params, extra):
            c = config_ref._obj
            attr = c.attrs[0]
            self.calls.append({"grid": tuple(c.grid), "block": tuple(c.block), "shared_mem": c.shared_mem,
                               "stream": c.stream, "attrs": [(attr.id, attr.value)], "num_attrs": c.num_attrs,
                               "fn": fn, "params": params, "extra": extra})  # fmt: skip
            return self.result

        self.cuLaunchKernelEx = ex


@pytest.fixture
def fake_driver(monkeypatch):
    driver = _FakeDriver()
    launch_mod.programmatic_launch.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: driver if name == "libcuda.so.1" else pytest.fail(name))
    yield driver
    launch_mod.programmatic_launch.cache_clear()


def test_a_programmatic_launch_hands_the_driver_its_geometry_stream_and_the_attribute(fake_driver):
    launch = launch_mod.programmatic_launch()
    launch(launch_mod.ProgrammaticConfig((396, 1, 1, 256, 1, 1, 0)), 0xF00, 0x5A, 0x7000)
    launch(launch_mod.ProgrammaticConfig((7, 2, 3, 64, 2, 1, 1024)), 0xF01, 0x5B, 0x7100)
    assert fake_driver.calls == [
        {"grid": (396, 1, 1), "block": (256, 1, 1), "shared_mem": 0, "stream": 0x5A, "attrs": [(6, 1)], "num_attrs": 1,
         "fn": 0xF00, "params": 0x7000, "extra": None},
        {"grid": (7, 2, 3), "block": (64, 2, 1), "shared_mem": 1024, "stream": 0x5B, "attrs": [(6, 1)],
         "num_attrs": 1, "fn": 0xF01, "params": 0x7100, "extra": None},
    ]  # fmt: skip


def test_a_failed_programmatic_launch_raises_with_its_cuda_result(fake_driver):
    fake_driver.result = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="CUresult 1"):
        launch_mod.programmatic_launch()(launch_mod.ProgrammaticConfig((1, 1, 1, 32, 1, 1, 0)), 0xF00, 0, 0x7000)


def _recording(monkeypatch) -> list:
    """Launches recorded as (kind, function, grid x y z, block x y z, shared memory, stream), either launcher."""
    fired: list = []
    monkeypatch.setattr(launch_mod, "launch_kernel", lambda: lambda fn, *a: fired.append(("plain", fn, *a[:8])))
    monkeypatch.setattr(launch_mod, "programmatic_launch", lambda: lambda config, fn, stream, params: fired.append(
        ("programmatic", fn, *config.geometry, stream)))  # fmt: skip
    return fired


def test_a_prepared_launch_fires_programmatically_only_when_asked(monkeypatch):
    fired = _recording(monkeypatch)
    args = [None, 0, 0, None, None]  # nvfp4_amax_bf16: x, m_rows, k_cols, out, out2
    for programmatic in (False, True):
        fired.clear()
        pl = launch_mod.PreparedLaunch(None, "nvfp4_amax_bf16", 3, 256, args, 0, fn=0xF00, programmatic=programmatic)
        pl([], 0x5A)
        pl([], 0x5C)  # (a second call: the same thread's config, another stream)
        bound = launch_mod.BoundLaunch(pl, {}, [])
        bound(0, {}, 0x5B)
        kind = "programmatic" if programmatic else "plain"
        assert fired == [(kind, 0xF00, 3, 1, 1, 256, 1, 1, 0, s) for s in (0x5A, 0x5C, 0x5B)]


@pytest.mark.parametrize("capability, expected", [((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)])
def test_programmatic_launches_need_compute_capability_9(monkeypatch, capability, expected):
    """PTX griddepcontrol and programmatic stream serialization are sm_90 on: an older device launches the ordinary
    way (its kernels' waits compile to nothing); without a device the answer is True (the CPU tests of the plans)."""
    import torch

    launch_mod.programmatic_supported.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    try:
        assert launch_mod.programmatic_supported(0) is expected
        assert launch_mod.programmatic_supported(None) is True
    finally:
        launch_mod.programmatic_supported.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launch_mod.programmatic_supported(0) is True
    launch_mod.programmatic_supported.cache_clear()
