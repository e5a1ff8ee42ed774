"""Tests for panpriv.accounting.iteration: amplification by iteration for PNSGD (Sordello et al. 2021).

Oracles: mpmath at high precision for θ, Thm 2 and the online integrals (written here from the
paper's formulas, independently of the module's log-space numerics); brute-force products over
positions for Thm 1 / Sec. 5 and the average over positions of Thm 2's proof (Sordello et al. 2021, App. A);
closed forms derived from Sordello et al. 2021, App. B for the Laplace setting of App. G; the second-order
expansion of Sordello et al. 2021, Eq. (11) for the Gaussian rate; panpriv.accounting.gaussian.analytic_delta for θ.

Sordello et al. 2021 prints no δ values (its Figs 1–4 are plots); it prints the App. G parameters and the limits
δ*_L, δ*_G, δ^{*,o} as formulas, which are pinned here, with the convergence toward them.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_delta
from panpriv.accounting.iteration import (
    OnlineLimit,
    WorstRecord,
    contraction,
    fixed_laplace_scale,
    fixed_sigma,
    gaussian_delta_star,
    gaussian_online_delta_star,
    laplace_delta_star,
    laplace_online_delta_star,
    online_laplace_scale,
    online_sigma,
    pnsgd_delta,
    pnsgd_laplace_delta,
    record_log_deltas,
    shuffled_pnsgd_delta,
    shuffled_pnsgd_laplace_delta,
    shuffled_pnsgd_sigma,
    theta,
    worst_released_delta,
)

# Sordello et al. 2021, App. G. Shuffled (Figs 1–2 left/centre): L = 10, β = 0.5, ρ = 0, η = 0.1, ε = 1, C1 = 1e5,
# (a, b) = (0, 1) with C2 = 2 (Laplace), D_K = 1 with C2 = 100 (Gaussian); Fig. 3: η ∈ {0.02, 0.01}.
# Online (Figs 1–2 right): same L, β, ρ, ε; η = 0.01, α = 1.5, i = 100, C1 = 100, C2 = 100.
EPSILON = 1.0
SHUFFLED = {"L": 10.0, "eta": 0.1, "beta": 0.5, "rho": 0.0}
SHUFFLED_C1, LAPLACE_C2, GAUSSIAN_C2 = 1e5, 2.0, 100.0
ONLINE_ETA, ONLINE_ALPHA, ONLINE_I, ONLINE_C1, ONLINE_C2 = 0.01, 1.5, 100, 100.0, 100.0
# (alpha, eta, diameter or width, C1, C2, beta, rho) of online_sigma / online_laplace_scale.
ONLINE_SCHEDULE = (ONLINE_ALPHA, ONLINE_ETA, 1.0, ONLINE_C1, ONLINE_C2, 0.5, 0.0)
# (alpha, L, eta, diameter or width, C1, C2, beta, rho) of the δ^{*,o} functions.
ONLINE_LIMIT = (ONLINE_ALPHA, 10.0, ONLINE_ETA, 1.0, ONLINE_C1, ONLINE_C2, 0.5, 0.0)
MODEL = {"L": 10.0, "eta": 0.1, "diameter": 1.0, "beta": 0.5, "rho": 0.0}


# ------------------------------------------------------------------------------------ oracles


def mp_theta(epsilon: float, r: object) -> mp.mpf:
    """θ_{e^ε}(r) of Sordello et al. 2021, Thm 1, verbatim: Q(ε/r − r/2) − e^ε Q(ε/r + r/2)."""
    r = mp.mpf(r)
    q = lambda t: mp.ncdf(-t)  # noqa: E731  (Q(t) = 1 − Φ(t) = Φ(−t))
    return q(epsilon / r - r / 2) - mp.e**epsilon * q(epsilon / r + r / 2)


def mp_log_theta_near_one(epsilon: float, r: object) -> mp.mpf:
    """log θ via 1 − θ = Q(r/2 − ε/r)... computed as Φ(ε/r − r/2) + e^ε Φ(−ε/r − r/2)."""
    r = mp.mpf(r)
    return mp.log1p(-(mp.ncdf(epsilon / r - r / 2) + mp.e**epsilon * mp.ncdf(-epsilon / r - r / 2)))


def mp_thm2(n: int, a: mp.mpf, b: mp.mpf) -> mp.mpf:
    """A (1 − Bⁿ) / (n (1 − B)), Sordello et al. 2021, Eq. (5)."""
    return a * (1 - b**n) / (n * (1 - b))


def mp_lambert_argument(t: object, power: float, C1: float, C2: float) -> mp.mpf:
    return mp.mpf(t) ** power / (2 * mp.pi * mp.mpf(C1) ** 2) + C2


# ------------------------------------------------------------------------------------ θ


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 1.0, 5.0, 20.0])
@pytest.mark.parametrize("r", [0.05, 0.3, 1.0, 5.0, 12.0, 40.0])
def test_theta_matches_mpmath_and_analytic_gaussian(epsilon: float, r: float) -> None:
    with mp.workdps(60):
        reference = float(mp_theta(epsilon, r))
    value = theta(math.exp(epsilon), r)
    assert value == pytest.approx(reference, rel=1e-11, abs=1e-300)
    # θ_{e^ε}(Δ/σ) is the analytic Gaussian δ(ε) (issue 3; Balle & Wang 2018, Thm 8).
    assert value == pytest.approx(analytic_delta(epsilon, 2.0, 2.0 * r), rel=1e-12, abs=1e-300)


def test_theta_reproduces_dp_accounting_reference_sigma() -> None:
    # formulas.md: ε = 1, δ = 1e-5, Δ = 1 → σ ≈ 3.7306316348 (dp-accounting).
    assert theta(math.e, 1.0 / 3.7306316348) == pytest.approx(1e-5, rel=1e-8)


def test_theta_edge_cases() -> None:
    assert theta(math.e, 0.0) == 0.0
    assert theta(math.e, math.inf) == 1.0
    # γ = 1: total variation between N(r, 1) and N(0, 1) is 2Φ(r/2) − 1.
    assert theta(1.0, 1.3) == pytest.approx(math.erf(1.3 / 2 / math.sqrt(2)), rel=1e-14)


@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.floats(0.0, 10.0),
    r=st.floats(1e-2, 50.0),
    factor=st.floats(1.01, 3.0),
)
def test_theta_increases_in_r_and_decreases_in_gamma(
    epsilon: float, r: float, factor: float
) -> None:
    gamma = math.exp(epsilon)
    assert theta(gamma, r) <= theta(gamma, r * factor)
    assert theta(gamma * factor, r) <= theta(gamma, r)


# ------------------------------------------------------------------------------------ M


def test_contraction_values() -> None:
    assert contraction(0.1, 0.5, 0.0) == 1.0  # Sordello et al. 2021, App. G (ρ = 0)
    assert contraction(4.0, 0.5, 0.0) == 1.0  # η = 2/β
    # Sordello et al. 2021, Thm 1 formula where it is valid (η ≤ 2/(β+ρ)).
    assert contraction(0.5, 1.0, 0.5) == pytest.approx(math.sqrt(1.0 - 2 * 0.5 * 0.5 / 1.5))
    # Deviation: for η > 2/(β+ρ) Sordello et al.'s M is too small. ℓ(w) = w²/2 (β = 1, also 0.2-strongly
    # convex) has step w ↦ (1 − η)w = −0.9w at η = 1.9, while Sordello et al.'s formula gives 0.606.
    assert math.sqrt(1.0 - 2 * 1.9 * 1.0 * 0.2 / 1.2) == pytest.approx(0.6055, abs=1e-4)
    assert contraction(1.9, 1.0, 0.2) == pytest.approx(0.9, rel=1e-15)
    # The two branches meet at η = 2/(β + ρ) with value (β − ρ)/(β + ρ).
    edge = 2.0 / 1.2
    assert contraction(edge, 1.0, 0.2) == pytest.approx(0.8 / 1.2, rel=1e-12)
    assert contraction(edge * (1 + 1e-12), 1.0, 0.2) == pytest.approx(0.8 / 1.2, rel=1e-10)


@settings(max_examples=100, deadline=None)
@given(
    beta=st.floats(0.01, 100.0),
    rho_fraction=st.floats(0.0, 1.0),
    eta_fraction=st.floats(1e-6, 1.0),
    lam_fraction=st.floats(0.0, 1.0),
)
def test_contraction_bounds_every_quadratic_step(
    beta: float, rho_fraction: float, eta_fraction: float, lam_fraction: float
) -> None:
    """M ≥ |1 − ηλ| for every curvature λ ∈ [ρ, β] (the step of ℓ(w) = λw²/2), and M ≤ 1."""
    rho = rho_fraction * beta
    eta = eta_fraction * 2.0 / beta
    lam = rho + lam_fraction * (beta - rho)
    m = contraction(eta, beta, rho)
    assert abs(1.0 - eta * lam) <= m * (1 + 1e-12) + 1e-12
    assert m <= 1.0


# ------------------------------------------------------------------------------ Thm 1 / Sec. 5


def test_pnsgd_delta_is_the_product_of_thm1_factors() -> None:
    rng = np.random.default_rng(3)
    sigmas = rng.uniform(0.5, 6.0, size=7)
    eta, diameter, L, beta, rho = 0.3, 2.0, 1.5, 2.0, 0.5
    m = math.sqrt(1 - 2 * eta * beta * rho / (beta + rho))
    with mp.workdps(40):
        for position in range(1, 8):
            reference = mp_theta(EPSILON, 2 * L / sigmas[position - 1])
            for sigma in sigmas[position:]:
                reference *= mp_theta(EPSILON, m * diameter / (eta * sigma))
            got = pnsgd_delta(EPSILON, sigmas, position, L, eta, diameter, beta, rho)
            assert got == pytest.approx(float(reference), rel=1e-12)


def test_pnsgd_laplace_delta_is_the_product_of_eq4_factors() -> None:
    scales = [0.8, 3.0, 1.2, 0.4, 2.5]
    L, eta, width, beta, rho = 1.0, 0.5, 1.0, 1.0, 0.0  # M = 1
    for position in range(1, 6):
        reference = max(1 - math.exp(EPSILON / 2 - L / scales[position - 1]), 0.0)
        for v in scales[position:]:
            reference *= max(1 - math.exp(EPSILON / 2 - width / (2 * eta * v)), 0.0)
        got = pnsgd_laplace_delta(EPSILON, scales, position, L, eta, width, beta, rho)
        assert got == pytest.approx(reference, rel=1e-13, abs=1e-300)
    # v = 3.0 gives B = (1 − e^{1/2 − 1/3})_+ = 0: every earlier record is perfectly hidden.
    assert pnsgd_laplace_delta(EPSILON, scales, 1, L, eta, width, beta, rho) == 0.0


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_record_log_deltas_match_single_record_accounting(noise: str) -> None:
    rng = np.random.default_rng(11)
    n = 40
    scales = rng.uniform(0.2, 4.0, size=n)
    releases = [3, 10, 11, 25, 33]
    kwargs = {"L": 1.0, "eta": 0.5, "diameter": 1.0, "beta": 1.0, "rho": 0.3}
    single = pnsgd_delta if noise == "gaussian" else pnsgd_laplace_delta
    deltas = np.exp(record_log_deltas(EPSILON, scales, releases, noise=noise, **kwargs))
    assert deltas.shape == (33,)
    for position in range(1, 34):
        release = min(s for s in releases if s >= position)
        reference = single(
            EPSILON, scales[:release], position, kwargs["L"], kwargs["eta"], kwargs["diameter"],
            kwargs["beta"], kwargs["rho"],
        )
        assert deltas[position - 1] == pytest.approx(reference, rel=1e-12, abs=1e-300)
    if noise == "laplace":
        assert np.any(deltas == 0.0) and np.any(deltas > 0.0)  # some B_t = 0 exactly
    worst = worst_released_delta(EPSILON, scales, releases, noise=noise, **kwargs)
    assert worst == WorstRecord(delta=float(deltas.max()), position=int(np.argmax(deltas)) + 1)


def test_constant_noise_recovers_thm1() -> None:
    sigma, n = 2.0, 50
    a = pnsgd_delta(EPSILON, [sigma], 1, **MODEL)
    ab = pnsgd_delta(EPSILON, [sigma, sigma], 1, **MODEL)
    b = ab / a
    deltas = np.exp(record_log_deltas(EPSILON, np.full(n, sigma), [n], **MODEL))
    np.testing.assert_allclose(deltas, a * b ** (n - np.arange(1, n + 1)), rtol=1e-12)
    worst = worst_released_delta(EPSILON, np.full(n, sigma), [n], **MODEL)
    assert worst.position == n
    assert worst.delta == pytest.approx(a, rel=1e-14)


def test_online_stream_of_a_million_records_with_snapshots() -> None:
    """Issue 6's setting: 10⁶ records, App. G online Gaussian schedule, snapshot every 10⁴."""
    n, every = 10**6, 10**4
    model = {"L": 10.0, "eta": ONLINE_ETA, "diameter": 1.0, "beta": 0.5, "rho": 0.0}
    schedule = (ONLINE_ALPHA, ONLINE_ETA, 1.0, ONLINE_C1, ONLINE_C2, 0.5, 0.0)
    sigmas = online_sigma(np.arange(1, n + 1), *schedule)
    releases = np.arange(every, n + 1, every)
    log_deltas = record_log_deltas(EPSILON, sigmas, releases, **model)
    # Spot checks against the single-record product over the same window.
    for position in (1, 100, 9_999, 10_000, 10_001, 543_210, n):
        release = int(releases[np.searchsorted(releases, position)])
        reference = pnsgd_delta(EPSILON, sigmas[:release], position, **model)
        assert math.exp(log_deltas[position - 1]) == pytest.approx(reference, rel=1e-10)
    # The least protected record is the last one, released right after its own step: δ = A_n.
    worst = worst_released_delta(EPSILON, sigmas, releases, **model)
    assert worst.position == n
    assert worst.delta == pytest.approx(theta(math.e, 2 * 10.0 / sigmas[-1]), rel=1e-12)
    assert 0.5 < worst.delta < 0.6  # A_n → 1 as σ_n → 0: no useful uniform guarantee


# ------------------------------------------------------------------------------------ Thm 2


@pytest.mark.parametrize("n", [1, 2, 3, 17])
def test_shuffled_delta_is_the_average_over_positions(n: int) -> None:
    """Sordello et al. 2021, App. A: the differing record lands at each position with probability 1/n."""
    sigma, scale = 1.7, 0.9
    gaussian = [pnsgd_delta(EPSILON, [sigma] * n, j, **MODEL) for j in range(1, n + 1)]
    assert shuffled_pnsgd_delta(n, EPSILON, sigma, **MODEL) == pytest.approx(
        sum(gaussian) / n, rel=1e-13
    )
    laplace_model = {"L": 1.0, "eta": 0.5, "width": 1.0, "beta": 1.0, "rho": 0.0}
    laplace = [
        pnsgd_laplace_delta(EPSILON, [scale] * n, j, **laplace_model) for j in range(1, n + 1)
    ]
    assert shuffled_pnsgd_laplace_delta(n, EPSILON, scale, **laplace_model) == pytest.approx(
        sum(laplace) / n, rel=1e-13
    )


@pytest.mark.parametrize("n", [10**3, 10**4, 10**5, 10**6, 10**8, 10**12])
@pytest.mark.parametrize("eta", [0.1, 0.02, 0.01])
def test_app_g_gaussian_shuffled_matches_mpmath(n: int, eta: float) -> None:
    """Figs 2–3 settings: σ(n) of Thm 5 (Eq. (7)) and δ(n) of Thm 2 at 60 digits."""
    sigma = fixed_sigma(n, eta, 1.0, SHUFFLED_C1, GAUSSIAN_C2, 0.5, 0.0)
    with mp.workdps(60):
        w = mp.lambertw(mp_lambert_argument(n, 2, SHUFFLED_C1, GAUSSIAN_C2)).real
        sigma_ref = 1 / (2 * eta * mp.sqrt(w))
        a = mp_theta(EPSILON, 2 * 10 / sigma_ref)
        b = mp_theta(EPSILON, 1 / (eta * sigma_ref))
        reference = mp_thm2(n, a, b)
        assert sigma == pytest.approx(float(sigma_ref), rel=1e-13)
        got = shuffled_pnsgd_delta(n, EPSILON, sigma, 10.0, eta, 1.0, 0.5, 0.0)
        assert got == pytest.approx(float(reference), rel=1e-10)


def test_delta_star_values() -> None:
    # Sordello et al. 2021, Eqs. (6)–(7) at App. G's ε = 1, C1 = 10⁵.
    with mp.workdps(40):
        c = SHUFFLED_C1 * mp.e ** (EPSILON / 2)
        assert laplace_delta_star(EPSILON, SHUFFLED_C1) == pytest.approx(
            float((1 - mp.e**-c) / c), rel=1e-15
        )
        assert gaussian_delta_star(EPSILON, SHUFFLED_C1) == pytest.approx(
            float((1 - mp.e ** (-2 * c)) / (2 * c)), rel=1e-15
        )
    # δ*_L = e^{−1/2}·10⁻⁵ and δ*_G = δ*_L/2 (the e^{−C1 e^{ε/2}} terms vanish in double precision).
    star_l = laplace_delta_star(EPSILON, SHUFFLED_C1)
    assert star_l == pytest.approx(6.0653065971263342e-06, rel=1e-14)
    assert gaussian_delta_star(EPSILON, SHUFFLED_C1) == pytest.approx(star_l / 2, rel=1e-15)
    assert laplace_delta_star(0.0, 1e-12) == pytest.approx(1.0, rel=1e-12)  # small-C1 limit


@pytest.mark.parametrize("n", [10**3, 10**5, 10**6, 10**7, 10**9, 10**12])
def test_app_g_laplace_shuffled_closed_form_and_rate(n: int) -> None:
    """Fig. 1 left/centre. With M = 1 and 2Lη/(M(b−a)) = 2, App. B's algebra is exact:

    1 − B = c/(n + C1C2), A = 1 − e^{ε/2} C1²/(n + C1C2)², c = C1 e^{ε/2}, so
    δ(n) = A (1 − (1 − c/(n + C1C2))ⁿ)(n + C1C2)/(c n) and, as e^{−c} ≈ 0,
    n (δ(n) − δ*_L) = C2 e^{−ε/2} − C1/(n + C1C2) → C2 e^{−ε/2} (the 1/n rate of Thm 4).
    """
    kwargs = {**SHUFFLED, "width": 1.0}
    scale = fixed_laplace_scale(n, 0.1, 1.0, SHUFFLED_C1, LAPLACE_C2, 0.5, 0.0)
    assert scale == pytest.approx(1 / (0.2 * math.log(n / SHUFFLED_C1 + LAPLACE_C2)), rel=1e-15)
    delta = shuffled_pnsgd_laplace_delta(n, EPSILON, scale, **kwargs)
    c = SHUFFLED_C1 * math.exp(EPSILON / 2)
    shift = n + SHUFFLED_C1 * LAPLACE_C2
    a = 1 - math.exp(EPSILON / 2) * SHUFFLED_C1**2 / shift**2
    closed = a * -math.expm1(n * math.log1p(-c / shift)) * shift / (c * n)
    assert delta == pytest.approx(closed, rel=1e-12)
    excess = n * (delta - laplace_delta_star(EPSILON, SHUFFLED_C1))
    assert excess == pytest.approx(
        LAPLACE_C2 * math.exp(-EPSILON / 2) - SHUFFLED_C1 / shift, rel=1e-6
    )


def test_app_g_gaussian_rate_is_one_over_log_n_with_explicit_constant() -> None:
    """Fig. 2 left/centre: δ(n) → δ*_G from above at rate 1/log n (Thm 5).

    Carrying Sordello et al. 2021, Eq. (11) one order further (Mills ratio Q(z) = φ(z)/z (1 − 1/z² + …) and
    e^{ε}φ(u + ε/2u) = φ(u − ε/2u) = φ(u) e^{ε/2} e^{−ε²/8u²} with u = √W):
    1 − B = (2e^{ε/2}/√(2πx)) (1 − (1 + ε²/8)/W + O(W⁻²)), hence
    (δ(n)/δ*_G − 1)·W(x_n) → 1 + ε²/8 = 1.125, with x_n = n²/(2πC1²) + C2.
    """
    star = gaussian_delta_star(EPSILON, SHUFFLED_C1)
    previous = math.inf
    for exponent in (9, 12, 15, 30, 60, 100):
        n = 10**exponent
        sigma = fixed_sigma(n, 0.1, 1.0, SHUFFLED_C1, GAUSSIAN_C2, 0.5, 0.0)
        delta = shuffled_pnsgd_delta(n, EPSILON, sigma, **SHUFFLED, diameter=1.0)
        w = 1.0 / (2 * 0.1 * sigma) ** 2  # σ = M D/(2η√W)
        assert star < delta < previous  # from above, monotonically
        assert abs((delta / star - 1) * w - (1 + EPSILON**2 / 8)) <= 2.5 / w
        previous = delta


def test_fig3_convergence_from_above_and_below() -> None:
    """Sordello et al. 2021, Fig. 3: with η = 0.01 the factor A = θ(4Lη√W) < 1 pulls δ(n) below δ*_G."""
    star = gaussian_delta_star(EPSILON, SHUFFLED_C1)
    for exponent in range(6, 16):
        n = 10**exponent
        deltas = {
            eta: shuffled_pnsgd_delta(
                n, EPSILON, fixed_sigma(n, eta, 1.0, SHUFFLED_C1, GAUSSIAN_C2, 0.5, 0.0),
                10.0, eta, 1.0, 0.5, 0.0,
            )
            for eta in (0.1, 0.01)
        }
        assert deltas[0.1] > star > deltas[0.01]


def test_thm5_sigma_is_not_a_finite_n_bound_but_calibration_is() -> None:
    """Thm 5's δ*_G is a limit: at n = 10⁶ its σ gives δ(n) = 3.34 δ*_G (App. G, η = 0.1)."""
    n = 10**6
    star = gaussian_delta_star(EPSILON, SHUFFLED_C1)
    sigma = fixed_sigma(n, 0.1, 1.0, SHUFFLED_C1, GAUSSIAN_C2, 0.5, 0.0)
    delta = shuffled_pnsgd_delta(n, EPSILON, sigma, **SHUFFLED, diameter=1.0)
    assert delta / star == pytest.approx(3.3437671157, rel=1e-8)
    calibrated = shuffled_pnsgd_sigma(n, EPSILON, star, **SHUFFLED, diameter=1.0)
    assert calibrated > sigma
    assert shuffled_pnsgd_delta(n, EPSILON, calibrated, **SHUFFLED, diameter=1.0) <= star


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 10**9),
    epsilon=st.floats(0.0, 5.0),
    sigma=st.floats(0.05, 50.0),
    factor=st.floats(1.001, 2.0),
    rho_fraction=st.floats(0.0, 1.0),
)
def test_shuffled_delta_decreases_in_noise(
    n: int, epsilon: float, sigma: float, factor: float, rho_fraction: float
) -> None:
    rounding = 1 + 1e-13  # δ is accurate to a few ulps; near δ = 1 (tiny σ) that is all it moves
    model = {**MODEL, "rho": 0.5 * rho_fraction}
    assert shuffled_pnsgd_delta(n, epsilon, sigma * factor, **model) <= rounding * (
        shuffled_pnsgd_delta(n, epsilon, sigma, **model)
    )
    laplace_model = {"L": 1.0, "eta": 0.1, "width": 1.0, "beta": 0.5, "rho": 0.5 * rho_fraction}
    assert shuffled_pnsgd_laplace_delta(n, epsilon, sigma * factor, **laplace_model) <= rounding * (
        shuffled_pnsgd_laplace_delta(n, epsilon, sigma, **laplace_model)
    )


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 10**7),
    epsilon=st.floats(0.05, 4.0),
    log10_delta=st.floats(-12.0, -1.0),
)
def test_calibrated_sigma_is_the_smallest_meeting_the_target(
    n: int, epsilon: float, log10_delta: float
) -> None:
    target = 10.0**log10_delta
    sigma = shuffled_pnsgd_sigma(n, epsilon, target, **MODEL)
    assert shuffled_pnsgd_delta(n, epsilon, sigma, **MODEL) <= target
    assert shuffled_pnsgd_delta(n, epsilon, sigma * (1 - 1e-7), **MODEL) > target


# ------------------------------------------------------------------------------------ Thms 6–7


def test_online_schedules_match_003() -> None:
    j = np.array([1, 100, 12_345, 10**6])
    sigmas = online_sigma(j, *ONLINE_SCHEDULE)
    scales = online_laplace_scale(j, *ONLINE_SCHEDULE)
    with mp.workdps(40):
        for k, step in enumerate(j):
            w = mp.lambertw(mp_lambert_argument(int(step), 2 * ONLINE_ALPHA, ONLINE_C1, ONLINE_C2))
            sigma = 1 / (2 * ONLINE_ETA * mp.sqrt(w.real))
            assert sigmas[k] == pytest.approx(float(sigma), rel=1e-13)
            log_argument = mp.log(mp.mpf(int(step)) ** ONLINE_ALPHA / ONLINE_C1 + ONLINE_C2)
            v = 1 / (2 * ONLINE_ETA * log_argument)
            assert scales[k] == pytest.approx(float(v), rel=1e-13)
    assert isinstance(online_sigma(5, *ONLINE_SCHEDULE), float)
    # Thm 5 is Thm 7's schedule with α = 1 evaluated at n (Sordello et al. 2021, Sec. 5: "the only difference").
    assert fixed_sigma(777, 0.1, 1.0, 3.0, 5.0, 0.5, 0.0) == pytest.approx(
        float(online_sigma(777, 1.0 + 1e-15, 0.1, 1.0, 3.0, 5.0, 0.5, 0.0)), rel=1e-12
    )


def mp_online_gaussian_limit(start: int) -> mp.mpf:
    """Sordello et al. 2021, Thm 7 for App. G's online setting, with the integral from ``start`` (mpmath quad)."""
    x_i = mp_lambert_argument(ONLINE_I, 2 * ONLINE_ALPHA, ONLINE_C1, ONLINE_C2)
    sigma_i = 1 / (2 * ONLINE_ETA * mp.sqrt(mp.lambertw(x_i).real))
    a = mp_theta(EPSILON, 2 * 10 / sigma_i)

    def log_b(x: mp.mpf) -> mp.mpf:
        w = mp.lambertw(mp_lambert_argument(x, 2 * ONLINE_ALPHA, ONLINE_C1, ONLINE_C2)).real
        return mp_log_theta_near_one(EPSILON, 2 * mp.sqrt(w))

    return a * mp.exp(mp.quad(log_b, [start, 1e3, 1e4, 1e6, 1e9, 1e14, 1e20, mp.inf]))


def test_app_g_online_gaussian_limit_matches_mpmath_and_brackets_the_true_limit() -> None:
    """Fig. 2 right: δ^{*,o}_G of Thm 7 for the record at i = 100."""
    limit = gaussian_online_delta_star(EPSILON, ONLINE_I, *ONLINE_LIMIT)
    assert isinstance(limit, OnlineLimit)
    with mp.workdps(20):
        upper, lower = mp_online_gaussian_limit(ONLINE_I + 1), mp_online_gaussian_limit(ONLINE_I)
    assert limit.delta_star == pytest.approx(float(upper), rel=1e-8)
    assert limit.lower_bound == pytest.approx(float(lower), rel=1e-8)
    assert limit.delta_star == pytest.approx(3.00803866e-23, rel=1e-8)
    assert limit.lower_bound == pytest.approx(2.71177618e-23, rel=1e-8)
    # The true limit A_i ∏_{t>i} B_t: the finite product to N, times the tail ∏_{t>N} B_t, which
    # lies between exp(∫_N^∞ log B) and exp(∫_{N+1}^∞ log B) (log B increasing; Sordello et al. 2021, App. E).
    n = 2 * 10**5
    model = {"L": 10.0, "eta": ONLINE_ETA, "diameter": 1.0, "beta": 0.5, "rho": 0.0}
    sigmas = online_sigma(np.arange(1, n + 1), *ONLINE_SCHEDULE)
    finite = pnsgd_delta(EPSILON, sigmas, ONLINE_I, **model)
    tail = gaussian_online_delta_star(EPSILON, n, *ONLINE_LIMIT)
    a_n = pnsgd_delta(EPSILON, sigmas, n, **model)
    true_low, true_high = finite * tail.lower_bound / a_n, finite * tail.delta_star / a_n
    assert limit.lower_bound <= true_low <= true_high <= limit.delta_star
    assert finite > limit.delta_star  # at finite n the record's δ is above the limit
    assert true_high / true_low - 1 < 1e-5


def test_app_g_online_laplace_limit_matches_mpmath_and_brackets_the_true_limit() -> None:
    """Fig. 1 right: δ^{*,o}_L of Thm 6 for the record at i = 100."""
    limit = laplace_online_delta_star(EPSILON, ONLINE_I, *ONLINE_LIMIT)
    c = ONLINE_C1 * math.exp(EPSILON / 2)
    with mp.workdps(30):
        log_b = lambda x: mp.log1p(-c / (x**ONLINE_ALPHA + ONLINE_C1 * ONLINE_C2))  # noqa: E731
        log_argument = mp.log(mp.mpf(ONLINE_I) ** ONLINE_ALPHA / ONLINE_C1 + ONLINE_C2)
        a = 1 - mp.e ** (EPSILON / 2 - 2 * 10 * ONLINE_ETA * log_argument)
        upper = a * mp.exp(mp.quad(log_b, [ONLINE_I + 1, 1e3, 1e5, 1e8, mp.inf]))
        lower = a * mp.exp(mp.quad(log_b, [ONLINE_I, 1e3, 1e5, 1e8, mp.inf]))
        assert limit.delta_star == pytest.approx(float(upper), rel=1e-9)
        assert limit.lower_bound == pytest.approx(float(lower), rel=1e-9)
        n = 10**6
        scales = online_laplace_scale(np.arange(1, n + 1), *ONLINE_SCHEDULE)
        finite = pnsgd_laplace_delta(EPSILON, scales, ONLINE_I, 10.0, ONLINE_ETA, 1.0, 0.5, 0.0)
        true_low = finite * mp.exp(mp.quad(log_b, [n, mp.inf]))
        true_high = finite * mp.exp(mp.quad(log_b, [n + 1, mp.inf]))
    assert limit.delta_star == pytest.approx(1.55875243e-08, rel=1e-8)
    assert limit.lower_bound <= float(true_low) <= float(true_high) <= limit.delta_star
    assert finite > limit.delta_star


def test_online_laplace_delta_approaches_its_limit_polynomially() -> None:
    """Rate of Fig. 1 right / Fig. 4 left, App. G online Laplace setting (record i = 100).

    log δ_i(n) − log δ_i(m) = −Σ_{t=n+1}^{m} log(1 − c/(t^α + C1C2)) with c = C1 e^{ε/2}, which is
    c ∫_n^m x^{−α} dx (1 + O(C1C2/n^α + 1/n)) = c (n^{1−α} − m^{1−α})/(α − 1): the finite-n δ
    approaches the true limit at rate n^{1−α} = n^{−1/2}. Sordello et al. 2021 (App. E, Fig. 4) reports the rate
    toward δ^{*,o} as "empirically 1/log n"; since δ^{*,o} is not the limit itself, that gap
    does not vanish, and the rate to the true limit is polynomial.
    """
    n, m = 10**5, 16 * 10**5
    scales = online_laplace_scale(np.arange(1, m + 1), *ONLINE_SCHEDULE)
    model = (10.0, ONLINE_ETA, 1.0, 0.5, 0.0)
    log_at_n = math.log(pnsgd_laplace_delta(EPSILON, scales[:n], ONLINE_I, *model))
    log_at_m = math.log(pnsgd_laplace_delta(EPSILON, scales, ONLINE_I, *model))
    c = ONLINE_C1 * math.exp(EPSILON / 2)
    predicted = c * (n ** (1 - ONLINE_ALPHA) - m ** (1 - ONLINE_ALPHA)) / (ONLINE_ALPHA - 1)
    assert log_at_n - log_at_m == pytest.approx(predicted, rel=1e-3)


@settings(max_examples=12, deadline=None)
@given(
    alpha=st.floats(1.2, 3.0),
    position=st.integers(1, 500),
    C1=st.floats(1.0, 200.0),
    C2=st.floats(1.0, 200.0),
    noise=st.sampled_from(["gaussian", "laplace"]),
)
def test_online_schedule_keeps_every_record_above_a_positive_limit(
    alpha: float, position: int, C1: float, C2: float, noise: str
) -> None:
    """α > 1 (Thms 6–7): δ_i(n) decreases in n toward a limit in (lower_bound, delta_star]."""
    n = position + 2000
    schedule = (alpha, 0.05, 1.0, C1, C2, 0.5, 0.0)
    if noise == "gaussian":
        scales = online_sigma(np.arange(1, n + 1), *schedule)
        limit = gaussian_online_delta_star(EPSILON, position, alpha, 1.0, *schedule[1:])
    else:
        scales = online_laplace_scale(np.arange(1, n + 1), *schedule)
        limit = laplace_online_delta_star(EPSILON, position, alpha, 1.0, *schedule[1:])
    # Logs throughout: with α near 1 and large C1 the limits underflow a double.
    log_deltas = record_log_deltas(
        EPSILON, scales, np.arange(position, n + 1), 1.0, 0.05, 1.0, 0.5, 0.0, noise
    )
    # Entry position − 1 is δ at s(i) = position; its analogue at larger n comes from one release.
    by_n = [
        record_log_deltas(EPSILON, scales[:m], [m], 1.0, 0.05, 1.0, 0.5, 0.0, noise)[position - 1]
        for m in (position, position + 10, position + 100, n)
    ]
    assert log_deltas[position - 1] == pytest.approx(by_n[0], rel=1e-12)
    assert all(later <= earlier for earlier, later in zip(by_n, by_n[1:]))
    assert limit.log_lower_bound <= limit.log_delta_star <= by_n[0]
    assert limit.log_lower_bound <= by_n[-1] * (1 - 1e-9)  # log δ ≤ 0: a relative slack
    assert limit.delta_star == math.exp(limit.log_delta_star)
    # Positive exactly when the record's own step leaks (A_i > 0; the Laplace A can be 0).
    assert (limit.log_lower_bound > -math.inf) == (by_n[0] > -math.inf)


# ------------------------------------------------------------------------------------ validation

VALID_MODEL = (10.0, 0.1, 1.0, 0.5, 0.0)  # L, eta, diameter, beta, rho
INVALID_CALLS = [
    (theta, (0.5, 1.0), "gamma"),
    (theta, (math.nan, 1.0), "gamma"),
    (theta, (math.e, -1.0), "r"),
    (contraction, (4.1, 0.5, 0.0), "eta"),
    (contraction, (0.1, 0.5, 0.6), "rho"),
    (contraction, (0.1, 0.0, 0.0), "beta"),
    (pnsgd_delta, (1.0, [1.0, 2.0], 3, *VALID_MODEL), "position"),
    (pnsgd_delta, (1.0, [1.0, 2.0], 0, *VALID_MODEL), "position"),
    (pnsgd_delta, (1.0, [1.0, 0.0], 1, *VALID_MODEL), "sigmas"),
    (pnsgd_delta, (-1.0, [1.0], 1, *VALID_MODEL), "epsilon"),
    (pnsgd_delta, (1.0, [1.0], 1, 0.0, 0.1, 1.0, 0.5, 0.0), "L"),
    (pnsgd_delta, (1.0, [1.0], 1, 10.0, 5.0, 1.0, 0.5, 0.0), "eta"),
    (pnsgd_laplace_delta, (1.0, [1.0], 1, 10.0, 0.1, -1.0, 0.5, 0.0), "width"),
    (record_log_deltas, (1.0, [1.0, 2.0], [2, 1], *VALID_MODEL), "releases"),
    (record_log_deltas, (1.0, [1.0, 2.0], [3], *VALID_MODEL), "releases"),
    (record_log_deltas, (1.0, [1.0, 2.0], [1.5], *VALID_MODEL), "releases"),
    (record_log_deltas, (1.0, [1.0, 2.0], [2], *VALID_MODEL, "cauchy"), "noise"),
    (worst_released_delta, (1.0, [], [1], *VALID_MODEL), "scales"),
    (shuffled_pnsgd_delta, (0, 1.0, 1.0, *VALID_MODEL), "n"),
    (shuffled_pnsgd_delta, (1.5, 1.0, 1.0, *VALID_MODEL), "n"),
    (shuffled_pnsgd_delta, (10, 1.0, -1.0, *VALID_MODEL), "sigma"),
    (shuffled_pnsgd_laplace_delta, (10, 1.0, math.inf, *VALID_MODEL), "scale"),
    (shuffled_pnsgd_sigma, (10, 1.0, 1.0, *VALID_MODEL), "delta"),
    (fixed_sigma, (100, 0.1, 1.0, 0.0, 1.0, 0.5, 0.0), "C1"),
    (fixed_sigma, (100, 0.1, 1.0, 1.0, -1.0, 0.5, 0.0), "C2"),
    (fixed_sigma, (100, 2.0, 1.0, 1.0, 1.0, 0.5, 0.5), "eta"),  # M = 0
    (fixed_laplace_scale, (1, 0.1, 1.0, 10.0, 0.5, 0.5, 0.0), "C2"),  # n/C1 + C2 ≤ 1
    (gaussian_delta_star, (1.0, -1.0), "C1"),
    (laplace_delta_star, (math.inf, 1.0), "epsilon"),
    (online_sigma, (0, 1.5, 0.1, 1.0, 1.0, 1.0, 0.5, 0.0), "j"),
    (online_sigma, (1.5, 1.5, 0.1, 1.0, 1.0, 1.0, 0.5, 0.0), "j"),
    (online_sigma, (10, 1.0, 0.1, 1.0, 1.0, 1.0, 0.5, 0.0), "alpha"),
    (online_laplace_scale, (1, 1.5, 0.1, 1.0, 100.0, 0.5, 0.5, 0.0), "C2"),
    (gaussian_online_delta_star, (1.0, 0, 1.5, *VALID_MODEL[:3], 1.0, 1.0, 0.5, 0.0), "position"),
    (laplace_online_delta_star, (1.0, 5, 1.5, *VALID_MODEL[:3], 1.0, 0.5, 0.5, 0.0), "C2"),
]


@pytest.mark.parametrize(("function", "args", "name"), INVALID_CALLS)
def test_invalid_parameters_are_named(function: object, args: tuple, name: str) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        function(*args)  # type: ignore[operator]
    error = caught.value
    assert error.name == name
    assert error.owner == function.__name__  # type: ignore[attr-defined]
    assert f"{name!r} parameter of {function.__name__}" in str(error)  # type: ignore[attr-defined]
    assert "Got" in str(error) and error.constraint in str(error)
