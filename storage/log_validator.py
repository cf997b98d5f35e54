"""LogValidator: the leader's check of every record of every produced batch (Kafka's name).

``validate_batches`` (record_batch.py) checks what the header and the CRC can tell: a
CRC only proves the bytes arrived as the client wrote them, not that a consumer can
decode them. A client that writes a valid CRC over a batch whose records do not match
its header would otherwise make the partition unreadable at that offset for every
consumer, forever. So the leader decompresses (with a bound) and walks every record
before anything is written, as Kafka's broker does on produce:

- attributes: no control or transactional batch (Brook has no transactions: only the
  broker could write markers), no delete-horizon flag (the cleaner's), no LogAppendTime
  flag (the broker's), no undefined bits;
- compressed records section decompresses within ``decompressed_bytes_max`` and
  cleanly (no truncation, no trailing bytes after the frames);
- exactly ``record_count`` records that consume the records section exactly: each
  record's length, varints, key, value and headers consistent and consuming exactly its
  length; offset deltas 0, 1, ... n-1 in order;
- header keys are UTF-8 (consumers decode them as strings);
- keys present on a compacted topic (a keyless record cannot be compacted);
- CreateTime: record timestamps fit an int64; the header's max timestamp is recomputed
  from the records and corrected in place if it lies (as Kafka does), since retention
  and the time index trust it.

Bytes that cannot be decoded raise CorruptMessageError (CORRUPT_MESSAGE); decodable
records that are not allowed raise InvalidRecordError (INVALID_RECORD). The message
names the batch and record. Follower appends are not re-validated: their bytes were
validated by the leader that wrote them.

Speed: this is the one per-record loop on the produce path. It is a flat walk over
positions (no Record objects, no key/value copies), with one- and two-byte varints
decoded inline from tables; the general varint path and headers are off the fast path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proto import errors
from storage import compression
from storage.log_config import LogConfig
from storage.record_batch import (
    ATTR_CODEC_MASK,
    ATTR_CONTROL,
    ATTR_DELETE_HORIZON,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    CODEC_NONE,
    LOG_OVERHEAD,
    BatchHeader,
    Buffer,
    set_max_timestamp,
)

__all__ = ["LogValidator", "decompressed_limit"]

logger = logging.getLogger(__name__)

# Legitimate batches compress 2-50x; a decompressed records section this many times the
# topic's max.message.bytes is a bomb. Never above the consumers' own decode bound, so
# anything accepted here is readable by every Brook consumer.
DECOMPRESSION_RATIO_MAX = 32
DECOMPRESSED_BYTES_FLOOR = 1024 * 1024  # a tiny max.message.bytes still allows 1 MiB of records
DECOMPRESSED_BYTES_CAP = compression.DEFAULT_MAX_OUTPUT_BYTES

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_VARINT_BYTES_MAX = 10  # a varlong; longer is malformed
# Bits a producer may set: the codec only. Timestamp type is the broker's (LogAppendTime
# topics stamp it), transactional/control are transaction markers' (none in Brook), the
# delete horizon is the cleaner's; bits 7.. are undefined.
_CLIENT_ATTRIBUTES = ATTR_CODEC_MASK
_ATTRIBUTE_NAMES = (
    (ATTR_CONTROL, "control"),
    (ATTR_TRANSACTIONAL, "transactional"),
    (ATTR_TIMESTAMP_TYPE, "LogAppendTime timestamp type"),
    (ATTR_DELETE_HORIZON, "delete-horizon"),
)

# Zigzag decode tables (as record_batch's decoder): one byte < 0x80, and two bytes indexed
# by their 14 payload bits.
_DEC1: tuple[int, ...] = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))
_DEC2: tuple[int, ...] = tuple((z >> 1) ^ -(z & 1) for z in range(1 << 14))


def decompressed_limit(max_message_bytes: int) -> int:
    """Largest decompressed records section accepted for a topic's ``max.message.bytes``."""
    return min(DECOMPRESSED_BYTES_CAP, max(DECOMPRESSED_BYTES_FLOOR, DECOMPRESSION_RATIO_MAX * max_message_bytes))


@dataclass(frozen=True, slots=True)
class _RecordsSummary:
    max_timestamp: int


class LogValidator:
    """Validate produced batches for one log's config; see the module docstring for the rules."""

    __slots__ = ("_compact", "_create_time", "_decompressed_max")

    def __init__(self, config: LogConfig) -> None:
        self._compact = config.compact
        self._create_time = config.message_timestamp_type != "LogAppendTime"
        self._decompressed_max = decompressed_limit(config.max_message_bytes)

    @property
    def decompressed_bytes_max(self) -> int:
        return self._decompressed_max

    def validate(self, buf: bytearray, headers: list[BatchHeader]) -> None:
        """Check every batch of ``buf`` (headers from ``validate_batches``, CRCs already checked).

        Raises before changing anything; once every batch passed, corrects lying max
        timestamps in place (CreateTime topics), re-computing those batches' CRCs.
        """
        fixes: list[tuple[int, int]] = []
        pos = 0
        for h in headers:
            summary = self.validate_batch(buf, pos, h)
            if self._create_time and summary.max_timestamp != h.max_timestamp:
                fixes.append((pos, summary.max_timestamp))
            pos += h.batch_length + LOG_OVERHEAD
        if pos != len(buf):  # validate_batches walked the same buffer: an internal invariant
            raise AssertionError(f"headers cover {pos} bytes of {len(buf)}")
        for fix_pos, max_ts in fixes:
            logger.debug("batch at position %d: max timestamp corrected to %d", fix_pos, max_ts)
            set_max_timestamp(buf, fix_pos, max_ts)

    def validate_batch(self, buf: Buffer, pos: int, h: BatchHeader) -> _RecordsSummary:
        """One batch: attributes, bounded decompression, then the record walk."""
        disallowed = h.attributes & ~_CLIENT_ATTRIBUTES
        if disallowed:
            names = [name for bit, name in _ATTRIBUTE_NAMES if disallowed & bit] or [f"{disallowed:#06x}"]
            raise errors.InvalidRecordError(
                f"batch at position {pos}: attribute bits a producer may not set: {', '.join(names)}")
        end = pos + h.batch_length + LOG_OVERHEAD
        codec = h.attributes & ATTR_CODEC_MASK
        section = memoryview(buf)[pos + BATCH_HEADER_SIZE:end]
        try:
            if codec == CODEC_NONE:
                data = bytes(section)
            else:
                data = compression.decompress(codec, section, max_output_bytes=self._decompressed_max)
        except errors.CorruptMessageError as exc:
            raise errors.CorruptMessageError(f"batch at position {pos}: {exc.message}") from None
        finally:
            section.release()  # the caller's bytearray must stay resizable
        return self._walk(data, h, pos)

    def _walk(self, data: bytes, h: BatchHeader, batch_pos: int) -> _RecordsSummary:
        """Every record: structure, offset deltas, keys, timestamps. Flat on purpose (hot loop)."""
        count = h.record_count
        compact = self._compact
        dec1 = _DEC1
        dec2 = _DEC2
        n = len(data)
        p = 0
        i = 0
        max_delta = _INT64_MIN
        min_delta = _INT64_MAX
        try:
            for i in range(count):  # noqa: B007 - i names the record in error messages
                if p >= n:
                    raise errors.CorruptMessageError(
                        f"batch at position {batch_pos} declares {count} records but holds {i}")
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
                        length, p = _read_varint(data, p)
                rec_end = p + length
                if length < 6 or rec_end > n:
                    raise errors.CorruptMessageError(
                        f"record {i} of batch at position {batch_pos} has length {length}, {n - p} bytes remain")
                p += 1  # record attributes: unused in v2
                # timestamp delta (varlong)
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
                        ts_delta, p = _read_varint(data, p)
                if ts_delta > max_delta:
                    max_delta = ts_delta
                if ts_delta < min_delta:
                    min_delta = ts_delta
                # offset delta: must be the record's index
                b = data[p]
                if b == i << 1 and b < 0x80:  # zigzag of i < 64: one byte
                    p += 1
                else:
                    od, p = _read_varint(data, p)
                    if od != i:
                        raise errors.InvalidRecordError(
                            f"record {i} of batch at position {batch_pos} has offset delta {od}, expected {i}")
                # key
                b = data[p]
                if b < 0x80:
                    kl = dec1[b]
                    p += 1
                else:
                    kl, p = _read_varint(data, p)
                if kl >= 0:
                    p += kl
                elif kl != -1:
                    raise errors.CorruptMessageError(
                        f"record {i} of batch at position {batch_pos} has key length {kl}")
                elif compact:
                    raise errors.InvalidRecordError(
                        f"record {i} of batch at position {batch_pos} has no key; a compacted topic needs one")
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
                        vl, p = _read_varint(data, p)
                if vl >= 0:
                    p += vl
                elif vl != -1:
                    raise errors.CorruptMessageError(
                        f"record {i} of batch at position {batch_pos} has value length {vl}")
                # headers
                if data[p] == 0:
                    p += 1
                else:
                    p = _walk_headers(data, p, rec_end, i, batch_pos)
                # Positions only ever move forward, so ending exactly at rec_end proves that
                # every field lay inside the record.
                if p != rec_end:
                    raise errors.CorruptMessageError(
                        f"record {i} of batch at position {batch_pos}: fields end at byte {p}, "
                        f"its length says {rec_end}")
        except IndexError:
            raise errors.CorruptMessageError(
                f"record {i} of batch at position {batch_pos} is truncated") from None
        if p != n:
            raise errors.CorruptMessageError(
                f"batch at position {batch_pos} declares {count} records but {n - p} bytes follow them")
        if not self._create_time:
            return _RecordsSummary(h.max_timestamp)  # the broker stamps LogAppendTime itself
        max_ts = h.base_timestamp + max_delta
        if max_ts > _INT64_MAX or h.base_timestamp + min_delta < _INT64_MIN:
            raise errors.InvalidRecordError(
                f"batch at position {batch_pos}: record timestamps overflow 64 bits")
        return _RecordsSummary(max_ts)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The general zigzag varint at ``pos``: (value, position after it); at most 10 bytes, 64 bits.

    IndexError when the data ends inside it (the walk reports the record as truncated).
    """
    shift = 0
    raw = 0
    for i in range(pos, pos + _VARINT_BYTES_MAX):
        b = data[i]
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            if raw >> 64:
                raise errors.CorruptMessageError(f"varint at byte {pos} of the records overflows 64 bits")
            return (raw >> 1) ^ -(raw & 1), i + 1
        shift += 7
    raise errors.CorruptMessageError(f"varint at byte {pos} of the records is longer than {_VARINT_BYTES_MAX} bytes")


def _walk_headers(data: bytes, p: int, rec_end: int, i: int, batch_pos: int) -> int:
    """A record's headers (off the fast path): count, then UTF-8 keys and nullable values."""
    hcount, p = _read_varint(data, p)
    # Each header takes at least 2 bytes: a larger count is malformed, and must not drive a long loop.
    if hcount < 0 or hcount * 2 > rec_end - p:
        raise errors.CorruptMessageError(
            f"record {i} of batch at position {batch_pos} has an invalid header count {hcount}")
    for _ in range(hcount):
        kl, p = _read_varint(data, p)
        if kl < 0 or p + kl > rec_end:
            raise errors.CorruptMessageError(
                f"record {i} of batch at position {batch_pos} has header key length {kl}")
        try:
            data[p:p + kl].decode("utf-8")
        except UnicodeDecodeError:
            raise errors.InvalidRecordError(
                f"record {i} of batch at position {batch_pos} has a header key that is not UTF-8") from None
        p += kl
        vl, p = _read_varint(data, p)
        if vl >= 0:
            p += vl
        elif vl != -1:
            raise errors.CorruptMessageError(
                f"record {i} of batch at position {batch_pos} has header value length {vl}")
    return p
