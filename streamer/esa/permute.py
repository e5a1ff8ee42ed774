"""The shuffler's permutation: uniform, from the operating system's entropy (Bittau et al. 2017 §3).

A Fisher–Yates shuffle (Knuth, TAOCP vol. 2, Alg. 3.4.2 P) driven by :class:`random.SystemRandom`,
whose every draw reads ``os.urandom``: no seed is ever held in the process, so neither a memory dump
of the shuffler nor the analyzer can reconstruct the permutation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_SYSTEM = random.SystemRandom()


def permuted(items: Sequence[T]) -> list[T]:
    """A uniformly random permutation of ``items`` (a new list)."""
    out = list(items)
    _SYSTEM.shuffle(out)
    return out
