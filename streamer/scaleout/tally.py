"""What the gradients topic says of each model version: the means that will count, and the batches
open there — read the same way by every worker and by the coordinator (issue 35).

**The places of a version.** Version v steps on the first K means at v in the topic's order that
pass :func:`mean_problem` (the coordinator's rule, :class:`~panpriv.streamer.scaleout.coordinator.Coordinator`);
a later mean at v is stale. A worker takes a place at v by a *claim* — the first record of its
lease (:class:`~panpriv.streamer.scaleout.wire.BatchOpen`), published *before* it reads a record
for the batch — and the one-partition topic orders the claims: going through the live leases at v
in the order of their claims, a lease *holds* a place while

    (means counted at v) + (leases holding a place before it) < K,

and a worker reads records for v only once it has read its own claim back and found it holding a
place (:meth:`VersionTally.holds`; one round trip per batch). Two workers that take a freed place
at once (its worker died) both claim it; the one whose claim comes second in the topic sees the
first one ahead of it and withdraws, before it has read a record. So the means at v can never be
more than K: no stale mean, by construction, as long as every reader agrees on which leases are
live.

**Live leases.** A lease is renewed every ``renew_s`` seconds with the records its batch holds,
and is live until its mean is read, it is withdrawn, or no renewal with more records than before
was read for :data:`LEASE_RENEWALS` renewal intervals (the worker died or hung, or its partitions
hold no more records: a batch that cannot fill does not keep its place). So a worker slower than
``--sync-wait`` keeps its place, and a coordinator that is down leaves every worker waiting — not
opening batches at a version whose K means are already on the topic. A lease's age is measured on
the reader's clock from when it read the renewal, never earlier than the owner sent it: the owner
counts its own lease as held only while it sends a growing renewal (or its mean) within
:data:`OWNER_RENEWALS` intervals of the last (:func:`owner_holds`) — one interval earlier than
any reader lets it lapse — and otherwise claims again before it publishes (a worker that hung
while its place was taken then finds the version full and hands its batch back).

Everything here is public: versions, worker instances, offsets, counts of records, the shape of a mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from panpriv.streamer.scaleout.wire import BatchOpen, GradientRecord, WireError, gradients_topic_record

LEASE_RENEWALS = 4
"""A lease lapses when no renewal with more records was read for this many of its renewal
intervals (a worker renews every ``--sync-wait``/4 seconds: its place is kept for ``--sync-wait``
seconds without a record)."""

OWNER_RENEWALS = LEASE_RENEWALS - 1
"""The owner of a lease counts it as holding its place only while its growing renewals (and its
mean) leave within this many renewal intervals of each other: one interval of margin for the
record to reach the topic before any reader lets the lease lapse."""


def owner_holds(last_growth_sent: float, now: float, renew_s: float) -> bool:
    """Whether a lease whose last growing record (claim or renewal with more records) was sent at
    ``last_growth_sent`` still holds its place for a record sent ``now`` (module docstring)."""
    return now - last_growth_sent < OWNER_RENEWALS * renew_s


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


@dataclass(frozen=True)
class _Lease:
    """A worker's newest lease record, the offset of its claim and when it last grew (reader's clock)."""

    record: BatchOpen
    claimed_at: int
    grew: float


class VersionTally:
    """The means and the live leases of one deployment, as read from the gradients topic (module
    docstring). ``now`` is the reader's monotonic clock when it read a record (a lease's age is
    measured on the reader's clock: no clocks of other machines are compared)."""

    def __init__(self, deployment: str) -> None:
        self.deployment = deployment
        self._means: dict[int, list[_Mean]] = {}
        self._leases: dict[str, _Lease] = {}  # worker → its newest lease
        self.seen: dict[str, float] = {}  # worker → when its last record (mean or lease) was read
        self.read_to = -1  # the offset after the last record taken (-1: none yet)

    def take(self, value: bytes | None, now: float, offset: int | None = None) -> GradientRecord | BatchOpen | None:
        """One record of the gradients topic, at ``offset`` (``None``: right after the last one);
        the record if it is this deployment's (``None`` otherwise);
        :class:`~panpriv.streamer.scaleout.wire.WireError` if malformed."""
        offset = max(self.read_to, 0) if offset is None else offset
        self.read_to = max(self.read_to, offset + 1)
        record = gradients_topic_record(value)
        if record.deployment != self.deployment:
            return None
        self.seen[record.worker] = now
        if isinstance(record, BatchOpen):
            held = self._leases.get(record.worker)
            if record.withdrawn:
                if held is not None and held.record.version == record.version:
                    del self._leases[record.worker]
                return record
            if record.claim or held is None or held.record.version != record.version:
                self._leases[record.worker] = _Lease(record, offset, now)  # a claim (or a renewal of one not read)
            else:
                grew = held.grew if held.record.filled == record.filled else now
                self._leases[record.worker] = _Lease(record, held.claimed_at, grew)
            return record
        self._means.setdefault(record.version, []).append(_Mean(record.records, record.gradient.shape[0]))
        lease = self._leases.get(record.worker)
        if lease is not None and lease.record.version == record.version:
            del self._leases[record.worker]
        return record

    def counted(self, version: int, worker_batch: int, params: int) -> int:
        """Means read at ``version`` that pass :func:`mean_problem`."""
        return sum(1 for m in self._means.get(version, ()) if m.records == worker_batch and m.length == params)

    def open_at(self, version: int, now: float, exclude: str = "") -> dict[str, BatchOpen]:
        """The live leases at ``version`` (worker → its newest renewal), other than ``exclude``'s."""
        return {worker: lease.record for worker, lease in self._leases.items()
                if lease.record.version == version and worker != exclude and self._live(lease, now)}

    @staticmethod
    def _live(lease: _Lease, now: float) -> bool:
        return now - lease.grew < LEASE_RENEWALS * lease.record.renew_s

    def holders(self, version: int, workers: int, worker_batch: int, params: int, now: float, own: str = "") -> list[str]:
        """The workers whose leases at ``version`` hold a place, in the order of their claims
        (module docstring); ``own``'s lease is live whatever its age (its owner decides that,
        :func:`owner_holds`)."""
        free = workers - self.counted(version, worker_batch, params)
        live = sorted((lease.claimed_at, worker) for worker, lease in self._leases.items()
                      if lease.record.version == version and (worker == own or self._live(lease, now)))
        return [worker for _, worker in live[:max(free, 0)]]

    def holds(self, worker: str, version: int, workers: int, worker_batch: int, params: int, now: float) -> bool:
        """Whether ``worker``'s claim at ``version`` (read back) holds a place (module docstring)."""
        return worker in self.holders(version, workers, worker_batch, params, now, own=worker)

    def places(self, version: int, workers: int, worker_batch: int, params: int, now: float, exclude: str = "") -> int:
        """K − means counted − leases of others holding a place at ``version``: the places a new
        claim may find (module docstring)."""
        holding = [w for w in self.holders(version, workers, worker_batch, params, now) if w != exclude]
        return workers - self.counted(version, worker_batch, params) - len(holding)

    def forget_before(self, version: int) -> None:
        """Drop what is known of versions before ``version`` (they are closed)."""
        for old in [v for v in self._means if v < version]:
            del self._means[old]
        for worker in [w for w, lease in self._leases.items() if lease.record.version < version]:
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
        consumer = kafka_client.consumer(bootstrap, enable_auto_commit=False, group_id=None)
        tp = TopicPartition(topic, 0)
        self._reader = TopicReader(consumer, [tp], self._take, start={tp: start})

    def _take(self, record: Any) -> None:
        import time

        try:
            self.tally.take(record.value, time.monotonic(), record.offset)
        except WireError:
            pass

    def poll(self, timeout_ms: int = 0) -> None:
        """Read what arrived (waiting at most ``timeout_ms``)."""
        self._reader.poll(timeout_ms)

    def close(self) -> None:
        self._reader.close()
