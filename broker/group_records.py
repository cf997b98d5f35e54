"""Keys and values of the records in ``__consumer_offsets``, and which partition a group uses.

The topic is compacted, so the key says *what* a record is about and the last record per
key wins; a record with a null value (tombstone) deletes the key once the cleaner has run.

Keys and values are Kafka's (its coordinator's published schemas: OffsetCommitKey v1,
GroupMetadataKey v2, OffsetCommitValue v3, GroupMetadataValue v3), so tools that read the
topic (Burrow, kminion, kafka-console-consumer's formatter) read Brook's as Kafka's::

    OFFSET key:   i16 version=1 | string group | string topic | i32 partition
    GROUP key:    i16 version=2 | string group
    OFFSET value: i16 version=3 | i64 offset | i32 leader epoch | string metadata | i64 commit time
                  (v1, for a commit that gave its retention time, as Kafka writes it:
                  i16 version=1 | i64 offset | string metadata | i64 commit time | i64 expire time)
    GROUP value:  i16 version=3 | string protocol type | i32 generation | nullable string protocol
                  | nullable string leader | i64 state time | i32 n | n x (string member id
                  | nullable string instance id | string client id | string client host
                  | i32 rebalance timeout | i32 session timeout | bytes subscription | bytes assignment)

(string: i16 length and UTF-8; bytes: i32 length.) Some records are Brook's own, under key
versions Kafka does not use (tools skip such records, as a Kafka coordinator does)::

    OWNER key:    i16 version=32000 | string group
    OWNER value:  i16 version=0 | UTF-8 client address that made the group
    CONSUMER GROUP key:   i16 version=32001 | string group
    CONSUMER GROUP value: i16 version=0 | ConsumerGroupValue (proto/group.proto)
    CONSUMER MEMBER key:  i16 version=32002 | string group | string member id
    CONSUMER MEMBER value: i16 version=0 | ConsumerMemberValue (proto/group.proto)

The last two are a group of Kafka's consumer protocol (KIP-848, broker/consumer_groups.py): its epochs, and
each member's subscription, epochs, partitions and target, so that a new coordinator takes the group over
as it was. Kafka writes the same state under its own record kinds; these are Brook's layout of it.

Value version 0 of an offset or group is Brook's earlier format (protobuf after the version:
OffsetCommitValue / GroupMetadataValue in proto/group.proto, which carried the owner): always
read, and written only with ``group.coordinator.record.format=brook``, what a cluster upgraded
from a release before the Kafka layouts sets until every node runs this one (a release before
skips the Kafka layouts, and would load its groups without their offsets). Unknown key or value
versions are skipped with a warning when loading (a newer broker wrote them).
"""

from __future__ import annotations

import logging
import struct
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from broker import consumer_groups as cg
from broker.group_state import NO_SUBSCRIPTIONS, Group, GroupState, Member, OffsetEntry, Subscriptions
from client import consumer_protocol
from client.types import TopicPartition
from proto import errors, group_pb2

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
KEY_KIND_OFFSET = 1
KEY_KIND_GROUP = 2
KEY_KIND_OWNER = 32000  # Brook's own record; Kafka's key versions count up from 0 (its newest are below 30)
KEY_KIND_CONSUMER_GROUP = 32001  # Brook's own: a KIP-848 group's epochs
KEY_KIND_CONSUMER_MEMBER = 32002  # Brook's own: one member of a KIP-848 group
CONSUMER_VALUE_VERSION = 0
LEGACY_VALUE_VERSION = 0  # Brook's protobuf values before the Kafka layouts (read, never written)
OFFSET_VALUE_VERSION = 3  # Kafka's OffsetCommitValue v3: what Kafka 2.1+ writes
EXPIRING_OFFSET_VALUE_VERSION = 1  # v1, which has an expire time: Kafka writes it for a commit with a retention time
GROUP_VALUE_VERSION = 3  # Kafka's GroupMetadataValue v3: what Kafka 2.3+ writes
OWNER_VALUE_VERSION = 0
NAME_BYTES_MAX = 0x7FFF  # a Kafka string's i16 length
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


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


def _nullable(text: str) -> bytes:
    """Kafka's nullable string; Brook's "" (no protocol, no leader, no instance id) is Kafka's null."""
    return _name(text) if text else _I16.pack(-1)


def _bytes(data: bytes) -> bytes:
    return _I32.pack(len(data)) + data


def _read_name(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(buf, pos)
    pos += 2
    if pos + n > len(buf):
        raise errors.CorruptMessageError("a string runs past the end of the record")
    return buf[pos : pos + n].decode("utf-8"), pos + n


def _read_nullable(buf: bytes, pos: int) -> tuple[str, int]:
    if _I16.unpack_from(buf, pos)[0] == -1:
        return "", pos + 2
    return _read_name(buf, pos)


def _read_bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _I32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        return b"", pos
    if pos + n > len(buf):
        raise errors.CorruptMessageError("bytes run past the end of the record")
    return buf[pos : pos + n], pos + n


def offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return _U16.pack(KEY_KIND_OFFSET) + _name(group_id) + _name(tp.topic) + _I32.pack(tp.partition)


def group_key(group_id: str) -> bytes:
    return _U16.pack(KEY_KIND_GROUP) + _name(group_id)


def owner_key(group_id: str) -> bytes:
    return _U16.pack(KEY_KIND_OWNER) + _name(group_id)


def consumer_group_key(group_id: str) -> bytes:
    return _U16.pack(KEY_KIND_CONSUMER_GROUP) + _name(group_id)


def consumer_member_key(group_id: str, member_id: str) -> bytes:
    return _U16.pack(KEY_KIND_CONSUMER_MEMBER) + _name(group_id) + _name(member_id)


def encode_consumer_group(group: cg.ConsumerGroup) -> bytes:
    value = group_pb2.ConsumerGroupValue(epoch=group.epoch, assignment_epoch=group.assignment_epoch, topics=[
        group_pb2.ConsumerSubscribedTopic(name=name, topic_id=tid.bytes, partitions=n)
        for name, (tid, n) in sorted(group.topics.items())])
    return _U16.pack(CONSUMER_VALUE_VERSION) + value.SerializeToString()


def consumer_group_topics(value: group_pb2.ConsumerGroupValue) -> dict[str, cg.Topic]:
    return {t.name: (uuid.UUID(bytes=t.topic_id), t.partitions) for t in value.topics if len(t.topic_id) == 16}


def _topic_partitions(assignment: cg.Assignment) -> list[group_pb2.ConsumerTopicPartitions]:
    return [group_pb2.ConsumerTopicPartitions(topic_id=tid.bytes, partitions=sorted(parts))
            for tid, parts in sorted(assignment.items(), key=lambda kv: kv[0].bytes) if parts]


def _assignment(entries: Iterable[group_pb2.ConsumerTopicPartitions]) -> cg.Assignment:
    return {uuid.UUID(bytes=e.topic_id): frozenset(e.partitions) for e in entries if len(e.topic_id) == 16}


def encode_consumer_member(member: cg.Member, target: cg.Assignment) -> bytes:
    value = group_pb2.ConsumerMemberValue(
        client_id=member.client_id, client_host=member.client_host, rebalance_timeout_ms=member.rebalance_timeout_ms,
        topic_names=sorted(member.topic_names), regex=member.regex, subscribed=sorted(member.subscribed),
        epoch=member.epoch, previous_epoch=member.previous_epoch, state=member.state,
        assigned=_topic_partitions(member.assigned), revoking=_topic_partitions(member.revoking),
        target=_topic_partitions(target))
    for name in ("instance_id", "rack_id", "assignor"):
        if (text := getattr(member, name)) is not None:
            setattr(value, name, text)
    return _U16.pack(CONSUMER_VALUE_VERSION) + value.SerializeToString()


def restore_consumer_member(member_id: str, value: group_pb2.ConsumerMemberValue
                            ) -> tuple[cg.Member, cg.Assignment]:
    """A member as its last record describes it, and its target assignment."""
    member = cg.Member(
        member_id, instance_id=value.instance_id if value.HasField("instance_id") else None,
        rack_id=value.rack_id if value.HasField("rack_id") else None, client_id=value.client_id,
        client_host=value.client_host, rebalance_timeout_ms=value.rebalance_timeout_ms,
        topic_names=frozenset(value.topic_names), regex=value.regex, subscribed=frozenset(value.subscribed),
        assignor=value.assignor if value.HasField("assignor") else None, epoch=value.epoch,
        previous_epoch=value.previous_epoch,
        state=value.state if value.state in (cg.STABLE, cg.UNREVOKED, cg.UNRELEASED) else cg.STABLE,
        assigned=_assignment(value.assigned), revoking=_assignment(value.revoking))
    return member, _assignment(value.target)


def group_tombstones(group_id: str) -> list[tuple[bytes, bytes | None]]:
    """What deleting a group writes besides its offsets' tombstones: its group record's and its owner record's."""
    return [(group_key(group_id), None), (owner_key(group_id), None)]


def owner_record(group_id: str, owner: str) -> tuple[bytes, bytes]:
    """The key and value of a group's owner record."""
    return owner_key(group_id), owner_value(owner)


def owner_value(owner: str) -> bytes:
    """The client address whose commit or join made the group on its coordinator: a coordinator that loads the
    group counts its offsets against that address's share (group.coordinator.offsets.max.bytes.per.ip). Kafka's
    value layouts have no place for it, so it is a record of its own, written when the group is made and when
    it is not in the log yet (a group an earlier version loaded)."""
    return _U16.pack(OWNER_VALUE_VERSION) + owner.encode("utf-8")


def encode_offset_value(entry: OffsetEntry) -> bytes:
    """A committed offset's record value: Kafka's OffsetCommitValue v3; v1 for one with an expire time (a commit
    that gave its retention), as Kafka writes it (v1 has no leader epoch)."""
    if entry.expire_timestamp_ms >= 0:
        return (_U16.pack(EXPIRING_OFFSET_VALUE_VERSION) + _I64.pack(entry.offset) + _name(entry.metadata) + _I64.pack(entry.commit_timestamp_ms)
                + _I64.pack(entry.expire_timestamp_ms))
    return (_U16.pack(OFFSET_VALUE_VERSION) + _I64.pack(entry.offset) + _I32.pack(entry.leader_epoch)
            + _name(entry.metadata) + _I64.pack(entry.commit_timestamp_ms))


def encode_group_value(group: Group) -> bytes:
    """A group's record value: Kafka's GroupMetadataValue v3."""
    members = sorted(group.members.values(), key=lambda m: m.member_id)
    parts = [_U16.pack(GROUP_VALUE_VERSION), _name(group.protocol_type), _I32.pack(group.generation_id),
             _nullable(group.protocol_name), _nullable(group.leader_id), _I64.pack(group.state_timestamp_ms),
             _I32.pack(len(members))]
    for m in members:
        parts += [_name(m.member_id), _nullable(m.group_instance_id), _name(m.client_id), _name(m.client_host),
                  _I32.pack(m.rebalance_timeout_ms), _I32.pack(m.session_timeout_ms),
                  _bytes(m.metadata_for(group.protocol_name)), _bytes(m.assignment)]
    return b"".join(parts)


def encode_legacy_offset_value(entry: OffsetEntry, owner: str = "") -> bytes:
    """Brook's earlier value of a committed offset (group.coordinator.record.format=brook): version 0, protobuf,
    the owner in it."""
    msg = group_pb2.OffsetCommitValue(offset=entry.offset, leader_epoch=entry.leader_epoch,
                                      metadata=entry.metadata, commit_timestamp_ms=entry.commit_timestamp_ms,
                                      owner=owner)
    if entry.expire_timestamp_ms >= 0:
        msg.expire_timestamp_ms = entry.expire_timestamp_ms
    return _U16.pack(LEGACY_VALUE_VERSION) + msg.SerializeToString()


def encode_legacy_group_value(group: Group) -> bytes:
    """Brook's earlier value of a group (group.coordinator.record.format=brook)."""
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
    return _U16.pack(LEGACY_VALUE_VERSION) + msg.SerializeToString()


def _decode_offset_value(version: int, buf: bytes, log_offset: int) -> OffsetEntry:
    """Kafka's OffsetCommitValue v1-v3 (v1 carries an expire time)."""
    (offset,) = _I64.unpack_from(buf, 2)
    pos, epoch = 10, -1
    if version >= 3:
        (epoch,) = _I32.unpack_from(buf, pos)
        pos += 4
    metadata, pos = _read_name(buf, pos)
    (commit_ms,) = _I64.unpack_from(buf, pos)
    expire_ms = _I64.unpack_from(buf, pos + 8)[0] if version == EXPIRING_OFFSET_VALUE_VERSION else -1
    return OffsetEntry(offset, epoch, metadata, commit_ms, log_offset, expire_timestamp_ms=max(expire_ms, -1))


def _decode_group_value(version: int, buf: bytes) -> group_pb2.GroupMetadataValue:
    """Kafka's GroupMetadataValue v1-v3 (its v0 is read as Brook's earlier format), as the message ``restore_group``
    takes."""
    protocol_type, pos = _read_name(buf, 2)
    (generation,) = _I32.unpack_from(buf, pos)
    protocol, pos = _read_nullable(buf, pos + 4)
    leader, pos = _read_nullable(buf, pos)
    state_ms = 0
    if version >= 2:
        (state_ms,) = _I64.unpack_from(buf, pos)
        pos += 8
    (count,) = _I32.unpack_from(buf, pos)
    pos += 4
    if count < 0 or count > len(buf):  # each member takes bytes: a count past them is corrupt, not a loop
        raise errors.CorruptMessageError(f"a group record of {len(buf)} bytes claims {count} members")
    value = group_pb2.GroupMetadataValue(protocol_type=protocol_type, generation_id=generation,
                                         protocol_name=protocol, leader=leader, state_timestamp_ms=max(state_ms, 0))
    for _ in range(count):
        member_id, pos = _read_name(buf, pos)
        instance_id = ""
        if version >= 3:
            instance_id, pos = _read_nullable(buf, pos)
        client_id, pos = _read_name(buf, pos)
        client_host, pos = _read_name(buf, pos)
        session_ms = rebalance_ms = _I32.unpack_from(buf, pos)[0]
        if version >= 1:
            (session_ms,) = _I32.unpack_from(buf, pos + 4)
            pos += 4
        pos += 4
        subscription, pos = _read_bytes(buf, pos)
        assignment, pos = _read_bytes(buf, pos)
        value.members.add(member_id=member_id, client_id=client_id, client_host=client_host,
                          session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                          subscription=subscription, assignment=assignment, group_instance_id=instance_id)
    return value


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


@dataclass(frozen=True)
class OwnerRecord:
    group_id: str
    owner: str | None  # None = tombstone


@dataclass(frozen=True)
class ConsumerGroupRecord:
    group_id: str
    value: group_pb2.ConsumerGroupValue | None  # None = tombstone


@dataclass(frozen=True)
class ConsumerMemberRecord:
    group_id: str
    member_id: str
    value: group_pb2.ConsumerMemberValue | None  # None = tombstone


Parsed = OffsetRecord | GroupRecord | OwnerRecord | ConsumerGroupRecord | ConsumerMemberRecord


def parse_record(key: bytes | None, value: bytes | None, log_offset: int) -> Parsed | None:
    """Decode one record read back from the log; None for kinds this version does not know.
    Malformed bytes raise CorruptMessageError (the loader skips such a record)."""
    try:
        return _parse_record(key, value, log_offset)
    except (struct.error, UnicodeDecodeError, DecodeError) as exc:
        raise errors.CorruptMessageError(f"malformed {OFFSETS_TOPIC} record at offset {log_offset}: {exc}") from exc


def _parse_record(key: bytes | None, value: bytes | None, log_offset: int) -> Parsed | None:
    if key is None or len(key) < 2:
        log.warning("skipping a keyless record at offset %d of %s", log_offset, OFFSETS_TOPIC)
        return None
    (kind,) = _U16.unpack_from(key, 0)
    version = None
    if value is not None:
        if len(value) < 2:
            log.warning("skipping a record without a value version at offset %d", log_offset)
            return None
        (version,) = _U16.unpack_from(value, 0)
    if kind == KEY_KIND_OFFSET:
        group_id, pos = _read_name(key, 2)
        topic, pos = _read_name(key, pos)
        (partition,) = _I32.unpack_from(key, pos)
        entry, owner = None, ""
        if version == LEGACY_VALUE_VERSION:  # version is None for a tombstone
            msg = group_pb2.OffsetCommitValue.FromString(value[2:])
            entry = OffsetEntry(msg.offset, msg.leader_epoch, msg.metadata, msg.commit_timestamp_ms, log_offset,
                                expire_timestamp_ms=msg.expire_timestamp_ms if msg.HasField("expire_timestamp_ms")
                                else -1)
            owner = msg.owner
        elif version in (1, 2, 3):
            entry = _decode_offset_value(version, value, log_offset)
        elif version is not None:
            log.warning("skipping an offset record with unknown value version %s at offset %d", version, log_offset)
            return None
        return OffsetRecord(group_id, TopicPartition(topic, partition), entry, owner)
    if kind == KEY_KIND_GROUP:
        group_id, _ = _read_name(key, 2)
        if value is None:
            return GroupRecord(group_id, None)
        if version == LEGACY_VALUE_VERSION:
            return GroupRecord(group_id, group_pb2.GroupMetadataValue.FromString(value[2:]))
        if version in (1, 2, 3):
            return GroupRecord(group_id, _decode_group_value(version, value))
        log.warning("skipping a group record with unknown value version %s at offset %d", version, log_offset)
        return None
    if kind == KEY_KIND_OWNER:
        group_id, _ = _read_name(key, 2)
        if value is None:
            return OwnerRecord(group_id, None)
        if version != OWNER_VALUE_VERSION:
            log.warning("skipping an owner record with unknown value version %s at offset %d", version, log_offset)
            return None
        return OwnerRecord(group_id, value[2:].decode("utf-8"))
    if kind in (KEY_KIND_CONSUMER_GROUP, KEY_KIND_CONSUMER_MEMBER):
        group_id, pos = _read_name(key, 2)
        member_id = _read_name(key, pos)[0] if kind == KEY_KIND_CONSUMER_MEMBER else ""
        if value is not None and version != CONSUMER_VALUE_VERSION:
            log.warning("skipping a consumer group record with unknown value version %s at offset %d", version,
                        log_offset)
            return None
        if kind == KEY_KIND_CONSUMER_GROUP:
            return ConsumerGroupRecord(group_id, None if value is None
                                       else group_pb2.ConsumerGroupValue.FromString(value[2:]))
        return ConsumerMemberRecord(group_id, member_id, None if value is None
                                    else group_pb2.ConsumerMemberValue.FromString(value[2:]))
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
        return frozenset(consumer_subscription(metadata, owned=False).topics)
    except Exception:  # noqa: BLE001 - a client's bytes: they subscribe to nothing
        return frozenset()


# A member's subscription and assignment in Kafka's consumer protocol format, or Brook's older protobuf.
consumer_subscription = consumer_protocol.subscription
consumer_assignment = consumer_protocol.assignment


def parse_member_subscriptions(group: Group) -> None:
    """Parse what a loaded group's members subscribe to (once, when its partition is loaded)."""
    for m in group.members.values():
        m.set_subscriptions(parse_subscriptions(group.protocol_type, m.protocols))
