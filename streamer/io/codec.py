"""Record decoding and validation: bytes in, clipped arrays and counted rejects out.

Four encodings of a record (``records.format``):

- ``json`` — one object per message/line: ``{"x": [x_1, …, x_d], "y": label}`` (field names
  configurable). JSON ``true``/``false`` inside ``x`` read as 1/0 (numpy's conversion), consistently
  for every record; a label must be a JSON number.
- ``csv`` — one row per message/line: ``d`` feature fields and one label field (the last by
  default, ``records.csv_label_column``).
- ``binary`` — a *batch* of records per message, for throughput (:func:`encode_batch`):
  a 12-byte header ``b"PPB1"``, dtype code (1 = float32, 2 = float64), a reserved byte, ``d`` (u16),
  ``m`` (u32), then ``X`` (``m × d``, row-major) and ``y`` (``m``), little-endian.
- ``adult`` — a line of the UCI Adult data, encoded by :mod:`panpriv.streamer.datasets.adult` from the
  public schema only.

Many JSON or CSV records per message (``json-batch``, ``ndjson``, ``csv-batch``) are
:mod:`panpriv.streamer.io.batch_formats`; :func:`panpriv.streamer.io.formats.make_codec` builds
the codec of any format.

Validation. A record that cannot be used is *rejected* with one reason from :class:`Reason`
(undecodable bytes, a missing field, a wrong type, a wrong dimension, a NaN/inf or a number beyond
float64's range such as a 400-digit JSON integer, a label outside the declared set or range, a
binary batch of no record — counted once per message) and counted; it never reaches the learner
and never stops the service. Subnormal numbers and −0 are ordinary finite values and are accepted.
Valid records have their features clipped to the declared bound, ``x ← x · min(1, R/‖x‖₂)``, before
any learner sees them, so the sensitivity the learner's noise is calibrated to holds for every
input. Rejecting and clipping are decided per record from that record alone, so how a stream is cut
into messages or micro-batches never changes which records are learned.

Nothing here logs or returns record contents: a reject carries the index of its message and a
reason, not the value that failed.

JSON decoders. When ``orjson`` is importable (the ``fast-json`` extra) :class:`JsonCodec` parses
with it — about 3× the standard library's decode rate (``benchmarks/json_decode.py``) — and
otherwise with :mod:`json`; the choice is logged once at DEBUG (``panpriv.codec``). The two paths
make identical decisions and arrays for every input (see :meth:`JsonCodec.decode`): orjson's
reading is used only for plainly valid records; every other message — whatever orjson refuses
(``NaN`` and ``Infinity`` literals, which :mod:`json` reads and validation then rejects as
``non_finite``; numbers beyond float64's range; BOMs, UTF-16/32, lone surrogates; …) or finds
malformed — is decided by the standard-library path.
"""

from __future__ import annotations

import abc
import csv
import json
import logging
import math
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.schema import MISSING_FIELD, FeatureSchema
from panpriv.streamer.config import RecordsConfig
from panpriv.streamer.datasets import adult
from panpriv.streamer.errors import ConfigError

try:  # the optional fast JSON parser (extra ``fast-json``)
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised where orjson is not installed
    _orjson = None  # type: ignore[assignment]

log = logging.getLogger("panpriv.codec")


class Reason(StrEnum):
    """Why a record was rejected (the ``reason`` label of ``panpriv_records_rejected_total``)."""

    UNDECODABLE = "undecodable"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    WRONG_DIMENSION = "wrong_dimension"
    NON_FINITE = "non_finite"
    LABEL_OUT_OF_RANGE = "label_out_of_range"
    UNKNOWN_FIELD = "unknown_field"
    UNKNOWN_CATEGORY = "unknown_category"
    EMPTY_BATCH = "empty_batch"
    """A binary batch message that holds no record (``m = 0``): nothing to learn, counted once."""


@dataclass(frozen=True)
class Reject:
    """``count`` records of message ``index`` rejected for ``reason`` (count > 1 only for batches)."""

    index: int
    reason: Reason
    count: int = 1


@dataclass(frozen=True)
class Decoded:
    """The valid records of a micro-batch, clipped, and the rejects.

    ``X`` has shape (m, dim), ``y`` shape (m,), both float64, in message order; ``origin[i]`` is the
    index of the message that row ``i`` came from (several rows per message for binary batches).
    """

    X: NDArray[np.float64]
    y: NDArray[np.float64]
    rejects: tuple[Reject, ...]
    origin: NDArray[np.int64]

    def reject_counts(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for reject in self.rejects:
            counts[reject.reason.value] += reject.count
        return dict(counts)


@dataclass(frozen=True)
class Parsed:
    """What a format reads from a micro-batch before values are validated: rows ``X`` (m, dim),
    labels ``y``, the message of each row ``origin``, the messages already rejected by the format
    (undecodable, missing fields, …) and whether ``X`` is the codec's own array (``owned``: it
    may then be clipped in place)."""

    X: NDArray[np.float64]
    y: NDArray[np.float64]
    origin: NDArray[np.int64]
    rejects: tuple[Reject, ...]
    owned: bool = False
    content: tuple[bytes, ...] | None = None
    """:meth:`Codec.values` of named-field records only: each record's canonical content
    (:func:`canonical_record`), which identifies it instead of ``X`` and ``y``."""


class Codec(abc.ABC):
    """Decode messages of one format and validate them against ``records``.

    ``labels_required=False`` (``panpriv predict``): a record without a label is valid (its label
    reads as NaN) and labels are not checked against the domain — scoring needs the features
    only."""

    def __init__(self, records: RecordsConfig, labels_required: bool = True) -> None:
        if records.dim is None or records.feature_bound is None:
            raise ValueError("Codec needs a resolved RecordsConfig (dim and feature_bound set)")
        self.records = records
        self.dim: int = records.dim
        self.bound: float = records.feature_bound
        self.labels_required = labels_required
        self._labels = None if records.label_values is None else np.array(records.label_values)
        self.schema: FeatureSchema | None = None if records.fields is None else FeatureSchema.from_dict(records.fields)
        self._scratch: NDArray[np.float64] = np.zeros(0)  # the clip's work matrix (:meth:`_work`)

    @property
    def has_header(self) -> bool:
        """Whether a line file of this format starts with a header line (``records.csv_header``):
        sources hand it to :meth:`read_header` instead of decoding it."""
        return False

    def read_header(self, line: bytes) -> None:
        """The header line of a file (:attr:`has_header`); the default ignores it."""

    def record_ids(self, payloads: Sequence[bytes]) -> list[Any] | None:
        """The value of the schema's id field in each message (``None`` where it has none or does
        not decode), for ``panpriv predict``; ``None`` when the format names no id field."""
        return None

    @abc.abstractmethod
    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        """Read the numbers of one micro-batch of messages (the format's own rules), before any
        validation of values."""

    def decode(self, payloads: Sequence[bytes]) -> Decoded:
        """Decode, validate and clip one micro-batch of messages."""
        parsed = self.parse(payloads)
        return self.validate(parsed.X, parsed.y, parsed.origin, parsed.rejects, owned=parsed.owned)

    def decode_groups(self, payloads: Sequence[bytes], max_bytes: int) -> Iterator[tuple[Decoded, int]]:
        """``payloads`` decoded in consecutive groups of messages of at most ``max_bytes`` payload
        bytes each (at least one message), with each group's first message index: the decoded
        float64 arrays of one group are in memory at a time, whatever the message packing (a Kafka
        poll is bounded in messages, not bytes). ``panpriv run``'s driver and the scale-out worker
        decode through it."""
        first, size = 0, 0
        for index, payload in enumerate(payloads):
            if size and size + len(payload) > max_bytes:
                yield self.decode(payloads[first:index]), first
                first, size = index, 0
            size += len(payload)
        if first < len(payloads):
            yield self.decode(payloads[first:]), first

    def values(self, payloads: Sequence[bytes]) -> Parsed:
        """The records of one micro-batch as the data, independent of the run's settings: every
        message the format reads as ``dim`` finite features and a finite label, neither clipped
        nor checked against the label domain, with ``-0.0`` read as ``0.0`` (``X``, ``y`` and
        ``origin`` of the kept rows; ``rejects`` and ``owned`` unused). What identifies a file's
        records by content (:mod:`panpriv.streamer.sources.identity`): two encodings of the same
        numbers give the same rows whatever the run's ``feature_bound`` or labels."""
        parsed = self.parse(payloads)
        X = np.asarray(parsed.X, dtype=np.float64).reshape(len(parsed.y), self.dim)
        y = np.asarray(parsed.y, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            finite = np.isfinite(X).all(axis=1) & np.isfinite(y)
        X, y = X[finite] + 0.0, y[finite] + 0.0  # a copy; -0.0 + 0.0 == +0.0
        return Parsed(X, y, np.asarray(parsed.origin, dtype=np.int64)[finite], (), True)

    def is_record_line(self, line: bytes) -> bool:
        """For line-based files: False for lines that are not records (blank lines)."""
        return bool(line.strip())

    prefix_size = 0
    """Bytes of a message that :meth:`records_in` needs (0: every message is one record)."""

    def records_in(self, prefix: bytes) -> int:
        """How many records a message holds, from its first :attr:`prefix_size` bytes alone (for
        the public length n of a recorded stream): 1 per message, except for binary batches."""
        return 1

    def validate(
        self,
        X: NDArray[np.float64],
        y: NDArray[np.float64],
        origin: NDArray[np.int64],
        rejects: Sequence[Reject],
        owned: bool = False,
    ) -> Decoded:
        """Reject non-finite records and out-of-range labels, clip the rest; ``origin[i]`` is the
        message index of row ``i``. ``rejects`` (from decoding) is extended and returned sorted.
        ``owned``: ``X`` was made by the codec for this call and may be clipped in place.

        One pass over ``X`` computes every row's squared norm; a NaN or an infinity makes it
        non-finite, so only those (rare) rows are checked element by element (a huge finite row
        can overflow the square), and the norms are reused by the clip."""
        X = np.asarray(X, dtype=np.float64).reshape(len(y), self.dim)
        y = np.asarray(y, dtype=np.float64)
        origin = np.asarray(origin, dtype=np.int64)
        squares = np.einsum("ij,ij->i", X, X)
        finite = np.isfinite(squares)
        overflowed = np.zeros(len(y), dtype=bool)
        if not finite.all():
            suspect = np.flatnonzero(~finite)
            overflowed[suspect] = np.isfinite(X[suspect]).all(axis=1)
            finite |= overflowed
        if not self.labels_required:  # scoring: any label or none (NaN) is fine
            in_range = np.ones(len(y), dtype=bool)
        elif self._labels is not None:
            finite &= np.isfinite(y)
            in_range = np.isin(y, self._labels)
        else:
            finite &= np.isfinite(y)
            in_range = (y >= self.records.label_min) & (y <= self.records.label_max)
        rejects = list(rejects)
        for mask, reason in ((~finite, Reason.NON_FINITE), (finite & ~in_range, Reason.LABEL_OUT_OF_RANGE)):
            if mask.any():
                indices, counts = np.unique(origin[mask], return_counts=True)
                rejects.extend(Reject(int(i), reason, int(c)) for i, c in zip(indices, counts))
        keep = finite & in_range
        if not keep.all():
            kept = X[keep], y[keep], origin[keep], squares[keep], overflowed[keep]
            if owned:  # the codec's own arrays of the rejected and accepted rows: zeroed, not just dropped
                X.fill(0.0)
                y.fill(0.0)
            squares.fill(0.0)
            X, y, origin, squares, overflowed = kept
            owned = True
        norms = np.sqrt(squares)
        squares.fill(0.0)  # per-record squared norms: clean data (docs/privacy.md, "The input path")
        if overflowed.any():
            if not owned:
                X, owned = X.copy(), True
            X[overflowed] = _onto_sphere(X[overflowed], self.bound)
            norms[overflowed] = self.bound
        X = _clip(X, norms, self.bound, in_place=owned, work=self._work(min(len(X), clip_block_rows(self.dim))))
        rejects.sort(key=lambda r: r.index)
        return Decoded(X, y, tuple(rejects), origin)

    def _work(self, rows: int) -> NDArray[np.float64]:
        """A zeroed ``rows`` × ``dim`` work matrix for the clip's factors (one block of
        :func:`clip_block_rows`), kept between micro-batches (the clip zeroes it after use). A fresh
        matrix per micro-batch was the largest cost of validating binary batches: glibc returns a
        freed block of megabytes to the operating system and the next one is faulted in page by
        page — 16,384 rows at d = 20 validated in 3.4 ms instead of 0.8 ms (issue 37)."""
        size = rows * self.dim
        if self._scratch.size < size:
            self._scratch = np.zeros(max(size, 2 * self._scratch.size))
        return self._scratch[:size].reshape(rows, self.dim)

    def validate_arrays(self, X: NDArray[np.float64], y: NDArray[np.float64]) -> Decoded:
        """Validate records that arrive as arrays (the synthetic source); row ``i`` is message ``i``."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.dim:
            return Decoded(
                np.empty((0, self.dim)), np.empty(0), (Reject(0, Reason.WRONG_DIMENSION, len(y)),), np.empty(0, dtype=np.int64)
            )
        return self.validate(X, y, np.arange(len(y)), [])


CLIP_BLOCK_BYTES = 1 << 20
"""Bytes of clip factors written and multiplied at a time (:func:`clip_block_rows`, 1 MiB): small enough
to stay in a core's cache between the write and the multiply."""


def clip_block_rows(dim: int) -> int:
    """Rows of one block of the clip (:func:`_clip`): :data:`CLIP_BLOCK_BYTES` of float64 factors,
    at least 256 rows (fewer numpy calls per row at small ``dim``). A rule on ``dim`` alone."""
    return max(256, CLIP_BLOCK_BYTES // (8 * dim))


def clip_rows(X: NDArray[np.float64], bound: float) -> NDArray[np.float64]:
    """Scale every row with ‖x‖₂ > ``bound`` onto the sphere of radius ``bound`` (a new array
    if any row changes; rows inside the ball are returned unchanged)."""
    if X.size == 0:
        return X
    work = np.empty((min(len(X), clip_block_rows(X.shape[1])), X.shape[1]))
    return _clip(X, np.sqrt(np.einsum("ij,ij->i", X, X)), bound, in_place=False, work=work)


def _clip(
    X: NDArray[np.float64], norms: NDArray[np.float64], bound: float, in_place: bool, work: NDArray[np.float64]
) -> NDArray[np.float64]:
    """:func:`clip_rows` given the rows' norms: rows with norm > ``bound`` are multiplied by
    ``bound/norm``, the others by exactly 1 (unchanged); in place or into a copy. Every row is
    multiplied, clipped or not, so a micro-batch's decoding time does not depend on whether a
    record needed clipping (docs/privacy.md, "Timing"); the factors (in ``work``: a block of rows
    of ``X``'s width, filled and multiplied block by block, so it stays in cache — a work matrix
    the size of ``X`` made the clip of 16,384 rows take 0.95 ms instead of 0.67 at d = 100 and
    18.5 instead of 9.3 at d = 1000) and the norms are zeroed. The products are those of one
    matrix of factors: bitwise the same result."""
    scale = np.divide(bound, norms, out=np.ones_like(norms), where=norms > bound)
    clipped = X if in_place else np.empty_like(X)
    block = max(1, len(work))
    for start in range(0, len(X), block):
        stop = min(len(X), start + block)
        factors = work[: stop - start]
        np.copyto(factors, scale[start:stop, None])  # a plain assignment: no iteration buffer keeps the factors
        np.multiply(X[start:stop], factors, out=clipped[start:stop])
    for array in (work, scale, norms):
        array.fill(0.0)
    return clipped


def _onto_sphere(X: NDArray[np.float64], bound: float) -> NDArray[np.float64]:
    """Rows whose squares overflow (finite entries ≳ 1e154, so ‖x‖ ≫ ``bound``) scaled onto the
    sphere of radius ``bound`` without forming ‖x‖, which itself may exceed the largest float:
    x·bound/‖x‖ = (x/m)·bound/‖x/m‖ with m = max|x_i| (1 ≤ ‖x/m‖ ≤ √d)."""
    unit = X / np.abs(X).max(axis=1)[:, None]
    return unit * (bound / np.sqrt(np.einsum("ij,ij->i", unit, unit)))[:, None]


_MISSING = object()


FAST_JSON_AVAILABLE: bool = _orjson is not None
"""Whether ``orjson`` is importable, so :class:`JsonCodec` parses with it by default."""

_announced: set[str] = set()


class JsonCodec(Codec):
    """``{"x": [...], "y": label}`` per message.

    ``fast``: read messages with ``orjson`` first or only with the standard library
    (:func:`_read_record`); ``None`` (the default) picks orjson when it is importable. Both
    give the same :class:`Decoded` for every micro-batch: the orjson path only ever *accepts* a
    message — one whose record is plainly valid, which json reads as the same numbers — and hands
    every other message to the standard-library path, which decides it. ``fast=False`` exists so
    tests can compare the two (and to rule orjson out); ``fast=True`` raises if orjson is missing."""

    def __init__(self, records: RecordsConfig, labels_required: bool = True, fast: bool | None = None) -> None:
        super().__init__(records, labels_required)
        if fast is None:
            fast = FAST_JSON_AVAILABLE
        elif fast and not FAST_JSON_AVAILABLE:
            raise ImportError("JsonCodec(fast=True) needs orjson: pip install 'panpriv[fast-json]'")
        self.fast: bool = fast
        name = "orjson" if fast else "json (standard library)"
        if name not in _announced:
            _announced.add(name)
            log.debug("JSON records decoded with %s", name)

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        """Read one micro-batch.

        With orjson, a message's record is taken from orjson's reading only when that cannot change
        the outcome; every other message is read by :func:`_read_record` (the standard library).
        orjson parses a subset of what ``json.loads`` parses (strict RFC 8259 UTF-8: no BOM, no
        ``NaN``/``Infinity``, no lone surrogates, no number beyond float64's range) and on that
        subset returns the same values, but for one difference decoding erases: an integer beyond
        64 bits comes back as the nearest float64, which is what ``float()`` makes of the integer
        json returns (both round to nearest, ties to even). Duplicate keys keep the last value in
        both. What orjson parses and json may not is deep nesting: json raises RecursionError near
        the interpreter's recursion limit (about 1,000 levels, less the caller's stack), orjson only
        beyond 1,024. So orjson's record is taken only when plainly well formed — an object whose
        ``x`` is a list of ``dim`` values, whose label is a number and whose other values are not
        lists or objects — and :func:`_numeric_rows` then finds every ``x`` value a number (two
        levels of nesting, which json parses too); otherwise json decides that message. Everything
        orjson refuses (``NaN`` and ``Infinity``, which json reads and validation rejects as
        ``non_finite``; ``1e400`` and 400-digit integers; BOMs, UTF-16; …) or finds malformed is
        decided by the standard-library path alone, reasons included.

        A micro-batch whose every message is plainly valid — the common case — is read by
        :meth:`_parse_plain`, whole-batch checks instead of a Python loop per message; any other
        goes through the loop below, which decides every message alone."""
        objects: list[Any] | None = None  # orjson's reading of every message, when it reads them all
        if self.fast:
            try:
                objects = list(map(_orjson_loads, payloads))
            except ValueError:  # orjson.JSONDecodeError: some message is for the loop's json to decide
                objects = None
            plain = None if objects is None else self._parse_plain(objects)
            if plain is not None:
                return plain
        x_field, y_field, dim, fast = self.records.x_field, self.records.y_field, self.dim, self.fast
        loads = _orjson_loads
        rows: list[list[object]] = []
        labels: list[float] = []
        origin: list[int] = []
        rejects: list[Reject] = []
        for i, payload in enumerate(payloads):
            if fast:  # inline rather than a call per message (about 10 % of the decode at d = 20)
                if objects is not None:  # read once, by the whole-batch attempt
                    obj = objects[i]
                else:
                    try:
                        obj = loads(payload)
                    except ValueError:  # orjson.JSONDecodeError: json decides
                        obj = None
                if type(obj) is dict:
                    x = obj.get(x_field)
                    label = obj.get(y_field)
                    if (
                        type(x) is list and len(x) == dim and type(label) in _NUMBERS
                        and (len(obj) == 2 or _only_scalars_besides(obj, x_field, y_field))
                    ):
                        rows.append(x)
                        labels.append(float(label))  # type: ignore[arg-type]  # an int or a float, finite
                        origin.append(i)
                        continue
            read = _read_record(payload, x_field, y_field, dim, self.labels_required)
            if isinstance(read, Reason):
                rejects.append(Reject(i, read))
                continue
            rows.append(read[0])
            labels.append(read[1])
            origin.append(i)
        X, bad = _numeric_rows(rows, dim)
        if bad:
            if fast:  # a row orjson read holds a non-number: json decides (it may not parse the message at all)
                bad = [(j, self._stdlib_reason(payloads[origin[j]], reason)) for j, reason in bad]
            rejects.extend(Reject(origin[j], reason) for j, reason in bad)
            keep = np.ones(len(rows), dtype=bool)
            keep[[j for j, _ in bad]] = False
            labels = [v for v, k in zip(labels, keep) if k]
            origin = [o for o, k in zip(origin, keep) if k]
        return Parsed(X, np.array(labels, dtype=np.float64), np.array(origin, dtype=np.int64), tuple(rejects), owned=True)

    def _parse_plain(self, objects: list[Any]) -> Parsed | None:
        """:meth:`parse` of a micro-batch whose every message orjson read (``objects``) as a plainly
        valid record (an object whose ``x`` is a list of ``dim`` numbers and whose label is a number,
        with only scalars besides), or ``None`` — the same records, decided by the same rules, with
        checks over the whole batch (``set(map(…))``, one ``np.array``) instead of a loop per
        message: the loop cost about 0.7 µs a record at d = 20 beside orjson's 1 µs (issue 37)."""
        x_field, y_field = self.records.x_field, self.records.y_field
        try:
            rows = [o[x_field] for o in objects]  # not an object: TypeError
            labels = [o[y_field] for o in objects]
        except (KeyError, TypeError):
            return None
        if not objects or set(map(type, objects)) != {dict} or set(map(type, rows)) != {list}:
            return None
        if set(map(len, rows)) != {self.dim} or not set(map(type, labels)) <= {int, float}:
            return None
        if set(map(len, objects)) != {2} and not all(_only_scalars_besides(o, x_field, y_field) for o in objects):
            return None
        try:
            X = np.array(rows)
        except (ValueError, TypeError):
            return None
        if X.dtype.kind not in "fiub" or X.shape != (len(rows), self.dim):  # a string, a null, a nested list
            return None
        y = np.array(labels, dtype=np.float64)
        return Parsed(X.astype(np.float64, copy=False), y, np.arange(len(rows), dtype=np.int64), (), owned=True)

    def _stdlib_reason(self, payload: bytes, reason: Reason) -> Reason:
        """Why the standard-library path rejects ``payload`` (``reason``, found on orjson's reading,
        should it — impossibly — accept it: a reject is never turned into an accept)."""
        record = _read_record(payload, self.records.x_field, self.records.y_field, self.dim, self.labels_required)
        if isinstance(record, Reason):
            return record
        values = _numeric_row(record[0], self.dim)
        return values if isinstance(values, Reason) else reason


def _read_record(
    payload: bytes, x_field: str, y_field: str, dim: int, label_required: bool = True
) -> tuple[list[object], float] | Reason:
    """One message read by the standard library (:func:`_loads`): its ``x`` list (of length
    ``dim``, elements not yet checked) and label, or why it is rejected (without
    ``label_required``, a missing label reads as NaN)."""
    try:
        obj = _loads(payload)
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError; absurd nesting
        return Reason.UNDECODABLE
    return record_fields(obj, x_field, y_field, dim, label_required)


def record_fields(
    obj: object, x_field: str, y_field: str, dim: int, label_required: bool = True
) -> tuple[list[object], float] | Reason:
    """A decoded JSON value as a record (:func:`_read_record` after parsing; also each element of
    a ``json-batch`` message, :mod:`panpriv.streamer.io.batch_formats`): its ``x`` list and label,
    or why it is rejected."""
    if type(obj) is not dict:
        return Reason.WRONG_TYPE
    x = obj.get(x_field, _MISSING)
    label = obj.get(y_field, _MISSING)
    if label is _MISSING and not label_required:
        label = math.nan
    if x is _MISSING or label is _MISSING:
        return Reason.MISSING_FIELD
    if type(x) is not list or type(label) not in (int, float):
        return Reason.WRONG_TYPE
    if len(x) != dim:
        return Reason.WRONG_DIMENSION
    try:
        return x, float(label)
    except OverflowError:  # an integer label beyond float64's range (more than 308 digits)
        return Reason.NON_FINITE


_NUMBERS = (int, float)


def _only_scalars_besides(obj: dict[Any, Any], x_field: str, y_field: str) -> bool:
    """True if no value of ``obj`` but its ``x`` and label is a list or an object (which could be
    nested deeper than json can parse)."""
    return not any(type(v) is list or type(v) is dict for k, v in obj.items() if k != x_field and k != y_field)


_SCAN: Callable[[str, int], tuple[Any, int]] = getattr(json.JSONDecoder(), "scan_once")  # CPython's C scanner


def _loads(payload: bytes) -> object:
    """``json.loads(payload)``, with a fast path for the common message: UTF-8 text that is one
    JSON value with nothing around it is parsed by the decoder's scanner directly (json.loads would
    add encoding detection and whitespace skipping around the same call). Anything else — other
    encodings, a BOM, surrounding whitespace, extra data, errors — goes to ``json.loads``, so the
    result and the errors are exactly json.loads's: a text the scanner consumes entirely is valid
    strict JSON, which holds no NUL, so json.loads would also have read it as UTF-8."""
    try:
        text = payload.decode("utf-8")
        value, end = _SCAN(text, 0)
        if end == len(text):
            return value
    except (UnicodeDecodeError, StopIteration, ValueError):
        pass
    return json.loads(payload)


_orjson_loads: Callable[[bytes], object] = _orjson.loads if _orjson is not None else _loads


def _numeric_rows(rows: list[list[object]], dim: int) -> tuple[NDArray[np.float64], list[tuple[int, Reason]]]:
    """Stack rows of length ``dim`` as float64; return the matrix of the numeric rows and the
    indices of the other rows with their reason: a non-number (string, null, nested list) is
    ``wrong_type``; an integer beyond float64's range (more than 308 digits) is ``non_finite``,
    like the float literal ``1e400``. Integers beyond 64 bits but within float64's range read as
    the nearest float64 (what ``json`` does for the same number written with an exponent)."""
    if not rows:
        return np.empty((0, dim)), []
    try:
        matrix = np.array(rows)
        if matrix.dtype.kind in "fiub" and matrix.shape == (len(rows), dim):
            return matrix.astype(np.float64, copy=False), []
    except (ValueError, TypeError):
        pass
    good: list[NDArray[np.float64]] = []
    bad: list[tuple[int, Reason]] = []
    for j, row in enumerate(rows):
        values = _numeric_row(row, dim)
        if isinstance(values, Reason):
            bad.append((j, values))
        else:
            good.append(values)
    return (np.vstack(good) if good else np.empty((0, dim))), bad


def _numeric_row(row: list[object], dim: int) -> NDArray[np.float64] | Reason:
    """One row of :func:`_numeric_rows`: its float64 values, or the reason it is rejected."""
    try:
        values = np.array(row)
    except (ValueError, TypeError):
        return Reason.WRONG_TYPE
    if values.dtype.kind in "fiub" and values.shape == (dim,):
        return values.astype(np.float64)
    if values.dtype.kind == "O" and all(type(v) in (int, float, bool) for v in row):  # integers beyond 64 bits
        try:
            return np.array([float(v) for v in row])  # type: ignore[arg-type]
        except OverflowError:
            return Reason.NON_FINITE
    return Reason.WRONG_TYPE


class NamedJsonCodec(Codec):
    """One JSON object per message with named fields, mapped to positions by the schema
    (``records.fields``, :mod:`panpriv.protocols.schema`): ``{"age": 37, "country": "fr",
    "clicked": 1}``. A message that is not JSON is ``undecodable``, one that is not an object
    ``wrong_type``; the schema decides the rest (missing, unknown fields and categories, types).

    With orjson importable, a message is taken from orjson's reading when that object holds no
    nested value (what the standard library reads identically, :meth:`JsonCodec.parse`); every
    other message is read by the standard library, which decides it."""

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        assert self.schema is not None
        return _named_rows(_json_objects(payloads), self.schema, self.dim, self.labels_required, text=False)

    def values(self, payloads: Sequence[bytes]) -> Parsed:
        return _named_content(_json_objects(payloads))

    def record_ids(self, payloads: Sequence[bytes]) -> list[Any] | None:
        assert self.schema is not None
        if self.schema.id is None:
            return None
        return [None if isinstance(r, Reason) else _id_value(r.get(self.schema.id)) for r in _json_objects(payloads)]


def _id_value(value: Any) -> Any:
    """An id as written (a string or a number), anything else as its JSON text."""
    return value if value is None or type(value) in (str, int, float) else json.dumps(value, sort_keys=True)


def _json_objects(payloads: Sequence[bytes]) -> list[dict[str, Any] | Reason]:
    """Each message as a JSON object, or why it is not one."""
    out: list[dict[str, Any] | Reason] = []
    fast = FAST_JSON_AVAILABLE
    for payload in payloads:
        if fast:
            try:
                obj = _orjson_loads(payload)
            except ValueError:
                obj = None
            if type(obj) is dict and not any(type(v) is list or type(v) is dict for v in obj.values()):
                out.append(obj)
                continue
        try:
            obj = _loads(payload)
        except (ValueError, RecursionError):
            out.append(Reason.UNDECODABLE)
            continue
        out.append(obj if type(obj) is dict else Reason.WRONG_TYPE)
    return out


class CsvCodec(Codec):
    """One CSV row per message, read by the standard :mod:`csv` module (RFC 4180 quoting:
    ``"1.5","-2"`` and ``csv.QUOTE_ALL`` files read as numbers; an unbalanced quote is
    ``undecodable``). A row is complete on its line: a quoted line break would split the record
    across two messages, so a field that runs past its line is rejected rather than joined with
    the next record.

    Positional rows ``x_1,…,x_d,y`` (label position from ``records.csv_label_column``; for
    ``panpriv predict`` the label may be left out), or, with a schema (``records.fields``), rows
    named by the file's header line (``records.csv_header``), each mapped by the schema as a JSON
    object would be (:class:`NamedJsonCodec`).

    A line without a quote character (or carriage return) is split on commas directly: what
    :mod:`csv` reads for such a line, at about a fifth of the cost of a ``csv.reader`` per message
    (4 µs against 20 µs a line at d = 20, measured on the loaded 2-core machine). A reader over the
    whole micro-batch would be cheaper but joins a line whose quote is left open with the next
    record: each message is decided alone."""

    def __init__(self, records: RecordsConfig, labels_required: bool = True) -> None:
        super().__init__(records, labels_required)
        self._columns: tuple[str, ...] | None = None

    @property
    def has_header(self) -> bool:
        return self.records.csv_header

    def read_header(self, line: bytes) -> None:
        """Take the column names of a named file (positional files ignore their header); a header
        that lacks a column the schema needs (a feature without a default; the label, unless
        scoring) is a configuration error naming it, not a file of rejected rows."""
        if self.schema is None:
            return
        fields = _csv_fields(line)
        if fields is None or not all(fields):
            raise CodecError("the CSV header line cannot be read as column names")
        names = tuple(f.strip() for f in fields)
        if len(set(names)) != len(names):
            raise CodecError("the CSV header names a column twice")
        needed = [f.name for f in self.schema.features if f.default is None]
        if self.labels_required:
            needed.append(self.schema.label)
        missing = [name for name in needed if name not in names]
        if missing:
            raise CodecError(f"the CSV header has no column {', '.join(map(repr, missing))}, which the schema needs")
        self._columns = names

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        if self.schema is not None:
            return self._parse_named(payloads, values=False)
        width = self.dim + 1
        label_column = self.records.csv_label_column % width
        rows: list[NDArray[np.float64]] = []
        origin: list[int] = []
        rejects: list[Reject] = []
        for i, payload in enumerate(payloads):
            fields = _csv_fields(payload)
            if fields is None:
                rejects.append(Reject(i, Reason.UNDECODABLE))
                continue
            if len(fields) == self.dim and not self.labels_required:  # scoring a row without its label
                fields.insert(label_column, "nan")
            elif len(fields) != width:
                rejects.append(Reject(i, Reason.MISSING_FIELD if len(fields) < width else Reason.WRONG_DIMENSION))
                continue
            try:
                rows.append(np.array(fields, dtype=np.float64))
            except ValueError:
                rejects.append(Reject(i, Reason.WRONG_TYPE))
                continue
            origin.append(i)
        table = np.vstack(rows) if rows else np.empty((0, width))
        for row in rows:  # each record's parsed row: zeroed, not left to numpy's cache of small buffers
            row.fill(0.0)
        y = table[:, label_column].copy()
        X = np.delete(table, label_column, axis=1)
        table.fill(0.0)
        return Parsed(X, y, np.array(origin, dtype=np.int64), tuple(rejects), owned=True)

    def values(self, payloads: Sequence[bytes]) -> Parsed:
        if self.schema is not None:
            return self._parse_named(payloads, values=True)
        return super().values(payloads)

    def record_ids(self, payloads: Sequence[bytes]) -> list[Any] | None:
        if self.schema is None or self.schema.id is None or self._columns is None or self.schema.id not in self._columns:
            return None
        column = self._columns.index(self.schema.id)
        ids: list[Any] = []
        for payload in payloads:
            fields = _csv_fields(payload)
            ids.append(fields[column] if fields is not None and len(fields) == len(self._columns) else None)
        return ids

    def _parse_named(self, payloads: Sequence[bytes], values: bool) -> Parsed:
        """Rows named by the header, through the schema (or, for ``values``, their content)."""
        columns = self._columns
        if columns is None:
            raise CodecError("a CSV file read with a schema needs its header line (records.csv_header = true)")
        records: list[dict[str, str] | Reason] = []
        for payload in payloads:
            fields = _csv_fields(payload)
            if fields is None:
                records.append(Reason.UNDECODABLE)
            elif len(fields) != len(columns):
                records.append(Reason.MISSING_FIELD if len(fields) < len(columns) else Reason.WRONG_DIMENSION)
            else:
                records.append(dict(zip(columns, fields)))
        if values:
            return _named_content(records)
        assert self.schema is not None
        return _named_rows(records, self.schema, self.dim, self.labels_required, text=True)


class CodecError(ConfigError):
    """A file whose layout the codec cannot read at all (a CSV header that does not name the
    schema's columns): a configuration error of the run (exit 2, one line), not a rejected record."""


def _csv_fields(payload: bytes) -> list[str] | None:
    """The fields of one CSV line, or ``None`` if it is not UTF-8 or its quoting is unbalanced."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if '"' not in text and "\r" not in text:
        return text.strip().split(",")
    try:
        rows = list(csv.reader((text.strip(),), strict=True))
    except csv.Error:
        return None
    return rows[0] if len(rows) == 1 else None


def _named_rows(
    records: Sequence[Mapping[str, Any] | Reason], schema: FeatureSchema, dim: int, labels_required: bool, text: bool
) -> Parsed:
    """Named records (objects, or CSV rows by column name) mapped by ``schema``: the vectors, the
    labels (NaN for an unlabelled record when labels are not required) and the rejects."""
    X = np.zeros((len(records), dim))
    y = np.empty(len(records))
    keep = np.zeros(len(records), dtype=bool)
    rejects: list[Reject] = []
    for i, record in enumerate(records):
        if isinstance(record, Reason):
            rejects.append(Reject(i, record))
            continue
        reason = schema.fill(record, X[i], text)
        label = schema.label_of(record, text) if reason is None else None
        if reason is None and isinstance(label, str):
            reason = label
        elif reason is None and labels_required and label != label:  # NaN: no label
            reason = MISSING_FIELD
        if reason is not None:
            X[i].fill(0.0)
            rejects.append(Reject(i, Reason(reason)))
            continue
        y[i] = label
        keep[i] = True
    if keep.all():
        return Parsed(X, y, np.arange(len(records), dtype=np.int64), tuple(rejects), owned=True)
    kept = X[keep], y[keep], np.flatnonzero(keep).astype(np.int64)
    X.fill(0.0)
    return Parsed(*kept, tuple(rejects), owned=True)


def _named_content(records: Sequence[Mapping[str, Any] | Reason]) -> Parsed:
    """:meth:`Codec.values` of named records: every record that reads as an object (or a full CSV
    row), identified by its canonical content, whatever the schema takes from it."""
    content = [canonical_record(r) for r in records if not isinstance(r, Reason)]
    origin = np.array([i for i, r in enumerate(records) if not isinstance(r, Reason)], dtype=np.int64)
    return Parsed(np.empty((len(content), 0)), np.zeros(len(content)), origin, (), True, tuple(content))


def canonical_record(record: Mapping[str, Any]) -> bytes:
    """A named record's content as bytes that do not depend on its serialisation: its fields
    sorted by name, every number — and every string that reads as a finite number, as CSV writes
    numbers — as its float64 (so ``1``, ``1.0``, ``"1"`` and ``-0``/``0`` are one value), absent,
    ``null`` and empty fields dropped, nested values in sorted-key JSON. What identifies a
    named-field file's records for the budget store (:mod:`panpriv.streamer.sources.identity`):
    every field counts, including those the schema ignores, so reading the same file with another
    schema — other features, bounds or vocabularies — is the same data."""
    items = []
    for key in sorted(record):
        value = record[key]
        if value is None or value == "":
            continue
        items.append([key, _canonical_value(value)])
    return json.dumps(items, ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode("utf-8")


def _canonical_value(value: Any) -> Any:
    kind = type(value)
    if kind is bool or kind is int or kind is float:
        try:
            return float(value) + 0.0
        except OverflowError:
            return str(value)
    if kind is str:
        try:
            number = float(value)
        except ValueError:
            return value
        return number + 0.0 if math.isfinite(number) else value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


class AdultCodec(Codec):
    """A line of ``adult.data``/``adult.test``, encoded from the public schema (see
    :mod:`panpriv.streamer.datasets.adult`)."""

    def is_record_line(self, line: bytes) -> bool:
        return adult.is_record_line(line.decode("latin-1"))

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        X, y, failed = adult.encode_lines(p.decode("latin-1") for p in payloads)
        rejects = [Reject(i, Reason(reason)) for i, reason in failed]
        failed_rows = {i for i, _ in failed}
        origin = np.array([i for i in range(len(payloads)) if i not in failed_rows], dtype=np.int64)
        return Parsed(X, y, origin, tuple(rejects))


BATCH_MAGIC = b"PPB1"
_BATCH_HEADER = struct.Struct("<4sBBHI")
_DTYPES: dict[int, np.dtype[np.floating[Any]]] = {1: np.dtype("<f4"), 2: np.dtype("<f8")}


def encode_batch(X: NDArray[np.floating], y: NDArray[np.floating], dtype: str = "float32") -> bytes:
    """One binary batch message holding the rows of ``X`` (m × d) and labels ``y`` (m,)."""
    code = {"float32": 1, "float64": 2}[dtype]
    X = np.ascontiguousarray(X, dtype=_DTYPES[code])
    y = np.ascontiguousarray(y, dtype=_DTYPES[code])
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"encode_batch: X must be (m, d) and y (m,); got {X.shape} and {y.shape}")
    return _BATCH_HEADER.pack(BATCH_MAGIC, code, 0, X.shape[1], X.shape[0]) + X.tobytes() + y.tobytes()


class BinaryBatchCodec(Codec):
    """Binary batch messages (:func:`encode_batch`); each may hold many records."""

    prefix_size = _BATCH_HEADER.size

    def records_in(self, prefix: bytes) -> int:
        """The header's record count (1 for a message without a batch header)."""
        if len(prefix) < _BATCH_HEADER.size or prefix[:4] != BATCH_MAGIC:
            return 1
        return int(_BATCH_HEADER.unpack_from(prefix)[4])

    def parse(self, payloads: Sequence[bytes]) -> Parsed:
        """Check every header, then copy the bodies straight into one float64 array (the cast
        from float32 happens in that copy; :meth:`decode` validates it in place)."""
        rejects: list[Reject] = []
        bodies: list[tuple[int, np.dtype, int, bytes]] = []  # (message, dtype, records, payload)
        total = 0
        for i, payload in enumerate(payloads):
            if len(payload) < _BATCH_HEADER.size:
                rejects.append(Reject(i, Reason.UNDECODABLE))
                continue
            magic, code, _, dim, m = _BATCH_HEADER.unpack_from(payload)
            dtype = _DTYPES.get(code)
            if magic != BATCH_MAGIC or dtype is None or len(payload) != _BATCH_HEADER.size + m * (dim + 1) * dtype.itemsize:
                rejects.append(Reject(i, Reason.UNDECODABLE))
                continue
            if m == 0:
                rejects.append(Reject(i, Reason.EMPTY_BATCH))
                continue
            if dim != self.dim:
                rejects.append(Reject(i, Reason.WRONG_DIMENSION, m))
                continue
            bodies.append((i, dtype, m, payload))
            total += m
        X = np.empty((total, self.dim))
        y = np.empty(total)
        origin = np.empty(total, dtype=np.int64)
        row, dim = 0, self.dim
        with np.errstate(invalid="ignore"):  # a float32 signalling NaN raises "invalid" in the cast; validate rejects it
            for i, dtype, m, payload in bodies:
                body = np.frombuffer(payload, dtype=dtype, offset=_BATCH_HEADER.size)
                X[row : row + m] = body[: m * dim].reshape(m, dim)
                y[row : row + m] = body[m * dim :]
                origin[row : row + m] = i
                row += m
        return Parsed(X, y, origin, tuple(rejects), owned=True)


def encode_json(x: Sequence[float], y: float, x_field: str = "x", y_field: str = "y") -> bytes:
    """One JSON record message."""
    return json.dumps({x_field: [float(v) for v in x], y_field: float(y)}).encode("utf-8")
