"""A small Produce is appended on the broker's event loop, and never waits there.

Handing the append to the executor and back costs an idle broker about as much as the rest
of an acks=1 request. So BrokerService appends a request of at most INLINE_APPEND_MAX_BYTES
on the loop when nothing would wait: its batches are uncompressed, the partition and log locks
are free, the log needs no segment roll, fsync or recompression, no batch is ahead of its
producer's sequence, and no topic is to be auto-created. Anything else goes to the executor as before, with nothing
changed by the attempt. Real BrokerService, ReplicaManager, Log and purgatories.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessBroker, LoopbackCaller
from lockwatch import WaitWatchingLock, held_by_another_thread
from waiting import await_for

from broker.service import INLINE_APPEND_MAX_BYTES, INLINE_APPEND_MAX_PARTITIONS, on_loop
from proto import broker_pb2
from proto.errors import ErrorCode
from replication.partition import LockBusy
from storage.log import Log, WouldBlock
from storage.log_config import LogConfig
from storage.record_batch import CODEC_LZ4, CODEC_NONE, RecordBatchBuilder


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The broker's client executor, counting the work handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2, thread_name_prefix="test-io")
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


class Broker(InProcessBroker):
    """Broker 1 leading topics t and lz4 (compression.type lz4), two partitions each, RF 1."""

    def __init__(self, tmp_path: Path) -> None:
        self.io: CountingExecutor
        super().__init__(tmp_path, {"t": {}, "lz4": {"compression.type": "lz4"}}, partitions=2,
                         executor=CountingExecutor())

    def produce(self, *parts: tuple[str, int, bytes], acks: int = 1) -> broker_pb2.ProduceResponse:
        return asyncio.run(self.service._produce(self.request(*parts, acks=acks)))

    @staticmethod
    def request(*parts: tuple[str, int, bytes], acks: int = 1) -> broker_pb2.ProduceRequest:
        return broker_pb2.ProduceRequest(acks=acks, timeout_ms=5000, partitions=[
            broker_pb2.ProducePartitionData(topic=t, partition=p, records=r) for t, p, r in parts])


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(tmp_path) as b:
        yield b


def batch(n: int = 1, value_bytes: int = 10, *, producer_id: int = -1, base_sequence: int = -1,
          codec: int = CODEC_NONE) -> bytes:
    b = RecordBatchBuilder(codec, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                           base_sequence=base_sequence)
    for i in range(n):
        b.append(1_700_000_000_000, None, bytes([i % 256]) * value_bytes)
    return b.build()


def log_end(broker: Broker, topic: str, partition: int) -> int:
    return broker.rm.leader_partition(topic, partition).log.log_end_offset


def test_a_small_produce_is_appended_on_the_loop(broker: Broker) -> None:
    resp = broker.produce(("t", 0, batch(3)), ("t", 1, batch(2)))
    assert [(p.error_code, p.base_offset) for p in resp.partitions] == [(0, 0), (0, 0)], resp
    assert broker.io.submitted == 0
    assert (log_end(broker, "t", 0), log_end(broker, "t", 1)) == (3, 2)


def test_a_large_produce_goes_to_the_executor(broker: Broker) -> None:
    records = batch(8, INLINE_APPEND_MAX_BYTES // 8)
    assert len(records) > INLINE_APPEND_MAX_BYTES
    resp = broker.produce(("t", 0, records))
    assert resp.partitions[0].error_code == 0, resp
    assert broker.io.submitted == 1 and log_end(broker, "t", 0) == 8


def test_a_produce_naming_many_partitions_goes_to_the_executor(broker: Broker) -> None:
    """Every entry costs the loop a lookup and an answer even when empty: a request of 100,000 empty
    ones (800 KB) held it for 2.6 s. Past INLINE_APPEND_MAX_PARTITIONS the appends leave the loop."""
    empties = [("t", 1, b"")] * INLINE_APPEND_MAX_PARTITIONS
    resp = broker.produce(("t", 0, batch(2)), *empties)
    assert resp.partitions[0].error_code == 0, resp.partitions[0]
    assert {p.error_code for p in resp.partitions[1:]} == {ErrorCode.INVALID_RECORD}  # no batch: Kafka's code
    assert broker.io.submitted == 1 and log_end(broker, "t", 0) == 2


def test_a_held_partition_lock_sends_that_partition_to_the_executor_without_stalling_the_loop(
        broker: Broker) -> None:
    p0 = broker.rm.leader_partition("t", 0)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with p0.lock:  # an append (or a follower's fetch) in progress on another thread
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)

    async def scenario() -> tuple[broker_pb2.ProduceResponse, int]:
        task = asyncio.ensure_future(broker.service._produce(
            broker.request(("t", 0, batch(2)), ("t", 1, batch(1)))))
        # The loop keeps running (this coroutine polls on it) while the executor waits for the lock.
        await await_for(lambda: broker.io.submitted == 1, 10, "partition 0 handed to the executor")
        assert not task.done()
        inline_end = log_end(broker, "t", 1)  # partition 1 was free: appended on the loop already
        release.set()
        return await asyncio.wait_for(task, 10), inline_end

    try:
        resp, inline_end = asyncio.run(scenario())
    finally:
        release.set()
        holder.join()
    assert [(p.error_code, p.base_offset) for p in resp.partitions] == [(0, 0), (0, 0)], resp
    assert inline_end == 1 and broker.io.submitted == 1 and log_end(broker, "t", 0) == 2


def test_a_batch_ahead_of_its_sequence_waits_in_the_executor_for_the_gap(broker: Broker) -> None:
    first, second = batch(2, producer_id=7, base_sequence=0), batch(1, producer_id=7, base_sequence=2)
    p0 = broker.rm.leader_partition("t", 0)
    with pytest.raises(LockBusy):  # ahead of sequence 0: not refused, not waited for on the loop
        broker.rm.append_records("t", 0, second, acks=1, timeout_ms=5000, blocking=False)
    assert p0.log.log_end_offset == 0

    async def scenario() -> list[broker_pb2.ProduceResponse]:
        ahead = asyncio.ensure_future(broker.service._produce(broker.request(("t", 0, second))))
        await await_for(lambda: broker.io.submitted == 1, 10, "the batch ahead handed to the executor")
        assert not ahead.done()  # waiting in the executor for sequences 0-1
        return [await broker.service._produce(broker.request(("t", 0, first))), await ahead]

    resp_first, resp_second = asyncio.run(scenario())
    assert (resp_first.partitions[0].error_code, resp_first.partitions[0].base_offset) == (0, 0)
    assert (resp_second.partitions[0].error_code, resp_second.partitions[0].base_offset) == (0, 2)


def test_refusals_made_on_the_loop_are_final(broker: Broker) -> None:
    corrupt = bytearray(batch(2))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches
    resp = broker.produce(("t", 0, bytes(corrupt)), ("nope", 0, batch(1)), ("__consumer_offsets", 0, batch(1)))
    assert [p.error_code for p in resp.partitions] == [
        ErrorCode.CORRUPT_MESSAGE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_TOPIC_EXCEPTION], resp
    assert log_end(broker, "t", 0) == 0


def test_a_topic_that_recompresses_goes_to_the_executor(broker: Broker) -> None:
    resp = broker.produce(("lz4", 0, batch(3)))
    assert resp.partitions[0].error_code == 0, resp
    assert broker.io.submitted == 1 and log_end(broker, "lz4", 0) == 3


def test_compressed_batches_are_decompressed_off_the_loop(broker: Broker) -> None:
    # A flood of small compressed batches (each up to the decompression cap) must not occupy the loop.
    resp = broker.produce(("t", 0, batch(50, 1000, codec=CODEC_LZ4)))
    assert resp.partitions[0].error_code == 0, resp
    assert broker.io.submitted == 1 and log_end(broker, "t", 0) == 50


def test_an_append_on_the_loop_never_waits_for_the_log_lock(broker: Broker) -> None:
    # Retention, compaction swaps and flushes take the log's lock without the partition's, and hold
    # it through unlinks and fsyncs. The loop's append try-acquires it once and re-enters it for
    # everything after, the HW move included (RF 1: the HW moves inside the call).
    p = broker.rm.leader_partition("t", 0)
    watched = WaitWatchingLock.install(p.log)
    info = p.append_as_leader(batch(3), 1, blocking=False)
    assert info.first_offset == 0 and p.log.high_watermark == 3
    assert watched.waits == [], "the loop's append waited for the log lock at:\n" + "\n".join(watched.waits)


def test_a_held_log_lock_sends_the_append_to_the_executor(broker: Broker) -> None:
    p = broker.rm.leader_partition("t", 0)
    with held_by_another_thread(p.log.lock):  # retention unlinking segments, say
        with pytest.raises(LockBusy):
            p.append_as_leader(batch(1), 1, blocking=False)
        assert (p.log.log_end_offset, p.log.high_watermark) == (0, 0), "a refused append must change nothing"
    resp = broker.produce(("t", 0, batch(1)))
    assert resp.partitions[0].error_code == 0 and log_end(broker, "t", 0) == 1, resp


# ---- the log's non-blocking append ----

def open_log(tmp_path: Path, **config: Any) -> Log:
    return Log.open(tmp_path / "t-0", LogConfig(**config))


def unchanged(lg: Log, append: Callable[[], Any]) -> None:
    end, size, files = lg.log_end_offset, lg.size_bytes, sorted(p.name for p in lg.dir.iterdir())
    with pytest.raises(WouldBlock):
        append()
    assert (lg.log_end_offset, lg.size_bytes, sorted(p.name for p in lg.dir.iterdir())) == (end, size, files)


def test_the_log_refuses_to_wait_for_its_lock(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    with held_by_another_thread(lg.lock):
        unchanged(lg, lambda: lg.append_as_leader(batch(1), 0, blocking=False))
    assert lg.append_as_leader(batch(1), 0, blocking=False).first_offset == 0
    lg.close()


def test_the_log_leaves_decompression_rolls_flushes_and_recompression_to_a_blocking_append(tmp_path: Path) -> None:
    records = batch(4, 100)
    rolling = open_log(tmp_path / "roll", segment_bytes=len(records) + 10)
    rolling.append_as_leader(records, 0)
    unchanged(rolling, lambda: rolling.append_as_leader(records, 0, blocking=False))
    assert rolling.append_as_leader(records, 0).first_offset == 4  # the blocking append rolls
    flushing = open_log(tmp_path / "flush", flush_messages=2)
    flushing.append_as_leader(batch(1), 0, blocking=False)  # 1 unflushed record: no flush due yet
    unchanged(flushing, lambda: flushing.append_as_leader(batch(1), 0, blocking=False))
    recompressing = open_log(tmp_path / "lz4", compression_type="lz4")
    unchanged(recompressing, lambda: recompressing.append_as_leader(batch(2), 0, blocking=False))
    plain = open_log(tmp_path / "plain")
    unchanged(plain, lambda: plain.append_as_leader(batch(2, codec=CODEC_LZ4), 0, blocking=False))
    assert plain.append_as_leader(batch(2, codec=CODEC_LZ4), 0).first_offset == 0
    for lg in (rolling, flushing, recompressing, plain):
        lg.close()


def test_a_completion_on_the_loop_thread_is_handed_over_without_the_self_pipe() -> None:
    # An acks=all produce is acknowledged by a follower fetch handled on the loop: its future completes
    # on the loop's thread, and waking the produce there needs no write to the loop's self-pipe
    # (asyncio.wrap_future always makes one). A completion from another thread still needs it.
    threadsafe: list[Any] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (threadsafe.append(a), original(*a, **k))[1]  # type: ignore[method-assign]
        here: concurrent.futures.Future = concurrent.futures.Future()
        waiting = on_loop(here)
        here.set_result("acknowledged")  # on the loop's thread
        assert await asyncio.wait_for(waiting, 5) == "acknowledged"
        assert threadsafe == [], threadsafe
        there: concurrent.futures.Future = concurrent.futures.Future()
        waiting = on_loop(there)
        threading.Thread(target=there.set_exception, args=(ValueError("timed out"),)).start()
        with pytest.raises(ValueError, match="timed out"):
            await asyncio.wait_for(waiting, 5)
        assert len(threadsafe) == 1, threadsafe
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(7)
        assert await asyncio.wait_for(on_loop(done), 5) == 7  # already complete: at once
        cancelled: concurrent.futures.Future = concurrent.futures.Future()
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(on_loop(cancelled), 5)

    asyncio.run(scenario())


class _CountedPartition:
    """A request's partition whose ``records`` count their reads: each read of a protobuf bytes field copies it
    out of the message (10 MiB: 1-8 ms of the event loop on the development machine)."""

    def __init__(self, topic: str, partition: int, records: bytes) -> None:
        self.topic, self.partition, self._records = topic, partition, records
        self.reads = 0

    @property
    def records(self) -> bytes:
        self.reads += 1
        return self._records


def test_a_requests_records_are_read_out_of_it_once(broker: Broker) -> None:
    # Before, a Produce read each partition's records up to four times on its way: its size for the byte budget,
    # the inline bound, the append, and the quota. Both paths here: inline (small) and the executor (large).
    small = _CountedPartition("t", 0, batch())
    large = _CountedPartition("t", 1, batch(1, INLINE_APPEND_MAX_BYTES + 1000))
    for part in (small, large):
        counted = type("CountedRequest", (), {"acks": 1, "timeout_ms": 5000, "partitions": [part], "transactional_id": ""})()
        resp = asyncio.run(broker.service._produce_call(counted, LoopbackCaller(), None))  # type: ignore[arg-type]
        assert [(p.error_code, p.base_offset) for p in resp.partitions] == [(ErrorCode.NONE, 0)], resp
        assert part.reads == 1, f"the records of {part.topic}-{part.partition} were read {part.reads} times"
    assert log_end(broker, "t", 0) == 1 and log_end(broker, "t", 1) == 1
