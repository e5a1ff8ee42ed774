"""Mechanisms and online learners (numpy array code only: no I/O, no Kafka, no clocks)."""

from panpriv.protocols.errors import InvalidInputError, ProtocolError

__all__ = ["ProtocolError", "InvalidInputError"]
