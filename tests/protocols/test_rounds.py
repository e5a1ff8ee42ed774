"""Tests of panpriv.protocols.rounds.round_slices: the pieces of a micro-batch cut at round boundaries."""

from __future__ import annotations

import pytest

from panpriv.protocols.rounds import round_slices


def test_slices_cover_the_rows_in_order_and_never_straddle_a_round():
    """Rounds of sizes 4, 3, 5, ... with 2 records of the first already taken; 11 rows arrive."""
    sizes = iter([4, 3, 5, 5, 5])
    state = {"size": next(sizes), "filled": 2}
    pieces = []
    for rows in round_slices(11, lambda: state["size"] - state["filled"]):
        pieces.append((rows.start, rows.stop))
        state["filled"] += rows.stop - rows.start
        if state["filled"] == state["size"]:
            state["size"], state["filled"] = next(sizes), 0
    assert pieces == [(0, 2), (2, 5), (5, 10), (10, 11)]
    assert state == {"size": 5, "filled": 1}


def test_room_is_asked_after_each_piece_is_learned_and_may_be_capped():
    asked = []

    def room() -> int:
        asked.append(len(asked))
        return 3  # e.g. a scratch block's size

    assert [(s.start, s.stop) for s in round_slices(7, room)] == [(0, 3), (3, 6), (6, 7)]
    assert len(asked) == 3
    assert list(round_slices(0, room)) == [] and len(asked) == 3


def test_a_round_with_no_room_left_is_a_caller_bug_not_an_endless_loop():
    with pytest.raises(ValueError, match="room\\(\\) must be >= 1"):
        list(round_slices(5, lambda: 0))
