"""``panpriv analyze`` as a service: the analyzer (:mod:`panpriv.streamer.esa.analyzer`) between Kafka, its
checkpoint, the budget store (:mod:`panpriv.streamer.esa.budget`) and its metrics
(:mod:`panpriv.streamer.esa.metrics`).

Per record of the shuffled topic, in order: the analyzer opens the batch; for the current round it
registers the statement and charges the round in the budget store (durably, ``max_epsilon``
checked in the same transaction), then steps; the checkpoint is written atomically, the store
notes it durable, and only then is round t + 1's model published. A refused charge stops the
analyzer before the step, without advancing its input offset, so a restart with a larger budget
analyses that batch. Metrics are updated from the analyzer's counters and its composed statement.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.public import PrivateKey

from panpriv.accounting.ledger import PrivacyReport
from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.shuffle_base import SequentialLearner
from panpriv.protocols.shuffle_gd import ShuffleGD
from panpriv.streamer.esa import checkin_analyzer, gd_analyzer, sum_analyzer
from panpriv.streamer.esa.analyzer import REJECT_REASONS, Analyzer
from panpriv.streamer.esa.budget import AnalyzerBudget, data_key, new_instance, open_store
from panpriv.streamer.esa.checkin_analyzer import CheckinAnalyzer
from panpriv.streamer.esa.gd_analyzer import GDAnalyzer
from panpriv.streamer.esa.gd_budget import GDAnalyzerBudget
from panpriv.streamer.esa.metrics import AnalyzerMetrics
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer

AnyAnalyzer = Analyzer | SumAnalyzer | CheckinAnalyzer

log = logging.getLogger("panpriv.analyze")


@dataclass
class BudgetOptions:
    """Where the analyzer charges: the SQLite store in ``state_dir`` (default: the usual state
    directory) or the store on ``kafka_url``; ``max_epsilon`` as ``panpriv run``'s."""

    messages_topic: str
    state_dir: Path | None = None
    kafka_url: str | None = None
    max_epsilon: float | None = None


@dataclass
class AnalyzeOptions:
    """What ``panpriv analyze`` needs (``learner`` is used only when ``out`` holds no checkpoint)."""

    bootstrap: list[str]
    shuffled_topic: str
    model_topic: str
    keys: list[PrivateKey]
    out: Path
    learner: Any  # Callable[[], ShuffleGaussianSGD | SequentialLearner]
    budget: BudgetOptions
    name: str = "default"
    max_rounds: int | None = None
    metrics: AnalyzerMetrics | None = None


@dataclass
class AnalyzeResult:
    """How the analyzer ended: its state, its statement (composed over every run on the data
    source) and ``stopped`` (why it stopped before a round, or ``None``)."""

    analyzer: AnyAnalyzer
    report: PrivacyReport
    stopped: str | None


def checkpoint_path(out: Path) -> Path:
    return out / "analyzer.json"


def _load(options: AnalyzeOptions) -> AnyAnalyzer:
    from panpriv.streamer.state.atomic_files import write_atomically

    options.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = checkpoint_path(options.out)
    analyzer: AnyAnalyzer
    if path.exists():
        data = json.loads(path.read_bytes())
        if data.get("format") == gd_analyzer.CHECKPOINT_FORMAT:
            analyzer = GDAnalyzer.restore(data, options.keys)
        elif data.get("format") == sum_analyzer.CHECKPOINT_FORMAT:
            analyzer = SumAnalyzer.restore(data, options.keys)
        elif data.get("format") == checkin_analyzer.CHECKPOINT_FORMAT:
            analyzer = CheckinAnalyzer.restore(data, options.keys)
        else:
            analyzer = Analyzer.restore(data, options.keys)
        log.info("analyzer: resumed at round %d, shuffled offset %d", analyzer.round, analyzer.offset)
    else:
        learner = options.learner()
        if isinstance(learner, ShuffleGD):
            analyzer = GDAnalyzer(learner, options.keys, options.name)
        elif isinstance(learner, SequentialLearner):
            analyzer = SumAnalyzer(learner, options.keys, options.name)
        elif isinstance(learner, RandomCheckinSGD):
            analyzer = CheckinAnalyzer(learner, options.keys, options.name)
        else:
            analyzer = Analyzer(learner, options.keys, options.name)
    if isinstance(analyzer, SumAnalyzer):
        log.info("analyzer: secure sum of %d users x %d shares mod 2^%d (tau %.3g); run the shuffler with "
                 "--batch-size %d --params %d --shares %d", analyzer.users, analyzer.shares, analyzer.bits, analyzer.tau,
                 analyzer.users, analyzer.dim, analyzer.shares)
    if analyzer.instance is None:  # a new analyzer, or a checkpoint written before the budget store
        analyzer.instance = new_instance(analyzer.name, analyzer.learner.name)
        write_atomically(path, json.dumps(analyzer.checkpoint()).encode(), "analyzer checkpoint")
    return analyzer


def run(options: AnalyzeOptions) -> AnalyzeResult:
    """Serve until SIGTERM/SIGINT, ``max_rounds`` rounds, or a round the budget refuses."""
    from kafka import TopicPartition

    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.sources.identity import kafka_cluster_identity
    from panpriv.streamer.state.atomic_files import write_atomically

    stopping = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["now"] = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    analyzer = _load(options)
    assert analyzer.instance is not None
    path = checkpoint_path(options.out)
    metrics = options.metrics or AnalyzerMetrics(sum_analyzer.REJECT_REASONS if isinstance(analyzer, SumAnalyzer)
                                                 else checkin_analyzer.REJECT_REASONS
                                                 if isinstance(analyzer, CheckinAnalyzer) else REJECT_REASONS)
    metrics.set_epsilon_budget(options.budget.max_epsilon)
    producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0)
    consumer = kafka_client.consumer(options.bootstrap, group_id=None, enable_auto_commit=False,
                                     max_partition_fetch_bytes=256 * 1024 * 1024, fetch_max_bytes=256 * 1024 * 1024)
    budget: AnalyzerBudget | None = None
    clean = False
    try:
        consumer.partitions_for_topic(options.shuffled_topic)  # metadata: the cluster id
        key = data_key(kafka_cluster_identity(consumer, options.bootstrap), options.budget.messages_topic)
        store = open_store(options.budget.state_dir, options.budget.kafka_url)
        if isinstance(analyzer, GDAnalyzer):  # every user charged per round, one instance per round
            budget = GDAnalyzerBudget(store, key, analyzer.instance, options.out, options.budget.max_epsilon,
                                      analyzer.users, analyzer.round_report)
        else:
            budget = AnalyzerBudget(store, key, analyzer.instance, options.out, options.budget.max_epsilon)
        budget.begin(analyzer.round, analyzer.report(),
                     f"esa messages {options.budget.messages_topic} (deployment {analyzer.name})")
        analyzer.gate = budget.charge
        report = budget.report(analyzer.report())
        metrics.observe_state(analyzer.round, analyzer.rejected)
        metrics.observe_privacy(report, budget.per_source())

        def publish() -> None:
            producer.send(options.model_topic, key=analyzer.name.encode(),
                          value=analyzer.model().to_json()).get(timeout=60)

        tp = TopicPartition(options.shuffled_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, analyzer.offset)
        publish()
        log.info("analyzer: round %d published; data source %s; %s", analyzer.round, key, report.statement())
        def finished() -> bool:
            return analyzer.stopped is not None or (options.max_rounds is not None
                                                    and analyzer.round >= options.max_rounds) \
                or (isinstance(analyzer, GDAnalyzer) and analyzer.finished)  # shuffle-gd: its T rounds are done

        while not stopping["now"] and not finished():
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    if record.offset < analyzer.offset or finished():
                        continue
                    stepped = analyzer.handle(record.value)
                    if analyzer.stopped is not None:
                        log.warning("analyzer: %s", analyzer.stopped)
                        break
                    analyzer.offset = record.offset + 1
                    if stepped:
                        report = budget.report(analyzer.report())
                    write_atomically(path, json.dumps(analyzer.checkpoint(report)).encode(), "analyzer checkpoint")
                    budget.mark_durable(analyzer.round)
                    metrics.observe_checkpoint(time.time())
                    metrics.observe_state(analyzer.round, analyzer.rejected)
                    if stepped:
                        metrics.observe_round(analyzer.last_valid)
                        metrics.observe_privacy(report, budget.per_source())
                        publish()
                        log.info("analyzer: round %d done, model of round %d published", analyzer.round - 1,
                                 analyzer.round)
                    else:
                        log.info("analyzer: record %d not applied; rejected so far %s", record.offset,
                                 dict(analyzer.rejected))
        clean = True
    finally:
        producer.close()
        consumer.close()
        if budget is not None:
            if clean:
                budget.mark_durable(analyzer.round, clean=True)
            report = budget.report(analyzer.report())
            budget.close()
    log.info("analyzer stopped at round %d; rejected %s", analyzer.round, dict(analyzer.rejected) or "none")
    return AnalyzeResult(analyzer, report, analyzer.stopped)
