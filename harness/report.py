"""Long-format result reports: the column schema, the append-as-you-go CSV writer, summary, diff, merge.

Source: docs/design.md §6 (one row per (case, tensor), fixed column order declared once, written by
pandas, `results.csv` + `run_meta.json`); the schema is documented in reports/README.md, and a test
checks that table against `COLUMNS`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

RESULTS = "results.csv"
META = "run_meta.json"
FAILURES = "failures"

# The one declaration of the report schema (reports/README.md documents every column, in this order).
COLUMNS: tuple[str, ...] = (
    # what ran
    "case_id",
    "scheme",
    "op",
    "backend",
    "tensor",
    "kind",
    # verdict
    "status",
    "severity",
    "matches_convention",
    "reason",
    # comparison counts and metrics
    "n",
    "n_mismatch",
    "mismatch_frac",
    "max_abs",
    "max_rel",
    "rmse",
    "sqnr_db",
    "delta_sqnr_db",
    "mismatch_classes",
    "first_mismatch",
    "mismatch_examples",
    "ulp_hist",
    # the case, spelled out (docs/design.md §2 names)
    "element",
    "tile",
    "rht",
    "stochastic",
    "pow2_scales",
    "e8m0_rule",
    "orientation",
    "shape",
    "in_dtype",
    "out_dtype",
    "layout",
    "b_config",
    "accumulate",
    "bias",
    "distribution",
    "seed",
    # where and how long
    "device",
    "wall_ms",
    "inputs_ms",
    "golden_ms",
    "check_ms",
    "worker",
)

# Row statuses, best first. `info` rows carry accuracy measurements and have no verdict.
STATUSES = ("pass", "info", "skip", "fail", "error")
_RANK = {"pass": 0, "info": 0, "skip": 1, "fail": 2, "error": 3}
JSON_COLUMNS = ("mismatch_classes", "first_mismatch", "mismatch_examples", "ulp_hist")
TIME_COLUMNS = ("wall_ms", "inputs_ms", "golden_ms", "check_ms")
# Columns added after the first schema: empty when reading an older report, added when resuming one.
# Each generation of added columns, oldest first (the timing columns, then the verdict and example columns).
SCHEMA_ADDITIONS = (("inputs_ms", "golden_ms", "check_ms"), ("severity", "matches_convention", "delta_sqnr_db", "mismatch_examples"))
LATER_COLUMNS = tuple(c for added in SCHEMA_ADDITIONS for c in added)
NUMERIC_COLUMNS = ("n", "n_mismatch", "mismatch_frac", "max_abs", "max_rel", "rmse", "sqnr_db", "delta_sqnr_db",
                   *TIME_COLUMNS)
INT_COLUMNS = ("n", "n_mismatch")
TEXT_COLUMNS = tuple(c for c in COLUMNS if c not in NUMERIC_COLUMNS)
_NUMERIC = frozenset(NUMERIC_COLUMNS)

# The longest cell the writer writes (characters): Python's csv module, which check_results reads with, refuses
# fields over 131072; a longer cell (a backend's own scale chain, say) is cut, a JSON cell replaced by {"cut": ...}.
CELL_LIMIT = 100_000
# diff: an SQNR drop larger than this (dB) is a regression (the threshold).
SQNR_DROP_DB = 0.5
# Skip reasons printed by format_summary (the most frequent first) and the characters of each shown.
SKIP_TOP = 10
SKIP_REASON_WIDTH = 110


def status_rank(status: str) -> int:
    """Badness of a status: pass/info 0 < skip 1 < fail 2 < error 3 (unknown strings count as error)."""
    return _RANK.get(str(status), _RANK["error"])


def worst_status(statuses: Iterable[str]) -> str:
    """The case-level status: the worst of its rows (info rows alone make a pass)."""
    worst = "pass"
    for s in statuses:
        s = "pass" if s == "info" else str(s)
        if status_rank(s) > status_rank(worst):
            worst = s
    return worst


def _clean(v):
    """A JSON-safe copy: tensors/arrays to lists, non-finite floats to strings, tuples to lists."""
    if isinstance(v, Mapping):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return _clean(v.tolist())
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def to_json(v) -> str:
    """A compact JSON cell ('' for None)."""
    if v is None or (isinstance(v, str) and v == ""):
        return ""
    if isinstance(v, str):
        return v
    return json.dumps(_clean(v), sort_keys=True, separators=(",", ":"))


# Text a backend controls (a reason, an exception message, its name) reaches every cell of a row. What would
# damage a report or the terminal showing it is written visibly instead: C0/C1 control characters (NUL, ESC,
# newlines), DEL, line and paragraph separators, bidi and zero-width format characters, and unpaired surrogates
# (which UTF-8 cannot encode) become `\x1b`, `\n`, `\u202e`, `\ud800` (the backslash itself is kept: the escape is
# for reading, not reversible).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
# A cell starting with one of these is a formula to a spreadsheet (OWASP "CSV injection"); `+` and `-` only
# when the cell is not a number ("-3.5", "-inf" stay numbers).
_FORMULA = frozenset("=+-@\t\r")


def _escape_char(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def escape_text(text: str) -> str:
    """`text` with every control, format or unpaired-surrogate character written as a visible escape
    (`\x1b`, `\x00`, `\n`, `\u202e`, `\ud800`): safe to print on a terminal and to encode as UTF-8."""
    return text if _UNSAFE.search(text) is None else _UNSAFE.sub(_escape_char, text)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def sanitize_cell(text: str) -> str:
    """The one sanitizer of report text cells (normalize_row applies it to every text column): escape_text,
    and a cell that a spreadsheet would run as a formula (starting with = + - @, tab or CR; a number such as
    "-3.5" excepted) gets a leading single quote. Idempotent: a sanitized cell comes back unchanged."""
    if text and text[0] in _FORMULA and (text[0] not in "+-" or not _is_number(text)):
        return "'" + escape_text(text)
    return escape_text(text)


def normalize_row(row: Mapping) -> dict:
    """A row with exactly COLUMNS, JSON columns encoded, missing cells empty, text cells sanitized
    (sanitize_cell); unknown keys are an error."""
    extra = set(row) - set(COLUMNS)
    if extra:
        raise KeyError(f"report row has columns not in report.COLUMNS: {sorted(extra)} (add them to COLUMNS and reports/README.md)")
    out = {}
    for c in COLUMNS:
        v = row.get(c)
        if c in JSON_COLUMNS:
            v = to_json(v)
        elif v is None:
            v = ""
        elif isinstance(v, float) and math.isnan(v):
            v = ""
        if isinstance(v, str):
            if v and (c not in _NUMERIC or not _is_number(v)):  # "inf" / "-inf" in a metric column stay
                v = sanitize_cell(v)
        elif not isinstance(v, (int, float)):  # bools are ints; anything else is written as its str()
            v = sanitize_cell(str(v))
        if isinstance(v, str) and len(v) > CELL_LIMIT:
            v = (json.dumps({"cut": f"{len(v)} characters, over report.CELL_LIMIT"}) if c in JSON_COLUMNS
                 else f"{v[:CELL_LIMIT - 60]}... (cut: {len(v)} characters, over report.CELL_LIMIT)")
        out[c] = v
    return out


def rows_to_csv_text(rows: Sequence[Mapping], header: bool) -> str:
    """CSV text for `rows` in COLUMNS order, for pandas.read_csv: the stdlib csv writer that
    DataFrame.to_csv uses, with each cell as str() gives it (a tenth of a DataFrame's cost per case)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(COLUMNS)
    for r in rows:
        n = normalize_row(r)
        w.writerow([n[c] for c in COLUMNS])
    return buf.getvalue()


class ReportError(ValueError):
    """A report directory or file that cannot be used as asked (the message says why and what to do)."""


class CorruptReport(ReportError):
    """A results.csv that is not a whole harness report; the message names the line."""


KINDS = ("conformance", "accuracy")
LOCK = ".lock"


def _headers() -> tuple[tuple[str, ...], ...]:
    """The accepted headers: the current COLUMNS, and each older schema (without the later additions)."""
    out = [COLUMNS]
    for i in range(len(SCHEMA_ADDITIONS)):
        later = {c for added in SCHEMA_ADDITIONS[len(SCHEMA_ADDITIONS) - 1 - i:] for c in added}
        out.append(tuple(c for c in COLUMNS if c not in later))
    return tuple(out)


def check_results(path: str | os.PathLike, *, allow_cut_end: bool = False) -> int:
    """Raise CorruptReport naming the first bad line of a results.csv, else return its row count.

    Bad: bytes that are not UTF-8 text, a header that is not a harness schema, a row with the wrong
    number of cells, an unknown status or kind, an empty case_id or backend, and (unless
    `allow_cut_end`) a last line without its newline (a write cut short).
    """
    p = results_path(path)
    data = p.read_bytes()
    if not data:
        return 0
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise CorruptReport(f"{p} line {line}: not UTF-8 text (byte {e.start}); not a harness report") from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise CorruptReport(f"{p} line {line}: binary data (NUL byte); not a harness report")
    if text and not text.endswith("\n") and not allow_cut_end:
        raise CorruptReport(f"{p} line {text.count(chr(10)) + 1}: the last line is cut short (no newline); "
                            "`python -m harness run --resume` drops it and re-runs that (case, backend)")
    reader = csv.reader(io.StringIO(text))
    try:
        return _check_rows(p, reader)
    except csv.Error as e:  # e.g. a cell over the csv module's field size limit
        raise CorruptReport(f"{p} line {reader.line_num}: not CSV the harness writes ({e})") from None


def _check_rows(p: Path, reader) -> int:
    header = tuple(next(reader, ()))
    if header not in _headers():
        raise CorruptReport(f"{p} line 1: the header is not a harness report's (expected the columns of "
                            "reports/README.md)")
    width, idx = len(header), {c: i for i, c in enumerate(header)}
    n = 0
    for cells in reader:
        line = reader.line_num
        if len(cells) != width:
            raise CorruptReport(f"{p} line {line}: {len(cells)} cells, expected {width}")
        status, kind = cells[idx["status"]], cells[idx["kind"]]
        if status not in STATUSES:
            raise CorruptReport(f"{p} line {line}: status {status[:40]!r} is not one of {', '.join(STATUSES)}")
        if kind not in KINDS:
            raise CorruptReport(f"{p} line {line}: kind {kind[:40]!r} is not one of {', '.join(KINDS)}")
        if not cells[idx["case_id"]] or not cells[idx["backend"]]:
            raise CorruptReport(f"{p} line {line}: empty case_id or backend")
        n += 1
    return n


def _drop_cut_pair(path: Path) -> str | None:
    """Before resuming: if the last line was cut short, drop it and every row of the last whole
    line's (case, backend) at the end, so that pair runs again whole; returns a note, or None."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    lines = data[:cut].decode("utf-8", errors="replace").splitlines(keepends=True)
    torn = next(csv.reader([data[cut:].decode("utf-8", errors="replace")]), [])

    def pair(cells: list[str]) -> tuple[str, str] | None:
        return (cells[0], cells[3]) if len(cells) > 4 else None  # (case_id, backend), both cells whole

    if len(lines) > 1:
        last = pair(next(csv.reader([lines[-1]])))
        # The torn line belongs to the last whole line's pair unless its own (whole) cells say otherwise.
        if pair(torn) in (None, last):
            while len(lines) > 1 and pair(next(csv.reader([lines[-1]]))) == last:
                cut -= len(lines.pop().encode("utf-8"))
            note = f"the last line of {path} was cut short: re-running {last[0]} [{last[1]}]"
        else:
            note = f"the last line of {path} was cut short: re-running {pair(torn)[0]} [{pair(torn)[1]}]"
    else:
        note = f"the header of {path} was cut short: starting it again"
        cut = 0
    with open(path, "r+b") as f:
        f.truncate(cut)
    return note


def _upgrade_columns(path: Path) -> None:
    """Rewrite a results.csv of an older schema (without LATER_COLUMNS) in COLUMNS order, so resumed
    rows append under a matching header; a current one is left untouched."""
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n")
    if not header or header == ",".join(COLUMNS):
        return
    df = read_results(path)  # raises if it is not a harness report at all
    tmp = path.with_suffix(".csv.tmp")
    df.to_csv(tmp, index=False, lineterminator="\n")
    os.replace(tmp, path)


def _previous_report(out_dir: Path) -> list[str]:
    return [n for n in (RESULTS, META, FAILURES) if (out_dir / n).exists()]


def check_out_dir(path: str | os.PathLike, flag: str = "--out") -> None:
    """ReportError, in one line, when `path` cannot be a report directory: a file, a dangling symbolic link, a
    path under a file (or under a dangling link), a directory (or the nearest existing one above it) this
    process cannot write in."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ReportError(f"{flag} {str(p)!r} is a file; the report is a directory (results.csv and run_meta.json "
                          "are written inside it)")
    up = next((a for a in (p, *p.absolute().parents) if a.exists() or a.is_symlink()), None)
    if up is None:
        return
    where = f"{flag} {str(p)!r}" + ("" if up == p else f": {str(up)!r}")
    if up.is_symlink() and not up.exists():
        raise ReportError(f"{where} is a symbolic link to {os.readlink(up)!r}, which does not exist; create that "
                          f"directory or choose another {flag}")
    if not up.is_dir():
        raise ReportError(f"{where} is a file, not a directory; choose another {flag}")
    if not os.access(up, os.W_OK | os.X_OK):
        raise ReportError(f"{flag} {str(p)!r}: no permission to write in {str(up)!r}; choose another {flag}")


def _os_error(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written: one call unless the write comes up short (a full disk: then the next
    call raises)."""
    done = os.write(fd, data)
    while done < len(data):
        done += os.write(fd, data[done:])


class ReportWriter:
    """Appends result rows to `<out_dir>/results.csv` as cases finish and writes `run_meta.json`.

    Each `write(rows)` is one block sent with a single `os.write` on an O_APPEND descriptor, so a
    killed run keeps every finished (case, backend) and never half of one. The directory is locked
    (`fcntl.flock` on `<out_dir>/.lock`) for the writer's lifetime: a second run on it refuses. A
    fresh run refuses a directory holding a previous report unless `force` (then that report is
    replaced); with `resume=True` the report must have been made with the same selection
    (meta.check_resume; `resume_any` skips that check), the CSV is checked (CorruptReport names a bad
    line), a cut last line drops its (case, backend) to run again, and `completed` holds the pairs
    already there. Before each append the writer checks that `results.csv` is still the file it writes:
    one removed or replaced under the sweep is written again whole, from the writer's own descriptor (it
    holds every row: those read at resume and this run's), with a note in run_meta.json's
    `report_restored` and on stderr. A failing write (a full disk) is cut back to the last whole pair
    and raised as a ReportError naming the file.
    """

    def __init__(self, out_dir: str | os.PathLike, meta: Mapping | None = None, resume: bool = False,
                 force: bool = False, resume_any: bool = False):
        self.out_dir = Path(out_dir)
        check_out_dir(self.out_dir, "report directory")
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ReportError(f"cannot create the report directory {str(self.out_dir)!r}: {_os_error(e)}; "
                              "choose another --out") from None
        self.path = self.out_dir / RESULTS
        self.meta_path = self.out_dir / META
        self.completed: set[tuple[str, str]] = set()
        self.n_written = 0
        self.notes: list[str] = []
        self._fd = None
        self._lock = None
        self._meta_lock = threading.Lock()  # run_meta.json is written from harness run's meta thread too
        self._lock = _lock_dir(self.out_dir)
        try:
            self._open(meta, resume, force, resume_any)
        except OSError as e:
            self.close()
            raise ReportError(f"cannot write the report in {str(self.out_dir)!r}: {_os_error(e)} "
                              f"({e.filename or self.out_dir}); choose another --out") from None
        except BaseException:
            self.close()
            raise

    def _open(self, meta, resume: bool, force: bool, resume_any: bool) -> None:
        meta = dict(meta or {})
        previous_meta = None
        if resume and self.meta_path.exists():
            try:
                previous_meta = json.loads(self.meta_path.read_text())
            except ValueError:
                previous_meta = {}
            from .meta import check_resume  # noqa: PLC0415 - meta imports the environment probes

            changed = check_resume(previous_meta, meta) if isinstance(previous_meta, dict) else None
            if changed and not resume_any:
                raise ReportError(f"--resume: the report at {self.out_dir} was {changed}; use another --out, or "
                                  "--force to replace it (--resume-any mixes them)")
            if changed:
                meta["resumed_other_selection"] = changed
        if resume and self.path.exists():
            note = _drop_cut_pair(self.path)
            if note:
                self.notes.append(note)
            check_results(self.path)
            _upgrade_columns(self.path)
            self.completed = completed_pairs(self.path)
        else:
            previous = _previous_report(self.out_dir)
            if previous and not force and not resume:
                raise ReportError(f"{self.out_dir} holds a previous report ({', '.join(previous)}): pass --resume "
                                  "to continue it or --force to replace it")
            # A fresh run (or --force): drop the previous run's rows and failure artifacts.
            if self.path.exists():
                self.path.unlink()
            shutil.rmtree(self.out_dir / FAILURES, ignore_errors=True)
            shutil.rmtree(self.out_dir / "outputs", ignore_errors=True)  # harness.artefacts.OUTPUTS
        if previous_meta is not None:
            meta["resumed"] = int(previous_meta.get("resumed", 0) or 0) + 1
            meta["resumed_with_cases"] = len(self.completed)
        self.meta = meta
        self.write_meta()
        # Read-write, so that the rows can be read back from this descriptor if the file is removed (_restore).
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._need_header = os.fstat(self._fd).st_size == 0

    def write_meta(self, **updates) -> None:
        """(Re)write run_meta.json, merging `updates` into the stored meta."""
        with self._meta_lock:
            self.meta.update(updates)
            tmp = self.meta_path.with_suffix(".json.tmp")
            try:
                tmp.write_text(json.dumps(_clean(self.meta), indent=2, sort_keys=True) + "\n")
                os.replace(tmp, self.meta_path)
            except OSError as e:
                raise ReportError(f"cannot write {self.meta_path}: {_os_error(e)}; free space (or fix the error) "
                                  "and continue with --resume") from None

    def write(self, rows: Sequence[Mapping]) -> None:
        """Append the rows of one finished (case, backend) and flush them to the OS."""
        if not rows:
            return
        size = self._check_file()
        data = rows_to_csv_text(rows, header=self._need_header).encode("utf-8")
        try:
            _write_all(self._fd, data)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)  # never half a pair: --resume runs this one again
            raise ReportError(f"cannot append to {self.path}: {_os_error(e)}; it keeps the "
                              f"{len(self.completed)} (case, backend) pairs finished before, whole: free space (or "
                              "fix the error) and continue with --resume") from None
        self._need_header = False
        self.n_written += len(rows)
        for r in rows:
            self.completed.add(_pair_key(r.get("case_id"), r.get("backend")))

    def _check_file(self) -> int:
        """The size of the file this writer appends to, after writing it again at `self.path` if it was removed
        or replaced there since the last append."""
        held = os.fstat(self._fd)
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            there = None
        except OSError:  # e.g. the directory replaced by a file: mend what can be mended below
            there = None
        if there is not None and (there.st_ino, there.st_dev) == (held.st_ino, held.st_dev):
            return held.st_size
        return self._restore("removed" if there is None else "replaced", held.st_size)

    def _restore(self, how: str, size: int) -> int:
        data, pos = bytearray(), 0
        while pos < size:
            chunk = os.pread(self._fd, min(size - pos, 1 << 24), pos)
            if not chunk:
                break
            data += chunk
            pos += len(chunk)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)  # `rm -rf OUT` too
            self._relock()
            tmp = self.path.with_name(RESULTS + ".restore.tmp")
            fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, bytes(data))
                os.replace(tmp, self.path)
            except BaseException:
                os.close(fd)
                raise
        except OSError as e:
            raise ReportError(f"{self.path} was {how} under the running sweep and cannot be written again: "
                              f"{_os_error(e)}; the sweep stops (its rows up to now are lost with it)") from None
        os.close(self._fd)
        self._fd = fd
        rows = max(0, data.count(b"\n") - 1)
        note = (f"{self.path} was {how} while the sweep wrote it; wrote it again from the writer's own copy "
                f"({rows} rows, {len(data)} bytes)")
        self.notes.append(note)
        print(f"harness: {note}", file=sys.stderr)
        self.write_meta(report_restored=[*self.meta.get("report_restored", []), note])
        return len(data)

    def _relock(self) -> None:
        """Lock `<out_dir>/.lock` again if it is no longer the file this writer holds (a removed directory)."""
        try:
            there = os.stat(self.out_dir / LOCK)
        except FileNotFoundError:
            there = None
        held = os.fstat(self._lock)
        if there is None or (there.st_ino, there.st_dev) != (held.st_ino, held.st_dev):
            fd = _lock_dir(self.out_dir)  # ReportError if another run took the directory meanwhile
            os.close(self._lock)
            self._lock = fd

    def is_complete(self, case_id: str, backend: str) -> bool:
        return _pair_key(case_id, backend) in self.completed

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    def __enter__(self) -> "ReportWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pair_key(case_id, backend) -> tuple[str, str]:
    """(case_id, backend) as the report holds them (sanitized), for comparing with completed_pairs."""
    return sanitize_cell(str(case_id)), sanitize_cell(str(backend))


def _lock_dir(out_dir: Path, flag: str = "--out") -> int:
    """An exclusive, non-blocking flock on `<out_dir>/.lock` (released when the descriptor closes,
    also when the process is killed); ReportError if another run holds it."""
    import fcntl  # noqa: PLC0415 - POSIX only

    fd = os.open(out_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise ReportError(f"{out_dir} is in use by another run (pid {escape_text(holder) or '?'}); wait for it to "
                          f"end or choose another {flag}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _held_by(out_dir: Path) -> str | None:
    """The pid of the run holding `<out_dir>/.lock`, or None when no run holds it (the lock is not taken)."""
    import fcntl  # noqa: PLC0415 - POSIX only

    try:
        fd = os.open(out_dir / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return escape_text(os.pread(fd, 64, 0).decode("ascii", "replace").strip()) or "?"
    finally:
        os.close(fd)  # also releases the shared lock just taken
    return None


# ----------------------------------------------------------------------------------------------
# Reading, summarising, diffing, merging
# ----------------------------------------------------------------------------------------------


def results_path(path: str | os.PathLike) -> Path:
    """`path` itself if it is a CSV file, else `<path>/results.csv`."""
    p = Path(path)
    return p if p.suffix == ".csv" else p / RESULTS


def read_results(path: str | os.PathLike, *, checked: bool = False) -> pd.DataFrame:
    """A report as a DataFrame with COLUMNS: text columns as str ('' when empty), metrics as floats.
    The file is checked first (`check_results`), unless `checked`: the caller wrote it under the report's
    lock, which checked any earlier part (ReportWriter with resume), as `harness run` does at its end."""
    p = results_path(path)
    if not p.exists():
        raise FileNotFoundError(f"no report at {p} (expected a results.csv written by `python -m harness run`)")
    if not checked:
        check_results(p)
    if p.stat().st_size == 0:
        return pd.DataFrame({c: pd.Series(dtype=float if c in NUMERIC_COLUMNS else str) for c in COLUMNS})
    df = pd.read_csv(p, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False, na_values={c: [""] for c in NUMERIC_COLUMNS})
    missing = [c for c in COLUMNS if c not in df.columns and c not in LATER_COLUMNS]
    if missing:
        raise ValueError(f"{p} is not a harness report: columns {missing} are missing (schema: reports/README.md)")
    for c in LATER_COLUMNS:
        if c not in df.columns:
            df[c] = float("nan") if c in NUMERIC_COLUMNS else ""
    for c in NUMERIC_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    for c in INT_COLUMNS:
        df[c] = df[c].astype("Int64")
    return df[list(COLUMNS)]


def completed_pairs(path: str | os.PathLike) -> set[tuple[str, str]]:
    """(case_id, backend) pairs that already have rows in a report (for --resume)."""
    p = results_path(path)
    if not p.exists() or p.stat().st_size == 0:
        return set()
    df = pd.read_csv(p, usecols=["case_id", "backend"], dtype=str, keep_default_na=False)
    return set(zip(df["case_id"], df["backend"], strict=True))


def _pairs(df: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame, np.ndarray]:
    """(pair number of each row, the first row of each pair, each pair's worst_status), pairs of (case_id,
    backend) numbered in order of first appearance; `df` has a RangeIndex. Column operations: worst_status picks
    the first row of the worst rank, as idxmax does (info counts as pass)."""
    keys = ["case_id", "backend"]
    pair = df.groupby(keys, sort=False).ngroup()
    first = df.drop_duplicates(keys)
    status = df["status"].astype(str)
    status = status.where(status != "info", "pass")
    rank = status.map(_RANK).fillna(_RANK["error"]).astype(int)  # status_rank of each row, as one dict lookup
    worst = rank.groupby(pair).idxmax()
    return pair, first, status.to_numpy()[worst.sort_index().to_numpy()]


def case_status(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (case_id, backend), in order of first appearance: scheme (its first row's) and the worst
    status of its rows (worst_status)."""
    if df.empty:
        return pd.DataFrame(columns=["case_id", "backend", "scheme", "status"])
    _, first, status = _pairs(df.reset_index(drop=True))
    out = first[["case_id", "backend", "scheme"]].reset_index(drop=True)
    out["status"] = status
    return out


SEVERITIES = ("exact", "convention", "equivalent", "degraded", "broken")  # harness.verdict.SEVERITIES


def pair_severity(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (case_id, backend), in order of first appearance: scheme, distribution, status (worst_status
    of its rows), severity and matches_convention (its first row's), the mismatch classes of its rows (sorted,
    `exception` for an error), worst delta_sqnr_db of its accuracy rows. Column operations, so a nightly report
    (132k rows) takes a second, not a Python step per pair."""
    cols = ["case_id", "backend", "scheme", "distribution", "status", "severity", "matches_convention", "classes",
            "worst_delta_sqnr_db"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df.reset_index(drop=True)
    pair, first, status = _pairs(df)
    out = first[["case_id", "backend", "scheme", "distribution"]].reset_index(drop=True)
    out["status"] = status
    out["severity"] = first["severity"].astype(str).to_numpy()
    out["matches_convention"] = first["matches_convention"].astype(str).to_numpy()
    names: dict[int, set[str]] = {}
    cells = df["mismatch_classes"]
    pair_no = pair.to_numpy()
    parsed: dict[str, list[str]] = {}  # the distinct cells (a nightly report: 88k cells, a few dozen distinct)
    nonempty = (cells.astype(bool) & cells.notna()).to_numpy()
    for p, cell in zip(pair_no[nonempty].tolist(), cells[nonempty].tolist(), strict=True):
        if cell not in parsed:
            try:
                parsed[cell] = list(json.loads(cell))
            except ValueError:
                parsed[cell] = [str(cell)]
        names.setdefault(p, set()).update(parsed[cell])
    for p in pair_no[(df["status"] == "error").to_numpy()].tolist():
        names.setdefault(p, set()).add("exception")
    out["classes"] = [",".join(sorted(names[i])) or "-" if i in names else "-" for i in range(len(out))]
    deltas = pd.to_numeric(df["delta_sqnr_db"], errors="coerce").where(df["kind"] == "accuracy")
    out["worst_delta_sqnr_db"] = deltas.groupby(pair).min().reindex(range(len(out))).to_numpy(dtype=float)
    return out[cols]


def summary(df: pd.DataFrame, ps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (scheme, backend): cases, the case counts per severity and per status, and the worst
    delta_sqnr_db (candidate SQNR minus the golden's; empty for the golden run itself). `ps`: the report's
    pair_severity, when the caller has it already."""
    cols = ["scheme", "backend", "cases", *SEVERITIES, "pass", "fail", "skip", "error", "worst_delta_sqnr_db"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    ps = pair_severity(df) if ps is None else ps
    counts = ps.groupby(["scheme", "backend"])["status"].value_counts().unstack(fill_value=0)
    for st in ("pass", "fail", "skip", "error"):
        if st not in counts.columns:
            counts[st] = 0
    sev = ps.groupby(["scheme", "backend"])["severity"].value_counts().unstack(fill_value=0)
    for sv in SEVERITIES:
        counts[sv] = sev[sv].reindex(counts.index, fill_value=0) if sv in sev.columns else 0
    counts["cases"] = counts[["pass", "fail", "skip", "error"]].sum(axis=1)
    counts["worst_delta_sqnr_db"] = ps.groupby(["scheme", "backend"])["worst_delta_sqnr_db"].min().reindex(counts.index)
    return counts.reset_index()[cols]


def verdict_groups(df: pd.DataFrame, ps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The non-exact (case, backend) pairs grouped by (severity, class, distribution, convention):
    backend, count, worst delta_sqnr_db and one example case id; worst severity first. `ps` as in summary."""
    cols = ["severity", "classes", "distribution", "matches_convention", "backend", "count", "worst_delta_sqnr_db",
            "example"]
    ps = pair_severity(df) if ps is None else ps
    ps = ps[ps["severity"].isin(SEVERITIES[1:])]
    if ps.empty:
        return pd.DataFrame(columns=cols)
    key = ["severity", "classes", "distribution", "matches_convention", "backend"]
    g = ps.groupby(key, sort=False).agg(count=("case_id", "size"), worst_delta_sqnr_db=("worst_delta_sqnr_db", "min"),
                                        example=("case_id", "first")).reset_index()
    g["_rank"] = g["severity"].map({s: -i for i, s in enumerate(SEVERITIES)})
    return g.sort_values(["_rank", "count"], ascending=[True, False], kind="stable")[cols].reset_index(drop=True)


def skip_reasons(df: pd.DataFrame) -> pd.DataFrame:
    """Skip reasons with their counts of (case, backend) pairs, most frequent first."""
    cols = ["backend", "count", "reason"]
    sk = df[df["status"] == "skip"] if not df.empty else df
    if sk.empty:
        return pd.DataFrame(columns=cols)
    g = sk.groupby(["backend", "reason"], sort=False).size().reset_index(name="count")
    return g.sort_values("count", ascending=False, kind="stable")[cols].reset_index(drop=True)


def skip_groups(df: pd.DataFrame, top: int | None = SKIP_TOP) -> tuple[pd.DataFrame, int]:
    """(the `top` most frequent skip reasons: count, reason, the backends giving it; how many distinct reasons
    there are in all). A reason is counted over every backend that gives it (its backend's name first, as
    `torch: ...`, is part of it), most frequent first."""
    cols = ["count", "reason", "backends"]
    sk = df[df["status"] == "skip"] if not df.empty else df
    if sk.empty:
        return pd.DataFrame(columns=cols), 0
    g = sk.groupby("reason", sort=False).agg(count=("case_id", "size"),
                                              backends=("backend", lambda b: ",".join(sorted(set(b)))))
    g = g.reset_index().sort_values("count", ascending=False, kind="stable")[cols].reset_index(drop=True)
    return (g if top is None else g.head(top)), len(g)


def _short(text: str, width: int = SKIP_REASON_WIDTH) -> str:
    """`text` cut in the middle to `width` characters (a reason's start and end both tell reasons apart)."""
    if len(text) <= width:
        return text
    head = (width - 5) // 2
    return text[:head] + " ... " + text[len(text) - (width - 5 - head):]


def format_skips(df: pd.DataFrame, top: int = SKIP_TOP) -> str:
    """The skip reasons, grouped: `count  reason` lines (the top `top`, reasons cut at SKIP_REASON_WIDTH), with one
    line saying how many more there are; '' without skips."""
    g, total = skip_groups(df, top)
    if not total:
        return ""
    n = int((df["status"] == "skip").sum())
    head = f"skip reasons: {n} skipped rows, {total} distinct reasons" + (f" (the {top} most frequent)" if total > top else "")
    g = g.assign(reason=[_short(r) for r in g["reason"]])
    lines = [head, format_table(g[["count", "reason"]])]
    if total > top:
        lines.append(f"... and {total - top} more reasons (harness.report.skip_reasons lists them all)")
    return "\n".join(lines)


def format_summary(df: pd.DataFrame) -> str:
    """The summary table, the grouped non-exact verdicts, then the skip reasons grouped and short (format_skips),
    as text: the verdict first, never pushed off the screen by skips."""
    ps = pair_severity(df)  # once for both tables
    parts = [format_table(summary(df, ps))]
    groups = verdict_groups(df, ps)
    if len(groups):
        parts += ["", "non-exact cases by severity x class x input distribution:", format_table(groups)]
    skips = format_skips(df)
    if skips:
        parts += ["", skips]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------
# CI policy: which severities pass (`--accept`, `[tool.numerics-harness] accept`)
# ----------------------------------------------------------------------------------------------

# `pass`: a pair whose status is pass (its conformance rows pass the byte comparison or the GEMM tolerance); a
# severity: a pair of that severity (docs/numerics.md §11). A skip never fails; an error is always `broken`.
ACCEPT_TOKENS = ("pass", *SEVERITIES)
# The default keeps the exit status of every earlier release: fail and error pairs fail the run, so a
# `convention` or `equivalent` quantizer (status fail) fails, and a GEMM inside the tolerance passes.
DEFAULT_ACCEPT = ("pass",)
PROJECT_FILE = "pyproject.toml"
PROJECT_TABLE = "numerics-harness"


def parse_accept(value, source: str = "--accept") -> tuple[str, ...]:
    """The accept list from a comma string or a list of strings; ReportError (one line, naming `source`) for an
    unknown word or an empty list."""
    if isinstance(value, str):
        words = [w.strip() for w in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(w, str) for w in value):
        words = [w.strip() for w in value]
    else:
        raise ReportError(f"{source}: expected a list of words from {', '.join(ACCEPT_TOKENS)}, got {value!r}")
    words = [w for w in words if w]
    bad = [w for w in words if w not in ACCEPT_TOKENS]
    if bad:
        hint = " (skips never fail: no word is needed for them)" if "skip" in bad else ""
        raise ReportError(f"{source}: {escape_text(', '.join(bad))} is not one of {', '.join(ACCEPT_TOKENS)}{hint}")
    if not words:
        raise ReportError(f"{source}: empty; give at least one of {', '.join(ACCEPT_TOKENS)}")
    return tuple(dict.fromkeys(words))


def project_accept(directory: str | os.PathLike = ".") -> tuple[str, ...] | None:
    """`accept` of `[tool.numerics-harness]` in `directory`/pyproject.toml, or None when it is not set there."""
    p = Path(directory) / PROJECT_FILE
    if not p.is_file():
        return None
    try:
        import tomllib  # noqa: PLC0415
    except ImportError:  # Python 3.10
        import tomli as tomllib  # noqa: PLC0415
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{p}: cannot read it ({escape_text(str(e))})") from None
    table = data.get("tool", {}).get(PROJECT_TABLE, {})
    if not isinstance(table, dict) or "accept" not in table:
        return None
    return parse_accept(table["accept"], f"{p} [tool.{PROJECT_TABLE}] accept")


def accept_policy(flag: str | None, directory: str | os.PathLike = ".") -> tuple[tuple[str, ...], str]:
    """(accept list, where it came from): the --accept flag, else the project file, else DEFAULT_ACCEPT."""
    if flag is not None:
        return parse_accept(flag), "--accept"
    from_project = project_accept(directory)
    if from_project is not None:
        return from_project, str(Path(directory) / PROJECT_FILE)
    return DEFAULT_ACCEPT, "default"


def unaccepted(df: pd.DataFrame, accept: Sequence[str], ps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The (case, backend) pairs (pair_severity rows) outside `accept`: not skipped, and neither of status pass with
    `pass` accepted nor of an accepted severity (an error pair's severity is `broken`, whatever its rows say; a
    pair with no severity and status pass, nothing judged, is accepted)."""
    ps = pair_severity(df) if ps is None else ps
    if ps.empty:
        return ps
    sev = ps["severity"].where(ps["status"] != "error", "broken")
    ok = (ps["status"] == "skip") | sev.isin(list(accept))
    if "pass" in accept:
        ok |= ps["status"] == "pass"
    ok |= (sev == "") & (ps["status"] == "pass")
    return ps[~ok].assign(severity=sev[~ok]).reset_index(drop=True)


def format_accept(bad: pd.DataFrame, accept: Sequence[str], source: str) -> str:
    """One line: the policy and how many pairs are outside it, by severity."""
    head = f"accept {','.join(accept)} ({source}): "
    if bad.empty:
        return head + "every (case, backend) pair within it"
    by = bad["severity"].replace("", "-").value_counts()
    return head + f"{len(bad)} (case, backend) pair(s) outside it (" + ", ".join(f"{k} {v}" for k, v in by.items()) + ")"


def time_split(df: pd.DataFrame) -> dict[str, float]:
    """Seconds the run spent, summed over its workers: inputs and golden once per case, and each
    backend's check_ms (its call, the comparison, the accuracy metrics) once per (case, backend)."""
    if df.empty:
        return {"inputs": 0.0, "golden": 0.0, "backends": 0.0}
    per_case = df.groupby("case_id")[["inputs_ms", "golden_ms"]].max()
    per_pair = df.groupby(["case_id", "backend"])["check_ms"].max()
    return {"inputs": float(per_case["inputs_ms"].sum()) / 1e3, "golden": float(per_case["golden_ms"].sum()) / 1e3,
            "backends": float(per_pair.sum()) / 1e3}


def format_time_split(df: pd.DataFrame) -> str:
    t = time_split(df)
    return (f"time in workers: inputs {t['inputs']:.1f} s, golden {t['golden']:.1f} s, "
            f"backends {t['backends']:.1f} s (calls, comparison, metrics)")


def format_table(df: pd.DataFrame) -> str:
    """A plain-text table (no extra dependency)."""
    if df.empty:
        return "(no rows)"

    def cell(v, col: str) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "-"
            # delta_sqnr_db: small differences matter (the equivalent bound is 0.01 dB), so 3 significant digits
            return (f"{v:.3g}" if v else "0") if col.endswith("delta_sqnr_db") else f"{v:.2f}"
        return escape_text(str(v))  # a backend's text (its name, a skip reason) never drives the terminal

    cols = list(df.columns)
    body = [[cell(v, c) for v, c in zip(row, cols, strict=True)] for row in df.itertuples(index=False)]
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def diff(old: pd.DataFrame, new: pd.DataFrame, sqnr_drop_db: float = SQNR_DROP_DB) -> tuple[list[str], list[str]]:
    """(regressions, notes) between two reports.

    Regressions: a (case, backend) in OLD and missing from NEW; a (case, backend) whose status got
    worse (pass < skip < fail < error); a (case, backend, tensor) whose n_mismatch went up; an
    accuracy row whose SQNR dropped by more than `sqnr_drop_db`. Notes: cases only in NEW.
    """
    regressions: list[str] = []
    notes: list[str] = []
    co, cn = case_status(old), case_status(new)
    m = co.merge(cn, on=["case_id", "backend"], how="outer", suffixes=("_old", "_new"), indicator="where")
    for r in m.itertuples(index=False):
        if r.where == "left_only":
            regressions.append(f"missing from NEW: {r.case_id} [{r.backend}] (was {r.status_old})")
        elif r.where == "right_only":
            notes.append(f"only in NEW: {r.case_id} [{r.backend}] ({r.status_new})")
        elif status_rank(r.status_new) > status_rank(r.status_old):
            regressions.append(f"status {r.status_old} -> {r.status_new}: {r.case_id} [{r.backend}]")
    key = ["case_id", "backend", "tensor"]
    rows = old[key + ["n_mismatch", "sqnr_db", "kind"]].merge(
        new[key + ["n_mismatch", "sqnr_db", "kind"]], on=key, suffixes=("_old", "_new")
    )
    for r in rows.itertuples(index=False):
        if pd.notna(r.n_mismatch_old) and pd.notna(r.n_mismatch_new) and r.n_mismatch_new > r.n_mismatch_old:
            regressions.append(
                f"mismatches {int(r.n_mismatch_old)} -> {int(r.n_mismatch_new)}: {r.case_id} [{r.backend}] {r.tensor}"
            )
        if pd.notna(r.sqnr_db_old) and pd.notna(r.sqnr_db_new) and r.sqnr_db_old - r.sqnr_db_new > sqnr_drop_db:
            regressions.append(
                f"SQNR {r.sqnr_db_old:.2f} -> {r.sqnr_db_new:.2f} dB (drop > {sqnr_drop_db} dB): "
                f"{r.case_id} [{r.backend}] {r.tensor}"
            )
    return [escape_text(t) for t in regressions], [escape_text(t) for t in notes]


def parse_pair(text: str) -> tuple[str, str]:
    """`A:B` (or `A,B`) -> (A, B): backend A's rows in OLD against backend B's in NEW."""
    parts = re.split(r"[:,]", str(text), maxsplit=1)
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise ReportError(f"--pair {escape_text(str(text))!r}: expected A:B, two backend names")
    return parts[0].strip(), parts[1].strip()


def pair_diff(old: pd.DataFrame, new: pd.DataFrame, a: str, b: str) -> tuple[list[str], list[str]]:
    """(differences, notes): backend `a`'s rows of OLD against backend `b`'s of NEW, case by case (OLD and NEW may
    be one report). A difference: a case whose status or severity differs, or a (case, tensor) whose n_mismatch
    differs; notes: cases only one side ran."""
    po, pn = pair_severity(old[old["backend"] == a]), pair_severity(new[new["backend"] == b])
    diffs: list[str] = []
    notes: list[str] = []
    m = po.merge(pn, on="case_id", how="outer", suffixes=("_a", "_b"), indicator="where")
    for r in m.itertuples(index=False):
        if r.where != "both":
            notes.append(f"only {a if r.where == 'left_only' else b} ran {r.case_id}")
        elif (r.status_a, r.severity_a) != (r.status_b, r.severity_b):
            diffs.append(f"{r.case_id}: {a} {r.status_a}/{r.severity_a or '-'}, {b} {r.status_b}/{r.severity_b or '-'}")
    rows = old[old["backend"] == a][["case_id", "tensor", "n_mismatch"]].merge(
        new[new["backend"] == b][["case_id", "tensor", "n_mismatch"]], on=["case_id", "tensor"], suffixes=("_a", "_b"))
    for r in rows.itertuples(index=False):
        if pd.notna(r.n_mismatch_a) and pd.notna(r.n_mismatch_b) and r.n_mismatch_a != r.n_mismatch_b:
            diffs.append(f"{r.case_id} {r.tensor}: mismatches vs golden {a} {int(r.n_mismatch_a)}, "
                         f"{b} {int(r.n_mismatch_b)}")
    return [escape_text(t) for t in diffs], [escape_text(t) for t in notes]


def _differing(x, y) -> int:
    """Elements of two same-shape, same-dtype tensors whose bytes differ."""
    import torch  # noqa: PLC0415

    if x.dtype.is_floating_point or x.dtype.is_complex:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        x, y = x.contiguous().view(width), y.contiguous().view(width)
    return int((x != y).sum())


def bitwise_diff(old_dir: str | os.PathLike, new_dir: str | os.PathLike, a: str, b: str) -> tuple[list[str], list[str]]:
    """(differences, notes): for every case with saved outputs (`run --keep-outputs`) of backend `a` in OLD and `b` in
    NEW, whether their bytes are identical: one line per differing case naming each tensor and its count of differing
    elements (or its shape / dtype change, or a tensor only one side has). Notes: cases only one side saved."""
    import torch  # noqa: PLC0415

    from .artefacts import OUTPUTS, safe_name  # noqa: PLC0415

    ro, rn = Path(old_dir) / OUTPUTS, Path(new_dir) / OUTPUTS
    if not ro.is_dir() or not rn.is_dir():
        missing = ro if not ro.is_dir() else rn
        raise ReportError(f"diff --bitwise: no {missing} (saved outputs): run with --keep-outputs")
    fa, fb = f"{safe_name(a)}.pt", f"{safe_name(b)}.pt"
    cases_a = {d.name for d in ro.iterdir() if (d / fa).is_file()}
    cases_b = {d.name for d in rn.iterdir() if (d / fb).is_file()}
    diffs, notes = [], [f"only {a} saved outputs for {c}" for c in sorted(cases_a - cases_b)]
    notes += [f"only {b} saved outputs for {c}" for c in sorted(cases_b - cases_a)]
    for c in sorted(cases_a & cases_b):
        x, y = torch.load(ro / c / fa, weights_only=True), torch.load(rn / c / fb, weights_only=True)
        found = []
        for k in sorted(set(x) | set(y)):
            if k not in x or k not in y:
                found.append(f"{k} only in {a if k in x else b}")
            elif x[k].shape != y[k].shape or x[k].dtype != y[k].dtype:
                found.append(f"{k} {tuple(x[k].shape)} {x[k].dtype} vs {tuple(y[k].shape)} {y[k].dtype}")
            else:
                n = _differing(x[k], y[k])
                if n:
                    found.append(f"{k} {n} of {x[k].numel()} elements differ")
        if found:
            diffs.append(f"{c}: " + "; ".join(found))
    if not cases_a & cases_b:
        notes.append(f"no case has saved outputs of both {a} (OLD) and {b} (NEW)")
    return [escape_text(t) for t in diffs], [escape_text(t) for t in notes]


def shard_problems(shards: Sequence[tuple[str, Mapping]]) -> list[str]:
    """What keeps shard reports ((dir, run_meta) pairs) from making one whole report: runs that did not finish;
    and among the reports of `--shard i/n` runs, an index 0..n-1 missing or given twice, different n, or a
    selection (meta.SHARD_KEYS: tier, cases file content, filter, backends) not the first shard's. Reports of
    runs without --shard (or without a run_meta.json) are not checked against the shards."""
    from .meta import SHARD_KEYS, describe, differences, selection_of  # noqa: PLC0415

    problems = []
    for d, m in shards:
        if "options" in m and m.get("finished") is not True:
            how = m.get("stopped") or "killed, or still running"
            problems.append(f"{d} is a sweep that did not finish ({how}; continue it with --resume)")
    sharded = []
    for d, m in shards:
        sel = selection_of(m)
        if not sel.get("shard"):
            continue
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(sel["shard"]))
        if not match:
            problems.append(f"{d} records --shard {str(sel['shard'])!r}, not i/n")
            continue
        sharded.append((d, sel, int(match.group(1)), int(match.group(2))))
    if not sharded:
        return problems
    ns = sorted({n for *_, n in sharded})
    if len(ns) > 1:
        problems.append("the shards split the selection in different numbers of slices: "
                        + ", ".join(f"{d} is --shard {i}/{n}" for d, _, i, n in sharded))
    else:
        n = ns[0]
        given: dict[int, list[str]] = {}
        for d, _, i, _ in sharded:
            given.setdefault(i, []).append(str(d))
        missing = [f"{i}/{n}" for i in range(n) if i not in given]
        if missing:
            problems.append(f"--shard {', '.join(missing)} of {n} missing")
        for i, dirs in sorted(given.items()):
            if len(dirs) > 1:
                problems.append(f"--shard {i}/{n} given {len(dirs)} times ({', '.join(dirs)})")
    d0, sel0 = sharded[0][0], sharded[0][1]
    for d, sel, _, _ in sharded[1:]:
        keys = differences(sel0, sel, SHARD_KEYS)
        if keys:
            problems.append(f"{d} was made with {' and '.join(describe(sel, k) for k in keys)}, {d0} with "
                            f"{' and '.join(describe(sel0, k) for k in keys)}")
    return problems


_NEEDS_SANITIZING = re.compile("^[=+\\-@\t\r]|" + _UNSAFE.pattern)


def _sanitize_frame(df: pd.DataFrame) -> pd.DataFrame:
    """sanitize_cell on every text cell of a report that needs it (a report written before the sanitizer)."""
    for c in TEXT_COLUMNS:
        col = df[c].astype(str)
        need = col.str.contains(_NEEDS_SANITIZING)
        if need.any():
            df.loc[need, c] = col[need].map(sanitize_cell)
    return df


def merge(out_dir: str | os.PathLike, shard_dirs: Sequence[str | os.PathLike], *, prefer: str | None = None,
          allow_incomplete: bool = False, notes: list[str] | None = None) -> pd.DataFrame:
    """Join shard reports into `out_dir`, under its lock (ReportError: one in use, a file, shards that are not one
    whole sweep (shard_problems; `allow_incomplete` lists them in `notes` and run_meta.json instead), a shard in
    use by a running sweep, or a (case_id, backend) pair in two shards unless `prefer` is "first" or "last": the
    rows of that pair are then all the first's or all the last's)."""
    out = Path(out_dir)
    check_out_dir(out, "merge OUT")
    if prefer not in (None, "first", "last"):
        raise ReportError(f"--prefer {prefer!r} is not first or last")
    shards = [Path(d) for d in shard_dirs]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"merge OUT {str(out)!r}: cannot create it: {_os_error(e)}; choose another OUT") from None
    lock = _lock_dir(out, "OUT")
    try:
        return _merge_locked(out, shards, prefer, allow_incomplete, notes if notes is not None else [])
    finally:
        os.close(lock)


def _merge_locked(out: Path, shards: list[Path], prefer, allow_incomplete: bool, notes: list[str]) -> pd.DataFrame:
    metas = []
    for d in shards:
        pid = None if d.resolve() == out.resolve() else _held_by(d)
        if pid:
            raise ReportError(f"shard {d} is in use by a running sweep (pid {pid}); merge it when that run ends")
        mp = d / META
        try:
            m = json.loads(mp.read_text()) if mp.exists() else {}
        except (ValueError, OSError):
            m = {}
        metas.append(m if isinstance(m, dict) else {})
    problems = shard_problems([(str(d), m) for d, m in zip(shards, metas, strict=True)])
    if problems and not allow_incomplete:
        raise ReportError(f"merge: the shards are not one whole sweep: {'; '.join(problems)}; merge every shard of "
                          "one selection (or pass --allow-incomplete)")
    notes += problems
    frames = []
    for i, d in enumerate(shards):
        f = read_results(d)
        f["_shard"] = i
        frames.append(f)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*COLUMNS, "_shard"])
    pair = df.groupby(["case_id", "backend"], sort=False).ngroup()
    in_shards = df.groupby(pair)["_shard"].agg(["min", "max"])
    overlap = in_shards[in_shards["min"] != in_shards["max"]]
    if len(overlap):
        if prefer is None:
            first = df[pair == overlap.index[0]].iloc[0]
            raise ReportError(
                f"merge: {len(overlap)} (case_id, backend) pair(s) are in more than one shard, e.g. "
                f"{escape_text(first['case_id'])} [{escape_text(first['backend'])}] in {shards[overlap['min'].iloc[0]]} "
                f"and {shards[overlap['max'].iloc[0]]}; pass --prefer first or --prefer last to say whose rows win")
        winner = in_shards["min" if prefer == "first" else "max"]
        df = df[df["_shard"].to_numpy() == winner.reindex(pair).to_numpy()]
        notes.append(f"{len(overlap)} (case_id, backend) pair(s) in more than one shard: the {prefer} shard's rows "
                     "kept (--prefer)")
    df = _sanitize_frame(df.drop(columns="_shard").reset_index(drop=True))
    meta = {"merged_from": [{"dir": str(d), **m} for d, m in zip(shards, metas, strict=True)], "prefer": prefer}
    if notes:
        meta["merge_notes"] = list(notes)
    tmp, tmp_meta = out / (RESULTS + ".merge.tmp"), out / (META + ".merge.tmp")
    try:
        df.to_csv(tmp, index=False, columns=list(COLUMNS), lineterminator="\n")
        tmp_meta.write_text(json.dumps(_clean(meta), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, out / RESULTS)
        os.replace(tmp_meta, out / META)
    except OSError as e:
        for t in (tmp, tmp_meta):
            with contextlib.suppress(OSError):
                t.unlink()
        raise ReportError(f"merge: cannot write the merged report in {out}: {_os_error(e)}") from None
    return df
