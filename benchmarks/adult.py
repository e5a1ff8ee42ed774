"""UCI Adult for the utility benchmarks: the service's own encoding, scaled to norm ≤ 1.

Uses :mod:`streamer.datasets.adult` (the canonical encoder: public ranges and one-hot blocks, no
statistic of the data — standardising with the data's means would leak outside the accounting),
drops its constant ``bias`` column, and divides by the bound √13 of the remaining features, so
that ‖x‖ ≤ 1 holds by construction. Learners add the intercept themselves (``intercept=True``).
Labels are returned as 0/1.

Usage: ``X_train, y_train, X_test, y_test = load()``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from streamer.datasets import adult

Array = NDArray[np.float64]


def _prepare(X: Array, y: Array) -> tuple[Array, Array]:
    features = np.delete(X, adult.FEATURE_NAMES.index("bias"), axis=1)
    bound = math.sqrt(adult.FEATURE_BOUND**2 - 1.0)  # ‖x‖² ≤ 14 including the bias 1
    return features / bound, (y > 0).astype(np.float64)


def load() -> tuple[Array, Array, Array, Array]:
    """(X_train, y_train, X_test, y_test): 32,561 and 16,281 records, ‖x‖ ≤ 1, labels 0/1."""
    X_train, y_train = _prepare(*adult.load("train"))
    X_test, y_test = _prepare(*adult.load("test"))
    return X_train, y_train, X_test, y_test


def auc(scores: Array, labels: Array) -> float:
    """Area under the ROC curve (Mann–Whitney statistic, ties counted one half)."""
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
