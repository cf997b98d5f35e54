"""The server-side assignors of the consumer group protocol (broker/consumer_group_assignors.py).

Whatever the inputs, each partition of a subscribed topic must go to exactly one of its subscribers, and
nothing else may be assigned: a partition given twice is consumed twice, one given to no one is not
consumed. Beyond that, uniform must balance and move little (every move is a revocation the members wait
for), and both must give the same answer for the same group, whatever order its dicts and sets are in.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping

import pytest

from broker.consumer_group_assignors import ASSIGNORS, DEFAULT_ASSIGNOR, Assignment, assign

T1, T2, T3, T4 = (uuid.UUID(int=n) for n in (0x11, 0x22, 0x33, 0x44))  # sorted as numbered


def check(result: Mapping[str, Assignment], subscriptions: Mapping[str, frozenset[uuid.UUID]],
          partitions: Mapping[uuid.UUID, int]) -> None:
    """Each partition of each subscribed topic exactly once, only to subscribers, nothing extra."""
    assert set(result) == set(subscriptions)
    seen: dict[tuple[uuid.UUID, int], str] = {}
    for member, assignment in result.items():
        for topic, parts in assignment.items():
            assert topic in subscriptions[member], (member, topic)
            assert parts, (member, topic)
            assert isinstance(parts, frozenset)
            for p in parts:
                assert 0 <= p < partitions[topic], (member, topic, p)
                assert (topic, p) not in seen, f"{topic}/{p} to {seen[topic, p]} and {member}"
                seen[topic, p] = member
    subscribed = {t for topics in subscriptions.values() for t in topics}
    assert set(seen) == {(t, p) for t in subscribed for p in range(partitions[t])}


def total(assignment: Assignment) -> int:
    return sum(len(parts) for parts in assignment.values())


def pairs(assignment: Assignment) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, parts in assignment.items() for p in parts}


def counts(result: Mapping[str, Assignment], members: list[str] | None = None) -> list[int]:
    return [total(result[m]) for m in (members if members is not None else result)]


# ---------------------------------------------------------------------------------------------- the API


def test_uniform_is_the_default() -> None:
    assert ASSIGNORS == ("uniform", "range")
    assert DEFAULT_ASSIGNOR == ASSIGNORS[0] == "uniform"


def test_unknown_assignor_is_refused() -> None:
    with pytest.raises(ValueError, match="sticky"):
        assign("sticky", {"a": frozenset({T1})}, {T1: 3}, {})


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_no_members(assignor: str) -> None:
    assert assign(assignor, {}, {T1: 3}, {"gone": {T1: frozenset({0})}}) == {}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_members_without_subscriptions_get_nothing(assignor: str) -> None:
    subscriptions = {"a": frozenset({T1}), "b": frozenset(), "c": frozenset({T1})}
    result = assign(assignor, subscriptions, {T1: 4, T2: 5}, {"b": {T1: frozenset({0, 1})}})
    check(result, subscriptions, {T1: 4, T2: 5})
    assert result["b"] == {}
    assert counts(result, ["a", "c"]) == [2, 2]
    assert all(T2 not in a for a in result.values()), "a topic no one subscribes to is not assigned"


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_only_empty_subscriptions(assignor: str) -> None:
    assert assign(assignor, {"a": frozenset(), "b": frozenset()}, {T1: 3}, {}) == {"a": {}, "b": {}}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_more_members_than_partitions(assignor: str) -> None:
    subscriptions = {m: frozenset({T1}) for m in "abcde"}
    result = assign(assignor, subscriptions, {T1: 3}, {})
    check(result, subscriptions, {T1: 3})
    assert sorted(counts(result)) == [0, 0, 1, 1, 1]
    assert all(a == {} or len(a[T1]) == 1 for a in result.values())


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_homogeneous_balance(assignor: str) -> None:
    subscriptions = {m: frozenset({T1, T2}) for m in "abc"}
    partitions = {T1: 7, T2: 9}
    result = assign(assignor, subscriptions, partitions, {})
    check(result, subscriptions, partitions)
    if assignor == "uniform":
        assert sorted(counts(result)) == [5, 5, 6]
    for topic, n in partitions.items():
        per_topic = [len(a.get(topic, ())) for a in result.values()]
        assert max(per_topic) - min(per_topic) <= 1 and sum(per_topic) == n


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_previous_naming_what_is_gone_is_ignored(assignor: str) -> None:
    vanished = uuid.UUID(int=0x99)
    subscriptions = {"a": frozenset({T1}), "b": frozenset({T1, T2})}
    partitions = {T1: 4, T2: 2}
    previous = {
        "gone": {T1: frozenset({0, 1, 2, 3}), T2: frozenset({0, 1})},
        "a": {T1: frozenset({0, 7, -1}), vanished: frozenset({0, 1}), T2: frozenset({0})},  # T2: unsubscribed
        "b": {T1: frozenset({1, 4}), T2: frozenset({1, 2, 3})},
    }
    result = assign(assignor, subscriptions, partitions, previous)
    check(result, subscriptions, partitions)
    if assignor == "uniform":
        assert pairs(result["a"]) >= {(T1, 0)} and pairs(result["b"]) >= {(T1, 1), (T2, 1)}
        assert sorted(counts(result)) == [3, 3]


def test_a_partition_named_twice_in_previous_is_kept_once() -> None:
    subscriptions = {"a": frozenset({T1}), "b": frozenset({T1})}
    previous = {"a": {T1: frozenset({0, 1})}, "b": {T1: frozenset({1, 2})}}
    result = assign("uniform", subscriptions, {T1: 4}, previous)
    check(result, subscriptions, {T1: 4})
    assert result["a"] == {T1: frozenset({0, 1})}
    assert result["b"] == {T1: frozenset({2, 3})}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_deterministic_whatever_the_order(assignor: str) -> None:
    rng = random.Random(7)
    topics = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(6)]
    partitions = {t: rng.randint(1, 9) for t in topics}
    members = [f"member-{i}" for i in range(9)]
    subscriptions = {m: frozenset(rng.sample(topics, rng.randint(1, 6))) for m in members}
    previous = {m: {t: frozenset(rng.sample(range(12), 3)) for t in rng.sample(topics, 2)}
                for m in members[:6]}
    expected = assign(assignor, subscriptions, partitions, previous)
    check(expected, subscriptions, partitions)

    def shuffled(d: Mapping) -> dict:
        items = list(d.items())
        rng.shuffle(items)
        return dict(items)

    for _ in range(20):
        again = assign(assignor,
                       shuffled({m: frozenset(rng.sample(sorted(s), len(s)))
                                 for m, s in subscriptions.items()}),
                       shuffled(partitions),
                       shuffled({m: shuffled(a) for m, a in previous.items()}))
        assert again == expected


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_assigning_again_changes_nothing(assignor: str) -> None:
    subscriptions = {"a": frozenset({T1, T2}), "b": frozenset({T1}), "c": frozenset({T2, T3})}
    partitions = {T1: 5, T2: 8, T3: 3}
    first = assign(assignor, subscriptions, partitions, {})
    assert assign(assignor, subscriptions, partitions, first) == first


# ---------------------------------------------------------------------------------------------- uniform


def test_uniform_a_joining_member_takes_only_what_it_needs() -> None:
    partitions = {T1: 7, T2: 5}
    two = {"a": frozenset({T1, T2}), "b": frozenset({T1, T2})}
    before = assign("uniform", two, partitions, {})
    assert counts(before) == [6, 6]
    three = {**two, "c": frozenset({T1, T2})}
    after = assign("uniform", three, partitions, before)
    check(after, three, partitions)
    assert counts(after) == [4, 4, 4]
    for m, other in (("a", "b"), ("b", "a")):
        assert pairs(after[m]) <= pairs(before[m]), "an old member takes nothing new"
        assert not pairs(after[m]) & pairs(before[other]), "nothing moves between the old members"


def test_uniform_survivors_of_a_leaving_member_keep_all_theirs() -> None:
    partitions = {T1: 12}
    three = {m: frozenset({T1}) for m in "abc"}
    before = assign("uniform", three, partitions, {})
    two = {"a": three["a"], "c": three["c"]}
    after = assign("uniform", two, partitions, before)
    check(after, two, partitions)
    assert counts(after) == [6, 6]
    assert pairs(after["a"]) >= pairs(before["a"]) and pairs(after["c"]) >= pairs(before["c"])


def test_uniform_gives_the_extra_partition_to_whom_had_more() -> None:
    partitions = {T1: 10}
    subscriptions = {m: frozenset({T1}) for m in "abc"}
    previous = {"a": {T1: frozenset({0, 1})}, "b": {T1: frozenset(range(2, 10))}}
    result = assign("uniform", subscriptions, partitions, previous)
    check(result, subscriptions, partitions)
    assert counts(result) == [3, 4, 3]
    assert pairs(result["a"]) >= pairs(previous["a"]) and pairs(result["b"]) <= pairs(previous["b"])


def test_uniform_balances_totals_across_topics() -> None:
    partitions = {T1: 1, T2: 1, T3: 1, T4: 1}
    subscriptions = {"a": frozenset(partitions), "b": frozenset(partitions)}
    result = assign("uniform", subscriptions, partitions, {})
    check(result, subscriptions, partitions)
    assert counts(result) == [2, 2], "range would give all four to a"


def local_balance(result: Mapping[str, Assignment],
                  subscriptions: Mapping[str, frozenset[uuid.UUID]]) -> None:
    """What uniform guarantees when subscriptions differ: no member holds a partition of a topic that a
    member with two fewer partitions subscribes to."""
    totals = {m: total(a) for m, a in result.items()}
    for m, assignment in result.items():
        for topic in assignment:
            for other, topics in subscriptions.items():
                if topic in topics:
                    assert totals[m] - totals[other] <= 1, (m, other, topic)


def test_uniform_heterogeneous_every_partition_to_a_subscriber() -> None:
    partitions = {T1: 6, T2: 4, T3: 9}
    subscriptions = {"a": frozenset({T1}), "b": frozenset({T1, T2}),
                     "c": frozenset({T2, T3}), "d": frozenset({T3})}
    result = assign("uniform", subscriptions, partitions, {})
    check(result, subscriptions, partitions)
    local_balance(result, subscriptions)


def test_uniform_heterogeneous_rebalances_what_was_kept() -> None:
    """a held everything; b and c, each subscribed to one of its topics, join: only moves off a balance."""
    partitions = {T1: 6, T2: 6}
    previous = {"a": {T1: frozenset(range(6)), T2: frozenset(range(6))}}
    subscriptions = {"a": frozenset({T1, T2}), "b": frozenset({T1}), "c": frozenset({T2})}
    result = assign("uniform", subscriptions, partitions, previous)
    check(result, subscriptions, partitions)
    assert counts(result) == [4, 4, 4]
    assert pairs(result["a"]) <= pairs(previous["a"])


def test_uniform_heterogeneous_balance_is_local() -> None:
    """d joins a's and b's topic: one partition moves, from a. Even counts would take a chain, c to a and a to
    d, and c and d share no topic: that is the documented limit, d ends two below c."""
    partitions = {T1: 4, T2: 4}
    subscriptions = {"a": frozenset({T1, T2}), "b": frozenset({T1}), "c": frozenset({T2})}
    before = assign("uniform", subscriptions, partitions, {})
    assert counts(before) == [3, 2, 3]
    with_d = {**subscriptions, "d": frozenset({T1})}
    after = assign("uniform", with_d, partitions, before)
    check(after, with_d, partitions)
    local_balance(after, with_d)
    assert counts(after) == [2, 2, 3, 1]
    assert [len(pairs(before[m]) - pairs(after[m])) for m in "abc"] == [1, 0, 0]


# ---------------------------------------------------------------------------------------------- range


def test_range_contiguous_ranges_in_member_order() -> None:
    subscriptions = {m: frozenset({T1}) for m in ("c", "a", "b")}
    result = assign("range", subscriptions, {T1: 11}, {})
    assert result == {"a": {T1: frozenset(range(0, 4))}, "b": {T1: frozenset(range(4, 8))},
                      "c": {T1: frozenset(range(8, 11))}}


def test_range_co_partitions_topics_of_equal_counts() -> None:
    subscriptions = {m: frozenset({T1, T2, T3}) for m in "abcd"}
    partitions = {T1: 10, T2: 10, T3: 3}
    result = assign("range", subscriptions, partitions, {})
    check(result, subscriptions, partitions)
    for m in "abcd":
        assert result[m][T1] == result[m][T2]
    assert [sorted(result[m].get(T3, ())) for m in "abcd"] == [[0], [1], [2], []]


def test_range_per_topic_subscribers_and_not_sticky() -> None:
    subscriptions = {"a": frozenset({T1}), "b": frozenset({T1, T2}), "c": frozenset({T2})}
    partitions = {T1: 5, T2: 4}
    previous = {"a": {T1: frozenset({3, 4})}, "c": {T2: frozenset({0, 1, 2, 3})}}
    result = assign("range", subscriptions, partitions, previous)
    assert result == {"a": {T1: frozenset({0, 1, 2})},
                      "b": {T1: frozenset({3, 4}), T2: frozenset({0, 1})},
                      "c": {T2: frozenset({2, 3})}}
    assert assign("range", subscriptions, partitions, {}) == result


# ---------------------------------------------------------------------------------------------- size


def test_ten_thousand_partitions_and_a_thousand_members() -> None:
    rng = random.Random(10_000)
    topics = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(100)]
    partitions = {t: 100 for t in topics}
    members = [f"consumer-{i:04d}-{uuid.UUID(int=rng.getrandbits(128))}" for i in range(1000)]
    homogeneous = {m: frozenset(topics) for m in members}
    for assignor in ASSIGNORS:
        result = assign(assignor, homogeneous, partitions, {})
        check(result, homogeneous, partitions)
        if assignor == "uniform":
            assert set(counts(result)) == {10}
    before = assign("uniform", homogeneous, partitions, {})
    grown = {**homogeneous, "new-member": frozenset(topics)}
    after = assign("uniform", grown, partitions, before)
    check(after, grown, partitions)
    assert set(counts(after)) == {9, 10}
    assert all(pairs(after[m]) <= pairs(before[m]) for m in members)
    heterogeneous = {m: frozenset(rng.sample(topics, rng.randint(1, 20))) for m in members}
    for assignor in ASSIGNORS:
        check(assign(assignor, heterogeneous, partitions, before), heterogeneous, partitions)


# ---------------------------------------------------------------------------------------------- random


def random_group(rng: random.Random) -> tuple[dict[str, frozenset[uuid.UUID]], dict[uuid.UUID, int],
                                              dict[str, dict[uuid.UUID, frozenset[int]]]]:
    """A group of a few members and topics, its previous assignment a mix of valid and stale entries."""
    topics = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(rng.randint(1, 5))]
    partitions = {t: rng.randint(1, 12) for t in topics}
    members = [f"m{rng.getrandbits(16):04x}-{i}" for i in range(rng.randint(1, 8))]
    if rng.random() < 0.5:
        shared = frozenset(rng.sample(topics, rng.randint(1, len(topics))))
        subscriptions = {m: shared if rng.random() < 0.9 else frozenset() for m in members}
    else:
        subscriptions = {m: frozenset(rng.sample(topics, rng.randint(0, len(topics)))) for m in members}
    previous: dict[str, dict[uuid.UUID, set[int]]] = {}
    for t, n in partitions.items():
        for p in range(n):
            if rng.random() < 0.7:
                previous.setdefault(rng.choice(members + ["gone"]), {}).setdefault(t, set()).add(p)
    for m in rng.sample(members, min(2, len(members))):
        previous.setdefault(m, {}).setdefault(uuid.UUID(int=rng.getrandbits(128)), set()).add(0)
        previous[m].setdefault(topics[0], set()).add(partitions[topics[0]] + rng.randint(0, 3))
    frozen = {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in previous.items()}
    return subscriptions, partitions, frozen


@pytest.mark.parametrize("seed", range(200))
def test_random_groups(seed: int) -> None:
    rng = random.Random(seed)
    subscriptions, partitions, previous = random_group(rng)
    active = [m for m, s in subscriptions.items() if s]
    homogeneous = len({subscriptions[m] for m in active}) <= 1

    ranged = assign("range", subscriptions, partitions, previous)
    check(ranged, subscriptions, partitions)
    for topic in partitions:
        per_topic = [len(ranged[m].get(topic, ())) for m in subscriptions if topic in subscriptions[m]]
        assert not per_topic or max(per_topic) - min(per_topic) <= 1

    uniform = assign("uniform", subscriptions, partitions, previous)
    check(uniform, subscriptions, partitions)
    assert assign("uniform", subscriptions, partitions, uniform) == uniform
    local_balance(uniform, subscriptions)
    totals = [total(uniform[m]) for m in active]
    if homogeneous and active:
        assert max(totals) - min(totals) <= 1
        valid = {m: {(t, p) for t, ps in previous.get(m, {}).items() if t in subscriptions[m]
                     for p in ps if p < partitions.get(t, 0)} for m in active}
        size, bigger = divmod(sum(partitions[t] for t in subscriptions[active[0]]), len(active))
        most_keepable = (sum(min(len(v), size) for v in valid.values())
                         + min(bigger, sum(len(v) > size for v in valid.values())))
        assert sum(len(pairs(uniform[m]) & valid[m]) for m in active) == most_keepable
