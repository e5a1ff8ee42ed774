"""Projected noisy SGD with privacy amplification by iteration: online and shuffled (Sordello et al. 2021).

Both learners run, one record at a time, the PNSGD update of Sordello et al. 2021 (Sec. 1)

    w_{t+1} = Π_K(w_t − η(∇ℓ(w_t; x_{t+1}) + Z_{t+1})),

over K = the ℓ2 ball of radius r (diameter D = 2r), with ℓ = φ + (λ/2)‖w‖² one of the smooth
losses of :mod:`panpriv.protocols.losses` (β-smooth, ρ = λ-strongly convex, data gradients clipped to the
loss's Lipschitz constant L). The noise Z_t is Gaussian N(0, σ_t² I) or, for a one-parameter model
only (K = [−r, r]), Laplace L(0, v_t). The step w ↦ w − η∇ℓ(w) is M-Lipschitz for η ≤ 2/β
(:func:`panpriv.accounting.iteration.contraction`), which is what amplification by iteration needs, so
the constructors refuse η > 2/β and non-smooth losses.

Accounting follows what is released (Sordello et al. 2021, Thm 1 and Sec. 5). A record at position i is hidden by
its own noisy step (factor A_i = θ_{e^ε}(2L/σ_i)) and then by every later step until the first
released iterate w_{s(i)}, each contracting the hockey-stick divergence by B_t = θ_{e^ε}(MD/(ησ_t)):
δ_i = A_i ∏_{t=i+1}^{s(i)} B_t. Later releases are post-processing of w_{s(i)} together with
independent records and noise. Sordello et al. 2021 assumes every intermediate iterate stays hidden; here every
``snapshot()`` is a release and the learners record where it happened (``_note_release``).

- :class:`OnlinePNSGD` (``"pnsgd"``): the decaying noise of Sordello et al. 2021, Thm 7 (Gaussian) or Thm 6 (Laplace,
  d = 1), optionally floored for pan-privacy. Because its noise never increases along the stream,
  the least protected released record is the one just before the last release (proof in
  :meth:`OnlinePNSGD.privacy`), so the accounting is O(1) per release.
- :class:`ShuffledPNSGD` (``"shuffled-pnsgd"``): one pass over a recorded stream of n records in
  the order of a uniformly random permutation, with the fixed noise of Sordello et al. 2021, Thm 5 (Gaussian) or
  Thm 4 (Laplace, d = 1) and the guarantee of Sordello et al. 2021, Thm 2, extended to intermediate snapshots.

Pan-privacy (Cheu et al. 2022, Def. C.2). The internal state is the current iterate w_t (plus counters and the
last released parameters). An intruder who reads it right after record i's step sees w_i, which
depends on record i through that one noisy step only: the intrusion guarantee is (ε, A_i) — no
amplification at all. Under the decaying schedule A_i → 1, and the learners say so; the
``pan_delta`` floor of :class:`OnlinePNSGD` keeps every step (ε, pan_delta)-DP instead.

References
----------
Sordello, Bu, Dong & Su (2021), "Privacy amplification via iteration for shuffled and online PNSGD"
(docs/references.md): Thm 1 (from Asoodeh, Diaz, Calmon 2020, Thms 3–4), Thm 2 and App. A,
Thms 4–7, App. B–F. Cheu, Joseph, Mao & Peng (2022), Def. C.2 (pan-privacy). Balle & Wang (2018),
Thm 8 (analytic Gaussian, for the pan floor).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.bisection import least_passing
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.iteration import (
    OnlineLimit,
    contraction,
    fixed_laplace_scale,
    fixed_sigma,
    gaussian_online_delta_star,
    laplace_online_delta_star,
    online_laplace_scale,
    online_sigma,
    pnsgd_delta,
    pnsgd_laplace_delta,
    shuffled_pnsgd_delta,
    shuffled_pnsgd_laplace_delta,
)
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import scratch
from panpriv.protocols import validation as check
from panpriv.protocols.base import Learner, StateValue, check_batch
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.pan_acsa import SENSITIVITY_SLACK
from panpriv.protocols.randomness import NOISE_BLOCK_ROWS, RngLike
from panpriv.protocols.recorded import Fetch, RecordedLearner
from panpriv.protocols.scalar_residue import scrub_freed_floats
from panpriv.protocols.scratch import BLOCK_ROWS

Array = NDArray[np.float64]

Noise = Literal["gaussian", "laplace"]
NOISES: tuple[Noise, ...] = ("gaussian", "laplace")

Schedule = Literal["floor", "sordello"]
SCHEDULES: tuple[Schedule, ...] = ("floor", "sordello")
"""The noise level of each step: ``"floor"``, the pan floor alone (every step (ε, δ_pan)-DP, the
whole guarantee); ``"sordello"``, Sordello et al. 2021's schedule (Thm 7/6 online, Thm 5/4
shuffled), raised to the pan floor when ``pan_delta`` is set."""

PLANNING_STEPS = 10_000
"""Steps the default step size of :class:`OnlinePNSGD` is planned for when no horizon is given."""

DELTA_ROUNDING = 1e-9
"""Relative margin added to every reported δ. θ_γ is evaluated to about 1e-13 relative and products
of many factors add rounding; the margin keeps the printed δ an upper bound (it is far below any
difference that matters)."""

_COMMON_ARRAYS = ("theta", "released")


@dataclass(frozen=True)
class IterationModel:
    """The constants amplification by iteration is accounted with (Sordello et al. 2021, Thm 1).

    ``lipschitz`` (L) bounds a clipped data gradient, so one record moves a step by at most 2L;
    ``eta`` is the step size; ``diameter`` is D of the domain K (its width for the one-parameter
    Laplace case); the loss is ``beta``-smooth and ``rho``-strongly convex, so each gradient step
    is M-Lipschitz (:func:`panpriv.accounting.iteration.contraction`). A learner's
    ``iteration_model`` gives the values its accounting uses.
    """

    lipschitz: float
    eta: float
    diameter: float
    beta: float
    rho: float

    def arguments(self) -> tuple[float, float, float, float, float]:
        """(L, η, D, β, ρ), the trailing positional arguments of the :mod:`panpriv.accounting.iteration`
        δ functions (``pnsgd_delta``, ``shuffled_pnsgd_delta`` and their Laplace forms)."""
        return (self.lipschitz, self.eta, self.diameter, self.beta, self.rho)


_SWAMP_SEARCH_LIMIT = 10**12
"""Steps searched for the end of a noise-dominated start (:meth:`_PNSGD.utility_warnings`)."""


def _rounded_up(delta: float) -> float:
    """δ with :data:`DELTA_ROUNDING` added, capped at 1."""
    return min(1.0, delta * (1.0 + DELTA_ROUNDING))


class _PNSGD(Learner):
    """What both PNSGD learners share: validation, the per-record update, release, persistence.

    Subclasses give the noise level of each step (:meth:`_scales`), the accounting
    (:meth:`privacy`, :meth:`_note_release`) and their extra state.
    """

    _owner: ClassVar[str]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str,
        epsilon: float,
        eta: float | None,
        radius: float | None,
        noise: Noise,
        feature_bound: float,
        C1: float,
        C2: float,
        pan_delta: float | None,
        schedule: Schedule,
        planned_steps: int,
        rng: RngLike,
    ) -> None:
        owner = self._owner
        self._setup_common(owner, dim, loss, radius, feature_bound, rng)
        self.epsilon = check.positive(owner, "epsilon", epsilon)
        self.noise = check.choice(owner, "noise", noise, NOISES)
        self.C1 = check.positive(owner, "C1", C1)
        self.C2 = check.nonnegative(owner, "C2", C2)
        if not self.loss.smooth:
            raise InvalidInputError(check.message(
                owner, "loss", "a smooth loss (logistic, squared or huber): amplification by iteration "
                "needs the gradient step to be a contraction (Sordello et al. 2021, Thm 1)", self.loss.name,
            ))
        if self.noise == "laplace" and self._params != 1:
            raise InvalidInputError(check.message(
                owner, "noise", f"'gaussian' for a model with {self._params} parameters: Sordello et al. 2021 proves the "
                "Laplace case (Thm 1, Eq. (4); Thms 4, 6) only for K = [a, b], one parameter", self.noise,
            ))
        self._lipschitz = self.loss.lipschitz(self.feature_bound, self.radius)
        self._beta = self.loss.smoothness(self.feature_bound) + self.loss.ridge
        self._rho = self.loss.ridge
        self.pan_delta = None if pan_delta is None else check.open_unit(owner, "pan_delta", pan_delta)
        self.schedule = check.choice(owner, "schedule", schedule, SCHEDULES)
        if self.schedule == "floor" and self.pan_delta is None:
            raise InvalidInputError(check.message(
                owner, "pan_delta", "a float in (0, 1) with schedule='floor' (the floor is then the whole noise)", None
            ))
        self._floor = 0.0 if self.pan_delta is None else self._pan_floor(self.pan_delta)
        self.eta = self._default_eta(planned_steps) if eta is None else check.positive(owner, "eta", eta)
        self._contraction = self._accounting_call(contraction, self.eta, self._beta, self._rho)
        if self.noise == "laplace" and self.pan_delta is not None:
            self._floor = self._rounded_laplace_floor(self._floor, self.pan_delta)
        self._last_release = 0
        self._theta = np.zeros(self._params)
        self._released = np.zeros(self._params)

    # -- the pan floor and the default step size --------------------------------------------

    def _floor_target(self, pan_delta: float) -> float:
        """δ_pan (1 − 2·DELTA_ROUNDING): the reported (rounded-up) A then stays ≤ δ_pan."""
        return pan_delta * (1.0 - 2.0 * DELTA_ROUNDING)

    def _pan_floor(self, pan_delta: float) -> float:
        """Smallest noise level whose single step is (ε, :meth:`_floor_target`)-DP with sensitivity
        2L (L with the sensitivity slack); for Laplace the closed form, which
        :meth:`_rounded_laplace_floor` raises past rounding once η is known."""
        target = self._floor_target(pan_delta)
        sensitivity = 2.0 * self._lipschitz * (1.0 + SENSITIVITY_SLACK)
        if self.noise == "gaussian":
            return self._accounting_call(analytic_sigma, self.epsilon, target, sensitivity)
        # Laplace (Sordello et al. 2021, Eq. (4)): A = (1 − e^{(ε − 2L/v)/2})_+ = target  ⇔  v = 2L/(ε − 2 log(1 − target)).
        return sensitivity / (self.epsilon - 2.0 * math.log1p(-target))

    def _rounded_laplace_floor(self, scale: float, pan_delta: float) -> float:
        """The Laplace floor stepped up until the computed A is at most the target (rounding)."""
        target = self._floor_target(pan_delta)
        while self._step_delta(scale) > target:
            scale = math.nextafter(scale, math.inf)
        return scale

    def _default_eta(self, steps: int) -> float:
        """η = r/(G√T), at most 2/β: projected SGD's step for T steps whose noisy gradients have
        E‖g + Z‖² ≤ G² = L² + p·s², s the floor's standard deviation per coordinate (Laplace:
        √2 v). The textbook choice minimising r²/(2ηT) + ηG²/2 (the averaged iterate's bound;
        e.g. Bubeck 2015, Thm 6.1); it reads only public quantities (radius, L, the floor, p, the
        planned T). With the floor the step's noise moves the iterate by about r/√T·√p s/G ≤ r/√T
        per step, so the T steps' noise, a random walk, stays near the radius, and the gradients'
        drift decides where the iterate goes. Measured at d = 5, n = 12,000, ε = 1 (12 runs each;
        docs/privacy.md, "pnsgd"): hold-out log-loss 0.51–0.83 against θ = 0's 0.69, the best median
        of this η, η/3.3 and η/10 (the smallest never worse than θ = 0, never much better)."""
        std = self._floor if self.noise == "gaussian" else math.sqrt(2.0) * self._floor
        squared = self._lipschitz**2 + self._params * std**2
        return min(self.radius / math.sqrt(steps * squared), 2.0 / self._beta)

    # -- accounting helpers ------------------------------------------------------------------

    def _accounting_call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Call an :mod:`accounting` function, re-raising its parameter errors under this learner."""
        try:
            return function(*args)
        except InvalidParameterError as error:
            raise InvalidInputError(check.message(self._owner, error.name, error.constraint, error.value)) from None

    @property
    def iteration_model(self) -> IterationModel:
        """The accounted constants, with L and D inflated by
        :data:`panpriv.protocols.pan_acsa.SENSITIVITY_SLACK`: clipping to L and projecting onto the ball are
        exact only up to rounding, and θ increases in both."""
        slack = 1.0 + SENSITIVITY_SLACK
        return IterationModel(self._lipschitz * slack, self.eta, self._ball.diameter * slack, self._beta, self._rho)

    def _noise_to_radius(self, level: float) -> float:
        """η·(rms norm of one step's noise vector)/radius: the noise's size against the domain's
        (a Laplace coordinate of scale v has standard deviation √2·v)."""
        std = level if self.noise == "gaussian" else math.sqrt(2.0) * level
        return self.eta * std * math.sqrt(self.loss.param_dim(self.dim)) / self.radius

    def utility_warnings(self) -> tuple[str, ...]:
        """A warning when one step's noise alone moves the iterate by at least the radius for the
        first :meth:`_swamped_steps` steps: the iterate, and so every snapshot, is then mostly noise.

        Why it matters: with Sordello et al. 2021's schedules the noise per step is set by the
        privacy target, not by the data, and on real data (issue 6's and 17's measurements) every
        such PNSGD run scored below releasing θ = 0. A user should know before running it."""
        first = self._noise_to_radius(float(self._scales(0, 1)[0]))
        if first < 1.0:
            return ()
        swamped = self._swamped_steps()
        if swamped is None:
            span, remedy = "at every step", "only a larger epsilon lowers it"
        else:
            span = f"for the first {swamped:,} steps"
            remedy = f"a larger epsilon lowers it, and a stream much longer than {swamped:,} records dilutes it"
        return (
            f"{self.name}: one step's noise alone moves the iterate by {first:.3g} x the radius of its ball at step 1, "
            f"and by at least the radius {span}; a model released then is close to a random point of the ball "
            f"(expect accuracy near chance). The noise scales with radius/eta, so neither changes this; {remedy}. "
            "`panpriv privacy` shows the noise per step.",
        )

    def _swamped_steps(self) -> int | None:
        """The last step whose noise moves the iterate by at least the radius (the schedule never
        increases), or None if every step's does (a fixed level or the pan floor)."""
        def swamped(step: int) -> bool:
            return self._noise_to_radius(float(self._scales(step - 1, 1)[0])) >= 1.0

        last = _SWAMP_SEARCH_LIMIT
        if swamped(last):
            return None
        # swamped(1), not swamped(last): the first step that is not swamped, less one
        return least_passing(1, last, lambda step: not swamped(step)) - 1

    def _step_delta(self, scale: float) -> float:
        """A = δ(ε) of one step with noise level ``scale`` (Sordello et al. 2021, Eq. (3) or (4)), unrounded."""
        single = pnsgd_delta if self.noise == "gaussian" else pnsgd_laplace_delta
        return self._accounting_call(single, self.epsilon, [scale], 1, *self.iteration_model.arguments())

    # -- learning ------------------------------------------------------------------------------

    @abc.abstractmethod
    def _scales(self, start: int, count: int) -> Array:
        """Noise levels σ_t (or v_t) of steps ``start + 1 … start + count`` (1-based)."""

    def _check_room(self, count: int) -> None:
        """Hook: refuse records the learner cannot take (ShuffledPNSGD after its pass)."""

    def learn_many(self, X: Array, y: Array) -> None:
        """One PNSGD step per record, in the order given (Sordello et al. 2021, Sec. 1).

        Features, labels and the noise levels are prepared for the whole micro-batch; the steps
        themselves are sequential. The noise of a sub-block of at most
        :data:`panpriv.protocols.randomness.NOISE_BLOCK_ROWS` records in flight is drawn from one keyed
        generator at the sub-block's start (zeroed right after), each record's row of it is zeroed
        as soon as its step has used it, and the buffer is zeroed with the scratch: a read between
        two steps of the sub-block finds noise of in-flight records only, whose features are in
        memory anyway (why every other record keeps its guarantee: :mod:`panpriv.protocols.randomness`).
        Between micro-batches nothing but the iterate remains.
        """
        X, y = check_batch(self._owner, X, y, self.dim)
        if X.shape[0] == 0:
            return
        self._check_room(X.shape[0])
        scales = self._scales(self._records, X.shape[0])
        spare = np.zeros(self._params)
        try:
            for start in range(0, X.shape[0], BLOCK_ROWS):
                rows = slice(start, start + BLOCK_ROWS)
                Z, labels, norms = scratch.features_with_norms(self.loss, X[rows], y[rows], self.feature_bound,
                                                               self._scratch)
                for first in range(0, Z.shape[0], NOISE_BLOCK_ROWS):
                    last = min(first + NOISE_BLOCK_ROWS, Z.shape[0])
                    noise = self._draw_steps_noise(scales[start + first : start + last], Z.shape[1])
                    spare = self._steps(Z[first:last], norms[first:last], labels[first:last], noise, spare)
        finally:
            if spare is not self._theta:
                spare.fill(0.0)  # the iterate before the last step (noisy, but not the state)
            self._scratch.wipe()
            scrub_freed_floats()  # the steps' margins and slopes, Python floats (panpriv.protocols.scalar_residue)

    def _draw_steps_noise(self, scales: Array, params: int) -> Array:
        """η·Z_t for the steps of one sub-block, row by row (Z_t ~ N(0, σ_t² I), or Laplace with
        scale v_t), drawn from one keyed generator into a scratch buffer (wiped by
        :meth:`learn_many`; each row also by :meth:`_steps` once used). The draws are those of
        per-step ``normal(0, σ_t)``/``laplace(0, v_t)`` calls, in order, up to rounding of the
        scaling (σ·η·N instead of η·(σ·N))."""
        noise = self._scratch.take("step_noise", scales.size, params)
        with self._noise.draw() as generator:
            if self.noise == "gaussian":
                generator.standard_normal(out=noise)
            else:
                drawn = generator.laplace(0.0, 1.0, size=noise.shape)  # no out= in numpy
                np.copyto(noise, drawn)
                drawn.fill(0.0)
        weights = self._scratch.take("step_noise_weights", scales.size)
        np.multiply(scales, self.eta, out=weights)
        noise *= weights[:, None]
        return noise

    def _steps(self, Z: Array, norms: Array, labels: Array, noise: Array, spare: Array) -> Array:
        """w ← Π_K(w − η(∇φ(w; z) clipped to L + λw) − ηZ) for each record of a sub-block, in order
        (rows of ``Z`` with norms ``norms`` and ``labels``; ``noise`` holds ηZ_t per row). Returns
        the buffer that is free after the last step (the iterate and ``spare`` alternate).

        The loss is a GLM, ℓ(w; z) = φ(⟨w, z⟩, y), so the gradient is φ′·z with norm |φ′|·‖z‖:
        clipping to L scales φ′ by min(1, L/(|φ′|·‖z‖)), computed from the scalar φ′ and the row's
        norm without forming or re-measuring the gradient (the same clip as
        :func:`panpriv.protocols.scratch.clipped_gradients` up to rounding, which the sensitivity slack of
        :attr:`iteration_model` covers). φ′ is computed on Python floats for the smooth losses
        (:func:`panpriv.protocols.scratch.scalar_dphi`; the array form's value to within a few ulps). The new iterate is built in
        ``spare`` with ``out=`` operations: −ηφ′z, + (1 − ηλ)w, − ηZ_t; the used noise row is zeroed
        at once; the projection is :meth:`panpriv.protocols.geometry.L2Ball.project`'s."""
        w = self._theta
        dphi = scratch.scalar_dphi(self.loss)
        eta, lipschitz, radius = self.eta, self._lipschitz, self.radius
        keep = 1.0 - eta * self.loss.ridge  # (1 − ηλ): the ridge gradient's share of the step
        ridge_term = self._scratch.take("update", Z.shape[1]) if keep != 1.0 else None
        margin = self._scratch.take("margin", 1)
        for k, (z, drawn) in enumerate(zip(Z, noise)):
            if dphi is None:
                margin[0] = z @ w
                slope = float(self.loss._dphi(margin, labels[k : k + 1])[0])
            else:
                slope = dphi(float(z.dot(w)), labels.item(k))
            gradient_norm = abs(slope) * norms.item(k)
            if gradient_norm > lipschitz:
                slope *= lipschitz / gradient_norm
            if ridge_term is not None:
                np.multiply(z, -eta * slope, out=ridge_term)
                np.multiply(w, keep, out=spare)
                spare += ridge_term
            else:
                np.multiply(z, -eta * slope, out=spare)
                spare += w
            spare -= drawn
            drawn.fill(0.0)
            norm = math.sqrt(float(spare.dot(spare)))
            if norm > radius:
                spare *= radius / norm
            w, spare = spare, w
            self._theta = w
            self._records += 1
        return spare

    # -- outputs -------------------------------------------------------------------------------

    def release(self) -> Array:
        """The current iterate w_t, what a snapshot publishes (Sordello et al. 2021 releases the last iterate; an
        average of iterates would depend on the hidden intermediate ones)."""
        return self._theta.copy()

    def _note_release(self) -> None:
        """Record the release: its position (for the accounting) and its parameters (for
        :meth:`predict_many`); :meth:`snapshot` calls this right after :meth:`release`."""
        self._last_release = self._records
        self._released = self._theta.copy()

    def _prediction_params(self) -> Array:
        """The parameters of the last snapshot (zeros before the first): predictions from the
        current iterate would be an unaccounted release (the accounting depends on which
        iterates leave the learner)."""
        return self._released

    @property
    def records_seen(self) -> int:
        return self._records

    def _guarantee(self, delta: float) -> Guarantee:
        """(ε, δ) with δ rounded up by :data:`DELTA_ROUNDING`."""
        return Guarantee(self.epsilon, _rounded_up(delta))

    def _common_assumptions(self) -> list[str]:
        m = self._contraction
        return [
            "neighbouring streams differ in one record (replacement); stream positions, counts and "
            "the positions of snapshots are public and do not depend on the records",
            f"features clipped to norm {self.feature_bound:g} and per-record gradients to norm "
            f"L = {self._lipschitz:.6g} ({self.loss.name} loss), so one record moves a step's "
            "gradient by at most 2L",
            f"K is the l2 ball of radius {self.radius:g} (D = {self._ball.diameter:g}); the loss is "
            f"beta = {self._beta:.6g}-smooth and rho = {self._rho:.6g}-strongly convex, eta = {self.eta:g} "
            f"<= 2/beta, so each gradient step is M = {m:.6g}-Lipschitz (Sordello et al. 2021, Thm 1)",
            "only snapshots leave the learner (predictions use the last snapshot); each is the "
            "current iterate, and the iterates between snapshots stay hidden",
            "the intruder reads the internal state (the iterate) at most once, between two record "
            "updates; the noise of each sub-block of at most 128 steps comes from one generator keyed from OS "
            "entropy at its start and zeroed after its draw (a read inside a micro-batch finds the records in "
            "flight and their noise, and gives them no guarantee; every other record keeps this one as far as the "
            "learner's memory goes — a service's statement adds what its input path keeps)",
        ]

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """Counters (records, position of the last snapshot), the noisy iterate and the last
        released parameters; no record, no generator, no permutation."""
        return {
            "records": self._records,
            "last_release": self._last_release,
            "theta": self._theta.copy(),
            "released": self._released.copy(),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        owner = f"{self._owner}.load_state_dict"
        missing = {"records", "last_release", *_COMMON_ARRAYS} - set(state)
        if missing:
            raise InvalidInputError(f"{owner}: state lacks {sorted(missing)}")
        records = _counter(owner, "records", state["records"])
        last_release = _counter(owner, "last_release", state["last_release"])
        if last_release > records:
            raise InvalidInputError(check.message(owner, "last_release", f"an int <= records = {records}", last_release))
        arrays = {}
        for key in _COMMON_ARRAYS:
            array = np.array(state[key], dtype=np.float64, copy=True)
            if array.shape != (self._params,) or not np.all(np.isfinite(array)):
                raise InvalidInputError(
                    f"{owner}: {key!r} must be {self._params} finite floats; got shape {array.shape}"
                )
            arrays[key] = array
        self._records, self._last_release = records, last_release
        self._theta, self._released = arrays["theta"], arrays["released"]


def _counter(owner: str, key: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidInputError(check.message(owner, key, "an int >= 0", value))
    return int(value)


class OnlinePNSGD(_PNSGD):
    """Online PNSGD with the decaying noise of Sordello et al. 2021, Thm 7 (Gaussian) or Thm 6 (Laplace, d = 1).

    Parameters
    ----------
    dim
        Number of raw features d (one more parameter with an intercept).
    loss
        A smooth :class:`panpriv.protocols.losses.Loss` (logistic, squared, huber), its name or its config dict; a name (``"logistic"``) or a config dict
        without ``intercept`` learns an intercept (:func:`panpriv.protocols.losses.learner_loss`: the model ``panpriv run``
        learns from the same settings). Default: ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon
        ε > 0 at which δ is reported; default 1 (:mod:`panpriv.protocols.defaults`).
    eta
        Learning rate η ∈ (0, 2/β], β the smoothness of the loss (data term plus ridge). ``None``
        (default): r/(G√T) for T = ``horizon`` steps (:data:`PLANNING_STEPS` without one), G² = L² + p s²
        with s the pan floor's standard deviation (:meth:`_PNSGD._default_eta`), at most 2/β.
    radius
        Radius r of K, the ℓ2 ball of parameters (D = 2r; for one parameter, K = [−r, r]);
        ``None`` (default): r = √d, never below 1 (:func:`panpriv.protocols.base.default_radius`).
    noise
        ``"gaussian"`` (Thm 7) or ``"laplace"`` (Thm 6; only for a one-parameter model).
    alpha
        Decay exponent α > 1 of the schedule.
    C1, C2
        Schedule constants of Thms 6–7 (defaults: Sordello et al. 2021, App. G's online setting, C1 = C2 = 100).
        Larger C1 means more noise and smaller δ; C2 bounds the noise of the first steps. The
        Laplace schedule needs 1/C1 + C2 > 1.
    pan_delta
        δ_pan ∈ (0, 1) (default 1e-6, the service's δ, which the service passes here) or ``None``:
        noise floor σ_t ≥ σ_pan (v_t ≥ v_pan) making every single step (ε, δ_pan)-DP with
        sensitivity 2L, hence a pan-private guarantee: outputs and one intrusion are (ε, δ_pan).
    feature_bound
        R: features are clipped to norm R.
    horizon
        The planned number of records T (public), for the default η; ``None``: :data:`PLANNING_STEPS`.
    schedule
        ``"floor"`` (default): every step's noise is the pan floor (needs ``pan_delta``);
        ``"sordello"``: Sordello et al. 2021's decaying schedule (Thm 7/6), raised to the floor if
        ``pan_delta`` is set. With a floor the guarantee is (ε, δ_pan) either way, and Thm 7's
        early steps add noise of the order of the diameter D (Notes), so ``"floor"`` is the
        useful default; ``"sordello"`` is the paper's online mechanism (and restores checkpoints
        written before this option existed).
    rng
        ``None`` (default): each noise draw from a fresh OS-entropy generator. A seed or generator:
        the labelled replay/testing mode, without a pan-private guarantee.

    Notes
    -----
    Noise schedule (Sordello et al. 2021, Thm 7): σ_j = M D/(2η √W(j^{2α}/(2πC1²) + C2)), W the Lambert W function;
    (Thm 6): v_j = M D/(2η log(j^α/C1 + C2)); with ``pan_delta``, σ_j ← max(σ_j, σ_pan), where
    σ_pan = :func:`panpriv.accounting.gaussian.analytic_sigma` (ε, δ_pan, 2L) and, for Laplace,
    v_pan = 2L/(ε − 2 log(1 − δ_pan)) (the root of (1 − e^{ε/2 − L/v})_+ = δ_pan, Eq. (4)).

    The noise injected into the iterate per step, ησ_j = M D/(2√W(·)), does not depend on η and
    shrinks only like D/√(α log j): it has to, for B_j = θ(2√W) = 1 − O(j^{−α}) to make the
    products of Thms 6–7 converge. The iterate therefore keeps moving on the scale of K; this is
    the price of Sordello et al.'s online guarantee, measured in ``benchmarks/utility_pnsgd.py``.

    Pan floor trade-off: with σ_pan the per-step noise stops decaying. Every step is
    (ε, δ_pan)-DP, so the intrusion guarantee and (by post-processing) the output guarantee are at
    most (ε, δ_pan) however long the stream runs; in exchange the iterate fluctuates at a
    level set by ησ_pan for ever. η then trades learning speed against that stationary noise.

    References
    ----------
    Sordello et al. 2021, Thms 1, 6, 7 and Sec. 5; App. E–F (limits δ^{*,o}). Cheu et al. 2022, Def. C.2. Balle & Wang (2018).
    """

    name = "pnsgd"
    _owner = "OnlinePNSGD"
    legacy_defaults = {"schedule": "sordello"}

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "horizon": 40},
            {"dim": 3, "loss": {"name": "logistic", "intercept": True}, "epsilon": 1.0, "eta": 2.0, "radius": 20.0,
             "schedule": "sordello", "pan_delta": None},
            {"dim": 1, "loss": {"name": "huber", "intercept": False}, "epsilon": 1.0, "eta": 0.5, "radius": 5.0,
             "noise": "laplace", "schedule": "sordello"},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        eta: float | None = None,
        radius: float | None = None,
        noise: Noise = "gaussian",
        alpha: float = 1.5,
        C1: float = 100.0,
        C2: float = 100.0,
        pan_delta: float | None = DEFAULT_DELTA,
        feature_bound: float = 1.0,
        horizon: int | None = None,
        schedule: Schedule = "floor",
        rng: RngLike = None,
    ) -> None:
        self.horizon = None if horizon is None else check.positive_int(self._owner, "horizon", horizon)
        steps = PLANNING_STEPS if self.horizon is None else self.horizon
        super().__init__(dim, loss, epsilon, eta, radius, noise, feature_bound, C1, C2, pan_delta, schedule, steps, rng)
        self.alpha = check.positive(self._owner, "alpha", alpha)
        self.noise_scales(1, 1)  # validates α > 1, M > 0 and the Laplace condition on C2

    def describe_noise(self) -> tuple[str, ...]:
        """The decaying noise level at a few steps, next to the domain's radius (Sordello et al. 2021, Thms 6-7)."""
        kind = "standard deviation" if self.noise == "gaussian" else "Laplace scale"
        steps = (1, 100, 10_000, 1_000_000)
        levels = [float(self.noise_scales(t, 1)[0]) for t in steps]
        return (
            f"every step: the gradient clipped to L = {self._lipschitz:.6g}, a step of size eta = {self.eta:g}, "
            f"{self.noise} noise, projection onto the ball of radius {self.radius:g}",
            f"noise {kind} per coordinate at step " + ", ".join(f"{t:,}: {v:.4g}" for t, v in zip(steps, levels)),
            f"  one step's noise vector (rms norm eta * std * sqrt(p)) is {self._noise_to_radius(levels[0]):.3g} x the radius at step 1",
        )

    def noise_scales(self, first: int, count: int) -> Array:
        """Noise levels of steps ``first … first + count − 1`` (1-based): σ_j (Gaussian) or v_j
        (Laplace) of Sordello et al. 2021, Thm 7 / Thm 6, floored at the pan level if ``pan_delta`` is set."""
        first = check.positive_int(self._owner, "first", first)
        count = check.positive_int(self._owner, "count", count)
        steps = np.arange(first, first + count, dtype=np.int64)
        schedule = online_sigma if self.noise == "gaussian" else online_laplace_scale
        scales = self._accounting_call(
            schedule, steps, self.alpha, self.eta, self._ball.diameter, self.C1, self.C2, self._beta, self._rho
        )
        if self.schedule == "floor":
            return np.full(count, self._floor)
        return np.maximum(scales, self._floor)

    def _scales(self, start: int, count: int) -> Array:
        return self.noise_scales(start + 1, count)

    # -- accounting ----------------------------------------------------------------------------

    def step_delta(self, position: int) -> float:
        """A_j: δ at ε of the single step that processes the record at ``position`` (1-based)."""
        position = check.positive_int(self._owner, "position", position)
        return self._step_delta(float(self.noise_scales(position, 1)[0]))

    def privacy(self) -> PrivacyReport:
        """Output and intrusion guarantees for the records processed so far.

        Output: δ = max_i δ_i over released records, δ_i = A_i ∏_{t=i+1}^{s(i)} B_t (Sordello et al. 2021, Thm 1 and
        Sec. 5, with s(i) the first snapshot at or after i). The schedule never increases the
        noise, so A_i is non-decreasing in i (θ increases in 2L/σ_i) and B_t ≤ 1; hence
        δ_i ≤ A_i ≤ A_s for every released i ≤ s = the last snapshot position, with equality for
        i = s: the maximum is exactly A_s, computed in O(1) (checked against the O(n)
        :func:`panpriv.accounting.iteration.worst_released_delta` in the tests).

        Intrusion: reading w_k right after step k exposes record k through that step alone; any
        record j ≤ k is then protected by A_j ∏_{t=j+1}^{min(s(j), k)} B_t ≤ A_j. The worst case over
        the intrusion time and the record is max_{j ≤ n} A_j = A_n (n = records so far), which
        dominates the output guarantee. With ``pan_delta`` it is at most δ_pan.
        """
        output = self.step_delta(self._last_release) if self._last_release else 0.0
        intrusion = self.step_delta(self._records) if self._records else 0.0
        theorem = "Thm 7" if self.noise == "gaussian" else "Thm 6"
        assumptions = self._common_assumptions()
        if self.schedule == "floor":
            assumptions.append(
                f"{self.noise} noise at the pan floor at every step; the least protected released record is the one "
                f"just before the last snapshot (position {self._last_release}), protected by its own step only"
            )
        else:
            assumptions.append(
                f"decaying {self.noise} noise of Sordello et al. 2021, {theorem} (alpha = {self.alpha:g}, C1 = {self.C1:g}, "
                f"C2 = {self.C2:g}); the least protected released record is the one just before the last "
                f"snapshot (position {self._last_release}), protected by its own step only"
            )
        if self.pan_delta is None:
            assumptions.append(
                "no pan floor: an intrusion right after a step sees the record of that step behind one "
                "noisy step, whose delta tends to 1 as the noise decays"
            )
        else:
            assumptions.append(
                f"pan floor: noise level >= {self._floor:.6g}, so every step is "
                f"(epsilon, {self.pan_delta:g})-DP with sensitivity 2L"
            )
        references = ["Sordello et al. 2021, Thm 1", f"Sordello et al. 2021, {theorem}", "Sordello et al. 2021, Sec. 5", "Asoodeh et al. 2020, Thms 3-4", "Cheu et al. 2022, Def. C.2"]
        if self.pan_delta is not None and self.noise == "gaussian":
            references.append("Balle & Wang 2018, Thm 8")
        return self._report(self._guarantee(output), self._guarantee(intrusion), assumptions, references)

    def planned_privacy(self) -> PrivacyReport:
        """The stream has no end, so without a pan floor the worst δ over the planned use is the
        limit of A_j as the noise decays: 1, i.e. no (ε, δ) guarantee with δ < 1. With
        ``pan_delta`` every step is (ε, δ_pan)-DP, so every output and intrusion guarantee stays
        at δ_pan (see :meth:`privacy`)."""
        # The floor keeps every step's δ at most δ_pan·(1 − 2·DELTA_ROUNDING), so the rounded-up report stays ≤ δ_pan.
        worst = Guarantee(self.epsilon, self.pan_delta if self.pan_delta is not None else 1.0)
        return self._planned(worst, worst)

    def record_delta(self, position: int, release: int | None = None) -> float:
        """δ_i = A_i ∏_{t=i+1}^{s} B_t of the record at ``position`` if its first release is the
        iterate after step ``release`` (default: the records seen so far), unrounded.

        This is the quantity of Sordello et al. 2021, Figs 1–2 (right panels): δ at n for the record at i. A what-if
        of the accounting (the schedule is public), costing O(s − i).
        """
        position = check.positive_int(self._owner, "position", position)
        release = self._records if release is None else check.positive_int(self._owner, "release", release)
        if release < position:
            raise InvalidInputError(check.message(self._owner, "release", f"an int >= position = {position}", release))
        scales = self.noise_scales(position, release - position + 1)
        single = pnsgd_delta if self.noise == "gaussian" else pnsgd_laplace_delta
        return self._accounting_call(single, self.epsilon, scales, 1, *self.iteration_model.arguments())

    def online_limit(self, position: int) -> OnlineLimit:
        """δ^{*,o} of Sordello et al. 2021, Thm 7 (Thm 6 for Laplace) for the record at ``position``: the limit of
        its δ when no iterate is released before the end of an infinitely long stream.

        Computed for the schedule without the pan floor (a floor only lowers every A and B, so the
        value still bounds the limit) and with the learner's own L, η, D, β, ρ, C1, C2, α. It is a
        per-position limit: the records near the end of any finite stream are far less protected
        (see :meth:`privacy`).
        """
        position = check.positive_int(self._owner, "position", position)
        limit = gaussian_online_delta_star if self.noise == "gaussian" else laplace_online_delta_star
        return self._accounting_call(
            limit, self.epsilon, position, self.alpha, self._lipschitz, self.eta, self._ball.diameter,
            self.C1, self.C2, self._beta, self._rho,
        )


class ShuffledPNSGD(_PNSGD, RecordedLearner):
    """One pass of PNSGD over a recorded stream of n records in uniformly random order (Sordello et al. 2021, Thm 2).

    Parameters
    ----------
    dim, loss, epsilon, radius, noise, feature_bound, pan_delta, rng
        As for :class:`OnlinePNSGD`.
    eta
        As for :class:`OnlinePNSGD`; the default is planned for T = n steps.
    n
        Number of records in the recording (public); the pass has exactly n steps. Keyword only.
    C1, C2
        Constants of the fixed noise of Sordello et al. 2021, Thm 5 (Gaussian) / Thm 4 (Laplace), used
        with ``schedule="sordello"``; defaults from Sordello et al. 2021, App. G (C1 = 1e5, C2 = 100).
        δ(n) → δ*_G = (1 − e^{−2C1e^{ε/2}})/(2C1e^{ε/2}) (Thm 5) or δ*_L = (1 − e^{−C1e^{ε/2}})/(C1e^{ε/2})
        (Thm 4); the report gives δ at the actual n.
    schedule
        ``"floor"`` (default): every step's noise is the pan floor, so each step is (ε, δ_pan)-DP and
        so are the outputs and one intrusion (the random order still lowers the output δ, which
        the report computes by Thm 2); ``"sordello"``: Thm 5's fixed σ(n) (Thm 4's v(n)), raised
        to the floor if ``pan_delta`` is set — the paper's mechanism, whose one-step noise is of
        the order of the diameter D whatever η (σ(n) ∝ 1/η), and which checkpoints written before
        this option existed restore to.

    Notes
    -----
    Order. The learner draws one uniformly random permutation π of the record indices 0..n−1 (from
    its noise source, when first needed) and must see the records in that order:
    :meth:`learn_recorded` fetches them from the recording index by index, or a caller asks
    :meth:`next_indices` and passes the fetched records to :meth:`learn_many`, which trusts that
    they are the records at those indices. Memory: the permutation (4 bytes per record for
    n < 2³², else 8) plus one micro-batch of raw records; no record is kept after its step.

    Accounting. Conditional on π, the record that differs sits at position j = π(i) and Thm 1 gives
    A B^{s(j)−j} (s(j): first snapshot at or after j; positions after the last snapshot give 0).
    π is uniform and independent of the release positions, so by joint convexity of the
    hockey-stick divergence (Sordello et al. 2021, App. A) δ = (1/n) Σ_j A B^{s(j)−j} = Σ_windows (g/n)·δ_Thm2(g),
    with g the window lengths between snapshots and δ_Thm2(g) = A(1 − B^g)/(g(1 − B)). With only
    the final iterate released this is Sordello et al. 2021, Thm 2 exactly; intermediate snapshots cost more.

    Intrusion. π is in memory (it drives the reading), so an intruder knows every record's
    position and sees the current iterate: the intrusion guarantee is (ε, A), A = θ_{e^ε}(2L/σ)
    — no amplification by shuffling or iteration. With Thm 5's σ(n), A is close to 1.

    Checkpoint and resume. The permutation is randomness and is never saved. A state saved
    before the pass starts or after it ends restores exactly. A state saved mid-pass cannot be
    resumed soundly: which records the lost π had already visited is unknown, so a regenerated
    permutation would visit some records twice and others never, and Thm 2 (one uniform
    permutation) would no longer describe the pass. :meth:`load_state_dict` therefore refuses a
    mid-pass state; after a crash the pass restarts from the beginning with a fresh learner, and
    the privacy ledger composes whatever the interrupted pass released with the new pass.
    (Saving the set of visited indices would make resumption sound for outputs — a fresh uniform
    order of the unvisited records keeps the overall order uniform — but it is information about
    π at rest, so it is not done.)

    References
    ----------
    Sordello et al. 2021, Thms 1, 2, 4, 5 and App. A, B, D.
    """

    name = "shuffled-pnsgd"
    _owner = "ShuffledPNSGD"
    legacy_defaults = {"schedule": "sordello", "pan_delta": None}
    resumes_mid_pass: ClassVar[bool] = False
    """A state saved mid-pass is refused by :meth:`load_state_dict` (see Notes): a driver restarts
    the pass instead of resuming it."""

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "n": 80},
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "eta": 2.0, "radius": 20.0, "n": 80, "C1": 10.0,
             "schedule": "sordello", "pan_delta": None},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        eta: float | None = None,
        radius: float | None = None,
        *,
        n: int,
        noise: Noise = "gaussian",
        C1: float = 1e5,
        C2: float = 100.0,
        feature_bound: float = 1.0,
        pan_delta: float | None = DEFAULT_DELTA,
        schedule: Schedule = "floor",
        rng: RngLike = None,
    ) -> None:
        self.n = check.positive_int(self._owner, "n", n)
        super().__init__(dim, loss, epsilon, eta, radius, noise, feature_bound, C1, C2, pan_delta, schedule, self.n, rng)
        fixed = fixed_sigma if self.noise == "gaussian" else fixed_laplace_scale
        paper: float = self._accounting_call(
            fixed, self.n, self.eta, self._ball.diameter, self.C1, self.C2, self._beta, self._rho
        )
        self._scale = self._floor if self.schedule == "floor" else max(paper, self._floor)
        self._order: NDArray[np.integer] | None = None
        self._window_delta = 0.0  # Σ over closed windows of (g/n)·δ_Thm2(g)

    def describe_noise(self) -> tuple[str, ...]:
        """The fixed noise level of every step of the pass (Sordello et al. 2021, Thm 5 / Thm 4)."""
        kind = "standard deviation" if self.noise == "gaussian" else "Laplace scale"
        return (
            f"{self.n:,} steps, each: the gradient clipped to L = {self._lipschitz:.6g}, a step of size eta = {self.eta:g}, "
            f"{self.noise} noise, projection onto the ball of radius {self.radius:g}",
            f"noise {kind} per coordinate at every step: {self._scale:.4g}; one step's noise vector "
            f"(rms norm eta * std * sqrt(p)) is {self._noise_to_radius(self._scale):.3g} x the radius",
        )

    @property
    def noise_scale(self) -> float:
        """The fixed σ(n) of Sordello et al. 2021, Thm 5 (or v(n) of Thm 4) used at every step."""
        return self._scale

    def _scales(self, start: int, count: int) -> Array:
        return np.full(count, self._scale)

    # -- the permutation -----------------------------------------------------------------------

    def _permutation(self) -> NDArray[np.integer]:
        if self._order is None:
            if self._records == self.n:
                raise InvalidInputError(f"{self._owner}: the pass of n = {self.n} records is complete")
            if self._records:
                raise InvalidInputError(
                    f"{self._owner}: the permutation of a pass in progress is lost (it is never saved); "
                    "restart the pass with a fresh learner"
                )
            dtype = np.uint32 if self.n < 2**32 else np.int64
            with self._noise.draw() as generator:
                self._order = generator.permutation(self.n).astype(dtype)
        return self._order

    def next_indices(self, count: int) -> NDArray[np.int64]:
        """Record indices (0-based, in the recording) of the next ``count`` steps, or fewer at the
        end of the pass. Does not advance: learning the fetched records does."""
        count = check.positive_int(self._owner, "count", count)
        order = self._permutation()
        return order[self._records : self._records + count].astype(np.int64)

    def learn_recorded(self, fetch: Fetch, micro_batch: int = 1024) -> None:
        """Run the rest of the pass: ``fetch(indices)`` returns ``(X, y)`` for those recording
        indices, in that order. Holds at most ``micro_batch`` raw records at a time."""
        micro_batch = check.positive_int(self._owner, "micro_batch", micro_batch)
        while self._records < self.n:
            X, y = fetch(self.next_indices(micro_batch))
            self.learn_many(X, y)

    def _check_room(self, count: int) -> None:
        if self._records + count > self.n:
            raise InvalidInputError(
                f"{self._owner}: the pass has n = {self.n} records; {self._records} done, {count} more given"
            )

    # -- accounting ----------------------------------------------------------------------------

    def _window(self, length: int) -> float:
        """(g/n)·δ_Thm2(g) = (A/n) Σ_{k<g} B^k for a window of g steps ending at a release."""
        shuffled = shuffled_pnsgd_delta if self.noise == "gaussian" else shuffled_pnsgd_laplace_delta
        delta = self._accounting_call(shuffled, length, self.epsilon, self._scale, *self.iteration_model.arguments())
        return length / self.n * delta

    def _note_release(self) -> None:
        if self._records > self._last_release:
            self._window_delta += self._window(self._records - self._last_release)
        super()._note_release()

    def privacy(self) -> PrivacyReport:
        """Output: Σ over the windows between snapshots of (g/n)·δ_Thm2(g) (see the class Notes);
        Sordello et al. 2021, Thm 2 when only the final iterate is released. Intrusion: A = θ_{e^ε}(2L/σ) once a
        record has been processed."""
        intrusion = self._step_delta(self._scale) if self._records else 0.0
        theorem = "Thm 5" if self.noise == "gaussian" else "Thm 4"
        assumptions = self._common_assumptions()
        assumptions.extend([
            f"the n = {self.n} records are visited in the order of one uniformly random permutation drawn "
            "by this learner, independent of the snapshot positions",
            f"fixed {self.noise} noise of Sordello et al. 2021, {theorem} at n = {self.n} (level {self._scale:.6g})"
            if self.schedule == "sordello" else
            f"{self.noise} noise at the pan floor at every step (level {self._scale:.6g}): every step is "
            f"(epsilon, {self.pan_delta:g})-DP with sensitivity 2L",
            "the intruder also reads the permutation, so an intrusion is protected by one noisy step",
        ])
        references = ["Sordello et al. 2021, Thm 1", "Sordello et al. 2021, Thm 2", f"Sordello et al. 2021, {theorem}", "Sordello et al. 2021, App. A", "Cheu et al. 2022, Def. C.2"]
        return self._report(self._guarantee(self._window_delta), self._guarantee(intrusion), assumptions, references)

    def planned_privacy(self) -> PrivacyReport:
        """The worst δ over every pattern of snapshots in the pass. With A the δ of one step and B
        the per-step factor of Sordello et al. 2021, Thm 2, a window of g steps adds
        (A/n)·Σ_{k<g} B^k; windows partition at most n steps, so their sum is at most
        A·(Σ g)/n ≤ A when B ≤ 1, and at most (A/n)·Σ_{k<n} B^k = δ_Thm2(n) when B ≥ 1 (each
        window's powers start at 0, the smallest). Output: the larger of the two bounds;
        intrusion: A (see :meth:`privacy`)."""
        step = self._step_delta(self._scale)
        output = max(step, self._window(self.n))
        return self._planned(self._guarantee(output), self._guarantee(step))

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """The common state plus the accounted δ of closed windows; never the permutation."""
        return {**super().state_dict(), "window_delta": self._window_delta}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        """Restore a state saved before the pass began or after it ended; refuse one saved mid-pass
        (see the class Notes)."""
        owner = f"{self._owner}.load_state_dict"
        if "window_delta" not in state or "records" not in state:
            raise InvalidInputError(f"{owner}: state lacks 'records' or 'window_delta'")
        records = _counter(owner, "records", state["records"])
        if 0 < records < self.n:
            raise InvalidInputError(
                f"{owner}: the state was saved mid-pass ({records} of n = {self.n} records); the "
                "permutation is never saved, so the pass cannot resume soundly — restart it with a "
                "fresh learner (the ledger composes what the interrupted pass released)"
            )
        if records > self.n:
            raise InvalidInputError(check.message(owner, "records", f"an int <= n = {self.n}", records))
        window = state["window_delta"]
        if isinstance(window, bool) or not isinstance(window, (float, int)) or not 0.0 <= window <= 1.0:
            raise InvalidInputError(check.message(owner, "window_delta", "a float in [0, 1]", window))
        super().load_state_dict(state)
        self._window_delta = float(window)
        self._order = None
