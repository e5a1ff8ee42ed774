"""The metric names the service exports, read from its /metrics text exposition."""

from __future__ import annotations

import shutil
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.panpriv_service import PanprivService, produce_json_records

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
def promtool() -> str:
    """Path of promtool (Debian's 'prometheus' package ships it; `make test` installs that)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool not installed: `make test` installs Debian's 'prometheus' package, which ships it")
    return binary


@pytest.fixture(scope="session")
def exported_metric_names(service_exposition: str) -> set[str]:
    """Names on the /metrics page of a running ``panpriv run`` (:func:`service_exposition`)."""
    return exported_names(service_exposition)


@pytest.fixture(scope="session")
def service_exposition(kafka_broker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The /metrics page of a running ``panpriv run`` (a subprocess on the real broker, configured
    like deploy/panpriv.toml), read after it has learned, rejected and checkpointed."""
    topic = kafka_broker.create_topic(f"deploy-names-{uuid.uuid4().hex[:8]}", partitions=2)
    sent = produce_json_records(kafka_broker.bootstrap, topic, 200, 20, partitions=2, seed=9,
                                malformed={"undecodable": 1})
    service = PanprivService(tmp_path_factory.mktemp("deploy-service"), {
        "source": {"url": f"kafka://{kafka_broker.bootstrap}/{topic}?group=deploy-names"},
        "records": {"format": "json", "dim": 20, "feature_bound": 1.0},
        "learner": {"name": "pan-acsa", "n": 200 + sum(sent.values())},
        "checkpoint": {"every_seconds": 0.5},
    })
    try:
        service.wait_for_checkpoint(200)
        return service.scrape()
    finally:
        service.stop()
