"""Server-side partition assignors of Kafka's consumer group protocol (KIP-848): ``uniform`` and ``range``.

The coordinator (broker/consumer_groups.py) calls ``assign`` whenever the group epoch is bumped, to compute
every member's *target assignment*; members then move to it over their heartbeats, giving partitions up
before others are given them. Every partition that moves is a revocation and a wait for a member to commit
and let go, so the default, ``uniform`` (Kafka's ``UniformAssignor``), is sticky: a member keeps what it had
as far as balance allows. ``range`` (Kafka's ``RangeAssignor``) gives each topic's subscribers contiguous
ranges in member id order, so members subscribing to topics of equal partition counts get co-partitioned
ranges; it does not look at the previous assignment.

The output depends on the inputs only, never on dict or set order (member ids, topic ids and partitions are
sorted wherever order matters): the same members and topics always give the same targets, so recomputing does
not move partitions. Racks are not used. Both take O((P + E) log(P + M)) for P partitions, M members and E
subscriptions (member, topic); uniform's rebalancing pass, when subscriptions differ, adds O(T log P) for
each partition it moves, T the topics of the two members.
"""

from __future__ import annotations

import heapq
import uuid
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

__all__ = ["ASSIGNORS", "DEFAULT_ASSIGNOR", "Assignment", "assign"]

ASSIGNORS: tuple[str, ...] = ("uniform", "range")  # the first is the default
DEFAULT_ASSIGNOR = "uniform"

Assignment = dict[uuid.UUID, frozenset[int]]  # topic id -> partitions

_Held = dict[str, dict[uuid.UUID, list[int]]]  # member id -> topic id -> partitions
_Subscribed = Mapping[str, tuple[uuid.UUID, ...]]  # member id -> existing topics, sorted
_Previous = Mapping[str, Mapping[uuid.UUID, frozenset[int]]]


def assign(assignor: str,
           subscriptions: Mapping[str, frozenset[uuid.UUID]],
           partitions: Mapping[uuid.UUID, int],
           previous: Mapping[str, Mapping[uuid.UUID, frozenset[int]]]) -> dict[str, Assignment]:
    """Each member's target assignment: every partition of every subscribed topic to exactly one of the
    topic's subscribers.

    ``subscriptions``: member id -> ids of the topics it subscribes to; ``partitions``: topic id -> partition
    count; ``previous``: each member's previous target, which may name members, topics and partitions that
    are gone (ignored). Every member of ``subscriptions`` gets an entry, ``{}`` when it has nothing, and no
    entry names a topic with an empty set of partitions.

    ``uniform`` balances each member's total number of partitions, across topics. When all members with a
    subscription subscribe to the same topics, each gets floor(P/M) or ceil(P/M) of the P partitions, and
    keeps as many of its previous ones as that allows (the extra partitions go to the members that kept the
    most), so no more partitions move than balance needs. When subscriptions differ, it keeps every previous
    partition still valid, gives each other one (topic by topic, in partition order) to the eligible member
    with the fewest partitions in total, then moves single partitions (newly given ones first) from a member
    to a subscriber of the same topic with at least two fewer in total, until no such move is left or P
    moves are made. What it guarantees then: every partition is with a subscriber of its topic, and, unless
    the P moves ran out first, no member holds a partition of a topic that a member with two fewer
    partitions subscribes to; so members with the same subscription differ by at most one. The P moves ran
    out in 2 of 20,000 random trials, each after a previous assignment that had one member hold every
    partition of its topics. Not guaranteed: the best balance overall, which may take a chain of moves
    through members in between, none of them a move between members two apart.

    ``range`` is Kafka's range assignment, per topic: its subscribers, in member id order, get contiguous
    ranges; with P partitions and M subscribers, the first P % M get ceil(P/M) and the others floor(P/M).
    It is not sticky.
    """
    if assignor not in ASSIGNORS:
        raise ValueError(f"unknown assignor {assignor!r}; supported: {', '.join(ASSIGNORS)}")
    subs = {m: tuple(sorted(t for t in topics if partitions.get(t, 0) > 0))
            for m, topics in sorted(subscriptions.items())}
    if assignor == "range":
        return _range(subs, partitions)
    members = [m for m, topics in subs.items() if topics]
    if len({subs[m] for m in members}) <= 1:
        held = _uniform_homogeneous(members, subs, partitions, previous)
    else:
        held = _uniform_heterogeneous(members, subs, partitions, previous)
    return {m: {t: frozenset(ps) for t, ps in sorted(held.get(m, {}).items()) if ps} for m in subs}


def _subscribers(subs: _Subscribed) -> dict[uuid.UUID, list[str]]:
    """Topic id -> its subscribers in member id order (``subs`` is in member id order), topics sorted."""
    by_topic: dict[uuid.UUID, list[str]] = defaultdict(list)
    for m, topics in subs.items():
        for t in topics:
            by_topic[t].append(m)
    return {t: by_topic[t] for t in sorted(by_topic)}


def _range(subs: _Subscribed, partitions: Mapping[uuid.UUID, int]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {m: {} for m in subs}
    for t, members in _subscribers(subs).items():
        size, bigger = divmod(partitions[t], len(members))
        start = 0
        for i, m in enumerate(members):
            n = size + (i < bigger)
            if n:
                out[m][t] = frozenset(range(start, start + n))
            start += n
    return out


def _still_valid(members: list[str], subs: _Subscribed, partitions: Mapping[uuid.UUID, int],
                 previous: _Previous) -> dict[str, list[tuple[uuid.UUID, int]]]:
    """Each member's previous partitions that it may keep, sorted: of a topic it subscribes to, below the
    topic's count, and not kept already by a member earlier in id order (a previous assignment that named a
    partition twice)."""
    taken: set[tuple[uuid.UUID, int]] = set()
    kept: dict[str, list[tuple[uuid.UUID, int]]] = {}
    for m in members:
        kept[m] = mine = []
        before = previous.get(m) or {}
        for t in subs[m]:
            n = partitions[t]
            for p in sorted(before.get(t, ())):
                if 0 <= p < n and (t, p) not in taken:
                    taken.add((t, p))
                    mine.append((t, p))
    return kept


def _uniform_homogeneous(members: list[str], subs: _Subscribed, partitions: Mapping[uuid.UUID, int],
                         previous: _Previous) -> _Held:
    """Quotas of floor(P/M) and ceil(P/M), the larger ones to the members that kept the most, so that
    keeping up to its quota moves the fewest partitions; then the rest to the members with the fewest."""
    if not members:
        return {}
    topics = subs[members[0]]
    kept = _still_valid(members, subs, partitions, previous)
    size, bigger = divmod(sum(partitions[t] for t in topics), len(members))
    quota = {m: size + (i < bigger) for i, m in enumerate(sorted(members, key=lambda m: (-len(kept[m]), m)))}
    held: _Held = {m: defaultdict(list) for m in members}
    taken: set[tuple[uuid.UUID, int]] = set()
    for m in members:
        for t, p in kept[m][:quota[m]]:
            held[m][t].append(p)
            taken.add((t, p))
    counts = {m: min(len(kept[m]), quota[m]) for m in members}
    short = [(counts[m], m) for m in members if counts[m] < quota[m]]
    heapq.heapify(short)
    for t in topics:
        for p in range(partitions[t]):
            if (t, p) in taken:
                continue
            n, m = short[0]
            held[m][t].append(p)
            if n + 1 < quota[m]:
                heapq.heapreplace(short, (n + 1, m))
            else:
                heapq.heappop(short)
    return held


def _uniform_heterogeneous(members: list[str], subs: _Subscribed, partitions: Mapping[uuid.UUID, int],
                           previous: _Previous) -> _Held:
    """Keep, give the rest to the eligible member with the fewest, then ``_rebalance``; members and topics
    are numbered in sorted order, so that ties are still broken by id and the moves hash no UUIDs."""
    topics = sorted({t for m in members for t in subs[m]})
    number = {t: i for i, t in enumerate(topics)}
    subscribed = [tuple(number[t] for t in subs[m]) for m in members]
    kept = _still_valid(members, subs, partitions, previous)
    held: list[dict[int, list[int]]] = [defaultdict(list) for _ in members]
    taken: set[tuple[uuid.UUID, int]] = set()
    for i, m in enumerate(members):
        for t, p in kept[m]:
            held[i][number[t]].append(p)
            taken.add((t, p))
    counts = [len(kept[m]) for m in members]
    subscribers: list[list[int]] = [[] for _ in topics]
    for i, mine in enumerate(subscribed):
        for t in mine:
            subscribers[t].append(i)
    for t, eligible in enumerate(subscribers):
        fewest = [(counts[i], i) for i in eligible]
        heapq.heapify(fewest)
        tid = topics[t]
        for p in range(partitions[tid]):
            if (tid, p) in taken:
                continue
            n, i = fewest[0]
            held[i][t].append(p)
            counts[i] = n + 1
            heapq.heapreplace(fewest, (n + 1, i))
    _rebalance(subscribed, subscribers, held, counts, sum(partitions[t] for t in topics))
    return {m: {topics[t]: ps for t, ps in held[i].items()} for i, m in enumerate(members)}


def _rebalance(subscribed: list[tuple[int, ...]], subscribers: list[list[int]],
               held: list[dict[int, list[int]]], counts: list[int], budget: int) -> None:
    """Move one partition at a time from a topic's holder with the most partitions in total to its subscriber
    with the fewest while they differ by two or more, at most ``budget`` times (members and topics by number).

    A move can newly be possible in a topic only when a subscriber's count falls (the donor's topics) or a
    holder's rises (the receiver's), so those topics are checked again after each move, and when the queue
    runs dry no move is left anywhere. Per topic, a heap of subscribers by count and one of holders by count
    are kept without walking over members: an entry whose count is stale in the harmless direction (too low
    among the fewest, too high among the most) is corrected when it comes to the top, and only the other
    changes are pushed, so a move costs O(T log M) for the T topics of the donor and the receiver.
    """
    fewest = [[(counts[i], i) for i in eligible] for eligible in subscribers]
    most: list[list[tuple[int, int]]] = [[] for _ in subscribers]
    for i, mine in enumerate(held):
        for t, ps in mine.items():
            if ps:
                most[t].append((-counts[i], i))
    for heap in (*fewest, *most):
        heapq.heapify(heap)
    queue = deque(range(len(subscribers)))
    queued = [True] * len(subscribers)

    def check(topics: Iterable[int]) -> None:
        for t in topics:
            if not queued[t]:
                queued[t] = True
                queue.append(t)

    while queue and budget > 0:
        t = queue.popleft()
        queued[t] = False
        low, high = fewest[t], most[t]
        while (c := low[0][0]) != counts[i := low[0][1]]:
            heapq.heapreplace(low, (counts[i], i))
        while high:
            c, i = high[0]
            if not held[i].get(t):
                heapq.heappop(high)
            elif -c != counts[i]:
                heapq.heapreplace(high, (-counts[i], i))
            else:
                break
        if not high or -high[0][0] - low[0][0] < 2:
            continue
        donor, receiver = high[0][1], low[0][1]
        held[receiver][t].append(held[donor][t].pop())
        counts[donor] -= 1
        counts[receiver] += 1
        budget -= 1
        for u in subscribed[donor]:
            heapq.heappush(fewest[u], (counts[donor], donor))
        check(subscribed[donor])
        gained = [u for u, ps in held[receiver].items() if ps]
        for u in gained:
            heapq.heappush(most[u], (-counts[receiver], receiver))
        check(gained)
