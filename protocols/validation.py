"""Constructor-argument checks for :mod:`protocols`, with the project's error message format.

The checks themselves are those of :mod:`panpriv.accounting.validation` (one implementation of each
constraint); this module only re-raises their errors as :class:`panpriv.protocols.errors.InvalidInputError`
so that callers of :mod:`protocols` catch one exception type. Messages read
"The 'epsilon' parameter of PanPrivateACSA must be a finite float in (0, inf). Got -1.0 instead."
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TypeVar

from panpriv.accounting import validation as _checks
from panpriv.accounting.errors import InvalidParameterError
from panpriv.protocols.errors import InvalidInputError

T = TypeVar("T")


Choice = TypeVar("Choice", bound=str)
"""A mode's ``Literal`` type: :func:`choice` returns the value typed as one of its options."""


def _protocol_error(check: Callable[..., T], *args: object) -> T:
    try:
        return check(*args)
    except InvalidParameterError as exc:
        raise InvalidInputError(str(exc)) from None


def message(owner: str, name: str, constraint: str, value: object) -> str:
    """The standard message naming the parameter, the constraint and the value received."""
    return f"The {name!r} parameter of {owner} must be {constraint}. Got {value!r} instead."


def positive(owner: str, name: str, value: object) -> float:
    """A finite float in (0, inf)."""
    return _protocol_error(_checks.positive, owner, name, value)


def nonnegative(owner: str, name: str, value: object) -> float:
    """A finite float in [0, inf)."""
    return _protocol_error(_checks.nonnegative, owner, name, value)


def open_unit(owner: str, name: str, value: object) -> float:
    """A float in (0, 1)."""
    return _protocol_error(_checks.open_unit, owner, name, value)


def positive_int(owner: str, name: str, value: object, minimum: int = 1) -> int:
    """An int (not bool) that is at least ``minimum``."""
    return _protocol_error(_checks.positive_int, owner, name, value, minimum)


def boolean(owner: str, name: str, value: object) -> bool:
    """A Python or numpy bool."""
    if not isinstance(value, bool):
        raise InvalidInputError(message(owner, name, "a bool", value))
    return value


def choice(owner: str, name: str, value: object, options: Collection[Choice]) -> Choice:
    """One of the strings in ``options`` (typed as the options' ``Literal`` type)."""
    for option in options:
        if value == option and isinstance(value, str):
            return option
    raise InvalidInputError(message(owner, name, f"one of {sorted(options)}", value))
