"""ShuffleACSA: sequentially interactive shuffle-private AC-SA (Cheu et al. 2022, Alg. 4; Thms 4.3, 4.7, 4.8).

Protocol (Cheu et al. 2022, Alg. 4). A stream of n records (the ``horizon``, public) is cut into consecutive
batches; each record is one user in exactly one batch (Cheu et al. 2022, Def. 2.7). For batch t the users compute
∇ℓ(θ^md_t; x), clipped to norm L, and report it through PVEC (:class:`panpriv.protocols.encoder.VectorSum`
with n = b_t users, (ε, δ), Δ₂ = L); the analyzer's sum estimate divided by b_t, plus the exact
ridge gradient, is the AC-SA oracle answer g_t, and the shared AC-SA core
(:func:`panpriv.protocols.acsa.step`: Lan's updates) produces θ_{t+1}, θ^ag_{t+1} and the next middle
point. The released model is θ^ag.

Cases (parameters from :func:`panpriv.protocols.acsa.plan_runs`, the same planner PanPrivateACSA uses, fed
with this learner's noise level):

- β-smooth loss → one AC-SA run, batch size from the proof of Thm 4.3 (with its constants kept);
- non-smooth loss → Moreau smoothing (Cheu et al. 2022, Def. 4.5, Lemma 4.6, Thm 4.7): the oracle reports
  gradients of each record's β_s-Moreau envelope (:func:`panpriv.protocols.acsa.record_gradients`), β_s
  from the proof of Thm 4.7;
- λ-strongly convex (ridge or declared ``strong_convexity``) → the phases of Thm 4.8: k = O(log log n)
  disjoint runs of about n/k records, each warm-started from the previous output, smoothed or not.

Noise level. Privacy noise enters the plans through the noise multiplier ν of the batch mean:
the PVEC estimate's per-coordinate variance v (≈ independent of b) gives E‖Z‖² = p v/b² on the
mean, i.e. ν = √v/L (:class:`panpriv.protocols.acsa.Problem`); the oracle variance is σ² = L²/b + p v/b²,
Cheu et al. 2022 Eq. (5). v is :func:`panpriv.protocols.shuffle_base.sum_variance_hint` (planning only); the noise
actually added is the calibrated PVEC's, one instance per distinct batch size (a run's batches
have ⌊n/T⌋ or ⌊n/T⌋ + 1 users so that every record is used).

Options shared with ``pan-acsa`` (issue 17, item 2), each utility only: ``gradient_bound`` C clips
the per-record gradients to min(C, L) — PVEC is then calibrated to that smaller norm — and
``restart="gradient"`` (default) restarts AC-SA when the noisy round gradient shows the momentum
overshooting (:func:`panpriv.protocols.acsa.step`, O'Donoghue & Candès 2015: post-processing of the
analyzer's outputs), planned with :data:`panpriv.protocols.acsa.RESTART_TUNING`; ``restart="none"`` is
Lan's method with Cheu et al.'s parameters, for which their utility theorems are proven.

Privacy (Cheu et al. 2022, proofs of Thms 4.3, 4.7, 4.8): each round is (ε, δ)-shuffle private for its users, a
record is in one round, the rest is post-processing; smoothing changes only which function of the
record is encoded (still clipped to L). So everything released is (ε, δ)-DP per record. The
pan-private view is the local guarantee of one PVEC message (:mod:`panpriv.protocols.shuffle_base`).

References
----------
Cheu, Joseph, Mao & Peng (2022): Alg. 4, Lemma 4.4 (Lan 2012, Thm 2), Thm 4.3 and its proof
(Eq. (5)), Def. 4.5, Lemma 4.6, Thm 4.7, Thm 4.8, Alg. 2 / Thm 3.2, Def. 2.7, Def. C.2.
G. Lan (2012), Math. Program. 133:365–397 (AC-SA).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import validation as check
from panpriv.protocols.acsa import (
    BATCH_RULES,
    DEFAULT_TUNING,
    RESTART_TUNING,
    RESTARTS,
    BatchRule,
    Iterate,
    Problem,
    Restart,
    RunPlan,
    Smoothing,
    Tuning,
    batch_rule_line,
    effective_gradient_bound,
    plan_runs,
    step,
    uses_moreau,
)
from panpriv.protocols.base import StateValue
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.encoder import VectorSum
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomness import RngLike
from panpriv.protocols.shuffle_base import Calibration, SequentialLearner, max_guarantee, pvec_noise_lines, read_round
from panpriv.protocols.state_io import read_array, read_int

Array = NDArray[np.float64]

_OWNER = "ShuffleACSA"


class ShuffleACSA(SequentialLearner):
    """Shuffle-private accelerated stochastic approximation (Cheu et al. 2022, Alg. 4; Thms 4.3, 4.7, 4.8).

    Parameters
    ----------
    dim
        Number of raw features d.
    loss
        A :class:`panpriv.protocols.losses.Loss`, its name or its config dict; a name (``"logistic"``) or a config dict
        without ``intercept`` learns an intercept (:func:`panpriv.protocols.losses.learner_loss`: the model ``panpriv run``
        learns from the same settings). Default: ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon, delta
        The (ε, δ) of every round, hence of everything released, per record.
        Defaults: ε = 1, δ = 1e-6 (:mod:`panpriv.protocols.defaults`, the service's too).
    horizon
        n, the number of records (users) of the protocol (public). Cheu et al. 2022 Alg. 4 fixes the number of
        rounds in advance; records beyond n are refused.
    batch_size
        Override of the planned batch size b; ``None`` plans it (Cheu et al. 2022, proof of Thm 4.3).
    radius
        Radius r of Θ, the ℓ2 ball of parameters (D = 2r); ``None`` (default): r = √d, never below 1
        (:func:`panpriv.protocols.base.default_radius`, a rule that looks at no data).
    feature_bound
        R: features are clipped to norm R.
    strong_convexity
        λ ≥ 0 of the unregularised population loss, if known; the loss's ridge adds to it.
        λ > 0 selects the phases of Cheu et al. 2022, Thm 4.8.
    smoothing
        ``"auto"`` (Moreau-smooth non-smooth losses only), ``"moreau"`` or ``"none"``.
    calibration
        ``"tight"`` (default) or ``"paper"`` (:class:`panpriv.protocols.encoder.VectorSum`).
    honest_fraction
        γ of Cheu et al. 2022, App. A.3 (robust shuffle privacy), passed to the PVEC instances.
    batch_rule
        ``"worst-case"`` (default) or ``"glm"``: the noise term's dimension in the batch rule
        (:func:`panpriv.protocols.acsa.noise_dimension`); utility only.
    gradient_bound
        C: per-record gradients are clipped to norm min(C, L), L the loss's worst-case bound over Θ;
        ``None`` (default): L. PVEC's sensitivity is then the smaller norm (utility only; the
        learner optimises a convex C-Lipschitz surrogate, :func:`panpriv.protocols.acsa.effective_gradient_bound`).
    restart
        ``"gradient"`` (default): gradient restarts planned with :data:`panpriv.protocols.acsa.RESTART_TUNING`
        (post-processing); ``"none"``: Lan's method with Cheu et al.'s parameters.
    rng
        ``None`` (default): fresh OS entropy for every draw. A seed or generator: the labelled
        replay/testing mode (no pan-private guarantee).

    Notes
    -----
    Deviations from Cheu et al. 2022, each where implemented in :mod:`panpriv.protocols.acsa`: α_t = 2/(t+1) and Lan's
    step sizes (the seed's Lemma 4.4 constants are garbled), batches of ⌊n/T⌋ or ⌊n/T⌋ + 1 users
    (Alg. 4 drops the n mod b leftover records), the Moreau envelope over R^p instead of Θ, and the
    constants the O(·) of Thms 4.3/4.7/4.8 leave open (:class:`panpriv.protocols.acsa.Tuning`).

    References
    ----------
    Cheu et al. 2022, Alg. 4, Lemma 4.4, Thms 4.3, 4.7, 4.8, Thm 3.2, Def. 2.7, Def. C.2; Lan (2012).
    """

    name = "shuffle-acsa"
    _owner = _OWNER
    # "step": reset by restarts, which read the noisy round gradients.
    noisy_counters = frozenset({"step"})

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "horizon": 80, "batch_size": 5, "radius": 20.0},
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "horizon": 80, "batch_size": 5, "radius": 20.0,
             "restart": "none", "gradient_bound": 0.5},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        delta: float = DEFAULT_DELTA,
        *,
        horizon: int,
        batch_size: int | None = None,
        radius: float | None = None,
        feature_bound: float = 1.0,
        strong_convexity: float = 0.0,
        smoothing: Smoothing = "auto",
        calibration: Calibration = "tight",
        honest_fraction: float = 1.0,
        batch_rule: BatchRule = "worst-case",
        gradient_bound: float | None = None,
        restart: Restart = "gradient",
        rng: RngLike = None,
    ) -> None:
        self._setup(dim, loss, epsilon, delta, radius, feature_bound, calibration, honest_fraction, rng)
        self.batch_rule = check.choice(_OWNER, "batch_rule", batch_rule, BATCH_RULES)
        self.gradient_bound = None if gradient_bound is None else check.positive(_OWNER, "gradient_bound", gradient_bound)
        self.restart = check.choice(_OWNER, "restart", restart, RESTARTS)
        self._lipschitz = effective_gradient_bound(self.loss, self.feature_bound, self.radius, self.gradient_bound)
        self.horizon = check.positive_int(_OWNER, "horizon", horizon)
        self.batch_size = None if batch_size is None else check.positive_int(_OWNER, "batch_size", batch_size)
        self.strong_convexity = check.nonnegative(_OWNER, "strong_convexity", strong_convexity)
        self.smoothing = smoothing
        moreau = uses_moreau(_OWNER, self.loss, smoothing)
        variance = self._variance_hint(self.epsilon, self.delta)
        self._problem = Problem.for_loss(
            self.loss,
            dim=self.dim,
            feature_bound=self.feature_bound,
            radius=self.radius,
            strong_convexity=self.strong_convexity,
            noise_multiplier=math.sqrt(variance) / self._lipschitz,
            gradient_bound=self.gradient_bound,
        )
        self.plans: tuple[RunPlan, ...] = plan_runs(
            self._problem, self.horizon, moreau=moreau, batch_size=self.batch_size, tuning=self.tuning,
            batch_rule=self.batch_rule,
        )
        sizes = sorted({plan.batch_size(t) for plan in self.plans for t in (1, plan.steps)})
        self._sums: dict[int, VectorSum] = {b: self._vector_sum(b, self.epsilon, self.delta) for b in sizes}
        self._phase = 0
        self._iterate = Iterate.start(np.zeros(self._params))

    @property
    def tuning(self) -> Tuning:
        """The planning constants: :data:`panpriv.protocols.acsa.RESTART_TUNING` with restarts, Cheu et al.'s
        (:data:`panpriv.protocols.acsa.DEFAULT_TUNING`) without."""
        return RESTART_TUNING if self.restart == "gradient" else DEFAULT_TUNING

    def describe_noise(self) -> tuple[str, ...]:
        return (
            *pvec_noise_lines(self._sums[b] for b in sorted(self._sums)),
            f"per-record gradients clipped to norm L = {self._lipschitz:.6g}",
            f"restarts: {self.restart} (post-processing; no effect on the guarantee)",
            batch_rule_line(self._problem, self.batch_rule),
        )

    @property
    def vector_sums(self) -> dict[int, VectorSum]:
        """The PVEC instance of each batch size the plans use."""
        return dict(self._sums)

    @property
    def finished(self) -> bool:
        """True once all n records have been processed (the last run is over)."""
        return self._phase == len(self.plans)

    # -- rounds ----------------------------------------------------------------------------------

    def _check_room(self, count: int) -> None:
        if self._records + count > self.horizon:
            raise InvalidInputError(
                f"{_OWNER}: the protocol has horizon n = {self.horizon} records (Cheu et al. 2022 Alg. 4 fixes its "
                f"rounds in advance); {self._records} done, {count} more given"
            )

    def _round_sum(self) -> VectorSum:
        if self.finished:
            raise InvalidInputError(f"{_OWNER}: the protocol's {self.horizon} records are all learned (no round left)")
        return self._sums[self.plans[self._phase].batch_size(self._iterate.batch)]

    def _query(self) -> tuple[Array, float | None]:
        return self._iterate.theta_md, self.plans[self._phase].smoothing

    def _finish_round(self, mean: Array) -> None:
        plan = self.plans[self._phase]
        gradient = mean + self.loss.ridge_gradient(self._iterate.theta_md)
        self._iterate = step(self._iterate, gradient, plan.sizes, self._ball, restart=self.restart == "gradient")
        if self._iterate.batch > plan.steps:  # run over: next phase (Thm 4.8), warm-started
            self._phase += 1
            if not self.finished:
                self._iterate = Iterate.start(self._iterate.theta_ag)

    def query_point(self) -> Array:
        """θ^md of the round in progress: where its users take their gradients (Cheu et al. 2022, Alg. 4)."""
        return self._iterate.theta_md.copy()

    def round_smoothing(self) -> float | None:
        """β_s of the Moreau envelope whose gradients the round's users report (``None``: the loss's
        own); once finished, the last run's. (The clip, :attr:`gradient_norm_bound`, is
        min(``gradient_bound``, the loss's L).)"""
        return self.plans[min(self._phase, len(self.plans) - 1)].smoothing

    # -- outputs -----------------------------------------------------------------------------------

    def release(self) -> Array:
        """θ^ag of the run in progress (Cheu et al. 2022 Alg. 4: "Output θ^ag_{T+1}"; a warm start at a phase's start)."""
        return self._iterate.theta_ag.copy()

    def privacy(self) -> PrivacyReport:
        """Output: (ε, δ) per record (Cheu et al. 2022, Thms 4.3/4.7/4.8, privacy part). Intrusion: the local
        guarantee of one PVEC message, the weakest over the batch sizes used."""
        output = Guarantee(self.epsilon, max(s.parameters.delta for s in self._sums.values()))
        intrusion = output
        for vector_sum in self._sums.values():
            intrusion = max_guarantee(intrusion, self._local(vector_sum, self.epsilon))
        runs = ", ".join(f"{p.records} records in {p.steps} rounds" for p in self.plans)
        assumptions = [
            f"each record is in exactly one round (sequential interactivity, Cheu et al. 2022 Def. 2.7; runs: {runs}); "
            "later rounds see it only through the model",
            f"pan-privacy: the state holds the AC-SA iterates and the one-bit totals of the round in "
            f"progress; read right after a round's first user it shows her message alone, protected by "
            f"her own binomial noise: local guarantee {intrusion}",
        ]
        references = ["Cheu et al. 2022, Alg. 4", "Cheu et al. 2022, Thm 4.3", "Cheu et al. 2022, Def. 2.7"]
        if self.plans[0].smoothing is not None:
            references.append("Cheu et al. 2022, Thm 4.7")
        if len(self.plans) > 1:
            references.append("Cheu et al. 2022, Thm 4.8")
        return self._report(output, intrusion, assumptions, references)

    # -- persistence ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """Counters, the round in progress (``filled``, noisy ``totals``), the AC-SA iterates, their
        step ``t`` (reset by restarts) and the run's ``batch`` index."""
        return {
            **self._round_state(),
            "phase": self._phase,
            "step": self._iterate.t,
            "batch": self._iterate.batch,
            "theta": self._iterate.theta.copy(),
            "theta_ag": self._iterate.theta_ag.copy(),
            "theta_md": self._iterate.theta_md.copy(),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        owner = f"{_OWNER}.load_state_dict"
        records, filled, totals = read_round(_OWNER, state, self._params)
        phase, t = read_int(_OWNER, state, "phase"), read_int(_OWNER, state, "step", minimum=1)
        # States saved before restarts existed have no "batch": their step was the batch index.
        batch = read_int(_OWNER, state, "batch", minimum=1) if "batch" in state else t
        if phase > len(self.plans) or records > self.horizon:
            raise InvalidInputError(check.message(owner, "phase", f"an int <= {len(self.plans)}", phase))
        if phase < len(self.plans) and (batch > self.plans[phase].steps or filled >= self.plans[phase].batch_size(batch)):
            raise InvalidInputError(
                f"{owner}: step {t} / filled {filled} do not fit the planned run; was the state saved "
                "under another config?"
            )
        theta, theta_ag, theta_md = (read_array(_OWNER, state, key, (self._params,)) for key in ("theta", "theta_ag", "theta_md"))
        self._records, self._filled, self._totals, self._phase = records, filled, totals, phase
        self._iterate = Iterate(theta, theta_ag, theta_md, t, batch)
