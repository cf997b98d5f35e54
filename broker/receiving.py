"""How many request messages a broker's gRPC port receives at once: bytes are counted before they come.

gRPC's core reads a unary request's message whole (up to ``socket.request.max.bytes``) before any
interceptor or handler runs, and HTTP/2 lets a client open 2,000 calls on a connection: one
connection sending 100 ``Produce`` messages of 50 MiB took a broker from 76 MB to 1.3 GB, as fast
as the sender could write, whatever the broker's budgets (they are charged once a message is
decoded). Kafka avoids this by reading a request's 4-byte size first and reserving it from a memory
pool before the body; gRPC shows an application neither the size nor the body until all of it is
in memory, and grpcio exposes no ResourceQuota.

What gRPC does offer is HTTP/2 flow control: a stream whose message is not being read is granted
only the initial window (64 KiB, with BDP probing off, ``broker/server.py``), and the rest of the
message stays with the client. So the broker serves every unary method as a client-streaming one
(the same bytes on the wire; a client cannot tell) whose handler reads the single message only once
it holds a *receive slot*:

- at most ``max.receiving.requests`` messages are being received at once, ``max.receiving.requests.per.ip``
  of them from one client address; a call waits, unread, for a slot (the waiting addresses under
  their bound take turns, each its oldest call), and an address may have ``RECEIVE_QUEUE_PER_CLIENT``
  calls waiting: more are refused at once (RESOURCE_EXHAUSTED, which clients retry after a backoff);
- a message must arrive within ``request.receive.timeout.ms`` of its slot being granted (a sender
  trickling bytes holds one slot, not the broker), and a call waits at most that long for a slot.

The bytes a broker holds for unary requests it has not decoded are then at most
``2 × max.receiving.requests × socket.request.max.bytes`` (followers' OffsetsForLeaderEpoch have
slots of their own) plus 64 KiB per waiting call (``RECEIVE_QUEUE_TOTAL`` of them per pool, shared
fairly between addresses), instead of without bound (request streams add one message each, below). A message already buffered when its slot is granted (any request under 64 KiB) is
read at once, so a slot is held for microseconds by well-behaved clients.

Request streams (ProduceStream, FetchStream, ReplicaFetch) read their next message whenever the client
sends one, as a Kafka connection does: a stream's message cannot wait for a slot without the stream
holding it while idle. Their number is bounded instead (``max.request.streams.per.ip``,
``max.produce.streams``, ``max.fetch.streams``, ``OTHER_STREAMS_TOTAL``; followers' streams are refused unread unless the
caller is a node); each stream receives one message at a time (broker/service.py).

A synchronous gRPC server (the controller's) reads a unary message on the worker thread that
handles the call, so a call whose message never finishes held a worker forever: 120 such calls
from one client stalled a controller (its 96 workers taken; brokers' heartbeats timed out).
``SyncReceiveGate`` serves those methods as client-streaming ones too, lets one client address
receive ``per_client`` messages at once (more are refused at once: waiting would hold a worker),
and cancels a call whose message has not arrived within its timeout (``CallWatchdog``). Enough
addresses at their bound could still take every worker; so calls from clients (anyone but the
cluster's nodes, known by certificate before a byte of the message is read) are taken only while
``reserved_for_nodes`` workers stay free, and brokers' heartbeats and metadata calls always find
one (Kafka keeps a listener of its own for its controller's requests, KIP-291, for the same reason).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import inspect
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import grpc

from broker import principal
from broker.admission import Overloaded, peer_host
from broker.cpu_shares import CpuShares
from broker.fair_pool import CLIENT
from proto.errors import STREAM_REFUSED_METADATA_KEY

log = logging.getLogger(__name__)

# Calls one client address may have waiting, unread, for a receive slot (each holds at most HTTP/2's
# initial window of its message, 64 KiB); more are refused RESOURCE_EXHAUSTED.
RECEIVE_QUEUE_PER_CLIENT = 256
# Calls waiting for a slot of one pool in all (128 MiB of windows): past it, a call from an address
# with less than its fair share waiting takes the place of the newest call of the address with the
# most, so many addresses cannot grow a broker without bound and one cannot crowd out the rest.
RECEIVE_QUEUE_TOTAL = 2048

# socket.request.max.bytes: the most one message being received may hold (the Kafka listener's too).
DEFAULT_REQUEST_MAX_BYTES = 8 * 1024 * 1024
# The counts of request streams whose method has none of its own (server reflection).
OTHER_STREAMS = "*"
OTHER_STREAMS_TOTAL = 16
DEFAULT_RECEIVING = 16
DEFAULT_RECEIVING_PER_CLIENT = 4
DEFAULT_RECEIVE_TIMEOUT_MS = 30_000
DEFAULT_STREAMS_PER_CLIENT = 16
DEFAULT_PRODUCE_STREAMS = 64
DEFAULT_FETCH_STREAMS = 64


def _count_down(counts: dict[str, int], client: str) -> None:
    """One less for ``client``; its entry goes at zero, so a table holds only clients with something in it."""
    left = counts[client] - 1
    if left:
        counts[client] = left
    else:
        del counts[client]


class ReceiveSlots:
    """Receive slots: ``total`` at once, ``per_client`` of them one client address's (loop thread only).

    Waiters are served in the order their addresses started waiting, round robin: an address with
    many waiting calls takes one free slot, then the next address its turn.
    """

    def __init__(self, total: int, per_client: int, queue_per_client: int = RECEIVE_QUEUE_PER_CLIENT,
                 queue_total: int = RECEIVE_QUEUE_TOTAL) -> None:
        assert total >= 1 and per_client >= 1 and queue_per_client >= 0 and queue_total >= 1
        self.total = total
        self.per_client = per_client
        self.queue_per_client = queue_per_client
        self.queue_total = queue_total
        self._free = total
        self._held: dict[str, int] = {}
        # Addresses with waiting calls, in turn order; each a FIFO of the futures its calls wait on.
        self._waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}
        self._queued = 0  # futures in those queues
        self.refused_total = 0
        self.timed_out_total = 0

    @property
    def receiving(self) -> int:
        return self.total - self._free

    @property
    def waiting(self) -> int:
        return self._queued

    def held_by(self, client: str) -> int:
        return self._held.get(client, 0)

    def _take(self, client: str) -> None:
        self._free -= 1
        self._held[client] = self._held.get(client, 0) + 1

    async def acquire(self, client: str, timeout_s: float) -> None:
        """A slot for ``client``: at once when one is free and none of its calls waits before it; else
        after waiting at most ``timeout_s``. Raises ``Overloaded`` when its queue is full or the wait
        timed out."""
        queue = self._waiting.get(client)
        if queue is None and self._free > 0 and self._held.get(client, 0) < self.per_client:
            self._take(client)
            return
        if queue is not None and len(queue) >= self.queue_per_client or self.queue_per_client == 0:
            self.refused_total += 1
            raise Overloaded(f"client {client} has {len(queue or ())} requests waiting to be received "
                             f"and {self.held_by(client)} being received")
        if self._queued >= self.queue_total:
            self._make_room(client, len(queue or ()))
        if queue is None:
            queue = self._waiting[client] = collections.deque()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        self._queued += 1
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release(client)  # granted as the wait ended: give it to the next caller
            else:
                waiter.cancel()
                self._forget(client, waiter)  # (a call whose place was taken is out of the queue already)
            if isinstance(exc, TimeoutError):
                self.timed_out_total += 1
                raise Overloaded(f"no receive slot for client {client} within {timeout_s:.1f} s "
                                 f"({self.receiving} requests being received, max.receiving.requests="
                                 f"{self.total})") from None
            raise

    def _make_room(self, client: str, mine: int) -> None:
        """Every waiting place is taken: refuse ``client``'s call (``mine`` of its calls wait) unless it
        has less than its fair share waiting; then the newest call of the address with the most waiting
        is refused in its place."""
        fair = self.queue_total // (len(self._waiting) + (client not in self._waiting))
        victim, queue = (None, None) if mine >= fair else max(self._waiting.items(), key=lambda kv: len(kv[1]))
        if queue is None or len(queue) <= mine + 1:
            self.refused_total += 1
            raise Overloaded(f"{self._queued} requests are waiting to be received, {mine} of them client "
                             f"{client}'s (its share: {fair})")
        waiter = queue.pop()
        self._queued -= 1
        if waiter.done():
            return  # cancelled, its caller not yet resumed to forget it: that place was free anyway
        self.refused_total += 1
        waiter.set_exception(Overloaded(f"{self._queued} requests are waiting to be received, {len(queue) + 1} "
                                        f"of them client {victim}'s: its newest gave its place to another "
                                        f"client's"))

    def release(self, client: str) -> None:
        _count_down(self._held, client)
        self._free += 1
        self._grant()

    def _forget(self, client: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(client)
        if queue is None:
            return
        try:
            queue.remove(waiter)
            self._queued -= 1
        except ValueError:
            pass
        if not queue:
            del self._waiting[client]

    def _grant(self) -> None:
        while self._free > 0 and self._waiting:
            client = next((c for c in self._waiting if self._held.get(c, 0) < self.per_client), None)
            if client is None:
                return  # every waiting address is at its own bound
            queue = self._waiting[client]
            waiter = queue.popleft()
            self._queued -= 1
            del self._waiting[client]
            if queue:
                self._waiting[client] = queue  # to the end of the turn order
            if waiter.done():
                continue  # cancelled; its caller cleans up after itself
            self._take(client)
            waiter.set_result(None)


class StreamCounts:
    """Open streams of one request-streaming method: ``per_client`` per client address and, when
    ``total`` is set (the config key ``total_key``), that many in all (loop thread only)."""

    def __init__(self, name: str, per_client: int, total: int | None = None, *, nodes_only: bool = False,
                 total_key: str | None = "max.produce.streams") -> None:
        assert per_client >= 1 and (total is None or total >= 1)
        self.name = name
        self.per_client = per_client
        self.total = total
        self.total_key = total_key
        # Refused before a message is read unless the caller is a node (principal.is_node_caller): then
        # the per-address bound bounds them in all, by the number of nodes.
        self.nodes_only = nodes_only
        self._open: dict[str, int] = {}
        self.open = 0
        self.refused_total = 0

    def enter(self, client: str) -> None:
        n = self._open.get(client, 0)
        if n >= self.per_client or (self.total is not None and self.open >= self.total):
            self.refused_total += 1
            raise Overloaded(f"{self.open} {self.name} streams open, {n} of them client {client}'s "
                             f"(max.request.streams.per.ip={self.per_client}"
                             + ("" if self.total is None else f", {self.total_key or 'in all'}={self.total}") + ")")
        self._open[client] = n + 1
        self.open += 1

    def leave(self, client: str) -> None:
        _count_down(self._open, client)
        self.open -= 1


@dataclass(frozen=True, slots=True)
class ReceiveStats:
    """What a broker's receive gate holds, for its metrics (client and follower slots together)."""

    receiving: int = 0
    waiting: int = 0
    limit: int = 0
    refused_total: int = 0
    timed_out_total: int = 0
    streams_open: int = 0
    streams_refused_total: int = 0

    @classmethod
    def of(cls, gate: ReceiveGate) -> ReceiveStats:
        pools = {id(p): p for p in (gate.slots, gate.replication_slots)}.values()
        return cls(receiving=sum(p.receiving for p in pools), waiting=sum(p.waiting for p in pools),
                   limit=sum(p.total for p in pools), refused_total=sum(p.refused_total for p in pools),
                   timed_out_total=sum(p.timed_out_total for p in pools),
                   streams_open=sum(c.open for c in gate.streams.values()),
                   streams_refused_total=sum(c.refused_total for c in gate.streams.values()))


class _GatedHandlers:
    """Method -> (the handler an interceptor was given, the one it serves instead): built once per
    method, not per call. Only methods a server serves get here, a few dozen; a per-call handler
    (a refusal for a stale session) replaces the entry until the method's own comes back."""

    def __init__(self) -> None:
        self._by_method: dict[str, tuple[Any, Any]] = {}

    def get(self, method: str, handler: Any, build: Callable[[Any, str], Any]) -> Any:
        cached = self._by_method.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        gated = build(handler, method)
        self._by_method[method] = (handler, gated)
        return gated


def _client_of(context: Any) -> str:
    return peer_host(context.peer() or "unknown")


class ReceiveGate(grpc.aio.ServerInterceptor):
    """Serves each unary method as a client-streaming one that reads its message under a receive slot,
    and counts each request stream against its address's bound. The outermost interceptor (the
    handler it is given is already timed and session-checked by the others): ``outermost``."""

    outermost = True

    def __init__(self, slots: ReceiveSlots, streams: dict[str, StreamCounts], timeout_s: float,
                 sync_pool: Executor, *, replication_slots: ReceiveSlots | None = None,
                 replication_methods: frozenset[str] = frozenset(), cpu: CpuShares | None = None) -> None:
        self.slots = slots
        # Request-streaming method -> its counts; methods not named share those of OTHER_STREAMS.
        self.streams = streams
        self.timeout_s = timeout_s
        self._sync_pool = sync_pool
        # Follower requests (OffsetsForLeaderEpoch) wait for slots of their own: a client flood
        # cannot hold up replication.
        self.replication_slots = replication_slots or slots
        self._replication_methods = replication_methods
        self._gated = _GatedHandlers()
        self.cpu = cpu  # an address over its share of the interpreter waits before its call starts

    async def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._gated.get(handler_call_details.method, handler, self._gate)

    def _gate(self, handler: Any, method: str) -> Any:
        if handler.request_streaming:
            counts = self.streams.get(method) or self.streams[OTHER_STREAMS]
            if not (handler.response_streaming and inspect.isasyncgenfunction(handler.stream_stream)):
                # Every request stream served is counted: one of another shape needs its own wrapper.
                raise RuntimeError(f"request-streaming method {method} has no stream bound in the receive gate")
            return grpc.stream_stream_rpc_method_handler(
                self._counted(handler.stream_stream, counts), handler.request_deserializer, handler.response_serializer)
        slots = self.replication_slots if method in self._replication_methods else self.slots
        throttle = method not in self._replication_methods  # a follower's call is the brokers', not a client's
        if handler.response_streaming:
            inner = handler.unary_stream
            if inspect.isasyncgenfunction(inner):
                async def stream_gen(request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                    request = await self._receive(context, slots)
                    async with self._turn(context, throttle):
                        async for response in inner(request, context):
                            yield response
                behaviour: Any = stream_gen
            elif asyncio.iscoroutinefunction(inner):
                async def stream_writes(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                    request = await self._receive(context, slots)
                    async with self._turn(context, throttle):
                        return await inner(request, context)  # answers via context.write
                behaviour = stream_writes
            else:
                log.warning("%s: a synchronous server-streaming handler is served ungated", method)
                return handler
            return grpc.stream_stream_rpc_method_handler(
                behaviour, handler.request_deserializer, handler.response_serializer)
        inner = handler.unary_unary
        if asyncio.iscoroutinefunction(inner):
            async def unary(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                request = await self._receive(context, slots)
                if self.cpu is None or not throttle:
                    return await inner(request, context)
                # Its work on the event loop counts against its address's share (broker/cpu_shares.py).
                return await self.cpu.run(CLIENT.get(), lambda: inner(request, context), self._until(context))
        else:
            pool = self._sync_pool

            async def unary(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                # A synchronous handler (SecurityService) runs on its pool as grpc.aio would run it,
                # once its message is here; its context is read there, so its identity is taken now.
                request = await self._receive(context, slots)
                identity = principal.CallIdentity(context)
                async with self._turn(context, throttle):
                    return await asyncio.get_running_loop().run_in_executor(pool, inner, request, identity)
        return grpc.stream_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)

    def _turn(self, context: grpc.aio.ServicerContext, throttle: bool) -> AbstractAsyncContextManager[None]:
        """The call's turn under its address's share of the interpreter (broker/cpu_shares.py); a follower's call
        (not ``throttle``) is the brokers' and always goes at once."""
        if self.cpu is None or not throttle:
            return contextlib.nullcontext()
        return self.cpu.turn(CLIENT.get(), self._until(context))

    @staticmethod
    def _until(context: grpc.aio.ServicerContext) -> float | None:
        """How long a call may wait for its turn: half its deadline (then it starts anyway)."""
        remaining = context.time_remaining()
        return None if remaining is None else time.monotonic() + remaining / 2

    async def _receive(self, context: grpc.aio.ServicerContext, slots: ReceiveSlots) -> Any:
        """The call's one request message, read once a receive slot is held; the call ends
        RESOURCE_EXHAUSTED (no slot in time, too many waiting), DEADLINE_EXCEEDED (the message did not
        arrive in time) or INVALID_ARGUMENT (no message)."""
        client = _client_of(context)
        CLIENT.set(client)  # this call's task: its work on the broker's pools takes this client's turns
        try:
            await slots.acquire(client, self.timeout_s)
        except Overloaded as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        try:
            async with asyncio.timeout(self.timeout_s):
                request = await context.read()
        except TimeoutError:
            slots.timed_out_total += 1
            log.info("request from %s not received within %.1f s of its turn (request.receive.timeout.ms): "
                     "call ended", client, self.timeout_s)
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"the request message was not received within {self.timeout_s:.1f} s "
                                "(request.receive.timeout.ms)")
        finally:
            slots.release(client)
        if request is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        return request

    @staticmethod
    def _counted(inner: Callable[..., AsyncIterator[Any]], counts: StreamCounts) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            client = _client_of(context)
            if counts.nodes_only:
                auth = principal.authenticate(context)
                if not principal.is_node_auth(auth):
                    counts.refused_total += 1
                    # Before a message is read: only brokers have a use for these streams. No identity
                    # at all (an expired SCRAM session) is UNAUTHENTICATED, as the stream's own check says.
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED if auth.method == principal.AUTH_NONE
                                        else grpc.StatusCode.PERMISSION_DENIED,
                                        f"{counts.name} streams are for the cluster's nodes; {auth.principal} is not one")
            try:
                counts.enter(client)
            except Overloaded as e:
                # Refused before a message is read: nothing of it was handled, the client may send
                # the same requests as unary calls (client/sender.py).
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e),
                                    trailing_metadata=((STREAM_REFUSED_METADATA_KEY, "1"),))
            try:
                async for response in inner(request_iterator, context):
                    yield response
            finally:
                counts.leave(client)
        return stream


class CallWatchdog:
    """Cancels the calls whose message has not arrived by their deadline: one thread for all of them."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cv = threading.Condition()
        self._heap: list[list[Any]] = []  # [deadline, seq, context or None once disarmed]
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.cancelled_total = 0

    def arm(self, context: Any, timeout_s: float) -> list[Any]:
        entry = [time.monotonic() + timeout_s, next(self._seq), context]
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cv.notify()
        return entry

    def disarm(self, entry: list[Any]) -> None:
        with self._cv:  # under the lock: a call is never cancelled after its message was taken
            entry[2] = None

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)  # disarmed: its message came
                if not self._heap:
                    self._cv.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)
                    continue
                context = heapq.heappop(self._heap)[2]
                self.cancelled_total += 1
                try:
                    context.cancel()  # its worker, blocked reading, gets an RpcError
                except Exception:  # the call ended meanwhile
                    log.debug("cancelling a call whose message did not come failed", exc_info=True)


class SyncReceiveGate(grpc.ServerInterceptor):
    """For a synchronous gRPC server: unary methods served as client-streaming ones whose message is
    read with at most ``per_client`` others of its address's, and within ``timeout_s`` (else the call
    is cancelled and its worker freed). With ``workers`` (the server's pool) and ``reserved_for_nodes``,
    a call that ``is_node`` says is not a node's is refused at once unless that many workers would
    still be free with it; nodes' calls are never refused for it. The outermost interceptor
    (``outermost``)."""

    outermost = True

    def __init__(self, per_client: int, timeout_s: float, name: str, *, workers: int | None = None,
                 reserved_for_nodes: int = 0, is_node: Callable[[Any], bool] = principal.is_node_caller) -> None:
        assert per_client >= 1 and timeout_s > 0
        assert workers is None or 0 <= reserved_for_nodes < workers
        self.per_client = per_client
        self.timeout_s = timeout_s
        self.client_workers = None if workers is None else workers - reserved_for_nodes
        self._is_node = is_node
        self._lock = threading.Lock()
        self._receiving: dict[str, int] = {}
        self._busy = 0  # gated calls whose handler runs: each holds a worker
        self.refused_total = 0
        self.workers_refused_total = 0
        self.watchdog = CallWatchdog(f"{name}-receive-watchdog")
        self._gated = _GatedHandlers()

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler  # no request stream is served by a synchronous server here
        return self._gated.get(handler_call_details.method, handler, self._gate)

    def _gate(self, handler: Any, method: str) -> Any:
        receive, enter, leave = self._receive, self._enter, self._leave
        if handler.response_streaming:
            stream_inner = handler.unary_stream

            def stream(request_iterator: Any, context: grpc.ServicerContext) -> Any:
                enter(context)
                try:  # a generator gRPC drops (the call ended) is closed, and this runs
                    yield from stream_inner(receive(request_iterator, context), context)
                finally:
                    leave()
            gated = grpc.stream_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                          handler.response_serializer)
        else:
            unary_inner = handler.unary_unary

            def unary(request_iterator: Any, context: grpc.ServicerContext) -> Any:
                enter(context)
                try:
                    return unary_inner(receive(request_iterator, context), context)
                finally:
                    leave()
            gated = grpc.stream_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                         handler.response_serializer)
        return gated

    def _enter(self, context: grpc.ServicerContext) -> None:
        """Count this call's worker, or refuse it: a client's call that would leave fewer than the
        reserved workers free for the nodes."""
        limit = self.client_workers
        node = limit is None or self._is_node(context)
        with self._lock:
            busy = self._busy
            admitted = node or busy < limit
            if admitted:
                self._busy = busy + 1
            else:
                self.workers_refused_total += 1
        if not admitted:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          str(Overloaded(f"{busy} calls are being served; the other workers are kept for "
                                         f"the cluster's nodes")))

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    @property
    def receiving(self) -> int:
        with self._lock:
            return sum(self._receiving.values())

    def _receive(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        client = _client_of(context)
        with self._lock:
            n = self._receiving.get(client, 0)
            admitted = n < self.per_client
            if admitted:
                self._receiving[client] = n + 1
            else:
                self.refused_total += 1
        if not admitted:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          str(Overloaded(f"client {client} has {n} requests being received")))
        entry = self.watchdog.arm(context, self.timeout_s)
        try:
            request = next(request_iterator, None)
        finally:
            self.watchdog.disarm(entry)
            with self._lock:
                _count_down(self._receiving, client)
        if request is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
        return request
