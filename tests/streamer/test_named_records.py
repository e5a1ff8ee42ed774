"""Inputs users have, learned end to end through ``panpriv run``: JSON objects with named fields and
CSV rows named by their header, both mapped by one schema, and quoted CSV (``csv.QUOTE_ALL``);
named records keep the budget store's content identity (the same records are the same data,
whatever the format or the schema)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from panpriv.streamer.commands.cli import main
from panpriv.streamer.config import load_config
from panpriv.streamer.io.codec import Reason
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.sources.identity import line_file_identity

SCHEMA = {
    "label": "clicked",
    "id": "event",
    "features": [
        {"name": "age", "min": 17, "max": 90},
        {"name": "country", "categories": ["de", "fr", "us"]},
        {"name": "visits", "min": 0, "max": 50, "default": 0},
    ],
}


def events(n: int = 400, seed: int = 5) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        age = int(rng.integers(17, 91))
        out.append({"event": f"e{i}", "age": age, "country": str(rng.choice(["de", "fr", "us"])),
                    "visits": int(rng.integers(0, 30)), "clicked": 1 if age > 50 else -1})
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]], extra_lines: list[str] = ()) -> Path:  # type: ignore[assignment]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "".join(line + "\n" for line in extra_lines))
    return path


def write_csv(path: Path, records: list[dict[str, Any]], columns: list[str]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_ALL, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([[r.get(c, "") for c in columns] for r in records])
    return path


def run(source: Path, out: Path, **extra: Any) -> Any:
    overrides = {"source.url": f"file:{source}", "metrics.port": None, "out": str(out),
                 "budget.state_dir": str(out.parent / "budget"), **extra}
    return Processor(load_config(None, overrides)).run()


def test_named_json_is_learned_through_panpriv_run_and_bad_records_are_counted_by_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    source = write_jsonl(tmp_path / "events.jsonl", events(), [
        '{"event": "m", "country": "fr", "clicked": 1}',                  # no age
        '{"event": "u", "age": 30, "country": "fr", "clicked": 1, "colour": "red"}',
        '{"event": "c", "age": 30, "country": "es", "clicked": 1}',
        '{"event": "t", "age": "thirty", "country": "fr", "clicked": 1}',
        '{"event": "l", "age": 30, "country": "fr"}',                      # no label: not learnable
        '[30, "fr", 1]',
    ])
    out = tmp_path / "out"
    code = main(["run", "--source", f"file:{source}", "--schema", str(tmp_path / "schema.json"), "--out", str(out),
                 "--state-dir", str(tmp_path / "budget"), "--metrics-port", "0", "--progress", "off", "-q"])
    assert code == 0
    summary = capsys.readouterr().out
    assert "records learned 400; rejected 6 (missing_field: 2, unknown_category: 1, unknown_field: 1, wrong_type: 2)" in summary
    snapshot = json.loads((out / "snapshots.jsonl").read_text().splitlines()[-1])
    assert snapshot["model"]["feature_names"] == ["age", "country=de", "country=fr", "country=us", "visits"]
    assert snapshot["model"]["schema"]["features"] == SCHEMA["features"]
    assert snapshot["model"]["feature_bound"] == pytest.approx(math.sqrt(3))  # every feature bounded: √3 by construction


def test_quoted_csv_is_learned_like_plain_csv(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    X = rng.uniform(-0.5, 0.5, (300, 3))
    y = np.where(X[:, 0] > 0, 1, -1)
    quoted, plain = tmp_path / "quoted.csv", tmp_path / "plain.csv"
    with quoted.open("w", newline="") as handle:
        csv.writer(handle, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([[*(repr(float(v)) for v in x), int(c)] for x, c in zip(X, y)])
    plain.write_text("".join(",".join([*(repr(float(v)) for v in x), str(int(c))]) + "\n" for x, c in zip(X, y)))
    settings = {"records.dim": 3, "records.feature_bound": 1.0}
    codec = make_codec(load_config(None, {"source.url": f"file:{quoted}", **settings}).records)
    decoded = codec.decode(quoted.read_bytes().splitlines())
    np.testing.assert_array_equal(decoded.X, X)  # exactly the numbers written
    assert not decoded.rejects
    result = run(quoted, tmp_path / "q", **settings)
    assert result.records == 300 and result.rejects == {}
    # The same numbers quoted or not are the same records: one data key, so the runs compose.
    again = run(plain, tmp_path / "p", **settings)
    assert again.report.output.epsilon == pytest.approx(2 * result.report.output.epsilon)


@pytest.mark.parametrize(
    ("line", "reason"),
    [(b'"0.1","0.2', Reason.UNDECODABLE), (b'"0.1","x","0.3","1"', Reason.WRONG_TYPE), (b'"0.1","0.2","1"', Reason.MISSING_FIELD)],
)
def test_a_bad_quoted_line_is_rejected_alone(tmp_path: Path, line: bytes, reason: Reason) -> None:
    codec = make_codec(load_config(None, {"source.url": "file:x.csv", "records.dim": 3, "records.feature_bound": 1.0}).records)
    decoded = codec.decode([b'"0.1","0.2","0.3","1"', line, b"0.1,0.2,0.3,-1"])
    assert [(r.index, r.reason) for r in decoded.rejects] == [(1, reason)]
    assert len(decoded.y) == 2


def test_headed_csv_through_the_schema_is_the_same_data_as_the_named_json(tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    records = events()
    as_json = write_jsonl(tmp_path / "events.jsonl", records)
    columns = ["clicked", "visits", "event", "country", "age"]  # any column order: the header names them
    as_csv = write_csv(tmp_path / "events.csv", records, columns)
    first = run(as_json, tmp_path / "a", **{"records.schema_file": str(tmp_path / "schema.json")})
    second = run(as_csv, tmp_path / "b", **{"records.schema_file": str(tmp_path / "schema.json")})
    assert first.records == second.records == 400
    np.testing.assert_array_equal(  # the same vectors: the CSV's columns were mapped by name
        make_codec(load_config(None, {"source.url": f"file:{as_json}", "records.fields": SCHEMA}).records)
        .decode(as_json.read_bytes().splitlines()).X[:5],
        first.learner.schema and np.array([first.learner.schema.vector(r) for r in records[:5]]),
    )
    assert second.report.output.epsilon == pytest.approx(2 * first.report.output.epsilon)


def test_another_schema_over_the_same_records_is_the_same_data(tmp_path: Path) -> None:
    """A record is identified by all its fields, not by what a schema takes from it: fewer
    features, other bounds or vocabularies do not make the same file fresh data."""
    source = write_jsonl(tmp_path / "events.jsonl", events())
    fewer = {"label": "clicked", "id": "event", "unknown": "ignore", "features": [{"name": "age", "min": 0, "max": 100}]}

    def key(fields: dict[str, Any]) -> str:
        return line_file_identity(source, make_codec(load_config(None, {"source.url": f"file:{source}", "records.fields": fields}).records)).key

    assert key(SCHEMA) == key(fewer)
    reordered = tmp_path / "reordered.jsonl"  # another key order, 1.0 for 1, the lines shuffled: the same records
    rows = [json.loads(line) for line in source.read_text().splitlines()][::-1]
    reordered.write_text("".join(json.dumps({k: (float(v) if isinstance(v, int) else v) for k, v in reversed(r.items())}) + "\n" for r in rows))
    assert line_file_identity(reordered, make_codec(load_config(None, {"source.url": f"file:{reordered}", "records.fields": SCHEMA}).records)).key == key(SCHEMA)
    write_jsonl(tmp_path / "changed.jsonl", [{**events()[0], "visits": 29}, *events()[1:]])
    changed = tmp_path / "changed.jsonl"
    assert line_file_identity(changed, make_codec(load_config(None, {"source.url": f"file:{changed}", "records.fields": SCHEMA}).records)).key != key(SCHEMA)
    result = run(source, tmp_path / "a", **{"records.fields": SCHEMA})
    other = run(source, tmp_path / "b", **{"records.fields": fewer, "records.feature_bound": 1.0})
    assert other.report.output.epsilon == pytest.approx(2 * result.report.output.epsilon)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"records.fields": SCHEMA, "records.format": "binary"}, "not format 'binary'"),
        ({"records.fields": SCHEMA, "records.dim": 4}, "take 5 positions"),
        ({"records.fields": SCHEMA, "source.url": "file:x.csv", "records.csv_header": False}, "needs its header line"),
        ({"records.schema_file": "nowhere.json"}, "schema file nowhere.json"),
        ({"records.schema_file": "nowhere.json", "records.fields": SCHEMA}, "not both"),
    ],
)
def test_a_schema_that_cannot_apply_is_a_configuration_error(overrides: dict[str, Any], message: str) -> None:
    from panpriv.streamer.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(None, {"source.url": "file:x.jsonl", **overrides})


def test_a_csv_header_without_the_schemas_columns_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    source = write_csv(tmp_path / "events.csv", events(20), ["event", "country", "visits", "clicked"])  # no age
    code = main(["run", "--source", f"file:{source}", "--schema", str(tmp_path / "schema.json"), "--out", str(tmp_path / "out"),
                 "--state-dir", str(tmp_path / "budget"), "--metrics-port", "0", "--progress", "off", "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "no column 'age'" in err[0]
