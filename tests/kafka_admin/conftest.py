"""One real 3-node cluster (separate processes) with TLS and the authorizer on, shared by the Kafka admin
tests: every broker has a KAFKA listener (mTLS). ``User:admin`` (the cluster's admin certificate) is a super
user; ``User:demo`` (its own certificate) has no ACL until a test grants one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka_admin_kit import kafka_python_ssl

from deploy.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("kafka-admin"), nodes=3, tls=True, authorizer=True)
    try:
        cluster.start()
        cluster.wait_ready(timeout_s=120)
        yield cluster
    finally:
        cluster.stop(timeout_s=20)
        cluster.teardown()


@pytest.fixture(scope="session")
def confluent_admin(kcluster: LocalCluster) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(kcluster.kafka_client_config("admin"))


@pytest.fixture(scope="session")
def kp_admin(kcluster: LocalCluster) -> Iterator[Any]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(request_timeout_ms=30000, **kafka_python_ssl(kcluster))
    try:
        yield admin
    finally:
        admin.close()


@pytest.fixture
def topic_name() -> str:
    return f"ka-{uuid.uuid4().hex[:10]}"
