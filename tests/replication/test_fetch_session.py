"""The follower's fetch session: one ReplicaFetch stream per leader, with the unary Fetch as fallback.

A real ReplicaFetcher (its task on the fetch loop, its gRPC channel) follows a real Partition from a stand-in
leader: a gRPC server on a real socket that serves one batch. Shown here: the data arrives over
the stream; a leader without the stream (an older version) is fetched from with unary calls;
a leader that stops answering has its stream cancelled by the watchdog and opened again; a
stream the leader refuses as unauthorized (a SCRAM session that expired while the stream was
open) is opened again, with the credentials of that moment. On SASL the fetcher attaches its
session token to each stream itself and authenticates afresh when a leader ends a stream
UNAUTHENTICATED. A response with many records is appended on an executor thread, a small one
on the fetch loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from waiting import wait_for

from client import sasl
from client.security import SecurityConfig
from proto import broker_pb2, broker_pb2_grpc
from proto.errors import ErrorCode
from replication import fetcher as fetcher_module
from replication.fetcher import FetcherConfig, ReplicaFetcherManager
from replication.partition import Partition
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder


def leader_batch() -> bytes:
    b = RecordBatchBuilder(partition_leader_epoch=0, base_offset=0)
    b.append(1_700_000_000_000, None, b"replicated")
    return b.build()


BATCH = leader_batch()


def answer(req: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
    fp = req.partitions[0]
    return broker_pb2.FetchResponse(partitions=[broker_pb2.FetchPartitionResponse(
        topic=fp.topic, partition=fp.partition, high_watermark=1, log_start_offset=0, log_end_offset=1,
        records=BATCH if fp.fetch_offset == 0 else b"")])


class Leader(broker_pb2_grpc.BrokerServiceServicer):
    """Serves BATCH at offset 0; the first ``silent_streams`` streams never answer (a stopped leader),
    the first ``refused_streams`` answer CLUSTER_AUTHORIZATION_FAILED."""

    def __init__(self, *, stream: bool, silent_streams: int = 0, refused_streams: int = 0) -> None:
        self.stream = stream
        self.silent_streams = silent_streams
        self.refused_streams = refused_streams
        self.unary_calls = 0
        self.streams = 0
        self.stream_messages = 0
        self.lock = threading.Lock()

    def Fetch(self, request: broker_pb2.FetchRequest, context: Any) -> broker_pb2.FetchResponse:
        with self.lock:
            self.unary_calls += 1
        if request.partitions[0].fetch_offset > 0:
            time.sleep(0.05)  # a long poll with nothing new
        return answer(request)

    def ReplicaFetch(self, request_iterator: Iterator[broker_pb2.FetchRequest],
                     context: Any) -> Iterator[broker_pb2.FetchResponse]:
        if not self.stream:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        with self.lock:
            self.streams += 1
            silent = self.streams <= self.silent_streams
            refused = self.streams <= self.refused_streams
        for request in request_iterator:
            with self.lock:
                self.stream_messages += 1
            if silent:
                while context.is_active():
                    time.sleep(0.02)
                return
            if refused:
                fp = request.partitions[0]
                yield broker_pb2.FetchResponse(partitions=[broker_pb2.FetchPartitionResponse(
                    topic=fp.topic, partition=fp.partition, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    error_message="not a node", high_watermark=-1, log_start_offset=-1, log_end_offset=-1)])
                continue
            if request.partitions[0].fetch_offset > 0:
                time.sleep(0.05)
            yield answer(request)


def follow(leader: broker_pb2_grpc.BrokerServiceServicer, p: Partition, **config: int) -> ReplicaFetcherManager:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    manager = ReplicaFetcherManager(2, lambda: 1, FetcherConfig(**{"max_wait_ms": 100, "backoff_ms": 50, **config}))
    manager.add_partition(p, 1, f"127.0.0.1:{port}", 0)
    manager.server = server  # type: ignore[attr-defined]
    return manager


def stop(manager: ReplicaFetcherManager) -> None:
    manager.shutdown()
    manager.server.stop(0)  # type: ignore[attr-defined]


def test_the_follower_fetches_over_one_stream(follower: Partition) -> None:
    leader = Leader(stream=True)
    manager = follow(leader, follower)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1 and follower.log.high_watermark == 1, 10,
                 "the batch replicated over the stream")
        wait_for(lambda: leader.stream_messages >= 3, 10, "later fetches on the same stream")
    finally:
        stop(manager)
    assert leader.unary_calls == 0 and leader.streams == 1, vars(leader)


def test_a_leader_without_the_stream_gets_unary_fetches(follower: Partition) -> None:
    leader = Leader(stream=False)
    manager = follow(leader, follower)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 10, "the batch replicated by unary fetches")
        wait_for(lambda: leader.unary_calls >= 3, 10, "more unary fetches")
    finally:
        stop(manager)
    assert leader.streams == 0 and leader.stream_messages == 0, vars(leader)


def test_a_silent_leader_has_its_stream_cancelled_and_reopened(follower: Partition) -> None:
    leader = Leader(stream=True, silent_streams=1)
    manager = follow(leader, follower, response_slack_ms=300)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 15,
                 "the batch, over a second stream once the watchdog gave up on the first")
    finally:
        stop(manager)
    assert leader.streams >= 2 and leader.unary_calls == 0, vars(leader)


def test_a_stream_refused_as_unauthorized_is_opened_again(follower: Partition) -> None:
    leader = Leader(stream=True, refused_streams=1)
    manager = follow(leader, follower)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 15, "the batch, over a new stream after the refusal")
    finally:
        stop(manager)
    assert leader.streams >= 2 and leader.unary_calls == 0, vars(leader)


class ParkingLeader(broker_pb2_grpc.BrokerServiceServicer):
    """Serves BATCH at offset 0 of any partition; a fetch with nothing new parks, as a real leader's
    long poll does, until the follower cancels it or ``park_s`` passes. The first ``refusals`` fetches
    are answered NOT_LEADER_OR_FOLLOWER (a leader that has not applied the metadata making it one)."""

    def __init__(self, park_s: float, refusals: int = 0) -> None:
        self.park_s = park_s
        self.refusals = refusals
        self.streams = 0
        self.parked = 0  # fetches parked so far
        self.lock = threading.Lock()

    def ReplicaFetch(self, request_iterator: Iterator[broker_pb2.FetchRequest],
                     context: Any) -> Iterator[broker_pb2.FetchResponse]:
        with self.lock:
            self.streams += 1
        ended = threading.Event()
        context.add_callback(ended.set)  # the follower cancelled the stream (or it ended)
        for request in request_iterator:
            with self.lock:
                refuse = self.refusals > 0
                self.refusals -= refuse
            if refuse:
                yield broker_pb2.FetchResponse(partitions=[broker_pb2.FetchPartitionResponse(
                    topic=fp.topic, partition=fp.partition, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    high_watermark=-1, log_start_offset=-1, log_end_offset=-1) for fp in request.partitions])
                continue
            if all(fp.fetch_offset > 0 for fp in request.partitions):
                with self.lock:
                    self.parked += 1
                if ended.wait(self.park_s):
                    return
            yield broker_pb2.FetchResponse(partitions=[answer(
                broker_pb2.FetchRequest(partitions=[fp])).partitions[0] for fp in request.partitions])


def test_a_partition_added_during_a_long_poll_is_fetched_at_once(tmp_path: Path) -> None:
    # The follower's long poll outlasts the test: the new partition's batch can only arrive in time
    # if adding it cut the poll short.
    park_s = 120.0
    first, second = (Partition("t", i, "T", Log.open(tmp_path / f"t-{i}", LogConfig.from_overrides({})), 2,
                               broker_usable=lambda b: True) for i in (0, 1))
    for p in (first, second):
        p.make_follower(1, (1, 2), (1, 2), 0, 0)
    leader = ParkingLeader(park_s)
    manager = follow(leader, first, max_wait_ms=int(park_s * 1000))
    address = next(iter(manager._fetchers.values())).address
    try:
        wait_for(lambda: first.log.log_end_offset == 1 and leader.parked == 1, 15,
                 "t-0 replicated, then the follower's next fetch parked at the leader")
        manager.add_partition(first, 1, address, 0)  # the same partition and epoch again: nothing to cut short
        manager.add_partition(second, 1, address, 0)
        wait_for(lambda: second.log.log_end_offset == 1, park_s / 4,
                 "t-1 replicated while the long poll that did not carry it was still running")
    finally:
        stop(manager)
    assert leader.streams == 2, f"one stream reopened for the new partition: {leader.streams} streams"


def test_a_new_partitions_leader_that_lags_on_metadata_is_retried_soon(follower: Partition) -> None:
    # A leader that has not applied the metadata yet answers NOT_LEADER_OR_FOLLOWER; the follower of a
    # partition it has just added retries after a quarter of the backoff, not the whole of it.
    backoff_ms = 4_000
    leader = ParkingLeader(park_s=0.05, refusals=2)
    manager = follow(leader, follower, backoff_ms=backoff_ms)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 2 * backoff_ms / 1000 * 0.9,
                 "the batch sooner than two full backoffs after two refusals")
    finally:
        stop(manager)
    assert leader.refusals == 0


class TokenLeader(Leader):
    """A stream-serving Leader that ends, UNAUTHENTICATED (or ``code``), every stream whose session token it does
    not know."""

    def __init__(self, known: set[str], code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED) -> None:
        super().__init__(stream=True)
        self.known = known
        self.code = code
        self.tokens: list[str] = []

    def ReplicaFetch(self, request_iterator: Iterator[broker_pb2.FetchRequest],
                     context: Any) -> Iterator[broker_pb2.FetchResponse]:
        token = dict(context.invocation_metadata()).get(sasl.SESSION_METADATA_KEY, "")
        with self.lock:
            self.tokens.append(token)
        if token not in self.known:
            context.abort(self.code, "unknown SASL session")
        yield from super().ReplicaFetch(request_iterator, context)


class FakeSession:
    """client.sasl.ScramSession's interface: a new token after each invalidation."""

    def __init__(self) -> None:
        self.issued = 1
        self.invalidated: list[str] = []
        self.closed = False

    def token(self, timeout_s: float | None = None) -> str:
        return f"token-{self.issued}"

    def invalidate(self, token: str) -> None:
        self.invalidated.append(token)
        if token == f"token-{self.issued}":
            self.issued += 1

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INTERNAL])
def test_on_sasl_each_stream_carries_the_session_token_and_a_refused_one_is_renewed(
        follower: Partition, monkeypatch: pytest.MonkeyPatch, code: grpc.StatusCode) -> None:
    """INTERNAL: how grpc.aio reports the leader's UNAUTHENTICATED when the follower's first write fails as the
    stream ends (grpc/grpc#36066). The fetcher went on with the refused token for another backoff (seen in CI:
    tokens ['token-1', 'token-1', 'token-2']); a stream ended INTERNAL before any answer now renews it too."""
    session = FakeSession()
    made: list[tuple[str, str]] = []

    def session_for(address: str, security: SecurityConfig) -> FakeSession:
        made.append((address, security.protocol))
        return session
    monkeypatch.setattr(fetcher_module.sasl, "session_for", session_for)
    leader = TokenLeader(known={"token-2"}, code=code)  # token-1 expired at the leader
    security = SecurityConfig(protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="broker",
                              sasl_password="secret")
    manager = follow(leader, follower, security=security)  # type: ignore[arg-type]
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 15, "the batch, over a stream opened with a new token")
    finally:
        stop(manager)
    assert leader.tokens[:2] == ["token-1", "token-2"], leader.tokens
    assert session.invalidated == ["token-1"] and len(made) == 1 and made[0][1] == "SASL_PLAINTEXT"
    assert session.closed, "the fetcher closes its SASL session's channel when it stops"


@pytest.mark.parametrize("leader, code", [
    (TokenLeader(known=set()), grpc.StatusCode.UNAUTHENTICATED),
    (Leader(stream=False), grpc.StatusCode.UNIMPLEMENTED),
], ids=["unknown-session", "no-stream"])
def test_a_stream_the_leader_ended_before_the_first_request_fails_with_the_leaders_status(
        leader: broker_pb2_grpc.BrokerServiceServicer, code: grpc.StatusCode) -> None:
    """The leader refuses a stream on its metadata, before reading a message: when its answer is
    in before the follower's first write (a race the suite lost in CI), grpc.aio's write says only
    "already finished". The fetch must still fail with the leader's status, or the fetcher neither
    renews its SASL session nor falls back to unary fetches, and opens the same refused stream again."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def fetch_after_the_call_ended() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            session = fetcher_module._FetchSession(broker_pb2_grpc.BrokerServiceStub(channel), None,  # type: ignore[arg-type]
                                                   ((sasl.SESSION_METADATA_KEY, "token-1"),), "token-1")
            await session._call.code()  # the leader's refusal has arrived: the call is over
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await session.fetch(broker_pb2.FetchRequest(replica_id=2, partitions=[
                    broker_pb2.FetchPartition(topic="t", partition=0)]))
            return refused.value
    try:
        error = asyncio.run(fetch_after_the_call_ended())
    finally:
        server.stop(0)
    assert error.code() == code, error


@pytest.fixture
def appended_on(follower: Partition, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the follower's appends ran on."""
    threads: list[str] = []
    append = follower.log.append_as_follower

    def recording_append(records: bytes, *, blocking: bool = True) -> Any:
        info = append(records, blocking=blocking)
        threads.append(threading.current_thread().name)  # appended (not refused WouldBlock) on this thread
        return info
    monkeypatch.setattr(follower.log, "append_as_follower", recording_append)
    return threads


def test_a_large_response_is_appended_off_the_fetch_loop(follower: Partition, appended_on: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher_module, "LOOP_PROCESS_MAX_BYTES", len(BATCH) - 1)
    manager = follow(Leader(stream=True), follower)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 10, "the batch replicated")
    finally:
        stop(manager)
    assert appended_on and not appended_on[0].startswith("replica-fetch-loop"), appended_on


def test_a_small_response_is_appended_on_the_fetch_loop(follower: Partition, appended_on: list[str]) -> None:
    manager = follow(Leader(stream=True), follower)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 10, "the batch replicated")
    finally:
        stop(manager)
    assert appended_on == ["replica-fetch-loop-2"], appended_on


def test_an_append_that_must_flush_is_done_off_the_fetch_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig.from_overrides({"flush.messages": "1"}))  # every append flushes
    p = Partition("t", 0, "T", lg, 2, broker_usable=lambda b: True)
    p.make_follower(1, (1, 2), (1, 2), 0, 0)
    flushed_on: list[str] = []
    flush = lg.flush

    def recording_flush(*args: Any, **kwargs: Any) -> Any:
        flushed_on.append(threading.current_thread().name)
        return flush(*args, **kwargs)
    monkeypatch.setattr(lg, "flush", recording_flush)
    manager = follow(Leader(stream=True), p)
    try:
        wait_for(lambda: lg.log_end_offset == 1 and lg.high_watermark == 1, 10, "the batch replicated")
    finally:
        stop(manager)
    assert flushed_on and not any(t.startswith("replica-fetch-loop") for t in flushed_on), flushed_on


class WedgedCall:
    """A grpc.aio stream call as grpc leaves one cancelled before its headers went out: ``write`` waits on
    an event nothing sets any more (grpc.aio's ``_metadata_sent``), whatever ``cancel`` does."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, request: Any) -> None:
        await asyncio.Event().wait()

    async def read(self) -> Any:
        raise AssertionError("never reached")

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def wedged_session() -> tuple[fetcher_module._FetchSession, WedgedCall, fetcher_module._FetchLoop]:
    call = WedgedCall()
    fetch_loop = fetcher_module._FetchLoop("test-fetch-loop")
    stub = SimpleNamespace(ReplicaFetch=lambda metadata=None: call)
    return fetcher_module._FetchSession(stub, fetch_loop, None, ""), call, fetch_loop  # type: ignore[arg-type]


def test_a_cancelled_stream_ends_a_fetch_even_when_grpc_leaves_its_write_waiting() -> None:
    session, call, fetch_loop = wedged_session()
    try:
        pending = fetch_loop.submit(session.fetch(broker_pb2.FetchRequest()))
        wait_for(lambda: session.waiting_since is not None, 5, "the fetch waiting in write()")
        session.cancel()  # from another thread, as the watchdog and add() do
        with pytest.raises(fetcher_module._SessionEnded):
            pending.result(timeout=5)
        assert call.cancelled and session.waiting_since is None
    finally:
        fetch_loop.stop()


def test_cancelling_the_fetchers_task_is_not_taken_for_the_streams_end() -> None:
    session, _, fetch_loop = wedged_session()
    try:
        pending = fetch_loop.submit(session.fetch(broker_pb2.FetchRequest()))
        wait_for(lambda: session.waiting_since is not None, 5, "the fetch waiting in write()")
        pending.cancel()  # the task itself (the loop shutting down)
        with pytest.raises(concurrent.futures.CancelledError):
            pending.result(timeout=5)
    finally:
        fetch_loop.stop()


class _CountedResponse:
    """A fetch answer as the follower's fetch loop reads it, counting the reads of each partition's ``records``:
    each read of a protobuf bytes field copies it out of the message."""

    def __init__(self, response: broker_pb2.FetchResponse, reads: list[int]) -> None:
        self._response = response
        self.partitions = [_CountedPartition(pr, reads) for pr in response.partitions]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


class _CountedPartition:
    def __init__(self, pr: broker_pb2.FetchPartitionResponse, reads: list[int]) -> None:
        self._pr, self._reads = pr, reads

    @property
    def records(self) -> bytes:
        if self._pr.records:
            self._reads.append(1)
        return self._pr.records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pr, name)


@pytest.mark.parametrize("where", ["on the fetch loop", "off it"])
def test_a_partitions_records_are_read_out_of_the_answer_once(follower: Partition, appended_on: list[str],
                                                               monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    # Before, the follower read them four times: for the loop's byte bound, whether there were any, the append, and
    # the catch-up throttle's charge.
    if where == "off it":
        monkeypatch.setattr(fetcher_module, "LOOP_PROCESS_MAX_BYTES", len(BATCH) - 1)
    reads: list[int] = []
    send = fetcher_module.ReplicaFetcher._send

    async def counted(self: Any, wanted: Any) -> Any:
        return _CountedResponse(await send(self, wanted), reads)

    monkeypatch.setattr(fetcher_module.ReplicaFetcher, "_send", counted)
    manager = follow(Leader(stream=True), follower)
    try:
        wait_for(lambda: follower.log.log_end_offset == 1, 10, "the batch replicated")
    finally:
        stop(manager)
    assert len(appended_on) == 1 and appended_on[0].startswith("replica-fetch-loop") == (where != "off it"), \
        appended_on
    assert reads == [1], f"the batch's records were read {len(reads)} times"
