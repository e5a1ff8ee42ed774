"""panpriv.streamer.serving.snapshots and panpriv.protocols.base.Snapshot as a model: the same clipping as training,
records written before servable snapshots, torn files, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols import checks
from panpriv.protocols.base import ModelSpec
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import clip_rows
from panpriv.streamer.io.sinks import snapshot_record
from panpriv.streamer.serving.snapshots import load_snapshot


def write_snapshots(path: Path, count: int = 2, loss: object = None) -> PanPrivateACSA:
    loss = {"name": "logistic", "intercept": False} if loss is None else loss  # what load_snapshot(loss="logistic") means
    learner = PanPrivateACSA(3, loss, 1.0, 1e-5, horizon=200, radius=5.0, feature_bound=1.5, rng=4)
    X, y = checks.make_stream(3, 200, binary=True)
    with path.open("w") as handle:
        for part in range(count):
            learner.learn_many(X[part * 100 : (part + 1) * 100], y[part * 100 : (part + 1) * 100])
            snapshot = learner.snapshot()
            record = snapshot_record(snapshot, sequence=part + 1, instance="i", rejected=0, positions={}, privacy=snapshot.privacy.to_dict())
            handle.write(json.dumps(record) + "\n")
    return learner


def test_a_loaded_snapshot_predicts_like_the_learner_and_clips_like_training(tmp_path: Path) -> None:
    learner = write_snapshots(tmp_path / "s.jsonl", loss={"name": "logistic", "intercept": True})
    served = load_snapshot(tmp_path / "s.jsonl")
    X = np.random.default_rng(0).normal(size=(50, 3)) * 2.0  # many rows beyond the bound 1.5
    np.testing.assert_array_equal(served.predict_many(X), learner.predict_many(X))
    np.testing.assert_allclose(served.predict_proba_many(X), learner.predict_proba_many(X), rtol=1e-15)
    np.testing.assert_allclose(served.decision_many(X), served.decision_many(clip_rows(X, 1.5)), rtol=1e-12)
    assert served.model == ModelSpec(learner.loss, 3, 1.5) and served.records == 200
    assert served.privacy.output == learner.privacy().output
    first = load_snapshot(tmp_path / "s.jsonl", sequence=1)
    assert 0 < first.records <= 100  # the records up to pan-acsa's last batch boundary
    with pytest.raises(ConfigError, match="no snapshot with sequence 9"):
        load_snapshot(tmp_path / "s.jsonl", sequence=9)


def test_sklearn_export_matches_inside_the_bound(tmp_path: Path) -> None:
    write_snapshots(tmp_path / "s.jsonl", loss={"name": "logistic", "intercept": True})
    served = load_snapshot(tmp_path / "s.jsonl")
    X = clip_rows(np.random.default_rng(1).normal(size=(40, 3)), 1.5)
    estimator = served.to_sklearn()
    np.testing.assert_array_equal(estimator.predict(X), served.predict_many(X))
    np.testing.assert_allclose(estimator.predict_proba(X)[:, 1], served.predict_proba_many(X), rtol=1e-12)


def test_a_version_1_record_needs_its_loss_and_bound(tmp_path: Path) -> None:
    write_snapshots(tmp_path / "s.jsonl")
    current = load_snapshot(tmp_path / "s.jsonl")
    old = tmp_path / "old.jsonl"
    records = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    old.write_text("".join(json.dumps({**{k: v for k, v in r.items() if k != "model"}, "schema_version": 1}) + "\n" for r in records))
    bare = load_snapshot(old)
    X = np.ones((2, 3))
    with pytest.raises(InvalidInputError, match="carries no model description"):
        bare.predict_many(X)
    rebuilt = load_snapshot(old, loss="logistic", feature_bound=1.5)
    np.testing.assert_array_equal(rebuilt.predict_many(X), current.predict_many(X))
    with pytest.raises(ConfigError, match="disagrees"):
        load_snapshot(tmp_path / "s.jsonl", feature_bound=2.0)


def test_a_torn_last_line_is_ignored_and_other_damage_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    write_snapshots(path)
    whole = load_snapshot(path)
    path.write_text(path.read_text() + '{"schema_version": 2, "seq')
    assert load_snapshot(path).records == whole.records
    path.write_text("not json\n" + path.read_text())
    with pytest.raises(ConfigError, match=r"s.jsonl:1: not a snapshot record"):
        load_snapshot(path)
    with pytest.raises(ConfigError, match="no such file"):
        load_snapshot(tmp_path / "missing.jsonl")


def test_regression_snapshots_predict_values_and_refuse_probabilities(tmp_path: Path) -> None:
    write_snapshots(tmp_path / "s.jsonl", loss="squared")
    served = load_snapshot(tmp_path / "s.jsonl")
    X = np.random.default_rng(2).normal(size=(5, 3))
    np.testing.assert_array_equal(served.predict_many(X), served.decision_many(X))
    with pytest.raises(InvalidInputError, match="the squared loss gives no probabilities"):
        served.predict_proba_many(X)
