"""Secure summation from a shuffler: the "split and mix" protocol (Ishai, Kushilevitz, Ostrovsky &
Sahai 2006), with a message count this module proves and computes.

The protocol
------------
n users each hold xᵢ ∈ G = Z_q^d, q = 2^k. User i draws sᵢ₁, …, sᵢ,ₘ₋₁ uniformly from G and
sets sᵢₘ = xᵢ − Σⱼ<ₘ sᵢⱼ, so her m shares are uniform subject to summing to xᵢ
(:func:`split`). A shuffler hands the analyzer the n·m shares of the round as a uniformly permuted
multiset; their sum is Σᵢ xᵢ mod q (:func:`recombine`), which is the true sum whenever it is
below q (``q > n·max xᵢⱼ``, :func:`modulus_bits`). With q a power of two, a uniform share is k
uniform bits: drawn from OS entropy and masked, exactly uniform (no rejection, no float).

Why the analyzer's view is (almost) only the sum
------------------------------------------------
Let V(x) be the shuffled multiset of shares of the inputs x = (x₁, …, xₙ) with Σ xᵢ = s, and U_s
the multiset of n·m elements of G drawn uniformly among all sequences of G^{nm} summing to s —
a function of s alone. The bound below, :func:`distance_bound`, is

    TV(V(x), U_s) ≤ τ(n, m, |G|) := ½·√(Σ_{K=1}^{n−1} A(K)·e_K),

    A(K) = (n−1)!·n!·((n−K)m)! / ((n−1−K)!·(n−K)!·(nm)!),
    e_K  = [z^K] exp((|G| − 1)·W(z)),   W(z) = Σ_{k≥1} (km)!/(k!)² · z^k.

It holds for every finite abelian group G (here Z_q^d taken whole, |G| = q^d: no per-coordinate
union bound is used). Proof (χ² / second-moment method):

1. A multiset M of n·m elements summing to s has P[V(x) = M] = N_x(M)·|G|^{−n(m−1)} and
   P[U_s = M] = N(M)·|G|^{−(nm−1)}, where N(M) counts the sequences of G^{nm} with multiset M and
   N_x(M) those whose i-th block of m entries sums to xᵢ for every i. So the likelihood ratio is
   r(M) = |G|^{n−1}·p(M), with p(M) = N_x(M)/N(M) = P_π[the blocks of π(Y) sum to x] for any
   sequence Y with multiset M and π a uniform permutation.
2. TV = ½·E_U|r − 1| ≤ ½·√(E_U[r²] − 1) (Cauchy–Schwarz; E_U r = 1). With Y uniform with sum s
   and π, π′ independent, E_U[r²] = |G|^{2n−2}·E_{π,π′} P_Y[both block partitions sum to x].
3. Fix π, π′ and draw the bipartite multigraph with the n blocks of π on the left, the n blocks of
   π′ on the right and one edge per position. The map Y ↦ (block sums, block sums) is a group
   homomorphism whose image is {(a, a′): Σ_C a = Σ_C a′ for each connected component C} (a
   spanning tree realises any such values, in any abelian group); with the total fixed to s the
   image is a coset of size |G|^{2n−c−1} (c components), hit uniformly. So
   P_Y[…] ≤ |G|^{−(2n−c−1)} and E_U[r²] ≤ E[|G|^{c−1}].
4. Call a set S of left blocks *closed* if the positions of S are a union of right blocks. The
   c − 1 components not containing block 1 are disjoint closed sets, so
   |G|^{c−1} = Σⱼ C(c−1, j)(|G|−1)^j ≤ Σⱼ (|G|−1)^j·Nⱼ, Nⱼ the number of unordered families of
   j disjoint non-empty closed sets avoiding block 1. For fixed disjoint S₁, …, Sⱼ of sizes
   k₁, …, kⱼ (K = Σ kₗ), counting partitions of the positions into blocks of m gives
   P[all closed] = n!·Π(kₗm)!·((n−K)m)! / (Π kₗ!·(n−K)!·(nm)!). Summing over the
   (n−1)!/(Π kₗ!·(n−1−K)!·j!) families of each size tuple gives exactly
   E[|G|^{c−1}] − 1 ≤ Σ_K A(K)·[z^K](exp((|G|−1)W(z)) − 1), i.e. the bound. ∎

Ghazi, Manurangsi, Pagh & Velingker 2020 (EUROCRYPT, arXiv:1909.11073) and Balle, Bell, Gascón &
Nissim 2020 (CCS, arXiv:2002.00817; and their note arXiv:1909.11225) prove bounds of the same
form for G = Z_q: m = O(1 + (σ + log q)/log n) messages give distance 2^−σ. Their theorem
statements (constants and side conditions) were not available to this implementation in a form
that could be checked, so it does **not** use their constants: it uses the bound above, proved
here and evaluated exactly (in log space) at the deployment's (n, m, |G|). For comparison only,
``tests/protocols/test_secure_sum.py`` evaluates the closed forms as we recall them,
⌈(2σ + log₂|G|)/(log₂ n − log₂ e)⌉ + 1 (BBGN) and ⌈(2σ + log₂|G|)/log₂ n⌉ + 2 (GMPV): at the
deployed sizes they ask for *more* shares than the bound here (n = 256, d = 20, q = 2^16: 70 and
58 against 50; d = 100, q = 2^17: 280 and 231 against 214; tested), so nothing would be gained
by them. Two kinds of terms dominate: j = 1, K = 1 (one user's shares form a closed set:
|G|·n(n−1)/C(nm, m)) and j = n − 1 (π′ a relabelling of π: |G|^{n−1}·n!(m!)^n/(nm)!): the first
asks m·log₂(e·n) ≳ log₂|G| + 2σ + 2 log₂ n, the second m·log₂ n ≳ log₂|G|, so
m = O(1 + (σ + log |G|)/log n) — the form of those theorems, with log₂(e·n) where the recalled
BBGN form has log₂(n/e).

Colluding users (the honest fraction γ)
---------------------------------------
k users who collude with the analyzer hand it their inputs and shares (or send shares of their
choosing): the analyzer can remove their units, and what hides an honest user's shares is the
split and mix of the n − k others only. The bound is therefore evaluated at the number of honest
users, h = ⌈γn⌉ for a declared honest fraction γ — the same count PVEC's robust calibration relies
on (Cheu et al. 2022, Def. A.7; :attr:`panpriv.accounting.binomial.PVECParameters.noisy_users`) —
and m is chosen for it (:func:`round_plan`). Why one h suffices when more users are honest: for
an honest user i and any set H of exactly h honest users containing her, give the analyzer, on top
of its view, the inputs and shares of every user outside H. Its actual view (the shuffled multiset
of all n·m shares) is a randomized function of V_H(x_H) — H's shares, shuffled — and of that side
information, which has the same law whether i's input is x_i or x′_i. V_H is within τ(h, m, |G|)
of U_{T_H}, and T_H = T − Σ_{j∉H} x_j is a function of the totals and the side information, so the
hybrid argument below goes through with τ(h, m, |G|) and PVEC's totals, whose guarantee holds
because the h users of H add their noise. The modulus still covers all n inputs (q > n·max xᵢⱼ).
At γ = 1 (h = n) colluding clients are outside the model: with k of them the crowd is n − k and
τ(n, m, |G|) says nothing about it (at d = 100, q = 2^17, n = 256, m = 214 it is 2^−150 for k = 0
and vacuous from k = 6 on: tested).

Use with DP (the hybrid argument)
---------------------------------
If the totals T = Σᵢ xᵢ are released by an (ε, δ)-DP mechanism (PVEC's totals: Cheu et al. 2022,
Thm 3.2) and the analyzer's view is V(x) with TV(V(x), U_T) ≤ τ for every realisation, then for
neighbouring D, D′ and every event E: P[V(D) ∈ E] ≤ P[U_{T(D)} ∈ E] + τ ≤ e^ε·P[U_{T(D′)} ∈ E] + δ + τ
≤ e^ε·P[V(D′) ∈ E] + δ + (1 + e^ε)·τ. So the view, and all the analyzer computes from it, is
(ε, δ + (1 + e^ε)·τ)-DP (:func:`added_delta`).

References
----------
Ishai, Kushilevitz, Ostrovsky & Sahai (2006), "Cryptography from anonymity", FOCS 2006 (the
protocol); Ghazi, Manurangsi, Pagh & Velingker (2020) and Balle, Bell, Gascón & Nissim (2020)
(message counts of the same form, not used numerically); Cheu et al. 2022, Def. A.7 (the honest
fraction of robust shuffle privacy).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.bisection import least_passing
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.randomness import fill_from_os

SECURITY_BITS = 64
"""σ: the analyzer's view is within 2^−σ of a function of the totals (:func:`shares_needed`)."""

MAX_MODULUS_BITS = 32
"""Shares are stored as uint32: q = 2^k with k ≤ 32."""

_LN2 = math.log(2.0)


def modulus_bits(users: int, max_value: int) -> int:
    """k of q = 2^k: the least with 2^k > users·max_value, so a sum of ``users`` inputs in
    [0, max_value] is exact mod q."""
    if users < 1 or max_value < 1:
        raise InvalidInputError(f"modulus_bits: users and max_value must be >= 1; got {users}, {max_value}")
    bits = (users * max_value).bit_length()
    if bits > MAX_MODULUS_BITS:
        raise InvalidInputError(f"modulus_bits: {users} x {max_value} needs {bits} > {MAX_MODULUS_BITS} bits")
    return bits


def _logsumexp(values: NDArray[np.float64]) -> float:
    top = float(np.max(values))
    return top + math.log(float(np.sum(np.exp(values - top))))


def log2_chi_square(users: int, shares: int, log2_group: float) -> float:
    """log₂ of the χ² bound Σ_K A(K)·e_K of the module docstring (−inf for a single user: the
    view is then a function of the sum itself)."""
    n, m = users, shares
    if n < 1 or m < 1 or log2_group <= 0:
        raise InvalidInputError(f"log2_chi_square: need users, shares >= 1 and log2_group > 0; got {n}, {m}, {log2_group}")
    if n == 1:
        return -math.inf
    log_lambda = log2_group * _LN2  # ln(|G| − 1) ≤ ln|G|: an upper bound
    k = np.arange(1, n, dtype=np.float64)
    lg = math.lgamma
    log_w = np.array([lg(km + 1) - 2.0 * lg(kk + 1) for kk, km in zip(k, k * m)])  # ln (km)!/(k!)²
    log_e = np.empty(n)  # ln e_K, K = 0 … n−1 (recurrence K·e_K = Λ·Σ_k k·w_k·e_{K−k})
    log_e[0] = 0.0
    for K in range(1, n):
        terms = np.log(k[:K]) + log_w[:K] + log_e[K - 1 :: -1][:K]
        log_e[K] = log_lambda + _logsumexp(terms) - math.log(K)
    log_a = np.array([lg(n) + lg(n + 1) + lg((n - j) * m + 1) - lg(n - j) - lg(n - j + 1) - lg(n * m + 1) for j in range(1, n)])
    return _logsumexp(log_a + log_e[1:]) / _LN2


def distance_bound(users: int, shares: int, log2_group: float) -> float:
    """τ: TV(view, a function of the sum) ≤ ½·√χ² (module docstring; capped at 1)."""
    return min(1.0, 0.5 * 2.0 ** (0.5 * log2_chi_square(users, shares, log2_group)))


@functools.lru_cache(maxsize=256)
def shares_needed(users: int, log2_group: float, sigma: int = SECURITY_BITS) -> int:
    """The least m ≥ 2 with :func:`distance_bound` ≤ 2^−σ (the bound decreases in m; the m
    returned is checked directly, so the guarantee never rests on that)."""
    if users < 2:
        raise InvalidInputError(f"shares_needed: a round needs >= 2 users to hide anything; got {users}")

    def passes(m: int) -> bool:
        return log2_chi_square(users, m, log2_group) <= 2 * (1 - sigma)

    high = 2
    while not passes(high):
        high *= 2
    return least_passing(high // 2, high, passes)  # high // 2 fails (or is 1)


@dataclass(frozen=True)
class SumPlan:
    """The secure sum of one round: n users, h of them assumed honest (module docstring,
    "Colluding users"), shares in Z_q^d with q = 2^bits, m shares each, distance τ."""

    users: int
    honest: int
    dim: int
    bits: int
    shares: int
    tau: float


def round_plan(users: int, honest: int, dim: int, max_value: int, sigma: int = SECURITY_BITS) -> SumPlan:
    """The secure sum of a round of ``users`` inputs in [0, ``max_value``]^``dim``, ``honest`` of
    whose senders are honest: q covers every input (:func:`modulus_bits`), m and τ are those of the
    honest users (:func:`shares_needed`, :func:`distance_bound`). The one rule the analyzer and
    every client apply (each recomputes it from the public plan)."""
    if not 2 <= honest <= users:
        raise InvalidInputError(f"round_plan: need 2 <= honest users <= users; got {honest} of {users}")
    bits = modulus_bits(users, max_value)
    log2_group = dim * bits
    shares = shares_needed(honest, log2_group, sigma)
    return SumPlan(users, honest, dim, bits, shares, distance_bound(honest, shares, log2_group))


def added_delta(epsilon: float, tau: float) -> float:
    """(1 + e^ε)·τ: what the view's distance τ adds to δ (module docstring, the hybrid argument)."""
    return (1.0 + math.exp(epsilon)) * tau


def split(values: NDArray[np.integer], shares: int, bits: int) -> NDArray[np.uint32]:
    """m additive shares of ``values`` (d,) in Z_{2^bits}^d, uniform subject to their sum:
    shape (m, d), uint32. The first m − 1 rows are OS entropy masked to ``bits`` bits."""
    x = np.asarray(values)
    if x.ndim != 1 or not np.issubdtype(x.dtype, np.integer) or shares < 1 or not 1 <= bits <= MAX_MODULUS_BITS:
        raise InvalidInputError(f"split: need integer values of shape (d,), shares >= 1, 1 <= bits <= 32; got {x.dtype} {x.shape}, {shares}, {bits}")
    mask = np.uint32((1 << bits) - 1)
    out = np.empty((shares, x.size), dtype=np.uint32)
    if shares > 1:
        fill_from_os(out[: shares - 1])
        out[: shares - 1] &= mask
    last = out[shares - 1]
    np.bitwise_and(x.astype(np.uint64), np.uint64(mask), out=last, casting="unsafe")
    last -= out[: shares - 1].sum(axis=0, dtype=np.uint32)  # wraps mod 2^32, masked below
    last &= mask
    return out


def recombine(shares: NDArray[np.integer], bits: int) -> NDArray[np.int64]:
    """Σ of the rows of ``shares`` (u, d) mod 2^bits, as int64 (d,)."""
    s = np.asarray(shares)
    if s.ndim != 2 or not np.issubdtype(s.dtype, np.integer) or not 1 <= bits <= MAX_MODULUS_BITS:
        raise InvalidInputError(f"recombine: need integer shares of shape (u, d) and 1 <= bits <= 32; got {s.dtype} {s.shape}, {bits}")
    total = s.sum(axis=0, dtype=np.uint64) & np.uint64((1 << bits) - 1)
    return total.astype(np.int64)
