"""Every documentation citation in the repository names a section that exists; every relative link resolves.

Source: docs/design.md §7 (citations name sections that exist), docs/numerics.md (how to cite). A citation is a
doc name (`numerics.md`, `NUMERICS.md`, `NUMERICS`, the `# NUMERICS:` marker, `design.md`, `DESIGN.md`,
`adapters.md`, `performance.md`, optionally `docs/`-prefixed or as a markdown link) followed by section numbers:
`§5.7`, lists and ranges (`§3/§5.5`, `§1, §4`, `§1-§5`) and list items (`§0.2.8`, `§7.14`, `§7 item 16`,
`§2 steps 1-6`). A section is a heading `#... §X title` of docs/<name>.md; `§X.N` and `§X item N` also name item N
of a numbered list under §X. Bare `§X` inside a doc refers to that doc itself.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SELF = Path(__file__).resolve()
CITING_SUFFIXES = (".py", ".cu", ".cuh", ".md", ".toml")
LINKED_FILES = ("README.md", "reports/README.md", "cases/README.md")
DOC_FILES = {"numerics": "numerics.md", "design": "design.md", "adapters": "adapters.md",
             "performance": "performance.md"}

_NUM = r"\d+(?:\.\d+)*"
_ITEM = r"(?:\s+(?:items?|steps?)\s+\d+(?:\s*[-–]\s*\d+)?)?"
_REF = rf"§{_NUM}{_ITEM}"  # one reference, no groups (it is repeated below)
_SEP = r"\s*(?:,|/|-|–|\band\b|\bor\b)\s*"
_DOC = r"(?<![\w/])(?:docs/)?(?P<doc>numerics|design|adapters|performance)(?:\.md)?(?:\]\([^)\s]*\))?(?::|\s)\s*"
CITATION = re.compile(rf"(?i){_DOC}(?P<refs>{_REF}(?:{_SEP}{_REF})*)")
BARE = re.compile(rf"(?<![\w.])(?P<refs>{_REF})")
REF = re.compile(rf"§(?P<sec>{_NUM})(?:\s+(?:items?|steps?)\s+(?P<i0>\d+)(?:\s*[-–]\s*(?P<i1>\d+))?)?")
# Names of documents that do not exist (issue 13: 19 citations of an `interfaces.md`).
DANGLING = re.compile(r"interfaces\.md|\b(?:DESIGN|docs)\s+interfaces\b|\(interfaces[:)]")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)|^\[[^\]]+\]:\s*(?P<ref>\S+)", re.M)
HEADING = re.compile(rf"^#{{1,6}}\s+§(?P<sec>{_NUM})\b", re.M)
LIST_ITEM = re.compile(r"^\s{0,3}(?P<n>\d+)\.\s")


# ---- parsing --------------------------------------------------------------------------------------------------


def sections(text: str) -> tuple[set[str], dict[str, set[int]]]:
    """(heading ids, heading id -> numbers of the numbered-list items under it) of one doc."""
    heads: set[str] = set()
    items: dict[str, set[int]] = {}
    current = None
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        m = HEADING.match(line)
        if m:
            current = m["sec"]
            heads.add(current)
            items.setdefault(current, set())
            continue
        m = LIST_ITEM.match(line)
        if m and current is not None:
            items[current].add(int(m["n"]))
    return heads, items


def refs_of(refs_text: str) -> list[tuple[str, int | None]]:
    """(section, list item or None) of every reference in a citation's tail, range ends and item ranges included."""
    out: list[tuple[str, int | None]] = []
    for m in REF.finditer(refs_text):
        if m["i0"] is None:
            out.append((m["sec"], None))
        else:
            out.extend((m["sec"], int(m[k])) for k in ("i0", "i1") if m[k] is not None)
    return out


def citations(text: str) -> list[tuple[str, str, int | None, int]]:
    """(doc key, section, item, line) of every named-doc citation in `text`."""
    out = []
    for m in CITATION.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.extend((m["doc"].lower(), sec, item, line) for sec, item in refs_of(m["refs"]))
    return out


def bare_refs(text: str) -> list[tuple[str, int | None, int]]:
    """(section, item, line) of the `§` references in a doc that follow no doc name (they cite the doc itself)."""
    spans = [(m.start("refs"), m.end("refs")) for m in CITATION.finditer(text)]
    out = []
    for m in BARE.finditer(text):
        if any(a <= m.start() < b for a, b in spans):
            continue
        line = text.count("\n", 0, m.start()) + 1
        out.extend((sec, item, line) for sec, item in refs_of(m["refs"]))
    return out


@lru_cache(maxsize=None)
def doc_sections(key: str) -> tuple[frozenset[str], dict[str, set[int]]]:
    heads, items = sections((DOCS / DOC_FILES[key]).read_text(encoding="utf-8"))
    return frozenset(heads), items


def resolves(key: str, sec: str, item: int | None) -> bool:
    heads, items = doc_sections(key)
    if item is not None:
        return sec in heads and item in items[sec]
    if sec in heads:
        return True
    parent, _, last = sec.rpartition(".")
    return bool(parent) and parent in heads and int(last) in items[parent]


def repo_files(suffixes: tuple[str, ...]) -> list[Path]:
    """Tracked and untracked-but-not-ignored files of the clone with these suffixes (all files without git)."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout.splitlines()
        paths = [REPO / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in REPO.rglob("*") if not any(part.startswith(".") for part in p.relative_to(REPO).parts)]
    return sorted(p for p in paths if p.suffix in suffixes and p.is_file() and p.resolve() != SELF)


# ---- the parser on hand-written strings --------------------------------------------------------------------


def test_citation_parser_forms():
    text = "\n".join([
        "# NUMERICS: §0.2.2",
        "see NUMERICS.md §3/§5.5, §7 item 16 and DESIGN.md §3-§4.",
        "(docs/numerics.md §2 steps 1-6) [adapters.md](adapters.md) §3; Higham §4.2",
        "NUMERICS §0.5/§7.1: x",
    ])
    assert citations(text) == [
        ("numerics", "0.2.2", None, 1),
        ("numerics", "3", None, 2), ("numerics", "5.5", None, 2), ("numerics", "7", 16, 2),
        ("design", "3", None, 2), ("design", "4", None, 2),
        ("numerics", "2", 1, 3), ("numerics", "2", 6, 3), ("adapters", "3", None, 3),
        ("numerics", "0.5", None, 4), ("numerics", "7.1", None, 4),
    ]
    assert bare_refs("by §5.1 and §7.19 (see numerics" + ".md §6)") == [("5.1", None, 1), ("7.19", None, 1)]


def test_section_parser():
    heads, items = sections("## §1 A\n1. x\n2. y\n```\n3. in a fence\n## §9 not a heading\n```\n### §1.2 B\n10. z\n")
    assert heads == {"1", "1.2"}
    assert items == {"1": {1, 2}, "1.2": {10}}


def test_resolution_rules():
    assert resolves("numerics", "5.7", None)
    assert resolves("numerics", "0.2.8", None)  # rule 8 of §0.2
    assert resolves("numerics", "7.14", None) and resolves("numerics", "7", 19)
    assert resolves("numerics", "2", 6)  # end-of-step update, step 6
    assert resolves("numerics", "9.7", None) and resolves("numerics", "10.7", None)
    assert not resolves("numerics", "99", None) and not resolves("numerics", "9.9", None)
    assert not resolves("numerics", "0.2.9", None)
    assert not resolves("numerics", "5.11", None)
    assert resolves("numerics", "7", 29) and not resolves("numerics", "7", 30)
    assert resolves("design", "9", None) and not resolves("design", "10", None)


# ---- the contract's numbering is stable --------------------------------------------------------------------


def test_numerics_keeps_the_shared_numbering():
    heads, items = doc_sections("numerics")
    expected = {"0", *(f"0.{i}" for i in range(1, 6)), *map(str, range(1, 9)), *(f"5.{i}" for i in range(1, 11))}
    assert expected <= heads, sorted(expected - heads)
    assert items["0.2"] == set(range(1, 9))
    assert items["1"] == set(range(1, 7)) and items["2"] == set(range(1, 7))
    assert set(range(1, 20)) <= items["7"]  # items 1-19 keep their numbers; later items are appended


def test_design_and_adapters_sections():
    assert {str(i) for i in range(1, 8)} <= doc_sections("design")[0]
    assert {str(i) for i in range(1, 7)} <= doc_sections("adapters")[0]
    assert {"1", "2", "3", "4"} <= doc_sections("performance")[0]


# ---- the whole repository --------------------------------------------------------------------------------


def test_every_citation_names_an_existing_section():
    bad, n = [], 0
    for path in repo_files(CITING_SUFFIXES):
        for key, sec, item, line in citations(path.read_text(encoding="utf-8", errors="replace")):
            n += 1
            if not resolves(key, sec, item):
                what = f"§{sec}" + (f" item {item}" if item is not None else "")
                bad.append(f"{path.relative_to(REPO)}:{line}: docs/{DOC_FILES[key]} has no {what}")
    assert n > 200, f"only {n} citations found: the citation pattern no longer matches the code's style"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("key", sorted(DOC_FILES))
def test_bare_references_inside_a_doc_resolve_in_it(key):
    text = (DOCS / DOC_FILES[key]).read_text(encoding="utf-8")
    bad = [f"docs/{DOC_FILES[key]}:{line}: §{sec}" + (f" item {item}" if item else "")
           for sec, item, line in bare_refs(text) if not resolves(key, sec, item)]
    assert not bad, "\n".join(bad)


def test_no_citation_names_a_missing_document():
    bad = []
    for path in repo_files(CITING_SUFFIXES):
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if DANGLING.search(line):
                bad.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, "citations of a document that does not exist:\n" + "\n".join(bad)


def _link_files() -> list[Path]:
    return [REPO / f for f in LINKED_FILES] + sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("path", _link_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve_inside_the_clone(path):
    text = path.read_text(encoding="utf-8")
    bad = []
    for m in LINK.finditer(text):
        target = m["target"] or m["ref"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the same file
        dest = (path.parent / target.split("#", 1)[0]).resolve()
        if not dest.is_relative_to(REPO.resolve()) or not dest.exists():
            bad.append(f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {target}")
    assert not bad, "links that do not resolve inside the clone:\n" + "\n".join(bad)
