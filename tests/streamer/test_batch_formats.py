"""Batched payloads (issue 37): ``json-batch``, ``ndjson`` and ``csv-batch`` messages of many records.

Every record inside a message is decided as the same record sent alone in a ``json``/``csv``
message: the same rows bit for bit, the same labels, the same rejects by reason, whatever the
packing; a message that is not a batch at all is one reject, an empty one ``empty_batch``. The
service learns and counts records, not messages: the same records replayed as one record per
message and as batches give the same record count, rejects, planned n and privacy statement.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.commands.cli import main
from panpriv.streamer.config import load_config
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.batch_formats import FORMATS, JsonArrayCodec
from panpriv.streamer.io.codec import Codec, Decoded, encode_json
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.sources.local import RecordingSource

DIM = 3
BATCH_OF = {"json-batch": "json", "ndjson": "json", "csv-batch": "csv"}


def codec(fmt: str, **extra: object) -> Codec:
    overrides = {"source.url": "kafka://h:1/t", "records.format": fmt, "records.dim": DIM, "records.feature_bound": 1.0, **extra}
    return make_codec(load_config(None, overrides).records)


def json_records(n: int, seed: int) -> list[bytes]:
    """``n`` JSON records, about one in six rejected for some reason, the rest valid (some clipped)."""
    rng = np.random.default_rng(seed)
    bad = [b'{"x": [1, 2], "y": 1}', b'{"x": [NaN, 0, 0], "y": 1}', b'{"x": [0, 0, 0], "y": 3}', b'{"y": 1}',
           b'{"x": ["a", 0, 0], "y": -1}', b'[1, 2, 3]', b'{"x": [0, 0, 0], "y": 1', b'{"x": [1e400, 0, 0], "y": 1}']
    out = []
    for i in range(n):
        if rng.random() < 1 / 6:
            out.append(bad[i % len(bad)])
        else:
            out.append(encode_json(rng.normal(0, 0.8, DIM), float(rng.choice([-1.0, 1.0]))))
    return out


def csv_records(n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    bad = [b"1,2,1", b"nan,0,0,1", b"0,0,0,3", b"a,0,0,-1", b'"1,0,0,1', b"0,0,0,0,1,1"]
    out = []
    for i in range(n):
        if rng.random() < 1 / 6:
            out.append(bad[i % len(bad)])
        else:
            out.append(",".join(repr(float(v)) for v in [*rng.normal(0, 0.8, DIM), rng.choice([-1.0, 1.0])]).encode())
    return out


def pack(fmt: str, records: list[bytes]) -> bytes:
    """One message of ``fmt`` holding ``records`` (each as its single-record message's bytes)."""
    if fmt == "json-batch":
        return b"[" + b",".join(records) + b"]"
    return b"\n".join(records) + (b"\n" if len(records) % 2 else b"")  # a trailing newline or not


def chunks(records: list[bytes], sizes: list[int]) -> list[list[bytes]]:
    out, start = [], 0
    for size in sizes:
        out.append(records[start : start + size])
        start += size
    return out


def per_message_counts(decoded: Decoded, messages: int) -> list[Counter[str]]:
    counts = [Counter[str]() for _ in range(messages)]
    for i in decoded.origin.tolist():
        counts[i]["accepted"] += 1
    for reject in decoded.rejects:
        counts[reject.index][reject.reason.value] += reject.count
    return counts


def records_for(fmt: str, n: int, seed: int) -> list[bytes]:
    return json_records(n, seed) if BATCH_OF[fmt] == "json" else csv_records(n, seed)


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_record_of_a_batch_is_decided_as_the_same_record_alone(fmt: str) -> None:
    """Rows bit for bit, labels, and per message the accepted records and rejects by reason; the
    records of one message are contiguous rows, in order."""
    records = [r for r in records_for(fmt, 300, 1) if fmt == "json-batch" or r.strip()]
    if fmt == "json-batch":  # an element that is not JSON breaks the array: keep such records out
        records = [r for r in records if r != b'{"x": [0, 0, 0], "y": 1']
    sizes = [1, 7, 64, 3, 100, 2]
    sizes.append(len(records) - sum(sizes))
    groups = chunks(records, sizes)
    alone = codec(BATCH_OF[fmt]).decode(records)
    batched = codec(fmt).decode([pack(fmt, group) for group in groups])
    assert batched.X.tobytes() == alone.X.tobytes() and batched.y.tobytes() == alone.y.tobytes()
    message_of = np.repeat(np.arange(len(groups)), sizes)
    assert batched.origin.tolist() == message_of[alone.origin].tolist()
    expected = [Counter[str]() for _ in groups]
    for i in alone.origin.tolist():
        expected[message_of[i]]["accepted"] += 1
    for reject in alone.rejects:
        expected[message_of[reject.index]][reject.reason.value] += reject.count
    assert per_message_counts(batched, len(groups)) == expected
    assert sum(expected, Counter[str]())["accepted"] > 200 and len(sum(expected, Counter[str]())) >= 5


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_message_that_is_no_batch_is_one_reject_and_an_empty_one_an_empty_batch(fmt: str) -> None:
    valid = pack(fmt, records_for(fmt, 40, 2)[:1] and [b'{"x": [0.1, 0, 0], "y": 1}' if BATCH_OF[fmt] == "json" else b"0.1,0,0,1"])
    empty = {"json-batch": [b"[]", b" [ ] "], "ndjson": [b"", b"\n\n", b" \r\n"], "csv-batch": [b"", b"\n", b"\r\n\r\n"]}[fmt]
    payloads = [valid, *empty]
    expected: list[Counter[str]] = [Counter(accepted=1), *[Counter(empty_batch=1) for _ in empty]]
    if fmt == "json-batch":
        payloads += [b'{"x": [0, 0, 0], "y": 1}', b"not json", b"[" * 5000, b"\xff\xfe"]
        expected += [Counter(wrong_type=1), Counter(undecodable=1), Counter(undecodable=1), Counter(undecodable=1)]
    decoded = codec(fmt).decode(payloads)
    assert per_message_counts(decoded, len(payloads)) == expected
    c = codec(fmt)
    assert [c.records_in(p) for p in payloads] == [1, *[0] * len(empty), *[1] * (len(payloads) - 1 - len(empty))]


def test_json_batch_reads_alike_with_orjson_and_the_standard_library() -> None:
    records = load_config(None, {"source.url": "kafka://h:1/t", "records.format": "json-batch", "records.dim": DIM,
                                 "records.feature_bound": 1.0}).records
    payloads = [pack("json-batch", group) for group in chunks(json_records(200, 3), [50, 50, 50, 50])]
    payloads += [b'[{"x": [1, 2, 3], "y": 1}, {"x": [' + b"[" * 995 + b"1" + b"]" * 995 + b', 0, 0], "y": 1}]',
                 b'[{"x": [18446744073709551617, 0, 0], "y": 1}]', b'[{"x": [1, 0, 0], "y": true}]', b"\xef\xbb\xbf[]"]
    fast, stdlib = JsonArrayCodec(records, fast=True).decode(payloads), JsonArrayCodec(records, fast=False).decode(payloads)
    assert fast.rejects == stdlib.rejects and fast.origin.tolist() == stdlib.origin.tolist()
    assert fast.X.tobytes() == stdlib.X.tobytes() and fast.y.tobytes() == stdlib.y.tobytes()


@pytest.mark.parametrize("fmt", ["json-batch", "ndjson"])
def test_named_records_in_batches_read_as_the_named_json_codec_reads_them(fmt: str) -> None:
    fields = {"features": [{"name": "age", "min": 0, "max": 100}, {"name": "city", "categories": ["a", "b"]}], "label": "clicked"}
    lines = [b'{"age": 30, "city": "a", "clicked": 1}', b'{"age": 50, "city": "z", "clicked": 0}',
             b'{"age": "x", "city": "b", "clicked": 1}', b'{"age": 20, "city": "b", "clicked": 1, "extra": [1]}']
    single = codec("json", **{"records.fields": fields})
    batched = codec(fmt, **{"records.fields": fields})
    alone = single.decode(lines)
    together = batched.decode([pack(fmt, lines[:3]), pack(fmt, lines[3:])])
    assert together.X.tobytes() == alone.X.tobytes() and together.y.tobytes() == alone.y.tobytes()
    assert sorted((r.reason.value, r.count) for r in together.rejects) == sorted((r.reason.value, r.count) for r in alone.rejects)
    assert [c for c in batched.values([pack(fmt, lines)]).content or ()] == list(single.values(lines).content or ())


def test_a_csv_batch_with_a_schema_is_refused_with_the_reason() -> None:
    with pytest.raises((ConfigError, ValueError), match="csv-batch message carries no header"):
        codec("csv-batch", **{"records.fields": {"features": ["a", "b", "c"], "label": "y"}})


# -- the service ----------------------------------------------------------------------------------


def recording(path: Path, messages: list[bytes]) -> Path:
    writer = RecordingWriter(path, "kafka://127.0.0.1:1/t?group=g", ["t/0"], {"t/0": 0}, "2026-01-01T00:00:00")
    for offset, message in enumerate(messages):
        writer.write("t/0", offset, 0, message)
    writer.close()
    return path


def run(tmp_path: Path, name: str, source: Path, fmt: str) -> dict:
    out = tmp_path / name
    config = tmp_path / "users.toml"
    config.write_text("[learner]\nmax_records_per_user = 4\n")  # the group-privacy figures count records too
    code = main(["-q", "run", "--config", str(config), "--source", f"file:{source}", "--format", fmt, "--dim", str(DIM),
                 "--feature-bound", "1", "--rate", "0", "--out", str(out), "--state-dir", str(tmp_path / f"state-{name}"),
                 "--metrics-port", "0", "--progress", "off"])
    assert code == 0
    return json.loads((out / "checkpoints" / "checkpoint.json").read_bytes())


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_service_counts_records_not_messages(tmp_path: Path, fmt: str) -> None:
    """The same 3,000 records, one per message and 250 per message: the planned n (the recording's
    records, from each message's count), the records learned, the rejects by reason, the privacy
    report and the declared records per user of the group-privacy figures are the same."""
    records = records_for(fmt, 3000, 4)
    if fmt == "json-batch":
        records = [r for r in records if r != b'{"x": [0, 0, 0], "y": 1']
    alone = recording(tmp_path / "alone.pprec", records)
    batched = recording(tmp_path / "batched.pprec", [pack(fmt, records[i : i + 250]) for i in range(0, len(records), 250)])
    codec_batched = codec(fmt)
    assert RecordingSource(batched, {}, False, codec_batched).count_records() == len(records)
    single = run(tmp_path, "alone", alone, BATCH_OF[fmt])
    many = run(tmp_path, "batched", batched, fmt)
    assert many["records"] == single["records"] > 2000
    assert many["rejects"] == single["rejects"] and len(single["rejects"]) >= 4
    assert many["learner"]["config"] == single["learner"]["config"]  # the horizon: the planned n, in records
    reports = [next(iter(m["ledger"]["instances"].values())) for m in (single, many)]
    for key in ("records", "unit", "output", "intrusion", "statement"):
        assert reports[0][key] == reports[1][key], key
    assert reports[0]["unit"] == "record" and single["ledger"]["max_records_per_user"] == many["ledger"]["max_records_per_user"] == 4


def test_a_line_file_in_a_batched_format_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"\n".join(json_records(10, 5)) + b"\n")
    code = main(["-q", "run", "--source", f"file:{path}", "--format", "json-batch", "--dim", str(DIM), "--feature-bound", "1",
                 "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state"), "--metrics-port", "0", "--progress", "off"])
    err = capsys.readouterr().err
    assert code != 0 and "reads messages of many records" in err and "Traceback" not in err


# -- the real broker ------------------------------------------------------------------------------

BAD_RECORDS = {  # one message of fmt: a valid record, a label out of range, a record of the wrong dimension
    "json-batch": b'[{"x": [0.1, 0, 0], "y": 1}, {"x": [0, 0, 0], "y": 5}, {"x": [0, 0], "y": 1}]',
    "ndjson": b'{"x": [0.1, 0, 0], "y": 1}\n{"x": [0, 0, 0], "y": 5}\n{"x": [0, 0], "y": 1}\n',
    "csv-batch": b"0.1,0,0,1\n0,0,0,5\n0,0,0,0,1\n",
}


@pytest.mark.integration
@pytest.mark.parametrize("fmt", FORMATS)
def test_batches_from_the_real_broker_are_learned_and_counted_by_record(fmt: str, kafka_broker, unique_name,
                                                                         tmp_path: Path) -> None:
    """``panpriv produce --format fmt`` writes 2,000 records in messages of 256; then a message of
    three records (one valid, two rejected) and an empty message: the service on the topic learns
    2,001 records and counts each reject by its reason, the empty message as ``empty_batch``."""
    from panpriv.streamer.commands.produce import produce
    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.runtime.processor import Processor

    topic, group = kafka_broker.create_topic(unique_name("batches")), unique_name("g")
    assert produce(kafka_broker.bootstrap, topic, 2000, DIM, seed=2, fmt=fmt, batch_records=256) == 2000
    producer = kafka_client.producer(kafka_broker.bootstrap)
    try:
        for message in (BAD_RECORDS[fmt], b"[]" if fmt == "json-batch" else b""):
            producer.send(topic, message)
        producer.flush()
    finally:
        producer.close()
    config = load_config(None, {"source.url": f"kafka://{kafka_broker.bootstrap}/{topic}?group={group}",
                                "source.stop_at_end": True, "records.format": fmt, "records.dim": DIM,
                                "records.feature_bound": 1.0, "learner.n": 2003, "out": tmp_path / "out",
                                "metrics.port": None})
    result = Processor(config).run()
    assert result.records == 2001
    assert result.rejects == {"label_out_of_range": 1, "wrong_dimension": 1, "empty_batch": 1}
