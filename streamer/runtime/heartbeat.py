"""What runs between micro-batches: the cadence, the progress and status lines, the lag, checkpoints.

A driver (:mod:`panpriv.streamer.runtime.stream_driver`, :mod:`panpriv.streamer.runtime.recorded_driver`) calls
:meth:`Heartbeat.batch` after every micro-batch it learned and :meth:`Heartbeat.idle` after a poll
that returned nothing; the heartbeat counts the records towards the checkpoint cadence
(:class:`~panpriv.streamer.runtime.pacing.Cadence`), redraws the progress line, logs the status line when due, and
takes a checkpoint (with a snapshot when one is due) through the callback it was given. Everything
it shows is a count, a timing or a ledger figure: nothing is computed from records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from panpriv.accounting.ledger import PrivacyReport
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.pacing import Cadence
from panpriv.streamer.runtime.progress import Progress
from panpriv.streamer.runtime.status import StatusLine
from panpriv.streamer.sources.base import Source
from panpriv.streamer.state.training_state import TrainingState


class LagReporter:
    """Reports the source's lag to the metrics at most every ``interval_s`` seconds (or now)."""

    def __init__(self, source: Source | IndexedFile, metrics: ServiceMetrics, interval_s: float) -> None:
        self._source = source
        self._metrics = metrics
        self._interval_s = interval_s
        self._due = 0.0  # monotonic time of the next refresh

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if now < self._due and not force:
            return
        self._due = now + self._interval_s
        lags = self._source.lag()
        if lags is not None:
            self._metrics.observe_lag(lags)

    def in_records(self) -> dict[str, int] | None:
        """The lag per partition in records (messages x records per message read), for the status line."""
        lags = self._source.lag()
        ratio = self._metrics.records_per_message
        return None if lags is None else {key: round(lag * ratio) for key, lag in lags.items()}


class Heartbeat:
    """The side work of a run between micro-batches (module docstring).

    Parameters
    ----------
    state
        The run's state (records learned, rejects, ledger: what the lines show).
    cadence
        When a checkpoint and a snapshot are due.
    checkpoint
        Takes a checkpoint; its argument says whether a snapshot goes with it.
    report
        The run's composed privacy report (for the status line; called only when it is logged).
    status
        The periodic status line.
    lag
        The source's lag.
    progress
        The progress line (``None``: off).
    position
        The progress line's position: positions consumed, or records learned over all passes.
    """

    def __init__(
        self,
        state: TrainingState,
        cadence: Cadence,
        checkpoint: Callable[[bool], None],
        report: Callable[[], PrivacyReport],
        status: StatusLine,
        lag: LagReporter,
        progress: Progress | None,
        position: Callable[[], int],
    ) -> None:
        self._state = state
        self._cadence = cadence
        self._checkpoint = checkpoint
        self._report = report
        self._status = status
        self.lag = lag
        self._progress = progress
        self._position = position

    def batch(self, records: int) -> None:
        """After a micro-batch that handled ``records`` records."""
        self._cadence.add(records)
        self._draw()
        self._checkpoint_if_due(idle=False)

    def idle(self) -> None:
        """After a poll that returned nothing: a checkpoint only if time says so."""
        self._checkpoint_if_due(idle=True)

    def close(self) -> None:
        if self._progress is not None:
            self._draw(force=True)
            self._progress.close()

    def _checkpoint_if_due(self, idle: bool) -> None:
        self._status.tick(self._state.learner.records_seen, self._state.rejects, self.lag.in_records, self._report,
                          self._cadence)
        if self._cadence.checkpoint_due(idle):
            snapshot = self._cadence.snapshot_due
            self._checkpoint(snapshot)
            self._cadence.checkpointed(snapshot)

    def _draw(self, force: bool = False) -> None:
        if self._progress is None:
            return
        report = self._state.ledger.report()
        rejects: Mapping[str, int] = self._state.rejects
        self._progress.update(
            self._state.learner.records_seen,
            sum(rejects.values()),
            self._position(),
            report.output.epsilon,
            report.intrusion.epsilon,
            force=force,
        )
