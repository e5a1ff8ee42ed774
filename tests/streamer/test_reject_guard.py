"""The reject-ratio guard (panpriv.streamer.runtime.reject_guard): a misconfigured run stops loudly before it
charges the budget, checkpoints or commits offsets; a healthy or tolerated one is not stopped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.budget.store import describe_store
from panpriv.streamer.commands.cli import main
from panpriv.streamer.commands.produce import produce
from panpriv.streamer.config import load_config
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.reject_guard import RejectRatioError


def write_records(path: Path, n: int, dim: int, bad_labels: int = 0) -> Path:
    """``n`` JSON records; ``bad_labels`` of them, spread at random, have the label 7."""
    rng = np.random.default_rng(1)
    bad = set(rng.permutation(n)[:bad_labels].tolist())
    with open(path, "w") as handle:
        for i in range(n):
            y = 7 if i in bad else (1 if i % 2 else -1)
            handle.write(json.dumps({"x": (rng.standard_normal(dim) / (4 * dim)).tolist(), "y": y}) + "\n")
    return path


def test_wrong_dim_exits_2_naming_the_fix_before_charging(tmp_path: Path, capsys, monkeypatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("PANPRIV_STATE_DIR", str(state))
    data = write_records(tmp_path / "d20.jsonl", 3000, dim=20)
    out = tmp_path / "out"
    code = main(["run", "--source", f"file:{data}", "--dim", "5", "--feature-bound", "1", "--out", str(out),
                 "--metrics-port", "0", "--rate", "0"])
    error = capsys.readouterr().err
    assert code == 2
    assert "'wrong_dimension'" in error and "run with --dim 20" in error and "100.0%" in error
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    assert "data sources (0)" in describe_store(state, None)  # no record range was charged


def test_wrong_labels_name_label_values(tmp_path: Path) -> None:
    data = write_records(tmp_path / "d.jsonl", 1200, dim=3, bad_labels=1200)
    config = load_config(None, {"source.url": f"file:{data}", "records.dim": 3, "records.feature_bound": 1.0,
                                "out": tmp_path / "out", "metrics.port": None, "records.guard_records": 500})
    with pytest.raises(RejectRatioError, match=r"most as 'label_out_of_range' \(1,024\).*records.label_values"):
        Processor(config).run()


def test_below_the_ratio_or_disabled_the_run_goes_on(tmp_path: Path) -> None:
    mostly_bad = write_records(tmp_path / "d.jsonl", 2000, dim=3, bad_labels=1900)  # 95 % < 99 %
    base = {"records.dim": 3, "records.feature_bound": 1.0, "metrics.port": None}
    result = Processor(load_config(None, {**base, "source.url": f"file:{mostly_bad}", "out": tmp_path / "a"})).run()
    assert (result.outcome, result.records, result.rejects) == ("finished", 100, {"label_out_of_range": 1900})
    all_bad = write_records(tmp_path / "e.jsonl", 2000, dim=3, bad_labels=2000)
    off = load_config(None, {**base, "source.url": f"file:{all_bad}", "out": tmp_path / "b", "records.guard_records": 0})
    assert Processor(off).run().rejects == {"label_out_of_range": 2000}


def test_kafka_offsets_are_not_committed(kafka_broker, unique_name, tmp_path: Path) -> None:
    from kafka import KafkaConsumer, TopicPartition

    topic, group = kafka_broker.create_topic(unique_name("guard")), unique_name("g")
    produce(kafka_broker.bootstrap, topic, 2000, dim=20)
    config = load_config(None, {"source.url": f"kafka://{kafka_broker.bootstrap}/{topic}?group={group}",
                                "source.stop_at_end": True, "records.dim": 5, "records.feature_bound": 1.0,
                                "learner.n": 2000, "out": tmp_path / "out", "metrics.port": None})
    with pytest.raises(RejectRatioError, match="run with --dim 20"):
        Processor(config).run()
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        assert consumer.committed(TopicPartition(topic, 0)) is None
    finally:
        consumer.close(autocommit=False)
