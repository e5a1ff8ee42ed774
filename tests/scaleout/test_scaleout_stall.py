"""Scale-out that cannot starve (issue 35), with real processes on the real broker: a worker slower
than ``--sync-wait`` and a coordinator down for longer than it both finish the plan — every version,
no stale mean, every published range charged in full to its worker and nothing charged that was not
published or moved to a lost instance — and a plan that cannot complete ends with one line and exit
code 4 instead of a silent wait.

Before issue 35 the other workers opened batches at a version that was already closing: their means
were dropped as stale while their records stayed consumed and charged, and on a topic with the
planned records the last versions never filled (the coordinator polled for ever, without a word).

The topics hold the plan's records plus one spare batch per partition: a batch is built from its
worker's partitions only, so a worker that covered for a late one at start-up (one batch more from
its partition) must still find its last batch there."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from panpriv.streamer.commands.exit_codes import EXIT_STALLED
from panpriv.streamer.scaleout.wire import ModelVersion
from panpriv.streamer.sources.kafka import REBALANCE_TIMEOUT_MS
from tests.faults.figures import FIGURES
from tests.realparts import KafkaBroker, ManagedProcess, free_loopback_port, wait_until
from tests.scaleout import parts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N, K = 12000, 3


def _plan(workers: int = K) -> tuple[int, int, int]:
    """(steps, records, w of the first step) of the plan for N records on ``workers`` workers."""
    from panpriv.protocols.pan_acsa_scaleout import worker_batch

    planned = parts.learner(N)
    planned.plan_for_workers(workers)
    steps, records, first = 0, 0, worker_batch(planned.step_batch_size(), workers)
    while not planned.plan_complete:
        records += workers * worker_batch(planned.step_batch_size(), workers)
        planned.apply_noisy_gradient(np.zeros(planned.param_count))
        steps += 1
    return steps, records, first


def _produce(broker: KafkaBroker, names: dict[str, str], seed: int, workers: int = K) -> None:
    """The plan's records plus one spare batch per partition (one partition per worker)."""
    _, _, w = _plan(workers)
    X, y = parts.synthetic(N + workers * w, parts.DIM, seed=seed)
    parts.produce(broker.bootstrap, names["data"], X, y, workers)


def _assert_ledger(broker: KafkaBroker, names: dict[str, str]) -> dict[str, int]:
    """Every published range is charged in full to the worker that published it; every full charge
    was published (the rest was given back or moved to a lost instance); no position was published
    twice. Returns the means published per worker."""
    audit = parts.audit_ledger(broker, names)
    assert not audit.under_counted(), f"published but not charged in full: {audit.under_counted()}"
    assert not audit.unpublished(), f"charged in full but not published: {audit.unpublished()}"
    assert not audit.twice(), f"positions published twice: {audit.twice()}"
    return audit.per_worker


def _finish(coordinator: ManagedProcess, workers: list[ManagedProcess], broker: KafkaBroker,
            names: dict[str, str], started: float, what: str, k: int | None = None) -> tuple[ModelVersion, dict[str, int]]:
    parts.wait_all(coordinator, workers, 300)
    elapsed = time.monotonic() - started
    model = parts.last_model(broker.bootstrap, names["model"])
    steps, records, _ = _plan(k or len(workers))
    per_worker = _assert_ledger(broker, names)
    line = (f"{what}: version {model.version} of {steps} in {elapsed:.1f} s; {model.records} records, {model.stale} stale; "
            f"means per worker {sorted(per_worker.values())}")
    print(line)
    FIGURES.notes.append(line)
    assert model.done and model.version == steps and model.records == records and model.stale == 0
    return model, per_worker


@pytest.mark.parametrize("rate", ["100", pytest.param("40", marks=pytest.mark.soak)])
def test_a_worker_slower_than_sync_wait_keeps_its_place(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                                         tmp_path: Path, rate: str) -> None:
    """Worker 2 reads 100 records/s: a batch of w = 266 takes 2.7 s, longer than --sync-wait (2 s)
    (``make soak``: 40 records/s, 6.7 s a batch). Its lease keeps its place: the others wait for it,
    the coordinator says it waits for it (log and ``panpriv_scaleout_coordinator_waiting_on``), and
    every version steps on its mean too."""
    names = parts.topics(kafka_broker, unique_name, K)
    _produce(kafka_broker, names, seed=11)
    port = free_loopback_port()
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, K,
                                          more=("--metrics-port", str(port), "--metrics-addr", "127.0.0.1"))
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i, more=("--rate", rate) if i == 2 else ())
               for i in range(K)]
    started = time.monotonic()
    try:
        wait_until(lambda: (tmp_path / "worker2" / "worker.json").exists(), 120, "the slow worker's state")
        slow = parts.worker_instance(tmp_path / "worker2")
        wait_until(lambda: parts.scrape(port).get(f"panpriv_scaleout_coordinator_waiting_on{{worker={slow}}}") == 1, 120,
                   "the coordinator exporting that it waits for the slow worker")
        exported = parts.scrape(port)
        assert exported["panpriv_scaleout_coordinator_waiting_seconds"] >= 0  # PanprivScaleoutWaiting's series
        assert exported["panpriv_scaleout_coordinator_means_missing"] >= 1
        model, per_worker = _finish(coordinator, workers, kafka_broker, names, started, f"slow worker ({rate} records/s)")
    finally:
        for process in (*workers, coordinator):
            process.stop()
    # The slow worker's place was kept: its mean is in (nearly) every version (at start-up a fast
    # worker may cover a version before the group has all three members).
    assert per_worker.get(slow, 0) >= model.version - 2, per_worker


@pytest.mark.parametrize("outages", [(3,), pytest.param((3, 6, 9, 12), marks=pytest.mark.soak)])
def test_a_coordinator_down_for_longer_than_sync_wait(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                                     tmp_path: Path, outages: tuple[int, ...]) -> None:
    """SIGKILL of the coordinator at version 3 and a restart 5 s later (> --sync-wait) (``make soak``:
    at versions 3, 6, 9 and 12): the workers whose means are on the topic wait for the next version
    instead of reading another batch at a version that is closing; the restarted coordinator steps
    on those means."""
    names = parts.topics(kafka_broker, unique_name, K)
    _produce(kafka_broker, names, seed=12)
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, K)
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i) for i in range(K)]
    processes = [coordinator, *workers]
    started = time.monotonic()
    try:
        for at in outages:
            wait_until(lambda at=at: parts.last_model(kafka_broker.bootstrap, names["model"]).version >= at, 120,
                       f"version {at}")
            os.kill(coordinator.pid, signal.SIGKILL)
            coordinator.process.wait(timeout=10)
            time.sleep(5.0)  # the outage: longer than --sync-wait
            coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, K, log=f"coordinator-after-{at}.log")
            processes.append(coordinator)
        _finish(coordinator, workers, kafka_broker, names, started, f"coordinator outages at versions {outages}")
    finally:
        for process in processes:
            process.stop()
    assert "resumed at version" in coordinator.log_path.read_text()


@pytest.mark.parametrize("client", ["kafka-python", pytest.param("confluent-kafka", marks=pytest.mark.soak)])
def test_workers_waiting_through_a_coordinator_outage_longer_than_max_poll_interval(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path, client: str
) -> None:
    """SIGKILL of the coordinator at version 3, down for 40 s: longer than the consumer's
    max_poll_interval (REBALANCE_TIMEOUT_MS, 30 s). The workers wait for version 4 without
    reading a record; they must stay alive and in their group through it, and the restarted
    coordinator finishes the plan with a clean ledger."""
    names = parts.topics(kafka_broker, unique_name, K)
    _produce(kafka_broker, names, seed=16)
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, K)
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i, more=_client(tmp_path, client)) for i in range(K)]
    processes = [coordinator, *workers]
    started = time.monotonic()
    try:
        wait_until(lambda: parts.last_model(kafka_broker.bootstrap, names["model"]).version >= 3, 120, "version 3")
        os.kill(coordinator.pid, signal.SIGKILL)
        coordinator.process.wait(timeout=10)
        time.sleep(REBALANCE_TIMEOUT_MS / 1000 + 10)
        for worker in workers:
            worker.check_alive()
        coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, K, log="coordinator-after.log")
        processes.append(coordinator)
        _finish(coordinator, workers, kafka_broker, names, started, f"a 40-s coordinator outage ({client})")
    finally:
        for process in processes:
            process.stop()
    for worker in workers:
        _read_with(worker, client)


def _client(tmp_path: Path, client: str) -> tuple[str, ...]:
    """The worker flags that select the Kafka client of ``panpriv run``'s source (``[kafka] client``)."""
    config = tmp_path / f"kafka-{client}.toml"
    config.write_text(f'[kafka]\nclient = "{"confluent" if client == "confluent-kafka" else "kafka-python"}"\n')
    return ("--config", str(config))


def _read_with(worker: ManagedProcess, client: str) -> None:
    """The worker read its records through ``panpriv run``'s source on ``client`` (its start-up line)."""
    log = worker.log_path.read_text()
    assert f"with {client}" in log and "reading kafka://" in log, log[-2000:]


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_spare_workers_racing_for_every_place_publish_no_stale_mean(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path, client: str
) -> None:
    """Three workers for K = 2 places: at every version all three see both places free at once, as
    two survivors see a dead worker's place (issue 35). Each claims before it reads a record, and
    the claim that comes third in the topic's order withdraws: every version steps on exactly two
    means, none stale, and nothing is charged that was not published. (Before claims each worker
    decided on what it had read so far: 3 stale means by version 15, whose records were read and
    charged for nothing, so the last version could not fill and the test timed out.) On both
    clients of ``panpriv run``'s source (issue 37: the workers read with kafka-python only)."""
    names = parts.topics(kafka_broker, unique_name, 3)
    _, _, w = _plan(2)
    X, y = parts.synthetic(N + 3 * w, parts.DIM, seed=15)
    parts.produce(kafka_broker.bootstrap, names["data"], X, y, 3)
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, 2)
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i, more=_client(tmp_path, client)) for i in range(3)]
    started = time.monotonic()
    try:
        _finish(coordinator, workers, kafka_broker, names, started, f"three workers for two places ({client})", k=2)
    finally:
        for process in (*workers, coordinator):
            process.stop()
    for worker in workers:
        _read_with(worker, client)


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka"])
def test_a_batch_whose_version_closed_goes_back_to_the_stream(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path, client: str
) -> None:
    """Worker 1 trickles (0.5 records/s: a record every 2 s, its lease lapsing 1 s after each,
    --sync-wait 1), so worker 0 takes its place at every version and closes it. Worker 1 hands its
    batch back each time instead of publishing a stale mean: it seeks back, reads the same records
    again (charged again, its earlier read an intrusion-only lost use) and never publishes."""
    names = parts.topics(kafka_broker, unique_name, 2)
    _produce(kafka_broker, names, seed=14, workers=2)
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, 2)
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i, more=(
        *_client(tmp_path, client), *(("--rate", "0.5", "--sync-wait", "1") if i else ("--sync-wait", "0.5"))))
               for i in range(2)]
    handed_back = "handing it back; its records return to the stream"
    try:
        wait_until(lambda: workers[1].log_path.read_text().count(handed_back) >= 2, 180, "two batches handed back")
        for worker in workers:  # both at once: one leaving alone makes the other wait for a rebalance
            worker.process.terminate()
        for worker in workers:
            assert worker.process.wait(timeout=120) == 0, worker.log_path.read_text()[-2000:]
    finally:
        for process in (*workers, coordinator):
            process.stop()
    _read_with(workers[1], client)  # the source's rewind on this client returned the records
    trickling = parts.worker_instance(tmp_path / "worker1")
    per_worker = _assert_ledger(kafka_broker, names)
    model = parts.last_model(kafka_broker.bootstrap, names["model"])
    assert model.version >= 2 and model.stale == 0 and trickling not in per_worker, (model.version, per_worker)
    # Each lost batch starts where the one before it started: its records went back to the stream
    # and were read again by the same worker (a fresh charge each time).
    with sqlite3.connect(Path(os.environ["PANPRIV_STATE_DIR"]) / "budget.sqlite") as db:
        rows = db.execute("SELECT instance, source, start, stop FROM charges WHERE instance LIKE ?",
                          (trickling + "/lost-%",)).fetchall()
    starts: dict[str, set[int]] = defaultdict(set)
    instances: dict[str, set[str]] = defaultdict(set)
    for instance, source, start, _ in rows:
        starts[source].add(start)
        instances[source].add(instance)
    assert any(len(instances[source]) >= 2 and len(starts[source]) == 1 for source in starts), rows
    print(f"trickling worker: version {model.version}; lost charges {sorted(rows)}; means per worker {per_worker}")


def _one_error_line(process: ManagedProcess, command: str = "coordinate") -> str:
    log = process.log_path.read_text()
    lines = [line for line in log.splitlines() if line.startswith(f"panpriv {command}")]
    assert len(lines) == 1 and "Traceback" not in log, log[-3000:]
    return lines[0]


def test_a_plan_that_cannot_complete_ends_with_one_line_and_exit_code_4(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """Too few records for the plan (2,000 of 12,000): once the workers have read them all, nothing
    moves for --stall-timeout (25) seconds and the coordinator ends (exit 4, one line naming the version,
    the means in and the workers), having logged what it waits for every 10 s meanwhile. It publishes
    its end on the model topic: the workers stop on their own, each with one line and exit code 4
    (before, they waited for ever), and the ledger holds what was published."""
    names = parts.topics(kafka_broker, unique_name, 2)
    X, y = parts.synthetic(2000, parts.DIM, seed=13)
    parts.produce(kafka_broker.bootstrap, names["data"], X, y, 2)
    # The workers first (their start-up is no part of the plan's progress), then the coordinator.
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i) for i in range(2)]
    coordinator = None
    try:
        wait_until(lambda: all((tmp_path / f"worker{i}" / "worker.json").exists() for i in range(2)), 120, "the workers")
        coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, 2, more=("--stall-timeout", "25"))
        assert coordinator.process.wait(timeout=240) == EXIT_STALLED, coordinator.log_path.read_text()[-3000:]
        for worker in workers:
            assert worker.process.wait(timeout=120) == EXIT_STALLED, worker.log_path.read_text()[-2000:]
    finally:
        for process in (*workers, *([coordinator] if coordinator is not None else [])):
            process.stop()
    line = _one_error_line(coordinator)
    assert "the plan cannot complete: no progress for" in line and "waiting for the means of version" in line, line
    waits = [line for line in coordinator.log_path.read_text().splitlines() if "coordinator: waiting for the means of" in line]
    assert waits and "heard from before but not there: scaleout:" in waits[-1], waits
    model = parts.last_model(kafka_broker.bootstrap, names["model"])
    assert not model.done and model.version >= 1 and f"version {model.version}:" in line, (model.version, line)
    assert model.abandoned and model.abandoned in line, (model.abandoned, line)
    for worker in workers:
        stopped = _one_error_line(worker, "worker")
        assert f"the coordinator abandoned the model at version {model.version}: the plan cannot complete" in stopped, stopped
    _assert_ledger(kafka_broker, names)


def test_a_coordinator_without_workers_ends_after_its_stall_timeout(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    names = parts.topics(kafka_broker, unique_name, 1)
    started = time.monotonic()
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, N, 2, more=("--stall-timeout", "3"))
    try:
        assert coordinator.process.wait(timeout=120) == EXIT_STALLED, coordinator.log_path.read_text()[-3000:]
    finally:
        coordinator.stop()
    line = _one_error_line(coordinator)
    assert "no worker heard from yet" in line and time.monotonic() - started >= 3, line
