"""A Kafka-protocol request naming thousands of partitions is converted for its service, and answered, off the
listener's event loop; one naming more than the cluster's bound is refused before any partition is converted.

A real KafkaListener in this process (real sockets, raw frames) in front of services that answer every partition
they are asked. Found by an audit: ListOffsets, OffsetForLeaderEpoch, OffsetCommit, OffsetDelete and DeleteRecords
made their protobuf requests and their answers on the loop, partition by partition, and a request may name twice
the cluster's partitions: a ListOffsets answer of 10,000 partitions held the loop 45 ms, of 100,000 0.7 s, while
every other client of the broker waited. And a long answer (a JoinGroup leader's, of 64 MiB of member metadata) is
handed to the socket a value at a time. Nothing here is timed: the tests record which thread did the work, and
what the transport held.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import threading
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kio.serial import entity_reader
from raw_frames import ask, frame

from broker.kafka_wire import admin_apis, apis, codec
from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec
from proto import broker_pb2, group_pb2

DELETE_RECORDS, OFFSET_FOR_LEADER_EPOCH, OFFSET_DELETE = 21, 23, 47
PARTITIONS = 600  # this cluster's partitions: a request may name 1,200
LARGE, SMALL = 600, 3  # above every on-loop threshold (codec.LARGE_ANSWER_ITEMS, 500), and far below


class FakeServices:
    """The broker's service and group coordinator as the listener calls them: every partition answered, and the
    thread each request's conversion ran on recorded by the test."""

    def __init__(self, pool: concurrent.futures.Executor) -> None:
        self.pool = pool
        self.asked: list[str] = []

    async def _io(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    run_on_pool = _io

    async def ListOffsets(self, req: broker_pb2.ListOffsetsRequest, ctx: Any) -> Any:  # noqa: N802
        self.asked.append("ListOffsets")
        return broker_pb2.ListOffsetsResponse(partitions=[broker_pb2.ListOffsetsPartitionResponse(
            topic=p.topic, partition=p.partition, offset=p.partition, timestamp=-1, leader_epoch=0)
            for p in req.partitions])

    async def OffsetsForLeaderEpoch(self, req: broker_pb2.OffsetsForLeaderEpochRequest, ctx: Any) -> Any:  # noqa: N802
        self.asked.append("OffsetsForLeaderEpoch")
        return broker_pb2.OffsetsForLeaderEpochResponse(partitions=[broker_pb2.OffsetForLeaderPartitionResult(
            topic=p.topic, partition=p.partition, leader_epoch=0, end_offset=p.partition) for p in req.partitions])

    async def DeleteRecords(self, req: broker_pb2.DeleteRecordsRequest, ctx: Any) -> Any:  # noqa: N802
        self.asked.append("DeleteRecords")
        return broker_pb2.DeleteRecordsResponse(partitions=[broker_pb2.DeleteRecordsPartitionResult(
            topic=p.topic, partition=p.partition, low_watermark=p.offset) for p in req.partitions])

    async def OffsetCommit(self, req: group_pb2.OffsetCommitRequest, ctx: Any) -> Any:  # noqa: N802
        self.asked.append("OffsetCommit")
        return group_pb2.OffsetCommitResponse()

    async def OffsetDelete(self, req: group_pb2.OffsetDeleteRequest, ctx: Any) -> Any:  # noqa: N802
        self.asked.append("OffsetDelete")
        return group_pb2.OffsetDeleteResponse()


@pytest.fixture()
async def listener() -> AsyncIterator[KafkaListener]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="off-loop-test")
    services = FakeServices(pool)
    broker = types.SimpleNamespace(
        node_id=1, service=services, group_servicer=services,
        metadata_cache=types.SimpleNamespace(counts=lambda: (1, PARTITIONS)),
        authorizer=types.SimpleNamespace(enabled=False),
        settings=types.SimpleNamespace(defaults={}))
    lst = KafkaListener(broker, KafkaListenerSpec("KAFKA", "127.0.0.1", 0, "PLAINTEXT"),
                        {"kafka.request.timeout.ms": "30000"})
    await lst.start()
    try:
        yield lst
    finally:
        await lst.stop()
        pool.shutdown(wait=False, cancel_futures=True)


def _list_offsets(n: int) -> dict[str, Any]:
    return {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
        {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1} for p in range(n)]}]}


def _offset_for_leader_epoch(n: int) -> dict[str, Any]:
    return {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
        {"partition": p, "current_leader_epoch": -1, "leader_epoch": 0} for p in range(n)]}]}


def _delete_records(n: int) -> dict[str, Any]:
    return {"timeout": 1000, "topics": [{"name": "t", "partitions": [
        {"partition_index": p, "offset": 5} for p in range(n)]}]}


def _offset_commit(n: int) -> dict[str, Any]:
    return {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": "t", "partitions": [
                {"partition_index": p, "committed_offset": 9, "committed_leader_epoch": -1,
                 "committed_metadata": None} for p in range(n)]}]}


def _offset_delete(n: int) -> dict[str, Any]:
    return {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": p} for p in range(n)]}]}


# api key, version, request values for n partitions, the module and function converting it, its answer's partitions
CASES = [
    (apis.LIST_OFFSETS, 7, _list_offsets, apis, "_list_offsets_request", lambda a: a.topics[0].partitions),
    (OFFSET_FOR_LEADER_EPOCH, 4, _offset_for_leader_epoch, apis, "_offsets_for_leader_epoch_request",
     lambda a: a.topics[0].partitions),
    (DELETE_RECORDS, 2, _delete_records, admin_apis, "_delete_records_request", lambda a: a.topics[0].partitions),
    (apis.OFFSET_COMMIT, 8, _offset_commit, apis, "_offset_commit_request", lambda a: a.topics[0].partitions),
    (OFFSET_DELETE, 0, _offset_delete, apis, "_offset_delete_request", lambda a: a.topics[0].partitions),
]


def _recording(real: Callable[..., Any], threads: list[int]) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)
    return record


@pytest.mark.parametrize(("api_key", "version", "values", "module", "convert", "partitions_of"), CASES,
                         ids=[c[4].strip("_").removesuffix("_request") for c in CASES])
async def test_a_large_request_is_converted_and_answered_off_the_loop_a_small_one_on_it(
        listener: KafkaListener, api_key: int, version: int, values: Callable[[int], dict[str, Any]], module: Any,
        convert: str, partitions_of: Callable[[Any], Any]) -> None:
    loop_thread = threading.get_ident()
    # The frames are made before recording: the test's own builds are not counted.
    for request, n in ((frame(api_key, version, values(LARGE)), LARGE), (frame(api_key, version, values(SMALL)), SMALL)):
        conversions: list[int] = []
        builds: list[int] = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(module, convert, _recording(getattr(module, convert), conversions))
            # codec.build recurses through the module's name: every entity of the answer is counted
            mp.setattr(codec, "build", _recording(codec.build, builds))
            answer = await ask(listener.port, request, api_key, version)
        assert answer is not None, "the listener closed the connection"
        assert [p.partition_index if hasattr(p, "partition_index") else p.partition
                for p in partitions_of(answer)] == list(range(n))
        assert len(conversions) == 1 and builds, (conversions, len(builds))
        on_loop = {t == loop_thread for t in conversions + builds}
        assert on_loop == {n == SMALL}, f"{n} partitions: conversion and answer on the loop: {on_loop}"


@pytest.mark.parametrize(("api_key", "version", "values", "module", "convert", "partitions_of"), CASES,
                         ids=[c[4].strip("_").removesuffix("_request") for c in CASES])
async def test_more_partitions_than_the_clusters_bound_are_refused_before_any_is_converted(
        listener: KafkaListener, api_key: int, version: int, values: Callable[[int], dict[str, Any]], module: Any,
        convert: str, partitions_of: Callable[[Any], Any]) -> None:
    conversions: list[int] = []
    oversized = frame(api_key, version, values(2 * PARTITIONS + 1))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, convert, _recording(getattr(module, convert), conversions))
        assert await ask(listener.port, oversized, api_key, version) is None, "an oversized request was answered"
    assert conversions == [] and listener.broker.service.asked == []


async def test_an_answers_long_values_go_to_the_socket_one_at_a_time(listener: KafkaListener) -> None:
    """A JoinGroup answer of 64 members' metadata of 1 MiB (within one address's share) to a client that does not
    read yet: the transport takes one long value at a time and the loop goes on meanwhile. Written in one go, the
    transport copied all 64 MiB into its buffer at once (53 ms of the loop, after 200-300 ms of encoding)."""
    from broker.kafka_wire import server

    metadata = bytes(1 << 20)
    answer = codec.response(apis.JOIN_GROUP, 7, {
        "throttle_time": 0, "error_code": 0, "generation_id": 1, "protocol_type": "consumer",
        "protocol_name": "range", "leader": "m0", "member_id": "m0",
        "members": [{"member_id": f"m{i}", "group_instance_id": None, "metadata": metadata} for i in range(64)]})

    async def join_group(req: Any, ctx: Any) -> Any:
        return answer

    buffered: list[int] = []
    real_drain = server._Connection._drain

    async def drain(self: Any) -> None:
        buffered.append(self.writer.transport.get_write_buffer_size())
        await real_drain(self)

    join = frame(apis.JOIN_GROUP, 7, {"group_id": "g", "session_timeout_ms": 10_000,
                                          "rebalance_timeout_ms": 10_000, "member_id": "", "group_instance_id": None,
                                          "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]})
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(listener.apis.handlers, apis.JOIN_GROUP, join_group)
        mp.setattr(server._Connection, "_drain", drain)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        try:
            writer.write(join)
            await writer.drain()
            for _ in range(200):  # until the transport is full and waits for this client to read
                if len(buffered) >= 2:
                    break
                await asyncio.sleep(0.01)
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))[0]
            data = await asyncio.wait_for(reader.readexactly(size), 30)
        finally:
            writer.close()
    decoded, _ = entity_reader(codec.response_schema(apis.JOIN_GROUP, 7))(data, 5)
    assert len(decoded.members) == 64 and all(m.metadata == metadata for m in decoded.members)
    # The transport never held much more than one value (plus what it held when the socket stopped taking them).
    assert buffered and max(buffered) <= 3 * len(metadata), [b >> 20 for b in buffered]


async def test_a_leaders_long_join_answer_is_sent_with_the_metadata_the_coordinator_holds(
        listener: KafkaListener) -> None:
    """The group servicer answers a leader's long JoinGroup with the members' metadata apart from the message
    (JoinAnswer, broker/bytes_apart.py): the listener sends those very bytes, never a copy out of a message."""
    from broker.group_service import JoinAnswer
    from broker.kafka_wire import server

    metadata = [bytes([i]) * (200_000 + i) for i in range(4)]
    answer = JoinAnswer(group_pb2.JoinGroupResponse(
        generation_id=3, protocol_name="range", leader="m0", member_id="m0",
        members=[group_pb2.JoinGroupMember(member_id=f"m{i}", group_instance_id=f"i{i}") for i in range(4)]))
    answer.values.update(enumerate(metadata))

    async def join_group(req: group_pb2.JoinGroupRequest, ctx: Any) -> JoinAnswer:
        return answer

    sent: list[Any] = []
    real_send = server._Connection._send

    async def send(self: Any, parts: list[Any]) -> None:
        sent.extend(parts)
        await real_send(self, parts)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(listener.broker.group_servicer, "JoinGroup", join_group, raising=False)
        mp.setattr(server._Connection, "_send", send)
        decoded = await ask(listener.port, frame(apis.JOIN_GROUP, 7, {
            "group_id": "g", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000, "member_id": "m0",
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}), apis.JOIN_GROUP, 7)
    assert (decoded.error_code, decoded.generation_id, decoded.leader) == (0, 3, "m0"), decoded
    assert [(m.member_id, m.group_instance_id, m.metadata) for m in decoded.members] == [
        (f"m{i}", f"i{i}", metadata[i]) for i in range(4)]
    assert all(any(part is md for part in sent) for md in metadata), "the metadata was copied on its way out"
