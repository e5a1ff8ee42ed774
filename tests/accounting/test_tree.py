"""Tests for panpriv.accounting.tree: the (pan-private) binary tree mechanism with Gaussian noise.

Oracles, each independent of the module's formula:

- a brute force over small trees (T ≤ 70): the nodes are built from the prefix decompositions they
  serve (every node the binary expansion of some t ≤ T uses), and the worst leaf's count of nodes
  is compared with :func:`tree_levels`;
- the exact privacy of the *linear Gaussian views* an adversary gets, built draw by draw: for
  views V = M·x + A·z (x the leaves' values, z independent standard draws), two neighbouring
  streams differing in leaf ℓ by a unit vector are distinguished exactly as the Gaussian mechanism
  with μ² = uᵀ(AAᵀ)⁺u (u = M's column ℓ; μ = ∞ when u is outside AAᵀ's range). This checks, leaf
  by leaf and for every intrusion time, the pan-private proof of docs/privacy.md (one intrusion plus
  every release is behind one draw per node), that the releases alone carry two, the
  checkpoint rule of :mod:`panpriv.protocols.pan_ftrl` (every checkpoint ever persisted, plus one
  intrusion, plus every release) and that persisting open nodes *without* that rule lets two
  checkpoints reveal a clean sum;
- dp-accounting's PLD accountant composing h Gaussian mechanisms.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from panpriv.accounting.errors import InvalidParameterError
from panpriv.accounting.gaussian import analytic_delta, analytic_sigma
from panpriv.accounting.tree import tree_delta, tree_epsilon, tree_levels, tree_sigma

# -- the tree, built from the prefix sums it serves -----------------------------------------------


def served_nodes(leaves: int) -> list[tuple[int, int]]:
    """Every node [start, stop) some prefix t ≤ T is made of: t's binary expansion, high bits first."""
    nodes = set()
    for t in range(1, leaves + 1):
        start = 0
        for level in reversed(range(t.bit_length())):
            if t >> level & 1:
                nodes.add((start, start + 2**level))
                start += 2**level
        assert start == t
    return sorted(nodes, key=lambda node: (node[1], node[0]))


@pytest.mark.parametrize("leaves", range(1, 71))
def test_the_worst_leaf_is_in_tree_levels_nodes(leaves: int) -> None:
    nodes = served_nodes(leaves)
    counts = [sum(start <= leaf < stop for start, stop in nodes) for leaf in range(leaves)]
    assert max(counts) == tree_levels(leaves) == math.floor(math.log2(leaves)) + 1
    assert counts[0] == max(counts)  # leaf 0: [0, 2^j) for every level


# -- the linear Gaussian views of one intrusion, checkpoints and the releases --------------------


class Views:
    """Observations V = M x + A z of a pan-private tree over T leaves of ``per_leaf`` records each,
    built as the learner builds its state: a node draws Z (σ = 1) when its first record arrives,
    adds its records, draws Z′ and is released when its last record has been added. Times count
    records. ``intrusion``: the open nodes are read at that time. ``checkpoints``: times at which
    the open nodes are persisted — with ``renoise``, after one fresh draw is added to each open
    node, and followed by another (the learner's rule); without, as they are."""

    def __init__(
        self, leaves: int, intrusion: int | None, checkpoints: tuple[int, ...] = (), renoise: bool = True,
        per_leaf: int = 2,
    ):
        self.records = leaves * per_leaf
        self.rows_m: list[np.ndarray] = []
        self.rows_a: list[dict[int, float]] = []
        self.draws = 0
        nodes = [(start * per_leaf, stop * per_leaf) for start, stop in served_nodes(leaves)]
        state: dict[tuple[int, int], tuple[np.ndarray, dict[int, float]]] = {}
        for time in range(self.records + 1):
            if time in checkpoints:
                for m, a in state.values():
                    if renoise:
                        a[self._draw()] = 1.0
                    self._observe(m, a)
                    if renoise:
                        a[self._draw()] = 1.0
            if time == intrusion:
                for m, a in state.values():
                    self._observe(m, a)
            if time == self.records:
                break
            for node in nodes:  # nodes whose first record this is are opened with a draw
                if node[0] == time:
                    state[node] = (np.zeros(self.records), {self._draw(): 1.0})
            for m, _ in state.values():
                m[time] += 1.0
            for node in [n for n in state if n[1] == time + 1]:  # nodes ending here: Z′ and release
                m, a = state.pop(node)
                a[self._draw()] = 1.0
                self._observe(m, a)

    def _draw(self) -> int:
        self.draws += 1
        return self.draws - 1

    def _observe(self, m: np.ndarray, a: dict[int, float]) -> None:
        self.rows_m.append(m.copy())
        self.rows_a.append(dict(a))

    def worst_mu_squared(self) -> float:
        """max over records of uᵀ(AAᵀ)⁺u, ∞ if some record's column is outside the noise's range."""
        M = np.array(self.rows_m)
        A = np.zeros((len(self.rows_a), self.draws))
        for i, row in enumerate(self.rows_a):
            for j, value in row.items():
                A[i, j] = value
        cov = A @ A.T
        pinv = np.linalg.pinv(cov, rcond=1e-10, hermitian=True)
        worst = 0.0
        for record in range(self.records):
            u = M[:, record]
            if np.linalg.norm(cov @ (pinv @ u) - u) > 1e-8:  # not in the range: a clean sum is visible
                return math.inf
            worst = max(worst, float(u @ pinv @ u))
        return worst


@pytest.mark.parametrize("leaves", [1, 2, 3, 5, 8, 11, 16])
def test_releases_alone_are_behind_two_draws_per_node(leaves: int) -> None:
    assert Views(leaves, intrusion=None).worst_mu_squared() == pytest.approx(tree_levels(leaves) / 2)


@pytest.mark.parametrize("leaves", [1, 2, 3, 5, 8, 11, 16])
def test_one_intrusion_at_any_time_plus_every_release_is_behind_one_draw_per_node(leaves: int) -> None:
    worst = max(Views(leaves, intrusion=time).worst_mu_squared() for time in range(2 * leaves + 1))
    assert worst == pytest.approx(tree_levels(leaves), rel=1e-9)


@pytest.mark.parametrize("leaves", [5, 8, 11])
def test_every_checkpoint_plus_one_intrusion_plus_every_release_with_the_renoising_rule(leaves: int) -> None:
    """Any set of checkpoints (persisted forever, old copies included) with one intrusion at any
    time: still one draw of σ per node between the adversary and each leaf (every pair and, for 5
    leaves, every triple of checkpoint times)."""
    h = tree_levels(leaves)
    for count in (1, 2, 3) if leaves <= 5 else (1, 2):
        for checkpoints in itertools.combinations(range(1, 2 * leaves), count):
            for intrusion in (None, *range(2 * leaves + 1)):
                mu2 = Views(leaves, intrusion, checkpoints).worst_mu_squared()
                assert mu2 <= h * (1 + 1e-9), (checkpoints, intrusion, mu2)


def test_two_checkpoints_of_an_open_node_without_the_rule_differ_by_a_clean_sum() -> None:
    """Persisting open nodes as they are: two checkpoints inside the root's span differ by the
    records between them, in the clear (μ = ∞); so do one checkpoint and an intrusion."""
    assert Views(8, intrusion=None, checkpoints=(4, 11), renoise=False).worst_mu_squared() == math.inf
    assert Views(8, intrusion=13, checkpoints=(4,), renoise=False).worst_mu_squared() == math.inf
    assert Views(8, intrusion=None, checkpoints=(7,), renoise=False).worst_mu_squared() < math.inf


# -- the formulas -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("leaves", "draws"), [(1, 1), (16, 1), (1000, 1), (1000, 2), (2**20 - 1, 1)])
def test_delta_is_one_gaussian_with_sensitivity_sqrt_h(leaves: int, draws: int) -> None:
    h = tree_levels(leaves)
    assert tree_delta(1.0, 9.0, leaves, 2.0, draws) == pytest.approx(
        analytic_delta(1.0, 9.0 * math.sqrt(draws), 2.0 * math.sqrt(h)), rel=1e-12
    )


@pytest.mark.parametrize(("epsilon", "delta", "leaves"), [(0.5, 1e-6, 100), (1.0, 1e-6, 4096), (4.0, 1e-5, 10**6)])
def test_sigma_meets_its_target_and_epsilon_inverts_delta(epsilon: float, delta: float, leaves: int) -> None:
    sigma = tree_sigma(epsilon, delta, leaves, 2.0)
    assert tree_delta(epsilon, sigma, leaves, 2.0) <= delta
    assert tree_delta(epsilon, sigma * (1 - 1e-6), leaves, 2.0) > delta
    assert tree_epsilon(sigma, delta, leaves, 2.0) == pytest.approx(epsilon, rel=1e-9)
    assert tree_epsilon(sigma, delta, leaves, 2.0, draws=2) < epsilon  # the releases alone


@pytest.mark.parametrize(("leaves", "multiplier"), [(64, 4.0), (5000, 12.0)])
def test_dp_accountings_pld_composing_h_gaussians_agrees(leaves: int, multiplier: float) -> None:
    h = tree_levels(leaves)
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_event.GaussianDpEvent(multiplier), count=h)
    ours = tree_delta(1.0, multiplier, leaves)
    theirs = accountant.get_delta(1.0)
    assert ours <= theirs * (1 + 1e-9) and ours == pytest.approx(theirs, rel=2e-2)


def test_arguments_are_validated() -> None:
    with pytest.raises(InvalidParameterError, match="leaves"):
        tree_levels(0)
    with pytest.raises(InvalidParameterError, match="draws"):
        tree_delta(1.0, 1.0, 4, draws=0)
    with pytest.raises(InvalidParameterError, match="sensitivity"):
        tree_sigma(1.0, 1e-6, 4, sensitivity=-1.0)
    assert tree_sigma(1.0, 1e-6, 1) == analytic_sigma(1.0, 1e-6)
