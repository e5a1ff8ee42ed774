"""Idle connections to the metrics port cannot starve the run of file descriptors (issue 35, point 5).

On the base, 1,020 idle connections to ``--metrics-port`` of a run limited to 1,024 descriptors
made it exit 1 ("the privacy budget store failed … unable to open database file", or "cannot write
the checkpoint … Too many open files"): prometheus-client's server held one descriptor per idle
connection. The bounded server (streamer/metrics/server.py) holds at most ``MAX_CONNECTIONS + 2``.
The run here is a real process with ``RLIMIT_NOFILE`` lowered to 1,024, flooded from this one.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from panpriv.streamer.metrics.server import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from tests.faults.harness import ROOT, assert_no_traceback, slow_synthetic_run, wait_for
from tests.realparts import free_loopback_port

LIMIT = 1024
IDLE = 1020


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def enough_descriptors() -> Iterator[None]:
    """This process opens IDLE sockets: raise its own soft limit for the test (skip if the hard
    one forbids)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = IDLE + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
@pytest.mark.usefixtures("enough_descriptors")
def test_idle_metrics_connections_do_not_starve_the_checkpoint(tmp_path: Path) -> None:
    port = free_loopback_port()
    out = tmp_path / "out"
    checkpoint = out / "checkpoints" / "checkpoint.json"
    args = [*slow_synthetic_run(out), "--metrics-port", str(port), "--state-dir", str(tmp_path / "state")]
    log = tmp_path / "run.log"
    with open(log, "wb") as sink:
        run = subprocess.Popen([sys.executable, "-m", "panpriv", *args], stdout=sink, stderr=sink, cwd=ROOT,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT)))
    idle: list[socket.socket] = []
    try:
        wait_for(lambda: checkpoint.exists() or run.poll() is not None, 120, "the run's first checkpoint")
        assert run.poll() is None, log.read_text()
        before = descriptors(run.pid)
        for _ in range(IDLE):
            connection = socket.create_connection(("127.0.0.1", port), timeout=30)
            idle.append(connection)
        most = descriptors(run.pid)
        # the run keeps checkpointing with every idle connection still open
        versions = {checkpoint.stat().st_mtime_ns}

        def checkpointed_five_times() -> bool:
            versions.add(checkpoint.stat().st_mtime_ns)
            return run.poll() is not None or len(versions) > 5

        wait_for(checkpointed_five_times, 120, "five more checkpoints under the flood")
        assert run.poll() is None, log.read_text()[-3000:]
        most = max(most, descriptors(run.pid))
        assert most <= before + MAX_CONNECTIONS + 2 + 8, (before, most)  # + 8: the run's own files come and go
        # a scrape gets through once the idle connections' deadline has passed, the flood still open
        wait_for(lambda: _scrape(port), 3 * REQUEST_TIMEOUT_S + 60, "a scrape through the flood")
        assert run.poll() is None
    finally:
        for connection in idle:
            connection.close()
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
        code = run.wait(60)
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert_no_traceback(output)
    assert "Too many open files" not in output and "error" not in output.lower(), output[-3000:]


def _scrape(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return b"panpriv_records_total" in response.read()
    except OSError:
        return False
