"""Benchmark of the scale-out roles (streamer/scaleout; Cheu et al. 2022 Alg. 6 on K workers):
records/s with 1, 2 and 3 workers on the real broker, and a per-message cost model projecting
throughput and noise for 8–64 workers.

    PYTHONPATH=. .venv/bin/python benchmarks/scaleout.py          # starts the test suite's Tansu broker
    PYTHONPATH=. .venv/bin/python benchmarks/scaleout.py --quick
    PYTHONPATH=. .venv/bin/python benchmarks/scaleout.py --client confluent-kafka

The workers read through ``panpriv run``'s Kafka source on the client ``--client`` names
(``[kafka] client``; ``both``, the default, runs 1, 2, 3 workers on each, side by side; the cost
model is fitted to the first client's runs).

**Measured** (d = 20, logistic loss, ε = 1, δ = 1e-6, JSON records on a 6-partition topic holding 2n records, the
stream planned for n records): one coordinator and K worker processes (``panpriv coordinate`` /
``panpriv worker``) against the broker, all on this machine. Records/s is the steady state:
records stepped on between the model versions 1 and last over the time between their
publications (Kafka record timestamps), so process start-up and the consumer-group join are left
out. On a 2-core machine the K workers, the coordinator and the broker share two cores.

**Cost model.** A step of b records on K workers (w = ⌊b/K⌋ each, one worker per machine) takes
``t(K) = c_fixed + w·c_w + K·c_msg``:

* ``c_msg``: the coordinator's cost per noisy mean (parse + combine; the step amortised), in process;
* ``c_fixed``: what every step pays once whatever w — two trips through the broker (the model
  version out to the workers, the last mean in: produce with acks=all, then a fetch that waits at
  most 10 ms), measured on the broker, plus the worker's durable budget write at the end of its
  batch (the mark; its polls are charged ahead, one write per eight, so those are left to c_w) and
  its state save (``worker.json`` with the store's mark: an atomic file write), measured in process;
* ``c_w``: the worker's cost per record *including the fetch* — fitted (least squares through the
  origin) to the three measured runs after subtracting c_fixed and K·c_msg; the in-process cost
  of JSON decode + the fused gradient path alone is printed for comparison.

Projected records/s = K·w/t(K). It assumes one worker per machine, a broker that keeps up and a
partition per worker; it ignores stale means (none when every worker keeps up). Noise: the step
gradient's per-coordinate std √(2/K)·ζ(w) for the plan each K gets (``plan_for_workers``), against
K = 1 — ×√K at a fixed b, less because the plan takes larger b for larger noise.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.protocols.pan_acsa_scaleout import step_noise_std, worker_batch
from panpriv.streamer.config import RecordsConfig
from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.io.formats import make_codec
from panpriv.streamer.scaleout.coordinator import Coordinator
from panpriv.streamer.scaleout.wire import GradientRecord, ModelVersion

if TYPE_CHECKING:
    from tests.realparts import KafkaBroker

DIM, EPSILON, DELTA = 20, 1.0, 1e-6


def learner(n: int, workers: int) -> PanPrivateACSA:
    model = PanPrivateACSA(dim=DIM, loss="logistic", epsilon=EPSILON, delta=DELTA, horizon=n, radius=math.sqrt(DIM))
    model.plan_for_workers(workers)
    return model


def per_record_cost(repeats: int = 5) -> float:
    """Seconds per record of a worker's batch work: JSON decode + add_to_batch."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, DIM)) / math.sqrt(DIM)
    payloads = [encode_json(row, 1.0) for row in X.tolist()]
    codec = make_codec(RecordsConfig.model_validate({"format": "json", "dim": DIM, "feature_bound": 1.0}))
    model = learner(100_000, 1)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        decoded = codec.decode(payloads)
        model.open_batch(2000)
        model.add_to_batch(decoded.X, decoded.y, 2000)
        model.close_batch(2000)
        best = min(best, time.perf_counter() - start)
    return best / len(payloads)


def per_message_cost(repeats: int = 3) -> float:
    """Seconds per noisy mean at the coordinator: parse + handle (the step amortised over K = 64)."""
    coordinator = Coordinator(learner(10**7, 64), 64, "bench")
    p = coordinator.learner.param_count
    best = math.inf
    for _ in range(repeats):
        values = [GradientRecord("bench", coordinator.version, "w", coordinator.worker_batch, np.full(p, 0.01), {"k": (0, 1)}).to_json()
                  for _ in range(64)]
        start = time.perf_counter()
        for i, value in enumerate(values):
            coordinator.handle(value, i)
        best = min(best, time.perf_counter() - start)
    return best / 64


def budget_write_cost(workdir: Path, repeats: int = 20) -> float:
    """Seconds for one durable budget write (a charge extending a range: one SQLite commit + fsync)."""
    from panpriv.streamer.budget.store import BudgetStore

    store = BudgetStore(workdir / "budget-bench")
    try:
        start = time.perf_counter()
        for i in range(repeats):
            store.charge("bench", {"kafka:bench/t/0": (i, i + 1)})
        return (time.perf_counter() - start) / repeats
    finally:
        store.close()


def state_write_cost(workdir: Path, repeats: int = 20) -> float:
    """Seconds for one save of a worker's sealed state (``worker.json`` with the store's mark)."""
    from panpriv.streamer.scaleout.worker import worker_state

    state = worker_state(workdir / "state-bench")
    start = time.perf_counter()
    for i in range(repeats):
        state.save({"instance": "scaleout:bench/worker-0"}, budget_mark={"store": "00" * 16, "generation": i})
    return (time.perf_counter() - start) / repeats


def broker_trip(broker: KafkaBroker, repeats: int = 20) -> float:
    """Seconds from a produce (acks=all) to a consumer (fetch_max_wait_ms = 10) holding the record."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = broker.create_topic(f"trip-{uuid.uuid4().hex[:8]}")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, fetch_max_wait_ms=10)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.poll(timeout_ms=100)
    trips = []
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            producer.send(topic, b"x" * 600).get(timeout=30)
            while not consumer.poll(timeout_ms=100):
                pass
            trips.append(time.perf_counter() - start)
    finally:
        producer.close()
        consumer.close()
    return float(np.median(trips))


CLIENTS = {"kafka-python": "kafka-python", "confluent-kafka": "confluent"}
"""``--client`` → the ``[kafka] client`` setting the workers are started with."""


def measure(broker: KafkaBroker, n: int, workers: int, workdir: Path, client: str = "kafka-python") -> dict[str, float]:
    """One run of K workers (on ``client``) + a coordinator; steady-state records/s from the model topic."""
    from tests.scaleout import parts

    # Six partitions (an equal share for 1, 2 or 3 workers) and twice the planned records, so that
    # no worker runs dry before the plan is done (a dry worker leaves the others two batches per
    # version, each after a --sync-wait).
    names = parts.topics(broker, lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}", partitions=6)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2 * n, DIM)) / math.sqrt(DIM) * 1.5
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    parts.produce(broker.bootstrap, names["data"], X, y, partitions=6)
    run = workdir / f"{client}-k{workers}"
    run.mkdir()
    config = run / "kafka.toml"
    config.write_text(f'[kafka]\nclient = "{CLIENTS[client]}"\n')
    coordinator = parts.start_coordinator(run, broker, names, n, workers)
    procs = [parts.start_worker(run, broker, names, i, more=("--config", str(config))) for i in range(workers)]
    try:
        parts.wait_all(coordinator, procs, 600)
    finally:
        for process in (*procs, coordinator):
            process.stop()
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
    tp = TopicPartition(names["model"], 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    stamps: dict[int, tuple[float, int]] = {}
    while consumer.position(tp) < end:
        for records in consumer.poll(timeout_ms=500).values():
            for record in records:
                model = ModelVersion.from_json(record.value)
                stamps.setdefault(model.version, (record.timestamp / 1000.0, model.records))
    consumer.close()
    last = max(stamps)
    (t1, r1), (t2, r2) = stamps[1], stamps[last]
    return {"records/s": (r2 - r1) / (t2 - t1), "versions": float(last), "step_s": (t2 - t1) / (last - 1),
            "b": float(r2 - r1) / (last - 1), "records": float(stamps[last][1])}


def store_writes() -> int:
    """Write transactions of the budget store in ``$PANPRIV_STATE_DIR`` so far (its generation)."""
    from panpriv.streamer.budget.store import BudgetStore, default_state_dir

    store = BudgetStore(default_state_dir())
    try:
        return store.generation
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 30,000 instead of 120,000")
    parser.add_argument("--client", choices=(*CLIENTS, "both"), default="both", help="the workers' Kafka client")
    args = parser.parse_args()
    clients = list(CLIENTS) if args.client == "both" else [args.client]
    n = 30_000 if args.quick else 120_000
    c_rec, c_msg = per_record_cost(), per_message_cost()
    print(f"in process: worker {c_rec * 1e6:.2f} µs/record (JSON decode + fused gradient); coordinator "
          f"{c_msg * 1e6:.1f} µs per noisy mean")
    from tests.realparts import KafkaBroker

    runs: dict[str, dict[int, dict[str, float]]] = {client: {} for client in clients}
    with tempfile.TemporaryDirectory() as workdir:
        os.environ["PANPRIV_STATE_DIR"] = str(Path(workdir) / "state")  # the workers' budget store: not the user's
        fsync = budget_write_cost(Path(workdir)) + state_write_cost(Path(workdir))
        broker = KafkaBroker(Path(workdir))
        try:
            trip = broker_trip(broker)
            print(f"durable budget write and state save {fsync * 1e3:.2f} ms; broker trip (produce acks=all -> fetched) {trip * 1e3:.2f} ms")
            for workers in (1, 2, 3):
                for client in clients:  # side by side: each K on every client before the next K
                    writes = store_writes()
                    m = runs[client][workers] = measure(broker, n, workers, Path(workdir), client)
                    print(f"K = {workers}, {client}: {m['records/s']:,.0f} records/s ({m['versions']:.0f} versions, "
                      f"{m['step_s'] * 1e3:.0f} ms per step of {m['b']:,.0f} records); budget store writes "
                          f"{(store_writes() - writes) / m['records']:.4f} per record")
        finally:
            broker.stop()
    print(f"\n| K | {' | '.join(f'records/s, workers on {client}' for client in clients)} |")
    print(f"|---|{'---|' * len(clients)}")
    for workers in (1, 2, 3):
        rates = [runs[client][workers]["records/s"] for client in clients]
        print(f"| {workers} | {' | '.join(f'{rate:,.0f}' for rate in rates)} |")
    measured = runs[clients[0]]
    c_fixed = 2 * trip + fsync
    points = [(m["b"] / k, m["step_s"] - c_fixed - k * c_msg) for k, m in measured.items()]
    c_w = sum(w * t for w, t in points) / sum(w * w for w, _ in points)
    print(f"c_fixed = {c_fixed * 1e3:.1f} ms per step; fitted c_w = {c_w * 1e6:.1f} µs per record "
          f"(in process, without the fetch: {c_rec * 1e6:.1f}); c_msg = {c_msg * 1e6:.1f} µs\n")
    print(f"| K | b (plan, n = {n:,}) | w per worker | step s (model) | records/s (model) | records/s measured "
          "| step noise std | noise vs K = 1 |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for workers in (1, 2, 3, 8, 16, 32, 64):
        model = learner(n, workers)
        b = model.current_plan().batch_size(1)
        w = worker_batch(b, workers)
        step = c_fixed + w * c_w + workers * c_msg
        noise = step_noise_std(model, b, workers)
        base = noise if base is None else base
        seen = f"{measured[workers]['records/s']:,.0f}" if workers in measured else "—"
        print(f"| {workers} | {b:,} | {w:,} | {step * 1e3:.1f} ms | {workers * w / step:,.0f} | {seen} | "
              f"{noise:.3g} | ×{noise / base:.2f} |")


if __name__ == "__main__":
    main()
