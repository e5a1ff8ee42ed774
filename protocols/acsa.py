"""The AC-SA core shared by the AC-SA learners: Lan's updates, step sizes and parameter plans.

AC-SA (Lan 2012), the accelerated stochastic approximation that Cheu et al. 2022 privatises twice — with a
shuffled vector sum (Alg. 4, ``PAGD``) and with pan-private noise (Alg. 6) — is, per step t:

1. ``θ^md_t = α_t θ_t + (1 − α_t) θ^ag_t``                     (middle point; Cheu et al. 2022 Alg. 4 line 3)
2. ``g_t``  = a noisy gradient at ``θ^md_t``                       (supplied by the caller)
3. ``θ_{t+1} = argmin_{θ∈Θ} ⟨g_t, θ − θ_t⟩ + (L_t/2)‖θ − θ_t‖² = Π_Θ(θ_t − g_t/L_t)``
4. ``θ^ag_{t+1} = α_t θ_{t+1} + (1 − α_t) θ^ag_t``             (aggregate; the output)

This module holds the parts that do not depend on how ``g_t`` is privatised: :class:`Iterate` and
:func:`step` (lines 3–4 and the next middle point, optionally with O'Donoghue–Candès gradient
restarts), :class:`StepSizes` (α_t and L_t), :func:`plan_runs` (batch size, Moreau smoothing
parameter and the phases of the strongly convex reduction, from the proofs of Cheu et al. 2022 Thms 4.3, 4.7,
4.8 with the caller's noise level and the constants of a :class:`Tuning`, for a :class:`Problem`),
:func:`uses_moreau` (the ``smoothing`` option), :func:`effective_gradient_bound` (the clip norm L,
or a smaller declared bound) and :func:`record_gradients` (per-record gradients of the loss or its
envelope at θ^md, clipped to L). A learner supplies the
gradient oracle: it privatises the batch of :func:`record_gradients` however its model demands
(Cheu et al. 2022 Alg. 6: Gaussian noise twice; Alg. 4: PVEC), adds the ridge gradient, and calls :func:`step`.

Noise level. Privacy noise enters the plans only through the *noise multiplier* ν of the batch
mean gradient: the caller's total privacy noise Z added to ``(1/b) Σ ∇ℓ`` has ``E‖Z‖² = p ν² L²/b²``
(p parameters, L the per-record gradient bound). For Cheu et al. 2022 Alg. 6 with two draws of standard
deviation ``ζ = s·2L/b`` each, ν² = 8 s². The oracle variance (Cheu et al. 2022, proof of Thm C.3) is then
``σ²(b) = L²/b + p ν² L²/b²``.

References
----------
Cheu, Joseph, Mao & Peng (2022): Alg. 4, Lemma 4.4 (= Lan 2012, Thm 2), Thm 4.3 and its proof
(batch size), Def. 4.5 / Lemma 4.6 / Thm 4.7 (Moreau smoothing), Thm 4.8 (strongly convex phases),
Alg. 6 and Thm C.3 (pan-private variant).
G. Lan (2012), "An optimal method for stochastic composite optimization", Math. Program. 133:365–397,
AC-SA and Corollary 1 (β_t = (t+1)/2, γ_t = (t+1)γ/2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols import validation as check
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.geometry import L2Ball
from panpriv.protocols.losses import Loss, clip_rows

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Tuning:
    """The constants the theorems leave open ("O(·)"), chosen by measurement.

    None of them affects privacy, which depends only on the noise scale and on each record
    entering one batch. Measured on the streams of ``benchmarks/synthetic.py`` (d = 20,
    ‖x‖ = 1, δ = 1e-6), mean excess population loss over 3–20 repetitions per setting
    (``.venv/bin/python -m benchmarks.utility_pan_acsa --tune`` reruns the batch sweep).
    :data:`DEFAULT_TUNING` is for Lan's method as Cheu et al. 2022 analyses it (no restarts; ``shuffle-acsa``
    and ``pan-acsa`` with ``restart="none"``); :data:`RESTART_TUNING` for ``pan-acsa``'s default,
    AC-SA with gradient restarts (:func:`step`).

    - (C_b, κ) without restarts, over {0.35, 0.5, 0.7, 1, 1.4} × {1/16, 1/8, 1/4, 1/2} on logistic
      and least-squares streams, n ∈ {10⁴, 10⁵, 10⁶}, ε ∈ {0.5, 1, 4}: C_b = 1 had the smallest
      mean ratio to the best setting of each row (1.9; 2.6–5.5 for the other C_b), flat in κ ∈
      [1/16, 1/2]; κ = 1 was 1.3–4× worse than κ ≤ 1/2. Too few steps (larger C_b) leaves the
      accelerated method mid-oscillation; smaller C_b adds noise.
    - With restarts the best step count grows much more slowly with n than Cheu et al.'s worst-case
      T ∝ n^{2/5}: the restarted method converges in a few dozen steps on these streams (it
      exploits curvature the worst case does not assume), and every further step shrinks the
      batches and so adds noise; too few steps leave it unconverged (a sharp cliff). Sweep 1, 18
      rows (logistic, and least squares with C = 0.5; n ∈ {10³…10⁶}, ε ∈ {0.5, 1, 4}; κ = 1/4),
      mean ratio to each row's best: exponent 3/5 with C_b ∈ {0.7, 1, 1.4, 2}: 2.25, 1.91, 2.19,
      4.84; exponent 4/5 with C_b ∈ {0.08, 0.11, 0.13}: 1.87, 1.48, 1.41. Sweep 2, the 18 rows
      with n ≥ 10⁴ and 6–12 repetitions each: 3/5 with C_b = 1: mean 2.03 (worst row 6.8); 4/5
      with C_b ∈ {0.09, 0.10, 0.11, 0.13}: 1.51 (2.76), 1.45 (2.45), **1.35 (2.34)**, 1.40 (4.17:
      at n = 10⁵ the logistic stream falls off the cliff). Chosen: 4/5 and C_b = 0.11 — the same
      b as Cheu et al.'s rule near n = 10⁵, larger batches beyond. A measured choice, not a theorem:
      Thm C.3's rate is proven for Lan's method with Cheu et al.'s parameters (``restart="none"``).
    - C_s ∈ {1/4 … 8} for the absolute loss (case 1): 1/4–1 best, 1/2 chosen (n = 10⁴: 0.016,
      10⁵: 0.0013, 10⁶: 0.0004 at ε = 1); larger β_s shortens the steps (2β_s in L_t).
    - C_E ∈ {0.03, 0.1, 0.25, 1, 4} for the phases (cases 3, 4): 0.25 best at n = 10⁵ and 10⁶
      for squared + ridge, logistic + ridge and absolute + ridge (e.g. logistic + ridge 0.01,
      n = 10⁶, ε = 1: 1.4e-5 vs 4.3e-5 at C_E = 1 and 1.6e-4 without phases).

    Attributes
    ----------
    batch, batch_exponent
        C_b and e in ``b = C_b · n^e (√p ν L / (β D))^{2/5}`` (Cheu et al. 2022, proof of Thm 4.3: e = 3/5).
    smoothing
        C_s in ``β_s = C_s · L n^{2/3} / (D (√p ν)^{2/3})`` (Cheu et al. 2022, proof of Thm 4.7).
    noise_step
        κ in ``L_t = (2/(t+1)) (2β + κ (T+2)^{3/2} σ / D)`` (Lan 2012, Cor. 1; Cheu et al. 2022 Lemma 4.4).
    error
        C_E in the per-phase error prediction that sets the next phase's distance (Thm 4.8).
    """

    batch: float = 1.0
    batch_exponent: float = 0.6
    smoothing: float = 0.5
    noise_step: float = 0.25
    error: float = 0.25


DEFAULT_TUNING = Tuning()
"""Cheu et al.'s parameters for Lan's method without restarts."""

RESTART_TUNING = Tuning(batch=0.11, batch_exponent=0.8)
"""For AC-SA with gradient restarts: larger batches, fewer steps (see :class:`Tuning`)."""


def alpha(t: int) -> float:
    """α_t = 2/(t+1) = 1/β_t with Lan's β_t = (t+1)/2 (Lan 2012, Cor. 1); α_1 = 1.

    Notes
    -----
    Cheu et al. 2022 (Lemma 4.4, Thm 4.3; garbled in the paper's extracted text) reads α_t = 2/(t+2), i.e. α_1 = 2/3.
    Lan's analysis needs α_1 = 1 (β_1 = 1), which makes θ^md_1 = θ_1 and removes the initial
    aggregate from the bound; we follow Lan.
    """
    return 2.0 / (t + 1.0)


@dataclass(frozen=True)
class StepSizes:
    """Lan's step sizes for a run of ``steps`` = T steps (Lan 2012, Cor. 1; Cheu et al. 2022, Lemma 4.4).

    ``L_t = (2/(t+1)) · (2β + κ (T+2)^{3/2} σ / D)``, i.e. Lan's ``γ_t = 1/L_t = (t+1)γ/2`` with
    ``1/γ = 2β + κ (T+2)^{3/2} σ/D`` (Lan's ``γ = min{1/(2β), c D/((T+2)^{3/2} σ)}`` up to a factor
    at most 2). ``β`` is the smoothness of the whole objective (ridge included), ``σ`` the standard
    deviation of the gradient oracle, ``D`` a bound on the distance from the start to the optimum.
    """

    steps: int
    smoothness: float
    oracle_std: float
    distance: float
    noise_step: float = DEFAULT_TUNING.noise_step

    @property
    def base(self) -> float:
        """1/γ = 2β + κ (T+2)^{3/2} σ / D."""
        return 2.0 * self.smoothness + self.noise_step * (self.steps + 2.0) ** 1.5 * self.oracle_std / self.distance

    def prox_weight(self, t: int) -> float:
        """L_t, the weight of the proximal term at step t (1-based)."""
        return 2.0 / (t + 1.0) * self.base


@dataclass(frozen=True)
class Iterate:
    """The three AC-SA sequences, the index ``t`` (1-based) of the next AC-SA step and the index
    ``batch`` (1-based) of the next batch of the run.

    ``theta_ag`` is the output (Cheu et al. 2022 Alg. 4/6: "Output θ^ag_{T+1}"); ``theta_md`` is where the next
    gradient must be evaluated. ``t`` drives α_t and L_t and starts again at 1 after a restart
    (:func:`step`); ``batch`` counts the run's batches and never restarts, so the plan's record
    schedule — and with it the privacy accounting — is the same with or without restarts.
    """

    theta: Array
    theta_ag: Array
    theta_md: Array
    t: int
    batch: int

    @classmethod
    def start(cls, theta0: Array, batch: int = 1) -> Iterate:
        """θ_1 = θ^ag_1 = θ^md_1 = θ0 (Cheu et al. 2022 Alg. 4/6 line "Initialize θ^ag_1 = θ_1 ∈ Θ"), t = 1."""
        theta0 = np.array(theta0, dtype=np.float64, copy=True)
        return cls(theta0, theta0.copy(), theta0.copy(), 1, batch)


Restart = Literal["gradient", "none"]
RESTARTS: tuple[Restart, ...] = ("gradient", "none")
"""The ``restart`` choices of the AC-SA learners (see :func:`step`)."""


def step(current: Iterate, gradient: Array, sizes: StepSizes, ball: L2Ball, *, restart: bool = False) -> Iterate:
    """One AC-SA step from ``gradient`` (the oracle's answer at ``current.theta_md``).

    ``θ_{t+1} = Π_Θ(θ_t − g_t/L_t)``, ``θ^ag_{t+1} = α_t θ_{t+1} + (1 − α_t) θ^ag_t`` and the next
    middle point ``θ^md_{t+1} = α_{t+1} θ_{t+1} + (1 − α_{t+1}) θ^ag_{t+1}`` (Lan 2012; Cheu et al. 2022 Alg. 4
    line 3 at step t+1).

    ``restart=True`` adds the gradient restart test of O'Donoghue & Candès (2015, "Adaptive restart
    for accelerated gradient schemes", §3.2): if ``⟨g_t, θ^ag_{t+1} − θ^ag_t⟩ > 0`` — the output
    moved uphill along the gradient just observed, the sign that the momentum has overshot — the
    method starts afresh from ``θ^ag_{t+1}`` (θ = θ^ag = θ^md, t = 1; the run's batch counter goes
    on). It is a function of the noisy gradient and the iterates only, so it is post-processing and
    costs no privacy. Why: with the worst-case smoothness β (e.g. R² for the squared loss) far above
    the curvature the data actually has, Lan's growing steps γ_t = (t+1)γ/2 make the iterates
    oscillate around θ* with a period of about 2π/√(γμ) steps (μ: the curvature along the
    oscillating direction), so the excess loss of θ^ag_{T+1} swings by orders of magnitude with T;
    restarting at each overshoot removes the swing (measured in ``benchmarks/utility_pan_acsa.py``).
    Lan's bound (Cheu et al. 2022 Lemma 4.4) is proven for the un-restarted method; with restarts it is not.

    Notes
    -----
    Cheu et al. 2022 Alg. 6 line 12 reads ``θ^md_{t+1} ← α_t θ_{t+1} + (1 − α_t) θ^ag_t``: the right-hand side of
    line 11, so it would make θ^md_{t+1} = θ^ag_{t+1} at every step and remove the acceleration.
    It is a typo for Lan's update (also Cheu et al.'s own Alg. 4 line 3), implemented here and pinned by
    ``tests/protocols/test_pan_acsa.py::test_middle_point_follows_lan_not_alg6_line12``.
    The middle point is projected onto Θ as well: it is a convex combination of points of Θ, so
    this only removes rounding, and the per-record gradient bound L (e.g. of the squared loss,
    which grows with ‖θ‖) then holds exactly.
    """
    t = current.t
    a = alpha(t)
    theta = ball.project(current.theta - gradient / sizes.prox_weight(t))
    theta_ag = a * theta + (1.0 - a) * current.theta_ag
    if restart and float(gradient @ (theta_ag - current.theta_ag)) > 0.0:
        return Iterate.start(theta_ag, current.batch + 1)
    a_next = alpha(t + 1)
    theta_md = ball.project(a_next * theta + (1.0 - a_next) * theta_ag)
    return Iterate(theta, theta_ag, theta_md, t + 1, current.batch + 1)


@dataclass(frozen=True)
class Problem:
    """What the plans need to know: public constants of the loss, Θ and the privacy noise.

    Attributes
    ----------
    dim
        p, the number of parameters.
    lipschitz
        L, the bound on each record's gradient norm (data term, or its Moreau envelope).
    smoothness
        β of the data term; ``inf`` if it is not smooth.
    ridge
        λ_r of the ridge term (λ_r/2)‖θ‖², added exactly (no noise) to every gradient.
    strong_convexity
        λ ≥ λ_r, the strong convexity of the population objective (0: none declared).
    radius
        Radius r of Θ (D = 2r).
    noise_multiplier
        ν: the privacy noise added to a batch-mean gradient has E‖Z‖² = p ν² L²/b².
    """

    dim: int
    lipschitz: float
    smoothness: float
    ridge: float
    strong_convexity: float
    radius: float
    noise_multiplier: float

    @classmethod
    def for_loss(
        cls,
        loss: Loss,
        *,
        dim: int,
        feature_bound: float,
        radius: float,
        strong_convexity: float,
        noise_multiplier: float,
        gradient_bound: float | None = None,
    ) -> Problem:
        """The problem of a learner with ``dim`` raw features, ``loss`` clipped to ``feature_bound``,
        Θ of ``radius``, a declared ``strong_convexity`` beyond the ridge, and the noise multiplier
        ν of its privacy mechanism. ``gradient_bound`` C: per-record gradients are clipped to
        norm C, so the problem's L is min(C, L of the loss) (:func:`effective_gradient_bound`)."""
        return cls(
            dim=loss.param_dim(dim),
            lipschitz=effective_gradient_bound(loss, feature_bound, radius, gradient_bound),
            smoothness=loss.smoothness(feature_bound),
            ridge=loss.ridge,
            strong_convexity=strong_convexity + loss.ridge,
            radius=radius,
            noise_multiplier=noise_multiplier,
        )

    @property
    def diameter(self) -> float:
        return 2.0 * self.radius

    def oracle_std(self, batch: int) -> float:
        """σ(b) = √(L²/b + p ν² L²/b²) (Cheu et al. 2022, proof of Thm C.3, with the constants kept)."""
        L = self.lipschitz
        return math.sqrt(L * L / batch + self.dim * (self.noise_multiplier * L / batch) ** 2)


@dataclass(frozen=True)
class RunPlan:
    """The parameters of one AC-SA run over ``records`` records.

    The run has T = ``steps`` batches; the first ``records mod T`` have ``⌊records/T⌋ + 1`` records,
    the rest ``⌊records/T⌋``, so every record of the run enters exactly one batch.
    ``smoothing`` is the Moreau parameter β_s (the oracle uses envelope gradients) or ``None``.
    ``predicted_error`` is the run's excess-loss bound used to plan the next phase (Thm 4.8).
    """

    records: int
    steps: int
    smoothing: float | None
    sizes: StepSizes
    predicted_error: float

    def batch_size(self, t: int) -> int:
        """Size of batch t (1-based)."""
        base, extra = divmod(self.records, self.steps)
        return base + 1 if t <= extra else base


def effective_gradient_bound(loss: Loss, feature_bound: float, radius: float, gradient_bound: float | None) -> float:
    """The norm every per-record gradient is clipped to: min(C, L), with L the loss's worst-case
    bound over Θ (:meth:`panpriv.protocols.losses.Loss.lipschitz`) and C the declared ``gradient_bound``
    (``None``: no bound beyond L).

    Clipping ``φ'(⟨θ, z⟩, y)·z`` to norm C clips the scalar derivative φ' to ±C/‖z‖; for a convex
    φ this is again the non-decreasing derivative of a convex function of ⟨θ, z⟩ (φ "Huberised"
    beyond the points where |φ'| = C/‖z‖), which is C-Lipschitz and no less smooth than φ. So a
    learner with C < L optimises that convex surrogate exactly as the theorems assume, with
    sensitivity from C (the DP-SGD practice of Abadi et al. 2016, with a convexity argument). The
    surrogate has the same minimiser as the loss whenever |φ'| ≤ C/‖z‖ at θ* for (almost) every
    record — e.g. a well-specified linear model whose noise is bounded by C/R — and otherwise
    trades a bias for less noise: a utility choice, never a privacy one.
    """
    lipschitz = loss.lipschitz(feature_bound, radius)
    return lipschitz if gradient_bound is None else min(lipschitz, gradient_bound)


Smoothing = Literal["auto", "moreau", "none"]
SMOOTHING: tuple[Smoothing, ...] = ("auto", "moreau", "none")
"""The ``smoothing`` choices of the AC-SA learners."""


def uses_moreau(owner: str, loss: Loss, smoothing: str) -> bool:
    """Whether to optimise the Moreau envelope (Cheu et al. 2022, Def. 4.5, Lemma 4.6) instead of the loss.

    ``"auto"``: for non-smooth losses only (Thm 4.7 / C.3 cases 1 and 3); ``"moreau"``: always
    (needs a closed-form prox); ``"none"``: never (needs a smooth loss). Raises
    :class:`InvalidInputError` naming ``owner``'s ``smoothing`` parameter otherwise.
    """
    check.choice(owner, "smoothing", smoothing, SMOOTHING)
    if smoothing == "none" and not loss.smooth:
        raise InvalidInputError(
            check.message(owner, "smoothing", f"'auto' or 'moreau' for the non-smooth {loss.name} loss", smoothing)
        )
    if smoothing == "moreau" and not loss.has_prox:
        raise InvalidInputError(
            check.message(owner, "smoothing", f"'auto' or 'none' for the {loss.name} loss (no closed-form prox)", smoothing)
        )
    return smoothing == "moreau" or (smoothing == "auto" and not loss.smooth)


def record_gradients(loss: Loss, theta_md: Array, Z: Array, y: Array, plan: RunPlan, lipschitz: float) -> Array:
    """Per-record gradients at θ^md for a run: of the loss, or of its β_s-Moreau envelope when the
    plan smooths (Cheu et al. 2022 Lemma 4.6 item 2, via :meth:`panpriv.protocols.losses.Loss.envelope_gradient`),
    each clipped to norm ``lipschitz``. Shape (m, p); the ridge term is not included.

    The clip is a no-op up to rounding when ``lipschitz`` is the loss's L over Θ (θ^md ∈ Θ); it
    makes a per-record bound — and so a sensitivity — hold by construction.
    """
    if plan.smoothing is None:
        G = loss.gradient(theta_md, Z, y)
    else:
        G = loss.envelope_gradient(theta_md, Z, y, plan.smoothing)
    return clip_rows(G, lipschitz)


BatchRule = Literal["glm", "worst-case"]
BATCH_RULES: tuple[BatchRule, ...] = ("glm", "worst-case")

GLM_REFERENCE_DIM = 20
"""The dimension at which the batch constants were measured (:class:`Tuning`: d = 20): the GLM
rule keeps the noise term's dimension at min(p, this)."""


def noise_dimension(problem: Problem, rule: BatchRule) -> float:
    """The p in the batch rule's noise term √p ν L.

    ``"worst-case"``: p, the number of parameters (Cheu et al. 2022, proof of Thm 4.3): the noise
    Z of a batch-mean gradient has E‖Z‖² = p ν² L²/b², and the smoothness step of the analysis
    charges all of it.

    ``"glm"``: min(p, :data:`GLM_REFERENCE_DIM`). For a loss ℓ(θ; z, y) = φ(⟨θ, z⟩, y) — every loss
    here — one step's noise moves the loss only through ⟨Z, z⟩: F(θ + Z) − F(θ) ≈ ⟨∇F, Z⟩ +
    ½ E[φ''·⟨Z, z⟩²] ≤ ⟨∇F, Z⟩ + ½ sup φ''·ζ² E‖z‖², which does not grow with p, where the
    worst-case bound ½ β E‖Z‖² = ½ sup φ''·R² p ζ² does (the dimension-free view of private GLMs:
    Song, Thakkar & Thakurta 2021, arXiv:2006.06783). The rule keeps the noise term at the
    dimension where :class:`Tuning`'s constants were measured, so below it both rules agree.

    Measured (``benchmarks/utility_shapes.py``): the argument misses what the iterates carry. The
    noise of all steps accumulates in θ in every direction, ‖Σγ_t Z_t‖ grows like √p, and the
    projection onto Θ then shrinks the signal too; smaller batches add more of it. On the
    synthetic streams the GLM rule's excess loss was 1.3–1.6× the worst-case rule's at d = 100 and
    about 5× at d = 1000; on Adult and on a one-hot stream the two were within noise of each
    other. So ``"worst-case"`` is the default. Either rule is a planning choice: the guarantee
    does not depend on it (each batch's noise is calibrated to its own b).
    """
    if rule == "worst-case":
        return float(problem.dim)
    return float(min(problem.dim, GLM_REFERENCE_DIM))


def batch_rule_line(problem: Problem, rule: BatchRule) -> str:
    """What ``panpriv privacy`` says about the batch rule in use."""
    if rule == "worst-case":
        return (f"batch rule: worst-case (noise term of dimension p = {problem.dim}; Cheu et al. 2022, Thm 4.3; "
                "--set batch_rule=glm: min(p, 20))")
    return (
        f"batch rule: glm (noise term of dimension min(p, {GLM_REFERENCE_DIM}) = {noise_dimension(problem, rule):g} "
        f"for p = {problem.dim}: the loss is phi(<theta, z>, y))"
    )


def _batch_size(
    problem: Problem, records: int, distance: float, beta: float, tuning: Tuning, rule: BatchRule = "worst-case"
) -> int:
    """b = C_b n^e (√p ν L / (β D))^{2/5}, clamped to [1, n] (Cheu et al. 2022, proof of Thm 4.3: e = 3/5),
    with p = :func:`noise_dimension` of ``rule``.

    It balances β D² b²/n² (acceleration term with T = n/b) against the privacy term
    D √p ν L/√(b n); with no noise (ν = 0) every record is its own batch.
    """
    noise = math.sqrt(noise_dimension(problem, rule)) * problem.noise_multiplier * problem.lipschitz
    b = tuning.batch * records**tuning.batch_exponent * (noise / (beta * distance)) ** 0.4
    return int(min(records, max(1, round(b))))


def _smoothing(problem: Problem, records: int, distance: float, tuning: Tuning) -> float:
    """β_s = C_s L n^{2/3} / (D (√p ν)^{2/3}) (Cheu et al. 2022, proof of Thm 4.7 with the pan-private
    variance), capped at L n / D — where the smoothing error L²/(2β_s) is already below the
    statistical term L D/√n, so a larger β_s only shortens the steps (and ν = 0 needs a cap)."""
    L = problem.lipschitz
    cap = L * records / distance
    noise = math.sqrt(problem.dim) * problem.noise_multiplier
    if noise == 0.0:
        return cap
    return min(cap, tuning.smoothing * L * records ** (2.0 / 3.0) / (distance * noise ** (2.0 / 3.0)))


def plan_run(
    problem: Problem,
    records: int,
    distance: float,
    *,
    moreau: bool,
    batch_size: int | None = None,
    tuning: Tuning = DEFAULT_TUNING,
    batch_rule: BatchRule = "worst-case",
) -> RunPlan:
    """Parameters of one AC-SA run over ``records`` records starting within ``distance`` of θ*.

    ``moreau=True`` plans a Moreau-smoothed run (Cheu et al. 2022, Thm 4.7): gradients of the β_s-envelope,
    whose smoothness is β_s. ``batch_size`` overrides the planned b (clamped to the run length);
    ``batch_rule`` picks the noise term's dimension (:func:`noise_dimension`).
    Predicted excess loss (Lan 2012 Cor. 1 form, Cheu et al. 2022 Lemma 4.4, plus Lemma 4.6 item 3):
    ``C_E (β D² / T² + D σ(b)/√T + [L²/(2β_s)])``.
    """
    L = problem.lipschitz
    beta_s = _smoothing(problem, records, distance, tuning) if moreau else None
    # The envelope of a β-smooth term is min(β, β_s)-smooth; of a non-smooth one, β_s-smooth.
    beta = (problem.smoothness if beta_s is None else min(beta_s, problem.smoothness)) + problem.ridge
    if batch_size is None:
        b = _batch_size(problem, records, distance, beta, tuning, batch_rule)
    else:
        b = min(records, batch_size)
    steps = records // b
    sigma = problem.oracle_std(b)
    sizes = StepSizes(steps, beta, sigma, distance, tuning.noise_step)
    error = beta * distance**2 / steps**2 + distance * sigma / math.sqrt(steps)
    if beta_s is not None:
        error += L * L / (2.0 * beta_s)
    return RunPlan(records, steps, beta_s, sizes, tuning.error * error)


def phase_count(records: int) -> int:
    """k = ⌈log₂ log₂ n⌉ phases (at least 1) for the strongly convex reduction (Cheu et al. 2022, Thm 4.8:
    "k = O(log log n)")."""
    if records < 4:
        return 1
    return max(1, math.ceil(math.log2(math.log2(records))))


def plan_runs(
    problem: Problem,
    records: int,
    *,
    moreau: bool,
    batch_size: int | None = None,
    tuning: Tuning = DEFAULT_TUNING,
    batch_rule: BatchRule = "worst-case",
) -> tuple[RunPlan, ...]:
    """The runs that process ``records`` records: one for convex losses, the k phases of Cheu et al. 2022
    Thm 4.8 for λ-strongly convex ones (λ = ``problem.strong_convexity`` > 0).

    Phases (Cheu et al. 2022, Thm 4.8 and its proof): k = :func:`phase_count` disjoint runs of about n/k
    records, each warm-started from the previous output. Phase i is planned for the distance
    ``D_i``: ``D_1 = min(D, L_F/λ)`` with ``L_F = L + λ_r r`` (for θ* minimising the λ-strongly
    convex objective F over Θ, λ‖θ − θ*‖² ≤ ⟨∇F(θ), θ − θ*⟩ ≤ L_F ‖θ − θ*‖), and
    ``D_{i+1} = min(D_i, √(2 Δ_i/λ))`` where Δ_i is the predicted excess loss of phase i
    (strong convexity: λ/2 ‖θ − θ*‖² ≤ F(θ) − F(θ*)). The D_i are functions of public constants
    only, so they cost no privacy.
    """
    lam = problem.strong_convexity
    if lam <= 0.0:
        return (plan_run(problem, records, problem.diameter, moreau=moreau, batch_size=batch_size, tuning=tuning,
                         batch_rule=batch_rule),)
    k = min(phase_count(records), records)
    base, extra = divmod(records, k)
    distance = min(problem.diameter, (problem.lipschitz + problem.ridge * problem.radius) / lam)
    plans = []
    for i in range(k):
        plan = plan_run(
            problem, base + (1 if i < extra else 0), distance, moreau=moreau, batch_size=batch_size, tuning=tuning,
            batch_rule=batch_rule,
        )
        plans.append(plan)
        distance = min(distance, math.sqrt(2.0 * plan.predicted_error / lam))
    return tuple(plans)
