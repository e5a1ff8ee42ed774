"""What one run holds between checkpoints: the learner, its ledger, positions and counters.

A :class:`TrainingState` is the in-memory counterpart of a checkpoint manifest
(:class:`panpriv.streamer.state.checkpoint.Checkpoint`): everything in it is either noisy learner state or a
public count, and everything a resume needs is in it. The drivers (:mod:`panpriv.streamer.runtime.stream_driver`,
:mod:`panpriv.streamer.runtime.recorded_driver`) advance it, the checkpoint transaction
(:mod:`panpriv.streamer.runtime.transaction`) saves it, and the processor builds it anew or from a manifest.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from panpriv.accounting.ledger import PrivacyLedger
from panpriv.protocols.base import Learner


def new_instance(learner: Learner) -> str:
    """A fresh ledger instance id for ``learner`` (its name and 48 random bits)."""
    return f"{learner.name}-{uuid.uuid4().hex[:12]}"


@dataclass
class TrainingState:
    """The learner and the bookkeeping that goes with it (module docstring).

    ``positions``: the next unread position of every source key; ``rejects``: rejected records
    by reason; ``sequence``: checkpoints taken; ``snapshots``: snapshots released;
    ``snapshot_records``: records covered by the last snapshot (-1: none yet).
    """

    learner: Learner
    ledger: PrivacyLedger
    instance: str
    positions: dict[str, int]
    rejects: Counter[str] = field(default_factory=Counter)
    sequence: int = 0
    snapshots: int = 0
    snapshot_records: int = -1
    last_snapshot: dict[str, Any] | None = None

    def over_budget(
        self, limit: float | None, ranges: Mapping[str, tuple[int, int]] | None = None, instance: str | None = None
    ) -> float | None:
        """The ε this run's own ledger would reach by charging ``ranges`` to ``instance`` (default:
        the learner's; a registered one), or reaches now, if above ``limit`` (``None``: no limit).

        ε is the largest finite ε of the output and intrusion guarantees (an intrusion guarantee
        that is already 'none', as in seeded test mode, is not a budget)."""
        if limit is None:
            return None
        instance = instance or self.instance
        worst = 0.0
        use_sets = [seg.uses for key in self.ledger.sources for seg in self.ledger.coverage(key)]
        if ranges:
            use_sets += [uses + (instance,) for uses in self._uses_in(ranges)] + [(instance,)]
        for uses in use_sets:
            for guarantee in self.ledger.record_guarantee(uses):
                if guarantee.epsilon != float("inf"):
                    worst = max(worst, guarantee.epsilon)
        return worst if worst > limit * (1 + 1e-12) else None

    def _uses_in(self, ranges: Mapping[str, tuple[int, int]]) -> Iterator[tuple[str, ...]]:
        for key, (start, stop) in ranges.items():
            for segment in self.ledger.coverage(key):
                if segment.start < stop and segment.stop > start:
                    yield segment.uses
