"""What the gradients topic says of each model version: the means that will count, and the batches
open there — read the same way by every worker and by the coordinator (issue 35).

**The places of a version.** Version v steps on the first K means at v in the topic's order that
pass :func:`mean_problem` (the coordinator's rule, :class:`~panpriv.streamer.scaleout.coordinator.Coordinator`);
a later mean at v is stale. A worker therefore opens a batch at v only while a place is left:

    places(v) = K − (means counted at v) − (live leases at v of other workers),

where a *lease* (:class:`~panpriv.streamer.scaleout.wire.BatchOpen`) is a worker's open batch at v,
renewed every ``renew_s`` seconds with the records it holds, and live until its mean is read, or
until no renewal with more records than before was read for :data:`LEASE_RENEWALS` renewal
intervals (the worker died or hung, or its partitions hold no more records: a batch that cannot
fill does not keep its place). So a worker slower than ``--sync-wait`` keeps its place, and a
coordinator that is down leaves every worker waiting — not opening batches at a version whose K
means are already on the topic. The rule decides on what
each reader has read so far, so two workers can still take one freed place at once (a lease
lapsed — its worker died — and each decides before the other's lease is read: a window of one
poll and one charge, up to a few hundred milliseconds); the one that finds the version closed
before it publishes hands its batch back (:mod:`panpriv.streamer.scaleout.worker`). If both fill
their batches within the same few milliseconds, the later mean is stale.

Everything here is public: versions, worker instances, counts of records, the shape of a mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from panpriv.streamer.scaleout.wire import FETCH_WAIT_MS, BatchOpen, GradientRecord, WireError, gradients_topic_record

LEASE_RENEWALS = 4
"""A lease lapses when no renewal with more records was read for this many of its renewal
intervals (a worker renews every ``--sync-wait``/4 seconds: its place is kept for ``--sync-wait``
seconds without a record)."""


def mean_problem(record: GradientRecord, worker_batch: int, params: int) -> str | None:
    """Why a mean cannot count toward its version (``wrong_shape``), or ``None``: it holds w
    records of the step (``worker_batch``) and one entry per parameter."""
    if record.records != worker_batch or record.gradient.shape != (params,):
        return "wrong_shape"
    return None


@dataclass(frozen=True)
class _Mean:
    records: int
    length: int


class VersionTally:
    """The means and the live leases of one deployment, as read from the gradients topic (module
    docstring). ``now`` is the reader's monotonic clock when it read a record (a lease's age is
    measured on the reader's clock: no clocks of other machines are compared)."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment
        self._means: dict[int, list[_Mean]] = {}
        self._leases: dict[str, tuple[BatchOpen, float]] = {}  # worker → (newest lease, when its records grew)
        self.seen: dict[str, float] = {}  # worker → when its last record (mean or lease) was read

    def take(self, value: bytes | None, now: float) -> GradientRecord | BatchOpen | None:
        """One record of the gradients topic; the record if it is this deployment's (``None``
        otherwise); :class:`~panpriv.streamer.scaleout.wire.WireError` if malformed."""
        record = gradients_topic_record(value)
        if record.deployment != self.deployment:
            return None
        self.seen[record.worker] = now
        if isinstance(record, BatchOpen):
            held = self._leases.get(record.worker)
            same = held is not None and (held[0].version, held[0].filled) == (record.version, record.filled)
            self._leases[record.worker] = (record, held[1] if held is not None and same else now)
            return record
        self._means.setdefault(record.version, []).append(_Mean(record.records, record.gradient.shape[0]))
        lease = self._leases.get(record.worker)
        if lease is not None and lease[0].version == record.version:
            del self._leases[record.worker]
        return record

    def counted(self, version: int, worker_batch: int, params: int) -> int:
        """Means read at ``version`` that pass :func:`mean_problem`."""
        return sum(1 for m in self._means.get(version, ()) if m.records == worker_batch and m.length == params)

    def open_at(self, version: int, now: float, exclude: str = "") -> dict[str, BatchOpen]:
        """The live leases at ``version`` (worker → its newest renewal), other than ``exclude``'s."""
        return {worker: lease for worker, (lease, grew) in self._leases.items()
                if lease.version == version and worker != exclude and now - grew < LEASE_RENEWALS * lease.renew_s}

    def places(self, version: int, workers: int, worker_batch: int, params: int, now: float, exclude: str = "") -> int:
        """K − means counted − live leases of others at ``version`` (module docstring)."""
        return workers - self.counted(version, worker_batch, params) - len(self.open_at(version, now, exclude))

    def forget_before(self, version: int) -> None:
        """Drop what is known of versions before ``version`` (they are closed)."""
        for old in [v for v in self._means if v < version]:
            del self._means[old]
        for worker in [w for w, (lease, _) in self._leases.items() if lease.version < version]:
            del self._leases[worker]


class TallyReader:
    """A worker's reader of the gradients topic (partition 0, no group) from ``start`` (the model
    record's ``gradients_offset``: every mean and lease of that version and later follows it),
    feeding a :class:`VersionTally`; malformed records are skipped (the coordinator counts them)."""

    def __init__(self, bootstrap: list[str], topic: str, deployment: str, start: int) -> None:
        from kafka import TopicPartition

        from panpriv.streamer.kafka import client as kafka_client
        from panpriv.streamer.kafka.topic_reader import TopicReader

        self.tally = VersionTally(deployment)
        consumer = kafka_client.consumer(bootstrap, enable_auto_commit=False, group_id=None, fetch_max_wait_ms=FETCH_WAIT_MS)
        tp = TopicPartition(topic, 0)
        self._reader = TopicReader(consumer, [tp], self._take, start={tp: start})

    def _take(self, record: Any) -> None:
        import time

        try:
            self.tally.take(record.value, time.monotonic())
        except WireError:
            pass

    def poll(self, timeout_ms: int = 0) -> None:
        """Read what arrived (waiting at most ``timeout_ms``)."""
        self._reader.poll(timeout_ms)

    def close(self) -> None:
        self._reader.close()
