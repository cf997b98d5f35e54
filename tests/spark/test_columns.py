"""Record batches -> Arrow: values, offsets, ranges, compression, headers, schema, corruption."""

from __future__ import annotations

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from proto import errors
from spark_source.columns import arrow_schema, decode_to_arrow, spark_schema
from storage.record_batch import (
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_ZSTD,
    TIMESTAMP_LOG_APPEND_TIME,
    RecordBatchBuilder,
    _encode_varint,
    build_control_batch,
    decode_records,
    set_log_append_time,
)


def _batch(base: int, n: int, codec: int = CODEC_NONE, headers: bool = False) -> bytes:
    b = RecordBatchBuilder(codec, base_offset=base)
    for i in range(n):
        key = None if i % 3 == 0 else f"k{base + i}".encode() * (1 + i % 40)
        value = None if i == 7 else b"v" * (i % 200) + bytes([i % 256])
        hdrs = [("h", f"{i}".encode()), ("n", None)] if headers and i % 2 else []
        b.append(1_700_000_000_000 + i * 300_000, key, value, hdrs)
    return b.build()


def _decode(buf: bytes, frm: int, until: int, headers: bool = False):  # type: ignore[no-untyped-def]
    return decode_to_arrow(buf, "tópic", 3, frm, until, arrow_schema(headers))


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_is_what_spark_expects(include_headers: bool) -> None:
    expected = to_arrow_schema(spark_schema(include_headers), timezone="UTC")
    assert arrow_schema(include_headers).equals(expected), (arrow_schema(include_headers), expected)


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4, CODEC_ZSTD])
@pytest.mark.parametrize("headers", [False, True])
def test_decode_matches_reference_decoder(codec: int, headers: bool) -> None:
    buf = _batch(100, 150, codec, headers=True) + _batch(250, 40, codec, headers=True)
    rb, res = _decode(buf, 100, 290, headers)
    assert res.records == 190 and res.next_offset == 290 and res.batches == 2
    reference = list(decode_records(buf))
    assert rb is not None and rb.schema.equals(arrow_schema(headers))
    assert rb.column("offset").to_pylist() == [r.offset for r in reference]
    assert rb.column("key").to_pylist() == [r.key for r in reference]
    assert rb.column("value").to_pylist() == [r.value for r in reference]
    assert [int(t.timestamp() * 1000) for t in rb.column("timestamp").to_pylist()] == [r.timestamp for r in reference]
    assert rb.column("timestampType").to_pylist() == [0] * 190
    assert rb.column("topic").to_pylist() == ["tópic"] * 190
    assert rb.column("partition").to_pylist() == [3] * 190
    if headers:
        want = [[{"key": k, "value": v} for k, v in r.headers] or None for r in reference]
        assert rb.column("headers").to_pylist() == want


def test_range_bounds_cut_inside_batches_and_torn_tail_is_left() -> None:
    whole = _batch(0, 10) + _batch(10, 10)
    rb, res = _decode(whole, 5, 13)
    assert rb is not None and rb.column("offset").to_pylist() == list(range(5, 13))
    assert res.next_offset == 20
    rb, res = _decode(whole[:-7], 0, 20)
    assert rb is not None and rb.column("offset").to_pylist() == list(range(10))
    assert res.next_offset == 10 and res.batches == 1
    rb, res = _decode(whole[:30], 0, 20)
    assert rb is None and res.batches == 0 and res.next_offset == 0


def test_control_batches_are_skipped_but_advance_the_position() -> None:
    control = build_control_batch(True, producer_id=5, producer_epoch=0, timestamp_ms=1, base_offset=10)
    buf = _batch(0, 10) + control + _batch(11, 3)
    rb, res = _decode(buf, 0, 100)
    assert rb is not None and rb.column("offset").to_pylist() == list(range(10)) + [11, 12, 13]
    assert res.next_offset == 14


def test_log_append_time_uses_batch_max_timestamp() -> None:
    b = RecordBatchBuilder(CODEC_NONE, base_offset=0)
    for i in range(3):
        b.append(1000 + i, None, b"x")
    buf = bytearray(b.build())
    set_log_append_time(buf, 0, 99_000)
    rb, _ = _decode(bytes(buf), 0, 3)
    assert rb is not None
    assert [int(t.timestamp() * 1000) for t in rb.column("timestamp").to_pylist()] == [99_000] * 3
    assert rb.column("timestampType").to_pylist() == [TIMESTAMP_LOG_APPEND_TIME] * 3


def test_corruption_is_detected() -> None:
    buf = bytearray(_batch(0, 5))
    buf[-3] ^= 0xFF
    with pytest.raises(errors.CorruptMessageError):
        _decode(bytes(buf), 0, 5)
    # A bad record inside a batch whose CRC is not checked still fails cleanly.
    good = bytearray(_batch(0, 5))
    good[61] = 0x7E  # first record's length varint: 63 -> overruns
    with pytest.raises(errors.CorruptMessageError):
        decode_to_arrow(bytes(good), "t", 0, 0, 5, arrow_schema(False), verify_crc=False)


@pytest.mark.parametrize("timestamp", [-(2**62), 2**62])
def test_a_timestamp_microseconds_cannot_hold_is_an_error_not_a_wrapped_value(timestamp: int) -> None:
    """Read as microseconds, -2^62 ms came out as 1970 and a later one far in the future, silently (found
    by an audit). Leaders refuse such timestamps now; a log written before may still hold one."""
    b = RecordBatchBuilder(CODEC_NONE, base_offset=0)
    b.append(timestamp, b"k", b"v", [])
    with pytest.raises(errors.CorruptMessageError, match="microseconds"):
        _decode(b.build(), 0, 1)


def _one_record_batch(base_timestamp: int, delta: int, *, log_append_time: int | None = None) -> bytes:
    """A batch of one record with any base timestamp and timestamp delta (RecordBatchBuilder refuses them)."""
    import struct

    from crc32c import crc32c

    body = b"\x00" + _encode_varint(delta) + _encode_varint(0) + _encode_varint(1) + b"k" + _encode_varint(1) + b"v" + _encode_varint(0)
    records = _encode_varint(len(body)) + body
    attributes = 0 if log_append_time is None else TIMESTAMP_LOG_APPEND_TIME << 3
    max_timestamp = base_timestamp if log_append_time is None else log_append_time
    after_crc = struct.pack(">hiqqqhii", attributes, 0, base_timestamp, max_timestamp, -1, -1, -1, 1)
    crc = crc32c(records, crc32c(after_crc))
    return struct.pack(">qiib", 0, 49 + len(records), 0, 2) + struct.pack(">I", crc) + after_crc + records


@pytest.mark.parametrize(
    ("base", "delta"),
    [(2**63 - 1, 2**63 - 1), (-(2**63) + 5, -(2**63) + 1), (2**63 - 1, 1)],
)
def test_a_timestamp_delta_overflowing_int64_is_corrupt_not_wrapped(base: int, delta: int) -> None:
    """numpy's int64 addition wrapped base + delta silently: 2^63-1 + 2^63-1 read as 1969-12-31T23:59:59.998 and
    -2^63+5 + -2^63+1 as 1970-01-01T00:00:00.006 (found by an audit). Only data stored before leaders
    validated timestamps can hold such a record."""
    with pytest.raises(errors.CorruptMessageError, match=rf"beyond 64 bits.*base timestamp {base} \+ delta {delta}"):
        _decode(_one_record_batch(base, delta), 0, 1)


def test_log_append_time_ignores_an_overflowing_delta() -> None:
    rb, _ = _decode(_one_record_batch(2**63 - 1, 2**63 - 1, log_append_time=1_700_000_000_000), 0, 1)
    assert rb is not None and [int(t.timestamp() * 1000) for t in rb.column("timestamp").to_pylist()] == [
        1_700_000_000_000
    ]


def _txn(base: int, n: int, pid: int) -> bytes:
    b = RecordBatchBuilder(CODEC_NONE, base_offset=base, producer_id=pid, producer_epoch=0, base_sequence=base,
                           is_transactional=True)
    for i in range(n):
        b.append(1_700_000_000_000 + i, None, f"v{base + i}".encode())
    return b.build()


def test_a_read_committed_answer_drops_aborted_transactions_and_markers() -> None:
    """The source fetches read_committed: the batches of the aborted transactions the broker names are dropped
    (Kafka's consumer rule, client.fetcher.AbortedFilter), markers never become rows, the next offset passes both."""
    marker = build_control_batch
    buf = (_txn(0, 2, 7) + _txn(2, 1, 8) + marker(False, producer_id=7, producer_epoch=0, timestamp_ms=1, base_offset=3)
           + marker(True, producer_id=8, producer_epoch=0, timestamp_ms=1, base_offset=4) + _txn(5, 2, 7)
           + marker(False, producer_id=7, producer_epoch=0, timestamp_ms=1, base_offset=7))
    rb, res = decode_to_arrow(buf, "t", 0, 0, 100, arrow_schema(False), aborted=[(7, 5), (7, 0)])
    assert rb is not None and rb.column("offset").to_pylist() == [2]
    assert rb.column("value").to_pylist() == [b"v2"]
    assert (res.records, res.next_offset, res.batches) == (1, 8, 6)
    rb, res = decode_to_arrow(buf, "t", 0, 0, 100, arrow_schema(False), aborted=[])
    assert rb is not None and rb.column("offset").to_pylist() == [0, 1, 2, 5, 6] and res.next_offset == 8
    rb, res = decode_to_arrow(buf, "t", 0, 0, 100, arrow_schema(False), aborted=[(7, 0), (8, 2), (7, 5)])
    assert rb is None and (res.records, res.next_offset, res.batches) == (0, 8, 6)
