"""``panpriv analyze`` as a service: an analyzer of :mod:`panpriv.streamer.esa.families` between Kafka,
its sealed and locked state (``analyzer.json``, :mod:`panpriv.streamer.state.role_state`), the
budget store shared by every run (one :class:`panpriv.streamer.budget.session.BudgetSession`) and
its metrics (:mod:`panpriv.streamer.esa.metrics`), in the role loop
(:mod:`panpriv.streamer.runtime.role_loop`).

Per record of the shuffled topic, in order: the analyzer checks the batch's signature, deployment
and round (:mod:`panpriv.streamer.esa.batches`: the shuffler's verify keys and the deployment id —
the data key — are bound before the first record) and opens it; for the current round it
registers the statement and charges the round in the budget store (durably, ``max_epsilon``
checked in the same transaction), then steps; the state is written atomically, the store notes it
durable, and only then is round t + 1's model published. A refused charge stops the analyzer
before the step, without advancing its input offset, so a restart with a larger budget analyses
that batch. Metrics are updated from the analyzer's counters and its composed statement.

The budget (:mod:`panpriv.streamer.budget.store`; the charge units of :mod:`panpriv.streamer.budget.units`).

**Data source.** The users' records enter an ESA deployment as messages on the *messages* topic;
the analyzer reads them, shuffled, from another topic. The data key is the messages topic:
``esa:<cluster>/<messages topic>`` (:func:`panpriv.streamer.esa.deployment.data_key`, also the
deployment id every batch is signed for: :mod:`panpriv.streamer.esa.batches`), where ``<cluster>`` is the broker's cluster id
(:func:`panpriv.streamer.sources.identity.kafka_cluster_identity`, the bootstrap servers when the broker reports
none). Not the shuffled topic: two shufflers over one messages topic release the same messages
(the first b of each round). Not the deployment name either: a second analyzer under another
``--name`` that reads the same batches learns from the same users and must compose with the
first; keying by name would let it claim a fresh ε. (The converse — a messages topic reused for a
new deployment whose rounds restart at 0 — is charged as a second use of the same positions:
conservative.) The prefix ``esa:`` keeps these positions apart from a ``panpriv run`` over a topic,
whose positions are offsets.

**Position.** A position is one round ``t``: the b messages of round t, one per user
(``participation = "all"``: each user answers one round; for ``shuffle-sgd``/``shuffle-acsa`` the b users whose
shares make round t's batch, each in one round: Cheu et al. 2022, Def. 2.7). A round the secure-sum
analyzer skips (:mod:`panpriv.streamer.esa.sum_analyzer`) is not learned; it is charged when it is skipped
for a total out of range (an output of the honest users' data), not when a unit failed to open. A
round charged is the range
``[t, t + 1)``; every message in it has the instance's guarantee, so composing per round is
composing per record.

**Order.** The analyzer registers the deployment's report for the round it is about to learn
(:func:`panpriv.streamer.esa.deployment.esa_report` with the round's valid count, which may lower the
output guarantee) and charges ``[t, t + 1)`` — durably, with ``max_epsilon`` checked in the same
transaction — *before* the step; a refused charge stops the analyzer before the step (and before
it publishes anything); a refusal before it learned anything, because other runs spent the
budget, is exit code 3, like ``panpriv run``. Before it publishes round t's model at start-up it
checks round t the same way, so a deployment over a spent source never asks clients for messages.

**Crash.** The analyzer adds no noise: a round re-analysed after a crash gives bit for bit the
model the dead process computed (tested with SIGKILL), so the dead process's state held nothing the
resumed run does not recompute and publish — no lost-state instance is needed. A round the dead
process charged but did not checkpoint is found in the store at restart and not charged again
(a second charge by one instance would count as a second use).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.public import PrivateKey
from nacl.signing import VerifyKey

from panpriv.accounting.ledger import PrivacyReport
from panpriv.streamer.budget.open import BudgetSettings
from panpriv.streamer.errors import CheckpointError, ConfigError
from panpriv.streamer.esa.analyzer import AnalyzerCore, refuse_old_format
from panpriv.streamer.esa.families import UnknownFamilyError, analyzer_for_format, family
from panpriv.streamer.esa.metrics import AnalyzerMetrics
from panpriv.streamer.state.role_state import RoleState

log = logging.getLogger("panpriv.analyze")

STATE_FILE = "analyzer.json"


def new_instance(name: str, learner: str) -> str:
    """A fresh instance id for an analyzer of ``learner`` in deployment ``name``."""
    return f"{learner}-esa-{name}-{uuid.uuid4().hex[:12]}"


@dataclass
class AnalyzeOptions:
    """What ``panpriv analyze`` needs (``learner`` is called only when ``out`` holds no state)."""

    bootstrap: list[str]
    shuffled_topic: str
    model_topic: str
    messages_topic: str
    """The clients' messages topic: it names the data source in the budget store (not read)."""
    keys: list[PrivateKey]
    shuffler_keys: list[VerifyKey]
    """The shuffler's verify keys: batches signed by another key are refused."""
    out: Path
    learner: Callable[[], Any]
    budget: BudgetSettings
    name: str = "default"
    max_rounds: int | None = None
    metrics: AnalyzerMetrics | None = None


@dataclass
class AnalyzeResult:
    """How the analyzer ended: its state, its statement (composed over every run on the data
    source) and ``stopped`` (why it stopped before a round, or ``None``)."""

    analyzer: AnalyzerCore
    report: PrivacyReport
    stopped: str | None


def state_file(out: Path) -> RoleState:
    """The analyzer's sealed state in ``out``. No unsealed state is migrated: every state written
    before sealing (panpriv 0.1) is of a format before onion sealing and signed batches, refused
    with one line naming the migration (:func:`panpriv.streamer.esa.analyzer.refuse_old_format`);
    anything else unsealed is not an analyzer state."""
    path = Path(out) / STATE_FILE

    def refuse_unsealed(body: Mapping[str, Any]) -> bool:
        refuse_old_format(body, str(path))
        return False

    return RoleState(out, STATE_FILE, "esa-analyzer", legacy=refuse_unsealed,
                     fix="restore it from a backup, or start a new deployment with another --out and --name")


def load_analyzer(state: RoleState, options: AnalyzeOptions) -> AnalyzerCore:
    """The analyzer restored from ``state``, or a new one of the learner's family (its instance
    saved at once)."""
    data = state.load()
    analyzer: AnalyzerCore
    if data is not None:
        refuse_old_format(data, str(state.path))
        try:
            analyzer = analyzer_for_format(data.get("format")).restore(data, options.keys)
        except (UnknownFamilyError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{state.path}: cannot restore the analyzer ({type(exc).__name__}: {exc}); restore it "
                                  "from a backup, or start a new deployment with another --out and --name") from None
        log.info("analyzer: resumed at round %d, shuffled offset %d", analyzer.round, analyzer.offset)
    else:
        learner = options.learner()
        try:
            analyzer = family(learner.name).analyzer_class()(learner, options.keys, options.name)
        except ValueError as exc:  # a plan the three roles cannot run (rounds of several sizes, timestamp slots)
            raise ConfigError(f"learner {learner.name!r} in three roles: {exc}") from None
    log.info("analyzer: %s, deployment %s; run the shuffler with %s", analyzer.learner.name, analyzer.name,
             analyzer.shuffler_arguments())
    if analyzer.instance is None:  # new
        analyzer.instance = new_instance(analyzer.name, analyzer.learner.name)
        state.save(analyzer.checkpoint())
    return analyzer


def run(options: AnalyzeOptions, stop: threading.Event | None = None) -> AnalyzeResult:
    """Serve until SIGTERM/SIGINT (or ``stop``), ``max_rounds`` rounds, the last round, or a round
    the budget refuses, in the role loop (:mod:`panpriv.streamer.runtime.role_loop`)."""
    from kafka import TopicPartition

    from panpriv.streamer.budget.session import BudgetSession
    from panpriv.streamer.esa.batches import BatchVerifier
    from panpriv.streamer.esa.deployment import data_key
    from panpriv.streamer.esa.shuffler import deployment_topics
    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.kafka.topics import ensure_topics
    from panpriv.streamer.runtime.role_loop import RoleLoop
    from panpriv.streamer.sources.identity import kafka_cluster_identity

    holder: list[AnalyzerCore] = []

    def status() -> str:
        if not holder:
            return "setting up"
        analyzer = holder[0]
        return f"round {analyzer.round}, shuffled offset {analyzer.offset}, rejected {dict(analyzer.rejected) or 'none'}"

    with RoleLoop("analyzer", stop=stop, status=status) as loop:
        state = state_file(options.out)
        loop.close_on_exit(state.lock().release, "state directory lock")
        analyzer = load_analyzer(state, options)
        holder.append(analyzer)
        assert analyzer.instance is not None
        # Only the topics it reads and writes (deployment.topic_access): the messages topic is not the
        # analyzer's, and the deploy/ ACLs do not let it describe that topic.
        ensure_topics(options.bootstrap, deployment_topics(shuffled=options.shuffled_topic, model=options.model_topic,
                                                           release_bytes=analyzer.release_bytes()))
        metrics = options.metrics or AnalyzerMetrics(analyzer.REJECT_REASONS)
        metrics.set_epsilon_budget(options.budget.max_epsilon)
        producer = kafka_client.producer(options.bootstrap, acks="all", linger_ms=0)
        loop.close_on_exit(producer.close, "model producer")
        consumer = kafka_client.consumer(options.bootstrap, group_id=None, enable_auto_commit=False,
                                         max_partition_fetch_bytes=256 * 1024 * 1024, fetch_max_bytes=256 * 1024 * 1024)
        loop.close_on_exit(consumer.close, "shuffled consumer")
        consumer.partitions_for_topic(options.shuffled_topic)  # metadata: the cluster id
        key = data_key(kafka_cluster_identity(consumer, options.bootstrap), options.messages_topic)
        verifier = BatchVerifier(options.shuffler_keys, key)
        analyzer.bind(verifier)
        log.info("analyzer: deployment %s, batches signed by %s", key, ", ".join(verifier.signer_ids))
        budget = BudgetSession.for_role(options.budget, options.out, analyzer.instance, analyzer.charge_unit(key))
        clean = False
        try:
            budget.begin_role(f"esa messages {options.messages_topic} (deployment {analyzer.name})", analyzer.report(),
                              step=analyzer.round)
            analyzer.gate = budget.charge_step
            report = budget.composed(analyzer.report(), [key])
            metrics.observe_state(analyzer.round, analyzer.rejected)
            metrics.observe_privacy(report, budget.per_source([key]))

            def publish() -> None:
                producer.send(options.model_topic, key=analyzer.name.encode(),
                              value=analyzer.model().to_json()).get(timeout=60)

            tp = TopicPartition(options.shuffled_topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, analyzer.offset)
            publish()
            log.info("analyzer: round %d published; data source %s; %s", analyzer.round, key, report.statement())

            def finished() -> bool:
                return analyzer.stopped is not None or analyzer.done or (
                    options.max_rounds is not None and analyzer.round >= options.max_rounds)

            def step() -> None:
                nonlocal report
                for records in consumer.poll(timeout_ms=200).values():
                    for record in records:
                        if record.offset < analyzer.offset or finished():
                            continue
                        stepped = analyzer.handle(record.value)
                        if analyzer.stopped is not None:
                            log.warning("analyzer: %s", analyzer.stopped)
                            return
                        analyzer.offset = record.offset + 1
                        if stepped:
                            report = budget.composed(analyzer.report(), [key])
                        state.save(analyzer.checkpoint(report))
                        budget.mark_step_durable(analyzer.round)
                        metrics.observe_checkpoint(time.time())
                        metrics.observe_state(analyzer.round, analyzer.rejected)
                        if stepped:
                            metrics.observe_round(analyzer.last_valid)
                            metrics.observe_privacy(report, budget.per_source([key]))
                            publish()
                            log.info("analyzer: round %d done, model of round %d published", analyzer.round - 1,
                                     analyzer.round)
                        else:
                            log.info("analyzer: record %d not applied; rejected so far %s", record.offset,
                                     dict(analyzer.rejected))

            loop.run(step, done=finished)
            clean = True
        finally:
            if clean:
                budget.mark_step_durable(analyzer.round, clean=True)
            report = budget.composed(analyzer.report(), [key])
            budget.close()
    log.info("analyzer stopped at round %d; rejected %s", analyzer.round, dict(analyzer.rejected) or "none")
    return AnalyzeResult(analyzer, report, analyzer.stopped)
