"""read_committed (Kafka's isolation level) on the fetch and list-offsets paths, over real logs: broker 1's real
ReplicaManager, BrokerService and Kafka listener in this process (tests/broker/inprocess.py).

- A read_committed fetch reads up to the last stable offset (the first offset of a transaction still open),
  a read_uncommitted one up to the high watermark; both answers carry the LSO.
- A read_committed answer names the aborted transactions overlapping what it returned (from the fetch offset
  to the end of the last batch returned), as Kafka computes them; a read_uncommitted one names none.
- ListOffsets latest is the LSO under read_committed.
- A read_committed fetch parked at the LSO is woken when the leader writes a marker (markers_written).
- The Kafka listener passes Fetch v4+ / ListOffsets v2+ isolation levels and answers what Kafka answers
  (a null aborted list for read_uncommitted).
"""

from __future__ import annotations

import asyncio
import io
import struct
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessBroker, LoopbackCaller
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer

from broker.fetch_answer import answer_of
from broker.kafka_wire import codec
from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec
from proto import broker_pb2
from proto.errors import ErrorCode
from replication.partition import Partition
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder, iter_batches

T = "t"
FETCH, LIST_OFFSETS = 1, 2


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {T: {}}) as b:
        yield b


def partition(b: InProcessBroker) -> Partition:
    return b.rm.leader_partition(T, 0)


def write(b: InProcessBroker, n: int = 1, *, pid: int = -1, ts: int = 1_700_000_000_000) -> int:
    """Append ``n`` records as the leader (transactional for a producer id ``pid`` >= 0, the transaction begun by
    its first batch), committed to the single replica at once; the batch's first offset."""
    p = partition(b)
    sequences = b.__dict__.setdefault("sequences", {})  # of this broker's log
    seq = sequences.get(pid, 0) if pid >= 0 else -1
    builder = RecordBatchBuilder(producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq,
                                 is_transactional=pid >= 0)
    for i in range(n):
        builder.append(ts + i, None, b"v%d" % i)
    if pid >= 0:
        sequences[pid] = seq + n
    with p.lock:
        info = p.log.append_as_leader(builder.build(), p.leader_epoch, transactional=pid >= 0)
    p.log.update_high_watermark(p.log.log_end_offset)  # the only replica
    return info.first_offset


def end_txn(b: InProcessBroker, pid: int, *, commit: bool) -> int:
    """The leader writes ``pid``'s marker, as the transaction coordinator's WriteTxnMarkers will: the marker's offset."""
    info = partition(b).append_marker_as_leader(pid, 0, commit, 0)
    b.rm.markers_written([(T, 0)])
    return info.first_offset


def fetch_request(offset: int, isolation: int, *, max_bytes: int = 1 << 20, max_wait_ms: int = 0,
                  min_bytes: int = 0) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
                                   isolation_level=isolation, partitions=[broker_pb2.FetchPartition(
                                       topic=T, partition=0, fetch_offset=offset, partition_max_bytes=max_bytes,
                                       current_leader_epoch=-1)])


async def fetch_async(b: InProcessBroker, req: broker_pb2.FetchRequest) -> broker_pb2.FetchPartitionResponse:
    resp = answer_of(await b.service.Fetch(req, LoopbackCaller())).to_message()
    (part,) = resp.partitions
    return part


def fetch(b: InProcessBroker, offset: int, isolation: int, **kw: Any) -> broker_pb2.FetchPartitionResponse:
    return asyncio.run(fetch_async(b, fetch_request(offset, isolation, **kw)))


def batch_offsets(records: bytes) -> list[int]:
    return [h.base_offset for _, h in iter_batches(records)]


def aborted(part: broker_pb2.FetchPartitionResponse) -> list[tuple[int, int]]:
    return [(a.producer_id, a.first_offset) for a in part.aborted_transactions]


def test_read_committed_stops_at_the_last_stable_offset_read_uncommitted_at_the_high_watermark(
        broker: InProcessBroker) -> None:
    write(broker, 2)                      # 0-1
    assert write(broker, 2, pid=10) == 2  # 2-3: transaction of producer 10, open
    write(broker, 1)                      # 4
    lg = partition(broker).log
    assert (lg.high_watermark, lg.last_stable_offset) == (5, 2)

    unc = fetch(broker, 0, 0)
    assert unc.error_code == ErrorCode.NONE
    assert batch_offsets(unc.records) == [0, 2, 4]
    assert (unc.high_watermark, unc.last_stable_offset, aborted(unc)) == (5, 2, [])

    com = fetch(broker, 0, 1)
    assert batch_offsets(com.records) == [0], "nothing at or past the open transaction"
    assert (com.high_watermark, com.last_stable_offset, aborted(com)) == (5, 2, [])
    at_lso = fetch(broker, 2, 1)
    assert (at_lso.error_code, at_lso.records, at_lso.last_stable_offset) == (ErrorCode.NONE, b"", 2)

    assert end_txn(broker, 10, commit=True) == 5
    assert (lg.high_watermark, lg.last_stable_offset) == (6, 6), "a lone replica's HW moves over the marker"
    com = fetch(broker, 2, 1)
    assert batch_offsets(com.records) == [2, 4, 5] and com.last_stable_offset == 6 and aborted(com) == []


def test_the_aborted_transactions_are_those_of_the_range_returned(broker: InProcessBroker) -> None:
    write(broker, 1, pid=1)                          # 0: producer 1, aborted below
    write(broker, 1, pid=2)                          # 1: producer 2, committed below
    assert end_txn(broker, 1, commit=False) == 2
    assert end_txn(broker, 2, commit=True) == 3
    assert write(broker, 2, pid=1) == 4              # 4-5: producer 1 again, aborted
    assert end_txn(broker, 1, commit=False) == 6
    write(broker, 1)                                 # 7
    lg = partition(broker).log
    assert lg.last_stable_offset == lg.high_watermark == 8

    whole = fetch(broker, 0, 1)
    assert batch_offsets(whole.records) == [0, 1, 2, 3, 4, 6, 7]
    assert aborted(whole) == [(1, 0), (1, 4)] and whole.last_stable_offset == 8
    # Only the first batch fits: [0, 1) overlaps the first aborted transaction, not the second.
    first = fetch(broker, 0, 1, max_bytes=1)
    assert batch_offsets(first.records) == [0] and aborted(first) == [(1, 0)]
    # From the COMMIT marker at 3, one batch: [3, 4) overlaps neither (the first ended at 2, the second begins at 4).
    marker_only = fetch(broker, 3, 1, max_bytes=1)
    assert batch_offsets(marker_only.records) == [3] and aborted(marker_only) == []
    # From inside the second aborted transaction (its marker at 6): named, though it began before the fetch offset.
    inside = fetch(broker, 5, 1)
    assert batch_offsets(inside.records) == [4, 6, 7] and aborted(inside) == [(1, 4)]
    assert aborted(fetch(broker, 7, 1)) == []
    assert aborted(fetch(broker, 8, 1)) == [], "nothing returned: nothing named (Kafka)"
    # read_uncommitted: the same records, no list.
    unc = fetch(broker, 0, 0)
    assert batch_offsets(unc.records) == [0, 1, 2, 3, 4, 6, 7] and aborted(unc) == [] and unc.last_stable_offset == 8


def test_a_read_uncommitted_fetch_reads_no_transaction_index(broker: InProcessBroker,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    write(broker, 1, pid=1)
    end_txn(broker, 1, commit=False)
    lg = partition(broker).log
    calls: list[tuple[int, int]] = []
    real = type(lg).aborted_transactions
    monkeypatch.setattr(type(lg), "aborted_transactions",
                        lambda self, start, upper: calls.append((start, upper)) or real(self, start, upper))
    assert batch_offsets(fetch(broker, 0, 0).records) == [0, 1] and calls == []
    assert aborted(fetch(broker, 0, 1)) == [(1, 0)] and calls == [(0, 2)], "the end of the records returned"


def test_an_unknown_isolation_level_is_an_invalid_request(broker: InProcessBroker) -> None:
    write(broker, 1)
    part = fetch(broker, 0, 2)
    assert part.error_code == ErrorCode.INVALID_REQUEST and part.records == b"" and part.last_stable_offset == -1
    resp = broker.rm.list_offsets(broker_pb2.ListOffsetsRequest(replica_id=-1, isolation_level=7, partitions=[
        broker_pb2.ListOffsetsPartition(topic=T, partition=0, timestamp=-1, current_leader_epoch=-1)]))
    assert resp.partitions[0].error_code == ErrorCode.INVALID_REQUEST


def list_offsets(b: InProcessBroker, ts: int, isolation: int) -> int:
    req = broker_pb2.ListOffsetsRequest(replica_id=-1, isolation_level=isolation, partitions=[
        broker_pb2.ListOffsetsPartition(topic=T, partition=0, timestamp=ts, current_leader_epoch=-1)])
    resp = asyncio.run(b.service.ListOffsets(req, LoopbackCaller()))
    (p,) = resp.partitions
    assert p.error_code == ErrorCode.NONE, p.error_message
    return p.offset


def test_list_offsets_latest_is_the_last_stable_offset_under_read_committed(broker: InProcessBroker) -> None:
    write(broker, 3)                                # 0-2, timestamps ...000 to ...002
    write(broker, 2, pid=4, ts=1_700_000_000_100)   # 3-4, open
    write(broker, 1, ts=1_700_000_000_200)          # 5
    assert (list_offsets(broker, -1, 0), list_offsets(broker, -1, 1)) == (6, 3)
    assert list_offsets(broker, -2, 1) == 0
    assert list_offsets(broker, 1_700_000_000_001, 1) == 1
    # Kafka's last fetchable offset bounds timestamp lookups too: nothing at or past the LSO is found.
    assert list_offsets(broker, 1_700_000_000_050, 0) == 3
    assert list_offsets(broker, 1_700_000_000_050, 1) == -1
    end_txn(broker, 4, commit=False)
    assert (list_offsets(broker, -1, 0), list_offsets(broker, -1, 1)) == (7, 7)


async def test_a_parked_read_committed_fetch_is_woken_by_a_marker(broker: InProcessBroker) -> None:
    write(broker, 1, pid=3)  # 0, open: the LSO stays at 0
    p = partition(broker)
    task = asyncio.create_task(fetch_async(broker, fetch_request(0, 1, max_wait_ms=20_000, min_bytes=1)))
    await asyncio.sleep(0.3)
    assert not task.done(), "parked at the LSO"
    start = time.monotonic()
    # The marker alone (the log's own call, as a coordinator may write it): nothing wakes the fetch yet.
    with p.lock:
        p.log.append_marker_as_leader(3, 0, True, 0, p.leader_epoch)
    await asyncio.sleep(0.3)
    assert not task.done()
    broker.rm.markers_written([(T, 0)])
    part = await asyncio.wait_for(task, 5)
    assert time.monotonic() - start < 5
    assert batch_offsets(part.records) == [0, 1] and part.last_stable_offset == 2 == p.log.high_watermark
    assert aborted(part) == []


async def test_a_parked_read_committed_fetch_is_woken_by_an_abort_and_told_of_it(broker: InProcessBroker) -> None:
    write(broker, 1)           # 0
    write(broker, 2, pid=8)    # 1-2, open
    task = asyncio.create_task(fetch_async(broker, fetch_request(1, 1, max_wait_ms=20_000, min_bytes=1)))
    await asyncio.sleep(0.3)
    assert not task.done()
    end_txn(broker, 8, commit=False)
    part = await asyncio.wait_for(task, 5)
    assert batch_offsets(part.records) == [1, 3] and aborted(part) == [(8, 1)]


def test_a_follower_serves_read_committed_consumers_up_to_its_own_last_stable_offset(
        broker: InProcessBroker, tmp_path: Path) -> None:
    leader = broker
    write(leader, 1)              # 0
    write(leader, 1, pid=6)       # 1, open
    flog = Log.open(tmp_path / "follower" / "t-0", LogConfig.from_overrides({}))
    try:
        follower = Partition(T, 0, T[0] * 32, flog, 2, broker_usable=lambda n: True)
        follower.make_follower(1, (1, 2), (1, 2), 1, 1)
        flog.append_as_follower(partition(leader).log.read(0, 1 << 20).records)
        flog.update_high_watermark(2)
        assert flog.last_stable_offset == 1
        data = follower.read_for_consumer(0, 1 << 20, 1, True, follower_read=True, read_committed=True)
        assert batch_offsets(data.records) == [0] and data.last_stable_offset == 1
        marker = end_txn(leader, 6, commit=False)
        flog.append_as_follower(partition(leader).log.read(marker, 1 << 20).records)
        flog.update_high_watermark(3)
        data = follower.read_for_consumer(0, 1 << 20, 1, True, follower_read=True, read_committed=True)
        assert batch_offsets(data.records) == [0, 1, 2] and data.aborted_transactions == [(6, 1)]
    finally:
        flog.close()


# ---------------------------------------------------------------------------------------- Kafka listener
def frame(api_key: int, version: int, values: dict[str, Any]) -> bytes:
    cls = codec.request_schema(api_key, version)
    buf = io.BytesIO()
    entity_writer(HeaderV2)(buf, HeaderV2(request_api_key=api_key, request_api_version=version, correlation_id=7,
                                          client_id="read-committed-test"))
    entity_writer(cls)(buf, codec.build(cls, values))
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


async def call(port: int, data: bytes, api_key: int, version: int) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        body, _ = entity_reader(codec.response_schema(api_key, version))(await reader.readexactly(size), 5)
        return body
    finally:
        writer.close()


def fetch_frame(isolation: int, offset: int = 0, *, session_epoch: int = -1, session_id: int = 0) -> bytes:
    return frame(FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": isolation,
        "session_id": session_id, "session_epoch": session_epoch, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": T, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})


async def test_the_kafka_listener_answers_what_kafka_answers(broker: InProcessBroker) -> None:
    write(broker, 1)                  # 0
    write(broker, 1, pid=5)           # 1
    end_txn(broker, 5, commit=False)  # 2
    write(broker, 1, pid=9)           # 3, open
    lst = KafkaListener(types.SimpleNamespace(service=broker.service, metadata_cache=broker.service.cache),
                        KafkaListenerSpec("KAFKA", "127.0.0.1", 0, "PLAINTEXT"), {})
    await lst.start()
    try:
        resp = await call(lst.port, fetch_frame(1), FETCH, 12)
        (part,) = resp.responses[0].partitions
        assert (part.error_code, part.high_watermark, part.last_stable_offset) == (0, 4, 3)
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(5, 1)]
        assert batch_offsets(bytes(part.records)) == [0, 1, 2]

        resp = await call(lst.port, fetch_frame(0), FETCH, 12)
        (part,) = resp.responses[0].partitions
        assert (part.high_watermark, part.last_stable_offset, part.aborted_transactions) == (4, 3, None)
        assert batch_offsets(bytes(part.records)) == [0, 1, 2, 3]

        # read_committed at the LSO: nothing, and an empty list (not null).
        resp = await call(lst.port, fetch_frame(1, 3), FETCH, 12)
        (part,) = resp.responses[0].partitions
        assert (bytes(part.records or b""), part.last_stable_offset, part.aborted_transactions) == (b"", 3, ())

        for isolation, latest in ((0, 4), (1, 3)):
            resp = await call(lst.port, frame(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": isolation,
                                                                "topics": [{"name": T, "partitions": [
                                                                    {"partition_index": 0, "current_leader_epoch": -1,
                                                                     "timestamp": -1}]}]}), LIST_OFFSETS, 7)
            assert resp.topics[0].partitions[0].offset == latest

        # An incremental session at the LSO: nothing new until the transaction commits (its marker moves the HW,
        # and the LSO with it, as in Kafka).
        resp = await call(lst.port, fetch_frame(1, 3, session_epoch=0), FETCH, 12)
        session = resp.session_id
        assert session != 0
        resp = await call(lst.port, fetch_frame(1, 3, session_id=session, session_epoch=1), FETCH, 12)
        assert resp.responses == (), "nothing new"
        end_txn(broker, 9, commit=True)
        resp = await call(lst.port, fetch_frame(1, 3, session_id=session, session_epoch=2), FETCH, 12)
        (part,) = resp.responses[0].partitions
        assert part.last_stable_offset == 5 and batch_offsets(bytes(part.records)) == [3, 4]
    finally:
        await lst.stop()
