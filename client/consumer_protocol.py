"""Kafka's consumer protocol: what a consumer group member puts in JoinGroup's protocol metadata
(ConsumerProtocolSubscription) and what the leader hands each member in SyncGroup
(ConsumerProtocolAssignment), as Kafka's clients (Java, librdkafka, kafka-python, aiokafka) write them.

Brook's client writes these too, so a group may mix Brook's and Kafka's clients (either may be the
leader that assigns) and Kafka's admin tools can describe a group of Brook clients. Brook's client
once wrote protobuf (group_pb2.ConsumerSubscription / ConsumerAssignment) instead; those blobs are
still read, so a group keeps working while its members are upgraded. The two are told apart by the
first byte: Kafka's format starts with an int16 version (0 first), a protobuf message with a field tag
(never 0).

Kafka's types are big-endian and not flexible: a string is an int16 length and UTF-8 bytes (-1: null),
bytes an int32 length (-1: null), an array an int32 count. Decoding checks every count against the
bytes left before it builds anything, so a claimed count costs nothing. Partitions are stored by topic,
but each decoded partition carries its topic's name: a topic name is at most ``TOPIC_NAME_MAX_BYTES``
(Kafka's limit), and a caller may bound what the partitions cost once decoded (``max_decoded_bytes``).
Before, a 32 KiB topic name followed by 250,000 four-byte partitions, in a 1 MiB JoinGroup, decoded
into 8 GB (found by an audit).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from proto import group_pb2

SUBSCRIPTION_VERSION = 3  # topics, user data, owned partitions (v1), generation (v2), rack (v3)
ASSIGNMENT_VERSION = 0  # assigned partitions and user data (v1-v3 have the same fields)
TOPIC_NAME_MAX_BYTES = 249  # Kafka's (and Brook's) longest topic name: no partition of a longer one exists
DECODED_PARTITION_BYTES = 64  # what a decoded partition (a TopicPartitionRef) costs besides its topic's name


class DecodedTooLarge(ValueError):
    """The partitions would cost more than the caller's ``max_decoded_bytes`` once decoded."""


def decoded_bytes(partitions: Iterable[group_pb2.TopicPartitionRef]) -> int:
    """What decoded partitions cost, as ``max_decoded_bytes`` counts it."""
    return sum(len(p.topic) + DECODED_PARTITION_BYTES for p in partitions)


# ---- writing ----

def _string(out: bytearray, s: str | None) -> None:
    if s is None:
        out += struct.pack(">h", -1)
        return
    b = s.encode("utf-8")
    out += struct.pack(">h", len(b)) + b


def _bytes(out: bytearray, b: bytes | None) -> None:
    if not b:
        out += struct.pack(">i", -1)  # Kafka's clients write no user data as null
        return
    out += struct.pack(">i", len(b)) + b


def _topic_partitions(out: bytearray, partitions: Iterable[tuple[str, int]]) -> None:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    out += struct.pack(">i", len(by_topic))
    for topic, ps in by_topic.items():
        _string(out, topic)
        out += struct.pack(f">i{len(ps)}i", len(ps), *ps)


def encode_subscription(topics: Iterable[str], owned: Iterable[tuple[str, int]] = (), generation_id: int = -1,
                        user_data: bytes = b"", rack: str = "") -> bytes:
    """ConsumerProtocolSubscription v3: topics sorted, owned partitions grouped by topic (deterministic)."""
    out = bytearray(struct.pack(">h", SUBSCRIPTION_VERSION))
    names = sorted(set(topics))
    out += struct.pack(">i", len(names))
    for t in names:
        _string(out, t)
    _bytes(out, user_data)
    _topic_partitions(out, owned)
    out += struct.pack(">i", generation_id)
    _string(out, rack or None)
    return bytes(out)


def encode_assignment(partitions: Iterable[tuple[str, int]], user_data: bytes = b"") -> bytes:
    """ConsumerProtocolAssignment v0: partitions grouped by topic, sorted."""
    out = bytearray(struct.pack(">h", ASSIGNMENT_VERSION))
    _topic_partitions(out, partitions)
    _bytes(out, user_data)
    return bytes(out)


# ---- reading (Kafka's format, or Brook's older protobuf) ----

def subscription(metadata: bytes, *, owned: bool = True) -> group_pb2.ConsumerSubscription:
    """A member's subscription, whichever format. Raises ValueError or protobuf's DecodeError when it
    is neither. ``owned=False``: the topics and user data only (what a coordinator reads)."""
    if metadata[:1] != b"\x00":
        return group_pb2.ConsumerSubscription.FromString(metadata)
    r = _Reader(metadata)
    version = r.version()
    out = group_pb2.ConsumerSubscription(version=version, topics=r.strings(), user_data=r.nullable_bytes() or b"")
    if not owned:
        return out
    if version >= 1 and r.more():
        out.owned_partitions.extend(r.topic_partitions())
    out.generation_id = r.int32() if version >= 2 and r.more() else -1
    if version >= 3 and r.more():
        out.rack = r.nullable_string() or ""
    return out


def assignment(data: bytes, max_decoded_bytes: int | None = None) -> group_pb2.ConsumerAssignment:
    """A member's assignment, whichever format (an empty one: no partitions). ``max_decoded_bytes``: raise
    DecodedTooLarge rather than decode partitions costing more (``decoded_bytes``)."""
    if not data:
        return group_pb2.ConsumerAssignment()
    if data[:1] != b"\x00":
        # Each protobuf partition carries its topic on the wire: it decodes to about what it takes there.
        if max_decoded_bytes is not None and len(data) > max_decoded_bytes:
            raise DecodedTooLarge(f"an assignment of {len(data)} bytes, past {max_decoded_bytes} decoded")
        return group_pb2.ConsumerAssignment.FromString(data)
    r = _Reader(data, max_decoded_bytes)
    version = r.version()
    return group_pb2.ConsumerAssignment(version=version, partitions=r.topic_partitions(),
                                        user_data=r.nullable_bytes() or b"")


class _Reader:
    def __init__(self, data: bytes, max_decoded_bytes: int | None = None) -> None:
        self.data, self.pos = data, 0
        self.budget = max_decoded_bytes

    def more(self) -> bool:
        return self.pos < len(self.data)

    def _unpack(self, fmt: str) -> int:
        try:
            (value,) = struct.unpack_from(fmt, self.data, self.pos)
        except struct.error:
            raise ValueError(f"consumer protocol data ends at byte {self.pos}") from None
        self.pos += struct.calcsize(fmt)
        return value

    def version(self) -> int:
        version = self._unpack(">h")
        if version < 0:
            raise ValueError(f"consumer protocol version {version}")
        return version

    def int32(self) -> int:
        return self._unpack(">i")

    def _count(self, least_bytes: int) -> int:
        n = self._unpack(">i")
        if n < 0 or n * least_bytes > len(self.data) - self.pos:
            raise ValueError(f"an array of {n} elements in {len(self.data) - self.pos} bytes")
        return n

    def nullable_string(self) -> str | None:
        n = self._unpack(">h")
        if n < 0:
            return None
        if n > len(self.data) - self.pos:
            raise ValueError(f"a string of {n} bytes in {len(self.data) - self.pos}")
        self.pos += n
        return self.data[self.pos - n:self.pos].decode("utf-8")

    def strings(self) -> list[str]:
        out = []
        for _ in range(self._count(2)):
            s = self.nullable_string()
            if s is None:
                raise ValueError("a null topic name")
            out.append(s)
        return out

    def nullable_bytes(self) -> bytes | None:
        n = self._unpack(">i")
        if n < 0:
            return None
        if n > len(self.data) - self.pos:
            raise ValueError(f"{n} bytes in {len(self.data) - self.pos}")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def topic_partitions(self) -> list[group_pb2.TopicPartitionRef]:
        out = []
        for _ in range(self._count(6)):
            topic = self.nullable_string() or ""
            if len(topic) > TOPIC_NAME_MAX_BYTES:
                raise ValueError(f"a topic name of {len(topic)} characters (at most {TOPIC_NAME_MAX_BYTES})")
            n = self._count(4)
            if self.budget is not None:
                self.budget -= n * (len(topic) + DECODED_PARTITION_BYTES)
                if self.budget < 0:
                    raise DecodedTooLarge(f"{n} partitions of {topic[:60]!r} past the bytes allowed decoded")
            out.extend(group_pb2.TopicPartitionRef(topic=topic, partition=self.int32()) for _ in range(n))
        return out
