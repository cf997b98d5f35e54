"""Replica placement plans for decommission, rebalance and a topic's new replication factor: pure functions
of the current assignment.

A plan is {(topic, partition): target replicas}. It only names partitions that change, keeps each
partition's replication factor (except ``plan_replication_factor``, whose job is to change it), never puts
two replicas of a partition on one broker, and prefers brokers on racks the partition does not use yet. The
controller then carries each move out (AlterPartitionReassignments): the new replicas catch up as followers before the old ones go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Assignment = Mapping[tuple[str, int], list[int]]
MAX_REBALANCE_ROUNDS = 100_000  # bounds the evening loop whatever the input


class PlanError(Exception):
    pass


@dataclass(frozen=True)
class Plan:
    moves: dict[tuple[str, int], list[int]]

    @property
    def empty(self) -> bool:
        return not self.moves


def replica_counts(assignment: Assignment, brokers: Mapping[int, str]) -> dict[int, int]:
    counts = dict.fromkeys(brokers, 0)
    for replicas in assignment.values():
        for r in replicas:
            if r in counts:
                counts[r] += 1
    return counts


def _pick(candidates: list[int], counts: Mapping[int, int], racks: Mapping[int, str], used_racks: set[str]) -> int:
    """The least loaded candidate, preferring a rack the partition does not use yet; ties by id."""
    return min(candidates, key=lambda b: (bool(racks.get(b)) and racks.get(b) in used_racks, counts[b], b))


def plan_decommission(assignment: Assignment, brokers: Mapping[int, str], leaving: set[int]) -> Plan:
    """Move every replica off the ``leaving`` brokers onto the others (``brokers``: id -> rack, the
    brokers that may receive replicas). Each replaced replica keeps its position, so a preferred
    leader that leaves is replaced by the new broker in first place."""
    staying = {b: r for b, r in brokers.items() if b not in leaving}
    counts = replica_counts(assignment, staying)
    moves: dict[tuple[str, int], list[int]] = {}
    for tp in sorted(assignment):
        replicas = list(assignment[tp])
        if not set(replicas) & leaving:
            continue
        target = list(replicas)
        for i, r in enumerate(replicas):
            if r not in leaving:
                continue
            candidates = [b for b in staying if b not in target]
            if not candidates:
                raise PlanError(f"{tp[0]}-{tp[1]} has {len(replicas)} replicas but only {len(staying)} brokers "
                                f"would remain: lower its replication factor or add brokers first")
            used = {staying.get(x, "") for x in target if x != r} - {""}
            chosen = _pick(candidates, counts, staying, used)
            target[i] = chosen
            counts[chosen] += 1
        moves[tp] = target
    return Plan(moves)


def plan_rebalance(assignment: Assignment, brokers: Mapping[int, str]) -> Plan:
    """Even out replicas (then preferred leaders) across ``brokers``: until the most and least loaded
    brokers differ by at most one, move one replica from the most to the least loaded broker. Leaders
    are evened by reordering a partition's replicas (no data moves for that)."""
    if not brokers:
        raise PlanError("no brokers to place replicas on")
    targets = {tp: list(r) for tp, r in assignment.items()}
    counts = replica_counts(targets, brokers)
    for _ in range(MAX_REBALANCE_ROUNDS):
        most = max(counts, key=lambda b: (counts[b], -b))
        least = min(counts, key=lambda b: (counts[b], b))
        if counts[most] - counts[least] <= 1:
            break
        movable = [tp for tp in sorted(targets) if most in targets[tp] and least not in targets[tp]]
        if not movable:
            break
        tp = movable[0]
        targets[tp][targets[tp].index(most)] = least
        counts[most] -= 1
        counts[least] += 1
    leaders = dict.fromkeys(brokers, 0)
    for replicas in targets.values():
        if replicas and replicas[0] in leaders:
            leaders[replicas[0]] += 1
    for _ in range(MAX_REBALANCE_ROUNDS):
        most = max(leaders, key=lambda b: (leaders[b], -b))
        least = min(leaders, key=lambda b: (leaders[b], b))
        if leaders[most] - leaders[least] <= 1:
            break
        candidates = [tp for tp in sorted(targets) if targets[tp] and targets[tp][0] == most and least in targets[tp]]
        if not candidates:
            break
        tp = candidates[0]
        replicas = targets[tp]
        replicas.remove(least)
        replicas.insert(0, least)
        leaders[most] -= 1
        leaders[least] += 1
    return Plan({tp: r for tp, r in targets.items() if r != list(assignment[tp])})


def plan_replication_factor(assignment: Assignment, brokers: Mapping[int, str], topic: str, replication_factor: int,
                            isr: Mapping[tuple[str, int], list[int]],
                            leaders: Mapping[tuple[str, int], int]) -> Plan:
    """Give every partition of ``topic`` ``replication_factor`` replicas (``brokers``: id -> rack, the live
    brokers that may receive replicas; ``assignment``: the whole cluster's, for the load).

    Growing appends the least loaded brokers the partition does not use, other racks first, so the
    preferred leader stays. Shrinking keeps the leader, then the live in-sync replicas, then the other live
    ones, then stopped ones, each in the partition's order (so a kept preferred leader stays first): the
    moves drop only what is not needed and copy nothing when the in-sync replicas suffice."""
    if replication_factor < 1:
        raise PlanError(f"the replication factor must be at least 1, got {replication_factor}")
    counts = replica_counts(assignment, brokers)
    moves: dict[tuple[str, int], list[int]] = {}
    for tp in sorted(t for t in assignment if t[0] == topic):
        replicas = list(assignment[tp])
        if len(replicas) < replication_factor:
            target = list(replicas)
            while len(target) < replication_factor:
                candidates = [b for b in brokers if b not in target]
                if not candidates:
                    raise PlanError(f"{tp[0]}-{tp[1]} needs {replication_factor} replicas but only {len(brokers)} "
                                    f"live brokers can hold one")
                chosen = _pick(candidates, counts, brokers, {brokers.get(x, "") for x in target} - {""})
                target.append(chosen)
                counts[chosen] += 1
        elif len(replicas) > replication_factor:
            in_sync = set(isr.get(tp, ()))
            leader = leaders.get(tp, -1)
            # The leader, then live in-sync replicas, then live ones (they catch up), then stopped ones: a move
            # keeping a stopped replica waits for it to come back (audit: it dropped a live copy for a dead one).
            ranked = sorted(replicas, key=lambda r: (r != leader, r not in in_sync or r not in brokers,
                                                     r not in brokers, replicas.index(r)))
            kept = set(ranked[:replication_factor])
            target = [r for r in replicas if r in kept]
        else:
            continue
        moves[tp] = target
    return Plan(moves)
