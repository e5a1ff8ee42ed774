"""Tests for panpriv.accounting.discrete_gaussian (Canonne, Kamath & Steinke 2020: Thm 7, Thm 14, Cor. 13).

Oracles: brute-force sums of the discrete Gaussian PMF with mpmath at 50 digits (1-D exact δ, the
2-D hockey-stick divergence, the Cor. 13 minimisation), dp-accounting 0.6.0's discrete Gaussian
privacy loss (1-D exact δ) and its RDP accountant (the same conversion, on a grid of orders).
No numerical example of these functions is printed in CKS 2020, so no paper value is pinned.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from panpriv.accounting.discrete_gaussian import (
    DELTA_MARGIN,
    calibrate_sigma2,
    delta_one_dimensional,
    epsilon_for_sigma2,
    rho,
    zcdp_delta,
    zcdp_epsilon,
    zcdp_rho,
)
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_sigma


def _mp_weights(sigma2: float, width: int) -> tuple[list[int], list[mpmath.mpf], mpmath.mpf]:
    support = list(range(-width, width + 1))
    weights = [mpmath.exp(-mpmath.mpf(y) ** 2 / (2 * mpmath.mpf(sigma2))) for y in support]
    return support, weights, mpmath.fsum(weights)


def _mp_hockey_stick_1d(epsilon: float, sigma2: float, shift: int) -> mpmath.mpf:
    """Σ_y max(0, P(y) − e^ε P(y − shift)) for P = N_Z(0, σ²), by brute force at 50 digits."""
    with mpmath.workdps(50):
        width = int(40 * math.sqrt(sigma2)) + shift + 5
        support, weights, total = _mp_weights(sigma2, width)
        pmf = dict(zip(support, (w / total for w in weights)))
        e = mpmath.exp(epsilon)
        return mpmath.fsum(max(mpmath.mpf(0), pmf[y] - e * pmf.get(y - shift, mpmath.mpf(0))) for y in support)


def _mp_cor13(rho_: float, epsilon: float) -> mpmath.mpf:
    """inf_α exp((α−1)(αρ−ε))(1−1/α)^α/(α−1) at 50 digits, from the root of its log-derivative."""
    with mpmath.workdps(50):
        r, e = mpmath.mpf(rho_), mpmath.mpf(epsilon)

        def log_bound(a: mpmath.mpf) -> mpmath.mpf:
            return (a - 1) * (a * r - e) + a * mpmath.log(1 - 1 / a) - mpmath.log(a - 1)

        slope = lambda a: (2 * a - 1) * r - e + mpmath.log(1 - 1 / a)  # noqa: E731
        low, high = mpmath.mpf(1) + mpmath.mpf(10) ** -30, (e + 1) / (2 * r) + 2
        alpha = mpmath.findroot(slope, (low, high), solver="anderson")
        return min(mpmath.mpf(1), mpmath.exp(log_bound(alpha)))


# --- Thm 7: exact δ in one dimension ------------------------------------------------------------------


@pytest.mark.parametrize("sigma2,sensitivity", [(1.0, 1), (4.0, 1), (10.0, 3), (100.0, 7), (0.3, 2)])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5, 1.0, 2.0])
def test_one_dimensional_delta_matches_brute_force_and_dp_accounting(sigma2, sensitivity, epsilon):
    ours = delta_one_dimensional(epsilon, sigma2, sensitivity)
    brute = float(_mp_hockey_stick_1d(epsilon, sigma2, sensitivity))
    assert ours == pytest.approx(brute, rel=1e-11, abs=1e-300)
    oracle = privacy_loss_mechanism.DiscreteGaussianPrivacyLoss(math.sqrt(sigma2), sensitivity=sensitivity)
    assert ours == pytest.approx(oracle.get_delta_for_epsilon(epsilon), rel=1e-10, abs=1e-300)


@pytest.mark.parametrize("sigma2,sensitivity,epsilon", [(2.0, 4, 0.5), (9.0, 5, 1.0), (0.5, 3, 0.2)])
def test_smaller_shifts_never_give_more_delta(sigma2, sensitivity, epsilon):
    """Thm 7 is stated for sensitivity Δ: the worst case over shifts 1..Δ must be the shift Δ."""
    deltas = [float(_mp_hockey_stick_1d(epsilon, sigma2, shift)) for shift in range(1, sensitivity + 1)]
    assert deltas == sorted(deltas)
    assert delta_one_dimensional(epsilon, sigma2, sensitivity) == pytest.approx(deltas[-1], rel=1e-11)


def test_one_dimensional_exact_delta_is_below_the_zcdp_bound():
    for sigma2 in (0.5, 1.0, 10.0, 1000.0):
        for epsilon in (0.1, 1.0, 3.0):
            assert delta_one_dimensional(epsilon, sigma2, 1) <= zcdp_delta(rho(sigma2, 1), epsilon)


# --- Thm 14 and Cor. 13 -----------------------------------------------------------------------------


@pytest.mark.parametrize("rho_", [1e-4, 0.01, 0.025, 0.5, 3.0])
@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1.0, 4.0, 20.0])
def test_cor13_matches_an_mpmath_minimisation(rho_, epsilon):
    assert zcdp_delta(rho_, epsilon) == pytest.approx(float(_mp_cor13(rho_, epsilon)), rel=1e-9, abs=1e-300)


def test_cor13_pins_and_classic_bound():
    # Pins from the 50-digit oracle (values of the Cor. 13 formula, not of this implementation).
    for rho_, epsilon in ((0.025, 1.0), (0.5, 4.0), (1e-4, 0.05)):
        pinned = float(_mp_cor13(rho_, epsilon))
        assert zcdp_delta(rho_, epsilon) == pytest.approx(pinned, rel=1e-9)
        # Cor. 13 improves on Bun & Steinke 2016 Prop. 1.3's δ = exp(−(ε − ρ)²/(4ρ)) for ε > ρ.
        assert zcdp_delta(rho_, epsilon) < math.exp(-((epsilon - rho_) ** 2) / (4 * rho_))


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_cor13_against_dp_accounting_rdp_conversion(sigma, epsilon):
    """dp-accounting's RDP accountant converts the same curve αρ (a Gaussian event with noise
    multiplier σ) on a finite grid of orders, so its δ is at least ours and close to it."""
    orders = np.concatenate([np.linspace(1.01, 10, 900), np.linspace(10.1, 400, 4000)])
    accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
    accountant.compose(dp_event.GaussianDpEvent(sigma))
    theirs = accountant.get_delta(epsilon)
    ours = zcdp_delta(rho(sigma * sigma, 1.0), epsilon)
    assert ours <= theirs * (1 + 1e-12)
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_two_dimensional_brute_force_is_within_the_theorem_14_bound():
    """The exact hockey-stick divergence of a 2-D discrete Gaussian for integer shifts of norm ≤ Δ
    (brute force over a 2-D grid) never exceeds Cor. 13 applied to ρ = Δ²/(2σ²) (Thm 14)."""
    sigma2 = 1.5
    width = 14
    support = np.arange(-width, width + 1)
    log_w = -(support.astype(float) ** 2) / (2 * sigma2)
    pmf = np.exp(log_w - np.log(np.exp(log_w).sum()))
    joint = np.outer(pmf, pmf)
    for shift in ((1, 1), (2, 0), (2, 1), (1, 0)):
        moved = np.roll(np.roll(joint, shift[0], axis=0), shift[1], axis=1)  # P(y − μ); the wrap is ~1e-28
        sensitivity = math.hypot(*shift)
        for epsilon in (0.2, 0.8, 2.0):
            exact = np.maximum(joint - math.exp(epsilon) * moved, 0.0).sum()
            assert exact <= zcdp_delta(rho(sigma2, sensitivity), epsilon) + 1e-15


def test_inverses_are_consistent():
    for rho_, delta in ((0.01, 1e-6), (0.3, 1e-9), (2.0, 1e-3)):
        epsilon = zcdp_epsilon(rho_, delta)
        assert zcdp_delta(rho_, epsilon) <= delta < zcdp_delta(rho_, epsilon * (1 - 1e-9))
    for epsilon, delta in ((0.5, 1e-6), (1.0, 1e-6), (4.0, 1e-10)):
        largest = zcdp_rho(epsilon, delta)
        assert zcdp_delta(largest, epsilon) <= delta < zcdp_delta(largest * (1 + 1e-9), epsilon)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("sensitivity", [1, 7, 2**17])
def test_calibration_is_the_smallest_integer_variance(epsilon, sensitivity):
    delta = 1e-6
    sigma2 = calibrate_sigma2(epsilon, delta, sensitivity)
    target = delta * (1 - DELTA_MARGIN)
    assert zcdp_delta(rho(sigma2, sensitivity), epsilon) <= target
    if sigma2 > 1:
        assert zcdp_delta(rho(sigma2 - 1, sensitivity), epsilon) > target
    assert epsilon_for_sigma2(sigma2, delta, sensitivity) <= epsilon
    if sensitivity == 2**17:  # fine grid: σ/Δ within 10% above the analytic Gaussian's (measured 6-8%)
        ratio = math.sqrt(sigma2) / sensitivity / analytic_sigma(epsilon, delta, 1.0)
        assert 1.0 < ratio < 1.1


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda: rho(0.0, 1.0), "sigma2"),
        (lambda: zcdp_delta(-1.0, 1.0), "rho"),
        (lambda: zcdp_epsilon(0.1, 1.5), "delta"),
        (lambda: calibrate_sigma2(1.0, 1e-6, 0), "sensitivity"),
        (lambda: calibrate_sigma2(1.0, 1e-6, 1.5), "sensitivity"),
        (lambda: delta_one_dimensional(1.0, 1e12, 1), "sigma2"),
    ],
)
def test_invalid_parameters_are_named(call, name):
    with pytest.raises(InvalidParameterError, match=repr(name)):
        call()
