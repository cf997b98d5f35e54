"""Produce requests to a topic that recompresses run on threads of their own.

A topic whose ``compression.type`` is a codec decompresses every batch produced in another codec
and compresses it again: CPU in proportion to the decompressed bytes, so a 1 KiB zstd batch that
inflates to 32 MiB costs the broker about a tenth of a second of gzip. Such requests run on
``num.recompression.threads``; the client requests' threads (``num.io.threads``) stay free for
fetches, metadata and every other produce. Each direction is shown with the other pool held:
real BrokerService, ReplicaManager and Log in this process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker
from waiting import await_for

from proto import broker_pb2
from storage.record_batch import CODEC_GZIP, CODEC_ZSTD, RecordBatchBuilder, read_header

ANSWER_DEADLINE_S = 30.0  # a produce that should go through; failing, it would wait for good


def zstd_request(topic: str, value: bytes = b"v" * 1000) -> broker_pb2.ProduceRequest:
    b = RecordBatchBuilder(CODEC_ZSTD)
    b.append(0, None, value)
    return broker_pb2.ProduceRequest(acks=1, timeout_ms=30_000, partitions=[
        broker_pb2.ProducePartitionData(topic=topic, partition=0, records=b.build())])


class Held:
    """Every thread of a pool busy until ``release``."""

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor, threads: int) -> None:
        self.gate = threading.Event()
        self.jobs = [pool.submit(self.gate.wait) for _ in range(threads)]

    def release(self) -> None:
        self.gate.set()
        concurrent.futures.wait(self.jobs)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    io = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-io")
    recompression = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-recompress")
    with InProcessBroker(tmp_path, {"gz": {"compression.type": "gzip"}, "asis": {}},
                         executor=io, recompression=recompression) as b:
        yield b
    recompression.shutdown()


def stored_codec(broker: InProcessBroker, topic: str) -> int:
    log = broker.rm.partition(topic, 0).log  # type: ignore[union-attr]
    data = log.read(0, 1 << 20).records
    return read_header(data, 0).compression


def test_recompressing_produce_waits_for_its_own_threads_while_other_requests_go_on(
        broker: InProcessBroker) -> None:
    held = Held(broker.service.capacity.recompression, 1)  # type: ignore[arg-type]

    async def scenario() -> None:
        recompressing = asyncio.ensure_future(broker.service._produce(zstd_request("gz")))
        # A compressed batch to a topic that keeps the producer's codec is appended on num.io.threads.
        other = await asyncio.wait_for(broker.service._produce(zstd_request("asis")), ANSWER_DEADLINE_S)
        assert other.partitions[0].error_code == 0, other
        # It waits in the held pool's queue (on the free threads it would have been appended by now).
        queue = broker.service.capacity.recompression._work_queue  # type: ignore[union-attr]
        await await_for(lambda: queue.qsize() == 1 or recompressing.done(), 10, "the produce queued")
        assert not recompressing.done(), "a recompressing produce must wait for num.recompression.threads"
        held.release()
        resp = await asyncio.wait_for(recompressing, ANSWER_DEADLINE_S)
        assert resp.partitions[0].error_code == 0 and resp.partitions[0].base_offset == 0, resp

    try:
        asyncio.run(scenario())
    finally:
        held.release()
    assert stored_codec(broker, "gz") == CODEC_GZIP, "the topic's codec, not the producer's"
    assert stored_codec(broker, "asis") == CODEC_ZSTD


def test_recompressing_produce_goes_on_while_the_client_request_threads_are_all_busy(
        broker: InProcessBroker) -> None:
    held = Held(broker.io, 2)  # type: ignore[arg-type]

    async def scenario() -> None:
        resp = await asyncio.wait_for(broker.service._produce(zstd_request("gz")), ANSWER_DEADLINE_S)
        assert resp.partitions[0].error_code == 0, resp

    try:
        asyncio.run(scenario())
    finally:
        held.release()
    assert stored_codec(broker, "gz") == CODEC_GZIP
