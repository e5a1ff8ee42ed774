"""ServiceMetrics: values read back from the injected registry, validation, and a real scrape."""

from __future__ import annotations

import math
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.metrics.service import ServiceMetrics
from tests.realparts import free_loopback_port


def _report(output: Guarantee, intrusion: Guarantee, records: int = 100) -> PrivacyReport:
    return PrivacyReport(mechanism="pan-acsa", records=records, output=output, intrusion=intrusion)


@pytest.fixture
def metrics() -> ServiceMetrics:
    return ServiceMetrics(CollectorRegistry())


def value(m: ServiceMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_registry_is_the_injected_one_or_a_fresh_one() -> None:
    registry = CollectorRegistry()
    assert ServiceMetrics(registry).registry is registry
    # Two default instances do not collide (neither uses the global registry).
    assert ServiceMetrics().registry is not ServiceMetrics().registry


def test_observe_batch_counts_records_and_batches_and_times_them(metrics: ServiceMetrics) -> None:
    metrics.observe_batch(256, 0.003)
    metrics.observe_batch(44, 0.0004)
    assert value(metrics, "panpriv_records_total") == 300.0
    assert value(metrics, "panpriv_batches_total") == 2.0
    assert value(metrics, "panpriv_batch_duration_seconds_count") == 2.0
    assert value(metrics, "panpriv_batch_duration_seconds_sum") == pytest.approx(0.0034)
    # 0.0004 s falls in the 0.0005 bucket, 0.003 s only from the 0.005 bucket on.
    assert value(metrics, "panpriv_batch_duration_seconds_bucket", le="0.0005") == 1.0
    assert value(metrics, "panpriv_batch_duration_seconds_bucket", le="0.0025") == 1.0
    assert value(metrics, "panpriv_batch_duration_seconds_bucket", le="0.005") == 2.0


def test_empty_batch_counts_a_batch_but_no_records(metrics: ServiceMetrics) -> None:
    metrics.observe_batch(0, 0.0)
    assert value(metrics, "panpriv_records_total") == 0.0
    assert value(metrics, "panpriv_batches_total") == 1.0


def test_rejects_accumulate_per_reason_and_zero_creates_the_series(metrics: ServiceMetrics) -> None:
    metrics.observe_rejects({"not_finite": 3, "wrong_dimension": 1})
    metrics.observe_rejects({"not_finite": 2, "undecodable": 0})
    assert value(metrics, "panpriv_records_rejected_total", reason="not_finite") == 5.0
    assert value(metrics, "panpriv_records_rejected_total", reason="wrong_dimension") == 1.0
    assert value(metrics, "panpriv_records_rejected_total", reason="undecodable") == 0.0
    # Rejects are not records learned from.
    assert value(metrics, "panpriv_records_total") == 0.0


def test_checkpoint_duration_and_last_timestamp(metrics: ServiceMetrics) -> None:
    assert value(metrics, "panpriv_last_checkpoint_timestamp_seconds") == 0.0
    metrics.observe_checkpoint(0.02, 1_700_000_000.5)
    metrics.observe_checkpoint(0.2, 1_700_000_060.25)
    assert value(metrics, "panpriv_checkpoint_duration_seconds_count") == 2.0
    assert value(metrics, "panpriv_checkpoint_duration_seconds_sum") == pytest.approx(0.22)
    assert value(metrics, "panpriv_checkpoint_duration_seconds_bucket", le="0.025") == 1.0
    assert value(metrics, "panpriv_last_checkpoint_timestamp_seconds") == 1_700_000_060.25


def test_snapshots_are_counted(metrics: ServiceMetrics) -> None:
    for _ in range(3):
        metrics.observe_snapshot()
    assert value(metrics, "panpriv_snapshots_total") == 3.0


def test_privacy_gauges_follow_the_latest_report(metrics: ServiceMetrics) -> None:
    metrics.observe_privacy(_report(Guarantee(1.0, 1e-6), Guarantee(2.0, 2e-6)))
    metrics.observe_privacy(_report(Guarantee(1.5, 3e-6), Guarantee(2.5, 4e-6), records=200))
    assert value(metrics, "panpriv_privacy_epsilon", guarantee="output") == 1.5
    assert value(metrics, "panpriv_privacy_delta", guarantee="output") == 3e-6
    assert value(metrics, "panpriv_privacy_epsilon", guarantee="intrusion") == 2.5
    assert value(metrics, "panpriv_privacy_delta", guarantee="intrusion") == 4e-6


def test_no_guarantee_is_exported_as_plus_infinity(metrics: ServiceMetrics) -> None:
    metrics.observe_privacy(_report(Guarantee(1.0, 1e-6), Guarantee.none()))
    assert value(metrics, "panpriv_privacy_epsilon", guarantee="intrusion") == math.inf
    assert value(metrics, "panpriv_privacy_delta", guarantee="intrusion") == 1.0


def test_lag_is_the_current_assignment_and_revoked_partitions_disappear(metrics: ServiceMetrics) -> None:
    metrics.observe_lag({"events/0": 10, "events/1": 0, "events/2": 7})
    assert value(metrics, "panpriv_consumer_lag_messages", topic="events", partition="2") == 7.0
    assert value(metrics, "panpriv_consumer_lag_records", topic="events", partition="2") == 7.0  # no batch yet: 1/message
    metrics.observe_lag({"events/0": 4, "events/1": 1})
    assert value(metrics, "panpriv_consumer_lag_messages", topic="events", partition="0") == 4.0
    assert value(metrics, "panpriv_consumer_lag_messages", topic="events", partition="1") == 1.0
    for name in ("panpriv_consumer_lag_messages", "panpriv_consumer_lag_records"):
        assert value(metrics, name, topic="events", partition="2") is None
    metrics.observe_lag({})
    assert value(metrics, "panpriv_consumer_lag_records", topic="events", partition="0") is None


def test_lag_in_records_counts_the_records_per_message_read(metrics: ServiceMetrics) -> None:
    """Binary batches: 4 messages held 1,000 valid and 24 rejected records, so 256 per message."""
    metrics.observe_batch(1000, 0.01, messages=4, rejected=24)
    metrics.observe_lag({"a.b/3": 10})
    assert value(metrics, "panpriv_consumer_lag_messages", topic="a.b", partition="3") == 10.0
    assert value(metrics, "panpriv_consumer_lag_records", topic="a.b", partition="3") == 2560.0


def test_every_reject_reason_is_exported_at_zero_from_the_start(metrics: ServiceMetrics) -> None:
    from panpriv.streamer.io.codec import Reason

    for reason in Reason:
        assert value(metrics, "panpriv_records_rejected_total", reason=reason.value) == 0.0


def test_no_created_series_and_the_budget_only_when_set(metrics: ServiceMetrics) -> None:
    from prometheus_client import generate_latest

    metrics.observe_batch(5, 0.01)
    assert b"_created" not in generate_latest(metrics.registry)
    metrics.set_epsilon_budget(None)
    assert value(metrics, "panpriv_privacy_epsilon_budget", guarantee="output") is None
    metrics.set_epsilon_budget(4.0)
    assert value(metrics, "panpriv_privacy_epsilon_budget", guarantee="output") == 4.0
    assert value(metrics, "panpriv_privacy_epsilon_budget", guarantee="intrusion") == 4.0


def test_textfile_holds_the_series(metrics: ServiceMetrics, tmp_path) -> None:
    metrics.observe_batch(7, 0.01)
    metrics.write_textfile(str(tmp_path / "panpriv.prom"))
    assert "panpriv_records_total 7.0" in (tmp_path / "panpriv.prom").read_text().splitlines()


def test_info_labels_and_credentials_never_become_a_label(metrics: ServiceMetrics) -> None:
    metrics.set_info("pan-acsa", "kafka://alice:s3cret@broker:9092/events?group=g1", "0.1.0")
    labels = {"learner": "pan-acsa", "source": "kafka://broker:9092/events?group=g1", "version": "0.1.0"}
    assert value(metrics, "panpriv_info", **labels) == 1.0
    # A second call replaces the labels instead of adding a second series.
    metrics.set_info("pnsgd", "file:/data/adult.jsonl", "0.1.0")
    assert value(metrics, "panpriv_info", **labels) is None
    assert value(metrics, "panpriv_info", learner="pnsgd", source="file:/data/adult.jsonl", version="0.1.0") == 1.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.observe_batch(-1, 0.1), "'records' parameter of ServiceMetrics.observe_batch must be an int >= 0. Got -1"),
        (lambda m: m.observe_batch(True, 0.1), "'records' parameter"),
        (lambda m: m.observe_batch(3, math.nan), "'seconds' parameter of ServiceMetrics.observe_batch must be a finite float >= 0. Got nan"),
        (lambda m: m.observe_batch(3, -0.5), "'seconds' parameter"),
        (lambda m: m.observe_rejects({"nan": -2}), "\"counts['nan']\" parameter of ServiceMetrics.observe_rejects must be an int >= 0. Got -2"),
        (lambda m: m.observe_rejects({"": 1}), "'reason' parameter of ServiceMetrics.observe_rejects must be a non-empty str"),
        (lambda m: m.observe_checkpoint(0.1, math.inf), "'timestamp' parameter of ServiceMetrics.observe_checkpoint"),
        (lambda m: m.observe_privacy({"epsilon": 1.0}), "'report' parameter of ServiceMetrics.observe_privacy must be a PrivacyReport"),
        (lambda m: m.observe_lag({"t/0": 1.5}), "\"lags['t/0']\" parameter of ServiceMetrics.observe_lag must be an int >= 0"),
        (lambda m: m.set_info("", "file:x", "0.1"), "'learner' parameter of ServiceMetrics.set_info"),
        (lambda m: m.serve(0), "'port' parameter of ServiceMetrics.serve must be an int in [1, 65535]. Got 0"),
    ],
)
def test_invalid_arguments_name_parameter_constraint_and_value(metrics: ServiceMetrics, call, message: str) -> None:
    with pytest.raises(ValueError) as error:
        call(metrics)
    assert message in str(error.value)


def test_invalid_reject_batch_changes_nothing(metrics: ServiceMetrics) -> None:
    with pytest.raises(ValueError):
        metrics.observe_rejects({"a": 1, "b": -1})
    assert value(metrics, "panpriv_records_rejected_total", reason="a") is None


def test_serve_exposes_the_registry_over_http_and_stop_closes_the_port(metrics: ServiceMetrics) -> None:
    metrics.observe_batch(12, 0.01)
    port = free_loopback_port()
    stop = metrics.serve(port, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        stop()
    assert "panpriv_records_total 12.0" in body.splitlines()
    stop()  # idempotent
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.integration
def test_real_prometheus_scrapes_every_series(metrics: ServiceMetrics, prometheus) -> None:
    metrics.observe_batch(250, 0.002)
    metrics.observe_batch(6, 0.001)
    metrics.observe_rejects({"wrong_dimension": 4})
    metrics.observe_checkpoint(0.05, 1_700_000_000.0)
    metrics.observe_snapshot()
    metrics.observe_privacy(_report(Guarantee(1.0, 1e-6), Guarantee.none(), records=256))
    metrics.observe_lag({"events/0": 17})
    metrics.set_info("pan-acsa", "synthetic:d=20", "0.1.0")
    port = free_loopback_port()
    stop = metrics.serve(port, addr="127.0.0.1")
    try:
        prom = prometheus([f"127.0.0.1:{port}"], scrape_interval_s=0.5)
        assert prom.wait_for_value("panpriv_records_total", lambda v: v == 256.0) == 256.0
        expected = {
            "panpriv_batches_total": 2.0,
            "panpriv_batch_duration_seconds_count": 2.0,
            'panpriv_records_rejected_total{reason="wrong_dimension"}': 4.0,
            "panpriv_checkpoint_duration_seconds_count": 1.0,
            "panpriv_last_checkpoint_timestamp_seconds": 1_700_000_000.0,
            "panpriv_snapshots_total": 1.0,
            'panpriv_privacy_epsilon{guarantee="output"}': 1.0,
            'panpriv_privacy_delta{guarantee="output"}': 1e-6,
            'panpriv_privacy_epsilon{guarantee="intrusion"}': math.inf,
            'panpriv_consumer_lag_records{topic="events",partition="0"}': 17.0,
            'panpriv_info{learner="pan-acsa",source="synthetic:d=20"}': 1.0,
        }
        scraped = {}
        for expr in expected:
            result = prom.query(expr)
            assert len(result) == 1, (expr, result)
            scraped[expr] = float(result[0]["value"][1])
        assert scraped == expected
    finally:
        stop()
