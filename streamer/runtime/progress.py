"""The progress line of a run: records, rate, ETA, current ε — counts and privacy numbers only.

On a terminal the line is redrawn in place (``\\r``) a few times a second; otherwise (a log file, a
pipe) one line is written every ``interval_s`` seconds. Nothing in it is computed from record
contents: records and rejects are counts, the rate and ETA come from positions and the clock, and
ε comes from the privacy ledger.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _epsilon(value: float) -> str:
    return "inf" if not math.isfinite(value) else f"{value:.3g}"


class Progress:
    """Render progress to ``stream``.

    Kept by hand rather than tqdm (issue 36): off a terminal this writes one plain line every
    ``interval_s`` (a log collector's line), where tqdm writes its carriage-return redraws into
    the file; and the line carries the ledger's ε, which tqdm would take as a free-form postfix.
    The rendering is the small part; the choice of what it shows is the part that matters here.

    Parameters
    ----------
    total
        Positions to reach the end (for the bar and ETA); ``None`` if unbounded or unknown.
    start
        Positions already consumed when this run started (a resume).
    tty
        Redraw in place; ``None``: ``stream.isatty()``.
    """

    WIDTH = 24

    def __init__(
        self,
        total: int | None,
        start: int = 0,
        stream: TextIO | None = None,
        tty: bool | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval_s = interval_s if interval_s is not None else (0.2 if self.tty else 10.0)
        self.total = total
        self.start = start
        self._t0 = time.monotonic()
        self._last = -math.inf
        self._drawn = False

    def update(self, records: int, rejected: int, position: int, epsilon: float, intrusion_epsilon: float, force: bool = False) -> None:
        """Redraw if ``interval_s`` has passed (or ``force``); ``position`` is in source positions."""
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        self.stream.write(("\r" if self.tty else "") + self.line(records, rejected, position, epsilon, intrusion_epsilon, now) + ("" if self.tty else "\n"))
        self.stream.flush()
        self._drawn = True

    def line(self, records: int, rejected: int, position: int, epsilon: float, intrusion_epsilon: float, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self._t0, 1e-9)
        done = position - self.start
        rate = done / elapsed
        parts = []
        if self.total:
            fraction = min(1.0, max(0.0, position / self.total))
            filled = int(round(fraction * self.WIDTH))
            parts.append(f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {fraction:6.1%}")
            eta = (self.total - position) / rate if rate > 0 else math.inf
        else:
            eta = math.nan
        parts.append(f"{records:,} records")
        if rejected:
            parts.append(f"{rejected:,} rejected")
        parts.append(f"{rate:,.0f}/s")
        parts.append(f"ETA {_duration(eta)}" if self.total else f"elapsed {_duration(elapsed)}")
        parts.append(f"ε = {_epsilon(epsilon)} (intrusion {_epsilon(intrusion_epsilon)})")
        return " | ".join(parts)

    def close(self) -> None:
        """End the in-place line."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
