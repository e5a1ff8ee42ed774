"""The ESA analyzer charges the shared budget store through the one BudgetSession with the rounds
unit (streamer/budget/session.py, streamer/budget/units.py), without a broker: a real SQLite
store, real analyzers, real sealed messages."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nacl.public import PrivateKey

from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.budget.store import BudgetExceededError, BudgetStore, describe_store
from panpriv.streamer.budget.units import Rounds
from panpriv.streamer.esa.analyze_service import new_instance
from panpriv.streamer.esa.analyzer import Analyzer
from panpriv.streamer.esa.deployment import data_key
from tests.esa import parts
from tests.esa.test_roles import SHUFFLER, B, encoder, learner, records, shuffled

KEY = data_key("cluster=test", "messages")


def batches(key: PrivateKey, rounds: int) -> list[bytes]:
    """The shuffled batches of ``rounds`` rounds, encoded against a reference analyzer's models."""
    reference = parts.bound(Analyzer(learner(), [key], "ref"), SHUFFLER)
    X, y = records(B * rounds)
    out = []
    for t in range(rounds):
        rows = slice(t * B, (t + 1) * B)
        messages = encoder(key, reference.model()).encode(X[rows], y[rows])
        value = parts.signed(SHUFFLER, t, shuffled(messages, t))
        assert reference.handle(value)
        out.append(value)
    return out


def charged(directory: Path, name: str, limit: float | None = None,
            store: Callable[[], Any] | None = None) -> tuple[Analyzer, BudgetSession]:
    """An analyzer of deployment ``name`` gated by the store in ``directory`` (or ``store()``),
    begun at round 0 (what ``panpriv analyze`` does: streamer/esa/analyze_service.py)."""
    analyzer = parts.bound(Analyzer(learner(), [KEYPAIR], name, new_instance(name, "shuffle-gaussian")), SHUFFLER)
    assert analyzer.instance is not None
    opened = store() if store is not None else BudgetStore(directory)
    budget = BudgetSession(opened, directory / name, limit, run=analyzer.instance, unit=analyzer.charge_unit(KEY))
    budget.begin_role(f"esa messages (deployment {name})", analyzer.report(), step=analyzer.round)
    analyzer.gate = budget.charge_step
    return analyzer, budget


KEYPAIR = PrivateKey.generate()
BATCHES = batches(KEYPAIR, 3)


def uses(directory: Path, store: Callable[[], Any] | None = None) -> list[tuple[int, int, tuple[str, ...]]]:
    ledger = (store() if store is not None else BudgetStore(directory)).ledger([KEY])
    return [(s.start, s.stop, s.uses) for s in ledger.coverage(KEY)]


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.integration)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """Opens the same store again at every call: SQLite in tmp_path, or a fresh topic of the real
    broker (streamer/budget/kafka_store.py)."""
    if request.param == "sqlite":
        return lambda: BudgetStore(tmp_path)
    from panpriv.streamer.budget.kafka_store import KafkaBudgetStore

    broker = request.getfixturevalue("kafka_broker")
    topic = f"esa-budget-{uuid.uuid4().hex[:10]}"
    return lambda: KafkaBudgetStore([broker.bootstrap], topic)


def test_each_round_is_charged_before_it_is_learned_and_shown_by_panpriv_budget(tmp_path: Path) -> None:
    analyzer, budget = charged(tmp_path, "first")
    own = analyzer.report()
    for t, value in enumerate(BATCHES):
        assert analyzer.handle(value)
        assert uses(tmp_path) == [(0, t + 1, (analyzer.instance,))]
    report = budget.composed(analyzer.report(), [KEY])
    assert (report.output, report.intrusion) == (own.output, own.intrusion)
    assert any("public, not noised" in a for a in report.assumptions)
    text = describe_store(tmp_path)
    assert f"{KEY}: composed over all runs" in text and str(analyzer.instance) in text
    assert f"[0, 3) used by {analyzer.instance}" in text


def test_a_second_analyzer_over_the_same_source_composes(tmp_path: Path, stores: Callable[[], Any]) -> None:
    """Another deployment name, another instance, the same messages topic: the same users' data."""
    first, _ = charged(tmp_path, "first", store=stores)
    assert all(first.handle(value) for value in BATCHES)
    second, budget = charged(tmp_path, "second", store=stores)
    assert second.handle(BATCHES[0]) and second.handle(BATCHES[1])
    one = first.report()
    report = budget.composed(second.report(), [KEY])
    assert report.output.epsilon == pytest.approx(2 * one.output.epsilon)
    assert report.output.delta == pytest.approx(2 * one.output.delta)
    assert report.intrusion.epsilon >= one.intrusion.epsilon + one.output.epsilon - 1e-12
    assert any(str(first.instance) in a for a in report.assumptions), report.assumptions
    assert uses(tmp_path, stores) == [(0, 2, tuple(sorted([str(first.instance), str(second.instance)]))),
                              (2, 3, (first.instance,))]


def test_max_epsilon_refuses_to_start_over_a_spent_source(tmp_path: Path) -> None:
    first, _ = charged(tmp_path, "first")
    assert first.handle(BATCHES[0])
    one = first.report()
    # One use: ε = the intrusion bound ε₀; two uses: ε₀ + the output ε (basic composition). Between them:
    limit = one.intrusion.epsilon + 0.5 * one.output.epsilon
    with pytest.raises(BudgetExceededError, match="refusing to start.*no model was published"):
        charged(tmp_path, "second", limit)


def test_max_epsilon_stops_mid_run_before_the_step(tmp_path: Path) -> None:
    """A fresh round is learned; the next one, spent by another run, stops the analyzer before its
    step: the state is that of the round before, and nothing more is charged."""
    first, _ = charged(tmp_path, "first")
    one = first.report()
    store = BudgetStore(tmp_path)
    store.register("other", "other", one, tmp_path / "other")
    assert store.charge("other", {KEY: (1, 2)}) is None
    second, _ = charged(tmp_path, "second", one.intrusion.epsilon + 0.5 * one.output.epsilon)
    assert second.handle(BATCHES[0])
    theta = second.learner.release().copy()
    assert not second.handle(BATCHES[1])
    assert second.stopped is not None and "exceed the budget" in second.stopped
    assert second.round == 1
    np.testing.assert_array_equal(second.learner.release(), theta)
    assert uses(tmp_path) == [(0, 1, (second.instance,)), (1, 2, ("other",))]


def test_a_round_charged_by_a_process_that_died_is_not_charged_twice(tmp_path: Path, stores: Callable[[], Any]) -> None:
    """The dead process charged round 1 and died before its checkpoint; the restarted analyzer
    (same instance, restored at round 1) re-analyses it deterministically: one use, not two."""
    analyzer, budget = charged(tmp_path, "first", store=stores)
    assert analyzer.handle(BATCHES[0])
    saved = analyzer.checkpoint()
    assert analyzer.handle(BATCHES[1])  # charged [1, 2), then the "crash": the checkpoint is the old one
    theta = analyzer.learner.release().copy()
    budget.close()  # the dead process's store: its attempt is no longer live
    restored = parts.bound(Analyzer.restore(saved, [KEYPAIR]), SHUFFLER)
    assert restored.instance == analyzer.instance and restored.round == 1
    again = BudgetSession(stores(), tmp_path / "first", run=str(restored.instance), unit=Rounds(KEY))
    again.begin_role("esa", restored.report(), step=restored.round)
    restored.gate = again.charge_step
    assert restored.handle(BATCHES[1])
    np.testing.assert_array_equal(restored.learner.release(), theta)  # no noise: the same model
    assert restored.handle(BATCHES[2])
    assert uses(tmp_path, stores) == [(0, 3, (analyzer.instance,))]


def test_a_round_a_cleanly_stopped_process_charged_is_charged_again_after_a_rollback(tmp_path: Path) -> None:
    """The per-attempt rule of begin_role (streamer/budget/rules.py): only a round charged by a dead
    process, beyond its checkpoint, is learned again without a charge. A process that stopped
    cleanly after round 1 released it; an analyzer.json rolled back to round 1 learns it a second
    time, and the store counts two uses of round 1."""
    analyzer, budget = charged(tmp_path, "first")
    assert analyzer.handle(BATCHES[0])
    saved = analyzer.checkpoint()  # the state at round 1: the "backup"
    assert analyzer.handle(BATCHES[1])
    budget.mark_step_durable(analyzer.round, clean=True)
    budget.close()
    restored = parts.bound(Analyzer.restore(saved, [KEYPAIR]), SHUFFLER)
    again = BudgetSession(BudgetStore(tmp_path), tmp_path / "first", run=str(restored.instance), unit=Rounds(KEY))
    again.begin_role("esa", restored.report(), step=restored.round)
    restored.gate = again.charge_step
    assert restored.handle(BATCHES[1])
    again.close()
    instance = str(analyzer.instance)
    assert uses(tmp_path) == [(0, 1, (instance,)), (1, 2, (instance, instance))]


def test_a_second_live_process_of_an_analyzer_instance_is_refused(tmp_path: Path, stores: Callable[[], Any]) -> None:
    """Two processes of one analyzer instance (a copy of its --out: the directory lock cannot see it)
    would be one budget instance; the store refuses the second while the first lives, with one line."""
    from panpriv.streamer.budget.store import BudgetError

    analyzer, budget = charged(tmp_path, "first", store=stores)
    assert analyzer.handle(BATCHES[0])
    copy = BudgetSession(stores(), tmp_path / "copy", run=str(analyzer.instance), unit=Rounds(KEY))
    with pytest.raises(BudgetError, match="is in use by another live process") as refused:
        copy.begin_role("esa", analyzer.report(), step=analyzer.round)
    assert "\n" not in str(refused.value)
    copy.close()
    budget.close()


def test_an_analyzer_refuses_a_store_behind_its_state(tmp_path: Path) -> None:
    """analyzer.json records the store's id and generation at every save (as the service's
    checkpoint does); a store restored from an older backup, or another store, is refused with one
    line before anything is charged or published."""
    from shutil import copy2

    from panpriv.streamer.budget.store import DATABASE_NAME, BudgetError
    from panpriv.streamer.esa.analyze_service import state_file

    state = state_file(tmp_path / "first")
    analyzer, budget = charged(tmp_path, "first")
    copy2(tmp_path / DATABASE_NAME, tmp_path / "backup.sqlite")
    for value in BATCHES[:2]:
        assert analyzer.handle(value)
        state.save(analyzer.checkpoint(), budget_mark=budget.mark())
        budget.mark_step_durable(analyzer.round)
    budget.close()
    seen = state_file(tmp_path / "first")
    assert seen.load() is not None and seen.budget_mark == {"store": budget.store.store_id,
                                                             "generation": seen.budget_mark["generation"]}
    copy2(tmp_path / "backup.sqlite", tmp_path / DATABASE_NAME)  # the store rolled back to before both rounds
    for directory in (tmp_path, tmp_path / "elsewhere"):  # the old store, then another (empty) one
        again = BudgetSession(BudgetStore(directory), tmp_path / "first", run=str(analyzer.instance), unit=Rounds(KEY))
        with pytest.raises(BudgetError, match="behind generation|is store") as refused:
            again.begin_role("esa", analyzer.report(), step=analyzer.round, seen=seen.budget_mark, where=str(seen.path))
        assert "\n" not in str(refused.value) and str(seen.path) in str(refused.value)
        again.close()
