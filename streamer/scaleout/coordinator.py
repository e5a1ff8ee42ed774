"""``panpriv coordinate``: the coordinator of one scaled-out pan-private AC-SA model.

It reads noisy batch means from the gradients topic (:class:`~panpriv.streamer.scaleout.wire.GradientRecord`)
and applies the public rule of :mod:`panpriv.protocols.pan_acsa_scaleout` (synchronous versions): step v
waits for K means computed at version v, averages them, applies Cheu et al. 2022 Alg. 6 lines 10–12
(:meth:`~panpriv.protocols.batch_worker.BatchWorkerLearner.apply_noisy_gradient`) and publishes version v + 1 to the compacted model
topic. Means tagged with another version are counted (``stale``) and dropped; the workers take
places at a version only while they are free (:mod:`panpriv.streamer.scaleout.tally`), so a stale
mean is the trace of two workers taking a freed place at once and filling their batches within a
few milliseconds of each other (after a worker died: 1 of 54 means in the SIGKILL test).

**Waiting, and a plan that cannot complete** (issue 35). The workers' open-batch leases on the
gradients topic tell the coordinator whom it waits for: it logs the version, the means in and from
whom, the open batches and the workers heard from but silent there (every
:data:`WAIT_LOG_S` seconds while no step is taken) and exports them
(``panpriv_scaleout_coordinator_waiting_*``). *Progress* is a step, a mean of the awaited version,
or a lease there with more records than before; with ``stall_timeout_s`` (``--stall-timeout``) set,
no progress for that long means that every worker is gone, or that the workers have read every
record there is and the open versions cannot fill: the coordinator stops with one line
(:class:`~panpriv.streamer.errors.PlanStalled`, exit code 4) instead of waiting in silence — after
publishing its version once more, marked *abandoned* with that line, so that the workers stop too
(exit code 4; a finished model's record is marked ``done``: they stop with exit code 0).

**Privacy.** The coordinator reads no record and adds no noise: everything it holds and publishes
is post-processing of the workers' noisy means, each (ε, δ)-DP on its own batch. It charges nothing
to the budget store (the workers charge what they read).

**Resuming.** The model record holds the whole state (iterates, counters, the gradients-topic
offset after the last step's K-th mean). A restarted coordinator reads the newest record, seeks the
gradients topic there and re-reads the means of the step in progress: its steps are deterministic
functions of the record and the topic, so a step interrupted by a crash is recomputed bit for bit,
and republishing a version (same key, compacted) changes nothing.

**Metrics** (``--metrics-port``; :class:`panpriv.streamer.scaleout.metrics.CoordinatorMetrics`): steps,
means received, used, stale and rejected, the published version and when it was acknowledged.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.batch_worker import BatchWorkerLearner, supports_batch_workers
from panpriv.protocols.pan_acsa_scaleout import combine, worker_batch
from panpriv.streamer.errors import ConfigError, PlanStalled
from panpriv.streamer.runtime.learners import from_public_config
from panpriv.streamer.scaleout.metrics import CoordinatorMetrics
from panpriv.streamer.scaleout.tally import VersionTally, mean_problem
from panpriv.streamer.scaleout.wire import (
    BatchOpen,
    GradientRecord,
    ModelReader,
    ModelVersion,
    WireError,
    decode_state,
    encode_state,
    scaleout_topics,
)

log = logging.getLogger("panpriv.coordinate")

WAIT_LOG_S = 10.0
"""The coordinator logs what it waits for every this many seconds while no step is taken."""

STALL_TIMEOUT_S = 600.0
"""``--stall-timeout``'s default: ten minutes without a record read toward the awaited version (a
live stream that pauses longer sets more, or 0: never)."""


class Coordinator:
    """The coordinator's state machine (no I/O).

    Parameters
    ----------
    learner
        The model's learner, a :class:`~panpriv.protocols.batch_worker.BatchWorkerLearner`;
        :meth:`~panpriv.protocols.batch_worker.BatchWorkerLearner.plan_for_workers` is applied here.
    workers
        K: noisy means per step.
    deployment
        The model's name (the key on both topics).
    max_steps
        Stop after this many steps (``None``: when the first planned epoch is over).
    """

    def __init__(self, learner: BatchWorkerLearner, workers: int, deployment: str, max_steps: int | None = None) -> None:
        self.learner = learner
        self.learner.plan_for_workers(workers)
        self.workers = workers
        self.deployment = deployment
        self.max_steps = max_steps
        self.version = 0
        self.offset = 0
        self.records = 0
        self.stale = 0
        self.rejected: Counter[str] = Counter()
        self.pending: list[GradientRecord] = []
        self.received = 0  # gradient records of this deployment (or malformed) handled by this process
        self.tally = VersionTally(deployment)  # leases and who was heard from (not state: re-read on a restart)
        self.progress_at = time.monotonic()  # the last step, mean of the awaited version or growing lease
        self._fills: dict[str, tuple[int, int]] = {}  # worker → (version, filled) of its newest lease
        self.abandoned = ""  # why the plan was given up (published on the model topic for the workers)

    @property
    def worker_batch(self) -> int:
        """w of the current step (public: from the plan)."""
        return worker_batch(self.learner.step_batch_size(), self.workers)

    @property
    def done(self) -> bool:
        """The learner's planned steps are done (pan-acsa: its first epoch), or ``max_steps`` are."""
        if self.max_steps is not None and self.version >= self.max_steps:
            return True
        return self.learner.plan_complete

    def handle(self, value: bytes | None, offset: int, now: float | None = None) -> bool:
        """One record of the gradients topic at ``offset``, read at monotonic time ``now``; True if
        it completed a step. An open-batch lease is noted (whom the step waits for), not counted."""
        if self.done:
            return False
        now = time.monotonic() if now is None else now
        try:
            record = self.tally.take(value, now, offset)
        except WireError:
            self.received += 1
            self.rejected["malformed"] += 1
            return False
        if record is None:
            return False
        if isinstance(record, BatchOpen):
            if record.withdrawn:
                return False
            if record.version == self.version and self._fills.get(record.worker) != (record.version, record.filled):
                self.progress_at = now
            self._fills[record.worker] = (record.version, record.filled)
            return False
        self.received += 1
        if record.version != self.version:
            self.stale += 1
            return False
        problem = mean_problem(record, self.worker_batch, self.learner.param_count)
        if problem is not None:
            self.rejected[problem] += 1
            return False
        self.progress_at = now
        self.pending.append(record)
        if len(self.pending) < self.workers:
            return False
        step = combine([r.gradient for r in self.pending])
        self.records += sum(r.records for r in self.pending)
        self.pending = []
        self.learner.apply_noisy_gradient(step)
        step.fill(0.0)
        self.version += 1
        self.offset = offset + 1
        self.tally.forget_before(self.version)
        return True

    def waiting(self, now: float) -> str:
        """What the next step waits for, in one line (counts and worker instances only)."""
        means = [r.worker for r in self.pending]
        open_at = self.tally.open_at(self.version, now)
        silent = sorted(set(self.tally.seen) - set(means) - set(open_at))
        text = f"waiting for the means of version {self.version}: {len(means)} of K = {self.workers} in"
        text += f" (from {', '.join(means)})" if means else ""
        text += ("; batches open there: " + ", ".join(
            f"{w} ({lease.filled} of {lease.size} records)" for w, lease in sorted(open_at.items()))
                 if open_at else "; no batch open there")
        if silent:
            text += f"; heard from before but not there: {', '.join(silent)}"
        elif not self.tally.seen:
            text += "; no worker heard from yet"
        return text

    def report(self) -> PrivacyReport:
        """The learner's statement with the records stepped on so far (the coordinator's learner
        reads none itself): (ε, δ) per record for outputs and for one intrusion into one worker."""
        report = self.learner.privacy()
        scaled = (f"scaled out over K = {self.workers} workers (synchronous versions): each batch is one worker's, its "
                  "noisy mean is published on the gradients topic, and the intrusion is one read of one worker's state "
                  "(or of the coordinator's, which holds post-processing only)")
        return dataclasses.replace(report, records=self.records, assumptions=(*report.assumptions, scaled))

    def model(self) -> ModelVersion:
        """The public record of the current version (the coordinator's whole state)."""
        state = self.learner.state_dict()
        return ModelVersion(
            self.deployment, self.version, self.workers, self.worker_batch, self.learner.config(), encode_state(state),
            self.learner.release(), self.offset, self.records, self.stale, self.done,
            self.report().statement(), {"rejected": dict(self.rejected), "max_steps": self.max_steps}, self.learner.name,
            self.abandoned,
        )

    @classmethod
    def restore(cls, record: ModelVersion) -> Coordinator:
        """The coordinator as of ``record`` (the step in progress is re-read from its offset)."""
        learner = batch_worker_learner(record.learner, record.config)
        coordinator = cls(learner, record.workers, record.deployment, record.extra.get("max_steps"))
        learner.load_state_dict(decode_state(record.state))
        coordinator.version, coordinator.offset = record.version, record.gradients_offset
        coordinator.records, coordinator.stale = record.records, record.stale
        coordinator.rejected = Counter({str(k): int(v) for k, v in record.extra.get("rejected", {}).items()})
        return coordinator


def batch_worker_learner(name: str, config: Mapping[str, Any]) -> BatchWorkerLearner:
    """The learner ``name`` of a model record, from its public config (the one factory), if it can
    run on many workers (:class:`~panpriv.protocols.batch_worker.BatchWorkerLearner`)."""
    learner = from_public_config(name, config)
    if not isinstance(learner, BatchWorkerLearner):
        raise ConfigError(f"learner {name!r} cannot run on many workers (it is not a BatchWorkerLearner); "
                          f"these can: {', '.join(batch_worker_names())}")
    return learner


def batch_worker_names() -> list[str]:
    """The catalogued learners that declare the scale-out capability."""
    from panpriv.protocols.catalogue import learner_names, load_learner

    return [name for name in learner_names() if supports_batch_workers(load_learner(name))]


@dataclass
class CoordinateOptions:
    """What ``panpriv coordinate`` needs (``learner`` is called only when the model topic is empty)."""

    bootstrap: list[str]
    gradients_topic: str
    model_topic: str
    deployment: str
    workers: int
    learner: Callable[[], BatchWorkerLearner]
    max_steps: int | None = None
    metrics: CoordinatorMetrics | None = None
    stall_timeout_s: float = STALL_TIMEOUT_S  # 0: wait for ever


def run(options: CoordinateOptions, stop: threading.Event | None = None) -> Coordinator:
    """Serve until SIGTERM/SIGINT (or ``stop``) or the model is done, in the role loop
    (:mod:`panpriv.streamer.runtime.role_loop`); return the final state."""
    from kafka import TopicPartition

    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.kafka.topics import ensure_topics
    from panpriv.streamer.runtime.role_loop import RoleLoop

    holder: dict[str, Coordinator] = {}

    def status() -> str:
        coordinator = holder.get("coordinator")
        if coordinator is None:
            return "setting up"
        return f"{coordinator.waiting(time.monotonic())}; {coordinator.stale} stale means so far"

    with RoleLoop("coordinator", stop=stop, status=status) as loop:
        ensure_topics(options.bootstrap, scaleout_topics(options.gradients_topic, options.model_topic))
        reader = ModelReader(options.bootstrap, options.model_topic, options.deployment)
        try:
            saved = reader.read_to_end()
        finally:
            reader.close()
        if saved is not None:
            coordinator = Coordinator.restore(saved)
            if coordinator.workers != options.workers:
                log.warning("resuming with K = %d from the model topic (--workers %d ignored)", coordinator.workers, options.workers)
            log.info("coordinator: resumed at version %d, gradients offset %d", coordinator.version, coordinator.offset)
        else:
            coordinator = Coordinator(options.learner(), options.workers, options.deployment, options.max_steps)
        holder["coordinator"] = coordinator
        metrics = options.metrics
        if metrics is not None:
            metrics.resume(coordinator.stale, coordinator.rejected)  # the restored totals are not counted again
        producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0)
        loop.close_on_exit(producer.close, "model producer")
        consumer = kafka_client.consumer(options.bootstrap, group_id=None, enable_auto_commit=False)
        loop.close_on_exit(consumer.close, "gradients consumer")

        def publish() -> None:
            producer.send(options.model_topic, key=coordinator.deployment.encode(), value=coordinator.model().to_json()).get(timeout=60)
            if metrics is not None:
                metrics.observe_published(coordinator.version, time.time())

        tp = TopicPartition(options.gradients_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, coordinator.offset)
        publish()
        log.info("coordinator: version %d published (K = %d, w = %d)", coordinator.version, coordinator.workers,
                 coordinator.worker_batch)

        coordinator.progress_at = stepped_at = time.monotonic()

        def log_waiting() -> None:
            if time.monotonic() - stepped_at >= WAIT_LOG_S and not coordinator.done:
                log.info("coordinator: %s", coordinator.waiting(time.monotonic()))

        loop.every(WAIT_LOG_S, log_waiting, start_now=False)

        def step() -> None:
            nonlocal stepped_at
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    if record.offset < coordinator.offset:
                        continue
                    received = coordinator.received
                    stepped = coordinator.handle(record.value, record.offset, time.monotonic())
                    if metrics is not None and coordinator.received > received:
                        metrics.observe_mean(coordinator.stale, coordinator.rejected)
                        if stepped:
                            metrics.observe_step(coordinator.workers)
                    if stepped:
                        publish()
                        stepped_at = time.monotonic()
                        log.info("coordinator: version %d published (%d records, %d stale means)", coordinator.version,
                                 coordinator.records, coordinator.stale)
            now = time.monotonic()
            if metrics is not None:
                metrics.observe_waiting(coordinator.version, coordinator.workers - len(coordinator.pending),
                                        now - stepped_at, coordinator.tally.open_at(coordinator.version, now))
            quiet = now - coordinator.progress_at
            if options.stall_timeout_s and quiet > options.stall_timeout_s and not coordinator.done:
                coordinator.abandoned = (
                    f"the plan cannot complete: no progress for {math.floor(quiet)} s (--stall-timeout "
                    f"{options.stall_timeout_s:g}): {coordinator.waiting(now)}. Every worker is gone, or the workers have "
                    f"read every record there is; the model topic holds version {coordinator.version} (resume: restart "
                    "the coordinator once workers and records are back)")
                publish()  # the workers read the end on the model topic and stop
                raise PlanStalled(coordinator.abandoned)

        loop.run(step, done=lambda: coordinator.done)
    log.info("coordinator stopped at version %d%s", coordinator.version, " (done)" if coordinator.done else "")
    return coordinator
