"""Tests for panpriv.accounting.composition.

Oracle: the exact privacy profile of composed binary randomized response, computed here by
enumerating every output pattern. RR with parameter ε is the worst case among ε-DP mechanisms
(Kairouz, Oh & Viswanath 2015), so any valid composition bound for pure-DP components must give a
δ at least the exact δ of composed RR at the bound's ε.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panpriv.accounting.composition import advanced, basic, heterogeneous
from panpriv.accounting.errors import InvalidParameterError


def _rr_composed_delta(epsilons: list[float], target: float) -> float:
    """Exact δ(target) of the product of randomized responses with parameters εⱼ (brute force).

    Under P each RR reports its true bit with probability e^ε/(1+e^ε), contributing privacy loss
    +ε, else −ε; δ(t) = E_P[(1 − e^{t − L})₊] over all 2^k patterns.
    """
    delta = 0.0
    for signs in itertools.product((1, -1), repeat=len(epsilons)):
        probability = 1.0
        loss = 0.0
        for sign, eps in zip(signs, epsilons):
            probability *= math.exp(eps) / (1 + math.exp(eps)) if sign > 0 else 1 / (1 + math.exp(eps))
            loss += sign * eps
        delta += probability * max(0.0, -math.expm1(target - loss))
    return delta


# --- values --------------------------------------------------------------------------------------


def test_basic_sums() -> None:
    assert basic([0.1, 0.2, 0.7], [1e-6, 0.0, 2e-6]) == pytest.approx((1.0, 3e-6))
    assert basic([1.0, 1.0], [0.7, 0.6])[1] == 1.0


def test_advanced_worked_value() -> None:
    # Dwork & Roth Thm 3.20 with ε = 0.1, k = 100, δ′ = 1e-5:
    # 0.1·√(200 ln 1e5) + 100·0.1·(e^0.1 − 1) = 4.798526...+ 1.051709... = 5.850235...
    epsilon, delta = advanced(0.1, 1e-7, 100, 1e-5)
    assert epsilon == pytest.approx(0.1 * math.sqrt(200 * math.log(1e5)) + 10 * (math.exp(0.1) - 1), rel=1e-15)
    assert epsilon == pytest.approx(5.8502353, abs=1e-6)
    assert delta == pytest.approx(100 * 1e-7 + 1e-5)


def test_heterogeneous_reduces_to_advanced_for_equal_epsilons() -> None:
    # Cheu et al. 2022, Lemma 3.3 with all εⱼ = ε is Dwork–Rothblum–Vadhan at γ = δ′.
    het = heterogeneous([0.3] * 50, [1e-8] * 50, 1e-6)
    adv = advanced(0.3, 1e-8, 50, 1e-6)
    assert het[0] == pytest.approx(adv[0], rel=1e-13)
    assert het[1] == pytest.approx(adv[1], rel=1e-13)


def test_heterogeneous_worked_value() -> None:
    # Cheu et al. 2022, Lemma 3.3: ε′ = Σ εⱼ(e^{εⱼ} − 1) + √(2 log(1/γ) Σ εⱼ²), δ′ = Σ δⱼ + γ.
    # εⱼ = (0.1, 0.2, 0.5), γ = 0.01: Σ εⱼ(e^{εⱼ}−1) = 0.0105171 + 0.0442806 + 0.3243606 = 0.3791583,
    # Σ εⱼ² = 0.30, √(2·4.6051702·0.30) = 1.6622588 → ε′ = 2.0414171.
    epsilon, delta = heterogeneous([0.1, 0.2, 0.5], [1e-6, 2e-6, 3e-6], 0.01)
    assert epsilon == pytest.approx(2.0414171, abs=1e-6)
    assert delta == pytest.approx(0.010006)


# --- brute-force oracle --------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4, 9, 12])
@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("slack", [1e-2, 1e-4])
def test_advanced_holds_for_composed_randomized_response(k: int, epsilon: float, slack: float) -> None:
    composed, delta = advanced(epsilon, 0.0, k, slack)
    assert _rr_composed_delta([epsilon] * k, composed) <= delta


@settings(max_examples=60, deadline=None)
@given(epsilons=st.lists(st.floats(0.01, 1.5), min_size=1, max_size=10), gamma=st.floats(1e-6, 0.5))
def test_heterogeneous_holds_for_composed_randomized_response(epsilons: list[float], gamma: float) -> None:
    composed, delta = heterogeneous(epsilons, [0.0] * len(epsilons), gamma)
    assert _rr_composed_delta(epsilons, composed) <= delta


def test_basic_is_tight_for_composed_randomized_response() -> None:
    # At ε = Σ εⱼ composed RR has δ = 0 exactly, and any smaller ε has δ > 0.
    epsilons = [0.2, 0.5, 0.1]
    assert _rr_composed_delta(epsilons, basic(epsilons, [0.0] * 3)[0]) == 0.0
    assert _rr_composed_delta(epsilons, 0.79) > 0.0


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    epsilons=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=30),
    extra=st.floats(0.0, 3.0),
    gamma=st.floats(1e-12, 0.9),
)
def test_adding_a_mechanism_never_lowers_the_guarantee(epsilons: list[float], extra: float, gamma: float) -> None:
    deltas = [1e-9] * len(epsilons)
    for compose in (lambda e, d: basic(e, d), lambda e, d: heterogeneous(e, d, gamma)):
        before = compose(epsilons, deltas)
        after = compose([*epsilons, extra], [*deltas, 1e-9])
        assert after[0] >= before[0] and after[1] >= before[1]


@settings(max_examples=100, deadline=None)
@given(epsilon=st.floats(0.0, 2.0), k=st.integers(1, 10_000), slack=st.floats(1e-12, 0.5))
def test_advanced_is_monotone_in_count_and_at_least_one_step_for_small_slack(
    epsilon: float, k: int, slack: float
) -> None:
    assert advanced(epsilon, 0.0, k + 1, slack)[0] >= advanced(epsilon, 0.0, k, slack)[0]
    # For δ′ ≤ e^{-1/2}, √(2 log(1/δ′)) ≥ 1, so k copies are never cheaper than one.
    if slack <= math.exp(-0.5):
        assert advanced(epsilon, 0.0, k, slack)[0] >= epsilon


@settings(max_examples=100, deadline=None)
@given(epsilons=st.lists(st.floats(0.0, 3.0), min_size=1, max_size=10), gamma=st.floats(1e-9, 0.4))
def test_smaller_gamma_costs_more_epsilon(epsilons: list[float], gamma: float) -> None:
    deltas = [0.0] * len(epsilons)
    assert heterogeneous(epsilons, deltas, gamma / 2)[0] >= heterogeneous(epsilons, deltas, gamma)[0]


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: basic([0.1, -0.1], [0.0, 0.0]), "'epsilons'"),
        (lambda: basic([0.1], [0.0, 0.0]), "'deltas'"),
        (lambda: basic([], []), "'epsilons'"),
        (lambda: basic([0.1], [1.5]), "'deltas'"),
        (lambda: advanced(-1.0, 0.0, 2, 1e-5), "'epsilon'"),
        (lambda: advanced(1.0, 2.0, 2, 1e-5), "'delta'"),
        (lambda: advanced(1.0, 0.0, 0, 1e-5), "'count'"),
        (lambda: advanced(1.0, 0.0, 2, 0.0), "'delta_slack'"),
        (lambda: heterogeneous([0.1], [0.0], 1.0), "'gamma'"),
        (lambda: heterogeneous([math.nan], [0.0], 0.1), "'epsilons'"),
        (lambda: heterogeneous([math.inf], [0.0], 0.1), "'epsilons'"),
    ],
)
def test_invalid_parameters_name_the_parameter(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=name):
        call()
