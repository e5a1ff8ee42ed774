"""ShuffleGD: fully interactive shuffle-private gradient descent over a recorded stream (Cheu et al. 2022, Alg. 5).

Protocol (Cheu et al. 2022, Alg. 5; Lemma B.6, Thm 4.9). n users (the records of a recording, n public) are
queried in each of T rounds: in round t every user computes ∇ℓ(θ_t; x), clipped to norm L (of the
β_s-Moreau envelope for a non-smooth loss, Thm 4.9), and reports it through PVEC
(:class:`panpriv.protocols.encoder.VectorSum` with n users) at the per-round budget of Lemma B.6,

    ε₀ = ε / (2·√(2T·log(1/δ))),      δ₀ = δ / (T + 1);

the analyzer's sum estimate divided by n, plus the exact ridge gradient, drives a projected
gradient step (:class:`panpriv.protocols.sgd.AveragedSGD`), and the output is the average of the iterates.

Streaming form. The algorithm needs every record in every round, so it runs on a *recording*
replayed T times: pass t of the recording is round t. ``learn_many`` takes the records in passes of
exactly n records (a pass may be split into any micro-batches; a round may straddle calls);
:meth:`ShuffleGD.learn_recorded` drives all remaining passes from a fetch function. After T·n
records the protocol is complete and further records are refused. The recording itself holds raw
records at rest: it is outside this learner and outside its guarantee.

Privacy against the analyzer (Cheu et al. 2022, proof of Lemma B.6). Each round is (ε₀, δ₀)-shuffle private
(Cheu et al. 2022, Thm 3.2, or the tight accountant of the same protocol), and a record takes part in every
round: T-fold adaptive composition. The report gives, after t rounds started, the better of basic
composition (tε₀, tδ₀) and advanced composition (Dwork–Rothblum–Vadhan; Dwork & Roth 2014,
Thm 3.20) with slack δ′ = δ/(T + 1): ε₀√(2t log(1/δ′)) + tε₀(e^{ε₀} − 1), tδ₀ + δ′
(:func:`panpriv.accounting.composition.advanced`). At t = T this is (ε, δ) as Lemma B.6 claims — or less:
the constructor refuses a configuration whose T-round bound would exceed the requested ε.

The ledger, and the T-fold reuse (composition counted once, in one place)
---------------------------------------------------------------------------
The service charges consumed positions to ledger instances, and the ledger composes repeated uses
of a position by *basic* composition of the instances' registered guarantees. Charging T passes of
the recording to one instance registered with this learner's (cumulative) report would therefore
count the composition twice: T uses × the T-round guarantee. Instead each pass is its own ledger
instance (the service's replay driver, ``panpriv.streamer.runtime.recorded_driver``: ``<instance>/round-000001``, …),
registered with the round's *increment* of the composed guarantee (:meth:`ShuffleGD.round_reports`).
The ledger then shows each position used T times (one use per round), and its basic composition
of the increments telescopes back to exactly this learner's advanced-composition figure
(increments are rounded up by a relative :data:`ROUND_MARGIN`, so floating-point summation can only
over-state it). The composition itself is computed once, here, by :mod:`panpriv.accounting.composition`.

Pan-private view. The state holds θ_t, the running average and the one-bit totals of the round in
progress. One intrusion plus all outputs is a post-processing of the analyzer outputs of all rounds
and of at most one message of the user (in the round in progress; that round's output is a
function of her message and others'), so it is bounded by the output guarantee composed (basic)
with the local guarantee of one per-round PVEC message (:func:`panpriv.protocols.shuffle_base.message_guarantee`).

References
----------
Cheu, Joseph, Mao & Peng (2022): Alg. 5, Lemma B.6, Thm 4.9 (T, β), Lemma 4.6, Alg. 2 / Thm 3.2,
Def. C.2, App. B.3. Dwork & Roth (2014), Thm 3.20 (advanced composition).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.composition import advanced
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import validation as check
from panpriv.protocols.acsa import Smoothing, uses_moreau
from panpriv.protocols.base import StateValue
from panpriv.protocols.encoder import VectorSum
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomness import RngLike
from panpriv.protocols.recorded import Fetch, RecordedLearner
from panpriv.protocols.sgd import AveragedSGD, bound_sq
from panpriv.protocols.shuffle_base import Calibration, EncodedLearner, pvec_noise_lines, read_round

Array = NDArray[np.float64]

Budget = Literal["lemma-b6", "solved"]
BUDGETS: tuple[Budget, ...] = ("lemma-b6", "solved")

ROUND_MARGIN = 1e-9
"""Relative amount by which each per-round ledger increment is rounded up (module docstring): the
ledger's floating-point sum of up to 10⁷ increments then never falls below the composed value."""

_OWNER = "ShuffleGD"


def theorem_rounds(n: int, d: int, epsilon: float, delta: float) -> int:
    """T = min{n, ε²n²/(d log²(nd/δ))} (Cheu et al. 2022, Lemma B.6 / Thm 4.9), rounded down, at least 1."""
    return max(1, min(n, math.floor(epsilon**2 * n**2 / (d * math.log(n * d / delta) ** 2))))


DEFAULT_ROUND_CAP = 20
"""The most rounds the default plan takes. Thm 4.9's T = min{n, ε²n²/(d log²(nd/δ))} is a pass over
the recording per round and grows like n² (75,823 passes at n = 10⁵, d = 20, ε = 1): a plan that
never finishes, and whose per-round budget ε₀ ∝ ε/√T makes each message's noise ∝ √T. A public
compute bound, not a tuned constant; ``rounds`` overrides it."""


def default_rounds(n: int, d: int, epsilon: float, delta: float) -> int:
    """min(:func:`theorem_rounds`, :data:`DEFAULT_ROUND_CAP`)."""
    return min(theorem_rounds(n, d, epsilon, delta), DEFAULT_ROUND_CAP)


def round_budget(epsilon: float, delta: float, rounds: int) -> tuple[float, float]:
    """(ε₀, δ₀) = (ε/(2√(2T log(1/δ))), δ/(T + 1)): each round's PVEC budget (Cheu et al. 2022, Alg. 5 line 3,
    Lemma B.6)."""
    return epsilon / (2.0 * math.sqrt(2.0 * rounds * math.log(1.0 / delta))), delta / (rounds + 1)


def solved_round_epsilon(epsilon: float, delta: float, rounds: int) -> float:
    """The largest ε₀ (bisection, to ~1e-12 relative, feasible end) whose T-round composition
    :func:`composed` at δ₀ = δ/(T + 1), slack δ/(T + 1) is at most ε: the whole budget, where
    Lemma B.6's split leaves part of it unused (for small T, most of it)."""
    delta0 = slack = delta / (rounds + 1)
    low, high = 0.0, epsilon
    if composed(high, delta0, rounds, slack).epsilon <= epsilon:
        return high
    for _ in range(60):
        middle = 0.5 * (low + high)
        if composed(middle, delta0, rounds, slack).epsilon <= epsilon:
            low = middle
        else:
            high = middle
    return low


def theorem_smoothing(n: int, d: int, epsilon: float, delta: float, lipschitz: float, diameter: float) -> float:
    """β_s = (L/D)·min(√n, εn/(√d log^{3/2}(d/δ))): the Moreau parameter of Cheu et al. 2022, Thm 4.9's proof."""
    return lipschitz / diameter * min(math.sqrt(n), epsilon * n / (math.sqrt(d) * math.log(d / delta) ** 1.5))


def composed(epsilon0: float, delta0: float, rounds: int, slack: float) -> Guarantee:
    """The guarantee of ``rounds`` adaptively composed (ε₀, δ₀)-DP rounds: basic composition
    (Dwork & Roth 2014, Thm 3.16) or advanced composition with slack δ′ (Thm 3.20), whichever has
    the smaller ε (basic's δ is then smaller too). ``rounds = 0``: (0, 0)."""
    if rounds == 0:
        return Guarantee(0.0, 0.0)
    basic = Guarantee(rounds * epsilon0, min(1.0, rounds * delta0))
    boosted = Guarantee(*advanced(epsilon0, delta0, rounds, slack))
    return basic if basic.epsilon <= boosted.epsilon else boosted


class ShuffleGD(EncodedLearner, RecordedLearner):
    """Fully interactive shuffle-private gradient descent over n recorded users (Cheu et al. 2022, Alg. 5).

    Parameters
    ----------
    dim
        Number of raw features d.
    loss
        A :class:`panpriv.protocols.losses.Loss` or its config dict.
    epsilon, delta
        The guarantee after all T rounds, per record.
    n
        Number of records (users) in the recording; every round queries all of them.
    rounds
        T; ``None``: :func:`default_rounds`, Cheu et al. 2022 Thm 4.9's T capped at
        :data:`DEFAULT_ROUND_CAP` (each round is a whole pass over the recording).
    budget
        How (ε, δ) is split over the rounds: ``"lemma-b6"`` (default) the per-round
        (ε/(2√(2T log(1/δ))), δ/(T + 1)) of Cheu et al. 2022 Lemma B.6; ``"solved"`` the largest ε₀ whose
        composition is still (ε, δ) (:func:`solved_round_epsilon`), same δ₀.
    radius
        Radius r of Θ, the ℓ2 ball of parameters (D = 2r).
    feature_bound
        R: features are clipped to norm R.
    smoothing
        ``"auto"`` (Moreau-smooth non-smooth losses, β_s of Thm 4.9), ``"moreau"`` or ``"none"``.
    calibration
        ``"tight"`` (default) or ``"paper"`` (:class:`panpriv.protocols.encoder.VectorSum`).
    honest_fraction
        γ of Cheu et al. 2022, App. A.3, passed to PVEC.
    rng
        ``None`` (default): fresh OS entropy for every draw. A seed or generator: the labelled
        replay/testing mode (no pan-private guarantee).

    Notes
    -----
    Deviations from Cheu et al. 2022: Alg. 5 line 4 reads θ_{t+1} ← Π(θ_t + η g_t) (a sign typo for descent);
    Lemma B.6's constant step η = D/(L√T) is replaced by :class:`panpriv.protocols.sgd.AveragedSGD`'s steps
    η_t = D/√(t G²) with G² = (√(L² + p v/n²) + λr)² (v the per-round PVEC variance), which accounts
    for the privacy noise the constant step ignores; the reported guarantee is the better of basic
    and advanced composition at the rounds actually started. The strongly convex part of Thm 4.9
    (Feldman et al.'s reduction over disjoint groups) is not implemented: ridge losses run as
    convex ones.

    References
    ----------
    Cheu et al. 2022, Alg. 5, Lemma B.6, Thm 4.9, Thm 3.2, Def. C.2; Dwork & Roth (2014), Thms 3.16, 3.20.
    """

    name = "shuffle-gd"
    _owner = _OWNER
    reports_per_round = True

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 4.0, "delta": 1e-5, "n": 8, "rounds": 12, "radius": 20.0},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str,
        epsilon: float,
        delta: float,
        n: int,
        rounds: int | None = None,
        budget: Budget = "lemma-b6",
        radius: float = 1.0,
        feature_bound: float = 1.0,
        smoothing: Smoothing = "auto",
        calibration: Calibration = "tight",
        honest_fraction: float = 1.0,
        rng: RngLike = None,
    ) -> None:
        self._setup(dim, loss, epsilon, delta, radius, feature_bound, calibration, honest_fraction, rng)
        self.n = check.positive_int(_OWNER, "n", n)
        self.rounds = None if rounds is None else check.positive_int(_OWNER, "rounds", rounds)
        self.budget = check.choice(_OWNER, "budget", budget, BUDGETS)
        self.smoothing = smoothing
        moreau = uses_moreau(_OWNER, self.loss, smoothing)
        T = default_rounds(self.n, self._params, self.epsilon, self.delta) if self.rounds is None else self.rounds
        self.planned_rounds = T
        epsilon0, delta0 = round_budget(self.epsilon, self.delta, T)
        if self.budget == "solved":
            epsilon0 = solved_round_epsilon(self.epsilon, self.delta, T)
        self._sum = self._vector_sum(self.n, epsilon0, delta0)
        self._slack = self.delta / (T + 1)
        total = self._composed(T)
        if total.epsilon > self.epsilon or total.delta > self.delta:
            raise InvalidInputError(
                f"{_OWNER}: the per-round budget of Cheu et al. 2022 Lemma B.6, (ε₀, δ₀) = ({epsilon0:.6g}, {delta0:.3g}), "
                f"composes over T = {T} rounds to {total}, above the requested (ε = {self.epsilon:g}, "
                f"δ = {self.delta:g}); choose a smaller 'epsilon' (Lemma B.6 assumes ε ≲ 2 log(1/δ)) or "
                "another 'rounds'"
            )
        diameter = self._ball.diameter
        self.smoothing_parameter = (
            theorem_smoothing(self.n, self._params, self.epsilon, self.delta, self._lipschitz, diameter) if moreau else None
        )
        noise = self._params * self._sum.parameters.variance_bound / self.n  # p·v/n per message
        self.gradient_bound_sq = bound_sq(self._lipschitz, noise, self.n, self.loss.ridge * self.radius)
        self._sgd = AveragedSGD.start(self._params)

    def describe_noise(self) -> tuple[str, ...]:
        return pvec_noise_lines([self._sum])

    @property
    def vector_sum(self) -> VectorSum:
        """The PVEC instance of every round (n users at (ε₀, δ₀))."""
        return self._sum

    @property
    def passes(self) -> int:
        """T, the passes over the recording the protocol makes (``panpriv.streamer.runtime.recorded_driver``'s progress)."""
        return self.planned_rounds

    @property
    def rounds_started(self) -> int:
        """Rounds in which at least one record has reported (⌈records/n⌉)."""
        return -(-self._records // self.n)

    def _composed(self, rounds: int, extra_delta: float = 0.0) -> Guarantee:
        parameters = self._sum.parameters
        return composed(parameters.epsilon, parameters.delta + extra_delta, rounds, self._slack)

    # -- the analyzer's half in three roles (panpriv.streamer.esa.gd_analyzer) ----------------------------

    @property
    def slack(self) -> float:
        """δ′ = δ/(T + 1), the slack of the advanced composition (public)."""
        return self._slack

    def composed_guarantee(self, rounds: int, extra_delta: float = 0.0) -> Guarantee:
        """The guarantee of ``rounds`` adaptively composed rounds, each (ε₀, δ₀ + ``extra_delta``)-DP
        (``extra_delta``: what a deployment adds per round, e.g. the secure sum's (1 + e^ε₀)·τ)."""
        return self._composed(rounds, extra_delta)

    def message_guarantee(self) -> Guarantee:
        """The local guarantee of one user's per-round PVEC message (none when seeded)."""
        return self._message()

    @property
    def vector_sums(self) -> dict[int, VectorSum]:
        """{n: :attr:`vector_sum`}: every round has all n users."""
        return {self._sum.n: self._sum}

    def query_point(self) -> Array:
        """θ_t, where every user takes her gradient in round t (Cheu et al. 2022, Alg. 5 line 3)."""
        return self._sgd.theta.copy()

    def round_smoothing(self) -> float | None:
        """β_s of the Moreau envelope whose gradients the users report (``None``: the loss's own)."""
        return self.smoothing_parameter

    @property
    def finished(self) -> bool:
        """True once the T rounds are learned."""
        return self._records >= self.n * self.planned_rounds

    @property
    def gradient_norm_bound(self) -> float:
        """L: the norm each user's gradient is clipped to before PVEC."""
        return self._lipschitz

    # -- rounds ----------------------------------------------------------------------------------

    def _check_room(self, count: int) -> None:
        if self._records + count > self.n * self.planned_rounds:
            raise InvalidInputError(
                f"{_OWNER}: the protocol has T = {self.planned_rounds} passes of n = {self.n} records; "
                f"{self._records} records done, {count} more given"
            )

    def _round_sum(self) -> VectorSum:
        return self._sum

    def _query(self) -> tuple[Array, float | None]:
        return self._sgd.theta, self.smoothing_parameter

    def _finish_round(self, mean: Array) -> None:
        gradient = mean + self.loss.ridge_gradient(self._sgd.theta)
        self._sgd = self._sgd.step(gradient, self.gradient_bound_sq, self._ball)

    def learn_recorded(self, fetch: Fetch, micro_batch: int = 4096) -> None:
        """Run the remaining passes: ``fetch(indices)`` returns ``(X, y)`` for those recording
        indices (0 … n − 1), in that order. Holds at most ``micro_batch`` raw records at a time."""
        micro_batch = check.positive_int(_OWNER, "micro_batch", micro_batch)
        while self._records < self.n * self.planned_rounds:
            start = self._records % self.n
            indices = np.arange(start, min(self.n, start + micro_batch), dtype=np.int64)
            X, y = fetch(indices)
            self.learn_many(X, y)

    # -- outputs -----------------------------------------------------------------------------------

    def release(self) -> Array:
        """θ̄, the average of the iterates of the completed rounds (Cheu et al. 2022 Alg. 5 line 6)."""
        return self._sgd.release()

    def _message(self) -> Guarantee:
        """Local guarantee of one user's per-round PVEC message (at δ); none when seeded."""
        return self._local(self._sum, self._sum.parameters.epsilon)

    def privacy(self) -> PrivacyReport:
        """Output: the composition over the rounds started (module docstring). Intrusion: that
        composed (basic) with the local guarantee of one per-round message."""
        t = self.rounds_started
        output = self._composed(t)
        intrusion = output.compose(self._message()) if t else output
        parameters = self._sum.parameters
        split = "Cheu et al. 2022 Lemma B.6's split" if self.budget == "lemma-b6" else "the largest ε₀ that composes to ε"
        assumptions = [
            f"every record takes part in each of the T = {self.planned_rounds} rounds (one pass of the "
            f"recording of n = {self.n} records per round); {t} rounds started so far",
            f"each round is one PVEC release at (ε₀, δ₀) = ({parameters.epsilon:.6g}, {parameters.delta:.3g}) "
            f"({split}); the rounds compose adaptively: the better of basic and advanced composition "
            f"with slack δ/(T + 1) = {self._slack:.3g}",
            "this figure already counts every round: a ledger must charge each pass as its own instance "
            "with the increment from round_reports(), not compose this report again",
            "pan-privacy: the state holds the model and the one-bit totals of the round in progress; an "
            "intrusion adds at most one per-round message of a user (local guarantee "
            f"{self._message()}), composed with the outputs; the recording replayed for the passes "
            "holds raw records and is outside this guarantee",
        ]
        references = ["Cheu et al. 2022, Alg. 5", "Cheu et al. 2022, Lemma B.6", "Cheu et al. 2022, Thm 4.9", "Dwork & Roth 2014, Thm 3.20"]
        return self._report(output, intrusion, assumptions, references)

    def planned_privacy(self) -> PrivacyReport:
        """The guarantee once all T planned rounds have started (:meth:`privacy` counts the rounds
        started so far)."""
        output = self._composed(self.planned_rounds)
        return self._planned(output, output.compose(self._message()))

    def round_reports(self) -> tuple[PrivacyReport, ...]:
        """One report per round started: the round's increment of the composed guarantee.

        Output increment of round t: out(t) − out(t − 1), rounded up by :data:`ROUND_MARGIN`
        (both ε and δ; out is non-decreasing in t). Intrusion increment: the output increment plus,
        in every round, the local message guarantee — the ledger takes, for a record used by
        rounds 1…T, max_j [intrusion_j + Σ_{i≠j} output_i], which is then out(T) ⊕ local, this
        learner's intrusion figure. See the module docstring for how the service uses them
        (``panpriv.streamer.runtime.recorded_driver``).
        """
        reports = []
        message = self._message()
        for t in range(1, self.rounds_started + 1):
            before, after = self._composed(t - 1), self._composed(t)
            increment = Guarantee(
                (after.epsilon - before.epsilon) * (1.0 + ROUND_MARGIN),
                min(1.0, (after.delta - before.delta) * (1.0 + ROUND_MARGIN)),
            )
            reports.append(
                PrivacyReport(
                    mechanism=self.name,
                    records=self.n,
                    output=increment,
                    intrusion=increment.compose(message),
                    assumptions=(f"round {t} of {self.planned_rounds}: the increment of the composed guarantee",),
                    references=("Cheu et al. 2022, Lemma B.6", "Dwork & Roth 2014, Thm 3.20"),
                )
            )
        return tuple(reports)

    # -- persistence ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """The round in progress (``filled``, noisy ``totals``) and the GD iterates (noisy)."""
        return {**self._round_state(), **self._sgd.state()}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        records, filled, totals = read_round(_OWNER, state, self._params)
        if records > self.n * self.planned_rounds or filled != records % self.n:
            raise InvalidInputError(
                f"{_OWNER}.load_state_dict: records = {records}, filled = {filled} do not fit T = "
                f"{self.planned_rounds} passes of n = {self.n}; was the state saved under another config?"
            )
        sgd = AveragedSGD.from_state(_OWNER, state, self._params)
        self._records, self._filled, self._totals, self._sgd = records, filled, totals, sgd
