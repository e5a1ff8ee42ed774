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
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

from panpriv.protocols.errors import ProtocolError
from panpriv.streamer.config import ServiceConfig
from panpriv.streamer.errors import LearnerInputError
from panpriv.streamer.io.codec import Codec, Decoded
from panpriv.streamer.io.sinks import DeadLetterSink
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.driver import STOPPED, Driver, Outcome, Resumable
from panpriv.streamer.runtime.heartbeat import Heartbeat
from panpriv.streamer.runtime.pacing import Pacer
from panpriv.streamer.runtime.reject_guard import RejectGuard
from panpriv.streamer.runtime.status import RejectLog
from panpriv.streamer.sources.base import Batch, Source
from panpriv.streamer.state.training_state import TrainingState


class StreamDriver(Driver):
    """Feeds ``learn_many`` from a sequential source (module docstring)."""

    def __init__(
        self,
        config: ServiceConfig,
        state: TrainingState,
        source: Source,
        codec: Codec,
        metrics: ServiceMetrics,
        stop: threading.Event,
    ) -> None:
        super().__init__(state)
        self._config = config
        self._source = source
        self._codec = codec
        self._metrics = metrics
        self._stop = stop
        self.dead_letters: DeadLetterSink | None = None  # set once the sinks are open (after set-up)
        self._reject_guard = RejectGuard(codec, config.records.guard_records, config.records.guard_ratio)
        self._reject_log = RejectLog()

    def register_learner(self) -> None:
        report = self.state.learner.privacy()
        self.state.ledger.register(self.state.instance, report)
        if self.session is not None:
            self.session.register(self.state.instance, report, self.state.instance)

    def resumable(self) -> Resumable:
        learner = self.state.learner
        return Resumable(learner.checkpoint_state(), learner.records_seen, self.state.snapshot_records, replay=None)

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
        for decoded, first in self._decoded_groups(batch):
            if len(decoded.y):
                try:
                    state.learner.learn_many(decoded.X, decoded.y)
                except ProtocolError:
                    raise refused_records(state.learner.name) from None
            learned += len(decoded.y)
            counts.update(decoded.reject_counts())
            if decoded.rejects and self.dead_letters is not None:
                self._send_dead_letters(batch, decoded, first, self.dead_letters)
            wipe_records(decoded)
        # Keep the ledger's view of the learner current (a learner whose guarantee grows with
        # records is then checked against max_epsilon at the next batch).
        self.register_learner()
        for key, (start, stop) in batch.ranges.items():
            state.ledger.charge(state.instance, key, start, stop)
            state.positions[key] = stop
        if counts:
            state.rejects.update(counts)
            self._metrics.observe_rejects(dict(counts))
            self._reject_log.note(dict(counts), ", ".join(f"{k} [{a}, {b})" for k, (a, b) in batch.ranges.items()))
        self._metrics.observe_batch(learned, time.perf_counter() - t0, batch.consumed, sum(counts.values()))
        return learned, learned + sum(counts.values())

    def _decoded_groups(self, batch: Batch) -> Iterator[tuple[Decoded, int]]:
        """The batch decoded in consecutive groups of messages of at most ``source.batch_bytes``
        payload bytes each (at least one message), with each group's first message index: the
        decoded float64 arrays of one group are in memory at a time, whatever the message packing
        (a Kafka poll is bounded in messages, not bytes)."""
        if batch.arrays is not None:
            yield self._codec.validate_arrays(*batch.arrays), 0
            return
        budget = self._config.source.batch_bytes
        first, size = 0, 0
        for index, payload in enumerate(batch.payloads):
            if size and size + len(payload) > budget:
                yield self._codec.decode(batch.payloads[first:index]), first
                first, size = index, 0
            size += len(payload)
        if first < len(batch.payloads):
            yield self._codec.decode(batch.payloads[first:]), first

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
