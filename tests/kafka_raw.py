"""One raw Kafka-protocol request to a LocalCluster's Kafka listener, for what no client library sends or shows
(ApiVersions' features, UpdateFeatures, a Produce answer's record_errors): the frame built with kio from Kafka's
own schemas, over mTLS with the cluster's certificate ``name`` when the cluster has TLS."""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from sockets import read_exactly

from broker.kafka_wire import codec
from deploy.local.cluster import LocalCluster

TIMEOUT_S = 30


def kafka_ask(cluster: LocalCluster, node: int, api_key: int, version: int, values: dict[str, Any], *,
              name: str = "admin") -> Any:
    """The decoded answer to one request sent to ``node``'s Kafka listener (request header v2 for a flexible
    version, else v1)."""
    cls = codec.request_schema(api_key, version)
    buf = io.BytesIO()
    header_cls = HeaderV2 if cls.__flexible__ else HeaderV1
    entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                              correlation_id=9, client_id="brook-tests"))
    entity_writer(cls)(buf, codec.build(cls, values))
    frame = struct.pack(">i", len(buf.getvalue())) + buf.getvalue()
    host, port = cluster.kafka_address(node).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as raw:
        conn: socket.socket = raw
        if cluster.tls:
            context = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
            context.load_cert_chain(str(cluster.tls_dir / f"{name}.pem"), str(cluster.tls_dir / f"{name}.key"))
            conn = context.wrap_socket(raw, server_hostname=host)
        conn.sendall(frame)
        size = struct.unpack(">i", read_exactly(conn, 4))[0]
        data = read_exactly(conn, size)
    # ApiVersions and every non-flexible version answer with header v0 (the correlation id), the others with v1.
    header = 4 if api_key == codec.API_VERSIONS_KEY or not cls.__flexible__ else 5
    body, _ = entity_reader(codec.response_schema(api_key, version))(data, header)
    return body
