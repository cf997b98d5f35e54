"""The replication listener (broker/replication_listener.py) on a real mTLS cluster of three brokers.

Followers of the local launcher's brokers fetch through it, not through the gRPC ``ReplicaFetch`` stream;
it must speak only to nodes, read nothing from anyone else, close a connection whose frames break the
protocol, and keep replicating for the real followers whatever a hostile connection sends. A follower that
cannot reach a leader's listener replicates over the gRPC stream instead.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opskit import client_security, describe, produce_acked, read_values, sample_values
from sockets import read_exactly
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.producer import Producer
from deploy.local.certs import CertFiles
from deploy.local.cluster import LOCAL_DEFAULTS, LocalCluster, NodeSpec
from proto import broker_pb2, controller_pb2
from proto.errors import ErrorCode
from replication.fetcher import REPLICATION_MAGIC

pytestmark = pytest.mark.slow

TOPIC = "through-the-replication-listener"
FRAME = struct.Struct(">I")


# Short enough to be seen in a test, long enough for every real wait of a loaded machine.
RECEIVE_TIMEOUT_S = 3
IDLE_S = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("replication")) / "cluster", nodes=3, tls=True, overrides={
            "request.receive.timeout.ms": str(RECEIVE_TIMEOUT_S * 1000),
            "connections.max.idle.ms": str(IDLE_S * 1000)}) as c:
        with Admin(c.bootstrap_servers, security=c.security) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 3)])
        yield c


def _metric(cluster: LocalCluster, node: int, name: str) -> float:
    values = sample_values(cluster.read_metrics(node), name)
    assert len(values) == 1, f"{name} on node {node}: {describe(values)}"
    return values[0]


def _connect(cluster: LocalCluster, node: int, cert: CertFiles | None) -> ssl.SSLSocket:
    """A TLS connection to ``node``'s replication listener, showing ``cert`` (none: no certificate)."""
    ctx = ssl.create_default_context(cafile=str(cluster.client_cert().ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    port = cluster.spec(node).replication_port
    assert port, "the launcher gives every broker a replication listener"
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _closed_by_broker(s: ssl.SSLSocket) -> bool:
    """Whether the broker ends the connection (rather than answering or waiting)."""
    try:
        return s.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def _leader(cluster: LocalCluster) -> int:
    with Admin(cluster.bootstrap_servers, security=cluster.security) as admin:
        return admin.describe_topics([TOPIC])[TOPIC].partitions[0].leader


def test_followers_replicate_through_it(cluster: LocalCluster) -> None:
    values = [b"r-%03d" % i for i in range(50)]
    produce_acked(cluster, TOPIC, values)  # acks=all: both followers fetched and acknowledged each one
    leader = _leader(cluster)
    assert _metric(cluster, leader, "brook_replication_fetches_total") > 0
    assert _metric(cluster, leader, "brook_replication_connections") >= 2, "one connection per follower"
    assert read_values(cluster, TOPIC, len(values)) == values


def test_a_client_certificate_is_refused_before_anything_is_read(cluster: LocalCluster) -> None:
    refused = _metric(cluster, 1, "brook_replication_connections_refused_total")
    with _connect(cluster, 1, cluster.client_cert()) as s:
        s.sendall(REPLICATION_MAGIC + FRAME.pack(10) + b"x" * 10)
        assert _closed_by_broker(s), "a client's certificate must not open a replication session"
    wait_for(lambda: _metric(cluster, 1, "brook_replication_connections_refused_total") > refused, 10,
             "the refusal to be counted")


def test_a_connection_without_a_certificate_fails_its_handshake(cluster: LocalCluster) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        with _connect(cluster, 1, None) as s:
            s.sendall(REPLICATION_MAGIC)
            if not _closed_by_broker(s):
                raise AssertionError("a connection without a certificate was served")
            raise ConnectionError("closed")


@pytest.mark.parametrize("sent, why", [
    (b"GET / HTTP/1.1\r\n\r\n", "not the magic"),
    (REPLICATION_MAGIC + FRAME.pack(0xFFFF_FFFF), "a 4 GiB frame"),
    (REPLICATION_MAGIC + FRAME.pack(6) + b"\xff\xff\xff\xff\xff\xff", "not a FetchRequest"),
])
def test_a_node_connection_breaking_the_protocol_is_closed(cluster: LocalCluster, sent: bytes, why: str) -> None:
    broken = _metric(cluster, 1, "brook_replication_connections_broken_total")
    with _connect(cluster, 1, cluster.node_cert(2)) as s:
        s.sendall(sent)
        assert _closed_by_broker(s), f"{why}: the connection stayed open"
    wait_for(lambda: _metric(cluster, 1, "brook_replication_connections_broken_total") > broken, 10,
             f"{why}: the closing to be counted")
    produce_acked(cluster, TOPIC, [b"still-replicating"])  # the real followers are unaffected


def test_a_node_may_fetch_only_as_itself(cluster: LocalCluster) -> None:
    leader = _leader(cluster)
    impostor = next(n for n in (1, 2, 3) if n != leader)
    victim = next(n for n in (1, 2, 3) if n not in (leader, impostor))
    request = broker_pb2.FetchRequest(replica_id=victim, max_wait_ms=0, max_bytes=1 << 20, partitions=[
        broker_pb2.FetchPartition(topic=TOPIC, partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                  current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])
    data = request.SerializeToString()
    with _connect(cluster, leader, cluster.node_cert(impostor)) as s:
        s.sendall(REPLICATION_MAGIC + FRAME.pack(len(data)) + data)
        (size,) = FRAME.unpack(read_exactly(s, FRAME.size))
        response = broker_pb2.FetchResponse.FromString(read_exactly(s, size))
    assert [p.error_code for p in response.partitions] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED], response
    assert not any(p.records for p in response.partitions)


@pytest.mark.parametrize("sent, limit_s, why", [
    (REPLICATION_MAGIC[:2], RECEIVE_TIMEOUT_S, "half the magic"),
    (REPLICATION_MAGIC + FRAME.pack(100) + b"\x00" * 10, RECEIVE_TIMEOUT_S, "a frame begun and not finished"),
    (REPLICATION_MAGIC, IDLE_S, "a connection silent after the magic"),
])
def test_a_node_connection_that_stalls_is_closed_at_its_timeout(cluster: LocalCluster, sent: bytes, limit_s: float,
                                                               why: str) -> None:
    """A peer holding a connection slot without sending is closed when its wait's timeout passes (the
    frame's rest: request.receive.timeout.ms; the next frame: connections.max.idle.ms), not before, while
    the real followers' connections, busy all along, stay open."""
    with _connect(cluster, 1, cluster.node_cert(2)) as s:
        s.settimeout(limit_s + 30)
        s.sendall(sent)
        start = time.monotonic()
        closed = _closed_by_broker(s)
        waited = time.monotonic() - start
    assert closed, f"{why}: still open after {waited:.1f} s"
    assert waited >= limit_s - 0.5, f"{why}: closed after {waited:.1f} s, before its {limit_s} s timeout"
    produce_acked(cluster, TOPIC, [b"still-replicating"])


def test_a_node_connection_that_reads_none_of_its_answers_is_closed_after_the_idle_time(
        cluster: LocalCluster) -> None:
    """A peer that sends fetches and never reads what they answer fills the sockets' buffers: the answer being
    written waits on it. It holds a connection slot and the answers' memory, so it is closed when nothing of an
    answer was taken for connections.max.idle.ms, and the real followers keep replicating."""
    topic = "answers-never-read"
    with Admin(cluster.bootstrap_servers, security=cluster.security) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=5,
                  **client_security(cluster)) as producer:
        for i in range(1100):
            producer.send(topic, b"%05d" % i + b"v" * 995)
        producer.flush(timeout=60)
    with Admin(cluster.bootstrap_servers, security=cluster.security) as admin:
        leader = admin.describe_topics([topic])[topic].partitions[0].leader
        fetcher = next(n for n in (1, 2, 3) if n != leader)
        # As that follower, under its registration: the leader answers its fetches with records.
        brokers = admin._call("DescribeCluster", controller_pb2.DescribeClusterRequest()).brokers
        epoch = next(b.broker_epoch for b in brokers if b.node_id == fetcher)
    from_start = broker_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                           current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
    request = broker_pb2.FetchRequest(replica_id=fetcher, replica_epoch=epoch, max_wait_ms=0, max_bytes=1 << 20,
                                      partitions=[from_start])
    data = request.SerializeToString()
    answers = 40  # about 1 MiB each: far more than the two sockets' buffers hold
    before = _metric(cluster, leader, "brook_replication_connections")
    with _connect(cluster, leader, cluster.node_cert(fetcher)) as s:
        s.sendall(REPLICATION_MAGIC + (FRAME.pack(len(data)) + data) * answers)
        start = time.monotonic()
        wait_for(lambda: _metric(cluster, leader, "brook_replication_connections") > before, 10,
                 "the connection to be counted")
        wait_for(lambda: _metric(cluster, leader, "brook_replication_connections") <= before, IDLE_S + 30,
                 lambda: f"the connection closed: {_metric(cluster, leader, 'brook_replication_connections')} open",
                 poll_s=0.2)
        waited = time.monotonic() - start
        received = 0
        s.settimeout(10)
        try:
            while chunk := s.recv(1 << 20):
                received += len(chunk)
        except (ConnectionError, ssl.SSLError):
            pass
    assert waited >= IDLE_S - 0.5, f"closed after {waited:.1f} s, before connections.max.idle.ms ({IDLE_S} s)"
    assert received < answers << 20, f"all {received} bytes of the answers came: the connection was never stalled"
    produce_acked(cluster, TOPIC, [b"still-replicating"])


def test_brokers_with_and_without_it_replicate_together(tmp_path: Path) -> None:
    """A rolling upgrade: broker 3 has no replication listener (an older version, or not configured), so its
    followers fetch from it over gRPC while the others' followers use the listeners; every partition takes
    acks=all writes and reads them back."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=3)
    cluster.spec(3).replication_port = None
    with cluster:
        with Admin(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(f"mixed-{leader}", replica_assignments=[[leader, *others]])
                                 for leader, others in ((1, (2, 3)), (2, (3, 1)), (3, (1, 2)))])
        for leader in (1, 2, 3):
            values = [b"%d-%02d" % (leader, i) for i in range(20)]
            produce_acked(cluster, f"mixed-{leader}", values)
            assert read_values(cluster, f"mixed-{leader}", len(values)) == values
        assert sample_values(cluster.read_metrics(3), "brook_replication_fetches_total") == [], \
            "broker 3 has no replication listener"
        for leader in (1, 2):
            assert _metric(cluster, leader, "brook_replication_fetches_total") > 0


class _AdvertisesAClosedReplicationPort(LocalCluster):
    """A cluster whose broker ``node`` registers its REPLICATION listener at ``port``, where nothing listens
    (a wrong advertised address, or a port the network does not open between brokers): the listener itself
    runs on its own port, which no follower is told of."""

    def __init__(self, base_dir: Path, node: int, port: int) -> None:
        super().__init__(base_dir, nodes=3, tls=True)
        self.closed_node, self.closed_port = node, port

    def _write_config(self, n: NodeSpec) -> Path:
        path = super()._write_config(n)
        if n.node_id == self.closed_node:
            with path.open("a") as f:
                f.write(f'"advertised.listeners" = {json.dumps(f"REPLICATION://127.0.0.1:{self.closed_port}")}\n')
        return path


def test_followers_that_cannot_reach_the_listener_replicate_over_grpc(tmp_path: Path) -> None:
    """Broker 1's registered replication endpoint refuses connections: its followers fall back to the gRPC
    stream, so acks=all writes with min.insync.replicas=2 are acknowledged at once and both followers stay in
    the ISR of broker 1's partition. Before the fallback its followers never fetched: each write waited until
    broker 1 dropped them from the ISR (replica.lag.time.max.ms) and the controller, refusing an ISR below
    min.insync.replicas, moved the leadership away from it."""
    closed = socket.socket()  # bound, never listening: every connection to it is refused
    closed.bind(("127.0.0.1", 0))
    topic = "listener-unreachable"
    try:
        with _AdvertisesAClosedReplicationPort(tmp_path / "cluster", 1, closed.getsockname()[1]) as cluster:
            with Admin(cluster.bootstrap_servers, security=cluster.security) as admin:
                admin.create_topics([NewTopic(topic, configs={"min.insync.replicas": "2"},
                                              replica_assignments=[[1, 2, 3]])])
            values = [b"v-%02d" % i for i in range(20)]
            started = time.monotonic()
            produce_acked(cluster, topic, values)
            took_s, lag_max_s = time.monotonic() - started, int(LOCAL_DEFAULTS["replica.lag.time.max.ms"]) / 1000
            assert took_s < lag_max_s, f"{len(values)} acks=all writes took {took_s:.1f} s: the followers did " \
                                       f"not fetch until the ISR shrank ({lag_max_s:g} s)"
            assert read_values(cluster, topic, len(values)) == values
            with Admin(cluster.bootstrap_servers, security=cluster.security) as admin:
                partition = admin.describe_topics([topic])[topic].partitions[0]
            assert (partition.leader, partition.leader_epoch) == (1, 0), \
                f"the leadership moved away from broker 1 (its followers were out of sync): {partition}"
            assert sorted(partition.isr) == [1, 2, 3], partition
            assert _metric(cluster, 1, "brook_replication_fetches_total") == 0, \
                "no follower reached broker 1's listener: they fetched over gRPC"
            for follower in (2, 3):
                wait_for(lambda n=follower: _metric(cluster, n, "brook_replication_listener_fallbacks_total") >= 1,
                         10, f"node {follower}'s fallback counted")
                assert _metric(cluster, follower, "brook_replication_listener_fallbacks_total") == 1
                warnings = [line for line in cluster.node_log(follower).read_text().splitlines()
                            if "cannot fetch from leader 1's replication listener" in line]
                assert len(warnings) == 1, f"node {follower}: {warnings}"
    finally:
        closed.close()
