"""Synthetic streams with a known population optimum, for comparing the learners' utility.

Every stream draws features uniformly on the unit sphere of R^d (so ‖x‖ = 1 and E[x xᵀ] = I/d)
and labels from a well-specified model with parameter θ*. The population loss of any θ is then
computed *without* label noise in the estimate: over a fixed evaluation sample of features, the
expectation over the label is taken in closed form. Comparing learners on the same evaluation
sample (common random numbers) makes excess-loss differences accurate to well below the
differences that matter.

- :class:`LogisticTask`: P(y = 1 | x) = σ(⟨θ*, x⟩); θ* minimises the population logistic loss
  (well-specified model).
- :class:`LinearTask`: y = ⟨θ*, x⟩ + e with e ~ U(−a, a) symmetric; θ* minimises the population
  squared loss *and* absolute loss, and with ridge λ the squared-loss optimum is
  θ*·(1/d)/(1/d + λ) in closed form. Labels satisfy |y| ≤ ‖θ*‖ + a, so a squared loss with that
  label bound never clips them.

Usage: ``task = LogisticTask(d=20, norm=4.0)``, ``X, y = task.sample(n, rng)``,
``task.excess(theta, loss)`` (excess population loss over the task's optimum for ``loss``;
features are used as they are, ``feature_bound`` 1, no intercept).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import expit

from panpriv.protocols.losses import Loss

Array = NDArray[np.float64]

EVAL_SIZE = 100_000


def sphere(n: int, d: int, rng: np.random.Generator) -> Array:
    """n points uniform on the unit sphere of R^d."""
    X = rng.normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def direction(d: int, norm: float, seed: int) -> Array:
    """A fixed θ* of the given norm (seeded, so every learner sees the same task)."""
    theta = np.random.default_rng(seed).normal(size=d)
    return theta * (norm / np.linalg.norm(theta))


class _Task:
    """Shared parts: θ*, the evaluation sample, excess loss over the optimum for a loss."""

    d: int
    norm: float
    seed: int

    def _setup(self) -> None:
        self.theta_star = direction(self.d, self.norm, self.seed)
        self._eval = sphere(EVAL_SIZE, self.d, np.random.default_rng(self.seed + 1))
        self._optima: dict[str, Array] = {}

    def _pointwise(self, theta: Array, loss: Loss) -> tuple[Array, Array]:
        """Per evaluation point x: E_{y|x} φ(⟨θ, x⟩, y) and E_{y|x} ∂φ/∂s (exact in y)."""
        raise NotImplementedError

    def population_loss(self, theta: Array, loss: Loss) -> float:
        """E_x E_{y|x} ℓ(θ; x, y) + (λ/2)‖θ‖², x over the evaluation sample, y exactly."""
        values, _ = self._pointwise(theta, loss)
        return float(values.mean() + 0.5 * loss.ridge * theta @ theta)

    def population_gradient(self, theta: Array, loss: Loss) -> Array:
        _, slopes = self._pointwise(theta, loss)
        return self._eval.T @ slopes / len(slopes) + loss.ridge * theta

    def optimum(self, loss: Loss) -> Array:
        """θ* without ridge (the model is well specified: E_y ∂φ = 0 at θ* for every x, so the
        excess over θ* is exactly quadratic); with ridge, the minimiser of the evaluation
        objective (L-BFGS; it lies inside any ball containing θ*)."""
        if loss.ridge == 0.0:
            return self.theta_star.copy()
        key = repr(loss)
        if key not in self._optima:
            result = minimize(
                lambda th: self.population_loss(th, loss),
                self.theta_star,
                jac=lambda th: self.population_gradient(th, loss),
                method="L-BFGS-B",
                options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 1000},
            )
            self._optima[key] = result.x
        return self._optima[key]

    def excess(self, theta: Array, loss: Loss) -> float:
        """Excess population loss of θ for ``loss`` (no intercept: the tasks have none)."""
        if loss.intercept:
            raise ValueError("the synthetic tasks have no intercept; use intercept=False")
        return self.population_loss(theta, loss) - self.population_loss(self.optimum(loss), loss)


@dataclass
class LogisticTask(_Task):
    """Logistic-model stream: P(y = 1 | x) = σ(⟨θ*, x⟩)."""

    d: int = 20
    norm: float = 4.0
    seed: int = 2024

    def __post_init__(self) -> None:
        self._setup()

    binary = True

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
        X = sphere(n, self.d, rng)
        y = (rng.uniform(size=n) < expit(X @ self.theta_star)).astype(np.float64)
        return X, y

    def _pointwise(self, theta: Array, loss: Loss) -> tuple[Array, Array]:
        if not loss.binary_labels:
            raise ValueError(f"LogisticTask evaluates binary losses, not {loss.name}")
        p = expit(self._eval @ self.theta_star)
        s = self._eval @ theta
        values, slopes = [], []
        for label in (1.0, -1.0):
            y = np.full_like(s, label)
            values.append(loss.value(theta, self._eval, y))
            # ∂φ/∂s from the gradient φ'(s, y)·x: project on x (‖x‖ = 1).
            slopes.append(np.einsum("ij,ij->i", loss.gradient(theta, self._eval, y), self._eval))
        return p * values[0] + (1 - p) * values[1], p * slopes[0] + (1 - p) * slopes[1]


@dataclass
class LinearTask(_Task):
    """Linear-model stream: y = ⟨θ*, x⟩ + e, e ~ U(−a, a); |y| ≤ ‖θ*‖ + a = ``label_bound``."""

    d: int = 20
    norm: float = 2.0
    seed: int = 2025
    noise: float = 0.5

    def __post_init__(self) -> None:
        self._setup()

    binary = False

    @property
    def label_bound(self) -> float:
        return self.norm + self.noise

    def sample(self, n: int, rng: np.random.Generator) -> tuple[Array, Array]:
        X = sphere(n, self.d, rng)
        return X, X @ self.theta_star + rng.uniform(-self.noise, self.noise, size=n)

    def _pointwise(self, theta: Array, loss: Loss) -> tuple[Array, Array]:
        a = self.noise
        c = self._eval @ (theta - self.theta_star)  # s − y = c − e
        if loss.name == "squared":
            return 0.5 * (c**2 + a * a / 3.0), c
        if loss.name == "absolute":
            inside = np.abs(c) <= a
            return np.where(inside, (c**2 + a * a) / (2 * a), np.abs(c)), np.where(inside, c / a, np.sign(c))
        raise ValueError(f"LinearTask evaluates squared and absolute losses, not {loss.name}")
