"""DeleteRecords and cleanup.policy: as Kafka (Partition.deleteRecordsOnLeader), a topic whose policy does
not include ``delete`` (compact only) refuses it with POLICY_VIOLATION and keeps its records;
``compact,delete`` and ``delete`` topics allow it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker

from proto import broker_pb2, errors
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder

TOPICS = {"compacted": {"cleanup.policy": "compact"}, "both": {"cleanup.policy": "compact,delete"},
          "plain": {}}


def _produce(b: InProcessBroker, topic: str, n: int) -> None:
    builder = RecordBatchBuilder()
    for i in range(n):
        builder.append(i, f"k{i}".encode(), b"v")  # keyed: a compacted topic refuses null keys
    resp = asyncio.run(b.service._produce(broker_pb2.ProduceRequest(acks=1, timeout_ms=10_000, partitions=[
        broker_pb2.ProducePartitionData(topic=topic, partition=0, records=builder.build())])))
    assert resp.partitions[0].error_code == 0, resp


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, TOPICS) as b:
        for topic in TOPICS:
            _produce(b, topic, 5)
        yield b


def test_a_compact_only_topic_refuses_delete_records(broker: InProcessBroker) -> None:
    with pytest.raises(errors.BrookError) as exc:
        broker.rm.delete_records("compacted", 0, 3)
    assert exc.value.code == ErrorCode.POLICY_VIOLATION
    assert "compacted-0" in exc.value.message and "policy" in exc.value.message
    with pytest.raises(errors.BrookError) as exc:
        broker.rm.delete_records("compacted", 0, -1)  # to the high watermark: refused as well
    assert exc.value.code == ErrorCode.POLICY_VIOLATION
    assert broker.rm.low_watermark("compacted", 0) == 0  # nothing deleted


@pytest.mark.parametrize("topic", ["both", "plain"])
def test_topics_with_the_delete_policy_allow_it(broker: InProcessBroker, topic: str) -> None:
    assert broker.rm.delete_records(topic, 0, 3) == 3
    assert broker.rm.low_watermark(topic, 0) == 3


def test_a_partition_named_more_than_once_moves_for_none_of_its_copies(broker: InProcessBroker,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each copy of a partition moved its log start again and rewrote the log start checkpoint, which lists every
    # partition of the broker: 1,000 copies (13 KB) made 4,000 fsyncs and 1,000 log lines (audit). Copies are
    # INVALID_REQUEST, as ListOffsets answers them; the partitions named once move, with one checkpoint for all.
    checkpoints: list[int] = []
    write = broker.rm.log_manager.checkpoint_log_start_offsets
    monkeypatch.setattr(broker.rm.log_manager, "checkpoint_log_start_offsets",
                        lambda: (checkpoints.append(1), write())[1])
    request = broker_pb2.DeleteRecordsRequest(timeout_ms=0, partitions=[
        broker_pb2.DeleteRecordsPartition(topic="plain", partition=0, offset=offset) for offset in (1, 2, 3)] + [
        broker_pb2.DeleteRecordsPartition(topic="both", partition=0, offset=2)])
    resp = asyncio.run(broker.service._delete_records(request, None))
    got = [(p.topic, p.error_code, p.low_watermark) for p in resp.partitions]
    assert got == [("plain", ErrorCode.INVALID_REQUEST, -1)] * 3 + [("both", 0, 2)], got
    assert "named 3 times" in resp.partitions[0].error_message
    assert broker.rm.low_watermark("plain", 0) == 0  # no copy moved it
    assert broker.rm.low_watermark("both", 0) == 2
    assert len(checkpoints) == 1
