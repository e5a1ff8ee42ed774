"""Learners that read a recording by record index: what they declare, how their passes are
accounted, and the driver that runs them.

Most learners take a stream in arrival order (:meth:`panpriv.protocols.base.Learner.learn_many` on each
micro-batch). Some need the whole recording at hand and choose which record comes next:
:class:`panpriv.protocols.pnsgd.ShuffledPNSGD` visits the n records in the order of one uniformly random
permutation (Sordello et al. 2021, Thm 2); a multi-pass learner such as ``shuffle-gd`` (Cheu et al. 2022, Alg. 5) reads every
record once per round. The processor drives such a learner over an :class:`~panpriv.streamer.io.indexed.IndexedFile`
instead of a sequential source. A learner takes part by subclassing
:class:`panpriv.protocols.recorded.RecordedLearner` (``n``, ``learn_recorded(fetch, micro_batch)``,
``resumes_mid_pass``, ``reports_per_round``/``round_reports()``, ``passes``), not by its name. The
processor's ``fetch`` is where it takes control between micro-batches: it accounts, checkpoints and
snapshots the batch just learned, and stops the run by raising :class:`Halt`. A learner that
reports per round (``shuffle-gd``) has pass ``p`` as its own ledger instance :func:`panpriv.streamer.budget.units.pass_instance`,
registered with the pass's *increment* of the learner's composed guarantee, so the ledger's
composition of the T uses of a record telescopes to the learner's figure instead of composing the
cumulative figure T times. Otherwise the learner's :meth:`~panpriv.protocols.base.Learner.privacy` covers
everything and each pass is charged to the one instance (right for one pass; over-counts, never
under-counts, for several).

Ledger. A pass uses every record of the recording, so when a pass begins its instance is charged
with the whole :attr:`~panpriv.streamer.io.indexed.IndexedFile.extent` (every position of every source key,
rejected messages included, as the sequential path charges them) — each record once per pass.
Charging only the positions visited so far would not be more precise: for ShuffledPNSGD the
guarantee of every record is an average over the random order (Sordello et al. 2021, App. A), and the set of
visited positions is information about the permutation that must not be kept at rest. The
rejects of the recording are counted once per pass, as a sequential replay counts them.

Crash and restart mid-pass (``resumes_mid_pass = False``). Whatever the interrupted pass released
was registered in a durable checkpoint before it left the process (snapshots follow their
checkpoint), together with the charge of the whole recording to its instance. The resumed run
restores the learner as it was at the start of the pass, gives the restarted pass a fresh instance
id, and charges it again when it begins: the ledger composes the interrupted pass's releases with
the new pass (basic composition), and ``learner.max_epsilon`` can stop the run before the new pass
spends anything.

The driver. A :class:`~panpriv.protocols.recorded.RecordedLearner` (``shuffled-pnsgd``, ``shuffle-gd``) gets an
:class:`~panpriv.streamer.io.indexed.IndexedFile` and runs ``learn_recorded(fetch, micro_batch)``;
:class:`RecordedDriver` takes control in the ``fetch`` it hands the learner, between two
micro-batches, and does there what the stream driver does after a batch. The exactly-once argument
of :mod:`panpriv.streamer.runtime.processor` holds with "positions" replaced by "records learned in
the pass" (saved in the learner's state); a learner that cannot resume mid-pass restarts the pass
after a crash, as a new ledger instance composed with what the interrupted pass released.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.protocols.base import Learner
from panpriv.protocols.errors import ProtocolError
from panpriv.protocols.recorded import RecordedLearner
from panpriv.streamer.budget.units import pass_instance
from panpriv.streamer.config import ServiceConfig, SourceConfig
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.codec import Codec
from panpriv.streamer.io.indexed import IndexedFile
from panpriv.streamer.io.source_url import FileUrl, parse_source_url
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.driver import STOPPED, Driver, Outcome, Resumable
from panpriv.streamer.runtime.heartbeat import Heartbeat
from panpriv.streamer.runtime.pacing import Pacer
from panpriv.streamer.runtime.stream_driver import refused_records
from panpriv.streamer.state.checkpoint import ReplayMarks, copied_state
from panpriv.streamer.state.training_state import TrainingState

log = logging.getLogger("panpriv.replay")


class Halt(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised from ``fetch`` to end a recorded run between two micro-batches."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


def reads_by_index(learner_cls: type[Learner]) -> bool:
    """True if instances of ``learner_cls`` read a recording by record index."""
    return issubclass(learner_cls, RecordedLearner)


def open_indexed(config: SourceConfig, codec: Codec, learner: str) -> IndexedFile:
    """The record-index reader for ``config.url``; a :class:`ConfigError` if the source cannot be
    read by index (a :class:`~panpriv.streamer.errors.SourceError` if the file cannot)."""
    parsed = parse_source_url(config.url)
    if not isinstance(parsed, FileUrl):
        raise ConfigError(
            f"learner {learner!r} reads a recording by record index, so its source must be file:PATH "
            "(a panpriv recording, JSONL or CSV); record a Kafka topic first with `panpriv record`"
        )
    if config.recorded_pace:
        raise ConfigError(
            f"source.recorded_pace: learner {learner!r} chooses the order of the records, so recorded "
            "timestamps cannot pace it; use source.rate"
        )
    path = parsed.path
    log.info("indexing %s: decoding and validating every record once", path)
    started = time.monotonic()
    indexed = IndexedFile(path, codec)
    rejected = sum(indexed.rejects.values())
    log.info("indexed %s valid records (%s rejected) in %.1f s", f"{indexed.n:,}", f"{rejected:,}", time.monotonic() - started)
    return indexed


@dataclass(frozen=True)
class _Boundary:
    """The learner's state at a pass boundary, and the counters that go with it."""

    state: dict[str, Any]
    records: int
    snapshot_records: int
    passes_charged: int


class RecordedDriver(Driver):
    """Drives a :class:`RecordedLearner` over a recording read by index (module docstring).

    ``replay``: the pass marks of the checkpoint resumed from (``None``: a new run).
    """

    def __init__(
        self,
        config: ServiceConfig,
        state: TrainingState,
        source: IndexedFile,
        metrics: ServiceMetrics,
        stop: threading.Event,
        replay: ReplayMarks | None,
    ) -> None:
        super().__init__(state)
        if not isinstance(state.learner, RecordedLearner):
            raise TypeError(f"learner {state.learner.name!r} does not read a recording by index")
        self._learner: RecordedLearner = state.learner
        self._config = config
        self._source = source
        self._metrics = metrics
        self._stop = stop
        self._passes_charged = replay.passes_charged if replay is not None else 0  # passes charged with the recording
        self._store_pass = self._passes_charged  # the last pass (1-based) charged in the budget store
        self._rounds_registered = 0  # rounds of a per-round learner registered in the ledger
        self._boundary: _Boundary | None = None  # state at the last pass boundary (resumes_mid_pass False)

    # -- what a checkpoint asks ------------------------------------------------------------------

    def register_learner(self) -> None:
        """Register the learner's current guarantee: one instance, or one per pass begun for a
        learner that reports per round (a round's report is fixed once it has begun, so the
        reports are asked for only when a round begins: they cost O(rounds))."""
        learner, state = self._learner, self.state
        if not learner.reports_per_round:
            report = learner.privacy()
            state.ledger.register(state.instance, report)
            if self.session is not None:
                self.session.register(state.instance, report, state.instance)
            return
        begun = -(-learner.records_seen // learner.n)
        if begun <= self._rounds_registered:
            return
        for number, round_report in enumerate(learner.round_reports(), start=1):
            if number > self._rounds_registered:
                instance = pass_instance(state.instance, number)
                state.ledger.register(instance, round_report)
                if self.session is not None:
                    self.session.register(instance, round_report, state.instance)
        self._rounds_registered = begun

    def resumable(self, finished: bool = False) -> Resumable:
        """The current state, or, mid-pass for a learner that cannot resume a pass, the state at the
        pass's start with the mark that the pass restarts (:mod:`panpriv.streamer.runtime.recorded_driver`)."""
        boundary, state = self._boundary, self.state
        bookkeeping = {"positions": dict(state.positions), "ledger": state.ledger.to_dict(), "rejects": dict(state.rejects)}
        if boundary is not None and self._learner.records_seen != boundary.records:
            return Resumable(copied_state(boundary.state), boundary.records, boundary.snapshot_records,
                             ReplayMarks(boundary.passes_charged, restart=True), **bookkeeping)
        return Resumable(self._learner.checkpoint_state(), self._learner.records_seen, state.snapshot_records,
                         ReplayMarks(self._passes_charged), **bookkeeping)

    def note_boundary(self) -> None:
        """At a pass boundary of a learner that cannot resume mid-pass, keep what a resume restarts from."""
        learner = self._learner
        if not learner.resumes_mid_pass and learner.records_seen % learner.n == 0:
            self._boundary = _Boundary(learner.checkpoint_state(), learner.records_seen, self.state.snapshot_records,
                                       self._passes_charged)

    def progress_span(self) -> tuple[int | None, int]:
        return self._source.n * self._learner.passes, self._learner.records_seen  # records learned over all passes

    def progress_position(self) -> int:
        return self._learner.records_seen

    # -- the loop --------------------------------------------------------------------------------

    def drive(self, heartbeat: Heartbeat, pacer: Pacer) -> tuple[Outcome, str]:
        """Run ``learn_recorded``; the ``fetch`` given to it first accounts for the micro-batch
        just learned — charge a pass that began, register the guarantee, metrics, heartbeat — then
        stops the run if asked to (or before a pass that would exceed ``max_epsilon``), waits for
        the pacer, and reads the next records."""
        cfg = self._config
        learner, source, session = self._learner, self._source, self._session()
        micro_batch = cfg.source.batch_records if pacer.rate is None else min(cfg.source.batch_records, pacer.step)
        pending: tuple[int, float] | None = None  # (records before, start time) of the batch being learned

        def account() -> None:
            nonlocal pending
            if pending is None:
                return
            (before, started), pending = pending, None
            learned = learner.records_seen - before
            session.learned_here += learned
            self._charge_passes()
            self.register_learner()
            self._metrics.observe_batch(learned, time.perf_counter() - started)
            pacer.consumed(learned)
            self.note_boundary()
            heartbeat.batch(learned)

        def fetch(indices: NDArray[np.int64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
            nonlocal pending
            account()
            while True:
                if self._stop.is_set():
                    raise Halt("stopped", STOPPED)
                if pacer.allowance(len(indices)) >= len(indices):
                    break
                pacer.wait(cfg.source.poll_timeout_s)
            over = self._pass_over_budget()
            if over is not None:
                raise Halt("budget_exhausted", (
                    f"stopped before a pass that would raise ε to {over:.4g} (max_epsilon = "
                    f"{cfg.learner.max_epsilon}); nothing of it was used"
                ))
            refused = self._charge_pass_budget()
            if refused is not None:
                raise Halt("budget_exhausted", refused)
            started = time.perf_counter()
            X, y = source.fetch(indices)
            pending = (learner.records_seen, started)
            return X, y

        try:
            learner.learn_recorded(fetch, micro_batch=micro_batch)
        except Halt as halt:
            return cast(Outcome, halt.outcome), halt.message
        except ProtocolError:
            raise refused_records(learner.name) from None
        account()
        return "finished", "every pass over the recording is complete"

    # -- passes ----------------------------------------------------------------------------------

    def _pass_instance(self, number: int) -> str:
        """The ledger instance charged with pass ``number`` (1-based)."""
        return pass_instance(self.state.instance, number) if self._learner.reports_per_round else self.state.instance

    def _charge_passes(self) -> None:
        """Charge every pass begun since the last call with the whole recording, and count its rejects."""
        state, source = self.state, self._source
        begun = -(-self._learner.records_seen // self._learner.n)
        while self._passes_charged < begun:
            self._passes_charged += 1
            self.register_learner()
            instance = self._pass_instance(self._passes_charged)
            for key, (start, stop) in source.extent.items():
                state.ledger.charge(instance, key, start, stop)
                state.positions[key] = stop
            if source.rejects:
                state.rejects.update(source.rejects)
                self._metrics.observe_rejects(source.rejects)

    def _pass_over_budget(self) -> float | None:
        """The run's ledger check before the next micro-batch: if it begins a pass whose instance
        is already registered, with that pass's charge included."""
        limit = self._config.learner.max_epsilon
        if self._learner.records_seen == self._passes_charged * self._learner.n:
            instance = self._pass_instance(self._passes_charged + 1)
            if instance in self.state.ledger.instances:
                return self.state.over_budget(limit, self._source.extent, instance)
        return self.state.over_budget(limit)

    def _charge_pass_budget(self) -> str | None:
        """Before the first micro-batch of a pass, charge the whole recording to the pass's
        instance in the budget store (durably, before anything of the pass is learned). A pass
        instance not registered yet (a learner reporting per round knows a round's report only
        once the round has begun) is registered first as claiming no guarantee at all — safe if
        the process dies before the round's own report replaces it after its first micro-batch."""
        session, n = self._session(), self._learner.n
        number = self._learner.records_seen // n + 1
        if self._learner.records_seen % n or number <= self._store_pass:
            return None
        instance = self._pass_instance(number)
        if not session.is_registered(instance):
            session.register(instance, PrivacyReport(
                self._learner.name, 0, Guarantee.none(), Guarantee.none(),
                assumptions=("a round not begun yet: no guarantee is claimed until its own report is registered",),
            ), self.state.instance, provisional=True)
        refused = session.charge(instance, self._source.extent, self.state.ledger.instances)
        if refused is None:
            self._store_pass = number
        return refused
