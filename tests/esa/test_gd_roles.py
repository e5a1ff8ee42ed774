"""Encode–Shuffle–Analyze for ``shuffle-gd`` (Cheu et al. 2022 Alg. 5) without a broker: clients that
answer every round and refuse beyond the statement, the secure-sum shuffler logic, the analyzer
against the in-process learner, its statement and the budget store charging every user per round
(a real SQLite store, real sealed shares)."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from nacl.public import PrivateKey

from panpriv.protocols.secure_sum import added_delta
from panpriv.protocols.shuffle_gd import ShuffleGD, composed
from panpriv.streamer.budget.session import BudgetSession
from panpriv.streamer.budget.store import BudgetStore
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.analyze_service import new_instance
from panpriv.streamer.esa.client import RefusedModel
from panpriv.streamer.esa.deployment import DEPLOYMENT, data_key
from panpriv.streamer.esa.gd_analyzer import GDAnalyzer
from panpriv.streamer.esa.gd_client import AnsweredRounds, GDClients
from panpriv.streamer.esa.model import ModelRecord
from panpriv.streamer.esa.shuffler import Shuffler
from tests.esa import parts

DIM, N, T = 4, 16, 3
KEY = data_key("cluster=test", "gd-messages")
SHUFFLER = parts.shuffler_keys()


def inside(message: bytes, shares: int) -> list[bytes]:
    return parts.units_inside(message, SHUFFLER, wire.share_unit_size(DIM), shares)


def learner(seed: int | None = None, loss: str = "logistic", rounds: int = T) -> ShuffleGD:
    return ShuffleGD(dim=DIM, loss={"name": loss, "intercept": False}, epsilon=4.0, delta=1e-5, n=N, rounds=rounds,
                     radius=2.0, rng=seed)


def records(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return parts.separable(n, DIM, seed)


@pytest.fixture(scope="module")
def key() -> PrivateKey:
    return PrivateKey.generate()


def run_round(analyzer: GDAnalyzer, clients: list[GDClients], shuffler: Shuffler, offset: int) -> int:
    """Every client answers the analyzer's current model; the shuffler releases the round; the analyzer handles it."""
    released = []
    for client in clients:
        for item in client.answer(analyzer.model()):
            released += shuffler.offer(offset, item)
            offset += 1
    (round_, units), = released
    assert round_ == analyzer.round and len(units) == N * analyzer.shares
    shuffler.mark_released(round_)
    assert analyzer.handle(parts.signed(SHUFFLER, round_, units))
    return offset


@pytest.mark.parametrize("loss", ["logistic", "hinge"])
def test_clients_shuffler_and_analyzer_reproduce_the_in_process_learner(key: PrivateKey, loss: str) -> None:
    """With the same seeded PVEC noise, n clients answering T rounds + the shuffler logic + the
    analyzer take exactly the in-process learner's T gradient steps (hinge: of the Moreau envelope)
    in its per-user mode (``pooled_noise = False``: its default pools the binomial noise, the same
    law but other draws)."""
    X, y = records(seed=1)
    in_process = learner(seed=7, loss=loss)
    in_process.pooled_noise = False  # every user's message drawn as her client draws it (the per-user reference)
    for _ in range(T):
        in_process.learn_many(X, y)
    assert in_process.finished
    analyzer = parts.bound(GDAnalyzer(learner(loss=loss), [key], "t"), SHUFFLER)
    assert (analyzer.learner.round_smoothing() is None) == (loss == "logistic")
    shuffler = Shuffler(SHUFFLER.box, N, analyzer.dim, shares=analyzer.shares)
    clients = GDClients(key.public_key, SHUFFLER.box.public_key, X, y, rng=np.random.default_rng(7))
    offset = 0
    for t in range(T):
        assert analyzer.report().output == analyzer.composed_output(t)
        offset = run_round(analyzer, [clients], shuffler, offset)
    assert analyzer.round == T and analyzer.finished and analyzer.skipped == 0 and analyzer.rejected == {}
    assert clients.state.rounds == list(range(T))
    np.testing.assert_allclose(analyzer.learner.release(), in_process.release(), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(analyzer.model().theta, analyzer.learner.release())
    assert analyzer.learner.records_seen == in_process.records_seen == T * N
    # The statement: the learner's T-round composition with (1 + e^eps0) tau more delta per round.
    report, own = analyzer.report(), in_process.privacy()
    extra = added_delta(analyzer.learner.vector_sum.epsilon, analyzer.tau)
    assert report.output.epsilon == own.output.epsilon
    assert report.output.delta == pytest.approx(own.output.delta + T * extra, rel=1e-12)
    assert any(DEPLOYMENT in a for a in report.assumptions) and any("T = 3 rounds" in a for a in report.assumptions)
    assert not any("in one process" in a for a in report.assumptions)
    # The ledger increments telescope to the statement.
    increments = [analyzer.round_report(t).output for t in range(T)]
    assert sum(g.epsilon for g in increments) == pytest.approx(report.output.epsilon, rel=1e-8)
    assert sum(g.epsilon for g in increments) >= report.output.epsilon
    assert sum(g.delta for g in increments) >= report.output.delta
    # Checkpoint: names the learner, restores the model, the round and the refusal of round T.
    data = analyzer.checkpoint()
    assert data["learner"] == "shuffle-gd" and data["format"] == "panpriv-esa-gd-analyzer/2"
    restored = GDAnalyzer.restore(data, [key])
    np.testing.assert_array_equal(restored.learner.release(), analyzer.learner.release())
    assert restored.round == T and restored.finished
    parts.bound(restored, SHUFFLER)
    assert not restored.handle(parts.signed(SHUFFLER, T, [b"x" * wire.share_unit_size(analyzer.dim)] * (N * analyzer.shares)))
    assert restored.rejected["horizon_reached"] == 1
    with pytest.raises(ValueError, match="shuffle-gd"):
        GDAnalyzer.restore({**data, "format": "panpriv-esa-sum-analyzer/2"}, [key])


def test_two_clients_each_with_half_the_users(key: PrivateKey) -> None:
    """Users split over two clients (two devices' worth) answer each round once each: the shuffler
    releases a round only once both halves are in, with the n users' complete units."""
    X, y = records(seed=2)
    analyzer = parts.bound(GDAnalyzer(learner(), [key], "b"), SHUFFLER)
    halves = [GDClients(key.public_key, SHUFFLER.box.public_key, X[: N // 2], y[: N // 2]), GDClients(key.public_key, SHUFFLER.box.public_key, X[N // 2:], y[N // 2:])]
    shuffler = Shuffler(SHUFFLER.box, N, DIM, shares=analyzer.shares)
    offset = 0
    for t in range(T):
        first, second = (half.answer(analyzer.model()) for half in halves)
        for item in first:
            assert not shuffler.offer(offset, item), "half a round waits"
            offset += 1
        released = []
        for item in second:
            released += shuffler.offer(offset, item)
            offset += 1
        (round_, units), = released
        assert round_ == t and sorted(units) == sorted(u for m in (*first, *second) for u in inside(m, analyzer.shares))
        shuffler.mark_released(t)
        assert analyzer.handle(parts.signed(SHUFFLER, t, units))
    assert analyzer.round == T and analyzer.rejected == {} and [h.state.rounds for h in halves] == [[0, 1, 2]] * 2


def test_a_client_refuses_a_repeated_round_and_a_round_beyond_t(key: PrivateKey, tmp_path: Path) -> None:
    """The per-user refusal rule: each round once, at most the T rounds of the plan she accepted,
    and never a changed plan; the file-backed state survives a restart of the client."""
    X, y = records()
    analyzer = GDAnalyzer(learner(), [key], "t")
    path = tmp_path / "user" / "rounds.json"
    client = GDClients(key.public_key, SHUFFLER.box.public_key, X, y, AnsweredRounds(path))
    first = analyzer.model()
    assert len(client.answer(first)) == N
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(RefusedModel, match="already answered"):
        client.answer(first)
    client.state.close()  # the process ends (its lock with it)
    restarted = GDClients(key.public_key, SHUFFLER.box.public_key, X, y, AnsweredRounds(path))  # a crash and restart: the file remembers
    with pytest.raises(RefusedModel, match="already answered"):
        restarted.answer(first)
    for t in (1, 2):
        assert len(restarted.answer(dataclasses.replace(first, round=t, theta=first.theta + t))) == N
    beyond = dataclasses.replace(first, round=T)
    with pytest.raises(RefusedModel, match="beyond the T = 3"):
        restarted.answer(beyond)
    restarted.state.close()
    reread = AnsweredRounds(path)
    assert reread.rounds == [0, 1, 2]
    reread.close()
    restarted.state = AnsweredRounds(path)
    # An analyzer that re-plans for more rounds (or another budget) cannot re-query her.
    more = GDAnalyzer(learner(rounds=T + 2), [key], "t")
    replanned = dataclasses.replace(more.model(), round=T)
    with pytest.raises(RefusedModel, match="plan"):
        restarted.answer(replanned)
    # A fresh user never answers a round >= T, nor more than T rounds of one plan.
    fresh = GDClients(key.public_key, SHUFFLER.box.public_key, X, y)
    with pytest.raises(RefusedModel, match="beyond"):
        fresh.answer(beyond)
    state = AnsweredRounds()
    state.rounds = [5, 6, 7]
    state.plan = None
    with pytest.raises(RefusedModel, match="already answered the T = 3"):
        GDClients(key.public_key, SHUFFLER.box.public_key, X, y, state).answer(first)
    assert restarted.done(beyond) and not fresh.done(first)


def test_a_client_refuses_a_plan_that_promises_less_than_it_composes_to(key: PrivateKey) -> None:
    X, y = records()
    model = GDAnalyzer(learner(), [key], "t").model()
    cal = model.calibration

    def doctored(**changes: object) -> ModelRecord:
        return dataclasses.replace(model, calibration={**cal, **changes})

    expected = composed(cal["epsilon"], cal["delta"], T, cal["slack"])
    with pytest.raises(RefusedModel, match="composes to"):  # a statement that under-states T rounds
        GDClients(key.public_key, SHUFFLER.box.public_key, X, y).answer(doctored(total_epsilon=expected.epsilon * 0.9))
    with pytest.raises(RefusedModel, match="slack"):
        GDClients(key.public_key, SHUFFLER.box.public_key, X, y).answer(doctored(slack=cal["slack"] * 2))
    with pytest.raises(RefusedModel, match="PVEC"):  # a per-round epsilon other than the one of (g, b, p)
        GDClients(key.public_key, SHUFFLER.box.public_key, X, y).answer(doctored(epsilon=cal["epsilon"] * 2))
    with pytest.raises(RefusedModel, match="accepts"):
        GDClients(key.public_key, SHUFFLER.box.public_key, X, y, max_epsilon=expected.epsilon * 0.9).answer(model)
    assert len(GDClients(key.public_key, SHUFFLER.box.public_key, X, y, max_epsilon=expected.epsilon * 1.01).answer(model)) == N
    with pytest.raises(RefusedModel, match="speaks"):
        GDClients(key.public_key, SHUFFLER.box.public_key, X, y).answer(dataclasses.replace(model, learner="shuffle-sgd"))


def answered_batches(key: PrivateKey, rounds: int = T) -> list[bytes]:
    """The shuffled batches of ``rounds`` rounds answered against a reference analyzer's models."""
    reference = parts.bound(GDAnalyzer(learner(), [key], "ref"), SHUFFLER)
    X, y = records(seed=4)
    clients = GDClients(key.public_key, SHUFFLER.box.public_key, X, y)
    out = []
    for t in range(rounds):
        units = [u for item in clients.answer(reference.model()) for u in inside(item, reference.shares)]
        value = parts.signed(SHUFFLER, t, units)
        assert reference.handle(value)
        out.append(value)
    return out


def gated(directory: Path, key: PrivateKey, name: str, limit: float | None = None,
          instance: str | None = None) -> tuple[GDAnalyzer, BudgetSession]:
    analyzer = parts.bound(GDAnalyzer(learner(), [key], name, instance or new_instance(name, "shuffle-gd")), SHUFFLER)
    assert analyzer.instance is not None
    budget = BudgetSession(BudgetStore(directory), directory / name, limit, run=analyzer.instance,
                           unit=analyzer.charge_unit(KEY))
    budget.begin_role(f"esa messages (deployment {name})", analyzer.report(), step=analyzer.round)
    analyzer.gate = budget.charge_step
    return analyzer, budget


def test_every_round_charges_every_user_and_the_ledger_telescopes(key: PrivateKey, tmp_path: Path) -> None:
    """Round t charges positions [0, n) (all the users) to <instance>/round-00000t with its
    increment; after T rounds each user has T uses whose composition is the deployment's
    statement; a round charged by a process that died before its checkpoint is not charged again;
    a second deployment over the same messages topic composes with the first and is stopped by
    max_epsilon before a round that would exceed it."""
    values = answered_batches(key)
    analyzer, budget = gated(tmp_path, key, "gd")
    assert analyzer.handle(values[0])
    # SIGKILL after charging round 1 but before the checkpoint: the restart finds the charge.
    assert analyzer.gate is not None and analyzer.gate(1, analyzer.round_report(1)) is None
    budget.close()  # the killed process's store: its attempt is no longer live
    restarted, budget = gated(tmp_path, key, "gd", instance=analyzer.instance)
    restarted = parts.bound(GDAnalyzer.restore({**analyzer.checkpoint(), "instance": analyzer.instance}, [key]), SHUFFLER)
    restarted.gate = budget.charge_step
    budget.begin_role("again", restarted.report(), step=restarted.round)
    for value in values[1:]:
        assert restarted.handle(value)
    ledger = BudgetStore(tmp_path).ledger([KEY])
    (segment,) = ledger.coverage(KEY)
    assert (segment.start, segment.stop) == (0, N)
    assert segment.uses == tuple(f"{analyzer.instance}/round-{t:06d}" for t in range(1, T + 1))
    output, intrusion = ledger.record_guarantee(segment.uses)
    statement = restarted.report().output
    assert statement.epsilon <= output.epsilon <= statement.epsilon * (1 + 1e-8)
    assert statement.delta <= output.delta <= statement.delta * (1 + 1e-8)
    composed_report = budget.composed(restarted.report(), [KEY])
    assert composed_report.output.epsilon == pytest.approx(statement.epsilon, rel=1e-8)
    assert any("used 3 times" in a for a in composed_report.assumptions)
    # A second analyzer on the same messages topic: max_epsilon allows one more round only.
    limit = max(output.epsilon, intrusion.epsilon) + 1.5 * restarted.round_report(0).output.epsilon
    second, _ = gated(tmp_path, key, "other", limit=limit)
    assert second.handle(values[0]) and second.stopped is None
    assert not second.handle(values[1]) and second.stopped is not None and "exceed" in second.stopped
    assert second.round == 1 and second.learner.records_seen == N


def test_a_round_that_fails_is_charged_and_counts_as_one_of_the_t_rounds(key: PrivateKey, tmp_path: Path) -> None:
    values = answered_batches(key)
    analyzer, _ = gated(tmp_path, key, "gd")
    batch = wire.parse_batch(values[0])
    units = list(batch.units)
    units[0] = units[1]  # a replayed share: the round does not open
    assert analyzer.handle(parts.signed(SHUFFLER, 0, units))
    assert analyzer.rejected["duplicate_message"] == 1 and analyzer.rejected["invalid_units"] == 1
    assert analyzer.skipped == 1 and analyzer.round == 1 and analyzer.learner.records_seen == 0
    assert analyzer.report().output == analyzer.composed_output(1), "the skipped round counts in the statement"
    (segment,) = BudgetStore(tmp_path).ledger([KEY]).coverage(KEY)
    assert segment.uses == (f"{analyzer.instance}/round-000001",)
    np.testing.assert_array_equal(analyzer.model().theta, analyzer.learner.query_point())  # the same theta again


def test_gd_client_imports_nothing_of_the_service() -> None:
    assert parts.streamer_modules_after_import("panpriv.streamer.esa.gd_client") == ["panpriv.streamer", "panpriv.streamer.esa", "panpriv.streamer.esa.client", "panpriv.streamer.esa.families", "panpriv.streamer.esa.gd_client", "panpriv.streamer.esa.keys", "panpriv.streamer.esa.model", "panpriv.streamer.esa.sum_client", "panpriv.streamer.esa.wire"]


def test_the_default_plan_is_finite() -> None:
    gd = learner()
    assert math.isfinite(gd.composed_guarantee(T).epsilon) and gd.composed_guarantee(T).epsilon <= 4.0


def test_serve_answers_each_round_once_until_t(key: PrivateKey, tmp_path: Path) -> None:
    """The client loop (``panpriv encode`` for shuffle-gd): it answers the current round, waits for
    the next, skips a round it already answered (an analyzer that republishes after a restart),
    stops after T rounds, and a changed plan stops it with the refusal."""
    from panpriv.streamer.esa.gd_client import serve

    X, y = records()
    analyzer = GDAnalyzer(learner(), [key], "t")
    base = analyzer.model()
    models = {t: dataclasses.replace(base, round=t, theta=base.theta + t) for t in range(T + 1)}
    sent: list[int] = []
    state = AnsweredRounds(tmp_path / "rounds.json")
    clients = GDClients(key.public_key, SHUFFLER.box.public_key, X, y, state)
    state.record(models[1])  # answered before a crash: round 1 is not answered again
    answered = serve(clients, lambda: models[0], lambda r: models[r], lambda messages: sent.append(len(messages)))
    assert answered == 2 and sent == [N, N] and state.rounds == [0, 1, 2]
    state.close()
    again = AnsweredRounds(tmp_path / "rounds.json")
    assert serve(GDClients(key.public_key, SHUFFLER.box.public_key, X, y, again), lambda: models[T],
                 lambda r: models[r], lambda messages: sent.append(len(messages))) == 0
    again.close()
    other = GDAnalyzer(learner(rounds=T + 1), [key], "t").model()
    with pytest.raises(RefusedModel, match="plan"):
        serve(GDClients(key.public_key, SHUFFLER.box.public_key, X, y, AnsweredRounds(tmp_path / "rounds.json")),
              lambda: dataclasses.replace(other, round=T), lambda r: other, lambda messages: None)


def test_the_shuffled_topic_cannot_be_linked_to_the_messages_topic(key: PrivateKey) -> None:
    """shuffle-gd: a reader of both topics holding the analyzer's key links no released share to its
    user's message in any of the T rounds (:func:`tests.esa.parts.assert_unlinkable`)."""
    X, y = records(seed=5)
    analyzer = parts.bound(GDAnalyzer(learner(), [key], "t"), SHUFFLER)
    clients = GDClients(key.public_key, SHUFFLER.box.public_key, X, y)
    messages, batches = [], []
    for t in range(T):
        sent = clients.answer(analyzer.model())
        shuffler = Shuffler(SHUFFLER.box, N, DIM, last_released=t - 1, shares=analyzer.shares)
        ((_, units),) = [r for offset, item in enumerate(sent) for r in shuffler.offer(offset, item)]
        assert analyzer.handle(parts.signed(SHUFFLER, t, units))
        messages += sent
        batches.append(units)
    owner = {unit: i for i, item in enumerate(messages) for unit in inside(item, analyzer.shares)}
    parts.assert_unlinkable(messages, batches, [key], owner)


def test_forged_replayed_resigned_and_duplicated_batches_are_refused(key: PrivateKey, tmp_path: Path) -> None:
    """shuffle-gd charges every round before opening it: a refused batch reaches neither the gate
    nor the budget store, and the statement does not move."""
    values = answered_batches(key, 2)
    analyzer, _ = gated(tmp_path, key, "gd")
    charged: list[int] = []
    gate = analyzer.gate
    assert gate is not None
    analyzer.gate = lambda round_, report: charged.append(round_) or gate(round_, report)
    assert analyzer.handle(values[0]) and charged == [0]
    uses = BudgetStore(tmp_path).ledger([KEY]).coverage(KEY)[0].uses
    parts.assert_refuses_bad_batches(analyzer, SHUFFLER, values[0], list(wire.parse_batch(values[1]).units), charged)
    assert BudgetStore(tmp_path).ledger([KEY]).coverage(KEY)[0].uses == uses, "nothing more in the budget store"
    assert analyzer.handle(values[1]) and charged == [0, 1]
