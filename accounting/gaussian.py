"""Privacy of the Gaussian mechanism ``f(X) + N(0, σ² I)`` with ℓ₂-sensitivity Δ.

Four views of one mechanism:

* the exact privacy profile δ(ε) (Balle & Wang 2018; the same function as θ_γ in Sordello et al. 2021, Thm 1) and
  its two inverses, σ(ε, δ) and ε(σ, δ);
* the classic calibration of Cheu et al. 2022, Lemma C.5 (valid for ε < 1 only, and never smaller than the
  exact σ);
* the Rényi-DP curve α Δ²/(2σ²), for composition in :mod:`panpriv.accounting.rdp`.

Everything depends on Δ and σ only through r = Δ/σ. Numerics: δ(ε) is evaluated in log space with
the scaled complementary error function (see :func:`analytic_delta`), so δ down to the smallest
positive double, ε in the hundreds and σ/Δ up to 1e9 stay accurate to about 1e-13 relative
(checked against mpmath in the tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.roots import brent_root
from panpriv.accounting.special import erf, erfcx, ndtr
from panpriv.accounting.validation import float_array, nonnegative, open_unit, positive

__all__ = [
    "analytic_delta",
    "analytic_epsilon",
    "analytic_sigma",
    "classic_sigma",
    "rdp",
]

_SQRT2 = math.sqrt(2.0)
_LOG2 = math.log(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_RTOL = 4.0 * float(np.finfo(float).eps)  # the smallest relative tolerance Brent's method honours
_GAUSS_LEGENDRE_16 = tuple(zip(*(column.tolist() for column in np.polynomial.legendre.leggauss(16)), strict=True))


def _erfcx_slope(t: float) -> float:
    """g(t) = −erfcx′(t) = 2/√π − 2t·erfcx(t) for t ≥ 0, accurate to about 1e-14 relative.

    For t < 8 directly (cancellation costs ≤ 2t²·2⁻⁵² ≈ 3e-14); for t ≥ 8 by the asymptotic
    series g(t) = (2/√π) Σ_{k≥1} (−1)^{k+1} (2k−1)!!/(2t²)^k, whose first 30 terms leave a
    remainder below 1e-22 relative there (Abramowitz & Stegun 7.1.23).
    """
    if t < 8.0:
        return _TWO_OVER_SQRT_PI - 2.0 * t * erfcx(t)
    x = 1.0 / (2.0 * t * t)
    far = 0.0
    term = 1.0
    for k in range(1, 31):
        term *= -(2 * k - 1) * x
        far -= term
    return _TWO_OVER_SQRT_PI * far


def _erfcx_drop(u: float, h: float) -> float:
    """erfcx(u) − erfcx(u + h) for u ≥ 0, h > 0, without cancellation when h is small.

    erfcx decreases with slope −g (see ``_erfcx_slope``), so the drop is ∫_u^{u+h} g(t) dt. For
    h ≤ 1/2 that integral is taken by 16-point Gauss–Legendre (g is entire and varies on a scale
    ≥ 1, so the rule is exact to rounding). For h > 1/2 the plain difference is accurate (relative
    error ≲ (u + 1)·2⁻⁵²).
    """
    if h > 0.5:
        return erfcx(u) - erfcx(u + h)
    return 0.5 * h * math.fsum(
        weight * _erfcx_slope(u + 0.5 * h * (node + 1.0)) for node, weight in _GAUSS_LEGENDRE_16
    )


def _log_delta(epsilon: float, sigma: float, sensitivity: float) -> float:
    """log δ(ε) of the Gaussian mechanism, for validated arguments.

    With r = Δ/σ, a = r/2 − ε/r and b = a − r, δ = Φ(a) − e^ε Φ(b) (Balle & Wang 2018, Thm 8).
    Since b² − a² = 2ε, e^ε φ(b) = φ(a), and with Φ(x) = ½ e^{−x²/2} erfcx(−x/√2)

        δ = ½ e^{−a²/2} [erfcx(−a/√2) − erfcx(−b/√2)]          (exact identity),

    which never forms the two nearly-equal tiny numbers of the textbook form; used when a ≤ 0
    (small δ, large ε), with the erfcx drop taken by ``_erfcx_drop``. When a > 0 (then ε < r²/2
    and b = −r/2 − ε/r < 0), δ = [Φ(a) − Φ(b)] − (e^ε − 1)Φ(b) with
    Φ(a) − Φ(b) = ½[erf(a/√2) + erf(−b/√2)], a sum of two positive terms; δ is not small there
    unless r is, and then the subtracted term is O(r²) against a first term of order r.
    """
    r = sensitivity / sigma
    a = r / 2.0 - epsilon / r
    b = a - r
    if a <= 0.0:
        drop = _erfcx_drop(-a / _SQRT2, r / _SQRT2)
        return -0.5 * a * a - _LOG2 + math.log(drop) if drop > 0.0 else -math.inf
    mass = 0.5 * (erf(a / _SQRT2) + erf(-b / _SQRT2))
    return math.log(mass - math.expm1(epsilon) * ndtr(b))


def analytic_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """Exact δ(ε) of the Gaussian mechanism: the smallest δ for which it is (ε, δ)-DP.

    Parameters
    ----------
    epsilon : float
        Target ε ≥ 0.
    sigma : float
        Standard deviation σ > 0 of the noise added to every coordinate.
    sensitivity : float, default 1.0
        ℓ₂-sensitivity Δ > 0 of the released function between neighbouring datasets.

    Returns
    -------
    float
        δ(ε) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), in [0, 1).

    Notes
    -----
    This is the hockey-stick divergence between N(0, σ²) and N(Δ, σ²), tight in both directions.
    With γ = e^ε and r = Δ/σ it is θ_γ(r) = Q(log γ/r − r/2) − γ Q(log γ/r + r/2) of Sordello et al. 2021, Thm 1
    (Q = 1 − Φ). Computed in log space without cancellation (see ``_log_delta``): relative accuracy
    about 1e-13 for every r; results below the smallest positive double underflow to 0.

    References
    ----------
    Balle & Wang (2018), "Improving the Gaussian mechanism for differential privacy", Thm 8.
    Sordello et al. 2021 (Sordello, Bu, Dong, Su), Thm 1 (θ_γ).
    """
    owner = "analytic_delta"
    epsilon = _epsilon(owner, epsilon, allow_inf=True)
    sigma = positive(owner, "sigma", sigma)
    sensitivity = positive(owner, "sensitivity", sensitivity)
    if math.isinf(epsilon):
        return 0.0
    return math.exp(_log_delta(epsilon, sigma, sensitivity))


def analytic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise σ for which the Gaussian mechanism is (ε, δ)-DP.

    Parameters
    ----------
    epsilon : float
        Target ε ≥ 0.
    delta : float
        Target δ in (0, 1).
    sensitivity : float, default 1.0
        ℓ₂-sensitivity Δ > 0.

    Returns
    -------
    float
        σ with ``analytic_delta(epsilon, σ, sensitivity) <= delta`` (checked on the returned value)
        and within a few ulps of the exact root of δ(ε; σ) = δ.

    Notes
    -----
    δ(ε; σ) decreases in σ. The root of log δ(ε; σ) − log δ is bracketed in log σ and refined by
    Brent's method (:func:`panpriv.accounting.roots.brent_root`, pure Python: no scipy.optimize on the
    start path of a run); the result is then stepped up ulp by ulp (doubling steps) until the check
    above holds, so the answer is never a hair too small.

    References
    ----------
    Balle & Wang (2018), Thm 8 and Alg. 1 (analytic Gaussian mechanism).
    Sordello et al. 2021, Thm 1 (θ_γ with γ = e^ε).
    """
    owner = "analytic_sigma"
    epsilon = _epsilon(owner, epsilon, allow_inf=False)
    delta = open_unit(owner, "delta", delta)
    sensitivity = positive(owner, "sensitivity", sensitivity)
    log_target = math.log(delta)

    def excess(log_sigma: float) -> float:
        return _log_delta(epsilon, math.exp(log_sigma), sensitivity) - log_target

    log_sigma = _root_decreasing(excess, math.log(sensitivity))
    return _round_up(
        math.exp(log_sigma), lambda s: analytic_delta(epsilon, s, sensitivity) <= delta
    )


def analytic_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest ε for which the Gaussian mechanism with noise σ is (ε, δ)-DP.

    Parameters
    ----------
    sigma : float
        Noise standard deviation σ > 0.
    delta : float
        Target δ in (0, 1).
    sensitivity : float, default 1.0
        ℓ₂-sensitivity Δ > 0.

    Returns
    -------
    float
        ε ≥ 0 with ``analytic_delta(ε, sigma, sensitivity) <= delta`` (checked on the returned
        value); 0 when δ(0) ≤ δ already.

    References
    ----------
    Balle & Wang (2018), Thm 8. Sordello et al. 2021, Thm 1. The dp-accounting function
    ``gaussian_mechanism.get_epsilon_gaussian`` computes the same quantity (test oracle).
    """
    owner = "analytic_epsilon"
    sigma = positive(owner, "sigma", sigma)
    delta = open_unit(owner, "delta", delta)
    sensitivity = positive(owner, "sensitivity", sensitivity)
    if analytic_delta(0.0, sigma, sensitivity) <= delta:
        return 0.0
    log_target = math.log(delta)

    def excess(epsilon: float) -> float:
        return _log_delta(epsilon, sigma, sensitivity) - log_target

    high = 1.0
    while excess(high) > 0.0:
        high *= 2.0
    epsilon = brent_root(excess, 0.0, high, xtol=1e-15, rtol=_RTOL, maxiter=500)
    return _round_up(epsilon, lambda e: analytic_delta(e, sigma, sensitivity) <= delta)


def classic_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Classic Gaussian-mechanism calibration σ = Δ √(2 log(2/δ)) / ε of Cheu et al. 2022, Lemma C.5.

    Parameters
    ----------
    epsilon : float
        Target ε in (0, 1): the lemma (via Dwork & Roth 2014, Thm A.1) only holds for ε < 1.
    delta : float
        Target δ in (0, 1).
    sensitivity : float, default 1.0
        ℓ₂-sensitivity Δ > 0.

    Returns
    -------
    float
        σ with σ² = 2 Δ² log(2/δ) / ε².

    Notes
    -----
    Dwork & Roth's Thm A.1 states c² > 2 ln(1.25/δ); Cheu et al. 2022 uses the looser log(2/δ). Either is at
    least :func:`analytic_sigma` (the exact minimum), which the tests check.

    References
    ----------
    Cheu, Joseph, Mao & Peng (2022), Lemma C.5, used for the batch noise ζ of Alg. 6.
    """
    owner = "classic_sigma"
    epsilon = _real_in_open_unit_epsilon(owner, epsilon)
    delta = open_unit(owner, "delta", delta)
    sensitivity = positive(owner, "sensitivity", sensitivity)
    return sensitivity * math.sqrt(2.0 * math.log(2.0 / delta)) / epsilon


def rdp(
    orders: float | Sequence[float] | NDArray[np.float64], sigma: float, sensitivity: float = 1.0
) -> float | NDArray[np.float64]:
    """Rényi-DP curve of the Gaussian mechanism: ε(α) = α Δ² / (2σ²).

    Parameters
    ----------
    orders : float or sequence of float
        Rényi orders α > 1.
    sigma : float
        Noise standard deviation σ > 0.
    sensitivity : float, default 1.0
        ℓ₂-sensitivity Δ > 0.

    Returns
    -------
    float or NDArray[np.float64]
        A float for a scalar order, else an array of the same length as ``orders``.

    References
    ----------
    Mironov (2017), "Rényi differential privacy", Prop. 7. Liew & Takahashi 2022, Sec. 2 (Gaussian mechanism, used
    as the unshuffled baseline of Table 1).
    """
    owner = "gaussian.rdp"
    sigma = positive(owner, "sigma", sigma)
    sensitivity = positive(owner, "sensitivity", sensitivity)
    scalar = np.ndim(orders) == 0
    alphas = float_array(owner, "orders", orders, low=1.0, closed_low=False)
    values = alphas * sensitivity**2 / (2.0 * sigma**2)
    return float(values[0]) if scalar else values


def _epsilon(owner: str, epsilon: object, *, allow_inf: bool) -> float:
    """ε in [0, inf) (or [0, inf] when ``allow_inf``)."""
    if allow_inf and isinstance(epsilon, (int, float)) and epsilon == math.inf:
        return math.inf
    return nonnegative(owner, "epsilon", epsilon)


def _real_in_open_unit_epsilon(owner: str, epsilon: object) -> float:
    """ε in (0, 1), with the message naming ε rather than a probability."""
    value = positive(owner, "epsilon", epsilon)
    if value >= 1.0:
        raise InvalidParameterError(owner, "epsilon", "a float in (0, 1) (Cheu et al. 2022, Lemma C.5)", epsilon)
    return value


def _root_decreasing(excess: Callable[[float], float], start: float) -> float:
    """Root of a decreasing function of x, bracketed by steps of ±1 (a factor e in σ) from start."""
    low = high = start
    while excess(low) <= 0.0:
        low -= 1.0
    while excess(high) > 0.0:
        high += 1.0
    return brent_root(excess, low, high, xtol=1e-15, rtol=_RTOL, maxiter=500)


def _round_up(value: float, holds: Callable[[float], bool]) -> float:
    """The first of value, value + 1 ulp, + 2 ulp, + 4 ulp, … at which ``holds`` is true."""
    step = math.ulp(value)
    while not holds(value):
        value += step
        step *= 2.0
    return value
