"""A group of Kafka's consumer protocol (KIP-848) written down in ``__consumer_offsets`` and taken over by another
coordinator: members keep their epochs and partitions (no rebalance), a member that left or a group left empty
stays gone, and a member in the middle of giving partitions up goes on from there. Real logs on disk, a real
load (GroupCoordinator._load_partition) by a second coordinator."""

from __future__ import annotations

import concurrent.futures
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from topics_cache import TopicsCache

from broker import consumer_groups as cg
from broker import group_records as records
from broker.group_coordinator import CoordinatorConfig, GroupCoordinator, _PartitionLoad
from proto import errors
from proto.common_pb2 import ErrorCode
from storage.log_manager import LogManager


class Disk:
    """__consumer_offsets-0 on a real log: what one coordinator appends, the next one loads."""

    def __init__(self, path: Path) -> None:
        self.lm = LogManager([path], on_dir_failure=lambda d, e: None)
        self.log = self.lm.get_or_create_log(records.OFFSETS_TOPIC, 0, topic_id="T", overrides={})
        self.fail = False

    def append_records(self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self.fail:
            fut.set_exception(errors.error_for(ErrorCode.NOT_ENOUGH_REPLICAS, "the ISR is short"))
            return fut
        self.log.append_as_leader(batch, 0)
        fut.set_result(types.SimpleNamespace(base_offset=self.log.log_end_offset - 1))
        return fut

    def partition(self, topic: str, partition: int) -> Any:
        return types.SimpleNamespace(is_leader=True, log=self.log) if (topic, partition) == (records.OFFSETS_TOPIC, 0) \
            else None

    @property
    def log_manager(self) -> LogManager:
        return self.lm


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path / "data")
    try:
        yield d
    finally:
        d.lm.shutdown()


NOW = [1_000_000]


def coordinator(disk: Disk, epoch: int, topics: dict[str, int] | None = None) -> GroupCoordinator:
    """A coordinator that has loaded __consumer_offsets-0 at leader epoch ``epoch``."""
    c = GroupCoordinator(node_id=epoch, replica_manager=disk, metadata_cache=TopicsCache(topics or {"t": 4, "u": 2}),
                         config=CoordinatorConfig(offsets_topic_num_partitions=1), clock_ms=lambda: NOW[0])
    c._partitions[0] = _PartitionLoad(leader_epoch=epoch)
    c._load_partition(0, epoch)
    assert c._partitions[0].loaded
    return c


class Member:
    """A consumer that owns what it was last given (as librdkafka does)."""

    def __init__(self, member_id: str, topics: list[str] | None = None, regex: str | None = None,
                 instance: str | None = None) -> None:
        self.member_id, self.topics, self.regex, self.instance = member_id, topics or [], regex, instance
        self.epoch = 0
        self.owned: dict[uuid.UUID, frozenset[int]] = {}

    def beat(self, c: GroupCoordinator, *, full: bool = False) -> cg.HeartbeatAnswer:
        joining = self.epoch == 0
        answer = c.consumer_group_heartbeat(cg.Heartbeat(
            "g", self.member_id, self.epoch, instance_id=self.instance,
            rebalance_timeout_ms=30_000 if joining or full else -1,
            subscribed_topic_names=self.topics if joining or full else None,
            subscribed_topic_regex=self.regex if joining or full else None,
            owned=[(t, sorted(p)) for t, p in self.owned.items()], client_host="10.0.0.1"))
        self.epoch = answer.member_epoch
        if answer.assignment is not None:
            self.owned = {t: p for t, p in answer.assignment.items() if p}
        return answer

    def count(self) -> int:
        return sum(len(p) for p in self.owned.values())


def settle(c: GroupCoordinator, members: list[Member], rounds: int = 4) -> None:
    for _ in range(rounds):
        for m in members:
            m.beat(c)


def test_a_new_coordinator_takes_the_group_over_without_a_rebalance(disk: Disk) -> None:
    first = coordinator(disk, 1)
    a, b = Member("a", ["t", "u"]), Member("b", ["t", "u"], instance="i-b")
    settle(first, [a, b])
    epochs, owned = (a.epoch, b.epoch), (dict(a.owned), dict(b.owned))
    group = first.consumer_groups.groups["g"]
    assert a.count() + b.count() == 6 and group.state() == "Stable"
    before = (group.epoch, group.assignment_epoch, {m: dict(x.assigned) for m, x in group.members.items()})
    first._loader.shutdown()

    second = coordinator(disk, 2)  # the partition moved: the new leader loads it
    try:
        taken = second.consumer_groups.groups["g"]
        assert (taken.epoch, taken.assignment_epoch, {m: dict(x.assigned) for m, x in taken.members.items()}) == before
        assert taken.static == {"i-b": "b"} and taken.state() == "Stable"
        for m in (a, b):  # each goes on at its epoch with what it owns: no fencing, nothing handed out again
            answer = m.beat(second)
            assert answer.member_epoch in epochs and answer.assignment is None, answer
        assert (a.epoch, b.epoch) == epochs and (a.owned, b.owned) == owned
        assert second.consumer_groups.groups["g"].epoch == before[0]
        # ... and rebalances from there when a member joins.
        c = Member("c", ["t", "u"])
        settle(second, [a, b, c], rounds=6)
        assert sorted(m.count() for m in (a, b, c)) == [2, 2, 2]
    finally:
        second._loader.shutdown()


def test_a_member_that_left_and_a_group_left_empty_stay_gone(disk: Disk) -> None:
    first = coordinator(disk, 1)
    a, b = Member("a", ["t"]), Member("b", ["t"])
    settle(first, [a, b])
    first.consumer_group_heartbeat(cg.Heartbeat("g", "b", -1))
    settle(first, [a])
    first._loader.shutdown()
    second = coordinator(disk, 2)
    assert set(second.consumer_groups.groups["g"].members) == {"a"}
    second.consumer_group_heartbeat(cg.Heartbeat("g", "a", -1))
    assert "g" not in second.consumer_groups.groups
    second._loader.shutdown()
    third = coordinator(disk, 3)
    try:
        assert third.consumer_groups.groups == {}
        with pytest.raises(cg.HeartbeatError) as refused:  # a is no member any more: it rejoins
            third.consumer_group_heartbeat(cg.Heartbeat("g", "a", a.epoch, owned=[]))
        assert refused.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    finally:
        third._loader.shutdown()


def test_a_member_giving_partitions_up_goes_on_from_there_on_the_new_coordinator(disk: Disk) -> None:
    first = coordinator(disk, 1)
    a = Member("a", ["t"])
    settle(first, [a])
    assert a.count() == 4
    b = Member("b", ["t"])
    b.beat(first)  # b joins: a is told to give two partitions up, b waits for them
    told = a.beat(first)
    assert told.assignment is not None and sum(len(p) for p in told.assignment.values()) == 2
    first._loader.shutdown()
    second = coordinator(disk, 2)
    try:
        member = second.consumer_groups.groups["g"].members["a"]
        assert member.state == cg.UNREVOKED and sum(len(p) for p in member.revoking.values()) == 2
        settle(second, [a, b])
        assert (a.count(), b.count()) == (2, 2)
        assert not set((t, p) for t, ps in a.owned.items() for p in ps) & \
            set((t, p) for t, ps in b.owned.items() for p in ps)
    finally:
        second._loader.shutdown()


def test_a_regex_members_subscription_is_taken_over(disk: Disk) -> None:
    topics = {"logs-a": 2, "logs-b": 1, "other": 3}
    first = coordinator(disk, 1, topics)
    a = Member("a", regex="logs-.*")
    settle(first, [a])
    assert a.count() == 3
    first._loader.shutdown()
    second = coordinator(disk, 2, topics)
    try:
        group = second.consumer_groups.groups["g"]
        assert group.members["a"].regex == "logs-.*" and group.regexes == {"logs-.*": 1}
        epoch = group.epoch
        answer = a.beat(second)
        assert answer.assignment is None and a.count() == 3 and group.epoch == epoch
    finally:
        second._loader.shutdown()


def test_a_heartbeat_whose_state_was_not_written_is_answered_an_error(disk: Disk) -> None:
    from broker.group_coordinator import CoordinatorError

    c = coordinator(disk, 1)
    try:
        a = Member("a", ["t"])
        disk.fail = True
        with pytest.raises(CoordinatorError) as refused:
            a.beat(c)
        assert refused.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        disk.fail = False
        a.beat(c)  # librdkafka retries its join
        assert a.epoch > 0
    finally:
        c._loader.shutdown()


def test_a_topic_grown_while_the_partition_moved_is_assigned_by_the_new_coordinator(disk: Disk) -> None:
    first = coordinator(disk, 1, {"t": 4})
    a = Member("a", ["t"])
    settle(first, [a])
    epoch = first.consumer_groups.groups["g"].epoch
    first._loader.shutdown()
    second = coordinator(disk, 2, {"t": 6})  # two partitions added meanwhile
    try:
        settle(second, [a])
        assert a.count() == 6 and second.consumer_groups.groups["g"].epoch == epoch + 1
    finally:
        second._loader.shutdown()


def test_a_member_record_round_trips() -> None:
    t1, t2 = uuid.UUID(int=7), uuid.uuid4()
    member = cg.Member("m", instance_id="i", rack_id=None, client_id="c", client_host="10.0.0.9",
                       rebalance_timeout_ms=30_000, topic_names=frozenset({"x"}), regex="y.*",
                       subscribed=frozenset({"x", "y1"}), assignor=None, epoch=7, previous_epoch=5,
                       state=cg.UNREVOKED, assigned={t1: frozenset({0, 2})}, revoking={t2: frozenset({1})})
    target = {t1: frozenset({0, 2, 3})}
    parsed = records.parse_record(records.consumer_member_key("g", "m"),
                                  records.encode_consumer_member(member, target), 0)
    assert isinstance(parsed, records.ConsumerMemberRecord) and (parsed.group_id, parsed.member_id) == ("g", "m")
    back, back_target = records.restore_consumer_member("m", parsed.value)
    assert back == member and back_target == target
    tombstone = records.parse_record(records.consumer_member_key("g", "m"), None, 1)
    assert tombstone == records.ConsumerMemberRecord("g", "m", None)
