"""Every Kafka client of the process, built with the ``[kafka]`` security settings and options.

One place constructs consumers, producers and admin clients (the source, the dead-letter and
snapshot producers, the budget topic, ``produce``, ``record``, the offset checks), so a cluster
that needs TLS or SASL is reached by all of them or by none. The settings are process-wide:
:func:`configure` is called once with the run's :class:`panpriv.streamer.config.KafkaConfig` (by the CLI
and by the processor); until then the defaults (plaintext, no options) apply. Every topic the
process uses (source, snapshots, budget, dead letters) is reached with the same settings. A
consumer lets the broker hold an empty fetch for :data:`FETCH_WAIT_MS` unless its caller or
``[kafka] consumer`` says otherwise (the roles wait on each other's records).

The secrets (SASL password, key password) are read from the settings only here, when a client is
built; they are passed to the client library and never logged. The client library's own logger
(``kafka``) is kept at ERROR level by the CLI.

Start-up wait. kafka-python's constructors probe a broker (``api_version_auto_timeout_ms``) and
raise ``NoBrokersAvailable`` when none answers; a broker starting at the same time as the service
(a compose file, a pod) answers a few seconds later. :func:`_bounded` retries for
``connect_timeout_s`` and then raises :class:`panpriv.streamer.errors.SourceError` naming the addresses,
the security protocol and what to check.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from panpriv.streamer.config import KafkaConfig
from panpriv.streamer.errors import ConfigError, SourceError

log = logging.getLogger("panpriv.kafka")

RESERVED = frozenset({
    "bootstrap_servers", "group_id", "enable_auto_commit", "auto_offset_reset", "isolation_level",
    "key_deserializer", "value_deserializer", "key_serializer", "value_serializer",
    "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname", "ssl_context",
})
"""Options ``[kafka] consumer``/``producer`` may not set: offsets and the group decide exactly-once
(:mod:`panpriv.streamer.sources`), serialisation is panpriv's, and security has its own fields."""

LIBRDKAFKA_RESERVED = frozenset({
    "bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset",
    "security.protocol", "enable.partition.eof",
})
"""The same for ``[kafka] librdkafka`` (plus every ``sasl.*`` and ``ssl.*`` property)."""

WAIT_LOG_EVERY_S = 5.0
"""While waiting for a broker at start-up, say so this often."""

RECEIVE_MESSAGE_MAX_BYTES = 64 * 2**20
"""The least response frame a consumer accepts. kafka-python's own default (1 MB) is below its
default ``fetch_max_bytes`` (50 MB), so a fetch across several full partitions fails with "Invalid
frame length" and is retried forever; 64 MB accepts any response a default fetch can produce."""

KAFKA_PYTHON_FETCH_MAX_BYTES = 52_428_800
"""kafka-python's default ``fetch_max_bytes``."""

FETCH_WAIT_MS = 10
"""How long a role's consumer lets the broker hold a fetch open when nothing new is there
(``fetch_max_wait_ms``; kafka-python's default is 500). The default of every consumer built by
:func:`consumer`; the stream source keeps 500
(:data:`panpriv.streamer.sources.kafka.SOURCE_FETCH_WAIT_MS`).

Why. The roles (E-S-A shuffler and analyzer, scale-out coordinator and workers, the budget store)
are steps of a synchronous round trip: each waits for the record another role publishes in answer
to its own, then makes broker calls — the caught-up check's end offsets
(:mod:`panpriv.streamer.kafka.topic_reader`), commits (:mod:`panpriv.streamer.kafka.calls`).
kafka-python keeps a fetch in flight on the one connection it has to a broker, and a broker
answers the requests of one connection in order (the Kafka protocol guide, "Network"), so on any
broker such a call waits behind an idle fetch for up to this long. Measured on the test broker
(Tansu 0.6): ``end_offsets`` right after an empty ``poll(50)`` took 451 ms at 500 and 9 ms at 10;
the check-in shuffler's two per slot were 1.0 of its 1.36 s per slot. Tansu also answers a held
fetch only when it next looks, not when a record arrives (send to poll: 18–236 ms at 500, 2–9 ms
at 10); Apache Kafka answers at once.

Cost. An idle consumer sends a fetch about every ``FETCH_WAIT_MS`` + round-trip time instead of
twice a second: 76 requests/s instead of 2 measured on Tansu, each an empty response — for the
handful of role processes of a deployment, not per user (the E-S-A client keeps the library's
default: :class:`panpriv.streamer.esa.model.ModelWatcher`)."""

_settings = KafkaConfig()
_checked: set[str] = set()
"""Address lists :func:`preflight` has checked with the current settings."""

T = TypeVar("T")


def configure(settings: KafkaConfig) -> None:
    """Use ``settings`` for every client built from now on; check the pass-through option names
    against the client library (a misspelt option names itself instead of failing at connect)."""
    global _settings  # noqa: PLW0603 - process-wide by design (module docstring)
    if settings.consumer or settings.producer:
        from kafka import KafkaConsumer, KafkaProducer

        for section, known in (("consumer", KafkaConsumer.DEFAULT_CONFIG), ("producer", KafkaProducer.DEFAULT_CONFIG)):
            for name in getattr(settings, section):
                if name in RESERVED:
                    raise ConfigError(f"kafka.{section}.{name}: set by panpriv (or by a [kafka] security field); remove it")
                if name not in known:
                    raise ConfigError(f"kafka.{section}.{name}: not a kafka-python {section} option (see its "
                                      f"KafkaConsumer/KafkaProducer documentation for the names, e.g. fetch_max_bytes)")
    if settings.client == "confluent":
        try:
            import confluent_kafka  # noqa: F401 - only checked for presence
        except ImportError:
            raise ConfigError("kafka.client = 'confluent' needs confluent-kafka: pip install 'panpriv[confluent]'") from None
        for name in settings.librdkafka:
            if name in LIBRDKAFKA_RESERVED or name.startswith(("sasl.", "ssl.")):
                raise ConfigError(f"kafka.librdkafka.{name}: set by panpriv (or by a [kafka] security field); remove it")
    _settings = settings
    _checked.clear()


def settings() -> KafkaConfig:
    """The settings in use."""
    return _settings


def security_options(config: KafkaConfig | None = None) -> dict[str, Any]:
    """kafka-python's keyword arguments for TLS and SASL (holds the password: never log it)."""
    config = config or _settings
    options: dict[str, Any] = {"security_protocol": config.security_protocol}
    if config.security_protocol.endswith("SSL"):
        options["ssl_check_hostname"] = config.ssl_check_hostname
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if (path := getattr(config, name)) is not None:
                options[name] = str(path)
        if config.ssl_password is not None:
            options["ssl_password"] = config.ssl_password.get_secret_value()
    if config.security_protocol.startswith("SASL_"):
        options["sasl_mechanism"] = config.sasl_mechanism
        options["sasl_plain_username"] = config.sasl_username
        options["sasl_plain_password"] = config.password()
    return options


def libraries() -> str:
    """The client libraries in use, with their versions: ``"kafka-python 2.3.3"``, or with
    ``[kafka] client = "confluent"`` ``"confluent-kafka 2.16.1 on librdkafka 2.16.0 (the source);
    kafka-python 2.3.3 (the other clients)"``. Logged when a cluster is first reached
    (:func:`preflight`), so a log says which library spoke to the brokers."""
    import kafka

    python_client = f"kafka-python {kafka.__version__}"
    if _settings.client != "confluent":
        return python_client
    import confluent_kafka

    return (f"confluent-kafka {confluent_kafka.version()[0]} on librdkafka {confluent_kafka.libversion()[0]} (the source); "
            f"{python_client} (the other clients)")


def describe(bootstrap: Sequence[str] | str) -> str:
    """``"127.0.0.1:9092 (SASL_SSL, SCRAM-SHA-512 as alice)"``: where and how, without secrets."""
    hosts = bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)
    how: str = _settings.security_protocol
    if _settings.sasl_mechanism:
        how += f", {_settings.sasl_mechanism} as {_settings.sasl_username}"
    return f"{hosts} ({how})"


class _LoginFailure(logging.Handler):
    """Keeps kafka-python's log record of a refused SASL login (its only report of the broker's message)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if "Sasl" in str(record.msg):
            args = record.args if isinstance(record.args, tuple) else ()
            self.message = str(args[-1]) if args else record.getMessage()


def _hosts(bootstrap: Sequence[str] | str) -> list[tuple[str, int]]:
    entries = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    hosts = []
    for entry in entries:
        host, _, port = entry.strip().rpartition(":")
        hosts.append((host.strip("[]") or "localhost", int(port or 9092)))
    return hosts


def _listening(hosts: list[tuple[str, int]]) -> tuple[str, int] | None:
    for host, port in hosts:
        try:
            socket.create_connection((host, port), timeout=2.0).close()
            return host, port
        except OSError:
            continue
    return None


def preflight(bootstrap: Sequence[str] | str) -> None:
    """Wait (bounded) for a broker to listen, then open one connection with the security settings
    and send one metadata request, so that a wrong protocol, an untrusted certificate or a refused
    login stops the start-up with a message naming the setting instead of an endless reconnect
    loop (kafka-python logs and retries a refused login forever). Checked once per address list,
    which is then logged with the client library in use (:func:`libraries`)."""
    key = bootstrap if isinstance(bootstrap, str) else ",".join(bootstrap)
    if key in _checked:
        return
    from kafka.conn import BrokerConnection
    from kafka.protocol.metadata import MetadataRequest

    hosts = _hosts(bootstrap)
    started = logged = time.monotonic()
    while (found := _listening(hosts)) is None:
        now = time.monotonic()
        if now - started >= _settings.connect_timeout_s:
            raise SourceError(
                f"no Kafka broker is listening at {describe(bootstrap)} after {_settings.connect_timeout_s:g} s "
                "([kafka] connect_timeout_s); check the address and port, and that the broker is running"
            )
        if now - logged >= WAIT_LOG_EVERY_S:
            log.info("waiting for a Kafka broker at %s (%.0f s of %g s)", describe(bootstrap), now - started, _settings.connect_timeout_s)
            logged = now
        time.sleep(0.5)
    host, port = found
    where = f"Kafka at {host}:{port}"
    watcher = _LoginFailure()
    logging.getLogger("kafka.conn").addHandler(watcher)
    connection = BrokerConnection(host, port, socket.AF_UNSPEC, client_id="panpriv-preflight", **security_options())
    try:
        try:
            connected = connection.connect_blocking(timeout=max(5.0, _settings.connect_timeout_s / 3))
        except ssl.SSLError as exc:
            raise SourceError(f"TLS handshake with {where} failed: {exc.reason or exc}. Check [kafka] ssl_cafile (the CA "
                              "that signed the broker's certificate) and that the address matches the certificate") from None
        except Exception as exc:  # noqa: BLE001 - kafka-python raises its own error types here
            raise SourceError(f"connecting to {where} failed ({_settings.security_protocol}): {type(exc).__name__}: {exc}") from None
        if not connected:
            raise SourceError(_refusal(where, watcher.message))
        future = connection.send(MetadataRequest[0]([]))
        deadline = time.monotonic() + 5.0
        while not future.is_done and time.monotonic() < deadline:
            for response, done in connection.recv():
                done.success(response)
            time.sleep(0.01)
        if not future.succeeded():
            raise SourceError(
                f"{where} accepted the connection ({_settings.security_protocol}) but closed it on the first request: "
                "the listener probably requires SASL (security_protocol SASL_SSL or SASL_PLAINTEXT with sasl_mechanism, "
                "sasl_username and the password in PANPRIV_KAFKA__SASL_PASSWORD)"
            )
    finally:
        connection.close()
        logging.getLogger("kafka.conn").removeHandler(watcher)
    _checked.add(key)
    log.info("Kafka at %s reached; client: %s", describe(bootstrap), libraries())


def _refusal(where: str, broker_message: str | None) -> str:
    if _settings.security_protocol.startswith("SASL_"):
        said = f" (the broker said: {broker_message})" if broker_message else ""
        return (f"{where} refused the login of {_settings.sasl_username!r} with {_settings.sasl_mechanism}{said}. "
                "Check [kafka] sasl_username, the password (PANPRIV_KAFKA__SASL_PASSWORD or sasl_password_env) "
                "and that the broker enables this mechanism")
    return (f"{where} closed the connection during the handshake ({_settings.security_protocol}): does the listener "
            "expect TLS (security_protocol SSL) or SASL (SASL_SSL/SASL_PLAINTEXT)?")


def _bounded(build: Callable[[], T], bootstrap: Sequence[str] | str) -> T:
    """``build()`` after :func:`preflight`, retried while no broker answers, for at most ``connect_timeout_s``."""
    from kafka.errors import NoBrokersAvailable

    preflight(bootstrap)
    started = time.monotonic()
    logged = started
    while True:
        try:
            return build()
        except NoBrokersAvailable:
            now = time.monotonic()
            waited = now - started
            if waited >= _settings.connect_timeout_s:
                raise SourceError(
                    f"no Kafka broker answered at {describe(bootstrap)} within {_settings.connect_timeout_s:g} s "
                    "([kafka] connect_timeout_s). Check the address and port, that the listener speaks the "
                    "configured security_protocol (a TLS listener needs SSL or SASL_SSL), the CA file, and the "
                    "SASL credentials (a refused login looks the same to the client)"
                ) from None
            if now - logged >= WAIT_LOG_EVERY_S:
                log.info("waiting for a Kafka broker at %s (%.0f s of %g s)", describe(bootstrap), waited, _settings.connect_timeout_s)
                logged = now
            time.sleep(min(1.0, max(0.0, _settings.connect_timeout_s - waited)))


def consumer(bootstrap: Sequence[str] | str, **options: Any) -> Any:
    """A ``kafka.KafkaConsumer``: ``fetch_max_wait_ms`` of :data:`FETCH_WAIT_MS` (the roles' round
    trips), then ``options``, then ``[kafka] consumer``, then security."""
    from kafka import KafkaConsumer

    merged = {"fetch_max_wait_ms": FETCH_WAIT_MS, **options, **_settings.consumer, **security_options()}
    merged.setdefault("receive_message_max_bytes", receive_limit(merged))
    return _bounded(lambda: KafkaConsumer(bootstrap_servers=bootstrap, **merged), bootstrap)


def receive_limit(options: dict[str, Any]) -> int:
    """The response frame a consumer with ``options`` must accept: its largest fetch (the larger
    of ``fetch_max_bytes`` and ``max_partition_fetch_bytes``, either of which a broker may return
    in full) plus 1 MB of framing, and at least :data:`RECEIVE_MESSAGE_MAX_BYTES`. Without it, a
    consumer configured for large messages (the E-S-A analyzer's batches, a worker starting
    behind a full topic) fails every fetch with "Invalid frame length"."""
    fetch = max(int(options.get("fetch_max_bytes", KAFKA_PYTHON_FETCH_MAX_BYTES)),
                int(options.get("max_partition_fetch_bytes", 0)))
    return max(RECEIVE_MESSAGE_MAX_BYTES, fetch + 2**20)


def producer(bootstrap: Sequence[str] | str, **options: Any) -> Any:
    """A ``kafka.KafkaProducer``: ``options``, then ``[kafka] producer``, then security."""
    from kafka import KafkaProducer

    merged = {**options, **_settings.producer, **security_options()}
    return _bounded(lambda: KafkaProducer(bootstrap_servers=bootstrap, **merged), bootstrap)


def admin(bootstrap: Sequence[str] | str, **options: Any) -> Any:
    """A ``kafka.KafkaAdminClient`` with the security settings."""
    from kafka import KafkaAdminClient

    merged = {**options, **security_options()}
    return _bounded(lambda: KafkaAdminClient(bootstrap_servers=bootstrap, **merged), bootstrap)
