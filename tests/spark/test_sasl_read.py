"""The brook source over SASL/SCRAM with ACLs: Spark's Kafka-source options authenticate every connection.

A real 3-node cluster with the StandardAuthorizer and SCRAM users (as the security tests run
it): a user granted READ on the topic reads it through the source, with the credentials in a
ScramLoginModule ``kafka.sasl.jaas.config`` exactly as a job written for Spark's Kafka source
passes them; a user with no ACL gets a clear authorization error, not rows and not an empty
result.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client.admin import Admin, NewTopic
from client.producer import Producer
from deploy.local.cluster import LocalCluster
from metadata_quorum.security import acl_binding

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOPIC = "sasl-events"
RECORDS = 200
ADMIN = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "admin",
         "sasl_password": "admin-secret"}
OVERRIDES = {
    "authorizer.class.name": "StandardAuthorizer",
    "super.users": "User:admin;User:broker",
    "scram.bootstrap.users": "admin:admin-secret,broker:broker-secret,reader:reader-secret,nobody:nobody-secret",
    "inter.broker.sasl.username": "broker",
    "inter.broker.sasl.password": "broker-secret",
}


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    from waiting import wait_for

    with LocalCluster(tmp_path_factory.mktemp("spark-sasl"), nodes=3, overrides=OVERRIDES) as cluster:
        with Admin(cluster.bootstrap_servers, request_timeout_ms=60_000,
                   controller_endpoints=cluster.controller_endpoints, **ADMIN) as admin:
            # The bootstrap users are created by the active controller once it is up.
            wait_for(lambda: _try_create(admin), 60, "the admin user to create the topic")
            admin.create_acls([acl_binding(["TOPIC", TOPIC, "LITERAL", "User:reader", "*", "READ", "ALLOW"])])
        with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", **ADMIN) as producer:
            for i in range(RECORDS):
                producer.send(TOPIC, f"v{i}".encode(), key=f"k{i % 5}".encode())
            producer.flush(60)
        yield cluster


def _try_create(admin: Admin) -> bool:
    from client import errors

    try:
        admin.create_topics([NewTopic(TOPIC, 3, 3)])
    except errors.TopicAlreadyExistsError:
        return True
    except errors.BrookError:
        return False
    return True


def _read(spark, cluster: LocalCluster, user: str, password: str):  # type: ignore[no-untyped-def]
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="{user}" password="{password}";')
    return (spark.read.format("brook").option("kafka.bootstrap.servers", cluster.bootstrap_servers)
            .option("subscribe", TOPIC).option("request.timeout.ms", "10000")
            .option("kafka.security.protocol", "SASL_PLAINTEXT").option("kafka.sasl.mechanism", "SCRAM-SHA-256")
            .option("kafka.sasl.jaas.config", jaas).load())


def test_a_user_with_read_acl_reads_over_scram(spark, sasl_cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    from waiting import wait_for

    # The ACL reaches every broker within one metadata propagation: retry the read until then.
    def rows() -> list[str] | None:
        try:
            got = _read(spark, sasl_cluster, "reader", "reader-secret").selectExpr(
                "CAST(value AS STRING) AS v").collect()
        except Exception:  # noqa: BLE001 - an authorization error before the ACL arrived
            return None
        return sorted(r.v for r in got) or None

    assert wait_for(rows, 90, "the reader's batch read") == sorted(f"v{i}" for i in range(RECORDS))


def test_a_user_without_acl_gets_an_authorization_error(spark, sasl_cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:
        _read(spark, sasl_cluster, "nobody", "nobody-secret").collect()
    assert "AUTHORIZATION_FAILED" in str(info.value), str(info.value)[-2000:]


def test_a_wrong_password_fails_authentication(spark, sasl_cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:
        _read(spark, sasl_cluster, "reader", "wrong-password").collect()
    assert "SASL_AUTHENTICATION_FAILED" in str(info.value) or "authentication" in str(info.value).lower(), \
        str(info.value)[-2000:]
