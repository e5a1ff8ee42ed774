"""Data keys: the name of a source's records that does not depend on the run reading them.

A run's ledger and positions use *source keys* (:mod:`panpriv.streamer.sources`: ``topic/partition``,
``file:<path>``, ``adult:train``…). The budget store (:mod:`panpriv.streamer.budget.store`) must recognise the
same records whatever run, path, pipeline or encoding delivers them, so each source key maps to a
*data key* (:data:`IDENTIFICATION_RULE`):

- **Kafka** partitions by cluster identity, topic and partition (position: the offset) — for a live
  topic and for a ``panpriv record`` recording of it alike.
- **Files** (JSONL, CSV, the embedded Adult data, and the messages of a recording) by **content**:
  ``records:<digest>``, a digest of the *multiset* of the file's records as numbers
  (:class:`ContentDigest`). A record is every message the run's format reads as ``dim`` finite
  features and a finite label (:meth:`panpriv.streamer.io.codec.Codec.values`: before clipping and
  before the label-domain check, so the run's ``feature_bound`` and labels do not change the
  identity); blank lines, a CSV header and messages that do not decode are not records. So compact
  or pretty JSON, another key order, 17 significant digits, ``1.0`` for ``1``, ``-0`` for ``0``,
  CRLF line ends, a missing final newline or extra blank lines, a shuffle, the same records as CSV,
  JSONL or binary batches, and a recording's values exported one per line are all *one* source;
  a split, a subset, a superset (one record more or less) is another. A file of **named-field**
  records (JSON objects or headed CSV rows read through a schema, ``records.fields``) is identified
  by every field of each record that reads as an object or a full row
  (:func:`panpriv.streamer.io.codec.canonical_record`: fields by name, numbers as float64 whether
  written ``1``, ``1.0`` or ``"1"``), not by the vector a schema makes of it: the same events as
  JSON or CSV, read with any schema — other features, bounds or vocabularies — are one source. A
  recording is charged
  under both names: its Kafka keys (so it composes with the topic) and its content key (so it
  composes with files holding its records).
- **Positions on a content key** are those of the serialisation read: the line index of a line
  file, the frame index (file order) of a recording. Each charge carries the serialisation's
  *order* (a digest of the sequence of positions and records, :attr:`ContentIdentity.order`);
  charges made in different orders are composed conservatively
  (:func:`panpriv.accounting.budget.effective`).

Nothing per record is kept: the per-record hashes that make up the digests live only while a
chunk of the file is being digested. The digest itself is a function of the whole selection, so
anyone holding a candidate data set can test whether a store holds *that* data set — as with
any content hash, e.g. of the file's bytes before this scheme.

Cost: the scan decodes the whole file with the run's codec once more when the budget session
opens, plus one BLAKE2b of each record's numbers (0.8 µs a record); nothing is cached (a cache
keyed by file metadata could hand a changed file an old identity), so a resumed run digests the
file again. Measured for JSON records: about 4 µs a record at d = 3, 5 µs at d = 20, 21 µs at
d = 100 (decoding dominates) — four seconds per million records at d = 3.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.io.recording import RecordingReader, is_recording
from panpriv.streamer.io.source_url import AdultUrl, FileUrl, KafkaUrl, SyntheticUrl, parse_kafka_url, parse_source_url

IDENTIFICATION_RULE = (
    "records are identified by their data, not by the run: a Kafka record by cluster, topic, partition and "
    "offset, the records of a file (JSONL, CSV, Adult, a recording's messages) by the multiset of their decoded "
    "values, whatever the format, formatting or order; a different selection of records (a split, a subset, a "
    "superset) is different data"
)
"""The identification rule in one sentence, stated with every report, run summary and ``panpriv budget``."""

CONTENT_PREFIX = "records:"
_CHUNK = 4096  # messages digested at a time
_PERSON = b"panpriv-record1"  # BLAKE2b personalisation: the per-record hash of this scheme, version 1
_NAMED_PERSON = b"panpriv-named1"  # the per-record hash of a named-field record's canonical content


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
    """SHA-256 of the file's bytes as the service reads them (decompressed for ``.gz``): the data
    key of files before content identity (``sha256:<hex>``), adopted by the content key when a
    store still holds it (:meth:`panpriv.streamer.budget.store.BudgetStore.adopt`)."""
    digest = hashlib.sha256()
    with _open(path) as handle:
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


# -- content identity ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContentIdentity:
    """A file's records by content: ``key`` (``records:<hex>``, the multiset digest), ``order``
    (the digest of this serialisation's sequence of positions and records) and ``records`` (how
    many records the multiset holds)."""

    key: str
    order: str
    records: int


class ContentDigest:
    """The digests of a sequence of records, fed in file order (module docstring).

    The multiset digest is the sum, modulo 2^256, of a BLAKE2b-256 hash of each record's numbers
    (little-endian float64 features, then the label): order-free and computed in one pass with
    constant memory (an additive multiset hash, Clarke et al. 2003, "Incremental Multiset Hash
    Functions and Their Application to Memory Integrity Checking"). Collisions would only merge two
    data sets (an over-count), never split one. The order digest is BLAKE2b-128 over the sequence
    of (position, record hash).
    """

    def __init__(self) -> None:
        self._sum = 0
        self._order = hashlib.blake2b(digest_size=16, person=b"panpriv-order1")
        self._record = hashlib.blake2b(digest_size=32, person=_PERSON)  # copied per record: cheaper than a new one
        self._named = hashlib.blake2b(digest_size=32, person=_NAMED_PERSON)
        self.records = 0

    def add(self, positions: NDArray[np.int64], X: NDArray[np.float64], y: NDArray[np.float64]) -> None:
        """Records ``(X[i], y[i])`` at ``positions[i]``, in file order. ``X`` and ``y`` are wiped."""
        m = len(y)
        if m == 0:
            return
        rows = np.empty((m, X.shape[1] + 1), dtype="<f8")
        try:
            rows[:, :-1], rows[:, -1] = X, y
            X.fill(0.0)
            y.fill(0.0)
            width = rows.shape[1] * 8
            view = memoryview(rows).cast("B")  # type: ignore[arg-type]  # numpy arrays export the buffer protocol
            self._add_hashed(positions, (view[i * width : (i + 1) * width] for i in range(m)), self._record)
        finally:
            rows.fill(0.0)

    def add_content(self, positions: NDArray[np.int64], contents: Sequence[bytes]) -> None:
        """Named-field records by their canonical content (:func:`panpriv.streamer.io.codec.canonical_record`),
        hashed under their own personalisation: every field of the record, whatever a schema reads."""
        if contents:
            self._add_hashed(positions, iter(contents), self._named)

    def _add_hashed(self, positions: NDArray[np.int64], records: Iterator[Any], prototype: Any) -> None:
        """Add each record's hash (``prototype`` copied and fed the record's bytes) to both digests."""
        hashes: list[bytes] = []
        keep = hashes.append
        for record in records:
            h = prototype.copy()
            h.update(record)
            keep(h.digest())
        m = len(hashes)
        sequence = np.zeros(m, dtype=[("position", "<i8"), ("record", "V32")])
        try:
            joined = b"".join(hashes)
            limbs = np.frombuffer(joined, dtype="<u4").reshape(m, 8).sum(axis=0, dtype=np.uint64)  # < 2^64 for m < 2^32
            self._sum = (self._sum + sum(int(limb) << (32 * k) for k, limb in enumerate(limbs.tolist()))) % (1 << 256)
            sequence["position"] = positions
            sequence["record"] = np.frombuffer(joined, dtype="V32")
            self._order.update(sequence.tobytes())
            self.records += m
        finally:
            sequence.view(np.uint8)[:] = 0

    def identity(self) -> ContentIdentity:
        return ContentIdentity(CONTENT_PREFIX + self._sum.to_bytes(32, "little").hex(), self._order.hexdigest(),
                               self.records)


def _open(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb", buffering=1 << 20)


def _line_messages(path: Path, codec: Codec) -> Iterator[tuple[int, bytes]]:
    """(line index, payload) of every line a line source would hand the codec."""
    header = codec.has_header
    is_record = codec.is_record_line
    with _open(path) as handle:
        for index, line in enumerate(handle):
            if index == 0 and header:
                codec.read_header(line.rstrip(b"\r\n"))
            elif is_record(line):
                yield index, line.rstrip(b"\r\n")


def _digest(messages: Iterator[tuple[int, bytes]], codec: Codec) -> ContentIdentity:
    digest = ContentDigest()
    chunk: list[tuple[int, bytes]] = []

    def flush() -> None:
        values = codec.values([payload for _, payload in chunk])
        where = np.array([position for position, _ in chunk], dtype=np.int64)
        if values.content is not None:
            digest.add_content(where[values.origin], values.content)
        else:
            digest.add(where[values.origin], values.X, values.y)
        chunk.clear()

    for message in messages:
        chunk.append(message)
        if len(chunk) == _CHUNK:
            flush()
    if chunk:
        flush()
    return digest.identity()


def line_file_identity(path: Path, codec: Codec) -> ContentIdentity:
    """The content identity of a JSONL, CSV or Adult file (positions: line indices)."""
    return _digest(_line_messages(path, codec), codec)


@dataclass
class _FrameMap:
    """Where a recording's messages stand in file order, per recorded key, as runs of consecutive
    offsets: ``starts`` (first offset), ``frames`` (its frame index), ``lengths``. Offsets of one
    key increase in file order (``panpriv record`` appends each partition in order)."""

    starts: dict[str, list[int]] = field(default_factory=dict)
    frames: dict[str, list[int]] = field(default_factory=dict)
    lengths: dict[str, list[int]] = field(default_factory=dict)

    def add(self, key: str, offset: int, frame: int) -> None:
        starts, frames, lengths = self.starts.setdefault(key, []), self.frames.setdefault(key, []), self.lengths.setdefault(key, [])
        if starts and starts[-1] + lengths[-1] == offset and frames[-1] + lengths[-1] == frame:
            lengths[-1] += 1
        else:
            starts.append(offset)
            frames.append(frame)
            lengths.append(1)

    def last_below(self, key: str, offset: int) -> int | None:
        """The frame index of the last message of ``key`` with an offset below ``offset``."""
        starts = self.starts.get(key, [])
        r = int(np.searchsorted(starts, offset, side="left")) - 1
        if r < 0:
            return None
        last = min(offset - 1, starts[r] + self.lengths[key][r] - 1)
        return self.frames[key][r] + last - starts[r]

    def first_from(self, key: str, offset: int) -> int | None:
        """The frame index of the first message of ``key`` with an offset at or above ``offset``."""
        starts, lengths = self.starts.get(key, []), self.lengths.get(key, [])
        ends = np.asarray(starts, dtype=np.int64) + np.asarray(lengths, dtype=np.int64)
        r = int(np.searchsorted(ends, offset, side="right"))
        if r >= len(starts):
            return None
        first = max(offset, starts[r])
        return self.frames[key][r] + first - starts[r]


def recording_identity(path: Path, codec: Codec) -> tuple[ContentIdentity, _FrameMap]:
    """The content identity of a recording's messages (positions: frame indices in file order) and
    its frame map."""
    frames = _FrameMap()
    reader = RecordingReader(path)

    def messages() -> Iterator[tuple[int, bytes]]:
        try:
            for index, frame in enumerate(reader.frames()):
                frames.add(frame.key, frame.offset, index)
                yield index, frame.value
        except ValueError as exc:  # a truncated recording
            raise SourceError(str(exc)) from None

    return _digest(messages(), codec), frames


# -- data keys -------------------------------------------------------------------------------------


class DataKeys:
    """Maps the source keys of one run to data keys (module docstring).

    ``prefix``: exact source key → data key (files); ``kafka_cluster``: the cluster of
    ``topic/partition`` keys (Kafka, recordings); ``content``: the content identity of a file or
    recording; ``frames``: a recording's frame map (its Kafka positions → frame indices of the
    content key); ``path``: the file, for the byte digest of stores that predate content keys.
    """

    def __init__(self, prefix: Mapping[str, str] | None = None, kafka_cluster: str | None = None,
                 content: ContentIdentity | None = None, frames: _FrameMap | None = None,
                 path: Path | None = None) -> None:
        self._exact = dict(prefix or {})
        self._cluster = kafka_cluster
        self.content = content
        self._frames = frames
        self._path = path

    def key(self, source_key: str) -> str:
        """The data key of ``source_key``."""
        exact = self._exact.get(source_key)
        if exact is not None:
            return exact
        if self._cluster is not None:  # a topic/partition key
            return f"kafka:{self._cluster}/{source_key}"
        return source_key

    @property
    def orders(self) -> dict[str, str]:
        """The order of each data key charged in a serialisation's own order (content keys)."""
        return {self.content.key: self.content.order} if self.content is not None else {}

    def ranges(self, ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """Data-key ranges of source-key ranges (a recording's also under its content key: the
        frames the ranges read, contiguous in file order)."""
        mapped: dict[str, tuple[int, int]] = {}
        for source_key, (start, stop) in ranges.items():
            key = self.key(source_key)
            a, b = mapped.get(key, (start, stop))
            mapped[key] = (min(a, start), max(b, stop))
        if self._frames is not None and self.content is not None:
            firsts = [self._frames.first_from(k, a) for k, (a, b) in ranges.items() if b > a]
            lasts = [self._frames.last_below(k, b) for k, (a, b) in ranges.items() if b > a]
            first = min((f for f in firsts if f is not None), default=None)
            last = max((f for f in lasts if f is not None), default=None)
            if first is not None and last is not None and last >= first:
                mapped[self.content.key] = (first, last + 1)
        return mapped

    def positions(self, positions: Mapping[str, int]) -> dict[str, int]:
        """Data-key positions of source-key positions (a recording's content position: the frames
        read before them, a prefix of the file)."""
        mapped: dict[str, int] = {}
        for source_key, position in positions.items():
            key = self.key(source_key)
            mapped[key] = max(mapped.get(key, 0), position)
        if self._frames is not None and self.content is not None:
            lasts = [self._frames.last_below(k, p) for k, p in positions.items()]
            mapped[self.content.key] = max((f + 1 for f in lasts if f is not None), default=0)
        return mapped

    def legacy_key(self) -> str | None:
        """The data key a store written before content keys used for this file (``sha256:`` of its
        bytes, positions: line indices), or ``None`` (recordings and other sources had no such key)."""
        if self._path is None or self._frames is not None:
            return None
        return f"sha256:{file_digest(self._path)}"


def data_keys_for(url: str, source: Any, codec: Codec) -> DataKeys:
    """The data keys of the source opened from ``url`` (``source`` is the opened source; for Kafka
    its consumer answers the cluster identity; ``codec`` reads a file's records for its content)."""
    match parse_source_url(url):
        case KafkaUrl():
            return DataKeys(kafka_cluster=source.cluster_identity())
        case AdultUrl(split=split):
            from panpriv.streamer.datasets import adult

            path = Path(adult.TRAIN_PATH if split == "train" else adult.TEST_PATH)
            content = line_file_identity(path, codec)
            return DataKeys({url: content.key}, content=content, path=path)
        case FileUrl(path=path):
            if is_recording(path):
                content, frames = recording_identity(path, codec)
                return DataKeys(kafka_cluster=recording_cluster(RecordingReader(path)), content=content, frames=frames)
            content = line_file_identity(path, codec)
            return DataKeys({f"file:{path.resolve()}": content.key, f"file:{path}": content.key}, content=content,
                            path=path)
        case SyntheticUrl():
            return DataKeys()  # the key (seed, dim) already names the data
