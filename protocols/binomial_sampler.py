"""Exact, fast draws of Bin(b, p) for the PVEC encoder's noise (Cheu et al. 2022, Alg. 1 line 5).

Every user adds Bin(b, p) to every coordinate, so the encoder draws n·d of them per batch. The
calibrations pick b from ~10 (tight, n = 10⁵, p < 1/2) to ~1000 (small n, p = 1/2), where
``Generator.binomial`` costs 40–60 ns a draw, twenty times the raw 64-bit word it starts from.
This module draws each from one raw word, by inversion, exactly.

Inversion against integer thresholds
------------------------------------
A float p is a dyadic rational M/2ᵏ, so every value of the distribution function
C_t = P(Bin(b, p) ≤ t) = N_t/2^{kb} has an integer numerator N_t = Σ_{i ≤ t} C(b, i)·Mⁱ·(2ᵏ − M)^{b−i},
computed once with Python integers. For U uniform on [0, 1) the count k = #{t < b : C_t ≤ U}
has exactly the law Bin(b, p). Write U = (u + V)/2⁶⁴, u the raw word and V ∈ [0, 1) the rest of
U's binary expansion, and F_t = ⌊C_t·2⁶⁴⌋. Then u > F_t implies U ≥ (F_t + 1)/2⁶⁴ > C_t (counted)
and u < F_t implies U < F_t/2⁶⁴ ≤ C_t (not counted): integer comparisons decide every threshold
except when u = F_t. Such ties (probability ≤ b·2⁻⁶⁴ per draw) are decided by drawing further
words of V and comparing with the exact remainder C_t·2⁶⁴ − F_t. No draw is rounded anywhere: the
law of the output is Bin(b, p) exactly, given uniform raw words.

Guide table (Chen & Asau 1974)
------------------------------
The count is read from a 2¹⁶-entry table indexed by u's top 16 bits: for a bucket that holds no
threshold F_t, every u in it has the same count #{t : F_t < u}. Buckets that hold a threshold
(at most one per distinct threshold: ≲ 1 % of buckets at b ≤ 4096) are flagged, and their draws
— the same fraction of draws — are counted by bisection over the thresholds, ties decided as
above. The common case costs one raw word, one table lookup and one comparison per draw.

b above ``MAX_TABLE_TRIALS`` (only the paper's loose calibration asks for them) keeps
``Generator.binomial``, numpy's floating-point algorithm.

The raw words are the users' noise in another form: callers pass the encoder's generator (keyed
from OS entropy, zeroed after use; :mod:`panpriv.protocols.randomness`), and the word buffers and the
guide-table indices made from them are zeroed here once counted.

References
----------
Cheu, Joseph, Mao & Peng (2022), Alg. 1; Chen & Asau (1974), "On generating random variates from an
empirical distribution" (guide tables); Devroye (1986), "Non-Uniform Random Variate Generation",
§III.2 (inversion by sequential and guided search).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

__all__ = ["MAX_TABLE_TRIALS", "BinomialSampler", "count_dtype"]

MAX_TABLE_TRIALS = 4096
"""Largest b sampled by exact inversion (the exact table costs O(b²·bits(p)) integer work once)."""
_GUIDE_BITS = 16
_WORD_BITS = 64


def count_dtype(largest: int) -> np.dtype:
    """The smallest unsigned integer dtype holding every value in [0, ``largest``]."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if largest <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


class BinomialSampler:
    """Draws of Bin(b, p) from a generator's raw 64-bit words (see the module docstring).

    Parameters
    ----------
    b : int
        Trials per draw (≥ 1).
    p : float
        Success probability in (0, 1); its exact binary value is the one sampled.
    dtype : numpy dtype, optional
        Unsigned dtype of the draws, able to hold b + 1; default :func:`count_dtype` (b + 1).
    """

    def __init__(self, b: int, p: float, dtype: np.dtype | type | None = None) -> None:
        if b < 1 or not 0.0 < p < 1.0:
            raise ValueError(f"BinomialSampler: need b >= 1 and 0 < p < 1; got b={b}, p={p!r}")
        self.b, self.p = int(b), float(p)
        self.dtype = np.dtype(dtype) if dtype is not None else count_dtype(self.b + 1)
        if self.dtype.kind != "u" or np.iinfo(self.dtype).max <= self.b:
            raise ValueError(f"BinomialSampler: dtype {self.dtype} cannot hold b + 1 = {self.b + 1}")
        self.method = "inversion" if self.b <= MAX_TABLE_TRIALS else "numpy"
        if self.method == "inversion":
            # Exact C_t = N_t / 2ˢ, kept for ties (see _remainder): reducing the b fractions up
            # front cost 0.2 s per sampler at b ≈ 3000, for draws that need one with probability
            # ≤ b·2⁻⁶⁴.
            self._numerators, self._scale_bits = _distribution_numerators(self.b, self.p)
            self._thresholds = np.array([_floor_scaled(n, self._scale_bits) for n in self._numerators], dtype=np.uint64)
            self._flag = np.iinfo(self.dtype).max
            self._guide = _guide_table(self._thresholds, self.dtype, self._flag)

    def __repr__(self) -> str:
        return f"BinomialSampler(b={self.b}, p={self.p!r}, method={self.method!r})"

    def draw(self, generator: np.random.Generator, size: int) -> NDArray:
        """``size`` independent draws of Bin(b, p), as ``self.dtype``."""
        return self.draw_into(generator, np.empty(size, dtype=self.dtype), np.empty(size, dtype=np.intp))

    def draw_into(self, generator: np.random.Generator, out: NDArray, index: NDArray[np.intp]) -> NDArray:
        """``out.size`` independent draws of Bin(b, p) into ``out`` (1-D, ``self.dtype``), the same
        draws as :meth:`draw`. ``index`` (intp, at least ``out.size``) is scratch for the guide
        table's indices (the words' top bits), zeroed here once used; the caller owns ``out``."""
        size = out.size
        if self.method == "numpy":
            drawn = generator.binomial(self.b, self.p, size=size)
            try:
                np.copyto(out, drawn, casting="unsafe")  # exact: every draw ≤ b fits self.dtype
            finally:
                drawn.fill(0)  # the int64 draws, copied into the caller's dtype
            return out
        words = generator.bit_generator.random_raw(size)
        try:
            return self.invert(words, generator, out, index[:size])
        finally:
            words.fill(0)

    def invert(
        self,
        words: NDArray[np.uint64],
        generator: np.random.Generator,
        out: NDArray | None = None,
        index: NDArray[np.intp] | None = None,
    ) -> NDArray:
        """The draws whose uniforms begin with the raw ``words`` (1-D; ties decided by further
        words from ``generator``), into ``out`` if given. Exposed so tests can force flagged
        buckets and ties.

        The guide table is indexed through ``index`` (intp scratch of the words' size, a fresh one
        if not given), zeroed before returning: ``take`` with narrower indices would convert them
        into an intp copy of its own, a copy of the noise words' top bits that nobody could wipe."""
        index = np.empty(words.size, dtype=np.intp) if index is None else index
        try:
            np.right_shift(words, np.uint64(_WORD_BITS - _GUIDE_BITS), out=index.view(np.uint64))
            counts = self._guide.take(index, out=out, mode="clip")  # index < 2¹⁶: "clip" never clips
        finally:
            index.fill(0)
        flagged = np.flatnonzero(counts == self._flag)
        if flagged.size:
            flagged_words = words[flagged]
            exact = np.searchsorted(self._thresholds, flagged_words, side="left")
            nearest = self._thresholds[np.minimum(exact, self.b - 1)]
            for position in np.flatnonzero(nearest == flagged_words):
                exact[position] += self._decide_tie(int(flagged_words[position]), generator)
            counts[flagged] = exact
            for scratch in (flagged_words, exact, nearest):  # copies of noise words and draws
                scratch.fill(0)
        return counts

    def _remainder(self, t: int) -> Fraction:
        """C_t·2⁶⁴ − F_t, exactly: the fraction of U's last 2⁻⁶⁴ step that decides a tie at F_t."""
        return Fraction((self._numerators[t] << _WORD_BITS) - (int(self._thresholds[t]) << self._scale_bits), 1 << self._scale_bits)

    def _decide_tie(self, word: int, generator: np.random.Generator) -> int:
        """#{t : F_t = word, C_t ≤ U}, drawing further words of U until each such t is decided."""
        remainders = [self._remainder(int(t)) for t in np.flatnonzero(self._thresholds == np.uint64(word))]
        low, width, counted = Fraction(0), Fraction(1), 0
        while remainders:
            width /= 1 << _WORD_BITS
            low += int(generator.bit_generator.random_raw()) * width
            counted += sum(1 for r in remainders if r <= low)  # V ≥ low ≥ r: counted
            remainders = [r for r in remainders if low < r < low + width]  # V < low + width ≤ r: not
        return counted


def _distribution_numerators(b: int, p: float) -> tuple[list[int], int]:
    """(N_0, …, N_{b−1}, and s) with C_t = N_t / 2ˢ exactly, for p's binary value."""
    success, denominator = Fraction(p).as_integer_ratio()
    failure = denominator - success
    term = failure**b  # C(b, 0)·M⁰·(2ᵏ − M)ᵇ
    total, numerators = 0, []
    for i in range(b):
        total += term
        numerators.append(total)
        term = term * (b - i) * success // ((i + 1) * failure)  # exact: C(b, i+1)·M^{i+1}·…
    return numerators, b * (denominator.bit_length() - 1)


def _floor_scaled(numerator: int, scale_bits: int) -> int:
    """⌊(numerator / 2^scale_bits)·2⁶⁴⌋."""
    return (numerator << _WORD_BITS) >> scale_bits


def _guide_table(thresholds: NDArray[np.uint64], dtype: np.dtype, flag: int) -> NDArray:
    """For each value h of a word's top 16 bits: #{t : F_t < u} for every u with those bits, or
    ``flag`` when a threshold's top bits equal h (the count may depend on the lower bits)."""
    top = thresholds >> np.uint64(_WORD_BITS - _GUIDE_BITS)
    buckets = np.arange(1 << _GUIDE_BITS, dtype=np.uint64)
    table = np.searchsorted(top, buckets, side="left").astype(dtype)  # #{t : top_t < h}
    table[top.astype(np.intp)] = flag
    return table
