"""``--metrics-port`` of ``panpriv worker`` and ``panpriv coordinate`` on the real broker: both
endpoints are scraped over HTTP during a short run, and once the run is quiet (every record read,
every full batch published and stepped on) each counter equals the run's own totals — the
gradients and model topics, the budget store, and the workers' exit summaries."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from panpriv.accounting.budget import per_source, report_for
from panpriv.accounting.ledger import PrivacyLedger
from panpriv.streamer.scaleout.wire import GradientRecord
from tests.realparts import KafkaBroker, ManagedProcess, free_loopback_port
from tests.scaleout import parts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N, PLANNED, K = 6000, 30000, 2
BAD = [b"not json", b'{"x": [1.0], "y": 1}', b'{"y": 1}', b'{"x": [' + b",".join([b"0.1"] * parts.DIM) + b'], "y": 7}']
REASONS = {"undecodable": 1, "wrong_dimension": 1, "missing_field": 1, "label_out_of_range": 1}


def _produce_bad(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for i, value in enumerate(BAD):
            producer.send(topic, value, partition=i % 3)
        producer.flush()
    finally:
        producer.close()


def _sum(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def test_worker_and_coordinator_endpoints_count_the_runs_own_totals(
        kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    names = parts.topics(kafka_broker, unique_name)
    X, y = parts.synthetic(N, parts.DIM, seed=3)
    parts.produce(kafka_broker.bootstrap, names["data"], X, y)
    _produce_bad(kafka_broker.bootstrap, names["data"])
    ports = [free_loopback_port() for _ in range(K + 1)]
    coordinator = parts.start_coordinator(tmp_path, kafka_broker, names, PLANNED, K,
                                          more=("--metrics-port", str(ports[K]), "--metrics-addr", "127.0.0.1"))
    workers = [parts.start_worker(tmp_path, kafka_broker, names, i, more=(
        "--metrics-port", str(ports[i]), "--metrics-addr", "127.0.0.1", "--max-epsilon", "2")) for i in range(K)]
    try:
        scrapes = _until_quiet(coordinator, workers, ports, kafka_broker, names, timeout_s=180)
        time.sleep(6.0)  # past --sync-wait and the privacy refresh interval: every wait over, gauges refreshed
        *w_values, c_values = [parts.scrape(port) for port in ports]
        gradients = parts.gradients(kafka_broker.bootstrap, names["gradients"])
        model = parts.last_model(kafka_broker.bootstrap, names["model"])
        store = _store_now()  # before SIGTERM: stopping moves each open batch to a lost instance
    finally:
        for process in workers:  # together: a worker left alone would rebalance while the others stop
            if process.process.poll() is None:
                process.process.terminate()
        for process in workers:  # one SIGTERM each: a second one, once the loop has closed, ends the
            process.process.wait(timeout=30)  # process before its summary line (as the default action)
            process.stop()
        summaries = [_summary(process.log_path) for process in workers]
        coordinator.stop()
    assert scrapes >= 2  # the endpoints answered during the run, not only at the end
    print(f"{scrapes} scrapes; version {model.version}, {len(gradients)} means, stale {_stale(gradients)}; workers "
          + "; ".join(f"published {v['panpriv_scaleout_worker_batches_published_total']:g}, lost "
                      f"{_sum(v, 'panpriv_scaleout_worker_batches_lost_total'):g}, epsilon "
                      f"{v['panpriv_privacy_epsilon{guarantee=output}']:g}/{v['panpriv_privacy_epsilon{guarantee=intrusion}']:g}"
                      for v in w_values) + f"; summaries {summaries}")

    # The coordinator: steps = versions published, K means per step, every mean read counted once.
    assert c_values["panpriv_scaleout_coordinator_steps_total"] == model.version >= 2
    assert c_values["panpriv_scaleout_coordinator_model_version"] == model.version
    assert c_values["panpriv_scaleout_coordinator_means_used_total"] == K * model.version
    assert c_values["panpriv_scaleout_coordinator_means_received_total"] == len(gradients)
    assert c_values["panpriv_scaleout_coordinator_means_stale_total"] == _stale(gradients) >= model.stale
    assert _sum(c_values, "panpriv_scaleout_coordinator_means_rejected_total") == 0
    assert time.time() - 600 < c_values["panpriv_scaleout_coordinator_last_published_timestamp_seconds"] <= time.time()
    assert c_values[f"panpriv_scaleout_info{{deployment=default,role=coordinator,version={_version()}}}"] == 1

    ledger, lost_instances = store
    rejected: dict[str, float] = {}
    for i, (values, summary) in enumerate(zip(w_values, summaries, strict=True)):
        instance = parts.worker_instance(tmp_path / f"worker{i}")
        mine = [g for g in gradients if g.worker == instance]
        assert values["panpriv_scaleout_worker_batches_published_total"] == len(mine) == summary["published"]
        assert values["panpriv_scaleout_worker_records_total"] == sum(g.records for g in mine) == summary["records"]
        assert _sum(values, "panpriv_scaleout_worker_records_rejected_total") == summary["rejected"]
        for key, value in values.items():
            if key.startswith("panpriv_scaleout_worker_records_rejected_total{"):
                reason = key.split("reason=")[1].rstrip("}")
                rejected[reason] = rejected.get(reason, 0) + value
        # Every wait after a publication has ended (arrived or timed out) by now.
        assert _sum(values, "panpriv_scaleout_worker_version_waits_total") == len(mine)
        assert values["panpriv_scaleout_worker_model_version"] == model.version
        lost = _sum(values, "panpriv_scaleout_worker_batches_lost_total")
        assert lost == len([n for n in lost_instances if n.startswith(instance + "/lost-")])
        assert summary["lost"] - lost in (0, 1)  # the open batch, if any, is lost on SIGTERM
        # The privacy gauges are the budget store's composition for the records this worker charged.
        sources = {k.split("source=")[1].rstrip("}") for k in values if k.startswith("panpriv_budget_epsilon{")}
        charged = {c for g in mine for c in g.ranges}
        assert charged <= sources
        composed = per_source(ledger)
        for source in sources:
            output, intrusion = composed[source]
            assert values[f"panpriv_budget_epsilon{{guarantee=output,source={source}}}"] == pytest.approx(output.epsilon)
            assert values[f"panpriv_budget_epsilon{{guarantee=intrusion,source={source}}}"] == pytest.approx(intrusion.epsilon)
        report = report_for(ledger, [n for n in ledger.instances if n == instance or n.startswith(instance + "/lost-")], 0)
        assert values["panpriv_privacy_epsilon{guarantee=output}"] == pytest.approx(report.output.epsilon)
        assert values["panpriv_privacy_epsilon{guarantee=intrusion}"] == pytest.approx(report.intrusion.epsilon)
        assert values["panpriv_privacy_epsilon{guarantee=output}"] >= 1.0  # ε = 1 per use
        assert values["panpriv_privacy_epsilon_budget{guarantee=intrusion}"] == 2.0
        assert values[f"panpriv_scaleout_info{{deployment=default,role=worker,version={_version()}}}"] == 1
        assert not any(k.endswith("_created") for k in values)
    # Each bad record rejected when read; read again (and charged again) after its batch was handed
    # back or revoked, it is counted again: at most once per batch the workers lost.
    lost_batches = sum(_sum(v, "panpriv_scaleout_worker_batches_lost_total") for v in w_values)
    assert set(k for k, v in rejected.items() if v) == set(REASONS)
    assert sum(REASONS.values()) <= sum(rejected.values()) <= sum(REASONS.values()) + len(BAD) * lost_batches, rejected


def _store_now() -> tuple[PrivacyLedger, list[str]]:
    """The budget store's ledger (every use) and its lost instances."""
    from panpriv.streamer.budget.store import BudgetStore

    store = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"]))
    try:
        return store.ledger(), [name for name in store.instances() if "/lost-" in name]
    finally:
        store.close()


def _until_quiet(coordinator: ManagedProcess, workers: list[ManagedProcess], ports: list[int],
                 broker: KafkaBroker, names: dict[str, str], timeout_s: float) -> int:
    """Scrape every endpoint each second until every record has been read (valid or rejected) and
    the coordinator has read every mean on the gradients topic; the number of scrapes."""
    deadline, scrapes = time.monotonic() + timeout_s, 0
    while True:
        for process in (coordinator, *workers):
            process.check_alive()
        try:
            *w_values, c_values = [parts.scrape(port) for port in ports]
        except OSError:  # not listening yet
            w_values, c_values = [], {}
        else:
            scrapes += 1
            published = sum(v["panpriv_scaleout_worker_batches_published_total"] for v in w_values)
            rejected = sum(_sum(v, "panpriv_scaleout_worker_records_rejected_total") for v in w_values)
            received = c_values["panpriv_scaleout_coordinator_means_received_total"]
            if rejected >= len(BAD) and published and received == published == len(parts.gradients(broker.bootstrap, names["gradients"])):
                # all read? the valid records not in published batches are fewer than one batch per worker
                learned = sum(v["panpriv_scaleout_worker_records_total"] for v in w_values)
                if N - learned < K * _batch() and scrapes >= 2:
                    return scrapes
        if time.monotonic() > deadline:
            raise TimeoutError(f"not quiet after {timeout_s:g} s: {coordinator.log_path.read_text()[-1500:]}")
        time.sleep(1.0)


def _stale(gradients: list[GradientRecord]) -> int:
    """The public rule (synchronous versions) replayed over the gradients topic: the means that
    named another version than the current one when read."""
    version = pending = stale = 0
    for record in gradients:
        if record.version != version:
            stale += 1
            continue
        pending += 1
        if pending == K:
            version, pending = version + 1, 0
    return stale


def _batch() -> int:
    from panpriv.protocols.pan_acsa_scaleout import worker_batch

    learner = parts.learner(PLANNED)
    learner.plan_for_workers(K)
    return max(worker_batch(learner.current_plan().batch_size(b), K) for b in range(64))


def _summary(log: Path) -> dict[str, int]:
    """The counts of the worker's exit line (streamer/commands/scaleout.py)."""
    text = log.read_text()
    match = re.search(r"published (\d+) noisy batch means \(([\d,]+) records\); rejected (\d+); batches lost (\d+)", text)
    assert match is not None, text[-2000:]
    published, records, rejected, lost = match.groups()
    return {"published": int(published), "records": int(records.replace(",", "")), "rejected": int(rejected),
            "lost": int(lost)}


def _version() -> str:
    import panpriv

    return str(panpriv.__version__)
