"""The Kafka-protocol listener against hostile and malformed input, SASL, acks=0 and zero-copy fetch.

One single-node cluster (real processes, real sockets) with two Kafka listeners: KAFKA
(PLAINTEXT) and KAFKA_SASL (SASL_PLAINTEXT). Requests are written byte by byte with kio's
writers where a well-formed request is wanted, and by hand where it must not be.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import random
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from sockets import ATTACKER, closed_by_peer, connect_from, open_past_the_bound
from waiting import wait_for

from broker.kafka_wire import apis, codec
from client.admin import Admin
from deploy.local.cluster import LocalCluster
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

USER, PASSWORD = "kafka-alice", "alice-secret-pw"
DESCRIBE_CONFIGS = 32
PER_IP = 12  # max.connections.per.ip: above what a test's clients open from 127.0.0.1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from deploy.local.cluster import free_port

    c = LocalCluster(tmp_path_factory.mktemp("kafka-wire"), nodes=1)
    n = c.spec(1)
    sasl_port = free_port()
    c.state.overrides.update({
        "initial.metadata.version": "1",  # the list-op test checks level 1 (brokers) and 3 (the controller)
        "listeners": f"BROKER://127.0.0.1:{n.broker_port},CONTROLLER://127.0.0.1:{n.controller_port},"
                     f"KAFKA://127.0.0.1:{n.kafka_port},KAFKA_SASL://127.0.0.1:{sasl_port}",
        "kafka.listener.names": "KAFKA,KAFKA_SASL",
        "listener.security.protocol.map": "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT,KAFKA:PLAINTEXT,"
                                          "KAFKA_SASL:SASL_PLAINTEXT",
        "socket.request.max.bytes": str(1024 * 1024),
        "kafka.authentication.timeout.ms": "3000",
        "max.connections.per.ip": str(PER_IP),
        "offsets.retention.check.interval.ms": "1000",  # for the retention time a commit gives
    })
    c.sasl_port = sasl_port  # type: ignore[attr-defined]
    with c:
        c.wait_ready(60)
        with Admin(c.bootstrap_servers, controller_endpoints=c.controller_endpoints) as admin:
            admin.create_user(USER, PASSWORD, mechanisms=["SCRAM-SHA-256", "SCRAM-SHA-512"])
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):  # victims of the wrong-password checks
                admin.create_user(f"kafka-bob-{mechanism}", "bobs-real-password", mechanisms=["SCRAM-SHA-512"])
            admin.create_topic("wire", 1, 1)
        yield c


# ---- a minimal Kafka client, for bytes no real client would send ----
def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def _frame(api_key: int, version: int, body: Any, correlation_id: int = 7, client_id: str | None = "wire-test") -> bytes:
    cls = codec.request_schema(api_key, version)
    header_cls = HeaderV2 if cls.__flexible__ else HeaderV1
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                              correlation_id=correlation_id, client_id=client_id))
    entity_writer(cls)(buf, body)
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


def _read_response(s: socket.socket, api_key: int, version: int) -> Any:
    size = struct.unpack(">i", _recv_exactly(s, 4))[0]
    data = _recv_exactly(s, size)
    cls = codec.response_schema(api_key, version)
    header_bytes = 4 if not cls.__flexible__ or api_key == apis.API_VERSIONS else 5  # correlation id (+ no tags)
    assert struct.unpack(">i", data[:4])[0] == 7
    body, _ = entity_reader(cls)(data, header_bytes)
    return body


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _api_versions(port: int, version: int = 3) -> Any:
    with _connect(port) as s:
        s.sendall(_frame(apis.API_VERSIONS, version, codec.build(codec.request_schema(18, version), {
            "client_software_name": "wire-test", "client_software_version": "1"})))
        return _read_response(s, apis.API_VERSIONS, version)


def _kafka_port(c: LocalCluster) -> int:
    return int(c.spec(1).kafka_port or 0)


def _api_versions_level(c: LocalCluster, node: int) -> int:
    """The finalized brook.metadata.version a broker's ApiVersions v3 lists."""
    finalized = {f.name: int(f.max_version_level) for f in _api_versions(int(c.spec(node).kafka_port or 0))
                 .finalized_features}
    return finalized.get("brook.metadata.version", 0)


# ---- tests ----
def test_api_versions_advertises_what_is_served_and_answers_newer_versions_in_v0(cluster: LocalCluster) -> None:
    resp = _api_versions(_kafka_port(cluster))
    assert resp.error_code == 0
    served = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    # Served as advertised, but for Produce, advertised from v0 as Kafka 4 does (KAFKA-18659); v0-v2 are closed
    # (test_malformed_requests_close_the_connection_and_harm_nothing's produce-v2-not-served).
    assert served == {**apis.SUPPORTED, apis.PRODUCE: (0, apis.SUPPORTED[apis.PRODUCE][1])}
    # KIP-511: an ApiVersions newer than ours gets a v0 answer with UNSUPPORTED_VERSION and our range.
    with _connect(_kafka_port(cluster)) as s:
        head = struct.pack(">hhih", apis.API_VERSIONS, 99, 7, 1) + b"x" + b"\0\0"
        s.sendall(struct.pack(">i", len(head)) + head)
        size = struct.unpack(">i", _recv_exactly(s, 4))[0]
        data = _recv_exactly(s, size)
        body, _ = entity_reader(codec.response_schema(18, 0))(data, 4)
        assert body.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert {k.api_key for k in body.api_keys} == set(apis.SUPPORTED)


def test_api_versions_v4_is_answered_in_v4(cluster: LocalCluster) -> None:
    """Kafka 4's clients (kafka-python 3 too) open each connection with ApiVersions v4, the newest they know: a
    broker serving v3 answers it UNSUPPORTED_VERSION, and every new connection cost a second request. v4 only
    lets a supported feature's lowest level be 0 (KAFKA-17011); Brook's is 1, so the answer is v3's."""
    v4, v3 = _api_versions(_kafka_port(cluster), 4), _api_versions(_kafka_port(cluster), 3)
    assert v4.error_code == 0, v4
    assert {k.api_key: (k.min_version, k.max_version) for k in v4.api_keys}[apis.API_VERSIONS] == (0, 4)
    def plain(r: Any) -> tuple[list[tuple[int, int, int]], list[tuple[str, int, int]]]:  # each version's own classes
        return ([(k.api_key, k.min_version, k.max_version) for k in r.api_keys],
                [(f.name, f.min_version, f.max_version) for f in r.supported_features])
    assert plain(v4) == plain(v3), (plain(v4), plain(v3))


def _sized(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.parametrize("frame", [
    pytest.param(struct.pack(">i", 0x7FFFFFFF) + b"\0" * 16, id="2GiB-size-prefix"),
    pytest.param(struct.pack(">i", -5) + b"\0" * 16, id="negative-size-prefix"),
    pytest.param(_sized(b"\0\0\0\0"), id="shorter-than-a-header"),
    pytest.param(_sized(struct.pack(">hhi", 9999, 0, 7) + b"\0\xff"), id="unknown-api"),
    pytest.param(_sized(struct.pack(">hhi", 0, 2, 7) + b"\0\0"), id="produce-v2-not-served"),
    pytest.param(_sized(struct.pack(">hhih", 0, 9, 7, 200) + b"abc"), id="client-id-past-the-end"),
    pytest.param(_sized(struct.pack(">hhih", 3, 12, 7, 0) + b"\0" + b"\xff" * 9), id="metadata-varint-overflow"),
    pytest.param(_sized(struct.pack(">hhih", 0, 9, 7, 0) + b"\0" + b"\x00\xff\xff\xff\xff\x0f"),
                 id="produce-huge-array-count"),
])
def test_malformed_requests_close_the_connection_and_harm_nothing(cluster: LocalCluster, frame: bytes) -> None:
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(frame)
        assert closed_by_peer(s), "the listener kept a connection that sent an unreadable request"
    assert _api_versions(_kafka_port(cluster)).error_code == 0  # the broker is unharmed


def test_a_version_not_served_is_logged_by_the_apis_name_and_why(cluster: LocalCluster) -> None:
    """A client too old for Kafka 4 (kafka-go 0.2.1 fetches with Fetch v2) got "API 1 v2 is not served"; Kafka says
    which API and that the version is unsupported. The line is throttled: such clients retry in a loop."""
    for _ in range(3):
        with _connect(_kafka_port(cluster)) as s:
            s.sendall(_sized(struct.pack(">hhi", apis.FETCH, 2, 7) + b"\0\0"))
            assert closed_by_peer(s)
    wait_for(lambda: "Fetch (1) v2 is not served (this broker serves v4-v12; a client too old for Kafka 4"
             in cluster.node_log(1).read_text(), 20, "the refusal named in the log")


def _commit_and_fetch(port: int, group: str, offset: int | None, retention_ms: int) -> int:
    """An OffsetCommit v2 (when ``offset`` is given) from outside group management with ``retention_ms``, then the
    committed offset OffsetFetch v1 answers (-1: none); retried while the coordinator is being made."""
    deadline = time.monotonic() + 30
    while True:
        with _connect(port) as s:
            s.sendall(_frame(10, 1, codec.build(codec.request_schema(10, 1), {"key": group, "key_type": 0})))
            _read_response(s, 10, 1)  # makes __consumer_offsets, as a client's first FindCoordinator does
            if offset is not None:
                s.sendall(_frame(8, 2, codec.build(codec.request_schema(8, 2), {
                    "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                    "retention_time": datetime.timedelta(milliseconds=retention_ms), "topics": [{"name": "wire", "partitions": [
                        {"partition_index": 0, "committed_offset": offset, "committed_metadata": ""}]}]})))
                code = _read_response(s, 8, 2).topics[0].partitions[0].error_code
            else:
                code = 0
            if code == 0:
                s.sendall(_frame(9, 1, codec.build(codec.request_schema(9, 1), {
                    "group_id": group, "topics": [{"name": "wire", "partition_indexes": [0]}]})))
                fetched = _read_response(s, 9, 1).topics[0].partitions[0]
                if fetched.error_code == 0:
                    return int(fetched.committed_offset)
                code = fetched.error_code
        assert time.monotonic() < deadline, f"the commit or fetch kept failing with {code}"
        time.sleep(0.5)


def test_a_commits_retention_time_expires_its_offsets(cluster: LocalCluster) -> None:
    """OffsetCommit v2-v4 carry retention_time_ms (kafka-go 0.2.1 sends 24 h, Sarama its Consumer.Offsets.Retention):
    Kafka expires such an offset that long after the commit, once the group is empty. Brook kept it for
    offsets.retention.minutes, 7 days (Go clients audit). -1, what the other clients send, keeps the broker's."""
    port = _kafka_port(cluster)
    assert _commit_and_fetch(port, "retained-briefly", 42, 2000) == 42
    assert _commit_and_fetch(port, "retained-as-the-broker-says", 43, -1) == 43
    wait_for(lambda: _commit_and_fetch(port, "retained-briefly", None, -1) == -1, 30,
             "the offset committed with a 2 s retention to expire")
    assert _commit_and_fetch(port, "retained-as-the-broker-says", None, -1) == 43


def _metric(cluster: LocalCluster, name: str) -> float:
    for line in cluster.read_metrics(1).splitlines():
        if line.startswith(f'{name}{{listener="KAFKA"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} for the KAFKA listener")


def test_a_frame_holds_its_bytes_in_the_memory_pool_until_its_connection_is_gone(cluster: LocalCluster) -> None:
    # The listener reserves a frame's size (queued.max.request.bytes) before reading its body, so frames
    # announced and never sent cannot grow memory past the pool; a dropped connection gives them back.
    size = 512 * 1024
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(struct.pack(">i", size) + struct.pack(">hhih", apis.METADATA, 12, 7, 0))  # then nothing
        wait_for(lambda: _metric(cluster, "brook_kafka_request_bytes") >= size, 20,
                 "the announced frame's bytes to be reserved")
    wait_for(lambda: _metric(cluster, "brook_kafka_request_bytes") == 0, 20,
             "the reservation to be released when the client went away")
    assert _api_versions(_kafka_port(cluster)).error_code == 0


def test_one_address_cannot_take_every_connection(cluster: LocalCluster) -> None:
    # max.connections.per.ip: the address's connections past the bound are closed at accept, unread;
    # another address is served meanwhile, and the address is served again once one of its closes.
    port = cluster.spec(1).kafka_port
    held = open_past_the_bound(port, PER_IP)
    try:
        assert _api_versions(port).error_code == ErrorCode.NONE  # from 127.0.0.1
        held[0].close()

        def served_again() -> bool:
            s = connect_from(ATTACKER, port)
            held.append(s)
            s.sendall(_frame(apis.API_VERSIONS, 0, codec.request_schema(apis.API_VERSIONS, 0)()))
            try:
                return _read_response(s, apis.API_VERSIONS, 0).error_code == ErrorCode.NONE
            except ConnectionError:
                return False
        wait_for(served_again, 10, "a connection from the address once one of its own closed")
    finally:
        for s in held:
            s.close()


def test_random_bytes_never_get_an_answer_other_than_closing(cluster: LocalCluster) -> None:
    rng = random.Random(20261123)
    for _ in range(40):
        api_key, version = rng.choice(sorted(apis.SUPPORTED.items()))[0], 0
        lo, hi = apis.SUPPORTED[api_key]
        version = rng.randint(lo, hi)
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        head = struct.pack(">hhi", api_key, version, 7) + junk
        with _connect(_kafka_port(cluster)) as s:
            s.sendall(struct.pack(">i", len(head)) + head)
            s.settimeout(10)
            try:
                data = s.recv(65536)  # either an answer (the junk happened to parse) or the close
            except ConnectionResetError:
                data = b""
            assert data == b"" or len(data) >= 8
    assert _api_versions(_kafka_port(cluster)).error_code == 0


def test_a_corrupt_batch_is_refused_and_the_partition_stays_readable(cluster: LocalCluster) -> None:
    from confluent_kafka import Consumer, Producer

    bogus = struct.pack(">qi", 0, 49) + b"\x00" * 4 + b"\x02" + b"\xde\xad\xbe\xef" * 11  # magic 2, wrong CRC
    body = codec.build(codec.request_schema(apis.PRODUCE, 9), {
        "acks": -1, "timeout": 10_000,
        "topic_data": [{"name": "wire", "partition_data": [{"index": 0, "records": bogus}]}]})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.PRODUCE, 9, body))
        resp = _read_response(s, apis.PRODUCE, 9)
    code = resp.responses[0].partition_responses[0].error_code
    assert code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD), code
    p = Producer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "acks": "all"})
    p.produce("wire", b"after-the-attack")
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "group.id": "wire-read",
                  "auto.offset.reset": "earliest"})
    c.subscribe(["wire"])
    seen: list[bytes] = []

    def read() -> bool:
        m = c.poll(0.5)
        if m is not None and not m.error():
            seen.append(m.value())
        return b"after-the-attack" in seen
    try:
        wait_for(read, 30, "the record produced after the corrupt batch")
    finally:
        c.close()


def test_acks_zero_gets_no_response_and_the_records_land(cluster: LocalCluster) -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder  # an independent batch encoder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"acks-zero", headers=[])
    batch = bytes(b.build())
    body = codec.build(codec.request_schema(apis.PRODUCE, 9), {
        "acks": 0, "timeout": 10_000, "topic_data": [{"name": "wire", "partition_data": [{"index": 0,
                                                                                          "records": batch}]}]})
    lo = codec.build(codec.request_schema(apis.LIST_OFFSETS, 7), {
        "replica_id": -1, "topics": [{"name": "wire", "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.LIST_OFFSETS, 7, lo))
        before = _read_response(s, apis.LIST_OFFSETS, 7).topics[0].partitions[0].offset
        s.sendall(_frame(apis.PRODUCE, 9, body))  # no answer comes for acks=0 ...

        def landed() -> bool:
            s.sendall(_frame(apis.LIST_OFFSETS, 7, lo))  # ... so the next answer read is ListOffsets'
            return _read_response(s, apis.LIST_OFFSETS, 7).topics[0].partitions[0].offset > before
        wait_for(landed, 20, "the acks=0 record to raise the high watermark")


def test_a_failed_acks_zero_produce_closes_the_connection(cluster: LocalCluster) -> None:
    """acks=0 has no answer to carry an error, so, as Kafka does, the broker closes the connection and the
    client refreshes its metadata (a moved leader, for example). A successful acks=0 keeps it open."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"acks-zero", headers=[])
    batch = bytes(b.build())

    def produce(partition: int, client_id: str | None = "wire-test") -> bytes:
        return _frame(apis.PRODUCE, 9, codec.build(codec.request_schema(apis.PRODUCE, 9), {
            "acks": 0, "timeout": 10_000,
            "topic_data": [{"name": "wire", "partition_data": [{"index": partition, "records": batch}]}]}),
            client_id=client_id)
    lo = _frame(apis.LIST_OFFSETS, 7, codec.build(codec.request_schema(apis.LIST_OFFSETS, 7), {
        "replica_id": -1, "topics": [{"name": "wire", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}))
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(produce(0) + lo)  # a successful acks=0: no answer, the connection stays open
        assert _read_response(s, apis.LIST_OFFSETS, 7).topics[0].partitions[0].error_code == 0
        # Partition 7 of the one-partition topic: no broker leads it (UNKNOWN_TOPIC_OR_PARTITION).
        s.sendall(produce(7))
        assert closed_by_peer(s), "a failed acks=0 produce left the connection open"
    # Found by an audit: each failure logged a line with the whole client id (up to 32 KB), however often a client
    # did it (9,110 lines, 295 MB, in 10 s). Now a line per 10 s at most, the client id shortened.
    log = cluster.node_log(1)
    earlier = log.read_text(errors="replace")
    before = earlier.count("acks=0 produce failed")
    for i in range(20):
        with _connect(_kafka_port(cluster)) as s:
            s.sendall(produce(7, client_id="C" * 30_000 if i % 2 else None))  # a null client id too (the fuzzer)
            assert closed_by_peer(s)
    text = log.read_text(errors="replace")
    assert " ERROR " not in text[len(earlier):], text[len(earlier):][-3000:]
    lines = [line for line in text.splitlines() if "acks=0 produce failed" in line]
    assert len(lines) - before <= 1, f"{len(lines) - before} lines for 20 failures in a row"
    assert max(len(line) for line in lines) < 1000, f"a line of {max(len(line) for line in lines)} characters"


def test_a_partition_named_twice_in_a_produce_takes_its_last_records_once(cluster: LocalCluster) -> None:
    """As Kafka's KafkaApis keeps a map of the request's partitions: every copy was appended, and answered (audit)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    def batch(value: bytes) -> bytes:
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        b.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
        return bytes(b.build())

    def end() -> int:
        with _connect(_kafka_port(cluster)) as s:
            s.sendall(_frame(apis.LIST_OFFSETS, 7, codec.build(codec.request_schema(apis.LIST_OFFSETS, 7), {
                "replica_id": -1, "topics": [{"name": "wire", "partitions": [{"partition_index": 0, "timestamp": -1}]}]})))
            return int(_read_response(s, apis.LIST_OFFSETS, 7).topics[0].partitions[0].offset)

    before = end()
    copies = [{"index": 0, "records": batch(f"copy-{i}".encode())} for i in range(4)]
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.PRODUCE, 9, codec.build(codec.request_schema(apis.PRODUCE, 9), {
            "acks": 1, "timeout": 10_000, "topic_data": [{"name": "wire", "partition_data": copies[:2]},
                                                         {"name": "wire", "partition_data": copies[2:]}]})))
        answer = _read_response(s, apis.PRODUCE, 9)
    answered = [(r.name, p.index, p.error_code) for r in answer.responses for p in r.partition_responses]
    assert answered == [("wire", 0, ErrorCode.NONE)], answered
    assert end() == before + 1, "more than one copy of the partition's records was appended"


@pytest.mark.parametrize("version", [4, 6, 7, 12])
def test_a_replica_fetch_on_the_kafka_listener_is_refused_in_a_form_its_version_carries(cluster: LocalCluster,
                                                                                       version: int) -> None:
    """Fetch v4-v6 have no top-level error: each partition carries CLUSTER_AUTHORIZATION_FAILED (the answer was
    empty, saying nothing: audit); v7+ carry it at the top."""
    fields: dict[str, Any] = {"replica_id": 1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
                              "topics": [{"topic": "wire", "partitions": [{
                                  "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
    if version >= 7:
        fields.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
    if version >= 12:
        fields["topics"][0]["partitions"][0].update(current_leader_epoch=-1, last_fetched_epoch=-1,
                                                    log_start_offset=-1)
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.FETCH, version, codec.build(codec.request_schema(apis.FETCH, version), fields)))
        answer = _read_response(s, apis.FETCH, version)
    if version >= 7:
        assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, answer
    else:
        codes = [p.error_code for t in answer.responses for p in t.partitions]
        assert codes == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED], answer


def test_sasl_listener_refuses_requests_before_authentication(cluster: LocalCluster) -> None:
    port = cluster.sasl_port  # type: ignore[attr-defined]
    assert _api_versions(port).error_code == 0  # allowed before authenticating (KIP-511/152)
    md = codec.build(codec.request_schema(apis.METADATA, 12), {"topics": None, "allow_auto_topic_creation": False})
    with _connect(port) as s:
        s.sendall(_frame(apis.METADATA, 12, md))
        assert closed_by_peer(s)
    with _connect(port) as s:  # a client that never authenticates is closed at kafka.authentication.timeout.ms
        started = time.monotonic()
        assert closed_by_peer(s, 20)
        assert time.monotonic() - started < 15


def test_sasl_authenticate_on_a_plaintext_listener_is_an_illegal_state_answered(cluster: LocalCluster) -> None:
    """As Kafka's KafkaApis answers it: ILLEGAL_SASL_STATE, and the connection goes on. It was closed unanswered,
    so a client saw a disconnect (audit)."""
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.SASL_AUTHENTICATE, 2, codec.build(codec.request_schema(apis.SASL_AUTHENTICATE, 2), {
            "auth_bytes": f"\0{USER}\0{PASSWORD}".encode()})))
        answer = _read_response(s, apis.SASL_AUTHENTICATE, 2)
        assert answer.error_code == ErrorCode.ILLEGAL_SASL_STATE, answer
        s.sendall(_frame(apis.API_VERSIONS, 3, codec.build(codec.request_schema(18, 3), {
            "client_software_name": "wire-test", "client_software_version": "1"})))
        assert _read_response(s, apis.API_VERSIONS, 3).error_code == ErrorCode.NONE


def test_a_failed_login_is_answered_and_the_connection_closed(cluster: LocalCluster) -> None:
    """As Kafka's broker does (KIP-152): every guess of a password costs a new connection. The connection
    used to stay open for more guesses."""
    port = cluster.sasl_port  # type: ignore[attr-defined]
    with _connect(port) as s:
        s.sendall(_frame(apis.SASL_HANDSHAKE, 1, codec.build(codec.request_schema(apis.SASL_HANDSHAKE, 1),
                                                                {"mechanism": "PLAIN"})))
        assert _read_response(s, apis.SASL_HANDSHAKE, 1).error_code == ErrorCode.NONE
        s.sendall(_frame(apis.SASL_AUTHENTICATE, 2, codec.build(codec.request_schema(apis.SASL_AUTHENTICATE, 2), {
            "auth_bytes": f"\0{USER}\0not-the-password".encode()})))
        failed = _read_response(s, apis.SASL_AUTHENTICATE, 2)
        assert failed.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED, failed
        # Another try on the same connection is not answered: it was closed (the old listener answered
        # it, and closed the connection only at kafka.authentication.timeout.ms).
        with contextlib.suppress(OSError):
            s.sendall(_frame(apis.SASL_HANDSHAKE, 1, codec.build(codec.request_schema(apis.SASL_HANDSHAKE, 1),
                                                                    {"mechanism": "PLAIN"})))
        assert closed_by_peer(s, 10), "a second login attempt was answered on the same connection"


def _handshake(s: socket.socket, mechanism: str) -> Any:
    s.sendall(_frame(apis.SASL_HANDSHAKE, 1, codec.build(codec.request_schema(apis.SASL_HANDSHAKE, 1),
                                                            {"mechanism": mechanism})))
    return _read_response(s, apis.SASL_HANDSHAKE, 1)


def test_an_unsupported_mechanism_or_a_second_handshake_is_answered_and_the_connection_closed(
        cluster: LocalCluster) -> None:
    """As Kafka's SaslServerAuthenticator: an unsupported mechanism is answered with the enabled ones and the
    connection closed; a second SaslHandshake while logging in is answered ILLEGAL_SASL_STATE and the connection
    closed. Both connections stayed open, and the second handshake switched the mechanism mid-login (audit)."""
    port = cluster.sasl_port  # type: ignore[attr-defined]
    with _connect(port) as s:
        answer = _handshake(s, "GSSAPI")
        assert answer.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM, answer
        assert "PLAIN" in answer.mechanisms and "SCRAM-SHA-512" in answer.mechanisms, answer
        # Well within the login's own deadline (kafka.authentication.timeout.ms, 3 s here), which closes it anyway.
        assert closed_by_peer(s, 1), "the connection stayed open after an unsupported mechanism"
    with _connect(port) as s:
        assert _handshake(s, "SCRAM-SHA-256").error_code == ErrorCode.NONE
        assert _handshake(s, "PLAIN").error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert closed_by_peer(s, 1), "the connection stayed open after a second handshake"
    with _connect(port) as s:  # and a login goes on as before
        assert _handshake(s, "PLAIN").error_code == ErrorCode.NONE
        s.sendall(_frame(apis.SASL_AUTHENTICATE, 2, codec.build(codec.request_schema(apis.SASL_AUTHENTICATE, 2), {
            "auth_bytes": f"\0{USER}\0{PASSWORD}".encode()})))
        assert _read_response(s, apis.SASL_AUTHENTICATE, 2).error_code == ErrorCode.NONE


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_clients_authenticate_and_wrong_passwords_fail(cluster: LocalCluster, mechanism: str) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    base = {"bootstrap.servers": f"127.0.0.1:{cluster.sasl_port}",  # type: ignore[attr-defined]
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": USER}
    p = Producer({**base, "sasl.password": PASSWORD, "acks": "all"})
    p.produce("wire", f"via-{mechanism}".encode())
    assert p.flush(30) == 0
    # Another user: librdkafka retries a failed login at once, and failures past the rate limit lock a user out.
    # The refusal reaches the client's error callback as an authentication error, at once: no call's timeout
    # is waited out.
    refusals: list[Any] = []
    bad = AdminClient({**base, "sasl.username": f"kafka-bob-{mechanism}", "sasl.password": "not-the-password",
                       "error_cb": refusals.append})
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=0.5)

    def refused() -> bool:
        bad.poll(0.1)  # serves the error callback
        return bool(refusals)
    wait_for(refused, 10, "the client told of the failed login")
    assert any(e.code() == KafkaError._AUTHENTICATION for e in refusals), refusals


def test_sasl_plain_with_kafka_python(cluster: LocalCluster) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{cluster.sasl_port}",  # type: ignore[attr-defined]
                      security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_plain_username=USER,
                      sasl_plain_password=PASSWORD, acks="all")
    p.send("wire", b"kafka-python-plain").get(timeout=30)
    p.close()


def test_consumer_fetches_go_out_by_sendfile(cluster: LocalCluster) -> None:
    from confluent_kafka import Consumer, Producer

    p = Producer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "linger.ms": 5})
    for i in range(200):
        p.produce("wire", os.urandom(100), key=str(i).encode())
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "group.id": "wire-sendfile",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe(["wire"])
    got = []

    def read() -> bool:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
        return len(got) >= 200
    try:
        wait_for(read, 30, "200 records")
    finally:
        c.close()
    text = cluster.read_metrics(1)
    sent = [float(line.split()[-1]) for line in text.splitlines()
            if line.startswith('brook_kafka_sendfile_bytes_total{listener="KAFKA"}')]
    assert sent and sent[0] >= 200 * 100, f"sendfile bytes: {sent}"


def test_file_records_survive_the_segment_being_deleted(tmp_path: Path) -> None:
    from storage.file_records import FileRecords

    path = tmp_path / "seg.log"
    path.write_bytes(b"0123456789" * 10)
    fd = os.open(path, os.O_RDONLY)
    fr = FileRecords(fd, 10, 20, 0)
    os.close(fd)
    path.unlink()
    assert len(fr) == 20 and fr.read() == (b"0123456789" * 2)
    fr.close()
    assert fr.fd == -1


def test_a_client_that_reads_no_answers_is_muted_until_it_reads(cluster: LocalCluster) -> None:
    """As Kafka mutes a channel whose answer waits unsent: while a connection's write buffer is past its high-water
    mark, no more of its requests are read, so none has an answer built and held. The listener used to read on up
    to its five outstanding answers, each held in full (audit: 20 connections that read nothing, five 40 MB
    ListGroups answers each)."""
    describe = codec.build(codec.request_schema(DESCRIBE_CONFIGS, 4), {
        "resources": [{"resource_type": 2, "resource_name": "wire", "configuration_keys": None}] * 100,
        "include_synonyms": True, "include_documentation": True})
    requests = 12  # each answered with 320 KB: past the kernel's buffers (socket.send.buffer.bytes) in one
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        s.settimeout(10)
        s.connect(("127.0.0.1", _kafka_port(cluster)))
        before = _requests_of(cluster, DESCRIBE_CONFIGS)
        s.sendall(b"".join(_frame(DESCRIBE_CONFIGS, 4, describe, correlation_id=7) for _ in range(requests)))
        handled: list[float] = []

        def settled() -> bool:
            handled.append(_requests_of(cluster, DESCRIBE_CONFIGS) - before)
            return len(handled) > 4 and handled[-1] == handled[-5] > 0
        wait_for(settled, 30, lambda: f"the listener stops reading (requests read so far: {handled})", poll_s=0.25)
        assert handled[-1] <= 3, f"{handled[-1]} requests read from a connection that reads no answers"
        for _ in range(requests):  # once it reads, the rest are read and answered, in order
            assert _read_response(s, DESCRIBE_CONFIGS, 4).results[0].error_code == ErrorCode.NONE
    assert _requests_of(cluster, DESCRIBE_CONFIGS) - before == requests


def _requests_of(cluster: LocalCluster, api_key: int) -> float:
    return cluster.metric(1, "brook_kafka_requests_total", api_key=str(api_key), listener="KAFKA")


def _produce_one(cluster: LocalCluster, version: int, records: bytes | None) -> Any:
    body = codec.build(codec.request_schema(apis.PRODUCE, version), {
        "acks": -1, "timeout": 10_000, "transactional_id": None,
        "topic_data": [{"name": "wire", "partition_data": [{"index": 0, "records": records}]}]})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.PRODUCE, version, body))
        return _read_response(s, apis.PRODUCE, version).responses[0].partition_responses[0]


def test_produce_refusals_are_kafkas_not_retriable_ones(cluster: LocalCluster) -> None:
    """As Kafka's ProduceRequest validation: zstd before Produce v7 is UNSUPPORTED_COMPRESSION_TYPE (its client could
    not read it), and a message set of magic 0 or 1, or no records, INVALID_RECORD. The zstd batch was stored, and
    the others answered CORRUPT_MESSAGE ("truncated batch header"), which clients retry until their timeout
    (audit)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=4, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b"zstd" * 1000, headers=[])  # compressible: compressed
    zstd = bytes(builder.build())
    assert zstd[22] & 7 == 4
    refused = _produce_one(cluster, 3, zstd)
    assert refused.error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, refused
    assert _produce_one(cluster, 7, zstd).error_code == ErrorCode.NONE
    legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    legacy.append(0, timestamp=None, key=b"k", value=b"old client")
    answer = _produce_one(cluster, 8, bytes(legacy.build()))
    assert answer.error_code == ErrorCode.INVALID_RECORD and "magic 1" in answer.error_message, answer
    answer = _produce_one(cluster, 8, b"")
    assert answer.error_code == ErrorCode.INVALID_RECORD, answer
    # Exactly one batch per partition from Produce v3 on: a zstd batch after a plain one got past the v7 rule (audit).
    plain = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    plain.append(0, timestamp=None, key=b"k", value=b"first", headers=[])
    for version, second in ((3, zstd), (9, bytes(plain.build()))):
        answer = _produce_one(cluster, version, bytes(plain.build()) + second)
        assert answer.error_code == ErrorCode.INVALID_RECORD, (version, answer)
    assert "exactly one record batch" in answer.error_message, answer  # v8 and later carry a message


def _fetch_one(cluster: LocalCluster, topic: str, version: int) -> Any:
    body = codec.build(codec.request_schema(apis.FETCH, version), {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                                    "current_leader_epoch": -1, "log_start_offset": -1}]}]})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.FETCH, version, body))
        return _read_response(s, apis.FETCH, version).responses[0].partitions[0]


def test_a_zstd_topic_is_not_served_to_fetchers_older_than_v10(cluster: LocalCluster) -> None:
    """As Kafka's fetch (KIP-110): a partition whose compression.type is zstd answers a Fetch before v10
    UNSUPPORTED_COMPRESSION_TYPE, with no records, since such a client cannot read zstd. It was served the zstd
    batches (audit)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        admin.create_topic("wire-zstd", 1, 1, configs={"compression.type": "zstd"})
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    builder.append(0, timestamp=None, key=b"k", value=b"zstd" * 1000, headers=[])
    body = codec.build(codec.request_schema(apis.PRODUCE, 8), {
        "acks": -1, "timeout": 10_000, "transactional_id": None,
        "topic_data": [{"name": "wire-zstd", "partition_data": [{"index": 0, "records": bytes(builder.build())}]}]})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(apis.PRODUCE, 8, body))
        assert _read_response(s, apis.PRODUCE, 8).responses[0].partition_responses[0].error_code == ErrorCode.NONE
    old = _fetch_one(cluster, "wire-zstd", 9)
    assert old.error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE and old.records is None, old
    assert old.high_watermark == -1, old
    new = _fetch_one(cluster, "wire-zstd", 10)
    assert new.error_code == ErrorCode.NONE and new.high_watermark == 1 and new.records[22] & 7 == 4, new
    other = _fetch_one(cluster, "wire", 9)  # a topic that keeps the producer's codec is served as before
    assert other.error_code == ErrorCode.NONE and other.high_watermark >= 0, other


def _admin_call(cluster: LocalCluster, api_key: int, version: int, values: dict[str, Any]) -> Any:
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(api_key, version, codec.build(codec.request_schema(api_key, version), values)))
        return _read_response(s, api_key, version)


def test_a_topic_named_twice_in_one_request_is_answered_once_and_not_changed(cluster: LocalCluster) -> None:
    """As Kafka's controller: a topic named twice in a CreateTopics, DeleteTopics or CreatePartitions is refused
    (INVALID_REQUEST, none of its copies done) in one answer entry; each copy had an entry (audit)."""
    create_topics, delete_topics, create_partitions = 19, 20, 37
    twice = {"name": "wire-twice", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
    once = dict(twice, name="wire-once")
    out = _admin_call(cluster, create_topics, 5, {"topics": [twice, once, twice], "timeout": 10_000,
                                                   "validate_only": False})
    assert [(t.name, t.error_code) for t in out.topics] == [
        ("wire-twice", ErrorCode.INVALID_REQUEST), ("wire-once", ErrorCode.NONE)], out
    grow = {"name": "wire-once", "count": 2, "assignments": None}
    out = _admin_call(cluster, create_partitions, 2, {"topics": [grow, grow], "timeout": 10_000,
                                                       "validate_only": False})
    assert [(r.name, r.error_code) for r in out.results] == [("wire-once", ErrorCode.INVALID_REQUEST)], out
    out = _admin_call(cluster, delete_topics, 4, {"topic_names": ["wire-once", "wire-once"], "timeout": 10_000})
    assert [(r.name, r.error_code) for r in out.responses] == [("wire-once", ErrorCode.INVALID_REQUEST)], out
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        assert len(admin.describe_topics(["wire-once"])["wire-once"].partitions) == 1
        assert "wire-twice" not in admin.list_topics()


def test_a_validate_only_create_lists_every_config_the_topic_would_have(cluster: LocalCluster) -> None:
    """CreateTopics v5+ (KIP-525) answers the configs of the topic it creates; with validate_only Kafka's controller
    lists the same, every config with its value and source. Brook listed only the configs the request gave."""
    create_topics = 19

    def create(name: str, validate_only: bool) -> dict[str, tuple[str, int]]:
        out = _admin_call(cluster, create_topics, 5, {"timeout": 10_000, "validate_only": validate_only, "topics": [
            {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": [{"name": "retention.ms", "value": "3600000"}]}]})
        [t] = out.topics
        assert t.error_code == ErrorCode.NONE and t.num_partitions == 1, t
        return {c.name: (c.value, c.config_source) for c in t.configs}

    would = create("wire-effective", validate_only=True)
    made = create("wire-effective", validate_only=False)
    assert would == made, set(would.items()) ^ set(made.items())
    assert would["retention.ms"] == ("3600000", 1) and would["cleanup.policy"] == ("delete", 5), would
    assert len(would) > 20, sorted(would)


def test_deleting_a_config_no_topic_can_hold_is_a_no_op_as_in_kafka(cluster: LocalCluster) -> None:
    """IncrementalAlterConfigs DELETE of a name that is no topic config: Kafka's controller has nothing to remove
    and answers success; Brook answered INVALID_CONFIG (audit). SET of such a name is still refused."""
    def alter(op: int, name: str, value: str | None) -> Any:
        [answer] = _admin_call(cluster, INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": "wire",
             "configs": [{"name": name, "config_operation": op, "value": value}]}]}).responses
        return answer
    assert alter(1, "no.such.config", None).error_code == ErrorCode.NONE
    refused = alter(0, "no.such.config", "1")
    assert refused.error_code == ErrorCode.INVALID_CONFIG, refused
    assert alter(0, "retention.ms", "600000").error_code == ErrorCode.NONE
    assert alter(1, "retention.ms", None).error_code == ErrorCode.NONE


INCREMENTAL_ALTER_CONFIGS, BROKER_LOGGER = 44, 8


def _config_value(cluster: LocalCluster, resource_type: int, name: str, key: str) -> str | None:
    out = _admin_call(cluster, DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": resource_type, "resource_name": name, "configuration_keys": [key]}],
        "include_synonyms": False, "include_documentation": False})
    [result] = out.results
    assert result.error_code == ErrorCode.NONE, result
    return {c.name: c.value for c in result.configs}.get(key)


def test_a_topic_name_no_topic_can_have_is_an_invalid_topic_in_config_requests(cluster: LocalCluster) -> None:
    """DescribeConfigs and IncrementalAlterConfigs of a name no topic can have: Kafka validates the name before
    it looks the topic up (INVALID_TOPIC_EXCEPTION) and its controller refuses the empty name of an alter as the
    "default topic resource"; Brook answered UNKNOWN_TOPIC_OR_PARTITION for all of them. A legal unknown name
    stays UNKNOWN_TOPIC_OR_PARTITION."""
    def describe(name: str) -> tuple[int, str | None]:
        [result] = _admin_call(cluster, DESCRIBE_CONFIGS, 4, {
            "resources": [{"resource_type": 2, "resource_name": name, "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False}).results
        return result.error_code, result.error_message

    def alter(name: str) -> tuple[int, str | None]:
        [answer] = _admin_call(cluster, INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": name,
             "configs": [{"name": "retention.ms", "config_operation": 0, "value": "60000"}]}]}).responses
        return answer.error_code, answer.error_message

    for name in ("no such topic!", "..", "x" * 250, ""):
        for what, (code, message) in (("describe", describe(name)), ("alter", alter(name))):
            expected = ErrorCode.INVALID_REQUEST if what == "alter" and name == "" else ErrorCode.INVALID_TOPIC_EXCEPTION
            assert code == expected and message, (what, name[:20], code, message)
    assert describe("wire-unknown")[0] == alter("wire-unknown")[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert alter("")[1] == "Default topic resource is not allowed."


APPEND, SUBTRACT, TOPIC_RESOURCE, CLUSTER_DEFAULT = 2, 3, 2, 4


def _list_op(cluster: LocalCluster, topic: str, op: int, key: str, value: str | None, *,
             resource: tuple[int, str] | None = None, validate_only: bool = False) -> tuple[int, str | None]:
    res_type, res_name = resource or (TOPIC_RESOURCE, topic)
    [answer] = _admin_call(cluster, INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": validate_only, "resources": [
        {"resource_type": res_type, "resource_name": res_name,
         "configs": [{"name": key, "config_operation": op, "value": value}]}]}).responses
    return answer.error_code, answer.error_message


def _finalize(cluster: LocalCluster, level: int) -> None:
    """brook.metadata.version ``level``, and every broker's metadata at it."""
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        admin.update_features(level)
    for node in cluster.broker_ids:
        wait_for(lambda n=node: _api_versions_level(cluster, n) >= level, 20, f"broker {node} at level {level}")


@pytest.mark.parametrize("level", [1, 3])
def test_append_and_subtract_change_a_list_config_as_kafkas_controller_does(cluster: LocalCluster,
                                                                             level: int) -> None:
    """IncrementalAlterConfigs' APPEND and SUBTRACT (KIP-339), which Kafka's admin tools send for list-typed
    keys, were refused as operations Brook did not have. As Kafka's controller: the topic's own value, else the
    key's default, with each element appended once or its first occurrence removed; a key that is not a list,
    a null value and a broker logger are refused, and nothing changes on a refusal or with validate_only. The
    same below brook.metadata.version 3 (the broker reads the value and sends a SET) and from it (the controller
    makes the value)."""
    append, subtract, topic, cluster_default = APPEND, SUBTRACT, TOPIC_RESOURCE, CLUSTER_DEFAULT
    if level > 1:
        _finalize(cluster, level)
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        admin.create_topic(f"wire-lists-{level}", 1, 1)

    def alter(op: int, key: str, value: str | None, *, resource: tuple[int, str] = (topic, f"wire-lists-{level}"),
              validate_only: bool = False) -> Any:
        [answer] = _admin_call(cluster, INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": validate_only, "resources": [
            {"resource_type": resource[0], "resource_name": resource[1],
             "configs": [{"name": key, "config_operation": op, "value": value}]}]}).responses
        return answer.error_code, answer.error_message

    def policy() -> str | None:
        return _config_value(cluster, topic, f"wire-lists-{level}", "cleanup.policy")

    assert alter(append, "cleanup.policy", "compact", validate_only=True) == (ErrorCode.NONE, None)
    assert policy() == "delete"
    assert alter(append, "cleanup.policy", "compact") == (ErrorCode.NONE, None)
    assert policy() == "delete,compact"  # the default, then the element: no cleanup.policy of its own before
    assert alter(append, "cleanup.policy", "delete,compact") == (ErrorCode.NONE, None)
    assert policy() == "delete,compact"  # each element once
    assert alter(subtract, "cleanup.policy", "delete") == (ErrorCode.NONE, None)
    assert policy() == "compact"
    code, message = alter(subtract, "cleanup.policy", "compact")  # nothing left: not a policy Brook has
    assert code == ErrorCode.INVALID_CONFIG and "cleanup.policy" in message, message
    assert alter(append, "retention.ms", "1") == (
        ErrorCode.INVALID_CONFIG, "Can't APPEND to key retention.ms because its type is not LIST.")
    assert alter(subtract, "cleanup.policy", None) == (
        ErrorCode.INVALID_REQUEST, "Null value not supported for : cleanup.policy")
    assert alter(append, "cleanup.policy", "delete", resource=(topic, "wire-no-such-topic"))[0] == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert policy() == "compact"
    code, message = alter(append, "root", "DEBUG", resource=(BROKER_LOGGER, "1"))
    assert code == ErrorCode.INVALID_REQUEST and "APPEND" in message, message
    assert _logger_levels(cluster)["root"] == "INFO"

    # The cluster's default (BROKER ''): its key is log.cleanup.policy. Put back at once: every topic without its
    # own value, this module's others too, takes it. A broker describes its BROKER resources from its own view of
    # the metadata, which follows the controller's (as Kafka's brokers do): waited for.
    def cluster_policy() -> str | None:
        return _config_value(cluster, cluster_default, "", "log.cleanup.policy")

    try:
        assert alter(append, "log.cleanup.policy", "compact", resource=(cluster_default, "")) == (ErrorCode.NONE, None)
        wait_for(lambda: cluster_policy() == "delete,compact", 10, "the cluster default 'delete,compact'")
    finally:
        assert alter(1, "log.cleanup.policy", None, resource=(cluster_default, ""))[0] == ErrorCode.NONE
    wait_for(lambda: cluster_policy() is None, 10, "no dynamic cluster default again")


def test_from_level_3_two_admins_changing_one_list_at_once_both_count(cluster: LocalCluster) -> None:
    """Two SUBTRACTs at once from 'compact,delete', one of each element: one after the other, the second would
    empty the list and is refused. Below level 3 each broker read 'compact,delete' and sent its SET: both could
    succeed, the last write winning and the other change lost. From level 3 the controller reads, changes and
    writes one request at a time: exactly one succeeds, every round."""
    import threading

    _finalize(cluster, 3)
    with Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints) as admin:
        admin.create_topic("wire-list-race", 1, 1)
    for round_ in range(8):
        assert _list_op(cluster, "wire-list-race", 0, "cleanup.policy", "compact,delete") == (ErrorCode.NONE, None)
        start = threading.Barrier(2)
        codes: list[int] = []

        def subtract(element: str, start: threading.Barrier = start, codes: list[int] = codes) -> None:
            start.wait(10)
            codes.append(_list_op(cluster, "wire-list-race", SUBTRACT, "cleanup.policy", element)[0])
        threads = [threading.Thread(target=subtract, args=(e,)) for e in ("compact", "delete")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(codes) == [ErrorCode.NONE, ErrorCode.INVALID_CONFIG], (round_, codes)


def _logger_levels(cluster: LocalCluster) -> dict[str, str]:
    body = codec.build(codec.request_schema(DESCRIBE_CONFIGS, 4), {
        "resources": [{"resource_type": BROKER_LOGGER, "resource_name": "1", "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(DESCRIBE_CONFIGS, 4, body))
        [result] = _read_response(s, DESCRIBE_CONFIGS, 4).results
    assert result.error_code == ErrorCode.NONE, result
    return {c.name: c.value for c in result.configs}


def _alter_loggers(cluster: LocalCluster, *changes: tuple[str, int, str | None]) -> Any:
    body = codec.build(codec.request_schema(INCREMENTAL_ALTER_CONFIGS, 1), {"validate_only": False, "resources": [
        {"resource_type": BROKER_LOGGER, "resource_name": "1",
         "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in changes]}]})
    with _connect(_kafka_port(cluster)) as s:
        s.sendall(_frame(INCREMENTAL_ALTER_CONFIGS, 1, body))
        [answer] = _read_response(s, INCREMENTAL_ALTER_CONFIGS, 1).responses
    return answer


def test_broker_loggers_are_listed_and_their_levels_changed_at_runtime(cluster: LocalCluster) -> None:
    """Kafka's BROKER_LOGGER resource (kafka-configs --entity-type broker-loggers; confluent-kafka's Python client
    has no such type, kafka-python's has): it was refused as an unknown resource type (audit), and a node's log
    level could be changed only by restarting it."""
    set_, delete = 0, 1
    before = _logger_levels(cluster)
    assert before["root"] == "INFO" and before["broker.replica_manager"] == "INFO", before
    assert _alter_loggers(cluster, ("broker.replica_manager", set_, "DEBUG")).error_code == ErrorCode.NONE
    assert _logger_levels(cluster)["broker.replica_manager"] == "DEBUG"
    wait_for(lambda: "log levels changed: broker.replica_manager=DEBUG" in cluster.node_log(1).read_text(), 10,
             "the change in the node's log")
    assert _alter_loggers(cluster, ("broker.replica_manager", delete, None)).error_code == ErrorCode.NONE
    assert _logger_levels(cluster)["broker.replica_manager"] == "INFO"  # the root's again
    for change, code in ((("no.such.logger", set_, "DEBUG"), ErrorCode.INVALID_CONFIG),
                         (("broker.replica_manager", set_, "LOUD"), ErrorCode.INVALID_CONFIG),
                         (("root", delete, None), ErrorCode.INVALID_REQUEST)):
        answer = _alter_loggers(cluster, change)
        assert answer.error_code == code, (change, answer)
    assert _logger_levels(cluster) == before
