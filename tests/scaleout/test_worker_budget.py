"""A scale-out worker's dealings with the budget store, without a broker: the one BudgetSession of a
role charging position ranges (streamer/budget/session.py ``for_role``, what streamer/scaleout/worker.py
does per poll), against a real SQLite store.

The worker charges its polls ahead (streamer/budget/ahead.py: at least eight polls per durable write; it did
one write per poll, about four fsyncs each since the store's rollback journal), and gives back what
it charged and never read — on a clean stop, a revocation, a lost batch — so that the ahead window
neither outlives the records it covers as an over-count nor, moved to a lost instance, lets later
records through uncharged."""

from __future__ import annotations

from pathlib import Path

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.budget.open import BudgetSettings
from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.budget.store import BudgetStore

KEY = "kafka:cluster=test/data/0"
RUN = "scaleout:default/worker-0123456789ab"
REPORT = PrivacyReport("pan-acsa", 0, Guarantee(1.0, 1e-6), Guarantee(1.0, 1e-6))
POLL = 25


def worker(tmp_path: Path) -> BudgetSession:
    session = BudgetSession.for_role(BudgetSettings(state_dir=tmp_path), tmp_path / "worker", RUN)
    session.begin_role(f"kafka:data ({KEY})", REPORT)
    return session


def poll(session: BudgetSession, start: int, stop: int) -> None:
    """One poll's positions charged before they are learned (Worker._learn)."""
    assert session.charge(RUN, {KEY: (start, stop)}, session.own()) is None


def uses(tmp_path: Path) -> list[tuple[int, int, tuple[str, ...]]]:
    store = BudgetStore(tmp_path)
    try:
        return [(s.start, s.stop, s.uses) for s in store.ledger([KEY]).coverage(KEY)]
    finally:
        store.close()


def test_polls_are_charged_ahead_and_a_clean_stop_gives_back_what_was_not_read(tmp_path: Path) -> None:
    session = worker(tmp_path)
    before = session.store.generation
    for i in range(40):
        poll(session, POLL * i, POLL * (i + 1))
    writes = session.store.generation - before
    assert writes <= 40 // 8 + 1, writes  # one durable write per poll before
    session.mark_durable(RUN, 1, {KEY: 40 * POLL}, clean=True)
    session.close()
    assert uses(tmp_path) == [(0, 40 * POLL, (RUN,))]


def test_a_lost_batch_leaves_no_window_that_lets_later_records_through(tmp_path: Path) -> None:
    """A batch is published at 50, the next one reads [50, 100) and is lost (revoked, stopped): its
    records move to the lost instance — not the window charged ahead beyond 100, which is given
    back — and the next poll, [100, 125), is charged to the worker again."""
    session = worker(tmp_path)
    poll(session, 0, 25)
    poll(session, 25, 50)
    session.mark_durable(RUN, 1, {KEY: 50}, clean=False)  # published
    poll(session, 50, 75)
    poll(session, 75, 100)
    lost = session.reclassify_lost({KEY: 50}, REPORT)
    assert lost == {KEY: (50, 100)}
    poll(session, 100, 125)
    session.mark_durable(RUN, 2, {KEY: 125}, clean=True)
    session.close()
    assert uses(tmp_path) == [(0, 50, (RUN,)), (50, 100, (f"{RUN}/lost-001",)), (100, 125, (RUN,))]


def test_a_revocation_gives_back_the_window_but_never_what_was_read(tmp_path: Path) -> None:
    """After a revocation the partition's next offsets are its new owner's: the window beyond what
    the worker read is given back. A rewind (the partition back at an earlier offset) is charged as
    a second use from its own start, and giving back never uncharges a record read before it: the
    rewind's window below the furthest offset read stays (an over-count, never an under-count)."""
    session = worker(tmp_path)
    for i in range(4):
        poll(session, POLL * i, POLL * (i + 1))
    poll(session, 50, 60)  # the partition came back at a committed offset below what was read
    session.give_back(RUN)  # a revocation
    session.mark_durable(RUN, 1, {KEY: 60}, clean=True)
    session.close()
    assert uses(tmp_path) == [(0, 50, (RUN,)), (50, 100, (RUN, RUN))]
