"""run_meta.json content: git commit, library and driver versions, GPUs, run options.

Source: docs/design.md §6 (`run_meta.json`: commit, versions of torch/cupy/cuBLAS/driver, GPU, options).
Every probe is best effort: a missing tool or library gives None, never an exception.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cupy_info() -> dict:
    """CuPy, CUDA runtime/driver and cuBLAS versions through CuPy, if CuPy imports and sees a GPU."""
    info: dict = {"cupy": None, "cuda_runtime": None, "cuda_driver": None, "cublas": None}
    try:
        import cupy  # noqa: PLC0415 - optional GPU dependency

        info["cupy"] = cupy.__version__
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

        info["cublas"] = cublas.getVersion(cupy.cuda.device.get_cublas_handle())
    except Exception:  # noqa: BLE001 - best effort: absent CuPy/GPU leaves None
        pass
    return info


def _nvidia_smi() -> dict:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0:
        return {}
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return {"nvidia_smi": lines, "driver": lines[0].split(",")[1].strip() if lines else None}


def _torch_info() -> dict:
    import torch  # noqa: PLC0415

    info = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                 "memory_gib": round(p.total_memory / 2**30, 1)})
    return info


def adapter_info(backend) -> dict:
    """What ran as `backend`: its name, spec, the module defining its class, and that module's package
    and version (the backend's `package` / `package_version` attributes when it has them, else the
    distribution owning the module's top-level package, else none)."""
    import importlib.metadata  # noqa: PLC0415

    info = getattr(backend, "info", None)  # a harness.sandbox.BackendProcess: what its process said
    if isinstance(info, dict) and info:
        module, package, version = info.get("module", ""), info.get("package"), info.get("package_version")
    else:
        module = type(backend).__module__
        package = getattr(backend, "package", None)
        version = getattr(backend, "package_version", None)
    if package is None:
        top = module.split(".")[0]
        dists = importlib.metadata.packages_distributions().get(top, [])
        package = dists[0] if dists else None
        version = _version(package) if package else None
    return {"name": backend.name, "spec": getattr(backend, "spec", None) or backend.name, "module": module,
            "package": package, "package_version": version}


def environment(probe_gpu: bool = True) -> dict:
    """The run's machine and software: git state, host, versions, GPUs (a CUDA context and a cuBLAS handle
    through CuPy, and nvidia-smi, when `probe_gpu` and a GPU is visible). Takes about a second on a GPU host:
    harness run computes it in an `EnvironmentProbe` while it selects the cases."""
    commit = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain")
    env = {
        "git_commit": commit,
        "git_dirty": None if dirty is None else bool(dirty),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": _version("numpy"),
        "pandas": _version("pandas"),
        "nvmath": _version("nvmath-python"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    env.update(_torch_info())
    if probe_gpu and env["cuda_available"]:
        env.update(_cupy_info())
        env.update(_nvidia_smi())
    return env


def _send_environment(conn) -> None:
    try:
        conn.send(environment())
    finally:
        conn.close()


class EnvironmentProbe:
    """`environment()` computed in a one-shot process started from `context` (harness run: forked from the
    workers' forkserver), so the GPU queries neither hold this process's GIL nor outlive it (the child ends
    when it has sent its answer, also when this process was killed meanwhile). The child is started and
    awaited on a thread, since starting it waits for a forkserver that may still be importing (issue #19);
    `result()` waits for the answer; if the child died without one, the probe runs here."""

    def __init__(self, context) -> None:
        ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="harness-probe")
        self._answer = ex.submit(_probe_in_child, context)
        ex.shutdown(wait=False)  # the thread ends with its one task

    def result(self) -> dict:
        env = self._answer.result()
        return environment() if env is None else env


def _probe_in_child(context) -> dict | None:
    """environment() from a child process of `context`; None if it died without an answer."""
    recv, send = context.Pipe(duplex=False)
    proc = context.Process(target=_send_environment, args=(send,), daemon=True)
    proc.start()
    send.close()
    try:
        return recv.recv()
    except (EOFError, OSError):
        return None
    finally:
        recv.close()
        proc.join()


def run_meta(options: Mapping | None = None, *, probe_gpu: bool = True, backends=(),
             env: Mapping | None = None) -> dict:
    """Everything needed to reproduce and compare a run (written to run_meta.json); `env`: an `environment()`
    computed earlier (else computed here)."""
    meta = {
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "options": dict(options or {}),
        "adapters": [adapter_info(b) for b in backends],
    }
    meta.update(env if env is not None else environment(probe_gpu))
    return meta


# ----------------------------------------------------------------------------------------------
# The selection a report holds: what `--resume` continues and what `merge` joins
# ----------------------------------------------------------------------------------------------

# The selection keys `--resume` compares: a report continues only the sweep it was made by (docs/design.md §6).
# The backends are compared as their spec lists; when `backend_identity(spec)` (the backend's code and package
# fingerprint) lands, its key joins here and `selection()` records it: one line each.
RESUME_KEYS = ("tier", "cases_sha256", "filter", "shard", "golden_device", "backends", "backend_code")
# The keys every shard of one `--shard i/n` sweep shares (`harness merge` checks them).
SHARD_KEYS = ("tier", "cases_sha256", "filter", "backends")


def file_sha256(path: str | os.PathLike) -> str | None:
    """The sha256 of a file's bytes (hex), or None if it cannot be read."""
    import hashlib  # noqa: PLC0415

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def selection(*, tier: str | None, cases_file: str | None, filter: str | None, shard: tuple[int, int] | None,
              golden_device: str | None, backends: list[str], backend_code: list[dict] | None = None) -> dict:
    """run_meta.json's `selection`: the tier (or None) or the cases file's path, the sha256 of the file the cases
    came from (the tier's own file for a tier; an `include`d file is not part of it), the --filter, the --shard
    as "i/n", the golden device and the backends' specs."""
    from .cases import resolve  # noqa: PLC0415

    source = cases_file or tier or "smoke"
    return {"tier": None if cases_file else source, "cases": str(cases_file) if cases_file else None,
            "cases_sha256": file_sha256(resolve(source)), "filter": filter or None,
            "shard": f"{shard[0]}/{shard[1]}" if shard else None, "golden_device": golden_device,
            "backends": list(backends),
            # harness.backends.backend_identity of each: the file defining it, its sha256 and its package's version
            "backend_code": [{k: d.get(k) for k in ("spec", "sha256", "version")} for d in (backend_code or [])]}


def selection_of(meta: Mapping) -> dict:
    """The selection a run_meta.json records: its `selection`, or for a report written before it, what its
    `options` say (no cases digest; backend names are not specs, so no backends)."""
    if isinstance(meta.get("selection"), Mapping):
        return dict(meta["selection"])
    opts = meta.get("options")
    if not isinstance(opts, Mapping):
        return {}
    out = {k: opts[k] or None for k in ("filter", "shard", "golden_device") if k in opts}
    if "tier" in opts or "cases" in opts:
        out["tier"] = None if opts.get("cases") else (opts.get("tier") or "smoke")
        out["cases"] = opts.get("cases") or None
    return out


def _same(key: str, a, b) -> bool:
    if key == "backends" and isinstance(a, list) and isinstance(b, list):
        return sorted(map(str, a)) == sorted(map(str, b))  # the order of --backend is not the selection
    return a == b


def differences(old: Mapping, new: Mapping, keys=RESUME_KEYS) -> list[str]:
    """The keys of `keys` on which two selections differ (a key one of them does not record is not compared;
    the cases digest not when the tier or file already differs)."""
    out = [k for k in keys if k in old and k in new and not _same(k, old[k], new[k])]
    if "cases_sha256" in out and ("tier" in out or old.get("cases") != new.get("cases")):
        out.remove("cases_sha256")
        if "tier" not in out:
            out.append("tier")  # shown as the other --cases file
    return out


def describe(sel: Mapping, key: str) -> str:
    """One selection key as the command line gave it: `--filter 'e4m3'`, `no --shard`, ..."""
    v = sel.get(key)
    if key == "tier":
        return f"--cases {sel['cases']!r}" if sel.get("cases") else f"--tier {v!r}"
    if key == "cases_sha256":
        what = f"--cases {sel['cases']!r}" if sel.get("cases") else f"--tier {sel.get('tier')!r}"
        return f"{what} with content sha256 {str(v)[:12]}"
    if key == "backend_code" and isinstance(v, list):
        return "; ".join(f"backend {d.get('spec')!r} at code sha256 {str(d.get('sha256'))[:12]}, version "
                         f"{d.get('version')}" for d in v if isinstance(d, Mapping)) or "no backend code recorded"
    if key == "backends":
        return f"--backend {','.join(map(str, v))}" if isinstance(v, list) else f"--backend {v!r}"
    flag = "--" + key.replace("_", "-")
    return f"{flag} {v!r}" if v is not None else f"no {flag}"


def check_resume(old_meta: Mapping, new_meta: Mapping) -> str | None:
    """None if a run with `new_meta` may continue the report of `old_meta` (the same selection on every key of
    RESUME_KEYS), else what changed: "made with --filter 'e4m3', this run has --filter 'e5m2'"."""
    old, new = selection_of(old_meta), selection_of(new_meta)
    keys = differences(old, new)
    if not keys:
        return None
    return (f"made with {' and '.join(describe(old, k) for k in keys)}, "
            f"this run has {' and '.join(describe(new, k) for k in keys)}")
