"""Replica placement for new topics and partitions: balanced and rack-aware.

A pure function of the live brokers, the load they already carry and a start index
the controller draws at random before proposing: the same inputs give the same
assignment, so a proposal can be replayed and tested.

Greedy, partition by partition, the topic first and the cluster second:
- the first replica (the preferred leader) goes to the broker that is the preferred
  leader of the fewest of this topic's partitions, then of the fewest partitions in the
  cluster (then carrying the fewest replicas): each broker leads P/N of a topic's
  partitions, give or take one, as Kafka's striping gives, and the partitions left over
  go to the brokers leading least. A topic's load is mostly its own: a topic placed by
  cluster-wide counts alone could lead half its partitions from one broker (seen: 3, 2
  and 1 of 6 on three brokers), whose event loop then set the topic's latency;
- every further replica goes to a broker on a rack this partition does not use yet
  (while such racks remain), then to the one holding the fewest of this topic's
  replicas, then the fewest in the cluster;
- ties rotate with the start index and the partition number, like Kafka's striping,
  so equal brokers take turns instead of the lowest id winning every tie;
- a broker holding as many replicas as its capacity (``BrokerLoad.capacity``, what it
  registered with: its descriptor limit / 12 or ``max.partitions.per.broker``) takes no
  more; when fewer brokers than the replication factor have room the whole call is
  refused (POLICY_VIOLATION), nothing placed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proto import errors


@dataclass(frozen=True, slots=True)
class BrokerLoad:
    node_id: int
    rack: str = ""
    replicas: int = 0  # partitions it already holds a replica of
    leaders: int = 0  # partitions it is already the preferred leader of
    capacity: int = 0  # most replicas it may hold; 0 = unbounded


def full_brokers_text(brokers: Sequence[BrokerLoad], replica_load: Mapping[int, int] | None = None) -> str:
    """'broker 1 holds 166 of its capacity of 166, ...' for the brokers without room; with ``replica_load`` (what
    they would hold with the replicas of the request placed so far), 'broker 1 holds 3 of its capacity of 166,
    and would hold 166 with this request's'."""
    load = replica_load or {b.node_id: b.replicas for b in brokers}
    full = [f"broker {b.node_id} holds {b.replicas} of its capacity of {b.capacity}"
            + (f", and would hold {load[b.node_id]} with this request's" if load[b.node_id] != b.replicas else "")
            for b in sorted(brokers, key=lambda b: b.node_id) if 0 < b.capacity <= load[b.node_id]]
    return "; ".join(full)


def place_replicas(
    brokers: Sequence[BrokerLoad], num_partitions: int, replication_factor: int, *, start_index: int = 0,
    topic_assignments: Sequence[Sequence[int]] = (),
) -> list[list[int]]:
    """Replica lists for ``num_partitions`` new partitions (first = preferred leader).
    ``topic_assignments``: the replica lists of the topic's existing partitions (partitions added
    to a topic balance with them)."""
    if num_partitions < 1:
        raise errors.InvalidPartitionsError(f"number of partitions must be at least 1, got {num_partitions}")
    if replication_factor < 1:
        raise errors.InvalidReplicationFactorError(
            f"replication factor must be at least 1, got {replication_factor}")
    if replication_factor > len(brokers):
        raise errors.InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {len(brokers)} available brokers")
    ordered = sorted(brokers, key=lambda b: b.node_id)
    ids = [b.node_id for b in ordered]
    rack_of: Mapping[int, str] = {b.node_id: b.rack for b in ordered}
    replica_load = {b.node_id: b.replicas for b in ordered}
    leader_load = {b.node_id: b.leaders for b in ordered}
    capacity = {b.node_id: b.capacity for b in ordered}

    def has_room(node: int) -> bool:
        return capacity[node] <= 0 or replica_load[node] < capacity[node]

    def refuse(have_room: int) -> errors.PolicyViolationError:
        return errors.PolicyViolationError(
            f"replication factor {replication_factor} needs {replication_factor} brokers with room for a "
            f"partition replica, {have_room} of the {len(ordered)} live brokers have it "
            f"({full_brokers_text(ordered, replica_load)}; a broker's capacity is its file-descriptor limit / 12, "
            f"or its max.partitions.per.broker): raise the limits, add brokers or delete topics")

    room_now = sum(1 for b in ids if has_room(b))
    if room_now < replication_factor:
        raise refuse(room_now)
    racks_total = len(set(rack_of.values()))
    n = len(ids)
    position = {node: i for i, node in enumerate(ids)}
    topic_leaders = dict.fromkeys(ids, 0)
    topic_replicas = dict.fromkeys(ids, 0)
    for existing in topic_assignments:
        if existing and existing[0] in topic_leaders:
            topic_leaders[existing[0]] += 1
        for b in existing:
            if b in topic_replicas:
                topic_replicas[b] += 1

    assignments: list[list[int]] = []
    for p in range(num_partitions):
        offset = start_index + p

        def turn(node: int, _offset: int = offset) -> int:
            return (position[node] - _offset) % n

        with_room = [b for b in ids if has_room(b)]
        if len(with_room) < replication_factor:
            raise refuse(len(with_room))  # earlier partitions of this call filled brokers: none is placed
        leader = min(with_room, key=lambda b: (topic_leaders[b], leader_load[b], replica_load[b], turn(b)))
        chosen = [leader]
        used_racks = {rack_of[leader]}
        for _ in range(replication_factor - 1):
            need_new_rack = len(used_racks) < racks_total
            follower = min(
                (b for b in with_room if b not in chosen),
                key=lambda b: (need_new_rack and rack_of[b] in used_racks, topic_replicas[b], replica_load[b],
                               turn(b)),
            )
            chosen.append(follower)
            used_racks.add(rack_of[follower])
        leader_load[leader] += 1
        topic_leaders[leader] += 1
        for b in chosen:
            replica_load[b] += 1
            topic_replicas[b] += 1
        assignments.append(chosen)
    return assignments
