"""Tests of panpriv.protocols.encoder.VectorSum (Cheu et al. 2022, Alg. 1 / Alg. 2).

Statistical tests use seeded generators; each states its false-failure probability. The exact
privacy of the calibrations is tested in tests/accounting/test_binomial.py.
"""

from __future__ import annotations

import math
import queue
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from panpriv.accounting.binomial import pvec_parameters, tight_parameters
from panpriv.protocols.encoder import (
    _KEYED_SOURCES,
    VectorSum,
    _column_sums,
    _drawing,
    _einsum,
    _inside_squared,
    _largest,
    uniform_shrink,
)
from panpriv.protocols.errors import InvalidInputError

SMALL = dict(n=200, d=3, epsilon=1.0, delta=1e-5, l2_bound=1.0)
TINY = dict(n=5, d=2, epsilon=4.0, delta=1e-3, l2_bound=1.0)  # few messages per user


def _batch(n: int, d: int, l2_bound: float, rng: np.random.Generator) -> np.ndarray:
    X = rng.normal(size=(n, d))
    X *= l2_bound * rng.random((n, 1)) / np.linalg.norm(X, axis=1, keepdims=True)
    X[0:2] = 0.0
    X[1, 0] = -l2_bound  # an extreme point of the ball: encoded to 0
    return X


@pytest.fixture(scope="module")
def small() -> VectorSum:
    return VectorSum(**SMALL)


@pytest.fixture(scope="module")
def tiny() -> VectorSum:
    return VectorSum(**TINY)


# ------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------


def test_paper_calibration_is_000_thm_3_2() -> None:
    encoder = VectorSum(**SMALL, calibration="paper")
    expected = pvec_parameters(200, 3, 1.0, 1e-5, 1.0)
    assert encoder.parameters == expected
    assert (encoder.g, encoder.b, encoder.p) == (expected.g, expected.b, expected.p)
    assert encoder.noise_std == pytest.approx(math.sqrt(expected.variance_bound))


def test_tight_calibration_and_robust_variant(small: VectorSum) -> None:
    assert small.parameters == tight_parameters(200, 3, 1.0, 1e-5, 1.0)
    robust = VectorSum(**SMALL, honest_fraction=0.5)
    assert robust.parameters.noisy_users == 100
    assert robust.b > 1.9 * small.b  # the honest half alone must supply the noise
    paper = VectorSum(**SMALL, calibration="paper")
    assert (paper.noise_std / small.noise_std) ** 2 > 1e4


# ------------------------------------------------------------------------------------------
# Unbiasedness and the variance formula
# ------------------------------------------------------------------------------------------


@pytest.mark.statistical
@pytest.mark.parametrize("pooled", [False, True])
def test_estimate_is_unbiased_with_the_predicted_variance(small: VectorSum, pooled: bool) -> None:
    """R = 3000 seeded estimates of one batch. Mean: |mean − Σx| ≤ 5·σ/√R per coordinate
    (two-sided normal tail 5.7e-7 each). Variance: the sample variance lies within
    5·√(2/(R − 1)) relative of estimate_variance (the estimate is a sum of ~n·b independent
    bounded terms, so nearly Gaussian; tail < 1e-5 each). False-failure rate < 1e-4 overall."""
    rng = np.random.default_rng(20261122 + pooled)
    X = _batch(small.n, small.d, small.l2_bound, rng)
    R = 3000
    estimates = np.array([small.estimate_sum(X, rng=rng, pooled_noise=pooled) for _ in range(R)])
    variance = small.estimate_variance(X)
    np.testing.assert_array_less(np.abs(estimates.mean(axis=0) - X.sum(axis=0)), 5 * np.sqrt(variance / R))
    relative = estimates.var(axis=0, ddof=1) / variance - 1
    np.testing.assert_array_less(np.abs(relative), 5 * math.sqrt(2 / (R - 1)))


def test_variance_formula_and_noise_std(small: VectorSum) -> None:
    g, b, p, n = small.g, small.b, small.p, small.n
    unit = 2 * small.l2_bound / g
    # Every encoded value s = k + 1/2: each user's rounding adds exactly 1/4, the worst case.
    offset = (math.floor(g / 2) + 0.5 - g / 2) * unit
    worst = np.full((n, small.d), offset)
    assert small.estimate_variance(worst) == pytest.approx(np.full(small.d, small.noise_std**2))
    assert small.noise_std**2 == pytest.approx(unit**2 * (n * b * p * (1 - p) + n / 4))
    # Integer encodings (s = g/2 for even g, else x = offset shifted by half a unit): no rounding.
    exact = np.full((n, small.d), 0.0 if g % 2 == 0 else offset - unit / 2)
    assert small.estimate_variance(exact) == pytest.approx(np.full(small.d, unit**2 * n * b * p * (1 - p)))


# ------------------------------------------------------------------------------------------
# The three paths give the same view distribution
# ------------------------------------------------------------------------------------------


@pytest.mark.statistical
def test_bit_count_and_pooled_paths_give_the_same_view(tiny: VectorSum) -> None:
    """Totals T from (a) the literal messages of every user, shuffled and counted, (b) randomize
    + aggregate, (c) the pooled draw, 2000 seeded repetitions each. Two-sample KS tests (conservative
    for integer data) of (a) vs (b) and (a) vs (c) per coordinate at level 1e-5, and each mean within
    5 standard errors of the exact E[T] = Σ s + n·b·p: false-failure rate < 1e-4."""
    rng = np.random.default_rng(7)
    X = _batch(tiny.n, tiny.d, tiny.l2_bound, rng)
    R = 2000
    bits = np.empty((R, tiny.d), dtype=np.int64)
    counts = np.empty_like(bits)
    pooled = np.empty_like(bits)
    unit = 2 * tiny.l2_bound / tiny.g
    for r in range(R):
        messages = np.concatenate([tiny.randomize_bits(x, rng=rng) for x in X])
        bits[r] = tiny.aggregate_messages(messages[rng.permutation(len(messages))])
        counts[r] = tiny.aggregate(tiny.randomize(X, rng=rng))
        # The pooled path's totals, recovered from its (affine, invertible) analyzer output.
        estimate = tiny.estimate_sum(X, rng=rng, pooled_noise=True)
        pooled[r] = np.rint((estimate + tiny.n * tiny.l2_bound) / unit + tiny.n * tiny.b * tiny.p)
    expected = (X + tiny.l2_bound).sum(axis=0) / unit + tiny.n * tiny.b * tiny.p
    for sample in (bits, counts, pooled):
        standard_error = sample.std(axis=0, ddof=1) / math.sqrt(R)
        np.testing.assert_array_less(np.abs(sample.mean(axis=0) - expected), 5 * standard_error)
    for j in range(tiny.d):
        assert stats.ks_2samp(bits[:, j], counts[:, j]).pvalue > 1e-5
        assert stats.ks_2samp(bits[:, j], pooled[:, j]).pvalue > 1e-5


@pytest.mark.statistical
def test_noise_is_binomial_half(tiny: VectorSum) -> None:
    """Integer encodings make rounding deterministic, so counts − s ~ Bin(b, 1/2) exactly (b = 275,
    counts in uint16: the sampler's flag value lies above b). Chi-square goodness of fit over
    40 000 draws, bins with expected count ≥ 5 merged at the tails; level 1e-5."""
    assert tiny.p == 0.5 and tiny.b % 64 != 0
    rng = np.random.default_rng(99)
    unit = 2 * tiny.l2_bound / tiny.g
    x = 0.0 if tiny.g % 2 == 0 else unit / 2  # s = ⌈g/2⌉, an integer
    s = round((x + tiny.l2_bound) / unit)
    noise = (tiny.randomize(np.full((20_000, tiny.d), x), rng=rng) - s).ravel()
    support = np.arange(tiny.b + 1)
    expected = noise.size * stats.binom.pmf(support, tiny.b, 0.5)
    keep = expected >= 5
    low, high = support[keep][0], support[keep][-1]
    observed = np.bincount(np.clip(noise, low, high) - low, minlength=high - low + 1)
    expected_binned = expected[low : high + 1].copy()
    expected_binned[0] += expected[:low].sum()
    expected_binned[-1] += expected[high + 1 :].sum()
    assert stats.chisquare(observed, expected_binned).pvalue > 1e-5


# ------------------------------------------------------------------------------------------
# Shapes, ranges, randomness, chunking
# ------------------------------------------------------------------------------------------


def test_randomize_output_and_seeding(small: VectorSum) -> None:
    X = _batch(small.n, small.d, small.l2_bound, np.random.default_rng(1))
    counts = small.randomize(X, rng=5)
    assert counts.shape == (small.n, small.d) and counts.dtype == small.count_dtype == np.uint8
    assert counts.min() >= 0 and counts.max() <= small.g + small.b
    np.testing.assert_array_equal(counts, small.randomize(X, rng=5))  # replay mode reproduces
    # Default: fresh OS entropy per call — two calls agree with probability < 1e-100.
    assert not np.array_equal(small.randomize(X), small.randomize(X))
    bits = small.randomize_bits(X[2], rng=3)
    assert bits.shape == (small.d * (small.g + small.b), 2)
    assert set(np.unique(bits[:, 1])) <= {0, 1}
    np.testing.assert_array_equal(np.bincount(bits[:, 0]), np.full(small.d, small.g + small.b))
    # The extreme point −Δ₂·e₁ encodes to 0: its coordinate-0 count is pure noise.
    assert small.randomize(X[1:2], rng=2)[0, 0] <= small.b


def test_add_messages_adds_exactly_the_randomized_counts(small: VectorSum, monkeypatch: pytest.MonkeyPatch) -> None:
    """The learners' round path: the same draws as ``randomize`` with the same seed, summed
    exactly (several blocks, long and short), and nothing added when a row is refused."""
    X = _batch(small.n, small.d, small.l2_bound, np.random.default_rng(4))
    for chunk_rows in (small.n, 7, 600):
        monkeypatch.setattr(small, "_chunk_rows", chunk_rows)
        totals = np.arange(small.d, dtype=np.int64)
        small.add_messages(X, totals, rng=8)
        expected = np.arange(small.d) + small.randomize(X, rng=8).sum(axis=0, dtype=np.int64)
        np.testing.assert_array_equal(totals, expected)
    monkeypatch.setattr(small, "_chunk_rows", 7)
    X[150] = 2.0 * small.l2_bound / math.sqrt(small.d)  # norm 2·Δ₂
    totals = np.zeros(small.d, dtype=np.int64)
    with pytest.raises(InvalidInputError, match="row 150"):
        small.add_messages(X, totals, rng=8)
    assert not totals.any()


def _pooled_and_per_user_totals(encoder: VectorSum, X: np.ndarray, R: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """R totals of ``add_messages`` over the rows of X with pooled noise, and R with per-user draws."""
    rng = np.random.default_rng(seed)
    pooled = np.zeros((R, encoder.d), dtype=np.int64)
    per_user = np.zeros_like(pooled)
    for r in range(R):
        encoder.add_messages(X, pooled[r], rng=rng, pooled_noise=True)
        encoder.add_messages(X, per_user[r], rng=rng)
    return pooled, per_user


def _same_law_pvalues(encoder: VectorSum, X: np.ndarray, pooled: np.ndarray, per_user: np.ndarray) -> list[float]:
    """p-values that the pooled totals have the per-user totals' law, per coordinate: a z-test of the
    mean against the exact E[T] = Σ s + m·b·p, a test of the variance against the exact
    Σ f(1 − f) + m·b·p(1 − p) (normal approximation of the sample variance), and the two-sample
    chi-square test of homogeneity of the two samples binned on the per-user sample's deciles."""
    R, m = pooled.shape[0], X.shape[0]
    unit = 2 * encoder.l2_bound / encoder.g
    encoded = (X + encoder.l2_bound) / unit
    fractions = encoded - np.floor(encoded)
    mean = encoded.sum(axis=0) + m * encoder.b * encoder.p
    variance = (fractions * (1 - fractions)).sum(axis=0) + m * encoder.b * encoder.p * (1 - encoder.p)
    pvalues = []
    for j in range(encoder.d):
        z_mean = (pooled[:, j].mean() - mean[j]) / math.sqrt(variance[j] / R)
        z_var = (pooled[:, j].var(ddof=1) / variance[j] - 1) / math.sqrt(2 / (R - 1))
        edges = np.unique(np.quantile(per_user[:, j], np.linspace(0, 1, 11)[1:-1]))
        table = np.array([np.bincount(np.searchsorted(edges, sample[:, j], side="right"), minlength=edges.size + 1)
                          for sample in (pooled, per_user)])
        pvalues += [2 * stats.norm.sf(abs(z_mean)), 2 * stats.norm.sf(abs(z_var)), stats.chi2_contingency(table)[1]]
    return pvalues


@pytest.mark.statistical
def test_pooled_noise_gives_the_totals_of_per_user_messages(tiny: VectorSum, monkeypatch: pytest.MonkeyPatch) -> None:
    """The learners' in-process path (``add_messages(pooled_noise=True)``: m users' roundings plus one
    Bin(m·b, p) per coordinate) against m per-user messages: R = 4000 seeded totals each, for one
    user (m = 1) and the 5 users of a batch. Every test of :func:`_same_law_pvalues` at level 1e-5
    (6 coordinates × 3 tests per m: false-failure rate < 2e-4). Power, checked here: pooling the
    noise of one user only — Bin(b, p) instead of Bin(m·b, p), the bug this test exists for —
    shifts the mean by (m − 1)·b·p ≈ 30 standard deviations and is rejected at p < 1e-50."""
    X = _batch(tiny.n, tiny.d, tiny.l2_bound, np.random.default_rng(12))
    X[0] = [0.3, -0.45]  # fractional encodings: the rounding is random for every user
    for m in (1, tiny.n):
        pooled, per_user = _pooled_and_per_user_totals(tiny, X[:m], 4000, seed=40 + m)
        assert min(_same_law_pvalues(tiny, X[:m], pooled, per_user)) > 1e-5
    monkeypatch.setattr(tiny, "b", tiny.b // tiny.n)  # the pooled draw becomes Bin(b, p): one user's noise
    wrong, _ = _pooled_and_per_user_totals(tiny, X, 500, seed=3)
    monkeypatch.undo()
    _, per_user = _pooled_and_per_user_totals(tiny, X, 500, seed=4)
    assert min(_same_law_pvalues(tiny, X, wrong, per_user)) < 1e-50


def test_pooled_add_messages_replays_estimate_sum_and_refuses_like_per_user(small: VectorSum) -> None:
    """Pooled ``add_messages`` makes the draws of ``estimate_sum(pooled_noise=True)`` (roundings,
    then the binomials), adds exact integers, and leaves ``totals`` untouched when a row is refused."""
    X = _batch(small.n, small.d, small.l2_bound, np.random.default_rng(6))
    totals = np.zeros(small.d, dtype=np.int64)
    small.add_messages(X, totals, rng=3, pooled_noise=True)
    np.testing.assert_array_equal(small.analyze(totals), small.estimate_sum(X, rng=3, pooled_noise=True))
    assert np.all(totals >= 0) and np.all(totals <= small.n * (small.g + small.b))
    X[9] = 2.0 * small.l2_bound / math.sqrt(small.d)
    before = totals.copy()
    with pytest.raises(InvalidInputError, match="row 9"):
        small.add_messages(X, totals, rng=3, pooled_noise=True)
    np.testing.assert_array_equal(totals, before)


def test_pooled_totals_do_not_depend_on_the_split_into_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pooled path splits a batch into equal blocks of at most ``_chunk_rows`` rows; whatever
    the split, ``totals`` gains Σᵢ ⌊clip(sᵢ) + Uᵢ⌋ + Bin(m·b, p) from the same stream (all the
    uniforms in row order, then the d binomials), rebuilt here with ``np.floor``, a row within the
    norm tolerance clipped as :meth:`VectorSum._chunks` clips it; a refused row is named by its
    index in X. Control: another seed gives other totals."""
    encoder = VectorSum(**SMALL)
    X = _batch(1000, encoder.d, encoder.l2_bound, np.random.default_rng(38))
    X[700] *= encoder.l2_bound * (1 + 1e-12) / np.linalg.norm(X[700])
    clipped = X.copy()
    squared = np.einsum("ij,ij->i", X[700:701], X[700:701])
    clipped[700] *= np.nextafter(encoder.l2_bound / np.sqrt(squared), 0.0)
    generator = np.random.default_rng(39)
    s = np.clip(clipped * encoder._encode_scale + 0.5 * encoder.g, 0.0, encoder.g)
    expected = np.floor(s + generator.random(X.shape)).sum(axis=0).astype(np.int64)
    expected += generator.binomial(X.shape[0] * encoder.b, encoder.p, size=encoder.d)
    refused = X.copy()
    refused[900] = 2.0 * encoder.l2_bound / math.sqrt(encoder.d)
    for rows in (encoder._chunk_rows, 1000, 334, 97, 7, 1):
        monkeypatch.setattr(encoder, "_chunk_rows", rows)
        totals = np.zeros(encoder.d, dtype=np.int64)
        encoder.add_messages(X, totals, rng=np.random.default_rng(39), pooled_noise=True)
        np.testing.assert_array_equal(totals, expected)
        with pytest.raises(InvalidInputError, match="row 900 "):
            encoder.add_messages(refused, totals, rng=np.random.default_rng(39), pooled_noise=True)
        np.testing.assert_array_equal(totals, expected)
    other = np.zeros(encoder.d, dtype=np.int64)
    encoder.add_messages(X, other, rng=np.random.default_rng(40), pooled_noise=True)
    assert not np.array_equal(other, expected)


@pytest.mark.statistical
def test_batches_larger_than_one_chunk(tiny: VectorSum) -> None:
    """70 000 users (more than one block of 2¹⁵ elements): every row is written, and the mean count of
    the last 10 000 rows is within 6 standard errors of s + b/2 (false-failure rate < 1e-8)."""
    unit = 2 * tiny.l2_bound / tiny.g
    x = 0.0 if tiny.g % 2 == 0 else unit / 2
    s = round((x + tiny.l2_bound) / unit)
    counts = tiny.randomize(np.full((70_000, tiny.d), x), rng=11)
    assert counts.min() >= s and counts.max() <= s + tiny.b
    tail = counts[-10_000:] - s
    assert abs(tail.mean() - tiny.b / 2) < 6 * math.sqrt(tiny.b / 4 / tail.size)


# ------------------------------------------------------------------------------------------
# Invalid inputs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(SMALL, calibration="loose"), "'calibration'"),
        (dict(SMALL, n=0), "'n'"),
        (dict(SMALL, d=2.5), "'d'"),
        (dict(SMALL, epsilon=-1.0), "'epsilon'"),
        (dict(SMALL, delta=2.0), "'delta'"),
        (dict(SMALL, l2_bound=float("nan")), "'l2_bound'"),
        (dict(SMALL, calibration="paper", honest_fraction=0.1), "'honest_fraction'"),
    ],
)
def test_invalid_constructor_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        VectorSum(**kwargs)


def test_rows_within_the_norm_tolerance_are_clipped_not_refused(small: VectorSum) -> None:
    """Rows normalised as x / ‖x‖ can exceed the bound by an ulp: they are clipped onto it (exact:
    the encoding of the clipped batch equals that of the batch scaled by hand), the caller's array
    is untouched, and an excess beyond NORM_TOLERANCE still fails."""
    X = _batch(small.n, small.d, small.l2_bound, np.random.default_rng(2))
    X[5] = [0.6, 0.0, 0.8 * (1.0 + 5e-10)]  # norm 1 + 4e-10: within the tolerance
    before = X.copy()
    clipped = X.copy()
    clipped[5] *= np.nextafter(1.0 / np.linalg.norm(X[5]), 0.0)
    assert np.linalg.norm(clipped[5]) <= 1.0
    bits = small.randomize(X, rng=7)
    np.testing.assert_array_equal(bits, small.randomize(clipped, rng=7))
    np.testing.assert_array_equal(X, before)
    assert np.isfinite(small.estimate_sum(X)).all()
    X[5] = [0.6, 0.0, 0.8 * (1.0 + 2e-9)]  # 1.6e-9 over: beyond the tolerance
    with pytest.raises(InvalidInputError, match=r"l2 norm <= l2_bound = 1.0; row 5"):
        small.estimate_sum(X)


def test_invalid_batches(small: VectorSum) -> None:
    X = _batch(small.n, small.d, small.l2_bound, np.random.default_rng(2))
    too_long = X.copy()
    too_long[17] = [0.6, 0.6, 0.6]  # norm 1.039 > 1
    with pytest.raises(InvalidInputError, match=r"l2 norm <= l2_bound = 1.0; row 17"):
        small.estimate_sum(too_long)
    with pytest.raises(InvalidInputError, match="l2 norm"):
        small.randomize(too_long)
    for bad in (np.nan, np.inf):
        broken = X.copy()
        broken[3, 1] = bad
        with pytest.raises(InvalidInputError, match="NaN or infinite"):
            small.estimate_sum(broken, pooled_noise=True)
    with pytest.raises(InvalidInputError, match=r"shape \(200, 3\)"):
        small.estimate_sum(X[:-1])  # the calibration is for exactly n users
    with pytest.raises(InvalidInputError, match=r"shape \(m, 3\)"):
        small.randomize(X[:, :2])
    with pytest.raises(InvalidInputError, match="shape"):
        small.randomize(X[0])
    with pytest.raises(InvalidInputError, match=r"shape \(3,\)"):
        small.randomize_bits(X[:2])
    with pytest.raises(InvalidInputError, match="l2 norm"):
        small.randomize_bits(np.array([1.0, 0.1, 0.0]))


def test_invalid_views(small: VectorSum) -> None:
    counts = small.randomize(np.zeros((small.n, small.d)), rng=1)
    with pytest.raises(InvalidInputError, match="aggregate"):
        small.aggregate(counts[:-1])
    with pytest.raises(InvalidInputError, match="integer"):
        small.aggregate(counts.astype(float))
    with pytest.raises(InvalidInputError, match=r"\[0, g \+ b\]"):
        small.aggregate(counts.astype(np.int64) - small.b - small.g)
    with pytest.raises(InvalidInputError, match=r"\[0, g \+ b\]"):
        small.aggregate(np.full(counts.shape, small.g + small.b + 1, dtype=np.uint16))
    with pytest.raises(InvalidInputError, match="analyze"):
        small.analyze(np.zeros(small.d + 1, dtype=np.int64))
    with pytest.raises(InvalidInputError, match="aggregate_messages"):
        small.aggregate_messages(np.zeros((3, 2), dtype=np.int64))


# ------------------------------------------------------------------------------------------
# Fast paths: the same bits as the general ones
# ------------------------------------------------------------------------------------------


def _encoding_of(l2_bound: float, g: int) -> SimpleNamespace:
    """The attributes :meth:`VectorSum._encoded` reads, for an arbitrary (Δ₂, g)."""
    return SimpleNamespace(g=g, _encode_scale=g / (2.0 * l2_bound), _half_g=0.5 * g)


def test_the_clip_is_skipped_only_where_it_changes_no_bit() -> None:
    """:func:`_inside_squared`: rows whose computed squared norm is ≤ T encode into [0, g]
    unclipped, so skipping the clip keeps every bit — checked on the coordinates most likely to
    leave it (±the largest x with fl(x²) ≤ T, for Δ₂ and g where the bound itself leaves [0, g])
    and on random rows scaled onto T. Control: at the norm bound itself the unclipped encoding
    of −Δ₂ is negative for these (Δ₂, g) (so the clip is needed there), and ``_chunks`` keeps it."""
    rng = np.random.default_rng(21)
    cases = [(9.136280215049444, 244), (1.437455399721871, 117), (5.570853954160743, 112)]
    cases += [(float(rng.uniform(0.01, 100.0)), int(rng.integers(2, 5000))) for _ in range(300)]
    leaves = 0
    for l2_bound, g in cases:
        encoding = _encoding_of(l2_bound, g)
        edge = np.array([[-l2_bound], [l2_bound]])
        unclipped = VectorSum._encoded(encoding, edge, np.empty_like(edge), True)  # type: ignore[arg-type]
        leaves += bool(unclipped.min() < 0.0 or unclipped.max() > g)
        for d in (1, 3, 100):
            bound = _inside_squared(l2_bound, d)
            x = math.sqrt(bound)
            while x * x > bound:
                x = math.nextafter(x, 0.0)
            rows = rng.normal(size=(50, d))
            rows *= math.sqrt(bound) / np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows[np.einsum("ij,ij->i", rows, rows) <= bound]
            rows = np.vstack([rows, np.full((1, d), 0.0), np.eye(1, d) * x, -np.eye(1, d) * x])
            fast = VectorSum._encoded(encoding, rows, np.empty_like(rows), True)  # type: ignore[arg-type]
            assert fast.min() >= 0.0 and fast.max() <= g
            clipped = VectorSum._encoded(encoding, rows, np.empty_like(rows), False)  # type: ignore[arg-type]
            np.testing.assert_array_equal(fast.view(np.uint64), clipped.view(np.uint64))
    assert leaves >= 3  # control: at the bound the clip does change bits
    encoder = VectorSum(**SMALL)
    on_bound = np.zeros((4, encoder.d))
    on_bound[0, 0] = -encoder.l2_bound
    assert [inside for _, inside in encoder._chunks(on_bound, "test")] == [False]
    assert [inside for _, inside in encoder._chunks(on_bound * 0.999, "test")] == [True]


def test_norm_check_kernels_give_the_bits_of_the_public_calls() -> None:
    """The norm check's ``_einsum`` is ``np.einsum`` bit for bit, and ``_largest`` decides as
    ``np.maximum.reduce`` (the same value; a NaN anywhere gives NaN), over the widths the
    learners and benchmarks use. Controls: another summation order of the same squares differs
    in the last bits on some rows, and the smallest element is not the largest."""
    rng = np.random.default_rng(36)
    reordered = 0
    for d in (1, 3, 10, 21, 100):
        X = rng.normal(size=(257, d))
        squared = _einsum("ij,ij->i", X, X)
        np.testing.assert_array_equal(squared.view(np.uint64), np.einsum("ij,ij->i", X, X).view(np.uint64))
        out = np.empty(X.shape[0])
        assert _einsum("ij,ij->i", X, X, out=out) is out
        np.testing.assert_array_equal(out.view(np.uint64), squared.view(np.uint64))
        reordered += int(np.count_nonzero(np.add.reduce(X[:, ::-1] * X[:, ::-1], axis=1) != squared))
        for a in (squared, np.repeat(squared[:3], 2), squared[:1]):
            assert _largest(a).view(np.uint64) == np.maximum.reduce(a).view(np.uint64)
            assert a.size == 1 or _largest(a) != a[a.argmin()]  # control
        for position in (0, 100, 256):
            with_nan = squared.copy()
            with_nan[position] = np.nan
            assert np.isnan(_largest(with_nan)) and np.isnan(np.maximum.reduce(with_nan))
    assert reordered > 0  # control: the bits of a squared norm depend on the order of its sum


def test_randomize_bits_encodes_a_row_within_the_tolerance_clipped_not_zeroed(small: VectorSum) -> None:
    """A row just beyond Δ₂ (within :data:`NORM_TOLERANCE`) is sent as the row clipped onto the
    bound, as :meth:`VectorSum._chunks` clips it (the same draws, so the same messages). Control:
    the zero vector's messages differ (what the row was encoded as when the clipped copy was wiped
    before use)."""
    x = np.array([0.6, -0.8, 0.0]) * (1 + 5e-10)
    clipped = x * np.nextafter(small.l2_bound / np.sqrt(np.einsum("i,i->", x, x)), 0.0)
    sent = small.randomize_bits(x, rng=37)
    np.testing.assert_array_equal(sent, small.randomize_bits(clipped, rng=37))
    assert not np.array_equal(sent, small.randomize_bits(np.zeros(3), rng=37))


def test_randomize_makes_the_documented_draws() -> None:
    """Per block: the m·d Bin(b, p) draws (:meth:`BinomialSampler.draw`), then m·d uniforms, and
    count = η + ⌊clip(s) + U·(1 − c)⌋ (:func:`uniform_shrink`) — rebuilt here from the same seeded stream with ``np.floor``, so the
    cast that replaced it is checked bit for bit (fractions near 1 included). Control: the same
    reconstruction with the draws' order swapped differs."""
    encoder = VectorSum(**SMALL)
    rng = np.random.default_rng(30)
    X = _batch(encoder.n, encoder.d, encoder.l2_bound, rng)
    unit = 2 * encoder.l2_bound / encoder.g
    X[2] = [unit * (1 - 1e-12) - encoder.l2_bound, 0.0, 0.0]  # s just below 1: ⌊s + U⌋ ∈ {0, 1}

    def rebuilt(noise_first: bool) -> np.ndarray:
        generator = np.random.default_rng(31)
        size = X.size
        if noise_first:
            noise = encoder._sampler.draw(generator, size).reshape(X.shape)
            uniforms = generator.random(X.shape)
        else:
            uniforms = generator.random(X.shape)
            noise = encoder._sampler.draw(generator, size).reshape(X.shape)
        s = np.clip(X * encoder._encode_scale + 0.5 * encoder.g, 0.0, encoder.g)
        return (noise + np.floor(s + uniforms * uniform_shrink(encoder.g))).astype(encoder.count_dtype)

    counts = encoder.randomize(X, rng=31)
    np.testing.assert_array_equal(counts, rebuilt(noise_first=True))
    assert not np.array_equal(counts, rebuilt(noise_first=False))


def test_one_block_pooled_path_equals_the_general_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The learners' one-block pooled rounds (no generator, no clip when provably idle) add the
    same totals, from the same draws, as the block-by-block path; a row within the norm tolerance
    still goes through :meth:`VectorSum._chunks` (clipped, not refused). Control: a different seed
    gives different totals."""
    encoder = VectorSum(**SMALL)
    X = _batch(39, encoder.d, encoder.l2_bound, np.random.default_rng(32))
    X[5] *= encoder.l2_bound * (1 + 1e-12) / np.linalg.norm(X[5])  # within NORM_TOLERANCE
    for rows in (X[6:], X):
        lean = np.zeros(encoder.d, dtype=np.int64)
        encoder.add_messages(rows, lean, rng=np.random.default_rng(33), pooled_noise=True)
        with monkeypatch.context() as patched:
            patched.setattr(encoder, "_inside", lambda X: None)
            general = np.zeros(encoder.d, dtype=np.int64)
            encoder.add_messages(rows, general, rng=np.random.default_rng(33), pooled_noise=True)
        np.testing.assert_array_equal(lean, general)
        assert encoder._inside(rows) is (True if rows is not X else None)  # the lean path ran, then not
        other = np.zeros(encoder.d, dtype=np.int64)
        encoder.add_messages(rows, other, rng=np.random.default_rng(34), pooled_noise=True)
        assert not np.array_equal(lean, other)
    assert not encoder._pool.any()  # sums, work rows, uniforms and squared norms


def test_os_keyed_sources_are_reused_wiped_and_never_shared() -> None:
    """``rng=None`` reuses OS-keyed sources: each is rekeyed per call (two calls differ) and its
    generator state is zero between calls; a call while another holds a source (another thread)
    gets a different one. Control: inside a call the held generator's state is not zero."""
    encoder = VectorSum(**SMALL)
    X = _batch(encoder.n, encoder.d, encoder.l2_bound, np.random.default_rng(35))
    assert not np.array_equal(encoder.randomize(X), encoder.randomize(X))
    with _drawing(None) as outer, _drawing(None) as inner:
        assert outer is not inner
        assert outer.bit_generator.state["state"]["state"] != 0  # control: keyed while held
    held = []
    while True:
        try:
            held.append(_KEYED_SOURCES.get_nowait())
        except queue.Empty:
            break
    assert len(held) >= 2
    for source in held:
        with source.draw() as generator:
            pass
        assert generator.bit_generator.state["state"] == {"state": 0, "inc": 0}
        _KEYED_SOURCES.put(source)


def test_drawing_wipes_and_returns_its_source_when_the_draw_fails() -> None:
    """A draw that raises inside ``_drawing(None)`` leaves the generator's state zero and its
    source back in the pool (taken again by the next call); a passed ``Generator`` is handed out as
    is and a seed gives the seeded generator. Control: the state is not zero inside the block."""
    others = []
    while not _KEYED_SOURCES.empty():
        others.append(_KEYED_SOURCES.get_nowait())  # an empty pool: the call makes its own source
    try:
        with pytest.raises(RuntimeError, match="refused"):
            with _drawing(None) as generator:
                assert generator.bit_generator.state["state"]["state"] != 0  # control
                raise RuntimeError("refused")
        assert generator.bit_generator.state["state"] == {"state": 0, "inc": 0}
        assert _KEYED_SOURCES.qsize() == 1
        with _drawing(None) as again:
            assert again is generator  # the same source, back in the pool
    finally:
        for source in others:
            _KEYED_SOURCES.put(source)
    passed = np.random.default_rng(41)
    with _drawing(passed) as handed:
        assert handed is passed
    with _drawing(41) as seeded:
        assert seeded.random() == np.random.default_rng(41).random()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_column_sums_of_counts_are_exact(dtype: type) -> None:
    """:func:`_column_sums` of counts (narrow unsigned, accumulated in blocks of a twice-wider type)
    equals the exact column sums, at the largest values and across block and fold edges. Control:
    accumulating 2⁸ + 2 rows of 255 in uint16 without the blocks wraps."""
    rng = np.random.default_rng(40)
    high = np.iinfo(dtype).max
    for rows, width in ((1, 3), (511, 1), (70_001, 2), (1_000, 10), (3_000, 1_000), (200_003, 3)):
        counts = rng.integers(0, high, size=(rows, width), dtype=dtype, endpoint=True)
        counts[: rows // 2] = high
        exact = [sum(int(v) for v in column) for column in counts.T.tolist()] if rows * width < 10**6 else \
            counts.astype(np.uint64).sum(axis=0).tolist()
        sums = _column_sums(counts, np.int64)
        assert sums.dtype == np.int64 and sums.tolist() == exact
    wrapped = np.add.reduce(np.full((258, 1), 255, dtype=np.uint8), axis=0, dtype=np.uint16)
    assert int(wrapped[0]) != 258 * 255


# ------------------------------------------------------------------------------------------
# Randomized rounding stays in {⌊s⌋, ⌈s⌉}
# ------------------------------------------------------------------------------------------

_LARGEST_UNIFORM = 1.0 - 2.0**-53  # numpy's random() is k·2⁻⁵³, k < 2⁵³


@pytest.mark.parametrize("g", [1, 2, 3, 26, 127, 128, 255, 256, 4095, 2**20 + 3])
def test_shrunk_uniforms_round_every_encoding_to_its_floor_or_ceiling(g: int) -> None:
    """⌊fl(s + fl(U·(1 − c)))⌋ ∈ {⌊s⌋, ⌈s⌉} for every integer s = K ≤ g and the floats just
    below and above each, with U at its largest and just under it (:func:`uniform_shrink`'s
    proof, checked). Control: the unshrunk U rounds every integer K ≥ 1 up to K + 1."""
    shrink = uniform_shrink(g)
    integers = np.unique(np.array([0, 1, 2, g // 2, g - 1, g], dtype=np.float64).clip(0, g))
    s = np.concatenate([integers, np.nextafter(integers, -1.0), np.nextafter(integers, np.inf)])
    s = s[(s >= 0.0) & (s <= g)]
    for u in (_LARGEST_UNIFORM, _LARGEST_UNIFORM - 2.0**-53, _LARGEST_UNIFORM - 2.0**-40, 0.5):
        rounded = np.floor(s + u * shrink)
        assert np.all(rounded >= np.floor(s)) and np.all(rounded <= np.ceil(s)), (g, u)
    unshrunk = np.floor(integers + _LARGEST_UNIFORM)
    assert np.array_equal(unshrunk[integers >= 1], integers[integers >= 1] + 1)


class _LargestUniforms(np.random.Generator):
    """A seeded generator whose ``random`` returns its largest value everywhere (the adversarial
    rounding uniform); every other draw is the seeded generator's own."""

    def random(self, size=None, dtype=np.float64, out=None):  # type: ignore[no-untyped-def,override]
        out.fill(_LARGEST_UNIFORM)
        return out


@pytest.mark.parametrize("pooled", [False, True])
def test_integer_encodings_are_never_rounded_up(pooled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Coordinates at +Δ₂, 0 and −Δ₂ encode to exactly g, g/2 and 0 (g = 26 here, with b = 229:
    g + b = 255 fills the uint8 counts). Each must send x̄ = s, whatever the uniform; with U at
    its largest the counts are exactly η + s (per user: η rebuilt from the same seed) and the
    pooled totals Σ s + Bin(m·b, p). Control: the unshrunk uniform sends s + 1 (at g: 27 + η,
    which wraps to 0 when η = 229)."""
    encoder = VectorSum(**SMALL)
    assert (encoder.g, encoder.g + encoder.b, encoder.count_dtype) == (26, 255, np.uint8)
    X = np.zeros((60, encoder.d))
    X[:20, 0], X[40:, 1] = encoder.l2_bound, -encoder.l2_bound
    s = X * encoder._encode_scale + 0.5 * encoder.g
    assert set(np.unique(s)) == {0.0, 13.0, 26.0}

    def sent() -> np.ndarray:
        if pooled:
            totals = np.zeros(encoder.d, dtype=np.int64)
            encoder.add_messages(X, totals, rng=_LargestUniforms(np.random.PCG64(5)), pooled_noise=True)
            return totals
        return encoder.randomize(X, rng=_LargestUniforms(np.random.PCG64(5))).astype(np.int64)

    reference = _LargestUniforms(np.random.PCG64(5))
    if pooled:
        expected = s.sum(axis=0).astype(np.int64) + reference.binomial(X.shape[0] * encoder.b, encoder.p, size=encoder.d)
    else:
        expected = s.astype(np.int64) + encoder._sampler.draw(reference, X.size).reshape(X.shape)
    np.testing.assert_array_equal(sent(), expected)
    monkeypatch.setattr(encoder, "_uniform_shrink", 1.0)
    unshrunk = sent()
    if pooled:
        np.testing.assert_array_equal(unshrunk - expected, (s >= 1.0).sum(axis=0))  # one more per user at s ≥ 1
    else:
        assert np.array_equal((unshrunk - expected)[s >= 1.0] % 256, np.ones(int((s >= 1.0).sum())))
