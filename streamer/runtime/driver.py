"""The contract of a driver: the loop that feeds a learner, and what it tells a checkpoint.

Two drivers exist. :class:`~panpriv.streamer.runtime.stream_driver.StreamDriver` polls a sequential source
(Kafka, a file, a recording, the synthetic stream) and hands each micro-batch to
``learn_many``; :class:`~panpriv.streamer.runtime.recorded_driver.RecordedDriver` lets a
:class:`~panpriv.protocols.recorded.RecordedLearner` run its own passes over a recording read by record
index and takes control in the ``fetch`` it hands the learner. They differ in how a batch is
charged, how the learner's guarantee is registered in the ledger (one instance, or one per pass)
and what a resume starts from, so those are the driver's to say; the checkpoint transaction
(:mod:`panpriv.streamer.runtime.transaction`) asks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.runtime.heartbeat import Heartbeat
from panpriv.streamer.runtime.pacing import Pacer
from panpriv.streamer.state.checkpoint import ReplayMarks
from panpriv.streamer.state.training_state import TrainingState

Outcome = Literal["finished", "stopped", "budget_exhausted"]

STOPPED = "stop requested (signal); final checkpoint taken"
"""The message of a run stopped by a signal (or the stop event)."""


@dataclass(frozen=True)
class Resumable:
    """What a checkpoint saves for a resume: the learner's state and record count, the records the
    last snapshot covered, a recorded learner's pass marks (``None`` for stream learners), and the
    positions, partly learned messages, ledger and reject counts that go with that state — the
    live ones, or those of the last batch boundary of a learner that saves only boundaries
    (:meth:`panpriv.protocols.base.Learner.records_to_boundary`)."""

    learner_state: dict[str, Any]
    records: int
    snapshot_records: int
    replay: ReplayMarks | None
    positions: dict[str, int]
    ledger: dict[str, Any]
    rejects: dict[str, int]
    partial: dict[str, int] = field(default_factory=dict)
    marks: dict[str, int] | None = None
    """Kafka's offset-regression marks at these positions, when they are not the live ones
    (``None``: the source's own, :func:`panpriv.streamer.sources.open.source_marks`)."""


class Driver(ABC):
    """Feeds the learner of ``state`` (module docstring).

    ``session`` is ``None`` until the budget store is open (during set-up); registrations made
    before then reach the store when the session begins (:meth:`BudgetSession.begin`).
    """

    def __init__(self, state: TrainingState) -> None:
        self.state = state
        self.session: BudgetSession | None = None

    @abstractmethod
    def register_learner(self) -> None:
        """Register the learner's current guarantee in the ledger (and the budget store, once open)."""

    @abstractmethod
    def resumable(self, finished: bool = False) -> Resumable:
        """What a checkpoint taken now saves for a resume (``finished``: the data is complete)."""

    @abstractmethod
    def drive(self, heartbeat: Heartbeat, pacer: Pacer) -> tuple[Outcome, str]:
        """Run until the data ends, a stop is requested or the budget is spent; say which and why."""

    @abstractmethod
    def progress_span(self) -> tuple[int | None, int]:
        """The progress line's total (``None``: unknown) and its starting position."""

    @abstractmethod
    def progress_position(self) -> int:
        """The progress line's current position."""

    def _session(self) -> BudgetSession:
        if self.session is None:
            raise RuntimeError("the budget store is not open yet")
        return self.session
