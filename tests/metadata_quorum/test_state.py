"""Scenario tests of MetadataState: pure, no clocks, no sockets.

Each test scripts a cluster step by step (register, unfence, create, fence, ...) and
checks leaders, ISRs and epochs after each step, in the style of etcd-raft's
scenario tests.
"""

from __future__ import annotations

import random

import pytest

from metadata_quorum import commands as c
from metadata_quorum.state import MetadataInvariantError, MetadataState
from proto.errors import ErrorCode


def cluster(brokers: int = 3, *, racks: list[str] | None = None) -> MetadataState:
    s = MetadataState()
    assert s.apply(c.ActivateController(node_id=100, term=1)).ok
    for b in range(1, brokers + 1):
        rack = racks[b - 1] if racks else ""
        epoch = s.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "127.0.0.1", 9000 + b]], rack)).value
        assert s.apply(c.UnfenceBroker(b, epoch)).ok
    return s


def epoch_of(s: MetadataState, b: int) -> int:
    return s.brokers[b].broker_epoch


def create(s: MetadataState, name: str, assignments: list[list[int]], configs: dict[str, str] | None = None,
           topic_id: str | None = None) -> None:
    result = s.apply(c.CreateTopic(name, topic_id or f"id-{name}", configs or {}, assignments))
    assert result.ok, result


def part(s: MetadataState, name: str, p: int = 0):  # type: ignore[no-untyped-def]
    return s.topics[name].partitions[p]


def fence(s: MetadataState, b: int) -> None:
    assert s.apply(c.FenceBroker(b, epoch_of(s, b))).ok


def unfence(s: MetadataState, b: int) -> None:
    assert s.apply(c.UnfenceBroker(b, epoch_of(s, b))).ok


# ---- topic creation ----
def test_create_topic_initial_leader_is_first_replica_and_isr_is_all_live() -> None:
    s = cluster(3)
    v = s.version
    create(s, "orders", [[2, 3, 1], [3, 1, 2]])
    assert s.version == v + 1
    p0 = part(s, "orders", 0)
    assert (p0.leader, p0.isr, p0.leader_epoch, p0.partition_epoch) == (2, [2, 3, 1], 0, 0)
    assert part(s, "orders", 1).leader == 3


def test_create_topic_with_a_fenced_replica_leaves_it_out_of_the_isr() -> None:
    s = cluster(3)
    fence(s, 1)
    create(s, "t", [[1, 2, 3]])
    p = part(s, "t")
    assert p.leader == 2 and p.isr == [2, 3], p


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "bad/name", "ünïcode"])
def test_invalid_topic_names_are_refused_and_change_nothing(name: str) -> None:
    s = cluster(1)
    before = s.to_snapshot()
    result = s.apply(c.CreateTopic(name, "id-x", {}, [[1]]))
    assert result.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION, result
    assert s.to_snapshot() == before


@pytest.mark.parametrize("name", ["a", "A.b_c-9", "x" * 249, "..."])
def test_valid_topic_names_are_accepted(name: str) -> None:
    s = cluster(1)
    assert s.apply(c.CreateTopic(name, "id-1", {}, [[1]])).ok


def test_duplicate_topic_and_bad_assignments_and_configs_are_refused() -> None:
    s = cluster(3)
    create(s, "t", [[1]])
    before = s.to_snapshot()
    cases = [
        (c.CreateTopic("t", "id-2", {}, [[1]]), ErrorCode.TOPIC_ALREADY_EXISTS),
        (c.CreateTopic("u", "id-t", {}, [[1]]), ErrorCode.INVALID_REQUEST),  # topic id reused
        (c.CreateTopic("u", "id-u", {}, []), ErrorCode.INVALID_PARTITIONS),
        (c.CreateTopic("u", "id-u", {}, [[1, 1]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (c.CreateTopic("u", "id-u", {}, [[1, 2], [3]]), ErrorCode.INVALID_REPLICATION_FACTOR),
        (c.CreateTopic("u", "id-u", {}, [[7]]), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        (c.CreateTopic("u", "id-u", {"retention.ms": "soon"}, [[1]]), ErrorCode.INVALID_CONFIG),
        (c.CreateTopic("u", "id-u", {"no.such.key": "1"}, [[1]]), ErrorCode.INVALID_CONFIG),
    ]
    for cmd, code in cases:
        result = s.apply(cmd)
        assert result.error_code == code, (cmd, result)
    assert s.to_snapshot() == before


# ---- fencing and elections ----
def test_fencing_the_leader_elects_the_next_in_sync_replica_and_bumps_epochs() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    fence(s, 1)
    p = part(s, "t")
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (2, [2, 3], 1, 1), p
    assert s.brokers[1].fenced


def test_fencing_a_follower_shrinks_the_isr_without_a_leader_change() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    fence(s, 3)
    p = part(s, "t")
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (1, [1, 2], 0, 1), p


def test_fencing_the_last_isr_member_takes_the_partition_offline_and_keeps_it_in_the_isr() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2]])
    fence(s, 2)
    fence(s, 1)
    p = part(s, "t")
    assert (p.leader, p.isr) == (-1, [1]), p
    assert s.offline_partitions() == 1
    # The out-of-sync replica 2 returns: unclean election is off, so it stays offline.
    unfence(s, 2)
    assert part(s, "t").leader == -1
    # The last in-sync replica returns: clean election.
    unfence(s, 1)
    p = part(s, "t")
    assert (p.leader, p.isr) == (1, [1]), p
    assert s.offline_partitions() == 0


def test_unclean_election_only_where_the_topic_allows_it() -> None:
    s = cluster(3)
    create(s, "clean", [[1, 2]])
    create(s, "dirty", [[1, 2]], {"unclean.leader.election.enable": "true"})
    fence(s, 2)  # both: ISR [1]
    fence(s, 1)  # both offline, ISR kept [1]
    unfence(s, 2)
    assert part(s, "clean").leader == -1
    p = part(s, "dirty")
    assert (p.leader, p.isr) == (2, [2]), p


def test_enabling_unclean_election_on_a_topic_elects_its_offline_partitions() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2]])
    fence(s, 2)
    fence(s, 1)
    unfence(s, 2)
    assert part(s, "t").leader == -1
    assert s.apply(c.AlterConfigs("t", "id-t", {"unclean.leader.election.enable": "true"})).ok
    assert (part(s, "t").leader, part(s, "t").isr) == (2, [2])


def test_cluster_default_for_unclean_election_comes_from_the_activation_command() -> None:
    s = cluster(2)
    assert s.apply(c.ActivateController(100, 2, unclean_leader_election_default=True)).ok
    create(s, "t", [[1, 2]])
    fence(s, 2)
    fence(s, 1)
    unfence(s, 2)
    assert part(s, "t").leader == 2


def test_controlled_shutdown_moves_leaderships_away() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3], [2, 1, 3], [1, 3, 2]])
    assert s.leadership_count(1) == 2
    result = s.apply(c.BeginControlledShutdown(1, epoch_of(s, 1)))
    assert result.ok and result.value == 0, result
    assert s.leadership_count(1) == 0
    assert [part(s, "t", i).leader for i in range(3)] == [2, 2, 3]
    assert all(1 not in part(s, "t", i).isr for i in range(3))
    # A broker in controlled shutdown may not join an ISR again.
    p = part(s, "t", 0)
    bad = s.apply(c.ChangePartition([c.PartitionChangeItem("t", 0, p.partition_epoch, p.leader_epoch,
                                                          [2, 3, 1])], broker_id=2, broker_epoch=epoch_of(s, 2)))
    assert bad.value[0].error_code == ErrorCode.INELIGIBLE_REPLICA


def test_new_incarnation_of_a_live_broker_drops_it_from_isrs() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    old_epoch = epoch_of(s, 1)
    result = s.apply(c.RegisterBroker(1, "inc-1-restarted", [["BROKER", "127.0.0.1", 9001]]))
    assert result.ok and result.value > old_epoch
    assert s.brokers[1].fenced
    assert (part(s, "t").leader, part(s, "t").isr) == (2, [2, 3])
    # Retried registration of the same incarnation is idempotent.
    again = s.apply(c.RegisterBroker(1, "inc-1-restarted", [["BROKER", "127.0.0.1", 9001]]))
    assert again.value == result.value
    # The old incarnation's epoch is stale now.
    assert s.apply(c.UnfenceBroker(1, old_epoch)).error_code == ErrorCode.STALE_BROKER_EPOCH


# ---- ISR compare-and-set ----
def isr_change(s: MetadataState, leader: int, p, new_isr, *, partition_epoch=None, leader_epoch=None):  # type: ignore[no-untyped-def]
    item = c.PartitionChangeItem("t", 0, p.partition_epoch if partition_epoch is None else partition_epoch,
                                 p.leader_epoch if leader_epoch is None else leader_epoch, new_isr)
    result = s.apply(c.ChangePartition([item], broker_id=leader, broker_epoch=epoch_of(s, leader)))
    assert result.ok, result
    return result.value[0]


def test_isr_change_applies_with_current_partition_epoch_and_refuses_stale_ones() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    p = part(s, "t")
    first = isr_change(s, 1, p, [1, 2])
    assert first.error_code == ErrorCode.NONE
    assert (part(s, "t").isr, part(s, "t").partition_epoch, part(s, "t").leader_epoch) == ([1, 2], 1, 0)
    version = s.version
    stale = isr_change(s, 1, p, [1], partition_epoch=0)
    assert stale.error_code == ErrorCode.INVALID_UPDATE_VERSION, stale
    assert stale.state.partition_epoch == 1 and part(s, "t").isr == [1, 2]
    assert s.version == version  # a refused change is not a new version
    # Expand back with the current epoch.
    assert isr_change(s, 1, part(s, "t"), [1, 2, 3]).error_code == ErrorCode.NONE


def test_isr_change_with_an_old_leader_epoch_is_fenced() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    old = c.PartitionChangeItem("t", 0, 0, 0, [1, 2, 3])
    fence(s, 1)
    unfence(s, 1)
    # Broker 2 leads now with leader epoch 1; a proposal carrying epoch 0 is from the old reign.
    result = s.apply(c.ChangePartition([c.PartitionChangeItem("t", 0, part(s, "t").partition_epoch, 0, [2, 3])],
                                       broker_id=2, broker_epoch=epoch_of(s, 2)))
    assert result.value[0].error_code == ErrorCode.FENCED_LEADER_EPOCH
    # And the old leader, which is no longer leader, is refused too.
    result = s.apply(c.ChangePartition([old], broker_id=1, broker_epoch=epoch_of(s, 1)))
    assert result.value[0].error_code in (ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER)


def test_isr_change_validation() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    p = part(s, "t")
    for new_isr in ([], [2, 3], [1, 1], [1, 4]):
        r = isr_change(s, 1, p, new_isr)
        assert r.error_code == ErrorCode.INVALID_REQUEST, (new_isr, r)
    fence(s, 3)
    p = part(s, "t")
    r = isr_change(s, 1, p, [1, 2, 3])
    assert r.error_code == ErrorCode.INELIGIBLE_REPLICA, r
    # A follower cannot change the ISR.
    item = c.PartitionChangeItem("t", 0, p.partition_epoch, p.leader_epoch, [1, 2])
    r2 = s.apply(c.ChangePartition([item], broker_id=2, broker_epoch=epoch_of(s, 2)))
    assert r2.value[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # A stale broker epoch refuses the whole request.
    r3 = s.apply(c.ChangePartition([item], broker_id=1, broker_epoch=epoch_of(s, 1) - 1))
    assert r3.error_code == ErrorCode.STALE_BROKER_EPOCH


def test_preferred_leader_move_by_the_controller() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2, 3]])
    fence(s, 1)
    unfence(s, 1)
    p = part(s, "t")
    assert p.leader == 2
    # Leader 2 adds 1 back to the ISR; then the controller moves leadership to 1.
    isr_change(s, 2, p, [2, 3, 1])
    p = part(s, "t")
    r = s.apply(c.ChangePartition([c.PartitionChangeItem("t", 0, p.partition_epoch, new_leader=1)]))
    assert r.value[0].error_code == ErrorCode.NONE
    p = part(s, "t")
    assert (p.leader, p.leader_epoch) == (1, 2)


# ---- partitions, configs, delete ----
def test_partition_count_only_increases() -> None:
    s = cluster(3)
    create(s, "t", [[1, 2]])
    assert s.apply(c.CreatePartitions("t", "id-t", 1, [[2, 3], [3, 1]])).ok
    assert len(s.topics["t"].partitions) == 3
    assert part(s, "t", 2).leader == 3
    stale = s.apply(c.CreatePartitions("t", "id-t", 1, [[2, 3]]))
    assert stale.error_code == ErrorCode.INVALID_PARTITIONS
    wrong_rf = s.apply(c.CreatePartitions("t", "id-t", 3, [[2]]))
    assert wrong_rf.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert len(s.topics["t"].partitions) == 3


def test_alter_configs_set_and_delete() -> None:
    s = cluster(1)
    create(s, "t", [[1]], {"retention.ms": "1000"})
    assert s.apply(c.AlterConfigs("t", "id-t", {"cleanup.policy": "compact"}, ["retention.ms"])).ok
    assert s.topics["t"].configs == {"cleanup.policy": "compact"}
    bad = s.apply(c.AlterConfigs("t", "id-t", {"segment.bytes": "1"}))
    assert bad.error_code == ErrorCode.INVALID_CONFIG
    assert s.topics["t"].configs == {"cleanup.policy": "compact"}


def test_delete_topic_by_id_and_recreate() -> None:
    s = cluster(1)
    create(s, "t", [[1]], topic_id="old")
    assert s.apply(c.DeleteTopic("t", "wrong-id")).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    since = s.version
    assert s.apply(c.DeleteTopic("t", "old")).ok
    assert "t" not in s.topics and "old" not in s.topics_by_id
    create(s, "t", [[1]], topic_id="new")
    delta = s.changes_since(since)
    assert delta is not None
    assert delta.deleted_topic_ids == ["old"]
    assert [t.topic_id for t in delta.topics] == ["new"]


def test_producer_id_blocks_do_not_overlap() -> None:
    s = cluster(2)
    a = s.apply(c.AllocateProducerIds(1, epoch_of(s, 1), 1000)).value
    b = s.apply(c.AllocateProducerIds(2, epoch_of(s, 2), 1000)).value
    assert a == (0, 1000) and b == (1000, 1000)
    assert s.apply(c.AllocateProducerIds(2, 12345, 1000)).error_code == ErrorCode.STALE_BROKER_EPOCH


# ---- versions, deltas, snapshots, replay ----
def test_every_applied_command_bumps_the_version_and_refused_ones_do_not() -> None:
    s = MetadataState()
    assert s.version == 0
    s.apply(c.ActivateController(1, 1))
    assert s.version == 1
    s.apply(c.RegisterBroker(1, "a", [["BROKER", "h", 1]]))
    assert s.version == 2 and s.brokers[1].broker_epoch == 2
    s.apply(c.CreateTopic("..", "x", {}, [[1]]))
    assert s.version == 2


def test_changes_since_returns_current_values_and_snapshot_when_too_old() -> None:
    s = MetadataState(changelog_max_keys=50)
    s.apply(c.ActivateController(1, 1))
    s.apply(c.RegisterBroker(1, "a", [["BROKER", "h", 1]]))
    s.apply(c.UnfenceBroker(1, 2))
    v = s.version
    create(s, "t", [[1], [1]])
    fence(s, 1)
    delta = s.changes_since(v)
    assert delta is not None and not delta.is_snapshot and delta.version == s.version
    assert [b.node_id for b in delta.brokers] == [1] and delta.brokers[0].fenced
    assert sorted(i for _, i, _ in delta.partitions) == [0, 1]
    assert all(p.leader == -1 for _, _, p in delta.partitions)  # current values, not history
    assert s.changes_since(s.version).partitions == []
    unfence(s, 1)
    for i in range(30):  # push the early versions out of the 50-key window
        create(s, f"x{i}", [[1]])
    assert s.changes_since(v) is None
    assert s.changes_since(s.version - 1) is not None


def test_a_topics_request_id_goes_through_the_log_and_snapshots_and_older_forms_still_load() -> None:
    """The creating request's id (CreatableTopic.request_id) is how a controller answers a retried
    CreateTopics as done after a failover: it must reach every voter and survive a snapshot."""
    s = cluster(3)
    cmd = c.CreateTopic("t", "id-t", {}, [[1, 2]], "req-1")
    replica = cluster(3)
    assert s.apply(c.to_dict(cmd)).ok and replica.apply(c.to_dict(cmd)).ok
    assert s.topics["t"].request_id == replica.topics["t"].request_id == "req-1"
    create(s, "u", [[1]])  # no request id
    snap = s.to_snapshot()
    restored = MetadataState.from_snapshot(snap)
    assert restored == s and restored.topics["t"].request_id == "req-1" and restored.topics["u"].request_id == ""
    # A command and a snapshot written before the field existed.
    old_cmd = {k: v for k, v in c.to_dict(c.CreateTopic("v", "id-v", {}, [[1]])).items() if k != "request_id"}
    assert s.apply(old_cmd).ok and s.topics["v"].request_id == ""
    old_snap = {**snap, "topics": [t[:4] for t in snap["topics"]]}
    assert MetadataState.from_snapshot(old_snap).topics["t"].request_id == ""
    assert not s.apply({**c.to_dict(cmd), "name": "w", "topic_id": "id-w", "request_id": 7}).ok  # typed


def test_snapshot_round_trip_equals_the_original() -> None:
    s = cluster(3, racks=["a", "b", "c"])
    create(s, "t", [[1, 2, 3], [2, 3, 1]], {"retention.ms": "5"})
    fence(s, 2)
    s.apply(c.AllocateProducerIds(1, epoch_of(s, 1), 10))
    snap = s.to_snapshot()
    restored = MetadataState.from_snapshot(snap)
    assert restored == s
    assert restored.to_snapshot() == snap
    assert restored.topics_by_collision_key == s.topics_by_collision_key == {"t": {"t"}}  # derived, not stored
    # And it keeps working identically afterwards.
    for state in (s, restored):
        unfence(state, 2)
    assert restored == s


def random_commands(seed: int, count: int) -> list[c.Command]:
    """A reproducible mix of valid and invalid commands."""
    rng = random.Random(seed)
    cmds: list[c.Command] = [c.ActivateController(1, 1)]
    for b in range(1, 5):
        cmds.append(c.RegisterBroker(b, f"i{b}", [["BROKER", "h", b]]))
    for _ in range(count):
        b = rng.randint(1, 4)
        kind = rng.randrange(6)
        if kind == 0:
            cmds.append(c.UnfenceBroker(b, rng.randint(1, 8)))
        elif kind == 1:
            cmds.append(c.FenceBroker(b, rng.randint(1, 8)))
        elif kind == 2:
            name = f"t{rng.randrange(5)}"
            cmds.append(c.CreateTopic(name, f"id{rng.randrange(1000)}", {},
                                      [rng.sample(range(1, 5), 2) for _ in range(rng.randint(1, 3))]))
        elif kind == 3:
            cmds.append(c.DeleteTopic(f"t{rng.randrange(5)}", ""))
        elif kind == 4:
            cmds.append(c.ChangePartition([c.PartitionChangeItem(f"t{rng.randrange(5)}", 0, rng.randrange(3),
                                                                 -1, None, rng.randint(1, 4))]))
        else:
            cmds.append(c.RegisterBroker(b, f"i{b}-{rng.randrange(3)}", [["BROKER", "h", b]]))
    return cmds


def test_replaying_the_same_commands_gives_the_same_state_and_results() -> None:
    cmds = random_commands(seed=7, count=400)
    a, b = MetadataState(), MetadataState()
    results_a = [a.apply(cmd) for cmd in cmds]
    # The second replica receives the log's wire form, as the quorum delivers it.
    results_b = [b.apply(c.to_dict(cmd)) for cmd in cmds]
    assert [(r.error_code, r.error_message) for r in results_a] == \
           [(r.error_code, r.error_message) for r in results_b]
    assert a == b
    assert a.version > 10 and a.version < len(cmds)  # some applied, some refused


def test_restore_midway_then_replay_the_rest_matches_a_full_replay() -> None:
    cmds = random_commands(seed=11, count=200)
    full = MetadataState()
    for cmd in cmds:
        full.apply(cmd)
    half = MetadataState()
    for cmd in cmds[:100]:
        half.apply(cmd)
    resumed = MetadataState.from_snapshot(half.to_snapshot())
    for cmd in cmds[100:]:
        resumed.apply(cmd)
    assert resumed == full


def test_malformed_wire_commands_are_refused() -> None:
    s = cluster(1)
    before = s.to_snapshot()
    for payload in ({"type": "CreateTopic", "name": "t"}, "not a dict",
                    {"type": "CreateTopic", "name": "t", "topic_id": "i", "configs": {}, "assignments": 5},
                    {"type": "RegisterBroker", "node_id": 1, "incarnation_id": "z", "endpoints": [["x"]]}):
        result = s.apply(payload)  # type: ignore[arg-type]
        assert result.error_code == ErrorCode.INVALID_REQUEST, (payload, result)
    assert s.to_snapshot() == before


@pytest.mark.parametrize("payload", [{"type": "Nope"}, {**c.to_dict(c.UnregisterBroker(1)), "since": 3}])
def test_a_command_of_a_newer_release_stops_the_voter_instead_of_being_skipped(payload: dict) -> None:
    """A type or field this release does not know was written by a newer one: refused here and applied by the
    voters that know it, the metadata would silently differ. The voter stops (MetadataRaft halts it), as Kafka's
    controller stops on a record it cannot read."""
    s = cluster(1)
    before = s.to_snapshot()
    with pytest.raises(MetadataInvariantError, match="written by a newer release"):
        s.apply(payload)
    assert s.to_snapshot() == before


def test_commands_from_a_replaced_controller_epoch_are_refused() -> None:
    s = cluster(2)  # activated in term 1
    assert s.apply(c.ActivateController(200, 3)).ok
    before = s.to_snapshot()
    stale = s.apply(c.CreateTopic("t", "id-t", {}, [[1]]), controller_epoch=1)
    assert stale.error_code == ErrorCode.NOT_CONTROLLER, stale
    # A deposed leader's activation forwarded late must not roll the epoch back.
    assert s.apply(c.ActivateController(100, 2)).error_code == ErrorCode.NOT_CONTROLLER
    assert s.to_snapshot() == before
    assert s.apply(c.CreateTopic("t", "id-t", {}, [[1]]), controller_epoch=3).ok
    assert s.active_controller_id == 200 and s.controller_epoch == 3


# ---- a broker back on an empty disk ----
def _last_isr_member_gone(s: MetadataState) -> None:
    """orders-0 on [1, 2, 3]: broker 3 then 1 fenced, then 2, the last in-sync replica: offline, ISR [2]."""
    create(s, "orders", [[1, 2, 3]])
    for b in (3, 1, 2):
        fence(s, b)
    assert (part(s, "orders").leader, part(s, "orders").isr) == (-1, [2])


def test_the_last_isr_member_back_on_an_empty_disk_leaves_the_isr_and_is_not_elected() -> None:
    """A broker that registers with new log directories (storage_created: its disk was replaced or wiped) has
    none of the records it had. Left as the last ISR member, the next clean election made its empty log the
    partition's and the other replicas truncated to it: every acknowledged record gone (a liveness audit,
    on a real cluster). It now leaves the ISR, the last place included: the partition stays offline."""
    s = cluster(3)
    _last_isr_member_gone(s)
    epoch = s.apply(c.RegisterBroker(2, "inc-2b", [["BROKER", "127.0.0.1", 9002]], "", 0, True)).value
    assert (part(s, "orders").leader, part(s, "orders").isr) == (-1, [])
    assert s.brokers[2].storage_created and s.storage_created_ids() == {2}
    assert s.apply(c.UnfenceBroker(2, epoch)).ok
    for b in (1, 3):
        again = s.apply(c.RegisterBroker(b, f"inc-{b}b", [["BROKER", "127.0.0.1", 9000 + b]], "")).value
        assert s.apply(c.UnfenceBroker(b, again)).ok
    assert (part(s, "orders").leader, part(s, "orders").isr) == (-1, []), "no clean leader: offline"
    # Without the flag (its disk kept its log), the last member comes back and leads, as before.
    t = cluster(3)
    _last_isr_member_gone(t)
    assert t.apply(c.UnfenceBroker(2, t.apply(c.RegisterBroker(2, "inc-2b", [["BROKER", "127.0.0.1", 9002]],
                                                                 "")).value)).ok
    assert (part(t, "orders").leader, part(t, "orders").isr) == (2, [2])


def test_an_unclean_election_takes_a_replica_that_kept_its_log_first() -> None:
    s = cluster(3)
    create(s, "orders", [[2, 1, 3]], {"unclean.leader.election.enable": "false"})
    for b in (3, 1, 2):
        fence(s, b)
    epoch = s.apply(c.RegisterBroker(2, "inc-2b", [["BROKER", "127.0.0.1", 9002]], "", 0, True)).value
    assert s.apply(c.UnfenceBroker(2, epoch)).ok
    again = s.apply(c.RegisterBroker(1, "inc-1b", [["BROKER", "127.0.0.1", 9001]], "")).value
    assert s.apply(c.UnfenceBroker(1, again)).ok
    assert part(s, "orders").leader == -1
    # The topic now allows unclean elections: broker 1 (first in order after the empty-disk broker 2) leads.
    assert s.apply(c.AlterConfigs("orders", "id-orders", {"unclean.leader.election.enable": "true"})).ok
    assert (part(s, "orders").leader, part(s, "orders").isr) == (1, [1])


def test_the_storage_flag_survives_snapshots_and_old_forms_read_as_false() -> None:
    s = cluster(2)
    s.apply(c.RegisterBroker(2, "inc-2b", [["BROKER", "127.0.0.1", 9002]], "", 0, True))
    again = MetadataState.from_snapshot(s.to_snapshot())
    assert again.brokers[2].storage_created and not again.brokers[1].storage_created
    assert again.to_snapshot() == s.to_snapshot()
    old = s.to_snapshot()
    old["brokers"] = [b[:7] for b in old["brokers"]]  # a snapshot written before the capacity and the flag
    assert not MetadataState.from_snapshot(old).brokers[2].storage_created
    cmd = c.to_dict(c.RegisterBroker(3, "inc-3", [["BROKER", "h", 1]], "", 0, True))
    del cmd["storage_created"]  # a journal entry written before the field existed
    assert c.from_dict(cmd).storage_created is False


def test_commands_leave_default_fields_out_of_the_journal() -> None:
    """A field added in a later release reaches the journal only when a command uses it: voters of the release
    before refuse fields they do not know, and would skip every RegisterBroker of a mixed-version quorum."""
    plain = c.to_dict(c.RegisterBroker(3, "inc-3", [["BROKER", "h", 1]], ""))
    assert "storage_created" not in plain and "partition_capacity" not in plain and "rack" not in plain
    assert c.from_dict(plain) == c.RegisterBroker(3, "inc-3", [["BROKER", "h", 1]], "")
    flagged = c.to_dict(c.RegisterBroker(3, "inc-3", [["BROKER", "h", 1]], "", 0, True))
    assert flagged["storage_created"] is True and c.from_dict(flagged).storage_created


def test_a_broker_unknown_to_the_controller_back_on_an_empty_disk_leaves_the_isrs_too() -> None:
    s = cluster(3)
    _last_isr_member_gone(s)
    del s.brokers[2]  # as if unregistered while still named in an ISR (the controller refuses that today)
    s.apply(c.RegisterBroker(2, "inc-2b", [["BROKER", "127.0.0.1", 9002]], "", 0, True))
    assert (part(s, "orders").leader, part(s, "orders").isr) == (-1, [])
