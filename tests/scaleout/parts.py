"""The scale-out roles as real processes on the suite's broker (tests/conftest.py ``kafka_broker``)."""

from __future__ import annotations

import os
import sqlite3
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from panpriv.protocols.losses import LogisticLoss
from panpriv.protocols.pan_acsa import PanPrivateACSA
from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.scaleout.wire import GradientRecord, ModelVersion, gradients_topic_record
from tests.esa.parts import panpriv, synthetic
from tests.realparts import KafkaBroker, ManagedProcess

DIM, EPSILON, DELTA = 20, 1.0, 1e-6

__all__ = ["panpriv", "synthetic", "topics", "produce", "accuracy", "learner", "read_all", "start_worker", "start_coordinator",
           "scrape"]


def topics(broker: KafkaBroker, name: Callable[[str], str], partitions: int = 3) -> dict[str, str]:
    """A data topic with ``partitions`` partitions, a gradients topic and a compacted model topic."""
    return {"data": broker.create_topic(name("so-data"), partitions), "gradients": broker.create_topic(name("so-grad")),
            "model": broker.create_topic(name("so-model"), compacted=True)}


def produce(bootstrap: str, topic: str, X: np.ndarray, y: np.ndarray, partitions: int = 3) -> None:
    """One JSON record per message, round-robin over the partitions."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=1 << 20)
    try:
        for i, (row, label) in enumerate(zip(X.tolist(), y.tolist(), strict=True)):
            producer.send(topic, encode_json(row, label), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()


def learner(n: int) -> PanPrivateACSA:
    """The learner both the coordinator (`start_coordinator`'s flags) and the in-process references
    use: built by the one factory from the coordinator's settings (streamer/runtime/learners.py)."""
    from panpriv.streamer.runtime.learners import LearnerSettings, build

    built = build(LearnerSettings("pan-acsa", DIM, EPSILON, DELTA, 1.0, n))
    assert isinstance(built, PanPrivateACSA)
    return built


def accuracy(theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Sign accuracy of the logistic model ``theta`` (with an intercept when it has d + 1 entries)."""
    features = LogisticLoss(intercept=theta.shape[0] == X.shape[1] + 1).features(X, 1.0)
    return float(np.mean(np.where(features @ theta >= 0, 1.0, -1.0) == y))


def read_all(bootstrap: str, topic: str) -> list[bytes]:
    """Every value on partition 0 of ``topic`` now."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    tp = TopicPartition(topic, 0)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        values: list[bytes] = []
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in records]
        return values
    finally:
        consumer.close()


def gradients(bootstrap: str, topic: str) -> list[GradientRecord]:
    """The noisy means on the gradients topic (not the workers' open-batch leases)."""
    return [r for r in (gradients_topic_record(v) for v in read_all(bootstrap, topic)) if isinstance(r, GradientRecord)]


def last_model(bootstrap: str, topic: str) -> ModelVersion:
    """The newest version on the model topic, the last record of it (a version may be republished)."""
    models = [ModelVersion.from_json(v) for v in read_all(bootstrap, topic) if v]
    return max(reversed(models), key=lambda m: m.version)


def start_worker(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], i: int, log: str | None = None,
                 more: tuple[str, ...] = ()) -> ManagedProcess:
    return panpriv(["worker", *more, "--bootstrap", broker.bootstrap, "--data-topic", names["data"], "--gradients-topic",
                    names["gradients"], "--model-topic", names["model"], "--group", f"g-{names['data']}", "--out",
                    str(tmp_path / f"worker{i}")], tmp_path / (log or f"worker{i}.log"))


def start_coordinator(tmp_path: Path, broker: KafkaBroker, names: dict[str, str], n: int, workers: int = 3,
                      log: str = "coordinator.log", more: tuple[str, ...] = ()) -> ManagedProcess:
    return panpriv(["coordinate", *more, "--bootstrap", broker.bootstrap, "--gradients-topic", names["gradients"],
                    "--model-topic", names["model"], "--workers", str(workers), "--dim", str(DIM), "--n", str(n),
                    "--epsilon", str(EPSILON), "--delta", str(DELTA)], tmp_path / log)


def wait_all(coordinator: ManagedProcess, workers: list[ManagedProcess], timeout_s: float) -> None:
    """Wait for the coordinator and then the workers to exit 0; fail fast (with the log) if one dies."""
    import time

    deadline = time.monotonic() + timeout_s
    while coordinator.process.poll() is None:
        for worker in workers:
            if worker.process.poll() not in (None, 0):
                worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"coordinator not done after {timeout_s:g} s: {coordinator.log_path.read_text()[-1500:]}")
        time.sleep(0.2)
    assert coordinator.process.returncode == 0, coordinator.log_path.read_text()[-3000:]
    for worker in workers:
        assert worker.process.wait(timeout=60) == 0, worker.log_path.read_text()[-3000:]


def worker_instance(out: Path) -> str:
    """The budget instance a worker keeps in ``out`` (panpriv.streamer.scaleout.worker)."""
    from panpriv.streamer.scaleout.worker import worker_state

    state = worker_state(out).load()
    assert state is not None, f"no worker state in {out}"
    return str(state["instance"])


def scrape(port: int) -> dict[str, float]:
    """``http://127.0.0.1:port/metrics`` as ``{'name{label=value,...}': value}`` (labels sorted)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
                           if sample.labels else ""): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


Ranges = dict[tuple[str, str], list[tuple[int, int]]]
"""Position ranges per (budget instance, source key)."""


def positions(spans: list[tuple[int, int]]) -> set[int]:
    return {p for a, b in spans for p in range(a, b)}


@dataclass
class LedgerAudit:
    """What the gradients topic published against what the budget store charged (the session's
    ``PANPRIV_STATE_DIR``): ``published`` and ``full`` (charges of the workers' own instances, not
    their intrusion-only ``/lost-`` ones) per (instance, source)."""

    published: Ranges
    full: Ranges
    per_worker: dict[str, int]

    def under_counted(self) -> dict[tuple[str, str], int]:
        """Published positions without a full charge to their worker (a budget under-count)."""
        missing = {key: len(positions(spans) - positions(self.full.get(key, []))) for key, spans in self.published.items()}
        return {key: n for key, n in missing.items() if n}

    def unpublished(self) -> dict[tuple[str, str], int]:
        """Positions charged in full but never published (an over-count: never a privacy loss)."""
        extra = {key: len(positions(spans) - positions(self.published.get(key, []))) for key, spans in self.full.items()}
        return {key: n for key, n in extra.items() if n}

    def by_source(self) -> dict[str, list[tuple[int, int]]]:
        sources: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for (_, source), spans in self.published.items():
            sources[source] += spans
        return sources

    def twice(self) -> dict[str, int]:
        """Positions published in more than one mean, per source (records learned twice)."""
        counts = {source: sum(b - a for a, b in spans) - len(positions(spans)) for source, spans in self.by_source().items()}
        return {source: n for source, n in counts.items() if n}

    def holes(self) -> dict[str, int]:
        """Positions below a source's last published one that no mean holds (records lost)."""
        gaps = {}
        for source, spans in self.by_source().items():
            seen = positions(spans)
            gaps[source] = max(seen) + 1 - len(seen) if seen else 0
        return {source: n for source, n in gaps.items() if n}


def audit_ledger(broker: KafkaBroker, names: dict[str, str]) -> LedgerAudit:
    """:class:`LedgerAudit` of the deployment on ``names``' gradients topic now."""
    published: Ranges = defaultdict(list)
    per_worker: dict[str, int] = defaultdict(int)
    for record in gradients(broker.bootstrap, names["gradients"]):
        per_worker[record.worker] += 1
        for key, span in record.ranges.items():
            published[(record.worker, key)].append(span)
    with sqlite3.connect(Path(os.environ["PANPRIV_STATE_DIR"]) / "budget.sqlite") as db:
        rows = db.execute("SELECT instance, source, start, stop FROM charges").fetchall()
    full: Ranges = defaultdict(list)
    for instance, source, start, stop in rows:
        if "/lost-" not in instance and instance.startswith("scaleout:"):
            full[(instance, source)].append((start, stop))
    return LedgerAudit(dict(published), dict(full), dict(per_worker))
