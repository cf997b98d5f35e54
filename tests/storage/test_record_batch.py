"""RecordBatch v2 codec: layout, varints, builder/decoder, header-only operations, bad input."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from proto import errors
from storage import compression
from storage import record_batch as rb

CODECS = [rb.CODEC_NONE, rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD]
BASE_TS = 1_700_000_000_000


def make_batch(n: int = 5, codec: int = rb.CODEC_NONE, **kwargs: object) -> bytes:
    builder = rb.RecordBatchBuilder(codec, **kwargs)
    for i in range(n):
        builder.append(BASE_TS + i, b"key-%d" % i, b"value-%d" % i * 10, [("h", b"%d" % i)])
    return builder.build()


def refresh_crc(buf: bytearray, pos: int = 0) -> None:
    """Recompute the CRC after a test tampers with CRC-covered bytes (to reach deeper checks)."""
    (length,) = struct.unpack_from(">i", buf, pos + 8)
    struct.pack_into(">I", buf, pos + 17, crc32c(bytes(buf[pos + 21 : pos + 12 + length])))


def set_count(buf: bytearray, count: int, last_offset_delta: int | None = None) -> None:
    struct.pack_into(">i", buf, 57, count)
    struct.pack_into(">i", buf, 23, count - 1 if last_offset_delta is None else last_offset_delta)
    refresh_crc(buf)


def empty_batch(last_offset_delta: int = -1, records: bytes = b"") -> bytes:
    after = struct.pack(">hiqqqhii", 0, last_offset_delta, -1, -1, 7, 1, 0, 0) + records
    before = struct.pack(">qiib", 10, 49 + len(records), 3, 2)
    return before + struct.pack(">I", crc32c(after)) + after


# --- varints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (-65, b"\x81\x01"),
        (8191, b"\xfe\x7f"),
        (8192, b"\x80\x80\x01"),
        (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
        (-(2**31), b"\xff\xff\xff\xff\x0f"),
        (2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (-(2**63), b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_edge_values_encode_and_decode(value: int, encoded: bytes) -> None:
    assert rb._encode_varint(value) == encoded
    # Decode with padding after it, as inside a record, and from an offset.
    decoded, end = rb._read_varint(b"\xaa" + encoded + b"\x00\x00", 1)
    assert (decoded, end) == (value, 1 + len(encoded)), f"decoded {decoded} ending at {end}"


def test_varint_fast_path_tables_match_general_decoder() -> None:
    for value in range(-9000, 9000):
        encoded = rb._encode_varint(value)
        assert rb._read_varint(encoded, 0) == (value, len(encoded))
        if len(encoded) == 1:
            assert rb._DEC1[encoded[0]] == value
        elif len(encoded) == 2:
            assert rb._DEC2[(encoded[0] & 0x7F) | (encoded[1] << 7)] == value
    for n in range(0, rb._ENC_TABLE_SIZE, 97):
        assert rb._ENC[n] == rb._encode_varint(n)


def test_varint_out_of_range_and_overlong_are_invalid_record() -> None:
    with pytest.raises(errors.InvalidRecordError):
        rb._encode_varint(2**63)
    with pytest.raises(errors.InvalidRecordError, match="longer"):
        rb._read_varint(b"\xff" * 11, 0)
    with pytest.raises(errors.InvalidRecordError, match="overflows"):
        rb._read_varint(b"\xff" * 9 + b"\x02", 0)  # a 10th byte above 1 carries bit 64


def test_extreme_timestamp_deltas_round_trip() -> None:
    builder = rb.RecordBatchBuilder()
    stamps = [0, 2**62, -(2**40), 1, 2**31 - 1, -(2**31)]
    for ts in stamps:
        builder.append(ts, None, b"v")
    header, records = rb.decode_batch(builder.build())
    assert [r.timestamp for r in records] == stamps
    assert header.base_timestamp == 0 and header.max_timestamp == 2**62


# --- layout and header ----------------------------------------------------------------------


def test_header_layout_is_kafka_v2() -> None:
    buf = make_batch(
        3, producer_id=42, producer_epoch=7, base_sequence=100, partition_leader_epoch=9, base_offset=1000
    )
    assert rb.BATCH_HEADER_SIZE == 61 and rb.LOG_OVERHEAD == 12
    assert struct.unpack_from(">q", buf, 0)[0] == 1000
    assert struct.unpack_from(">i", buf, 8)[0] == len(buf) - 12
    assert struct.unpack_from(">i", buf, 12)[0] == 9
    assert buf[16] == 2
    assert struct.unpack_from(">I", buf, 17)[0] == crc32c(buf[21:])
    h = rb.read_header(buf)
    assert (h.base_offset, h.batch_length, h.partition_leader_epoch, h.magic) == (1000, len(buf) - 12, 9, 2)
    assert (h.last_offset_delta, h.record_count, h.base_timestamp, h.max_timestamp) == (2, 3, BASE_TS, BASE_TS + 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (42, 7, 100, 102)
    assert (h.size, h.last_offset, h.next_offset) == (len(buf), 1002, 1003)
    assert (h.compression, h.timestamp_type, h.is_transactional, h.is_control) == (0, 0, False, False)


@pytest.mark.parametrize("codec", CODECS)
def test_attributes_carry_codec_timestamp_type_and_transactional(codec: int) -> None:
    buf = make_batch(
        2,
        codec,
        timestamp_type=rb.TIMESTAMP_LOG_APPEND_TIME,
        is_transactional=True,
        producer_id=5,
        producer_epoch=0,
        base_sequence=0,
    )
    h = rb.validate_batch(buf)
    assert h.attributes == codec | 0x08 | 0x10, f"attributes {h.attributes:#x}"
    assert (h.compression, h.timestamp_type, h.is_transactional) == (codec, rb.TIMESTAMP_LOG_APPEND_TIME, True)


def test_sequence_wraps_like_kafka() -> None:
    h = rb.read_header(make_batch(3, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2))
    assert h.last_sequence == 0
    assert rb.read_header(make_batch(1)).last_sequence == -1


# --- builder and decoder ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_keys_values_headers_timestamps(codec: int) -> None:
    builder = rb.RecordBatchBuilder(codec, producer_id=3, producer_epoch=1, base_sequence=10, base_offset=50)
    expected = []
    for i in range(200):
        key = None if i % 7 == 0 else (b"" if i % 11 == 0 else b"k%d" % i)
        value = None if i % 5 == 0 else b"x" * (i * 37 % 20000)
        headers = [("trace", b"t%d" % i), ("nil", None), ("ü", b"")] if i % 3 == 0 else []
        ts = BASE_TS + (i * 13 % 50) - 20  # out of order, negative deltas too
        assert builder.append(ts, key, value, headers) == i
        expected.append((50 + i, ts, key, value, headers))
    assert builder.record_count == 200
    buf = builder.build()
    header, records = rb.decode_batch(buf)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == expected
    assert header.max_timestamp == max(e[1] for e in expected)
    assert header.base_timestamp == expected[0][1]
    assert header.record_count == 200 and header.compression == codec


def test_size_estimate_is_exact_without_compression() -> None:
    builder = rb.RecordBatchBuilder()
    assert builder.size_estimate == rb.BATCH_HEADER_SIZE
    for i in range(300):
        builder.append(BASE_TS + i * 1000, b"k" * (i % 3), b"v" * (i * 50), [("a", None)] if i % 2 else ())
    assert builder.size_estimate == len(builder.build())


def test_large_fields_take_general_varint_path() -> None:
    builder = rb.RecordBatchBuilder()
    big = bytes(range(256)) * 300  # 76800 bytes: 3-byte length varints
    builder.append(BASE_TS, big, big, [("k" * 200, big)])
    _, [record] = rb.decode_batch(builder.build())
    assert record.key == big and record.value == big and record.headers == [("k" * 200, big)]


def test_builder_copies_mutable_inputs() -> None:
    value = bytearray(b"before")
    builder = rb.RecordBatchBuilder()
    builder.append(BASE_TS, memoryview(b"key"), value)
    value[:] = b"AFTER!"
    _, [record] = rb.decode_batch(builder.build())
    assert (record.key, record.value) == (b"key", b"before")


def test_builder_refuses_empty_build_reuse_and_unknown_options() -> None:
    with pytest.raises(errors.InvalidRecordError):
        rb.RecordBatchBuilder().build()
    builder = rb.RecordBatchBuilder()
    builder.append(BASE_TS, None, b"v")
    builder.build()
    with pytest.raises(errors.InvalidRecordError):
        builder.append(BASE_TS, None, b"v")
    with pytest.raises(errors.InvalidRecordError):
        rb.RecordBatchBuilder(7)
    with pytest.raises(errors.InvalidRecordError):
        rb.RecordBatchBuilder(timestamp_type=2)


def test_log_append_time_batch_reports_max_timestamp_for_every_record() -> None:
    buf = make_batch(4, timestamp_type=rb.TIMESTAMP_LOG_APPEND_TIME)
    header, records = rb.decode_batch(buf)
    assert {r.timestamp for r in records} == {header.max_timestamp}


def test_decode_records_spans_batches_skips_control_and_torn_tail() -> None:
    first = make_batch(3, base_offset=0)
    control = rb.build_control_batch(True, producer_id=9, producer_epoch=0, timestamp_ms=BASE_TS, base_offset=3)
    second = make_batch(2, base_offset=4)
    buf = first + control + second + make_batch(2, base_offset=6)[:-10]
    assert [r.offset for r in rb.decode_records(buf)] == [0, 1, 2, 4, 5]
    assert list(rb.decode_records(b"")) == []


def test_control_batches() -> None:
    for commit, control_type in ((True, rb.CONTROL_TYPE_COMMIT), (False, rb.CONTROL_TYPE_ABORT)):
        buf = rb.build_control_batch(
            commit, producer_id=11, producer_epoch=2, timestamp_ms=BASE_TS, coordinator_epoch=5
        )
        header, [record] = rb.decode_batch(buf)
        assert header.is_control and header.is_transactional, f"attributes {header.attributes:#x}"
        assert (header.producer_id, header.producer_epoch) == (11, 2)
        assert record.key == struct.pack(">hh", 0, control_type)
        assert rb.parse_control_record(record) == (control_type, 5)
    with pytest.raises(errors.InvalidRecordError):
        rb.parse_control_record(rb.Record(0, 0, b"\x00", None, []))


# --- empty batches ---------------------------------------------------------------------------


def test_empty_batch_rules() -> None:
    # As Kafka's cleaner leaves them: count 0, last offset delta kept, no record bytes.
    for delta in (-1, 4):
        buf = empty_batch(delta)
        h = rb.validate_batch(buf)
        assert (h.record_count, h.next_offset) == (0, 10 + delta + 1)
        assert rb.decode_batch(buf) == (h, [])
        with pytest.raises(errors.InvalidRecordError):
            rb.validate_batch(buf, allow_empty=False)  # a produced batch must hold records
        with pytest.raises(errors.InvalidRecordError):
            rb.validate_batches(buf, allow_empty=False)
    with pytest.raises(errors.CorruptMessageError, match="carries"):
        rb.validate_batch(empty_batch(-1, records=b"\x0e\x00\x00\x00\x01\x01\x00\x00"))
    with pytest.raises(errors.CorruptMessageError, match="last offset delta"):
        rb.validate_batch(empty_batch(-2))


# --- header-only operations -------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_assign_offsets_keeps_crc_valid(codec: int) -> None:
    original = make_batch(4, codec)
    buf = bytearray(original)
    rb.assign_offsets(buf, 0, 123_456_789_012, 17)
    assert buf[12 + 4 :] == original[12 + 4 :], "bytes other than base offset and leader epoch changed"
    h = rb.validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch, h.crc) == (123_456_789_012, 17, rb.read_header(original).crc)
    assert [r.offset for r in rb.decode_batch(buf)[1]] == [123_456_789_012 + i for i in range(4)]


def test_assign_offsets_in_place_on_memoryview_of_many_batches() -> None:
    buf = bytearray(make_batch(2) + make_batch(3) + make_batch(1))
    view = memoryview(buf)
    next_offset = 100
    for pos, h in list(rb.iter_batches(buf)):
        rb.assign_offsets(view, pos, next_offset, 4)
        next_offset += h.record_count
    view.release()
    headers = rb.validate_batches(buf)
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(100, 4), (102, 4), (105, 4)]


@pytest.mark.parametrize("codec", [rb.CODEC_NONE, rb.CODEC_ZSTD])
def test_set_log_append_time_recomputes_crc(codec: int) -> None:
    prefix = make_batch(1)
    buf = bytearray(prefix + make_batch(3, codec))
    pos = len(prefix)
    before = rb.read_header(buf, pos)
    rb.set_log_append_time(buf, pos, BASE_TS + 999_999)
    h = rb.validate_batch(buf, pos)
    assert h.crc != before.crc
    assert h.timestamp_type == rb.TIMESTAMP_LOG_APPEND_TIME and h.compression == codec
    assert (h.max_timestamp, h.base_timestamp) == (BASE_TS + 999_999, before.base_timestamp)
    assert {r.timestamp for r in rb.decode_batch(buf, pos)[1]} == {BASE_TS + 999_999}
    assert rb.validate_batch(buf, 0) == rb.read_header(prefix)  # the batch before is untouched


def test_iter_batches_walks_headers_and_stops_at_torn_tail() -> None:
    a, b = make_batch(2), make_batch(3, base_offset=2)
    full = a + b
    positions = [pos for pos, _ in rb.iter_batches(full)]
    assert positions == [0, len(a)]
    for cut in (1, 30, 61, len(b) - 1):  # partial header or partial body after a complete batch
        assert [pos for pos, _ in rb.iter_batches(full[: len(full) - len(b) + cut])] == [0]
    assert [pos for pos, _ in rb.iter_batches(full, len(a))] == [len(a)]
    corrupted = bytearray(full)
    corrupted[len(a) + 30] ^= 0xFF  # CRC-covered byte: iter_batches does not check CRCs
    assert len(list(rb.iter_batches(corrupted))) == 2
    corrupted[len(a) + 16] = 1
    with pytest.raises(errors.CorruptMessageError, match="magic"):
        list(rb.iter_batches(corrupted))
    short = bytearray(full)
    struct.pack_into(">i", short, len(a) + 8, 10)
    with pytest.raises(errors.CorruptMessageError, match="minimum"):
        list(rb.iter_batches(short))


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("offset_from_start", [21, 22, 23, 30, 40, 50, 57, 60, 61, 100, -1])
def test_flipped_byte_in_crc_region_is_corrupt(offset_from_start: int) -> None:
    buf = bytearray(make_batch(5))
    buf[offset_from_start] ^= 0x01
    with pytest.raises(errors.CorruptMessageError):
        rb.validate_batch(buf)
    with pytest.raises(errors.CorruptMessageError):
        rb.decode_batch(buf)


def test_crc_mismatch_message_names_it() -> None:
    buf = bytearray(make_batch(2, rb.CODEC_LZ4))
    buf[-3] ^= 0x40
    with pytest.raises(errors.CorruptMessageError, match="CRC mismatch"):
        rb.validate_batches(bytes(buf))


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_wrong_magic_is_corrupt(magic: int) -> None:
    buf = bytearray(make_batch(1))
    buf[16] = magic
    for fn in (rb.read_header, rb.validate_batch, rb.decode_batch, rb.validate_batches):
        with pytest.raises(errors.CorruptMessageError, match="magic"):
            fn(buf)


def test_length_field_too_big_too_small_or_below_minimum() -> None:
    good = make_batch(3)
    too_big = bytearray(good)
    struct.pack_into(">i", too_big, 8, len(good))  # claims 12 bytes more than present
    with pytest.raises(errors.CorruptMessageError, match="truncated"):
        rb.validate_batch(too_big)
    too_small = bytearray(good)
    struct.pack_into(">i", too_small, 8, len(good) - 12 - 5)  # last 5 bytes fall outside
    with pytest.raises(errors.CorruptMessageError):
        rb.validate_batch(too_small)
    with pytest.raises(errors.CorruptMessageError):
        rb.validate_batches(too_small)
    for length in (-1, 0, 48):
        tiny = bytearray(good)
        struct.pack_into(">i", tiny, 8, length)
        with pytest.raises(errors.CorruptMessageError, match="minimum"):
            rb.validate_batch(tiny)


def test_record_count_mismatch_is_corrupt() -> None:
    # Header count disagrees with the last offset delta.
    buf = bytearray(make_batch(3))
    set_count(buf, 4, last_offset_delta=2)
    with pytest.raises(errors.CorruptMessageError, match="last offset delta"):
        rb.validate_batch(buf)
    # Header self-consistent and CRC valid, but the records present disagree.
    for claimed in (2, 4):
        for codec in (rb.CODEC_NONE, rb.CODEC_GZIP):
            buf = bytearray(make_batch(3, codec))
            set_count(buf, claimed)
            rb.validate_batch(buf)  # header-only checks cannot see it
            with pytest.raises(errors.CorruptMessageError, match="declares"):
                rb.decode_batch(buf)
    buf = bytearray(make_batch(3))
    set_count(buf, -1, last_offset_delta=-2)
    with pytest.raises(errors.CorruptMessageError, match="negative"):
        rb.validate_batch(buf)
    buf = bytearray(make_batch(1))
    set_count(buf, 1_000_000)  # cannot fit: refused from the header alone
    with pytest.raises(errors.CorruptMessageError, match="cannot fit"):
        rb.validate_batch(buf)


def test_truncated_input_is_corrupt() -> None:
    good = make_batch(3)
    for cut in (0, 1, 16, 60, 61, len(good) - 1):
        with pytest.raises(errors.CorruptMessageError):
            rb.validate_batch(good[:cut])
        with pytest.raises(errors.CorruptMessageError):
            rb.decode_batch(good[:cut])
    with pytest.raises(errors.CorruptMessageError):
        rb.validate_batches(good + good[:-1])
    with pytest.raises(errors.CorruptMessageError, match="truncated"):
        rb.decode_batch(good[:-1], verify_crc=False)


def test_validate_batches_refuses_trailing_garbage_and_empty_input() -> None:
    good = make_batch(2)
    assert len(rb.validate_batches(good + good)) == 2
    for tail in (b"\x00", b"\x00" * 61, b"garbage" * 20):
        with pytest.raises(errors.CorruptMessageError):
            rb.validate_batches(good + tail)
    with pytest.raises(errors.CorruptMessageError, match="empty"):
        rb.validate_batches(b"")


def test_oversized_batch_is_message_too_large() -> None:
    buf = make_batch(10)
    assert rb.validate_batch(buf, max_batch_bytes=len(buf)).size == len(buf)
    with pytest.raises(errors.MessageTooLargeError):
        rb.validate_batch(buf, max_batch_bytes=len(buf) - 1)
    with pytest.raises(errors.MessageTooLargeError):
        rb.validate_batches(make_batch(1) + buf, max_batch_bytes=len(buf) - 1)
    # The size comes from the header: a truncated oversized batch is still too large.
    with pytest.raises(errors.MessageTooLargeError):
        rb.validate_batch(buf[:100], max_batch_bytes=99)


@pytest.mark.parametrize("codec_bits", [5, 6, 7])
def test_unknown_codec_is_corrupt(codec_bits: int) -> None:
    buf = bytearray(make_batch(1))
    struct.pack_into(">h", buf, 21, codec_bits)
    refresh_crc(buf)
    with pytest.raises(errors.CorruptMessageError, match="codec"):
        rb.validate_batch(buf)


def _single_record_batch(record_body: bytes) -> bytearray:
    """A one-record batch whose record is exactly ``record_body`` (after its length varint)."""
    buf = bytearray(make_batch(1))
    del buf[61:]
    buf += rb._encode_varint(len(record_body)) + record_body
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    refresh_crc(buf)
    return buf


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\x00\x00\x00\x03\x00\x02v\x00", "key length -2"),
        (b"\x00\x00\x00\x00\x05\x00", "value length -3"),
        (b"\x00\x00\x00\x00\x02v\x00\x00\x00", "length longer than fields"),
        (b"\x00\x00\x00\x06kk\x00\x00", "key overruns the record"),
        (b"\x00\x00\x00\x01\x01\x02\x04\xff\xfe\x01", "header key not UTF-8"),
        (b"\x00\x00\x00\x01\x01\x02\x02a\x03", "header value length -2"),
        (b"\x00\x00\x00\x01\x01\x02\x02a\x10", "header value overruns"),
        (b"\x00\x00\x00\x01\x01\x7f", "header count -64"),
        (b"\x00\x00\x00\x01\x01\x40", "header count larger than the record"),
        (b"\x00" + b"\xff" * 11 + b"\x00\x01\x01\x00", "overlong varint"),
    ],
)
def test_malformed_record_is_invalid_record(body: bytes, why: str) -> None:
    buf = _single_record_batch(body)
    rb.validate_batch(buf)  # CRC and header are fine: only decoding can tell
    with pytest.raises(errors.InvalidRecordError):
        rb.decode_batch(buf)
        pytest.fail(f"decoded a record with {why}")


def test_record_length_beyond_records_section_is_invalid_record() -> None:
    buf = _single_record_batch(b"\x00\x00\x00\x01\x01\x00")
    buf[61] = 0x7E  # length 63, only 6 bytes follow
    refresh_crc(buf)
    with pytest.raises(errors.InvalidRecordError, match="length"):
        rb.decode_batch(buf)


@pytest.mark.parametrize("codec", [rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD])
def test_garbage_compressed_payload_is_corrupt(codec: int) -> None:
    buf = bytearray(make_batch(3, codec))
    for i in range(61 + 20, len(buf)):
        buf[i] = (buf[i] * 7 + 13) & 0xFF
    refresh_crc(buf)
    with pytest.raises((errors.CorruptMessageError, errors.InvalidRecordError)):
        rb.decode_batch(buf)


@pytest.mark.parametrize("codec", [rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD])
def test_decompression_bomb_in_batch_is_refused(codec: int) -> None:
    # A small batch whose records section would inflate to 8 MiB: refused at a 1 MiB cap.
    records = compression.compress(codec, b"\x00" * (8 << 20))
    after = struct.pack(">hiqqqhii", codec, 0, BASE_TS, BASE_TS, -1, -1, -1, 1) + records
    buf = struct.pack(">qiib", 0, 49 + len(records), -1, 2) + struct.pack(">I", crc32c(after)) + after
    assert len(buf) < 1 << 20
    with pytest.raises(errors.MessageTooLargeError, match="more than"):
        rb.decode_batch(buf, max_decompressed_bytes=1 << 20)


def test_bad_input_leaves_buffer_unchanged() -> None:
    buf = bytearray(make_batch(3))
    buf[70] ^= 0xFF
    snapshot = bytes(buf)
    with pytest.raises(errors.CorruptMessageError):
        rb.validate_batches(buf)
    with pytest.raises(errors.CorruptMessageError):
        rb.decode_batch(buf)
    assert bytes(buf) == snapshot


@pytest.mark.parametrize("codec", CODECS)
def test_fuzzed_batches_raise_only_brook_errors(codec: int) -> None:
    # Random damage (with the CRC fixed up half the time, so decoding goes deep) must end in
    # a decoded batch or a BrookError: never IndexError, struct.error, MemoryError, a hang.
    import random

    rng = random.Random(1234 + codec)
    original = make_batch(20, codec)
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(300):
        buf = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            if not buf:
                break
            action = rng.random()
            i = rng.randrange(len(buf))
            if action < 0.6:
                buf[i] = rng.randrange(256)
            elif action < 0.8:
                del buf[i:]
            else:
                buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        if len(buf) >= 61 and rng.random() < 0.5:
            struct.pack_into(">i", buf, 8, len(buf) - 12)
            refresh_crc(buf)
        try:
            rb.decode_batch(buf, max_decompressed_bytes=1 << 20)
            outcomes["decoded"] += 1
        except errors.BrookError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100, f"outcomes {outcomes}"
