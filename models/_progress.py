"""Progress reporting for model pulls (stderr only).

On a terminal: one self-redrawn line with model, part i/N, a bar over the
assembled bytes and the bytes pip has downloaded for the current part.
Elsewhere (logs, CI, pipes): one plain line per part, no carriage returns.
Disabled: silent.
"""
from __future__ import annotations

import shutil
import sys
import time
from typing import Optional, TextIO

MB = 1_000_000.0


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def fmt_mb(n: int) -> str:
    return f"{n / MB:.1f} MB"


class Reporter:
    """Reports one model pull.  All methods are cheap no-ops when disabled."""

    def __init__(
        self,
        name: str,
        total: int,
        nparts: int,
        enabled: bool = True,
        stream: Optional[TextIO] = None,
    ) -> None:
        self.name = name
        self.total = max(int(total), 1)
        self.nparts = nparts
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = enabled and _isatty(self.stream)
        self._idx = 0
        self._done = 0
        self._dl = 0
        self._phase = ""
        self._last_draw = 0.0
        self._drawn = False

    # -- plain messages -------------------------------------------------
    def message(self, text: str) -> None:
        if not self.enabled:
            return
        self._clear()
        print(f"pyspec: {text}", file=self.stream, flush=True)
        if self.tty and self._phase:
            self._draw(force=True)

    # -- pull lifecycle -------------------------------------------------
    def part_start(self, idx: int, requirement: str) -> None:
        self._idx = idx
        self._dl = 0
        self._phase = "downloading"
        self._draw(force=True)

    def downloading(self, nbytes: int) -> None:
        self._dl = nbytes
        self._draw()

    def extracting(self, done: int) -> None:
        if self._phase != "extracting":
            self._phase = "extracting"
            self._done = done
            self._draw(force=True)
            return
        self._done = done
        self._draw()

    def part_done(self, idx: int, requirement: str, nbytes: int, done: int) -> None:
        self._done = done
        if not self.enabled:
            return
        if self.tty:
            self._draw(force=True)
        else:
            print(
                f"pyspec: {self.name} part {idx}/{self.nparts} {requirement}: "
                f"{fmt_mb(nbytes)} ({fmt_mb(done)}/{fmt_mb(self.total)})",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        self._clear()
        self._phase = ""

    # -- drawing --------------------------------------------------------
    def _clear(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        width = shutil.get_terminal_size((80, 20)).columns
        frac = min(self._done / self.total, 1.0)
        head = f"{self.name} {self._idx}/{self.nparts} "
        tail = f" {self._done / MB:7.1f}/{self.total / MB:.1f} MB {int(frac * 100):3d}%"
        # Leave room for the longest suffix, so the bar keeps its width.
        barw = max(10, min(40, width - 1 - len(head) - 2 - len(tail) - 24))
        if self._phase == "downloading":
            tail += f"  downloading {self._dl / MB:6.1f} MB"
        elif self._phase:
            tail += f"  {self._phase}"
        fill = int(frac * barw)
        line = f"{head}[{'#' * fill}{'.' * (barw - fill)}]{tail}"
        self.stream.write("\r\x1b[K" + line[: max(width - 1, 20)])
        self.stream.flush()
        self._drawn = True
