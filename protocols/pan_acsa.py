"""Pan-private AC-SA: Cheu et al. 2022 Algorithm 6 with the four cases of Cheu et al. 2022 Theorem C.3.

The learner reads a stream one record at a time (vectorised over micro-batches) and keeps, as its
whole internal state, the AC-SA iterates (θ_t, θ^ag_t, θ^md_t) and a gradient accumulator g_t.
Records are grouped into consecutive batches of planned sizes b_t; for batch t:

- when its first record arrives, ``g_t ← Z_t ~ N(0, ζ_t² I)`` (Cheu et al. 2022 Alg. 6 lines 4–5);
- each record adds ``∇ℓ(θ^md_t; x)/b_t`` (line 7), with the gradient clipped to norm L;
- at its end, ``g_t ← g_t + N(0, ζ_t² I)`` (line 9), the exact ridge gradient λ_r θ^md_t is added,
  and the AC-SA step of :mod:`panpriv.protocols.acsa` runs (lines 10–12, Lan's update).

An intruder who reads the state mid-batch sees ``Z_t + (partial sum)/b_t``, protected by Z_t;
released parameters depend on the batch only through the full sum plus both draws, and given
the intrusion the second draw protects the records after it (Cheu et al. 2022, Lemma C.4, Case 2). So each
draw alone must make the batch mean (ε, δ)-DP; its ℓ2 sensitivity under replacement of one
record is 2L/b_t. Because every record enters exactly one batch and everything else is
post-processing, the learner is (ε, δ)-pan-private (one intrusion plus all outputs) and its
outputs are (ε, δ)-DP, per record, however long the stream runs.

One read, not two: every state inside batch t carries the same Z_t, so two states of one batch
differ by the exact clean sum of the records between them, and Lemma C.4 covers one read only.
:meth:`PanPrivateACSA.state_dict` (what a checkpoint persists) is therefore the state at the last
batch boundary — the iterates, post-processing of the noisy batch means, before the next batch's
first draw — and never the accumulator; any number of saved states reveals nothing beyond the
outputs. Z_t is drawn when the batch's first record arrives, so a learner restored at a boundary
draws it afresh (:meth:`PanPrivateACSA.records_to_boundary` tells a caller where boundaries fall).

Noise calibration: ``calibration="analytic"`` (default) takes the smallest ζ for which the Gaussian
mechanism with sensitivity 2L/b is (ε, δ)-DP (Balle & Wang 2018, via
:func:`panpriv.accounting.gaussian.analytic_sigma`), valid for every ε > 0; ``"classic"`` takes
ζ² = 8 L² log(2/δ)/(b² ε²) of Cheu et al. 2022 Alg. 6 line 1 / Lemma C.5, valid for ε < 1 only and never
smaller. Lemma C.4's proof uses nothing about ζ beyond that (ε, δ)-DP property, so both give the
same guarantee.

Utility options (no effect on the guarantee): ``gradient_bound`` clips per-record gradients below
the loss's worst-case L (noise then scales with the smaller bound), and ``restart="gradient"`` (the
default) restarts AC-SA when the noisy gradient shows the momentum overshooting — post-processing
of the noisy gradients (:func:`panpriv.protocols.acsa.step`).

Cases of Thm C.3 (parameters from :func:`panpriv.protocols.acsa.plan_runs`):

1. convex, non-smooth loss → Moreau smoothing (Cheu et al. 2022 Thm 4.7): envelope gradients via the prox;
2. β-smooth loss → AC-SA on the loss itself (Cheu et al. 2022 Thm 4.3);
3. λ-strongly convex (ridge or declared ``strong_convexity``), non-smooth → phases of Cheu et al. 2022 Thm 4.8,
   each Moreau-smoothed;
4. λ-strongly convex and β-smooth → phases of Thm 4.8 without smoothing.

Stream length. With ``horizon=n`` the first epoch is one run (or k phases) over n records; with
``horizon=None`` it has :data:`FIRST_EPOCH` records. Records beyond are processed by further epochs,
each twice as long as the previous and warm-started from its output (the "doubling trick"). Each
record still enters exactly one batch, so the guarantee does not change.

References
----------
Cheu, Joseph, Mao & Peng (2022), Def. C.2 (pan-privacy), Alg. 6, Thm C.3, Lemma C.4, Lemma C.5;
Alg. 4, Lemma 4.4, Thms 4.3, 4.7, 4.8 (the shuffle counterparts whose parameters C.3 reuses).
Balle & Wang (2018), "Improving the Gaussian mechanism for differential privacy", Thm 8.
G. Lan (2012), Math. Program. 133:365–397 (AC-SA).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.gaussian import analytic_sigma, classic_sigma
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import scalar_residue, scratch, secure_noise
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
from panpriv.protocols.base import StateValue, check_batch, doubling_epochs_beyond, record_row
from panpriv.protocols.batch_worker import BatchWorkerLearner
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.discrete_gaussian import GeneratorUniform, UniformSource
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomness import RngLike
from panpriv.protocols.rounds import round_slices
from panpriv.protocols.scratch import BLOCK_ROWS

Array = NDArray[np.float64]

FIRST_EPOCH = 1024
"""Records in the first epoch when no horizon is declared (later epochs double)."""

SENSITIVITY_SLACK = 1e-9
"""Relative margin added to the sensitivity 2L/b when calibrating ζ. Clipping a gradient to norm L
and scaling a unit-sensitivity σ are exact only up to rounding (a few ulps); this margin, far
larger than any rounding and far too small to matter for utility, keeps the calibration a bound."""

GaussianCalibration = Literal["analytic", "classic"]
GAUSSIAN_CALIBRATIONS: tuple[GaussianCalibration, ...] = ("analytic", "classic")
"""How each batch draw is calibrated: the analytic Gaussian (Balle & Wang 2018, Thm 8) or the
classic σ = √(2 ln(1.25/δ))·Δ/ε (needs ε < 1; Cheu et al. 2022, Lemma C.5)."""

_OWNER = "PanPrivateACSA"
_LARGEST = sys.float_info.max
_ARRAYS = ("theta", "theta_ag", "theta_md")
_COUNTERS = ("records", "epoch", "phase", "step", "batch")
_OPEN_BATCH_COUNTERS = ("filled",)
"""Saved by older panpriv versions, mid-batch, with the accumulator (``grad`` or ``grad_units``)."""


@dataclass(frozen=True)
class _Calibration:
    """One way to calibrate a batch draw: its σ for sensitivity Δ, whether it needs ε < 1, and
    how the privacy report names and cites it."""

    sigma: Callable[[float, float, float], float]
    needs_epsilon_below_one: bool
    description: str
    reference: str


_CALIBRATIONS: dict[str, _Calibration] = {
    "analytic": _Calibration(analytic_sigma, False, "analytic Gaussian (Balle & Wang 2018)", "Balle & Wang 2018, Thm 8"),
    "classic": _Calibration(
        classic_sigma, True, "classic Gaussian (Cheu et al. 2022, Lemma C.5)", "Cheu et al. 2022, Lemma C.5"
    ),
}


@functools.lru_cache(maxsize=64)
def _unit_sigma(calibration: str, epsilon: float, delta: float) -> float:
    """σ making the Gaussian mechanism with sensitivity 1 (ε, δ)-DP. The mechanism depends only
    on sensitivity/σ, so ζ for sensitivity Δ is Δ times this (up to rounding; see
    :data:`SENSITIVITY_SLACK`). Cached: the analytic calibration is a root search."""
    return _CALIBRATIONS[calibration].sigma(epsilon, delta, 1.0)


class PanPrivateACSA(BatchWorkerLearner):
    """Pan-private accelerated stochastic approximation (Cheu et al. 2022, Alg. 6 and Thm C.3).

    Parameters
    ----------
    dim
        Number of raw features d (the model has d + 1 parameters with an intercept).
    loss
        A :class:`panpriv.protocols.losses.Loss`, its name or its config dict; a name (``"logistic"``) or a config dict
        without ``intercept`` learns an intercept (:func:`panpriv.protocols.losses.learner_loss`: the model ``panpriv run``
        learns from the same settings). Default: ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon, delta
        The per-record guarantee, for outputs and for one intrusion plus outputs.
        Defaults: ε = 1, δ = 1e-6 (:mod:`panpriv.protocols.defaults`, the service's too).
    horizon
        Records in the first epoch (the planned stream length n); ``None``: :data:`FIRST_EPOCH`.
    batch_size
        Override of the planned batch size b (Cheu et al. 2022, proof of Thm 4.3); ``None`` plans it.
    radius
        Radius r of Θ, the ℓ2 ball of parameters (D = 2r); ``None`` (default): r = √d, never below 1
        (:func:`panpriv.protocols.base.default_radius`, a rule that looks at no data).
    feature_bound
        R: features are clipped to norm R (an intercept feature is added after clipping).
    strong_convexity
        λ ≥ 0 of the unregularised population loss, if known; the loss's ridge adds to it.
        λ > 0 selects the phased reduction of Cheu et al. 2022, Thm 4.8 (cases 3 and 4).
    smoothing
        ``"auto"``: Moreau-smooth non-smooth losses only; ``"moreau"``: always (needs a closed-form
        prox); ``"none"``: never (needs a smooth loss).
    calibration
        ``"analytic"`` (default, any ε > 0) or ``"classic"`` (Cheu et al. 2022 Lemma C.5, ε < 1). Calibrates the
        float Gaussian draws; with ``noise="secure"`` the discrete Gaussian has its own calibration.
    gradient_bound
        C: per-record gradients are clipped to norm min(C, L), L the loss's worst-case bound over Θ;
        ``None`` (default): L. The noise is calibrated to the sensitivity 2·min(C, L)/b, and the
        learner optimises a convex C-Lipschitz surrogate of the loss
        (:func:`panpriv.protocols.acsa.effective_gradient_bound`). A utility choice: worst-case L can be
        far above the gradients the data has (squared loss: L = (rR + Y)R).
    restart
        ``"gradient"`` (default): AC-SA restarts when the noisy gradient shows the momentum
        overshooting (O'Donoghue & Candès 2015; post-processing, :func:`panpriv.protocols.acsa.step`),
        planned with :data:`panpriv.protocols.acsa.RESTART_TUNING`. ``"none"``: Lan's method with Cheu et al.'s
        parameters, for which Thm C.3's utility bound is proven.
    batch_rule
        How the planned batch size b grows with the dimension (:func:`panpriv.protocols.acsa.noise_dimension`):
        ``"worst-case"`` (default) uses p (Cheu et al. 2022, proof of Thm 4.3); ``"glm"`` keeps the
        noise term's dimension at min(p, 20) — smaller batches, more steps at large p — which
        ``benchmarks/utility_shapes.py`` measured to be worse at d ≥ 100 on the synthetic streams and
        mixed on Adult and a one-hot stream. Utility only; ignored with ``batch_size``.
    noise
        ``"gaussian"`` (default): float64 Gaussian draws from numpy, accumulator in float64.
        ``"secure"``: the accumulator is an int64 vector on a public fixed-point grid and both draws
        are exact discrete Gaussians sampled from OS entropy without floating point, calibrated by
        :mod:`panpriv.accounting.discrete_gaussian` (:mod:`panpriv.protocols.secure_noise`; Canonne, Kamath &
        Steinke 2020), so no noise value passes through a floating-point sampler (Mironov 2012).
        Same (ε, δ), same Lemma C.4 argument; σ is about 6–8% larger (zCDP accounting).
    rng
        ``None`` (default): every noise draw uses a generator keyed from OS entropy and zeroed
        after the draw (pan-private; :mod:`panpriv.protocols.randomness`).
        A seed or generator: reproducible replay/testing mode, in which there is no pan-private
        guarantee (see :mod:`panpriv.protocols.randomness`).

    Notes
    -----
    Deviations from Cheu et al. 2022, each explained where implemented: Lan's middle-point update instead of
    Alg. 6 line 12 (:func:`panpriv.protocols.acsa.step`); α_t = 2/(t+1) (:func:`panpriv.protocols.acsa.alpha`); the
    Moreau envelope over R^p instead of Θ (:meth:`panpriv.protocols.losses.Loss.envelope_gradient`);
    batch sizes b_t ∈ {⌊n/T⌋, ⌊n/T⌋ + 1} so that every record is used; the analytic calibration;
    by default, gradient restarts with measured batch sizes (``restart``). None changes the
    privacy guarantee.

    References
    ----------
    Cheu et al. 2022, Alg. 6, Thm C.3, Lemma C.4, Lemma C.5, Def. C.2; Lan (2012); Balle & Wang (2018).
    """

    name = "pan-acsa"
    # "step": reset by restarts, which read the noisy gradients.
    noisy_counters = frozenset({"step"})

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": {"name": "hinge", "intercept": True}, "epsilon": 1.0, "delta": 1e-5, "horizon": 40, "batch_size": 6, "radius": 20.0},
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "horizon": 12, "radius": 20.0, "restart": "none"},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        delta: float = DEFAULT_DELTA,
        horizon: int | None = None,
        batch_size: int | None = None,
        radius: float | None = None,
        feature_bound: float = 1.0,
        strong_convexity: float = 0.0,
        smoothing: Smoothing = "auto",
        calibration: GaussianCalibration = "analytic",
        gradient_bound: float | None = None,
        restart: Restart = "gradient",
        noise: secure_noise.Noise = "gaussian",
        batch_rule: BatchRule = "worst-case",
        rng: RngLike = None,
    ) -> None:
        self._setup_common(_OWNER, dim, loss, radius, feature_bound, rng)
        self.calibration = check.choice(_OWNER, "calibration", calibration, GAUSSIAN_CALIBRATIONS)
        self.delta = check.open_unit(_OWNER, "delta", delta)
        if _CALIBRATIONS[self.calibration].needs_epsilon_below_one:
            self.epsilon = check.open_unit(_OWNER, "epsilon", epsilon)  # Cheu et al. 2022 Lemma C.5: ε < 1
        else:
            self.epsilon = check.positive(_OWNER, "epsilon", epsilon)
        unit_sigma = _unit_sigma(self.calibration, self.epsilon, self.delta)
        self.horizon = None if horizon is None else check.positive_int(_OWNER, "horizon", horizon)
        self.batch_size = None if batch_size is None else check.positive_int(_OWNER, "batch_size", batch_size)
        self.strong_convexity = check.nonnegative(_OWNER, "strong_convexity", strong_convexity)
        self._moreau = uses_moreau(_OWNER, self.loss, smoothing)
        self.smoothing = smoothing
        self.gradient_bound = None if gradient_bound is None else check.positive(_OWNER, "gradient_bound", gradient_bound)
        self.restart = check.choice(_OWNER, "restart", restart, RESTARTS)
        self.noise = check.choice(_OWNER, "noise", noise, secure_noise.NOISES)
        self.batch_rule = check.choice(_OWNER, "batch_rule", batch_rule, BATCH_RULES)

        self._lipschitz = effective_gradient_bound(self.loss, self.feature_bound, self.radius, self.gradient_bound)
        self._unit_sigma = unit_sigma * (1.0 + SENSITIVITY_SLACK)
        # -- secure noise (begin): the fixed-point grid and the discrete Gaussian of each draw
        self._secure = secure_noise.calibrate_draw(self.epsilon, self.delta) if self.noise == "secure" else None
        self._uniform: UniformSource | None = (
            GeneratorUniform(np.random.default_rng(rng)) if self._secure is not None and rng is not None else None
        )
        noise_multiplier = self._unit_sigma if self._secure is None else self._secure.noise_multiplier
        # -- secure noise (end)
        # Two draws of standard deviation ζ = s·2L/b each: E‖Z‖² = p·8 s² L²/b², i.e. ν² = 8 s².
        self._problem = Problem.for_loss(
            self.loss,
            dim=self.dim,
            feature_bound=self.feature_bound,
            radius=self.radius,
            strong_convexity=self.strong_convexity,
            noise_multiplier=math.sqrt(8.0) * noise_multiplier,
            gradient_bound=self.gradient_bound,
        )
        self._plans_cache: tuple[int, tuple[RunPlan, ...]] | None = None

        self._epoch = 0
        self._phase = 0
        self._filled = 0
        self._iterate = Iterate.start(np.zeros(self._params))
        # The accumulator g_t; between batches it is unused (zeros) until Z_t initialises it.
        self._grad = self._zero_accumulator()
        # :meth:`_learn_row`'s work: ‖x‖² and ⟨θ_x, x⟩ (0-d views, written by ``dot``), zeroed once
        # read; its record's gradient/b, zeroed once added
        self._row_products = np.zeros(2)
        self._row_square, self._row_dot = self._row_products[0:1].reshape(()), self._row_products[1:2].reshape(())
        self._row_gradient = np.zeros(self._params)
        self._row_dphi = scratch.scalar_dphi(self.loss) if self._secure is None else None

    # -- plans and noise ---------------------------------------------------------------------

    def epoch_length(self, epoch: int) -> int:
        """Records in epoch ``epoch`` (0-based): n₀·2^epoch with n₀ = horizon or FIRST_EPOCH."""
        first = FIRST_EPOCH if self.horizon is None else self.horizon
        return first * 2**epoch

    @property
    def tuning(self) -> Tuning:
        """The planning constants: :data:`panpriv.protocols.acsa.RESTART_TUNING` with restarts, Cheu et al.'s
        (:data:`panpriv.protocols.acsa.DEFAULT_TUNING`) without."""
        return RESTART_TUNING if self.restart == "gradient" else DEFAULT_TUNING

    def epoch_plans(self, epoch: int) -> tuple[RunPlan, ...]:
        """The runs (one, or the phases of Thm 4.8) of epoch ``epoch``; public constants only."""
        if self._plans_cache is None or self._plans_cache[0] != epoch:
            plans = plan_runs(
                self._problem, self.epoch_length(epoch), moreau=self._moreau, batch_size=self.batch_size, tuning=self.tuning,
                batch_rule=self.batch_rule,
            )
            self._plans_cache = (epoch, plans)
        return self._plans_cache[1]

    def beyond_plan(self, planned: int) -> str:
        """Further doubling epochs (module docstring, "Stream length")."""
        return doubling_epochs_beyond(planned, "every record still enters one batch")

    def describe_noise(self) -> tuple[str, ...]:
        """The plan's batches and the standard deviation of each batch's two draws (Cheu et al. 2022, Alg. 6)."""
        plan = self.current_plan()
        sizes = sorted({plan.batch_size(t) for t in range(1, plan.steps + 1)})
        lines = [
            f"records per run: {plan.records:,}; batches T = {plan.steps:,} of b = " + " or ".join(f"{b:,}" for b in sizes) + " records",
            "per batch: two "
            + ("exact discrete Gaussian (noise = secure)" if self.noise == "secure" else "Gaussian")
            + " draws (at its start and its end), each with standard deviation",
            *(f"  zeta = {self.batch_noise_std(b):.6g} for b = {b:,} (l2 sensitivity of the batch mean 2L/b)" for b in sizes),
            f"per-record gradients clipped to norm L = {self.gradient_norm_bound:.6g}",
            "Moreau smoothing: " + ("none (smooth loss)" if plan.smoothing is None else f"beta_s = {plan.smoothing:.6g}"),
            f"restarts: {self.restart} (post-processing; no effect on the guarantee)",
            batch_rule_line(self._problem, self.batch_rule),
        ]
        return tuple(lines)

    def current_plan(self) -> RunPlan:
        """The plan of the run in progress."""
        return self.epoch_plans(self._epoch)[self._phase]

    def _current_batch(self) -> int:
        """b_t of the batch in progress."""
        return self.current_plan().batch_size(self._iterate.batch)

    @property
    def gradient_norm_bound(self) -> float:
        """The norm per-record gradients are clipped to: min(``gradient_bound``, the loss's L)."""
        return self._lipschitz

    def batch_noise_std(self, batch: int) -> float:
        """ζ for a batch of ``batch`` records: the standard deviation of each of the two draws, for
        ℓ2 sensitivity 2L/b (times 1 + :data:`SENSITIVITY_SLACK`). Secure noise: γσ/b, the draw's
        σ in grid units times the grid step, on the scale of the batch mean (N_Z's standard
        deviation is at most σ)."""
        if self._secure is not None:
            return math.sqrt(self._secure.sigma2) * secure_noise.grid_step(self._lipschitz) / batch
        return self._unit_sigma * 2.0 * self._lipschitz / batch

    def _add_noise(self, batch: int) -> None:
        """g_t += one draw, into the accumulator's own buffer: N(0, ζ_t² I) through
        :meth:`panpriv.protocols.randomness.NoiseSource.add_gaussian`, or (secure) the exact discrete
        Gaussian in grid units, whose array is zeroed right after it is added. No pure-noise array
        outlives the call."""
        if self._secure is None:
            self._noise.add_gaussian(cast("NDArray[np.float64]", self._grad), self.batch_noise_std(batch))
            return
        draw = secure_noise.draw(self._secure, self._params, self._uniform)
        self._grad += draw
        draw.fill(0)

    # -- secure noise (begin): the accumulator's representation in each mode ------------------

    def _zero_accumulator(self) -> NDArray[np.float64] | NDArray[np.int64]:
        if self._secure is None:
            return np.zeros(self._params, dtype=np.float64)
        return np.zeros(self._params, dtype=np.int64)

    # -- secure noise (end) --------------------------------------------------------------------

    # -- learning ------------------------------------------------------------------------------

    def learn_many(self, X: Array, y: Array) -> None:
        """Add a micro-batch of records; any split of the stream gives the same mechanism.

        Features, labels, per-record gradients and their partial sums live only in this learner's
        :class:`panpriv.protocols.scratch.Scratch` buffers, zeroed before returning; the accumulator is
        updated in place. So after the call, memory holds no clean per-record value and no pure
        noise draw (tests/protocols/test_memory_residue.py).

        A micro-batch of one record (every :meth:`learn_one`) takes :meth:`_learn_row` when it
        can, so ``learn_one`` and ``learn_many`` of one row are one computation.
        """
        if np.shape(X) == (1, self.dim) and np.shape(y) == (1,):
            X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
            if self._learn_row(X[0], y):
                return
        fused = self._secure is None and np.ndim(X) == 2
        squares = self._scratch.take("batch_row_squares", np.shape(X)[0]) if fused else None
        try:
            X, y = check_batch(_OWNER, X, y, self.dim, squares)  # the fused path reuses the norms
            for rows in round_slices(X.shape[0], lambda: min(self._current_batch() - self._filled, BLOCK_ROWS)):
                plan = self.current_plan()
                batch = plan.batch_size(self._iterate.batch)
                if self._filled == 0:  # a batch starts: g_t ← Z_t (Alg. 6 lines 4-5)
                    self._grad.fill(0)
                    self._add_noise(batch)
                self._add_records(X[rows], y[rows], plan, batch, None if squares is None else squares[rows])
                self._filled += rows.stop - rows.start
                self._records += rows.stop - rows.start
                if self._filled == batch:
                    self._finish_batch(plan, batch)
        finally:
            self._scratch.wipe()

    def learn_one(self, x: Array | Mapping[str, Any], y: float) -> None:
        """Process one record (an array of ``dim`` features, or a mapping after :meth:`use_schema`):
        :meth:`learn_many` on a micro-batch of one, through :meth:`_learn_row` when it applies."""
        row = record_row(x, self.schema, f"{_OWNER}.learn_one")
        if row.shape == (1, self.dim) and self._learn_row(row[0], y):
            return
        self.learn_many(row, np.array([y], dtype=np.float64))

    def _learn_row(self, x: Array, y: object) -> bool:
        """One record through the fused GLM step of :func:`panpriv.protocols.scratch.clipped_gradient_sum`
        on Python floats, without the micro-batch machinery (validation of a matrix, scratch
        buffers by name, rounds): False, having done nothing, where that path does not apply —
        secure noise, Moreau smoothing, a loss without a scalar φ′, a non-finite or overflowing
        row, a label the loss refuses — and :meth:`learn_many`'s general path decides.

        The same mechanism, to rounding (the sum over one row is its one product): the feature
        clip factor f = R/max(‖x‖, R) and the gradient clip factor L/max(|φ′|·‖z‖, L) are
        computed for every record, clipped or not, as in the batch path (docs/privacy.md,
        "Timing"). Memory as after :meth:`learn_many`: the row's gradient lives in a work
        vector zeroed before returning, and its scalars (norms, margin, slope, weights, label)
        in Python floats overwritten once the call's frame has ended
        (:func:`panpriv.protocols.scalar_residue.scrub_call_floats`)."""
        dphi = self._row_dphi
        if dphi is None:
            return False
        plan = self.current_plan()
        if plan.smoothing is not None:
            return False
        room = scalar_residue.reserve_float_room()  # so the floats freed below land where the scrub finds them
        try:
            return self._row_step(x, y, plan, dphi)
        finally:
            scalar_residue.scrub_call_floats(room)

    def _row_step(self, x: Array, y: object, plan: RunPlan, dphi: Callable[[float, float], float]) -> bool:
        """:meth:`_learn_row`'s arithmetic (its floats, the label's included, are made here and
        freed when this frame ends, before the scrub). ``y``: a 1-element array, or the label."""
        try:
            label = y.item(0) if isinstance(y, np.ndarray) else float(y)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # not a number: the general path says what is wrong with it
            return False
        loss = self.loss
        if loss.binary_labels:
            if label != 1.0 and label != 0.0 and label != -1.0:
                return False  # not a label: the general path raises the loss's error
            label = 1.0 if label == 1.0 else -1.0
        elif not math.isfinite(label):
            return False
        d, bound, lipschitz = self.dim, self.feature_bound, self._lipschitz
        theta = self._iterate.theta_md
        x.dot(x, out=self._row_square)  # into 0-d views: no numpy scalar object holds them
        x.dot(theta[:d], out=self._row_dot)
        products = self._row_products
        squares, dot = products.item(0), products.item(1)
        products.fill(0.0)
        if not squares <= _LARGEST:  # NaN, ±inf, or a finite row whose square overflows
            return False
        intercept = loss.intercept_scale if loss.intercept else 0.0
        factor = bound / max(math.sqrt(squares), bound)  # f = min(1, R/‖x‖), as scratch._clip_factors
        margin = dot * factor + (intercept * theta.item(d) if loss.intercept else 0.0)
        slope = dphi(margin, label)
        weight = slope * (lipschitz / max(math.sqrt(squares * factor * factor + intercept * intercept) * abs(slope), lipschitz))
        batch = plan.batch_size(self._iterate.batch)
        if self._filled == 0:  # a batch starts: g_t ← Z_t (Alg. 6 lines 4-5)
            self._grad.fill(0)
            self._add_noise(batch)
        gradient = self._row_gradient
        np.multiply(x, weight * factor / batch, out=gradient[:d])
        if loss.intercept:
            gradient[d] = intercept * weight / batch
        self._grad += gradient
        gradient.fill(0.0)
        self._filled += 1
        self._records += 1
        if self._filled == batch:
            self._finish_batch(plan, batch)
        return True

    def _add_records(self, X: Array, y: Array, plan: RunPlan, batch: int, row_squares: Array | None = None) -> None:
        """g_t += Σ ∇ℓ(θ^md_t; x)/b_t over the rows (Alg. 6 line 7; secure: Σ trunc(∇/γ) in grid
        units), through scratch buffers; the secure mode's integer partial sum is zeroed after
        it is added. ``row_squares``: the rows' squared norms, if already computed."""
        labels = scratch.labels(self.loss, y, self._scratch)
        if self._secure is None:  # the fused GLM path: no feature or gradient matrix is formed
            total = scratch.clipped_gradient_sum(
                self.loss, self._iterate.theta_md, X, labels, self.feature_bound, self._lipschitz, self._scratch,
                plan.smoothing, row_squares,
            )
            total /= batch
            self._grad += total
            return
        Z = scratch.features(self.loss, X, self.feature_bound, self._scratch)
        gradients = scratch.clipped_gradients(
            self.loss, self._iterate.theta_md, Z, labels, self._lipschitz, self._scratch, plan.smoothing
        )
        units = secure_noise.grid_sum(gradients, self._lipschitz)
        self._grad += units
        units.fill(0)

    def _finish_batch(self, plan: RunPlan, batch: int) -> None:
        """Alg. 6 lines 9–12 for the completed batch."""
        self._add_noise(batch)
        self._step(plan, self._noisy_mean(batch))
        self._filled = 0
        self._grad.fill(0)

    def _noisy_mean(self, batch: int) -> Array:
        """The accumulator as a float batch mean: the accumulator itself (no copy of the noisy sum
        is made) or, with secure noise, γ·sum/b formed only now (post-processing of the noisy
        integer sum)."""
        if self._secure is None:
            return cast("Array", self._grad)
        return self._grad.astype(np.float64) * (secure_noise.grid_step(self._lipschitz) / batch)

    def _step(self, plan: RunPlan, gradient: Array) -> None:
        """Alg. 6 lines 10–12 on an already noisy mean gradient (added to in place): the exact
        ridge term, Lan's AC-SA step, and the move to the next phase or epoch when the run is over."""
        gradient += self.loss.ridge_gradient(self._iterate.theta_md)
        self._iterate = step(self._iterate, gradient, plan.sizes, self._ball, restart=self.restart == "gradient")
        if self._iterate.batch > plan.steps:  # run over: next phase or next epoch, warm-started
            self._phase += 1
            if self._phase == len(self.epoch_plans(self._epoch)):
                self._epoch += 1
                self._phase = 0
            self._iterate = Iterate.start(self._iterate.theta_ag)

    # -- one batch at a time, sized by the caller: the scale-out roles (streamer/scaleout) ---------
    #
    # A worker holds a learner whose iterate it loads from the coordinator's public model, and runs
    # Alg. 6 lines 4–9 on a batch of a size it is told: the same draws, the same fused gradient
    # path, the same sensitivity 2L/b. Only the noisy mean leaves :meth:`close_batch`. The
    # coordinator's learner never touches records: it applies lines 10–12 to a combination of
    # noisy means (:meth:`apply_noisy_gradient`), which is post-processing.

    def step_batch_size(self) -> int:
        """b_t of the step in progress (:class:`panpriv.protocols.batch_worker.BatchWorkerLearner`)."""
        return self._current_batch()

    @property
    def plan_complete(self) -> bool:
        """The first planned epoch is over (a scale-out model publishes its last version then)."""
        return self._epoch > 0

    def plan_for_workers(self, workers: int) -> None:
        """Plan the runs for a step gradient that averages ``workers`` noisy batch means of b/K
        records each: its noise has K times the variance of one batch mean of b records (ν² → Kν²
        in :class:`panpriv.protocols.acsa.Problem`), so batch and step sizes are planned for that noise.
        Utility only: every draw is still calibrated to the batch it protects."""
        workers = check.positive_int(_OWNER, "workers", workers)
        self._problem = dataclasses.replace(self._problem, noise_multiplier=self._problem.noise_multiplier * math.sqrt(workers))
        self._plans_cache = None

    def open_batch(self, batch: int) -> None:
        """Start a batch of ``batch`` records: g ← Z ~ N(0, ζ(batch)² I) (Alg. 6 lines 4–5)."""
        check.positive_int(_OWNER, "batch", batch)
        self._grad.fill(0)
        self._add_noise(batch)

    def add_to_batch(self, X: Array, y: Array, batch: int) -> None:
        """g += Σ ∇ℓ(θ^md; x)/batch over the rows (Alg. 6 line 7) at the loaded iterate, through
        the fused gradient path and scratch buffers zeroed before returning (as :meth:`learn_many`)."""
        X, y = check_batch(_OWNER, X, y, self.dim)
        try:
            for start in range(0, X.shape[0], BLOCK_ROWS):
                rows = slice(start, min(start + BLOCK_ROWS, X.shape[0]))
                self._add_records(X[rows], y[rows], self.current_plan(), batch)
                self._records += rows.stop - rows.start
        finally:
            self._scratch.wipe()

    def close_batch(self, batch: int) -> Array:
        """End the batch: the second draw (Alg. 6 line 9); return the noisy batch mean (a new
        array) and zero the accumulator. The caller must zero the returned array once it is sent."""
        self._add_noise(batch)
        mean = self._noisy_mean(batch).copy()
        self._grad.fill(0)
        return mean

    def discard_batch(self) -> None:
        """Drop an unfinished batch (its records reached no output): zero the accumulator."""
        self._grad.fill(0)

    def apply_noisy_gradient(self, gradient: Array) -> None:
        """Alg. 6 lines 10–12 with ``gradient``, a combination of noisy batch means computed at the
        current θ^md (post-processing: no record is read and no noise is added here)."""
        gradient = np.array(gradient, dtype=np.float64, copy=True)
        if gradient.shape != (self._params,) or not np.all(np.isfinite(gradient)):
            raise InvalidInputError(f"{_OWNER}.apply_noisy_gradient: need {self._params} finite floats; got shape {gradient.shape}")
        self._step(self.current_plan(), gradient)

    @property
    def param_count(self) -> int:
        """p: the number of model parameters (dim, plus one with an intercept)."""
        return self._params

    # -- outputs -------------------------------------------------------------------------------

    def release(self) -> Array:
        """θ^ag of the run in progress (the output of Cheu et al. 2022 Alg. 6; the warm start at a run's start)."""
        return self._iterate.theta_ag.copy()

    @property
    def records_seen(self) -> int:
        return self._records

    def privacy(self) -> PrivacyReport:
        """(ε, δ) per record for all outputs, and for one intrusion plus all outputs (Cheu et al. 2022, Lemma C.4).

        In the seeded replay/testing mode the intrusion guarantee is reported as none: the
        generator in memory lets an intruder predict the noise still to come.
        """
        guarantee = Guarantee(self.epsilon, self.delta)
        calibration = _CALIBRATIONS[self.calibration].description
        assumptions = [
            "neighbouring streams differ in one record (replacement); stream positions, counts and "
            "the horizon are public",
            f"features clipped to norm {self.feature_bound:g} and per-record gradients to norm "
            f"L = {self._lipschitz:.6g}, so a batch mean of b records has l2 sensitivity 2L/b",
            f"each batch gets two Gaussian draws (at its start and at its end), each calibrated "
            f"({calibration}) to make the batch mean (epsilon, delta)-DP alone; every record "
            "enters exactly one batch",
            "the intruder reads the internal state (iterates and partial gradient accumulator) at "
            "most once; every noise draw comes from a generator keyed from OS entropy and zeroed after the draw",
        ]
        references = ["Cheu et al. 2022, Alg. 6", "Cheu et al. 2022, Lemma C.4", "Cheu et al. 2022, Thm C.3", "Cheu et al. 2022, Def. C.2"]
        if self._secure is not None:  # secure noise: the draws are discrete Gaussians
            assumptions[2] = (
                "each batch gets two draws (at its start and at its end), each making the batch sum "
                "(epsilon, delta)-DP alone; every record enters exactly one batch"
            )
            assumptions[3] = (
                "the intruder reads the internal state (iterates and partial gradient accumulator) at "
                "most once; every noise draw uses fresh uniform integers from OS entropy (secrets)"
            )
            assumptions.append(secure_noise.describe(self._secure))
            references += ["Canonne, Kamath & Steinke 2020, Thm 14", "Canonne, Kamath & Steinke 2020, Cor. 13"]
        else:
            references.append(_CALIBRATIONS[self.calibration].reference)
        return self._report(guarantee, guarantee, assumptions, references)

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """The state at the last batch boundary: counters and the iterates θ, θ^ag, θ^md — never
        the accumulator of the open batch.

        Why (Cheu et al. 2022, Lemma C.4 covers one read): every state inside batch t carries the
        same first draw Z_t, so two copies of the accumulator taken inside one batch differ by the
        exact clean sum of the records learned between them. The iterates change only when a
        batch ends and are post-processing of the noisy batch means — the sequence every release
        is computed from — so any number of states saved at boundaries reveals nothing about a
        record beyond the output guarantee. Mid-batch, this returns the state the learner had when
        the open batch began (``records`` = :attr:`state_records`), before its first draw; a
        learner restored from it draws Z_t anew when the batch's first record arrives, and the
        caller re-reads the records since the boundary (:meth:`records_to_boundary`)."""
        return {
            "records": self.state_records,
            "epoch": self._epoch,
            "phase": self._phase,
            "step": self._iterate.t,
            "batch": self._iterate.batch,
            "theta": self._iterate.theta.copy(),
            "theta_ag": self._iterate.theta_ag.copy(),
            "theta_md": self._iterate.theta_md.copy(),
        }

    @property
    def state_records(self) -> int:
        """Records learned up to the last batch boundary (what :meth:`state_dict` covers)."""
        return self._records - self._filled

    def records_to_boundary(self) -> int:
        """Records left in the open batch (b_t when no batch is open): learning exactly these brings
        the learner to the next point where :meth:`state_dict` is its live state."""
        return self._current_batch() - self._filled

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        """Restore a state of :meth:`state_dict` (a batch boundary). A state saved mid-batch by
        an older panpriv (with ``filled`` > 0 and the accumulator ``grad``, or ``grad_units`` with
        secure noise) is still accepted and continues its batch."""
        missing = set(_ARRAYS + _COUNTERS) - set(state)
        if missing:
            raise InvalidInputError(f"{_OWNER}.load_state_dict: state lacks {sorted(missing)}")
        counters = {}
        for key in _COUNTERS + _OPEN_BATCH_COUNTERS:
            value = state.get(key, 0)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InvalidInputError(check.message(f"{_OWNER}.load_state_dict", key, "an int >= 0", value))
            counters[key] = int(value)
        arrays = {key: self._read_floats(key, state[key]) for key in _ARRAYS}
        plans = self.epoch_plans(counters["epoch"])
        if counters["phase"] >= len(plans):
            raise InvalidInputError(check.message(f"{_OWNER}.load_state_dict", "phase", f"< {len(plans)}", counters["phase"]))
        plan = plans[counters["phase"]]
        if (
            not 1 <= counters["step"] <= counters["batch"] <= plan.steps
            or counters["filled"] >= plan.batch_size(counters["batch"])
        ):
            raise InvalidInputError(
                f"{_OWNER}.load_state_dict: step {counters['step']} / batch {counters['batch']} / filled "
                f"{counters['filled']} do not fit "
                f"the planned run ({plan.steps} batches); was the state saved under another config?"
            )
        accumulator = self._read_open_batch(state, counters["filled"])
        self._records, self._epoch, self._phase, self._filled = (
            counters["records"], counters["epoch"], counters["phase"], counters["filled"]
        )
        self._iterate = Iterate(
            arrays["theta"], arrays["theta_ag"], arrays["theta_md"], counters["step"], counters["batch"]
        )
        self._grad.fill(0)
        self._grad = accumulator

    def _read_floats(self, key: str, value: StateValue) -> Array:
        array = np.array(value, dtype=np.float64, copy=True)
        if array.shape != (self._params,) or not np.all(np.isfinite(array)):
            raise InvalidInputError(
                f"{_OWNER}.load_state_dict: {key!r} must be {self._params} finite floats; got shape {array.shape}"
            )
        return array

    def _read_open_batch(self, state: Mapping[str, StateValue], filled: int) -> NDArray[np.float64] | NDArray[np.int64]:
        """The accumulator of an older mid-batch state (``filled`` > 0), or zeros at a boundary."""
        key = "grad" if self._secure is None else "grad_units"
        if filled == 0:
            return self._zero_accumulator()
        if key not in state:
            raise InvalidInputError(f"{_OWNER}.load_state_dict: a state with filled = {filled} needs {key!r}")
        if self._secure is None:
            return self._read_floats(key, state[key])
        return self._read_units(state[key])

    def _read_units(self, value: StateValue) -> NDArray[np.int64]:
        """The secure mode's int64 accumulator from a state dict (integers only, no float)."""
        array = np.asarray(value)
        if array.shape != (self._params,) or array.dtype.kind not in "iu":
            raise InvalidInputError(
                f"{_OWNER}.load_state_dict: 'grad_units' must be {self._params} integers (noise='secure'); "
                f"got shape {array.shape}, dtype {array.dtype}"
            )
        return array.astype(np.int64, copy=True)
