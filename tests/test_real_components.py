"""Smoke tests proving the integration fixtures are the real components, not stand-ins."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from tests.realparts import free_loopback_port

pytestmark = pytest.mark.integration


def test_broker_round_trips_1000_records_through_a_consumer_group(kafka_broker, unique_name) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = kafka_broker.create_topic(unique_name("smoke"), partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    for i in range(1000):
        producer.send(topic, str(i).encode(), partition=i % 3)
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=unique_name("smoke-group"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    received: dict[int, int] = {}
    partitions_seen: set[int] = set()
    for message in consumer:
        received[int(message.value)] = message.offset
        partitions_seen.add(message.partition)
        if len(received) == 1000:
            break
    consumer.commit()
    committed = {tp.partition: consumer.committed(tp) for tp in consumer.assignment()}
    consumer.close()

    assert sorted(received) == list(range(1000))
    assert partitions_seen == {0, 1, 2}
    # Records were spread round-robin, so each partition holds 333 or 334 and the group's
    # committed offsets sum to the record count.
    assert sum(committed.values()) == 1000


def test_prometheus_scrapes_a_counter(prometheus) -> None:
    registry = CollectorRegistry()
    counter = Counter("panpriv_smoke_events", "Events counted by the smoke test.", registry=registry)
    counter.inc(42)
    port = free_loopback_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        prom = prometheus([f"127.0.0.1:{port}"], scrape_interval_s=0.5)
        value = prom.wait_for_value("panpriv_smoke_events_total", lambda v: v == 42.0)
        assert value == 42.0
        up = prom.query('up{job="panpriv"}')
        assert [float(sample["value"][1]) for sample in up] == [1.0]
    finally:
        server.shutdown()
        thread.join(timeout=5)
