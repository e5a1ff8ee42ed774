"""What one step of a role charges in the budget store: the charge units of :class:`BudgetSession`.

Every role charges the budget store through one :class:`panpriv.streamer.budget.session.BudgetSession`;
what differs is the unit of a charge:

====================  =============================================  ==================================
unit                  who                                             a step charges
====================  =============================================  ==================================
positions             ``panpriv run``, a scale-out worker             the ranges it is about to learn
                                                                      (offsets, line or record indexes)
:class:`Rounds`       the E-S-A analyzer (``shuffle-gaussian``,       position t of the deployment's
                      ``shuffle-acsa``, ``shuffle-sgd``, ``checkin``) data key, to the run's instance
:class:`UsersPerRound` the E-S-A analyzer of ``shuffle-gd``            positions [0, n) — every user —
                                                                      to the round's own instance
====================  =============================================  ==================================

Positions need no object: the caller gives the ranges (:meth:`BudgetSession.charge`). A stepped
unit turns a step number into the instance it charges and the ranges, and says which instances
are the run's own (a refusal because of *other* runs is a refusal to start).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from panpriv.accounting.ledger import PrivacyReport


def owned_by(run: str, instance: str) -> bool:
    """``instance`` is ``run`` or one of its parts (a pass, a round, a lost state)."""
    return instance == run or instance.startswith(run + "/")


def pass_instance(run: str, number: int) -> str:
    """The instance of pass or round ``number`` (1-based) of ``run``: ``<run>/round-NNNNNN`` (the
    name ``panpriv run`` gives each pass of a multi-pass learner, and the E-S-A ``shuffle-gd``
    analyzer each round)."""
    return f"{run}/round-{number:06d}"


def lost_instance(run: str, losses: int) -> str:
    """The intrusion-only instance of ``run``'s next lost state, after ``losses`` earlier ones:
    ``<run>/lost-NNN`` (a crash, a dropped or handed-back batch, a clean stop inside a batch)."""
    return f"{run}/lost-{losses + 1:03d}"


@dataclass(frozen=True)
class Rounds:
    """Step t is position t of ``key`` (the b messages of round t, one per user), charged to the
    run's instance with the deployment's statement."""

    key: str

    def instance(self, run: str, step: int) -> str:
        return run

    def ranges(self, step: int) -> dict[str, tuple[int, int]]:
        return {self.key: (step, step + 1)}

    def step_report(self, step: int, report: PrivacyReport) -> PrivacyReport:
        return report

    def instances(self, run: str, names: Iterable[str]) -> list[str]:
        """The instances of ``names`` that hold the run's charges."""
        return [run]


@dataclass(frozen=True)
class UsersPerRound:
    """Step t charges positions [0, users) of ``key`` — every user answers every round — to the
    round's own instance (:func:`pass_instance`), registered with the round's increment of the
    composed guarantee (``round_report(t)``), so that the ledger's composition of the T rounds is
    the deployment's statement (Cheu et al. 2022, Alg. 5)."""

    key: str
    users: int
    round_report: Callable[[int], PrivacyReport]

    def instance(self, run: str, step: int) -> str:
        return pass_instance(run, step + 1)

    def ranges(self, step: int) -> dict[str, tuple[int, int]]:
        return {self.key: (0, self.users)}

    def step_report(self, step: int, report: PrivacyReport) -> PrivacyReport:
        return self.round_report(step)

    def instances(self, run: str, names: Iterable[str]) -> list[str]:
        return sorted(name for name in names if name.startswith(run + "/round-"))


ChargeUnit = Rounds | UsersPerRound
"""A stepped unit (positions are given directly)."""
