"""The budget shared by every run, against the real Kafka-protocol broker (issue 13, point 2).

Two runs over one topic with two consumer groups and two ``--out`` directories, then a replay of a
``panpriv record`` recording of the topic: the third run states the guarantee composed over all
three (basic composition: ε = 3), the budget store keys the live topic and the recording alike
(cluster identity from the broker's metadata, topic, partition, offsets), and a fourth run whose
records would exceed ``--max-epsilon`` is refused before learning anything (exit 3, naming the
runs that spent the budget). `panpriv` runs as a subprocess exactly as a user starts it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyReport
from panpriv.streamer.budget.store import BudgetStore
from panpriv.streamer.io.codec import encode_json
from tests.streamer.test_service_kafka import panpriv, produce

pytestmark = pytest.mark.integration

N = 3000
DIM = 4
PARTITIONS = 2


def last_statement(out: Path) -> PrivacyReport:
    lines = (out / "snapshots.jsonl").read_text().splitlines()
    return PrivacyReport.from_dict(json.loads(lines[-1])["privacy"])


def test_runs_over_one_topic_and_a_replay_of_its_recording_compose_and_the_budget_is_enforced(kafka_broker, tmp_path) -> None:
    topic = kafka_broker.create_topic(f"budget-{uuid.uuid4().hex[:8]}", PARTITIONS)
    rng = np.random.default_rng(13)
    X = rng.standard_normal((N, DIM)) / 2
    produce(kafka_broker.bootstrap, topic, [encode_json(x, 1 if x[0] > 0 else -1) for x in X], PARTITIONS)
    common = ["--n", str(N), "--dim", str(DIM), "--feature-bound", "1", "--checkpoint-every", "1000",
              "--snapshot-every", "1000", "--metrics-port", "0", "--progress", "off", "--rate", "0"]
    log = tmp_path / "runs.log"

    def live(group: str, out: Path, *extra: str) -> int:
        url = f"kafka://{kafka_broker.bootstrap}/{topic}?group={group}"
        return panpriv("run", "--source", url, "--out", str(out), "--stop-at-end", *common, *extra, log=log).wait(timeout=120)

    def notices() -> list[str]:  # the one line a run over used records gives before it learns (issue 36)
        return [line for line in log.read_text().splitlines() if "were used before" in line]

    assert live("first", tmp_path / "a") == 0, log.read_text()[-3000:]
    assert last_statement(tmp_path / "a").output.epsilon == 1.0
    assert notices() == []
    assert live("second", tmp_path / "b") == 0, log.read_text()[-3000:]
    second = last_statement(tmp_path / "b")
    assert (second.output.epsilon, second.intrusion.epsilon) == (2.0, 2.0)
    (notice,) = notices()  # a Kafka run's first micro-batch gives it, once
    assert "by 1 run(s)" in notice and "ε = 1 so far, up to ε = 2 after this run" in notice

    recording = tmp_path / "topic.pprec"
    assert panpriv("record", f"kafka://{kafka_broker.bootstrap}/{topic}", str(recording), log=log).wait(timeout=120) == 0
    replay = panpriv("run", "--source", f"file:{recording}", "--format", "json", "--out", str(tmp_path / "c"),
                     *[a for a in common if a not in ("--n", str(N))], log=log)
    assert replay.wait(timeout=120) == 0, log.read_text()[-3000:]
    third = last_statement(tmp_path / "c")
    assert (third.output.epsilon, third.intrusion.epsilon) == (3.0, 3.0)
    assert "by 2 run(s)" in notices()[-1] and "ε = 2 so far, up to ε = 3 after this run" in notices()[-1]
    assert third.output.delta == pytest.approx(3e-6)

    store = BudgetStore(Path(os.environ["PANPRIV_STATE_DIR"]))
    ledger = store.ledger()
    keys = [key for key in ledger.sources if key.endswith(tuple(f"/{topic}/{p}" for p in range(PARTITIONS)))]
    content = [key for key in ledger.sources if key.startswith("records:")]  # the recording's messages, by content
    assert len(keys) == PARTITIONS and len(ledger.sources) == PARTITIONS + len(content) == PARTITIONS + 1
    cluster = keys[0].removeprefix("kafka:").split("/")[0]
    assert cluster.startswith(("cluster=", "bootstrap="))
    print(f"data keys: {keys}")
    for key in keys:
        coverage = ledger.coverage(key)
        assert len(coverage) == 1 and coverage[0].start == 0 and len(coverage[0].uses) == 3
    runs = {run.out: run for run in store.runs()}
    assert set(runs) == {str(tmp_path / name) for name in "abc"} and all(run.clean for run in runs.values())

    # A fourth group would read the same records again: refused before learning anything.
    assert live("fourth", tmp_path / "d", "--max-epsilon", "3.5") == 3
    refusal = [line for line in log.read_text().splitlines() if "refusing to start" in line]
    assert len(refusal) == 1 and "ε = 4" in refusal[0]
    assert all(str(tmp_path / name) in refusal[0] for name in "abc")
    snapshots = tmp_path / "d" / "snapshots.jsonl"
    assert not snapshots.exists() or snapshots.read_bytes() == b""  # nothing released
    assert [len(s.uses) for key in keys for s in store.ledger().coverage(key)] == [3] * PARTITIONS


def test_the_budget_store_on_a_compacted_topic_is_shared_by_runs_and_survives_reopening(kafka_broker, tmp_path) -> None:
    """[budget] kafka_topic: two runs over the same file (in two processes' worth of store objects)
    compose through the topic; a third store object reading the topic from the start sees every
    charge and the runs; a run past max_epsilon is refused; a cleanly stopped run's charges are
    never moved to a lost instance, whoever asks."""
    from panpriv.streamer.budget.kafka_store import KafkaBudgetStore
    from panpriv.streamer.budget.store import BudgetExceededError
    from panpriv.streamer.runtime.processor import Processor

    path = tmp_path / "data.jsonl"
    rng = np.random.default_rng(5)
    path.write_bytes(b"\n".join(encode_json(x, 1 if x[0] > 0 else -1) for x in rng.standard_normal((1500, DIM)) / 2) + b"\n")
    store_topic = f"panpriv-budget-{uuid.uuid4().hex[:8]}"
    configure = kafka_configure(kafka_broker, path, store_topic)

    first = Processor(configure(tmp_path / "a")).run()
    second = Processor(configure(tmp_path / "b")).run()
    assert first.report.output.epsilon == 1.0 and second.report.output.epsilon == 2.0
    with pytest.raises(BudgetExceededError, match="ε = 3 > max_epsilon = 2.5"):
        Processor(configure(tmp_path / "c", **{"learner.max_epsilon": 2.5})).run()

    reader = KafkaBudgetStore([kafka_broker.bootstrap], store_topic)
    try:
        (key,) = reader.ledger().sources
        assert key.startswith("records:")  # the file's records, by content
        coverage = reader.ledger().coverage(key)
        assert [(s.start, s.stop, s.uses) for s in coverage] == [(0, 1500, tuple(sorted((first.instance, second.instance))))]
        assert {run.out for run in reader.runs() if run.clean} == {str(tmp_path / "a"), str(tmp_path / "b")}
        from panpriv.accounting.budget import lost_state_report

        assert reader.reclassify_lost(first.instance, {key: 1000}, f"{first.instance}/lost-001",
                                      lost_state_report(first.report)) == {}  # main moved [1000, 1500): released uses
    finally:
        reader.close()
    again = KafkaBudgetStore([kafka_broker.bootstrap], store_topic)
    try:
        assert [(s.start, s.stop, len(s.uses)) for s in again.ledger().coverage(key)] == [(0, 1500, 2)]
        assert again.generation > 0 and len(again.attempts()) == 2
    finally:
        again.close()


def kafka_configure(kafka_broker, path: Path, store_topic: str):
    from panpriv.streamer.config import load_config

    def configure(out: Path, **extra):
        return load_config(None, {
            "source.url": f"file:{path}", "records.format": "json", "records.dim": DIM, "records.feature_bound": 1.0,
            "source.batch_records": 200, "checkpoint.every_records": 500, "snapshots.every_records": 500,
            "metrics.port": None, "out": str(out), "budget.kafka_topic": store_topic,
            "budget.kafka_bootstrap": kafka_broker.bootstrap, **extra,
        })

    return configure


def test_the_kafka_store_has_the_rules_of_the_sqlite_store(kafka_broker, tmp_path, monkeypatch) -> None:
    """Issue 33 on the compacted topic: a rollback, a clean stop and a resume keep every released
    use; a second live process of one instance is refused; a stored report never shrinks; a forged
    message, a foreign topic and a store that is not the one an output directory used are refused
    with one line."""
    import threading

    from kafka import KafkaProducer

    from panpriv.accounting.ledger import Guarantee
    from panpriv.streamer.budget.kafka_store import KafkaBudgetStore
    from panpriv.streamer.budget.store import BudgetError
    from panpriv.streamer.runtime.processor import Processor
    from tests.streamer.test_budget_truth import stop_after

    path = tmp_path / "data.jsonl"
    rng = np.random.default_rng(6)
    path.write_bytes(b"\n".join(encode_json(x, 1 if x[0] > 0 else -1) for x in rng.standard_normal((1000, DIM)) / 2) + b"\n")
    store_topic = f"panpriv-budget-{uuid.uuid4().hex[:8]}"
    configure = kafka_configure(kafka_broker, path, store_topic)
    out = tmp_path / "out"
    stop_after(monkeypatch, 3)
    Processor(configure(out)).run()  # stopped at 600 (batches of 200)
    monkeypatch.undo()
    backup = (out / "checkpoints" / "checkpoint.json").read_bytes()
    Processor(configure(out)).run()
    (out / "checkpoints" / "checkpoint.json").write_bytes(backup)
    stopped = threading.Event()
    stopped.set()
    Processor(configure(out), stop=stopped).run()  # resumed at 500 and stopped cleanly before learning
    final = Processor(configure(out)).run()
    assert final.report.output.epsilon == 2.0  # main: 1 (the first pass's [500, 1000) relabelled "lost")

    one = KafkaBudgetStore([kafka_broker.bootstrap], store_topic)
    two = KafkaBudgetStore([kafka_broker.bootstrap], store_topic)
    try:
        one.begin_run("r", "x", "s")
        with pytest.raises(BudgetError, match="in use by another live process"):
            two.begin_run("r", "x", "s")
        big = PrivacyReport("m", 0, Guarantee(1.0, 1e-6), Guarantee(2.0, 2e-6))
        one.register("i", "r", big, "x")
        one.register("i", "r", PrivacyReport("m", 0, Guarantee(1.0, 0.0), Guarantee(1.0, 0.0)), "x")
        assert two.instances()["i"].report.intrusion == big.intrusion
    finally:
        one.close()
        two.close()

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    producer.send(store_topic, key="r\x1fforged".encode(), value=b'{"out": "x", "chk": "00"}', partition=0).get(timeout=30)
    with pytest.raises(BudgetError, match="fails its integrity check"):
        KafkaBudgetStore([kafka_broker.bootstrap], store_topic)
    foreign = kafka_broker.create_topic(f"foreign-{uuid.uuid4().hex[:8]}")
    producer.send(foreign, key=b"hello", value=b"world", partition=0).get(timeout=30)
    producer.close()
    with pytest.raises(BudgetError, match="is not a budget store"):
        KafkaBudgetStore([kafka_broker.bootstrap], foreign)
    other = kafka_configure(kafka_broker, path, f"panpriv-budget-{uuid.uuid4().hex[:8]}")  # a recreated, empty topic
    with pytest.raises(BudgetError, match="was written with the budget store"):
        Processor(other(out)).run()
