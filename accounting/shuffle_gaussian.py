"""Rényi DP of the shuffled Gaussian mechanism and its subsampled and check-in variants (Liew & Takahashi 2022).

Mechanism (Liew & Takahashi 2022, §2): each of n users adds N(0, σ² I) to her record and a trusted shuffler
releases the n noisy records in uniformly random order. ``sigma`` everywhere in this module is
the *noise multiplier*: the noise standard deviation divided by the ℓ₂ distance between the two
values a user's record can take in neighbouring datasets (Liew & Takahashi 2022 normalises that distance to 1).

The quantity Liew & Takahashi 2022, Thm 1 computes
---------------------------------
Write s = 1/(2σ²), E_n(λ) = E_{X~P}[(Q(X)/P(X))^λ] for P = N(0, σ² I_n) (every record 0) and
Q = (1/n) Σ_i N(e_i, σ² I_n) (one record moved to 1), and ε_n(λ) = log E_n(λ)/(λ − 1). Liew & Takahashi 2022,
Eq. (4) says

    E_n(λ) = e^{−sλ} n^{−λ} Σ_{k₁+…+k_n=λ} (λ choose k₁…k_n) e^{s Σ k_i²}
           = E_{K ~ Multinomial(λ; 1/n, …, 1/n)} [exp(s Σ_i K_i (K_i − 1))].

Computing it (deviation from Liew & Takahashi 2022 §3.1: generating functions instead of partitions)
-----------------------------------------------------------------------------------
Liew & Takahashi 2022, Alg. 1 enumerates the integer partitions of λ (p(λ) grows like e^{π√(2λ/3)}, so λ ≳ 80 is out
of reach). Here every order up to λ_max comes from one generating function. Split each user's
factor as e^{s k(k−1)} = 1 + (e^{s k(k−1)} − 1); only users with k ≥ 2 have a non-zero second
part. With c(t) = Σ_{k≥2} c_k t^k, c_k = expm1(s k(k−1))/k! ≥ 0, the multinomial theorem gives

    E_n(λ) − 1 = Σ_{j=1}^{min(n, ⌊λ/2⌋)} C(n, j) λ! n^{−λ}
                 · Σ_{m=2j}^{λ} [t^m] c(t)^j · (n − j)^{λ−m}/(λ − m)!

(j = number of users taking the second part, m = their total count). Every term is non-negative,
so E_n(λ) − 1 — which is about λ(λ−1)s/n, i.e. 1e-8 at n = 10⁹ — is obtained as a sum of
positive numbers in log space with no cancellation, and log E_n(λ) = log1p(E_n(λ) − 1). The
powers c(t)^j are log-space convolutions; C(n, j) n^{j−m} (1 − j/n)^{λ−m} uses log1p, never
gammaln(n), so n = 10¹⁸ is as accurate as n = 2. Cost: O(λ_max³/2) elementary operations for all
orders at once (orders 2..256 at n = 10⁹: see ``benchmarks/shuffle_gaussian_rdp.py``).

Assumptions (see :data:`THM1_ASSUMPTIONS`)
------------------------------------------
Liew & Takahashi 2022 proves Eq. (4) for the one pair D = (0, …, 0), D′ = (1, 0, …, 0) and one direction,
D_λ(M(D′) ‖ M(D)); it asserts "w.l.o.g." that this pair is the worst case (citing Koskela et al.
2021, App. B.1). That reduction is not proven in the seed. Numerical evidence only: for n = 2, 3
the reverse direction is the smaller one on the tested grid (tests); for n = 2 with records in an
interval or a disc of diameter 1, no configuration in a random search beat the pair above. It
fails for other record domains: three records pairwise at distance 1 (an equilateral triangle,
which no disc of diameter 1 contains) give, at n = 2, σ = 1, λ = 2, a divergence of 0.63916 >
Eq. (4)'s 0.62011 (pinned in the tests). Even for a ball the evidence covers only n ≤ 3, so every
report built on these functions must carry :data:`THM1_ASSUMPTIONS`.

Non-integer orders
------------------
Eq. (4) and Liew & Takahashi 2022 Eq. (10) are for integer λ. α ↦ log E(α) is convex (a cumulant generating
function), so for non-integer α the linear interpolation of log E between ⌊α⌋ and ⌈α⌉ is an upper
bound (Wang, Balle & Kasiviswanathan 2019, Cor. 10; log E(1) = 0). Integer orders are exact.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.rdp import RdpCurve
from panpriv.accounting.validation import float_array, in_range, open_unit, positive, positive_int

__all__ = [
    "CHECKIN_ASSUMPTIONS",
    "MAX_ORDER",
    "THM1_ASSUMPTIONS",
    "checkin_rdp",
    "epsilon",
    "rdp",
    "rdp_by_partitions",
    "subsampled_rdp",
]

THM1_ASSUMPTIONS: tuple[str, ...] = (
    "Liew & Takahashi 2022 Thm 1 (exact shuffled-Gaussian RDP) is computed for the neighbouring pair "
    "(0,...,0) vs (1,0,...,0) in the direction D_lambda(mixture || Gaussian); Liew & Takahashi 2022 asserts without "
    "proof that this pair and direction are the worst case. Checked numerically only: the "
    "reverse direction is smaller for n <= 3, and the pair was the worst found for n = 2 with "
    "records in an interval or a disc; it fails for domains that are not balls (three records "
    "pairwise at the sensitivity distance)",
)

CHECKIN_ASSUMPTIONS: tuple[str, ...] = THM1_ASSUMPTIONS + (
    "Liew & Takahashi 2022 Thm 3 (shuffled check-in) assumes Eq. (12), E_n(lambda), is non-increasing in n; Liew & Takahashi 2022 "
    "leaves this unproven. It holds: E_n(lambda) = E[(mean of n i.i.d. W_i)^lambda] (Liew & Takahashi 2022 Eq. 7), "
    "and the mean of n variables is the average of its n leave-one-out means, so Jensen gives "
    "E_n <= E_{n-1} (proof in panpriv.accounting.shuffle_gaussian.checkin_rdp)",
    "Liew & Takahashi 2022 Thm 3 rests on Eq. (11), the shuffled check-in mixture bound of Liew et al. (2022a), "
    "which is not among the papers implemented here and was not re-derived",
)

_ArrayF = NDArray[np.float64]

MAX_ORDER = 1024
"""Largest order accepted: the work grows as λ_max³ (about 6 s and a few 8 MB arrays at 1024)."""


@overload
def rdp(orders: float, n: int, sigma: float) -> float: ...
@overload
def rdp(orders: Sequence[float] | NDArray[np.float64], n: int, sigma: float) -> _ArrayF: ...
def rdp(
    orders: float | Sequence[float] | NDArray[np.float64], n: int, sigma: float
) -> float | _ArrayF:
    """Exact RDP ε_n(λ) of the shuffled Gaussian mechanism (Liew & Takahashi 2022, Thm 1, Eq. (4)).

    Parameters
    ----------
    orders : float or sequence of float
        Rényi orders λ in (1, :data:`MAX_ORDER`]. Integer orders are exact; others get the
        convexity upper bound (module docstring, "Non-integer orders").
    n : int
        Number of shuffled records (users), n ≥ 1.
    sigma : float
        Noise multiplier σ > 0 (noise std / distance between a user's two possible records).

    Returns
    -------
    float or ndarray
        ε_n(λ), a float for a scalar ``orders`` and an array otherwise. n = 1 gives the Gaussian
        RDP λ/(2σ²); for n ≥ 2 the values lie strictly between λ/(2nσ²) (the Gaussian on the sum,
        a post-processing) and λ/(2σ²) (Liew & Takahashi 2022, Cor. 1).

    Notes
    -----
    Computed by the generating function in the module docstring, all orders at once; the result
    agrees with the partition method of Liew & Takahashi 2022, Alg. 1 (:func:`rdp_by_partitions`) to about 1e-13
    relative. The guarantee rests on :data:`THM1_ASSUMPTIONS`.

    References
    ----------
    Liew & Takahashi 2022, Thm 1 (Eq. (4)), its proof (Eqs. (5)–(9)) and Cor. 1.
    """
    owner = "shuffle_gaussian.rdp"
    lams, scalar = _orders(owner, orders)
    n = positive_int(owner, "n", n)
    s = _s(owner, sigma)
    values = _from_log_moments(lams, _log_moments(_max_order(lams), n, s))
    return float(values[0]) if scalar else values


def rdp_by_partitions(order: int, n: int, sigma: float) -> float:
    """ε_n(λ) of Liew & Takahashi 2022, Thm 1 by the integer-partition method of Liew & Takahashi 2022, Alg. 1 (the reference).

    Parameters
    ----------
    order : int
        Integer Rényi order λ ≥ 2. The cost grows like the partition number p(λ)
        (p(30) = 5 604, p(60) = 966 467).
    n : int
        Number of shuffled records, n ≥ 1.
    sigma : float
        Noise multiplier σ > 0.

    Returns
    -------
    float
        ε_n(λ).

    Notes
    -----
    Each partition ρ of λ into p ≤ n parts with multiplicities κ₁, κ₂, … stands for
    n!/((n − p)! κ₁! κ₂! …) vectors (k₁, …, k_n), each with multinomial probability
    λ!/(Π k_i! n^λ) (Liew & Takahashi 2022 §3.1, Alg. 1). Two corrections to the printed Alg. 1: its line 7 drops the
    1/(2σ²) in the exponent and line 8 returns the sum rather than log(sum)/(λ − 1). One change
    for accuracy: since these probabilities sum to 1, the code sums
    P(ρ)·expm1(s Σ k_i(k_i − 1)) ≥ 0 to get E_n(λ) − 1 directly, instead of summing terms near 1 and
    subtracting (at n = 10⁹, E_n(λ) − 1 ≈ 1e-8 would otherwise keep only ~8 digits). log n!/(n − p)!
    is Σ_{i<p} (log n + log1p(−i/n)).

    References
    ----------
    Liew & Takahashi 2022, Alg. 1 and §3.1; partitions generated in ascending order (Kelleher & O'Sullivan 2009,
    cited there).
    """
    owner = "shuffle_gaussian.rdp_by_partitions"
    lam = positive_int(owner, "order", order, minimum=2)
    n = positive_int(owner, "n", n)
    s = _s(owner, sigma)
    # log(n!/((n − p)! n^p)) = Σ_{i<p} log1p(−i/n) for p = 0..min(λ, n).
    log_falling = np.concatenate(([0.0], np.cumsum(np.log1p(-np.arange(min(lam, n)) / n))))
    log_fact = [math.lgamma(i + 1.0) for i in range(lam + 1)]
    log_n = math.log(n)
    log_probabilities: list[float] = []  # log P(ρ): multinomial probability of the whole class
    pair_counts: list[int] = []  # Σ k_i(k_i − 1)
    for parts in _partitions(lam):
        p = len(parts)
        pairs = sum(k * (k - 1) for k in parts)
        if p > n or pairs == 0:  # no such vector / the all-ones partition adds expm1(0) = 0
            continue
        log_count = log_falling[p] - sum(log_fact[c] for c in Counter(parts).values())
        log_multinomial = log_fact[lam] - sum(log_fact[k] for k in parts)
        log_probabilities.append(log_count + log_multinomial + (p - lam) * log_n)
        pair_counts.append(pairs)
    # Never empty: the one-part partition (λ) always counts.
    log_terms = np.array(log_probabilities) + _log_expm1(s * np.array(pair_counts, dtype=float))
    log_excess = float(_logsumexp(log_terms))
    return float(np.logaddexp(0.0, log_excess)) / (lam - 1)


def epsilon(
    n: int,
    sigma: float,
    delta: float,
    compositions: int = 1,
    orders: Iterable[float] = range(2, 31),
) -> float:
    """(ε, δ)-DP of ``compositions`` runs of the shuffled Gaussian mechanism.

    Parameters
    ----------
    n : int
        Number of shuffled records, n ≥ 1.
    sigma : float
        Noise multiplier σ > 0.
    delta : float
        Target δ in (0, 1).
    compositions : int
        Number of (adaptively) composed runs, ≥ 1.
    orders : iterable of float
        Rényi orders to optimise over; Liew & Takahashi 2022 §5.1 uses λ = 2..30 ("maximum λ ... 30").

    Returns
    -------
    float
        min over the orders of the RDP-to-DP conversion of ``compositions``·ε_n(λ).

    Notes
    -----
    With n = 60 000, σ = 9.48, δ = 1/n this reproduces the "Ours" row of Liew & Takahashi 2022, Table 1. There ε_n(λ)
    is about 3e-6 at λ = 30, so ε is almost all conversion overhead at the largest order and barely
    grows with the number of compositions.

    References
    ----------
    Liew & Takahashi 2022, Thm 1, Lemma 1 (composition), Lemma 2 (conversion, :func:`panpriv.accounting.rdp.rdp_to_dp`),
    §5.1 and Table 1.
    """
    owner = "shuffle_gaussian.epsilon"
    compositions = positive_int(owner, "compositions", compositions)
    delta = open_unit(owner, "delta", delta)
    grid = float_array(owner, "orders", list(orders), low=1.0, closed_low=False)
    curve = RdpCurve.from_values(grid, rdp(grid, n, sigma))
    return curve.repeated(compositions).to_dp(delta)[0]


def subsampled_rdp(
    orders: float | Sequence[float] | NDArray[np.float64], n: int, m: int, sigma: float
) -> float | _ArrayF:
    """RDP of the subsampled shuffled Gaussian: m of n records, without replacement (Liew & Takahashi 2022, Thm 2).

    Parameters
    ----------
    orders : float or sequence of float
        Rényi orders λ in (1, MAX_ORDER]; non-integer ones by the convexity bound (see module).
    n : int
        Dataset size, n ≥ 1.
    m : int
        Records sampled (without replacement) and shuffled per run, 1 ≤ m ≤ n.
    sigma : float
        Noise multiplier σ > 0.

    Returns
    -------
    float or ndarray
        min(Eq. (10) with γ = m/n and base ε_m(·) of Thm 1, ε_m(λ)).

    Notes
    -----
    Eq. (10) is Wang, Balle & Kasiviswanathan (2019), Thm 9 with ε(∞) = ∞. The
    extra min with ε_m(λ) is ours: conditioned on the sample, the outputs on neighbouring datasets
    are identical or are the shuffled Gaussian on neighbouring m-record datasets, and
    exp((λ − 1) D_λ) is jointly convex, so subsampling never increases RDP. It matters only for γ
    near 1 (at m = n the result is ε_n(λ) exactly). The guarantee rests on
    :data:`THM1_ASSUMPTIONS`.

    References
    ----------
    Liew & Takahashi 2022, Thm 2 (Eq. (10)); Wang, Balle & Kasiviswanathan (2019), Thm 9 and Cor. 10.
    """
    owner = "shuffle_gaussian.subsampled_rdp"
    lams, scalar = _orders(owner, orders)
    n = positive_int(owner, "n", n)
    m = positive_int(owner, "m", m)
    if m > n:
        raise InvalidParameterError(owner, "m", f"an integer in [1, n] = [1, {n}]", m)
    s = _s(owner, sigma)
    base = _log_moments(_max_order(lams), m, s)
    log_moments = np.minimum(_subsampled_log_moments(base, m / n), base)
    values = _from_log_moments(lams, log_moments)
    return float(values[0]) if scalar else values


def checkin_rdp(
    orders: float | Sequence[float] | NDArray[np.float64],
    n: int,
    gamma: float,
    sigma: float,
    slack: float,
) -> float | _ArrayF:
    """RDP of the shuffled check-in Gaussian mechanism (Liew & Takahashi 2022, Thm 3, Eq. (13)).

    Each of n users checks in independently with probability γ; those who do send their record
    plus N(0, σ² I) to the shuffler.

    Parameters
    ----------
    orders : float or sequence of float
        Rényi orders λ in (1, MAX_ORDER]; non-integer ones by the convexity bound (see module).
    n : int
        Number of users, n ≥ 1.
    gamma : float
        Check-in probability γ in (0, 1].
    sigma : float
        Noise multiplier σ > 0.
    slack : float
        Δ in [0, 1] of Eq. (13): the Chernoff bound Pr[K ≤ (1 − Δ)nγ] ≤ exp(−Δ²nγ/2) on the number
        K ~ Bin(n, γ) of check-ins splits the bound into a rare case (bounded with one user) and
        the typical case K ≥ k* = ⌊(1 − Δ)nγ⌋ + 1.

    Returns
    -------
    float or ndarray
        (1/(λ−1)) log(exp((λ−1) ε^SSG_{γ,1}(λ) − Δ²nγ/2) + exp((λ−1) ε^SSG_{γ,k*}(λ))), with
        ε^SSG_{γ,k} = Eq. (10) at rate γ over the shuffled Gaussian of k users.

    Notes
    -----
    **Assumptions** (also in :data:`CHECKIN_ASSUMPTIONS`, for privacy reports):

    1. Liew & Takahashi 2022 states Thm 3 only under the assumption, *not proven in Liew & Takahashi 2022*, that Eq. (12) —
       E_n(λ), the moment inside Eq. (4) — is monotonically decreasing in n. It is in fact
       non-increasing: by Liew & Takahashi 2022 Eq. (7), E_n(λ) = E[W̄_n^λ] with W̄_n the mean of n i.i.d.
       W_i = exp((2X_i − 1)/(2σ²)), X_i ~ N(0, σ²). W̄_n equals the average of its n leave-one-out
       means, each distributed as W̄_{n−1}; w ↦ w^λ is convex, so Jensen gives
       E[W̄_n^λ] ≤ E[W̄_{n−1}^λ]. (Pinned numerically in the tests.) Hence ε^SSG_{γ,k} is
       non-increasing in k, which is how Thm 3 uses the assumption.
    2. Eq. (11), the mixture over the number of check-ins, is quoted by Liew & Takahashi 2022 from Liew et al.
       (2022a), which is not among the papers implemented here; it is used as printed.
    3. Thm 1's worst-case-pair assumption (:data:`THM1_ASSUMPTIONS`).

    Deviations from the printed Eq. (13): the seed writes the typical-case size as
    (1 − Δ)nγ + 1, which need not be an integer; we use k* = ⌊(1 − Δ)nγ⌋ + 1 (every K >
    (1 − Δ)nγ is ≥ k*, and by monotonicity ε^SSG at k* bounds them all), capped at n. Eq. (10) is
    used exactly as printed here (no min with the unsubsampled RDP, unlike
    :func:`subsampled_rdp`), because the meaning of ε^SSG_{γ,k} comes from Eq. (11).

    References
    ----------
    Liew & Takahashi 2022, Thm 3 (Eq. (13)), Eqs. (10)–(12), §6 (monotonicity stated as open); Liew et al. (2022a).
    """
    owner = "shuffle_gaussian.checkin_rdp"
    lams, scalar = _orders(owner, orders)
    n = positive_int(owner, "n", n)
    gamma = in_range(owner, "gamma", gamma, 0.0, 1.0, closed_low=False, closed_high=True)
    s = _s(owner, sigma)
    slack = in_range(owner, "slack", slack, 0.0, 1.0, closed_low=True, closed_high=True)
    k_star = min(n, math.floor((1.0 - slack) * n * gamma) + 1)
    max_order = _max_order(lams)
    rare = _subsampled_log_moments(_log_moments(max_order, 1, s), gamma) - slack**2 * n * gamma / 2
    typical = _subsampled_log_moments(_log_moments(max_order, k_star, s), gamma)
    values = _from_log_moments(lams, np.logaddexp(rare, typical))
    return float(values[0]) if scalar else values


# --- internals -------------------------------------------------------------------------------


def _log_moments(max_order: int, n: int, s: float) -> _ArrayF:
    """log E_n(λ) for λ = 0, 1, …, max_order (Liew & Takahashi 2022 Eq. (4); generating function, module docstring).

    Entry λ is (λ − 1)·ε_n(λ); entries 0 and 1 are 0. c(t)^j has no terms below degree 2j, so the
    j-th step works on degrees 2j..max_order only (index d stands for degree 2j + d).
    """
    size = max_order + 1
    k = np.arange(size)
    log_c = np.full(size, -np.inf)
    log_c[2:] = _log_expm1(s * k[2:] * (k[2:] - 1.0)) - gammaln(k[2:] + 1.0)
    log_n = math.log(n)
    users = min(max_order // 2, n)
    # log(C(n, j)/n^j) = Σ_{i<j} log1p(−i/n) − log j!, for j = 1..users (users ≤ n: no log 0).
    log_binom = np.cumsum(np.log1p(-np.arange(users) / n)) - gammaln(np.arange(2, users + 2))
    # Index pairs (row, col) with gap = row − col: Toeplitz layouts shared by every step.
    gap = k[:, None] - k[None, :]
    lower = gap >= 0
    gap_index = np.where(lower, gap, 0)
    tail = gap_index.astype(np.float64)  # λ − m (or m − i in the convolution)
    log_tail_fact = np.where(lower, -gammaln(tail + 1.0), -np.inf)  # −log (λ − m)!
    power = log_c[2:]  # c(t)^1 from degree 2
    log_excess = np.full(size, -np.inf)  # log((E_n(λ) − 1)/λ!)
    for j in range(1, users + 1):
        low = 2 * j
        width = size - low
        if j > 1:  # c(t)^j = c(t)^{j−1}·c(t): degrees 2(j−1).. times degrees 2..
            shifted = np.where(lower[:width, :width], power[gap_index[:width, :width]], -np.inf)
            power = _logsumexp(shifted + log_c[None, 2 : 2 + width], axis=1)
        degrees = k[low:]
        weight = power + log_binom[j - 1] + (j - degrees) * log_n  # C(n,j) n^{j−m} [t^m] c^j
        # × (1 − j/n)^{λ−m}/(λ−m)!; at j = n only λ = m survives (0^0 = 1).
        gaps = tail[:width, :width]
        scale = gaps * math.log1p(-j / n) if j < n else np.where(gaps > 0, -np.inf, 0.0)
        terms = weight[None, :] + scale + log_tail_fact[:width, :width]
        log_excess[low:] = np.logaddexp(log_excess[low:], _logsumexp(terms, axis=1))
    return np.logaddexp(0.0, log_excess + gammaln(k + 1.0))


def _subsampled_log_moments(base: _ArrayF, gamma: float) -> _ArrayF:
    """(λ − 1)·(Liew & Takahashi 2022 Eq. (10)) for λ = 0..len(base) − 1, from base log-moments (λ − 1)ε(λ).

    Wang, Balle & Kasiviswanathan (2019), Thm 9 with ε(∞) = ∞:
    log(1 + γ² C(λ,2) min{4(e^{ε(2)} − 1), 2e^{ε(2)}} + Σ_{j=3}^{λ} 2 γ^j C(λ,j) e^{(j−1)ε(j)}).
    """
    size = len(base)
    lam = np.arange(size, dtype=np.float64)
    j = lam.copy()
    log_gamma = math.log(gamma)
    second = min(math.log(4.0) + float(_log_expm1(base[2])), math.log(2.0) + base[2])
    with np.errstate(invalid="ignore"):
        log_choose = gammaln(lam[:, None] + 1.0) - gammaln(j[None, :] + 1.0) - gammaln(
            np.maximum(lam[:, None] - j[None, :], 0.0) + 1.0
        )
    per_j = np.where(j >= 3, math.log(2.0) + base, second) + j * log_gamma  # index j
    terms = np.where((j[None, :] >= 2) & (j[None, :] <= lam[:, None]), log_choose + per_j, -np.inf)
    return np.logaddexp(0.0, _logsumexp(terms, axis=1))


def _from_log_moments(lams: _ArrayF, log_moments: _ArrayF) -> _ArrayF:
    """ε(λ) = log E(λ)/(λ − 1), interpolating log E linearly between integers (WBK19, Cor. 10)."""
    low = np.floor(lams).astype(int)
    high = np.ceil(lams).astype(int)
    frac = lams - low
    log_e = (1.0 - frac) * log_moments[low] + frac * log_moments[high]
    return log_e / (lams - 1.0)


def _orders(owner: str, orders: object) -> tuple[_ArrayF, bool]:
    """Orders as a float array (each in (1, MAX_ORDER]) and whether the input was a scalar."""
    scalar = not isinstance(orders, (str, bytes)) and np.asarray(orders, dtype=object).ndim == 0
    values = [orders] if scalar else orders
    lams = float_array(owner, "orders", values, low=1.0, closed_low=False)
    if np.max(lams) > MAX_ORDER:
        constraint = f"orders each <= MAX_ORDER = {MAX_ORDER}"
        raise InvalidParameterError(owner, "orders", constraint, orders)
    return lams, scalar


def _max_order(lams: _ArrayF) -> int:
    """The largest integer order needed (at least 2, which Eq. (10) always uses)."""
    return max(2, int(np.ceil(np.max(lams))))


def _s(owner: str, sigma: object) -> float:
    """s = 1/(2σ²) for a valid noise multiplier σ."""
    return 1.0 / (2.0 * positive(owner, "sigma", sigma) ** 2)


def _log_expm1(x: NDArray[np.float64] | float) -> NDArray[np.float64]:
    """log(e^x − 1) for x > 0, without overflow for large x."""
    x = np.asarray(x, dtype=np.float64)
    small = np.log(np.expm1(np.minimum(x, 30.0)))
    return np.where(x > 30.0, x + np.log1p(-np.exp(-np.maximum(x, 30.0))), small)


def _logsumexp(values: _ArrayF, axis: int | None = None) -> _ArrayF:
    """log Σ exp(values) along ``axis``; −inf (not NaN) where every entry is −inf."""
    top = np.max(values, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        total = np.log(np.sum(np.exp(values - top), axis=axis, keepdims=True)) + top
    return np.squeeze(total, axis=axis) if axis is not None else total.reshape(())


def _partitions(total: int) -> Iterator[list[int]]:
    """Every partition of ``total`` ≥ 1 as a non-decreasing list of positive parts.

    Ascending-composition generation (Kelleher & O'Sullivan 2009): ``parts[:size]`` holds a prefix
    with remainder ``rest`` still to place; each step fixes the next part and emits the
    two-part and one-part completions.
    """
    parts = [0] * (total + 1)
    size = 1
    rest = total - 1
    while size:
        smallest = parts[size - 1] + 1
        size -= 1
        while 2 * smallest <= rest:
            parts[size] = smallest
            rest -= smallest
            size += 1
        last = size + 1
        while smallest <= rest:
            parts[size] = smallest
            parts[last] = rest
            yield parts[: size + 2]
            smallest += 1
            rest -= 1
        parts[size] = smallest + rest
        rest = smallest + rest - 1
        yield parts[: size + 1]
