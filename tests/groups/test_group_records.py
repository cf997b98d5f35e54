"""__consumer_offsets record format and the group -> partition mapping."""

from __future__ import annotations

import pytest

from broker import group_records as rec
from broker.group_state import Group, GroupState, Member, OffsetEntry
from client.types import TopicPartition as TP
from proto import errors


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
