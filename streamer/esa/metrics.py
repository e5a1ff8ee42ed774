"""Prometheus metrics of the ESA shuffler and analyzer (``--metrics-port``; served by
:func:`panpriv.streamer.metrics.service.serve_registry`, on an injected registry like
:class:`panpriv.streamer.metrics.service.ServiceMetrics`).

What may be exported is what may leave the process (docs/privacy.md): counts of rounds and
messages, reject and drop counts by reason (public quantities: the statements say so), and the
privacy numbers of the analyzer's *report* — never a statistic of a message or of the model.
Every reason is exported at 0 from the start (a rate over a series that appears at its first event
is lost). No ``_created`` series (:mod:`panpriv.streamer.metrics.service` disables them for the process).

Analyzer series
---------------
``panpriv_esa_rounds_total``
    Rounds analysed (a step taken, a model published).
``panpriv_esa_messages_total``
    Messages accepted: opened, valid, and averaged into a step.
``panpriv_esa_rejected_total{reason}``
    Units (per-unit reasons) and batch records (per-batch reasons: unsigned, forged, replayed, out
    of order, duplicated…) rejected, by reason (:data:`panpriv.streamer.esa.analyzer.REJECT_REASONS`).
``panpriv_esa_round``
    The round whose model is published (the next one to analyse).
``panpriv_last_checkpoint_timestamp_seconds``
    Unix time of the last durable analyzer checkpoint.
``panpriv_privacy_epsilon{guarantee}``, ``panpriv_privacy_delta{guarantee}``
    The analyzer's statement — the deployment's guarantee composed over every run that used the
    same data source (:meth:`panpriv.streamer.budget.session.BudgetSession.composed`) — for ``output`` and
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
    Rounds released (acknowledged on the shuffled topic) and the units in them (a message's, or
    each of a user's m shares).
``panpriv_esa_shuffler_waiting_messages``
    Messages held for rounds not yet complete.
``panpriv_esa_shuffler_dropped_total{reason}``
    Messages dropped by the shuffler's public rules (:data:`panpriv.streamer.esa.shuffler.DROP_REASONS`).
``panpriv_esa_shuffler_last_released_round``
    The round of the last released batch (−1: none).
``panpriv_esa_info{role, deployment, version}``
    Constant 1 (``deployment`` is the messages topic for the shuffler).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.metrics.roles import CumulativeCounts, PrivacyGauges, RoleMetrics


class _Role(RoleMetrics):
    def __init__(self, registry: CollectorRegistry | None) -> None:
        super().__init__(registry, "panpriv_esa", "What this ESA process runs.")


class AnalyzerMetrics(_Role):
    """The analyzer's series (module docstring)."""

    def __init__(self, reasons: Iterable[str], rejected: Mapping[str, int] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self._rounds = Counter("panpriv_esa_rounds", "Rounds analysed (a step taken, a model published).", registry=r)
        self._messages = Counter("panpriv_esa_messages", "Messages accepted (valid, averaged into a step).", registry=r)
        self._rejected = CumulativeCounts(
            Counter("panpriv_esa_rejected", "Messages or batch records rejected by the analyzer, by reason.",
                    ["reason"], registry=r), "reason", reasons, rejected)
        self._round = Gauge("panpriv_esa_round", "The round whose model is published.", registry=r)
        self._checkpoint = Gauge("panpriv_last_checkpoint_timestamp_seconds",
                                 "Unix time at which the last checkpoint became durable (0 before the first).", registry=r)
        self._privacy = PrivacyGauges(r, "Per-record epsilon of the analyzer's statement "
                                      "(composed over every run on the data source).")

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
        self._privacy.observe(report, sources)

    def set_epsilon_budget(self, max_epsilon: float | None) -> None:
        """``--max-epsilon`` for both guarantees (``None``: no series)."""
        self._privacy.set_budget(max_epsilon)


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
        self._dropped = CumulativeCounts(
            Counter("panpriv_esa_shuffler_dropped", "Messages dropped by the shuffler's public rules, by reason.",
                    ["reason"], registry=r), "reason", reasons)
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
