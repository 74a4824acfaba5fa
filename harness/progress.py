"""A tiny dependency-free progress bar on stderr: off when stderr is not a TTY unless forced.

Source: docs/design.md §5 (rows -> report writer, progress bar). Force it on with `force=True`
(`--progress`) or the environment variable NUMERICS_HARNESS_PROGRESS=1; force it off with 0.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import TextIO

ENV = "NUMERICS_HARNESS_PROGRESS"


def enabled(force: bool | None = None, stream: TextIO | None = None) -> bool:
    """Whether to draw: `force` if given, else the environment variable, else `stream.isatty()`."""
    if force is not None:
        return force
    env = os.environ.get(ENV)
    if env is not None and env != "":
        return env not in ("0", "false", "no", "off")
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """`[#####.....] 12/40  pass 10 fail 1 skip 1 error 0  0:00:07<0:00:16` redrawn in place."""

    def __init__(self, total: int, *, force: bool | None = None, stream: TextIO | None = None, width: int = 30,
                 label: str = ""):
        self.total = max(0, int(total))
        self.stream = stream or sys.stderr
        self.on = enabled(force, self.stream)
        self.width = width
        self.label = label
        self.done = 0
        self.counts: Counter[str] = Counter()
        self.start = time.monotonic()
        self._last_draw = 0.0
        self._last_len = 0
        self._closed = False

    def update(self, n: int = 1, status: str | None = None) -> None:
        """Advance by `n` finished items; `status` (pass/fail/skip/error) feeds the counters."""
        self.done += n
        if status is not None:
            self.counts[status] += n
        now = time.monotonic()
        if self.on and (now - self._last_draw > 0.1 or self.done >= self.total):
            self._last_draw = now
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        counts = " ".join(f"{s} {self.counts.get(s, 0)}" for s in ("pass", "fail", "skip", "error"))
        head = f"{self.label} " if self.label else ""
        return f"{head}[{bar}] {self.done}/{self.total}  {counts}  {_clock(elapsed)}<{_clock(eta)}"

    def _draw(self, now: float) -> None:
        text = self.line(now)
        pad = " " * max(0, self._last_len - len(text))
        self._last_len = len(text)
        self.stream.write("\r" + text + pad)
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line (once; later calls do nothing)."""
        if self.on and not self._closed:
            self._closed = True
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
