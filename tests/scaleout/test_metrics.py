"""The scale-out roles' Prometheus series (streamer/scaleout/metrics.py), scraped over HTTP from the
endpoint ``--metrics-port`` starts; tests/scaleout/test_scaleout_metrics.py scrapes real processes."""

from __future__ import annotations

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.io.codec import Reason
from panpriv.streamer.scaleout.metrics import LOST_REASONS, MEAN_REJECT_REASONS, WAIT_OUTCOMES, CoordinatorMetrics, WorkerMetrics
from tests.realparts import free_loopback_port
from tests.scaleout import parts


def scrape(metrics: WorkerMetrics | CoordinatorMetrics) -> dict[str, float]:
    port = free_loopback_port()
    stop = metrics.serve(port, "127.0.0.1")
    try:
        return parts.scrape(port)
    finally:
        stop()


def _labelled(values: dict[str, float], name: str) -> dict[str, float]:
    return {k: v for k, v in values.items() if k.startswith(name + "{")}


def test_worker_series_count_increments_from_cumulative_totals() -> None:
    metrics = WorkerMetrics()
    metrics.set_info("worker", "default", "test")
    metrics.set_epsilon_budget(2.0)
    before = scrape(metrics)
    assert before["panpriv_scaleout_worker_model_version"] == -1
    assert _labelled(before, "panpriv_scaleout_worker_records_rejected_total") == {
        f"panpriv_scaleout_worker_records_rejected_total{{reason={r.value}}}": 0 for r in Reason}
    assert _labelled(before, "panpriv_scaleout_worker_batches_lost_total") == {
        f"panpriv_scaleout_worker_batches_lost_total{{reason={r}}}": 0 for r in LOST_REASONS}
    assert _labelled(before, "panpriv_scaleout_worker_version_waits_total") == {
        f"panpriv_scaleout_worker_version_waits_total{{outcome={o}}}": 0 for o in WAIT_OUTCOMES}
    metrics.observe_totals(1, 100, {"non_finite": 2}, {}, {"arrived": 1}, 0.5, 3)
    metrics.observe_totals(2, 200, {"non_finite": 2, "undecodable": 1}, {"revoked": 1}, {"arrived": 1, "timed_out": 1},
                           2.5, 4)
    metrics.observe_totals(2, 200, {"non_finite": 2, "undecodable": 1}, {"revoked": 1}, {"arrived": 1, "timed_out": 1},
                           2.5, 4)
    metrics.observe_privacy(PrivacyReport("m", 200, Guarantee(1.0, 1e-6), Guarantee(1.5, 2e-6)),
                            {"kafka:c/t/0": (Guarantee(1.0, 1e-6), Guarantee(1.5, 2e-6))})
    values = scrape(metrics)
    assert values["panpriv_scaleout_worker_batches_published_total"] == 2
    assert values["panpriv_scaleout_worker_records_total"] == 200
    assert values["panpriv_scaleout_worker_records_rejected_total{reason=non_finite}"] == 2
    assert values["panpriv_scaleout_worker_records_rejected_total{reason=undecodable}"] == 1
    assert values["panpriv_scaleout_worker_batches_lost_total{reason=revoked}"] == 1
    assert values["panpriv_scaleout_worker_version_waits_total{outcome=timed_out}"] == 1
    assert values["panpriv_scaleout_worker_version_wait_seconds_total"] == 2.5
    assert values["panpriv_scaleout_worker_model_version"] == 4
    assert values["panpriv_privacy_epsilon{guarantee=intrusion}"] == 1.5
    assert values["panpriv_privacy_delta{guarantee=output}"] == 1e-6
    assert values["panpriv_budget_epsilon{guarantee=output,source=kafka:c/t/0}"] == 1.0
    assert values["panpriv_privacy_epsilon_budget{guarantee=output}"] == 2.0
    assert values["panpriv_scaleout_info{deployment=default,role=worker,version=test}"] == 1
    assert not any(name.endswith("_created") for name in values)


def test_coordinator_series_do_not_count_restored_totals_again() -> None:
    metrics = CoordinatorMetrics()
    metrics.set_info("coordinator", "m", "test")
    metrics.resume(7, {"malformed": 2})  # a restored coordinator's totals
    metrics.observe_published(5, 1_700_000_000.0)
    for stale, rejected in ((7, {"malformed": 2}), (8, {"malformed": 2}), (8, {"malformed": 3})):
        metrics.observe_mean(stale, rejected)
    metrics.observe_mean(8, {"malformed": 3})
    metrics.observe_step(2)
    metrics.observe_published(6, 1_700_000_001.0)
    values = scrape(metrics)
    assert values["panpriv_scaleout_coordinator_means_received_total"] == 4
    assert values["panpriv_scaleout_coordinator_means_stale_total"] == 1
    assert _labelled(values, "panpriv_scaleout_coordinator_means_rejected_total") == {
        "panpriv_scaleout_coordinator_means_rejected_total{reason=malformed}": 1,
        **{f"panpriv_scaleout_coordinator_means_rejected_total{{reason={r}}}": 0 for r in MEAN_REJECT_REASONS
           if r != "malformed"}}
    assert values["panpriv_scaleout_coordinator_steps_total"] == 1
    assert values["panpriv_scaleout_coordinator_means_used_total"] == 2
    assert values["panpriv_scaleout_coordinator_model_version"] == 6
    assert values["panpriv_scaleout_coordinator_last_published_timestamp_seconds"] == 1_700_000_001.0
    assert values["panpriv_scaleout_info{deployment=m,role=coordinator,version=test}"] == 1
    assert not any(name.endswith("_created") for name in values)
