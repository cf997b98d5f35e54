"""One real 3-node cluster (separate processes) with TLS and the authorizer on, shared by the Kafka admin
tests: every broker has a KAFKA listener (mTLS). ``User:admin`` (the cluster's admin certificate) is a super
user; ``User:demo`` (its own certificate) has no ACL until a test grants one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from folder_scope import close_when_folder_done
from kafka_admin_kit import kafka_python_ssl

from deploy.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # At level 1 (a new cluster starts at the highest): test_kafka_features raises it as an operator would.
    cluster = LocalCluster(tmp_path_factory.mktemp("kafka-admin"), nodes=3, tls=True, authorizer=True,
                           overrides={"initial.metadata.version": "1"})

    def close() -> None:
        cluster.stop(timeout_s=20)
        cluster.teardown()
    close_once = close_when_folder_done(__file__, close)
    try:
        cluster.start()
        cluster.wait_ready(timeout_s=120)
        yield cluster
    finally:
        close_once()


class _Dropped:
    """A librdkafka AdminClient that can be let go of: it has no close(), and its threads go on
    reconnecting to a stopped cluster until the last reference to it is dropped."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            raise RuntimeError("the librdkafka AdminClient was let go of: tests/kafka_admin is done")
        return getattr(self._client, name)

    def close(self) -> None:
        self._client = None


@pytest.fixture(scope="session")
def confluent_admin(kcluster: LocalCluster) -> Any:
    from confluent_kafka.admin import AdminClient

    admin = _Dropped(AdminClient(kcluster.kafka_client_config("admin")))
    close_when_folder_done(__file__, admin.close)
    return admin


@pytest.fixture(scope="session")
def kp_admin(kcluster: LocalCluster) -> Iterator[Any]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(request_timeout_ms=30000, **kafka_python_ssl(kcluster))
    close = close_when_folder_done(__file__, admin.close)  # its I/O thread would retry the stopped cluster
    try:
        yield admin
    finally:
        close()


@pytest.fixture
def topic_name() -> str:
    return f"ka-{uuid.uuid4().hex[:10]}"
