"""The shuffle-model vector-sum protocol PVEC (Cheu et al. 2022, Alg. 2 over Alg. 1), vectorised over a batch.

Every shuffle-model learner encodes each batch of gradients through :class:`VectorSum`.

The protocol
------------
User i holds xᵢ ∈ ℝᵈ with ‖xᵢ‖₂ ≤ Δ₂. Its local randomizer R_VEC, per coordinate j: shift
w = xᵢⱼ + Δ₂ ∈ [0, Δ] (Δ = 2Δ₂), fixed-point encode s = w·g/Δ ∈ [0, g], round randomly to
x̄ = ⌊s⌋ + Ber(s − ⌊s⌋) (computed as ⌊s + U⌋ with U ~ U[0, 1), shrunk so that floating-point
addition never rounds past ⌈s⌉: :func:`uniform_shrink`), draw η ~ Bin(b, p), and send
x̄ + η one-bits and g + b − x̄ − η zero-bits, each labelled j. The shuffler permutes all messages
of the n users; the analyzer A_VEC outputs, per coordinate, (Δ/g)(Tⱼ − n·b·p) − n·Δ₂ where Tⱼ
is the number of one-bits labelled j. It is unbiased: E[x̄] = s and E[η] = b·p.

Why counts are the canonical form
---------------------------------
Each user sends exactly g + b messages per label, so a shuffled batch is a uniformly random
ordering of a multiset of (label, bit) pairs, and that multiset is fixed by the per-label numbers
of one-bits: the multiset with Tⱼ ones labelled j (and n(g + b) − Tⱼ zeros). A uniform permutation
of it is a post-processing of T = (T₁, …, T_d) that needs no data. So the shuffler's view carries
exactly the information in T — the privacy analysis (Cheu et al. 2022, Lemma A.2's first step) works with T —
and the encoder represents a user's messages by its per-coordinate count of one-bits,
x̄ + η ∈ [0, g + b]. :meth:`VectorSum.randomize_bits` materialises the literal message list of one
user (for the wire and for tests); :meth:`VectorSum.aggregate_messages` counts a shuffled list.

Pooled noise
------------
Σᵢ Bin(b, p) over n independent users is Bin(n·b, p), so drawing one Bin(n·b, p) per coordinate
(``pooled_noise=True``) gives the analyzer's view T the identical distribution at a fraction of
the cost. It is only legitimate when encoding and shuffling run in one trusted process — the
individual users' messages never exist, so no shuffler is being trusted to hide them; in a real
deployment each user must run :meth:`VectorSum.randomize` (or ``randomize_bits``) on its own.

Sampling the noise
------------------
Bin(b, p) comes from :class:`panpriv.protocols.binomial_sampler.BinomialSampler`: an exact inversion of one
raw 64-bit word per draw against integer thresholds through a guide table (b ≤ 4096), 6–12× faster
than ``Generator.binomial`` and exactly Bin(b, p). A user's counts are stored in the smallest
unsigned dtype holding g + b (:attr:`VectorSum.count_dtype`; one byte when g + b ≤ 255), so a
batch's messages take n·d bytes.

Randomness
----------
``rng=None`` (default): every call draws its noise from a generator keyed from OS entropy and
zeroed afterwards (:class:`panpriv.protocols.randomness.NoiseSource`); the work buffers holding clean
encodings, roundings and raw noise bits are zeroed too; passing a seed or ``Generator`` is the labelled
replay/testing mode.

References
----------
Cheu, Joseph, Mao & Peng (2022), Alg. 1 (P1D), Alg. 2 (PVEC), Lemma 3.1, Thm 3.2, App. A.3 (robust
variant); the calibrations are in :mod:`panpriv.accounting.binomial`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import queue
from collections.abc import Callable, Iterator
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.binomial import PVECParameters, pvec_parameters, tight_parameters
from panpriv.accounting.errors import InvalidParameterError
from panpriv.protocols.binomial_sampler import BinomialSampler, count_dtype
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.randomness import NoiseSource, RngLike
from panpriv.protocols.scalar_residue import scale_rows
from panpriv.protocols.validation import choice, positive_int

__all__ = ["VectorSum"]

_CHUNK_ELEMENTS = 1 << 15  # elements of X per block: 256 KiB per float64 work buffer, a block's passes stay in L2
_MAX_MESSAGES = 1 << 24  # randomize_bits refuses to materialise more messages than this
_NO_NOISE = np.zeros(0, dtype=np.int64)  # the pooled path's noise before it is drawn (empty: nothing to wipe)


def _column_sums(a: NDArray, dtype: type | None = None) -> NDArray:
    """a.sum(axis=0) (accumulated in ``dtype``), fast also for few columns: rows are folded into
    ~512-wide rows first (numpy reduces a narrow C-ordered array row by row). Exact for integers
    (and for integer-valued floats below 2⁵³): only the order of the additions changes."""
    rows, width = a.shape
    fold = max(1, 512 // width)
    head = rows - rows % fold
    folded = _narrow_sums(a[:head].reshape(-1, fold * width), dtype).reshape(fold, width).sum(axis=0)
    return folded + a[head:].sum(axis=0, dtype=dtype)


def _narrow_sums(a: NDArray, dtype: type | None) -> NDArray:
    """a.sum(axis=0, dtype=dtype); for uint8 and uint16 (the users' counts) through the unsigned
    type twice as wide, a block of 2⁸ (2¹⁶) rows at a time — a block's sum is at most
    (2⁸ − 1)·2⁸ < 2¹⁶ ((2¹⁶ − 1)·2¹⁶ < 2³²), so it cannot wrap — then added in ``dtype``: exact,
    and 3–4× faster than numpy's reduction casting every element to int64."""
    if dtype is None or a.dtype.kind != "u" or a.dtype.itemsize > 2:
        return a.sum(axis=0, dtype=dtype)
    wider, step = np.dtype(f"u{2 * a.dtype.itemsize}"), 1 << (8 * a.dtype.itemsize)
    total: NDArray = np.zeros(a.shape[1], dtype=dtype)
    for start in range(0, a.shape[0], step):
        total += np.add.reduce(a[start : start + step], axis=0, dtype=wider)
    return total


def _kernel_einsum() -> Callable[..., NDArray]:
    """``np.einsum`` without its Python layers (about 0.8 µs a call, most of a learner round's
    norm check): with ``optimize=False``, its default, ``np.einsum`` returns
    ``c_einsum(*operands, out=out)`` (numpy ≥ 2.0), so the same kernel gives the same bits; the
    public function where numpy has no such attribute."""
    return getattr(importlib.import_module("numpy._core.multiarray"), "c_einsum", np.einsum)


_einsum = _kernel_einsum()


def _largest(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """The largest element of the 1-D ``a`` — a NaN if ``a`` holds one — bit for bit
    ``np.maximum.reduce(a)``: ``argmax`` returns the first NaN if there is one, else the first
    largest element (one value, however many hold it); a third of the reduction's cost. Returned
    as a one-element view of ``a``, not a numpy scalar: the value is a user's squared norm, and a
    freed scalar object would keep it (:mod:`panpriv.protocols.scalar_residue`); compared, it gives bools,
    and it is zeroed with ``a``."""
    i = a.argmax()
    return a[i : i + 1]


def uniform_shrink(g: int) -> float:
    """1 − c, c = 2^(e − 52) with 2^e the least power of two > g: the factor the rounding
    uniforms U ∈ [0, 1 − 2⁻⁵³] (numpy's ``random``, k·2⁻⁵³) are multiplied by before ⌊s + U⌋,
    so that the rounded value is always ⌊s⌋ or ⌈s⌉ — the domain of Cheu et al. 2022, Alg. 1,
    lines 3–5, which the privacy proof assumes (x̄ ∈ [0, g]).

    Without it, an encoding s that is exactly an integer K (s = g/2 for a zero coordinate when g is
    even, s = g for a coordinate at +Δ₂) and U ≥ 1 − ulp/2 gave fl(K + U) = K + 1: x̄ = s + 1, and
    for K = g a count g + b + 1, which wraps to 0 in a dtype holding exactly g + b (probability
    ≈ K·2⁻⁵³ per such element).

    Proof (round to nearest; floats below 2^e are spaced at most c/2). U' = fl(U·(1 − c)) ≤ 1 − c,
    as 1 − c is a float and rounding is monotone. (i) s = K an integer, 0 ≤ K ≤ g: K + U' ≤ K + 1 − c,
    a float at least two spacings below K + 1 ≤ 2^e, so fl(K + U') ≤ K + 1 − c < K + 1. (ii) s not
    an integer, K = ⌈s⌉ ≥ 1: s ≤ K − u with u the spacing of floats just below K, and
    K + 1 ≤ 2K, so the spacing just below K + 1 is at most 2u; s + U' ≤ K + 1 − u − 2⁻⁵³ lies
    below K + 1 − u, the midpoint under K + 1, so fl(s + U') < K + 1. And fl(s + U') ≥ ⌊s⌋
    (monotone, ⌊s⌋ a float ≤ s + U'). So ⌊fl(s + U')⌋ ∈ {⌊s⌋, ⌈s⌉}. The law of the rounding bit
    moves by at most c + 2⁻⁵³ per element (it was already within the float spacing of s − ⌊s⌋):
    x̄ stays unbiased to ~g·2⁻⁵² (``tests/protocols/test_encoder.py`` pins the adversarial U)."""
    return 1.0 - 2.0 ** (int(g).bit_length() - 52)


def _rescale_factors(squared: NDArray[np.float64], too_long: NDArray[np.bool_], l2_bound: float) -> NDArray[np.float64]:
    """Per row: the factor just below Δ₂/‖x‖ for a row longer than Δ₂ (within the tolerance), 1
    for the others; computed in place in one array (no temporary holds a row's norm), which
    :func:`panpriv.protocols.scalar_residue.scale_rows` then applies, so the rows rescaled onto Δ₂ are
    those of ``x·nextafter(Δ₂/‖x‖, 0)`` and the others unchanged (x·1 = x). ``squared`` (the
    rows' ‖x‖²) is left as it was; the caller wipes it, the factors and the work matrix."""
    factors = np.ones(squared.shape[0])
    np.sqrt(squared, out=factors, where=too_long)
    np.divide(l2_bound, factors, out=factors, where=too_long)
    np.nextafter(factors, 0.0, out=factors, where=too_long)
    return factors


def _inside_squared(l2_bound: float, d: int) -> float:
    """A bound T on a block's largest computed squared row norm below which the encodings need no
    clip: max_i fl(‖xᵢ‖²) ≤ T implies s = fl(fl(x·c) + g/2) ∈ [0, g] for every coordinate x of
    the block, c = fl(g/(2Δ₂)), so clipping s to [0, g] would change no bit.

    Proof (u = 2⁻⁵³, round to nearest). Any order of summing d rounded squares gives
    fl(‖x‖²) ≥ ‖x‖²(1 − γ), γ = d·u/(1 − d·u) (Higham 2002, §3.1 and §4.2), so x² ≤ ‖x‖² ≤
    T/(1 − γ). With T = Δ₂²(1 − (d + 8)·2⁻⁵⁰) (8(d + 8)·u, its own rounding ≤ 3u aside),
    |x| ≤ Δ₂(1 − 2u)², hence |x·c| ≤ |x|·(g/(2Δ₂))(1 + u) ≤ (g/2)(1 − 2u) < g/2 and, rounding being
    monotone and g/2 a float, |fl(x·c)| ≤ g/2. Then fl(x·c) + g/2 ∈ [0, g] exactly and, 0 and g
    being floats, so is its rounding s. (A row within the norm tolerance, rescaled onto Δ₂, and
    rows beyond T keep the clip.)"""
    return l2_bound**2 * (1.0 - (d + 8) * 2.0**-50)


_KEYED_SOURCES: queue.SimpleQueue[NoiseSource] = queue.SimpleQueue()
"""OS-keyed noise sources free for reuse: building one (a PCG64 and its layout check) costs more
than a small batch's draws. Each is rekeyed from OS entropy on every draw and its state zeroed
after (:mod:`panpriv.protocols.randomness`), so reuse keeps nothing between calls; a call takes one for
itself (a fresh one when none is free, e.g. while another thread holds one), so no two calls
ever share a generator."""


class _drawing:
    """``with _drawing(rng) as generator``: ``NoiseSource(rng).draw()``, with the OS-keyed sources
    of ``rng=None`` reused (:data:`_KEYED_SOURCES`): taken on entry, keyed, wiped on exit, then
    put back. A ``Generator`` is handed out as is (what ``NoiseSource(generator).draw()`` hands
    out). A class rather than a generator function: about 1.5 µs less a call."""

    __slots__ = ("_rng", "_source", "_keyed")

    def __init__(self, rng: RngLike) -> None:
        self._rng = rng
        self._source: NoiseSource | None = None
        self._keyed: contextlib.AbstractContextManager[np.random.Generator] | None = None

    def __enter__(self) -> np.random.Generator:
        if isinstance(self._rng, np.random.Generator):
            return self._rng
        if self._rng is not None:
            self._keyed = NoiseSource(self._rng).draw()
            return self._keyed.__enter__()
        try:
            source = _KEYED_SOURCES.get_nowait()
        except queue.Empty:
            source = NoiseSource()
        keyed = source.draw()
        try:
            generator = keyed.__enter__()  # rekeyed from OS entropy (wiped again if that fails)
        except BaseException:
            _KEYED_SOURCES.put(source)
            raise
        self._source, self._keyed = source, keyed
        return generator

    def __exit__(self, *exc_info: object) -> None:
        keyed, source = self._keyed, self._source
        self._keyed = self._source = None
        try:
            if keyed is not None:
                keyed.__exit__(None, None, None)  # the generator's state zeroed
        finally:
            if source is not None:
                _KEYED_SOURCES.put(source)


NORM_TOLERANCE = 1e-9
"""Rows whose ℓ₂ norm exceeds ``l2_bound`` by at most this relative amount (floating-point error
of a normalisation such as ``x / ‖x‖``) are clipped onto the bound instead of refused. Clipping
is exact, so the sensitivity — and the guarantee — is unchanged; larger excesses stay an error."""


class VectorSum:
    """PVEC: shuffle-private, unbiased sum of n vectors of ℓ₂ norm ≤ Δ₂.

    Parameters
    ----------
    n : int
        Users per batch (the shuffler mixes exactly n users' messages).
    d : int
        Dimension of each vector.
    epsilon, delta : float
        Target (ε, δ)-shuffle DP under replacement of one user.
    l2_bound : float
        Δ₂ > 0. Rows above it are a caller error (:class:`InvalidInputError`), never clipped here.
    calibration : {"tight", "paper"}, default "tight"
        ``"paper"``: (g, b, p) of Cheu et al. 2022, Thm 3.2 via :func:`panpriv.accounting.binomial.pvec_parameters`.
        ``"tight"``: :func:`panpriv.accounting.binomial.tight_parameters`, the numerical accountant for
        this exact protocol (orders of magnitude less noise).
    honest_fraction : float, default 1.0
        γ: the guarantee holds whenever at least ⌈γn⌉ users run the randomizer (Cheu et al. 2022, Def. A.7,
        Claim A.8, Cor. A.9). In [1/3, 1] for ``"paper"``, (0, 1] for ``"tight"``.

    Attributes
    ----------
    n, d, epsilon, delta, l2_bound, calibration, honest_fraction
        The constructor arguments (``delta`` is the target; ``parameters.delta`` the bound met).
    g, b : int
        Fixed-point resolution and noise trials per user and coordinate.
    p : float
        Success probability of each noise trial.
    parameters : PVECParameters
        The calibration, with the guarantee (ε, δ) it proves.
    count_dtype : numpy.dtype
        The smallest unsigned integer dtype holding g + b: the dtype of :meth:`randomize`'s counts.

    References
    ----------
    Cheu et al. 2022, Alg. 1, Alg. 2, Thm 3.2, Cor. A.9.
    """

    def __init__(
        self,
        n: int,
        d: int,
        epsilon: float,
        delta: float,
        l2_bound: float,
        calibration: Literal["tight", "paper"] = "tight",
        honest_fraction: float = 1.0,
    ) -> None:
        owner = "VectorSum"
        self.n = positive_int(owner, "n", n)
        self.d = positive_int(owner, "d", d)
        self.calibration = choice(owner, "calibration", calibration, ("tight", "paper"))
        calibrate = tight_parameters if self.calibration == "tight" else pvec_parameters
        try:
            parameters = calibrate(self.n, self.d, epsilon, delta, l2_bound, honest_fraction)
        except InvalidParameterError as exc:
            raise InvalidInputError(f"{owner}: {exc}") from None
        self.epsilon = parameters.epsilon
        self.delta = float(delta)
        self.l2_bound = parameters.l2_bound
        self.honest_fraction = parameters.honest_fraction
        self.parameters: PVECParameters = parameters
        self.g, self.b, self.p = parameters.g, parameters.b, parameters.p
        self._encode_scale = self.g / (2.0 * self.l2_bound)  # s = x·g/Δ + g/2
        self.count_dtype = count_dtype(self.g + self.b)
        self._sampler = BinomialSampler(self.b, self.p, self.count_dtype)
        self._half_g = 0.5 * self.g
        self._uniform_shrink = uniform_shrink(self.g)
        self._inside_squared = _inside_squared(self.l2_bound, self.d)
        self._chunk_rows = max(1, _CHUNK_ELEMENTS // self.d)
        self._bound_squared = self.l2_bound**2
        self._pool = np.zeros((0, self.d))  # the pooled path's buffer (_pool_rows), zeroed after each call
        self._pool_squared = self._pool.reshape(-1)  # its work rows, flat (_inside's squared norms)
        self._ones = np.ones(0)  # the pooled path's column sums: ones @ rows (exact, see _add_pooled)

    def __repr__(self) -> str:
        return (
            f"VectorSum(n={self.n}, d={self.d}, epsilon={self.epsilon!r}, delta={self.delta!r}, "
            f"l2_bound={self.l2_bound!r}, calibration={self.calibration!r}, "
            f"honest_fraction={self.honest_fraction!r})"
        )

    # ----------------------------------------------------------------------------------------
    # Predicted accuracy
    # ----------------------------------------------------------------------------------------

    @property
    def noise_std(self) -> float:
        """Standard deviation of each coordinate of the estimate, worst case over inputs.

        √((Δ/g)²·(n·b·p(1 − p) + n/4)): the binomial noise of all n users plus the largest
        variance randomized rounding can add (every fraction 1/2). :meth:`estimate_variance` gives
        the exact value for a given batch.
        """
        return math.sqrt(self.parameters.variance_bound)

    def estimate_variance(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Exact per-coordinate variance of :meth:`estimate_sum` for the batch ``X``.

        (Δ/g)²·(n·b·p(1 − p) + Σᵢ fᵢⱼ(1 − fᵢⱼ)), fᵢⱼ the fractional part of user i's encoded value.
        """
        rounding = np.zeros(self.d)
        X = self._checked(X, "estimate_variance", exact_rows=True)
        for chunk, inside in self._chunks(X, "estimate_variance"):
            frac = self._encoded(chunk, np.empty_like(chunk), inside)
            frac -= np.floor(frac)
            rounding += _column_sums(frac * (1.0 - frac))
        trials = self.n * self.b * self.p * (1.0 - self.p)
        return (2.0 * self.l2_bound / self.g) ** 2 * (trials + rounding)

    # ----------------------------------------------------------------------------------------
    # Randomizer, shuffler, analyzer
    # ----------------------------------------------------------------------------------------

    def randomize(self, X: NDArray[np.float64], rng: RngLike = None) -> NDArray[np.unsignedinteger]:
        """R_VEC applied to each row of ``X``: every user's per-coordinate count of one-bits.

        Parameters
        ----------
        X : array of shape (m, d)
            One row per user (m ≥ 1), each of ℓ₂ norm ≤ ``l2_bound``, finite.
        rng : None, int or numpy.random.Generator
            None: a generator keyed from OS entropy, zeroed after use (production). Seed/Generator: replay/testing mode.

        Returns
        -------
        ndarray of ``count_dtype``, shape (m, d)
            x̄ᵢⱼ + ηᵢⱼ ∈ [0, g + b]: the number of one-bits user i sends labelled j.
        """
        X = self._checked(X, "randomize", exact_rows=False)
        counts = np.empty(X.shape, dtype=self.count_dtype)
        try:
            with _drawing(rng) as generator:
                for _ in self._randomized_blocks(X, generator, "randomize", counts):
                    pass
        except BaseException:
            counts.fill(0)  # the messages of the blocks before a refused one
            raise
        return counts

    def add_messages(
        self, X: NDArray[np.float64], totals: NDArray[np.int64], rng: RngLike = None, pooled_noise: bool = False
    ) -> None:
        """R_VEC applied to each row of ``X``, the users' counts added into ``totals`` (int64,
        shape (d,)): the shuffler's per-coordinate totals of a round, without an array of all the
        users' messages.

        ``pooled_noise=False`` (default): the same draws, in the same order, as :meth:`randomize`,
        and integer sums (exact), so ``totals`` gains exactly ``randomize(X, rng).sum(axis=0)``;
        each block of messages is wiped once summed.

        ``pooled_noise=True``: the m users' randomized roundings, summed, plus one Bin(m·b, p) per
        coordinate instead of their m·d draws of Bin(b, p) — what ``totals`` gains has exactly the
        law of the per-user sum (a sum of m independent Bin(b, p) is Bin(m·b, p), independent of
        the roundings), at a fraction of the cost. No user's message ever exists, so this is only
        for encoder and shuffler in one trusted process (module docstring, "Pooled noise"). The
        rounded sum and the noise are wiped once added.

        Either way ``totals`` changes only when every row was accepted.
        """
        X = self._checked(X, "add_messages", exact_rows=False)
        if pooled_noise and isinstance(rng, np.random.Generator):  # the learners' rounds: no wrapper per call
            self._add_pooled(X, totals, rng, "add_messages")
            return
        with _drawing(rng) as generator:
            if pooled_noise:
                self._add_pooled(X, totals, generator, "add_messages")
            else:
                totals += self._randomized_totals(X, generator, "add_messages")

    def randomize_bits(
        self, x: NDArray[np.float64], rng: RngLike = None
    ) -> NDArray[np.int64]:
        """The literal message list of one user (Cheu et al. 2022, Alg. 1 line 7, per coordinate of Alg. 2).

        Each noise trial is drawn as its own Bernoulli(p) bit and the rounding as its own
        Bernoulli bit, so this path shares no sampling code with :meth:`randomize`.

        Parameters
        ----------
        x : array of shape (d,)
            The user's vector, ℓ₂ norm ≤ ``l2_bound``.
        rng : None, int or numpy.random.Generator
            As in :meth:`randomize`.

        Returns
        -------
        ndarray of int64, shape (d·(g + b), 2)
            Rows (label j, bit): for each coordinate, x̄ + η one-bits then g + b − x̄ − η zero-bits.
        """
        x_arr = np.asarray(x, dtype=np.float64)
        if x_arr.shape != (self.d,):
            raise InvalidInputError(
                f"VectorSum.randomize_bits: x must have shape ({self.d},); got {x_arr.shape}"
            )
        per_label = self.g + self.b
        # One block. Encoded inside the loop: resuming _chunks wipes a row it clipped onto Δ₂.
        for row, inside in self._chunks(x_arr.reshape(1, self.d), "randomize_bits"):  # checks x first
            if self.d * per_label > _MAX_MESSAGES:
                raise InvalidInputError(
                    f"VectorSum.randomize_bits: d·(g + b) = {self.d * per_label} messages exceed the "
                    f"limit {_MAX_MESSAGES}; use randomize (counts) for these parameters"
                )
            encoded = self._encoded(row, np.empty_like(row), inside)[0]
        floor = np.floor(encoded)
        fraction = np.subtract(encoded, floor)
        uniforms, noise_uniforms = np.empty(self.d), np.empty((self.d, self.b))
        rounding_bit, noise_bits = np.empty(self.d, dtype=bool), np.empty((self.d, self.b), dtype=bool)
        noise, ones = np.empty(self.d, dtype=np.int64), np.empty(self.d, dtype=np.int64)
        try:  # the same draws, in the same order, as generator.random(d) then random((d, b))
            with _drawing(rng) as generator:
                generator.random(out=uniforms)
                generator.random(out=noise_uniforms)
            np.less(uniforms, fraction, out=rounding_bit)
            np.less(noise_uniforms, self.p, out=noise_bits)
            np.sum(noise_bits, axis=1, out=noise)
            np.copyto(ones, floor, casting="unsafe")  # ⌊s⌋, an integer-valued float
            ones += rounding_bit
            ones += noise
            labels = np.repeat(np.arange(self.d, dtype=np.int64), per_label)
            bits = (np.arange(per_label)[None, :] < ones[:, None]).astype(np.int64).ravel()
            return np.stack([labels, bits], axis=1)
        finally:  # the clean encoding and rounding, the noise and its uniforms: wiped (the message stays)
            for array in (encoded, floor, fraction, uniforms, noise_uniforms, rounding_bit, noise_bits, noise, ones):
                array.fill(0)

    def aggregate_messages(self, messages: NDArray[np.int64]) -> NDArray[np.int64]:
        """The shuffler's view from a (shuffled) message list of all n users: per-label totals.

        ``messages`` has shape (n·d·(g + b), 2), rows (label, bit) as :meth:`randomize_bits`
        emits them, in any order.
        """
        messages = np.asarray(messages)
        expected = (self.n * self.d * (self.g + self.b), 2)
        if messages.shape != expected or not np.issubdtype(messages.dtype, np.integer):
            raise InvalidInputError(
                f"VectorSum.aggregate_messages: messages must be an integer array of shape "
                f"{expected}; got {messages.dtype} {messages.shape}"
            )
        labels, bits = messages[:, 0], messages[:, 1]
        if np.any((labels < 0) | (labels >= self.d)) or np.any((bits != 0) & (bits != 1)):
            raise InvalidInputError(
                f"VectorSum.aggregate_messages: labels must lie in [0, {self.d}) and bits in {{0, 1}}"
            )
        return np.bincount(labels, weights=bits, minlength=self.d).astype(np.int64)

    def aggregate(self, counts: NDArray[np.integer]) -> NDArray[np.int64]:
        """The shuffler's view: per-coordinate totals Tⱼ = Σᵢ countsᵢⱼ of the n users' one-bits."""
        counts = np.asarray(counts)
        if counts.shape != (self.n, self.d) or not np.issubdtype(counts.dtype, np.integer):
            raise InvalidInputError(
                f"VectorSum.aggregate: counts must be an integer array of shape "
                f"({self.n}, {self.d}); got {counts.dtype} {counts.shape}"
            )
        if (counts.dtype.kind == "i" and counts.min() < 0) or np.maximum.reduce(counts, axis=None) > self.g + self.b:
            raise InvalidInputError(
                f"VectorSum.aggregate: every count must lie in [0, g + b] = [0, {self.g + self.b}]"
            )
        return _column_sums(counts, np.int64)

    def analyze(self, totals: NDArray[np.int64]) -> NDArray[np.float64]:
        """A_VEC: the unbiased estimate (Δ/g)(Tⱼ − n·b·p) − n·Δ₂ of Σᵢ xᵢ (Cheu et al. 2022, Alg. 2 line 12)."""
        totals = np.asarray(totals)
        if totals.shape != (self.d,) or totals.dtype.kind not in "iu":  # np.issubdtype(…, np.integer), once a round
            raise InvalidInputError(
                f"VectorSum.analyze: totals must be an integer array of shape ({self.d},); "
                f"got {totals.dtype} {totals.shape}"
            )
        centred = totals.astype(np.float64) - self.n * self.b * self.p
        return (2.0 * self.l2_bound / self.g) * centred - self.n * self.l2_bound

    def estimate_sum(
        self, X: NDArray[np.float64], rng: RngLike = None, pooled_noise: bool = False
    ) -> NDArray[np.float64]:
        """Randomize, shuffle and analyze one batch: the private estimate of Σᵢ xᵢ.

        Parameters
        ----------
        X : array of shape (n, d)
            Exactly n rows (the batch the calibration was made for), ℓ₂ norms ≤ ``l2_bound``.
        rng : None, int or numpy.random.Generator
            As in :meth:`randomize`.
        pooled_noise : bool, default False
            Draw one Bin(n·b, p) per coordinate instead of n·d draws of Bin(b, p). The analyzer's
            view has the identical distribution; valid only when encoder and shuffler run in one
            trusted process (see the module docstring).

        Returns
        -------
        ndarray of float64, shape (d,)
        """
        X = self._checked(X, "estimate_sum", exact_rows=True)
        with _drawing(rng) as generator:
            return self._estimate_sum(X, generator, pooled_noise)

    def _estimate_sum(self, X: NDArray[np.float64], generator: np.random.Generator, pooled_noise: bool) -> NDArray[np.float64]:
        if not pooled_noise:
            return self.analyze(self._randomized_totals(X, generator, "estimate_sum"))
        totals = np.zeros(self.d, dtype=np.int64)
        self._add_pooled(X, totals, generator, "estimate_sum")
        return self.analyze(totals)

    # ----------------------------------------------------------------------------------------
    # Internals
    # ----------------------------------------------------------------------------------------

    def _randomized_totals(self, X: NDArray[np.float64], generator: np.random.Generator, method: str) -> NDArray[np.int64]:
        """Σᵢ of the users' counts (R_VEC of each row of X), block by block, each block of
        messages wiped once summed. A block of fewer than 512 rows is summed in one reduction
        (:func:`_column_sums` folds rows for long blocks; both sums are exact)."""
        totals = np.zeros(self.d, dtype=np.int64)
        for block in self._randomized_blocks(X, generator, method):
            totals += block.sum(axis=0, dtype=np.int64) if block.shape[0] < 512 else _column_sums(block, np.int64)
        return totals

    def _add_pooled(
        self, X: NDArray[np.float64], totals: NDArray[np.int64], generator: np.random.Generator, method: str
    ) -> None:
        """``totals`` += Σᵢ ⌊sᵢ + Uᵢ⌋ + Bin(m·b, p) per coordinate (m = rows of X): the pooled
        path of :meth:`add_messages` and :meth:`estimate_sum`. Draws, in order: the rounding
        uniforms block by block, then the d binomials. The blocks are of equal size, at most
        ``_chunk_rows`` rows (no short last block: its fixed cost showed at n·d = 10⁵); the split
        changes no bit of ``totals`` (one stream of uniforms in row order, exact sums) — only how
        far a refused call has advanced a passed generator (the blocks before the refused one).
        A block's column sums are ``ones @ rows`` (BLAS): the rows hold integers ≤ g (:func:`uniform_shrink`) and every
        partial sum is an integer below 2⁵³, so each addition, in whatever order or fused, is exact.

        Every intermediate lives in one buffer the instance keeps (``_pool``, see
        :meth:`_pool_rows`): the rounded sum (the users' encodings to within Δ/g, clean of
        binomial noise) and a block's partial sum, the encodings and rounded rows, the uniforms —
        and, before a one-block batch's encodings, its rows' squared norms (:meth:`_inside`). One
        ``fill`` zeroes it after every call, however the call ends; the noise is zeroed too."""
        m = X.shape[0]
        rows = -(-m // -(-m // self._chunk_rows))  # blocks of equal size, none above _chunk_rows
        used = self._pool_rows(rows)
        noise = _NO_NOISE
        try:
            rounded, work, uniforms = used[0], used[2 : 2 + rows], used[2 + rows :]
            inside = self._inside(X) if m == rows else None  # one block: no generator, no temporary
            if inside is None:
                partial = used[1]
                for chunk, chunk_inside in self._chunks(X, method, rows):
                    k = chunk.shape[0]
                    block = self._rounded(chunk, chunk_inside, generator, work[:k], uniforms[:k])
                    rounded += np.dot(self._ones[:k], block, out=partial)
            else:
                np.dot(self._ones[:m], self._rounded(X, inside, generator, work, uniforms), out=rounded)
            noise = generator.binomial(m * self.b, self.p, size=self.d)  # no out= in numpy
            # exact: the sums are integer-valued floats below 2⁵³, cast to int64 and added as integers
            np.add(noise, rounded, out=noise, casting="unsafe", dtype=np.int64)
            totals += noise
        finally:
            used.fill(0.0)
            noise.fill(0)

    def _pool_rows(self, rows: int) -> NDArray[np.float64]:
        """The first 2 + 2·``rows`` rows of the pooled path's buffer (grown, zeroed, when too
        short): row 0 the rounded sum, row 1 a block's partial sum, then ``rows`` work rows
        (encodings, rounded rows; first the squared norms of :meth:`_inside`) and ``rows`` rows of
        uniforms. Zero between calls."""
        if self._pool.shape[0] < 2 + 2 * rows:
            self._pool = np.zeros((2 + 2 * rows, self.d))
            self._pool_squared = self._pool[2:].reshape(-1)  # the work rows, flat: m squared norms
            self._ones = np.ones(rows)
        return self._pool[: 2 + 2 * rows]

    def _inside(self, X: NDArray[np.float64]) -> bool | None:
        """The fast path of :meth:`_chunks` for a batch of one block, without a generator or a
        temporary (the learners' rounds): whether the encodings need no clip
        (:func:`_inside_squared`) when every row has norm ≤ Δ₂ (the same computed norms, so the
        same decision), else None: the caller then goes through :meth:`_chunks`, which clips rows
        within the tolerance or refuses. The squared norms go to the start of the pool's work rows
        (:meth:`_pool_rows`, which the caller has sized for X and zeroes); :func:`_largest`
        decides (a NaN fails both tests)."""
        squared = self._pool_squared[: X.shape[0]]
        _einsum("ij,ij->i", X, X, out=squared)
        largest = _largest(squared)
        if largest <= self._inside_squared:
            return True
        return False if largest <= self._bound_squared else None

    def _checked(self, X: object, method: str, *, exact_rows: bool) -> NDArray[np.float64]:
        """X as float64 of shape (m, d), m ≥ 1 (m = n when ``exact_rows``).

        Row norms and finiteness are checked chunk by chunk in :meth:`_chunks` (while the chunk
        is in cache), before any of the chunk is used.
        """
        X_arr = np.asarray(X, dtype=np.float64)
        if (
            X_arr.ndim != 2
            or X_arr.shape[1] != self.d
            or X_arr.shape[0] == 0
            or (exact_rows and X_arr.shape[0] != self.n)
        ):
            rows = f"{self.n}" if exact_rows else "m"
            raise InvalidInputError(
                f"VectorSum.{method}: X must have shape ({rows}, {self.d}); got {X_arr.shape}"
            )
        return X_arr

    def _chunks(
        self, X: NDArray[np.float64], method: str, rows: int | None = None
    ) -> Iterator[tuple[NDArray[np.float64], bool]]:
        """Consecutive blocks of ``rows`` rows of X (default ``_chunk_rows``), each checked
        (finite, every row of ℓ₂ norm ≤ Δ₂), with whether its encodings provably need no clip
        (:func:`_inside_squared`)."""
        rows = rows or self._chunk_rows
        for start in range(0, X.shape[0], rows):
            chunk = X[start : start + rows]
            squared = _einsum("ij,ij->i", chunk, chunk)
            largest = _largest(squared)  # a NaN fails both tests
            if largest <= self._bound_squared:
                inside = bool(largest <= self._inside_squared)  # before the wipe: largest is a view
                squared.fill(0.0)  # the users' squared norms: clean, wiped
                yield chunk, inside
                continue
            too_long = ~(squared <= self._bound_squared)  # NaN compares False: caught here too
            if not np.all(np.isfinite(chunk)):
                raise InvalidInputError(f"VectorSum.{method}: X contains NaN or infinite values")
            beyond = squared > (self.l2_bound * (1.0 + NORM_TOLERANCE)) ** 2
            if np.any(beyond):
                row = int(np.argmax(beyond))
                raise InvalidInputError(
                    f"VectorSum.{method}: every row of X must have l2 norm <= l2_bound = "
                    f"{self.l2_bound!r}; row {start + row} has norm {math.sqrt(squared[row])!r} "
                    "(clip before encoding)"
                )
            clipped = chunk.copy()
            work = np.empty_like(clipped)
            factors = _rescale_factors(squared, too_long, self.l2_bound)
            scale_rows(clipped, factors, work)
            for buffer in (squared, factors, work):  # norms, then the rows' factors (twice)
                buffer.fill(0.0)
            yield clipped, False
            clipped.fill(0.0)  # a clean copy of the users' rows: wiped once encoded

    def _encoded(self, chunk: NDArray[np.float64], out: NDArray[np.float64], inside: bool) -> NDArray[np.float64]:
        """s = (x + Δ₂)·g/Δ, clipped to [0, g] (only floating-point error can leave it; not at all
        when ``inside``, :func:`_inside_squared`, so the clip is skipped there: the same bits)."""
        np.multiply(chunk, self._encode_scale, out=out)
        out += self._half_g
        return out if inside else out.clip(0.0, self.g, out=out)  # the method: np.clip's own loop

    def _rounded(
        self,
        chunk: NDArray[np.float64],
        inside: bool,
        generator: np.random.Generator,
        work: NDArray[np.float64],
        uniforms: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """⌊s + U⌋, U ~ U[0, 1) iid: randomized rounding of the encoded chunk, in ``work`` (the
        chunk's shape, as ``uniforms``)."""
        encoded = self._encoded(chunk, work, inside)
        encoded += self._rounding_uniforms(generator, uniforms)
        return np.floor(encoded, out=encoded)

    def _rounding_uniforms(self, generator: np.random.Generator, out: NDArray[np.float64]) -> NDArray[np.float64]:
        """``out`` filled with the rounding uniforms U·(1 − c) (:func:`uniform_shrink`)."""
        generator.random(out=out)
        out *= self._uniform_shrink
        return out

    def _randomized_blocks(
        self,
        X: NDArray[np.float64],
        generator: np.random.Generator,
        method: str,
        counts: NDArray[np.unsignedinteger] | None = None,
    ) -> Iterator[NDArray[np.unsignedinteger]]:
        """The counts (users' messages) of consecutive checked row blocks of X: bounded working
        memory. Per block, in this order: the block's Bin(b, p) draws, then its rounding uniforms.

        Blocks are written into the rows of ``counts`` when given (:meth:`randomize`), else into a
        scratch block that the caller reads before the next one and that is wiped when the
        iteration ends. The work buffers hold clean encodings s, the rounding uniforms, the
        rounded encodings ⌊s + U⌋ (a user's message minus her binomial noise, which gives x to
        within Δ/g) — and, before each block's encodings, the sampler's guide-table indices (the
        noise words' top bits, zeroed by the sampler once used): they are zeroed when the
        iteration ends, however it ends.

        ⌊s + U⌋ is the cast of s + U to the counts' unsigned dtype: s ∈ [0, g] (clipped or
        :func:`_inside_squared`) and the shrunk U ≥ 0 keeps fl(s + U) below ⌈s⌉ + 1 ≤ g + 1
        (:func:`uniform_shrink`), so the dtype holds it, and a float-to-integer cast truncates
        (C), which on non-negative values is ⌊·⌋: the bits of ``np.floor`` then cast, one pass less."""
        rows = min(self._chunk_rows, X.shape[0])
        work = np.zeros((rows, self.d))
        uniforms = np.zeros_like(work)
        rounded = np.zeros(work.shape, dtype=self.count_dtype)
        index = work.reshape(-1).view(np.intp)  # the sampler's guide indices, zeroed by it before work is used
        scratch = np.zeros((rows if counts is None else 0, self.d), dtype=self.count_dtype)
        try:
            start = 0
            for chunk, inside in self._chunks(X, method):
                m = chunk.shape[0]
                block = scratch[:m] if counts is None else counts[start : start + m]
                self._sampler.draw_into(generator, block.reshape(-1), index)
                encoded = self._encoded(chunk, work[:m], inside)
                encoded += self._rounding_uniforms(generator, uniforms[:m])
                np.copyto(rounded[:m], encoded, casting="unsafe")  # ⌊s + U⌋ (see above)
                block += rounded[:m]  # η + ⌊s + U⌋, as before (integer addition)
                yield block
                start += m
        finally:
            for buffer in (work, uniforms, rounded, scratch):
                buffer.fill(0)
