"""``panpriv record``: copy Kafka topics to a replayable recording (see :mod:`panpriv.streamer.io.recording`).

Every partition is assigned directly (no consumer group, nothing committed), read from its first
retained offset until caught up (:class:`panpriv.streamer.kafka.topic_reader.TopicReader`), and written frame by frame with its
``topic/partition`` key, offset and timestamp. The header names the cluster the topic lives on
(:func:`panpriv.streamer.sources.identity.kafka_cluster_identity`), so a replay of the recording charges the
topic's own data keys in the budget store. Values are copied as they are — malformed messages
included — so a replay decodes and rejects exactly what the live service would.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.io.source_url import parse_kafka_url
from panpriv.streamer.kafka import calls as kafka_calls
from panpriv.streamer.kafka.topic_reader import TopicReader
from panpriv.streamer.sources.identity import kafka_cluster_identity

log = logging.getLogger("panpriv.recorder")


def _key(tp: object) -> str:
    return f"{tp.topic}/{tp.partition}"  # type: ignore[attr-defined]


def record_topics(url: str, path: Path, timeout_s: float = 60.0) -> int:
    """Record the topics of ``url`` into ``path``; return the number of messages written.

    Raises :class:`SourceError` if a topic does not exist or no progress is made for
    ``timeout_s`` seconds.
    """
    from kafka import TopicPartition

    from panpriv.streamer.kafka import client as kafka_client

    spec = parse_kafka_url(url)
    consumer = kafka_client.consumer(
        spec.bootstrap, enable_auto_commit=False, group_id=None, client_id="panpriv-record",
    )
    try:
        partitions = []
        for topic in spec.topics:
            ids = consumer.partitions_for_topic(topic)
            if not ids:
                raise SourceError(f"topic {topic!r} does not exist on {','.join(spec.bootstrap)}")
            partitions += [TopicPartition(topic, p) for p in sorted(ids)]
        start = kafka_calls.beginning_offsets(consumer, partitions)
        created = datetime.now(UTC).isoformat(timespec="seconds")
        cluster = kafka_cluster_identity(consumer, spec.bootstrap)
        writer = RecordingWriter(
            path, spec.display(), [_key(tp) for tp in partitions], {_key(tp): start[tp] for tp in partitions}, created,
            cluster=cluster,
        )

        def write(message: Any) -> None:
            writer.write(f"{message.topic}/{message.partition}", message.offset, message.timestamp, message.value or b"")

        reader = TopicReader(consumer, partitions, write, start)
        reader.catch_up(poll_ms=500, stalled_after_s=timeout_s,
                        on_stall=lambda: SourceError(f"no progress for {timeout_s:.0f} s while recording {url}"))
        writer.close()
        log.info("recorded %d messages from %d partitions", writer.frames, len(partitions))
        return writer.frames
    finally:
        consumer.close(autocommit=False)
