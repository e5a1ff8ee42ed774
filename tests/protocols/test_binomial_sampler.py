"""The encoder's Bin(b, p) sampler: exact thresholds, the law of its draws, ties, and wiping."""

from __future__ import annotations

import math
import sys
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from panpriv.protocols.binomial_sampler import MAX_TABLE_TRIALS, BinomialSampler, count_dtype


def _chi_square_pvalue(draws: np.ndarray, b: int, p: float) -> float:
    """Goodness of fit of ``draws`` to Bin(b, p), tail bins merged until each expects ≥ 5."""
    support = np.arange(b + 1)
    expected = draws.size * stats.binom.pmf(support, b, p)
    keep = np.flatnonzero(expected >= 5)
    low, high = int(keep[0]), int(keep[-1])
    observed = np.bincount(np.clip(draws.astype(np.int64), low, high) - low, minlength=high - low + 1)
    binned = expected[low : high + 1].copy()
    binned[0] += expected[:low].sum()
    binned[-1] += expected[high + 1 :].sum()
    return float(stats.chisquare(observed, binned * observed.sum() / binned.sum()).pvalue)


def test_methods_and_dtypes() -> None:
    assert BinomialSampler(14, 0.4).method == "inversion"
    assert BinomialSampler(MAX_TABLE_TRIALS, 0.5).method == "inversion"
    assert BinomialSampler(MAX_TABLE_TRIALS + 1, 0.3).method == "numpy"
    assert BinomialSampler(14, 0.4).dtype == np.uint8
    assert BinomialSampler(255, 0.5).dtype == np.uint16  # b + 1 = 256 is the guide table's flag
    assert count_dtype(255) == np.uint8 and count_dtype(256) == np.uint16
    assert count_dtype(70_000) == np.uint32
    with pytest.raises(ValueError):
        BinomialSampler(0, 0.5)
    with pytest.raises(ValueError):
        BinomialSampler(5, 1.0)
    with pytest.raises(ValueError, match="cannot hold"):
        BinomialSampler(255, 0.5, np.uint8)


def test_thresholds_are_the_exact_distribution_function_scaled_down() -> None:
    """F_t = ⌊C_t·2⁶⁴⌋ with C_t from exact rational arithmetic on p's binary value, checked
    against scipy's (floating-point) CDF to within its rounding."""
    sampler = BinomialSampler(14, 0.40587871141826787)
    exact = Fraction(sampler.p)
    for t, threshold in enumerate(sampler._thresholds):
        c = sum(math.comb(14, i) * exact**i * (1 - exact) ** (14 - i) for i in range(t + 1))
        assert int(threshold) == math.floor(c * 2**64)
        assert sampler._remainder(t) == c * 2**64 - int(threshold)
        assert abs(int(threshold) / 2**64 - stats.binom.cdf(t, 14, sampler.p)) < 1e-12


@pytest.mark.parametrize(("b", "p"), [(14, 0.40587871141826787), (951, 0.5), (3, 0.01)])
def test_guide_table_agrees_with_bisection(b: int, p: float) -> None:
    """The table's count equals #{t : F_t < u} for random words and for the words on either side
    of every threshold (flagged buckets included); ties aside, inversion needs nothing else."""
    sampler = BinomialSampler(b, p)
    thresholds = sampler._thresholds.astype(object)
    neighbours = [int(f) + step for f in thresholds for step in (-1, 1) if 0 <= int(f) + step < 2**64]
    words = np.concatenate(
        [np.random.default_rng(b).bit_generator.random_raw(200_000), np.array(neighbours, dtype=np.uint64)]
    )
    words = words[~np.isin(words, sampler._thresholds)]
    expected = np.searchsorted(sampler._thresholds, words, side="left")
    np.testing.assert_array_equal(sampler.invert(words, np.random.default_rng(0)), expected)


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("b", "p"),
    [(14, 0.40587871141826787), (15, 0.3926527247667645), (3, 0.01), (90, 0.45), (951, 0.5), (5000, 0.5)],
)
def test_draws_follow_the_binomial_law(b: int, p: float) -> None:
    """Chi-square goodness of fit over 400 000 seeded draws, level 1e-5, for inversion at the
    tight calibrations' small b, a skewed p, p = 1/2 with many flagged buckets, and numpy's path
    (b = 5000); and the mean within 5 standard errors of b·p."""
    sampler = BinomialSampler(b, p)
    draws = sampler.draw(np.random.default_rng(2024 + b), 400_000)
    assert draws.dtype == sampler.dtype and draws.min() >= 0 and draws.max() <= b
    assert _chi_square_pvalue(draws, b, p) > 1e-5
    assert abs(draws.mean() - b * p) < 5 * math.sqrt(b * p * (1 - p) / draws.size)


@pytest.mark.statistical
def test_ties_are_decided_by_the_exact_remainder() -> None:
    """A first word equal to F_t leaves U in [F_t, F_t + 1)/2⁶⁴, where the threshold C_t sits at
    the fraction r = C_t·2⁶⁴ − F_t: the draw must count t with probability exactly 1 − r. Forced
    ties at every threshold, 4 000 draws each: binomial test at level 1e-6 per threshold."""
    sampler = BinomialSampler(6, 0.3)
    generator = np.random.default_rng(5)
    for t, threshold in enumerate(sampler._thresholds):
        words = np.full(4_000, threshold, dtype=np.uint64)
        draws = sampler.invert(words, generator)
        assert set(np.unique(draws)) <= {t, t + 1}  # thresholds below t counted, above not
        remainder = float(sampler._remainder(t))
        counted = int((draws == t + 1).sum())
        assert stats.binomtest(counted, words.size, 1.0 - remainder).pvalue > 1e-6


def test_words_strictly_between_thresholds_need_no_further_draws() -> None:
    """Away from ties, inversion is a pure function of the first word: #{t : F_t < u}."""
    sampler = BinomialSampler(10, 0.25)
    thresholds = sampler._thresholds.astype(object)
    words = np.array([0, int(thresholds[0]) + 1, int(thresholds[4]) - 1, 2**64 - 1], dtype=np.uint64)

    class NoMoreWords:
        @property
        def bit_generator(self) -> object:
            raise AssertionError("a tie-free word drew further randomness")

    draws = sampler.invert(words, NoMoreWords())  # type: ignore[arg-type]
    assert draws.tolist() == [0, 1, 4, 10]


def test_raw_words_are_wiped_after_drawing() -> None:
    """The raw words are the users' noise in another form: zeroed once counted."""
    sampler = BinomialSampler(14, 0.4)
    generator = np.random.default_rng(3)
    seen: list[np.ndarray] = []
    original = generator.bit_generator.random_raw

    def recording(size: int | None = None, output: bool = True) -> np.ndarray:
        words = original(size)
        seen.append(words)
        return words

    class Wrapped:
        bit_generator = type("BitGenerator", (), {"random_raw": staticmethod(recording)})()

    sampler.draw(Wrapped(), 1_000)  # type: ignore[arg-type]
    assert seen and not np.any(seen[0])


def _peak_allocated(run: object) -> int:
    """Peak bytes numpy allocated (traced by tracemalloc) while ``run()`` ran."""
    tracemalloc.start()
    try:
        run()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_guide_indices_leave_no_copy_of_the_words() -> None:
    """The guide table is indexed through the caller's intp buffer, zeroed afterwards: no array the
    size of the words is allocated (``take`` with uint16 indices built an intp copy of the words'
    top bits that nobody wiped). Control: that ``take`` allocates a word-sized copy, so the
    measurement sees it. The buffered draws equal :meth:`BinomialSampler.draw`'s."""
    sampler = BinomialSampler(14, 0.4)
    size = 1 << 16
    words = np.random.default_rng(5).bit_generator.random_raw(size)
    out = np.empty(size, dtype=sampler.dtype)
    index = np.empty(size, dtype=np.intp)
    generator = np.random.default_rng(6)
    assert _peak_allocated(lambda: sampler.invert(words, generator, out, index)) < words.nbytes // 4
    assert not index.any()
    top = words.view(np.uint16)[3::4] if sys.byteorder == "little" else (words >> np.uint64(48)).astype(np.uint16)
    assert _peak_allocated(lambda: sampler._guide.take(top)) >= words.nbytes  # control: the hidden copy
    np.testing.assert_array_equal(out, sampler.invert(words, generator))
    drawn = sampler.draw_into(np.random.default_rng(8), np.empty(size, dtype=sampler.dtype), index)
    np.testing.assert_array_equal(drawn, sampler.draw(np.random.default_rng(8), size))
    assert not index.any()
