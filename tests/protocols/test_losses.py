"""Tests of panpriv.protocols.losses: gradients, constants L and β, prox/Moreau envelope, config."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import minimize

from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import (
    LOSSES,
    AbsoluteLoss,
    HingeLoss,
    HuberLoss,
    LogisticLoss,
    Loss,
    SquaredLoss,
    as_loss,
    clip_rows,
    loss_from_config,
)

R, RADIUS = 1.5, 2.0
ALL = [
    LogisticLoss(),
    SquaredLoss(label_bound=2.0),
    HingeLoss(),
    AbsoluteLoss(),
    HuberLoss(delta=0.5),
    LogisticLoss(intercept=True, intercept_scale=0.7, ridge=0.1),
    SquaredLoss(intercept=True),
]
PROX = [loss for loss in ALL if loss.has_prox]


def _records(loss: Loss, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Raw records, some far outside the feature bound, mapped to (Z, y) as the loss uses them."""
    X = rng.normal(size=(m, 4)) * rng.choice([0.3, 1.0, 10.0], size=(m, 1))
    raw_y = rng.integers(0, 2, size=m).astype(float) if loss.binary_labels else rng.normal(0, 3, m)
    return loss.features(X, R), loss.labels(raw_y)


def _ball_points(rng: np.random.Generator, k: int, p: int) -> np.ndarray:
    """Points of the radius-RADIUS ball, many on its boundary."""
    theta = rng.normal(size=(k, p))
    theta /= np.linalg.norm(theta, axis=1, keepdims=True)
    return theta * RADIUS * np.sqrt(rng.uniform(0.5, 1.0, size=(k, 1)))


def test_clip_rows_projects_onto_the_ball_and_keeps_inner_rows():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    before = X.copy()
    out = clip_rows(X, 1.0)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(X, before)


def test_features_clip_and_append_the_intercept_counted_in_the_bound():
    loss = LogisticLoss(intercept=True, intercept_scale=0.5)
    Z = loss.features(np.array([[30.0, 40.0], [0.1, 0.0]]), 1.0)
    np.testing.assert_allclose(Z, [[0.6, 0.8, 0.5], [0.1, 0.0, 0.5]])
    assert loss.param_dim(2) == 3
    assert loss.norm_bound(1.0) == pytest.approx(math.sqrt(1.25))
    assert loss.lipschitz(1.0, 5.0) == pytest.approx(math.sqrt(1.25))  # |φ'| ≤ 1 times R_z


def test_binary_labels_map_zero_to_minus_one_and_reject_other_values():
    loss = HingeLoss()
    np.testing.assert_array_equal(loss.labels(np.array([0.0, 1.0, -1.0])), [-1.0, 1.0, -1.0])
    with pytest.raises(InvalidInputError, match="labels must be 0/1 or -1/\\+1"):
        loss.labels(np.array([0.0, 2.0]))


def test_squared_loss_clips_labels_to_the_declared_bound():
    np.testing.assert_array_equal(SquaredLoss(label_bound=2.0).labels(np.array([-5.0, 1.0, 9.0])), [-2, 1, 2])


@pytest.mark.parametrize("loss", ALL, ids=repr)
def test_gradient_matches_finite_differences(loss):
    rng = np.random.default_rng(1)
    Z, y = _records(loss, 30, rng)
    for theta in _ball_points(rng, 5, Z.shape[1]):
        grads = loss.gradient(theta, Z, y)
        for j in range(Z.shape[1]):
            e = np.zeros_like(theta)
            e[j] = 1e-6
            numeric = (loss.value(theta + e, Z, y) - loss.value(theta - e, Z, y)) / 2e-6
            # Kinks of hinge/absolute are hit with probability 0 at random points.
            np.testing.assert_allclose(grads[:, j], numeric, atol=1e-6)


@pytest.mark.parametrize("loss", ALL, ids=repr)
def test_gradient_norms_never_exceed_lipschitz_and_come_close(loss):
    rng = np.random.default_rng(2)
    Z, y = _records(loss, 400, rng)
    L = loss.lipschitz(R, RADIUS)
    worst = max(np.linalg.norm(loss.gradient(t, Z, y), axis=1).max() for t in _ball_points(rng, 40, Z.shape[1]))
    assert worst <= L * (1 + 1e-12)
    assert worst >= 0.3 * L  # the bound is not vacuous


def test_lipschitz_constants_pinned():
    assert LogisticLoss().lipschitz(2.0, 9.0) == 2.0
    assert HingeLoss().lipschitz(2.0, 9.0) == 2.0
    assert AbsoluteLoss().lipschitz(2.0, 9.0) == 2.0
    assert HuberLoss(delta=0.5).lipschitz(2.0, 9.0) == 1.0
    assert SquaredLoss(label_bound=3.0).lipschitz(2.0, 5.0) == (5.0 * 2.0 + 3.0) * 2.0
    assert LogisticLoss().smoothness(2.0) == 1.0
    assert SquaredLoss().smoothness(2.0) == 4.0
    assert math.isinf(HingeLoss().smoothness(2.0))


@pytest.mark.parametrize("loss", [x for x in ALL if x.smooth], ids=repr)
def test_gradients_are_beta_lipschitz(loss):
    rng = np.random.default_rng(3)
    Z, y = _records(loss, 200, rng)
    beta = loss.smoothness(R)
    points = _ball_points(rng, 30, Z.shape[1])
    ratios = []
    for a, b in zip(points[:-1], points[1:]):
        diff = np.linalg.norm(loss.gradient(a, Z, y) - loss.gradient(b, Z, y), axis=1)
        ratios.append(diff.max() / np.linalg.norm(a - b))
    assert max(ratios) <= beta * (1 + 1e-9)


def _brute_prox(loss: Loss, theta: np.ndarray, z: np.ndarray, y: float, beta: float) -> np.ndarray:
    def objective(u: np.ndarray) -> float:
        return float(loss.value(u, z[None, :], np.array([y]))[0] + 0.5 * beta * np.sum((u - theta) ** 2))

    return minimize(objective, theta, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-13, "maxiter": 20000}).x


@pytest.mark.parametrize("loss", PROX, ids=repr)
def test_prox_matches_brute_force_minimisation(loss):
    rng = np.random.default_rng(4)
    Z, y = _records(loss, 6, rng)
    beta = 3.0
    theta = _ball_points(rng, 1, Z.shape[1])[0]
    prox = loss.prox(theta, Z, y, beta)
    for i in range(Z.shape[0]):
        np.testing.assert_allclose(prox[i], _brute_prox(loss, theta, Z[i], y[i], beta), atol=2e-5)


@pytest.mark.parametrize("loss", PROX, ids=repr)
def test_moreau_envelope_properties_of_lemma_4_6(loss):
    """Cheu et al. 2022, Lemma 4.6: ∇f_β = β(θ − prox) (checked by finite differences of f_β), f_β ≤ f ≤
    f_β + L²/(2β), gradient norm ≤ L, and β-smoothness."""
    rng = np.random.default_rng(5)
    Z, y = _records(loss, 50, rng)
    beta, L = 2.5, loss.lipschitz(R, RADIUS)

    def envelope(theta: np.ndarray) -> np.ndarray:
        u = loss.prox(theta, Z, y, beta)
        return np.array([loss.value(u[i], Z[i : i + 1], y[i : i + 1])[0] for i in range(len(y))]) + 0.5 * beta * np.sum(
            (u - theta) ** 2, axis=1
        )

    points = _ball_points(rng, 6, Z.shape[1])
    for theta in points:
        f, f_beta = loss.value(theta, Z, y), envelope(theta)
        assert np.all(f_beta <= f + 1e-12)
        assert np.all(f <= f_beta + L**2 / (2 * beta) + 1e-12)
        grad = loss.envelope_gradient(theta, Z, y, beta)
        assert np.linalg.norm(grad, axis=1).max() <= L * (1 + 1e-12)
        for j in range(Z.shape[1]):
            e = np.zeros_like(theta)
            e[j] = 1e-6
            np.testing.assert_allclose(grad[:, j], (envelope(theta + e) - envelope(theta - e)) / 2e-6, atol=1e-5)
    for a, b in zip(points[:-1], points[1:]):
        diff = np.linalg.norm(loss.envelope_gradient(a, Z, y, beta) - loss.envelope_gradient(b, Z, y, beta), axis=1)
        assert diff.max() <= beta * np.linalg.norm(a - b) * (1 + 1e-9)


def test_logistic_has_no_closed_form_prox():
    loss = LogisticLoss()
    with pytest.raises(InvalidInputError, match="no closed-form proximal operator"):
        loss.envelope_gradient(np.zeros(2), np.ones((1, 2)), np.ones(1), 1.0)


def test_predictions():
    theta, Z = np.array([1.0, -2.0]), np.array([[0.5, 0.25], [0.0, 1.0]])
    np.testing.assert_allclose(LogisticLoss().predict(theta, Z), 1 / (1 + np.exp(-np.array([0.0, -2.0]))))
    for loss in (SquaredLoss(), HingeLoss(), AbsoluteLoss(), HuberLoss()):
        np.testing.assert_allclose(loss.predict(theta, Z), [0.0, -2.0])


def test_objective_adds_the_ridge_term():
    loss = SquaredLoss(ridge=0.5)
    theta, Z, y = np.array([1.0, 2.0]), np.array([[1.0, 0.0]]), np.array([0.0])
    assert loss.objective(theta, Z, y) == pytest.approx(0.5 + 0.25 * 5.0)
    np.testing.assert_allclose(loss.ridge_gradient(theta), [0.5, 1.0])


@pytest.mark.parametrize("loss", ALL, ids=repr)
def test_config_round_trips_through_json(loss):
    config = loss.config()
    rebuilt = loss_from_config(json.loads(json.dumps(config)))
    assert rebuilt == loss and type(rebuilt) is type(loss) and rebuilt.config() == config
    assert as_loss(config, "X") == loss and as_loss(loss, "X") is loss


def test_every_registered_loss_has_its_name():
    assert sorted(LOSSES) == ["absolute", "hinge", "huber", "logistic", "squared"]


def test_invalid_configs_and_parameters_name_the_problem():
    with pytest.raises(InvalidInputError, match="'name' entry"):
        loss_from_config({"name": "cauchy"})
    with pytest.raises(InvalidInputError, match="label_bond"):
        loss_from_config({"name": "squared", "label_bond": 1.0})
    with pytest.raises(InvalidInputError, match="'ridge' parameter of LogisticLoss must be a finite float in \\[0, inf\\). Got -1.0"):
        LogisticLoss(ridge=-1.0)
    with pytest.raises(InvalidInputError, match="'delta' parameter of HuberLoss"):
        HuberLoss(delta=0.0)
    with pytest.raises(InvalidInputError, match="'intercept' parameter"):
        LogisticLoss(intercept=1)
    with pytest.raises(InvalidInputError, match="'loss' parameter of X"):
        as_loss(3.0, "X")
    with pytest.raises(InvalidInputError, match="'name' entry of a loss config must be one of"):
        as_loss("cauchy", "X")


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_loss_name_means_that_loss_with_its_defaults(name):
    assert as_loss(name, "X") == LOSSES[name]() and type(as_loss(name, "X")) is LOSSES[name]
