"""The perf tools' own bookkeeping (client/perf.py), without a cluster."""

from __future__ import annotations

import gc

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
