"""Partition reassignment in the metadata state machine: start, redirect, cancel, complete."""

from __future__ import annotations

from test_state import cluster, create, fence, part

from metadata_quorum import commands as c
from metadata_quorum import features
from metadata_quorum.state import MetadataState
from proto.errors import ErrorCode


def isr_add(s: MetadataState, name: str, broker: int) -> None:
    p = part(s, name)
    result = s.apply(c.ChangePartition([c.PartitionChangeItem(name, 0, p.partition_epoch, p.leader_epoch,
                                                              p.isr + [broker])], p.leader,
                                       s.brokers[p.leader].broker_epoch))
    assert result.ok and result.value[0].error_code == ErrorCode.NONE, result


def test_a_move_adds_then_removes_and_moves_the_leader_last() -> None:
    s = cluster(4)
    create(s, "t", [[1, 2]])
    p = part(s, "t")
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [3, 4])).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.isr, p.leader) == ([3, 4, 1, 2], [3, 4], [1, 2], [1, 2], 1)
    # Not in sync yet: completing is refused and changes nothing.
    refused = s.apply(c.CompleteReassignment("t", 0, p.partition_epoch))
    assert not refused.ok and "not in sync" in refused.error_message
    isr_add(s, "t", 3)
    isr_add(s, "t", 4)
    p = part(s, "t")
    epoch = p.leader_epoch
    assert s.apply(c.CompleteReassignment("t", 0, p.partition_epoch)).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.isr, p.leader) == ([3, 4], [], [], [3, 4], 3)
    assert p.leader_epoch == epoch + 1
    # The snapshot round-trips the finished and the in-progress forms alike.
    assert MetadataState.from_snapshot(s.to_snapshot()) == s


def test_cancel_redirect_and_refusals() -> None:
    s = cluster(4)
    create(s, "t", [[1, 2]])
    p = part(s, "t")
    for target, code in (([1], ErrorCode.INVALID_REPLICATION_FACTOR), ([3, 3], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                         ([3, 9], ErrorCode.INVALID_REPLICA_ASSIGNMENT)):
        r = s.apply(c.AlterReassignment("t", 0, p.partition_epoch, target))
        assert r.error_code == code, (target, r)
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, None)).error_code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch + 1, [3, 4])).error_code == \
        ErrorCode.INVALID_UPDATE_VERSION
    assert part(s, "t").partition_epoch == p.partition_epoch  # refused: nothing changed
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [3, 4])).ok
    isr_add(s, "t", 3)
    # Redirect to [2, 1]-free target [4, 1]: 3 joined the ISR but leaves again; originals stay.
    p = part(s, "t")
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [4, 1])).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.isr) == ([4, 1, 2], [4], [2], [1, 2])
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, None)).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.isr, p.leader) == ([1, 2], [], [], [1, 2], 1)


def test_a_leader_that_joined_during_a_move_hands_over_when_the_move_is_redirected() -> None:
    s = cluster(4)
    create(s, "t", [[1, 2]])
    assert s.apply(c.AlterReassignment("t", 0, part(s, "t").partition_epoch, [3, 2])).ok
    isr_add(s, "t", 3)
    fence(s, 1)  # 1 dies: the first eligible ISR member in replica order [3, 2, 1] leads
    p = part(s, "t")
    assert p.leader == 3, p
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [4, 2])).ok
    p = part(s, "t")
    assert p.leader == 2 and 3 not in p.replicas and p.isr == [2], p


def test_dynamic_cluster_configs_validate_snapshot_and_reach_watchers() -> None:
    s = cluster(3)
    version = s.version
    for bad in ({"num.io.threads": "4"}, {"log.retention.ms": "soon"},
                {"follower.replication.throttled.rate": "0"}):
        r = s.apply(c.AlterClusterConfigs(bad))
        assert r.error_code == ErrorCode.INVALID_CONFIG, (bad, r)
    assert s.version == version  # refused: nothing changed
    assert s.apply(c.AlterClusterConfigs({"log.retention.ms": "1000", "follower.replication.throttled.rate": "5"})).ok
    delta = s.changes_since(version)
    assert delta is not None and delta.cluster_configs == {"log.retention.ms": "1000",
                                                           "follower.replication.throttled.rate": "5"}
    assert s.apply(c.AlterClusterConfigs(delete=["log.retention.ms"])).ok
    assert s.cluster_configs == {"follower.replication.throttled.rate": "5"}
    assert MetadataState.from_snapshot(s.to_snapshot()).cluster_configs == s.cluster_configs
    assert s.full_delta().cluster_configs == s.cluster_configs


def test_enabling_unclean_election_cluster_wide_elects_offline_partitions() -> None:
    s = cluster(2)
    create(s, "t", [[1, 2]])
    p = part(s, "t")
    assert s.apply(c.ChangePartition([c.PartitionChangeItem("t", 0, p.partition_epoch, p.leader_epoch, [1])], 1,
                                     s.brokers[1].broker_epoch)).ok
    fence(s, 1)
    assert part(s, "t").leader == -1
    assert s.apply(c.AlterClusterConfigs({"unclean.leader.election.enable": "true"})).ok
    assert part(s, "t").leader == 2 and part(s, "t").isr == [2]


def test_a_move_that_changes_the_replica_count_needs_level_5_then_grows_and_shrinks() -> None:
    """Kafka changes a replication factor by reassignment (longer or shorter replica lists). Below level 5 a
    release refuses it (a release before it would refuse it when applying it: the voters would diverge)."""
    s = cluster(4)
    create(s, "t", [[1]])
    create(s, "u", [[1, 2]])
    p = part(s, "t")
    refused = s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [1, 2, 3]))
    assert refused.error_code == ErrorCode.INVALID_REPLICATION_FACTOR, refused
    assert "brook.metadata.version 5" in refused.error_message and "from 1 to 3" in refused.error_message
    assert part(s, "t") == p  # refused: nothing changed
    assert s.apply(c.UpdateFeature(features.METADATA_VERSION, features.REPLICATION_FACTOR_CHANGE)).ok
    # Grow 1 -> 3: the new replicas join as followers, the partition keeps RF 1 until they are in sync.
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [1, 2, 3])).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.isr, p.leader, p.replication_factor) == \
        ([1, 2, 3], [2, 3], [], [1], 1, 1)
    isr_add(s, "t", 2)
    assert not s.apply(c.CompleteReassignment("t", 0, part(s, "t").partition_epoch)).ok  # 3 is not in sync
    isr_add(s, "t", 3)
    assert s.apply(c.CompleteReassignment("t", 0, part(s, "t").partition_epoch)).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.isr, p.leader, p.replication_factor) == \
        ([1, 2, 3], [], [], [1, 2, 3], 1, 3)
    # Shrink 3 -> 1 onto a follower: nothing to copy, the move completes at once and the leader moves.
    assert s.apply(c.AlterReassignment("t", 0, p.partition_epoch, [3])).ok
    p = part(s, "t")
    assert (p.replicas, p.adding, p.removing, p.replication_factor) == ([3, 1, 2], [], [1, 2], 3)
    assert s.apply(c.CompleteReassignment("t", 0, p.partition_epoch)).ok
    p = part(s, "t")
    assert (p.replicas, p.isr, p.leader, p.replication_factor) == ([3], [3], 3, 1)
    # A topic's partitions may now differ in replica count, as in Kafka; new partitions take partition 0's.
    create_more = s.apply(c.CreatePartitions("u", s.topics["u"].topic_id, 1, [[3, 4]]))
    assert create_more.ok, create_more
    assert s.apply(c.AlterReassignment("u", 1, part(s, "u", 1).partition_epoch, [3, 4, 1])).ok
    isr_add_at(s, "u", 1, 1)
    assert s.apply(c.CompleteReassignment("u", 1, part(s, "u", 1).partition_epoch)).ok
    assert [q.replication_factor for q in s.topics["u"].partitions] == [2, 3]
    # A target that empties the partition or repeats a broker is still refused.
    for target, code in (([], ErrorCode.INVALID_REPLICA_ASSIGNMENT), ([2, 2], ErrorCode.INVALID_REPLICA_ASSIGNMENT)):
        assert s.apply(c.AlterReassignment("u", 0, part(s, "u").partition_epoch, target)).error_code == code
    assert MetadataState.from_snapshot(s.to_snapshot()) == s


def isr_add_at(s: MetadataState, name: str, index: int, broker: int) -> None:
    p = part(s, name, index)
    result = s.apply(c.ChangePartition([c.PartitionChangeItem(name, index, p.partition_epoch, p.leader_epoch,
                                                              p.isr + [broker])], p.leader,
                                       s.brokers[p.leader].broker_epoch))
    assert result.ok and result.value[0].error_code == ErrorCode.NONE, result
