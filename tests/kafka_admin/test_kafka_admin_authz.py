"""The controller authorizes the Kafka client, not the broker that forwards its request: User:demo (no ACL)
is refused through the KAFKA listener although the broker itself is a super user."""

from __future__ import annotations

from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30


def test_principal_without_rights_is_refused(kcluster: Any, topic_name: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

    demo = AdminClient(kcluster.kafka_client_config("demo"))
    with pytest.raises(KafkaException) as denied:
        demo.create_topics([NewTopic(topic_name, 1, 1)], operation_timeout=T)[topic_name].result(T)
    assert denied.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"

    broker = ConfigResource(ResourceType.BROKER, str(kcluster.broker_ids[0]))
    with pytest.raises(KafkaException) as configs:
        demo.describe_configs([broker])[broker].result(T)
    assert configs.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"

    # Once granted CREATE on demo-* topics (by the operator), the same client may create those, and only those.
    kcluster.grant_demo_acls()
    allowed = "demo-" + topic_name

    def create() -> bool:
        try:
            demo.create_topics([NewTopic(allowed, 1, 1)], operation_timeout=T)[allowed].result(T)
            return True
        except KafkaException as exc:
            assert exc.args[0].name() == "TOPIC_AUTHORIZATION_FAILED", exc  # until the ACL reached the quorum
            return False

    wait_for(create, T, "demo to be allowed to create demo-* topics")
    with pytest.raises(KafkaException) as still:
        demo.create_topics([NewTopic(topic_name, 1, 1)], operation_timeout=T)[topic_name].result(T)
    assert still.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"


def test_cluster_operations_need_cluster_rights(kcluster: Any) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import ClusterAuthorizationFailedError
    from kafka_admin_kit import kafka_python_ssl

    demo = KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, "demo"))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            demo.list_partition_reassignments()
    finally:
        demo.close()


def test_broker_loggers_need_cluster_rights(kcluster: Any) -> None:
    """BROKER_LOGGER (kafka-configs --entity-type broker-loggers) is the cluster's: DESCRIBE_CONFIGS to list a
    node's log levels, ALTER_CONFIGS to change them, as Kafka authorizes it. A client without rights gets
    CLUSTER_AUTHORIZATION_FAILED and changes nothing; the operator may."""
    from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType, KafkaAdminClient
    from kafka_admin_kit import kafka_python_ssl

    broker = int(kcluster.broker_ids[0])
    level = ("broker.group_coordinator", "DEBUG")

    def levels(client: Any) -> Any:
        [result] = client._manager.run(client._manager.send, client._describe_configs_request(
            [ConfigResource(ConfigResourceType.BROKER_LOGGER, str(broker))], False), broker).results
        return result

    def alter(client: Any, op: AlterConfigOp) -> Any:
        resource = ConfigResource(ConfigResourceType.BROKER_LOGGER, str(broker), {level[0]: (op, level[1])})
        [result] = client._manager.run(client._manager.send, client._alter_configs_request(
            [resource], incremental=True), broker).responses
        return result

    demo = KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, "demo"))
    admin = KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, "admin"))
    try:
        cluster_authorization_failed = 31
        assert levels(demo).error_code == cluster_authorization_failed
        assert alter(demo, AlterConfigOp.SET).error_code == cluster_authorization_failed
        described = levels(admin)
        assert described.error_code == 0 and {c.name: c.value for c in described.configs}[level[0]] == "INFO"
        assert alter(admin, AlterConfigOp.SET).error_code == 0
        assert {c.name: c.value for c in levels(admin).configs}[level[0]] == "DEBUG"
        assert alter(admin, AlterConfigOp.DELETE).error_code == 0  # back to the root's level
        assert {c.name: c.value for c in levels(admin).configs}[level[0]] == "INFO"
    finally:
        demo.close()
        admin.close()


def test_a_broker_config_change_is_authorized_before_it_is_refused(kcluster: Any) -> None:
    """AlterConfigs of BROKER '<id>' (Brook has no per-broker dynamic configs): a caller without ALTER_CONFIGS on
    the cluster is told that, as Kafka checks the right first; it was told INVALID_REQUEST (KafkaJS audit)."""
    from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType, KafkaAdminClient
    from kafka_admin_kit import kafka_python_ssl

    broker = int(kcluster.broker_ids[0])

    def alter(client: Any) -> int:
        resource = ConfigResource(ConfigResourceType.BROKER, str(broker),
                                  {"log.retention.ms": (AlterConfigOp.SET, "60000")})
        [result] = client._manager.run(client._manager.send, client._alter_configs_request(
            [resource], incremental=True), broker).responses
        return int(result[0] if isinstance(result, tuple) else result.error_code)

    demo = KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, "demo"))
    admin = KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, "admin"))
    try:
        assert alter(demo) == 31  # CLUSTER_AUTHORIZATION_FAILED
        assert alter(admin) == 42  # INVALID_REQUEST: the right is there, per-broker configs are not
    finally:
        demo.close()
        admin.close()
