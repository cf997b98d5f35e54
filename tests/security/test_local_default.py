"""The local launcher's secured default: mTLS, the StandardAuthorizer, an operator and a demo principal.

`python -m deploy.local start` and `make demo` start this (LocalCluster(tls=True, authorizer=True)):
User:admin (DIR/tls/admin.pem) is the super user, User:demo (DIR/tls/demo.pem) may use demo-*
topics and groups only, and any other certificate the CA signed is a principal with no rights.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client import errors
from client.admin import Admin, NewTopic
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.certs import CertificateAuthority
from deploy.local.cluster import ClusterError, LocalCluster

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
