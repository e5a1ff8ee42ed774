"""Privacy of the discrete Gaussian mechanism ``q(x) + Y``, Y_j ~ N_Z(0, σ²) i.i.d., q integer-valued.

The discrete Gaussian N_Z(0, σ²) puts mass ∝ exp(−y²/(2σ²)) on each integer y. It is sampled
exactly, without floating point, by :mod:`panpriv.protocols.discrete_gaussian`; this module gives its
guarantees (Canonne, Kamath & Steinke 2020, "CKS" below):

* **zCDP, any dimension** (CKS Thm 14; Thm 4 in one dimension): if q maps into Z^p and
  ‖q(x) − q(x')‖₂ ≤ Δ for neighbours, the mechanism is ρ-zCDP with ρ = Δ²/(2σ²) — the same ρ as
  the continuous Gaussian. Why, in two lines: for an integer shift μ,
  D_α(N_Z(0, σ²) ‖ N_Z(μ, σ²)) ≤ αμ²/(2σ²) (completing the square leaves a normaliser at a
  non-integer centre, which is at most the one at an integer centre), and Rényi divergences of
  independent coordinates add. CKS's multivariate corrections (a term 10·Σ_k e^{−2π²σ²k/(k+1)})
  concern *sums* of discrete Gaussians (the distributed setting of Kairouz, Liu & Steinke 2021);
  they do not apply here, where one discrete Gaussian vector is added centrally.
* **zCDP → (ε, δ)** (CKS Cor. 13, arXiv v4; the ρ-zCDP case of their Prop. 12, the RDP
  conversion δ = exp((α − 1)(ε_α − ε))/α · (1 − 1/α)^(α−1) that dp-accounting also implements,
  with ε_α = αρ): ρ-zCDP implies (ε, δ)-DP for
  δ = inf_{α>1} exp((α − 1)(αρ − ε)) / (α − 1) · (1 − 1/α)^α, tighter than the classic
  ε = ρ + 2√(ρ log(1/δ)) (Bun & Steinke 2016, Prop. 1.3). This is what the multivariate mechanism
  gets: the exact δ(ε) of a p-dimensional discrete Gaussian depends on the direction of the shift.
* **exact δ(ε) in one dimension** (CKS Thm 7): for integer sensitivity Δ,
  δ = P[Y > εσ²/Δ − Δ/2] − e^ε P[Y > εσ²/Δ + Δ/2], computed here as
  Σ_{y : L(y) > ε} P(y)(1 − e^{ε − L(y)}) with L(y) = (Δ² − 2Δy)/(2σ²) (every term positive).
* **calibration**: the smallest integer σ² (in grid units²) for which the multivariate mechanism
  with ℓ2 sensitivity Δ is (ε, δ)-DP through the two results above.

Numerics: these are functions of public parameters, evaluated in double precision. Cor. 13 holds
for *every* α > 1, so an imprecise minimiser only loosens δ; the calibration check keeps a relative
margin of :data:`DELTA_MARGIN` on δ for the rounding of the final evaluation.

References
----------
Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
arXiv:2004.00010 (theorem numbers of v4), Thms 4, 7, 14, Prop. 12 and Cor. 13.
Bun & Steinke (2016), "Concentrated differential privacy: simplifications, extensions, and lower
bounds", TCC 2016, arXiv:1605.02065, Prop. 1.3.
"""

from __future__ import annotations

import math

import numpy as np

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.roots import brent_root
from panpriv.accounting.validation import nonnegative, open_unit, positive, positive_int

__all__ = [
    "DELTA_MARGIN",
    "calibrate_sigma2",
    "delta_one_dimensional",
    "epsilon_for_sigma2",
    "rho",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_rho",
]

DELTA_MARGIN = 1e-9
"""Relative margin kept on δ when a calibration checks its result (double-precision evaluation
of Cor. 13 is accurate to about 1e-14 relative; the margin costs nothing measurable in σ)."""

_MAX_ONE_DIM_SIGMA2 = 1e10
"""Largest σ² for :func:`delta_one_dimensional` (it sums about 80σ probabilities)."""


def rho(sigma2: float, sensitivity: float) -> float:
    """ρ = Δ²/(2σ²): the zCDP of adding N_Z(0, σ²) to each coordinate of an integer vector of ℓ2
    sensitivity Δ (CKS 2020, Thm 14; Thm 4 for one coordinate).

    Parameters
    ----------
    sigma2 : float
        σ² > 0 of every coordinate (grid units²).
    sensitivity : float
        Δ > 0, a bound on ‖q(x) − q(x')‖₂ over neighbours, q(x) ∈ Z^p.
    """
    owner = "discrete_gaussian.rho"
    sigma2 = positive(owner, "sigma2", sigma2)
    sensitivity = positive(owner, "sensitivity", sensitivity)
    return sensitivity * sensitivity / (2.0 * sigma2)


def _log_delta_at(alpha: float, rho_: float, epsilon: float) -> float:
    """log of exp((α − 1)(αρ − ε)) (1 − 1/α)^α / (α − 1), the bound of CKS Cor. 13 at order α."""
    return (alpha - 1.0) * (alpha * rho_ - epsilon) + alpha * math.log1p(-1.0 / alpha) - math.log(alpha - 1.0)


def _best_order(rho_: float, epsilon: float) -> float:
    """The α minimising the Cor. 13 bound: the root of (2α − 1)ρ − ε + log(1 − 1/α), which
    increases in α (the bound is log-convex in α). The root lies above (1 + ε/ρ)/2."""
    def slope(alpha: float) -> float:
        return (2.0 * alpha - 1.0) * rho_ - epsilon + math.log1p(-1.0 / alpha)

    low = 1.0 + 1e-12
    high = max(2.0, (epsilon + 1.0) / (2.0 * rho_) + 2.0)
    while slope(high) < 0.0:
        high *= 2.0
    if slope(low) >= 0.0:
        return low
    return brent_root(slope, low, high, xtol=1e-14, rtol=4.0 * float(np.finfo(float).eps), maxiter=500)


def zcdp_delta(rho_: float, epsilon: float) -> float:
    """δ such that ρ-zCDP implies (ε, δ)-DP: inf over α > 1 of exp((α−1)(αρ−ε))/(α−1)·(1−1/α)^α.

    Parameters
    ----------
    rho_ : float
        ρ ≥ 0.
    epsilon : float
        ε ≥ 0.

    Returns
    -------
    float
        δ in [0, 1] (capped at 1; 0 when ρ = 0).

    References
    ----------
    CKS 2020, Cor. 13 (the conversion from ρ-zCDP; δ is attained up to the minimisation over α).
    """
    owner = "zcdp_delta"
    rho_ = nonnegative(owner, "rho", rho_)
    epsilon = nonnegative(owner, "epsilon", epsilon)
    if rho_ == 0.0:
        return 0.0
    alpha = _best_order(rho_, epsilon)
    return min(1.0, math.exp(_log_delta_at(alpha, rho_, epsilon)))


def zcdp_epsilon(rho_: float, delta: float) -> float:
    """Smallest ε (to 1e-12 relative, rounded up) with ``zcdp_delta(rho_, ε) <= delta``.

    References
    ----------
    CKS 2020, Cor. 13.
    """
    owner = "zcdp_epsilon"
    rho_ = nonnegative(owner, "rho", rho_)
    delta = open_unit(owner, "delta", delta)
    if zcdp_delta(rho_, 0.0) <= delta:
        return 0.0
    high = rho_ + 2.0 * math.sqrt(rho_ * math.log(1.0 / delta)) + 1e-12  # Bun & Steinke 2016, Prop. 1.3
    while zcdp_delta(rho_, high) > delta:
        high *= 2.0

    def excess(epsilon: float) -> float:
        return math.log(max(zcdp_delta(rho_, epsilon), 1e-320)) - math.log(delta)

    epsilon = brent_root(excess, 0.0, high, xtol=1e-15, rtol=1e-13, maxiter=500)
    while zcdp_delta(rho_, epsilon) > delta:
        epsilon = math.nextafter(epsilon, math.inf) * (1.0 + 1e-13)
    return epsilon


def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ρ (to 1e-12 relative, rounded down) with ``zcdp_delta(ρ, epsilon) <= delta``.

    References
    ----------
    CKS 2020, Cor. 13.
    """
    owner = "zcdp_rho"
    epsilon = positive(owner, "epsilon", epsilon)
    delta = open_unit(owner, "delta", delta)

    def excess(log_rho: float) -> float:
        return math.log(max(zcdp_delta(math.exp(log_rho), epsilon), 1e-320)) - math.log(delta)

    low, high = math.log(epsilon) - 1.0, math.log(epsilon) + 1.0
    while excess(low) > 0.0:
        low -= 1.0
    while excess(high) <= 0.0:
        high += 1.0
    value = math.exp(brent_root(excess, low, high, xtol=1e-15, rtol=1e-13, maxiter=500))
    while zcdp_delta(value, epsilon) > delta:
        value = math.nextafter(value, 0.0) * (1.0 - 1e-13)
    return value


def epsilon_for_sigma2(sigma2: float, delta: float, sensitivity: float) -> float:
    """ε of the multivariate discrete Gaussian mechanism at δ: ``zcdp_epsilon(rho(σ², Δ), δ)``
    (CKS 2020, Thm 14 then Cor. 13)."""
    return zcdp_epsilon(rho(sigma2, sensitivity), delta)


def calibrate_sigma2(epsilon: float, delta: float, sensitivity: int) -> int:
    """Smallest integer σ² for which N_Z(0, σ²) per coordinate makes an integer vector of ℓ2
    sensitivity Δ (ε, δ)-DP, through CKS 2020 Thm 14 and Cor. 13.

    Parameters
    ----------
    epsilon : float
        Target ε > 0.
    delta : float
        Target δ in (0, 1).
    sensitivity : int
        Δ ≥ 1 in grid units (the ℓ2 bound on an integer vector's change).

    Returns
    -------
    int
        σ² ≥ 1 with ``zcdp_delta(rho(σ², Δ), ε) <= δ·(1 − DELTA_MARGIN)`` checked on the result,
        while σ² − 1 fails that check.
    """
    owner = "calibrate_sigma2"
    epsilon = positive(owner, "epsilon", epsilon)
    delta = open_unit(owner, "delta", delta)
    sensitivity = positive_int(owner, "sensitivity", sensitivity)
    target = delta * (1.0 - DELTA_MARGIN)

    def holds(sigma2: int) -> bool:
        return zcdp_delta(sensitivity * sensitivity / (2.0 * sigma2), epsilon) <= target

    sigma2 = max(1, math.ceil(sensitivity * sensitivity / (2.0 * zcdp_rho(epsilon, target))))
    while not holds(sigma2):
        sigma2 += max(1, sigma2 >> 40)
    while sigma2 > 1 and holds(sigma2 - 1):
        sigma2 -= 1
    return sigma2


def _log_sum_exp(values: np.ndarray) -> float:
    """log Σ e^{vᵢ} of a non-empty array, shifted by its largest term (no overflow; numpy's pairwise
    sum of positive terms errs by O(log n) ulps); no scipy.special on the start path of a run."""
    largest = float(values.max())
    return largest + math.log(float(np.sum(np.exp(values - largest))))


def delta_one_dimensional(epsilon: float, sigma2: float, sensitivity: int = 1) -> float:
    """Exact δ(ε) of adding N_Z(0, σ²) to an integer query of sensitivity Δ (one dimension).

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    sigma2 : float
        σ² in (0, 1e10].
    sensitivity : int
        Δ ≥ 1.

    Returns
    -------
    float
        δ = P[Y > εσ²/Δ − Δ/2] − e^ε P[Y > εσ²/Δ + Δ/2], Y ~ N_Z(0, σ²) (CKS 2020, Thm 7),
        summed as Σ P(y)(1 − e^{ε − L(y)}) over the y with privacy loss L(y) > ε, in log space.
        Terms below e^{−745} of the largest are dropped (they do not change a double).
    """
    owner = "delta_one_dimensional"
    epsilon = nonnegative(owner, "epsilon", epsilon)
    sigma2 = positive(owner, "sigma2", sigma2)
    if sigma2 > _MAX_ONE_DIM_SIGMA2:
        raise InvalidParameterError(owner, "sigma2", f"a float in (0, {_MAX_ONE_DIM_SIGMA2:g}]", sigma2)
    sensitivity = positive_int(owner, "sensitivity", sensitivity)
    width = math.ceil(40.0 * math.sqrt(sigma2)) + sensitivity + 2
    support = np.arange(-width, width + 1, dtype=np.float64)
    log_weights = -support * support / (2.0 * sigma2)
    log_normaliser = _log_sum_exp(log_weights)
    # L(y) = log P(y)/P(y − Δ) for the pair (q = 0, q' = Δ); L(y) > ε iff y < Δ/2 − εσ²/Δ.
    loss = (sensitivity * sensitivity - 2.0 * sensitivity * support) / (2.0 * sigma2)
    above = loss > epsilon
    if not np.any(above):
        return 0.0
    terms = log_weights[above] + np.log(-np.expm1(epsilon - loss[above]))
    return float(min(1.0, math.exp(_log_sum_exp(terms) - log_normaliser)))
