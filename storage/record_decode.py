"""The consumer's record decoder: a batch straight to the consumer's record tuples.

``decode_batch_tuples(buf, pos, cls, topic, partition)`` checks and decompresses the
batch at ``pos`` like ``record_batch.decode_batch`` and returns ``(header, records,
increasing)``: ``records`` holds one ``cls`` instance per record with the fields
``(topic, partition, offset, timestamp, timestamp_type, key, value, headers)``
(``client.types.ConsumerRecord``), ``increasing`` is True when their offsets strictly
increase (always, for batches a broker accepted: their offset deltas are 0, 1, 2 ...).
``cls`` must be a plain tuple subclass (a NamedTuple): instances are made without
calling its ``__new__``.

Two implementations with identical results, exceptions and messages:

- ``decode_records_c``: ``decode_records`` of the C extension ``storage._record_walk``
  (built by ``pip install``): one pass over the section that builds the final tuples
  directly, about 3x faster than the Python path;
- ``decode_records_py``: ``record_batch._decode_records`` (the reference) and one tuple
  per ``Record``; the fallback when the extension is not built (or when
  ``BROOK_PURE_PYTHON_WALK`` is set, as for the walk).

A malformed section raises what ``_decode_records`` raises: CorruptMessageError when
the record count does not match the records present, InvalidRecordError for a malformed
record. tests/storage/test_record_decode.py and the fuzz target ``records`` compare both.
"""

from __future__ import annotations

from operator import lt
from typing import Any

from proto import errors
from storage import compression, record_walk
from storage import record_batch as rb
from storage.record_walk import (
    BAD_LENGTH,
    COUNT_SHORT,
    FIELDS_END,
    HEADER_COUNT,
    HEADER_KEY_LENGTH,
    HEADER_KEY_UTF8,
    HEADER_VALUE_LENGTH,
    KEY_LENGTH,
    TRAILING,
    TRUNCATED,
    VALUE_LENGTH,
    VARINT_OVERFLOW,
    VARINT_TOO_LONG,
)

# The C decoder's error kinds: the walk's (storage/record_walk.py) plus this one.
HEADER_VALUE_OVERRUN = 16  # a header value runs past its record [length, -]

FIELDS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers")

_decode_c = getattr(record_walk._compiled, "decode_records", None)
COMPILED = _decode_c is not None


def _error(result: tuple[int, int, int, int], section: rb.Buffer, start: int, count: int,
           batch_pos: int) -> errors.BrookError:
    """The exception _decode_records raises for the C decoder's error tuple (same class, same message)."""
    kind, i, a, b = result
    if kind == COUNT_SHORT:
        return errors.CorruptMessageError(f"batch at position {batch_pos} declares {count} records but holds {i}")
    if kind == TRAILING:
        return errors.CorruptMessageError(
            f"batch at position {batch_pos} declares {count} records but {a} bytes of records remain"
        )
    if kind == BAD_LENGTH:
        message = f"record {i} of batch at position {batch_pos} has length {a}, {b} bytes remain"
    elif kind == KEY_LENGTH:
        message = f"record {i}: key length {a}"
    elif kind == VALUE_LENGTH:
        message = f"record {i}: value length {a}"
    elif kind == HEADER_COUNT:
        message = f"record has an invalid header count {a}"
    elif kind == HEADER_KEY_LENGTH:
        message = f"header key length {a} is invalid"
    elif kind == HEADER_KEY_UTF8:
        with memoryview(section) as view:
            key = bytes(view[start + a : start + a + b])
        try:
            key.decode("utf-8")
            message = "header key is not valid UTF-8"  # not reached: C and Python decode alike
        except UnicodeDecodeError as exc:
            message = f"header key is not valid UTF-8: {exc}"
    elif kind == HEADER_VALUE_OVERRUN:
        message = f"header value length {a} overruns the record"
    elif kind == HEADER_VALUE_LENGTH:
        message = f"header value length {a} is invalid"
    elif kind == FIELDS_END:
        message = f"record {i} of batch at position {batch_pos}: fields end at {a}, length says {b}"
    elif kind == TRUNCATED:
        message = f"record {i} of batch at position {batch_pos} is truncated (ends past its length)"
    elif kind == VARINT_OVERFLOW:
        message = f"varint at record position {a} overflows 64 bits"
    elif kind == VARINT_TOO_LONG:
        message = f"varint at record position {a} is longer than 10 bytes"
    else:
        raise AssertionError(f"decode_records returned unknown kind {result}")
    return errors.InvalidRecordError(message)


def decode_records_c(cls: type, section: rb.Buffer, start: int, end: int, count: int, base_offset: int,
                     base_ts: int, log_append_ts: int | None, topic: str, partition: int, ts_type: int,
                     batch_pos: int) -> tuple[list[Any], bool]:
    """The records of ``section[start:end]`` (decompressed) by the C decoder: (records, increasing)."""
    assert _decode_c is not None, "storage._record_walk.decode_records is not built"
    result = _decode_c(cls, section, start, end, count, base_offset, base_ts, log_append_ts, topic, partition,
                       ts_type)
    if len(result) == 2:
        return result  # type: ignore[no-any-return]
    raise _error(result, section, start, count, batch_pos) from None


def decode_records_py(cls: type, section: rb.Buffer, start: int, end: int, count: int, base_offset: int,
                      base_ts: int, log_append_ts: int | None, topic: str, partition: int, ts_type: int,
                      batch_pos: int) -> tuple[list[Any], bool]:
    """The same by the reference decoder (``record_batch._decode_records``)."""
    if start != 0 or end != len(section) or section.__class__ is not bytes:
        with memoryview(section) as view:
            section = bytes(view[start:end])
    records = rb._decode_records(section, count, base_offset, base_ts, log_append_ts, batch_pos)  # type: ignore[arg-type]
    new = tuple.__new__
    out = [new(cls, (topic, partition, r.offset, r.timestamp, ts_type, r.key, r.value, tuple(r.headers)))
           for r in records]
    offsets = [r.offset for r in records]
    return out, all(map(lt, offsets, offsets[1:]))


decode_records = decode_records_c if COMPILED else decode_records_py


def decode_batch_tuples(
    buf: rb.Buffer,
    pos: int,
    cls: type,
    topic: str,
    partition: int,
    *,
    verify_crc: bool = True,
    max_decompressed_bytes: int = compression.DEFAULT_MAX_OUTPUT_BYTES,
) -> tuple[rb.BatchHeader, list[Any], bool]:
    """Check, decompress and decode the batch at ``pos``: (header, records as ``cls``, increasing)."""
    h, section, start, end = rb.batch_section(
        buf, pos, verify_crc=verify_crc, max_decompressed_bytes=max_decompressed_bytes
    )
    append_time = h.attributes & rb.ATTR_TIMESTAMP_TYPE
    records, increasing = decode_records(
        cls, section, start, end, h.record_count, h.base_offset, h.base_timestamp,
        h.max_timestamp if append_time else None, topic, partition,
        rb.TIMESTAMP_LOG_APPEND_TIME if append_time else rb.TIMESTAMP_CREATE_TIME, pos,
    )
    return h, records, increasing
