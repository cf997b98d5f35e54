"""What a client's ids may cost a group coordinator, on a real coordinator without a cluster.

Found by an audit: a group id is hashed (Java's String.hashCode, a Python loop) under the lock every
group shares, and nothing bounded its length (a 7 MB id held the lock 0.9 s a call, other groups'
heartbeats waited 8 s); a joining member's client id, host and member id were kept without being
counted (200 pending members with 1 MiB client ids held 200 MiB while the coordinator counted 100 KB),
and DescribeGroups sized an answer by metadata and assignments only (30 names of one group of long
ids built 975 MB)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest

from broker import group_coordinator as gc
from broker.group_coordinator import (
    CLIENT_ID_MAX,
    GROUP_ID_MAX,
    CoordinatorConfig,
    CoordinatorError,
    GroupCoordinator,
    _PartitionLoad,
)
from broker.group_state import Group, GroupState, JoinResult, Member
from proto import group_pb2
from proto.common_pb2 import ErrorCode

HELD_MAX = 1 << 20


@pytest.fixture()
def coord() -> Iterator[GroupCoordinator]:
    c = GroupCoordinator(node_id=1, replica_manager=None, metadata_cache=None,
                         config=CoordinatorConfig(group_coordinator_metadata_max_bytes=HELD_MAX))
    for p in range(c.config.offsets_topic_num_partitions):
        c._partitions[p] = _PartitionLoad(leader_epoch=0, loaded=True)
    try:
        yield c
    finally:
        c._loader.shutdown()


def join(c: GroupCoordinator, group: str, client_id: str = "c", **fields: object) -> JoinResult:
    results: list[JoinResult] = []
    c.start_join(group_pb2.JoinGroupRequest(
        group_id=group, client_id=client_id, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
        protocol_type="consumer", protocols=[group_pb2.GroupProtocol(name="range", metadata=b"m")],
        **fields), results.append)
    assert len(results) == 1, results
    return results[0]


def test_a_group_id_over_the_bound_is_refused_without_hashing_it(coord: GroupCoordinator) -> None:
    with mock.patch.object(gc, "partition_for_group", wraps=gc.partition_for_group) as hashed:
        with pytest.raises(CoordinatorError) as info:
            coord.heartbeat("g" * (GROUP_ID_MAX + 1), "m", 1)
        assert info.value.code == ErrorCode.INVALID_GROUP_ID and str(GROUP_ID_MAX) in info.value.message
        assert hashed.call_count == 0
        # At the bound, a group id is a group id (Kafka sets no bound: this one is generous).
        assert join(coord, "g" * GROUP_ID_MAX).error_code == ErrorCode.MEMBER_ID_REQUIRED
        assert hashed.call_count >= 1


@pytest.mark.parametrize(("field", "most"), [("client_id", CLIENT_ID_MAX), ("client_host", CLIENT_ID_MAX),
                                             ("protocol_type", gc.PROTOCOL_TYPE_MAX)])
def test_a_join_with_an_overlong_id_is_refused(coord: GroupCoordinator, field: str, most: int) -> None:
    req = group_pb2.JoinGroupRequest(group_id="g", client_id="c", session_timeout_ms=10_000, protocol_type="consumer",
                                     protocols=[group_pb2.GroupProtocol(name="range", metadata=b"m")])
    setattr(req, field, "x" * (most + 1))
    with pytest.raises(CoordinatorError) as info:
        coord.start_join(req, lambda _r: None)
    assert info.value.code == ErrorCode.INVALID_REQUEST and str(most) in info.value.message
    assert "g" not in coord._groups


def test_pending_members_ids_count_against_the_coordinators_bound(coord: GroupCoordinator) -> None:
    """Pending members (MEMBER_ID_REQUIRED) keep their ids for a session: joins with the longest client id
    stop at group.coordinator.metadata.max.bytes (1 MiB here), not after it held 200 times that."""
    admitted = 0
    long_client = "c" * CLIENT_ID_MAX
    for i in range(2000):
        try:
            result = join(coord, f"g{i % 50}", client_id=long_client)
        except CoordinatorError as exc:
            assert exc.code == ErrorCode.COORDINATOR_NOT_AVAILABLE, exc
            break
        assert result.error_code == ErrorCode.MEMBER_ID_REQUIRED
        admitted += 1
    held = sum(len(pid) for g in coord._groups.values() for pid in g.pending_members)  # "<client id>-<uuid>"
    assert 0 < admitted < 2000, admitted
    assert held <= HELD_MAX, f"{admitted} pending members hold {held} bytes of ids, over the {HELD_MAX} bound"
    # Counted afresh (as the coordinator does once a second), the pending members' ids are all counted.
    coord._held_counted_at = float("-inf")
    with contextlib.suppress(CoordinatorError):
        join(coord, "another", client_id=long_client)
    assert coord._held_bytes >= held, (coord._held_bytes, held)


def test_a_members_ids_count_in_what_it_holds_and_change_with_a_rejoin() -> None:
    group = Group("g")
    m = Member("m-1", "client", "10.0.0.1", 10_000, 10_000, [("range", b"meta")], 0)
    group.members["m-1"] = m
    assert m.held_bytes() == len("range") + len("meta") + len("m-1") + len("client") + len("10.0.0.1")
    assert group.members.held_bytes == m.held_bytes()
    m.rejoined("a-much-longer-client-id", "10.0.0.1", 10_000, 10_000, [("range", b"meta")], 1)
    assert group.members.held_bytes == m.held_bytes() == (
        len("range") + len("meta") + len("m-1") + len("a-much-longer-client-id") + len("10.0.0.1"))
    del group.members["m-1"]
    assert group.members.held_bytes == 0


def test_a_description_counts_its_members_ids(coord: GroupCoordinator) -> None:
    g = Group("wide", state=GroupState.STABLE, protocol_type="connect", protocol_name="default", generation_id=1,
              leader_id="m0")
    for i in range(10):
        long_id = f"m{i}-" + "x" * CLIENT_ID_MAX
        g.members[long_id] = Member(long_id, "c" * CLIENT_ID_MAX, "h", 10_000, 30_000, [("default", b"")], 0)
    coord._groups["wide"] = g
    ids = 10 * (2 * CLIENT_ID_MAX)
    described, size = coord.describe_group("wide", include_offsets=False)
    assert described.error_code == ErrorCode.NONE and size >= ids, (size, ids)
    refused, _ = coord.describe_group("wide", include_offsets=False, max_bytes=ids // 2)
    assert refused.error_code == ErrorCode.INVALID_REQUEST and "bytes" in refused.error_message


def test_a_group_placed_past_a_short_offsets_topic_is_told_why_and_nothing_is_created() -> None:
    """__consumer_offsets made with fewer partitions than offsets.topic.num.partitions (by a client, before the
    controller refused that, or before the setting was raised): the groups placed past its partitions were answered
    "creating __consumer_offsets" for ever, and each FindCoordinator started another creation."""
    from broker.metadata_cache import PartitionInfo, TopicInfo

    class Cache:
        def topic(self, name: str) -> TopicInfo | None:
            return TopicInfo(name, "id", {}, 1) if name == gc.OFFSETS_TOPIC else None

        def partition(self, topic: str, p: int) -> PartitionInfo | None:
            return PartitionInfo(topic, "id", 0, (1,), (1,), 1, 0, 0) if topic == gc.OFFSETS_TOPIC and p == 0 else None

    c = GroupCoordinator(node_id=1, replica_manager=None, metadata_cache=Cache(), config=CoordinatorConfig())
    try:
        group = next(f"g{i}" for i in range(100) if c.partition_for(f"g{i}") >= 1)
        with mock.patch.object(c.offsets_topic, "ensure") as create, pytest.raises(Exception) as refused:
            c.find_coordinator(group)
        assert refused.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE  # type: ignore[attr-defined]
        assert f"has 1 partitions, fewer than offsets.topic.num.partitions ({c.config.offsets_topic_num_partitions})" \
            in str(refused.value), refused.value
        assert create.call_count == 0
    finally:
        c._loader.shutdown()
