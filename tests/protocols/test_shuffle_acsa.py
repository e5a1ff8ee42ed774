"""Tests of ShuffleACSA (Cheu et al. 2022 Alg. 4; Thms 4.3, 4.7, 4.8) over the shared AC-SA core."""

from __future__ import annotations

import math

import numpy as np
import pytest

from panpriv.accounting.binomial import pvec_parameters
from panpriv.accounting.ledger import Guarantee
from panpriv.protocols import checks, scratch
from panpriv.protocols.acsa import Problem, phase_count, plan_runs
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import AbsoluteLoss, HingeLoss, LogisticLoss, SquaredLoss
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_base import NORM_SLACK, sum_variance_hint

X3, Y3 = checks.make_stream(3, 40, binary=True)
X3R, Y3R = checks.make_stream(3, 40, binary=False)

# Tight calibration; radius 20 keeps the noise visible. The horizon covers the checks' two feeds.
CASES = {
    "smooth": (lambda rng: ShuffleACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=80, batch_size=5, radius=20.0, rng=rng), X3, Y3),
    "moreau": (lambda rng: ShuffleACSA(3, HingeLoss(), 1.0, 1e-5, horizon=80, batch_size=5, radius=20.0, rng=rng), X3, Y3),
    "phases": (
        lambda rng: ShuffleACSA(
            3, AbsoluteLoss(ridge=0.2), 1.0, 1e-5, horizon=80, batch_size=5, radius=20.0, calibration="paper", rng=rng
        ),
        X3R,
        Y3R,
    ),
}


@pytest.mark.statistical
@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance(case, check):
    """panpriv.protocols.checks on each case; the statistical check fails falsely with probability ≤ 1e-3."""
    factory, X, y = CASES[case]
    check(factory, X, y)


def test_cases_use_the_shared_planner_with_the_pvec_noise_level():
    """Thm 4.3 (smooth: no smoothing), Thm 4.7 (non-smooth: Moreau), Thm 4.8 (strongly convex:
    k phases), planned by panpriv.protocols.acsa.plan_runs with ν = √v/L — v the PVEC variance."""
    smooth, moreau, phases = (CASES[c][0](0) for c in ("smooth", "moreau", "phases"))
    assert len(smooth.plans) == 1 and smooth.plans[0].smoothing is None
    assert len(moreau.plans) == 1 and moreau.plans[0].smoothing is not None
    assert len(phases.plans) == phase_count(80) == 3 and all(p.smoothing is not None for p in phases.plans)
    loss = LogisticLoss()
    learner = ShuffleACSA(3, loss, 0.5, 1e-6, horizon=10_000, radius=1.0, calibration="paper", rng=0)
    v = sum_variance_hint("paper", 3, 0.5, 1e-6, 1.0, 1.0)
    problem = Problem(3, 1.0, 0.25, 0.0, 0.0, 1.0, math.sqrt(v))
    assert learner.plans == plan_runs(problem, 10_000, moreau=False)
    # Thm 4.3's proof: b ∝ n^{3/5}; the oracle variance is L²/b + p v/b² (Cheu et al. 2022 Eq. (5)).
    plan = learner.plans[0]
    b = plan.batch_size(1)
    assert plan.sizes.oracle_std == pytest.approx(math.sqrt(1 / b + 3 * v / b**2))


def test_each_batch_size_has_its_pvec_and_every_record_one_round():
    learner = ShuffleACSA(3, LogisticLoss(), 1.0, 1e-6, horizon=23, batch_size=5, calibration="paper", rng=0)
    (plan,) = learner.plans
    sizes = [plan.batch_size(t) for t in range(1, plan.steps + 1)]
    assert sum(sizes) == 23 and set(sizes) == {5, 6}
    for b, vector_sum in learner.vector_sums.items():
        expected = pvec_parameters(b, 3, 1.0, 1e-6, 1.0 * (1 + NORM_SLACK))
        assert (vector_sum.n, vector_sum.g, vector_sum.b, vector_sum.p) == (b, expected.g, expected.b, expected.p)
    X, y = checks.make_stream(3, 23, binary=True)
    learner.learn_many(X[:10], y[:10])
    assert learner.state_dict()["step"] == 2 and learner.state_dict()["filled"] == 4  # batches of 6, 6, 6, 5
    learner.learn_many(X[10:], y[10:])
    assert learner.finished and learner.records_seen == 23
    with pytest.raises(InvalidInputError, match="horizon n = 23"):
        learner.learn_many(X[:1], y[:1])


@pytest.mark.parametrize("pooled", [True, False])
def test_round_replayed_by_hand(pooled: bool):
    """One round with the same seeded generator: PVEC on the gradients at θ^md_1 = 0, the analyzer's
    sum / b, then Lan's step θ_2 = Π(θ_1 − g/L_1). Pooled noise (the default) draws as
    ``estimate_sum(pooled_noise=True)``; ``pooled_noise = False`` as every user's ``randomize``."""
    loss = SquaredLoss(label_bound=1.0)
    learner = ShuffleACSA(3, loss, 1.0, 1e-5, horizon=20, batch_size=5, radius=3.0, calibration="paper", rng=9)
    learner.pooled_noise = pooled
    learner.learn_many(X3R[:5], Y3R[:5])
    vector_sum = learner.vector_sums[5]
    gradients = loss.gradient(np.zeros(3), loss.features(X3R[:5], 1.0), loss.labels(Y3R[:5]))
    if pooled:
        estimate = vector_sum.estimate_sum(gradients, np.random.default_rng(9), pooled_noise=True)
    else:
        estimate = vector_sum.analyze(vector_sum.randomize(gradients, np.random.default_rng(9)).sum(axis=0))
    prox = learner.plans[0].sizes.prox_weight(1)
    expected = learner._ball.project(-(estimate / 5) / prox)
    np.testing.assert_allclose(learner.state_dict()["theta"], expected, rtol=1e-12)


def test_privacy_report():
    learner = ShuffleACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=80, batch_size=5, radius=20.0)
    learner.learn_many(X3, Y3)
    report = learner.privacy()
    assert report.output == Guarantee(1.0, learner.vector_sums[5].parameters.delta)
    assert report.intrusion.epsilon > 1.0 and report.intrusion.delta == 1e-5
    assert {"Cheu et al. 2022, Alg. 4", "Cheu et al. 2022, Thm 4.3", "Cheu et al. 2022, Thm 3.2", "Cheu et al. 2022, Def. C.2"} <= set(report.references)
    hinge = CASES["phases"][0](0).privacy()
    assert {"Cheu et al. 2022, Thm 4.7", "Cheu et al. 2022, Thm 4.8"} <= set(hinge.references) and not hinge.intrusion.is_meaningful


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"horizon": 0}, "'horizon' parameter of ShuffleACSA"),
        ({"batch_size": -1}, "'batch_size' parameter of ShuffleACSA"),
        ({"strong_convexity": -1.0}, "'strong_convexity' parameter of ShuffleACSA"),
        ({"smoothing": "none"}, "'smoothing' parameter of ShuffleACSA .* non-smooth hinge"),
        ({"loss": LogisticLoss(), "smoothing": "moreau"}, "'smoothing' parameter .*no closed-form prox"),
        ({"smoothing": "nesterov"}, "'smoothing' parameter of ShuffleACSA"),
        ({"calibration": "tigh"}, "'calibration' parameter of ShuffleACSA"),
        ({"epsilon": 16.0}, "ShuffleACSA: .*'epsilon' parameter of pvec_parameters"),
    ],
)
def test_invalid_parameters_are_named(kwargs, message):
    arguments = {"dim": 3, "loss": HingeLoss(), "epsilon": 1.0, "delta": 1e-5, "horizon": 40, "calibration": "paper", **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        ShuffleACSA(**arguments)


def test_invalid_states_are_rejected():
    learner = ShuffleACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=20, batch_size=5, calibration="paper", rng=0)
    learner.learn_many(X3[:7], Y3[:7])
    state = learner.state_dict()
    with pytest.raises(InvalidInputError, match="do not fit the planned run"):
        learner.load_state_dict({**state, "filled": 5})
    with pytest.raises(InvalidInputError, match="'phase' parameter"):
        learner.load_state_dict({**state, "phase": 3})
    with pytest.raises(InvalidInputError, match="'theta_md'"):
        learner.load_state_dict({**state, "theta_md": np.zeros(4)})


def _per_round_clip(learner: ShuffleACSA) -> ShuffleACSA:
    """The learner with the pooled rounds' clip replaced by the per-round reference
    (scratch.clipped_gradients over the round's rows, as before the block's norms were used)."""

    def clipped(Z, labels, norms, squares):
        theta, smoothing = learner._query()
        return scratch.clipped_gradients(learner.loss, theta, Z, labels, learner._lipschitz, learner._scratch, smoothing)

    learner._clipped_gradients = clipped  # type: ignore[method-assign]
    return learner


@pytest.mark.parametrize("loss", [LogisticLoss(intercept=True), HingeLoss()], ids=["logistic", "hinge-moreau"])
def test_pooled_rounds_clip_from_block_norms_as_the_per_round_reference(loss) -> None:
    """Seeded, pooled, gradients clipped (gradient_bound below L), micro-batches straddling
    rounds, several runs: the learner whose rounds clip w_i·z_i from the block's row norms ends
    where the per-round clipped_gradients reference ends, to 1e-12 (the clipped rows differ by
    ulps; PVEC's randomized rounding of the same seeded uniforms then agrees)."""
    X, y = checks.make_stream(4, 300, binary=True, seed=6)

    def make() -> ShuffleACSA:
        return ShuffleACSA(4, loss, 1.0, 1e-5, horizon=300, batch_size=9, radius=3.0, gradient_bound=0.2, rng=13)

    new, reference = make(), _per_round_clip(make())
    for start, stop in ((0, 4), (4, 50), (50, 51), (51, 300)):
        new.learn_many(X[start:stop], y[start:stop])
        reference.learn_many(X[start:stop], y[start:stop])
    a, b = new.state_dict(), reference.state_dict()
    assert a["totals"].tolist() == b["totals"].tolist() and a["records"] == 300
    for key in ("theta", "theta_ag", "theta_md"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12, atol=1e-14, err_msg=key)
