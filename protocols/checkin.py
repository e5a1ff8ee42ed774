"""RandomCheckinSGD: distributed SGD with random check-ins (Balle et al. 2020, Algs 1 and 2, §4.2).

Time and clients. Time is cut into *slots*; the server performs at most one model update per slot.
Each record is one client who wakes up at a slot — from its stream position (``time="position"``:
slot ⌊i / slot_length⌋ for the i-th record) or from its timestamp (``time="timestamp"``: slot
⌊(t − origin) / slot_length⌋, timestamps passed to :meth:`RandomCheckinSGD.learn_many`). On waking
the client performs a random check-in (Balle et al. 2020 Def. 3.1) with her own randomness: with probability p₀
she requests one slot chosen uniformly from her window of m slots, otherwise she abstains
(:func:`check_in` is the client-side helper for real deployments; in a replay it is simulated).

- ``window="sliding"`` (Balle et al. 2020 §4.2): the window is {w, …, w + m − 1} for a client waking at slot w.
- ``window="fixed"`` (Balle et al. 2020 Alg. 1): slots are grouped into rounds of m; a client waking during round r
  checks into a slot of round r + 1 (in Alg. 1 every client checks in before the round's first
  slot; in a stream that means the next round).

Server. Slots are closed in order as time passes (a record waking at slot w closes every slot
< w). ``update="single"`` (Balle et al. 2020 Alg. 1): one client among those checked in at the slot is chosen
uniformly (each candidate draws a uniform key, the least key wins — the client-side equivalent of
the server's uniform pick, independent of all data); her message updates the model; an empty slot
gets a *dummy update*, the same local randomizer applied to the zero gradient.
``update="averaged"`` (Balle et al. 2020 Alg. 2): all checked-in clients' messages are averaged; empty slots are
skipped. Each update is a projected SGD step with public step sizes (:class:`panpriv.protocols.sgd.AveragedSGD`),
and the released model is the average of the iterates.

Local randomizer (``randomizer``): ``"l2"`` — the pure ε₀-DP ℓ2-ball mechanism of Duchi, Jordan &
Wainwright (proof in :class:`panpriv.protocols.randomizers.L2BallRandomizer`); ``"gaussian"`` — clip to C
and add N(0, (σC)² I), an (ε₀, δ₀)-DP randomizer.

Deviation forced by streaming (stated in every report). In Balle et al. 2020 the chosen client receives the
current model θ_j at her slot j and computes her gradient then. A replayed record is available only
when it arrives, and raw records never stay in the process, so here a client who checks in computes
and randomizes her gradient *on arrival*, at the model of that time, and the message waits for its
slot (at most m slots for sliding windows, 2m for fixed ones). Privacy is unaffected: the message
is still the local randomizer applied to her record with parameters that depend only on earlier
outputs (an adaptive local randomizer, as the accounting requires). Utility pays for staleness.

Guarantee against the analyzer (``output``), from :mod:`panpriv.accounting.checkin`, per record:

- single update, ε₀-DP randomizer: the amplified bound derived there for Balle et al. 2020 Thm 3.2 (fixed window)
  or the setting of Thm 4.3 (sliding windows), at the target δ; the randomizer's ε₀ is the largest
  for which that bound meets the target ε (never below ε itself: the bound is never above ε₀).
- averaged updates (Balle et al. 2020 Thm 4.1), or the Gaussian randomizer (an (ε₀, δ₀) randomizer, for which no
  amplified bound is derived): the unamplified fallback (ε₀, δ₀) — each record passes at most once
  through the local randomizer — with ε₀ (resp. σ) calibrated to the target directly.

Each record wakes once and so takes part in at most one window; records in other windows use the
same records in both neighbouring worlds, which is what the accounting assumes.

Pan-private view (``intrusion``). The state holds the model, its average and, for each pending
slot, the kept candidate's message (single) or the running sum of messages and their count
(averaged): local-randomizer outputs. An intruder may see a record's message itself, so one
intrusion plus all outputs is bounded by the local guarantee (ε₀, δ₀) — which is also the
output bound when nothing is amplified.

References
----------
Balle, Kairouz, McMahan, Thakkar & Thakurta (2020), Def. 3.1, Alg. 1, Thm 3.2, Alg. 2, Thm 4.1,
§4.2 and Thm 4.3; Cheu et al. 2022, Def. C.2.
Duchi, Jordan & Wainwright (2018) (the ℓ2 randomizer).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.checkin import CheckinGuarantee, averaged_updates, fixed_window, sliding_window
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import scratch
from panpriv.protocols import validation as check
from panpriv.protocols.base import StateValue, check_batch
from panpriv.protocols.calibration import smallest_feasible
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomizers import GaussianRandomizer, L2BallRandomizer, LocalRandomizer, normalise_rows
from panpriv.protocols.randomness import NOISE_BLOCK_ROWS, NoiseSource, RngLike
from panpriv.protocols.scalar_residue import scale_rows, scrub_freed_floats
from panpriv.protocols.sgd import AveragedSGD, MessageSGDLearner, bound_sq
from panpriv.protocols.state_io import read_array, read_int

Array = NDArray[np.float64]

Update = Literal["single", "averaged"]
UPDATES: tuple[Update, ...] = ("single", "averaged")
Window = Literal["sliding", "fixed"]
WINDOWS: tuple[Window, ...] = ("sliding", "fixed")
Clock = Literal["position", "timestamp"]
TIMES: tuple[Clock, ...] = ("position", "timestamp")
RandomizerName = Literal["l2", "gaussian"]
RANDOMIZERS: tuple[RandomizerName, ...] = ("l2", "gaussian")
NO_CANDIDATE = 1.0
"""Key of a slot with no candidate (drawn keys lie in [0, 1))."""

_OWNER = "RandomCheckinSGD"


def window_start(wake_slot: int | NDArray[np.int64], slots: int, window: str) -> int | NDArray[np.int64]:
    """First slot of the check-in window of a client waking at ``wake_slot``.

    ``"sliding"``: the wake slot itself (Balle et al. 2020 §4.2). ``"fixed"``: the first slot of the next round of
    ``slots`` slots (Balle et al. 2020 Alg. 1, every client checks in before the round starts).
    """
    if window == "sliding":
        return wake_slot
    return (wake_slot // slots + 1) * slots


def check_in_slots(
    first_slots: NDArray[np.int64], slots: int, probability: float, generator: np.random.Generator
) -> NDArray[np.int64]:
    """Random check-ins (Balle et al. 2020 Def. 3.1) of clients whose windows start at ``first_slots``.

    Each client, independently: with probability p₀ the slot ``first + U{0, …, slots − 1}``,
    otherwise −1 (abstains).
    """
    first_slots = np.asarray(first_slots, dtype=np.int64)
    joins, offsets = _check_in_draws(first_slots.shape, slots, probability, generator)
    return np.where(joins, first_slots + offsets, -1)


def _check_in_draws(
    shape: int | tuple[int, ...], slots: int, probability: float, generator: np.random.Generator
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """The draws of random check-ins, in their order: whether each client checks in (probability
    p₀), then her offset U{0, …, slots − 1} in her window (drawn for every client)."""
    return generator.random(shape) < probability, generator.integers(0, slots, size=shape)


def check_in(
    wake_slot: int, slots: int, probability: float, window: str = "sliding", rng: RngLike = None
) -> int | None:
    """Client side of a random check-in, for real deployments: the slot to request, or ``None``.

    Parameters
    ----------
    wake_slot
        The slot at which the client becomes available (≥ 0).
    slots
        m, the window length in slots.
    probability
        p₀ in (0, 1], the probability of checking in at all.
    window
        ``"sliding"`` or ``"fixed"`` (see :func:`window_start`).
    rng
        ``None`` (default): fresh OS entropy, as a client must use; a seed only for tests.

    References
    ----------
    Balle et al. 2020, Def. 3.1 (an (R, p₀) check-in), Alg. 1 (client side), §4.2.
    """
    owner = "check_in"
    wake_slot = check.positive_int(owner, "wake_slot", wake_slot, minimum=0)
    slots = check.positive_int(owner, "slots", slots)
    probability = _probability(owner, "probability", probability)
    window = check.choice(owner, "window", window, WINDOWS)
    first = np.array([window_start(wake_slot, slots, window)], dtype=np.int64)
    with NoiseSource(rng).draw() as generator:
        slot = int(check_in_slots(first, slots, probability, generator)[0])
    return None if slot < 0 else slot


@functools.lru_cache(maxsize=128)
def amplified_epsilon0(update: str, window: str, probability: float, slots: int, epsilon: float, delta: float) -> float:
    """The largest ε₀ (to 1e-6 relative) whose check-in bound at δ is at most ε (cached).

    Only single updates amplify (:func:`guarantee`); otherwise this is ε. The bound is
    non-decreasing in ε₀ and equals ε₀ when nothing is gained, so the result is at least ε.
    """
    bound = _accountant(update, window)
    if update == "averaged":
        return epsilon
    # smallest_feasible searches a non-increasing function: search x = 1/ε₀.
    x = smallest_feasible(lambda x: bound(1.0 / x, probability, slots, delta).epsilon, epsilon)
    return max(epsilon, 1.0 / x)


def guarantee(update: str, window: str, epsilon0: float, delta0: float, probability: float, slots: int, delta: float) -> CheckinGuarantee:
    """The output guarantee of a check-in protocol from :mod:`panpriv.accounting.checkin`.

    single + fixed: ``fixed_window`` (Balle et al. 2020 Thm 3.2); single + sliding: ``sliding_window`` (the
    setting of Balle et al. 2020 Thm 4.3); averaged: ``averaged_updates`` (Balle et al. 2020 Thm 4.1, unamplified). With
    δ₀ > 0 every one of them is the unamplified fallback (ε₀, δ₀).
    """
    if update == "averaged":
        return averaged_updates(epsilon0, delta0)
    return _accountant(update, window)(epsilon0, probability, slots, delta, delta0)


def _accountant(update: str, window: str) -> Callable[..., CheckinGuarantee]:
    return fixed_window if window == "fixed" else sliding_window


class RandomCheckinSGD(MessageSGDLearner):
    """SGD with random check-ins of streaming clients (Balle et al. 2020 Algs 1–2, sliding windows §4.2).

    Parameters
    ----------
    dim
        Number of raw features d.
    loss
        A :class:`panpriv.protocols.losses.Loss`, its name or its config dict; a name (``"logistic"``) or a config dict
        without ``intercept`` learns an intercept (:func:`panpriv.protocols.losses.learner_loss`: the model ``panpriv run``
        learns from the same settings). Default: ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon, delta
        Target output guarantee per record; the local randomizer is calibrated to meet it (module
        docstring).
        Defaults: ε = 1, δ = 1e-6 (:mod:`panpriv.protocols.defaults`, the service's too).
    update
        ``"single"`` (Alg. 1: one client or a dummy per slot) or ``"averaged"`` (Alg. 2).
    window
        ``"sliding"`` (default) or ``"fixed"``.
    slots
        m, the check-in window length in slots.
    checkin_probability
        p₀ in (0, 1].
    time
        ``"position"`` (default) or ``"timestamp"``: where the wake-up slot comes from.
    slot_length
        Records per slot (``"position"``, an integer ≥ 1) or seconds per slot (``"timestamp"``).
    origin
        Timestamp of the start of slot 0 (``"timestamp"`` only); timestamps must be ≥ origin.
    randomizer
        ``"l2"`` (pure ε₀-DP, default) or ``"gaussian"``.
    clip
        C, the norm gradients are clipped to; ``None``: the loss's Lipschitz constant over Θ.
    radius
        Radius r of Θ, the ℓ2 ball of parameters (D = 2r); ``None`` (default): r = √d, never below 1
        (:func:`panpriv.protocols.base.default_radius`, a rule that looks at no data).
    feature_bound
        Features are clipped to this norm.
    rng
        ``None`` (default): fresh OS entropy for every draw. A seed or generator: the labelled
        replay/testing mode (no pan-private guarantee).

    References
    ----------
    Balle et al. 2020, Def. 3.1, Algs 1–2, Thms 3.2, 4.1, 4.3, §4.2; Duchi, Jordan & Wainwright (2018).
    """

    name = "checkin"

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "slots": 5, "radius": 20.0},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        delta: float = DEFAULT_DELTA,
        update: Update = "single",
        window: Window = "sliding",
        slots: int = 1000,
        checkin_probability: float = 1.0,
        time: Clock = "position",
        slot_length: float = 1,
        origin: float = 0.0,
        randomizer: RandomizerName = "l2",
        clip: float | None = None,
        radius: float | None = None,
        feature_bound: float = 1.0,
        rng: RngLike = None,
    ) -> None:
        self._setup(dim, loss, epsilon, delta, clip, radius, feature_bound, rng)
        self.update = check.choice(_OWNER, "update", update, UPDATES)
        self.window = check.choice(_OWNER, "window", window, WINDOWS)
        self.slots = check.positive_int(_OWNER, "slots", slots)
        self.checkin_probability = _probability(_OWNER, "checkin_probability", checkin_probability)
        self.time = check.choice(_OWNER, "time", time, TIMES)
        if self.time == "position":
            self.slot_length: float = check.positive_int(_OWNER, "slot_length", slot_length)
        else:
            self.slot_length = check.positive(_OWNER, "slot_length", slot_length)
        self.origin = check.nonnegative(_OWNER, "origin", origin) if self.time == "timestamp" else 0.0
        if self.time == "position" and origin != 0.0:
            raise InvalidInputError(check.message(_OWNER, "origin", "0.0 when time='position'", origin))
        self.randomizer = check.choice(_OWNER, "randomizer", randomizer, RANDOMIZERS)
        self._local = self._make_randomizer()
        local = self._local.local_guarantee()
        self._output = guarantee(
            self.update, self.window, local.epsilon, local.delta, self.checkin_probability, self.slots, self.delta
        )
        self._noise_moment = self._local.noise_second_moment(self._params)
        self._buffer = self.slots if self.window == "sliding" else 2 * self.slots  # pending slots

        self._latest = -1  # wake slot of the latest record (−1: none yet)
        self._clock = -1  # first slot not yet closed (−1: not started)
        self._messages = np.zeros((self._buffer, self._params))  # per pending slot (index slot mod buffer)
        self._marks = np.full(self._buffer, NO_CANDIDATE if self.update == "single" else 0.0)
        # The per-record loop's constants and working state (learn_many).
        self._dphi = scratch.scalar_dphi(self.loss)
        self._l2_norm = self._local.scale(self._params) if isinstance(self._local, L2BallRandomizer) else 0.0
        self._keep_probability = self._local.keep_probability if isinstance(self._local, L2BallRandomizer) else 0.0
        self._pending: dict[int, list[int]] = {}  # slot index -> clients of the sub-block in flight
        self._sub_block: tuple[Array, Array, Array] = (np.zeros((0, self._params)), np.zeros(0), np.zeros(0))
        self._iterates = np.zeros((2, self._params))  # θ and the average, stacked (learn_many's working copy)
        self._theta_work, self._average_work = self._iterates
        self._step_delta = np.zeros((2, self._params))
        self._weight_work, self._moment_work = self._sgd.weight, self._sgd.moment
        # −η and T of the step as 0-d float64 arrays: the same operands as Python floats, but a
        # ufunc takes them without its scalar-conversion cost (public values, never zeroed).
        self._minus_eta, self._weight_array, self._factor = np.zeros(()), np.zeros(()), np.zeros(())
        self._flags = np.zeros((3, NOISE_BLOCK_ROWS), dtype=bool)  # ℓ2 messages' hemisphere and work flags (_l2_signs)
        self._l2_work: tuple[NDArray[Any], ...] = ()  # the sub-block's ℓ2 draws and work views (_learn_sub_block)
        self._ridge_work = np.zeros(self._params)
        self._dummies, self._dummies_used = np.zeros((0, self._params)), 0
        self._unit_bound = bound_sq(self._clip, self._noise_moment, 1.0, self.loss.ridge * self.radius)
        self._diameter, self._radius = self._ball.diameter, self._ball.radius

    def _make_randomizer(self) -> LocalRandomizer:
        """The local randomizer, calibrated to the target (module docstring)."""
        if self.randomizer == "gaussian":
            return GaussianRandomizer.calibrated(self._clip, self.epsilon, self.delta)
        epsilon0 = amplified_epsilon0(
            self.update, self.window, self.checkin_probability, self.slots, self.epsilon, self.delta
        )
        return L2BallRandomizer(self._clip, epsilon0)

    def describe_noise(self) -> tuple[str, ...]:
        """The local randomizer of every checked-in update (Balle et al. 2020, Alg. 1)."""
        local = self._local.local_guarantee()
        return (
            f"every checked-in update: the {self.randomizer} local randomizer on the gradient clipped to "
            f"C = {self._clip:.6g}, ({local.epsilon:.4g}, {local.delta:.3g})-DP alone; {self.slots:,} slots, "
            f"check-in probability {self.checkin_probability:g}",
        )

    def messages_per_step(self) -> tuple[float, str]:
        """k of :meth:`panpriv.protocols.sgd.MessageSGDLearner.noise_to_signal`: 1 for ``update="single"``
        (Balle et al. 2020 Alg. 1: one message per slot — or a dummy, noise with no gradient at all).
        For ``"averaged"`` (Alg. 2) with ``time="position"``, the expected messages per slot in
        steady state, slot_length·p₀ (a slot is in the windows of m wake slots' clients, each
        checking into it with probability p₀/m); with ``time="timestamp"`` the records per slot
        are not public, so k = 1, the noise of one message."""
        if self.update == "averaged" and self.time == "position":
            return self.slot_length * self.checkin_probability, "expected messages per slot, slot_length x p0"
        if self.update == "averaged":
            return 1.0, "one message: the messages per slot of a timestamp clock are not public"
        return 1.0, "one message or a dummy per slot"

    def _noise_formula(self) -> str:
        """ρ = √(v/k)/C in the randomizer's calibration. ``"l2"``: the output has norm
        B = C/(tanh(ε₀/2)·κ_p) (Duchi, Jordan & Wainwright 2018; :class:`panpriv.protocols.randomizers.L2BallRandomizer`),
        v = B², so ρ = 1/(tanh(ε₀/2)·κ_p·√k) ≥ 1/κ_p ≈ √(πp/2) for k = 1: a single update is always
        noise-dominated. ``"gaussian"``: v = p(σC)², ρ = σ·√(p/k)."""
        if isinstance(self._local, GaussianRandomizer):
            return f"sigma sqrt(p/k) [sigma = {self._local.noise_multiplier:.3g}, p = {self._params}]"
        return (f"B / (C sqrt(k)) = 1 / (tanh(eps0/2) kappa_p sqrt(k)) [eps0 = {self._local.local_guarantee().epsilon:.3g}, "
                f"p = {self._params}]")

    @property
    def local_randomizer(self) -> LocalRandomizer:
        """The calibrated local randomizer (its ε₀ or noise multiplier)."""
        return self._local

    # -- learning ------------------------------------------------------------------------------

    def learn_many(self, X: Array, y: Array, timestamps: Array | None = None) -> None:
        """Add a micro-batch of clients, in arrival order; any split gives the same mechanism.

        ``timestamps`` (shape (m,)) are required with ``time="timestamp"`` and refused otherwise;
        wake slots must not decrease along the stream. Features and labels are computed for a
        block of records at a time (:func:`panpriv.protocols.scratch.features`; labels are therefore
        checked for the whole block), and the clients are then taken one at a time: each new wake
        slot closes the slots before it (:meth:`_close_until`), then the client checks in and, if
        she may be used, takes her gradient at the current model (:meth:`_learn_sub_block`) and
        sends her message (:meth:`_send`).

        Randomness. One generator keyed from OS entropy per sub-block of at most
        :data:`panpriv.protocols.randomness.NOISE_BLOCK_ROWS` clients, who are in flight (why that costs no
        record outside the sub-block its guarantee: :mod:`panpriv.protocols.randomness`). At the
        sub-block's start it draws, for all its clients, in this order: whether each checks in
        (p₀), her offset in her window, her key (single updates), and her randomizer's randomness
        — ℓ2: the two uniforms and the Gaussian direction (normalised) of
        :meth:`panpriv.protocols.randomizers.L2BallRandomizer.privatize`; Gaussian: the noise N(0, (σC)² I)
        — used or not; the dummies R(0) of the empty slots closed during the sub-block are drawn
        from it as many as it has clients at a time, when the first is needed. All of it lives in
        scratch and is zeroed with it; the generator's state is zeroed at the sub-block's end.
        """
        X, y = check_batch(_OWNER, X, y, self.dim)
        wake = self._wake_slots(X.shape[0], timestamps)
        self._iterates = np.stack([self._sgd.theta, self._sgd.average])
        self._theta_work, self._average_work = self._iterates
        self._weight_work, self._moment_work = self._sgd.weight, self._sgd.moment
        try:
            for start in range(0, X.shape[0], scratch.BLOCK_ROWS):
                block = slice(start, start + scratch.BLOCK_ROWS)
                Z, labels, norms = scratch.features_with_norms(self.loss, X[block], y[block], self.feature_bound,
                                                               self._scratch)
                for first in range(0, Z.shape[0], NOISE_BLOCK_ROWS):
                    rows = slice(first, first + NOISE_BLOCK_ROWS)
                    with self._noise.draw() as generator:
                        self._learn_sub_block(Z[rows], norms[rows], labels[rows],
                                              wake[start + first : start + first + NOISE_BLOCK_ROWS], generator)
        finally:
            if self._pending:  # only after an exception inside a sub-block: its holders' messages, formed
                self._send(list(self._pending))
            self._flags.fill(False)
            self._sgd = AveragedSGD(self._theta_work, self._average_work, self._weight_work, self._moment_work)
            self._step_delta.fill(0.0)
            self._ridge_work.fill(0.0)
            self._scratch.wipe()
            scrub_freed_floats()  # the candidates' margins and slopes, Python floats (panpriv.protocols.scalar_residue)

    def _wake_slots(self, count: int, timestamps: Array | None) -> NDArray[np.int64]:
        if self.time == "position":
            if timestamps is not None:
                raise InvalidInputError(check.message(_OWNER, "timestamps", "None when time='position'", "an array"))
            return (self._records + np.arange(count, dtype=np.int64)) // int(self.slot_length)
        if timestamps is None:
            raise InvalidInputError(check.message(_OWNER, "timestamps", "an array of shape (m,) when time='timestamp'", None))
        t = np.asarray(timestamps, dtype=np.float64)
        if t.shape != (count,) or not np.all(np.isfinite(t)) or np.any(t < self.origin):
            raise InvalidInputError(
                f"{_OWNER}: timestamps must be {count} finite floats >= origin = {self.origin:g}; got shape {t.shape}"
            )
        wake = np.floor((t - self.origin) / self.slot_length).astype(np.int64)
        if np.any(np.diff(np.r_[max(self._latest, 0), wake]) < 0):
            raise InvalidInputError(f"{_OWNER}: timestamps go back in time (wake slots must not decrease)")
        return wake

    def _learn_sub_block(self, Z: Array, norms: Array, labels: Array, wakes: NDArray[np.int64],
                         generator: np.random.Generator) -> None:
        """The clients of one sub-block (features ``Z``, their norms, labels, wake slots), in order;
        their randomness drawn up front (see :meth:`learn_many`).

        A client who may be used records only her clipped slope φ′_C (a scalar of the same kind as
        the loss's φ′) and which slot she holds; her message is formed from it and her randomness
        in numpy, all at once at the sub-block's end (:meth:`_send`), or earlier if her slot
        closes first — so no per-client randomizer value ever passes through a Python scalar.

        The common close — one single-update slot without ridge whose kept message (if any) is
        already formed — is :meth:`_close` and :meth:`_update` inlined on local names, the same
        numpy operations on the same operands in the same order (so bit for bit the same, which
        the exact Alg. 1 replay in ``tests/protocols/test_checkin_learner.py`` pins on both
        paths); every other close goes through :meth:`_close_until`. Per record, the numpy calls'
        own cost dominates their 21-element work at d = 20, hence the locals (issue 18)."""
        k = Z.shape[0]
        joins, offsets = _check_in_draws(k, self.slots, self.checkin_probability, generator)
        keys = generator.random((k,)).tolist() if self.update == "single" else None
        if isinstance(self._local, GaussianRandomizer):
            noise = self._scratch.take("randomizer_noise", k, self._params)
            generator.standard_normal(out=noise)
            noise *= self._local.noise_std
        else:
            uniforms = self._scratch.take("randomizer_uniforms", k, 2)
            generator.random(out=uniforms)
            directions = self._scratch.take("randomizer_noise", k, self._params)
            generator.standard_normal(out=directions)
            lengths = self._scratch.take("direction_norms", k)
            normalise_rows(directions, lengths, self._scratch.take("direction_divisors", k, self._params))  # unit u
            np.einsum("ij,ij->i", directions, Z, out=lengths)  # ⟨u, z⟩: ⟨u, g⟩ = φ′_C·⟨u, z⟩
            hemisphere, away, keep = self._flags[:, :k]
            np.less(uniforms[:, 1], self._keep_probability, out=hemisphere)  # the hemisphere kept
            size, work, along = (self._scratch.take(name, k) for name in ("send_norms", "send_work", "send_along"))
            self._l2_work = (directions, uniforms[:, 0], lengths, hemisphere, away, keep, size, work, along)
        slopes = self._scratch.take("clipped_slopes", k)
        self._sub_block = (Z, norms, slopes)
        self._ridge_work = self._scratch.take("ridge_step", self._params)
        self._dummies = self._scratch.take("dummies", k if self.update == "single" else 0, self._params)
        self._dummies_used = self._dummies.shape[0]  # drawn when the sub-block's first empty slot closes
        np.add(offsets, window_start(wakes, self.slots, self.window), out=offsets)
        np.remainder(offsets, self._buffer, out=offsets)  # each client's slot index: window start + offset
        join_list, index_list, wake = joins.tolist(), offsets.tolist(), wakes.tolist()
        theta, dphi, clip, marks, pending = self._theta_work, self._dphi, self._clip, self._marks, self._pending
        margin = self._scratch.take("margin", 1)
        slots, buffer = self.slots, self._buffer
        # The common close inlined on local names (_close then _update, operation for operation):
        # one single-update slot, none of whose candidates is in flight, no ridge gradient. (Each
        # numpy call here costs more than its 21-element work: ufuncs take out= positionally.)
        inline = self.update == "single" and not self.loss.ridge
        messages, dummies, iterates, average, delta = self._messages, self._dummies, self._iterates, self._average_work, self._step_delta
        minus_eta, weight_array, factor, delta0, delta1 = self._minus_eta, self._weight_array, self._factor, delta[0], delta[1]
        unit_bound, diameter, radius, sqrt = self._unit_bound, self._diameter, self._radius, math.sqrt
        multiply, subtract, divide, add = np.multiply, np.subtract, np.divide, np.add
        clock, records, latest = self._clock, self._records, self._latest
        moment, weight, used = self._moment_work, self._weight_work, self._dummies_used
        try:
            for i in range(k):
                slot = wake[i]
                if clock < 0:
                    clock = int(window_start(slot, slots, self.window))
                if slot > clock:
                    closing = clock % buffer
                    if inline and slot == clock + 1 and closing not in pending:
                        message = kept = messages[closing]
                        if not marks[closing] < NO_CANDIDATE:
                            if used == k:
                                self._draw_dummies(generator)
                                used = 0
                            message = dummies[used]
                            used += 1
                        moment += unit_bound
                        weight += 1.0
                        minus_eta[()] = -(diameter / sqrt(moment))
                        weight_array[()] = weight
                        multiply(message, minus_eta, delta0)
                        subtract(theta, average, delta1)
                        divide(delta1, weight_array, delta1)
                        add(iterates, delta, iterates)
                        norm = sqrt(theta.dot(theta))
                        if norm > radius:
                            factor[()] = radius / norm
                            multiply(theta, factor, theta)
                        kept.fill(0.0)
                        marks[closing] = NO_CANDIDATE
                        clock = slot
                    else:  # the general close on the learner's fields
                        self._clock, self._moment_work, self._weight_work, self._dummies_used = clock, moment, weight, used
                        try:
                            self._close_until(slot, generator)
                        finally:
                            clock, moment, weight, used = self._clock, self._moment_work, self._weight_work, self._dummies_used
                records += 1
                latest = slot
                if not join_list[i]:
                    continue
                index = index_list[i]
                if keys is not None:
                    if not keys[i] < marks[index]:
                        continue
                    marks[index] = keys[i]
                    pending[index] = [i]
                else:
                    pending.setdefault(index, []).append(i)
                    marks[index] += 1.0
                if dphi is None:
                    margin[0] = Z[i] @ theta
                    slope = float(self.loss._dphi(margin, labels[i : i + 1])[0])
                else:
                    slope = dphi(float(Z[i].dot(theta)), labels.item(i))
                slopes[i] = slope * (clip / max(abs(slope) * norms.item(i), clip))
        finally:
            self._clock, self._records, self._latest = clock, records, latest
            self._moment_work, self._weight_work, self._dummies_used = moment, weight, used
        self._send(list(self._pending))
        joins.fill(False)
        offsets.fill(0)
        self._flags.fill(False)

    def _draw_dummies(self, generator: np.random.Generator) -> None:
        """Draw the dummies R(0) for up to the sub-block's size of empty single-update slots
        (:meth:`panpriv.protocols.randomizers.LocalRandomizer.dummy`, vectorised) into scratch."""
        drawn = self._local.dummy(self._dummies.shape[0], self._params, generator)
        np.copyto(self._dummies, drawn)
        drawn.fill(0.0)
        self._dummies_used = 0

    def _send(self, indices: list[int]) -> None:
        """Form the messages of the pending clients of slots ``indices`` (from this sub-block) and
        put them in their slots (single: the slot's message; averaged: added to its sum).

        Each client's gradient is φ′_C·z, φ′_C her slope clipped as
        :func:`panpriv.protocols.scratch.clipped_gradients` clips the gradient (min(1, C/(|φ′|‖z‖)); equal
        up to rounding). ℓ2 randomizer: ±B·u for her unit direction u, with
        :meth:`panpriv.protocols.randomizers.L2BallRandomizer.privatize`'s sign from ‖g‖ = |φ′_C|‖z‖,
        ⟨u, g⟩ = φ′_C⟨u, z⟩ and her two uniforms, operation for operation. Gaussian randomizer:
        φ′_C·z plus her noise row; the ℓ2 signs come from :meth:`_l2_signs`. Every work array
        (clean gradients, norms, sides, signs) lives in scratch or in the flags zeroed at the
        sub-block's end."""
        clients, slots = [], []
        for index in indices:
            for i in self._pending.pop(index):
                clients.append(i)
                slots.append(index)
        if not clients:
            return
        Z, norms, slopes = self._sub_block
        rows, targets = np.array(clients, dtype=np.intp), np.array(slots, dtype=np.intp)
        messages = self._scratch.take("send_messages", rows.size, self._params)
        if isinstance(self._local, GaussianRandomizer):
            chosen = scratch.rows(slopes, rows, self._scratch, "send_slopes")
            scratch.rows(Z, rows, self._scratch, "send_messages")
            scale_rows(messages, chosen, self._scratch.take("send_factors", rows.size, self._params))
            messages += scratch.rows(self._scratch.take("randomizer_noise", Z.shape[0], self._params), rows,
                                     self._scratch, "send_noise")
        else:
            signs = self._l2_signs()
            scratch.rows(self._l2_work[0], rows, self._scratch, "send_messages")  # the clients' directions
            scale_rows(messages, scratch.rows(signs, rows, self._scratch, "send_signs"),
                       self._scratch.take("send_factors", rows.size, self._params))
        if self.update == "single":
            self._messages[targets] = messages
        else:
            np.add.at(self._messages, targets, messages)
        messages.fill(0.0)

    def _l2_signs(self) -> Array:
        """±B, the ℓ2 message's length and sign, for every client of the sub-block in flight (those
        without a slope yet get a value never used), in scratch.

        :meth:`panpriv.protocols.randomizers.L2BallRandomizer.privatize`'s choice, operation for operation
        on the same floats: ‖g‖ = ‖z‖·|φ′_C|; toward iff u_side < 0.5 + min(‖g‖, C)/(2C); z's side
        iff ⟨u, g⟩ = ⟨u, z⟩·φ′_C is > 0 (toward) or < 0 (away: −⟨u, g⟩ > 0, negation being exact);
        keep iff that equals the hemisphere flag (u_hemisphere < keep probability, set per
        sub-block by :meth:`_learn_sub_block`) or ‖g‖ = 0. Computed over the whole sub-block rather
        than the clients sent, which saves the gathers and changes no client's value."""
        _, norms, slopes = self._sub_block
        _, sides, along_direction, hemisphere, away, keep, size, work, along = self._l2_work
        np.abs(slopes, out=work)
        np.multiply(norms, work, out=size)  # ‖g‖
        np.minimum(size, self._clip, out=work)
        work /= 2.0 * self._clip
        work += 0.5
        np.less(sides, work, out=away)  # toward
        np.logical_not(away, out=away)
        np.multiply(along_direction, slopes, out=along)  # ⟨u, g⟩
        np.negative(along, out=along, where=away)
        np.greater(along, 0.0, out=keep)  # on z's side
        np.equal(keep, hemisphere, out=keep)
        np.equal(size, 0.0, out=away)
        keep |= away
        np.copyto(work, -self._l2_norm)
        np.copyto(work, self._l2_norm, where=keep)
        return work

    def _close_until(self, slot: int, generator: np.random.Generator) -> None:
        """Close every slot before ``slot``, in order (one update each; none for an empty averaged
        slot, whose slot cannot hold messages unless pending); an empty single-update slot's dummy
        R(0) is drawn from ``generator`` (the sub-block's)."""
        if slot <= self._clock:
            return
        last = slot if self.update == "single" else min(slot, self._clock + self._buffer)
        for j in range(self._clock, last):
            self._close(j, generator)
        self._clock = slot

    def _close(self, slot: int, generator: np.random.Generator) -> None:
        """One slot's update, in place on the working iterates (:meth:`_update`)."""
        i = slot % self._buffer
        if i in self._pending:
            self._send(list(self._pending))  # messages of the sub-block in flight not formed yet: all at once
        if self.update == "single":
            if self._marks[i] < NO_CANDIDATE:
                self._update(self._messages[i], 1.0)
            else:
                if self._dummies_used == self._dummies.shape[0]:
                    self._draw_dummies(generator)
                self._update(self._dummies[self._dummies_used], 1.0)
                self._dummies_used += 1
            self._messages[i] = 0.0
            self._marks[i] = NO_CANDIDATE
            return
        elif self._marks[i] > 0.0:
            self._messages[i] /= self._marks[i]
            self._update(self._messages[i], self._marks[i])
        self._messages[i] = 0.0
        self._marks[i] = NO_CANDIDATE if self.update == "single" else 0.0

    def learn_slot(self, messages: Array) -> None:
        """Close the next slot from the randomized messages a separate shuffler released for it
        (the Encode-Shuffle-Analyze analyzer, :mod:`panpriv.streamer.esa.checkin_analyzer`; position slots).

        ``messages`` (k, p): for ``"single"`` at most one (k = 0: a dummy update R(0) drawn here),
        for ``"averaged"`` every candidate's (k = 0: skipped). The update is the one :meth:`_close`
        takes in process — :meth:`_step` on the message, the dummy or the mean of k — and slots
        before the first window (``"fixed"``: round 0) are never updated. Only the iterates and the
        counters change (no pending slot is involved); its wake slot is then complete:
        ``slot_length`` more records are counted."""
        messages = np.asarray(messages, dtype=np.float64).reshape(-1, self._params)
        count = messages.shape[0]
        if self.update == "single" and count > 1:
            raise InvalidInputError(f"{_OWNER}.learn_slot: a single-update slot has at most one message")
        slot = max(self._clock, 0)
        if slot >= int(window_start(0, self.slots, self.window)):
            if self.update == "single" and count == 0:
                with self._noise.draw() as generator:
                    dummy = self._local.dummy(1, self._params, generator)[0]
                self._step(dummy, 1.0)
                dummy.fill(0.0)
            elif count:
                self._step(messages.sum(axis=0) / count, float(count))
        self._clock, self._latest = slot + 1, slot
        self._records += int(self.slot_length)
    def _update(self, mean_message: Array, count: float) -> None:
        """:meth:`panpriv.protocols.sgd.MessageSGDLearner._step` (one :meth:`panpriv.protocols.sgd.AveragedSGD.step`
        on the mean message plus the ridge gradient), bit for bit, in place on the working θ and
        average (``out=`` operations in the same order; no array allocated per step). −η and T
        go to numpy as 0-d float64 arrays: the same operands as the Python floats, without the
        ufunc's scalar conversion. :meth:`_learn_sub_block` inlines this step for its common
        close: the two must stay operation for operation the same."""
        theta, average, delta = self._theta_work, self._average_work, self._step_delta
        bound = self._unit_bound if count == 1.0 else bound_sq(self._clip, self._noise_moment, count, self.loss.ridge * self.radius)
        gradient = mean_message
        if self.loss.ridge:
            gradient = self._ridge_work
            np.multiply(theta, self.loss.ridge, out=gradient)
            np.add(mean_message, gradient, out=gradient)
        self._moment_work += bound
        self._weight_work += 1.0
        self._minus_eta[()] = -(self._diameter / math.sqrt(self._moment_work))
        self._weight_array[()] = self._weight_work
        # One addition moves both rows: θ + (−η)·g (= θ − η·g exactly) and average + (θ − average)/T.
        np.multiply(gradient, self._minus_eta, out=delta[0])
        np.subtract(theta, average, out=delta[1])
        np.divide(delta[1], self._weight_array, out=delta[1])
        self._iterates += delta
        norm = math.sqrt(float(theta.dot(theta)))
        if norm > self._radius:
            self._factor[()] = self._radius / norm
            np.multiply(theta, self._factor, out=theta)

    # -- outputs -------------------------------------------------------------------------------

    def privacy(self) -> PrivacyReport:
        """Output: the check-in guarantee of :mod:`panpriv.accounting.checkin`; intrusion: the local one."""
        local = self._local.local_guarantee()
        output = Guarantee(self._output.epsilon, self._output.delta)
        randomizer = (
            f"the l2-ball randomizer of Duchi, Jordan & Wainwright with epsilon0 = {local.epsilon:.6g} "
            f"(pure), gradients clipped to C = {self._clip:.6g}"
            if self.randomizer == "l2"
            else f"gradient clipped to C = {self._clip:.6g} plus N(0, (sigma C)^2 I) with sigma = "
            f"{getattr(self._local, 'noise_multiplier', float('nan')):.6g}: ({local.epsilon:.6g}, {local.delta:g})-DP for sensitivity 2C"
        )
        assumptions = [
            "neighbouring streams differ in one record (replacement); each record is one client who "
            f"wakes once; stream positions{', timestamps' if self.time == 'timestamp' else ''}, slots "
            "and which slots were updated are public",
            f"local randomizer: {randomizer}; a dummy update is the same randomizer applied to the "
            "zero gradient",
            f"random check-ins (Balle et al. 2020 Def. 3.1) with probability {self.checkin_probability:g} into a "
            f"{self.window} window of {self.slots} slots, decided with the client's own randomness; "
            "the server chooses among checked-in clients without looking at their data",
            "streaming deviation from Balle et al. 2020: a client computes and randomizes her gradient on arrival, at "
            "the model of that time, and the message waits for its slot (privacy unaffected: an "
            "adaptive local randomizer)",
            f"{self._output.theorem}: {self._output.status}"
            + (" (panpriv.accounting.checkin, derivation in per_slot_epsilons)" if self._output.status == "derived" else
               " - each record passes at most once through the local randomizer"),
            f"pan-privacy: the state holds pending slots' local-randomizer messages; one intrusion plus "
            f"all outputs is bounded by the local guarantee {local} (the randomness of each sub-block of at most "
            "128 clients comes from one generator keyed from OS entropy at its start and zeroed after it; a read "
            "inside a micro-batch finds the clients in flight and their randomness, and gives them no guarantee)",
        ]
        references = ["Balle et al. 2020, Def. 3.1", "Balle et al. 2020, Alg. 2" if self.update == "averaged" else "Balle et al. 2020, Alg. 1"]
        references.append(self._output.theorem.split(" (")[0].replace("Balle et al. 2020 ", "Balle et al. 2020, "))
        references.append("Duchi, Jordan & Wainwright 2018" if self.randomizer == "l2" else "Balle & Wang 2018, Thm 8")
        return self._report(output, local, assumptions, references)

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """Counters and slots (public), the iterates, and the pending slots' noisy messages.

        ``slot_messages`` is the (slots in the buffer × parameters) array flattened row by row
        (1-D, as :mod:`panpriv.protocols.checks` compares state arrays coordinate by coordinate).

        ``slot_keys`` (single: the least check-in key per pending slot, 1 if none) or
        ``slot_counts`` (averaged: messages summed per pending slot, a random count stored as a
        float) accompany ``slot_messages``.
        """
        marks = "slot_keys" if self.update == "single" else "slot_counts"
        return {
            "records": self._records,
            "latest": self._latest,
            "clock": self._clock,
            "slot_messages": self._messages.ravel().copy(),
            marks: self._marks.copy(),
            **self._sgd.state(),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        records = read_int(_OWNER, state, "records")
        latest = read_int(_OWNER, state, "latest", minimum=-1)
        clock = read_int(_OWNER, state, "clock", minimum=-1)
        messages = read_array(_OWNER, state, "slot_messages", (self._buffer * self._params,))
        marks = read_array(_OWNER, state, "slot_keys" if self.update == "single" else "slot_counts", (self._buffer,))
        valid = np.all((marks >= 0.0) & (marks <= 1.0)) if self.update == "single" else np.all(marks == np.floor(marks))
        if not valid or np.any(marks < 0.0) or (records > 0) != (latest >= 0) or (latest >= 0) != (clock >= 0):
            raise InvalidInputError(
                f"{_OWNER}.load_state_dict: slot marks or counters are inconsistent; was the state saved "
                "under another config?"
            )
        sgd = AveragedSGD.from_state(_OWNER, state, self._params)
        self._records, self._latest, self._clock = records, latest, clock
        self._messages, self._marks, self._sgd = messages.reshape(self._buffer, self._params), marks, sgd


def _probability(owner: str, name: str, value: object) -> float:
    """A float in (0, 1]."""
    number = check.positive(owner, name, value)
    if number > 1.0:
        raise InvalidInputError(check.message(owner, name, "a float in (0, 1]", value))
    return number
