"""Failure artefacts: `<out>/failures/<case_id>/` with the inputs, the rows and a repro script.

Source: docs/design.md §5 (failures keep their inputs and a one-line repro).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Mapping, Sequence

import torch

from .report import FAILURES, ReportError, escape_text
from .rows import exc_text

REPO_ROOT = Path(__file__).resolve().parent.parent


def safe_name(case_id: str) -> str:
    """A directory name for a case id (characters outside [A-Za-z0-9._=,+-] become '_')."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", case_id)


def repro_command(case_id: str, backend_spec: str, *, inputs_path: str | None = None, device: str | None = None) -> str:
    """`python -m harness repro ...` as one shell command line: every argument shlex-quoted, so no case id, spec
    or path is ever run by the shell that reads it."""
    cmd = ["python", "-m", "harness", "repro", case_id, "--backend", backend_spec]
    if device:
        cmd += ["--device", device]
    if inputs_path:
        cmd += ["--inputs", inputs_path]
    return " ".join(shlex.quote(str(c)) for c in cmd)


def _comment(text: str) -> str:
    """`text` for a `#` comment line of repro.sh: one line, control characters visible (report.escape_text)."""
    return escape_text(str(text))


def import_root(backend_spec: str) -> Path | None:
    """The sys.path entry that makes the module of a `package.module:object` spec importable (so a
    repro run from another directory still finds the adapter), or None for a registered name."""
    import importlib.util  # noqa: PLC0415

    module, sep, _ = backend_spec.partition(":")
    if not sep:
        return None
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not Path(found.origin).exists():
        return None
    path = Path(found.origin).resolve().parent
    for _ in module.split(".")[: -1 if Path(found.origin).name != "__init__.py" else None]:
        path = path.parent
    return path


def save_failure(out_dir: str | os.PathLike, case, backend_spec: str, rows: Sequence[Mapping],
                 inputs: Mapping | None = None) -> Path:
    """Write `<out>/failures/<case_id>/`: inputs.pt (torch.save), rows, and repro.sh. A write that fails (a
    full disk) is a report.ReportError naming the directory."""
    d = Path(out_dir) / FAILURES / safe_name(case.id)
    try:
        return _save_failure(d, case, backend_spec, rows, inputs)
    except OSError as e:
        raise ReportError(f"cannot write the failure artefacts {d}: {e.strerror or type(e).__name__}; free space (or "
                          "fix the error) and continue with --resume") from None


def _save_failure(d: Path, case, backend_spec: str, rows: Sequence[Mapping], inputs: Mapping | None) -> Path:
    from .inputs import generate  # noqa: PLC0415 - harness core module, imported when used

    d.mkdir(parents=True, exist_ok=True)
    inputs_file = d / "inputs.pt"
    if not inputs_file.exists():
        try:
            data = dict(inputs) if inputs is not None else dict(generate(case, device="cpu"))
            torch.save({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in data.items()}, inputs_file)
        except Exception as e:  # noqa: BLE001 - the repro still regenerates inputs from the seed
            (d / "inputs_error.txt").write_text(f"could not save inputs: {exc_text(e)}\n")
    (d / "case.txt").write_text(f"{case.id}\nsource: {getattr(case, 'source', '')}\n")
    safe_b = safe_name(backend_spec)
    with open(d / f"rows.{safe_b}.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({k: v for k, v in r.items()}, default=str) + "\n")
    # repro.sh: every path and argument is shlex-quoted (a checkout or adapter under a directory named
    # `a$(touch PWNED)b`, a spec or case id with quotes: all stay data); the script expands only its own variables.
    script = d / "repro.sh"
    text = script.read_text() if script.exists() else "\n".join([
        "#!/bin/sh",
        f"# Repro of {_comment(case.id)} (inputs saved beside this script; they are also regenerated from the seed).",
        "# Runs from any directory: the harness checkout and each adapter's import root go on PYTHONPATH",
        "# (set NUMERICS_HARNESS_ROOT when the checkout lives elsewhere).",
        'here="$(cd "$(dirname "$0")" && pwd)"',
        f"root={shlex.quote(str(REPO_ROOT))}",
        'root="${NUMERICS_HARNESS_ROOT:-$root}"',
        'export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"',
    ]) + "\n"
    adapter_root = import_root(backend_spec)
    added = []
    if adapter_root is not None and adapter_root != REPO_ROOT:
        added.append(f'export PYTHONPATH={shlex.quote(str(adapter_root) + ":")}"$PYTHONPATH"  '
                     f'# imports {_comment(backend_spec.partition(":")[0])}')
    added.append(repro_command(case.id, backend_spec) + ' --inputs "$here/inputs.pt" "$@"')
    for line in added:  # each once (a quoted case id may hold a newline: whole lines of the text are compared)
        if f"\n{line}\n" not in f"\n{text}":
            text += line + "\n"
    script.write_text(text)
    script.chmod(0o755)
    return d


OUTPUTS = "outputs"


def plain_outputs(values, prefix: str = "") -> dict:
    """A candidate's outputs (harness.ops.Output.values: tensors, QuantizedTensors, AmaxHistory, lists, dicts) as
    {dotted name: CPU tensor}, plain tensors only (what torch.load(weights_only=True) reads back)."""
    import dataclasses  # noqa: PLC0415

    import torch  # noqa: PLC0415

    out: dict = {}
    if isinstance(values, torch.Tensor):
        out[prefix or "out"] = values.detach().to("cpu").clone()
    elif isinstance(values, dict):
        for k, v in values.items():
            out.update(plain_outputs(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(values, (list, tuple)):
        for i, v in enumerate(values):
            out.update(plain_outputs(v, f"{prefix}.{i}" if prefix else str(i)))
    elif dataclasses.is_dataclass(values) and not isinstance(values, type):
        for f in dataclasses.fields(values):
            out.update(plain_outputs(getattr(values, f.name), f"{prefix}.{f.name}" if prefix else f.name))
    else:
        for name in ("scale", "history"):  # AmaxHistory and its kind: plain attributes
            v = getattr(values, name, None)
            if isinstance(v, torch.Tensor):
                out[f"{prefix}.{name}" if prefix else name] = v.detach().to("cpu").clone()
    return out


def outputs_path(out_dir, case_id: str, backend: str) -> Path:
    """OUT/outputs/<safe case id>/<safe backend>.pt."""
    return Path(out_dir) / OUTPUTS / safe_name(case_id) / f"{safe_name(backend)}.pt"


def save_outputs(out_dir, case_id: str, backend: str, outputs: dict) -> Path:
    """torch.save of {name: tensor} for one (case, backend), written whole (a temporary file, then a rename)."""
    import torch  # noqa: PLC0415

    p = outputs_path(out_dir, case_id, backend)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".pt.tmp")
    torch.save(dict(outputs), tmp)
    tmp.replace(p)
    return p
