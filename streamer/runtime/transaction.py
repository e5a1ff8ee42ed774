"""The checkpoint transaction: make the run's state durable, then acknowledge, then release.

One :meth:`CheckpointTransaction.commit` runs the steps in quix-streams' order:

1. take the snapshot from the learner (a release may change a learner's accounting, so it must be
   in the state saved next);
2. register the learner's current guarantee in the ledger — and in the budget store when it
   changed, so the store never holds a guarantee weaker than what was released;
3. flush the dead-letter producer;
4. write the manifest atomically (:mod:`panpriv.streamer.state.checkpoint`): noisy state, positions, ledger,
   reject counters, config hash; then note the durable positions in the budget store (at a clean
   stop inside a batch, the records learned beyond the saved boundary become a lost use);
5. only now acknowledge upstream (Kafka offset commit);
6. emit the snapshot.

A crash before (4) loses the work since the previous checkpoint and nothing released depends on
it; a crash between (4) and (6) loses that snapshot, whose release was already accounted in the
manifest (conservative). The argument that every record then contributes exactly once to the
surviving state is in :mod:`panpriv.streamer.runtime.processor`.
"""

from __future__ import annotations

import time
from typing import Any

from panpriv.accounting.budget import per_source
from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.io.sinks import DeadLetterSink, SnapshotSink, snapshot_record
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.driver import Driver
from panpriv.streamer.runtime.heartbeat import LagReporter
from panpriv.streamer.serving.holdout import Holdout
from panpriv.streamer.sources.base import Source
from panpriv.streamer.sources.open import source_marks
from panpriv.streamer.state.checkpoint import Checkpoint, CheckpointStore, wipe_state


class CheckpointTransaction:
    """Runs steps (1)–(6) of the module docstring for one run.

    Parameters
    ----------
    store
        Where the manifest is written.
    driver
        The run's driver: it registers the learner's guarantee and says what a resume starts from.
    session
        The run's budget session (durable marks, the composed report).
    source
        Acknowledged after the manifest is durable; asked for its marks.
    sinks, dead_letters
        Where snapshots go; the dead-letter producer flushed before the manifest.
    config_hash, privacy_config
        The privacy-relevant configuration the manifest is bound to.
    feature_names
        Written into snapshot records (``None``: unnamed features).
    holdout
        The public hold-out set each snapshot is scored on (``--holdout``), or ``None``.
    """

    def __init__(
        self,
        store: CheckpointStore,
        driver: Driver,
        session: BudgetSession,
        metrics: ServiceMetrics,
        source: Source | IndexedFile,
        lag: LagReporter,
        sinks: list[SnapshotSink],
        dead_letters: DeadLetterSink | None,
        config_hash: str,
        privacy_config: dict[str, Any],
        feature_names: tuple[str, ...] | None,
        holdout: Holdout | None = None,
    ) -> None:
        self._store = store
        self._driver = driver
        self._session = session
        self._metrics = metrics
        self._source = source
        self._lag = lag
        self._sinks = sinks
        self._dead_letters = dead_letters
        self._config_hash = config_hash
        self._privacy_config = privacy_config
        self._feature_names = feature_names
        self._holdout = holdout

    def commit(self, snapshot: bool, finished: bool = False, final: bool = False, acknowledge: bool = True) -> None:
        """Take a checkpoint (with a snapshot if ``snapshot``); ``finished``: the data is complete;
        ``final``: the run stops cleanly after it; ``acknowledge``: commit its positions upstream
        (not before a Kafka revocation, which commits the live positions itself)."""
        t0 = time.perf_counter()
        state = self._driver.state
        released = state.learner.snapshot() if snapshot else None  # (1)
        self._driver.register_learner()  # (2)
        if self._dead_letters is not None:  # (3)
            self._dead_letters.flush()
        state.sequence += 1
        if released is not None:
            state.snapshots += 1
            state.snapshot_records = released.records
        resumable = self._driver.resumable(finished)  # the live state, or the last batch boundary's
        positions = resumable.positions
        budget_mark = self._session.mark()  # the store's id and generation, recorded by the checkpoint and snapshot
        checkpoint = Checkpoint(
            sequence=state.sequence,
            created=time.time(),
            finished=finished,
            instance=state.instance,
            learner=state.learner.name,
            learner_config=state.learner.config(),
            learner_state=resumable.learner_state,
            positions=positions,
            ledger=resumable.ledger,
            rejects=resumable.rejects,
            records=resumable.records,
            snapshots=state.snapshots,
            config_hash=self._config_hash,
            privacy_config=self._privacy_config,
            snapshot_records=resumable.snapshot_records,
            replay=resumable.replay,
            source_marks=source_marks(self._source, positions) if resumable.marks is None else resumable.marks,  # kafka_calls
            partial=resumable.partial,
            budget_mark=budget_mark,
        )
        try:
            durable_at = self._store.save(checkpoint)  # (4)
        finally:
            wipe_state(checkpoint.learner_state)  # copies made for this write (panpriv.streamer.state.checkpoint)
        self._session.mark_durable(state.instance, state.sequence, positions, clean=final)
        if final and resumable.replay is None and resumable.records < state.learner.records_seen:
            self._session.lose_unsaved(state.instance, positions, state.learner.privacy())  # the open batch's records
        store_ledger = self._session.store_ledger(state.ledger)
        report = self._session.report(state, store_ledger)
        self._metrics.observe_checkpoint(time.perf_counter() - t0, durable_at)
        self._metrics.observe_privacy(report)
        self._metrics.observe_budget(per_source(store_ledger))
        if acknowledge:
            self._source.acknowledge(positions)  # (5)
        self._lag.refresh(force=True)
        if released is None:
            return
        record = snapshot_record(  # (6)
            released,
            sequence=state.sequence,
            instance=state.instance,
            rejected=sum(resumable.rejects.values()),
            positions=positions,
            privacy=report.to_dict(),
            feature_names=self._feature_names,
            budget=budget_mark,
            max_epsilon=self._session.limit,
        )
        if self._holdout is not None:  # public data, released parameters: post-processing (panpriv.streamer.serving.holdout)
            record["holdout"] = self._holdout.score(released)
            self._metrics.observe_holdout(record["holdout"])
        for sink in self._sinks:
            sink.emit(record)
        self._metrics.observe_snapshot()
        state.last_snapshot = record
