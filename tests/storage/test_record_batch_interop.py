"""Interop with an independent RecordBatch v2 codec: kafka-python's record module.

Both directions, every codec: batches built by kafka-python decode in Brook, and
batches built by Brook decode in kafka-python, with the same keys, values, headers,
timestamps, offsets, producer fields and CRC.
"""

from __future__ import annotations

import pytest
from kafka import codec as kafka_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from storage import record_batch as rb

CODECS = [rb.CODEC_NONE, rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD]
BASE_TS = 1_700_000_000_000

Row = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def sample_rows(n: int = 120) -> list[Row]:
    """Keys, None keys, tombstones, headers (with None values), shuffled timestamps.

    Values are compressible so kafka-python keeps the codec (it falls back to none
    when compression does not shrink the batch).
    """
    rows: list[Row] = []
    for i in range(n):
        ts = BASE_TS + (i * 37 % 101) - 50
        key = None if i % 4 == 0 else b"user-%d" % (i % 17)
        value = None if i % 9 == 0 else b'{"n": %d, "pad": "%s"}' % (i, b"abc" * (i % 40))
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers = [("trace-id", b"%016x" % i), ("empty", b""), ("none", None)]
        elif i % 3 == 1:
            headers = [("ümlaut-key", b"\x00\xff")]
        rows.append((ts, key, value, headers))
    return rows


def test_kafka_python_has_every_codec_backend() -> None:
    # The interop tests below must cover every codec, not skip one quietly.
    assert kafka_codec.has_gzip() and kafka_codec.has_snappy()
    assert kafka_codec.has_lz4() and kafka_codec.has_zstd()


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_batch_decodes_in_brook(codec: int) -> None:
    rows = sample_rows()
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=True,
        producer_id=123_456,
        producer_epoch=7,
        base_sequence=42,
        batch_size=1 << 22,
    )
    for offset, (ts, key, value, headers) in enumerate(rows):
        builder.append(offset, ts, key, value, headers)
    buf = bytes(builder.build())
    theirs = DefaultRecordBatch(buf)

    header = rb.validate_batch(buf)
    assert header.compression == codec, f"kafka-python wrote codec {header.compression}"
    assert (header.crc, header.producer_id, header.producer_epoch, header.base_sequence) == (
        theirs.crc,
        123_456,
        7,
        42,
    )
    assert header.is_transactional and not header.is_control
    assert (header.record_count, header.last_offset_delta) == (len(rows), len(rows) - 1)
    assert (header.base_timestamp, header.max_timestamp) == (rows[0][0], max(r[0] for r in rows))

    rb.assign_offsets(bytearray(buf), 0, 5000, 3)  # a copy: kafka-python's view stays as built
    _, records = rb.decode_batch(buf)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]
    expected = [(i, ts, key, value, headers) for i, (ts, key, value, headers) in enumerate(rows)]
    assert got == expected


@pytest.mark.parametrize("codec", CODECS)
def test_brook_batch_decodes_in_kafka_python(codec: int) -> None:
    rows = sample_rows()
    builder = rb.RecordBatchBuilder(
        codec, producer_id=99, producer_epoch=3, base_sequence=1000, is_transactional=False
    )
    for ts, key, value, headers in rows:
        builder.append(ts, key, value, headers)
    buf = bytearray(builder.build())
    rb.assign_offsets(buf, 0, 777, 12)  # as the leader would; kafka-python must still accept the CRC

    theirs = DefaultRecordBatch(bytes(buf))
    assert theirs.validate_crc(), "kafka-python rejected Brook's CRC"
    ours = rb.read_header(buf)
    assert (theirs.crc, theirs.base_offset, theirs.leader_epoch) == (ours.crc, 777, 12)
    assert theirs.compression_type == codec
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (99, 3, 1000)
    assert (theirs.records_count, theirs.last_offset_delta) == (len(rows), len(rows) - 1)
    assert (theirs.first_timestamp, theirs.max_timestamp) == (rows[0][0], max(r[0] for r in rows))
    assert not theirs.is_transactional and not theirs.is_control_batch
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]
    expected = [(777 + i, ts, key, value, headers) for i, (ts, key, value, headers) in enumerate(rows)]
    assert got == expected


def test_uncompressed_batches_are_byte_identical() -> None:
    rows = sample_rows(60)
    theirs = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=5,
        producer_epoch=1,
        base_sequence=9,
        batch_size=1 << 22,
    )
    # kafka-python writes partition leader epoch 0 where Java (and Brook) write -1.
    ours = rb.RecordBatchBuilder(
        producer_id=5, producer_epoch=1, base_sequence=9, is_transactional=True, partition_leader_epoch=0
    )
    for offset, (ts, key, value, headers) in enumerate(rows):
        theirs.append(offset, ts, key, value, headers)
        ours.append(ts, key, value, headers)
    expected = bytes(theirs.build())
    built = ours.build()
    first_difference = next((i for i, (a, b) in enumerate(zip(built, expected, strict=False)) if a != b), None)
    assert built == expected, f"lengths {len(built)}/{len(expected)}, first differing byte at {first_difference}"


def test_log_append_time_set_by_brook_is_read_by_kafka_python() -> None:
    builder = rb.RecordBatchBuilder(rb.CODEC_LZ4)
    for ts, key, value, headers in sample_rows(10):
        builder.append(ts, key, value, headers)
    buf = bytearray(builder.build())
    rb.set_log_append_time(buf, 0, BASE_TS + 10**6)
    theirs = DefaultRecordBatch(bytes(buf))
    assert theirs.validate_crc()
    assert theirs.timestamp_type == rb.TIMESTAMP_LOG_APPEND_TIME
    assert {r.timestamp for r in theirs} == {BASE_TS + 10**6}


def test_control_batch_is_read_by_kafka_python() -> None:
    buf = rb.build_control_batch(False, producer_id=8, producer_epoch=4, timestamp_ms=BASE_TS, coordinator_epoch=2)
    theirs = DefaultRecordBatch(buf)
    assert theirs.validate_crc() and theirs.is_control_batch and theirs.is_transactional
    [marker] = list(theirs)
    assert marker.abort and not marker.commit and marker.version == 0


@pytest.mark.parametrize("codec", [rb.CODEC_NONE, rb.CODEC_ZSTD])
def test_many_batches_both_ways(codec: int) -> None:
    # kafka-python's MemoryRecordsBuilder writes one batch; concatenate several as a log would hold them.
    # (Its offset= argument goes into the record deltas, not the base offset, which Kafka would
    # refuse; a producer's batches start at 0 and the leader assigns base offsets, as here.)
    theirs = bytearray()
    for i in range(3):
        mrb = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 20)
        for ts, key, value, headers in sample_rows(25):
            mrb.append(ts, key, value, headers)
        mrb.close()
        batch = bytearray(mrb.buffer())
        rb.assign_offsets(batch, 0, i * 25, 1)
        theirs += batch
    assert [h.base_offset for h in rb.validate_batches(theirs)] == [0, 25, 50]
    assert [r.offset for r in rb.decode_records(theirs)] == list(range(75))

    ours = bytearray()
    for i in range(3):
        builder = rb.RecordBatchBuilder(codec, base_offset=i * 25)
        for ts, key, value, headers in sample_rows(25):
            builder.append(ts, key, value, headers)
        ours += builder.build()
    records = MemoryRecords(bytes(ours))
    offsets = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        offsets.extend(r.offset for r in batch)
    assert offsets == list(range(75))
