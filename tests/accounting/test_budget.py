"""panpriv.accounting.budget: composition of uses across runs, lost states, budget checks.

Expected values are worked by hand from the ledger's rule (outputs add, Dwork & Roth 2014,
Thm 3.16; intrusion = max_j [intrusion(u_j) + Σ_{i≠j} output(u_i)]), independently of the code.
"""

from __future__ import annotations

import math

import pytest

from panpriv.accounting.budget import Charge, compose, exceeds, lost_state_report, per_source, report_for
from panpriv.accounting.errors import AccountingError
from panpriv.accounting.ledger import Guarantee, PrivacyReport


def report(out: float, intr: float, delta: float = 1e-6, name: str = "m") -> PrivacyReport:
    return PrivacyReport(name, 0, Guarantee(out, delta), Guarantee(intr, delta))


def test_two_runs_on_the_same_records_compose_by_the_ledger_rule() -> None:
    reports = {"a": report(1.0, 1.0), "b": report(0.5, 2.0)}
    ledger = compose(reports, [Charge("a", "k", 0, 10), Charge("b", "k", 5, 20)])
    assert [(s.start, s.stop, s.uses) for s in ledger.coverage("k")] == [
        (0, 5, ("a",)), (5, 10, ("a", "b")), (10, 20, ("b",))
    ]
    output, intrusion = ledger.record_guarantee(("a", "b"))
    assert output == Guarantee(1.5, 2e-6)
    # max(intr_a + out_b, intr_b + out_a) = max(1 + 0.5, 2 + 1) = 3
    assert intrusion == Guarantee(3.0, 2e-6)
    assert per_source(ledger)["k"] == (Guarantee(1.5, 2e-6), Guarantee(3.0, 2e-6))


def test_a_charge_to_an_unregistered_instance_is_refused() -> None:
    with pytest.raises(AccountingError, match="no registered report"):
        compose({}, [Charge("ghost", "k", 0, 1)])


def test_a_lost_state_adds_its_intrusion_to_the_relearning_runs_outputs_only() -> None:
    run = report(1.0, 1.0)
    lost = lost_state_report(run)
    assert lost.output == Guarantee(0.0, 0.0) and lost.intrusion == run.intrusion
    ledger = compose({"r": run, "r/lost-001": lost}, [Charge("r", "k", 0, 100), Charge("r/lost-001", "k", 60, 100)])
    # Records re-learned after the crash: output = 1 (the lost state released nothing),
    # intrusion = max(intr_lost + out_r, intr_r + 0) = 2: the composition of both uses.
    assert ledger.record_guarantee(("r", "r/lost-001")) == (Guarantee(1.0, 1e-6), Guarantee(2.0, 2e-6))
    # Records learned once before the checkpoint keep (1, 1).
    assert ledger.record_guarantee(("r",)) == (Guarantee(1.0, 1e-6), Guarantee(1.0, 1e-6))


def test_the_same_instance_charging_a_range_twice_counts_two_uses() -> None:
    ledger = compose({"r": report(1.0, 1.0)}, [Charge("r", "k", 0, 10), Charge("r", "k", 0, 10)])
    assert ledger.record_guarantee(ledger.coverage("k")[0].uses) == (Guarantee(2.0, 2e-6), Guarantee(2.0, 2e-6))


def test_exceeds_names_the_earlier_use_and_the_range() -> None:
    ledger = compose({"a": report(1.0, 1.0), "b": report(1.0, 1.0)}, [Charge("a", "k", 0, 10)])
    excess = exceeds(ledger, "b", {"k": (5, 20)}, limit=1.5)
    assert excess is not None
    assert (excess.epsilon, excess.source, excess.start, excess.stop) == (2.0, "k", 5, 10)
    assert [name for name, _ in excess.spent_by] == ["a"]
    assert exceeds(ledger, "b", {"k": (10, 20)}, limit=1.5) is None  # fresh records: ε = 1
    assert exceeds(ledger, "b", {"k": (5, 20)}, limit=2.0) is None  # exactly at the limit is allowed
    assert exceeds(ledger, "b", {"other": (0, 5)}, limit=1.5) is None  # parallel: another source


def test_an_infinite_intrusion_guarantee_is_not_a_budget() -> None:
    seeded = PrivacyReport("m", 0, Guarantee(1.0, 1e-6), Guarantee.none())
    ledger = compose({"a": seeded, "b": seeded}, [Charge("a", "k", 0, 10)])
    excess = exceeds(ledger, "b", {"k": (0, 10)}, limit=1.5)
    assert excess is not None and excess.epsilon == 2.0  # the outputs still compose
    assert math.isinf(ledger.record_guarantee(("a", "b"))[1].epsilon)


def test_report_for_covers_only_the_records_the_run_used_and_names_the_others() -> None:
    reports = {"a": report(1.0, 1.0), "b": report(0.25, 0.25), "c": report(3.0, 3.0)}
    charges = [Charge("a", "k", 0, 10), Charge("b", "k", 0, 10), Charge("c", "other", 0, 10)]
    ledger = compose(reports, charges)
    stated = report_for(ledger, ["b"], records=10)
    # b's records were also used by a: output 1.25, intrusion max(1 + 0.25, 0.25 + 1) = 1.25;
    # c's records (another source) do not enter b's statement.
    assert (stated.output, stated.intrusion) == (Guarantee(1.25, 2e-6), Guarantee(1.25, 2e-6))
    assert stated.records == 10 and any("also used by a" in text for text in stated.assumptions)


def test_charges_in_another_order_are_widened_to_every_charged_position() -> None:
    """Positions of another serialisation name other records: each instance's charges there count,
    on every position, as often as they overlap one position of their own order."""
    from panpriv.accounting.budget import effective

    charges = [Charge("a", "k", 0, 10, "o1"), Charge("b", "k", 0, 4, "o2"), Charge("b", "k", 4, 6, "o2"),
               Charge("c", "k", 2, 5, "o2"), Charge("c", "k", 3, 4, "o2")]
    widened = effective(charges)
    assert widened[0] == charges[0]
    assert sorted(c.instance for c in widened[1:]) == ["b", "c", "c"]  # b: disjoint ranges, once; c: twice at 3
    assert {(c.start, c.stop) for c in widened[1:]} == {(0, 10)}
    ledger = compose({n: report(1.0, 1.0) for n in "abc"}, charges)
    assert [(s.start, s.stop, s.uses) for s in ledger.coverage("k")] == [(0, 10, ("a", "b", "c", "c"))]


def test_exceeds_after_checks_a_new_charge_in_another_order_over_the_widened_positions() -> None:
    from panpriv.accounting.budget import exceeds_after

    reports = {"a": report(1.0, 1.0), "b": report(1.0, 1.0)}
    existing = [Charge("a", "k", 0, 5, "o1"), Charge("a", "k", 5, 10, "o1"), Charge("a", "k", 8, 10, "o1")]
    # b's positions [0, 2) in its own order may hold a's twice-used records [8, 10): 3 uses.
    excess = exceeds_after(reports, existing, [Charge("b", "k", 0, 2, "o2")], limit=2.5)
    assert excess is not None and excess.epsilon == 3.0 and (excess.start, excess.stop) == (8, 10)
    assert [name for name, _ in excess.spent_by] == ["a"]
    assert exceeds_after(reports, existing, [Charge("b", "k", 0, 2, "o1")], limit=2.5) is None  # the same order: exact


def test_weakest_keeps_each_guarantee_at_least_as_weak_as_before() -> None:
    from panpriv.accounting.budget import weakest

    old = PrivacyReport("m", 5, Guarantee(1.0, 2e-6), Guarantee(2.0, 1e-6))
    new = PrivacyReport("m", 9, Guarantee(1.5, 1e-6), Guarantee(1.0, 3e-6))
    kept = weakest(old, new)
    assert (kept.output, kept.intrusion, kept.records) == (Guarantee(1.5, 2e-6), Guarantee(2.0, 3e-6), 9)
    assert weakest(new, old).output == kept.output and weakest(old, old) is old
