"""panpriv.accounting.special (erfcx, ndtr from the C library's erf/erfc) against mpmath at 50 digits.

The Gaussian accountant's δ is only as accurate as these; scipy.special's are the comparison
(same tolerance), and the naive e^{t²}·erfc(t) is the positive control the tolerance rejects.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from panpriv.accounting.special import erf, erfcx, ndtr

EPS = 2.0**-52


def _exact_erfcx(t: float) -> float:
    with mpmath.workdps(50):
        x = mpmath.mpf(t)
        return float(mpmath.exp(x * x) * mpmath.erfc(x))


def _exact_ndtr(x: float) -> float:
    with mpmath.workdps(50):
        return float(mpmath.ncdf(mpmath.mpf(x)))


def _arguments() -> np.ndarray:
    rng = np.random.default_rng(20261126)
    return np.concatenate([
        rng.uniform(0.0, 8.0, 1500),
        rng.uniform(7.9, 8.1, 200),  # both sides of the switch to the asymptotic series
        np.exp(rng.uniform(math.log(8.0), math.log(1e8), 500)),
        [0.0, 1e-300, 1e-8, 0.5, 8.0, 26.5, 27.0, 1e150],
    ])


def test_erfcx_is_within_a_few_ulps_of_mpmath_everywhere_on_the_half_line() -> None:
    worst = max(abs(erfcx(t) - _exact_erfcx(t)) / _exact_erfcx(t) for t in _arguments())
    assert worst <= 4 * EPS


def test_the_tolerance_rejects_the_naive_product_that_rounds_t_squared() -> None:
    """Positive control: e^{fl(t²)}·erfc(t) errs by up to t²·2⁻⁵³ relative: 17 ulps near t = 8, beyond the 4 allowed."""
    ts = np.linspace(6.0, 7.99, 400)
    worst = max(abs(math.exp(t * t) * math.erfc(t) - _exact_erfcx(t)) / _exact_erfcx(t) for t in ts)
    assert worst > 10 * EPS


def test_erfcx_ends_and_refusals() -> None:
    assert erfcx(0.0) == 1.0
    assert erfcx(math.inf) == 0.0
    assert erfcx(1e10) == pytest.approx(1.0 / (1e10 * math.sqrt(math.pi)), rel=EPS)
    for bad in (-1e-300, -1.0, math.nan):
        with pytest.raises(ValueError, match="t >= 0"):
            erfcx(bad)


def test_erfcx_decreases() -> None:
    values = [erfcx(t) for t in np.linspace(0.0, 40.0, 4001)]
    assert all(later < earlier for earlier, later in zip(values, values[1:], strict=False))


def test_ndtr_has_the_relative_accuracy_of_scipys_in_both_tails() -> None:
    """Φ(x) for x ∈ [−37, 9] (Φ ≥ 1e-300, normal doubles): relative error ≤ 1e-12 (the rounding of
    x/√2 costs up to x²·2⁻⁵³ in the lower tail, as for scipy.special.ndtr)."""
    rng = np.random.default_rng(7)
    xs = np.concatenate([rng.uniform(-37.0, 9.0, 2000), [-37.0, -1.0, 0.0, 1.0, 9.0]])
    worst = max(abs(ndtr(x) - _exact_ndtr(x)) / _exact_ndtr(x) for x in xs)
    assert worst <= 1e-12
    assert ndtr(0.0) == 0.5


def test_erf_is_the_c_librarys() -> None:
    assert erf is math.erf
