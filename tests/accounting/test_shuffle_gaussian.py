"""Tests for panpriv.accounting.shuffle_gaussian: Liew & Takahashi 2022 Thm 1 (Eq. 4), Cor. 1, Alg. 1, Thm 2, Thm 3, Table 1.

Oracles: the printed values of Liew & Takahashi 2022 Table 1; mpmath at 40 digits summing Eq. (4) over every vector
(k₁, …, k_n) for tiny n; Gauss–Hermite quadrature of the Rényi divergence's definition (Liew & Takahashi 2022
Eq. (7)), independent of the multinomial expansion; the partition method of Liew & Takahashi 2022 Alg. 1;
dp-accounting 0.6.0's sampling-without-replacement Gaussian RDP (Wang, Balle & Kasiviswanathan
2019) for the m = 1 case of Thm 2.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_sample_wor_gaussian
from hypothesis import given, settings
from hypothesis import strategies as st

from panpriv.accounting import shuffle_gaussian as sg
from panpriv.accounting.errors import InvalidParameterError


def _mp_eq4(order: int, n: int, sigma: float) -> float:
    """ε_n(λ) by Eq. (4) summed over all (k₁, …, k_n) with Σ k = λ, at 40 digits."""
    with mpmath.workdps(40):
        s = 1 / (2 * mpmath.mpf(sigma) ** 2)
        total = mpmath.mpf(0)
        for ks in itertools.product(range(order + 1), repeat=n):
            if sum(ks) == order:
                factorials = mpmath.fprod(mpmath.factorial(k) for k in ks)
                coefficient = mpmath.factorial(order) / factorials
                total += coefficient * mpmath.exp(s * sum(k * k for k in ks))
        moment = mpmath.exp(-s * order) * total / mpmath.mpf(n) ** order
        return float(mpmath.log(moment) / (order - 1))


def _quadrature_log_moment(power: float, n: int, sigma: float, nodes: int = 90) -> float:
    """log E_{X~N(0,σ²I_n)}[W̄^power], W̄ = (1/n)Σ exp((2X_i − 1)/(2σ²)) (Liew & Takahashi 2022 Eq. (7)).

    power = λ gives (λ−1)·D_λ(mixture ‖ Gaussian), the quantity of Thm 1; power = 1 − λ gives
    (λ−1)·D_λ(Gaussian ‖ mixture), the reverse direction. Tensor Gauss–Hermite rule.
    """
    z, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / math.sqrt(2 * math.pi)
    grids = np.meshgrid(*([z] * n), indexing="ij")
    weights = np.prod(np.meshgrid(*([w] * n), indexing="ij"), axis=0)
    mean = np.mean([np.exp((2 * sigma * g - 1) / (2 * sigma**2)) for g in grids], axis=0)
    return float(np.log(np.sum(weights * mean**power)))


# --- values printed in Liew & Takahashi 2022 -------------------------------------------------------------------

# Liew & Takahashi 2022 Table 1 ("the value of shuffle ε under composition"), n = 60 000, σ = 9.48, global
# sensitivity 1, maximum λ = 30 (§5.1), δ = 1/n (§5.1: "δ_final ≤ 1/n, which is the overall DP δ").
TABLE1_OURS = (0.22820, 0.22820, 0.22821, 0.22821, 0.22821, 0.22822, 0.22822)
TABLE1_CLONES = (0.18623, 0.38461, 0.59516, 0.79355, 1.02241, 1.22689, 1.43138)


@pytest.mark.parametrize("compositions", range(1, 8))
def test_table1_ours_row(compositions: int) -> None:
    value = sg.epsilon(60_000, 9.48, 1 / 60_000, compositions, range(2, 31))
    # Printed to 5 decimals: within half a unit of the last digit.
    assert abs(value - TABLE1_OURS[compositions - 1]) <= 5e-6


def test_table1_uses_unit_sensitivity() -> None:
    # σ = 9.48 is the classic Gaussian σ for (1, 1/n)-LDP with sensitivity 2 (2·√(2 ln(1.25n)) =
    # 9.476), but the RDP column uses sensitivity 1: with σ/Δ = 4.74 the 7-fold value would
    # print 0.22828, not 0.22822.
    assert round(sg.epsilon(60_000, 4.74, 1 / 60_000, 7), 5) == 0.22828


def test_table1_rdp_beats_clones_only_under_composition() -> None:
    # Liew & Takahashi 2022 §5.1: "the clones method gives tighter result without composition, the RDP accounting
    # shows tighter results by a large margin with composition".
    ours = [sg.epsilon(60_000, 9.48, 1 / 60_000, c) for c in range(1, 8)]
    assert ours[0] > TABLE1_CLONES[0]
    assert all(o < c for o, c in zip(ours[1:], TABLE1_CLONES[1:], strict=True))


def test_two_users_closed_form() -> None:
    # Eq. (4) at n = 2, λ = 2: E = e^{−2s}(2e^{4s} + 2e^{2s})/4 = (e^{2s} + 1)/2, s = 1/(2σ²).
    for sigma in (0.3, 1.0, 9.48):
        s = 1 / (2 * sigma**2)
        assert sg.rdp(2, 2, sigma) == pytest.approx(math.log((math.exp(2 * s) + 1) / 2), rel=1e-14)


# --- independent oracles ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("sigma", [0.3, 1.0, 9.48])
def test_matches_mpmath_sum_over_all_vectors(n: int, sigma: float) -> None:
    orders = list(range(2, 8))
    expected = [_mp_eq4(order, n, sigma) for order in orders]
    np.testing.assert_allclose(sg.rdp(orders, n, sigma), expected, rtol=1e-12)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("sigma", [1.0, 2.5])
def test_matches_quadrature_of_the_definition(n: int, sigma: float) -> None:
    # Eq. (7) integrated numerically: checks the multinomial step (Eqs. (8)–(9)) of the proof.
    for order in (2, 3, 5):
        expected = _quadrature_log_moment(order, n, sigma) / (order - 1)
        assert sg.rdp(order, n, sigma) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 60_000, 10**9])
@pytest.mark.parametrize("sigma", [0.4, 1.0, 9.48])
def test_generating_function_matches_partitions_of_alg1(n: int, sigma: float) -> None:
    orders = [2, 3, 4, 6, 9, 14, 20]
    reference = [sg.rdp_by_partitions(order, n, sigma) for order in orders]
    np.testing.assert_allclose(sg.rdp(orders, n, sigma), reference, rtol=1e-10)


def test_partitions_at_order_30_and_huge_n() -> None:
    # 5 604 partitions; E − 1 ≈ 4e-7, where summing terms near 1 would keep ~9 digits.
    assert sg.rdp(30, 10**9, 1.0) == pytest.approx(sg.rdp_by_partitions(30, 10**9, 1.0), rel=1e-10)


def test_partition_generator_counts() -> None:
    # Partition numbers p(1..15) (OEIS A000041); every list is a partition, none repeats.
    counts = [1, 2, 3, 5, 7, 11, 15, 22, 30, 42, 56, 77, 101, 135, 176]
    for total, count in enumerate(counts, start=1):
        parts = [tuple(p) for p in sg._partitions(total)]
        assert len(parts) == len(set(parts)) == count
        assert all(sum(p) == total and list(p) == sorted(p) and min(p) >= 1 for p in parts)


def test_huge_n_has_no_cancellation() -> None:
    # E_n(λ) − 1 = C(λ,2)(e^{2s} − 1)/n + O(λ⁴ e^{6s}/n²), so ε_n(λ) = (λ/2)(e^{2s} − 1)/n to
    # ~λ²/n relative: at n = 1e15 the answer must keep ~14 digits although E − 1 ≈ 1e-15.
    orders = np.arange(2, 9)
    for n in (10**15, 10**18):
        expected = orders / 2 * math.expm1(1.0) / n
        np.testing.assert_allclose(sg.rdp(orders, n, 1.0), expected, rtol=1e-12)


# --- Cor. 1 and other properties -------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.2, 1.0, 9.48])
def test_single_user_is_the_gaussian(sigma: float) -> None:
    orders = np.arange(2, 60)
    np.testing.assert_allclose(sg.rdp(orders, 1, sigma), orders / (2 * sigma**2), rtol=1e-13)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 10**12),
    sigma=st.floats(0.2, 50.0),
    order=st.integers(2, 64),
)
def test_between_sum_gaussian_and_unshuffled_gaussian(n: int, sigma: float, order: int) -> None:
    # Upper: Liew & Takahashi 2022 Cor. 1, ε_n(λ) ≤ λ/(2σ²) (the local Gaussian, no shuffling), strict for n ≥ 2.
    # Lower: the sum of the shuffled outputs, Σx + N(0, nσ²), is a post-processing, so
    # ε_n(λ) ≥ λ/(2nσ²). Liew & Takahashi's shuffle model does NOT reach the central Gaussian on the sum.
    value = sg.rdp(order, n, sigma)
    assert order / (2 * n * sigma**2) * (1 - 1e-12) <= value < order / (2 * sigma**2)


def test_nondecreasing_in_order_including_fractional_orders() -> None:
    orders = np.arange(1.05, 120.0, 0.25)
    for n, sigma in [(2, 0.5), (60_000, 9.48), (10**9, 1.0)]:
        values = sg.rdp(orders, n, sigma)
        assert np.all(np.diff(values) >= -1e-15 * values[1:])


def test_fractional_orders_upper_bound_and_interpolate() -> None:
    # n = 1: (α − 1)ε(α) = α(α−1)s is convex, so the chord between integers lies above it.
    orders = np.array([1.5, 2.25, 3.5, 7.9])
    s = 1 / (2 * 1.3**2)
    assert np.all(sg.rdp(orders, 1, 1.3) >= orders * s)
    assert np.all(sg.rdp(orders, 1, 1.3) <= np.ceil(orders) * s)
    # Between integers, (α − 1)ε(α) is the chord of the integer log-moments (WBK19, Cor. 10).
    low, high = sg.rdp([3, 4], 50, 0.8)
    assert 2.5 * sg.rdp(3.5, 50, 0.8) == pytest.approx((2 * low + 3 * high) / 2, rel=1e-14)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 10**9), sigma=st.floats(0.2, 20.0), ratio=st.floats(1.01, 3.0))
def test_decreasing_in_sigma(n: int, sigma: float, ratio: float) -> None:
    orders = [2, 5, 17, 40]
    assert np.all(sg.rdp(orders, n, sigma * ratio) < sg.rdp(orders, n, sigma))


def test_nonincreasing_in_n() -> None:
    # The assumption of Liew & Takahashi 2022 Thm 3 (Eq. (12) decreasing in n), proven in checkin_rdp's docstring.
    sizes = list(range(1, 41)) + [100, 1000, 60_000, 10**9]
    for sigma in (0.3, 1.0, 9.48):
        values = np.array([sg.rdp([2, 3, 10, 30], n, sigma) for n in sizes])
        assert np.all(np.diff(values, axis=0) <= 0.0)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.5])
def test_reverse_direction_is_smaller(n: int, sigma: float) -> None:
    # Thm 1 bounds D_λ(mixture ‖ Gaussian) only; RDP needs D_λ(Gaussian ‖ mixture) too. Numerical
    # evidence for small n (not a proof): the reverse direction is the smaller one here.
    for order in (2, 3, 5):
        reverse = _quadrature_log_moment(1 - order, n, sigma) / (order - 1)
        assert reverse < sg.rdp(order, n, sigma)


def _two_user_divergence(order: int, sigma: float, a: tuple, b: tuple, c: tuple) -> float:
    """D_λ(M(a, c) ‖ M(b, c)) for two shuffled users with records in R², by quadrature.

    The shuffled pair {Y₁, Y₂} is equivalent to (Y₁ + Y₂, ±(Y₁ − Y₂)): independent, the first
    N(x₁ + x₂, 2σ²I), the second the symmetric mixture ½N(μ, 2σ²I) + ½N(−μ, 2σ²I) with
    μ = x₁ − x₂, whose density ratio to N(0, 2σ²I) is exp(−|μ|²/2v)·cosh(μ·y/v), v = 2σ².
    """
    v = 2 * sigma**2
    z, w = np.polynomial.hermite_e.hermegauss(120)
    y1, y2 = np.meshgrid(np.sqrt(v) * z, np.sqrt(v) * z, indexing="ij")
    weights = np.outer(w, w) / (2 * math.pi)

    def ratio(mu: np.ndarray) -> np.ndarray:
        return np.exp(-(mu @ mu) / (2 * v)) * np.cosh((mu[0] * y1 + mu[1] * y2) / v)

    p = ratio(np.subtract(a, c))
    q = ratio(np.subtract(b, c))
    difference = math.log(np.sum(weights * p**order * q ** (1 - order))) / (order - 1)
    return order * float(np.sum(np.subtract(a, b) ** 2)) / (2 * v) + difference


def test_eq4_is_not_the_worst_case_for_every_record_domain() -> None:
    # THM1_ASSUMPTIONS: Liew & Takahashi 2022 reduces to the pair (0, 0) vs (e₁, 0) "w.l.o.g.". The decomposition
    # above reproduces Eq. (4) for that pair ...
    origin, e1 = (0.0, 0.0), (1.0, 0.0)
    paper_pair = _two_user_divergence(2, 1.0, e1, origin, origin)
    assert paper_pair == pytest.approx(sg.rdp(2, 2, 1.0), rel=1e-10)
    # ... but three records pairwise at distance 1 (not inside a ball of diameter 1) do worse.
    apex = (0.5, math.sqrt(3) / 2)
    worse = _two_user_divergence(2, 1.0, origin, e1, apex)
    assert worse == pytest.approx(0.63915, abs=1e-5)
    assert worse > sg.rdp(2, 2, 1.0) + 0.019


# --- Liew & Takahashi 2022 Thm 2: subsampled shuffled Gaussian -------------------------------------------------


def _mp_eq10(order: int, gamma: float, base: list[float]) -> float:
    """Eq. (10) at 40 digits from base[j] = ε(j) (j = 0..order)."""
    with mpmath.workdps(40):
        g = mpmath.mpf(gamma)
        e2 = mpmath.exp(mpmath.mpf(base[2]))
        total = 1 + g**2 * mpmath.binomial(order, 2) * min(4 * (e2 - 1), 2 * e2)
        for j in range(3, order + 1):
            weight = mpmath.exp((j - 1) * mpmath.mpf(base[j]))
            total += 2 * g**j * mpmath.binomial(order, j) * weight
        return float(mpmath.log(total) / (order - 1))


def test_subsampled_matches_eq10_evaluated_in_mpmath() -> None:
    n, m, sigma, orders = 1000, 10, 1.0, list(range(2, 13))
    base = [0.0, 0.0] + list(sg.rdp(list(range(2, 13)), m, sigma))
    expected = [_mp_eq10(order, m / n, base) for order in orders]
    np.testing.assert_allclose(sg.subsampled_rdp(orders, n, m, sigma), expected, rtol=1e-12)


@pytest.mark.parametrize("n, sigma", [(100, 1.0), (1000, 0.8), (60_000, 0.86)])
def test_subsampled_single_record_matches_dp_accounting(n: int, sigma: float) -> None:
    # m = 1: the base is the plain Gaussian. dp-accounting implements WBK19 Thm 27, which equals
    # Thm 9 (our Eq. (10)) whenever its 2·e^{(j−1)ε(j)} branch is the smaller one, as here.
    orders = list(range(2, 40))
    expected = _compute_rdp_sample_wor_gaussian(1 / n, sigma, orders)
    np.testing.assert_allclose(sg.subsampled_rdp(orders, n, 1, sigma), expected, rtol=1e-12)


def test_subsampled_single_record_is_above_the_tighter_theorem27() -> None:
    # At large σ dp-accounting's Thm 27 is strictly tighter; Eq. (10) stays a (looser) upper bound.
    orders = list(range(2, 40))
    ours = sg.subsampled_rdp(orders, 50, 1, 3.0)
    assert np.all(ours >= _compute_rdp_sample_wor_gaussian(1 / 50, 3.0, orders) * (1 - 1e-12))


def test_subsampling_everyone_is_the_shuffled_gaussian() -> None:
    # γ = 1: Eq. (10) alone is looser; the min with ε_m(λ) (joint convexity) is exact.
    orders = [2, 3, 10, 2.5]
    np.testing.assert_allclose(sg.subsampled_rdp(orders, 100, 100, 1.0), sg.rdp(orders, 100, 1.0))


def test_subsampled_below_unsubsampled_and_decreasing_in_sigma() -> None:
    orders = np.arange(2, 50)
    for n, m in [(60_000, 60), (1000, 500), (10, 3)]:
        low_noise = sg.subsampled_rdp(orders, n, m, 0.86)
        assert np.all(low_noise <= sg.rdp(orders, m, 0.86))
        assert np.all(sg.subsampled_rdp(orders, n, m, 1.5) < low_noise)


# --- Liew & Takahashi 2022 Thm 3: shuffled check-in ------------------------------------------------------------


def test_checkin_matches_eq13_assembled_in_mpmath() -> None:
    n, gamma, sigma, slack = 60_000, 0.1, 5.0, 0.1
    k_star = math.floor((1 - slack) * n * gamma) + 1  # 5 401
    orders = list(range(2, 12))
    with mpmath.workdps(40):
        expected = []
        for order in orders:
            rare_base = [0.0, 0.0] + list(sg.rdp(list(range(2, order + 1)), 1, sigma))
            typical_base = [0.0, 0.0] + list(sg.rdp(list(range(2, order + 1)), k_star, sigma))
            rare = (order - 1) * mpmath.mpf(_mp_eq10(order, gamma, rare_base))
            typical = (order - 1) * mpmath.mpf(_mp_eq10(order, gamma, typical_base))
            total = mpmath.exp(rare - slack**2 * n * gamma / 2) + mpmath.exp(typical)
            expected.append(float(mpmath.log(total) / (order - 1)))
    np.testing.assert_allclose(sg.checkin_rdp(orders, n, gamma, sigma, slack), expected, rtol=1e-11)


def test_checkin_without_slack_is_at_least_everyone_checking_in() -> None:
    # Δ = 0, γ = 1: k* = n, and Eq. (13) adds the k = 1 case at full weight e^0 = 1. Each term is
    # Eq. (10) at γ = 1, an upper bound on the unsubsampled ε_k, so the sum bounds ε_n and ε_1.
    orders = [2, 4, 8]
    value = sg.checkin_rdp(orders, 20, 1.0, 2.0, 0.0)
    assert np.all(value >= sg.rdp(orders, 20, 2.0))
    assert np.all(value >= sg.rdp(orders, 1, 2.0))


def test_checkin_states_its_assumptions() -> None:
    doc = sg.checkin_rdp.__doc__ or ""
    assert "not proven in Liew & Takahashi 2022" in doc and "monotonically decreasing" in doc
    text = " ".join(sg.CHECKIN_ASSUMPTIONS)
    assert "Eq. (12)" in text and "unproven" in text and "Liew" in text
    assert set(sg.THM1_ASSUMPTIONS) <= set(sg.CHECKIN_ASSUMPTIONS)


# --- invalid parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: sg.rdp(1, 10, 1.0), "orders"),
        (lambda: sg.rdp([2, 0.5], 10, 1.0), "orders"),
        (lambda: sg.rdp([], 10, 1.0), "orders"),
        (lambda: sg.rdp([2, math.nan], 10, 1.0), "orders"),
        (lambda: sg.rdp(math.inf, 10, 1.0), "orders"),
        (lambda: sg.rdp("2", 10, 1.0), "orders"),
        (lambda: sg.rdp([2, sg.MAX_ORDER + 1], 10, 1.0), "orders"),
        (lambda: sg.checkin_rdp(10_000, 10, 0.5, 1.0, 0.1), "orders"),
        (lambda: sg.rdp(2, 0, 1.0), "n"),
        (lambda: sg.rdp(2, 2.5, 1.0), "n"),
        (lambda: sg.rdp(2, True, 1.0), "n"),
        (lambda: sg.rdp(2, 10, 0.0), "sigma"),
        (lambda: sg.rdp(2, 10, -1.0), "sigma"),
        (lambda: sg.rdp(2, 10, math.inf), "sigma"),
        (lambda: sg.rdp_by_partitions(1, 10, 1.0), "order"),
        (lambda: sg.rdp_by_partitions(2.5, 10, 1.0), "order"),
        (lambda: sg.rdp_by_partitions(3, 0, 1.0), "n"),
        (lambda: sg.rdp_by_partitions(3, 10, math.nan), "sigma"),
        (lambda: sg.epsilon(10, 1.0, 0.0), "delta"),
        (lambda: sg.epsilon(10, 1.0, 1.0), "delta"),
        (lambda: sg.epsilon(10, 1.0, 1e-5, compositions=0), "compositions"),
        (lambda: sg.epsilon(10, 1.0, 1e-5, orders=[1.0, 2.0]), "orders"),
        (lambda: sg.subsampled_rdp(2, 10, 0, 1.0), "m"),
        (lambda: sg.subsampled_rdp(2, 10, 11, 1.0), "m"),
        (lambda: sg.subsampled_rdp(2, 10, 5, 0.0), "sigma"),
        (lambda: sg.checkin_rdp(2, 10, 0.0, 1.0, 0.1), "gamma"),
        (lambda: sg.checkin_rdp(2, 10, 1.5, 1.0, 0.1), "gamma"),
        (lambda: sg.checkin_rdp(2, 10, 0.5, 1.0, -0.1), "slack"),
        (lambda: sg.checkin_rdp(2, 10, 0.5, 1.0, 1.1), "slack"),
        (lambda: sg.checkin_rdp(2, 0, 0.5, 1.0, 0.1), "n"),
    ],
)
def test_invalid_parameters_name_the_parameter(call: object, name: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        call()  # type: ignore[operator]
    assert info.value.name == name
    assert repr(info.value.value) in str(info.value) and info.value.constraint in str(info.value)


def test_scalar_in_float_out_sequence_in_array_out() -> None:
    assert isinstance(sg.rdp(2, 10, 1.0), float)
    assert isinstance(sg.rdp(np.int64(2), 10, 1.0), float)
    assert sg.rdp((2, 3), 10, 1.0).shape == (2,)
    assert isinstance(sg.subsampled_rdp(2, 10, 5, 1.0), float)
    assert isinstance(sg.checkin_rdp(2, 10, 0.5, 1.0, 0.1), float)
