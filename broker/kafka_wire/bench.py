"""What the Kafka listener's codec costs per request (kio's reader and writer plus Brook's bounds check).

    python -m broker.kafka_wire.bench     (part of ``make bench-codec``)

Prints microseconds per call for the requests that dominate a busy broker: parsing a Produce
request carrying one 1 MiB batch, and one carrying 50 partitions of 16 KiB; encoding a Fetch
response of 50 partitions (records as segment-file slices, so no record bytes are copied);
and a Metadata round trip. Nothing is asserted.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Callable

from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_writer

from broker.kafka_wire import apis, codec
from storage.file_records import FileRecords


def _frame(api_key: int, version: int, values: dict) -> bytes:
    cls = codec.request_schema(api_key, version)
    buf = io.BytesIO()
    entity_writer(RequestHeader)(buf, RequestHeader(request_api_key=api_key, request_api_version=version,
                                                    correlation_id=1, client_id="bench"))
    entity_writer(cls)(buf, codec.build(cls, values))
    return buf.getvalue()


def _time(fn: Callable[[], object], min_s: float = 0.5) -> float:
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s and n >= 5:
            return elapsed / n * 1e6


def main() -> int:
    one_mib = _frame(apis.PRODUCE, 9, {"acks": -1, "timeout": 30000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": os.urandom(1 << 20)}]}]})
    fifty = _frame(apis.PRODUCE, 9, {"acks": -1, "timeout": 30000, "topic_data": [
        {"name": "t", "partition_data": [{"index": i, "records": os.urandom(16 << 10)} for i in range(50)]}]})
    metadata = _frame(apis.METADATA, 12, {"topics": [{"name": f"topic-{i}"} for i in range(20)]})
    rows = [
        ("parse Produce v9, one 1 MiB batch", _time(lambda: codec.parse_request(one_mib, apis.PRODUCE, 9))),
        ("parse Produce v9, 50 x 16 KiB partitions", _time(lambda: codec.parse_request(fifty, apis.PRODUCE, 9))),
        ("parse Metadata v12, 20 topics", _time(lambda: codec.parse_request(metadata, apis.METADATA, 12))),
    ]
    with tempfile.TemporaryFile() as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        slices = [FileRecords(f.fileno(), 0, 16 << 10, 0) for _ in range(50)]

        def fetch_response() -> object:
            body = codec.response(apis.FETCH, 12, {"responses": [{"topic": "t", "partitions": [
                {"partition_index": i, "high_watermark": 1000, "last_stable_offset": 1000, "log_start_offset": 0,
                 "aborted_transactions": [], "preferred_read_replica": -1, "records": slices[i]}
                for i in range(50)]}]})
            return codec.encode_response(apis.FETCH, 12, 1, body)
        rows.append(("build + encode Fetch v12 response, 50 partitions (slices)", _time(fetch_response)))
        for s in slices:
            s.close()
    print("Kafka listener codec (kio + bounds check), microseconds per call:")
    for label, us in rows:
        print(f"  {label:<58} {us:>10.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
