"""Kafka requests as raw frames to a listener in this process, and their decoded answers: for tests that send what a
client library would not, or must not build the request while they record what the listener builds."""

from __future__ import annotations

import asyncio
import io
import struct
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer

from broker.kafka_wire import codec


def frame(api_key: int, version: int, values: dict[str, Any], *, correlation_id: int = 7,
          client_id: str = "raw-frames-test") -> bytes:
    """The size-prefixed request frame (request header v2 for a flexible version, else v1)."""
    cls = codec.request_schema(api_key, version)
    header = HeaderV2 if cls.__flexible__ else HeaderV1
    buf = io.BytesIO()
    entity_writer(header)(buf, header(request_api_key=api_key, request_api_version=version,
                                      correlation_id=correlation_id, client_id=client_id))
    entity_writer(cls)(buf, codec.build(cls, values))
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


async def ask(port: int, request: bytes, api_key: int, version: int, timeout_s: float = 30) -> Any:
    """The decoded answer to ``request`` on a new connection; None when the listener closed it instead."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        try:
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout_s))[0]
        except asyncio.IncompleteReadError:
            return None
        data = await asyncio.wait_for(reader.readexactly(size), timeout_s)
    finally:
        writer.close()
    schema = codec.response_schema(api_key, version)
    body, _ = entity_reader(schema)(data, 5 if schema.__flexible__ else 4)  # correlation id (+ tagged fields)
    return body
