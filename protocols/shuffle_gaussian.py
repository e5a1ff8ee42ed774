"""ShuffleGaussianSGD: projected SGD over rounds of shuffled Gaussian messages (Liew & Takahashi 2022 §5.2).

Protocol (Liew & Takahashi 2022 §5.2, in the streaming setting of Cheu et al. 2022 Def. 2.7). The stream is cut into consecutive
*windows* of N records; each window is one round. The model θ_t is fixed during the round. Every
user (record) of the window who *participates* computes her gradient at θ_t, clips it to ℓ2 norm C
and sends ``g + N(0, (σC)² I)`` (σ the noise multiplier, :class:`panpriv.protocols.randomizers.GaussianRandomizer`)
to the shuffler; at the end of the window the analyzer takes the mean of the K messages of the
round (their order is irrelevant to it), adds the exact ridge gradient and takes a projected SGD
step (:class:`panpriv.protocols.sgd.AveragedSGD`). Who participates (``participation``):

- ``"all"``: every record; N = b (``batch_size``). Accounted by Liew & Takahashi 2022 Thm 1 with n = b.
- ``"subsampled"``: the server samples b of the N users of the window uniformly without
  replacement, without looking at their data (selection sampling). Liew & Takahashi 2022 Thm 2 with n = N, m = b.
- ``"checkin"``: each user checks in independently with probability γ (``checkin_rate``), using
  her own randomness (Liew & Takahashi 2022 §4.2, "shuffled check-in"). Liew & Takahashi 2022 Thm 3 with n = N users.

Guarantee against the analyzer (the ``output`` of :meth:`ShuffleGaussianSGD.privacy`). Neighbouring
streams differ in one record, which lies in exactly one window. Conditioned on the history, rounds
before its window are identical in both worlds, its round is one shuffled Gaussian release of the
users' clipped gradients at the common θ_t, and later rounds depend on it only through the model
(their conditional laws given the history are identical). By adaptive composition its privacy
loss is that of its own round alone — a *per-record* guarantee that does not grow with the stream
(parallel composition over rounds). Two records of a user give clipped gradients at distance at
most 2C, so in Liew & Takahashi's normalisation (records at distance 1, noise σ_004) the round has
σ_004 = σC/(2C) = σ/2: that is the ``sigma`` passed to :mod:`panpriv.accounting.shuffle_gaussian`. The
RDP curve is converted by Liew & Takahashi 2022 Lemma 2 on the integer orders :data:`ORDERS`. The released model
is post-processing of the shuffled messages (and in fact of their sum alone).

The shuffle bounds rest on assumptions Liew & Takahashi 2022 does not prove (``THM1_ASSUMPTIONS``,
``CHECKIN_ASSUMPTIONS`` of :mod:`panpriv.accounting.shuffle_gaussian`), and every report using them lists
them. The shuffled messages are a post-processing of the unshuffled ones, so the *local* Gaussian
guarantee (ε₀, δ) (exact profile at sensitivity 2C, Balle & Wang 2018) is a proven bound on the same
release; the report never prints more than it, and ``accounting="local"`` calibrates and reports
the proven local bound only.

Pan-private view (the ``intrusion`` guarantee). The state holds the model, its running average, and
the *sum of the noisy messages received so far in the current round* (with its count). An intruder
who reads it right after a round's first message sees that user's message itself. Everything an
intruder sees (state once, plus all outputs) is a post-processing of the unshuffled messages in
arrival order, and each record enters exactly one message, so the intrusion guarantee is the local
one, (ε₀, δ) — usually much weaker than the shuffle-model guarantee, and stated as such. A batch
that straddles ``learn_many`` calls keeps only that noisy partial sum.

Noise calibration. Given the target (ε, δ), σ is the smallest noise multiplier (to a relative
1e-6, checked) whose reported output guarantee — min(shuffle bound, local bound), or the local
bound alone — is at most ε at δ (:func:`noise_multiplier`). With ``batch_size=None`` and
``participation="all"`` the batch is planned by :func:`plan_batch_size`.

References
----------
Liew & Takahashi 2022, §5.2 (shuffled Gaussian DP-SGD), Thm 1 (Eq. 4), Thm 2 (Eq. 10), Thm 3 (Eq. 13), Lemma 1
(composition), Lemma 2 (RDP to DP), §4.2 (shuffled check-in). Cheu et al. 2022, Def. 2.7 (sequential
interactivity), Def. C.2 (pan-privacy). Balle & Wang (2018), Thm 8.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting import shuffle_gaussian as sg
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.accounting.rdp import RdpCurve
from panpriv.protocols import scratch
from panpriv.protocols import validation as check
from panpriv.protocols.base import StateValue, check_batch
from panpriv.protocols.calibration import smallest_feasible
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomizers import GaussianRandomizer, gaussian_epsilon0
from panpriv.protocols.randomness import NOISE_BLOCK_ROWS, NoiseSource, RngLike
from panpriv.protocols.rounds import round_slices
from panpriv.protocols.sgd import AveragedSGD, MessageSGDLearner
from panpriv.protocols.state_io import read_array, read_float, read_int

Array = NDArray[np.float64]

ORDERS: tuple[int, ...] = tuple(range(2, 129))
"""Integer Rényi orders of the RDP → DP conversion (Liew & Takahashi 2022 Thm 1 is exact at integer orders; Liew & Takahashi 2022 §5.1
uses 2..30, too few for ε ≤ 1 at small δ)."""

PLANNING_ORDERS: tuple[int, ...] = tuple(range(2, 49))
"""Orders used only to plan a batch size (cheaper; the guarantee itself always uses :data:`ORDERS`)."""

SLACKS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
"""Values of Liew & Takahashi 2022 Thm 3's free Δ ∈ [0, 1] tried at every order; each gives a valid bound and the least
is kept. (A scan over Δ = 0, 0.05, …, 1 for N ∈ [50, 10⁴], γ ∈ [0.01, 0.9], σ_004 ∈ [0.5, 4] found
the best Δ of an order anywhere in [0.1, 1]; this grid covers that range in steps of 0.1.)"""

Participation = Literal["all", "subsampled", "checkin"]
PARTICIPATION: tuple[Participation, ...] = ("all", "subsampled", "checkin")
Accounting = Literal["shuffle", "local"]
ACCOUNTING: tuple[Accounting, ...] = ("shuffle", "local")
MAX_PLANNED_BATCH = 2**16
"""Largest batch :func:`plan_batch_size` considers."""

_OWNER = "ShuffleGaussianSGD"


@dataclass(frozen=True)
class Round:
    """Who takes part in one round, and the Liew & Takahashi 2022 theorem that accounts for it.

    Attributes
    ----------
    participation
        ``"all"``, ``"subsampled"`` or ``"checkin"`` (module docstring).
    window
        N, the users (records) of the round.
    batch
        Messages per round: N for ``"all"``, m for ``"subsampled"``, 0 (random) for ``"checkin"``.
    rate
        γ: check-in probability, or m/N.
    """

    participation: str
    window: int
    batch: int
    rate: float

    @property
    def theorem(self) -> str:
        return {"all": "Liew & Takahashi 2022, Thm 1", "subsampled": "Liew & Takahashi 2022, Thm 2", "checkin": "Liew & Takahashi 2022, Thm 3"}[self.participation]

    @property
    def assumptions(self) -> tuple[str, ...]:
        return sg.CHECKIN_ASSUMPTIONS if self.participation == "checkin" else sg.THM1_ASSUMPTIONS

    def rdp(self, sigma: float, orders: tuple[int, ...] = ORDERS) -> Array:
        """RDP of one round at ``orders``, for Liew & Takahashi's noise multiplier ``sigma`` (= σ/2)."""
        if self.participation == "all":
            return np.asarray(sg.rdp(orders, self.window, sigma))  # Liew & Takahashi 2022, Thm 1
        if self.participation == "subsampled":
            return np.asarray(sg.subsampled_rdp(orders, self.window, self.batch, sigma))  # Liew & Takahashi 2022, Thm 2
        curves = [sg.checkin_rdp(orders, self.window, self.rate, sigma, slack) for slack in SLACKS]
        return np.min(np.asarray(curves), axis=0)  # Liew & Takahashi 2022, Thm 3, the best Δ at each order


@functools.lru_cache(maxsize=1024)
def shuffle_epsilon(round_: Round, noise_multiplier: float, delta: float, orders: tuple[int, ...] = ORDERS) -> float:
    """ε at δ of one round whose users add N(0, (σC)² I) to gradients clipped to C (Liew & Takahashi 2022 Thms 1–3).

    The round's RDP at Liew & Takahashi's σ_004 = σ/2 (sensitivity 2C), converted by Liew & Takahashi 2022 Lemma 2 (cached).
    """
    curve = RdpCurve.from_values(orders, round_.rdp(noise_multiplier / 2.0, orders))
    return curve.to_dp(delta)[0]


@functools.lru_cache(maxsize=256)
def noise_multiplier(
    round_: Round,
    accounting: str,
    epsilon: float,
    delta: float,
    rel_tol: float = 1e-6,
    orders: tuple[int, ...] = ORDERS,
) -> float:
    """σ making the reported output guarantee of one round at most (ε, δ) (cached).

    ``accounting="shuffle"``: the smaller of the shuffle bound and the local bound (both valid);
    ``"local"``: the local bound alone.
    """
    if accounting == "local":
        return smallest_feasible(lambda s: gaussian_epsilon0(s, delta), epsilon, rel_tol)
    return smallest_feasible(
        lambda s: min(shuffle_epsilon(round_, s, delta, orders), gaussian_epsilon0(s, delta)), epsilon, rel_tol
    )


@functools.lru_cache(maxsize=64)
def plan_batch_size(params: int, accounting: str, epsilon: float, delta: float, cap: int) -> int:
    """b for ``participation="all"``: the power of two ≤ ``cap`` minimising b + p σ(b)².

    With clip C = L, T = n/b rounds and G² ≈ C²(1 + pσ²/b) (:func:`panpriv.protocols.sgd.bound_sq`), the
    excess-loss bound (3/2) D G/√T of :mod:`panpriv.protocols.sgd` is (3/2) D C √((b + p σ(b)²)/n): n only
    scales it, so the best b does not depend on the stream length. σ(b) shrinks as b grows (the
    shuffle amplifies more), which the plan takes into account; it is calibrated to 1 % here, on
    :data:`PLANNING_ORDERS`.
    """
    candidates = [2**k for k in range(17) if 2**k <= min(cap, MAX_PLANNED_BATCH)]

    def cost(b: int) -> float:
        sigma = noise_multiplier(Round("all", b, b, 1.0), accounting, epsilon, delta, 1e-2, PLANNING_ORDERS)
        return b + params * sigma**2

    return min(candidates, key=cost)


def local_messages(
    loss: Loss, theta: Array, Z: Array, labels: Array, clip: float, noise_std: float, noise: NoiseSource, work: scratch.Scratch
) -> Array:
    """The users' messages ``clip_C(∇ℓ(θ; z_i)) + N(0, (σC)² I)`` for the feature rows ``Z`` (built
    by :func:`panpriv.protocols.scratch.features`) and loss labels ``labels``, in ``work`` (shape (m, p)).
    The gradients are clipped to :func:`panpriv.protocols.scratch.strict_bound` (C, p), so every
    message's clean part has exact norm ≤ C: the noise is calibrated to sensitivity exactly 2C.

    The local randomizer of Liew & Takahashi 2022 §5.2 (Alg. 1), shared by the in-process learner
    (:meth:`ShuffleGaussianSGD.learn_many`) and the Encode–Shuffle–Analyze client encoder
    (:mod:`panpriv.streamer.esa.client`, Bittau et al. 2017), so both send the same messages: the gradient
    clipped in scratch and the noise drawn into it in place
    (:meth:`panpriv.protocols.randomness.NoiseSource.add_gaussian`); the same law as
    :meth:`panpriv.protocols.randomizers.GaussianRandomizer.privatize`. The caller wipes ``work``.
    """
    messages = scratch.clipped_gradients(loss, theta, Z, labels, scratch.strict_bound(clip, Z.shape[1]), work)
    noise.add_gaussian(messages, noise_std)
    return messages


class ShuffleGaussianSGD(MessageSGDLearner):
    """Projected SGD over shuffled Gaussian messages, one round per window (Liew & Takahashi 2022 §5.2, Thms 1–3).

    Parameters
    ----------
    dim
        Number of raw features d.
    loss
        A :class:`panpriv.protocols.losses.Loss`, its name or its config dict; a name (``"logistic"``) or a config dict
        without ``intercept`` learns an intercept (:func:`panpriv.protocols.losses.learner_loss`: the model ``panpriv run``
        learns from the same settings). Default: ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon, delta
        Target output guarantee per record (shuffle model; see ``accounting``).
        Defaults: ε = 1, δ = 1e-6 (:mod:`panpriv.protocols.defaults`, the service's too).
    batch_size
        ``"all"``: records per round b (``None``: :func:`plan_batch_size`). ``"subsampled"``: users
        sampled per window, 1 ≤ b ≤ ``window``. ``"checkin"``: must be ``None``.
    participation
        ``"all"`` (default), ``"subsampled"`` or ``"checkin"`` (module docstring).
    window
        N, records per round for ``"subsampled"`` and ``"checkin"``; ``None`` for ``"all"``.
    checkin_rate
        γ in (0, 1] for ``"checkin"``; ``None`` otherwise.
    clip
        C, the norm gradients are clipped to; ``None``: the loss's Lipschitz constant L over Θ.
    radius
        Radius r of Θ, the ℓ2 ball of parameters (D = 2r); ``None`` (default): r = √d, never below 1
        (:func:`panpriv.protocols.base.default_radius`, a rule that looks at no data).
    feature_bound
        Features are clipped to this norm (the loss's R).
    accounting
        ``"shuffle"`` (default): the Liew & Takahashi 2022 bound under its stated assumptions, never above the local
        bound. ``"local"``: the proven local Gaussian bound only.
    horizon
        Planned stream length, used only to cap a planned batch size.
    rng
        ``None`` (default): fresh OS entropy for every draw (pan-private). A seed or generator: the
        labelled replay/testing mode (no pan-private guarantee).

    References
    ----------
    Liew & Takahashi 2022, §5.2, Thms 1–3, Lemma 2; Cheu et al. 2022, Defs 2.7 and C.2.
    """

    name = "shuffle-gaussian"
    pooled_noise: bool = True
    """In process, draw a call's k messages' noise as one N(0, k(σC)² I) (exactly their sum's law);
    ``False``: form every message as the E-S-A clients do (the reference of the role tests)."""

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "batch_size": 7, "radius": 20.0},
            {"dim": 3, "loss": {"name": "logistic", "ridge": 0.1}, "epsilon": 2.0, "delta": 1e-5, "participation": "checkin",
             "window": 9, "checkin_rate": 0.5, "radius": 20.0},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        delta: float = DEFAULT_DELTA,
        batch_size: int | None = None,
        participation: Participation = "all",
        window: int | None = None,
        checkin_rate: float | None = None,
        clip: float | None = None,
        radius: float | None = None,
        feature_bound: float = 1.0,
        accounting: Accounting = "shuffle",
        horizon: int | None = None,
        rng: RngLike = None,
    ) -> None:
        self._setup(dim, loss, epsilon, delta, clip, radius, feature_bound, rng)
        self.participation = check.choice(_OWNER, "participation", participation, PARTICIPATION)
        self.accounting = check.choice(_OWNER, "accounting", accounting, ACCOUNTING)
        self.horizon = None if horizon is None else check.positive_int(_OWNER, "horizon", horizon)
        self._round = self._make_round(batch_size, window, checkin_rate)
        self.batch_size = None if self.participation == "checkin" else self._round.batch
        self.window = None if self.participation == "all" else self._round.window
        self.checkin_rate = self._round.rate if self.participation == "checkin" else None

        self.noise_multiplier = noise_multiplier(self._round, self.accounting, self.epsilon, self.delta)
        self._randomizer = GaussianRandomizer(self._clip, self.noise_multiplier, self.delta)
        self._noise_moment = self._randomizer.noise_second_moment(self._params)
        self._output, self._output_is_shuffle = self._output_guarantee()

        self._filled = 0  # records of the current window seen
        self._count = 0.0  # messages in the partial sum (float: random under check-in/sampling)
        self._partial = np.zeros(self._params)
        self._mean = np.zeros(self._params)  # a round's noisy mean message, then the step's work
        self._step_work = np.zeros(self._params)

    def _make_round(self, batch_size: int | None, window: int | None, rate: float | None) -> Round:
        """Validate the participation parameters (the rules are in the class docstring)."""
        p = self.participation
        if p != "checkin" and rate is not None:
            raise InvalidInputError(check.message(_OWNER, "checkin_rate", f"None for participation {p!r}", rate))
        if p == "all":
            if window is not None:
                raise InvalidInputError(check.message(_OWNER, "window", "None for participation 'all' (the window is the batch)", window))
            if batch_size is None:
                cap = MAX_PLANNED_BATCH if self.horizon is None else self.horizon
                batch_size = plan_batch_size(self._params, self.accounting, self.epsilon, self.delta, cap)
            b = check.positive_int(_OWNER, "batch_size", batch_size)
            return Round("all", b, b, 1.0)
        n = check.positive_int(_OWNER, "window", window)
        if p == "subsampled":
            m = check.positive_int(_OWNER, "batch_size", batch_size)
            if m > n:
                raise InvalidInputError(check.message(_OWNER, "batch_size", f"an integer in [1, window] = [1, {n}]", m))
            return Round("subsampled", n, m, m / n)
        if batch_size is not None:
            raise InvalidInputError(check.message(_OWNER, "batch_size", "None for participation 'checkin'", batch_size))
        gamma = check.positive(_OWNER, "checkin_rate", rate)
        if gamma > 1.0:
            raise InvalidInputError(check.message(_OWNER, "checkin_rate", "a float in (0, 1]", rate))
        return Round("checkin", n, 0, gamma)

    def _output_guarantee(self) -> tuple[Guarantee, bool]:
        """The output guarantee and whether it is the shuffle bound (else the local one)."""
        local = self._randomizer.local_guarantee()
        if self.accounting == "local":
            return local, False
        shuffled = shuffle_epsilon(self._round, self.noise_multiplier, self.delta)
        if shuffled < local.epsilon:
            return Guarantee(shuffled, self.delta), True
        return local, False

    # -- learning ------------------------------------------------------------------------------

    def learn_many(self, X: Array, y: Array) -> None:
        """Add a micro-batch; any split of the stream gives the same mechanism."""
        X, y = check_batch(_OWNER, X, y, self.dim)
        scratch.learn_in_blocks(self.loss, X, y, self.feature_bound, self._scratch, self._learn_block)

    def _learn_block(self, Z: Array, labels: Array) -> None:
        """The rounds over one block of features (in scratch), a round possibly straddling blocks.
        The rows' norms (for the pooled path's clip, :func:`panpriv.protocols.scratch.clipped_weights`)
        are computed once per block, not per round."""
        norms = scratch.feature_norms(Z, self._scratch)[1]
        if self.participation == "all" and self.pooled_noise:
            self._learn_pieces(Z, labels, norms)
        else:
            self._learn_rounds(Z, labels, norms)

    def _learn_rounds(self, Z: Array, labels: Array, norms: Array) -> None:
        """:meth:`_learn_block` one piece (a block's rows within one window) at a time: its
        participants' messages (:meth:`_add_messages`), then the step if the window is full."""
        for rows in round_slices(Z.shape[0], lambda: self._round.window - self._filled):
            take = rows.stop - rows.start
            if self.participation == "all":  # every record sends: its rows as they are, no draw
                self._add_messages(Z[rows], labels[rows], norms[rows])
                self._count += take
            else:
                with self._noise.draw() as generator:
                    chosen = rows.start + self._participants(take, generator)
                if chosen.size:
                    self._add_messages(scratch.rows(Z, chosen, self._scratch, "user_features"),
                                       scratch.rows(labels, chosen, self._scratch, "user_labels"),
                                       scratch.rows(norms, chosen, self._scratch, "user_norms"))
                self._count += chosen.size
            self._filled += take
            self._records += take
            if self._filled == self._round.window:
                self._finish_round()

    def _learn_pieces(self, Z: Array, labels: Array, norms: Array) -> None:
        """:meth:`_learn_block` under ``participation="all"`` with pooled noise: the same pieces
        (a block's rows within one window), each adding Zᵀw plus one N(0, k(σC)² I) for its k
        users (:meth:`_add_messages`), with the noise of consecutive pieces drawn together
        (:meth:`_pieces_noise`): the same draws in the same order as one
        :meth:`NoiseSource.add_gaussian` per piece (bitwise, seeded), without a keyed generator,
        a scaling and a wipe per round."""
        window = self._round.window
        edges = [0, *range(window - self._filled, Z.shape[0], window), Z.shape[0]]
        pieces = list(zip(edges[:-1], edges[1:], strict=True))
        loss, clip, work, partial = self.loss, self._clip, self._scratch, self._partial
        clipped_weights, weighted_row_sum = scratch.clipped_weights, scratch.weighted_row_sum
        largest = min(window, Z.shape[0])  # the longest piece: its buffers are taken once per block
        whole = margins, gradient_weights = work.take("margins", largest), work.take("gradient_weights", largest)
        total = work.take("row_sum", self._params)
        most = min(len(pieces), NOISE_BLOCK_ROWS)  # the most pieces a group holds
        noise_rows, noise_scales = work.take("pieces_noise", most, self._params), work.take("pieces_noise_scales", most)
        group = 0
        while group < len(pieces):
            end = group + 1
            while end < len(pieces) and pieces[end][1] - pieces[group][0] <= NOISE_BLOCK_ROWS:
                end += 1
            noise = self._pieces_noise([stop - start for start, stop in pieces[group:end]], noise_rows, noise_scales)
            for (start, stop), piece_noise in zip(pieces[group:end], noise, strict=True):
                users = stop - start
                rows = Z[start:stop]
                weights = clipped_weights(loss, self._sgd.theta, rows, labels[start:stop], norms[start:stop], clip, work,
                                          buffers=whole if users == largest else (margins[:users], gradient_weights[:users]))
                weighted_row_sum(weights, rows, work, total)
                total += piece_noise
                partial += total
                self._count += users
                self._records += users
                self._filled += users
                if self._filled == window:
                    self._finish_round()
            noise.fill(0.0)
            group = end

    def _pieces_noise(self, sizes: list[int], rows: Array, scales: Array) -> Array:
        """One row N(0, k(σC)² I) per piece of k users (``sizes``), in the first rows of ``rows``
        (scratch, taken once per block with ``scales``; the caller wipes it once added): the draws
        of :meth:`NoiseSource.add_gaussian` on each piece in turn — ``standard_normal`` fills row
        after row from one generator, then each row is scaled by its piece's σC·√k (by that one
        number when the pieces are all of a size, the usual whole rounds: the same products) — so
        the seeded mode gives the same bits. The pieces drawn together
        hold at most :data:`panpriv.protocols.randomness.NOISE_BLOCK_ROWS` records (or one piece): a
        read of the process inside ``learn_many`` finds the noise of records in flight only
        (:mod:`panpriv.protocols.randomness`, "Noise of the records in flight")."""
        noise = rows[: len(sizes)]
        noise_std = self._randomizer.noise_std
        with self._noise.draw() as generator:
            generator.standard_normal(out=noise)
        if sizes.count(sizes[0]) == len(sizes):
            noise *= noise_std * math.sqrt(sizes[0])
        else:
            scales = scales[: len(sizes)]
            scales[:] = [noise_std * math.sqrt(k) for k in sizes]
            noise *= scales[:, None]
        return noise

    def _add_messages(self, Z_users: Array, labels_users: Array, norms_users: Array) -> None:
        """partial += Σ (clip_C(∇ℓ(θ; z_i)) + N(0, (σC)² I)) over the k users whose feature rows,
        labels and feature norms are given (in scratch).

        Pooled (the default, :attr:`pooled_noise`): Σᵢ N(0, (σC)² I) over k independent users is
        N(0, k(σC)² I), so one p-vector of noise is drawn for the k messages — the partial sum after
        every call, and so every state between micro-batches and every step, has exactly the law
        of the per-user messages (the intrusion argument in docs/privacy.md, ``shuffle-gaussian``).
        The clipped gradients' sum is Zᵀw (:func:`panpriv.protocols.scratch.clipped_weights`: the same
        clip to C from the rows' norms, |φ'|·‖z_i‖; equal to the sum of
        :func:`panpriv.protocols.scratch.clipped_gradients`' rows up to rounding). Per user
        (``pooled_noise = False``): each message is formed as an
        Encode–Shuffle–Analyze client forms it (:func:`local_messages`), k·p draws. Either way the
        gradients are clipped in scratch and the noise is drawn through
        :meth:`NoiseSource.add_gaussian`, so no clean or pure-noise array outlives the call."""
        noise_std = self._randomizer.noise_std
        if not self.pooled_noise:
            messages = local_messages(self.loss, self._sgd.theta, Z_users, labels_users, self._clip, noise_std,
                                      self._noise, self._scratch)
            self._partial += scratch.row_sum(messages, self._scratch)
            return
        weights = scratch.clipped_weights(self.loss, self._sgd.theta, Z_users, labels_users, norms_users, self._clip,
                                          self._scratch)
        total = scratch.weighted_row_sum(weights, Z_users, self._scratch)
        self._noise.add_gaussian(total, noise_std * math.sqrt(Z_users.shape[0]))
        self._partial += total

    def _participants(self, take: int, generator: np.random.Generator) -> NDArray[np.int64]:
        """Indices (within the next ``take`` records of the window) of the users who send a message,
        under ``"checkin"`` or ``"subsampled"`` participation (under ``"all"`` every record sends).

        ``"subsampled"``: given s users already sampled among the first j of the window, the number
        among the next ``take`` is hypergeometric (m − s good among the N − j left) and their
        positions a uniform subset — the law of a uniform m-subset of the window, however the
        window is split.
        """
        if self.participation == "checkin":
            return np.flatnonzero(generator.random(take) < self._round.rate)
        wanted = self._round.batch - int(self._count)
        left = self._round.window - self._filled
        k = int(generator.hypergeometric(wanted, left - wanted, take)) if wanted > 0 else 0
        return np.sort(generator.choice(take, size=k, replace=False))

    def _finish_round(self) -> None:
        """Mean of the round's messages + ridge gradient → one SGD step (skipped if no message)."""
        if self._count > 0.0:
            self._step(np.divide(self._partial, self._count, self._mean), self._count, self._step_work)
        self._filled = 0
        self._count = 0.0
        self._partial.fill(0.0)

    # -- the analyzer's half (Encode–Shuffle–Analyze) ------------------------------------------

    def learn_round(self, messages: Array) -> None:
        """One round from its shuffled messages: the analyzer of a deployment whose users run
        :func:`local_messages` themselves and a separate shuffler batches them (Bittau et al. 2017,
        "Prochlo"; :mod:`panpriv.streamer.esa`). ``messages`` (k, p) are the round's valid messages at
        θ_t (``k`` may be below b when messages were rejected; 0 skips the step, as an empty round
        does in process); the round's b users count as learned. Only ``participation="all"``, and
        never inside a round begun by :meth:`learn_many`.
        """
        if self.participation != "all" or self._filled:
            raise InvalidInputError(
                f"{_OWNER}.learn_round: needs participation 'all' and no round in progress "
                f"(participation {self.participation!r}, {self._filled} records of the round seen)"
            )
        messages = np.asarray(messages, dtype=np.float64)
        if messages.ndim != 2 or messages.shape[1] != self._params or messages.shape[0] > self._round.batch:
            raise InvalidInputError(
                f"{_OWNER}.learn_round: expected at most {self._round.batch} messages of {self._params} coordinates, "
                f"got shape {messages.shape}"
            )
        if not np.all(np.isfinite(messages)):
            raise InvalidInputError(f"{_OWNER}.learn_round: non-finite message coordinates")
        if messages.shape[0]:
            self._step(messages.mean(axis=0), float(messages.shape[0]))
        self._records += self._round.batch

    @property
    def rounds_done(self) -> int:
        """Completed rounds (``participation="all"``: records // b)."""
        return self._records // self._round.window

    @property
    def theta(self) -> Array:
        """θ_t, where the current round's gradients are taken (noisy: post-processing of messages)."""
        return self._sgd.theta.copy()

    def calibration(self) -> dict[str, Any]:
        """The public numbers a user needs to send her message of the current round: the loss, the
        feature clip, the gradient clip C, the noise multiplier σ (noise σC per coordinate), δ and b."""
        return {
            "dim": self.dim,
            "loss": self.loss.config(),
            "feature_bound": self.feature_bound,
            "clip": self._clip,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "batch_size": self._round.batch,
            "params": self._params,
        }

    def round_epsilon(self, messages: int) -> float:
        """ε at δ of one round of ``participation="all"`` with ``messages`` honest messages (Liew &
        Takahashi 2022 Thm 1 at n = ``messages``), never above the local ε₀; used when messages of a
        round were rejected and fewer users' noise hides each message."""
        local = self._randomizer.local_guarantee().epsilon
        if self.accounting == "local" or messages < 2:
            return local
        return min(local, shuffle_epsilon(Round("all", messages, messages, 1.0), self.noise_multiplier, self.delta))

    # -- outputs -------------------------------------------------------------------------------

    def local_guarantee(self) -> Guarantee:
        """(ε₀, δ) of one user's message (exact Gaussian profile, sensitivity 2C)."""
        return self._randomizer.local_guarantee()

    def describe_noise(self) -> tuple[str, ...]:
        """Every message: the clipped gradient plus N(0, (zC)^2 I) (Liew & Takahashi 2022, Alg. 1)."""
        return (
            f"every message: the gradient clipped to C = {self._clip:.6g} plus N(0, (z C)^2 I) per coordinate, "
            f"z = {self.noise_multiplier:.6g} (standard deviation {self._randomizer.noise_std:.6g})",
        )

    def messages_per_step(self) -> tuple[float, str]:
        """k of :meth:`panpriv.protocols.sgd.MessageSGDLearner.noise_to_signal`: the messages averaged by one
        round's step — b (``"all"``), m (``"subsampled"``) or the expected γN (``"checkin"``)."""
        r = self._round
        if r.participation == "checkin":
            return r.window * r.rate, f"expected check-ins per round, gamma N = {r.rate:g} x {r.window}"
        return float(r.batch), "messages per round, b" if r.participation == "all" else "users sampled per round, m"

    def _noise_formula(self) -> str:
        """Each message adds N(0, (σC)² I_p) (Liew & Takahashi 2022 §5.2, Alg. 1), so v = p(σC)² and
        the mean of k messages has ρ = √(v/k)/C = σ·√(p/k)."""
        return f"sigma sqrt(p/k) [sigma = {self.noise_multiplier:.3g}, p = {self._params}]"

    def privacy(self) -> PrivacyReport:
        """Output: the shuffle-model guarantee per record; intrusion: the local guarantee."""
        local = self._randomizer.local_guarantee()
        C, sigma = self._clip, self.noise_multiplier
        assumptions = [
            "neighbouring streams differ in one record (replacement); stream positions, counts, the "
            "window and the number of messages in each round are public",
            f"each participating user clips her gradient to norm C = {C:.6g} and sends it plus "
            f"N(0, (sigma C)^2 I) with sigma = {sigma:.6g}; two records of a user give messages at "
            f"distance <= 2C, so Liew & Takahashi's noise multiplier is sigma/2 = {sigma / 2:.6g}",
            "a trusted shuffler: the analyzer sees each round's messages in uniformly random order "
            "(here randomizer, shuffler and analyzer run in one process, and only the model, a "
            "function of the messages' mean, leaves it)",
            self._participation_text(),
        ]
        references = ["Liew & Takahashi 2022, §5.2", "Balle & Wang 2018, Thm 8"]
        if self._output_is_shuffle:
            assumptions.extend(self._round.assumptions)
            assumptions.append(
                f"without the assumptions above, the proven bound on the same release is the local one, {local}"
            )
            references[1:1] = [self._round.theorem, "Liew & Takahashi 2022, Lemma 2"]
        assumptions.append(
            "pan-privacy: the state holds the model and the sum of the noisy messages received so far "
            "in the current round; read right after a round's first message it shows that one "
            f"message, so one intrusion plus all outputs is bounded by the local guarantee {local}"
        )
        return self._report(self._output, local, assumptions, references)

    def _participation_text(self) -> str:
        r = self._round
        if r.participation == "all":
            return (
                f"every record is in exactly one round of b = {r.batch} users; later rounds see it only "
                "through the model, so its guarantee is one shuffled-Gaussian release (parallel "
                "composition over rounds)"
            )
        if r.participation == "subsampled":
            return (
                f"each window of N = {r.window} records is one round in which the server samples "
                f"m = {r.batch} users uniformly without replacement, without looking at their data; "
                "each record is in one window (parallel composition over rounds)"
            )
        return (
            f"each window of N = {r.window} records is one round; every user checks in with "
            f"probability {r.rate:g} using her own randomness; each record is in one window "
            "(parallel composition over rounds)"
        )

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """Counters, the iterates (post-processing of noisy means) and the round's noisy partial sum.

        ``count`` (messages in the partial sum) is stored as a float: under check-in or sampling it
        is a random outcome, like the noise, not a stream position.
        """
        return {
            "records": self._records,
            "filled": self._filled,
            "count": self._count,
            "partial": self._partial.copy(),
            **self._sgd.state(),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        records = read_int(_OWNER, state, "records")
        filled = read_int(_OWNER, state, "filled")
        count = read_float(_OWNER, state, "count")
        if filled >= self._round.window or count > filled or count != math.floor(count):
            raise InvalidInputError(
                f"{_OWNER}.load_state_dict: filled = {filled}, count = {count} do not fit a window of "
                f"{self._round.window}; was the state saved under another config?"
            )
        partial = read_array(_OWNER, state, "partial", (self._params,))
        sgd = AveragedSGD.from_state(_OWNER, state, self._params)
        self._records, self._filled, self._count, self._partial, self._sgd = records, filled, count, partial, sgd
