"""Per-broker partition-replica capacity (README draft: notes/s45/readme_capacity.md).

A broker reports at registration how many partition replicas it may hold (its descriptor limit / 12,
lowered by ``max.partitions.per.broker``); the active controller places no more on it and refuses
CreateTopics, CreatePartitions and AlterPartitionReassignments that would (POLICY_VIOLATION, naming the
broker, its capacity and its count) before proposing anything, and the state machine refuses the same
when it applies (two requests planned at once). A journal or snapshot written before capacities existed
replays as unbounded.

- placement: pure ``place_replicas`` with capacities;
- state: apply / replay / snapshot, no sockets;
- controller: one real voter (pysyncobj on loopback) and its QuorumController, ticked by the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from quorum_helpers import single_voter

from metadata_quorum import commands as c
from metadata_quorum.controller import ControllerConfig, QuorumController
from metadata_quorum.placement import BrokerLoad, place_replicas
from metadata_quorum.state import MetadataState
from proto import common_pb2, errors
from proto import controller_pb2 as pb
from proto.errors import ErrorCode
from storage import fd_budget

# ---- the capacity formula ----


def test_capacity_is_a_twelfth_of_the_limit_lowered_by_the_config() -> None:
    partition_capacity_for, minimum_descriptors_for = fd_budget.partition_capacity_for, fd_budget.minimum_descriptors_for
    assert partition_capacity_for(20_000) == 1_666  # half for segments, 3 descriptors each, 2 segments a partition
    assert partition_capacity_for(2_000) == 166
    assert partition_capacity_for(5) == 1  # never 0 (0 means unbounded on the wire)
    assert partition_capacity_for(None) == 0  # no descriptor limit: unbounded
    assert partition_capacity_for(20_000, 500) == 500
    assert partition_capacity_for(20_000, 5_000) == 1_666  # the config only lowers
    assert partition_capacity_for(None, 500) == 500
    assert minimum_descriptors_for(1_666) <= 20_000 < minimum_descriptors_for(1_667)


def test_startup_check_names_the_limit_and_the_figure_needed() -> None:
    check_startup_descriptors, DescriptorLimitError = fd_budget.check_startup_descriptors, fd_budget.DescriptorLimitError
    check_startup_descriptors(500, 500, 2_000)  # 1,500 descriptors: within 3/4 of 2,000
    with pytest.raises(DescriptorLimitError) as info:
        check_startup_descriptors(600, 600, 2_000)
    assert info.value.limit == 2_000 and info.value.needed == 2_400
    assert "limit of 2000" in info.value.message and "at least 2400" in info.value.message
    check_startup_descriptors(10**6, 10**6, None)  # unlimited


# ---- placement ----


def test_placement_skips_full_brokers() -> None:
    loads = [BrokerLoad(1, replicas=10, capacity=10), BrokerLoad(2, replicas=0, capacity=100),
             BrokerLoad(3, replicas=0)]
    assignments = place_replicas(loads, 20, 2, start_index=7)
    assert all(1 not in replicas for replicas in assignments), assignments
    assert sorted({b for r in assignments for b in r}) == [2, 3]


def test_placement_fills_a_broker_up_to_its_capacity_and_not_further() -> None:
    loads = [BrokerLoad(1, replicas=8, capacity=10), BrokerLoad(2), BrokerLoad(3)]
    assignments = place_replicas(loads, 2, 3, start_index=0)  # RF 3 of 3: every partition names broker 1
    assert all(1 in r for r in assignments)
    with pytest.raises(errors.PolicyViolationError) as info:
        place_replicas(loads, 3, 3, start_index=0)  # the third partition would be broker 1's 11th replica
    # What it holds now, and what the request would make it hold (before, the second alone, as if it held it).
    assert "broker 1 holds 8 of its capacity of 10, and would hold 10 with this request's" in info.value.message
    assert "replication factor 3" in info.value.message


def test_placement_refuses_when_fewer_than_rf_brokers_have_room() -> None:
    loads = [BrokerLoad(1, replicas=5, capacity=5), BrokerLoad(2, replicas=7, capacity=7), BrokerLoad(3)]
    place_replicas(loads, 4, 1)  # broker 3 has room for RF 1
    with pytest.raises(errors.PolicyViolationError) as info:
        place_replicas(loads, 1, 2)
    msg = info.value.message
    assert "1 of the 3 live brokers" in msg
    assert "broker 1 holds 5 of its capacity of 5" in msg and "broker 2 holds 7 of its capacity of 7" in msg


def test_placement_without_capacities_is_unchanged() -> None:
    loads = [BrokerLoad(b, replicas=b) for b in (1, 2, 3)]
    capped = [BrokerLoad(b, replicas=b, capacity=1_000) for b in (1, 2, 3)]
    assert place_replicas(loads, 12, 2, start_index=3) == place_replicas(capped, 12, 2, start_index=3)


# ---- state: apply, replay, snapshots ----


def _cluster(capacities: dict[int, int]) -> MetadataState:
    s = MetadataState()
    assert s.apply(c.ActivateController(node_id=100, term=1)).ok
    for b, capacity in capacities.items():
        epoch = s.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "127.0.0.1", 9000 + b]], "", capacity)).value
        assert s.apply(c.UnfenceBroker(b, epoch)).ok
    return s


def test_state_records_the_capacity_and_refuses_past_it_changing_nothing() -> None:
    s = _cluster({1: 2, 2: 0})
    assert s.brokers[1].partition_capacity == 2 and s.brokers[2].partition_capacity == 0
    assert s.apply(c.CreateTopic("a", "id-a", {}, [[1, 2], [2, 1]])).ok
    before, version = s.to_snapshot(), s.version
    r = s.apply(c.CreateTopic("b", "id-b", {}, [[1, 2]]))
    assert r.error_code == ErrorCode.POLICY_VIOLATION
    assert "broker 1" in r.error_message and "capacity of 2" in r.error_message and "holds 2" in r.error_message
    r = s.apply(c.CreatePartitions("a", "id-a", 2, [[1, 2]]))
    assert r.error_code == ErrorCode.POLICY_VIOLATION
    assert s.to_snapshot() == before and s.version == version
    assert s.apply(c.CreateTopic("c", "id-c", {}, [[2]] * 50)).ok  # broker 2 is unbounded


def test_state_refuses_a_reassignment_onto_a_full_broker() -> None:
    s = _cluster({1: 0, 2: 0, 3: 1})
    assert s.apply(c.CreateTopic("a", "id-a", {}, [[1, 2], [1, 3]])).ok
    epoch = s.topics["a"].partitions[0].partition_epoch
    r = s.apply(c.AlterReassignment("a", 0, epoch, [3, 2]))  # broker 3 holds 1 of 1
    assert r.error_code == ErrorCode.POLICY_VIOLATION and "broker 3" in r.error_message
    assert not s.topics["a"].partitions[0].reassigning
    # A move among brokers the partition names already adds nothing.
    epoch1 = s.topics["a"].partitions[1].partition_epoch
    assert s.apply(c.AlterReassignment("a", 1, epoch1, [3, 1])).ok


def test_a_lowered_capacity_keeps_what_is_there_and_takes_nothing_more() -> None:
    s = _cluster({1: 0})
    assert s.apply(c.CreateTopic("a", "id-a", {}, [[1]] * 5)).ok
    # The broker restarts with a lower limit: it re-registers with capacity 3 while holding 5.
    epoch = s.apply(c.RegisterBroker(1, "inc-1b", [["BROKER", "127.0.0.1", 9001]], "", 3)).value
    assert s.apply(c.UnfenceBroker(1, epoch)).ok
    assert len(s.topics["a"].partitions) == 5
    r = s.apply(c.CreateTopic("b", "id-b", {}, [[1]]))
    assert r.error_code == ErrorCode.POLICY_VIOLATION and "holds 5 of its capacity of 3" in r.error_message


def test_negative_capacity_is_malformed() -> None:
    s = MetadataState()
    r = s.apply(c.RegisterBroker(1, "i", [["BROKER", "h", 1]], "", -1))
    assert r.error_code == ErrorCode.INVALID_REQUEST


def test_journal_written_before_capacities_replays_unbounded() -> None:
    """Journal entries are ``commands.to_dict`` dicts; an older release's RegisterBroker has no
    ``partition_capacity`` key. Replayed, the broker is unbounded and every later entry applies as before."""
    old_journal = [
        c.to_dict(c.ActivateController(node_id=100, term=1)),
        {k: v for k, v in c.to_dict(c.RegisterBroker(1, "i1", [["BROKER", "h", 1]])).items()
         if k != "partition_capacity"},
        c.to_dict(c.UnfenceBroker(1, 2)),
        *[c.to_dict(c.CreateTopic(f"t{i}", f"id-{i}", {}, [[1]] * 50)) for i in range(40)],  # 2,000 replicas
    ]
    assert "partition_capacity" not in old_journal[1]
    s = MetadataState()
    for entry in old_journal:
        assert s.apply(entry).ok, entry
    assert s.brokers[1].partition_capacity == 0 and s.replica_count(1) == 2_000
    snap = s.to_snapshot()
    assert len(snap["brokers"][0]) == 7  # an unbounded broker is written as before
    assert MetadataState.from_snapshot(snap) == s


def test_snapshot_written_before_capacities_restores_unbounded_and_new_ones_round_trip() -> None:
    s = _cluster({1: 7, 2: 0})
    assert s.apply(c.CreateTopic("a", "id-a", {}, [[1, 2]])).ok
    snap = s.to_snapshot()
    assert snap["brokers"][0][7:] == [7] and len(snap["brokers"][1]) == 7
    restored = MetadataState.from_snapshot(snap)
    assert restored == s and restored.brokers[1].partition_capacity == 7
    old = {**snap, "brokers": [entry[:7] for entry in snap["brokers"]]}  # an older release's snapshot
    from_old = MetadataState.from_snapshot(old)
    assert from_old.brokers[1].partition_capacity == 0
    assert from_old.apply(c.CreateTopic("b", "id-b", {}, [[1, 2]] * 20)).ok


# ---- the active controller ----


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuorumController]:
    with single_voter(tmp_path_factory.mktemp("capacity"), ControllerConfig(1, "capacity")) as ctl:
        yield ctl


def _register(ctl: QuorumController, broker: int, capacity: int, incarnation: str = "") -> None:
    r = ctl.register_broker(pb.RegisterBrokerRequest(
        node_id=broker, incarnation_id=incarnation or f"i{broker}", cluster_id="capacity",
        endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + broker)],
        partition_capacity=capacity), 30)
    ctl.heartbeat(pb.BrokerHeartbeatRequest(node_id=broker, broker_epoch=r.broker_epoch,
                                            current_metadata_version=1 << 40), 30)


def _proposing(ctl: QuorumController, fn):  # type: ignore[no-untyped-def]
    """(fn's answer, the commands it proposed)."""
    proposed: list[object] = []
    submit = ctl._submit
    ctl._submit = lambda cmd: (proposed.append(cmd), submit(cmd))[1]  # type: ignore[method-assign]
    try:
        return fn(), proposed
    finally:
        del ctl._submit


def _topic(name: str, partitions: int = 1, rf: int = 1, assignments: list[list[int]] | None = None
           ) -> pb.CreatableTopic:
    if assignments:
        return pb.CreatableTopic(name=name, assignments=[pb.ReplicaList(replicas=r) for r in assignments])
    return pb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf)


def _count(ctl: QuorumController, broker: int) -> int:
    return ctl.raft.read(lambda s: s.replica_count(broker))


def test_controller_places_within_capacities_and_refuses_past_them(controller: QuorumController) -> None:
    ctl = controller
    _register(ctl, 1, 4)
    _register(ctl, 2, 6)
    _register(ctl, 3, 0)  # an older broker: unbounded
    assert ctl.raft.read(lambda s: [s.brokers[b].partition_capacity for b in (1, 2, 3)]) == [4, 6, 0]

    # One request of several topics: the later ones see the earlier ones' replicas.
    answer, proposed = _proposing(ctl, lambda: ctl.create_topics(pb.CreateTopicsRequest(
        topics=[_topic(f"cap-{i}", 2, 3) for i in range(3)]), 30))
    codes = [r.error_code for r in answer.results]
    assert codes == [ErrorCode.NONE, ErrorCode.NONE, ErrorCode.POLICY_VIOLATION], answer
    msg = answer.results[2].error_message
    assert "broker 1 holds 4 of its capacity of 4" in msg, msg
    assert len(proposed) == 2
    assert (_count(ctl, 1), _count(ctl, 2), _count(ctl, 3)) == (4, 4, 4)
    assert ctl.raft.read(lambda s: "cap-2" not in s.topics)  # nothing half-created

    # RF 2 still fits on brokers 2 and 3; broker 1 is skipped by placement.
    answer = ctl.create_topics(pb.CreateTopicsRequest(topics=[_topic("cap-rf2", 2, 2)]), 30)
    assert answer.results[0].error_code == ErrorCode.NONE, answer
    replicas = ctl.raft.read(lambda s: [list(p.replicas) for p in s.topics["cap-rf2"].partitions])
    assert all(1 not in r for r in replicas), replicas
    assert _count(ctl, 2) == 6

    # Explicit assignments naming a full broker: refused before proposing, naming it.
    answer, proposed = _proposing(ctl, lambda: ctl.create_topics(pb.CreateTopicsRequest(
        topics=[_topic("cap-explicit", assignments=[[3, 1]])]), 30))
    assert answer.results[0].error_code == ErrorCode.POLICY_VIOLATION and proposed == []
    assert "broker 1" in answer.results[0].error_message and "capacity of 4" in answer.results[0].error_message
    answer = ctl.create_topics(pb.CreateTopicsRequest(topics=[_topic("cap-explicit", assignments=[[3]])]), 30)
    assert answer.results[0].error_code == ErrorCode.NONE

    # CreatePartitions: auto placement for RF 3 needs broker 1 (full); explicit naming broker 2 (full).
    answer, proposed = _proposing(ctl, lambda: ctl.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="cap-0", count=3)]), 30))
    assert answer.results[0].error_code == ErrorCode.POLICY_VIOLATION and proposed == [], answer
    answer, proposed = _proposing(ctl, lambda: ctl.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="cap-rf2", count=3,
                                         assignments=[pb.ReplicaList(replicas=[3, 2])])]), 30))
    assert answer.results[0].error_code == ErrorCode.POLICY_VIOLATION and proposed == [], answer
    assert "broker 2 has no room" in answer.results[0].error_message
    answer = ctl.create_partitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="cap-explicit", count=2)]), 30)
    assert answer.results[0].error_code == ErrorCode.NONE, answer  # RF 1 goes to broker 3

    # Reassignment onto a full broker is refused; within the brokers already named it is not.
    moves, proposed = _proposing(ctl, lambda: ctl.alter_reassignments(pb.AlterPartitionReassignmentsRequest(
        partitions=[pb.ReassignablePartition(topic="cap-explicit", partition=0, replicas=[1])]), 30))
    assert moves.results[0].error_code == ErrorCode.POLICY_VIOLATION and proposed == [], moves
    assert "broker 1" in moves.results[0].error_message
    counts = (_count(ctl, 1), _count(ctl, 2), _count(ctl, 3))

    # validate_only is answered the same and changes nothing.
    answer, proposed = _proposing(ctl, lambda: ctl.create_topics(pb.CreateTopicsRequest(
        topics=[_topic("cap-validate", 1, 3)], validate_only=True), 30))
    assert answer.results[0].error_code == ErrorCode.POLICY_VIOLATION and proposed == []
    assert (_count(ctl, 1), _count(ctl, 2), _count(ctl, 3)) == counts


def test_controller_refuses_a_negative_capacity(controller: QuorumController) -> None:
    with pytest.raises(errors.InvalidRequestError):
        controller.register_broker(pb.RegisterBrokerRequest(
            node_id=9, incarnation_id="i9", cluster_id="capacity", partition_capacity=-5,
            endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19009)]), 30)
