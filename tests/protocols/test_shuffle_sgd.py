"""Tests of ShuffleSGD (Cheu et al. 2022 Alg. 3, Thm 4.1) and of the shared PVEC round machinery."""

from __future__ import annotations

import math

import numpy as np
import pytest

from panpriv.accounting.binomial import pvec_parameters, tight_delta, tight_parameters
from panpriv.accounting.ledger import Guarantee
from panpriv.protocols import checks
from panpriv.protocols.encoder import VectorSum
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.geometry import L2Ball
from panpriv.protocols.losses import HingeLoss, LogisticLoss, SquaredLoss
from panpriv.protocols.randomness import SEEDED_WARNING
from panpriv.protocols.sgd import AveragedSGD
from panpriv.protocols.shuffle_base import LOCAL_GRID, NORM_SLACK, message_guarantee, sum_variance_hint
from panpriv.protocols.shuffle_sgd import ShuffleSGD, plan_batch_size

X3, Y3 = checks.make_stream(3, 40, binary=True)


def factory(rng):
    """Tight calibration, b = 7 (the stream covers five rounds and ends mid-round); radius 20
    keeps the iterates off Θ's boundary so the noise shows in the state."""
    return ShuffleSGD(3, LogisticLoss(), 1.0, 1e-5, batch_size=7, radius=20.0, rng=rng)


@pytest.mark.statistical
@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
def test_conformance(check):
    """panpriv.protocols.checks; the statistical check fails falsely with probability ≤ 1e-3.
    (Seeded split determinism does not apply: messages are drawn per micro-batch chunk.)"""
    check(factory, X3, Y3)


@pytest.mark.parametrize("pooled", [True, False])
def test_round_is_pvec_of_clipped_gradients_and_steps_with_public_G(pooled: bool):
    """One full round, replayed by hand with the same seeded generator: PVEC on the gradients at
    θ₁ = 0, the analyzer's sum / b, and θ₂ = Π(θ₁ − D/√G² · ĝ) (AveragedSGD's first step). Pooled
    noise (the default) draws as ``estimate_sum(pooled_noise=True)`` does (roundings, then one
    Bin(b·trials, p) per coordinate); ``pooled_noise = False`` as every user's ``randomize``."""
    loss = SquaredLoss(label_bound=1.0, ridge=0.1)
    X, y = checks.make_stream(3, 7, binary=False)
    learner = ShuffleSGD(3, loss, 1.0, 1e-5, batch_size=7, radius=2.0, calibration="paper", rng=5)
    learner.pooled_noise = pooled
    learner.learn_many(X, y)
    vector_sum = learner.vector_sum
    gradients = loss.gradient(np.zeros(3), loss.features(X, 1.0), loss.labels(y))
    if pooled:
        estimate = vector_sum.estimate_sum(gradients, np.random.default_rng(5), pooled_noise=True)
    else:
        estimate = vector_sum.analyze(vector_sum.randomize(gradients, np.random.default_rng(5)).sum(axis=0))
    mean = estimate / 7  # + ridge gradient at θ₁ = 0, which is 0
    expected = learner._ball.project(-mean * 4.0 / math.sqrt(learner.gradient_bound_sq))
    np.testing.assert_allclose(learner.state_dict()["theta"], expected, rtol=1e-12)
    assert learner.state_dict()["filled"] == 0 and not learner.state_dict()["totals"].any()


def test_noise_level_is_thm_32_and_G_is_thm_41_L_G():
    """Paper calibration: PVEC's (g, b, p) are those of Cheu et al. 2022 Thm 3.2 at (n = b, d, ε, δ, Δ₂ = L);
    G² = (√(L² + d·v/b²) + λr)² with v PVEC's per-coordinate variance (Cheu et al. 2022 Thm 4.1, Eq. (4))."""
    loss = LogisticLoss(intercept=True, ridge=0.05)
    learner = ShuffleSGD(3, loss, 0.5, 1e-6, batch_size=64, radius=2.0, calibration="paper", rng=0)
    L = loss.lipschitz(1.0, 2.0)
    assert L == pytest.approx(math.sqrt(2.0))
    expected = pvec_parameters(64, 4, 0.5, 1e-6, L * (1 + NORM_SLACK))
    parameters = learner.vector_sum.parameters
    assert (parameters.g, parameters.b, parameters.p) == (expected.g, expected.b, expected.p)
    v = expected.variance_bound
    assert learner.gradient_bound_sq == pytest.approx((math.sqrt(L**2 + 4 * v / 64**2) + 0.05 * 2.0) ** 2, rel=1e-12)
    report = learner.privacy()
    assert report.output == Guarantee(0.5, 1e-6)
    assert {"Cheu et al. 2022, Alg. 3", "Cheu et al. 2022, Thm 4.1", "Cheu et al. 2022, Thm 3.2"} <= set(report.references)


def test_tight_calibration_is_the_accountants():
    learner = factory(0)
    expected = tight_parameters(7, 3, 1.0, 1e-5, learner._lipschitz * (1 + NORM_SLACK), 1.0)
    assert learner.vector_sum.parameters == expected
    assert learner.privacy().output == Guarantee(1.0, expected.delta)
    assert expected.delta <= 1e-5


def test_planned_batch_is_thm_41s_with_its_constant():
    """b = √(p v)/L minimises L²b + p v/b (Lemma 4.2 with T = n/b). Under the paper's calibration
    v ≈ 58 320 L² log(2/δ̂) log(1/δ̂)/ε², so b/(√p log(p/δ)/ε) — Thm 4.1's b without its constant —
    stays near 241 across p and ε."""
    ratios = []
    for dim, epsilon in ((3, 1.0), (12, 1.0), (3, 4.0), (30, 0.5)):
        learner = ShuffleSGD(dim, LogisticLoss(), epsilon, 1e-6, calibration="paper")
        v = sum_variance_hint("paper", dim, epsilon, 1e-6, 1.0, 1.0)
        b = learner.vector_sum.n
        assert b == plan_batch_size(dim, 1.0, v, 1 << 20) == round(math.sqrt(dim * v))
        ratios.append(b / (math.sqrt(dim) * math.log(dim / 1e-6) / epsilon))
    assert all(200 < r < 280 for r in ratios), ratios
    assert ShuffleSGD(3, LogisticLoss(), 1.0, 1e-6, calibration="paper", horizon=500).vector_sum.n == 500


def test_privacy_report_intrusion_is_one_message():
    """Default mode: the intrusion guarantee is the local guarantee of one PVEC message — the
    least ε on the grid ε·2^{k/4} at which the tight accountant with one noisy user gives δ."""
    learner = ShuffleSGD(3, LogisticLoss(), 1.0, 1e-5, batch_size=7, radius=20.0)
    learner.learn_many(X3, Y3)
    report = learner.privacy()
    vs = learner.vector_sum
    assert report.output == Guarantee(1.0, vs.parameters.delta)
    local = report.intrusion
    assert local.delta == 1e-5 and local.epsilon > 1.0  # b = 7 users' noise vs one user's
    assert tight_delta(local.epsilon, vs.g, vs.b, vs.p, 3, 1) <= 1e-5
    assert tight_delta(local.epsilon / LOCAL_GRID, vs.g, vs.b, vs.p, 3, 1) > 1e-5
    assert message_guarantee(vs, 1e-5, 1.0) == local
    assert report.records == 40 and SEEDED_WARNING not in report.assumptions
    seeded = factory(1).privacy()
    assert not seeded.intrusion.is_meaningful and SEEDED_WARNING in seeded.assumptions


def test_local_bound_too_costly_to_compute_is_reported_as_none():
    """The paper's g ≥ 2Δ₂√n: at n = 10⁶ users and Δ₂ = 5, g·σ is far above LOCAL_COST_LIMIT, so
    the (vacuous, always true) guarantee none is reported instead of running the accountant."""
    vs = VectorSum(10**6, 3, 1.0, 1e-5, 5.0, calibration="paper")
    assert vs.g >= 10_000
    assert not message_guarantee(vs, 1e-5, 1.0).is_meaningful


def test_default_mode_draws_fresh_noise_and_state_holds_only_messages():
    states = []
    for _ in range(2):
        learner = ShuffleSGD(3, LogisticLoss(), 1.0, 1e-5, batch_size=7, radius=20.0)
        learner.learn_many(X3[:10], Y3[:10])
        states.append(learner.state_dict())
    assert states[0]["filled"] == 3
    for key in ("totals", "theta"):
        assert not np.array_equal(states[0][key], states[1][key])
    assert set(states[0]) == {"records", "filled", "totals", "theta", "average", "weight", "moment"}


def test_learns_a_logistic_model():
    """A seeded run (tight calibration, ε = 4, d = 5) on 20 000 records of checks.make_stream closes
    most of the gap between θ = 0 and the generating parameter on held-out records."""
    X, y = checks.make_stream(5, 30_000, binary=True, seed=7)
    loss = LogisticLoss()
    learner = ShuffleSGD(5, loss, 4.0, 1e-6, radius=4.0, rng=0)
    learner.learn_many(X[:20_000], y[:20_000])
    Z, labels = loss.features(X[20_000:], 1.0), loss.labels(y[20_000:])
    reference = loss.objective(3.0 * np.linspace(-1.0, 1.0, 5), Z, labels)  # make_stream's model
    gap = loss.objective(np.zeros(5), Z, labels) - reference
    assert loss.objective(learner.release(), Z, labels) - reference < 0.3 * gap


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": -1.0}, "'epsilon' parameter of ShuffleSGD must be a finite float in \\(0, inf\\)"),
        ({"delta": 1.0}, "'delta' parameter of ShuffleSGD"),
        ({"batch_size": 0}, "'batch_size' parameter of ShuffleSGD"),
        ({"calibration": "gaussian"}, "'calibration' parameter of ShuffleSGD"),
        ({"honest_fraction": 1.5}, "'honest_fraction' parameter of ShuffleSGD"),
        ({"horizon": -3}, "'horizon' parameter of ShuffleSGD"),
        ({"epsilon": 20.0, "calibration": "paper"}, "ShuffleSGD: .*'epsilon' parameter of pvec_parameters"),
        ({"honest_fraction": 0.2, "calibration": "paper"}, "ShuffleSGD: .*'honest_fraction'"),
        ({"loss": ["hinge"]}, "'loss' parameter"),
    ],
)
def test_invalid_parameters_are_named(kwargs, message):
    arguments = {"dim": 3, "loss": HingeLoss(), "epsilon": 1.0, "delta": 1e-5, "batch_size": 4, **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        ShuffleSGD(**arguments)


def test_invalid_batches_and_states_are_rejected():
    learner = ShuffleSGD(3, LogisticLoss(), 1.0, 1e-5, batch_size=7, rng=0)
    with pytest.raises(InvalidInputError, match="X must have shape"):
        learner.learn_many(np.ones((2, 4)), np.ones(2))
    with pytest.raises(InvalidInputError, match="X contains NaN"):
        learner.learn_many(np.full((2, 3), np.nan), np.ones(2))
    learner.learn_many(X3[:3], Y3[:3])
    state = learner.state_dict()
    with pytest.raises(InvalidInputError, match="lacks 'totals'"):
        learner.load_state_dict({k: v for k, v in state.items() if k != "totals"})
    with pytest.raises(InvalidInputError, match="'filled' parameter .* < b = 7"):
        learner.load_state_dict({**state, "filled": 7})
    with pytest.raises(InvalidInputError, match="'totals' parameter .* integer counts"):
        learner.load_state_dict({**state, "totals": state["totals"] + 0.5})
    with pytest.raises(InvalidInputError, match="'theta'"):
        learner.load_state_dict({**state, "theta": np.zeros(2)})


def test_in_place_step_is_the_step_bit_for_bit() -> None:
    """AveragedSGD.step_in_place (the rounds' step) gives step's θ, θ̄, T and ΣG² bit for bit
    over 300 steps, the projection active in most (gradients large against the ball)."""
    rng = np.random.default_rng(2)
    ball = L2Ball(0.7)
    reference, in_place = AveragedSGD.start(6), AveragedSGD.start(6)
    work = np.zeros(6)
    projected = 0
    for _ in range(300):
        gradient, bound = rng.normal(size=6) * rng.choice([0.01, 1.0, 30.0]), float(rng.uniform(0.1, 5.0))
        reference = reference.step(gradient, bound, ball)
        in_place = in_place.step_in_place(gradient, bound, ball, work)
        projected += bool(np.linalg.norm(reference.theta) >= 0.7 * (1 - 1e-12))
        for key, value in reference.state().items():
            np.testing.assert_array_equal(in_place.state()[key], value, err_msg=key)
    assert 50 < projected < 300

