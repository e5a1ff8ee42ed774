"""Sources: where records come from, resumable from a position.

One contract (after bytewax's sources): a source is *built from a resume position* (the next
unread position of every source key, as saved in a checkpoint), *yields micro-batches*
(:meth:`Source.poll`), and *reports the position of the next unread record*
(:attr:`Batch.ranges` of each batch, ending where the next batch begins).

A *source key* names an independent, ordered sequence of positions, and a record is identified by
``(key, position)`` in the privacy ledger:

================================  =================================  ================================
URL                               key                                position
================================  =================================  ================================
``kafka://h:p/topic[,t2]?group=g``  ``topic/partition``               Kafka offset
``file:PATH`` (a recording)       the recorded ``topic/partition``   the recorded Kafka offset
``file:PATH`` (JSONL, CSV)        ``file:<absolute path>``           line index (0-based)
``adult:train`` / ``adult:test``  ``adult:train`` / ``adult:test``   line index
``synthetic:n=…&dim=…&seed=…``    ``synthetic:seed=S,dim=D``          record index
================================  =================================  ================================

A batch's range for a key is ``[position before the batch, position after it)``: it includes any
position that holds no usable record (a blank line, a rejected message, an offset gap), so the
consumed positions of a key always form one contiguous interval. The ledger is charged with these
whole ranges — conservative (a rejected record is accounted as if used) and compact (one segment per
key however long the stream).

Kafka specifics (exactly-once for the state that survives a crash; the full argument is in
:mod:`panpriv.streamer.processor`): a consumer group with auto-commit off; when partitions are assigned,
each is ``seek``-ed to the position in OUR checkpoint — or further, to the group's committed offset
or the partition's first retained offset when those are ahead; before partitions are revoked, the
``on_revoke`` hook (the processor's checkpoint) runs; :meth:`KafkaSource.acknowledge` commits
offsets only after a checkpoint holding them is durable (for lag monitoring, never read back as the
source of truth except as a lower bound). A message whose offset is below the key's position is
dropped, so a redelivery can never be learned twice.
"""

from __future__ import annotations

import abc
import gzip
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer import kafka_calls, kafka_client
from panpriv.streamer.codec import Codec
from panpriv.streamer.config import SourceConfig
from panpriv.streamer.errors import SourceError
from panpriv.streamer.recording import Frame, RecordingReader, is_recording
from panpriv.streamer.source_url import AdultUrl, FileUrl, KafkaUrl, SyntheticUrl, parse_source_url
from panpriv.streamer.urls import redact

log = logging.getLogger("panpriv.sources")

REBALANCE_TIMEOUT_MS = 30_000
"""kafka-python's ``max_poll_interval_ms``, which is also the rebalance timeout it sends with a
group join: how long the group waits for a member to rejoin. Its default (5 minutes) made a
process stopped during a join hold the group that long (issue 15). The processing loop polls
every few seconds at most (a micro-batch, a checkpoint), far within 30 s."""

ASSIGNMENT_LOG_EVERY_S = 10.0
"""While no partition is assigned, say so this often (a silent wait looks like a hang)."""

_UNBOUNDED = 1 << 62  # no byte limit on a poll

CAUGHT_UP_POLLS = 2
"""Consecutive empty polls at or past the end offsets before a ``stop_at_end`` source is done.
Some brokers (the Tansu test broker) report an end offset below the last record, so one empty poll
right at a reported end is not proof that nothing follows."""


@dataclass
class Batch:
    """One micro-batch as read from a source, before decoding.

    Either ``payloads`` (encoded messages, with the key and position of each in ``keys`` and
    ``positions``) or ``arrays`` (``(X, y)``, already numeric: the synthetic source) is set.
    ``ranges[key] = (start, stop)``: the positions consumed by this batch.
    """

    ranges: dict[str, tuple[int, int]]
    payloads: list[bytes] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    arrays: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None

    @property
    def consumed(self) -> int:
        """Number of positions this batch consumed (records, rejected records and gaps)."""
        return sum(stop - start for start, stop in self.ranges.values())


class Source(Protocol):
    """The source contract used by the processor."""

    name: str
    """A display name without credentials (for logs and ``panpriv_info``)."""

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        """Up to ``max_records`` records, or ``None`` if none arrived within ``timeout_s``. Local
        sources also stop once they have read ``max_bytes`` payload bytes (exceeding it by less
        than one message); Kafka sources are bounded by their fetch sizes instead, and the driver
        decodes every batch in byte-bounded groups."""

    @property
    def exhausted(self) -> bool:
        """True when a finite source (or a Kafka source with ``stop_at_end``) has nothing left."""

    def total_positions(self) -> int | None:
        """Positions from the start of every key to its current end (for progress), if known."""

    def count_records(self) -> int | None:
        """Number of records in a finite source (the public ``n``), or ``None`` if unbounded."""

    def acknowledge(self, positions: Mapping[str, int], strict: bool = False) -> None:
        """Called after a checkpoint holding ``positions`` is durable (``strict``: before a
        Kafka revocation, where a failure must stop the process)."""

    def lag(self) -> dict[str, int] | None:
        """Positions between the current position and the end, per key (Kafka only; ``None``
        when unknown). Cheap enough to call every few seconds from the processing loop."""

    def close(self) -> None:
        """Release connections and files."""


class FatalSourceError(SourceError):
    """An error after which the process must stop WITHOUT a final checkpoint (e.g. a failed
    checkpoint before a Kafka revocation: another consumer may now own those records)."""


def display_name(url: str) -> str:
    """The URL without credentials, for logs and metrics labels."""
    parsed = parse_source_url(url)
    return parsed.display() if isinstance(parsed, KafkaUrl) else redact(url)


# -- local sources -------------------------------------------------------------------------------


class _LocalSource:
    """What files and the synthetic stream share: nothing upstream to acknowledge, no lag."""

    def acknowledge(self, positions: Mapping[str, int], strict: bool = False) -> None:
        """Nothing to acknowledge: the checkpoint is the only record of progress."""

    def lag(self) -> None:
        return None


# -- line files (JSONL, CSV, Adult) --------------------------------------------------------------


def _open_binary(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb", buffering=1 << 20)


class LineFileSource(_LocalSource):
    """One record per line; position = line index. ``.gz`` files are read transparently."""

    def __init__(self, path: Path, key: str, codec: Codec, positions: Mapping[str, int], skip_header: bool) -> None:
        if not path.is_file():
            raise SourceError(f"source file {path} does not exist")
        self.path = path
        self.key = key
        self.name = key
        self._codec = codec
        self._handle = _open_binary(path)
        self._position = 0
        self._eof = False
        resume = int(positions.get(key, 0))
        if skip_header:
            resume = max(resume, 1)
        while self._position < resume and self._handle.readline():
            self._position += 1
        if self._position < resume:
            raise SourceError(f"{path} has {self._position} lines but the checkpoint's position is {resume}")

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        start = self._position
        payloads: list[bytes] = []
        readline = self._handle.readline
        is_record = self._codec.is_record_line
        size, budget = 0, max_bytes or _UNBOUNDED
        while len(payloads) < max_records and size < budget:
            line = readline()
            if not line:
                self._eof = True
                break
            self._position += 1
            if is_record(line):
                payloads.append(line.rstrip(b"\r\n"))
                size += len(line)
        if self._position == start:
            return None
        return Batch(
            {self.key: (start, self._position)},
            payloads,
            [self.key] * len(payloads),
            [],  # line positions are not needed downstream (no dead-letter topic for files)
        )

    @property
    def exhausted(self) -> bool:
        return self._eof

    def total_positions(self) -> int:
        with _open_binary(self.path) as handle:
            count = 0
            last = b"\n"
            while chunk := handle.read(1 << 22):
                count += chunk.count(b"\n")
                last = chunk[-1:]
        return count + (last != b"\n")

    def count_records(self) -> int:
        with _open_binary(self.path) as handle:
            return sum(1 for line in handle if self._codec.is_record_line(line)) - (
                1 if self._skips_header() else 0
            )

    def _skips_header(self) -> bool:
        return self._codec.records.csv_header and self._codec.records.format == "csv"

    def close(self) -> None:
        self._handle.close()


# -- recordings ---------------------------------------------------------------------------------


class RecordingSource(_LocalSource):
    """Replay a ``panpriv record`` file under its original ``topic/partition`` keys and offsets.

    With ``recorded_pace`` the frames are released at the pace of their recorded timestamps.
    """

    def __init__(self, path: Path, positions: Mapping[str, int], recorded_pace: bool, codec: Codec) -> None:
        self._reader = RecordingReader(path)
        self._codec = codec
        self.name = f"file:{path}"
        self._positions = {key: max(int(positions.get(key, 0)), self._reader.start.get(key, 0)) for key in self._reader.keys}
        self._frames = self._reader.frames(self._positions)
        self._pending: Frame | None = None
        self._eof = False
        self._paced = recorded_pace
        self._clock_origin: tuple[float, int] | None = None

    def resume_positions(self) -> dict[str, int]:
        """The next position this replay reads, per recorded key."""
        return dict(self._positions)

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        payloads: list[bytes] = []
        keys: list[str] = []
        offsets: list[int] = []
        starts: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        size, budget = 0, max_bytes or _UNBOUNDED
        while len(payloads) < max_records and size < budget:
            frame = self._pending or next(self._frames, None)
            self._pending = None
            if frame is None:
                self._eof = True
                break
            if self._paced and not self._due(frame.timestamp_ms, deadline):
                self._pending = frame
                break
            starts.setdefault(frame.key, self._positions[frame.key])
            self._positions[frame.key] = frame.offset + 1
            payloads.append(frame.value)
            size += len(frame.value)
            keys.append(frame.key)
            offsets.append(frame.offset)
        if not starts:
            return None
        return Batch({k: (s, self._positions[k]) for k, s in starts.items()}, payloads, keys, offsets)

    def _due(self, timestamp_ms: int, deadline: float) -> bool:
        """Wait (until ``deadline`` at most) for the recorded time of a frame; True if it is due."""
        now = time.monotonic()
        if self._clock_origin is None:
            self._clock_origin = (now, timestamp_ms)
        wall0, ts0 = self._clock_origin
        due_at = wall0 + (timestamp_ms - ts0) / 1000.0
        if due_at > now:
            time.sleep(max(0.0, min(due_at, deadline) - now))
        return time.monotonic() >= due_at

    @property
    def exhausted(self) -> bool:
        return self._eof and self._pending is None

    def total_positions(self) -> int:
        return self._reader.count()

    def count_records(self) -> int:
        """Records in the recording: one per message, or the counts in binary batch headers."""
        if self._codec.prefix_size == 0:
            return self._reader.count()
        return self._reader.count(self._codec.records_in, self._codec.prefix_size)

    def close(self) -> None:
        self._frames.close()


# -- synthetic ----------------------------------------------------------------------------------


class SyntheticSource(_LocalSource):
    """A seeded stream of ``n`` labelled records for demos, load tests and tests.

    Record ``i`` depends only on ``(seed, i)`` (blocks of 4096 records, each generated from
    ``default_rng([seed, block])``), so a resumed stream continues with exactly the records an
    uninterrupted one would have produced. ``x`` has i.i.d. N(0, 1/dim) coordinates (‖x‖ ≈ 1) and
    ``y = sign(⟨w, x⟩ + noise)`` ∈ {−1, +1} for a fixed unit vector ``w`` drawn from the seed.
    This is test data, not user data: its generator is unrelated to any learner's noise.
    """

    BLOCK = 4096

    def __init__(self, n: int, dim: int, seed: int, positions: Mapping[str, int]) -> None:
        self.n, self.dim, self.seed = n, dim, seed
        self.key = f"synthetic:seed={seed},dim={dim}"
        self.name = f"synthetic:n={n}&dim={dim}&seed={seed}"
        self._position = min(int(positions.get(self.key, 0)), n)
        w = np.random.default_rng([seed, 2**32]).standard_normal(dim)
        self._w = w / np.linalg.norm(w)

    def _block(self, index: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rng = np.random.default_rng([self.seed, index])
        X = rng.standard_normal((self.BLOCK, self.dim)) / np.sqrt(self.dim)
        y = np.where(X @ self._w + 0.1 * rng.standard_normal(self.BLOCK) >= 0, 1.0, -1.0)
        return X, y

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        start = self._position
        stop = min(self.n, start + max_records)
        if stop == start:
            return None
        parts_X, parts_y = [], []
        cursor = start
        while cursor < stop:
            block, within = divmod(cursor, self.BLOCK)
            take = min(stop - cursor, self.BLOCK - within)
            X, y = self._block(block)
            parts_X.append(X[within : within + take])
            parts_y.append(y[within : within + take])
            cursor += take
        self._position = stop
        return Batch({self.key: (start, stop)}, arrays=(np.vstack(parts_X), np.concatenate(parts_y)))

    @property
    def exhausted(self) -> bool:
        return self._position >= self.n

    def total_positions(self) -> int:
        return self.n

    def count_records(self) -> int:
        return self.n

    def close(self) -> None:
        """Nothing to release."""


# -- Kafka --------------------------------------------------------------------------------------


class KafkaConsumerSource(abc.ABC):
    """What the two Kafka consumer sources share (:class:`KafkaSource` on kafka-python,
    :class:`panpriv.streamer.source_confluent.ConfluentKafkaSource` on librdkafka): the offset-regression
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
        self._waiting_since = self._waiting_logged = time.monotonic()  # "waiting for an assignment" log line

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
        """A record below our position: refuse (:mod:`panpriv.streamer.kafka_calls`), or with
        ``accept_offset_reset`` continue from ``offset``."""
        if not self._config.accept_offset_reset:
            raise kafka_calls.regression(key, position, offset)
        log.warning("partition %s was reset from offset %d to %d; reading on from there (accept_offset_reset)", key, position, offset)
        return offset

    def _batch(self, by_key: Mapping[str, list[tuple[int, bytes, int]]]) -> Batch | None:
        """The batch of one poll, from each partition's ``(offset, value, timestamp ms)`` in
        offset order: records below our position are dropped (a redelivery is never learned
        twice), a partition reset below it is refused or accepted (:meth:`_offset_reset`), and
        positions and marks advance. ``None`` when nothing new arrived; with ``stop_at_end``,
        empty polls count towards :attr:`exhausted` only while every partition is caught up."""
        batch = Batch({})
        for key, messages in by_key.items():
            first = messages[0][0]
            start = self._positions.get(key, first)
            if first < start:  # the broker reset the consumer below our position
                start = self._offset_reset(key, start, first)
            fresh = [m for m in messages if m[0] >= start]
            if not fresh:
                continue
            for offset, value, _ in fresh:
                batch.payloads.append(value)
                batch.keys.append(key)
                batch.positions.append(offset)
            stop = fresh[-1][0] + 1
            batch.ranges[key] = (start, stop)
            self._positions[key] = stop
            self._marks[key] = (stop, fresh[-1][2])
        if not batch.ranges:
            if self._config.stop_at_end:
                self._empty_polls = self._empty_polls + 1 if self._check_caught_up() else 0
            return None
        self._empty_polls = 0
        return batch

    @abc.abstractmethod
    def _check_caught_up(self) -> bool:
        """Whether every partition of the consumed topics is read to its end (ours or the group's)."""

    @property
    def exhausted(self) -> bool:
        return self._empty_polls >= CAUGHT_UP_POLLS


class KafkaSource(KafkaConsumerSource):
    """A kafka-python consumer group whose positions come from our checkpoint (module docstring)."""

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
                heartbeat_interval_ms=max(100, config.session_timeout_ms // 4),
                max_poll_records=config.batch_records,
                max_poll_interval_ms=max(REBALANCE_TIMEOUT_MS, config.session_timeout_ms),
            )
        except KafkaError as exc:
            raise SourceError(f"cannot connect to Kafka at {kafka_client.describe(url.bootstrap)}: {exc}") from None
        self._consumer.subscribe(topics=url.topics, listener=Listener())

    def cluster_identity(self) -> str:
        """The cluster part of this topic's data keys (:mod:`panpriv.streamer.identity`): the broker's
        cluster id (asked for through a metadata request), else the bootstrap servers."""
        from kafka.errors import KafkaError

        from panpriv.streamer.identity import kafka_cluster_identity

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

    def _assigned_partitions(self, assigned: object) -> None:
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
        records = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        self._raise_failure()
        self._log_waiting()
        return self._batch({
            f"{tp.topic}/{tp.partition}": [(m.offset, m.value if m.value is not None else b"", m.timestamp) for m in messages]
            for tp, messages in records.items()
        })

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


# -- construction -------------------------------------------------------------------------------


def source_marks(source: object, positions: Mapping[str, int]) -> dict[str, int]:
    """A Kafka source's marks for a checkpoint at ``positions`` (:mod:`panpriv.streamer.kafka_calls`);
    empty for sources without marks."""
    return source.marks(positions) if isinstance(source, KafkaConsumerSource) else {}


def open_source(
    config: SourceConfig,
    codec: Codec,
    positions: Mapping[str, int],
    on_revoke: Callable[[], None] | None = None,
    marks: Mapping[str, int] | None = None,
) -> Source:
    """Build the source named by ``config.url``, resuming at ``positions`` (``marks``: the
    timestamps of the last records before them, for Kafka's regression check)."""
    parsed = parse_source_url(config.url)
    if config.recorded_pace and not (isinstance(parsed, FileUrl) and is_recording(parsed.path)):
        raise SourceError("source.recorded_pace needs a file: source holding a panpriv recording")
    match parsed:
        case KafkaUrl():
            if kafka_client.settings().client == "confluent":
                from panpriv.streamer.source_confluent import ConfluentKafkaSource

                return ConfluentKafkaSource(parsed, config, positions, on_revoke, marks)
            return KafkaSource(parsed, config, positions, on_revoke, marks)
        case SyntheticUrl(n=n, dim=dim, seed=seed):
            if dim != codec.dim:
                raise SourceError(f"synthetic source dim={dim} but records.dim={codec.dim}")
            return SyntheticSource(n, dim, seed, positions)
        case AdultUrl(split=split):
            from panpriv.streamer.datasets import adult

            path = adult.TRAIN_PATH if split == "train" else adult.TEST_PATH
            return LineFileSource(path, config.url, codec, positions, skip_header=False)
        case FileUrl(path=path):
            if is_recording(path):
                return RecordingSource(path, positions, config.recorded_pace, codec)
            skip_header = codec.records.csv_header and codec.records.format == "csv"
            return LineFileSource(path, f"file:{path.resolve()}", codec, positions, skip_header)


def iter_batches(source: Source, max_records: int, timeout_s: float = 0.2) -> Iterator[Batch]:
    """Every batch of a finite source until it is exhausted (for tools and tests)."""
    while True:
        batch = source.poll(max_records, timeout_s)
        if batch is not None:
            yield batch
        elif source.exhausted:
            return
