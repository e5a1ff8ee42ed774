"""Exceptions raised by the protocols package."""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class for every error raised by :mod:`protocols`."""


class InvalidInputError(ProtocolError, ValueError):
    """An argument or an input array violates the mechanism's declared contract.

    The message names the parameter, the constraint and the value (or a summary of it).
    """
