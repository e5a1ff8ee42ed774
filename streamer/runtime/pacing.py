"""When the service checkpoints, and how fast it reads: the two clocks of the processing loop.

:class:`Cadence` decides when a checkpoint (and with it a snapshot) is due; :class:`Pacer` limits
consumption to a configured rate. Both look only at public counts and the wall clock.
"""

from __future__ import annotations

import time

from panpriv.streamer.config import ServiceConfig


class Cadence:
    """When to checkpoint (every ``checkpoint.every_records`` records or ``every_seconds``) and
    whether a snapshot goes with it (``snapshots.every_records`` records since the last one)."""

    def __init__(self, config: ServiceConfig) -> None:
        self.every_records = config.checkpoint.every_records
        self.every_seconds = config.checkpoint.every_seconds
        self.snapshot_every = config.snapshots.every_records
        self.since_checkpoint = self.since_snapshot = 0
        self.last = time.monotonic()

    def add(self, records: int) -> None:
        self.since_checkpoint += records
        self.since_snapshot += records

    @property
    def snapshot_due(self) -> bool:
        return self.since_snapshot >= self.snapshot_every

    def checkpoint_due(self, idle: bool = False) -> bool:
        """After a batch: a snapshot or a checkpoint is due. While idle: only time, and only if
        something was learned since the last checkpoint."""
        late = time.monotonic() - self.last >= self.every_seconds
        if idle:
            return self.since_checkpoint > 0 and late
        return self.snapshot_due or self.since_checkpoint >= self.every_records or late

    def checkpointed(self, snapshot: bool) -> None:
        self.since_checkpoint, self.last = 0, time.monotonic()
        if snapshot:
            self.since_snapshot = 0


class Pacer:
    """Limit consumption to ``rate`` records per second (None: unlimited), in ~50 ms steps, so
    that a paced run still learns in batches of ``rate/20`` records rather than one at a time."""

    STEP_S = 0.05

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._t0 = time.monotonic()
        self._done = 0

    @property
    def step(self) -> int:
        """Records per step (paced runs only)."""
        return max(1, int((self.rate or 0.0) * self.STEP_S))

    def _budget(self, rate: float) -> float:
        return rate * (time.monotonic() - self._t0) - self._done

    def allowance(self, maximum: int) -> int:
        """Records that may be read now (0: wait first). Time spent idle (waiting for a consumer
        group assignment, an empty topic) is not saved up for a later burst beyond one step."""
        if self.rate is None:
            return maximum
        step = min(maximum, max(1, int(self.rate * self.STEP_S)))
        if self._budget(self.rate) > 2 * step:
            self._done = int(self.rate * (time.monotonic() - self._t0)) - step
        budget = int(self._budget(self.rate))
        return min(maximum, budget) if budget >= step else 0

    def consumed(self, records: int) -> None:
        self._done += records

    def wait(self, timeout_s: float) -> None:
        """Sleep until the next step is allowed (at most ``timeout_s``)."""
        if self.rate is not None:
            step = max(1.0, self.rate * self.STEP_S)
            time.sleep(min(timeout_s, max(0.001, (step - self._budget(self.rate)) / self.rate)))
