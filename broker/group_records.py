"""Keys and values of the records in ``__consumer_offsets``, and which partition a group uses.

The topic is compacted, so the key says *what* a record is about and the last record per
key wins; a record with a null value (tombstone) deletes the key once the cleaner has run.

Key (big-endian, versioned by its first two bytes so other record kinds can be added)::

    OFFSET key:  u16 kind=1 | u16 len | group utf-8 | u16 len | topic utf-8 | i32 partition
    GROUP key:   u16 kind=2 | u16 len | group utf-8

Value: u16 value version (0) | protobuf bytes (OffsetCommitValue / GroupMetadataValue in
proto/group.proto, so fields can be added compatibly). Unknown key kinds or value
versions are skipped with a warning when loading (a newer broker wrote them).
"""

from __future__ import annotations

import logging
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from broker.group_state import NO_SUBSCRIPTIONS, Group, GroupState, Member, OffsetEntry, Subscriptions
from client import consumer_protocol
from client.types import TopicPartition
from proto import errors, group_pb2

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
KEY_KIND_OFFSET = 1
KEY_KIND_GROUP = 2
VALUE_VERSION = 0
NAME_BYTES_MAX = 0xFFFF
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` of Java (31-polynomial over UTF-16 code units, int32 overflow)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_group(group_id: str, num_partitions: int) -> int:
    """Kafka's choice: ``Utils.abs(groupId.hashCode) % offsets.topic.num.partitions``."""
    if num_partitions <= 0:
        raise errors.InvalidConfigError(f"offsets.topic.num.partitions must be > 0, got {num_partitions}")
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def _name(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > NAME_BYTES_MAX:
        raise errors.InvalidRequestError(f"name of {len(raw)} bytes is longer than {NAME_BYTES_MAX}")
    return _U16.pack(len(raw)) + raw


def _read_name(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(buf, pos)
    pos += 2
    if pos + n > len(buf):
        raise errors.CorruptMessageError("name runs past the end of the key")
    return buf[pos : pos + n].decode("utf-8"), pos + n


def offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return _U16.pack(KEY_KIND_OFFSET) + _name(group_id) + _name(tp.topic) + _I32.pack(tp.partition)


def group_key(group_id: str) -> bytes:
    return _U16.pack(KEY_KIND_GROUP) + _name(group_id)


def encode_offset_value(entry: OffsetEntry, owner: str = "") -> bytes:
    """A committed offset's record value; ``owner``: the client address that made its group (OffsetCommitValue)."""
    msg = group_pb2.OffsetCommitValue(offset=entry.offset, leader_epoch=entry.leader_epoch,
                                      metadata=entry.metadata, commit_timestamp_ms=entry.commit_timestamp_ms,
                                      owner=owner)
    return _U16.pack(VALUE_VERSION) + msg.SerializeToString()


def encode_group_value(group: Group) -> bytes:
    msg = group_pb2.GroupMetadataValue(
        protocol_type=group.protocol_type, generation_id=group.generation_id,
        protocol_name=group.protocol_name, leader=group.leader_id,
        state_timestamp_ms=group.state_timestamp_ms, owner=group.owner,
        members=[
            group_pb2.GroupMemberValue(
                member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
                session_timeout_ms=m.session_timeout_ms, rebalance_timeout_ms=m.rebalance_timeout_ms,
                subscription=m.metadata_for(group.protocol_name), assignment=m.assignment,
                group_instance_id=m.group_instance_id)
            for m in sorted(group.members.values(), key=lambda m: m.member_id)
        ],
    )
    return _U16.pack(VALUE_VERSION) + msg.SerializeToString()


@dataclass(frozen=True)
class OffsetRecord:
    group_id: str
    tp: TopicPartition
    entry: OffsetEntry | None  # None = tombstone
    owner: str = ""  # the client address that made the group ("": none recorded)


@dataclass(frozen=True)
class GroupRecord:
    group_id: str
    value: group_pb2.GroupMetadataValue | None  # None = tombstone


def parse_record(key: bytes | None, value: bytes | None, log_offset: int) -> OffsetRecord | GroupRecord | None:
    """Decode one record read back from the log; None for kinds this version does not know.
    Malformed bytes raise CorruptMessageError (the loader skips such a record)."""
    try:
        return _parse_record(key, value, log_offset)
    except (struct.error, UnicodeDecodeError, DecodeError) as exc:
        raise errors.CorruptMessageError(f"malformed {OFFSETS_TOPIC} record at offset {log_offset}: {exc}") from exc


def _parse_record(key: bytes | None, value: bytes | None, log_offset: int) -> OffsetRecord | GroupRecord | None:
    if key is None or len(key) < 2:
        log.warning("skipping a keyless record at offset %d of %s", log_offset, OFFSETS_TOPIC)
        return None
    (kind,) = _U16.unpack_from(key, 0)
    if value is not None:
        if len(value) < 2 or _U16.unpack_from(value, 0)[0] != VALUE_VERSION:
            log.warning("skipping a record with unknown value version at offset %d", log_offset)
            return None
        value = value[2:]
    if kind == KEY_KIND_OFFSET:
        group_id, pos = _read_name(key, 2)
        topic, pos = _read_name(key, pos)
        (partition,) = _I32.unpack_from(key, pos)
        entry, owner = None, ""
        if value is not None:
            msg = group_pb2.OffsetCommitValue.FromString(value)
            entry = OffsetEntry(msg.offset, msg.leader_epoch, msg.metadata, msg.commit_timestamp_ms, log_offset)
            owner = msg.owner
        return OffsetRecord(group_id, TopicPartition(topic, partition), entry, owner)
    if kind == KEY_KIND_GROUP:
        group_id, _ = _read_name(key, 2)
        return GroupRecord(group_id, None if value is None else group_pb2.GroupMetadataValue.FromString(value))
    log.warning("skipping a record with unknown key kind %d at offset %d", kind, log_offset)
    return None


def restore_group(group: Group, value: group_pb2.GroupMetadataValue, now_ms: int) -> None:
    """Bring a loaded group back as its last record describes. Members get a fresh session
    (from ``now_ms``): live ones keep heartbeating to the new coordinator, dead ones expire."""
    group.protocol_type = value.protocol_type
    group.generation_id = value.generation_id
    group.protocol_name = value.protocol_name
    group.leader_id = value.leader
    group.state_timestamp_ms = value.state_timestamp_ms
    group.owner = value.owner or group.owner
    group.members = {
        m.member_id: Member(m.member_id, m.client_id, m.client_host, m.session_timeout_ms,
                            m.rebalance_timeout_ms, [(value.protocol_name, m.subscription)], now_ms,
                            assignment=m.assignment, group_instance_id=m.group_instance_id)
        for m in value.members
    }
    group.static_members = {m.group_instance_id: m.member_id for m in value.members if m.group_instance_id}
    group.state = GroupState.STABLE if group.members else GroupState.EMPTY


CONSUMER_PROTOCOL_TYPE = "consumer"


def parse_subscriptions(protocol_type: str, protocols: Iterable[tuple[str, bytes]]) -> Subscriptions:
    """The topics each protocol's metadata subscribes to, for a consumer's member (its metadata is a
    ConsumerSubscription; any other type's: none), and what the parsed sets hold in memory. Undecodable
    metadata subscribes to nothing. Protocols offering the same bytes share one set. Called when a member
    joins, before the coordinator's lock is taken: the parse costs about what the JoinGroup carried."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return NO_SUBSCRIPTIONS
    topics: dict[str, frozenset[str]] = {}
    by_bytes: dict[bytes, frozenset[str]] = {}
    held = 0
    for name, metadata in protocols:
        if name in topics:
            continue  # as Member.metadata_for: the first protocol of a name counts
        parsed = by_bytes.get(metadata)
        if parsed is None:
            parsed = by_bytes[metadata] = subscribed_topics(metadata)
            if parsed:
                held += sys.getsizeof(parsed) + sum(map(sys.getsizeof, parsed))
        topics[name] = parsed
    return Subscriptions(topics, held) if held else NO_SUBSCRIPTIONS


def subscribed_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a consumer's subscription metadata (``consumer_subscription``); undecodable
    metadata subscribes to nothing."""
    try:
        return frozenset(consumer_subscription(metadata).topics)
    except Exception:  # noqa: BLE001 - a client's bytes: they subscribe to nothing
        return frozenset()


# A member's subscription and assignment in Kafka's consumer protocol format, or Brook's older protobuf.
consumer_subscription = consumer_protocol.subscription
consumer_assignment = consumer_protocol.assignment


def parse_member_subscriptions(group: Group) -> None:
    """Parse what a loaded group's members subscribe to (once, when its partition is loaded)."""
    for m in group.members.values():
        m.set_subscriptions(parse_subscriptions(group.protocol_type, m.protocols))
