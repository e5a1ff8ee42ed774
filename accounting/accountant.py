"""An accountant object: compose the privacy events of a run, then ask for ε at a δ or δ at an ε.

The functions of :mod:`accounting` answer one question each; this object keeps a list of events
(dp_accounting's separation of events from accountants) and answers both questions for their
adaptive composition, with the tightest of the valid bounds it knows:

- :class:`GaussianEvent` (noise std = multiplier × ℓ₂ sensitivity). Gaussian mechanisms compose
  exactly: k of them with multipliers σᵢ are μ-GDP with μ = (Σ σᵢ⁻²)^{1/2} (Dong, Roth & Su 2022,
  Thm 2.7 and Cor. 3.3), i.e. one Gaussian mechanism with multiplier 1/μ, whose exact δ(ε) is
  the analytic Gaussian curve (Balle & Wang 2018, Thm 8; :func:`panpriv.accounting.gaussian.analytic_delta`).
- :class:`ApproximateDpEvent` (any (ε, δ)-DP mechanism, e.g. a learner's released output). These
  compose by the better of basic composition (Σεⱼ, Σδⱼ) (Dwork & Roth 2014, Thm 3.16) and
  heterogeneous advanced composition with slack γ (Σ εⱼ(e^{εⱼ} − 1) + √(2 ln(1/γ) Σ εⱼ²),
  Σδⱼ + γ) (Kairouz, Oh & Viswanath 2015; Cheu et al. 2022, Lemma 3.3).
- Both kinds together, in any interleaving: the Gaussian part's (ε_G, δ_G) and the other part's
  (ε_A, δ_A) compose to (ε_G + ε_A, δ_G + δ_A). Why interleaving is allowed: in f-DP the adaptive
  composition of all the events is the tensor product of their trade-off functions, which is
  commutative and monotone in each factor (Dong, Roth & Su 2022, Thm 3.2 and §3), so the Gaussian factors
  can be grouped (exactly G_μ, bounded below by f_{ε_G, δ_G}) and the others bounded below by the
  trade-off function of their advanced- or basic-composition pair; two (ε, δ) trade-off functions
  compose within basic composition. The split of δ (or of ε) between the parts is searched on a
  grid; every grid point is itself a valid bound, so the minimum is too.

:meth:`Accountant.to_dp_events` exports the events as ``dp_accounting`` DpEvents (the optional
``dp-accounting`` package) so a user can cross-check with an independent accountant; an
(ε, δ) guarantee has no DpEvent and is exported as ``UnsupportedDpEvent``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from panpriv.accounting.composition import heterogeneous
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_delta, analytic_epsilon
from panpriv.accounting.validation import nonnegative, open_unit, positive, positive_int

if TYPE_CHECKING:
    from panpriv.accounting.ledger import PrivacyReport

SPLIT_POINTS = 256
"""Grid points for the split of δ (or ε) between the Gaussian and the (ε, δ) parts."""


@dataclass(frozen=True)
class GaussianEvent:
    """The Gaussian mechanism: noise std = ``noise_multiplier`` × the ℓ₂ sensitivity."""

    noise_multiplier: float

    def __post_init__(self) -> None:
        positive("GaussianEvent", "noise_multiplier", self.noise_multiplier)


@dataclass(frozen=True)
class ApproximateDpEvent:
    """Any mechanism that is (``epsilon``, ``delta``)-DP (a learner's released output, say)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        nonnegative("ApproximateDpEvent", "epsilon", self.epsilon)
        if not 0.0 <= self.delta < 1.0:
            raise InvalidParameterError("ApproximateDpEvent", "delta", "a float in [0, 1)", self.delta)


Event = GaussianEvent | ApproximateDpEvent


class Accountant:
    """The adaptive composition of the events given to :meth:`compose` (module docstring)."""

    def __init__(self) -> None:
        self._events: list[tuple[Event, int]] = []
        self._inverse_square_sum = 0.0  # Σ count/σ² over Gaussian events: μ² of their composition
        self._epsilons: list[float] = []  # one entry per (ε, δ) use, repeated `count` times
        self._deltas: list[float] = []

    @classmethod
    def from_reports(cls, reports: Iterable[PrivacyReport]) -> Accountant:
        """An accountant holding the output guarantee of each report (e.g. a ledger's instances
        that all touched one record) as an :class:`ApproximateDpEvent`."""
        accountant = cls()
        for report in reports:
            accountant.compose(ApproximateDpEvent(report.output.epsilon, report.output.delta))
        return accountant

    @property
    def events(self) -> tuple[tuple[Event, int], ...]:
        """The events composed so far, each with its count."""
        return tuple(self._events)

    def compose(self, event: Event, count: int = 1) -> Accountant:
        """Add ``count`` adaptive uses of ``event``; returns the accountant (for chaining)."""
        count = positive_int("Accountant.compose", "count", count)
        if isinstance(event, GaussianEvent):
            self._inverse_square_sum += count / event.noise_multiplier**2
        elif isinstance(event, ApproximateDpEvent):
            self._epsilons.extend([event.epsilon] * count)
            self._deltas.extend([event.delta] * count)
        else:
            raise InvalidParameterError("Accountant.compose", "event", "a GaussianEvent or an ApproximateDpEvent", event)
        self._events.append((event, count))
        return self

    def get_epsilon(self, delta: float) -> float:
        """The smallest ε this accountant proves at ``delta`` (``inf`` if none: e.g. the (ε, δ)
        events alone already spend more than ``delta``)."""
        delta = open_unit("Accountant.get_epsilon", "delta", delta)
        spare = delta - math.fsum(self._deltas)
        if spare <= 0.0:
            return 0.0 if not self._epsilons and self._inverse_square_sum == 0.0 else math.inf
        if self._inverse_square_sum == 0.0:
            return self._approximate_epsilon(spare)
        if not self._epsilons:
            return self._gaussian_epsilon(spare)
        fractions = (i / SPLIT_POINTS for i in range(1, SPLIT_POINTS))
        best = self._gaussian_epsilon(spare) + math.fsum(self._epsilons)
        for f in fractions:
            best = min(best, self._gaussian_epsilon(f * spare) + self._approximate_epsilon((1.0 - f) * spare))
        return best

    def get_delta(self, epsilon: float) -> float:
        """The smallest δ this accountant proves at ``epsilon`` (at most 1)."""
        epsilon = nonnegative("Accountant.get_delta", "epsilon", epsilon)
        if self._inverse_square_sum == 0.0:
            return min(1.0, self._approximate_delta(epsilon))
        if not self._epsilons:
            return self._gaussian_delta(epsilon)
        best = min(
            1.0,
            *(self._gaussian_delta(epsilon * i / SPLIT_POINTS) + self._approximate_delta(epsilon * (1 - i / SPLIT_POINTS))
              for i in range(SPLIT_POINTS + 1)),
        )
        basic = math.fsum(self._epsilons)
        if basic <= epsilon:  # the (ε, δ) part at basic composition exactly, the rest to the Gaussian part
            best = min(best, self._gaussian_delta(epsilon - basic) + math.fsum(self._deltas))
        return best

    def to_dp_events(self) -> Any:
        """The composition as a ``dp_accounting.dp_event.ComposedDpEvent`` (requires the optional
        ``dp-accounting`` package); (ε, δ) events become ``UnsupportedDpEvent``."""
        try:
            from dp_accounting import dp_event
        except ImportError:
            raise ImportError("Accountant.to_dp_events needs the optional package dp-accounting (pip install dp-accounting)") from None
        parts = []
        for event, count in self._events:
            single = (
                dp_event.GaussianDpEvent(event.noise_multiplier)
                if isinstance(event, GaussianEvent)
                else dp_event.UnsupportedDpEvent()
            )
            parts.append(single if count == 1 else dp_event.SelfComposedDpEvent(single, count))
        return dp_event.ComposedDpEvent(parts)

    # -- the two parts ---------------------------------------------------------------------------

    def _gaussian_multiplier(self) -> float:
        return 1.0 / math.sqrt(self._inverse_square_sum)

    def _gaussian_epsilon(self, delta: float) -> float:
        return analytic_epsilon(self._gaussian_multiplier(), delta) if delta < 1.0 else 0.0

    def _gaussian_delta(self, epsilon: float) -> float:
        return analytic_delta(epsilon, self._gaussian_multiplier())

    def _approximate_epsilon(self, slack: float) -> float:
        """ε of the (ε, δ) events at total δ = Σδⱼ + ``slack`` (slack > 0): basic or advanced."""
        basic = math.fsum(self._epsilons)
        if not self._epsilons or slack >= 1.0:
            return basic
        advanced, _ = heterogeneous(self._epsilons, [0.0] * len(self._epsilons), slack)
        return min(basic, advanced)

    def _approximate_delta(self, epsilon: float) -> float:
        """δ of the (ε, δ) events at ``epsilon``: Σδⱼ if basic composition reaches it, else
        Σδⱼ + γ with γ the advanced-composition slack that brings its ε down to ``epsilon``."""
        spent = math.fsum(self._deltas)
        if epsilon >= math.fsum(self._epsilons):
            return spent
        drift = math.fsum(e * math.expm1(e) for e in self._epsilons)
        spread = math.fsum(e * e for e in self._epsilons)
        if epsilon <= drift:
            return 1.0
        # Cheu et al. 2022, Lemma 3.3 solved for γ: ε = drift + √(2 ln(1/γ) · spread).
        slack = math.exp(-((epsilon - drift) ** 2) / (2.0 * spread))
        return spent + slack
