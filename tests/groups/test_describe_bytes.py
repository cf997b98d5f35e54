"""What DescribeGroups answers being built at once may carry, on a real coordinator without a cluster.

Each call's answer is bounded (DESCRIBE_ANSWER_MAX_BYTES) but calls run side by side on the group
executor: the coordinator also bounds them together, refusing a group that does not fit with the
retriable COORDINATOR_LOAD_IN_PROGRESS instead of waiting on an executor thread."""

from __future__ import annotations

from broker.group_coordinator import (
    DESCRIBE_ANSWER_MAX_BYTES,
    DESCRIBE_INFLIGHT_MAX_BYTES,
    DESCRIBED_MEMBER_OVERHEAD,
    CoordinatorConfig,
    GroupCoordinator,
    _PartitionLoad,
)
from broker.group_service import GroupCoordinatorServicer, _DescribeBytes
from broker.group_state import Group, GroupState, Member
from proto import group_pb2
from proto.common_pb2 import ErrorCode

GROUP_BYTES = 7 << 20
# What one description of the group counts: its member's metadata, its ids ("m", "c", "h") and framing.
DESCRIBED = GROUP_BYTES + 3 + DESCRIBED_MEMBER_OVERHEAD


def _coordinator() -> tuple[GroupCoordinator, GroupCoordinatorServicer]:
    coord = GroupCoordinator(node_id=1, replica_manager=None, metadata_cache=None, config=CoordinatorConfig())
    coord._partitions[coord.partition_for("big")] = _PartitionLoad(leader_epoch=0, loaded=True)
    g = Group("big", state=GroupState.STABLE, protocol_type="connect", protocol_name="default", generation_id=1,
              leader_id="m")
    g.members["m"] = Member("m", "c", "h", 10_000, 30_000, [("default", b"x" * GROUP_BYTES)], 0)
    coord._groups["big"] = g
    return coord, GroupCoordinatorServicer(coord)


def _describe(servicer: GroupCoordinatorServicer, held: _DescribeBytes, ids: int) -> list[int]:
    out = servicer._describe_groups(group_pb2.DescribeGroupsRequest(group_ids=["big"] * ids), None, held=held)
    return [g.error_code for g in out.groups]


def test_calls_side_by_side_carry_at_most_the_inflight_bound_and_give_it_back() -> None:
    assert DESCRIBE_INFLIGHT_MAX_BYTES == 2 * DESCRIBE_ANSWER_MAX_BYTES == 64 << 20
    coord, servicer = _coordinator()
    try:
        first, second, third, fourth = (_DescribeBytes(coord) for _ in range(4))
        assert _describe(servicer, first, 4) == [ErrorCode.NONE] * 4  # 28 MiB, its answer not sent yet
        assert _describe(servicer, second, 4) == [ErrorCode.NONE] * 4  # 56 MiB
        assert _describe(servicer, third, 2) == [ErrorCode.NONE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS]
        assert coord._describing_bytes == 9 * DESCRIBED  # 63 MiB
        assert _describe(servicer, fourth, 1) == [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS]
        first.release()
        assert _describe(servicer, fourth, 4) == [ErrorCode.NONE] * 4
        for held in (second, third, fourth):
            held.release()
        assert coord._describing_bytes == 0
        # A call whose client went away while the executor still describes takes nothing more.
        gone = _DescribeBytes(coord)
        gone.release()
        assert _describe(servicer, gone, 1) == [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS]
        assert coord._describing_bytes == 0
        # The refusal names what to do.
        out = servicer._describe_groups(group_pb2.DescribeGroupsRequest(group_ids=["big"]), None, held=gone)
        assert "retry" in out.groups[0].error_message, out.groups[0].error_message
    finally:
        coord._loader.shutdown()


def test_a_description_shows_offsets_only_of_topics_the_caller_may_describe() -> None:
    """As OffsetFetch: a viewer allowed the group but not a topic saw that topic's committed offsets and
    lag in DescribeGroups (and on the console), found by an audit."""
    import types

    from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
    from broker.group_state import OffsetEntry
    from broker.principal import AUTH_SASL, Authentication
    from broker.sasl import Principal
    from broker.security import is_node_principal
    from client.types import TopicPartition
    from metadata_quorum.security import acl_binding

    no_leaders = types.SimpleNamespace(partition=lambda topic, partition: None)  # end offsets unknown: fine here
    coord = GroupCoordinator(node_id=1, replica_manager=None, metadata_cache=no_leaders, config=CoordinatorConfig())
    coord._partitions[coord.partition_for("watched")] = _PartitionLoad(leader_epoch=0, loaded=True)
    g = Group("watched", state=GroupState.EMPTY)
    for topic in ("public", "secret-payroll"):
        g.offsets[TopicPartition(topic, 0)] = OffsetEntry(2, -1, "", 0)
    coord._groups["watched"] = g
    acls = AclIndex(acl_binding(list(a)) for a in (
        ("GROUP", "watched", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW"),
        ("TOPIC", "public", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW")))
    authorizer = Authorizer(AuthorizerConfig(True, frozenset(), False), lambda: acls, is_node_principal)
    servicer = GroupCoordinatorServicer(coord, authorizer=authorizer)
    alice = types.SimpleNamespace(brook_authentication=Authentication(Principal("User", "alice"), AUTH_SASL,
                                                                      "kafka:10.0.0.9"))
    try:
        out = servicer._describe_groups(group_pb2.DescribeGroupsRequest(group_ids=["watched"], include_offsets=True),
                                        alice, held=_DescribeBytes(coord))
        assert out.groups[0].error_code == ErrorCode.NONE, out.groups[0]
        assert {o.topic for o in out.groups[0].offsets} == {"public"}, out.groups[0].offsets
    finally:
        coord._loader.shutdown()


def test_listings_hold_their_bytes_with_the_descriptions_until_written_out() -> None:
    """A ListGroups answer was built with no bound on the bytes in flight: 100 of them over 38,000 groups, from
    clients that did not read their answers, took a node from 215 MB to 2 GB, and got it fenced (audit)."""
    from broker.group_service import LISTED_GROUP_BYTES

    coord, servicer = _coordinator()
    try:
        for i in range(2000):
            gid = f"listed-{i:04d}-" + "x" * 1000
            coord._partitions[coord.partition_for(gid)] = _PartitionLoad(leader_epoch=0, loaded=True)
            coord._groups[gid] = Group(gid, protocol_type="consumer")
        listing = sum(len(g) + len("consumer") + LISTED_GROUP_BYTES for g in coord._groups if g != "big") \
            + len("big") + len("connect") + LISTED_GROUP_BYTES
        describing = [_DescribeBytes(coord) for _ in range(3)]
        for held_by, ids in zip(describing, (4, 4, 1), strict=True):  # 63 MiB of descriptions being built
            assert _describe(servicer, held_by, ids) == [ErrorCode.NONE] * ids
        held = _DescribeBytes(coord)
        out = servicer._list_groups(group_pb2.ListGroupsRequest(), None, held=held)
        assert out.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and "retry" in out.error_message, out
        assert not out.groups and coord._describing_bytes == 9 * DESCRIBED
        for held_by in describing:
            held_by.release()
        out = servicer._list_groups(group_pb2.ListGroupsRequest(), None, held=held)
        assert out.error_code == ErrorCode.NONE and len(out.groups) == 2001
        assert coord._describing_bytes == listing  # held until its answer is written out
        held.release()
        assert coord._describing_bytes == 0
    finally:
        coord._loader.shutdown()
