"""Mechanisms and online learners (numpy array code only: no I/O, no Kafka, no clocks)."""

from protocols.errors import ProtocolError, InvalidInputError

__all__ = ["ProtocolError", "InvalidInputError"]
