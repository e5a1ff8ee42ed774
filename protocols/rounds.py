"""Cutting a micro-batch at round boundaries: the loop every round-based learner runs.

Round-based learners (pan-acsa's batches, the PVEC learners' rounds, shuffle-gaussian's windows)
take records in rounds of public sizes; a micro-batch may end inside a round, and the next one
continues it. :func:`round_slices` yields the pieces of a micro-batch that each lie within one
round, so that a learner's loop only adds a piece and closes the round when the piece fills it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


def round_slices(rows: int, room: Callable[[], int]) -> Iterator[slice]:
    """Consecutive slices covering ``range(rows)``, none longer than ``room()``.

    ``room()`` is asked before each slice, after the caller has learned the previous one: it
    returns how many more records the round in progress takes (≥ 1; a learner may also cap it,
    e.g. at a scratch block's size). A slice therefore never straddles two rounds.
    """
    position = 0
    while position < rows:
        take = min(room(), rows - position)
        if take < 1:
            raise ValueError(f"round_slices: room() must be >= 1 while rows are left; got {take}")
        yield slice(position, position + take)
        position += take
