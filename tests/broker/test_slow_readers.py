"""Clients that never read their answers cannot grow a broker's memory or hold its budget forever.

A fetch's answer is bytes in the broker until the client takes them: gRPC keeps a message the
peer grants no HTTP/2 flow-control window for in its buffers, and the Kafka listener keeps an
answer a client does not read in its socket's write buffer. Before, 50 gRPC fetches on one
connection whose answers were never read took a broker from 83 MB to 1.9 GB of RSS.

Real broker process, real sockets. The attacker connects from 127.0.0.2 so it is another client
address than the well-behaved consumer's (127.0.0.1):

1. gRPC: raw HTTP/2 (h2) Fetch calls that grant a window and never read a byte. The answers held
   stay within the attacker's ``max.fetch.response.bytes.per.ip``, the broker's RSS grows far less
   than the answers asked for, another client reads the whole partition meanwhile, and when the
   attacker goes the budget is given back (the calls' done callbacks).
2. Kafka protocol: Fetch frames on a socket that is never read. Within the share as well, and after
   ``connections.max.idle.ms`` without a byte taken the broker drops the connection and the budget
   is back, although the attacker keeps its socket open.
3. gRPC Metadata calls on connections granting no flow-control window: a request counts against
   ``max.inflight.requests.per.ip`` until its answer is written out, so the broker answers at most
   that many and refuses the rest (RESOURCE_EXHAUSTED); before, every connection could hold
   ``grpc.max_concurrent_streams`` unread answers, and a client could open thousands.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from brokerkit import Kit, running_kit
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.serial import entity_writer
from waiting import wait_for

from broker.kafka_wire import apis, codec
from client import Consumer, TopicPartition
from deploy.local.cluster import rss_bytes
from proto import broker_pb2
from proto.errors import ErrorCode
from storage.record_batch import RecordBatchBuilder

h2_connection = pytest.importorskip("h2.connection")
import h2.config  # noqa: E402  (after the skip: h2 is a test dependency)
import h2.settings  # noqa: E402
from h2client import grpc_request_headers  # noqa: E402

pytestmark = pytest.mark.slow

MiB = 1 << 20
FETCH_CAP = 4 * MiB  # fetch.max.bytes and fetch.partition.max.bytes: each answer carries up to this
SHARE = 8 * MiB  # max.fetch.response.bytes.per.ip: two answers
IDLE_MS = 4000  # connections.max.idle.ms: how long the Kafka listener waits for a client to read
IN_FLIGHT = 32  # max.inflight.requests.per.ip (and so each connection's HTTP/2 concurrent streams)
PARTITION_BYTES = 24 * MiB
ATTACKER = "127.0.0.2"  # loopback, but another client address than 127.0.0.1
GRPC_CALLS = 80  # 80 answers of 4 MiB asked for, 320 MiB, never read
KAFKA_FETCHES = 20
# RSS may grow by the answers the share allows, their copies while built and the allocator's slack;
# the 320 MiB asked for (1.9 GB for 50 calls of 10 MiB before) would not fit under it.
RSS_GROWTH_MAX = 160 * MiB
LIVENESS_S = 60.0  # generous bounds on a loaded machine, not speed asserts


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("slow-readers")
    overrides = {"fetch.max.bytes": str(FETCH_CAP), "fetch.partition.max.bytes": str(FETCH_CAP),
                 "max.fetch.response.bytes.per.ip": str(SHARE), "connections.max.idle.ms": str(IDLE_MS),
                 "max.inflight.requests.per.ip": str(IN_FLIGHT), "max.waiting.fetches.per.ip": "1"}
    with running_kit(base, nodes=1, overrides=overrides) as k:
        k.create_topic("big", partitions=1, rf=1)
        k.create_topic("quiet", partitions=1, rf=1)
        written = 0
        while written < PARTITION_BYTES:
            b = RecordBatchBuilder()
            for _ in range(15):  # under max.message.bytes
                b.append(int(time.time() * 1000), None, os.urandom(64 * 1024))
            r = k.produce("big", 0, b.build(), acks=1, timeout_ms=30_000, node_id=1)
            assert r.error_code == ErrorCode.NONE, r
            written += 15 * 64 * 1024
        yield k


def gauges(kit: Kit) -> dict[str, float]:
    out = {}
    for line in kit.cluster.read_metrics(1).splitlines():
        name, _, value = line.partition(" ")
        if name in ("brook_request_budget_bytes", "brook_fetch_clients_holding_bytes") or \
                name == 'brook_kafka_connections{listener="KAFKA"}':
            out[name.split("{")[0]] = float(value)
    return out


def grpc_fetch_frame() -> bytes:
    req = broker_pb2.FetchRequest(replica_id=-1, replica_epoch=-1, max_wait_ms=0, min_bytes=0, max_bytes=2**31 - 1)
    req.partitions.add(topic="big", partition=0, fetch_offset=0, partition_max_bytes=2**31 - 1,
                       current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
    body = req.SerializeToString()
    return struct.pack(">BI", 0, len(body)) + body  # gRPC's length-prefixed message


def never_reading_grpc_calls(port: int, calls: int, method: str = "Fetch", message: bytes | None = None, *,
                             window: int = 2**31 - 1) -> socket.socket:
    """One HTTP/2 connection from ATTACKER with ``calls`` calls of ``method``, never reading a byte. With
    the largest flow-control ``window`` its small receive buffer fills, then the broker's socket
    buffer; with a window of 0 the broker may send no answer's data at all."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((ATTACKER, 0))
    s.connect(("127.0.0.1", port))
    conn = h2_connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    if window > 65535:
        conn.increment_flow_control_window(window - 65535)
    msg = grpc_fetch_frame() if message is None else message
    for _ in range(calls):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, grpc_request_headers(f"/brook.BrokerService/{method}", f"127.0.0.1:{port}"))
        conn.send_data(sid, msg, end_stream=True)
    s.sendall(conn.data_to_send())
    return s


def kafka_fetch_frame(correlation_id: int) -> bytes:
    cls = codec.request_schema(apis.FETCH, 4)
    body = codec.build(cls, {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 2**31 - 1, "topics": [
        {"topic": "big", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 2**31 - 1}]}]})
    buf = io.BytesIO()
    entity_writer(HeaderV1)(buf, HeaderV1(request_api_key=apis.FETCH, request_api_version=4,
                                          correlation_id=correlation_id, client_id="slow-reader"))
    entity_writer(cls)(buf, body)
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


def read_partition_as_another_client(kit: Kit) -> int:
    """Every record of the partition through Brook's consumer from 127.0.0.1; the count."""
    c = Consumer(bootstrap_servers=kit.cluster.bootstrap_servers, enable_auto_commit=False)
    try:
        tp = TopicPartition("big", 0)
        c.assign([tp])
        c.seek(tp, 0)
        end = c.end_offsets([tp])[tp]
        n = 0
        deadline = time.monotonic() + LIVENESS_S
        while c.position(tp) < end and time.monotonic() < deadline:
            n += sum(len(v) for v in c.poll(timeout_ms=500).values())
        assert c.position(tp) == end, f"read {n} records up to {c.position(tp)} of {end} within {LIVENESS_S} s"
        return n
    finally:
        c.close()


def held_within_the_share(kit: Kit, seconds: float) -> list[float]:
    """The budget's bytes sampled for ``seconds``: each at most the attacker's share."""
    seen = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        g = gauges(kit)
        seen.append(g["brook_request_budget_bytes"])
        assert g["brook_request_budget_bytes"] <= SHARE, f"the broker holds {g} for one client address"
        time.sleep(0.2)
    return seen


def test_grpc_fetches_whose_answers_are_never_read_stay_within_the_clients_share(kit: Kit) -> None:
    pid = kit.cluster.pid(1)
    assert pid is not None
    baseline = rss_bytes(pid)
    assert baseline is not None
    peak = [baseline]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05):
            peak[0] = max(peak[0], rss_bytes(pid) or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    port = int(kit.cluster.broker_address(1).rsplit(":", 1)[1])
    attackers = [never_reading_grpc_calls(port, GRPC_CALLS // 2) for _ in range(2)]
    try:
        wait_for(lambda: gauges(kit)["brook_request_budget_bytes"] >= FETCH_CAP, LIVENESS_S,
                 "the attacker's answers to be held")
        held_within_the_share(kit, 2.0)
        assert gauges(kit)["brook_fetch_clients_holding_bytes"] == 1
        # Another client address reads everything meanwhile: the attacker holds only its own share.
        assert read_partition_as_another_client(kit) > 0
        # The reader's last fetch (cancelled by its close) gives its bytes back when its call's done
        # callback runs: on a loaded machine a moment later, when the budget held both for an instant.
        wait_for(lambda: gauges(kit)["brook_fetch_clients_holding_bytes"] == 1, LIVENESS_S,
                 "the reader's bytes given back once it closed")
        held_within_the_share(kit, 1.0)
        growth = peak[0] - baseline
        assert growth < RSS_GROWTH_MAX, \
            f"RSS grew {growth / MiB:.0f} MiB for {GRPC_CALLS} unread answers of {FETCH_CAP // MiB} MiB"
    finally:
        sampling.set()
        sampler.join(5)
        for s in attackers:
            s.close()
    # The calls end with their connection: their done callbacks give the bytes back.
    wait_for(lambda: gauges(kit)["brook_request_budget_bytes"] == 0, LIVENESS_S,
             "the budget to be given back once the attacker went away")
    assert gauges(kit)["brook_fetch_clients_holding_bytes"] == 0


def test_kafka_fetches_never_read_are_dropped_after_the_idle_timeout(kit: Kit) -> None:
    port = int(kit.cluster.spec(1).kafka_port or 0)
    connections_before = gauges(kit)["brook_kafka_connections"]
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((ATTACKER, 0))
    with contextlib.closing(s):
        s.connect(("127.0.0.1", port))
        s.sendall(b"".join(kafka_fetch_frame(i) for i in range(KAFKA_FETCHES)))
        wait_for(lambda: gauges(kit)["brook_request_budget_bytes"] >= FETCH_CAP, LIVENESS_S,
                 "the attacker's Kafka answers to be held")
        held_within_the_share(kit, 1.0)
        assert read_partition_as_another_client(kit) > 0
        # It still has its socket open, and reads nothing: after connections.max.idle.ms without a byte
        # taken the broker drops the connection, its answers and the bytes they held.
        wait_for(lambda: gauges(kit)["brook_request_budget_bytes"] == 0, LIVENESS_S,
                 "the budget to be given back after the idle timeout")
        assert gauges(kit)["brook_kafka_connections"] == connections_before, gauges(kit)


def metadata_calls(kit: Kit) -> dict[str, float]:
    """brook_rpc_requests_total of BrokerService/Metadata by status code."""
    out: dict[str, float] = {}
    for line in kit.cluster.read_metrics(1).splitlines():
        if line.startswith("brook_rpc_requests_total{") and 'method="Metadata"' in line and \
                'service="brook.BrokerService"' in line:
            code = line.split('code="', 1)[1].split('"', 1)[0]
            out[code] = float(line.rsplit(" ", 1)[1])
    return out


def test_grpc_answers_never_read_count_as_in_flight_until_written(kit: Kit) -> None:
    port = int(kit.cluster.broker_address(1).rsplit(":", 1)[1])
    body = broker_pb2.MetadataRequest().SerializeToString()
    message = struct.pack(">BI", 0, len(body)) + body
    before = metadata_calls(kit)
    calls = 3 * IN_FLIGHT
    attackers = [never_reading_grpc_calls(port, IN_FLIGHT, "Metadata", message, window=0) for _ in range(3)]
    try:
        def handled() -> dict[str, float]:
            now = metadata_calls(kit)
            return {code: now.get(code, 0) - before.get(code, 0) for code in now}
        wait_for(lambda: sum(handled().values()) >= calls, LIVENESS_S, "every Metadata call to be handled")
        got = handled()
        assert got.get("OK", 0) <= IN_FLIGHT, f"answered {got} while none was read (bound {IN_FLIGHT})"
        assert got.get("RESOURCE_EXHAUSTED", 0) >= calls - IN_FLIGHT, got
        # Another address is not held up.
        assert read_partition_as_another_client(kit) > 0
    finally:
        for s in attackers:
            s.close()
    # Gone with their connection, the unread answers no longer count: the address is served again.
    after_first = metadata_calls(kit).get("OK", 0)

    def served_again() -> bool:
        with contextlib.closing(never_reading_grpc_calls(port, 1, "Metadata", message, window=0)):
            until = time.monotonic() + 2
            while time.monotonic() < until:
                if metadata_calls(kit).get("OK", 0) > after_first:
                    return True
                time.sleep(0.1)
        return False
    wait_for(served_again, LIVENESS_S, "the address's unread answers to be forgotten with their connections")


def test_requests_refused_while_handled_give_their_in_flight_count_back(kit: Kit) -> None:
    """The count is given back when the call ends, also for a call that ended in a refusal: here a
    second long poll past max.waiting.fetches.per.ip (1), refused RESOURCE_EXHAUSTED while handled,
    more times than max.inflight.requests.per.ip. Were a refused call's count kept, the address would
    then be refused nearly everything."""
    stub = kit.stub(1)
    poll = broker_pb2.FetchRequest(replica_id=-1, replica_epoch=-1, max_wait_ms=200, min_bytes=1, max_bytes=1 << 20)
    poll.partitions.add(topic="quiet", partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                        current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
    wanted, refused, pairs = IN_FLIGHT + 8, 0, 0
    # A pair refuses one of its polls when the second reaches the broker while the first waits (200 ms):
    # on a loaded machine a pair can miss that, and refuses none, so pairs are sent until enough were.
    while refused < wanted and pairs < 4 * wanted:
        pairs += 1
        calls = [stub.Fetch.future(poll, timeout=LIVENESS_S) for _ in range(2)]
        for c in calls:
            try:
                c.result()
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                refused += 1
    assert refused >= wanted, f"only {refused} of {pairs} pairs of polls refused one: the test did not test the refusal"
    # Refused calls kept theirs, the count would sit one below the bound (a call past it is refused
    # before it counts): calls side by side show the slots are all free.
    side_by_side = [stub.Metadata.future(broker_pb2.MetadataRequest(), timeout=LIVENESS_S) for _ in range(8)]
    for c in side_by_side:
        assert c.result() is not None
