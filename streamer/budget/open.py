"""The budget store a process charges: SQLite in a state directory, or a compacted Kafka topic.

Every process opens it here, from the same settings (:class:`BudgetSettings`: ``panpriv run``'s
``[budget]`` section and ``learner.max_records_per_user``; the roles' ``--state-dir``,
``--budget-kafka``, ``--max-records-per-user``), so the declared records-per-user bound reaches
the store's user-level figures from every role, not only from ``run``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from panpriv.streamer.budget.store import BudgetStore, default_state_dir


@dataclass(frozen=True)
class BudgetSettings:
    """Where the store is and what a process may spend.

    ``state_dir``: the SQLite store's directory (default :func:`default_state_dir`);
    ``kafka_bootstrap`` and ``kafka_topic``: the store on a compacted topic instead (several
    machines); ``max_epsilon``: no record's ε, composed over every run, above it;
    ``max_records_per_user``: the declared bound for the user-level figures.
    """

    state_dir: Path | None = None
    kafka_bootstrap: tuple[str, ...] = ()
    kafka_topic: str | None = None
    max_epsilon: float | None = None
    max_records_per_user: int | None = None

    @classmethod
    def from_url(cls, state_dir: Path | None, kafka_url: str | None, max_epsilon: float | None = None,
                 max_records_per_user: int | None = None) -> BudgetSettings:
        """The settings of a role's flags: ``--state-dir``, or ``--budget-kafka kafka://host:port/topic``."""
        if kafka_url:
            from panpriv.streamer.io.source_url import parse_kafka_url

            spec = parse_kafka_url(kafka_url)
            return cls(None, tuple(spec.bootstrap), spec.topics[0], max_epsilon, max_records_per_user)
        return cls(state_dir, (), None, max_epsilon, max_records_per_user)

    def describe(self) -> str:
        """Where the store is, for a run summary."""
        if self.kafka_topic:
            return f"kafka://{','.join(self.kafka_bootstrap)}/{self.kafka_topic}"
        return str(self.state_dir or default_state_dir())


def open_store(settings: BudgetSettings) -> Any:
    """The store ``settings`` name (a :class:`BudgetStore`, or a
    :class:`panpriv.streamer.budget.kafka_store.KafkaBudgetStore`: the same interface)."""
    k = settings.max_records_per_user
    if settings.kafka_topic:
        from panpriv.streamer.budget.kafka_store import KafkaBudgetStore

        return KafkaBudgetStore(list(settings.kafka_bootstrap), settings.kafka_topic, k)
    return BudgetStore(settings.state_dir or default_state_dir(), k)


def run_settings(config: Any) -> BudgetSettings:
    """The settings of a :class:`~panpriv.streamer.config.ServiceConfig`: the compacted Kafka topic
    ``[budget] kafka_topic`` (on ``kafka_bootstrap``, default the source's brokers) if set, else
    the SQLite store in ``[budget] state_dir``."""
    budget = config.budget
    bootstrap: tuple[str, ...] = ()
    if budget.kafka_topic:
        from panpriv.streamer.errors import ConfigError
        from panpriv.streamer.io.source_url import KafkaUrl, parse_source_url

        if budget.kafka_bootstrap:
            bootstrap = tuple(h for h in budget.kafka_bootstrap.split(",") if h)
        elif isinstance(source := parse_source_url(config.source.url), KafkaUrl):
            bootstrap = tuple(source.bootstrap)
        else:
            raise ConfigError("budget.kafka_bootstrap is required when budget.kafka_topic is set and the source is not Kafka")
    return BudgetSettings(budget.state_dir, bootstrap, budget.kafka_topic, config.learner.max_epsilon,
                          config.learner.max_records_per_user)


def open_budget(config: Any) -> Any:
    """The budget store a :class:`~panpriv.streamer.config.ServiceConfig` names (:func:`run_settings`)."""
    return open_store(run_settings(config))
