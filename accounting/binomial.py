"""Parameters and privacy of the binomial shuffle protocols P1D and PVEC (Cheu et al. 2022, §3 and App. A).

Three entry points:

* :func:`p1d_parameters` — (g, b, p) of the scalar-sum protocol P1D exactly as Cheu et al. 2022, Lemma 3.1
  chooses them, with its per-instance guarantee.
* :func:`pvec_parameters` — (g, b, p) of the vector-sum protocol PVEC exactly as the proof of Cheu et al. 2022,
  Thm 3.2 (App. A.2, Thm A.6) chooses them, and the robust variant (Claim A.8, Cor. A.9).
* :func:`tight_parameters` — (g, b, p) for the *same protocol* from a rigorous numerical accountant
  (:func:`tight_delta`) instead of the paper's loose constants: several orders of magnitude less
  noise variance (at n = 1000, d = 10, ε = 1, δ = 1e-6 the paper's variance is ≈ 1.9e5 times larger,
  and the tight one is within 18 % of a Gaussian mechanism with the same ℓ₂ sensitivity).

The protocol (Cheu et al. 2022, Alg. 1 and Alg. 2)
-------------------------------------
Each of n users holds x ∈ ℝᵈ with ‖x‖₂ ≤ Δ₂. Per coordinate j it shifts w = xⱼ + Δ₂ ∈ [0, Δ]
(Δ = 2Δ₂), scales s = w·g/Δ ∈ [0, g], rounds randomly to x̄ = ⌊s⌋ + Ber(s − ⌊s⌋), draws
η ~ Bin(b, p) and sends x̄ + η one-bits and g + b − x̄ − η zero-bits labelled j. The analyzer sees,
per coordinate, the shuffled bits; since n (hence the number of bits per label) is public, that
view is a function of — and determines — the totals Tⱼ = Σᵢ x̄ᵢⱼ + Nⱼ with Nⱼ ~ Bin(n·b, p)
independent over j. It outputs (Δ/g)(Tⱼ − n·b·p) − n·Δ₂.

The tight accountant: the argument, step by step
------------------------------------------------
Neighbouring batches differ in one user u (replacement): x = xᵤ, x′ = x′ᵤ, both of ℓ₂ norm ≤ Δ₂.
In the robust setting (Cheu et al. 2022, Def. A.7) only a fraction γ of users (at least M = ⌈γn⌉ of them) run
the randomizer; u is one of them. Write m = M·b, N ~ Bin(m, p)^{⊗d}, and δ(ε) for the
hockey-stick divergence H_{e^ε}(P‖Q) = sup_S P(S) − e^ε Q(S) between the analyzer's views under
the two batches; the mechanism is (ε, δ)-DP iff both H(P‖Q) and H(Q‖P) are ≤ δ.

1. **Sufficient statistic and more noise.** The view is a bijective function of the totals T (see
   above), so δ(ε) of the views equals δ(ε) of T. Noise of honest users beyond M, and messages of
   dishonest users, are independent of xᵤ: post-processing, they can only lower δ. So we analyse
   T = c + a + N versus T′ = c + a′ + N, where c is the other honest users' rounded values, a and a′
   are u's rounded vectors under x and x′, and N ~ Bin(m, p)^{⊗d}.
2. **Condition on the other users.** P = E_c[P_c], Q = E_c[Q_c] with the same law of c on both
   sides; H(E_c P_c‖E_c Q_c) ≤ E_c H(P_c‖Q_c) (the sup of a sum is at most the sum of the sups).
   So it suffices to bound H for every fixed c.
3. **Randomized rounding, by a coupling.** Let s, s′ ∈ [0, g]ᵈ be u's scaled vectors and
   t = s − s′, so ‖t‖₂ = (g/Δ)‖x − x′‖₂ ≤ g. Realise both roundings with the same uniforms
   Uⱼ ~ U[0, 1), independent over j: aⱼ = ⌊sⱼ + Uⱼ⌋, a′ⱼ = ⌊s′ⱼ + Uⱼ⌋. Each has the protocol's law
   (P(aⱼ = ⌊sⱼ⌋ + 1) = sⱼ − ⌊sⱼ⌋). The difference kⱼ = aⱼ − a′ⱼ = ⌊Vⱼ + tⱼ⌋ with
   Vⱼ = frac(s′ⱼ + Uⱼ) ~ U[0, 1), i.e. kⱼ = ⌊tⱼ⌋ + Ber(tⱼ − ⌊tⱼ⌋): k is the randomized rounding
   of t, independent over coordinates. P_c and Q_c are the same mixture over the coupling of
   Law(c + a + N) and Law(c + a′ + N); by joint convexity of H and translation invariance,
   H(P_c‖Q_c) ≤ E_k[H_k] with H_k = H(Law(N + k)‖Law(N)).
4. **Truncation** (the binomial has finite support, so its Rényi divergences are infinite). Let
   A = [L, U]ᵈ ⊂ [0, m]ᵈ be a central window. For any S,
   P(S) − e^ε Q(S) ≤ [P(S∩A) − e^ε Q(S∩A)] + P(Aᶜ), and P(N + k ∉ A) ≤ d·τ with
   τ = max_{|k| ≤ K} P(N₁ + k ∉ [L, U]) (union bound; K = largest reachable |kⱼ|). The window is
   chosen so that d·τ ≤ 10⁻³·δ; τ is computed from exact binomial tails.
5. **Rényi moments on the window.** On A, Q > 0. Pointwise, for ratio r = p/q and α > 1,
   (r − e^ε)₊ ≤ c(α, ε)·r^α with c(α, ε) = (1/α)(1 − 1/α)^{α−1} e^{−(α−1)ε} (the maximum of
   (r − e^ε)/r^α); this holds for sub-probability measures too. Hence
   H(Law(N + k)·1_A‖Law(N)) ≤ c(α, ε)·∏ⱼ S_α(kⱼ) with the one-dimensional *exact* moment
   S_α(k) = Σ_{x=L}^{U} P(N₁ = x − k)^α P(N₁ = x)^{1−α}, summed from binomial log-PMFs.
6. **Average over the rounding.** The kⱼ are independent, so
   E_k[∏ⱼ S_α(kⱼ)] = ∏ⱼ E[S_α(kⱼ)] = exp(Σⱼ φ_α(tⱼ)) with
   φ_α(t) = log((1 − f)·S_α(⌊t⌋) + f·S_α(⌊t⌋ + 1)), f = t − ⌊t⌋: the log of the piecewise-linear
   interpolation of S_α. (Small |t| costs ~|t|, not ~t²: rounding noise in many coordinates is
   what makes this differ from a Gaussian mechanism with sensitivity g.)
7. **Worst case over the change.** Maximise Σⱼ φ_α(tⱼ) over ‖t‖₂ ≤ r (r = g(1 + 10⁻⁹), the slack
   absorbing floating-point error in the encoder, so K = ⌈r⌉ = g + 1). Both directions of DP are
   covered because the ball is symmetric (swapping x and x′ maps t to −t) and S_α is computed for
   shifts of both signs. Weak Lagrangian duality gives, for every λ ≥ 0,
   Σⱼ φ_α(tⱼ) ≤ Σⱼ [φ_α(tⱼ) − λtⱼ²] + λr² ≤ d·max_{|t|≤r}[φ_α(t) − λt²] + λr² =: F(λ).
   On each unit piece [k, k + 1] the function φ_α(t) − λt² is concave (log of a positive affine
   function minus a concave quadratic); its stationary point solves a quadratic, and the tangent at
   the computed point bounds the piece's maximum from above whatever its rounding error. F is
   minimised over λ numerically (any λ gives a valid bound; λ = 0 is exact when d = 1). Call the
   result B(α).
8. **Conversion.** δ(ε) ≤ d·τ + min_α c(α, ε)·e^{B(α)}, minimised numerically over α > 1 (again
   any α is valid).

:func:`tight_parameters` then picks the resolution g (see its Notes), finds the least b with
p = 1/2 meeting the target by bisection, and, when b is small, lowers p at that b while the
target still holds. The returned δ is the accountant's bound evaluated at the returned
parameters, so the guarantee never rests on the search's monotonicity assumptions. The tests check the bound
against brute force: exact δ(ε) from the full PMFs of the d = 1 and d = 2 protocol for every
reachable shift and for fractional inputs (rounding mixtures).

References
----------
Cheu, Joseph, Mao & Peng (2022), Alg. 1, Alg. 2, Lemma 3.1 (= A.2), Lemma A.1, Thm 3.2 (= A.6),
Claim A.8, Cor. A.9. Rényi-to-(ε, δ) conversion: Liew & Takahashi 2022, Lemma 2 (Canonne, Kamath & Steinke 2020,
Prop. 12); its proof is the pointwise inequality of step 5.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import optimize, stats

from panpriv.accounting import calibration_cache
from panpriv.accounting.bisection import least_passing
from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.validation import in_range, open_unit, positive, positive_int

__all__ = [
    "P1DParameters",
    "PVECParameters",
    "p1d_parameters",
    "pvec_parameters",
    "tight_delta",
    "tight_parameters",
]

NORM_SLACK = 1e-9
"""Relative slack on ‖t‖₂ ≤ g in :func:`tight_delta` (floating-point error of the encoder)."""

_TAIL_SHARE = 1e-3  # share of δ spent on the window tails (step 4)
_G_MAX = 128  # largest resolution tight_parameters picks unless 2√d is larger (cost grows as g²)
_ROUNDING_EXCESS = 0.01  # g is chosen so rounding adds at most ~1 % to the variance
_REFINE_BELOW = 100  # p is lowered below 1/2 only when b is this small (see tight_parameters)
_ROWS_PER_BLOCK = 1 << 21  # elements per block in the moment sums (bounded memory)


# --------------------------------------------------------------------------------------------
# Cheu et al. 2022, Lemma 3.1 and Thm 3.2: the paper's parameters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class P1DParameters:
    """Parameters of P1D (Cheu et al. 2022, Alg. 1) and the guarantee of Cheu et al. 2022, Lemma 3.1.

    Attributes
    ----------
    n : int
        Number of users (all honest).
    bound : float
        Δ: inputs lie in [0, Δ].
    g, b : int
        Fixed-point resolution and number of noise trials per user.
    p : float
        Success probability of each noise trial, in (0, 1/2).
    epsilon, delta : float
        The (ε, δ) of Lemma 3.1: for neighbours differing in user u,
        D∞^δ ≤ ε·(2/g + |xᵤ − x′ᵤ|/Δ) (see :meth:`divergence_bound`).
    """

    n: int
    bound: float
    g: int
    b: int
    p: float
    epsilon: float
    delta: float

    def divergence_bound(self, distance: float) -> float:
        """ε·(2/g + distance/Δ): the per-instance bound of Cheu et al. 2022, Lemma 3.1 item 1."""
        return self.epsilon * (2.0 / self.g + distance / self.bound)

    @property
    def worst_case_epsilon(self) -> float:
        """ε·(1 + 2/g): the bound for the farthest neighbours (|xᵤ − x′ᵤ| = Δ)."""
        return self.divergence_bound(self.bound)

    @property
    def noise_variance(self) -> float:
        """(Δ/g)²·n·b·p(1 − p): variance of the estimate due to the binomial noise."""
        return (self.bound / self.g) ** 2 * self.n * self.b * self.p * (1.0 - self.p)

    @property
    def rounding_variance_bound(self) -> float:
        """(Δ/g)²·n/4: the largest variance randomized rounding can add (fractions all 1/2)."""
        return (self.bound / self.g) ** 2 * self.n / 4.0


@dataclass(frozen=True)
class PVECParameters:
    """Parameters of PVEC (Cheu et al. 2022, Alg. 2) and the (ε, δ)-shuffle-DP guarantee they carry.

    Attributes
    ----------
    n, d : int
        Users per batch and dimension.
    l2_bound : float
        Δ₂: every input has ℓ₂ norm ≤ Δ₂; P1D runs per coordinate with Δ = 2Δ₂.
    honest_fraction : float
        γ: the guarantee holds whenever at least ``noisy_users`` = ⌈γn⌉ users follow the protocol
        (Cheu et al. 2022, Def. A.7); 1.0 means all users.
    g, b : int
        Fixed-point resolution and noise trials per user and coordinate.
    p : float
        Success probability of each noise trial.
    epsilon, delta : float
        The guarantee: (ε, δ)-shuffle DP under replacement of one user. For ``calibration="tight"``
        δ is the accountant's bound at these parameters (≤ the requested δ).
    calibration : {"paper", "tight"}
        Which analysis produced (g, b, p).
    per_coordinate : P1DParameters or None
        For ``"paper"``: the P1D instance at (ε̂, δ̂) that each coordinate runs (Cheu et al. 2022, Thm A.6).
    """

    n: int
    d: int
    l2_bound: float
    honest_fraction: float
    g: int
    b: int
    p: float
    epsilon: float
    delta: float
    calibration: Literal["paper", "tight"]
    per_coordinate: P1DParameters | None = None

    @property
    def noisy_users(self) -> int:
        """M = ⌈γn⌉: the fewest users whose noise the guarantee relies on."""
        return _noisy_users(self.n, self.honest_fraction)

    @property
    def scale(self) -> float:
        """Δ/g = 2Δ₂/g: the value of one fixed-point unit."""
        return 2.0 * self.l2_bound / self.g

    @property
    def noise_variance(self) -> float:
        """(Δ/g)²·n·b·p(1 − p): per-coordinate variance of the estimate from the binomial noise
        when all n users add noise."""
        return self.scale**2 * self.n * self.b * self.p * (1.0 - self.p)

    @property
    def rounding_variance_bound(self) -> float:
        """(Δ/g)²·n/4: the most per-coordinate variance randomized rounding can add."""
        return self.scale**2 * self.n / 4.0

    @property
    def variance_bound(self) -> float:
        """Per-coordinate variance of the estimate, worst case over inputs."""
        return self.noise_variance + self.rounding_variance_bound


def _noisy_users(n: int, honest_fraction: float) -> int:
    # ⌈γn⌉, guarding against γn being an integer plus rounding error (e.g. 0.7 * 10).
    return max(1, math.ceil(honest_fraction * n - 1e-9))


def _lemma31_noise(n: int, g: int, epsilon: float, delta: float) -> tuple[int, float]:
    """(b, p) of Cheu et al. 2022, Lemma 3.1: the least integer b > 180 g² ln(2/δ)/(ε² n) and
    p = 90 g² ln(2/δ)/(b ε² n), which is then < 1/2."""
    threshold = 180.0 * g * g * math.log(2.0 / delta) / (epsilon * epsilon * n)
    b = math.floor(threshold) + 1
    p = 90.0 * g * g * math.log(2.0 / delta) / (b * epsilon * epsilon * n)
    return b, p


def p1d_parameters(n: int, epsilon: float, delta: float, bound: float) -> P1DParameters:
    """Parameters of P1D as chosen by Cheu et al. 2022, Lemma 3.1.

    Parameters
    ----------
    n : int
        Number of users, n ≥ 1.
    epsilon : float
        ε in (0, 15].
    delta : float
        δ in (0, 1/2).
    bound : float
        Δ > 0: inputs lie in [0, Δ].

    Returns
    -------
    P1DParameters
        g = ⌈max(Δ√n, ε/2.4)⌉ (the least integer with g ≥ Δ√n, see Notes for ε/2.4),
        b = the least integer above 180 g² ln(2/δ)/(ε² n), p = 90 g² ln(2/δ)/(b ε² n).

    Notes
    -----
    The condition g ≥ Δ√n mixes data units (Δ) with a count (g); Cheu et al. 2022 uses it only for the variance
    bound (rounding adds (Δ/g)²·n/4), never for privacy, so it is kept literally. The lemma's
    guarantee is per instance: D∞^δ ≤ ε·(2/g + |xᵤ − x′ᵤ|/Δ).

    Deviation: the proof of Lemma 3.1 (Lemma A.2) applies Lemma A.1 with α = ε/(3g) and bounds
    ln((1 + α)/(1 − α)) by 3α ("α small"), which fails for α ≳ 0.86 — reachable within the lemma's
    range (ε = 15 with g = 4, i.e. n ≤ 16 at Δ = 1). We additionally require g ≥ ε/2.4 (α ≤ 0.8,
    where ln 9 ≤ 2.4 holds); this only changes g when Δ√n < ε/2.4.

    References
    ----------
    Cheu et al. 2022, Alg. 1 and Lemma 3.1 (= Lemma A.2, proof via Lemma A.1).
    """
    owner = "p1d_parameters"
    n = positive_int(owner, "n", n)
    epsilon = in_range(owner, "epsilon", epsilon, 0.0, 15.0, closed_low=False, closed_high=True)
    delta = in_range(owner, "delta", delta, 0.0, 0.5, closed_low=False, closed_high=False)
    bound = positive(owner, "bound", bound)
    # Cheu et al. 2022, Lemma 3.1: g ≥ Δ√n. Its proof (Lemma A.2) also uses α = ε/(3g) with
    # ln((1 + α)/(1 − α)) ≤ 3α, false for α ≥ 0.87 (e.g. ε = 15, g = 4): we also require
    # α ≤ 0.8, i.e. g ≥ ε/2.4, where ln(9) = 2.197 ≤ 2.4 holds.
    g = max(1, math.ceil(bound * math.sqrt(n)), math.ceil(epsilon / 2.4))
    b, p = _lemma31_noise(n, g, epsilon, delta)
    return P1DParameters(n=n, bound=bound, g=g, b=b, p=p, epsilon=epsilon, delta=delta)


def pvec_parameters(
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    l2_bound: float,
    honest_fraction: float = 1.0,
) -> PVECParameters:
    """Parameters of PVEC as chosen in the proof of Cheu et al. 2022, Thm 3.2 (App. A.2), or Cor. A.9.

    Parameters
    ----------
    n, d : int
        Users per batch and dimension (≥ 1).
    epsilon : float
        Target ε: in (0, 15] when ``honest_fraction`` = 1 (Thm 3.2); with γ < 1, ε·γ must be
        ≤ 1 (Cor. A.9 is stated for a construction ε ≤ 1).
    delta : float
        Target δ: in (0, 1/2) (Thm 3.2), or (0, 1) when γ < 1 (Cor. A.9).
    l2_bound : float
        Δ₂ > 0: the ℓ₂ bound on every input vector.
    honest_fraction : float, default 1.0
        γ in [1/3, 1] (Claim A.8).

    Returns
    -------
    PVECParameters
        g = ⌈max(2Δ₂√n, √d, 4)⌉; γ′ = δ̂ = δ/(d + 1); ε̂ = ε_c/(18√log(1/γ′)) with the construction
        ε_c = ε·γ; (b, p) from Lemma 3.1 at (ε̂, δ̂) (least integer b above the threshold). The
        guarantee is (ε, δ)-shuffle DP whenever at least ⌈γn⌉ users are honest.

    Notes
    -----
    Robust variant: Cor. A.9 states that the parameters chosen for a construction ε_c ≤ 1 give
    (ε_c/γ, δ, γ)-robust shuffle privacy; we choose ε_c = ε·γ so the caller's ε is what holds.
    Its proof (Claim A.8) keeps b and p of Lemma 3.1 and only uses g ≥ 3 (here g ≥ 4).
    As in :func:`p1d_parameters`, g ≥ 2Δ₂√n is unit-dependent but only enters the variance
    (privacy uses g ≥ √d and g ≥ 4); it is kept literally. Alg. 1 asks for p ∈ (0, 1/2): the least
    b above the threshold gives p just below 1/2, the least variance Lemma 3.1 allows.

    References
    ----------
    Cheu et al. 2022, Alg. 2, Thm 3.2 (= Thm A.6), Lemma 3.1, Lemma 3.3; Claim A.8 and Cor. A.9 (robust).
    """
    owner = "pvec_parameters"
    n = positive_int(owner, "n", n)
    d = positive_int(owner, "d", d)
    l2_bound = positive(owner, "l2_bound", l2_bound)
    honest_fraction = in_range(
        owner, "honest_fraction", honest_fraction, 1.0 / 3.0, 1.0, closed_low=True, closed_high=True
    )
    if honest_fraction == 1.0:
        epsilon = in_range(owner, "epsilon", epsilon, 0.0, 15.0, closed_low=False, closed_high=True)
        delta = in_range(owner, "delta", delta, 0.0, 0.5, closed_low=False, closed_high=False)
    else:
        epsilon = positive(owner, "epsilon", epsilon)
        if epsilon * honest_fraction > 1.0:
            raise InvalidParameterError(
                owner,
                "epsilon",
                f"at most 1/honest_fraction = {1.0 / honest_fraction!r} (Cheu et al. 2022, Cor. A.9)",
                epsilon,
            )
        delta = open_unit(owner, "delta", delta)
    g = math.ceil(max(2.0 * l2_bound * math.sqrt(n), math.sqrt(d), 4.0))  # Cheu et al. 2022, Thm A.6
    delta_hat = delta / (d + 1)  # Cheu et al. 2022, Thm A.6: γ = δ̂ = δ/(d + 1)
    epsilon_hat = epsilon * honest_fraction / (18.0 * math.sqrt(math.log(1.0 / delta_hat)))
    b, p = _lemma31_noise(n, g, epsilon_hat, delta_hat)
    coordinate = P1DParameters(
        n=n, bound=2.0 * l2_bound, g=g, b=b, p=p, epsilon=epsilon_hat, delta=delta_hat
    )
    return PVECParameters(
        n=n,
        d=d,
        l2_bound=l2_bound,
        honest_fraction=honest_fraction,
        g=g,
        b=b,
        p=p,
        epsilon=epsilon,
        delta=delta,
        calibration="paper",
        per_coordinate=coordinate,
    )


# --------------------------------------------------------------------------------------------
# The tight accountant (module docstring, steps 1-8)
# --------------------------------------------------------------------------------------------


class _ShiftMoments:
    """Exact one-dimensional Rényi moments S_α(k), |k| ≤ K, of Bin(m, p) on a central window.

    Steps 4 and 5 of the module docstring: the window [L, U] is the narrowest central interval
    whose tail mass d·τ is at most ``tail_budget``; ``tail`` is that d·τ, computed exactly.
    """

    def __init__(self, m: int, p: float, shift: int, d: int, tail_budget: float) -> None:
        self.shift = shift
        mean = m * p
        # Hoeffding: P(|N − mp| ≥ h) ≤ 2 exp(−2h²/m); each side gets tail_budget/(2d).
        half = shift + math.ceil(math.sqrt(0.5 * m * math.log(4.0 * d / tail_budget)))
        self.low = max(0, math.floor(mean) - half)
        self.high = min(m, math.ceil(mean) + half)
        ks = np.arange(-shift, shift + 1)
        below = stats.binom.cdf(self.low - ks - 1, m, p)
        above = stats.binom.sf(self.high - ks, m, p)
        self.tail = float(d * np.max(below + above))
        xs = np.arange(self.low - shift, self.high + shift + 1)
        log_pmf = stats.binom.logpmf(xs, m, p)  # −inf outside [0, m]
        width = self.high - self.low + 1
        self._base = log_pmf[shift : shift + width]  # log P(N = x), x ∈ [L, U]
        # Row i holds log P(N = x − k) for k = shift − i.
        self._shifted = np.lib.stride_tricks.sliding_window_view(log_pmf, width)
        self.symmetric = p == 0.5

    def log_moments(self, alpha: float) -> NDArray[np.float64]:
        """log S_α(k) for k = −K, …, K (index k + K)."""
        rows = self._shifted.shape[0]
        # Bin(m, 1/2) on a window symmetric about m/2 has S_α(−k) = S_α(k) (x ↦ m − x).
        needed = self.shift + 1 if self.symmetric else rows
        block = max(1, _ROWS_PER_BLOCK // self._base.size)
        out = np.empty(rows)
        with np.errstate(invalid="ignore"):
            for start in range(0, needed, block):
                stop = min(needed, start + block)
                terms = self._shifted[start:stop] - self._base
                terms *= alpha
                terms += self._base
                top = terms.max(axis=1, keepdims=True)
                np.exp(terms - top, out=terms)
                out[start:stop] = top[:, 0] + np.log(terms.sum(axis=1))
        if self.symmetric:
            out[needed:] = out[self.shift - 1 :: -1]
        return out[::-1]


def _piece_max(
    log_s: NDArray[np.float64], radius: float, lam: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Upper bounds on max_{|t| ≤ radius} φ(t) − λt² for each λ in ``lam`` (step 7).

    φ is the log-linear interpolation of S (``log_s[k + K]`` = log S(k)). Exact up to the tangent
    correction, which is ~1e-16 at the computed stationary points.
    """
    shift = (log_s.size - 1) // 2
    k = np.arange(-shift, shift, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)[:, None]
    left = log_s[:-1]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ratio_m1 = np.expm1(log_s[1:] - left)  # D = S(k+1)/S(k) − 1
        f_lo = np.clip(-radius - k, 0.0, 1.0)
        f_hi = np.clip(radius - k, 0.0, 1.0)
        live = f_hi > f_lo

        def value(f: NDArray[np.float64]) -> NDArray[np.float64]:
            return left + np.log1p(f * ratio_m1) - lam * (k + f) ** 2

        def slope(f: NDArray[np.float64]) -> NDArray[np.float64]:
            return ratio_m1 / (1.0 + f * ratio_m1) - 2.0 * lam * (k + f)

        best = np.maximum(value(f_lo + 0.0 * lam), value(f_hi + 0.0 * lam))
        # Stationary points: 2λD f² + 2λ(1 + kD) f + (2λk − D) = 0.
        qa = 2.0 * lam * ratio_m1
        qb = 2.0 * lam * (1.0 + k * ratio_m1)
        qc = 2.0 * lam * k - ratio_m1
        root = np.sqrt(np.maximum(qb * qb - 4.0 * qa * qc, 0.0))
        linear = np.abs(qa) < 1e-300
        for sign in (1.0, -1.0):
            candidate = np.where(linear, -qc / qb, (-qb + sign * root) / (2.0 * qa))
            f = np.clip(np.nan_to_num(candidate, nan=0.0, posinf=1.0, neginf=0.0), f_lo, f_hi)
            tangent = value(f) + np.abs(slope(f)) * np.maximum(f - f_lo, f_hi - f)
            best = np.maximum(best, np.nan_to_num(tangent, nan=-np.inf))
    result = np.max(best[:, live], axis=1)
    return np.where(np.isfinite(result), result, np.inf)


_LOG_LAMBDA_GRID = np.linspace(-40.0, 25.0, 66)


def _ball_bound(log_s: NDArray[np.float64], radius: float, d: int) -> float:
    """B: an upper bound on max_{‖t‖₂ ≤ radius} Σⱼ φ(tⱼ) by weak duality (step 7).

    F(λ) = d·max_t[φ(t) − λt²] + λr² is convex in λ; it is evaluated at λ = 0, on a grid of
    log λ with unit spacing, then minimised by Brent's method around the best grid point. Every
    λ gives a valid bound, so the search only affects tightness.
    """

    def dual(log_lam: NDArray[np.float64]) -> NDArray[np.float64]:
        lam = np.exp(log_lam)
        return d * _piece_max(log_s, radius, lam) + lam * radius * radius

    at_zero = float(d * _piece_max(log_s, radius, np.zeros(1))[0])
    coarse = dual(_LOG_LAMBDA_GRID)
    centre = float(_LOG_LAMBDA_GRID[int(np.argmin(coarse))])
    found = optimize.minimize_scalar(
        lambda u: min(float(dual(np.array([u]))[0]), 1e300),
        bounds=(centre - 1.0, centre + 1.0),
        method="bounded",
        options={"xatol": 1e-7},
    )
    return min(at_zero, float(np.min(coarse)), float(found.fun))


def _log_conversion(alpha: float, epsilon: float) -> float:
    """log c(α, ε) = −log α + (α − 1) log(1 − 1/α) − (α − 1)ε (step 5; Liew & Takahashi 2022, Lemma 2)."""
    return -math.log(alpha) + (alpha - 1.0) * math.log1p(-1.0 / alpha) - (alpha - 1.0) * epsilon


def _tight_delta(
    epsilon: float,
    g: int,
    m: int,
    p: float,
    d: int,
    tail_budget: float,
    order_hint: float | None = None,
) -> tuple[float, float]:
    """(δ bound, log(α − 1) achieving it). With ``order_hint`` the search over orders is confined
    to a bracket around it (a search aid only: every order gives a valid bound)."""
    moments, log_delta = _log_delta_function(epsilon, g, m, p, d, tail_budget)

    if order_hint is None:  # coarse scan of log(α − 1), then refine around the best
        scan = np.arange(math.log(1e-2), math.log(3e3), 1.0)
        order_hint = float(scan[int(np.argmin([log_delta(u) for u in scan]))])
    found = optimize.minimize_scalar(
        log_delta,
        bounds=(order_hint - 1.0, order_hint + 1.0),
        method="bounded",
        options={"xatol": 1e-2},
    )
    return moments.tail + math.exp(min(float(found.fun), 0.0)), float(found.x)


def _log_delta_function(
    epsilon: float, g: int, m: int, p: float, d: int, tail_budget: float
) -> tuple[_ShiftMoments, Callable[[float], float]]:
    """The window's moments and log of the bound's main term as a function of log(α − 1): the
    δ bound at an order is ``moments.tail + exp(min(log_delta(order), 0))``."""
    radius = g * (1.0 + NORM_SLACK)
    moments = _ShiftMoments(m, p, math.ceil(radius), d, tail_budget)

    def log_delta(log_order_m1: float) -> float:
        alpha = 1.0 + math.exp(log_order_m1)
        bound = _ball_bound(moments.log_moments(alpha), radius, d)
        return min(_log_conversion(alpha, epsilon) + bound, 1e300)

    return moments, log_delta


def _delta_at_order(
    epsilon: float, g: int, m: int, p: float, d: int, tail_budget: float, log_order_m1: float
) -> float:
    """The δ bound at one Rényi order α = 1 + exp(``log_order_m1``) (every order gives a valid bound)."""
    moments, log_delta = _log_delta_function(epsilon, g, m, p, d, tail_budget)
    return moments.tail + math.exp(min(log_delta(log_order_m1), 0.0))


def tight_delta(
    epsilon: float,
    g: int,
    b: int,
    p: float,
    d: int,
    noisy_users: int,
    *,
    tail_budget: float = 1e-12,
) -> float:
    """Rigorous upper bound on δ(ε) of PVEC with parameters (g, b, p) in dimension d.

    Parameters
    ----------
    epsilon : float
        ε > 0.
    g, b : int
        Resolution and noise trials per user (≥ 1).
    p : float
        Trial success probability in (0, 1).
    d : int
        Dimension ≥ 1.
    noisy_users : int
        M ≥ 1: the number of users whose noise is counted (⌈γn⌉; n when all are honest).
    tail_budget : float, default 1e-12
        Most that the truncation window's tails (step 4) may add to δ, in (0, 1).

    Returns
    -------
    float
        δ such that the analyzer's view is (ε, δ)-DP under replacement of one user whose input
        has ℓ₂ norm ≤ Δ₂ (any Δ₂: the bound is scale-free). At most 1.

    Notes
    -----
    Steps 1–8 of the module docstring, with N ~ Bin(M·b, p) per coordinate and the window chosen
    so that its tails add at most ``tail_budget`` (the value added is the exact d·τ of step 4).
    Cost grows like g·σ·(number of orders tried), σ² = M·b·p(1 − p).

    References
    ----------
    Cheu et al. 2022, Alg. 1, Alg. 2 (the protocol), Def. A.7 (robust); Liew & Takahashi 2022, Lemma 2 (conversion).
    """
    owner = "tight_delta"
    epsilon = positive(owner, "epsilon", epsilon)
    g = positive_int(owner, "g", g)
    b = positive_int(owner, "b", b)
    p = open_unit(owner, "p", p)
    d = positive_int(owner, "d", d)
    noisy_users = positive_int(owner, "noisy_users", noisy_users)
    tail_budget = open_unit(owner, "tail_budget", tail_budget)
    return min(1.0, _tight_delta(epsilon, g, noisy_users * b, p, d, tail_budget)[0])


@functools.lru_cache(maxsize=64)
def tight_parameters(
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    l2_bound: float,
    honest_fraction: float = 1.0,
) -> PVECParameters:
    """PVEC parameters (g, b, p) calibrated by the tight accountant (:func:`tight_delta`).

    Parameters
    ----------
    n, d : int
        Users per batch and dimension (≥ 1).
    epsilon : float
        Target ε > 0.
    delta : float
        Target δ in (0, 1).
    l2_bound : float
        Δ₂ > 0 (only scales the estimate: the choice of (g, b, p) is scale-free).
    honest_fraction : float, default 1.0
        γ in (0, 1]: the guarantee holds whenever at least ⌈γn⌉ users add their noise.

    Returns
    -------
    PVECParameters
        ``calibration="tight"``, ``delta`` = the accountant's bound at the returned parameters
        (≤ the target).

    Notes
    -----
    * **Resolution g.** The per-coordinate variance is (Δ/g)²(n·b·p(1 − p) + Σᵢ fᵢ(1 − fᵢ)) with
      rounding fractions fᵢ. The noise needed scales like σ ≈ c·√(g² + d) (c the Gaussian
      σ per unit sensitivity at (ε, δ); the d term is rounding in every coordinate, step 6), and
      rounding adds at most n/4, so the variance is ≈ Δ²(c² + (c²d + n/4)/g²): it falls with g
      towards Δ²c². We take the least g making the second term ≤ 1 % of the first,
      g = ⌈10·√(d + n/(4c²))⌉, at least 4 and at most max(128, ⌈2√d⌉) (the accountant's cost
      grows like g²; at the cap the excess is about (c²d + n/4)/(c²g²), e.g. ≤ 25 % + n/(4c²g²)
      when the cap is 2√d). c comes from the
      analytic Gaussian (:func:`panpriv.accounting.gaussian.analytic_sigma`) and only steers this choice.
    * **b and p.** p = 1/2 (Cheu et al.'s Alg. 1 asks p < 1/2, which only its Lemma 3.1 proof needs): the
      least b meeting δ, by integer bisection. Lowering p at that b could save at most a fraction
      1/b of the noise variance (b − 1 trials at p = 1/2 fail), so it is done only when b < 100
      (bisection on p(1 − p), 8 accountant evaluations); otherwise p = 1/2 is kept (the saving
      would be under 1 %). The encoder draws Bin(b, p) exactly for any p
      (:mod:`panpriv.protocols.binomial_sampler`), so the choice costs it nothing.
    * Results are cached (pure function of its arguments), in the process and in a file
      (:mod:`panpriv.accounting.calibration_cache`); a file entry is used only after its δ bound is
      recomputed at the stored parameters and order and found ≤ ``delta``.

    References
    ----------
    Cheu et al. 2022, Alg. 1, Alg. 2, Thm 3.2 (the protocol and the paper's calibration it replaces),
    Def. A.7 / Claim A.8 (robust variant).
    """
    owner = "tight_parameters"
    n = positive_int(owner, "n", n)
    d = positive_int(owner, "d", d)
    epsilon = positive(owner, "epsilon", epsilon)
    delta = open_unit(owner, "delta", delta)
    l2_bound = positive(owner, "l2_bound", l2_bound)
    honest_fraction = in_range(
        owner, "honest_fraction", honest_fraction, 0.0, 1.0, closed_low=False, closed_high=True
    )
    noisy = _noisy_users(n, honest_fraction)
    unit_sigma = analytic_sigma(epsilon, delta)
    g = math.ceil(math.sqrt((d + n / (4.0 * unit_sigma**2)) / _ROUNDING_EXCESS))
    g = min(max(_G_MAX, math.ceil(2.0 * math.sqrt(d))), max(4, g))
    tail_budget = _TAIL_SHARE * delta
    key = json.dumps(["v1", n, d, repr(epsilon), repr(delta), repr(honest_fraction), g, _TAIL_SHARE])
    cached = _cached_calibration(key, epsilon, delta, g, noisy, d, tail_budget)
    if cached is not None:
        b, p, achieved = cached
        return PVECParameters(
            n=n, d=d, l2_bound=l2_bound, honest_fraction=honest_fraction, g=g, b=b, p=p,
            epsilon=epsilon, delta=achieved, calibration="tight",
        )

    hint: list[float] = []  # best log(α − 1) so far: narrows later order searches
    bounds: dict[tuple[int, float], tuple[float, float]] = {}  # (b, p) → (δ bound, its order)

    def passes(b: int, p: float = 0.5) -> bool:
        bound, order = _tight_delta(
            epsilon, g, noisy * b, p, d, tail_budget, hint[-1] if hint else None
        )
        hint.append(order)
        bounds[(b, p)] = bound, order
        return bound <= delta

    # Bracket the least b, starting from the Gaussian estimate (+25 % for the conversion's slack).
    high = max(1, math.ceil(1.25 * 4.0 * unit_sigma**2 * (g * g + d) / noisy))
    low = 0  # 0 stands for "fails"
    while not passes(high):
        low, high = high, math.ceil(1.25 * high)
    if low == 0:
        low = math.floor(high / 1.25)
        while low >= 1 and passes(low):
            high, low = low, math.floor(low / 1.25)
    b = least_passing(low, high, passes)

    p = 0.5
    if b < _REFINE_BELOW:
        # Lower p at this b: bisection on the per-trial variance v = p(1 − p) in (v_low, 1/4],
        # v_low being the variance of b − 1 trials at p = 1/2 (which failed).
        v_low, v_high = (b - 1) / (4.0 * b), 0.25
        for _ in range(8):
            v_mid = 0.5 * (v_low + v_high)
            if passes(b, _p_of_variance(v_mid)):
                v_high = v_mid
            else:
                v_low = v_mid
        if v_high < 0.25:
            p = _p_of_variance(v_high)
    achieved, order = bounds[(b, p)]  # the search only moves to points that passed
    calibration_cache.store_entry(key, {"b": b, "p": p, "log_order_m1": order})
    return PVECParameters(
        n=n,
        d=d,
        l2_bound=l2_bound,
        honest_fraction=honest_fraction,
        g=g,
        b=b,
        p=p,
        epsilon=epsilon,
        delta=achieved,
        calibration="tight",
    )


def _cached_calibration(
    key: str, epsilon: float, delta: float, g: int, noisy: int, d: int, tail_budget: float
) -> tuple[int, float, float] | None:
    """(b, p, δ bound) from the file cache, verified: the bound is recomputed at the stored order
    and the entry is used only if it meets ``delta`` (so the file can cost a search, never privacy)."""
    entry = calibration_cache.load_entry(key)
    if entry is None:
        return None
    b, p, order = entry.get("b"), entry.get("p"), entry.get("log_order_m1")
    if not (
        isinstance(b, int) and b >= 1
        and isinstance(p, float) and 0.0 < p <= 0.5
        and isinstance(order, float) and math.isfinite(order)
    ):
        return None
    achieved = _delta_at_order(epsilon, g, noisy * b, p, d, tail_budget, order)
    return (b, p, achieved) if achieved <= delta else None


def _p_of_variance(variance: float) -> float:
    """The p ≤ 1/2 with p(1 − p) = variance (≤ 1/4)."""
    return 0.5 * (1.0 - math.sqrt(max(0.0, 1.0 - 4.0 * variance)))
