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
