"""The budget store for a ``shuffle-gd`` deployment in three roles (:mod:`panpriv.streamer.esa.gd_analyzer`).

The rules of :mod:`panpriv.streamer.esa.budget` (data key ``esa:<cluster>/<messages topic>``, charge
before learning, ``max_epsilon`` checked in the same transaction, crash without a lost instance)
with the unit changed: in ``shuffle-gd`` every user answers every round, so a round is not a
position. **A position is a user** — the n users of the deployment are positions [0, n) of the
data key — and **round t charges all of them** to its own instance ``<instance>/round-NNNNNN``
(:func:`panpriv.streamer.runtime.replay.pass_instance`, the name ``panpriv run`` gives each pass of the in-process
learner), registered with the round's increment of the composed guarantee
(:meth:`panpriv.streamer.esa.gd_analyzer.GDAnalyzer.round_report`). The ledger then shows every user used
once per round, and its basic composition of the increments telescopes to the deployment's
composed T-round guarantee (not T times it). A second analyzer on the same messages topic charges
the same positions [0, n) and composes with the first; a messages topic must serve one deployment
(its positions are users here, rounds for the other learners).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import exceeds
from panpriv.accounting.ledger import PrivacyReport
from panpriv.streamer.budget.store import BudgetExceededError, describe_excess
from panpriv.streamer.esa.budget import AnalyzerBudget
from panpriv.streamer.runtime.replay import pass_instance


class GDAnalyzerBudget(AnalyzerBudget):
    """:class:`AnalyzerBudget` charging every user per round (module docstring).

    ``users``: n; ``round_report(t)``: the ledger report of round t (0-based), asked at start-up
    to check the next round against ``limit`` before any model is published.
    """

    def __init__(self, store: Any, key: str, instance: str, out: Path, limit: float | None, users: int,
                 round_report: Callable[[int], PrivacyReport]) -> None:
        super().__init__(store, key, instance, out, limit)
        self.users = users
        self.round_report = round_report

    def round_instance(self, round_: int) -> str:
        """The store instance of round ``round_`` (0-based; named 1-based like the passes of ``panpriv run``)."""
        return pass_instance(self.instance, round_ + 1)

    def _ranges(self) -> dict[str, tuple[int, int]]:
        return {self.key: (0, self.users)}

    def _mine(self, use: str) -> bool:
        return use == self.instance or use.startswith(self.instance + "/")

    def begin(self, round_: int, report: PrivacyReport, source: str) -> None:
        """Register the run; note a round charged by a process that died before its checkpoint;
        refuse (:class:`BudgetExceededError`) when round ``round_`` would exceed the limit because
        of other runs."""
        ledger = self.store.ledger([self.key])
        instance = self.round_instance(round_)
        if instance in ledger.instances and any(instance in segment.uses for segment in ledger.coverage(self.key)):
            self._precharged = round_
        elif self.limit is not None:
            ledger.register(instance, self.round_report(round_))
            excess = exceeds(ledger, instance, self._ranges(), self.limit)
            if excess is not None and any(not self._mine(use) for use, _ in excess.spent_by):
                raise BudgetExceededError(
                    "refusing to start: " + describe_excess(excess, self.limit, self.store.instances())
                    + "; nothing was learned and no model was published. See `panpriv budget`."
                )
        self.store.begin_run(self.instance, self.out, source)
        self.register(report)

    def charge(self, round_: int, report: PrivacyReport) -> str | None:
        """Register round ``round_``'s instance with ``report`` (its increment) and charge every
        user to it, durably, before anything of the round is opened. As
        :meth:`AnalyzerBudget.charge` otherwise."""
        instance = self.round_instance(round_)
        self.store.register(instance, self.instance, report, self.out)
        if round_ == self._precharged:
            self._precharged = None
            return None
        excess = self.store.charge(instance, self._ranges(), self.limit)
        if excess is None:
            self.learned_here += 1
            return None
        assert self.limit is not None
        text = describe_excess(excess, self.limit, self.store.instances())
        if self.learned_here == 0 and any(not self._mine(use) for use, _ in excess.spent_by):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before a round that would exceed the budget over all runs: {text}"

    def instances(self, ledger: Any) -> list[str]:
        """The round instances of this analyzer in ``ledger``."""
        return sorted(i for i in ledger.instances if i.startswith(self.instance + "/round-"))
