"""``panpriv worker``: one consumer-group member of a scaled-out pan-private AC-SA model.

Per batch (Cheu et al. 2022 Alg. 6 lines 4–9, through :class:`PanPrivateACSA`'s own methods): load
θ^md of the newest model version from the model topic, and when the first records arrive draw
g ← N(0, ζ(w)² I); charge the positions to the budget store, then add each record's clipped
gradient /w (the fused path); at w records add the second draw and publish the **noisy mean**,
tagged with the version, to the gradients topic. Nothing else leaves the process: no record, no
partial sum, no clean gradient. An intruder who reads the worker once sees its iterate copy
(public) and Z + partial sum/w (Lemma C.4, Case 2).

**Synchronous versions.** After publishing at version v the worker waits for version v + 1 (at
most ``sync_wait`` seconds; then it takes another batch at v, so K − 1 surviving workers still
make progress) — one mean per worker per version in the normal case, so few means go stale.

**Budget** (:mod:`panpriv.streamer.budget.store`; one store per data source, shared with every run). A worker
is a run with its own instance; it charges each poll's positions *before* learning them, marks
its published positions durable *before* publishing (so a crash can only over-count), and
commits the group offsets after the publication is acknowledged. A batch that reaches no output —
partitions revoked by a rebalance, a stop, or (on restart with the same ``--out``) a SIGKILL — is
moved to an intrusion-only *lost* instance (:func:`panpriv.accounting.budget.lost_state_report`); the new
owner of those records charges them again: a second use for intrusion, none for output.

**Metrics** (``--metrics-port``; :class:`panpriv.streamer.scaleout.metrics.WorkerMetrics`): the counts of
:class:`WorkerStats`, the newest version, and the budget store's composed guarantee of the records
this worker charged — nothing computed from a record.
"""

from __future__ import annotations

import json
import logging
import signal
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import lost_state_report, per_source, report_for
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.streamer.scaleout.metrics import WorkerMetrics
from panpriv.streamer.scaleout.wire import GradientRecord, ModelReader, ModelRecord, query_state

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
    store: Any  # panpriv.streamer.budget.store.BudgetStore or panpriv.streamer.budget.kafka_store.KafkaBudgetStore
    out: Path | None = None
    sync_wait_s: float = 2.0
    max_epsilon: float | None = None
    record_format: str = "json"
    rate: float = 0.0
    metrics: WorkerMetrics | None = None
    privacy_interval_s: float = 5.0  # the metrics' privacy gauges: the store composes every use


@dataclass
class _Batch:
    """The open batch: its version and size, what it has read (positions per data key)."""

    version: int
    size: int
    filled: int = 0
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)


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


class _Revocations:
    """Notes partition revocations (the open batch is then lost); wrapped by :func:`_listener`."""

    def __init__(self) -> None:
        self.revoked = False


def _listener(revocations: _Revocations) -> Any:
    """A ``kafka.ConsumerRebalanceListener`` (kafka-python insists on the subclass) feeding ``revocations``."""
    from kafka import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            if revoked:
                revocations.revoked = True

        def on_partitions_assigned(self, assigned: Any) -> None:
            pass

    return Listener()


def _instance(out: Path | None, deployment: str) -> str:
    """The worker's budget instance: kept in ``out/worker.json`` so that a restart with the same
    ``--out`` accounts the state a crash lost; otherwise fresh."""
    if out is not None and (out / STATE_FILE).exists():
        return str(json.loads((out / STATE_FILE).read_text())["instance"])
    instance = f"scaleout:{deployment}/worker-{uuid.uuid4().hex[:12]}"
    if out is not None:
        from panpriv.streamer.state.atomic_files import write_atomically

        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(out / STATE_FILE, json.dumps({"instance": instance}).encode(), "worker state")
    return instance


class Worker:
    """The worker's loop and its dealings with the budget store (module docstring)."""

    def __init__(self, options: WorkerOptions) -> None:
        from kafka.structs import TopicPartition  # noqa: F401 - imported early: fails fast without kafka-python

        from panpriv.streamer.kafka import client as kafka_client

        self.options = options
        self.stats = WorkerStats(_instance(options.out, options.deployment))
        self.store = options.store
        self.learner: PanPrivateACSA | None = None
        self.version = -1  # the version loaded into the learner
        self.durable: dict[str, int] = {}
        self._sequence = 0
        self._losses = 0
        self._revocations = _Revocations()
        self._reader = ModelReader(options.bootstrap, options.model_topic, options.deployment)
        self._producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0)
        self._consumer = kafka_client.consumer(options.bootstrap, group_id=options.group, enable_auto_commit=False,
                                               auto_offset_reset="earliest")
        self._consumer.subscribe([options.data_topic], listener=_listener(self._revocations))
        from panpriv.streamer.sources.identity import kafka_cluster_identity

        self._consumer.partitions_for_topic(options.data_topic)
        self._cluster = kafka_cluster_identity(self._consumer, options.bootstrap)
        self._codec: Any = None
        self._paced = 0
        self._paced_since: float | None = None
        self._newest = -1  # the newest model version read
        self._charged: set[str] = set()  # data keys this instance has charged
        self._privacy_at: float | None = None  # monotonic time of the last privacy refresh

    # -- the model --------------------------------------------------------------------------------

    def _first_model(self, stopping: Mapping[str, bool]) -> ModelRecord | None:
        while not stopping["now"]:
            model = self._reader.poll(200)
            if model is not None:
                return model
        return None

    def _setup(self, model: ModelRecord) -> None:
        """Build the learner from the model's public config; register the run; account a lost state."""
        from panpriv.streamer.config import RecordsConfig
        from panpriv.streamer.io.codec import make_codec

        learner = PanPrivateACSA.from_config(model.config)
        learner.plan_for_workers(model.workers)
        if self.options.max_epsilon is not None and learner.epsilon > self.options.max_epsilon:
            raise ValueError(f"the model's epsilon {learner.epsilon:g} exceeds this worker's --max-epsilon")
        self.learner = learner
        self._codec = make_codec(RecordsConfig.model_validate(
            {"format": self.options.record_format, "dim": learner.dim, "feature_bound": learner.feature_bound}))
        previous = self.store.run_state(self.stats.instance)
        self.store.begin_run(self.stats.instance, self.options.out or ".", f"kafka:{self.options.data_topic}")
        self.store.register(self.stats.instance, self.stats.instance, learner.privacy(), self.options.out or ".")
        if previous is not None:  # a restart with the same --out: what the last process left unpublished was lost
            self.durable = dict(previous.positions)
            self._sequence = previous.sequence
            self._losses = previous.losses
            self._charged.update(previous.positions)
            if self._reclassify("restart after a crash"):
                self.stats.lost["crash"] += 1
        self._observe_privacy(force=True)

    def _load(self, model: ModelRecord) -> None:
        assert self.learner is not None
        if model.version != self.version:
            self.learner.load_state_dict(query_state(model.state))
            self.version = model.version

    # -- the budget -------------------------------------------------------------------------------

    def _key(self, topic: str, partition: int) -> str:
        return f"kafka:{self._cluster}/{topic}/{partition}"

    def _reclassify(self, why: str) -> bool:
        """Move this instance's charges beyond its published positions to a lost (intrusion-only)
        instance; True if there were any."""
        assert self.learner is not None
        lost = self.store.reclassify_lost(self.stats.instance, self.durable, f"{self.stats.instance}/lost-{self._losses + 1:03d}",
                                          lost_state_report(self.learner.privacy()))
        if lost:
            self._losses += 1
            log.warning("worker %s: %s; records read into the lost batch are charged as an intrusion-only use: %s",
                        self.stats.instance, why, ", ".join(f"{k} [{a}, {b})" for k, (a, b) in sorted(lost.items())))
        return bool(lost)

    def _discard(self, batch: _Batch | None, why: str, reason: str) -> None:
        """Drop the open batch (``reason``: one of :data:`panpriv.streamer.scaleout.metrics.LOST_REASONS`)."""
        if batch is None:
            return
        assert self.learner is not None
        self.learner.discard_batch()
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

    def _observe_privacy(self, force: bool = False) -> None:
        """The budget store's guarantee of the records this worker charged, composed over every run
        that used them (the service's statement, :func:`panpriv.accounting.budget.report_for`), and per data
        source; at most every ``privacy_interval_s`` seconds unless ``force``."""
        metrics = self.options.metrics
        now = time.monotonic()
        if metrics is None or (not force and self._privacy_at is not None
                               and now - self._privacy_at < self.options.privacy_interval_s):
            return
        self._privacy_at = now
        ledger = self.store.ledger(sorted(self._charged))
        instance = self.stats.instance
        mine = [name for name in ledger.instances if name == instance or name.startswith(f"{instance}/lost-")]
        metrics.observe_privacy(report_for(ledger, mine, self.stats.records), per_source(ledger))

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, stopping: Mapping[str, bool]) -> WorkerStats:
        model = self._first_model(stopping)
        if model is None:
            return self.stats
        self._setup(model)
        batch: _Batch | None = None
        published_at = -1
        waiting_since = time.monotonic()
        waiting = False  # after publishing at published_at, until the next version or --sync-wait
        try:
            while not stopping["now"]:
                self._observe()
                model = self._reader.poll(0) or model
                self._newest = max(self._newest, model.version)
                if waiting and (model.version != published_at or time.monotonic() - waiting_since >= self.options.sync_wait_s):
                    waiting = False
                    self.stats.waits["arrived" if model.version != published_at else "timed_out"] += 1
                    self.stats.wait_s += time.monotonic() - waiting_since
                if model.done:
                    self.stats.reason = "the model is done"
                    break
                if batch is None and model.version == published_at and time.monotonic() - waiting_since < self.options.sync_wait_s:
                    model = self._reader.poll(50) or model  # synchronous versions: wait for the next one
                    continue
                want = model.worker_batch if batch is None else batch.size - batch.filled
                if self.options.rate > 0:  # paced: polls of a tenth of a second's records
                    want = min(want, max(1, int(self.options.rate / 10)))
                polled = self._consumer.poll(timeout_ms=200, max_records=want)
                if self._revocations.revoked:
                    self._revocations.revoked = False
                    self._discard(batch, "partitions revoked mid-batch", "revoked")
                    batch = None
                records = [r for rs in polled.values() for r in rs]
                if not records:
                    self._observe_privacy()
                    continue
                if batch is None:
                    self._load(model)
                    batch = _Batch(model.version, model.worker_batch)
                    assert self.learner is not None
                    self.learner.open_batch(batch.size)  # Alg. 6 lines 4–5
                if not self._learn(batch, records):
                    self._discard(batch, self.stats.reason, "budget")
                    batch = None
                    break
                self._pace(len(records))
                if batch.filled >= batch.size:
                    self._publish(batch)
                    published_at, waiting_since, waiting = batch.version, time.monotonic(), True
                    batch = None
                    self._observe_privacy()
        finally:
            self._discard(batch, "stopped mid-batch", "stopped")
            self.store.mark_durable(self.stats.instance, self._sequence, self.durable, clean=True)
            try:
                self._observe()
                self._observe_privacy(force=True)
            except Exception as exc:  # noqa: BLE001 - the last refresh must not hide why the loop ended
                log.warning("worker %s: final metrics refresh failed: %s", self.stats.instance, exc)
            finally:
                self._close()
        return self.stats

    def _pace(self, count: int) -> None:
        """Keep to ``rate`` records/s (0: unpaced), counted from the first record read."""
        if self.options.rate <= 0:
            return
        now = time.monotonic()
        if self._paced_since is None:
            self._paced_since = now
        self._paced += count
        ahead = self._paced / self.options.rate - (now - self._paced_since)
        if ahead > 0:
            time.sleep(ahead)

    def _learn(self, batch: _Batch, records: list[Any]) -> bool:
        """Charge, then learn ``records`` into the open batch (Alg. 6 line 7); False if the budget refuses."""
        assert self.learner is not None
        ranges: dict[str, tuple[int, int]] = {}
        for record in records:
            key = self._key(record.topic, record.partition)
            start, stop = ranges.get(key, (record.offset, record.offset + 1))
            ranges[key] = (min(start, record.offset), max(stop, record.offset + 1))
        excess = self.store.charge(self.stats.instance, ranges, self.options.max_epsilon)
        self._charged.update(ranges)
        if excess is not None:
            self.stats.reason = "stopped before records that would exceed the budget over all runs"
            return False
        for key, (start, stop) in ranges.items():
            a, b = batch.ranges.get(key, (start, stop))
            batch.ranges[key] = (min(a, start), max(b, stop))
        decoded = self._codec.decode([r.value for r in records])
        try:
            self.stats.rejected += len(records) - decoded.X.shape[0]
            self.stats.rejects.update(decoded.reject_counts())
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
            self.store.mark_durable(self.stats.instance, self._sequence, self.durable)
            record = GradientRecord(self.options.deployment, batch.version, self.stats.instance, batch.size, mean, batch.ranges)
            self._producer.send(self.options.gradients_topic, key=self.options.deployment.encode(),
                                value=record.to_json()).get(timeout=60)
        finally:
            mean.fill(0.0)
        self.stats.published += 1
        self.stats.records += batch.size
        try:
            self._consumer.commit()
        except Exception as exc:  # noqa: BLE001 - a rebalance: the new owner re-reads (a second, charged use)
            log.warning("worker %s: offset commit failed after publishing (%s): the records may be read again", self.stats.instance, exc)

    def _close(self) -> None:
        for closer in (self._consumer.close, self._producer.close, self._reader.close):
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - closing on the way out
                log.debug("close failed: %s", exc)


def run(options: WorkerOptions) -> WorkerStats:
    """Serve until SIGTERM/SIGINT or the model is done."""
    stopping = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["now"] = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    return Worker(options).run(stopping)
