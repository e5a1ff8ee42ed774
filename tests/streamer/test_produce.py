"""``panpriv produce`` (panpriv.streamer.commands.produce): the synthetic stream, encoded as the service decodes it."""

from __future__ import annotations

import argparse
import time

import numpy as np
import pytest

from panpriv.streamer.commands.produce import Pacer, add_produce_arguments, produce, synthetic_messages
from panpriv.streamer.config import load_config
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.sources.local import SyntheticSource


def codec_for(fmt: str, dim: int):
    config = load_config(None, {"source.url": "kafka://h:1/t", "records.format": fmt, "records.dim": dim,
                                "records.feature_bound": 100.0})
    return make_codec(config.records)


def synthetic(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    batch = SyntheticSource(n, dim, seed, positions={}).poll(n, 0.0)
    assert batch is not None and batch.arrays is not None
    return batch.arrays


@pytest.mark.parametrize(("fmt", "expected_messages"), [("json", 5000), ("binary", 20), ("json-batch", 20), ("ndjson", 20),
                                                        ("csv-batch", 20)])
def test_messages_decode_to_the_synthetic_records(fmt: str, expected_messages: int) -> None:
    # 5000 records cross the synthetic source's 4096-record block boundary.
    messages = list(synthetic_messages(5000, 7, seed=3, fmt=fmt, batch_records=256))
    assert len(messages) == expected_messages
    assert sum(count for count, _ in messages) == 5000
    decoded = codec_for(fmt, 7).decode([message for _, message in messages])
    X, y = synthetic(5000, 7, seed=3)
    assert decoded.reject_counts() == {}
    # JSON and CSV carry float64 exactly (repr round trip); binary batches carry float32.
    dtype = np.float32 if fmt == "binary" else np.float64
    np.testing.assert_array_equal(decoded.X, X.astype(dtype).astype(np.float64))
    np.testing.assert_array_equal(decoded.y, y)


def test_pacer_never_runs_ahead_of_the_rate() -> None:
    pacer = Pacer(2000.0)
    for sent in range(100, 1001, 100):
        pacer.wait(sent)
        assert time.monotonic() - pacer.start >= sent / 2000.0
    unlimited = Pacer(None)
    unlimited.wait(10**9)
    assert time.monotonic() - unlimited.start < 0.1


def test_arguments_and_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_produce_arguments(parser)
    args = parser.parse_args(["--bootstrap", "kafka:9092", "--topic", "t"])
    assert (args.n, args.dim, args.seed, args.format, args.batch_records, args.rate) == (None, 20, 0, "json", 256, None)
    for bad in (["--n", "0"], ["--rate", "-1"], ["--format", "csv"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["--bootstrap", "b", "--topic", "t", *bad])


@pytest.mark.integration
def test_produce_writes_every_record_to_the_topic(kafka_broker, unique_name) -> None:
    from kafka import KafkaConsumer

    topic = kafka_broker.create_topic(unique_name("produce"), partitions=2)
    assert produce(kafka_broker.bootstrap, topic, 1000, 5, seed=1, fmt="binary", batch_records=100) == 1000
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap, group_id=unique_name("g"),
                             auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        payloads = []
        for message in consumer:  # 10 binary messages of 100 records; stop at the 10th
            payloads.append(message.value)
            if len(payloads) == 10:
                break
    finally:
        consumer.close()
    decoded = codec_for("binary", 5).decode(payloads)
    X, _ = synthetic(1000, 5, seed=1)
    # Partitions interleave messages: compare as sets of rows.
    assert len(payloads) == 10 and decoded.X.shape == (1000, 5)
    assert sorted(map(tuple, decoded.X)) == sorted(map(tuple, X.astype(np.float32).astype(np.float64)))
