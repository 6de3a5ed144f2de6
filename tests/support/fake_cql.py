"""A fake Cassandra node on 127.0.0.1 that speaks just enough native protocol v4 to be logged into.

It answers OPTIONS with SUPPORTED, STARTUP with AUTHENTICATE (PasswordAuthenticator) and
every AUTH_RESPONSE with "bad credentials" — so a client can never get past the login,
and the test sees exactly what reached the node:

* ``raw`` — the first bytes of every connection as they crossed the wire (before any TLS):
  a TLS ClientHello starts with ``0x16 0x03``; a plaintext CQL frame with ``0x04``;
* ``logins`` — every AUTH_RESPONSE token (``\\0user\\0password``), decrypted if TLS;
* ``handshake_failures`` — TLS handshakes the client (or the node) broke off.

With ``tls`` (a server :class:`ssl.SSLContext`) it speaks CQL inside TLS only. Clients
must use ``?protocol_version=4`` (no version negotiation here).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["FakeCqlNode", "fake_cql_node"]

_OPTIONS, _STARTUP, _AUTH_RESPONSE, _REGISTER = 0x05, 0x01, 0x0F, 0x0B
_ERROR, _AUTHENTICATE, _SUPPORTED = 0x00, 0x03, 0x06
_BAD_CREDENTIALS = 0x0100


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _frame(stream: int, opcode: int, body: bytes) -> bytes:
    return struct.pack(">BBhBi", 0x84, 0, stream, opcode, len(body)) + body


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class FakeCqlNode:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.raw: list[bytes] = []
        self.logins: list[bytes] = []
        self.startups = 0
        self.handshake_failures: list[str] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-cql", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            first = conn.recv(16, socket.MSG_PEEK)
            with self._lock:
                self.raw.append(first)
            if self.tls is None:
                self._converse(conn)
                return
            try:
                stream = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                with self._lock:
                    self.handshake_failures.append(str(exc))
                return
            with stream:
                self._converse(stream)
        except (ConnectionError, OSError, struct.error):
            pass
        finally:
            with suppress(OSError):
                conn.close()

    def _converse(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            header = _read_exactly(conn, 9)
            version, _flags, stream, opcode, length = struct.unpack(">BBhBi", header)
            body = _read_exactly(conn, length) if length else b""
            if version & 0x7F != 4:
                conn.sendall(_frame(stream, _ERROR, struct.pack(">i", 0x000A) + _string("only protocol v4 here")))
                return
            if opcode == _OPTIONS:
                supported = struct.pack(">H", 2) + _string("CQL_VERSION") + struct.pack(">H", 1) + _string("3.4.5")
                supported += _string("COMPRESSION") + struct.pack(">H", 0)
                conn.sendall(_frame(stream, _SUPPORTED, supported))
            elif opcode == _STARTUP:
                with self._lock:
                    self.startups += 1
                conn.sendall(_frame(stream, _AUTHENTICATE, _string("org.apache.cassandra.auth.PasswordAuthenticator")))
            elif opcode == _AUTH_RESPONSE:
                (size,) = struct.unpack(">i", body[:4])
                with self._lock:
                    self.logins.append(body[4 : 4 + size])
                message = "Provided username and/or password are incorrect"
                conn.sendall(_frame(stream, _ERROR, struct.pack(">i", _BAD_CREDENTIALS) + _string(message)))
            else:
                conn.sendall(_frame(stream, _ERROR, struct.pack(">i", 0x000A) + _string("not supported here")))

    def close(self) -> None:
        self._stop.set()
        with suppress(OSError):
            self._listener.close()
        self._thread.join(timeout=5)


@contextmanager
def fake_cql_node(tls: ssl.SSLContext | None = None) -> Iterator[FakeCqlNode]:
    node = FakeCqlNode(tls)
    try:
        yield node
    finally:
        node.close()
