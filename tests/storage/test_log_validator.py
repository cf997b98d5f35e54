"""LogValidator on the leader append path: every attack of issue 11 is refused, the log unchanged.

Each hostile batch carries a valid CRC (batch_forge), so only the record walk can catch
it. After every refusal: the error code is the right one, LEO and size are unchanged,
a valid append still works and a consumer decodes everything up to the log end.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from pathlib import Path

import pytest
from batch_forge import BASE_TS, batch, record, records, valid, varint
from kafka.record.default_records import DefaultRecordBatchBuilder
from storage_testlib import read_all

from proto import errors
from proto.errors import ErrorCode
from storage import compression, record_walk
from storage import record_batch as rb
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_validator import LogValidator, decompressed_limit

CODECS = [rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD]
ALL_CODECS = [rb.CODEC_NONE, *CODECS]
CORRUPT, INVALID = ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD


@pytest.fixture(autouse=True, params=["compiled", "python"])
def walk_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the C walk and with the pure-Python fallback: same verdicts, same messages."""
    if request.param == "compiled":
        if record_walk.walk_c is None:
            pytest.skip("storage._record_walk is not built (no C compiler at install time?)")
        monkeypatch.setattr(record_walk, "walk", record_walk.walk_c)
    else:
        monkeypatch.setattr(record_walk, "walk", record_walk.walk_py)
    return request.param


@pytest.fixture
def log(tmp_path: Path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(valid(2), 0)  # something already there: a refusal must not disturb it
    yield lg
    lg.close()


def assert_refused(lg: Log, buf: bytes, code: int | set[int], match: str = "") -> errors.BrookError:
    """Refused with ``code`` (or one of them), nothing written; afterwards a valid append and a full read work."""
    leo, size, refused = lg.log_end_offset, lg.size_bytes, lg.invalid_appends_total
    with pytest.raises(errors.BrookError) as info:
        lg.append_as_leader(buf, 0)
    assert info.value.code in (code if isinstance(code, set) else {code}), info.value
    assert match in info.value.message
    assert (lg.log_end_offset, lg.size_bytes) == (leo, size)
    assert lg.invalid_appends_total == refused + 1
    appended = lg.append_as_leader(valid(3), 0)
    assert appended.first_offset == leo
    got = list(rb.decode_records(read_all(lg)))
    assert [r.offset for r in got] == list(range(leo + 3))
    return info.value


# ---------------------------------------------------------------- valid input is accepted unchanged


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_valid_batches_of_every_codec_are_accepted(log: Log, codec: int) -> None:
    info = log.append_as_leader(valid(50, codec=codec), 0)
    assert (info.first_offset, info.last_offset) == (2, 51)
    assert [r.value for r in rb.decode_records(read_all(log))][2:] == [b"value-%d" % i for i in range(50)]


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_kafka_python_batches_with_headers_nulls_and_large_fields_are_accepted(log: Log, codec: int) -> None:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    for i in range(300):
        key = None if i % 5 == 0 else b"key-%d" % i
        value = None if i % 7 == 0 else os.urandom(i * 40 % 3000) + b"x" * 200
        headers = [("trace-ü", b"%d" % i), ("none", None)] if i % 3 == 0 else []
        builder.append(i, BASE_TS + (i * 37 % 101) - 50, key, value, headers)
    buf = bytes(builder.build())
    info = log.append_as_leader(buf, 0)
    assert info.last_offset - info.first_offset == 299
    assert len(list(rb.decode_records(read_all(log)))) == 302


def test_records_with_multi_byte_varints_and_offset_deltas_past_63_are_accepted(log: Log) -> None:
    count = 20_000  # offset deltas up to 3-byte varints
    section = b"".join(record(i, b"k" * (i % 3), b"v" * (i % 200 // 150 * 150), ts_delta=-i * 1000)
                      for i in range(count))
    log.append_as_leader(batch(section, count=count, max_ts=BASE_TS), 0)
    assert log.log_end_offset == 2 + count


# ---------------------------------------------------------------- the attacks of issue 11


def test_record_count_overstated_is_corrupt(log: Log) -> None:
    assert_refused(log, batch(records(3), count=5), CORRUPT, "declares 5 records but holds 3")


def test_record_count_understated_is_corrupt(log: Log) -> None:
    assert_refused(log, batch(records(3), count=2), CORRUPT, "bytes follow them")


def test_last_offset_delta_that_disagrees_with_the_count_is_corrupt(log: Log) -> None:
    assert_refused(log, batch(records(3), count=3, last_offset_delta=7), CORRUPT, "last offset delta")


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_one_record_claiming_a_million_is_corrupt(log: Log, codec: int) -> None:
    # Uncompressed, the header check already sees that a million records cannot fit.
    assert_refused(log, batch(records(1), count=1_000_000, codec=codec), CORRUPT)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_labelled_compressed_are_corrupt(log: Log, codec: int, seed: int) -> None:
    junk = random.Random(seed).randbytes(600)  # seeded: the same bytes on every run
    assert_refused(log, batch(junk, count=3, codec=codec, compress=False), CORRUPT)


@pytest.mark.parametrize("codec", ALL_CODECS)
@pytest.mark.parametrize("seed", range(5))
def test_valid_compression_of_random_bytes_is_refused(log: Log, codec: int, seed: int) -> None:
    # Random records may happen to parse far enough to show a wrong offset delta (INVALID_RECORD).
    junk = random.Random(seed).randbytes(2000)
    assert_refused(log, batch(junk, count=3, codec=codec), {CORRUPT, INVALID})


@pytest.mark.parametrize("codec", [rb.CODEC_GZIP, rb.CODEC_ZSTD, rb.CODEC_LZ4])
def test_compression_bomb_is_refused_within_the_bound(tmp_path: Path, codec: int) -> None:
    lg = Log.open(tmp_path / "bomb-0", LogConfig(max_message_bytes=64 * 1024))
    limit = decompressed_limit(64 * 1024)
    assert limit == 2 * 1024 * 1024
    # One huge record of zeros: ~1000x smaller compressed, well under max.message.bytes.
    bomb = record(0, b"k", bytes(4 * limit))
    buf = batch(bomb, count=1, codec=codec)
    assert len(buf) < 64 * 1024
    assert_refused(lg, buf, ErrorCode.MESSAGE_TOO_LARGE, f"more than {limit} bytes")
    lg.close()


def _gzip_member(data: bytes) -> bytes:
    member = zlib.compressobj(9, zlib.DEFLATED, 31)
    return member.compress(data) + member.flush()


def test_gzip_of_more_than_one_member_is_invalid(log: Log) -> None:
    # Java's reader takes every member, librdkafka's only the first: confluent-kafka and kcat skipped the
    # records of the others without an error (audit).
    section = records(3)
    first_record_end = len(record(0, b"key-0", b"value-0"))
    two = _gzip_member(section[:first_record_end]) + _gzip_member(section[first_record_end:])
    assert_refused(log, batch(two, count=3, codec=rb.CODEC_GZIP, compress=False), INVALID, "more than one member")


def test_gzip_bomb_of_many_members_is_refused(log: Log) -> None:
    buf = batch(_gzip_member(bytes(8 << 20)) * 20, count=1, codec=rb.CODEC_GZIP, compress=False)  # 160 MiB
    assert_refused(log, buf, INVALID, "more than one member")
    # A reader, which takes every member as Java does, still stops at its bound.
    with pytest.raises(errors.MessageTooLargeError, match="more than"):
        compression.decompress(rb.CODEC_GZIP, _gzip_member(bytes(8 << 20)) * 20, max_output_bytes=32 << 20)


def test_keyless_record_on_compacted_topic_is_invalid(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy=("compact",)))
    section = record(0, b"a") + record(1, None) + record(2, b"c")
    assert_refused(lg, batch(section, count=3), INVALID, "record 1 of batch at position 0 has no key")
    lg.append_as_leader(batch(record(0, b""), count=1), 0)  # an empty key is a key
    lg.close()


def test_a_refused_record_is_named_in_record_errors_by_its_index_among_the_partitions_records(
        tmp_path: Path) -> None:
    """KIP-467: a Produce answer lists the records that made the batch refused; their index counts the records of
    the batches before theirs (Brook takes several batches a partition; Kafka's producers send one)."""
    lg = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy=("compact",)))
    first = batch(record(0, b"a") + record(1, b"b"), count=2)
    second = batch(record(0, b"c") + record(1, None) + record(2, b"d") + record(3, None), count=4)
    refused = assert_refused(lg, first + second, INVALID, "record 1 of batch at position")
    # Every keyless record, as Kafka's LogValidator lists them, not only the one the walk stopped at.
    pos = len(first)
    assert refused.record_errors == ((3, refused.message),
                                     (5, f"record 3 of batch at position {pos} has no key; a compacted topic needs one"))
    lg.close()


def test_keyless_records_are_listed_up_to_the_bound_and_up_to_bytes_that_make_no_sense(tmp_path: Path) -> None:
    """The records after the first keyless one were never walked: the listing reads them again, stops at the
    first that does not decode, and lists at most MAX_RECORD_ERRORS (a hostile batch costs a bounded scan)."""
    from storage.log_validator import MAX_RECORD_ERRORS
    lg = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy=("compact",)))
    many = b"".join(record(i, None) for i in range(MAX_RECORD_ERRORS + 50))
    refused = assert_refused(lg, batch(many, count=MAX_RECORD_ERRORS + 50), INVALID, "has no key")
    assert [i for i, _ in refused.record_errors] == list(range(MAX_RECORD_ERRORS))
    # A third record of 20 bytes of 0xff: its timestamp delta is a varint of more than ten bytes.
    garbage = record(0, None) + record(1, None) + varint(20) + b"\xff" * 20
    refused = assert_refused(lg, batch(garbage, count=3), INVALID, "record 0 of batch at position 0 has no key")
    assert [i for i, _ in refused.record_errors] == [0, 1]
    lg.close()


def test_keyless_records_and_bad_timestamps_are_listed_together_as_kafka_does(tmp_path: Path) -> None:
    """Kafka's LogValidator checks each record's key, then, if it has one, its timestamp, and answers
    INVALID_TIMESTAMP when any record's timestamp is out of range (KIP-467): both kinds are listed."""
    now = int(time.time() * 1000)
    hour = 3600 * 1000
    lg = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy=("compact",)))
    section = (record(0, b"a") + record(1, None) + record(2, b"c", ts_delta=3 * hour)
               + record(3, None, ts_delta=5 * hour) + record(4, b"e"))
    refused = assert_refused(lg, batch(section, count=5, base_ts=now), ErrorCode.INVALID_TIMESTAMP,
                             "2 record(s) without a key (a compacted topic needs one) and 1 with a "
                             "timestamp out of range")
    # Record 3 has neither: its key is checked first, so it is listed for that alone, as Kafka does.
    assert [(i, "has no key" in why, "ahead of the broker's clock" in why) for i, why in refused.record_errors] == [
        (1, True, False), (2, False, True), (3, True, False)]
    # Keyless records with good timestamps: INVALID_RECORD, as before.
    refused = assert_refused(lg, batch(record(0, None) + record(1, b"b"), count=2, base_ts=now), INVALID, "has no key")
    assert [i for i, _ in refused.record_errors] == [0]
    lg.close()
    # A LogAppendTime topic takes any timestamp (the broker stamps its own): only the keyless records are named.
    lg = Log.open(tmp_path / "a-0", LogConfig(cleanup_policy=("compact",), message_timestamp_type="LogAppendTime"))
    refused = assert_refused(lg, batch(section, count=5, base_ts=now), INVALID, "has no key")
    assert [i for i, _ in refused.record_errors] == [1, 3]
    lg.close()


def test_keyless_record_on_delete_topic_is_accepted(log: Log) -> None:
    log.append_as_leader(valid(3, keys=False), 0)


@pytest.mark.parametrize("bit,name", [(rb.ATTR_CONTROL, "control"), (rb.ATTR_TRANSACTIONAL, "transactional"),
                                      (rb.ATTR_TIMESTAMP_TYPE, "LogAppendTime"),
                                      (rb.ATTR_DELETE_HORIZON, "delete-horizon"), (0x80, "0x0080")])
def test_attributes_a_client_may_not_set_are_invalid(log: Log, bit: int, name: str) -> None:
    assert_refused(log, batch(records(2), count=2, attributes=bit), INVALID, name)


def test_real_control_batch_from_a_client_is_invalid(log: Log) -> None:
    marker = rb.build_control_batch(True, producer_id=7, producer_epoch=0, timestamp_ms=BASE_TS)
    assert_refused(log, marker, INVALID, "control")


# ---------------------------------------------------------------- record structure


@pytest.mark.parametrize("deltas", [[0, 2, 1], [0, 0, 1], [1, 2, 3], [0, 1, -1]])
def test_offset_deltas_out_of_order_are_invalid(log: Log, deltas: list[int]) -> None:
    section = b"".join(record(d) for d in deltas)
    assert_refused(log, batch(section, count=3), INVALID, "offset delta")


def test_offset_delta_past_the_one_byte_range_is_checked(log: Log) -> None:
    section = b"".join(record(i if i != 100 else 101) for i in range(128))
    assert_refused(log, batch(section, count=128), INVALID, "record 100")


@pytest.mark.parametrize("length_delta", [-1, 1, 1000, -100])
def test_record_length_that_disagrees_with_its_fields_is_corrupt(log: Log, length_delta: int) -> None:
    section = record(0) + record(1, length_delta=length_delta) + record(2)
    assert_refused(log, batch(section, count=3), CORRUPT)


@pytest.mark.parametrize("key_length", [-2, -1000, 50, 2**31])
def test_key_length_that_lies_is_corrupt(log: Log, key_length: int) -> None:
    section = record(0) + record(1, b"key", key_length=key_length) + record(2)
    assert_refused(log, batch(section, count=3), CORRUPT)


def test_overlong_varint_is_corrupt(log: Log) -> None:
    section = record(0) + b"\x80" * 11 + b"\x00"  # record 1's length: an int32 field
    assert_refused(log, batch(section, count=2), CORRUPT, "longer than 5 bytes")
    # The timestamp delta is a varlong: up to 10 bytes.
    body = b"\x00" + b"\x80" * 11 + b"\x00" + varint(0) + varint(1) + b"k" + varint(1) + b"v" + varint(0)
    assert_refused(log, batch(varint(len(body)) + body, count=1), CORRUPT, "longer than 10 bytes")


def _padded(value: int, size: int) -> bytes:
    """The zigzag varint of ``value`` padded to ``size`` bytes with continuation bits (non-minimal)."""
    z = (value << 1) ^ (value >> 63)
    out = bytearray((z >> (7 * i)) & 0x7F | 0x80 for i in range(size))
    out[-1] &= 0x7F
    return bytes(out)


@pytest.mark.parametrize("field", ["length", "offset delta", "key length", "value length", "header count",
                                   "header key length", "header value length"])
def test_an_int32_field_in_more_than_five_bytes_is_corrupt(log: Log, field: str) -> None:
    """Kafka's readVarint reads at most 5 bytes for these (Java clients fail on more); Brook read up to 10.
    Five (non-minimal, within int32) are what Kafka accepts, so they are accepted too."""
    def rec(size: int) -> bytes:
        v = {f: (lambda n: varint(n)) for f in ("offset delta", "key length", "value length", "header count",
                                                  "header key length", "header value length")}
        v[field] = lambda n: _padded(n, size)
        body = (b"\x00" + varint(0) + v["offset delta"](0) + v["key length"](1) + b"k" + v["value length"](1) + b"v"
                + v["header count"](1) + v["header key length"](1) + b"h" + v["header value length"](1) + b"x")
        length = _padded(len(body), size) if field == "length" else varint(len(body))
        return length + body

    log.append_as_leader(batch(rec(5), count=1), 0)
    assert_refused(log, batch(rec(6), count=1), CORRUPT, "longer than 5 bytes")


def test_an_int32_field_out_of_the_int32_range_is_corrupt(log: Log) -> None:
    body = b"\x00" + varint(0) + varint(0) + b"\xff\xff\xff\xff\x7f" + varint(1) + b"v" + varint(0)  # key length 2^34
    assert_refused(log, batch(varint(len(body)) + body, count=1), CORRUPT, "out of range")


@pytest.mark.parametrize("attributes", [0x01, 0x80, 0xFF])
def test_record_attributes_other_than_zero_are_corrupt(log: Log, attributes: int) -> None:
    """Unused in record format v2; kafka-python and aiokafka read the byte as a varint, so 0x80 shifted every
    field of the record for them (another key, an offset outside the batch) while Brook read it right."""
    good = record(0)
    bad = good[:1] + bytes([attributes]) + good[2:]
    assert_refused(log, batch(bad, count=1), CORRUPT, f"attributes {attributes:#04x}")


def test_truncated_last_record_is_corrupt(log: Log) -> None:
    section = records(3)
    assert_refused(log, batch(section[:-2], count=3), CORRUPT)


def test_trailing_garbage_inside_the_records_section_is_corrupt(log: Log) -> None:
    assert_refused(log, batch(records(3) + b"\x00\x00", count=3), CORRUPT, "2 bytes follow them")


@pytest.mark.parametrize("codec", CODECS)
def test_garbage_after_the_compressed_data_is_corrupt(log: Log, codec: int) -> None:
    section = compression.compress(codec, records(3)) + b"\x00junk"
    assert_refused(log, batch(section, count=3, codec=codec, compress=False), CORRUPT)


def test_header_count_beyond_the_record_is_corrupt(log: Log) -> None:
    section = record(0) + record(1, headers=[(b"h", b"v")], header_count=2**31 - 1)
    assert_refused(log, batch(section, count=2), CORRUPT, "header count")


def test_header_key_that_is_not_utf8_is_invalid(log: Log) -> None:
    section = record(0) + record(1, headers=[(b"\xff\xfe", b"v")])
    assert_refused(log, batch(section, count=2), INVALID, "not UTF-8")


@pytest.mark.parametrize("key", [b"a\x00b", b"\x00", b"trace\x00"])
def test_header_key_with_a_nul_is_invalid(log: Log, key: bytes) -> None:
    # librdkafka's clients take a header key as a C string: confluent-kafka and kcat read b"a\x00b" as "a" (audit).
    section = record(0) + record(1, headers=[(b"ok", b"v"), (key, b"v")])
    assert_refused(log, batch(section, count=2), INVALID, "NUL")


def test_headers_with_null_and_empty_values_are_accepted(log: Log) -> None:
    section = record(0, headers=[(b"a", None), (b"", b""), ("ü".encode(), b"x" * 300)])
    log.append_as_leader(batch(section, count=1), 0)
    assert list(rb.decode_records(read_all(log)))[-1].headers == [("a", None), ("", b""), ("ü", b"x" * 300)]


def test_magic_other_than_2_is_corrupt(log: Log) -> None:
    assert_refused(log, batch(records(2), count=2, magic=1), CORRUPT, "magic")


def test_second_bad_batch_refuses_the_whole_append(log: Log) -> None:
    assert_refused(log, valid(3) + batch(records(3), count=4), CORRUPT, "position")


# ---------------------------------------------------------------- timestamps


def test_lying_max_timestamp_is_corrected_as_kafka_does(log: Log) -> None:
    section = b"".join(record(i, ts_delta=d) for i, d in enumerate([5, 900, -3]))
    info = log.append_as_leader(batch(section, count=3, max_ts=BASE_TS + 10**9), 0)
    assert info.max_timestamp == BASE_TS + 900
    stored = read_all(log)
    last = max(rb.iter_batches(stored), key=lambda ph: ph[0])
    assert last[1].max_timestamp == BASE_TS + 900
    rb.validate_batch(stored, last[0])  # CRC recomputed
    assert [r.timestamp for r in rb.decode_records(stored)][-3:] == [BASE_TS + 5, BASE_TS + 900, BASE_TS - 3]


def test_timestamps_overflowing_int64_are_invalid(log: Log) -> None:
    section = record(0, ts_delta=2**62) + record(1, ts_delta=2**62)
    assert_refused(log, batch(section, count=2, base_ts=2**62, max_ts=2**62), INVALID, "overflow")


@pytest.mark.parametrize(("base_ts", "delta", "why"), [(-2, 0, "negative"), (-(2**62), 0, "negative"),
                                                     (BASE_TS, -(2**62), "negative"),
                                                     (253_402_300_800_000, 0, "after the year 9999")])
def test_timestamps_no_reader_can_represent_are_invalid_whatever_the_topic_allows(
        tmp_path: Path, base_ts: int, delta: int, why: str) -> None:
    """message.timestamp.before.max.ms defaults to Long.MAX, so a timestamp of -2^62 ms was stored, and the
    Spark source wrapped it around in microseconds (1970, or the far future) without an error. -1 (no
    timestamp) is still taken."""
    lg = Log.open(tmp_path / "t-0", LogConfig.from_overrides({"message.timestamp.after.max.ms": str(2**62)}))
    try:
        lg.append_as_leader(batch(record(0, ts_delta=0), count=1, base_ts=-1, max_ts=-1), 0)
        with pytest.raises(errors.BrookError) as refused:
            lg.append_as_leader(batch(record(0, ts_delta=delta), count=1, base_ts=base_ts,
                                      max_ts=max(base_ts, base_ts + delta)), 0)
        assert refused.value.code == ErrorCode.INVALID_TIMESTAMP and why in refused.value.message, refused.value
        assert lg.log_end_offset == 1
    finally:
        lg.close()


def test_log_append_time_topic_stamps_the_time_without_checking_client_timestamps(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "la-0", LogConfig(message_timestamp_type="LogAppendTime"))
    section = record(0, ts_delta=2**62) + record(1, ts_delta=-5)
    info = lg.append_as_leader(batch(section, count=2, base_ts=2**62, max_ts=0), 0, now_ms=BASE_TS)
    assert info.log_append_time_ms == BASE_TS
    assert [r.timestamp for r in rb.decode_records(read_all(lg))] == [BASE_TS, BASE_TS]
    lg.close()


# ---------------------------------------------------------------- config and follower path


def test_compaction_turned_on_later_applies_to_new_appends(log: Log) -> None:
    log.append_as_leader(valid(2, keys=False), 0)
    log.update_config(LogConfig(cleanup_policy=("compact",)))
    assert_refused(log, valid(2, keys=False), INVALID, "no key")


def test_follower_appends_are_not_revalidated(tmp_path: Path, log: Log) -> None:
    # A follower copies the leader's bytes; a keyless batch written before compaction was
    # turned on must still replicate.
    follower = Log.open(tmp_path / "f-0", LogConfig(cleanup_policy=("compact",)))
    follower.append_as_follower(bytes(read_all(log)))
    assert follower.log_end_offset == log.log_end_offset
    follower.close()


def test_decompressed_limit_is_bounded_both_ways() -> None:
    assert decompressed_limit(0) == 1024 * 1024
    assert decompressed_limit(1024 * 1024 + 12) == 32 * (1024 * 1024 + 12)
    # librdkafka's receive.message.max.bytes: its consumers stop for good at a zstd batch decompressing past it.
    assert decompressed_limit(2**31 - 1) == 100_000_000
    assert LogValidator(LogConfig()).decompressed_bytes_max == decompressed_limit(LogConfig().max_message_bytes)


def test_varint_helper_round_trips_through_the_decoder() -> None:
    for v in (0, -1, 1, 63, 64, -65, 2**31, -(2**63), 2**63 - 1):
        assert rb._read_varint(varint(v), 0) == (v, len(varint(v)))


# ---------------------------------------------------------------- timestamps against the broker's clock (KIP-937)


def _stamped(base_ts: int, *deltas: int) -> bytes:
    """One batch whose records carry base_ts + each delta (the header's max is left for the leader to fix)."""
    section = b"".join(record(i, b"k%d" % i, b"v", ts_delta=d) for i, d in enumerate(deltas))
    return batch(section, count=len(deltas), base_ts=base_ts)


def test_a_record_stamped_beyond_the_future_bound_is_refused(log: Log) -> None:
    now = int(time.time() * 1000)
    hour = 3600 * 1000
    log.append_as_leader(_stamped(now, 0, hour - 60_000), 0)  # within Kafka 4's default hour ahead: taken
    log.append_as_leader(_stamped(1_000_000_000_000, 0), 0)  # 2001: no bound behind by default
    refused = assert_refused(log, _stamped(now, 0, 10 * 365 * 24 * hour), ErrorCode.INVALID_TIMESTAMP,
                             "ahead of the broker's clock (message.timestamp.after.max.ms 3600000)")
    assert "record" in refused.message
    # Each record out of bounds is named (KIP-467), with its own timestamp; the others are not.
    refused = assert_refused(log, _stamped(now, 0, 3 * hour, 0, 5 * hour), ErrorCode.INVALID_TIMESTAMP, "ahead")
    assert [i for i, _ in refused.record_errors] == [1, 3], refused.record_errors
    assert [(str(now + d) in why, "ahead" in why) for (_, why), d in zip(refused.record_errors, (3 * hour, 5 * hour),
                                                                          strict=True)] == [(True, True)] * 2


def test_timestamp_bounds_follow_the_topic_config(tmp_path: Path) -> None:
    day = 24 * 3600 * 1000
    config = LogConfig.from_overrides({"message.timestamp.before.max.ms": str(day),
                                       "message.timestamp.after.max.ms": "0"})
    lg = Log.open(tmp_path / "t-0", config)
    try:
        now = int(time.time() * 1000)
        lg.append_as_leader(_stamped(now - day // 2, 0), 0)
        for stamped, why in ((_stamped(now - 2 * day, 0, 2 * day),
                              "behind the broker's clock (message.timestamp.before.max.ms 86400000)"),
                             (_stamped(now + 60_000, 0), "ahead of the broker's clock")):
            with pytest.raises(errors.BrookError) as refused:
                lg.append_as_leader(stamped, 0)
            assert refused.value.code == ErrorCode.INVALID_TIMESTAMP and why in refused.value.message
        assert lg.log_end_offset == 1 and lg.invalid_appends_total == 2
    finally:
        lg.close()


def test_log_append_time_topics_take_any_client_timestamp(tmp_path: Path) -> None:
    config = LogConfig.from_overrides({"message.timestamp.type": "LogAppendTime"})
    lg = Log.open(tmp_path / "t-0", config)
    try:
        far = int(time.time() * 1000) + 50 * 365 * 24 * 3600 * 1000
        info = lg.append_as_leader(_stamped(far, 0), 0)  # the broker stamps its own time over it
        assert info.first_offset == 0
    finally:
        lg.close()


def test_the_timestamp_bounds_have_dynamic_cluster_defaults_as_in_kafka() -> None:
    """log.message.timestamp.before.max.ms and .after.max.ms are dynamic cluster-wide defaults in Kafka (KIP-937);
    Brook read them from the node file only and refused them at runtime ("cannot be changed at runtime")."""
    from metadata_quorum import cluster_configs

    set_ = {"log.message.timestamp.before.max.ms": "86400000", "log.message.timestamp.after.max.ms": "60000"}
    assert cluster_configs.validate(set_) == set_
    assert cluster_configs.topic_defaults(set_) == {"message.timestamp.before.max.ms": "86400000",
                                                   "message.timestamp.after.max.ms": "60000"}
