"""Bounded broker calls, offset-regression checks and whole-topic catch-up for :class:`KafkaSource`.

Bounded calls. kafka-python's ``end_offsets``/``beginning_offsets`` wait up to
``request_timeout_ms`` (305 s by default; it must exceed the session timeout, so it cannot be made
short), and ``commit``/``committed``/``close`` wait forever unless given a timeout. A broker that
stops answering (frozen, partitioned away) then holds the processing loop, and a SIGTERM is not
honoured before the orchestrator kills the process. Every broker call the loop makes goes through
the functions here, each bounded by :data:`CALL_TIMEOUT_MS`; a timeout raises kafka-python's
``KafkaTimeoutError`` (a ``KafkaError``), which the callers treat like any failed call. With
``poll`` already bounded by its own timeout, one loop iteration — and so the time between a stop
request and the final checkpoint — is bounded by a few :data:`CALL_TIMEOUT_MS`.
``end_offsets`` with a timeout is kafka-python's fetcher method (kafka-python is pinned below 3.0
in pyproject.toml for this and other reasons).

Offset regression. A topic deleted and re-created, or a broker restarted empty, starts its
offsets again: our checkpointed positions then point into a different log, and consuming on would
silently skip every new record below the old position and mark the wrong offsets as used. Two
checks catch it:

- on assignment, :func:`changed_partitions` reads the record just before each resumed position
  and compares its timestamp with the one saved in the checkpoint (``source_marks``): a missing
  record or another timestamp means the log was replaced (a record removed by retention is not
  checked: its offset is below the partition's first offset);
- while consuming, a record arriving *below* our position means the broker reset the consumer
  (its fetch position was out of range).

Either stops the run with :class:`OffsetRegressionError` (exit 1, nothing consumed, the checkpoint
unchanged), unless the operator accepts the reset (``--accept-offset-reset``): the partition is
then read from its new beginning (or from where the consumer was reset to), and the ledger charges
those offsets again, composing with their old use (an over-count, never an under-count; the
ledger does not yet treat the new log as a distinct source). Limits: a compacted topic may have
removed the checked record (a false alarm: accept the reset), and a log replaced by records with
identical offsets and timestamps is not detected (Kafka's topic id would be; kafka-python 2.x does
not expose it).

Whole-topic catch-up. ``stop_at_end`` asks whether the *topic* is consumed, not only the
partitions assigned to this member: a partition still held by a member that died (until the
group's session timeout expires) has not been read by anyone. :func:`topic_caught_up` checks
every partition of the subscribed topics: ours against our positions, the others against the
group's committed offsets.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from panpriv.streamer.errors import SourceError

CAUGHT_UP_POLLS = 2
"""Consecutive empty polls at or past the end offsets before a ``stop_at_end`` source is done.
Some brokers (the Tansu test broker) report an end offset below the last record, so one empty poll
right at a reported end is not proof that nothing follows."""

CALL_TIMEOUT_MS = 2000
"""Upper bound of one broker call made from the processing loop."""


def end_offsets(consumer: Any, partitions: Iterable[Any]) -> dict[Any, int]:
    return consumer._fetcher.end_offsets(list(partitions), CALL_TIMEOUT_MS)  # noqa: SLF001 - see module docstring


def beginning_offsets(consumer: Any, partitions: Iterable[Any]) -> dict[Any, int]:
    return consumer._fetcher.beginning_offsets(list(partitions), CALL_TIMEOUT_MS)  # noqa: SLF001


def committed(consumer: Any, partition: Any) -> int | None:
    return consumer.committed(partition, timeout_ms=CALL_TIMEOUT_MS)


def commit(consumer: Any, offsets: Mapping[Any, Any]) -> None:
    consumer.commit(dict(offsets), timeout_ms=CALL_TIMEOUT_MS)


JOIN_DRAIN_TIMEOUT_MS = 5000
"""How long :func:`close` lets a group join in flight complete before leaving the group."""


def close(consumer: Any) -> None:
    """Leave the group and close, bounded. A stop during a group join used to cancel the join and
    the LeaveGroup queued behind it on the same connection, so the group kept waiting for the
    departed member (more than 7 minutes on the test broker, issue 15). The join in flight is
    first given up to :data:`JOIN_DRAIN_TIMEOUT_MS` to complete (kafka-python's coordinator
    internals, pinned below 3.0), so the LeaveGroup that follows is answered."""
    join = getattr(getattr(consumer, "_coordinator", None), "join_future", None)
    if join is not None and not join.is_done:
        consumer._client.poll(future=join, timeout_ms=JOIN_DRAIN_TIMEOUT_MS)  # noqa: SLF001
    consumer.close(autocommit=False, timeout_ms=CALL_TIMEOUT_MS)


class OffsetRegressionError(SourceError):
    """A partition's offsets went backwards under our checkpointed position (module docstring)."""


def regression(key: str, position: int, found: int) -> OffsetRegressionError:
    """A record at ``found`` arrived below our ``position``: the consumer was reset."""
    return replaced(key, position, f"a record at offset {found:,} arrived below it (the broker reset the consumer)")


def replaced(key: str, position: int, evidence: str) -> OffsetRegressionError:
    return OffsetRegressionError(
        f"Kafka partition {key} no longer holds the records before the checkpointed position {position:,}: "
        f"{evidence}. The topic was deleted and re-created or the broker lost its data, so its offsets are not "
        "the records the checkpoint counted. Stopped without consuming. To read the partition from its new "
        "beginning (the ledger then charges those offsets again), run again with --accept-offset-reset; or start "
        "a new run with another --out."
    )


VERIFY_TIMEOUT_S = 5.0
"""How long :func:`changed_partitions` waits for the records it checks."""


def changed_partitions(bootstrap: list[str], wanted: Mapping[Any, tuple[int, int]]) -> dict[Any, str]:
    """Of ``wanted`` (partition -> (position, timestamp of the record at position - 1)), the
    partitions whose record at ``position - 1`` is missing or has another timestamp, with the
    evidence. A separate group-less consumer reads them (the rebalance callback that calls this
    runs inside the group consumer's own ``poll``)."""
    if not wanted:
        return {}
    from kafka.errors import OffsetOutOfRangeError

    from panpriv.streamer.kafka import client as kafka_client

    probe = kafka_client.consumer(bootstrap, group_id=None, enable_auto_commit=False,
                                  client_id="panpriv-verify", auto_offset_reset="none")
    found: dict[Any, Any] = {}
    try:
        probe.assign(list(wanted))
        for tp, (position, _) in wanted.items():
            probe.seek(tp, position - 1)
        pending = set(wanted)
        deadline = time.monotonic() + VERIFY_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            try:
                records = probe.poll(timeout_ms=200)
            except OffsetOutOfRangeError as exc:  # the offset is past the log's end (or before its start)
                out = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else pending
                pending -= set(out)
                probe.pause(*out)
                continue
            for tp, messages in records.items():
                if tp in pending:
                    found[tp] = messages[0]
                    pending.discard(tp)
                    probe.pause(tp)
    finally:
        probe.close(autocommit=False)
    changed = {}
    for tp, (position, timestamp) in wanted.items():
        record = found.get(tp)
        if record is None:
            changed[tp] = f"there is no record at offset {position - 1:,} (or the broker did not return it within {VERIFY_TIMEOUT_S:.0f} s)"
        elif record.offset != position - 1 or record.timestamp != timestamp:
            changed[tp] = f"the record at offset {record.offset:,} has timestamp {record.timestamp}, the checkpoint saw {timestamp}"
    return changed


def topic_caught_up(consumer: Any, topics: Iterable[str], positions: Mapping[str, int], assigned: set[Any]) -> bool:
    """True if every partition of ``topics`` is consumed to its end offset (module docstring)."""
    from kafka import TopicPartition

    partitions = []
    for topic in topics:
        ids = consumer.partitions_for_topic(topic)
        if not ids:
            return False
        partitions += [TopicPartition(topic, p) for p in ids]
    ends = end_offsets(consumer, partitions)
    starts = beginning_offsets(consumer, partitions)
    for tp in partitions:
        if tp in assigned:
            done = positions.get(f"{tp.topic}/{tp.partition}", 0)
        else:
            done = max(committed(consumer, tp) or 0, starts[tp])
        if done < ends[tp]:
            return False
    return True
