"""Prometheus metrics of the ESA shuffler and analyzer (``--metrics-port``; served by
:func:`streamer.metrics.serve_registry`, on an injected registry like
:class:`streamer.metrics.ServiceMetrics`).

What may be exported is what may leave the process (docs/privacy.md): counts of rounds and
messages, reject and drop counts by reason (public quantities: the statements say so), and the
privacy numbers of the analyzer's *report* — never a statistic of a message or of the model.
Every reason is exported at 0 from the start (a rate over a series that appears at its first event
is lost). No ``_created`` series (:mod:`streamer.metrics` disables them for the process).

Analyzer series
---------------
``panpriv_esa_rounds_total``
    Rounds analysed (a step taken, a model published).
``panpriv_esa_messages_total``
    Messages accepted: opened, valid, and averaged into a step.
``panpriv_esa_rejected_total{reason}``
    Messages (per-message reasons) and batch records (per-batch reasons) rejected, by reason
    (:data:`streamer.esa.analyzer.REJECT_REASONS`).
``panpriv_esa_round``
    The round whose model is published (the next one to analyse).
``panpriv_last_checkpoint_timestamp_seconds``
    Unix time of the last durable analyzer checkpoint.
``panpriv_privacy_epsilon{guarantee}``, ``panpriv_privacy_delta{guarantee}``
    The analyzer's statement — the deployment's guarantee composed over every run that used the
    same data source (:meth:`streamer.esa.budget.AnalyzerBudget.report`) — for ``output`` and
    ``intrusion``; the names of the service's series, so the deploy/ alert on
    ``panpriv_privacy_epsilon / panpriv_privacy_epsilon_budget`` covers the analyzer too.
``panpriv_budget_epsilon{source, guarantee}``
    The deployment's data key (``esa:<cluster>/<messages topic>``), ε composed over all runs.
``panpriv_privacy_epsilon_budget{guarantee}``
    ``--max-epsilon`` when set.
``panpriv_esa_info{role, deployment, version}``
    Constant 1.

Shuffler series
---------------
``panpriv_esa_shuffler_rounds_released_total``, ``panpriv_esa_shuffler_messages_released_total``
    Rounds released (acknowledged on the shuffled topic) and the messages in them.
``panpriv_esa_shuffler_waiting_messages``
    Messages held for rounds not yet complete.
``panpriv_esa_shuffler_dropped_total{reason}``
    Messages dropped by the shuffler's public rules (:data:`streamer.esa.shuffler.DROP_REASONS`).
``panpriv_esa_shuffler_last_released_round``
    The round of the last released batch (−1: none).
``panpriv_esa_info{role, deployment, version}``
    Constant 1 (``deployment`` is the messages topic for the shuffler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from accounting.ledger import Guarantee, PrivacyReport
from streamer.metrics import GUARANTEES, serve_registry


class _Counts:
    """Counter increments from cumulative counts (the roles keep totals; Prometheus wants increments)."""

    def __init__(self, counter: Counter, reasons: Iterable[str], start: Mapping[str, int]) -> None:
        self._counter = counter
        self._seen = dict(start)
        for reason in reasons:
            counter.labels(reason=reason)  # exported at 0 from the start

    def update(self, totals: Mapping[str, int]) -> None:
        for reason, total in totals.items():
            delta = int(total) - self._seen.get(reason, 0)
            if delta > 0:
                self._counter.labels(reason=reason).inc(delta)
            self._seen[reason] = int(total)


class _Role:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._info = Info("panpriv_esa", "What this ESA process runs.", registry=self.registry)

    def set_info(self, role: str, deployment: str, version: str) -> None:
        self._info.info({"role": role, "deployment": deployment, "version": version})

    def serve(self, port: int, addr: str = "0.0.0.0") -> Callable[[], None]:
        """Serve ``/metrics`` on ``addr:port``; return the function that stops the server."""
        return serve_registry(self.registry, port, addr, f"{type(self).__name__}.serve")


class AnalyzerMetrics(_Role):
    """The analyzer's series (module docstring)."""

    def __init__(self, reasons: Iterable[str], rejected: Mapping[str, int] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self._rounds = Counter("panpriv_esa_rounds", "Rounds analysed (a step taken, a model published).", registry=r)
        self._messages = Counter("panpriv_esa_messages", "Messages accepted (valid, averaged into a step).", registry=r)
        self._rejected = _Counts(
            Counter("panpriv_esa_rejected", "Messages or batch records rejected by the analyzer, by reason.",
                    ["reason"], registry=r), reasons, rejected or {})
        self._round = Gauge("panpriv_esa_round", "The round whose model is published.", registry=r)
        self._checkpoint = Gauge("panpriv_last_checkpoint_timestamp_seconds",
                                 "Unix time at which the last checkpoint became durable (0 before the first).", registry=r)
        self._epsilon = Gauge("panpriv_privacy_epsilon", "Per-record epsilon of the analyzer's statement "
                              "(composed over every run on the data source).", ["guarantee"], registry=r)
        self._delta = Gauge("panpriv_privacy_delta", "Per-record delta of the analyzer's statement.", ["guarantee"],
                            registry=r)
        self._budget = Gauge("panpriv_budget_epsilon", "Per data source, epsilon composed over every run.",
                             ["source", "guarantee"], registry=r)
        self._epsilon_budget = Gauge("panpriv_privacy_epsilon_budget", "--max-epsilon (absent when not set).",
                                     ["guarantee"], registry=r)

    def observe_round(self, accepted: int) -> None:
        """One round analysed with ``accepted`` valid messages."""
        self._rounds.inc()
        self._messages.inc(accepted)

    def observe_state(self, round_: int, rejected: Mapping[str, int]) -> None:
        """The published round and the cumulative reject counts."""
        self._round.set(round_)
        self._rejected.update(rejected)

    def observe_checkpoint(self, timestamp: float) -> None:
        self._checkpoint.set(timestamp)

    def observe_privacy(self, report: PrivacyReport, sources: Mapping[str, tuple[Guarantee, Guarantee]]) -> None:
        """The statement's guarantees, and per data source the composed ε (never from a message)."""
        for name, guarantee in (("output", report.output), ("intrusion", report.intrusion)):
            self._epsilon.labels(guarantee=name).set(guarantee.epsilon)
            self._delta.labels(guarantee=name).set(guarantee.delta)
        for source, (output, intrusion) in sources.items():
            self._budget.labels(source=source, guarantee="output").set(output.epsilon)
            self._budget.labels(source=source, guarantee="intrusion").set(intrusion.epsilon)

    def set_epsilon_budget(self, max_epsilon: float | None) -> None:
        if max_epsilon is not None:
            for guarantee in GUARANTEES:
                self._epsilon_budget.labels(guarantee=guarantee).set(max_epsilon)


class ShufflerMetrics(_Role):
    """The shuffler's series (module docstring)."""

    def __init__(self, reasons: Iterable[str], registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self._rounds = Counter("panpriv_esa_shuffler_rounds_released", "Rounds released on the shuffled topic.",
                               registry=r)
        self._messages = Counter("panpriv_esa_shuffler_messages_released", "Messages in the released rounds.",
                                 registry=r)
        self._waiting = Gauge("panpriv_esa_shuffler_waiting_messages", "Messages held for incomplete rounds.",
                              registry=r)
        self._dropped = _Counts(
            Counter("panpriv_esa_shuffler_dropped", "Messages dropped by the shuffler's public rules, by reason.",
                    ["reason"], registry=r), reasons, {})
        self._last = Gauge("panpriv_esa_shuffler_last_released_round", "Round of the last released batch (-1: none).",
                           registry=r)

    def observe_release(self, messages: int) -> None:
        """One round released with ``messages`` messages."""
        self._rounds.inc()
        self._messages.inc(messages)

    def observe_state(self, last_released: int, waiting: int, dropped: Mapping[str, int]) -> None:
        self._last.set(last_released)
        self._waiting.set(waiting)
        self._dropped.update(dropped)
