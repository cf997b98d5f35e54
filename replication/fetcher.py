"""Follower side of replication: one ReplicaFetcher thread per source (leader) broker.

Each fetcher sends one Fetch for all the partitions it follows from that broker, from
each partition's log end offset, with the partition's last epoch (KIP-320). The leader
answers with whole batches (appended as they came, offsets already assigned), its high
watermark, or a *diverging epoch* when this replica's log forked from the leader's —
then the replica truncates to the end of the last epoch both share before fetching on
(KIP-101/279). Out-of-range answers truncate to the leader's log end or restart the log
at the leader's log start.

Fetches go over one ``ReplicaFetch`` stream per fetcher (a fetch session: a message costs the
leader about half of what a unary call does), opened again after any failure; a leader that does
not know the stream (an older version, mid-upgrade) gets unary ``Fetch`` calls instead. A fetch
gets no answer for longer than ``max_wait_ms`` + 10 s (a stopped leader) cancels the stream.

Every fetcher of a broker runs as a task on the broker's event loop over grpc.aio: a response is
processed and the next request written on that loop, without the hand-offs to gRPC's
request-iterator and channel-spin threads that a blocking stream costs on each round trip (an
acks=all write waits for one). Only what cannot hold the loop for long is applied there: plain
appends of up to ``LOOP_PROCESS_MAX_BYTES`` to a log whose lock is free and that needs no roll or
flush; the rest (larger responses, truncations, busy logs) goes to an executor thread. On ``SASL_*`` the fetcher attaches its SCRAM session token (client/sasl.py)
to each call itself, and a session that cannot authenticate is a failed fetch to back off from.

A leader that registered a replication listener (broker/replication_listener.py) is fetched from
there, as length-prefixed frames over one connection. A follower that cannot reach that port (a
firewall or NetworkPolicy that opens only the broker port, a wrong advertised address) would never
replicate and leave the ISR: after ``LISTENER_FAILURES_TO_FALL_BACK`` framed sessions in a row fail
before their first answer it tries the gRPC stream; once that answers and the listener still cannot
be reached, it logs one WARNING and fetches over gRPC, trying the listener again (a connection opened
beside the stream, so a port that drops packets stalls nothing) every ``LISTENER_RETRY_S``. A leader
that is down fails on both: the fetcher goes back to its listener after the usual backoff, logging
nothing more than a failed fetch, so a restarting leader is not taken for an unreachable listener.

A partition added (a new topic, a new leader or leader epoch) while the fetch in flight does not
carry it cuts that fetch short: the stream is cancelled and opened again at once, so the new
partition's first acks=all writes wait for one fetch round trip, not for the leader's long poll
(``replica.fetch.wait.max.ms``) to run out. Kafka's fetcher threads leave the poll running.

Role changes remove a partition from its fetcher *before* the partition changes role;
responses are processed under the fetcher's lock (a thread lock: the metadata thread takes it
too), so once ``remove_partitions`` returns no fetcher will append to that log again. No code
waits for the fetch loop while holding a fetcher's lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from client import sasl
from client.security import SecurityConfig, make_aio_channel
from metadata_quorum.cluster_configs import MAX_MESSAGE_BYTES_LIMIT
from proto import broker_pb2, broker_pb2_grpc, errors
from proto.errors import ErrorCode
from replication import isr as isr_rules
from replication.partition import Partition
from replication.throttle import ReplicationThrottle
from storage.log import WouldBlock

log = logging.getLogger(__name__)

# Just added (a new topic, a leader change), a partition is often fetched before its leader has applied
# the same metadata: it answers one of these. The first QUICK_RETRIES of them back off a quarter of
# replica.fetch.backoff.ms, as UNKNOWN_LEADER_EPOCH always does; later ones the whole of it.
_LEADER_BEHIND = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
QUICK_RETRIES = 10

_RETRY_LATER = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.REPLICA_NOT_AVAILABLE,
}


@dataclass(slots=True)
class FetcherConfig:
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 * 1024 * 1024
    partition_max_bytes: int = 1024 * 1024
    backoff_ms: int = 200
    # A fetch unanswered for max_wait_ms + this is given up (its stream cancelled and opened again).
    response_slack_ms: int = 10_000
    max_truncation_rounds: int = 64  # bound on repeated divergence answers per partition
    # How this broker reaches the leaders' inter-broker listener (its own node certificate on SSL).
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Shared by every fetcher of the broker: the copy rate of partitions not in sync here.
    throttle: ReplicationThrottle = field(default_factory=ReplicationThrottle)


T = TypeVar("T")

# A response with more record bytes than this is appended on an executor thread, not on the event loop.
# A follower has one fetch in flight per leader, so a hop to a thread and back costs every round trip:
# at full speed the answers carry 180-480 KB (p10-p90) and a 64 KiB bound cost ~15% of the acks=all
# throughput. Appending 1 MiB to the page cache holds the loop for well under a millisecond; larger
# answers come when a follower catches up.
LOOP_PROCESS_MAX_BYTES = 1024 * 1024
# The replication listener's framing (broker/replication_listener.py): what a follower sends first, then each
# message's 4-byte big-endian length.
REPLICATION_MAGIC = b"BRF1"
REPLICATION_FRAME = struct.Struct(">I")
CONNECT_TIMEOUT_S = 10.0
# Framed sessions with a leader's replication listener that end before their first answer (the connection
# refused, a failed TLS handshake, closed unanswered), in a row, after which a fetcher tries the leader's gRPC
# ReplicaFetch stream. One may be a leader restarting; a session that answered and then broke (the leader
# stopped) is not counted: it is opened again as before. A connection that timed out counts as all of them.
LISTENER_FAILURES_TO_FALL_BACK = 2
# How long a fetcher that fell back stays on the gRPC stream before it tries the listener again. A try is a
# connection opened (and closed) beside the stream, so an unreachable port costs no fetch; the stream's
# p99 is a few ms worse than the listener's (README, "The replication listener").
LISTENER_RETRY_S = 60.0
SHUTDOWN_WAIT_S = 5.0
# Room in a fetch answer for what is not records: partition entries, errors, the protobuf framing.
ANSWER_OVERHEAD_BYTES = 4 * 1024 * 1024


def receive_max_bytes(c: FetcherConfig) -> int:
    """The largest answer a fetcher takes from a leader. The leader answers at most ``max_bytes`` of records,
    except that the first batch of its answer goes whole whatever its size (as in Kafka, or a follower behind
    a batch larger than replica.fetch.response.max.bytes would never get past it), and a leader stores batches
    of up to MAX_MESSAGE_BYTES_LIMIT (the bound of max.message.bytes). With the old bound, ``max_bytes`` +
    4 MiB, a 60 MiB batch the leader had accepted was refused by every follower's gRPC (RESOURCE_EXHAUSTED) at
    each retry: the followers left the ISR and never came back (found by experiment)."""
    return max(c.max_bytes, MAX_MESSAGE_BYTES_LIMIT) + ANSWER_OVERHEAD_BYTES


class _FetchLoop:
    """The event loop the fetchers of a broker run on: the broker's own (its gRPC server's: grpc.aio
    completes every call of a process on the loop that started it, and hands the events of calls
    made on another loop over to that one), or, without one (tests), a loop in a thread of its own."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._owned = loop is None
        self.loop = loop if loop is not None else asyncio.new_event_loop()
        self._stopped = False
        self._thread: threading.Thread | None = None
        if self._owned:
            self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
            self._thread.start()

    def on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:  # no loop runs in this thread
            return False

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._stopped:
            coro.close()
            raise RuntimeError("the replica fetch loop has stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the loop: at once on its own thread, else soon; nothing once it is closed."""
        if self.on_loop():
            fn()
            return
        with contextlib.suppress(RuntimeError):  # closed: nothing runs there any more
            self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        """Stop and close the loop if it is this manager's own (the broker's stops with the broker)."""
        if self._stopped:
            return
        self._stopped = True
        if not self._owned or self._thread is None:
            return
        with contextlib.suppress(Exception):  # threads the loop's executor still runs are left to end
            asyncio.run_coroutine_threadsafe(self.loop.shutdown_default_executor(), self.loop).result(5)
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class _Session:
    """A fetch session with one leader: ``fetch`` sends a request and waits for its response.

    Only the fetcher's task calls ``fetch``; ``cancel`` may come from any thread (the watchdog,
    ``add``, shutdown) and makes a waiting ``fetch`` raise ``_SessionEnded``: it ends the transport
    (``_end_transport``) and cancels the task's wait itself.
    """

    def __init__(self, fetch_loop: _FetchLoop, token: str = "") -> None:
        self._fetch_loop = fetch_loop
        self.token = token  # the SCRAM session token the stream opened with ("" without SASL)
        self.opened_at = time.monotonic()
        self.waiting_since: float | None = None  # monotonic time of the unanswered request
        self.interrupted = False  # cancelled to send a request with more partitions: no failure
        self.answered = False  # a response arrived on it: the transport works (set by the fetcher)
        # The leader keeps this session's partitions (it said so in an answer): requests carry changes only.
        self.incremental = False
        self.sent: dict[tuple[str, int], _Want] = {}  # each partition's fetch as the leader has it
        self._ended = False  # cancelled; set on the loop
        self._waiter: asyncio.Task[Any] | None = None  # the task waiting in fetch(); on the loop

    def _ended_by_cancel(self) -> _SessionEnded:
        """In ``fetch``, on CancelledError: the session's own cancel ends here (re-raise if it was not)."""
        if self._waiter is not None:
            self._waiter.uncancel()
        return _SessionEnded("the session was cancelled")

    def cancel(self) -> None:
        self._fetch_loop.call_soon(self._cancel)

    def _cancel(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._end_transport()
        if self._waiter is not None:
            self._waiter.cancel()

    def _end_transport(self) -> None:
        raise NotImplementedError

    def interrupt(self) -> None:
        self.interrupted = True
        self.cancel()


class _FetchSession(_Session):
    """One ReplicaFetch stream. Cancelling it cancels the call and the task's wait itself, since
    grpc.aio leaves a ``write`` waiting for ever on a call cancelled before its headers went out."""

    def __init__(self, stub: broker_pb2_grpc.BrokerServiceStub, fetch_loop: _FetchLoop,
                 metadata: tuple[tuple[str, str], ...] | None, token: str) -> None:
        super().__init__(fetch_loop, token)
        self._call = stub.ReplicaFetch(metadata=metadata)

    async def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        if self._ended:
            raise _SessionEnded("the stream was cancelled")
        self.waiting_since = time.monotonic()
        self._waiter = asyncio.current_task()
        try:
            await self._call.write(request)
            response = await self._call.read()
        except asyncio.InvalidStateError:
            # The call ended before our write: cancelled by us, or the leader refused the stream on
            # its metadata (e.g. an unknown SASL session). grpc.aio says only "already finished"; the
            # call's status says why, and the fetcher acts on it as on a failed read.
            if self._ended:
                raise _SessionEnded("the stream was cancelled") from None
            raise await self._ended_error() from None
        except asyncio.CancelledError:
            if not self._ended:
                raise  # the fetcher's task itself is being cancelled
            raise self._ended_by_cancel() from None
        finally:
            self._waiter = None
            self.waiting_since = None
        if response is grpc.aio.EOF:  # the leader ended the stream (it is stopping)
            raise _SessionEnded("the leader ended the stream")
        return response

    async def _ended_error(self) -> Exception:
        call = self._call
        code = await call.code()
        if code == grpc.StatusCode.OK:
            return _SessionEnded("the leader ended the stream")
        return grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                    await call.details(), await call.debug_error_string())

    def _end_transport(self) -> None:
        self._call.cancel()


class _SessionEnded(Exception):
    pass


def _describe(e: BaseException) -> str:
    """An exception for a log line: its status on gRPC, else its type and message (a bare TimeoutError
    says nothing by itself)."""
    if isinstance(e, grpc.RpcError):
        return str(e.code())
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class _FramedFetchSession(_Session):
    """One connection to the leader's replication listener (broker/replication_listener.py): the same
    requests and answers as a ReplicaFetch stream, as length-prefixed frames that the event loop reads off
    the socket itself. The interface of ``_FetchSession``; the connection is opened by the first ``fetch``."""

    def __init__(self, address: str, ssl_context: Any, fetch_loop: _FetchLoop, max_response_bytes: int) -> None:
        super().__init__(fetch_loop)
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._ssl_context = ssl_context
        self._max_response_bytes = max_response_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            self._reader, self._writer = await asyncio.open_connection(
                self._host, self._port, ssl=self._ssl_context,
                server_hostname=self._host if self._ssl_context is not None else None,
                ssl_handshake_timeout=CONNECT_TIMEOUT_S if self._ssl_context is not None else None)
        self._writer.write(REPLICATION_MAGIC)

    async def probe(self) -> None:
        """Open the connection (TLS handshake included) and close it: raises as ``fetch`` would if the
        listener cannot be reached. The leader takes a connection closed before a frame for a follower gone."""
        try:
            await self._open()
        finally:
            self._cancel()  # on the loop: at once

    async def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        if self._ended:
            raise _SessionEnded("the connection was closed")
        self.waiting_since = time.monotonic()
        self._waiter = asyncio.current_task()
        try:
            if self._writer is None:
                await self._open()
            reader, writer = self._reader, self._writer
            assert reader is not None and writer is not None
            data = request.SerializeToString()
            writer.write(REPLICATION_FRAME.pack(len(data)) + data)
            await writer.drain()
            (size,) = REPLICATION_FRAME.unpack(await reader.readexactly(REPLICATION_FRAME.size))
            if size > self._max_response_bytes:
                raise _SessionEnded(f"the leader sent a {size}-byte answer (at most {self._max_response_bytes})")
            body = await reader.readexactly(size)
        except asyncio.CancelledError:
            if not self._ended:
                raise  # the fetcher's task itself is being cancelled
            raise self._ended_by_cancel() from None
        except asyncio.IncompleteReadError:
            raise _SessionEnded("the leader closed the connection") from None
        finally:
            self._waiter = None
            self.waiting_since = None
        try:
            return broker_pb2.FetchResponse.FromString(body)
        except DecodeError as e:
            raise _SessionEnded(f"the leader's answer is not a FetchResponse ({e})") from None

    def _end_transport(self) -> None:
        if self._writer is not None:
            self._writer.transport.abort()


# What a fetch asks of one partition: (fetch_offset, partition_max_bytes, current_leader_epoch,
# last_fetched_epoch, log_start_offset), the FetchPartition fields after topic and partition.
_Want = tuple[int, int, int, int, int]


@dataclass(slots=True)
class _Wanted:
    """The next fetch: the partitions ready to fetch and how long the leader may hold it."""
    parts: dict[tuple[str, int], _Want]
    max_wait_ms: int


class _CutShort(Exception):
    """A partition was added while the request was being sent: it is built again with the partition."""


# How often a fetch rebuilds every partition's part from its log, not only those it processed since.
WANTS_REFRESH_S = 1.0

# A stream keeps the credentials it opened with (a SCRAM session token ages): it is opened anew
# after this long, and at once when the leader refuses it as unauthorized.
STREAM_MAX_AGE_S = 60.0
_AUTH_REFUSALS = {ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.SASL_AUTHENTICATION_FAILED}


@dataclass(slots=True)
class FetcherStats:
    """Counters of a broker's fetchers for broker/metrics.py; changed on the fetch loop only."""
    # Times a fetcher went over to the gRPC stream because a leader's replication listener could not be
    # reached while its gRPC port answered (once per episode: not again at each failed retry).
    listener_fallbacks_total: int = 0


@dataclass(slots=True)
class _ListenerFallback:
    """Whether a fetcher of a leader with a replication listener fetches over the gRPC stream instead, and
    why. Changed on the fetch loop only (the fetcher's task and its probe); see ReplicaFetcher._fall_back."""
    failures: int = 0  # framed sessions in a row that ended before their first answer
    over_grpc: bool = False  # new sessions are gRPC streams
    # The gRPC stream answered while the listener could not be reached: the WARNING is out, and the stream
    # is kept (even through a leader's restart) until the listener is tried again and answers.
    confirmed: bool = False
    since: float = 0.0  # when confirmed (monotonic)
    retry_at: float = 0.0  # over gRPC: when the next answer on the stream starts a probe of the listener
    # A probe reached the listener: the next framed session must answer, or the fetcher falls back at once.
    back: bool = False
    probe: asyncio.Task[None] | None = None  # the connection to the listener being tried


@dataclass(slots=True)
class _FetchState:
    partition: Partition
    leader_epoch: int
    delayed_until_s: float = 0.0
    truncation_rounds: int = 0
    quick_retries: int = 0  # short backoffs taken for "not the leader (yet)" since the partition was added


class ReplicaFetcher:
    def __init__(self, local_id: int, source_id: int, address: str, broker_epoch: Callable[[], int],
                 config: FetcherConfig, fetch_loop: _FetchLoop,
                 on_storage_error: Callable[[Any, BaseException], object] | None = None, *,
                 replication_address: str = "", stats: FetcherStats | None = None,
                 on_high_watermark: Callable[[Partition], object] | None = None) -> None:
        self.local_id = local_id
        self._on_storage_error = on_storage_error
        # A partition's high watermark moved here: consumers reading from this follower (KIP-392) look again.
        self._on_high_watermark = on_high_watermark
        self.source_id = source_id
        self.address = address
        self._broker_epoch = broker_epoch
        self.config = config
        self._fetch_loop = fetch_loop
        self._lock = threading.Lock()
        self._states: dict[tuple[str, int], _FetchState] = {}
        self._stopped = False
        # Set on the loop when a partition is added or the fetcher stops: ends a backoff or idle wait.
        self._wake = asyncio.Event()
        self._failures = 0
        # Made on the loop by _run (a grpc.aio channel belongs to the loop that uses it).
        self._channel: grpc.aio.Channel | None = None
        self._stub: broker_pb2_grpc.BrokerServiceStub | None = None
        self._scram = sasl.session_for(address, config.security) if config.security.uses_sasl else None
        # The leader's replication listener (broker/replication_listener.py), which speaks to nodes by their
        # certificates (or the loopback trust) only: with SASL between the nodes, the gRPC stream it is.
        self.replication_address = replication_address if self._scram is None else ""
        self._ssl_context: Any = None  # made on first use (reads the node's PEM files)
        self._fallback = _ListenerFallback()  # the listener unreachable: the gRPC stream instead
        self._stats = stats if stats is not None else FetcherStats()
        self._unary_token = ""  # the SCRAM token of the unary fetch in flight
        self._session: _Session | None = None
        # (partition, leader epoch) of the fetch in flight, None between fetches; under _lock
        self._in_flight: dict[tuple[str, int], int] | None = None
        self._cut_short = False  # add() wants the request in flight rebuilt; under _lock
        self._next_ready_s = float("inf")  # when the first partition held back by _build_request is ready
        self._use_stream = True  # False once the leader answered UNIMPLEMENTED (an older version)
        # Each partition's fetch as last built, and the partitions it may have changed for since (a
        # response processed, added): a fetch rebuilds those only, and all of them once per
        # WANTS_REFRESH_S (a log start moved by this broker's retention). Under _lock.
        self._wants: dict[tuple[str, int], _Want] = {}
        self._changed: set[tuple[str, int]] = set()
        self._next_full_build_s = 0.0
        self._task = fetch_loop.submit(self._run())

    # ---- partition set (any thread) ----
    def add(self, partition: Partition, leader_epoch: int) -> None:
        with self._lock:
            self._states[partition.key] = _FetchState(partition, leader_epoch)
            self._changed.add(partition.key)
            # The fetch in flight may be parked at the leader for up to max_wait_ms without this partition.
            # The fetcher checks _cut_short under this lock after opening its stream and before sending:
            # a request either is not sent, or goes on the stream interrupted here.
            cut_short = self._in_flight is not None and self._in_flight.get(partition.key) != leader_epoch
            self._cut_short = self._cut_short or cut_short
            session = self._session
        self._fetch_loop.call_soon(self._wake.set)
        if cut_short and session is not None:
            log.debug("fetcher %d<-%d: %s-%d added at epoch %d; cutting the fetch in flight short",
                      self.local_id, self.source_id, partition.topic, partition.partition, leader_epoch)
            session.interrupt()

    def remove(self, keys: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            for k in keys:
                self._states.pop(k, None)
                self._wants.pop(k, None)

    def partition_count(self) -> int:
        with self._lock:
            return len(self._states)

    def shutdown(self) -> None:
        """Stop fetching; returns at once (never waits for the loop: the metadata thread calls it).
        The task closes its channel as it ends; ``done`` tells when."""
        with self._lock:
            self._stopped = True
            self._states.clear()
        self._fetch_loop.call_soon(self._wake.set)
        session = self._session
        if session is not None:
            session.cancel()

    @property
    def done(self) -> concurrent.futures.Future[None]:
        return self._task

    # ---- the fetch loop (the fetcher's task) ----
    async def _run(self) -> None:
        c = self.config
        self._channel = make_aio_channel(self.address, c.security, options=[
            ("grpc.max_receive_message_length", receive_max_bytes(c)),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            # a restarted leader is found again within a second, not after gRPC's default 2 min backoff
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ])
        self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)
        try:
            await self._fetch_until_stopped()
        finally:
            self._close_session()
            if self._fallback.probe is not None:
                self._fallback.probe.cancel()
            with contextlib.suppress(Exception):  # a loop being torn down; the channel goes with it
                await self._channel.close()
            if self._scram is not None:
                self._scram.close()

    async def _fetch_until_stopped(self) -> None:
        backoff_s = self.config.backoff_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._stopped:
                    return
                self._wake.clear()  # an add() from here on sets it again
                request, epochs = self._build_request()
                if request is not None:
                    self._in_flight = epochs
                    self._cut_short = False
            if request is None:
                # Until the first partition's backoff ends (a quarter backoff is shorter than backoff_s).
                await self._pause(min(backoff_s, max(0.001, self._next_ready_s - time.monotonic())))
                continue
            try:
                response = await self._send(request)
            except _CutShort:
                continue  # a partition was added before the request went out: build it again
            except Exception as e:  # the call failed, was cancelled, or SASL could not authenticate
                session = self._session
                interrupted = session is not None and session.interrupted
                with self._lock:
                    self._in_flight = None
                if self._scram is not None and isinstance(e, grpc.RpcError) and (
                        e.code() == grpc.StatusCode.UNAUTHENTICATED or (
                            e.code() == grpc.StatusCode.INTERNAL and isinstance(session, _FetchSession)
                            and not session.answered)):
                    # The leader does not know our SASL session (it restarted, or the session expired):
                    # the next call authenticates afresh. A stream the leader refuses that way can end
                    # INTERNAL here instead: grpc.aio reports a write that fails as the call ends as its
                    # own INTERNAL, over the status the leader sent (grpc/grpc#36066; seen 1 run in 25
                    # under load). Before its first answer, that is taken for a refusal too: at worst one
                    # more SCRAM exchange, where the same token would have been refused again a backoff later.
                    self._scram.invalidate(session.token if session is not None else self._unary_token)
                self._close_session()
                if self._stopped:
                    return
                if interrupted:
                    continue  # add() cut the long poll short for a new partition: fetch again at once
                if session is not None and not session.answered and self.replication_address:
                    self._unanswered(session, e)
                if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNIMPLEMENTED and self._use_stream:
                    log.info("fetcher %d<-%d: leader has no ReplicaFetch stream (an older version); "
                             "using unary fetches", self.local_id, self.source_id)
                    self._use_stream = False
                    continue
                self._failures += 1
                if self._failures == 1 or self._failures % 50 == 0:  # one line per outage, not 5 per second
                    expected = isinstance(e, (grpc.RpcError, _SessionEnded, errors.BrookError, OSError,
                                              asyncio.IncompleteReadError))
                    log.log(logging.INFO if expected else logging.WARNING,
                            "fetcher %d<-%d (%s): fetch failed (%d in a row): %s", self.local_id, self.source_id,
                            self.replication_address if isinstance(session, _FramedFetchSession) else self.address,
                            self._failures, e.code() if isinstance(e, grpc.RpcError) else repr(e),
                            exc_info=not expected)
                await self._pause(backoff_s)
                continue
            self._failures = 0
            rest: int | None = 0
            # Each read of a partition's ``records`` copies them out of the message: read once, here.
            records = [pr.records for pr in response.partitions]
            if sum(map(len, records)) <= LOOP_PROCESS_MAX_BYTES:
                rest = self._process_response(response, records, epochs, inline=True)
            if rest is not None:  # appended where blocking is allowed: large, or a log busy, rolling, flushing
                await loop.run_in_executor(None, self._process_response, response, records, epochs, rest)
            del records

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until a partition is added (or the fetcher stops)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    def _process_response(self, response: broker_pb2.FetchResponse, records: list[bytes],
                          epochs: dict[tuple[str, int], int], start: int = 0, *, inline: bool = False) -> int | None:
        """Apply the answers from partition ``start`` on, ``records`` each partition's (read out of the message). ``inline`` (on the event loop): only plain
        appends that need no wait, roll or flush; the index of the first other answer is returned, to be
        applied from there on an executor thread (None: all done)."""
        backoff_s = self.config.backoff_ms / 1000
        with self._lock:
            self._in_flight = None
            if self._stopped:
                return None
            partitions = response.partitions
            for i in range(start, len(partitions)):
                pr = partitions[i]
                key = (pr.topic, pr.partition)
                st = self._states.get(key)
                if st is None or epochs.get(key) != st.leader_epoch:
                    continue  # removed or re-added at another epoch while the request was out
                try:
                    if not inline:
                        self._process(st, pr, records[i])
                    elif pr.error_code != ErrorCode.NONE or pr.HasField("diverging_epoch"):
                        return i  # truncation, backoff bookkeeping: not the loop's work
                    else:
                        with st.partition.log.locked(blocking=False):
                            self._process(st, pr, records[i], blocking=False)
                except WouldBlock:
                    return i
                except errors.BrookError as e:
                    log.warning("fetcher %d<-%d: %s-%d: %s; backing off", self.local_id, self.source_id,
                                pr.topic, pr.partition, e)
                    st.delayed_until_s = time.monotonic() + backoff_s
                    self._storage_error(st, e)
                except Exception as e:
                    log.exception("fetcher %d<-%d: %s-%d: unexpected failure; backing off",
                                  self.local_id, self.source_id, pr.topic, pr.partition)
                    st.delayed_until_s = time.monotonic() + backoff_s
                    self._storage_error(st, e)
                self._changed.add(key)
        return None

    def _storage_error(self, st: _FetchState, exc: BaseException) -> None:
        """Tell the broker (its LogManager decides whether the log's disk failed)."""
        if self._on_storage_error is not None:
            self._on_storage_error(st.partition.log.dir, exc)

    async def _auth_metadata(self) -> tuple[tuple[tuple[str, str], ...] | None, str]:
        """The SASL session token to call with (as metadata), authenticating first on an executor thread."""
        if self._scram is None:
            return None, ""
        token = await asyncio.get_running_loop().run_in_executor(None, self._scram.token)
        return ((sasl.SESSION_METADATA_KEY, token),), token

    async def _send(self, wanted: _Wanted) -> broker_pb2.FetchResponse:
        assert self._stub is not None
        if not self._use_stream:
            metadata, self._unary_token = await self._auth_metadata()
            return await self._stub.Fetch(self._request(wanted, None), timeout=self.response_timeout_s(),
                                          metadata=metadata)
        fallback = self._fallback
        if self._session is not None and (time.monotonic() - self._session.opened_at > STREAM_MAX_AGE_S or (
                self.replication_address and not fallback.over_grpc and isinstance(self._session, _FetchSession))):
            self._close_session()  # aged, or a fallback stream while the listener is reachable again
        if self._session is None:
            if self.replication_address and not fallback.over_grpc:
                self._session = self._listener_session()
            else:
                metadata, token = await self._auth_metadata()
                self._session = _FetchSession(self._stub, self._fetch_loop, metadata, token)
        with self._lock:
            if self._cut_short:
                self._in_flight = None
                raise _CutShort
        session = self._session
        response = await session.fetch(self._request(wanted, session))
        if not session.answered:
            session.answered = True
            if isinstance(session, _FramedFetchSession):
                self._listener_answered()
        if fallback.over_grpc and fallback.probe is None and time.monotonic() >= fallback.retry_at:
            fallback.probe = asyncio.get_running_loop().create_task(self._probe_listener())
        if response.incremental:
            session.incremental = True
        if any(pr.error_code in _AUTH_REFUSALS or pr.error_code == ErrorCode.INVALID_REQUEST
               for pr in response.partitions):
            # Refused for who we are: open the stream again. (A session the leader does not know ends
            # the stream UNAUTHENTICATED instead, which drops the token: the next stream
            # authenticates afresh.) A request the leader found invalid may have left its view of the
            # fetch session other than ours: the next stream starts a new one with a full request.
            self._close_session()
        return response

    # ---- the replication listener or, when it cannot be reached, the gRPC stream (on the loop) ----
    def _listener_session(self) -> _FramedFetchSession:
        if self._ssl_context is None and self.config.security.uses_ssl:
            self._ssl_context = self.config.security.ssl_context()
        return _FramedFetchSession(self.replication_address, self._ssl_context, self._fetch_loop,
                                   receive_max_bytes(self.config))

    def _unanswered(self, session: _Session, error: BaseException) -> None:
        """``session`` ended before its first answer (not cut short by ``add``). Framed sessions that do so
        ``LISTENER_FAILURES_TO_FALL_BACK`` times in a row send the fetcher to the gRPC stream, unconfirmed:
        a stream that fails too before answering means the leader is down, and the listener is tried again
        after the usual backoff. Both pauses are the failed fetch's backoff: no faster flip-flop."""
        fb = self._fallback
        if isinstance(session, _FramedFetchSession):
            fb.failures += 1
            if isinstance(error, TimeoutError):
                # A connection (or TLS handshake) that timed out: the port drops packets. One such wait is enough;
                # a second would keep this follower from fetching for another CONNECT_TIMEOUT_S.
                fb.failures = max(fb.failures, LISTENER_FAILURES_TO_FALL_BACK)
            if fb.back:  # the listener took a connection but this session got no answer from it
                self._fall_back(_describe(error))
            elif fb.failures >= LISTENER_FAILURES_TO_FALL_BACK and not fb.over_grpc:
                fb.over_grpc, fb.retry_at = True, 0.0  # the stream's first answer probes the listener
                log.debug("fetcher %d<-%d: the replication listener at %s did not answer %d sessions in a row "
                          "(%s); trying the gRPC stream at %s", self.local_id, self.source_id,
                          self.replication_address, fb.failures, _describe(error), self.address)
        elif fb.over_grpc and not fb.confirmed:
            fb.over_grpc, fb.failures = False, 0

    def _listener_answered(self) -> None:
        """A framed session's first answer: the listener works (again)."""
        fb = self._fallback
        if fb.confirmed:
            log.info("fetcher %d<-%d: the replication listener at %s answers again; fetching there, not over the "
                     "gRPC stream at %s (after %.0f s on it)", self.local_id, self.source_id,
                     self.replication_address, self.address, time.monotonic() - fb.since)
        fb.failures, fb.confirmed, fb.back = 0, False, False

    async def _probe_listener(self) -> None:
        """Try the listener beside the gRPC stream that answers: reachable, the next session is framed
        again (and must answer); not, the fetcher stays on the stream for ``LISTENER_RETRY_S``."""
        fb = self._fallback
        try:
            await self._listener_session().probe()
        except Exception as e:  # refused, timed out, the TLS handshake failed
            self._fall_back(_describe(e))
        else:
            fb.over_grpc, fb.back, fb.failures = False, True, 0  # _send closes the stream between fetches
            log.debug("fetcher %d<-%d: the replication listener at %s takes connections; fetching there again",
                      self.local_id, self.source_id, self.replication_address)
        finally:
            fb.probe = None

    def _fall_back(self, error: str) -> None:
        """The leader's gRPC stream answers and its listener cannot be reached (or took a connection and did
        not answer): fetch over the stream for ``LISTENER_RETRY_S``. One WARNING per episode, until the
        listener answers again; later failed tries log at DEBUG."""
        fb = self._fallback
        now = time.monotonic()
        fb.over_grpc, fb.back, fb.retry_at = True, False, now + LISTENER_RETRY_S
        if fb.confirmed:
            log.debug("fetcher %d<-%d: the replication listener at %s still cannot be reached (%s); trying it "
                      "again in %g s", self.local_id, self.source_id, self.replication_address, error,
                      LISTENER_RETRY_S)
            return
        fb.confirmed, fb.since = True, now
        self._stats.listener_fallbacks_total += 1
        log.warning("fetcher %d<-%d: cannot fetch from leader %d's replication listener at %s (%s), but its gRPC "
                    "port answers: fetching over the ReplicaFetch stream at %s instead, trying the listener again "
                    "every %g s. Open the port between brokers or fix its advertised address.", self.local_id,
                    self.source_id, self.source_id, self.replication_address, error, self.address,
                    LISTENER_RETRY_S)

    def _request(self, wanted: _Wanted, session: _Session | None) -> broker_pb2.FetchRequest:
        """The FetchRequest of ``wanted``: every partition, or on an incremental stream only those whose
        fetch changed since the last request on it, and the ones it no longer carries as forgotten."""
        c = self.config
        req = broker_pb2.FetchRequest(replica_id=self.local_id, replica_epoch=self._broker_epoch(),
                                      max_wait_ms=wanted.max_wait_ms, min_bytes=c.min_bytes, max_bytes=c.max_bytes)
        parts = wanted.parts
        if session is not None:
            if session.incremental:
                req.incremental = True
                sent = session.sent
                parts = {k: w for k, w in parts.items() if sent.get(k) != w}
                req.forgotten.extend(broker_pb2.FetchForgotten(topic=k[0], partition=k[1])
                                     for k in sent.keys() - wanted.parts.keys())
            session.sent = wanted.parts  # built afresh for each fetch: nothing changes it after
        req.partitions.extend(
            broker_pb2.FetchPartition(topic=k[0], partition=k[1], fetch_offset=w[0], partition_max_bytes=w[1],
                                      current_leader_epoch=w[2], last_fetched_epoch=w[3], log_start_offset=w[4])
            for k, w in parts.items())
        return req

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.cancel()

    def response_timeout_s(self) -> float:
        """How long a fetch may go unanswered: the long poll plus slack for a loaded leader."""
        return (self.config.max_wait_ms + self.config.response_slack_ms) / 1000

    def cancel_if_overdue(self, now: float) -> bool:
        """The watchdog's check: cancel the stream whose request has waited past the timeout."""
        session = self._session
        since = session.waiting_since if session is not None else None
        if session is None or since is None or now - since <= self.response_timeout_s():
            return False
        log.warning("fetcher %d<-%d (%s): no answer for %.1f s; reopening the fetch stream", self.local_id,
                    self.source_id, self.replication_address if isinstance(session, _FramedFetchSession)
                    else self.address, now - since)
        session.cancel()
        return True

    def _build_request(self) -> tuple[_Wanted | None, dict[tuple[str, int], int]]:
        now = time.monotonic()
        parts: dict[tuple[str, int], _Want] = {}
        epochs: dict[tuple[str, int], int] = {}
        partition_max_bytes = self.config.partition_max_bytes
        wants, changed = self._wants, self._changed
        full = now >= self._next_full_build_s
        if full:
            self._next_full_build_s = now + WANTS_REFRESH_S
        next_ready_s = float("inf")
        throttle_wait_s = self.config.throttle.wait_s()
        held_back = []
        for key, st in self._states.items():
            if st.delayed_until_s > now:
                next_ready_s = min(next_ready_s, st.delayed_until_s)
                held_back.append(key)
                continue
            if throttle_wait_s > 0 and self.local_id not in st.partition.isr:
                next_ready_s = min(next_ready_s, now + throttle_wait_s)  # the copy throttle is in debt
                held_back.append(key)
                continue
            w = None if full or key in changed else wants.get(key)
            if w is None:
                lg = st.partition.log
                w = wants[key] = (lg.log_end_offset, partition_max_bytes, st.leader_epoch, lg.latest_epoch,
                                  lg.log_start_offset)
            parts[key] = w
            epochs[key] = st.leader_epoch
        self._changed = changed & set(held_back)  # built when they are fetched again
        self._next_ready_s = next_ready_s
        if not parts:
            return None, epochs
        # A partition in backoff is not in this request: do not let the long poll outlast its
        # backoff, or it would sit out a whole max_wait (e.g. just after a leader change).
        max_wait_ms = min(self.config.max_wait_ms, max(0, int((next_ready_s - now) * 1000) + 1)) \
            if next_ready_s != float("inf") else self.config.max_wait_ms
        return _Wanted(parts, max_wait_ms), epochs

    def _process(self, st: _FetchState, pr: broker_pb2.FetchPartitionResponse, records: bytes,
                 blocking: bool = True) -> None:
        """Apply one partition's answer; ``records`` are its records (``pr``'s, read out once)."""
        lg = st.partition.log
        if pr.error_code == ErrorCode.NONE:
            if pr.HasField("diverging_epoch"):
                self._truncate_diverged(st, pr.diverging_epoch.epoch, pr.diverging_epoch.end_offset)
                return
            if records:
                lg.append_as_follower(records, blocking=blocking)  # WouldBlock first: nothing changed
                if self.local_id not in st.partition.isr:
                    self.config.throttle.charge(len(records))  # _build_request holds it back while in debt
            st.truncation_rounds = 0
            before = lg.high_watermark
            if lg.update_high_watermark(min(pr.high_watermark, lg.log_end_offset)) > before and \
                    self._on_high_watermark is not None:
                self._on_high_watermark(st.partition)
            if pr.log_start_offset > lg.log_start_offset:
                # The leader's log start moved (DeleteRecords or its retention): records before it are
                # gone for every reader, so this replica must not serve them after a failover either.
                lg.set_log_start_offset(min(pr.log_start_offset, lg.high_watermark))
            return
        if pr.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._handle_out_of_range(st, pr)
            return
        backoff_ms = self.config.backoff_ms
        if pr.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH:
            backoff_ms = max(10, backoff_ms // 4)  # the leader is about to apply the same metadata
        elif pr.error_code in _LEADER_BEHIND and st.quick_retries < QUICK_RETRIES:
            st.quick_retries += 1
            backoff_ms = max(10, backoff_ms // 4)
        elif pr.error_code not in _RETRY_LATER:
            log.warning("fetcher %d<-%d: %s-%d: %s %s", self.local_id, self.source_id, pr.topic, pr.partition,
                        errors.code_name(pr.error_code), pr.error_message)
        st.delayed_until_s = time.monotonic() + backoff_ms / 1000

    def _truncate_diverged(self, st: _FetchState, epoch: int, end_offset: int) -> None:
        lg = st.partition.log
        st.truncation_rounds += 1
        if st.truncation_rounds > self.config.max_truncation_rounds:
            raise errors.KafkaStorageError(f"no convergence after {self.config.max_truncation_rounds} truncations")
        target = isr_rules.truncation_offset(epoch, end_offset, lg.end_offset_for_epoch(epoch) if epoch >= 0
                                             else (-1, -1), lg.log_end_offset, lg.high_watermark)
        log.info("%s-%d: diverged from leader %d at epoch %d end %d; truncating %d -> %d",
                 st.partition.topic, st.partition.partition, self.source_id, epoch, end_offset,
                 lg.log_end_offset, target)
        if target < lg.log_end_offset:
            lg.truncate_to(target)
        elif lg.latest_epoch > epoch:
            # No data to cut, but our epoch cache holds epochs past the shared history (a
            # leadership that appended nothing): drop them so the next fetch reports the shared one.
            lg.epoch_cache.truncate_from_end(target)

    def _handle_out_of_range(self, st: _FetchState, pr: broker_pb2.FetchPartitionResponse) -> None:
        lg = st.partition.log
        leo = lg.log_end_offset
        if 0 <= pr.log_end_offset < leo:
            log.warning("%s-%d: our end %d is past leader %d's end %d; truncating", pr.topic, pr.partition,
                        leo, self.source_id, pr.log_end_offset)
            lg.truncate_to(pr.log_end_offset)
        elif pr.log_start_offset > leo:
            log.warning("%s-%d: our end %d is before leader %d's log start %d; restarting the log there",
                        pr.topic, pr.partition, leo, self.source_id, pr.log_start_offset)
            lg.truncate_fully_and_start_at(pr.log_start_offset)
        else:
            st.delayed_until_s = time.monotonic() + self.config.backoff_ms / 1000


class ReplicaFetcherManager:
    """Owns the fetchers, one per source broker endpoint, and the loop they run on."""

    def __init__(self, local_id: int, broker_epoch: Callable[[], int], config: FetcherConfig | None = None,
                 *, loop: asyncio.AbstractEventLoop | None = None,
                 on_storage_error: Callable[[Any, BaseException], object] | None = None,
                 on_high_watermark: Callable[[Partition], object] | None = None) -> None:
        self.local_id = local_id
        self._broker_epoch = broker_epoch
        self.config = config or FetcherConfig()
        # (log dir, error) of a failed append or truncation: the broker's LogManager.dir_failed.
        self.on_storage_error = on_storage_error
        self.on_high_watermark = on_high_watermark  # see ReplicaFetcher
        self._lock = threading.Lock()
        self._fetchers: dict[tuple[int, str, str], ReplicaFetcher] = {}
        self._where: dict[tuple[str, int], tuple[int, str, str]] = {}
        self._fetch_loop = _FetchLoop(f"replica-fetch-loop-{local_id}", loop)
        self.stats = FetcherStats()  # shared by the fetchers: a closed fetcher's counts stay
        # One thread for every fetcher's response deadline (a stream has none of its own).
        self._stopped = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=f"replica-fetch-watchdog-{local_id}",
                                          daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._stopped.wait(1.0):
            with self._lock:
                fetchers = list(self._fetchers.values())
            now = time.monotonic()
            for f in fetchers:
                f.cancel_if_overdue(now)

    def add_partition(self, partition: Partition, leader_id: int, address: str, leader_epoch: int, *,
                      replication_address: str = "") -> None:
        """Follow ``partition`` from broker ``leader_id``: at its gRPC ``address``, or at its replication
        listener's ``replication_address`` when it registered one."""
        with self._lock:
            if self._stopped.is_set():
                log.debug("fetchers of %d stopped: not following %s-%d", self.local_id, *partition.key)
                return
            fkey = (leader_id, address, replication_address)
            old = self._where.get(partition.key)
            if old is not None and old != fkey:
                self._fetchers[old].remove([partition.key])
            f = self._fetchers.get(fkey)
            if f is None:
                f = ReplicaFetcher(self.local_id, leader_id, address, self._broker_epoch, self.config,
                                   self._fetch_loop, self.on_storage_error, replication_address=replication_address,
                                   stats=self.stats, on_high_watermark=self.on_high_watermark)
                self._fetchers[fkey] = f
            f.add(partition, leader_epoch)
            self._where[partition.key] = fkey
        self._close_idle()

    def remove_partitions(self, keys: Iterable[tuple[str, int]]) -> None:
        with self._lock:
            for k in keys:
                fkey = self._where.pop(k, None)
                if fkey is not None:
                    self._fetchers[fkey].remove([k])
        self._close_idle()

    def _close_idle(self) -> None:
        with self._lock:
            idle = [k for k, f in self._fetchers.items() if f.partition_count() == 0]
            closing = [self._fetchers.pop(k) for k in idle]
        for f in closing:
            f.shutdown()

    def fetcher_count(self) -> int:
        with self._lock:
            return len(self._fetchers)

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._where.clear()
        for f in fetchers:
            f.shutdown()
        if not self._fetch_loop.on_loop():  # their tasks end within a loop turn or two, closing their channels
            concurrent.futures.wait([f.done for f in fetchers], timeout=SHUTDOWN_WAIT_S)
        self._fetch_loop.stop()
