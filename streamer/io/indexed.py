"""Random access to a recorded file by record index, for learners that choose their own order.

Some learners cannot take a stream in arrival order: :class:`panpriv.protocols.pnsgd.ShuffledPNSGD` visits
the records of a recording in a uniformly random order (Sordello et al. 2021, Thm 2), and a multi-pass learner
(``shuffle-gd``, Cheu et al. 2022 Alg. 5) reads the recording once per round. They ask for records by *record
index* (see :mod:`panpriv.streamer.runtime.recorded_driver`); :class:`IndexedFile` answers.

Record indices. Index ``i ∈ [0, n)`` names the ``i``-th *valid* record of the file in file order,
and ``n`` is the number of valid records — the public stream length such a learner is built with.
Validity is decided by the run's codec exactly as on the sequential path (the same decoding,
rejection reasons and clipping), once, by a sequential scan when the file is opened; the rejects
found are reported per pass (:attr:`IndexedFile.rejects`) and the positions a sequential replay
would consume, per source key, are :attr:`IndexedFile.extent` (what one pass charges to the ledger).

Formats: a ``panpriv record`` recording (messages in any ``records.format``, binary batches
included: a message may hold many records), and JSONL or CSV files (one record per line, a CSV
header skipped as on the sequential path). Compressed ``.gz`` files have no random access and are
refused. Keys and positions are those of :mod:`panpriv.streamer.sources` (``topic/partition`` and recorded
offsets; ``file:<absolute path>`` and line indices).

Memory. The index keeps, for every message holding a valid record, its byte offset, length and
number of valid records (16 bytes per message) in an *unlinked* temporary file (``tempfile``'s
directory), memory-mapped read-only: the kernel keeps only the pages in use and may drop them
(they are file-backed), and nothing is left on disk after the process ends, crash included. For
binary batch messages, a cumulative record count per message (8 bytes per message, i.e. per batch
of records) is held in memory. A fetch holds the records of one micro-batch, and decodes messages
holding at most 16,384 records at a time (a binary batch message is decoded whole for the one
record asked of it). The learner's own order (ShuffledPNSGD's permutation, 4 bytes per record)
lives in the learner.

The index holds where valid records are, i.e. a function of the input: it is input-side data like
the file itself, never written anywhere that outlives the process and never an output.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.codec import Codec, Decoded
from panpriv.streamer.io.recording import RecordingReader, is_recording

_ENTRY = np.dtype([("offset", "<u8"), ("length", "<u4"), ("rows", "<u4")])
_SCAN_CHUNK = 4096  # messages decoded at a time while indexing
_DECODE_ROWS = 16_384
"""Records decoded at a time by a fetch (more only when one message holds more)."""


class _Message:
    """A message met by the indexing scan: its key, position, where its bytes are, and the bytes."""

    __slots__ = ("key", "position", "start", "payload")

    def __init__(self, key: str, position: int, start: int, payload: bytes) -> None:
        self.key, self.position, self.start, self.payload = key, position, start, payload


class IndexedFile:
    """A file of records, readable by record index (module docstring).

    Parameters
    ----------
    path
        A recording, a JSONL file or a CSV file (not compressed).
    codec
        The run's codec: decides validity and clips, at indexing and at every fetch.
    """

    def __init__(self, path: Path, codec: Codec) -> None:
        path = Path(path)
        if not path.is_file():
            raise SourceError(f"source file {path} does not exist")
        if path.suffix == ".gz":
            raise SourceError(
                f"{path}: a compressed file cannot be read by record index; decompress it (gunzip -k) and use the "
                "plain file"
            )
        self.path = path
        self.name = f"file:{path}"
        self._codec = codec
        self.extent: dict[str, tuple[int, int]] = {}
        """Per source key, the positions ``[start, stop)`` that one pass consumes."""
        self.rejects: dict[str, int] = {}
        """Rejected records of one pass, by reason."""
        self._table, self._starts = self._build_index()
        self.n = int(self._starts[-1]) if self._starts is not None else len(self._table)
        """Number of valid records: record indices are ``0 … n − 1``."""
        self._fd = os.open(path, os.O_RDONLY)

    # -- indexing --------------------------------------------------------------------------------

    def _messages(self) -> Iterator[_Message]:
        """Every message in file order, updating :attr:`extent` as a sequential replay would."""
        if is_recording(self.path):
            reader = RecordingReader(self.path)
            for frame in reader.frames(reader.start):
                if frame.key not in self.extent:
                    self.extent[frame.key] = (max(0, reader.start.get(frame.key, 0)), frame.offset + 1)
                self.extent[frame.key] = (self.extent[frame.key][0], frame.offset + 1)
                yield _Message(frame.key, frame.offset, frame.value_start, frame.value)
            return
        key = f"file:{self.path.resolve()}"
        first = 1 if self._codec.has_header else 0
        is_record = self._codec.is_record_line
        lines = where = 0
        with open(self.path, "rb", buffering=1 << 20) as handle:
            for line in handle:
                if lines < first:
                    self._codec.read_header(line.rstrip(b"\r\n"))
                elif is_record(line):
                    yield _Message(key, lines, where, line.rstrip(b"\r\n"))
                lines += 1
                where += len(line)
        if lines > first:
            self.extent[key] = (first, lines)

    def _build_index(self) -> tuple[np.memmap, NDArray[np.int64] | None]:
        """Scan, decode and validate every message; keep the entries of messages with valid records."""
        spool: IO[bytes] = tempfile.TemporaryFile(prefix="panpriv-index-")  # noqa: SIM115 - kept open for the map
        rejects: Counter[str] = Counter()
        kept = 0
        single = True  # every kept message holds exactly one valid record
        chunk: list[_Message] = []

        def flush() -> None:
            nonlocal kept, single
            decoded = self._codec.decode([m.payload for m in chunk])
            rejects.update(decoded.reject_counts())
            rows = np.bincount(decoded.origin, minlength=len(chunk))
            entries = np.zeros(int(np.count_nonzero(rows)), dtype=_ENTRY)
            holding = np.flatnonzero(rows)
            entries["offset"] = [chunk[i].start for i in holding]
            entries["length"] = [len(chunk[i].payload) for i in holding]
            entries["rows"] = rows[holding]
            single = single and bool(np.all(entries["rows"] == 1))
            spool.write(entries.tobytes())
            kept += len(entries)
            chunk.clear()

        try:
            for message in self._messages():
                chunk.append(message)
                if len(chunk) == _SCAN_CHUNK:
                    flush()
            if chunk:
                flush()
        except ValueError as exc:  # a truncated recording
            spool.close()
            raise SourceError(str(exc)) from None
        self.rejects = dict(rejects)
        spool.flush()
        if kept == 0:
            spool.close()
            return np.zeros(0, dtype=_ENTRY), None  # type: ignore[return-value]
        table = np.memmap(spool, dtype=_ENTRY, mode="r", shape=(kept,))
        spool.close()  # the map keeps the (unlinked) file alive
        starts = None if single else np.concatenate([[0], np.cumsum(table["rows"], dtype=np.int64)])
        return table, starts

    # -- access ----------------------------------------------------------------------------------

    def count_records(self) -> int:
        """The number of valid records ``n`` (the public length of one pass)."""
        return self.n

    def fetch(self, indices: NDArray[np.integer]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(X, y)`` of the records at ``indices`` (in that order), validated and clipped.

        Each message holding requested records is read once (``os.pread``, in file order) and
        decoded with the run's codec, in groups of messages holding at most :data:`_DECODE_ROWS`
        records (binary batch messages hold many records, most of them not asked for). Raises
        :class:`SourceError` for an index outside ``[0, n)`` or if a message no longer decodes to
        the records indexed (the file changed during the run).
        """
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.n):
            raise SourceError(f"{self.path}: record index outside [0, {self.n})")
        if self._starts is None:
            messages, within = indices, np.zeros_like(indices)
        else:
            messages = np.searchsorted(self._starts, indices, side="right") - 1
            within = indices - self._starts[messages]
        wanted, inverse = np.unique(messages, return_inverse=True)
        entries = self._table[wanted]
        order = np.argsort(inverse, kind="stable")  # the requests, grouped by message in file order
        by_message = inverse[order]
        held = np.cumsum(entries["rows"], dtype=np.int64)  # records in wanted[:k + 1]
        X, y = np.empty((len(indices), self._codec.dim)), np.empty(len(indices))
        start = 0
        while start < len(wanted):
            before = held[start - 1] if start else 0
            stop = max(start + 1, int(np.searchsorted(held, before + _DECODE_ROWS, side="right")))
            decoded, first = self._decode(entries[start:stop])
            lo, hi = np.searchsorted(by_message, [start, stop])
            asked = order[lo:hi]
            take = first[inverse[asked] - start] + within[asked]
            X[asked], y[asked] = decoded.X[take], decoded.y[take]
            start = stop
        return X, y

    def _decode(self, entries: NDArray[np.void]) -> tuple[Decoded, NDArray[np.int64]]:
        """Read and decode the messages of ``entries``; also return the row of each message's
        first record in the decoded arrays."""
        pread, fd = os.pread, self._fd
        payloads = [pread(fd, length, offset) for offset, length in zip(entries["offset"].tolist(), entries["length"].tolist())]
        decoded = self._codec.decode(payloads)
        rows = np.bincount(decoded.origin, minlength=len(payloads))
        if not np.array_equal(rows, entries["rows"]):
            raise SourceError(f"{self.path} changed while it was being read by record index; restart the run")
        return decoded, np.cumsum(rows) - rows

    # -- the parts of the source contract the processor uses ---------------------------------------

    def acknowledge(self, positions: object, strict: bool = False) -> None:
        """Nothing to acknowledge: the checkpoint is the only record of progress."""

    def lag(self) -> None:
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
