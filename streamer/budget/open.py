"""The budget store a configuration names: SQLite in a state directory, or a compacted Kafka topic."""

from __future__ import annotations

from typing import Any

from panpriv.streamer.budget.store import BudgetStore, default_state_dir


def open_budget(config: Any) -> Any:
    """The budget store a :class:`~panpriv.streamer.config.ServiceConfig` names: the compacted Kafka topic
    ``[budget] kafka_topic`` (:mod:`panpriv.streamer.budget.kafka_store`) if set, else the SQLite store in
    ``[budget] state_dir`` (default :func:`default_state_dir`)."""
    budget = config.budget
    k = config.learner.max_records_per_user
    if budget.kafka_topic:
        from panpriv.streamer.budget.kafka_store import KafkaBudgetStore
        from panpriv.streamer.errors import ConfigError
        from panpriv.streamer.io.source_url import KafkaUrl, parse_source_url

        if budget.kafka_bootstrap:
            bootstrap = [h for h in budget.kafka_bootstrap.split(",") if h]
        elif isinstance(source := parse_source_url(config.source.url), KafkaUrl):
            bootstrap = source.bootstrap
        else:
            raise ConfigError("budget.kafka_bootstrap is required when budget.kafka_topic is set and the source is not Kafka")
        return KafkaBudgetStore(bootstrap, budget.kafka_topic, k)
    return BudgetStore(budget.state_dir or default_state_dir(), k)
