"""Searching a noise level that meets a target guarantee.

Every privacy bound the learners use is monotone in its noise parameter, but only some have a
closed-form inverse. :func:`smallest_feasible` inverts any of them numerically and returns a value
at which the bound is *checked* to meet the target, so a calibrated learner never prints a
guarantee weaker than the one it was asked for.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from scipy.optimize import brentq

TOLERANCE = 1e-6
"""Default relative width of the final search interval."""


def smallest_feasible(epsilon_of: Callable[[float], float], target: float, rel_tol: float = TOLERANCE) -> float:
    """The smallest x > 0, to relative ``rel_tol``, with ``epsilon_of(x) <= target``.

    ``epsilon_of`` must be non-increasing in x and fall to at most ``target`` for large x. x is
    bracketed by doubling or halving from 1, the crossing is located by Brent's method in log x,
    and the result is then raised in steps of ``rel_tol`` until the inequality holds on the
    returned value itself (never past the bracket's feasible end).
    """
    epsilon_of = functools.cache(epsilon_of)  # Brent re-evaluates the bracket's ends
    high = 1.0
    while epsilon_of(high) > target:
        high *= 2.0
    low = high / 2.0
    while epsilon_of(low) <= target:
        high, low = low, low / 2.0
    root = brentq(lambda u: epsilon_of(math.exp(u)) - target, math.log(low), math.log(high), xtol=rel_tol / 4)
    x = math.exp(root)
    while x < high and epsilon_of(x) > target:
        x *= 1.0 + rel_tol
    return min(x, high)
