"""The three ESA roles as real processes on the suite's broker (tests/conftest.py ``kafka_broker``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from nacl.public import PrivateKey, PublicKey, SealedBox

from panpriv.streamer.esa import wire
from panpriv.streamer.esa.batches import BatchSigner, BatchVerifier
from panpriv.streamer.esa.keys import KeyFiles, ShufflerKeys, generate, key_id, load_private, load_shuffler
from tests.realparts import KafkaBroker, ManagedProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]

DEPLOYMENT_ID = "esa:cluster=test/messages"
"""The deployment id of the in-process tests (a data key: ``esa:<cluster>/<messages topic>``)."""


def shuffler_keys() -> ShufflerKeys:
    """A fresh shuffler key (box and signing key)."""
    return ShufflerKeys.from_private(PrivateKey.generate())


def signed(keys: ShufflerKeys, round_: int, units: list[bytes], deployment: str = DEPLOYMENT_ID) -> bytes:
    """The batch record the shuffler holding ``keys`` releases for ``units`` as ``round_``."""
    return BatchSigner(keys, deployment).record(round_, units)


def bound(analyzer: Any, keys: ShufflerKeys, deployment: str = DEPLOYMENT_ID) -> Any:
    """``analyzer`` accepting the batches ``keys`` signs for ``deployment`` (what the service binds)."""
    analyzer.bind(BatchVerifier([keys.verify_key], deployment))
    return analyzer


def key_pairs(tmp_path: Path) -> tuple[KeyFiles, KeyFiles]:
    """An analyzer and a shuffler key pair in ``tmp_path/keys``."""
    return generate(tmp_path / "keys"), generate(tmp_path / "keys", "shuffler")


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


def start_analyzer(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], keys: tuple[KeyFiles, KeyFiles], dim: int,
                   b: int, rounds: int, log: str = "analyzer.log", learner: Sequence[str] = (), epsilon: float = 4.0,
                   delta: float = 1e-5) -> ManagedProcess:
    """``panpriv analyze`` checkpointing to ``tmp_path/analyzer`` (``learner``: more arguments,
    e.g. ``--learner shuffle-acsa --horizon N``); logistic loss, radius √dim, ``rounds`` rounds;
    ``keys``: the analyzer's and the shuffler's key files (:func:`key_pairs`)."""
    analyzer, shuffler = keys
    return panpriv(["analyze", "--bootstrap", broker.bootstrap, "--shuffled-topic", names["shuffled"],
                    "--model-topic", names["model"], "--messages-topic", names["messages"],
                    "--shuffler-verify-key", str(shuffler.verify),
                    "--state-dir", str(tmp_path / "state"), "--analyzer-key", str(analyzer.private), "--out",
                    str(tmp_path / "analyzer"), "--dim", str(dim), "--batch-size", str(b), "--epsilon",
                    str(epsilon), "--delta", str(delta), "--max-rounds", str(rounds), *learner,
                    "--options", json.dumps({"loss": "logistic", "radius": math.sqrt(dim)})], tmp_path / log)


def roles(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], keys: tuple[KeyFiles, KeyFiles], dim: int,
          b: int, rounds: int, params: int, learner: Sequence[str] = (), shares: int | None = None,
          epsilon: float = 4.0, delta: float = 1e-5) -> tuple[ManagedProcess, ManagedProcess]:
    """The shuffler (``--shares`` when given: a secure-sum learner) and :func:`start_analyzer`."""
    shuffler = panpriv(["shuffle", "--bootstrap", broker.bootstrap, "--messages-topic", names["messages"],
                        "--shuffled-topic", names["shuffled"], "--batch-size", str(b), "--params", str(params),
                        "--shuffler-key", str(keys[1].private),
                        *(["--shares", str(shares)] if shares else []), "--group", f"shuffler-{names['messages']}"],
                       tmp_path / "shuffler.log")
    return shuffler, start_analyzer(tmp_path, broker, names, keys, dim, b, rounds, learner=learner,
                                    epsilon=epsilon, delta=delta)


def topics(broker: KafkaBroker, name: Callable[[str], str]) -> dict[str, str]:
    """Fresh messages, shuffled (one partition each) and model topics; the model topic compacted
    when the broker accepts the setting."""
    return {"messages": broker.create_topic(name("esa-messages")), "shuffled": broker.create_topic(name("esa-shuffled")),
            "model": broker.create_topic(name("esa-model"), compacted=True)}


def read_records(bootstrap: str, topic: str, count: int, timeout_s: float,
                 alive: Callable[[], None] | None = None) -> list[Any]:
    """The first ``count`` records of ``topic`` with their metadata (fails after ``timeout_s``)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             max_partition_fetch_bytes=64 * 1024 * 1024)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    found: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {count} records on {topic} after {timeout_s:g} s")
            if alive is not None:
                alive()
            for records in consumer.poll(timeout_ms=200).values():
                found += records
    finally:
        consumer.close()
    return found[:count]


def read_values(bootstrap: str, topic: str, count: int, timeout_s: float, alive: Callable[[], None] | None = None) -> list[bytes]:
    """The values of the first ``count`` records of ``topic`` (fails after ``timeout_s``)."""
    return [record.value for record in read_records(bootstrap, topic, count, timeout_s, alive)]


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


def fake_unit(ident: int, size: int, share: int = 0) -> bytes:
    """A well-framed unit whose sealed part is an identifiable filler (ident at bytes 12–20, the
    share index at 20–28): the shuffler never opens a unit."""
    filler = (ident.to_bytes(8, "big") + share.to_bytes(8, "big")) * (size // 16 + 1)
    return wire.unit(b"\0" * 8, filler[: size - 12])


def unit_ident(unit: bytes) -> int:
    """The ident of a :func:`fake_unit`."""
    return int.from_bytes(unit[12:20], "big")


def fake_message(round_: int, ident: int, params: int, shuffler: PublicKey) -> bytes:
    """A message sealed to ``shuffler`` holding one :func:`fake_unit` of a ``params``-vector."""
    return wire.seal_message(SealedBox(shuffler), key_id(shuffler), round_, fake_unit(ident, wire.vector_unit_size(params)))


def fake_shares_message(round_: int, ident: int, dim: int, shares: int, shuffler: PublicKey) -> bytes:
    """A share message sealed to ``shuffler`` holding ``shares`` :func:`fake_unit` s (ident, share index)."""
    units = [fake_unit(ident, wire.share_unit_size(dim), j) for j in range(shares)]
    return wire.seal_message(SealedBox(shuffler), key_id(shuffler), round_, b"".join(units))


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


def encode_args(broker: KafkaBroker, names: dict[str, str], keys: tuple[KeyFiles, KeyFiles], source: Path) -> list[str]:
    """``panpriv encode`` of the records in ``source`` with both public keys."""
    return ["encode", "--bootstrap", broker.bootstrap, "--model-topic", names["model"], "--messages-topic",
            names["messages"], "--analyzer-key", str(keys[0].public), "--shuffler-key", str(keys[1].public),
            "--source", str(source)]


def half_round_clients(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], keys: tuple[KeyFiles, KeyFiles],
                       X: np.ndarray, y: np.ndarray, b: int) -> list[ManagedProcess]:
    """Two ``panpriv encode`` processes, each sending half of every round of ``b`` users (the
    records are dealt by position within the round), started now."""
    first = (np.arange(len(y)) % b) < b // 2
    files = [write_jsonl(tmp_path / "a.jsonl", X[first], y[first]), write_jsonl(tmp_path / "b.jsonl", X[~first], y[~first])]
    return [panpriv([*encode_args(broker, names, keys, path), "--per-round", str(b // 2)], tmp_path / f"client{i}.log")
            for i, path in enumerate(files)]


def assert_unlinkable(messages: Sequence[bytes], batches: Sequence[Sequence[bytes]], analyzer_keys: Sequence[PrivateKey],
                      owner: dict[bytes, int]) -> None:
    """An adversary who reads the messages topic (``messages``, in offset order) and the shuffled
    topic (``batches``: each released batch's units, in their released order) and holds the
    analyzer's keys cannot link a unit to the message it came in:

    - **bytes**: no unit shares a substring of 31 bytes or more with any message (every such
      substring would contain one of the unit's 16-byte-aligned windows, none of which occurs at
      any offset of any message);
    - **keys**: the analyzer's keys open no message (the outer layer is sealed to the shuffler);
    - **lengths**: all messages have one size, all units another;
    - **order**: guessing that the k-th unit of a batch came in the k-th message of its round
      (``owner``: unit → index in ``messages``, which only the test knows) is right no more often
      than chance allows (a count of fixed points of a uniform shuffle: mean 1 per batch).
    """
    assert len({len(m) for m in messages}) == 1, "one message size"
    units = [u for batch in batches for u in batch]
    assert units and len({len(u) for u in units}) == 1, "one unit size"
    windows = {u[i:i + 16] for u in units for i in range(0, len(u) - 15, 16)}
    for message in messages:
        assert not any(message[i:i + 16] in windows for i in range(len(message) - 15)), "a unit's bytes are in a message"
    boxes = [SealedBox(key) for key in analyzer_keys]
    for message in messages:
        for box in boxes:
            try:
                box.decrypt(message[20:])
            except Exception:  # noqa: BLE001 - CryptoError (or a short box): not opened, as required
                continue
            raise AssertionError("the analyzer's key opened a message of the messages topic")
    fixed = 0
    for batch in batches:
        senders = sorted({owner[u] for u in batch})
        rank = {sender: k for k, sender in enumerate(senders)}
        per = len(batch) // max(1, len(senders))
        fixed += sum(rank[owner[u]] == k // per for k, u in enumerate(batch))
    expected = sum(len(batch) // max(1, len({owner[u] for u in batch})) for batch in batches if batch)
    assert fixed <= expected + 6 * math.sqrt(expected) + 3, (fixed, expected)


def assert_refuses_bad_batches(analyzer: Any, shuffler: ShufflerKeys, applied: bytes, units: list[bytes],
                               charged: list[int]) -> None:
    """Every record below is refused before anything of it is opened, charged or learned, counted
    once by its reason, and the statement does not move. ``applied``: the record of the round the
    analyzer applied last; ``units``: well-formed units the shuffler could release for the current
    round; ``charged``: the rounds the analyzer's gate was asked for so far (it must not grow).

    - ``old_format``: an unsigned batch of the format before signed batches;
    - ``malformed_batch``: bytes that frame nothing;
    - ``unknown_signer``: forged — signed by another key (the review's attack: one old valid unit
      repeated b times labelled as the current round);
    - ``bad_signature``: re-signed old — the applied batch's signature over the current round's
      header; and a unit changed after signing;
    - ``wrong_deployment``: the shuffler's batch for another deployment sharing its key;
    - ``duplicate_batch``: the applied record again (a re-release after a crash);
    - ``replayed_batch``: a signed batch of the applied round with other units;
    - ``out_of_order``: a signed batch of the next round.
    """
    current = analyzer.round
    previous = wire.parse_batch(applied)
    repeated = [previous.units[0]] * len(units) if previous.units else list(units)
    tampered = bytearray(signed(shuffler, current, units))
    tampered[-1] ^= 1
    other_units = [units[0], *previous.units[1:]] if len(previous.units) > 1 else list(units)
    attempts = [
        ("old_format", b"PPB1" + current.to_bytes(8, "big") + bytes(40)),
        ("malformed_batch", b"junk"),
        ("unknown_signer", signed(shuffler_keys(), current, repeated)),
        ("bad_signature", wire.batch_record(previous.deployment, current, repeated, wire.batch_digest(current, repeated),
                                            previous.signer_id, previous.signature)),
        ("bad_signature", bytes(tampered)),
        ("wrong_deployment", signed(shuffler, current, units, deployment="esa:cluster=test/another-deployment")),
        ("duplicate_batch", applied),
        ("replayed_batch", signed(shuffler, previous.round, other_units)),
        ("out_of_order", signed(shuffler, current + 1, units)),
    ]
    report, theta, rejected = analyzer.report(), analyzer.learner.release().copy(), Counter(analyzer.rejected)
    asked = list(charged)
    for reason, record in attempts:
        before = analyzer.rejected[reason]
        assert not analyzer.handle(record), reason
        assert analyzer.rejected[reason] == before + 1, (reason, dict(analyzer.rejected))
    assert sum(analyzer.rejected.values()) - sum(rejected.values()) == len(attempts), "once per record, none per unit"
    assert charged == asked and analyzer.round == current, "never charged, never learned"
    np.testing.assert_array_equal(analyzer.learner.release(), theta)
    after = analyzer.report()
    assert (after.output, after.intrusion) == (report.output, report.intrusion), "the stated epsilon does not move"


def units_inside(message: bytes, shuffler: ShufflerKeys, unit_size: int, count: int = 1) -> list[bytes]:
    """The units inside ``message`` (what the shuffler holding ``shuffler`` takes out of it)."""
    opened = wire.open_message(message, wire.message_size_for(count * unit_size), shuffler.key_id, SealedBox(shuffler.box))
    assert not isinstance(opened, str), opened
    return wire.split_units(opened[1], count, unit_size)


def assert_unlinkable_on_the_broker(messages: list[Any], batches: list[Any], keys: tuple[KeyFiles, KeyFiles],
                                    unit_size: int, count: int) -> None:
    """Both topics as the broker's operator reads them (``messages``, ``batches``: Kafka records),
    with the analyzer's key (:func:`assert_unlinkable`), and their metadata: the messages carry no
    key, no header and the timestamp 0 the clients set; each batch is one record, so its units
    share all of its metadata and are released together. ``count`` units of ``unit_size`` bytes per
    message."""
    shuffler = load_shuffler(keys[1].private)
    values = [record.value for record in messages]
    units = [list(wire.parse_batch(record.value).units) for record in batches]
    owner = {unit: i for i, value in enumerate(values) for unit in units_inside(value, shuffler, unit_size, count)}
    assert_unlinkable(values, units, [load_private(keys[0].private)], owner)
    assert all(record.key is None and not record.headers and record.timestamp == 0 for record in messages)
    assert len({record.offset for record in batches}) == len(batches) == len(units)
