"""The scale-out roles as real processes on the suite's broker (tests/conftest.py ``kafka_broker``)."""

from __future__ import annotations

from collections.abc import Callable
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
