"""Tests of the exact discrete Gaussian sampler (panpriv.protocols.discrete_gaussian; CKS 2020, Algs. 1–3)
and of the fixed-point rule of panpriv.protocols.secure_noise.

Statistical tests against the exact PMF. Seeded tests (GeneratorUniform, exact uniform integers)
are deterministic; their stated level is the false-failure probability over the choice of seed.
The OS-entropy tests cannot be seeded: each uses a level of 1e-6 (stated per test).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from panpriv.protocols import discrete_gaussian as dg
from panpriv.protocols import secure_noise
from panpriv.protocols.discrete_gaussian import (
    GeneratorUniform,
    OsUniform,
    bernoulli_exp,
    discrete_laplace,
    efficient_variance,
    sample_discrete_gaussian,
)
from panpriv.protocols.errors import InvalidInputError

VARIANCES = [Fraction(1, 4), 1, Fraction(7, 3), 10, 1000]


def _pmf(sigma2: float, support: np.ndarray) -> np.ndarray:
    width = int(60 * math.sqrt(sigma2)) + 5
    full = np.arange(-width, width + 1)
    log_w = -(full.astype(float) ** 2) / (2 * sigma2)
    norm = np.exp(log_w - log_w.max()).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma2) - log_w.max()) / norm


def _chi_square_pvalue(draws: np.ndarray, pmf) -> float:
    """Pearson χ² against ``pmf`` on the integers, pooling cells with expected count < 5 into tails."""
    low, high = int(draws.min()) - 1, int(draws.max()) + 1
    support = np.arange(low - 200, high + 201)
    expected = pmf(support) * draws.size
    keep = expected >= 5
    cells = support[keep]
    observed = np.array([(draws == c).sum() for c in cells], dtype=float)
    rest_obs = draws.size - observed.sum()
    rest_exp = draws.size - expected[keep].sum()
    obs = np.append(observed, rest_obs)
    exp = np.append(expected[keep], rest_exp)
    if rest_exp < 5:  # fold the tails into the largest cell
        obs, exp = obs[:-1], exp[:-1]
        obs[np.argmax(exp)] += rest_obs
        exp[np.argmax(exp)] += rest_exp
    statistic = ((obs - exp) ** 2 / exp).sum()
    return float(stats.chi2.sf(statistic, obs.size - 1))


@pytest.mark.statistical
@pytest.mark.parametrize("sigma2", VARIANCES, ids=str)
def test_discrete_gaussian_matches_the_exact_pmf(sigma2):
    """χ² goodness of fit, 200,000 seeded draws per σ²; level 2e-4 each (1e-3 over the 5 cases)."""
    draws = sample_discrete_gaussian(sigma2, 200_000, GeneratorUniform(np.random.default_rng(11)))
    assert draws.dtype == np.int64
    assert _chi_square_pvalue(draws, lambda y: _pmf(float(sigma2), y)) >= 2e-4


@pytest.mark.statistical
def test_discrete_gaussian_from_os_entropy_matches_the_pmf():
    """The default source (secrets): χ² at level 1e-6 (unseeded, so a loose level)."""
    draws = sample_discrete_gaussian(Fraction(9, 2), 100_000)
    assert _chi_square_pvalue(draws, lambda y: _pmf(4.5, y)) >= 1e-6


@pytest.mark.statistical
def test_mean_variance_and_symmetry():
    """Seeded, 400,000 draws at σ² = 5: the mean's z-score, the variance's (exact Var of N_Z from
    the PMF, Var(Y²) from the PMF), and a binomial test of P(Y > 0) = P(Y < 0); each at 1e-4."""
    sigma2 = 5
    draws = sample_discrete_gaussian(sigma2, 400_000, GeneratorUniform(np.random.default_rng(5)))
    support = np.arange(-80, 81)
    pmf = _pmf(sigma2, support)
    variance = float((pmf * support**2).sum())
    fourth = float((pmf * support**4).sum())
    n = draws.size
    z_mean = draws.mean() / math.sqrt(variance / n)
    z_var = (np.mean(draws.astype(float) ** 2) - variance) / math.sqrt((fourth - variance**2) / n)
    level = stats.norm.isf(1e-4 / 2)
    assert abs(z_mean) < level and abs(z_var) < level
    assert variance <= sigma2  # N_Z's variance never exceeds σ² (equal to double precision here)
    positive, negative = int((draws > 0).sum()), int((draws < 0).sum())
    assert stats.binomtest(positive, positive + negative).pvalue >= 1e-4


@pytest.mark.statistical
def test_discrete_laplace_matches_its_pmf():
    """CKS Alg. 2 alone: P(x) ∝ exp(−|x|/t), t = 4; χ² at level 1e-4, seeded."""
    t = 4
    draws = discrete_laplace(t, 200_000, GeneratorUniform(np.random.default_rng(3)))
    norm = (1 + math.exp(-1 / t)) / (1 - math.exp(-1 / t))
    assert _chi_square_pvalue(draws, lambda y: np.exp(-np.abs(y) / t) / norm) >= 1e-4


@pytest.mark.statistical
@pytest.mark.parametrize("num,den", [(0, 1), (1, 3), (1, 1), (5, 2), (7, 1), (2**40 + 3, 2**41)])
def test_bernoulli_exp_has_probability_exp_minus_num_over_den(num, den):
    """CKS Alg. 1: binomial test at level 1e-4 per case, 100,000 seeded trials."""
    trials = 100_000
    outcome = bernoulli_exp(np.full(trials, num, dtype=np.int64), den, GeneratorUniform(np.random.default_rng(num)))
    probability = math.exp(-num / den)
    if num == 0:
        assert outcome.all()
    else:
        assert stats.binomtest(int(outcome.sum()), trials, probability).pvalue >= 1e-4


@pytest.mark.statistical
@pytest.mark.parametrize("source", [OsUniform(), GeneratorUniform(np.random.default_rng(2))], ids=["os", "generator"])
def test_uniform_sources_are_uniform_and_in_range(source):
    """χ² on 7 cells (level 1e-6) and range checks for int64 and Python-int bounds."""
    draws = source.below(np.full(70_000, 7, dtype=np.int64))
    observed = np.bincount(draws, minlength=7)
    assert draws.min() >= 0 and draws.max() <= 6
    assert stats.chisquare(observed).pvalue >= 1e-6
    big = np.array([2**70 + 1] * 2000, dtype=object)
    values = source.below(big)
    assert all(0 <= int(v) < 2**70 + 1 for v in values)
    assert max(int(v) for v in values) > 2**69  # the top bit is used (fails with probability 2^-2000)
    huge = source.below(np.full(20_000, 2**62 - 1, dtype=np.int64))
    assert stats.kstest(huge / 2.0**62, "uniform").pvalue >= 1e-6


def test_big_variances_use_exact_python_integers():
    """σ² with a large denominator forces the Python-int path; the draws are plausible and exact ints."""
    sigma2 = Fraction(3 * 2**60 + 1, 7)
    draws = sample_discrete_gaussian(sigma2, 400, GeneratorUniform(np.random.default_rng(9)))
    assert draws.dtype == np.int64
    scale = math.sqrt(float(sigma2))
    assert abs(draws.mean()) < 5 * scale / math.sqrt(400)
    assert 0.7 < draws.std() / scale < 1.3  # 400 draws: the ratio's sd is about 0.035


def test_seeded_draws_are_reproducible_and_any_proposal_scale_is_valid():
    a = sample_discrete_gaussian(50, 500, GeneratorUniform(np.random.default_rng(4)))
    b = sample_discrete_gaussian(50, 500, GeneratorUniform(np.random.default_rng(4)))
    assert np.array_equal(a, b)
    sigma2, t = efficient_variance(50)
    assert sigma2 >= 50 and sigma2 % t == 0 and sigma2 - 50 < t


@pytest.mark.statistical
def test_a_non_default_proposal_scale_gives_the_same_distribution():
    """Alg. 3 is exact for any scale t; t = 2 at σ² = 30 (default would be 6): χ² level 1e-4."""
    draws = sample_discrete_gaussian(30, 100_000, GeneratorUniform(np.random.default_rng(8)), scale=2)
    assert _chi_square_pvalue(draws, lambda y: _pmf(30.0, y)) >= 1e-4


class _RecordingSource:
    """A real uniform source that records every bound it is asked for."""

    def __init__(self) -> None:
        self.inner = GeneratorUniform(np.random.default_rng(0))
        self.kinds: set[str] = set()

    def below(self, bounds):
        self.kinds.add(bounds.dtype.kind)
        if bounds.dtype == object:
            assert all(type(b) is int for b in bounds)
        return self.inner.below(bounds)


def test_no_float_is_involved_in_sampling():
    """Every random decision is a comparison with a uniform integer: the sampler asks only for
    integer bounds, its code calls no floating-point function (``_oversampled``, which only sizes a
    round of trials, is the one exception: it never touches a drawn value), and a float σ² is refused."""
    source = _RecordingSource()
    sample_discrete_gaussian(Fraction(10**6, 3), 300, source)
    sample_discrete_gaussian(Fraction(3 * 2**60 + 1, 7), 20, source)
    assert source.kinds <= {"i", "O"}
    forbidden = {"exp", "log", "sqrt", "float", "float64", "random", "normal", "uniform", "expm1", "log1p"}
    for function in (dg._bernoulli_exp_fraction, dg.bernoulli_exp, dg._geometric_exp1, dg.discrete_laplace,
                     dg.sample_discrete_gaussian, dg.default_scale, dg.efficient_variance, dg._scaled_bounds,
                     OsUniform.below, GeneratorUniform.below, GeneratorUniform._big_below):
        used = set(function.__code__.co_names)
        assert not (used & forbidden), (function.__name__, used & forbidden)
    with pytest.raises(InvalidInputError, match="'sigma2'"):
        sample_discrete_gaussian(2.5, 10)


# -- the fixed-point rule of panpriv.protocols.secure_noise ----------------------------------------------


def test_grid_rows_never_exceed_the_integer_norm_bound():
    rng = np.random.default_rng(0)
    bound = 0.7
    vectors = rng.normal(size=(5000, 11))
    vectors *= bound / np.linalg.norm(vectors, axis=1, keepdims=True)  # norms at the bound (± ulps)
    vectors[:100] *= 1 + 4e-16  # a few ulps over, as floating-point clipping can leave
    units = secure_noise.to_grid(vectors, bound)
    assert units.dtype == np.int64
    assert (np.einsum("ij,ij->i", units, units) <= 4**secure_noise.GRID_BITS).all()
    # Truncation toward zero: never larger in magnitude, and within one unit.
    scaled = vectors * 2.0**secure_noise.GRID_BITS / bound
    assert (np.abs(units) <= np.abs(scaled) + 1e-9).all() and (np.abs(scaled) - np.abs(units) < 1 + 1e-9).all()


def test_grid_sum_equals_the_sum_of_integer_rows_exactly():
    rng = np.random.default_rng(3)
    bound = 1.3
    for rows, columns in ((1, 3), (500, 21), (3000, 101), (40, 1001)):
        vectors = rng.normal(size=(rows, columns))
        vectors *= bound / np.maximum(bound, np.linalg.norm(vectors, axis=1, keepdims=True))
        vectors[: rows // 3] *= bound / np.linalg.norm(vectors[: rows // 3], axis=1, keepdims=True) * (1 + 4e-16)
        vectors[-1] = 0.0
        vectors[-1, 0] = bound * 1.001  # over the bound (a clipping defect): the integer path must fix it
        expected = secure_noise.to_grid(vectors, bound).sum(axis=0)
        assert (np.einsum("ij,ij->i", *(2 * [secure_noise.to_grid(vectors, bound)])) <= 4**secure_noise.GRID_BITS).all()
        total = secure_noise.grid_sum(vectors, bound)
        assert total.dtype == np.int64 and np.array_equal(total, expected)
    assert np.array_equal(secure_noise.grid_sum(np.zeros((0, 4)), bound), np.zeros(4, dtype=np.int64))


def test_replacing_one_record_moves_the_sum_by_at_most_the_sensitivity():
    bound = 3.0
    worst = np.array([[bound, 0.0, 0.0]]), np.array([[-bound, 0.0, 0.0]])
    a, b = (secure_noise.to_grid(v, bound).sum(axis=0) for v in worst)
    assert np.linalg.norm(a - b) == secure_noise.SENSITIVITY_UNITS
    rng = np.random.default_rng(1)
    for _ in range(200):
        g = rng.normal(size=(2, 6))
        g *= bound / np.maximum(bound, np.linalg.norm(g, axis=1, keepdims=True)) * rng.uniform(0.5, 1.0)
        ua, ub = secure_noise.to_grid(g, bound)
        assert math.isqrt(int(((ua - ub) ** 2).sum())) <= secure_noise.SENSITIVITY_UNITS


def test_draw_calibration_meets_the_target():
    from panpriv.accounting.discrete_gaussian import zcdp_delta

    for epsilon in (0.5, 1.0, 4.0):
        calibration = secure_noise.calibrate_draw(epsilon, 1e-6)
        assert calibration.sigma2 % calibration.scale == 0
        assert calibration.epsilon <= epsilon
        assert zcdp_delta(calibration.rho, epsilon) <= 1e-6
        assert calibration.rho == secure_noise.SENSITIVITY_UNITS**2 / (2 * calibration.sigma2)
