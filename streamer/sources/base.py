"""The source contract: a micro-batch as read (:class:`Batch`), what every source offers
(:class:`Source`), and the names shared by every source."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.source_url import KafkaUrl, parse_source_url
from panpriv.streamer.io.urls import redact


@dataclass
class Batch:
    """One micro-batch as read from a source, before decoding.

    Either ``payloads`` (encoded messages, with the key and position of each in ``keys`` and
    ``positions``, and for Kafka its timestamp in ``timestamps``) or ``arrays`` (``(X, y)``,
    already numeric: the synthetic source) is set. ``ranges[key] = (start, stop)``: the positions
    consumed by this batch.
    """

    ranges: dict[str, tuple[int, int]]
    payloads: list[bytes] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    arrays: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
    timestamps: list[int] = field(default_factory=list)

    @property
    def consumed(self) -> int:
        """Number of positions this batch consumed (records, rejected records and gaps)."""
        return sum(stop - start for start, stop in self.ranges.values())


class Source(Protocol):
    """The source contract used by the processor."""

    name: str
    """A display name without credentials (for logs and ``panpriv_info``)."""

    def poll(self, max_records: int, timeout_s: float, max_bytes: int | None = None) -> Batch | None:
        """Up to ``max_records`` records, or ``None`` if none arrived within ``timeout_s``. Local
        sources also stop once they have read ``max_bytes`` payload bytes (exceeding it by less
        than one message); Kafka sources are bounded by their fetch sizes instead, and the driver
        decodes every batch in byte-bounded groups."""

    @property
    def exhausted(self) -> bool:
        """True when a finite source (or a Kafka source with ``stop_at_end``) has nothing left."""

    def total_positions(self) -> int | None:
        """Positions from the start of every key to its current end (for progress), if known."""

    def count_records(self) -> int | None:
        """Number of records in a finite source (the public ``n``), or ``None`` if unbounded."""

    def acknowledge(self, positions: Mapping[str, int], strict: bool = False) -> None:
        """Called after a checkpoint holding ``positions`` is durable (``strict``: before a
        Kafka revocation, where a failure must stop the process)."""

    def lag(self) -> dict[str, int] | None:
        """Positions between the current position and the end, per key (Kafka only; ``None``
        when unknown). Cheap enough to call every few seconds from the processing loop."""

    def keep_alive(self) -> None:
        """Called by a reader that waits without reading (a paced run, a scale-out worker waiting
        for the next model version or its pace), as often as it likes: a Kafka source whose
        consumer was not polled for a heartbeat interval polls it, handing out no record and
        moving no position, so that the consumer stays in its group (a revocation in that poll
        runs ``on_revoke``, as in :meth:`poll`); other sources do nothing."""

    def close(self) -> None:
        """Release connections and files."""


class FatalSourceError(SourceError):
    """An error after which the process must stop WITHOUT a final checkpoint (e.g. a failed
    checkpoint before a Kafka revocation: another consumer may now own those records)."""


def display_name(url: str) -> str:
    """The URL without credentials, for logs and metrics labels."""
    parsed = parse_source_url(url)
    return parsed.display() if isinstance(parsed, KafkaUrl) else redact(url)


def iter_batches(source: Source, max_records: int, timeout_s: float = 0.2) -> Iterator[Batch]:
    """Every batch of a finite source until it is exhausted (for tools and tests)."""
    while True:
        batch = source.poll(max_records, timeout_s)
        if batch is not None:
            yield batch
        elif source.exhausted:
            return
