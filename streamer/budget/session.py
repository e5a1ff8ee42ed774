"""One process's dealings with the budget store shared by every run (:mod:`panpriv.streamer.budget.store`).

Every process that learns from records charges the store through one :class:`BudgetSession`:
``panpriv run`` (:meth:`BudgetSession.for_run`, opened once its learner is built or restored),
the E-S-A analyzer and the scale-out worker (:meth:`BudgetSession.for_role`). The session
registers the run, accounts for state a crash destroyed, refuses to start when other runs have
spent the records' budget, mirrors the ledger's registrations into the store, charges durably
*before* anything is learned (several micro-batches per write for a source read in order,
:mod:`panpriv.streamer.budget.ahead`), and composes the report of every use of this run's records.
What a charge covers is its unit (:mod:`panpriv.streamer.budget.units`): position ranges (``run``,
a worker), a round (an analyzer), or every user per round (``shuffle-gd``'s analyzer).

Every process is an *attempt* at its run (:mod:`panpriv.streamer.budget.rules`): the store refuses a
second live process of one run, and each charge names the attempt that made it. The same rules
hold for every role: the session is the one place that applies them.

Crash accounting (:mod:`panpriv.accounting.budget`). Sequential sources: the ranges that a *dead* attempt
(one that did not stop cleanly) charged at or beyond its own durable marks — raised to the
positions of the checkpoint resumed from, which it may have written just before dying — were in a
state that the crash destroyed; those charges become an intrusion-only *lost* instance carrying the
dead process's last stored report, and the resumed run charges them again when it re-learns them.
Charges of attempts that stopped cleanly are never moved: after a rollback of the checkpoint the
re-learned records are a second use. Learners that read a recording by index: the set of records
learned since the checkpoint is not known (it is a function of the permutation), so each dead
attempt charges a lost instance with the whole recording — conservative. A pass restarted under a
new instance (``resumes_mid_pass`` False) composes with the interrupted pass in full already and
needs no lost instance.

A scale-out worker's Kafka positions follow the same rule (:meth:`BudgetSession.reclassify_lost`);
an E-S-A analyzer adds no noise, so a round a dead attempt charged but did not checkpoint is
learned again without a second charge (:meth:`BudgetSession.begin_role`).

Rollback of the store. The output directory records the store's id and generation in every
checkpoint and snapshot (:meth:`BudgetSession.mark`), a role in its sealed state
(:mod:`panpriv.streamer.state.role_state`); a process refuses a store that is another one or behind
what its output directory recorded (:meth:`BudgetSession.begin`, :meth:`BudgetSession.begin_role`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import Excess, lost_state_report, report_for
from panpriv.accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport
from panpriv.streamer.budget.ahead import Lookahead
from panpriv.streamer.budget.open import BudgetSettings, open_budget, open_store
from panpriv.streamer.budget.store import BudgetExceededError, RunState, describe_excess
from panpriv.streamer.budget.units import ChargeUnit, lost_instance, owned_by
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.io.sinks import last_budget_mark
from panpriv.streamer.sources.base import Source, display_name
from panpriv.streamer.sources.identity import IDENTIFICATION_RULE, DataKeys, data_keys_for
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
                 run: str = "", unit: ChargeUnit | None = None, seeded: bool = False, ahead: bool = False) -> None:
        self.store = store
        self._out = Path(out)
        self._limit = limit
        self.keys = keys
        self.run = run
        self.unit = unit
        self._seeded = seeded
        self._config: ServiceConfig | None = None
        self._orders = keys.orders if keys is not None else {}
        self._ahead = Lookahead() if ahead else None
        self._stored_reports: dict[str, PrivacyReport] = {}  # what the store holds for our instances
        self.learned_here = 0  # records or rounds learned by this process (0: a budget refusal is a refusal to start)
        self.exposure: tuple[str, ...] = ()  # what a read of memory or disk finds (panpriv.streamer.runtime.exposure)
        self._precharged: int | None = None  # a step charged by a process that died before its checkpoint
        self._pending_notice: float | None = None  # a run's planned ε until its composition notice is given

    @property
    def limit(self) -> float | None:
        """The ε limit on every record's composed use (``--max-epsilon``; ``None``: no limit)."""
        return self._limit

    @classmethod
    def for_run(cls, config: ServiceConfig, source: Source | IndexedFile) -> BudgetSession:
        """``panpriv run``'s session: the store ``[budget]`` names, ``learner.max_epsilon``, the
        source's data keys."""
        store = open_budget(config)  # a BudgetStore or a KafkaBudgetStore: the same interface
        try:
            keys = data_keys_for(config.source.url, source, make_codec(config.records))
        except BaseException:
            store.close()
            raise
        # A pass of a learner reading a recording by index is charged whole; other sources are read in order.
        session = cls(store, config.out or ".", config.learner.max_epsilon, keys=keys,
                      seeded=config.learner.seed is not None, ahead=not isinstance(source, IndexedFile))
        session._config = config
        return session

    @classmethod
    def for_role(cls, settings: BudgetSettings, out: Path | str, run: str, unit: ChargeUnit | None = None) -> BudgetSession:
        """A role's session: the store ``settings`` name (:func:`panpriv.streamer.budget.open.open_store`).
        Position ranges (``unit`` ``None``: a scale-out worker's Kafka partitions, read in order) are
        charged ahead (:mod:`panpriv.streamer.budget.ahead`); a stepped unit charges one step a write."""
        return cls(open_store(settings), out, settings.max_epsilon, run=run, unit=unit, ahead=unit is None)

    def begin(self, state: TrainingState, source: Source | IndexedFile, saved: Checkpoint | None) -> None:
        """Refuse a store behind what the output directory recorded; on a resume account the state
        that dead processes lost (never a live one's); refuse to start when the records about to be
        read are spent by other runs; register the run and this process's attempt (refused while
        another process runs it); mirror the ledger's registrations."""
        assert self._config is not None and self.keys is not None, "BudgetSession.for_run"
        self._check_seen(saved)
        self._adopt_legacy_key(self.keys)
        if saved is not None:
            self._account_lost_state(state, source, saved)
        self._precheck(state, source)
        self._pending_notice = state.learner.planned_privacy().output.epsilon
        reading = self._reading(state, source)
        if reading is not None:  # else (Kafka) the first micro-batch's charge says it
            self._announce_composition(reading, state.ledger.instances)
        resumed_at = self.keys.positions(saved.positions) if saved is not None else {}
        self.store.begin_run(state.instance, self._out, display_name(self._config.source.url), positions=resumed_at)
        for instance, report in state.ledger.instances.items():
            if instance == state.instance or instance.startswith(state.instance + "/"):
                self.register(instance, report, state.instance)

    def mark(self) -> dict[str, Any]:
        """What a checkpoint and a snapshot record of the store: its id and generation."""
        return self.store.mark()

    def close(self) -> None:
        self.store.close()

    # -- registrations and charges ---------------------------------------------------------------

    def register(self, instance: str, report: PrivacyReport, run: str, provisional: bool = False) -> None:
        """Mirror a ledger registration of run ``run`` in the store, when its guarantees changed (a
        write per change, not per micro-batch: the record count in the report is not composed).
        ``provisional``: a placeholder the instance's own report will replace (the store keeps
        every other report at least as weak as any it held)."""
        stored = self._stored_reports.get(instance)
        if stored is None or (stored.output, stored.intrusion) != (report.output, report.intrusion):
            self.store.register(instance, run, report, self._out, provisional=provisional)
            self._stored_reports[instance] = report

    def is_registered(self, instance: str) -> bool:
        return instance in self._stored_reports

    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], own_instances: Container[str],
               what: str = "records") -> str | None:
        """Charge ``ranges`` to ``instance`` in the store, durably, before they are learned.

        Returns why not (the process then stops) if the records would exceed ``max_epsilon`` over
        all runs; raises :class:`BudgetExceededError` if this process has learned nothing yet and
        runs other than ``own_instances`` spent the budget (a refusal to start)."""
        data_ranges = self._data_ranges(ranges)
        if self._pending_notice is not None:
            self._announce_composition(data_ranges, own_instances)
        excess = self._charge(instance, data_ranges)
        if excess is None:
            return None
        assert self._limit is not None
        text = describe_excess(excess, self._limit, self.store.instances())
        if self.learned_here == 0 and _spent_by_others(excess, own_instances):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before learning {what} that would exceed the budget over all runs: {text}"

    def _charge(self, instance: str, ranges: dict[str, tuple[int, int]]) -> Excess | None:
        """Charge a micro-batch's data ranges, ahead when the source is read in order
        (:mod:`panpriv.streamer.budget.ahead`): a window that would exceed the limit is not taken,
        the batch alone is charged and checked."""
        if self._ahead is None:
            return self.store.charge(instance, ranges, self._limit, orders=self._orders)
        needed = self._ahead.needed(instance, ranges)
        charged: dict[str, tuple[int, int]] = {}
        if needed:
            charged = self._ahead.window(needed, ranges)
            if self.store.charge(instance, charged, self._limit, orders=self._orders) is not None:
                charged = needed
                excess = self.store.charge(instance, needed, self._limit, orders=self._orders)
                if excess is not None:
                    return excess
        self._ahead.learned(instance, ranges, charged)
        return None

    def mark_durable(self, run: str, sequence: int, positions: Mapping[str, int], clean: bool) -> None:
        """Note that the checkpoint ``sequence`` holding ``positions`` is durable (``clean``: the run
        stopped cleanly, and gives back what it charged ahead and never learned)."""
        durable = self._data_positions(positions)
        if clean:
            self.give_back(run, durable)
        self.store.mark_durable(run, sequence, durable, clean=clean)

    def lose_unsaved(self, instance: str, positions: Mapping[str, int], report: PrivacyReport) -> None:
        """A clean stop whose checkpoint holds an earlier state than the one learned, at
        ``positions`` (a learner that saves only batch boundaries, stopped inside a batch,
        :meth:`panpriv.protocols.base.Learner.records_to_boundary`): the records ``instance``
        learned beyond them were in a state no checkpoint keeps — exposed to an intrusion, reflected
        by no output. Like a crash's (:meth:`reclassify_lost`), their charges move to an
        intrusion-only lost instance carrying ``report``'s intrusion guarantee; a resume learns them
        again as a new use."""
        run = self.store.run_state(instance)
        lost = lost_instance(instance, run.losses if run is not None else 0)
        self.store.reclassify_lost(instance, self._data_positions(positions), lost, lost_state_report(report))

    def give_back(self, instance: str, positions: Mapping[str, int] | None = None) -> None:
        """Give back what this process charged ahead to ``instance`` and never learned: its charges
        at or beyond, per data key, the furthest position it learned (and ``positions``, data keys),
        and forget the windows (the next micro-batch is charged afresh). For a process that stops
        cleanly, or drops what it read (a scale-out worker whose partitions are revoked)."""
        if self._ahead is None:
            return
        reached = self._ahead.reached(instance)
        self._ahead.forget(instance)
        for key, position in (positions or {}).items():
            reached[key] = max(reached.get(key, 0), int(position))
        if reached:
            self.store.uncharge(instance, reached)

    def _data_ranges(self, ranges: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        return self.keys.ranges(ranges) if self.keys else dict(ranges)

    def _data_positions(self, positions: Mapping[str, int]) -> dict[str, int]:
        return self.keys.positions(positions) if self.keys else dict(positions)

    def check_seen(self, mark: Mapping[str, Any] | None, where: str) -> None:
        """Refuse the store (:class:`~panpriv.streamer.budget.store.BudgetError`) if it is another
        one than, or behind the generation of, the ``mark`` an output directory recorded at
        ``where`` (a checkpoint, a snapshot, a role's state: :func:`panpriv.streamer.budget.rules.check_seen`)."""
        if mark:
            self.store.check_seen(mark, where)

    # -- a role's run: stepped units, lost batches ------------------------------------------------

    def begin_role(self, source: str, report: PrivacyReport, step: int | None = None,
                   seen: Mapping[str, Any] | None = None, where: str = "") -> RunState | None:
        """Register the role's run with ``report`` and this process's attempt at it, and return what
        the store knew of the run before (a restart).

        First the store is refused if it is behind the ``seen`` mark the role's state recorded at
        ``where`` (:meth:`check_seen`). With a stepped unit and ``step``, the next step it would
        learn: if a *dead* attempt of the run that did not stop cleanly charged it — beyond its
        durable marks, it died before its checkpoint — it is not charged again (the analyzer adds
        no noise: re-learning it releases the same model); a charge by an attempt that stopped
        cleanly is a use (a rolled-back state learns it again) and the step is charged again.
        Otherwise refuse (:class:`BudgetExceededError`) when other runs spent its records beyond
        the limit — before anything is learned or published. The attempt's durable marks start at
        the run's highest (a second live process of the run is refused)."""
        self.check_seen(seen, where)
        unit = self.unit
        if unit is not None and step is not None:
            instance, ranges = unit.instance(self.run, step), unit.ranges(step)
            if self._charged_by_dead_attempt(instance, ranges):
                self._precharged = step
            elif self._limit is not None:
                excess = self.store.check(instance, unit.step_report(step, report), ranges, self._limit,
                                          orders=self._orders)
                if excess is not None and _spent_by_others(excess, _Own(self.run)):
                    raise BudgetExceededError(
                        "refusing to start: " + describe_excess(excess, self._limit, self.store.instances())
                        + "; nothing was learned and no model was published. See `panpriv budget`."
                    )
        previous = self.store.begin_run(self.run, self._out, source)
        self.register(self.run, report, self.run)
        return previous

    def _charged_by_dead_attempt(self, instance: str, ranges: Mapping[str, tuple[int, int]]) -> bool:
        """Whether ``instance`` holds charges on ``ranges``, all made by attempts of the run that
        ended without a clean stop (:mod:`panpriv.streamer.budget.rules`)."""
        chargers = self.store.attempts_charging(instance, ranges)
        if not chargers:
            return False
        now = time.time()
        attempts = {a.attempt: a for a in self.store.attempts(self.run)}
        return all(a in attempts and not attempts[a].clean and not attempts[a].live(now) for a in chargers)

    def charge_step(self, step: int, report: PrivacyReport) -> str | None:
        """Register ``report`` (the guarantee once step ``step`` is learned) for the step's instance
        and charge the step's ranges, durably, before it is learned (:meth:`charge`). A step found
        charged by a dead attempt at :meth:`begin_role` is not charged again."""
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
        """Move to the run's next intrusion-only lost instance ``<run>/lost-NNN`` what no output
        reflects (:func:`panpriv.streamer.budget.rules.relabel`): this process's charges at or
        beyond ``durable`` (per data key: a batch revoked or stopped), after giving back what it
        charged ahead and never read (:meth:`give_back`), and the charges of every dead attempt
        of the run that did not stop cleanly, beyond its own durable marks (raised to
        ``durable``: a crash). The lost instance carries ``lost_report``, weakened by each dead
        process's last stored report. Returns the lost ranges."""
        self.give_back(self.run)
        run = self.store.run_state(self.run)
        losses = run.losses if run is not None else 0
        return dict(self.store.reclassify_lost(self.run, durable, lost_instance(self.run, losses), lost_report))

    # -- reporting -------------------------------------------------------------------------------

    def store_ledger(self, ledger: PrivacyLedger) -> PrivacyLedger:
        """Every use, by every run, of the data sources ``ledger`` (this run's) has charged (a
        recording's content key included)."""
        assert self.keys is not None, "BudgetSession.for_run"
        keys = {self.keys.key(k) for k in ledger.sources}
        if self.keys.content is not None and ledger.sources:
            keys.add(self.keys.content.key)
        return self.store.ledger(sorted(keys))

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

    def _check_seen(self, saved: Checkpoint | None) -> None:
        """Refuse the store if it is another one, or behind the generation, that this output
        directory's checkpoint or last snapshot recorded (:func:`panpriv.streamer.budget.rules.check_seen`)."""
        if saved is not None:
            self.check_seen(saved.budget_mark, f"the checkpoint in {self._out / 'checkpoints'}")
        snapshots = self._out / "snapshots.jsonl"
        self.check_seen(last_budget_mark(snapshots), str(snapshots))

    def _adopt_legacy_key(self, keys: DataKeys) -> None:
        """A store written before files were identified by content holds this file's uses under the
        SHA-256 of its bytes, with line positions: they become the content key's, in this file's order."""
        content = keys.content
        if content is None or not self.store.holds("sha256:"):
            return
        legacy = keys.legacy_key()
        if legacy is not None and (moved := self.store.adopt(legacy, content.key, content.order)):
            log.info("the budget store's %d charge(s) of %s (a file by its bytes) are now those of %s (by content)",
                     moved, legacy, content.key)

    def _account_lost_state(self, state: TrainingState, source: Source | IndexedFile, saved: Checkpoint) -> None:
        run = self.store.run_state(saved.instance)
        if run is None:
            log.warning(
                "the budget store %s has no record of run %s (another state directory?): what it spent before "
                "this resume is not in the store", self.store.path, saved.instance,
            )
            return
        lost_name = lost_instance(saved.instance, run.losses)
        lost_report = lost_state_report(state.learner.privacy())
        if isinstance(source, IndexedFile):
            if saved.replay is not None and saved.replay.restart:
                return
            dead = self.store.charge_lost(saved.instance, self._data_ranges(source.extent), lost_name, lost_report,
                                          orders=self._orders)
            if dead:
                log.warning("run %s did not stop cleanly (%d process(es)): its state since the last checkpoint was lost; "
                            "charged as %s", saved.instance, dead, lost_name)
            return
        lost = self.store.reclassify_lost(saved.instance, self._data_positions(saved.positions), lost_name,
                                          lost_report)
        if lost:
            log.warning(
                "records charged by run %s after its last durable checkpoint were in a state that was not saved (a crash, "
                "or a stop inside a batch); they are re-learned now, and their earlier use is charged as %s (intrusion "
                "only): %s",
                saved.instance, lost_name, ", ".join(f"{k} [{a}, {b})" for k, (a, b) in sorted(lost.items())),
            )

    def _precheck(self, state: TrainingState, source: Source | IndexedFile) -> None:
        """Refuse to start when records this run is about to read were spent by other runs beyond
        ``max_epsilon``. Finite local sources are read from their positions to the end; a Kafka
        run's positions are known only once partitions are assigned, so its first micro-batch is
        the check (:meth:`charge`)."""
        if self._limit is None:
            return
        data_ranges = self._reading(state, source)
        if data_ranges is None:
            return
        excess = self.store.check(state.instance, state.learner.privacy(), data_ranges, self._limit, orders=self._orders)
        if excess is not None and _spent_by_others(excess, state.ledger.instances):
            raise BudgetExceededError(
                "refusing to start: " + describe_excess(excess, self._limit, self.store.instances())
                + "; nothing was learned. See `panpriv budget`."
            )


    def _reading(self, state: TrainingState, source: Source | IndexedFile) -> dict[str, tuple[int, int]] | None:
        """The data ranges this run is about to read: finite local sources from their positions to
        the end; ``None`` for Kafka, whose positions are known only once partitions are assigned."""
        if isinstance(source, IndexedFile):
            ranges = dict(source.extent)
        elif isinstance(source, (LineFileSource, SyntheticSource)):
            ranges = {source.key: (state.positions.get(source.key, 0), _OPEN_END)}
        elif isinstance(source, RecordingSource):
            ranges = {key: (position, _OPEN_END) for key, position in source.resume_positions().items()}
        else:
            return None
        return self._data_ranges(ranges)

    def _announce_composition(self, data_ranges: Mapping[str, tuple[int, int]], own: Container[str]) -> None:
        """Once, before the first charge of ``panpriv run``: one line when the records about to be
        read (a file's or a recording's from its positions to the end; a Kafka run's first
        micro-batch) were used by other runs — how many runs, the ε those uses spent (output
        guarantee, worst record) and the ε after this run under basic composition with its planned
        guarantee — so no one learns of a second use of their data from the summary at the end."""
        planned, self._pending_notice = self._pending_notice, None
        if planned is None or not data_ranges:
            return
        ledger = self.store.ledger(sorted(data_ranges))
        others: set[str] = set()
        so_far = 0.0
        for key, (start, stop) in data_ranges.items():
            for segment in ledger.coverage(key):
                if segment.stop <= start or segment.start >= stop:
                    continue
                earlier = tuple(u for u in segment.uses if u not in own)
                if earlier:
                    others.update(earlier)
                    so_far = max(so_far, ledger.record_guarantee(earlier)[0].epsilon)
        if not others:
            return
        runs = sorted({name.split("/")[0] for name in others})
        log.warning(
            "these records were used before by %d run(s) (%s): ε = %.4g so far, up to ε = %.4g after this run "
            "(basic composition; see `panpriv budget`%s)",
            len(runs), ", ".join(runs[:3]) + (", …" if len(runs) > 3 else ""), so_far, so_far + planned,
            "" if self._limit is not None else "; --max-epsilon refuses a run beyond a limit",
        )


def with_public_assumptions(report: PrivacyReport, seeded: bool) -> PrivacyReport:
    """``report`` with the public counts and the identification rule stated, and the seeded-noise
    caveat for a seeded run."""
    assumptions = tuple(a for a in report.assumptions if a != IDENTIFICATION_RULE) + (IDENTIFICATION_RULE, PUBLIC_COUNTS)
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
