"""UCI Adult for the utility benchmarks, exactly as the service reads it.

Uses :mod:`panpriv.streamer.datasets.adult` (the canonical encoder: public ranges and one-hot blocks plus a
constant ``bias`` feature, no statistic of the data — standardising with the data's means would
leak outside the accounting), so a learner built from the service's configuration
(:data:`panpriv.streamer.config.ADULT_DEMO`) sees the same records here as in ``make run``. Every record has
‖x‖ ≤ :data:`FEATURE_BOUND` = √14 by construction. Labels are returned as 0/1.

Usage: ``X_train, y_train, X_test, y_test = load()``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from panpriv.streamer.datasets import adult

Array = NDArray[np.float64]

FEATURE_BOUND = adult.FEATURE_BOUND
"""The public bound on ‖x‖ of the encoding (bias included)."""


def load() -> tuple[Array, Array, Array, Array]:
    """(X_train, y_train, X_test, y_test): 32,561 and 16,281 records of :data:`adult.DIM` features,
    labels 0/1."""
    X_train, y_train = adult.load("train")
    X_test, y_test = adult.load("test")
    return X_train, (y_train > 0).astype(np.float64), X_test, (y_test > 0).astype(np.float64)


def auc(scores: Array, labels: Array) -> float:
    """Area under the ROC curve (Mann–Whitney statistic, ties counted one half)."""
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
