"""The metric names the service exports, read from its /metrics text exposition."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

# Sample names a family of each type exposes (prometheus-client's text format; the parser strips
# a counter's "_total" from the family name). Derived from the family, not from its samples, so a
# labelled family with no child yet (no reject of any reason so far) still counts.
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
    "info": ("_info",),
}


def exported_names(exposition: str) -> set[str]:
    """Every sample name that ``exposition`` (Prometheus text format) can carry."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


@pytest.fixture(scope="session")
def exported_metric_names() -> set[str]:
    import urllib.request

    from accounting.ledger import Guarantee, PrivacyReport
    from streamer.metrics import ServiceMetrics
    from tests.realparts import free_loopback_port

    metrics = ServiceMetrics()
    metrics.observe_batch(1, 0.001)
    metrics.observe_rejects({"undecodable": 1})
    metrics.observe_checkpoint(0.01, 1.0)
    metrics.observe_snapshot()
    metrics.observe_privacy(PrivacyReport("pan-acsa", 1, Guarantee(1.0, 1e-6), Guarantee(1.0, 1e-6)))
    metrics.observe_lag({"t/0": 0})
    metrics.set_info("pan-acsa", "synthetic:", "0")
    port = free_loopback_port()
    stop = metrics.serve(port, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return exported_names(response.read().decode())
    finally:
        stop()
