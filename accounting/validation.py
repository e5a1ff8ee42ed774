"""Parameter checks shared by the accounting modules.

Each helper raises :class:`panpriv.accounting.errors.InvalidParameterError` naming the function that owns
the parameter, the parameter, the constraint and the value, and returns the value as a ``float``
(or ``int``) so call sites read ``sigma = positive(OWNER, "sigma", sigma)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.errors import InvalidParameterError


def _real(owner: str, name: str, value: object, constraint: str) -> float:
    """``value`` as a float that is not NaN, else raise with ``constraint`` in the message."""
    if isinstance(value, bool):
        raise InvalidParameterError(owner, name, constraint, value)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidParameterError(owner, name, constraint, value) from None
    if math.isnan(number):
        raise InvalidParameterError(owner, name, constraint, value)
    return number


def positive(owner: str, name: str, value: object) -> float:
    """A finite float in (0, inf)."""
    constraint = "a finite float in (0, inf)"
    number = _real(owner, name, value, constraint)
    if not (0.0 < number < math.inf):
        raise InvalidParameterError(owner, name, constraint, value)
    return number


def nonnegative(owner: str, name: str, value: object) -> float:
    """A finite float in [0, inf)."""
    constraint = "a finite float in [0, inf)"
    number = _real(owner, name, value, constraint)
    if not (0.0 <= number < math.inf):
        raise InvalidParameterError(owner, name, constraint, value)
    return number


def open_unit(owner: str, name: str, value: object) -> float:
    """A float in the open interval (0, 1), e.g. a δ or a failure probability γ."""
    constraint = "a float in (0, 1)"
    number = _real(owner, name, value, constraint)
    if not (0.0 < number < 1.0):
        raise InvalidParameterError(owner, name, constraint, value)
    return number


def in_range(
    owner: str, name: str, value: object, low: float, high: float, *, closed_low: bool, closed_high: bool
) -> float:
    """A float in the interval from ``low`` to ``high`` with the stated closedness."""
    constraint = (
        f"a float in {'[' if closed_low else '('}{low}, {high}{']' if closed_high else ')'}"
    )
    number = _real(owner, name, value, constraint)
    above = number >= low if closed_low else number > low
    below = number <= high if closed_high else number < high
    if not (above and below):
        raise InvalidParameterError(owner, name, constraint, value)
    return number


def positive_int(owner: str, name: str, value: object, minimum: int = 1) -> int:
    """An integer (Python or numpy, not bool) that is at least ``minimum``."""
    constraint = f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidParameterError(owner, name, constraint, value)
    return int(value)


def float_array(
    owner: str, name: str, values: object, *, low: float, closed_low: bool
) -> NDArray[np.float64]:
    """A non-empty 1-D array of finite floats, each above ``low`` (or equal when ``closed_low``)."""
    constraint = (
        f"a non-empty sequence of finite floats each {'>=' if closed_low else '>'} {low}"
    )
    if isinstance(values, (str, bytes)):
        raise InvalidParameterError(owner, name, constraint, values)
    try:
        listed = values if isinstance(values, np.ndarray) or not isinstance(values, Iterable) else list(values)
        array = np.atleast_1d(np.asarray(listed, dtype=np.float64))
    except (TypeError, ValueError):
        raise InvalidParameterError(owner, name, constraint, values) from None
    bounded = array >= low if closed_low else array > low
    if array.ndim != 1 or array.size == 0 or not np.all(np.isfinite(array)) or not np.all(bounded):
        raise InvalidParameterError(owner, name, constraint, values)
    return array
