"""``panpriv worker``: one consumer-group member of a scaled-out pan-private AC-SA model.

Per batch (Cheu et al. 2022 Alg. 6 lines 4–9, through the learner's own methods: a
:class:`~panpriv.protocols.batch_worker.BatchWorkerLearner` built from the model record's config): load
θ^md of the newest model version from the model topic, and when the first records arrive draw
g ← N(0, ζ(w)² I); charge the positions to the budget store, then add each record's clipped
gradient /w (the fused path); at w records add the second draw and publish the **noisy mean**,
tagged with the version, to the gradients topic. Nothing else leaves the process: no record, no
partial sum, no clean gradient. An intruder who reads the worker once sees its iterate copy
(public) and Z + partial sum/w (Lemma C.4, Case 2).

**Synchronous versions, without starving or stale means** (issue 35). Version v steps on the first
K means at v. A worker that sees a place left at v (:mod:`panpriv.streamer.scaleout.tally`: K minus
the means counted minus the other workers' leases holding a place) *claims* it on the gradients
topic before it reads a record, reads the topic back to its claim, and reads records for v only if
its claim holds a place in the topic's order (one round trip per batch); a claim that finds none is
withdrawn. It renews its lease while its batch is open. After publishing at v it waits for version
v + 1, and claims another place at v only after ``sync_wait`` seconds *and* if a place is still
free (a worker gone: K − 1 survivors still make progress; two survivors claiming the dead worker's
place at once are ordered by the topic). A worker slower than ``sync_wait`` keeps its place by its
lease; a coordinator that is down leaves every worker waiting once K means are on the topic. A
worker whose lease may have lapsed (it hung, or its partitions ran dry) claims again before it
publishes. A batch whose version closes before it is published (the model moved past it, or K
means of its version were read, or its claim found no place again) is *handed back*: the consumer
seeks back to the batch's first positions, so its records return to the stream, and the batch is
lost like a revoked one (below).

**Reading.** The data topic is read through ``panpriv run``'s Kafka source
(:func:`panpriv.streamer.sources.open.open_kafka_source`: kafka-python, or confluent-kafka by
``[kafka] client``), its micro-batches decoded in byte-bounded groups
(:meth:`panpriv.streamer.io.codec.Codec.decode_groups`), JSON or CSV one record per message. The
worker gives the source no position of its own: the group's committed offsets (committed after each
publication) say where a partition starts; a hand-back or a revocation rewinds the source to the
lost batch's first positions (:meth:`panpriv.streamer.sources.kafka.KafkaConsumerSource.rewind`).
A worker that waits — for the next version (a coordinator down for minutes), a place, its pace —
reads nothing, but keeps its consumer in the group
(:meth:`~panpriv.streamer.sources.kafka.KafkaConsumerSource.keep_alive`, at every turn of its loop).

**Budget** (:mod:`panpriv.streamer.budget.store`; one store per data source, shared with every run), through
the one :class:`~panpriv.streamer.budget.session.BudgetSession` and its rules. A worker is a run with
its own instance, and each worker process an *attempt* at it (a second live process of one instance
is refused). It charges each poll's positions *before* learning them — several polls per durable
write, charged ahead per partition (:mod:`panpriv.streamer.budget.ahead`) — marks its published
positions durable *before* publishing (so a crash can only over-count), records the store's id and
generation in its sealed state (``worker.json``: a store behind it is refused at the next start),
and commits the group offsets after the publication is acknowledged. A batch that reaches no output
— partitions revoked by a rebalance, a batch handed back, a stop, or (on restart with the same
``--out``) a SIGKILL — is moved to an intrusion-only *lost* instance (:func:`panpriv.accounting.budget.lost_state_report`); after a
SIGKILL only the dead process's charges beyond its own durable marks move, with its last stored
report. What was charged ahead and never read is given back first (on a revocation, a lost batch,
a clean stop). The new owner of those records (the same worker, for a batch handed back) charges
them again: a second use for intrusion, none for output.

**Metrics** (``--metrics-port``; :class:`panpriv.streamer.scaleout.metrics.WorkerMetrics`): the counts of
:class:`WorkerStats`, the newest version, and the budget store's composed guarantee of the records
this worker charged — nothing computed from a record.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import lost_state_report
from panpriv.protocols.batch_worker import BatchWorkerLearner
from panpriv.streamer.budget.open import BudgetSettings
from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.budget.store import BudgetExceededError
from panpriv.streamer.config import SourceConfig
from panpriv.streamer.errors import CheckpointError, PlanStalled
from panpriv.streamer.io.source_url import KafkaUrl
from panpriv.streamer.kafka.topics import ensure_topics
from panpriv.streamer.runtime.role_loop import RoleLoop
from panpriv.streamer.scaleout.coordinator import batch_worker_learner
from panpriv.streamer.scaleout.metrics import WorkerMetrics
from panpriv.streamer.scaleout.tally import TallyReader, owner_holds
from panpriv.streamer.scaleout.wire import BatchOpen, GradientRecord, ModelReader, ModelVersion, query_state, scaleout_topics
from panpriv.streamer.sources.base import Batch
from panpriv.streamer.sources.open import open_kafka_source
from panpriv.streamer.state.role_state import RoleState

log = logging.getLogger("panpriv.worker")

STATE_FILE = "worker.json"


@dataclass
class WorkerOptions:
    """What ``panpriv worker`` needs."""

    bootstrap: list[str]
    data_topic: str
    gradients_topic: str
    model_topic: str
    deployment: str
    group: str
    budget: BudgetSettings
    out: Path | None = None
    sync_wait_s: float = 2.0
    record_format: str = "json"
    rate: float = 0.0
    metrics: WorkerMetrics | None = None
    privacy_interval_s: float = 5.0  # the metrics' privacy gauges: the store composes every use


@dataclass
class _Batch:
    """The open batch: its version and size, what it has read (positions per data key; the first
    position per source key ``topic/partition``, where a hand-back rewinds to), and its lease: renewed every
    ``renew_s`` seconds (last at ``renewed``), its last growing record (claim or renewal with more
    records) sent at ``grew_sent`` with ``sent_filled`` records, and ``held`` until a growing
    renewal left too late to hold its place (:func:`panpriv.streamer.scaleout.tally.owner_holds`)."""

    version: int
    size: int
    renew_s: float
    grew_sent: float
    filled: int = 0
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)  # source key (topic/partition) → first position
    renewed: float = float("-inf")
    sent_filled: int = 0
    held: bool = True


@dataclass
class WorkerStats:
    """Public counts of one worker process."""

    instance: str
    published: int = 0
    records: int = 0
    rejected: int = 0
    discarded: int = 0
    reason: str = ""
    rejects: Counter[str] = field(default_factory=Counter)  # by panpriv.streamer.io.codec.Reason
    lost: Counter[str] = field(default_factory=Counter)  # by panpriv.streamer.scaleout.metrics.LOST_REASONS
    waits: Counter[str] = field(default_factory=Counter)  # by panpriv.streamer.scaleout.metrics.WAIT_OUTCOMES
    wait_s: float = 0.0


def worker_state(out: Path) -> RoleState:
    """A worker's sealed state in ``out``: its budget instance (``{"instance": ...}``); a state written
    before sealing (panpriv 0.1: that object alone) is recognised by its keys."""
    return RoleState(out, STATE_FILE, "scaleout-worker", legacy=lambda body: set(body) == {"instance"},
                     fix="restore it from a backup, or start the worker with another --out (a new budget instance)")


def worker_instance(state: RoleState | None, deployment: str) -> str:
    """The worker's budget instance: kept in its state so that a restart with the same ``--out``
    accounts the batch a crash lost; otherwise fresh."""
    if state is None:
        return f"scaleout:{deployment}/worker-{uuid.uuid4().hex[:12]}"
    saved = state.load()
    if saved is None:
        instance = f"scaleout:{deployment}/worker-{uuid.uuid4().hex[:12]}"
        state.save({"instance": instance})
        return instance
    kept = saved.get("instance")
    if type(kept) is not str or not kept.startswith("scaleout:"):
        raise CheckpointError(f"{state.path} holds no worker instance; {state.path.parent} is not a worker's --out")
    if state.migrated:
        state.save({"instance": kept})
    return kept


class Worker:
    """The worker's loop and its dealings with the budget store (module docstring)."""

    def __init__(self, options: WorkerOptions, loop: RoleLoop, instance: str, state: RoleState | None = None) -> None:
        from kafka.structs import TopicPartition  # noqa: F401 - imported early: fails fast without kafka-python

        from panpriv.streamer.kafka import client as kafka_client

        self.options = options
        self.loop = loop
        self.stats = WorkerStats(instance)
        self._state = state  # the sealed worker.json: it records the budget store's mark at every publication
        self.budget = BudgetSession.for_role(options.budget, options.out or ".", instance)
        loop.close_on_exit(self.budget.close, "budget store")
        self.learner: BatchWorkerLearner | None = None
        self.version = -1  # the version loaded into the learner
        self.durable: dict[str, int] = {}
        self._sequence = 0
        self._revoked = False  # partitions were revoked in the last poll (the open batch is then lost)
        # The stops this worker published since its partitions were assigned (source keys), committed
        # again, strictly, when they are revoked (:meth:`_on_revoke`): nobody else read them meanwhile.
        self._published_here: dict[str, int] = {}
        self._reader = ModelReader(options.bootstrap, options.model_topic, options.deployment)
        loop.close_on_exit(self._reader.close, "model reader")
        self._producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0)
        loop.close_on_exit(self._producer.close, "gradients producer")
        # panpriv run's source (kafka-python or confluent-kafka, by [kafka] client), from no position of
        # its own: the group's committed offsets (the last published batches) say where to start.
        url = KafkaUrl(options.bootstrap, [options.data_topic], options.group)
        self._source_config = SourceConfig(url=url.display())
        self._source = open_kafka_source(url, self._source_config, {}, on_revoke=self._on_revoke)
        loop.close_on_exit(self._source.close, "data source")
        self._cluster = self._source.cluster_identity()
        log.info("worker %s: reading %s with %s", instance, url.display(), self._source.client)
        self._batch: _Batch | None = None
        self._codec: Any = None
        self._newest = -1  # the newest model version read
        self._charged: set[str] = set()  # data keys this instance has charged
        self._privacy_at: float | None = None  # monotonic time of the last privacy refresh

    # -- the model --------------------------------------------------------------------------------

    def _first_model(self) -> ModelVersion | None:
        while not self.loop.stopping:
            model = self._reader.poll(200)
            if model is not None:
                return model
        return None

    def _setup(self, model: ModelVersion) -> None:
        """Build the learner from the model's public config; register the run; account a lost state."""
        from panpriv.streamer.config import RecordsConfig
        from panpriv.streamer.io.formats import make_codec

        learner = batch_worker_learner(model.learner, model.config)  # the one factory, from the public config
        learner.plan_for_workers(model.workers)
        limit, planned = self.options.budget.max_epsilon, learner.planned_privacy()
        epsilon = max(planned.output.epsilon, planned.intrusion.epsilon)
        if limit is not None and epsilon > limit:
            raise BudgetExceededError(f"refusing to start: the model's epsilon {epsilon:g} per use exceeds --max-epsilon "
                                      f"{limit:g}; nothing was learned")
        self.learner = learner
        self._codec = make_codec(RecordsConfig.model_validate(
            {"format": self.options.record_format, "dim": learner.dim, "feature_bound": learner.feature_bound}))
        state = self._state
        previous = self.budget.begin_role(f"kafka:{self.options.data_topic}", learner.privacy(),
                                          seen=state.budget_mark if state is not None else None,
                                          where=str(state.path) if state is not None else "")
        if previous is not None:  # a restart with the same --out: what the last process left unpublished was lost
            self.durable = dict(previous.positions)
            self._sequence = previous.sequence
            self._charged.update(previous.positions)
            if self._reclassify("restart after a crash"):
                self.stats.lost["crash"] += 1
        self._observe_privacy()

    def _load(self, model: ModelVersion) -> None:
        assert self.learner is not None
        if model.version != self.version:
            self.learner.load_state_dict(query_state(model.state))
            self.version = model.version

    # -- the budget -------------------------------------------------------------------------------

    def _key(self, source_key: str) -> str:
        """The budget store's data key of the source's ``topic/partition``."""
        return f"kafka:{self._cluster}/{source_key}"

    def _reclassify(self, why: str) -> bool:
        """Move this instance's charges beyond its published positions to a lost (intrusion-only)
        instance; True if there were any."""
        assert self.learner is not None
        lost = self.budget.reclassify_lost(self.durable, lost_state_report(self.learner.privacy()))
        if lost:
            log.warning("worker %s: %s; records read into the lost batch are charged as an intrusion-only use: %s",
                        self.stats.instance, why, ", ".join(f"{k} [{a}, {b})" for k, (a, b) in sorted(lost.items())))
        return bool(lost)

    def _discard(self, batch: _Batch | None, why: str, reason: str) -> None:
        """Drop the open batch (``reason``: one of :data:`panpriv.streamer.scaleout.metrics.LOST_REASONS`)
        and withdraw its lease (not on a stop: the lease lapses); a batch that read no record is not lost."""
        if batch is None:
            return
        assert self.learner is not None
        self.learner.discard_batch()
        if reason != "stopped":
            self._send_lease(batch, withdrawn=True)
        if not batch.ranges:
            return
        self.stats.discarded += 1
        self.stats.lost[reason] += 1
        self._reclassify(why)

    # -- the metrics ------------------------------------------------------------------------------

    def _observe(self) -> None:
        """Feed the cumulative counts to the metrics (cheap: a few dictionary updates)."""
        metrics = self.options.metrics
        if metrics is not None:
            s = self.stats
            metrics.observe_totals(s.published, s.records, s.rejects, s.lost, s.waits, s.wait_s, self._newest)

    def _observe_privacy(self) -> None:
        """The budget store's guarantee of the records this worker charged, composed over every run
        that used them (the service's statement, :func:`panpriv.accounting.budget.report_for`), and per data
        source (every ``privacy_interval_s`` seconds, from the role loop's heartbeat)."""
        metrics = self.options.metrics
        if metrics is None or self.learner is None:
            return
        keys = sorted(self._charged)
        report = self.budget.composed(self.learner.privacy(), keys, self.stats.records)
        metrics.observe_privacy(report, self.budget.per_source(keys))

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> WorkerStats:
        """Wait for the first model, set up, then one :meth:`_step` per turn of the role loop."""
        self.loop.ready()
        model = self._first_model()
        if model is None:
            return self.stats
        _stop_if_abandoned(model)
        self._setup(model)
        self._model = model
        self._tally = TallyReader(self.options.bootstrap, self.options.gradients_topic, self.options.deployment,
                                  model.gradients_offset)
        self.loop.close_on_exit(self._tally.close, "gradients reader")
        self._published_at = -1
        self._waiting_since = time.monotonic()
        self._waiting = False  # after publishing at _published_at, until the next version or another batch there
        self.loop.every(self.options.privacy_interval_s, self._observe_privacy)
        try:
            self.loop.run(self._step)
        finally:
            self._discard(self._batch, "stopped mid-batch", "stopped")
            self.budget.mark_durable(self.stats.instance, self._sequence, self.durable, clean=True)
            if self._state is not None:
                self._state.save({"instance": self.stats.instance}, budget_mark=self.budget.mark())
            try:
                self._observe()
                self._observe_privacy()
            except Exception as exc:  # noqa: BLE001 - the last refresh must not hide why the loop ended
                log.warning("worker %s: final metrics refresh failed: %s", self.stats.instance, exc)
        return self.stats

    def _step(self) -> None:
        """Follow the model and the gradients topic; hand back a batch whose version closed; open a
        batch only where a place is left (module docstring); read, charge and learn the next records
        of the open batch, renew its lease; publish it when full, unless its version closed."""
        self._observe()
        self._source.keep_alive()  # a wait reads no record: the consumer stays in its group (a no-op while reading)
        if self._lost_to_revocation(self._batch):
            return
        model = self._model = self._reader.poll(0) or self._model
        self._newest = max(self._newest, model.version)
        self._tally.poll()
        now = time.monotonic()
        if self._waiting and model.version != self._published_at:
            self._waiting = False
            self.stats.waits["arrived"] += 1
            self.stats.wait_s += now - self._waiting_since
        if model.done:
            self.stats.reason = "the model is done"
            self.loop.finish("done")
            return
        _stop_if_abandoned(model)
        batch = self._batch
        if batch is not None and model.version > batch.version:
            self._hand_back(batch, f"version {batch.version} closed before the batch was full")
            batch = self._batch = None
        if batch is None and not self._may_open(model, now):
            self._model = self._reader.poll(50) or model  # synchronous versions: wait for the next one, or a place
            return
        want = self.loop.pacer.allowance(model.worker_batch if batch is None else batch.size - batch.filled)
        if want == 0:  # paced (--rate): not yet
            if batch is not None:
                self._renew(batch, now)
            self.loop.pacer.wait(0.2)
            return
        if batch is None:
            batch = self._batch = self._claim(model, now)
            if batch is None:  # the place went to an earlier claim: nothing was read
                self._model = self._reader.poll(50) or model
                return
        polled = self._source.poll(want, 0.2)
        if self._lost_to_revocation(batch, polled):
            return
        if polled is None:
            self._renew(batch, time.monotonic())
            return
        if not self._learn(batch, polled):
            self._discard(batch, self.stats.reason, "budget")
            self._batch = None
            self.loop.finish("budget")
            return
        self.loop.pacer.consumed(len(polled.payloads))
        if batch.filled < batch.size:
            self._renew(batch, time.monotonic())
        elif self._version_closed(batch):
            self._hand_back(batch, f"version {batch.version} closed as the batch filled")
            self._batch = None
        elif not self._still_holds(batch):
            self._hand_back(batch, f"its lease at version {batch.version} lapsed and the place was taken")
            self._batch = None
        else:
            self._publish(batch)
            self._published_at, self._waiting_since, self._waiting = batch.version, time.monotonic(), True
            self._batch = None

    # -- the places of a version (panpriv.streamer.scaleout.tally) --------------------------------

    def _may_open(self, model: ModelVersion, now: float) -> bool:
        """Whether to open a batch at the model's version: not within ``sync_wait`` of publishing
        there, and only while a place is left."""
        assert self.learner is not None
        if model.version == self._published_at and now - self._waiting_since < self.options.sync_wait_s:
            return False
        places = self._tally.tally.places(model.version, model.workers, model.worker_batch, self.learner.param_count, now,
                                          exclude=self.stats.instance)
        return places > 0

    def _version_closed(self, batch: _Batch) -> bool:
        """Just before publishing: the model moved past the batch's version, or K means of it were read."""
        assert self.learner is not None
        self._tally.poll()
        model = self._model = self._reader.poll(0) or self._model
        counted = self._tally.tally.counted(batch.version, batch.size, self.learner.param_count)
        return model.version > batch.version or counted >= model.workers

    def _claim(self, model: ModelVersion, now: float) -> _Batch | None:
        """Open a batch at the model's version if a claim there holds a place (module docstring);
        ``None`` (the claim withdrawn) otherwise."""
        assert self.learner is not None
        if not self._claimed(model.version, 0, model.worker_batch, model.workers):
            self.stats.waits["claim_lost"] += 1
            return None
        if self._waiting:  # another batch at the version this worker published at: a place was left
            self._waiting = False
            self.stats.waits["timed_out"] += 1
            self.stats.wait_s += now - self._waiting_since
        self._load(model)
        claimed = time.monotonic()
        batch = _Batch(model.version, model.worker_batch, self.options.sync_wait_s / 4, grew_sent=claimed, renewed=claimed)
        self.learner.open_batch(batch.size)  # Alg. 6 lines 4–5
        return batch

    def _claimed(self, version: int, filled: int, size: int, workers: int) -> bool:
        """Publish a claim at ``version``, read the gradients topic back to it, and say whether it
        holds a place (:meth:`panpriv.streamer.scaleout.tally.VersionTally.holds`); withdraw it if not."""
        assert self.learner is not None
        claim = BatchOpen(self.options.deployment, version, self.stats.instance, filled, size, self.options.sync_wait_s / 4,
                          claim=True)
        sent = self._producer.send(self.options.gradients_topic, key=self.options.deployment.encode(), value=claim.to_json())
        offset = sent.get(timeout=60).offset
        while self._tally.tally.read_to <= offset:
            if self.loop.stopping:
                return False
            self._tally.poll(50)
        if self._tally.tally.holds(self.stats.instance, version, workers, size, self.learner.param_count, time.monotonic()):
            return True
        self._producer.send(self.options.gradients_topic, key=self.options.deployment.encode(),
                            value=dataclasses.replace(claim, claim=False, withdrawn=True).to_json())
        return False

    def _still_holds(self, batch: _Batch) -> bool:
        """Just before publishing a full batch: its lease still holds its place by the owner's rule
        (:func:`panpriv.streamer.scaleout.tally.owner_holds`), or a new claim finds one."""
        now = time.monotonic()
        if batch.held and owner_holds(batch.grew_sent, now, batch.renew_s):
            return True
        if not self._claimed(batch.version, batch.filled, batch.size, self._model.workers):
            return False
        batch.held, batch.grew_sent = True, time.monotonic()
        return True

    def _renew(self, batch: _Batch, now: float) -> None:
        """Renew the open batch's lease every ``sync_wait``/4 seconds, noting whether a renewal with
        more records left in time to hold its place."""
        if now - batch.renewed < batch.renew_s:
            return
        batch.renewed = now
        if batch.filled != batch.sent_filled:
            batch.held = batch.held and owner_holds(batch.grew_sent, now, batch.renew_s)
            batch.grew_sent, batch.sent_filled = now, batch.filled
        self._send_lease(batch)

    def _send_lease(self, batch: _Batch, withdrawn: bool = False) -> None:
        lease = BatchOpen(self.options.deployment, batch.version, self.stats.instance, batch.filled, batch.size,
                          batch.renew_s, withdrawn=withdrawn)
        self._producer.send(self.options.gradients_topic, key=self.options.deployment.encode(), value=lease.to_json())

    def _hand_back(self, batch: _Batch, why: str) -> None:
        """Drop a batch whose version closed and return its records to the stream: seek back to its
        first positions (nothing was committed), the batch lost as an intrusion-only use."""
        if batch.ranges:
            log.info("worker %s: %s (%d of %d records): handing it back; its records return to the stream",
                     self.stats.instance, why, batch.filled, batch.size)
        self._discard(batch, why, "handed_back")
        self._source.rewind(batch.starts)

    def _on_revoke(self) -> None:
        """The source's revocation hook (inside its poll, before the partitions go): the positions
        this worker published since the assignment are committed first, strictly — the next owner
        starts from the group's committed offsets, and a commit after a publication that failed
        (the group was already rebalancing) made it read and publish those records again; a
        commit that fails here stops the worker, as it stops ``panpriv run``. The open batch is
        lost, its positions go back to its first ones, so that a partition assigned again — to
        this worker or to another — is read from there."""
        self._revoked = True
        self._source.acknowledge(self._published_here, strict=True)
        self._published_here = {}
        if self._batch is not None:
            self._source.rewind(self._batch.starts, seek=False)

    def _lost_to_revocation(self, batch: _Batch | None, polled: Batch | None = None) -> bool:
        """After a poll or a keep-alive of the source: if partitions were revoked in it
        (:meth:`_on_revoke`), what was charged ahead is given back, the open batch is lost, and what
        the poll returned (``polled``, read under no claim) goes back to the stream, uncharged. True
        if so."""
        if not self._revoked:
            return False
        self._revoked = False
        self.budget.give_back(self.stats.instance)  # a revoked partition's next offsets are its new owner's
        self._discard(batch, "partitions revoked mid-batch", "revoked")
        self._batch = None
        if polled is not None:
            self._source.rewind({key: start for key, (start, _) in polled.ranges.items()})
        return True

    def _learn(self, batch: _Batch, polled: Batch) -> bool:
        """Charge, then learn the micro-batch ``polled`` into the open batch (Alg. 6 line 7); False
        if the budget refuses."""
        assert self.learner is not None
        ranges = {self._key(key): span for key, span in polled.ranges.items()}
        for key, (start, _) in polled.ranges.items():
            batch.starts.setdefault(key, start)
        self._charged.update(ranges)
        refused = self.budget.charge(self.stats.instance, ranges, self.budget.own())
        if refused is not None:
            self.stats.reason = refused
            return False
        self.budget.learned_here += len(polled.payloads)
        for key, (start, stop) in ranges.items():
            a, b = batch.ranges.get(key, (start, stop))
            batch.ranges[key] = (min(a, start), max(b, stop))
        for decoded, _ in self._codec.decode_groups(polled.payloads, self._source_config.batch_bytes):
            try:
                rejects = decoded.reject_counts()
                self.stats.rejected += sum(rejects.values())
                self.stats.rejects.update(rejects)
                if decoded.X.shape[0]:
                    self.learner.add_to_batch(decoded.X, decoded.y, batch.size)
                batch.filled += decoded.X.shape[0]
            finally:
                decoded.X.fill(0.0)
                decoded.y.fill(0.0)
        return True

    def _publish(self, batch: _Batch) -> None:
        """Line 9, then: positions durable in the store, the noisy mean published, offsets committed."""
        assert self.learner is not None
        mean = self.learner.close_batch(batch.size)
        try:
            for key, (_, stop) in batch.ranges.items():
                self.durable[key] = max(self.durable.get(key, 0), stop)
            self._sequence += 1
            self.budget.mark_durable(self.stats.instance, self._sequence, self.durable, clean=False)
            if self._state is not None:  # the store's mark, as the service's checkpoint records it
                self._state.save({"instance": self.stats.instance}, budget_mark=self.budget.mark())
            record = GradientRecord(self.options.deployment, batch.version, self.stats.instance, batch.size, mean, batch.ranges)
            self._producer.send(self.options.gradients_topic, key=self.options.deployment.encode(),
                                value=record.to_json()).get(timeout=60)
        finally:
            mean.fill(0.0)
        self.stats.published += 1
        self.stats.records += batch.size
        # Committed for the group's next owner (a failure is logged: that owner re-reads, a second, charged use).
        published = {key: batch.ranges[self._key(key)][1] for key in batch.starts}
        self._published_here.update(published)
        self._source.acknowledge(published)


def _stop_if_abandoned(model: ModelVersion) -> None:
    """The coordinator gave the plan up (its last record says why): the worker stops with that line
    (:class:`~panpriv.streamer.errors.PlanStalled`, exit code 4), its open batch lost as on a stop."""
    if model.abandoned:
        raise PlanStalled(f"the coordinator abandoned the model at version {model.version}: {model.abandoned}")


def run(options: WorkerOptions, stop: threading.Event | None = None) -> WorkerStats:
    """Serve until SIGTERM/SIGINT (or ``stop``), the model is done, or the budget refuses, in the
    role loop (:mod:`panpriv.streamer.runtime.role_loop`: signals, the clients closed, ``--rate``)."""
    workers: list[Worker] = []

    def status() -> str:
        if not workers:
            return "setting up"
        stats = workers[0].stats
        return (f"{stats.published} noisy means published ({stats.records:,} records), newest model version "
                f"{workers[0]._newest}, {sum(stats.lost.values())} batches lost")

    with RoleLoop("worker", stop=stop, rate=options.rate, status=status) as loop:
        state = worker_state(options.out) if options.out is not None else None
        if state is not None:  # one process per --out: two workers there would be one budget instance
            loop.close_on_exit(state.lock().release, "state directory lock")
        instance = worker_instance(state, options.deployment)
        ensure_topics(options.bootstrap, scaleout_topics(options.gradients_topic, options.model_topic))
        workers.append(Worker(options, loop, instance, state))
        return workers[0].run()
