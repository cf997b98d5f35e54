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
