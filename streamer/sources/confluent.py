"""The Kafka source on confluent-kafka (librdkafka), selected by ``[kafka] client = "confluent"``.

Same contract and the same exactly-once argument as :class:`panpriv.streamer.sources.kafka.KafkaSource` (read
that module's docstring): a consumer group with auto-commit off; on assignment each partition
starts at our checkpointed position, or further at the group's committed offset or the first
retained offset, never back; before a revocation the processor's checkpoint runs and commits;
offsets are committed only after a durable checkpoint; a message below our position is refused
(or, with ``accept_offset_reset``, read on). What differs is the client:

- librdkafka fetches in its own threads and has no Python-side CRC check, so consuming costs
  less Python time (docs/benchmarks.md, "Kafka ingest", measures both clients side by side);
- the start position is given by ``assign`` with offsets inside the ``on_assign`` callback
  (librdkafka's way to seek an assignment), and the callbacks run inside ``consume``;
- every broker call takes an explicit timeout (:data:`panpriv.streamer.kafka.calls.CALL_TIMEOUT_MS`), so
  the loop stays bounded as with kafka-python;
- the check that a resumed partition still holds the record we learned last
  (:func:`panpriv.streamer.kafka.calls.changed_partitions`) uses a short-lived kafka-python consumer,
  and the producers (dead letters, snapshots, budget topic) stay on kafka-python.

Security settings are translated from ``[kafka]`` to librdkafka's property names
(:func:`librdkafka_settings`); ``[kafka] librdkafka`` adds any other librdkafka property.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from panpriv.streamer.config import KafkaConfig, SourceConfig
from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.source_url import KafkaUrl
from panpriv.streamer.kafka import calls as kafka_calls
from panpriv.streamer.kafka import client as kafka_client
from panpriv.streamer.sources.base import Batch, FatalSourceError
from panpriv.streamer.sources.kafka import REBALANCE_TIMEOUT_MS, Fetched, KafkaConsumerSource

log = logging.getLogger("panpriv.sources")

TIMEOUT_S = kafka_calls.CALL_TIMEOUT_MS / 1000


def librdkafka_settings(config: KafkaConfig) -> dict[str, Any]:
    """librdkafka's properties for the ``[kafka]`` security settings (holds the password)."""
    settings: dict[str, Any] = {"security.protocol": config.security_protocol.lower()}
    if config.security_protocol.endswith("SSL"):
        settings["ssl.endpoint.identification.algorithm"] = "https" if config.ssl_check_hostname else "none"
        for field, name in (("ssl_cafile", "ssl.ca.location"), ("ssl_certfile", "ssl.certificate.location"),
                            ("ssl_keyfile", "ssl.key.location")):
            if (path := getattr(config, field)) is not None:
                settings[name] = str(path)
        if config.ssl_password is not None:
            settings["ssl.key.password"] = config.ssl_password.get_secret_value()
    if config.security_protocol.startswith("SASL_"):
        settings.update({"sasl.mechanism": config.sasl_mechanism, "sasl.username": config.sasl_username,
                         "sasl.password": config.password()})
    return {**config.librdkafka, **settings}


class ConfluentKafkaSource(KafkaConsumerSource):
    """A confluent-kafka consumer group whose positions come from our checkpoint (module docstring)."""

    client = "confluent-kafka"

    def __init__(
        self,
        url: KafkaUrl,
        config: SourceConfig,
        positions: Mapping[str, int],
        on_revoke: Callable[[], None] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, KafkaException

        super().__init__(url, config, positions, on_revoke, marks)
        self._assigned: list[Any] = []
        kafka_client.preflight(url.bootstrap)  # a wrong protocol or login stops here with its name
        try:
            self._consumer = Consumer({
                "bootstrap.servers": ",".join(url.bootstrap),
                "group.id": url.group,
                "client.id": "panpriv",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": config.start,
                "session.timeout.ms": config.session_timeout_ms,
                "heartbeat.interval.ms": self.heartbeat_interval_ms,
                "max.poll.interval.ms": max(REBALANCE_TIMEOUT_MS, config.session_timeout_ms),
                "enable.partition.eof": False,
                **librdkafka_settings(kafka_client.settings()),
            }, logger=logging.getLogger("kafka.librdkafka"))
        except KafkaException as exc:
            raise SourceError(f"cannot create a Kafka consumer for {kafka_client.describe(url.bootstrap)}: {exc}") from None
        self._consumer.subscribe(list(url.topics), on_assign=self._on_assign, on_revoke=self._on_revoked)

    def cluster_identity(self) -> str:
        """``cluster=<id>`` from the broker's metadata, else the bootstrap servers."""
        from confluent_kafka import KafkaException

        from panpriv.streamer.sources.identity import bootstrap_identity

        try:
            metadata = self._consumer.list_topics(timeout=TIMEOUT_S * 5)
        except KafkaException as exc:
            raise SourceError(f"cannot read metadata from Kafka at {','.join(self.url.bootstrap)}: {exc}") from None
        return f"cluster={metadata.cluster_id}" if metadata.cluster_id else bootstrap_identity(self.url.bootstrap)

    # -- rebalance callbacks (run inside consume; a failure is raised from poll) ------------------

    def _on_revoked(self, consumer: Any, partitions: list[Any]) -> None:
        try:
            if partitions and self._on_revoke is not None:
                self._on_revoke()  # checkpoint and commit first: the next owner starts from there
        except BaseException as exc:  # noqa: BLE001 - re-raised from poll()
            self._failure = exc
        self._assigned = []
        consumer.unassign()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import TopicPartition

        try:
            keys = [f"{tp.topic}/{tp.partition}" for tp in partitions]
            committed = {f"{tp.topic}/{tp.partition}": tp.offset for tp in consumer.committed(partitions, timeout=TIMEOUT_S)}
            low_high = {key: consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S) for key, tp in zip(keys, partitions, strict=True)}
            reset = self._verify_marks(partitions, {key: low for key, (low, _) in low_high.items()})
            placed = []
            for key, tp in zip(keys, partitions, strict=True):
                low, high = low_high[key]
                ours = self._positions.get(key)
                theirs = committed[key] if committed[key] >= 0 else None
                if key in reset:
                    target = low
                elif ours is None and theirs is None:
                    target = high if self._config.start == "latest" else low
                else:
                    target = max(ours or 0, theirs or 0, low)
                self._positions[key] = target
                placed.append(TopicPartition(tp.topic, tp.partition, target))
            consumer.assign(placed)
            consumer.resume(placed)  # librdkafka keeps a partition's pause across unassign and assign (keep_alive)
            self._assigned = placed
            log.info("assigned %d partition(s); resuming at the checkpointed positions", len(placed))
        except BaseException as exc:  # noqa: BLE001 - re-raised from poll()
            self._failure = exc

    def _verify_marks(self, partitions: list[Any], beginning: Mapping[str, int]) -> set[str]:
        """As :meth:`panpriv.streamer.sources.kafka.KafkaSource._verify_marks` (the check uses kafka-python)."""
        from kafka import TopicPartition

        wanted = {}
        for tp in partitions:
            key = f"{tp.topic}/{tp.partition}"
            mark = self._marks.get(key)
            if mark is not None and mark[0] == self._positions.get(key) and mark[0] - 1 >= beginning[key]:
                wanted[TopicPartition(tp.topic, tp.partition)] = mark
        return self._replaced_partitions(kafka_calls.changed_partitions(self.url.bootstrap, wanted))

    # -- consuming --------------------------------------------------------------------------------

    def _consume(self, max_records: int, timeout_s: float) -> list[Any]:
        """Up to ``max_records`` messages: what is queued now, without waiting; if nothing is, the
        first message within ``timeout_s`` and what is queued with it. ``consume(num_messages=n,
        timeout=t)`` alone waits until n messages are queued or t has passed: with large messages
        (binary batches) a micro-batch filled more slowly than fetches arrived, and each poll
        waited its timeout (issue 37)."""
        messages: list[Any] = self._consumer.consume(num_messages=max_records, timeout=0)
        if messages:
            return messages
        first: list[Any] = self._consumer.consume(num_messages=1, timeout=timeout_s)
        if first and max_records > 1:
            return first + self._consumer.consume(num_messages=max_records - 1, timeout=0)
        return first

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        messages = self._consume(max_records, timeout_s)
        self._polled_at = time.monotonic()
        self._raise_failure()
        self._log_waiting()
        if any([message.error() is not None for message in messages]):
            messages = self._without_errors(messages)
        where = [(message.topic(), message.partition()) for message in messages]
        if len(set(where)) <= 1:  # the common poll: one partition, read with list comprehensions
            return self._batch([Fetched(f"{where[0][0]}/{where[0][1]}", [m.offset() for m in messages],
                                        [m.value() or b"" for m in messages], [m.timestamp()[1] for m in messages])]
                               if messages else [])
        by_key: dict[tuple[Any, Any], Fetched] = {}
        for message, key in zip(messages, where, strict=True):
            part = by_key.get(key)
            if part is None:
                part = by_key[key] = Fetched(f"{key[0]}/{key[1]}", [], [], [])
            part.offsets.append(message.offset())
            part.values.append(message.value() or b"")
            part.timestamps.append(message.timestamp()[1])
        return self._batch(by_key.values())

    def _poll_paused(self) -> None:
        """librdkafka's ``max.poll.interval.ms`` counts from the last ``consume``: one that serves
        the callbacks (a rebalance) and returns no record of a paused partition; a message
        returned anyway is sought back to. A partition paused here and revoked in that consume
        keeps its pause in librdkafka: :meth:`_on_assign` resumes what it assigns (without it a
        partition re-assigned at a later poll was never read again: 1 run in 7 of the rebalance
        test)."""
        consumer = self._consumer
        if self._assigned:
            consumer.pause(self._assigned)
        try:
            messages = consumer.consume(num_messages=1, timeout=0)  # one message at most: its offset is its position
        finally:
            if self._assigned:
                consumer.resume(self._assigned)
        self._seek({f"{m.topic()}/{m.partition()}": m.offset() for m in self._without_errors(messages)})

    @staticmethod
    def _without_errors(messages: list[Any]) -> list[Any]:
        """``messages`` without the error events among them (logged; a fatal one raises)."""
        kept = []
        for message in messages:
            error = message.error()
            if error is None:
                kept.append(message)
            elif error.fatal():
                raise FatalSourceError(f"Kafka consumer failed: {error.str()}")
            else:
                log.warning("Kafka consumer: %s", error.str())
        return kept

    def _seek(self, offsets: Mapping[str, int]) -> None:
        """Seek assigned partitions (librdkafka drops what it fetched of them beyond)."""
        from confluent_kafka import TopicPartition

        for key, offset in offsets.items():
            topic, partition = key.rsplit("/", 1)
            self._consumer.seek(TopicPartition(topic, int(partition), offset))

    def _check_caught_up(self) -> bool:
        """Every partition of the topics consumed: ours by our positions, the others by the group's commits."""
        from confluent_kafka import KafkaException, TopicPartition

        if not self._assigned:
            return False
        try:
            metadata = self._consumer.list_topics(timeout=TIMEOUT_S)
            partitions = []
            for topic in self.url.topics:
                described = metadata.topics.get(topic)
                if described is None or not described.partitions:
                    return False
                partitions += [TopicPartition(topic, p) for p in described.partitions]
            ours = {f"{tp.topic}/{tp.partition}" for tp in self._assigned}
            others = [tp for tp in partitions if f"{tp.topic}/{tp.partition}" not in ours]
            committed = {f"{tp.topic}/{tp.partition}": tp.offset for tp in self._consumer.committed(others, timeout=TIMEOUT_S)} if others else {}
            for tp in partitions:
                key = f"{tp.topic}/{tp.partition}"
                low, high = self._consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)
                done = self._positions.get(key, 0) if key in ours else max(committed.get(key, -1), low)
                if done < high:
                    return False
            return True
        except KafkaException as exc:
            log.debug("caught-up check failed (%s); polling on", exc)
            return False

    def total_positions(self) -> int | None:
        if not self._assigned:
            return None
        return sum(self._consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)[1] for tp in self._assigned)

    def count_records(self) -> None:
        return None

    def acknowledge(self, positions: Mapping[str, int], strict: bool = False) -> None:
        """Commit ``positions`` of the assigned partitions (as :meth:`KafkaSource.acknowledge`)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = [TopicPartition(tp.topic, tp.partition, positions[key]) for tp in self._assigned
                   if (key := f"{tp.topic}/{tp.partition}") in positions]
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            if strict:
                raise FatalSourceError(f"offset commit before a revocation failed: {exc}") from exc
            log.warning("offset commit failed (%s); offsets are committed again after the next checkpoint", exc)

    def lag(self) -> dict[str, int] | None:
        """Records between our position and the high watermark, per assigned partition (the
        watermark cached from the last fetch; one bounded request for a partition not fetched yet)."""
        from confluent_kafka import KafkaException

        lags = {}
        for tp in self._assigned:
            key = f"{tp.topic}/{tp.partition}"
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                try:
                    _, high = self._consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)
                except KafkaException as exc:
                    log.debug("lag unknown: watermark request failed (%s)", exc)
                    return None
            lags[key] = max(0, high - self._positions.get(key, 0))
        return lags

    def close(self) -> None:
        # librdkafka revokes the assignment while leaving the group; the processor's revocation
        # checkpoint must not run then (the run has taken its final checkpoint, or has stopped
        # without one on purpose, e.g. panpriv.streamer.runtime.reject_guard).
        self._on_revoke = None
        self._consumer.close()
