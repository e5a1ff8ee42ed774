"""The processor: one run, from set-up to the final checkpoint, and why nothing is learned twice.

Parts
-----
The processor sets a run up and tears it down; each part of the run is its own module:

* :mod:`panpriv.streamer.state.training_state` — the learner, its ledger, positions and counters (what a
  checkpoint saves), built anew or restored from the manifest;
* :mod:`panpriv.streamer.budget.session` — the budget store shared by every run: registration, crash
  accounting, the refusal to start, durable charges before learning, the composed report;
* a driver (:mod:`panpriv.streamer.runtime.driver`): :mod:`panpriv.streamer.runtime.stream_driver` polls a sequential source and
  learns each micro-batch; :mod:`panpriv.streamer.runtime.recorded_driver` lets a learner that reads a recording by
  record index run its own passes;
* :mod:`panpriv.streamer.runtime.heartbeat` — between micro-batches: cadence, progress and status lines, lag, and
  the checkpoint when due (every ``checkpoint.every_records`` records or ``every_seconds`` seconds;
  a snapshot every ``snapshots.every_records`` records);
* :mod:`panpriv.streamer.runtime.transaction` — one checkpoint: snapshot, register, flush, manifest, acknowledge,
  release, in that order.

On SIGTERM/SIGINT the run stops consuming, takes a final checkpoint and snapshot, and returns (the
CLI exits 0). When the composed guarantee would exceed ``learner.max_epsilon``, it stops *before*
learning the batch that would spend it (an outcome, not a crash).

Checkpoint order (quix-streams'; :mod:`panpriv.streamer.runtime.transaction`): (1) take the snapshot from the
learner; (2) register the learner's guarantee; (3) flush the dead-letter producer; (4) write the
manifest atomically and note the durable positions in the budget store; (5) only now acknowledge
upstream (Kafka offset commit) and (6) emit the snapshot.

Why each record contributes exactly once to the state that survives a crash
--------------------------------------------------------------------------
Let C be the last durable checkpoint. It holds the learner state S after learning exactly the
records at positions before P (per source key), the ledger charged with exactly those ranges, and
P itself — all written in one atomic ``os.replace``, so they always agree.

* A crash (``kill -9``, power loss) loses only what happened after C. The restarted process loads
  C, and the source resumes at P: a Kafka partition is ``seek``-ed to P when assigned (never to the
  group's committed offset when that is behind P — commits happen only after a checkpoint is
  durable, so the committed offset is at most P for a single consumer); a file is read from line P.
  Records before P are in S once and are never read again; records at or after P are not in S and
  are read next. A message whose offset is below the key's position is dropped on arrival, so a
  redelivery cannot enter S twice. Hence every record enters the surviving state exactly once, and
  the ledger, restored from the same manifest, charges each position exactly once.
* Nothing released depends on lost work: a snapshot is emitted only after the checkpoint holding
  its records is durable, and a metric is a count, a timing or a ledger number. After a crash the
  released snapshots all describe states that C or an earlier checkpoint contains, so the next
  snapshot's record count never goes backwards. (A crash between (4) and (6) loses that snapshot;
  its release was already accounted in the checkpoint — conservative.)
* Rebalances (several processes in one group): before partitions are revoked, the current
  positions are committed and then checkpointed, so the next owner starts where this process's
  durable state ends; on assignment a partition is seeked to max(our position, committed offset,
  first retained offset), so a record already in another process's durable state is not learned
  again here. A failure in that revocation step is fatal: the process stops without a final
  checkpoint (as if it crashed). Across processes the guarantee has one gap: a process killed
  between a checkpoint becoming durable and its offset commit (milliseconds) leaves a committed
  offset behind its durable positions, and the partition's next owner re-reads that interval, so
  two learners (two ledgers) hold those records. For exactly-once across the whole stream, run one
  process per consumer group (or give each process its own topics).
* Any unexpected error also exits without a final checkpoint, for the same reason.
* What the lost work cost (issue 13): records learned after C were in the process's state, which
  an intrusion could have read, though nothing was released from it. They were charged to the
  budget store before they were learned, so on restart the store still holds the charges beyond
  P; they become an intrusion-only *lost* instance and the re-learning charges the run again, so
  the guarantee stated for those records is the composition of both uses
  (:mod:`panpriv.accounting.budget`, :mod:`panpriv.streamer.budget.session`).

Learners that read a recording by record index (``shuffled-pnsgd``, ``shuffle-gd``) are driven by
:mod:`panpriv.streamer.runtime.recorded_driver`, where the same argument is made with "positions" replaced by
"records learned in the pass"; what is charged for a batch is in :mod:`panpriv.streamer.runtime.stream_driver`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.protocols.base import Learner
from panpriv.protocols.schema import FeatureSchema
from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.config import ServiceConfig, privacy_hash, privacy_relevant
from panpriv.streamer.datasets import adult
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.io.sinks import DeadLetterSink, JsonlSnapshotSink, KafkaSnapshotSink, SnapshotSink
from panpriv.streamer.io.source_url import KafkaUrl, parse_source_url
from panpriv.streamer.kafka import client as kafka_client
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime import allocator, exposure
from panpriv.streamer.runtime.delta_target import check_delta_target
from panpriv.streamer.runtime.driver import Driver, Outcome
from panpriv.streamer.runtime.heartbeat import Heartbeat, LagReporter
from panpriv.streamer.runtime.learners import build_learner, constructor_arguments, learner_class, restore_learner
from panpriv.streamer.runtime.pacing import Cadence, Pacer
from panpriv.streamer.runtime.progress import Progress
from panpriv.streamer.runtime.recorded_driver import RecordedDriver, open_indexed, reads_by_index
from panpriv.streamer.runtime.role_loop import RoleLoop
from panpriv.streamer.runtime.status import StatusLine
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.runtime.transaction import CheckpointTransaction
from panpriv.streamer.serving.holdout import Holdout
from panpriv.streamer.sources.base import Source
from panpriv.streamer.sources.open import open_source
from panpriv.streamer.state.checkpoint import Checkpoint, CheckpointStore, check_resumable
from panpriv.streamer.state.lock import OutputLock
from panpriv.streamer.state.training_state import TrainingState, new_instance

log = logging.getLogger("panpriv.processor")


@dataclass(frozen=True)
class RunResult:
    """What a run did (counts, the final report, where things went)."""

    outcome: Outcome
    message: str
    records: int
    rejects: dict[str, int]
    snapshots: int
    last_snapshot: dict[str, Any] | None
    report: PrivacyReport
    checkpoint_path: Path
    snapshot_path: Path | None
    learner: Learner
    instance: str
    resumed: bool


class Processor:
    """Runs one configuration to completion (finite source), a stop signal, or budget exhaustion.

    Parameters
    ----------
    config
        The validated configuration; ``config.out`` must be set.
    metrics
        Where to report (``None``: a private registry nobody reads).
    progress
        ``True`` to draw a progress line on stderr (see :mod:`panpriv.streamer.runtime.progress`).
    stop
        An event that stops the run like SIGTERM does (for embedding and tests).
    """

    def __init__(
        self,
        config: ServiceConfig,
        *,
        metrics: ServiceMetrics | None = None,
        progress: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        if config.out is None:
            raise ConfigError("out: the processor needs an output directory")
        self.config = config
        kafka_client.configure(config.kafka)  # every Kafka client of the run uses [kafka] (panpriv.streamer.kafka.client)
        self.out = Path(config.out)
        self.metrics = metrics if metrics is not None else ServiceMetrics()
        self.stop_event = stop if stop is not None else threading.Event()
        self._progress_enabled = progress
        self.store = CheckpointStore(self.out / "checkpoints")
        self.codec: Codec = make_codec(config.records)
        holdout = config.snapshots.holdout
        self._holdout = Holdout.load(holdout, self.codec) if holdout is not None else None  # public data (panpriv.streamer.serving.holdout)
        # Set up by run():
        self._driver: Driver | None = None
        self._session: BudgetSession | None = None
        self._transaction: CheckpointTransaction | None = None
        self._source: Source | IndexedFile | None = None
        self._sinks: list[SnapshotSink] = []
        self._dead_letters: DeadLetterSink | None = None
        self._lag: LagReporter | None = None
        self._privacy_config: dict[str, Any] = {}
        self._config_hash = ""

    @property
    def snapshot_path(self) -> Path | None:
        return self.out / "snapshots.jsonl" if self.config.snapshots.jsonl else None

    def report(self) -> PrivacyReport:
        """The guarantee of the records this run learned, composed over every run that used them
        (:meth:`BudgetSession.report`)."""
        if self._driver is None or self._session is None:
            raise RuntimeError("the run has not been set up yet")
        return self._session.report(self._driver.state)

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Process until the source is exhausted, a stop is requested, or the budget is spent,
        holding the output directory's lock (:mod:`panpriv.streamer.state.lock`) throughout."""
        with OutputLock(self.out):
            return self._run_locked()

    def _run_locked(self) -> RunResult:
        saved = self.store.load()
        positions = dict(saved.positions) if saved else {}
        with RoleLoop("run", stop=self.stop_event) as loop:  # signals: panpriv.streamer.runtime.role_loop
            source: Source | IndexedFile
            if reads_by_index(learner_class(self.config.learner.name)):
                constructor_arguments(self.config, self.config.learner.n or 1)  # option errors before the scan
                source = open_indexed(self.config.source, self.codec, self.config.learner.name)
            else:
                source = open_source(self.config.source, self.codec, positions, on_revoke=self._checkpoint_on_revoke,
                                     marks=saved.source_marks if saved else None)
            self._source = source
            loop.close_on_exit(source.close, "source")
            try:
                driver = self._set_up(source, saved, positions)
                transaction = self._open_sinks(driver, source, loop)
                loop.ready()  # from now on a signal stops after the current batch, with a final checkpoint
                outcome, message = self._drive(driver, source)
                # Clean stop: the state is consistent with the positions, so make it durable.
                # A final snapshot only if it would release something new: a release is not free
                # for every learner (PNSGD accounts each one), and a learner that has learned
                # nothing (a new run, a restarted pass) has nothing to release. (A learner that saves
                # batch boundaries releases what its last boundary covers: state_records.)
                records = driver.state.learner.state_records
                transaction.commit(
                    snapshot=records not in (0, driver.state.snapshot_records), finished=outcome == "finished", final=True
                )
            except BaseException:
                if self._session is not None:
                    self._session.close()
                raise
        log.info("%s: %s", outcome, message)
        state = driver.state
        result = RunResult(
            outcome=outcome,
            message=message,
            records=state.learner.records_seen,
            rejects=dict(state.rejects),
            snapshots=state.snapshots,
            last_snapshot=state.last_snapshot,
            report=self.report(),
            checkpoint_path=self.store.path,
            snapshot_path=self.snapshot_path,
            learner=state.learner,
            instance=state.instance,
            resumed=saved is not None,
        )
        assert self._session is not None
        self._session.close()
        return result

    # -- set-up ----------------------------------------------------------------------------------

    def _set_up(self, source: Source | IndexedFile, saved: Checkpoint | None, positions: dict[str, int]) -> Driver:
        """Build or restore the learner and its bookkeeping, pick the driver, open the budget session."""
        n = self._public_length(source)
        arguments = constructor_arguments(self.config, n)
        self._privacy_config = privacy_relevant(self.config, arguments)
        self._config_hash = privacy_hash(self._privacy_config)
        state = self._restore(saved, positions) if saved is not None else self._start(n, positions)
        check_delta_target(state.learner, self.config)  # before anything is learned or charged
        for warning in state.learner.utility_warnings():
            log.warning("%s", warning)
        driver: Driver
        if isinstance(source, IndexedFile):
            driver = RecordedDriver(self.config, state, source, self.metrics, self.stop_event,
                                    saved.replay if saved is not None else None)
        else:
            driver = StreamDriver(self.config, state, source, self.codec, self.metrics, self.stop_event,
                                  (saved.learner_state, saved.partial, saved.source_marks) if saved is not None else None)
        self._driver = driver
        if saved is None or (saved.replay is not None and saved.replay.restart):
            if saved is not None:
                state.instance = new_instance(state.learner)
                log.info(
                    "the checkpoint was taken mid-pass by a learner that cannot resume a pass: the pass restarts "
                    "as instance %s, and the ledger composes what the interrupted pass released", state.instance,
                )
            driver.register_learner()
        session = BudgetSession.for_run(self.config, source)
        session.exposure = exposure.sentences(state.learner, source, allocator.wiping())
        self._session = session
        session.begin(state, source, saved)
        driver.session = session
        driver.register_learner()
        if isinstance(driver, RecordedDriver):
            driver.note_boundary()
        return driver

    def _public_length(self, source: Source | IndexedFile) -> int:
        """The public stream length ``n`` the learner is calibrated for."""
        config = self.config
        n = config.learner.n
        if isinstance(source, IndexedFile) and n is not None and n != source.n:
            raise ConfigError(
                f"learner.n = {n:,}, but learner {config.learner.name!r} reads every record of the recording by "
                f"index and {source.path} holds {source.n:,} valid records; leave learner.n unset"
            )
        if n is None:
            n = source.count_records()
        if n is None:
            raise ConfigError(
                "learner.n (the public stream length) must be set for a source whose length is not known "
                "in advance (Kafka): use --n or [learner] n = ..."
            )
        return n

    def _named(self, learner: Learner) -> Learner:
        """The learner with the records' schema, if the run declares one (``records.fields``):
        its snapshots then carry the feature names and the mapping ``panpriv predict`` applies."""
        if self.config.records.fields is not None:
            learner.use_schema(FeatureSchema.from_dict(self.config.records.fields))
        return learner

    def _start(self, n: int, positions: dict[str, int]) -> TrainingState:
        learner = self._named(build_learner(self.config, n))
        state = TrainingState(
            learner=learner,
            ledger=PrivacyLedger(max_records_per_user=self.config.learner.max_records_per_user),
            instance=new_instance(learner),
            positions=positions,
        )
        log.info("new run: learner %s (instance %s), n = %s", learner.name, state.instance, f"{n:,}")
        return state

    def _restore(self, saved: Checkpoint, positions: dict[str, int]) -> TrainingState:
        check_resumable(saved, self._config_hash, self._privacy_config, self.store.path)
        if self.config.learner.seed is not None and saved.records > 0:
            raise ConfigError(
                f"learner.seed: refusing to resume the seeded run in {self.out} — the seed would restart its noise "
                "stream, repeating noise already added to released snapshots (an analyst could cancel it). "
                "Start a new run with another --out (and another seed), or drop --seed for OS-entropy noise."
            )
        log.info(
            "resuming from checkpoint %d (%s records learned, %d source keys)",
            saved.sequence, f"{saved.records:,}", len(saved.positions),
        )
        return TrainingState(
            learner=self._named(
                restore_learner(saved.learner, saved.learner_config, saved.learner_state, self.config.learner.seed)
            ),
            ledger=PrivacyLedger.from_dict(saved.ledger),
            instance=saved.instance,
            positions=positions,
            rejects=Counter(saved.rejects),
            sequence=saved.sequence,
            snapshots=saved.snapshots,
            snapshot_records=saved.snapshot_records,
        )

    def _open_sinks(self, driver: Driver, source: Source | IndexedFile, loop: RoleLoop) -> CheckpointTransaction:
        """Open the snapshot and dead-letter sinks (closed with ``loop``), and the checkpoint transaction that uses them."""
        cfg = self.config
        if self.snapshot_path is not None:
            self._sinks.append(JsonlSnapshotSink(self.snapshot_path))
            loop.close_on_exit(self._sinks[-1].close, "snapshot file")
        parsed = parse_source_url(cfg.source.url)
        kafka_bootstrap = parsed.bootstrap if isinstance(parsed, KafkaUrl) else None
        if cfg.snapshots.kafka_topic:
            bootstrap = [cfg.snapshots.kafka_bootstrap] if cfg.snapshots.kafka_bootstrap else kafka_bootstrap
            if not bootstrap:
                raise ConfigError("snapshots.kafka_bootstrap is required when the source is not Kafka")
            self._sinks.append(KafkaSnapshotSink(bootstrap, cfg.snapshots.kafka_topic))
            loop.close_on_exit(self._sinks[-1].close, "snapshot topic")
        if cfg.source.dead_letter_topic and kafka_bootstrap:
            self._dead_letters = DeadLetterSink(kafka_bootstrap, cfg.source.dead_letter_topic)
            loop.close_on_exit(self._dead_letters.close, "dead-letter topic")
            if isinstance(driver, StreamDriver):
                driver.dead_letters = self._dead_letters
        assert self._session is not None
        self._lag = lag = LagReporter(source, self.metrics, cfg.metrics.lag_interval_s)
        self._transaction = CheckpointTransaction(
            self.store, driver, self._session, self.metrics, source, lag, self._sinks, self._dead_letters,
            self._config_hash, self._privacy_config,
            feature_names=adult.FEATURE_NAMES if cfg.records.format == "adult" else None,
            holdout=self._holdout,
        )
        return self._transaction

    # -- driving ---------------------------------------------------------------------------------

    def _drive(self, driver: Driver, source: Source | IndexedFile) -> tuple[Outcome, str]:
        """Run the driver, with the heartbeat between its micro-batches."""
        over = driver.state.over_budget(self.config.learner.max_epsilon)
        if over is not None:
            limit = self.config.learner.max_epsilon
            return "budget_exhausted", f"the guarantee is already ε = {over:.4g} > max_epsilon = {limit}; nothing learned"
        transaction, lag = self._transaction, self._lag
        assert transaction is not None and lag is not None
        progress = None
        if self._progress_enabled:
            total, start = driver.progress_span()
            progress = Progress(total, start=start)
        heartbeat = Heartbeat(
            driver.state,
            Cadence(self.config),
            lambda snapshot: transaction.commit(snapshot=snapshot),
            self.report,
            StatusLine(None if self._progress_enabled else self.config.status_interval_s),  # off a terminal
            lag,
            progress,
            driver.progress_position,
        )
        try:
            return driver.drive(heartbeat, Pacer(self.config.source.rate))
        finally:
            heartbeat.close()

    def _checkpoint_on_revoke(self) -> None:
        """Kafka is about to revoke partitions: commit our positions, then checkpoint them.

        The next owner starts at the committed offsets, so this is the one place where the commit
        comes first: if it fails, the process stops without a checkpoint (the next owner re-reads
        from the older commit and our durable state ends there too); if the checkpoint fails after
        it, the records in between are in nobody's surviving state — lost, never doubled. The
        commit is of the live positions: a learner that saves only batch boundaries checkpoints
        the last boundary, and the records after it stay in its live state (the next boundary's
        checkpoint holds them; a crash before it loses them, charged as a lost state), so the
        checkpoint's own acknowledgement, which would move the group's offsets back to the
        boundary, is skipped.
        """
        if self._transaction is not None and self._source is not None and self._driver is not None:
            log.info("partitions being revoked: commit and checkpoint first")
            self._source.acknowledge(dict(self._driver.state.positions), strict=True)
            self._transaction.commit(snapshot=False, acknowledge=False)
