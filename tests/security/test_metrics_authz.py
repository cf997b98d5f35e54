"""/metrics names every topic, partition and consumer group, with offsets, sizes and lags. With an authorizer it
is for callers allowed DESCRIBE on the cluster (as the console, and as Kafka's DescribeLogDirs and ListGroups of
every group), and the local launcher requires a client certificate for it as on every other listener. Before,
any caller, even one without a certificate, read the whole page (an audit: User:demo, allowed demo-* topics
only, saw brook_topic_messages_in_total{topic="secret"})."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from waiting import wait_for

from client.admin import Admin
from deploy.local.cluster import LocalCluster
from metadata_quorum.security import acl_binding

pytestmark = pytest.mark.slow

T = 60


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("metrics-authz"), nodes=1, tls=True, authorizer=True) as cluster:
        cluster.wait_ready(timeout_s=120)
        yield cluster


def scrape(node: LocalCluster, who: str | None) -> tuple[int, str]:
    """(HTTP status, body) of node 1's /metrics as the certificate ``DIR/tls/<who>.pem`` (None: no certificate)."""
    d = node.tls_dir
    context = ssl.create_default_context(cafile=str(d / "ca.pem"))
    if who is not None:
        context.load_cert_chain(str(d / f"{who}.pem"), str(d / f"{who}.key"))
    try:
        with urllib.request.urlopen(node.metrics_url(1), timeout=10, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_need_describe_on_the_cluster(node: LocalCluster) -> None:
    with Admin(node.bootstrap_servers, security=node.security, request_timeout_ms=T * 1000,
               controller_endpoints=node.controller_endpoints) as admin:
        admin.create_topic("hidden-orders", 1, 1)
        wait_for(lambda: 'topic="hidden-orders"' in node.read_metrics(1), T, "the topic in the operator's /metrics")

        # User:demo may use demo-* topics and groups only: not the page that names every topic.
        status, body = scrape(node, "demo")
        assert status == 403, body[:300]
        assert "hidden-orders" not in body and "brook_" not in body

        # No certificate at all: the TLS handshake is refused (a client certificate is required).
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            scrape(node, None)

        # Once the operator allows DESCRIBE on the cluster, the same certificate reads the page.
        admin.create_acls([acl_binding(["CLUSTER", "kafka-cluster", "LITERAL", "User:demo", "*", "DESCRIBE",
                                        "ALLOW"])])
        wait_for(lambda: scrape(node, "demo")[0] == 200, T, "demo allowed to scrape /metrics")
        assert 'topic="hidden-orders"' in scrape(node, "demo")[1]


def test_describe_quorum_shows_the_voters_only_to_describe_on_the_cluster(node: LocalCluster) -> None:
    """Kafka's DescribeQuorum needs DESCRIBE on the cluster. Brook's clients probe it to find the active
    controller, so any caller still gets the leader, term and redirect; the voters (their Raft addresses, log
    positions and lags) only a caller allowed DESCRIBE on the cluster (an audit: User:nobody read them)."""
    from client.security import SecurityConfig, make_channel
    from proto import controller_pb2 as pb
    from proto import controller_pb2_grpc

    host, port = node.controller_endpoints[0]

    def quorum(who: str) -> pb.DescribeQuorumResponse:
        security = SecurityConfig.from_config(node.client_config_for(who))
        channel = make_channel(f"{host}:{port}", security)
        try:
            return controller_pb2_grpc.ControllerServiceStub(channel).DescribeQuorum(
                pb.DescribeQuorumRequest(any_voter=True), timeout=T)
        finally:
            channel.close()

    operator = quorum("admin")
    assert [v.node_id for v in operator.voters] == [1] and operator.voters[0].raft_address, operator
    from deploy.local.certs import CertificateAuthority

    CertificateAuthority.load_or_create(node.tls_dir).issue(node.tls_dir, "nobody", hosts=(), server=False)
    nobody = quorum("nobody")
    assert (nobody.error_code, nobody.leader_id, nobody.term) == (0, operator.leader_id, operator.term), nobody
    assert list(nobody.voters) == [], nobody
