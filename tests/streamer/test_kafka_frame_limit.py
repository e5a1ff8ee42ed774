"""Every kafka-python consumer panpriv makes accepts the largest response its own fetch settings
allow (``panpriv.streamer.kafka.client.receive_limit``): kafka-python's default frame limit (1 MB) is far
below its default ``fetch_max_bytes`` (50 MB), and a consumer starting behind a full multi-partition
topic then failed every fetch with "Invalid frame length" (seen in the scale-out workers)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from panpriv.streamer.kafka import client as kafka_client
from tests.realparts import KafkaBroker

pytestmark = [pytest.mark.integration]


def test_the_limit_covers_the_largest_fetch() -> None:
    assert kafka_client.receive_limit({}) == kafka_client.RECEIVE_MESSAGE_MAX_BYTES
    analyzer = {"fetch_max_bytes": 256 * 2**20, "max_partition_fetch_bytes": 256 * 2**20}
    assert kafka_client.receive_limit(analyzer) == 257 * 2**20
    assert kafka_client.receive_limit({"max_partition_fetch_bytes": 100 * 2**20}) == 101 * 2**20


def test_a_consumer_reads_a_multi_megabyte_fetch(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Four partitions of three 900 kB messages each: one fetch from the start answers with
    several MB. kafka-python's own default frame limit refuses that response (and falls back on
    retries); the project's consumer reads it at once."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = kafka_broker.create_topic(unique_name("frames"), partitions=4)
    value = b"x" * 900_000
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", max_request_size=4 * 2**20)
    try:
        for partition in range(4):
            for _ in range(3):
                producer.send(topic, value, partition=partition)
        producer.flush()
    finally:
        producer.close()
    partitions = [TopicPartition(topic, p) for p in range(4)]

    def read(consumer: KafkaConsumer) -> int:
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        got = 0
        for _ in range(20):
            got += sum(len(records) for records in consumer.poll(timeout_ms=500).values())
            if got == 12:
                break
        consumer.close()
        return got

    refused = "Invalid frame length"
    with caplog.at_level(logging.ERROR, logger="kafka"):
        assert read(kafka_client.consumer(kafka_broker.bootstrap, group_id=None, enable_auto_commit=False)) == 12
        assert refused not in caplog.text
        read(KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=None, enable_auto_commit=False))
    assert refused in caplog.text, "kafka-python's own limit reads this fetch (the check above would prove nothing)"
