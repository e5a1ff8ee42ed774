"""panpriv.streamer.sources and panpriv.streamer.io.recording: positions, resumption, contiguous ranges."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.config import load_config
from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.io.recording import RecordingReader, RecordingWriter
from panpriv.streamer.io.source_url import AdultUrl, FileUrl, KafkaUrl, SyntheticUrl, parse_kafka_url, parse_source_url, parse_synthetic_url
from panpriv.streamer.sources.base import Batch, iter_batches
from panpriv.streamer.sources.open import open_source


def config(url: str, **extra):
    return load_config(None, {"source.url": url, "records.dim": 2, "records.feature_bound": 1.0, **extra})


def consume(cfg, positions=None, batch=3):
    source = open_source(cfg.source, make_codec(cfg.records), positions or {})
    try:
        return list(iter_batches(source, batch))
    finally:
        source.close()


def ranges(batches: list[Batch]) -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for b in batches:
        for key, r in b.ranges.items():
            out.setdefault(key, []).append(r)
    return out


def assert_contiguous(spans: list[tuple[int, int]], start: int, stop: int) -> None:
    assert spans[0][0] == start and spans[-1][1] == stop
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("compress", [False, True])
def test_line_file_positions_and_resume(tmp_path, compress) -> None:
    lines = [json.dumps({"x": [i / 10, 0], "y": 1}) for i in range(10)]
    lines.insert(4, "")  # a blank line is not a record but occupies a position
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / ("r.jsonl.gz" if compress else "r.jsonl")
    path.write_bytes(gzip.compress(data) if compress else data)
    cfg = config(f"file:{path}")
    batches = consume(cfg)
    key = f"file:{path.resolve()}"
    assert_contiguous(ranges(batches)[key], 0, 11)
    assert sum(len(b.payloads) for b in batches) == 10
    source = open_source(cfg.source, make_codec(cfg.records), {})
    assert source.total_positions() == 11 and source.count_records() == 10
    source.close()
    # Resuming at position 6 yields exactly the payloads an uninterrupted read had from 6 on.
    resumed = consume(cfg, {key: 6})
    assert_contiguous(ranges(resumed)[key], 6, 11)
    assert [p for b in resumed for p in b.payloads] == [line.encode() for line in lines[6:]]


def test_csv_header_is_not_a_record(tmp_path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("a,b,label\n0.1,0.2,1\n0.3,0.4,-1\n")
    cfg = config(f"file:{path}", **{"records.csv_header": True})
    assert cfg.records.format == "csv"
    batches = consume(cfg)
    assert ranges(batches)[f"file:{path.resolve()}"] == [(1, 3)]
    assert [p for b in batches for p in b.payloads] == [b"0.1,0.2,1", b"0.3,0.4,-1"]


def test_missing_file_and_short_file(tmp_path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        consume(config(f"file:{tmp_path / 'nope.jsonl'}"))
    path = tmp_path / "r.jsonl"
    path.write_text("{}\n")
    with pytest.raises(SourceError, match="checkpoint's position is 5"):
        consume(config(f"file:{path}"), {f"file:{path.resolve()}": 5})


def test_synthetic_stream_is_a_function_of_seed_and_position() -> None:
    cfg = config("synthetic:n=10000&dim=2&seed=4")
    whole = consume(cfg, batch=10000)
    pieces = consume(cfg, {"synthetic:seed=4,dim=2": 4321}, batch=999)
    X_whole = whole[0].arrays[0]
    X_rest = np.vstack([b.arrays[0] for b in pieces])
    np.testing.assert_array_equal(X_whole[4321:], X_rest)
    assert_contiguous(ranges(pieces)["synthetic:seed=4,dim=2"], 4321, 10000)
    labels = np.concatenate([whole[0].arrays[1]])
    assert set(np.unique(labels)) == {-1.0, 1.0}


def test_recording_replays_under_the_original_keys_and_offsets(tmp_path) -> None:
    path = tmp_path / "t.pprec"
    writer = RecordingWriter(path, "kafka://h:1/t", ["t/0", "t/1"], {"t/0": 5, "t/1": 0}, "now")
    frames = [("t/0", 5), ("t/1", 0), ("t/0", 6), ("t/1", 1), ("t/1", 3), ("t/0", 7)]  # t/1 has a gap at 2
    for i, (key, offset) in enumerate(frames):
        writer.write(key, offset, 1_000 + i, json.dumps({"x": [0, 0], "y": 1}).encode())
    writer.close()
    assert RecordingReader(path).count() == 6
    cfg = config(f"file:{path}")
    spans = ranges(consume(cfg, batch=2))
    assert_contiguous(spans["t/0"], 5, 8)
    assert_contiguous(spans["t/1"], 0, 4)  # the gap is inside the consumed range
    resumed = consume(cfg, {"t/0": 7, "t/1": 1})
    assert [(k, p) for b in resumed for k, p in zip(b.keys, b.positions)] == [("t/1", 1), ("t/1", 3), ("t/0", 7)]
    assert ranges(resumed) == {"t/1": [(1, 4)], "t/0": [(7, 8)]}


def test_recorded_pace_follows_timestamps(tmp_path) -> None:
    path = tmp_path / "t.pprec"
    writer = RecordingWriter(path, "kafka://h:1/t", ["t/0"], {"t/0": 0}, "now")
    for i in range(3):
        writer.write("t/0", i, 1_000_000 + 150 * i, b"{}")
    writer.close()
    cfg = config(f"file:{path}", **{"source.recorded_pace": True})
    t0 = time.monotonic()
    batches = consume(cfg, batch=10)
    assert sum(len(b.payloads) for b in batches) == 3
    assert time.monotonic() - t0 >= 0.29  # 300 ms of recorded time


def test_url_parsing() -> None:
    url = parse_kafka_url("kafka://h1:9092,h2:9092/a,b?group=g1")
    assert (url.bootstrap, url.topics, url.group) == (["h1:9092", "h2:9092"], ["a", "b"], "g1")
    # issue 15 (8): credentials were silently dropped (an unauthenticated connection); now refused, unprinted
    with pytest.raises(SourceError, match="carries credentials") as refused:
        parse_kafka_url("kafka://user:secret@h1:9092,h2:9092/a,b?group=g1")
    assert "secret" not in str(refused.value)
    assert parse_kafka_url("kafka://h:1/t").group == "panpriv"
    for bad in ("kafka://h:1/", "kafka:///t", "kafka://h:1/t?grp=x"):
        with pytest.raises(SourceError):
            parse_kafka_url(bad)
    assert parse_synthetic_url("synthetic:n=5&dim=3") == {"n": 5, "dim": 3, "seed": 0}
    with pytest.raises(SourceError):
        parse_synthetic_url("synthetic:n=0&dim=3")


@pytest.mark.integration
def test_kafka_lag_comes_from_the_fetched_high_watermark(kafka_broker, unique_name) -> None:
    """Lag = high watermark − our position, per assigned partition, without a request to the broker
    once the partition has been fetched (so the processor can refresh it every few seconds)."""
    from kafka import KafkaProducer

    from panpriv.streamer.sources.kafka import KafkaSource

    topic = kafka_broker.create_topic(unique_name("lag"), partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    for i in range(300):
        producer.send(topic, json.dumps({"x": [0.0, 0.1], "y": 1}).encode(), partition=0)
    producer.flush()
    producer.close()
    cfg = config(f"kafka://{kafka_broker.bootstrap}/{topic}?group={unique_name('g')}", **{"source.batch_records": 100})
    source = open_source(cfg.source, make_codec(cfg.records), {})
    assert isinstance(source, KafkaSource)
    try:
        consumed = 0
        deadline = time.monotonic() + 60
        while consumed < 100 and time.monotonic() < deadline:
            batch = source.poll(100 - consumed, 0.5)
            consumed += len(batch.payloads) if batch else 0
        assert consumed == 100

        def no_request(*args, **kwargs):
            raise AssertionError("lag() asked the broker for end offsets")

        source._consumer.end_offsets = no_request  # type: ignore[method-assign]
        assert source.lag() == {f"{topic}/0": 200}
    finally:
        source.close()


@pytest.mark.integration
def test_kafka_python_keeps_fetching_the_busy_partition_beside_idle_ones(kafka_broker, unique_name) -> None:
    """Every record in partition 0 of a 4-partition topic, several fetches' worth, read in
    micro-batches smaller than a fetch: the source drains each fetch response in one consumer
    poll, so kafka-python's next fetch request includes partition 0 instead of holding only the
    idle partitions, which the broker answers after ``fetch_max_wait_ms`` (issue 37: 5,400 instead
    of 66,000 records/s at the default 500 ms). Set to 30 s here, one such wait would exceed the
    test's deadline (before the fix: 3 waits); the records come in order, each once, in
    micro-batches of at most ``batch_records`` messages."""
    from kafka import KafkaProducer

    from panpriv.streamer.config import KafkaConfig
    from panpriv.streamer.kafka import client as kafka_client
    from panpriv.streamer.sources.kafka import KafkaSource

    topic = kafka_broker.create_topic(unique_name("idle"), partitions=4)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5, batch_size=16384)
    n = 20_000  # about 9 MB: the broker answers in about 2 MB fetches
    for i in range(n):
        producer.send(topic, json.dumps({"x": [0.123456789012345678] * 19 + [i / n], "y": 1}).encode(), partition=0)
    producer.flush()
    producer.close()
    kafka_client.configure(KafkaConfig(consumer={"fetch_max_wait_ms": 30_000, "request_timeout_ms": 60_000}))
    cfg = config(f"kafka://{kafka_broker.bootstrap}/{topic}?group={unique_name('g')}", **{"records.dim": 20})
    limit = cfg.source.batch_records
    try:
        source = open_source(cfg.source, make_codec(cfg.records), {})
        assert isinstance(source, KafkaSource)
        try:
            offsets: list[int] = []
            joined = time.monotonic() + 60  # the group join, then the records
            while not offsets and time.monotonic() < joined:
                batch = source.poll(limit, 0.5)
                offsets += batch.positions if batch else []
            deadline = time.monotonic() + 25  # less than one fetch_max_wait_ms
            while len(offsets) < n and time.monotonic() < deadline:
                batch = source.poll(limit, 0.5)
                if batch is not None:
                    assert len(batch.payloads) <= limit and set(batch.keys) == {f"{topic}/0"}
                    offsets += batch.positions
        finally:
            source.close()
    finally:
        kafka_client.configure(KafkaConfig())
    assert offsets == list(range(n))


def test_a_recording_of_binary_batches_counts_records_not_messages(tmp_path) -> None:
    """The public n of a recorded stream is its number of records: a binary batch message holds
    many (its header says how many), a malformed message counts as one."""
    from panpriv.streamer.io.codec import encode_batch

    path = tmp_path / "b.pprec"
    writer = RecordingWriter(path, "test", ["b/0"], {"b/0": 0}, "now")
    for offset, message in enumerate([encode_batch(np.zeros((7, 2)), np.ones(7)), b"junk", encode_batch(np.zeros((0, 2)), np.ones(0)),
                                      encode_batch(np.zeros((300, 2)), np.ones(300), "float64")]):
        writer.write("b/0", offset, 0, message)
    writer.close()
    for fmt, expected in (("binary", 7 + 1 + 0 + 300), ("json", 4)):
        cfg = config(f"file:{path}", **{"records.format": fmt})
        source = open_source(cfg.source, make_codec(cfg.records), {})
        assert (source.count_records(), source.total_positions()) == (expected, 4)
        source.close()


def test_local_sources_bound_a_poll_in_payload_bytes(tmp_path) -> None:
    """A poll stops once it has read max_bytes payload bytes (so it exceeds them by less than one
    message, and holds at least one), so a micro-batch of large messages stays small; the
    positions stay contiguous."""
    from panpriv.streamer.io.codec import encode_batch

    lines = tmp_path / "r.jsonl"
    lines.write_text("".join(json.dumps({"x": [i / 10, 0], "y": 1}) + "\n" for i in range(10)))  # 25 bytes
    recording = tmp_path / "b.pprec"
    writer = RecordingWriter(recording, "test", ["b/0"], {"b/0": 0}, "now")
    for offset in range(5):
        writer.write("b/0", offset, 0, encode_batch(np.zeros((100, 2)), np.ones(100)))  # 1,212 bytes
    writer.close()
    for path, fmt, max_bytes, per_poll in ((lines, "json", 60, 3), (recording, "binary", 2_000, 2), (recording, "binary", 1, 1)):
        cfg = config(f"file:{path}", **{"records.format": fmt})
        source = open_source(cfg.source, make_codec(cfg.records), {})
        polls = []
        while (batch := source.poll(1000, 0.1, max_bytes)) is not None:
            polls.append(batch)
        source.close()
        assert [len(b.payloads) for b in polls[:-1]] == [per_poll] * (len(polls) - 1)
        (key,) = ranges(polls)
        assert_contiguous(ranges(polls)[key], 0, 10 if fmt == "json" else 5)


def test_source_urls_parse_once_into_their_kind() -> None:
    assert parse_source_url("kafka://h:1,h:2/a,b?group=g") == KafkaUrl(["h:1", "h:2"], ["a", "b"], "g")
    assert parse_source_url("file:/data/x.jsonl") == FileUrl(Path("/data/x.jsonl"))
    assert parse_source_url("file:///data/x.jsonl") == FileUrl(Path("/data/x.jsonl"))
    assert parse_source_url("adult:test") == AdultUrl("test")
    assert parse_source_url("synthetic:n=10&dim=3") == SyntheticUrl(10, 3, 0)
    for url, message in (
        ("adult:validation", "expected adult:train or adult:test"),
        ("s3://bucket/key", "unknown source 's3://bucket/key'"),
        ("kafka://u:secret@h:1/t", r"carries credentials"),
        ("synthetic:n=0&dim=3", "expected synthetic:n=N&dim=D"),
    ):
        with pytest.raises(SourceError, match=message) as info:
            parse_source_url(url)
        assert "secret" not in str(info.value)


def test_a_content_key_names_the_multiset_of_records_and_the_order_names_the_sequence() -> None:
    """ContentDigest (panpriv.streamer.sources.identity): the key does not depend on the order of
    the records, the order digest does; multiplicity counts (a record twice is another multiset)."""
    import numpy as np

    from panpriv.streamer.sources.identity import ContentDigest

    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((50, 4)), np.where(rng.random(50) > 0.5, 1.0, -1.0)

    def identity(order: np.ndarray, chunks: int = 1):
        digest, position = ContentDigest(), 0
        for part in np.array_split(order, chunks):
            digest.add(np.arange(position, position + len(part), dtype=np.int64), X[part].copy(), y[part].copy())
            position += len(part)
        return digest.identity()

    forward = identity(np.arange(50))
    shuffled = identity(rng.permutation(50), chunks=3)
    assert forward.key == shuffled.key and forward.records == shuffled.records == 50
    assert forward.order != shuffled.order
    assert identity(np.arange(49)).key != forward.key
    assert identity(np.r_[np.arange(50), [7]]).key != forward.key  # record 7 twice
    copy = X.copy()
    ContentDigest().add(np.arange(50, dtype=np.int64), copy, y.copy())
    assert not copy.any()  # the records are wiped once digested


def test_a_slow_reader_polls_kafka_python_within_its_rebalance_timeout(kafka_broker, unique_name, monkeypatch) -> None:
    """A reader slower than the drain (``--rate``, a paced or waiting scale-out worker) got no
    consumer poll while 16 drained micro-batches were handed out: past ``max_poll_interval_ms``
    kafka-python left the group, commits failed, and another member read and published the same
    records again. A drain older than DRAIN_MAX_AGE_S (0.5 s here) is fetched again: the consumer
    is polled within it, and the records still come in order, each once."""
    from panpriv.streamer.sources import kafka as kafka_source

    topic = kafka_broker.create_topic(unique_name("slow"), partitions=1)
    n = 400
    _produce_numbered(kafka_broker, topic, n, 1)
    monkeypatch.setattr(kafka_source, "DRAIN_MAX_AGE_S", 0.5)
    cfg = config(f"kafka://{kafka_broker.bootstrap}/{topic}?group={unique_name('g')}", **{"records.dim": 2})
    source = open_source(cfg.source, make_codec(cfg.records), {})
    assert isinstance(source, kafka_source.KafkaSource)
    polls: list[float] = []
    original = source._consumer.poll

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - kafka-python's signature
        polls.append(time.monotonic())
        return original(*args, **kwargs)

    source._consumer.poll = counted  # the instance's attribute, as the source calls it
    try:
        offsets: list[int] = []
        deadline = time.monotonic() + 90  # the group join, then 40 slow micro-batches
        while len(offsets) < n and time.monotonic() < deadline:
            batch = source.poll(10, 0.5)  # a drain holds up to 160 records: 16 slow micro-batches
            if batch is not None:
                offsets += batch.positions
                time.sleep(0.3)
    finally:
        source.close()
    assert offsets == list(range(n))
    gaps = [b - a for a, b in zip(polls, polls[1:])]
    # Without the age: a drain of 16 micro-batches, 4.8 s between polls; with it, its age (0.5 s)
    # plus one slow micro-batch, the poll and a loaded machine's delays.
    assert max(gaps) < 3.0, gaps


def _kafka_source(kafka_broker, topic: str, group: str, client: str, on_revoke=None, session_timeout_ms: int = 6000):
    """A Kafka source of ``topic`` on ``client``, read by ``group``, with a short session timeout."""
    from panpriv.streamer.sources.confluent import ConfluentKafkaSource
    from panpriv.streamer.sources.kafka import KafkaSource

    cfg = config(f"kafka://{kafka_broker.bootstrap}/{topic}?group={group}", **{"source.session_timeout_ms": session_timeout_ms})
    url = parse_kafka_url(cfg.source.url)
    kind = ConfluentKafkaSource if client == "confluent-kafka" else KafkaSource
    return kind(url, cfg.source, {}, on_revoke)


def _produce_numbered(kafka_broker, topic: str, n: int, partitions: int) -> None:
    """Records i = 0 … n − 1 (``x`` = [i/n, 0]), record i into partition i mod ``partitions``."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=5)
    for i in range(n):
        producer.send(topic, json.dumps({"x": [i / n, 0.0], "y": 1}).encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def _read(source, want: int, deadline_s: float, into: dict[str, list[int]]) -> None:
    """Poll ``source`` until ``into`` holds ``want`` more offsets (per key, in the order read)."""
    before = sum(len(offsets) for offsets in into.values())
    deadline = time.monotonic() + deadline_s
    while sum(len(offsets) for offsets in into.values()) - before < want and time.monotonic() < deadline:
        batch = source.poll(10, 0.2)
        if batch is not None:
            for key, position in zip(batch.keys, batch.positions, strict=True):
                into.setdefault(key, []).append(position)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_keep_alive_keeps_a_waiting_reader_in_its_group_and_moves_no_position(kafka_broker, unique_name, monkeypatch,
                                                                               client) -> None:
    """A reader that waits without reading for 2.5 times max_poll_interval (6 s here), calling
    only keep_alive: it stays in its group (a strict commit, as before a revocation, succeeds; no
    revocation), and reads on from exactly where it stopped — what kafka-python had drained and not
    handed out included — every record once, in order. Without keep_alive the client left the
    group and the strict commit failed (a scale-out worker waiting through a coordinator outage
    stopped)."""
    from panpriv.streamer.sources import confluent as confluent_source
    from panpriv.streamer.sources import kafka as kafka_source

    for module in (kafka_source, confluent_source):
        monkeypatch.setattr(module, "REBALANCE_TIMEOUT_MS", 6000)
    topic = kafka_broker.create_topic(unique_name("alive"), partitions=1)
    n = 400
    _produce_numbered(kafka_broker, topic, n, 1)
    revoked: list[float] = []
    source = _kafka_source(kafka_broker, topic, unique_name("g"), client, on_revoke=lambda: revoked.append(time.monotonic()))
    try:
        offsets: dict[str, list[int]] = {}
        _read(source, 30, 60, offsets)  # the group join, then the first micro-batches
        positions = dict(source._positions)
        polled_at = []
        waited = time.monotonic()
        while time.monotonic() - waited < 15.0:
            source.keep_alive()
            polled_at.append(source._polled_at)
            time.sleep(0.05)
        source.acknowledge(positions, strict=True)  # FatalSourceError if the consumer left its group
        assert source._positions == positions and not revoked
        keep_alives = sorted(set(polled_at))  # every heartbeat interval (1.5 s): 10 in 15 s
        assert len(keep_alives) >= 5 and max(b - a for a, b in zip(keep_alives, keep_alives[1:])) < 4.0, keep_alives
        _read(source, n - sum(len(o) for o in offsets.values()), 60, offsets)
    finally:
        source.close()
    assert offsets == {f"{topic}/0": list(range(n))}, {key: len(o) for key, o in offsets.items()}
    assert not revoked


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_a_rebalance_in_keep_alive_goes_through_on_revoke(kafka_broker, unique_name, client) -> None:
    """A second member joins while the first only calls keep_alive: the first's on_revoke runs
    inside keep_alive (it commits its positions, as panpriv run's revocation checkpoint does), the
    group settles, and the two members read every record exactly once between them."""
    topic = kafka_broker.create_topic(unique_name("alive"), partitions=2)
    n = 400
    _produce_numbered(kafka_broker, topic, n, 2)
    group = unique_name("g")
    revoked: list[float] = []

    def commit_first() -> None:
        revoked.append(time.monotonic())
        first.acknowledge(dict(first._positions), strict=True)

    first = _kafka_source(kafka_broker, topic, group, client, on_revoke=commit_first)
    second = None
    try:
        offsets: dict[str, list[int]] = {}
        _read(first, 40, 60, offsets)
        second = _kafka_source(kafka_broker, topic, group, client)
        theirs: dict[str, list[int]] = {}
        deadline = time.monotonic() + 90
        while not (revoked and theirs) and time.monotonic() < deadline:
            first.keep_alive()
            batch = second.poll(10, 0.1)
            if batch is not None:
                for key, position in zip(batch.keys, batch.positions, strict=True):
                    theirs.setdefault(key, []).append(position)
        assert revoked and theirs, (revoked, theirs)
        for _ in range(200):  # both read on until every record is read
            _read(first, 1, 0.2, offsets)
            _read(second, 1, 0.2, theirs)
            if sum(len(o) for o in (*offsets.values(), *theirs.values())) >= n:
                break
    finally:
        first.close()
        if second is not None:
            second.close()
    read = sorted((key, offset) for part in (offsets, theirs) for key, o in part.items() for offset in o)
    assert read == sorted((f"{topic}/{p}", i) for p in range(2) for i in range(n // 2)), (len(read), len(set(read)))
