"""What one small group request may cost a coordinator, on a real GroupCoordinator without a cluster.

Found by an audit (each measured on a one-broker cluster):
- OffsetDelete parsed every member's subscription under the lock every group shares: a 43-byte request held
  it 4.65 s with 200 members of 1 MiB subscriptions, and other groups' heartbeats waited.
- ListGroups hashed every group id under that lock, and any OffsetCommit made a group, even one writing
  nothing: 20,000 made-up groups made one ListGroups take 5.2 s and another group's heartbeat wait 4 s.
- DescribeGroups(include_offsets) described a repeated group id again for each copy, resolving every end
  offset again, and left the offsets out of the answer's byte bound: a 12 KB request took 30 s and built 20 MB.
- AlterGroupOffsets expanded a whole topic once per spec naming it: 80 KB took 4.7 s at 2,000 partitions.

The tests count the work done (parses, hashes, descriptions, end offsets resolved, expansions), never time."""

from __future__ import annotations

import concurrent.futures
import random
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from broker import group_coordinator as gc
from broker import group_records as records
from broker import group_service
from broker.group_coordinator import (
    CoordinatorConfig,
    CoordinatorError,
    GroupCoordinator,
    _PartitionLoad,
)
from broker.group_service import GroupCoordinatorServicer, _DescribeBytes
from broker.group_state import Group, GroupState, JoinResult, Member, OffsetEntry
from client.types import TopicPartition as TP
from proto import errors, group_pb2
from proto.common_pb2 import ErrorCode

TOPICS = {"big": 300, "t": 4, "other": 3}


class FakeCache:
    """The metadata cache the coordinator reads: partitions of TOPICS, each led by broker 1."""

    version = 1  # some metadata applied (the coordinator sweeps offsets of unknown topics only then)

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def partition(self, topic: str, partition: int) -> Any:
        if 0 <= partition < self.topics.get(topic, 0):
            return types.SimpleNamespace(topic=topic, partition=partition, leader=1)
        return None

    def partitions_of(self, topic: str) -> list[Any]:
        return [types.SimpleNamespace(partition=p) for p in range(self.topics.get(topic, 0))]

    def topic(self, name: str) -> Any:
        return types.SimpleNamespace(name=name) if name in self.topics else None

    def broker(self, node_id: int) -> Any:
        return None


class FakeReplicaManager:
    """Appends to __consumer_offsets succeed at once (acks=all done), at increasing offsets."""

    def __init__(self) -> None:
        self.appended: list[tuple[int, bytes]] = []

    def append_records(self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(types.SimpleNamespace(base_offset=len(self.appended)))
        self.appended.append((partition, batch))
        return fut


def _coordinator(**config: Any) -> tuple[GroupCoordinator, list[int]]:
    now = [1_000_000]
    c = GroupCoordinator(node_id=1, replica_manager=FakeReplicaManager(), metadata_cache=FakeCache(TOPICS),
                         config=CoordinatorConfig(**config), clock_ms=lambda: now[0])
    for p in range(c.config.offsets_topic_num_partitions):
        c._partitions[p] = _PartitionLoad(leader_epoch=0, loaded=True)
    return c, now


@pytest.fixture()
def coord() -> Iterator[GroupCoordinator]:
    c, _ = _coordinator()
    try:
        yield c
    finally:
        c._loader.shutdown()


def _ends(wanted: dict[TP, int]) -> dict[TP, tuple[int, str]]:
    """A stand-in for the ListOffsets RPCs: every partition ends at 100."""
    return {tp: (100, "") for tp in wanted}


def _subscription(topics: list[str]) -> bytes:
    return group_pb2.ConsumerSubscription(topics=topics).SerializeToString()


def _join_static(c: GroupCoordinator, group: str, instance: str, metadata: bytes,
                 protocol_type: str = "consumer") -> list[JoinResult]:
    results: list[JoinResult] = []
    c.start_join(group_pb2.JoinGroupRequest(
        group_id=group, client_id="c", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
        group_instance_id=instance, protocol_type=protocol_type,
        protocols=[group_pb2.GroupProtocol(name="range", metadata=metadata)]), results.append)
    return results


def _consumer_group(c: GroupCoordinator, now: list[int], group: str, members: int) -> Group:
    """A group of static consumer members, each subscribed to "t" and to a topic of its own, its join
    round completed (CompletingRebalance, protocol "range" chosen)."""
    answers = [_join_static(c, group, f"i{i}", _subscription(["t", f"own-{i}"])) for i in range(members)]
    now[0] += 60_000
    c.tick()
    g = c._groups[group]
    assert g.state == GroupState.COMPLETING_REBALANCE and g.protocol_name == "range", g.state
    assert all(len(a) == 1 and a[0].error_code == ErrorCode.NONE for a in answers), answers
    return g


# ---------------------------------------------------------------------- OffsetDelete (#6)
def test_offset_delete_reads_the_members_topics_parsed_when_they_joined() -> None:
    c, now = _coordinator()
    # The topics named exist (OffsetDelete refuses a partition that does not, UNKNOWN_TOPIC_OR_PARTITION).
    c.metadata_cache = FakeCache({**TOPICS, "free": 1, **{f"own-{i}": 2 for i in range(20)}})
    try:
        with mock.patch.object(group_pb2, "ConsumerSubscription", wraps=group_pb2.ConsumerSubscription) as sub:
            g = _consumer_group(c, now, "readers", 20)
            parsed_at_join = sub.FromString.call_count
            with mock.patch.object(c, "_write_offsets") as written:
                for _ in range(5):
                    results = c.delete_offsets("readers", [TP("t", 0), TP("own-7", 1), TP("free", 0), TP("t", 3)])
                    assert results == [(TP("t", 0), ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC),
                                       (TP("own-7", 1), ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC),
                                       (TP("free", 0), ErrorCode.NONE),
                                       (TP("t", 3), ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)]
                    assert c.delete_offsets("readers", []) == []  # the audit's 43-byte request
            # Five requests (and five empty ones) parsed no member's metadata again.
            assert sub.FromString.call_count == parsed_at_join, sub.FromString.call_count - parsed_at_join
            assert parsed_at_join == 20, parsed_at_join  # once a member, when it joined
            assert [call.args[3] for call in written.call_args_list] == [[(TP("free", 0), None)]] * 5
        # A member that rejoins with another subscription is read anew; one that leaves is not read.
        member = next(m for m in g.members.values() if m.group_instance_id == "i7")
        _join_static(c, "readers", "i7", _subscription(["t"]))
        assert member.subscribed_topics("range") == frozenset({"t"})
        with mock.patch.object(c, "_write_offsets"):
            assert c.delete_offsets("readers", [TP("own-7", 0)]) == [(TP("own-7", 0), ErrorCode.NONE)]
    finally:
        c._loader.shutdown()


def test_a_join_that_only_gets_a_member_id_is_not_parsed(coord: GroupCoordinator) -> None:
    results: list[JoinResult] = []
    with mock.patch.object(group_pb2, "ConsumerSubscription", wraps=group_pb2.ConsumerSubscription) as sub:
        coord.start_join(group_pb2.JoinGroupRequest(
            group_id="dyn", client_id="c", session_timeout_ms=10_000, protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=_subscription(["t"]))]), results.append)
        assert results[0].error_code == ErrorCode.MEMBER_ID_REQUIRED
        assert sub.FromString.call_count == 0
        # The same member back with its id joins, and is parsed once, for the protocols sharing its bytes.
        coord.start_join(group_pb2.JoinGroupRequest(
            group_id="dyn", client_id="c", member_id=results[0].member_id, session_timeout_ms=10_000,
            protocol_type="consumer", protocols=[
                group_pb2.GroupProtocol(name="range", metadata=_subscription(["t"])),
                group_pb2.GroupProtocol(name="roundrobin", metadata=_subscription(["t"]))]), results.append)
        assert sub.FromString.call_count == 1
    m = coord._groups["dyn"].members[results[0].member_id]
    assert m.subscribed_topics("range") == m.subscribed_topics("roundrobin") == frozenset({"t"})


def test_parsed_topics_count_in_what_the_coordinator_holds() -> None:
    """The parsed sets cost more memory than the metadata they came from: they are counted with the member,
    and a join whose parse would take the coordinator past its bound is refused (retriable)."""
    topics = [f"topic-{i:05d}" for i in range(20_000)]
    metadata = _subscription(topics)
    parsed_bytes = sum(sys.getsizeof(t) for t in topics)  # the topics' strings alone, without their set
    assert parsed_bytes > 4 * len(metadata)
    # Room for the metadata (and ids) but not for the parsed topics: refused, nothing kept.
    bound = len(metadata) + 4096
    c, _ = _coordinator(group_coordinator_metadata_max_bytes=bound)
    try:
        with pytest.raises(CoordinatorError) as info:
            _join_static(c, "wide", "i0", metadata)
        assert info.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert "wide" not in c._groups or not c._groups["wide"].members
    finally:
        c._loader.shutdown()
    # Admitted under a larger bound: the member holds the parsed sets, and its group counts them.
    c, _ = _coordinator()
    try:
        assert _join_static(c, "wide", "i0", metadata) == []  # waits in the join round
        g = c._groups["wide"]
        (m,) = g.members.values()
        assert m.held_bytes() >= len(metadata) + parsed_bytes
        assert g.members.held_bytes == m.held_bytes()
        c._held_counted_at = float("-inf")  # counted afresh, as the coordinator does once a second
        c._admit_bytes_locked(0, "test")
        assert c._held_bytes >= len(metadata) + parsed_bytes
        # The sets are dropped, and uncounted, with the member.
        with c._lock:
            c._groups["wide"].leave("", c.clock_ms(), "i0")
        assert g.members.held_bytes == 0
    finally:
        c._loader.shutdown()
    assert records.parse_subscriptions("connect", [("range", metadata)]).held_bytes == 0  # not a consumer's
    assert records.parse_subscriptions("consumer", [("range", b"\xff\xff")]).topics == {}  # undecodable


def test_one_address_cannot_fill_the_members_budget_for_every_other_addresss_members() -> None:
    """group.coordinator.metadata.max.bytes.per.ip: a probe's members from one address (900 KB of metadata each,
    30-minute sessions, no heartbeats) filled group.coordinator.metadata.max.bytes, and another address's
    JoinGroup was refused for as long as those sessions lasted. One address's members now hold at most its
    share, and another address's member joins."""
    c, _ = _coordinator(group_coordinator_metadata_max_bytes=4 << 20, group_coordinator_metadata_max_bytes_per_ip=1 << 20)
    metadata = b"x" * 200_000

    def join(group: str, instance: str, host: str) -> list[JoinResult]:
        results: list[JoinResult] = []
        c.start_join(group_pb2.JoinGroupRequest(
            group_id=group, client_id="c", client_host=host, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            group_instance_id=instance, protocol_type="connect",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=metadata)]), results.append)
        return results
    try:
        joined = 0
        with pytest.raises(CoordinatorError) as refused:
            for i in range(20):
                join(f"flood-{i}", "i0", "10.0.0.2")
                joined += 1
        assert refused.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert "metadata.max.bytes.per.ip" in str(refused.value) and "10.0.0.2" in str(refused.value)
        assert joined == 5, joined  # 5 x 200 KB fit in 1 MiB, a sixth does not
        assert join("victim", "v0", "10.0.0.1") == []  # joined: it waits in its join round
        # Each group keeps its members' bytes by address, and they add up to what it holds.
        for g in c._groups.values():
            assert sum(held for held, _ in g.members.held_by_host.values()) == g.members.held_bytes
        assert set(c._groups["victim"].members.held_by_host) == {"10.0.0.1"}
        # A member that rejoins from another address moves what it holds there; one that leaves takes it away.
        join("flood-0", "i0", "10.0.0.9")
        table = c._groups["flood-0"].members
        assert set(table.held_by_host) == {"10.0.0.9"} and table.held_by_host["10.0.0.9"][1] == 1
        with c._lock:
            c._groups["flood-0"].leave("", c.clock_ms(), "i0")
        assert table.held_by_host == {} and table.held_bytes == 0
        c._held_counted_at = float("-inf")  # counted afresh, as the coordinator does once a second
        join("flood-5", "i0", "10.0.0.2")  # room again at that address
    finally:
        c._loader.shutdown()


def test_pending_member_ids_count_against_the_address_they_were_handed_to() -> None:
    """A JoinGroup without a member id only gets one (MEMBER_ID_REQUIRED) and a pending place until its session
    timeout (up to 30 minutes). Those places count against the address that asked for them, also once counted
    afresh (they used to drop out of the address's count at the next recount, a second later)."""
    from broker.group_coordinator import PENDING_MEMBER_BYTES

    c, now = _coordinator(group_coordinator_metadata_max_bytes=64 << 20,
                          group_coordinator_metadata_max_bytes_per_ip=1 << 20)

    def ask(host: str) -> list[JoinResult]:
        results: list[JoinResult] = []
        c.start_join(group_pb2.JoinGroupRequest(
            group_id="pending", client_id="c", client_host=host, session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000, protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=b"m")]), results.append)
        return results
    try:
        handed = 0
        with pytest.raises(CoordinatorError, match="per.ip"):
            for _ in range(10_000):
                [answer] = ask("10.0.0.2")
                assert answer.error_code == ErrorCode.MEMBER_ID_REQUIRED
                handed += 1
                if handed % 100 == 0:
                    c._held_counted_at = float("-inf")  # as if a second had passed: counted afresh
        assert handed <= (1 << 20) // PENDING_MEMBER_BYTES + 100, handed
        g = c._groups["pending"]
        assert g.pending_members.by_host == {"10.0.0.2": handed} and len(g.pending_members) == handed
        assert ask("10.0.0.1")[0].error_code == ErrorCode.MEMBER_ID_REQUIRED  # another address is served
        # Ids not used within their session timeout are dropped, and uncounted with them.
        now[0] += 10_001
        c.tick()
        assert not g.pending_members and g.pending_members.by_host == {}
    finally:
        c._loader.shutdown()


def test_a_loaded_groups_members_are_parsed_once_when_loaded(tmp_path: Path) -> None:
    from storage.log_manager import LogManager
    from storage.record_batch import RecordBatchBuilder

    group = Group("loaded", state=GroupState.STABLE, protocol_type="consumer", protocol_name="range",
                  generation_id=3, leader_id="m0")
    for i in range(5):
        group.members[f"m{i}"] = Member(f"m{i}", "c", "h", 10_000, 10_000,
                                        [("range", _subscription(["t", f"own-{i}"]))], 0)
    lm = LogManager([tmp_path / "data"], on_dir_failure=lambda d, e: None)
    try:
        lg = lm.get_or_create_log(records.OFFSETS_TOPIC, 0, topic_id="T", overrides={})
        b = RecordBatchBuilder()
        b.append(0, records.group_key("loaded"), records.encode_group_value(group))
        lg.append_as_leader(b.build(), 0)
        hosted = types.SimpleNamespace(is_leader=True, log=lg)
        rm = types.SimpleNamespace(partition=lambda t, p: hosted if (t, p) == (records.OFFSETS_TOPIC, 0) else None,
                                   log_manager=lm)
        c = GroupCoordinator(node_id=1, replica_manager=rm, metadata_cache=None,
                             config=CoordinatorConfig(offsets_topic_num_partitions=1))
        try:
            c._partitions[0] = _PartitionLoad(leader_epoch=3)
            c._load_partition(0, 3)
            g = c._groups["loaded"]
            assert g.state == GroupState.STABLE
            with mock.patch.object(group_pb2, "ConsumerSubscription", wraps=group_pb2.ConsumerSubscription) as sub, \
                    mock.patch.object(gc, "partition_for_group", wraps=gc.partition_for_group) as hashed:
                assert c.delete_offsets("loaded", [TP("own-3", 0)]) == [(TP("own-3", 0),
                                                                          ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)]
                assert [x.group_id for x in c.list_groups(set())] == ["loaded"]
                assert sub.FromString.call_count == 0
                assert hashed.call_count == 1  # the request's group id, once; never the listed groups'
            assert g.offsets_partition == 0
            assert g.members.held_bytes == sum(m.held_bytes() for m in g.members.values())
            assert all(m.subscriptions.held_bytes > 0 for m in g.members.values())
        finally:
            c._loader.shutdown()
    finally:
        lm.shutdown()


# ---------------------------------------------------------------------- ListGroups, OffsetCommit (#7)
def _commit(c: GroupCoordinator, group: str, parts: list[tuple[str, int, int]], **fields: Any) -> list[Any]:
    return c.commit_offsets(group_pb2.OffsetCommitRequest(
        group_id=group, generation_id=fields.pop("generation_id", -1), **fields,
        partitions=[group_pb2.OffsetCommitPartition(topic=t, partition=p, offset=o, leader_epoch=-1)
                    for t, p, o in parts]))


def test_list_groups_hashes_no_group_id(coord: GroupCoordinator) -> None:
    for i in range(200):
        assert [r[2] for r in _commit(coord, f"simple-{i}", [("t", i % 4, i)])] == [ErrorCode.NONE]
    coord._groups["made-elsewhere"] = Group("made-elsewhere")  # no partition kept: hashed once, then kept
    with mock.patch.object(gc, "partition_for_group", wraps=gc.partition_for_group) as hashed:
        listed = coord.list_groups(set())
        assert len(listed) == 201 and hashed.call_count == 1
        assert len(coord.list_groups({"Empty"})) == 201 and coord.list_groups({"Stable"}) == []
        assert hashed.call_count == 1, "ListGroups hashed group ids"
        # Nor do the retention pass and an unload (both walk every group under the lock).
        coord.expire_offsets()
        victim = coord._groups["simple-0"].offsets_partition
        with coord._lock:
            coord._unload_locked(victim)
        assert hashed.call_count == 1
    assert "simple-0" not in coord._groups
    assert all(g.offsets_partition == coord.partition_for(g.group_id) for g in coord._groups.values())
    # A partition not loaded (yet) keeps its groups out of the listing.
    loading = coord._groups["simple-1"].offsets_partition
    coord._partitions[loading].loaded = False
    assert "simple-1" not in {g.group_id for g in coord.list_groups(set())}


def test_a_commit_that_writes_no_offset_makes_no_group(coord: GroupCoordinator) -> None:
    unknown = _commit(coord, "ghost-1", [("t", 999, 1), ("no-such-topic", 0, 1)])
    assert [r[2] for r in unknown] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2
    assert [r[2] for r in _commit(coord, "ghost-2", [("t", -1, 5)])] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert _commit(coord, "ghost-3", []) == []
    assert coord._groups == {} and coord.list_groups(set()) == []
    assert coord.replica_manager.appended == []
    # A member's commit to a group that does not exist is refused, as before.
    with pytest.raises(CoordinatorError) as info:
        _commit(coord, "ghost-5", [("t", 0, 1)], member_id="m", generation_id=1)
    assert info.value.code == ErrorCode.UNKNOWN_MEMBER_ID and coord._groups == {}


def test_a_negative_offset_is_stored_as_given_and_counts_for_no_lag(coord: GroupCoordinator) -> None:
    """As Kafka stores it: KafkaJS commits -1 (latest) and -2 (earliest) to reset a group (after OFFSET_OUT_OF_RANGE,
    and in admin.resetOffsets) and reads them back so. Refused with INVALID_COMMIT_OFFSET_SIZE, which is not
    retriable, its consumers died and resetOffsets never returned (KafkaJS audit)."""
    assert [r[2] for r in _commit(coord, "reset", [("t", 0, -2), ("t", 1, -1), ("t", 2, 7)])] == [ErrorCode.NONE] * 3
    fetched = {tp.partition: (e.offset if e is not None else None)
               for tp, e in coord.fetch_offsets("reset", [TP("t", p) for p in range(3)])}
    assert fetched == {0: -2, 1: -1, 2: 7}, fetched
    coord._end_offsets = {TP("t", p): 100 for p in range(3)}
    rows = {(r.partition, r.committed_offset, r.lag) for r in coord.stats().offsets if r.group == "reset"}
    assert rows == {(2, 7, 93)}, rows  # a negative committed offset is none: no lag of end + 1


def test_a_simple_consumers_commit_makes_an_empty_group_as_in_kafka(coord: GroupCoordinator) -> None:
    results = _commit(coord, "simple", [("t", 1, 42), ("t", 999, 1)])
    assert sorted(r[2] for r in results) == [ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    g = coord._groups["simple"]
    assert g.state == GroupState.EMPTY and g.protocol_type == ""
    assert {tp: e.offset for tp, e in g.offsets.items()} == {TP("t", 1): 42}
    assert [x.group_id for x in coord.list_groups({"Empty"})] == ["simple"]
    assert [(tp, e.offset if e else None) for tp, e in coord.fetch_offsets("simple", [TP("t", 1)])] == [(TP("t", 1), 42)]
    # The next commit of the same simple consumer goes to the group it made.
    _commit(coord, "simple", [("t", 1, 43)])
    assert coord._groups["simple"] is g and g.offsets[TP("t", 1)].offset == 43


# ---------------------------------------------------------------------- DescribeGroups (#8)
def _group_with_offsets(c: GroupCoordinator, gid: str, topic: str, partitions: int) -> Group:
    g = Group(gid, state=GroupState.EMPTY)
    for p in range(partitions):
        g.offsets[TP(topic, p)] = OffsetEntry(p, -1, "", 0)
    c._groups[gid] = g
    return g


def test_a_repeated_group_id_is_described_once_and_each_copy_counted(coord: GroupCoordinator) -> None:
    _group_with_offsets(coord, "dg", "big", 300)
    servicer = GroupCoordinatorServicer(coord)
    bound = 100_000  # the answer's bound, smaller here: a copy carries about 300 x 51 bytes
    held = _DescribeBytes(coord)
    try:
        with mock.patch.object(coord, "_resolve_offsets", wraps=_ends) as resolved, \
                mock.patch.object(coord, "describe_group", wraps=coord.describe_group) as described, \
                mock.patch.object(group_service, "DESCRIBE_ANSWER_MAX_BYTES", bound):
            out = servicer._describe_groups(group_pb2.DescribeGroupsRequest(group_ids=["dg"] * 40,
                                                                            include_offsets=True), None, held=held)
        assert described.call_count == 1, "a repeated group id was described again"
        assert sum(len(call.args[0]) for call in resolved.call_args_list) == 300, "end offsets resolved again"
        # Every listed id is answered (Kafka's shape): copies while they fit the answer's bound, then refusals.
        assert [g.group_id for g in out.groups] == ["dg"] * 40
        codes = [g.error_code for g in out.groups]
        fitted = codes.count(ErrorCode.NONE)
        assert 1 <= fitted < 40 and codes == [ErrorCode.NONE] * fitted + [ErrorCode.INVALID_REQUEST] * (40 - fitted)
        assert all(g == out.groups[0] for g in out.groups[:fitted]) and len(out.groups[0].offsets) == 300
        assert out.ByteSize() <= bound + 40 * 200, out.ByteSize()
        size = coord.describe_group("dg", True)[1]
        assert size >= out.groups[0].ByteSize()  # the estimate covers what a copy carries
        assert held._held == fitted * size and coord._describing_bytes == fitted * size
    finally:
        held.release()
    assert coord._describing_bytes == 0


def test_offset_fetch_answers_a_repeated_partition_once(coord: GroupCoordinator) -> None:
    # Every copy of a named partition was answered with its offset and metadata: 2,034 copies of one partition
    # committed with 4 KiB of metadata (22 KB) made an 8.4 MB answer (audit). Kafka keys them by a map.
    g = _group_with_offsets(coord, "of", "t", 2)
    g.offsets[TP("t", 0)] = OffsetEntry(7, -1, "m" * 4096, 0)
    servicer = GroupCoordinatorServicer(coord)
    caller = types.SimpleNamespace(brook_authentication=None)
    asked = [group_pb2.TopicPartitionRef(topic="t", partition=0)] * 1000 + [
        group_pb2.TopicPartitionRef(topic="t", partition=1)]
    with mock.patch.object(group_service.principal, "principal_of", return_value=None):
        out = servicer._offset_fetch(group_pb2.OffsetFetchRequest(group_id="of", partitions=asked), caller)
    assert [(p.partition, p.offset) for p in out.partitions] == [(0, 7), (1, 1)], out.partitions[:3]
    assert out.ByteSize() < 5000, out.ByteSize()


def test_end_offsets_are_resolved_once_a_partition_a_request(coord: GroupCoordinator) -> None:
    for gid in ("a", "b", "c"):
        _group_with_offsets(coord, gid, "big", 100)
    servicer = GroupCoordinatorServicer(coord)
    held = _DescribeBytes(coord)
    try:
        with mock.patch.object(coord, "_resolve_offsets", wraps=_ends) as resolved:
            out = servicer._describe_groups(group_pb2.DescribeGroupsRequest(group_ids=["a", "b", "c", "b"],
                                                                            include_offsets=True), None, held=held)
        assert [len(call.args[0]) for call in resolved.call_args_list] == [100]
        assert [g.error_code for g in out.groups] == [ErrorCode.NONE] * 4
        assert all(len(g.offsets) == 100 and all(o.log_end_offset == 100 for o in g.offsets) for g in out.groups)
    finally:
        held.release()


def test_offsets_count_in_a_descriptions_bytes(coord: GroupCoordinator) -> None:
    """Each offset entry counts its topic, commit metadata and owner: a consumer member whose assignment names
    many partitions shows its (long) member id in each entry."""
    g = _group_with_offsets(coord, "owned", "big", 300)
    long_id = "m-" + "x" * 1000
    assignment = group_pb2.ConsumerAssignment(partitions=[
        group_pb2.TopicPartitionRef(topic="big", partition=p) for p in range(300)]).SerializeToString()
    g.state, g.protocol_type, g.protocol_name, g.generation_id, g.leader_id = (
        GroupState.STABLE, "consumer", "range", 1, long_id)
    g.members[long_id] = Member(long_id, "c", "h", 10_000, 10_000, [("range", _subscription(["big"]))], 0,
                                assignment=assignment)
    with mock.patch.object(coord, "_resolve_offsets", wraps=_ends):
        without, members_only = coord.describe_group("owned", include_offsets=False)
        described, size = coord.describe_group("owned", include_offsets=True)
        assert without.error_code == described.error_code == ErrorCode.NONE
        assert size >= members_only + 300 * (len(long_id) + len("big"))
        assert size >= described.ByteSize(), (size, described.ByteSize())
        assert {o.member_id for o in described.offsets} == {long_id} and len(described.offsets) == 300
        refused, counted = coord.describe_group("owned", include_offsets=True, max_bytes=size - 1)
        assert refused.error_code == ErrorCode.INVALID_REQUEST and counted == 0 and "300 partitions" in refused.error_message


# ---------------------------------------------------------------------- AlterGroupOffsets (#11)
def _spec(topic: str, partition: int, kind: int = group_pb2.RESET_EARLIEST, value: int = 0) -> Any:
    return group_pb2.OffsetResetSpec(topic=topic, partition=partition, kind=kind, value=value)


def _expanded_one_spec_at_a_time(c: GroupCoordinator, specs: list[Any]) -> dict[TP, Any]:
    """What the specs meant before: applied in order, a whole topic (-1) expanded for each."""
    out: dict[TP, Any] = {}
    for spec in specs:
        if spec.partition >= 0:
            out[TP(spec.topic, spec.partition)] = spec
        else:
            for info in c.metadata_cache.partitions_of(spec.topic):
                out[TP(spec.topic, info.partition)] = spec
    return out


def test_alter_offsets_expands_each_topic_once(coord: GroupCoordinator) -> None:
    specs = [_spec("big", -1)] * 600 + [_spec("t", -1, group_pb2.RESET_LATEST)] * 10 + [_spec("big", 5)] * 50
    with mock.patch.object(coord.metadata_cache, "partitions_of", wraps=coord.metadata_cache.partitions_of) as walked, \
            mock.patch.object(coord, "_resolve_offsets", wraps=_ends):
        resolved = coord.alter_offsets(group_pb2.AlterGroupOffsetsRequest(group_id="reset", specs=specs, dry_run=True))
    assert sorted(call.args[0] for call in walked.call_args_list) == ["big", "t"]
    assert len(resolved) == 304 and all(r.error_code == ErrorCode.NONE for r in resolved)
    assert "reset" not in coord._groups  # a dry run makes no group


@pytest.mark.parametrize("kind", [5, 99, -1])
def test_alter_offsets_of_an_unknown_reset_kind_is_refused_and_writes_nothing(coord: GroupCoordinator,
                                                                            kind: int) -> None:
    """An undefined kind was taken for RESET_EXPLICIT: its value, clamped to the log, was committed (audit)."""
    with mock.patch.object(coord, "_resolve_offsets", wraps=_ends), \
            mock.patch.object(coord, "_admit_and_write_offsets") as written, pytest.raises(CoordinatorError) as refused:
        coord.alter_offsets(group_pb2.AlterGroupOffsetsRequest(group_id="reset-kind", specs=[
            _spec("t", 0, group_pb2.RESET_EARLIEST), _spec("t", 1, kind, 7)]))
    assert refused.value.code == ErrorCode.INVALID_REQUEST and f"unknown offset reset kind {kind}" in refused.value.message
    assert written.call_count == 0 and "reset-kind" not in coord._groups


def test_reduced_specs_mean_what_the_specs_in_order_meant(coord: GroupCoordinator) -> None:
    rng = random.Random(7)
    for _ in range(200):
        specs = [_spec(rng.choice(["t", "other"]), rng.choice([-1, -1, 0, 1, 2, 3]),
                       rng.choice([group_pb2.RESET_EARLIEST, group_pb2.RESET_LATEST, group_pb2.RESET_EXPLICIT]),
                       rng.randrange(10)) for _ in range(rng.randrange(1, 12))]
        assert coord._expand_specs(specs, {}) == _expanded_one_spec_at_a_time(coord, specs), specs
    with pytest.raises(CoordinatorError) as info:
        coord._expand_specs([_spec("t", -1), _spec("nope", -1), _spec("gone", -1), _spec("nope", -1)], {})
    assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and "'nope'" in info.value.message


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_kafka_clients_subscriptions_are_read_in_kafkas_format(version: int) -> None:
    """Kafka clients' members send ConsumerProtocolSubscription (kafka-python's encoder here), not
    Brook's protobuf: their topics must be read too, or OffsetDelete never refuses a subscribed
    topic for them (as it did) and DescribeGroups shows them subscribed to nothing."""
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

    raw = ConsumerProtocolSubscription(version=version, topics=["orders", "logs"], user_data=b"u").encode(
        version=version)
    assert records.subscribed_topics(raw) == {"orders", "logs"}
    parsed = records.parse_subscriptions("consumer", [("range", raw), ("cooperative-sticky", raw)])
    assert parsed.of("range") == parsed.of("cooperative-sticky") == {"orders", "logs"}
    for broken in (raw[:9], b"\x00\x00\x7f\xff\xff\xff", b"\x00\x00\x00\x00\x00\x01\xff\xff", b"\x00"):
        assert records.subscribed_topics(broken) == frozenset(), broken


def test_kafka_clients_owned_partitions_and_assignments_decode() -> None:
    """What DescribeGroups shows of a Kafka client's member (Brook's admin and `brook group describe`):
    its owned partitions and generation (cooperative rebalancing) and its assignment, from kafka-python's
    encoders; Brook's own protobuf still decodes; a claimed count larger than the bytes builds nothing."""
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

    tp = ConsumerProtocolSubscription.TopicPartition
    sub = records.consumer_subscription(ConsumerProtocolSubscription(
        version=3, topics=["orders"], user_data=None, owned_partitions=[tp(topic="orders", partitions=[0, 2])],
        generation_id=7, rack_id="r1").encode(version=3))
    assert (list(sub.topics), [(r.topic, r.partition) for r in sub.owned_partitions], sub.generation_id, sub.rack) \
        == (["orders"], [("orders", 0), ("orders", 2)], 7, "r1")
    atp = ConsumerProtocolAssignment.TopicPartition
    assigned = records.consumer_assignment(ConsumerProtocolAssignment(
        version=0, assigned_partitions=[atp(topic="orders", partitions=[0, 2]), atp(topic="logs", partitions=[1])],
        user_data=b"x").encode(version=0))
    assert [(r.topic, r.partition) for r in assigned.partitions] == [("orders", 0), ("orders", 2), ("logs", 1)]
    assert assigned.user_data == b"x"
    mine = group_pb2.ConsumerAssignment(partitions=[group_pb2.TopicPartitionRef(topic="t", partition=3)])
    assert records.consumer_assignment(mine.SerializeToString()) == mine
    with pytest.raises(ValueError):
        records.consumer_assignment(b"\x00\x00\x7f\xff\xff\xff")


# ---------------------------------------------------------------------- deleted topics' offsets
def test_a_deleted_topics_offsets_are_tombstoned_and_a_later_commit_stays(coord: GroupCoordinator) -> None:
    _commit(coord, "g", [("t", 0, 5), ("t", 1, 6), ("other", 0, 7)])
    coord.on_topics_deleted([types.SimpleNamespace(name="t")])
    written = len(coord.replica_manager.appended)
    assert coord.drop_offsets_of_deleted_topics() == 2
    assert set(coord._groups["g"].offsets) == {TP("other", 0)}
    assert len(coord.replica_manager.appended) == written + 1  # the tombstones, in one batch
    # Seen again later (the topic created anew meanwhile): a commit made after the deletion was seen stays.
    coord.on_topics_deleted([types.SimpleNamespace(name="other")])
    coord.clock_ms = lambda: 2_000_000
    _commit(coord, "g", [("other", 0, 1)])
    assert coord.drop_offsets_of_deleted_topics() == 0 and coord._groups["g"].offsets[TP("other", 0)].offset == 1


def test_the_sweep_drops_offsets_only_of_topics_unknown_at_two_sweeps_running(coord: GroupCoordinator) -> None:
    """A topic missing from the metadata for a moment (a stale snapshot, then the current state) keeps its
    offsets; one still missing at the next sweep (deleted while another broker coordinated) loses them."""
    _commit(coord, "g", [("t", 0, 5), ("other", 0, 7)])
    coord.metadata_cache = FakeCache({"big": 300})  # both topics gone from the metadata
    assert coord.drop_offsets_of_deleted_topics(sweep_unknown=True) == 0
    coord.metadata_cache = FakeCache({"big": 300, "t": 4})  # "t" was missing for a moment only
    assert coord.drop_offsets_of_deleted_topics(sweep_unknown=True) == 1
    assert set(coord._groups["g"].offsets) == {TP("t", 0)}
    coord.metadata_cache = FakeCache({"big": 300})
    assert coord.drop_offsets_of_deleted_topics(sweep_unknown=True) == 0, "unknown at one sweep only"


def test_only_a_delta_tells_the_coordinator_of_deleted_topics() -> None:
    """A snapshot's "deleted" topics are those it does not name: it may be stale or wrong, so only a delta's
    deletions drop offsets at once (the sweep above takes the rest)."""
    from broker.metadata_cache import MetadataCache
    from proto import controller_pb2

    cache = MetadataCache(1)
    told: list[list[str]] = []
    cache.add_deleted_topics_listener(lambda topics: told.append([t.name for t in topics]))

    def snapshot(version: int, names: list[str]) -> controller_pb2.MetadataUpdate:
        u = controller_pb2.MetadataUpdate(version=version, is_snapshot=True, cluster_id="c")
        for name in names:
            u.topics.add(name=name, topic_id=name * 8, partition_count=1)
        return u

    cache.apply(snapshot(1, ["a", "b"]))
    cache.apply(snapshot(2, ["a"]))
    assert told == [] and cache.topic("b") is None
    cache.apply(controller_pb2.MetadataUpdate(version=3, deleted_topic_ids=["a" * 8]))
    assert told == [["a"]]


# ---------------------------------------------------------------------- what committed offsets may hold
def test_commits_past_the_offsets_budget_are_refused_and_commits_adding_nothing_still_taken() -> None:
    """group.coordinator.offsets.max.bytes: a client committing to made-up group ids, each offset with the
    longest metadata, made the coordinator hold more without end; past the budget such commits are refused
    (retriable COORDINATOR_NOT_AVAILABLE), while a group already here goes on committing what it holds."""
    from broker.group_state import GROUP_OVERHEAD_BYTES, offset_bytes

    budget = 200_000
    c, now = _coordinator(group_coordinator_offsets_max_bytes=budget)
    try:
        assert _commit(c, "steady", [("t", p, 1) for p in range(4)])[0][2] == ErrorCode.NONE
        metadata = "m" * c.config.offset_metadata_max_bytes
        made = 0
        with pytest.raises(CoordinatorError) as refused:
            for i in range(1000):
                c.commit_offsets(group_pb2.OffsetCommitRequest(
                    group_id=f"made-up-{i}", generation_id=-1, partitions=[group_pb2.OffsetCommitPartition(
                        topic="t", partition=p, offset=1, leader_epoch=-1, metadata=metadata) for p in range(4)]))
                made += 1
        assert refused.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE, refused.value
        assert "group.coordinator.offsets.max.bytes" in str(refused.value)
        held = sum(g.offsets.held_bytes + GROUP_OVERHEAD_BYTES + len(gid) for gid, g in c._groups.items())
        assert 0 < made < 1000 and held <= budget, (made, held)
        assert f"made-up-{made}" not in c._groups, "a refused commit makes no group"
        # Each group's count is exact: what its offsets hold, however they were set.
        g = c._groups["made-up-0"]
        assert g.offsets.held_bytes == sum(offset_bytes(tp, e) for tp, e in g.offsets.items())
        # The same partitions again, and shorter metadata: nothing added, taken.
        assert [r[2] for r in _commit(c, "steady", [("t", p, 2) for p in range(4)])] == [ErrorCode.NONE] * 4
        assert [r[2] for r in _commit(c, "made-up-0", [("t", 0, 5)])] == [ErrorCode.NONE]
        assert g.offsets.held_bytes == sum(offset_bytes(tp, e) for tp, e in g.offsets.items())
        # Groups gone (deleted, expired): the room is there again once counted afresh.
        with c._lock:
            for i in range(made):
                c._groups.pop(f"made-up-{i}", None)
        c._offsets_counted_at = float("-inf")  # the next refusal would count again: as if a second had passed
        assert [r[2] for r in _commit(c, "after", [("t", 1, 1)])] == [ErrorCode.NONE]
    finally:
        c._loader.shutdown()


def _commit_with_metadata(c: GroupCoordinator, group: str, client: str, metadata: str,
                          partitions: range = range(4)) -> list[tuple[str, int, int, str]]:
    """A commit from outside group management, from ``client``, of offset 1 with ``metadata`` on ``partitions``
    of "big"."""
    return c.commit_offsets(group_pb2.OffsetCommitRequest(
        group_id=group, generation_id=-1, partitions=[group_pb2.OffsetCommitPartition(
            topic="big", partition=p, offset=1, leader_epoch=-1, metadata=metadata) for p in partitions]), client)


def _made_until_refused_for_the_share(make: Callable[[int], Any], address: str, most: int) -> int:
    """Call ``make(0)``, ``make(1)``, ... until the offsets share of ``address`` refuses one (within ``most``
    calls); how many were taken."""
    made = 0
    with pytest.raises(CoordinatorError) as refused:
        for i in range(most):
            make(i)
            made += 1
    assert refused.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE, refused.value
    assert "group.coordinator.offsets.max.bytes.per.ip" in str(refused.value) and address in str(refused.value)
    return made


def test_one_address_cannot_fill_the_offsets_budget_for_every_other_addresss_new_groups() -> None:
    """group.coordinator.offsets.max.bytes.per.ip: a probe from one address committed 4 KB of metadata on 200
    partitions to made-up groups until the coordinator's whole budget was held; every other address's new
    group was then refused, for as long as the offsets are kept (7 days). The groups an address made now hold
    at most its share, and another address's new group is taken."""
    budget, share = 400_000, 100_000
    c, now = _coordinator(group_coordinator_offsets_max_bytes=budget, group_coordinator_offsets_max_bytes_per_ip=share)
    metadata = "m" * c.config.offset_metadata_max_bytes

    def commit(group: str, client: str, partitions: range = range(4)) -> list[tuple[str, int, int, str]]:
        return _commit_with_metadata(c, group, client, metadata, partitions)
    try:
        made = _made_until_refused_for_the_share(lambda i: commit(f"flood-{i}", "10.0.0.2"), "10.0.0.2", 1000)
        c._offsets_counted_at = float("-inf")
        c._count_offset_bytes_locked()
        assert 0 < made and c._offset_bytes_by_owner["10.0.0.2"] == c._offset_bytes <= share < budget, \
            (made, c._offset_bytes_by_owner, c._offset_bytes)
        # Another address's new group is taken; the flooding address's groups still take what adds nothing.
        assert [r[2] for r in commit("victim", "10.0.0.1")] == [ErrorCode.NONE] * 4
        assert c._groups["victim"].owner == "10.0.0.1"
        assert [r[2] for r in commit("flood-0", "10.0.0.2")] == [ErrorCode.NONE] * 4
        # What another address adds to a group the flood made counts against the flood's share: its groups
        # cannot be grown from elsewhere to get round it.
        with pytest.raises(CoordinatorError, match="groups made from 10.0.0.2"):
            commit("flood-0", "10.0.0.3", range(4, 8))
        # A group loaded from the log (no address made it here) counts in the whole budget only.
        c._groups["loaded"] = c._new_group("loaded")
        assert [r[2] for r in commit("loaded", "10.0.0.2", range(8))] == [ErrorCode.NONE] * 8
        # A commit admitted and still being written (acks=all) is counted by a recount made meanwhile: without,
        # concurrent commits passed the share by 4% in the probe.
        from broker.group_state import OffsetEntry
        settled = dict(c._offset_bytes_by_owner)
        with c._lock:
            owner, incoming = c._admit_offsets_locked(
                "in-flight", [(TP("big", 0), OffsetEntry(1, -1, metadata, 0))], "10.0.0.4")
            c._count_offset_bytes_locked()
            assert owner == "10.0.0.4" and c._offset_bytes_by_owner.get("10.0.0.4") == incoming > 0
            c._offsets_in_flight_locked(owner, -incoming)  # its write failed: nothing of it stays
            c._count_offset_bytes_locked()
        assert c._offset_bytes_by_owner == settled and not c._offsets_in_flight.get("")
    finally:
        c._loader.shutdown()


def _stored(batch: bytes) -> list[Any]:
    """The records of one appended batch, decoded."""
    from storage.record_batch import decode_batch, iter_batches

    return [r for pos, _h in iter_batches(batch) for r in decode_batch(batch, pos)[1]]


def _records_of(appended: list[tuple[int, bytes]]) -> list[Any]:
    """The parsed records of what a coordinator appended, in order."""
    return [records.parse_record(r.key, r.value, r.offset) for _p, batch in appended for r in _stored(batch)]


def _batch(kvs: list[tuple[bytes, bytes | None]]) -> bytes:
    from storage.record_batch import RecordBatchBuilder

    builder = RecordBatchBuilder()
    for k, v in kvs:
        builder.append(1, k, v)
    return builder.build()


def _load_from(tmp_path: Path, batches: list[bytes], **config: Any) -> tuple[GroupCoordinator, Any]:
    """A coordinator that loaded partition 0 of __consumer_offsets holding ``batches``; (it, its log manager)."""
    from storage.log_manager import LogManager

    lm = LogManager([tmp_path / "data"], on_dir_failure=lambda d, e: None)
    lg = lm.get_or_create_log(records.OFFSETS_TOPIC, 0, topic_id="T", overrides={})
    for batch in batches:
        lg.append_as_leader(batch, 0)
    hosted = types.SimpleNamespace(is_leader=True, log=lg)
    writes = FakeReplicaManager()
    rm = types.SimpleNamespace(partition=lambda t, p: hosted if (t, p) == (records.OFFSETS_TOPIC, 0) else None,
                               log_manager=lm, append_records=writes.append_records, appended=writes.appended)
    c = GroupCoordinator(node_id=2, replica_manager=rm, metadata_cache=FakeCache(TOPICS),
                         config=CoordinatorConfig(**{"offsets_topic_num_partitions": 1, **config}))
    c._partitions[0] = _PartitionLoad(leader_epoch=1)
    c._load_partition(0, 1)
    return c, lm


def test_a_groups_owner_is_one_record_of_its_own_written_once(tmp_path: Path) -> None:
    """Kafka's value layouts have no place for the address a group counts against: it is a record of its own,
    written with the group's first commit (or group record), not with every commit; a group loaded from records
    that named it in their values (Brook's earlier format) gets one with its next commit; deleting the group
    deletes it. A load finds it wherever compaction left it, before or after the group's other records."""
    c, _ = _coordinator(offsets_topic_num_partitions=1)
    try:
        for _ in range(3):
            _commit_with_metadata(c, "g", "10.0.0.2", "")
        owners = [r for r in _records_of(c.replica_manager.appended) if isinstance(r, records.OwnerRecord)]
        assert owners == [records.OwnerRecord("g", "10.0.0.2")], owners
        with c._lock:  # as a group loaded from values that named their owner
            c._groups["g"].owner_recorded = False
        _commit_with_metadata(c, "g", "10.0.0.9", "")
        owners = [r for r in _records_of(c.replica_manager.appended) if isinstance(r, records.OwnerRecord)]
        assert owners[1:] == [records.OwnerRecord("g", "10.0.0.2")], owners  # the group's owner, not the caller
        c.delete_group("g")
        assert _records_of(c.replica_manager.appended)[-1] == records.OwnerRecord("g", None)
        # A group record whose write failed leaves the owner unrecorded: the next write carries it.
        failed: concurrent.futures.Future = concurrent.futures.Future()
        failed.set_exception(errors.NotEnoughReplicasError("no ISR"))
        with c._lock, mock.patch.object(c.replica_manager, "append_records", return_value=failed):
            joined = c._group_locked("joined", create=True, owner="10.0.0.3")
            joined.persist_needed = True
            c._after_change_locked(joined)
        assert not joined.owner_recorded
    finally:
        c._loader.shutdown()

    offset = records.encode_offset_value(OffsetEntry(7, -1, "", 1))
    compacted = [[(records.owner_key("g"), records.owner_value("10.0.0.2"))],  # its first commit's owner record
                 [(records.offset_key("g", TP("big", 0)), offset)],  # a later commit
                 [(records.owner_key("gone"), records.owner_value("10.0.0.3")),
                  (records.offset_key("gone", TP("big", 0)), offset)],
                 [(records.offset_key("gone", TP("big", 0)), None), *records.group_tombstones("gone")]]
    loaded, lm = _load_from(tmp_path, [_batch(kvs) for kvs in compacted])
    try:
        assert loaded._groups["g"].owner == "10.0.0.2" and loaded._groups["g"].owner_recorded
        assert "gone" not in loaded._groups
        _commit_with_metadata(loaded, "g", "10.0.0.2", "")  # recorded already: no second owner record
        assert not [r for r in _records_of(loaded.replica_manager.appended)
                    if isinstance(r, records.OwnerRecord)]
    finally:
        loaded._loader.shutdown()
        lm.shutdown()


def test_record_format_brook_writes_what_a_release_before_the_kafka_layouts_reads() -> None:
    """While a cluster is upgraded from a release before the Kafka layouts (which skips them, and would load the
    groups without their offsets), group.coordinator.record.format=brook writes the earlier values: the owner in
    each, no owner record. A wrong value is one line naming the key."""
    from broker.config import ConfigError, load_config

    node = {"process.roles": "broker", "node.id": "7", "cluster.id": "c", "listeners": "BROKER://127.0.0.1:1234",
            "controller.quorum.voters": "1@127.0.0.1:1235:1236", "log.dirs": "/d"}
    assert CoordinatorConfig.from_defaults(dict(load_config(None, node, env={}).defaults())).record_format == "kafka"
    config = load_config(None, {**node, "group.coordinator.record.format": "brook"}, env={})
    assert CoordinatorConfig.from_defaults(dict(config.defaults())).record_format == "brook"
    with pytest.raises(ConfigError, match="group.coordinator.record.format.*must be one of kafka, brook"):
        load_config(None, {**node, "group.coordinator.record.format": "kafak"}, env={})
    c, _ = _coordinator(offsets_topic_num_partitions=1, record_format="brook")
    try:
        _commit_with_metadata(c, "g", "10.0.0.2", "", partitions=range(1))
        with c._lock:  # a group a join made, writing its record
            joined = c._group_locked("joined", create=True, owner="10.0.0.3")
            joined.persist_needed = True
            c._after_change_locked(joined)
        values = [r.value for _p, batch in c.replica_manager.appended for r in _stored(batch)]
        assert values and all(v is not None and v[:2] == b"\0\0" for v in values), values
        parsed = _records_of(c.replica_manager.appended)
        assert not [r for r in parsed if isinstance(r, records.OwnerRecord)]
        assert [r.owner for r in parsed if isinstance(r, records.OffsetRecord)] == ["10.0.0.2"]
        assert [r.value.owner for r in parsed if isinstance(r, records.GroupRecord)] == ["10.0.0.3"]
    finally:
        c._loader.shutdown()


def test_a_protocol_name_past_what_a_group_record_holds_is_refused_at_the_join() -> None:
    """The group's chosen protocol is a string of its record (Kafka's layout: an int16 length). A join offering a
    longer name (gRPC has no such bound) is refused; a group whose record still cannot be encoded is logged, and
    the call that changed it is not failed by the write."""
    c, _ = _coordinator()
    try:
        with pytest.raises(CoordinatorError, match="protocol name longer than 249") as refused:
            c.start_join(group_pb2.JoinGroupRequest(
                group_id="g", session_timeout_ms=10_000, protocol_type="consumer", client_id="c",
                protocols=[group_pb2.GroupProtocol(name="x" * 250, metadata=b"")]), lambda result: None)
        assert refused.value.code == ErrorCode.INVALID_REQUEST
        with c._lock:
            g = c._group_locked("odd", create=True, owner="10.0.0.3")
            g.protocol_type, g.protocol_name, g.persist_needed = "consumer", "p" * 40_000, True
            c._after_change_locked(g)  # logged, not raised
        assert not c.replica_manager.appended
    finally:
        c._loader.shutdown()


def test_a_coordinator_that_loads_an_addresss_groups_counts_them_against_that_address(tmp_path: Path) -> None:
    """Each committed offset's record names the address its group counts against. Before, a coordinator that
    loaded the groups (after a failover or a restart) counted them against no address, so every failover gave
    the flooding address a whole new share of group.coordinator.offsets.max.bytes.per.ip."""
    budget, share = 400_000, 100_000
    config = {"group_coordinator_offsets_max_bytes": budget, "group_coordinator_offsets_max_bytes_per_ip": share,
              "offsets_topic_num_partitions": 1}
    first, _ = _coordinator(**config)
    metadata = "m" * first.config.offset_metadata_max_bytes

    def commit(c: GroupCoordinator, group: str, client: str) -> list[Any]:
        return _commit_with_metadata(c, group, client, metadata)
    try:
        for i in range(5):  # about 83 KB of the address's 100 KB share
            commit(first, f"flood-{i}", "10.0.0.2")
        with mock.patch.object(first, "_resolve_offsets", wraps=_ends):  # a reset makes a group too
            first.alter_offsets(group_pb2.AlterGroupOffsetsRequest(group_id="reset-made", specs=[
                _spec("t", 0, group_pb2.RESET_EXPLICIT, 0)]), "10.0.0.2")
        with first._lock:
            first._offsets_counted_at = float("-inf")
            first._count_offset_bytes_locked()
            held = dict(first._offset_bytes_by_owner)
        assert held.get("10.0.0.2", 0) > 0, held
    finally:
        first._loader.shutdown()
    second, lm = _load_from(tmp_path, [batch for _p, batch in first.replica_manager.appended], **config)
    try:
        assert second._groups["flood-3"].owner == second._groups["reset-made"].owner == "10.0.0.2"
        with second._lock:
            second._offsets_counted_at = float("-inf")
            second._count_offset_bytes_locked()
            assert second._offset_bytes_by_owner == held
        # So the address's share is as full as it was: one more group fits, not another share's worth (the
        # old code took five more before refusing).
        made = 0
        with pytest.raises(CoordinatorError, match="groups made from 10.0.0.2"):
            for i in range(5, 100):
                commit(second, f"flood-{i}", "10.0.0.2")
                made += 1
        assert made <= 1, f"{made} more groups of that address were taken after the load"
    finally:
        second._loader.shutdown()
        lm.shutdown()


def test_admin_offset_resets_count_against_the_offsets_budget_as_commits_do() -> None:
    """An AlterGroupOffsets reset sets an offset for every partition it names, whole topics included, and
    makes the group when there is none: resets of made-up groups from one address, each naming a topic of
    300 partitions, took the coordinator past both offsets bounds (they were written without being
    counted). They are counted as a commit is: past the address's share the reset is refused and makes
    nothing, while another address's reset is taken."""
    budget, share = 400_000, 100_000
    c, _ = _coordinator(group_coordinator_offsets_max_bytes=budget, group_coordinator_offsets_max_bytes_per_ip=share)

    def reset(group: str, client: str) -> list[group_pb2.ResolvedOffset]:
        with mock.patch.object(c, "_resolve_offsets", wraps=_ends):
            return c.alter_offsets(group_pb2.AlterGroupOffsetsRequest(
                group_id=group, specs=[_spec("big", -1, group_pb2.RESET_LATEST)]), client)
    try:
        made = _made_until_refused_for_the_share(lambda i: reset(f"reset-{i}", "10.0.0.2"), "10.0.0.2", 100)
        assert 0 < made and f"reset-{made}" not in c._groups, "a refused reset makes no group"
        c._offsets_counted_at = float("-inf")
        c._count_offset_bytes_locked()
        assert c._offset_bytes_by_owner["10.0.0.2"] <= share, (made, c._offset_bytes_by_owner)
        assert c._groups["reset-0"].owner == "10.0.0.2" and len(c._groups["reset-0"].offsets) == 300
        resolved = reset("elsewhere", "10.0.0.1")
        assert len(resolved) == 300 and all(r.offset == 100 for r in resolved)
        assert c._groups["elsewhere"].owner == "10.0.0.1"
        # Resetting a group again to offsets of the same size adds nothing: taken, whoever made it.
        assert len(reset("reset-0", "10.0.0.2")) == 300
    finally:
        c._loader.shutdown()


# ---------------------------------------------------------------------- decoded partitions (audit, 2026-12-03)
def _partitions_of_one_topic(topic_bytes: int, partitions: int, version: int = 1) -> tuple[bytes, bytes]:
    """(subscription v1 owning, assignment v0 of) ``partitions`` four-byte partitions of one topic named with
    ``topic_bytes`` bytes, in Kafka's consumer protocol format."""
    import struct

    topic = b"a" * topic_bytes
    tps = struct.pack(">i", 1) + struct.pack(">h", len(topic)) + topic + struct.pack(f">i{partitions}i", partitions,
                                                                                     *range(partitions))
    subscription = struct.pack(">hi", version, 0) + struct.pack(">i", -1) + tps
    return subscription, struct.pack(">h", 0) + tps + struct.pack(">i", -1)


_PARSE_PEAK = """
import resource, sys
from broker import group_records
from tests.groups.test_group_amplification import _partitions_of_one_topic
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
metadata, _ = _partitions_of_one_topic(int(sys.argv[1]), 4_000)
group_records.parse_subscriptions("consumer", [("range", metadata)])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def _parse_peak_kib(topic_bytes: int) -> int:
    """How much a fresh process's peak RSS grows parsing a subscription owning 4,000 partitions of one topic
    (protobuf allocates outside Python's allocator, where tracemalloc does not see it)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _PARSE_PEAK, str(topic_bytes)], cwd=root, capture_output=True,
                         text=True, timeout=120, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_a_join_does_not_decode_the_partitions_a_subscription_claims_to_own() -> None:
    # Each decoded partition carried its topic's name: a 32 KiB name and 16,000 four-byte partitions (97 KB of
    # JoinGroup metadata) took 1 GB on a coordinator, before it checked that it was the group's coordinator.
    # The coordinator reads a subscription's topics only, and no partition names a topic past 249 bytes.
    grown = _parse_peak_kib(32_767)
    assert grown < 16 << 10, f"parsing a 48 KB subscription grew the process by {grown >> 10} MiB"
    from client import consumer_protocol

    hostile, _ = _partitions_of_one_topic(32_767, 4_000)
    with pytest.raises(ValueError, match="a topic name of 32767 characters"):
        consumer_protocol.subscription(hostile)
    legit, _ = _partitions_of_one_topic(249, 10)
    assert len(consumer_protocol.subscription(legit).owned_partitions) == 10


def test_an_assignment_counts_its_partitions_as_decoded_in_a_description(coord: GroupCoordinator) -> None:
    # A leader may hand a member any assignment (SyncGroup does not read it); describing the group decoded it
    # whole, counted as twice its bytes: 60,000 partitions of a 249-byte topic name (240 KB) decoded to 19 MB.
    _, assignment = _partitions_of_one_topic(249, 60_000)
    g = _group_with_offsets(coord, "handed", "big", 0)
    g.state, g.protocol_type, g.protocol_name, g.generation_id, g.leader_id = (
        GroupState.STABLE, "consumer", "range", 1, "m")
    g.members["m"] = Member("m", "c", "h", 10_000, 10_000, [("range", _subscription(["big"]))], 0,
                            assignment=assignment)
    bound = 4 << 20
    # Refused as the partitions are counted, before they are built (the decoder's budget).
    refused, counted = coord.describe_group("handed", include_offsets=False, max_bytes=bound)
    assert refused.error_code == ErrorCode.INVALID_REQUEST and counted == 0, refused
    described, size = coord.describe_group("handed", include_offsets=False)  # within the default bound: shown
    assert described.error_code == ErrorCode.NONE and len(described.members[0].assigned_partitions) == 60_000
    assert size >= 60_000 * 249, size


def test_a_large_leader_answer_keeps_the_metadata_apart_and_is_held_until_written() -> None:
    # A leader may rejoin while its group waits for its SyncGroup and is answered again at once, with every
    # member's metadata: 64 members of 1 MiB made each 10 KB JoinGroup build 64 MiB on the event loop, held until
    # written, from as many connections as did not read them (audit). Such an answer now keeps the metadata apart
    # from the message (the bytes the coordinator holds) and is held against the answers being built until
    # written; past that bound it is refused, retriably.
    import asyncio

    from broker.group_coordinator import DESCRIBE_INFLIGHT_MAX_BYTES
    from broker.group_service import JOIN_ANSWER_ON_LOOP_MAX_BYTES, JoinAnswer

    c, now = _coordinator()
    servicer = GroupCoordinatorServicer(c)
    metadata = group_pb2.ConsumerSubscription(topics=["t"], user_data=b"u" * 200_000).SerializeToString()
    loop = asyncio.new_event_loop()
    try:
        joins = [_join_static(c, "big-join", f"i{i}", metadata) for i in range(3)]
        now[0] += 60_000
        c.tick()
        assert c._groups["big-join"].state == GroupState.COMPLETING_REBALANCE, c._groups["big-join"].state
        answers = [j[0] for j in joins]
        [leader] = [i for i, a in enumerate(answers) if a.member_id == a.leader]
        ended: list[Callable[..., Any]] = []

        class Context:  # what the group servicer reads of a call's context, and its end
            def peer(self) -> str:
                return "ipv4:10.0.0.7:4000"

            def time_remaining(self) -> float:
                return 30.0

            def auth_context(self) -> dict[str, Any]:
                return {}

            def invocation_metadata(self) -> tuple[Any, ...]:
                return ()

            def add_done_callback(self, cb: Callable[..., Any]) -> None:
                ended.append(cb)

        def rejoin() -> Any:
            request = group_pb2.JoinGroupRequest(
                group_id="big-join", client_id="c", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                member_id=answers[leader].member_id, group_instance_id=f"i{leader}", protocol_type="consumer",
                protocols=[group_pb2.GroupProtocol(name="range", metadata=metadata)])
            return loop.run_until_complete(servicer.JoinGroup(request, Context()))

        answer = rejoin()
        assert isinstance(answer, JoinAnswer) and [answer.values.get(i) for i in range(3)] == [metadata] * 3 and \
            not any(m.metadata for m in answer.message.members), "the members' metadata copied into the message"
        out = answer.to_message()
        assert out.error_code == ErrorCode.NONE and len(out.members) == 3, out.error_message
        size = sum(len(m.member_id) + len(m.metadata) + len(m.client_id) + len(m.group_instance_id)
                   for m in out.members)
        assert size > JOIN_ANSWER_ON_LOOP_MAX_BYTES and c._describing_bytes == size, (size, c._describing_bytes)
        assert c.reserve_describe(DESCRIBE_INFLIGHT_MAX_BYTES - size - 1000)  # other answers being built
        refused = rejoin()
        assert refused.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS and not refused.members, refused
        c.release_describe(DESCRIBE_INFLIGHT_MAX_BYTES - size - 1000)
        assert len(ended) == 1 and c._describing_bytes == size
        ended[0]()  # the first answer written out: its bytes are given back, on the loop
        loop.run_until_complete(asyncio.sleep(0))
        assert c._describing_bytes == 0
    finally:
        loop.close()
        c._loader.shutdown()


async def test_a_long_leader_answer_reaches_grpc_joined_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # gRPC serializes a handler's answer on the event loop, and protobuf took 190-220 ms there for a leader's answer
    # of 64 members of 1 MiB, with the interpreter lock held (a worker thread did not help). Served by add_to_server,
    # a long answer's metadata stays apart from the message and its bytes are joined on the group pool (bytes.join
    # lets go of the lock), a short one is serialized on the loop. Through a real gRPC server and client.
    import threading

    import grpc

    from broker.bytes_apart import JOIN_ON_LOOP_MAX_BYTES
    from broker.group_service import JoinAnswer, add_to_server
    from proto import group_pb2_grpc

    joined: list[tuple[str, int]] = []
    to_bytes = JoinAnswer.to_bytes

    def recorded(self: JoinAnswer) -> bytes:
        joined.append((threading.current_thread().name, self.values_bytes()))
        return to_bytes(self)

    monkeypatch.setattr(JoinAnswer, "to_bytes", recorded)
    c, now = _coordinator()
    servicer = GroupCoordinatorServicer(c)
    server = grpc.aio.server()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    loop_thread = threading.current_thread().name
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.max_receive_message_length", 64 << 20)]) as channel:
            stub = group_pb2_grpc.GroupCoordinatorServiceStub(channel)
            for group, user_data in (("small-join", b"u" * 10), ("mid-join", b"u" * 200_000),
                                     ("big-join", b"u" * 400_000)):
                metadata = group_pb2.ConsumerSubscription(topics=["t"], user_data=user_data).SerializeToString()
                joins = [_join_static(c, group, f"i{i}", metadata) for i in range(3)]
                now[0] += 60_000
                c.tick()
                [(i, leader)] = [(i, j[0]) for i, j in enumerate(joins) if j[0].member_id == j[0].leader]
                joined.clear()
                out = await stub.JoinGroup(group_pb2.JoinGroupRequest(
                    group_id=group, client_id="c", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                    member_id=leader.member_id, group_instance_id=f"i{i}", protocol_type="consumer",
                    protocols=[group_pb2.GroupProtocol(name="range", metadata=metadata)]))
                assert out.error_code == ErrorCode.NONE and [m.metadata for m in out.members] == [metadata] * 3, \
                    (group, out.error_message)
                assert sorted(m.group_instance_id for m in out.members) == ["i0", "i1", "i2"]
                size = 3 * len(metadata)
                if group == "small-join":  # the message, serialized by protobuf
                    assert joined == [], joined
                elif size <= JOIN_ON_LOOP_MAX_BYTES:  # metadata apart, joined by the serializer on the loop
                    assert joined == [(loop_thread, size)], joined
                else:  # joined on the group pool
                    assert len(joined) == 1 and joined[0][0] != loop_thread and joined[0][1] == size, joined
    finally:
        await server.stop(None)
        c._loader.shutdown()
