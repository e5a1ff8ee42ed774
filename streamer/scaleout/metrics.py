"""Prometheus metrics of ``panpriv worker`` and ``panpriv coordinate`` (``--metrics-port``; served by
:func:`panpriv.streamer.metrics.service.serve_registry`, on an injected registry like :class:`panpriv.streamer.metrics.service.ServiceMetrics`
and :mod:`panpriv.streamer.esa.metrics`).

What may be exported is what may leave the process (docs/privacy.md, "Scale-out"): counts of
batches, records, rejects, lost batches, version waits and noisy means — public quantities: the
worker batch w and the step's K come from the public plan, and rejects are public as for the
service — the model's version, and the privacy numbers the worker reads from the budget store.
Never a statistic of a record, of a partial sum or of a clean gradient: nothing here is computed
from records. Every reason and outcome is exported at 0 from the start (a rate over a series that
appears at its first event is lost). No ``_created`` series (:mod:`panpriv.streamer.metrics.service` disables them
for the process). Counters count this process's events: the roles keep cumulative totals (a
restored coordinator starts from the model record's) and report them; increments are derived here.

Worker series
-------------
``panpriv_scaleout_worker_batches_published_total``
    Noisy batch means published to the gradients topic (acknowledged by the broker).
``panpriv_scaleout_worker_records_total``
    Valid records learned into published batches (w per batch).
``panpriv_scaleout_worker_records_rejected_total{reason}``
    Records rejected by the codec, by reason (:class:`panpriv.streamer.io.codec.Reason`; charged to the budget
    like valid ones, as in the service), per read: a record read again after its batch was handed
    back is counted (and charged) again.
``panpriv_scaleout_worker_batches_lost_total{reason}``
    Batches that reached no output (:data:`LOST_REASONS`): ``revoked`` (partitions revoked by a
    rebalance mid-batch), ``handed_back`` (its version closed before it was published: its records
    returned to the stream, :mod:`panpriv.streamer.scaleout.tally`), ``stopped`` (SIGTERM/SIGINT or the model done mid-batch), ``budget`` (the
    next records would exceed ``--max-epsilon`` over all runs), ``crash`` (on a restart with the
    same ``--out``, what the last process charged and never published). Their records are charged
    as an intrusion-only use (:mod:`panpriv.streamer.scaleout.worker`).
``panpriv_scaleout_worker_version_waits_total{outcome}``
    Waits for version v + 1 after publishing at v (synchronous versions), by outcome
    (:data:`WAIT_OUTCOMES`): ``arrived`` (version v + 1 was read) or ``timed_out`` (after
    ``--sync-wait`` the worker took another batch at v, a place being left there: a worker gone);
    and ``claim_lost``: a place the worker claimed went to an earlier claim (another worker took
    it at the same moment, :mod:`panpriv.streamer.scaleout.tally`), so it waits again, having read nothing.
``panpriv_scaleout_worker_version_wait_seconds_total``
    Seconds spent in those waits.
``panpriv_scaleout_worker_model_version``
    The newest model version the worker has read (−1 before the first).
``panpriv_privacy_epsilon{guarantee}``, ``panpriv_privacy_delta{guarantee}``
    The guarantee of the records this worker learned (and lost), composed over every run that used
    them, from the budget store (:func:`panpriv.accounting.budget.report_for`), for ``output`` and
    ``intrusion``: the service's names, so deploy/'s ``PanprivPrivacyBudgetHigh`` covers workers.
    Refreshed at most every ``privacy_interval_s`` seconds (the store composes every use).
``panpriv_budget_epsilon{source, guarantee}``
    Per data source the worker has charged (``kafka:<cluster>/<topic>/<partition>``), the ε
    composed over every run that used its records, worst record.
``panpriv_privacy_epsilon_budget{guarantee}``
    ``--max-epsilon`` when set.
``panpriv_scaleout_info{role="worker", deployment, version}``
    Constant 1.

Coordinator series
------------------
``panpriv_scaleout_coordinator_steps_total``
    AC-SA steps applied (each publishes a new model version).
``panpriv_scaleout_coordinator_means_received_total``
    Gradient records of this deployment read from the gradients topic (and malformed ones, whose
    deployment is unknown). A restarted coordinator re-reads the means of the step in progress.
``panpriv_scaleout_coordinator_means_used_total``
    Means averaged into a step (K per step).
``panpriv_scaleout_coordinator_means_stale_total``
    Means dropped because they name another version than the current one.
``panpriv_scaleout_coordinator_means_rejected_total{reason}``
    Means dropped as ``malformed`` or of the ``wrong_shape`` (:data:`MEAN_REJECT_REASONS`).
``panpriv_scaleout_coordinator_model_version``
    The version last published to the model topic.
``panpriv_scaleout_coordinator_last_published_timestamp_seconds``
    Unix time at which the broker acknowledged that version.
``panpriv_scaleout_coordinator_waiting_version``
    The version whose K means the coordinator waits for (the means computed at it; the step
    publishes the next version); with
    ``panpriv_scaleout_coordinator_means_missing`` (K minus the means in) and
    ``panpriv_scaleout_coordinator_waiting_seconds`` (since the last step, or the start).
``panpriv_scaleout_coordinator_waiting_on{worker}``
    1 for each worker holding a live open-batch lease at that version (whose mean is awaited);
    a worker's series is removed when its lease ends.
``panpriv_scaleout_info{role="coordinator", deployment, version}``
    Constant 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.metrics.roles import CumulativeCounts, CumulativeTotal, PrivacyGauges, RoleMetrics

LOST_REASONS = ("revoked", "handed_back", "stopped", "budget", "crash")
WAIT_OUTCOMES = ("arrived", "timed_out", "claim_lost")
MEAN_REJECT_REASONS = ("malformed", "wrong_shape")


class _Role(RoleMetrics):
    def __init__(self, registry: CollectorRegistry | None) -> None:
        super().__init__(registry, "panpriv_scaleout", "What this scale-out process runs.")


class WorkerMetrics(_Role):
    """The worker's series (module docstring)."""

    def __init__(self, reject_reasons: Iterable[str] | None = None, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        if reject_reasons is None:
            from panpriv.streamer.io.codec import Reason

            reject_reasons = [reason.value for reason in Reason]
        r = self.registry
        p = "panpriv_scaleout_worker"
        self._published = CumulativeTotal(Counter(f"{p}_batches_published", "Noisy batch means published.", registry=r))
        self._records = CumulativeTotal(Counter(f"{p}_records", "Valid records learned into published batches.", registry=r))
        self._rejected = CumulativeCounts(Counter(f"{p}_records_rejected", "Records rejected by the codec, by reason.",
                                         ["reason"], registry=r), "reason", reject_reasons)
        self._lost = CumulativeCounts(Counter(f"{p}_batches_lost", "Batches that reached no output, by reason.", ["reason"],
                                     registry=r), "reason", LOST_REASONS)
        self._waits = CumulativeCounts(Counter(f"{p}_version_waits", "Waits for the next model version, by outcome.",
                                      ["outcome"], registry=r), "outcome", WAIT_OUTCOMES)
        self._wait_seconds = CumulativeTotal(Counter(f"{p}_version_wait_seconds", "Seconds spent waiting for the next version.",
                                            registry=r))
        self._version = Gauge(f"{p}_model_version", "The newest model version read (-1 before the first).", registry=r)
        self._version.set(-1)
        self._privacy = PrivacyGauges(r, "Per-record epsilon of the records this worker learned, "
                                      "composed over every run that used them (budget store).")

    def observe_totals(self, published: int, records: int, rejected: Mapping[str, int], lost: Mapping[str, int],
                       waits: Mapping[str, int], wait_seconds: float, version: int) -> None:
        """The worker's cumulative counts (:class:`panpriv.streamer.scaleout.worker.WorkerStats`) and newest version."""
        self._published.update(published)
        self._records.update(records)
        self._rejected.update(rejected)
        self._lost.update(lost)
        self._waits.update(waits)
        self._wait_seconds.update(wait_seconds)
        self._version.set(version)

    def observe_privacy(self, report: PrivacyReport, sources: Mapping[str, tuple[Guarantee, Guarantee]]) -> None:
        """The composed statement and, per data source, the composed ε (from the budget store)."""
        self._privacy.observe(report, sources)

    def set_epsilon_budget(self, max_epsilon: float | None) -> None:
        """``--max-epsilon`` for both guarantees (``None``: no series)."""
        self._privacy.set_budget(max_epsilon)


class CoordinatorMetrics(_Role):
    """The coordinator's series (module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        p = "panpriv_scaleout_coordinator"
        self._steps = Counter(f"{p}_steps", "AC-SA steps applied (model versions published).", registry=r)
        self._received = Counter(f"{p}_means_received", "Gradient records of this deployment read.", registry=r)
        self._used = Counter(f"{p}_means_used", "Means averaged into a step.", registry=r)
        self._stale = CumulativeTotal(Counter(f"{p}_means_stale", "Means dropped: another version than the current one.",
                                     registry=r))
        self._rejected = CumulativeCounts(Counter(f"{p}_means_rejected", "Means dropped as malformed or of the wrong shape.",
                                         ["reason"], registry=r), "reason", MEAN_REJECT_REASONS)
        self._version = Gauge(f"{p}_model_version", "The version last published.", registry=r)
        self._published_at = Gauge(f"{p}_last_published_timestamp_seconds",
                                   "Unix time at which the last version was acknowledged (0 before the first).", registry=r)
        self._waiting_version = Gauge(f"{p}_waiting_version", "The version whose K means are awaited.", registry=r)
        self._missing = Gauge(f"{p}_means_missing", "Means still missing for the awaited version.", registry=r)
        self._waiting_s = Gauge(f"{p}_waiting_seconds", "Seconds since the last step (or the start).", registry=r)
        self._waiting_on = Gauge(f"{p}_waiting_on", "1 per worker holding an open batch at the awaited version.",
                                 ["worker"], registry=r)
        self._on: set[str] = set()

    def resume(self, stale: int, rejected: Mapping[str, int]) -> None:
        """The totals a restored coordinator starts from (from the model record): not counted again."""
        self._stale.start(stale)
        self._rejected.start(rejected)

    def observe_mean(self, stale: int, rejected: Mapping[str, int]) -> None:
        """One gradient record read, and the coordinator's cumulative stale and reject counts."""
        self._received.inc()
        self._stale.update(stale)
        self._rejected.update(rejected)

    def observe_step(self, means: int) -> None:
        """One step applied from ``means`` means."""
        self._steps.inc()
        self._used.inc(means)

    def observe_published(self, version: int, timestamp: float) -> None:
        """``version`` acknowledged by the broker at Unix time ``timestamp``."""
        self._version.set(version)
        self._published_at.set(timestamp)

    def observe_waiting(self, version: int, missing: int, seconds: float, open_at: Iterable[str]) -> None:
        """What the coordinator waits for: ``version``, ``missing`` means, for ``seconds``, from
        the workers ``open_at`` holding an open batch there."""
        self._waiting_version.set(version)
        self._missing.set(missing)
        self._waiting_s.set(seconds)
        workers = set(open_at)
        for gone in self._on - workers:
            self._waiting_on.remove(gone)
        for worker in workers:
            self._waiting_on.labels(worker=worker).set(1)
        self._on = workers
