"""Scoring each released snapshot on a public, labelled hold-out file (``--holdout FILE``).

Why this costs no privacy: the hold-out file is data the user provides and declares public (a
published test split, a synthetic check set) — never the private stream, whose statistics would be
an unaccounted release — and a snapshot's parameters are already released, so scoring them is
post-processing. The scores go into the snapshot record (``"holdout"``), ``panpriv inspect`` and
the ``panpriv_holdout_score{metric}`` and ``panpriv_holdout_records`` gauges.

The file is read once at start-up with the run's own codec (same format, dimension, feature bound
and label domain); its rejects are counted and logged, never fatal. Metrics:

- binary labels (two label values, or 0/1, ±1): ``auc`` (Mann–Whitney, ties one half),
  ``accuracy`` (the sign of the score against the label's: threshold P = 1/2) and
  ``balanced_accuracy`` (the mean of the two classes' accuracies at that threshold),
  ``majority_accuracy`` (the accuracy of always answering the hold-out's larger class: the
  baseline an accuracy is read against; AUC's is 1/2), and for the
  logistic link ``log_loss`` (probabilities clipped to [1e-15, 1 − 1e-15]) and the accuracies at
  the model's own prior: ``prior_threshold`` π̂, the mean predicted P(y = 1) over the hold-out
  rows — read off the released model and the rows' features, never their labels — and
  ``accuracy_at_prior``/``balanced_accuracy_at_prior``, positive when P > π̂;
- other labels: ``rmse`` of the predicted values.

Why the prior threshold: on imbalanced data (a few per cent positives) a useful logistic model
rarely predicts P > 1/2, so its accuracy at 1/2 equals the majority rate and its balanced accuracy
is about 1/2 — it looks like "nothing learned" although its AUC is high. A calibrated model's
probabilities average to the positive rate; classifying against that average is the threshold
the model itself implies, and it is chosen without the labels.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.base import Snapshot
from panpriv.streamer.config import SourceConfig
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.sources.base import iter_batches
from panpriv.streamer.sources.open import open_source

log = logging.getLogger("panpriv.holdout")

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Holdout:
    """The hold-out records (decoded, validated and clipped by the run's codec)."""

    path: Path
    X: Array
    y: Array
    rejected: int

    @classmethod
    def load(cls, path: Path, codec: Codec) -> Holdout:
        """Read ``path`` with ``codec``; a :class:`ConfigError` if it has no valid record."""
        if not path.is_file():
            raise ConfigError(f"holdout: {path} is not a file")
        source = open_source(SourceConfig(url=f"file:{path}"), codec, {})
        rows: list[Array] = []
        labels: list[Array] = []
        rejected = 0
        try:
            for batch in iter_batches(source, 4096):
                decoded = codec.decode(batch.payloads) if batch.arrays is None else codec.validate_arrays(*batch.arrays)
                rows.append(np.array(decoded.X, dtype=np.float64))
                labels.append(np.array(decoded.y, dtype=np.float64))
                rejected += sum(decoded.reject_counts().values())
        finally:
            source.close()
        if not rows or not sum(len(y) for y in labels):
            raise ConfigError(f"holdout: {path} has no valid record for this run's [records] settings ({rejected} rejected)")
        if rejected:
            log.warning("holdout: %d record(s) of %s rejected by the run's codec; scoring the %d valid ones",
                        rejected, path, sum(len(y) for y in labels))
        return cls(path, np.vstack(rows), np.concatenate(labels), rejected)

    @property
    def binary(self) -> bool:
        return np.unique(self.y).size <= 2

    def score(self, snapshot: Snapshot) -> dict[str, float]:
        """The metrics of the module docstring for ``snapshot`` (needs its model spec)."""
        scores: dict[str, float] = {"records": float(self.y.size)}
        decision = snapshot.decision_many(self.X)
        if not self.binary:
            scores["rmse"] = float(math.sqrt(np.mean((snapshot.predict_many(self.X) - self.y) ** 2)))
            return scores
        positive = self.y >= self.y.max() if np.unique(self.y).size == 2 else self.y > 0
        scores["accuracy"] = float(np.mean((decision > 0.0) == positive))
        scores["majority_accuracy"] = float(max(np.mean(positive), 1.0 - np.mean(positive)))  # the baseline: no model
        area = auc(decision, positive)
        if math.isfinite(area):  # one class only: no AUC (and JSON has no NaN)
            scores["auc"] = area
            scores["balanced_accuracy"] = balanced_accuracy(decision > 0.0, positive)
        if snapshot.model is not None and snapshot.model.link == "logistic":
            probability = np.clip(snapshot.predict_proba_many(self.X), 1e-15, 1.0 - 1e-15)
            scores["log_loss"] = float(-np.mean(np.where(positive, np.log(probability), np.log1p(-probability))))
            prior = float(np.mean(probability))
            scores["prior_threshold"] = prior
            scores["accuracy_at_prior"] = float(np.mean((probability > prior) == positive))
            if math.isfinite(area):
                scores["balanced_accuracy_at_prior"] = balanced_accuracy(probability > prior, positive)
        return scores


def balanced_accuracy(predicted: NDArray[np.bool_], positive: NDArray[np.bool_]) -> float:
    """(TPR + TNR)/2 of ``predicted`` against ``positive`` (both classes present)."""
    return float(0.5 * (np.mean(predicted[positive]) + np.mean(~predicted[~positive])))


def auc(scores: Array, positive: NDArray[np.bool_]) -> float:
    """Area under the ROC curve of ``scores`` for the ``positive`` records (NaN with one class)."""
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    from scipy.stats import rankdata  # here, not at the top: scipy.stats costs ~0.3 s at start-up

    ranks = rankdata(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
