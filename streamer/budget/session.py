"""One run's dealings with the budget store shared by every run (:mod:`panpriv.streamer.budget.store`).

The processor opens a :class:`BudgetSession` once its learner is built or restored. The session
registers the run, accounts for state a crash destroyed, refuses to start when other runs have
spent the records' budget, mirrors the ledger's registrations into the store, charges position
ranges durably *before* they are learned, and composes the report of every use of this run's
records.

Crash accounting (:mod:`panpriv.accounting.budget`). Sequential sources: every range the run charged at or
beyond its last durable checkpoint's positions (the later of the store's mark and the
checkpoint's own positions, per data key) was in a state that the crash destroyed; those charges
become an intrusion-only *lost* instance, and the resumed run charges them again when it
re-learns them. Learners that read a recording by index: the set of records learned since the
checkpoint is not known (it is a function of the permutation), so a run that did not stop cleanly
charges a lost instance with the whole recording — conservative. A pass restarted under a new
instance (``resumes_mid_pass`` False) composes with the interrupted pass in full already and needs
no lost instance.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

from panpriv.accounting.budget import Excess, exceeds, lost_state_report, report_for
from panpriv.accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport
from panpriv.streamer.budget.open import open_budget
from panpriv.streamer.budget.store import BudgetExceededError, BudgetStore, describe_excess
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.sources.base import Source, display_name
from panpriv.streamer.sources.identity import DataKeys, data_keys_for
from panpriv.streamer.sources.local import LineFileSource, RecordingSource, SyntheticSource
from panpriv.streamer.state.checkpoint import Checkpoint
from panpriv.streamer.state.training_state import TrainingState

log = logging.getLogger("panpriv.processor")

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


class BudgetSession:
    """The budget store as one run sees it (module docstring).

    Parameters
    ----------
    config
        The run's configuration (``learner.max_epsilon``, the state directory, ``out``).
    source
        The run's source: it names the data keys the store charges (:mod:`panpriv.streamer.sources.identity`).
    """

    def __init__(self, config: ServiceConfig, source: Source | IndexedFile) -> None:
        self._config = config
        self._out = Path(config.out or ".")
        self._limit = config.learner.max_epsilon
        self.store: BudgetStore = open_budget(config)  # or a panpriv.streamer.budget.kafka_store.KafkaBudgetStore: same interface
        self.keys: DataKeys = data_keys_for(config.source.url, source)
        self._stored_reports: dict[str, PrivacyReport] = {}  # what the store holds for our instances
        self.learned_here = 0  # records learned by this process (0: a budget refusal is a refusal to start)
        self.exposure: tuple[str, ...] = ()  # what a read of memory or disk finds (panpriv.streamer.runtime.exposure)

    def begin(self, state: TrainingState, source: Source | IndexedFile, saved: Checkpoint | None) -> None:
        """Register the run; on a resume first account the state a crash lost; refuse to start when
        the records about to be read are spent by other runs; mirror the ledger's registrations."""
        if saved is not None:
            self._account_lost_state(state, source, saved)
        self._precheck(state, source)
        self.store.begin_run(state.instance, self._out, display_name(self._config.source.url))
        for instance, report in state.ledger.instances.items():
            if instance == state.instance or instance.startswith(state.instance + "/"):
                self.register(instance, report, state.instance)

    def close(self) -> None:
        self.store.close()

    # -- registrations and charges ---------------------------------------------------------------

    def register(self, instance: str, report: PrivacyReport, run: str) -> None:
        """Mirror a ledger registration of run ``run`` in the store, when its guarantees changed (a
        write per change, not per micro-batch: the record count in the report is not composed)."""
        stored = self._stored_reports.get(instance)
        if stored is None or (stored.output, stored.intrusion) != (report.output, report.intrusion):
            self.store.register(instance, run, report, self._out)
            self._stored_reports[instance] = report

    def is_registered(self, instance: str) -> bool:
        return instance in self._stored_reports

    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], own_instances: Mapping[str, object]) -> str | None:
        """Charge ``ranges`` to ``instance`` in the store, durably, before they are learned.

        Returns why not (the run then stops) if the records would exceed ``max_epsilon`` over all
        runs; raises :class:`BudgetExceededError` if this process has learned nothing yet and
        runs other than ``own_instances`` spent the budget (a refusal to start)."""
        excess = self.store.charge(instance, self.keys.ranges(ranges), self._limit)
        if excess is None:
            return None
        assert self._limit is not None
        text = describe_excess(excess, self._limit, self.store.instances())
        if self.learned_here == 0 and _spent_by_others(excess, own_instances):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before learning records that would exceed the budget over all runs: {text}"

    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool) -> None:
        """Note that the checkpoint ``sequence`` holding ``positions`` is durable (``clean``: the run
        stopped cleanly)."""
        self.store.mark_durable(run, sequence, self.keys.positions(positions), clean=clean)

    # -- reporting -------------------------------------------------------------------------------

    def store_ledger(self, ledger: PrivacyLedger) -> PrivacyLedger:
        """Every use, by every run, of the data sources ``ledger`` (this run's) has charged."""
        return self.store.ledger([self.keys.key(k) for k in ledger.sources])

    def report(self, state: TrainingState, store_ledger: PrivacyLedger | None = None) -> PrivacyReport:
        """The guarantee of the records this run learned, composed over every run that used them,
        with ``records`` = records the learner has learned and the public counts stated."""
        own = state.ledger.report()
        store_ledger = store_ledger if store_ledger is not None else self.store_ledger(state.ledger)
        composed = report_for(store_ledger, state.ledger.instances, state.learner.records_seen)
        # The store holds every use of our records, ours included; the own ledger can only be weaker
        # where the store was emptied or moved, so the statement takes the worse of the two.
        composed = dataclasses.replace(
            composed, output=_worse(composed.output, own.output), intrusion=_worse(composed.intrusion, own.intrusion),
            assumptions=(*composed.assumptions, *self.exposure),
        )
        return with_public_assumptions(composed, seeded=self._config.learner.seed is not None)

    # -- start-up --------------------------------------------------------------------------------

    def _account_lost_state(self, state: TrainingState, source: Source | IndexedFile, saved: Checkpoint) -> None:
        run = self.store.run_state(saved.instance)
        if run is None:
            log.warning(
                "the budget store %s has no record of run %s (another state directory?): what it spent before "
                "this resume is not in the store", self.store.path, saved.instance,
            )
            return
        lost_instance = f"{saved.instance}/lost-{run.losses + 1:03d}"
        lost_report = lost_state_report(state.learner.privacy())
        if isinstance(source, IndexedFile):
            if run.clean or (saved.replay is not None and saved.replay.restart):
                return
            self.store.register(lost_instance, saved.instance, lost_report, self._out)
            self.store.charge(lost_instance, self.keys.ranges(source.extent))
            self.store.note_loss(saved.instance)
            log.warning("run %s did not stop cleanly: its state since the last checkpoint was lost; charged as %s",
                        saved.instance, lost_instance)
            return
        durable = dict(run.positions)
        for key, position in self.keys.positions(saved.positions).items():
            durable[key] = max(durable.get(key, 0), position)
        lost = self.store.reclassify_lost(saved.instance, durable, lost_instance, lost_report)
        if lost:
            log.warning(
                "records charged by run %s after its last durable checkpoint were in a state that was not saved (a crash, "
                "or a stop inside a batch); they are re-learned now, and their earlier use is charged as %s (intrusion "
                "only): %s",
                saved.instance, lost_instance, ", ".join(f"{k} [{a}, {b})" for k, (a, b) in sorted(lost.items())),
            )

    def _precheck(self, state: TrainingState, source: Source | IndexedFile) -> None:
        """Refuse to start when records this run is about to read were spent by other runs beyond
        ``max_epsilon``. Finite local sources are read from their positions to the end; a Kafka
        run's positions are known only once partitions are assigned, so its first micro-batch is
        the check (:meth:`charge`)."""
        if self._limit is None:
            return
        if isinstance(source, IndexedFile):
            ranges = dict(source.extent)
        elif isinstance(source, (LineFileSource, SyntheticSource)):
            ranges = {source.key: (state.positions.get(source.key, 0), _OPEN_END)}
        elif isinstance(source, RecordingSource):
            ranges = {key: (position, _OPEN_END) for key, position in source.resume_positions().items()}
        else:
            return
        data_ranges = self.keys.ranges(ranges)
        ledger = self.store.ledger(data_ranges)
        if state.instance not in ledger.instances:  # the learner's whole guarantee stands for this run's use
            ledger.register(state.instance, state.learner.privacy())
        excess = exceeds(ledger, state.instance, data_ranges, self._limit)
        if excess is not None and _spent_by_others(excess, state.ledger.instances):
            raise BudgetExceededError(
                "refusing to start: " + describe_excess(excess, self._limit, self.store.instances())
                + "; nothing was learned. See `panpriv budget`."
            )


def with_public_assumptions(report: PrivacyReport, seeded: bool) -> PrivacyReport:
    """``report`` with the public counts stated, and the seeded-noise caveat for a seeded run."""
    assumptions = tuple(report.assumptions) + (PUBLIC_COUNTS,)
    if seeded:
        assumptions += (SEEDED_OUTPUT,)
    return dataclasses.replace(report, assumptions=assumptions)


def _spent_by_others(excess: Excess, own_instances: Mapping[str, object]) -> bool:
    return any(instance not in own_instances for instance, _ in excess.spent_by)


def _worse(a: Guarantee, b: Guarantee) -> Guarantee:
    """The componentwise weaker of two guarantees (it bounds both)."""
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))
