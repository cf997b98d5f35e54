"""The local launcher's secured default: mTLS, the StandardAuthorizer, an operator and a demo principal.

`python -m deploy.local start` and `make demo` start this (LocalCluster(tls=True, authorizer=True)):
User:admin (DIR/tls/admin.pem) is the super user, User:demo (DIR/tls/demo.pem) may use demo-*
topics and groups only, and any other certificate the CA signed is a principal with no rights.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.certs import CertificateAuthority
from deploy.local.cluster import ClusterError, LocalCluster, free_port

pytestmark = pytest.mark.slow


def kw(config: dict[str, str]) -> dict[str, str]:
    return {k.replace(".", "_"): v for k, v in config.items()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base: Path = tmp_path_factory.mktemp("default-secured")
    with LocalCluster(base / "c", nodes=1, tls=True, authorizer=True) as c:
        c.grant_demo_acls()
        c.grant_demo_acls()  # idempotent: every launcher start calls it
        CertificateAuthority.load_or_create(c.tls_dir).issue(c.tls_dir, "mallory", hosts=(), server=False)
        with Admin(c.bootstrap_servers, request_timeout_ms=30_000, security=c.security) as admin:
            admin.create_topics([NewTopic("demo-orders", 1, 1), NewTopic("payroll", 1, 1)])
        yield c


def test_the_demo_user_produces_and_consumes_its_own_topics(cluster: LocalCluster) -> None:
    demo = kw(cluster.client_config_for("demo"))
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", **demo) as producer:
        md = producer.send("demo-orders", b"v1", key=b"k").get(30)
    assert md.offset == 0
    tp = TopicPartition("demo-orders", 0)
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="demo-readers",
                  auto_offset_reset="earliest", **demo) as consumer:
        consumer.assign([tp])
        got: list[bytes] = []
        for _ in range(50):
            got += [r.value for r in consumer.poll(timeout_ms=500).get(tp, [])]
            if got:
                break
        consumer.commit()
    assert got == [b"v1"]


def test_the_demo_user_cannot_touch_other_topics_or_delete_its_own(cluster: LocalCluster) -> None:
    demo = kw(cluster.client_config_for("demo"))
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", retries=0, **demo) as producer, \
            pytest.raises(errors.BrookError) as info:
        producer.send("payroll", b"x").get(30)
    assert info.value.code == errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED, info.value
    with Admin(cluster.bootstrap_servers, request_timeout_ms=10_000, **demo) as admin, \
            pytest.raises(errors.BrookError) as info:
        admin.delete_topics(["demo-orders"])
    assert info.value.code == errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED, info.value


def test_a_certificate_the_ca_signed_has_no_rights_without_acls(cluster: LocalCluster) -> None:
    mallory = kw(cluster.client_config_for("mallory"))
    with Admin(cluster.bootstrap_servers, request_timeout_ms=10_000, **mallory) as admin:
        with pytest.raises(errors.BrookError) as info:
            admin.delete_topics(["demo-orders"])
        assert info.value.code == errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED, info.value
        with pytest.raises(errors.BrookError) as info:
            admin.alter_configs("payroll", set={"retention.ms": "1"})
        assert info.value.code == errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED, info.value
    with Admin(cluster.bootstrap_servers, request_timeout_ms=30_000, security=cluster.security) as admin:
        topics = admin.describe_topics(["demo-orders", "payroll"])
        assert set(topics) == {"demo-orders", "payroll"}
        assert admin.describe_configs(["payroll"])["payroll"]["retention.ms"].value != "1"


def test_the_authorizer_needs_tls_here(tmp_path: Path) -> None:
    with pytest.raises(ClusterError):
        LocalCluster(tmp_path / "x", nodes=1, authorizer=True)


def _console_get(cluster: LocalCluster, path: str, cert: str | None) -> tuple[int, dict]:
    import json
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
    if cert is not None:
        ctx.load_cert_chain(str(cluster.tls_dir / f"{cert}.pem"), str(cluster.tls_dir / f"{cert}.key"))
    try:
        with urllib.request.urlopen(cluster.console_url(cluster.broker_ids[0]) + path, timeout=10, context=ctx) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_the_console_needs_a_certificate_and_describe_on_the_cluster(cluster: LocalCluster) -> None:
    """The console's auth is the API's: a client certificate (mTLS), then the ACLs. A viewer sees only
    the topics it may DESCRIBE."""
    import ssl
    import urllib.error

    from metadata_quorum.security import AclBinding

    assert cluster.console_url(cluster.broker_ids[0]).startswith("https://")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        _console_get(cluster, "api/overview", None)  # no client certificate: no TLS session at all
    status, body = _console_get(cluster, "api/overview", "mallory")
    assert status == 403 and "DESCRIBE" in body["error"], body
    status, body = _console_get(cluster, "api/overview", "admin")
    assert status == 200 and {"demo-orders", "payroll"} <= {t["name"] for t in body["topics"]}, body
    assert body["viewer"] == "User:admin"

    CertificateAuthority.load_or_create(cluster.tls_dir).issue(cluster.tls_dir, "viewer", hosts=(), server=False)
    with Admin(cluster.bootstrap_servers, request_timeout_ms=30_000, security=cluster.security) as admin:
        admin.create_acls([
            AclBinding("CLUSTER", "kafka-cluster", "LITERAL", "User:viewer", "*", "DESCRIBE", "ALLOW"),
            AclBinding("TOPIC", "demo-", "PREFIXED", "User:viewer", "*", "DESCRIBE", "ALLOW")])

    def viewer_page() -> dict | None:
        status, body = _console_get(cluster, "api/overview", "viewer")
        return body if status == 200 else None

    body = wait_for(viewer_page, 30, "the viewer's ACLs on the broker")
    names = {t["name"] for t in body["topics"]}
    assert "demo-orders" in names and "payroll" not in names, names


def test_the_shipped_split_layout_with_acls_replicates_and_refuses_strangers(tmp_path: Path) -> None:
    """Every example in deploy/ (combined, split, Docker, Kubernetes) ships with the StandardAuthorizer, no
    access where no ACL allows it, and User:admin as the only super user (tests/ops/test_deploy.py checks the
    files). This runs that posture in the Kubernetes layout, dedicated controllers and brokers: the nodes
    register, replicate and keep their ISRs by their certificates alone (no ACL names them), a principal
    with ACLs writes acks=all and reads back, and a certificate the CA signed without ACLs is refused."""
    with LocalCluster(tmp_path / "c", nodes=3, mode="split", controllers=3, tls=True, authorizer=True) as c:
        c.grant_demo_acls()
        CertificateAuthority.load_or_create(c.tls_dir).issue(c.tls_dir, "mallory", hosts=(), server=False)
        with Admin(c.bootstrap_servers, request_timeout_ms=30_000, security=c.security) as admin:
            admin.create_topics([NewTopic("demo-split", 1, 3, {"min.insync.replicas": "2"})])
            admin.wait_for_topics(["demo-split"])

            def in_sync() -> bool:
                [p] = admin.describe_topics(["demo-split"])["demo-split"].partitions.values()
                return len(p.isr) == 3
            wait_for(in_sync, 60.0, "demo-split-0 with 3 in-sync replicas", poll_s=0.2)
        demo = kw(c.client_config_for("demo"))
        values = [b"v%d" % i for i in range(20)]
        with Producer(bootstrap_servers=c.bootstrap_servers, acks="all", **demo) as producer:
            for f in [producer.send("demo-split", v) for v in values]:
                f.get(30)
        tp = TopicPartition("demo-split", 0)
        with Consumer(bootstrap_servers=c.bootstrap_servers, group_id="demo-split-readers",
                      auto_offset_reset="earliest", **demo) as consumer:
            consumer.assign([tp])
            got: list[bytes] = []

            def read_all() -> bool:
                got.extend(r.value for r in consumer.poll(timeout_ms=200).get(tp, []))
                return len(got) >= len(values)
            wait_for(read_all, 30.0, lambda: f"the {len(values)} records (read {len(got)})", poll_s=0)
        assert got == values
        mallory = kw(c.client_config_for("mallory"))
        with Producer(bootstrap_servers=c.bootstrap_servers, acks="all", retries=0, **mallory) as producer, \
                pytest.raises(errors.BrookError) as info:
            producer.send("demo-split", b"x").get(30)
        assert info.value.code == errors.ErrorCode.TOPIC_AUTHORIZATION_FAILED, info.value


def test_cluster_health_without_the_right_is_an_error_not_an_outage(cluster: LocalCluster, tmp_path: Path) -> None:
    """`brook cluster health` as a principal that may not DESCRIBE the cluster: one error line naming the refusal
    and that nothing was checked. It reported "cluster is UNHEALTHY", so a monitor with the wrong certificate
    paged for an outage (docs audit)."""
    props = tmp_path / "demo.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in cluster.client_config_for("demo").items()))
    proc = subprocess.run([sys.executable, "-m", "admin_cli.main", "-b", cluster.bootstrap_servers,
                           "--command-config", str(props), "cluster", "health"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith("error: CLUSTER_AUTHORIZATION_FAILED") and \
        "the cluster's health was not checked" in proc.stderr, proc.stderr
    assert "UNHEALTHY" not in proc.stdout, proc.stdout


def test_the_healthcheck_tells_a_tls_listener_asked_in_plaintext_from_a_port_down(cluster: LocalCluster,
                                                                                 tmp_path: Path) -> None:
    target = cluster.bootstrap_servers.split(",")[0]
    plain = subprocess.run([sys.executable, "-m", "deploy.healthcheck", target], capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert plain.returncode == 1 and "UNREACHABLE (the port accepts connections" in plain.stdout \
        and "--command-config" in plain.stdout, plain
    props = tmp_path / "admin.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in cluster.client_config.items()))
    secured = subprocess.run([sys.executable, "-m", "deploy.healthcheck", target, "--command-config", str(props)],
                             capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert (secured.returncode, secured.stdout) == (0, f"{target}: SERVING\n"), secured
    down = subprocess.run([sys.executable, "-m", "deploy.healthcheck", f"127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert down.returncode == 1 and down.stdout.endswith(": UNREACHABLE\n"), down
