"""Data keys: the name of a source's records that does not depend on the run reading them.

A run's ledger and positions use *source keys* (:mod:`panpriv.streamer.sources`: ``topic/partition``,
``file:<path>``, ``adult:train``…). The budget store (:mod:`panpriv.streamer.budget.store`) must recognise the
same records whatever run, path or pipeline delivers them, so each source key maps to a *data key*
(the table is in :mod:`panpriv.streamer.budget.store`): Kafka partitions by cluster identity, topic and
partition — for a live topic and for a ``panpriv record`` recording of it alike — and files by the
SHA-256 of their content, so a renamed or copied file is the same data.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.recording import RecordingReader, is_recording
from panpriv.streamer.io.source_url import AdultUrl, FileUrl, KafkaUrl, SyntheticUrl, parse_kafka_url, parse_source_url


def bootstrap_identity(hosts: list[str]) -> str:
    """The fallback cluster identity: the sorted, lower-cased bootstrap servers."""
    return "bootstrap=" + ",".join(sorted(h.strip().lower() for h in hosts if h.strip()))


def kafka_cluster_identity(consumer: Any, hosts: list[str]) -> str:
    """``cluster=<id>`` from the broker's metadata (kafka-python keeps the id of the last metadata
    response in ``consumer._client.cluster.cluster_id``; it is set once a metadata request has
    been answered, e.g. after ``partitions_for_topic``), else :func:`bootstrap_identity`."""
    cluster = getattr(getattr(consumer, "_client", None), "cluster", None)
    cluster_id = getattr(cluster, "cluster_id", None)
    return f"cluster={cluster_id}" if cluster_id else bootstrap_identity(hosts)


def file_digest(path: Path) -> str:
    """SHA-256 of the file's content as the service reads it (decompressed for ``.gz``)."""
    digest = hashlib.sha256()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def recording_cluster(reader: RecordingReader) -> str:
    """The cluster identity of the topic a recording copied: its header's ``cluster`` field, or,
    for a recording written before that field existed, the bootstrap servers of its ``source``
    (or the ``source`` string itself if it is not a Kafka URL)."""
    cluster = reader.header.get("cluster")
    if cluster:
        return str(cluster)
    source = str(reader.header.get("source", ""))
    try:
        return bootstrap_identity(parse_kafka_url(source.split("?")[0]).bootstrap)
    except SourceError:  # not written by `panpriv record`: its declared source names the data
        return f"source={source}"


class DataKeys:
    """Maps the source keys of one run to data keys."""

    def __init__(self, prefix: Mapping[str, str] | None = None, kafka_cluster: str | None = None) -> None:
        self._exact = dict(prefix or {})
        self._cluster = kafka_cluster

    def key(self, source_key: str) -> str:
        """The data key of ``source_key``."""
        exact = self._exact.get(source_key)
        if exact is not None:
            return exact
        if self._cluster is not None:  # a topic/partition key
            return f"kafka:{self._cluster}/{source_key}"
        return source_key

    def ranges(self, ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        return {self.key(k): v for k, v in ranges.items()}

    def positions(self, positions: Mapping[str, int]) -> dict[str, int]:
        return {self.key(k): v for k, v in positions.items()}


def data_keys_for(url: str, source: Any) -> DataKeys:
    """The data keys of the source opened from ``url`` (``source`` is the opened source; for Kafka
    its consumer answers the cluster identity)."""
    match parse_source_url(url):
        case KafkaUrl():
            return DataKeys(kafka_cluster=source.cluster_identity())
        case AdultUrl(split=split):
            from panpriv.streamer.datasets import adult

            path = adult.TRAIN_PATH if split == "train" else adult.TEST_PATH
            return DataKeys({url: f"sha256:{file_digest(Path(path))}"})
        case FileUrl(path=path):
            if is_recording(path):
                return DataKeys(kafka_cluster=recording_cluster(RecordingReader(path)))
            digest = f"sha256:{file_digest(path)}"
            return DataKeys({f"file:{path.resolve()}": digest, f"file:{path}": digest})
        case SyntheticUrl():
            return DataKeys()  # the key (seed, dim) already names the data
