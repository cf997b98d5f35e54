"""PartitionRecords: positions move like Kafka's (mid-batch starts, control batches, limits)."""

from __future__ import annotations

import random
import struct

import pytest
from crc32c import crc32c

from client.fetcher import PartitionRecords, PartitionState
from client.sender import stamp_producer_state
from client.types import ConsumerRecord, TopicPartition
from storage import record_decode
from storage.record_batch import (
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    CODEC_LZ4,
    MIN_BATCH_LENGTH,
    RecordBatchBuilder,
    _encode_varint,
    build_control_batch,
    decode_batch,
    iter_batches,
    read_header,
    set_log_append_time,
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
    assert (r.topic, r.partition, r.key, r.value, r.headers) == ("t", 3, b"k14", b"v14", (("h", b"x"),))


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


# ----------------------------------------------------------------------------- decoders
# PartitionRecords decodes with storage/record_decode.py: the C decoder when built, else
# the Python reference. Both must hand out exactly what the former decode_batch-based
# take() did (OldPartitionRecords below, kept as the model).


class OldPartitionRecords:
    """take() as it was before the C decoder: decode_batch, then one ConsumerRecord per Record."""

    def __init__(self, tp: TopicPartition, data: bytes) -> None:
        self.tp, self.data, self.batches = tp, data, iter_batches(data)
        self.current: list = []
        self.index = 0
        self.ts_type = 0

    def take(self, state: PartitionState, limit: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        topic, partition = self.tp
        while len(out) < limit:
            if self.index >= len(self.current):
                if not self._next_batch(state):
                    break
                continue
            position = state.position
            end = min(len(self.current), self.index + limit - len(out))
            chunk = self.current[self.index:end]
            self.index = end
            out.extend([ConsumerRecord(topic, partition, r.offset, r.timestamp, self.ts_type, r.key, r.value,
                                       tuple(r.headers)) for r in chunk if r.offset >= position])
            if out:
                state.position = max(position, out[-1].offset + 1)
        return out

    def _next_batch(self, state: PartitionState) -> bool:
        if self.current:
            last = self.current[-1].offset
            if state.position is not None and state.position <= last:
                state.position = last + 1
        self.current, self.index = [], 0
        for pos, header in self.batches:
            if state.position is not None and header.next_offset <= state.position:
                continue
            if header.attributes & ATTR_CONTROL:
                state.position = max(state.position or 0, header.next_offset)
                continue
            self.ts_type = 1 if header.attributes & ATTR_TIMESTAMP_TYPE else 0
            _, records = decode_batch(self.data, pos)
            self.current = records
            if not records:
                state.position = max(state.position or 0, header.next_offset)
                continue
            return True
        return False


@pytest.fixture(params=["c", "py"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and not record_decode.COMPILED:
        pytest.skip("storage._record_walk is not built")
    fn = record_decode.decode_records_c if request.param == "c" else record_decode.decode_records_py
    monkeypatch.setattr(record_decode, "decode_records", fn)
    return request.param


def forged(base_offset: int, deltas: list[int], *, attributes: int = 0, max_ts: int = 5000) -> bytes:
    """A batch (valid CRC) whose records have these offset deltas: a broker never serves such
    gaps or disorder inside a batch (it checks delta == index), but the decoders accept them."""
    section = b""
    for i, d in enumerate(deltas):
        body = (b"\x00" + _encode_varint(i * 10) + _encode_varint(d) + _encode_varint(2) + b"k%d" % (i % 10)
                + _encode_varint(3) + b"v%02d" % (i % 100) + b"\x00")
        section += _encode_varint(len(body)) + body
    count = len(deltas)
    lod = count - 1
    after = struct.pack(">hiqqqhii", attributes, lod, 1000, max_ts, -1, -1, -1, count)
    before = struct.pack(">qiib", base_offset, MIN_BATCH_LENGTH + len(section), -1, 2)
    return before + struct.pack(">I", crc32c(section, crc32c(after))) + after + section


def _cases() -> dict[str, bytes]:
    append_time = bytearray(batch(8, 4, CODEC_LZ4))
    set_log_append_time(append_time, 0, 99_999)
    return {
        "plain": batch(0, 5) + batch(5, 5, CODEC_LZ4) + batch(10, 3),
        # The cleaner keeps runs of consecutive records, each run its own batch: gaps between batches.
        "compacted gaps": forged(0, [0, 1, 2]) + forged(7, [0, 1]) + batch(15, 2) + batch(30, 1),
        "gaps inside batches": forged(0, [0, 2, 3]) + forged(5, [1, 4]) + batch(15, 2),
        "control and empty batches": batch(0, 2) + build_control_batch(
            True, producer_id=7, producer_epoch=0, timestamp_ms=5, base_offset=2) + forged(3, [0, 1, 2]),
        "log append time": batch(0, 8) + bytes(append_time) + batch(12, 2),
        "offsets out of order": forged(0, [0, 5, 2, 3, 9, 1, 6]) + batch(10, 3),
        "torn tail": batch(0, 4) + batch(4, 4)[:-2],
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_take_hands_out_what_it_did_before(decoder: str, case: str) -> None:
    data = _cases()[case]
    rng = random.Random(f"take-{case}")
    for trial in range(60):
        start = rng.choice([0, 0, rng.randrange(16)])
        limits = [rng.choice([1, 2, 3, 5, 100]) for _ in range(30)]
        new_state, old_state = PartitionState(position=start), PartitionState(position=start)
        new, old = PartitionRecords(TP, data), OldPartitionRecords(TP, data)
        for limit in limits:
            got, want = new.take(new_state, limit, None, None), old.take(old_state, limit)
            assert got == want and new_state.position == old_state.position, (case, trial, start, limit)
            assert all(type(r) is ConsumerRecord for r in got)


def test_log_append_time_and_deserializers(decoder: str) -> None:
    buf = bytearray(batch(0, 3, CODEC_LZ4))
    set_log_append_time(buf, 0, 77_777)
    state = PartitionState(position=1)
    part = PartitionRecords(TP, bytes(buf))
    recs = part.take(state, 10, lambda k: k.decode(), None)
    assert [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value) for r in recs] == [
        (1, 77_777, 1, "k1", b"v1"), (2, 77_777, 1, "k2", b"v2")]
    assert recs[0].headers == (("h", b"x"),) and state.position == 3


def test_consumer_records_are_named_tuples(decoder: str) -> None:
    (r,) = PartitionRecords(TP, batch(4, 1)).take(PartitionState(position=0), 10, None, None)
    assert r == ConsumerRecord("t", 3, 4, 1000, 0, b"k4", b"v4", (("h", b"x"),))
    assert r._fields == ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers")
    topic, partition, offset, *_ = r
    assert (topic, partition, offset) == (r[0], r[1], r[2]) == ("t", 3, 4)
    with pytest.raises(AttributeError):
        r.value = b"changed"  # type: ignore[misc]
    assert ConsumerRecord("t", 0, 0, 0, 0, None, None).headers == ()
