"""LogValidator: the leader's check of every record of every produced batch (Kafka's name).

``validate_batches`` (record_batch.py) checks what the header and the CRC can tell: a
CRC only proves the bytes arrived as the client wrote them, not that a consumer can
decode them. A client that writes a valid CRC over a batch whose records do not match
its header would otherwise make the partition unreadable at that offset for every
consumer, forever. So the leader decompresses (with a bound) and walks every record
before anything is written, as Kafka's broker does on produce:

- attributes: never a control batch (markers are the transaction coordinator's, written by
  ``Log.append_marker_as_leader``; Kafka: "clients are not allowed to write control
  records"), no delete-horizon flag (the cleaner's), no LogAppendTime flag (the broker's),
  no undefined bits; the transactional flag only in a transactional produce (``validate``
  with ``transactional=True``: a transactional id named), and then on every batch, each
  with a producer id and a base sequence (Kafka's LogValidator and ProduceRequest);
- compressed records section decompresses within ``decompressed_bytes_max`` and
  cleanly (no truncation, no trailing bytes after the frames);
- exactly ``record_count`` records that consume the records section exactly: each
  record's length, varints, key, value and headers consistent and consuming exactly its
  length; offset deltas 0, 1, ... n-1 in order;
- header keys are UTF-8 (consumers decode them as strings);
- keys present on a compacted topic (a keyless record cannot be compacted);
- CreateTime: record timestamps fit an int64 and lie within
  ``message.timestamp.before.max.ms`` behind and ``message.timestamp.after.max.ms`` ahead of
  the broker's clock (KIP-937; else INVALID_TIMESTAMP): a record stamped years ahead would
  keep its segment from time-based retention for as long; the header's max timestamp is
  recomputed from the records and corrected in place if it lies (as Kafka does), since
  retention and the time index trust it.

Bytes that cannot be decoded raise CorruptMessageError (CORRUPT_MESSAGE); decodable
records that are not allowed raise InvalidRecordError (INVALID_RECORD). The message
names the batch and record. Follower appends are not re-validated: their bytes were
validated by the leader that wrote them.

Speed: this is the one per-record loop on the produce path: ``storage.record_walk``, a
C extension built by ``pip install`` (a few ns per record, uncompressed batches walked in
place) with a pure-Python fallback that gives identical results.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from proto import errors
from storage import compression, record_batch, record_walk
from storage.log_config import MAX_TIMESTAMP_MS, LogConfig
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
# librdkafka refuses a zstd batch that decompresses past its receive.message.max.bytes (100,000,000 by
# default), and its consumer then stops at that batch for good (audit: a 105 MB value compressed to 3 KB).
LIBRDKAFKA_RECEIVE_MAX_BYTES = 100_000_000
DECOMPRESSED_BYTES_CAP = min(compression.DEFAULT_MAX_OUTPUT_BYTES, LIBRDKAFKA_RECEIVE_MAX_BYTES)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Bits a producer may set: the codec, and the transactional flag in a transactional produce. Timestamp
# type is the broker's (LogAppendTime topics stamp it), control is the transaction markers' (the
# coordinator's), the delete horizon is the cleaner's; bits 7.. are undefined.
_CLIENT_ATTRIBUTES = ATTR_CODEC_MASK
_TXN_CLIENT_ATTRIBUTES = ATTR_CODEC_MASK | ATTR_TRANSACTIONAL
_ATTRIBUTE_NAMES = (
    (ATTR_CONTROL, "control"),
    (ATTR_TRANSACTIONAL, "transactional"),
    (ATTR_TIMESTAMP_TYPE, "LogAppendTime timestamp type"),
    (ATTR_DELETE_HORIZON, "delete-horizon"),
)


def decompressed_limit(max_message_bytes: int) -> int:
    """Largest decompressed records section accepted for a topic's ``max.message.bytes``."""
    return min(DECOMPRESSED_BYTES_CAP, max(DECOMPRESSED_BYTES_FLOOR, DECOMPRESSION_RATIO_MAX * max_message_bytes))


@dataclass(frozen=True, slots=True)
class _RecordsSummary:
    max_timestamp: int


# A Produce answer's record_errors (KIP-467): at most this many records listed, found among at most this many.
MAX_RECORD_ERRORS = 100
RECORD_ERRORS_SCAN = 10_000


class LogValidator:
    """Validate produced batches for one log's config; see the module docstring for the rules."""

    __slots__ = ("_compact", "_create_time", "_decompressed_max", "_before_max_ms", "_after_max_ms")

    def __init__(self, config: LogConfig) -> None:
        self._compact = config.compact
        self._create_time = config.message_timestamp_type != "LogAppendTime"
        self._decompressed_max = decompressed_limit(config.max_message_bytes)
        self._before_max_ms = config.message_timestamp_before_max_ms
        self._after_max_ms = config.message_timestamp_after_max_ms

    @property
    def decompressed_bytes_max(self) -> int:
        return self._decompressed_max

    def validate(self, buf: bytearray, headers: list[BatchHeader], now_ms: int | None = None, *,
                 transactional: bool = False) -> None:
        """Check every batch of ``buf`` (headers from ``validate_batches``, CRCs already checked) at the
        broker's time ``now_ms`` (default: the wall clock). ``transactional``: a transactional produce,
        whose batches must all be transactional (and no other may be).

        Raises before changing anything; once every batch passed, corrects lying max
        timestamps in place (CreateTime topics), re-computing those batches' CRCs.
        """
        now = int(time.time() * 1000) if now_ms is None else now_ms
        fixes: list[tuple[int, int]] = []
        pos = 0
        records_before = 0
        for h in headers:
            try:
                summary = self.validate_batch(buf, pos, h, now, transactional=transactional)
            except errors.BrookError as exc:
                if exc.record_errors:  # indexes within the batch -> within the partition's records
                    exc.record_errors = tuple((records_before + i, m) for i, m in exc.record_errors)
                raise
            records_before += h.record_count
            if self._create_time and summary.max_timestamp != h.max_timestamp:
                fixes.append((pos, summary.max_timestamp))
            pos += h.batch_length + LOG_OVERHEAD
        if pos != len(buf):  # validate_batches walked the same buffer: an internal invariant
            raise AssertionError(f"headers cover {pos} bytes of {len(buf)}")
        for fix_pos, max_ts in fixes:
            logger.debug("batch at position %d: max timestamp corrected to %d", fix_pos, max_ts)
            set_max_timestamp(buf, fix_pos, max_ts)

    def validate_batch(self, buf: Buffer, pos: int, h: BatchHeader, now_ms: int | None = None, *,
                       transactional: bool = False) -> _RecordsSummary:
        """One batch: attributes, bounded decompression, then the record walk."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        disallowed = h.attributes & ~(_TXN_CLIENT_ATTRIBUTES if transactional else _CLIENT_ATTRIBUTES)
        if disallowed:
            names = [name for bit, name in _ATTRIBUTE_NAMES if disallowed & bit] or [f"{disallowed:#06x}"]
            raise errors.InvalidRecordError(
                f"batch at position {pos}: attribute bits a producer may not set: {', '.join(names)}")
        if transactional:
            self._check_transactional(pos, h)
        start = pos + BATCH_HEADER_SIZE
        end = pos + h.batch_length + LOG_OVERHEAD
        codec = h.attributes & ATTR_CODEC_MASK
        if codec == CODEC_NONE:
            return self._walk(buf, start, end, h, pos, now)  # in place: no copy
        section = memoryview(buf)[start:end]
        try:
            data = compression.decompress(codec, section, max_output_bytes=self._decompressed_max, one_gzip_member=True)
        except (errors.CorruptMessageError, errors.InvalidRecordError) as exc:  # the same error, placed
            raise type(exc)(f"batch at position {pos}: {exc.message}") from None
        finally:
            section.release()  # the caller's bytearray must stay resizable
        return self._walk(data, 0, len(data), h, pos, now)

    @staticmethod
    def _check_transactional(pos: int, h: BatchHeader) -> None:
        if not h.attributes & ATTR_TRANSACTIONAL:
            raise errors.InvalidRecordError(
                f"batch at position {pos} is not transactional, in a transactional produce")
        if h.producer_id < 0:
            raise errors.InvalidRecordError(f"transactional batch at position {pos} without a producer id")
        if h.base_sequence < 0:
            raise errors.InvalidRecordError(
                f"transactional batch at position {pos} of producer {h.producer_id} without a base sequence "
                f"({h.base_sequence})")

    def _walk(self, data: Buffer, start: int, end: int, h: BatchHeader, batch_pos: int,
              now: int) -> _RecordsSummary:
        kind, i, a, b, min_delta, max_delta = record_walk.walk(data, start, end, h.record_count, self._compact)
        if kind != record_walk.OK:
            exc = _walk_error(kind, i, a, b, h.record_count, batch_pos)
            if kind == record_walk.NO_KEY:
                exc = self._compacted_refusal(exc, data, start, end, h, batch_pos, now)
            elif exc.code == errors.InvalidRecordError.code:
                exc.record_errors = ((i, exc.message),)
            raise exc
        if not self._create_time:
            return _RecordsSummary(h.max_timestamp)  # the broker stamps LogAppendTime itself
        max_ts = h.base_timestamp + max_delta
        min_ts = h.base_timestamp + min_delta
        try:
            self._check_timestamps(h, batch_pos, min_ts, max_ts, now)
        except errors.InvalidTimestampError as exc:
            exc.record_errors, _ = self._record_errors(data, start, end, h, batch_pos, now)
            raise
        return _RecordsSummary(max_ts)

    def _compacted_refusal(self, exc: errors.BrookError, data: Buffer, start: int, end: int, h: BatchHeader,
                           batch_pos: int, now: int) -> errors.BrookError:
        """A compacted topic's batch with keyless records (``exc``: the walk's error at the first one), answered as
        Kafka's LogValidator does: INVALID_TIMESTAMP if any listed record has a bad timestamp, else ``exc``."""
        out, late = self._record_errors(data, start, end, h, batch_pos, now)
        if late:
            exc = errors.InvalidTimestampError(
                f"batch at position {batch_pos}: {len(out) - late} record(s) without a key (a compacted topic needs "
                f"one) and {late} with a timestamp out of range; record_errors lists each")
        exc.record_errors = out
        return exc

    def _record_errors(self, data: Buffer, start: int, end: int, h: BatchHeader, batch_pos: int,
                       now: int) -> tuple[tuple[tuple[int, str], ...], int]:
        """The records of a refused batch that break the rules, as Kafka's LogValidator lists them (KIP-467), and
        how many of them for their timestamp: each record is checked for its key (a keyless one on a compacted
        topic), then, if it has one, for its timestamp (CreateTime topics). At most MAX_RECORD_ERRORS among the
        first RECORD_ERRORS_SCAN records, read again in Python (a refused batch only); the records after a
        keyless one were never walked, so the listing stops quietly at the first whose bytes make no sense.
        None found: none listed, and the partition's error says why."""
        out: list[tuple[int, str]] = []
        late = 0
        for i, (delta, key_length) in enumerate(record_batch.record_heads(data, start, end,
                                                                          min(h.record_count, RECORD_ERRORS_SCAN))):
            if key_length == -1 and self._compact:
                out.append((i, _walk_error(record_walk.NO_KEY, i, 0, 0, h.record_count, batch_pos).message))
            elif self._create_time:
                ts = h.base_timestamp + delta
                try:
                    self._check_timestamps(h, -1, ts, ts, now)
                except errors.InvalidTimestampError as bad:
                    out.append((i, bad.message.split(": ", 1)[-1]))
                    late += 1
                except errors.BrookError:
                    pass  # a timestamp past 64 bits: refused for the whole batch before any record is listed
            if len(out) >= MAX_RECORD_ERRORS:
                break
        return tuple(out), late

    def _check_timestamps(self, h: BatchHeader, batch_pos: int, min_ts: int, max_ts: int, now: int) -> None:
        if max_ts > _INT64_MAX or min_ts < _INT64_MIN:
            raise errors.InvalidRecordError(f"batch at position {batch_pos}: record timestamps overflow 64 bits")
        # Whatever message.timestamp.before/after.max.ms allow: a timestamp is -1 (none) or a time readers
        # can represent (Spark's and Python's timestamps end with the year 9999; one of -2^62 ms wrapped
        # around in the Spark source's microseconds, found by an audit).
        if min_ts < -1:
            raise errors.InvalidTimestampError(f"batch at position {batch_pos}: a record's timestamp {min_ts} is "
                                               f"negative (-1 means none)")
        if max_ts > MAX_TIMESTAMP_MS:
            raise errors.InvalidTimestampError(f"batch at position {batch_pos}: a record's timestamp {max_ts} is "
                                               f"after the year 9999")
        if max_ts - now > self._after_max_ms:
            raise errors.InvalidTimestampError(f"batch at position {batch_pos}: a record's timestamp {max_ts} is "
                                    f"{max_ts - now} ms ahead of the broker's clock "
                                    f"(message.timestamp.after.max.ms {self._after_max_ms})")
        if now - min_ts > self._before_max_ms:
            raise errors.InvalidTimestampError(f"batch at position {batch_pos}: a record's timestamp {min_ts} is "
                                    f"{now - min_ts} ms behind the broker's clock "
                                    f"(message.timestamp.before.max.ms {self._before_max_ms})")


def _walk_error(kind: int, i: int, a: int, b: int, count: int, batch_pos: int) -> errors.BrookError:
    """The exception for a failed walk: CORRUPT_MESSAGE unless the records decode but are not allowed."""
    w = record_walk
    rec = f"record {i} of batch at position {batch_pos}"
    messages = {
        w.COUNT_SHORT: f"batch at position {batch_pos} declares {count} records but holds {i}",
        w.BAD_LENGTH: f"{rec} has length {a}, {b} bytes remain",
        w.OFFSET_DELTA: f"{rec} has offset delta {a}, expected {i}",
        w.KEY_LENGTH: f"{rec} has key length {a}",
        w.NO_KEY: f"{rec} has no key; a compacted topic needs one",
        w.VALUE_LENGTH: f"{rec} has value length {a}",
        w.HEADER_COUNT: f"{rec} has an invalid header count {a}",
        w.HEADER_KEY_LENGTH: f"{rec} has header key length {a}",
        w.HEADER_KEY_UTF8: f"{rec} has a header key that is not UTF-8",
        w.HEADER_KEY_NUL: f"{rec} has a header key with a NUL character (librdkafka's consumers cut the key there)",
        w.HEADER_VALUE_LENGTH: f"{rec} has header value length {a}",
        w.FIELDS_END: f"{rec}: fields end at byte {a}, its length says {b}",
        w.TRUNCATED: f"{rec} is truncated",
        w.TRAILING: f"batch at position {batch_pos} declares {count} records but {a} bytes follow them",
        w.VARINT_OVERFLOW: f"{rec}: varint at byte {a} of the records overflows 64 bits",
        w.VARINT_TOO_LONG: f"{rec}: varint at byte {a} of the records is longer than 10 bytes",
        w.RECORD_ATTRIBUTES: f"{rec} has attributes {a:#04x}; record attributes are unused and must be 0 "
                             f"(Kafka's clients read a non-zero byte differently)",
        w.VARINT32: f"{rec}: the int32 varint at byte {a} of the records is longer than 5 bytes or out of "
                    f"range (Kafka's readVarint refuses it)",
    }
    message = messages.get(kind, f"{rec}: walk result {kind}")
    if kind in (w.OFFSET_DELTA, w.NO_KEY, w.HEADER_KEY_UTF8, w.HEADER_KEY_NUL):
        return errors.InvalidRecordError(message)
    return errors.CorruptMessageError(message)
