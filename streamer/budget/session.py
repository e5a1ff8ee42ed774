"""One run's dealings with the budget store shared by every run (:mod:`panpriv.streamer.budget.store`).

The processor opens a :class:`BudgetSession` once its learner is built or restored. The session
registers the run, accounts for state a crash destroyed, refuses to start when other runs have
spent the records' budget, mirrors the ledger's registrations into the store, charges position
ranges durably *before* they are learned (several micro-batches per write for a source read in
order, :mod:`panpriv.streamer.budget.ahead`), and composes the report of every use of this run's
records.

Every process is an *attempt* at its run (:mod:`panpriv.streamer.budget.rules`): the store refuses a
second live process of one run, and each charge names the attempt that made it.

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

Rollback of the store. The output directory records the store's id and generation in every
checkpoint and snapshot (:meth:`BudgetSession.mark`); a run refuses a store that is another one or
behind what its output directory recorded (:meth:`begin`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import Excess, lost_state_report, report_for
from panpriv.accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport
from panpriv.streamer.budget.ahead import Lookahead
from panpriv.streamer.budget.open import open_budget
from panpriv.streamer.budget.store import BudgetExceededError, BudgetStore, describe_excess
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.io.codec import make_codec
from panpriv.streamer.io.indexed import IndexedFile
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
        try:
            self.keys: DataKeys = data_keys_for(config.source.url, source, make_codec(config.records))
        except BaseException:
            self.store.close()
            raise
        self._orders = self.keys.orders
        self._ahead = None if isinstance(source, IndexedFile) else Lookahead()  # passes are charged whole
        self._stored_reports: dict[str, PrivacyReport] = {}  # what the store holds for our instances
        self.learned_here = 0  # records learned by this process (0: a budget refusal is a refusal to start)

    def begin(self, state: TrainingState, source: Source | IndexedFile, saved: Checkpoint | None) -> None:
        """Refuse a store behind what the output directory recorded; on a resume account the state
        that dead processes lost (never a live one's); refuse to start when the records about to be
        read are spent by other runs; register the run and this process's attempt (refused while
        another process runs it); mirror the ledger's registrations."""
        self._check_seen(saved)
        self._adopt_legacy_key()
        if saved is not None:
            self._account_lost_state(state, source, saved)
        self._precheck(state, source)
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

    def charge(self, instance: str, ranges: Mapping[str, tuple[int, int]], own_instances: Mapping[str, object]) -> str | None:
        """Charge ``ranges`` to ``instance`` in the store, durably, before they are learned.

        Returns why not (the run then stops) if the records would exceed ``max_epsilon`` over all
        runs; raises :class:`BudgetExceededError` if this process has learned nothing yet and
        runs other than ``own_instances`` spent the budget (a refusal to start)."""
        excess = self._charge(instance, self.keys.ranges(ranges))
        if excess is None:
            return None
        assert self._limit is not None
        text = describe_excess(excess, self._limit, self.store.instances())
        if self.learned_here == 0 and _spent_by_others(excess, own_instances):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before learning records that would exceed the budget over all runs: {text}"

    def _charge(self, instance: str, ranges: dict[str, tuple[int, int]]) -> Excess | None:
        """Charge a micro-batch's data ranges, ahead when the source is read in order
        (:mod:`panpriv.streamer.budget.ahead`): a window that would exceed the limit is not taken,
        the batch alone is charged and checked."""
        if self._ahead is None:
            return self.store.charge(instance, ranges, self._limit, orders=self._orders)
        needed = self._ahead.needed(instance, ranges)
        charged: dict[str, tuple[int, int]] = {}
        if needed:
            charged = Lookahead.widened(needed, ranges)
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
        durable = self.keys.positions(positions)
        if clean and self._ahead is not None:  # a sequential source: nothing at or past the positions was learned
            self.store.uncharge(run, durable)
        self.store.mark_durable(run, sequence, durable, clean=clean)

    # -- reporting -------------------------------------------------------------------------------

    def store_ledger(self, ledger: PrivacyLedger) -> PrivacyLedger:
        """Every use, by every run, of the data sources ``ledger`` (this run's) has charged (a
        recording's content key included)."""
        keys = {self.keys.key(k) for k in ledger.sources}
        if self.keys.content is not None and ledger.sources:
            keys.add(self.keys.content.key)
        return self.store.ledger(sorted(keys))

    def report(self, state: TrainingState, store_ledger: PrivacyLedger | None = None) -> PrivacyReport:
        """The guarantee of the records this run learned, composed over every run that used them,
        with ``records`` = records the learner has learned and the public counts stated."""
        own = state.ledger.report()
        store_ledger = store_ledger if store_ledger is not None else self.store_ledger(state.ledger)
        composed = report_for(store_ledger, state.ledger.instances, state.learner.records_seen)
        # The store holds every use of our records, ours included; the own ledger can only be weaker
        # where the store was emptied or moved, so the statement takes the worse of the two.
        composed = dataclasses.replace(
            composed, output=_worse(composed.output, own.output), intrusion=_worse(composed.intrusion, own.intrusion)
        )
        return with_public_assumptions(composed, seeded=self._config.learner.seed is not None)

    # -- start-up --------------------------------------------------------------------------------

    def _check_seen(self, saved: Checkpoint | None) -> None:
        """Refuse the store if it is another one, or behind the generation, that this output
        directory's checkpoint or last snapshot recorded (:func:`panpriv.streamer.budget.rules.check_seen`)."""
        if saved is not None and saved.budget_mark:
            self.store.check_seen(saved.budget_mark, f"the checkpoint in {self._out / 'checkpoints'}")
        snapshots = self._out / "snapshots.jsonl"
        mark = _last_mark(snapshots)
        if mark is not None:
            self.store.check_seen(mark, str(snapshots))

    def _adopt_legacy_key(self) -> None:
        """A store written before files were identified by content holds this file's uses under the
        SHA-256 of its bytes, with line positions: they become the content key's, in this file's order."""
        content = self.keys.content
        if content is None or not self.store.holds("sha256:"):
            return
        legacy = self.keys.legacy_key()
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
        lost_instance = f"{saved.instance}/lost-{run.losses + 1:03d}"
        lost_report = lost_state_report(state.learner.privacy())
        if isinstance(source, IndexedFile):
            if saved.replay is not None and saved.replay.restart:
                return
            dead = self.store.charge_lost(saved.instance, self.keys.ranges(source.extent), lost_instance, lost_report,
                                          orders=self._orders)
            if dead:
                log.warning("run %s did not stop cleanly (%d process(es)): its state since the last checkpoint was lost; "
                            "charged as %s", saved.instance, dead, lost_instance)
            return
        lost = self.store.reclassify_lost(saved.instance, self.keys.positions(saved.positions), lost_instance, lost_report)
        if lost:
            log.warning(
                "records charged by run %s after its last durable checkpoint were in a state lost in a crash; they "
                "are re-learned now, and their earlier use is charged as %s (intrusion only): %s",
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
        excess = self.store.check(state.instance, state.learner.privacy(), data_ranges, self._limit, orders=self._orders)
        if excess is not None and _spent_by_others(excess, state.ledger.instances):
            raise BudgetExceededError(
                "refusing to start: " + describe_excess(excess, self._limit, self.store.instances())
                + "; nothing was learned. See `panpriv budget`."
            )


def with_public_assumptions(report: PrivacyReport, seeded: bool) -> PrivacyReport:
    """``report`` with the public counts and the identification rule stated, and the seeded-noise
    caveat for a seeded run."""
    assumptions = tuple(a for a in report.assumptions if a != IDENTIFICATION_RULE) + (IDENTIFICATION_RULE, PUBLIC_COUNTS)
    if seeded:
        assumptions += (SEEDED_OUTPUT,)
    return dataclasses.replace(report, assumptions=assumptions)


def _spent_by_others(excess: Excess, own_instances: Mapping[str, object]) -> bool:
    return any(instance not in own_instances for instance, _ in excess.spent_by)


def _last_mark(snapshots: Path) -> dict[str, Any] | None:
    """The budget mark of the last complete snapshot record in ``snapshots`` (read from the end)."""
    try:
        handle = open(snapshots, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None
    complete: list[bytes] = []
    with handle:
        position, tail = handle.seek(0, 2), b""
        while position > 0 and not complete:
            step = min(position, 1 << 16)
            position -= step
            handle.seek(position)
            tail = handle.read(step) + tail
            pieces = tail.split(b"\n")[:-1]  # after the last newline: a partial line, or nothing
            complete = [p for p in (pieces[1:] if position > 0 else pieces) if p.strip()]
    if not complete:
        return None
    try:
        mark = json.loads(complete[-1]).get("budget")
    except (ValueError, AttributeError):
        return None
    return mark if isinstance(mark, dict) else None


def _worse(a: Guarantee, b: Guarantee) -> Guarantee:
    """The componentwise weaker of two guarantees (it bounds both)."""
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))
