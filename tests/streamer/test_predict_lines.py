"""``panpriv predict`` lines up with its input: one output line per input record, in order, with its
line number (and its id when the schema names one) and the prediction or the reject reason;
records need no label; exit 2 when nothing could be scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.schema import FeatureSchema
from panpriv.streamer.commands.cli import main
from panpriv.streamer.io.sinks import snapshot_record
from panpriv.streamer.serving.snapshots import load_snapshot


def snapshot_file(path: Path, schema: FeatureSchema | None = None) -> Path:
    learner = PanPrivateACSA(dim=3, epsilon=1.0, delta=1e-6, horizon=50, feature_bound=2.0, rng=1)
    if schema is not None:
        learner.use_schema(schema)
    rng = np.random.default_rng(0)
    learner.learn_many(rng.uniform(-1, 1, (50, 3)), np.where(rng.uniform(size=50) > 0.5, 1.0, -1.0))
    snapshot = learner.snapshot()
    record = snapshot_record(snapshot, sequence=1, instance="i", rejected=0, positions={}, privacy=snapshot.privacy.to_dict())
    path.write_text(json.dumps(record) + "\n")
    return path


def predict(tmp_path: Path, snapshot: Path, source: Path, *extra: str) -> tuple[int, list[dict[str, object]]]:
    out = tmp_path / "predictions.jsonl"
    code = main(["predict", "--snapshot", str(snapshot), "--source", f"file:{source}", "--out", str(out), *extra])
    return code, [json.loads(line) for line in out.read_text().splitlines()]


def test_positional_records_rejected_and_unlabelled_rows_keep_their_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = snapshot_file(tmp_path / "snapshots.jsonl")
    source = tmp_path / "mixed.jsonl"
    source.write_text(
        '{"x": [0.1, 0.2, 0.3], "y": 1}\n'     # 1: labelled
        '{"x": [0.5, -0.2, 0.1]}\n'            # 2: unlabelled: scored all the same
        "\n"                                     # 3: blank: not a record
        '{"x": [0.1, 0.2]}\n'                  # 4: wrong dimension
        "garbage\n"                              # 5: undecodable
        '{"x": [0.3, 0.3, "a"], "y": -1}\n'    # 6: wrong type
        '{"x": [-0.4, 0.0, 0.2], "y": -1}\n'   # 7
    )
    code, lines = predict(tmp_path, snapshot, source)
    assert code == 0
    assert [line["line"] for line in lines] == [1, 2, 4, 5, 6, 7]
    assert [line.get("rejected") for line in lines] == [None, None, "wrong_dimension", "undecodable", "wrong_type", None]
    served = load_snapshot(snapshot)
    X = np.array([[0.1, 0.2, 0.3], [0.5, -0.2, 0.1], [-0.4, 0.0, 0.2]])
    scored = [line for line in lines if "prediction" in line]
    assert [line["prediction"] for line in scored] == list(served.predict_many(X))
    assert [line["probability"] for line in scored] == list(served.predict_proba_many(X))
    assert "scored 3 records (3 rejected, 1 without a label)" in capsys.readouterr().err


def test_csv_rows_without_a_label_are_scored(tmp_path: Path) -> None:
    snapshot = snapshot_file(tmp_path / "snapshots.jsonl")
    source = tmp_path / "rows.csv"
    source.write_text('0.1,0.2,0.3\n"0.5","-0.2","0.1","1"\n0.1,0.2\n')
    code, lines = predict(tmp_path, snapshot, source)
    assert code == 0
    assert [(line["line"], "prediction" in line, line.get("rejected")) for line in lines] == [
        (1, True, None), (2, True, None), (3, False, "missing_field")
    ]


def test_named_records_are_reported_by_their_id(tmp_path: Path) -> None:
    schema = FeatureSchema.from_dict({"id": "event", "label": "clicked", "features": ["a", "b", "c"]})
    snapshot = snapshot_file(tmp_path / "snapshots.jsonl", schema)
    source = tmp_path / "events.jsonl"
    source.write_text(
        '{"event": "e1", "a": 0.1, "b": 0.2, "c": 0.3}\n'
        '{"event": "e2", "a": 0.1, "b": 0.2}\n'
        '{"event": "e3", "a": 0.1, "b": 0.2, "c": 0.3, "clicked": -1}\n'
    )
    code, lines = predict(tmp_path, snapshot, source)
    assert code == 0
    assert [(line["id"], line["line"], line.get("rejected")) for line in lines] == [("e1", 1, None), ("e2", 2, "missing_field"), ("e3", 3, None)]
    assert lines[0]["prediction"] == load_snapshot(snapshot).predict_one({"a": 0.1, "b": 0.2, "c": 0.3})


def test_nothing_scored_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = snapshot_file(tmp_path / "snapshots.jsonl")
    source = tmp_path / "wrong.jsonl"
    source.write_text('{"x": [1, 2]}\n{"x": [3, 4]}\n')
    code, lines = predict(tmp_path, snapshot, source)
    assert code == 2
    assert [line["rejected"] for line in lines] == ["wrong_dimension", "wrong_dimension"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no record of" in err[0] and "could be scored" in err[0]
