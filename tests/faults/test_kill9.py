"""``kill -9`` at random moments, on a file source and on the real broker (issue 15's campaign).

Each cycle starts the real ``panpriv run`` and kills it with SIGKILL: one cycle in four after a
random delay from its start (start-up, the group join), the others at a random moment of the batch
after the one that brought the durable state past the last kill's (consumption and checkpoint writes
alike). Kills on a timer alone all landed before the first batch boundary of their cycle — a run
resumes at the last boundary (pan-acsa), so 60 file kills of the soak restarted from 0 sixty times
and tested no resumption. Then it checks what survived:

- the checkpoint verifies (checksum, schema) and the ledger covers exactly the consumed positions
  ``[0, position)`` of every source key, once (never under-counted, never doubled);
- learned + rejected records equal the consumed positions (no record lost or counted twice) —
  but for the final checkpoint of a finished stream, whose last batch, still open, reaches no
  output (pan-acsa saves batch boundaries: fewer than one batch of records);
- the released snapshots' record counts never go backwards;
- no output of any process holds a traceback.

After the kills a last run reads to the end: every record is learned or rejected exactly once.
The normal suite runs three kills on a file (tests/streamer/test_service_kafka.py kills the service
three times on the broker); ``-m soak`` runs 60 on files and 45 on the broker.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger
from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.runtime.learners import restore_learner
from panpriv.streamer.state.checkpoint import CheckpointStore
from tests.faults.harness import assert_no_traceback, start_panpriv, wait_for

DIM = 4
MALFORMED_EVERY = 97  # one malformed message (a 400-digit label: once a crash loop) every 97
BATCH = 500  # pan-acsa's batch: a resumed run starts at the last batch boundary (the default for 10^5 records is 3,572)


@dataclass
class Tally:
    """What the kill cycles did, for the soak report."""

    kills: int = 0
    during_checkpoint_write: int = 0
    before_first_checkpoint: int = 0
    after_progress: int = 0  # kills whose durable state had moved past the last kill's
    records_at_kills: list[int] = field(default_factory=list)


def message(i: int, rng: np.random.Generator) -> bytes:
    if i % MALFORMED_EVERY == MALFORMED_EVERY // 2:
        return b'{"x": [0.1, 0.2, 0.3, 0.4], "y": ' + b"9" * 400 + b"}"
    x = rng.standard_normal(DIM) * 0.3
    return encode_json(x.tolist(), 1.0 if x[0] > 0 else -1.0)


def malformed_count(n: int) -> int:
    return sum(1 for i in range(n) if i % MALFORMED_EVERY == MALFORMED_EVERY // 2)


def check_survivors(out: Path, keys_total: Callable[[dict[str, int]], None] | None = None) -> int:
    """The invariants after a kill (module docstring); returns the records learned."""
    checkpoint = CheckpointStore(out / "checkpoints").load()  # verifies checksum and schema
    if checkpoint is None:
        return 0
    ledger = PrivacyLedger.from_dict(checkpoint.ledger)
    for key, position in checkpoint.positions.items():
        segments = ledger.coverage(key)
        assert [(s.start, s.stop, len(s.uses)) for s in segments] == ([(0, position, 1)] if position else []), key
    handled = checkpoint.records + sum(checkpoint.rejects.values())
    if checkpoint.finished:  # the batch still open when the stream ended reaches no output (pan-acsa)
        open_batch = restore_learner(checkpoint.learner, checkpoint.learner_config, checkpoint.learner_state, None)
        assert 0 <= sum(checkpoint.positions.values()) - handled < open_batch.records_to_boundary()
    else:
        assert handled == sum(checkpoint.positions.values())
    if (out / "snapshots.jsonl").exists():
        lines = (out / "snapshots.jsonl").read_bytes().split(b"\n")
        counts = [json.loads(line)["records"] for line in lines[:-1]]  # the last line may be cut by the kill
        assert counts == sorted(counts)
    return checkpoint.records


def durable_records(out: Path) -> int:
    """Records of the last checkpoint (0 before the first): what a restart resumes from."""
    checkpoint = CheckpointStore(out / "checkpoints").load()
    return 0 if checkpoint is None else checkpoint.records


def assert_stream_outlasts_kills(n: int, kills: int, delay_s: tuple[float, float], rate: int) -> None:
    """The n records outlast every cycle, so each is killed mid-stream: a start-up kill (one cycle
    in four) reads at most ``rate × delay`` records, any other at most two batches past the last."""
    assert kills // 4 * delay_s[1] * rate + (kills - kills // 4) * 2 * BATCH < n


def kill_cycles(argv: Callable[[int], list[str]], out: Path, logs: Path, kills: int, delay_s: tuple[float, float],
                batch_s: float, rng: random.Random) -> Tally:
    """``kills`` cycles of start, SIGKILL, check (module docstring). ``delay_s``: the range of a
    start-up kill's delay; ``batch_s``: a batch's duration at the cycle's rate, the range of a kill's
    delay once the durable state has moved past the last kill's."""
    tally = Tally()
    tmp = out / "checkpoints" / "checkpoint.json.tmp"
    last = 0
    for cycle in range(kills):
        child = start_panpriv(argv(cycle), logs, f"cycle{cycle}")
        try:
            if cycle % 4 == 3:
                time.sleep(rng.uniform(*delay_s))
            else:
                wait_for(lambda: durable_records(out) > last or child.process.poll() is not None, 120,
                         f"cycle {cycle} to checkpoint past {last} records")
                time.sleep(rng.uniform(0.0, batch_s))
            if child.process.poll() is not None:
                raise AssertionError(f"cycle {cycle} ended before its kill:\n{child.output()[-3000:]}")
            writing = tmp.exists()
            child.process.kill()
            child.wait(30)
        finally:
            child.stop()
        assert_no_traceback(child.output())
        tally.kills += 1
        tally.during_checkpoint_write += writing
        records = check_survivors(out)
        tally.before_first_checkpoint += records == 0
        tally.after_progress += records > last
        tally.records_at_kills.append(records)
        last = records
    assert tally.records_at_kills == sorted(tally.records_at_kills)
    assert tally.after_progress >= kills - kills // 4, f"a kill after progress found none: {tally}"
    return tally


def finish(argv: list[str], out: Path, logs: Path, total: int, valid: int, timeout_s: float) -> None:
    child = start_panpriv(argv, logs, "final")
    try:
        code = child.wait(timeout_s)
    finally:
        child.stop()
    output = child.output()
    assert code == 0 and "finished" in output, output[-3000:]
    assert_no_traceback(output)
    checkpoint = CheckpointStore(out / "checkpoints").load()
    assert sum(checkpoint.positions.values()) == total and checkpoint.finished
    assert checkpoint.records <= valid and checkpoint.rejects == {"non_finite": total - valid}
    check_survivors(out)


# -- files ------------------------------------------------------------------------------------------


def file_kills(tmp_path: Path, n: int, kills: int) -> Tally:
    rng = np.random.default_rng(15)
    data = tmp_path / "records.jsonl"
    data.write_bytes(b"\n".join(message(i, rng) for i in range(n)) + b"\n")
    out = tmp_path / "out"

    def argv(rate: int) -> list[str]:
        return ["run", "--source", f"file:{data}", "--dim", str(DIM), "--feature-bound", "1", "--out", str(out),
                "--rate", str(rate), "--checkpoint-every", "200", "--snapshot-every", "1000", "--metrics-port", "0",
                "--progress", "off", "--set", f"batch_size={BATCH}"]

    rate, delay_s = 2000, (0.3, 1.5)
    assert_stream_outlasts_kills(n, kills, delay_s, rate)
    tally = kill_cycles(lambda cycle: argv(rate), out, tmp_path, kills, delay_s, BATCH / rate, random.Random())
    finish(argv(0), out, tmp_path, n, n - malformed_count(n), 300)
    return tally


@pytest.mark.slow
def test_kill_9_on_a_file_source(tmp_path) -> None:
    tally = file_kills(tmp_path, 20_000, 3)
    assert tally.kills == 3


@pytest.mark.soak
def test_soak_kill_9_on_a_file_source(tmp_path) -> None:
    tally = file_kills(tmp_path, 200_000, 60)
    print(f"\nkill -9 on a file source: {tally}")
    assert tally.kills == 60


# -- the real broker ------------------------------------------------------------------------------


def broker_kills(kafka_broker, tmp_path: Path, n: int, kills: int) -> Tally:  # noqa: ANN001
    from kafka import KafkaProducer

    partitions = 3
    topic = kafka_broker.create_topic(f"kill9-{uuid.uuid4().hex[:8]}", partitions)
    rng = np.random.default_rng(16)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=20, batch_size=256 * 1024)
    for i in range(n):
        producer.send(topic, message(i, rng), partition=i % partitions)
    producer.flush()
    producer.close()
    out = tmp_path / "out"

    def argv(group: str, *extra: str) -> list[str]:
        # A new consumer group per process: positions come from our checkpoint, and a fresh group
        # does not wait for the killed member's session to expire.
        return ["run", "--source", f"kafka://{kafka_broker.bootstrap}/{topic}?group={group}", "--n", str(n),
                "--dim", str(DIM), "--feature-bound", "1", "--out", str(out), "--checkpoint-every", "200",
                "--snapshot-every", "1000", "--metrics-port", "0", "--progress", "off", "--set", f"batch_size={BATCH}", *extra]

    rate, delay_s = 1500, (1.0, 5.0)  # start-up kills: mostly in the group join (about 5 s on Tansu)
    assert_stream_outlasts_kills(n, kills, delay_s, rate)
    tally = kill_cycles(lambda cycle: argv(f"k{cycle}-{uuid.uuid4().hex[:6]}", "--rate", str(rate)), out, tmp_path,
                        kills, delay_s, BATCH / rate, random.Random())
    finish(argv(f"final-{uuid.uuid4().hex[:6]}", "--stop-at-end"), out, tmp_path, n, n - malformed_count(n), 600)
    return tally


@pytest.mark.integration
@pytest.mark.soak
def test_soak_kill_9_on_the_broker(kafka_broker, tmp_path) -> None:
    tally = broker_kills(kafka_broker, tmp_path, 150_000, 45)
    print(f"\nkill -9 on the broker: {tally}")
    assert tally.kills == 45
