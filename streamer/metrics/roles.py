"""Building blocks of the metrics of the service's other roles: the Encode–Shuffle–Analyze shuffler
and analyzer (:mod:`panpriv.streamer.esa.metrics`) and the scale-out worker and coordinator
(:mod:`panpriv.streamer.scaleout.metrics`).

Each role keeps running totals of its own; Prometheus counters want increments, so
:class:`CumulativeCounts` and :class:`CumulativeTotal` turn totals into increments (and start from
the totals a restored state already reported). :class:`RoleMetrics` holds a role's registry, its
``*_info`` series, the process and platform collectors and its ``/metrics`` server (:func:`panpriv.streamer.metrics.service.serve_registry`).
:class:`PrivacyGauges` exports a role's composed privacy statement under the service's own series
names, so the deploy/ alerts on ``panpriv_privacy_epsilon`` cover every role. What is exported is
what may leave a process: counts and the privacy numbers of statements, never a statistic of a
record, a message or a clean gradient.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.arg_types import port_or_zero
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.metrics.service import GUARANTEES, register_process_collectors, serve_registry

__all__ = ["CumulativeCounts", "CumulativeTotal", "PrivacyGauges", "RoleMetrics", "metrics_flags", "serve_metrics"]

log = logging.getLogger("panpriv.metrics")


class CumulativeCounts:
    """Increments of a counter with one label, from cumulative totals per label value; every value
    of ``values`` is exported at 0 from the start (a rate over a series that appears at its first
    event is lost)."""

    def __init__(self, counter: Counter, label: str, values: Iterable[str], start: Mapping[str, int] | None = None) -> None:
        self._counter = counter
        self._label = label
        self._seen: dict[str, int] = {}
        for value in values:
            counter.labels(**{label: value})
        self.start(start or {})

    def start(self, totals: Mapping[str, int]) -> None:
        """Totals already counted elsewhere (a restored state): later updates count from them."""
        self._seen = {key: int(total) for key, total in totals.items()}

    def update(self, totals: Mapping[str, int]) -> None:
        for value, total in totals.items():
            delta = int(total) - self._seen.get(value, 0)
            if delta > 0:
                self._counter.labels(**{self._label: value}).inc(delta)
            self._seen[value] = max(int(total), self._seen.get(value, 0))


class CumulativeTotal:
    """Increments of an unlabelled counter from a cumulative total."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._seen = 0.0

    def start(self, total: float) -> None:
        """A total already counted elsewhere (a restored state)."""
        self._seen = total

    def update(self, total: float) -> None:
        if total > self._seen:
            self._counter.inc(total - self._seen)
            self._seen = total


class RoleMetrics:
    """A role's registry (injected, or its own) with the process and platform collectors, its
    ``<info_name>_info`` series and its server."""

    def __init__(self, registry: CollectorRegistry | None, info_name: str, info_help: str) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        register_process_collectors(self.registry)
        self._info = Info(info_name, info_help, registry=self.registry)

    def set_info(self, role: str, deployment: str, version: str) -> None:
        """Label the info series (constant 1)."""
        self._info.info({"role": role, "deployment": deployment, "version": version})

    def serve(self, port: int, addr: str = "127.0.0.1") -> Callable[[], None]:
        """Serve ``/metrics`` on ``addr:port``; return the function that stops the server."""
        return serve_registry(self.registry, port, addr, f"{type(self).__name__}.serve")


class PrivacyGauges:
    """``panpriv_privacy_epsilon{guarantee}``, ``panpriv_privacy_delta{guarantee}``,
    ``panpriv_budget_epsilon{source, guarantee}`` and ``panpriv_privacy_epsilon_budget{guarantee}``
    on ``registry``: the names of :class:`panpriv.streamer.metrics.service.ServiceMetrics`' series."""

    def __init__(self, registry: CollectorRegistry, epsilon_help: str) -> None:
        self._epsilon = Gauge("panpriv_privacy_epsilon", epsilon_help, ["guarantee"], registry=registry)
        self._delta = Gauge("panpriv_privacy_delta", "Per-record delta of the same guarantee.", ["guarantee"],
                            registry=registry)
        self._budget = Gauge("panpriv_budget_epsilon", "Per data source, epsilon composed over every run.",
                             ["source", "guarantee"], registry=registry)
        self._epsilon_budget = Gauge("panpriv_privacy_epsilon_budget", "--max-epsilon (absent when not set).",
                                     ["guarantee"], registry=registry)

    def observe(self, report: PrivacyReport, sources: Mapping[str, tuple[Guarantee, Guarantee]]) -> None:
        """A statement's guarantees and, per data source, the composed (output, intrusion) ε."""
        for name, guarantee in (("output", report.output), ("intrusion", report.intrusion)):
            self._epsilon.labels(guarantee=name).set(guarantee.epsilon)
            self._delta.labels(guarantee=name).set(guarantee.delta)
        for source, (output, intrusion) in sources.items():
            self._budget.labels(source=source, guarantee="output").set(output.epsilon)
            self._budget.labels(source=source, guarantee="intrusion").set(intrusion.epsilon)

    def set_budget(self, max_epsilon: float | None) -> None:
        """``--max-epsilon`` for both guarantees (``None``: no series)."""
        if max_epsilon is not None:
            for guarantee in GUARANTEES:
                self._epsilon_budget.labels(guarantee=guarantee).set(max_epsilon)


def metrics_flags(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` (default 0: none) and ``--metrics-addr`` of a role's command."""
    parser.add_argument("--metrics-port", type=port_or_zero, default=0,
                        help="serve Prometheus metrics on this port (default 0: none)")
    parser.add_argument("--metrics-addr", default="127.0.0.1",
                        help="address of the metrics endpoint (default 127.0.0.1: this machine only; 0.0.0.0 for every "
                             "interface, as in a container scraped from another)")


def serve_metrics(metrics: RoleMetrics, args: argparse.Namespace) -> Callable[[], None] | None:
    """Start a role's endpoint from :func:`metrics_flags`' arguments (``None`` without a port); a
    busy port is a usage error: a service must not run unwatched."""
    if not args.metrics_port:
        return None
    try:
        stop = metrics.serve(args.metrics_port, args.metrics_addr)
    except OSError as exc:
        raise ConfigError(f"--metrics-port {args.metrics_port} on {args.metrics_addr}: {exc.strerror}; choose a free "
                          "port, or 0 for none") from None
    log.info("metrics at http://%s:%d/metrics", args.metrics_addr, args.metrics_port)
    return stop
