"""The README stays true to the code: its test command is what CI runs, its file map names real files."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fenced_commands(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```\n(.*?)```", text, flags=re.S) if b.strip().startswith("pip install")]


def test_quickstart_has_exactly_two_commands_and_ci_runs_the_test_command():
    cmds = fenced_commands((ROOT / "README.md").read_text())
    assert len(cmds) == 2, cmds
    test_cmd = next(c for c in cmds if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci.splitlines(), f"{test_cmd!r} is not a line of .ci/run"


def test_file_map_entries_exist():
    text = (ROOT / "README.md").read_text()
    section = text.split("## File map", 1)[1].split("\n## ", 1)[0]
    paths = re.findall(r"^\| `([^`]+)`", section, flags=re.M)
    assert paths, "the file map lists no paths"
    missing = [p for p in paths if not (ROOT / p.rstrip("/")).exists()]
    assert not missing, missing
