"""BrokerService: the gRPC servicer clients and replicas talk to (grpc.aio).

Thin: each handler validates the request shape, hands the work to the ReplicaManager
(produce, fetch, offsets) or the metadata cache (Metadata), and maps BrookErrors to
per-partition error codes. Any unexpected exception is caught here, logged with the
request's context and answered as UNKNOWN_SERVER_ERROR — no request can take the broker
down.

Threads: the handlers are coroutines on the broker's one event loop thread. Work that can
block (disk reads and appends, the metadata lock, controller calls) runs on a bounded
executor: ``io`` for clients, ``replication`` for follower fetches from other brokers, so
a client flood never delays replication. Waiting costs no thread: a long-poll Fetch parks
as a future in the fetch purgatory, an acks=all Produce awaits the purgatory's completion
of its append futures; both are completed from the thread that moves the data or the HW.

Admission (broker/admission.py): a client (peer IP) may have ``max.inflight.requests.per.ip``
requests in flight and ``max.waiting.fetches.per.ip`` long polls parked; produce request
bytes and fetch response bytes draw on ``queued.max.request.bytes``. Excess is answered
with the gRPC status RESOURCE_EXHAUSTED (the client library backs off and retries).
Follower fetches are exempt: their bound is the number of brokers.

Authorization (broker/authorizer.py, Kafka's ACL model): each handler resolves the caller's
principal once (broker/principal.py: mTLS certificate or SCRAM session) and refuses the
topics it may not touch with TOPIC_AUTHORIZATION_FAILED, serving the rest. Follower
requests (``replica_id >= 0``) are accepted only from that broker itself
(``principal.require_node``). Quotas (broker/quotas.py) set ``throttle_time_ms``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from broker import authorizer as authz
from broker import bytes_apart, principal
from broker.admission import (
    DEFAULT_FETCH_BYTES_PER_CLIENT,
    ByteBudget,
    ClientByteShares,
    ClientLimits,
    Overloaded,
    peer_host,
    refuse_oversized,
    release_when_done,
)
from broker.authorizer import ALLOW_ALL, Authorizer
from broker.cpu_shares import CpuShares
from broker.fair_pool import CLIENT
from broker.fetch_answer import FetchAnswer
from broker.fetch_session import FollowerFetchSession
from broker.log_limits import ThrottledWarning
from broker.metadata_cache import MetadataCache
from broker.producer_ids import ProducerIdManager
from broker.quotas import QuotaManager
from broker.replica_manager import (
    DEFAULT_FETCH_MAX_BYTES,
    MAX_PRODUCE_TIMEOUT_MS,
    AppendResult,
    ReplicaManager,
    call_on_loop,
    marker_answer,
    one_entry_per_partition,
    refuse_repeated,
    until_resolved,
)
from client.types import TopicPartition
from proto import broker_pb2, broker_pb2_grpc, common_pb2, controller_pb2, errors
from proto.errors import ErrorCode
from storage.log import WouldBlock
from storage.log_validator import MAX_RECORD_ERRORS
from storage.record_batch import read_header

log = logging.getLogger(__name__)

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_LEADER_ERRORS = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH)
AUTO_CREATE_WAIT_S = 5.0
# Auto-creations one broker runs at once. Each holds a client thread (num.io.threads) while the controller
# creates the topics and their leaders are elected; a request that finds them all taken is answered
# UNKNOWN_TOPIC_OR_PARTITION at once (retriable: clients ask again) instead of waiting for one.
AUTO_CREATE_CONCURRENCY = 2
PRODUCE_WAIT_SLACK_S = 5.0
# Produce requests up to this size are appended on the event loop when nothing would wait
# (validation and a page-cache write of 64 KiB take well under a millisecond); larger ones,
# and any that would wait, go to the executor.
INLINE_APPEND_MAX_BYTES = 64 * 1024
# ... and naming at most this many partitions: each costs the loop a lookup, checks and an answer
# entry even when empty, and a request of 100,000 empty ones (800 KB) held the loop for 2.6 s.
INLINE_APPEND_MAX_PARTITIONS = 32
# Unanswered requests of one ProduceStream: Kafka's max.in.flight.requests.per.connection default
# (the most an idempotent producer pipelines), so a stream holds at most this many requests' bytes.
PRODUCE_STREAM_MAX_IN_FLIGHT = 5
# The most records a consumer's Fetch answer carries on the gRPC port (its first batch is whole, however long):
# gRPC copies an answer into its own buffers with the interpreter lock held, about 1 ms a MiB on the development
# machine (50-66 ms for 53 MiB, every other call of the broker waiting). The consumer fetches the rest at once;
# its throughput did not change (README, Broker capacity). The Kafka listener sends records from the segment
# files and keeps Kafka's fetch.max.bytes.
GRPC_FETCH_ANSWER_MAX_BYTES = 8 * 1024 * 1024
DELETE_RECORDS_POLL_S = 0.05  # how often a DeleteRecords looks whether the replicas followed
T = TypeVar("T")


def _listed(names: Sequence[str], most: int = 10) -> str:
    """Names for a log line: a request may name thousands."""
    shown = ", ".join(names[:most])
    return f"[{shown}]" if len(names) <= most else f"[{shown}, ... {len(names) - most} more]"


@dataclass
class Capacity:
    """Where a BrokerService's work runs and what one client may hold (see the module doc)."""

    io: concurrent.futures.Executor
    replication: concurrent.futures.Executor
    limits: ClientLimits
    budget: ByteBudget
    shares: ClientByteShares = field(default_factory=lambda: ClientByteShares(DEFAULT_FETCH_BYTES_PER_CLIENT))
    # Produce requests to topics that recompress (num.recompression.threads); None: on ``io``.
    recompression: concurrent.futures.Executor | None = None
    # Each address's share of the interpreter (request.cpu.max.percent.per.ip); None: no bound.
    cpu: CpuShares | None = None


class BrokerService(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, node_id: int, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 controller_client: Any, producer_ids: ProducerIdManager, *, defaults: dict[str, str],
                 controller_endpoints: Sequence[tuple[str, int]], capacity: Capacity,
                 metadata_lock: threading.RLock | None = None, authorizer: Authorizer = ALLOW_ALL,
                 quotas: QuotaManager | None = None) -> None:
        self.node_id = node_id
        self.authz = authorizer  # ACL checks; ALLOW_ALL when no authorizer is configured
        self.quotas = quotas
        self.rm = replica_manager
        self.cache = metadata_cache
        self.controller_client = controller_client
        self.producer_ids = producer_ids
        self.defaults = defaults
        self.controller_endpoints = list(controller_endpoints)
        self.auto_create = defaults.get("auto.create.topics.enable", "true").strip().lower() == "true"
        self._auto_creating = threading.BoundedSemaphore(AUTO_CREATE_CONCURRENCY)
        self._auto_create_refusals = ThrottledWarning(log, level=logging.INFO)  # a client may cause them in a loop
        # Held by the metadata thread while an update goes into the cache *and* the replica manager:
        # a Metadata answer never names this broker leader of a partition it has not taken over yet.
        self.metadata_lock = metadata_lock or threading.RLock()
        self.capacity = capacity
        # Which listener's addresses a Metadata answer gives, by whether the request came over
        # TLS (gRPC does not say which port it arrived on). Set by BrokerServer; BROKER otherwise.
        self.listener_by_tls: dict[bool, str] = {}
        # The transaction coordinator and the calls to other brokers it makes (broker/txn_coordinator.py's
        # install sets them); None: no transactional producer is served.
        self.txn: Any = None
        self.txn_calls: Any = None

    # ---- boundary ----
    async def _guard(self, name: str, request: Any, work: Callable[[], Awaitable[Any]],
                     on_error: Callable[[], Any]) -> Any:
        try:
            return await work()
        except Overloaded:
            raise  # answered with RESOURCE_EXHAUSTED by _admitted
        except Exception:
            log.exception("%s failed on broker %d; request: %.500s", name, self.node_id, request)
            return on_error()

    @staticmethod
    async def _caller(context: grpc.aio.ServicerContext) -> Any:
        """The request's principal; a certificate no mapping rule accepts ends the call UNAUTHENTICATED."""
        try:
            return principal.principal_of(context)
        except errors.BrookError as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, e.message)
            raise  # abort raises; this only tells type checkers the path ends here

    @staticmethod
    def _as_replica(context: grpc.aio.ServicerContext, replica_id: int) -> errors.BrookError | None:
        """None when the caller is broker ``replica_id`` itself, else the refusal to answer with."""
        try:
            principal.require_node(context, replica_id)
        except errors.BrookError as e:
            return e
        return None

    async def _wait_out_throttle(self, context: Any, caller: Any, left_s: float) -> None:
        """Hold a request whose principal has ``left_s`` of a throttle time still to wait, as Kafka mutes the
        connection of a throttled answer: a client that ignores ``throttle_time_ms`` is slowed to its quota all
        the same. A produce or fetch stream, and a Kafka connection, read nothing more while their request
        waits here, so what waits is one request per stream or connection. A unary gRPC call has nothing to
        mute (a client could send any number meanwhile, each holding its bytes here): it is refused
        RESOURCE_EXHAUSTED, and the Brook client sends it again after its backoff."""
        if left_s <= 0:
            return
        quotas = self.quotas
        assert quotas is not None
        if isinstance(context, principal.CallIdentity) or getattr(context, "brook_authentication", None) is not None:
            quotas.held_total += 1
            await asyncio.sleep(left_s)
            return
        quotas.refused_total += 1
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"{caller} is over its quota for another {left_s * 1000:.0f} ms (throttle_time_ms)")

    async def _bounded(self, context: grpc.aio.ServicerContext, entries: int, kind: str) -> None:
        await refuse_oversized(context, self.cache, entries, kind)

    async def _admitted(self, context: grpc.aio.ServicerContext, work: Callable[[str], Awaitable[T]]) -> T:
        """Run a client request within its client's in-flight bound; refuse it with RESOURCE_EXHAUSTED.

        A unary request stays in flight until its answer is written out (``release_when_done``): a
        client that does not read its answers (an HTTP/2 peer granting no window) would otherwise have
        each answer held in gRPC's buffers while its next requests are admitted, without end."""
        client = peer_host(context.peer() or "unknown")
        CLIENT.set(client)  # this request's task: its work on the client pools takes this client's turns
        limits = self.capacity.limits
        try:
            limits.enter(client)
        except Overloaded as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        try:
            return await work(client)
        except Overloaded as e:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            raise  # abort raises; this only tells type checkers the path ends here
        finally:
            release_when_done(context, lambda: limits.leave(client), at_once=True)

    async def _in_turn(self, client: str, request: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """One request of a client's ProduceStream or FetchStream, under its address's share of the interpreter
        (broker/cpu_shares.py) as a unary call is under the receive gate's: while the address is over its share
        (and others have requests) it waits before it starts, and its steps on the event loop are charged to
        the address. Before, a stream's requests never waited and the loop's work for them (an inline append,
        a fetch answer built) was no one's: four FetchStreams from one address were never held, and another
        address's produce went from 6 ms to 74 ms at the median."""
        cpu = self.capacity.cpu
        return await (request() if cpu is None else cpu.run(client, request))

    async def _io(self, fn: Callable[[], T]) -> T:
        """Blocking work of a client request, on the bounded client executor."""
        return await asyncio.get_running_loop().run_in_executor(self.capacity.io, fn)

    async def _replication_io(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.capacity.replication, fn)

    # ---- Produce ----
    async def Produce(self, request: broker_pb2.ProduceRequest, context: grpc.aio.ServicerContext) -> Any:
        # A Kafka-protocol connection starts its next request once this one's batches are appended; it hands over
        # each partition's records apart from the request (``brook_produce_records``), as it decoded them.
        return await self._produce_call(request, context, getattr(context, "brook_on_appended", None),
                                        getattr(context, "brook_produce_records", None))

    async def ProduceStream(self, request_iterator: AsyncIterator[broker_pb2.ProduceRequest],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[broker_pb2.ProduceResponse]:
        """A producer's pipelined requests to this broker, as Kafka serves one connection.

        Each request is handled as a unary Produce (its caller, admission, byte budget and
        authorization checked per request). The next request is read once this one's batches are
        appended (or it ended), so they are appended in the order sent and an idempotent
        producer's sequences never overtake one another; acks=all waits overlap. Answers go in
        request order, one per request. At most ``PRODUCE_STREAM_MAX_IN_FLIGHT`` are read and
        unanswered: the stream is not read further until one is answered, and gRPC's flow control
        holds the client.
        A refusal that ends a unary call (UNAUTHENTICATED, RESOURCE_EXHAUSTED) ends the stream with
        that status; the producer fails its unanswered requests over to its retries.
        """
        context = principal.CallIdentity(context)  # type: ignore[assignment]  # read once, not per request
        client = peer_host(context.peer() or "unknown")
        loop = asyncio.get_running_loop()
        room = asyncio.Semaphore(PRODUCE_STREAM_MAX_IN_FLIGHT)
        # The handled requests in arrival order, then None once the client is done (or the reader failed).
        answers: asyncio.Queue[asyncio.Task[Any] | None] = asyncio.Queue()
        # The first request that ended in a refusal (context.abort): it ends the stream at once, not
        # after the acks=all waits of the requests before it.
        refused: asyncio.Future[BaseException] = loop.create_future()

        def on_done(appended: asyncio.Future[None], task: asyncio.Task[Any]) -> None:
            if not appended.done():
                appended.set_result(None)  # ended before its batches were appended: the next may start
            if not task.cancelled() and (exc := task.exception()) is not None and not refused.done():
                refused.set_result(exc)

        async def read() -> None:
            incoming = aiter(request_iterator)
            try:
                while True:
                    await room.acquire()  # before reading: no request is held beyond the bound
                    try:
                        request = await anext(incoming)
                    except StopAsyncIteration:
                        return
                    except Exception as exc:  # refused as it arrived (its SASL session is gone)
                        if not refused.done():
                            refused.set_result(exc)
                        raise
                    appended: asyncio.Future[None] = loop.create_future()
                    task = asyncio.ensure_future(self._in_turn(
                        client, functools.partial(self._produce_call, request, context, appended)))
                    task.add_done_callback(functools.partial(on_done, appended))
                    answers.put_nowait(task)
                    await appended  # set once appended, or by on_done
                    if refused.done():
                        return  # the stream ends with the refusal: read nothing more
            finally:
                answers.put_nowait(None)

        reader = asyncio.ensure_future(read())
        tasks: list[asyncio.Task[Any]] = []
        try:
            while (task := await answers.get()) is not None:
                tasks.append(task)
                try:
                    if not task.done():
                        await asyncio.wait((task, refused), return_when=asyncio.FIRST_COMPLETED)
                    if refused.done():
                        raise refused.result()
                    response = task.result()
                finally:
                    room.release()
                tasks.remove(task)  # answered; an unanswered one is cancelled below
                yield response
            if refused.done():
                raise refused.result()
            await reader  # the client's half-close, or the error that ended the reading
        finally:
            reader.cancel()
            if reader.done() and not reader.cancelled():
                reader.exception()  # retrieved: it is the refusal raised above
            while not answers.empty():
                if (queued := answers.get_nowait()) is not None:
                    tasks.append(queued)
            for task in tasks:
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # retrieved: a second refusal of an ending stream is not news

    async def _produce_call(self, request: broker_pb2.ProduceRequest, context: grpc.aio.ServicerContext,
                            appended: asyncio.Future[None] | None,
                            records: list[bytes] | None = None) -> broker_pb2.ProduceResponse:
        """One Produce request, from its caller's checks to its answer; ``appended`` is set once its
        batches are appended (before any acks=all wait). ``records``: each partition's, when the caller
        holds them apart from ``request`` (whose partitions then carry none)."""
        await self._bounded(context, len(request.partitions), "partitions")
        if records is None:
            # Each read of a partition's ``records`` copies them out of the message (10 MiB: 1-8 ms of the loop
            # here): they are read once, and that copy is what is appended.
            records = [pd.records for pd in request.partitions]
        elif len(records) != len(request.partitions):
            raise ValueError(f"{len(records)} records for {len(request.partitions)} partitions")
        size = sum(map(len, records))
        caller = await self._caller(context)
        if self.quotas is not None:
            await self._wait_out_throttle(context, caller, self.quotas.produce_held_s(caller))

        async def work(client: str) -> Any:
            budget = self.capacity.budget
            # The request's bytes are already in memory; refusing (rather than queueing) lets
            # them go at once, and the producer retries after its backoff.
            if not budget.try_acquire(size):
                raise Overloaded(f"broker {self.node_id} holds {budget.used_bytes} bytes of requests in flight "
                                 f"(queued.max.request.bytes={budget.total_bytes})")
            try:
                return await self._guard("Produce", request, lambda: self._produce(request, caller, appended, records),
                                         lambda: _produce_error_all(request, ErrorCode.UNKNOWN_SERVER_ERROR,
                                                                    "internal error"))
            finally:
                budget.release(budget.clamp(size))
        return await self._admitted(context, work)

    async def _produce(self, req: broker_pb2.ProduceRequest, caller: Any = principal.ANONYMOUS,
                       appended: asyncio.Future[None] | None = None,
                       records: list[bytes] | None = None) -> broker_pb2.ProduceResponse:
        """``records``: each partition's records, read out of ``req`` once (by default here); emptied once
        they are appended."""
        if req.acks not in (0, 1, -1):
            return _produce_error_all(req, ErrorCode.INVALID_REQUIRED_ACKS,
                                      f"acks must be 0, 1 or -1 (all), not {req.acks}")
        started = time.perf_counter()
        if records is None:
            records = [pd.records for pd in req.partitions]
        denied = self.authz.denied_topics(caller, authz.WRITE, {pd.topic for pd in req.partitions})
        written = sum(len(r) for r, pd in zip(records, req.partitions, strict=True) if pd.topic not in denied)
        verified: dict[int, dict[int, int]] = {}  # a transactional request's partitions: their verification
        if req.transactional_id:
            refused = await self._transactional_refusal(req, caller, denied, records, verified)
            if isinstance(refused, broker_pb2.ProduceResponse):
                return refused
            futures: list[concurrent.futures.Future | None] = [None] * len(req.partitions)
            for i, error in refused.items():
                failed: concurrent.futures.Future = concurrent.futures.Future()
                failed.set_exception(error)
                futures[i] = failed
        else:
            futures = self._produce_append_inline(req, denied, records)
        deferred = [i for i, f in enumerate(futures) if f is None]
        if deferred:
            # Recompression costs CPU in proportion to the decompressed bytes (a 1 KiB zstd batch may
            # inflate to 32 MiB to be gzipped again): such requests get threads of their own, so a
            # flood of them delays only other recompressing producers, never fetches or metadata.
            pool = self.capacity.recompression if self.capacity.recompression is not None and \
                self._recompresses(req, deferred) else self.capacity.io
            done = await asyncio.get_running_loop().run_in_executor(
                pool, lambda: self._produce_append(req, caller, denied, deferred, records, verified))
            for i, f in zip(deferred, done, strict=True):
                futures[i] = f
        records.clear()  # appended: the copies are not held through an acks=all wait (the caller's list is this one)
        if appended is not None and not appended.done():
            appended.set_result(None)
        times = self.rm.produce_times
        appended_at = time.perf_counter()
        times.local.observe(appended_at - started)
        if req.acks == -1:
            # The purgatory times each wait out at timeout_ms; the slack only guards a lost completion.
            # Awaiting holds no thread: the purgatory's completion wakes this coroutine on the loop.
            pending = [on_loop(f) for f in futures if not f.done()]
            for waiting in pending:
                # Only wake-ups: the outcome is read from ``futures`` below. A failed one (the ISR
                # did not follow in time) must not be logged by asyncio as never retrieved.
                waiting.add_done_callback(_observe)
            if pending:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + min(max(0, req.timeout_ms), MAX_PRODUCE_TIMEOUT_MS) / 1000 + \
                    PRODUCE_WAIT_SLACK_S
                for waiting in pending:
                    if loop.time() >= deadline:
                        break
                    with contextlib.suppress(Exception):  # an outcome, read below; a cancel still ends the call
                        await until_resolved(waiting, deadline - loop.time())
            times.remote.observe(time.perf_counter() - appended_at)
        resp = self._produce_response(req, futures)  # type: ignore[arg-type]  # no None left
        if self.quotas is not None:
            resp.throttle_time_ms = self.quotas.produce(caller, written)
        return resp

    def _produce_append_inline(self, req: broker_pb2.ProduceRequest, denied: set[str] | frozenset[str],
                               records: list[bytes]) -> list[concurrent.futures.Future | None]:
        """Append what can be appended on the event loop without waiting: a small request's
        partitions whose locks are free and whose logs need no roll, flush or recompression.

        An executor hand-off costs an idle broker about 0.8 ms each way on a 2-core machine, more
        than validating and writing a few KiB to the page cache. None marks a partition left for
        the executor (``_produce_append``): a held lock, a sequence gap to wait out, blocking log
        work, a topic to auto-create, or a request too large to hold the loop for.
        """
        if len(req.partitions) > INLINE_APPEND_MAX_PARTITIONS or \
                sum(map(len, records)) > INLINE_APPEND_MAX_BYTES or (
                self.auto_create and any(self.cache.topic(pd.topic) is None for pd in req.partitions)):
            return [None] * len(req.partitions)
        futures: list[concurrent.futures.Future | None] = []
        for pd, data in zip(req.partitions, records, strict=True):
            if pd.topic in denied or pd.topic.startswith("__"):
                futures.append(None)  # refused by _produce_append, with its error
                continue
            try:
                futures.append(self.rm.append_records(pd.topic, pd.partition, data, acks=req.acks,
                                                      timeout_ms=req.timeout_ms, blocking=False))
            except WouldBlock:
                futures.append(None)
        return futures

    def _recompresses(self, req: broker_pb2.ProduceRequest, indexes: Sequence[int]) -> bool:
        """Does any of these partitions' logs compress produced batches again (its topic's
        ``compression.type`` is a codec, not ``producer``)?"""
        for i in indexes:
            pd = req.partitions[i]
            p = self.rm.partition(pd.topic, pd.partition)
            if p is not None and p.log.recompresses:
                return True
        return False

    def _produce_append(self, req: broker_pb2.ProduceRequest, caller: Any, denied: set[str] | frozenset[str],
                        indexes: Sequence[int], records: list[bytes],
                        verified: dict[int, dict[int, int]] | None = None) -> list[concurrent.futures.Future]:
        """Append the partitions at ``indexes`` of the request, in that order, with their ``records``
        (blocking: disk, lock and sequence waits, and the auto-create wait)."""
        chosen = [req.partitions[i] for i in indexes]
        self._maybe_auto_create({pd.topic for pd in chosen} - set(denied), wait=True, caller=caller)
        futures: list[concurrent.futures.Future] = []
        for i, pd in zip(indexes, chosen, strict=True):
            if pd.topic in denied:
                refused: concurrent.futures.Future = concurrent.futures.Future()
                refused.set_exception(authz.denied_error(caller, authz.WRITE, authz.TOPIC, pd.topic))
                futures.append(refused)
                continue
            if pd.topic.startswith("__"):
                # Internal topics (__consumer_offsets) are written by the broker itself only.
                fut: concurrent.futures.Future = concurrent.futures.Future()
                fut.set_exception(errors.InvalidTopicException(f"cannot produce to internal topic {pd.topic}"))
                futures.append(fut)
                continue
            futures.append(self.rm.append_records(pd.topic, pd.partition, records[i], acks=req.acks,
                                                  timeout_ms=req.timeout_ms, transactional=bool(req.transactional_id),
                                                  verified=(verified or {}).get(i)))
        return futures

    async def _transactional_refusal(self, req: broker_pb2.ProduceRequest, caller: Any, denied: set[str] | frozenset[str],
                                     records: list[bytes], verified: dict[int, dict[int, int]]
                                     ) -> broker_pb2.ProduceResponse | dict[int, errors.BrookError]:
        """A transactional producer's request, before anything is appended: the answer refusing it all, or the
        partitions (by index) refused, with why; ``verified`` gets each partition's producer id and the marker
        mark its verification holds at (the append refuses a batch opening a transaction if a marker of that
        producer was written since: the transaction it was verified for has ended).

        As Kafka's: WRITE on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every
        partition), acks=all, and every batch transactional of one producer id and epoch (else INVALID_RECORD;
        the log refuses a mixed request too). Then KIP-890's verification: a partition whose log has no ongoing
        transaction of this producer takes its first batch only once the transaction's coordinator says the
        partition was added to the producer's ongoing transaction. Without it a client could write transactional
        batches no coordinator knows of: nobody would ever end them, and the partition's last stable offset, the
        bound of every read_committed consumer, would stay below them for good."""
        tid = req.transactional_id
        if not self.authz.authorize(caller, authz.WRITE, "TRANSACTIONAL_ID", tid):
            return _produce_error_all(req, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                      f"{caller} may not WRITE transactional id {tid[:100]!r}")
        if req.acks != -1:
            return _produce_error_all(req, ErrorCode.INVALID_REQUIRED_ACKS, "a transactional producer writes with acks=all")
        if self.txn_calls is None:
            return _produce_error_all(req, ErrorCode.INVALID_REQUEST, "this broker serves no transactions")
        checks: list[tuple[int, TopicPartition, int, int]] = []
        for i, (pd, data) in enumerate(zip(req.partitions, records, strict=True)):
            if pd.topic in denied or pd.topic.startswith("__"):
                continue  # refused by _produce_append
            try:
                h = read_header(data)
            except errors.BrookError:
                continue  # the log's validation refuses it with its reason
            if not h.is_transactional or h.producer_id < 0:
                return _produce_error_all(req, ErrorCode.INVALID_RECORD,
                                          "a produce with a transactional id holds transactional batches only")
            checks.append((i, TopicPartition(pd.topic, pd.partition), h.producer_id, h.producer_epoch))
        if not checks:
            return {}
        verify = self.txn_calls.verify

        def check(i: int, tp: TopicPartition, pid: int, epoch: int) -> int:  # off the loop: log locks, an RPC
            p = self.rm.partition(tp.topic, tp.partition)
            if p is None:
                return ErrorCode.NONE  # not led here: the append answers why
            mark = p.log.marker_mark(pid)  # first: a marker written after it voids this verification
            verified[i] = {pid: mark}
            if pid in p.log.ongoing_transactions() and p.log.producer_epoch(pid) == epoch:
                return ErrorCode.NONE  # this producer's transaction is open here already: verified by its first batch
            return verify(tid, pid, epoch, tp)
        codes = await self._io(lambda: [check(i, tp, pid, epoch) for i, tp, pid, epoch in checks])
        return {i: errors.error_for(_VERIFY_ANSWERS.get(code, code),
                                    f"the ongoing transaction of {tid[:100]!r} does not hold {tp.topic}-{tp.partition} "
                                    f"(the coordinator answered error {code})")
                for (i, tp, _, _), code in zip(checks, codes, strict=True) if code != ErrorCode.NONE}

    def _produce_response(self, req: broker_pb2.ProduceRequest,
                          futures: list[concurrent.futures.Future]) -> broker_pb2.ProduceResponse:
        resp = broker_pb2.ProduceResponse()
        for pd, fut in zip(req.partitions, futures, strict=True):
            out = resp.partitions.add(topic=pd.topic, partition=pd.partition, base_offset=-1,
                                      log_append_time_ms=-1, log_start_offset=-1)
            if not fut.done():
                out.error_code, out.error_message = ErrorCode.REQUEST_TIMED_OUT, "acks=all wait did not complete"
                continue
            exc = fut.exception()
            if exc is None:
                r: AppendResult = fut.result()
                out.base_offset, out.log_append_time_ms, out.log_start_offset = (
                    r.base_offset, r.log_append_time_ms, r.log_start_offset)
            elif isinstance(exc, errors.BrookError):
                self._partition_error(out, exc)
                for index, why in exc.record_errors[:MAX_RECORD_ERRORS]:  # bounded where they are found too
                    out.record_errors.add(batch_index=index, message=why)
            else:
                log.error("produce to %s-%d failed unexpectedly", pd.topic, pd.partition, exc_info=exc)
                out.error_code, out.error_message = ErrorCode.UNKNOWN_SERVER_ERROR, "internal error"
        return resp

    # ---- Fetch ----
    async def Fetch(self, request: broker_pb2.FetchRequest, context: grpc.aio.ServicerContext) -> Any:
        if request.replica_id >= 0:
            return await self._replica_fetch(request, context)
        return await self._consumer_fetch(request, context)

    async def FetchStream(self, request_iterator: AsyncIterator[broker_pb2.FetchRequest],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[FetchAnswer | broker_pb2.FetchResponse]:
        """A consumer's fetches from this broker, answered one after the other, each as a unary Fetch.

        The consumer sends the next request once it has the last response, so one is in flight per
        stream, and the next is not read before the last answer is written out: the answer's bytes
        stay charged to the client's share and the broker's budget until then, as a unary Fetch's do
        until its call ends, and a consumer that does not read its answers holds one. A refusal that
        ends a unary call (UNAUTHENTICATED, RESOURCE_EXHAUSTED, an oversized request) ends the stream.
        """
        context = principal.CallIdentity(context)  # type: ignore[assignment]  # read once, not per request
        client = peer_host(context.peer() or "unknown")
        async for request in request_iterator:
            if request.replica_id >= 0:
                yield _fetch_refused(request, errors.error_for(
                    ErrorCode.INVALID_REQUEST, "FetchStream carries consumer fetches (replica_id -1) only; "
                    "followers fetch over ReplicaFetch"))
                continue
            held: list[Callable[[], None]] = []
            try:
                # Resumes once written out.
                yield await self._in_turn(client, functools.partial(self._consumer_fetch, request, context, held.append))
            finally:  # or the call ended at the yield
                for release in held:
                    release()

    async def _consumer_fetch(self, request: broker_pb2.FetchRequest, context: grpc.aio.ServicerContext,
                              hold: Callable[[Callable[[], None]], None] | None = None,
                              ) -> FetchAnswer | broker_pb2.FetchResponse:
        """A consumer's Fetch; ``hold`` takes the release of the answer's bytes (default: when the call ends)."""
        await self._bounded(context, len(request.partitions), "partitions")
        # One entry per partition, as Kafka's fetch map (replica_manager.one_entry_per_partition): the answer
        # names each partition once, an error (denied topic) included.
        request = one_entry_per_partition(request)

        def on_error() -> broker_pb2.FetchResponse:
            return _fetch_error_all(request)
        caller = await self._caller(context)
        if self.quotas is not None:
            await self._wait_out_throttle(context, caller, self.quotas.fetch_held_s(caller))
        denied = self.authz.denied_topics(caller, authz.READ, {fp.topic for fp in request.partitions})

        # A Kafka-protocol fetch (broker/kafka_wire) takes the records as segment-file slices (sendfile).
        slices = getattr(context, "brook_file_slices", None)

        async def fetch(client: str) -> FetchAnswer:
            allowed = _without_topics(request, denied)
            answer = await self._fetch(allowed, client, slices, context, hold) if allowed.partitions or not denied \
                else FetchAnswer()
            for fp in request.partitions:
                if fp.topic in denied:
                    _partition_errors(answer.message, [fp], authz.denied_error(
                        caller, authz.READ, authz.TOPIC, fp.topic), high_watermark=-1, log_start_offset=-1,
                        log_end_offset=-1, last_stable_offset=-1)
            if self.quotas is not None:
                sent = answer.records_bytes() + sum(len(s) for s in (slices or {}).values())
                answer.message.throttle_time_ms = self.quotas.fetch(caller, sent)
            return answer
        return await self._admitted(context, lambda client: self._guard("Fetch", request, lambda: fetch(client),
                                                                        on_error))

    async def fetch_over_grpc(self, request: broker_pb2.FetchRequest, context: grpc.aio.ServicerContext) -> Any:
        """Fetch as the gRPC port serves it (``add_to_server``): a long answer handed over as its bytes, joined
        on an executor thread (the Kafka listener calls ``Fetch`` itself, and takes the records as they are)."""
        answer = await self.Fetch(_grpc_sized(request), context)
        return await bytes_apart.for_grpc(answer, self._replication_io if request.replica_id >= 0 else self._io)

    async def fetch_stream_over_grpc(self, request_iterator: AsyncIterator[broker_pb2.FetchRequest],
                                     context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def sized() -> AsyncIterator[broker_pb2.FetchRequest]:
            async for request in request_iterator:
                yield _grpc_sized(request)
        async for wire in _for_grpc(self.FetchStream(sized(), context), self._io):
            yield wire

    async def replica_fetch_over_grpc(self, request_iterator: AsyncIterator[broker_pb2.FetchRequest],
                                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for wire in _for_grpc(self.ReplicaFetch(request_iterator, context), self._replication_io):
            yield wire

    async def ReplicaFetch(self, request_iterator: AsyncIterator[broker_pb2.FetchRequest],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[FetchAnswer | broker_pb2.FetchResponse]:
        """A follower's fetch session: its requests answered one after the other, each as a follower's Fetch.

        The follower sends the next request once it has the last response, so one message is in
        flight per stream; each is checked as a unary follower Fetch is (only that broker may send it).
        The stream is a fetch session (broker/fetch_session.py): after its first answer the follower
        sends only what changed, and answers carry only the partitions with something new.
        """
        context = principal.CallIdentity(context)  # type: ignore[assignment]  # read once, not per request
        session = self.rm.new_fetch_session()
        try:
            async for request in request_iterator:
                # Yielded, not held in a local while the caller writes it out (_for_grpc).
                yield _sent(await self.replica_fetch_message(request, context, session))
        finally:
            session.close()

    async def replica_fetch_message(self, request: broker_pb2.FetchRequest, context: Any, session: FollowerFetchSession,
                                    ) -> FetchAnswer | broker_pb2.FetchResponse | None:
        """One request of a follower's fetch session: a ReplicaFetch stream's, or a replication listener
        connection's (broker/replication_listener.py). None only for a session with a ``send_now``: the
        answer went out through it."""
        if request.replica_id < 0:
            return _fetch_refused(request, errors.error_for(
                ErrorCode.INVALID_REQUEST, "a fetch session carries follower fetches (replica_id >= 0) only"))
        return await self._replica_fetch(request, context, session)

    async def _replica_fetch(self, request: broker_pb2.FetchRequest, context: grpc.aio.ServicerContext,
                             session: FollowerFetchSession | None = None,
                             ) -> FetchAnswer | broker_pb2.FetchResponse | None:
        # A follower's fetch moves the HW: only that broker may send it.
        if (refusal := self._as_replica(context, request.replica_id)) is not None:
            return _fetch_refused(request, refusal)
        if session is not None:
            try:
                session.update(request)
            except errors.BrookError as e:
                return _fetch_refused(request, e)
        # Replication has its own executor and no client bounds: a client flood must not
        # starve the followers (and so shrink the ISR).
        work = (lambda: self._fetch(request, None)) if session is None else \
            (lambda: self.rm.session_fetch(request, session, run=self._replication_io))
        return await self._guard("Fetch", request, work, lambda: _fetch_error_all(request))

    async def _fetch(self, req: broker_pb2.FetchRequest, client: str | None,
                     slices: dict[tuple[str, int], Any] | None = None,
                     context: Any = None,
                     hold: Callable[[Callable[[], None]], None] | None = None) -> FetchAnswer:
        """Read (and long-poll) through the ReplicaManager; ``client`` None for a follower fetch.

        A client's fetch takes its bytes from the client's share (ClientByteShares) and then from the
        broker's budget, and holds both until the call ends (``context.add_done_callback``: gRPC wrote
        the answer out or the call was cancelled; the Kafka listener, once the answer is written or
        the connection closed; a FetchStream, once the answer is written out: ``hold``), so answers a
        client does not read stay bounded."""
        budget, limits = self.capacity.budget, self.capacity.limits
        if client is None:
            async def no_reserve(n: int) -> int:
                return 0
            resp, _ = await self.rm.fetch_async(req, run=self._replication_io, reserve=no_reserve,
                                                release=lambda n: None, on_park=lambda: None,
                                                on_unpark=lambda: None)
            return resp
        shares = self.capacity.shares

        async def reserve(n: int) -> int:
            got = await shares.acquire(client, n)
            try:
                granted = await budget.acquire(got)
            except BaseException:
                shares.release(client, got)
                raise
            if granted < got:
                shares.release(client, got - granted)
            return granted

        def release(n: int) -> None:
            budget.release(n)
            shares.release(client, n)

        resp, held = await self.rm.fetch_async(req, run=self._io, reserve=reserve, release=release,
                                               on_park=lambda: limits.start_waiting(client),
                                               on_unpark=lambda: limits.stop_waiting(client), slices=slices)
        if held:
            if hold is not None:
                hold(lambda: release(held))
            else:
                release_when_done(context, lambda: release(held))
        return resp

    # ---- ListOffsets / OffsetsForLeaderEpoch ----
    async def ListOffsets(self, request: broker_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext) -> Any:
        def on_error() -> broker_pb2.ListOffsetsResponse:
            resp = broker_pb2.ListOffsetsResponse()
            for lp in request.partitions:
                resp.partitions.add(topic=lp.topic, partition=lp.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                    error_message="internal error", offset=-1, timestamp=-1, leader_epoch=-1)
            return resp
        # A follower's ListOffsets (replica_id >= 0) is rare and short: it shares the client path.
        await self._bounded(context, len(request.partitions), "partitions")
        caller = await self._caller(context)
        return await self._admitted(context, lambda client: self._guard(
            "ListOffsets", request, lambda: self._io(lambda: self._list_offsets(request, caller)), on_error))

    def _list_offsets(self, req: broker_pb2.ListOffsetsRequest, caller: Any) -> broker_pb2.ListOffsetsResponse:
        denied = self.authz.denied_topics(caller, authz.DESCRIBE, {p.topic for p in req.partitions})
        allowed = _without_topics(req, denied)
        resp = self.rm.list_offsets(allowed) if allowed.partitions or not denied else broker_pb2.ListOffsetsResponse()
        for lp in req.partitions:
            if lp.topic in denied:
                _partition_errors(resp, [lp], authz.denied_error(caller, authz.DESCRIBE, authz.TOPIC, lp.topic),
                                  offset=-1, timestamp=-1, leader_epoch=-1)
        return resp

    async def OffsetsForLeaderEpoch(self, request: broker_pb2.OffsetsForLeaderEpochRequest,
                                    context: grpc.aio.ServicerContext) -> Any:
        def on_error() -> broker_pb2.OffsetsForLeaderEpochResponse:
            resp = broker_pb2.OffsetsForLeaderEpochResponse()
            for p in request.partitions:
                resp.partitions.add(topic=p.topic, partition=p.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                    error_message="internal error", leader_epoch=-1, end_offset=-1)
            return resp
        if request.replica_id >= 0:  # a follower (truncation): replication capacity, no client bounds
            if (refusal := self._as_replica(context, request.replica_id)) is not None:
                return _partition_errors(broker_pb2.OffsetsForLeaderEpochResponse(), request.partitions, refusal,
                                         leader_epoch=-1, end_offset=-1)
            return await self._guard("OffsetsForLeaderEpoch", request,
                                     lambda: self._replication_io(lambda: self.rm.offsets_for_leader_epoch(request)),
                                     on_error)
        await self._bounded(context, len(request.partitions), "partitions")
        caller = await self._caller(context)
        return await self._admitted(context, lambda client: self._guard(
            "OffsetsForLeaderEpoch", request, lambda: self._io(lambda: self._offsets_for_leader_epoch(request, caller)),
            on_error))

    def _offsets_for_leader_epoch(self, req: broker_pb2.OffsetsForLeaderEpochRequest,
                                  caller: Any) -> broker_pb2.OffsetsForLeaderEpochResponse:
        # A consumer validating its position (KIP-320) needs DESCRIBE on the topic.
        denied = self.authz.denied_topics(caller, authz.DESCRIBE, {p.topic for p in req.partitions})
        allowed = _without_topics(req, denied)
        resp = (self.rm.offsets_for_leader_epoch(allowed) if allowed.partitions or not denied
                else broker_pb2.OffsetsForLeaderEpochResponse())
        for p in req.partitions:
            if p.topic in denied:
                _partition_errors(resp, [p], authz.denied_error(caller, authz.DESCRIBE, authz.TOPIC, p.topic),
                                  leader_epoch=-1, end_offset=-1)
        return resp

    # ---- Metadata ----
    async def Metadata(self, request: broker_pb2.MetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        listener = self.listener_by_tls.get(principal.is_tls(context), "BROKER")
        await self._bounded(context, len(request.topics), "topics")
        caller = await self._caller(context)
        return await self._admitted(context, lambda client: self._guard(
            "Metadata", request, lambda: self._io(lambda: self._metadata(request, listener, caller)),
            lambda: broker_pb2.MetadataResponse(topics=[broker_pb2.TopicMetadata(
                name=t, error_code=ErrorCode.UNKNOWN_SERVER_ERROR, error_message="internal error")
                for t in request.topics])))

    def _metadata(self, req: broker_pb2.MetadataRequest, listener: str = "BROKER",
                  caller: Any = principal.ANONYMOUS) -> broker_pb2.MetadataResponse:
        create_errors: dict[str, errors.BrookError] = {}
        # Kafka: topics the caller may not DESCRIBE are left out of an all-topics answer and
        # answered TOPIC_AUTHORIZATION_FAILED when named (and are never auto-created).
        denied = set() if req.all_topics else self.authz.denied_topics(caller, authz.DESCRIBE, req.topics)
        for name in denied:
            create_errors[name] = authz.denied_error(caller, authz.DESCRIBE, authz.TOPIC, name)
        if not req.all_topics and req.allow_auto_topic_creation:
            create_errors.update(self._maybe_auto_create(set(req.topics) - denied, wait=True, caller=caller))
        with self.metadata_lock:
            resp = self._metadata_response(req, create_errors, listener)
        if req.all_topics and self.authz.enabled:
            keep = [t for t in resp.topics if self.authz.may_describe_topic(caller, t.name)]
            del resp.topics[:]
            resp.topics.extend(keep)
        return resp

    def _metadata_response(self, req: broker_pb2.MetadataRequest, create_errors: dict[str, errors.BrookError],
                           listener: str = "BROKER") -> broker_pb2.MetadataResponse:
        resp = broker_pb2.MetadataResponse(cluster_id=self.cache.cluster_id, controller_id=self.cache.controller_id,
                                           metadata_version=self.cache.version)
        for b in self.cache.brokers():
            host, port = b.endpoint(listener)
            resp.brokers.add(node_id=b.node_id, host=host, port=port, rack=b.rack, fenced=b.fenced)
        for host, port in self.controller_endpoints:
            resp.controllers.add(name="CONTROLLER", host=host, port=port)
        names = [t.name for t in self.cache.topics()] if req.all_topics else list(dict.fromkeys(req.topics))
        for name in names:
            self._topic_metadata(resp.topics.add(name=name), name, create_errors.get(name))
        return resp

    def _topic_metadata(self, out: broker_pb2.TopicMetadata, name: str, create_error: errors.BrookError | None) -> None:
        topic = self.cache.topic(name)
        if create_error is not None and create_error.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            out.error_code, out.error_message = create_error.code, create_error.message
            return
        if topic is None:
            if create_error is not None:
                out.error_code, out.error_message = create_error.code, create_error.message
            elif not _LEGAL_TOPIC.match(name):
                out.error_code, out.error_message = ErrorCode.INVALID_TOPIC_EXCEPTION, f"illegal topic name {name!r}"
            else:
                out.error_code, out.error_message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name}"
            return
        out.topic_id = topic.topic_id
        out.is_internal = name.startswith("__")
        for p in self.cache.partitions_of(name):
            offline = [r for r in p.replicas if not self._broker_alive(r)]
            pm = out.partitions.add(partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                                    replicas=list(p.replicas), isr=list(p.isr), offline_replicas=offline)
            if p.leader < 0:
                pm.error_code = ErrorCode.LEADER_NOT_AVAILABLE

    def _broker_alive(self, node_id: int) -> bool:
        b = self.cache.broker(node_id)
        return b is not None and not b.fenced

    def _maybe_auto_create(self, topics: set[str], *, wait: bool = False,
                           caller: Any = principal.ANONYMOUS) -> dict[str, errors.BrookError]:
        """Create unknown, legal topics through the controller when auto.create.topics.enable.

        The controller is asked with the caller's principal forwarded, as Kafka's brokers wrap an auto-creation
        in an envelope with the client's context (KIP-590): the controller authorizes the caller and counts the
        new partitions against the caller's controller mutation quota (KIP-599), strictly, as Kafka's controller
        does for the current CreateTopics version. Asked as the broker itself, a user held to one partition a
        second auto-created 1,000 topics in 2.4 s (audit). A refusal is answered UNKNOWN_TOPIC_OR_PARTITION,
        the code Kafka answers for a topic whose auto-creation did not happen, with the reason in the message."""
        missing = sorted(t for t in topics if self.cache.topic(t) is None and _LEGAL_TOPIC.match(t)
                         and not t.startswith("__"))
        if not missing or not self.auto_create:
            return {}
        refused: dict[str, errors.BrookError] = {}
        if self.authz.enabled and not self.authz.authorize(caller, authz.CREATE, authz.CLUSTER):
            # Kafka: auto-creation needs CREATE on the cluster or on the topic itself.
            refused = {t: authz.denied_error(caller, authz.CREATE, authz.TOPIC, t)
                       for t in self.authz.denied_topics(caller, authz.CREATE, missing)}
            missing = [t for t in missing if t not in refused]
            if not missing:
                return refused
        if not self._auto_creating.acquire(blocking=False):
            self._auto_create_refusals.warn("auto-creating %s for %s: %d auto-creations already running, answered "
                                            "UNKNOWN_TOPIC_OR_PARTITION", _listed(missing), caller, AUTO_CREATE_CONCURRENCY)
            busy = errors.UnknownTopicOrPartitionError(
                f"not created yet: this broker is already auto-creating topics for {AUTO_CREATE_CONCURRENCY} "
                f"requests; retry")
            return {**refused, **dict.fromkeys(missing, busy)}
        try:
            return {**refused, **self._auto_create(missing, wait, caller)}
        finally:
            self._auto_creating.release()

    def _auto_create(self, missing: list[str], wait: bool, caller: Any) -> dict[str, errors.BrookError]:
        parts = int(self.defaults.get("num.partitions", "1"))
        rf = int(self.defaults.get("default.replication.factor", "1"))
        req = controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=t, num_partitions=parts, replication_factor=rf)
                    for t in missing], timeout_ms=int(AUTO_CREATE_WAIT_S * 1000))
        forwarded = ((principal.FORWARDED_PRINCIPAL_KEY, str(caller)),
                     (principal.FORWARDED_HOST_KEY, getattr(caller, "host", "")))
        failures: dict[str, errors.BrookError] = {}
        try:
            resp = self.controller_client.call("CreateTopics", req, timeout_s=AUTO_CREATE_WAIT_S, metadata=forwarded)
        except errors.BrookError as e:
            log.warning("auto-creating %s for %s failed: %s", _listed(missing), caller, e)
            return dict.fromkeys(missing, e)
        for r in resp.results:
            if r.error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED:
                failures[r.name] = errors.UnknownTopicOrPartitionError(
                    f"not auto-created: {errors.code_name(r.error_code)}: {r.error_message}")
            elif r.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                failures[r.name] = errors.error_for(r.error_code, r.error_message)
        created = [t for t in missing if t not in failures]
        if created:
            log.info("auto-created topics %s for %s (%d partitions, RF %d)", _listed(created), caller, parts, rf)
        if failures:
            self._auto_create_refusals.warn("auto-creating %s for %s refused: %s", _listed(sorted(failures)), caller,
                                            next(iter(failures.values())).message)
        if wait and created:
            def ready(c: MetadataCache) -> bool:
                return all(c.topic(t) is not None and c.partitions_of(t)
                           and all(p.leader >= 0 for p in c.partitions_of(t)) for t in created)
            self.cache.wait_for(ready, AUTO_CREATE_WAIT_S)
        return failures

    # ---- InitProducerId ----
    async def InitProducerId(self, request: broker_pb2.InitProducerIdRequest,
                             context: grpc.aio.ServicerContext) -> Any:
        caller = await self._caller(context)
        return await self._admitted(context, lambda client: self._guard(
            "InitProducerId", request, lambda: self._io(lambda: self._init_producer_id(request, caller)),
            lambda: broker_pb2.InitProducerIdResponse(error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                                      error_message="internal error", producer_id=-1,
                                                      producer_epoch=-1)))

    def _init_producer_id(self, req: broker_pb2.InitProducerIdRequest,
                          caller: Any = principal.ANONYMOUS) -> broker_pb2.InitProducerIdResponse:
        try:
            # Kafka >= 2.8: IDEMPOTENT_WRITE on the cluster, or WRITE on any topic.
            if not (self.authz.authorize(caller, authz.IDEMPOTENT_WRITE, authz.CLUSTER)
                    or self.authz.may_write_some_topic(caller)):
                raise authz.denied_error(caller, authz.IDEMPOTENT_WRITE, authz.CLUSTER)
            # As Kafka without a transactional id: a given producer id/epoch is ignored and a
            # fresh id issued. Bumping the epoch of a caller-named id would let anyone fence
            # any producer; an idempotent producer bumps its own epoch locally (KIP-360).
            return broker_pb2.InitProducerIdResponse(producer_id=self.producer_ids.next_id(), producer_epoch=0)
        except errors.BrookError as e:
            return broker_pb2.InitProducerIdResponse(error_code=e.code, error_message=e.message,
                                                     producer_id=-1, producer_epoch=-1)


    # ---- DeleteRecords ----
    async def DeleteRecords(self, request: broker_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext) -> Any:
        def on_error() -> broker_pb2.DeleteRecordsResponse:
            return _partition_errors(broker_pb2.DeleteRecordsResponse(), request.partitions,
                                     errors.UnknownServerError("internal error"), low_watermark=-1)
        await self._bounded(context, len(request.partitions), "partitions")
        caller = await self._caller(context)
        return await self._admitted(context, lambda client: self._guard(
            "DeleteRecords", request, lambda: self._delete_records(request, caller), on_error))

    async def _delete_records(self, req: broker_pb2.DeleteRecordsRequest, caller: Any) -> broker_pb2.DeleteRecordsResponse:
        """Move each log start on the leader, then wait (no thread held) until the in-sync replicas have
        followed it, as Kafka's DelayedDeleteRecords does; REQUEST_TIMED_OUT for those that did not in time."""
        denied = self.authz.denied_topics(caller, authz.DELETE, {p.topic for p in req.partitions})
        resp = broker_pb2.DeleteRecordsResponse()
        # A partition named more than once moves for none of its entries: each gets INVALID_REQUEST, as
        # ListOffsets answers. Each copy moved the log start again and rewrote the checkpoint (audit: 1,000 copies,
        # 13 KB, made 4,000 fsyncs and 1,000 log lines); Kafka keys the partitions by a map.
        named = Counter((dp.topic, dp.partition) for dp in req.partitions)
        moving: list[tuple[broker_pb2.DeleteRecordsPartitionResult, broker_pb2.DeleteRecordsPartition]] = []
        for dp in req.partitions:
            out = resp.partitions.add(topic=dp.topic, partition=dp.partition, low_watermark=-1)
            try:
                refuse_repeated(named, dp.topic, dp.partition, "DeleteRecords")
                if dp.topic in denied:
                    raise authz.denied_error(caller, authz.DELETE, authz.TOPIC, dp.topic)
                if authz.is_internal_topic(dp.topic):  # as Kafka: the group coordinator owns its offsets
                    raise errors.error_class(ErrorCode.INVALID_TOPIC_EXCEPTION)(
                        f"cannot delete records of internal topic '{dp.topic}'")
                moving.append((out, dp))
            except errors.BrookError as e:
                self._partition_error(out, e)
        # Every move in one io task, with one checkpoint for all of them
        starts = await self._io(lambda: self.rm.delete_records_of([(dp.topic, dp.partition, dp.offset)
                                                                  for _, dp in moving])) if moving else []
        waiting: list[tuple[broker_pb2.DeleteRecordsPartitionResult, int]] = []
        for (out, _), start in zip(moving, starts, strict=True):
            if isinstance(start, errors.BrookError):
                self._partition_error(out, start)
            else:
                waiting.append((out, start))
        timeout_ms = min(max(0, req.timeout_ms), MAX_PRODUCE_TIMEOUT_MS)  # 0: answer without waiting, as Kafka
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        while waiting:
            lows = await self._io(lambda w=waiting: [self._low_watermark_or_error(o) for o, _ in w])
            still = []
            for (out, start), low in zip(waiting, lows, strict=True):
                if isinstance(low, errors.BrookError):
                    out.error_code, out.error_message = low.code, low.message
                elif low >= start:
                    out.low_watermark = low
                else:
                    still.append((out, start))
            waiting = still
            if waiting and asyncio.get_running_loop().time() >= deadline:
                for out, start in waiting:
                    out.error_code = ErrorCode.REQUEST_TIMED_OUT
                    out.error_message = (f"the log start of {out.topic}-{out.partition} is {start} on the leader; "
                                         f"not every in-sync replica has followed it within {timeout_ms} ms")
                break
            if waiting:
                await asyncio.sleep(DELETE_RECORDS_POLL_S)
        return resp

    def _partition_error(self, out: Any, e: errors.BrookError) -> None:
        """``e`` into a partition's result, with the partition's current leader for a leader error (KIP-951)."""
        out.error_code, out.error_message = e.code, e.message
        if e.code in _LEADER_ERRORS:
            out.current_leader.CopyFrom(self.cache.leader_and_epoch(out.topic, out.partition))

    def _low_watermark_or_error(self, out: broker_pb2.DeleteRecordsPartitionResult) -> int | errors.BrookError:
        try:
            return self.rm.low_watermark(out.topic, out.partition)
        except errors.BrookError as e:
            return e

    # ---- DescribeLogDirs ----
    async def DescribeLogDirs(self, request: broker_pb2.DescribeLogDirsRequest,
                              context: grpc.aio.ServicerContext) -> Any:
        await self._bounded(context, len(request.topics), "topics")
        caller = await self._caller(context)
        if not self.authz.authorize(caller, authz.DESCRIBE, authz.CLUSTER):  # Kafka: DESCRIBE on the cluster
            e = authz.denied_error(caller, authz.DESCRIBE, authz.CLUSTER)
            return broker_pb2.DescribeLogDirsResponse(error_code=e.code, error_message=e.message,
                                                      broker_id=self.node_id)
        topics = set(request.topics) or None
        return await self._admitted(context, lambda client: self._guard(
            "DescribeLogDirs", request,
            lambda: self._io(lambda: broker_pb2.DescribeLogDirsResponse(
                broker_id=self.node_id, dirs=self.rm.describe_log_dirs(topics))),
            lambda: broker_pb2.DescribeLogDirsResponse(error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                                       error_message="internal error", broker_id=self.node_id)))

    # ---- DescribeProducers (KIP-664) ----
    async def DescribeProducers(self, request: broker_pb2.DescribeProducersRequest,
                                context: grpc.aio.ServicerContext) -> Any:
        await self._bounded(context, len(request.partitions), "partitions")
        caller = await self._caller(context)
        return await self._admitted(context, lambda client: self._guard(
            "DescribeProducers", request, lambda: self._describe_producers(request, caller),
            lambda: _partition_errors(broker_pb2.DescribeProducersResponse(), request.partitions,
                                      errors.UnknownServerError("internal error"))))

    async def _describe_producers(self, req: broker_pb2.DescribeProducersRequest,
                                  caller: Any) -> broker_pb2.DescribeProducersResponse:
        """Each partition's producers from this broker's replica (leader or follower), after READ on the topic
        (Kafka's rule): the idempotent producers tracked to refuse duplicates and sequence gaps
        (``producer.id.expiration.ms`` forgets them)."""
        denied = self.authz.denied_topics(caller, authz.READ, {p.topic for p in req.partitions})
        # Each partition once: a copy of one named before is INVALID_REQUEST (as ListOffsets answers). Each copy was
        # read and answered with every producer of the partition, built on the event loop: 1,000 copies of one
        # partition with 5,000 producers (a 4 KB request) took 21 s of the loop and 3.5 GB (audit).
        seen: set[tuple[str, int]] = set()
        repeated: set[int] = set()
        for i, p in enumerate(req.partitions):
            if (p.topic, p.partition) in seen:
                repeated.add(i)
            seen.add((p.topic, p.partition))
        wanted = [key for key in seen if key[0] not in denied]

        def read() -> broker_pb2.DescribeProducersResponse:  # the answer too, off the loop: one partition may
            found: dict[tuple[str, int], Any] = {}  # hold 100,000 producers
            for topic, partition in wanted:
                try:
                    found[(topic, partition)] = self.rm.active_producers(topic, partition)
                except errors.BrookError as e:
                    found[(topic, partition)] = e
            resp = broker_pb2.DescribeProducersResponse()
            for i, p in enumerate(req.partitions):
                out = resp.partitions.add(topic=p.topic, partition=p.partition)
                got = errors.InvalidRequestError(f"{p.topic}-{p.partition} is named more than once") \
                    if i in repeated else authz.denied_error(caller, authz.READ, authz.TOPIC, p.topic) \
                    if p.topic in denied else found[(p.topic, p.partition)]
                if isinstance(got, errors.BrookError):
                    self._partition_error(out, got)
                    continue
                for pid, epoch, last_seq, last_ts, coordinator_epoch, txn_start in got:
                    out.producers.add(producer_id=pid, producer_epoch=epoch, last_sequence=last_seq,
                                      last_timestamp=last_ts, coordinator_epoch=coordinator_epoch,
                                      current_txn_start_offset=txn_start)
            return resp
        return await self._io(read)


    # ---- transactions, broker to broker ----
    async def WriteTxnMarkers(self, request: broker_pb2.WriteTxnMarkersRequest,
                              context: grpc.aio.ServicerContext) -> Any:
        """A transaction coordinator's markers for partitions this broker leads (node certificates only)."""
        await self._bounded(context, len(request.partitions), "partitions")
        if not principal.is_node_caller(context):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "WriteTxnMarkers is for brokers only")
        keys = [(p.topic, p.partition) for p in request.partitions]
        # Appended on a replication thread (log locks), waited for here: a thread held through the acks=all wait
        # was one no follower's fetch answer could use (ReplicaManager.append_markers).
        codes, waits, deadline = await self._replication_io(lambda: self.rm.append_markers(
            request.producer_id, request.producer_epoch, request.commit, request.coordinator_epoch, keys,
            request.timeout_ms))
        if waits:
            pending = {key: on_loop(fut) for key, fut in waits.items()}
            await asyncio.wait(pending.values(), timeout=max(0.0, deadline - time.monotonic()) + 1)
            for key, fut in pending.items():
                codes[key] = marker_answer(fut)
                fut.cancel()  # one still waiting: its purgatory entry times out on its own
        resp = broker_pb2.WriteTxnMarkersResponse()
        for topic, index in keys:
            resp.partitions.add(topic=topic, partition=index, error_code=codes.get((topic, index), 0))
        return resp

    async def VerifyTransaction(self, request: broker_pb2.VerifyTransactionRequest,
                                context: grpc.aio.ServicerContext) -> Any:
        """A partition leader's question to this coordinator (node certificates only): is the partition in
        the producer's ongoing transaction?"""
        if not principal.is_node_caller(context):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "VerifyTransaction is for brokers only")
        if self.txn is None:
            return broker_pb2.VerifyTransactionResponse(error_code=ErrorCode.NOT_COORDINATOR)
        code = self.txn.verify(request.transactional_id, request.producer_id, request.producer_epoch,
                               TopicPartition(request.topic, request.partition))
        return broker_pb2.VerifyTransactionResponse(error_code=code)


# A coordinator's verification answer as the producer is told it, as Kafka's AddPartitionsToTxnManager maps it: a
# coordinator that cannot answer now is NOT_ENOUGH_REPLICAS, which every producer retries; a partition not in the
# transaction is INVALID_TXN_STATE (the transaction must be aborted); a fenced producer is INVALID_PRODUCER_EPOCH.
_VERIFY_ANSWERS = {ErrorCode.NOT_COORDINATOR: ErrorCode.NOT_ENOUGH_REPLICAS,
                   ErrorCode.COORDINATOR_NOT_AVAILABLE: ErrorCode.NOT_ENOUGH_REPLICAS,
                   ErrorCode.COORDINATOR_LOAD_IN_PROGRESS: ErrorCode.NOT_ENOUGH_REPLICAS,
                   ErrorCode.REQUEST_TIMED_OUT: ErrorCode.NOT_ENOUGH_REPLICAS,
                   ErrorCode.INVALID_PRODUCER_ID_MAPPING: ErrorCode.INVALID_TXN_STATE,
                   ErrorCode.PRODUCER_FENCED: ErrorCode.INVALID_PRODUCER_EPOCH}


def on_loop(f: concurrent.futures.Future) -> asyncio.Future[Any]:
    """An asyncio future of the running loop that completes with ``f``: ``asyncio.wrap_future``, except
    that a completion made on the loop's own thread (an acks=all produce acknowledged by a follower
    fetch handled there) is copied at once, not through the loop's self-pipe and a loop turn."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Any] = loop.create_future()
    loop_thread = threading.get_ident()

    def copy(done: concurrent.futures.Future) -> None:
        if out.done():
            return
        if done.cancelled():
            out.cancel()
            return
        exc = done.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(done.result())

    f.add_done_callback(lambda done: call_on_loop(loop, loop_thread, copy, done))
    return out


def _observe(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


def _produce_error_all(req: broker_pb2.ProduceRequest, code: int, message: str) -> broker_pb2.ProduceResponse:
    resp = broker_pb2.ProduceResponse()
    for pd in req.partitions:
        resp.partitions.add(topic=pd.topic, partition=pd.partition, error_code=code, error_message=message,
                            base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                            current_leader=common_pb2.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1))
    return resp


def add_to_server(service: BrokerService, server: grpc.aio.Server) -> None:
    """The generated ``add_BrokerServiceServicer_to_server``, except that the methods answering a FetchResponse are
    served by their ``*_over_grpc`` forms: an answer may be a FetchAnswer, or its bytes joined off the loop."""
    bytes_apart.add_service(server, broker_pb2.DESCRIPTOR.services_by_name["BrokerService"], service, {
        "Fetch": service.fetch_over_grpc, "FetchStream": service.fetch_stream_over_grpc,
        "ReplicaFetch": service.replica_fetch_over_grpc})


async def _for_grpc(answers: AsyncIterator[Any], run: Callable[[Callable[[], bytes]], Awaitable[bytes]]
                    ) -> AsyncIterator[Any]:
    """A stream's answers as gRPC takes them (``bytes_apart.for_grpc``, a long one joined on ``run``'s thread)."""
    async with contextlib.aclosing(answers):  # type: ignore[type-var]  # an async generator
        async for answer in answers:
            wire = await bytes_apart.for_grpc(answer, run)
            del answer  # joined: its records go now, not once gRPC has written the bytes out
            yield wire


def _grpc_sized(request: broker_pb2.FetchRequest) -> broker_pb2.FetchRequest:
    """A consumer's fetch on the gRPC port asks for at most GRPC_FETCH_ANSWER_MAX_BYTES (a follower's is bounded by
    replica.fetch.response.max.bytes), and waits for at most half of it: whole batches rarely fill the bound, and a
    min_bytes the answer cannot reach would wait out max_wait_ms however much there is to read."""
    if request.replica_id < 0:
        request.max_bytes = min(request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES,
                                GRPC_FETCH_ANSWER_MAX_BYTES)
        request.min_bytes = min(request.min_bytes, GRPC_FETCH_ANSWER_MAX_BYTES // 2)
    return request


def _sent(response: FetchAnswer | broker_pb2.FetchResponse | None) -> FetchAnswer | broker_pb2.FetchResponse:
    assert response is not None, "a gRPC stream's session has no send_now"
    return response


def _fetch_refused(req: broker_pb2.FetchRequest, error: errors.BrookError) -> broker_pb2.FetchResponse:
    """A Fetch refused whole: ``error`` for each partition it names, once (as every Fetch answer names them:
    ``one_entry_per_partition``; a refusal echoed a partition named twice twice, found by ``make fuzz``)."""
    return _partition_errors(broker_pb2.FetchResponse(), one_entry_per_partition(req).partitions, error,
                             high_watermark=-1, log_start_offset=-1, log_end_offset=-1, last_stable_offset=-1)


def _fetch_error_all(req: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
    return _fetch_refused(req, errors.error_for(ErrorCode.UNKNOWN_SERVER_ERROR, "internal error"))


def _without_topics(req: Any, denied: set[str]) -> Any:
    """A copy of a partition-list request without the denied topics' partitions (the request itself if none)."""
    if not denied:
        return req
    out = type(req)()
    out.CopyFrom(req)
    del out.partitions[:]
    out.partitions.extend(p for p in req.partitions if p.topic not in denied)
    return out


def _partition_errors(resp: Any, partitions: Any, error: errors.BrookError, **fields: int) -> Any:
    for p in partitions:
        resp.partitions.add(topic=p.topic, partition=p.partition, error_code=error.code,
                            error_message=error.message, **fields)
    return resp
