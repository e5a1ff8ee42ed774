"""``panpriv record``: copy Kafka topics to a replayable recording (see :mod:`streamer.recording`).

Every partition is assigned directly (no consumer group, nothing committed), read from its first
retained offset to the end offset observed at the start, and written frame by frame with its
``topic/partition`` key, offset and timestamp. Values are copied as they are — malformed messages
included — so a replay decodes and rejects exactly what the live service would.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from pathlib import Path

from streamer.errors import SourceError
from streamer.recording import RecordingWriter
from streamer.sources import parse_kafka_url

log = logging.getLogger("panpriv.recorder")


def record_topics(url: str, path: Path, timeout_s: float = 60.0) -> int:
    """Record the topics of ``url`` into ``path``; return the number of messages written.

    Raises :class:`SourceError` if a topic does not exist or no progress is made for
    ``timeout_s`` seconds.
    """
    from kafka import KafkaConsumer, TopicPartition

    spec = parse_kafka_url(url)
    consumer = KafkaConsumer(bootstrap_servers=spec.bootstrap, enable_auto_commit=False, group_id=None, client_id="panpriv-record")
    try:
        partitions = []
        for topic in spec.topics:
            ids = consumer.partitions_for_topic(topic)
            if not ids:
                raise SourceError(f"topic {topic!r} does not exist on {','.join(spec.bootstrap)}")
            partitions += [TopicPartition(topic, p) for p in sorted(ids)]
        consumer.assign(partitions)
        start = consumer.beginning_offsets(partitions)
        end = consumer.end_offsets(partitions)
        keys = [f"{tp.topic}/{tp.partition}" for tp in partitions]
        for tp in partitions:
            consumer.seek(tp, start[tp])
        created = datetime.now(UTC).isoformat(timespec="seconds")
        writer = RecordingWriter(path, spec.display(), keys, {f"{tp.topic}/{tp.partition}": start[tp] for tp in partitions}, created)
        remaining = {tp for tp in partitions if end[tp] > start[tp]}
        last_progress = time.monotonic()
        while remaining:
            batches = consumer.poll(timeout_ms=500)
            for tp, messages in batches.items():
                key = f"{tp.topic}/{tp.partition}"
                for message in messages:
                    if message.offset >= end[tp]:
                        break
                    writer.write(key, message.offset, message.timestamp, message.value or b"")
                if consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
                    consumer.pause(tp)
                last_progress = time.monotonic()
            if time.monotonic() - last_progress > timeout_s:
                raise SourceError(f"no progress for {timeout_s:.0f} s while recording {url}; {len(remaining)} partitions unfinished")
        writer.close()
        log.info("recorded %d messages from %d partitions", writer.frames, len(partitions))
        return writer.frames
    finally:
        consumer.close(autocommit=False)
