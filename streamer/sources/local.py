"""Local sources: line files (JSONL, CSV, the embedded Adult data), recordings, and the seeded
synthetic stream. Nothing upstream to acknowledge, no lag."""

from __future__ import annotations

import gzip
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.io.recording import Frame, RecordingReader
from panpriv.streamer.sources.base import Batch

log = logging.getLogger("panpriv.sources")

_UNBOUNDED = 1 << 62  # no byte limit on a poll


# -- local sources -------------------------------------------------------------------------------


class _LocalSource:
    """What files and the synthetic stream share: nothing upstream to acknowledge, no lag."""

    def acknowledge(self, positions: Mapping[str, int], strict: bool = False) -> None:
        """Nothing to acknowledge: the checkpoint is the only record of progress."""

    def lag(self) -> None:
        return None

    def keep_alive(self) -> None:
        """No consumer group to stay in."""


# -- line files (JSONL, CSV, Adult) --------------------------------------------------------------


READ_BUFFER = 1 << 16
"""Bytes of a file read at a time: the read buffer holds raw records around the position read
(about 180 JSON records of 20 features), overwritten as reading moves on — a part of the input
path's bound (docs/privacy.md, "The input path")."""


def _open_binary(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb", buffering=READ_BUFFER)


class LineFileSource(_LocalSource):
    """One record per line; position = line index. ``.gz`` files are read transparently."""

    def __init__(self, path: Path, key: str, codec: Codec, positions: Mapping[str, int], skip_header: bool) -> None:
        if not path.is_file():
            raise SourceError(f"source file {path} does not exist")
        self.path = path
        self.key = key
        self.name = key
        self._codec = codec
        self._handle = _open_binary(path)
        self._position = 0
        self._eof = False
        resume = int(positions.get(key, 0))
        if skip_header:
            resume = max(resume, 1)
        while self._position < resume and (line := self._handle.readline()):
            if self._position == 0 and skip_header:
                codec.read_header(line.rstrip(b"\r\n"))
            self._position += 1
        if self._position < resume:
            raise SourceError(f"{path} has {self._position} lines but the checkpoint's position is {resume}")

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        start = self._position
        payloads: list[bytes] = []
        lines: list[int] = []
        readline = self._handle.readline
        is_record = self._codec.is_record_line
        size, budget = 0, max_bytes or _UNBOUNDED
        while len(payloads) < max_records and size < budget:
            line = readline()
            if not line:
                self._eof = True
                break
            if is_record(line):
                payloads.append(line.rstrip(b"\r\n"))
                lines.append(self._position)
                size += len(line)
            self._position += 1
        if self._position == start:
            return None
        return Batch({self.key: (start, self._position)}, payloads, [self.key] * len(payloads), lines)

    @property
    def exhausted(self) -> bool:
        return self._eof

    def total_positions(self) -> int:
        with _open_binary(self.path) as handle:
            count = 0
            last = b"\n"
            while chunk := handle.read(1 << 22):
                count += chunk.count(b"\n")
                last = chunk[-1:]
        return count + (last != b"\n")

    def count_records(self) -> int:
        with _open_binary(self.path) as handle:
            return sum(1 for line in handle if self._codec.is_record_line(line)) - (
                1 if self._skips_header() else 0
            )

    def _skips_header(self) -> bool:
        return self._codec.has_header

    def close(self) -> None:
        self._handle.close()


# -- recordings ---------------------------------------------------------------------------------


class RecordingSource(_LocalSource):
    """Replay a ``panpriv record`` file under its original ``topic/partition`` keys and offsets.

    With ``recorded_pace`` the frames are released at the pace of their recorded timestamps.
    """

    def __init__(self, path: Path, positions: Mapping[str, int], recorded_pace: bool, codec: Codec) -> None:
        self._reader = RecordingReader(path)
        self._codec = codec
        self.name = f"file:{path}"
        self._positions = {key: max(int(positions.get(key, 0)), self._reader.start.get(key, 0)) for key in self._reader.keys}
        self._frames = self._reader.frames(self._positions)
        self._pending: Frame | None = None
        self._eof = False
        self._paced = recorded_pace
        self._clock_origin: tuple[float, int] | None = None

    def resume_positions(self) -> dict[str, int]:
        """The next position this replay reads, per recorded key."""
        return dict(self._positions)

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        payloads: list[bytes] = []
        keys: list[str] = []
        offsets: list[int] = []
        starts: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        size, budget = 0, max_bytes or _UNBOUNDED
        while len(payloads) < max_records and size < budget:
            frame = self._pending or next(self._frames, None)
            self._pending = None
            if frame is None:
                self._eof = True
                break
            if self._paced and not self._due(frame.timestamp_ms, deadline):
                self._pending = frame
                break
            starts.setdefault(frame.key, self._positions[frame.key])
            self._positions[frame.key] = frame.offset + 1
            payloads.append(frame.value)
            size += len(frame.value)
            keys.append(frame.key)
            offsets.append(frame.offset)
        if not starts:
            return None
        return Batch({k: (s, self._positions[k]) for k, s in starts.items()}, payloads, keys, offsets)

    def _due(self, timestamp_ms: int, deadline: float) -> bool:
        """Wait (until ``deadline`` at most) for the recorded time of a frame; True if it is due."""
        now = time.monotonic()
        if self._clock_origin is None:
            self._clock_origin = (now, timestamp_ms)
        wall0, ts0 = self._clock_origin
        due_at = wall0 + (timestamp_ms - ts0) / 1000.0
        if due_at > now:
            time.sleep(max(0.0, min(due_at, deadline) - now))
        return time.monotonic() >= due_at

    @property
    def exhausted(self) -> bool:
        return self._eof and self._pending is None

    def total_positions(self) -> int:
        return self._reader.count()

    def count_records(self) -> int:
        """Records in the recording: one per message, or the counts in binary batch headers."""
        if self._codec.prefix_size == 0:
            return self._reader.count()
        return self._reader.count(self._codec.records_in, self._codec.prefix_size)

    def close(self) -> None:
        self._frames.close()


# -- synthetic ----------------------------------------------------------------------------------


class SyntheticSource(_LocalSource):
    """A seeded stream of ``n`` labelled records for demos, load tests and tests.

    Record ``i`` depends only on ``(seed, i)`` (blocks of 4096 records, each generated from
    ``default_rng([seed, block])``), so a resumed stream continues with exactly the records an
    uninterrupted one would have produced. ``x`` has i.i.d. N(0, 1/dim) coordinates (‖x‖ ≈ 1) and
    ``y = sign(⟨w, x⟩ + noise)`` ∈ {−1, +1} for a fixed unit vector ``w`` drawn from the seed.
    This is test data, not user data: its generator is unrelated to any learner's noise.
    """

    BLOCK = 4096

    def __init__(self, n: int, dim: int, seed: int, positions: Mapping[str, int]) -> None:
        self.n, self.dim, self.seed = n, dim, seed
        self.key = f"synthetic:seed={seed},dim={dim}"
        self.name = f"synthetic:n={n}&dim={dim}&seed={seed}"
        self._position = min(int(positions.get(self.key, 0)), n)
        w = np.random.default_rng([seed, 2**32]).standard_normal(dim)
        self._w = w / np.linalg.norm(w)

    def _block(self, index: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rng = np.random.default_rng([self.seed, index])
        X = rng.standard_normal((self.BLOCK, self.dim)) / np.sqrt(self.dim)
        y = np.where(X @ self._w + 0.1 * rng.standard_normal(self.BLOCK) >= 0, 1.0, -1.0)
        return X, y

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        start = self._position
        stop = min(self.n, start + max_records)
        if stop == start:
            return None
        parts_X, parts_y = [], []
        cursor = start
        while cursor < stop:
            block, within = divmod(cursor, self.BLOCK)
            take = min(stop - cursor, self.BLOCK - within)
            X, y = self._block(block)
            parts_X.append(X[within : within + take])
            parts_y.append(y[within : within + take])
            cursor += take
        self._position = stop
        return Batch({self.key: (start, stop)}, arrays=(np.vstack(parts_X), np.concatenate(parts_y)))

    @property
    def exhausted(self) -> bool:
        return self._position >= self.n

    def total_positions(self) -> int:
        return self.n

    def count_records(self) -> int:
        return self.n

    def close(self) -> None:
        """Nothing to release."""


