"""Assignors: balance, determinism, stickiness, and KIP-429's two-phase revocation."""

from __future__ import annotations

import random

import pytest

from client.assignors import (
    COOPERATIVE,
    EAGER,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    Subscription,
    get_assignors,
    rebalance_protocol,
)
from client.types import TopicPartition as TP
from proto import errors


def subs(members: list[str], topics: tuple[str, ...]) -> dict[str, Subscription]:
    return {m: Subscription(topics) for m in members}


def counts(result: dict[str, list[TP]]) -> dict[str, int]:
    return {m: len(ps) for m, ps in result.items()}


def assert_exact_cover(result: dict[str, list[TP]], parts: dict[str, int]) -> None:
    flat = [tp for ps in result.values() for tp in ps]
    assert len(flat) == len(set(flat)), f"a partition is assigned twice: {result}"
    expected = {TP(t, p) for t, n in parts.items() for p in range(n)}
    assert set(flat) == expected, f"missing {expected - set(flat)}, extra {set(flat) - expected}"


def test_range_gives_first_members_the_extra_partitions_per_topic() -> None:
    result = RangeAssignor().assign({"a": 5, "b": 2}, subs(["m2", "m1", "m3"], ("a", "b")))
    assert result == {
        "m1": [TP("a", 0), TP("a", 1), TP("b", 0)],
        "m2": [TP("a", 2), TP("a", 3), TP("b", 1)],
        "m3": [TP("a", 4)],
    }


def test_range_only_assigns_topics_a_member_subscribes_to() -> None:
    s = {"m1": Subscription(("a",)), "m2": Subscription(("a", "b"))}
    result = RangeAssignor().assign({"a": 2, "b": 2}, s)
    assert result == {"m1": [TP("a", 0)], "m2": [TP("a", 1), TP("b", 0), TP("b", 1)]}


def test_roundrobin_deals_across_topics_and_skips_unsubscribed_members() -> None:
    result = RoundRobinAssignor().assign({"a": 3, "b": 3}, subs(["x", "y"], ("a", "b")))
    assert counts(result) == {"x": 3, "y": 3}
    assert result["x"] == [TP("a", 0), TP("a", 2), TP("b", 1)]
    s = {"x": Subscription(("a",)), "y": Subscription(("b",))}
    result = RoundRobinAssignor().assign({"a": 2, "b": 2}, s)
    assert result == {"x": [TP("a", 0), TP("a", 1)], "y": [TP("b", 0), TP("b", 1)]}


@pytest.mark.parametrize("assignor", [RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor()])
def test_six_partitions_three_members_two_each(assignor) -> None:
    result = assignor.assign({"t": 6}, subs(["c1", "c2", "c3"], ("t",)))
    assert counts(result) == {"c1": 2, "c2": 2, "c3": 2}, result
    assert_exact_cover(result, {"t": 6})


@pytest.mark.parametrize("assignor", [RangeAssignor(), RoundRobinAssignor(), CooperativeStickyAssignor()])
def test_missing_topic_and_empty_group(assignor) -> None:
    assert assignor.assign({}, {}) == {}
    assert assignor.assign({}, subs(["a"], ("nope",))) == {"a": []}


def test_sticky_keeps_owned_partitions_when_a_member_leaves() -> None:
    a = CooperativeStickyAssignor()
    first = a.assign({"t": 6}, subs(["c1", "c2", "c3"], ("t",)))
    # c3 is gone; c1 and c2 report what they own.
    s = {m: Subscription(("t",), tuple(first[m]), 1) for m in ("c1", "c2")}
    second = a.assign({"t": 6}, s)
    assert counts(second) == {"c1": 3, "c2": 3}
    for m in ("c1", "c2"):
        assert set(first[m]) <= set(second[m]), f"{m} lost owned partitions: {first[m]} -> {second[m]}"
    assert_exact_cover(second, {"t": 6})


def test_cooperative_join_revokes_in_two_phases() -> None:
    a = CooperativeStickyAssignor()
    owned = {"c1": [TP("t", p) for p in range(3)], "c2": [TP("t", p) for p in range(3, 6)]}
    s = {m: Subscription(("t",), tuple(ps), 4) for m, ps in owned.items()}
    s["c3"] = Subscription(("t",))
    phase1 = a.assign({"t": 6}, s)
    # Nothing moves straight to the newcomer: c1 and c2 each give one up (revoke) first.
    assert phase1["c3"] == [], phase1
    assert counts(phase1) == {"c1": 2, "c2": 2, "c3": 0}
    for m in ("c1", "c2"):
        assert set(phase1[m]) <= set(owned[m])
    # Phase 2: members rejoin owning what phase 1 gave them; the revoked ones go to c3.
    s2 = {m: Subscription(("t",), tuple(phase1[m]), 5) for m in phase1}
    phase2 = a.assign({"t": 6}, s2)
    assert counts(phase2) == {"c1": 2, "c2": 2, "c3": 2}, phase2
    assert_exact_cover(phase2, {"t": 6})
    assert phase2["c1"] == phase1["c1"] and phase2["c2"] == phase1["c2"]


def test_cooperative_never_gives_a_partition_to_two_members_in_any_phase() -> None:
    rng = random.Random(7)
    a = CooperativeStickyAssignor()
    owned: dict[str, list[TP]] = {}
    members = ["m0"]
    parts = {"t": 7, "u": 3}
    for gen in range(40):
        # Membership churn: join or leave at random, as a long-lived group sees.
        if rng.random() < 0.5 and len(members) < 6:
            members.append(f"m{gen + 1}")
        elif len(members) > 1:
            members.remove(rng.choice(members))
        for _ in range(2):  # the rebalance and its cooperative follow-up
            s = {m: Subscription(("t", "u"), tuple(owned.get(m, ())), gen) for m in members}
            result = a.assign(parts, s)
            flat = [tp for ps in result.values() for tp in ps]
            assert len(flat) == len(set(flat)), f"gen {gen}: double assignment {result}"
            # A member gets a partition only if no other current member still owns it.
            for m, ps in result.items():
                for tp in ps:
                    others = [o for o in members if o != m and tp in owned.get(o, ())]
                    assert not others, f"gen {gen}: {tp} given to {m} while {others} still own it"
            owned = {m: list(result[m]) for m in members}
        loads = counts(result)
        assert_exact_cover(result, parts)
        assert max(loads.values()) - min(loads.values()) <= 1, f"gen {gen}: unbalanced {loads}"


def test_sticky_resolves_a_double_claim_by_generation() -> None:
    s = {
        "old": Subscription(("t",), (TP("t", 0),), 3),
        "new": Subscription(("t",), (TP("t", 0),), 4),
    }
    result = CooperativeStickyAssignor().assign({"t": 2}, s)
    assert TP("t", 0) in result["new"], result
    assert TP("t", 0) not in result["old"]


def test_sticky_drops_owned_partitions_of_deleted_topics_and_shrunk_partition_counts() -> None:
    s = {"a": Subscription(("t",), (TP("t", 5), TP("gone", 0)), 2), "b": Subscription(("t",))}
    result = CooperativeStickyAssignor().assign({"t": 2}, s)
    assert_exact_cover(result, {"t": 2})
    assert counts(result) == {"a": 1, "b": 1}


def test_assignors_are_deterministic() -> None:
    s = {f"m{i}": Subscription(("a", "b", "c")) for i in range(5)}
    parts = {"a": 4, "b": 7, "c": 1}
    for cls in (RangeAssignor, RoundRobinAssignor, CooperativeStickyAssignor):
        assert cls().assign(parts, s) == cls().assign(parts, dict(reversed(list(s.items()))))


def test_get_assignors_parses_names_and_protocol() -> None:
    assert [a.name for a in get_assignors("range, cooperative-sticky")] == ["range", "cooperative-sticky"]
    assert rebalance_protocol(get_assignors("range,cooperative-sticky")) == EAGER
    assert rebalance_protocol(get_assignors(["cooperative-sticky"])) == COOPERATIVE
    assert get_assignors("org.apache.kafka.clients.consumer.RoundRobinAssignor")[0].name == "roundrobin"
    with pytest.raises(errors.InvalidConfigError):
        get_assignors("fancy")
    with pytest.raises(errors.InvalidConfigError):
        get_assignors("")
