"""Learners that read a recording by record index: the typed half of the learner contract that
the service's record-index driver (``panpriv.streamer.runtime.recorded_driver``) relies on.

Most learners take a stream in arrival order (:meth:`~panpriv.protocols.base.Learner.learn_many`). A
:class:`RecordedLearner` needs the whole recording at hand and chooses which record comes next:
:class:`~panpriv.protocols.pnsgd.ShuffledPNSGD` visits the n records in the order of one uniformly random
permutation (Sordello et al. 2021, Thm 2); :class:`~panpriv.protocols.shuffle_gd.ShuffleGD` reads every
record once per round (Cheu et al. 2022, Alg. 5).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.base import Learner

Fetch = Callable[[NDArray[np.int64]], tuple[NDArray[np.float64], NDArray[np.float64]]]
"""``fetch(indices) -> (X, y)``: the records of the recording at those indices, in that order."""


class RecordedLearner(Learner):
    """A learner that runs its own loop over a recording of ``n`` records.

    ``n`` (an attribute set by the constructor) is the number of records per pass: the public
    number of valid records of the recording.
    """

    n: int
    resumes_mid_pass: ClassVar[bool] = True
    """``False`` when a state saved in the middle of a pass cannot be resumed soundly
    (ShuffledPNSGD: its permutation is never saved); a driver then restarts the pass instead."""

    @abc.abstractmethod
    def learn_recorded(self, fetch: Fetch, micro_batch: int) -> None:
        """Run the rest of the protocol, calling ``fetch(indices)`` for at most ``micro_batch``
        records at a time and learning them before the next call. Exceptions raised by ``fetch``
        (a driver's way to stop between micro-batches) propagate, leaving the state as after the
        last micro-batch learned."""

    reports_per_round: ClassVar[bool] = False
    """``True`` for a learner whose passes a ledger should hold as separate instances, each
    registered with its pass's increment of the composed guarantee (:meth:`round_reports`)."""

    @property
    def passes(self) -> int:
        """The passes over the recording the protocol makes (for progress displays)."""
        return 1

    def round_reports(self) -> Sequence[PrivacyReport]:
        """One report per pass begun, each the pass's *increment* of the composed guarantee
        (``shuffle-gd``); asked for only when :attr:`reports_per_round` is set. The default, for
        a learner whose :meth:`~panpriv.protocols.base.Learner.privacy` covers every pass at once, has none."""
        return ()
