"""The soak campaign's figures (``make soak``): one table printed at the end of the run.

Tests of the campaign add what they did to :data:`FIGURES` (kills survived per role, flips refused
per target, messages counted by reason per topic, tracebacks, records lost or learned twice,
budget under-counts); tests/faults/conftest.py prints the table in ``pytest_terminal_summary``
when the session selected the ``soak`` marker. A test that fails before adding its figures leaves
its rows out: the table says what the run showed, and pytest's summary what failed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Figures:
    """What the campaign did and found (module docstring)."""

    kills: Counter[str] = field(default_factory=Counter)
    """kill -9 followed by a restart, per role."""
    flips: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    """Bit flips per target, by outcome (``refused``: one line and its exit code; ``harmless``: the
    same state loaded; ``silent``: a changed state resumed — must stay 0)."""
    messages: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    """Fuzzed and forged messages per topic, by the reason the role counted them under."""
    second_refused: Counter[str] = field(default_factory=Counter)
    """A second process on one state, refused with one line, per role."""
    tracebacks: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    """Records lost, per campaign."""
    twice: Counter[str] = field(default_factory=Counter)
    """Records learned (published) twice, per campaign."""
    under_counts: Counter[str] = field(default_factory=Counter)
    """Published records without a full budget charge, per campaign."""
    notes: list[str] = field(default_factory=list)

    def flipped(self, target: str, outcomes: Mapping[str, int]) -> None:
        self.flips[target].update(outcomes)

    def counted(self, topic: str, reasons: Mapping[str, int]) -> None:
        self.messages[topic].update({reason: n for reason, n in reasons.items() if n})

    def ledger(self, campaign: str, lost: int, twice: int, under_counts: int) -> None:
        self.lost[campaign] += lost
        self.twice[campaign] += twice
        self.under_counts[campaign] += under_counts

    def empty(self) -> bool:
        return not (self.kills or self.flips or self.messages or self.second_refused or self.lost or self.notes)

    def table(self) -> list[str]:
        """The table's lines."""
        lines = ["soak figures", "-" * 12]
        if self.kills:
            lines.append(f"kill -9 + restart survived: {sum(self.kills.values()):,} "
                         f"({', '.join(f'{role} {n}' for role, n in sorted(self.kills.items()))})")
        for target, outcomes in sorted(self.flips.items()):
            lines.append(f"bit flips of {target}: {sum(outcomes.values()):,} "
                         f"({', '.join(f'{k} {v:,}' for k, v in sorted(outcomes.items()))})")
        for topic, reasons in sorted(self.messages.items()):
            lines.append(f"messages on {topic}: {sum(reasons.values()):,} "
                         f"({', '.join(f'{k} {v:,}' for k, v in sorted(reasons.items()))})")
        if self.second_refused:
            lines.append(f"second process on one state refused with one line: "
                         f"{', '.join(f'{role} {n}' for role, n in sorted(self.second_refused.items()))}")
        lines.append(f"tracebacks: {self.tracebacks}")
        for name, counts in (("records lost", self.lost), ("records learned twice", self.twice),
                             ("budget under-counts", self.under_counts)):
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            lines.append(f"{name}: {sum(counts.values())}" + (f" ({detail})" if detail else ""))
        lines += self.notes
        return lines


FIGURES = Figures()
"""The session's figures (one pytest process: ``make soak`` runs without xdist)."""
