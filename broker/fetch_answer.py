"""A Fetch answer whose records stay the bytes the log read, until they are written out.

A ``FetchResponse`` built the usual way copies each partition's records into the message (protobuf's
arena), and serializing it copies them again, several times over inside protobuf's encoder, with the
interpreter lock held throughout: a 55 MiB consumer answer cost ~30 ms to build and 120-180 ms to
serialize on this host, all of it on the event loop that gRPC serializes on, and a thread does not
help (README, Known limitations). Yet the records are opaque to the broker: whole batches, sent as
they came.

``FetchAnswer`` keeps them out of the message. ``message`` holds everything else (each partition's
offsets, errors, leader; the answer's throttle time); ``records`` maps a partition's index in
``message.partitions`` to its bytes. ``parts`` writes the protobuf wire form of the whole
``FetchResponse`` around them: each partition's other fields serialized as protobuf does, then its
records field (tag, length, the bytes themselves: not copied). A parser reads fields in any order, so
what it decodes is the message with the records set, byte for byte what every follower and client
already reads. The replication listener writes the parts as they are; a gRPC answer is one bytes value,
joined from the parts (``bytes.join`` lets go of the interpreter lock for long values, so a long join
runs on an executor thread without holding up the loop).
"""

from __future__ import annotations

from proto import broker_pb2
from storage.record_batch import encode_uvarint as varint

# Wire tags (field number << 3 | 2, length-delimited).
_PARTITION_TAG = bytes([(broker_pb2.FetchResponse.PARTITIONS_FIELD_NUMBER << 3) | 2])
_RECORDS_TAG = bytes([(broker_pb2.FetchPartitionResponse.RECORDS_FIELD_NUMBER << 3) | 2])
# Records at least this long are parts of their own (written, or joined, as they are); shorter ones are
# copied into the buffer around them, which is cheaper than a part each.
OWN_PART_MIN_BYTES = 64 * 1024


class FetchAnswer:
    """A FetchResponse with its records held apart (see the module doc)."""

    __slots__ = ("message", "records")

    def __init__(self, message: broker_pb2.FetchResponse | None = None) -> None:
        self.message = message if message is not None else broker_pb2.FetchResponse()
        self.records: dict[int, bytes] = {}  # index in message.partitions -> that partition's records

    @property
    def partitions(self) -> list[broker_pb2.FetchPartitionResponse]:
        return self.message.partitions  # type: ignore[return-value]

    def records_of(self, index: int) -> bytes:
        return self.records.get(index) or self.message.partitions[index].records

    def records_bytes(self) -> int:
        return sum(len(r) for r in self.records.values()) + sum(len(p.records) for p in self.message.partitions)

    def parts(self) -> list[bytes]:
        """The serialized FetchResponse, in order: its records as they are, the rest in few buffers."""
        m = self.message
        if not self.records:
            return [m.SerializeToString()]
        out: list[bytes] = []
        buf = bytearray()
        for i, p in enumerate(m.partitions):
            head = p.SerializeToString()
            rec = self.records.get(i)
            if not rec:
                buf += _PARTITION_TAG + varint(len(head)) + head
                continue
            if p.records:
                raise ValueError(f"partition {i} of the answer holds records in the message and apart from it")
            field = _RECORDS_TAG + varint(len(rec))
            buf += _PARTITION_TAG + varint(len(head) + len(field) + len(rec)) + head + field
            if len(rec) < OWN_PART_MIN_BYTES:
                buf += rec
                continue
            out.append(bytes(buf))
            buf.clear()
            out.append(rec)
        # The answer's own fields (throttle time, incremental): the message without its partitions.
        rest = broker_pb2.FetchResponse()
        for field, value in m.ListFields():
            if field.number != broker_pb2.FetchResponse.PARTITIONS_FIELD_NUMBER:
                setattr(rest, field.name, value)
        buf += rest.SerializeToString()
        if buf:
            out.append(bytes(buf))
        return out

    def to_bytes(self) -> bytes:
        """The serialized FetchResponse as one value (for gRPC). A long one is best joined on a thread."""
        parts = self.parts()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def to_message(self) -> broker_pb2.FetchResponse:
        """The FetchResponse itself, records set (a copy: for in-process callers and tests)."""
        m = broker_pb2.FetchResponse()
        m.CopyFrom(self.message)
        for i, rec in self.records.items():
            m.partitions[i].records = rec
        return m


def answer_of(response: broker_pb2.FetchResponse | FetchAnswer) -> FetchAnswer:
    return response if isinstance(response, FetchAnswer) else FetchAnswer(response)


def serialized(response: broker_pb2.FetchResponse | FetchAnswer | bytes) -> bytes:
    """gRPC's response serializer for the methods that answer a FetchResponse: a handler may hand over
    the message, a FetchAnswer, or the bytes already joined on a thread."""
    if isinstance(response, bytes):
        return response
    if isinstance(response, FetchAnswer):
        return response.to_bytes()
    return response.SerializeToString()
