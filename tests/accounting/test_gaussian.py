"""Tests for panpriv.accounting.gaussian: exact (analytic) Gaussian mechanism, Cheu et al. 2022 Lemma C.5, Gaussian RDP.

Oracles: mpmath at 60 digits (the defining formula of Balle & Wang 2018 / Sordello et al. 2021 Thm 1), dp-accounting
0.6.0's analytic Gaussian and PLD accountants, and the reference values of formulas.md.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting import gaussian_mechanism as dpa_gaussian
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import (
    analytic_delta,
    analytic_epsilon,
    analytic_sigma,
    classic_sigma,
    rdp,
)


def _mp_delta(epsilon: float, sigma: float, sensitivity: float = 1.0) -> mpmath.mpf:
    """δ(ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) at 60 significant digits."""
    with mpmath.workdps(60):
        eps, s, d = mpmath.mpf(epsilon), mpmath.mpf(sigma), mpmath.mpf(sensitivity)
        return mpmath.ncdf(d / (2 * s) - eps * s / d) - mpmath.exp(eps) * mpmath.ncdf(
            -d / (2 * s) - eps * s / d
        )


# --- pinned values -------------------------------------------------------------------------------


def test_sigma_reference_value_from_formulas_md() -> None:
    # formulas.md, "Gaussian mechanism [confirmed]": ε = 1, δ = 1e-5, Δ = 1 → σ ≈ 3.7306316348.
    assert analytic_sigma(1.0, 1e-5) == pytest.approx(3.7306316348, rel=1e-10)


def test_epsilon_oracle_values_from_formulas_md() -> None:
    # formulas.md, oracle values (dp-accounting 0.6.0), Gaussian σ = 1, δ = 1e-5:
    # exact analytic ε = 4.377178095681137; PLD ε = 4.37717810002493 (PLD is pessimistic).
    epsilon = analytic_epsilon(1.0, 1e-5)
    assert epsilon == pytest.approx(4.377178095681137, rel=1e-12)
    assert epsilon <= 4.37717810002493
    assert epsilon == pytest.approx(4.37717810002493, rel=1e-6)


def test_theta_of_003_theorem_1_is_the_same_function() -> None:
    # Sordello et al. 2021, Thm 1: θ_γ(r) = Q(log γ/r − r/2) − γ Q(log γ/r + r/2); with γ = e^ε, r = Δ/σ.
    for epsilon, sigma, sensitivity in [(0.5, 2.0, 1.0), (2.0, 0.7, 1.3), (8.0, 0.25, 0.5)]:
        gamma, r = math.exp(epsilon), sensitivity / sigma
        with mpmath.workdps(50):
            q = lambda x: 1 - mpmath.ncdf(x)  # noqa: E731
            theta = q(math.log(gamma) / r - r / 2) - gamma * q(math.log(gamma) / r + r / 2)
        assert analytic_delta(epsilon, sigma, sensitivity) == pytest.approx(float(theta), rel=1e-12)


# --- independent oracles -------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.0, 1e-14, 1e-9, 1e-3, 0.1, 1.0, 3.0, 10.0, 50.0, 200.0, 700.0])
@pytest.mark.parametrize("sigma", [1e-3, 0.05, 0.3, 1.0, 3.0, 10.0, 100.0, 1e3, 1e5, 1e9])
def test_delta_matches_mpmath_including_tiny_delta(epsilon: float, sigma: float) -> None:
    reference = _mp_delta(epsilon, sigma)
    if reference < mpmath.mpf("1e-300"):
        assert analytic_delta(epsilon, sigma) <= 1e-300
        return
    assert analytic_delta(epsilon, sigma) == pytest.approx(float(reference), rel=1e-12)


def test_tiny_delta_is_accurate_where_the_textbook_form_cancels() -> None:
    # Textbook Φ(a) − e^ε Φ(b) subtracts two numbers that agree to ~all digits here.
    for epsilon, sigma in [(30.0, 0.5), (5.0, 1e4), (1e-12, 1e8)]:
        reference = _mp_delta(epsilon, sigma)
        assert analytic_delta(epsilon, sigma) == pytest.approx(float(reference), rel=1e-12)


@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-8, 1e-5, 1e-2, 0.3])
def test_sigma_matches_dp_accounting_grid(epsilon: float, delta: float) -> None:
    expected = dpa_gaussian.get_sigma_gaussian(epsilon, delta)
    assert analytic_sigma(epsilon, delta) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("sigma", [0.3, 0.8, 1.0, 2.5, 10.0])
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-3])
def test_epsilon_matches_dp_accounting_grid(sigma: float, delta: float) -> None:
    expected = dpa_gaussian.get_epsilon_gaussian(sigma, delta)
    assert analytic_epsilon(sigma, delta) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("sigma", [0.7, 2.0])
def test_epsilon_is_at_most_the_pld_accountant(sigma: float) -> None:
    # dp-accounting's PLD discretises pessimistically, so its ε is an upper bound within ~1e-6.
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.GaussianDpEvent(sigma))
    pld_epsilon = accountant.get_epsilon(1e-6)
    assert analytic_epsilon(sigma, 1e-6) <= pld_epsilon
    assert analytic_epsilon(sigma, 1e-6) == pytest.approx(pld_epsilon, rel=1e-5)


# --- rounding guarantees and round trips ---------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    epsilon=st.floats(0.0, 60.0),
    log10_delta=st.floats(-14.0, -0.1),
    sensitivity=st.floats(0.01, 100.0),
)
def test_sigma_is_feasible_and_minimal(epsilon: float, log10_delta: float, sensitivity: float) -> None:
    delta = 10.0**log10_delta
    sigma = analytic_sigma(epsilon, delta, sensitivity)
    assert analytic_delta(epsilon, sigma, sensitivity) <= delta  # never a hair too small
    assert analytic_delta(epsilon, sigma * (1 - 1e-9), sensitivity) > delta  # and minimal


@settings(max_examples=150, deadline=None)
@given(sigma=st.floats(0.05, 200.0), log10_delta=st.floats(-14.0, -0.1))
def test_epsilon_is_feasible_and_minimal(sigma: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    epsilon = analytic_epsilon(sigma, delta)
    assert analytic_delta(epsilon, sigma) <= delta
    if epsilon > 0.0:
        assert analytic_delta(epsilon * (1 - 1e-9), sigma) > delta
    else:
        assert analytic_delta(0.0, sigma) <= delta


@settings(max_examples=100, deadline=None)
@given(epsilon=st.floats(0.01, 30.0), log10_delta=st.floats(-12.0, -0.5))
def test_sigma_and_epsilon_round_trip(epsilon: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    assert analytic_epsilon(analytic_sigma(epsilon, delta), delta) == pytest.approx(
        epsilon, rel=1e-8, abs=1e-12
    )


@settings(max_examples=100, deadline=None)
@given(
    epsilon=st.floats(0.0, 20.0),
    sigma=st.floats(0.05, 50.0),
    factor=st.floats(1.01, 10.0),
)
def test_delta_falls_as_sigma_or_epsilon_grows(epsilon: float, sigma: float, factor: float) -> None:
    base = analytic_delta(epsilon, sigma)
    assert analytic_delta(epsilon, sigma * factor) <= base
    assert analytic_delta(epsilon * factor + 0.01, sigma) <= base


def test_sensitivity_enters_only_through_the_ratio() -> None:
    assert analytic_sigma(0.5, 1e-6, 4.0) == pytest.approx(4.0 * analytic_sigma(0.5, 1e-6), rel=1e-12)
    assert analytic_delta(1.0, 6.0, 2.0) == pytest.approx(analytic_delta(1.0, 3.0), rel=1e-12)


def test_infinite_epsilon_has_zero_delta() -> None:
    assert analytic_delta(math.inf, 1.0) == 0.0


# --- Cheu et al. 2022, Lemma C.5 ------------------------------------------------------------------------------


def test_classic_sigma_formula() -> None:
    # Cheu et al. 2022, Lemma C.5: σ² = 2 Δ² log(2/δ) / ε². ε = 0.5, δ = 1e-5, Δ = 2 → σ² = 32 log(2e5).
    assert classic_sigma(0.5, 1e-5, 2.0) == pytest.approx(math.sqrt(32.0 * math.log(2e5)), rel=1e-15)


@pytest.mark.parametrize("epsilon", [0.01, 0.2, 0.5, 0.99])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 0.1])
def test_classic_sigma_is_never_below_the_exact_minimum(epsilon: float, delta: float) -> None:
    sigma = classic_sigma(epsilon, delta)
    assert sigma >= analytic_sigma(epsilon, delta)
    assert analytic_delta(epsilon, sigma) <= delta


@pytest.mark.parametrize("epsilon", [1.0, 1.5, 0.0, -0.1, math.inf, math.nan])
def test_classic_sigma_rejects_epsilon_outside_its_range(epsilon: float) -> None:
    with pytest.raises(InvalidParameterError, match="'epsilon'"):
        classic_sigma(epsilon, 1e-5)


# --- Gaussian RDP --------------------------------------------------------------------------------


def test_rdp_values_scalar_and_array() -> None:
    # Mironov 2017 Prop. 7: α Δ² / (2σ²).
    assert rdp(2.0, 1.0) == 1.0
    assert isinstance(rdp(3, 2.0, 2.0), float)
    np.testing.assert_allclose(rdp([1.5, 4.0, 64.0], 2.0, 3.0), [1.5 * 9 / 8, 4.5, 72.0], rtol=1e-15)


def test_rdp_matches_dp_accounting() -> None:
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

    orders = np.array([1.5, 2.0, 7.0, 32.0, 256.0])
    expected = rdp_acc._compute_rdp_poisson_subsampled_gaussian(1.0, 1.7, orders)
    np.testing.assert_allclose(rdp(orders, 1.7), expected, rtol=1e-14)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: analytic_delta(-1.0, 1.0), "'epsilon'"),
        (lambda: analytic_delta(1.0, 0.0), "'sigma'"),
        (lambda: analytic_delta(1.0, 1.0, -2.0), "'sensitivity'"),
        (lambda: analytic_sigma(1.0, 0.0), "'delta'"),
        (lambda: analytic_sigma(1.0, 1.0), "'delta'"),
        (lambda: analytic_sigma(math.nan, 1e-5), "'epsilon'"),
        (lambda: analytic_sigma(math.inf, 1e-5), "'epsilon'"),
        (lambda: analytic_epsilon(math.inf, 1e-5), "'sigma'"),
        (lambda: analytic_epsilon(1.0, -1e-5), "'delta'"),
        (lambda: classic_sigma(0.5, 2.0), "'delta'"),
        (lambda: rdp([2.0, 1.0], 1.0), "'orders'"),
        (lambda: rdp(2.0, -1.0), "'sigma'"),
    ],
)
def test_invalid_parameters_name_the_parameter(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=name) as info:
        call()
    assert "must be" in str(info.value) and "Got" in str(info.value)
