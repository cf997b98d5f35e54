"""A Fetch answer whose records stay the bytes the log read until they are written out (broker/bytes_apart.py).

``FetchAnswer.message`` holds each partition's offsets, errors and leader, and the answer's throttle time;
``records`` maps a partition's index in ``message.partitions`` to its records, whole batches as the log read
them. The replication listener writes the parts as they are; the gRPC port joins them, a long answer on an
executor thread; the Kafka listener takes the records themselves.
"""

from __future__ import annotations

from broker.bytes_apart import BytesApart
from proto import broker_pb2


class FetchAnswer(BytesApart):
    """A FetchResponse with its records held apart."""

    MESSAGE = broker_pb2.FetchResponse
    REPEATED = "partitions"
    VALUE = "records"
    __slots__ = ()

    @property
    def records(self) -> dict[int, bytes]:
        return self.values

    @property
    def partitions(self) -> list[broker_pb2.FetchPartitionResponse]:
        return self.message.partitions  # type: ignore[no-any-return]

    def records_of(self, index: int) -> bytes:
        return self.value_of(index)

    def records_bytes(self) -> int:
        return self.values_bytes()


def answer_of(response: broker_pb2.FetchResponse | FetchAnswer) -> FetchAnswer:
    return response if isinstance(response, FetchAnswer) else FetchAnswer(response)
