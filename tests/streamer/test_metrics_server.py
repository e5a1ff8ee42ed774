"""The bounded ``/metrics`` server (streamer/metrics/server.py): how many descriptors a flood of
connections can take from the process, how long an idle one keeps its slot, and what an error
in one connection prints (issue 35, point 5; the run under a real descriptor limit is
tests/faults/test_metrics_flood.py)."""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from panpriv.streamer.metrics import server
from tests.faults.harness import wait_for
from tests.realparts import free_loopback_port


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def scrape(port: int) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return bytes(response.read())
    except OSError:
        return None


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A registry with one counter served on a free loopback port; idle connections time out after 1 s."""
    monkeypatch.setattr(server._Handler, "timeout", 1.0)
    registry = CollectorRegistry()
    Counter("probe", "A counter to find in a scrape.", registry=registry).inc()
    port = free_loopback_port()
    stop = server.serve(registry, port, "127.0.0.1")
    try:
        yield port
    finally:
        stop()


def test_a_flood_of_idle_connections_takes_a_bounded_number_of_descriptors(served: int) -> None:
    """On the base (one thread and one descriptor per connection) the process held all 200."""
    before = open_descriptors()
    flood = [socket.create_connection(("127.0.0.1", served), timeout=10) for _ in range(200)]
    try:
        time.sleep(0.5)  # let the server accept what it will: the bound must hold whatever it got to
        wait_for(lambda: open_descriptors() - before - len(flood) <= server.MAX_CONNECTIONS + 2, 30,
                 "the server closing connections beyond its bound")
        # an idle connection loses its slot after the deadline: a scrape gets through with the flood open
        wait_for(lambda: scrape(served) is not None, 30, "a scrape through the flood")
    finally:
        for connection in flood:
            connection.close()
    assert b"probe_total 1.0" in (scrape(served) or b"")


def test_an_idle_connection_is_closed_after_the_request_deadline(served: int) -> None:
    with socket.create_connection(("127.0.0.1", served), timeout=30) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server (recv would raise TimeoutError after 30 s)
        assert time.monotonic() - started < 25


def test_an_error_in_one_connection_is_one_debug_line_not_a_traceback(served: int, capfd: pytest.CaptureFixture[str],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="panpriv.metrics")
    with socket.create_connection(("127.0.0.1", served), timeout=10) as half:
        half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished: the deadline ends it
        wait_for(lambda: any("metrics connection from" in r.getMessage() for r in caplog.records), 30,
                 "the handler's error logged")
    assert "Traceback" not in capfd.readouterr().err
    assert scrape(served) is not None  # the server still serves


def listening_addresses(port: int) -> set[str]:
    """The local IPv4 addresses listening on ``port`` (from /proc/net/tcp: state 0A is LISTEN)."""
    found = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_every_role_serves_its_metrics_on_the_loopback_interface_unless_told_otherwise() -> None:
    """The E-S-A and scale-out roles listened on 0.0.0.0 by default (issue 35, point 5); ``run`` on
    127.0.0.1 (config.MetricsConfig). The deployment says --metrics-addr 0.0.0.0 itself."""
    from panpriv.streamer.commands.cli import build_parser
    from panpriv.streamer.config import MetricsConfig
    from panpriv.streamer.metrics.roles import RoleMetrics
    from panpriv.streamer.metrics.service import ServiceMetrics

    parser = build_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    roles = {name: sub.get_default("metrics_addr") for name, sub in commands.items()
             if any(action.dest == "metrics_addr" for action in sub._actions)}
    assert {"shuffle", "analyze", "worker", "coordinate"} <= set(roles), roles
    assert set(roles.values()) == {"127.0.0.1"}, roles
    assert MetricsConfig().addr == "127.0.0.1"
    for metrics in (ServiceMetrics(), RoleMetrics(None, "probe", "A role.")):
        port = free_loopback_port()
        stop = metrics.serve(port)
        try:
            assert listening_addresses(port) == {"127.0.0.1"}
        finally:
            stop()
