"""Pan-private DP-FTRL by tree aggregation ("pan-ftrl"): follow-the-regularised-leader on noisy prefix sums.

DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta & Xu 2021, Alg. 1) takes, after each *leaf*
of B records, the step

    θ_{c+1} = argmin_{θ ∈ Θ}  ⟨S̃_c, θ⟩ + ‖θ − θ₀‖²/(2η) + (λR_c/2)‖θ‖²
            = Π_Θ((θ₀/η − S̃_c)/(1/η + λR_c)),

where S̃_c is a noisy prefix sum of the leaves' gradient sums g_1 … g_c (each record's gradient
taken at the iterate of its leaf and clipped to norm L), R_c the records in those leaves and λ the
loss's ridge (exact, not linearised). The prefix sums come from the binary tree mechanism
(:mod:`panpriv.accounting.tree`): noisy partial sums over dyadic blocks of leaves, the *nodes*, a
prefix of c leaves being the sum of the nodes of c's binary expansion. One record is in at most
h = ⌊log₂ T⌋ + 1 nodes of a tree over T leaves, so the noise of a prefix grows like log T, not like
√T: the learner can take many small steps — the trade that one-pass learners with disjoint noisy
batches (pan-acsa) cannot make.

Pan-privacy (Cheu et al. 2022, Def. C.2; argument in docs/privacy.md, "pan-ftrl"). DP-FTRL as
published keeps each node's clean partial sum until the node is complete; an intrusion would read
it. Here a node is *opened* with a draw Z ~ N(0, σ² I) when its first record arrives (the state
holds Z + the records so far, never less), every record's clipped gradient is added to every open
node that contains its leaf, and a node is *closed* with a second draw Z′ ~ N(0, σ² I) when its
last record has been added; only then is it used. The records of a node before an intrusion are
behind Z, those after it behind Z′ (the closed value minus the intruded one is Z′ plus them), and
each node's two views have independent noise: one intrusion plus every node ever used is h
Gaussian mechanisms of noise σ for each record, which :func:`panpriv.accounting.tree.tree_sigma`
calibrates to (ε, δ) exactly. The outputs alone carry Z + Z′ per node (``draws = 2``): a smaller ε
at the same δ, which the report gives. Leaf 0's record reaches the bound, so it is tight.

Only the nodes the prefix sums use are formed (left children in the tree); a node that would end
after leaf T is never opened. At any moment the state holds at most h open nodes, at most h closed
nodes (those of the current binary expansion), the centre θ₀ of the epoch, the iterate and the
running average: (2h + 3)·p floats.

Checkpoints (:meth:`PanPrivateFTRL.checkpoint_state`). An open node persisted at two times would
let the two copies differ by the records between them, in the clear; so would a persisted copy and
a later intrusion. Before a state is persisted every open node gets a fresh draw W, and right after
it another one V, so any two observations of a node — persisted states, old copies included, one
intrusion, the release — are separated by an independent draw of σ: each record is still behind
one draw per node, and the guarantee is unchanged (checked draw by draw for small trees in
tests/accounting/test_tree.py). A restored learner adds such a draw before it learns
(:meth:`PanPrivateFTRL.resumed`). The price is utility: a node open across k checkpoints is
released with (2 + 2k)σ² instead of 2σ².

The plan, by rules that read no data (:class:`Plan`): leaves of B = ⌈2√2·s·√p/ln 2⌉ records
(s the unit-sensitivity σ at (ε, δ)), which minimises the B + 2√2·s·√p·h(n/B) of FTRL's regret
bound with the tree's noise (noise in the prefix sums ∝ h(T), steps T = n/B); and η = r/(σ_pre·√p),
σ_pre = σ√h the standard deviation of a prefix sum's noise per coordinate (two draws per node, h/2
nodes in an average binary expansion), so that the noise moves the unprojected iterate by about the
radius r. The released parameters are the average of the epoch's iterates (the online-to-batch
conversion of FTRL's regret bound); ``output="last"`` releases the last iterate instead. Measured
in ``benchmarks/utility_ftrl.py`` on the synthetic and real data sets.

Stream length: the first epoch plans for ``horizon`` records (``None``: :data:`FIRST_EPOCH`); each
further epoch is twice as long, has its own tree, and restarts FTRL from the previous epoch's
output. Every record is in one leaf of one epoch, so the guarantee does not change.

References
----------
Kairouz et al. 2021 (arXiv:2103.00039), Alg. 1 and App. D (privacy of the tree with adaptive
inputs); Dwork, Naor, Pitassi & Rothblum 2010 and Chan, Shi & Song 2011 (binary tree mechanism);
Cheu et al. 2022, Def. C.2 and App. C (pan-privacy; noise at a batch's start, pan-acsa);
Balle & Wang 2018, Thm 8 (analytic Gaussian).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.gaussian import analytic_sigma
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.accounting.tree import tree_epsilon, tree_levels, tree_sigma
from panpriv.protocols import scratch
from panpriv.protocols import validation as check
from panpriv.protocols.acsa import effective_gradient_bound
from panpriv.protocols.base import Learner, StateValue, check_batch, doubling_epochs_beyond
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON, DEFAULT_LOSS
from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.losses import Loss
from panpriv.protocols.pan_acsa import FIRST_EPOCH, SENSITIVITY_SLACK
from panpriv.protocols.randomness import RngLike
from panpriv.protocols.rounds import round_slices
from panpriv.protocols.scratch import BLOCK_ROWS

Array = NDArray[np.float64]

Output = Literal["average", "last"]
OUTPUTS: tuple[Output, ...] = ("average", "last")

_OWNER = "PanPrivateFTRL"
_COUNTERS = ("records", "epoch", "leaf", "filled")
_VECTORS = ("center", "theta", "average")
_NODES = ("open_nodes", "closed_nodes")


@dataclass(frozen=True)
class Plan:
    """One epoch's public plan: ``records`` in ``leaves`` leaves (sizes ⌊n/T⌋ or ⌊n/T⌋ + 1), the
    tree's ``levels`` h, the standard deviation ``sigma`` of every draw (for a leaf's gradient sum,
    sensitivity 2L) and the step size ``eta``."""

    records: int
    leaves: int
    levels: int
    sigma: float
    eta: float

    def leaf_size(self, leaf: int) -> int:
        """Records in leaf ``leaf`` (0-based): the first n mod T leaves have one more."""
        base, extra = divmod(self.records, self.leaves)
        return base + (1 if leaf < extra else 0)

    def opened_at(self, leaf: int) -> list[int]:
        """Levels whose node begins with leaf ``leaf``: left children [leaf, leaf + 2^j) that end
        by T (bits 0..j of ``leaf`` are 0)."""
        return [j for j in range(self.levels) if leaf % (2 << j) == 0 and leaf + (1 << j) <= self.leaves]

    def open_levels(self, leaf: int, started: bool) -> list[int]:
        """Levels of the nodes open while leaf ``leaf`` is (``started``) or is about to be learned:
        the left children containing it that end by T, less, before its first record, those it begins."""
        levels = []
        for j in range(self.levels):
            start = leaf >> j << j
            if (leaf >> j) & 1 == 0 and start + (1 << j) <= self.leaves and (started or start < leaf):
                levels.append(j)
        return levels

    @staticmethod
    def closing_level(completed: int) -> int:
        """The level of the one node that ends when ``completed`` leaves are done: its trailing zeros."""
        return (completed & -completed).bit_length() - 1


def leaf_size_rule(params: int, unit_sigma: float) -> int:
    """B = ⌈2√2·s·√p/ln 2⌉ (module docstring): where B + c·log₂(n/B), c = 2√2·s·√p, is least."""
    return max(1, math.ceil(2.0 * math.sqrt(2.0) * unit_sigma * math.sqrt(params) / math.log(2.0)))


class PanPrivateFTRL(Learner):
    """Pan-private DP-FTRL with the binary tree mechanism (module docstring).

    Parameters
    ----------
    dim
        Number of raw features d (the model has d + 1 parameters with an intercept).
    loss
        A :class:`panpriv.protocols.losses.Loss`, its name or its config dict; a name (``"logistic"``)
        or a config dict without ``intercept`` learns an intercept
        (:func:`panpriv.protocols.losses.learner_loss`). Any convex loss: FTRL linearises it
        (subgradients for the non-smooth ones); a ridge term is kept exact. Default:
        ``"logistic"`` (:mod:`panpriv.protocols.defaults`).
    epsilon, delta
        The per-record guarantee for one intrusion plus all outputs; the outputs alone get a
        smaller ε at the same δ (two draws per node).
        Defaults: ε = 1, δ = 1e-6 (:mod:`panpriv.protocols.defaults`, the service's too).
    horizon
        Records in the first epoch (the planned stream length n); ``None``: :data:`FIRST_EPOCH`.
    leaf_size
        Records per leaf B; ``None`` (default): :func:`leaf_size_rule`, at most n/16.
    eta
        FTRL's step size η (the regulariser ‖θ − θ₀‖²/(2η) on gradient *sums*); ``None``
        (default): r/(σ√h·√p) (module docstring).
    radius
        Radius r of Θ; ``None`` (default): r = √d, never below 1 (:func:`panpriv.protocols.base.default_radius`).
    feature_bound
        R: features are clipped to norm R (an intercept feature is added after clipping).
    gradient_bound
        C: per-record gradients are clipped to min(C, L), L the loss's bound over Θ; ``None``: L.
    output
        ``"average"`` (default): release the average of the epoch's iterates; ``"last"``: the last.
    rng
        ``None`` (default): every draw from a generator keyed from OS entropy and zeroed after it
        (pan-private). A seed or generator: the labelled replay/testing mode, without the
        pan-private guarantee.
    """

    name = "pan-ftrl"

    @classmethod
    def unit_test_params(cls) -> list[dict[str, Any]]:
        """Parameters for the catalogue's conformance test (see :meth:`Learner.unit_test_params`)."""
        return [
            {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "horizon": 40, "leaf_size": 3, "radius": 20.0},
            {"dim": 3, "loss": {"name": "hinge", "ridge": 0.1}, "epsilon": 2.0, "delta": 1e-5, "horizon": 12,
             "leaf_size": 2, "radius": 20.0, "output": "last"},
        ]

    def __init__(
        self,
        dim: int,
        loss: Loss | Mapping[str, Any] | str = DEFAULT_LOSS,
        epsilon: float = DEFAULT_EPSILON,
        delta: float = DEFAULT_DELTA,
        horizon: int | None = None,
        leaf_size: int | None = None,
        eta: float | None = None,
        radius: float | None = None,
        feature_bound: float = 1.0,
        gradient_bound: float | None = None,
        output: Output = "average",
        rng: RngLike = None,
    ) -> None:
        self._setup_common(_OWNER, dim, loss, radius, feature_bound, rng)
        self.epsilon = check.positive(_OWNER, "epsilon", epsilon)
        self.delta = check.open_unit(_OWNER, "delta", delta)
        self.horizon = None if horizon is None else check.positive_int(_OWNER, "horizon", horizon)
        self.leaf_size = None if leaf_size is None else check.positive_int(_OWNER, "leaf_size", leaf_size)
        self.eta = None if eta is None else check.positive(_OWNER, "eta", eta)
        self.gradient_bound = None if gradient_bound is None else check.positive(_OWNER, "gradient_bound", gradient_bound)
        self.output = check.choice(_OWNER, "output", output, OUTPUTS)
        self._lipschitz = effective_gradient_bound(self.loss, self.feature_bound, self.radius, self.gradient_bound)
        self._unit_sigma = analytic_sigma(self.epsilon, self.delta)
        self._plans: dict[int, Plan] = {}
        self._output_epsilons: dict[int, float] = {}
        self._epoch = 0
        self._start_epoch(np.zeros(self._params))

    # -- the plan --------------------------------------------------------------------------------

    def epoch_records(self, epoch: int) -> int:
        """Records of epoch ``epoch``: the horizon (or :data:`FIRST_EPOCH`), doubling."""
        return (FIRST_EPOCH if self.horizon is None else self.horizon) << epoch

    def plan(self, epoch: int | None = None) -> Plan:
        """The plan of epoch ``epoch`` (default: the current one); public constants only."""
        epoch = self._epoch if epoch is None else epoch
        cached = self._plans.get(epoch)
        if cached is None:
            records = self.epoch_records(epoch)
            size = self.leaf_size if self.leaf_size is not None else min(
                leaf_size_rule(self._params, self._unit_sigma), max(1, records // 16)
            )
            leaves = max(1, records // size)
            levels = tree_levels(leaves)
            sigma = tree_sigma(self.epsilon, self.delta, leaves, 2.0 * self._lipschitz) * (1.0 + SENSITIVITY_SLACK)
            eta = self.eta if self.eta is not None else self.radius / (sigma * math.sqrt(levels * self._params))
            cached = self._plans[epoch] = Plan(records, leaves, levels, sigma, eta)
        return cached

    @property
    def gradient_norm_bound(self) -> float:
        """The norm per-record gradients are clipped to: min(``gradient_bound``, the loss's L)."""
        return self._lipschitz

    def beyond_plan(self, planned: int) -> str:
        """Further doubling epochs (module docstring, "Stream length")."""
        return doubling_epochs_beyond(planned, "every record is in one leaf of one epoch's tree")

    def describe_noise(self) -> tuple[str, ...]:
        plan = self.plan()
        sizes = sorted({plan.leaf_size(0), plan.leaf_size(plan.leaves - 1)})
        return (
            f"epoch {self._epoch}: {plan.records:,} records in {plan.leaves:,} leaves of "
            + " or ".join(f"{b:,}" for b in sizes) + f" records; a tree of {plan.levels} levels",
            f"every node: two Gaussian draws of standard deviation {plan.sigma:.6g} (one when it opens, one "
            "when it closes), for a leaf's gradient sum of l2 sensitivity 2L",
            f"per-record gradients clipped to norm L = {self._lipschitz:.6g}; FTRL step size eta = {plan.eta:.6g} "
            f"on gradient sums; output: the {self.output} iterate",
            "checkpoints add one draw to every open node before the state is persisted and one after "
            "(no two persisted states differ by a clean sum)",
        )

    # -- learning -------------------------------------------------------------------------------

    def _start_epoch(self, center: Array) -> None:
        """Empty tree, FTRL centred at ``center``."""
        plan = self.plan()
        self._center = center
        self._theta = center.copy()
        self._average = center.copy()
        self._open = np.zeros((plan.levels, self._params))
        self._closed = np.zeros((plan.levels, self._params))
        self._leaf = 0
        self._filled = 0

    def learn_many(self, X: Array, y: Array) -> None:
        """Add a micro-batch; any split of the stream gives the same mechanism.

        Features, labels, gradients and the chunk's clean gradient sum live only in this learner's
        :class:`panpriv.protocols.scratch.Scratch` buffers, zeroed before returning; the open nodes
        are updated in place. After the call memory holds no clean per-record value, no clean
        partial sum and no pure noise draw (tests/protocols/test_memory_residue.py)."""
        squares = self._scratch.take("batch_row_squares", np.shape(X)[0]) if np.ndim(X) == 2 else None
        try:
            X, y = check_batch(_OWNER, X, y, self.dim, squares)
            for rows in round_slices(X.shape[0], lambda: min(self._room(), BLOCK_ROWS)):
                plan = self.plan()
                if self._filled == 0:  # a leaf begins: its new nodes open with a draw Z
                    for level in plan.opened_at(self._leaf):
                        self._noise.add_gaussian(self._open[level], plan.sigma)
                self._add_records(X[rows], y[rows], plan, None if squares is None else squares[rows])
                self._filled += rows.stop - rows.start
                self._records += rows.stop - rows.start
                if self._filled == plan.leaf_size(self._leaf):
                    self._finish_leaf(plan)
        finally:
            self._scratch.wipe()

    def _room(self) -> int:
        return self.plan().leaf_size(self._leaf) - self._filled

    def _add_records(self, X: Array, y: Array, plan: Plan, row_squares: Array | None) -> None:
        """Every open node of the current leaf += Σ clipped ∇ℓ(θ; x) over the rows (the fused GLM
        path of :func:`panpriv.protocols.scratch.clipped_gradient_sum`, in scratch)."""
        labels = scratch.labels(self.loss, y, self._scratch)
        total = scratch.clipped_gradient_sum(
            self.loss, self._theta, X, labels, self.feature_bound, self._lipschitz, self._scratch, None, row_squares
        )
        for level in plan.open_levels(self._leaf, started=True):
            self._open[level] += total

    def _finish_leaf(self, plan: Plan) -> None:
        """Close the node that ends with this leaf (a second draw Z′), make it the binary expansion's
        top node, and take the FTRL step on the new noisy prefix sum."""
        self._leaf += 1
        self._filled = 0
        level = plan.closing_level(self._leaf)
        self._noise.add_gaussian(self._open[level], plan.sigma)
        self._closed[:level].fill(0.0)  # superseded: the closed node covers them
        self._closed[level] = self._open[level]
        self._open[level].fill(0.0)
        self._step(plan)
        if self._leaf == plan.leaves:  # epoch over: the next one starts from this one's output
            self._epoch += 1
            self._start_epoch(self.release())

    def _step(self, plan: Plan) -> None:
        """θ = Π_Θ((θ₀/η − S̃)/(1/η + λR)), S̃ the sum of the closed nodes (module docstring); the
        running average of the epoch's iterates follows."""
        prefix = self._closed.sum(axis=0)
        records = self._prefix_records(plan)
        theta = self._center / plan.eta - prefix
        theta /= 1.0 / plan.eta + self.loss.ridge * records
        self._ball.project_in_place(theta)
        self._theta = theta
        self._average += (theta - self._average) / self._leaf

    def _prefix_records(self, plan: Plan) -> int:
        """Records in the epoch's first ``leaf`` leaves."""
        base, extra = divmod(plan.records, plan.leaves)
        return base * self._leaf + min(self._leaf, extra)

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, StateValue]:
        """The state to persist: every open node gets a fresh draw W first, and another, V, right
        after the copy is taken (module docstring, "Checkpoints")."""
        self._renoise_open_nodes()
        state = self.state_dict()
        self._renoise_open_nodes()
        return state

    def resumed(self) -> None:
        """A learner restored from a persisted state adds a fresh draw to every open node before it
        learns: a later intrusion and the persisted copy then differ by noise, not by records."""
        self._renoise_open_nodes()

    def _renoise_open_nodes(self) -> None:
        plan = self.plan()
        for level in plan.open_levels(self._leaf, started=self._filled > 0):
            self._noise.add_gaussian(self._open[level], plan.sigma)

    # -- outputs -------------------------------------------------------------------------------

    def release(self) -> Array:
        """The average of the epoch's iterates (or the last one), the warm start before the first leaf."""
        return (self._average if self.output == "average" else self._theta).copy()

    @property
    def records_seen(self) -> int:
        return self._records

    def privacy(self) -> PrivacyReport:
        """(ε, δ) per record for one intrusion plus all outputs; the outputs alone get the tree's ε
        at δ with two draws per node (:func:`panpriv.accounting.tree.tree_epsilon`), the largest over
        the epochs begun (each epoch's tree is calibrated to (ε, δ) with its own h)."""
        plan = self.plan()
        output = Guarantee(max(self._output_epsilon(e) for e in range(self._epoch + 1)), self.delta)
        assumptions = [
            "neighbouring streams differ in one record (replacement); stream positions, counts and the horizon "
            "are public",
            f"features clipped to norm {self.feature_bound:g} and per-record gradients to norm L = {self._lipschitz:.6g}, "
            "so a leaf's gradient sum has l2 sensitivity 2L",
            f"prefix sums of the leaves' gradient sums by the binary tree mechanism: {plan.leaves:,} leaves, "
            f"a record in at most h = {plan.levels} nodes; every node opens with a Gaussian draw and closes with "
            f"another, each of standard deviation {plan.sigma:.6g}, calibrated so that h Gaussian mechanisms "
            "(one draw each) are (epsilon, delta)-DP together; each epoch has its own tree and every record "
            "is in one leaf",
            "the intruder reads the internal state (the open nodes, the closed nodes of the current prefix, the "
            "iterates) at most once; checkpoints re-noise the open nodes before and after the state is persisted; "
            "every draw comes from a generator keyed from OS entropy and zeroed after the draw",
        ]
        references = [
            "Kairouz et al. 2021, Alg. 1", "Kairouz et al. 2021, App. D", "Chan, Shi & Song 2011",
            "Dwork, Naor, Pitassi & Rothblum 2010", "Cheu et al. 2022, Def. C.2", "Balle & Wang 2018, Thm 8",
        ]
        return self._report(output, Guarantee(self.epsilon, self.delta), assumptions, references)

    def _output_epsilon(self, epoch: int) -> float:
        """The releases' ε of epoch ``epoch`` (two draws per node), computed once (a root search)."""
        cached = self._output_epsilons.get(epoch)
        if cached is None:
            plan = self.plan(epoch)
            cached = tree_epsilon(plan.sigma, self.delta, plan.leaves, 2.0 * self._lipschitz, draws=2)
            self._output_epsilons[epoch] = cached
        return cached

    # -- persistence ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, StateValue]:
        """Counters, the epoch's centre, the iterate and the running average (post-processing of
        released nodes), the closed nodes of the current prefix (released) and the open nodes
        (noisy: a draw plus the records so far; zero rows where no node is open)."""
        return {
            "records": self._records,
            "epoch": self._epoch,
            "leaf": self._leaf,
            "filled": self._filled,
            "center": self._center.copy(),
            "theta": self._theta.copy(),
            "average": self._average.copy(),
            "open_nodes": self._open.copy(),
            "closed_nodes": self._closed.copy(),
        }

    def load_state_dict(self, state: Mapping[str, StateValue]) -> None:
        owner = f"{_OWNER}.load_state_dict"
        missing = set(_COUNTERS + _VECTORS + _NODES) - set(state)
        if missing:
            raise InvalidInputError(f"{owner}: state lacks {sorted(missing)}")
        counters = {}
        for key in _COUNTERS:
            value = state[key]
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
                raise InvalidInputError(check.message(owner, key, "an int >= 0", value))
            counters[key] = int(value)
        plan = self.plan(counters["epoch"])
        if counters["leaf"] >= plan.leaves or counters["filled"] >= plan.leaf_size(counters["leaf"]):
            raise InvalidInputError(
                f"{owner}: leaf {counters['leaf']} / filled {counters['filled']} do not fit the planned epoch "
                f"({plan.leaves} leaves); was the state saved under another config?"
            )
        shapes = {**{key: (self._params,) for key in _VECTORS}, **{key: (plan.levels, self._params) for key in _NODES}}
        arrays = {}
        for key, shape in shapes.items():
            array = np.array(state[key], dtype=np.float64, copy=True)
            if array.shape != shape or not np.all(np.isfinite(array)):
                raise InvalidInputError(f"{owner}: {key!r} must be finite floats of shape {shape}; got shape {array.shape}")
            arrays[key] = array
        self._records, self._epoch, self._leaf, self._filled = (
            counters["records"], counters["epoch"], counters["leaf"], counters["filled"]
        )
        self._center, self._theta, self._average = arrays["center"], arrays["theta"], arrays["average"]
        self._open, self._closed = arrays["open_nodes"], arrays["closed_nodes"]
