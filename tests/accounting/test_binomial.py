"""Tests of panpriv.accounting.binomial: Cheu et al.'s P1D/PVEC parameters and the tight accountant.

Oracles: the inequalities of Cheu et al.'s own proofs (Lemma A.2, Thm A.6, Claim A.8), the heterogeneous
composition of Cheu et al. 2022 Lemma 3.3 (panpriv.accounting.composition), and brute force — the exact hockey-stick
divergence between the full PMFs of the d = 1 and d = 2 protocol's views.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution
from scipy import stats

from panpriv.accounting.binomial import (
    p1d_parameters,
    pvec_parameters,
    tight_delta,
    tight_parameters,
)
from panpriv.accounting.composition import heterogeneous
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_sigma

# ------------------------------------------------------------------------------------------
# Cheu et al. 2022, Lemma 3.1 (P1D)
# ------------------------------------------------------------------------------------------


def test_p1d_parameters_reproduce_lemma_3_1() -> None:
    # n = 1000, ε = 1, δ = 1e-6, Δ = 1: g = ⌈√1000⌉ = 32,
    # 180·32²·ln(2e6)/1000 = 2674.2… so b = 2675, p = 90·32²·ln(2e6)/(2675·1000).
    params = p1d_parameters(1000, 1.0, 1e-6, 1.0)
    assert params.g == 32
    threshold = 180 * 32**2 * math.log(2e6) / 1000
    assert threshold == pytest.approx(2674.24, abs=0.01)
    assert params.b == 2675
    assert params.p == pytest.approx(90 * 32**2 * math.log(2e6) / (2675 * 1000), rel=1e-15)
    assert params.p < 0.5


@pytest.mark.parametrize(
    "n, epsilon, delta, bound",
    [(10, 15.0, 0.49, 1.0), (1000, 0.1, 1e-9, 3.0), (7, 1.0, 1e-3, 0.25), (100, 15.0, 0.1, 1.0)],
)
def test_p1d_parameters_satisfy_the_proof_of_lemma_a2(
    n: int, epsilon: float, delta: float, bound: float
) -> None:
    """The proof's hypotheses hold; (10, 15, ·, 1) needs g = 7 > ⌈√10⌉ (see the Notes)."""
    params = p1d_parameters(n, epsilon, delta, bound)
    assert params.g >= bound * math.sqrt(n) and params.g - 1 < max(bound * math.sqrt(n), epsilon / 2.4, 1)
    threshold = 180 * params.g**2 * math.log(2 / delta) / (epsilon**2 * n)
    assert threshold < params.b <= threshold + 1
    # Proof of Lemma A.2: Lemma A.1 with m = bn, t = g, α = ε/(3g) needs αmp ≥ 2t and p < 1/2,
    # and its δ = 2 exp(−α²mp/10) is at most the δ asked for.
    alpha = epsilon / (3 * params.g)
    mp = params.b * n * params.p
    assert params.p < 0.5 and alpha <= 0.8
    assert math.log((1 + alpha) / (1 - alpha)) <= 3 * alpha  # the proof's "α small" step
    assert alpha * mp >= 2 * params.g
    assert 2 * math.exp(-(alpha**2) * mp / 10) <= delta * (1 + 1e-12)
    # Item 1: the per-instance bound; worst case |x − x′| = Δ gives ε(1 + 2/g).
    assert params.divergence_bound(0.0) == pytest.approx(2 * epsilon / params.g)
    assert params.worst_case_epsilon == pytest.approx(epsilon * (1 + 2 / params.g))
    # Item 2: variance O(Δ² + Δ² log(1/δ)/ε²): noise part ≤ 90 Δ² ln(2/δ)/ε² exactly.
    assert params.noise_variance <= 90 * bound**2 * math.log(2 / delta) / epsilon**2


# ------------------------------------------------------------------------------------------
# Cheu et al. 2022, Thm 3.2 (PVEC) and Cor. A.9 (robust)
# ------------------------------------------------------------------------------------------


def test_pvec_parameters_reproduce_thm_a6() -> None:
    n, d, epsilon, delta, l2 = 1000, 10, 1.0, 1e-6, 1.0
    params = pvec_parameters(n, d, epsilon, delta, l2)
    assert params.g == 64  # ⌈max(2·√1000 = 63.2, √10, 4)⌉
    delta_hat = delta / (d + 1)
    epsilon_hat = epsilon / (18 * math.sqrt(math.log(1 / delta_hat)))
    coordinate = params.per_coordinate
    assert coordinate is not None
    assert coordinate.delta == pytest.approx(delta_hat, rel=1e-15)
    assert coordinate.epsilon == pytest.approx(epsilon_hat, rel=1e-15)
    assert coordinate.bound == 2 * l2 and coordinate.g == params.g
    threshold = 180 * 64**2 * math.log(2 / delta_hat) / (epsilon_hat**2 * n)
    assert threshold < params.b <= threshold + 1
    assert (params.epsilon, params.delta, params.calibration) == (epsilon, delta, "paper")
    # The proof's last chain: Σ εⱼ² ≤ 9ε̂² and 18ε̂² + 6ε̂√log(1/γ) ≤ ε.
    assert 18 * epsilon_hat**2 + 6 * epsilon_hat * math.sqrt(math.log(1 / delta_hat)) <= epsilon


@pytest.mark.parametrize("spread", [1, 3, 10])
def test_pvec_parameters_compose_to_the_target_by_lemma_3_3(spread: int) -> None:
    """Independent oracle: Cheu et al. 2022 Lemma 3.3 (panpriv.accounting.composition.heterogeneous) applied to the
    per-coordinate bounds εⱼ = ε̂(2/g + aⱼ/Δ) of Lemma 3.1 for a worst-case change ‖x − x′‖ = 2Δ₂
    spread evenly over ``spread`` coordinates."""
    n, d, epsilon, delta, l2 = 500, 10, 0.8, 1e-5, 2.0
    params = pvec_parameters(n, d, epsilon, delta, l2)
    coordinate = params.per_coordinate
    assert coordinate is not None
    change = np.zeros(d)
    change[:spread] = 2 * l2 / math.sqrt(spread)
    epsilons = [coordinate.divergence_bound(a) for a in change]
    composed_epsilon, composed_delta = heterogeneous(epsilons, [coordinate.delta] * d, coordinate.delta)
    assert composed_epsilon <= epsilon
    assert composed_delta == pytest.approx(delta, rel=1e-12)


def test_pvec_robust_variant_uses_cor_a9() -> None:
    honest = pvec_parameters(300, 4, 0.5, 1e-4, 1.0)
    robust = pvec_parameters(300, 4, 0.5, 1e-4, 1.0, honest_fraction=0.5)
    assert robust.per_coordinate is not None and honest.per_coordinate is not None
    # Construction ε_c = ε·γ: the per-coordinate ε̂ halves, b grows about fourfold.
    assert robust.per_coordinate.epsilon == pytest.approx(honest.per_coordinate.epsilon / 2)
    assert robust.b == pytest.approx(4 * honest.b, rel=1e-3)
    assert robust.noisy_users == 150 and robust.honest_fraction == 0.5
    # Claim A.8 with m = γbn, α = ε_c/(3γg): αmp ≥ 2g and 2exp(−α²mp/10) ≤ δ.
    gamma, eps_c = 0.5, robust.per_coordinate.epsilon
    alpha = eps_c / (3 * gamma * robust.g)
    mp = gamma * robust.b * robust.n * robust.p
    assert alpha * mp >= 2 * robust.g
    assert 2 * math.exp(-(alpha**2) * mp / 10) <= robust.per_coordinate.delta * (1 + 1e-12)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: p1d_parameters(0, 1.0, 1e-6, 1.0), "n"),
        (lambda: p1d_parameters(10, 16.0, 1e-6, 1.0), "epsilon"),
        (lambda: p1d_parameters(10, 1.0, 0.5, 1.0), "delta"),
        (lambda: p1d_parameters(10, 1.0, 1e-6, -1.0), "bound"),
        (lambda: pvec_parameters(10, 0, 1.0, 1e-6, 1.0), "d"),
        (lambda: pvec_parameters(10, 2, float("nan"), 1e-6, 1.0), "epsilon"),
        (lambda: pvec_parameters(10, 2, 1.0, 1e-6, 0.0), "l2_bound"),
        (lambda: pvec_parameters(10, 2, 1.0, 1e-6, 1.0, honest_fraction=0.2), "honest_fraction"),
        (lambda: pvec_parameters(10, 2, 2.5, 1e-6, 1.0, honest_fraction=0.5), "epsilon"),
        (lambda: tight_parameters(10, 2, 1.0, 1.0, 1.0), "delta"),
        (lambda: tight_parameters(10, 2, 1.0, 1e-6, 1.0, honest_fraction=0.0), "honest_fraction"),
        (lambda: tight_delta(1.0, 3, 10, 1.5, 1, 1), "p"),
        (lambda: tight_delta(1.0, 3, 10, 0.5, 1, 0), "noisy_users"),
        (lambda: tight_delta(-1.0, 3, 10, 0.5, 1, 1), "epsilon"),
    ],
)
def test_invalid_parameters_name_the_parameter(call, name: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"'{name}' parameter"):
        call()


# ------------------------------------------------------------------------------------------
# The tight accountant against brute force
# ------------------------------------------------------------------------------------------


def _view(s: float, m: int, p: float, size: int) -> np.ndarray:
    """Exact PMF of ⌊s⌋ + Ber(s − ⌊s⌋) + Bin(m, p): one coordinate of the protocol's view."""
    pmf = stats.binom.pmf(np.arange(m + 1), m, p)
    floor = math.floor(s)
    frac = s - floor
    out = np.zeros(size)
    out[floor : floor + m + 1] += (1 - frac) * pmf
    out[floor + 1 : floor + m + 2] += frac * pmf
    return out


def _hockey(P: np.ndarray, Q: np.ndarray, epsilon: float) -> float:
    """δ(ε) of the pair, both directions."""
    e = math.exp(epsilon)
    return max(np.maximum(P - e * Q, 0).sum(), np.maximum(Q - e * P, 0).sum())


def _exact_delta_d1(epsilon: float, g: int, m: int, p: float, step: float = 0.125) -> float:
    """max over encoded pairs (s, s′ = s + t), |t| ≤ g, on a grid, of the exact δ(ε) (d = 1).
    By translation invariance only the fractional part of s and the shift t matter."""
    size = m + 3 * g + 4
    worst = 0.0
    for base in np.arange(0.0, 1.0, step):
        P = _view(g + base, m, p, size)
        for t in np.arange(-g, g + 1e-9, step):
            worst = max(worst, _hockey(P, _view(g + base + t, m, p, size), epsilon))
    return worst


@pytest.mark.parametrize("m, p", [(60, 0.5), (80, 0.3)])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_tight_delta_bounds_brute_force_d1(m: int, p: float, epsilon: float) -> None:
    """Every integer shift |k| ≤ g and fractional inputs (rounding mixtures), p = 1/2 and not."""
    g = 3
    assert tight_delta(epsilon, g, m, p, d=1, noisy_users=1) >= _exact_delta_d1(epsilon, g, m, p)


def test_tight_delta_bounds_brute_force_d2() -> None:
    """d = 2: every reachable integer shift vector ‖k‖₂ ≤ g and a grid of fractional inputs."""
    g, m, p, epsilon = 2, 40, 0.5, 1.0
    size = m + 3 * g + 4
    worst = 0.0
    fractions = np.arange(0.0, 1.0, 0.25)
    shifts = np.arange(-g, g + 1e-9, 0.25)
    for f1 in fractions:
        for f2 in fractions:
            P = np.outer(_view(g + f1, m, p, size), _view(g + f2, m, p, size))
            for t1 in shifts:
                for t2 in shifts:
                    if t1 * t1 + t2 * t2 <= g * g + 1e-12:
                        Q = np.outer(_view(g + f1 + t1, m, p, size), _view(g + f2 + t2, m, p, size))
                        worst = max(worst, _hockey(P, Q, epsilon))
    bound = tight_delta(epsilon, g, m, p, d=2, noisy_users=1)
    assert bound >= worst
    assert worst > 0.02  # the check is not vacuous


@pytest.mark.parametrize("epsilon", [1.0, 1.5])
def test_tight_delta_is_within_20_percent_in_epsilon_d1(epsilon: float) -> None:
    """Tightness (d = 1, m = 4000, g = 10): the bound at 1.2ε is below the exact δ at ε."""
    g, m, p = 10, 4000, 0.5
    exact = _exact_delta_d1(epsilon, g, m, p, step=0.5)
    assert tight_delta(epsilon, g, m, p, d=1, noisy_users=1) >= exact
    assert tight_delta(1.2 * epsilon, g, m, p, d=1, noisy_users=1) <= exact


def test_tight_delta_counts_only_noisy_users() -> None:
    """b trials from M users is the same mechanism as M·b trials from one user."""
    assert tight_delta(1.0, 4, 30, 0.5, 3, noisy_users=10) == tight_delta(1.0, 4, 300, 0.5, 3, 1)


# ------------------------------------------------------------------------------------------
# tight_parameters
# ------------------------------------------------------------------------------------------


def test_tight_parameters_meet_the_target_with_little_slack() -> None:
    n, d, epsilon, delta = 200, 3, 1.0, 1e-5
    params = tight_parameters(n, d, epsilon, delta, 1.0)
    assert params.calibration == "tight" and params.p == 0.5
    assert params.delta <= delta
    check = tight_delta(epsilon, params.g, params.b, params.p, d, n, tail_budget=1e-3 * delta)
    assert check <= delta
    # 10 % fewer noise trials fail the target: the search does not overshoot.
    fewer = math.floor(0.9 * params.b)
    assert tight_delta(epsilon, params.g, fewer, 0.5, d, n, tail_budget=1e-3 * delta) > delta


def test_tight_parameters_small_b_lowers_p() -> None:
    # n ≫ g²: few trials per user, so p is refined below 1/2 (b < 100).
    params = tight_parameters(20_000, 2, 2.0, 1e-5, 1.0)
    assert params.b < 100 and params.p < 0.5
    assert tight_delta(2.0, params.g, params.b, params.p, 2, 20_000, tail_budget=1e-8) <= 1e-5


def test_tight_parameters_robust_needs_noise_from_the_honest_fraction() -> None:
    full = tight_parameters(200, 3, 1.0, 1e-5, 1.0)
    robust = tight_parameters(200, 3, 1.0, 1e-5, 1.0, honest_fraction=0.5)
    assert robust.g == full.g
    assert robust.noisy_users == 100
    # Same total trials from half the users: about twice the trials per user.
    assert robust.b == pytest.approx(2 * full.b, rel=0.03)
    assert tight_delta(1.0, robust.g, robust.b, 0.5, 3, 100, tail_budget=1e-8) <= 1e-5


def test_paper_over_tight_variance_at_the_issue_setting() -> None:
    """(n, d, ε, δ) = (1000, 10, 1, 1e-6), Δ₂ = 1: the paper's constants cost ~1.9e5× the variance;
    the tight calibration is within 25 % of a Gaussian mechanism with the same ℓ₂ sensitivity."""
    paper = pvec_parameters(1000, 10, 1.0, 1e-6, 1.0)
    tight = tight_parameters(1000, 10, 1.0, 1e-6, 1.0)
    ratio = paper.variance_bound / tight.variance_bound
    assert 1.5e5 < ratio < 2.5e5
    gaussian_variance = (2.0 * analytic_sigma(1.0, 1e-6)) ** 2  # sensitivity 2Δ₂
    assert gaussian_variance < tight.variance_bound < 1.25 * gaussian_variance


def test_tight_delta_bounds_dp_accounting_at_the_issue_setting() -> None:
    """Independent oracle at realistic scale: dp-accounting's *optimistic* PLD (a lower estimate of
    the true δ) of the d = 10 protocol at its tight parameters (n = 1000, ε = 1, δ = 1e-6), for
    integer shift vectors in the ℓ₂ ball (inputs whose encodings are integers). Also pins how close
    the bound is: the largest single-coordinate shift needs ε ≈ 0.92 at δ = 1e-6."""
    params = tight_parameters(1000, 10, 1.0, 1e-6, 1.0)
    g, m = params.g, params.b * params.n
    support = np.arange(m + 1)
    log_pmf = stats.binom.logpmf(support, m, params.p)
    keep = log_pmf > -80.0  # dropping mass keeps the optimistic estimate a lower bound

    def coordinate(shift: int):
        base = {int(x): float(v) for x, v in zip(support[keep], log_pmf[keep])}
        moved = {int(x) + shift: float(v) for x, v in zip(support[keep], log_pmf[keep])}
        return privacy_loss_distribution.from_two_probability_mass_functions(
            moved, base, pessimistic_estimate=False
        )

    cache = {}
    bound = tight_delta(1.0, g, params.b, params.p, 10, params.n, tail_budget=1e-9)
    assert bound <= 1e-6
    for shifts in ([g], [15] * 10, [30, 30, 20, 10], [35, 34]):
        assert sum(k * k for k in shifts) <= g * g
        composed = None
        for k in shifts:
            cache.setdefault(k, coordinate(k))
            composed = cache[k] if composed is None else composed.compose(cache[k])
        assert composed.get_delta_for_epsilon(1.0) <= bound
    assert 0.85 < cache[g].get_epsilon_for_delta(1e-6) < 1.0
