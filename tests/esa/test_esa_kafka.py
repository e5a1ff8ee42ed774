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
from panpriv.streamer.esa.keys import load_private, load_public, load_shuffler
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
    keys = parts.key_pairs(tmp_path)
    X, y = parts.synthetic(B * ROUNDS, DIM, seed=1)
    Xt, yt = parts.synthetic(5000, DIM, seed=99)
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, keys, DIM, B, ROUNDS, DIM, epsilon=EPSILON, delta=DELTA)
    clients = parts.half_round_clients(tmp_path, kafka_broker, names, keys, X, y, B)
    started = time.monotonic()
    try:
        assert analyzer.process.wait(timeout=300) == 0, (tmp_path / "analyzer.log").read_text()[-3000:]
        elapsed = time.monotonic() - started
        for client in clients:
            assert client.process.wait(timeout=60) == 0, client.log_path.read_text()[-3000:]
        messages = parts.read_records(kafka_broker.bootstrap, names["messages"], B * ROUNDS, 60)
        batches = parts.read_records(kafka_broker.bootstrap, names["shuffled"], ROUNDS, 60)
    finally:
        for process in (*clients, shuffler, analyzer):
            process.stop()
    parts.assert_unlinkable_on_the_broker(messages, batches, keys, wire.vector_unit_size(DIM), 1)
    state = parts.analyzer_state(tmp_path / "analyzer" / "analyzer.json")
    assert state["round"] == ROUNDS and state["rejected"] == {} and state["min_valid"] == B
    assert "trusted shuffler, separate process" in json.dumps(state["privacy"])
    theta = np.asarray(state["released"])
    esa_accuracy = float(np.mean(np.where(LogisticLoss().features(Xt, 1.0) @ theta >= 0, 1.0, -1.0) == yt))
    accuracies = []
    for _ in range(30):
        learner = ShuffleGaussianSGD(dim=DIM, loss={"name": "logistic", "intercept": False}, epsilon=EPSILON, delta=DELTA, batch_size=B,
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
    keys = parts.key_pairs(tmp_path)
    public = load_public(keys[1].public)
    b, rounds, params = 8, 150, 4
    parts.send(kafka_broker.bootstrap, names["messages"],
               [parts.fake_message(t, t * b + i, params, public) for t in range(rounds) for i in range(b)])
    shuffler = parts.panpriv(["shuffle", "--bootstrap", kafka_broker.bootstrap, "--messages-topic", names["messages"],
                              "--shuffled-topic", names["shuffled"], "--batch-size", str(b), "--params", str(params),
                              "--shuffler-key", str(keys[1].private)], tmp_path / "shuffler.log")
    try:
        batches = parts.read_batches(kafka_broker.bootstrap, names["shuffled"], rounds, 120, shuffler.check_alive)
    finally:
        shuffler.stop()
    table = np.zeros((b, b))
    for t, batch in enumerate(batches):
        assert batch.round == t and len(batch.units) == b
        for out_position, unit in enumerate(batch.units):
            table[parts.unit_ident(unit) - t * b, out_position] += 1
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
    keys = parts.key_pairs(tmp_path)
    public = load_public(keys[1].public)
    b, rounds, params = 16, 60, 6

    def round_messages(t: int) -> list[bytes]:
        values = [parts.fake_message(t, t * b + i, params, public) for i in range(b)]
        if t:
            values.insert(b // 2, parts.fake_message(t - 1, 10**9 + t, params, public))  # a straggler: late
        return values

    sent, batches = parts.kill_the_shuffler_twice(
        kafka_broker, names, tmp_path, ["--batch-size", str(b), "--params", str(params), "--shuffler-key",
                                        str(keys[1].private)], round_messages, rounds)
    distinct = {batch.digest: batch for batch in batches}
    assert len({(batch.digest, batch.signature) for batch in batches}) == len(distinct), "a re-release is signed alike"
    assert sorted(batch.round for batch in distinct.values()) == list(range(rounds))
    released = Counter(u for batch in distinct.values() for u in batch.units)
    on_time = Counter(parts.fake_unit(t * b + i, wire.vector_unit_size(params)) for t in range(rounds) for i in range(b))
    assert len(sent) == rounds * b + rounds - 1 and released == on_time, \
        "each on-time message's unit in exactly one batch, no straggler's in any"
    print(f"{len(batches)} batch records, {len(distinct)} distinct ({len(batches) - len(distinct)} re-released with "
          "their digest and signature)")



@pytest.mark.parametrize("kind", [pytest.param("shuffle-gaussian", marks=pytest.mark.soak), "shuffle-acsa"])
def test_sigkill_of_the_analyzer_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path, kind: str
) -> None:
    """The analyzer (``shuffle-acsa`` over secure summation; ``shuffle-gaussian`` in ``make soak``) is killed
    with SIGKILL mid-run and restarted on its --out: the run completes, and its model is the one an
    analyzer that never crashed computes from the same shuffled batches (each applied exactly once)."""
    from panpriv.protocols.catalogue import load_learner
    from panpriv.protocols.shuffle_acsa import ShuffleACSA
    from panpriv.streamer.esa.analyzer import Analyzer
    from panpriv.streamer.esa.sum_analyzer import SumAnalyzer

    names = parts.topics(kafka_broker, unique_name)
    key_files = parts.key_pairs(tmp_path)
    keys = [load_private(key_files[0].private)]
    dim, b, rounds = 5, 32, 16
    X, y = parts.synthetic(b * rounds, dim, seed=3)
    source = parts.write_jsonl(tmp_path / "records.jsonl", X, y)
    learner: list[str] = []
    params, shares = dim, None
    if kind == "shuffle-acsa":
        learner = ["--learner", kind, "--horizon", str(b * rounds)]
        plan = SumAnalyzer(ShuffleACSA(dim=dim, loss={"name": "logistic", "intercept": False}, epsilon=EPSILON, delta=DELTA, horizon=b * rounds,
                                       batch_size=b, radius=math.sqrt(dim)), keys, "plan")
        params, shares = plan.dim, plan.shares
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, key_files, dim, b, rounds, params, learner, shares,
                                     epsilon=EPSILON, delta=DELTA)
    client = parts.panpriv(parts.encode_args(kafka_broker, names, key_files, source), tmp_path / "client.log")
    checkpoint = tmp_path / "analyzer" / "analyzer.json"
    try:
        wait_until(lambda: checkpoint.exists() and parts.analyzer_state(checkpoint)["round"] >= 5, 120, "round 5")
        analyzer.process.send_signal(signal.SIGKILL)
        analyzer.process.wait(timeout=10)
        analyzer.stop()
        killed_at = parts.analyzer_state(checkpoint)["round"]
        analyzer = parts.start_analyzer(tmp_path, kafka_broker, names, key_files, dim, b, rounds, "analyzer1.log",
                                        learner, epsilon=EPSILON, delta=DELTA)
        assert analyzer.process.wait(timeout=120) == 0, analyzer.log_path.read_text()[-3000:]
        assert client.process.wait(timeout=60) == 0, client.log_path.read_text()[-3000:]
        records = parts.read_values(kafka_broker.bootstrap, names["shuffled"], rounds, 30)
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
    parts.bound(replay, load_shuffler(key_files[1].private), state["deployment_id"])
    assert all(replay.handle(record) for record in records)
    assert replay.round == rounds and replay.rejected == {}
    np.testing.assert_array_equal(np.asarray(state["released"]), replay.learner.release())
    print(f"{kind}: killed at round {killed_at}; resumed and finished {rounds} rounds, model identical to a "
          "crash-free replay")


def test_state_of_the_format_before_onion_sealing_is_refused_naming_the_migration(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """An analyzer checkpoint and a shuffled topic written by the version before onion sealing and
    signed batches are refused with one line naming the migration (exit code 2, no traceback)."""
    import subprocess
    import sys

    names = parts.topics(kafka_broker, unique_name)
    keys = parts.key_pairs(tmp_path)
    out = tmp_path / "analyzer"
    out.mkdir()
    (out / "analyzer.json").write_text(json.dumps({"format": "panpriv-esa-analyzer/1", "round": 3, "offset": 3}))
    analyze = subprocess.run(
        [sys.executable, "-m", "panpriv", "analyze", "--bootstrap", kafka_broker.bootstrap, "--shuffled-topic",
         names["shuffled"], "--model-topic", names["model"], "--messages-topic", names["messages"], "--analyzer-key",
         str(keys[0].private), "--shuffler-verify-key", str(keys[1].verify), "--out", str(out), "--dim", "5"],
        capture_output=True, text=True, timeout=120, env=parts.env())
    assert analyze.returncode == 2 and "Traceback" not in analyze.stderr, analyze.stderr
    assert "panpriv-esa-analyzer/1" in analyze.stderr and "--role shuffler" in analyze.stderr
    parts.send(kafka_broker.bootstrap, names["shuffled"], [b"PPB1" + (4).to_bytes(8, "big") + bytes(48)])
    shuffle = subprocess.run(
        [sys.executable, "-m", "panpriv", "shuffle", "--bootstrap", kafka_broker.bootstrap, "--messages-topic",
         names["messages"], "--shuffled-topic", names["shuffled"], "--batch-size", "4", "--params", "5",
         "--shuffler-key", str(keys[1].private), "--max-rounds", "1"],
        capture_output=True, text=True, timeout=120, env=parts.env())
    assert shuffle.returncode == 2 and "Traceback" not in shuffle.stderr, shuffle.stderr
    assert "PPB1" in shuffle.stderr and "new deployment" in shuffle.stderr


def test_a_client_refuses_a_deployment_whose_models_are_all_of_the_format_before(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """A model record of the format before onion sealing is skipped on the topic like any record
    that does not parse; a client that finds only such records for its deployment refuses, naming
    the upgrade (exit code 2), instead of waiting for a model; once the upgraded analyzer publishes,
    its record is the one used."""
    import subprocess
    import sys

    from nacl.public import PrivateKey

    from panpriv.streamer.esa.analyzer import Analyzer
    from panpriv.streamer.esa.model import ModelWatcher

    names = parts.topics(kafka_broker, unique_name)
    keys = parts.key_pairs(tmp_path)
    learner = ShuffleGaussianSGD(dim=3, loss="logistic", epsilon=4.0, delta=1e-5, batch_size=8, radius=2.0)
    current = Analyzer(learner, [load_private(keys[0].private)], "default").model().to_json()
    old = current.replace(b"panpriv-esa-model/2", b"panpriv-esa-model/1")
    other = Analyzer(learner, [PrivateKey.generate()], "other").model().to_json().replace(
        b"panpriv-esa-model/2", b"panpriv-esa-model/1")
    parts.send(kafka_broker.bootstrap, names["model"], [other])
    watcher = ModelWatcher(kafka_broker.bootstrap, names["model"], "default")
    try:
        with pytest.raises(TimeoutError):  # another deployment's old record is not this deployment's refusal
            watcher.wait_for(0, 3)
    finally:
        watcher.close()
    parts.send(kafka_broker.bootstrap, names["model"], [old])
    source = tmp_path / "records.jsonl"
    source.write_text("".join(json.dumps({"x": [0.1, 0.2, 0.3], "y": 1}) + "\n" for _ in range(8)))
    encode = subprocess.run([sys.executable, "-m", "panpriv", *parts.encode_args(kafka_broker, names, keys, source),
                             "--timeout", "10"], capture_output=True, text=True, timeout=120, env=parts.env())
    assert encode.returncode == 2 and "Traceback" not in encode.stderr, encode.stdout + encode.stderr
    assert "refused the model" in encode.stdout and "panpriv-esa-model/1" in encode.stdout and "upgraded" in encode.stdout
    parts.send(kafka_broker.bootstrap, names["model"], [current])
    watcher = ModelWatcher(kafka_broker.bootstrap, names["model"], "default")
    try:
        model = watcher.current()
        assert model is not None and model.to_json() == current and watcher.refused is not None
    finally:
        watcher.close()
