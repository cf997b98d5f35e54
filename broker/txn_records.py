"""Keys and values of the records in ``__transaction_state``, and which partition a transactional id uses.

The topic is compacted: the key names a transactional id, the last record per key wins, and a
record with a null value (tombstone) removes the id. The layouts are Kafka's (its coordinator's
published schemas TransactionLogKey.json and TransactionLogValue.json), so Kafka's tools
(kafka-dump-log --transaction-log-decoder, the console consumer's TransactionLogMessageFormatter)
read Brook's records as Kafka's::

    key v0:    i16 version=0 | string transactional id
    value v0:  i16 version=0 | i64 producer id | i16 producer epoch | i32 timeout ms | i8 status
               | i32 n (-1: null) | n x (string topic | i32 m | m x i32 partition)
               | i64 last update ms | i64 transaction start ms
    value v1:  i16 version=1 | the same fields, flexible: uvarint-length+1 ("compact") strings and
               arrays, each partitions entry and the value ending in tagged fields:
               tag 0 = i64 previous producer id (default -1), tag 1 = i64 next producer id (default -1),
               tag 2 = i16 client transaction version (default 0)

(string: i16 length and UTF-8.) Brook writes v0, what Kafka writes without ``transaction.version``
1 or more: every Kafka release and tool reads it, while releases before 4.0 fail on v1. The v1 tagged
fields only matter to KIP-890's epoch bump at every commit (EndTxn v5), which Brook does not
implement; both versions are read.

Every decoding error is a ``TxnRecordError`` (a ValueError) saying what was wrong; an unknown key
or value version is an ``UnknownVersionError`` (a subclass), which a loader skips, as Kafka's
coordinator skips keys of versions it does not know.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from broker.group_records import java_string_hash
from storage.record_batch import encode_uvarint

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0  # what Brook writes (see the module doc)
FLEXIBLE_VALUE_VERSION = 1
STRING_BYTES_MAX = 0x7FFF  # a Kafka string's i16 length
STATUS_IDS = range(8)  # Kafka's TransactionState ids, Empty (0) .. PrepareEpochFence (7)
NO_PRODUCER_ID = -1
TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TRANSACTION_VERSION = 2

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_VALUE_HEAD = struct.Struct(">qhib")  # producer id, epoch, timeout, status
_TIMES = struct.Struct(">qq")  # last update, start


class TxnRecordError(ValueError):
    """A ``__transaction_state`` record that cannot be decoded (truncated, inconsistent or hostile bytes)."""


class UnknownVersionError(TxnRecordError):
    """A key or value of a version this code does not know (written by a newer broker): skip the record."""

    def __init__(self, what: str, version: int) -> None:
        super().__init__(f"unknown {TRANSACTION_STATE_TOPIC} {what} version {version}")
        self.what = what  # "key" or "value"
        self.version = version


Partitions = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """One TransactionLogValue, field for field. ``partitions`` is None where Kafka writes null
    (an Empty transaction); ``unknown_tags`` holds v1 tagged fields of tags this code does not know,
    kept so that a record re-encodes to its own bytes."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: int
    partitions: Partitions | None
    last_update_ms: int
    start_ms: int
    previous_producer_id: int = NO_PRODUCER_ID  # v1 only (tag 0)
    next_producer_id: int = NO_PRODUCER_ID  # v1 only (tag 1)
    client_transaction_version: int = 0  # v1 only (tag 2)
    unknown_tags: tuple[tuple[int, bytes], ...] = ()
    version: int = VALUE_VERSION


def partition_for(transactional_id: str, partitions: int) -> int:
    """Kafka's choice (TransactionStateManager.partitionFor):
    ``Utils.abs(transactionalId.hashCode) % transaction.state.log.num.partitions``, where
    ``Utils.abs(Integer.MIN_VALUE)`` is 0 and otherwise ``Math.abs``."""
    if partitions <= 0:
        raise ValueError(f"{TRANSACTION_STATE_TOPIC} needs at least one partition, got {partitions}")
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def group_partitions(pairs: Iterable[tuple[str, int]]) -> Partitions:
    """(topic, partition) pairs as the value's list: one entry per topic, topics and partitions sorted
    (Kafka groups by topic in hash order; sorting makes equal sets equal bytes)."""
    by_topic: dict[str, set[int]] = {}
    for topic, partition in pairs:
        by_topic.setdefault(topic, set()).add(partition)
    return tuple((topic, tuple(sorted(by_topic[topic]))) for topic in sorted(by_topic))


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > STRING_BYTES_MAX:
        raise ValueError(f"string of {len(raw)} bytes is longer than {STRING_BYTES_MAX}")
    return _I16.pack(len(raw)) + raw




def _compact_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > STRING_BYTES_MAX:
        raise ValueError(f"string of {len(raw)} bytes is longer than {STRING_BYTES_MAX}")
    return encode_uvarint(len(raw) + 1) + raw


def encode_key(transactional_id: str) -> bytes:
    """TransactionLogKey v0. Raises ValueError for an id that is no Kafka string (over 32767 UTF-8
    bytes, or not encodable)."""
    return _I16.pack(KEY_VERSION) + _string(transactional_id)


def encode_value(value: TxnLogValue) -> bytes:
    """TransactionLogValue in ``value.version`` (0 or 1)."""
    if value.status not in STATUS_IDS:
        raise ValueError(f"unknown transaction status {value.status}")
    head = _VALUE_HEAD.pack(value.producer_id, value.producer_epoch, value.timeout_ms, value.status)
    times = _TIMES.pack(value.last_update_ms, value.start_ms)
    if value.version == VALUE_VERSION:
        parts = [_I16.pack(VALUE_VERSION), head]
        if value.partitions is None:
            parts.append(_I32.pack(-1))
        else:
            parts.append(_I32.pack(len(value.partitions)))
            for topic, ids in value.partitions:
                parts += [_string(topic), _I32.pack(len(ids)), b"".join(_I32.pack(p) for p in ids)]
        parts.append(times)
        return b"".join(parts)
    if value.version == FLEXIBLE_VALUE_VERSION:
        parts = [_I16.pack(FLEXIBLE_VALUE_VERSION), head]
        if value.partitions is None:
            parts.append(encode_uvarint(0))
        else:
            parts.append(encode_uvarint(len(value.partitions) + 1))
            for topic, ids in value.partitions:
                parts += [_compact_string(topic), encode_uvarint(len(ids) + 1), b"".join(_I32.pack(p) for p in ids),
                          encode_uvarint(0)]
        parts.append(times)
        tags: list[tuple[int, bytes]] = list(value.unknown_tags)
        if value.previous_producer_id != NO_PRODUCER_ID:
            tags.append((TAG_PREVIOUS_PRODUCER_ID, _I64.pack(value.previous_producer_id)))
        if value.next_producer_id != NO_PRODUCER_ID:
            tags.append((TAG_NEXT_PRODUCER_ID, _I64.pack(value.next_producer_id)))
        if value.client_transaction_version != 0:
            tags.append((TAG_CLIENT_TRANSACTION_VERSION, _I16.pack(value.client_transaction_version)))
        tags.sort()
        parts.append(encode_uvarint(len(tags)))
        for tag, data in tags:
            parts += [encode_uvarint(tag), encode_uvarint(len(data)), data]
        return b"".join(parts)
    raise ValueError(f"cannot write {TRANSACTION_STATE_TOPIC} value version {value.version}")


class _Reader:
    """Bounds-checked reads over one record's bytes; every failure is a TxnRecordError."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what

    def fail(self, problem: str) -> TxnRecordError:
        return TxnRecordError(f"corrupt {TRANSACTION_STATE_TOPIC} {self.what} at byte {self.pos} "
                              f"of {len(self.buf)}: {problem}")

    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, field: str) -> bytes:
        if n > self.remaining():
            raise self.fail(f"{field} needs {n} bytes, {self.remaining()} left")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct, field: str) -> tuple:
        return fmt.unpack(self.take(fmt.size, field))

    def int16(self, field: str) -> int:
        return self.unpack(_I16, field)[0]

    def int32(self, field: str) -> int:
        return self.unpack(_I32, field)[0]

    def int64(self, field: str) -> int:
        return self.unpack(_I64, field)[0]

    def uvarint(self, field: str) -> int:
        """Kafka's unsigned varint: at most 5 bytes, at most 32 bits."""
        n = shift = 0
        for _ in range(5):
            (b,) = self.take(1, field)
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                if n > 0xFFFFFFFF:
                    raise self.fail(f"{field} varint exceeds 32 bits")
                return n
            shift += 7
        raise self.fail(f"{field} varint longer than 5 bytes")

    def text(self, n: int, field: str) -> str:
        raw = self.take(n, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{field} is not UTF-8 ({exc.reason} at byte {exc.start})") from None

    def string(self, field: str) -> str:
        n = self.int16(field)
        if n < 0:
            raise self.fail(f"{field} is null (length {n})")
        return self.text(n, field)

    def compact_string(self, field: str) -> str:
        n = self.uvarint(field) - 1
        if n < 0:
            raise self.fail(f"{field} is null")
        return self.text(n, field)

    def count(self, n: int, item_bytes: int, field: str) -> int:
        """An array length checked against what is left (each item takes at least ``item_bytes``), so a
        hostile count is an error, not a long loop."""
        if n * item_bytes > self.remaining():
            raise self.fail(f"{field} claims {n} entries, only {self.remaining()} bytes left")
        return n

    def tagged_fields(self, field: str) -> list[tuple[int, bytes]]:
        n = self.count(self.uvarint(field), 2, field)
        tags: list[tuple[int, bytes]] = []
        for _ in range(n):
            tag = self.uvarint(f"{field} tag")
            if tags and tag <= tags[-1][0]:
                raise self.fail(f"{field}: tag {tag} after tag {tags[-1][0]} (tags must ascend)")
            size = self.uvarint(f"{field} tag {tag} size")
            tags.append((tag, self.take(size, f"{field} tag {tag}")))
        return tags

    def end(self) -> None:
        if self.remaining():
            raise self.fail(f"{self.remaining()} bytes after the last field")


def decode_key(data: bytes) -> str:
    """The transactional id of a TransactionLogKey; UnknownVersionError for a key version other than 0."""
    r = _Reader(bytes(data), "key")
    version = r.int16("key version")
    if version != KEY_VERSION:
        raise UnknownVersionError("key", version)
    transactional_id = r.string("transactional id")
    r.end()
    return transactional_id


def decode_value(data: bytes | None) -> TxnLogValue | None:
    """A TransactionLogValue v0 or v1; None for a tombstone."""
    if data is None:
        return None
    r = _Reader(bytes(data), "value")
    version = r.int16("value version")
    if version not in (VALUE_VERSION, FLEXIBLE_VALUE_VERSION):
        raise UnknownVersionError("value", version)
    flexible = version == FLEXIBLE_VALUE_VERSION
    producer_id, epoch, timeout_ms, status = r.unpack(_VALUE_HEAD, "producer id, epoch, timeout and status")
    if status not in STATUS_IDS:
        raise r.fail(f"unknown transaction status {status}")
    partitions: Partitions | None
    n = r.uvarint("partitions") - 1 if flexible else r.int32("partitions")
    if n < -1:
        raise r.fail(f"partitions has length {n}")
    if n == -1:
        partitions = None
    else:
        entries = []
        # an entry is at least a string and an array length (v0: 2 + 4 bytes; v1: 1 + 1 + 1 tag byte)
        for _ in range(r.count(n, 3 if flexible else 6, "partitions")):
            if flexible:
                topic = r.compact_string("topic")
                m = r.uvarint("partition ids") - 1
            else:
                topic = r.string("topic")
                m = r.int32("partition ids")
            if m < 0:
                raise r.fail(f"partition ids of {topic!r} are null")
            r.count(m, 4, "partition ids")
            ids = struct.unpack(f">{m}i", r.take(4 * m, "partition ids"))
            if flexible:
                r.tagged_fields("partitions entry tagged fields")  # none defined: skipped
            entries.append((topic, ids))
        partitions = tuple(entries)
    last_update_ms, start_ms = r.unpack(_TIMES, "timestamps")
    previous_id = next_id = NO_PRODUCER_ID
    client_version = 0
    unknown: list[tuple[int, bytes]] = []
    if flexible:
        for tag, raw in r.tagged_fields("tagged fields"):
            if tag in (TAG_PREVIOUS_PRODUCER_ID, TAG_NEXT_PRODUCER_ID):
                if len(raw) != 8:
                    raise r.fail(f"tagged field {tag} (an i64) has {len(raw)} bytes")
                if tag == TAG_PREVIOUS_PRODUCER_ID:
                    (previous_id,) = _I64.unpack(raw)
                else:
                    (next_id,) = _I64.unpack(raw)
            elif tag == TAG_CLIENT_TRANSACTION_VERSION:
                if len(raw) != 2:
                    raise r.fail(f"tagged field {tag} (an i16) has {len(raw)} bytes")
                (client_version,) = _I16.unpack(raw)
            else:
                unknown.append((tag, raw))
    r.end()
    return TxnLogValue(producer_id, epoch, timeout_ms, status, partitions, last_update_ms, start_ms,
                       previous_id, next_id, client_version, tuple(unknown), version)


def parse_record(key: bytes | None, value: bytes | None) -> tuple[str, TxnLogValue | None]:
    """A record read back from the log: (transactional id, value or None for a tombstone)."""
    if key is None:
        raise TxnRecordError(f"a {TRANSACTION_STATE_TOPIC} record without a key")
    return decode_key(key), decode_value(value)
