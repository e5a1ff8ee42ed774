"""The logistic function σ(s) = 1/(1 + e^{−s}), elementwise, with numpy only.

The logistic loss's gradient and probabilities need σ for every record. ``scipy.special.expit``
computes the same formula with the C library's ``exp``, but importing ``scipy.special`` costs
120–130 ms of every process's start-up (see :mod:`panpriv.accounting.special`). Here the ``exp`` is
numpy's: on 10⁶ normal scores 1.9 % of the results differ from scipy's, by at most 2 ulps, and
both are within 2 ulps of the exact σ (checked with mpmath in ``tests/protocols/test_sigmoid.py``).
The exponent is capped at 709 (e^{709} is finite), so nothing overflows or warns; that changes σ
only for s < −709, where it is 1.2e-308 instead of a smaller subnormal number.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = ["expit"]

_LARGEST_EXPONENT = 709.0  # e^709 ≈ 8.2e307 < the largest double
_SCALAR_SIZE = 4


def expit(s: NDArray[np.float64], out: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """σ(s) = 1/(1 + e^{−s}) elementwise, into ``out`` (which may be ``s`` itself).

    Up to ``_SCALAR_SIZE`` elements (a per-record learner's one score) go through ``math.exp``,
    the C library's, as scipy's does: five numpy calls would cost 2–4 µs there, against 0.3 µs.
    """
    result = np.array(s, dtype=np.float64) if out is None else out
    if result.size <= _SCALAR_SIZE:
        for index, score in enumerate(np.ravel(s).tolist()):
            result.flat[index] = 1.0 / (1.0 + math.exp(min(-score, _LARGEST_EXPONENT)))
        return result
    np.negative(s, out=result)
    np.minimum(result, _LARGEST_EXPONENT, out=result)
    np.exp(result, out=result)
    result += 1.0
    return np.reciprocal(result, out=result)
