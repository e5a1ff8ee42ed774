"""The service end to end against the real Kafka-protocol broker (issue 8, tests 1, 3, 4, 5).

`panpriv` runs as a subprocess exactly as a user starts it. Notes on the broker: after a consumer
is killed with SIGKILL, the Tansu broker takes about 11 s before a new member of the same group
gets its partitions (3 s for a fresh group), which is most of this module's wall time.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.runtime.learners import restore_learner
from panpriv.streamer.state.checkpoint import CheckpointStore
from tests.realparts import free_loopback_port, wait_until

pytestmark = pytest.mark.integration

N = 100_000
DIM = 8
PARTITIONS = 3
BAD_EVERY = 1000  # message i with i % 1000 == 500 is malformed: 100 in all
MALFORMED = [
    (b"\xff\xfe not utf-8", "undecodable"),
    (b'{"y": 1}', "missing_field"),
    (b'{"x": "a string", "y": 1}', "wrong_type"),
    (json.dumps({"x": [0.1] * (DIM + 1), "y": 1}).encode(), "wrong_dimension"),
    (b'{"x": [NaN, 0, 0, 0, 0, 0, 0, 0], "y": 1}', "non_finite"),
    (json.dumps({"x": [0.1] * DIM, "y": 3}).encode(), "label_out_of_range"),
]
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Topic:
    name: str
    end: dict[str, int]
    rejects: dict[str, int]

    @property
    def valid(self) -> int:
        return sum(self.end.values()) - sum(self.rejects.values())


def produce(bootstrap: str, topic: str, messages: list[bytes], partitions: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    for i, message in enumerate(messages):
        producer.send(topic, message, partition=i % partitions)
    producer.flush()
    producer.close()


@pytest.fixture(scope="module")
def topic(kafka_broker) -> Topic:
    name = kafka_broker.create_topic(f"records-{uuid.uuid4().hex[:8]}", PARTITIONS)
    rng = np.random.default_rng(8)
    X = rng.standard_normal((N, DIM)) / np.sqrt(DIM)
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    messages = []
    rejects: dict[str, int] = {}
    for i in range(N):
        if i % BAD_EVERY == BAD_EVERY // 2:
            payload, reason = MALFORMED[(i // BAD_EVERY) % len(MALFORMED)]
            rejects[reason] = rejects.get(reason, 0) + 1
            messages.append(payload)
        else:
            messages.append(encode_json(X[i], y[i]))
    produce(kafka_broker.bootstrap, name, messages, PARTITIONS)
    end = {f"{name}/{p}": len(range(p, N, PARTITIONS)) for p in range(PARTITIONS)}
    return Topic(name, end, rejects)


def panpriv(*args: str, log: Path, client: str = "kafka-python", state_dir: Path | None = None) -> subprocess.Popen:
    """``panpriv ARGS`` as a child process whose Kafka source uses ``client`` ([kafka] client),
    with the budget store in ``state_dir`` (default: this test's)."""
    handle = open(log, "ab")  # noqa: SIM115 - inherited by the child; closed when the test ends
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PANPRIV_KAFKA__CLIENT": client}
    if state_dir is not None:
        env["PANPRIV_STATE_DIR"] = str(state_dir)
    return subprocess.Popen(
        [sys.executable, "-m", "panpriv", *args], stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
        start_new_session=True, env=env,
    )


def run_args(bootstrap: str, topic: str, group: str, out: Path, *extra: str) -> list[str]:
    return [
        "run", "--source", f"kafka://{bootstrap}/{topic}?group={group}", "--n", str(N), "--dim", str(DIM),
        "--feature-bound", "1", "--out", str(out), "--checkpoint-every", "2000", "--snapshot-every", "10000",
        "--metrics-port", "0", "--progress", "off", *extra,
    ]


def checkpoint_records(out: Path) -> int:
    checkpoint = CheckpointStore(out / "checkpoints").load()
    return -1 if checkpoint is None else checkpoint.records


def charged_beyond_checkpoint(out: Path, state_dir: Path, topic: str) -> bool:
    """Whether the budget store holds a charge past the durable checkpoint's position on some
    partition: a kill now leaves a lost state (records charged and learned, never made durable)."""
    from panpriv.streamer.budget.store import BudgetStore

    checkpoint = CheckpointStore(out / "checkpoints").load()
    if checkpoint is None:
        return False
    store = BudgetStore(state_dir)
    try:
        ledger = store.ledger()
        for key in ledger.sources:
            topic_name, partition = key.rsplit("/", 2)[-2:]
            if topic_name == topic and max(s.stop for s in ledger.coverage(key)) > checkpoint.positions.get(f"{topic}/{partition}", 0):
                return True
        return False
    finally:
        store.close()


def strict_snapshots(path: Path) -> list[dict]:
    """Every line must be a complete JSON snapshot (a crash may not leave a partial line behind)."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


@dataclass(frozen=True)
class KafkaRun:
    out: Path
    group: str
    kills: list[int]  # records in the durable checkpoint at each kill
    seconds: float
    state_dir: Path  # the budget store the runs shared


@pytest.fixture(scope="module", params=["kafka-python", pytest.param("confluent", marks=pytest.mark.soak)])
def kafka_run(request, kafka_broker, topic, tmp_path_factory) -> KafkaRun:
    """Issue 8 test 1's scenario: consume with kill -9 at random points, restart, run to the end;
    once with each Kafka client of the source (kafka-python; confluent-kafka in ``make soak``)."""
    client = request.param
    # A budget store per client: both runs read the same topic, and the store would (rightly)
    # compose the second run with the first.
    state_dir = tmp_path_factory.mktemp(f"state-{client}")
    out = tmp_path_factory.mktemp("kafka-run") / "out"
    group = f"g-{uuid.uuid4().hex[:8]}"
    # 8,000 records/s: three kills must fit in the N records. Each run is killed after +4,000 durable
    # records and a charge past the checkpoint; on a loaded machine that second wait took ~2.5 s,
    # which at 20,000/s let the second run reach 98% of the topic and left the third nothing to do.
    args = run_args(kafka_broker.bootstrap, topic.name, group, out, "--stop-at-end", "--rate", "8000")
    log = out.parent / "service.log"
    chooser = random.Random(20261122)
    kills = []
    t0 = time.monotonic()
    for _ in range(3):
        before = checkpoint_records(out)
        process = panpriv(*args, log=log, client=client, state_dir=state_dir)
        try:
            # Let this run make durable progress, then kill it at a random moment.
            wait_until(lambda: process.poll() is None and checkpoint_records(out) >= before + 4000, 60, "progress before the kill")
            time.sleep(chooser.uniform(0.0, 0.4))
            # At the kill, some charged records must be past the durable checkpoint (the lost
            # state the second test looks for); on a loaded machine the random moment alone can
            # fall right after a checkpoint, before the next batch is charged.
            wait_until(lambda: charged_beyond_checkpoint(out, state_dir, topic.name), 30, "a charge past the checkpoint")
        finally:
            process.kill()  # SIGKILL: no handler runs, nothing is flushed
            process.wait(timeout=10)
        kills.append(checkpoint_records(out))
    process = panpriv(*args, log=log, client=client, state_dir=state_dir)
    code = process.wait(timeout=120)
    assert code == 0, log.read_text()[-3000:]
    return KafkaRun(out, group, kills, time.monotonic() - t0, state_dir)



def open_batch(checkpoint) -> int:  # noqa: ANN001
    """The size of the batch that follows the checkpoint's state: a finished pan-acsa run's open batch
    was smaller (its records are charged and reach no output)."""
    return restore_learner(checkpoint.learner, checkpoint.learner_config, checkpoint.learner_state, None).records_to_boundary()

def test_kill_9_cycles_leave_every_offset_covered_exactly_once(kafka_run, topic, kafka_broker) -> None:
    """Issue 8, test 1."""
    assert len(kafka_run.kills) == 3 and kafka_run.kills == sorted(kafka_run.kills) and kafka_run.kills[-1] < topic.valid
    checkpoint = CheckpointStore(kafka_run.out / "checkpoints").load()
    assert checkpoint.finished
    ledger = PrivacyLedger.from_dict(checkpoint.ledger)
    # Every valid offset (and every rejected one: whole consumed ranges are charged) exactly once.
    assert ledger.sources == sorted(topic.end)
    for key, end in topic.end.items():
        assert [(s.start, s.stop, s.uses) for s in ledger.coverage(key)] == [(0, end, (checkpoint.instance,))]
        assert checkpoint.positions[key] == end
    # Rejects counted by reason, each exactly once; the state learned every valid record once.
    assert checkpoint.rejects == topic.rejects and sum(topic.rejects.values()) == N // BAD_EVERY
    assert set(topic.rejects) == {reason for _, reason in MALFORMED}
    # pan-acsa's state: every record of its complete batches, once; the batch still open when the
    # topic ended reaches no output (docs/privacy.md, "Checkpoints on disk").
    assert checkpoint.records == checkpoint.learner_state["records"] and topic.valid == N - 100
    assert 0 <= topic.valid - checkpoint.records < open_batch(checkpoint)
    # Snapshots: valid, and their record counts never go backwards across the crashes.
    snapshots = strict_snapshots(kafka_run.out / "snapshots.jsonl")
    counts = [s["records"] for s in snapshots]
    assert counts == sorted(counts) and counts[-1] == checkpoint.records
    for snapshot in snapshots:
        report = PrivacyReport.from_dict(snapshot["privacy"])
        assert (report.output.epsilon, report.output.delta) == (1.0, 1e-6)
        assert len(snapshot["params"]) == DIM + 1 and all(np.isfinite(snapshot["params"]))  # and the intercept
    # Offsets were committed to the group after the final checkpoint (monitoring only).
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=kafka_run.group, enable_auto_commit=False)
    try:
        committed = {f"{topic.name}/{p}": consumer.committed(TopicPartition(topic.name, p)) for p in range(PARTITIONS)}
    finally:
        consumer.close(autocommit=False)
    assert committed == topic.end


def test_kill_9_cycles_charge_the_lost_states_as_a_second_use(kafka_run, topic) -> None:
    """Issue 13, point 3: the ranges each killed process had charged beyond its last durable
    checkpoint are intrusion-only lost instances in the budget store; the records re-learned after
    a kill have output ε = 1 (one release) and intrusion ε = 2, the composition of both uses, and
    the final snapshot states exactly that."""
    from panpriv.accounting.budget import report_for
    from panpriv.streamer.budget.store import BudgetStore

    checkpoint = CheckpointStore(kafka_run.out / "checkpoints").load()
    store = BudgetStore(kafka_run.state_dir)
    keys = [key for key in store.ledger().sources if key.rsplit("/", 2)[-2] == topic.name]
    ledger = store.ledger(keys)
    assert len(keys) == PARTITIONS
    lost = sorted(name for name in ledger.instances if name.startswith(checkpoint.instance + "/lost-"))
    assert lost, "no kill left a range charged beyond its checkpoint"  # 3 kills at random moments
    run_state = store.run_state(checkpoint.instance)
    assert run_state.losses == len(lost) and run_state.clean
    for name in lost:
        assert ledger.instances[name].output.epsilon == 0.0 and ledger.instances[name].intrusion.epsilon == 1.0
    relearned = [s for key in keys for s in ledger.coverage(key) if len(s.uses) > 1]
    assert relearned and all(set(s.uses) - {checkpoint.instance} <= set(lost) for s in relearned)
    for segment in relearned:
        output, intrusion = ledger.record_guarantee(segment.uses)
        # One intrusion reads one state: a record lost in two crashes is still at 1 (lost) + 1 (outputs).
        assert output.epsilon == 1.0 and intrusion.epsilon == 2.0
    # Every offset is charged to the run itself exactly once besides its lost states.
    for key in keys:
        assert [s.uses.count(checkpoint.instance) for s in ledger.coverage(key)] == [1] * len(ledger.coverage(key))
    stated = PrivacyReport.from_dict(strict_snapshots(kafka_run.out / "snapshots.jsonl")[-1]["privacy"])
    expected = report_for(ledger, [checkpoint.instance], checkpoint.records)
    assert (stated.output, stated.intrusion) == (expected.output, expected.intrusion)
    assert stated.output.epsilon == 1.0 and stated.intrusion.epsilon == 2.0


def test_recorded_replay_charges_the_same_ranges_and_resumes_mid_file(kafka_run, topic, kafka_broker, tmp_path) -> None:
    """Issue 8, test 3: `panpriv record`, then replay with a kill -9 in the middle."""
    recording = tmp_path / "topic.pprec"
    log = tmp_path / "replay.log"
    process = panpriv("record", f"kafka://{kafka_broker.bootstrap}/{topic.name}", str(recording), log=log)
    assert process.wait(timeout=120) == 0, log.read_text()
    assert f"wrote {N:,} messages" in log.read_text()
    out = tmp_path / "out"
    args = [
        "run", "--source", f"file:{recording}", "--format", "json", "--dim", str(DIM), "--feature-bound", "1",
        "--out", str(out), "--checkpoint-every", "2000", "--metrics-port", "0", "--progress", "off",
    ]
    process = panpriv(*args, "--rate", "40000", log=log)
    try:
        wait_until(lambda: checkpoint_records(out) >= 20_000, 60, "a mid-file checkpoint")
    finally:
        process.kill()
        process.wait(timeout=10)
    middle = checkpoint_records(out)
    assert 20_000 <= middle < topic.valid
    assert panpriv(*args, log=log).wait(timeout=120) == 0, log.read_text()[-3000:]

    replay = CheckpointStore(out / "checkpoints").load()
    live = CheckpointStore(kafka_run.out / "checkpoints").load()
    replay_ledger = PrivacyLedger.from_dict(replay.ledger)
    live_ledger = PrivacyLedger.from_dict(live.ledger)
    assert replay_ledger.sources == live_ledger.sources == sorted(topic.end)
    for key in topic.end:
        assert [(s.start, s.stop, len(s.uses)) for s in replay_ledger.coverage(key)] == [
            (s.start, s.stop, len(s.uses)) for s in live_ledger.coverage(key)
        ]
    assert replay.rejects == live.rejects and replay.records == live.records  # the same complete batches


def test_sigterm_takes_a_final_checkpoint_and_exits_0(topic, kafka_broker, tmp_path) -> None:
    """Issue 8, test 4."""
    out = tmp_path / "out"
    log = tmp_path / "service.log"
    process = panpriv(*run_args(kafka_broker.bootstrap, topic.name, f"g-{uuid.uuid4().hex[:8]}", out, "--rate", "5000"), log=log)
    try:
        wait_until(lambda: checkpoint_records(out) > 0, 60, "a first checkpoint")
        time.sleep(0.3)
        before = CheckpointStore(out / "checkpoints").load()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, log.read_text()[-3000:]
    final = CheckpointStore(out / "checkpoints").load()
    assert final.sequence > before.sequence and final.records >= before.records and not final.finished
    snapshots = strict_snapshots(out / "snapshots.jsonl")
    assert snapshots[-1]["records"] == final.records and snapshots[-1]["sequence"] == final.sequence
    text = log.read_text()
    assert "received SIGTERM" in text and "stopped" in text


CANARY = "8675309"


def test_canary_values_never_leave_the_process(kafka_broker, tmp_path) -> None:
    """Issue 8, test 5: records carry sentinel values; no checkpoint, snapshot, metric or log
    line contains any of them.

    The sentinels are decimals 0.8675309… (every feature of every record) and the string
    "8675309" inside malformed records. Chance that "8675309" appears by accident in the outputs
    (noisy floats printed with 17 digits, base64 text): below 1e-4 for the few hundred numbers
    written.
    """
    name = kafka_broker.create_topic(f"canary-{uuid.uuid4().hex[:8]}", 2)
    sentinels = 0.8675309 + np.arange(2000 * 4).reshape(2000, 4) * 1e-12
    messages = [encode_json(sentinels[i] * (1 if i % 2 else -1), 1 if i % 3 else -1) for i in range(2000)]
    messages[10] = f'{{"x": "{CANARY}-as-a-string", "y": 1}}'.encode()
    messages[11] = f'{{"x": [0, 0, 0, 0], "y": "{CANARY}"}}'.encode()
    messages[12] = f"{CANARY} not json \xff".encode("latin-1")
    produce(kafka_broker.bootstrap, name, messages, 2)
    out = tmp_path / "out"
    log = tmp_path / "service.log"
    port = free_loopback_port()
    args = [
        "run", "--source", f"kafka://{kafka_broker.bootstrap}/{name}?group=canary", "--n", "2000", "--dim", "4",
        "--feature-bound", "1", "--out", str(out), "--checkpoint-every", "300", "--snapshot-every", "300",
        "--metrics-port", str(port), "--progress", "on", "--stop-at-end", "--rate", "800",
    ]
    process = panpriv(*args, log=log)
    scrapes = []
    try:
        def scrape() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                scrapes.append(response.read().decode())
            found = re.search(r"^panpriv_records_total (\S+)$", scrapes[-1], re.MULTILINE)
            return found is not None and float(found.group(1)) > 0

        wait_until(scrape, 60, "metrics with records")
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    outputs = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert out / "checkpoints" / "checkpoint.json" in outputs and out / "snapshots.jsonl" in outputs
    texts = {str(p): data.decode("latin-1") for p, data in outputs.items()}
    texts["log"] = log.read_text(errors="replace")
    texts.update({f"scrape{i}": s for i, s in enumerate(scrapes)})
    for where, text in texts.items():
        assert CANARY not in text, where
    checkpoint = CheckpointStore(out / "checkpoints").load()
    assert checkpoint.rejects == {"wrong_type": 2, "undecodable": 1}
    for value in checkpoint.learner_state.values():
        if isinstance(value, np.ndarray):
            assert not np.isin(np.abs(value), np.abs(sentinels)).any()
    assert "panpriv_records_rejected_total" in scrapes[-1]


def test_dead_letters_and_snapshots_to_kafka(kafka_broker, tmp_path) -> None:
    """Rejected messages go to the dead-letter topic with their reason; snapshots to a topic. The
    micro-batches are decoded in groups of at most 64 payload bytes (two or three messages), so a
    reject's message is found across group boundaries."""
    from kafka import KafkaConsumer

    name = kafka_broker.create_topic(f"dlt-src-{uuid.uuid4().hex[:8]}", 1)
    dead = kafka_broker.create_topic(f"dlt-{uuid.uuid4().hex[:8]}", 1)
    snaps = kafka_broker.create_topic(f"snap-{uuid.uuid4().hex[:8]}", 1)
    messages = [encode_json([0.1, 0.2], 1) for _ in range(50)]
    messages[3], messages[17] = b"\xff", json.dumps({"x": [1, 2], "y": 0.5}).encode()
    produce(kafka_broker.bootstrap, name, messages, 1)
    config = tmp_path / "service.toml"
    config.write_text(
        f"""
out = "{tmp_path / 'out'}"
[source]
url = "kafka://{kafka_broker.bootstrap}/{name}?group=dlt"
stop_at_end = true
batch_bytes = 64
dead_letter_topic = "{dead}"
[records]
dim = 2
feature_bound = 1.0
[learner]
n = 50
[snapshots]
kafka_topic = "{snaps}"
[metrics]
port = {free_loopback_port()}
"""
    )
    log = tmp_path / "service.log"
    assert panpriv("run", "--config", str(config), "--progress", "off", log=log).wait(timeout=90) == 0, log.read_text()[-3000:]

    def read(topic: str) -> list:
        consumer = KafkaConsumer(topic, bootstrap_servers=kafka_broker.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=1500)
        try:
            return list(consumer)
        finally:
            consumer.close()

    letters = read(dead)
    assert [(m.value, dict(m.headers)["panpriv-reject-reason"]) for m in letters] == [
        (b"\xff", b"undecodable"), (messages[17], b"label_out_of_range")
    ]
    assert [dict(m.headers)["panpriv-offset"] for m in letters] == [b"3", b"17"]
    published = [json.loads(m.value) for m in read(snaps)]
    final = CheckpointStore(tmp_path / "out" / "checkpoints").load()
    assert published and published[-1]["records"] == final.records and 0 <= 48 - final.records < open_batch(final)
    assert published == strict_snapshots(tmp_path / "out" / "snapshots.jsonl")


def exit_code(process: subprocess.Popen, log: Path, timeout: float = 120) -> int:
    """``process``'s exit code; if it is still running after ``timeout`` seconds, the test fails
    with the end of its log (a hang must leave its evidence)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout:.0f} s; its log ends:\n{log.read_text()[-4000:]}")


def test_a_rebalance_hands_partitions_over_without_overlap(kafka_broker, tmp_path) -> None:
    """Two processes in one group: when the second joins, the first commits and checkpoints before
    its partitions are revoked; together their ledgers cover every offset exactly once."""
    name = kafka_broker.create_topic(f"rebalance-{uuid.uuid4().hex[:8]}", 4)
    total = 12_000
    produce(kafka_broker.bootstrap, name, [encode_json([0.1, 0.2], 1 if i % 2 else -1) for i in range(total)], 4)
    group = f"g-{uuid.uuid4().hex[:8]}"

    def args(out: Path) -> list[str]:
        return [
            "run", "--source", f"kafka://{kafka_broker.bootstrap}/{name}?group={group}", "--n", str(total),
            "--dim", "2", "--feature-bound", "1", "--out", str(out), "--checkpoint-every", "1000",
            "--metrics-port", "0", "--progress", "off", "--stop-at-end", "--rate", "2500",
        ]

    first_out, second_out = tmp_path / "first", tmp_path / "second"
    first = panpriv(*args(first_out), log=tmp_path / "first.log")
    second = None
    try:
        wait_until(lambda: checkpoint_records(first_out) >= 1000, 60, "the first process's progress")
        second = panpriv(*args(second_out), log=tmp_path / "second.log")
        assert exit_code(first, tmp_path / "first.log") == 0, (tmp_path / "first.log").read_text()[-3000:]
        assert exit_code(second, tmp_path / "second.log") == 0, (tmp_path / "second.log").read_text()[-3000:]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert "partitions being revoked: commit and checkpoint first" in (tmp_path / "first.log").read_text()
    covered: dict[str, list[tuple[int, int]]] = {}
    records, open_batches = 0, 0
    for out in (first_out, second_out):
        checkpoint = CheckpointStore(out / "checkpoints").load()
        records += checkpoint.records
        open_batches += open_batch(checkpoint)
        ledger = PrivacyLedger.from_dict(checkpoint.ledger)
        for key in ledger.sources:
            covered.setdefault(key, []).extend((s.start, s.stop) for s in ledger.coverage(key) if len(s.uses) == 1)
            assert all(len(s.uses) == 1 for s in ledger.coverage(key))
    assert 0 <= total - records < open_batches  # each learner's batch open at the end reaches no output
    for p in range(4):
        spans = sorted(covered[f"{name}/{p}"])
        assert spans[0][0] == 0 and spans[-1][1] == total // 4
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans  # no gap, no overlap


@pytest.mark.soak
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_run_paced_slower_than_max_poll_interval_stays_in_its_group(kafka_broker, tmp_path, client) -> None:
    """``--rate 0.025``: a record every 40 s, longer than the consumer's max_poll_interval (30 s).
    The paced wait keeps the consumer in its group (``Source.keep_alive``): the run reads both
    records, each once, without a revocation, and ends at the end of the topic. Before, the
    second poll rejoined the group, the revocation's commit failed and the run stopped with exit
    code 1 on both clients."""
    name = kafka_broker.create_topic(f"paced-{uuid.uuid4().hex[:8]}", 1)
    produce(kafka_broker.bootstrap, name, [encode_json([0.1, 0.2], 1), encode_json([0.2, 0.1], -1)], 1)
    out, log = tmp_path / "out", tmp_path / "paced.log"
    process = panpriv("run", "--source", f"kafka://{kafka_broker.bootstrap}/{name}?group=g-{uuid.uuid4().hex[:8]}",
                      "--n", "1000", "--dim", "2", "--feature-bound", "1", "--out", str(out), "--checkpoint-every", "1",
                      "--metrics-port", "0", "--progress", "off", "--stop-at-end", "--rate", "0.025", log=log, client=client)
    try:
        assert exit_code(process, log, timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "partitions being revoked" not in log.read_text()
    ledger = PrivacyLedger.from_dict(CheckpointStore(out / "checkpoints").load().ledger)
    assert [(s.start, s.stop, len(s.uses)) for s in ledger.coverage(f"{name}/0")] == [(0, 2, 1)]
