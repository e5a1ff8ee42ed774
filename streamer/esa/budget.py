"""The ESA analyzer's dealings with the budget store shared by every run (:mod:`panpriv.streamer.budget.store`).

``panpriv run`` charges the store through :class:`panpriv.streamer.budget.session.BudgetSession`; the
analyzer of an Encode–Shuffle–Analyze deployment (:mod:`panpriv.streamer.esa.analyzer`) charges the same
store, with the same rules, through :class:`AnalyzerBudget`.

**Data source.** The users' records enter an ESA deployment as messages on the *messages* topic;
the analyzer reads them, shuffled, from another topic. The data key is the messages topic:
``esa:<cluster>/<messages topic>``, where ``<cluster>`` is the broker's cluster id
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

import dataclasses
import uuid
from pathlib import Path
from typing import Any

from panpriv.accounting.budget import exceeds, report_for
from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.budget.session import with_public_assumptions
from panpriv.streamer.budget.store import BudgetExceededError, BudgetStore, default_state_dir, describe_excess

KEY_PREFIX = "esa:"


def data_key(cluster: str, messages_topic: str) -> str:
    """The data key of an ESA deployment's records (module docstring)."""
    return f"{KEY_PREFIX}{cluster}/{messages_topic}"


def new_instance(name: str, learner: str = "shuffle-gaussian") -> str:
    """A fresh instance id for an analyzer of ``learner`` in deployment ``name``."""
    return f"{learner}-esa-{name}-{uuid.uuid4().hex[:12]}"


def open_store(state_dir: Path | None, kafka_url: str | None) -> Any:
    """The SQLite store in ``state_dir`` (default :func:`panpriv.streamer.budget.store.default_state_dir`), or
    the store on the Kafka topic ``kafka_url`` (``kafka://host:port/topic``)."""
    if kafka_url:
        from panpriv.streamer.budget.kafka_store import KafkaBudgetStore
        from panpriv.streamer.io.source_url import parse_kafka_url

        spec = parse_kafka_url(kafka_url)
        return KafkaBudgetStore(spec.bootstrap, spec.topics[0])
    return BudgetStore(state_dir or default_state_dir())


class AnalyzerBudget:
    """One analyzer's view of the budget store (module docstring).

    Parameters
    ----------
    store
        A :class:`panpriv.streamer.budget.store.BudgetStore` or :class:`panpriv.streamer.budget.kafka_store.KafkaBudgetStore`.
    key
        The deployment's data key (:func:`data_key`).
    instance
        The analyzer's instance id (kept in its checkpoint across restarts).
    out
        The analyzer's ``--out`` (named in ``panpriv budget``).
    limit
        ``max_epsilon``: no round is learned that would raise a record's ε above it (``None``: no limit).
    """

    def __init__(self, store: Any, key: str, instance: str, out: Path, limit: float | None = None) -> None:
        self.store = store
        self.key = key
        self.instance = instance
        self.out = Path(out)
        self.limit = limit
        self.learned_here = 0  # rounds learned by this process (0: a refusal is a refusal to start)
        self._stored: tuple[Guarantee, Guarantee] | None = None
        self._precharged: int | None = None

    def begin(self, round_: int, report: PrivacyReport, source: str) -> None:
        """Register the run and its report; refuse (:class:`BudgetExceededError`) when round
        ``round_``, the next one it would learn, is spent by other runs beyond the limit."""
        ranges = {self.key: (round_, round_ + 1)}
        ledger = self.store.ledger([self.key])
        if self.instance in ledger.instances and any(
            self.instance in segment.uses for segment in ledger.coverage(self.key)
            if segment.start <= round_ < segment.stop
        ):
            self._precharged = round_  # charged by a process that died before its checkpoint
        if self.limit is not None:
            if self.instance not in ledger.instances:
                ledger.register(self.instance, report)
            excess = exceeds(ledger, self.instance, ranges, self.limit)
            if excess is not None and any(use != self.instance for use, _ in excess.spent_by):
                raise BudgetExceededError(
                    "refusing to start: " + describe_excess(excess, self.limit, self.store.instances())
                    + "; nothing was learned and no model was published. See `panpriv budget`."
                )
        self.store.begin_run(self.instance, self.out, source)
        self.register(report)

    def register(self, report: PrivacyReport) -> None:
        """Store the instance's report when its guarantees changed (a write per change)."""
        if self._stored != (report.output, report.intrusion):
            self.store.register(self.instance, self.instance, report, self.out)
            self._stored = (report.output, report.intrusion)

    def charge(self, round_: int, report: PrivacyReport) -> str | None:
        """Register ``report`` (the guarantee once round ``round_`` is learned) and charge the round,
        durably, before it is learned. Returns why not (the analyzer then stops) if a record's ε
        would exceed the limit; raises :class:`BudgetExceededError` if this process learned nothing
        yet and other runs spent the budget."""
        self.register(report)
        if round_ == self._precharged:
            self._precharged = None
            return None
        excess = self.store.charge(self.instance, {self.key: (round_, round_ + 1)}, self.limit)
        if excess is None:
            self.learned_here += 1
            return None
        assert self.limit is not None
        text = describe_excess(excess, self.limit, self.store.instances())
        if self.learned_here == 0 and any(use != self.instance for use, _ in excess.spent_by):
            raise BudgetExceededError(f"refusing to start: {text}; nothing was learned")
        return f"stopped before learning a round that would exceed the budget over all runs: {text}"

    def mark_durable(self, round_: int, clean: bool = False) -> None:
        """The analyzer's checkpoint at round ``round_`` (the next round to learn) is durable."""
        self.store.mark_durable(self.instance, round_, {self.key: round_}, clean=clean)

    def report(self, own: PrivacyReport) -> PrivacyReport:
        """The guarantee of the rounds this analyzer learned, composed over every run that used
        them; componentwise the worse of that and ``own`` (the deployment's statement), as
        :meth:`panpriv.streamer.budget.session.BudgetSession.report` does."""
        ledger = self.store.ledger([self.key])
        composed = report_for(ledger, self.instances(ledger), own.records)
        composed = dataclasses.replace(
            composed,
            mechanism=own.mechanism,
            output=_worse(composed.output, own.output),
            intrusion=_worse(composed.intrusion, own.intrusion),
            assumptions=tuple(dict.fromkeys([*own.assumptions, *composed.assumptions])),
            references=tuple(dict.fromkeys([*own.references, *composed.references])),
        )
        return with_public_assumptions(composed, seeded=False)

    def instances(self, ledger: Any) -> list[str]:
        """The store instances whose charges are this analyzer's (``shuffle-gd``: one per round,
        :class:`panpriv.streamer.esa.gd_budget.GDAnalyzerBudget`)."""
        return [self.instance]

    def per_source(self) -> dict[str, tuple[Guarantee, Guarantee]]:
        """The (output, intrusion) guarantee of the deployment's data key, over every run."""
        from panpriv.accounting.budget import per_source

        return {k: v for k, v in per_source(self.store.ledger([self.key])).items() if k == self.key}

    def close(self) -> None:
        self.store.close()


def _worse(a: Guarantee, b: Guarantee) -> Guarantee:
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))
