"""The real ``panpriv run`` as a subprocess, for tests that watch the running service from outside.

:class:`PanprivService` writes a TOML config (the service's own schema, streamer/config.py),
starts ``python -m panpriv run --config …`` with its output in a log file, waits for its
``/metrics`` endpoint, and stops it with SIGTERM (the service's clean stop) returning the exit code.
:func:`produce_json_records` fills a topic with JSON records, plus malformed messages by reason.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from panpriv.streamer.io.codec import encode_json
from panpriv.streamer.state.checkpoint import Checkpoint, CheckpointStore
from tests.realparts import STARTUP_TIMEOUT_S, ManagedProcess, free_loopback_port, wait_until

# Malformed messages, one per rejection reason the codec names (panpriv.streamer.io.codec.Reason).
MALFORMED: dict[str, bytes] = {
    "undecodable": b"\xff not json",
    "missing_field": b'{"x": [0.1, 0.2]}',
    "wrong_dimension": b'{"x": [0.1, 0.2], "y": 1}',
}


def toml_value(value: Any) -> str:
    """A Python scalar, list or mapping as a TOML value (JSON's syntax is TOML's for scalars and
    lists; a mapping is an inline table)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value) if isinstance(value, Path) else value)


def write_toml(path: Path, config: Mapping[str, Any]) -> Path:
    """Write ``{"key": value, "section": {"key": value}}`` as TOML (top-level keys first)."""
    lines = [f"{k} = {toml_value(v)}" for k, v in config.items() if not isinstance(v, Mapping)]
    for section, body in config.items():
        if isinstance(body, Mapping):
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def produce_json_records(bootstrap: str, topic: str, n: int, dim: int, partitions: int, seed: int,
                         malformed: Mapping[str, int] | None = None) -> dict[str, int]:
    """Send ``n`` valid JSON records (``‖x‖ ≈ 0.5``, labels ±1) round-robin over the partitions,
    then ``malformed[reason]`` malformed messages per reason; return the malformed counts sent."""
    from kafka import KafkaProducer

    rng = np.random.default_rng(seed)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    try:
        X = rng.standard_normal((n, dim)) * (0.5 / np.sqrt(dim))
        for i in range(n):
            producer.send(topic, encode_json(X[i].tolist(), 1.0 if i % 2 else -1.0), partition=i % partitions)
        sent: dict[str, int] = {}
        for j, (reason, count) in enumerate((malformed or {}).items()):
            for k in range(count):
                producer.send(topic, MALFORMED[reason], partition=(j + k) % partitions)
            sent[reason] = count
        producer.flush()
    finally:
        producer.close()
    return sent


class PanprivService:
    """``panpriv run --config <workdir>/panpriv.toml`` with metrics on a free loopback port.

    ``config`` holds the settings of the test (source, records, learner, …); ``out``, ``progress``
    and ``[metrics]`` are filled in here. ``env``: the process's environment (default: this one's).
    """

    def __init__(self, workdir: Path, config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_loopback_port()
        self.out = workdir / "out"
        full = {"out": self.out, "progress": "off", **config,
                "metrics": {"port": self.port, "addr": "127.0.0.1"}}
        self.config_path = write_toml(workdir / "panpriv.toml", full)
        self.metrics_url = f"http://127.0.0.1:{self.port}/metrics"
        self.log_path = workdir / "panpriv.log"
        self._process = ManagedProcess(
            [sys.executable, "-m", "panpriv", "run", "--config", str(self.config_path)], self.log_path,
            None if env is None else dict(env),
        )
        wait_until(self._serves_metrics, STARTUP_TIMEOUT_S, f"panpriv metrics at {self.metrics_url}")

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def target(self) -> str:
        """The ``host:port`` Prometheus scrapes."""
        return f"127.0.0.1:{self.port}"

    def _serves_metrics(self) -> bool:
        self._process.check_alive()
        self.scrape()
        return True

    def scrape(self) -> str:
        """The current ``/metrics`` text."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return response.read().decode()

    def checkpoint(self) -> Checkpoint | None:
        """The last durable checkpoint (the manifest is replaced atomically, so always whole)."""
        return CheckpointStore(self.out / "checkpoints").load()

    def learned(self) -> int:
        """Records learned so far (``panpriv_records_total``)."""
        match = re.search(r"^panpriv_records_total ([0-9.e+]+)$", self.scrape(), re.M)
        return int(float(match[1])) if match else 0

    def wait_for_checkpoint(self, records: int, timeout_s: float = 60.0, settle_s: float = 5.0) -> Checkpoint:
        """Wait until ``records`` records are learned and a checkpoint holds what they left; return
        it. (pan-acsa's checkpoint holds its last batch boundary, which may cover fewer.) The service
        checkpoints within ``checkpoint.every_seconds`` of learning anything, so the checkpoint that
        follows the last record is the newest one once ``settle_s`` (above that interval) passes
        without another."""
        def learned() -> bool:
            self._process.check_alive()
            return self.learned() >= records

        wait_until(learned, timeout_s, f"{records} records learned (log: {self.log_path})")
        deadline = time.monotonic() + settle_s
        saved = self.checkpoint()
        while time.monotonic() < deadline:
            self._process.check_alive()
            time.sleep(0.1)
            newer = self.checkpoint()
            if newer is not None and (saved is None or newer.sequence > saved.sequence):
                saved, deadline = newer, time.monotonic() + settle_s
        assert saved is not None, f"no checkpoint after {records} records (log: {self.log_path})"
        return saved

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the service's clean stop: final checkpoint and snapshot); return the exit code."""
        process = self._process.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout_s)
        finally:
            self._process.stop()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop whatever the state (teardown)."""
        self._process.stop()
