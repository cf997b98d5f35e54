"""Decommission and rebalance plans (admin_cli/planning.py): pure, checked on hand-made assignments."""

from __future__ import annotations

import pytest

from admin_cli import planning


def loads(assignment: dict, brokers) -> dict[int, int]:
    return planning.replica_counts(assignment, dict.fromkeys(brokers, ""))


def test_decommission_moves_every_replica_off_and_keeps_positions() -> None:
    assignment = {("t", 0): [3, 1], ("t", 1): [1, 3], ("t", 2): [2, 1], ("u", 0): [3, 2]}
    plan = planning.plan_decommission(assignment, {1: "", 2: "", 3: "", 4: ""}, {3})
    assert set(plan.moves) == {("t", 0), ("t", 1), ("u", 0)}
    after = {**assignment, **plan.moves}
    assert all(3 not in r and len(set(r)) == len(r) == 2 for r in after.values()), after
    assert plan.moves[("t", 1)][0] == 1  # untouched positions stay
    assert loads(after, [1, 2, 4]) == {1: 3, 2: 2, 4: 3}  # each replica went to the least loaded broker


def test_decommission_prefers_other_racks_and_refuses_when_no_room() -> None:
    plan = planning.plan_decommission({("t", 0): [1, 2]}, {1: "a", 2: "b", 3: "a", 4: "b"}, {2})
    assert plan.moves == {("t", 0): [1, 4]}  # 3 is less loaded by id but shares rack a with 1
    with pytest.raises(planning.PlanError, match="only 2 brokers would remain"):
        planning.plan_decommission({("t", 0): [1, 2, 3]}, {1: "", 2: "", 3: ""}, {3})


def test_rebalance_evens_replicas_and_leaders_onto_a_new_broker() -> None:
    assignment = {("t", p): r for p, r in enumerate([[1, 2], [2, 3], [3, 1], [1, 2], [2, 3], [3, 1]])}
    plan = planning.plan_rebalance(assignment, {1: "", 2: "", 3: "", 4: ""})
    after = {**assignment, **plan.moves}
    counts = loads(after, [1, 2, 3, 4])
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    leaders = {b: sum(1 for r in after.values() if r[0] == b) for b in (1, 2, 3, 4)}
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
    assert all(len(set(r)) == len(r) == 2 for r in after.values())
    assert planning.plan_rebalance(after, {1: "", 2: "", 3: "", 4: ""}).empty  # already even: no moves


def test_replication_factor_grows_onto_the_least_loaded_other_rack_and_shrinks_to_leader_and_isr() -> None:
    assignment = {("t", 0): [1], ("t", 1): [2, 3], ("u", 0): [3, 4], ("u", 1): [3, 1]}
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    plan = planning.plan_replication_factor(assignment, racks, "t", 2, {}, {})
    # t-0: broker 3 and 4 are on the other rack; 4 holds fewer replicas (1 against 3). t-1 already has 2.
    assert plan.moves == {("t", 0): [1, 4]}
    plan = planning.plan_replication_factor(assignment, racks, "t", 3, {}, {})
    # Appended, so the preferred leader stays first; once both racks are used, the least loaded (ties by id).
    assert plan.moves == {("t", 0): [1, 4, 2], ("t", 1): [2, 3, 1]}, plan
    # Shrinking keeps the leader, then the in-sync replicas, in the partition's order.
    wide = {("t", 0): [1, 2, 3, 4]}
    plan = planning.plan_replication_factor(wide, racks, "t", 2, {("t", 0): [3, 4, 2]}, {("t", 0): 4})
    assert plan.moves == {("t", 0): [2, 4]}
    plan = planning.plan_replication_factor(wide, racks, "t", 1, {("t", 0): [1, 4]}, {("t", 0): 4})
    assert plan.moves == {("t", 0): [4]}
    # A stopped replica (not among the live brokers) goes before a live one catching up, in sync or not (audit:
    # [1, 2] was planned with 2 down and 3 live, and the move waited for 2).
    live = {1: "a", 3: "b", 4: "b"}
    plan = planning.plan_replication_factor({("t", 0): [1, 2, 3]}, live, "t", 2, {("t", 0): [1]}, {("t", 0): 1})
    assert plan.moves == {("t", 0): [1, 3]}
    plan = planning.plan_replication_factor({("t", 0): [1, 2, 3]}, live, "t", 2, {("t", 0): [1, 2]}, {("t", 0): 1})
    assert plan.moves == {("t", 0): [1, 3]}
    assert planning.plan_replication_factor(wide, racks, "t", 4, {}, {}).empty
    with pytest.raises(planning.PlanError, match="only 4 live brokers"):
        planning.plan_replication_factor(wide, racks, "t", 5, {}, {})
    with pytest.raises(planning.PlanError, match="at least 1"):
        planning.plan_replication_factor(wide, racks, "t", 0, {}, {})


def test_a_move_waits_for_its_target_replicas_out_of_sync_new_or_kept() -> None:
    """`brook partition reassignments` and --wait's timeout name what a move waits for: a shrink's kept replica that
    is stopped too, not only a new one copying (audit: a stuck shrink showed "-")."""
    from admin_cli.partition import waiting_for
    from client.admin import PartitionReassignment

    growth = PartitionReassignment([1, 2, 3], [2, 3], [], [1, 2], 1)
    shrink = PartitionReassignment([1, 2, 3], [], [3], [1], 1)
    assert (waiting_for(growth), waiting_for(shrink)) == ([3], [2])
