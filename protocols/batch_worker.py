"""Learners whose batches can run on many workers: the typed half of the learner contract that the
scale-out roles (``panpriv worker``, ``panpriv coordinate``: ``panpriv.streamer.scaleout``) rely on.

A step of such a learner is a function of batch gradients that each leave their process only as a
noisy batch mean (Cheu et al. 2022 Alg. 6 lines 4–9: both draws added where the batch is read), so
K workers can each run one batch at the same query point and a coordinator can combine the K
noisy means into the step (:mod:`panpriv.protocols.pan_acsa_scaleout`: synchronous versions). The
roles use only the methods below; :class:`~panpriv.protocols.pan_acsa.PanPrivateACSA` implements
them, and a new learner declaring this capability runs in the two roles without a change to them.
"""

from __future__ import annotations

import abc

import numpy as np
from numpy.typing import NDArray

from panpriv.protocols.base import Learner

Array = NDArray[np.float64]


class BatchWorkerLearner(Learner):
    """A learner whose steps can be fed by noisy batch means computed on other processes."""

    @abc.abstractmethod
    def plan_for_workers(self, workers: int) -> None:
        """Plan for steps that average ``workers`` noisy batch means (utility only: every draw is
        still calibrated to the batch it protects)."""

    @property
    @abc.abstractmethod
    def param_count(self) -> int:
        """The number of model parameters (the length of a batch mean)."""

    @abc.abstractmethod
    def step_batch_size(self) -> int:
        """b_t: the records the plan gives the step in progress (all workers together)."""

    @property
    @abc.abstractmethod
    def plan_complete(self) -> bool:
        """The planned steps are done: the coordinator publishes its last version."""

    @abc.abstractmethod
    def open_batch(self, batch: int) -> None:
        """Start a batch of ``batch`` records at the loaded query point (its first noise draw)."""

    @abc.abstractmethod
    def add_to_batch(self, X: Array, y: Array, batch: int) -> None:
        """Add the records' clipped gradients to the open batch."""

    @abc.abstractmethod
    def close_batch(self, batch: int) -> Array:
        """End the batch (its last noise draw) and return the noisy batch mean, the only value that
        leaves the worker; the caller zeroes it once sent."""

    @abc.abstractmethod
    def discard_batch(self) -> None:
        """Drop an unfinished batch (its records reached no output)."""

    @abc.abstractmethod
    def apply_noisy_gradient(self, gradient: Array) -> None:
        """Take the step with ``gradient``, a combination of noisy batch means computed at the
        current query point (post-processing: no record is read, no noise added)."""


def supports_batch_workers(cls: type[Learner]) -> bool:
    """True if ``cls`` can run as a scale-out model (:class:`BatchWorkerLearner`)."""
    return issubclass(cls, BatchWorkerLearner)
