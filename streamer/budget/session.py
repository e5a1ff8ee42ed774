"""One process's dealings with the budget store shared by every run (:mod:`panpriv.streamer.budget.store`).

Every process that learns from records charges the store through one :class:`BudgetSession`:
``panpriv run`` (:meth:`BudgetSession.for_run`, opened once its learner is built or restored),
the E-S-A analyzer and the scale-out worker (:meth:`BudgetSession.for_role`). The session
registers the run, accounts for state a crash destroyed, refuses to start when other runs have
spent the records' budget, mirrors the ledger's registrations into the store, charges durably
*before* anything is learned, and composes the report of every use of this run's records. What a
charge covers is its unit (:mod:`panpriv.streamer.budget.units`): position ranges (``run``, a
worker), a round (an analyzer), or every user per round (``shuffle-gd``'s analyzer).

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
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import Excess, exceeds, lost_state_report, report_for
from panpriv.accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport
from panpriv.streamer.budget.open import BudgetSettings, open_budget, open_store
from panpriv.streamer.budget.store import BudgetExceededError, RunState, describe_excess
from panpriv.streamer.budget.units import ChargeUnit, owned_by
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
    """The budget store as one process sees it (module docstring).

    Parameters
    ----------
    store
        A :class:`panpriv.streamer.budget.store.BudgetStore` or
        :class:`panpriv.streamer.budget.kafka_store.KafkaBudgetStore` (same interface); closed by
        :meth:`close`.
    out
        The process's output or state directory (named in ``panpriv budget``).
    limit
        ``max_epsilon`` (``None``: no limit).
    keys
        ``panpriv run``: maps its source's keys to data keys (:mod:`panpriv.streamer.sources.identity`);
        ``None``: the ranges are given in data keys already (the roles).
    run
        The role's run instance (``panpriv run`` names its instances per call).
    unit
        A role's stepped charge unit (:class:`~panpriv.streamer.budget.units.Rounds`,
        :class:`~panpriv.streamer.budget.units.UsersPerRound`); ``None``: position ranges.
    """

    def __init__(self, store: Any, out: Path | str, limit: float | None = None, *, keys: DataKeys | None = None,
                 run: str = "", unit: ChargeUnit | None = None, seeded: bool = False) -> None:
        self.store = store
        self._out = Path(out)
        self._limit = limit
        self.keys = keys
        self.run = run
        self.unit = unit
        self._seeded = seeded
        self._config: ServiceConfig | None = None
        self._stored_reports: dict[str, PrivacyReport] = {}  # what the store holds for our instances
        self.learned_here = 0  # records or rounds learned by this process (0: a budget refusal is a refusal to start)
        self.exposure: tuple[str, ...] = ()  # what a read of memory or disk finds (panpriv.streamer.runtime.exposure)
        self._precharged: int | None = None  # a step charged by a process that died before its checkpoint

    @classmethod
    def for_run(cls, config: ServiceConfig, source: Source | IndexedFile) -> BudgetSession:
        """``panpriv run``'s session: the store ``[budget]`` names, ``learner.max_epsilon``, the
        source's data keys."""
        session = cls(open_budget(config), config.out or ".", config.learner.max_epsilon,
                      keys=data_keys_for(config.source.url, source), seeded=config.learner.seed is not None)
        session._config = config
        return session

    @classmethod
    def for_role(cls, settings: BudgetSettings, out: Path | str, run: str, unit: ChargeUnit | None = None) -> BudgetSession:
        """A role's session: the store ``settings`` name (:func:`panpriv.streamer.budget.open.open_store`)."""
        return cls(open_store(settings), out, settings.max_epsilon, run=run, unit=unit)

    def begin(self, state: TrainingState, source: Source | IndexedFile, saved: Checkpoint | None) -> None:
        """Register the run; on a resume first account the state a crash lost; refuse to start when
        the records about to be read are spent by other runs; mirror the ledger's registrations."""
        assert self._config is not None, "BudgetSession.for_run"
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

    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], own_instances: Container[str],
               what: str = "records") -> str | None:
        """Charge ``ranges`` to ``instance`` in the store, durably, before they are learned.

        Returns why not (the process then stops) if the records would exceed ``max_epsilon`` over
        all runs; raises :class:`BudgetExceededError` if this process has learned nothing yet and
        runs other than ``own_instances`` spent the budget (a refusal to start)."""
        excess = self.store.charge(instance, self._data_ranges(ranges), self._limit)
        if excess is None:
            return None
        assert self._limit is not None
        text = describe_excess(excess, self._limit, self.store.instances())
        if self.learned_here == 0 and _spent_by_others(excess, own_instances):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before learning {what} that would exceed the budget over all runs: {text}"

    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool) -> None:
        """Note that the checkpoint ``sequence`` holding ``positions`` is durable (``clean``: the run
        stopped cleanly)."""
        self.store.mark_durable(run, sequence, self._data_positions(positions), clean=clean)

    def _data_ranges(self, ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        return self.keys.ranges(ranges) if self.keys else dict(ranges)

    def _data_positions(self, positions: Mapping[str, int]) -> dict[str, int]:
        return self.keys.positions(positions) if self.keys else dict(positions)

    # -- a role's run: stepped units, lost batches ------------------------------------------------

    def begin_role(self, source: str, report: PrivacyReport, step: int | None = None) -> RunState | None:
        """Register the role's run with ``report`` and return what the store knew of it before (a
        restart). With a stepped unit and ``step``, the next step it would learn: note it if a
        process that died before its checkpoint charged it already (it is not charged again),
        else refuse (:class:`BudgetExceededError`) when other runs spent its records beyond the
        limit — before anything is learned or published."""
        unit = self.unit
        if unit is not None and step is not None:
            instance, ranges = unit.instance(self.run, step), unit.ranges(step)
            ledger = self.store.ledger(list(ranges))
            if instance in ledger.instances and any(
                instance in segment.uses for key, (start, stop) in ranges.items() for segment in ledger.coverage(key)
                if segment.start < stop and start < segment.stop
            ):
                self._precharged = step
            elif self._limit is not None:
                if instance not in ledger.instances:
                    ledger.register(instance, unit.step_report(step, report))
                excess = exceeds(ledger, instance, ranges, self._limit)
                if excess is not None and _spent_by_others(excess, _Own(self.run)):
                    raise BudgetExceededError(
                        "refusing to start: " + describe_excess(excess, self._limit, self.store.instances())
                        + "; nothing was learned and no model was published. See `panpriv budget`."
                    )
        previous = self.store.begin_run(self.run, self._out, source)
        self.register(self.run, report, self.run)
        return previous

    def charge_step(self, step: int, report: PrivacyReport) -> str | None:
        """Register ``report`` (the guarantee once step ``step`` is learned) for the step's instance
        and charge the step's ranges, durably, before it is learned (:meth:`charge`). A step found
        charged at :meth:`begin_role` is not charged again."""
        assert self.unit is not None
        instance = self.unit.instance(self.run, step)
        self.register(instance, self.unit.step_report(step, report), self.run)
        if step == self._precharged:
            self._precharged = None
            return None
        refused = self.charge(instance, self.unit.ranges(step), self.own(), "a round")
        if refused is None:
            self.learned_here += 1
        return refused

    def own(self) -> Container[str]:
        """The instances of the role's run (its own charges, its lost instances)."""
        return _Own(self.run)

    def mark_step_durable(self, step: int, clean: bool = False) -> None:
        """The role's checkpoint at step ``step`` (the next one to learn) is durable."""
        assert self.unit is not None
        self.mark_durable(self.run, step, {key: step for key in self.unit.ranges(step)}, clean)

    def reclassify_lost(self, durable: Mapping[str, int], lost_report: PrivacyReport) -> dict[str, tuple[int, int]]:
        """Move the run's charges at or beyond ``durable`` (per data key) to its next intrusion-only
        lost instance ``<run>/lost-NNN`` with ``lost_report``: they were read into a state that no
        output reflects (a batch revoked, stopped, or lost in a crash). Returns the lost ranges."""
        run = self.store.run_state(self.run)
        losses = run.losses if run is not None else 0
        return dict(self.store.reclassify_lost(self.run, durable, f"{self.run}/lost-{losses + 1:03d}", lost_report))

    # -- reporting -------------------------------------------------------------------------------

    def store_ledger(self, ledger: PrivacyLedger) -> PrivacyLedger:
        """Every use, by every run, of the data sources ``ledger`` (this run's) has charged."""
        return self.store.ledger([self.keys.key(k) if self.keys else k for k in ledger.sources])

    def composed(self, own: PrivacyReport, keys: list[str], records: int | None = None) -> PrivacyReport:
        """A role's statement: the guarantee of the records its run charged on ``keys``, composed
        over every run that used them; componentwise the worse of that and ``own`` (its learner's
        or deployment's statement), as :meth:`report` does for ``panpriv run``."""
        ledger = self.store.ledger(keys)
        names = list(ledger.instances)
        mine = self.unit.instances(self.run, names) if self.unit is not None else [
            name for name in names if owned_by(self.run, name)]
        composed = report_for(ledger, mine, own.records if records is None else records)
        composed = dataclasses.replace(
            composed,
            mechanism=own.mechanism,
            output=_worse(composed.output, own.output),
            intrusion=_worse(composed.intrusion, own.intrusion),
            assumptions=tuple(dict.fromkeys([*own.assumptions, *composed.assumptions])),
            references=tuple(dict.fromkeys([*own.references, *composed.references])),
        )
        return with_public_assumptions(composed, seeded=self._seeded)

    def per_source(self, keys: list[str]) -> dict[str, tuple[Guarantee, Guarantee]]:
        """The (output, intrusion) guarantee of each of ``keys``, composed over every run."""
        from panpriv.accounting.budget import per_source

        return {k: v for k, v in per_source(self.store.ledger(keys)).items() if k in keys}

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
        return with_public_assumptions(composed, seeded=self._seeded)

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
            self.store.charge(lost_instance, self._data_ranges(source.extent))
            self.store.note_loss(saved.instance)
            log.warning("run %s did not stop cleanly: its state since the last checkpoint was lost; charged as %s",
                        saved.instance, lost_instance)
            return
        durable = dict(run.positions)
        for key, position in self._data_positions(saved.positions).items():
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
        data_ranges = self._data_ranges(ranges)
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


def _spent_by_others(excess: Excess, own_instances: Container[str]) -> bool:
    return any(instance not in own_instances for instance, _ in excess.spent_by)


class _Own:
    """The instances of a role's run (:func:`panpriv.streamer.budget.units.owned_by`), as a container."""

    def __init__(self, run: str) -> None:
        self.run = run

    def __contains__(self, instance: object) -> bool:
        return isinstance(instance, str) and owned_by(self.run, instance)


def _worse(a: Guarantee, b: Guarantee) -> Guarantee:
    """The componentwise weaker of two guarantees (it bounds both)."""
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))
