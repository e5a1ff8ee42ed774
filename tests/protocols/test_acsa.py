"""Tests of the AC-SA core (panpriv.protocols.acsa): Lan's step sizes and updates, and the plans."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from panpriv.protocols.acsa import (
    DEFAULT_TUNING,
    Iterate,
    Problem,
    StepSizes,
    Tuning,
    alpha,
    effective_gradient_bound,
    phase_count,
    plan_run,
    plan_runs,
    step,
)
from panpriv.protocols.geometry import L2Ball
from panpriv.protocols.losses import SquaredLoss

PROBLEM = Problem(dim=21, lipschitz=1.0, smoothness=0.25, ridge=0.0, strong_convexity=0.0, radius=5.0, noise_multiplier=12.0)


def test_alpha_is_lans_two_over_t_plus_one():
    assert [alpha(t) for t in (1, 2, 3, 9)] == [1.0, 2 / 3, 0.5, 0.2]


def test_prox_weight_formula():
    sizes = StepSizes(steps=8, smoothness=0.25, oracle_std=2.0, distance=4.0, noise_step=1.0)
    base = 2 * 0.25 + 10**1.5 * 2.0 / 4.0
    assert sizes.base == pytest.approx(base, rel=1e-15)
    assert sizes.prox_weight(1) == pytest.approx(base)
    assert sizes.prox_weight(3) == pytest.approx(base / 2)


def test_step_numbers():
    """One step from θ_1 = θ^ag_1 = θ^md_1 = 0 with t = 2 state, checked by hand."""
    ball = L2Ball(100.0)
    sizes = StepSizes(steps=5, smoothness=1.0, oracle_std=0.0, distance=1.0)  # base = 2, L_t = 4/(t+1)
    current = Iterate(np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([0.5, 0.5]), 2, 2)
    nxt = step(current, np.array([4.0, -4.0]), sizes, ball)
    L2 = 4.0 / 3.0
    theta = np.array([1.0, 0.0]) - np.array([4.0, -4.0]) / L2  # (-2, 3)
    theta_ag = (2 / 3) * theta + (1 / 3) * np.array([0.0, 1.0])
    theta_md = 0.5 * theta + 0.5 * theta_ag  # α_3 = 1/2
    np.testing.assert_allclose(nxt.theta, theta)
    np.testing.assert_allclose(nxt.theta_ag, theta_ag)
    np.testing.assert_allclose(nxt.theta_md, theta_md)
    assert nxt.t == 3


def test_step_projects_onto_theta():
    ball = L2Ball(1.0)
    sizes = StepSizes(steps=5, smoothness=1.0, oracle_std=0.0, distance=1.0)
    nxt = step(Iterate.start(np.zeros(3)), np.array([100.0, 0.0, 0.0]), sizes, ball)
    np.testing.assert_allclose(nxt.theta, [-1.0, 0.0, 0.0])


def test_exact_gradients_converge_at_the_accelerated_rate():
    """With σ = 0, AC-SA is Nesterov-accelerated: on f(θ) = ½ θᵀAθ − bᵀθ (β = 1) the gap after T
    steps is below 4β‖θ_1 − θ*‖²/(T(T+1)) (Lan 2012, Cor. 1 with σ = 0), much faster than 1/T."""
    rng = np.random.default_rng(0)
    A = np.diag(np.linspace(1e-3, 1.0, 10))
    theta_star = rng.normal(size=10)
    f = lambda th: 0.5 * (th - theta_star) @ A @ (th - theta_star)  # noqa: E731
    ball = L2Ball(100.0)
    for T in (10, 40, 160):
        sizes = StepSizes(steps=T, smoothness=1.0, oracle_std=0.0, distance=1.0)
        it = Iterate.start(np.zeros(10))
        for _ in range(T):
            it = step(it, A @ (it.theta_md - theta_star), sizes, ball)
        gap = f(it.theta_ag)
        assert gap <= 4 * 1.0 * (theta_star @ theta_star) / (T * (T + 1))


def test_gradient_restart_rule():
    """O'Donoghue & Candès (2015): restart from θ^ag_{t+1} when ⟨g_t, θ^ag_{t+1} − θ^ag_t⟩ > 0."""
    ball = L2Ball(100.0)
    sizes = StepSizes(steps=9, smoothness=1.0, oracle_std=0.0, distance=1.0)  # L_t = 4/(t+1)
    current = Iterate(np.array([-1.0, 0.0]), np.array([1.0, 0.0]), np.array([0.0, 0.0]), 3, 5)
    # g = (−0.1, 0): θ_4 = θ_3 − g/L_3 = (−0.9, 0), θ^ag_4 = ½θ_4 + ½θ^ag_3 = (0.05, 0), so
    # θ^ag moved by (−0.95, 0) and ⟨g, Δ⟩ = 0.095 > 0.
    uphill = step(current, np.array([-0.1, 0.0]), sizes, ball, restart=True)
    np.testing.assert_allclose(uphill.theta_ag, [0.05, 0.0])
    for sequence in (uphill.theta, uphill.theta_md):
        np.testing.assert_array_equal(sequence, uphill.theta_ag)
    assert (uphill.t, uphill.batch) == (1, 6)
    downhill = step(current, np.array([0.1, 0.0]), sizes, ball, restart=True)  # ⟨g, Δ⟩ < 0
    assert (downhill.t, downhill.batch) == (4, 6)
    assert step(current, np.array([-0.1, 0.0]), sizes, ball).t == 4  # restart=False: Lan's step


def test_restarts_remove_the_oscillation_on_a_strongly_convex_quadratic():
    """f(θ) = (μ/2)‖θ − θ*‖², μ = 0.05 far below the declared β = 1: Lan's θ^ag oscillates around
    θ*, so its gap is not monotone in T; with restarts it falls with T, and far below."""
    mu, theta_star, ball = 0.05, np.full(5, 0.4), L2Ball(10.0)
    gaps: dict[bool, list[float]] = {False: [], True: []}
    for restart, T in itertools.product((False, True), range(20, 121, 5)):
        sizes = StepSizes(steps=T, smoothness=1.0, oracle_std=0.0, distance=2.0)
        it = Iterate.start(np.zeros(5))
        for _ in range(T):
            it = step(it, mu * (it.theta_md - theta_star), sizes, ball, restart=restart)
        gaps[restart].append(0.5 * mu * float(np.sum((it.theta_ag - theta_star) ** 2)))
    assert any(b > 10 * a for a, b in zip(gaps[False], gaps[False][1:]))  # Lan: swings up 10× with T
    assert all(b <= a for a, b in zip(gaps[True], gaps[True][1:]))
    assert all(r <= p / 100 for r, p in zip(gaps[True][8:], gaps[False][8:]))  # T ≥ 60


def test_effective_gradient_bound():
    loss = SquaredLoss(label_bound=2.0)
    assert effective_gradient_bound(loss, 1.0, 3.0, None) == loss.lipschitz(1.0, 3.0) == 5.0
    assert effective_gradient_bound(loss, 1.0, 3.0, 1.5) == 1.5
    assert effective_gradient_bound(loss, 1.0, 3.0, 7.0) == 5.0
    problem = Problem.for_loss(loss, dim=4, feature_bound=1.0, radius=3.0, strong_convexity=0.0,
                               noise_multiplier=1.0, gradient_bound=1.5)
    assert problem.lipschitz == 1.5


def test_phase_count():
    assert [phase_count(n) for n in (2, 16, 1000, 10**6)] == [1, 2, 4, 5]


def test_batch_size_and_smoothing_follow_the_proofs():
    n, D = 10**6, PROBLEM.diameter
    noise = math.sqrt(21) * 12.0
    plan = plan_run(PROBLEM, n, D, moreau=False)
    assert DEFAULT_TUNING.batch == 1.0
    b = round(n**0.6 * (noise * 1.0 / (0.25 * D)) ** 0.4)  # Cheu et al. 2022, proof of Thm 4.3
    assert b == 13707 and plan.steps == n // b == 72 and plan.smoothing is None
    assert plan.batch_size(1) == 13889 and plan.batch_size(72) == 13888  # n spread over T batches
    smoothed = plan_run(PROBLEM, n, D, moreau=True)
    beta_s = DEFAULT_TUNING.smoothing * n ** (2 / 3) / (D * noise ** (2 / 3))  # Cheu et al. 2022, proof of Thm 4.7
    assert smoothed.smoothing == pytest.approx(beta_s, rel=1e-12)
    assert smoothed.sizes.smoothness == pytest.approx(min(beta_s, 0.25))
    tuned = plan_run(PROBLEM, n, D, moreau=False, tuning=Tuning(batch=2.0))
    assert tuned.steps == n // round(2.0 * b)


def test_no_noise_means_batches_of_one_and_capped_smoothing():
    quiet = Problem(dim=5, lipschitz=1.0, smoothness=1.0, ridge=0.0, strong_convexity=0.0, radius=1.0, noise_multiplier=0.0)
    assert plan_run(quiet, 100, 2.0, moreau=False).steps == 100
    assert plan_run(quiet, 100, 2.0, moreau=True).smoothing == 100 / 2.0  # cap L n / D


def test_batches_use_every_record_exactly_once():
    plan = plan_run(PROBLEM, 10_007, PROBLEM.diameter, moreau=False, batch_size=100)
    sizes = [plan.batch_size(t) for t in range(1, plan.steps + 1)]
    assert sum(sizes) == 10_007 and set(sizes) == {100, 101} and plan.steps == 100
    assert plan_run(PROBLEM, 50, 1.0, moreau=False, batch_size=80).steps == 1  # clamped to the run


def test_oracle_std():
    assert PROBLEM.oracle_std(100) == pytest.approx(math.sqrt(1 / 100 + 21 * 144 / 100**2))


def test_strongly_convex_phases():
    """Cheu et al. 2022, Thm 4.8: k disjoint phases, D_1 = min(D, L_F/λ), then D_{i+1} = min(D_i, √(2Δ_i/λ))."""
    problem = Problem(dim=21, lipschitz=1.0, smoothness=0.25, ridge=0.5, strong_convexity=0.5, radius=5.0, noise_multiplier=12.0)
    plans = plan_runs(problem, 10**5, moreau=False)
    assert len(plans) == phase_count(10**5) == 5
    assert sum(p.records for p in plans) == 10**5
    distances = [p.sizes.distance for p in plans]
    assert distances[0] == min(10.0, (1.0 + 0.5 * 5.0) / 0.5)
    for previous, plan, d in zip(plans, plans[1:], distances[1:]):
        assert d == pytest.approx(min(previous.sizes.distance, math.sqrt(2 * previous.predicted_error / 0.5)))
    assert distances[-1] < distances[0]
    assert len(plan_runs(PROBLEM, 10**5, moreau=False)) == 1  # no strong convexity: one run


# -- the batch rule's noise dimension ------------------------------------------------------------


def _problem(dim: int) -> Problem:
    from panpriv.protocols.losses import LogisticLoss

    return Problem.for_loss(LogisticLoss(), dim=dim, feature_bound=1.0, radius=3.0, strong_convexity=0.0,
                            noise_multiplier=8.0)


@pytest.mark.parametrize("dim", [1, 5, 20])
def test_the_glm_rule_is_the_worst_case_rule_up_to_the_reference_dimension(dim: int) -> None:
    from panpriv.protocols.acsa import RESTART_TUNING, plan_runs

    problem = _problem(dim)
    for tuning in (DEFAULT_TUNING, RESTART_TUNING):
        glm = plan_runs(problem, 100_000, moreau=False, tuning=tuning, batch_rule="glm")
        worst = plan_runs(problem, 100_000, moreau=False, tuning=tuning, batch_rule="worst-case")
        assert glm == worst


@pytest.mark.parametrize("dim", [100, 500, 1000])
def test_above_it_the_glm_rule_stops_the_noise_term_growing_with_p(dim: int) -> None:
    from panpriv.protocols.acsa import GLM_REFERENCE_DIM, RESTART_TUNING, noise_dimension, plan_runs

    problem = _problem(dim)
    assert (noise_dimension(problem, "glm"), noise_dimension(problem, "worst-case")) == (GLM_REFERENCE_DIM, dim)
    records = 200_000
    glm = plan_runs(problem, records, moreau=False, tuning=RESTART_TUNING, batch_rule="glm")[0]
    worst = plan_runs(problem, records, moreau=False, tuning=RESTART_TUNING, batch_rule="worst-case")[0]
    # b ∝ (√p)^{2/5} = p^{1/5}: the batches shrink by (p/20)^{1/5}, the steps grow by as much.
    ratio = worst.batch_size(1) / glm.batch_size(1)
    assert ratio == pytest.approx((dim / GLM_REFERENCE_DIM) ** 0.2, rel=0.03)  # b_t = ⌊n/T⌋ or ⌊n/T⌋ + 1 rounds
    assert glm.steps > worst.steps
