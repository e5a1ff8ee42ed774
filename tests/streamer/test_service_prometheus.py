"""Issue 8, test 2: the real Prometheus scrapes the running service (a ``panpriv run`` subprocess
consuming from the real broker); its query API returns ``panpriv_records_total`` equal to the
records processed and the privacy gauges equal to the service's privacy report."""

from __future__ import annotations

import math

import pytest

from panpriv.accounting.ledger import PrivacyLedger, PrivacyReport
from panpriv.streamer.io.sinks import read_snapshots
from panpriv.streamer.runtime.learners import restore_learner
from tests.panpriv_service import PanprivService, produce_json_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RECORDS = 3_000
MALFORMED = {"undecodable": 2, "missing_field": 1, "wrong_dimension": 3}
DIM = 20


def _exactly(expected: float):
    return lambda value: value == expected or (math.isinf(expected) and math.isinf(value) and value > 0)


def test_prometheus_query_api_returns_the_services_counts_and_privacy_report(
    kafka_broker, unique_name, prometheus, tmp_path
) -> None:
    topic = kafka_broker.create_topic(unique_name("scrape"), partitions=3)
    sent = produce_json_records(kafka_broker.bootstrap, topic, RECORDS, DIM, partitions=3, seed=8, malformed=MALFORMED)
    service = PanprivService(tmp_path / "service", {
        "source": {"url": f"kafka://{kafka_broker.bootstrap}/{topic}?group={unique_name('g')}"},
        "records": {"format": "json", "dim": DIM, "feature_bound": 1.0},
        "learner": {"name": "pan-acsa", "epsilon": 1.0, "delta": 1e-6, "n": RECORDS + sum(sent.values())},
        "checkpoint": {"every_seconds": 0.5},
    })
    try:
        prom = prometheus([service.target], scrape_interval_s=0.5)
        # The service keeps running (a Kafka source has no end): the last checkpoint, taken once
        # the topic is drained, is the report the gauges must show.
        saved = service.wait_for_checkpoint(RECORDS)
        report = PrivacyLedger.from_dict(saved.ledger).report()
        # The checkpoint holds pan-acsa's last batch boundary: the records of the batch still open
        # when the topic ran dry are not in it (docs/privacy.md, "Checkpoints on disk").
        open_batch = restore_learner(saved.learner, saved.learner_config, saved.learner_state, None).records_to_boundary()
        assert 0 <= RECORDS - saved.records < open_batch
        assert all(saved.rejects.get(reason, 0) <= count for reason, count in sent.items())

        assert prom.wait_for_value("panpriv_records_total", _exactly(RECORDS)) == RECORDS
        for reason, count in sent.items():
            prom.wait_for_value(f'panpriv_records_rejected_total{{reason="{reason}"}}', _exactly(count))
        for guarantee in ("output", "intrusion"):
            expected = getattr(report, guarantee)
            prom.wait_for_value(f'panpriv_privacy_epsilon{{guarantee="{guarantee}"}}', _exactly(expected.epsilon))
            prom.wait_for_value(f'panpriv_privacy_delta{{guarantee="{guarantee}"}}', _exactly(expected.delta))
        # pan-acsa at (ε, δ) = (1, 1e-6), each record in one batch: both guarantees are the target.
        assert (report.output.epsilon, report.output.delta) == (1.0, 1e-6)
        assert (report.intrusion.epsilon, report.intrusion.delta) == (1.0, 1e-6)
        # Drained: the lag measured at that checkpoint is 0 on every partition.
        assert prom.wait_for_value("sum(panpriv_consumer_lag_records)", _exactly(0.0)) == 0.0
        assert len(prom.query("panpriv_consumer_lag_records")) == 3
        assert [float(s["value"][1]) for s in prom.query('up{job="panpriv"}')] == [1.0]

        assert service.terminate() == 0, service.log()[-2000:]
        # The final snapshot (SIGTERM) states the same report the gauges showed.
        final = read_snapshots(service.out / "snapshots.jsonl")[-1]
        assert final["records"] == saved.records  # the parameters of the last boundary
        released = PrivacyReport.from_dict(final["privacy"])
        assert (released.output, released.intrusion) == (report.output, report.intrusion)
    finally:
        service.stop()
