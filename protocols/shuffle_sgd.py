"""ShuffleSGD: sequentially interactive shuffle-private mini-batch SGD (Cheu et al. 2022, Alg. 3 and Thm 4.1).

Protocol. The stream is cut into consecutive batches of b records; each record is one user and
takes part in exactly one round (sequential interactivity, Cheu et al. 2022 Def. 2.7). In round t every user of
the batch computes ∇ℓ(θ_t; x) at the current model, clipped to norm L, and reports it through PVEC
(:class:`panpriv.protocols.encoder.VectorSum` with n = b users, (ε, δ), Δ₂ = L); the analyzer's estimate of
the gradient sum, divided by b, plus the exact ridge gradient, is the step direction ĝ_t, and
θ_{t+1} = Π_Θ(θ_t − η_t ĝ_t). The released model is the average of the iterates stepped from
(Cheu et al. 2022 Alg. 3 line 6: "Output (1/T) Σ_{t<T} θ_t").

Privacy (Cheu et al. 2022, proof of Thm 4.1). Each round is (ε, δ)-shuffle private for its users (Cheu et al. 2022, Thm 3.2
or the tight accountant of :mod:`panpriv.accounting.binomial` for the same protocol); a record enters one
round, and later rounds see it only through the model, so everything released is (ε, δ)-DP per
record however long the stream runs (parallel composition and post-processing).

Step sizes and batch size. The projected-SGD core is :class:`panpriv.protocols.sgd.AveragedSGD`: steps
η_t = D/√(Σ_{s≤t} G²) with the public bound G² = (√(L² + p·v/b²) + λr)² on E‖ĝ_t‖², where v is
the calibrated PVEC's per-coordinate variance bound and p the number of parameters — Thm 4.1's
L_G = L² + O(d L² log²(d/δ)/(b²ε²)) with the constants of the actual calibration (Cheu et al. 2022, Eq. (4)).
Lemma 4.2 (and AveragedSGD's anytime form of it) bounds the excess loss by ~D·√(L_G/T) with
T = n/b, i.e. (D/√n)·√(L² b + p v/b), which is least at b = √(p v)/L: the balance Cheu et al.'s proof of
Thm 4.1 strikes with b = √d log(d/δ)/ε, here with the constant that the chosen calibration
implies (:func:`plan_batch_size`).

Pan-private view: see :mod:`panpriv.protocols.shuffle_base` — an intrusion adds at most one user's PVEC
message, so the intrusion guarantee is the local guarantee of the randomizer.

References
----------
Cheu, Joseph, Mao & Peng (2022): Alg. 3, Thm 4.1 and its proof (Eq. (4)), Lemma 4.2 (= Lemma B.2),
Alg. 2 / Thm 3.2 (PVEC), Def. 2.7, Def. C.2, App. A.3 (robust variant).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import validation as check
from panpriv.protocols.base import StateValue
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.encoder import VectorSum
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomness import RngLike
from panpriv.protocols.sgd import AveragedSGD, bound_sq
from panpriv.protocols.shuffle_base import Calibration, SequentialLearner, max_guarantee, pvec_noise_lines, read_round

Array = NDArray[np.float64]

MAX_PLANNED_BATCH = 1 << 20
"""Largest batch :func:`plan_batch_size` returns when no horizon caps it."""

_OWNER = "ShuffleSGD"


def plan_batch_size(params: int, lipschitz: float, variance: float, cap: int) -> int:
    """b = √(p v)/L rounded, clamped to [1, cap]: the minimiser of L² b + p v/b (module docstring).

    ``variance`` is the per-coordinate variance v of PVEC's sum estimate; with the paper's
    calibration v ≈ 4·45·18²·L² log(2/δ̂) log(1/δ̂)/ε² (Cheu et al. 2022, Thm 3.2 with δ̂ = δ/(d + 1)), so
    b ≈ 240·√p·log(d/δ)/ε: Thm 4.1's b = √d log(d/δ)/ε with its constant.
    """
    return int(min(cap, max(1, round(math.sqrt(params * variance) / lipschitz))))


class ShuffleSGD(SequentialLearner):
    """Shuffle-private mini-batch SGD, one PVEC round per batch (Cheu et al. 2022, Alg. 3, Thm 4.1).

    Parameters
    ----------
    dim
        Number of raw features d.
    loss
        A :class:`panpriv.protocols.losses.Loss`, its name or its config dict (any convex loss: SGD uses subgradients); a name (``"logistic"``) or a config dict
        without ``intercept`` learns an intercept (:func:`panpriv.protocols.losses.learner_loss`: the model ``panpriv run``
        learns from the same settings). Default: ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon, delta
        The (ε, δ) of every round, hence of every released model, per record.
        Defaults: ε = 1, δ = 1e-6 (:mod:`panpriv.protocols.defaults`, the service's too).
    batch_size
        Users per round b; ``None``: :func:`plan_batch_size`.
    radius
        Radius r of Θ, the ℓ2 ball of parameters (D = 2r); ``None`` (default): r = √d, never below 1
        (:func:`panpriv.protocols.base.default_radius`, a rule that looks at no data).
    feature_bound
        R: features are clipped to norm R.
    calibration
        ``"tight"`` (default) or ``"paper"``: how PVEC's (g, b, p) are chosen
        (:class:`panpriv.protocols.encoder.VectorSum`).
    honest_fraction
        γ: the output guarantee holds when at least a fraction γ of each round's users are honest
        (Cheu et al. 2022, App. A.3); passed to :class:`~panpriv.protocols.encoder.VectorSum`.
    horizon
        Planned stream length; only caps a planned batch size.
    rng
        ``None`` (default): fresh OS entropy for every draw (pan-private). A seed or generator: the
        labelled replay/testing mode (no pan-private guarantee).

    Notes
    -----
    Deviations from Cheu et al. 2022 Alg. 3: line 4 reads θ_t ← Π(θ_{t−1} + η g_t), a sign typo for gradient
    *descent*; the constant η = D/√(T L_G) of Thm 4.1 is replaced by AveragedSGD's anytime steps
    η_t = D/√(t G²) (same bound up to a factor 3/2, without knowing T), and b is planned with the
    calibration's constant instead of the O(·)-stripped √d log(d/δ)/ε.

    Attributes
    ----------
    gradient_bound_sq
        G² = (√(L² + p v/b²) + λr)², the public bound on E‖ĝ_t‖² (Thm 4.1's L_G, Cheu et al. 2022 Eq. (4)).

    References
    ----------
    Cheu et al. 2022, Alg. 3, Thm 4.1, Lemma 4.2, Thm 3.2, Def. 2.7, Def. C.2.
    """

    name = "shuffle-sgd"
    _owner = _OWNER

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "batch_size": 7, "radius": 20.0},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        delta: float = DEFAULT_DELTA,
        batch_size: int | None = None,
        radius: float | None = None,
        feature_bound: float = 1.0,
        calibration: Calibration = "tight",
        honest_fraction: float = 1.0,
        horizon: int | None = None,
        rng: RngLike = None,
    ) -> None:
        self._setup(dim, loss, epsilon, delta, radius, feature_bound, calibration, honest_fraction, rng)
        self.horizon = None if horizon is None else check.positive_int(_OWNER, "horizon", horizon)
        self.batch_size = None if batch_size is None else check.positive_int(_OWNER, "batch_size", batch_size)
        if self.batch_size is None:
            cap = MAX_PLANNED_BATCH if self.horizon is None else self.horizon
            b = plan_batch_size(self._params, self._lipschitz, self._variance_hint(self.epsilon, self.delta), cap)
        else:
            b = self.batch_size
        self._sum = self._vector_sum(b, self.epsilon, self.delta)
        noise = self._params * self._sum.parameters.variance_bound / b  # p·v/b: per-message equivalent
        self.gradient_bound_sq = bound_sq(self._lipschitz, noise, b, self.loss.ridge * self.radius)
        self._sgd = AveragedSGD.start(self._params)
        self._step_work = np.zeros(self._params)

    def describe_noise(self) -> tuple[str, ...]:
        return pvec_noise_lines([self._sum])

    @property
    def vector_sum(self) -> VectorSum:
        """The PVEC instance every round uses (``vector_sum.n`` is the batch size b in use)."""
        return self._sum

    @property
    def vector_sums(self) -> dict[int, VectorSum]:
        """{b: :attr:`vector_sum`}: every round has the same b users (Cheu et al. 2022, Alg. 3)."""
        return {self._sum.n: self._sum}

    def query_point(self) -> Array:
        """θ_t, where round t's users take their gradients (Cheu et al. 2022, Alg. 3 line 3)."""
        return self._sgd.theta.copy()

    # -- rounds ----------------------------------------------------------------------------------

    def _round_sum(self) -> VectorSum:
        return self._sum

    def _query(self) -> tuple[Array, float | None]:
        return self._sgd.theta, None

    def _finish_round(self, mean: Array) -> None:
        """ĝ = mean + λθ (the ridge term skipped when λ = 0: mean + 0·θ is mean), then the
        in-place projected step (:meth:`AveragedSGD.step_in_place`, the arithmetic of ``step``)."""
        if self.loss.ridge:
            mean = mean + self.loss.ridge_gradient(self._sgd.theta)
        self._sgd = self._sgd.step_in_place(mean, self.gradient_bound_sq, self._ball, self._step_work)

    # -- outputs -----------------------------------------------------------------------------------

    def release(self) -> Array:
        """θ̄, the average of the iterates stepped from (Cheu et al. 2022 Alg. 3 line 6)."""
        return self._sgd.release()

    def privacy(self) -> PrivacyReport:
        """Output: the round's (ε, δ) per record (Cheu et al. 2022, Thm 4.1's privacy part). Intrusion: the local
        guarantee of one PVEC message (never reported stronger than the output guarantee)."""
        parameters = self._sum.parameters
        output = Guarantee(parameters.epsilon, parameters.delta)
        intrusion = max_guarantee(self._local(self._sum, parameters.epsilon), output)
        assumptions = [
            f"each record is in exactly one round of b = {self._sum.n} users (sequential interactivity, "
            "Cheu et al. 2022 Def. 2.7); later rounds see it only through the model, so its guarantee is that of "
            "one PVEC round",
            f"pan-privacy: the state holds the model and the one-bit totals of the round in progress; "
            f"read right after a round's first user it shows her message alone, protected by her own "
            f"binomial noise: local guarantee {intrusion}",
        ]
        return self._report(output, intrusion, assumptions, ["Cheu et al. 2022, Alg. 3", "Cheu et al. 2022, Thm 4.1", "Cheu et al. 2022, Def. 2.7"])

    # -- persistence ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """The round in progress (``filled``, noisy ``totals``) and the SGD iterates (noisy)."""
        return {**self._round_state(), **self._sgd.state()}

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        records, filled, totals = read_round(_OWNER, state, self._params)
        if filled >= self._sum.n:
            raise InvalidInputError(
                check.message(f"{_OWNER}.load_state_dict", "filled", f"an int < b = {self._sum.n}", filled)
            )
        sgd = AveragedSGD.from_state(_OWNER, state, self._params)
        self._records, self._filled, self._totals, self._sgd = records, filled, totals, sgd
