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

from .report import FAILURES
from .rows import exc_text

REPO_ROOT = Path(__file__).resolve().parent.parent


def safe_name(case_id: str) -> str:
    """A directory name for a case id (characters outside [A-Za-z0-9._=,+-] become '_')."""
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", case_id)


def repro_command(case_id: str, backend_spec: str, *, inputs_path: str | None = None, device: str | None = None) -> str:
    cmd = ["python", "-m", "harness", "repro", case_id, "--backend", backend_spec]
    if device:
        cmd += ["--device", device]
    text = " ".join(shlex.quote(c) for c in cmd)
    if inputs_path:
        text += f" --inputs {inputs_path}"
    return text


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
    """Write `<out>/failures/<case_id>/`: inputs.pt (torch.save), rows, and repro.sh."""
    from .inputs import generate  # noqa: PLC0415 - harness core module, imported when used

    d = Path(out_dir) / FAILURES / safe_name(case.id)
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
    script = d / "repro.sh"
    lines = script.read_text().splitlines() if script.exists() else [
        "#!/bin/sh",
        f"# Repro of {case.id} (inputs saved beside this script; they are also regenerated from the seed).",
        "# Runs from any directory: the harness checkout and each adapter's import root go on PYTHONPATH",
        "# (set NUMERICS_HARNESS_ROOT when the checkout lives elsewhere).",
        'here="$(cd "$(dirname "$0")" && pwd)"',
        f'root="${{NUMERICS_HARNESS_ROOT:-{REPO_ROOT}}}"',
        'export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"',
    ]
    adapter_root = import_root(backend_spec)
    if adapter_root is not None and adapter_root != REPO_ROOT:
        line = f'export PYTHONPATH="{adapter_root}:$PYTHONPATH"  # imports {backend_spec.partition(":")[0]}'
        if line not in lines:
            lines.append(line)
    cmd = repro_command(case.id, backend_spec, inputs_path='"$here/inputs.pt"') + ' "$@"'
    if cmd not in lines:
        lines.append(cmd)
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return d
