"""Fetch and ListOffsets answers that cost the broker no more than one lookup a partition and a bounded
number of descriptors. Real ReplicaManager, BrokerService and Kafka listener in this process.

- A Kafka Fetch answer keeps each partition's records in the segment file until it is written
  (sendfile), each holding a duplicated descriptor: 4-8 unread fetches of 2,000 partitions took a broker
  to its descriptor limit, new clients were refused and checkpoints failed (audit). Slices now hold at
  most storage.file_records.slice_budget() descriptors; past it an answer carries the bytes.
- A Fetch naming a partition many times read it once per entry (each read of a segment with a sparse
  index walked it); as Kafka's fetch map, a partition is now read and answered once, with its last
  entry's fields.
- A ListOffsets naming a partition more than once gets INVALID_REQUEST for each of its entries (Kafka).
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import struct
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessBroker, LoopbackCaller
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from waiting import await_for

from broker.fetch_answer import answer_of
from broker.kafka_wire import codec
from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec
from proto import broker_pb2
from proto.errors import ErrorCode
from storage import file_records
from storage.log import Log
from storage.record_batch import RecordBatchBuilder

FETCH, LIST_OFFSETS = 1, 2


def batch(base: int, ts: int, value_size: int) -> bytes:
    b = RecordBatchBuilder(base_offset=base, partition_leader_epoch=0)
    b.append(ts, f"k{base}".encode(), b"v" * value_size)
    return b.build()


def fill(b: InProcessBroker, partitions: int, batches: int, value_size: int) -> dict[int, bytes]:
    """``batches`` batches in each partition, committed; each partition's bytes."""
    out = {}
    for p in range(partitions):
        lg = b.rm.leader_partition("t", p).log
        data = b"".join(batch(i, 1_700_000_000_000 + i, value_size) for i in range(batches))
        lg.append_as_follower(data)
        lg.update_high_watermark(lg.log_end_offset)
        out[p] = data
    return out


# ---------------------------------------------------------------------------------------- gRPC path


def fetch_partition(partition: int, offset: int, max_bytes: int = 1 << 20) -> broker_pb2.FetchPartition:
    return broker_pb2.FetchPartition(topic="t", partition=partition, fetch_offset=offset,
                                     partition_max_bytes=max_bytes, current_leader_epoch=-1)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {}}, partitions=2) as b:
        yield b


def test_a_fetch_naming_a_partition_many_times_reads_and_answers_it_once(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    data = fill(broker, 2, 10, 100)
    reads: list[tuple[int, int]] = []
    real_read = Log.read

    def counted(self: Log, start_offset: int, *args: Any, **kwargs: Any) -> Any:
        reads.append((self.partition, start_offset))
        return real_read(self, start_offset, *args, **kwargs)

    monkeypatch.setattr(Log, "read", counted)
    req = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, partitions=(
        [fetch_partition(0, 0)] * 500 + [fetch_partition(1, 2)] + [fetch_partition(0, 7)]))
    resp = answer_of(asyncio.run(broker.service.Fetch(req, LoopbackCaller()))).to_message()
    # Kafka's fetch map: a partition keeps its first entry's place and takes its last entry's fields.
    assert sorted(reads) == [(0, 7), (1, 2)], "one read a partition"
    assert [(p.partition, p.error_code) for p in resp.partitions] == [(0, ErrorCode.NONE), (1, ErrorCode.NONE)]
    sizes = [len(batch(i, 0, 100)) for i in range(10)]
    assert resp.partitions[0].records == data[0][sum(sizes[:7]):]
    assert resp.partitions[1].records == data[1][sum(sizes[:2]):]


def test_a_list_offsets_naming_a_partition_twice_answers_invalid_request_for_each_entry(
        broker: InProcessBroker) -> None:
    fill(broker, 2, 3, 10)
    req = broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=[
        broker_pb2.ListOffsetsPartition(topic="t", partition=0, timestamp=ts, current_leader_epoch=-1)
        for ts in (0, 1_700_000_000_001, -1)] + [
        broker_pb2.ListOffsetsPartition(topic="t", partition=1, timestamp=1_700_000_000_001, current_leader_epoch=-1)])
    resp = asyncio.run(broker.service.ListOffsets(req, LoopbackCaller()))
    assert [(p.partition, p.error_code, p.offset, p.timestamp) for p in resp.partitions] == [
        (0, ErrorCode.INVALID_REQUEST, -1, -1)] * 3 + [(1, ErrorCode.NONE, 1, 1_700_000_000_001)]


# ---------------------------------------------------------------------------------------- Kafka listener
def frame(api_key: int, version: int, values: dict[str, Any], correlation_id: int = 7) -> bytes:
    cls = codec.request_schema(api_key, version)
    assert cls.__flexible__
    buf = io.BytesIO()
    entity_writer(HeaderV2)(buf, HeaderV2(request_api_key=api_key, request_api_version=version,
                                          correlation_id=correlation_id, client_id="slices-test"))
    entity_writer(cls)(buf, codec.build(cls, values))
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


def decode(api_key: int, version: int, data: bytes) -> Any:
    body, _ = entity_reader(codec.response_schema(api_key, version))(data, 5)  # correlation id, tagged fields
    return body


def fetch_frame(partitions: list[int], max_bytes: int = 1 << 20) -> bytes:
    return frame(FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": "t", "partitions": [
            {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20} for p in partitions]}]})


async def call(port: int, data: bytes, api_key: int, version: int) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        return decode(api_key, version, await reader.readexactly(size))
    finally:
        writer.close()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def listener_of(b: InProcessBroker) -> KafkaListener:
    lst = KafkaListener(types.SimpleNamespace(service=b.service, metadata_cache=b.service.cache),
                        KafkaListenerSpec("KAFKA", "127.0.0.1", 0, "PLAINTEXT"), {})
    await lst.start()
    return lst


PARTITIONS = 48
BATCH_VALUE = 200 * 1024  # a fetch answer of ~9.6 MiB: more than the sockets' buffers hold (4 MiB)
BUDGET = 40  # storage.file_records.slice_budget(), lowered for the test (a quarter of the descriptor limit)
ATTACKERS = 4


def send_buffer_max() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


@pytest.mark.skipif(send_buffer_max() > 4 << 20, reason="a socket's send buffer could take a whole answer here")
async def test_unread_fetch_answers_hold_at_most_the_slice_budget_and_fetches_still_get_their_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_records, "slice_budget", lambda: BUDGET, raising=False)
    with InProcessBroker(tmp_path, {"t": {}}, partitions=PARTITIONS) as b:
        data = fill(b, PARTITIONS, 1, BATCH_VALUE)
        answer_bytes = sum(len(d) for d in data.values())
        lst = await listener_of(b)
        loop = asyncio.get_running_loop()
        attackers: list[socket.socket] = []
        try:
            before = open_descriptors()
            # max_bytes: the answer, not more (a fetch reserves its max_bytes of the byte budgets while it reads)
            request = fetch_frame(list(range(PARTITIONS)), answer_bytes + (64 << 10))
            for _ in range(ATTACKERS):  # each sends a Fetch of every partition and never reads
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.setblocking(False)
                attackers.append(s)
                await loop.sock_connect(s, ("127.0.0.1", lst.port))
                await loop.sock_sendall(s, request)
            budget = b.service.capacity.budget
            # Every answer read and waiting to be written: the broker's byte budget holds them.
            await await_for(lambda: budget.used_bytes >= ATTACKERS * answer_bytes, 30,
                            lambda: f"{ATTACKERS} answers held ({budget.used_bytes} bytes of the budget)")
            held = open_descriptors() - before
            # Sockets (the attackers' both ends) and a few more; before, every partition of every answer
            # held a descriptor: 4 x 48 = 192.
            assert held <= BUDGET + 2 * ATTACKERS + 10, f"{held} descriptors held by {ATTACKERS} unread answers"
            assert file_records.open_slices() <= BUDGET

            # The budget is spent: another client's fetch is answered from memory, every record right.
            resp = await asyncio.wait_for(call(lst.port, request, FETCH, 12), 30)
            got = {p.partition_index: bytes(p.records) for t in resp.responses for p in t.partitions}
            assert got == data
            assert all(p.error_code == 0 for t in resp.responses for p in t.partitions)
        finally:
            for s in attackers:
                s.close()
            await lst.stop()
        await await_for(lambda: file_records.open_slices() == 0, 30,
                        lambda: f"slices closed once their connections went ({file_records.open_slices()} open)")


async def test_kafka_duplicates_fetch_once_and_list_offsets_refused(tmp_path: Path) -> None:
    with InProcessBroker(tmp_path, {"t": {}}, partitions=2) as b:
        data = fill(b, 2, 4, 100)
        lst = await listener_of(b)
        try:
            resp = await call(lst.port, fetch_frame([0, 1, 0, 0]), FETCH, 12)
            parts = [(p.partition_index, bytes(p.records)) for t in resp.responses for p in t.partitions]
            assert parts == [(0, data[0]), (1, data[1])], [(p, len(r)) for p, r in parts]

            resp = await call(lst.port, frame(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": "t", "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}
                                             for p, ts in ((0, 1_700_000_000_002), (1, -1), (0, -1))]}]}),
                LIST_OFFSETS, 7)
            answers = [(p.partition_index, p.error_code, p.offset) for t in resp.topics for p in t.partitions]
            assert answers == [(0, ErrorCode.INVALID_REQUEST, -1), (1, 0, 4), (0, ErrorCode.INVALID_REQUEST, -1)]
        finally:
            await lst.stop()
