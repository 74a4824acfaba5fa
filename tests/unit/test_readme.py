"""The README stays true to the code: its test command is what CI runs; the file map (docs/design.md §1) names real
files."""

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
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## §1 Layout", 1)[1].split("\n## ", 1)[0]
    paths = [p for cell in re.findall(r"^\| (.+?) \|", section, flags=re.M) for p in re.findall(r"`([^`]+)`", cell)]
    assert len(paths) > 50, f"the file map in docs/design.md §1 lists only {len(paths)} paths"
    missing = [p for p in paths if not (ROOT / p.rstrip("/")).exists()]
    assert not missing, missing


def test_readme_stays_short_and_points_to_the_file_map():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "docs/design.md" in text and "## File map" not in text
