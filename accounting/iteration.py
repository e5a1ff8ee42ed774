"""Privacy amplification by iteration for projected noisy SGD (PNSGD), after Sordello et al. 2021.

PNSGD runs w_{t+1} = Π_K(w_t − η(∇ℓ(w_t, x_{t+1}) + Z_{t+1})) over a convex set K of diameter D
(for Laplace noise: K = [a, b], D = b − a), with ℓ(·, x) L-Lipschitz, ρ-strongly convex and
β-smooth, and only the final iterate released. A record seen at step i is hidden first by its own
noisy step (factor A_i) and then by every later step t, whose kernel contracts the hockey-stick
divergence E_{e^ε} by at most B_t (Sordello et al. 2021, Thm 1, from Asoodeh et al. 2020, Thms 3–4):

* Gaussian noise N(0, σ_t² I):  A_i = θ_{e^ε}(2L/σ_i),  B_t = θ_{e^ε}(M D/(η σ_t));
* Laplace noise  L(0, v_t) (d = 1):  A_i = θ^L_ε(2L/v_i),  B_t = θ^L_ε(M D/(η v_t)),

where θ_γ(r) = Q(log γ/r − r/2) − γ Q(log γ/r + r/2) is the exact δ(ε) of a Gaussian shift by r
standard deviations, θ^L_ε(r) = (1 − e^{(ε − r)/2})_+ is the exact δ(ε) of a Laplace shift by r
scales, and M is :func:`contraction`. The record is then (ε, A_i ∏_{t=i+1}^{s} B_t)-DP, where s
is the step whose iterate is released (Sordello et al. 2021, Sec. 5).

Everything else in this module follows from that product:

* shuffled PNSGD with a fixed noise level averages it over the n positions (Sordello et al. 2021, Thm 2);
* the fixed noise levels of Sordello et al. 2021, Thms 4–5 make δ(n) converge to δ*_L, δ*_G;
* the decaying noise levels of Sordello et al. 2021, Thms 6–7 make δ for the record at position i converge, as the
  stream grows, to the limits δ^{*,o} (numerical integrals, with the lower bound of Sordello et al. 2021, App. E);
* :func:`record_log_deltas` / :func:`worst_released_delta` evaluate the product for every record
  of a stream whose iterates are released at given steps (snapshots), in O(n);
* :func:`shuffled_pnsgd_sigma` calibrates σ to a target δ at the actual n (Thm 5's σ(n) only
  reaches δ*_G in the limit).

Deviations from Sordello et al. 2021, each explained where it is implemented: M is only valid for η ≤ 2/(β + ρ)
(:func:`contraction`); δ*_L, δ*_G and δ^{*,o} are limits, not finite-n bounds, and δ^{*,o} is a
per-position limit (:func:`fixed_sigma`, :func:`gaussian_online_delta_star`).

Numerics: θ and 1 − θ are both evaluated in log space (1 − θ without cancellation), so products of
10⁶ factors B_t = 1 − O(t^{−α}) and δ values far below 1e-300 in log form stay accurate.

References
----------
Sordello, Bu, Dong & Su (2021), "Privacy amplification via iteration for shuffled and online PNSGD"
(docs/references.md), Thms 1, 2, 4–7, Lemma 8, App. B–F.
Asoodeh, Diaz, Calmon (2020), "Privacy amplification of iterative algorithms via contraction
coefficients", Thms 3–4 (cited by Sordello et al. 2021 as the source of Thm 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import erfcx, lambertw, log_ndtr

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.validation import float_array, nonnegative, positive, positive_int

__all__ = [
    "Noise",
    "OnlineLimit",
    "WorstRecord",
    "contraction",
    "fixed_laplace_scale",
    "fixed_sigma",
    "gaussian_delta_star",
    "gaussian_online_delta_star",
    "laplace_delta_star",
    "laplace_online_delta_star",
    "online_laplace_scale",
    "online_sigma",
    "pnsgd_delta",
    "pnsgd_laplace_delta",
    "record_log_deltas",
    "shuffled_pnsgd_delta",
    "shuffled_pnsgd_laplace_delta",
    "shuffled_pnsgd_sigma",
    "theta",
    "worst_released_delta",
]

Noise = Literal["gaussian", "laplace"]

_SQRT2 = math.sqrt(2.0)
_LOG_HALF = math.log(0.5)
_TINY = 5e-324  # smallest positive double


# ---------------------------------------------------------------------------------------------
# Result types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorstRecord:
    """The least protected released record of a stream.

    Attributes
    ----------
    delta : float
        max_i δ_i over every record whose influence has been released (0 when none has).
    position : int
        1-based stream position i of a record attaining ``delta`` (0 when none has been released).
    """

    delta: float
    position: int


@dataclass(frozen=True)
class OnlineLimit:
    """Limit n → ∞ of δ for the record at one position under the online schedules (Sordello et al. 2021, Thms 6–7).

    Attributes
    ----------
    delta_star : float
        δ^{*,o} exactly as Sordello et al. 2021 states it: A_i · exp(∫_{i+1}^∞ log B(x) dx). Because log B(x) is
        increasing in x this is an upper bound on the true limit A_i ∏_{t>i} B_t.
    lower_bound : float
        A_i · exp(∫_i^∞ log B(x) dx), the lower bound on the true limit of Sordello et al. 2021, App. E. The true
        limit lies in [lower_bound, delta_star].
    log_delta_star, log_lower_bound : float
        Their natural logarithms (−inf for 0), meaningful also where the values underflow.
    """

    delta_star: float
    lower_bound: float
    log_delta_star: float
    log_lower_bound: float


# ---------------------------------------------------------------------------------------------
# θ functions: log θ and log(1 − θ), vectorised
# ---------------------------------------------------------------------------------------------


def _gaussian_log_theta(
    epsilon: float, r: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(log θ_{e^ε}(r), log(1 − θ_{e^ε}(r))) elementwise, for ε ≥ 0 and r ∈ [0, inf].

    With a = r/2 − ε/r and b = a − r, θ = Φ(a) − e^ε Φ(b) and 1 − θ = Φ(−a) + e^ε Φ(b): the
    complement is a sum of two positive terms, so it is computed without cancellation by a
    log-sum-exp. For log θ:

    * when 1 − θ ≤ 1/2, log θ = log1p(−(1 − θ)) (accurate as θ → 1, the regime of B_t);
    * else, for a ≤ 0 (small θ), the identity e^ε φ(b) = φ(a) (because b² − a² = 2ε) and
      Φ(x) = ½ e^{−x²/2} erfcx(−x/√2) give θ = ½ e^{−a²/2} [erfcx(−a/√2) − erfcx(−b/√2)], a
      difference of two O(1) numbers instead of two tiny ones;
    * else (a > 0, θ ∈ (0, 1/2)) log θ = log Φ(a) + log(1 − e^{ε + log Φ(b) − log Φ(a)}).

    r = 0 gives θ = 0 and r = inf gives θ = 1.
    """
    r = np.asarray(r, dtype=np.float64)
    log_theta = np.full(r.shape, -np.inf)
    log_comp = np.zeros(r.shape)
    inner = (r > 0.0) & np.isfinite(r)
    log_theta[np.isinf(r)] = 0.0
    log_comp[np.isinf(r)] = -np.inf
    ri = r[inner]
    a = ri / 2.0 - epsilon / ri
    b = a - ri
    comp = np.logaddexp(log_ndtr(-a), epsilon + log_ndtr(b))
    lt = np.empty_like(ri)
    near_one = comp <= _LOG_HALF
    lt[near_one] = np.log1p(-np.exp(comp[near_one]))
    left = ~near_one & (a <= 0.0)
    with np.errstate(divide="ignore"):
        gap = erfcx(-a[left] / _SQRT2) - erfcx(-b[left] / _SQRT2)
        lt[left] = -0.5 * a[left] ** 2 + np.log(0.5) + np.log(np.maximum(gap, 0.0))
        right = ~near_one & (a > 0.0)
        la = log_ndtr(a[right])
        lb = epsilon + log_ndtr(b[right])
        lt[right] = la + np.log(-np.expm1(np.minimum(lb - la, 0.0)))
    log_theta[inner] = lt
    log_comp[inner] = comp
    return log_theta, log_comp


def _laplace_log_theta(
    epsilon: float, r: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(log θ^L, log(1 − θ^L)) elementwise for θ^L_ε(r) = (1 − e^{(ε − r)/2})_+, r ∈ [0, inf].

    θ^L_ε(r) is the exact hockey-stick divergence E_{e^ε}(Lap(r, 1) ‖ Lap(0, 1)): the privacy loss
    is (|x| − |x − r|) ∈ [−r, r], it exceeds ε on x > (r + ε)/2, and integrating the two Laplace
    densities there gives 1 − ½e^{(ε−r)/2} − ½e^{ε}e^{−(r+ε)/2} = 1 − e^{(ε−r)/2} (for ε < r; 0
    otherwise). This is A and B of Sordello et al. 2021, Eq. (4) with r = 2L/v and r = M(b − a)/(η v).
    """
    r = np.asarray(r, dtype=np.float64)
    log_comp = np.minimum((epsilon - r) / 2.0, 0.0)
    with np.errstate(divide="ignore"):
        log_theta = np.where(
            log_comp <= _LOG_HALF, np.log1p(-np.exp(log_comp)), np.log(-np.expm1(log_comp))
        )
    return log_theta, log_comp


_LOG_THETA = {"gaussian": _gaussian_log_theta, "laplace": _laplace_log_theta}


def theta(gamma: float, r: float) -> float:
    """θ_γ(r) of Sordello et al. 2021, Thm 1: the exact δ at ε = log γ of a Gaussian shifted by r std deviations.

    Parameters
    ----------
    gamma : float
        γ = e^ε ≥ 1.
    r : float
        Shift in units of the noise standard deviation, r ≥ 0 (r = Δ/σ); ``inf`` is allowed.

    Returns
    -------
    float
        θ_γ(r) = Q(log γ/r − r/2) − γ Q(log γ/r + r/2) ∈ [0, 1], with Q = 1 − Φ.

    Notes
    -----
    θ_{e^ε}(Δ/σ) equals :func:`panpriv.accounting.gaussian.analytic_delta` (ε, σ, Δ) (Balle & Wang 2018,
    Thm 8); the tests check that the two implementations agree. This one is vectorised internally
    (``_gaussian_log_theta``) because the online accountant evaluates it once per record.

    References
    ----------
    Sordello et al. 2021, Thm 1 (definition of θ_γ; Asoodeh et al. 2020, Thm 3).
    """
    owner = "theta"
    gamma = _finite_at_least(owner, "gamma", gamma, 1.0)
    r_value = _nonnegative_or_inf(owner, "r", r)
    log_theta, _ = _gaussian_log_theta(math.log(gamma), np.array([r_value]))
    return float(np.exp(log_theta[0]))


# ---------------------------------------------------------------------------------------------
# Contraction of one gradient step
# ---------------------------------------------------------------------------------------------


BOUND_TOLERANCE = 1e-12
"""Relative slack of the η ≤ 2/β check: β = R_z²/4 is computed with rounding (R_z² = 1 + 1 comes
out as 2.0000000000000004), so 2/β for an exact 4 reads 3.999999999999999. An η within a few
ulps above the computed bound is the bound itself; :func:`contraction` then returns the M of the
η given (ηβ − 1, a hair above 1), which is what the accounting uses: still an upper bound."""


def contraction(eta: float, beta: float, rho: float) -> float:
    """Lipschitz constant M of the gradient step w ↦ w − η∇ℓ(w) (Sordello et al. 2021, Thm 1).

    Parameters
    ----------
    eta : float
        Learning rate η in (0, 2/β].
    beta : float
        Smoothness β > 0 (∇ℓ is β-Lipschitz).
    rho : float
        Strong convexity ρ ∈ [0, β].

    Returns
    -------
    float
        M = (1 − 2ηβρ/(β + ρ))^{1/2} for η ≤ 2/(β + ρ) (Sordello et al. 2021, Thm 1), and M = ηβ − 1 for
        2/(β + ρ) < η ≤ 2/β. M = 1 when ρ = 0.

    Raises
    ------
    InvalidParameterError
        If η > 2/β (the step can expand distances) or ρ ∉ [0, β].

    Notes
    -----
    Sordello et al. 2021 states M = (1 − 2ηβρ/(β + ρ))^{1/2} without a condition on η. That formula is only valid
    for η ≤ 2/(β + ρ), which coincides with the η ≤ 2/β of Feldman et al. (2018, Prop. 18) only
    when ρ = 0. Derivation (ρ < β; for ρ = β, ∇g below is constant and the step is
    w ↦ (1 − ηβ)w + const): g = ℓ − (ρ/2)‖w‖² is convex and (β − ρ)-smooth, so
    T = I − (2/(β − ρ))∇g is non-expansive (Baillon–Haddad), and the step is

        w − η∇ℓ(w) = (1 − η(β + ρ)/2) w + (η(β − ρ)/2) T(w),

    whose Lipschitz constant is at most |1 − η(β + ρ)/2| + η(β − ρ)/2 = max(1 − ηρ, ηβ − 1).
    For η ≤ 2/(β + ρ) this is 1 − ηρ ≤ (1 − 2ηβρ/(β + ρ))^{1/2} (the squares differ by
    ηρ²(η − 2/(β + ρ)) ≤ 0), so Sordello et al.'s M is valid there. For η > 2/(β + ρ) it is ηβ − 1, and
    Sordello et al.'s M is then too small: for ℓ(w) = (β/2)w² (ρ may be any value ≤ β) the step is
    w ↦ (1 − ηβ)w, e.g. β = 1, ρ = 0.2, η = 1.9 gives a factor 0.9 but Sordello et al.'s M = 0.606; with
    ρ = β the radicand is even negative. We therefore return ηβ − 1 on (2/(β + ρ), 2/β]; the two
    branches agree at η = 2/(β + ρ), where both equal (β − ρ)/(β + ρ).

    References
    ----------
    Sordello et al. 2021, Thm 1 (M). Asoodeh et al. (2020), Thm 3. Feldman, Mironov, Talwar, Thakurta (2018),
    Prop. 18 (contractivity of gradient steps for η ≤ 2/β).
    """
    owner = "contraction"
    eta = positive(owner, "eta", eta)
    beta = positive(owner, "beta", beta)
    rho = nonnegative(owner, "rho", rho)
    if rho > beta:
        raise InvalidParameterError(owner, "rho", f"a float in [0, beta] = [0, {beta}]", rho)
    if eta > 2.0 / beta * (1.0 + BOUND_TOLERANCE):
        raise InvalidParameterError(
            owner, "eta", f"a float in (0, 2/beta] = (0, {2.0 / beta:.12g}] (Sordello et al. 2021, Thm 1)", eta
        )
    if eta * (beta + rho) <= 2.0:
        return math.sqrt(max(1.0 - 2.0 * eta * beta * rho / (beta + rho), 0.0))  # Sordello et al. 2021, Thm 1
    return eta * beta - 1.0


# ---------------------------------------------------------------------------------------------
# Per-record δ: A_i ∏ B_t
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Model:
    """Validated problem constants shared by every accountant (L, η, D, M)."""

    lipschitz: float
    eta: float
    diameter: float
    contraction: float

    def log_factors(
        self, epsilon: float, scales: NDArray[np.float64], noise: Noise
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """(log A_t, log B_t, log(1 − B_t)) for noise levels ``scales`` (Sordello et al. 2021, Eqs. (3)–(4))."""
        log_theta = _LOG_THETA[noise]
        log_a, _ = log_theta(epsilon, 2.0 * self.lipschitz / scales)
        log_b, log_one_minus_b = log_theta(
            epsilon, self.contraction * self.diameter / (self.eta * scales)
        )
        return log_a, log_b, log_one_minus_b


def _model(
    owner: str, L: float, eta: float, diameter: float, beta: float, rho: float, diameter_name: str
) -> _Model:
    return _Model(
        lipschitz=positive(owner, "L", L),
        eta=positive(owner, "eta", eta),
        diameter=positive(owner, diameter_name, diameter),
        contraction=_contraction_for(owner, eta, beta, rho),
    )


def _contraction_for(owner: str, eta: float, beta: float, rho: float) -> float:
    """:func:`contraction`, re-raising its errors under ``owner``'s name."""
    try:
        return contraction(eta, beta, rho)
    except InvalidParameterError as error:
        raise InvalidParameterError(owner, error.name, error.constraint, error.value) from None


def record_log_deltas(
    epsilon: float,
    scales: ArrayLike,
    releases: ArrayLike,
    L: float,
    eta: float,
    diameter: float,
    beta: float,
    rho: float,
    noise: Noise = "gaussian",
) -> NDArray[np.float64]:
    """log δ_i for every record of a PNSGD stream whose iterates are released at given steps.

    Parameters
    ----------
    epsilon : float
        ε ≥ 0 at which δ is reported.
    scales : array_like, shape (n,)
        Noise level of each step t = 1..n: σ_t > 0 (Gaussian N(0, σ_t² I)) or v_t > 0 (Laplace
        L(0, v_t)). Step t processes the record at stream position t.
    releases : array_like of int
        Strictly increasing 1-based steps s after which the iterate w_s is released (snapshots;
        include n if the final model is released). Must be within [1, n].
    L, eta, diameter, beta, rho : float
        Lipschitz constant of ℓ, learning rate, diameter D of K (for Laplace: b − a, d = 1),
        smoothness and strong convexity; see :func:`contraction` for the constraint on η.
    noise : {"gaussian", "laplace"}
        Noise family; A and B follow Sordello et al. 2021, Eq. (3) or Eq. (4).

    Returns
    -------
    NDArray[np.float64], shape (releases[-1],)
        Entry i − 1 is log δ_i for the record at position i ≤ releases[-1]: with s(i) the first
        release ≥ i, δ_i = A_i ∏_{t=i+1}^{s(i)} B_t (−inf where δ_i = 0). Records after the
        last release have not influenced any released output and are not listed.

    Notes
    -----
    Sordello et al. 2021, Sec. 5 (δ = A_i ∏_{t=i+1}^n B_t with per-step noise) applied to the iterate w_{s(i)}:
    Thm 1 only needs the intermediate iterates between i and s(i) hidden. Later releases are
    post-processing of w_{s(i)} together with records independent of x_i (the chain of kernels
    after s(i) does not see x_i), so they do not weaken δ_i. Earlier releases do not depend on
    x_i, and Thm 1 holds from any starting distribution, so conditioning on them costs nothing.
    This assumes the releases are the iterates themselves (or functions of them).

    Cost O(n): with P_k = Σ_{t≤k} log B_t (extended precision, zero factors counted apart),
    log δ_i = log A_i + P_{s(i)} − P_i.

    References
    ----------
    Sordello et al. 2021, Thm 1 and Sec. 5; Asoodeh et al. (2020), Thm 3.
    """
    return _record_log_deltas(
        "record_log_deltas", epsilon, scales, releases, L, eta, diameter, beta, rho, noise
    )


def _record_log_deltas(
    owner: str, epsilon: float, scales: ArrayLike, releases: ArrayLike, L: float, eta: float,
    diameter: float, beta: float, rho: float, noise: Noise,
) -> NDArray[np.float64]:
    epsilon = nonnegative(owner, "epsilon", epsilon)
    noise = _noise(owner, noise)
    model = _model(owner, L, eta, diameter, beta, rho, "diameter")
    levels = float_array(owner, "scales", scales, low=0.0, closed_low=False)
    steps = _release_steps(owner, releases, levels.size)
    last = int(steps[-1])
    log_a, log_b, _ = model.log_factors(epsilon, levels[:last], noise)
    zero = np.isneginf(log_b)
    prefix = np.concatenate(([0.0], np.cumsum(np.where(zero, 0.0, log_b), dtype=np.longdouble)))
    zeros = np.concatenate(([0], np.cumsum(zero)))
    positions = np.arange(1, last + 1)
    release_of = steps[np.searchsorted(steps, positions, side="left")]
    log_contraction = np.asarray(prefix[release_of] - prefix[positions], dtype=np.float64)
    log_contraction[zeros[release_of] > zeros[positions]] = -np.inf
    return log_a + log_contraction


def worst_released_delta(
    epsilon: float,
    scales: ArrayLike,
    releases: ArrayLike,
    L: float,
    eta: float,
    diameter: float,
    beta: float,
    rho: float,
    noise: Noise = "gaussian",
) -> WorstRecord:
    """The largest δ_i over released records, and where it occurs; see :func:`record_log_deltas`.

    Parameters are those of :func:`record_log_deltas`. The stream as a whole is (ε, max_i δ_i)-DP
    with respect to its released iterates (replace-one neighbours, any position).

    References
    ----------
    Sordello et al. 2021, Thm 1 and Sec. 5.
    """
    log_deltas = _record_log_deltas(
        "worst_released_delta", epsilon, scales, releases, L, eta, diameter, beta, rho, noise
    )
    index = int(np.argmax(log_deltas))
    return WorstRecord(delta=float(np.exp(log_deltas[index])), position=index + 1)


def pnsgd_delta(
    epsilon: float,
    sigmas: ArrayLike,
    position: int,
    L: float,
    eta: float,
    diameter: float,
    beta: float,
    rho: float,
) -> float:
    """δ for the record at ``position`` of PNSGD with Gaussian noise σ_t at step t (Sordello et al. 2021, Sec. 5).

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    sigmas : array_like, shape (n,)
        σ_t > 0 for steps t = 1..n; only the final iterate w_n is released.
    position : int
        1-based position i ∈ [1, n] of the record in which the neighbouring streams differ.
    L, eta, diameter, beta, rho : float
        As in :func:`record_log_deltas`.

    Returns
    -------
    float
        δ = θ_{e^ε}(2L/σ_i) · ∏_{t=i+1}^n θ_{e^ε}(M D/(η σ_t)). With a constant σ this is
        A · B^{n−i} of Sordello et al. 2021, Thm 1.

    References
    ----------
    Sordello et al. 2021, Thm 1 (Eq. (3)) and Sec. 5.
    """
    return _single_record_delta("pnsgd_delta", epsilon, sigmas, position, L, eta, diameter,
                                beta, rho, "gaussian", "sigmas", "diameter")


def pnsgd_laplace_delta(
    epsilon: float,
    scales: ArrayLike,
    position: int,
    L: float,
    eta: float,
    width: float,
    beta: float,
    rho: float,
) -> float:
    """δ for the record at ``position`` of PNSGD on K = [a, b] with Laplace noise L(0, v_t).

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    scales : array_like, shape (n,)
        Laplace scales v_t > 0 for steps t = 1..n; only w_n is released.
    position : int
        1-based position i ∈ [1, n].
    L, eta, beta, rho : float
        As in :func:`record_log_deltas`.
    width : float
        b − a > 0 (Sordello et al. 2021 proves the Laplace case for d = 1 only).

    Returns
    -------
    float
        δ = (1 − e^{ε/2 − L/v_i})_+ · ∏_{t=i+1}^n (1 − e^{ε/2 − M(b−a)/(2η v_t)})_+.

    References
    ----------
    Sordello et al. 2021, Thm 1 (Eq. (4)) and Sec. 5; Asoodeh et al. (2020), Thm 4.
    """
    return _single_record_delta("pnsgd_laplace_delta", epsilon, scales, position, L, eta, width,
                                beta, rho, "laplace", "scales", "width")


def _single_record_delta(
    owner: str, epsilon: float, scales: ArrayLike, position: int, L: float, eta: float,
    diameter: float, beta: float, rho: float, noise: Noise, scales_name: str, diameter_name: str,
) -> float:
    epsilon = nonnegative(owner, "epsilon", epsilon)
    model = _model(owner, L, eta, diameter, beta, rho, diameter_name)
    levels = float_array(owner, scales_name, scales, low=0.0, closed_low=False)
    position = positive_int(owner, "position", position)
    if position > levels.size:
        raise InvalidParameterError(
            owner, "position", f"an integer in [1, len({scales_name})] = [1, {levels.size}]",
            position,
        )
    log_a, _, _ = model.log_factors(epsilon, levels[position - 1 : position], noise)
    _, log_b, _ = model.log_factors(epsilon, levels[position:], noise)
    return float(np.exp(log_a[0] + math.fsum(log_b)))


# ---------------------------------------------------------------------------------------------
# Shuffled PNSGD with a fixed noise level (Sordello et al. 2021, Thm 2)
# ---------------------------------------------------------------------------------------------


def _shuffled_delta(
    owner: str, n: int, epsilon: float, scale: float, L: float, eta: float, diameter: float,
    beta: float, rho: float, noise: Noise, scale_name: str, diameter_name: str,
) -> float:
    """A (1 − Bⁿ) / (n (1 − B)) of Sordello et al. 2021, Thm 2, with 1 − B and log B taken from log space."""
    n = positive_int(owner, "n", n)
    epsilon = nonnegative(owner, "epsilon", epsilon)
    scale = positive(owner, scale_name, scale)
    model = _model(owner, L, eta, diameter, beta, rho, diameter_name)
    log_a, log_b, log_one_minus_b = (
        float(v[0]) for v in model.log_factors(epsilon, np.array([scale]), noise)
    )
    log_n_gap = math.log(n) + log_one_minus_b  # log(n (1 − B))
    if log_n_gap < -700.0:  # B = 1 to double precision: (1/n) Σ_{j<n} B^j ∈ [1 − n(1−B)/2, 1]
        return math.exp(log_a)
    mean_power = -math.expm1(n * log_b) / math.exp(log_n_gap)  # (1/n) Σ_{j<n} B^j
    return math.exp(log_a) * mean_power


def shuffled_pnsgd_delta(
    n: int,
    epsilon: float,
    sigma: float,
    L: float,
    eta: float,
    diameter: float,
    beta: float,
    rho: float,
) -> float:
    """δ of one epoch of shuffled PNSGD with Gaussian noise N(0, σ² I) (Sordello et al. 2021, Thm 2).

    Parameters
    ----------
    n : int
        Number of records (= steps), n ≥ 1.
    epsilon : float
        ε ≥ 0.
    sigma : float
        Noise standard deviation σ > 0, the same at every step.
    L, eta, diameter, beta, rho : float
        As in :func:`record_log_deltas`.

    Returns
    -------
    float
        δ = A (1 − Bⁿ) / (n (1 − B)) with A = θ_{e^ε}(2L/σ), B = θ_{e^ε}(M D/(η σ)); A when B = 1.

    Notes
    -----
    A uniformly random permutation puts the differing record at each position j with probability
    1/n, where Thm 1 gives A B^{n−j}; joint convexity of E_γ averages the bounds (Sordello et al. 2021, App. A).
    Only the final iterate of the epoch is released.

    References
    ----------
    Sordello et al. 2021, Thm 2 (Eq. (5)) with Eq. (3).
    """
    return _shuffled_delta("shuffled_pnsgd_delta", n, epsilon, sigma, L, eta, diameter, beta,
                           rho, "gaussian", "sigma", "diameter")


def shuffled_pnsgd_laplace_delta(
    n: int,
    epsilon: float,
    scale: float,
    L: float,
    eta: float,
    width: float,
    beta: float,
    rho: float,
) -> float:
    """δ of one epoch of shuffled PNSGD on K = [a, b] with Laplace noise L(0, v) (Sordello et al. 2021, Thm 2).

    Parameters
    ----------
    n : int
        Number of records (= steps), n ≥ 1.
    epsilon : float
        ε ≥ 0.
    scale : float
        Laplace scale v > 0, the same at every step.
    L, eta, beta, rho : float
        As in :func:`record_log_deltas`.
    width : float
        b − a > 0 (d = 1).

    Returns
    -------
    float
        δ = A (1 − Bⁿ) / (n (1 − B)) with A = (1 − e^{ε/2 − L/v})_+ and
        B = (1 − e^{ε/2 − M(b−a)/(2ηv)})_+.

    References
    ----------
    Sordello et al. 2021, Thm 2 (Eq. (5)) with Eq. (4).
    """
    return _shuffled_delta("shuffled_pnsgd_laplace_delta", n, epsilon, scale, L, eta, width,
                           beta, rho, "laplace", "scale", "width")


def shuffled_pnsgd_sigma(
    n: int,
    epsilon: float,
    delta: float,
    L: float,
    eta: float,
    diameter: float,
    beta: float,
    rho: float,
) -> float:
    """Smallest Gaussian σ for which one epoch of shuffled PNSGD is (ε, δ)-DP by Sordello et al. 2021, Thm 2.

    Parameters
    ----------
    n, epsilon, L, eta, diameter, beta, rho
        As in :func:`shuffled_pnsgd_delta`.
    delta : float
        Target δ ∈ (0, 1).

    Returns
    -------
    float
        σ with ``shuffled_pnsgd_delta(n, epsilon, σ, ...) <= delta`` (checked on the returned
        value, which is within a few ulps of the exact root).

    Notes
    -----
    Unlike :func:`fixed_sigma` (whose δ only tends to δ*_G as n → ∞, from above for some
    parameters), this calibrates σ to a target at the actual n. δ(σ) is decreasing: A = θ(2L/σ)
    decreases with σ, and (1/n)Σ_{j<n} B^j increases with B = θ(MD/(ησ)), which decreases with σ.

    References
    ----------
    Sordello et al. 2021, Thm 2.
    """
    owner = "shuffled_pnsgd_sigma"
    delta = _open_unit(owner, "delta", delta)
    shuffled_pnsgd_delta(n, epsilon, 1.0, L, eta, diameter, beta, rho)  # validates the rest
    log_target = math.log(delta)

    def excess(log_sigma: float) -> float:
        value = shuffled_pnsgd_delta(n, epsilon, math.exp(log_sigma), L, eta, diameter, beta, rho)
        return math.log(max(value, _TINY)) - log_target  # finite even where δ underflows

    low, high = -1.0, 1.0
    while excess(low) <= 0.0:
        low -= 2.0
    while excess(high) > 0.0:
        high += 2.0
    sigma = math.exp(brentq(excess, low, high, xtol=1e-15, rtol=4.0 * np.finfo(float).eps))
    step = math.ulp(sigma)
    while shuffled_pnsgd_delta(n, epsilon, sigma, L, eta, diameter, beta, rho) > delta:
        sigma += step
        step *= 2.0
    return sigma


# ---------------------------------------------------------------------------------------------
# Noise schedules (Sordello et al. 2021, Thms 4–7) and their limits
# ---------------------------------------------------------------------------------------------


def _lambertw_of_exp(log_x: NDArray[np.float64]) -> NDArray[np.float64]:
    """W(e^y) (principal branch) for real y, also when e^y overflows a double.

    For y < 500 scipy's lambertw of e^y; above, Newton's method on w + log w = y from
    w₀ = y − log y (six steps reach full precision there, since W(e^y) − w₀ = O(log y / y)).
    """
    y = np.asarray(log_x, dtype=np.float64)
    out = np.empty_like(y)
    small = y < 500.0
    out[small] = lambertw(np.exp(y[small])).real
    big = y[~small]
    w = big - np.log(big)
    for _ in range(6):
        w = w - (w + np.log(w) - big) / (1.0 + 1.0 / w)
    out[~small] = w
    return out


def _log_lambert_argument(
    log_numerator: NDArray[np.float64], C1: float, C2: float
) -> NDArray[np.float64]:
    """log(N/(2π C1²) + C2) for N = e^{log_numerator}: the argument of W in Sordello et al. 2021, Eq. (7)/Thm 7."""
    with np.errstate(divide="ignore"):
        log_c2 = math.log(C2) if C2 > 0.0 else -math.inf
    return np.logaddexp(log_numerator - math.log(2.0 * math.pi * C1 * C1), log_c2)


def _schedule_model(
    owner: str, eta: float, diameter: float, beta: float, rho: float, diameter_name: str
) -> float:
    """M D / η (validated, M > 0): the numerator shared by Sordello et al.'s σ(n), v(n), σ_j, v_j."""
    eta = positive(owner, "eta", eta)
    diameter = positive(owner, diameter_name, diameter)
    m = _contraction_for(owner, eta, beta, rho)
    if m == 0.0:
        raise InvalidParameterError(
            owner, "eta", "such that the contraction M > 0 (M = 0 when rho = beta and "
            "eta = 1/beta; then no noise is needed after the first step)", eta,
        )
    return m * diameter / eta


def fixed_sigma(
    n: int, eta: float, diameter: float, C1: float, C2: float, beta: float, rho: float
) -> float:
    """Gaussian noise level σ(n) of Sordello et al. 2021, Thm 5 for shuffled PNSGD over n records.

    Parameters
    ----------
    n : int
        Number of records n ≥ 1.
    eta, diameter, beta, rho : float
        As in :func:`record_log_deltas`; M must be positive.
    C1 : float
        C1 > 0; δ(n) → δ*_G = :func:`gaussian_delta_star` (ε, C1).
    C2 : float
        C2 ≥ 0, keeps σ moderate for small n (does not enter the limit).

    Returns
    -------
    float
        σ(n) = M D / (2η √W(n²/(2πC1²) + C2)), W the principal Lambert W function.

    Notes
    -----
    With this σ, B = θ_{e^ε}(2√W(x)) = 1 − 2C1e^{ε/2}/n + O(1/(n log n)) (Sordello et al. 2021, Eq. (11)) and
    δ(n) = δ*_G + O(1/log n). The limit is not a bound at finite n: compute the guarantee with
    :func:`shuffled_pnsgd_delta` at the σ used (for Sordello et al. 2021, App. G's parameters δ(n) > δ*_G), or
    calibrate with :func:`shuffled_pnsgd_sigma`.

    References
    ----------
    Sordello et al. 2021, Thm 5 (Eq. (7)) and App. D.
    """
    owner = "fixed_sigma"
    n = positive_int(owner, "n", n)
    c1 = positive(owner, "C1", C1)
    c2 = nonnegative(owner, "C2", C2)
    scale = _schedule_model(owner, eta, diameter, beta, rho, "diameter")
    w = _lambertw_of_exp(_log_lambert_argument(np.array([2.0 * math.log(n)]), c1, c2))[0]
    return scale / (2.0 * math.sqrt(w))


def fixed_laplace_scale(
    n: int, eta: float, width: float, C1: float, C2: float, beta: float, rho: float
) -> float:
    """Laplace scale v(n) of Sordello et al. 2021, Thm 4 for shuffled PNSGD over n records on K = [a, b].

    Parameters
    ----------
    n : int
        Number of records n ≥ 1.
    eta, beta, rho : float
        As in :func:`record_log_deltas`; M must be positive.
    width : float
        b − a > 0.
    C1, C2 : float
        C1 > 0 and C2 ≥ 0 with n/C1 + C2 > 1 (so that v(n) is positive and finite).

    Returns
    -------
    float
        v(n) = M (b − a) / (2η log(n/C1 + C2)).

    Notes
    -----
    Then B = 1 − C1 e^{ε/2}/(n + C1C2) and δ(n) = δ*_L + O(1/n) (Sordello et al. 2021, App. B); as for
    :func:`fixed_sigma`, report :func:`shuffled_pnsgd_laplace_delta` at the actual n.

    References
    ----------
    Sordello et al. 2021, Thm 4 (Eq. (6)) and App. B.
    """
    owner = "fixed_laplace_scale"
    n = positive_int(owner, "n", n)
    c1 = positive(owner, "C1", C1)
    c2 = nonnegative(owner, "C2", C2)
    scale = _schedule_model(owner, eta, width, beta, rho, "width")
    log_argument = _positive_log(owner, n / c1 + c2, c2, "n/C1 + C2 > 1")
    return scale / (2.0 * log_argument)


def gaussian_delta_star(epsilon: float, C1: float) -> float:
    """Limit δ*_G = (1 − e^{−2C1e^{ε/2}}) / (2C1 e^{ε/2}) of shuffled PNSGD under Sordello et al. 2021, Thm 5.

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    C1 : float
        C1 > 0, as in :func:`fixed_sigma`.

    Returns
    -------
    float
        δ*_G. This is lim_{n→∞} δ(n), not a bound at any finite n.

    References
    ----------
    Sordello et al. 2021, Thm 5 (Eq. (7)).
    """
    owner = "gaussian_delta_star"
    epsilon = nonnegative(owner, "epsilon", epsilon)
    return _one_minus_exp_ratio(2.0 * positive(owner, "C1", C1) * math.exp(epsilon / 2.0))


def laplace_delta_star(epsilon: float, C1: float) -> float:
    """Limit δ*_L = (1 − e^{−C1e^{ε/2}}) / (C1 e^{ε/2}) of shuffled PNSGD under Sordello et al. 2021, Thm 4.

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    C1 : float
        C1 > 0, as in :func:`fixed_laplace_scale`.

    Returns
    -------
    float
        δ*_L = lim_{n→∞} δ(n) (not a bound at finite n).

    References
    ----------
    Sordello et al. 2021, Thm 4 (Eq. (6)).
    """
    owner = "laplace_delta_star"
    epsilon = nonnegative(owner, "epsilon", epsilon)
    return _one_minus_exp_ratio(positive(owner, "C1", C1) * math.exp(epsilon / 2.0))


def _one_minus_exp_ratio(c: float) -> float:
    """(1 − e^{−c}) / c."""
    return -math.expm1(-c) / c


def online_sigma(
    j: int | ArrayLike,
    alpha: float,
    eta: float,
    diameter: float,
    C1: float,
    C2: float,
    beta: float,
    rho: float,
) -> float | NDArray[np.float64]:
    """Decaying Gaussian noise σ_j of Sordello et al. 2021, Thm 7 for step j of online PNSGD.

    Parameters
    ----------
    j : int or array_like of int
        1-based step(s) j ≥ 1.
    alpha : float
        Decay exponent α > 1 (the hypothesis of Thm 7).
    eta, diameter, beta, rho : float
        As in :func:`record_log_deltas`; M must be positive.
    C1 : float
        C1 > 0.
    C2 : float
        C2 ≥ 0.

    Returns
    -------
    float or NDArray[np.float64]
        σ_j = M D / (2η √W(j^{2α}/(2πC1²) + C2)); an array when ``j`` is an array.

    Notes
    -----
    Then B_j = θ_{e^ε}(2√W(j^{2α}/(2πC1²) + C2)) = 1 − 2C1e^{ε/2}/j^α + O(1/(j^α log j))
    (Sordello et al. 2021, App. F), so ∏_j B_j converges to a positive limit exactly when α > 1.

    References
    ----------
    Sordello et al. 2021, Thm 7 and App. F.
    """
    owner = "online_sigma"
    steps, scalar = _steps(owner, j)
    alpha = _finite_above(owner, "alpha", alpha, 1.0)
    c1 = positive(owner, "C1", C1)
    c2 = nonnegative(owner, "C2", C2)
    scale = _schedule_model(owner, eta, diameter, beta, rho, "diameter")
    w = _lambertw_of_exp(_log_lambert_argument(2.0 * alpha * np.log(steps), c1, c2))
    sigmas = scale / (2.0 * np.sqrt(w))
    return float(sigmas[0]) if scalar else sigmas


def online_laplace_scale(
    j: int | ArrayLike,
    alpha: float,
    eta: float,
    width: float,
    C1: float,
    C2: float,
    beta: float,
    rho: float,
) -> float | NDArray[np.float64]:
    """Decaying Laplace scale v_j of Sordello et al. 2021, Thm 6 for step j of online PNSGD on K = [a, b].

    Parameters
    ----------
    j : int or array_like of int
        1-based step(s) j ≥ 1.
    alpha : float
        α > 1.
    eta, beta, rho : float
        As in :func:`record_log_deltas`; M must be positive.
    width : float
        b − a > 0.
    C1, C2 : float
        C1 > 0, C2 ≥ 0 with j^α/C1 + C2 > 1 for every requested j (C2 ≥ 1 suffices for all j).

    Returns
    -------
    float or NDArray[np.float64]
        v_j = M (b − a) / (2η log(j^α/C1 + C2)); an array when ``j`` is an array.

    References
    ----------
    Sordello et al. 2021, Thm 6.
    """
    owner = "online_laplace_scale"
    steps, scalar = _steps(owner, j)
    alpha = _finite_above(owner, "alpha", alpha, 1.0)
    c1 = positive(owner, "C1", C1)
    c2 = nonnegative(owner, "C2", C2)
    scale = _schedule_model(owner, eta, width, beta, rho, "width")
    arguments = steps.astype(np.float64) ** alpha / c1 + c2
    worst = float(np.min(arguments))
    _positive_log(owner, worst, c2, "j**alpha/C1 + C2 > 1 for every j")
    scales = scale / (2.0 * np.log(arguments))
    return float(scales[0]) if scalar else scales


def gaussian_online_delta_star(
    epsilon: float,
    position: int,
    alpha: float,
    L: float,
    eta: float,
    diameter: float,
    C1: float,
    C2: float,
    beta: float,
    rho: float,
) -> OnlineLimit:
    """δ^{*,o}_G of Sordello et al. 2021, Thm 7: the n → ∞ limit of δ for the record at ``position``.

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    position : int
        1-based position i of the record.
    alpha, eta, diameter, C1, C2, beta, rho : float
        The schedule of :func:`online_sigma`.
    L : float
        Lipschitz constant of ℓ.

    Returns
    -------
    OnlineLimit
        ``delta_star`` = θ_{e^ε}(2L/σ_i) · exp(∫_{i+1}^∞ log θ_{e^ε}(2√W(x^{2α}/(2πC1²) + C2)) dx)
        exactly as in Sordello et al. 2021, Thm 7, and ``lower_bound``, the same with ∫_i^∞ (Sordello et al. 2021, App. E–F).

    Notes
    -----
    This is the guarantee of record i only when no iterate is released before the end of an
    infinitely long stream. At any finite n the record's δ is A_i ∏_{t=i+1}^n B_t
    (:func:`pnsgd_delta`), which is larger than the limit; and the most recent records have
    δ ≈ A_n → 1, so there is no uniform-in-position guarantee (:func:`worst_released_delta`).
    ``delta_star`` bounds the true limit from above because log B is increasing: the sum
    Σ_{t>i} log B_t ≤ ∫_{i+1}^∞ log B. The integral is taken with ``scipy.integrate.quad`` in
    u = log x, where the integrand decays like e^{−(α−1)u}.

    References
    ----------
    Sordello et al. 2021, Thm 7 and App. F (App. E for the lower bound).
    """
    owner = "gaussian_online_delta_star"
    epsilon = nonnegative(owner, "epsilon", epsilon)
    position = positive_int(owner, "position", position)
    sigma = online_sigma(position, alpha, eta, diameter, C1, C2, beta, rho)  # validates
    r_a = 2.0 * positive(owner, "L", L) / float(sigma)
    log_a = float(_gaussian_log_theta(epsilon, np.array([r_a]))[0][0])
    exponent, c1, c2 = 2.0 * float(alpha), float(C1), float(C2)

    def log_one_minus_b(log_t: NDArray[np.float64]) -> NDArray[np.float64]:
        # B(x) = θ_{e^ε}(M D/(η σ(x))) = θ_{e^ε}(2√W(x^{2α}/(2πC1²) + C2)) (Sordello et al. 2021, App. F).
        r = 2.0 * np.sqrt(_lambertw_of_exp(_log_lambert_argument(exponent * log_t, c1, c2)))
        return _gaussian_log_theta(epsilon, r)[1]

    return _online_limit(log_a, position, log_one_minus_b)


def laplace_online_delta_star(
    epsilon: float,
    position: int,
    alpha: float,
    L: float,
    eta: float,
    width: float,
    C1: float,
    C2: float,
    beta: float,
    rho: float,
) -> OnlineLimit:
    """δ^{*,o}_L of Sordello et al. 2021, Thm 6: the n → ∞ limit of δ for the record at ``position``.

    Parameters
    ----------
    epsilon : float
        ε ≥ 0.
    position : int
        1-based position i of the record.
    alpha, eta, width, C1, C2, beta, rho : float
        The schedule of :func:`online_laplace_scale` (C2 ≥ 1 is required here so that v_t is
        defined for every t ≥ i).
    L : float
        Lipschitz constant of ℓ.

    Returns
    -------
    OnlineLimit
        ``delta_star`` = (1 − e^{ε/2 − 2Lη log(i^α/C1 + C2)/(M(b−a))})_+ ·
        exp(∫_{i+1}^∞ log(1 − C1e^{ε/2}/(x^α + C1C2)) dx) as in Sordello et al. 2021, Thm 6, and ``lower_bound``
        with ∫_i^∞ (Sordello et al. 2021, App. E). If 1 − C1e^{ε/2}/(x^α + C1C2) ≤ 0 somewhere on the range the
        integral is −∞ and the bound is 0 (then some B_t = 0 exactly).

    Notes
    -----
    As for :func:`gaussian_online_delta_star`: a per-position limit, not a finite-n bound.

    References
    ----------
    Sordello et al. 2021, Thm 6 and App. E.
    """
    owner = "laplace_online_delta_star"
    epsilon = nonnegative(owner, "epsilon", epsilon)
    position = positive_int(owner, "position", position)
    if nonnegative(owner, "C2", C2) < 1.0:
        raise InvalidParameterError(owner, "C2", "a float >= 1 (v_t defined for all t)", C2)
    scale = online_laplace_scale(position, alpha, eta, width, C1, C2, beta, rho)  # validates
    r_a = 2.0 * positive(owner, "L", L) / float(scale)
    log_a = float(_laplace_log_theta(epsilon, np.array([r_a]))[0][0])
    exponent, log_c1, log_c2 = float(alpha), math.log(C1), math.log(C2)

    def log_one_minus_b(log_t: NDArray[np.float64]) -> NDArray[np.float64]:
        # 1 − B(x) = e^{ε/2}/(x^α/C1 + C2), capped at 1 where B = 0 (Sordello et al. 2021, App. E).
        log_argument = np.logaddexp(exponent * log_t - log_c1, log_c2)
        return np.minimum(epsilon / 2.0 - log_argument, 0.0)

    return _online_limit(log_a, position, log_one_minus_b)


def _online_limit(
    log_a: float,
    position: int,
    log_one_minus_b: Callable[[NDArray[np.float64]], NDArray[np.float64]],
) -> OnlineLimit:
    """A_i·exp(∫ log B) over [i+1, ∞) and [i, ∞), from x ↦ log(1 − B(x)) given in u = log x."""

    def integrand(u: float) -> float:
        # log B(e^u) · e^u, written as −e^{u + log(−log B)} so that e^u never overflows.
        log_c = float(log_one_minus_b(np.array([u]))[0])
        if log_c >= 0.0:
            return -math.inf
        c = math.exp(log_c)
        log_minus_log_b = log_c + (math.log(-math.log1p(-c) / c) if c > 1e-8 else c / 2.0)
        return -math.exp(u + log_minus_log_b)

    def log_product(start: float) -> float:
        u0 = math.log(start)
        if math.isinf(integrand(u0)):
            return -math.inf
        head, _ = quad(integrand, u0, u0 + 10.0, epsabs=0.0, epsrel=1e-12, limit=200)
        tail, _ = quad(integrand, u0 + 10.0, math.inf, epsabs=0.0, epsrel=1e-12, limit=200)
        return head + tail

    upper = log_a + log_product(position + 1.0)
    lower = log_a + log_product(float(position))
    return OnlineLimit(
        delta_star=math.exp(upper),
        lower_bound=math.exp(lower),
        log_delta_star=upper,
        log_lower_bound=lower,
    )


# ---------------------------------------------------------------------------------------------
# Validation helpers specific to this module
# ---------------------------------------------------------------------------------------------


def _noise(owner: str, noise: object) -> Noise:
    if noise not in _LOG_THETA:
        raise InvalidParameterError(owner, "noise", "one of 'gaussian', 'laplace'", noise)
    return noise  # type: ignore[return-value]


def _finite_at_least(owner: str, name: str, value: object, low: float) -> float:
    number = nonnegative(owner, name, value)
    if number < low:
        raise InvalidParameterError(owner, name, f"a finite float >= {low}", value)
    return number


def _finite_above(owner: str, name: str, value: object, low: float) -> float:
    number = nonnegative(owner, name, value)
    if number <= low:
        raise InvalidParameterError(owner, name, f"a finite float > {low}", value)
    return number


def _nonnegative_or_inf(owner: str, name: str, value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    return nonnegative(owner, name, value)


def _open_unit(owner: str, name: str, value: object) -> float:
    number = positive(owner, name, value)
    if number >= 1.0:
        raise InvalidParameterError(owner, name, "a float in (0, 1)", value)
    return number


def _positive_log(owner: str, argument: float, c2: float, constraint: str) -> float:
    """log(argument), raising on C2 when argument ≤ 1 (Sordello et al.'s Laplace schedules need log > 0)."""
    if argument <= 1.0:
        raise InvalidParameterError(owner, "C2", f"such that {constraint}", c2)
    return math.log(argument)


def _steps(owner: str, j: object) -> tuple[NDArray[np.int64], bool]:
    """1-based step(s) as an int64 array, and whether a scalar was given."""
    values = np.asarray(j)
    scalar = values.ndim == 0
    values = np.atleast_1d(values)
    if (
        values.ndim != 1
        or values.size == 0
        or not np.issubdtype(values.dtype, np.integer)
        or np.any(values < 1)
    ):
        raise InvalidParameterError(owner, "j", "an integer >= 1 or a 1-D array of them", j)
    return values.astype(np.int64), scalar


def _release_steps(owner: str, releases: object, n: int) -> NDArray[np.int64]:
    constraint = (
        f"a non-empty strictly increasing sequence of integers in [1, len(scales)] = [1, {n}]"
    )
    values = np.atleast_1d(np.asarray(releases))
    if (
        values.ndim != 1
        or values.size == 0
        or not np.issubdtype(values.dtype, np.integer)
        or values[0] < 1
        or values[-1] > n
        or np.any(np.diff(values) <= 0)
    ):
        raise InvalidParameterError(owner, "releases", constraint, releases)
    return values.astype(np.int64)
