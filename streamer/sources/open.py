"""A source URL → the source that reads it, resuming at a position."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from panpriv.streamer.config import SourceConfig
from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.batch_formats import FORMATS as BATCH_FORMATS
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.io.recording import is_recording
from panpriv.streamer.io.source_url import AdultUrl, FileUrl, KafkaUrl, SyntheticUrl, parse_source_url
from panpriv.streamer.kafka import client as kafka_client
from panpriv.streamer.sources.base import Source
from panpriv.streamer.sources.kafka import KafkaConsumerSource, KafkaSource
from panpriv.streamer.sources.local import LineFileSource, RecordingSource, SyntheticSource

if TYPE_CHECKING:
    from panpriv.streamer.sources.confluent import ConfluentKafkaSource

# -- construction -------------------------------------------------------------------------------


def source_marks(source: object, positions: Mapping[str, int]) -> dict[str, int]:
    """A Kafka source's marks for a checkpoint at ``positions`` (:mod:`panpriv.streamer.kafka.calls`);
    empty for sources without marks."""
    return source.marks(positions) if isinstance(source, KafkaConsumerSource) else {}


def open_kafka_source(url: KafkaUrl, config: SourceConfig, positions: Mapping[str, int],
                      on_revoke: Callable[[], None] | None = None,
                      marks: Mapping[str, int] | None = None) -> KafkaSource | ConfluentKafkaSource:
    """The Kafka source of ``url`` on the client ``[kafka] client`` names (kafka-python, or
    confluent-kafka): ``panpriv run``'s and each scale-out worker's."""
    if kafka_client.settings().client == "confluent":
        from panpriv.streamer.sources.confluent import ConfluentKafkaSource

        return ConfluentKafkaSource(url, config, positions, on_revoke, marks)
    return KafkaSource(url, config, positions, on_revoke, marks)


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
            return open_kafka_source(parsed, config, positions, on_revoke, marks)
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
            if codec.records.format in BATCH_FORMATS:
                raise SourceError(f"{path}: format {codec.records.format!r} reads messages of many records (Kafka topics "
                                  "and their panpriv recordings); a file of one record per line is 'json' or 'csv'")
            return LineFileSource(path, f"file:{path.resolve()}", codec, positions, codec.has_header)
