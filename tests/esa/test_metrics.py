"""The ESA roles' Prometheus series (streamer/esa/metrics.py), scraped over HTTP from the endpoint
``--metrics-port`` starts (a real Prometheus scrapes them in tests/esa/test_esa_service.py)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from panpriv.accounting.ledger import Guarantee, PrivacyReport
from panpriv.streamer.esa.analyzer import REJECT_REASONS
from panpriv.streamer.esa.metrics import AnalyzerMetrics, ShufflerMetrics
from panpriv.streamer.esa.shuffler import DROP_REASONS
from tests.realparts import free_loopback_port


def scrape(metrics: AnalyzerMetrics | ShufflerMetrics) -> dict[str, float]:
    port = free_loopback_port()
    stop = metrics.serve(port, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        stop()
        stop()  # a second stop does nothing
    return {sample.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}"
                           if sample.labels else ""): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_analyzer_series_count_increments_from_cumulative_totals() -> None:
    """A restored analyzer's totals are not counted again; later rejects are, once."""
    metrics = AnalyzerMetrics(REJECT_REASONS, rejected={"unknown_key": 5})
    metrics.set_info("analyzer", "default", "test")
    metrics.set_epsilon_budget(12.0)
    metrics.observe_state(3, {"unknown_key": 5})
    metrics.observe_round(31)
    metrics.observe_state(4, {"unknown_key": 6, "out_of_order": 32})
    metrics.observe_state(4, {"unknown_key": 6, "out_of_order": 32})
    metrics.observe_privacy(PrivacyReport("m", 128, Guarantee(4.0, 1e-5), Guarantee(8.7, 1e-5)),
                            {"esa:cluster=c/messages": (Guarantee(4.0, 1e-5), Guarantee(8.7, 1e-5))})
    values = scrape(metrics)
    assert values["panpriv_esa_rounds_total"] == 1 and values["panpriv_esa_messages_total"] == 31
    assert values["panpriv_esa_rejected_total{reason=unknown_key}"] == 1
    assert values["panpriv_esa_rejected_total{reason=out_of_order}"] == 32
    assert {k for k in values if k.startswith("panpriv_esa_rejected_total")} == {
        f"panpriv_esa_rejected_total{{reason={r}}}" for r in REJECT_REASONS}
    assert values["panpriv_esa_round"] == 4
    assert values["panpriv_privacy_epsilon{guarantee=intrusion}"] == 8.7
    assert values["panpriv_privacy_epsilon_budget{guarantee=output}"] == 12.0
    assert values["panpriv_budget_epsilon{guarantee=output,source=esa:cluster=c/messages}"] == 4.0
    assert values["panpriv_esa_info{deployment=default,role=analyzer,version=test}"] == 1
    assert not any(name.endswith("_created") for name in values)


def test_shuffler_series() -> None:
    metrics = ShufflerMetrics(DROP_REASONS)
    metrics.observe_state(-1, 0, {})
    metrics.observe_release(256)
    metrics.observe_state(0, 17, {"late": 2, "malformed": 1})
    values = scrape(metrics)
    assert values["panpriv_esa_shuffler_rounds_released_total"] == 1
    assert values["panpriv_esa_shuffler_messages_released_total"] == 256
    assert values["panpriv_esa_shuffler_waiting_messages"] == 17
    assert values["panpriv_esa_shuffler_last_released_round"] == 0
    assert {k: v for k, v in values.items() if k.startswith("panpriv_esa_shuffler_dropped_total")} == {
        f"panpriv_esa_shuffler_dropped_total{{reason={reason}}}": {"late": 2, "malformed": 1}.get(reason, 0)
        for reason in DROP_REASONS}
