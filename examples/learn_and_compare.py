"""Learn one stream with two pan-private learners and compare them on held-out records.

Run from anywhere after ``pip install panpriv`` (or ``make run`` in a clone)::

    python examples/learn_and_compare.py

Both learners are built with their defaults (radius √dim, a logistic loss with an intercept) and
the same (ε, δ); each prints the guarantee that covers its released model: its output guarantee
(what the released model reveals) and its intrusion guarantee (one read of its memory, plus every
release). The data is synthetic and public, so scoring on it costs no privacy.
"""

from __future__ import annotations

import numpy as np

from panpriv import PanPrivateACSA, PanPrivateFTRL

DIM, TRAIN, TEST = 10, 60_000, 20_000


def stream(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Features in the unit ball (larger rows are clipped by the learner), labels ±1 from a
    logistic model."""
    X = rng.normal(size=(n, DIM)) / np.sqrt(DIM)
    truth = np.linspace(-2.0, 2.0, DIM)
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-(X @ truth) * 3)), 1.0, -1.0)
    return X, y


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (the Mann–Whitney statistic; no ties among continuous scores)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores)] = np.arange(1, len(scores) + 1)
    positives = y > 0
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def main() -> None:
    rng = np.random.default_rng(7)
    X, y = stream(TRAIN, rng)
    X_test, y_test = stream(TEST, rng)
    learners = {
        "pan-acsa": PanPrivateACSA(dim=DIM, loss="logistic", epsilon=1.0, delta=1e-6, horizon=TRAIN),
        "pan-ftrl": PanPrivateFTRL(dim=DIM, loss="logistic", epsilon=1.0, delta=1e-6, horizon=TRAIN),
    }
    for name, learner in learners.items():
        for start in range(0, TRAIN, 4_096):  # micro-batches, as the service feeds them
            learner.learn_many(X[start:start + 4_096], y[start:start + 4_096])
        report = learner.privacy()
        score = auc(learner.predict_proba_many(X_test), y_test)
        print(f"{name}: test AUC {score:.3f}; output {report.output}, intrusion {report.intrusion}")


if __name__ == "__main__":
    main()
