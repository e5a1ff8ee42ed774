"""Held-out evaluation for the embedded Adult default: a released model next to a non-private one.

This runs after the stream is processed, on the *public* test split (``adult.test``), so the
accuracy it prints is not a statistic of the stream and is never exported as a metric.

The non-private baseline is ℓ2-regularised logistic regression fitted to optimality (L-BFGS) on
the same encoded training records — what the data allows without privacy, for comparison only.
It reads the raw training data, so it is computed only for the local demo summary, never by the
service on a live stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import expit

from panpriv.protocols.base import Learner


@dataclass(frozen=True)
class Comparison:
    private_accuracy: float
    baseline_accuracy: float
    majority_accuracy: float
    test_records: int


def classify(learner: Learner, X: NDArray[np.float64]) -> NDArray[np.float64]:
    """±1 labels: the sign of the learner's scores (``decision_many``), ties to −1."""
    return np.where(learner.decision_many(X) > 0.0, 1.0, -1.0)


def logistic_baseline(X: NDArray[np.float64], y: NDArray[np.float64], ridge: float = 1e-4) -> NDArray[np.float64]:
    """θ minimising mean log(1 + exp(−y⟨θ, x⟩)) + (ridge/2)‖θ‖² (labels ±1)."""

    def objective(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        margins = y * (X @ theta)
        value = np.logaddexp(0.0, -margins).mean() + 0.5 * ridge * theta @ theta
        gradient = -(X.T @ (y * expit(-margins))) / len(y) + ridge * theta
        return float(value), gradient

    result = minimize(objective, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": 500})
    return np.asarray(result.x)


def compare_on_adult(learner: Learner) -> Comparison:
    """Accuracy on ``adult.test`` of ``learner``'s released model, the baseline, and the majority class."""
    from panpriv.streamer.datasets import adult

    X_train, y_train = adult.load("train")
    X_test, y_test = adult.load("test")
    theta = logistic_baseline(X_train, y_train)
    baseline = float(np.mean(np.where(X_test @ theta > 0, 1.0, -1.0) == y_test))
    private = float(np.mean(classify(learner, X_test) == y_test))
    majority = float(max(np.mean(y_test > 0), np.mean(y_test < 0)))
    return Comparison(private, baseline, majority, len(y_test))
