"""Projected SGD with public step sizes and iterate averaging, for learners fed noisy gradients.

The shuffle-model and check-in learners update a model with noisy gradient estimates ĝ_t whose
second moments are bounded by *public* numbers G_t² (clip, noise level, number of messages
averaged). :class:`AveragedSGD` runs

    η_t = D / √(Σ_{s≤t} G_s²),      θ_{t+1} = Π_Θ(θ_t − η_t ĝ_t),

and releases the uniform average θ̄_T of θ_1, …, θ_T (the points where gradients were taken).

Why these steps. Online projected gradient descent with non-increasing steps has regret
Σ_t ⟨ĝ_t, θ_t − θ*⟩ ≤ D²/(2η_T) + Σ_t η_t ‖ĝ_t‖²/2 over Θ of diameter D (Zinkevich 2003;
Orabona, "A modern introduction to online learning", Thm 2.13). Taking expectations with
E‖ĝ_t‖² ≤ G_t² and Σ_t G_t²/√(Σ_{s≤t} G_s²) ≤ 2√(Σ_t G_t²) gives regret ≤ (3/2) D √(Σ_t G_t²); when
each ĝ_t is unbiased for ∇F(θ_t) given the past, online-to-batch conversion gives
E F(θ̄_T) − min F ≤ (3/2) D √(Σ_t G_t²)/T. With a constant G this is the anytime (3/2) D G/√T,
the rate of Cheu et al. 2022 Lemma 4.2 without knowing T in advance. The steps depend on public quantities only,
so they add nothing to the privacy analysis.

References
----------
Cheu et al. 2022, Lemma 4.2 (projected SGD with noisy gradients); Zinkevich (2003); Orabona (2019), Thm 2.13.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import validation as check
from panpriv.protocols.base import Learner, StateValue
from panpriv.protocols.geometry import L2Ball
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomness import NoiseSource, RngLike
from panpriv.protocols.state_io import read_array, read_float

Array = NDArray[np.float64]


@dataclass
class AveragedSGD:
    """The iterate θ_t, the running average θ̄ of the iterates stepped from, and two public sums.

    Attributes
    ----------
    theta
        θ_t, the point where the next gradient is taken.
    average
        Mean of the iterates θ_1, …, θ_T at which the T steps so far were taken (zeros if T = 0).
    weight
        T, the number of steps taken (a float: it may be a random count in check-in protocols).
    moment
        Σ_{s≤T} G_s², the public bound on the gradients' second moments so far.
    """

    theta: Array
    average: Array
    weight: float
    moment: float

    @classmethod
    def start(cls, dim: int) -> AveragedSGD:
        """θ_1 = 0 (the centre of Θ), nothing averaged yet."""
        return cls(np.zeros(dim), np.zeros(dim), 0.0, 0.0)

    def step(self, gradient: Array, bound_sq: float, ball: L2Ball) -> AveragedSGD:
        """One step with the noisy gradient ĝ_t and its public bound G_t² ≥ E‖ĝ_t‖² (> 0)."""
        moment = self.moment + bound_sq
        eta = ball.diameter / math.sqrt(moment)
        weight = self.weight + 1.0
        average = self.average + (self.theta - self.average) / weight
        return AveragedSGD(ball.project(self.theta - eta * gradient), average, weight, moment)

    def step_in_place(self, gradient: Array, bound_sq: float, ball: L2Ball, work: Array) -> AveragedSGD:
        """:meth:`step` with ``theta`` and ``average`` updated in place (``work``: a spare array of
        their shape, left holding η_t·ĝ_t): bitwise the same arithmetic — θ̄ + (θ − θ̄)/T and
        Π(θ − η·ĝ) as the same elementwise operations in the same order, the projection by
        :meth:`L2Ball.project_in_place` — without allocating, for learners that step every few
        dozen records. The state stepped is this one, updated and returned (not frozen for that:
        building a frozen dataclass per step cost ~0.7 µs, 2–3 % of a shuffle-gaussian round)."""
        moment = self.moment + bound_sq
        eta = ball.diameter / math.sqrt(moment)
        weight = self.weight + 1.0
        theta, average = self.theta, self.average
        np.subtract(theta, average, work)  # out positionally: the keyword costs a parse per call
        work /= weight
        np.add(average, work, average)
        np.multiply(gradient, eta, work)
        np.subtract(theta, work, theta)
        ball.project_in_place(theta)
        self.weight, self.moment = weight, moment
        return self

    def state(self) -> dict[str, StateValue]:
        """State-dict entries (``theta``, ``average``: noisy iterates; ``weight``, ``moment``: public)."""
        return {"theta": self.theta.copy(), "average": self.average.copy(), "weight": self.weight, "moment": self.moment}

    @classmethod
    def from_state(cls, owner: str, state: Mapping[str, StateValue], dim: int) -> AveragedSGD:
        """Inverse of :meth:`state`, checking each entry."""
        return cls(
            read_array(owner, state, "theta", (dim,)),
            read_array(owner, state, "average", (dim,)),
            read_float(owner, state, "weight"),
            read_float(owner, state, "moment"),
        )

    def release(self) -> Array:
        """θ̄_T, or θ_1 before the first step."""
        return (self.average if self.weight > 0.0 else self.theta).copy()


def bound_sq(clip: float, noise_second_moment: float, messages: float, ridge_norm: float) -> float:
    """G² for the mean of ``messages`` unbiased messages plus the exact ridge gradient.

    Each message is a clipped gradient (norm ≤ C) plus independent zero-mean noise with
    E‖noise‖² ≤ v; the mean of k of them has E‖·‖² ≤ C² + v/k, and adding the deterministic ridge
    gradient (norm ≤ λr) gives E‖ĝ‖² ≤ (√(C² + v/k) + λr)².
    """
    return (math.sqrt(clip**2 + noise_second_moment / messages) + ridge_norm) ** 2


class MessageSGDLearner(Learner):
    """Shared parts of the learners that step on means of users' local-randomizer messages.

    Subclass constructors call :meth:`_setup` first, then set ``_noise_moment`` (v of their
    randomizer, :meth:`panpriv.protocols.randomizers.LocalRandomizer.noise_second_moment`).
    """

    dim: int
    loss: Loss
    epsilon: float
    delta: float
    feature_bound: float
    radius: float
    clip: float | None
    _clip: float
    _params: int
    _noise_moment: float
    _noise: NoiseSource
    _ball: L2Ball
    _sgd: AveragedSGD
    _records: int

    def _setup(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str,
        epsilon: float,
        delta: float,
        clip: float | None,
        radius: float | None,
        feature_bound: float,
        rng: RngLike,
    ) -> None:
        """Validate and store the common arguments; start at θ₁ = 0 with no record seen.

        ``clip=None`` means C = L, the loss's Lipschitz constant over Θ (clipping is then a no-op
        up to rounding; it still makes the sensitivity hold by construction).
        """
        owner = type(self).__name__
        self._setup_common(owner, dim, loss, radius, feature_bound, rng)
        self.epsilon = check.positive(owner, "epsilon", epsilon)
        self.delta = check.open_unit(owner, "delta", delta)
        declared = None if clip is None else check.positive(owner, "clip", clip)
        self.clip = declared
        self._clip = self.loss.lipschitz(self.feature_bound, self.radius) if declared is None else declared
        self._sgd = AveragedSGD.start(self._params)
        self._bounds: dict[float, float] = {}

    def _step(self, mean_message: Array, count: float, work: Array | None = None) -> None:
        """One SGD step on the mean of ``count`` messages plus the exact ridge gradient, with
        G² from :func:`bound_sq`; in place (:meth:`AveragedSGD.step_in_place`, the same
        arithmetic) when given a spare parameter-sized ``work`` array. G² is memoised per count:
        the clip, the noise moment, the ridge and the radius are fixed once the learner is built,
        and the rounds of a learner mostly average the same number of messages."""
        bound = self._bounds.get(count)
        if bound is None:
            bound = self._bounds[count] = bound_sq(self._clip, self._noise_moment, count, self.loss.ridge * self.radius)
        if self.loss.ridge:
            mean_message = mean_message + self.loss.ridge_gradient(self._sgd.theta)
        if work is None:
            self._sgd = self._sgd.step(mean_message, bound, self._ball)
        else:
            self._sgd = self._sgd.step_in_place(mean_message, bound, self._ball, work)

    def release(self) -> Array:
        """θ̄, the average of the iterates stepped from (:class:`AveragedSGD`)."""
        return self._sgd.release()

    @abc.abstractmethod
    def messages_per_step(self) -> tuple[float, str]:
        """k, the (expected) number of messages averaged into one step, from the public
        configuration, and how it follows from it (for :meth:`utility_warnings`)."""

    def noise_to_signal(self) -> float:
        """ρ = √(v/k)/C: the rms norm of the noise in one step's mean message over the largest clipped
        gradient C, with v = E‖noise of one message‖² (the randomizer's ``noise_second_moment``) and
        k = :meth:`messages_per_step`. It is the ratio in :func:`bound_sq`: G² = C²(1 + ρ²) without
        ridge. The gradients themselves are often shorter than C, so the noise dominates them at
        least this much. Computed from the plan only, never from records."""
        messages, _ = self.messages_per_step()
        return math.sqrt(self._noise_moment / messages) / self._clip

    @abc.abstractmethod
    def _noise_formula(self) -> str:
        """ρ written in the learner's own calibration (e.g. σ·√(p/k)), for :meth:`utility_warnings`."""

    def utility_warnings(self) -> tuple[str, ...]:
        """A warning when the noise dominates each step's gradient, ρ = :meth:`noise_to_signal` > 1.

        The consequence, from the guarantee of :class:`AveragedSGD` (Cheu et al. 2022, Lemma 4.2):
        E F(θ̄_T) − min F ≤ (3/2)·D·G/√T with G² = C²(1 + ρ²), i.e. the guarantee of noise-free SGD
        with 1/(1 + ρ²) of the steps — the stream must be (1 + ρ²) times longer for the same excess
        loss. Data-independent: ρ comes from the calibrated noise, the clip and the plan.

        ρ > 1 says each step is noise-dominated, not that the run fails: averaging over T steps can
        still beat θ = 0 (``benchmarks/noise_map.py`` measures where; docs/privacy.md)."""
        rho = self.noise_to_signal()
        if rho <= 1.0:
            return ()
        messages, origin = self.messages_per_step()
        return (
            f"{self.name}: the noise in each step's mean gradient is rho = {self._noise_formula()} = {rho:.3g} x the "
            f"largest clipped gradient C = {self._clip:.3g} (k = {messages:.4g}: {origin}), so each step is mostly "
            "noise. SGD's guarantee (3/2) D G / sqrt(T), G^2 = C^2 (1 + rho^2), is then that of noise-free SGD on "
            f"1/(1 + rho^2) = {1.0 / (1.0 + rho * rho):.3g} of the records: it needs {1.0 + rho * rho:.3g} x as many "
            "for the same excess loss, and a short stream or a large radius may end no better than theta = 0 "
            "(docs/privacy.md maps where this learner is useful). A larger epsilon or more messages per step lower rho.",
        )

    @property
    def records_seen(self) -> int:
        return self._records

    def _report(
        self, output: Guarantee, intrusion: Guarantee, assumptions: Sequence[str], references: Sequence[str]
    ) -> PrivacyReport:
        """The report with the pan-private view every such learner has: an intrusion may read one
        user's message, so ``intrusion`` is the local guarantee of one message — and nothing in the
        seeded replay/testing mode, where future noise is predictable."""
        return super()._report(output, intrusion, assumptions, [*references, "Cheu et al. 2022, Def. C.2"])
