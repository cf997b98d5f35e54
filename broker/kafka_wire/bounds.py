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

The walk is Python work per element, so what a frame may make it do is bounded too (an audit found an
8 MiB frame of millions of empty entries or tagged fields took 2-10 s): at most ``MAX_TAGGED_FIELDS``
tagged fields an entity (Kafka's clients send a handful), at most ``MAX_ELEMENTS`` array elements and
entities a frame, and an array of fixed-size values is checked (its bytes, and its elements counted) in
one step. Large frames are parsed off the event loop (server.PARSE_ON_LOOP_MAX_BYTES).
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
MAX_TAGGED_FIELDS = 64
# Elements a frame may hold: the caller's bound (server: a few times the cluster's topics and partitions,
# at least MIN_ELEMENTS), never more than MAX_ELEMENTS (about 0.5 s of walking and reading).
MIN_ELEMENTS = 10_000
MAX_ELEMENTS = 200_000


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
    __slots__ = ("buf", "pos", "end", "elements")

    def __init__(self, buf: bytes, pos: int, end: int, elements: list[int]) -> None:
        self.buf, self.pos, self.end = buf, pos, end
        # [elements the frame may still hold, the frame's bound] (shared with the cursors of its tagged fields)
        self.elements = elements

    def count(self, n: int, what: str) -> None:
        left = self.elements[0] - n
        if left < 0:
            raise Malformed(f"{what}: more than {self.elements[1]} array elements and entities in one request")
        self.elements[0] = left

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
        # Every element counts, fixed-size ones too: the handlers expand an array of int32 partition indexes
        # as they do entities (an 8 MB frame of 2M of them cost 1 s of the event loop and 100 MB, audit).
        c.count(n, what)
        if p.kind == "entities":
            for _ in range(n):
                _scan_entity(c, p.entity, what)
            return
        if p.kafka_type != "string":  # fixed-size values: one check for the whole array
            c.take(n * (_FIXED.get(p.kafka_type, 0) or _unknown(p.kafka_type, what)), what)
            return
        element = _FieldPlan(p.name, "string", p.kafka_type, None, False, None)
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
    count = _tagged_count(c, where)
    for _ in range(count):
        tag = c.uvarint(f"{where} tag")
        size = c.uvarint(f"{where} tag {tag} size")
        start = c.pos
        c.take(size, f"{where} tag {tag}")
        known = tagged.get(tag)
        if known is not None:  # the reader parses known tags: their inside must fit their frame too
            inner = _Cursor(c.buf, start, start + size, c.elements)
            _scan_value(inner, known, flexible, where)


def _tagged_count(c: _Cursor, where: str) -> int:
    count = c.uvarint(f"{where} tagged fields")
    if count > MAX_TAGGED_FIELDS:
        raise Malformed(f"{where}: {count} tagged fields, at most {MAX_TAGGED_FIELDS} are read")
    if count > c.end - c.pos:
        raise Malformed(f"{where}: {count} tagged fields claimed, {c.end - c.pos} bytes left")
    return count


def check(frame: bytes, offset: int, cls: type, max_elements: int = MAX_ELEMENTS) -> None:
    """Malformed unless every length in the ``cls`` body at ``offset`` fits ``frame`` and it holds at most
    ``max_elements`` (capped at MAX_ELEMENTS) array elements and entities."""
    bound = min(max_elements, MAX_ELEMENTS)
    _scan_entity(_Cursor(frame, offset, len(frame), [bound, bound]), cls, cls.__name__)


def check_header(frame: bytes, flexible: bool) -> int:
    """The request header's length (api key, version, correlation id, client id, tags); Malformed if it
    does not fit. The client id is a legacy int16-length string in every header version."""
    c = _Cursor(frame, 8, len(frame), [0, 0])
    n = c.int_(">h", 2, "client_id")
    if n >= 0:
        c.take(n, "client_id")
    if flexible:
        for _ in range(_tagged_count(c, "header")):
            c.uvarint("header tag")
            c.take(c.uvarint("header tag size"), "header tag")
    return c.pos
