"""The Kafka-protocol listener: Kafka's framing on a TCP (or TLS) socket, on the broker's event loop.

One coroutine per connection reads a size-prefixed frame and starts it; the next frame is read
only once that request lets it (when done, or, for a produce, once its batches are appended), so
as in Kafka's network layer a connection has one request being read and started at a time and
responses go out in request order; a produce's acks=all wait overlaps the next requests, up to
``PIPELINE_DEPTH`` answers outstanding per connection. Every bound is checked before bytes are
buffered:

- a frame larger than ``socket.request.max.bytes`` closes the connection unread;
- the frames being read or handled across all connections hold at most ``queued.max.request.bytes``
  (reserved before a body is read; over it a connection waits unread, as with Kafka's memory pool),
  and those of one client address at most an eighth of it (``FRAME_POOL_SHARE``; at least one frame of
  ``socket.request.max.bytes``): over its share, an address's connections wait behind its own frames only;
- connections beyond ``max.connections`` (shared with nothing else: this listener has its
  own count), or beyond ``max.connections.per.ip`` from one client address, are closed at
  accept (one address cannot take every connection of the listener);
- a connection silent for ``connections.max.idle.ms`` is closed;
- on SASL listeners, a client must authenticate within ``kafka.authentication.timeout.ms`` (its
  frames too: a frame's body must arrive within what is left of it) and may send only ApiVersions,
  SaslHandshake and SaslAuthenticate before (KIP-152), in frames of at most
  ``sasl.server.max.receive.size`` held in a small pool of their own (an eighth of it per address),
  never the pool logged-in clients' requests use; a failed authentication is answered and the connection closed, as Kafka does;
- a frame over ``PARSE_ON_LOOP_MAX_BYTES`` is checked and parsed on a worker thread, and what a
  frame may make that walk do is bounded (bounds.py), so no frame stalls the event loop;
- an answer of more than ``ENCODE_ON_LOOP_MAX_ITEMS`` array elements (a Metadata of thousands of topics) is
  encoded on those worker threads too; a client address has one large frame or answer there at a time
  (``parse_turn``), and, with ``io_turn``, one large Metadata answer being built on the io threads. An answer
  encoded off the loop still goes out in request order: the writer sends each request's answer in turn;
- a request that cannot be parsed, or an API or version not advertised, closes the
  connection (Kafka does the same: there is no way to answer what cannot be read) and is
  counted; the broker itself is never affected.

Security: PLAINTEXT (the principal is ANONYMOUS), SSL (a verified client certificate maps
through ``ssl.principal.mapping.rules``, as on gRPC), SASL_PLAINTEXT and SASL_SSL
(SCRAM-SHA-256/512 through the node's ScramAuthenticator, and PLAIN checked against the
same stored SCRAM credentials). The principal then meets the same ACLs and quotas. A SASL
connection whose user is deleted, or whose password is changed, is closed at its next request
(the client must log in again), where Kafka keeps it open unless ``connections.max.reauth.ms`` is set.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from broker import principal as principals
from broker.address_bar import AddressBar, attach
from broker.admission import (
    DEFAULT_CONNECTION_IDLE_MS,
    ByteBudget,
    ClientByteShares,
    ConnectionDeadline,
    ConnectionSlots,
    ConnectionsPerIp,
    connections_within_descriptors,
    stop_serving,
)
from broker.cert_revocation import ConnectionTrust
from broker.cpu_shares import CpuShares
from broker.fair_pool import CLIENT, FairExecutor
from broker.kafka_wire import apis, bounds, codec
from broker.kafka_wire.context import Aborted, KafkaCallContext
from broker.log_limits import ThrottledWarning
from broker.principal import AUTH_SASL, Authentication
from broker.receiving import DEFAULT_REQUEST_MAX_BYTES
from metadata_quorum.security import ScramCredential
from proto import errors
from proto import security_pb2 as spb
from proto.errors import ErrorCode
from storage.file_records import FileRecords

log = logging.getLogger(__name__)

DEFAULT_SASL_TIMEOUT_MS = 10_000
DEFAULT_SASL_MAX_RECEIVE_BYTES = 64 * 1024
PRE_AUTH_POOL_BYTES = 16 * 1024 * 1024
# One client address's frames take at most this fraction of each frame pool (and at least one frame of the
# largest size): connections from one address that announce frames and send nothing cannot hold every other
# client's requests (33 connections, 4 bytes each, held a PLAINTEXT listener for 30 s; found by an audit).
FRAME_POOL_SHARE = 8
# A frame larger than this is parsed on a worker thread, not the event loop: checking and reading a
# request is Python work per element, and an 8 MiB frame of empty entries took 2-10 s of the loop,
# every other connection of the broker waiting (found by an audit).
PARSE_ON_LOOP_MAX_BYTES = 16 * 1024
PARSE_WORKERS = 2
# An answer of more array elements than this (codec.items) is encoded on the parse pool, not the event loop:
# encoding is ~3 us an element (a Metadata of 10,000 topics: ~130 ms, every other client of the broker waiting),
# a hand-off to a thread ~0.1 ms. Below it an answer takes at most ~2 ms of the loop (most produce and fetch
# answers stay there).
ENCODE_ON_LOOP_MAX_ITEMS = codec.LARGE_ANSWER_ITEMS
OVERLOAD_BACKOFF_S = 0.05
PIPELINE_DEPTH = 5  # answers outstanding per connection (librdkafka's and Kafka's max.in.flight default)
SASL_PLAIN = "PLAIN"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_SIZE = struct.Struct(">i")
T = TypeVar("T")


@dataclass
class KafkaListenerSpec:
    name: str
    host: str
    port: int
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    ssl_context: ssl.SSLContext | None = None
    # The broker's max.connections.per.ip with its overrides, their host names resolved once for all its ports
    # (None: read from the listener's config).
    connections_per_ip: ConnectionsPerIp | None = None
    # With ssl.client.auth=required: the listener's CA bundle as it is now (broker/cert_revocation.py); a
    # connection whose certificate it no longer trusts is closed at its next request.
    trust: ConnectionTrust | None = None


@dataclass(slots=True)
class ListenerStats:
    connections: int = 0
    connections_total: int = 0
    refused_connections_total: int = 0
    requests_total: int = 0
    malformed_requests_total: int = 0
    authentication_failures_total: int = 0
    sendfile_bytes_total: int = 0
    sendfile_fallbacks_total: int = 0
    requests_by_api: dict[int, int] = field(default_factory=dict)


def _api_name(api_key: int) -> str:
    """``Fetch (1)``, as Kafka names an API in its logs; ``API 9999`` for a key Brook does not serve."""
    served = apis.SUPPORTED.get(api_key)
    if served is None:
        return f"API {api_key}"
    return f"{codec.request_schema(api_key, served[1]).__name__.removesuffix('Request')} ({api_key})"


class KafkaListener:
    """Serves one Kafka-protocol listener of a broker; start()/stop() on the broker's loop."""

    def __init__(self, broker: Any, spec: KafkaListenerSpec, defaults: dict[str, str]) -> None:
        self.broker = broker
        self.spec = spec
        self.apis = apis.KafkaApis(broker, spec.name)
        self.apis.io_turn = self.io_turn
        self.max_request_bytes = int(defaults.get("socket.request.max.bytes", str(DEFAULT_REQUEST_MAX_BYTES)))
        self.idle_s = int(defaults.get("connections.max.idle.ms", str(DEFAULT_CONNECTION_IDLE_MS))) / 1000
        self.sasl_timeout_s = int(defaults.get("kafka.authentication.timeout.ms", str(DEFAULT_SASL_TIMEOUT_MS))) / 1000
        self.request_timeout_s = int(defaults.get("kafka.request.timeout.ms", "30000")) / 1000
        # Kafka's socket.send/receive.buffer.bytes: the kernel's buffers of each connection (-1: the system's).
        self.socket_buffers = {socket.SO_SNDBUF: int(defaults.get("socket.send.buffer.bytes", "102400")),
                               socket.SO_RCVBUF: int(defaults.get("socket.receive.buffer.bytes", "102400"))}
        self.max_connections = connections_within_descriptors(int(defaults.get("max.connections", "10000")), 4,
                                                              f"Kafka listener {spec.name}")
        self.max_connections_per_ip = spec.connections_per_ip or ConnectionsPerIp.of(defaults,
                                                                                      f"Kafka listener {spec.name}")
        self._parse_turns: dict[str, asyncio.Lock] = {}  # client address -> its turn at the parse pool
        self._io_turns: dict[str, asyncio.Lock] = {}  # client address -> its turn for large answers on io threads
        self.sasl = spec.protocol in ("SASL_PLAINTEXT", "SASL_SSL")
        self.stats = ListenerStats()
        self._slots = ConnectionSlots(self.max_connections, self.max_connections_per_ip, self.stats)
        self._refused_handshakes = ThrottledWarning(log)  # a line per 10 s at most, the rest counted
        self.refused_versions = ThrottledWarning(log)
        # What any client can make happen on every connection it opens: a line per 10 s at most, the rest counted
        # (a client reconnecting in a loop wrote hundreds of MB a minute of one line; audit).
        self.oversized_frames = ThrottledWarning(log)
        self.before_login = ThrottledWarning(log)
        self.malformed = ThrottledWarning(log, level=logging.INFO)
        self.refused_calls = ThrottledWarning(log, level=logging.INFO)
        self.sendfile_ok = True  # False once the platform refused sendfile on this listener's sockets
        # Request frames being read or handled, across all connections (Kafka's memory pool).
        self.frame_budget = ByteBudget(int(defaults.get("queued.max.request.bytes", str(256 * 1024 * 1024))))
        self.frame_shares = ClientByteShares(max(self.max_request_bytes,
                                                 self.frame_budget.total_bytes // FRAME_POOL_SHARE))
        # Before a SASL login a connection may send only ApiVersions, SaslHandshake and SaslAuthenticate: small
        # frames (Kafka's sasl.server.max.receive.size), from a pool of their own, so clients that never log in
        # cannot hold the pool logged-in clients' requests need (a few 8 MiB size prefixes did).
        self.pre_auth_max_bytes = min(self.max_request_bytes, int(defaults.get(
            "sasl.server.max.receive.size", str(DEFAULT_SASL_MAX_RECEIVE_BYTES))))
        self.pre_auth_budget = ByteBudget(PRE_AUTH_POOL_BYTES)
        self.pre_auth_shares = ClientByteShares(max(self.pre_auth_max_bytes, PRE_AUTH_POOL_BYTES // FRAME_POOL_SHARE))
        # Large frames are parsed, and large answers encoded, here, two at a time: the loop goes on serving meanwhile.
        # Each address's share of the interpreter (broker/cpu_shares.py) counts this work too.
        capacity = getattr(broker, "capacity", None)
        self.cpu: CpuShares | None = getattr(capacity, "cpu", None)
        self.parse_pool = FairExecutor(PARSE_WORKERS, thread_name_prefix=f"kafka-{spec.name}-parse", cpu=self.cpu)
        self.port = spec.port
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def parse_turn(self, host: str) -> asyncio.Lock:
        """The lock that takes ``host``'s large frames to the parse pool one at a time (kept while the address
        has connections: dropped in _accept's end with its count)."""
        turn = self._parse_turns.get(host)
        if turn is None:
            turn = self._parse_turns[host] = asyncio.Lock()
        return turn

    def io_turn(self, host: str) -> asyncio.Lock:
        """The lock that takes ``host``'s large answers to the broker's io threads one at a time (a Metadata of
        thousands of topics is built there: a client with many connections cannot fill the threads produce and
        fetch need); dropped with parse_turn's."""
        turn = self._io_turns.get(host)
        if turn is None:
            turn = self._io_turns[host] = asyncio.Lock()
        return turn

    def max_elements(self) -> int:
        """Elements (array entries, entities) a request frame may hold: four times the cluster's topics and
        partitions (a request names each once; the handlers then bound what it names to twice), at least
        bounds.MIN_ELEMENTS, at most bounds.MAX_ELEMENTS. Walking them costs ~2.5 µs each."""
        cache = getattr(self.broker, "metadata_cache", None)
        topics, partitions = cache.counts() if cache is not None else (0, 0)
        return min(bounds.MAX_ELEMENTS, max(bounds.MIN_ELEMENTS, 4 * (topics + partitions)))

    async def start(self) -> None:
        # TLS is started per connection in _accept, once the connection is counted: with the server's
        # own ssl= the handshake ran before any bound saw the connection, so clients that never
        # finished it each held a descriptor for kafka.authentication.timeout.ms, however many.
        self._server = await asyncio.start_server(self._accept, self.spec.host, self.spec.port, limit=64 * 1024,
                                                  reuse_address=True)
        sockets = self._server.sockets
        for sock in sockets:  # accepted connections inherit them (a receive buffer, before its window is offered)
            for option, size in self.socket_buffers.items():
                if size != -1:
                    sock.setsockopt(socket.SOL_SOCKET, option, size)
        self.port = sockets[0].getsockname()[1]
        self._slots.bar = AddressBar([self.port], f"Kafka listener {self.spec.name}", where="its port",
                                     installer=lambda _ports, addresses: attach(sockets, addresses))
        log.info("Kafka listener %s on %s:%d (%s)", self.spec.name, self.spec.host, self.port, self.spec.protocol)

    @property
    def bar(self) -> AddressBar | None:
        """The addresses barred from this listener for flooding it past max.connections.per.ip."""
        return self._slots.bar

    async def stop(self) -> None:
        self._slots.close()
        await stop_serving(self._server, self._tasks)
        self.parse_pool.shutdown(wait=False, cancel_futures=True)
        self.apis.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("unknown", 0)
        host = str(peer[0])
        if not self._slots.take(host):
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn: _Connection | None = None
        try:
            # Before the handshake: a bundle changed during it is checked at the first request.
            generation = self.spec.trust.generation() if self.spec.trust is not None else 0
            if self.spec.ssl_context is not None:
                try:
                    await writer.start_tls(self.spec.ssl_context, ssl_handshake_timeout=self.sasl_timeout_s)
                except ssl.SSLError as exc:
                    # As Kafka's "Failed authentication with /host (SSL handshake failed)": a client with a
                    # certificate the listener does not trust, or none, left no trace before (Go clients audit).
                    self.stats.authentication_failures_total += 1
                    self._refused_handshakes.warn(
                        "Kafka listener %s: TLS handshake with %s failed: %s (a client certificate its CA bundle "
                        "does not trust, none where one is required, or no common protocol or cipher)",
                        self.spec.name, host, exc.reason or exc)
                    raise
            conn = _Connection(self, reader, writer)
            conn.trust_generation = generation
            await conn.metered(conn.run())
        except asyncio.CancelledError:
            pass
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass  # the client went away, was too slow, or failed the handshake: nothing to answer
        except Exception:
            log.exception("Kafka connection from %s failed", conn.peer_text if conn is not None else host)
        finally:
            if conn is not None:
                conn.read_deadline.cancel()  # else its timer holds the connection until the deadline passes
                conn.release_all()
            if self._slots.give_back(host):  # its last connection: its turns go too
                self._parse_turns.pop(host, None)
                self._io_turns.pop(host, None)
            self._tasks.discard(task)
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()  # a client that stopped reading: drop what it did not take
            else:
                writer.close()


class _WriterFailed(Exception):
    """The connection's answers can no longer be written: its reads end."""


class _Reservation:
    """One frame's bytes: first from its client address's share of a frame pool, then from the pool itself."""

    __slots__ = ("pool", "shares", "host", "pooled", "shared")

    def __init__(self, pool: ByteBudget, shares: ClientByteShares, host: str) -> None:
        self.pool, self.shares, self.host = pool, shares, host
        self.pooled = self.shared = 0  # what is held, given back once by give_back

    def try_take(self, size: int) -> bool:
        """Both at once, without waiting (the usual case): True. False leaves nothing taken."""
        shared = self.shares.try_acquire(self.host, size)
        if shared is None:
            return False
        self.shared = shared
        if self.pool.try_acquire(size):
            self.pooled = self.pool.clamp(size)
            return True
        self.give_back()
        return False

    async def take(self, size: int) -> None:
        """Wait for the address's share (only its own frames are ahead), then for the pool. Cancellable: what was
        granted is recorded, for give_back."""
        self.shared = await self.shares.acquire(self.host, size)
        self.pooled = await self.pool.acquire(size)

    def give_back(self) -> None:
        if self.pooled:
            self.pool.release(self.pooled)
            self.pooled = 0
        if self.shared:
            self.shares.release(self.host, self.shared)
            self.shared = 0


class _Connection:
    def __init__(self, listener: KafkaListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.listener = listener
        self.reader = reader
        self.writer = writer
        # The deadline of the frame being read (the next one: connections.max.idle.ms, or what is left of the
        # login; its rest: the request timeout): past it the read fails with TimeoutError.
        self.read_deadline = ConnectionDeadline(asyncio.get_running_loop(),
                                                lambda: reader.set_exception(TimeoutError()))
        self._writer_failed = False
        self._waiting: asyncio.Future[None] | None = None  # a wait for room in a frame pool
        peer = writer.get_extra_info("peername") or ("unknown", 0)
        host, port = str(peer[0]), int(peer[1])
        self.client_host = host
        self.peer_text = f"{host}:{port}"
        self.grpc_peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        sslobj = writer.get_extra_info("ssl_object")
        self.sslobj = sslobj
        self.trust_generation = 0  # the listener's CA bundle generation its certificate is known trusted under
        self.tls = sslobj is not None
        # "kafka:" never parses as a loopback gRPC peer: no Kafka connection is trusted as a broker.
        self.auth = principals.connection_authentication(sslobj, host, f"kafka:{host}")
        self.authenticated = not listener.sasl
        self.credential: ScramCredential | None = None  # the SASL credential proved (None without SASL)
        self.close_after_answer = False
        self.reservations: list[_Reservation] = []  # frames' bytes held in the listener's pools
        self.mechanism: str | None = None
        self.exchange_id = ""
        self.started = time.monotonic()

    async def _read_frame(self) -> tuple[bytes, _Reservation] | None:
        """(frame, bytes reserved for it in the listener's memory pool) or None to close. The reservation is
        made before the body is read, so the frames held across all connections never exceed
        ``queued.max.request.bytes`` (as Kafka's memory pool): over it, a connection waits unread. And those
        of one client address never exceed its share: size prefixes alone cannot take the pool from others."""
        lst = self.listener
        deadline = self.read_deadline
        deadline.within(lst.idle_s if self.authenticated else self._login_time_left())
        try:
            head = await self.reader.readexactly(4)
        except (TimeoutError, asyncio.IncompleteReadError):
            return None
        finally:
            deadline.clear()
        (size,) = _SIZE.unpack(head)
        most, key = ((lst.max_request_bytes, "socket.request.max.bytes") if self.authenticated else
                     (lst.pre_auth_max_bytes, "sasl.server.max.receive.size, before authentication"))
        if size < 8 or size > most:
            lst.oversized_frames.warn("Kafka listener: closing %s: a request of %d bytes (%s=%d)", self.peer_text,
                                      size, key, most)
            lst.stats.malformed_requests_total += 1
            return None
        reservation = (_Reservation(lst.frame_budget, lst.frame_shares, self.client_host) if self.authenticated
                       else _Reservation(lst.pre_auth_budget, lst.pre_auth_shares, self.client_host))
        self.reservations.append(reservation)
        if self.authenticated:
            if not reservation.try_take(size):
                await self._waited(reservation.take(size))
            body_timeout = lst.request_timeout_s
        else:  # the whole login, frames included, within kafka.authentication.timeout.ms
            try:
                await asyncio.wait_for(reservation.take(size), self._login_time_left())
            except TimeoutError:
                self._release(reservation)
                return None
            body_timeout = self._login_time_left()
        deadline.within(body_timeout)
        try:
            return await self.reader.readexactly(size), reservation
        except BaseException:
            self._release(reservation)
            raise
        finally:
            deadline.clear()

    async def _waited(self, wait: Coroutine[Any, Any, None]) -> None:
        """``wait`` for room in a frame pool; it ends with _WriterFailed once the connection's answers can no
        longer be written."""
        waiting = asyncio.ensure_future(wait)
        self._waiting = waiting
        try:
            return await waiting
        except asyncio.CancelledError:
            if self._writer_failed:
                raise _WriterFailed() from None
            raise
        finally:
            self._waiting = None

    def _login_time_left(self) -> float:
        return max(0.0, self.listener.sasl_timeout_s - (time.monotonic() - self.started))

    def _release(self, reservation: _Reservation) -> None:
        """Give a frame's reserved bytes back to their pool, once (a task cancelled before it ran never does:
        the connection's end releases what is left)."""
        reservation.give_back()
        if reservation in self.reservations:
            self.reservations.remove(reservation)

    def release_all(self) -> None:
        for reservation in list(self.reservations):
            self._release(reservation)

    async def metered(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s work on the event loop counts against this client address's share (broker/cpu_shares.py):
        the connection's reads, each request's handling and its answers' writes."""
        cpu = self.listener.cpu
        return await (cpu.metered(coro, self.client_host) if cpu is not None else coro)

    async def run(self) -> None:
        """Read requests and answer them in order. A request is read only once the one before let it: when
        done, or, for a produce, once its batches are appended (so appends keep the connection's order and
        an idempotent producer's sequences arrive in order), while that one's acks=all wait goes on. At most
        PIPELINE_DEPTH answers are outstanding; a writer task sends them in request order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[asyncio.Task[Any], list[KafkaCallContext]] | None] = \
            asyncio.Queue(maxsize=PIPELINE_DEPTH)
        writer = asyncio.create_task(self.metered(self._write_responses(queue)))
        # A writer that fails ends the read it waits for (no read task and asyncio.wait a request).
        writer.add_done_callback(self._writer_ended)
        transport = self.writer.transport
        try:
            while True:
                if transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]:
                    # The client is not reading its answers: read no more requests from it until it does, as
                    # Kafka mutes such a channel. Each request read meanwhile had an answer built and held (100
                    # ListGroups answers of 40 MB, from 20 connections that read nothing: audit).
                    drained = asyncio.ensure_future(self._drain())
                    await asyncio.wait({drained, writer}, return_when=asyncio.FIRST_COMPLETED)
                    if writer.done():
                        drained.cancel()
                        break
                    if drained.exception() is not None:  # silent past connections.max.idle.ms, or gone
                        break
                try:
                    got = await self._read_frame()
                except _WriterFailed:
                    break
                if got is None or writer.done():
                    if got is not None:
                        self._release(got[1])
                    break
                frame, reserved = got
                released: asyncio.Future[None] = loop.create_future()
                contexts: list[KafkaCallContext] = []
                task = asyncio.create_task(self.metered(self._handle(frame, released, reserved, contexts)))
                if not queue.full():
                    queue.put_nowait((task, contexts))
                else:
                    put = asyncio.ensure_future(queue.put((task, contexts)))
                    await asyncio.wait({put, writer}, return_when=asyncio.FIRST_COMPLETED)
                    if writer.done():
                        put.cancel()
                        task.cancel()
                        _finish(contexts)
                        break
                await asyncio.wait({released, task, writer}, return_when=asyncio.FIRST_COMPLETED)
                if writer.done():
                    break
        finally:
            if not writer.done():
                try:
                    queue.put_nowait(None)  # the answers queued so far go out first
                except asyncio.QueueFull:
                    writer.cancel()
                await asyncio.wait({writer}, timeout=self.listener.request_timeout_s)
                writer.cancel()
            while not queue.empty():
                left = queue.get_nowait()
                if left is not None:
                    left[0].cancel()
                    _finish(left[1])  # its answer is never written
        if writer.done() and not writer.cancelled() and writer.exception() is not None:
            raise writer.exception()  # type: ignore[misc]

    async def _write_responses(self, queue: asyncio.Queue[tuple[asyncio.Task[Any], list[KafkaCallContext]] | None]
                               ) -> None:
        while True:
            entry = await queue.get()
            if entry is None:
                return
            task, contexts = entry
            try:
                out = await task
                if out is False:
                    return  # close the connection
                if out:
                    await self._send(out)
                if self.close_after_answer:
                    return  # a failed login (KIP-152): answered, then closed
            finally:
                _finish(contexts)  # written, or never will be: a fetch's bytes go back to the budget

    async def _send(self, parts: list[bytes | FileRecords]) -> None:
        """Write a response; segment-file slices go with sendfile(2) on plaintext sockets (zero copy) and
        are pread through a buffer on TLS ones. A client that reads nothing of it for
        ``connections.max.idle.ms`` is disconnected (TimeoutError), as Kafka closes a connection idle
        that long: its answers, and the bytes of the broker's budget they hold, are let go.

        Never asyncio's own sendfile fallback: it reads through the file object's offset, which the
        dup'ed descriptor shares with the segment and with every other connection (and it does not even
        seek for position 0), so concurrent fallbacks could send each other's bytes. pread is
        position-independent; so is os.sendfile with an explicit offset."""
        loop = asyncio.get_running_loop()
        try:
            for part in parts:
                if not isinstance(part, FileRecords):
                    self.writer.write(part)
                    if len(part) >= codec.OWN_PART_MIN_BYTES:
                        # The transport copies what the socket does not take at once into its buffer: 64 MiB of a
                        # JoinGroup answer in one go held the loop 53 ms. A long value at a time, with a turn
                        # for the rest of the loop in between once the buffer is past its high-water mark.
                        await self._drain()
                    continue
                if self.tls or not self.listener.sendfile_ok:
                    self.writer.write(await loop.run_in_executor(None, part.read))
                    continue
                await self._drain()
                try:
                    with os.fdopen(part.fd, "rb", closefd=False) as f:
                        sent = await asyncio.wait_for(
                            loop.sendfile(self.writer.transport, f, part.position, part.length, fallback=False),
                            self.listener.idle_s)
                except NotImplementedError as exc:  # the platform has no sendfile: buffers from now on
                    log.warning("Kafka listener %s: no sendfile here (%s); sending records through a buffer",
                                self.listener.spec.name, exc)
                    self.listener.sendfile_ok = False
                    self.writer.write(await loop.run_in_executor(None, part.read))
                    continue
                except asyncio.SendfileNotAvailableError as exc:  # this call failed before sending a byte
                    log.info("Kafka listener %s: sendfile of %r to %s failed (%r); sending it through a buffer",
                             self.listener.spec.name, part, self.peer_text, exc.__cause__ or exc)
                    self.listener.stats.sendfile_fallbacks_total += 1
                    self.writer.write(await loop.run_in_executor(None, part.read))
                    continue
                if sent != part.length:
                    raise ConnectionError(f"sent {sent} of {part.length} record bytes")
                self.listener.stats.sendfile_bytes_total += sent
            await self._drain()
        finally:
            for part in parts:
                if isinstance(part, FileRecords):
                    part.close()

    def _writer_ended(self, writer: asyncio.Task[Any]) -> None:
        if not writer.cancelled() and writer.exception() is not None:
            self._writer_failed = True
            self.reader.set_exception(_WriterFailed())
            if self._waiting is not None:
                self._waiting.cancel()

    async def _drain(self) -> None:
        transport = self.writer.transport
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]:
            # Below the low-water mark the transport is not paused: drain() returns at once (or raises for a
            # lost connection), and needs no timeout around it.
            await self.writer.drain()
            return
        await asyncio.wait_for(self.writer.drain(), self.listener.idle_s)

    async def _handle(self, frame: bytes, released: asyncio.Future[None], reserved: _Reservation,
                      contexts: list[KafkaCallContext]) -> list[bytes | FileRecords] | None | bool:
        """The response frame, None for no response (acks=0), False to close the connection. ``released``
        is set when the next request may start (at the end, or a produce's once appended). The calls'
        contexts go into ``contexts``, to be finished once the answer is written."""
        CLIENT.set(self.client_host)  # this request's task: its work on the client pools takes this client's turns
        cpu = self.listener.cpu
        try:
            if cpu is None or not self.authenticated:  # a SASL login goes at once
                return await self._handle_frame(frame, released, contexts)
            # An address over its share of the interpreter waits before its request starts, the connection's
            # next ones behind it as behind a muted Kafka channel (broker/cpu_shares.py).
            async with cpu.turn(self.client_host, time.monotonic() + self.listener.request_timeout_s / 2):
                return await self._handle_frame(frame, released, contexts)
        finally:
            self._release(reserved)
            if not released.done():
                released.set_result(None)

    async def _handle_frame(self, frame: bytes, released: asyncio.Future[None],
                            contexts: list[KafkaCallContext]) -> list[bytes | FileRecords] | None | bool:
        lst = self.listener
        lst.stats.requests_total += 1
        try:
            api_key, version, correlation_id = codec.peek_header(frame)
        except codec.MalformedRequest:
            lst.stats.malformed_requests_total += 1
            return False
        supported = apis.SUPPORTED.get(api_key)
        if api_key == apis.API_VERSIONS and supported is not None and not supported[0] <= version <= supported[1]:
            # KIP-511: an ApiVersions newer than ours is answered in v0 with UNSUPPORTED_VERSION and our range.
            body = codec.response(apis.API_VERSIONS, 0, {"error_code": ErrorCode.UNSUPPORTED_VERSION,
                                                         "api_keys": apis.api_version_entries()})
            return codec.encode_response(apis.API_VERSIONS, 0, correlation_id, body)
        if supported is None or not supported[0] <= version <= supported[1]:
            # As Kafka 4 ("Received request for api with key 1 (Fetch) and unsupported version 2"): a client that
            # old retries in a loop, so the line is throttled; the request was well formed, but is counted with
            # those that could not be read, as both close the connection.
            lst.refused_versions.warn(
                "Kafka listener %s: closing %s: %s v%d is not served (this broker serves %s; a client too old for "
                "Kafka 4, KIP-896, or one newer than this broker)", lst.spec.name,
                self.peer_text, _api_name(api_key), version,
                f"v{supported[0]}-v{supported[1]}" if supported else "none of its versions")
            lst.stats.malformed_requests_total += 1
            return False
        lst.stats.requests_by_api[api_key] = lst.stats.requests_by_api.get(api_key, 0) + 1
        if not self.authenticated and api_key not in apis.PRE_AUTH_APIS:
            lst.before_login.warn("Kafka listener: closing %s: API %d before SASL authentication", self.peer_text,
                                  api_key)
            lst.stats.authentication_failures_total += 1
            return False
        if self.credential is not None and not lst.broker.security.authenticator.holds(self.credential):
            # The user was deleted or its password changed since this connection logged in: closed, as Kafka
            # closes a connection whose session expired (KIP-368); a client that reconnects must log in again.
            lst.broker.security.authenticator.revoked(
                self.credential.user, f"its {self.credential.mechanism} credential was deleted or changed since "
                f"{self.peer_text} logged in on Kafka listener {lst.spec.name}; closing the connection")
            return False
        if (trust := lst.spec.trust) is not None and self.tls:
            held = trust.holds(self.sslobj, self.trust_generation)
            if held is None:
                log.info("Kafka listener %s: closing %s: its client certificate (%s) is no longer trusted by CA "
                         "bundle %s", lst.spec.name, self.peer_text, self.auth.principal, trust.anchors.path)
                return False
            self.trust_generation = held
        try:
            if len(frame) > PARSE_ON_LOOP_MAX_BYTES:
                # One large parse per client address at a time: the pool's queue holds at most one frame an
                # address, so a client with many connections cannot put everyone else behind its frames.
                async with lst.parse_turn(self.client_host):
                    req = await asyncio.get_running_loop().run_in_executor(
                        lst.parse_pool, codec.parse_request, frame, api_key, version, lst.max_elements())
            else:
                req = codec.parse_request(frame, api_key, version, lst.max_elements())
        except codec.MalformedRequest as exc:
            lst.malformed.warn("Kafka listener: closing %s: malformed request: %s (first bytes %s)", self.peer_text,
                               exc, frame[:48].hex())
            lst.stats.malformed_requests_total += 1
            return False
        if api_key == apis.SASL_HANDSHAKE:
            body = self._sasl_handshake(req)
        elif api_key == apis.SASL_AUTHENTICATE:
            body = await self._sasl_authenticate(req)
            if body is None:
                return False
        else:
            body = await self._call(req, released, contexts)
            if body is None or body is False:
                return body  # None: no response (acks=0); False: close (a failed acks=0 produce)
            return await self._encode(api_key, version, correlation_id, body)
        return codec.encode_response(api_key, version, correlation_id, body)

    async def _encode(self, api_key: int, version: int, correlation_id: int, body: Any) -> list[bytes | FileRecords]:
        """The response frame. An answer of more than ENCODE_ON_LOOP_MAX_ITEMS elements is encoded on the parse
        pool, one per client address at a time, as large frames are parsed. It cannot be overtaken, nor
        overtake: this is the request's task, which the connection's writer awaits in request order."""
        if codec.items(body, ENCODE_ON_LOOP_MAX_ITEMS) <= ENCODE_ON_LOOP_MAX_ITEMS:
            return codec.encode_response(api_key, version, correlation_id, body)
        lst = self.listener
        async with lst.parse_turn(self.client_host):
            encoding = lst.parse_pool.submit(codec.encode_response, api_key, version, correlation_id, body)
            try:
                return await asyncio.wrap_future(encoding)
            except asyncio.CancelledError:
                encoding.add_done_callback(_close_slices)  # never to be sent: its segment-file slices let go
                raise

    async def _call(self, req: codec.Request, released: asyncio.Future[None], contexts: list[KafkaCallContext]) -> Any:
        lst = self.listener
        handler = lst.apis.handlers[req.api_key]
        deadline = time.monotonic() + lst.request_timeout_s
        while True:
            ctx = KafkaCallContext(self.auth, self.grpc_peer, lst.spec.name, lst.request_timeout_s)
            ctx.client_id = req.client_id
            ctx.client_host = self.client_host
            ctx.brook_on_appended = released
            contexts.append(ctx)
            try:
                return await handler(req, ctx)
            except Aborted as exc:
                ctx.finish()  # nothing of this attempt is answered
                if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline:
                    # Over this client's in-flight or the broker's byte budget: wait, as a muted
                    # Kafka channel does, and try again; nothing was done.
                    await asyncio.sleep(OVERLOAD_BACKOFF_S)
                    continue
                self.listener.refused_calls.warn("Kafka listener: %s API %d refused: %s", self.peer_text,
                                                 req.api_key, exc)
                raise ConnectionError(str(exc)) from None

    # ---- SASL (KIP-43, KIP-152) ----
    def _sasl_handshake(self, req: codec.Request) -> Any:
        enabled = [*SCRAM_MECHANISMS, SASL_PLAIN]
        mechanism = req.body.mechanism
        if req.api_version == 0:
            # v0 means raw SASL tokens follow (pre-KIP-152), which this listener does not read: refuse it.
            # Clients that know SaslAuthenticate send v1; v0 is advertised only because librdkafka
            # (e.g. Debian's kcat) enables SASL only when the advertised range includes it.
            return codec.response(req.api_key, 0, {"error_code": ErrorCode.UNSUPPORTED_VERSION,
                                                   "mechanisms": enabled if self.listener.sasl else []})
        if not self.listener.sasl or self.authenticated:
            return codec.response(req.api_key, req.api_version, {"error_code": ErrorCode.ILLEGAL_SASL_STATE,
                                                                 "mechanisms": enabled if self.listener.sasl else []})
        # As Kafka's SaslServerAuthenticator: an unsupported mechanism, or a second handshake while logging in
        # (it would switch the mechanism mid-exchange), is answered and the connection closed.
        if mechanism not in enabled:
            self.close_after_answer = True
            return codec.response(req.api_key, req.api_version, {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                                                 "mechanisms": enabled})
        if self.mechanism is not None:
            self.close_after_answer = True
            return codec.response(req.api_key, req.api_version, {"error_code": ErrorCode.ILLEGAL_SASL_STATE,
                                                                 "mechanisms": enabled})
        self.mechanism = mechanism
        return codec.response(req.api_key, req.api_version, {"error_code": 0, "mechanisms": enabled})

    async def _sasl_authenticate(self, req: codec.Request) -> Any:
        lst = self.listener
        if not lst.sasl or self.authenticated:
            # As Kafka's KafkaApis answers it, on a listener without SASL or after the login: an error, and the
            # connection goes on (it was closed, so a client saw a disconnect: audit).
            return codec.response(req.api_key, req.api_version, {
                "error_code": ErrorCode.ILLEGAL_SASL_STATE, "auth_bytes": b"",
                "error_message": "SaslAuthenticate on a connection that is not logging in"})
        if self.mechanism is None:
            lst.stats.authentication_failures_total += 1
            return None  # KIP-152: SaslAuthenticate without a handshake is an illegal state: close
        auth_bytes = bytes(req.body.auth_bytes)
        authenticator = lst.broker.security.authenticator
        if self.mechanism == SASL_PLAIN:
            try:
                credential = await self._login_work(authenticator.plain_credential, auth_bytes, self.client_host)
            except errors.BrookError as exc:
                return self._sasl_failed(req, exc.message)
            self._logged_in(principals.Principal(principals.USER, credential.user), credential)
            return codec.response(req.api_key, req.api_version, {"error_code": 0, "auth_bytes": b"",
                                                                 "session_lifetime": 0})
        out = await self._login_work(authenticator.authenticate, spb.SaslAuthenticateRequest(
            mechanism=self.mechanism, auth_bytes=auth_bytes, exchange_id=self.exchange_id), self.client_host)
        if out.error_code != 0:
            return self._sasl_failed(req, out.error_message)
        if out.exchange_id:  # the server-first message; the client's final message comes next
            self.exchange_id = out.exchange_id
            return codec.response(req.api_key, req.api_version, {"error_code": 0, "auth_bytes": out.auth_bytes})
        session = authenticator.session_record(out.session_token)
        # The connection keeps its principal itself: the session (made for gRPC clients, who send its token
        # with each call) would only hold one of the node's places for sessions.
        authenticator.end_session(out.session_token)
        if session is None:
            return self._sasl_failed(req, "session expired")
        self._logged_in(session.principal, session.credential)
        return codec.response(req.api_key, req.api_version, {"error_code": 0, "auth_bytes": out.auth_bytes,
                                                             "session_lifetime": 0})

    def _logged_in(self, who: principals.Principal, credential: ScramCredential) -> None:
        self.auth = Authentication(principals.at_address(who, self.client_host), AUTH_SASL, self.auth.peer)
        self.authenticated = True
        self.credential = credential
        log.info("Kafka listener %s: %s authenticated as %s (%s)", self.listener.spec.name, self.peer_text, who,
                 self.mechanism)

    async def _login_work(self, fn: Callable[..., T], *args: Any) -> T:
        """A login's PBKDF2 (two for a PLAIN attempt), on the listener's worker pool in this client address's turn
        (one at a time, and turns between addresses), its time counted against the address's share of the
        interpreter. On asyncio's default pool, first come first served and counted to nobody, a flood of wrong
        PLAIN passwords from 100 addresses made a real SCRAM login take 0.8-2.5 s (audit)."""
        lst = self.listener
        async with lst.parse_turn(self.client_host):
            return await asyncio.wrap_future(lst.parse_pool.submit(fn, *args))

    def _sasl_failed(self, req: codec.Request, message: str) -> Any:
        self.listener.stats.authentication_failures_total += 1
        self.exchange_id = ""
        # As Kafka's broker does: the client reads the error, then the connection is closed, so every guess
        # of a password costs a new connection (and its TLS handshake).
        self.close_after_answer = True
        return codec.response(req.api_key, req.api_version, {"error_code": ErrorCode.SASL_AUTHENTICATION_FAILED,
                                                             "error_message": message, "auth_bytes": b""})


def server_ssl_context(cert: str, key: str, ca: str | None, client_auth_required: bool) -> ssl.SSLContext:
    """A TLS server context; certificates are re-read per handshake when their files change (sni_callback)."""
    from broker.tls import ServerTls, _stamp

    tls = ServerTls(Path(cert), Path(key), Path(ca) if ca else None, "required" if client_auth_required else "none")

    def make() -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(tls.cert), str(tls.key))
        if tls.ca is not None:
            ctx.load_verify_locations(str(tls.ca))
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth_required else ssl.CERT_NONE
        return ctx

    paths = [p for p in (tls.cert, tls.key, tls.ca) if p is not None]
    state = {"stamps": tuple(_stamp(p) for p in paths), "ctx": make()}

    def on_hello(sslobj: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        try:
            stamps = tuple(_stamp(p) for p in paths)
            if stamps != state["stamps"]:
                state["ctx"] = make()
                state["stamps"] = stamps
                log.info("Kafka listener: reloaded TLS certificate %s", tls.cert)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("Kafka listener: TLS files of %s unreadable (%s); keeping the previous ones", tls.cert, exc)
        sslobj.context = state["ctx"]

    outer = make()
    outer.sni_callback = on_hello
    return outer


def _close_slices(encoding: concurrent.futures.Future[list[bytes | FileRecords]]) -> None:
    if not encoding.cancelled() and encoding.exception() is None:
        for part in encoding.result():
            if isinstance(part, FileRecords):
                part.close()


def _finish(contexts: list[KafkaCallContext]) -> None:
    for ctx in contexts:
        ctx.finish()
