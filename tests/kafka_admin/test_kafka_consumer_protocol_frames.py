"""KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe as raw frames on the KAFKA listener of the TLS +
authorizer cluster: the answers Kafka's clients act on, every refusal a clear error that changes nothing, and the
line between classic and consumer-protocol groups of one id."""

from __future__ import annotations

from typing import Any

import pytest
from waiting import wait_for

pytestmark = pytest.mark.slow

T = 30
HEARTBEAT, DESCRIBE, OFFSET_COMMIT, OFFSET_FETCH, JOIN_GROUP, LIST_GROUPS, FIND_COORDINATOR = 68, 69, 8, 9, 11, 16, 10


def _beat(cluster: Any, node: int, group: str, member: str, epoch: int, *, name: str = "admin", **fields: Any) -> Any:
    from kafka_raw import kafka_ask

    values = {"group_id": group, "member_id": member, "member_epoch": epoch, "rebalance_timeout": -1,
              "subscribed_topic_names": None, "subscribed_topic_regex": None, "topic_partitions": None, **fields}
    return kafka_ask(cluster, node, HEARTBEAT, 1, values, name=name)


def _join(cluster: Any, node: int, group: str, member: str, topics: list[str], **fields: Any) -> Any:
    return _beat(cluster, node, group, member, 0, rebalance_timeout=30_000, subscribed_topic_names=topics,
                 topic_partitions=[], **fields)


def _listed(cluster: Any, node: int, types: list[str]) -> set[str]:
    from kafka_raw import kafka_ask

    return {g.group_id for g in kafka_ask(cluster, node, LIST_GROUPS, 5, {"states_filter": [],
                                                                         "types_filter": types}).groups}


def _coordinator(cluster: Any, group_id: str) -> int | None:
    """The group's coordinator; None until __consumer_offsets is made and led."""
    from kafka_raw import kafka_ask

    found = kafka_ask(cluster, cluster.broker_ids[0], FIND_COORDINATOR, 4, {"key_type": 0,
                                                                           "coordinator_keys": [group_id]})
    return found.coordinators[0].node_id if found.coordinators[0].node_id >= 0 else None


def test_the_consumer_protocol_on_the_wire(kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    from kafka.admin import NewTopic
    from kafka_raw import kafka_ask

    kp_admin.create_topics([NewTopic(topic_name, 4, 1)], timeout_ms=T * 1000)
    group = f"{topic_name}-g"

    def coordinator(group_id: str) -> int | None:
        return _coordinator(kcluster, group_id)
    node = wait_for(lambda: coordinator(group), T, "the group's coordinator")
    missing = next(g for g in (f"{group}-none-{i}" for i in range(100)) if coordinator(g) == node)
    other = next(n for n in kcluster.broker_ids if n != node)

    # Another broker is not the coordinator; nothing is made there.
    assert int(_join(kcluster, other, group, "m1", [topic_name]).error_code) == 16  # NOT_COORDINATOR

    # Refused, each with Kafka's code and a message, and nothing made:
    regex = _join(kcluster, node, group, "m1", [topic_name], subscribed_topic_regex="ka-(.*")
    assert (int(regex.error_code), "missing )" in (regex.error_message or "")) == (128, True), regex  # INVALID_REGULAR_EXPRESSION
    assignor = _join(kcluster, node, group, "m1", [topic_name], server_assignor="sticky")
    assert int(assignor.error_code) == 112 and "uniform, range" in assignor.error_message, assignor  # UNSUPPORTED_ASSIGNOR
    unknown = _beat(kcluster, node, group, "m1", 3, topic_partitions=[])
    assert int(unknown.error_code) == 25, unknown  # UNKNOWN_MEMBER_ID: no such group here
    demo = _join(kcluster, node, group, "m1", [topic_name], name="demo")
    assert int(demo.error_code) == 30, demo  # GROUP_AUTHORIZATION_FAILED: no ACL for User:demo
    assert group not in _listed(kcluster, node, [])

    # The first member is given every partition, by topic id, at epoch 1.
    first = _join(kcluster, node, group, "m1", [topic_name])
    assert (int(first.error_code), first.member_id, first.member_epoch) == (0, "m1", 1), first
    assert int(first.heartbeat_interval.total_seconds() * 1000) == 5000
    [assigned] = first.assignment.topic_partitions
    assert sorted(assigned.partitions) == [0, 1, 2, 3]
    topic_id = assigned.topic_id
    assert group in _listed(kcluster, node, ["consumer"]) and group not in _listed(kcluster, node, ["classic"])

    # A second member waits for partitions the first still holds; the first is told to give two up.
    second = _join(kcluster, node, group, "m2", [topic_name])
    assert (second.member_epoch, list(second.assignment.topic_partitions)) == (2, []), second
    told = _beat(kcluster, node, group, "m1", 1, topic_partitions=[{"topic_id": topic_id, "partitions": [0, 1, 2, 3]}])
    assert told.member_epoch == 1 and len(told.assignment.topic_partitions[0].partitions) == 2, told
    kept = sorted(told.assignment.topic_partitions[0].partitions)
    # An epoch ahead of the member's is fenced.
    for epoch in (2, 7):
        fenced = _beat(kcluster, node, group, "m1", epoch, topic_partitions=[])
        assert int(fenced.error_code) == 110, (epoch, fenced)  # FENCED_MEMBER_EPOCH
    done = _beat(kcluster, node, group, "m1", 1, topic_partitions=[{"topic_id": topic_id, "partitions": kept}])
    assert done.member_epoch == 2, done
    given = _beat(kcluster, node, group, "m2", 2, topic_partitions=[])
    assert sorted(given.assignment.topic_partitions[0].partitions) == sorted({0, 1, 2, 3} - set(kept)), given

    described = kafka_ask(kcluster, node, DESCRIBE, 1, {"group_ids": [group, missing],
                                                         "include_authorized_operations": True}).groups
    assert (int(described[0].error_code), described[0].group_state, described[0].group_epoch,
            described[0].assignor_name) == (0, "Stable", 2, "uniform"), described[0]
    assert {m.member_id: sorted(m.assignment.topic_partitions[0].partitions) for m in described[0].members} == {
        "m1": kept, "m2": sorted({0, 1, 2, 3} - set(kept))}
    assert all(m.member_type == 1 and m.assignment.topic_partitions[0].topic_name == topic_name
               for m in described[0].members)
    assert described[0].authorized_operations > 0
    assert int(described[1].error_code) == 69, described[1]  # GROUP_ID_NOT_FOUND

    # Kafka's DescribeGroups describes classic groups only.
    v6 = kafka_ask(kcluster, node, 15, 6, {"groups": [group]}).groups[0]
    assert (int(v6.error_code), v6.error_message, v6.group_state, len(v6.members)) == (
        69, f"Group {group} is not a classic group.", "Dead", 0), v6
    v5 = kafka_ask(kcluster, node, 15, 5, {"groups": [group]}).groups[0]
    assert (int(v5.error_code), v5.group_state, len(v5.members)) == (0, "Dead", 0), v5

    # A classic member cannot join the group while it has consumer-protocol members.
    classic = kafka_ask(kcluster, node, JOIN_GROUP, 8, {
        "group_id": group, "session_timeout": 10_000, "rebalance_timeout": 10_000, "member_id": "",
        "group_instance_id": None, "protocol_type": "consumer", "reason": None,
        "protocols": [{"name": "range", "metadata": b""}]})
    assert int(classic.error_code) == 23, classic  # INCONSISTENT_GROUP_PROTOCOL

    # Commits are taken at the member's epoch only.
    def commit(epoch: int) -> int:
        answer = kafka_ask(kcluster, node, OFFSET_COMMIT, 9, {
            "group_id": group, "generation_id_or_member_epoch": epoch, "member_id": "m1",
            "group_instance_id": None, "topics": [{"name": topic_name, "partitions": [
                {"partition_index": kept[0], "committed_offset": 0, "committed_leader_epoch": -1,
                 "committed_metadata": ""}]}]})
        return int(answer.topics[0].partitions[0].error_code)
    assert commit(1) == 113  # STALE_MEMBER_EPOCH
    assert commit(3) == 110  # FENCED_MEMBER_EPOCH: ahead of the member
    assert commit(2) == 0

    # OffsetFetch v9 names the member: checked as the commit is; without one (an admin client) it is answered.
    def fetch(member: str | None, epoch: int) -> tuple[int, list[int]]:
        answer = kafka_ask(kcluster, node, OFFSET_FETCH, 9, {"require_stable": False, "groups": [
            {"group_id": group, "member_id": member, "member_epoch": epoch, "topics": [
                {"name": topic_name, "partition_indexes": [kept[0]]}]}]}).groups[0]
        return int(answer.error_code), [p.committed_offset for t in answer.topics for p in t.partitions]
    assert fetch("m1", 2) == (0, [0])
    assert fetch(None, -1) == (0, [0])
    assert fetch("m1", 1)[0] == 113 and fetch("m1", 3)[0] == 110 and fetch("nobody", 2)[0] == 25

    # Both leave: the group is gone from the listing, its committed offset stays.
    for member in ("m1", "m2"):
        left = _beat(kcluster, node, group, member, -1)
        assert (int(left.error_code), left.member_epoch) == (0, -1), left
    assert group not in _listed(kcluster, node, ["consumer"])
    offsets = kp_admin.list_group_offsets(group)[group]  # kafka-python 3: {group: {partition: offset}}
    assert [(tp.partition, o.offset) for tp, o in offsets.items()] == [(kept[0], 0)], offsets


def test_metadata_v12_by_topic_id(kcluster: Any, kp_admin: Any, topic_name: str) -> None:
    """KIP-516's lookup by id, which librdkafka's consumer of the protocol sends for the topic ids of its assignment
    (before, Brook answered it with no topic, and such a consumer waited minutes for its next metadata refresh)."""
    import uuid

    from kafka.admin import NewTopic
    from kafka_raw import kafka_ask

    kp_admin.create_topics([NewTopic(topic_name, 2, 1)], timeout_ms=T * 1000)
    node = kcluster.broker_ids[0]

    def ask(topics: list[dict[str, Any]], name: str = "admin") -> Any:
        return kafka_ask(kcluster, node, 3, 12, {"topics": topics, "allow_auto_topic_creation": True,
                                                  "include_topic_authorized_operations": False}, name=name)
    by_name = wait_for(lambda: next((t for t in ask([{"topic_id": None, "name": topic_name}]).topics
                                     if t.error_code == 0), None), T, "the topic's metadata")
    topic_id, missing = by_name.topic_id, uuid.uuid4()
    answer = ask([{"topic_id": topic_id, "name": None}, {"topic_id": missing, "name": None}])
    found = {t.topic_id: (int(t.error_code), t.name, len(t.partitions)) for t in answer.topics}
    assert found == {topic_id: (0, topic_name, 2), missing: (100, None, 0)}, found  # UNKNOWN_TOPIC_ID
    # User:demo may not describe it: told so by id, never by name.
    refused = ask([{"topic_id": topic_id, "name": None}], name="demo").topics
    assert [(int(t.error_code), t.name, t.topic_id) for t in refused] == [(29, None, topic_id)], refused
    # v10 and v11 have the field but take names only: an id, or a null name, is INVALID_REQUEST (as Kafka).
    zero = uuid.UUID(int=0)
    for version in (10, 11):
        def v(topics: list[dict[str, Any]], version: int = version) -> list[tuple[int, Any]]:
            answer = kafka_ask(kcluster, node, 3, version, {
                "topics": topics, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False})
            return [(int(t.error_code), t.name) for t in answer.topics]
        assert v([{"topic_id": zero, "name": topic_name}]) == [(0, topic_name)]
        assert v([{"topic_id": topic_id, "name": None}]) == [(42, "")]  # names are not nullable before v12
        assert v([{"topic_id": topic_id, "name": topic_name}, {"topic_id": zero, "name": topic_name}]) == [
            (42, topic_name), (42, topic_name)]


def test_a_regex_member_is_given_only_the_topics_it_may_describe(kcluster: Any, kp_admin: Any, confluent_admin: Any,
                                                                 topic_name: str) -> None:
    """User:demo, with READ on its group and DESCRIBE on one topic only, subscribes to a pattern that two topics
    match: it is given the partitions of the one it may describe (as Kafka 4 filters a regex's topics by the
    member's ACLs), and the group's describe shows its regex."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )
    from kafka.admin import NewTopic
    from kafka_raw import kafka_ask

    mine, theirs = f"{topic_name}-mine", f"{topic_name}-theirs"
    kp_admin.create_topics([NewTopic(mine, 2, 1), NewTopic(theirs, 3, 1)], timeout_ms=T * 1000)
    group = f"{topic_name}-rx"
    acls = [AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL, "User:demo", "*", AclOperation.READ,
                       AclPermissionType.ALLOW),
            AclBinding(ResourceType.TOPIC, mine, ResourcePatternType.LITERAL, "User:demo", "*", AclOperation.DESCRIBE,
                       AclPermissionType.ALLOW)]
    for f in confluent_admin.create_acls(acls, request_timeout=T).values():
        f.result(T)
    try:
        node = wait_for(lambda: _coordinator(kcluster, group), T, "the group's coordinator")

        def joined() -> Any:  # the ACLs reach the coordinator through the metadata log
            answer = _beat(kcluster, node, group, "d1", 0, rebalance_timeout=30_000, subscribed_topic_names=[],
                           subscribed_topic_regex=f"{topic_name}-.*", topic_partitions=[], name="demo")
            return answer if int(answer.error_code) == 0 else None
        first = wait_for(joined, T, "User:demo's member to join once its ACLs are known")
        assert [len(t.partitions) for t in first.assignment.topic_partitions] == [2], first
        [described] = kafka_ask(kcluster, node, DESCRIBE, 1, {"group_ids": [group],
                                                              "include_authorized_operations": False}).groups
        [member] = described.members
        assert (member.subscribed_topic_regex, list(member.subscribed_topic_names)) == (f"{topic_name}-.*", [])
        assert [t.topic_name for t in member.assignment.topic_partitions] == [mine], member
        left = _beat(kcluster, node, group, "d1", -1, name="demo")
        assert int(left.error_code) == 0, left
    finally:
        filters = [AclBindingFilter(a.restype, a.name, a.resource_pattern_type, a.principal, a.host, a.operation,
                                    a.permission_type) for a in acls]
        for f in confluent_admin.delete_acls(filters, request_timeout=T).values():
            f.result(T)
