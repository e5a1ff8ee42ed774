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


class UniformSource(Protocol):
    """Where uniform integers come from: ``below(bounds)[i]`` is uniform on {0, …, bounds[i] − 1}."""

    def below(self, bounds: IntArray) -> IntArray: ...


class OsUniform:
    """Uniform integers from OS entropy (``secrets``), drawn fresh for every call; no state kept.

    int64 bounds: 64-bit words read from ``/dev/urandom`` straight into a numpy array
    (:func:`panpriv.protocols.randomness.fill_from_os`, scrubbed after use) reduced modulo the bound, rejecting the
    words below 2⁶⁴ mod b (the accepted range [2⁶⁴ mod b, 2⁶⁴) holds a multiple of b words, so the
    remainder is exactly uniform). Bounds of Python ints: ``secrets.randbelow`` per element.
    """

    def below(self, bounds: IntArray) -> IntArray:
        if bounds.dtype == object:
            return np.array([secrets.randbelow(int(b)) for b in bounds], dtype=object)
        out = np.empty(bounds.shape[0], dtype=np.int64)
        pending = np.arange(bounds.shape[0])
        while pending.size:
            words = np.empty(pending.size, dtype=np.uint64)
            fill_from_os(words)  # read straight into the array: no bytes object left behind
            b = bounds[pending].astype(np.uint64)
            threshold = (np.uint64(0) - b) % b  # 2**64 mod b, in uint64 arithmetic (wraps by design)
            accepted = words >= threshold
            kept = words[accepted]
            np.remainder(kept, b[accepted], out=kept)
            out[pending[accepted]] = kept.view(np.int64)  # < b ≤ 2⁶³ − 1: the same value
            _scrub(words, kept)
            pending = pending[~accepted]
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


def _scrub(*arrays: NDArray[Any]) -> None:
    """Overwrite intermediate arrays that hold noise values (or functions of them) before they are
    freed, so that a later read of the process's memory does not find them (numpy reuses freed
    buffers without clearing them). The int64 path's raw words are scrubbed too; the Python-int
    path (``secrets.randbelow``, bounds beyond int64) leaves immutable ints that are not."""
    for array in arrays:
        array.fill(0)


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


def _scaled_bounds(k: IntArray, den: int) -> IntArray:
    """k·den, as int64 when it fits, else as Python ints."""
    if k.size == 0 or int(k.max()) * den < _INT64_SAFE:
        return k.astype(np.int64) * np.int64(den)
    return np.array([int(v) * den for v in k], dtype=object)


def _bernoulli_exp_fraction(
    num: IntArray, den: int, source: UniformSource, start: NDArray[np.int64] | None = None
) -> NDArray[np.bool_]:
    """Bernoulli(exp(−num/den)) for 0 ≤ num ≤ den (CKS 2020, Alg. 1, case γ ∈ [0, 1]).

    ``start``: trials k = 1, …, start − 1 are known to have succeeded already (the chain resumes at
    k = start); default 1.
    """
    k = np.ones(num.shape[0], dtype=np.int64) if start is None else start.copy()
    alive = np.arange(num.shape[0])
    while alive.size:
        success = source.below(_scaled_bounds(k[alive], den)) < num[alive]  # Bernoulli(γ/k)
        alive = alive[success]
        k[alive] += 1
    return k % 2 == 1


_FACTORIAL_TRIALS = 20
_FACTORIALS = np.array([math.factorial(j) for j in range(_FACTORIAL_TRIALS + 1)], dtype=np.int64)


def _bernoulli_exp_minus_one(size: int, source: UniformSource) -> NDArray[np.bool_]:
    """``size`` Bernoulli(exp(−1)) draws: Alg. 1 with γ = 1, its first 20 trials from one uniform word.

    Trial k succeeds with probability 1/k. A uniform W on {0, …, 20! − 1} written in the factorial
    number system has independent uniform digits d_k = ⌊W/(k − 1)!⌋ mod k ∈ {0, …, k − 1}, k ≤ 20;
    trial k succeeds iff d_k = 0. K is the first failing trial and the draw is ``K odd``. If all 20
    succeed (probability 1/20!), the chain continues at k = 21 with one uniform per trial.
    """
    word = source.below(np.full(size, _FACTORIALS[_FACTORIAL_TRIALS], dtype=np.int64))
    first_failure = np.zeros(size, dtype=np.int64)
    pending = np.arange(size)
    for k in range(2, _FACTORIAL_TRIALS + 1):  # trial 1 (probability 1/1) always succeeds
        failed = (word[pending] // _FACTORIALS[k - 1]) % k != 0
        first_failure[pending[failed]] = k
        pending = pending[~failed]
        if not pending.size:
            break
    result = first_failure % 2 == 1
    unfinished = np.flatnonzero(first_failure == 0)
    if unfinished.size:
        ones = np.ones(unfinished.size, dtype=np.int64)
        start = np.full(unfinished.size, _FACTORIAL_TRIALS + 1, dtype=np.int64)
        result[unfinished] = _bernoulli_exp_fraction(ones, 1, source, start)
    return result


def bernoulli_exp(num: IntArray, den: int, source: UniformSource) -> NDArray[np.bool_]:
    """Independent Bernoulli(exp(−num[i]/den)) draws for integers num[i] ≥ 0 and den ≥ 1.

    CKS 2020, Alg. 1: exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)), each factor an independent trial
    (a failed trial ends that coordinate early).
    """
    whole, fraction = num // den, num % den
    result = np.ones(num.shape[0], dtype=bool)
    remaining = whole.copy()
    active = np.flatnonzero(remaining > 0)
    while active.size:
        success = _bernoulli_exp_minus_one(active.size, source)
        result[active[~success]] = False
        remaining[active] -= 1
        active = active[success]
        active = active[remaining[active] > 0]
    alive = np.flatnonzero(result)
    result[alive] = _bernoulli_exp_fraction(fraction[alive], den, source)
    _scrub(whole, fraction, remaining)
    return result


_GEOMETRIC_BLOCK = 4


def _geometric_exp1(size: int, source: UniformSource) -> NDArray[np.int64]:
    """Number of Bernoulli(exp(−1)) successes before the first failure (P(V ≥ v) = e^{−v}).

    Trials are drawn in blocks of 4 per pending coordinate; V counts the leading successes, and a
    coordinate whose whole block succeeded draws another block (exactly the sequential chain).
    """
    count = np.zeros(size, dtype=np.int64)
    alive = np.arange(size)
    while alive.size:
        block = _bernoulli_exp_minus_one(alive.size * _GEOMETRIC_BLOCK, source).reshape(alive.size, _GEOMETRIC_BLOCK)
        leading = np.cumprod(block, axis=1).sum(axis=1)
        count[alive] += leading
        alive = alive[leading == _GEOMETRIC_BLOCK]
    return count


def discrete_laplace(scale: int, size: int, source: UniformSource) -> NDArray[np.int64]:
    """``size`` independent draws with P(x) ∝ exp(−|x|/scale) on the integers (CKS 2020, Alg. 2, s = 1).

    U uniform on {0, …, t − 1} kept with probability exp(−U/t) is the remainder of |X| modulo t;
    V ~ Geometric(1 − e^{−1}) is the quotient; a sign is drawn, and (−, 0) is rejected so that 0 is
    not counted twice.
    """
    out = np.empty(size, dtype=np.int64)
    filled = 0
    t = np.int64(scale)
    while filled < size:
        trials = _oversampled(size - filled, _LAPLACE_ACCEPTANCE)
        u = source.below(np.full(trials, t, dtype=np.int64))
        kept = np.flatnonzero(bernoulli_exp(u, scale, source))
        magnitude = u[kept]
        quotient = _geometric_exp1(kept.size, source)
        quotient *= t
        magnitude += quotient
        negative = source.below(np.full(kept.size, 2, dtype=np.int64)) == 1
        valid = ~(negative & (magnitude == 0))
        signed = np.where(negative, -magnitude, magnitude)
        kept_draws = signed[valid]
        draws = kept_draws[: size - filled]
        out[filled : filled + draws.size] = draws
        filled += draws.size
        _scrub(u, quotient, magnitude, signed, kept_draws)
    return out


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
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        y = discrete_laplace(t, _oversampled(size - filled, _GAUSSIAN_ACCEPTANCE), source)
        magnitude = np.abs(y)
        if int(magnitude.max(initial=0)) * slope + offset < 2**31:  # the square fits int64
            w = magnitude * np.int64(slope)
            w -= np.int64(offset)
            num: IntArray = w * w
            _scrub(w)
        else:
            num = np.array([(int(m) * slope - offset) ** 2 for m in magnitude], dtype=object)
        accepted = y[bernoulli_exp(num, den, source)]
        draws = accepted[: size - filled]
        out[filled : filled + draws.size] = draws
        filled += draws.size
        _scrub(y, magnitude, num, accepted)
    return out


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
