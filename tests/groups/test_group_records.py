"""__consumer_offsets record format and the group -> partition mapping."""

from __future__ import annotations

import struct

import pytest

from broker import group_records as rec
from broker.group_state import Group, GroupState, Member, OffsetEntry
from client.types import TopicPartition as TP
from proto import errors, group_pb2


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("abc", 96354), ("hello", 99162322), ("polygenelubricants", -(2**31)), ("ünïcode-€", None)],
)
def test_java_string_hash_matches_java(text: str, expected: int | None) -> None:
    h = rec.java_string_hash(text)
    assert -(2**31) <= h < 2**31
    if expected is not None:
        assert h == expected


def test_partition_for_group_uses_kafka_abs() -> None:
    # Integer.MIN_VALUE hashes to partition 0 with Kafka's Utils.abs (Math.abs would stay negative).
    assert rec.partition_for_group("polygenelubricants", 50) == 0
    assert rec.partition_for_group("hello", 50) == 99162322 % 50
    assert all(0 <= rec.partition_for_group(f"g{i}", 7) < 7 for i in range(200))
    with pytest.raises(errors.InvalidConfigError):
        rec.partition_for_group("g", 0)


def test_offset_record_round_trip_and_tombstone() -> None:
    key = rec.offset_key("grp", TP("orders", 3))
    value = rec.encode_offset_value(OffsetEntry(42, 7, "meta", 1234))
    parsed = rec.parse_record(key, value, log_offset=99)
    assert isinstance(parsed, rec.OffsetRecord)
    assert parsed.group_id == "grp" and parsed.tp == TP("orders", 3)
    assert parsed.entry == OffsetEntry(42, 7, "meta", 1234, log_offset=99)
    tomb = rec.parse_record(key, None, log_offset=100)
    assert isinstance(tomb, rec.OffsetRecord) and tomb.entry is None
    # Keys are deterministic bytes: compaction relies on equal keys for equal subjects.
    assert key == rec.offset_key("grp", TP("orders", 3)) != rec.offset_key("grp", TP("orders", 4))


def test_group_record_round_trip_restores_members() -> None:
    g = Group("grp", generation_id=5, protocol_type="consumer", protocol_name="range", leader_id="m1",
              state=GroupState.STABLE, state_timestamp_ms=777)
    g.members["m1"] = Member("m1", "c1", "h1", 10_000, 30_000, [("range", b"sub1")], 0, assignment=b"as1")
    parsed = rec.parse_record(rec.group_key("grp"), rec.encode_group_value(g), log_offset=1)
    assert isinstance(parsed, rec.GroupRecord) and parsed.value is not None
    restored = Group("grp")
    rec.restore_group(restored, parsed.value, now_ms=5000)
    assert restored.state == GroupState.STABLE and restored.generation_id == 5
    assert restored.leader_id == "m1" and restored.protocol_name == "range"
    m = restored.members["m1"]
    assert (m.client_id, m.assignment, m.metadata_for("range"), m.last_heartbeat_ms) == ("c1", b"as1", b"sub1", 5000)
    empty = Group("e", generation_id=2, protocol_type="consumer")
    parsed = rec.parse_record(rec.group_key("e"), rec.encode_group_value(empty), log_offset=2)
    restored = Group("e")
    rec.restore_group(restored, parsed.value, now_ms=1)
    assert restored.state == GroupState.EMPTY and restored.generation_id == 2


def test_unknown_kinds_and_versions_are_skipped_not_fatal() -> None:
    assert rec.parse_record(b"\x00\x09whatever", b"\x00\x00", 1) is None
    assert rec.parse_record(rec.group_key("g"), b"\x00\x07junk", 1) is None
    assert rec.parse_record(None, b"x", 1) is None
    with pytest.raises(errors.CorruptMessageError):
        rec.parse_record(b"\x00\x01\x00\x09ab", None, 1)


def test_overlong_names_are_refused() -> None:
    with pytest.raises(errors.InvalidRequestError):
        rec.group_key("x" * 70_000)


def test_static_members_keep_their_instance_ids_across_a_coordinator_move() -> None:
    g = Group("g", protocol_type="consumer", protocol_name="range", generation_id=4, leader_id="a-1",
              state=GroupState.STABLE)
    g.members = {"a-1": Member("a-1", "c", "h", 10_000, 30_000, [("range", b"s")], 0, assignment=b"A",
                               group_instance_id="a"),
                 "d-2": Member("d-2", "c", "h", 10_000, 30_000, [("range", b"s")], 0, assignment=b"D")}
    g.static_members = {"a": "a-1"}
    parsed = rec.parse_record(rec.group_key("g"), rec.encode_group_value(g), 0)
    assert isinstance(parsed, rec.GroupRecord) and parsed.value is not None
    restored = Group("g")
    rec.restore_group(restored, parsed.value, now_ms=5000)
    assert restored.static_members == {"a": "a-1"}
    assert restored.members["a-1"].group_instance_id == "a" and restored.members["d-2"].group_instance_id == ""


def _kstr(text: str | None) -> bytes:
    """A string as Kafka's coordinator schemas lay it out: i16 length (-1: null), UTF-8."""
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _kbytes(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def test_values_are_kafkas_published_layouts() -> None:
    """Tools read __consumer_offsets by Kafka's schemas (Burrow, kminion, the console consumer's formatter); Brook's
    values were a version 0 followed by protobuf, which those tools took for Kafka's v0 and read as nonsense
    (offset 588301393022943231 for a commit of 42: Go clients audit). The bytes are built here from Kafka's
    OffsetCommitValue.json and GroupMetadataValue.json, field by field."""
    offset = rec.encode_offset_value(OffsetEntry(42, 7, "hello", 1_700_000_000_123))
    assert offset == struct.pack(">hqi", 3, 42, 7) + _kstr("hello") + struct.pack(">q", 1_700_000_000_123)
    assert rec.offset_key("grp", TP("orders", 3)) == struct.pack(">h", 1) + _kstr("grp") + _kstr("orders") + \
        struct.pack(">i", 3)
    assert rec.group_key("grp") == struct.pack(">h", 2) + _kstr("grp")

    g = Group("grp", generation_id=5, protocol_type="consumer", protocol_name="range", leader_id="m1",
              state=GroupState.STABLE, state_timestamp_ms=777)
    g.members["m2"] = Member("m2", "c2", "10.0.0.2", 10_000, 30_000, [("range", b"sub2")], 0, assignment=b"as2",
                             group_instance_id="static-2")
    g.members["m1"] = Member("m1", "c1", "10.0.0.1", 45_000, 60_000, [("range", b"sub1")], 0, assignment=b"as1")
    expected = (struct.pack(">h", 3) + _kstr("consumer") + struct.pack(">i", 5) + _kstr("range") + _kstr("m1")
                + struct.pack(">qi", 777, 2)
                + _kstr("m1") + _kstr(None) + _kstr("c1") + _kstr("10.0.0.1") + struct.pack(">ii", 60_000, 45_000)
                + _kbytes(b"sub1") + _kbytes(b"as1")
                + _kstr("m2") + _kstr("static-2") + _kstr("c2") + _kstr("10.0.0.2") + struct.pack(">ii", 30_000, 10_000)
                + _kbytes(b"sub2") + _kbytes(b"as2"))
    assert rec.encode_group_value(g) == expected
    empty = Group("e", generation_id=2, protocol_type="consumer")  # no protocol, no leader: Kafka's nulls
    assert rec.encode_group_value(empty) == (struct.pack(">h", 3) + _kstr("consumer") + struct.pack(">i", 2)
                                             + _kstr(None) + _kstr(None) + struct.pack(">qi", 0, 0))


def test_kafka_written_values_are_read() -> None:
    """Kafka's own versions of the values load too: OffsetCommitValue v1 (with an expire time) and v2, and
    GroupMetadataValue v1 and v2 (no instance ids, no state time before v2)."""
    key = rec.offset_key("g", TP("t", 0))
    v1 = struct.pack(">hq", 1, 9) + _kstr("m") + struct.pack(">qq", 123, 456)
    v2 = struct.pack(">hq", 2, 10) + _kstr("") + struct.pack(">q", 124)
    assert rec.parse_record(key, v1, 5).entry == OffsetEntry(9, -1, "m", 123, 5, expire_timestamp_ms=456)
    assert rec.parse_record(key, v2, 6).entry == OffsetEntry(10, -1, "", 124, 6)
    for version, state in ((1, b""), (2, struct.pack(">q", 99))):
        value = (struct.pack(">h", version) + _kstr("consumer") + struct.pack(">i", 3) + _kstr("range")
                 + _kstr("a") + state + struct.pack(">i", 1) + _kstr("a") + _kstr("cid") + _kstr("h")
                 + struct.pack(">ii", 60_000, 10_000) + _kbytes(b"s") + _kbytes(b"x"))
        parsed = rec.parse_record(rec.group_key("g"), value, 1)
        assert isinstance(parsed, rec.GroupRecord) and parsed.value is not None
        (m,) = parsed.value.members
        assert (parsed.value.generation_id, parsed.value.leader, m.session_timeout_ms, m.rebalance_timeout_ms,
                m.assignment, parsed.value.state_timestamp_ms) == (3, "a", 10_000, 60_000, b"x", 99 if state else 0)
    with pytest.raises(errors.CorruptMessageError):  # a member count past the record's bytes
        rec.parse_record(rec.group_key("g"), struct.pack(">h", 3) + _kstr("c") + struct.pack(">i", 1) + _kstr(None)
                         + _kstr(None) + struct.pack(">qi", 0, 1_000_000), 1)


def test_the_earlier_protobuf_values_are_still_read() -> None:
    """Logs written before the Kafka layouts hold version 0 and protobuf (with the owner in it): still loaded."""
    old_offset = b"\x00\x00" + group_pb2.OffsetCommitValue(offset=42, leader_epoch=3, metadata="x",
                                                          commit_timestamp_ms=5, owner="10.0.0.9").SerializeToString()
    parsed = rec.parse_record(rec.offset_key("g", TP("t", 1)), old_offset, 8)
    assert isinstance(parsed, rec.OffsetRecord)
    assert (parsed.entry, parsed.owner) == (OffsetEntry(42, 3, "x", 5, 8), "10.0.0.9")
    old_group = b"\x00\x00" + group_pb2.GroupMetadataValue(protocol_type="consumer", generation_id=4,
                                                          owner="10.0.0.9").SerializeToString()
    parsed = rec.parse_record(rec.group_key("g"), old_group, 9)
    assert isinstance(parsed, rec.GroupRecord) and parsed.value is not None and parsed.value.generation_id == 4


def test_owner_records_round_trip_under_a_key_version_kafka_does_not_use() -> None:
    key = rec.owner_key("grp")
    assert struct.unpack_from(">h", key)[0] == 32000 and key[2:] == _kstr("grp")
    parsed = rec.parse_record(key, rec.owner_value("10.0.0.2"), 3)
    assert parsed == rec.OwnerRecord("grp", "10.0.0.2")
    assert rec.parse_record(key, None, 4) == rec.OwnerRecord("grp", None)
    assert rec.group_tombstones("grp") == [(rec.group_key("grp"), None), (key, None)]


def test_an_offset_with_an_expire_time_is_kafkas_v1_in_both_formats() -> None:
    """A commit that gave its retention time is written as Kafka writes it, OffsetCommitValue v1 (offset, metadata,
    commit time, expire time; no leader epoch), and read back with its expire time; so in the earlier format."""
    entry = OffsetEntry(42, 7, "m", 1000, expire_timestamp_ms=4000)
    value = rec.encode_offset_value(entry)
    assert value == struct.pack(">hq", 1, 42) + _kstr("m") + struct.pack(">qq", 1000, 4000)
    key = rec.offset_key("g", TP("t", 0))
    assert rec.parse_record(key, value, 3).entry == OffsetEntry(42, -1, "m", 1000, 3, expire_timestamp_ms=4000)
    legacy = rec.parse_record(key, rec.encode_legacy_offset_value(entry, "10.0.0.1"), 4)
    assert legacy.entry == OffsetEntry(42, 7, "m", 1000, 4, expire_timestamp_ms=4000)
    assert rec.parse_record(key, rec.encode_legacy_offset_value(OffsetEntry(1, -1, "", 0)), 5).entry \
        .expire_timestamp_ms == -1
