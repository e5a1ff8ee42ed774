"""Batched payloads: many JSON or CSV records in one message, for producers that amortise the
per-message cost (Kafka's per-message overhead, the client's and the codec's per-message work) as
binary batches do (:class:`panpriv.streamer.io.codec.BinaryBatchCodec`), in a text format.

Three formats (``records.format``, ``--format``), each named explicitly:

- ``json-batch`` — a message is a JSON array of records, ``[{"x": [...], "y": 1}, …]`` (or, with
  a schema, ``records.fields``, an array of named-field objects);
- ``ndjson`` — a message is newline-separated JSON records (one ``json`` record a line; blank
  lines and a trailing newline are not records);
- ``csv-batch`` — a message is a block of CSV rows, one ``csv`` record a line (positional rows:
  a schema needs the file's header line, which a message does not carry).

Every record inside a message is read, validated, clipped and rejected by reason exactly as the
same record sent alone in a ``json`` or ``csv`` message (the record codecs of
:mod:`panpriv.streamer.io.codec` decide each record; for ``ndjson`` and ``csv-batch`` they read
each line as they read a message). A reject names its message and counts the message's records
that failed for that reason (``Reject.count``), as for binary batches. A message that cannot be
read as a batch at all — a ``json-batch`` message that is not JSON (``undecodable``) or not an
array (``wrong_type``) — is one reject; a message holding no record (``[]``, or no line that is
not blank) is one ``empty_batch``, as for a binary batch with ``m = 0``.

Why a named format rather than sniffing ``[`` or a newline in a ``json`` message: the format
decides how a malformed message is counted (one ``undecodable`` message, or one record per line),
how many records a message holds (the public length of a recorded stream, :meth:`records_in`),
and it keeps ``json`` exactly what it was — a JSON array sent to a ``json`` topic is still a
``wrong_type`` reject, not silently many records. A producer that changes its framing changes
``--format`` with it.

Memory: the records of a message are decoded together (the per-message float64 matrices are
zeroed once stacked, like the ``json`` and ``csv`` codecs' rows), so a micro-batch of
``source.batch_records`` messages holds that many messages' records; ``source.batch_bytes``
bounds what is decoded at once (docs/privacy.md, "The input path").
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer.config import RecordsConfig
from panpriv.streamer.io.codec import (
    _NUMBERS,
    Codec,
    CsvCodec,
    JsonCodec,
    NamedJsonCodec,
    Parsed,
    Reason,
    Reject,
    _loads,
    _named_content,
    _named_rows,
    _numeric_rows,
    _only_scalars_besides,
    _orjson_loads,
    record_fields,
)

FORMATS = ("json-batch", "ndjson", "csv-batch")
"""The ``records.format`` values whose messages hold many records."""

_WHOLE = sys.maxsize
""":attr:`Codec.prefix_size` of a format whose record count needs the whole message."""


class _LineBatchCodec(Codec):
    """A message holds lines, each read by the record codec ``record_codec`` as it reads a message
    alone (``ndjson``: :class:`JsonCodec` or :class:`NamedJsonCodec`; ``csv-batch``: :class:`CsvCodec`)."""

    prefix_size = _WHOLE

    def __init__(self, records: RecordsConfig, labels_required: bool, record_codec: Codec) -> None:
        super().__init__(records, labels_required)
        self._record_codec = record_codec

    def records_in(self, prefix: bytes) -> int:
        """The message's record lines (0 for an empty message, as a binary batch with m = 0)."""
        return len(_lines(prefix))

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        lines, message, rejects = self._split(payloads)
        return _to_messages(self._record_codec.parse(lines), message, rejects)

    def values(self, payloads: Sequence[bytes]) -> Parsed:
        lines, message, _ = self._split(payloads)
        return _to_messages(self._record_codec.values(lines), message, [])

    @staticmethod
    def _split(payloads: Sequence[bytes]) -> tuple[list[bytes], NDArray[np.int64], list[Reject]]:
        """Every message's record lines, the message of each line, and the empty messages."""
        lines: list[bytes] = []
        counts: list[int] = []
        rejects: list[Reject] = []
        for i, payload in enumerate(payloads):
            found = _lines(payload)
            if not found:
                rejects.append(Reject(i, Reason.EMPTY_BATCH))
            lines.extend(found)
            counts.append(len(found))
        return lines, np.repeat(np.arange(len(payloads), dtype=np.int64), counts), rejects


def _lines(payload: bytes) -> list[bytes]:
    """The record lines of a message: split at ``\\n`` (a ``\\r`` before it dropped), blank lines left out."""
    return [line.rstrip(b"\r") for line in payload.split(b"\n") if line.strip()]


class JsonArrayCodec(Codec):
    """``json-batch``: a message is a JSON array of records, each decided as :class:`JsonCodec`
    decides a ``json`` message (or, with a schema, :class:`NamedJsonCodec`).

    With orjson (``fast``, as :class:`JsonCodec`), a message is taken from orjson's reading only
    when every element is plainly a valid record — an object whose ``x`` is a list of ``dim``
    numbers and whose label is a number, with no other nested value (named records: an object with
    no nested value) — which the standard library reads as the same numbers; any other message is
    decided whole by the standard-library path, so both paths reject and accept alike (a message
    nested too deep for :mod:`json` is ``undecodable`` on both)."""

    prefix_size = _WHOLE

    def __init__(self, records: RecordsConfig, labels_required: bool = True, fast: bool | None = None) -> None:
        super().__init__(records, labels_required)
        self.fast: bool = JsonCodec(records, labels_required, fast).fast  # same choice, same errors, one log line

    def records_in(self, prefix: bytes) -> int:
        """The array's length (0 for ``[]``, 1 for a message that is not an array): orjson's
        reading when it reads an array (the standard library's costs about 5× as much, and this
        runs over a whole recording before it is replayed), else the standard library's. They
        differ only for an array nested deeper than :mod:`json` parses (about 1,000 levels) and
        within orjson's 1,024, counted here by its elements and rejected once as ``undecodable``."""
        try:
            fast = _orjson_loads(prefix) if self.fast else None
        except ValueError:
            fast = None
        if type(fast) is list:
            return len(fast)
        elements = self._elements(prefix)
        if isinstance(elements, Reason):
            return 0 if elements is Reason.EMPTY_BATCH else 1
        return len(elements)

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        if self.schema is not None:
            objects, message, rejects = self._objects(payloads)
            return _to_messages(_named_rows(objects, self.schema, self.dim, self.labels_required, text=False), message, rejects)
        matrices: list[NDArray[np.float64]] = []
        labels: list[float] = []
        origin: list[int] = []
        rejects = []
        for i, payload in enumerate(payloads):
            plain = self._plain_records(payload) if self.fast else None
            read = self._records(payload) if plain is None else plain
            if isinstance(read, Reason):
                rejects.append(Reject(i, read))
                continue
            matrix, message_labels, failed = read
            matrices.append(matrix)
            labels.extend(message_labels)
            origin.extend([i] * len(message_labels))
            rejects.extend(Reject(i, reason, count) for reason, count in failed.items())
        X = np.vstack(matrices) if matrices else np.empty((0, self.dim))
        for matrix in matrices:  # each message's rows: zeroed, not left to numpy's cache of small buffers
            matrix.fill(0.0)
        return Parsed(X, np.array(labels, dtype=np.float64), np.array(origin, dtype=np.int64), tuple(rejects), owned=True)

    def values(self, payloads: Sequence[bytes]) -> Parsed:
        if self.schema is not None:
            objects, message, _ = self._objects(payloads)
            return _to_messages(_named_content(objects), message, [])
        return super().values(payloads)

    def _plain_records(self, payload: bytes) -> tuple[NDArray[np.float64], list[float], Counter[Reason]] | None:
        """orjson's reading of a message whose every element is plainly a valid record: its rows
        and labels; ``None`` (the standard library decides) for any other message."""
        try:
            elements = _orjson_loads(payload)
        except ValueError:
            return None
        if type(elements) is not list or not elements:
            return None
        return _plain_rows(elements, self.records.x_field, self.records.y_field, self.dim)

    def _records(self, payload: bytes) -> tuple[NDArray[np.float64], list[float], Counter[Reason]] | Reason:
        """The standard library's reading of a message: the rows and labels of its valid records
        and the count of its rejected records by reason, or why the whole message is rejected."""
        elements = self._elements(payload)
        if isinstance(elements, Reason):
            return elements
        x_field, y_field, dim = self.records.x_field, self.records.y_field, self.dim
        rows: list[list[object]] = []
        labels: list[float] = []
        failed: Counter[Reason] = Counter()
        for obj in elements:
            record = record_fields(obj, x_field, y_field, dim, self.labels_required)
            if isinstance(record, Reason):
                failed[record] += 1
                continue
            rows.append(record[0])
            labels.append(record[1])
        matrix, bad = _numeric_rows(rows, dim)
        for j, reason in bad:
            failed[reason] += 1
        if bad:
            dropped = {j for j, _ in bad}
            labels = [label for j, label in enumerate(labels) if j not in dropped]
        return matrix, labels, failed

    @staticmethod
    def _elements(payload: bytes) -> list[Any] | Reason:
        """The message's array read by the standard library (:func:`panpriv.streamer.io.codec._loads`),
        or why it is not a batch: ``undecodable``, ``wrong_type`` (not an array), ``empty_batch``."""
        try:
            elements = _loads(payload)
        except (ValueError, RecursionError):
            return Reason.UNDECODABLE
        if type(elements) is not list:
            return Reason.WRONG_TYPE
        return elements if elements else Reason.EMPTY_BATCH

    def _objects(self, payloads: Sequence[bytes]) -> tuple[list[dict[str, Any] | Reason], NDArray[np.int64], list[Reject]]:
        """Named records: every element of every message as an object (or ``wrong_type``), the
        message of each, and the messages rejected whole. orjson's reading is taken when no
        element holds a nested value (:class:`NamedJsonCodec`'s rule), else the standard library's."""
        objects: list[dict[str, Any] | Reason] = []
        counts: list[int] = []
        rejects: list[Reject] = []
        for i, payload in enumerate(payloads):
            elements: list[Any] | Reason | None = None
            if self.fast:
                try:
                    read = _orjson_loads(payload)
                except ValueError:
                    read = None
                if type(read) is list and read and all(
                    type(obj) is dict and not any(type(v) is list or type(v) is dict for v in obj.values()) for obj in read
                ):
                    elements = read
            if elements is None:
                elements = self._elements(payload)
            if isinstance(elements, Reason):
                rejects.append(Reject(i, elements))
                counts.append(0)
                continue
            objects.extend(obj if type(obj) is dict else Reason.WRONG_TYPE for obj in elements)
            counts.append(len(elements))
        return objects, np.repeat(np.arange(len(payloads), dtype=np.int64), counts), rejects


def _plain_rows(
    elements: Sequence[object], x_field: str, y_field: str, dim: int
) -> tuple[NDArray[np.float64], list[float], Counter[Reason]] | None:
    """The rows and labels of records read by orjson when every one is plainly valid — an object
    whose ``x`` is a list of ``dim`` numbers and whose label is a number, no other value nested —
    which the standard library reads as the same numbers (:meth:`JsonCodec.parse`); ``None``
    otherwise. The float64 matrix is the caller's to zero; an integer matrix made on the way is
    zeroed here."""
    rows: list[object] = []
    labels: list[float] = []
    for obj in elements:
        if type(obj) is not dict:
            return None
        x = obj.get(x_field)
        label = obj.get(y_field)
        if not (type(x) is list and len(x) == dim and type(label) in _NUMBERS
                and (len(obj) == 2 or _only_scalars_besides(obj, x_field, y_field))):
            return None
        rows.append(x)
        labels.append(float(label))  # type: ignore[arg-type]  # an int or a float, finite
    try:
        matrix = np.array(rows)
    except (ValueError, TypeError, OverflowError):
        return None
    if matrix.dtype.kind not in "fiub" or matrix.shape != (len(rows), dim):
        return None  # a non-number in some x (or an integer beyond 64 bits): json decides
    values = matrix.astype(np.float64, copy=False)
    if values is not matrix:  # integers or booleans read: their matrix zeroed too
        matrix.fill(0)
    return values, labels, Counter()


class NdjsonCodec(_LineBatchCodec):
    """``ndjson``: each line read as :class:`JsonCodec` reads a message. With orjson, a message
    whose every line is plainly a valid record (:func:`_plain_rows`) is stacked in one array, as
    ``json-batch`` does; any other message is decided line by line by the record codec."""

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        record_codec = self._record_codec
        if not isinstance(record_codec, JsonCodec) or not record_codec.fast:  # named fields, or no orjson
            return super().parse(payloads)
        x_field, y_field, dim = self.records.x_field, self.records.y_field, self.dim
        matrices: list[NDArray[np.float64]] = []
        labels: list[NDArray[np.float64]] = []
        origin: list[NDArray[np.int64]] = []
        rejects: list[Reject] = []
        for i, payload in enumerate(payloads):
            lines = _lines(payload)
            if not lines:
                rejects.append(Reject(i, Reason.EMPTY_BATCH))
                continue
            try:
                plain = _plain_rows([_orjson_loads(line) for line in lines], x_field, y_field, dim)
            except ValueError:
                plain = None
            if plain is not None:
                matrices.append(plain[0])
                labels.append(np.array(plain[1]))
                origin.append(np.full(len(plain[1]), i, dtype=np.int64))
                continue
            parsed = _to_messages(record_codec.parse(lines), np.full(len(lines), i, dtype=np.int64), [])
            matrices.append(np.asarray(parsed.X, dtype=np.float64))
            labels.append(parsed.y)
            origin.append(parsed.origin)
            rejects.extend(parsed.rejects)
        X = np.vstack(matrices) if matrices else np.empty((0, dim))
        for matrix in matrices:  # each message's rows: zeroed once stacked
            matrix.fill(0.0)
        y = np.concatenate(labels) if labels else np.empty(0)
        for part in labels:
            part.fill(0.0)
        return Parsed(X, y, np.concatenate(origin) if origin else np.empty(0, dtype=np.int64), tuple(rejects), owned=True)


def _to_messages(parsed: Parsed, message: NDArray[np.int64], rejects: list[Reject]) -> Parsed:
    """A parse of the records of many messages (record ``j`` of message ``message[j]``) as a parse
    of the messages: origins and rejects named by message, a message's rejects of one reason
    merged into one :class:`Reject` of that count, after ``rejects`` of the whole messages."""
    counts: Counter[tuple[int, Reason]] = Counter()
    for reject in parsed.rejects:
        counts[int(message[reject.index]), reject.reason] += reject.count
    merged = rejects + [Reject(i, reason, count) for (i, reason), count in counts.items()]
    merged.sort(key=lambda r: r.index)
    origin = message[np.asarray(parsed.origin, dtype=np.int64)]
    return Parsed(parsed.X, parsed.y, origin, tuple(merged), parsed.owned, parsed.content)


def encode_records(fmt: str, X: NDArray[np.floating], y: NDArray[np.floating], x_field: str = "x", y_field: str = "y") -> bytes:
    """One message of batched format ``fmt`` holding the rows of ``X`` (m × d) and labels ``y``
    (float64 carried exactly: JSON and CSV write each number's shortest repr): for ``panpriv
    produce``, the benchmarks and tests."""
    rows, labels = np.asarray(X, dtype=np.float64).tolist(), np.asarray(y, dtype=np.float64).tolist()
    if fmt == "json-batch":
        return json.dumps([{x_field: row, y_field: label} for row, label in zip(rows, labels, strict=True)]).encode()
    if fmt == "ndjson":
        return "\n".join(json.dumps({x_field: row, y_field: label}) for row, label in zip(rows, labels, strict=True)).encode()
    if fmt == "csv-batch":
        return "\n".join(",".join(map(repr, [*row, label])) for row, label in zip(rows, labels, strict=True)).encode()
    raise ValueError(f"not a batched format: {fmt!r}")


def make_batch_codec(records: RecordsConfig, labels_required: bool = True) -> Codec:
    """The codec of a batched format (:data:`FORMATS`), for :func:`panpriv.streamer.io.formats.make_codec`."""
    if records.format == "json-batch":
        return JsonArrayCodec(records, labels_required)
    if records.format == "ndjson":
        record_codec: Codec = (JsonCodec if records.fields is None else NamedJsonCodec)(records, labels_required)
        return NdjsonCodec(records, labels_required, record_codec)
    if records.format == "csv-batch":
        return _LineBatchCodec(records, labels_required, CsvCodec(records, labels_required))
    raise ValueError(f"not a batched format: {records.format!r}")
