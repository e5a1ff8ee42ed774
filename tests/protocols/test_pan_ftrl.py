"""Tests of PanPrivateFTRL: conformance, the algorithm against an independent DP-FTRL, the noise, the
checkpoint rule, the plan and the report.

Oracles: a plain-numpy DP-FTRL over the same leaves (prefix sums of clipped gradient sums, the
closed-form step) with the learner's draws recorded; KS and variance tests for the draws; the
accountant of panpriv.accounting.tree (itself checked by brute force in tests/accounting/test_tree.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.tree import tree_epsilon, tree_levels, tree_sigma
from panpriv.protocols import checks
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import LogisticLoss, SquaredLoss, clip_rows
from panpriv.protocols.pan_acsa import FIRST_EPOCH, SENSITIVITY_SLACK
from panpriv.protocols.pan_ftrl import PanPrivateFTRL, Plan, leaf_size_rule
from panpriv.protocols.randomness import SEEDED_WARNING

X3, Y3 = checks.make_stream(dim=3, records=40, binary=True)
X3R, Y3R = checks.make_stream(dim=3, records=40, binary=False)
CASES = {
    "logistic": (lambda rng: PanPrivateFTRL(3, "logistic", 1.0, 1e-5, horizon=40, leaf_size=3, radius=20.0, rng=rng), X3, Y3),
    "squared-ridge-last": (
        lambda rng: PanPrivateFTRL(3, {"name": "squared", "ridge": 0.2}, 2.0, 1e-5, horizon=16, leaf_size=2,
                                   radius=5.0, output="last", rng=rng),
        X3R, Y3R,
    ),
}


@pytest.mark.statistical
@pytest.mark.parametrize("check", [*checks.ALL_CHECKS, checks.check_seeded_split_determinism], ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance(case, check):
    """panpriv.protocols.checks; the draws happen per leaf, so a seed gives the same state whatever
    the micro-batches (the second horizon, 16 < 40 records, covers a later epoch)."""
    factory, X, y = CASES[case]
    check(factory, X, y)


class Recorder:
    """Replaces the learner's noise source: records each draw's target row and σ, and adds
    ``value``·σ (0: the noiseless algorithm)."""

    def __init__(self, value: float = 0.0) -> None:
        self.calls: list[float] = []
        self.value = value

    def add_gaussian(self, out: np.ndarray, std: float) -> None:
        self.calls.append(std)
        out += self.value * std

    @property
    def is_seeded(self) -> bool:
        return True


def reference_ftrl(X, y, loss, plan: Plan, radius: float, L: float, average: bool) -> np.ndarray:
    """DP-FTRL without noise, written from Kairouz et al. 2021 Alg. 1: leaves of the plan's sizes,
    gradients at the leaf's iterate clipped to L, θ = Π((θ₀/η − S)/(1/η + λR))."""
    Z, labels = loss.features(X, 1.0), loss.labels(y)
    theta = np.zeros(Z.shape[1])
    center, total, mean = theta.copy(), np.zeros_like(theta), theta.copy()
    start = 0
    for leaf in range(plan.leaves):
        rows = slice(start, start + plan.leaf_size(leaf))
        start = rows.stop
        total += clip_rows(loss.gradient(theta, Z[rows], labels[rows]), L).sum(axis=0)
        theta = (center / plan.eta - total) / (1.0 / plan.eta + loss.ridge * start)
        theta *= min(1.0, radius / np.linalg.norm(theta))
        mean += (theta - mean) / (leaf + 1)
    return mean if average else theta


@pytest.mark.parametrize(("loss", "output"), [(LogisticLoss(intercept=True), "average"), (SquaredLoss(ridge=0.3), "last")])
def test_without_noise_it_is_dp_ftrl_on_prefix_sums(loss, output) -> None:
    """With the draws replaced by zeros, the sum of the closed nodes is the clean prefix sum at
    every leaf and the learner is DP-FTRL (to rounding), whatever the micro-batches."""
    X, y = checks.make_stream(4, 203, binary=loss.binary_labels, seed=3)
    learner = PanPrivateFTRL(4, loss, 1.0, 1e-6, horizon=203, leaf_size=7, radius=2.0, output=output, rng=0)
    learner._noise = Recorder()  # type: ignore[assignment]
    checks.learn_in_chunks(learner, X, y, [5, 11, 1, 40])
    plan = learner.plan(0)
    assert plan.leaves == 29 and learner._epoch == 1  # the epoch of 203 records is over
    expected = reference_ftrl(X, y, loss, plan, 2.0, learner.gradient_norm_bound, output == "average")
    np.testing.assert_allclose(learner.release(), expected, rtol=1e-9, atol=1e-12)


def test_every_node_gets_two_draws_and_the_tree_opens_only_the_nodes_prefixes_use() -> None:
    """29 leaves: the left children that end by leaf 29 — 15 + 7 + 4 + 2 + 1 = 29 nodes, one closed
    at the end of each leaf — each opened and closed with a draw of the plan's σ: 58 draws."""
    X, y = checks.make_stream(4, 203, binary=True, seed=3)
    learner = PanPrivateFTRL(4, "logistic", 1.0, 1e-6, horizon=203, leaf_size=7, radius=2.0, rng=0)
    recorder = Recorder()
    learner._noise = recorder  # type: ignore[assignment]
    learner.learn_many(X, y)
    plan = learner.plan(0)
    opened = sum(len(plan.opened_at(leaf)) for leaf in range(plan.leaves))
    left_children = sum(1 for j in range(plan.levels) for k in range(0, plan.leaves, 2 << j) if k + (1 << j) <= plan.leaves)
    assert opened == left_children == 15 + 7 + 4 + 2 + 1 == plan.leaves
    assert len(recorder.calls) == opened + plan.leaves and set(recorder.calls) == {plan.sigma}


def test_prefix_noise_has_variance_two_sigma_squared_per_node() -> None:
    """Statistical: after c leaves the prefix sum's noise is the sum over popcount(c) nodes of Z + Z′,
    N(0, 2σ²·popcount(c)) per coordinate (KS against that normal, 300 seeds). Zero features and no
    intercept make every gradient 0, so the closed nodes hold the noise alone."""
    zeros = np.zeros((15, 3))
    values = []
    for seed in range(300):
        learner = PanPrivateFTRL(3, {"name": "logistic", "intercept": False}, 1.0, 1e-5, horizon=40, leaf_size=1,
                                 rng=seed)
        learner.learn_many(zeros, Y3[:15])
        values.extend(learner._closed.sum(axis=0).tolist())
    scale = learner.plan().sigma * math.sqrt(2 * 4)  # 15 = 1111b: four nodes
    assert stats.kstest(np.array(values) / scale, "norm").pvalue > 1e-3


def test_checkpoint_state_renoises_open_nodes_before_and_after_and_state_dict_does_not() -> None:
    learner = PanPrivateFTRL(3, "logistic", 1.0, 1e-5, horizon=40, leaf_size=3, radius=20.0, rng=0)
    recorder = Recorder(value=1.0)
    learner._noise = recorder  # type: ignore[assignment]
    learner.learn_many(X3[:4], Y3[:4])  # leaf 0 done, leaf 1 begun (13 leaves: levels 0..3)
    open_levels = learner.plan().open_levels(learner._leaf, started=True)
    assert open_levels == [1, 2, 3]  # [1, 2) is a right child, never opened; [0, 2), [0, 4), [0, 8) are open
    before = learner._open.copy()
    calls = len(recorder.calls)
    state = learner.state_dict()
    assert len(recorder.calls) == calls and np.array_equal(state["open_nodes"], before)
    persisted = learner.checkpoint_state()
    sigma = learner.plan().sigma
    np.testing.assert_allclose(persisted["open_nodes"][open_levels], before[open_levels] + sigma)
    np.testing.assert_allclose(learner._open[open_levels], before[open_levels] + 2 * sigma)
    assert not persisted["open_nodes"][0].any() and not learner._open[0].any()  # not open: untouched
    restored = PanPrivateFTRL.from_state_dict(learner.config(), persisted, rng=np.random.default_rng(1))
    restored._noise = recorder  # type: ignore[assignment]
    restored.resumed()
    np.testing.assert_allclose(restored._open[open_levels], persisted["open_nodes"][open_levels] + sigma)


def test_between_leaves_only_nodes_begun_earlier_are_open_and_renoised() -> None:
    plan = Plan(records=64, leaves=8, levels=4, sigma=1.0, eta=1.0)
    assert plan.open_levels(4, started=False) == [3]  # only [0, 8) began before leaf 4
    assert plan.open_levels(4, started=True) == [0, 1, 3]  # [4, 8) is a right child: never opened
    assert plan.opened_at(4) == [0, 1]  # [4, 5) and [4, 6) begin with leaf 4
    assert [Plan.closing_level(c) for c in (1, 2, 3, 4, 8)] == [0, 1, 0, 2, 3]


def test_plan_rules_read_only_public_values() -> None:
    learner = PanPrivateFTRL(20, "logistic", 1.0, 1e-6, horizon=100_000, rng=0)
    plan = learner.plan()
    s = analytic_sigma(1.0, 1e-6)
    assert plan.leaf_size(0) in (leaf_size_rule(21, s), leaf_size_rule(21, s) + 1)
    assert leaf_size_rule(21, s) == math.ceil(2 * math.sqrt(2) * s * math.sqrt(21) / math.log(2))
    assert plan.leaves == 100_000 // leaf_size_rule(21, s) and plan.levels == tree_levels(plan.leaves)
    L = learner.gradient_norm_bound
    assert plan.sigma == pytest.approx(tree_sigma(1.0, 1e-6, plan.leaves, 2 * L) * (1 + SENSITIVITY_SLACK), rel=1e-15)
    assert plan.eta == pytest.approx(learner.radius / (plan.sigma * math.sqrt(plan.levels * 21)))
    assert sum(plan.leaf_size(t) for t in range(plan.leaves)) == plan.records == 100_000
    assert learner.plan(2).records == 400_000
    small = PanPrivateFTRL(20, "logistic", 1.0, 1e-6, horizon=None, rng=0).plan()
    assert small.records == FIRST_EPOCH and small.leaf_size(0) == FIRST_EPOCH // 16  # at most n/16 per leaf


def test_report_intrusion_is_the_target_and_outputs_have_two_draws() -> None:
    learner = PanPrivateFTRL(5, "logistic", 1.0, 1e-6, horizon=5000)
    learner.learn_many(*checks.make_stream(5, 600, binary=True))
    report = learner.privacy()
    plan = learner.plan()
    assert report.intrusion.epsilon == 1.0 and report.intrusion.delta == 1e-6
    expected = tree_epsilon(plan.sigma, 1e-6, plan.leaves, 2 * learner.gradient_norm_bound, draws=2)
    assert report.output.epsilon == pytest.approx(expected) and report.output.epsilon < 0.75
    assert learner.planned_privacy().intrusion.delta <= 1e-6
    assert {"Kairouz et al. 2021, Alg. 1", "Cheu et al. 2022, Def. C.2"} <= set(report.references)
    seeded = PanPrivateFTRL(5, "logistic", 1.0, 1e-6, horizon=5000, rng=1).privacy()
    assert not seeded.intrusion.is_meaningful and SEEDED_WARNING in seeded.assumptions


def test_it_learns_a_synthetic_stream() -> None:
    """Beats θ = 0 by a wide margin on an easy stream (d = 5, n = 20,000, ε = 1)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(20_000, 5)) / math.sqrt(5)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (rng.uniform(size=20_000) < 1 / (1 + np.exp(-4 * X @ np.ones(5) / math.sqrt(5)))).astype(float)
    learner = PanPrivateFTRL(5, "logistic", 1.0, 1e-6, horizon=20_000, rng=5)
    learner.learn_many(X, y)
    Z = learner.loss.features(X, 1.0)
    labels = learner.loss.labels(y)
    loss = float(np.mean(learner.loss.value(learner.release(), Z, labels)))
    assert loss < math.log(2) - 0.05


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"leaf_size": 0}, "leaf_size"), ({"eta": -1.0}, "eta"), ({"output": "first"}, "output"),
     ({"horizon": 0}, "horizon"), ({"delta": 1.0}, "delta"), ({"gradient_bound": 0.0}, "gradient_bound")],
)
def test_bad_arguments_are_named(kwargs, name) -> None:
    arguments = {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-6, **kwargs}
    with pytest.raises(InvalidInputError, match=f"'{name}'"):
        PanPrivateFTRL(**arguments)


def test_a_state_from_another_plan_is_refused() -> None:
    learner = PanPrivateFTRL(3, "logistic", 1.0, 1e-5, horizon=40, leaf_size=3, rng=0)
    learner.learn_many(X3[:10], Y3[:10])
    state = learner.state_dict()
    other = PanPrivateFTRL(3, "logistic", 1.0, 1e-5, horizon=40, leaf_size=8, rng=0)
    with pytest.raises(InvalidInputError, match="do not fit the planned epoch|shape"):
        other.load_state_dict(state)
