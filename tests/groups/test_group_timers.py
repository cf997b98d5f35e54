"""The group coordinator's timers: a tick does O(groups due) work, and fires exactly what it fired before.

Audit: each tick (ten a second) asked every group for its next deadline under the coordinator's lock,
about 70 ms of it per tick at 20,000 groups. The timers are deadline-ordered now (GroupTimers).

- a tick with thousands of idle groups asks only the groups whose deadline came (counted: calls of
  ``Group.next_deadline_ms`` and ``Group.tick``, never time);
- random histories (dynamic and static members, pending member ids, rebalances, syncs, heartbeats,
  leaves, deletes) give the same groups and the same answers, tick after tick, as the walk over every
  group the coordinator did before;
- the heap stays bounded while entries are replaced and groups removed.

A real GroupCoordinator without a cluster (appends to __consumer_offsets succeed at once).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import random
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from broker.group_coordinator import CoordinatorConfig, CoordinatorError, GroupCoordinator, _PartitionLoad
from broker.group_state import Group, GroupState
from proto import group_pb2
from proto.common_pb2 import ErrorCode

LONG_SESSION_MS = 1_800_000  # group.max.session.timeout.ms's default
SHORT_SESSION_MS = 6_000  # group.min.session.timeout.ms's default


class FakeReplicaManager:
    def __init__(self) -> None:
        self.appended = 0

    def append_records(self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(types.SimpleNamespace(base_offset=self.appended))
        self.appended += 1
        return fut


def coordinator(**config: Any) -> tuple[GroupCoordinator, list[int]]:
    now = [1_000_000]
    c = GroupCoordinator(node_id=1, replica_manager=FakeReplicaManager(), metadata_cache=None,
                         config=CoordinatorConfig(**config), clock_ms=lambda: now[0])
    for p in range(c.config.offsets_topic_num_partitions):
        c._partitions[p] = _PartitionLoad(leader_epoch=0, loaded=True)
    return c, now


def join(c: GroupCoordinator, group: str, *, member_id: str = "", instance: str = "",
         session_ms: int = LONG_SESSION_MS, rebalance_ms: int = 5_000, protocol: str = "range") -> list[Any]:
    answers: list[Any] = []
    c.start_join(group_pb2.JoinGroupRequest(
        group_id=group, member_id=member_id, client_id="c", session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms, group_instance_id=instance, protocol_type="consumer",
        protocols=[group_pb2.GroupProtocol(name=protocol, metadata=b"m")]), answers.append)
    return answers


def sync(c: GroupCoordinator, group: str, member_id: str, generation: int, assignments: dict[str, bytes],
         instance: str = "") -> list[Any]:
    answers: list[Any] = []
    now = c.start_sync(group_pb2.SyncGroupRequest(
        group_id=group, member_id=member_id, generation_id=generation, group_instance_id=instance,
        assignments=[group_pb2.SyncGroupAssignment(member_id=m, assignment=a) for m, a in assignments.items()]),
        answers.append)
    if now is not None:
        answers.append(now)
    return answers


class Counted:
    """Calls of Group.next_deadline_ms (a group asked for its deadline) and Group.tick (a group's timers fired)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked = 0
        self.ticked: list[str] = []
        asked, ticked = Group.next_deadline_ms, Group.tick

        def counting_asked(g: Group, now_ms: int | None = None) -> int | None:
            self.asked += 1
            return asked(g, now_ms)

        def counting_ticked(g: Group, now_ms: int) -> None:
            self.ticked.append(g.group_id)
            ticked(g, now_ms)

        monkeypatch.setattr(Group, "next_deadline_ms", counting_asked)
        monkeypatch.setattr(Group, "tick", counting_ticked)

    def reset(self) -> None:
        self.asked = 0
        self.ticked.clear()


@pytest.fixture()
def coord() -> Iterator[tuple[GroupCoordinator, list[int]]]:
    c, now = coordinator(group_initial_rebalance_delay_ms=0)
    try:
        yield c, now
    finally:
        c._loader.shutdown()


def stable_group(c: GroupCoordinator, now: list[int], group: str, session_ms: int) -> None:
    """One static member, its join round completed and its assignment handed in: Stable."""
    [joined] = join(c, group, instance="i", session_ms=session_ms)
    assert joined.error_code == ErrorCode.NONE, joined
    g = c._groups[group]
    [synced] = sync(c, group, joined.member_id, joined.generation_id, {joined.member_id: b"a"}, "i")
    assert synced.error_code == ErrorCode.NONE and g.state == GroupState.STABLE, (synced, g.state)


def test_a_tick_asks_only_the_groups_whose_deadline_came(coord: tuple[GroupCoordinator, list[int]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    c, now = coord
    idle = [f"idle-{i}" for i in range(5000)]
    expiring = [f"short-{i}" for i in range(5)]
    for gid in idle:
        stable_group(c, now, gid, LONG_SESSION_MS)
    for gid in expiring:
        stable_group(c, now, gid, SHORT_SESSION_MS)
    counted = Counted(monkeypatch)
    c.tick()  # the groups made since the last tick are asked once
    assert not counted.ticked
    counted.reset()
    for _ in range(100):  # 10 s of ticks, nobody heartbeating: the short sessions run out at 6 s
        now[0] += 100
        c.tick()
    assert sorted(counted.ticked) == expiring
    assert all(c._groups[gid].state == GroupState.EMPTY for gid in expiring)
    assert all(c._groups[gid].state == GroupState.STABLE for gid in idle[:50])
    # O(expired): each expiring group asked a few times (its entry, then its next one), the idle ones
    # never. Asking every group each tick was 100 x 5,005 = 500,500.
    assert counted.asked <= 10 * len(expiring), counted.asked


def test_heartbeats_move_a_deadline_later_without_waking_the_group_every_tick(
        coord: tuple[GroupCoordinator, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    c, now = coord
    stable_group(c, now, "beating", SHORT_SESSION_MS)
    for i in range(200):
        stable_group(c, now, f"idle-{i}", LONG_SESSION_MS)
    g = c._groups["beating"]
    member = next(iter(g.members))
    c.tick()
    counted = Counted(monkeypatch)
    for step in range(300):  # 30 s, a heartbeat a second: the session never runs out
        now[0] += 100
        if step % 10 == 0:
            assert c.heartbeat("beating", member, g.generation_id, "i") == ErrorCode.NONE
        c.tick()
    assert g.state == GroupState.STABLE and member in g.members
    assert not counted.ticked
    # Asked when its remembered deadline comes (about every 5 s: its last heartbeat's session end), never
    # the idle groups. Asking every group each tick was 300 x 201 = 60,300.
    assert counted.asked <= 4 * (30 // 5 + 2), counted.asked


def _snapshot(c: GroupCoordinator) -> dict[str, Any]:
    return {gid: (g.state, g.generation_id, g.leader_id, g.protocol_name, sorted(g.pending_members.items()),
                  sorted((m.member_id, m.last_heartbeat_ms, m.session_timeout_ms, m.group_instance_id, m.assignment)
                         for m in g.members.values()), dict(g.static_members))
            for gid, g in sorted(c._groups.items())}


def _walk_every_group(c: GroupCoordinator) -> None:
    """The tick as it was: every group asked, each due one ticked."""
    with c._lock:
        now = c.clock_ms()
        for g in list(c._groups.values()):
            deadline = g.next_deadline_ms(now)
            if deadline is not None and deadline <= now:
                g.tick(now)
                c._after_change_locked(g)
                c._drop_if_vacant_locked(g, now)  # the policy both ways: what is compared is the timers


def _history(seed: int, tick_of: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A random history; returns what every step answered and what the groups looked like after it."""
    ids = itertools.count(1)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(ids)))  # member ids: the same in both runs
    rng = random.Random(seed)
    c, now = coordinator(group_initial_rebalance_delay_ms=rng.choice([0, 300]))
    log: list[Any] = []
    members: dict[str, list[tuple[str, str]]] = {}  # group -> (member id, instance id) ever answered
    try:
        for _ in range(400):
            gid = f"g{rng.randrange(6)}"
            known = members.setdefault(gid, [])
            op = rng.random()
            session = rng.choice([SHORT_SESSION_MS, 8_000, 20_000])
            rebalance = rng.choice([1_000, 4_000])
            answers: list[Any] = []
            name = "tick"
            try:
                name = "request"
                if op < 0.15:  # a dynamic member: MEMBER_ID_REQUIRED, then (maybe) back with the id
                    answers = join(c, gid, session_ms=session, rebalance_ms=rebalance)
                    if answers and answers[0].error_code == ErrorCode.MEMBER_ID_REQUIRED and rng.random() < 0.7:
                        answers += join(c, gid, member_id=answers[0].member_id, session_ms=session,
                                        rebalance_ms=rebalance)
                elif op < 0.25:
                    answers = join(c, gid, instance=f"i{rng.randrange(3)}", session_ms=session, rebalance_ms=rebalance,
                                   protocol=rng.choice(["range", "range", "sticky"]))
                elif op < 0.35 and known:
                    mid, inst = rng.choice(known)
                    answers = join(c, gid, member_id=mid, instance=inst, session_ms=session, rebalance_ms=rebalance)
                elif op < 0.45 and gid in c._groups:
                    g = c._groups[gid]
                    who = g.leader_id if rng.random() < 0.7 else rng.choice([m for m, _ in known] or [""])
                    inst = g.members[who].group_instance_id if who in g.members else ""
                    answers = sync(c, gid, who, g.generation_id, {m: b"x" for m in g.members}, inst)
                elif op < 0.6 and known:
                    mid, inst = rng.choice(known)
                    g = c._groups.get(gid)
                    answers = [c.heartbeat(gid, mid, g.generation_id if g else 0, inst)]
                elif op < 0.66 and known:
                    mid, inst = rng.choice(known)
                    answers = c.leave_group(gid, [(mid, inst if rng.random() < 0.5 else "")])
                elif op < 0.68:
                    c.delete_group(gid)
                else:
                    name = "tick"
                    now[0] += rng.choice([50, 100, 100, 700, 2_500, 7_000])
                    tick_of(c)
            except CoordinatorError as exc:
                answers = [("refused", exc.code)]
            for a in answers:
                if getattr(a, "member_id", ""):
                    known.append((a.member_id, ""))
                    g = c._groups.get(gid)
                    if g is not None and a.member_id in g.members:
                        known[-1] = (a.member_id, g.members[a.member_id].group_instance_id)
            log.append((name, answers, _snapshot(c)))
    finally:
        c._loader.shutdown()
    return log


@pytest.mark.parametrize("seed", range(10))
def test_random_histories_tick_as_the_walk_over_every_group_did(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ordered = _history(seed, GroupCoordinator.tick, monkeypatch)
    walked = _history(seed, _walk_every_group, monkeypatch)
    for step, (a, b) in enumerate(zip(ordered, walked, strict=True)):
        assert a == b, (seed, step)
    states = {state for _, _, snap in ordered for state, *_ in snap.values()}
    assert {GroupState.EMPTY, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE,
            GroupState.STABLE} <= states, states
    # Ticks did fire timers (members and pending ids ran out, rounds ended), not only requests.
    fired = sum(1 for (name, _, snap), (_, _, before) in zip(ordered[1:], ordered, strict=False)
                if name == "tick" and snap != before)
    assert fired >= 5, fired


def test_the_heap_stays_within_three_times_the_scheduled_groups(coord: tuple[GroupCoordinator, list[int]]) -> None:
    """Entries replaced (a deadline moved earlier) or left by removed groups are dropped lazily; the heap is
    rebuilt when they outnumber the live ones twice over."""
    c, now = coord
    for rnd in range(30):
        for i in range(100):
            gid = f"g{i}"
            if i % 2 and gid in c._groups:
                c.delete_group(gid)  # (no members, only pending ids) its entry goes stale
            # A pending member id (MEMBER_ID_REQUIRED) with a shorter session each round: an earlier deadline.
            join(c, gid, session_ms=LONG_SESSION_MS - rnd * 1000)
        now[0] += 100
        c.tick()
        entries, live = c.timers.sizes()
        assert entries <= 3 * live + 64, (rnd, entries, live)
    assert c.timers.rebuilds > 0
    # And what is due still fires: the pending ids run out.
    now[0] += LONG_SESSION_MS
    c.tick()
    assert all(not g.pending_members for g in c._groups.values())


@pytest.mark.parametrize("step_s", [3600, -3600])
def test_a_wall_clock_step_moves_no_members_session(step_s: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's own clock (steady_wall_clock): a wall clock stepped an hour forward (NTP after a VM
    resume) expired every member's session at the next tick and every group rebalanced; stepped an hour back, a
    member that died stayed in its group, its partitions assigned and unread, for the hour."""
    import time as time_module

    from broker.group_coordinator import steady_wall_clock

    c = GroupCoordinator(node_id=1, replica_manager=FakeReplicaManager(), metadata_cache=None,
                         config=CoordinatorConfig(group_initial_rebalance_delay_ms=0))
    try:
        for p in range(c.config.offsets_topic_num_partitions):
            c._partitions[p] = _PartitionLoad(leader_epoch=0, loaded=True)
        stable_group(c, [0], "g", SHORT_SESSION_MS)
        wall = time_module.time
        monkeypatch.setattr(time_module, "time", lambda: wall() + step_s)
        c.tick()
        g = c._groups["g"]
        assert g.state == GroupState.STABLE and len(g.members) == 1, (g.state, list(g.members))
        # The session still ends when it should: a member silent for its session timeout is gone.
        steady = time_module.monotonic
        monkeypatch.setattr(time_module, "monotonic", lambda: steady() + SHORT_SESSION_MS / 1000 + 1)
        c.tick()
        assert not g.members and g.state == GroupState.EMPTY, (g.state, list(g.members))
        assert abs(steady_wall_clock()() - (wall() + step_s) * 1000) < 5_000  # a new clock reads the wall clock
    finally:
        c._loader.shutdown()


def test_a_group_whose_only_member_never_came_back_is_dropped_when_its_id_expires() -> None:
    """A JoinGroup answered MEMBER_ID_REQUIRED makes the group; when the id handed out expired, the group stayed,
    Empty, with nothing in it: 38,000 such groups from 100 addresses in a minute, each in every ListGroups answer
    after (audit). Groups with a generation or committed offsets stay."""
    c, now = coordinator()
    try:
        for gid in ("vacant", "joined", "committed"):
            [required] = join(c, gid, session_ms=SHORT_SESSION_MS)
            assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED
        member = join(c, "joined", member_id="", session_ms=SHORT_SESSION_MS)[0].member_id
        assert join(c, "joined", member_id=member, session_ms=SHORT_SESSION_MS) == []  # waits for the round
        from broker.group_state import OffsetEntry
        from client.types import TopicPartition

        c._groups["committed"].offsets[TopicPartition("t", 0)] = OffsetEntry(5, -1, "", now[0])  # as a commit leaves it
        now[0] += SHORT_SESSION_MS + 1
        c.tick()
        listed = {g.group_id for g in c.list_groups(set())}
        assert "vacant" not in c._groups and "vacant" not in listed, "a group with nothing in it, nor ever, stayed"
        assert {"joined", "committed"} <= listed, listed
    finally:
        c._loader.shutdown()
