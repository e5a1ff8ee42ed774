"""--holdout: each released snapshot scored on a public labelled file (panpriv.streamer.serving.holdout)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sklearn.metrics import balanced_accuracy_score, log_loss, roc_auc_score

from panpriv.streamer.commands.cli import main
from panpriv.streamer.config import load_config
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.serving.holdout import Holdout
from panpriv.streamer.serving.snapshots import snapshot_from_record


def write_records(path: Path, n: int, seed: int, bad: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    theta = np.array([2.0, -1.0, 0.5, 0.0])
    with open(path, "w") as handle:
        for _ in range(n):
            x = rng.uniform(-0.5, 0.5, size=4)
            y = 1 if rng.uniform() < 1 / (1 + np.exp(-4 * x @ theta)) else -1
            handle.write(json.dumps({"x": x.tolist(), "y": y}) + "\n")
        for _ in range(bad):
            handle.write('{"x": [1, 2], "y": 1}\n')  # wrong dimension: rejected, not fatal
    return path


def configure(tmp_path: Path, **extra):
    return load_config(None, {
        "source.url": f"file:{write_records(tmp_path / 'train.jsonl', 3000, seed=1)}", "records.dim": 4,
        "records.feature_bound": 1.0, "metrics.port": None, "out": str(tmp_path / "out"),
        "snapshots.every_records": 1000, "checkpoint.every_records": 1000, **extra,
    })


def test_every_snapshot_carries_its_scores_on_the_holdout_computed_by_independent_code(tmp_path: Path) -> None:
    holdout_path = write_records(tmp_path / "holdout.jsonl", 800, seed=2, bad=3)
    registry = CollectorRegistry()
    result = Processor(configure(tmp_path, **{"snapshots.holdout": str(holdout_path)}),
                       metrics=ServiceMetrics(registry=registry)).run()
    records = [json.loads(line) for line in (tmp_path / "out" / "snapshots.jsonl").read_text().splitlines()]
    assert len(records) == result.snapshots >= 3 and all("holdout" in r for r in records)
    rows = [json.loads(line) for line in holdout_path.read_text().splitlines()[:800]]
    X = np.array([r["x"] for r in rows])
    positive = np.array([r["y"] for r in rows]) > 0
    for record in records:
        snapshot = snapshot_from_record(record)
        scores = record["holdout"]
        decision = snapshot.decision_many(X)
        assert scores["records"] == 800  # the 3 malformed lines were rejected by the run's codec
        assert scores["auc"] == pytest.approx(roc_auc_score(positive, decision), abs=1e-12)
        assert scores["accuracy"] == pytest.approx(np.mean((decision > 0) == positive), abs=1e-12)
        assert scores["majority_accuracy"] == pytest.approx(max(positive.mean(), 1 - positive.mean()), abs=1e-12)
        assert scores["log_loss"] == pytest.approx(log_loss(positive, snapshot.predict_proba_many(X)), rel=1e-9)
        assert scores["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(positive, decision > 0), abs=1e-12)
        probability = snapshot.predict_proba_many(X)
        assert scores["prior_threshold"] == pytest.approx(np.mean(probability), rel=1e-12)
        at_prior = probability > scores["prior_threshold"]
        assert scores["accuracy_at_prior"] == pytest.approx(np.mean(at_prior == positive), abs=1e-12)
        assert scores["balanced_accuracy_at_prior"] == pytest.approx(balanced_accuracy_score(positive, at_prior), abs=1e-12)
    assert records[-1]["holdout"]["auc"] > 0.7  # the model learned something the hold-out can see
    for metric in ("auc", "accuracy", "log_loss"):
        assert registry.get_sample_value("panpriv_holdout_score", {"metric": metric}) == pytest.approx(records[-1]["holdout"][metric])
    # The count is a series of its own: a sum or an average over the scores' metric label mixes no count in.
    assert registry.get_sample_value("panpriv_holdout_records") == 800
    assert registry.get_sample_value("panpriv_holdout_score", {"metric": "records"}) is None


def test_inspect_shows_the_scores(tmp_path: Path, capsys) -> None:
    holdout_path = write_records(tmp_path / "holdout.jsonl", 300, seed=3)
    Processor(configure(tmp_path, **{"snapshots.holdout": str(holdout_path)})).run()
    assert main(["inspect", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "hold-out scores (public file, 300 records):" in out and "auc 0." in out and "log_loss" in out
    assert main(["inspect", "--json", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    scored = summary["snapshots"]["holdout"]
    assert len(scored) == summary["snapshots"]["count"] >= 3 and all(0.0 <= entry["auc"] <= 1.0 for entry in scored)


def test_a_holdout_without_valid_records_or_missing_is_a_clear_error(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"x": [1, 2], "y": 1}\n')
    codec = make_codec(configure(tmp_path).records)
    with pytest.raises(ConfigError, match="has no valid record for this run's"):
        Holdout.load(empty, codec)
    data = write_records(tmp_path / "d.jsonl", 50, seed=4)
    argv = ["run", "--source", f"file:{data}", "--dim", "4", "--feature-bound", "1", "--metrics-port", "0",
            "--out", str(tmp_path / "out2"), "--holdout", str(tmp_path / "missing.jsonl")]
    assert main(argv) == 2
    assert "holdout: " in capsys.readouterr().err and not (tmp_path / "out2").exists()


def test_on_imbalanced_data_the_prior_threshold_shows_what_accuracy_hides(tmp_path: Path) -> None:
    """Issue 38: with ~5 % positives a useful model predicts no positive at P > 1/2, so its accuracy is
    the majority rate and its balanced accuracy 1/2; at the model's own prior (chosen without the
    labels) its balanced accuracy shows what it learned."""
    rng = np.random.default_rng(5)

    def write(path: Path, n: int) -> Path:
        with open(path, "w") as handle:
            for _ in range(n):
                x = rng.uniform(-0.5, 0.5, size=4)
                y = 1 if rng.uniform() < 1 / (1 + np.exp(-(4 * x[0] - 3.5))) else -1
                handle.write(json.dumps({"x": x.tolist(), "y": y}) + "\n")
        return path

    config = load_config(None, {
        "source.url": f"file:{write(tmp_path / 'train.jsonl', 20_000)}", "records.dim": 4, "records.feature_bound": 1.0,
        "metrics.port": None, "out": str(tmp_path / "out"), "snapshots.holdout": str(write(tmp_path / "h.jsonl", 4000)),
    })
    Processor(config).run()
    scores = json.loads((tmp_path / "out" / "snapshots.jsonl").read_text().splitlines()[-1])["holdout"]
    assert scores["auc"] > 0.7 and scores["prior_threshold"] < 0.2
    assert scores["balanced_accuracy"] < 0.55 < 0.6 < scores["balanced_accuracy_at_prior"]
