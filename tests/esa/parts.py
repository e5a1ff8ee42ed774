"""The three ESA roles as real processes on the suite's broker (tests/conftest.py ``kafka_broker``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from panpriv.streamer.esa import wire
from tests.realparts import KafkaBroker, ManagedProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]


def analyzer_state(path: Path) -> dict:
    """The state in an analyzer's sealed ``analyzer.json`` (streamer/state/role_state.py), checked."""
    from panpriv.streamer.state.role_state import RoleState

    state = RoleState(path.parent, path.name, "esa-analyzer").load()
    assert state is not None, f"no analyzer state at {path}"
    return state


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def panpriv(args: list[str], log: Path) -> ManagedProcess:
    """``panpriv ARGS`` as a child process (so its memory can be read: tests/memscan.py)."""
    return ManagedProcess([sys.executable, "-m", "panpriv", *args], log, env())


def start_analyzer(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], keyfile: Path, dim: int, b: int,
                   rounds: int, log: str = "analyzer.log", learner: Sequence[str] = (), epsilon: float = 4.0,
                   delta: float = 1e-5) -> ManagedProcess:
    """``panpriv analyze`` checkpointing to ``tmp_path/analyzer`` (``learner``: more arguments,
    e.g. ``--learner shuffle-acsa --horizon N``); logistic loss, radius √dim, ``rounds`` rounds."""
    return panpriv(["analyze", "--bootstrap", broker.bootstrap, "--shuffled-topic", names["shuffled"],
                    "--model-topic", names["model"], "--messages-topic", names["messages"],
                    "--state-dir", str(tmp_path / "state"), "--analyzer-key", str(keyfile), "--out",
                    str(tmp_path / "analyzer"), "--dim", str(dim), "--batch-size", str(b), "--epsilon",
                    str(epsilon), "--delta", str(delta), "--max-rounds", str(rounds), *learner,
                    "--options", json.dumps({"loss": "logistic", "radius": math.sqrt(dim)})], tmp_path / log)


def roles(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], keyfile: Path, dim: int, b: int,
          rounds: int, params: int, learner: Sequence[str] = (), shares: int | None = None,
          epsilon: float = 4.0, delta: float = 1e-5) -> tuple[ManagedProcess, ManagedProcess]:
    """The shuffler (``--shares`` when given: a secure-sum learner) and :func:`start_analyzer`."""
    shuffler = panpriv(["shuffle", "--bootstrap", broker.bootstrap, "--messages-topic", names["messages"],
                        "--shuffled-topic", names["shuffled"], "--batch-size", str(b), "--params", str(params),
                        *(["--shares", str(shares)] if shares else []), "--group", f"shuffler-{names['messages']}"],
                       tmp_path / "shuffler.log")
    return shuffler, start_analyzer(tmp_path, broker, names, keyfile, dim, b, rounds, learner=learner,
                                    epsilon=epsilon, delta=delta)


def topics(broker: KafkaBroker, name: Callable[[str], str]) -> dict[str, str]:
    """Fresh messages, shuffled (one partition each) and model topics; the model topic compacted
    when the broker accepts the setting."""
    return {"messages": broker.create_topic(name("esa-messages")), "shuffled": broker.create_topic(name("esa-shuffled")),
            "model": broker.create_topic(name("esa-model"), compacted=True)}


def read_values(bootstrap: str, topic: str, count: int, timeout_s: float, alive: Callable[[], None] | None = None) -> list[bytes]:
    """The values of the first ``count`` records of ``topic`` (fails after ``timeout_s``)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             max_partition_fetch_bytes=64 * 1024 * 1024)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(values)} of {count} records on {topic} after {timeout_s:g} s")
            if alive is not None:
                alive()
            for records in consumer.poll(timeout_ms=200).values():
                values += [r.value for r in records]
    finally:
        consumer.close()
    return values[:count]


def read_batches(bootstrap: str, topic: str, count: int, timeout_s: float, alive: Callable[[], None] | None = None) -> list[wire.Batch]:
    """The first ``count`` records of ``topic`` as batches (fails after ``timeout_s``)."""
    return [wire.parse_batch(value) for value in read_values(bootstrap, topic, count, timeout_s, alive)]


def count_records(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def fake_message(round_: int, ident: int, params: int) -> bytes:
    """A well-framed message whose sealed part is an identifiable filler (the shuffler never opens it)."""
    body = ident.to_bytes(8, "big") * ((wire.message_size(params) - 20) // 8)
    return wire.message(round_, b"\0" * 8, body[: wire.message_size(params) - 20])


def fake_shares_message(round_: int, ident: int, dim: int, shares: int) -> bytes:
    """A well-framed share message whose m sealed parts are identifiable fillers (ident, share index)."""
    size = wire.sealed_share_size(dim)
    parts = [(ident.to_bytes(8, "big") + j.to_bytes(8, "big")) * (size // 16 + 1) for j in range(shares)]
    return wire.shares_message(round_, b"\0" * 8, [part[:size] for part in parts])


def send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for value in values:
            producer.send(topic, value)
        producer.flush()
    finally:
        producer.close()


def streamer_modules_after_import(module: str) -> list[str]:
    """The ``streamer`` modules a fresh interpreter holds after importing ``module`` alone (a
    client must not pull in the service)."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('panpriv.streamer'))))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    return list(json.loads(out))


def separable(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x ~ N(0, I/d), y the sign of ⟨x, (1, …, d)⟩: the role tests' records (no label noise)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim)
    return X, np.where(X @ np.arange(1, dim + 1) > 0, 1.0, -1.0)


def synthetic(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A noisy linear rule: x ~ N(0, 2.25 I/d) (norms about 1.5, clipped to 1), 5 % of labels flipped."""
    w = np.random.default_rng(0).normal(size=dim)
    w /= np.linalg.norm(w)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim)) / np.sqrt(dim) * 1.5
    y = np.where(X @ w > 0, 1.0, -1.0)
    y[rng.random(n) < 0.05] *= -1
    return X, y


def write_jsonl(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    with path.open("w") as handle:
        for row, label in zip(X.tolist(), y.tolist(), strict=True):
            handle.write(json.dumps({"x": row, "y": label}) + "\n")
    return path


def kill_the_shuffler_twice(broker: KafkaBroker, names: dict[str, str], tmp_path: Path, shuffle_args: list[str],
                            round_messages: Callable[[int], list[bytes]], rounds: int) -> tuple[list[bytes], list[wire.Batch]]:
    """Send ``round_messages(t)`` for t < ``rounds``, 50 ms apart, while a shuffler (``shuffle_args``
    after the topics) releases; SIGKILL it after 15 and after 35 batches and restart it each time.
    Checks both restarts resumed from a committed offset; returns what was sent and every batch
    record of the shuffled topic (re-released batches included)."""
    import signal
    import threading

    sent: list[bytes] = []

    def produce() -> None:
        for t in range(rounds):
            values = round_messages(t)
            send(broker.bootstrap, names["messages"], values)
            sent.extend(values)
            time.sleep(0.05)

    argv = ["shuffle", "--bootstrap", broker.bootstrap, "--messages-topic", names["messages"],
            "--shuffled-topic", names["shuffled"], *shuffle_args]
    producer = threading.Thread(target=produce)
    producer.start()
    shuffler = panpriv(argv, tmp_path / "shuffler0.log")
    try:
        def released_at_least(count: int) -> Callable[[], bool]:
            return lambda: count_records(broker.bootstrap, names["shuffled"]) >= count

        for kill, at in enumerate((15, 35)):
            wait_until(released_at_least(at), 120, f"{at} batches")
            shuffler.process.send_signal(signal.SIGKILL)
            shuffler.process.wait(timeout=10)
            shuffler.stop()
            shuffler = panpriv(argv, tmp_path / f"shuffler{kill + 1}.log")
            log = tmp_path / f"shuffler{kill + 1}.log"  # started: on a loaded machine the rounds may all be out first
            wait_until(lambda: "reading" in (log.read_text() if log.exists() else ""), 120, f"restart {kill + 1} started")
        producer.join(timeout=120)
        wait_until(lambda: count_records(broker.bootstrap, names["shuffled"]) >= rounds, 120, "every round")
        time.sleep(1.0)
        batches = read_batches(broker.bootstrap, names["shuffled"], count_records(broker.bootstrap, names["shuffled"]), 60)
    finally:
        shuffler.stop()
        producer.join(timeout=5)
    restarts = [(tmp_path / f"shuffler{k}.log").read_text() for k in (1, 2)]
    assert all("from the committed offset" in log for log in restarts), "the restarts resume from committed offsets"
    return sent, batches


def half_round_clients(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], public_key: Path, X: np.ndarray,
                       y: np.ndarray, b: int) -> list[ManagedProcess]:
    """Two ``panpriv encode`` processes, each sending half of every round of ``b`` users (the
    records are dealt by position within the round), started now."""
    first = (np.arange(len(y)) % b) < b // 2
    files = [write_jsonl(tmp_path / "a.jsonl", X[first], y[first]), write_jsonl(tmp_path / "b.jsonl", X[~first], y[~first])]
    return [panpriv(["encode", "--bootstrap", broker.bootstrap, "--model-topic", names["model"], "--messages-topic",
                     names["messages"], "--analyzer-key", str(public_key), "--source", str(path), "--per-round",
                     str(b // 2)], tmp_path / f"client{i}.log")
            for i, path in enumerate(files)]
