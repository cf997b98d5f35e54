"""The Kafka listener's incremental fetch sessions (KIP-227): the cache's rules, without a broker."""

from __future__ import annotations

import random

from broker.kafka_wire.fetch_sessions import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    CachedPartition,
    FetchSessions,
    Outcome,
    next_epoch,
)

ALICE = ("User:alice", "10.0.0.1")


def _parts(*keys: tuple[str, int], offset: int = 0) -> list[tuple[tuple[str, int], CachedPartition]]:
    return [(k, CachedPartition(offset, 1 << 20, -1)) for k in keys]


def _quiet(plan, hw: int = 5) -> dict:
    return {k: Outcome(0, hw, 0, False, False) for k, _ in plan.fetch}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _open(cache: FetchSessions, *keys: tuple[str, int], owner=ALICE) -> int:
    plan = cache.plan(0, 0, _parts(*keys), [], owner)
    code, sid, carried = cache.respond(plan, _quiet(plan), owner)
    assert code == 0 and carried == set(keys)
    return sid


def test_a_session_carries_only_what_changed_and_takes_partitions_added_and_forgotten() -> None:
    cache = FetchSessions(rng=random.Random(1))
    a, b, c = ("t", 0), ("t", 1), ("u", 0)
    sid = _open(cache, a, b)
    assert sid != 0 and len(cache) == 1 and cache.partitions == 2

    # Epoch 1 names nothing: both partitions are fetched, neither is carried (nothing changed).
    plan = cache.plan(sid, 1, [], [], ALICE)
    assert plan.kind == "incremental" and [k for k, _ in plan.fetch] == [a, b]
    assert cache.respond(plan, _quiet(plan), ALICE) == (0, sid, set())

    # Records on b, a high watermark move on a: both carried; b (it had records) is fetched last from now on.
    plan = cache.plan(sid, 2, [], [], ALICE)
    out = {a: Outcome(0, 6, 0, False, False), b: Outcome(0, 5, 0, True, False)}
    assert cache.respond(plan, out, ALICE) == (0, sid, {a, b})

    # The client moves b's position, adds c and forgets a.
    plan = cache.plan(sid, 3, _parts(b, c, offset=7), [a], ALICE)
    assert [(k, p.fetch_offset) for k, p in plan.fetch] == [(b, 7), (c, 7)] and cache.partitions == 2
    out = {b: Outcome(0, 5, 0, False, False), c: Outcome(0, 9, 0, False, False)}
    assert cache.respond(plan, out, ALICE) == (0, sid, {c})  # c is new to the session: its watermark is news

    # An error is always carried, and the partition again once the error is gone.
    plan = cache.plan(sid, 4, [], [], ALICE)
    assert cache.respond(plan, {b: Outcome(6, -1, -1, False, False), c: Outcome(0, 9, 0, False, False)},
                         ALICE) == (0, sid, {b})
    plan = cache.plan(sid, 5, [], [], ALICE)
    assert cache.respond(plan, {b: Outcome(0, 5, 0, False, False), c: Outcome(0, 9, 0, False, False)},
                         ALICE) == (0, sid, {b})

    # Forgetting every partition closes the session: that fetch is answered without one.
    plan = cache.plan(sid, 6, [], [b, c], ALICE)
    assert plan.kind == "sessionless" and len(cache) == 0 and cache.partitions == 0
    assert cache.respond(plan, {}, ALICE) == (0, 0, set())


def test_wrong_epochs_unknown_ids_and_other_clients_are_refused() -> None:
    cache = FetchSessions(rng=random.Random(2))
    sid = _open(cache, ("t", 0))
    assert cache.plan(sid, 2, [], [], ALICE).error_code == INVALID_FETCH_SESSION_EPOCH
    assert cache.plan(sid + 1, 1, [], [], ALICE).error_code == FETCH_SESSION_ID_NOT_FOUND
    # Another principal, or the same one from another address, is told the session does not exist.
    assert cache.plan(sid, 1, [], [], ("User:mallory", "10.0.0.1")).error_code == FETCH_SESSION_ID_NOT_FOUND
    assert cache.plan(sid, 1, [], [], ("User:alice", "10.0.0.9")).error_code == FETCH_SESSION_ID_NOT_FOUND
    # ...and cannot close it with a full fetch naming it.
    cache.plan(sid, -1, _parts(("t", 0)), [], ("User:mallory", "10.0.0.1"))
    assert len(cache) == 1

    # Two fetches of one epoch (a duplicate): the first to be served moved the epoch on; the second is refused.
    first = cache.plan(sid, 1, [], [], ALICE)
    assert cache.plan(sid, 1, [], [], ALICE).error_code == INVALID_FETCH_SESSION_EPOCH
    assert cache.respond(first, _quiet(first), ALICE)[0] == 0
    # A fetch that was waiting while the next one of its session came in is answered INVALID_FETCH_SESSION_EPOCH.
    waiting = cache.plan(sid, 2, [], [], ALICE)
    later = cache.plan(sid, 3, [], [], ALICE)
    assert cache.respond(waiting, _quiet(waiting), ALICE) == (INVALID_FETCH_SESSION_EPOCH, 0, set())
    assert cache.respond(later, _quiet(later), ALICE)[:2] == (0, sid)

    # FINAL with the id closes the session and is answered without one; INITIAL with it opens another.
    plan = cache.plan(sid, -1, _parts(("t", 0)), [], ALICE)
    assert plan.kind == "sessionless" and len(cache) == 0
    assert cache.respond(plan, _quiet(plan), ALICE) == (0, 0, {("t", 0)})
    assert _open(cache, ("t", 0)) not in (0, sid)


def test_epochs_wrap_past_int32_to_one() -> None:
    assert next_epoch(0) == 1 and next_epoch(41) == 42 and next_epoch(0x7FFFFFFF) == 1


def test_the_cache_is_bounded_and_evicts_as_kafka_does() -> None:
    clock = Clock()
    cache = FetchSessions(max_sessions=16, eviction_s=120, max_partitions=100, clock=clock, rng=random.Random(3))
    # One address holds at most an eighth of the slots: its third session is not cached (answered without one).
    first = _open(cache, ("t", 0))
    _open(cache, ("t", 1))
    assert _open(cache, ("t", 2)) == 0 and len(cache) == 2
    for i in range(14):
        assert _open(cache, ("t", 0), owner=("User:alice", f"10.0.1.{i}")) != 0
    assert len(cache) == 16
    # Full: a young session is never evicted, whatever the newcomer's size.
    big = [("b", i) for i in range(5)]
    assert _open(cache, *big, owner=("User:bob", "10.0.2.1")) == 0
    # Once they are older than the eviction time, the smallest gives way to a larger newcomer only.
    clock.now += 121
    for sid in list(cache._sessions):  # all used just now: none is stale
        cache._sessions[sid].last_used_s = clock.now
    assert _open(cache, ("b", 0), owner=("User:bob", "10.0.2.2")) == 0  # not larger than any
    assert _open(cache, *big, owner=("User:bob", "10.0.2.1")) != 0 and len(cache) == 16 and cache.evictions_total == 1
    # A session unused for the eviction time gives way to any newcomer.
    clock.now += 121
    cache._sessions[first].last_used_s = clock.now - 500 if first in cache._sessions else clock.now
    for sid, s in cache._sessions.items():
        if sid != first:
            s.last_used_s = clock.now
    stale = min(cache._sessions.values(), key=lambda s: s.last_used_s).id
    assert _open(cache, ("c", 0), owner=("User:carol", "10.0.3.1")) != 0 and stale not in cache._sessions

    # At its share, an address's own session unused for the eviction time makes room for its new one (consumers
    # leave without closing theirs); one in use does not.
    mine = FetchSessions(max_sessions=16, eviction_s=120, clock=clock, rng=random.Random(5))
    old_ones = [_open(mine, ("t", i)) for i in range(2)]
    assert _open(mine, ("t", 2)) == 0
    clock.now += 121
    mine._sessions[old_ones[1]].last_used_s = clock.now  # still fetching
    renewed = _open(mine, ("t", 2))
    assert renewed != 0 and old_ones[0] not in mine._sessions and old_ones[1] in mine._sessions
    assert _open(mine, ("t", 3)) == 0 and len(mine) == 2

    # The partitions of all sessions are bounded: a session that grows past it is closed.
    small = FetchSessions(max_partitions=3, rng=random.Random(4))
    sid = _open(small, ("t", 0), ("t", 1))
    plan = small.plan(sid, 1, _parts(("t", 2), ("t", 3)), [], ALICE)
    assert plan.kind == "sessionless" and len(small) == 0 and small.partitions == 0
    assert _open(small, *[("t", i) for i in range(4)]) == 0  # too large to be cached at all
