"""Reading whole topics without a consumer group: the one loop that knows when it is caught up.

Every role that reads a topic from its beginning — a client or a worker following the newest
model, a coordinator resuming from its model topic, the budget store on its compacted topic,
``panpriv record`` copying topics — reads through :class:`TopicReader`: every partition assigned
directly (no group, nothing committed), each record handed to a callback in offset order per
partition, and :meth:`TopicReader.catch_up` returning once the reader is *caught up*.

**The caught-up rule.** Caught up means :data:`panpriv.streamer.kafka.calls.CAUGHT_UP_POLLS`
consecutive empty polls while every position is at or past the partition's end offset. One empty
poll at a reported end is not enough: some brokers (the Tansu test broker) report an end offset
below the last record, so a reader that stopped there would miss it — a model one version old, a
budget charge another process made.

:class:`NewestRecord` is the compacted-topic case: it keeps the record with the highest public
order (an E-S-A round, a scale-out version) among those a parser accepts, skipping malformed or
foreign records (counted by reason in :attr:`NewestRecord.skipped_by_reason`). An order outside
``[0, 2⁶³)`` (:data:`ORDER_LIMIT`) is skipped as ``order_out_of_range``: a round or version is a
count of steps, which the wire's 64-bit integers (Kafka's, and every JSON reader that is not
Python's) can hold; a 401-digit version once parsed and won as the newest model for ever after.

Only a consumer is needed (the caller builds it with its security settings): this module imports
nothing of the service beyond :mod:`panpriv.streamer.kafka.calls`, so the E-S-A client can use it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from panpriv.streamer.kafka import calls
from panpriv.streamer.kafka.calls import CAUGHT_UP_POLLS

T = TypeVar("T")


def partitions_of(consumer: Any, topics: Iterable[str]) -> list[Any]:
    """Every partition of ``topics`` the broker knows (partition 0 of a topic it does not know
    yet: a reader started before the topic exists still reads it once it is created with one)."""
    from kafka import TopicPartition

    found = []
    for topic in topics:
        ids = consumer.partitions_for_topic(topic) or {0}
        found += [TopicPartition(topic, p) for p in sorted(ids)]
    return found


class TopicReader:
    """Reads ``partitions`` from ``start`` (default: their first retained offsets), handing each
    record to ``on_record`` (module docstring).

    Parameters
    ----------
    consumer
        A group-less ``kafka.KafkaConsumer``; the reader assigns it and closes it in :meth:`close`.
    partitions
        ``TopicPartition``s to read (:func:`partitions_of`).
    on_record
        Called with every ``ConsumerRecord``, in offset order within a partition.
    start
        Partition → first offset to read (the others from their beginning).
    """

    def __init__(self, consumer: Any, partitions: list[Any], on_record: Callable[[Any], None],
                 start: Mapping[Any, int] | None = None) -> None:
        self.consumer = consumer
        self.partitions = list(partitions)
        self._on_record = on_record
        self._unknown = {tp.topic for tp in self.partitions if not consumer.partitions_for_topic(tp.topic)}
        self._next_lookup = 0.0
        consumer.assign(self.partitions)
        start = dict(start or {})
        rest = [tp for tp in self.partitions if tp not in start]
        if rest:
            consumer.seek_to_beginning(*rest)
        for tp, offset in start.items():
            consumer.seek(tp, offset)

    def poll(self, timeout_ms: int = 0) -> int:
        """Hand over what arrived within ``timeout_ms``; the number of records."""
        self._look_for_late_topics()
        count = 0
        for records in self.consumer.poll(timeout_ms=timeout_ms).values():
            for record in records:
                self._on_record(record)
                count += 1
        return count

    def at_end(self) -> bool:
        """Every position is at or past its partition's end offset (one bounded broker call). A
        partition the broker does not know (its topic is not created yet) has nothing to read; one
        that appeared since the reader started (a topic created with more partitions) is assigned
        from its beginning."""
        known = self._known_partitions()
        if not known:
            return True
        ends = calls.end_offsets(self.consumer, known)
        return all(self.consumer.position(tp) >= ends[tp] for tp in known)

    def _look_for_late_topics(self) -> None:
        """A topic the broker did not know when the reader started (a client started before the
        role that creates it): ask the broker again, at most once a second, until it exists; its
        partitions are then read from their beginning. (kafka-python refreshes the metadata of an
        assigned but unknown topic only every ``metadata_max_age_ms``, 5 minutes by default.)"""
        if not self._unknown or time.monotonic() < self._next_lookup:
            return
        self._next_lookup = time.monotonic() + 1.0
        self.consumer.topics()  # a metadata request to the broker
        self._known_partitions()
        self._unknown = {topic for topic in self._unknown if not self.consumer.partitions_for_topic(topic)}

    def _known_partitions(self) -> list[Any]:
        from kafka import TopicPartition

        known = []
        for topic in dict.fromkeys(tp.topic for tp in self.partitions):
            ids = self.consumer.partitions_for_topic(topic) or set()
            known += [TopicPartition(topic, p) for p in sorted(ids)]
        new = [tp for tp in known if tp not in self.partitions]
        if new:
            self.partitions += new
            self.consumer.assign(self.partitions)
            self.consumer.seek_to_beginning(*new)
        return known

    def catch_up(self, poll_ms: int = 10, stalled_after_s: float | None = None,
                 on_stall: Callable[[], Exception] | None = None) -> None:
        """Read until caught up (module docstring). With ``stalled_after_s``: raise ``on_stall()``
        (default :class:`TimeoutError`) when that long passes without a record while not at the end."""
        empty = 0
        progress = time.monotonic()
        while empty < CAUGHT_UP_POLLS:
            if self.poll(poll_ms):
                empty = 0
                progress = time.monotonic()
                continue
            if self.at_end():
                empty += 1
                continue
            empty = 0
            if stalled_after_s is not None and time.monotonic() - progress > stalled_after_s:
                raise (on_stall or _stalled)()

    def close(self) -> None:
        self.consumer.close(autocommit=False)


def _stalled() -> Exception:
    return TimeoutError("could not read the topic to its end: no record arrived while the broker reports more")


MALFORMED = (ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RecursionError)
"""What parsing a malformed JSON record may raise: bad bytes or JSON (``ValueError``), a missing
field, a field of another type (``TypeError``; ``AttributeError`` for a JSON array or number where
an object belongs), a number beyond an integer (``int(Infinity)``: ``OverflowError``) and nesting
deeper than the interpreter's recursion limit (``RecursionError``)."""


ORDER_LIMIT = 2**63
"""Orders (rounds, versions) must lie in ``[0, ORDER_LIMIT)`` (module docstring)."""

SKIP_REASONS = ("malformed", "order_out_of_range")
"""Why :class:`NewestRecord` skips a record."""


class NewestRecord(Generic[T]):
    """The newest record of a compacted topic by a public order, among the records ``parse``
    accepts (module docstring).

    Parameters
    ----------
    consumer, topic
        A group-less consumer (closed by :meth:`close`) and the topic, read from its beginning.
    parse
        Record value → the record, or ``None`` to skip it (another deployment's); raising
        ``ValueError`` or ``KeyError`` skips it as malformed.
    order
        The public order (round, version): a record replaces the newest if its order is at least
        as high (a republished record of the same order is the same record).
    """

    def __init__(self, consumer: Any, topic: str, parse: Callable[[bytes], T | None], order: Callable[[T], int]) -> None:
        self.topic = topic
        self.newest: T | None = None
        self.skipped_by_reason: Counter[str] = Counter({reason: 0 for reason in SKIP_REASONS})
        self._parse, self._order = parse, order
        self._reader = TopicReader(consumer, partitions_of(consumer, [topic]), self._take)

    def _take(self, record: Any) -> None:
        if record.value is None:
            return
        try:
            value = self._parse(record.value)
        except MALFORMED:
            self.skipped_by_reason["malformed"] += 1
            return
        if value is None:
            return
        order = self._order(value)
        if not 0 <= order < ORDER_LIMIT:
            self.skipped_by_reason["order_out_of_range"] += 1
            return
        if self.newest is None or order >= self._order(self.newest):
            self.newest = value

    @property
    def skipped(self) -> int:
        """Records skipped, for any reason."""
        return sum(self.skipped_by_reason.values())

    def poll(self, timeout_ms: int = 0) -> T | None:
        """Take what arrived within ``timeout_ms``; the newest record so far."""
        self._reader.poll(timeout_ms)
        return self.newest

    def current(self, timeout_s: float = 30.0) -> T | None:
        """The newest record once the topic is read to its end (the caught-up rule)."""
        self._reader.catch_up(poll_ms=50, stalled_after_s=timeout_s, on_stall=lambda: TimeoutError(
            f"could not read the topic {self.topic} to its end within {timeout_s:g} s"))
        return self.newest

    def wait_for(self, at_least: int, timeout_s: float = 60.0) -> T:
        """The newest record once its order is ≥ ``at_least``; ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.newest is None or self._order(self.newest) < at_least:
            if time.monotonic() > deadline:
                seen = "none" if self.newest is None else self._order(self.newest)
                raise TimeoutError(f"no record of order >= {at_least} on {self.topic} within {timeout_s:g} s "
                                   f"(newest: {seen})")
            self._reader.poll(100)
        return self.newest

    def close(self) -> None:
        self._reader.close()
