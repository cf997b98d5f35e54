"""The record walk behind LogValidator: one pass over a batch's records section, no objects built.

``walk(buf, start, end, count, compact)`` checks the records section ``buf[start:end]``
(already decompressed) of a batch declaring ``count`` records and returns a
``WalkResult`` tuple ``(kind, record, a, b, min_ts_delta, max_ts_delta)``: ``kind`` is
``OK`` or one of the error kinds below, ``record`` the index of the offending record and
``a``/``b`` the numbers its message needs (see ``storage/log_validator.py``, which turns
a result into CORRUPT_MESSAGE or INVALID_RECORD). Positions are relative to ``start``.

Two implementations with identical results: the C extension ``storage._record_walk``
(built by ``pip install``; 20-100x faster) and ``walk_py`` below, the reference and the
fallback when the extension is not built. tests/storage/test_record_walk.py and the
fuzz target ``records`` check that both return the same tuple for the same input.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.record_batch import Buffer

logger = logging.getLogger(__name__)

# Result kinds; a and b per kind in brackets.
OK = 0
COUNT_SHORT = 1  # the section ends before record `record` [-, -]
BAD_LENGTH = 2  # record length < 6 or past the end [length, bytes remaining]
OFFSET_DELTA = 3  # offset delta != record index [offset delta, -]
KEY_LENGTH = 4  # key length < -1 [key length, -]
NO_KEY = 5  # null key on a compacted topic [-, -]
VALUE_LENGTH = 6  # value length < -1 [value length, -]
HEADER_COUNT = 7  # header count < 0 or more than the record can hold [count, -]
HEADER_KEY_LENGTH = 8  # header key length < 0 or past the record [length, -]
HEADER_KEY_UTF8 = 9  # header key is not UTF-8 [-, -]
HEADER_VALUE_LENGTH = 10  # header value length < -1 [length, -]
FIELDS_END = 11  # fields do not end where the record length says [end of fields, end by length]
TRUNCATED = 12  # a field runs past the end of the section [-, -]
TRAILING = 13  # bytes after the last record [bytes, -]
VARINT_OVERFLOW = 14  # a varint above 64 bits [position, -]
VARINT_TOO_LONG = 15  # a varint of more than 10 bytes [position, -]
RECORD_ATTRIBUTES = 16  # a record's attributes byte is not 0 [attributes, -]
VARINT32 = 17  # an int32 field's varint is longer than 5 bytes or outside int32 [position, -]
HEADER_KEY_NUL = 18  # header key holds a NUL character (librdkafka's clients cut C strings there) [-, -]

WalkResult = tuple[int, int, int, int, int, int]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_VARINT_BYTES_MAX = 10  # a varlong; longer is malformed
# Every record field but the timestamp delta is an int32 varint: Kafka's readVarint refuses more than 5
# bytes, and kafka-python/aiokafka read the attributes byte as a varint too. A leader stores only what
# every reader decodes alike, so both are checked (found by an audit: attributes 0x80 shifted every
# field for those clients, silently).
_VARINT32_BYTES_MAX = 5
# Zigzag decode tables: one byte < 0x80, and two bytes indexed by their 14 payload bits.
_DEC1: tuple[int, ...] = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))
_DEC2: tuple[int, ...] = tuple((z >> 1) ^ -(z & 1) for z in range(1 << 14))


class _VarintError(Exception):
    def __init__(self, kind: int, pos: int) -> None:
        self.kind = kind
        self.pos = pos


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The general zigzag varint at ``pos``: (value, position after it). IndexError past the end."""
    shift = 0
    raw = 0
    for i in range(pos, pos + _VARINT_BYTES_MAX):
        b = data[i]
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            if raw >> 64:
                raise _VarintError(VARINT_OVERFLOW, pos)
            return (raw >> 1) ^ -(raw & 1), i + 1
        shift += 7
    raise _VarintError(VARINT_TOO_LONG, pos)


def _read_varint32(data: bytes, pos: int) -> tuple[int, int]:
    """An int32 zigzag varint at ``pos`` (at most 5 bytes, within int32). IndexError past the end."""
    shift = 0
    raw = 0
    for i in range(pos, pos + _VARINT32_BYTES_MAX):
        b = data[i]
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            if raw >> 32:
                raise _VarintError(VARINT32, pos)
            return (raw >> 1) ^ -(raw & 1), i + 1
        shift += 7
    raise _VarintError(VARINT32, pos)


def walk_py(buf: Buffer, start: int, end: int, count: int, compact: bool) -> WalkResult:
    """The reference walk (pure Python). Flat on purpose: it is the per-record loop of produce."""
    with memoryview(buf) as view:
        data = bytes(view[start:end])
    dec1 = _DEC1
    dec2 = _DEC2
    read_varint = _read_varint
    read_varint32 = _read_varint32
    n = len(data)
    p = 0
    i = 0
    max_delta = _INT64_MIN
    min_delta = _INT64_MAX
    try:
        for i in range(count):  # noqa: B007 - i names the record in the result
            if p >= n:
                return COUNT_SHORT, i, 0, 0, 0, 0
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
                    length, p = read_varint32(data, p)
            rec_end = p + length
            if length < 6 or rec_end > n:
                return BAD_LENGTH, i, length, n - p, 0, 0
            if data[p]:  # record attributes: unused in v2, and read differently by clients when not 0
                return RECORD_ATTRIBUTES, i, data[p], 0, 0, 0
            p += 1
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
                    ts_delta, p = read_varint(data, p)
            if ts_delta > max_delta:
                max_delta = ts_delta
            if ts_delta < min_delta:
                min_delta = ts_delta
            # offset delta: must be the record's index
            b = data[p]
            if b == i << 1 and b < 0x80:  # zigzag of i < 64: one byte
                p += 1
            else:
                od, p = read_varint32(data, p)
                if od != i:
                    return OFFSET_DELTA, i, od, 0, 0, 0
            # key
            b = data[p]
            if b < 0x80:
                kl = dec1[b]
                p += 1
            else:
                kl, p = read_varint32(data, p)
            if kl >= 0:
                p += kl
            elif kl != -1:
                return KEY_LENGTH, i, kl, 0, 0, 0
            elif compact:
                return NO_KEY, i, 0, 0, 0, 0
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
                    vl, p = read_varint32(data, p)
            if vl >= 0:
                p += vl
            elif vl != -1:
                return VALUE_LENGTH, i, vl, 0, 0, 0
            # headers
            if data[p] == 0:
                p += 1
            else:
                kind, a, p = _walk_headers(data, p, rec_end)
                if kind != OK:
                    return kind, i, a, 0, 0, 0
            # Positions only move forward, so ending exactly at rec_end proves that every
            # field lay inside the record.
            if p != rec_end:
                return FIELDS_END, i, p, rec_end, 0, 0
    except IndexError:
        return TRUNCATED, i, 0, 0, 0, 0
    except _VarintError as exc:
        return exc.kind, i, exc.pos, 0, 0, 0
    if p != n:
        return TRAILING, i, n - p, 0, 0, 0
    return OK, 0, 0, 0, min_delta, max_delta


def _walk_headers(data: bytes, p: int, rec_end: int) -> tuple[int, int, int]:
    """A record's headers (off the fast path): (kind, a, position after them)."""
    hcount, p = _read_varint32(data, p)
    # Each header takes at least 2 bytes: a larger count is malformed, and must not drive a long loop.
    if hcount < 0 or hcount * 2 > rec_end - p:
        return HEADER_COUNT, hcount, p
    for _ in range(hcount):
        kl, p = _read_varint32(data, p)
        if kl < 0 or p + kl > rec_end:
            return HEADER_KEY_LENGTH, kl, p
        key = data[p:p + kl]
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            return HEADER_KEY_UTF8, 0, p
        if b"\x00" in key:
            return HEADER_KEY_NUL, 0, p
        p += kl
        vl, p = _read_varint32(data, p)
        if vl >= 0:
            p += vl
        elif vl != -1:
            return HEADER_VALUE_LENGTH, vl, p
    return OK, 0, p


def _load_compiled() -> object | None:
    if os.environ.get("BROOK_PURE_PYTHON_WALK"):
        return None  # tests and benchmarks compare the two
    try:
        from storage import _record_walk  # type: ignore[attr-defined]
    except ImportError:
        logger.warning("storage._record_walk (C) is not built: produce validation uses the slower "
                       "pure-Python walk; reinstall with `pip install -e .` to build it")
        return None
    missing = [name for name in COMPILED_FUNCTIONS if not hasattr(_record_walk, name)]
    if missing:  # an extension built from an older checkout: each missing part falls back to Python
        logger.warning("storage._record_walk (C) is an older build without %s: those use the slower "
                       "pure-Python code; reinstall with `pip install -e .` to rebuild it", ", ".join(missing))
    return _record_walk


# What storage/_record_walk.c provides: the validator's walk, the consumer's decoder, the producer's
# encoder (the records writer of a batch being built, and the base of its per-record futures).
COMPILED_FUNCTIONS = ("walk", "decode_records", "RecordsWriter", "RecordFutureBase")


_compiled = _load_compiled()
COMPILED = _compiled is not None
walk_c = getattr(_compiled, "walk", None)
walk = walk_c if walk_c is not None else walk_py
