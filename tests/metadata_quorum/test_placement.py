"""Replica placement and the election functions: pure, deterministic."""

from __future__ import annotations

from collections import Counter

import pytest

from metadata_quorum.election import NO_LEADER, can_move_to_preferred, elect_leader, isr_without
from metadata_quorum.placement import BrokerLoad, place_replicas
from proto import errors


def brokers(n: int, racks: list[str] | None = None) -> list[BrokerLoad]:
    return [BrokerLoad(i, racks[i - 1] if racks else "") for i in range(1, n + 1)]


def test_replicas_and_leaders_are_balanced() -> None:
    plan = place_replicas(brokers(5), 100, 3, start_index=3)
    assert all(len(set(r)) == 3 for r in plan)
    replicas = Counter(b for r in plan for b in r)
    leaders = Counter(r[0] for r in plan)
    assert max(replicas.values()) - min(replicas.values()) <= 1, replicas
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders


def test_placement_balances_the_topic_first_and_gives_what_is_left_over_to_the_least_loaded() -> None:
    # Broker 1 already leads 50 partitions of other topics: it still leads its share of this one
    # (a topic's load is its own), but none of the partitions beyond an even split.
    loaded = [BrokerLoad(1, "", 50, 50), BrokerLoad(2, "", 0, 0), BrokerLoad(3, "", 0, 0)]
    for start in range(6):
        plan = place_replicas(loaded, 10, 1, start_index=start)
        leaders = Counter(r[0] for r in plan)
        assert leaders[1] == 3 and sorted([leaders[2], leaders[3]]) == [3, 4], (start, leaders)


def test_each_topic_is_balanced_whatever_the_cluster_carries() -> None:
    # Uneven load from earlier topics (as a cluster has after a few topics of odd partition counts)
    # must not leave one broker leading half of a new topic's partitions: it was 3, 2 and 1 of 6.
    for loads in ([(1, 1), (2, 0), (3, 2)], [(7, 3), (0, 0), (2, 1)], [(0, 0), (5, 5), (5, 4)]):
        cluster = [BrokerLoad(i + 1, "", r, ld) for i, (r, ld) in enumerate(loads)]
        for start in range(6):
            plan = place_replicas(cluster, 6, 3, start_index=start)
            leaders = Counter(r[0] for r in plan)
            assert sorted(leaders.values()) == [2, 2, 2], (loads, start, plan)
            assert all(len(set(r)) == 3 for r in plan)
            plan = place_replicas(cluster, 6, 2, start_index=start)
            replicas = Counter(b for r in plan for b in r)
            assert sorted(replicas.values()) == [4, 4, 4], (loads, start, plan)


def test_partitions_added_to_a_topic_balance_with_its_existing_ones() -> None:
    existing = [[1, 2], [1, 3]]  # broker 1 leads both of the topic's partitions
    cluster = [BrokerLoad(1, "", 2, 2), BrokerLoad(2, "", 1, 0), BrokerLoad(3, "", 1, 0)]
    plan = place_replicas(cluster, 4, 2, start_index=0, topic_assignments=existing)
    leaders = Counter(r[0] for r in existing + plan)
    assert sorted(leaders.values()) == [2, 2, 2], plan
    replicas = Counter(b for r in existing + plan for b in r)
    assert sorted(replicas.values()) == [4, 4, 4], plan


def test_rack_aware_every_partition_spans_distinct_racks() -> None:
    racks = ["a", "a", "b", "b", "c", "c"]
    plan = place_replicas(brokers(6, racks), 60, 3, start_index=5)
    for replicas in plan:
        assert len({racks[b - 1] for b in replicas}) == 3, replicas
    leaders = Counter(r[0] for r in plan)
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders


def test_rack_aware_with_fewer_racks_than_replicas_uses_every_rack() -> None:
    racks = ["a", "a", "a", "b"]
    plan = place_replicas(brokers(4, racks), 20, 3, start_index=1)
    for replicas in plan:
        assert {racks[b - 1] for b in replicas} == {"a", "b"}, replicas


def test_placement_is_deterministic_and_start_index_rotates_ties() -> None:
    a = place_replicas(brokers(3), 6, 2, start_index=1)
    assert a == place_replicas(brokers(3), 6, 2, start_index=1)
    assert place_replicas(brokers(3), 1, 1, start_index=0) != place_replicas(brokers(3), 1, 1, start_index=1)


def test_placement_refuses_impossible_requests() -> None:
    with pytest.raises(errors.InvalidReplicationFactorError):
        place_replicas(brokers(2), 1, 3)
    with pytest.raises(errors.InvalidPartitionsError):
        place_replicas(brokers(2), 0, 1)
    with pytest.raises(errors.InvalidReplicationFactorError):
        place_replicas(brokers(2), 1, 0)


def test_elect_prefers_first_live_in_sync_replica_in_assignment_order() -> None:
    assert elect_leader([3, 1, 2], [1, 2, 3], {1, 2, 3}, unclean_allowed=False).leader == 3
    assert elect_leader([3, 1, 2], [1, 2, 3], {1, 2}, unclean_allowed=False).leader == 1
    offline = elect_leader([3, 1, 2], [3], {1, 2}, unclean_allowed=False)
    assert (offline.leader, offline.isr, offline.unclean) == (NO_LEADER, [3], False)
    dirty = elect_leader([3, 1, 2], [3], {1, 2}, unclean_allowed=True)
    assert (dirty.leader, dirty.isr, dirty.unclean) == (1, [1], True)


def test_isr_without_keeps_the_last_member() -> None:
    assert isr_without([1, 2], 1) == [2]
    assert isr_without([1], 1) == [1]


def test_can_move_to_preferred() -> None:
    assert can_move_to_preferred([1, 2], [1, 2], 2, {1, 2})
    assert not can_move_to_preferred([1, 2], [2], 2, {1, 2})  # preferred not in sync
    assert not can_move_to_preferred([1, 2], [1, 2], 2, {2})  # preferred not live
    assert not can_move_to_preferred([1, 2], [1, 2], 1, {1, 2})  # already leads
