"""The replication listener: followers' fetch sessions as length-prefixed protobuf frames over TCP (TLS).

Why not the gRPC port: an acks=all write waits for two follower messages (the fetch answer that carries
the records and the next fetch that acknowledges them), and through grpc.aio each message passes gRPC's
event-engine thread and its poller thread before the broker's event loop sees it. On 2 cores shared by
three brokers and a client those hand-offs, not the work, made the tail: a ping-pong of one small message
cost ~200 µs of CPU a side over grpc.aio and ~75 µs over an asyncio stream, and its p99 under load was
2-7 ms against ~1 ms. Here the loop reads the socket itself. Kafka, too, lets replication use a listener
of its own (``inter.broker.listener.name``).

A broker opens it when ``listeners`` names ``REPLICATION`` (the local launcher and the shipped configs
do), registers it as an endpoint, and followers of a leader that registered one fetch through it; without
one they use the gRPC ``ReplicaFetch`` stream (``replication/fetcher.py``), so brokers of either kind mix.

The protocol: the follower sends ``MAGIC`` once, then each message is a 4-byte big-endian length and a
serialized ``FetchRequest``; the leader answers each with a length and a ``FetchResponse``, exactly what
the gRPC stream carries: one connection is one fetch session (``broker/fetch_session.py``), one request
in flight at a time.

Defences, as on the other ports: the listener speaks only to nodes. TLS (with a client certificate, on an
``SSL`` listener) is started once a connection is counted under ``MAX_CONNECTIONS`` and
``MAX_CONNECTIONS_PER_ADDRESS``, and must finish within the handshake timeout; a caller that is not a
node (its certificate's principal, or the documented loopback trust of a plaintext single-host cluster)
is closed before a byte of it is read. A frame longer than ``socket.request.max.bytes`` or not a
``FetchRequest``, a wrong ``MAGIC``, a frame begun and not finished within ``request.receive.timeout.ms``,
a connection silent for ``connections.max.idle.ms``, or one that reads nothing of an answer for that
long, is closed. Each request is then checked as a gRPC
follower fetch is (only broker ``replica_id`` itself may send it).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from broker import principal
from broker.address_bar import AddressBar, attach
from broker.admission import (
    DEFAULT_CONNECTION_IDLE_MS,
    ConnectionDeadline,
    ConnectionSlots,
    ConnectionsPerIp,
    connections_within_descriptors,
    stop_serving,
)
from broker.bytes_apart import OWN_PART_MIN_BYTES
from broker.cert_revocation import ConnectionTrust
from broker.fetch_answer import FetchAnswer, answer_of
from broker.kafka_wire.context import Aborted, KafkaCallContext
from broker.log_limits import ThrottledWarning
from broker.receiving import DEFAULT_RECEIVE_TIMEOUT_MS, DEFAULT_REQUEST_MAX_BYTES
from broker.tls import HANDSHAKE_TIMEOUT_MS
from proto import broker_pb2
from replication.fetcher import REPLICATION_FRAME as FRAME
from replication.fetcher import REPLICATION_MAGIC as MAGIC

log = logging.getLogger(__name__)

# A broker's followers open one connection per fetcher: a cluster of hundreds of brokers stays far below.
MAX_CONNECTIONS = 1024
MAX_CONNECTIONS_PER_ADDRESS = 32
# At most one WARNING per this long about refused or broken connections (a flood would flood the log); the
# counters count every one.
WARN_EVERY_S = 10.0


class Refused(Exception):
    """The follower's request broke the protocol: the connection is closed."""


@dataclass(slots=True)
class ReplicationListenerStats:
    connections: int = 0
    connections_total: int = 0
    refused_connections_total: int = 0  # over a bound, or not a node
    closed_for_errors_total: int = 0  # a frame that broke the protocol
    requests_total: int = 0


class ReplicationListener:
    def __init__(self, service: Any, node_id: int, host: str, port: int, ssl_context: ssl.SSLContext | None,
                 defaults: Any, trust: ConnectionTrust | None = None) -> None:
        self.service = service
        # The listener's CA bundle as it is now: a follower whose node certificate it no longer trusts is cut.
        self.trust = trust
        self.node_id = node_id
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.max_connections = connections_within_descriptors(MAX_CONNECTIONS, 16, "the replication listener")
        self.max_request_bytes = int(defaults.get("socket.request.max.bytes", str(DEFAULT_REQUEST_MAX_BYTES)))
        self.receive_timeout_s = int(defaults.get("request.receive.timeout.ms",
                                                  str(DEFAULT_RECEIVE_TIMEOUT_MS))) / 1000
        self.idle_s = int(defaults.get("connections.max.idle.ms", str(DEFAULT_CONNECTION_IDLE_MS))) / 1000
        self.stats = ReplicationListenerStats()
        self._slots = ConnectionSlots(self.max_connections, ConnectionsPerIp(MAX_CONNECTIONS_PER_ADDRESS), self.stats)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.AbstractServer | None = None
        self._warnings = ThrottledWarning(log, WARN_EVERY_S)  # refused or broken connections

    def _warn(self, what: str) -> None:
        self._warnings.warn("broker %d: replication listener: %s", self.node_id, what)

    async def start(self) -> None:
        # TLS is started per connection once it is counted (as on the Kafka listener): a flood of
        # handshakes that never finish holds at most the bounded connections, each for the timeout.
        self._server = await asyncio.start_server(self._accept, self.host, self.port, limit=64 * 1024,
                                                  reuse_address=True)
        sockets = self._server.sockets
        self.port = sockets[0].getsockname()[1]
        self._slots.bar = AddressBar([self.port], f"broker {self.node_id}: replication listener", where="its port",
                                     installer=lambda _ports, addresses: attach(sockets, addresses))
        log.info("broker %d: replication listener on %s:%d (%s)", self.node_id, self.host, self.port,
                 "SSL" if self.ssl_context is not None else "PLAINTEXT")

    @property
    def bar(self) -> AddressBar | None:
        """The addresses barred from this listener for flooding it past its per-address bound."""
        return self._slots.bar

    async def stop(self) -> None:
        self._slots.close()
        await stop_serving(self._server, self._tasks)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("unknown", 0)
        host, port = str(peer[0]), int(peer[1])
        if not self._slots.take(host):
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            generation = self.trust.generation() if self.trust is not None else 0
            if self.ssl_context is not None:
                await writer.start_tls(self.ssl_context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_MS / 1000)
            grpc_peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
            auth = principal.connection_authentication(writer.get_extra_info("ssl_object"), host, grpc_peer)
            if not principal.is_node_auth(auth):
                self.stats.refused_connections_total += 1
                self._warn(f"refused {auth.principal} from {grpc_peer}: only the cluster's nodes fetch here")
                return
            # The follower-fetch code reads a call's identity as the Kafka listener's calls give it.
            await self._serve(reader, writer, KafkaCallContext(auth, grpc_peer, "REPLICATION"), generation)
        except asyncio.CancelledError:
            pass
        except (Refused, Aborted) as e:
            self.stats.closed_for_errors_total += 1
            self._warn(f"closed the connection from {host}:{port}: {e}")
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass  # the follower went away, was too slow, or failed the handshake
        except Exception:
            log.exception("broker %d: replication connection from %s:%d failed", self.node_id, host, port)
        finally:
            self._tasks.discard(task)
            self._slots.give_back(host)
            writer.transport.abort()  # nothing of ours is worth delivering to a follower that is gone

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     context: KafkaCallContext, generation: int) -> None:
        # One deadline for the connection's waits (the next frame, the rest of one, an answer's delivery),
        # not a timeout each: the listener reads two frames per acks=all write.
        deadline = ConnectionDeadline(asyncio.get_running_loop(), writer.transport.abort)
        try:
            await self._serve_frames(reader, writer, context, deadline, generation)
        finally:
            deadline.cancel()
            if deadline.fired:
                raise TimeoutError("the follower missed a deadline")

    async def _serve_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            context: KafkaCallContext, deadline: ConnectionDeadline, generation: int) -> None:
        deadline.within(self.receive_timeout_s)
        magic = await reader.readexactly(len(MAGIC))
        if magic != MAGIC:
            raise Refused(f"not a Brook replica fetch connection (it began {magic!r})")
        session = self.service.rm.new_fetch_session()

        def send(response: FetchAnswer | broker_pb2.FetchResponse) -> None:
            # From the wake: at most LOOP_READ_MAX_BYTES of records, written at once.
            parts = answer_of(response).parts()
            writer.write(FRAME.pack(sum(len(p) for p in parts)))
            for part in parts:
                writer.write(part)

        session.send_now = send  # a fetch woken on the loop is answered from the wake (no loop turn)
        try:
            while True:
                deadline.within(self.idle_s)
                (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
                if size > self.max_request_bytes:
                    raise Refused(f"a request of {size} bytes (socket.request.max.bytes is {self.max_request_bytes})")
                deadline.within(self.receive_timeout_s)
                body = await reader.readexactly(size)
                deadline.clear()
                try:
                    request = broker_pb2.FetchRequest.FromString(body)
                except DecodeError as e:
                    raise Refused(f"a frame that is not a FetchRequest ({e})") from None
                self.stats.requests_total += 1
                if self.trust is not None and self.ssl_context is not None:
                    held = self.trust.holds(writer.get_extra_info("ssl_object"), generation)
                    if held is None:
                        raise Refused(f"its node certificate ({context.brook_authentication.principal}) is no "
                                      f"longer trusted by CA bundle {self.trust.anchors.path}")
                    generation = held
                response = await self.service.replica_fetch_message(request, context, session)
                deadline.within(self.idle_s)  # a follower that reads nothing of its answer for that long is gone
                if response is not None:  # else sent already, by the wake that ended its long poll
                    # The records as the log read them (not copied into a message and serialized: 10 MiB took
                    # ~20 ms of the loop), a partition's at a time, with a turn for the rest of the loop in
                    # between once the transport's buffer is past its high-water mark. An answer of many
                    # partitions is put in parts on a replication thread.
                    answer = answer_of(response)
                    parts = answer.parts() if answer.on_loop() else \
                        await asyncio.get_running_loop().run_in_executor(self.service.capacity.replication,
                                                                         answer.parts)
                    del answer, response
                    writer.write(FRAME.pack(sum(len(p) for p in parts)))
                    for part in parts:
                        writer.write(part)
                        if len(part) >= OWN_PART_MIN_BYTES:
                            await writer.drain()
                await writer.drain()
        finally:
            session.close()
