"""Partition leader election: pure functions of (assignment, ISR, who may lead).

Used by the state machine while it applies a command (fencing, unfencing, controlled
shutdown, config changes) and by the active controller when it plans preferred-leader
moves, so both always agree. Nothing here reads a clock or any other input.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class Election:
    leader: int  # NO_LEADER when the partition is offline
    isr: list[int]
    unclean: bool = False  # the leader came from outside the ISR (data may be lost)


def elect_leader(
    replicas: Sequence[int], isr: Sequence[int], eligible: Container[int], *, unclean_allowed: bool,
    last_resort: Container[int] = (),
) -> Election:
    """Choose a leader: the first eligible in-sync replica in assignment order.

    Assignment order makes the first replica the preferred leader, so a healthy
    partition always returns to the same broker. When no in-sync replica is eligible,
    an unclean election picks the first eligible replica (its ISR becomes just itself)
    only if the topic allows it; otherwise the partition is offline (NO_LEADER) with
    its ISR unchanged, so the last in-sync replica can take over when it returns.
    """
    in_sync = set(isr)
    for replica in replicas:
        if replica in in_sync and replica in eligible:
            return Election(replica, list(isr))
    if unclean_allowed:
        # ``last_resort``: replicas whose broker started on an empty disk, likely with none of this partition's
        # records; another eligible replica goes first.
        for replica in sorted(replicas, key=lambda r: r in last_resort):
            if replica in eligible:
                return Election(replica, [replica], unclean=True)
    return Election(NO_LEADER, list(isr))


def isr_without(isr: Sequence[int], broker_id: int) -> list[int]:
    """The ISR after removing a broker; the last member is kept (Kafka's rule).

    An empty ISR would forget which replica has every committed record; keeping the
    last one lets a clean election pick it when it comes back.
    """
    remaining = [r for r in isr if r != broker_id]
    return remaining if remaining else list(isr)


def preferred_leader(replicas: Sequence[int]) -> int:
    return replicas[0] if replicas else NO_LEADER


def can_move_to_preferred(replicas: Sequence[int], isr: Sequence[int], leader: int,
                          eligible: Container[int]) -> bool:
    """A preferred-leader election would change this partition's leader."""
    preferred = preferred_leader(replicas)
    return preferred != NO_LEADER and preferred != leader and preferred in isr and preferred in eligible
