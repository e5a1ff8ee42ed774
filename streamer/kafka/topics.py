"""The topics a role needs, created with the layout it needs, or refused with one line.

The distributed roles read some topics as one total order — the shuffler its messages, the
analyzer its shuffled batches, the coordinator the gradients — and read partition 0 only: a topic
with more partitions (a broker that auto-creates topics with several, as ``panpriv dev-broker``'s
Tansu does with 4 when a producer writes to a missing topic) would leave records where no role
reads them, and the deployment would stall without a word. So every role, before it reads or
writes, calls :func:`ensure_topics` with the topics it names:

* a missing topic is **created** with its :class:`TopicSpec` — the partition count, compaction
  for a topic whose newest record per key is its state (the model topics, the budget store) and a
  ``max.message.bytes`` that admits the largest record the role writes (a release of B·m share
  units); the replication factor is the cluster's, up to 3;
* an existing topic whose partition count the role cannot serve is **refused** with
  :class:`TopicLayoutError` (a configuration error, exit 2) naming the topic, its count, the count
  needed and how to fix it.

``panpriv topics create`` (:mod:`panpriv.streamer.commands.topics`) creates the same topics
beforehand, for operators who do not let applications create topics. A broker that does not
accept topic configurations gets the topic without them (logged).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from panpriv.streamer.errors import ConfigError

log = logging.getLogger("panpriv.kafka")

KAFKA_DEFAULT_MESSAGE_BYTES = 1_048_588
"""Kafka's default ``max.message.bytes``: a larger record needs the topic setting."""


class TopicLayoutError(ConfigError):
    """A topic exists with a partition count the role cannot serve."""


@dataclass(frozen=True)
class TopicSpec:
    """What a role needs of one topic.

    ``partitions``: the count it needs (``None``: any count, created with one); ``compacted``:
    ``cleanup.policy=compact`` when created; ``max_message_bytes``: the largest record it writes
    (set on creation when above Kafka's default); ``role`` and ``why``: for the refusal line.
    """

    name: str
    role: str
    why: str
    partitions: int | None = 1
    compacted: bool = False
    max_message_bytes: int | None = None

    def configs(self) -> dict[str, str]:
        configs = {"cleanup.policy": "compact"} if self.compacted else {}
        if self.max_message_bytes is not None and self.max_message_bytes > KAFKA_DEFAULT_MESSAGE_BYTES:
            configs["max.message.bytes"] = str(self.max_message_bytes + 64 * 1024)
        return configs


def ensure_topics(bootstrap: Sequence[str], specs: Iterable[TopicSpec]) -> None:
    """Create the missing topics of ``specs`` and check the others (module docstring)."""
    from panpriv.streamer.kafka import client as kafka_client

    specs = list(specs)
    probe = kafka_client.consumer(list(bootstrap), group_id=None, enable_auto_commit=False, client_id="panpriv-topics")
    try:
        existing = {spec.name: probe.partitions_for_topic(spec.name) for spec in specs}
        brokers = len(probe._client.cluster.brokers()) or 1  # noqa: SLF001 - kafka-python's metadata, as in identity.py
    finally:
        probe.close()
    for spec in specs:  # refuse before creating anything
        check_partitions(spec, len(existing[spec.name] or ()) or None)
    missing = [spec for spec in specs if not existing[spec.name]]
    if missing:
        create_topics(bootstrap, missing, brokers)
        probe = kafka_client.consumer(list(bootstrap), group_id=None, enable_auto_commit=False, client_id="panpriv-topics")
        try:
            existing.update({spec.name: probe.partitions_for_topic(spec.name) for spec in missing})
        finally:
            probe.close()
    for spec in specs:
        check_partitions(spec, len(existing[spec.name] or ()) or None)


def check_partitions(spec: TopicSpec, count: int | None) -> None:
    """Refuse ``count`` partitions of ``spec``'s topic if the role cannot serve them (``None``: not
    known yet, e.g. a topic just created whose metadata has not propagated: accepted)."""
    if count is None or spec.partitions is None or count == spec.partitions:
        return
    raise TopicLayoutError(
        f"topic {spec.name} has {count} partitions; the {spec.role} needs exactly {spec.partitions} ({spec.why}). "
        f"Delete it and let the {spec.role} create it, or create it with `panpriv topics create --bootstrap ... "
        f"{spec.name} --partitions {spec.partitions}{' --compact' if spec.compacted else ''}`, or name another topic"
    )


def create_topics(bootstrap: Sequence[str], specs: Iterable[TopicSpec], brokers: int | None = None) -> list[str]:
    """Create ``specs`` (those that exist already are left alone); the names created."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    from panpriv.streamer.kafka import client as kafka_client

    created = []
    admin = kafka_client.admin(list(bootstrap), client_id="panpriv-topics")
    try:
        if brokers is None:
            brokers = len(admin._client.cluster.brokers()) or 1  # noqa: SLF001 - kafka-python's metadata
        for spec in specs:
            topic = NewTopic(spec.name, num_partitions=spec.partitions or 1, replication_factor=min(3, brokers),
                             topic_configs=spec.configs())
            try:
                _create(admin, topic)
                created.append(spec.name)
                log.info("created topic %s (%d partition(s)%s)", spec.name, spec.partitions or 1,
                         "".join(f", {k}={v}" for k, v in spec.configs().items()))
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    return created


def _create(admin: Any, topic: Any) -> None:
    """Create ``topic``; without its configs if the broker refuses them (a development broker)."""
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    try:
        admin.create_topics([topic])
    except TopicAlreadyExistsError:
        raise
    except KafkaError as exc:
        if not topic.topic_configs:
            raise
        log.warning("the broker refused the settings %s of topic %s (%s); created without them", topic.topic_configs,
                    topic.name, type(exc).__name__)
        topic.topic_configs = {}
        admin.create_topics([topic])
