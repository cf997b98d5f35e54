"""ProduceStream: a producer's pipelined requests on one stream, appended and answered in order, bounded.
FetchStream: a consumer's fetches on one stream, each answered as a unary Fetch, its bytes held until
written out. (And the SASL session check the request streams make per message.)

Real BrokerService, ReplicaManager, Log and purgatories (broker 1 leads t-0, broker 2 is an
in-sync follower that fetches only when a test makes its fetch, so acks=all requests wait for
the test). The stream's requests come from a queue the test fills, as gRPC's request iterator
would hand them over; the producer client over real gRPC is covered by the client suites.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inprocess import InProcessBroker
from prometheus_client import CollectorRegistry
from waiting import await_for

from broker import principal
from broker.admission import ClientLimits
from broker.fetch_answer import FetchAnswer, answer_of
from broker.metrics import AioMetricsInterceptor, RpcMetrics
from broker.sasl import AioSessionInterceptor
from broker.service import INLINE_APPEND_MAX_BYTES, PRODUCE_STREAM_MAX_IN_FLIGHT, Capacity
from proto import broker_pb2
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder


class Aborted(Exception):
    """What grpc.aio's ``context.abort`` raises: the call ends with the status it set."""


class Context:
    """The ServicerContext calls the produce handlers make (a plaintext loopback caller)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None
        self.metadata = metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return self.metadata

    def code(self) -> grpc.StatusCode | None:
        return None if self.status is None else self.status[0]

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted(f"{code.name}: {details}")


class Requests:
    """A stream's requests as the handler reads them: what the test has sent, in order, until it ends."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[broker_pb2.ProduceRequest | None] = asyncio.Queue()
        self.read = 0  # requests the handler has taken

    def send(self, *requests: broker_pb2.ProduceRequest | None) -> None:
        for r in requests:
            self.queue.put_nowait(r)

    async def __aiter__(self) -> AsyncIterator[broker_pb2.ProduceRequest]:
        while (request := await self.queue.get()) is not None:
            self.read += 1
            yield request


class Leader(InProcessBroker):
    def __init__(self, tmp_path: Path, executor: concurrent.futures.Executor | None = None) -> None:
        super().__init__(tmp_path, {"t": {}}, replicas=(1, 2), executor=executor)

    def log_end(self) -> int:
        return self.rm.leader_partition("t", 0).log.log_end_offset

    async def follower_fetch(self, offset: int) -> None:
        """Follower 2 fetches from ``offset``: the HW moves up to it."""
        await self.service._fetch(broker_pb2.FetchRequest(
            replica_id=2, replica_epoch=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
            partitions=[broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=offset,
                                                  partition_max_bytes=1 << 20, current_leader_epoch=0,
                                                  last_fetched_epoch=0, log_start_offset=0)]), None)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    with Leader(tmp_path) as b:
        yield b


def request(acks: int, value: bytes = b"v", records: int = 1) -> broker_pb2.ProduceRequest:
    b = RecordBatchBuilder()
    for _ in range(records):
        b.append(0, None, value)
    return broker_pb2.ProduceRequest(acks=acks, timeout_ms=30_000, partitions=[
        broker_pb2.ProducePartitionData(topic="t", partition=0, records=b.build())])


async def collect(stream: AsyncIterator[broker_pb2.ProduceResponse], into: list[Any]) -> None:
    async for response in stream:
        into.append(answer_of(response).to_message() if isinstance(response, (FetchAnswer, broker_pb2.FetchResponse))
                    else response)


def offsets(responses: list[broker_pb2.ProduceResponse]) -> list[int]:
    assert all(r.partitions[0].error_code == 0 for r in responses), responses
    return [r.partitions[0].base_offset for r in responses]


def test_pipelined_requests_are_appended_and_answered_in_order_at_most_five_unanswered(leader: Leader) -> None:
    count = PRODUCE_STREAM_MAX_IN_FLIGHT + 2

    async def scenario() -> None:
        requests, answers = Requests(), []
        requests.send(*(request(acks=-1) for _ in range(count)))
        handler = asyncio.ensure_future(collect(leader.service.ProduceStream(requests, Context()), answers))
        await await_for(lambda: leader.log_end() == PRODUCE_STREAM_MAX_IN_FLIGHT, 10,
                        lambda: f"log end {leader.log_end()}, {requests.read} requests read")
        # acks=all: none is answered before follower 2 has the batches, and no sixth is appended meanwhile.
        await asyncio.sleep(0.1)
        assert (leader.log_end(), answers) == (PRODUCE_STREAM_MAX_IN_FLIGHT, []), \
            f"{leader.log_end()} appended, {len(answers)} answered with {PRODUCE_STREAM_MAX_IN_FLIGHT} unanswered"
        assert requests.read == PRODUCE_STREAM_MAX_IN_FLIGHT, \
            f"{requests.read} requests read: none past the bound may be held"

        await leader.follower_fetch(0)
        await leader.follower_fetch(PRODUCE_STREAM_MAX_IN_FLIGHT)  # the HW passes the first five
        await await_for(lambda: leader.log_end() == count, 10, lambda: f"log end {leader.log_end()}")
        await leader.follower_fetch(count)
        requests.send(None)  # the client is done: the stream ends once every request is answered
        await asyncio.wait_for(handler, 10)
        assert offsets(answers) == list(range(count))

    asyncio.run(scenario())


def test_a_request_waiting_for_the_executor_is_not_overtaken_by_the_next(tmp_path: Path) -> None:
    """A large request is appended on the executor, here busy; the small one after it could be appended
    on the loop at once. The stream reads it only once the first is appended: offsets follow the send order."""
    records = INLINE_APPEND_MAX_BYTES // 1024 + 8
    large = request(acks=1, value=b"x" * 1024, records=records)
    busy = threading.Event()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-io")
    executor.submit(busy.wait, 10)

    async def scenario(leader: Leader) -> list[Any]:
        requests, answers = Requests(), []
        requests.send(large, request(acks=1), None)
        handler = asyncio.ensure_future(collect(leader.service.ProduceStream(requests, Context()), answers))
        await await_for(lambda: requests.read >= 1, 10, "the first request read")
        await asyncio.sleep(0.1)
        assert (requests.read, leader.log_end()) == (1, 0), \
            f"{requests.read} requests read, log end {leader.log_end()}, while the first waits for the executor"
        busy.set()
        await asyncio.wait_for(handler, 10)
        return answers

    with Leader(tmp_path, executor=executor) as leader:
        answers = asyncio.run(scenario(leader))
    assert offsets(answers) == [0, records], "the small request overtook the large one sent before it"


def test_a_refused_request_ends_the_stream_with_its_status_and_counts_it(leader: Leader) -> None:
    """A request past the client's in-flight bound is refused RESOURCE_EXHAUSTED, as a unary call is:
    the stream ends with that status, the requests after it are not read, and the metrics count the
    stream's unanswered requests with it."""
    leader.service.capacity = Capacity(io=leader.io, replication=leader.io, limits=ClientLimits(1, 1),
                                       budget=leader.service.capacity.budget)
    metrics = RpcMetrics(CollectorRegistry())
    context = Context()

    async def scenario() -> tuple[list[Any], BaseException | None, Requests]:
        handler = grpc.stream_stream_rpc_method_handler(leader.service.ProduceStream)
        details = type("Details", (), {"method": "/brook.BrokerService/ProduceStream"})()
        timed = await AioMetricsInterceptor(metrics).intercept_service(_returns(handler), details)
        requests, answers = Requests(), []
        # The first waits for follower 2 (acks=all) and holds the client's one in-flight request.
        requests.send(request(acks=-1), request(acks=1), request(acks=1), None)
        try:
            await asyncio.wait_for(collect(timed.stream_stream(requests, context), answers), 10)
        except Aborted as e:
            # The appended request's acks=all wait ends with the stream: its in-flight slot is free.
            limits = leader.service.capacity.limits
            await await_for(lambda: not limits._usage, 5, lambda: f"still in flight: {limits._usage}")
            return answers, e, requests
        return answers, None, requests

    answers, error, requests = asyncio.run(scenario())
    assert error is not None and context.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (error, context.status)
    assert answers == [] and leader.log_end() == 1, f"{answers}, log end {leader.log_end()}"
    assert requests.read == 2, f"{requests.read} requests read: the stream must stop at the refusal"
    counted = {s.labels["code"]: s.value for m in metrics.requests.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels["method"] == "ProduceStream"}
    assert counted == {"RESOURCE_EXHAUSTED": 2.0}, counted


def _returns(handler: Any) -> Any:
    async def continuation(details: Any) -> Any:
        return handler
    return continuation


class Sessions:
    """The SCRAM authenticator's one call the session interceptor makes: token -> live principal or None."""

    def __init__(self, live: dict[str, Any]) -> None:
        self.live = live

    def session(self, token: str) -> Any:
        return self.live.get(token)


async def through_session_check(handler: Any, method: str, sessions: Sessions, token: str) -> Any:
    """``handler`` as the broker's gRPC server runs it for a call carrying ``token``: behind AioSessionInterceptor."""
    details = type("Details", (), {"method": f"/brook.BrokerService/{method}",
                                   "invocation_metadata": ((principal.SESSION_METADATA_KEY, token),)})()
    checked = await AioSessionInterceptor(sessions).intercept_service(
        _returns(grpc.stream_stream_rpc_method_handler(handler)), details)
    return checked.stream_stream


def test_a_session_that_expires_while_the_stream_lasts_ends_it_unauthenticated(leader: Leader) -> None:
    """Each message's SASL session is checked: once this node no longer knows the stream's token, the
    next request ends the stream UNAUTHENTICATED (the producer re-authenticates), never runs as ANONYMOUS."""
    sessions = Sessions({"tok-1": principal.Principal.parse("User:alice")})
    context = Context(((principal.SESSION_METADATA_KEY, "tok-1"),))

    async def scenario() -> tuple[list[Any], BaseException | None]:
        stream = await through_session_check(leader.service.ProduceStream, "ProduceStream", sessions, "tok-1")
        requests, answers = Requests(), []
        handler = asyncio.ensure_future(collect(stream(requests, context), answers))
        requests.send(request(acks=1))
        await await_for(lambda: len(answers) == 1, 10, "the first answer")
        sessions.live.clear()  # the session expired
        requests.send(request(acks=1), request(acks=1), None)
        try:
            await asyncio.wait_for(handler, 10)
        except Aborted as e:
            return answers, e
        return answers, None

    answers, error = asyncio.run(scenario())
    assert error is not None and context.code() == grpc.StatusCode.UNAUTHENTICATED, (error, context.status)
    assert offsets(answers) == [0] and leader.log_end() == 1, f"{answers}, log end {leader.log_end()}"


def test_a_follower_stream_whose_session_this_node_does_not_know_ends_unauthenticated(leader: Leader) -> None:
    """ReplicaFetch checks each message's SASL session too: a follower whose token this node never issued
    (it restarted) or expired is ended UNAUTHENTICATED, which makes the follower's channel drop the token,
    instead of being answered as ANONYMOUS ("not that broker") until its cached session is renewed."""
    sessions = Sessions({})  # no session is known here
    context = Context(((principal.SESSION_METADATA_KEY, "tok-from-before-the-restart"),))
    fetch = broker_pb2.FetchRequest(replica_id=2, replica_epoch=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                                    partitions=[broker_pb2.FetchPartition(
                                        topic="t", partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                        current_leader_epoch=0, last_fetched_epoch=-1, log_start_offset=0)])

    async def scenario() -> BaseException | None:
        stream = await through_session_check(leader.service.ReplicaFetch, "ReplicaFetch", sessions,
                                             "tok-from-before-the-restart")
        requests, answers = Requests(), []
        requests.send(fetch, None)
        try:
            await asyncio.wait_for(collect(stream(requests, context), answers), 10)
        except Aborted as e:
            assert answers == [], answers
            return e
        return None

    error = asyncio.run(scenario())
    assert error is not None and context.code() == grpc.StatusCode.UNAUTHENTICATED, (error, context.status)


def consumer_fetch(offset: int, topic: str = "t", replica_id: int = -1) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=replica_id, replica_epoch=1 if replica_id >= 0 else -1, max_wait_ms=0,
                                   min_bytes=1, max_bytes=1 << 20, partitions=[broker_pb2.FetchPartition(
                                       topic=topic, partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                       current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])


def committed(leader: Leader, batches: int) -> None:
    """``batches`` one-record batches appended and replicated: the HW is at their end."""
    async def scenario() -> None:
        for _ in range(batches):
            leader.rm.append_records("t", 0, request(acks=1, value=b"x" * 1000).partitions[0].records, acks=1,
                                     timeout_ms=5000, blocking=False).result(timeout=5)
        await leader.follower_fetch(0)
        await leader.follower_fetch(leader.log_end())
    asyncio.run(scenario())
    assert leader.rm.leader_partition("t", 0).log.high_watermark == batches


def test_fetch_stream_answers_each_fetch_as_a_unary_fetch_would(leader: Leader) -> None:
    committed(leader, 3)
    sent = [consumer_fetch(0), consumer_fetch(3), consumer_fetch(0, topic="nope"), consumer_fetch(0, replica_id=2),
            consumer_fetch(1)]

    async def scenario() -> tuple[list[Any], list[Any]]:
        requests, answers = Requests(), []
        requests.send(*sent, None)
        await asyncio.wait_for(collect(leader.service.FetchStream(requests, Context()), answers), 10)
        unary = [answer_of(await leader.service.Fetch(r, Context())).to_message() for r in (sent[0], sent[4])]
        return answers, unary

    answers, unary = asyncio.run(scenario())
    assert len(answers) == len(sent), f"one answer per fetch, in order: {answers}"
    first, at_end, unknown, follower, second = (a.partitions[0] for a in answers)
    assert first.error_code == 0 and first.high_watermark == 3 and first.records, first
    assert (at_end.error_code, at_end.records, at_end.high_watermark) == (0, b"", 3), at_end
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, unknown
    # A follower's fetch moves the HW: never served on a consumer's stream, which any client may open.
    assert follower.error_code == ErrorCode.INVALID_REQUEST and "ReplicaFetch" in follower.error_message, follower
    assert (first.records, second.records) == (unary[0].partitions[0].records, unary[1].partitions[0].records), \
        "a stream's answer carries the bytes a unary Fetch's does"


def test_a_fetch_stream_answer_holds_its_bytes_until_it_is_written_out(leader: Leader) -> None:
    # gRPC resumes a stream handler after its yield once the answer is written out. Until then the
    # answer's bytes stay charged to the broker's budget (a consumer that does not read its answers
    # holds one answer's bytes, not more), and the stream reads no further request.
    committed(leader, 3)
    budget = leader.service.capacity.budget

    async def scenario() -> None:
        requests = Requests()
        requests.send(consumer_fetch(0))
        stream = leader.service.FetchStream(requests, Context())
        answer = await asyncio.wait_for(anext(stream), 10)
        size = len(answer.records_of(0))
        assert size > 3000 and budget.used_bytes >= size, \
            f"an answer of {size} bytes handed to gRPC, {budget.used_bytes} bytes held"
        requests.send(consumer_fetch(3))
        # The handler stays at its yield until gRPC asks for the next answer (the last one written out).
        assert requests.read == 1, "no request is read while the last answer is not written out"
        empty = await asyncio.wait_for(anext(stream), 10)  # the first answer was written out
        assert empty.records_of(0) == b"" and budget.used_bytes == 0, \
            f"{budget.used_bytes} bytes still held once the answer was written"
        await stream.aclose()  # the call ended (cancelled at its yield)
        assert budget.used_bytes == 0

    asyncio.run(scenario())
