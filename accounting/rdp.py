"""Rényi-DP curves, their composition, and conversion to (ε, δ)-DP.

A mechanism is (α, ε(α))-RDP when the Rényi divergence of order α between its output
distributions on any two neighbouring datasets is at most ε(α). An :class:`RdpCurve` holds that
bound on a finite grid of orders. Composition (adaptive or not) adds curves order by order
(Liew & Takahashi 2022, Lemma 1); a mechanism run ``count`` times contributes ``count · ε(α)``. Both happen in
:func:`compose` and nowhere else, so a repetition count cannot be applied twice or forgotten.

The conversion to (ε, δ)-DP is Liew & Takahashi 2022, Lemma 2 (Canonne, Kamath & Steinke 2020, Prop. 12; Balle et
al. 2020, Thm 21), the same improved conversion dp-accounting 0.6.0 uses in
``rdp_privacy_accountant.compute_epsilon`` (there with two extras this module omits: orders at or
below 1.01 are skipped, and a KL/total-variation shortcut returns ε = 0 when
δ² > 1 − e^{−ε(α)}; both only matter for near-zero RDP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.validation import float_array, nonnegative, open_unit, positive_int

__all__ = ["RdpCurve", "compose", "rdp_to_delta", "rdp_to_dp"]


@dataclass(frozen=True)
class RdpCurve:
    """An RDP guarantee: order α ↦ ε(α) on a finite grid of orders.

    Attributes
    ----------
    orders : tuple[float, ...]
        Strictly increasing Rényi orders α > 1.
    epsilons : tuple[float, ...]
        ε(α) ≥ 0 for each order (``inf`` allowed: no guarantee at that order).

    References
    ----------
    Mironov (2017), Def. 4. Liew & Takahashi 2022, Def. 3 and Lemma 1 (composition).
    """

    orders: tuple[float, ...]
    epsilons: tuple[float, ...]

    def __post_init__(self) -> None:
        owner = "RdpCurve"
        orders = float_array(owner, "orders", self.orders, low=1.0, closed_low=False)
        if np.any(np.diff(orders) <= 0.0):
            raise InvalidParameterError(owner, "orders", "strictly increasing", self.orders)
        epsilons = _rdp_values(owner, self.epsilons, len(orders), "epsilons")
        object.__setattr__(self, "orders", tuple(float(a) for a in orders))
        object.__setattr__(self, "epsilons", tuple(float(e) for e in epsilons))

    @classmethod
    def from_values(
        cls, orders: Iterable[float], epsilons: Iterable[float] | NDArray[np.float64]
    ) -> RdpCurve:
        """Build a curve from any iterables (e.g. numpy arrays) of orders and ε(α)."""
        return cls(tuple(float(a) for a in orders), tuple(float(e) for e in epsilons))

    @classmethod
    def zero(cls, orders: Iterable[float]) -> RdpCurve:
        """The curve of a mechanism that reveals nothing (the identity of composition)."""
        grid = tuple(float(a) for a in orders)
        return cls(grid, (0.0,) * len(grid))

    def __add__(self, other: RdpCurve) -> RdpCurve:
        """The composition of this mechanism and ``other`` (see :func:`compose`)."""
        return compose([(self, 1), (other, 1)])

    def repeated(self, count: int) -> RdpCurve:
        """The composition of ``count`` runs of this mechanism (see :func:`compose`)."""
        return compose([(self, count)])

    def to_dp(self, delta: float) -> tuple[float, float]:
        """(ε, optimal order) for target δ, via :func:`rdp_to_dp`."""
        return rdp_to_dp(self.orders, self.epsilons, delta)

    def to_delta(self, epsilon: float) -> tuple[float, float]:
        """(δ, optimal order) for target ε, via :func:`rdp_to_delta`."""
        return rdp_to_delta(self.orders, self.epsilons, epsilon)


def compose(parts: Iterable[tuple[RdpCurve, int]]) -> RdpCurve:
    """RDP of running every mechanism in ``parts`` its stated number of times.

    Parameters
    ----------
    parts : iterable of (RdpCurve, int)
        Each mechanism's curve and how many times it runs (an integer ≥ 1). All curves must share
        the same orders.

    Returns
    -------
    RdpCurve
        ε(α) = Σ count · ε_part(α), order by order.

    Notes
    -----
    This is the only place in the package where repetition counts multiply RDP values.

    References
    ----------
    Liew & Takahashi 2022, Lemma 1 (adaptive RDP composition; Mironov 2017, Prop. 1).
    """
    owner = "compose"
    items = list(parts)
    if not items:
        raise InvalidParameterError(owner, "parts", "a non-empty iterable of (RdpCurve, count)", items)
    orders = items[0][0].orders
    total = np.zeros(len(orders))
    for curve, count in items:
        if not isinstance(curve, RdpCurve):
            raise InvalidParameterError(owner, "parts", "pairs whose first item is an RdpCurve", curve)
        if curve.orders != orders:
            raise InvalidParameterError(
                owner, "parts", f"curves that all share the orders {orders}", curve.orders
            )
        total = total + positive_int(owner, "count", count) * np.asarray(curve.epsilons)
    return RdpCurve(orders, tuple(float(e) for e in total))


def rdp_to_dp(
    orders: Sequence[float] | NDArray[np.float64],
    rdp_values: Sequence[float] | NDArray[np.float64],
    delta: float,
) -> tuple[float, float]:
    """Smallest ε, over the given orders, for which an RDP guarantee implies (ε, δ)-DP.

    Parameters
    ----------
    orders : sequence of float
        Rényi orders α > 1.
    rdp_values : sequence of float
        ε(α) ≥ 0 at each order (``inf`` allowed).
    delta : float
        Target δ in (0, 1).

    Returns
    -------
    (float, float)
        ε = max(0, min_α [ε(α) + log(1 − 1/α) − (log δ + log α)/(α − 1)]) and the order α at which
        the minimum is attained (the first such order on ties). A negative minimum is raised to 0,
        which is valid because the hockey-stick divergence is non-increasing in ε.

    Notes
    -----
    The seed prints the range of δ as "1 < δ < 0"; it means 0 < δ < 1.

    References
    ----------
    Liew & Takahashi 2022, Lemma 2, Eq. (3). Canonne, Kamath & Steinke (2020), Prop. 12; Balle et al. (2020),
    Thm 21 (Eq. 20).
    """
    owner = "rdp_to_dp"
    alphas = float_array(owner, "orders", orders, low=1.0, closed_low=False)
    values = _rdp_values(owner, rdp_values, len(alphas))
    log_delta = math.log(open_unit(owner, "delta", delta))
    # Liew & Takahashi 2022, Lemma 2, Eq. (3).
    epsilons = values + np.log1p(-1.0 / alphas) - (log_delta + np.log(alphas)) / (alphas - 1.0)
    best = int(np.argmin(epsilons))
    return max(0.0, float(epsilons[best])), float(alphas[best])


def rdp_to_delta(
    orders: Sequence[float] | NDArray[np.float64],
    rdp_values: Sequence[float] | NDArray[np.float64],
    epsilon: float,
) -> tuple[float, float]:
    """Smallest δ, over the given orders, for which an RDP guarantee implies (ε, δ)-DP.

    Parameters
    ----------
    orders : sequence of float
        Rényi orders α > 1.
    rdp_values : sequence of float
        ε(α) ≥ 0 at each order (``inf`` allowed).
    epsilon : float
        Target ε ≥ 0.

    Returns
    -------
    (float, float)
        δ = min(1, min_α exp((α − 1)(ε(α) − ε + log(1 − 1/α)) − log α)) and the optimal order.

    Notes
    -----
    The same inequality as :func:`rdp_to_dp` solved for δ: Eq. (3) of Liew & Takahashi 2022 reads
    ε = ε(α) + log(1 − 1/α) − (log δ + log α)/(α − 1).

    References
    ----------
    Liew & Takahashi 2022, Lemma 2, Eq. (3). Canonne, Kamath & Steinke (2020), Prop. 12.
    """
    owner = "rdp_to_delta"
    alphas = float_array(owner, "orders", orders, low=1.0, closed_low=False)
    values = _rdp_values(owner, rdp_values, len(alphas))
    epsilon = nonnegative(owner, "epsilon", epsilon)
    # Liew & Takahashi 2022, Lemma 2, Eq. (3) solved for log δ.
    log_deltas = (alphas - 1.0) * (values - epsilon + np.log1p(-1.0 / alphas)) - np.log(alphas)
    best = int(np.argmin(log_deltas))
    return math.exp(min(0.0, float(log_deltas[best]))), float(alphas[best])


def _rdp_values(
    owner: str, values: object, length: int, name: str = "rdp_values"
) -> NDArray[np.float64]:
    """RDP values: ``length`` floats, each ≥ 0 (``inf`` allowed, NaN not)."""
    constraint = f"a sequence of {length} floats in [0, inf]"
    try:
        array = np.atleast_1d(np.asarray(list(values), dtype=np.float64))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidParameterError(owner, name, constraint, values) from None
    if array.shape != (length,) or np.any(np.isnan(array)) or np.any(array < 0.0):
        raise InvalidParameterError(owner, name, constraint, values)
    return array
