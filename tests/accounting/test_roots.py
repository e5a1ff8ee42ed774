"""panpriv.accounting.roots.brent_root against its oracle, scipy.optimize.brentq: the same double, bit for bit.

The Gaussian calibration (panpriv.accounting.gaussian) uses brent_root so that a run's start path needs no
scipy.optimize; its σ and ε must therefore be exactly those of the scipy root search they replace,
on the calibration's own functions and on generic brackets (secant, inverse-quadratic and bisection
steps, roots at the ends, flat and steep functions).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy.optimize import brentq

from panpriv.accounting import gaussian
from panpriv.accounting.roots import brent_root

RTOL = 4.0 * float(np.finfo(float).eps)


def _both(f: Callable[[float], float], a: float, b: float, xtol: float = 1e-15, rtol: float = RTOL) -> tuple[float, float]:
    return brent_root(f, a, b, xtol=xtol, rtol=rtol, maxiter=500), float(brentq(f, a, b, xtol=xtol, rtol=rtol, maxiter=500))


def _generic(kind: int, p: float, q: float) -> Callable[[float], float]:
    if kind == 0:
        return lambda x: x**3 - p * x - q
    if kind == 1:
        return lambda x: math.tanh(p * (x - q))
    if kind == 2:
        return lambda x: math.exp(p * x) - q - 1.0
    if kind == 3:
        return lambda x: math.atan(x - q) + p * 1e-9 * x
    return lambda x: (x - q) ** 5 + p * (x - q)


def test_generic_brackets_are_bitwise_scipys() -> None:
    rng = np.random.default_rng(20240518)
    compared = 0
    for _ in range(4000):
        kind = int(rng.integers(5))
        p, q = float(rng.uniform(0.01, 5.0)), float(rng.uniform(-3.0, 3.0))
        a, b = float(rng.uniform(-20.0, -3.5)), float(rng.uniform(3.5, 20.0))
        f = _generic(kind, p, q)
        if f(a) * f(b) > 0.0:
            continue
        xtol, rtol = (1e-15, RTOL) if rng.random() < 0.5 else (float(10 ** rng.uniform(-12, -2)), 1e-10)
        mine, scipys = _both(f, a, b, xtol, rtol)
        assert mine == scipys, (kind, p, q, a, b, xtol, rtol)
        compared += 1
    assert compared > 3000


@pytest.mark.parametrize("epsilon", [1e-3, 0.05, 0.5, 1.0, 2.0, 8.0, 50.0, 120.0])
@pytest.mark.parametrize("delta", [1e-300, 1e-30, 1e-10, 1e-6, 1e-3, 0.3])
@pytest.mark.parametrize("sensitivity", [1e-3, 1.0, 2.0 / 7.0, 250.0])
def test_gaussian_calibration_roots_are_bitwise_scipys(epsilon: float, delta: float, sensitivity: float) -> None:
    """The two root searches of panpriv.accounting.gaussian, on their own functions and brackets."""
    log_target = math.log(delta)

    def sigma_excess(log_sigma: float) -> float:
        return gaussian._log_delta(epsilon, math.exp(log_sigma), sensitivity) - log_target

    low = high = math.log(sensitivity)
    while sigma_excess(low) <= 0.0:
        low -= 1.0
    while sigma_excess(high) > 0.0:
        high += 1.0
    mine, scipys = _both(sigma_excess, low, high)
    assert mine == scipys
    sigma = gaussian.analytic_sigma(epsilon, delta, sensitivity)
    assert gaussian.analytic_delta(epsilon, sigma, sensitivity) <= delta

    def epsilon_excess(eps: float) -> float:
        return gaussian._log_delta(eps, sigma * 0.5, sensitivity) - log_target

    top = 1.0
    while epsilon_excess(top) > 0.0:
        top *= 2.0
    if epsilon_excess(0.0) > 0.0:
        mine, scipys = _both(epsilon_excess, 0.0, top)
        assert mine == scipys


def test_ends_and_errors() -> None:
    assert brent_root(lambda x: x - 1.0, 1.0, 3.0, xtol=1e-12, rtol=RTOL, maxiter=50) == 1.0
    assert brent_root(lambda x: x - 3.0, 1.0, 3.0, xtol=1e-12, rtol=RTOL, maxiter=50) == 3.0
    with pytest.raises(ValueError, match="different signs"):
        brent_root(lambda x: x * x + 1.0, -1.0, 1.0, xtol=1e-12, rtol=RTOL, maxiter=50)
    with pytest.raises(ValueError, match="NaN"):
        brent_root(lambda x: math.nan if x > 0.5 else x - 0.7, 0.0, 1.0, xtol=1e-12, rtol=RTOL, maxiter=50)
    for finder, message in ((brent_root, "no convergence"), (brentq, "converge")):
        with pytest.raises(RuntimeError, match=message):
            finder(lambda x: math.exp(x) - 2.0, 0.0, 1.0, xtol=1e-15, rtol=RTOL, maxiter=2)
    with pytest.raises(ValueError, match="tolerances"):
        brent_root(lambda x: x, -1.0, 1.0, xtol=0.0, rtol=RTOL, maxiter=50)
