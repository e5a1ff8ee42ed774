"""Exceptions raised by the accounting package."""

from __future__ import annotations


class AccountingError(Exception):
    """Base class for every error raised by :mod:`accounting`."""


class InvalidParameterError(AccountingError, ValueError):
    """A parameter is outside the range for which the cited guarantee holds.

    The message names the parameter, the constraint and the value received, in the style
    "The 'epsilon' parameter of analytic_sigma must be a float in (0, inf). Got -1.0 instead."
    """

    def __init__(self, owner: str, name: str, constraint: str, value: object) -> None:
        self.owner = owner
        self.name = name
        self.constraint = constraint
        self.value = value
        super().__init__(
            f"The {name!r} parameter of {owner} must be {constraint}. Got {value!r} instead."
        )
