"""The least integer that passes a monotone test, by bisection.

Calibrations search integers this way: PVEC's noise trials b (:mod:`panpriv.accounting.binomial`), the
secure sum's share count m (:mod:`panpriv.protocols.secure_sum`), the last PNSGD step whose noise swamps
the model (:mod:`panpriv.protocols.pnsgd`).
"""

from __future__ import annotations

from collections.abc import Callable


def least_passing(low: int, high: int, passes: Callable[[int], bool]) -> int:
    """Least integer in (low, high] that passes, given that ``high`` passes, ``low`` does not (or
    is not to be tried), and ``passes`` is monotone (bisection)."""
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle
    return high
