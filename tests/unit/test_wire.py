"""harness.wire: what a backend process sends is read as data only (docs/design.md §9)."""

from __future__ import annotations

import json
import pickle
import socket
import struct

import numpy as np
import pytest
import torch

import reference
from harness import wire
from reference.formats import QuantConfig
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor


def roundtrip(obj, *, trusted=False):
    header, buffers = wire.encode(obj, trusted=trusted)
    return wire.decode(header, [bytearray(b) for b in buffers], trusted=trusted)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.contiguous().view(torch.uint8).reshape(-1).numpy()) \
        == bytes(b.contiguous().view(torch.uint8).reshape(-1).numpy())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int64,
                                   torch.float8_e4m3fn, torch.float8_e5m2, torch.bool])
def test_tensors_come_back_as_plain_tensors_with_the_same_bytes(dtype):
    t = (torch.randn(5, 7) * 100).to(dtype)
    back = roundtrip({"t": t, "view": t.t(), "empty": t[:0]})
    assert type(back["t"]) is torch.Tensor and same(back["t"], t)
    assert same(back["view"], t.t().contiguous()) and back["empty"].shape == (0, 7)


def test_nan_payloads_and_negative_zero_survive():
    bits = torch.tensor([0x7FC00001, 0xFFC12345, 0x80000000], dtype=torch.int64).to(torch.int32)
    back = roundtrip(bits.view(torch.float32))
    assert torch.equal(back.view(torch.int32), bits)


def test_contract_types_are_rebuilt_through_their_constructors():
    x = torch.randn(32, 64)
    cfg = QuantConfig("mxfp8")
    q = reference.quantize(x, cfg, rowwise=True, colwise=True)
    h = AmaxHistory(QuantConfig("fp8_delayed"))
    h.history[0] = 3.5
    back = roundtrip({"q": q, "state": h, "many": [q, None], "pair": (1, 2.5)})
    assert isinstance(back["q"], QuantizedTensor) and back["q"].config == cfg and back["q"].shape == q.shape
    for name in QuantizedTensor.TENSOR_FIELDS:
        a, b = getattr(q, name), getattr(back["q"], name)
        assert (a is None and b is None) or same(a, b)
    assert isinstance(back["state"], AmaxHistory) and float(back["state"].history[0]) == 3.5
    assert back["many"][1] is None and back["pair"] == (1, 2.5)


def test_a_tensor_subclass_is_read_as_its_values():
    class Lying(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.equal:
                return True
            return super().__torch_function__(func, types, args, kwargs or {})

    t = torch.arange(6, dtype=torch.uint8).as_subclass(Lying)
    back = roundtrip(t)
    assert type(back) is torch.Tensor and back.tolist() == list(range(6))
    assert not torch.equal(back, torch.zeros(6, dtype=torch.uint8))


@pytest.mark.parametrize("value, what", [
    (np.zeros((8, 32), dtype=np.uint8), "numpy.ndarray (8, 32) uint8"),
    (object(), "object"),
    ({1: 2}, "dict"),
    (lambda: 0, "function"),
])
def test_other_objects_arrive_as_their_description(value, what):
    back = roundtrip({"q": value})["q"]
    assert isinstance(back, wire.Bad) and back.what.startswith(what)


def test_an_untrusted_reply_is_never_unpickled():
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pickle ran')",))

    header, buffers = wire.encode({"x": Boom()}, trusted=True)  # what a hostile process could send
    with pytest.raises(wire.WireError, match="pickled object from an untrusted process"):
        wire.decode(header, [bytearray(b) for b in buffers])
    forged = json.dumps({"body": {"$pickle": pickle.dumps(Boom()).hex()}, "sizes": []}).encode()
    with pytest.raises(wire.WireError):
        wire.decode(forged, [])


@pytest.mark.parametrize("body, sizes, match", [
    ({"$tensor": 0, "dtype": "float32", "shape": [4]}, [3], "needs 16 bytes, got 3"),
    ({"$tensor": 1, "dtype": "float32", "shape": [1]}, [4], "malformed tensor record"),
    ({"$tensor": 0, "dtype": "os.system", "shape": [1]}, [4], "malformed tensor record"),
    ({"$tensor": 0, "dtype": "uint8", "shape": [-1]}, [1], "malformed tensor record"),
    ({"$dc": "Popen", "f": {}}, [], "unknown record 'Popen'"),
    ({"$dc": "QuantizedTensor", "f": {"__class__": 1}}, [], "has no field '__class__'"),
    ({"$dtype": "not_a_dtype"}, [], "unknown dtype"),
    ({"$what": 1}, [], "unknown tag"),
    ({"a": 1, "b": 2}, [], "unknown tag"),
])
def test_malformed_records_are_refused_with_what_was_wrong(body, sizes, match):
    header = json.dumps({"body": body, "sizes": sizes}).encode()
    with pytest.raises(wire.WireError, match=match):
        wire.decode(header, [bytearray(n) for n in sizes])


def test_recv_bounds_the_bytes_a_reply_may_claim():
    a, b = socket.socketpair()
    with a, b:
        header = json.dumps({"body": None, "sizes": [1 << 40]}).encode()
        a.sendall(struct.pack("<Q", len(header)) + header)
        with pytest.raises(wire.WireError, match="exceeds the limit"):
            wire.recv(b, max_bytes=1 << 20)
        a.sendall(struct.pack("<Q", wire.MAX_HEADER_BYTES + 1))
        with pytest.raises(wire.WireError, match="header of"):
            wire.recv(b, max_bytes=1 << 20)


def test_send_and_recv_over_a_socket():
    a, b = socket.socketpair()
    with a, b:
        t = torch.randn(64, 64)
        wire.send(a, {"kind": "output", "values": {"out": t}, "wall_ms": 1.5})
        got = wire.recv(b, max_bytes=1 << 20)
        assert got["kind"] == "output" and got["wall_ms"] == 1.5 and same(got["values"]["out"], t)
        a.close()
        with pytest.raises(EOFError):
            wire.recv(b, max_bytes=1 << 20)
