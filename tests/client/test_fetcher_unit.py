"""PartitionRecords: positions move like Kafka's (mid-batch starts, control batches, limits)."""

from __future__ import annotations

from client.fetcher import PartitionRecords, PartitionState
from client.sender import stamp_producer_state
from client.types import TopicPartition
from storage.record_batch import (
    CODEC_LZ4,
    RecordBatchBuilder,
    build_control_batch,
    decode_batch,
    read_header,
    validate_batch,
)

TP = TopicPartition("t", 3)


def batch(base_offset: int, n: int, codec: int = 0) -> bytes:
    builder = RecordBatchBuilder(codec, base_offset=base_offset)
    for i in range(n):
        builder.append(1000 + i, b"k%d" % (base_offset + i), b"v%d" % (base_offset + i), [("h", b"x")])
    return builder.build()


def test_take_respects_limit_and_position_inside_a_batch() -> None:
    data = batch(10, 5, CODEC_LZ4) + batch(15, 5)
    state = PartitionState(position=12)  # fetched from inside the first (compressed) batch
    part = PartitionRecords(TP, data)
    first = part.take(state, 2, None, None)
    assert [r.offset for r in first] == [12, 13] and state.position == 14
    rest = part.take(state, 100, None, None)
    assert [r.offset for r in rest] == [14, 15, 16, 17, 18, 19]
    assert state.position == 20 and part.exhausted()
    r = rest[0]
    assert (r.topic, r.partition, r.key, r.value, r.headers) == ("t", 3, b"k14", b"v14", [("h", b"x")])


def test_control_batches_are_skipped_but_advance_the_position() -> None:
    data = batch(0, 2) + build_control_batch(True, producer_id=7, producer_epoch=0, timestamp_ms=5, base_offset=2)
    state = PartitionState(position=0)
    part = PartitionRecords(TP, data)
    assert [r.offset for r in part.take(state, 10, None, None)] == [0, 1]
    assert part.take(state, 10, None, None) == []
    assert state.position == 3, "the position must move past the control record"


def test_torn_tail_is_ignored() -> None:
    data = batch(0, 3) + batch(3, 3)[:-5]  # a fetch cut at max_bytes
    state = PartitionState(position=0)
    part = PartitionRecords(TP, data)
    assert [r.offset for r in part.take(state, 10, None, None)] == [0, 1, 2]
    assert state.position == 3


def test_deserializers_apply() -> None:
    state = PartitionState(position=0)
    part = PartitionRecords(TP, batch(0, 1))
    (r,) = part.take(state, 10, lambda k: k.decode(), lambda v: v.upper())
    assert r.key == "k0" and r.value == b"V0"


def test_stamp_producer_state_keeps_batch_valid() -> None:
    stamped = stamp_producer_state(batch(0, 3), 42, 7, 1000)
    header = validate_batch(stamped)  # CRC recomputed
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 7, 1000)
    assert read_header(stamped).record_count == 3
    assert [r.value for r in decode_batch(stamped)[1]] == [b"v0", b"v1", b"v2"]


def test_take_raw_returns_whole_batches_from_the_position() -> None:
    data = batch(0, 5) + batch(5, 5) + batch(10, 5) + batch(15, 5)[:-3]
    state = PartitionState(position=7)
    part = PartitionRecords(TP, data)
    raw = part.take_raw(state)
    headers = [read_header(raw, 0)]
    headers.append(read_header(raw, headers[0].size))
    assert [h.base_offset for h in headers] == [5, 10] and len(raw) == headers[0].size + headers[1].size
    assert state.position == 15, "the torn tail is not returned and the position stops before it"
    assert part.exhausted()
