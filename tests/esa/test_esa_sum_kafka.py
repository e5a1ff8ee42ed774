"""Encode–Shuffle–Analyze for ``shuffle-acsa`` and ``shuffle-sgd`` over secure summation, end to end
on the real broker: client processes, one shuffler process and one analyzer process (Bittau et al.
2017 §3; Cheu et al. 2022 Algs 3 and 4; Ishai et al. 2006 split and mix)."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_base import SequentialLearner
from panpriv.protocols.shuffle_sgd import ShuffleSGD
from panpriv.streamer.esa import wire
from panpriv.streamer.esa.keys import load_private, load_public, load_shuffler
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer
from panpriv.streamer.esa.sum_client import SUM_LEARNERS
from tests.esa import parts
from tests.realparts import KafkaBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM, B, ROUNDS, EPSILON, DELTA = 10, 128, 12, 4.0, 1e-5


def planned(kind: str) -> SequentialLearner:
    """The learner ``panpriv analyze --learner KIND`` builds in the test below."""
    if kind == "shuffle-sgd":
        return ShuffleSGD(dim=DIM, loss="logistic", epsilon=EPSILON, delta=DELTA, horizon=B * ROUNDS, batch_size=B,
                          radius=math.sqrt(DIM), feature_bound=1.0)
    return ShuffleACSA(dim=DIM, loss="logistic", epsilon=EPSILON, delta=DELTA, horizon=B * ROUNDS, batch_size=B,
                       radius=math.sqrt(DIM), feature_bound=1.0)


def accuracy(theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.where(LogisticLoss().features(X, 1.0) @ theta >= 0, 1.0, -1.0) == y))


@pytest.mark.parametrize("kind", SUM_LEARNERS)
def test_clients_shuffler_analyzer_learn_as_in_process(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path, kind: str
) -> None:
    """Two client processes (half of every round each), the shuffler and the analyzer learn ROUNDS
    rounds of ``kind``. Every message's m units are in exactly one batch, each batch holds the
    complete units of B messages of its round, and the model scores like the in-process learner on
    the same stream: within 4 standard deviations of 20 in-process runs."""
    names = parts.topics(kafka_broker, unique_name)
    keys = parts.key_pairs(tmp_path)
    plan = SumAnalyzer(planned(kind), [load_private(keys[0].private)], "plan")
    shares = plan.shares
    X, y = parts.synthetic(B * ROUNDS, DIM, seed=1)
    Xt, yt = parts.synthetic(5000, DIM, seed=99)
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, keys, DIM, B, ROUNDS, plan.dim,
                                     ["--learner", kind, "--horizon", str(B * ROUNDS)], shares,
                                     epsilon=EPSILON, delta=DELTA)
    clients = parts.half_round_clients(tmp_path, kafka_broker, names, keys, X, y, B)
    started = time.monotonic()
    try:
        assert analyzer.process.wait(timeout=600) == 0, (tmp_path / "analyzer.log").read_text()[-3000:]
        elapsed = time.monotonic() - started
        for client in clients:
            assert client.process.wait(timeout=60) == 0, client.log_path.read_text()[-3000:]
        batch_records = parts.read_records(kafka_broker.bootstrap, names["shuffled"], ROUNDS, 60)
        message_records = parts.read_records(kafka_broker.bootstrap, names["messages"], B * ROUNDS, 60)
    finally:
        for process in (*clients, shuffler, analyzer):
            process.stop()
    parts.assert_unlinkable_on_the_broker(message_records, batch_records, keys, wire.share_unit_size(DIM), shares)
    batches = [wire.parse_batch(record.value) for record in batch_records]
    messages = [record.value for record in message_records]
    shuffler_keys = load_shuffler(keys[1].private)
    state = parts.analyzer_state(tmp_path / "analyzer" / "analyzer.json")
    assert state["round"] == ROUNDS and state["skipped"] == 0 and state["rejected"] == {}
    assert "secure summation" in json.dumps(state["privacy"])
    assert len(messages) == B * ROUNDS
    owner = {unit: i for i, item in enumerate(messages)
             for unit in parts.units_inside(item, shuffler_keys, wire.share_unit_size(DIM), shares)}
    released = Counter(unit for batch in batches for unit in batch.units)
    assert len(owner) == B * ROUNDS * shares
    assert released == Counter(list(owner)), "every unit in exactly one batch"
    for t, batch in enumerate(batches):
        assert batch.round == t and len(batch.units) == B * shares
        users = Counter(owner[unit] for unit in batch.units)
        assert len(users) == B and set(users.values()) == {shares}, "B complete users per batch"
        assert {wire.message_header(messages[i], len(messages[i]))[0] for i in users} == {t}
    esa = accuracy(np.asarray(state["released"]), Xt, yt)
    runs = []
    for _ in range(20):
        learner = planned(kind)
        learner.learn_many(X, y)
        runs.append(accuracy(learner.release(), Xt, yt))
    mean, sd = float(np.mean(runs)), float(np.std(runs))
    print(f"ESA {kind} accuracy {esa:.4f}; in-process {mean:.4f} ± {sd:.4f} (20 runs); {ROUNDS} rounds of "
          f"{B} users x {shares} shares in {elapsed:.1f} s")
    assert abs(esa - mean) <= 4 * sd + 1e-3
    assert esa > 0.6


def test_sigkill_of_the_shuffler_loses_and_duplicates_no_share(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Share messages arrive round after round (with late stragglers); the shuffler (``--shares``)
    is killed with SIGKILL twice while releasing and restarted. Every round is released, each
    on-time message's units are in exactly one distinct batch — all m of them in the same one —
    and no straggler's unit is in any."""
    names = parts.topics(kafka_broker, unique_name)
    keys = parts.key_pairs(tmp_path)
    public = load_public(keys[1].public)
    b, rounds, dim, shares = 8, 60, 4, 5

    def round_messages(t: int) -> list[bytes]:
        values = [parts.fake_shares_message(t, t * b + i, dim, shares, public) for i in range(b)]
        if t:
            values.insert(b // 2, parts.fake_shares_message(t - 1, 10**9 + t, dim, shares, public))  # a straggler: late
        return values

    sent, batches = parts.kill_the_shuffler_twice(
        kafka_broker, names, tmp_path, ["--batch-size", str(b), "--params", str(dim), "--shares", str(shares),
                                        "--shuffler-key", str(keys[1].private)], round_messages, rounds)
    distinct = {batch.digest: batch for batch in batches}
    assert sorted(batch.round for batch in distinct.values()) == list(range(rounds))
    released = Counter(unit for batch in distinct.values() for unit in batch.units)
    size = wire.share_unit_size(dim)
    on_time = Counter(parts.fake_unit(t * b + i, size, j) for t in range(rounds) for i in range(b) for j in range(shares))
    assert len(sent) == rounds * b + rounds - 1 and released == on_time, \
        "each on-time message's units in exactly one batch, no straggler's in any"
    for batch in distinct.values():
        users = Counter(parts.unit_ident(unit) for unit in batch.units)
        assert len(users) == b and set(users.values()) == {shares}
    print(f"{len(batches)} batch records, {len(distinct)} distinct ({len(batches) - len(distinct)} re-released with "
          "their digest)")
