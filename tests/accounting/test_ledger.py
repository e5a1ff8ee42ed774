"""Tests for panpriv.accounting.ledger: re-use composes, coverage is exact, reports round-trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from panpriv.accounting.errors import AccountingError, InvalidParameterError
from panpriv.accounting.ledger import Guarantee, PrivacyLedger, PrivacyReport, Segment


def report(name: str, eps: float, delta: float, int_eps: float | None = None, int_delta: float | None = None) -> PrivacyReport:
    return PrivacyReport(
        mechanism=name,
        records=0,
        output=Guarantee(eps, delta),
        intrusion=Guarantee(eps if int_eps is None else int_eps, delta if int_delta is None else int_delta),
        assumptions=(f"{name} assumption",),
        references=(f"{name} ref",),
    )


def test_in_order_consumption_is_one_segment_per_source() -> None:
    ledger = PrivacyLedger()
    ledger.register("a", report("pan-acsa", 1.0, 1e-6))
    for start in range(0, 10_000, 100):
        ledger.charge("a", "topic/0", start, start + 100)
    ledger.charge("a", "topic/1", 0, 7)
    assert ledger.coverage("topic/0") == [Segment(0, 10_000, ("a",))]
    assert ledger.coverage("topic/1") == [Segment(0, 7, ("a",))]
    assert ledger.records() == 10_007
    composed = ledger.report()
    assert composed.output == Guarantee(1.0, 1e-6)
    assert composed.records == 10_007


def test_replayed_range_composes_instead_of_counting_once() -> None:
    ledger = PrivacyLedger()
    ledger.register("a", report("pan-acsa", 1.0, 1e-6))
    ledger.charge("a", "f", 0, 100)
    ledger.charge("a", "f", 50, 150)  # positions 50..99 used twice
    assert ledger.coverage("f") == [
        Segment(0, 50, ("a",)),
        Segment(50, 100, ("a", "a")),
        Segment(100, 150, ("a",)),
    ]
    composed = ledger.report()
    assert composed.output.epsilon == pytest.approx(2.0)
    assert composed.output.delta == pytest.approx(2e-6)
    assert composed.records == 150
    assert any("used 2 times" in a for a in composed.assumptions)


def test_intrusion_reads_one_instance_plus_all_outputs() -> None:
    ledger = PrivacyLedger()
    ledger.register("a", report("x", 1.0, 1e-6, int_eps=1.5, int_delta=2e-6))
    ledger.register("b", report("y", 0.5, 0.0, int_eps=math.inf, int_delta=1.0))
    ledger.charge("a", "s", 0, 10)
    ledger.charge("b", "s", 5, 10)
    out, intr = ledger.record_guarantee(("a", "b"))
    assert out == Guarantee(1.5, 1e-6)
    # max(intrusion(a) + output(b), intrusion(b) + output(a)) = max((2.0, 2e-6), (inf, 1)).
    assert math.isinf(intr.epsilon)
    out_a, intr_a = ledger.record_guarantee(("a",))
    assert (out_a, intr_a) == (Guarantee(1.0, 1e-6), Guarantee(1.5, 2e-6))
    composed = ledger.report()
    assert composed.mechanism == "x+y"
    assert composed.output == Guarantee(1.5, 1e-6)
    assert not composed.intrusion.is_meaningful


def test_group_privacy_for_declared_records_per_user() -> None:
    ledger = PrivacyLedger(max_records_per_user=3)
    ledger.register("a", report("pan-acsa", 1.0, 1e-6))
    ledger.charge("a", "s", 0, 10)
    composed = ledger.report()
    assert composed.user_output == Guarantee(3.0, 3 * math.exp(2.0) * 1e-6)
    assert "at most 3 records (a declared bound, not enforced" in composed.statement()


def test_guarantee_cannot_be_strengthened_after_spending() -> None:
    ledger = PrivacyLedger()
    ledger.register("a", report("pnsgd", 1.0, 1e-3))
    ledger.register("a", report("pnsgd", 1.0, 2e-3))  # weaker: fine
    with pytest.raises(AccountingError, match="cannot become stronger"):
        ledger.register("a", report("pnsgd", 1.0, 1e-4))


def test_charge_requires_registration_and_valid_range() -> None:
    ledger = PrivacyLedger()
    with pytest.raises(AccountingError, match="unregistered"):
        ledger.charge("nobody", "s", 0, 1)
    ledger.register("a", report("x", 1.0, 0.0))
    with pytest.raises(InvalidParameterError, match="start/stop"):
        ledger.charge("a", "s", 5, 2)


def test_json_round_trip_keeps_infinity_and_segments() -> None:
    ledger = PrivacyLedger(max_records_per_user=2)
    ledger.register("a", report("x", 1.0, 1e-6, int_eps=math.inf, int_delta=1.0))
    ledger.charge("a", "t/0", 3, 9)
    ledger.charge("a", "t/0", 5, 6)
    restored = PrivacyLedger.from_json(ledger.to_json())
    assert restored.coverage("t/0") == ledger.coverage("t/0")
    assert restored.report() == ledger.report()
    assert math.isinf(restored.report().intrusion.epsilon)
    rep = ledger.report()
    assert PrivacyReport.from_dict(rep.to_dict()) == rep


def test_unknown_schema_version_is_refused() -> None:
    data = PrivacyLedger().to_dict()
    data["schema_version"] = 99
    with pytest.raises(AccountingError, match="schema_version 99"):
        PrivacyLedger.from_dict(data)


def test_invalid_guarantees_name_the_parameter() -> None:
    with pytest.raises(InvalidParameterError, match="'delta' parameter of Guarantee"):
        Guarantee(1.0, 1.5)
    with pytest.raises(InvalidParameterError, match="'epsilon'"):
        Guarantee(float("nan"), 0.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 60), st.integers(0, 30)),
        min_size=1,
        max_size=12,
    )
)
def test_segments_match_per_position_brute_force(charges: list[tuple[str, int, int]]) -> None:
    ledger = PrivacyLedger()
    ledger.register("a", report("x", 1.0, 0.0))
    ledger.register("b", report("y", 0.25, 0.0))
    uses_by_position: dict[int, list[str]] = {}
    for instance, start, length in charges:
        ledger.charge(instance, "s", start, start + length)
        for pos in range(start, start + length):
            uses_by_position.setdefault(pos, []).append(instance)
    segments = ledger.coverage("s")
    expanded = {pos: list(seg.uses) for seg in segments for pos in range(seg.start, seg.stop)}
    assert expanded == {pos: sorted(u) for pos, u in uses_by_position.items()}
    # Disjoint, sorted, and maximally merged.
    for left, right in zip(segments, segments[1:]):
        assert left.stop <= right.start
        assert not (left.stop == right.start and left.uses == right.uses)
    worst = max((sum(1.0 if u == "a" else 0.25 for u in uses) for uses in uses_by_position.values()), default=0.0)
    assert ledger.report().output.epsilon == pytest.approx(worst)
