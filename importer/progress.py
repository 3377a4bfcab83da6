"""Part: importer. The progress of a long import on stderr: rows done of the total, the share, the rate.

On a terminal one line is redrawn (``\\r``) a few times a second; otherwise (a log file, a pipe) a line
is printed every 10 s or so. Nothing is shown for an import that ends within its first second, so
small files stay quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """Call :meth:`start` per file, :meth:`advance` as rows are read (cheap), :meth:`finish` at the end."""

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool | None = None,
        quiet_s: float = 1.0,
        tty_every_s: float = 0.2,
        log_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.quiet_s = quiet_s
        self.every_s = tty_every_s if self.tty else log_every_s
        self.clock = clock
        self.label = ""
        self.total = 0
        self.done = 0
        self._began = clock()
        self._file_began = self._began
        self._next = self._began + quiet_s
        self._shown = False

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self._file_began = self.clock()

    def advance(self, rows: int) -> None:
        self.done += rows
        now = self.clock()
        if now >= self._next:
            self._next = now + self.every_s
            self._show(now)

    def _show(self, now: float) -> None:
        elapsed = max(now - self._file_began, 1e-9)
        share = f" ({100 * self.done / self.total:.0f} %)" if self.total else ""
        text = f"{self.label}: {self.done}/{self.total} rows{share}, {self.done / elapsed:,.0f} rows/s"
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    def finish(self) -> None:
        """Ends the redrawn line (a terminal), so that what follows starts on a line of its own."""
        if self._shown and self.tty:
            self.stream.write("\n")
            self.stream.flush()
        self._shown = False
