"""Per-record clean scalars without residue: freed Python floats, numpy's broadcast buffers.

Freed Python floats
-------------------

pnsgd and checkin compute each record's margin ⟨θ, z⟩, slope φ′ and clipped slope on Python
floats (:func:`panpriv.protocols.scratch.scalar_dphi`: a numpy call on a one-element array costs
microseconds a record). Every such value is a float object, freed a moment later — and freeing
does not erase it. CPython (3.11–3.13) keeps up to 100 freed floats on a free list with their
values intact and hands the rest, like a freed numpy float64 scalar, back to its small-object
allocator (pymalloc), where a 32-byte block keeps its contents until reused. An intruder reading
the process after ``learn_many`` would find the last records' margins and slopes there.

The per-record loops reuse the same few objects record after record (each temporary is freed
before the next is made, and both the free list and pymalloc hand out the most recently freed
block first), so what remains is the last few records' values plus whatever a burst of
simultaneously live floats left behind. The loops therefore never hold per-record values in
Python lists (``ndarray.item(i)`` per record instead of ``tolist()``), and :func:`scrub_freed_floats`
then allocates fresh floats holding 0.0 — which takes the free list's entries and the most
recently freed small blocks first, writing 0.0 over each value — before freeing them again.

Broadcast operands of ufuncs
----------------------------
``M *= c[:, None]`` (one factor per row: a slope, a clip factor) makes numpy's ufunc machinery
copy the stride-0 operand into its iteration buffer — up to 8,192 elements, i.e. every row's
factor repeated p times — and free that buffer without erasing it: measured, all 128 factors of
a 128 × 21 product, and 390 of a 4,096 × 21 one, are left in freed memory. :func:`scale_rows`
writes the factors into a caller-owned work matrix with ``np.copyto`` (a plain strided
assignment, no buffer) and multiplies two arrays of the same shape (no buffer either); the
products are the same floating-point products, so the result is bitwise that of the broadcast.

Both rely on CPython's and numpy's implementations, not on a language guarantee;
``tests/protocols/test_scalar_residue.py`` checks the result the way an intruder would: it reads a
learner's memory after ``learn_many`` and looks for every record's norm, margin, slope, gradient
norm and clipped slope.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

SCRUB_FLOATS = 1024
"""Fresh floats allocated per scrub: the free list's 100 entries plus the most recently freed
small blocks of the 32-byte size class (about two pymalloc pools' worth of 32-byte blocks)."""

_ZEROS = np.zeros(SCRUB_FLOATS)


def scrub_freed_floats() -> None:
    """Allocate :data:`SCRUB_FLOATS` fresh Python floats equal to 0.0, then free them: every freed
    float on CPython's free list, and the most recently freed 32-byte small blocks, now hold 0.0
    instead of the value they had (see the module docstring). Costs about 10 µs."""
    zeros = _ZEROS.tolist()  # SCRUB_FLOATS new float objects, each written with 0.0
    del zeros


CALL_FLOATS = 64
"""Floats :func:`reserve_float_room` takes off the free list, and :func:`scrub_call_floats`
overwrites: more than one call of a per-record path holds at once."""

_CALL_ZEROS = np.zeros(CALL_FLOATS)


def reserve_float_room() -> list[float]:
    """Before a call that computes one record's scalars on Python floats (``learn_one``: a
    :func:`scrub_freed_floats` per record would cost more than the record): take
    :data:`CALL_FLOATS` floats off CPython's free list (at most 100 entries) and hold them, so
    that every float the call frees finds room on the list — none goes back to pymalloc, where
    the few fresh floats of :func:`scrub_call_floats` would not reach it. Pass the result to
    :func:`scrub_call_floats` once the call's own frame has ended."""
    return _CALL_ZEROS.tolist()


def scrub_call_floats(room: list[float]) -> None:
    """After the call: the floats it freed are the top of the free list (a stack: each of its
    temporaries was taken from the top and put back there, and it never held more than
    :data:`CALL_FLOATS` at once), so :data:`CALL_FLOATS` fresh floats equal to 0.0 take exactly
    those entries and write 0.0 over their values; then they and ``room`` are freed. About 1 µs,
    against 10–30 µs for :func:`scrub_freed_floats`."""
    zeros = _CALL_ZEROS.tolist()
    del zeros
    room.clear()


def scale_rows(rows: NDArray[np.float64], factors: NDArray[np.float64], work: NDArray[np.float64]) -> NDArray[np.float64]:
    """``rows[i] *= factors[i]`` for every row, in place, through ``work`` (same shape as
    ``rows``; it ends up holding the factors, so it must be a buffer the caller wipes), leaving
    no copy of the factors in numpy's freed iteration buffers (module docstring). Bitwise the
    same as ``rows *= factors[:, None]``."""
    np.copyto(work, factors[:, None])
    rows *= work
    return rows
