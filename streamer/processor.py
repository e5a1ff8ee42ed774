"""The processing loop: micro-batch → charge the budget → validate → learn → ledger → checkpoint → snapshot.

Loop
----
Poll the source for a micro-batch; charge its position ranges to the budget store shared by every
run (:mod:`streamer.budget`: durable before anything is learned, refused if the records' ε over all
runs would exceed ``max_epsilon``); decode and validate it (rejects are counted by reason, optionally
sent to a dead-letter topic; valid records are clipped), ``learn_many`` the valid records, charge
the privacy ledger with the batch's consumed position ranges, and advance the positions. Every
``checkpoint.every_records`` records or ``checkpoint.every_seconds`` seconds, take a checkpoint;
every ``snapshots.every_records`` records, follow the checkpoint with a snapshot. On SIGTERM/SIGINT
stop consuming, take a final checkpoint and snapshot, and return (the CLI exits 0). When the
composed guarantee would exceed ``learner.max_epsilon``, stop *before* learning the batch that would
spend it (an outcome, not a crash).

Checkpoint order (quix-streams'): (1) take the snapshot from the learner (a release may change a
learner's accounting, so it must be in the state saved next); (2) register the learner's current
guarantee in the ledger; (3) flush the dead-letter producer; (4) write the manifest atomically
(:mod:`streamer.checkpoint`): noisy state, positions, ledger, reject counters, config hash, then
note the durable positions in the budget store; (5) only now acknowledge upstream (Kafka offset
commit) and (6) emit the snapshot. Step (2) also writes the learner's guarantee to the budget store
when it changed, so the store never holds a guarantee weaker than what was released.

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
  (:mod:`accounting.budget`, :meth:`Processor._begin_budget`).

Learners that read a recording by record index (``shuffled-pnsgd``, ``shuffle-gd``; what they
declare is in :mod:`streamer.replay`) get an :class:`~streamer.indexed.IndexedFile` instead of a
source and run their own loop (``learn_recorded``); the processor takes control in the ``fetch``
it hands them, between two micro-batches, and does there what the loop above does after a batch.
Each pass is charged with the whole recording when it begins. The exactly-once argument is the
same with "positions" replaced by "records learned in the pass" (saved in the learner's state);
a learner that cannot resume mid-pass restarts the pass after a crash, as a new ledger instance
composed with what the interrupted pass released (:mod:`streamer.replay`).

What is charged. The ledger is charged with the whole consumed range of each batch, rejected
records and non-record lines included: conservative (a rejected record is accounted as if used,
which can only over-state what was spent) and compact (one segment per source key). A replay of
the same range by the same learner — a rewound consumer group, a file replayed into the same
``--out`` after its positions were reset — composes in the ledger rather than being counted once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from accounting.budget import Excess, exceeds, lost_state_report, per_source, report_for
from accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport
from protocols.base import Learner
from protocols.errors import ProtocolError
from protocols.recorded import RecordedLearner
from streamer import kafka_client
from streamer.budget import BudgetExceededError, BudgetStore, describe_excess, open_budget
from streamer.checkpoint import Checkpoint, CheckpointStore, check_resumable
from streamer.codec import Codec, Decoded, make_codec
from streamer.config import ServiceConfig, privacy_hash, privacy_relevant
from streamer.datasets import adult
from streamer.errors import ConfigError, LearnerInputError
from streamer.identity import DataKeys, data_keys_for
from streamer.indexed import IndexedFile
from streamer.learners import build_learner, constructor_arguments, learner_class, restore_learner
from streamer.metrics import ServiceMetrics
from streamer.outlock import OutputLock
from streamer.pacing import Cadence, Pacer
from streamer.progress import Progress
from streamer.reject_guard import RejectGuard
from streamer.replay import Halt, has_round_reports, open_indexed, pass_instance, reads_by_index
from streamer.sinks import DeadLetterSink, JsonlSnapshotSink, KafkaSnapshotSink, SnapshotSink, snapshot_record
from streamer.source_url import KafkaUrl, parse_source_url
from streamer.sources import (
    MARKS_KEY,
    Batch,
    LineFileSource,
    RecordingSource,
    Source,
    SyntheticSource,
    display_name,
    open_source,
    source_marks,
)
from streamer.status import RejectLog, StatusLine

log = logging.getLogger("panpriv.processor")

Outcome = Literal["finished", "stopped", "budget_exhausted"]

PUBLIC_COUNTS = (
    "public, not noised: the number of records read, the rejected ones by reason, and the positions consumed; "
    "the guarantee therefore covers neighbouring streams whose differing record has the same validity "
    "(accepted, or rejected for the same reason)"
)
"""Stated with every report the service releases (issue 13, point 5)."""

SEEDED_OUTPUT = (
    "seeded noise (learner.seed): the output guarantee holds only against an analyst who does not know the seed "
    "(it is stored in the configuration and the checkpoint) and only if no other run uses the same seed; a seeded "
    "run refuses to resume, so its noise stream never restarts"
)
"""Stated with every report of a seeded run (issue 13, point 4)."""

_OPEN_END = 2**62
"""The end of a range "from here to whatever the source holds" in the start-up budget check."""


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
        ``True`` to draw a progress line on stderr (see :mod:`streamer.progress`).
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
        kafka_client.configure(config.kafka)  # every Kafka client of the run uses [kafka] (streamer.kafka_client)
        self.out = Path(config.out)
        self.metrics = metrics if metrics is not None else ServiceMetrics()
        self.stop_event = stop if stop is not None else threading.Event()
        self._progress_enabled = progress
        self.store = CheckpointStore(self.out / "checkpoints")
        self.codec: Codec = make_codec(config.records)
        self._reject_log = RejectLog()
        self._status = StatusLine(None if progress else config.status_interval_s)  # off a terminal (streamer.status)
        self._reject_guard = RejectGuard(self.codec, config.records.guard_records, config.records.guard_ratio)
        # Set up by run():
        self.learner: Learner
        self.ledger: PrivacyLedger
        self.instance = ""
        self.positions: dict[str, int] = {}
        self.rejects: Counter[str] = Counter()
        self.sequence = 0
        self.snapshots = 0
        self._snapshot_records = -1  # records covered by the last snapshot (-1: none yet)
        self.last_snapshot: dict[str, Any] | None = None
        self._source: Source | IndexedFile | None = None
        self._sinks: list[SnapshotSink] = []
        self._dead_letters: DeadLetterSink | None = None
        self._privacy_config: dict[str, Any] = {}
        self._config_hash = ""
        self._ready = False
        # Learners that read a recording by record index (streamer.replay):
        self._recorded = False
        self._passes_charged = 0  # passes whose instance has been charged with the whole recording
        self._boundary: _Boundary | None = None  # state at the last pass boundary (resumes_mid_pass False)
        self._lag_due = 0.0  # monotonic time of the next lag refresh
        self._rounds_registered = 0  # rounds of a per-round learner registered in the ledger
        # The budget store (streamer.budget), shared by every run on this machine's state directory:
        self.budget: BudgetStore  # or a streamer.budget_kafka.KafkaBudgetStore: the same interface
        self._keys = DataKeys()
        self._stored_reports: dict[str, PrivacyReport] = {}  # what the store holds for our instances
        self._learned_here = 0  # records learned by this process (0: a budget refusal is a refusal to start)
        self._store_pass = 0  # the last pass (1-based) of a recorded learner charged in the store

    # -- set-up ----------------------------------------------------------------------------------

    def _restore_or_start(self, source: Source | IndexedFile, saved: Checkpoint | None) -> None:
        config = self.config
        self._recorded = isinstance(source, IndexedFile)
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
        arguments = constructor_arguments(config, n)
        self._privacy_config = privacy_relevant(config, arguments)
        self._config_hash = privacy_hash(self._privacy_config)
        if saved is not None:
            check_resumable(saved, self._config_hash, self._privacy_config, self.store.path)
            if config.learner.seed is not None and saved.records > 0:
                raise ConfigError(
                    f"learner.seed: refusing to resume the seeded run in {self.out} — the seed would restart its noise "
                    "stream, repeating noise already added to released snapshots (an analyst could cancel it). "
                    "Start a new run with another --out (and another seed), or drop --seed for OS-entropy noise."
                )
            self.learner = restore_learner(saved.learner, saved.learner_config, saved.learner_state, config.learner.seed)
            self.ledger = PrivacyLedger.from_dict(saved.ledger)
            self.instance = saved.instance
            self.rejects = Counter(saved.rejects)
            self.sequence = saved.sequence
            self.snapshots = saved.snapshots
            self._snapshot_records = int(saved.extra.get("snapshot_records", -1))
            log.info(
                "resuming from checkpoint %d (%s records learned, %d source keys)",
                saved.sequence, f"{saved.records:,}", len(saved.positions),
            )
            replay = saved.extra.get("replay", {})
            self._passes_charged = int(replay.get("passes_charged", 0))
            if replay.get("restart"):
                self.instance = f"{self.learner.name}-{uuid.uuid4().hex[:12]}"
                self._register_learner()
                log.info(
                    "the checkpoint was taken mid-pass by a learner that cannot resume a pass: the pass restarts "
                    "as instance %s, and the ledger composes what the interrupted pass released", self.instance,
                )
        else:
            self.learner = build_learner(config, n)
            self.instance = f"{self.learner.name}-{uuid.uuid4().hex[:12]}"
            self.ledger = PrivacyLedger(max_records_per_user=config.learner.max_records_per_user)
            self._register_learner()
            log.info("new run: learner %s (instance %s), n = %s", self.learner.name, self.instance, f"{n:,}")
        self._begin_budget(source, saved)
        self._note_boundary()
        self._ready = True

    def _open_sinks(self) -> None:
        cfg = self.config
        if self.snapshot_path is not None:
            self._sinks.append(JsonlSnapshotSink(self.snapshot_path))
        parsed = parse_source_url(cfg.source.url)
        kafka_bootstrap = parsed.bootstrap if isinstance(parsed, KafkaUrl) else None
        if cfg.snapshots.kafka_topic:
            bootstrap = [cfg.snapshots.kafka_bootstrap] if cfg.snapshots.kafka_bootstrap else kafka_bootstrap
            if not bootstrap:
                raise ConfigError("snapshots.kafka_bootstrap is required when the source is not Kafka")
            self._sinks.append(KafkaSnapshotSink(bootstrap, cfg.snapshots.kafka_topic))
        if cfg.source.dead_letter_topic and kafka_bootstrap:
            self._dead_letters = DeadLetterSink(kafka_bootstrap, cfg.source.dead_letter_topic)

    @property
    def snapshot_path(self) -> Path | None:
        return self.out / "snapshots.jsonl" if self.config.snapshots.jsonl else None

    # -- the budget store ------------------------------------------------------------------------

    @property
    def _recorded_learner(self) -> RecordedLearner:
        """The learner, for the record-index driver (which runs only for a :class:`RecordedLearner`)."""
        if not isinstance(self.learner, RecordedLearner):
            raise TypeError(f"learner {self.learner.name!r} does not read a recording by index")
        return self.learner

    def _begin_budget(self, source: Source | IndexedFile, saved: Checkpoint | None) -> None:
        """Register this run in the budget store; on a resume, account the state a crash lost.

        Crash accounting (:mod:`accounting.budget`). Sequential sources: every range the run
        charged at or beyond its last durable checkpoint's positions (the later of the store's
        mark and the checkpoint's own positions, per data key) was in a state that the crash
        destroyed; those charges become an intrusion-only *lost* instance, and the resumed run
        charges them again when it re-learns them. Learners that read a recording by index: the
        set of records learned since the checkpoint is not known (it is a function of the
        permutation), so a run that did not stop cleanly charges a lost instance with the whole
        recording — conservative. A pass restarted under a new instance (``resumes_mid_pass``
        False) composes with the interrupted pass in full already and needs no lost instance.
        """
        self.budget = open_budget(self.config)
        self._keys = data_keys_for(self.config.source.url, source)
        self._store_pass = self._passes_charged
        if saved is not None:
            self._account_lost_state(source, saved)
        self._precheck_budget(source)
        self.budget.begin_run(self.instance, self.out, display_name(self.config.source.url))
        for instance, report in self.ledger.instances.items():
            if instance == self.instance or instance.startswith(self.instance + "/"):
                self._store_register(instance, report)
        self._register_learner()

    def _account_lost_state(self, source: Source | IndexedFile, saved: Checkpoint) -> None:
        state = self.budget.run_state(saved.instance)
        if state is None:
            log.warning(
                "the budget store %s has no record of run %s (another state directory?): what it spent before "
                "this resume is not in the store", self.budget.path, saved.instance,
            )
            return
        lost_instance = f"{saved.instance}/lost-{state.losses + 1:03d}"
        lost_report = lost_state_report(self.learner.privacy())
        if isinstance(source, IndexedFile):
            if state.clean or saved.extra.get("replay", {}).get("restart"):
                return
            self.budget.register(lost_instance, saved.instance, lost_report, self.out)
            self.budget.charge(lost_instance, self._keys.ranges(source.extent))
            self.budget.note_loss(saved.instance)
            log.warning("run %s did not stop cleanly: its state since the last checkpoint was lost; charged as %s",
                        saved.instance, lost_instance)
            return
        durable = dict(state.positions)
        for key, position in self._keys.positions(saved.positions).items():
            durable[key] = max(durable.get(key, 0), position)
        lost = self.budget.reclassify_lost(saved.instance, durable, lost_instance, lost_report)
        if lost:
            log.warning(
                "records charged by run %s after its last durable checkpoint were in a state lost in a crash; they "
                "are re-learned now, and their earlier use is charged as %s (intrusion only): %s",
                saved.instance, lost_instance, ", ".join(f"{k} [{a}, {b})" for k, (a, b) in sorted(lost.items())),
            )

    def _precheck_budget(self, source: Source | IndexedFile) -> None:
        """Refuse to start when records this run is about to read were spent by other runs beyond
        ``max_epsilon``. Finite local sources are read from their positions to the end; a Kafka
        run's positions are known only once partitions are assigned, so its first micro-batch is
        the check (:meth:`_charge_budget`)."""
        limit = self.config.learner.max_epsilon
        if limit is None:
            return
        if isinstance(source, IndexedFile):
            ranges = dict(source.extent)
        elif isinstance(source, (LineFileSource, SyntheticSource)):
            ranges = {source.key: (self.positions.get(source.key, 0), _OPEN_END)}
        elif isinstance(source, RecordingSource):
            ranges = {key: (position, _OPEN_END) for key, position in source.resume_positions().items()}
        else:
            return
        self._refuse_if_spent_by_others(ranges, limit)

    def _refuse_if_spent_by_others(self, ranges: Mapping[str, tuple[int, int]], limit: float) -> None:
        data_ranges = self._keys.ranges(ranges)
        ledger = self.budget.ledger(data_ranges)
        if self.instance not in ledger.instances:  # the learner's whole guarantee stands for this run's use
            ledger.register(self.instance, self.learner.privacy())
        excess = exceeds(ledger, self.instance, data_ranges, limit)
        if excess is not None and self._spent_by_others(excess):
            raise BudgetExceededError(
                "refusing to start: " + describe_excess(excess, limit, self.budget.instances())
                + "; nothing was learned. See `panpriv budget`."
            )

    def _spent_by_others(self, excess: Excess) -> bool:
        mine = set(self.ledger.instances)
        return any(instance not in mine for instance, _ in excess.spent_by)

    def _store_register(self, instance: str, report: PrivacyReport) -> None:
        """Mirror a ledger registration in the budget store, when its guarantees changed (a write
        per change, not per micro-batch: the record count in the report is not what is composed)."""
        stored = self._stored_reports.get(instance)
        if stored is None or (stored.output, stored.intrusion) != (report.output, report.intrusion):
            self.budget.register(instance, self.instance, report, self.out)
            self._stored_reports[instance] = report

    def _charge_budget(self, instance: str, ranges: Mapping[str, tuple[int, int]]) -> str | None:
        """Charge ``ranges`` to ``instance`` in the budget store, durably, before they are learned.
        Returns why not (the run then stops) if the records would exceed ``max_epsilon`` over all
        runs; raises :class:`BudgetExceededError` if this process has learned nothing yet and
        other runs spent the budget (a refusal to start)."""
        limit = self.config.learner.max_epsilon
        excess = self.budget.charge(instance, self._keys.ranges(ranges), limit)
        if excess is None:
            return None
        assert limit is not None
        text = describe_excess(excess, limit, self.budget.instances())
        if self._learned_here == 0 and self._spent_by_others(excess):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before learning records that would exceed the budget over all runs: {text}"

    # -- reporting -------------------------------------------------------------------------------

    def _store_ledger(self) -> PrivacyLedger:
        """Every use, by every run, of the data sources this run has charged."""
        return self.budget.ledger([self._keys.key(k) for k in self.ledger.sources])

    def report(self, store_ledger: PrivacyLedger | None = None) -> PrivacyReport:
        """The guarantee of the records this run learned, composed over every run that used them
        (the budget store; this run's own ledger when the store is not open yet), with ``records``
        = records the learner has learned and the public counts stated."""
        own = self.ledger.report()
        if hasattr(self, "budget"):
            store_ledger = store_ledger if store_ledger is not None else self._store_ledger()
            composed = report_for(store_ledger, self.ledger.instances, self.learner.records_seen)
            # The store holds every use of our records, ours included; the own ledger can only be weaker
            # where the store was emptied or moved, so the statement takes the worse of the two.
            composed = dataclasses.replace(
                composed, output=_worse(composed.output, own.output), intrusion=_worse(composed.intrusion, own.intrusion)
            )
        else:
            composed = dataclasses.replace(own, records=self.learner.records_seen)
        assumptions = tuple(composed.assumptions) + (PUBLIC_COUNTS,)
        if self.config.learner.seed is not None:
            assumptions += (SEEDED_OUTPUT,)
        return dataclasses.replace(composed, assumptions=assumptions)

    def _over_budget(self, ranges: Mapping[str, tuple[int, int]] | None = None, instance: str | None = None) -> float | None:
        """The ε that would be reached by charging ``ranges`` to ``instance`` (default: the
        learner's; a registered one), or now, if above ``max_epsilon``.

        ε is the largest finite ε of the output and intrusion guarantees (an intrusion guarantee
        that is already 'none', as in seeded test mode, is not a budget)."""
        limit = self.config.learner.max_epsilon
        if limit is None:
            return None
        instance = instance or self.instance
        worst = 0.0
        use_sets = [seg.uses for key in self.ledger.sources for seg in self.ledger.coverage(key)]
        if ranges:
            use_sets += [uses + (instance,) for uses in self._uses_in(ranges)] + [(instance,)]
        for uses in use_sets:
            for guarantee in self.ledger.record_guarantee(uses):
                if guarantee.epsilon != float("inf"):
                    worst = max(worst, guarantee.epsilon)
        return worst if worst > limit * (1 + 1e-12) else None

    def _uses_in(self, ranges: Mapping[str, tuple[int, int]]) -> Iterator[tuple[str, ...]]:
        for key, (start, stop) in ranges.items():
            for segment in self.ledger.coverage(key):
                if segment.start < stop and segment.stop > start:
                    yield segment.uses

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Process until the source is exhausted, a stop is requested, or the budget is spent,
        holding the output directory's lock (:mod:`streamer.outlock`) throughout."""
        with OutputLock(self.out):
            return self._run_locked()

    def _run_locked(self) -> RunResult:
        saved = self.store.load()
        self.positions = dict(saved.positions) if saved else {}
        with self._signals():
            source: Source | IndexedFile
            if reads_by_index(learner_class(self.config.learner.name)):
                source = open_indexed(self.config.source, self.codec, self.config.learner.name)
            else:
                source = open_source(self.config.source, self.codec, self.positions, on_revoke=self._checkpoint_on_revoke,
                                     marks=saved.extra.get(MARKS_KEY) if saved else None)
            self._source = source
            try:
                self._restore_or_start(source, saved)
                self._open_sinks()
                outcome, message = self._drive(source)
                # Clean stop: the state is consistent with the positions, so make it durable.
                # A final snapshot only if it would release something new: a release is not free
                # for every learner (PNSGD accounts each one), and a learner that has learned
                # nothing (a new run, a restarted pass) has nothing to release.
                records = self.learner.records_seen
                self._checkpoint(
                    snapshot=records not in (0, self._snapshot_records), finished=outcome == "finished", final=True
                )
            except BaseException:
                if hasattr(self, "budget"):
                    self.budget.close()
                raise
            finally:
                self._close(source)
        log.info("%s: %s", outcome, message)
        result = RunResult(
            outcome=outcome,
            message=message,
            records=self.learner.records_seen,
            rejects=dict(self.rejects),
            snapshots=self.snapshots,
            last_snapshot=self.last_snapshot,
            report=self.report(),
            checkpoint_path=self.store.path,
            snapshot_path=self.snapshot_path,
            learner=self.learner,
            instance=self.instance,
            resumed=saved is not None,
        )
        self.budget.close()
        return result

    def _drive(self, source: Source | IndexedFile) -> tuple[Outcome, str]:
        """Run the loop that fits the source: stream order, or by record index."""
        over = self._over_budget()
        if over is not None:
            limit = self.config.learner.max_epsilon
            return "budget_exhausted", f"the guarantee is already ε = {over:.4g} > max_epsilon = {limit}; nothing learned"
        progress = self._make_progress(source)
        pacer = Pacer(self.config.source.rate)
        cadence = Cadence(self.config)
        try:
            if isinstance(source, IndexedFile):
                return self._replay(source, pacer, cadence, progress)
            return self._loop(source, pacer, cadence, progress)
        finally:
            if progress is not None:
                self._draw(progress, force=True)
                progress.close()

    def _loop(self, source: Source, pacer: Pacer, cadence: Cadence, progress: Progress | None) -> tuple[Outcome, str]:
        cfg = self.config
        while not self.stop_event.is_set():
            self._refresh_lag()
            limit = pacer.allowance(cfg.source.batch_records)
            if limit == 0:
                pacer.wait(cfg.source.poll_timeout_s)
                continue
            batch = source.poll(limit, cfg.source.poll_timeout_s)
            if batch is None:
                if source.exhausted:
                    return "finished", "the source is exhausted"
                self._checkpoint_if_due(cadence, idle=True)
                continue
            over = self._over_budget(batch.ranges)
            if over is not None:
                return "budget_exhausted", (
                    f"stopped before learning a batch that would raise ε to {over:.4g} "
                    f"(max_epsilon = {cfg.learner.max_epsilon}); its records were not used"
                )
            self._reject_guard.check(batch)  # a misconfiguration stops here, before any charge (streamer.reject_guard)
            refused = self._charge_budget(self.instance, batch.ranges)  # durable before learning
            if refused is not None:
                return "budget_exhausted", refused
            handled = self._process(batch)
            pacer.consumed(handled)
            self._after_batch(handled, cadence, progress)
        return "stopped", _STOPPED

    def _replay(self, source: IndexedFile, pacer: Pacer, cadence: Cadence, progress: Progress | None) -> tuple[Outcome, str]:
        """Drive a learner that reads the recording by record index (:mod:`streamer.replay`).

        The learner runs its own loop (``learn_recorded``); the ``fetch`` given to it first
        accounts for the micro-batch just learned — charge a pass that began, register the
        guarantee, metrics, checkpoint and snapshot when due — then stops the run if asked to (or
        before a pass that would exceed ``max_epsilon``), waits for the pacer, and reads the next
        records.
        """
        cfg = self.config
        learner = self._recorded_learner
        micro_batch = cfg.source.batch_records if pacer.rate is None else min(cfg.source.batch_records, pacer.step)
        pending: tuple[int, float] | None = None  # (records before, start time) of the batch being learned

        def account() -> None:
            nonlocal pending
            if pending is None:
                return
            (before, started), pending = pending, None
            learned = self.learner.records_seen - before
            self._learned_here += learned
            self._charge_passes(source)
            self._register_learner()
            self.metrics.observe_batch(learned, time.perf_counter() - started)
            pacer.consumed(learned)
            self._note_boundary()
            self._after_batch(learned, cadence, progress)

        def fetch(indices: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
            nonlocal pending
            account()
            while True:
                if self.stop_event.is_set():
                    raise Halt("stopped", _STOPPED)
                if pacer.allowance(len(indices)) >= len(indices):
                    break
                pacer.wait(cfg.source.poll_timeout_s)
            over = self._pass_over_budget(source)
            if over is not None:
                raise Halt("budget_exhausted", (
                    f"stopped before a pass that would raise ε to {over:.4g} (max_epsilon = "
                    f"{cfg.learner.max_epsilon}); nothing of it was used"
                ))
            refused = self._charge_pass_budget(source)
            if refused is not None:
                raise Halt("budget_exhausted", refused)
            started = time.perf_counter()
            X, y = source.fetch(indices)
            pending = (self.learner.records_seen, started)
            return X, y

        try:
            learner.learn_recorded(fetch, micro_batch=micro_batch)
        except Halt as halt:
            return halt.outcome, halt.message  # type: ignore[return-value]
        except ProtocolError:
            raise _refused(self.learner.name) from None
        account()
        return "finished", "every pass over the recording is complete"

    def _after_batch(self, records: int, cadence: Cadence, progress: Progress | None) -> None:
        cadence.add(records)
        if progress is not None:
            self._draw(progress)
        self._checkpoint_if_due(cadence)

    def _refresh_lag(self, force: bool = False) -> None:
        """Report the source's lag at most every ``metrics.lag_interval_s`` seconds (or now)."""
        now = time.monotonic()
        if (now < self._lag_due and not force) or self._source is None:
            return
        self._lag_due = now + self.config.metrics.lag_interval_s
        lags = self._source.lag()
        if lags is not None:
            self.metrics.observe_lag(lags)

    def _lags(self) -> dict[str, int] | None:
        """The lag per partition in records (messages x records per message read), for the status line."""
        lags = self._source.lag() if self._source is not None else None
        ratio = self.metrics.records_per_message
        return None if lags is None else {key: round(lag * ratio) for key, lag in lags.items()}

    def _checkpoint_if_due(self, cadence: Cadence, idle: bool = False) -> None:
        self._status.tick(self.learner.records_seen, self.rejects, self._lags, self.report, cadence)
        if cadence.checkpoint_due(idle):
            snapshot = cadence.snapshot_due
            self._checkpoint(snapshot=snapshot)
            cadence.checkpointed(snapshot)

    # -- recorded learners (streamer.replay) -------------------------------------------------------

    def _pass_instance(self, number: int) -> str:
        """The ledger instance charged with pass ``number`` (1-based)."""
        return pass_instance(self.instance, number) if has_round_reports(self.learner) else self.instance

    def _register_learner(self) -> None:
        """Register the learner's current guarantee: one instance, or one per pass begun for a
        recorded learner that reports per round (a round's report is fixed once it has begun, so
        the reports are asked for only when a round begins: they cost O(rounds))."""
        if self._recorded and has_round_reports(self.learner):
            learner = self._recorded_learner
            begun = -(-learner.records_seen // learner.n)
            if begun > self._rounds_registered:
                for number, report in enumerate(learner.round_reports(), start=1):
                    if number > self._rounds_registered:
                        self.ledger.register(pass_instance(self.instance, number), report)
                        if hasattr(self, "budget"):
                            self._store_register(pass_instance(self.instance, number), report)
                self._rounds_registered = begun
        else:
            report = self.learner.privacy()
            self.ledger.register(self.instance, report)
            if hasattr(self, "budget"):
                self._store_register(self.instance, report)

    def _charge_passes(self, source: IndexedFile) -> None:
        """Charge every pass begun since the last call with the whole recording, and count its rejects."""
        n = self._recorded_learner.n
        begun = -(-self.learner.records_seen // n)
        while self._passes_charged < begun:
            self._passes_charged += 1
            self._register_learner()
            instance = self._pass_instance(self._passes_charged)
            for key, (start, stop) in source.extent.items():
                self.ledger.charge(instance, key, start, stop)
                self.positions[key] = stop
            if source.rejects:
                self.rejects.update(source.rejects)
                self.metrics.observe_rejects(source.rejects)

    def _pass_over_budget(self, source: IndexedFile) -> float | None:
        """:meth:`_over_budget` before the next micro-batch: if it begins a pass whose instance is
        already registered, with that pass's charge included."""
        if self.learner.records_seen == self._passes_charged * self._recorded_learner.n:
            instance = self._pass_instance(self._passes_charged + 1)
            if instance in self.ledger.instances:
                return self._over_budget(source.extent, instance)
        return self._over_budget()

    def _charge_pass_budget(self, source: IndexedFile) -> str | None:
        """Before the first micro-batch of a pass, charge the whole recording to the pass's
        instance in the budget store (durably, before anything of the pass is learned). A pass
        instance not registered yet (a learner reporting per round knows a round's report only
        once the round has begun) is registered first as claiming no guarantee at all — safe if
        the process dies before the round's own report replaces it after its first micro-batch."""
        n = self._recorded_learner.n
        number = self.learner.records_seen // n + 1
        if self.learner.records_seen % n or number <= self._store_pass:
            return None
        instance = self._pass_instance(number)
        if instance not in self._stored_reports:
            self._store_register(instance, PrivacyReport(
                self.learner.name, 0, Guarantee.none(), Guarantee.none(),
                assumptions=("a round not begun yet: no guarantee is claimed until its own report is registered",),
            ))
        refused = self._charge_budget(instance, source.extent)
        if refused is None:
            self._store_pass = number
        return refused

    def _note_boundary(self) -> None:
        """At a pass boundary of a learner that cannot resume mid-pass, keep what a resume restarts from."""
        if not self._recorded:
            return
        learner = self._recorded_learner
        if not learner.resumes_mid_pass and learner.records_seen % learner.n == 0:
            self._boundary = _Boundary(learner.state_dict(), learner.records_seen, self._snapshot_records, self._passes_charged)

    def _resumable_state(self) -> tuple[dict[str, Any], int, dict[str, Any]]:
        """The learner state, record count and ``extra`` fields that a resume starts from: the
        current ones, or, mid-pass for a learner that cannot resume a pass, those of the pass's
        start with the mark that the pass restarts (:mod:`streamer.replay`)."""
        boundary = self._boundary
        if boundary is not None and self.learner.records_seen != boundary.records:
            replay = {"passes_charged": boundary.passes_charged, "restart": True}
            return boundary.state, boundary.records, {"snapshot_records": boundary.snapshot_records, "replay": replay}
        extra: dict[str, Any] = {"snapshot_records": self._snapshot_records}
        if self._recorded:
            extra["replay"] = {"passes_charged": self._passes_charged}
        return self.learner.state_dict(), self.learner.records_seen, extra

    def _process(self, batch: Batch) -> int:
        """Learn one batch and charge its ranges; return the number of records handled."""
        t0 = time.perf_counter()
        if batch.arrays is not None:
            decoded: Decoded = self.codec.validate_arrays(*batch.arrays)
        else:
            decoded = self.codec.decode(batch.payloads)
        if len(decoded.y):
            try:
                self.learner.learn_many(decoded.X, decoded.y)
            except ProtocolError:
                raise _refused(self.learner.name) from None
            self._learned_here += len(decoded.y)
        # Keep the ledger's view of the learner current (a learner whose guarantee grows with
        # records is then checked against max_epsilon at the next batch).
        self._register_learner()
        for key, (start, stop) in batch.ranges.items():
            self.ledger.charge(self.instance, key, start, stop)
            self.positions[key] = stop
        counts = decoded.reject_counts()
        if counts:
            self.rejects.update(counts)
            self.metrics.observe_rejects(counts)
            self._reject_log.note(counts, ", ".join(f"{k} [{a}, {b})" for k, (a, b) in batch.ranges.items()))
            if self._dead_letters is not None:
                self._send_dead_letters(batch, decoded, self._dead_letters)
        self.metrics.observe_batch(len(decoded.y), time.perf_counter() - t0, batch.consumed, sum(counts.values()))
        learned = len(decoded.y)
        _wipe_records(decoded)
        return learned + sum(counts.values())

    def _send_dead_letters(self, batch: Batch, decoded: Decoded, sink: DeadLetterSink) -> None:
        sent: set[int] = set()
        for reject in decoded.rejects:
            if reject.index in sent:
                continue
            sent.add(reject.index)
            sink.send(
                batch.payloads[reject.index], reject.reason.value, batch.keys[reject.index], batch.positions[reject.index]
            )

    # -- checkpoints and snapshots ---------------------------------------------------------------

    def _checkpoint_on_revoke(self) -> None:
        """Kafka is about to revoke partitions: commit our positions, then checkpoint them.

        The next owner starts at the committed offsets, so this is the one place where the commit
        comes first: if it fails, the process stops without a checkpoint (the next owner re-reads
        from the older commit and our durable state ends there too); if the checkpoint fails after
        it, the records in between are in nobody's surviving state — lost, never doubled.
        """
        if self._ready and self._source is not None:
            log.info("partitions being revoked: commit and checkpoint first")
            self._source.acknowledge(dict(self.positions), strict=True)
            self._checkpoint(snapshot=False)

    def _checkpoint(self, snapshot: bool, finished: bool = False, final: bool = False) -> None:
        """Steps (1)–(6) of the module docstring; after (4), the budget store notes the durable
        positions (``final``: the run stopped cleanly)."""
        t0 = time.perf_counter()
        released = self.learner.snapshot() if snapshot else None
        self._register_learner()
        if self._dead_letters is not None:
            self._dead_letters.flush()
        self.sequence += 1
        if released is not None:
            self.snapshots += 1
            self._snapshot_records = released.records
        positions = dict(self.positions)
        state, records, extra = self._resumable_state()
        extra = {**extra, **source_marks(self._source, positions)}  # offset-regression check (kafka_calls)
        checkpoint = Checkpoint(
            sequence=self.sequence,
            created=time.time(),
            finished=finished,
            instance=self.instance,
            learner=self.learner.name,
            learner_config=self.learner.config(),
            learner_state=state,
            positions=positions,
            ledger=self.ledger.to_dict(),
            rejects=dict(self.rejects),
            records=records,
            snapshots=self.snapshots,
            config_hash=self._config_hash,
            privacy_config=self._privacy_config,
            extra=extra,
        )
        durable_at = self.store.save(checkpoint)
        self.budget.mark_durable(self.instance, self.sequence, self._keys.positions(positions), clean=final)
        store_ledger = self._store_ledger()
        report = self.report(store_ledger)
        self.metrics.observe_checkpoint(time.perf_counter() - t0, durable_at)
        self.metrics.observe_privacy(report)
        self.metrics.observe_budget(per_source(store_ledger))
        if self._source is not None:
            self._source.acknowledge(positions)
            self._refresh_lag(force=True)
        if released is not None:
            record = snapshot_record(
                released,
                sequence=self.sequence,
                instance=self.instance,
                rejected=sum(self.rejects.values()),
                positions=positions,
                privacy=report.to_dict(),
                feature_names=adult.FEATURE_NAMES if self.config.records.format == "adult" else None,
            )
            for sink in self._sinks:
                sink.emit(record)
            self.metrics.observe_snapshot()
            self.last_snapshot = record

    # -- helpers ---------------------------------------------------------------------------------

    def _make_progress(self, source: Source | IndexedFile) -> Progress | None:
        if not self._progress_enabled:
            return None
        if isinstance(source, IndexedFile):  # progress in records learned over all passes
            return Progress(source.n * self._recorded_learner.passes, start=self.learner.records_seen)
        try:
            total = source.total_positions()
        except Exception:  # noqa: BLE001 - progress is cosmetic; a failed size query must not stop a run
            total = None
        return Progress(total, start=sum(self.positions.values()))

    def _draw(self, progress: Progress, force: bool = False) -> None:
        report = self.ledger.report()
        progress.update(
            self.learner.records_seen,
            sum(self.rejects.values()),
            self.learner.records_seen if self._recorded else sum(self.positions.values()),
            report.output.epsilon,
            report.intrusion.epsilon,
            force=force,
        )

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT set the stop event (main thread only; elsewhere use ``stop``)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def request_stop(signum: int, frame: object) -> None:
            log.info("received %s: stopping after the current batch", signal.Signals(signum).name)
            self.stop_event.set()

        for sig in previous:
            signal.signal(sig, request_stop)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _close(self, source: Source | IndexedFile) -> None:
        for closer in [source.close, *(s.close for s in self._sinks)] + (
            [self._dead_letters.close] if self._dead_letters else []
        ):
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - closing must not mask the run's outcome
                log.warning("error while closing: %s", type(exc).__name__)


_STOPPED = "stop requested (signal); final checkpoint taken"


def _worse(a: Guarantee, b: Guarantee) -> Guarantee:
    """The componentwise weaker of two guarantees (it bounds both)."""
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))


def _wipe_records(decoded: Decoded) -> None:
    """Zero the decoded records once learned, so a later dump of the process does not find them in
    freed memory (docs/privacy.md, "Process memory"); read-only views (of a message's bytes) are
    left as they are."""
    for array in (decoded.X, decoded.y):
        if array.flags.writeable:
            array.fill(0.0)


def _refused(name: str) -> LearnerInputError:
    """The error for a learner refusing validated records. Its own message may quote record values
    (e.g. an unexpected label), so it is not passed on; the state may be partly updated, so the
    run stops without a checkpoint."""
    return LearnerInputError(
        f"learner {name!r} refused a validated micro-batch; the [records] domain (label_values / label_min / "
        "label_max, dim) does not match what the learner accepts. Details are withheld because they may quote "
        "record values."
    )


@dataclass(frozen=True)
class _Boundary:
    """A recorded learner's state at a pass boundary, and the counters that go with it."""

    state: dict[str, Any]
    records: int
    snapshot_records: int
    passes_charged: int
