"""The ``/metrics`` HTTP server of every role: a bounded number of connections, each with a deadline.

prometheus-client's ``start_http_server`` starts one thread per accepted connection and lets it
wait for a request for ever, so every idle connection to the port holds one of the process's file
descriptors. 1,020 idle connections under ``ulimit -n 1024`` left none for the checkpoint or the
budget store, and the run stopped with "Too many open files" (issue 35): whoever can reach the port
could stop the service. This server keeps the scrape side to a fixed share of the descriptors:

* at most :data:`MAX_CONNECTIONS` connections are served at once; one accepted beyond that is closed
  at once (its descriptor is open only between ``accept`` and ``close``), so the server holds at
  most ``MAX_CONNECTIONS + 2`` descriptors (the listening socket, the connections, one being
  refused) however many clients connect;
* a connection that sends no complete request within :data:`REQUEST_TIMEOUT_S` seconds is closed,
  so idle or slow connections free their slot and a scrape gets through once they are gone;
* an error while serving one connection (a client that resets, a broken pipe) is logged at DEBUG
  in one line, never printed as a traceback.

Prometheus scrapes a target over one connection at a time, so the bound only limits clients that
would otherwise take descriptors from the run. The exposition itself is prometheus-client's
(``make_wsgi_app``), unchanged.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger("panpriv.metrics")

MAX_CONNECTIONS = 16
"""Connections served at once; one more is closed as soon as it is accepted (module docstring)."""

REQUEST_TIMEOUT_S = 10.0
"""Seconds a connection may take to send its request (Prometheus' default scrape timeout)."""


class _Handler(WSGIRequestHandler):
    """A request handler whose socket reads time out and that logs nothing per request."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        """No line per scrape."""


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most :data:`MAX_CONNECTIONS` of them (module docstring)."""

    daemon_threads = True  # a scrape in progress never delays the process's exit
    block_on_close = False
    request_queue_size = 128  # the listen backlog: queued connections hold no descriptor of this process

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler], family: socket.AddressFamily) -> None:
        self.address_family = family
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` in a thread if a slot is free, else close it now."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # the thread did not start: nobody else releases its slot
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One DEBUG line instead of socketserver's traceback on stderr."""
        error = sys.exc_info()[1]
        log.debug("metrics connection from %s: %s", client_address, error if error is not None else "error")


def serve(registry: CollectorRegistry, port: int, addr: str) -> Callable[[], None]:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread; return the function
    that stops the server (shuts it down, closes its socket, joins the thread; calling it again does
    nothing). ``OSError`` if the address cannot be bound."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server = BoundedServer((str(sockaddr[0]), port), _Handler, family)
    server.set_app(make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
    thread.start()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)

    return stop
