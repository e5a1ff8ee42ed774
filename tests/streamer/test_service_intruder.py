"""The intruder against the running service: ``panpriv run`` read through ``/proc/<pid>/mem``.

The attack of tests/intruder.py on the real ``python -m panpriv run`` over a canary stream (file
and Kafka sources, JSON, CSV and binary records; pan-acsa with float and secure noise; one shuffle
learner): the service is paused with SIGSTOP at several points of the stream — once inside each of
several pan-acsa batches — its whole writable memory is read, and the dump is searched for

- any state of the open batch other than the live accumulator (W minus the clean sum of any range
  of the batch's records ending at the live position, as 8-byte words or as base64 text) — the
  noise draw Z_t itself among them;
- the coordinates of the batch's noise draw anywhere (against the next batch's draw, not made yet,
  as the chance level);
- the raw records: any fragment of a record's text, any of its float64 (or, binary, float32)
  values — and how far behind the position they are.

Then the distinguishing game: in each dump the intruder guesses the label of the last record
learned, from a pair of states if it finds one, else from W alone; the correct guesses give an
audited lower bound on the intrusion ε (Steinke, Nasr & Jagielski 2023, Thm 1).

On main at 4ed1851 (before issue 32) the same test failed: the stale checkpoint copies of the open
batch's accumulator were in memory (as words and as base64) in most dumps, so the game's guesses
were right whenever a pair was found; the raw records of the whole stream, from its first record on,
were in memory (the numbers of that run are in the issue's closing note and CHANGELOG).

Bounds asserted (docs/privacy.md, "The input path"): no raw record further back than
:data:`K` micro-batches behind the position, plus the source's read-ahead: a file's 64 KiB read
buffer, or for Kafka the fetch response being consumed (kafka-python keeps it whole; its size is
set here with ``fetch_max_bytes``). The
``soak`` variant reads more batches of a longer stream (``make soak``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.streamer.runtime.learners import restore_learner
from panpriv.streamer.sources.local import READ_BUFFER
from tests.intruder import (
    RECORDS_PER_BINARY_MESSAGE,
    DrawReplay,
    Exposure,
    Service,
    audit_epsilon,
    base64_vectors,
    canary_stream,
    draw_coordinates_found,
    gradient_rows,
    guess_label,
    open_batch,
    pairs,
)
from tests.memscan import Memory

K = 2
"""Micro-batches of raw records a dump may hold behind the position: the one being learned and the
one before it (docs/privacy.md, "The input path")."""

SEED = 31
CLAIMED_EPSILON = 1.0

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not __import__("os").path.exists("/proc/self/mem"), reason="needs Linux /proc/<pid>/mem")]


@dataclass
class Findings:
    """Everything the dumps of one run gave the intruder."""

    dumps: int = 0
    live_found: int = 0
    pairs: list[tuple[int, list[tuple[int, str]]]] = field(default_factory=list)
    draw: list[tuple[int, int, int]] = field(default_factory=list)  # (found, chance, coordinates)
    ages: list[int] = field(default_factory=list)
    guesses: list[tuple[bool, bool]] = field(default_factory=list)  # (correct, from a pair)

    def summary(self) -> str:
        correct = sum(c for c, _ in self.guesses)
        return (f"{self.dumps} dumps, W found in {self.live_found}, pairs in {sum(1 for _, p in self.pairs if p)}; "
                f"draw coordinates found {[d[0] for d in self.draw]} vs chance {[d[1] for d in self.draw]}; "
                f"oldest record behind the position {max(self.ages, default=-1)}; game {correct}/{len(self.guesses)} "
                f"correct ({sum(p for _, p in self.guesses)} from pairs), audited epsilon >= "
                f"{audit_epsilon(correct, len(self.guesses)):.2f}")


def batch_starts(config: dict) -> list[int]:
    """The first position of each batch of the first epoch (the public plan)."""
    plan = PanPrivateACSA.from_config(config).current_plan()
    sizes = [plan.batch_size(t) for t in range(1, plan.steps + 1)]
    return [int(s) for s in np.cumsum([0, *sizes])]


def attack(service: Service, batches: range) -> Findings:
    """One dump inside each of ``batches`` (0-based), in its second half, analysed while paused."""
    stream = service.stream
    findings = Findings()
    service.wait_for(1)
    config = _first_manifest(service).learner_config
    starts = batch_starts(config)
    replay = DrawReplay(config, SEED)
    integer = config.get("noise") == "secure"
    for t in batches:
        if t + 1 >= len(starts):
            break
        start, stop = starts[t], starts[t + 1]
        service.wait_for(start + (stop - start) // 2)
        with service.paused() as raw:
            position = service.position_before_pause
            if position > stop - service.step - 50:
                continue  # the service ran past the batch (a loaded machine): no dump in it
            findings.dumps += 1
            findings.ages.append(Exposure(position, stream.found(raw)).oldest_age())
            memory = Memory(raw)
            saved = service.manifest()
            boundary = restore_learner(saved.learner, saved.learner_config, saved.learner_state, None)
            if boundary.state_records != start:
                continue  # no checkpoint inside this batch yet
            window = range(position - service.step, position + 3 * service.step)
            batch = open_batch(memory, boundary, replay, stream.X, stream.y, window)
            findings.draw.append((draw_coordinates_found(memory, batch.draw),
                                  draw_coordinates_found(memory, replay.first_draw(t + 1)), batch.draw.size))
            if batch.live is None or batch.position is None:
                continue
            findings.live_found += 1
            encoded = base64_vectors(raw, batch.draw.size, "<i8" if integer else "<f8")
            findings.pairs.append((t, pairs(memory, encoded, batch).found))
            target = batch.position - 1  # the last record learned: its label is the coin
            rows = {}
            for label in (-1.0, 1.0):
                y = stream.y[start:stop].copy()
                y[target - start] = label
                rows[label] = gradient_rows(boundary, boundary._iterate.theta_md, stream.X[start:stop], y)
            guess = guess_label(memory, encoded, batch, target, rows)
            if guess is not None:
                findings.guesses.append((guess[0] == stream.y[target], guess[1]))
    return findings


def _first_manifest(service: Service):  # noqa: ANN202
    import time

    deadline = time.monotonic() + 60
    while not (service.process.out / "checkpoints" / "checkpoint.json").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no checkpoint")
        time.sleep(0.01)
    return service.manifest()


def assert_no_state_copies(findings: Findings, dumps: int) -> None:
    print(f"\n{findings.summary()}")
    assert findings.dumps >= dumps and findings.live_found >= dumps - 1, findings.summary()
    assert all(not found for _, found in findings.pairs), f"states of one batch in memory: {findings.pairs}"
    for found, chance, size in findings.draw:
        assert found <= max(2, chance + 1), f"{found} of {size} coordinates of the batch's draw in memory"
    correct = sum(c for c, _ in findings.guesses)
    assert not any(from_pair for _, from_pair in findings.guesses)
    assert audit_epsilon(correct, len(findings.guesses)) <= CLAIMED_EPSILON


def read_buffer_records(stream) -> int:  # noqa: ANN001
    """Records the file source's 64 KiB read buffer can hold (the file's read-ahead)."""
    per_record = min(len(m) for m in stream.messages()) / (RECORDS_PER_BINARY_MESSAGE if stream.fmt == "binary" else 1)
    return math.ceil(READ_BUFFER / per_record)


def file_service(tmp_path, fmt: str, n: int, learner: dict, seed: int = 1, source: dict | None = None) -> Service:
    stream = canary_stream(n, fmt, seed)
    if fmt == "binary":
        from panpriv.streamer.io.recording import RecordingWriter

        path = tmp_path / "stream.pprec"
        writer = RecordingWriter(path, "kafka://127.0.0.1:1/t?group=g", ["t/0"], {"t/0": 0}, "2026-01-01T00:00:00",
                                 cluster="cluster=canaries")
        for offset, message in enumerate(stream.messages()):
            writer.write("t/0", offset, 0, message)
        writer.close()
    else:
        path = stream.write_lines(tmp_path / f"stream.{fmt}")
    return Service(tmp_path / "svc", stream, f"file:{path}", learner, source=source, entropy_seed=SEED)


DUMPS = range(3, 10, 2)
"""The batches (0-based) dumped in ``make test``: four; the ``soak`` variant dumps 20."""


@pytest.mark.parametrize("noise", ["gaussian", pytest.param("secure", marks=pytest.mark.soak)])
def test_pan_acsa_service_keeps_one_state_of_a_batch_and_no_old_record(tmp_path, noise: str) -> None:
    """pan-acsa on a JSON file: in every dump, the live accumulator is the only state of its batch
    and the noise draw is not there; the game gets no more than the intrusion guarantee allows; no
    raw record is more than K micro-batches old. (The default noise here; secure noise, whose draw
    tests/protocols/test_memory_residue.py scans in ``make test``, in ``make soak``.)"""
    service = file_service(tmp_path, "json", 20_000, {"name": "pan-acsa", "options": {"noise": noise}})
    try:
        findings = attack(service, DUMPS)
    finally:
        service.stop()
    assert_no_state_copies(findings, 3)
    assert max(findings.ages) <= K * 256 + read_buffer_records(service.stream), findings.ages


@pytest.mark.soak
@pytest.mark.parametrize("noise", ["gaussian", "secure"])
def test_soak_pan_acsa_service_over_a_long_stream(tmp_path, noise: str) -> None:
    """The same in each of 22 consecutive batches of an 80,000-record stream."""
    service = file_service(tmp_path, "json", 80_000, {"name": "pan-acsa", "options": {"noise": noise}})
    try:
        findings = attack(service, range(3, 25))
    finally:
        service.stop()
    assert_no_state_copies(findings, 15)
    assert max(findings.ages) <= K * 256 + read_buffer_records(service.stream), findings.ages


@pytest.mark.parametrize("fmt", ["csv", "binary"])
def test_the_input_path_keeps_k_micro_batches_of_each_format(tmp_path, fmt: str) -> None:
    """CSV lines and binary batches (8 records a message, micro-batches of 25 messages): no raw
    record — text, float64 or float32 values — more than K micro-batches behind the position."""
    messages = 25 if fmt == "binary" else 256  # micro-batches of at most 200 or 256 records: dumps fall inside batches
    service = file_service(tmp_path, fmt, 16_000, {"name": "pan-acsa"}, source={"batch_records": messages})
    per_micro_batch = messages * (RECORDS_PER_BINARY_MESSAGE if fmt == "binary" else 1)
    try:
        findings = attack(service, range(4, 9, 4))
    finally:
        service.stop()
    print(f"\n{fmt}: {findings.summary()}")
    assert findings.dumps >= 1 and max(findings.ages) <= K * per_micro_batch + read_buffer_records(service.stream), findings.ages
    assert all(not found for _, found in findings.pairs)


FETCHES_HELD = 2
"""Fetch responses' worth of records a Kafka client may hold behind the position: the response
being consumed (kafka-python keeps it whole until its last record is consumed) and the one before
it, still referenced while the driver decodes (docs/privacy.md, "The input path")."""


def fetched_records(stream, fetch: int) -> int:  # noqa: ANN001
    """Records :data:`FETCHES_HELD` fetch responses of ``fetch`` bytes can hold."""
    per_record = min(len(m) for m in stream.messages()) / (RECORDS_PER_BINARY_MESSAGE if stream.fmt == "binary" else 1)
    return math.ceil(FETCHES_HELD * fetch / per_record)


def kafka_service(kafka_broker, tmp_path, unique_name, fmt: str, n: int, client: str) -> tuple[Service, int]:  # noqa: ANN001
    """pan-acsa on a topic of the real broker holding a canary stream; the fetch size it reads with."""
    from kafka import KafkaProducer

    stream = canary_stream(n, fmt, seed=2)
    topic = kafka_broker.create_topic(unique_name("canaries"), 1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=20, batch_size=64 * 1024)
    for message in stream.messages():
        producer.send(topic, message, partition=0)
    producer.flush()
    producer.close()
    fetch = 256 * 1024
    kafka = ({"client": "confluent", "librdkafka": {"fetch.max.bytes": fetch, "max.partition.fetch.bytes": fetch,
                                                     "message.max.bytes": fetch, "queued.max.messages.kbytes": fetch // 1024}}
             if client == "confluent" else {"consumer": {"fetch_max_bytes": fetch, "max_partition_fetch_bytes": fetch}})
    url = f"kafka://{kafka_broker.bootstrap}/{topic}?group={unique_name('g')}"
    messages = 25 if fmt == "binary" else 256
    # A session long enough that a dump's pause (the analysis runs while the service is stopped) does
    # not make the group rebalance.
    source = {"batch_records": messages, "session_timeout_ms": 120_000}
    return Service(tmp_path / "svc", stream, url, {"name": "pan-acsa", "n": n}, source=source, kafka=kafka,
                   entropy_seed=SEED), fetch


@pytest.mark.integration
def test_kafka_source_keeps_k_micro_batches_and_one_fetch(kafka_broker, tmp_path, unique_name) -> None:
    """The real broker (kafka-python): the same pan-acsa attack, and no raw record older than K
    micro-batches plus the fetch response being consumed (``fetch_max_bytes`` = 256 KiB here:
    kafka-python keeps a fetched response whole until its last record is consumed)."""
    service, fetch = kafka_service(kafka_broker, tmp_path, unique_name, "json", 20_000, "kafka-python")
    try:
        findings = attack(service, DUMPS)
    finally:
        service.stop()
    assert_no_state_copies(findings, 3)
    assert max(findings.ages) <= K * 256 + fetched_records(service.stream, fetch), findings.ages


@pytest.mark.integration
@pytest.mark.soak
@pytest.mark.parametrize(("fmt", "client"), [("csv", "kafka-python"), ("binary", "kafka-python"), ("json", "confluent")])
def test_soak_kafka_formats_and_clients(kafka_broker, tmp_path, unique_name, fmt: str, client: str) -> None:
    """CSV and binary records on the broker, and the confluent-kafka client: the same bounds (one
    fetch: ``fetch.max.bytes`` for librdkafka)."""
    service, fetch = kafka_service(kafka_broker, tmp_path, unique_name, fmt, 24_000, client)
    per_micro_batch = 25 * RECORDS_PER_BINARY_MESSAGE if fmt == "binary" else 256
    try:
        findings = attack(service, range(3, 12, 2))
    finally:
        service.stop()
    print(f"\n{fmt} over {client}: {findings.summary()}")
    assert all(not found for _, found in findings.pairs)
    assert max(findings.ages) <= K * per_micro_batch + fetched_records(service.stream, fetch), findings.ages


def test_shuffle_learner_keeps_k_micro_batches(tmp_path) -> None:
    """shuffle-gaussian on a JSON file: the input path keeps the same K micro-batches."""
    service = file_service(tmp_path, "json", 12_000, {"name": "shuffle-gaussian"})
    try:
        service.wait_for(1)
        ages = []
        for position in (4_000, 8_000):
            service.wait_for(position)
            with service.paused() as raw:
                ages.append(Exposure(service.position_before_pause, service.stream.found(raw)).oldest_age())
    finally:
        service.stop()
    print(f"\nshuffle-gaussian: oldest record behind the position {ages}")
    assert max(ages) <= K * 256 + read_buffer_records(service.stream), ages
