"""The node's small HTTP servers (metrics, health probes, web console): bounded, whoever connects.

Every port is reachable by an attacker, and these three serve orchestrators and scrapers that must
keep getting answers while one is at work. What each server holds is bounded:

- one selector thread accepts connections, shakes hands (TLS) and reads requests, all without
  blocking; a worker of a small pool is given a connection only once its whole request head has
  arrived, and hands back the answer as bytes, which the selector thread writes out. A client
  trickling its request a byte at a time (slowloris), or never reading its answer, holds no worker:
  before, a worker read the request itself, so one client address (``per_address`` is above
  ``workers`` on every port) trickling a byte every second kept every worker busy, reconnecting as
  each was cut at the deadline, and probes, scrapes and viewers queued behind it got nothing;
- at most ``workers + max_pending`` connections are open and ``per_address`` from one client
  address; a connection past the address's share is closed at once (nothing read). When the server
  is full, a new connection closes the oldest one that is not being handled (still shaking hands,
  reading, or being written to): a flood from many addresses evicts itself, while a probe's request
  arrives in one packet and is handed to a worker at once;
- a request head is at most ``MAX_REQUEST_BYTES``; a connection has ``deadline_s`` in all
  (handshake, request and answer) and ``io_timeout_s`` without progress.

One request per connection (HTTP/1.0).
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger(__name__)

# A waiting connection's kernel queue: accepted at once, then served or closed.
ACCEPT_BACKLOG = 128
# A request head (request line and headers) larger than this closes the connection: these servers
# answer GETs of a few short paths.
MAX_REQUEST_BYTES = 32 * 1024
_ACCEPTS_PER_EVENT = 64
_HANDSHAKE, _READING, _WORKING, _WRITING = "handshake", "reading", "working", "writing"


def tls_context(certfile: str, keyfile: str, cafile: str | None, require_client_cert: bool) -> ssl.SSLContext:
    """A server context: TLS 1.2+, this node's certificate; the client's verified against ``cafile``
    (required, or optional when a CA is given without ``require_client_cert``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    if cafile:
        ctx.load_verify_locations(cafile)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else (ssl.CERT_OPTIONAL if cafile else ssl.CERT_NONE)
    return ctx


class _Conn:
    __slots__ = ("sock", "address", "host", "phase", "head", "answer", "accepted_at", "deadline", "last_io", "closed")

    def __init__(self, sock: Any, address: Any, phase: str, now: float, deadline_s: float) -> None:
        self.sock = sock
        self.address = address
        self.host = str(address[0])
        self.phase = phase
        self.head = bytearray()
        self.answer = memoryview(b"")
        self.accepted_at = now
        self.deadline = now + deadline_s
        self.last_io = now
        self.closed = False


class _Request:
    """What a handler is given as its ``request``: the connection (for its peer and certificate) and
    the request head already read."""

    def __init__(self, sock: Any, head: bytes) -> None:
        self.sock = sock
        self.head = head
        self.answer = b""


def _buffered(handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
    """``handler`` reading the request from memory and writing its answer to memory."""

    class Buffered(handler):  # type: ignore[valid-type, misc]
        def setup(self) -> None:
            self.connection = self.request.sock
            self.rfile = io.BytesIO(self.request.head)
            self.wfile = io.BytesIO()

        def finish(self) -> None:
            self.request.answer = self.wfile.getvalue()

    Buffered.__name__ = Buffered.__qualname__ = handler.__name__
    return Buffered


class BoundedHTTPServer:
    """An HTTP server whose connections cost a worker only while their request is handled (module doc)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, name: str,
                 tls: ssl.SSLContext | None = None, workers: int = 4, max_pending: int = 32, per_address: int = 4,
                 deadline_s: float = 5.0, io_timeout_s: float = 2.0) -> None:
        self.name = name
        self._handler = _buffered(handler)
        self._tls = tls
        self._deadline_s = deadline_s
        self._io_timeout_s = io_timeout_s
        self._per_address = per_address
        self._capacity = workers + max_pending
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._conns: dict[int, _Conn] = {}  # by id(); touched only by the selector thread
        self._by_address: dict[str, int] = {}
        self._answers: queue.SimpleQueue[_Conn] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(ACCEPT_BACKLOG)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.server_address = self._listener.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    # ---- life cycle ----
    def serve_in_thread(self) -> None:
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port (whether or not the serve loop ever ran)."""
        self._closing.set()
        self._wake()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)  # the loop closes everything as it ends
        else:
            self._close_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self._sel.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # full (a wake is pending already) or closed

    # ---- the selector thread ----
    def _serve(self) -> None:
        try:
            while not self._closing.is_set():
                for key, _events in self._sel.select(self._next_timeout()):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    else:
                        self._step(key.data)
                self._take_answers()
                self._expire(time.monotonic())
        except Exception:
            log.exception("%s: serve loop failed", self.name)
        finally:
            self._close_all()

    def _next_timeout(self) -> float:
        now = time.monotonic()
        soonest = now + 0.5
        for c in self._conns.values():
            if c.phase != _WORKING:
                soonest = min(soonest, c.deadline, c.last_io + self._io_timeout_s)
        return max(0.0, soonest - now)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: try again on the next event
                log.warning("%s: accept failed: %s", self.name, exc)
                return
            host = str(address[0])
            if self._by_address.get(host, 0) >= self._per_address or not self._make_room():
                _close_socket(sock)  # a scraper or probe retries; a flood gets nothing
                continue
            sock.setblocking(False)
            now = time.monotonic()
            phase = _READING
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    _close_socket(sock)
                    continue
                phase = _HANDSHAKE
            conn = _Conn(sock, address, phase, now, self._deadline_s)
            self._conns[id(conn)] = conn
            self._by_address[host] = self._by_address.get(host, 0) + 1
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _make_room(self) -> bool:
        """True when one more connection fits, closing the oldest one not being handled if need be."""
        if len(self._conns) < self._capacity:
            return True
        idle = [c for c in self._conns.values() if c.phase != _WORKING]
        if not idle:
            return False
        self._close(min(idle, key=lambda c: c.accepted_at))
        return True

    def _step(self, conn: _Conn) -> None:
        try:
            if conn.phase == _HANDSHAKE:
                self._handshake(conn)
            if conn.phase == _READING:
                self._read(conn)
            elif conn.phase == _WRITING:
                self._write(conn)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("%s: connection from %s failed: %s", self.name, conn.host, exc)
            self._close(conn)

    def _handshake(self, conn: _Conn) -> None:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        conn.last_io = time.monotonic()
        conn.phase = _READING
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        while True:
            try:
                chunk = conn.sock.recv(16384)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)  # after a want-write: read again
                return
            except ssl.SSLWantWriteError:
                self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
                return
            if not chunk:
                self._close(conn)
                return
            start = max(0, len(conn.head) - 3)
            conn.head += chunk
            conn.last_io = time.monotonic()
            if b"\r\n\r\n" in conn.head[start:] or b"\n\n" in conn.head[start:]:
                self._dispatch(conn)
                return
            if len(conn.head) > MAX_REQUEST_BYTES:
                log.debug("%s: a request head from %s past %d bytes: closed", self.name, conn.host, MAX_REQUEST_BYTES)
                self._close(conn)
                return

    def _dispatch(self, conn: _Conn) -> None:
        self._sel.unregister(conn.sock)
        conn.phase = _WORKING
        try:
            self._pool.submit(self._work, conn)
        except RuntimeError:  # closing: the pool takes nothing more
            self._close(conn)

    def _write(self, conn: _Conn) -> None:
        while conn.answer:
            try:
                sent = conn.sock.send(conn.answer[:65536])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
                return
            except ssl.SSLWantReadError:
                self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
                return
            conn.answer = conn.answer[sent:]
            conn.last_io = time.monotonic()
        self._close(conn)

    def _take_answers(self) -> None:
        while True:
            try:
                conn = self._answers.get_nowait()
            except queue.Empty:
                return
            if conn.closed:
                continue
            if not conn.answer:
                self._close(conn)
                continue
            now = time.monotonic()
            conn.phase = _WRITING
            conn.last_io = now
            conn.deadline = max(conn.deadline, now + self._io_timeout_s)  # the handler's time is not the client's
            self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)
            self._step(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.phase != _WORKING and
                     (now >= c.deadline or now - c.last_io >= self._io_timeout_s)]:
            log.debug("%s: connection from %s cut (%s for %.1f s)", self.name, conn.host, conn.phase,
                      now - conn.accepted_at)
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(id(conn), None)
        left = self._by_address.get(conn.host, 1) - 1
        if left > 0:
            self._by_address[conn.host] = left
        else:
            self._by_address.pop(conn.host, None)
        if conn.phase != _WORKING:
            try:
                self._sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        _close_socket(conn.sock)

    # ---- a worker ----
    def _work(self, conn: _Conn) -> None:
        request = _Request(conn.sock, bytes(conn.head))
        try:
            self._handler(request, conn.address, self)  # type: ignore[arg-type]
        except Exception:
            log.exception("%s: request from %s failed", self.name, conn.host)
        conn.answer = memoryview(request.answer)
        self._answers.put(conn)
        self._wake()


def _close_socket(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
