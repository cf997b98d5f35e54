"""The group coordinator with groups of Kafka's consumer protocol (KIP-848) beside classic ones: commits at the
member epoch, one kind of group per id while it has members, listings, deletes, unloads, and the retention of
the offsets such a group commits."""

from __future__ import annotations

import concurrent.futures
import types
from collections.abc import Iterator
from typing import Any

import pytest
from topics_cache import TopicsCache

from broker import consumer_groups as cg
from broker.group_coordinator import CoordinatorConfig, CoordinatorError, GroupCoordinator, _PartitionLoad
from client.types import TopicPartition as TP
from proto import group_pb2
from proto.common_pb2 import ErrorCode

RETENTION_MS = 60_000


class Appends:
    def __init__(self) -> None:
        self.batches = 0

    def append_records(self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(types.SimpleNamespace(base_offset=self.batches))
        self.batches += 1
        return fut


@pytest.fixture()
def world() -> Iterator[tuple[GroupCoordinator, list[int]]]:
    now = [1_000_000]
    c = GroupCoordinator(node_id=1, replica_manager=Appends(), metadata_cache=TopicsCache({"t": 2}),
                         config=CoordinatorConfig(offsets_retention_minutes=RETENTION_MS // 60_000),
                         clock_ms=lambda: now[0])
    for p in range(c.config.offsets_topic_num_partitions):
        c._partitions[p] = _PartitionLoad(leader_epoch=0, loaded=True)
    try:
        yield c, now
    finally:
        c._loader.shutdown()


def _join(c: GroupCoordinator, group: str, member: str) -> cg.HeartbeatAnswer:
    return c.consumer_group_heartbeat(cg.Heartbeat(group, member, 0, rebalance_timeout_ms=30_000,
                                                   subscribed_topic_names=["t"], owned=[], client_host="10.0.0.1"))


def _commit(c: GroupCoordinator, group: str, member: str, epoch: int, offset: int = 5) -> list[Any]:
    return c.commit_offsets(group_pb2.OffsetCommitRequest(
        group_id=group, member_id=member, generation_id=epoch,
        partitions=[group_pb2.OffsetCommitPartition(topic="t", partition=0, offset=offset)]))


def test_consumer_protocol_groups_beside_classic_ones(world: tuple[GroupCoordinator, list[int]]) -> None:
    c, _ = world
    answer = _join(c, "g", "m1")
    assert answer.member_epoch == 1 and sum(len(p) for p in answer.assignment.values()) == 2
    assert [r[2] for r in _commit(c, "g", "m1", 1)] == [ErrorCode.NONE]
    for member, epoch, code in (("m1", 0, cg.STALE_MEMBER_EPOCH), ("nobody", 1, ErrorCode.UNKNOWN_MEMBER_ID),
                                ("", -1, ErrorCode.UNKNOWN_MEMBER_ID)):
        with pytest.raises(CoordinatorError) as refused:
            _commit(c, "g", member, epoch)
        assert refused.value.code == code, (member, epoch)
    # The commit made the group's Group (its offsets); it is listed once, as a consumer-protocol group.
    assert "g" in c._groups and c.list_groups(set()) == []
    assert c.consumer_group_listing(set()) == [("g", "Stable")]
    assert c.consumer_group_listing({"Empty"}) == []
    stats = c.stats()
    assert stats.consumer_groups_by_state["Stable"] == 1 and stats.consumer_group_members == 1
    assert sum(stats.groups_by_state.values()) == 0
    # One kind of group per id while it has members.
    joined: list[Any] = []
    with pytest.raises(CoordinatorError) as classic:
        c.start_join(group_pb2.JoinGroupRequest(group_id="g", client_id="c", session_timeout_ms=10_000,
                                                rebalance_timeout_ms=10_000, protocol_type="consumer",
                                                protocols=[group_pb2.GroupProtocol(name="range")]), joined.append)
    assert classic.value.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    c.start_join(group_pb2.JoinGroupRequest(group_id="old", client_id="c", member_id="", session_timeout_ms=10_000,
                                            rebalance_timeout_ms=10_000, protocol_type="consumer",
                                            group_instance_id="i", protocols=[group_pb2.GroupProtocol(name="range")]),
                 joined.append)
    with pytest.raises(CoordinatorError) as other_kind:
        _join(c, "old", "m9")
    assert other_kind.value.code == ErrorCode.GROUP_ID_NOT_FOUND
    with pytest.raises(CoordinatorError) as busy:
        c.delete_group("g")
    assert busy.value.code == ErrorCode.NON_EMPTY_GROUP
    described, _ = c.describe_group("g", include_offsets=False)
    assert (described.group_type, described.state, [m.member_id for m in described.members]) == (
        "consumer", "Stable", ["m1"])
    assert sorted(r.partition for r in described.members[0].assigned_partitions) == [0, 1]
    assert [g["error_code"] for g in (c.describe_consumer_group("g"), c.describe_consumer_group("old"),
                                      c.describe_consumer_group("none"))] == [0, ErrorCode.GROUP_ID_NOT_FOUND] * 1 + [
        ErrorCode.GROUP_ID_NOT_FOUND]
    # A coordinator that stops leading the group's partition forgets it; its members then rejoin elsewhere.
    with c._lock:
        c._unload_locked(c.partition_for("g"))
    assert "g" not in c.consumer_groups.groups
    with pytest.raises(CoordinatorError) as moved:
        _join(c, "g", "m1")
    assert moved.value.code == ErrorCode.NOT_COORDINATOR


def test_offsets_of_a_consumer_protocol_group_are_kept_while_members_are_in(
        world: tuple[GroupCoordinator, list[int]]) -> None:
    c, now = world
    _join(c, "g", "m1")
    _commit(c, "g", "m1", 1)
    # Long past the retention, the member still in (heartbeating): nothing expires.
    for _ in range(3):
        now[0] += RETENTION_MS
        c.consumer_group_heartbeat(cg.Heartbeat("g", "m1", 1, owned=[]))
        assert c.expire_offsets() == 0
    # The member leaves: the retention counts from then, not from the commit.
    c.consumer_group_heartbeat(cg.Heartbeat("g", "m1", -1))
    assert "g" not in c.consumer_groups.groups
    left = now[0]
    now[0] = left + RETENTION_MS - 1
    assert c.expire_offsets() == 0 and TP("t", 0) in c._groups["g"].offsets
    now[0] = left + RETENTION_MS
    assert c.expire_offsets() == 1
    assert "g" not in c._groups and c._consumer_emptied == {}


def test_a_pattern_new_to_the_group_is_matched_outside_the_coordinators_lock(world, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Matching walks every topic name: done under the lock every group's requests wait on, a client sending new
    patterns could hold them all up. Only the first member's pattern is matched (the second finds it matched)."""
    import threading

    from broker import topic_regex

    c, now = world
    free: list[bool] = []
    real = topic_regex.resolve

    def spy(patterns, names):  # type: ignore[no-untyped-def]
        t = threading.Thread(target=lambda: free.append(c._lock.acquire(timeout=0) and (c._lock.release() or True)))
        t.start()
        t.join()
        return real(patterns, names)
    monkeypatch.setattr(topic_regex, "resolve", spy)
    for member in ("a", "b"):
        answer = c.consumer_group_heartbeat(cg.Heartbeat("g", member, 0, rebalance_timeout_ms=30_000,
                                                         subscribed_topic_regex="t|x.*", owned=[]))
        assert answer.member_epoch > 0
    assert free == [True], free  # the first member's: the second finds the pattern matched
    # A topic made later: the group's batch refresh (the metadata moved, 10 s on) is matched ahead of the lock too.
    c.metadata_cache.topics["x1"] = 3
    c.metadata_cache.version += 1
    now[0] += cg.REGEX_REFRESH_MIN_MS
    c.consumer_group_heartbeat(cg.Heartbeat("g", "a", 1, owned=[]))
    assert free == [True, True], free
    assert "x1" in c.consumer_groups.groups["g"].members["a"].subscribed
    with pytest.raises(cg.HeartbeatError) as refused:
        c.consumer_group_heartbeat(cg.Heartbeat("g", "c", 0, rebalance_timeout_ms=30_000,
                                                subscribed_topic_regex="t(", owned=[]))
    assert refused.value.code == topic_regex.INVALID_REGULAR_EXPRESSION
