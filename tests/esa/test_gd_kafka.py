"""Encode–Shuffle–Analyze for ``shuffle-gd`` (Cheu et al. 2022 Alg. 5) end to end on the real broker:
two client processes (half of the n users each, every user answering every round), one shuffler
process (``--shares m``, threshold n) and one analyzer process (``--learner shuffle-gd``)."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.shuffle_gd import ShuffleGD
from panpriv.streamer.budget.store import BudgetStore
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.gd_analyzer import GDAnalyzer
from panpriv.streamer.esa.gd_client import AnsweredRounds
from panpriv.streamer.esa.keys import load_private, load_shuffler
from tests.esa import parts
from tests.realparts import KafkaBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM, N, T, EPSILON, DELTA = 5, 128, 3, 4.0, 1e-5


def planned() -> ShuffleGD:
    """The learner ``panpriv analyze --learner shuffle-gd`` builds in the test below."""
    return ShuffleGD(dim=DIM, loss={"name": "logistic", "intercept": False}, epsilon=EPSILON, delta=DELTA, n=N, rounds=T, radius=math.sqrt(DIM),
                     feature_bound=1.0)


def accuracy(theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.where(LogisticLoss().features(X, 1.0) @ theta >= 0, 1.0, -1.0) == y))


def test_clients_answer_every_round_and_the_budget_charges_every_user_t_times(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """T rounds of n users: every round's batch holds the complete units of exactly n messages of
    that round (each client's users once each: n messages per round on the messages topic, and
    each client's state says it answered rounds 0 … T − 1); the model scores like the in-process
    learner (within 4 standard deviations of 20 runs); the budget store shows every user [0, n)
    charged once per round, T uses composing to the analyzer's statement; a client restarted
    after the T rounds refuses to answer again."""
    names = parts.topics(kafka_broker, unique_name)
    keys = parts.key_pairs(tmp_path)
    plan = GDAnalyzer(planned(), [load_private(keys[0].private)], "plan")
    shares = plan.shares
    X, y = parts.synthetic(N, DIM, seed=1)
    Xt, yt = parts.synthetic(5000, DIM, seed=99)
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, keys, DIM, N, T + 5, plan.dim,
                                     ["--learner", "shuffle-gd", "--rounds", str(T)], shares,
                                     epsilon=EPSILON, delta=DELTA)
    half = np.arange(N) < N // 2
    sources = [parts.write_jsonl(tmp_path / f"users{i}.jsonl", X[rows], y[rows]) for i, rows in enumerate((half, ~half))]

    def client(i: int, log: str) -> parts.ManagedProcess:
        return parts.panpriv([*parts.encode_args(kafka_broker, names, keys, sources[i]), "--state",
                              str(tmp_path / f"client{i}.rounds.json")], tmp_path / log)

    clients = [client(i, f"client{i}.log") for i in range(2)]
    started = time.monotonic()
    try:
        assert analyzer.process.wait(timeout=600) == 0, (tmp_path / "analyzer.log").read_text()[-3000:]
        elapsed = time.monotonic() - started
        for process in clients:
            assert process.process.wait(timeout=120) == 0, process.log_path.read_text()[-3000:]
        again = client(0, "client0-again.log")  # the T rounds are spent: answers nothing more
        assert again.process.wait(timeout=120) == 0, again.log_path.read_text()[-3000:]
        batch_records = parts.read_records(kafka_broker.bootstrap, names["shuffled"], T, 60)
        assert parts.count_records(kafka_broker.bootstrap, names["shuffled"]) == T
        message_records = parts.read_records(kafka_broker.bootstrap, names["messages"], N * T, 60)
    finally:
        for process in (*clients, shuffler, analyzer):
            process.stop()
    parts.assert_unlinkable_on_the_broker(message_records, batch_records, keys, wire.share_unit_size(DIM), shares)
    batches = [wire.parse_batch(record.value) for record in batch_records]
    messages = [record.value for record in message_records]
    assert "answered 0 rounds here" in again.log_path.read_text()
    for i in range(2):
        state = AnsweredRounds(tmp_path / f"client{i}.rounds.json")  # sealed: read through its reader
        assert state.rounds == list(range(T)) and state.plan is not None and state.plan["learner"] == "shuffle-gd"
    checkpoint = parts.analyzer_state(tmp_path / "analyzer" / "analyzer.json")
    assert checkpoint["round"] == T and checkpoint["skipped"] == 0 and checkpoint["rejected"] == {}
    assert checkpoint["learner"] == "shuffle-gd" and checkpoint["format"] == "panpriv-esa-gd-analyzer/2"
    # Each round: the complete units of N messages of that round, every unit in exactly one batch.
    shuffler_keys = load_shuffler(keys[1].private)
    owner = {unit: i for i, item in enumerate(messages)
             for unit in parts.units_inside(item, shuffler_keys, wire.share_unit_size(DIM), shares)}
    assert len(owner) == N * T * shares
    assert Counter(u for b in batches for u in b.units) == Counter(list(owner)), "every unit in exactly one batch"
    for t, batch in enumerate(batches):
        users = Counter(owner[unit] for unit in batch.units)
        assert batch.round == t and len(users) == N and set(users.values()) == {shares}
        assert {wire.message_header(messages[i], len(messages[i]))[0] for i in users} == {t}
    # The budget store: every user charged once per round; the T uses compose to the statement.
    ledger = BudgetStore(tmp_path / "state").ledger()
    (source,) = ledger.sources
    assert source.startswith("esa:") and source.endswith("/" + names["messages"])
    (segment,) = ledger.coverage(source)
    assert (segment.start, segment.stop) == (0, N)
    instance = checkpoint["instance"]
    assert segment.uses == tuple(f"{instance}/round-{t:06d}" for t in range(1, T + 1))
    output, _ = ledger.record_guarantee(segment.uses)
    statement = checkpoint["privacy"]["output"]
    composed = planned().composed_guarantee(T)
    assert composed.epsilon <= statement["epsilon"] <= output.epsilon <= composed.epsilon * (1 + 1e-8)
    assert composed.delta <= statement["delta"] <= output.delta <= composed.delta * (1 + 1e-8)
    # Utility: within noise of the in-process learner on the same users.
    esa = accuracy(np.asarray(checkpoint["released"]), Xt, yt)
    runs = []
    for _ in range(20):
        learner = planned()
        for _ in range(T):
            learner.learn_many(X, y)
        runs.append(accuracy(learner.release(), Xt, yt))
    mean, sd = float(np.mean(runs)), float(np.std(runs))
    per_user = [float(m.group(1)) for i in range(2)
                for m in [re.search(r"encode ([0-9.]+) ms per user and round", (tmp_path / f"client{i}.log").read_text())]
                if m is not None]
    print(f"ESA shuffle-gd accuracy {esa:.4f}; in-process {mean:.4f} ± {sd:.4f} (20 runs); {T} rounds of {N} users x "
          f"{shares} shares in {elapsed:.1f} s; client encode {per_user} ms per user and round; statement "
          f"(eps {statement['epsilon']:.4g}, delta {statement['delta']:.3g})")
    assert abs(esa - mean) <= 4 * sd + 1e-3


def test_sigkill_of_the_analyzer_charges_each_round_once(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The shuffle-gd analyzer is killed with SIGKILL mid-run and restarted on its --out: the clients
    (who never answer a round twice) and the run complete, the model is the one an analyzer that
    never crashed computes from the same batches, and every round charged every user exactly once."""
    import signal

    from tests.realparts import wait_until

    names = parts.topics(kafka_broker, unique_name)
    key_files = parts.key_pairs(tmp_path)
    keys = [load_private(key_files[0].private)]
    n, rounds = 32, 8

    def gd() -> ShuffleGD:
        return ShuffleGD(dim=DIM, loss={"name": "logistic", "intercept": False}, epsilon=EPSILON, delta=DELTA, n=n, rounds=rounds,
                         radius=math.sqrt(DIM), feature_bound=1.0)

    plan = GDAnalyzer(gd(), keys, "plan")
    X, y = parts.synthetic(n, DIM, seed=3)
    source = parts.write_jsonl(tmp_path / "users.jsonl", X, y)
    learner = ["--learner", "shuffle-gd", "--rounds", str(rounds)]
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, key_files, DIM, n, rounds + 5, plan.dim, learner,
                                     plan.shares, epsilon=EPSILON, delta=DELTA)
    client = parts.panpriv([*parts.encode_args(kafka_broker, names, key_files, source), "--state",
                            str(tmp_path / "users.rounds.json")], tmp_path / "client.log")
    checkpoint = tmp_path / "analyzer" / "analyzer.json"
    try:
        wait_until(lambda: checkpoint.exists() and parts.analyzer_state(checkpoint)["round"] >= 3, 120, "round 3")
        analyzer.process.send_signal(signal.SIGKILL)
        analyzer.process.wait(timeout=10)
        analyzer.stop()
        killed_at = parts.analyzer_state(checkpoint)["round"]
        analyzer = parts.start_analyzer(tmp_path, kafka_broker, names, key_files, DIM, n, rounds + 5,
                                        "analyzer1.log", learner, epsilon=EPSILON, delta=DELTA)
        assert analyzer.process.wait(timeout=180) == 0, analyzer.log_path.read_text()[-3000:]
        assert client.process.wait(timeout=120) == 0, client.log_path.read_text()[-3000:]
        records = parts.read_values(kafka_broker.bootstrap, names["shuffled"], rounds, 30)
    finally:
        for process in (client, shuffler, analyzer):
            process.stop()
    state = parts.analyzer_state(checkpoint)
    assert state["round"] == rounds and state["rejected"] == {} and state["skipped"] == 0
    assert "resumed at round" in (tmp_path / "analyzer1.log").read_text()
    assert AnsweredRounds(tmp_path / "users.rounds.json").rounds == list(range(rounds))
    (source_key,) = BudgetStore(tmp_path / "state").ledger().sources
    coverage = BudgetStore(tmp_path / "state").ledger().coverage(source_key)
    assert [(s.start, s.stop, s.uses) for s in coverage] == [
        (0, n, tuple(f"{state['instance']}/round-{t:06d}" for t in range(1, rounds + 1)))]
    replay = parts.bound(GDAnalyzer(gd(), keys, "replay"), load_shuffler(key_files[1].private), state["deployment_id"])
    assert all(replay.handle(record) for record in records)
    assert replay.round == rounds and replay.rejected == {}
    np.testing.assert_array_equal(np.asarray(state["released"]), replay.learner.release())
    print(f"shuffle-gd: killed at round {killed_at}; resumed and finished {rounds} rounds, model identical to a "
          "crash-free replay, each round charged once")
