"""A client request may name at most max(1000, twice the cluster's) partitions, or topics for
Metadata and DescribeLogDirs; past that the call ends INVALID_ARGUMENT before anything is done.

Every entry costs the broker a lookup, checks and an answer entry even when it is empty or
unknown: a Produce naming 100,000 empty partitions (800 KB of the 100 MB a request may hold) held
the broker's event loop for 2.6 s, and a DeleteRecords of 100,000 unknown partitions took 16 s of
an I/O thread. No client needs to name a partition twice. Real BrokerService and ReplicaManager.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from inprocess import InProcessBroker, LoopbackCaller

from broker.admission import MIN_REQUEST_ENTRIES_BOUND
from proto import broker_pb2
from storage.record_batch import RecordBatchBuilder


class Aborted(Exception):
    pass


class Context(LoopbackCaller):
    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted(details)


def batch() -> bytes:
    b = RecordBatchBuilder()
    b.append(1_700_000_000_000, None, b"v")
    return b.build()


def produce(n: int) -> Any:
    # One real batch first: a refused request must not append it.
    return broker_pb2.ProduceRequest(acks=1, timeout_ms=1000, partitions=[
        broker_pb2.ProducePartitionData(topic="t", partition=0, records=batch() if i == 0 else b"")
        for i in range(n)])


REQUESTS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "Produce": ("Produce", produce),
    "Fetch": ("Fetch", lambda n: broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                                                         partitions=[broker_pb2.FetchPartition(
                                                             topic="t", partition=0, partition_max_bytes=1 << 10)] * n)),
    "ListOffsets": ("ListOffsets", lambda n: broker_pb2.ListOffsetsRequest(
        partitions=[broker_pb2.ListOffsetsPartition(topic="t", partition=0, timestamp=-1)] * n)),
    "OffsetsForLeaderEpoch": ("OffsetsForLeaderEpoch", lambda n: broker_pb2.OffsetsForLeaderEpochRequest(
        replica_id=-1, partitions=[broker_pb2.OffsetForLeaderPartition(topic="t", partition=0, leader_epoch=0)] * n)),
    "DeleteRecords": ("DeleteRecords", lambda n: broker_pb2.DeleteRecordsRequest(
        timeout_ms=1000, partitions=[broker_pb2.DeleteRecordsPartition(topic="t", partition=0, offset=0)] * n)),
    "Metadata": ("Metadata", lambda n: broker_pb2.MetadataRequest(topics=[f"n{i}" for i in range(n)])),
    "DescribeLogDirs": ("DescribeLogDirs", lambda n: broker_pb2.DescribeLogDirsRequest(
        topics=[f"n{i}" for i in range(n)])),
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {}}) as b:
        yield b


def call(b: InProcessBroker, rpc: str, request: Any) -> tuple[Any, Context]:
    ctx = Context()

    async def go() -> Any:
        try:
            return await getattr(b.service, rpc)(request, ctx)
        except Aborted:
            return None
    return asyncio.run(go()), ctx


def log_end(b: InProcessBroker) -> int:
    return b.rm.leader_partition("t", 0).log.log_end_offset


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_a_request_naming_too_many_entries_is_refused_and_changes_nothing(
        broker: InProcessBroker, name: str) -> None:
    rpc, make = REQUESTS[name]
    resp, ctx = call(broker, rpc, make(MIN_REQUEST_ENTRIES_BOUND + 1))
    assert resp is None and ctx.status is not None, f"{name} of {MIN_REQUEST_ENTRIES_BOUND + 1} entries answered"
    code, details = ctx.status
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"at most {MIN_REQUEST_ENTRIES_BOUND}" in details, details
    assert log_end(broker) == 0, "a refused request appended"


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_a_request_at_the_bound_is_answered(broker: InProcessBroker, name: str) -> None:
    rpc, make = REQUESTS[name]
    resp, ctx = call(broker, rpc, make(MIN_REQUEST_ENTRIES_BOUND))
    assert ctx.status is None and resp is not None, f"{name} at the bound refused: {ctx.status}"


def test_the_bound_grows_with_the_cluster(tmp_path: Path) -> None:
    """Twice the cluster's partitions when that is more: a client may name every partition it knows."""
    partitions = 700
    with InProcessBroker(tmp_path, {"t": {}}, partitions=partitions) as b:
        resp, ctx = call(b, "ListOffsets", broker_pb2.ListOffsetsRequest(partitions=[
            broker_pb2.ListOffsetsPartition(topic="t", partition=i % partitions, timestamp=-1) for i in range(1400)]))
        assert ctx.status is None and len(resp.partitions) == 1400
        resp, ctx = call(b, "ListOffsets", broker_pb2.ListOffsetsRequest(partitions=[
            broker_pb2.ListOffsetsPartition(topic="t", partition=0, timestamp=-1)] * 1401))
        assert ctx.status is not None and "at most 1400" in ctx.status[1], ctx.status
