"""Reference learners for the utility benchmarks (not part of the service).

- :func:`acsa_with_plans`: AC-SA over a stream held in memory, following given
  :class:`panpriv.protocols.acsa.RunPlan` s, with Gaussian noise of a chosen scale added once per batch.
  With ``noise_std = 0`` and a pan-private learner's plans it is "the same learner without noise";
  with one draw of the calibrated ζ per batch it is the central-DP counterpart of Cheu et al. 2022 Alg. 6 (only
  outputs are protected, so one draw suffices: Gaussian mechanism per batch, disjoint batches).
- :func:`ftrl_with_plan`: DP-FTRL (Kairouz et al. 2021 Alg. 1) on a :class:`panpriv.protocols.pan_ftrl.Plan`'s
  leaves, with one Gaussian draw per tree node (``node_std``): with 0 it is pan-ftrl's noiseless twin,
  with the central calibration (one draw per node protects the outputs) central DP-FTRL.
- :func:`sgd_one_pass`: one-pass projected mini-batch SGD with iterate averaging (Cheu et al. 2022 Alg. 3 with
  a central Gaussian sum instead of PVEC; Lemma 4.2's step η = D/√(T L_G)). :func:`dp_sgd_batch`
  gives its central-DP batch size, and ``batch=1, noise_std=0`` is non-private one-pass SGD.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.acsa import Iterate, RunPlan, effective_gradient_bound, record_gradients, step
from panpriv.protocols.geometry import L2Ball
from panpriv.protocols.losses import Loss, clip_rows
from panpriv.protocols.pan_ftrl import Plan as FTRLPlan

Array = NDArray[np.float64]


def acsa_with_plans(
    loss: Loss,
    plans: Sequence[RunPlan],
    X: Array,
    y: Array,
    *,
    feature_bound: float,
    radius: float,
    noise_std: Callable[[int], float],
    rng: np.random.Generator,
    gradient_bound: float | None = None,
    restart: bool = False,
) -> Array:
    """θ^ag after running ``plans`` in order (warm starts) over ``X, y``; noise N(0, noise_std(b)² I)
    is added to each batch-mean gradient. ``gradient_bound`` and ``restart`` as in
    :class:`panpriv.protocols.pan_acsa.PanPrivateACSA` (``restart=True`` is its ``"gradient"``)."""
    Z, labels = loss.features(X, feature_bound), loss.labels(y)
    ball = L2Ball(radius)
    lipschitz = effective_gradient_bound(loss, feature_bound, radius, gradient_bound)
    iterate = Iterate.start(np.zeros(Z.shape[1]))
    start = 0
    for plan in plans:
        iterate = Iterate.start(iterate.theta_ag)
        for t in range(1, plan.steps + 1):
            b = plan.batch_size(t)  # t is the batch index; iterate.t restarts
            rows = slice(start, start + b)
            start += b
            g = record_gradients(loss, iterate.theta_md, Z[rows], labels[rows], plan, lipschitz).mean(axis=0)
            sd = noise_std(b)
            if sd > 0.0:
                g = g + rng.normal(0.0, sd, size=g.shape)
            iterate = step(iterate, g + loss.ridge_gradient(iterate.theta_md), plan.sizes, ball, restart=restart)
    return iterate.theta_ag


def dp_sgd_batch(dim: int, unit_sigma: float) -> int:
    """b = ⌈2√p s⌉ minimising Lemma 4.2's bound D√(L_G/T) with T = n/b and
    L_G = L² + p (2Ls/b)² (one Gaussian draw of ζ = 2Ls/b per batch): D L √((b + 4 p s²/b)/n)."""
    return max(1, math.ceil(2.0 * math.sqrt(dim) * unit_sigma))


def sgd_one_pass(
    loss: Loss,
    X: Array,
    y: Array,
    *,
    batch: int,
    noise_std: float,
    feature_bound: float,
    radius: float,
    rng: np.random.Generator,
    gradient_bound: float | None = None,
) -> Array:
    """Averaged projected SGD, one pass, batches of ``batch``; N(0, noise_std² I) per batch mean.

    Step η = D/√(T L_G) with L_G = L_F² + p·noise_std² (Cheu et al. 2022 Lemma 4.2 / Thm 4.1's choice), where
    L_F = L + λ r bounds the gradient of the whole objective on Θ; per-record gradients are
    clipped to L = min(``gradient_bound``, the loss's bound).
    """
    Z, labels = loss.features(X, feature_bound), loss.labels(y)
    ball = L2Ball(radius)
    L = effective_gradient_bound(loss, feature_bound, radius, gradient_bound)
    steps = Z.shape[0] // batch
    lg = (L + loss.ridge * radius) ** 2 + Z.shape[1] * noise_std**2
    eta = ball.diameter / math.sqrt(steps * lg)
    theta = np.zeros(Z.shape[1])
    total = np.zeros_like(theta)
    for t in range(steps):
        rows = slice(t * batch, (t + 1) * batch)
        g = clip_rows(loss.gradient(theta, Z[rows], labels[rows]), L).mean(axis=0) + loss.ridge_gradient(theta)
        if noise_std > 0.0:
            g = g + rng.normal(0.0, noise_std, size=g.shape)
        total += theta
        theta = ball.project(theta - eta * g)
    return total / steps


def ftrl_with_plan(
    loss: Loss,
    plan: FTRLPlan,
    X: Array,
    y: Array,
    *,
    feature_bound: float,
    radius: float,
    node_std: float,
    rng: np.random.Generator,
    eta: float | None = None,
    gradient_bound: float | None = None,
    average: bool = True,
) -> Array:
    """DP-FTRL over one epoch of ``plan``'s leaves, written from Kairouz et al. 2021 Alg. 1 without the
    learner's pan-private bookkeeping: the binary tree's nodes (the left children the prefix sums
    use) each get one draw N(0, node_std² I); the step is the learner's, θ = Π((−S̃)/(1/η)) from
    θ₀ = 0 (no ridge). ``node_std = 0`` is the noiseless twin of :class:`panpriv.protocols.pan_ftrl.PanPrivateFTRL`
    (same leaves, same η); ``node_std = σ_c`` with one draw per node is central DP-FTRL (only the
    outputs are protected). ``eta``: the step size (default: the plan's)."""
    Z, labels = loss.features(X, feature_bound), loss.labels(y)
    ball = L2Ball(radius)
    L = effective_gradient_bound(loss, feature_bound, radius, gradient_bound)
    eta = plan.eta if eta is None else eta
    p = Z.shape[1]
    clean = np.zeros(p)
    levels: dict[int, Array] = {}
    noise = np.zeros(p)
    theta = np.zeros(p)
    mean = np.zeros(p)
    start = 0
    for leaf in range(plan.leaves):
        rows = slice(start, start + plan.leaf_size(leaf))
        start = rows.stop
        clean += clip_rows(loss.gradient(theta, Z[rows], labels[rows]), L).sum(axis=0)
        level = plan.closing_level(leaf + 1)
        for lower in range(level):
            noise -= levels.pop(lower, 0.0)
        if node_std > 0.0:
            levels[level] = rng.normal(0.0, node_std, size=p)
            noise += levels[level]
        theta = ball.project(-eta * (clean + noise))
        mean += (theta - mean) / (leaf + 1)
    return mean if average else theta
