"""A hostile client against a local 3-node mTLS cluster (real processes, real sockets).

Each attack of issue 10 is tried and must do no harm: plaintext or foreign-CA or
expired-certificate clients cannot connect; a forged RegisterBroker / heartbeat /
replica fetch with a valid *client* certificate (or another node's) is refused with
CLUSTER_AUTHORIZATION_FAILED and changes nothing; certificate files replaced on a
running node are served without a restart. The authorised path (produce, consume
with a group, admin) works over mTLS.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.security import SecurityConfig, make_channel
from deploy.local.certs import CertificateAuthority
from deploy.local.cluster import LocalCluster
from proto import broker_pb2, broker_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc, errors
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

RPC_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = LocalCluster(tmp_path_factory.mktemp("tls-cluster"), nodes=3, tls=True)
    try:
        c.start()
        c.wait_ready(timeout_s=120)
        yield c
    finally:
        c.stop(timeout_s=20)
        c.teardown()


def _kw(c: LocalCluster) -> dict[str, str]:
    return {k.replace(".", "_"): v for k, v in c.client_config.items()}


def _controller_stub(c: LocalCluster, security: SecurityConfig | None) -> controller_pb2_grpc.ControllerServiceStub:
    host, port = c.controller_endpoints[0]
    return controller_pb2_grpc.ControllerServiceStub(make_channel(f"localhost:{port}", security))


def _active_controller(c: LocalCluster, security: SecurityConfig) -> controller_pb2_grpc.ControllerServiceStub:
    """A stub on the active controller (the one that answers DescribeCluster)."""
    def find():
        for _, port in c.controller_endpoints:
            stub = controller_pb2_grpc.ControllerServiceStub(make_channel(f"localhost:{port}", security))
            resp = stub.DescribeCluster(controller_pb2.DescribeClusterRequest(), timeout=RPC_TIMEOUT_S)
            if resp.error_code == ErrorCode.NONE:
                return stub
        return None
    return wait_for(find, 60, "an active controller")


def _broker_record(c: LocalCluster, node_id: int) -> controller_pb2.BrokerRecord:
    for b in c.describe_cluster(timeout_s=RPC_TIMEOUT_S).brokers:
        if b.node_id == node_id:
            return b
    raise AssertionError(f"broker {node_id} not registered")


def _other_ca_client(tmp: Path) -> SecurityConfig:
    rogue = CertificateAuthority.create(tmp / "rogue")
    files = rogue.issue(tmp / "rogue", "node-3", hosts=(), server=False)  # claims to be node 3
    return SecurityConfig(protocol="SSL", ssl_ca_location=None, ssl_certificate_location=str(files.cert),
                          ssl_key_location=str(files.key))


def _unreachable(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


# ----------------------------------------------------------------------------- transport


def test_plaintext_client_is_refused_on_every_listener(cluster: LocalCluster) -> None:
    n = cluster.spec(1)
    for port in (n.broker_port, n.controller_port):
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        code = _unreachable(lambda ch=ch: broker_pb2_grpc.BrokerServiceStub(ch).Metadata(
            broker_pb2.MetadataRequest(all_topics=True), timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE


def test_unauthenticated_admin_cannot_delete_a_topic(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        admin.create_topics([NewTopic("precious", 1, 3)])
    plaintext = Admin(cluster.bootstrap_servers, request_timeout_ms=3000,
                      controller_endpoints=cluster.controller_endpoints)
    try:
        with pytest.raises(errors.BrookError):
            plaintext.delete_topics(["precious"])
    finally:
        plaintext.close()
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        assert "precious" in admin.list_topics()


def test_client_certificate_from_another_ca_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    rogue = _other_ca_client(tmp_path)
    # Trust the real CA for the server side, present the rogue client certificate.
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(cluster.client_cert().ca),
                         ssl_certificate_location=rogue.ssl_certificate_location,
                         ssl_key_location=rogue.ssl_key_location)
    stub = _controller_stub(cluster, sec)
    code = _unreachable(lambda: stub.RegisterBroker(controller_pb2.RegisterBrokerRequest(node_id=3), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE


def _kafka_authentication_failures(cluster: LocalCluster, node_id: int) -> float:
    ctx = ssl.create_default_context(cafile=str(cluster.client_cert().ca))
    ctx.load_cert_chain(str(cluster.client_cert().cert), str(cluster.client_cert().key))
    body = urllib.request.urlopen(cluster.metrics_url(node_id).replace("127.0.0.1", "localhost"), timeout=10,
                                  context=ctx).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("brook_kafka_authentication_failures_total"))


def test_a_refused_client_certificate_on_the_kafka_listener_is_logged_and_counted(cluster: LocalCluster,
                                                                                    tmp_path: Path) -> None:
    """A Kafka client whose certificate the listener does not trust, or that has none, was closed without a
    trace: no line in the node's log, brook_kafka_authentication_failures_total unchanged (Go clients audit).
    Kafka logs "Failed authentication with /127.0.0.1 (SSL handshake failed)" and counts it."""
    rogue = _other_ca_client(tmp_path)
    node = cluster.broker_ids[0]
    host, port = cluster.kafka_address(node).rsplit(":", 1)
    before = _kafka_authentication_failures(cluster, node)
    for cert in ((rogue.ssl_certificate_location, rogue.ssl_key_location), None):
        ctx = ssl.create_default_context(cafile=str(cluster.client_cert().ca))
        ctx.check_hostname = False
        if cert is not None:
            ctx.load_cert_chain(*cert)
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            try:  # TLS 1.3: the refusal may come with the first read after the client's side of the handshake
                with ctx.wrap_socket(raw) as s:
                    s.sendall(b"\0\0\0\0")
                    s.recv(1)
            except (ssl.SSLError, ConnectionError):
                pass
    wait_for(lambda: _kafka_authentication_failures(cluster, node) >= before + 2, 30,
             lambda: f"two failures counted (before {before}, now {_kafka_authentication_failures(cluster, node)})")
    wait_for(lambda: "TLS handshake with 127.0.0.1 failed" in cluster.node_log(node).read_text(), 30,
             "the node's log to say why the handshake failed")


def test_a_client_that_does_not_trust_the_brokers_certificate_fails_at_once(cluster: LocalCluster,
                                                                            tmp_path: Path) -> None:
    """As Kafka's clients fail with SslAuthenticationException (KIP-152): the same handshake would fail again.
    Before, the producer retried until max.block.ms and then named only a NETWORK_EXCEPTION, the admin client
    until its request timeout, and the consumer's poll() returned nothing, without an error, for as long as it
    was called."""
    other = CertificateAuthority.create(tmp_path / "other", "another CA")
    mine = cluster.client_cert()  # a client certificate the brokers trust; its side is not the problem
    wrong_ca = {**_kw(cluster), "ssl_ca_location": str(other.path)}
    with Producer(bootstrap_servers=cluster.bootstrap_servers, max_block_ms=60_000, **{
            k: v for k, v in wrong_ca.items() if k != "bootstrap_servers"}) as producer:
        with pytest.raises(errors.SslAuthenticationError, match="ssl.ca.location"):
            producer.send("any-topic", b"x")
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(other.path), ssl_certificate_location=str(mine.cert),
                         ssl_key_location=str(mine.key))
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=sec) as admin:
        with pytest.raises(errors.SslAuthenticationError):
            admin.list_topics()
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="wrong-ca", **{
            k: v for k, v in wrong_ca.items() if k != "bootstrap_servers"}) as consumer:
        consumer.subscribe(["any-topic"])
        with pytest.raises(errors.SslAuthenticationError):
            consumer.poll(timeout_ms=60_000)


def test_expired_client_certificate_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    ca = CertificateAuthority.load(cluster.tls_dir)
    now = datetime.datetime.now(datetime.UTC)
    files = ca.issue(tmp_path, "admin", hosts=(), server=False, not_before=now - datetime.timedelta(days=30),
                     not_after=now - datetime.timedelta(days=1))
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(files.ca), ssl_certificate_location=str(files.cert),
                         ssl_key_location=str(files.key))
    ch = make_channel(cluster.broker_address(1).replace("127.0.0.1", "localhost"), sec)
    code = _unreachable(lambda: broker_pb2_grpc.BrokerServiceStub(ch).Metadata(
        broker_pb2.MetadataRequest(all_topics=True), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_metrics_are_https_only(cluster: LocalCluster) -> None:
    url = cluster.metrics_url(1)
    assert url.startswith("https://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(url.replace("https://", "http://"), timeout=5).read()
    ctx = ssl.create_default_context(cafile=str(cluster.client_cert().ca))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):  # a client certificate is required
        urllib.request.urlopen(url.replace("127.0.0.1", "localhost"), timeout=10, context=ctx).read()
    ctx.load_cert_chain(str(cluster.client_cert().cert), str(cluster.client_cert().key))
    body = urllib.request.urlopen(url.replace("127.0.0.1", "localhost"), timeout=10, context=ctx).read()
    assert b"brook_" in body


# ----------------------------------------------------------------------------- identity


def test_forged_register_broker_is_refused_and_broker_3_stays_unfenced(cluster: LocalCluster) -> None:
    before = _broker_record(cluster, 3)
    forged = controller_pb2.RegisterBrokerRequest(
        node_id=3, incarnation_id="f" * 32, cluster_id=cluster.state.cluster_id,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="203.0.113.7", port=9092)])
    node1 = cluster.node_cert(1)
    as_node1 = SecurityConfig(protocol="SSL", ssl_ca_location=str(node1.ca), ssl_certificate_location=str(node1.cert),
                              ssl_key_location=str(node1.key))
    for who in (cluster.security, as_node1):  # a client certificate, and another node's certificate
        stub = _active_controller(cluster, who)
        for _ in range(5):  # the issue's attack repeated it to keep broker 3 fenced
            resp = stub.RegisterBroker(forged, timeout=RPC_TIMEOUT_S)
            assert resp.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, resp
        hb = stub.BrokerHeartbeat(controller_pb2.BrokerHeartbeatRequest(
            node_id=3, broker_epoch=before.broker_epoch, want_shutdown=True), timeout=RPC_TIMEOUT_S)
        assert hb.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, hb
        alter = stub.AlterPartition(controller_pb2.AlterPartitionRequest(
            broker_id=3, broker_epoch=before.broker_epoch), timeout=RPC_TIMEOUT_S)
        assert alter.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, alter
    after = _broker_record(cluster, 3)
    assert not after.fenced and not after.in_controlled_shutdown
    assert (after.incarnation_id, after.broker_epoch) == (before.incarnation_id, before.broker_epoch)
    assert [(e.host, e.port) for e in after.endpoints] == [(e.host, e.port) for e in before.endpoints]


def test_forged_replica_fetch_is_refused(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        admin.create_topics([NewTopic("replicated", 1, 3)])
        meta = wait_for(lambda: admin.describe_topics(["replicated"]).get("replicated"), 60, "topic metadata")
        leader = wait_for(lambda: admin.describe_topics(["replicated"])["replicated"].partitions[0].leader >= 0
                          and admin.describe_topics(["replicated"])["replicated"].partitions[0].leader, 60,
                          "a leader")
    assert meta is not None
    follower = next(b for b in cluster.broker_ids if b != leader)
    ch = make_channel(f"localhost:{cluster.spec(leader).broker_port}", cluster.security)
    req = broker_pb2.FetchRequest(replica_id=follower, replica_epoch=_broker_record(cluster, follower).broker_epoch,
                                  max_wait_ms=0, max_bytes=1 << 20, partitions=[broker_pb2.FetchPartition(
                                      topic="replicated", partition=0, fetch_offset=1_000_000,
                                      partition_max_bytes=1 << 20, current_leader_epoch=-1,
                                      last_fetched_epoch=-1)])
    resp = broker_pb2_grpc.BrokerServiceStub(ch).Fetch(req, timeout=RPC_TIMEOUT_S)
    assert [p.error_code for p in resp.partitions] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    # The followers' fetch stream is refused before its first message is read: a client's certificate
    # is not a node's.
    with pytest.raises(grpc.RpcError) as info:
        list(broker_pb2_grpc.BrokerServiceStub(ch).ReplicaFetch(iter([req]), timeout=RPC_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, info.value
    assert "ReplicaFetch streams are for the cluster's nodes" in (info.value.details() or "")
    # A node's certificate opens one, and each message is checked: a node acting as another (the
    # third node claiming to be the follower) is refused, the stream stays usable, and a consumer
    # fetch (replica_id -1) has no place on it.
    third = next(b for b in cluster.broker_ids if b not in (leader, follower))
    as_third = make_channel(f"localhost:{cluster.spec(leader).broker_port}",
                            SecurityConfig.from_config(cluster.client_config_for(f"node-{third}")))
    consumer_req = broker_pb2.FetchRequest()
    consumer_req.CopyFrom(req)
    consumer_req.replica_id, consumer_req.replica_epoch = -1, -1
    answers = list(broker_pb2_grpc.BrokerServiceStub(as_third).ReplicaFetch(iter([req, consumer_req, req]),
                                                                            timeout=RPC_TIMEOUT_S))
    assert [[p.error_code for p in a.partitions] for a in answers] == [
        [ErrorCode.CLUSTER_AUTHORIZATION_FAILED], [ErrorCode.INVALID_REQUEST],
        [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]], answers
    # A consumer fetch (replica_id -1) with the same certificate is fine.
    req.replica_id, req.replica_epoch = -1, -1
    req.partitions[0].fetch_offset = 0
    resp = broker_pb2_grpc.BrokerServiceStub(ch).Fetch(req, timeout=RPC_TIMEOUT_S)
    assert resp.partitions[0].error_code == ErrorCode.NONE, resp


# ----------------------------------------------------------------------------- the authorised path


def test_produce_consume_and_group_over_mtls(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        admin.create_topics([NewTopic("secure-orders", 2, 3, configs={"min.insync.replicas": "2"})])
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", **_kw(cluster))
    try:
        for i in range(50):
            producer.send("secure-orders", f"order-{i}".encode(), key=str(i).encode())
        producer.flush(60)
    finally:
        producer.close()
    consumer = Consumer("secure-orders", bootstrap_servers=cluster.bootstrap_servers, group_id="billing",
                        auto_offset_reset="earliest", enable_auto_commit=False, **_kw(cluster))
    seen: set[bytes] = set()
    try:
        deadline = time.monotonic() + 90
        while len(seen) < 50 and time.monotonic() < deadline:
            for records in consumer.poll(1000).values():
                seen.update(r.value for r in records)
        consumer.commit()
    finally:
        consumer.close()
    assert seen == {f"order-{i}".encode() for i in range(50)}
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        offsets = admin.describe_groups(["billing"])["billing"].offsets
    assert sum(o.committed_offset for o in offsets.values()) == 50


# ----------------------------------------------------------------------------- rotation


def _served_certificate(port: int, client: SecurityConfig) -> x509.Certificate:
    ctx = ssl.create_default_context(cafile=client.ssl_ca_location)
    ctx.load_cert_chain(client.ssl_certificate_location or "", client.ssl_key_location)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_replaced_certificate_is_served_without_restart(cluster: LocalCluster) -> None:
    port = cluster.spec(2).broker_port
    assert port is not None
    pid = cluster.pid(2)
    old = _served_certificate(port, cluster.security)
    ca = CertificateAuthority.load(cluster.tls_dir)
    ca.issue(cluster.tls_dir, "node-2", hosts=("localhost", "127.0.0.1"))  # atomic replace of both files
    new = x509.load_pem_x509_certificate(cluster.node_cert(2).cert.read_bytes())
    assert new.serial_number != old.serial_number
    wait_for(lambda: _served_certificate(port, cluster.security).serial_number == new.serial_number, 30,
             "the new certificate on a new connection")
    assert cluster.pid(2) == pid  # same process: no restart
    cluster.wait_ready(timeout_s=60)  # and the cluster is still whole over the rotated certificate


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    tmp.replace(path)


def test_removing_a_ca_from_the_bundle_closes_its_clients_open_connections(cluster: LocalCluster,
                                                                             tmp_path: Path) -> None:
    """Revocation by CA rotation (the README's way) reaches the connections already open, on the gRPC and Kafka
    listeners alike, while the nodes (another CA) go on replicating. Before, a revoked client kept producing for
    as long as it kept its connections."""
    from confluent_kafka import Producer as RdProducer
    from opskit import sample_values

    bundle = cluster.tls_dir / "ca.pem"  # every node's ssl.ca.location
    original = bundle.read_bytes()
    node_ca = tmp_path / "node-ca.pem"  # what carol checks the brokers' certificates against
    node_ca.write_bytes(original)
    clients = CertificateAuthority.create(tmp_path / "clients", "Clients CA")
    carol = clients.issue(tmp_path / "carol", "carol", hosts=(), server=False)
    conf = {"security_protocol": "SSL", "ssl_ca_location": str(node_ca), "ssl_certificate_location": str(carol.cert),
            "ssl_key_location": str(carol.key)}
    topic = "revoked-ca"
    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, configs={"min.insync.replicas": "2"})])

    def revoked_total() -> float:
        return sum(sum(sample_values(cluster.read_metrics(n), "brook_tls_connections_revoked_total"))
                   for n in cluster.broker_ids)

    before = revoked_total()
    _replace(bundle, original + clients.path.read_bytes())
    rd_errors: list[object] = []
    rd = RdProducer({"bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SSL",
                     "ssl.ca.location": str(node_ca), "ssl.certificate.location": str(carol.cert),
                     "ssl.key.location": str(carol.key), "acks": "all", "message.timeout.ms": 8000,
                     "reconnect.backoff.ms": 200, "log_level": 0})
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", request_timeout_ms=5000,
                        delivery_timeout_ms=8000, **conf)
    try:
        wait_for(lambda: _sent(producer, topic, b"before"), 30, "carol (the clients' CA) to produce over gRPC")
        rd.produce(topic, b"kafka-before", on_delivery=lambda err, _m: rd_errors.append(err))
        assert rd.flush(30) == 0 and rd_errors == [None], rd_errors

        _replace(bundle, original)  # the clients' CA is out: carol is revoked

        # Her open gRPC connection is refused at its first request after the nodes look at the bundle (once a
        # second), and her reconnection fails its handshake.
        sent_after: list[bytes] = []

        def refused() -> bool:
            value = f"after-{len(sent_after)}".encode()
            if _sent(producer, topic, value):
                sent_after.append(value)
                return False
            return True
        wait_for(refused, 60, "carol's producer to be refused")

        def rd_refused() -> bool:
            rd.produce(topic, b"kafka-after", on_delivery=lambda err, _m: rd_errors.append(err))
            rd.flush(15)
            return rd_errors[-1] is not None
        wait_for(rd_refused, 60, "carol's librdkafka producer to be refused")
        wait_for(lambda: revoked_total() >= before + 2, 30,
                 lambda: f"brook_tls_connections_revoked_total to count her two connections (was {before}, "
                         f"now {revoked_total()})")

        # The nodes' certificates (the other CA) are untouched: replication and the operator's client go on.
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", **_kw(cluster)) as admin_producer:
            admin_producer.send(topic, b"operator").get(60)
        cluster.wait_ready(timeout_s=60)
    finally:
        producer.close()
        rd.flush(0)
        _replace(bundle, original)


def _sent(producer: Producer, topic: str, value: bytes) -> bool:
    try:
        producer.send(topic, value).get(30)
        return True
    except errors.BrookError:
        return False


# ----------------------------------------------------------------------------- the controller's workers


def _metric(c: LocalCluster, node_id: int, name: str) -> float:
    for line in c.read_metrics(node_id).splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return float(value)
    raise AssertionError(f"node {node_id} exports no {name}")


def test_a_client_holding_the_controllers_workers_cannot_get_a_broker_fenced(cluster: LocalCluster) -> None:
    """Six addresses with an ordinary client certificate, each at its 16 messages being received and
    never finished (calls opened again as the controller cancels them after 5 s), held all 96 workers of
    the active controller: brokers could not heartbeat and were fenced after 6 s. The controller keeps
    16 workers for the nodes (metadata_quorum/node.py RESERVED_FOR_NODES)."""
    pytest.importorskip("h2.connection")
    from h2client import H2Sender

    from metadata_quorum.node import GRPC_MAX_WORKERS, RECEIVING_PER_CLIENT, RESERVED_FOR_NODES

    with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000, security=cluster.security) as admin:
        admin.create_topics([NewTopic("under-controller-attack", 1, 3)])
    active = wait_for(lambda: next((n for n in cluster.node_ids if _metric(cluster, n, "brook_controller_active")), None),
                      60, "an active controller")
    cert = cluster.client_cert()  # User:admin: a client (no authorizer, so no super user either)
    tls = ssl.create_default_context(cafile=str(cert.ca))
    tls.load_cert_chain(str(cert.cert), str(cert.key))
    tls.check_hostname = False
    port = cluster.spec(active).controller_port
    attackers = [H2Sender(port, "/brook.ControllerService/CreateTopics", RECEIVING_PER_CLIENT, 1000,
                          source=f"127.0.0.{i}", tls=tls) for i in range(2, 8)]

    def hold() -> None:
        for a in attackers:
            a.push(0.001)
            a.refill()
    try:
        clients_share = GRPC_MAX_WORKERS - RESERVED_FOR_NODES
        wait_for(lambda: hold() or _metric(cluster, active, "brook_controller_calls_served") >= clients_share, 60,
                 lambda: f"the attacker to hold the clients' {clients_share} workers: "
                         f"{_metric(cluster, active, 'brook_controller_calls_served')} served")
        fenced: list[float] = []
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", **_kw(cluster)) as producer:
            futures = []
            now = time.monotonic()
            until, sample = now + 15.0, now  # twice a broker's session (6 s) and more
            while now < until:
                hold()
                futures.append(producer.send("under-controller-attack", b"%d" % len(futures)))
                if now >= sample:
                    fenced.append(_metric(cluster, active, "brook_fenced_brokers"))
                    sample = now + 0.5
                now = time.monotonic()
            producer.flush(60)
            offsets = {f.get(timeout=60).offset for f in futures}
        assert max(fenced) == 0, f"brokers fenced while the attacker held the controller: {fenced}"
        assert len(offsets) == len(futures), "every write under the attack is acknowledged, once"
        assert _metric(cluster, active, "brook_controller_client_calls_refused_total") > 0, \
            "no call of the attacker was refused: the test did not reach the bound"
    finally:
        for a in attackers:
            a.close()
