"""``panpriv analyze --learner shuffle-gd``: the analyzer of Encode–Shuffle–Analyze for fully
interactive shuffle gradient descent (Cheu et al. 2022, Alg. 5, Lemma B.6, Thm 4.9) over secure
summation (Ishai et al. 2006, :mod:`panpriv.protocols.secure_sum`; :mod:`panpriv.streamer.esa.sum_analyzer`).

Round t of ``shuffle-gd`` is a secure-sum round of **all n users** (the shuffler's threshold is n,
``panpriv shuffle --batch-size n --shares m``): each user sends her PVEC count vector at θ_t as m
shares, each sealed to the analyzer and the m together to the shuffler
(:mod:`panpriv.streamer.esa.gd_client`), the analyzer sums the n·m units mod q, checks the
range and gives the totals to :meth:`panpriv.protocols.shuffle_base.EncodedLearner.learn_totals` — the
in-process learner's own analysis and projected gradient step — and publishes θ_{t+1}. It is
:class:`~panpriv.streamer.esa.sum_analyzer.SumAnalyzer` with three differences:

- **T rounds, then nothing.** Round t < T only (``horizon_reached`` beyond); after the T-th round
  the model record carries the released average iterate. Clients refuse a round ≥ T anyway.
- **Every round is charged to every user, before anything of it is opened.** The gate (the budget
  store, :class:`panpriv.streamer.budget.units.UsersPerRound`) is asked *before* the units are opened,
  with the round's increment of the composed guarantee (:meth:`GDAnalyzer.round_report`), and
  charges the whole data set — positions [0, n) — to the round's own instance
  ``<instance>/round-NNNNNN``, as ``panpriv run`` charges each pass of the in-process learner
  (:mod:`panpriv.streamer.runtime.recorded_driver`). The ledger's basic composition of the T increments telescopes to the
  composed guarantee of :func:`gd_report`.
- **A failed round is charged and counted, not learned.** A round with a unit that does not open
  (``invalid_units``) or a total out of range (``out_of_range``) is skipped as for the other
  secure-sum learners, but its users answered it (each user answers each round once), and whether
  it fails depends on its totals (a shifted sum leaves the range or not depending on the honest
  users' counts): so it is one of the T rounds — charged, counted in the statement — and the
  learner takes T minus the skipped rounds' steps. The model record after it repeats θ.

Checkpoints (``panpriv-esa-gd-analyzer/2``) name the learner; the step adds no noise, so a round
re-analysed after a SIGKILL is the dead process's computation bit for bit and the round charged
but not checkpointed is found in the store and not charged again (:mod:`panpriv.streamer.esa.analyze_service`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nacl.public import PrivateKey

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols.secure_sum import SumPlan, added_delta
from panpriv.protocols.shuffle_gd import ROUND_MARGIN, ShuffleGD, composed
from panpriv.streamer.budget.units import ChargeUnit, UsersPerRound
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyzer import check_format, decode_state
from panpriv.streamer.esa.deployment import (
    DEPLOYMENT,
    REFERENCE,
    SECURE_SUM_REFERENCE,
    honest_users_line,
    parties,
    secure_sum_statement,
)
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer
from panpriv.streamer.runtime.learners import restore_learner

CHECKPOINT_FORMAT = "panpriv-esa-gd-analyzer/2"


def local_over_rounds(learner: ShuffleGD, rounds: int) -> Guarantee:
    """The local guarantee of ``rounds`` of one user's PVEC messages, adaptively composed (the
    better of basic and advanced composition with the learner's slack); none if one message has none."""
    one = learner.message_guarantee()
    if not one.is_meaningful:
        return Guarantee.none()
    return composed(one.epsilon, one.delta, rounds, learner.slack)


def gd_report(learner: ShuffleGD, plan: SumPlan, answered: int, skipped: int = 0) -> PrivacyReport:
    """The statement of a ``shuffle-gd`` deployment in three roles after ``answered`` rounds.

    - **output**, **intrusion** into the analyzer, **broker colluding with it**: each round is
      (ε₀, δ₀ + (1 + e^ε₀)·τ)-DP given the earlier rounds (PVEC's totals are (ε₀, δ₀)-DP, Cheu et
      al. 2022 Thm 3.2; the round's shuffled shares are within τ of a function of the totals, and
      the hybrid argument of :mod:`panpriv.protocols.secure_sum` adds (1 + e^ε₀)·τ), and a user
      takes part in every round: the adaptive composition of ``answered`` such rounds, the better
      of basic and advanced composition (Dwork & Roth 2014, Thms 3.16, 3.20; the learner's own
      :meth:`ShuffleGD.composed_guarantee`). Both compositions add the per-round δ linearly, so τ
      costs answered·(1 + e^ε₀)·τ in δ. The messages topic holds each user's m shares of a round
      as one message sealed to the shuffler: the analyzer's key does not link them.
    - the shuffler **colluding** with the analyzer: they link each user's m shares of every round,
      so they see her T count vectors: the local guarantee of one PVEC message composed over the T
      rounds she answers (at most T: her client refuses more).
    """
    report = learner.privacy()
    epsilon0 = learner.vector_sum.epsilon
    extra = added_delta(epsilon0, plan.tau)
    output = learner.composed_guarantee(answered, extra)
    rounds = learner.planned_rounds
    local = local_over_rounds(learner, rounds)
    roles = [
        f"deployment: {DEPLOYMENT} (Encode-Shuffle-Analyze) over secure summation, fully interactive: each of the "
        f"n = {plan.users} users answers each of the T = {rounds} rounds at that round's public model, splitting her "
        f"PVEC count vector into m = {plan.shares} additive shares in Z_q^d, q = 2^{plan.bits}, each sealed separately "
        "to the analyzer's key and the m together to the shuffler's; a separate shuffler removes its layer, releases a "
        "round only with all n users, permutes the n*m shares with OS entropy and signs the batch; the analyzer sums "
        "them mod q",
        f"composition: {answered} of T = {rounds} rounds analysed ({skipped} of them skipped as invalid, charged all the "
        f"same); each round is (eps0, delta0 + (1 + e^eps0) tau) = ({epsilon0:.6g}, "
        f"{learner.vector_sum.delta:.3g} + {extra:.3g})-DP given the earlier rounds (secure summation: tau = "
        f"{plan.tau:.3g}, the bound proved in panpriv.protocols.secure_sum); the rounds compose adaptively (the better "
        f"of basic and advanced composition with slack delta/(T + 1) = {learner.slack:.3g})",
        *parties(output, local),
        f"client refusal rule: each user answers each round at most once and at most T = {rounds} rounds (her client "
        "refuses others, and any change of the plan), so the local guarantee above is of her T count vectors together "
        "(PVEC's randomizer, composed over T)",
        honest_users_line(plan, learner.honest_fraction),
        "dropouts: a round is released only with all n users (the shuffler's threshold), so a user who drops out "
        "stalls the deployment; rounds are never released with fewer users",
        "malicious clients: a client can shift a round's sum by any amount mod q (utility only); a round whose sum "
        "leaves [0, n(g + b)], or with any share that does not open, is skipped but charged as one of the T rounds "
        "(its users answered it); every well-formed share is assumed to come from an honest client running PVEC's "
        "randomizer",
    ]
    assumptions = [a for a in report.assumptions if not a.startswith("a trusted shuffler")
                   and "rounds started so far" not in a and not a.startswith("this figure already counts")
                   and not a.startswith("pan-privacy: the state holds")]
    return secure_sum_statement(report, output, roles, assumptions)


class GDAnalyzer(SumAnalyzer):
    """The ``shuffle-gd`` analyzer's state machine (no I/O); module docstring.

    Parameters
    ----------
    learner
        A :class:`ShuffleGD` (n users, T rounds).
    keys, name, instance
        As :class:`panpriv.streamer.esa.analyzer.Analyzer`.
    """

    learner: ShuffleGD

    def __init__(self, learner: ShuffleGD, keys: list[PrivateKey], name: str, instance: str | None = None) -> None:
        super().__init__(learner, keys, name, instance)
        self.learner = learner
        self.rounds = learner.planned_rounds
        self.extra_delta = added_delta(learner.vector_sum.epsilon, self.tau)

    CHECKPOINT_FORMAT = CHECKPOINT_FORMAT

    def charge_unit(self, key: str) -> ChargeUnit:
        """Every user per round, to the round's own instance with :meth:`round_report` (module docstring)."""
        return UsersPerRound(key, self.users, self.round_report)

    @property
    def finished(self) -> bool:
        """The T rounds are analysed (learned or skipped)."""
        return self.round >= self.rounds

    @property
    def done(self) -> bool:
        """The T rounds are analysed: the service stops (no client answers a round beyond T)."""
        return self.finished

    def _learn(self, batch: wire.Batch) -> bool | None:
        """Charge the round (every user, its increment) before opening anything, then open, sum,
        check and learn: True if learned, False if skipped (charged, counted), ``None`` if the
        budget refused it."""
        if self.gate is not None:
            self.stopped = self.gate(self.round, self.round_report(self.round))
            if self.stopped is not None:
                return None
        return self._sum_and_learn(batch, charge=None)

    def composed_output(self, rounds: int) -> Guarantee:
        """The output guarantee of ``rounds`` rounds of this deployment (with the secure sum's τ)."""
        return self.learner.composed_guarantee(rounds, self.extra_delta)

    def round_report(self, round_: int) -> PrivacyReport:
        """The ledger report of round ``round_`` (0-based): its increment of the composed output
        guarantee, rounded up by a relative :data:`panpriv.protocols.shuffle_gd.ROUND_MARGIN` (so the
        ledger's basic composition of the increments telescopes to :func:`gd_report`'s output,
        never below it); intrusion: the same increment (:func:`gd_report`: an intrusion into the
        analyzer sees what the output guarantee covers)."""
        before, after = self.composed_output(round_), self.composed_output(round_ + 1)
        increment = Guarantee((after.epsilon - before.epsilon) * (1.0 + ROUND_MARGIN),
                              min(1.0, (after.delta - before.delta) * (1.0 + ROUND_MARGIN)))
        return PrivacyReport(
            mechanism=self.learner.name,
            records=self.users,
            output=increment,
            intrusion=increment,
            assumptions=(f"round {round_ + 1} of T = {self.rounds} of the E-S-A deployment {self.name}: the increment of "
                         "the composed guarantee, charged to every user of the data set",),
            references=("Cheu et al. 2022, Lemma B.6", "Dwork & Roth 2014, Thm 3.20", REFERENCE, SECURE_SUM_REFERENCE),
        )

    def calibration(self) -> dict[str, Any]:
        """:meth:`SumAnalyzer.calibration` with the per-round PVEC budget (ε₀, δ₀) as ``epsilon``,
        ``delta`` (what the client's PVEC instance is built from) and the plan: T, the composed
        (ε, δ) it promises and the composition's slack δ/(T + 1)."""
        learner = self.learner
        return {
            **super().calibration(),
            "epsilon": learner.vector_sum.epsilon,
            "delta": learner.vector_sum.delta,
            "rounds": self.rounds,
            "total_epsilon": learner.epsilon,
            "total_delta": learner.delta,
            "slack": learner.slack,
            "budget": learner.budget,
        }

    def report(self) -> PrivacyReport:
        """:func:`gd_report` after the rounds analysed so far."""
        return gd_report(self.learner, self.plan, self.round, self.skipped)

    def checkpoint(self, privacy: PrivacyReport | None = None) -> dict[str, Any]:
        return {**super().checkpoint(privacy), "format": CHECKPOINT_FORMAT}

    @classmethod
    def restore(cls, data: Mapping[str, Any], keys: list[PrivateKey]) -> GDAnalyzer:
        check_format(data, CHECKPOINT_FORMAT, "a shuffle-gd analyzer checkpoint")
        if data.get("learner") != ShuffleGD.name:
            raise ValueError(f"not a shuffle-gd analyzer checkpoint ({CHECKPOINT_FORMAT})")
        learner = restore_learner(ShuffleGD.name, data["config"], decode_state(data["state"]), None)
        assert isinstance(learner, ShuffleGD)
        analyzer = cls(learner, keys, data["name"], data.get("instance"))
        analyzer._restore_fields(data)
        analyzer.round = int(data["round"])
        analyzer.skipped = int(data["skipped"])
        if analyzer.round > analyzer.rounds:
            raise ValueError(f"checkpoint round {analyzer.round} beyond T = {analyzer.rounds}")
        return analyzer
