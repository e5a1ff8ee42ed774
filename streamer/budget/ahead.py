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
"""

from __future__ import annotations

from collections.abc import Mapping

BATCHES = 8
"""Micro-batches charged by one write."""


class Lookahead:
    """Per (instance, data key), the positions charged but not learned yet: ``[low, high)``."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], tuple[int, int]] = {}
        self._reached: dict[tuple[str, str], int] = {}  # the furthest position learned, per (instance, key)

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
    def widened(needed: Mapping[str, tuple[int, int]], ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """``needed`` extended to :data:`BATCHES` micro-batches of the size of ``ranges``."""
        return {key: (first, max(stop, ranges[key][0] + BATCHES * (ranges[key][1] - ranges[key][0])))
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
