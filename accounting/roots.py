"""Brent's bracketing root finder in pure Python, so the Gaussian calibration needs no scipy.optimize.

:func:`panpriv.accounting.gaussian.analytic_sigma` runs on the start path of every pan-acsa run (the
default learner; :mod:`panpriv.accounting.discrete_gaussian` too, imported with it for ``noise="secure"``),
and importing ``scipy.optimize`` for their root searches costs 140–200 ms of a process start
(issue 18). :func:`brent_root` is Brent's method (Brent 1973, ch. 4) in the
formulation of SciPy's ``brentq`` (inverse quadratic extrapolation, secant and bisection steps,
tolerance ``xtol + rtol·|x|``), with the same floating-point operations in the same order, so it
returns the same double: ``tests/accounting/test_roots.py`` checks equality with
``scipy.optimize.brentq`` bit for bit on thousands of brackets and on the Gaussian calibrations
themselves. Every caller in :mod:`accounting` also verifies its result directly (the σ it returns
is stepped up until δ(σ) ≤ δ holds), so a root finder can only ever cost accuracy, not privacy.

References
----------
Brent, R. P. (1973), *Algorithms for Minimization Without Derivatives*, ch. 4.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["brent_root"]


def brent_root(
    f: Callable[[float], float], a: float, b: float, *, xtol: float, rtol: float, maxiter: int
) -> float:
    """A root of ``f`` in the bracket [a, b] (f(a), f(b) of opposite signs or zero), by Brent's method.

    Stops when the bracket is narrower than ``xtol + rtol·|x|`` around the best point x, or at an
    exact zero. Raises ValueError when f(a), f(b) have the same sign or f returns NaN, and
    RuntimeError after ``maxiter`` iterations without convergence (as ``scipy.optimize.brentq``).
    """
    if xtol <= 0.0 or rtol <= 0.0:
        raise ValueError(f"brent_root: tolerances must be positive (xtol={xtol!r}, rtol={rtol!r})")
    x_prev, x_best = float(a), float(b)
    f_prev, f_best = _value(f, x_prev), _value(f, x_best)
    if f_prev * f_best > 0.0:
        raise ValueError("brent_root: f(a) and f(b) must have different signs")
    if f_prev == 0.0:
        return x_prev
    if f_best == 0.0:
        return x_best
    # x_best: the best estimate; x_prev: the one before; x_other: the far end of the bracket
    # [x_best, x_other]. step_prev/step_last: the last two steps taken (they gate interpolation).
    x_other = f_other = step_prev = step_last = 0.0
    for _ in range(maxiter):
        if f_prev != 0.0 and f_best != 0.0 and (f_prev < 0.0) != (f_best < 0.0):
            x_other, f_other = x_prev, f_prev
            step_prev = step_last = x_best - x_prev
        if abs(f_other) < abs(f_best):
            x_prev, x_best, x_other = x_best, x_other, x_best
            f_prev, f_best, f_other = f_best, f_other, f_best
        tolerance = (xtol + rtol * abs(x_best)) / 2.0
        half_bracket = (x_other - x_best) / 2.0
        if f_best == 0.0 or abs(half_bracket) < tolerance:
            return x_best
        if abs(step_prev) > tolerance and abs(f_best) < abs(f_prev):
            if x_prev == x_other:  # secant step
                trial = -f_best * (x_best - x_prev) / (f_best - f_prev)
            else:  # inverse quadratic step through the three points
                slope_prev = (f_prev - f_best) / (x_prev - x_best)
                slope_other = (f_other - f_best) / (x_other - x_best)
                trial = -f_best * (f_other * slope_other - f_prev * slope_prev) / (
                    slope_other * slope_prev * (f_other - f_prev)
                )
            room = 3.0 * abs(half_bracket) - tolerance
            if 2.0 * abs(trial) < (abs(step_prev) if abs(step_prev) < room else room):
                step_prev, step_last = step_last, trial
            else:
                step_prev = step_last = half_bracket
        else:
            step_prev = step_last = half_bracket
        x_prev, f_prev = x_best, f_best
        if abs(step_last) > tolerance:
            x_best += step_last
        else:
            x_best += tolerance if half_bracket > 0.0 else -tolerance
        f_best = _value(f, x_best)
    raise RuntimeError(f"brent_root: no convergence in {maxiter} iterations (last x = {x_best!r})")


def _value(f: Callable[[float], float], x: float) -> float:
    """f(x) as a float; NaN is an error (no bracket can be kept through it)."""
    value = float(f(x))
    if math.isnan(value):
        raise ValueError(f"brent_root: f({x!r}) is NaN")
    return value
