"""``panpriv dev-broker``: the local broker a newcomer starts, used the way the README says."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from panpriv.streamer.commands.produce import produce
from tests.realparts import free_loopback_port, wait_until

REPOSITORY = Path(__file__).resolve().parents[2]


def test_dev_broker_serves_produce_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_loopback_port()
    out = tmp_path / "broker.out"
    with open(out, "w") as handle:
        broker = subprocess.Popen([sys.executable, "-m", "panpriv", "dev-broker", "--port", str(port)],
                                  stdout=handle, stderr=subprocess.STDOUT, cwd=REPOSITORY)
    try:
        wait_until(lambda: "Kafka protocol on" in out.read_text(), 30, "panpriv dev-broker")
        assert f"--bootstrap 127.0.0.1:{port}" in out.read_text()
        assert produce(f"127.0.0.1:{port}", "events", 1000, dim=5) == 1000
        second = subprocess.run([sys.executable, "-m", "panpriv", "dev-broker", "--port", str(port)],
                                capture_output=True, text=True, cwd=REPOSITORY, timeout=30)
        assert second.returncode == 2 and "already in use" in second.stderr
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=15) == 0


def _cluster_of_a_start(tmp_path: Path, name: str) -> str:
    from panpriv.streamer.sources.identity import kafka_cluster_identity

    port = free_loopback_port()
    out = tmp_path / f"{name}.out"
    with open(out, "w") as handle:
        broker = subprocess.Popen([sys.executable, "-m", "panpriv", "dev-broker", "--port", str(port)],
                                  stdout=handle, stderr=subprocess.STDOUT, cwd=REPOSITORY)
    try:
        wait_until(lambda: "Kafka protocol on" in out.read_text(), 30, "panpriv dev-broker")
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", group_id=None)
        try:
            consumer.topics()
            return kafka_cluster_identity(consumer, [f"127.0.0.1:{port}"])
        finally:
            consumer.close()
    finally:
        broker.send_signal(signal.SIGINT)
        assert broker.wait(timeout=15) == 0


def test_each_start_is_its_own_cluster_for_the_budget_store(tmp_path: Path) -> None:
    """Two starts (topics in memory: other records at the same offsets) are two data sources:
    the budget store keys Kafka data by cluster id, and Tansu's default id is one for all."""
    first, second = _cluster_of_a_start(tmp_path, "first"), _cluster_of_a_start(tmp_path, "second")
    assert first.startswith("cluster=panpriv-dev-") and second.startswith("cluster=panpriv-dev-")
    assert first != second
