"""A privacy budget per data source, shared by every run: the pure composition rules.

The service's :class:`~panpriv.accounting.ledger.PrivacyLedger` in a checkpoint knows one run. The same
records can be learned by many runs (another ``--out``, another consumer group, a replay of a
recording of the topic, a run whose checkpoint was deleted or rolled back). A *budget store*
(``panpriv.streamer.budget.store``) keeps, keyed by the data rather than by the run, every *use*: an instance
(one run's learner, one pass of a multi-pass learner, or one lost state, below), its current
:class:`~panpriv.accounting.ledger.PrivacyReport`, and the position ranges of each data source it charged.
This module turns those rows into a ledger and answers the questions the service asks:

- :func:`compose` — the ledger of all uses of some data sources, composed by the ledger's rule
  (outputs by basic composition; one intrusion reads one instance's state and sees every output:
  ``max_j [intrusion(u_j) + Σ_{i≠j} output(u_i)]``; Dwork & Roth 2014, Thm 3.16).
- :func:`exceeds` — whether charging a range to an instance would raise some record's ε above a
  limit, and which instances spent what is there already (for a refusal that names them).
- :func:`report_for` — the composed guarantee of the records that some instances used, over all
  runs (what a snapshot states).
- :func:`lost_state_report` — the use of records held in a state that a crash destroyed.

Crash accounting (why a lost state is an intrusion-only use). A run charges a range *before*
learning it and checkpoints its noisy state afterwards; snapshots are released only after the
checkpoint holding their records is durable. After ``kill -9``, the records charged but not
covered by the run's last durable checkpoint were in the process's state (an intrusion could have
read it) but never reached any output (no release happened from that state). The restarted run
learns them again, with fresh noise, into a state restored from the checkpoint. An intruder who
read the lost state once and later sees every output therefore faces two mechanisms on those
records: the lost state (read once; no output) and the re-learning run (outputs, or its state).
Modelling the lost state as an instance whose output guarantee is (0, 0) and whose intrusion
guarantee is the learner's gives, by the ledger's rule,
``intrusion = max(intr_lost + out_run, intr_run + 0) = intr + out`` and ``output = out_run``:
exactly the composition of both uses for the intrusion guarantee, and no double count for the
outputs, which only the re-learning run produced. (Basic composition is loose; e.g. for
Gaussian noise a tighter figure exists, but the basic one is always valid.)

Unit. The unit is a *data source position*: a Kafka ``(cluster, topic, partition, offset)`` or a
file's ``(SHA-256 of its content, line)``. The store cannot know that two different positions hold
the same person's data (the same people arriving through another pipeline, a re-encoded file);
``max_records_per_user`` then bounds the damage only if it is true, and it is declared, not
enforced.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from panpriv.accounting.errors import AccountingError
from panpriv.accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport

LOST_STATE_ASSUMPTION = (
    "records learned into a state that a crash destroyed before its checkpoint were charged once more, "
    "as an intrusion-only use (the lost state released nothing)"
)


@dataclass(frozen=True)
class Charge:
    """Instance ``instance`` used positions ``[start, stop)`` of data source ``source``."""

    instance: str
    source: str
    start: int
    stop: int


@dataclass(frozen=True)
class Excess:
    """Why a charge would exceed the budget: the worst ε it would reach, where, and which
    instances had already used those records (with their reports)."""

    epsilon: float
    source: str
    start: int
    stop: int
    spent_by: tuple[tuple[str, PrivacyReport], ...]


def lost_state_report(report: PrivacyReport) -> PrivacyReport:
    """The use of records held in a state that was lost in a crash (module docstring): output
    (0, 0), intrusion the learner's intrusion guarantee."""
    return PrivacyReport(
        mechanism=report.mechanism,
        records=0,
        output=Guarantee(0.0, 0.0),
        intrusion=report.intrusion,
        assumptions=(LOST_STATE_ASSUMPTION,),
        references=report.references,
    )


def compose(
    reports: Mapping[str, PrivacyReport],
    charges: Iterable[Charge],
    max_records_per_user: int | None = None,
) -> PrivacyLedger:
    """The ledger holding every charge (a position charged twice by one instance has two uses).

    Raises :class:`AccountingError` if a charge names an instance without a report.
    """
    ledger = PrivacyLedger(max_records_per_user=max_records_per_user)
    for instance, report in reports.items():
        ledger.register(instance, report)
    for charge in charges:
        if charge.instance not in reports:
            raise AccountingError(f"budget charge to {charge.instance!r}, which has no registered report")
        ledger.charge(charge.instance, charge.source, charge.start, charge.stop)
    return ledger


def _largest_finite_epsilon(ledger: PrivacyLedger, uses: tuple[str, ...]) -> float:
    """The largest finite ε of a record's output and intrusion guarantees. An intrusion guarantee
    that is already 'none' (seeded test mode) is not a budget: it cannot be spent further."""
    worst = 0.0
    for guarantee in ledger.record_guarantee(uses):
        if math.isfinite(guarantee.epsilon):
            worst = max(worst, guarantee.epsilon)
    return worst


def exceeds(
    ledger: PrivacyLedger,
    instance: str,
    ranges: Mapping[str, tuple[int, int]],
    limit: float,
) -> Excess | None:
    """What charging ``ranges`` (source → ``[start, stop)``) to ``instance`` would do, if it would
    raise some record's ε above ``limit``; ``None`` if it stays within.

    ``instance`` must be registered in ``ledger``. Records of the ranges that nobody used yet get
    the single use ``(instance,)``.
    """
    if instance not in ledger.instances:
        raise AccountingError(f"budget check for unregistered instance {instance!r}")
    reports = ledger.instances
    worst: Excess | None = None
    for source, (start, stop) in ranges.items():
        if start >= stop:
            continue
        cursor = start
        pieces: list[tuple[int, int, tuple[str, ...]]] = []
        for segment in ledger.coverage(source):
            if segment.stop <= start or segment.start >= stop:
                continue
            if segment.start > cursor:
                pieces.append((cursor, segment.start, ()))
            pieces.append((max(segment.start, start), min(segment.stop, stop), segment.uses))
            cursor = min(segment.stop, stop)
        if cursor < stop:
            pieces.append((cursor, stop, ()))
        for a, b, uses in pieces:
            epsilon = _largest_finite_epsilon(ledger, tuple(sorted(uses + (instance,))))
            if epsilon > limit * (1 + 1e-12) and (worst is None or epsilon > worst.epsilon):
                spent = tuple((u, reports[u]) for u in dict.fromkeys(uses))
                worst = Excess(epsilon, source, a, b, spent)
    return worst


def report_for(ledger: PrivacyLedger, instances: Iterable[str], records: int) -> PrivacyReport:
    """The composed guarantee, over every use in ``ledger``, of the records that any of
    ``instances`` used (componentwise worst case over those records); ``records`` is the count
    stated. Other instances that used the same records are named in the assumptions."""
    mine = set(instances)
    worst_output = Guarantee(0.0, 0.0)
    worst_intrusion = Guarantee(0.0, 0.0)
    others: set[str] = set()
    max_uses = 0
    reports = ledger.instances
    for source in ledger.sources:
        for segment in ledger.coverage(source):
            if mine.isdisjoint(segment.uses):
                continue
            output, intrusion = ledger.record_guarantee(segment.uses)
            worst_output = Guarantee(max(worst_output.epsilon, output.epsilon), max(worst_output.delta, output.delta))
            worst_intrusion = Guarantee(
                max(worst_intrusion.epsilon, intrusion.epsilon), max(worst_intrusion.delta, intrusion.delta)
            )
            others.update(u for u in segment.uses if u not in mine)
            max_uses = max(max_uses, len(segment.uses))
    assumptions: list[str] = []
    references: list[str] = []
    involved = [reports[i] for i in sorted(mine | others) if i in reports]
    for report in involved:
        assumptions.extend(a for a in report.assumptions if a not in assumptions)
        references.extend(r for r in report.references if r not in references)
    if others:
        assumptions.append(
            "the same records were also used by " + ", ".join(sorted(others))
            + " (other runs, lost states or passes, from the budget store); all uses are combined by basic composition"
        )
    elif max_uses > 1:
        assumptions.append(f"some records were used {max_uses} times; their uses are combined by basic composition")
    mechanisms = sorted({reports[i].mechanism for i in mine if i in reports})
    return PrivacyReport(
        mechanism=mechanisms[0] if len(mechanisms) == 1 else "+".join(mechanisms) or "none",
        records=records,
        output=worst_output,
        intrusion=worst_intrusion,
        assumptions=tuple(assumptions),
        references=tuple(references),
        max_records_per_user=ledger.max_records_per_user,
    )


def per_source(ledger: PrivacyLedger) -> dict[str, tuple[Guarantee, Guarantee]]:
    """Per data source of ``ledger``, the (output, intrusion) guarantee composed over every use,
    worst case over its records (what ``panpriv budget`` and the metrics show)."""
    result: dict[str, tuple[Guarantee, Guarantee]] = {}
    for source in ledger.sources:
        output, intrusion = Guarantee(0.0, 0.0), Guarantee(0.0, 0.0)
        for segment in ledger.coverage(source):
            o, i = ledger.record_guarantee(segment.uses)
            output = Guarantee(max(output.epsilon, o.epsilon), max(output.delta, o.delta))
            intrusion = Guarantee(max(intrusion.epsilon, i.epsilon), max(intrusion.delta, i.delta))
        result[source] = (output, intrusion)
    return result
