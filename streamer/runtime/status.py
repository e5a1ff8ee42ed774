"""A periodic status line in the log, for a service that no one watches on a terminal.

Off a terminal the progress bar (:mod:`panpriv.streamer.runtime.progress`) is off, and a long-running service
would otherwise log nothing between its start and its stop. Every ``status_interval_s`` seconds
(top-level setting, ``--status-every``; 0 turns it off) :class:`StatusLine` logs one INFO line:
records learned, rejected records by reason, consumer lag in records, the current ε (output and
intrusion), and when the next checkpoint is due. With ``--log-format json`` the same numbers are a
``status`` object of the log record (:mod:`panpriv.streamer.commands.logs`). Every number is a public count or a
privacy figure, never a statistic of the records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from panpriv.accounting.ledger import PrivacyReport
from panpriv.streamer.runtime.pacing import Cadence

log = logging.getLogger("panpriv.status")


class StatusLine:
    """Logs the status at most every ``interval_s`` seconds (``None`` or 0: never)."""

    def __init__(self, interval_s: float | None) -> None:
        self.interval_s = interval_s or None
        self._due = time.monotonic() + (interval_s or 0.0)

    def tick(
        self,
        records: int,
        rejects: Mapping[str, int],
        lag: Callable[[], Mapping[str, int] | None],
        report: Callable[[], PrivacyReport],
        cadence: Cadence,
    ) -> None:
        """Log the status line if it is due (the callables are only called then)."""
        now = time.monotonic()
        if self.interval_s is None or now < self._due:
            return
        self._due = now + self.interval_s
        lags = lag()
        privacy = report()
        status: dict[str, Any] = {
            "records": records,
            "rejected": dict(sorted(rejects.items())),
            "lag_records": sum(lags.values()) if lags else None,  # None: not Kafka, unknown, or nothing assigned yet
            "epsilon_output": privacy.output.epsilon,
            "epsilon_intrusion": privacy.intrusion.epsilon,
            "next_checkpoint_records": max(0, cadence.every_records - cadence.since_checkpoint),
            "next_checkpoint_seconds": round(max(0.0, cadence.last + cadence.every_seconds - now), 1),
        }
        log.info("status: %s", describe(status), extra={"status": status})


def describe(status: Mapping[str, Any]) -> str:
    """``records 12,000 learned, 3 rejected (wrong_dimension: 3), lag 250 records, ε = 0.5 output /
    0.5 intrusion, next checkpoint in ≤ 4.0 s or 1,000 records``."""
    rejected = status["rejected"]
    total = sum(rejected.values())
    reasons = f" ({', '.join(f'{k}: {v:,}' for k, v in rejected.items())})" if total else ""
    lag = "lag unknown" if status["lag_records"] is None else f"lag {status['lag_records']:,} records"
    return (
        f"records {status['records']:,} learned, {total:,} rejected{reasons}, {lag}, "
        f"ε = {status['epsilon_output']:.4g} output / {status['epsilon_intrusion']:.4g} intrusion, "
        f"next checkpoint in ≤ {status['next_checkpoint_seconds']:.1f} s or {status['next_checkpoint_records']:,} records"
    )


class RejectLog:
    """Logs a WARNING the first time each rejection reason occurs in a run (the status line then
    carries the running totals), with the position of that first rejected record — never its content."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def note(self, counts: Mapping[str, int], where: str) -> None:
        for reason, count in counts.items():
            if count and reason not in self._seen:
                self._seen.add(reason)
                log.warning("records rejected as %r (first in %s); counted in panpriv_records_rejected_total and the "
                            "status line%s", reason, where, "" if reason != "wrong_dimension" else "; check records.dim")
