"""What the encoder-based shuffle learners share: PVEC rounds over a stream, and the local bound.

:class:`~panpriv.protocols.shuffle_sgd.ShuffleSGD` (Cheu et al. 2022, Alg. 3), :class:`~panpriv.protocols.shuffle_acsa.ShuffleACSA`
(Cheu et al. 2022, Alg. 4) and :class:`~panpriv.protocols.shuffle_gd.ShuffleGD` (Cheu et al. 2022, Alg. 5) all proceed in *rounds*:
the model is fixed during a round; each user (record) of the round computes her gradient at the
model's query point, clips it to norm L and runs PVEC's local randomizer on it
(:meth:`panpriv.protocols.encoder.VectorSum.randomize`, Cheu et al. 2022 Alg. 2 over Alg. 1); when the round's last user
has reported, the analyzer turns the shuffled messages into an unbiased estimate of the gradient
sum (:meth:`~panpriv.protocols.encoder.VectorSum.analyze`), divides by the number of users and the learner
takes a step. :class:`EncodedLearner` implements that loop once; each learner supplies the round's
:class:`~panpriv.protocols.encoder.VectorSum`, the gradients at its query point, and the step.

State between micro-batches (micro-batch invariance)
----------------------------------------------------
A round may straddle ``learn_many`` calls. The learner then keeps only what the shuffler has
received so far, in its canonical form: the per-coordinate totals of one-bits of the users of the
round so far (``totals``) and their number (``filled``). No raw record and no un-randomized gradient
is kept. Each user's message is drawn independently of how the stream is cut, and the totals are
sums of messages, so the state has the same distribution however the stream is split.
``totals`` is stored as float64 holding exact integers (below 2⁵³ in any sane configuration):
the conformance suite reads integer arrays as counters, and these are noisy values, not counters.

Pooled noise (the in-process path)
----------------------------------
Encoder and shuffler share this trusted process, and only the round's per-coordinate totals are
ever used, so each piece of a round (the rows of one scratch block inside one round, k users)
adds the k users' randomized roundings plus one Bin(k·b, p) per coordinate
(:meth:`VectorSum.add_messages` with ``pooled_noise=True``) instead of k·d draws of Bin(b, p).
A sum of independent Bin(b, p) is Bin(k·b, p), so ``totals`` at every piece boundary — between
micro-batches, when the round closes — has exactly the law it has under per-user draws, and so
has everything computed from it. :attr:`EncodedLearner.pooled_noise` = ``False`` draws every
user's message as her device would (:meth:`VectorSum.randomize`'s draws, in its order): the
reference the Encode–Shuffle–Analyze tests reproduce bit for bit (:mod:`panpriv.streamer.esa`, whose
clients always draw per user, since there each message leaves its user's device).

Pan-private view (Cheu et al. 2022, Def. C.2)
--------------------------------
Encoder, shuffler and analyzer run in this one process. An intruder who reads the state between two
records sees the model (a post-processing of earlier rounds' analyzer outputs) and ``totals``. Right
after the first user of a round has reported, ``totals`` *is* her message (with pooled noise: a
piece of one user has one user's law; the state between micro-batches is a piece boundary, and a
read inside ``learn_many`` finds the micro-batch in flight in the clear anyway): so the most an
intrusion adds is one user's message, protected only by her own binomial noise — the *local* guarantee of
PVEC's randomizer (:func:`message_guarantee`), which is far weaker than the shuffle-model guarantee
whenever the round has many users (roughly ε·√b for b users under the tight calibration). The
learners report it as such.

References
----------
Cheu, Joseph, Mao & Peng (2022): Alg. 1, Alg. 2, Thm 3.2 (PVEC), Algs 3–5, Def. 2.7 (sequential
interactivity), Def. C.2 (pan-privacy), App. A.3 (robust shuffle privacy).
"""

from __future__ import annotations

import abc
import bisect
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.binomial import pvec_parameters, tight_delta
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols import scratch
from panpriv.protocols import validation as check
from panpriv.protocols.base import Learner, StateValue, check_batch
from panpriv.protocols.encoder import VectorSum
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.randomness import RngLike
from panpriv.protocols.rounds import round_slices
from panpriv.protocols.state_io import read_array, read_int

Array = NDArray[np.float64]

Calibration = Literal["tight", "paper"]
CALIBRATIONS: tuple[Calibration, ...] = ("tight", "paper")

NORM_SLACK = 1e-9
"""Relative margin between the clip norm L and the ℓ₂ bound Δ₂ = L(1 + slack) declared to PVEC:
clipping to L is exact only up to a few ulps, and the encoder refuses rows above Δ₂."""

LOCAL_GRID = 2.0**0.25
"""Ratio of the geometric grid on which :func:`message_guarantee` searches the local ε (the
reported ε is at most this factor above the least ε the accountant proves)."""

_LOCAL_MAX_EPSILON = 1e4  # beyond this the local guarantee is reported as none

LOCAL_COST_LIMIT = 2e6
"""Largest g·σ (σ the spread of the binomial noise the accountant is run with) for which
:func:`message_guarantee` runs :func:`panpriv.accounting.binomial.tight_delta`, whose cost grows like g·σ
(about 25 s per call at the limit). Above it the local guarantee is reported as none — vacuous, so
always true. Only the paper's calibration gets there: its g ≥ 2Δ₂√n grows with the round size and
the gradient bound."""


def max_guarantee(a: Guarantee, b: Guarantee) -> Guarantee:
    """Componentwise maximum: a guarantee implied by each of ``a`` and ``b``."""
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))


def sum_variance_hint(
    calibration: str, d: int, epsilon: float, delta: float, l2_bound: float, honest_fraction: float
) -> float:
    """Approximate per-coordinate variance of PVEC's sum estimate, for *planning* only.

    The variance hardly depends on the number of users (the noise is calibrated to the sensitivity
    Δ = 2Δ₂ of the sum, whatever n is), so plans (batch sizes, step sizes) can be made before the
    batch size is known. ``"paper"``: the exact bound of Cheu et al. 2022 Thm 3.2's parameters for one user
    (:func:`panpriv.accounting.binomial.pvec_parameters`). ``"tight"``: the Gaussian proxy
    (2Δ₂·σ_unit)²/γ with σ_unit the analytic-Gaussian noise per unit sensitivity at (ε, δ) — the
    tight calibration is within ~20 % of it (:mod:`panpriv.accounting.binomial`). Privacy never depends on
    this number: the noise added is always that of the calibrated :class:`VectorSum`.
    """
    if calibration == "paper":
        return pvec_parameters(1, d, epsilon, delta, l2_bound, honest_fraction).variance_bound
    return (2.0 * l2_bound * analytic_sigma(epsilon, delta)) ** 2 / honest_fraction


@functools.lru_cache(maxsize=256)
def _local_epsilon(g: int, b: int, p: float, d: int, delta: float, start: float) -> float:
    """Least ε = start·LOCAL_GRID^k (k ≥ 0) with tight_delta(ε; one user) ≤ δ, or inf."""

    def passes(k: int) -> bool:
        return tight_delta(start * LOCAL_GRID**k, g, b, p, d, 1) <= delta

    # Shortcut where one user's noise is plentiful (the paper's calibration): the accountant's cost
    # grows with the noise's spread, so first try ε = start with only the first ``trials`` of the
    # b trials — the Gaussian-proxy amount for sensitivity 2(g + √d). Bin(b, p) is Bin(trials, p)
    # plus independent noise, so a bound for the fewer trials holds for the message (post-processing).
    trials = math.ceil((2.0 * (g + math.sqrt(d)) * analytic_sigma(start, delta)) ** 2 / (p * (1.0 - p)))
    if trials < b and g * math.sqrt(trials * p * (1.0 - p)) <= LOCAL_COST_LIMIT:
        if tight_delta(start, g, trials, p, d, 1) <= delta:
            return start
    if g * math.sqrt(b * p * (1.0 - p)) > LOCAL_COST_LIMIT:
        return math.inf
    if passes(0):
        return start
    low, high = 0, 4  # grid indices: low fails; double the index until one passes
    while not passes(high):
        low, high = high, 2 * high
        if start * LOCAL_GRID**high > _LOCAL_MAX_EPSILON:
            return math.inf
    # The least passing index in (low, high] (the bound is non-increasing in ε; any index
    # returned has passed, so the result never rests on that).
    least = low + 1 + bisect.bisect_left(range(low + 1, high), True, key=passes)
    return start * LOCAL_GRID**least


def pvec_noise_lines(vector_sums: Iterable[VectorSum]) -> tuple[str, ...]:
    """``describe_noise`` lines of the PVEC rounds (Cheu et al. 2022, Alg. 2): each user's clipped
    gradient, encoded per coordinate by randomized rounding to g levels plus b Bernoulli(p) noise bits."""
    lines = ["each user's clipped gradient is encoded by PVEC (Cheu et al. 2022, Alg. 2): per coordinate, "
             "randomized rounding to g levels plus b Bernoulli(p) noise bits; the shuffler mixes the round's bits"]
    for vector_sum in vector_sums:
        p = vector_sum.parameters
        lines.append(
            f"  rounds of n = {p.n:,} users, d = {p.d}: g = {p.g}, b = {p.b}, p = {p.p:.4g}, l2 bound {p.l2_bound:.6g} "
            f"-> ({p.epsilon:.4g}, {p.delta:.3g})-shuffle-DP per round ({p.calibration} calibration)"
        )
    return tuple(lines)


def message_guarantee(vector_sum: VectorSum, delta: float, floor: float) -> Guarantee:
    """(ε, δ) of one user's PVEC message on its own: the local guarantee of R_VEC.

    One user's message is the per-coordinate counts x̄ + η with η ~ Bin(b, p): the protocol of
    :func:`panpriv.accounting.binomial.tight_delta` with a single noisy user, so its bound applies
    verbatim (its steps 1–8 never use more than the one user's noise). The ε returned is the least
    point of the grid ``floor·LOCAL_GRID^k`` (k ≥ 0) at which that bound is ≤ ``delta``; the grid
    starts at ``floor`` because callers only need the local bound where it exceeds their shuffle
    guarantee. ``Guarantee.none()`` if even ε = 10⁴ fails, or if the accountant would cost more
    than :data:`LOCAL_COST_LIMIT` allows.
    """
    epsilon = _local_epsilon(vector_sum.g, vector_sum.b, vector_sum.p, vector_sum.d, delta, floor)
    if math.isinf(epsilon):
        return Guarantee.none()
    return Guarantee(epsilon, delta)


def read_round(owner: str, state: Mapping[str, StateValue], params: int) -> tuple[int, int, NDArray[np.int64]]:
    """``records``, ``filled`` and ``totals`` of a saved state, checked (totals: exact integers ≥ 0)."""
    records = read_int(owner, state, "records")
    filled = read_int(owner, state, "filled")
    totals = read_array(owner, state, "totals", (params,))
    if np.any(totals < 0) or np.any(totals != np.floor(totals)):
        raise InvalidInputError(
            check.message(f"{owner}.load_state_dict", "totals", "integer counts of one-bits (>= 0)", totals.tolist())
        )
    return records, filled, totals.astype(np.int64)


class EncodedLearner(Learner):
    """Base of the learners whose rounds go through PVEC (module docstring).

    Subclasses call :meth:`_setup` from their constructor and implement :meth:`_round_sum`,
    :meth:`_query` and :meth:`_finish_round`; they may override :meth:`_check_room`.
    """

    _owner: ClassVar[str]

    def _setup(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str,
        epsilon: float,
        delta: float,
        radius: float | None,
        feature_bound: float,
        calibration: Calibration,
        honest_fraction: float,
        rng: RngLike,
    ) -> None:
        owner = self._owner
        self._setup_common(owner, dim, loss, radius, feature_bound, rng)
        self.epsilon = check.positive(owner, "epsilon", epsilon)
        self.delta = check.open_unit(owner, "delta", delta)
        self.calibration = check.choice(owner, "calibration", calibration, CALIBRATIONS)
        self.honest_fraction = check.positive(owner, "honest_fraction", honest_fraction)
        if self.honest_fraction > 1.0:
            raise InvalidInputError(check.message(owner, "honest_fraction", "a float in (0, 1]", honest_fraction))
        self._lipschitz = self.loss.lipschitz(self.feature_bound, self.radius)
        self._filled = 0
        self._totals = np.zeros(self._params, dtype=np.int64)
        self.pooled_noise = True

    pooled_noise: bool
    """``True`` (set by the constructor): each piece of a round adds its users' roundings plus one
    Bin(k·b, p) per coordinate (module docstring, "Pooled noise"); the same law of every state
    and output. ``False``: every user's message is drawn as :meth:`VectorSum.randomize` draws it
    (the per-user reference of the Encode–Shuffle–Analyze tests; slower). Not a constructor
    parameter: it changes no distribution, only which draws a seed replays."""

    def _vector_sum(self, users: int, epsilon: float, delta: float) -> VectorSum:
        """PVEC for a round of ``users`` users at (ε, δ), for gradients clipped to L."""
        try:
            return VectorSum(
                users,
                self._params,
                epsilon,
                delta,
                self._lipschitz * (1.0 + NORM_SLACK),
                calibration=self.calibration,
                honest_fraction=self.honest_fraction,
            )
        except (InvalidInputError, InvalidParameterError) as exc:
            raise InvalidInputError(f"{self._owner}: {exc}") from None

    def _local(self, vector_sum: VectorSum, floor: float) -> Guarantee:
        """:func:`message_guarantee` at this learner's δ; none in the seeded replay/testing mode
        (where future noise is predictable), without computing it."""
        if self._noise.is_seeded:
            return Guarantee.none()
        return message_guarantee(vector_sum, self.delta, floor)

    def _variance_hint(self, epsilon: float, delta: float) -> float:
        """:func:`sum_variance_hint` for this learner's gradients (planning only)."""
        try:
            return sum_variance_hint(
                self.calibration, self._params, epsilon, delta, self._lipschitz, self.honest_fraction
            )
        except InvalidParameterError as exc:
            raise InvalidInputError(f"{self._owner}: {exc}") from None

    # -- hooks ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def _round_sum(self) -> VectorSum:
        """The PVEC instance of the round in progress; its ``n`` is the round's number of users."""

    @abc.abstractmethod
    def _query(self) -> tuple[Array, float | None]:
        """The round's query point (not a copy) and the β of the Moreau envelope whose gradients
        the users report (``None``: the loss's own)."""

    @abc.abstractmethod
    def _finish_round(self, mean: Array) -> None:
        """Take the step from ``mean``, the analyzer's estimate of the round's mean data gradient."""

    def _check_room(self, count: int) -> None:
        """Refuse ``count`` more records before any is learned (learners with a fixed length)."""

    # -- learning ------------------------------------------------------------------------------

    def learn_many(self, X: Array, y: Array) -> None:
        """Add a micro-batch of records (users); any split of the stream gives the same mechanism."""
        X, y = check_batch(self._owner, X, y, self.dim)
        self._check_room(X.shape[0])
        scratch.learn_in_blocks(self.loss, X, y, self.feature_bound, self._scratch, self._learn_block)

    def _learn_block(self, Z: Array, labels: Array) -> None:
        """The rounds over one block of features (in scratch), a round possibly straddling blocks;
        the rows' squared norms and norms (:func:`panpriv.protocols.scratch.feature_norms`, for the pooled
        path's clip) are computed once per block, not per round."""
        squares, norms = scratch.feature_norms(Z, self._scratch)
        for rows in round_slices(Z.shape[0], lambda: self._round_sum().n - self._filled):
            vector_sum = self._round_sum()
            self._add_messages(vector_sum, Z[rows], labels[rows], norms[rows], squares[rows])
            self._filled += rows.stop - rows.start
            self._records += rows.stop - rows.start
            if self._filled == vector_sum.n:
                self._filled = 0
                try:
                    self._close_round(vector_sum, self._totals)
                finally:
                    self._totals.fill(0)

    def _close_round(self, vector_sum: VectorSum, totals: NDArray[np.int64]) -> None:
        """The analyzer: A_VEC on the round's totals, divided by its users, then the step."""
        mean = vector_sum.analyze(totals)
        mean /= vector_sum.n  # in place: the same quotient as analyze(totals) / n
        self._finish_round(mean)

    # -- the analyzer's half (Encode–Shuffle–Analyze) ------------------------------------------

    def round_sum(self) -> VectorSum:
        """The PVEC instance of the round in progress (its ``n`` users, its (g, b, p))."""
        return self._round_sum()

    def learn_totals(self, totals: NDArray[np.integer]) -> None:
        """One whole round from the shuffler's view alone: the per-coordinate totals Tⱼ of the
        round's users' PVEC counts (:meth:`VectorSum.aggregate`), obtained by a deployment whose
        users run the randomizer themselves (:mod:`panpriv.streamer.esa`). The same analysis and step as
        :meth:`learn_many`; the round's ``n`` users count as learned. Never inside a round begun by
        :meth:`learn_many`."""
        vector_sum = self._round_sum()
        totals = np.asarray(totals)
        if self._filled or totals.shape != (self._params,) or not np.issubdtype(totals.dtype, np.integer):
            raise InvalidInputError(
                f"{self._owner}.learn_totals: needs integer totals of shape ({self._params},) and no round in progress "
                f"(got {totals.dtype} {totals.shape}, {self._filled} records of the round seen)"
            )
        if totals.min() < 0 or totals.max() > vector_sum.n * (vector_sum.g + vector_sum.b):
            raise InvalidInputError(f"{self._owner}.learn_totals: totals outside [0, n(g + b)]")
        self._check_room(vector_sum.n)
        self._records += vector_sum.n
        self._close_round(vector_sum, totals.astype(np.int64))

    def _add_messages(self, vector_sum: VectorSum, Z: Array, labels: Array, norms: Array, squares: Array) -> None:
        """The users' PVEC messages for their clipped gradients (:meth:`_clipped_gradients`),
        summed into ``totals`` (pooled noise unless :attr:`pooled_noise` is off). Features,
        labels, norms and gradients live in scratch (wiped by :meth:`learn_many`); the encoder
        wipes its own work buffers, each block of message counts once summed, and the generator's
        state."""
        gradients = self._clipped_gradients(Z, labels, norms, squares)
        with self._noise.draw() as generator:
            vector_sum.add_messages(gradients, self._totals, generator, self.pooled_noise)

    def _clipped_gradients(self, Z: Array, labels: Array, norms: Array, squares: Array) -> Array:
        """The users' gradients at :meth:`_query`'s point, each clipped to L, in scratch.

        Per user (``pooled_noise = False``): :func:`panpriv.protocols.scratch.clipped_gradients`, the
        function the Encode–Shuffle–Analyze clients run (:mod:`panpriv.streamer.esa.sum_client`), so the
        seeded reproduction is bit for bit. Pooled (in process): the same clip written as w_i·z_i
        from the block's row norms (:func:`panpriv.protocols.scratch.clipped_weights`, clipped to
        :func:`panpriv.protocols.scratch.strict_bound` (L, p)): identical rows where the gradient is inside
        that bound, (p + 8)·2⁻⁵² relative apart where it is clipped, every row of exact norm ≤ L,
        inside the ℓ₂ bound Δ₂ = L(1 + :data:`NORM_SLACK`)
        declared to PVEC — the same mechanism."""
        theta, smoothing = self._query()
        if not self.pooled_noise:
            return scratch.clipped_gradients(self.loss, theta, Z, labels, self._lipschitz, self._scratch, smoothing)
        weights = scratch.clipped_weights(self.loss, theta, Z, labels, norms, self._lipschitz, self._scratch,
                                          smoothing, squares)
        return scratch.weighted_rows(weights, Z, self._scratch)

    # -- outputs -------------------------------------------------------------------------------

    @property
    def records_seen(self) -> int:
        return self._records

    def _report(
        self, output: Guarantee, intrusion: Guarantee, assumptions: Sequence[str], references: Sequence[str]
    ) -> PrivacyReport:
        """The report with the assumptions every encoder-based learner shares."""
        shared = [
            "neighbouring streams differ in one record (replacement); one record is one user; stream "
            "positions, counts and the round sizes are public",
            f"features clipped to norm {self.feature_bound:g}; each user's gradient is clipped to norm "
            f"L = {self._lipschitz:.6g} and sent through PVEC's local randomizer ({self.calibration} "
            "calibration), so one user changes the round's sum by at most 2L in l2 norm",
            "a trusted shuffler: the analyzer sees each round's messages only as a shuffled multiset "
            "(here encoder, shuffler and analyzer run in one process, and only the model leaves it)",
        ]
        if self.honest_fraction < 1.0:
            shared.append(
                f"robust shuffle privacy (Cheu et al. 2022, Def. A.7): the output guarantee holds whenever at least a "
                f"fraction {self.honest_fraction:g} of each round's users run the randomizer honestly"
            )
        return super()._report(
            output,
            intrusion,
            [*shared, *assumptions],
            ["Cheu et al. 2022, Alg. 2", "Cheu et al. 2022, Thm 3.2", *references, "Cheu et al. 2022, Def. C.2"],
        )

    # -- persistence ---------------------------------------------------------------------------

    def _round_state(self) -> dict[str, StateValue]:
        """``records``; ``filled`` and ``totals`` of the round in progress (noisy messages only)."""
        return {"records": self._records, "filled": self._filled, "totals": self._totals.astype(np.float64)}


class SequentialLearner(EncodedLearner):
    """An :class:`EncodedLearner` whose records each answer exactly one round (sequential
    interactivity, Cheu et al. 2022 Def. 2.7): :class:`~panpriv.protocols.shuffle_sgd.ShuffleSGD` (Alg. 3)
    and :class:`~panpriv.protocols.shuffle_acsa.ShuffleACSA` (Alg. 4), not :class:`~panpriv.protocols.shuffle_gd.ShuffleGD`
    (Alg. 5, where every user answers every round).

    The contract of their Encode–Shuffle–Analyze deployment over secure summation
    (:mod:`panpriv.streamer.esa.sum_client`, :mod:`panpriv.streamer.esa.sum_analyzer`): a round's users need only
    the public :meth:`query_point`, :meth:`round_smoothing`, :attr:`gradient_norm_bound` and the
    round's PVEC instance (:attr:`vector_sums`) to run the randomizer themselves, and the analyzer
    feeds the round's totals to :meth:`EncodedLearner.learn_totals` until :attr:`finished`. The
    privacy argument is the learner's own (one PVEC round per record) plus the secure sum's view bound.
    """

    @property
    @abc.abstractmethod
    def vector_sums(self) -> dict[int, VectorSum]:
        """The PVEC instance of each round size the learner may use, by number of users."""

    @abc.abstractmethod
    def query_point(self) -> Array:
        """Where the users of the round in progress take their gradients (a public function of the
        earlier rounds' analyzer outputs)."""

    def round_smoothing(self) -> float | None:
        """β of the Moreau envelope whose gradients the round's users report; ``None`` (default):
        the loss's own gradients."""
        return None

    @property
    def finished(self) -> bool:
        """True once the protocol has no round left (default: never, the stream may run on)."""
        return False

    @property
    def gradient_norm_bound(self) -> float:
        """L: the norm each user's gradient is clipped to before PVEC."""
        return self._lipschitz
