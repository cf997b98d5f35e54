"""KIP-430 authorized operations on the KAFKA listener (Metadata v8+, DescribeCluster, DescribeGroups v3+), read
by librdkafka's AdminClient (confluent-kafka) and kafka-python: asked for, each is the set of operations Kafka
supports on the resource type that the caller is allowed; not asked for, none (None)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka_admin_kit import principal_of_its_own
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30

# Kafka's AclEntry.supportedOperations, by name (confluent_kafka.admin.AclOperation member names).
TOPIC_OPS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
GROUP_OPS = {"READ", "DESCRIBE", "DELETE"}
CLUSTER_OPS = {"CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALTER",
               "DESCRIBE"}


def _names(ops: list[Any] | None) -> set[str] | None:
    return None if ops is None else {op.name for op in ops}


def _topic_ops(admin: Any, topic: str, include: bool = True) -> set[str] | None:
    from confluent_kafka import TopicCollection

    futures = admin.describe_topics(TopicCollection([topic]), request_timeout=T,
                                    include_authorized_operations=include)
    return _names(futures[topic].result(T).authorized_operations)


def _cluster_ops(admin: Any, include: bool = True) -> set[str] | None:
    return _names(admin.describe_cluster(request_timeout=T, include_authorized_operations=include)
                  .result(T).authorized_operations)


def _group_ops(admin: Any, group: str, include: bool = True) -> set[str] | None:
    futures = admin.describe_consumer_groups([group], request_timeout=T, include_authorized_operations=include)
    return _names(futures[group].result(T).authorized_operations)


def _kp_cluster_ops(kcluster: Any, user: str) -> set[str] | None:
    """kafka-python's DescribeCluster (it always asks for the operations, and tells none (0) from not
    computed (None), which librdkafka does not)."""
    from kafka.admin import KafkaAdminClient
    from kafka_admin_kit import kafka_python_ssl

    client = KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, user))
    try:
        ops = client.describe_cluster()["authorized_operations"]
        return None if ops is None else set(ops)
    finally:
        client.close()


def _settled(read: Any, expected: Any, what: str) -> None:
    """``read()`` == ``expected`` once the ACLs reached the broker asked (a grant reaches each broker through
    the metadata log); a refusal (the grant not there yet) counts as not yet."""
    from confluent_kafka import KafkaException

    seen: list[Any] = []

    def check() -> bool:
        try:
            seen.append(read())
        except KafkaException as exc:
            seen.append(exc)
        return seen[-1] == expected

    wait_for(check, T, lambda: f"{what}: expected {expected}, last answers {seen[-3:]}")


def _acl(resource_type: str, name: str, principal: str, operation: str) -> Any:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    rtype = ResourceType.BROKER if resource_type == "CLUSTER" else getattr(ResourceType, resource_type)  # code 4
    return AclBinding(rtype, name, ResourcePatternType.LITERAL, principal, "*", getattr(AclOperation, operation),
                      AclPermissionType.ALLOW)


@pytest.fixture
def topic_and_group(confluent_admin: Any) -> Iterator[tuple[str, str]]:
    """A topic (not demo-*: no grant of the demo user covers it) and a group with an offset committed on it."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import NewTopic

    a = confluent_admin
    suffix = uuid.uuid4().hex[:10]
    topic, group = f"authops-{suffix}", f"authops-g-{suffix}"
    a.create_topics([NewTopic(topic, 1, 1)], operation_timeout=T)[topic].result(T)
    wait_for(lambda: topic in a.list_topics(timeout=T).topics, T, "the topic")

    def commit() -> bool:
        try:
            offsets = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])
            a.alter_consumer_group_offsets([offsets], request_timeout=T)[group].result(T)
            return True
        except Exception:  # noqa: BLE001 - the partition's leader or the group's coordinator not ready yet
            return False
    wait_for(commit, T, "an offset committed for the group")
    try:
        yield topic, group
    finally:
        a.delete_topics([topic], operation_timeout=T)[topic].result(T)


def test_super_user_sees_every_supported_operation(confluent_admin: Any, kp_admin: Any,
                                                   topic_and_group: tuple[str, str]) -> None:
    topic, group = topic_and_group
    a = confluent_admin
    assert _topic_ops(a, topic) == TOPIC_OPS
    assert _cluster_ops(a) == CLUSTER_OPS
    assert _group_ops(a, group) == GROUP_OPS
    # Not asked for: not computed (the fields keep Kafka's "omitted" value, which clients read as None).
    assert _topic_ops(a, topic, include=False) is None
    assert _cluster_ops(a, include=False) is None
    assert _group_ops(a, group, include=False) is None

    # kafka-python asks for them in every DescribeCluster (v2) and DescribeGroups (v5), and names them.
    assert set(kp_admin.describe_cluster()["authorized_operations"]) == CLUSTER_OPS
    assert set(kp_admin.describe_groups([group])[group]["authorized_operations"]) == GROUP_OPS
    # Metadata carries the cluster's in v8-v10 only (librdkafka and kafka-python ask for it at v12, where the
    # field is gone): one Metadata v10 through kafka-python's connection manager.
    from confluent_kafka.admin import AclOperation
    from kafka.protocol.metadata import MetadataRequest

    async def metadata_v10() -> Any:
        return await kp_admin._manager.send(MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False,
            include_cluster_authorized_operations=True, include_topic_authorized_operations=True, max_version=10))
    resp = kp_admin._manager.run(metadata_v10)
    codes = {op.name: op.value for op in AclOperation}
    assert resp.version == 10 and resp.authorized_operations == {codes[op] for op in CLUSTER_OPS}, resp
    assert [(t.name, t.authorized_operations) for t in resp.topics] == [(topic, {codes[op] for op in TOPIC_OPS})]


def test_principal_sees_what_its_acls_allow(kcluster: Any, confluent_admin: Any,
                                            topic_and_group: tuple[str, str]) -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    topic, group = topic_and_group
    a = confluent_admin
    grants = [_acl("TOPIC", topic, "User:demo", "READ"), _acl("TOPIC", topic, "User:demo", "DESCRIBE"),
              _acl("GROUP", group, "User:demo", "READ")]  # READ implies DESCRIBE (Kafka's rule)
    for f in a.create_acls(grants, request_timeout=T).values():
        f.result(T)
    demo = AdminClient(kcluster.kafka_client_config("demo"))
    try:
        _settled(lambda: _topic_ops(demo, topic), {"READ", "DESCRIBE"}, "demo's operations on its topic")
        _settled(lambda: _group_ops(demo, group), {"READ", "DESCRIBE"}, "demo's operations on its group")
        assert _topic_ops(demo, topic, include=False) is None
        # No DESCRIBE on the cluster: Kafka answers no operation at all (0); kafka-python reads it as [],
        # librdkafka as None (as if not asked).
        assert _kp_cluster_ops(kcluster, "demo") == set()
    finally:
        for name, rtype in ((topic, ResourceType.TOPIC), (group, ResourceType.GROUP)):
            f = AclBindingFilter(rtype, name, ResourcePatternType.LITERAL, "User:demo", None, AclOperation.ANY,
                                 AclPermissionType.ANY)
            a.delete_acls([f], request_timeout=T)[f].result(T)


def test_cluster_operations_follow_cluster_acls(kcluster: Any, confluent_admin: Any) -> None:
    """A principal of its own (a certificate issued here), so that the cluster ACLs granted never reach the
    demo user whose lack of cluster rights other tests rely on."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    name = principal_of_its_own(kcluster, "authops")
    principal = f"User:{name}"
    a = confluent_admin
    client = AdminClient(kcluster.kafka_client_config(name))
    grants = {op: _acl("CLUSTER", "kafka-cluster", principal, op)
              for op in ("DESCRIBE", "IDEMPOTENT_WRITE", "ALTER_CONFIGS")}
    try:
        for f in a.create_acls(list(grants.values()), request_timeout=T).values():
            f.result(T)
        # ALTER_CONFIGS implies DESCRIBE_CONFIGS (Kafka's rule, the authorizer's).
        _settled(lambda: _cluster_ops(client), {"DESCRIBE", "IDEMPOTENT_WRITE", "ALTER_CONFIGS", "DESCRIBE_CONFIGS"},
                 "the principal's operations on the cluster")
        assert _cluster_ops(client, include=False) is None
        # Without DESCRIBE on the cluster, no operation is answered although others are allowed (as Kafka).
        b = grants["DESCRIBE"]
        describe = AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                    b.permission_type)
        assert a.delete_acls([describe], request_timeout=T)[describe].result(T) == [b]
        _settled(lambda: _kp_cluster_ops(kcluster, name), set(), "no operation on the cluster without DESCRIBE")
    finally:
        f = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY,
                             AclPermissionType.ANY)
        a.delete_acls([f], request_timeout=T)[f].result(T)


def test_bit_sets_are_the_authorizers_decisions() -> None:
    """No cluster: for every supported operation, its bit is set exactly when ``authorize`` allows it (DENY wins,
    implied operations, PREFIXED and ``*`` bindings, hosts, allow.everyone.if.no.acl.found), the decisions are not
    counted as denials, and without an authorizer (or for a super user) every supported operation is set."""
    from broker import authorizer as authz
    from broker.principal import Principal
    from metadata_quorum.security import CLUSTER_NAME, AclBinding

    rows = [("TOPIC", "orders", "LITERAL", "User:demo", "*", "READ", "ALLOW"),
            ("TOPIC", "orders", "LITERAL", "User:demo", "*", "ALTER_CONFIGS", "ALLOW"),
            ("TOPIC", "ord", "PREFIXED", "User:*", "*", "ALL", "ALLOW"),
            ("TOPIC", "orders", "LITERAL", "User:demo", "*", "DELETE", "DENY"),
            ("TOPIC", "*", "LITERAL", "User:demo", "10.0.0.9", "WRITE", "DENY"),
            ("GROUP", "g", "PREFIXED", "User:demo", "*", "DELETE", "ALLOW"),
            ("CLUSTER", CLUSTER_NAME, "LITERAL", "User:demo", "*", "IDEMPOTENT_WRITE", "ALLOW"),
            ("CLUSTER", CLUSTER_NAME, "LITERAL", "User:demo", "*", "ALTER", "ALLOW")]
    index = authz.AclIndex(AclBinding(*r) for r in rows)
    resources = [("TOPIC", "orders"), ("TOPIC", "ordinary"), ("TOPIC", "other"), ("GROUP", "g1"), ("GROUP", "h"),
                 ("CLUSTER", CLUSTER_NAME)]
    callers = [Principal("User", "demo", "10.0.0.9"), Principal("User", "demo", "10.0.0.1"), Principal("User", "x"),
               Principal("User", "admin")]
    for everyone in (False, True):
        a = authz.Authorizer(authz.AuthorizerConfig(True, frozenset({"User:admin"}), everyone), lambda: index)
        for caller in callers:
            for rtype, name in resources:
                bits = a.authorized_operations(caller, rtype, name)
                assert a.denied_total() == {}
                expected = {op for op in authz.SUPPORTED_OPERATIONS[rtype] if a.authorize(caller, op, rtype, name)}
                assert {op for op, code in authz.OPERATION_CODES.items() if bits >> code & 1} == expected, \
                    (everyone, caller, rtype, name)
                a.denied.clear()
    demo = Principal("User", "demo")
    assert authz.ALLOW_ALL.authorized_operations(demo, "TOPIC", "orders") == 0b1101_1111_1000  # 3-8, 10, 11
    assert authz.ALLOW_ALL.authorized_operations(demo, "GROUP", "g") == 0b1_0100_1000  # 3, 6, 8
    assert authz.ALLOW_ALL.authorized_operations(demo, "CLUSTER") == 0b1_1111_1010_0000  # 5, 7-12
