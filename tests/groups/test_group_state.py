"""The pure group state machine, scenario by scenario (time is passed in, no sleeps)."""

from __future__ import annotations

import itertools
import random

from broker.group_state import Group, GroupState, JoinResult, MemberTable, OffsetEntry, SyncResult
from client.types import TopicPartition as TP
from proto.common_pb2 import ErrorCode

SESSION_MS = 10_000
REBALANCE_MS = 30_000


class Harness:
    """Drives one Group like a set of clients would, recording every answer."""

    def __init__(self, delay_ms: int = 0) -> None:
        ids = itertools.count(1)
        self.group = Group("g", initial_rebalance_delay_ms=delay_ms, new_member_id=lambda c: f"{c}-{next(ids)}")
        self.joins: dict[str, list[JoinResult]] = {}
        self.syncs: dict[str, list[SyncResult]] = {}
        self.now_ms = 1_000

    def join_once(self, client: str, member_id: str, protocols=(("range", b"sub"),)) -> list[JoinResult]:
        """One JoinGroup as sent: its answers so far (none while it waits for the round)."""
        out: list[JoinResult] = []
        self.group.join(member_id=member_id, client_id=client, client_host="h", session_timeout_ms=SESSION_MS,
                        rebalance_timeout_ms=REBALANCE_MS, protocol_type="consumer", protocols=list(protocols),
                        callback=out.append, now_ms=self.now_ms)
        return out

    def join(self, client: str, member_id: str = "", protocols=(("range", b"sub"),), ptype="consumer",
             session_ms: int = SESSION_MS, rebalance_ms: int = REBALANCE_MS) -> str:
        """First join: MEMBER_ID_REQUIRED then a join with the id. Returns the member id."""
        results: list[JoinResult] = []
        self.group.join(member_id=member_id, client_id=client, client_host="h", session_timeout_ms=session_ms,
                        rebalance_timeout_ms=rebalance_ms, protocol_type=ptype, protocols=list(protocols),
                        callback=results.append, now_ms=self.now_ms)
        if not member_id:
            assert results and results[0].error_code == ErrorCode.MEMBER_ID_REQUIRED, results
            member_id = results[0].member_id
            results.clear()
            self.group.join(member_id=member_id, client_id=client, client_host="h",
                            session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                            protocol_type=ptype, protocols=list(protocols), callback=results.append,
                            now_ms=self.now_ms)
        self.joins[member_id] = results
        return member_id

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None) -> list:
        results: list[SyncResult] = []
        self.group.sync(member_id=member_id, generation_id=generation, assignments=assignments or {},
                        callback=results.append, now_ms=self.now_ms)
        self.syncs[member_id] = results
        return results

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        self.group.tick(self.now_ms)

    def rebalance(self, members: list[str]) -> int:
        """All members answered; leader syncs an assignment naming each member."""
        gen = self.group.generation_id
        leader = self.group.leader_id
        assert self.group.state == GroupState.COMPLETING_REBALANCE, self.group.state
        for m in members:
            if m != leader:
                assert self.sync(m, gen) == []  # followers wait for the leader
        self.sync(leader, gen, {m: m.encode() for m in members})
        assert self.group.state == GroupState.STABLE
        for m in members:
            assert self.syncs[m] == [SyncResult(ErrorCode.NONE, "range", m.encode())], self.syncs[m]
        return gen


def test_first_join_requires_member_id_and_unknown_ids_are_refused() -> None:
    h = Harness()
    out = h.join_once("c", "made-up", protocols=[("range", b"")])
    assert out[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    m = h.join("c")
    assert m == "c-1"
    assert h.joins[m][0].error_code == ErrorCode.NONE and h.joins[m][0].generation_id == 1
    assert h.group.state == GroupState.COMPLETING_REBALANCE


def test_two_members_join_sync_and_get_their_assignments() -> None:
    h = Harness()
    a = h.join("a")
    assert h.group.state == GroupState.COMPLETING_REBALANCE and h.group.leader_id == a
    h.rebalance([a])
    b = h.join("b")
    # b's join starts a rebalance; it waits for a (which learns from its heartbeat).
    assert h.joins[b] == [] and h.group.state == GroupState.PREPARING_REBALANCE
    assert h.group.heartbeat(member_id=a, generation_id=1, now_ms=h.now_ms) == ErrorCode.REBALANCE_IN_PROGRESS
    h.join("a", a)
    ja, jb = h.joins[a][0], h.joins[b][0]
    assert ja.generation_id == jb.generation_id == 2
    assert ja.leader == jb.leader == a
    assert [m[0] for m in ja.members] == sorted([a, b]) and jb.members == ()
    h.rebalance([a, b])
    assert h.group.heartbeat(member_id=b, generation_id=2, now_ms=h.now_ms) == ErrorCode.NONE


def test_a_sync_naming_another_protocol_is_refused_and_changes_nothing() -> None:
    """SyncGroup v5+ names the protocol type and name (KIP-559). A leader's sync naming others was answered NONE and
    the group went Stable on its assignment (audit); Kafka answers INCONSISTENT_GROUP_PROTOCOL."""
    h = Harness()
    a = h.join("a")
    for ptype, pname in (("connect", ""), ("", "bogus"), ("consumer", "roundrobin")):
        out: list[SyncResult] = []
        h.group.sync(member_id=a, generation_id=1, assignments={a: b"x"}, callback=out.append, now_ms=h.now_ms,
                     protocol_type=ptype, protocol_name=pname)
        assert [r.error_code for r in out] == [ErrorCode.INCONSISTENT_GROUP_PROTOCOL], (ptype, pname, out)
        assert h.group.state == GroupState.COMPLETING_REBALANCE
    out = []
    h.group.sync(member_id=a, generation_id=1, assignments={a: b"x"}, callback=out.append, now_ms=h.now_ms,
                 protocol_type="consumer", protocol_name="range")  # its own: and v0-4 send none
    assert [(r.error_code, r.assignment) for r in out] == [(ErrorCode.NONE, b"x")]


def test_stale_generation_is_fenced() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    b = h.join("b")
    h.join("a", a)
    h.rebalance([a, b])
    assert h.group.heartbeat(member_id=a, generation_id=1, now_ms=h.now_ms) == ErrorCode.ILLEGAL_GENERATION
    assert h.sync(a, 1) == [SyncResult(ErrorCode.ILLEGAL_GENERATION)]
    assert h.group.validate_commit(a, 1, h.now_ms) == ErrorCode.ILLEGAL_GENERATION
    assert h.group.validate_commit(a, 2, h.now_ms) == ErrorCode.NONE
    assert h.group.validate_commit("ghost", 2, h.now_ms) == ErrorCode.UNKNOWN_MEMBER_ID


def test_session_expiry_removes_member_and_rebalances() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    b = h.join("b")
    h.join("a", a)
    h.rebalance([a, b])
    # Only a keeps heartbeating.
    for _ in range(3):
        h.advance(SESSION_MS // 3)
        h.group.heartbeat(member_id=a, generation_id=2, now_ms=h.now_ms)
    h.advance(SESSION_MS // 3)
    assert not h.group.has_member(b), "b should have expired"
    assert h.group.state == GroupState.PREPARING_REBALANCE
    h.join("a", a)
    assert h.joins[a][0].generation_id == 3 and h.group.state == GroupState.COMPLETING_REBALANCE


def test_member_blocked_in_join_is_not_expired_but_silent_one_is_dropped_at_deadline() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    b = h.join("b")
    # a never rejoins: the join phase ends at the rebalance timeout without it.
    h.advance(REBALANCE_MS)
    assert not h.group.has_member(a)
    assert h.joins[b][0].error_code == ErrorCode.NONE and h.joins[b][0].leader == b


def test_leave_of_last_member_empties_group_and_requests_persist() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    h.group.persist_needed = False
    assert h.group.leave(a, h.now_ms) == ErrorCode.NONE
    assert h.group.state == GroupState.EMPTY and h.group.persist_needed
    assert h.group.generation_id == 2
    assert h.group.leave(a, h.now_ms) == ErrorCode.UNKNOWN_MEMBER_ID
    # Commits from outside group management are allowed only now that it is empty.
    assert h.group.validate_commit("", -1, h.now_ms) == ErrorCode.NONE


def test_leave_during_completing_rebalance_fails_waiting_syncs_and_restarts() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    b = h.join("b")
    h.join("a", a)
    assert h.sync(b, 2) == []
    assert h.group.validate_commit(b, 2, h.now_ms) == ErrorCode.REBALANCE_IN_PROGRESS
    h.group.leave(a, h.now_ms)
    assert h.syncs[b] == [SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)]
    assert h.group.state == GroupState.PREPARING_REBALANCE
    h.join("b", b)
    assert h.joins[b][-1].generation_id == 3 and h.joins[b][-1].leader == b


def test_commit_with_old_generation_allowed_while_preparing_rebalance() -> None:
    # Commit-before-revoke: a member commits in on_partitions_revoked before it rejoins.
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    h.join("b")
    assert h.group.state == GroupState.PREPARING_REBALANCE
    assert h.group.validate_commit(a, 1, h.now_ms) == ErrorCode.NONE


def test_initial_rebalance_delay_gathers_members_into_one_generation() -> None:
    h = Harness(delay_ms=3000)
    a = h.join("a")
    assert h.joins[a] == [] and h.group.state == GroupState.PREPARING_REBALANCE
    h.advance(2000)
    b = h.join("b")
    h.advance(2000)  # the newcomer extended the wait to 5000 after b
    assert h.joins[a] == []
    h.advance(1000)
    assert h.joins[a][0].generation_id == h.joins[b][0].generation_id == 1


def test_sync_deadline_drops_members_when_leader_never_syncs() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    b = h.join("b")
    h.join("a", a)
    leader = h.group.leader_id
    follower = b if leader == a else a
    h.sync(follower, 2)
    h.advance(SESSION_MS - 1)  # the follower waits in SyncGroup: alive; the leader is silent
    assert h.group.has_member(leader) and h.syncs[follower] == []
    h.advance(1)
    assert not h.group.has_member(leader)
    assert h.syncs[follower] == [SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)]
    assert h.group.state == GroupState.PREPARING_REBALANCE


def test_inconsistent_protocols_are_refused() -> None:
    h = Harness()
    h.join("a")
    out: list[JoinResult] = []
    h.group.join(member_id="", client_id="b", client_host="h", session_timeout_ms=SESSION_MS,
                 rebalance_timeout_ms=REBALANCE_MS, protocol_type="consumer", protocols=[("roundrobin", b"")],
                 callback=out.append, now_ms=h.now_ms)
    assert out[0].error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert out[0].error_message == "group uses 'consumer' with protocols ['range']", out[0].error_message


def test_the_common_protocols_follow_every_members_latest_join() -> None:
    """Each member's offered names are kept as a set; a rejoin with other protocols replaces it, and a
    refusal names a few of the common protocols, clipped, not all of them."""
    h = Harness()
    many = tuple((f"assignor-{i:02d}" + "x" * 100, b"") for i in range(40))
    a = h.join("a", protocols=many)
    b = h.join("b", protocols=many[::-1])
    assert h.group._candidate_protocols() == {name for name, _ in many}
    out: list[JoinResult] = []
    h.group.join(member_id="", client_id="c", client_host="h", session_timeout_ms=SESSION_MS,
                 rebalance_timeout_ms=REBALANCE_MS, protocol_type="consumer", protocols=[("roundrobin", b"")],
                 callback=out.append, now_ms=h.now_ms)
    assert out[0].error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert out[0].error_message.count("assignor-") == 8 and out[0].error_message.endswith(", ...]"), out[0]
    assert repr(many[0][0][:64]) in out[0].error_message and many[0][0][:65] not in out[0].error_message
    h.group.join(member_id=b, client_id="b", client_host="h", session_timeout_ms=SESSION_MS,
                 rebalance_timeout_ms=REBALANCE_MS, protocol_type="consumer", protocols=list(many[5:7]),
                 callback=lambda r: None, now_ms=h.now_ms)
    assert h.group._candidate_protocols() == {many[5][0], many[6][0]}
    assert h.group.members[a].protocol_names == {name for name, _ in many}


def test_protocol_selection_prefers_common_first_choice() -> None:
    h = Harness()
    both = (("cooperative-sticky", b"x"), ("range", b"y"))
    a = h.join("a", protocols=both)
    h.group.leave(a, h.now_ms)
    a = h.join("a", protocols=both)
    assert h.joins[a][0].protocol_name == "cooperative-sticky"
    assert h.joins[a][0].members[0][1] == b"x"


def test_stable_member_rejoin_lost_join_answer_is_replayed() -> None:
    h = Harness()
    a = h.join("a")
    # Still CompletingRebalance: the same join again gets the same answer.
    first = h.joins[a][0]
    h.join("a", a)
    assert h.joins[a][0] == first


def test_offsets_keep_latest_log_position() -> None:
    g = Group("g")
    tp = TP("t", 0)
    g.apply_offset(tp, OffsetEntry(10, -1, "", 1, log_offset=5))
    g.apply_offset(tp, OffsetEntry(7, -1, "", 1, log_offset=4))  # a slower, older append
    assert g.offsets[tp].offset == 10
    g.apply_offset(tp, None)
    assert tp not in g.offsets


def test_dead_group_refuses_everything_and_fails_waiters() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    b = h.join("b")
    h.group.mark_dead(h.now_ms)
    assert h.joins[b][-1].error_code == ErrorCode.NOT_COORDINATOR
    assert h.group.heartbeat(member_id=a, generation_id=1, now_ms=h.now_ms) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert h.group.validate_commit("", -1, h.now_ms) == ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_next_deadline_tracks_sessions() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    assert h.group.next_deadline_ms() == h.now_ms + SESSION_MS


def test_offsets_of_an_empty_group_expire_together_after_retention() -> None:
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    h.group.apply_offset(TP("t", 0), OffsetEntry(5, -1, "", h.now_ms))
    h.group.apply_offset(TP("t", 1), OffsetEntry(6, -1, "", h.now_ms))
    assert h.group.expired_offsets(h.now_ms + 10**9, 1000) == ([], False), "active groups keep offsets"
    h.group.leave(a, h.now_ms)
    empty_since = h.now_ms
    assert h.group.expired_offsets(empty_since + 999, 1000) == ([], False)
    assert h.group.expired_offsets(empty_since + 1000, 1000) == ([TP("t", 0), TP("t", 1)], True)


def test_an_offset_committed_with_a_retention_time_expires_at_its_own_time() -> None:
    """OffsetCommit v2-v4's retention time, as Kafka's expireTimestamp: the offset expires then, once the group is
    empty, whatever offsets.retention.minutes says; the group's other offsets keep theirs."""
    h = Harness()
    a = h.join("a")
    h.rebalance([a])
    h.group.apply_offset(TP("t", 0), OffsetEntry(5, -1, "", h.now_ms, expire_timestamp_ms=h.now_ms + 50))
    h.group.apply_offset(TP("t", 1), OffsetEntry(6, -1, "", h.now_ms))
    assert h.group.expired_offsets(h.now_ms + 10**9, 1000) == ([], False), "active groups keep offsets"
    h.group.leave(a, h.now_ms)
    assert h.group.expired_offsets(h.now_ms + 49, 1000) == ([], False)
    assert h.group.expired_offsets(h.now_ms + 50, 1000) == ([TP("t", 0)], False)
    assert h.group.expired_offsets(h.now_ms + 1000, 1000) == ([TP("t", 0), TP("t", 1)], True)
    standalone = Group("s")  # a retention longer than the broker's holds it longer too
    standalone.apply_offset(TP("t", 0), OffsetEntry(1, -1, "", 0, expire_timestamp_ms=5000))
    assert standalone.expired_offsets(4999, 1000) == ([], False)
    assert standalone.expired_offsets(5000, 1000) == ([TP("t", 0)], True)


def test_an_empty_group_with_a_member_to_come_is_not_removed() -> None:
    # KIP-394: a member handed an id by MEMBER_ID_REQUIRED joins with it next. The group is empty
    # until then; removing it (the offsets' expiry removes empty groups without offsets) made that
    # join UNKNOWN_MEMBER_ID, and with a frequent expiry check a client could loop on it (found by CI).
    h = Harness()
    first = h.join_once("c", "")
    assert first[0].error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert h.group.state == GroupState.EMPTY
    assert h.group.expired_offsets(h.now_ms + 10**9, 1000) == ([], False), "a member is about to join"
    h.group.tick(h.now_ms + SESSION_MS)  # it never came back: its id expires, and the group may go
    assert h.group.expired_offsets(h.now_ms + 10**9, 1000) == ([], True)


def test_standalone_commits_expire_one_by_one() -> None:
    g = Group("g")  # never used the protocol: commits from assign()-style consumers
    g.apply_offset(TP("t", 0), OffsetEntry(5, -1, "", 1000))
    g.apply_offset(TP("t", 1), OffsetEntry(6, -1, "", 5000))
    assert g.expired_offsets(6000, 4000) == ([TP("t", 0)], False)
    assert g.expired_offsets(9000, 4000) == ([TP("t", 0), TP("t", 1)], True)


# ---- static membership (KIP-345) ----

def static_join(h: Harness, instance: str, member_id: str = "", protocols=(("range", b"sub"),)) -> list[JoinResult]:
    results: list[JoinResult] = []
    h.group.join(member_id=member_id, client_id=f"client-{instance}", client_host="h", session_timeout_ms=SESSION_MS,
                 rebalance_timeout_ms=REBALANCE_MS, protocol_type="consumer", protocols=list(protocols),
                 callback=results.append, now_ms=h.now_ms, group_instance_id=instance)
    return results


def stable_static_pair(h: Harness) -> tuple[str, str]:
    """Static members a and b joined (no MEMBER_ID_REQUIRED step) and synced: Stable, generation 1."""
    ja, jb = static_join(h, "a"), static_join(h, "b")
    assert not ja and not jb, "both wait for the join phase"  # not asked to come back with an id
    h.advance(100)
    a, b = h.group.static_members["a"], h.group.static_members["b"]
    assert ja[0].error_code == ErrorCode.NONE and jb[0].error_code == ErrorCode.NONE
    assert h.group.leader_id == a
    h.sync(b, 1)
    h.sync(a, 1, {a: b"A", b: b"B"})
    assert h.group.state == GroupState.STABLE and h.syncs[b][0].assignment == b"B"
    return a, b


def test_a_restarted_static_member_takes_its_place_without_a_rebalance() -> None:
    h = Harness(delay_ms=100)  # both gather into the first generation
    a, b = stable_static_pair(h)
    h.group.persist_needed = False
    h.advance(SESSION_MS // 2)  # b's old process died; its session has not run out
    again = static_join(h, "b")
    assert len(again) == 1 and again[0].error_code == ErrorCode.NONE, again
    new_b = again[0].member_id
    assert new_b != b and h.group.static_members["b"] == new_b
    # Same generation, no rebalance, and the answer names the current leader: b does not assign.
    assert (again[0].generation_id, again[0].leader, again[0].members) == (1, a, ())
    assert h.group.state == GroupState.STABLE and h.group.generation_id == 1
    assert h.group.persist_needed, "the new member id must reach the log"
    assert h.sync(new_b, 1)[0].assignment == b"B", "it gets the assignment the old process had"
    # The old process's id is fenced everywhere, not merely unknown.
    assert h.group.heartbeat(member_id=b, generation_id=1, now_ms=h.now_ms, group_instance_id="b") == \
        ErrorCode.FENCED_INSTANCE_ID
    assert h.group.validate_commit(b, 1, h.now_ms, "b") == ErrorCode.FENCED_INSTANCE_ID
    assert h.sync(b, 1)[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID  # without the instance id: just unknown
    assert static_join(h, "b", member_id=b)[0].error_code == ErrorCode.FENCED_INSTANCE_ID
    assert h.group.heartbeat(member_id=new_b, generation_id=1, now_ms=h.now_ms, group_instance_id="b") == \
        ErrorCode.NONE
    assert h.group.heartbeat(member_id=a, generation_id=1, now_ms=h.now_ms) == ErrorCode.NONE


def test_a_restarted_static_leader_is_answered_as_a_follower() -> None:
    h = Harness(delay_ms=100)  # both gather into the first generation
    a, b = stable_static_pair(h)
    again = static_join(h, "a")
    new_a = again[0].member_id
    assert again[0].error_code == ErrorCode.NONE and again[0].leader == a != new_a and again[0].members == ()
    assert h.group.leader_id == new_a and h.group.state == GroupState.STABLE
    assert h.sync(new_a, 1)[0].assignment == b"A"


def test_a_static_member_rejoining_rebalances_only_when_the_chosen_protocol_would_change() -> None:
    """As Kafka's coordinator (JoinGroup up to v8): other metadata under the same chosen protocol keeps the
    group Stable; a change of preference that changes the chosen protocol rebalances."""
    h = Harness(delay_ms=100)
    both, reverse = (("range", b"s"), ("roundrobin", b"s")), (("roundrobin", b"s"), ("range", b"s"))
    for instance, protocols in (("a", both), ("b", reverse), ("c", reverse)):
        static_join(h, instance, protocols=protocols)
    h.advance(100)
    g = h.group
    a, b, c = (g.static_members[i] for i in "abc")
    assert g.protocol_name == "roundrobin" and g.leader_id == a
    h.sync(b, 1)
    h.sync(c, 1)
    h.sync(a, 1, {a: b"A", b: b"B", c: b"C"})
    assert g.state == GroupState.STABLE
    same = static_join(h, "b", protocols=(("roundrobin", b"other metadata"), ("range", b"s")))
    assert same[0].error_code == ErrorCode.NONE and g.state == GroupState.STABLE
    moved = static_join(h, "c", protocols=both)  # range now has two first choices of three
    assert moved == [] and g.state == GroupState.PREPARING_REBALANCE, (moved, g.state)
    assert g.heartbeat(member_id=a, generation_id=1, now_ms=h.now_ms) == ErrorCode.REBALANCE_IN_PROGRESS


def test_a_restart_during_the_assignment_fences_the_old_waiter_and_rebalances() -> None:
    h = Harness(delay_ms=100)  # both gather into the first generation
    static_join(h, "a")
    static_join(h, "b")
    h.advance(100)
    b = h.group.static_members["b"]
    old_sync = h.sync(b, 1)  # waits for the leader's assignment
    assert old_sync == [] and h.group.state == GroupState.COMPLETING_REBALANCE
    again = static_join(h, "b")
    assert old_sync[0].error_code == ErrorCode.FENCED_INSTANCE_ID
    assert again == [] and h.group.state == GroupState.PREPARING_REBALANCE


def test_static_members_leave_by_instance_id_and_expire_with_their_session() -> None:
    h = Harness(delay_ms=100)  # both gather into the first generation
    a, b = stable_static_pair(h)
    g = h.group
    assert g.leave("", h.now_ms, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.leave("someone-else", h.now_ms, "b") == ErrorCode.FENCED_INSTANCE_ID
    assert g.has_member(b) and g.state == GroupState.STABLE
    assert g.leave("", h.now_ms, "b") == ErrorCode.NONE  # an admin's removal names the instance only
    assert not g.has_member(b) and "b" not in g.static_members and g.state == GroupState.PREPARING_REBALANCE
    # a alone: its session runs out (static members do not leave on close) and its id is free again.
    h.join("client-a", member_id=a)
    h.sync(a, g.generation_id, {a: b"A"})
    h.advance(SESSION_MS)
    assert g.is_empty() and g.static_members == {} and g.state == GroupState.EMPTY
    assert static_join(h, "a") == [] and g.static_members["a"] != a


def test_a_static_member_with_a_known_id_rejoins_like_a_dynamic_one() -> None:
    h = Harness(delay_ms=100)  # both gather into the first generation
    a, b = stable_static_pair(h)
    assert static_join(h, "b", member_id=b) == []  # a rejoin with its own id: a normal rebalance
    assert h.group.state == GroupState.PREPARING_REBALANCE and h.group.static_members["b"] == b



def test_a_session_expiry_that_ends_the_join_round_does_not_trip_over_the_members_it_dropped() -> None:
    """One tick finds a member's session over and the join round's deadline passed: removing the member
    ends the round, which drops every member that did not rejoin, among them the next one the tick
    was about to look at. It used to raise KeyError out of the timers (every group's tick of that
    pass skipped); now the dropped member is passed over."""
    h = Harness(delay_ms=100)
    a, b, c = (h.join(name, session_ms=1_000, rebalance_ms=500) for name in ("a", "b", "c"))
    h.advance(100)
    gen = h.rebalance([a, b, c])
    h.advance(400)
    h.join("c", c, session_ms=1_000, rebalance_ms=500)  # a new round: a and b do not rejoin
    assert h.group.state == GroupState.PREPARING_REBALANCE
    h.advance(600)  # a's and b's sessions (1 s) and the round's deadline (500 ms) are all past
    assert h.group.state == GroupState.COMPLETING_REBALANCE and h.group.generation_id == gen + 1
    assert list(h.group.members) == [c] and h.group.leader_id == c
    assert h.joins[c][-1].error_code == ErrorCode.NONE and h.joins[c][-1].generation_id == gen + 1

class _CountingTable(MemberTable):
    """A member table that counts the walks over every member."""

    walks = 0

    def values(self):  # type: ignore[override]
        type(self).walks += 1
        return super().values()

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def test_a_join_does_not_look_at_every_member() -> None:
    """A join storm of a 10,000-member group once held the coordinator's lock for 16 s: each join
    asked every member whether it was in yet and which protocols it offered. Counted here, not timed:
    of 300 rejoins only the last, which completes the round, walks the members."""
    h = Harness(delay_ms=100)
    members = [h.join(f"c{i}") for i in range(300)]
    h.advance(100)
    gen = h.rebalance(members)
    held = dict(h.group.members)
    h.group.members.clear()  # a member is in one table at a time
    h.group.members = _CountingTable(held)
    _CountingTable.walks = 0
    for m in members[:-1]:
        h.join("c", m, protocols=(("range", b"sub"), ("roundrobin", b"sub")))
    assert h.group.state == GroupState.PREPARING_REBALANCE
    # The first rejoin starts the round (the longest rebalance timeout among the members: one walk).
    assert _CountingTable.walks <= 1, _CountingTable.walks
    h.join("c", members[-1])
    assert h.group.state == GroupState.COMPLETING_REBALANCE and h.group.generation_id == gen + 1
    assert h.group.protocol_name == "range"  # the last member offers only range


def _recount(group: Group) -> tuple[int, dict[str, int], int]:
    counts: dict[str, int] = {}
    for m in dict.values(group.members):
        for name in m.protocol_names:
            counts[name] = counts.get(name, 0) + 1
    held = sum(sum(len(n) + len(md) for n, md in m.protocols) + len(m.assignment)
               + len(m.member_id) + len(m.client_id) + len(m.client_host) + len(m.group_instance_id)
               for m in dict.values(group.members))
    return sum(m.join_callback is not None for m in dict.values(group.members)), counts, held


def _tallies(group: Group) -> tuple[int, dict[str, int], int]:
    return group.members.joining, group.members.protocol_counts, group.members.held_bytes


def _true_next_deadline(group: Group) -> int | None:
    """What tick has to do next, by a walk over everything (next_deadline_ms may answer from its last walk)."""
    deadlines = list(group.pending_members.values())
    deadlines += [m.last_heartbeat_ms + m.session_timeout_ms for m in dict.values(group.members)
                  if m.join_callback is None and m.sync_callback is None]
    if group.state == GroupState.PREPARING_REBALANCE:
        deadlines.append(group.join_deadline_ms)
    if group.state == GroupState.COMPLETING_REBALANCE:
        deadlines.append(group.sync_deadline_ms)
    return min(deadlines) if deadlines else None


def test_the_member_tallies_match_the_members_through_random_histories() -> None:
    """The waiting-member and protocol counts each join relies on, and the bytes the members hold, stay
    what a walk over the members would find, whatever happens: joins, rejoins with other protocols, static restarts, leaves,
    syncs, expiries, a group loaded from its record."""
    from broker.group_records import encode_group_value, group_key, parse_record, restore_group

    choices = [(("range", b"a"),), (("range", b"a"), ("roundrobin", b"b")), (("roundrobin", b"b"),),
               (("sticky", b"s"), ("range", b"a"))]
    for seed in range(40):
        rng = random.Random(seed)
        h = Harness(delay_ms=rng.choice((0, 100)))
        known: list[str] = []
        for _ in range(200):
            op = rng.random()
            timeouts = {"session_ms": rng.choice((1_000, SESSION_MS)), "rebalance_ms": rng.choice((500, REBALANCE_MS))}
            if op < 0.3 or not known:
                try:
                    known.append(h.join(f"c{rng.randrange(50)}", protocols=rng.choice(choices), **timeouts))
                except AssertionError:
                    pass  # refused (inconsistent protocols): nothing joined
            elif op < 0.5:
                h.join("c", rng.choice(known), protocols=rng.choice(choices), **timeouts)
            elif op < 0.6:
                static_join(h, f"i{rng.randrange(5)}", protocols=rng.choice(choices))
            elif op < 0.7:
                h.group.leave(rng.choice(known), h.now_ms)
            elif op < 0.8 and h.group.state == GroupState.COMPLETING_REBALANCE:
                leader = h.group.leader_id
                h.sync(leader, h.group.generation_id, {m: b"x" for m in h.group.members})
            elif op < 0.95:
                h.advance(rng.choice((10, 300, 1_000, SESSION_MS)))
            elif h.group.state == GroupState.STABLE:
                restored = Group("g")
                record = parse_record(group_key("g"), encode_group_value(h.group), 0)
                restore_group(restored, record.value, h.now_ms)
                assert _tallies(restored) == _recount(restored)
            assert _tallies(h.group) == _recount(h.group), seed
            # The coordinator's question each tick: never later than the truth, so nothing due is missed.
            if rng.random() < 0.5:
                h.group.heartbeat(member_id=rng.choice(known), generation_id=h.group.generation_id, now_ms=h.now_ms)
            true, answered = _true_next_deadline(h.group), h.group.next_deadline_ms(h.now_ms)
            assert true is None or (answered is not None and answered <= true), (seed, true, answered)
            assert all(m._table is h.group.members for m in dict.values(h.group.members))


def test_a_stable_group_is_not_walked_every_tick() -> None:
    """The coordinator asks every group for its next deadline ten times a second; a stable group answers
    from its last walk until that deadline comes (heartbeats only move deadlines later), so 10,000
    members are walked about once per session timeout, not ten times a second."""
    h = Harness(delay_ms=100)
    members = [h.join(f"c{i}") for i in range(300)]
    h.advance(100)
    h.rebalance(members)
    held = dict(h.group.members)
    h.group.members.clear()
    h.group.members = _CountingTable(held)
    first = h.group.next_deadline_ms(h.now_ms)
    assert first is not None and first > h.now_ms
    _CountingTable.walks = 0
    for step in range(1, 50):  # 4.9 s of ticks, heartbeats all along
        now = h.now_ms + step * 100
        for m in members[step % 3::3]:
            assert h.group.heartbeat(member_id=m, generation_id=h.group.generation_id, now_ms=now) == ErrorCode.NONE
        assert h.group.next_deadline_ms(now) == first
    assert _CountingTable.walks == 0, _CountingTable.walks
    # Once the remembered deadline comes, one walk finds the real one (later: everyone heartbeated).
    later = h.group.next_deadline_ms(first)
    assert _CountingTable.walks == 1 and later > first
    # A join (or any change but a heartbeat or commit) forgets it.
    h.join("newcomer")
    walks = _CountingTable.walks
    h.group.next_deadline_ms(h.now_ms)
    assert _CountingTable.walks == walks + 1
