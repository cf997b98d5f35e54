"""Kafka RecordBatch v2 (magic 2): one byte layout on the wire and on disk.

Batch layout (big-endian), 61-byte header then the records section::

    0  base_offset            int64   \\ log overhead (12 bytes): not part of batch_length
    8  batch_length           int32   /
   12  partition_leader_epoch int32   not covered by the CRC (rewritten by the leader)
   16  magic                  int8    always 2
   17  crc                    uint32  CRC-32C (Castagnoli) of bytes 21..end
   21  attributes             int16   bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
   23  last_offset_delta      int32
   27  base_timestamp         int64
   35  max_timestamp          int64
   43  producer_id            int64
   51  producer_epoch         int16
   53  base_sequence          int32
   57  record_count           int32
   61  records (compressed as a whole when the codec is not none)

Each record: varint length, int8 attributes (0), varlong timestamp delta, varint offset
delta, varint key length (-1 = null) + key, varint value length (-1 = null) + value,
varint header count, then per header varint key length + UTF-8 key, varint value
length (-1 = null) + value. Varints are zigzag-encoded base-128 (protobuf's sint).

The broker's hot path touches only the header: ``validate_batch`` (header sanity +
CRC), ``iter_batches``, ``assign_offsets`` and ``set_log_append_time``. Per-record work
(``RecordBatchBuilder``, ``decode_batch``) happens in producers, consumers and the
log cleaner, and is written for speed: precompiled structs, inline fast paths for
one- and two-byte varints, one join per batch.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from proto import errors
from storage import compression, record_walk

logger = logging.getLogger(__name__)

BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base offset (8) + batch length (4)
MAGIC = 2
# batch_length counts from the partition leader epoch onward: the header minus the log overhead.
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49
CRC_START = 21  # attributes onward are covered by the CRC
MAGIC_OFFSET = 16

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME = 0, 1

ATTR_CODEC_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40  # KIP-534: base timestamp holds the delete horizon

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

# The last offset delta is an int32: a batch can never hold more records than this.
MAX_RECORDS_PER_BATCH = 2**31 - 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == BATCH_HEADER_SIZE
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_HEADER_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record_count, 40 bytes
assert _HEADER_AFTER_CRC.size == BATCH_HEADER_SIZE - CRC_START
_HEADER_BEFORE_CRC = struct.Struct(">qiib")  # base offset, length, epoch, magic
_pack_header = _HEADER.pack
_unpack_header_from = _HEADER.unpack_from

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch takes in a log or on the wire, log overhead included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        return TIMESTAMP_LOG_APPEND_TIME if self.attributes & ATTR_TIMESTAMP_TYPE else TIMESTAMP_CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record (wraps at int32 like Kafka); -1 without a base sequence."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (2**31)


def read_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Unpack the 61-byte header at ``pos``; no CRC check, no look at the records.

    Raises CorruptMessageError when fewer than 61 bytes remain or the magic is not 2.
    """
    if pos < 0 or len(buf) - pos < BATCH_HEADER_SIZE:
        raise errors.CorruptMessageError(
            f"truncated batch header at position {pos}: {max(len(buf) - pos, 0)} bytes, need {BATCH_HEADER_SIZE}"
        )
    header = BatchHeader(*_unpack_header_from(buf, pos))
    if header.magic != MAGIC:
        raise errors.CorruptMessageError(f"unsupported magic {header.magic} at position {pos} (only 2)")
    return header


def _check_header(h: BatchHeader, pos: int, max_batch_bytes: int | None, allow_empty: bool) -> None:
    """Header-only sanity rules shared by validate_batch; raises the specific error."""
    if h.batch_length < MIN_BATCH_LENGTH:
        raise errors.CorruptMessageError(
            f"batch at position {pos} has length {h.batch_length}, below the minimum {MIN_BATCH_LENGTH}"
        )
    if max_batch_bytes is not None and h.size > max_batch_bytes:
        # Kafka: RecordTooLargeException (MESSAGE_TOO_LARGE) when a batch exceeds max.message.bytes.
        raise errors.MessageTooLargeError(
            f"batch at position {pos} is {h.size} bytes, above the limit of {max_batch_bytes}"
        )
    if h.attributes & ATTR_CODEC_MASK > CODEC_ZSTD:
        raise errors.CorruptMessageError(f"batch at position {pos} has unknown codec {h.attributes & 7}")
    count = h.record_count
    if count < 0:
        raise errors.CorruptMessageError(f"batch at position {pos} has negative record count {count}")
    if count == 0:
        # Kafka's log cleaner keeps empty batches (count 0) to retain producer state; their
        # last offset delta still spans the removed records. Producers never send them.
        if not allow_empty:
            raise errors.InvalidRecordError(f"batch at position {pos} has no records")
        if h.last_offset_delta < -1:
            raise errors.CorruptMessageError(
                f"empty batch at position {pos} has last offset delta {h.last_offset_delta}"
            )
        if h.compression == CODEC_NONE and h.batch_length != MIN_BATCH_LENGTH:
            raise errors.CorruptMessageError(
                f"empty batch at position {pos} carries {h.batch_length - MIN_BATCH_LENGTH} bytes of records"
            )
    elif count != h.last_offset_delta + 1:
        raise errors.CorruptMessageError(
            f"batch at position {pos}: record count {count} does not match last offset delta "
            f"{h.last_offset_delta} (expected count == delta + 1)"
        )
    elif h.compression == CODEC_NONE and h.batch_length - MIN_BATCH_LENGTH < count * _MIN_RECORD_SIZE:
        # Every uncompressed record takes at least 7 bytes: a count that cannot fit is corrupt.
        raise errors.CorruptMessageError(
            f"batch at position {pos}: {count} records cannot fit in {h.batch_length - MIN_BATCH_LENGTH} bytes"
        )


def check_stored_header(h: BatchHeader, pos: int) -> None:
    """The header-only rules of ``validate_batch`` for a batch in a log (empty ones allowed, no size limit):
    what a walk over headers can check of the batches it steps over without reading them."""
    _check_header(h, pos, None, True)


# Smallest possible encoded record: length, attributes, ts delta, offset delta, key -1,
# value -1, header count: one byte each.
_MIN_RECORD_SIZE = 7


def validate_batch(
    buf: Buffer, pos: int = 0, *, max_batch_bytes: int | None = None, allow_empty: bool = True
) -> BatchHeader:
    """Check the batch at ``pos`` without decoding its records and return its header.

    Rules: header present with magic 2, batch length >= 49, whole batch present, known
    codec, record count >= 0 and == last offset delta + 1 (count 0 is an empty batch as
    Kafka's cleaner leaves them; refused with InvalidRecordError when ``allow_empty`` is
    False, as a leader must do for produced batches), size (log overhead included) at
    most ``max_batch_bytes``, CRC-32C of attributes..end matches.
    """
    h = read_header(buf, pos)
    _check_header(h, pos, max_batch_bytes, allow_empty)
    end = pos + h.batch_length + LOG_OVERHEAD
    if end > len(buf):
        raise errors.CorruptMessageError(
            f"truncated batch at position {pos}: length field says {h.size} bytes, only {len(buf) - pos} present"
        )
    with memoryview(buf) as view:
        actual = crc32c(view[pos + CRC_START : end])
    if actual != h.crc:
        raise errors.CorruptMessageError(
            f"CRC mismatch in batch at position {pos} (base offset {h.base_offset}): "
            f"stored {h.crc:#010x}, computed {actual:#010x}"
        )
    return h


def validate_batches(
    buf: Buffer, *, max_batch_bytes: int | None = None, allow_empty: bool = True
) -> list[BatchHeader]:
    """Validate every batch in ``buf``: at least one complete batch, nothing trailing."""
    if len(buf) == 0:
        raise errors.CorruptMessageError("no record batch: empty input")
    headers: list[BatchHeader] = []
    pos = 0
    size = len(buf)
    while pos < size:
        h = validate_batch(buf, pos, max_batch_bytes=max_batch_bytes, allow_empty=allow_empty)
        headers.append(h)
        pos += h.batch_length + LOG_OVERHEAD
    return headers


def iter_batches(buf: Buffer, pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch from ``pos``; no CRC check.

    Stops quietly at a torn tail (an incomplete header or batch, as a fetch cut at
    max_bytes or a crash leaves). A header that cannot be walked past (wrong magic,
    length below 49) raises CorruptMessageError, since what follows cannot be located.
    """
    size = len(buf)
    while size - pos >= BATCH_HEADER_SIZE:
        h = BatchHeader(*_unpack_header_from(buf, pos))
        if h.magic != MAGIC:
            raise errors.CorruptMessageError(f"unsupported magic {h.magic} at position {pos} (only 2)")
        if h.batch_length < MIN_BATCH_LENGTH:
            raise errors.CorruptMessageError(
                f"batch at position {pos} has length {h.batch_length}, below the minimum {MIN_BATCH_LENGTH}"
            )
        end = pos + h.batch_length + LOG_OVERHEAD
        if end > size:
            return
        yield pos, h
        pos = end


def assign_offsets(buf: bytearray | memoryview, pos: int, base_offset: int, partition_leader_epoch: int) -> None:
    """Rewrite base offset and partition leader epoch in place; the CRC stays valid (not covered)."""
    _INT64.pack_into(buf, pos, base_offset)
    _INT32.pack_into(buf, pos + 12, partition_leader_epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Mark the batch at ``pos`` LogAppendTime with ``timestamp_ms`` and recompute its CRC.

    As in Kafka, only the attributes and max timestamp change; readers then report
    max_timestamp as every record's timestamp.
    """
    _rewrite_after_crc(buf, pos, ATTR_TIMESTAMP_TYPE, timestamp_ms)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Set the max timestamp of the (CreateTime) batch at ``pos`` and recompute its CRC.

    The leader corrects a header whose max timestamp disagrees with its records, as
    Kafka's LogValidator does: retention and the time index trust the header.
    """
    _rewrite_after_crc(buf, pos, 0, timestamp_ms)


def _rewrite_after_crc(buf: bytearray | memoryview, pos: int, add_attributes: int, max_timestamp: int) -> None:
    h = read_header(buf, pos)
    end = pos + h.batch_length + LOG_OVERHEAD
    if end > len(buf):
        raise errors.CorruptMessageError(f"truncated batch at position {pos}")
    _INT16.pack_into(buf, pos + 21, h.attributes | add_attributes)
    _INT64.pack_into(buf, pos + 35, max_timestamp)
    with memoryview(buf) as view:
        crc = crc32c(view[pos + CRC_START : end])
    _UINT32.pack_into(buf, pos + 17, crc)


# ---------------------------------------------------------------------------------------
# Records: varint helpers, builder and decoder (per-record work: producers, consumers,
# the log cleaner; never the broker's produce/replicate/fetch path).

# Zigzag varints (protobuf sint): 0, -1, 1, -2 ... encode as 0, 1, 2, 3 ... so small
# magnitudes of either sign take one byte.
_ENC_TABLE_SIZE = 1 << 14  # lengths and offset deltas below this come straight from the table
_MAX_VARINT_BYTES = 10  # a varlong; longer is malformed


def _encode_varint(value: int) -> bytes:
    """Zigzag + base-128 encoding of a signed 64-bit integer."""
    if not -(2**63) <= value < 2**63:
        raise errors.InvalidRecordError(f"value {value} does not fit a varlong")
    return encode_uvarint((value << 1) ^ (value >> 63))


def encode_uvarint(n: int) -> bytes:
    """Base-128 encoding of an unsigned integer (protobuf's varint; Kafka's unsigned varint)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_ENC: list[bytes] = [_encode_varint(v) for v in range(_ENC_TABLE_SIZE)]
_ENC_NULL = _encode_varint(-1)  # b"\x01": a null key, value or header value
# One-byte zigzag decode: raw byte (< 0x80) -> signed value.
_DEC1: list[int] = [(b >> 1) ^ -(b & 1) for b in range(0x80)]
# Two-byte zigzag decode, indexed by the 14 payload bits (low byte's 7 bits | high byte << 7).
_DEC2: list[int] = [(z >> 1) ^ -(z & 1) for z in range(1 << 14)]


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode the zigzag varint at ``pos``: (value, position after it). The slow, general path."""
    shift = 0
    raw = 0
    for i in range(pos, pos + _MAX_VARINT_BYTES):
        b = data[i]  # IndexError on a truncated varint: the caller reports it
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            if raw >> 64:
                raise errors.InvalidRecordError(f"varint at record position {pos} overflows 64 bits")
            return (raw >> 1) ^ -(raw & 1), i + 1
        shift += 7
    raise errors.InvalidRecordError(f"varint at record position {pos} is longer than {_MAX_VARINT_BYTES} bytes")


def record_heads(data: Buffer, start: int, end: int, count: int) -> Iterator[tuple[int, int]]:
    """(timestamp delta, key length) of each record of the records section ``data[start:end]``, in order, at
    most ``count``: length, attributes (one byte), timestamp delta, offset delta, key length. It stops quietly,
    before yielding anything for it, at the first record whose bytes make no sense: a batch the record walk
    refused at a record it could decode but not accept was never walked past that record."""
    view = bytes(memoryview(data)[start:end])
    p = 0
    for _ in range(count):
        if p >= len(view):
            return
        try:
            length, body = _read_varint(view, p)
            if length < 6 or body + length > len(view):
                return
            delta, q = _read_varint(view, body + 1)
            _, q = _read_varint(view, q)
            key_length, _ = _read_varint(view, q)
        except (IndexError, errors.BrookError):
            return
        yield delta, key_length
        p = body + length


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _encode_headers(headers: Iterable[tuple[str, bytes | None]]) -> bytes:
    items = headers if isinstance(headers, list | tuple) else list(headers)
    parts = [_encode_varint(len(items))]
    for key, value in items:
        key_bytes = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        parts.append(_encode_varint(len(key_bytes)))
        parts.append(key_bytes)
        if value is None:
            parts.append(_ENC_NULL)
        else:
            value = bytes(value)
            parts.append(_encode_varint(len(value)))
            parts.append(value)
    return b"".join(parts)


class _PyRecordsWriter:
    """The records section of a batch being built: the reference for the compiled RecordsWriter
    (storage/_record_walk.c), which RecordBatchBuilder uses when the extension is built.

    ``append`` encodes one record (headers already encoded, b"\x00" for none) and returns its
    offset delta; ``take`` hands the records over once, with their count and first and largest
    timestamps. ``size`` is the batch's size if it were built now, uncompressed.
    """

    __slots__ = ("_buf", "count", "base_ts", "max_ts", "size")

    def __init__(self, size: int) -> None:
        self._buf: bytearray | None = bytearray()
        self.count = 0
        self.base_ts = self.max_ts = NO_TIMESTAMP
        self.size = size

    def append(self, timestamp_ms: int, key: bytes | None, value: bytes | None, headers_b: bytes) -> int:
        buf = self._buf
        if buf is None or self.count >= MAX_RECORDS_PER_BATCH:
            raise ValueError("the records were taken" if buf is None else "the batch is full")
        offset_delta = self.count
        ts_delta = timestamp_ms - self.base_ts if offset_delta else 0
        # Encoded before any state changes: a refused record leaves the batch as it was.
        enc = _ENC
        ts_b = enc[ts_delta] if 0 <= ts_delta < _ENC_TABLE_SIZE else _encode_varint(ts_delta)
        od_b = enc[offset_delta] if offset_delta < _ENC_TABLE_SIZE else _encode_varint(offset_delta)
        if key is None:
            key_b, key = _ENC_NULL, b""
        else:
            n = len(key)
            key_b = enc[n] if n < _ENC_TABLE_SIZE else _encode_varint(n)
        if value is None:
            value_b, value = _ENC_NULL, b""
        else:
            n = len(value)
            value_b = enc[n] if n < _ENC_TABLE_SIZE else _encode_varint(n)
        body_len = (
            1 + len(ts_b) + len(od_b) + len(key_b) + len(key) + len(value_b) + len(value) + len(headers_b)
        )
        len_b = enc[body_len] if body_len < _ENC_TABLE_SIZE else _encode_varint(body_len)
        # length, attributes (always 0), deltas, key, value, headers
        buf += b"".join((len_b, b"\x00", ts_b, od_b, key_b, key, value_b, value, headers_b))
        self.size += len(len_b) + body_len
        if offset_delta == 0:
            self.base_ts = self.max_ts = timestamp_ms
        elif timestamp_ms > self.max_ts:
            self.max_ts = timestamp_ms
        self.count = offset_delta + 1
        return offset_delta

    def take(self) -> tuple[bytearray, int, int, int]:
        buf, self._buf = self._buf, None
        if buf is None:
            raise ValueError("the records were taken")
        return buf, self.count, self.base_ts, self.max_ts


# The compiled writer (storage/_record_walk.c) when the extension is built, else the reference.
_RecordsWriter: Any = getattr(record_walk._compiled, "RecordsWriter", None) or _PyRecordsWriter


class RecordBatchBuilder:
    """Accumulate records and build one RecordBatch v2.

    Offsets are base_offset + append order (the broker rewrites the base offset); the
    first record's timestamp is the base timestamp. Records are encoded into one
    bytearray as they are appended, by a records writer (in C when the extension is built);
    compression, when asked, covers the records section.
    """

    __slots__ = (
        "_codec",
        "_level",
        "_attributes",
        "_producer_id",
        "_producer_epoch",
        "_base_sequence",
        "_partition_leader_epoch",
        "_base_offset",
        "_records",
        "_built",
    )

    def __init__(
        self,
        compression: int = CODEC_NONE,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        timestamp_type: int = TIMESTAMP_CREATE_TIME,
        is_transactional: bool = False,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        base_offset: int = 0,
        is_control: bool = False,
        compression_level: int | None = None,
    ) -> None:
        if compression not in (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD):
            raise errors.InvalidRecordError(f"unknown compression codec {compression}")
        if timestamp_type not in (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME):
            raise errors.InvalidRecordError(f"unknown timestamp type {timestamp_type}")
        self._codec = compression
        self._level = compression_level
        self._attributes = (
            compression
            | (ATTR_TIMESTAMP_TYPE if timestamp_type == TIMESTAMP_LOG_APPEND_TIME else 0)
            | (ATTR_TRANSACTIONAL if is_transactional else 0)
            | (ATTR_CONTROL if is_control else 0)
        )
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._partition_leader_epoch = partition_leader_epoch
        self._base_offset = base_offset
        self._records = _RecordsWriter(BATCH_HEADER_SIZE)
        self._built = False

    @property
    def record_count(self) -> int:
        return self._records.count

    @property
    def size_estimate(self) -> int:
        """Size of the batch if built now without compression (an upper bound for most data)."""
        return self._records.size

    @property
    def records_writer(self) -> Any:
        """The writer the records are encoded into: the producer's accumulator appends through its
        ``append_future`` (compiled writer only) while the batch is open, and nothing else may."""
        return self._records

    @property
    def compression(self) -> int:
        return self._codec

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] = (),
    ) -> int:
        """Add one record; returns its offset delta."""
        if self._built:
            raise errors.InvalidRecordError("batch already built")
        if self._records.count >= MAX_RECORDS_PER_BATCH:
            raise errors.InvalidRecordError(f"a batch holds at most {MAX_RECORDS_PER_BATCH} records")
        if key is not None and key.__class__ is not bytes:
            key = bytes(key)  # a caller's bytearray could change before build
        if value is not None and value.__class__ is not bytes:
            value = bytes(value)
        headers_b = _encode_headers(headers) if headers else b"\x00"
        try:
            return self._records.append(timestamp_ms, key, value, headers_b)
        except OverflowError:  # the compiled writer; the reference raises this error itself
            raise errors.InvalidRecordError(
                f"timestamp {timestamp_ms}: its delta from the batch's first record does not fit a varlong") from None

    def build(self, producer_state: tuple[int, int, int] | None = None) -> bytes:
        """The complete batch: header, CRC-32C, records (compressed as configured).

        ``producer_state`` (producer id, epoch, base sequence) replaces the builder's own, so that an
        idempotent producer's batch is checksummed once, with the sequence the sender gave it."""
        if self._records.count == 0:
            raise errors.InvalidRecordError("cannot build a batch with no records")
        self._built = True
        records: bytes | bytearray
        records, count, base_ts, max_ts = self._records.take()
        if self._codec != CODEC_NONE:
            records = compression.compress(self._codec, bytes(records), self._level)
        producer_id, producer_epoch, base_sequence = producer_state or (
            self._producer_id, self._producer_epoch, self._base_sequence)
        after_crc = _HEADER_AFTER_CRC.pack(
            self._attributes,
            count - 1,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        crc = crc32c(records, crc32c(after_crc))
        before_crc = _HEADER_BEFORE_CRC.pack(
            self._base_offset, MIN_BATCH_LENGTH + len(records), self._partition_leader_epoch, MAGIC
        )
        return b"".join((before_crc, _UINT32.pack(crc), after_crc, records))


def build_empty_batch(h: BatchHeader, base_offset: int) -> bytes:
    """A batch of no records spanning [``base_offset``, ``h.last_offset``] of batch ``h`` (Kafka's
    writeEmptyHeader): what the cleaner leaves of a producer's last batch whose last records went, so that producer
    state rebuilt from the log still finds the producer's epoch, last sequence and last offset. Uncompressed; its
    base sequence is the one of ``base_offset`` in ``h``, both timestamps ``h``'s largest."""
    delta = base_offset - h.base_offset
    base_sequence = NO_SEQUENCE if h.base_sequence == NO_SEQUENCE else (h.base_sequence + delta) % 2**31
    attributes = h.attributes & (ATTR_TIMESTAMP_TYPE | ATTR_TRANSACTIONAL | ATTR_CONTROL)
    after_crc = _HEADER_AFTER_CRC.pack(attributes, h.last_offset - base_offset, h.max_timestamp, h.max_timestamp,
                                       h.producer_id, h.producer_epoch, base_sequence, 0)
    before_crc = _HEADER_BEFORE_CRC.pack(base_offset, MIN_BATCH_LENGTH, h.partition_leader_epoch, MAGIC)
    return b"".join((before_crc, _UINT32.pack(crc32c(after_crc)), after_crc))


# Control records (transaction markers): key = int16 version 0 + int16 type; value =
# int16 version 0 + int32 coordinator epoch (Kafka's EndTransactionMarker).
CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")


def build_control_batch(
    commit: bool,
    *,
    producer_id: int,
    producer_epoch: int,
    timestamp_ms: int,
    coordinator_epoch: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    base_offset: int = 0,
) -> bytes:
    """A transactional control batch holding one COMMIT or ABORT marker."""
    builder = RecordBatchBuilder(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
        base_offset=base_offset,
    )
    builder.append(
        timestamp_ms,
        _CONTROL_KEY.pack(0, CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT),
        _END_TXN_MARKER.pack(0, coordinator_epoch),
    )
    return builder.build()


def parse_control_record(record: Record) -> tuple[int, int]:
    """(control type, coordinator epoch) of a record from a control batch."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise errors.InvalidRecordError("control record key is missing or short")
    _version, control_type = _CONTROL_KEY.unpack_from(record.key)
    coordinator_epoch = -1
    if record.value is not None and len(record.value) >= _END_TXN_MARKER.size:
        coordinator_epoch = _END_TXN_MARKER.unpack_from(record.value)[1]
    return control_type, coordinator_epoch


def end_txn_marker(buf: Buffer, pos: int = 0) -> tuple[int, int] | None:
    """(control type, coordinator epoch) of the COMMIT or ABORT marker in the control batch at ``pos``, or None
    when it holds none: an empty batch (Kafka's cleaner leaves one once its transaction is cleaned away), or
    another control type (Kafka's KRaft records use them; they end no transaction). The type is in the record,
    not the header, so producer state reads it here: markers are rare and one record long."""
    h, records = decode_batch(buf, pos, verify_crc=False)
    if not h.is_control or not records:
        return None
    try:
        control_type, coordinator_epoch = parse_control_record(records[0])
    except errors.InvalidRecordError:
        return None
    if control_type not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
        return None
    return control_type, coordinator_epoch


def decode_batch(
    buf: Buffer,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    max_decompressed_bytes: int = compression.DEFAULT_MAX_OUTPUT_BYTES,
) -> tuple[BatchHeader, list[Record]]:
    """Decompress and decode the batch at ``pos`` into its header and records.

    CRC mismatch, truncation, a record count that does not match the records present
    -> CorruptMessageError; a malformed record (bad varint, lengths that overrun the
    record, invalid UTF-8 header key) -> InvalidRecordError.
    """
    h, section, start, end = batch_section(
        buf, pos, verify_crc=verify_crc, max_decompressed_bytes=max_decompressed_bytes
    )
    if start != 0 or end != len(section) or section.__class__ is not bytes:
        with memoryview(section) as view:
            section = bytes(view[start:end])
    log_append_ts = h.max_timestamp if h.attributes & ATTR_TIMESTAMP_TYPE else None
    return h, _decode_records(section, h.record_count, h.base_offset, h.base_timestamp, log_append_ts, pos)


def batch_section(
    buf: Buffer,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    max_decompressed_bytes: int = compression.DEFAULT_MAX_OUTPUT_BYTES,
) -> tuple[BatchHeader, Buffer, int, int]:
    """The checked header and the decompressed records section of the batch at ``pos``.

    Returns (header, section buffer, start, end): the records are ``section[start:end]``,
    which is ``buf`` itself for an uncompressed batch (no copy) and the decompressed
    bytes otherwise. Header, CRC and decompression errors as ``decode_batch``.
    """
    if verify_crc:
        h = validate_batch(buf, pos)
    else:
        h = read_header(buf, pos)
        _check_header(h, pos, None, True)
        if pos + h.batch_length + LOG_OVERHEAD > len(buf):
            raise errors.CorruptMessageError(f"truncated batch at position {pos}")
    end = pos + h.batch_length + LOG_OVERHEAD
    codec = h.attributes & ATTR_CODEC_MASK
    if codec == CODEC_NONE:
        return h, buf, pos + BATCH_HEADER_SIZE, end
    with memoryview(buf) as view:
        data = bytes(view[pos + BATCH_HEADER_SIZE : end])
    data = compression.decompress(codec, data, max_output_bytes=max_decompressed_bytes)
    return h, data, 0, len(data)


def _decode_records(
    data: bytes, count: int, base_offset: int, base_ts: int, log_append_ts: int | None, batch_pos: int
) -> list[Record]:
    """The per-record loop, flat on purpose: varints of one or two bytes are decoded inline."""
    records: list[Record] = []
    append = records.append
    dec1 = _DEC1
    dec2 = _DEC2
    read_varint = _read_varint
    n = len(data)
    p = 0
    i = 0
    try:
        for i in range(count):  # noqa: B007 - i names the record in error messages
            if p >= n:
                raise errors.CorruptMessageError(
                    f"batch at position {batch_pos} declares {count} records but holds {i}"
                )
            # record length
            b = data[p]
            if b < 0x80:
                length = dec1[b]
                p += 1
            else:
                b2 = data[p + 1]
                if b2 < 0x80:
                    length = dec2[(b & 0x7F) | (b2 << 7)]
                    p += 2
                else:
                    length, p = read_varint(data, p)
            rec_end = p + length
            if length < 6 or rec_end > n:
                raise errors.InvalidRecordError(
                    f"record {i} of batch at position {batch_pos} has length {length}, "
                    f"{n - p} bytes remain"
                )
            p += 1  # record attributes: unused in v2
            # timestamp delta
            b = data[p]
            if b < 0x80:
                ts_delta = dec1[b]
                p += 1
            else:
                b2 = data[p + 1]
                if b2 < 0x80:
                    ts_delta = dec2[(b & 0x7F) | (b2 << 7)]
                    p += 2
                else:
                    ts_delta, p = read_varint(data, p)
            # offset delta
            b = data[p]
            if b < 0x80:
                offset_delta = dec1[b]
                p += 1
            else:
                b2 = data[p + 1]
                if b2 < 0x80:
                    offset_delta = dec2[(b & 0x7F) | (b2 << 7)]
                    p += 2
                else:
                    offset_delta, p = read_varint(data, p)
            # key
            b = data[p]
            if b < 0x80:
                kl = dec1[b]
                p += 1
            else:
                kl, p = read_varint(data, p)
            if kl >= 0:
                key: bytes | None = data[p : p + kl]
                p += kl
            elif kl == -1:
                key = None
            else:
                raise errors.InvalidRecordError(f"record {i}: key length {kl}")
            # value
            b = data[p]
            if b < 0x80:
                vl = dec1[b]
                p += 1
            else:
                b2 = data[p + 1]
                if b2 < 0x80:
                    vl = dec2[(b & 0x7F) | (b2 << 7)]
                    p += 2
                else:
                    vl, p = read_varint(data, p)
            if vl >= 0:
                value: bytes | None = data[p : p + vl]
                p += vl
            elif vl == -1:
                value = None
            else:
                raise errors.InvalidRecordError(f"record {i}: value length {vl}")
            # headers
            if data[p] == 0:
                headers: list[tuple[str, bytes | None]] = []
                p += 1
            else:
                headers, p = _decode_headers(data, p, rec_end)
            if p != rec_end:
                raise errors.InvalidRecordError(
                    f"record {i} of batch at position {batch_pos}: fields end at {p}, length says {rec_end}"
                )
            append(
                Record(
                    base_offset + offset_delta,
                    base_ts + ts_delta if log_append_ts is None else log_append_ts,
                    key,
                    value,
                    headers,
                )
            )
    except IndexError:
        raise errors.InvalidRecordError(
            f"record {i} of batch at position {batch_pos} is truncated (ends past its length)"
        ) from None
    if p != n:
        raise errors.CorruptMessageError(
            f"batch at position {batch_pos} declares {count} records but {n - p} bytes of records remain"
        )
    return records


def _decode_headers(data: bytes, p: int, rec_end: int) -> tuple[list[tuple[str, bytes | None]], int]:
    count, p = _read_varint(data, p)
    # Each header takes at least 2 bytes: a larger count is malformed (and must not drive a long loop).
    if count < 0 or count * 2 > rec_end - p:
        raise errors.InvalidRecordError(f"record has an invalid header count {count}")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        kl, p = _read_varint(data, p)
        if kl < 0 or p + kl > rec_end:
            raise errors.InvalidRecordError(f"header key length {kl} is invalid")
        try:
            key = data[p : p + kl].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise errors.InvalidRecordError(f"header key is not valid UTF-8: {exc}") from None
        p += kl
        vl, p = _read_varint(data, p)
        if vl >= 0:
            if p + vl > rec_end:
                raise errors.InvalidRecordError(f"header value length {vl} overruns the record")
            headers.append((key, data[p : p + vl]))
            p += vl
        elif vl == -1:
            headers.append((key, None))
        else:
            raise errors.InvalidRecordError(f"header value length {vl} is invalid")
    return headers, p


def decode_records(buf: Buffer) -> Iterator[Record]:
    """Records of every complete batch in ``buf`` (CRC-checked), skipping control batches.

    A torn tail (as a fetch cut at max_bytes leaves) is ignored, as Kafka consumers do.
    """
    for pos, h in iter_batches(buf):
        if h.attributes & ATTR_CONTROL:
            continue
        yield from decode_batch(buf, pos)[1]
