"""``kill -9`` across the distributed roles, each kill followed by a restart (issue 35's soak,
``make soak`` only): the E-S-A shuffler and analyzer, the scale-out workers and coordinator, as
real processes on the real broker.

* **Scale-out** (:func:`test_soak_kill_9_of_workers_and_the_coordinator`): three paced workers
  and a coordinator; :data:`SCALEOUT_KILLS` times one of them (the coordinator one time in four)
  is killed at a random moment (after a worker's kill, once a mean was published since), and restarted at
  once (the coordinator after an outage of up to 3 s, longer than ``--sync-wait`` at times). Then the workers are restarted unpaced and the plan
  completes. The ledger (:class:`tests.scaleout.parts.LedgerAudit`): every published range charged
  in full to its worker (budget under-counts 0), no position published twice (records learned
  twice 0), no hole below a partition's last published position (records lost 0).
* **E-S-A** (:func:`test_soak_kill_9_of_the_shuffler_and_the_analyzer`): an ``encode`` client
  answering round after round, a shuffler and a ``shuffle-gaussian`` analyzer; :data:`ESA_KILLS`
  kills alternate between the shuffler and the analyzer. Then every round is released (records
  lost 0), no round has two different batches (learned twice 0), the budget store charges every
  round once to the analyzer's instance (under-counts 0), and the analyzer's model is the one a
  crash-free analyzer computes from the same shuffled topic (each batch applied exactly once).

No process's output holds a traceback. The figures go to :data:`tests.faults.figures.FIGURES`.
The normal suite's fast variants: tests/scaleout/test_scaleout_faults.py and
tests/esa/test_esa_kafka.py (one or two kills each).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.faults.figures import FIGURES
from tests.realparts import KafkaBroker, ManagedProcess, wait_until

pytestmark = [pytest.mark.soak, pytest.mark.integration]

SCALEOUT_KILLS = 30
ESA_KILLS = 70


def kill_9(process: ManagedProcess) -> None:
    """SIGKILL ``process`` (by its PID) and reap it."""
    os.kill(process.pid, signal.SIGKILL)
    process.process.wait(timeout=30)
    process.stop()


def tracebacks(logs: Path) -> int:
    """Logs in ``logs`` (recursively) holding a traceback."""
    return sum("Traceback" in path.read_text(errors="replace") for path in logs.rglob("*.log"))


# -- scale-out --------------------------------------------------------------------------------------


def test_soak_kill_9_of_workers_and_the_coordinator(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                                    tmp_path: Path) -> None:
    from tests.scaleout import parts

    workers_n, n = 3, 60_000
    names = parts.topics(kafka_broker, unique_name, workers_n)
    X, y = parts.synthetic(n + 20_000, parts.DIM, seed=35)  # spare records: the stream goes on
    parts.produce(kafka_broker.bootstrap, names["data"], X, y, workers_n)
    rng = random.Random()
    paced = ("--rate", "100")
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, n, workers_n)
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i, more=paced) for i in range(workers_n)]
    restarts = 0

    def model_done() -> bool:
        try:
            return parts.last_model(kafka_broker.bootstrap, names["model"]).done
        except ValueError:
            return False

    def means() -> int:
        return len(parts.gradients(kafka_broker.bootstrap, names["gradients"]))

    try:
        wait_until(lambda: all((tmp_path / f"worker{i}" / "worker.json").exists() for i in range(workers_n)), 180,
                   "every worker's first state")
        kills, worker_killed, published = 0, False, 0
        while kills < SCALEOUT_KILLS and not model_done():
            # After a worker's kill, the next once a mean was published since: kill -9 every few
            # seconds whatever happens kept the consumer group rebalancing on the loaded machine,
            # and after 40 such kills it had not formed again 10 minutes later (first soak run).
            # (A coordinator's kill leaves the group alone; the plan has 63 means to spend.)
            deadline = time.monotonic() + 300
            while worker_killed and means() <= published and not model_done():
                assert time.monotonic() < deadline, f"no mean published within 300 s after kill {kills}"
                time.sleep(1.0)
            time.sleep(rng.uniform(0.5, 2.5))
            published = means()
            restarts += 1
            worker_killed = rng.random() >= 0.25
            if not worker_killed:
                kill_9(coordinator)
                time.sleep(rng.uniform(0.0, 3.0))  # an outage, at times longer than --sync-wait
                coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, n, workers_n,
                                                      log=f"coordinator-r{restarts}.log")
                FIGURES.kills["scale-out coordinator"] += 1
            else:
                i = rng.randrange(workers_n)
                kill_9(workers[i])
                workers[i] = parts.start_worker(tmp_path, kafka_broker, names, i, log=f"worker{i}-r{restarts}.log",
                                                more=paced)
                FIGURES.kills["scale-out worker"] += 1
            kills += 1
        # The kills are over: the workers, unpaced, finish the plan (stopped together: one leaving
        # alone makes the others wait for a rebalance).
        for worker in workers:
            worker.process.terminate()
        for worker in workers:
            worker.process.wait(timeout=120)
            worker.stop()
        workers = [parts.start_worker(tmp_path, kafka_broker, names, i, log=f"worker{i}-final.log")
                   for i in range(workers_n)]
        parts.wait_all(coordinator, workers, 900)
    finally:
        for process in (*workers, coordinator):
            process.stop()
    FIGURES.tracebacks += tracebacks(tmp_path)
    model = parts.last_model(kafka_broker.bootstrap, names["model"])
    audit = parts.audit_ledger(kafka_broker, names)
    lost, twice, under = audit.holes(), audit.twice(), audit.under_counted()
    FIGURES.ledger("scale-out kills", sum(lost.values()), sum(twice.values()), sum(under.values()))
    FIGURES.notes.append(f"scale-out kills: {kills} kills, plan done at version {model.version} with {model.records:,} "
                         f"records, {model.stale} stale means; charged in full but unpublished (over-counts): "
                         f"{sum(audit.unpublished().values())} positions")
    assert kills == SCALEOUT_KILLS, f"the plan finished after {kills} kills"
    assert model.done and tracebacks(tmp_path) == 0
    assert not under and not twice and not lost, (under, twice, lost)


# -- E-S-A ----------------------------------------------------------------------------------------


def test_soak_kill_9_of_the_shuffler_and_the_analyzer(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                                      tmp_path: Path) -> None:
    from panpriv.protocols.catalogue import load_learner
    from panpriv.streamer.budget.store import BudgetStore
    from panpriv.streamer.esa import wire
    from panpriv.streamer.esa.analyzer import Analyzer
    from panpriv.streamer.esa.keys import load_private, load_shuffler
    from tests.esa import parts

    names = parts.topics(kafka_broker, unique_name)
    key_files = parts.key_pairs(tmp_path)
    dim, b, rounds = 5, 16, 900
    X, y = parts.synthetic(b * rounds, dim, seed=36)
    source = parts.write_jsonl(tmp_path / "records.jsonl", X, y)
    shuffler, analyzer = parts.roles(tmp_path, kafka_broker, names, key_files, dim, b, rounds, dim)
    client = parts.panpriv([*parts.encode_args(kafka_broker, names, key_files, source), "--timeout", "600"],
                           tmp_path / "client.log")
    checkpoint = tmp_path / "analyzer" / "analyzer.json"
    rng = random.Random()

    def analyzed() -> int:
        return int(parts.analyzer_state(checkpoint)["round"]) if checkpoint.exists() else 0

    kills = 0
    try:
        wait_until(lambda: analyzed() >= 2, 180, "round 2")
        while kills < ESA_KILLS and analyzed() < rounds - 10:
            time.sleep(rng.uniform(0.5, 3.0))
            if kills % 2:
                kill_9(shuffler)
                shuffler = parts.panpriv(shuffler.argv[3:], tmp_path / f"shuffler-r{kills}.log")
                FIGURES.kills["E-S-A shuffler"] += 1
            else:
                kill_9(analyzer)
                analyzer = parts.start_analyzer(tmp_path, kafka_broker, names, key_files, dim, b, rounds,
                                                f"analyzer-r{kills}.log")
                FIGURES.kills["E-S-A analyzer"] += 1
            kills += 1
        assert analyzer.process.wait(timeout=900) == 0, analyzer.log_path.read_text()[-3000:]
        assert client.process.wait(timeout=120) == 0, client.log_path.read_text()[-3000:]
        values = parts.read_values(kafka_broker.bootstrap, names["shuffled"],
                                   parts.count_records(kafka_broker.bootstrap, names["shuffled"]), 120)
    finally:
        for process in (client, shuffler, analyzer):
            process.stop()
    FIGURES.tracebacks += tracebacks(tmp_path)
    state = parts.analyzer_state(checkpoint)
    batches = {batch.digest: batch for batch in map(wire.parse_batch, values)}
    released = sorted(batch.round for batch in batches.values())
    lost = len(set(range(rounds)) - set(released))
    twice = len(released) - len(set(released))  # two different batches of one round
    store = BudgetStore(tmp_path / "state")
    try:
        (key,) = store.ledger().sources
        coverage = [(s.start, s.stop, s.uses) for s in store.ledger().coverage(key)]
    finally:
        store.close()
    charged = sum(stop - start for start, stop, uses in coverage if state["instance"] in uses)
    FIGURES.ledger("E-S-A kills", lost, twice, rounds - charged)
    FIGURES.counted("shuffled (after the kills: re-released batches)", {"re-released": len(values) - len(batches),
                                                                        **state["rejected"]})
    replay = Analyzer(load_learner("shuffle-gaussian").from_config(state["config"]),
                      [load_private(key_files[0].private)], "replay")
    parts.bound(replay, load_shuffler(key_files[1].private), state["deployment_id"])
    for value in values:
        replay.handle(value)
    FIGURES.notes.append(f"E-S-A kills: {kills} kills, {rounds} rounds, {len(values) - len(batches)} batches "
                         f"re-released (same digest), analyzer rejected {dict(state['rejected'])}")
    assert kills == ESA_KILLS, f"the rounds ended after {kills} kills"
    assert state["round"] == rounds and replay.round == rounds and tracebacks(tmp_path) == 0
    assert lost == twice == 0 and coverage == [(0, rounds, (state["instance"],))], coverage
    np.testing.assert_array_equal(np.asarray(state["released"]), replay.learner.release())
