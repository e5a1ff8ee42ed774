"""What each mechanism spent on which records, and the guarantee that follows.

Two types:

- :class:`PrivacyReport` (frozen): the guarantee of one learner, or of the whole service, for
  released outputs and, separately, the pan-private guarantee (one intrusion into the internal
  state at any single time, plus all outputs; Cheu et al. 2022, Def. C.2), with its unit, the number of records,
  and the assumptions behind the numbers.
- :class:`PrivacyLedger`: which mechanism *instance* (one learner object, identified by a string)
  touched which records, where a record is identified by a source key and an integer position
  (a Kafka ``topic/partition`` and an offset, or a replay file and a record index). A position that
  is charged again (a replay of the same range, a second epoch, a redelivery that slipped through)
  gains a second *use*, and its guarantee composes instead of being silently counted once.

Accounting rule (what the ledger proves). A record ``r`` with uses ``u_1 … u_k`` (instances, with
multiplicity) is protected, for the outputs, by the basic composition of the instances' output
guarantees: ``(Σ ε_out(u_j), Σ δ_out(u_j))`` (Dwork & Roth 2014, Thm 3.16; valid for adaptive
composition of any (ε, δ)-DP mechanisms). For one intrusion, the intruder reads the state of one
instance at one time, and sees the outputs of all: ``max_j [intrusion(u_j) + Σ_{i≠j} output(u_i)]``.
The service-level guarantee is the componentwise maximum over records — each record individually
satisfies its own (ε_r, δ_r) ≤ (max ε, max δ), and (ε, δ)-DP is monotone in both.

Unit. One record is one user unless ``max_records_per_user = k`` is declared (declared, not
enforced: nothing checks that a user has at most k records); then the user-level
guarantee follows from group privacy: (ε, δ)-DP for one record implies
(k ε, k e^{(k−1) ε} δ)-DP for k records (Dwork & Roth 2014, Thm 2.2 and its (ε, δ) extension,
Vadhan 2017, Lemma 2.2). The bound is loose but always valid.

Compactness: consecutive positions with the same uses are one segment, so a stream consumed once
in order costs one segment per source however long it runs.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from panpriv.accounting.errors import AccountingError, InvalidParameterError

SCHEMA_VERSION = 1


def _check_epsilon(owner: str, value: float) -> float:
    value = float(value)
    if not value >= 0.0:  # also rejects NaN
        raise InvalidParameterError(owner, "epsilon", "a float in [0, inf]", value)
    return value


def _check_delta(owner: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise InvalidParameterError(owner, "delta", "a float in [0, 1]", value)
    return value


def _float_to_json(value: float) -> float | str:
    """JSON has no infinity: encode it as the string "inf"."""
    return "inf" if math.isinf(value) else value


def _float_from_json(value: float | str) -> float:
    return math.inf if value == "inf" else float(value)


@dataclass(frozen=True)
class Guarantee:
    """An (ε, δ)-differential-privacy guarantee.

    ``epsilon = inf`` means no guarantee (e.g. an intruder who can read raw records).
    """

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon("Guarantee", self.epsilon))
        object.__setattr__(self, "delta", _check_delta("Guarantee", self.delta))

    @classmethod
    def none(cls) -> Guarantee:
        """No guarantee at all."""
        return cls(math.inf, 1.0)

    @property
    def is_meaningful(self) -> bool:
        return math.isfinite(self.epsilon) and self.delta < 1.0

    def compose(self, other: Guarantee) -> Guarantee:
        """Basic composition (Dwork & Roth 2014, Thm 3.16): ε and δ add, δ capped at 1."""
        return Guarantee(self.epsilon + other.epsilon, min(1.0, self.delta + other.delta))

    def dominates(self, other: Guarantee) -> bool:
        """True if this guarantee is at least as weak as ``other`` in both parameters."""
        return self.epsilon >= other.epsilon and self.delta >= other.delta

    def group(self, k: int) -> Guarantee:
        """Group privacy for ``k`` records: (k ε, k e^{(k−1) ε} δ) (Vadhan 2017, Lemma 2.2)."""
        if not (isinstance(k, int) and k >= 1):
            raise InvalidParameterError("Guarantee.group", "k", "an int >= 1", k)
        if k == 1:
            return self
        epsilon = k * self.epsilon
        try:
            delta = min(1.0, k * math.exp((k - 1) * self.epsilon) * self.delta)
        except OverflowError:
            delta = 1.0
        if self.delta == 0.0:
            delta = 0.0
        return Guarantee(epsilon, delta)

    def to_dict(self) -> dict[str, Any]:
        return {"epsilon": _float_to_json(self.epsilon), "delta": self.delta}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Guarantee:
        return cls(_float_from_json(data["epsilon"]), float(data["delta"]))

    def __str__(self) -> str:
        if not math.isfinite(self.epsilon):
            return "no guarantee"
        return f"(ε = {self.epsilon:.4g}, δ = {self.delta:.3g})"


@dataclass(frozen=True)
class PrivacyReport:
    """The privacy guarantee of a learner or of the whole service, as released.

    Parameters
    ----------
    mechanism
        Name of the mechanism (learner) or ``"composed"`` for a ledger-wide report.
    records
        Number of records that have contributed to the state so far.
    output
        Guarantee, per record, for everything released (snapshots, metrics computed from noisy
        state), against an analyzer that sees all outputs.
    intrusion
        Pan-private guarantee, per record: one intrusion that reads the whole internal state once,
        at any time, plus all outputs (Cheu et al. 2022, Def. C.2). ``Guarantee.none()`` where the process holds
        state that an intruder could read records from.
    unit
        ``"record"``; the user-level guarantees below apply when ``max_records_per_user`` is set.
    max_records_per_user
        ``k`` when declared: then ``user_output``/``user_intrusion`` hold the group-privacy bound.
    assumptions
        Everything the numbers rest on (neighbouring relation, public quantities, unproven
        assumptions of a cited theorem, trusted components).
    references
        Seed theorems the numbers come from, e.g. ``"Cheu et al. 2022, Thm C.3"``.
    """

    mechanism: str
    records: int
    output: Guarantee
    intrusion: Guarantee
    assumptions: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    unit: str = "record"
    max_records_per_user: int | None = None
    user_output: Guarantee | None = field(default=None)
    user_intrusion: Guarantee | None = field(default=None)

    def __post_init__(self) -> None:
        if not (isinstance(self.records, int) and self.records >= 0):
            raise InvalidParameterError("PrivacyReport", "records", "an int >= 0", self.records)
        k = self.max_records_per_user
        if k is not None:
            if not (isinstance(k, int) and k >= 1):
                raise InvalidParameterError("PrivacyReport", "max_records_per_user", "an int >= 1", k)
            object.__setattr__(self, "user_output", self.output.group(k))
            object.__setattr__(self, "user_intrusion", self.intrusion.group(k))
        object.__setattr__(self, "assumptions", tuple(self.assumptions))
        object.__setattr__(self, "references", tuple(self.references))

    def for_users(self, k: int | None) -> PrivacyReport:
        """The same report with the user-level (group privacy) guarantees for ``k`` records/user."""
        return PrivacyReport(
            mechanism=self.mechanism,
            records=self.records,
            output=self.output,
            intrusion=self.intrusion,
            assumptions=self.assumptions,
            references=self.references,
            unit=self.unit,
            max_records_per_user=k,
        )

    def statement(self) -> str:
        """One paragraph, for people, stating the guarantee, its unit and its assumptions."""
        parts = [
            f"{self.mechanism}: after {self.records} records, everything released is "
            f"{self.output}-differentially private per {self.unit}",
        ]
        if self.intrusion.is_meaningful:
            parts.append(
                f"; an intruder who reads the process's internal state once, at any time, and sees "
                f"all outputs learns no more than {self.intrusion}-DP allows (pan-privacy)"
            )
        else:
            parts.append("; there is no pan-private guarantee against an intruder reading the state")
        if self.max_records_per_user is not None:
            parts.append(
                f". Per user with at most {self.max_records_per_user} records (a declared bound, not enforced; "
                "group privacy): "
                f"outputs {self.user_output}, intrusion {self.user_intrusion}"
            )
        text = "".join(parts) + "."
        if self.assumptions:
            text += " Assumptions: " + "; ".join(self.assumptions) + "."
        if self.references:
            text += " Source: " + ", ".join(self.references) + "."
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "mechanism": self.mechanism,
            "records": self.records,
            "unit": self.unit,
            "output": self.output.to_dict(),
            "intrusion": self.intrusion.to_dict(),
            "max_records_per_user": self.max_records_per_user,
            "user_output": None if self.user_output is None else self.user_output.to_dict(),
            "user_intrusion": None if self.user_intrusion is None else self.user_intrusion.to_dict(),
            "assumptions": list(self.assumptions),
            "references": list(self.references),
            "statement": self.statement(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyReport:
        _check_schema(data)
        return cls(
            mechanism=str(data["mechanism"]),
            records=int(data["records"]),
            output=Guarantee.from_dict(data["output"]),
            intrusion=Guarantee.from_dict(data["intrusion"]),
            assumptions=tuple(data.get("assumptions", ())),
            references=tuple(data.get("references", ())),
            unit=str(data.get("unit", "record")),
            max_records_per_user=data.get("max_records_per_user"),
        )


def _check_schema(data: Mapping[str, Any]) -> None:
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise AccountingError(
            f"unsupported privacy schema_version {version!r}; this version reads {SCHEMA_VERSION}"
        )


@dataclass(frozen=True)
class Segment:
    """Positions ``[start, stop)`` of one source, each used by ``uses`` (instance ids, sorted)."""

    start: int
    stop: int
    uses: tuple[str, ...]

    @property
    def length(self) -> int:
        return self.stop - self.start


class PrivacyLedger:
    """Records which mechanism instance touched which records, and composes re-use.

    Typical use by the service: ``register(instance, learner.privacy())`` whenever the learner's
    guarantee may have changed, ``charge(instance, source, start, stop)`` for every consumed range,
    and ``report()`` for the composed guarantee. State round-trips through :meth:`to_dict`.

    Parameters
    ----------
    max_records_per_user
        Declared bound ``k`` on records per user; enables the user-level guarantee.
    """

    def __init__(self, max_records_per_user: int | None = None) -> None:
        if max_records_per_user is not None and not (
            isinstance(max_records_per_user, int) and max_records_per_user >= 1
        ):
            raise InvalidParameterError(
                "PrivacyLedger", "max_records_per_user", "an int >= 1 or None", max_records_per_user
            )
        self.max_records_per_user = max_records_per_user
        self._reports: dict[str, PrivacyReport] = {}
        # Per source: disjoint segments sorted by start.
        self._segments: dict[str, list[Segment]] = {}

    # -- recording ---------------------------------------------------------------------------

    def register(self, instance: str, report: PrivacyReport) -> None:
        """Add instance ``instance`` or update its current guarantee.

        A learner's guarantee can only weaken as it runs (more releases, more records), so an
        update that would *strengthen* an existing instance's output or intrusion guarantee is
        refused: it would rewrite what earlier outputs were promised.
        """
        previous = self._reports.get(instance)
        if previous is not None and not (
            report.output.dominates(previous.output) and report.intrusion.dominates(previous.intrusion)
        ):
            raise AccountingError(
                f"instance {instance!r}: guarantee cannot become stronger once spent "
                f"(output {previous.output} -> {report.output}, "
                f"intrusion {previous.intrusion} -> {report.intrusion})"
            )
        self._reports[instance] = report

    def charge(self, instance: str, source: str, start: int, stop: int) -> None:
        """Record that ``instance`` used positions ``[start, stop)`` of ``source``."""
        if instance not in self._reports:
            raise AccountingError(f"charge to unregistered instance {instance!r}; register it first")
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop):
            raise InvalidParameterError(
                "PrivacyLedger.charge", "start/stop", "ints with 0 <= start <= stop", (start, stop)
            )
        if start == stop:
            return
        segments = self._segments.setdefault(source, [])
        starts = [s.start for s in segments]
        # Segments that may overlap [start, stop): from the one containing ``start`` onwards.
        first = max(0, bisect.bisect_right(starts, start) - 1)
        before = segments[:first]
        after_index = bisect.bisect_left(starts, stop)
        touched = segments[first:after_index]
        after = segments[after_index:]

        rebuilt: list[Segment] = []
        cursor = start
        for seg in touched:
            if seg.stop <= start:  # entirely before the charged range
                rebuilt.append(seg)
                continue
            if seg.start < start:
                rebuilt.append(Segment(seg.start, start, seg.uses))
            if cursor < max(seg.start, start):  # a gap before this segment: fresh use
                rebuilt.append(Segment(cursor, max(seg.start, start), (instance,)))
            overlap_start, overlap_stop = max(seg.start, start), min(seg.stop, stop)
            rebuilt.append(Segment(overlap_start, overlap_stop, tuple(sorted(seg.uses + (instance,)))))
            if seg.stop > stop:
                rebuilt.append(Segment(stop, seg.stop, seg.uses))
            cursor = max(cursor, overlap_stop)
        if cursor < stop:
            rebuilt.append(Segment(cursor, stop, (instance,)))
        self._segments[source] = _merge_adjacent(before + rebuilt + after)

    # -- reading -----------------------------------------------------------------------------

    @property
    def instances(self) -> dict[str, PrivacyReport]:
        return dict(self._reports)

    @property
    def sources(self) -> list[str]:
        return sorted(self._segments)

    def coverage(self, source: str) -> list[Segment]:
        """The segments of ``source``: which positions were used, by which instances."""
        return list(self._segments.get(source, ()))

    def records(self) -> int:
        """Number of distinct (source, position) records charged."""
        return sum(seg.length for segs in self._segments.values() for seg in segs)

    def record_guarantee(self, uses: Iterable[str]) -> tuple[Guarantee, Guarantee]:
        """(output, intrusion) guarantee of one record with the given uses (see module docstring)."""
        uses = tuple(uses)
        if not uses:
            return Guarantee(0.0, 0.0), Guarantee(0.0, 0.0)
        outputs = [self._reports[u].output for u in uses]
        output = outputs[0]
        for g in outputs[1:]:
            output = output.compose(g)
        # One intrusion reads one instance's state at one time; the record's guarantee is the
        # worst case over which instance that is (componentwise maximum bounds every candidate).
        intrusion = Guarantee(0.0, 0.0)
        for j, u in enumerate(uses):
            candidate = self._reports[u].intrusion
            for i, g in enumerate(outputs):
                if i != j:
                    candidate = candidate.compose(g)
            intrusion = _componentwise_max(intrusion, candidate)
        return output, intrusion

    def report(self) -> PrivacyReport:
        """The composed guarantee over every record charged so far (componentwise worst case)."""
        worst_output = Guarantee(0.0, 0.0)
        worst_intrusion = Guarantee(0.0, 0.0)
        distinct_uses = {seg.uses for segs in self._segments.values() for seg in segs}
        max_uses = 0
        for uses in distinct_uses:
            output, intrusion = self.record_guarantee(uses)
            worst_output = _componentwise_max(worst_output, output)
            worst_intrusion = _componentwise_max(worst_intrusion, intrusion)
            max_uses = max(max_uses, len(uses))
        assumptions: list[str] = []
        references: list[str] = []
        for report in self._reports.values():
            assumptions.extend(a for a in report.assumptions if a not in assumptions)
            references.extend(r for r in report.references if r not in references)
        if max_uses > 1:
            assumptions.append(
                f"some records were used {max_uses} times (replays or epochs); their uses are "
                "combined by basic composition"
            )
        mechanisms = sorted({r.mechanism for r in self._reports.values()})
        return PrivacyReport(
            mechanism=mechanisms[0] if len(mechanisms) == 1 else "+".join(mechanisms) or "none",
            records=self.records(),
            output=worst_output,
            intrusion=worst_intrusion,
            assumptions=tuple(assumptions),
            references=tuple(references),
            max_records_per_user=self.max_records_per_user,
        )

    # -- persistence -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "max_records_per_user": self.max_records_per_user,
            "instances": {name: report.to_dict() for name, report in self._reports.items()},
            "sources": {
                source: [[s.start, s.stop, list(s.uses)] for s in segs]
                for source, segs in self._segments.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        _check_schema(data)
        ledger = cls(max_records_per_user=data.get("max_records_per_user"))
        for name, report in data["instances"].items():
            ledger._reports[name] = PrivacyReport.from_dict(report)
        for source, rows in data["sources"].items():
            segments = [Segment(int(a), int(b), tuple(uses)) for a, b, uses in rows]
            unknown = {u for s in segments for u in s.uses} - set(ledger._reports)
            if unknown:
                raise AccountingError(f"ledger source {source!r} names unregistered instances {unknown}")
            ledger._segments[source] = segments
        return ledger

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        return cls.from_dict(json.loads(text))


def _componentwise_max(a: Guarantee, b: Guarantee) -> Guarantee:
    return Guarantee(max(a.epsilon, b.epsilon), max(a.delta, b.delta))


def _merge_adjacent(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for seg in segments:
        if seg.length == 0:
            continue
        if merged and merged[-1].stop == seg.start and merged[-1].uses == seg.uses:
            merged[-1] = Segment(merged[-1].start, seg.stop, seg.uses)
        else:
            merged.append(seg)
    return merged
