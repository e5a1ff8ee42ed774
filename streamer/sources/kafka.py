"""The Kafka source on kafka-python, and what both Kafka sources share.

Kafka specifics (exactly-once for the state that survives a crash; the full argument is in
:mod:`panpriv.streamer.runtime.processor`): a consumer group with auto-commit off; when partitions are assigned,
each is ``seek``-ed to the position in OUR checkpoint — or further, to the group's committed offset
or the partition's first retained offset when those are ahead; before partitions are revoked, the
``on_revoke`` hook (the processor's checkpoint) runs; :meth:`KafkaSource.acknowledge` commits
offsets only after a checkpoint holding them is durable (for lag monitoring, never read back as the
source of truth except as a lower bound). A message whose offset is below the key's position is
dropped, so a redelivery can never be learned twice.
"""

from __future__ import annotations

import abc
import bisect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from panpriv.streamer.config import SourceConfig
from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.source_url import KafkaUrl
from panpriv.streamer.kafka import calls as kafka_calls
from panpriv.streamer.kafka import client as kafka_client
from panpriv.streamer.kafka.calls import CAUGHT_UP_POLLS
from panpriv.streamer.sources.base import Batch, FatalSourceError

log = logging.getLogger("panpriv.sources")

REBALANCE_TIMEOUT_MS = 30_000
"""kafka-python's ``max_poll_interval_ms`` (and confluent-kafka's ``max.poll.interval.ms``), which
is also the rebalance timeout it sends with a group join: how long the group waits for a member to
rejoin. Its default (5 minutes) made a process stopped during a join hold the group that long
(issue 15). The processing loop polls every few seconds at most (a micro-batch, a checkpoint),
far within 30 s; a reader that waits without reading calls :meth:`KafkaConsumerSource.keep_alive`."""

SOURCE_FETCH_WAIT_MS = 500
"""The stream source's ``fetch_max_wait_ms``: kafka-python's default, not the roles' short wait
(:data:`panpriv.streamer.kafka.client.FETCH_WAIT_MS`). A source is read for throughput — while
records flow, a fetch is answered as soon as there are some — and an idle source then asks the
broker twice a second instead of about a hundred times."""

ASSIGNMENT_LOG_EVERY_S = 10.0
"""While no partition is assigned, say so this often (a silent wait looks like a hang)."""

DRAIN_FACTOR = 16
"""kafka-python is polled for up to this many micro-batches of messages at a time, which the
source then hands out one micro-batch per :meth:`KafkaSource.poll` (issue 37). kafka-python sends
the next fetch request only when no request to the broker is pending, and leaves out a partition
whose last response is not fully consumed; with idle partitions on the topic that request holds
only the idle ones and waits ``fetch_max_wait_ms`` (500 ms) at the broker while the busy partition
runs dry — a 4-partition topic with one busy partition read at 5,400 records/s where kafka-python
plus orjson read 61,000 (66,000 with the drain; docs/benchmarks.md, "Kafka ingest"). A poll that
drains the whole response lets the next request include the busy partition.
16 micro-batches of 1024 messages cover a default fetch (``max_partition_fetch_bytes`` = 1 MiB)
of messages down to 64 bytes; the records held are those of the response being consumed, which
kafka-python held whole before (docs/privacy.md, "The input path")."""

DRAIN_MAX_AGE_S = REBALANCE_TIMEOUT_MS / 3000
"""A drain is dropped and fetched again (the client sought back to the positions) if the consumer
was last polled longer ago than this (10 s), so that kafka-python is polled at least this often
while the reader reads: a reader slower than the drain — ``--rate``, a scale-out worker paced —
handed out 16 micro-batches for longer than
:data:`REBALANCE_TIMEOUT_MS`, the consumer was taken out of its group, and its commits failed
while the group rebalanced (a scale-out worker's partitions were then read and published again
by another)."""


class Fetched(NamedTuple):
    """One partition's messages of one poll, in offset order, as parallel lists (a tuple per
    message cost more than the rest of the source's work)."""

    key: str
    offsets: list[int]
    values: list[bytes]
    timestamps: list[int]

    def split(self, n: int) -> tuple[Fetched, Fetched]:
        """The first ``n`` messages, and the rest."""
        return (Fetched(self.key, self.offsets[:n], self.values[:n], self.timestamps[:n]),
                Fetched(self.key, self.offsets[n:], self.values[n:], self.timestamps[n:]))


# -- Kafka --------------------------------------------------------------------------------------


class KafkaConsumerSource(abc.ABC):
    """What the two Kafka consumer sources share (:class:`KafkaSource` on kafka-python,
    :class:`panpriv.streamer.sources.confluent.ConfluentKafkaSource` on librdkafka): the offset-regression
    marks and their verdicts, the deferred rebalance failure, the wait for an assignment and the
    end-of-topic rule. Subclasses call this constructor, then open their consumer and set
    ``_assigned`` (the client's own collection of assigned partitions)."""

    _assigned: Any

    def __init__(
        self,
        url: KafkaUrl,
        config: SourceConfig,
        positions: Mapping[str, int],
        on_revoke: Callable[[], None] | None,
        marks: Mapping[str, int] | None,
    ) -> None:
        self.url = url
        self.name = url.display()
        self._config = config
        self._positions: dict[str, int] = {k: int(v) for k, v in positions.items()}
        # key -> (position, timestamp of the record at position - 1): kafka_calls' regression check
        self._marks: dict[str, tuple[int, int]] = {k: (self._positions[k], int(t)) for k, t in (marks or {}).items() if k in self._positions}
        self._on_revoke = on_revoke
        self._failure: BaseException | None = None
        self._empty_polls = 0
        self._polled_at: float | None = None  # when (time.monotonic) the consumer was last polled; None: never (no group yet)
        self._waiting_since = self._waiting_logged = time.monotonic()  # "waiting for an assignment" log line

    @property
    def heartbeat_interval_ms(self) -> int:
        """The consumer's heartbeat interval: a quarter of its session timeout, at least 100 ms."""
        return max(100, self._config.session_timeout_ms // 4)

    def keep_alive(self) -> None:
        """Poll the consumer with every assigned partition paused if it was last polled a heartbeat
        interval ago or more (the reader waits without reading): no record is handed out and no
        position moves, and the consumer stays in its group. Without it a scale-out worker waiting
        for the next model version past :data:`REBALANCE_TIMEOUT_MS` (a coordinator down for 40 s)
        was taken out of its group; at its next poll the commit of its revocation failed and every
        waiting worker stopped (both clients). The poll is the client's own: a rebalance in it runs
        ``on_revoke`` and the new assignment as in :meth:`poll` (a step of the group protocol per
        call, so the interval is the heartbeat's, well within the session timeout), and their
        failure is raised here. A consumer never polled is in no group yet: nothing to keep."""
        if self._polled_at is None or time.monotonic() - self._polled_at < self.heartbeat_interval_ms / 1000:
            return
        self._poll_paused()
        self._polled_at = time.monotonic()
        self._raise_failure()
        self._log_waiting()

    @abc.abstractmethod
    def _poll_paused(self) -> None:
        """Poll the consumer once, without waiting, with its assigned partitions paused, and resume
        them; a partition assigned in that poll is not paused: a message of it returned anyway is
        sought back to, so that its position stays where the assignment put it."""

    def marks(self, positions: Mapping[str, int]) -> dict[str, int]:
        """The timestamps of the last records before ``positions`` (for the checkpoint)."""
        return {key: ts for key, (position, ts) in self._marks.items() if positions.get(key) == position}

    def _replaced_partitions(self, changed: Mapping[Any, Any]) -> set[str]:
        """The verdict on partitions whose record before our position changed
        (:func:`kafka_calls.changed_partitions`): refuse, or with ``accept_offset_reset`` return
        their keys to be read anew from their beginning."""
        reset = set()
        for tp, found in changed.items():
            key = f"{tp.topic}/{tp.partition}"
            if not self._config.accept_offset_reset:
                raise kafka_calls.replaced(key, self._positions[key], found)
            log.warning("partition %s no longer holds the records before offset %d; reading it from its beginning "
                        "(accept_offset_reset)", key, self._positions[key])
            self._marks.pop(key, None)
            reset.add(key)
        return reset

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            if isinstance(failure, kafka_calls.OffsetRegressionError):
                raise failure
            raise FatalSourceError(f"Kafka rebalance failed: {failure!r}") from failure

    def _log_waiting(self) -> None:
        """Log every :data:`ASSIGNMENT_LOG_EVERY_S` while the group has assigned us nothing."""
        now = time.monotonic()
        if self._assigned:
            self._waiting_since = self._waiting_logged = now
        elif now - self._waiting_logged >= ASSIGNMENT_LOG_EVERY_S:
            log.info("no partition assigned yet by consumer group %r after %.0f s; waiting (another member may be "
                     "holding the group until its session or rebalance timeout)", self.url.group, now - self._waiting_since)
            self._waiting_logged = now

    def _offset_reset(self, key: str, position: int, offset: int) -> int:
        """A record below our position: refuse (:mod:`panpriv.streamer.kafka.calls`), or with
        ``accept_offset_reset`` continue from ``offset``."""
        if not self._config.accept_offset_reset:
            raise kafka_calls.regression(key, position, offset)
        log.warning("partition %s was reset from offset %d to %d; reading on from there (accept_offset_reset)", key, position, offset)
        return offset

    def _batch(self, fetched: Iterable[Fetched]) -> Batch | None:
        """The batch of one poll, from each partition's messages in offset order (:class:`Fetched`):
        records below our position are dropped (a redelivery is never learned twice), a partition
        reset below it is refused or accepted (:meth:`_offset_reset`), and positions and marks
        advance. ``None`` when nothing new arrived; with ``stop_at_end``, empty polls count towards
        :attr:`exhausted` only while every partition is caught up."""
        batch = Batch({})
        for key, offsets, values, stamps in fetched:
            first = offsets[0]
            start = self._positions.get(key, first)
            if first < start:  # the broker reset the consumer below our position
                start = self._offset_reset(key, start, first)
            fresh = bisect.bisect_left(offsets, start)  # offsets ascend within a partition
            if fresh == len(offsets):
                continue
            batch.payloads += values[fresh:]
            batch.keys += [key] * (len(offsets) - fresh)
            batch.positions += offsets[fresh:]
            batch.timestamps += stamps[fresh:]
            stop = offsets[-1] + 1
            batch.ranges[key] = (start, stop)
            self._positions[key] = stop
            self._marks[key] = (stop, stamps[-1])
        if not batch.ranges:
            if self._config.stop_at_end:
                self._empty_polls = self._empty_polls + 1 if self._check_caught_up() else 0
            return None
        self._empty_polls = 0
        return batch

    def rewind(self, starts: Mapping[str, int], seek: bool = True) -> None:
        """Read the partitions of ``starts`` (keys ``topic/partition``) again from those offsets:
        a scale-out worker hands back a batch it will not publish (its records return to the
        stream, :mod:`panpriv.streamer.scaleout.worker`). Nothing is committed by this. With
        ``seek=False`` (inside a revocation, where the client must not be sought) only the
        positions move: the next assignment starts there (or at the group's committed offset,
        if further)."""
        for key, offset in starts.items():
            self._positions[key] = offset
            self._marks.pop(key, None)
        if seek:
            self._seek({key: offset for key, offset in starts.items() if key in self._assigned_keys()})

    def _assigned_keys(self) -> set[str]:
        """The ``topic/partition`` keys assigned now."""
        return {f"{tp.topic}/{tp.partition}" for tp in self._assigned}

    @abc.abstractmethod
    def _seek(self, offsets: Mapping[str, int]) -> None:
        """Seek the client's assigned partitions to ``offsets`` (keys ``topic/partition``)."""

    @abc.abstractmethod
    def _check_caught_up(self) -> bool:
        """Whether every partition of the consumed topics is read to its end (ours or the group's)."""

    @property
    def exhausted(self) -> bool:
        return self._empty_polls >= CAUGHT_UP_POLLS


class KafkaSource(KafkaConsumerSource):
    """A kafka-python consumer group whose positions come from our checkpoint (module docstring)."""

    client = "kafka-python"

    def __init__(
        self,
        url: KafkaUrl,
        config: SourceConfig,
        positions: Mapping[str, int],
        on_revoke: Callable[[], None] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> None:
        from kafka import ConsumerRebalanceListener
        from kafka.errors import KafkaError

        super().__init__(url, config, positions, on_revoke, marks)
        self._assigned: set = set()
        self._drained: list[Fetched] = []  # polled from the consumer, not yet handed out (DRAIN_FACTOR)
        source = self

        class Listener(ConsumerRebalanceListener):  # kafka-python requires a subclass
            def on_partitions_revoked(self, revoked):  # noqa: ANN001 - kafka-python's signature
                source._revoked(revoked)

            def on_partitions_assigned(self, assigned):  # noqa: ANN001
                source._assigned_partitions(assigned)

        try:
            self._consumer = kafka_client.consumer(
                url.bootstrap,
                group_id=url.group,
                client_id="panpriv",
                enable_auto_commit=False,
                auto_offset_reset=config.start,
                session_timeout_ms=config.session_timeout_ms,
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                max_poll_records=config.batch_records,
                max_poll_interval_ms=max(REBALANCE_TIMEOUT_MS, config.session_timeout_ms),
                fetch_max_wait_ms=SOURCE_FETCH_WAIT_MS,
            )
        except KafkaError as exc:
            raise SourceError(f"cannot connect to Kafka at {kafka_client.describe(url.bootstrap)}: {exc}") from None
        self._consumer.subscribe(topics=url.topics, listener=Listener())

    def cluster_identity(self) -> str:
        """The cluster part of this topic's data keys (:mod:`panpriv.streamer.sources.identity`): the broker's
        cluster id (asked for through a metadata request), else the bootstrap servers."""
        from kafka.errors import KafkaError

        from panpriv.streamer.sources.identity import kafka_cluster_identity

        try:
            for topic in self.url.topics:
                self._consumer.partitions_for_topic(topic)
        except KafkaError as exc:
            raise SourceError(f"cannot read metadata from Kafka at {','.join(self.url.bootstrap)}: {exc}") from None
        return kafka_cluster_identity(self._consumer, self.url.bootstrap)

    # The rebalance callbacks run inside ``poll``; kafka-python logs and swallows their exceptions,
    # so a failure is stored and raised from ``poll`` as fatal.

    def _revoked(self, revoked: object) -> None:
        try:
            if revoked and self._on_revoke is not None:
                self._on_revoke()  # checkpoint first: the next owner starts from our committed offsets
        except BaseException as exc:  # noqa: BLE001 - re-raised from poll()
            self._failure = exc
        self._assigned = set()
        self._drained = []  # records of partitions that may now be another member's

    def _assigned_partitions(self, assigned: object) -> None:
        self._drained = []
        try:
            partitions = list(assigned)  # type: ignore[call-overload]
            self._assigned = set(partitions)
            if not partitions:
                return
            consumer = self._consumer
            beginning = kafka_calls.beginning_offsets(consumer, partitions)
            end = kafka_calls.end_offsets(consumer, partitions) if self._config.start == "latest" else {}
            reset = self._verify_marks(partitions, beginning)
            for tp in partitions:
                key = f"{tp.topic}/{tp.partition}"
                committed = kafka_calls.committed(consumer, tp)
                ours = self._positions.get(key)
                if key in reset:  # accepted offset reset: the partition is a new log, read it from its start
                    target = beginning[tp]
                elif ours is None and committed is None:
                    target = end.get(tp, beginning[tp])
                else:
                    # Never go back: below our position would learn records twice; below the
                    # group's committed offset would re-learn records another process has
                    # durably consumed; below the first retained offset there is nothing.
                    target = max(ours or 0, committed or 0, beginning[tp])
                consumer.seek(tp, target)
                self._positions[key] = target
            log.info("assigned %d partition(s); resuming at the checkpointed positions", len(partitions))
        except BaseException as exc:  # noqa: BLE001 - re-raised from poll()
            self._failure = exc

    def _verify_marks(self, partitions: list, beginning: Mapping) -> set[str]:
        """Check that the record before each resumed position is still the one we learned last
        (:func:`kafka_calls.changed_partitions`); refuse, or return the keys to read anew."""
        wanted = {
            tp: mark for tp in partitions
            if (mark := self._marks.get(f"{tp.topic}/{tp.partition}")) is not None
            and mark[0] == self._positions.get(f"{tp.topic}/{tp.partition}") and mark[0] - 1 >= beginning[tp]
        }
        return self._replaced_partitions(kafka_calls.changed_partitions(self.url.bootstrap, wanted))

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        """Up to ``max_records`` messages from what the last consumer poll drained
        (:data:`DRAIN_FACTOR`); the consumer is polled again only once that is handed out."""
        if self._drained and time.monotonic() - (self._polled_at or 0.0) > DRAIN_MAX_AGE_S:
            self._seek({})  # the drained messages are fetched again
        if not self._drained:
            records = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records * DRAIN_FACTOR)
            self._polled_at = time.monotonic()
            self._raise_failure()
            self._log_waiting()
            self._drained = [
                Fetched(f"{tp.topic}/{tp.partition}", [m.offset for m in messages],
                        [m.value if m.value is not None else b"" for m in messages], [m.timestamp for m in messages])
                for tp, messages in records.items() if messages
            ]
        return self._batch(self._take(max_records))

    def _poll_paused(self) -> None:
        """kafka-python ignores what it fetched of a paused partition (its position stays); what was
        drained and not handed out stays drained."""
        consumer = self._consumer
        consumer.pause(*consumer.assignment())
        try:
            records = consumer.poll(timeout_ms=0, max_records=1)
        finally:
            consumer.resume(*consumer.paused())
        for tp, messages in records.items():
            if messages:  # a partition assigned in this poll
                consumer.seek(tp, messages[0].offset)

    def _seek(self, offsets: Mapping[str, int]) -> None:
        """Seek, and drop what was drained but not handed out: a drained partition not sought is
        sought back to its position, so that its drained messages are fetched again."""
        from kafka import TopicPartition

        offsets = {**{part.key: self._positions[part.key] for part in self._drained}, **offsets}
        self._drained = []
        for key, offset in offsets.items():
            topic, partition = key.rsplit("/", 1)
            self._consumer.seek(TopicPartition(topic, int(partition)), offset)

    def _take(self, max_records: int) -> list[Fetched]:
        """The first ``max_records`` messages of :attr:`_drained`, removed from it."""
        taken: list[Fetched] = []
        while self._drained and max_records > 0:
            part = self._drained[0]
            if len(part.offsets) <= max_records:
                taken.append(self._drained.pop(0))
            else:
                head, self._drained[0] = part.split(max_records)
                taken.append(head)
            max_records -= len(taken[-1].offsets)
        return taken

    def _check_caught_up(self) -> bool:
        """Every partition of the topics consumed (ours or the group's), not only the assigned ones."""
        from kafka.errors import KafkaError

        if not self._assigned:
            return False
        try:
            return kafka_calls.topic_caught_up(self._consumer, self.url.topics, self._positions, self._assigned)
        except KafkaError as exc:
            log.debug("caught-up check failed (%s); polling on", type(exc).__name__)
            return False

    def total_positions(self) -> int | None:
        if not self._assigned:
            return None
        end = kafka_calls.end_offsets(self._consumer, self._assigned)
        return sum(end.values())

    def count_records(self) -> None:
        return None

    def acknowledge(self, positions: Mapping[str, int], strict: bool = False) -> None:
        """Commit ``positions`` of the assigned partitions to the group.

        After a checkpoint (``strict=False``) the commit is for monitoring and as the next owner's
        lower bound; a failure is logged and retried at the next checkpoint. Before a revocation
        (``strict=True``) the next owner will start from it, so a failure raises
        :class:`FatalSourceError`.
        """
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        offsets = {
            tp: OffsetAndMetadata(positions[key], "", -1)
            for tp in self._assigned
            if (key := f"{tp.topic}/{tp.partition}") in positions
        }
        if not offsets:
            return
        try:
            kafka_calls.commit(self._consumer, offsets)
        except KafkaError as exc:
            if strict:
                raise FatalSourceError(f"offset commit before a revocation failed: {type(exc).__name__}") from exc
            log.warning("offset commit failed (%s); offsets are committed again after the next checkpoint", type(exc).__name__)

    def lag(self) -> dict[str, int] | None:
        """Records between our position and the partition's high watermark, per assigned partition.

        The high watermark comes with every fetch response (``KafkaConsumer.highwater``), so this
        sends no request: it is as fresh as the last fetch, which the consumer repeats while it
        consumes or waits. Only a partition not fetched yet (just assigned) costs one
        ``end_offsets`` request; if that fails the lag is unknown this time (``None``).
        """
        from kafka.errors import KafkaError

        if not self._assigned:
            return {}
        ends = {tp: self._consumer.highwater(tp) for tp in self._assigned}
        unfetched = [tp for tp, end in ends.items() if end is None]
        if unfetched:
            try:
                ends.update(kafka_calls.end_offsets(self._consumer, unfetched))
            except KafkaError as exc:
                log.debug("lag unknown: end_offsets failed (%s)", type(exc).__name__)
                return None
        lags = {}
        for tp, end in ends.items():
            key = f"{tp.topic}/{tp.partition}"
            lags[key] = max(0, end - self._positions.get(key, 0))
        return lags

    def close(self) -> None:
        kafka_calls.close(self._consumer)


