"""Encode–Shuffle–Analyze end to end on the real broker: client processes, one shuffler process and
one analyzer process (Bittau et al. 2017 §3; ``shuffle-gaussian``, Liew & Takahashi 2022 §5.2)."""

from __future__ import annotations

import json
import math
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.keys import generate
from tests.esa import parts
from tests.realparts import KafkaBroker, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM, B, ROUNDS, EPSILON, DELTA = 20, 256, 30, 4.0, 1e-5


def test_clients_shuffler_analyzer_learn_as_the_in_process_learner(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Two client processes (half of every round each), the shuffler and the analyzer learn
    ROUNDS rounds; the analyzer's model scores like the in-process learner on the same stream:
    within 4 standard deviations of 30 in-process runs (normal approximation: a false failure
    about 6e-5 of the time)."""
    names = parts.topics(kafka_broker, unique_name)
    key = generate(tmp_path / "keys")
    X, y = parts.synthetic(B * ROUNDS, DIM, seed=1)
    Xt, yt = parts.synthetic(5000, DIM, seed=99)
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, key.private, DIM, B, ROUNDS, DIM, epsilon=EPSILON, delta=DELTA)
    clients = parts.half_round_clients(tmp_path, kafka_broker, names, key.public, X, y, B)
    started = time.monotonic()
    try:
        assert analyzer.process.wait(timeout=300) == 0, (tmp_path / "analyzer.log").read_text()[-3000:]
        elapsed = time.monotonic() - started
        for client in clients:
            assert client.process.wait(timeout=60) == 0, client.log_path.read_text()[-3000:]
    finally:
        for process in (*clients, shuffler, analyzer):
            process.stop()
    state = parts.analyzer_state(tmp_path / "analyzer" / "analyzer.json")
    assert state["round"] == ROUNDS and state["rejected"] == {} and state["min_valid"] == B
    assert "trusted shuffler, separate process" in json.dumps(state["privacy"])
    theta = np.asarray(state["released"])
    esa_accuracy = float(np.mean(np.where(LogisticLoss().features(Xt, 1.0) @ theta >= 0, 1.0, -1.0) == yt))
    accuracies = []
    for _ in range(30):
        learner = ShuffleGaussianSGD(dim=DIM, loss="logistic", epsilon=EPSILON, delta=DELTA, batch_size=B,
                                     radius=math.sqrt(DIM), feature_bound=1.0)
        learner.learn_many(X, y)
        accuracies.append(float(np.mean(learner.predict_many(Xt) == yt)))
    mean, sd = float(np.mean(accuracies)), float(np.std(accuracies))
    print(f"ESA accuracy {esa_accuracy:.4f}; in-process {mean:.4f} ± {sd:.4f} (30 runs); {ROUNDS} rounds in {elapsed:.1f} s")
    assert abs(esa_accuracy - mean) <= 4 * sd + 1e-3
    assert esa_accuracy > 0.6


def test_shuffler_output_order_is_independent_of_input_order(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """ROUNDS × b messages in a known order through the shuffler process: the table of (input
    position, output position) counts passes Pearson's chi-square test of independence at level
    1e-4 (the false-failure probability), and no position keeps its place more than chance allows."""
    names = parts.topics(kafka_broker, unique_name)
    b, rounds, params = 8, 150, 4
    parts.send(kafka_broker.bootstrap, names["messages"],
               [parts.fake_message(t, t * b + i, params) for t in range(rounds) for i in range(b)])
    shuffler = parts.panpriv(["shuffle", "--bootstrap", kafka_broker.bootstrap, "--messages-topic", names["messages"],
                              "--shuffled-topic", names["shuffled"], "--batch-size", str(b), "--params", str(params)],
                             tmp_path / "shuffler.log")
    try:
        batches = parts.read_batches(kafka_broker.bootstrap, names["shuffled"], rounds, 120, shuffler.check_alive)
    finally:
        shuffler.stop()
    table = np.zeros((b, b))
    for t, batch in enumerate(batches):
        assert batch.round == t and len(batch.messages) == b
        for out_position, message in enumerate(batch.messages):
            ident = int.from_bytes(message[20:28], "big")
            table[ident - t * b, out_position] += 1
    _, p_value, _, _ = stats.chi2_contingency(table)
    print(f"chi-square independence p = {p_value:.3g}; fixed points {np.trace(table):.0f} (expected {rounds:.0f})")
    assert p_value > 1e-4
    assert abs(np.trace(table) - rounds) < 5 * math.sqrt(rounds)


def test_sigkill_of_the_shuffler_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Messages arrive round after round (with late stragglers); the shuffler is killed with
    SIGKILL twice while releasing and restarted. Every round is released, each message is in
    exactly one distinct batch, and a re-released batch (if any) carries its original id."""
    names = parts.topics(kafka_broker, unique_name)
    b, rounds, params = 16, 60, 6

    def round_messages(t: int) -> list[bytes]:
        values = [parts.fake_message(t, t * b + i, params) for i in range(b)]
        if t:
            values.insert(b // 2, parts.fake_message(t - 1, 10**9 + t, params))  # a straggler: late
        return values

    sent, batches = parts.kill_the_shuffler_twice(kafka_broker, names, tmp_path,
                                                  ["--batch-size", str(b), "--params", str(params)], round_messages, rounds)
    distinct = {batch.id: batch for batch in batches}
    assert sorted(batch.round for batch in distinct.values()) == list(range(rounds))
    released = Counter(m for batch in distinct.values() for m in batch.messages)
    on_time = Counter(m for m in sent if int.from_bytes(m[20:28], "big") < 10**9)
    assert released == on_time, "each on-time message in exactly one batch, no straggler in any"
    print(f"{len(batches)} batch records, {len(distinct)} distinct ({len(batches) - len(distinct)} re-released with their id)")



@pytest.mark.parametrize("kind", ["shuffle-gaussian", "shuffle-acsa"])
def test_sigkill_of_the_analyzer_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path, kind: str
) -> None:
    """The analyzer (``shuffle-gaussian``, or ``shuffle-acsa`` over secure summation) is killed
    with SIGKILL mid-run and restarted on its --out: the run completes, and its model is the one an
    analyzer that never crashed computes from the same shuffled batches (each applied exactly once)."""
    from panpriv.protocols.catalogue import load_learner
    from panpriv.protocols.shuffle_acsa import ShuffleACSA
    from panpriv.streamer.esa.analyzer import Analyzer
    from panpriv.streamer.esa.keys import load_private
    from panpriv.streamer.esa.sum_analyzer import SumAnalyzer

    names = parts.topics(kafka_broker, unique_name)
    key = generate(tmp_path / "keys")
    keys = [load_private(key.private)]
    dim, b, rounds = 5, 32, 16
    X, y = parts.synthetic(b * rounds, dim, seed=3)
    source = parts.write_jsonl(tmp_path / "records.jsonl", X, y)
    learner: list[str] = []
    params, shares = dim, None
    if kind == "shuffle-acsa":
        learner = ["--learner", kind, "--horizon", str(b * rounds)]
        plan = SumAnalyzer(ShuffleACSA(dim=dim, loss="logistic", epsilon=EPSILON, delta=DELTA, horizon=b * rounds,
                                       batch_size=b, radius=math.sqrt(dim)), keys, "plan")
        params, shares = plan.dim, plan.shares
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, key.private, dim, b, rounds, params, learner, shares,
                                     epsilon=EPSILON, delta=DELTA)
    client = parts.panpriv(["encode", "--bootstrap", kafka_broker.bootstrap, "--model-topic", names["model"],
                            "--messages-topic", names["messages"], "--analyzer-key", str(key.public),
                            "--source", str(source)], tmp_path / "client.log")
    checkpoint = tmp_path / "analyzer" / "analyzer.json"
    try:
        wait_until(lambda: checkpoint.exists() and parts.analyzer_state(checkpoint)["round"] >= 5, 120, "round 5")
        analyzer.process.send_signal(signal.SIGKILL)
        analyzer.process.wait(timeout=10)
        analyzer.stop()
        killed_at = parts.analyzer_state(checkpoint)["round"]
        analyzer = parts.start_analyzer(tmp_path, kafka_broker, names, key.private, dim, b, rounds, "analyzer1.log",
                                        learner, epsilon=EPSILON, delta=DELTA)
        assert analyzer.process.wait(timeout=120) == 0, analyzer.log_path.read_text()[-3000:]
        assert client.process.wait(timeout=60) == 0, client.log_path.read_text()[-3000:]
        batches = parts.read_batches(kafka_broker.bootstrap, names["shuffled"], rounds, 30)
    finally:
        for process in (client, shuffler, analyzer):
            process.stop()
    state = parts.analyzer_state(checkpoint)
    assert state["round"] == rounds and state["rejected"] == {}
    assert "resumed at round" in (tmp_path / "analyzer1.log").read_text()
    # The budget store: every round charged once, to the one analyzer instance (a round the killed
    # process charged but had not checkpointed is not charged again by the resumed one).
    from panpriv.streamer.budget.store import BudgetStore

    store = BudgetStore(tmp_path / "state")
    (source,) = store.ledger().sources
    assert source.startswith("esa:") and source.endswith("/" + names["messages"])
    assert [(s.start, s.stop, s.uses) for s in store.ledger().coverage(source)] == [(0, rounds, (state["instance"],))]
    fresh = load_learner(kind).from_config(state["config"])
    replay = SumAnalyzer(fresh, keys, "replay") if kind == "shuffle-acsa" else Analyzer(fresh, keys, "replay")
    assert all(replay.handle(wire.encode_batch(batch.round, list(batch.messages))) for batch in batches)
    assert replay.round == rounds and replay.rejected == {}
    np.testing.assert_array_equal(np.asarray(state["released"]), replay.learner.release())
    print(f"{kind}: killed at round {killed_at}; resumed and finished {rounds} rounds, model identical to a "
          "crash-free replay")
