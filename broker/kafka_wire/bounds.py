"""Every length and count in a request frame checked against the bytes that are really there,
before kio's compiled reader sees the frame.

kio's reader sizes its allocations by the counts a request claims: an array claiming 2^31
elements in a 30-byte frame makes it ask for hundreds of gigabytes, and the failed allocation
aborts the whole process (found by the ``kafka`` fuzz target). A Kafka broker must survive any
bytes, so this walk goes first. It follows the same kio schema entity the reader will use
(field order, flexible or legacy encodings, tagged fields, nullable entities; KIP-482, KIP-893)
and reads only lengths: no string, bytes or array is materialised. A string, bytes or records
field may not be longer than what is left of the frame, an array may not hold more elements
than bytes are left (every element takes at least one), and a tagged field must fit its frame.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

_FIXED = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "uint32": 4,
          "timedelta_i32": 4, "int64": 8, "uint64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8,
          "uuid": 16}
_VARINT_MAX_BYTES = 5


class Malformed(Exception):
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kind: str  # "fixed", "string", "bytes", "entity", "entities", "primitives"
    kafka_type: str
    entity: Any
    optional: bool
    tag: int | None


@functools.cache
def _plan(cls: type) -> tuple[tuple[_FieldPlan, ...], dict[int, _FieldPlan], bool]:
    plain: list[_FieldPlan] = []
    tagged: dict[int, _FieldPlan] = {}
    for f in dataclasses.fields(cls):
        fc = classify_field(f)
        tag = get_field_tag(f)
        optional = False if tag is not None else is_optional(f)
        if isinstance(fc, EntityTupleField):
            plan = _FieldPlan(f.name, "entities", "", fc.type_, optional, tag)
        elif isinstance(fc, EntityField):
            plan = _FieldPlan(f.name, "entity", "", fc.type_, optional, tag)
        else:
            kafka_type = get_schema_field_type(f)
            if isinstance(fc, PrimitiveTupleField):
                kind = "primitives"
            elif kafka_type in ("string",):
                kind = "string"
            elif kafka_type in ("bytes", "records"):
                kind = "bytes"
            else:
                kind = "fixed"
            assert isinstance(fc, PrimitiveField | PrimitiveTupleField)
            plan = _FieldPlan(f.name, kind, kafka_type, None, optional, tag)
        if tag is not None:
            tagged[int(tag)] = plan
        else:
            plain.append(plan)
    return tuple(plain), tagged, bool(cls.__flexible__)


class _Cursor:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf, self.pos, self.end = buf, pos, end

    def take(self, n: int, what: str) -> None:
        if n < 0 or n > self.end - self.pos:
            raise Malformed(f"{what}: {n} bytes claimed, {self.end - self.pos} left")
        self.pos += n

    def uvarint(self, what: str) -> int:
        value = shift = 0
        for _ in range(_VARINT_MAX_BYTES):
            if self.pos >= self.end:
                raise Malformed(f"{what}: varint runs past the end")
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise Malformed(f"{what}: varint longer than {_VARINT_MAX_BYTES} bytes")

    def int_(self, fmt: str, size: int, what: str) -> int:
        if self.end - self.pos < size:
            raise Malformed(f"{what}: truncated")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return int(value)


def _length(c: _Cursor, flexible: bool, legacy_fmt: str, legacy_size: int, what: str) -> int:
    """A length or count: -1 for null."""
    if flexible:
        return c.uvarint(what) - 1
    return c.int_(legacy_fmt, legacy_size, what)


def _scan_value(c: _Cursor, p: _FieldPlan, flexible: bool, where: str) -> None:
    what = f"{where}.{p.name}"
    if p.kind == "fixed":
        c.take(_FIXED.get(p.kafka_type, 0) or _unknown(p.kafka_type, what), what)
    elif p.kind == "string":
        n = _length(c, flexible, ">h", 2, what)
        if n >= 0:
            c.take(n, what)
    elif p.kind == "bytes":
        n = _length(c, flexible, ">i", 4, what)
        if n >= 0:
            c.take(n, what)
    elif p.kind == "entity":
        if p.optional and c.int_(">b", 1, what) < 0:  # KIP-893: -1 marks a null entity
            return
        _scan_entity(c, p.entity, what)
    else:
        n = _length(c, flexible, ">i", 4, what)
        if n < 0:
            return
        if n > c.end - c.pos:
            raise Malformed(f"{what}: {n} elements claimed, {c.end - c.pos} bytes left")
        if p.kind == "entities":
            for _ in range(n):
                _scan_entity(c, p.entity, what)
            return
        element = _FieldPlan(p.name, "string" if p.kafka_type == "string" else "fixed", p.kafka_type, None,
                             False, None)
        for _ in range(n):
            _scan_value(c, element, flexible, where)


def _unknown(kafka_type: str, what: str) -> int:
    raise Malformed(f"{what}: no size known for kafka type {kafka_type}")


def _scan_entity(c: _Cursor, cls: type, where: str) -> None:
    plain, tagged, flexible = _plan(cls)
    for p in plain:
        _scan_value(c, p, flexible, where)
    if not flexible:
        return
    count = c.uvarint(f"{where} tagged fields")
    if count > c.end - c.pos:
        raise Malformed(f"{where}: {count} tagged fields claimed, {c.end - c.pos} bytes left")
    for _ in range(count):
        tag = c.uvarint(f"{where} tag")
        size = c.uvarint(f"{where} tag {tag} size")
        start = c.pos
        c.take(size, f"{where} tag {tag}")
        known = tagged.get(tag)
        if known is not None:  # the reader parses known tags: their inside must fit their frame too
            inner = _Cursor(c.buf, start, start + size)
            _scan_value(inner, known, flexible, where)


def check(frame: bytes, offset: int, cls: type) -> None:
    """Malformed unless every length in the ``cls`` body at ``offset`` fits ``frame``."""
    _scan_entity(_Cursor(frame, offset, len(frame)), cls, cls.__name__)


def check_header(frame: bytes, flexible: bool) -> int:
    """The request header's length (api key, version, correlation id, client id, tags); Malformed if it
    does not fit. The client id is a legacy int16-length string in every header version."""
    c = _Cursor(frame, 8, len(frame))
    n = c.int_(">h", 2, "client_id")
    if n >= 0:
        c.take(n, "client_id")
    if flexible:
        count = c.uvarint("header tagged fields")
        if count > c.end - c.pos:
            raise Malformed(f"header: {count} tagged fields claimed, {c.end - c.pos} bytes left")
        for _ in range(count):
            c.uvarint("header tag")
            c.take(c.uvarint("header tag size"), "header tag")
    return c.pos
