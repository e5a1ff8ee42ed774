"""Tests of PanPrivateACSA (Cheu et al. 2022 Alg. 6, Thm C.3): conformance, noise, sensitivity, cases, report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from panpriv.accounting.gaussian import analytic_delta, analytic_sigma
from panpriv.accounting.ledger import Guarantee
from panpriv.protocols import checks
from panpriv.protocols.acsa import DEFAULT_TUNING, RESTART_TUNING, RESTARTS, alpha, phase_count
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import HingeLoss, HuberLoss, LogisticLoss, SquaredLoss
from panpriv.protocols.pan_acsa import FIRST_EPOCH, SENSITIVITY_SLACK, PanPrivateACSA
from panpriv.protocols.randomness import SEEDED_WARNING

X3, Y3 = checks.make_stream(3, 60, binary=True)
X3R, Y3R = checks.make_stream(3, 60, binary=False)

# One factory per case of Cheu et al. 2022 Thm C.3; radius 20 keeps the noise visible (not hidden by projection).
CASES = {
    "1-nonsmooth": (lambda rng: PanPrivateACSA(3, HingeLoss(intercept=True), 1.0, 1e-5, horizon=40, batch_size=6, radius=20.0, rng=rng), X3, Y3),
    "2-smooth-doubling": (lambda rng: PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=12, radius=20.0, rng=rng), X3, Y3),
    "3-strongly-convex": (lambda rng: PanPrivateACSA(3, {"name": "absolute", "ridge": 0.2}, 2.0, 1e-5, horizon=60, batch_size=4, radius=20.0, rng=rng), X3R, Y3R),
    "4-strongly-convex-smooth": (lambda rng: PanPrivateACSA(3, SquaredLoss(ridge=0.1), 0.5, 1e-5, horizon=30, batch_size=3, radius=20.0, calibration="classic", rng=rng), X3R, Y3R),
}
CHECKS = checks.ALL_CHECKS + (checks.check_seeded_split_determinism,)


@pytest.mark.statistical
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", sorted(CASES))
def test_conformance(case, check):
    """panpriv.protocols.checks on each case; the statistical check fails falsely with probability ≤ 1e-3."""
    factory, X, y = CASES[case]
    check(factory, X, y)


def test_cases_of_theorem_c3_are_selected():
    (hinge, _, _), (logistic, _, _), (absolute, _, _), (squared, _, _) = (CASES[c] for c in sorted(CASES))
    h, lg, ab, sq = hinge(0), logistic(0), absolute(0), squared(0)
    assert h.current_plan().smoothing is not None and len(h.epoch_plans(0)) == 1
    assert lg.current_plan().smoothing is None and len(lg.epoch_plans(0)) == 1
    assert ab.current_plan().smoothing is not None and len(ab.epoch_plans(0)) == phase_count(60) == 3
    assert sq.current_plan().smoothing is None and len(sq.epoch_plans(0)) == phase_count(30) == 3
    moreau = PanPrivateACSA(3, HuberLoss(), 1.0, 1e-5, smoothing="moreau")
    assert moreau.current_plan().smoothing is not None


def test_middle_point_follows_lan_not_alg6_line12():
    """Cheu et al. 2022 Alg. 6 line 12 (θ^md_{t+1} ← α_t θ_{t+1} + (1 − α_t) θ^ag_t) would make θ^md = θ^ag after
    every step. Lan's update gives θ^md_{t+1} = α_{t+1} θ_{t+1} + (1 − α_{t+1}) θ^ag_{t+1}."""
    learner = PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=10, batch_size=1, radius=50.0, restart="none", rng=3)
    learner.learn_many(X3[:2], Y3[:2])
    state = learner.state_dict()
    assert state["step"] == 3
    a3 = alpha(3)
    np.testing.assert_allclose(state["theta_md"], a3 * state["theta"] + (1 - a3) * state["theta_ag"], rtol=1e-12)
    assert np.linalg.norm(state["theta_md"] - state["theta_ag"]) > 1e-3  # line 12 would give 0


def test_noise_calibration():
    learner = PanPrivateACSA(3, LogisticLoss(intercept=True), 1.0, 1e-6)
    L = math.sqrt(2.0)  # |φ'| ≤ 1, ‖z‖ ≤ √(1 + 1)
    for b in (1, 17, 1000):
        zeta = learner.batch_noise_std(b)
        assert zeta == pytest.approx(analytic_sigma(1.0, 1e-6, 2 * L / b) * (1 + SENSITIVITY_SLACK), rel=1e-12)
        assert analytic_delta(1.0, zeta, 2 * L / b) <= 1e-6  # each draw alone is (ε, δ)-DP
    classic = PanPrivateACSA(3, LogisticLoss(), 0.5, 1e-6, calibration="classic")
    # Cheu et al. 2022 Alg. 6 line 1: ζ² = 8 L² log(2/δ)/(b² ε²), with L = 1.
    assert classic.batch_noise_std(10) == pytest.approx(math.sqrt(8 * math.log(2e6) / (100 * 0.25)), rel=1e-8)
    assert classic.batch_noise_std(10) > PanPrivateACSA(3, LogisticLoss(), 0.5, 1e-6).batch_noise_std(10)


@pytest.mark.statistical
def test_both_noise_draws_have_the_calibrated_variance():
    """Mid-batch, g_t − (partial sum)/b = Z_t; after the batch, θ_2 = −g/L_1 carries Z_t + Z'_t.

    At θ^md = 0 the logistic gradient is −y z/2, known exactly. Over 400 seeded replicates the
    sample variances are compared with ζ² (mid-batch) and 2ζ²/L_1² (after the step) by χ² tests
    at level 1e-4 each: false-failure probability ≤ 2e-4.
    """
    X, y = X3[:4], Y3[:4]
    mid, after = [], []
    for seed in range(400):
        learner = PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=40, batch_size=4, radius=1e6, rng=seed)
        learner.learn_many(X[:3], y[:3])
        mid.append(learner._grad.copy())  # the live accumulator (state_dict holds the boundary)
        learner.learn_many(X[3:], y[3:])
        after.append(learner.state_dict()["theta"])
    signs = np.where(y == 1.0, 1.0, -1.0)
    partial = -(signs[:3, None] * X[:3]).sum(axis=0) / 2 / 4
    full = -(signs[:, None] * X).sum(axis=0) / 2 / 4
    zeta = learner.batch_noise_std(4)
    L1 = learner.current_plan().sizes.prox_weight(1)
    for samples, mean, var in ((np.array(mid), partial, zeta**2), (np.array(after), -full / L1, 2 * zeta**2 / L1**2)):
        residual = (samples - mean).ravel()
        chi2 = np.sum(residual**2) / var
        dof = residual.size
        assert stats.chi2.sf(chi2, dof) > 5e-5 and stats.chi2.cdf(chi2, dof) > 5e-5


def test_sensitivity_of_the_accumulator_is_2L_over_b():
    """Replacing one record (even by one with enormous features) moves g_t by at most 2L/b."""
    rng = np.random.default_rng(0)
    for loss, X, y in ((SquaredLoss(label_bound=2.0), X3R, Y3R), (HingeLoss(), X3, Y3)):
        for _ in range(20):
            other_x = rng.normal(size=(1, 3)) * 1e6
            other_y = np.array([rng.choice([0.0, 1.0]) if loss.binary_labels else rng.normal(0, 1e3)])
            states = []
            for Xi, yi in ((X[:5], y[:5]), (np.vstack([X[:4], other_x]), np.r_[y[:4], other_y])):
                learner = PanPrivateACSA(3, loss, 1.0, 1e-5, horizon=60, batch_size=8, radius=3.0, rng=42)
                learner.learn_many(X[:8], y[:8])  # one full batch: θ^md ≠ 0
                learner.learn_many(Xi, yi)
                states.append(learner._grad.copy())
            L = loss.lipschitz(1.0, 3.0)
            assert np.linalg.norm(states[0] - states[1]) <= 2 * L / 8 * (1 + 1e-12)


def test_gradient_bound_sets_the_clip_and_the_noise():
    """With a declared C < L every per-record gradient is clipped to C and the draws are calibrated
    for sensitivity 2C/b; a C above L changes nothing."""
    loss = SquaredLoss(label_bound=100.0)
    L = loss.lipschitz(1.0, 3.0)  # (3 + 100)·1
    bounded = PanPrivateACSA(3, loss, 1.0, 1e-5, horizon=64, batch_size=8, radius=3.0, gradient_bound=0.5, rng=4)
    assert bounded.batch_noise_std(8) == pytest.approx(analytic_sigma(1.0, 1e-5, 2 * 0.5 / 8), rel=1e-8)
    assert PanPrivateACSA(3, loss, 1.0, 1e-5, radius=3.0, gradient_bound=1e9).batch_noise_std(8) == pytest.approx(
        analytic_sigma(1.0, 1e-5, 2 * L / 8), rel=1e-8
    )
    assert "L = 0.5," in " ".join(bounded.privacy().assumptions)
    # Mid-batch the accumulator is Z_t + Σ clip(g_i)/b. Records with y = 0 at θ^md = 0 have
    # gradient 0, so the same seed gives Z_t alone; records with residual 90 give gradients of
    # norm 90‖x‖, each clipped to C = 0.5.
    X = X3R[:5] / np.linalg.norm(X3R[:5], axis=1, keepdims=True)
    states = []
    for labels in (np.zeros(5), np.full(5, 90.0)):
        learner = PanPrivateACSA(3, loss, 1.0, 1e-5, horizon=64, batch_size=8, radius=3.0, gradient_bound=0.5, rng=4)
        learner.learn_many(X, labels)
        states.append(learner._grad.copy())
    np.testing.assert_allclose(states[1] - states[0], -0.5 * X.sum(axis=0) / 8, rtol=1e-12)


def test_restarts_change_the_steps_not_the_batches():
    """O'Donoghue–Candès restarts reset the AC-SA step t (α_t, L_t) but not the run's batch
    counter, so the record schedule — the privacy mechanism — is the same with or without them."""
    X, y = checks.make_stream(3, 200, binary=True)
    states = {}
    for restart in RESTARTS:
        learner = PanPrivateACSA(3, LogisticLoss(), 2.0, 1e-5, horizon=400, batch_size=5, radius=5.0, restart=restart, rng=1)
        steps = []
        for i in range(0, 200, 5):
            learner.learn_many(X[i : i + 5], y[i : i + 5])
            steps.append(learner.state_dict()["step"])
        states[restart] = (learner.state_dict(), steps)
    plain, restarted = states["none"], states["gradient"]
    assert plain[1] == list(range(2, 42))  # Lan: the step is the batch index
    assert any(b < a for a, b in zip(restarted[1], restarted[1][1:]))  # restarted at least once
    for key in ("records", "epoch", "phase", "batch"):
        assert plain[0][key] == restarted[0][key]
    assert plain[0]["batch"] == 41
    # Planning: Cheu et al.'s constants for Lan's method, the measured ones with restarts.
    assert PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, restart="none").tuning is DEFAULT_TUNING
    assert PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5).tuning is RESTART_TUNING


def test_each_record_enters_one_batch_and_epochs_double_with_warm_start():
    learner = PanPrivateACSA(2, LogisticLoss(), 1.0, 1e-5, horizon=10, batch_size=3, rng=0)
    assert [learner.epoch_length(e) for e in range(3)] == [10, 20, 40]
    plan = learner.epoch_plans(0)[0]
    assert sum(plan.batch_size(t) for t in range(1, plan.steps + 1)) == 10
    X, y = checks.make_stream(2, 10, binary=True)
    learner.learn_many(X, y)
    end_of_epoch = learner.release()
    state = learner.state_dict()
    assert (state["epoch"], state["phase"], state["step"], state["records"]) == (1, 0, 1, 10)
    assert learner.records_to_boundary() == learner.epoch_plans(1)[0].batch_size(1)  # no batch open
    np.testing.assert_array_equal(state["theta"], end_of_epoch)  # warm start from θ^ag
    assert PanPrivateACSA(2, LogisticLoss(), 1.0, 1e-5).epoch_length(0) == FIRST_EPOCH


def test_privacy_report():
    learner = PanPrivateACSA(3, LogisticLoss(), 0.5, 1e-6, horizon=100)
    learner.learn_many(X3, Y3)
    report = learner.privacy()
    assert report.output == report.intrusion == Guarantee(0.5, 1e-6)
    assert report.records == 60 and report.mechanism == "pan-acsa"
    assert {"Cheu et al. 2022, Alg. 6", "Cheu et al. 2022, Lemma C.4", "Cheu et al. 2022, Thm C.3"} <= set(report.references)
    assert SEEDED_WARNING not in report.assumptions
    seeded = PanPrivateACSA(3, LogisticLoss(), 0.5, 1e-6, rng=1).privacy()
    assert seeded.output == Guarantee(0.5, 1e-6) and not seeded.intrusion.is_meaningful
    assert SEEDED_WARNING in seeded.assumptions


def test_default_mode_draws_fresh_noise():
    learners = []
    for _ in range(2):
        learner = PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=60, batch_size=7)
        learner.learn_many(X3[:50], Y3[:50])
        learners.append(learner)
    assert learners[0].state_records < learners[0].records_seen  # mid-batch: the accumulator holds noise
    assert not np.array_equal(learners[0]._grad, learners[1]._grad)
    assert not np.array_equal(learners[0].state_dict()["theta_ag"], learners[1].state_dict()["theta_ag"])


def test_predictions_use_the_released_parameters():
    learner = PanPrivateACSA(3, LogisticLoss(intercept=True), 4.0, 1e-5, horizon=60, batch_size=10, radius=3.0, rng=0)
    learner.learn_many(X3, Y3)
    Z = learner.loss.features(X3 * 10, 1.0)
    np.testing.assert_allclose(learner.predict_proba_many(X3 * 10), 1 / (1 + np.exp(-Z @ learner.release())))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": -1.0}, "'epsilon' parameter of PanPrivateACSA must be a finite float in \\(0, inf\\)"),
        ({"epsilon": 1.0, "calibration": "classic"}, "'epsilon' parameter of PanPrivateACSA must be a float in \\(0, 1\\)"),
        ({"delta": 1.0}, "'delta' parameter"),
        ({"dim": 0}, "'dim' parameter"),
        ({"horizon": 0}, "'horizon' parameter"),
        ({"batch_size": 1.5}, "'batch_size' parameter"),
        ({"radius": float("inf")}, "'radius' parameter"),
        ({"strong_convexity": -0.1}, "'strong_convexity' parameter"),
        ({"calibration": "rdp"}, "'calibration' parameter"),
        ({"loss": HingeLoss(), "smoothing": "none"}, "'smoothing' parameter .* non-smooth hinge"),
        ({"smoothing": "moreau"}, "'smoothing' parameter .*no closed-form prox"),
        ({"loss": 1.0}, "'loss' parameter"),
        ({"gradient_bound": 0.0}, "'gradient_bound' parameter"),
        ({"restart": "always"}, "'restart' parameter"),
    ],
)
def test_invalid_parameters_are_named(kwargs, message):
    arguments = {"dim": 3, "loss": LogisticLoss(), "epsilon": 1.0, "delta": 1e-5, **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        PanPrivateACSA(**arguments)


def test_invalid_batches_and_states_are_rejected():
    learner = PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=20, batch_size=4, rng=0)
    with pytest.raises(InvalidInputError, match="X must have shape"):
        learner.learn_many(np.ones((2, 4)), np.ones(2))
    with pytest.raises(InvalidInputError, match="labels must be 0/1"):
        learner.learn_many(np.ones((2, 3)), np.array([0.0, 3.0]))
    state = learner.state_dict()
    with pytest.raises(InvalidInputError, match="lacks"):
        learner.load_state_dict({k: v for k, v in state.items() if k != "theta_md"})
    with pytest.raises(InvalidInputError, match="filled = 2 needs 'grad'"):  # an older mid-batch state
        learner.load_state_dict({**state, "filled": 2})
    with pytest.raises(InvalidInputError, match="'theta'"):
        learner.load_state_dict({**state, "theta": np.zeros(5)})
    with pytest.raises(InvalidInputError, match="do not fit"):
        learner.load_state_dict({**state, "filled": 4})
    with pytest.raises(InvalidInputError, match="do not fit"):
        learner.load_state_dict({**state, "step": 2, "batch": 1})  # steps since a restart ≤ batches


def test_learns_a_logistic_model():
    """A seeded run at ε = 4 on 20 000 records (d = 5) ends near the population optimum."""
    rng = np.random.default_rng(7)
    theta_star = np.array([1.5, -1.0, 0.5, 0.0, 2.0])
    X = rng.normal(size=(40_000, 5)) / math.sqrt(5)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (rng.uniform(size=40_000) < 1 / (1 + np.exp(-X @ theta_star))).astype(float)
    loss = LogisticLoss()
    learner = PanPrivateACSA(5, loss, 4.0, 1e-6, horizon=20_000, radius=4.0, rng=0)
    learner.learn_many(X[:20_000], y[:20_000])
    Z, labels = loss.features(X[20_000:], 1.0), loss.labels(y[20_000:])
    excess = loss.objective(learner.release(), Z, labels) - loss.objective(theta_star, Z, labels)
    start = loss.objective(np.zeros(5), Z, labels) - loss.objective(theta_star, Z, labels)
    assert excess < 0.1 * start


def test_config_is_json_and_rebuilds_with_a_loss_dict():
    learner = PanPrivateACSA(3, HuberLoss(delta=0.3, intercept=True), 1.0, 1e-5, horizon=7, strong_convexity=0.1)
    config = json.loads(json.dumps(learner.config()))
    assert config["loss"] == {"name": "huber", "ridge": 0.0, "intercept": True, "intercept_scale": 1.0, "delta": 0.3}
    rebuilt = PanPrivateACSA(**config)
    assert rebuilt.loss == learner.loss and rebuilt.config() == learner.config()


# -- secure noise (noise="secure"): the same conformance suite, exact discrete Gaussian draws ------

SECURE_CASES = {
    "1-nonsmooth": (lambda rng: PanPrivateACSA(3, HingeLoss(intercept=True), 1.0, 1e-5, horizon=40, batch_size=6, radius=20.0, noise="secure", rng=rng), X3, Y3),
    "3-strongly-convex": (lambda rng: PanPrivateACSA(3, {"name": "absolute", "ridge": 0.2}, 2.0, 1e-5, horizon=60, batch_size=4, radius=20.0, noise="secure", rng=rng), X3R, Y3R),
    "4-strongly-convex-smooth": (lambda rng: PanPrivateACSA(3, SquaredLoss(ridge=0.1), 0.5, 1e-5, horizon=30, batch_size=3, radius=20.0, noise="secure", rng=rng), X3R, Y3R),
}


@pytest.mark.statistical
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("case", sorted(SECURE_CASES))
def test_conformance_secure_noise(case, check):
    """panpriv.protocols.checks with noise="secure"; the statistical check fails falsely with probability ≤ 1e-3."""
    factory, X, y = SECURE_CASES[case]
    check(factory, X, y)


@pytest.mark.statistical
def test_secure_draws_are_the_calibrated_discrete_gaussian():
    """noise="secure": mid-batch, grad_units − Σ to_grid(∇) = Z_t exactly (integers); over 400
    seeded replicates its coordinates' sample second moment is compared with the σ² of
    panpriv.protocols.secure_noise.calibrate_draw by a two-sided χ² test at level 1e-4 (N_Z(0, σ²) has
    variance σ² to double precision at this σ)."""
    from panpriv.protocols import secure_noise

    X, y = X3[:4], Y3[:4]
    loss = LogisticLoss()
    residuals = []
    for seed in range(400):
        learner = PanPrivateACSA(3, loss, 1.0, 1e-5, horizon=40, batch_size=4, radius=1e6, noise="secure", rng=seed)
        learner.learn_many(X[:3], y[:3])
        assert learner._grad.dtype == np.int64  # the live accumulator (state_dict holds the boundary)
        gradients = -(np.where(y[:3] == 1.0, 1.0, -1.0)[:, None] * loss.features(X[:3], 1.0)) / 2  # at θ^md = 0
        contribution = secure_noise.to_grid(gradients, learner.gradient_norm_bound).sum(axis=0)
        residuals.append(learner._grad - contribution)
    calibration = secure_noise.calibrate_draw(1.0, 1e-5)
    residual = np.concatenate(residuals).astype(float)
    chi2 = np.sum(residual**2) / calibration.sigma2
    assert stats.chi2.sf(chi2, residual.size) > 5e-5 and stats.chi2.cdf(chi2, residual.size) > 5e-5
    assert learner.batch_noise_std(4) == pytest.approx(
        math.sqrt(calibration.sigma2) * learner.gradient_norm_bound / 2**secure_noise.GRID_BITS / 4
    )


def test_secure_sensitivity_of_the_integer_accumulator():
    """Replacing one record (even by one with enormous features) moves the integer sum by at most
    Δ = 2^(k+1) grid units in ℓ2 — the sensitivity the discrete Gaussian is calibrated to."""
    from panpriv.protocols import secure_noise

    rng = np.random.default_rng(0)
    for loss, X, y in ((SquaredLoss(label_bound=2.0), X3R, Y3R), (HingeLoss(), X3, Y3)):
        for _ in range(20):
            other_x = rng.normal(size=(1, 3)) * 1e6
            other_y = np.array([rng.choice([0.0, 1.0]) if loss.binary_labels else rng.normal(0, 1e3)])
            states = []
            for Xi, yi in ((X[:5], y[:5]), (np.vstack([X[:4], other_x]), np.r_[y[:4], other_y])):
                learner = PanPrivateACSA(3, loss, 1.0, 1e-5, horizon=60, batch_size=8, radius=3.0, noise="secure", rng=42)
                learner.learn_many(X[:8], y[:8])
                learner.learn_many(Xi, yi)
                states.append(learner._grad.copy())
            difference = states[0] - states[1]
            assert int((difference**2).sum()) <= secure_noise.SENSITIVITY_UNITS**2


def test_secure_privacy_report_states_the_discrete_gaussian_guarantee():
    learner = PanPrivateACSA(3, LogisticLoss(), 0.5, 1e-6, horizon=100, noise="secure")
    learner.learn_many(X3, Y3)
    report = learner.privacy()
    assert report.output == report.intrusion == Guarantee(0.5, 1e-6)
    assert {"Cheu et al. 2022, Lemma C.4", "Canonne, Kamath & Steinke 2020, Thm 14", "Canonne, Kamath & Steinke 2020, Cor. 13"} <= set(report.references)
    statement = next(a for a in report.assumptions if a.startswith("secure noise"))
    assert "N_Z(0, " in statement and "zCDP" in statement
    assert learner.config()["noise"] == "secure"
    assert not any("Balle" in r for r in report.references)


def test_secure_default_mode_draws_fresh_noise_and_states_are_checked():
    learners = []
    for _ in range(2):
        learner = PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, horizon=60, batch_size=7, noise="secure")
        learner.learn_many(X3[:50], Y3[:50])
        learners.append(learner)
    assert not np.array_equal(learners[0]._grad, learners[1]._grad)
    state = {**learners[0].state_dict(), "filled": 1, "grad_units": learners[0]._grad.copy()}  # an older mid-batch state
    with pytest.raises(InvalidInputError, match="'grad_units' must be 3 integers"):
        learner.load_state_dict({**state, "grad_units": state["grad_units"].astype(float)})
    with pytest.raises(InvalidInputError, match="needs 'grad_units'"):
        learner.load_state_dict({k: v for k, v in state.items() if k != "grad_units"})
    learner.load_state_dict(state)
    assert learner.records_seen == learner.state_records + 1 and learner._grad.dtype == np.int64
    with pytest.raises(InvalidInputError, match="'noise' parameter"):
        PanPrivateACSA(3, LogisticLoss(), 1.0, 1e-5, noise="discrete")


def test_secure_noise_learns_a_logistic_model():
    """The seeded run of test_learns_a_logistic_model with noise="secure" also ends near the optimum."""
    rng = np.random.default_rng(7)
    theta_star = np.array([1.5, -1.0, 0.5, 0.0, 2.0])
    X = rng.normal(size=(40_000, 5)) / math.sqrt(5)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = (rng.uniform(size=40_000) < 1 / (1 + np.exp(-X @ theta_star))).astype(float)
    loss = LogisticLoss()
    learner = PanPrivateACSA(5, loss, 4.0, 1e-6, horizon=20_000, radius=4.0, noise="secure", rng=0)
    learner.learn_many(X[:20_000], y[:20_000])
    Z, labels = loss.features(X[20_000:], 1.0), loss.labels(y[20_000:])
    excess = loss.objective(learner.release(), Z, labels) - loss.objective(theta_star, Z, labels)
    start = loss.objective(np.zeros(5), Z, labels) - loss.objective(theta_star, Z, labels)
    assert excess < 0.1 * start


def test_validation_reads_the_row_norms_the_fused_path_reuses() -> None:
    """learn_many checks X's finiteness from the rows' sums of squares (one pass, reused by the
    fused gradient sum): a NaN or an infinity anywhere is refused before anything is learned. A
    huge finite row, whose sum of squares overflows, is accepted and clipped exactly: the model
    equals the one fed that row already scaled to the feature bound (it was all NaN before)."""
    def learner() -> PanPrivateACSA:
        return PanPrivateACSA(3, "logistic", 1.0, 1e-6, horizon=60, radius=4.0, rng=5)

    for bad in (np.nan, np.inf, -np.inf):
        model = learner()
        before = json.dumps(model.state_dict(), default=str)
        X = X3[:10].copy()
        X[7, 1] = bad
        with pytest.raises(InvalidInputError, match="NaN or infinite"):
            model.learn_many(X, Y3[:10])
        assert json.dumps(model.state_dict(), default=str) == before
    huge = X3[:12].copy()
    huge[4] = [1e200, -1e200, 3e199]  # ‖x‖² overflows to inf; the row is finite
    clipped = huge.copy()
    clipped[4] = np.array([1.0, -1.0, 0.3]) / math.sqrt(2.09)  # the same row at norm 1 (the feature bound)
    with_huge, with_clipped = learner(), learner()
    with np.errstate(all="raise"):
        with_huge.learn_many(huge, Y3[:12])
    with_clipped.learn_many(clipped, Y3[:12])
    assert np.all(np.isfinite(with_huge.release()))
    np.testing.assert_allclose(with_huge.release(), with_clipped.release(), rtol=1e-12, atol=1e-15)
