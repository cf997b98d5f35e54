"""Group requests that name topics the caller may not READ refuse those topics one by one, as Kafka's KafkaApis:

- OffsetCommit (and AlterConsumerGroupOffsets, a commit): a refused topic stays TOPIC_AUTHORIZATION_FAILED when the
  group refuses the rest (UNKNOWN_MEMBER_ID: the group is Stable). Before, every partition, refused ones too, got
  the group's error.
- OffsetDelete: the partitions of refused topics are TOPIC_AUTHORIZATION_FAILED and the others are deleted.
  Before, the whole request was refused (top-level TOPIC_AUTHORIZATION_FAILED) and nothing deleted.

The servicer runs against a stand-in coordinator, with the authorizer and a caller (User:demo) of its own."""

from __future__ import annotations

import types
from typing import Any
from unittest import mock

from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
from broker.group_service import GroupCoordinatorServicer
from broker.principal import AUTH_CERTIFICATE, Authentication, Principal
from broker.security import is_node_principal
from client.types import TopicPartition as TP
from metadata_quorum.security import acl_binding
from proto import errors, group_pb2
from proto.errors import ErrorCode

DEMO = types.SimpleNamespace(brook_authentication=Authentication(Principal("User", "demo"), AUTH_CERTIFICATE),
                             peer=lambda: "ipv4:10.0.0.1:5000")


def servicer(coordinator: Any) -> GroupCoordinatorServicer:
    index = AclIndex([acl_binding(["TOPIC", "demo-", "PREFIXED", "User:demo", "*", "READ", "ALLOW"]),
                      acl_binding(["GROUP", "demo-", "PREFIXED", "User:demo", "*", "ALL", "ALLOW"])])
    authorizer = Authorizer(AuthorizerConfig(True, frozenset()), lambda: index, is_node_principal)
    return GroupCoordinatorServicer(coordinator, executor=mock.Mock(), authorizer=authorizer)


def test_offset_commit_keeps_the_topic_refusals_when_the_group_refuses_the_rest() -> None:
    coordinator = mock.Mock()
    coordinator.commit_offsets.side_effect = errors.error_for(ErrorCode.UNKNOWN_MEMBER_ID, "not a member")
    request = group_pb2.OffsetCommitRequest(group_id="demo-grp", generation_id=-1, partitions=[
        group_pb2.OffsetCommitPartition(topic="secret", partition=0, offset=1),
        group_pb2.OffsetCommitPartition(topic="demo-open", partition=0, offset=2)])
    out = servicer(coordinator)._offset_commit(request, DEMO)
    codes = {(p.topic, p.partition): p.error_code for p in out.partitions}
    assert codes == {("secret", 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED, ("demo-open", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert out.error_code == ErrorCode.UNKNOWN_MEMBER_ID  # the group's own answer, as before
    committed = coordinator.commit_offsets.call_args.args[0]
    assert [p.topic for p in committed.partitions] == ["demo-open"]  # the refused topic never reached the group


def test_offset_delete_refuses_the_topics_one_by_one_and_deletes_the_others() -> None:
    coordinator = mock.Mock()
    coordinator.delete_offsets.side_effect = lambda group, tps: [(tp, ErrorCode.NONE) for tp in tps]
    request = group_pb2.OffsetDeleteRequest(group_id="demo-grp", partitions=[
        group_pb2.TopicPartitionRef(topic="secret", partition=0),
        group_pb2.TopicPartitionRef(topic="demo-open", partition=0)])
    out = servicer(coordinator)._offset_delete(request, DEMO)
    assert out.error_code == ErrorCode.NONE
    assert {(p.topic, p.partition): p.error_code for p in out.partitions} == {
        ("secret", 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED, ("demo-open", 0): ErrorCode.NONE}
    coordinator.delete_offsets.assert_called_once_with("demo-grp", [TP("demo-open", 0)])


def test_offset_delete_of_a_group_it_may_not_delete_is_refused_whole() -> None:
    coordinator = mock.Mock()
    out = servicer(coordinator)._offset_delete(group_pb2.OffsetDeleteRequest(group_id="secret-grp", partitions=[
        group_pb2.TopicPartitionRef(topic="demo-open", partition=0)]), DEMO)
    assert out.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED and not out.partitions
    coordinator.delete_offsets.assert_not_called()
