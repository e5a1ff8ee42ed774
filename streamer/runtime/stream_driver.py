"""The stream driver: poll a micro-batch, charge it, validate it, learn it, account it.

Each micro-batch of a sequential source (:mod:`panpriv.streamer.sources`) goes through, in order:

1. the run's own ledger: stop *before* a batch whose charge would raise ε above
   ``learner.max_epsilon`` (an outcome, not a crash);
2. the reject-ratio guard (:mod:`panpriv.streamer.runtime.reject_guard`): a misconfiguration stops here, before
   anything is charged;
3. the budget store (:mod:`panpriv.streamer.budget.session`): the batch's position ranges are charged
   durably before anything is learned, refused if the records' ε over all runs would exceed
   ``max_epsilon``;
4. decode and validate (rejects counted by reason, optionally sent to a dead-letter topic; valid
   records clipped), ``learn_many`` the valid records, register the learner's guarantee, charge
   the ledger with the whole consumed range, and advance the positions;
5. the heartbeat (:mod:`panpriv.streamer.runtime.heartbeat`): cadence, progress, status, checkpoint when due.

What is charged. The ledger is charged with the whole consumed range of each batch, rejected
records and non-record lines included: conservative (a rejected record is accounted as if used,
which can only over-state what was spent) and compact (one segment per source key). A replay of
the same range by the same learner — a rewound consumer group, a file replayed into the same
``--out`` after its positions were reset — composes in the ledger rather than being counted once.

Batch boundaries. A learner that saves only states at batch boundaries (``pan-acsa``:
:meth:`panpriv.protocols.base.Learner.records_to_boundary`) is fed each micro-batch in pieces that end
at its boundaries. When one falls inside a micro-batch the driver keeps a :class:`Boundary`: the
learner's state there with the positions, the ledger charged up to there and the reject counts of
the messages before it. A checkpoint taken while a batch is open persists that boundary (never
the open batch's accumulator), so a resume re-reads the records after it — at most one batch —
and the budget store, which has their charges beyond the checkpoint's positions, counts their
earlier use as a lost state (:mod:`panpriv.streamer.budget.session`). A boundary inside a message
of several records (a binary batch) is saved as the message's position plus the rows of it
already learned (``partial``); the resumed run skips those rows of the re-read message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from panpriv.protocols.errors import ProtocolError
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.errors import LearnerInputError
from panpriv.streamer.io.codec import Codec, Decoded
from panpriv.streamer.io.sinks import DeadLetterSink
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.driver import STOPPED, Driver, Outcome, Resumable
from panpriv.streamer.runtime.heartbeat import Heartbeat
from panpriv.streamer.runtime.learners import planned_length
from panpriv.streamer.runtime.pacing import Pacer
from panpriv.streamer.runtime.reject_guard import RejectGuard
from panpriv.streamer.runtime.status import RejectLog
from panpriv.streamer.sources.base import Batch, Source
from panpriv.streamer.state.checkpoint import copied_state, wipe_state
from panpriv.streamer.state.training_state import TrainingState

log = logging.getLogger("panpriv.processor")


@dataclass(frozen=True)
class Boundary:
    """What a checkpoint saves while a batch is open: the learner's state at the last batch
    boundary and the bookkeeping of that moment (module docstring, "Batch boundaries")."""

    learner_state: dict[str, Any]
    records: int
    positions: dict[str, int]
    ledger: dict[str, Any]
    rejects: dict[str, int]
    partial: dict[str, int] = field(default_factory=dict)
    marks: dict[str, int] | None = None  # Kafka: timestamps of the records before the positions


@dataclass(frozen=True)
class _Cut:
    """A batch boundary inside a micro-batch: before message ``message`` of the batch, plus the
    first ``rows`` valid rows of it; the learner's state there."""

    message: int
    rows: int
    learner_state: dict[str, Any]
    records: int


class StreamDriver(Driver):
    """Feeds ``learn_many`` from a sequential source (module docstring).

    ``resumed``: the learner state, partly learned messages and Kafka marks of the checkpoint the
    run resumed from (``None``: a new run).
    """

    def __init__(
        self,
        config: ServiceConfig,
        state: TrainingState,
        source: Source,
        codec: Codec,
        metrics: ServiceMetrics,
        stop: threading.Event,
        resumed: tuple[Mapping[str, Any], Mapping[str, int], Mapping[str, int]] | None = None,
    ) -> None:
        super().__init__(state)
        self._config = config
        self._source = source
        self._codec = codec
        self._metrics = metrics
        self._stop = stop
        self.dead_letters: DeadLetterSink | None = None  # set once the sinks are open (after set-up)
        self._reject_guard = RejectGuard(codec, config.records.guard_records, config.records.guard_ratio)
        self._planned = planned_length(state.learner)
        self._warned_past_plan = False
        self._reject_log = RejectLog()
        learner = state.learner
        saved_state, partial, marks = resumed if resumed is not None else (learner.state_dict(), {}, {})
        # The rows of a partly learned message to skip when it is read again, by key and position.
        self._skip = {key: (state.positions[key], rows) for key, rows in partial.items() if key in state.positions}
        self._boundary = Boundary(
            dict(saved_state), learner.state_records, dict(state.positions), state.ledger.to_dict(),
            dict(state.rejects), dict(partial), dict(marks),
        )

    def register_learner(self) -> None:
        report = self.state.learner.privacy()
        self.state.ledger.register(self.state.instance, report)
        if self.session is not None:
            self.session.register(self.state.instance, report, self.state.instance)

    def resumable(self, finished: bool = False) -> Resumable:
        """The live state, or — while a batch is open for a learner that saves only boundaries —
        the last boundary (module docstring). ``finished``: the source has no more records, so the
        open batch can never be completed: the boundary's state is saved with the live positions,
        ledger and counts, and the open batch's records, charged as used, reach no output."""
        state = self.state
        learner = state.learner
        if learner.records_to_boundary() is not None and learner.state_records != learner.records_seen:
            if finished:
                log.info("the source ended inside a batch: its last %s records reach no output (a batch needs %s more)",
                         f"{learner.records_seen - learner.state_records:,}", f"{learner.records_to_boundary():,}")
                return Resumable(learner.checkpoint_state(), learner.state_records, state.snapshot_records, None,
                                 dict(state.positions), state.ledger.to_dict(), dict(state.rejects))
            b = self._boundary
            return Resumable(copied_state(b.learner_state), b.records, state.snapshot_records, None, dict(b.positions),
                             b.ledger, dict(b.rejects), dict(b.partial), b.marks)
        return Resumable(learner.checkpoint_state(), learner.records_seen, state.snapshot_records, None,
                         dict(state.positions), state.ledger.to_dict(), dict(state.rejects))

    def progress_span(self) -> tuple[int | None, int]:
        try:
            total = self._source.total_positions()
        except Exception:  # noqa: BLE001 - progress is cosmetic; a failed size query must not stop a run
            total = None
        return total, self.progress_position()

    def progress_position(self) -> int:
        return sum(self.state.positions.values())

    def drive(self, heartbeat: Heartbeat, pacer: Pacer) -> tuple[Outcome, str]:
        cfg = self._config
        session = self._session()
        while not self._stop.is_set():
            heartbeat.lag.refresh()
            limit = pacer.allowance(cfg.source.batch_records)
            if limit == 0:
                self._source.keep_alive()  # a paced wait reads no record: a Kafka consumer stays in its group
                pacer.wait(cfg.source.poll_timeout_s)
                continue
            batch = self._source.poll(limit, cfg.source.poll_timeout_s, cfg.source.batch_bytes)
            if batch is None:
                if self._source.exhausted:
                    return "finished", "the source is exhausted"
                heartbeat.idle()
                continue
            over = self.state.over_budget(cfg.learner.max_epsilon, batch.ranges)
            if over is not None:
                return "budget_exhausted", (
                    f"stopped before learning a batch that would raise ε to {over:.4g} "
                    f"(max_epsilon = {cfg.learner.max_epsilon}); its records were not used"
                )
            self._reject_guard.check(batch)  # a misconfiguration stops here, before any charge (panpriv.streamer.runtime.reject_guard)
            refused = session.charge(self.state.instance, batch.ranges, self.state.ledger.instances)  # durable first
            if refused is not None:
                return "budget_exhausted", refused
            learned, handled = self._process(batch)
            session.learned_here += learned
            pacer.consumed(handled)
            heartbeat.batch(handled)
        return "stopped", STOPPED

    def _process(self, batch: Batch) -> tuple[int, int]:
        """Learn one batch and charge its ranges; return the records learned, and handled in all
        (learned + rejected)."""
        t0 = time.perf_counter()
        state = self.state
        learned, counts = 0, Counter[str]()
        cut: _Cut | None = None
        rejected_before: list[tuple[int, str, int]] = []  # (message, reason, count) of every reject
        skip = self._rows_to_skip(batch) if self._skip else {}
        for decoded, first in self._decoded_groups(batch):
            if skip:
                decoded = self._skip_rows(decoded, first, skip)
            if len(decoded.y):
                try:
                    learned_cut = self._learn(decoded, first, skip)
                    if learned_cut is not None:
                        if cut is not None:
                            wipe_state(cut.learner_state)
                        cut = learned_cut
                except ProtocolError:
                    raise refused_records(state.learner.name) from None
            learned += len(decoded.y)
            counts.update(decoded.reject_counts())
            rejected_before += [(first + r.index, r.reason.value, r.count) for r in decoded.rejects]
            if decoded.rejects and self.dead_letters is not None:
                self._send_dead_letters(batch, decoded, first, self.dead_letters)
            wipe_records(decoded)
        self._warn_past_plan()
        # Keep the ledger's view of the learner current (a learner whose guarantee grows with
        # records is then checked against max_epsilon at the next batch).
        self.register_learner()
        charged = self._keep_boundary(batch, cut, rejected_before) if cut is not None else {}
        for key, (start, stop) in batch.ranges.items():
            state.ledger.charge(state.instance, key, charged.get(key, start), stop)
            state.positions[key] = stop
        if counts:
            state.rejects.update(counts)
            self._metrics.observe_rejects(dict(counts))
            self._reject_log.note(dict(counts), ", ".join(f"{k} [{a}, {b})" for k, (a, b) in batch.ranges.items()))
        self._metrics.observe_batch(learned, time.perf_counter() - t0, batch.consumed, sum(counts.values()))
        return learned, learned + sum(counts.values())

    def _warn_past_plan(self) -> None:
        """Once per process: the learner has read past the stream length it was planned for (a
        Kafka topic longer than ``--n``), with what that means for it (:meth:`Learner.beyond_plan`)."""
        learner = self.state.learner
        if self._planned is None or self._warned_past_plan or learner.records_seen <= self._planned:
            return
        self._warned_past_plan = True
        log.warning("read past the planned n = %s records (learner.n): for %s, %s", f"{self._planned:,}", learner.name,
                    learner.beyond_plan(self._planned))

    def _learn(self, decoded: Decoded, first: int, skipped: Mapping[int, int]) -> _Cut | None:
        """``learn_many`` the group's valid rows, in pieces that end at the learner's batch
        boundaries; the last boundary reached, if any (``first``: the group's first message;
        ``skipped``: rows of a message that the state held already, by the batch's message index)."""
        learner = self.state.learner
        X, y, origin = decoded.X, decoded.y, decoded.origin
        cut = None
        start = 0
        while start < len(y):
            room = learner.records_to_boundary()
            stop = len(y) if room is None else min(len(y), start + room)
            learner.learn_many(X[start:stop], y[start:stop])
            if room is not None and stop - start == room:
                if cut is not None:
                    wipe_state(cut.learner_state)  # superseded by this boundary
                message = int(origin[stop - 1])
                rows = stop - int(np.searchsorted(origin, message))  # its valid rows learned so far
                if stop == len(y) or int(origin[stop]) != message:
                    message, rows = message + 1, 0  # the whole message is in the state
                cut = _Cut(first + message, rows + skipped.get(first + message, 0) if rows else 0,
                           learner.state_dict(), learner.state_records)
            start = stop
        return cut

    def _keep_boundary(self, batch: Batch, cut: _Cut, rejects: list[tuple[int, str, int]]) -> dict[str, int]:
        """Charge the batch up to ``cut`` and keep the :class:`Boundary` there (before the rest is
        charged and the positions advance); return the positions charged up to."""
        state = self.state
        positions, partial = cut_positions(batch, cut.message, cut.rows)
        for key, (start, _) in batch.ranges.items():
            state.ledger.charge(state.instance, key, start, positions[key])
        rejected = Counter(state.rejects)
        for message, reason, count in rejects:
            if message < cut.message:
                rejected[reason] += count
        wipe_state(self._boundary.learner_state)
        marks = cut_marks(batch, cut.message, positions) if batch.timestamps else None
        self._boundary = Boundary(cut.learner_state, cut.records, {**state.positions, **positions},
                                  state.ledger.to_dict(), dict(rejected), partial, marks)
        return positions

    def _rows_to_skip(self, batch: Batch) -> dict[int, int]:
        """After a resume at a boundary inside a message (``partial``): the batch's index of that
        message, if it is read again now (the first of its key, at the saved position), and the
        rows of it the restored state already holds. Asked once, for the first batch."""
        skip: dict[int, int] = {}
        for key, (position, rows) in self._skip.items():
            message = next((i for i, k in enumerate(batch.keys) if k == key), None)
            if message is not None and batch.positions[message] == position:
                skip[message] = rows
        self._skip.clear()
        return skip

    @staticmethod
    def _skip_rows(decoded: Decoded, first: int, skip: Mapping[int, int]) -> Decoded:
        """``decoded`` without the first ``skip[m]`` valid rows of each message m of the batch (the
        group's first message is ``first``); the dropped rows' arrays are wiped."""
        keep = np.ones(len(decoded.y), dtype=bool)
        for message, rows in skip.items():
            keep[np.flatnonzero(decoded.origin == message - first)[:rows]] = False
        if keep.all():
            return decoded
        kept = Decoded(decoded.X[keep], decoded.y[keep], decoded.rejects, decoded.origin[keep])
        wipe_records(decoded)
        return kept

    def _decoded_groups(self, batch: Batch) -> Iterator[tuple[Decoded, int]]:
        """The batch decoded in consecutive groups of messages of at most ``source.batch_bytes``
        payload bytes each (at least one message), with each group's first message index: the
        decoded float64 arrays of one group are in memory at a time, whatever the message packing
        (a Kafka poll is bounded in messages, not bytes)."""
        if batch.arrays is not None:
            yield self._codec.validate_arrays(*batch.arrays), 0
            return
        yield from self._codec.decode_groups(batch.payloads, self._config.source.batch_bytes)

    @staticmethod
    def _send_dead_letters(batch: Batch, decoded: Decoded, first: int, sink: DeadLetterSink) -> None:
        """Each rejected message of a group (whose first message is ``first`` in the batch) once."""
        sent: set[int] = set()
        for reject in decoded.rejects:
            index = first + reject.index
            if index in sent:
                continue
            sent.add(index)
            sink.send(batch.payloads[index], reject.reason.value, batch.keys[index], batch.positions[index])


def cut_positions(batch: Batch, message: int, rows: int) -> tuple[dict[str, int], dict[str, int]]:
    """The positions of the batch's keys at a cut before message ``message`` of the batch (plus the
    first ``rows`` valid rows of it: a partly learned message keeps its own position), and the
    partly learned message as ``{key: rows}``.

    Per key: its range's end if all its messages lie before the cut, its range's start if none
    does, otherwise the position of its first message at or after the cut."""
    if batch.arrays is not None:  # one key, one record per row
        ((key, (start, stop)),) = batch.ranges.items()
        return {key: min(start + message, stop)}, {}
    first_after: dict[str, int] = {}
    before: set[str] = set()
    for index, key in enumerate(batch.keys):
        if index < message:
            before.add(key)
        elif key not in first_after:
            first_after[key] = batch.positions[index]
    positions = {}
    for key, (start, stop) in batch.ranges.items():
        if key in first_after:
            positions[key] = first_after[key]
        else:
            positions[key] = stop if key in before or message >= len(batch.keys) else start
    partial = {batch.keys[message]: rows} if rows and message < len(batch.keys) else {}
    return positions, partial


def cut_marks(batch: Batch, message: int, positions: dict[str, int]) -> dict[str, int]:
    """For a Kafka batch: the timestamp of the record just before each key's position at a cut
    before message ``message`` (the offset-regression mark, :mod:`panpriv.streamer.kafka.calls`),
    for the keys whose last message before the cut is that record."""
    marks = {}
    for index in range(min(message, len(batch.keys))):
        key = batch.keys[index]
        if batch.positions[index] + 1 == positions.get(key):
            marks[key] = batch.timestamps[index]
    return marks


def wipe_records(decoded: Decoded) -> None:
    """Zero the decoded records once learned, so a later dump of the process does not find them in
    freed memory (docs/privacy.md, "Process memory"); read-only views (of a message's bytes) are
    left as they are."""
    for array in (decoded.X, decoded.y):
        if array.flags.writeable:
            array.fill(0.0)


def refused_records(name: str) -> LearnerInputError:
    """The error for a learner refusing validated records. Its own message may quote record values
    (e.g. an unexpected label), so it is not passed on; the state may be partly updated, so the
    run stops without a checkpoint."""
    return LearnerInputError(
        f"learner {name!r} refused a validated micro-batch; the [records] domain (label_values / label_min / "
        "label_max, dim) does not match what the learner accepts. Details are withheld because they may quote "
        "record values."
    )
