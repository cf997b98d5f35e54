"""The node's small HTTP servers (metrics, health probes, web console): bounded, whoever connects.

Every port is reachable by an attacker, and these three serve orchestrators and scrapers that must
keep getting answers while one is at work. What each server holds is bounded:

- the accept loop does no I/O with a client: a connection goes to a small worker pool (the TLS
  handshake included: a client that never sends its ClientHello must not hold the port, as it did
  with prometheus_client's HTTPS server, which shakes hands in ``accept``);
- at most ``workers`` connections are being served and ``max_pending`` more wait for a worker; past
  that, or past ``per_address`` connections from one client address, a connection is closed at
  once (nothing read), so a flood takes neither threads nor file descriptors (a thread per
  connection without a timeout, as prometheus_client's server has, let idle connections pile up);
- a connection has ``deadline_s`` in all, handshake, request and answer together, and each read or
  write ``io_timeout_s``: a client trickling its request a byte at a time (slowloris) holds one
  worker for ``deadline_s`` at most, whatever the per-read timeout would allow.

One request per connection (HTTP/1.0): a kept-alive connection would hold a worker between requests.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

log = logging.getLogger(__name__)

# A waiting connection's kernel queue: accepted at once, then served, queued or closed.
ACCEPT_BACKLOG = 128


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


class BoundedHTTPServer(HTTPServer):
    """An HTTPServer whose connections are served by a bounded pool, each within a deadline."""

    request_queue_size = ACCEPT_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, name: str,
                 tls: ssl.SSLContext | None = None, workers: int = 4, max_pending: int = 32, per_address: int = 4,
                 deadline_s: float = 5.0, io_timeout_s: float = 2.0) -> None:
        self.name = name
        self._tls = tls
        self._deadline_s = deadline_s
        self._io_timeout_s = io_timeout_s
        self._per_address = per_address
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._room = threading.BoundedSemaphore(workers + max_pending)
        self._lock = threading.Lock()
        self._by_address: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        sock.settimeout(self._io_timeout_s)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accept loop: hand the connection to the pool, or close it unread."""
        host = str(client_address[0])
        with self._lock:
            mine = self._by_address.get(host, 0)
            admitted = mine < self._per_address and self._room.acquire(blocking=False)
            if admitted:
                self._by_address[host] = mine + 1
        if not admitted:
            self.shutdown_request(request)  # a scraper or probe retries; a flood gets nothing
            return
        try:
            self._pool.submit(self._handle, request, client_address)
        except RuntimeError:  # closing: the pool takes nothing more
            self._done(request, host)

    def _handle(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        deadline = _Deadline(request.fileno(), self._deadline_s)
        try:
            if self._tls is not None:
                request = self._tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
                request.do_handshake()  # here, on a worker, within the deadline
            self.finish_request(request, client_address)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.debug("%s: request from %s failed: %s", self.name, host, exc)
        except Exception:
            log.exception("%s: request from %s failed", self.name, host)
        finally:
            deadline.end()
            self._done(request, host)

    def _done(self, request: Any, host: str) -> None:
        self.shutdown_request(request)
        with self._lock:
            left = self._by_address.get(host, 1) - 1
            if left > 0:
                self._by_address[host] = left
            else:
                self._by_address.pop(host, None)
        self._room.release()

    def serve_in_thread(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5}, name=self.name,
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (shutdown() would wait for a serve loop that never ran) and free the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.server_close()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Deadline:
    """Shuts a connection's socket down once ``seconds`` passed (a read or write blocked on it then
    ends), unless ``end`` came first; the file descriptor is never touched after ``end``, when it
    may be closed and reused."""

    def __init__(self, fd: int, seconds: float) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._ended = False
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def end(self) -> None:
        with self._lock:
            self._ended = True
        self._timer.cancel()

    def _cut(self) -> None:
        with self._lock:
            if self._ended:
                return
            try:
                sock = socket.socket(fileno=self._fd)  # the connection's descriptor, not a copy of it
            except OSError:
                return
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.detach()  # the worker closes it
