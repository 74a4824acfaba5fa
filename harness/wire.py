"""Messages between the judge and a backend process: a JSON header and raw tensor bytes, nothing executable.

Source: docs/design.md §9 (threat model). A backend's process is untrusted, so what it sends back is read as
data only: a JSON header (numbers, strings, lists, dicts, and tagged records for tensors, dtypes, tuples and the
contract's dataclasses) followed by the bytes of each tensor. The judge rebuilds plain `torch.Tensor`s from those
bytes and the contract's own types (`QuantizedTensor`, `QuantConfig`, `AmaxHistory`, the `reference.linear`
results) through their constructors; any other object the backend returned arrives as `{"$bad": "<what it
was>"}`, which the judge turns into an error row. The trusted direction (judge to backend process) may carry
pickled objects (cases, module specs) with `trusted=True`; the judge never decodes with `trusted=True`.

Frame: 8-byte little-endian header length, the header (UTF-8 JSON), then every buffer's bytes in order (their
lengths are listed in the header).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import socket
import struct
from typing import Any

import torch

from reference.formats import QuantConfig
from reference.linear import GemmInfo, ModuleRun, ModuleState, StepResult
from reference.per_tensor import AmaxHistory
from reference.types import QuantizedTensor, SRSeed

_LEN = struct.Struct("<Q")
# The largest header accepted from a backend process (its tensors' bytes are bounded by the caller's limit).
MAX_HEADER_BYTES = 64 << 20
# The contract's dataclasses a backend may return, rebuilt by name through their constructors.
DATACLASSES = {c.__name__: c for c in (QuantizedTensor, QuantConfig, SRSeed, StepResult, GemmInfo, ModuleRun,
                                       ModuleState)}
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class WireError(ValueError):
    """A message that is not a well-formed frame of this protocol (a backend process wrote garbage)."""


def describe(v: Any) -> str:
    """What an object is, in one phrase, for an error row: `numpy.ndarray (128, 32) float32`, `NoneType`."""
    kind = f"{type(v).__module__}.{type(v).__qualname__}".removeprefix("builtins.")
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    try:
        extra = (f" {tuple(shape)}" if shape is not None else "") + (f" {dtype}" if dtype is not None else "")
    except Exception:  # noqa: BLE001 - a hostile object's attributes may raise
        extra = ""
    return (kind + extra)[:200]


def _plain_bytes(t: torch.Tensor) -> tuple[torch.Tensor, bytes]:
    """A tensor's values as a plain CPU tensor and its bytes (a subclass's own view of its values)."""
    with torch._C.DisableTorchFunctionSubclass():
        plain = t.detach().to("cpu").contiguous()
    if type(plain) is not torch.Tensor:
        plain = torch.Tensor._make_subclass(torch.Tensor, plain)
    flat = plain.reshape(-1)
    raw = flat.view(torch.uint8) if flat.element_size() > 0 and flat.numel() else flat
    return plain, raw.numpy().tobytes() if raw.numel() else b""


class _Encoder:
    def __init__(self, trusted: bool):
        self.trusted = trusted
        self.buffers: list[bytes] = []

    def __call__(self, v: Any) -> Any:  # noqa: PLR0911 - one arm per kind of value
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return float(v)
        if isinstance(v, torch.dtype):
            return {"$dtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"$device": str(v)}
        if isinstance(v, torch.Tensor):
            device = str(v.device)
            plain, data = _plain_bytes(v)
            self.buffers.append(data)
            return {"$tensor": len(self.buffers) - 1, "dtype": str(plain.dtype).removeprefix("torch."),
                    "shape": list(plain.shape), "device": device, "nbytes": len(data)}
        if isinstance(v, AmaxHistory):
            return {"$amax_history": {"config": self(v.config), "scale": self(v.scale), "history": self(v.history)}}
        if dataclasses.is_dataclass(v) and not isinstance(v, type) and type(v).__name__ in DATACLASSES \
                and DATACLASSES[type(v).__name__] is type(v):
            return {"$dc": type(v).__name__,
                    "f": {f.name: self(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}}
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return {"$tuple": [self(x) for x in v]}
        if isinstance(v, list):
            return [self(x) for x in v]
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {"$dict": {k: self(x) for k, x in v.items()}}
        if self.trusted:
            return {"$pickle": pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL).hex()}
        return {"$bad": describe(v)}


def encode(obj: Any, *, trusted: bool = False) -> tuple[bytes, list[bytes]]:
    """(header, buffers) of `obj`; `trusted` lets other objects through as pickles (the judge's requests only)."""
    enc = _Encoder(trusted)
    body = enc(obj)
    header = json.dumps({"body": body, "sizes": [len(b) for b in enc.buffers]}, allow_nan=True).encode()
    return header, enc.buffers


class Bad:
    """An object a backend returned that the contract has no type for (`describe`d in the backend's process)."""

    def __init__(self, what: str):
        self.what = str(what)[:200]

    def __repr__(self) -> str:
        return self.what


class _Decoder:
    def __init__(self, buffers: list[bytearray], trusted: bool):
        self.buffers, self.trusted = buffers, trusted

    def __call__(self, v: Any) -> Any:  # noqa: PLR0911
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [self(x) for x in v]
        if not isinstance(v, dict) or len(v) == 0:
            raise WireError(f"unexpected value {str(v)[:80]!r}")
        if "$tensor" in v:
            return self._tensor(v)
        (tag, x), = list(v.items())[:1] if len(v) == 1 else [(None, None)]
        if tag == "$dtype":
            if x not in _DTYPES:
                raise WireError(f"unknown dtype {str(x)[:40]!r}")
            return _DTYPES[x]
        if tag == "$device":
            return torch.device(str(x))
        if tag == "$tuple":
            return tuple(self(y) for y in _list(x))
        if tag == "$dict":
            if not isinstance(x, dict):
                raise WireError("$dict is not an object")
            return {str(k): self(y) for k, y in x.items()}
        if tag == "$bad":
            return Bad(str(x))
        if tag == "$amax_history":
            h = AmaxHistory(self(x["config"]), "cpu")
            h.scale, h.history = self(x["scale"]), self(x["history"])
            return h
        if tag == "$pickle":
            if not self.trusted:
                raise WireError("a pickled object from an untrusted process")
            return pickle.loads(bytes.fromhex(x))
        if "$dc" in v:
            cls = DATACLASSES.get(v["$dc"])
            if cls is None or not isinstance(v.get("f"), dict):
                raise WireError(f"unknown record {str(v.get('$dc'))[:40]!r}")
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            unknown = set(v["f"]) - names
            if unknown:
                raise WireError(f"{cls.__name__} has no field {sorted(unknown)[0][:40]!r}")
            try:
                return cls(**{k: self(y) for k, y in v["f"].items()})
            except (TypeError, ValueError) as e:
                raise WireError(f"{cls.__name__}: {e}") from None
        raise WireError(f"unknown tag {str(next(iter(v)))[:40]!r}")

    def _tensor(self, v: dict) -> torch.Tensor:
        i, dtype, shape = v["$tensor"], _DTYPES.get(v.get("dtype")), v.get("shape")
        if not isinstance(i, int) or not 0 <= i < len(self.buffers) or dtype is None or not isinstance(shape, list) \
                or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise WireError(f"malformed tensor record {str(v)[:80]!r}")
        buf = self.buffers[i]
        n = 1
        for s in shape:
            n *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(buf) != n * itemsize:
            raise WireError(f"tensor of shape {shape} {dtype} needs {n * itemsize} bytes, got {len(buf)}")
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def _list(x: Any) -> list:
    if not isinstance(x, list):
        raise WireError("expected a list")
    return x


def decode(header: bytes, buffers: list[bytearray], *, trusted: bool = False) -> Any:
    try:
        body = json.loads(header.decode("utf-8", errors="strict"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise WireError(f"header is not JSON ({type(e).__name__})") from None
    try:
        return _Decoder(buffers, trusted)(body["body"])
    except WireError:
        raise
    except (KeyError, TypeError, AttributeError, RecursionError, ValueError) as e:
        raise WireError(f"malformed message ({type(e).__name__}: {str(e)[:80]})") from None


# ----------------------------------------------------------------------------------------------
# Framing over a stream socket
# ----------------------------------------------------------------------------------------------


def send(sock: socket.socket, obj: Any, *, trusted: bool = False) -> None:
    header, buffers = encode(obj, trusted=trusted)
    sock.sendall(_LEN.pack(len(header)) + header)
    for b in buffers:
        if b:
            sock.sendall(b)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the other process closed the connection")
        got += k
    return buf


def _devices(body: Any, out: list[str]) -> None:
    """The device each tensor record of a header's body names (as the sender saw it)."""
    if isinstance(body, dict):
        if "$tensor" in body:
            out.append(str(body.get("device", "")))
            return
        for v in body.values():
            _devices(v, out)
    elif isinstance(body, list):
        for v in body:
            _devices(v, out)


def recv(sock: socket.socket, *, max_bytes: int, trusted: bool = False, devices: list | None = None) -> Any:
    """One message; `max_bytes` bounds the tensors' bytes (a backend cannot make the judge allocate more), and
    `devices` (if given) receives the device each tensor was on in the sender's process.
    Raises EOFError when the peer is gone, socket.timeout past the socket's timeout, WireError for garbage."""
    (n,) = _LEN.unpack(bytes(_recv_exact(sock, _LEN.size)))
    if n > MAX_HEADER_BYTES:
        raise WireError(f"header of {n} bytes (limit {MAX_HEADER_BYTES})")
    header = bytes(_recv_exact(sock, n))
    try:
        parsed = json.loads(header)
        sizes = parsed["sizes"]
        if not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes):
            raise ValueError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        raise WireError("header has no valid buffer sizes") from None
    if sum(sizes) > max_bytes:
        raise WireError(f"message of {sum(sizes)} bytes of tensors exceeds the limit of {max_bytes}")
    buffers = [_recv_exact(sock, s) if s else bytearray() for s in sizes]
    if devices is not None:
        _devices(parsed.get("body"), devices)
    return decode(header, buffers, trusted=trusted)
