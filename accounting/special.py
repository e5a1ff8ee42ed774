"""The error-function family the Gaussian accountant needs, from the standard library's ``math``.

``scipy.special`` costs 120–130 ms to import (most of it scipy's array-API layer, which pulls in
``numpy.f2py``, ``numpy.ma`` and ``numpy.testing``), a third of a ``panpriv run``'s start-up,
for three scalar functions. ``math.erf`` and ``math.erfc`` are the C library's (glibc: errors
below 1 ulp); what they do not give directly is built here:

* :func:`erfcx`, the scaled complementary error function e^{t²} erfc(t), for t ≥ 0 (the only
  arguments :mod:`panpriv.accounting.gaussian` uses). For t < 8, e^{t²}·erfc(t) with t² split exactly
  into hi + lo (Veltkamp/Dekker), so the exponent carries no rounding error and the product is
  within a few ulps. For t ≥ 8, the asymptotic series erfcx(t) = (1/(t√π)) Σ_{k≥0} (−1)^k
  (2k − 1)!!/(2t²)^k (Abramowitz & Stegun 7.1.23): at t = 8 its 30th term is below 1e-22 of the
  first, and smaller for larger t.
* :func:`ndtr`, the standard normal CDF Φ(x) = ½ erfc(−x/√2) (accurate in both tails: erfc of a
  positive argument has no cancellation, and for x ≥ 0 the result is ≥ ½).

The tests compare all three with mpmath at 50 digits (``tests/accounting/test_special.py``).
"""

from __future__ import annotations

import math

__all__ = ["erf", "erfcx", "ndtr"]

erf = math.erf

_SQRT_PI = math.sqrt(math.pi)
_SQRT2 = math.sqrt(2.0)
_VELTKAMP = 134217729.0  # 2^27 + 1: splits a double into two halves of 26 significant bits
_SERIES_FROM = 8.0
_SERIES_TERMS = 30


def _exact_square(t: float) -> tuple[float, float]:
    """(hi, lo) with hi = fl(t²) and hi + lo = t² exactly (Dekker's product by Veltkamp splitting)."""
    scaled = _VELTKAMP * t
    high = scaled - (scaled - t)
    low = t - high
    square = t * t
    return square, ((high * high - square) + 2.0 * high * low) + low * low


def erfcx(t: float) -> float:
    """e^{t²} erfc(t) for t ≥ 0, to a few ulps (see the module docstring); decreasing from 1 at 0."""
    if not t >= 0.0:
        raise ValueError(f"erfcx: needs t >= 0, got {t!r}")
    if t < _SERIES_FROM:
        square, residual = _exact_square(t)
        return math.exp(square) * math.erfc(t) * (1.0 + residual)
    if math.isinf(t):
        return 0.0
    x = 1.0 / (2.0 * t * t)
    total = 0.0
    term = 1.0
    for k in range(1, _SERIES_TERMS + 1):
        total += term
        term *= -(2 * k - 1) * x
    return total / (t * _SQRT_PI)


def ndtr(x: float) -> float:
    """Φ(x), the standard normal distribution function."""
    return 0.5 * math.erfc(-x / _SQRT2)
