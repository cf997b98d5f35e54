"""The perf tools' own bookkeeping (client/perf.py), without a cluster."""

from __future__ import annotations

import gc
import time

import pytest

from client import errors
from client.accumulator import BatchCompletion, RecordFuture
from client.perf import _settle, freeze_startup_objects, run_consume, run_produce
from client.types import ConsumerRecord, TopicPartition


def test_settle_keeps_what_is_in_flight_and_counts_each_failure_once() -> None:
    ok, failed, pending = (BatchCompletion("t", p) for p in range(3))
    ok.complete(10, -1, None)
    failed.complete(-1, -1, errors.RequestTimedOutError("gone"))
    futures = [RecordFuture(c, i, 0, -1, 3) for i, c in enumerate((ok, failed, pending, failed))]
    assert _settle(futures) == 2
    assert [f._completion for f in futures] == [pending]
    assert _settle(futures) == 0 and len(futures) == 1  # nothing counted twice
    pending.complete(-1, -1, errors.RequestTimedOutError("late"))
    assert _settle(futures) == 1 and futures == []


def test_freeze_moves_what_exists_out_of_the_collectors_sight() -> None:
    try:
        before = gc.get_freeze_count()
        freeze_startup_objects()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # the rest of the test run is collected as usual


class _TwoBatches:
    """What run_produce asks of a producer: five records in two batches, the second of which fails."""

    def __init__(self) -> None:
        self.batches = (BatchCompletion("t", 0), BatchCompletion("t", 1))
        self.sent = 0

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> RecordFuture:
        i, self.sent = self.sent, self.sent + 1
        return RecordFuture(self.batches[0 if i < 3 else 1], i if i < 3 else i - 3, 0, -1, len(value))

    def flush(self) -> None:
        self.batches[0].complete(100, -1, None)
        self.batches[1].complete(-1, -1, errors.RequestTimedOutError("expired"))


def test_produce_latencies_come_from_each_records_batch_and_failures_are_counted() -> None:
    """The tool keeps a send time per sampled record and one outcome per batch (not a future per record,
    which its own full collections would have to scan): every record gets its batch's completion."""
    producer = _TwoBatches()
    try:
        result = run_produce(producer, "t", 5, 10, -1)  # type: ignore[arg-type]
    finally:
        gc.unfreeze()  # run_produce freezes what exists, as a measuring process does
    assert result.errors == 2
    latencies = result.latencies_ms
    assert len(latencies) == 3 and all(0 <= ms < 60_000 for ms in latencies), latencies
    # One completion time for the batch: a record sent later waited less for it.
    assert latencies == sorted(latencies, reverse=True), latencies


def test_consume_counts_every_record_and_the_bytes_of_its_value() -> None:

    def rec(offset: int, value: bytes | None) -> ConsumerRecord:
        return ConsumerRecord("t", 0, offset, 0, 0, None, value)

    polls = [{TopicPartition("t", 0): [rec(0, b"abc"), rec(1, None), rec(2, b""), rec(3, b"defgh")]},
             {TopicPartition("t", 1): [rec(0, b"x" * 100)]}]

    class Consumer:
        def poll(self, timeout_ms: int, max_records: int) -> dict:
            return polls.pop(0) if polls else {}

    result = run_consume(Consumer(), 5, timeout_ms=1000)  # type: ignore[arg-type]
    assert (result.records, result.bytes) == (5, 3 + 5 + 100)


def test_each_acknowledged_batch_is_split_into_its_wait_in_the_producer_and_its_round_trip() -> None:
    """The latency of a produce is its batch's wait in the producer (linger.ms, a request slot, a retry) plus the
    request's round trip: printed per batch, as Kafka's record-queue-time and request-latency split it. A failed
    batch has no round trip to tell."""
    producer = _TwoBatches()
    ok, failed = producer.batches
    now = time.monotonic()
    ok.opened_at, ok.sent_at = now - 0.005, now - 0.003
    failed.opened_at, failed.sent_at = now - 0.005, now - 0.001
    try:
        result = run_produce(producer, "t", 5, 10, -1)  # type: ignore[arg-type]
    finally:
        gc.unfreeze()
    assert result.batch_wait_ms == [pytest.approx(2.0)], result.batch_wait_ms
    [trip] = result.round_trip_ms
    assert 3.0 <= trip < 60_000, trip
    line = result.batch_line()
    assert line is not None and line.startswith("1 batches: opened to sent") and "p50 2.00 ms" in line, line
    assert "ms 99th" not in line, "the bench reads the record p99 from the summary line's last 'ms 99th'"


def test_the_sender_stamps_each_attempt_on_the_batch_outcome() -> None:
    from client.accumulator import RecordAccumulator
    from client.cluster import ClusterClient
    from client.sender import Sender, SenderConfig

    acc = RecordAccumulator(batch_size=1 << 14, linger_ms=0, buffer_memory=1 << 20, compression=0, max_block_ms=200,
                            delivery_timeout_ms=30_000, retry_backoff_ms=10)
    future = acc.append(TopicPartition("t", 0), 1000, None, b"v", [], 64)
    cluster = ClusterClient("127.0.0.1:1", request_timeout_ms=100)
    sender = Sender(cluster, acc, SenderConfig(acks=-1, request_timeout_ms=100, max_request_size=1 << 20,
                                               max_in_flight=5, retries=3, retry_backoff_ms=10, idempotent=False))
    try:
        with acc.lock:
            [batch] = sender._drain_node(1, [TopicPartition("t", 0)])
            sender.in_flight_requests[1] = 1
        sender._send(1, [batch])  # broker 1 is unknown here: the attempt fails and the batch waits for a retry
        outcome = future.batch_outcome
        assert outcome.opened_at == batch.created > 0
        assert outcome.sent_at == batch.last_attempt >= outcome.opened_at, (outcome.sent_at, batch.last_attempt)
    finally:
        cluster.close()
