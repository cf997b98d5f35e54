"""Partition assignors: how a group leader spreads partitions over the group's members.

Pure and deterministic: the same input gives the same output on every machine, so a
test (or a new group leader) can recompute any assignment. Three strategies, named as
in Kafka:

- ``range``: per topic, consecutive partition ranges over the subscribed members in
  member-id order (the first ``P % M`` members get one extra). Eager.
- ``roundrobin``: all partitions (topic, partition order) dealt one by one over the
  members in member-id order, skipping members not subscribed to the topic. Eager.
- ``cooperative-sticky``: balanced (member loads differ by at most one among members
  that could take each other's partitions) while keeping every partition a member
  already owns where balance allows (stickiness). Cooperative (KIP-429): a partition
  that moves from A to B is withheld from B in this rebalance; A revokes it, rejoins,
  and the follow-up rebalance gives it to B. No partition is ever owned by two members.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from client.types import TopicPartition
from proto import errors

EAGER = "eager"
COOPERATIVE = "cooperative"


@dataclass(frozen=True)
class Subscription:
    """What one member told the leader in JoinGroup (decoded ConsumerSubscription)."""

    topics: tuple[str, ...]
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = -1  # generation in which it got owned_partitions
    user_data: bytes = b""


@dataclass
class GroupAssignment:
    """The leader's decision: member id -> partitions, sorted."""

    assignments: dict[str, list[TopicPartition]] = field(default_factory=dict)


class Assignor(Protocol):
    name: str
    rebalance_protocol: str

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]: ...


def _empty_result(subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
    return {member: [] for member in subscriptions}


def _subscribed_partitions(topic: str, partitions_per_topic: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(max(0, partitions_per_topic.get(topic, 0)))]


class RangeAssignor:
    name = "range"
    rebalance_protocol = EAGER

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        result = _empty_result(subscriptions)
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        for topic in topics:
            members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
            parts = _subscribed_partitions(topic, partitions_per_topic)
            if not members or not parts:
                continue
            per_member, extra = divmod(len(parts), len(members))
            start = 0
            for i, member in enumerate(members):
                count = per_member + (1 if i < extra else 0)
                result[member].extend(parts[start : start + count])
                start += count
        return {m: sorted(ps) for m, ps in result.items()}


class RoundRobinAssignor:
    name = "roundrobin"
    rebalance_protocol = EAGER

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        result = _empty_result(subscriptions)
        members = sorted(subscriptions)
        if not members:
            return result
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        cursor = 0
        for topic in topics:
            for tp in _subscribed_partitions(topic, partitions_per_topic):
                # Deal to the next member (in circular order) subscribed to this topic.
                for step in range(len(members)):
                    member = members[(cursor + step) % len(members)]
                    if topic in subscriptions[member].topics:
                        result[member].append(tp)
                        cursor = (cursor + step + 1) % len(members)
                        break
        return {m: sorted(ps) for m, ps in result.items()}


class CooperativeStickyAssignor:
    name = "cooperative-sticky"
    rebalance_protocol = COOPERATIVE

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        previous_owner = self._valid_previous_owners(partitions_per_topic, subscriptions)
        assignment = self.sticky_balanced(partitions_per_topic, subscriptions, previous_owner)
        # Withhold every partition that changes owner: its previous owner must revoke it
        # first (it sees it missing from its own assignment), then rejoins.
        for member, parts in assignment.items():
            assignment[member] = [
                tp for tp in parts if previous_owner.get(tp) is None or previous_owner[tp] == member
            ]
        return assignment

    @staticmethod
    def _valid_previous_owners(
        partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[TopicPartition, str]:
        """Owner of each still-existing partition; a partition claimed twice goes to the
        claim from the highest generation (the other is a stale member's memory)."""
        owner: dict[TopicPartition, tuple[int, str]] = {}
        for member in sorted(subscriptions):
            sub = subscriptions[member]
            for tp in sub.owned_partitions:
                if tp.topic not in sub.topics or not 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0):
                    continue
                claim = owner.get(tp)
                if claim is None or sub.generation_id > claim[0]:
                    owner[tp] = (sub.generation_id, member)
        return {tp: member for tp, (_, member) in owner.items()}

    @staticmethod
    def sticky_balanced(
        partitions_per_topic: Mapping[str, int],
        subscriptions: Mapping[str, Subscription],
        previous_owner: Mapping[TopicPartition, str],
    ) -> dict[str, list[TopicPartition]]:
        """A balanced assignment that keeps previous owners where balance allows."""
        members = sorted(subscriptions)
        current: dict[str, set[TopicPartition]] = {m: set() for m in members}
        eligible: dict[TopicPartition, list[str]] = {}
        for topic in sorted({t for s in subscriptions.values() for t in s.topics}):
            for tp in _subscribed_partitions(topic, partitions_per_topic):
                eligible[tp] = [m for m in members if topic in subscriptions[m].topics]
        # Keep owned partitions, but never more than a fair share (ceil over the members
        # eligible for them) so an overloaded owner gives up its surplus right away.
        for tp in sorted(eligible):
            owner = previous_owner.get(tp)
            if owner is not None and owner in current:
                current[owner].add(tp)
        for member in members:
            quota = _fair_ceiling(member, subscriptions, eligible)
            if len(current[member]) > quota:
                keep = sorted(current[member])[:quota]
                current[member] = set(keep)
        assigned = {tp for parts in current.values() for tp in parts}
        for tp in sorted(eligible):
            if tp in assigned or not eligible[tp]:
                continue
            target = min(eligible[tp], key=lambda m: (len(current[m]), m))
            current[target].add(tp)
        _rebalance_by_moves(current, eligible, previous_owner)
        return {m: sorted(current[m]) for m in members}


def _fair_ceiling(
    member: str, subscriptions: Mapping[str, Subscription], eligible: Mapping[TopicPartition, list[str]]
) -> int:
    """Most partitions ``member`` should hold: ceil(partitions it can take / members sharing them)."""
    mine = [tp for tp, ms in eligible.items() if member in ms]
    if not mine:
        return 0
    sharers = {m for tp in mine for m in eligible[tp]}
    total = len({tp for tp, ms in eligible.items() if any(m in sharers for m in ms)})
    return -(-total // len(sharers))


def _rebalance_by_moves(
    current: dict[str, set[TopicPartition]],
    eligible: Mapping[TopicPartition, list[str]],
    previous_owner: Mapping[TopicPartition, str],
) -> None:
    """Move single partitions from the most to the least loaded eligible member until no
    move lowers the imbalance. Each move lowers the sum of squared loads, so this ends;
    the explicit bound guards against a logic error looping forever."""
    moves_max = (len(eligible) + 1) * (len(current) + 1)
    for _ in range(moves_max):
        move = _best_move(current, eligible, previous_owner)
        if move is None:
            return
        tp, src, dst = move
        current[src].remove(tp)
        current[dst].add(tp)
    raise errors.UnknownServerError("cooperative-sticky assignor did not converge")


def _best_move(
    current: Mapping[str, set[TopicPartition]],
    eligible: Mapping[TopicPartition, list[str]],
    previous_owner: Mapping[TopicPartition, str],
) -> tuple[TopicPartition, str, str] | None:
    for src in sorted(current, key=lambda m: (-len(current[m]), m)):
        # Move partitions the member did not own before first: that keeps stickiness.
        for tp in sorted(current[src], key=lambda t: (previous_owner.get(t) == src, t)):
            dst = min(eligible[tp], key=lambda m: (len(current[m]), m))
            if len(current[dst]) + 1 < len(current[src]):
                return tp, src, dst
    return None


ASSIGNORS: dict[str, type] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
    CooperativeStickyAssignor.name: CooperativeStickyAssignor,
}
# Kafka's class names, accepted so configs port over.
ALIASES = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
    "round-robin": "roundrobin",
}


def get_assignors(names: str | Sequence[str]) -> list[Assignor]:
    """Assignor instances for ``partition.assignment.strategy`` (comma-separated or a list)."""
    raw = names.split(",") if isinstance(names, str) else list(names)
    result: list[Assignor] = []
    for name in (n.strip() for n in raw):
        if not name:
            continue
        key = ALIASES.get(name, name)
        cls = ASSIGNORS.get(key)
        if cls is None:
            raise errors.InvalidConfigError(
                f"unknown partition.assignment.strategy {name!r}; known: {', '.join(sorted(ASSIGNORS))}"
            )
        result.append(cls())
    if not result:
        raise errors.InvalidConfigError("partition.assignment.strategy is empty")
    return result


def rebalance_protocol(assignors: Sequence[Assignor]) -> str:
    """The protocol every configured assignor supports (Kafka: eager unless all are cooperative)."""
    return COOPERATIVE if all(a.rebalance_protocol == COOPERATIVE for a in assignors) else EAGER
