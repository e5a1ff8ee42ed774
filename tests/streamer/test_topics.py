"""Topics are the product's business (streamer/kafka/topics.py): the roles create the topics they
name with the layout they need, and refuse, with one line naming the topic and the count, a topic
whose partition count they cannot serve — on the real broker, whose producers auto-create topics
with 4 partitions (the stall issue 31 measured: the coordinator and the shuffler read partition 0
only)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from panpriv.streamer.esa.keys import generate
from panpriv.streamer.kafka.topics import TopicLayoutError, TopicSpec, ensure_topics
from tests.esa.parts import env
from tests.realparts import KafkaBroker

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def auto_created(broker: KafkaBroker, name: str) -> str:
    """A topic the broker creates when a producer writes to it (Tansu: 4 partitions)."""
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        producer.send(name, b"x").get(timeout=30)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        assert len(consumer.partitions_for_topic(name) or ()) > 1, "the broker no longer auto-creates several partitions"
    finally:
        consumer.close()
    return name


def partitions(broker: KafkaBroker, name: str) -> int:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    try:
        return len(consumer.partitions_for_topic(name) or ())
    finally:
        consumer.close()


def test_missing_topics_are_created_and_wrong_counts_refused(kafka_broker: KafkaBroker,
                                                             unique_name: Callable[[str], str]) -> None:
    ordered, compacted = unique_name("ordered"), unique_name("model")
    specs = [TopicSpec(ordered, "shuffler", "one order"), TopicSpec(compacted, "analyzer", "state", None, True)]
    ensure_topics([kafka_broker.bootstrap], specs)
    assert partitions(kafka_broker, ordered) == 1 and partitions(kafka_broker, compacted) == 1
    ensure_topics([kafka_broker.bootstrap], specs)  # existing, right layout: nothing to do
    wide = auto_created(kafka_broker, unique_name("wide"))
    with pytest.raises(TopicLayoutError) as refused:
        ensure_topics([kafka_broker.bootstrap], [TopicSpec(wide, "coordinator", "it reads one order")])
    line = str(refused.value)
    assert "\n" not in line and f"topic {wide} has 4 partitions" in line and "needs exactly 1" in line
    ensure_topics([kafka_broker.bootstrap], [TopicSpec(wide, "analyzer", "any count", partitions=None)])


def panpriv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "panpriv", *args], capture_output=True, text=True, env=env(), cwd=ROOT,
                          timeout=120)


def test_roles_refuse_a_topic_they_cannot_serve_with_one_line(kafka_broker: KafkaBroker,
                                                              unique_name: Callable[[str], str], tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap
    messages = auto_created(kafka_broker, unique_name("messages"))
    shuffler_key = generate(tmp_path / "keys", "shuffler").private
    shuffle = panpriv("shuffle", "--bootstrap", bootstrap, "--messages-topic", messages, "--shuffled-topic",
                      unique_name("shuffled"), "--batch-size", "4", "--params", "3", "--shuffler-key", str(shuffler_key))
    gradients = auto_created(kafka_broker, unique_name("gradients"))
    coordinate = panpriv("coordinate", "--bootstrap", bootstrap, "--gradients-topic", gradients, "--model-topic",
                         unique_name("model"), "--workers", "2", "--dim", "3", "--n", "1000")
    for result, topic in ((shuffle, messages), (coordinate, gradients)):
        lines = [line for line in result.stderr.splitlines() if "error" in line]
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"topic {topic} has 4 partitions" in lines[0] and "needs exactly 1" in lines[0]


def test_topics_create(kafka_broker: KafkaBroker, unique_name: Callable[[str], str]) -> None:
    a, b = unique_name("a"), unique_name("b")
    first = panpriv("topics", "create", "--bootstrap", kafka_broker.bootstrap, a, b, "--compact")
    assert first.returncode == 0, first.stderr
    assert f"{a}: created, 1 partition(s), compacted" in first.stdout and f"{b}: created" in first.stdout
    again = panpriv("topics", "create", "--bootstrap", kafka_broker.bootstrap, a, "--partitions", "3")
    assert again.returncode == 0 and f"{a}: exists, 1 partition(s)" in again.stdout
    assert partitions(kafka_broker, a) == 1
