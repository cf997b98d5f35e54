"""A Fetch answer keeps its records apart from the message until it is written out (broker/bytes_apart.py,
broker/fetch_answer.py; JoinGroup's JoinAnswer is tested in tests/groups/test_group_amplification.py).

Before, each partition's records were copied into the FetchResponse and serialized by protobuf on the event loop,
with the interpreter lock held throughout (55 MiB: ~30 ms to build, 120-180 ms to serialize). Here:

- the wire form written around the records is a FetchResponse every reader decodes, field for field;
- long records are parts of their own: the very bytes the log read, written or joined, never copied by protobuf;
- over gRPC a long answer is joined on an executor thread (bytes.join runs without the interpreter lock), a short
  one on the loop; over the replication listener the records go to the socket as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inprocess import InProcessBroker, LoopbackCaller

from broker import bytes_apart
from broker.bytes_apart import (
    JOIN_ON_LOOP_MAX_BYTES,
    OWN_PART_MIN_BYTES,
    PARTS_ON_LOOP_MAX_ELEMENTS,
    BytesApart,
)
from broker.fetch_answer import FetchAnswer
from broker.group_service import JoinAnswer
from broker.replication_listener import ReplicationListener
from broker.service import add_to_server
from proto import broker_pb2, broker_pb2_grpc, common_pb2
from proto.errors import ErrorCode
from replication import fetcher as fetcher_module
from replication.fetcher import REPLICATION_FRAME as FRAME
from replication.fetcher import REPLICATION_MAGIC as MAGIC
from storage.record_batch import RecordBatchBuilder, iter_batches


def _answer() -> FetchAnswer:
    answer = FetchAnswer()
    m = answer.message
    m.throttle_time_ms = 7
    m.incremental = True
    m.partitions.add(topic="a", partition=0, high_watermark=10, log_start_offset=2, log_end_offset=11)
    answer.records[0] = os.urandom(OWN_PART_MIN_BYTES + 5)  # a part of its own
    m.partitions.add(topic="a", partition=1, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, error_message="moved",
                     high_watermark=-1, log_start_offset=-1, log_end_offset=-1,
                     current_leader=common_pb2.LeaderIdAndEpoch(leader_id=3, leader_epoch=9))
    m.partitions.add(topic="b" * 300, partition=2, high_watermark=1 << 40, log_start_offset=0, log_end_offset=1 << 40)
    answer.records[2] = b"short records"  # copied into the buffer around it
    p = m.partitions.add(topic="c", partition=3, high_watermark=5, log_start_offset=0, log_end_offset=8)
    p.diverging_epoch.epoch, p.diverging_epoch.end_offset = 4, 6
    m.partitions.add(topic="d", partition=4)
    answer.records[4] = os.urandom(200_000)
    return answer


def test_the_parts_are_the_fetch_response_with_its_records_set() -> None:
    answer = _answer()
    parts = answer.parts()
    decoded = broker_pb2.FetchResponse.FromString(b"".join(parts))
    expected = answer.to_message()
    assert decoded == expected, decoded
    assert [p.records for p in decoded.partitions] == [answer.records[0], b"", b"short records", b"", answer.records[4]]
    assert (decoded.throttle_time_ms, decoded.incremental) == (7, True)
    assert answer.to_bytes() == b"".join(parts)
    assert answer.records_bytes() == sum(len(r) for r in answer.records.values())
    assert answer.records_of(2) == b"short records" and answer.records_of(1) == b""


def test_long_records_are_the_bytes_read_not_copies() -> None:
    answer = _answer()
    parts = answer.parts()
    assert any(part is answer.records[0] for part in parts) and any(part is answer.records[4] for part in parts)
    assert not any(part is answer.records[2] for part in parts), "short records go into the buffer around them"
    assert len(parts) == 5, [len(p) for p in parts]  # head, records 0, head, records 4, the answer's own fields


def test_an_answer_without_records_apart_is_the_message_serialized() -> None:
    m = broker_pb2.FetchResponse(throttle_time_ms=3)
    m.partitions.add(topic="t", partition=0, records=b"in the message")
    assert FetchAnswer(m).parts() == [m.SerializeToString()]
    serialize = broker_pb2.FetchResponse.SerializeToString
    assert bytes_apart.serialized(serialize, m) == bytes_apart.serialized(serialize, FetchAnswer(m)) == \
        m.SerializeToString()
    assert bytes_apart.serialized(serialize, b"joined") == b"joined"


def test_records_both_in_the_message_and_apart_are_refused() -> None:
    answer = FetchAnswer()
    answer.message.partitions.add(topic="t", partition=0, records=b"x")
    answer.records[0] = b"y"
    with pytest.raises(ValueError, match="element 0"):
        answer.parts()


@pytest.mark.parametrize("kind", [FetchAnswer, JoinAnswer], ids=lambda k: k.__name__)
def test_the_answers_own_fields_are_scalars(kind: type[BytesApart]) -> None:
    # parts() copies every field of the message but the repeated one by setattr, which holds for scalars only: a
    # message or repeated field added to the answer must be written there (this test then says so).
    others = [f for f in kind.MESSAGE.DESCRIPTOR.fields if f.name != kind.REPEATED]
    assert others and all(f.message_type is None and not f.is_repeated for f in others), [f.name for f in others]


# ---- over gRPC ----

@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {"max.message.bytes": str(2 << 20)}}) as b:
        yield b


def _append(b: InProcessBroker, count: int, value_bytes: int) -> list[bytes]:
    """``count`` one-record batches of random values (incompressible), committed (a single replica)."""
    batches = []
    for _ in range(count):
        builder = RecordBatchBuilder()
        builder.append(0, None, os.urandom(value_bytes))
        batch = builder.build()
        b.rm.append_records("t", 0, batch, acks=1, timeout_ms=5000, blocking=False).result(timeout=5)
        batches.append(batch)
    return batches


def _fetch_request(max_bytes: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes,
                                   partitions=[broker_pb2.FetchPartition(
                                       topic="t", partition=0, fetch_offset=0, partition_max_bytes=max_bytes,
                                       current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])


def _offsets(records: bytes) -> list[int]:
    return [h.base_offset for _, h in iter_batches(records)]


@contextlib.asynccontextmanager
async def _served(broker: InProcessBroker) -> AsyncIterator[broker_pb2_grpc.BrokerServiceStub]:
    """A stub of the broker's service on a gRPC server of its own (``add_to_server``), on loopback."""
    server = grpc.aio.server()
    add_to_server(broker.service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_receive_message_length", 64 << 20)]) as channel:
            yield broker_pb2_grpc.BrokerServiceStub(channel)
    finally:
        await server.stop(None)


def test_a_long_grpc_answer_is_joined_off_the_loop_and_a_short_one_on_it(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = _append(broker, 3, 900_000)  # ~2.7 MiB: past JOIN_ON_LOOP_MAX_BYTES
    assert sum(map(len, batches)) > JOIN_ON_LOOP_MAX_BYTES
    joined: list[tuple[str, int]] = []
    to_bytes = FetchAnswer.to_bytes

    def recorded(self: FetchAnswer) -> bytes:
        joined.append((threading.current_thread().name, self.records_bytes()))
        return to_bytes(self)

    monkeypatch.setattr(FetchAnswer, "to_bytes", recorded)

    async def scenario() -> tuple[list[Any], str]:
        async with _served(broker) as stub:
            long = await stub.Fetch(_fetch_request(8 << 20))
            short = await stub.Fetch(_fetch_request(1))  # one batch (the first is always whole)
            streamed = [r async for r in stub.FetchStream(iter([_fetch_request(8 << 20)]))]
        return [long, short, *streamed], threading.current_thread().name

    (long, short, streamed), loop_thread = asyncio.run(scenario())
    records = long.partitions[0].records  # the batches as the leader stamped them (its epoch)
    assert long.partitions[0].error_code == 0 and _offsets(records) == [0, 1, 2], long.partitions[0]
    assert len(records) == sum(map(len, batches)) and records[61:len(batches[0])] == batches[0][61:]
    assert streamed.partitions[0].records == records
    assert short.partitions[0].records == records[:len(batches[0])]
    threads = [name for name, _ in joined]
    sizes = [size for _, size in joined]
    assert sizes == [len(b"".join(batches)), len(batches[0]), len(b"".join(batches))], joined
    assert threads[0] != loop_thread and threads[2] != loop_thread, f"long answers joined on the loop: {joined}"
    assert threads[1] == loop_thread, f"a short answer took a thread hop: {joined}"


# ---- over the replication listener ----

def _fetched_over_listener(service: Any, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
    """``request``'s answer from a real replication listener over ``service``, plaintext on loopback (trusted as a
    node), on a loop of its own."""
    loop = fetcher_module._FetchLoop("test-fetch-answer-listener")
    listener = ReplicationListener(service, 1, "127.0.0.1", 0, None, {})
    loop.submit(listener.start()).result(10)
    try:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as sock:
            body = request.SerializeToString()
            sock.sendall(MAGIC + FRAME.pack(len(body)) + body)
            (size,) = FRAME.unpack(_read(sock, FRAME.size))
            return broker_pb2.FetchResponse.FromString(_read(sock, size))
    finally:
        loop.submit(listener.stop()).result(10)
        loop.stop()

class _AnswerService:
    """A stand-in broker for the replication listener: each fetch is answered with ``answer``."""

    def __init__(self, answer: FetchAnswer) -> None:
        self.answer = answer
        self.rm = type("RM", (), {"new_fetch_session": staticmethod(lambda: _Session())})()

    async def replica_fetch_message(self, request: Any, context: Any, session: Any) -> FetchAnswer:
        return self.answer


class _Session:
    send_now = None

    def close(self) -> None:
        pass


def test_the_replication_listener_writes_the_records_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = _answer()
    written: list[Any] = []
    write = asyncio.StreamWriter.write

    def recorded(self: asyncio.StreamWriter, data: Any) -> None:
        written.append(data)
        write(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", recorded)
    got = _fetched_over_listener(_AnswerService(answer), broker_pb2.FetchRequest(replica_id=2, partitions=[
        broker_pb2.FetchPartition(topic="a", partition=0)]))
    assert got == answer.to_message()
    assert any(d is answer.records[0] for d in written) and any(d is answer.records[4] for d in written), \
        f"the records were copied before they were written: {[len(d) for d in written]}"


def _read(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"the listener closed the connection after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def test_a_streamed_answer_lets_its_records_go_once_joined(broker: InProcessBroker,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # While gRPC writes a streamed answer out, the stream is suspended at its yield: what it holds then stays held.
    # Once joined into its bytes, the answer (and its records, as long again) must not be among it.
    import gc
    import weakref

    from broker import replica_manager

    _append(broker, 3, 900_000)
    made: list[weakref.ref[FetchAnswer]] = []

    class Tracked(FetchAnswer):
        __slots__ = ("__weakref__",)

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(weakref.ref(self))

    monkeypatch.setattr(replica_manager, "FetchAnswer", Tracked)

    async def requests() -> Any:
        yield _fetch_request(8 << 20)
        await asyncio.Event().wait()  # the consumer's next fetch never comes

    async def scenario() -> tuple[Any, list[Any]]:
        stream = broker.service.fetch_stream_over_grpc(requests(), LoopbackCaller())  # type: ignore[arg-type]
        wire = await asyncio.wait_for(anext(stream), 10)
        # The worker threads that read and joined the answer wake this loop as they hand their results over, and
        # drop their own references a moment later (seen in CI: the read's result tuple still on its worker when
        # the stream had yielded). What the stream holds is what stays once they have: looked at until a deadline.
        deadline = time.monotonic() + 10
        while True:
            gc.collect()
            alive = [r() for r in made if r() is not None]
            if not alive or time.monotonic() > deadline:
                break
            del alive
            await asyncio.sleep(0.01)
        await stream.aclose()
        return wire, alive

    wire, alive = asyncio.run(scenario())
    assert isinstance(wire, bytes) and len(wire) > JOIN_ON_LOOP_MAX_BYTES, type(wire)
    assert made and not alive, f"{len(alive)} answers held while their bytes are written out"


def _many(n: int) -> FetchAnswer:
    answer = FetchAnswer()
    for i in range(n):
        answer.message.partitions.add(topic="t", partition=i, high_watermark=1, log_end_offset=1)
        answer.records[i] = b"r" * 70  # short records: the answer is small, but put in parts element by element
    return answer


def test_an_answer_of_many_partitions_is_put_in_parts_off_the_loop() -> None:
    ran: list[str] = []

    async def run(fn: Any) -> Any:
        ran.append(threading.current_thread().name)
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    few, many = _many(PARTS_ON_LOOP_MAX_ELEMENTS), _many(PARTS_ON_LOOP_MAX_ELEMENTS + 1)
    assert few.on_loop() and not many.on_loop()
    assert asyncio.run(bytes_apart.for_grpc(few, run)) is few and ran == []
    wire = asyncio.run(bytes_apart.for_grpc(many, run))
    assert len(ran) == 1 and broker_pb2.FetchResponse.FromString(wire) == many.to_message()
    # An answer without records apart is one protobuf call, however many partitions it names.
    assert FetchAnswer(many.to_message()).on_loop()


def test_the_replication_listener_puts_an_answer_of_many_partitions_in_parts_off_the_loop() -> None:
    import concurrent.futures

    answer = _many(PARTS_ON_LOOP_MAX_ELEMENTS + 1)
    service = _AnswerService(answer)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-replication")
    submitted: list[Any] = []
    submit = pool.submit

    def recorded(fn: Any, *args: Any) -> Any:
        submitted.append(getattr(fn, "__name__", fn))
        return submit(fn, *args)

    pool.submit = recorded  # type: ignore[method-assign]
    service.capacity = type("Capacity", (), {"replication": pool})()  # type: ignore[attr-defined]
    try:
        got = _fetched_over_listener(service, broker_pb2.FetchRequest(replica_id=2))
    finally:
        pool.shutdown()
    assert got == answer.to_message()
    assert submitted == ["parts"], submitted


def test_a_consumers_grpc_fetch_answer_carries_at_most_the_grpc_bound(broker: InProcessBroker) -> None:
    # gRPC copies an answer into its buffers with the interpreter lock held (~1 ms a MiB here): a consumer's answer
    # on the gRPC port carries at most GRPC_FETCH_ANSWER_MAX_BYTES, whatever it asks; the consumer fetches the rest
    # next. The service itself (the Kafka listener calls it, and sends records from the files) keeps the bound the
    # request and fetch.partition.max.bytes (10 MiB) give.
    from broker.service import GRPC_FETCH_ANSWER_MAX_BYTES

    batches = _append(broker, 12, 1_000_000)
    size = len(batches[0])

    async def scenario() -> tuple[Any, Any, Any]:
        async with _served(broker) as stub:
            # Asking at least 16 MiB within a minute: answered at once with what the bound lets through.
            patient = _fetch_request(64 << 20)
            patient.min_bytes, patient.max_wait_ms = 16 << 20, 60_000
            unary = await asyncio.wait_for(stub.Fetch(patient), 30)
            streamed = [r async for r in stub.FetchStream(iter([patient]))]
        direct = await broker.service.Fetch(_fetch_request(64 << 20), LoopbackCaller())  # type: ignore[arg-type]
        return unary, streamed[0], direct

    unary, streamed, direct = asyncio.run(scenario())
    for answer in (unary, streamed):
        records = answer.partitions[0].records
        assert GRPC_FETCH_ANSWER_MAX_BYTES - size < len(records) <= GRPC_FETCH_ANSWER_MAX_BYTES, len(records)
        assert _offsets(records) == list(range(len(records) // size)), _offsets(records)
    assert len(direct.records_of(0)) == 10 * size, len(direct.records_of(0))  # fetch.partition.max.bytes: 10 MiB
