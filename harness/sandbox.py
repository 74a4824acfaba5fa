"""Backend processes: a backend's code runs only in a process of its own, never where inputs are drawn, the
golden computed, outputs compared or the report written.

Source: docs/design.md §9 (threat model). Three kinds of process take part:
- a **zygote** (`Zygote`), forked from the judge (a sweep worker, or the command's own process) before that
  process starts CUDA or threads; it forks backend processes on request, reports their exit status, and is the
  child subreaper of everything they start: when a backend process ends, the zygote kills its process group and
  any process of it that escaped into another session, and when the judge dies (PR_SET_PDEATHSIG) it kills
  them all and exits;
- a **backend process** (`serve`), one per backend and judge: it imports the backend (`load`, bounded by the
  import timeout), answers `supports` / `prepare`, and runs the candidate calls of harness.ops on private copies
  of the inputs; every exception (BaseException included) becomes that call's error reply;
- the **judge** holds a `BackendProcess` per backend: requests go out through harness.wire (trusted, pickles
  allowed); replies come back as data only (harness.wire, no pickle), with a bound on their bytes and a
  deadline. A backend process that dies, hangs past the deadline or sends garbage is killed and replaced; its
  pair gets an error row.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from . import wire

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PID = struct.Struct("<q")
_WAIT = struct.Struct("<qq")
NO_STATUS = -(1 << 40)  # a wait that timed out
# The default of --import-timeout (seconds): importing a backend and its `prepare` (e.g. compiling every kernel a
# sweep needs) are bounded by it, apart from any case's --case-timeout.
DEFAULT_IMPORT_TIMEOUT = 600.0
# Bytes of tensors a reply may carry: the inputs' bytes times this, plus REPLY_SLACK_BYTES.
REPLY_GROWTH = 64
REPLY_SLACK_BYTES = 1 << 30
_HARNESS_DIR = Path(__file__).resolve().parent


class BackendFailed(RuntimeError):
    """A backend process could not be started or loaded (the message is one line for the user)."""


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_status(status: int) -> int:
    """A waitpid status as Popen.returncode: -signal, or the exit code."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else status


# ----------------------------------------------------------------------------------------------
# The zygote
# ----------------------------------------------------------------------------------------------


def _children(parent: int) -> list[int]:
    """The pids whose parent is `parent` (from /proc; empty without it)."""
    out = []
    with contextlib.suppress(OSError):
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{d}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                            out.append(int(d))
    return out


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _sweep(keep: set[int], rounds: int = 20) -> None:
    """Kill every child of this process (the zygote, a subreaper) but `keep`: processes a backend started that
    outlived their backend process and were handed to us. Repeats while new orphans arrive."""
    me = os.getpid()
    for _ in range(rounds):
        strays = [p for p in _children(me) if p not in keep]
        _reap()
        if not strays:
            return
        for p in strays:
            with contextlib.suppress(OSError):
                os.killpg(p, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.02)
        _reap()


def _close_fds(keep: int) -> None:
    """Close every inherited descriptor but stdio and `keep`: a backend process must hold no channel of the
    judge's (its pool's pipes, its report) to write into."""
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return NO_STATUS
        if got == pid:
            return exit_status(status)
        if time.monotonic() >= deadline:
            return NO_STATUS
        time.sleep(0.005)


def _zygote_main(sock: socket.socket, threads: int) -> None:
    """The zygote's loop: `F` fork a backend process, `W pid ms` wait for one, `K pid` kill one (its group, then
    strays). Ends, killing everything it started, when the judge closes the socket or dies."""
    live: set[int] = set()

    def shutdown(*_):
        for p in list(live):
            _kill_group(p)
        _sweep(set())
        os._exit(0)

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    while True:
        try:
            cmd = sock.recv(1)
        except InterruptedError:
            continue
        except OSError:
            cmd = b""
        if not cmd:
            shutdown()
        if cmd == b"F":
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            pid = os.fork()
            if pid == 0:  # the backend process
                try:
                    ours.close()
                    sock.close()
                    _close_fds(theirs.fileno())
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    os.setsid()  # its own session and process group, so one killpg ends what it starts
                    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
                    serve(theirs, threads)
                finally:
                    os._exit(0)
            live.add(pid)
            socket.send_fds(sock, [_PID.pack(pid)], [ours.fileno()])
            ours.close()
            theirs.close()
        elif cmd in (b"W", b"K"):
            data = b""
            while len(data) < _WAIT.size:
                more = sock.recv(_WAIT.size - len(data))
                if not more:
                    shutdown()
                data += more
            pid, ms = _WAIT.unpack(data)
            if pid not in live:
                status = NO_STATUS
            elif cmd == b"K":
                _kill_group(pid)
                status = _wait(pid, 10.0)
            else:
                status = _wait(pid, ms / 1000)
                if status != NO_STATUS:
                    _kill_group(pid)  # what it started in its group ends with it
            if status != NO_STATUS:
                live.discard(pid)
                _sweep(live)
            sock.sendall(_PID.pack(status))


class Zygote:
    """The judge's handle on its zygote (see the module docstring). Create it before this process starts CUDA
    or other threads; `spawn()` returns (pid, socket) of a new backend process."""

    def __init__(self, threads: int = 1):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _close_fds(theirs.fileno())
                _zygote_main(theirs, threads)
            finally:
                os._exit(0)
        theirs.close()
        self.pid, self.sock = pid, ours

    def spawn(self) -> tuple[int, socket.socket]:
        self.sock.sendall(b"F")
        msg, fds, _, _ = socket.recv_fds(self.sock, _PID.size, 1)
        if len(msg) != _PID.size or not fds:
            raise BackendFailed("the zygote did not start a backend process")
        return _PID.unpack(msg)[0], socket.socket(fileno=fds[0])

    def _ask(self, cmd: bytes, pid: int, ms: int = 0) -> int | None:
        self.sock.sendall(cmd + _WAIT.pack(pid, ms))
        data = b""
        while len(data) < _PID.size:
            more = self.sock.recv(_PID.size - len(data))
            if not more:
                raise BackendFailed("the zygote is gone")
            data += more
        status = _PID.unpack(data)[0]
        return None if status == NO_STATUS else status

    def wait(self, pid: int, timeout: float) -> int | None:
        """The exit status of backend process `pid` once it ends (None if it still runs after `timeout`)."""
        return self._ask(b"W", pid, int(timeout * 1000))

    def kill(self, pid: int) -> int | None:
        """Kill backend process `pid` and what it started; its exit status."""
        return self._ask(b"K", pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(ChildProcessError, OSError):
            _wait(self.pid, 10.0)


_ZYGOTE: Zygote | None = None


def zygote(threads: int | None = None) -> Zygote:
    """This process's zygote, forked on first use (call it early: before CUDA and threads start).

    `threads`: the CPU threads of its backend processes. Give more than 1 only where this process has run no
    parallel torch op yet (a sweep worker at its start): a process forked after OpenMP started its pool hangs in its
    next parallel region, so by default (a zygote of the command's process, of the pytest plugin, of a test) its
    backend processes run one thread."""
    global _ZYGOTE
    if _ZYGOTE is None or _ZYGOTE.pid == 0:
        _ZYGOTE = Zygote(threads or 1)
    return _ZYGOTE


# ----------------------------------------------------------------------------------------------
# The backend process
# ----------------------------------------------------------------------------------------------


def _where(e: BaseException) -> str:
    """` (at file.py:12)`: the innermost frame outside the harness (a backend's own line), or nothing."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not Path(f.filename).resolve().is_relative_to(
        _HARNESS_DIR)]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


class _Server:
    """The backend process's state: the loaded backend and its device."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.backend = None

    def reply(self, obj: Any) -> None:
        wire.send(self.sock, obj)

    def load(self, req: dict) -> dict:
        from . import backends as backends_mod  # noqa: PLC0415 - imported in the backend process only
        from .verdict import declared_conventions  # noqa: PLC0415

        if backends_mod.device_type(req["device"]) == "cuda":
            from .pool import yield_while_waiting  # noqa: PLC0415

            yield_while_waiting(torch.device(req["device"]).index or 0)
        # the caller's working directory and import path, as they are now (the zygote's date from its start)
        with contextlib.suppress(OSError):
            os.chdir(req["cwd"])
        sys.path[:] = [str(p) for p in req["sys_path"]]
        b = backends_mod.get_backend(req["spec"])
        self.backend = b
        return {"kind": "loaded", "name": b.name, "spec": backends_mod.backend_spec(b),
                "methods": [m for m in (*backends_mod.METHODS, "gemm_epilogue", "update_amax_history", "prepare")
                            if callable(getattr(b, m, None))],
                "conventions": list(declared_conventions(b)), "module": type(b).__module__,
                "package": getattr(b, "package", None), "package_version": getattr(b, "package_version", None)}

    def supports(self, req: dict) -> dict:
        from .backends import support  # noqa: PLC0415

        answers = []
        for case in req["cases"]:
            try:
                answers.append(list(support(self.backend, case, req["device"])))
            except SystemExit as e:
                answers.append(["error", f"{self.backend.name}.supports raised SystemExit({e.code!r})", None])
            except BaseException as e:  # noqa: BLE001 - one answer per case, the process goes on
                answers.append(["error", f"{self.backend.name}.supports raised {_text(e)}", None])
        return {"kind": "supports", "answers": answers}

    def prepare(self, req: dict) -> dict:
        line = self.backend.prepare(req["cases"], req["device"])
        return {"kind": "prepared", "line": None if line is None else str(line)}

    def call(self, req: dict) -> dict:
        from . import numerics_state  # noqa: PLC0415
        from .golden import fresh_copy, same_bits  # noqa: PLC0415
        from .ops import op_for  # noqa: PLC0415
        from .rows import exc_text  # noqa: PLC0415
        from .runner import crash_reason  # noqa: PLC0415

        b, device, case = self.backend, req["device"], req["case"]
        originals = {k: fresh_copy(v, device) for k, v in req["given"].items()}
        handed = {k: fresh_copy(v, device) for k, v in originals.items()}
        state = numerics_state.snapshot()
        try:
            out = op_for(case).candidate(case, b, device, handed, req["ctx"])
            reply = {"kind": "output", "values": out.values, "wall_ms": out.wall_ms}
        except SystemExit as e:
            reply = {"kind": "error", "reason": crash_reason(e)}
        except BaseException as e:  # noqa: BLE001 - BaseException too: only the judge decides to stop
            from reference.types import Unsupported  # noqa: PLC0415

            from .backends import skip_reason  # noqa: PLC0415

            if isinstance(e, Unsupported):
                reply = {"kind": "skip", "reason": skip_reason(b, e)}
            else:
                reply = {"kind": "error", "reason": f"{exc_text(e)}{_where(e)}"}
        finally:
            changed = numerics_state.changes(state)
            numerics_state.restore(state)
        if changed:
            # NUMERICS: §0.1 / §0.2 rule 7 - no FTZ/DAZ, no TF32: a backend changing them alters its later results.
            reply = {"kind": "error", "reason": f"{b.name} changed process-wide numerics state ("
                     + "; ".join(changed) + "); restored"}
        elif reply["kind"] == "output":
            mutated = [k for k in handed if not same_bits(handed[k], originals[k])]
            if mutated:
                reply = {"kind": "error", "reason": f"{b.name} mutated its input ({', '.join(mutated)})"}
        return reply

    def dispatch(self, req: dict) -> dict:
        cmd = req.get("cmd")
        try:
            if cmd == "load":
                return self.load(req)
            if cmd == "supports":
                return self.supports(req)
            if cmd == "prepare":
                return self.prepare(req)
            if cmd == "call":
                return self.call(req)
            return {"kind": "error", "reason": f"unknown request {cmd!r}"}
        except SystemExit as e:
            return {"kind": "error", "reason": f"{cmd}: SystemExit({e.code!r}) raised{_where(e)}"}
        except BaseException as e:  # noqa: BLE001 - every failure is an answer, never this process's end
            return {"kind": "error", "reason": f"{_text(e)}{_where(e)}", "type": type(e).__name__}


def _text(e: BaseException) -> str:
    first = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def serve(sock: socket.socket, threads: int) -> None:
    """The backend process's loop: one reply per request until the judge closes the socket."""
    torch.set_num_threads(max(1, threads))
    server = _Server(sock)
    while True:
        try:
            req = wire.recv(sock, max_bytes=1 << 62, trusted=True)
        except (EOFError, OSError):
            return
        reply = server.dispatch(req)
        dead = None
        if req.get("cmd") == "call":
            from .pool import context_dead  # noqa: PLC0415

            dead = context_dead(req["device"])
            if dead is not None:  # a dead CUDA context: answer, end, and let the judge start a fresh process
                reply["retire"] = dead
        try:
            server.reply(reply)
        except (BrokenPipeError, ConnectionResetError):
            return
        except BaseException as e:  # noqa: BLE001 - an output that cannot be read (a hostile tensor, say)
            server.reply({"kind": "error", "reason": f"its output could not be read: {_text(e)}{_where(e)}",
                          "retire": dead})
        if dead is not None:
            return


# ----------------------------------------------------------------------------------------------
# The judge's side
# ----------------------------------------------------------------------------------------------


@dataclass
class CallResult:
    """What came back from one candidate call: `kind` output | skip | error, the decoded `values` (plain
    tensors and contract types), the backend's own `wall_ms`, and a `reason` for skip / error."""

    kind: str
    values: dict = field(default_factory=dict)
    wall_ms: float | None = None
    reason: str = ""
    devices: list = field(default_factory=list)  # the device of every tensor it returned


class BackendProcess:
    """A backend as the judge sees it: a name, what it implements, and calls answered by its own process.

    `spec` is what `harness.backends.get_backend` loads there. The process starts on first use and again after
    it died, hung or misbehaved; `import_timeout` bounds its start (import and load) and `prepare`."""

    isolated = True

    def __init__(self, spec: str, device: str, *, import_timeout: float = DEFAULT_IMPORT_TIMEOUT,
                 zygote_: Zygote | None = None):
        self.spec, self.device = spec, str(device)
        self.import_timeout = float(import_timeout)
        self._zygote = zygote_
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.info: dict = {}
        self.starts = 0
        self._answers: dict = {}  # (case id, device) -> a `supports_many` answer asked ahead (`ask_ahead`)

    # -- what the runner reads ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        if not self.info:
            self.start()
        return self.info["name"]

    @property
    def builtin(self) -> str | None:
        from .backends import BUILTIN  # noqa: PLC0415

        return self.spec if self.spec in BUILTIN else None

    def has(self, method: str) -> bool:
        if not self.info:
            self.start()
        return method in self.info["methods"]

    @property
    def conventions(self) -> tuple[str, ...]:
        return tuple(self.info.get("conventions", ()))

    # -- the process ---------------------------------------------------------------------------------

    def _z(self) -> Zygote:
        return self._zygote or zygote()

    def start(self) -> dict:
        """Start the process and load the backend (raises BackendFailed with one line)."""
        if self.sock is not None:
            return self.info
        self.pid, self.sock = self._z().spawn()
        self.starts += 1
        reply = self._ask({"cmd": "load", "spec": self.spec, "device": self.device, "cwd": os.getcwd(),
                           "sys_path": list(sys.path)}, self.import_timeout,
                          what=f"importing backend {self.spec!r}", limit=1 << 20)
        if reply.kind != "loaded":
            self.kill()
            raise BackendFailed(reply.reason or reply.kind)
        info = reply.values
        name = info.get("name")
        if not isinstance(name, str) or not name:
            self.kill()
            raise BackendFailed("it has no string `name`")
        self.info = {"name": name, "spec": str(info.get("spec") or self.spec),
                     "methods": [m for m in info.get("methods", []) if isinstance(m, str)],
                     "conventions": [c for c in info.get("conventions", []) if isinstance(c, str)],
                     "module": str(info.get("module", "")), "package": info.get("package"),
                     "package_version": info.get("package_version")}
        return self.info

    def kill(self) -> int | None:
        """End the process and everything it started; its exit status."""
        status = None
        if self.pid is not None:
            with contextlib.suppress(BackendFailed, OSError):
                status = self._z().kill(self.pid)
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.pid, self.sock = None, None
        return status

    close = kill

    def _died(self) -> str:
        """`crash: ...` for a process that closed its end: its exit status from the zygote."""
        from .pool import crash_text  # noqa: PLC0415

        status = None
        if self.pid is not None:
            with contextlib.suppress(BackendFailed, OSError):
                status = self._z().wait(self.pid, 5.0)
        self.kill()
        return crash_text(status) if status is not None else "crash: its backend process closed the connection"

    def _ask(self, req: dict, timeout: float | None, *, what: str, limit: int) -> CallResult:
        """Send `req`, wait for the reply until `timeout` seconds (None or 0: no limit)."""
        if self.sock is None:
            self.start()
        try:
            wire.send(self.sock, req, trusted=True)
        except OSError:
            return CallResult("error", reason=self._died())
        deadline = None if not timeout else time.monotonic() + timeout
        try:
            return self._answer(timeout, deadline, what, limit)
        except BaseException:  # interrupted (Ctrl-C, pytest-timeout): its reply would be read as the next one's
            self.kill()
            raise

    def _answer(self, timeout: float | None, deadline: float | None, what: str, limit: int) -> CallResult:
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select([self.sock], [], [], left)
                if ready:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    self.kill()
                    return CallResult("timeout", reason=f"no answer after {timeout:g} s ({what}); its backend "
                                                        "process was killed")
            self.sock.settimeout(None if deadline is None else max(1.0, deadline - time.monotonic()))
            body_devices: list = []
            reply = wire.recv(self.sock, max_bytes=limit, devices=body_devices)
        except EOFError:
            return CallResult("error", reason=self._died())
        except (TimeoutError, socket.timeout):
            self.kill()
            return CallResult("timeout", reason=f"no complete answer after {timeout:g} s ({what}); its backend "
                                                "process was killed")
        except wire.WireError as e:
            self.kill()
            return CallResult("error", reason=f"its backend process sent a malformed reply ({e}); it was killed")
        except OSError as e:
            return CallResult("error", reason=self._died() + f" ({type(e).__name__})")
        if not isinstance(reply, dict) or reply.get("kind") not in ("loaded", "supports", "prepared", "output",
                                                                     "skip", "error"):
            self.kill()
            return CallResult("error", reason="its backend process sent a malformed reply (not a reply record); "
                                              "it was killed")
        kind = reply["kind"]
        if reply.get("retire"):  # its CUDA context died: the next call gets a fresh process
            self.kill()
        if kind in ("skip", "error"):
            return CallResult(kind, reason=str(reply.get("reason", "")))
        if kind == "output":
            values = reply.get("values")
            wall = reply.get("wall_ms")
            return CallResult(kind, values=values if isinstance(values, dict) else {"$": values},
                              wall_ms=float(wall) if isinstance(wall, (int, float)) else None, devices=body_devices)
        return CallResult(kind, values=reply)

    # -- requests ------------------------------------------------------------------------------------

    def supports_many(self, cases: Sequence, device: str) -> list[tuple[Any, str, Any]]:
        """(ok, why, split) per case: ok True / False / "error" (why then says what the backend raised); split
        the (orientation to run, why the other is skipped) of a backend taking one copy of a both-copies case."""
        r = self._ask({"cmd": "supports", "cases": list(cases), "device": str(device)}, self.import_timeout,
                      what="supports()", limit=1 << 20)
        if r.kind != "supports":
            return [("error", f"{self.spec}: supports() failed: {r.reason}", None)] * len(cases)
        answers = r.values.get("answers")
        if not isinstance(answers, list) or len(answers) != len(cases):
            return [("error", f"{self.spec}: supports() sent {type(answers).__name__} answers", None)] * len(cases)
        out = []
        for a in answers:
            ok, why, split = (list(a) + [None, None, None])[:3] if isinstance(a, (list, tuple)) else (False, "", None)
            ok = ok if ok == "error" else bool(ok)
            split = tuple(map(str, split)) if isinstance(split, (list, tuple)) and len(split) == 2 and split[0] in (
                "rowwise", "colwise") else None
            out.append((ok, str(why or ""), split))
        return out

    def ask_ahead(self, cases: Sequence, device: str) -> None:
        """Ask `supports` for every case of a task in one request (one round trip, not one a pair); `supports`
        then answers from what came back. A failed request is not kept: each case asks again."""
        answers = self.supports_many(cases, device)
        if any(ok == "error" for ok, _, _ in answers):
            return
        self._answers = {(c.id, str(device)): a for c, a in zip(cases, answers, strict=True)}

    def supports(self, case, device: str) -> tuple[Any, str, tuple[str, str] | None]:
        """(ok, why, split) for one case: asked ahead (`ask_ahead`) or asked now."""
        hit = self._answers.pop((case.id, str(device)), None)
        return hit if hit is not None else self.supports_many([case], device)[0]

    def prepare(self, cases: Sequence, device: str) -> str | None:
        if not self.has("prepare"):
            return None
        r = self._ask({"cmd": "prepare", "cases": list(cases), "device": str(device)}, self.import_timeout,
                      what="prepare()", limit=1 << 20)
        if r.kind != "prepared":
            return f"{self.name}: prepare failed ({r.reason}); going on"
        line = r.values.get("line")
        return None if line is None else str(line)

    def call(self, case, device, given: dict, ctx: dict, timeout: float | None) -> CallResult:
        """Run harness.ops' candidate call of `case` in the backend process on `given` (its inputs, copied there)."""
        n_in = sum(_nbytes(v) for v in given.values())
        return self._ask({"cmd": "call", "case": case, "device": str(device), "given": given, "ctx": ctx},
                         timeout, what="--case-timeout", limit=REPLY_GROWTH * n_in + REPLY_SLACK_BYTES)

    def __repr__(self) -> str:
        return f"BackendProcess({self.spec!r})"


def _nbytes(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return sum(_nbytes(getattr(v, f.name)) for f in dataclasses.fields(v))
    if isinstance(v, (list, tuple)):
        return sum(_nbytes(x) for x in v)
    if isinstance(v, dict):
        return sum(_nbytes(x) for x in v.values())
    return 0
