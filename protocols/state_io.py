"""Reading learners' state dicts back, with errors that name the entry and what was expected.

A state dict comes from a checkpoint file; before a learner trusts it, each entry is checked for
presence, type, shape and finiteness, and a failure raises :class:`InvalidInputError` naming the
learner, the entry, the constraint and the value (summarised for arrays).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols import validation as check
from panpriv.protocols.base import StateValue
from panpriv.protocols.errors import InvalidInputError


def _entry(owner: str, state: Mapping[str, StateValue], key: str) -> StateValue:
    if key not in state:
        raise InvalidInputError(f"{owner}.load_state_dict: the state lacks {key!r}")
    return state[key]


def read_int(owner: str, state: Mapping[str, StateValue], key: str, minimum: int = 0) -> int:
    """An integer entry (Python or numpy, not bool) that is at least ``minimum``."""
    value = _entry(owner, state, key)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidInputError(check.message(f"{owner}.load_state_dict", key, f"an int >= {minimum}", value))
    return int(value)


def read_float(owner: str, state: Mapping[str, StateValue], key: str) -> float:
    """A finite, non-negative float entry (ints are accepted)."""
    value = _entry(owner, state, key)
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not ok or not (math.isfinite(float(value)) and float(value) >= 0.0):
        raise InvalidInputError(check.message(f"{owner}.load_state_dict", key, "a finite float >= 0", value))
    return float(value)


def read_array(owner: str, state: Mapping[str, StateValue], key: str, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """A float array entry of the given shape with finite values (returned as a new array)."""
    value = _entry(owner, state, key)
    array = np.array(value, dtype=np.float64, copy=True)
    if array.shape != shape or not np.all(np.isfinite(array)):
        raise InvalidInputError(
            f"{owner}.load_state_dict: {key!r} must be finite floats of shape {shape}; got shape {array.shape}"
        )
    return array
