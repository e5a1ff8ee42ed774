"""Charging ahead: one durable budget write for several micro-batches of a sequential source.

A charge must be durable before its records are learned, and the SQLite store's durable commit
costs about four fsyncs (a rollback journal, :mod:`panpriv.streamer.budget.store` says why). A
session (``panpriv run`` over a source read in order, a scale-out worker over its partitions)
therefore charges a micro-batch's positions *and* the next ones, :data:`BATCHES` batches in all,
and lets the following micro-batches that fall inside that window through without a write.
Positions charged ahead but not learned are an over-count, never an under-count:

- a clean stop gives back whatever this process charged beyond the furthest position it learned
  and its final positions (it never learned those, even after a rewind:
  :meth:`panpriv.streamer.budget.store.BudgetStore.uncharge`); so does a worker whose partitions
  are revoked, or whose open batch is lost (before its records move to the lost instance: a
  window moved with them would let later records through uncharged);
- a crash leaves them beyond the process's durable marks, so the next process moves them to the
  intrusion-only lost instance with the rest (:mod:`panpriv.streamer.budget.rules`);
- a batch that does not continue in order (a rewind after a rebalance, a replay) is charged as a
  new use from its own start, and the window it leaves stays charged.

Against ``max_epsilon`` a window that would exceed the limit is not taken: the micro-batch alone is
charged and checked, so a run stops at exactly the batch it stopped at before.

How far ahead. At least :data:`BATCHES` micro-batches; a run that uses up its window in less than
half of :data:`WINDOW_S` doubles it for the next write (up to :data:`MAX_BATCHES`), one that takes
more than twice as long halves it again — a rule on the wall clock and public counts only, so
about one write per :data:`WINDOW_S` at any rate, and what a crash charges ahead is about
:data:`WINDOW_S` of reading. Eight JSON micro-batches of 1,024 records were read in about 0.1 s
and their write (four fsyncs, ~10 ms) cost 6.7 % of the service's time (issue 37).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

BATCHES = 8
"""Micro-batches charged by one write, at least."""

MAX_BATCHES = 256
"""Micro-batches charged by one write, at most."""

WINDOW_S = 0.5
"""The time one window of charges ahead should last (module docstring, "How far ahead")."""


class Lookahead:
    """Per (instance, data key), the positions charged but not learned yet: ``[low, high)``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._windows: dict[tuple[str, str], tuple[int, int]] = {}
        self._reached: dict[tuple[str, str], int] = {}  # the furthest position learned, per (instance, key)
        self._clock = clock
        self._batches = BATCHES  # micro-batches the next write charges
        self._written: float | None = None  # when the last window was charged

    def window(self, needed: Mapping[str, tuple[int, int]], ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """What the next write charges: ``needed`` :meth:`widened` to the current number of
        micro-batches, which adapts to how long the last window lasted (module docstring)."""
        now = self._clock()
        if self._written is not None:
            lasted = now - self._written
            if lasted < WINDOW_S / 2:
                self._batches = min(MAX_BATCHES, 2 * self._batches)
            elif lasted > 2 * WINDOW_S:
                self._batches = max(BATCHES, self._batches // 2)
        self._written = now
        return self.widened(needed, ranges, self._batches)

    def needed(self, instance: str, ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """The part of ``ranges`` (a micro-batch, data keys) not charged yet: per key, from the end
        of its window when the batch continues in order inside or at the end of it, else from the
        batch's own start; keys whose batch lies inside their window are left out."""
        needed: dict[str, tuple[int, int]] = {}
        for key, (start, stop) in ranges.items():
            low, high = self._windows.get((instance, key), (-1, -1))
            first = high if low <= start <= high else start
            if first < stop:
                needed[key] = (first, stop)
        return needed

    @staticmethod
    def widened(needed: Mapping[str, tuple[int, int]], ranges: Mapping[str, tuple[int, int]],
                batches: int = BATCHES) -> dict[str, tuple[int, int]]:
        """``needed`` extended to ``batches`` micro-batches of the size of ``ranges``."""
        return {key: (first, max(stop, ranges[key][0] + batches * (ranges[key][1] - ranges[key][0])))
                for key, (first, stop) in needed.items()}

    def learned(self, instance: str, ranges: Mapping[str, tuple[int, int]], charged: Mapping[str, tuple[int, int]]) -> None:
        """The micro-batch ``ranges`` goes on to be learned; ``charged`` is what was just charged for it."""
        for key, (_, stop) in ranges.items():
            self._reached[(instance, key)] = max(self._reached.get((instance, key), 0), stop)
            window = self._windows.get((instance, key))
            if key in charged:
                window = (stop, charged[key][1])
            elif window is not None:
                window = (stop, window[1])
            if window is not None:
                self._windows[(instance, key)] = window

    def reached(self, instance: str) -> dict[str, int]:
        """Per data key, the furthest position of ``instance`` learned by this process: nothing at
        or beyond it was learned here, even after a rewind (what may be given back)."""
        return {key: stop for (name, key), stop in self._reached.items() if name == instance}

    def forget(self, instance: str) -> None:
        """Drop ``instance``'s windows (given back): its next micro-batch is charged afresh."""
        for name, key in [k for k in self._windows if k[0] == instance]:
            del self._windows[(name, key)]
