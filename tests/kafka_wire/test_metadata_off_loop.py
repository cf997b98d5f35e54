"""A Metadata answer of thousands of topics is built and encoded off the broker's event loop, in request order.

A real KafkaListener in this process (real sockets) in front of a real BrokerService and MetadataCache holding
TOPICS one-partition topics (no logs: Metadata reads only the cache). Measured on a real broker: one all-topics
Metadata of 10,000 topics held the Kafka listener's event loop for 150-290 ms while its answer was built, and
~130 ms while it was encoded; every other client of the broker (produce, fetch, heartbeats) waited. Nothing here
is timed: the tests record which thread did the work, and hold the off-loop work on an event to show what the
loop serves meanwhile."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import struct
import threading
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from waiting import await_for

from broker.admission import ByteBudget, ClientLimits
from broker.kafka_wire import apis, codec
from broker.kafka_wire import server as kafka_server
from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec
from broker.metadata_cache import MetadataCache
from broker.service import BrokerService, Capacity
from proto import common_pb2, controller_pb2

TOPICS = 2000  # far above any on-loop threshold; a one-topic answer is far below it
LISTENER = "KAFKA_MD"
HOLD_S = 10.0  # how long held work waits for its release before going on anyway (the test then fails)


def _cache(topics: int) -> MetadataCache:
    cache = MetadataCache(1)
    update = controller_pb2.MetadataUpdate(version=1, is_snapshot=True, cluster_id="md-cluster", active_controller_id=1)
    update.brokers.add(node_id=1, incarnation_id="i1", broker_epoch=1, endpoints=[
        common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=1),
        common_pb2.Endpoint(name=LISTENER, host="127.0.0.1", port=2)])
    for i in range(topics):
        name, tid = f"t{i:05d}", f"{i:032x}"
        update.topics.add(name=name, topic_id=tid, partition_count=1)
        update.partitions.add(topic=name, topic_id=tid, partition=0, replicas=[1], isr=[1], leader=1, leader_epoch=0,
                              partition_epoch=0)
    cache.apply(update)
    return cache


@pytest.fixture(scope="module")
def metadata_cache() -> MetadataCache:
    return _cache(TOPICS)


@pytest.fixture()
async def listener(metadata_cache: MetadataCache) -> AsyncIterator[KafkaListener]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="md-test-io")
    capacity = Capacity(io=pool, replication=pool, limits=ClientLimits(100, 100), budget=ByteBudget(64 << 20))
    service = BrokerService(1, None, metadata_cache, None, None,  # type: ignore[arg-type]
                            defaults={"auto.create.topics.enable": "false"}, controller_endpoints=[],
                            capacity=capacity)
    broker = types.SimpleNamespace(service=service, metadata_cache=metadata_cache, group_servicer=None)
    lst = KafkaListener(broker, KafkaListenerSpec(LISTENER, "127.0.0.1", 0, "PLAINTEXT"),
                        {"kafka.request.timeout.ms": "60000"})
    await lst.start()
    try:
        yield lst
    finally:
        await lst.stop()
        pool.shutdown(wait=False, cancel_futures=True)


# ---- requests and answers ----
def _frame(api_key: int, version: int, values: dict[str, Any], correlation_id: int) -> bytes:
    cls = codec.request_schema(api_key, version)
    buf = io.BytesIO()
    entity_writer(HeaderV2)(buf, HeaderV2(request_api_key=api_key, request_api_version=version,
                                          correlation_id=correlation_id, client_id="md-test"))
    entity_writer(cls)(buf, codec.build(cls, values))
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def _all_topics(correlation_id: int) -> bytes:
    return _frame(apis.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False}, correlation_id)


def _one_topic(correlation_id: int) -> bytes:
    return _frame(apis.METADATA, 12, {"topics": [{"name": "t00007"}], "allow_auto_topic_creation": False},
                  correlation_id)


def _api_versions(correlation_id: int) -> bytes:
    return _frame(apis.API_VERSIONS, 3, {"client_software_name": "md-test", "client_software_version": "1"},
                  correlation_id)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    data = await reader.readexactly(size)
    return struct.unpack(">i", data[:4])[0], data


def _metadata_of(data: bytes) -> Any:
    body, _ = entity_reader(codec.response_schema(apis.METADATA, 12))(data, 5)  # correlation id + no tags
    return body


def _api_versions_of(data: bytes) -> Any:
    body, _ = entity_reader(codec.response_schema(apis.API_VERSIONS, 3))(data, 4)  # header v0 (KIP-511)
    return body


async def _ask(port: int, frame: bytes, local: str = "127.0.0.1") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    try:
        writer.write(frame)
        await writer.drain()
        return await _answer(reader)
    finally:
        writer.close()


def _recording(real: Callable[..., Any], calls: list[tuple[int, Any]], key: Callable[..., Any]) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((threading.get_ident(), key(*args)))
        return real(*args, **kwargs)
    return record


# ---- tests ----
async def test_a_large_metadata_answer_is_built_and_encoded_off_the_loop_and_a_small_one_encoded_on_it(
        listener: KafkaListener) -> None:
    loop_thread = threading.get_ident()
    large, small = _all_topics(1), _one_topic(2)  # made before recording: the test's own builds are not counted
    builds: list[tuple[int, Any]] = []
    encodes: list[tuple[int, Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        # codec.build recurses through the module's name: every entity of an answer is counted
        mp.setattr(codec, "build", _recording(codec.build, builds, lambda cls, values: cls.__name__))
        mp.setattr(codec, "encode_response", _recording(codec.encode_response, encodes,
                                                        lambda api_key, version, correlation_id, body: correlation_id))
        cid, data = await asyncio.wait_for(_ask(listener.port, large), 30)
        assert cid == 1
        cid, small_data = await asyncio.wait_for(_ask(listener.port, small), 30)
        assert cid == 2
    answer = _metadata_of(data)
    assert len(answer.topics) == TOPICS and all(len(t.partitions) == 1 for t in answer.topics)
    assert [(b.node_id, b.port) for b in answer.brokers] == [(1, 2)]  # this listener's endpoint
    assert [t.name for t in _metadata_of(small_data).topics] == ["t00007"]
    # Every entity of both answers (over 4,000 for the large one) was built off the loop: the loop's share does
    # not grow with the topics.
    on_loop = [name for thread, name in builds if thread == loop_thread]
    assert len(builds) > 2 * TOPICS and on_loop == [], (len(builds), on_loop[:5], len(on_loop))
    threads = {cid: thread for thread, cid in encodes}
    assert set(threads) == {1, 2}, encodes
    assert threads[1] != loop_thread, "the 2,000-topic answer was encoded on the event loop"
    assert threads[2] == loop_thread, "a one-topic answer is encoded on the loop (a thread hand-off costs more)"


async def test_pipelined_requests_are_answered_in_order_and_the_loop_serves_others_meanwhile(
        listener: KafkaListener) -> None:
    """Requests written back to back on one connection, a large Metadata first: while its encoding is held (off
    the loop), another connection is answered; then every answer of the first arrives, in request order."""
    held = threading.Event()
    release = threading.Event()
    finished: list[int] = []
    real = codec.encode_response

    def holding(api_key: int, version: int, correlation_id: int, body: Any) -> Any:
        if correlation_id == 10:
            held.set()
            release.wait(HOLD_S)
        out = real(api_key, version, correlation_id, body)
        finished.append(correlation_id)
        return out

    pipelined = _all_topics(10) + _api_versions(11) + _one_topic(12) + _all_topics(13) + _api_versions(14)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(codec, "encode_response", holding)
            writer.write(pipelined)  # all five at once, without waiting for an answer
            await writer.drain()
            await await_for(held.is_set, 30, "the large answer's encoding to start")
            cid, other = await asyncio.wait_for(_ask(listener.port, _api_versions(99)), 5)
            assert cid == 99 and _api_versions_of(other).error_code == 0
            assert 10 not in finished, "another client was answered only after the large answer was encoded"
            release.set()
            answers = [await asyncio.wait_for(_answer(reader), 30) for _ in range(5)]
    finally:
        release.set()
        writer.close()
    assert [cid for cid, _ in answers] == [10, 11, 12, 13, 14]
    assert len(_metadata_of(answers[0][1]).topics) == TOPICS
    assert _api_versions_of(answers[1][1]).error_code == 0
    assert [t.name for t in _metadata_of(answers[2][1]).topics] == ["t00007"]
    assert len(_metadata_of(answers[3][1]).topics) == TOPICS
    assert _api_versions_of(answers[4][1]).error_code == 0


async def test_one_address_has_one_large_answer_at_the_encode_pool_at_a_time(listener: KafkaListener) -> None:
    """Many connections of one address each asking for every topic would fill the listener's two worker threads
    (and the queue in front of them); as for large frames, an address has one large answer there at a time."""
    started: list[int] = []
    release = threading.Event()
    real = codec.encode_response

    def holding(api_key: int, version: int, correlation_id: int, body: Any) -> Any:
        if correlation_id in (20, 30):
            started.append(correlation_id)
            release.wait(HOLD_S)
        return real(api_key, version, correlation_id, body)

    writers = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(codec, "encode_response", holding)
            for _ in range(kafka_server.PARSE_WORKERS + 2):
                _, writer = await asyncio.open_connection("127.0.0.1", listener.port, local_addr=("127.0.0.2", 0))
                writer.write(_all_topics(20))
                writers.append(writer)
            await await_for(lambda: started, 30, "an attacker's answer at the encode pool")
            victim = asyncio.ensure_future(_ask(listener.port, _all_topics(30)))
            await await_for(lambda: len(started) >= kafka_server.PARSE_WORKERS, 30,
                            lambda: f"{started} encodings started")
            # The pool's two workers: one of the attacker's answers, and the victim's.
            assert sorted(started) == [20, 30], started
            release.set()
            cid, data = await asyncio.wait_for(victim, 30)
            assert cid == 30 and len(_metadata_of(data).topics) == TOPICS
    finally:
        release.set()
        for writer in writers:
            writer.close()


async def test_one_address_has_one_large_metadata_answer_on_the_io_threads_at_a_time(
        listener: KafkaListener) -> None:
    """The answers are built on the broker's io threads, which produce and fetch need: one address's connections
    have one large Metadata there at a time; its small ones are not held by that turn."""
    service = listener.broker.service
    started: list[str] = []
    release = threading.Event()
    real = service._metadata

    def holding(req: Any, listener_name: str, caller: Any) -> Any:
        if req.all_topics:
            started.append(caller.host)
            release.wait(HOLD_S)
        return real(req, listener_name, caller)

    writers = []
    try:
        service._metadata = holding
        for _ in range(4):
            _, writer = await asyncio.open_connection("127.0.0.1", listener.port, local_addr=("127.0.0.2", 0))
            writer.write(_all_topics(40))
            writers.append(writer)
        await await_for(lambda: started, 30, "an attacker's answer on the io threads")
        victim = asyncio.ensure_future(_ask(listener.port, _all_topics(50)))
        await await_for(lambda: len(started) >= 2, 30, lambda: f"answers started for {started}")
        # A small Metadata of the same address is answered meanwhile (not behind its large ones).
        cid, data = await asyncio.wait_for(_ask(listener.port, _one_topic(41), local="127.0.0.2"), 10)
        assert cid == 41 and [t.name for t in _metadata_of(data).topics] == ["t00007"]
        assert sorted(started) == ["127.0.0.1", "127.0.0.2"], started
        release.set()
        cid, data = await asyncio.wait_for(victim, 30)
        assert cid == 50 and len(_metadata_of(data).topics) == TOPICS
    finally:
        release.set()
        del service._metadata
        for writer in writers:
            writer.close()


def test_items_counts_array_elements_up_to_the_limit() -> None:
    def metadata(topics: int, replicas: int) -> Any:
        return codec.response(apis.METADATA, 12, {"topics": [
            {"name": f"t{i}", "partitions": [{"partition_index": 0, "replica_nodes": list(range(replicas)),
                                              "isr_nodes": list(range(replicas))}]} for i in range(topics)]})

    # each topic: itself, its partition, and the partition's replicas and ISR
    assert codec.items(metadata(3, 2), 1000) == 3 * (1 + 1 + 2 + 2)
    assert codec.items(metadata(0, 0), 1000) == 0
    assert codec.items(metadata(10_000, 1), 500) > 500  # stops at the first array past the limit
    assert codec.items(metadata(100, 3), 500) > 500  # nested elements count: 100 topics of RF 3 are 800
