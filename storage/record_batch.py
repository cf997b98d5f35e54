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
from collections.abc import Iterator
from dataclasses import dataclass

from crc32c import crc32c

from proto import errors

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
    h = read_header(buf, pos)
    end = pos + h.batch_length + LOG_OVERHEAD
    if end > len(buf):
        raise errors.CorruptMessageError(f"truncated batch at position {pos}")
    _INT16.pack_into(buf, pos + 21, h.attributes | ATTR_TIMESTAMP_TYPE)
    _INT64.pack_into(buf, pos + 35, timestamp_ms)
    with memoryview(buf) as view:
        crc = crc32c(view[pos + CRC_START : end])
    _UINT32.pack_into(buf, pos + 17, crc)
