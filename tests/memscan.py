"""Read another process's writable memory and look for float64/int64 vectors in it.

This is the intruder of the pan-privacy threat model, made concrete: a one-time read of everything
the process can write to (heap, anonymous mappings, stack, data segments) through
``/proc/<pid>/maps`` and ``/proc/<pid>/mem``. It needs ptrace-read permission on the target (the
parent of the target, or root). Used by ``tests/protocols/test_memory_residue.py`` and
``benchmarks/memory_residue.py``.

Vectors are searched 8-byte aligned (numpy's buffers are at least 16-byte aligned, so every row of
a C-contiguous float64/int64 matrix is 8-byte aligned) and contiguous.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

MAX_RATIO = 1e4
"""find_difference tries vectors V with |V[0]| up to this multiple of the difference's scale."""

MIN_RATIO = 1e-3
"""find_difference ignores V smaller than this multiple of the difference's scale: W = c + (tiny
V) is a copy of c (reported by find_vector), not a decomposition into noise and clean parts."""

MAX_PAIRS = 50_000_000
"""Largest number of first-coordinate candidate pairs :meth:`Memory.find_difference` checks."""


def writable_regions(pid: int) -> list[tuple[int, int, str]]:
    """(start, end, name) of every writable mapping of process ``pid``."""
    regions = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(part, 16) for part in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if "w" in fields[1] and name not in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                regions.append((start, end, name))
    return regions


def read_memory(pid: int) -> bytes:
    """The concatenated contents of the writable mappings of ``pid`` (unreadable pages skipped)."""
    parts = []
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for start, end, _ in writable_regions(pid):
            try:
                mem.seek(start)
                parts.append(mem.read(end - start))
            except OSError:
                continue
    return b"".join(parts)


def child_memory_words(target: Callable[..., None], args: tuple[Any, ...], ready: str,
                       timeout: float = 120.0) -> NDArray[np.uint64]:
    """Run ``target(conn, *args)`` in a spawned child; once it sends ``ready`` on ``conn``, read its
    writable memory (:func:`read_memory`), then send it ``"done"`` (its cue to exit) and reap it.
    The memory as 8-byte words; a ``TimeoutError`` if the child is not ready in ``timeout`` s."""
    context = multiprocessing.get_context("spawn")
    here, there = context.Pipe()
    child = context.Process(target=target, args=(there, *args), daemon=True)
    child.start()
    try:
        if not here.poll(timeout) or here.recv() != ready:
            raise TimeoutError(f"{getattr(target, '__name__', target)}{args}: the child did not get to {ready!r}")
        assert child.pid is not None  # started
        raw = read_memory(child.pid)
    finally:
        here.send("done")
        child.join(30)
        if child.is_alive():
            child.kill()
    return np.frombuffer(raw[: len(raw) - len(raw) % 8], dtype=np.uint64)


def read_floats(pid: int, address: int, count: int) -> NDArray[np.float64]:
    """``count`` float64 values at ``address`` in process ``pid``."""
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        mem.seek(address)
        return np.frombuffer(mem.read(8 * count), dtype=np.float64).copy()


class Memory:
    """A snapshot of a process's writable memory as 8-byte words, with vector searches."""

    def __init__(self, raw: bytes) -> None:
        usable = len(raw) - len(raw) % 8
        self.floats = np.frombuffer(raw, dtype=np.float64, count=usable // 8)
        self.ints = self.floats.view(np.int64)
        magnitude = np.abs(self.floats)
        # Plausible float64 values only: zero, denormals (pointers and small integers read as
        # floats), huge values and NaN/inf are never a coordinate the searches start from.
        finite = np.flatnonzero((magnitude >= 1e-30) & (magnitude <= 1e30))
        del magnitude
        order = np.argsort(self.floats[finite], kind="stable")
        self._positions = finite[order]
        self._sorted = self.floats[self._positions]

    @property
    def size(self) -> int:
        return self.floats.size

    def _starting_between(self, low: float, high: float, p: int) -> NDArray[np.int64]:
        """Positions whose word lies in [low, high] (a plausible float, see __init__), sorted, and
        leaving room for p words."""
        lo = np.searchsorted(self._sorted, low, side="left")
        hi = np.searchsorted(self._sorted, high, side="right")
        starts = np.sort(self._positions[lo:hi])
        return starts[starts + p <= self.size]

    def find_vector(self, target: NDArray[np.float64], tolerance: float) -> list[int]:
        """Word positions i with |floats[i + k] − target[k]| ≤ tolerance for every k (target[0]
        must be a plausible float, |target[0]| ≥ 1e-30 + tolerance)."""
        p = target.size
        starts = self._starting_between(target[0] - tolerance, target[0] + tolerance, p)
        return [i for i in starts.tolist() if np.all(np.abs(self.floats[i : i + p] - target) <= tolerance)]

    def find_float_rows(self, low: NDArray[np.float64], high: NDArray[np.float64]) -> list[int]:
        """Word positions i with low[k] ≤ floats[i + k] ≤ high[k] for every k (low[0] ≥ 1e-30)."""
        p = low.size
        starts = self._starting_between(low[0], high[0], p)
        return [
            i
            for i in starts.tolist()
            if np.all((self.floats[i : i + p] >= low) & (self.floats[i : i + p] <= high))
        ]

    def find_difference(self, difference: NDArray[np.float64], tolerance: float) -> list[tuple[int, int]]:
        """Pairs (i, j) of word positions with floats[j + k] − floats[i + k] ≈ difference[k] for every
        k, within ``tolerance`` plus 8 ulps of the larger operand: a vector V and a vector W = V + c
        (for example a noise draw and the accumulator after the clean contribution c was added).
        Only V with max|V| ≥ :data:`MIN_RATIO`·max|c| and |V| ≤ :data:`MAX_RATIO`·max|c| count: beyond that, 8 ulps exceed c's
        scale and equal large vectors would match any small c."""
        p = difference.size
        scale = MAX_RATIO * float(np.max(np.abs(difference)))
        lo_value, hi_value = np.searchsorted(self._sorted, [-scale, scale])
        values, positions = self._sorted[lo_value:hi_value], self._positions[lo_value:hi_value]
        queries = values + difference[0]
        slack = tolerance + 8.0 * np.spacing(np.maximum(np.abs(queries), np.abs(values)))
        lo = np.searchsorted(self._sorted, queries - slack, side="left")
        hi = np.searchsorted(self._sorted, queries + slack, side="right")
        counts = hi - lo
        total = int(counts.sum())
        if total > MAX_PAIRS:
            raise RuntimeError(f"find_difference: {total} candidate pairs, more than MAX_PAIRS")
        first = np.repeat(positions, counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        second = self._positions[np.repeat(lo, counts) + offsets]
        keep = (first + p <= self.size) & (second + p <= self.size) & (first != second)
        first, second = first[keep], second[keep]
        found = []
        with np.errstate(invalid="ignore", over="ignore"):
            for i, j in zip(first.tolist(), second.tolist(), strict=True):
                v, w = self.floats[i : i + p], self.floats[j : j + p]
                bound = tolerance + 8.0 * np.spacing(np.maximum(np.abs(v), np.abs(w)))
                substantial = float(np.max(np.abs(v))) >= MIN_RATIO * scale / MAX_RATIO
                if substantial and np.all(np.abs(w - v - difference) <= bound) and np.all(np.abs(v) <= scale):
                    found.append((i, j))
        return found

    def find_int_rows(self, low: NDArray[np.int64], high: NDArray[np.int64]) -> list[int]:
        """Word positions i with low[k] ≤ ints[i + k] ≤ high[k] for every k (int64 vectors)."""
        p = low.size
        head = self.ints[: self.size - p + 1]
        candidates = np.flatnonzero((head >= low[0]) & (head <= high[0]))
        return [
            i
            for i in candidates.tolist()
            if np.all((self.ints[i : i + p] >= low) & (self.ints[i : i + p] <= high))
        ]

    def find_box(self, low: NDArray[np.float64], high: NDArray[np.float64]) -> NDArray[np.int64]:
        """Word positions i with low[k] ≤ floats[i + k] ≤ high[k] for every k, vectorised: the
        candidates for the first coordinate are narrowed coordinate by coordinate (fast for
        wide boxes, where :meth:`find_float_rows` would loop over many starts)."""
        p = low.size
        starts = self._starting_between(float(low[0]), float(high[0]), p)
        for k in range(1, p):
            values = self.floats[starts + k]
            starts = starts[(values >= low[k]) & (values <= high[k])]
        return starts

    def find_int_box(self, low: NDArray[np.int64], high: NDArray[np.int64]) -> NDArray[np.int64]:
        """:meth:`find_box` for int64 vectors."""
        p = low.size
        head = self.ints[: self.size - p + 1]
        starts = np.flatnonzero((head >= low[0]) & (head <= high[0]))
        for k in range(1, p):
            values = self.ints[starts + k]
            starts = starts[(values >= low[k]) & (values <= high[k])]
        return starts

    def _candidates(self, lo: NDArray[np.int64], hi: NDArray[np.int64], order: NDArray[np.int64],
                    p: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(target row, word position) of every sorted match ``lo[k] <= i < hi[k]`` of row k's first
        coordinate, mapped back through ``order`` to positions, keeping those with room for p words."""
        counts = hi - lo
        rows = np.repeat(np.arange(len(lo)), counts)
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        starts = order[np.repeat(lo, counts) + offsets]
        keep = starts + p <= self.size
        return rows[keep], starts[keep]

    def find_vectors(self, targets: NDArray[np.float64], tolerance: float) -> list[tuple[int, int]]:
        """(k, i) for every target row k found at word position i (|floats[i + j] − targets[k, j]|
        ≤ ``tolerance`` for every j), all rows at once: one sorted lookup of the first coordinates,
        then the candidates checked coordinate by coordinate."""
        p = targets.shape[1]
        firsts = targets[:, 0]
        lo = np.searchsorted(self._sorted, firsts - tolerance, side="left")
        hi = np.searchsorted(self._sorted, firsts + tolerance, side="right")
        rows, starts = self._candidates(lo, hi, self._positions, p)
        for j in range(1, p):
            close = np.abs(self.floats[starts + j] - targets[rows, j]) <= tolerance
            rows, starts = rows[close], starts[close]
        return list(zip(rows.tolist(), starts.tolist(), strict=True))

    def sorted_ints(self) -> NDArray[np.int64]:
        """Every word as an int64, sorted (computed once)."""
        if not hasattr(self, "_int_order"):
            self._int_order = np.argsort(self.ints, kind="stable")
            self._int_sorted = self.ints[self._int_order]
        return self._int_sorted

    def find_int_vectors(self, targets: NDArray[np.int64]) -> list[tuple[int, int]]:
        """:meth:`find_vectors` for exact int64 rows."""
        self.sorted_ints()
        p = targets.shape[1]
        lo = np.searchsorted(self._int_sorted, targets[:, 0], side="left")
        hi = np.searchsorted(self._int_sorted, targets[:, 0], side="right")
        rows, starts = self._candidates(lo, hi, self._int_order, p)
        for j in range(1, p):
            same = self.ints[starts + j] == targets[rows, j]
            rows, starts = rows[same], starts[same]
        return list(zip(rows.tolist(), starts.tolist(), strict=True))
