"""Named fields to positions (panpriv.protocols.schema) and the Python API's mappings: learn_one,
predict_one and predict_proba_one take a record as a mapping through one schema, on every learner."""

from __future__ import annotations

import math

import numpy as np
import pytest

from panpriv.protocols import catalogue
from panpriv.protocols.base import ModelSpec
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.schema import Feature, FeatureSchema

SCHEMA = FeatureSchema.from_dict(
    {
        "label": "clicked",
        "id": "event",
        "ignore": ["timestamp"],
        "features": [
            {"name": "age", "min": 17, "max": 90},
            {"name": "country", "categories": ["de", "fr", "us"]},
            {"name": "visits", "default": 0},
        ],
    }
)


def test_numbers_are_scaled_by_their_public_bounds_and_categories_are_one_hot() -> None:
    assert SCHEMA.dim == 5
    assert SCHEMA.feature_names == ("age", "country=de", "country=fr", "country=us", "visits")
    x = SCHEMA.vector({"age": 53.5, "country": "fr", "visits": 3, "clicked": 1, "event": "e1", "timestamp": 9})
    np.testing.assert_array_equal(x, [0.5, 0.0, 1.0, 0.0, 3.0])
    np.testing.assert_array_equal(SCHEMA.vector({"age": 120, "country": "de"}), [1.0, 1.0, 0.0, 0.0, 0.0])  # clipped; default
    assert SCHEMA.vector({"age": True, "country": "us"})[0] == 0.0  # JSON true reads as 1, then scaled: (1 - 17)/73 clipped


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"country": "fr"}, "missing_field"),
        ({"age": 30, "country": "fr", "colour": "red"}, "unknown_field"),
        ({"age": 30, "country": "es"}, "unknown_category"),
        ({"age": "30", "country": "fr"}, "wrong_type"),
        ({"age": 30, "country": 1.5}, "wrong_type"),
        ({"age": float("nan"), "country": "fr"}, "non_finite"),
    ],
)
def test_a_record_the_schema_cannot_map_is_refused_by_reason(record: dict[str, object], reason: str) -> None:
    out = np.full(SCHEMA.dim, 7.0)
    assert SCHEMA.fill(record, out) == reason
    assert not out.any()  # nothing of a refused record is left behind
    with pytest.raises(InvalidInputError, match=reason):
        SCHEMA.vector(record)


def test_text_values_read_as_numbers_and_unknown_fields_can_be_ignored() -> None:
    out = np.zeros(SCHEMA.dim)
    assert SCHEMA.fill({"age": " 53.5", "country": "fr", "visits": ""}, out, text=True) is None
    np.testing.assert_array_equal(out, [0.5, 0.0, 1.0, 0.0, 0.0])
    lenient = FeatureSchema.from_dict({**SCHEMA.to_dict(), "unknown": "ignore"})
    assert lenient.fill({"age": 30, "country": "fr", "colour": "red"}, out) is None


def test_bounded_features_give_a_feature_bound_that_holds_by_construction() -> None:
    bounded = FeatureSchema((Feature("a", 0, 1), Feature("b", categories=("x", "y"))))
    assert bounded.natural_bound() == math.sqrt(2)
    assert SCHEMA.natural_bound() is None  # visits has no bounds


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"features": []}, "at least one feature"),
        ({"features": ["a", "a"]}, "distinct"),
        ({"features": ["y"]}, "distinct"),
        ({"features": [{"name": "a", "min": 1}]}, "both min and max"),
        ({"features": [{"name": "a", "min": 1, "max": 1}]}, "min must be < max"),
        ({"features": [{"name": "a", "categories": ["x"], "default": "z"}]}, "not one of its categories"),
        ({"features": ["a"], "colour": 1}, "unknown setting"),
        ({"features": [{"name": "a", "scale": 2}]}, "a feature is a name or a table"),
    ],
)
def test_a_wrong_schema_is_refused_naming_what_is_wrong(data: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        FeatureSchema.from_dict(data)


def test_a_schema_file_is_json_or_toml(tmp_path) -> None:
    (tmp_path / "s.toml").write_text(
        'label = "clicked"\nid = "event"\nignore = ["timestamp"]\n'
        '[[features]]\nname = "age"\nmin = 17\nmax = 90\n'
        '[[features]]\nname = "country"\ncategories = ["de", "fr", "us"]\n'
        '[[features]]\nname = "visits"\ndefault = 0\n'
    )
    assert FeatureSchema.load(tmp_path / "s.toml") == SCHEMA
    (tmp_path / "s.json").write_text('{"features": ["a", ')
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        FeatureSchema.load(tmp_path / "s.json")


def test_learn_one_with_a_mapping_is_learn_one_with_its_vector() -> None:
    records = [({"age": 20 + i, "country": "de" if i % 2 else "us", "visits": i % 5}, 1.0 if i % 3 else -1.0) for i in range(40)]
    by_name = PanPrivateACSA(dim=5, epsilon=1.0, delta=1e-6, horizon=40, feature_bound=3.0, rng=7).use_schema(SCHEMA)
    by_array = PanPrivateACSA(dim=5, epsilon=1.0, delta=1e-6, horizon=40, feature_bound=3.0, rng=7)
    for record, label in records:
        by_name.learn_one(record, label)
        by_array.learn_one(SCHEMA.vector(record), label)
    np.testing.assert_array_equal(by_name.release(), by_array.release())
    record = records[0][0]
    assert by_name.predict_one(record) == by_array.predict_one(SCHEMA.vector(record))
    assert by_name.predict_proba_one(record) == by_array.predict_proba_one(SCHEMA.vector(record))
    assert 0.0 < by_name.predict_proba_one(record) < 1.0
    snapshot = by_name.snapshot()  # the snapshot carries the names and the mapping, through its JSON form
    assert snapshot.model is not None and snapshot.model.feature_names == SCHEMA.feature_names
    served = ModelSpec.from_dict(snapshot.model.to_dict())
    assert served.schema == SCHEMA
    assert snapshot.predict_proba_one(record) == by_name.predict_proba_one(record)


def test_a_mapping_needs_a_schema_of_the_learners_dimension() -> None:
    learner = PanPrivateACSA(dim=2, epsilon=1.0, delta=1e-6, horizon=10, feature_bound=1.0)
    with pytest.raises(InvalidInputError, match="use_schema"):
        learner.learn_one({"a": 1.0, "b": 2.0}, 1.0)
    with pytest.raises(InvalidInputError, match="take 3 positions"):
        learner.use_schema(["a", "b", "c"])
    learner.use_schema(["a", "b"])
    with pytest.raises(InvalidInputError, match="unknown_field"):
        learner.learn_one({"a": 1.0, "b": 2.0, "c": 3.0}, 1.0)
    learner.learn_one({"a": 1.0, "b": 2.0}, 1.0)
    assert learner.records_seen == 1


@pytest.mark.parametrize("name", catalogue.learner_names())
def test_every_learner_takes_mappings_and_gives_probabilities_for_the_logistic_loss(name: str) -> None:
    cls = catalogue.load_learner(name)
    params = cls.unit_test_params()[0]
    learner = cls(**params, rng=3)
    names = [f"f{j}" for j in range(learner.dim)]
    learner.use_schema(names)
    record = {n: 0.1 * j for j, n in enumerate(names)}
    learner.learn_one(record, 1.0)
    label = learner.predict_one(record)
    assert label == learner.predict_one(np.array([record[n] for n in names]))
    if learner.loss.name == "logistic":
        assert 0.0 <= learner.predict_proba_one(record) <= 1.0
    else:
        with pytest.raises(InvalidInputError, match="no probabilities"):
            learner.predict_proba_one(record)
