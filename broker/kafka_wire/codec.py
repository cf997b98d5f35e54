"""Kafka's wire format: request/response framing and message schemas, through ``kio``.

``kio`` generates one frozen dataclass per (API, version) from Kafka's own JSON message
schemas, with a compiled reader and a writer for each; Brook writes no schema by hand.
This module adds what a server needs around it:

- ``parse_request(frame)``: the request header (v1, or v2 for flexible versions) and body;
  any malformed byte raises ``MalformedRequest`` (the connection is closed, as Kafka does).
- ``encode_response(header, body)``: the response frame, with the header version Kafka uses
  (v0 for ApiVersions whatever its version, v1 for flexible versions, else v0).
- ``items(entity, limit)``: how many array elements an answer holds (counted up to ``limit``), which
  decides whether the listener encodes it on the event loop or on a worker thread.
- ``build(cls, values)``: a response entity of whatever version the client asked for, from
  one version-independent dict. Fields the version lacks are dropped and those it needs
  but the dict lacks take Kafka's zero value, so a handler is written once for all versions.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
import typing
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer

from broker.kafka_wire import bounds
from storage.file_records import FileRecords

API_VERSIONS_KEY = 18
# An answer of more array elements than this (``items``) is large: the listener encodes it on a worker thread
# (server.ENCODE_ON_LOOP_MAX_ITEMS) and a Metadata this large is built with its client address's turn (apis).
LARGE_ANSWER_ITEMS = 500
_HEAD = struct.Struct(">hhi")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class MalformedRequest(Exception):
    """Bytes that are not a well-formed request of the API and version they claim."""


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request entity
    size: int  # bytes of the frame


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a frame, for answering one we cannot parse."""
    if len(frame) < _HEAD.size:
        raise MalformedRequest(f"a request of {len(frame)} bytes has no header")
    return _HEAD.unpack_from(frame)


@functools.cache
def request_schema(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@functools.cache
def response_schema(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@functools.cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@functools.cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def parse_request(frame: bytes, api_key: int, version: int, max_elements: int = bounds.MAX_ELEMENTS) -> Request:
    """Decode a frame whose (api_key, version) the caller has checked is one we serve, holding at most
    ``max_elements`` array elements and entities."""
    cls = request_schema(api_key, version)
    header_cls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    try:
        # kio's compiled reader trusts the counts it reads (a huge one aborts the process): check them first.
        bounds.check_header(frame, cls.__flexible__)
        header, used = _reader(header_cls)(frame, 0)
        bounds.check(frame, used, cls, max_elements)
        body, body_used = _reader(cls)(frame, used)
    except Exception as exc:  # kio raises several types (ValueError, struct/Unicode/buffer errors)
        raise MalformedRequest(f"{cls.__name__} v{version}: {type(exc).__name__}: {exc}") from None
    if used + body_used > len(frame):
        raise MalformedRequest(f"{cls.__name__} v{version}: read past the end of the frame")
    _check_nulls(body, cls.__name__)
    # Bytes after a complete body are ignored, as Kafka's broker does (librdkafka 2.x sends some after its
    # Metadata v12 requests).
    return Request(api_key, version, header.correlation_id, header.client_id, body, len(frame))


# A bytes value at least this long (a JoinGroup member's metadata, a SyncGroup assignment, up to 1 MiB each) goes
# out as a part of its own, not copied into the frame's buffer.
OWN_PART_MIN_BYTES = 64 * 1024


class _Parts:
    """A kio output buffer that keeps FileRecords (segment-file slices) and long bytes values apart from the bytes
    around them. A 64 MiB JoinGroup answer (64 members' metadata of 1 MiB) was copied three times over into one
    buffer, 200-300 ms of the event loop; its values are now sent as they are, and the rest copied once."""

    def __init__(self) -> None:
        self.parts: list[bytes | bytearray | FileRecords] = []
        self._buf = bytearray(4)  # the size prefix, filled in at the end
        self.size = 0

    def write(self, data: Any) -> int:
        if isinstance(data, FileRecords) or (type(data) is bytes and len(data) >= OWN_PART_MIN_BYTES):
            if self._buf or not self.parts:
                self.parts.append(self._buf)
                self._buf = bytearray()
            self.parts.append(data)
            self.size += len(data)
            return len(data)
        self._buf += data
        self.size += len(data)
        return len(data)

    def finish(self) -> list[bytes | FileRecords]:
        if self._buf or not self.parts:
            self.parts.append(self._buf)
        head = self.parts[0]
        assert isinstance(head, bytearray)  # the first part is always the buffer that holds the prefix
        struct.pack_into(">i", head, 0, self.size)
        return [bytes(p) if isinstance(p, bytearray) else p for p in self.parts if len(p)]


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> list[bytes | FileRecords]:
    """The size-prefixed response frame, as bytes and (Fetch) segment-file slices to send in order."""
    flexible = body.__flexible__ and api_key != API_VERSIONS_KEY  # KIP-511: ApiVersions answers with header v0
    header = ResponseHeaderV1(correlation_id=correlation_id) if flexible \
        else ResponseHeaderV0(correlation_id=correlation_id)
    out = _Parts()
    _writer(type(header))(out, header)
    _writer(type(body))(out, body)
    return out.finish()


def items(entity: Any, limit: int) -> int:
    """The array elements of a response entity, nested ones too, counted until there are more than ``limit``
    (then some count above it): what encoding it costs, at most ``limit`` elements' walk to find out. The
    listener encodes answers of more than its threshold on a worker thread (server.ENCODE_ON_LOOP_MAX_ITEMS)."""
    count = 0
    stack = [entity]
    while stack:
        e = stack.pop()
        for name, kind in _array_fields(type(e)):
            value = getattr(e, name)
            if not value:
                continue
            if kind == _ENTITY:
                stack.append(value)
                continue
            count += len(value)
            if count > limit:
                return count
            if kind == _ENTITIES:
                stack.extend(value)
    return count


@functools.cache
def _array_fields(cls: type) -> tuple[tuple[str, int], ...]:
    return tuple((name, kind) for name, kind, *_ in _build_plan(cls) if kind in (_ENTITY, _ENTITIES, _TUPLE))


def encode_response_bytes(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """``encode_response`` as one bytes object (slices read into memory): for tests and tools."""
    return b"".join(p.read() if isinstance(p, FileRecords) else p
                    for p in encode_response(api_key, version, correlation_id, body))


def _check_nulls(entity: Any, where: str) -> None:
    """MalformedRequest if a field the schema does not allow to be null is null (kio reads a null length
    of any string or array as None; Kafka's own parser refuses those)."""
    for name, kind, _entity, nullable, _zero_value, _f, _hint in _build_plan(type(entity)):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                raise MalformedRequest(f"{where}.{name} is null")
        elif kind == _ENTITY:
            _check_nulls(value, f"{where}.{name}")
        elif kind == _ENTITIES:
            for item in value:
                _check_nulls(item, f"{where}.{name}")
        elif isinstance(value, tuple) and any(v is None for v in value):
            raise MalformedRequest(f"{where}.{name} holds a null")


# ---- building response entities from plain values ----
@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _entity_type(hint: Any) -> type | None:
    """The dataclass a field holds (directly, optionally, or as a tuple of them), else None."""
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return hint  # type: ignore[return-value]
    for a in args:
        if a is not Ellipsis and a is not type(None) and dataclasses.is_dataclass(a):
            return a
    return None


def _is_tuple(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple


def _nullable(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _zero(f: dataclasses.Field, hint: Any) -> Any:
    kind = f.metadata.get("kafka_type")
    if _is_tuple(hint):
        return ()
    if _nullable(hint) and kind != "error_code":
        return None
    if kind in ("int8", "int16", "int32", "int64", "uint16", "float64"):
        return 0
    if kind == "bool":
        return False
    if kind == "string":
        return ""
    if kind in ("bytes", "records"):
        return b""
    if kind == "error_code":
        return KioErrorCode.none
    if kind in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kind == "uuid":
        return uuid.UUID(int=0)
    entity = _entity_type(hint)
    if entity is not None:
        return build(entity, {})
    raise TypeError(f"no zero value for field {f.name} ({kind}, {hint})")


def _unwrap_optional(hint: Any) -> Any:
    """``X | None`` -> X (for nullable arrays and entities)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint) and len(args) == 1:
        return args[0]
    return hint


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """A non-null timedelta, uuid or datetime field from Kafka's plain form (ms ints, hex strings)."""
    kind = f.metadata.get("kafka_type")
    if kind in ("timedelta_i32", "timedelta_i64"):
        return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=int(value))
    if kind == "uuid":
        if isinstance(value, uuid.UUID):
            return value
        try:
            return uuid.UUID(hex=value) if value else uuid.UUID(int=0)
        except ValueError:  # Brook's ids are uuid4 hex; anything else is sent as the null id
            return uuid.UUID(int=0)
    if isinstance(value, datetime.datetime):  # datetime_i64
        return value
    return None if int(value) < 0 else _EPOCH + datetime.timedelta(milliseconds=int(value))


_PLAIN, _ERROR, _TIMEDELTA, _UUID, _DATETIME, _ENTITY, _ENTITIES, _TUPLE = range(8)
_MISSING_ZERO = object()


@functools.cache
def _build_plan(cls: type) -> tuple[tuple[str, int, Any, bool, Any, dataclasses.Field, Any], ...]:
    """Per field of ``cls``: (name, coercion, entity class, nullable, zero value or _MISSING_ZERO, field, hint);
    computed once per class, so building a response is one tight loop per entity."""
    hints = _hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        kind_name = f.metadata.get("kafka_type")
        inner = _unwrap_optional(hint)
        entity = _entity_type(inner)
        if kind_name == "error_code":
            kind = _ERROR
        elif kind_name in ("timedelta_i32", "timedelta_i64"):
            kind = _TIMEDELTA
        elif kind_name == "uuid":
            kind = _UUID
        elif kind_name == "datetime_i64":
            kind = _DATETIME
        elif entity is not None:
            kind = _ENTITIES if _is_tuple(inner) else _ENTITY
        elif _is_tuple(inner):
            kind = _TUPLE
        else:
            kind = _PLAIN
        required = f.default is MISSING and f.default_factory is MISSING
        try:
            zero = _zero(f, hint) if required else _MISSING_ZERO
        except TypeError:  # a type with no zero value (build then needs the field given): computed at use
            zero = _MISSING_ZERO
        plan.append((f.name, kind, entity, _nullable(hint), zero, f, hint))
    return tuple(plan)


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of the kio entity ``cls`` from ``values`` (see the module doc)."""
    kwargs = {}
    for name, kind, entity, nullable, zero, f, hint in _build_plan(cls):
        if name not in values:
            if zero is not _MISSING_ZERO:
                kwargs[name] = zero
            continue
        value = values[name]
        if value is None:
            kwargs[name] = None if nullable else (zero if zero is not _MISSING_ZERO else _zero(f, hint))
        elif kind == _PLAIN:
            kwargs[name] = value
        elif kind == _ENTITIES:
            kwargs[name] = tuple(v if dataclasses.is_dataclass(v) else build(entity, v) for v in value)
        elif kind == _ENTITY:
            kwargs[name] = value if dataclasses.is_dataclass(value) else build(entity, value)
        elif kind == _ERROR:
            kwargs[name] = KioErrorCode(int(value))
        elif kind == _TUPLE:
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = _coerce(f, value)
    return cls(**kwargs)


def response(api_key: int, version: int, values: Mapping[str, Any]) -> Any:
    return build(response_schema(api_key, version), values)


def millis(value: Any) -> int:
    """A kio timedelta or datetime field as Kafka's milliseconds (-1 for a null datetime)."""
    if value is None:
        return -1
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, datetime.datetime):
        return int((value - _EPOCH) / datetime.timedelta(milliseconds=1))
    return int(value)


NO_AUTHORIZED_OPERATIONS = -2147483648  # Kafka's "authorized operations not requested / not computed"


def get(obj: Any, name: str, default: Any = None) -> Any:
    """A request field, or ``default`` where the request's version has no such field."""
    return getattr(obj, name, default)


def get_ms(obj: Any, name: str, default: int) -> int:
    """A request's timedelta field as milliseconds, or ``default`` where its version has none."""
    value = getattr(obj, name, None)
    return default if value is None else millis(value)


def per_topic(rows: Iterable[tuple[str, dict[str, Any]]], name_key: str = "name",
              parts_key: str = "partitions") -> list[dict[str, Any]]:
    """Kafka's topic -> partitions nesting of a response, from (topic, partition entry) pairs in order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for topic, entry in rows:
        grouped.setdefault(topic, []).append(entry)
    return [{name_key: topic, parts_key: parts} for topic, parts in grouped.items()]
