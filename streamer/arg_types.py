"""Argument types shared by every ``panpriv`` command (``argparse`` ``type=`` callables).

Each raises :class:`argparse.ArgumentTypeError` with the rule and the text given, which argparse
prints as a usage error (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text})")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 (got {text})")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {text})")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port in [1, 65535], or 0 for "none"."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in [1, 65535], or 0 for none (got {text})")
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (learner options such as ``'{"radius": 16}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value
