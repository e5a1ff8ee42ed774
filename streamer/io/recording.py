"""The compact binary file written by ``panpriv record``: a Kafka topic, replayable offline.

A recording keeps what the ledger needs to identify records — the source key
(``topic/partition``) and offset of every message — plus its timestamp and its raw value bytes, so
that replaying the file charges the *same* ledger positions as consuming the topic did, and
decodes (and rejects) every message exactly as the live service would.

Layout (little-endian)::

    b"PPREC1\\n"
    u32 header length, header JSON: {"version": 1, "source": ..., "created": ...,
                                     "keys": ["topic/0", ...], "start": {"topic/0": offset, ...},
                                     "cluster": "cluster=<id>"}
    frames: u16 key index, i64 offset, i64 timestamp (ms since the epoch), u32 length, value bytes

``start`` holds the first offset recorded for each key (the partition's beginning when recorded),
so a replay's ledger ranges begin where the topic's did. ``cluster`` (optional; absent in
recordings written before it existed, which stay readable) is the identity of the Kafka cluster
the topic lives on (``cluster=<id>`` or ``bootstrap=<servers>``): with the keys and offsets it is
the provenance the budget store (:mod:`panpriv.streamer.budget.store`) charges, so a replay of a recording
composes with every run on the topic itself.

A recording holds raw record values: it is input data, with the same access rules as the topic it
came from — never an output of the service.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

from panpriv.streamer.state.atomic_files import create_private

MAGIC = b"PPREC1\n"
VERSION = 1
_LENGTH = struct.Struct("<I")
_FRAME = struct.Struct("<HqqI")


class Frame(NamedTuple):
    """One recorded message: its source key and offset, timestamp, value, and where the value
    starts in the file (``value_start``, for random access). A named tuple: replays make one per
    message, and a tuple is several times cheaper to build than a frozen dataclass."""

    key: str
    offset: int
    timestamp_ms: int
    value: bytes
    value_start: int = 0


def is_recording(path: Path) -> bool:
    """True if ``path`` starts with the recording magic bytes."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class RecordingWriter:
    """Write a recording to ``path`` atomically (a temporary file renamed on :meth:`close`),
    mode 0600: it holds raw records."""

    def __init__(
        self, path: Path, source: str, keys: Sequence[str], start: Mapping[str, int], created: str,
        cluster: str | None = None,
    ) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self._index = {key: i for i, key in enumerate(keys)}
        # Raw records: readable by the owner only; the temporary path is never followed (safefiles).
        self._handle: IO[bytes] = os.fdopen(create_private(self._tmp), "wb")
        header = json.dumps(
            {
                "version": VERSION, "source": source, "created": created, "keys": list(keys), "start": dict(start),
                **({"cluster": cluster} if cluster else {}),
            }
        ).encode("utf-8")
        self._handle.write(MAGIC + _LENGTH.pack(len(header)) + header)
        self.frames = 0

    def write(self, key: str, offset: int, timestamp_ms: int, value: bytes) -> None:
        self._handle.write(_FRAME.pack(self._index[key], offset, timestamp_ms, len(value)))
        self._handle.write(value)
        self.frames += 1

    def close(self) -> None:
        """Flush, fsync and move the file into place."""
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._tmp, self.path)


class RecordingReader:
    """Read a recording's header and frames."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as handle:
            self.header, self._body_start = _read_header(handle, self.path)
        self.keys: list[str] = list(self.header["keys"])
        self.start: dict[str, int] = {k: int(v) for k, v in self.header["start"].items()}

    def frames(self, positions: Mapping[str, int] | None = None) -> Generator[Frame, None, None]:
        """Frames in file order, skipping those before ``positions[key]`` (resume points)."""
        positions = positions or {}
        with open(self.path, "rb", buffering=1 << 16) as handle:  # raw records: a small read buffer (docs/privacy.md)
            handle.seek(self._body_start)
            where = self._body_start  # file position of the next frame header
            while True:
                head = handle.read(_FRAME.size)
                if not head:
                    return
                if len(head) < _FRAME.size:
                    raise ValueError(f"{self.path}: truncated frame header")
                index, offset, timestamp_ms, length = _FRAME.unpack(head)
                key = self.keys[index]
                value_start, where = where + _FRAME.size, where + _FRAME.size + length
                if offset < positions.get(key, 0):
                    handle.seek(length, os.SEEK_CUR)
                    continue
                value = handle.read(length)
                if len(value) < length:
                    raise ValueError(f"{self.path}: truncated frame value")
                yield Frame(key, offset, timestamp_ms, value, value_start)

    def count(self, records_in: Callable[[bytes], int] | None = None, prefix: int = 0) -> int:
        """Number of frames (reads only the frame headers), or, with ``records_in``, the sum of
        ``records_in(first prefix bytes of the value)`` over the frames (records per message)."""
        total = 0
        with open(self.path, "rb") as handle:
            handle.seek(self._body_start)
            while head := handle.read(_FRAME.size):
                length = _FRAME.unpack(head)[3]
                if records_in is None:
                    handle.seek(length, os.SEEK_CUR)
                    total += 1
                    continue
                start = handle.read(min(prefix, length))
                handle.seek(length - len(start), os.SEEK_CUR)
                total += records_in(start)
        return total


def _read_header(handle: IO[bytes], path: Path) -> tuple[dict[str, Any], int]:
    if handle.read(len(MAGIC)) != MAGIC:
        raise ValueError(f"{path} is not a panpriv recording (bad magic bytes)")
    (length,) = _LENGTH.unpack(handle.read(_LENGTH.size))
    header = json.loads(handle.read(length))
    if header.get("version") != VERSION:
        raise ValueError(f"{path}: recording version {header.get('version')!r}; this panpriv reads {VERSION}")
    return header, len(MAGIC) + _LENGTH.size + length
