"""Exact sampling of the discrete Gaussian N_Z(0, σ²) from uniform integers, without floating point.

Why: a floating-point Gaussian sampler leaks the data through the low-order bits of its output
(Mironov 2012 showed it for the textbook Laplace sampler): the set of doubles a sampler can return
around ``x + noise`` depends on ``x``. The discrete Gaussian on the integers, sampled *exactly*,
has no such channel: every output is an integer, and its distribution is exactly the one the
accountant (:mod:`panpriv.accounting.discrete_gaussian`) analyses.

How (Canonne, Kamath & Steinke 2020, Algorithms 1–3): every random decision is a comparison of a
uniform integer with an integer — Bernoulli(n/d) is ``U < n`` for U uniform on {0, …, d − 1};

* Bernoulli(exp(−γ)) for rational γ = n/d ≥ 0 (Alg. 1): ⌊γ⌋ independent Bernoulli(exp(−1)) trials
  and one Bernoulli(exp(−(γ − ⌊γ⌋))); for γ ∈ [0, 1], draw Bernoulli(γ/k) for k = 1, 2, … until the
  first failure at K, and return ``K odd`` (P = Σ_k (−γ)^k/k! = e^{−γ});
* the discrete Laplace with integer scale t, P(x) ∝ exp(−|x|/t) (Alg. 2 with s = 1);
* the discrete Gaussian (Alg. 3): Y from the discrete Laplace of scale t, accepted with probability
  exp(−(|Y| − σ²/t)²/(2σ²)); the accepted Y has P(y) ∝ exp(−y²/(2σ²)) for *any* integer t ≥ 1
  (the exponents sum to −y²/(2σ²) − σ²/(2t²)); t = ⌊σ⌋ + 1 keeps the expected number of trials
  small (CKS 2020, Sec. 5).

All arithmetic is on Python ints, ``fractions.Fraction`` and int64 arrays whose products are
checked to fit (otherwise the same code runs on arrays of Python ints, exact and slower). The
sampler is vectorised: each step runs for all coordinates still pending at once, so a vector of p
draws costs a few dozen numpy calls rather than p Python loops.

Randomness: :class:`OsUniform` (the default) reads fresh words from the OS (``/dev/urandom``) for every
batch of uniform integers and keeps no generator state. :class:`GeneratorUniform` draws from a
``numpy.random.Generator`` (``Generator.integers`` is exactly uniform): the labelled
replay/testing mode, reproducible and therefore not pan-private.

References
----------
Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
arXiv:2004.00010, Algorithms 1, 2, 3.
Mironov (2012), "On significance of the least significant bits for differential privacy", CCS 2012.
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from typing import Any, Protocol, cast

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols import validation as check
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.randomness import fill_from_os

IntArray = NDArray[np.int64] | NDArray[np.object_]

_INT64_SAFE = 2**62
"""Bounds and products below this fit an int64 with room for one addition."""

_OWNER = "discrete_gaussian"


class Kept:
    """Every array one sampling call makes, zeroed when the call ends.

    Each uniform integer, each comparison with one, each chain counter, magnitude and square in
    the sampler is a function of the draws — most directly the discrete Laplace remainders, which
    equal |y| for most accepted draws. numpy frees a dropped array without erasing it, so a later
    read of the process would find them (issue 32 found 7–11 of 14 coordinates of a draw). The
    sampler therefore binds every intermediate array, passes it through a :class:`Kept`, and wipes
    them all when the draw is done (:meth:`wipe`); the arrays it returns are the caller's (the
    learner adds the draw into its accumulator and zeroes it). No sampled value becomes a Python
    ``int`` either: maxima and comparisons that decide a code path stay in one-element arrays and
    give a ``bool`` (CPython's two singletons). tests/protocols/test_memory_residue.py looks for the
    draw in a learner's memory, with this wiping switched off as the control.
    """

    def __init__(self) -> None:
        self._arrays: list[NDArray[Any]] = []

    def __call__(self, array: NDArray[Any]) -> NDArray[Any]:
        self._arrays.append(array)
        return array

    def wipe(self) -> None:
        for array in self._arrays:
            if array.flags.writeable:
                array.fill(0)
        self._arrays.clear()

    def exceeds(self, values: IntArray, limit: int) -> bool:
        """``max(values) > limit`` without a Python int of the maximum (``limit`` is public)."""
        if values.size == 0:
            return False
        peak = self(np.zeros(1, dtype=values.dtype))
        np.max(values.reshape(1, -1), axis=1, out=peak)
        return bool(np.greater(peak, limit, out=self(np.zeros(1, dtype=bool)))[0])


class UniformSource(Protocol):
    """Where uniform integers come from: ``below(bounds)[i]`` is uniform on {0, …, bounds[i] − 1}."""

    def below(self, bounds: IntArray) -> IntArray: ...


class OsUniform:
    """Uniform integers from OS entropy (``secrets``), drawn fresh for every call; no state kept.

    int64 bounds: 64-bit words read from ``/dev/urandom`` straight into a numpy array
    (:func:`panpriv.protocols.randomness.fill_from_os`) reduced modulo the bound, rejecting the words
    below 2⁶⁴ mod b (the accepted range [2⁶⁴ mod b, 2⁶⁴) holds a multiple of b words, so the remainder
    is exactly uniform); every array of the call but the result is zeroed before it returns (the
    caller keeps the result in its :class:`Kept`). Bounds of Python ints: ``secrets.randbelow`` per
    element, whose Python ints cannot be wiped (σ² beyond about 2⁵⁶, far below any ε the service
    takes; :func:`sample_discrete_gaussian`).
    """

    def below(self, bounds: IntArray) -> IntArray:
        if bounds.dtype == object:
            return np.array([secrets.randbelow(int(b)) for b in bounds], dtype=object)
        kept = Kept()
        out = np.empty(bounds.shape[0], dtype=np.int64)
        pending = kept(np.arange(bounds.shape[0]))
        try:
            while pending.size:
                words = kept(np.empty(pending.size, dtype=np.uint64))
                fill_from_os(words)  # read straight into the array: no bytes object left behind
                b = kept(np.empty(pending.size, dtype=np.uint64))
                np.copyto(b, kept(bounds[pending]), casting="unsafe")  # positive int64 → uint64, no buffer
                threshold = kept(np.subtract(np.uint64(0), b))  # 2**64 - b, wrapping by design
                np.remainder(threshold, b, out=threshold)  # 2**64 mod b
                accepted = kept(np.greater_equal(words, threshold))
                remainder = kept(words[accepted])
                np.remainder(remainder, kept(b[accepted]), out=remainder)
                out[kept(pending[accepted])] = remainder.view(np.int64)  # < b ≤ 2⁶³ − 1: the same value
                pending = kept(pending[kept(~accepted)])
        finally:
            kept.wipe()
        return out


class GeneratorUniform:
    """Uniform integers from a ``numpy.random.Generator`` — the seeded replay/testing mode.

    ``Generator.integers`` is exactly uniform on int64 ranges; bounds of Python ints are served
    by rejection from the generator's random bytes.
    """

    def __init__(self, generator: np.random.Generator) -> None:
        self._generator = generator

    def below(self, bounds: IntArray) -> IntArray:
        if bounds.dtype != object:
            return self._generator.integers(0, cast("NDArray[np.int64]", bounds), dtype=np.int64)
        return np.array([self._big_below(int(b)) for b in bounds], dtype=object)

    def _big_below(self, bound: int) -> int:
        bits = bound.bit_length()
        while True:
            value = int.from_bytes(self._generator.bytes((bits + 7) // 8), "little") >> (-bits % 8)
            if value < bound:
                return value


def _oversampled(needed: int, acceptance: float) -> int:
    """Trials to run for ``needed`` accepted draws when a trial is accepted with probability about
    ``acceptance``: the expected need plus about three standard deviations, so that one round of
    the rejection loop usually suffices. Taking the first ``needed`` accepted trials and discarding
    the rest is exact: accepted trials are i.i.d. from the target, independently of which trials
    were accepted. (The count only affects speed and entropy use, never the distribution.)"""
    return math.ceil((needed + 3.0 * math.sqrt(needed) + 4.0) / acceptance)


_LAPLACE_ACCEPTANCE = 0.6
"""About the acceptance of Alg. 2's trials (exp(−U/t) averages 1 − e^{−1} ≈ 0.63)."""

_GAUSSIAN_ACCEPTANCE = 0.7
"""About the acceptance of Alg. 3's trials at t = ⌊σ⌋ + 1 (measured ≈ 0.76 at σ ≈ 2^19)."""


def _scaled_bounds(k: IntArray, den: int, kept: Kept) -> IntArray:
    """k·den, as int64 when it fits, else as Python ints."""
    if not kept.exceeds(k, (_INT64_SAFE - 1) // den):
        product = kept(k.astype(np.int64))
        product *= np.int64(den)
        return product
    return kept(np.array([int(v) * den for v in k], dtype=object))


def _bernoulli_exp_fraction(
    num: IntArray, den: int, source: UniformSource, kept: Kept, start: NDArray[np.int64] | None = None
) -> NDArray[np.bool_]:
    """Bernoulli(exp(−num/den)) for 0 ≤ num ≤ den (CKS 2020, Alg. 1, case γ ∈ [0, 1]).

    ``start``: trials k = 1, …, start − 1 are known to have succeeded already (the chain resumes at
    k = start); default 1. Every array made is kept in ``kept`` (the caller wipes it).
    """
    k = kept(np.ones(num.shape[0], dtype=np.int64) if start is None else start.copy())
    alive = kept(np.arange(num.shape[0]))
    while alive.size:
        uniform = kept(source.below(_scaled_bounds(kept(k[alive]), den, kept)))
        success = kept(np.less(uniform, kept(num[alive])))  # Bernoulli(γ/k)
        alive = kept(alive[success])
        survivors = kept(k[alive])
        survivors += 1
        k[alive] = survivors
    odd = kept(np.remainder(k, 2))
    return kept(np.equal(odd, 1))


_FACTORIAL_TRIALS = 20
_FACTORIALS = np.array([math.factorial(j) for j in range(_FACTORIAL_TRIALS + 1)], dtype=np.int64)


def _bernoulli_exp_minus_one(size: int, source: UniformSource, kept: Kept) -> NDArray[np.bool_]:
    """``size`` Bernoulli(exp(−1)) draws: Alg. 1 with γ = 1, its first 20 trials from one uniform word.

    Trial k succeeds with probability 1/k. A uniform W on {0, …, 20! − 1} written in the factorial
    number system has independent uniform digits d_k = ⌊W/(k − 1)!⌋ mod k ∈ {0, …, k − 1}, k ≤ 20;
    trial k succeeds iff d_k = 0. K is the first failing trial and the draw is ``K odd``. If all 20
    succeed (probability 1/20!), the chain continues at k = 21 with one uniform per trial.
    """
    word = kept(source.below(kept(np.full(size, _FACTORIALS[_FACTORIAL_TRIALS], dtype=np.int64))))
    first_failure = kept(np.zeros(size, dtype=np.int64))
    pending = kept(np.arange(size))
    for k in range(2, _FACTORIAL_TRIALS + 1):  # trial 1 (probability 1/1) always succeeds
        digit = kept(word[pending])
        np.floor_divide(digit, _FACTORIALS[k - 1], out=digit)
        np.remainder(digit, k, out=digit)
        failed = kept(np.not_equal(digit, 0))
        first_failure[kept(pending[failed])] = k
        pending = kept(pending[kept(~failed)])
        if not pending.size:
            break
    odd = kept(np.remainder(first_failure, 2))
    result = kept(np.equal(odd, 1))
    unfinished = kept(np.flatnonzero(kept(np.equal(first_failure, 0))))
    if unfinished.size:
        ones = kept(np.ones(unfinished.size, dtype=np.int64))
        start = kept(np.full(unfinished.size, _FACTORIAL_TRIALS + 1, dtype=np.int64))
        result[unfinished] = _bernoulli_exp_fraction(ones, 1, source, kept, start)
    return result


def bernoulli_exp(num: IntArray, den: int, source: UniformSource, kept: Kept | None = None) -> NDArray[np.bool_]:
    """Independent Bernoulli(exp(−num[i]/den)) draws for integers num[i] ≥ 0 and den ≥ 1.

    CKS 2020, Alg. 1: exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)), each factor an independent trial
    (a failed trial ends that coordinate early). ``kept``: where the arrays made go (wiped by the
    caller); ``None``: wiped here, the result excepted.
    """
    own = kept is None
    kept = Kept() if kept is None else kept
    try:
        whole, fraction = kept(num // den), kept(num % den)
        result = np.ones(num.shape[0], dtype=bool)
        if not own:
            kept(result)
        remaining = kept(whole.copy())
        active = kept(np.flatnonzero(kept(np.greater(remaining, 0))))
        while active.size:
            success = _bernoulli_exp_minus_one(active.size, source, kept)
            result[kept(active[kept(~success)])] = False
            decremented = kept(remaining[active])
            decremented -= 1
            remaining[active] = decremented
            active = kept(active[success])
            active = kept(active[kept(np.greater(kept(remaining[active]), 0))])
        alive = kept(np.flatnonzero(result))
        result[alive] = _bernoulli_exp_fraction(kept(fraction[alive]), den, source, kept)
        return result
    finally:
        if own:
            kept.wipe()


_GEOMETRIC_BLOCK = 4


def _geometric_exp1(size: int, source: UniformSource, kept: Kept) -> NDArray[np.int64]:
    """Number of Bernoulli(exp(−1)) successes before the first failure (P(V ≥ v) = e^{−v}).

    Trials are drawn in blocks of 4 per pending coordinate; V counts the leading successes, and a
    coordinate whose whole block succeeded draws another block (exactly the sequential chain).
    """
    count = kept(np.zeros(size, dtype=np.int64))
    alive = kept(np.arange(size))
    while alive.size:
        block = _bernoulli_exp_minus_one(alive.size * _GEOMETRIC_BLOCK, source, kept).reshape(alive.size, _GEOMETRIC_BLOCK)
        leading = kept(kept(np.cumprod(block, axis=1)).sum(axis=1))
        counted = kept(count[alive])
        counted += leading
        count[alive] = counted
        alive = kept(alive[kept(np.equal(leading, _GEOMETRIC_BLOCK))])
    return count


def discrete_laplace(scale: int, size: int, source: UniformSource, kept: Kept | None = None) -> NDArray[np.int64]:
    """``size`` independent draws with P(x) ∝ exp(−|x|/scale) on the integers (CKS 2020, Alg. 2, s = 1).

    U uniform on {0, …, t − 1} kept with probability exp(−U/t) is the remainder of |X| modulo t;
    V ~ Geometric(1 − e^{−1}) is the quotient; a sign is drawn, and (−, 0) is rejected so that 0 is
    not counted twice. ``kept``: as for :func:`bernoulli_exp`.
    """
    own = kept is None
    kept = Kept() if kept is None else kept
    out = np.empty(size, dtype=np.int64)
    if not own:
        kept(out)
    filled = 0
    t = np.int64(scale)
    try:
        while filled < size:
            trials = _oversampled(size - filled, _LAPLACE_ACCEPTANCE)
            u = kept(source.below(kept(np.full(trials, t, dtype=np.int64))))
            chosen = kept(np.flatnonzero(bernoulli_exp(u, scale, source, kept)))
            magnitude = kept(u[chosen])
            quotient = _geometric_exp1(chosen.size, source, kept)
            quotient *= t
            magnitude += quotient
            sign = kept(source.below(kept(np.full(chosen.size, 2, dtype=np.int64))))
            negative = kept(np.equal(sign, 1))
            zero = kept(np.equal(magnitude, 0))
            np.logical_and(zero, negative, out=zero)
            valid = kept(np.logical_not(zero))
            signed = kept(np.negative(magnitude))
            np.copyto(signed, magnitude, where=kept(np.logical_not(negative)))
            draws = kept(signed[valid])[: size - filled]
            out[filled : filled + draws.size] = draws
            filled += draws.size
        return out
    finally:
        if own:
            kept.wipe()


def as_variance(owner: str, sigma2: int | Fraction) -> Fraction:
    """σ² as an exact positive ``Fraction``; floats are refused (they would hide a rounding)."""
    if isinstance(sigma2, bool) or not isinstance(sigma2, (int, np.integer, Fraction)) or sigma2 <= 0:
        raise InvalidInputError(check.message(owner, "sigma2", "a positive int or fractions.Fraction", sigma2))
    return Fraction(int(sigma2)) if not isinstance(sigma2, Fraction) else sigma2


def default_scale(sigma2: Fraction) -> int:
    """t = ⌊σ⌋ + 1, the discrete Laplace scale of CKS 2020, Alg. 3 (computed exactly: ⌊√⌊σ²⌋⌋ = ⌊σ⌋)."""
    return math.isqrt(sigma2.numerator // sigma2.denominator) + 1


def sample_discrete_gaussian(
    sigma2: int | Fraction, size: int, source: UniformSource | None = None, *, scale: int | None = None
) -> NDArray[np.int64]:
    """``size`` independent exact draws of the discrete Gaussian N_Z(0, σ²): P(y) ∝ exp(−y²/(2σ²)), y ∈ Z.

    Parameters
    ----------
    sigma2
        σ², a positive int or ``fractions.Fraction`` (exact; not a float).
    size
        Number of draws (the coordinates of a noise vector).
    source
        Uniform integers; ``None``: :class:`OsUniform` (OS entropy, no state kept).
    scale
        The discrete Laplace scale t of the proposal (any integer ≥ 1 gives the same distribution);
        ``None``: :func:`default_scale`. Passing a t that divides σ² keeps every acceptance test in
        int64 (see :func:`efficient_variance`).

    Returns
    -------
    NDArray[np.int64]
        The draws (magnitudes below 2⁶² are guaranteed by the check on σ² below).

    References
    ----------
    Canonne, Kamath & Steinke (2020), arXiv:2004.00010, Alg. 3 (with Algs. 1 and 2).
    """
    variance = as_variance(_OWNER, sigma2)
    size = check.positive_int(_OWNER, "size", size, minimum=0)
    t = default_scale(variance) if scale is None else check.positive_int(_OWNER, "scale", scale)
    if variance > Fraction(2**80):
        raise InvalidInputError(check.message(_OWNER, "sigma2", "at most 2**80 (draws must fit int64)", sigma2))
    source = OsUniform() if source is None else source
    a, c = variance.numerator, variance.denominator
    # Acceptance exponent (|y| − σ²/t)²/(2σ²) = (|y|·t·c − a)²/(2·a·c·t²); divide numerator and
    # denominator by g² with g = gcd(t·c, a) (g² divides a·t·c, hence the denominator).
    g = math.gcd(t * c, a)
    slope, offset, den = t * c // g, a // g, 2 * a * c * t * t // (g * g)
    square_fits = (2**31 - 1 - offset) // slope  # |y| up to this: (|y|·slope − offset)² fits int64
    out = np.empty(size, dtype=np.int64)
    filled = 0
    kept = Kept()  # every intermediate array, zeroed at the end (Kept's docstring)
    try:
        while filled < size:
            y = discrete_laplace(t, _oversampled(size - filled, _GAUSSIAN_ACCEPTANCE), source, kept)
            magnitude = kept(np.abs(y))
            num: IntArray
            if not kept.exceeds(magnitude, square_fits):
                w = kept(magnitude * np.int64(slope))
                w -= np.int64(offset)
                num = kept(w * w)
            else:
                num = kept(np.array([(int(m) * slope - offset) ** 2 for m in magnitude], dtype=object))
            accepted = kept(y[bernoulli_exp(num, den, source, kept)])
            draws = accepted[: size - filled]
            out[filled : filled + draws.size] = draws
            filled += draws.size
        return out
    finally:
        kept.wipe()


def efficient_variance(minimum: int) -> tuple[int, int]:
    """The smallest σ² = t·m ≥ ``minimum`` with t = ⌊√minimum⌋ + 1, and that t.

    With σ² a multiple of the proposal scale t, the acceptance exponent of Alg. 3 reduces to
    (|y| − m)²/(2tm): numerator and denominator stay near σ⁴ and 2σ², so for σ up to about 2²⁸ all
    the sampler's arithmetic runs in int64. The increase σ² − minimum is below t ≈ σ, i.e. σ grows by
    less than half a grid unit.
    """
    minimum = check.positive_int(_OWNER, "minimum", minimum)
    t = math.isqrt(minimum) + 1
    m = -(-minimum // t)
    return t * m, t
