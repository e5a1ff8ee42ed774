"""Composition theorems for (ε, δ)-DP: basic, advanced (Dwork–Rothblum–Vadhan) and the
heterogeneous advanced composition of Cheu et al. 2022, Lemma 3.3.

Each function takes the per-mechanism guarantees and returns ``(epsilon, delta)`` of the joint
release of all of them (adaptive composition for :func:`basic` and :func:`advanced`; for
:func:`heterogeneous` as Cheu et al. 2022 states it: mechanisms with independent randomness). A total δ above 1
is reported as 1 (every mechanism is (ε, 1)-DP). Sums use ``math.fsum`` (correctly rounded), so
adding a mechanism can never lower a reported value through rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.validation import float_array, nonnegative, open_unit, positive_int

__all__ = ["advanced", "basic", "heterogeneous"]


def basic(epsilons: Sequence[float], deltas: Sequence[float]) -> tuple[float, float]:
    """Basic composition: (Σ εⱼ, Σ δⱼ).

    Parameters
    ----------
    epsilons, deltas : sequence of float
        Per-mechanism guarantees, εⱼ ≥ 0 and δⱼ ∈ [0, 1], equal lengths.

    Returns
    -------
    (float, float)
        (Σ εⱼ, min(1, Σ δⱼ)).

    References
    ----------
    Dwork & Roth (2014), Thm 3.16 (adaptive composition holds too, Thm B.1).
    """
    eps, dels = _guarantees("basic", epsilons, deltas)
    return math.fsum(eps), min(1.0, math.fsum(dels))


def advanced(epsilon: float, delta: float, count: int, delta_slack: float) -> tuple[float, float]:
    """Advanced composition of ``count`` (ε, δ)-DP mechanisms (Dwork–Rothblum–Vadhan 2010).

    Parameters
    ----------
    epsilon : float
        Per-mechanism ε ≥ 0.
    delta : float
        Per-mechanism δ in [0, 1].
    count : int
        Number k ≥ 1 of (adaptively) composed mechanisms.
    delta_slack : float
        The extra failure probability δ′ in (0, 1) traded for the √k growth.

    Returns
    -------
    (float, float)
        ε′ = ε √(2k log(1/δ′)) + k ε (e^ε − 1) and min(1, k δ + δ′).

    Notes
    -----
    This is the form of Dwork & Roth (2014), Thm 3.20 (DRV 2010, Thm III.3), not the optimal
    composition of Kairouz, Oh & Viswanath (2015). It can exceed basic composition's kε for large
    ε; callers wanting the better of the two may take the minimum (both hold at δ ≥ kδ). With all
    εⱼ = ε it coincides with :func:`heterogeneous` (Cheu et al. 2022, Lemma 3.3) at γ = δ′.

    References
    ----------
    Dwork, Rothblum & Vadhan (2010), "Boosting and differential privacy", Thm III.3.
    Dwork & Roth (2014), Thm 3.20.
    """
    owner = "advanced"
    epsilon = nonnegative(owner, "epsilon", epsilon)
    delta = _probability(owner, "delta", delta)
    k = positive_int(owner, "count", count)
    slack = open_unit(owner, "delta_slack", delta_slack)
    # Dwork & Roth (2014), Thm 3.20.
    composed = epsilon * math.sqrt(2.0 * k * math.log(1.0 / slack)) + k * epsilon * math.expm1(epsilon)
    return composed, min(1.0, k * delta + slack)


def heterogeneous(
    epsilons: Sequence[float] | NDArray[np.float64], deltas: Sequence[float] | NDArray[np.float64], gamma: float
) -> tuple[float, float]:
    """Advanced composition with different εⱼ per mechanism (Cheu et al. 2022, Lemma 3.3).

    Parameters
    ----------
    epsilons, deltas : sequence of float
        Per-mechanism guarantees D∞^{δⱼ}(Aⱼ(X) ‖ Aⱼ(X′)) ≤ εⱼ (εⱼ ≥ 0, δⱼ ∈ [0, 1]), for mechanisms
        that use independent random bits; equal lengths.
    gamma : float
        Failure probability γ in (0, 1) of the concentration step.

    Returns
    -------
    (float, float)
        ε′ = Σⱼ εⱼ (e^{εⱼ} − 1) + √(2 log(1/γ) Σⱼ εⱼ²) and δ′ = min(1, Σⱼ δⱼ + γ).

    Notes
    -----
    The paper's extracted text garbles the square root (Cheu et al. 2022 Lemma 3.3 prints "+2 log(1/γ) X εj", the
    restatement Lemma A.3 "2t log(1/γ) X εj"); the form above is the one its proof (Azuma on the
    privacy loss, App. A.2) yields, and it reduces to Dwork–Rothblum–Vadhan when all εⱼ are equal.
    Because Cheu et al. 2022 proves it for a fixed pair of neighbouring datasets, the εⱼ may be per-instance
    divergences (as Cheu et al. 2022 Thm 3.2 uses them). The tests check it against the exact privacy profile
    of composed randomized response, the worst case for pure-DP components.

    References
    ----------
    Cheu, Joseph, Mao & Peng (2022), Lemma 3.3 / Lemma A.3.
    """
    owner = "heterogeneous"
    eps, dels = _guarantees(owner, epsilons, deltas)
    log_inverse_gamma = math.log(1.0 / open_unit(owner, "gamma", gamma))
    # Cheu et al. 2022, Lemma 3.3.
    composed = math.fsum(eps * np.expm1(eps)) + math.sqrt(2.0 * log_inverse_gamma * math.fsum(eps**2))
    return composed, min(1.0, math.fsum(dels) + gamma)


def _probability(owner: str, name: str, value: object) -> float:
    """A δ in [0, 1]."""
    number = nonnegative(owner, name, value)
    if number > 1.0:
        raise InvalidParameterError(owner, name, "a float in [0, 1]", value)
    return number


def _guarantees(
    owner: str, epsilons: Sequence[float] | NDArray[np.float64], deltas: Sequence[float] | NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validated per-mechanism (εⱼ, δⱼ) arrays of equal length."""
    eps = float_array(owner, "epsilons", epsilons, low=0.0, closed_low=True)
    dels = float_array(owner, "deltas", deltas, low=0.0, closed_low=True)
    if dels.shape != eps.shape:
        raise InvalidParameterError(owner, "deltas", f"a sequence of {eps.size} floats", deltas)
    if np.any(dels > 1.0):
        raise InvalidParameterError(owner, "deltas", "floats in [0, 1]", deltas)
    return eps, dels
