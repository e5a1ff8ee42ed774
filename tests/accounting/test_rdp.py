"""Tests for panpriv.accounting.rdp: RDP curves, composition counted once, and Liew & Takahashi 2022 Lemma 2 conversion.

Oracles: dp-accounting 0.6.0's RdpAccountant and its compute_epsilon / compute_delta (which use
the same conversion, Canonne–Kamath–Steinke 2020 Prop. 12), the exact analytic Gaussian ε, and
Mironov's (2017) original conversion as a looser upper bound.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from panpriv.accounting import gaussian
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.rdp import RdpCurve, compose, rdp_to_delta, rdp_to_dp

ORDERS = tuple(float(a) for a in dpa_rdp.DEFAULT_RDP_ORDERS)


def _gaussian_curve(sigma: float, orders: tuple[float, ...] = ORDERS) -> RdpCurve:
    return RdpCurve.from_values(orders, gaussian.rdp(orders, sigma))


# --- pinned values (formulas.md, "Oracle values (dp-accounting 0.6.0)") --------------------------


def test_gaussian_sigma_one_pinned_rdp_epsilon() -> None:
    # σ = 1, one release, δ = 1e-5, dp-accounting default orders: RDP ε = 4.728507067217623.
    epsilon, order = _gaussian_curve(1.0).to_dp(1e-5)
    assert epsilon == pytest.approx(4.728507067217623, rel=1e-14)
    assert order == 5.4


def test_poisson_subsampled_gaussian_pinned_value_through_our_conversion() -> None:
    # q = 0.01, σ = 1.1, 10 000 steps, δ = 1e-5: RDP ε = 5.632010670081592 at order 4.7.
    # The curve comes from dp-accounting (we do not implement Poisson subsampling); the
    # conversion and the self-composition count are ours.
    accountant = dpa_rdp.RdpAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1)))
    step = RdpCurve.from_values(accountant.orders, accountant.rdp)
    epsilon, order = step.repeated(10_000).to_dp(1e-5)
    assert epsilon == pytest.approx(5.632010670081592, rel=1e-12)
    assert order == 4.7


def test_rdp_to_dp_is_an_upper_bound_on_the_exact_gaussian_epsilon() -> None:
    # Exact (Balle–Wang) ε at σ = 1, δ = 1e-5 is 4.377178095681137 (formulas.md); RDP must exceed it.
    for sigma in [0.5, 1.0, 2.0, 5.0, 20.0]:
        for delta in [1e-3, 1e-5, 1e-10]:
            assert _gaussian_curve(sigma).to_dp(delta)[0] >= gaussian.analytic_epsilon(sigma, delta)


# --- the conversion against dp-accounting and against Mironov (2017) ----------------------------

curves = st.lists(st.floats(1e-3, 50.0), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(values=curves, log10_delta=st.floats(-15.0, -0.5), data=st.data())
def test_rdp_to_dp_matches_dp_accounting(values: list[float], log10_delta: float, data) -> None:  # type: ignore[no-untyped-def]
    orders = sorted(set(data.draw(st.lists(st.floats(1.02, 500.0), min_size=len(values), max_size=len(values)))))
    values = values[: len(orders)]
    delta = 10.0**log10_delta
    expected, expected_order = dpa_rdp.compute_epsilon(orders, values, delta)
    epsilon, order = rdp_to_dp(orders, values, delta)
    if expected == 0.0:
        # Both at 0 agree whatever the orders (dp-accounting's 0 may come from its KL shortcut at
        # an order where Lemma 2 gives more); only that shortcut may give 0 where Lemma 2 does not.
        assert epsilon == 0.0 or any(delta**2 + math.expm1(-v) > 0 for v in values)
        return
    assert epsilon == pytest.approx(expected, rel=1e-12, abs=1e-12)
    if order != expected_order:
        # Two orders can attain the same minimum (up to rounding); the choice between them is free.
        tied = values[orders.index(expected_order)]
        assert rdp_to_dp([expected_order], [tied], delta)[0] == pytest.approx(epsilon, rel=1e-12, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(values=curves, epsilon=st.floats(0.0, 30.0), data=st.data())
def test_rdp_to_delta_matches_dp_accounting(values: list[float], epsilon: float, data) -> None:  # type: ignore[no-untyped-def]
    orders = sorted(set(data.draw(st.lists(st.floats(1.02, 500.0), min_size=len(values), max_size=len(values)))))
    values = values[: len(orders)]
    expected, _ = dpa_rdp.compute_delta(orders, values, epsilon)
    delta, _ = rdp_to_delta(orders, values, epsilon)
    # dp-accounting also takes a KL-based bound, so its δ is ≤ ours; they agree when Lemma 2 wins.
    assert delta >= expected * (1 - 1e-12)
    kl_delta = min(math.sqrt(-math.expm1(-v)) for v in values)
    if delta < kl_delta:
        assert delta == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("sigma", [0.6, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-12])
def test_lemma_2_is_at_least_as_tight_as_mironov_2017(sigma: float, delta: float) -> None:
    # Mironov (2017) Prop. 3: ε = ε(α) + log(1/δ)/(α − 1); older, looser: an upper bound on ours.
    curve = _gaussian_curve(sigma)
    mironov = min(e + math.log(1 / delta) / (a - 1) for a, e in zip(curve.orders, curve.epsilons))
    assert curve.to_dp(delta)[0] <= mironov


def test_returned_order_attains_the_returned_epsilon() -> None:
    curve = _gaussian_curve(2.0)
    epsilon, order = curve.to_dp(1e-6)
    value = dict(zip(curve.orders, curve.epsilons))[order]
    assert epsilon == value + math.log1p(-1 / order) - (math.log(1e-6) + math.log(order)) / (order - 1)


@settings(max_examples=100, deadline=None)
@given(sigma=st.floats(0.3, 30.0), log10_delta=st.floats(-12.0, -1.0))
def test_delta_and_epsilon_conversions_round_trip(sigma: float, log10_delta: float) -> None:
    curve = _gaussian_curve(sigma)
    delta = 10.0**log10_delta
    epsilon, _ = curve.to_dp(delta)
    if epsilon > 0.0:
        assert curve.to_delta(epsilon)[0] == pytest.approx(delta, rel=1e-9)


def test_negative_lemma_2_value_is_clamped_to_zero() -> None:
    # Tiny RDP with a large δ: Eq. (3) is negative; (0, δ) follows since δ(ε) is non-increasing.
    assert rdp_to_dp([2.0], [1e-9], 0.9) == (0.0, 2.0)


def test_infinite_rdp_orders_never_win() -> None:
    assert rdp_to_dp([2.0, 3.0], [math.inf, 1.0], 1e-5)[1] == 3.0
    assert rdp_to_delta([2.0, 3.0], [1.0, math.inf], 2.0)[1] == 2.0


# --- composition (counts applied in one place) ---------------------------------------------------


def test_self_composition_matches_dp_accounting() -> None:
    accountant = dpa_rdp.RdpAccountant()
    accountant.compose(dp_event.GaussianDpEvent(3.0), count=37)
    epsilon, order = _gaussian_curve(3.0).repeated(37).to_dp(1e-6)
    expected, expected_order = accountant.get_epsilon_and_optimal_order(1e-6)
    assert epsilon == pytest.approx(expected, rel=1e-13)
    assert order == expected_order


def test_k_gaussians_equal_one_gaussian_with_sigma_over_root_k() -> None:
    composed = _gaussian_curve(4.0).repeated(16).epsilons
    np.testing.assert_allclose(composed, _gaussian_curve(1.0).epsilons, rtol=1e-14)


def test_heterogeneous_composition_adds_counted_values_once() -> None:
    orders = (2.0, 4.0)
    a = RdpCurve(orders, (0.1, 0.3))
    b = RdpCurve(orders, (1.0, 2.0))
    assert compose([(a, 3), (b, 2)]).epsilons == pytest.approx((2.3, 4.9))
    assert (a + b).epsilons == pytest.approx((1.1, 2.3))
    assert (a + a).epsilons == a.repeated(2).epsilons
    assert (RdpCurve.zero(orders) + b) == b


@settings(max_examples=50, deadline=None)
@given(sigma=st.floats(0.5, 20.0), count=st.integers(1, 1000))
def test_composing_more_never_lowers_epsilon(sigma: float, count: int) -> None:
    curve = _gaussian_curve(sigma)
    assert curve.repeated(count + 1).to_dp(1e-6)[0] >= curve.repeated(count).to_dp(1e-6)[0]
    assert curve.repeated(count).to_dp(1e-6)[0] >= curve.to_dp(1e-6)[0]


def test_curve_is_frozen_and_normalised() -> None:
    curve = RdpCurve.from_values(np.array([2, 3]), np.array([0.5, 1.0]))
    assert curve.orders == (2.0, 3.0) and isinstance(curve.epsilons[0], float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        curve.orders = (4.0,)  # type: ignore[misc]


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: RdpCurve((2.0, 2.0), (1.0, 1.0)), "'orders'"),
        (lambda: RdpCurve((3.0, 2.0), (1.0, 1.0)), "'orders'"),
        (lambda: RdpCurve((1.0,), (1.0,)), "'orders'"),
        (lambda: RdpCurve((2.0,), (-1.0,)), "'epsilons'"),
        (lambda: RdpCurve((2.0, 3.0), (1.0,)), "'epsilons'"),
        (lambda: RdpCurve((2.0,), (math.nan,)), "'epsilons'"),
        (lambda: RdpCurve((2.0,), (1.0,)).repeated(0), "'count'"),
        (lambda: RdpCurve((2.0,), (1.0,)).repeated(True), "'count'"),  # type: ignore[arg-type]
        (lambda: RdpCurve((2.0,), (1.0,)).repeated(2.5), "'count'"),  # type: ignore[arg-type]
        (lambda: RdpCurve((2.0,), (1.0,)) + RdpCurve((3.0,), (1.0,)), "'parts'"),
        (lambda: compose([]), "'parts'"),
        (lambda: rdp_to_dp([2.0], [1.0], 0.0), "'delta'"),
        (lambda: rdp_to_dp([2.0], [1.0], 1.0), "'delta'"),
        (lambda: rdp_to_dp([0.5], [1.0], 1e-5), "'orders'"),
        (lambda: rdp_to_dp([2.0, 3.0], [1.0], 1e-5), "'rdp_values'"),
        (lambda: rdp_to_delta([2.0], [1.0], -1.0), "'epsilon'"),
    ],
)
def test_invalid_parameters_name_the_parameter(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=name):
        call()
