"""The conformance suite over every catalogued learner, discovered from :mod:`panpriv.protocols.catalogue`
with each learner's own :meth:`~panpriv.protocols.base.Learner.unit_test_params` (River's pattern): a
learner added to the catalogue is tested here without touching this file.

The statistical micro-batch check runs in each learner's own test module, on configurations chosen
to cover its modes; here every check that is exact runs on every entry, plus the configuration
contract (every constructor argument is recorded and rebuilds an equal learner).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from panpriv.protocols import checks
from panpriv.protocols.base import Learner, constructor_parameters
from panpriv.protocols.catalogue import CATALOGUE, load_learner
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import learner_loss
from panpriv.protocols.recorded import RecordedLearner

EXACT_CHECKS = tuple(c for c in checks.ALL_CHECKS if c is not checks.check_micro_batch_invariance)
CASES = [
    (name, index, params)
    for name in CATALOGUE
    for index, params in enumerate(load_learner(name).unit_test_params())
]


def _stream(params: dict) -> tuple:
    binary = learner_loss(params["loss"], "test").name in ("logistic", "hinge")
    return checks.make_stream(params["dim"], 40, binary=binary)


def test_every_catalogued_learner_declares_test_parameters() -> None:
    assert {name for name, _, _ in CASES} == set(CATALOGUE)


@pytest.mark.parametrize("check", EXACT_CHECKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(("name", "index", "params"), CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_conformance(name: str, index: int, params: dict, check) -> None:
    cls = load_learner(name)
    if check in (checks.check_state_round_trip, checks.check_checkpoint_restores) and issubclass(cls, RecordedLearner) and not cls.resumes_mid_pass:
        pytest.skip(f"{name} declares that a state saved mid-pass cannot be resumed (its own tests check the refusal)")
    X, y = _stream(params)
    check(lambda rng: cls(**params, rng=rng), X, y)


@pytest.mark.parametrize(("name", "index", "params"), CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_config_records_every_constructor_argument(name: str, index: int, params: dict) -> None:
    """config() has exactly the constructor's parameters, each test parameter with the value given
    (a loss by its config), and survives JSON into an equal learner: a parameter a learner forgot
    to record (the old hand-written ``config()`` could drop ``restart``) fails here."""
    cls = load_learner(name)
    config = cls(**params, rng=0).config()
    assert tuple(config) == constructor_parameters(cls)
    for key, value in params.items():
        expected = learner_loss(value, "test").config() if key == "loss" else value
        assert config[key] == expected, key
    rebuilt = cls(**json.loads(json.dumps(config)), rng=0)
    assert rebuilt.config() == config


def test_a_learner_without_test_parameters_is_refused() -> None:
    class Untested(Learner):
        name = "untested"

    with pytest.raises(NotImplementedError, match="Untested declares no unit_test_params"):
        Untested.unit_test_params()


@pytest.mark.parametrize(("name", "index", "params"), CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_one_record_api_is_the_micro_batch_api_on_one_row(name: str, index: int, params: dict) -> None:
    """learn_one/predict_one are learn_many/predict_many on a batch of one; predict_many gives
    labels ±1 (the sign of decision_many) for classification losses, values otherwise."""
    cls = load_learner(name)
    X, y = _stream(params)
    one, many = cls(**params, rng=3), cls(**params, rng=3)
    for row in range(10):
        one.learn_one(X[row], y[row])
        many.learn_many(X[row : row + 1], y[row : row + 1])
    checks._assert_states_equal(one.state_dict(), many.state_dict(), "learn_one vs learn_many")
    one.snapshot()
    scores = one.decision_many(X)
    predicted = one.predict_many(X)
    if learner_loss(params["loss"], "test").binary_labels:
        np.testing.assert_array_equal(predicted, np.where(scores >= 0.0, 1.0, -1.0))
    else:
        np.testing.assert_array_equal(predicted, scores)
    assert one.predict_one(X[4]) == predicted[4]


def test_probabilities_only_for_the_logistic_loss() -> None:
    cls = load_learner("pan-acsa")
    X, y = checks.make_stream(3, 40, binary=True)
    logistic = cls(dim=3, loss="logistic", epsilon=1.0, delta=1e-5, horizon=40, rng=0)
    logistic.learn_many(X, y)
    np.testing.assert_allclose(logistic.predict_proba_many(X), 1.0 / (1.0 + np.exp(-logistic.decision_many(X))))
    hinge = cls(dim=3, loss="hinge", epsilon=1.0, delta=1e-5, horizon=40, rng=0)
    with pytest.raises(InvalidInputError, match="the hinge loss gives no probabilities"):
        hinge.predict_proba_many(X)


@pytest.mark.parametrize(("name", "index", "params"), CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_every_learner_describes_its_noise(name: str, index: int, params: dict) -> None:
    lines = load_learner(name)(**params, rng=0).describe_noise()
    assert lines and all(isinstance(line, str) and line for line in lines)
