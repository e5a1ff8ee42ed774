"""Privacy of the binary tree mechanism with Gaussian noise, released and pan-private.

The binary tree mechanism (Dwork, Naor, Pitassi & Rothblum 2010; Chan, Shi & Song 2011) releases
the prefix sums of a stream of T vectors x_1 … x_T (here: the gradient sums of T leaves) through
noisy partial sums over dyadic intervals, the *nodes*. Level j holds the intervals
[k·2^j, (k+1)·2^j) of 0-based leaf indices that end at or before T; a prefix of t leaves is the sum
of the nodes of the binary expansion of t (one per set bit), each a *left* child (k even), so
right children are never formed. Leaf ℓ is in the node of level j iff bit j of ℓ is 0 and that
node ends by T; leaf 0 is in one node per level: h = ⌊log₂ T⌋ + 1 nodes (:func:`tree_levels`),
the most of any leaf.

Each node gets independent Gaussian noise N(0, σ² I) (once, or in several draws whose variances
add). One leaf's vector enters the nodes containing it, each with ℓ₂ sensitivity Δ (a leaf's
gradient sum under replacement of one record: 2L), so all nodes together are h Gaussian
mechanisms — adaptively chosen, since later leaves' gradients depend on earlier releases, which
changes nothing: the composition of Gaussian mechanisms with sensitivities Δ_i and noise σ is
exactly the Gaussian mechanism with sensitivity (Σ Δ_i²)^{1/2} (its privacy loss is Gaussian;
Dong, Roth & Su 2022, Cor. 3.3, adaptive composition of μ-GDP; Kairouz et al. 2021, App. D for
the tree in DP-FTRL). The worst leaf gives sensitivity √h·Δ, so the tree is exactly as private
as one Gaussian mechanism with sensitivity √h·Δ and noise σ, whose profile δ(ε) is Balle & Wang
2018, Thm 8 (:func:`panpriv.accounting.gaussian.analytic_delta`). That is tight: leaf 0 reaches it
(the same vector in h independent noisy coordinates).

Pan-private form (the learner :mod:`panpriv.protocols.pan_ftrl`, proof in docs/privacy.md): every
node is *opened* with a draw Z ~ N(0, σ² I) when its first leaf begins, accumulates the records
as they arrive, and is *closed* with a second draw Z′ ~ N(0, σ² I) before it is released. One
intrusion plus every release is then, per node, a pair of independent views (Z + the records
before the intrusion, Z′ + the records after it) — the record is behind one draw of variance σ²
in each node that contains it — so the pan-private guarantee is this module's δ(ε) with ``draws
= 1`` and the outputs alone, each node carrying Z + Z′, have ``draws = 2``.

References
----------
Dwork, Naor, Pitassi & Rothblum (2010), "Differential privacy under continual observation".
Chan, Shi & Song (2011), "Private and continual release of statistics". Kairouz, McMahan, Song,
Thakkar, Thakurta & Xu (2021), "Practical and private (deep) learning without sampling or
shuffling", arXiv:2103.00039. Dong, Roth & Su (2022), "Gaussian differential privacy",
arXiv:1905.02383. Balle & Wang (2018), Thm 8.
"""

from __future__ import annotations

import math

from panpriv.accounting.gaussian import analytic_delta, analytic_epsilon, analytic_sigma
from panpriv.accounting.validation import positive, positive_int

__all__ = ["tree_delta", "tree_epsilon", "tree_levels", "tree_sigma"]


def tree_levels(leaves: int) -> int:
    """h = ⌊log₂ T⌋ + 1: the levels of a tree over T leaves, and the most nodes any leaf is in.

    Leaf 0 is in [0, 2^j) for every 2^j ≤ T; a leaf is in at most one node per level.
    """
    return positive_int("tree_levels", "leaves", leaves).bit_length()


def tree_sigma(epsilon: float, delta: float, leaves: int, sensitivity: float = 1.0) -> float:
    """σ of one draw such that the tree over ``leaves`` leaves, each node behind one draw of σ, is
    (ε, δ)-DP for a leaf of ℓ₂ sensitivity Δ: the analytic Gaussian σ for sensitivity √h·Δ."""
    h = tree_levels(leaves)
    sensitivity = positive("tree_sigma", "sensitivity", sensitivity)
    return analytic_sigma(epsilon, delta, math.sqrt(h) * sensitivity)


def tree_delta(epsilon: float, sigma: float, leaves: int, sensitivity: float = 1.0, draws: int = 1) -> float:
    """δ(ε) of the tree over ``leaves`` leaves whose nodes each carry ``draws`` independent draws of
    σ (noise variance draws·σ²), for a leaf of ℓ₂ sensitivity Δ (module docstring).

    ``draws = 1``: one intrusion plus every release of the pan-private tree; ``draws = 2``: its
    releases alone."""
    h = tree_levels(leaves)
    sigma = positive("tree_delta", "sigma", sigma)
    draws = positive_int("tree_delta", "draws", draws)
    sensitivity = positive("tree_delta", "sensitivity", sensitivity)
    return analytic_delta(epsilon, sigma * math.sqrt(draws), math.sqrt(h) * sensitivity)


def tree_epsilon(sigma: float, delta: float, leaves: int, sensitivity: float = 1.0, draws: int = 1) -> float:
    """The smallest ε with :func:`tree_delta` (ε) ≤ δ."""
    h = tree_levels(leaves)
    sigma = positive("tree_epsilon", "sigma", sigma)
    draws = positive_int("tree_epsilon", "draws", draws)
    sensitivity = positive("tree_epsilon", "sensitivity", sensitivity)
    return analytic_epsilon(sigma * math.sqrt(draws), delta, math.sqrt(h) * sensitivity)
