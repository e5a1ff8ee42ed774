"""Prometheus metrics of the panpriv service, on an injected registry, served over HTTP.

:class:`ServiceMetrics` owns every ``panpriv_*`` series. The processor calls one ``observe_*``
method per event (a batch learned, records rejected, a checkpoint made durable, a snapshot emitted,
the ledger's report changed, consumer lag measured); :meth:`ServiceMetrics.serve` exposes the
registry on ``/metrics`` for Prometheus.

What may be exported. Every series is a count of records or events, a timing, a privacy number
from the ledger, or something computed from noisy state — never a statistic of raw records (no
loss, accuracy, feature or label summary of incoming data), because a metric leaves the process
and only noisy state may leave it (issue 8; docs/privacy.md). Counts of records are public
quantities in the accounting: the guarantees are stated for a stream whose length is known.

No ``_created`` series (prometheus-client's creation timestamps of counters and histograms):
they double the series count and no rule or panel uses them.

The registry is injected (a fresh :class:`~prometheus_client.CollectorRegistry` if none is given)
so that tests read values from it and several services can live in one process without clashing
on the global default registry.

Series
------
``panpriv_records_total``
    Valid records learned from (after validation and clipping).
``panpriv_records_rejected_total{reason}``
    Records rejected by the codec, by reason (a binary batch message that holds no record counts
    once, as ``empty_batch``); every reason of :class:`panpriv.streamer.io.codec.Reason` is
    exported from the start at 0 (a rate over a series that appears at its first reject is lost).
    Public, not noised: the privacy statement says so, and the guarantee covers neighbouring
    streams whose records have the same validity.
``panpriv_batches_total``, ``panpriv_batch_duration_seconds`` (histogram)
    Micro-batches learned and the wall time of each.
``panpriv_checkpoint_duration_seconds`` (histogram), ``panpriv_last_checkpoint_timestamp_seconds``
    Duration of each durable checkpoint and the Unix time at which the last one became durable.
``panpriv_snapshots_total``
    Snapshots emitted.
``panpriv_privacy_epsilon{guarantee}``, ``panpriv_privacy_delta{guarantee}``
    The current per-record guarantee for ``guarantee="output"`` (everything released) and
    ``guarantee="intrusion"`` (pan-privacy: one intrusion plus all outputs; Cheu et al. 2022, Def. C.2), from
    the ledger's :class:`~panpriv.accounting.ledger.PrivacyReport`. No guarantee is exported as ε = +Inf.
    This is the guarantee of the records this run learned, composed over every run that used them
    (the budget store, :mod:`panpriv.streamer.budget.store`).
``panpriv_budget_epsilon{source, guarantee}``
    Per data source this run reads (a data key of :mod:`panpriv.streamer.budget.store`: Kafka cluster/topic/
    partition, a file's content hash), the ε composed over every run that used its records, worst
    record; refreshed at every checkpoint.
``panpriv_privacy_epsilon_budget{guarantee}``
    ``learner.max_epsilon`` for both guarantees when it is set (absent otherwise): the alert
    ``PanprivPrivacyBudgetHigh`` divides ``panpriv_privacy_epsilon`` by it.
``panpriv_consumer_lag_messages{topic, partition}``
    Kafka messages (offsets) between the consumer position and the end of each assigned partition:
    refreshed every ``metrics.lag_interval_s`` seconds and at every checkpoint.
``panpriv_consumer_lag_records{topic, partition}``
    The same lag in records: messages times the records per message read so far (valid and
    rejected; 1 for one-record JSON/CSV messages, ~256 for binary batches). An estimate: the
    unread messages may hold another number of records.
``panpriv_holdout_score{metric}``, ``panpriv_holdout_records``
    With ``--holdout``: the last snapshot's scores on the user's public hold-out file (``auc``,
    ``accuracy``, ``log_loss`` or ``rmse``, …) and the number of its records they are computed
    on (0 without ``--holdout``) — a count apart from the scores, so that an aggregation over
    ``metric`` never mixes them: post-processing of a release on public data (:mod:`panpriv.streamer.serving.holdout`), never
    a statistic of the stream.
``panpriv_info{learner, source, version}``
    Constant 1, labelled with what this process runs.
``panpriv_seeded_mode``
    1 when the learner's noise is explicitly seeded (``--seed``: replay/testing mode, no
    pan-private guarantee), else 0; the ``PanprivSeededMode`` alert (deploy/) fires on 1, so a
    production run with a seed does not look normal on the dashboard.
``process_*``, ``python_info``
    prometheus-client's process collector (CPU seconds, resident and virtual memory, open file
    descriptors and their limit, start time; Linux) and platform collector (the Python
    implementation and version), on every role's registry (:func:`register_process_collectors`):
    the process's health beside its work.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.metrics import server

# Micro-batch wall time: from a 256-record batch of a cheap learner (~0.1 ms) to a stalled
# downstream (10 s). Checkpoints add fsync latency, so their range starts higher.
BATCH_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                         0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CHECKPOINT_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                              5.0, 10.0, 30.0)

GUARANTEES = ("output", "intrusion")

disable_created_metrics()  # module docstring


def register_process_collectors(registry: CollectorRegistry) -> None:
    """Add prometheus-client's process and platform collectors to ``registry`` (the default
    registry has them; a role's own registry needs them added: ``process_*`` and ``python_info``)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)


def _invalid(owner: str, name: str, constraint: str, value: object) -> ValueError:
    return ValueError(f"The {name!r} parameter of {owner} must be {constraint}. Got {value!r} instead.")


def _count(owner: str, name: str, value: object) -> int:
    """``value`` as a non-negative int (bool is refused: it is a flag, not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(owner, name, "an int >= 0", value)
    return value


def _seconds(owner: str, name: str, value: object) -> float:
    """``value`` as a finite float >= 0 (a duration or a Unix time)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value < math.inf):
        raise _invalid(owner, name, "a finite float >= 0", value)
    return float(value)


def _label(owner: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _invalid(owner, name, "a non-empty str", value)
    return value


def _topic_partition(key: str) -> tuple[str, str]:
    """``"events/2"`` -> ``("events", "2")`` (a topic name has no ``/``; a key without one is its own topic)."""
    topic, _, partition = key.rpartition("/")
    return (topic, partition) if topic else (key, "")


def _without_credentials(source: str) -> str:
    """``source`` with any ``user:password@`` removed, so that no secret becomes a label."""
    parts = urllib.parse.urlsplit(source)
    if parts.username is None and parts.password is None:
        return source
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class ServiceMetrics:
    """All panpriv Prometheus series, on an injected CollectorRegistry (a fresh one if None).

    Parameters
    ----------
    registry
        Where the series are registered. ``None`` creates a fresh registry (never the global
        default, so two instances in one process do not collide).

    Notes
    -----
    Counters only go up; callers report increments. Gauges hold the latest value reported.
    Invalid arguments raise ``ValueError`` naming the parameter, the constraint and the value.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        register_process_collectors(r)
        self._records = Counter("panpriv_records", "Valid records learned from.", registry=r)
        self._rejected = Counter(
            "panpriv_records_rejected", "Records rejected by validation, by reason.", ["reason"],
            registry=r,
        )
        from panpriv.streamer.io.codec import Reason

        for reason in Reason:
            self._rejected.labels(reason=reason.value)  # exported at 0 from the start
        self._batches = Counter("panpriv_batches", "Micro-batches learned.", registry=r)
        self._batch_seconds = Histogram(
            "panpriv_batch_duration_seconds", "Wall time to learn one micro-batch.",
            buckets=BATCH_SECONDS_BUCKETS, registry=r,
        )
        self._checkpoint_seconds = Histogram(
            "panpriv_checkpoint_duration_seconds", "Wall time to make one checkpoint durable.",
            buckets=CHECKPOINT_SECONDS_BUCKETS, registry=r,
        )
        self._last_checkpoint = Gauge(
            "panpriv_last_checkpoint_timestamp_seconds",
            "Unix time at which the last checkpoint became durable (0 before the first).",
            registry=r,
        )
        self._snapshots = Counter("panpriv_snapshots", "Snapshots emitted.", registry=r)
        self._epsilon = Gauge(
            "panpriv_privacy_epsilon",
            "Current per-record epsilon of the guarantee (output: all releases; intrusion: "
            "pan-private, one intrusion plus all releases). +Inf means no guarantee.",
            ["guarantee"], registry=r,
        )
        self._delta = Gauge(
            "panpriv_privacy_delta", "Current per-record delta of the guarantee.", ["guarantee"],
            registry=r,
        )
        self._budget_epsilon = Gauge(
            "panpriv_budget_epsilon",
            "Per data source read by this run (panpriv.streamer.budget.store data key), the epsilon composed over every "
            "run that used its records (budget store), worst record.",
            ["source", "guarantee"], registry=r,
        )
        self._epsilon_budget = Gauge(
            "panpriv_privacy_epsilon_budget",
            "learner.max_epsilon, the epsilon the service stops before exceeding (absent when not set).",
            ["guarantee"], registry=r,
        )
        self._lag_messages = Gauge(
            "panpriv_consumer_lag_messages",
            "Kafka messages (offsets) between the consumer position and the end of each assigned partition.",
            ["topic", "partition"], registry=r,
        )
        self._lag_records = Gauge(
            "panpriv_consumer_lag_records",
            "Estimated records between the consumer position and the end of each assigned partition "
            "(messages x records per message read so far).",
            ["topic", "partition"], registry=r,
        )
        self._lag_partitions: set[str] = set()
        self._messages_read = 0  # positions consumed (messages), for records per message
        self._records_read = 0  # valid and rejected records in them
        self._info = Info("panpriv", "What this process runs.", registry=r)
        self._holdout = Gauge(
            "panpriv_holdout_score",
            "The last snapshot's score on the public hold-out file (--holdout), by metric.",
            ["metric"], registry=r,
        )
        self._holdout_records = Gauge(
            "panpriv_holdout_records", "Records of the public hold-out file the scores are computed on.", registry=r,
        )
        self._seeded = Gauge(
            "panpriv_seeded_mode",
            "1 if the noise generator is explicitly seeded (replay/testing mode: no pan-private guarantee), else 0.",
            registry=r,
        )

    def observe_batch(self, records: int, seconds: float, messages: int | None = None, rejected: int = 0) -> None:
        """Count one learned micro-batch of ``records`` valid records that took ``seconds``;
        ``messages`` (positions consumed) and ``rejected`` feed the records-per-message estimate
        of ``panpriv_consumer_lag_records``."""
        owner = "ServiceMetrics.observe_batch"
        records = _count(owner, "records", records)
        seconds = _seconds(owner, "seconds", seconds)
        if messages is not None:
            self._messages_read += _count(owner, "messages", messages)
            self._records_read += records + _count(owner, "rejected", rejected)
        self._records.inc(records)
        self._batches.inc()
        self._batch_seconds.observe(seconds)

    def observe_rejects(self, counts: Mapping[str, int]) -> None:
        """Add rejected-record counts by reason; a zero count still creates the reason's series."""
        owner = "ServiceMetrics.observe_rejects"
        checked = {_label(owner, "reason", reason): _count(owner, f"counts[{reason!r}]", n)
                   for reason, n in counts.items()}
        for reason, n in checked.items():
            self._rejected.labels(reason=reason).inc(n)

    def observe_checkpoint(self, seconds: float, timestamp: float) -> None:
        """Record a checkpoint that took ``seconds`` and became durable at Unix time ``timestamp``."""
        owner = "ServiceMetrics.observe_checkpoint"
        seconds = _seconds(owner, "seconds", seconds)
        timestamp = _seconds(owner, "timestamp", timestamp)
        self._checkpoint_seconds.observe(seconds)
        self._last_checkpoint.set(timestamp)

    def observe_snapshot(self) -> None:
        """Count one emitted snapshot."""
        self._snapshots.inc()

    def observe_holdout(self, scores: Mapping[str, float]) -> None:
        """Export the last snapshot's hold-out scores (:mod:`panpriv.streamer.serving.holdout`):
        its ``records`` count on its own series, the scores by metric."""
        for metric, value in scores.items():
            if metric == "records":
                self._holdout_records.set(float(value))
            else:
                self._holdout.labels(metric=metric).set(float(value))

    def observe_privacy(self, report: PrivacyReport) -> None:
        """Export the output and intrusion guarantees of ``report`` (ε = inf is exported as +Inf)."""
        if not isinstance(report, PrivacyReport):
            raise _invalid("ServiceMetrics.observe_privacy", "report", "a PrivacyReport", report)
        for name, guarantee in (("output", report.output), ("intrusion", report.intrusion)):
            self._epsilon.labels(guarantee=name).set(guarantee.epsilon)
            self._delta.labels(guarantee=name).set(guarantee.delta)

    def observe_budget(self, sources: Mapping[str, tuple[Guarantee, Guarantee]]) -> None:
        """Export, per data source, the (output, intrusion) ε composed over all runs."""
        owner = "ServiceMetrics.observe_budget"
        for source, (output, intrusion) in sources.items():
            label = _label(owner, "source", source)
            self._budget_epsilon.labels(source=label, guarantee="output").set(output.epsilon)
            self._budget_epsilon.labels(source=label, guarantee="intrusion").set(intrusion.epsilon)

    def set_epsilon_budget(self, max_epsilon: float | None) -> None:
        """Export ``max_epsilon`` for both guarantees (``None``: no budget, no series)."""
        if max_epsilon is None:
            return
        value = _seconds("ServiceMetrics.set_epsilon_budget", "max_epsilon", max_epsilon)
        for guarantee in GUARANTEES:
            self._epsilon_budget.labels(guarantee=guarantee).set(value)

    @property
    def records_per_message(self) -> float:
        """Records (valid and rejected) per message read so far; 1 before the first batch."""
        return self._records_read / self._messages_read if self._messages_read else 1.0

    def observe_lag(self, lags: Mapping[str, int]) -> None:
        """Set the consumer lag of every currently assigned ``topic/partition`` (in messages, and
        in records by :attr:`records_per_message`).

        ``lags`` is the whole current assignment: the series of a partition missing from it
        (revoked in a rebalance) is removed, since its lag is now another consumer's to report.
        """
        owner = "ServiceMetrics.observe_lag"
        checked = {_label(owner, "partition", key): _count(owner, f"lags[{key!r}]", lag) for key, lag in lags.items()}
        for stale in self._lag_partitions - checked.keys():
            for gauge in (self._lag_messages, self._lag_records):
                gauge.remove(*_topic_partition(stale))
        ratio = self.records_per_message
        for key, lag in checked.items():
            topic, partition = _topic_partition(key)
            self._lag_messages.labels(topic=topic, partition=partition).set(lag)
            self._lag_records.labels(topic=topic, partition=partition).set(round(lag * ratio))
        self._lag_partitions = set(checked)

    def write_textfile(self, path: str) -> None:
        """Write the registry to ``path`` in the text format, atomically (node_exporter's textfile
        collector reads it): a replay shorter than a scrape interval still publishes its numbers.
        Mode 0644 whatever the umask: node_exporter runs as another user; nobody else may change it."""
        from prometheus_client import generate_latest

        from panpriv.streamer.state.atomic_files import PUBLIC_MODE, write_atomically

        write_atomically(Path(path), generate_latest(self.registry), "metrics textfile", mode=PUBLIC_MODE)

    def set_seeded(self, seeded: bool) -> None:
        """Report whether the noise is explicitly seeded (``panpriv_seeded_mode``)."""
        if not isinstance(seeded, bool):
            raise _invalid("ServiceMetrics.set_seeded", "seeded", "a bool", seeded)
        self._seeded.set(1 if seeded else 0)

    def set_info(self, learner: str, source: str, version: str) -> None:
        """Label ``panpriv_info`` with the learner, the source (credentials removed) and version."""
        owner = "ServiceMetrics.set_info"
        self._info.info({
            "learner": _label(owner, "learner", learner),
            "source": _without_credentials(_label(owner, "source", source)),
            "version": _label(owner, "version", version),
        })

    def serve(self, port: int, addr: str = "127.0.0.1") -> Callable[[], None]:
        """Serve the registry on ``http://addr:port/metrics``; return a function that stops it.

        The server (:mod:`panpriv.streamer.metrics.server`: a bounded number of connections, each
        with a deadline) runs in a daemon thread; calling the returned ``stop()`` shuts it down,
        closes its socket and joins the thread. Calling it again does nothing.
        """
        return serve_registry(self.registry, port, addr, "ServiceMetrics.serve")


def serve_registry(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1",
                   owner: str = "serve_registry") -> Callable[[], None]:
    """Serve ``registry`` on ``http://addr:port/metrics`` (:func:`panpriv.streamer.metrics.server.serve`,
    a daemon thread); return a function that stops it (shuts the server down, closes its socket,
    joins the thread; calling it again does nothing)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise _invalid(owner, "port", "an int in [1, 65535]", port)
    return server.serve(registry, port, _label(owner, "addr", addr))
