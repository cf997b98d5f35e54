"""Answers whose long bytes values stay apart from the protobuf message until they are written out.

Protobuf copies a bytes value into the message (its arena) when it is set, and serializing copies it
again, several times over, with the interpreter lock held throughout: a 55 MiB Fetch answer cost ~30 ms
to build and 120-180 ms to serialize on the development machine, a group leader's 64 MiB JoinGroup
answer 190-220 ms, all of it on the event loop that gRPC serializes on, and a thread does not help (the
lock). Yet such values are opaque to the broker: a partition's record batches, a member's metadata.

A ``BytesApart`` answer keeps them out of the message. ``message`` holds everything else; ``values``
maps an element's index in the message's repeated field ``REPEATED`` to that element's ``VALUE`` bytes.
``parts`` writes the protobuf wire form of the whole message around them: each element's other fields
serialized by protobuf, then the value's field (tag, length, the bytes themselves, not copied), then the
message's own fields. A parser reads fields in any order, so what it decodes is the message with the
values set, what every client already reads. A socket takes the parts as they are; a gRPC answer is one
bytes value joined from them, and ``bytes.join`` lets go of the interpreter lock for long values, so a
long join runs on an executor thread without holding up the loop (``for_grpc``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import grpc
from google.protobuf import message_factory

from storage.record_batch import encode_uvarint as varint

# Values at least this long are parts of their own (written, or joined, as they are); shorter ones are
# copied into the buffer around them, which is cheaper than a part each.
OWN_PART_MIN_BYTES = 64 * 1024
# A gRPC answer with more than this in values is joined into its one bytes value on an executor thread (55 MiB:
# ~35 ms here); a shorter one by gRPC's serializer, on the loop.
JOIN_ON_LOOP_MAX_BYTES = 1024 * 1024
# ``parts`` serializes an answer element by element (a few microseconds each, in Python): one of more elements
# than this is written on an executor thread too (a fetch may name thousands of partitions with records).
PARTS_ON_LOOP_MAX_ELEMENTS = 500


def _tag(field: Any) -> bytes:
    return varint((field.number << 3) | 2)  # length-delimited


class BytesApart:
    """A ``MESSAGE`` whose ``REPEATED`` elements' ``VALUE`` bytes are held apart (see the module doc)."""

    MESSAGE: ClassVar[Any]
    REPEATED: ClassVar[str]
    VALUE: ClassVar[str]

    __slots__ = ("message", "values")

    def __init__(self, message: Any = None) -> None:
        self.message = message if message is not None else self.MESSAGE()
        self.values: dict[int, bytes] = {}  # index in the repeated field -> that element's value

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        repeated = cls.MESSAGE.DESCRIPTOR.fields_by_name[cls.REPEATED]
        cls._repeated_tag = _tag(repeated)  # type: ignore[attr-defined]
        cls._value_tag = _tag(repeated.message_type.fields_by_name[cls.VALUE])  # type: ignore[attr-defined]
        cls._repeated_number = repeated.number  # type: ignore[attr-defined]

    def elements(self) -> Any:
        return getattr(self.message, self.REPEATED)

    def value_of(self, index: int) -> bytes:
        return self.values.get(index) or getattr(self.elements()[index], self.VALUE)

    def values_bytes(self) -> int:
        """The bytes of the values held apart (those in the message, if any, are not counted)."""
        return sum(len(v) for v in self.values.values())

    def on_loop(self) -> bool:
        """Is writing this answer out short work for the event loop? Else ``parts`` (or ``to_bytes``) belongs on
        an executor thread."""
        return self.values_bytes() <= JOIN_ON_LOOP_MAX_BYTES and (
            not self.values or len(self.elements()) <= PARTS_ON_LOOP_MAX_ELEMENTS)

    def parts(self) -> list[bytes]:
        """The serialized message, in order: long values as they are, the rest in few buffers."""
        m = self.message
        if not self.values:
            return [m.SerializeToString()]
        repeated_tag, value_tag = self._repeated_tag, self._value_tag  # type: ignore[attr-defined]
        out: list[bytes] = []
        buf = bytearray()
        for i, element in enumerate(self.elements()):
            head = element.SerializeToString()
            value = self.values.get(i)
            if not value:
                buf += repeated_tag + varint(len(head)) + head
                continue
            if getattr(element, self.VALUE):
                raise ValueError(f"element {i} of the answer holds its {self.VALUE} in the message and apart from it")
            field = value_tag + varint(len(value))
            buf += repeated_tag + varint(len(head) + len(field) + len(value)) + head + field
            if len(value) < OWN_PART_MIN_BYTES:
                buf += value
                continue
            out.append(bytes(buf))
            buf.clear()
            out.append(value)
        # The message's own fields: the message without its repeated field (scalars: test_bytes_apart checks).
        rest = self.MESSAGE()
        for field, value in m.ListFields():
            if field.number != self._repeated_number:  # type: ignore[attr-defined]
                setattr(rest, field.name, value)
        buf += rest.SerializeToString()
        if buf:
            out.append(bytes(buf))
        return out

    def to_bytes(self) -> bytes:
        """The serialized message as one value (for gRPC). A long one is best joined on a thread."""
        parts = self.parts()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def to_message(self) -> Any:
        """The message itself, values set (a copy: for in-process callers and tests)."""
        m = self.MESSAGE()
        m.CopyFrom(self.message)
        elements = getattr(m, self.REPEATED)
        for i, value in self.values.items():
            setattr(elements[i], self.VALUE, value)
        return m


def serialized(serialize: Callable[[Any], bytes], answer: Any) -> bytes:
    """gRPC's response serializer for a method whose handler may give the message, a BytesApart, or the bytes
    already joined on a thread."""
    if isinstance(answer, bytes):
        return answer
    if isinstance(answer, BytesApart):
        return answer.to_bytes()
    return serialize(answer)


async def for_grpc(answer: Any, run: Callable[[Callable[[], bytes]], Awaitable[bytes]]) -> Any:
    """An answer for gRPC, which serializes on the event loop: a BytesApart that is not short work there
    (``on_loop``: more than JOIN_ON_LOOP_MAX_BYTES of values, or PARTS_ON_LOOP_MAX_ELEMENTS elements) is joined
    into its bytes on ``run``'s thread first."""
    if isinstance(answer, BytesApart) and not answer.on_loop():
        return await run(answer.to_bytes)
    return answer


def add_service(server: grpc.aio.Server, service: Any, servicer: Any, over_grpc: dict[str, Callable[..., Any]]
                ) -> None:
    """The generated ``add_<Service>Servicer_to_server`` for the service ``service`` (its descriptor), except that
    the methods in ``over_grpc`` are served by the behaviour given there and their answers serialized by
    ``serialized``: such a handler may answer a BytesApart, or its bytes already joined off the loop."""
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    handlers = {}
    for method in service.methods:
        answer = message_factory.GetMessageClass(method.output_type)
        behaviour = over_grpc.get(method.name)
        handlers[method.name] = kinds[(method.client_streaming, method.server_streaming)](
            behaviour or getattr(servicer, method.name),
            request_deserializer=message_factory.GetMessageClass(method.input_type).FromString,
            response_serializer=functools.partial(serialized, answer.SerializeToString) if behaviour is not None
            else answer.SerializeToString)
    missing = set(over_grpc) - set(handlers)
    assert not missing, f"{service.full_name} has no method {sorted(missing)}"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)
