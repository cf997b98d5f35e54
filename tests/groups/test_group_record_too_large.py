"""A generation whose group record is too large to store fails its members' SyncGroup clearly.

Found by a probe on a real cluster: 40 consumers with 30 KB of subscription each (each far under
``group.member.metadata.max.bytes``) make a group record of 1.2 MB, over ``__consumer_offsets``'s
``max.message.bytes``. Every SyncGroup was answered REBALANCE_IN_PROGRESS, so the members rejoined
and built the same record again, for good, while DescribeGroups said Stable. Now, as Kafka's
storeGroup answers a record too large, the members get UNKNOWN_SERVER_ERROR naming the cause (not
retriable: a consumer's poll() raises it), and the group is not Stable on an assignment nobody got.

A real GroupCoordinator; its ``__consumer_offsets`` appends go to a stand-in that refuses a batch
over its limit with the error the partition's Log raises (``storage.log.append_as_leader``)."""

from __future__ import annotations

import concurrent.futures
import gc
import tracemalloc
import types
from collections.abc import Iterator
from typing import Any

import pytest

from broker.group_coordinator import CoordinatorConfig, GroupCoordinator, _PartitionLoad
from broker.group_state import GroupState, SyncResult
from proto import errors, group_pb2
from proto.common_pb2 import ErrorCode

LIMIT = 64 * 1024  # the stand-in __consumer_offsets partitions' max.message.bytes
SUBSCRIPTION = 30_000  # bytes of protocol metadata a member sends


class LimitedOffsetsTopic:
    """``append_records`` as the leader of ``__consumer_offsets``: done at once, or refused when too large."""

    def __init__(self) -> None:
        self.appended = 0

    def append_records(self, topic: str, partition: int, batch: bytes, acks: int, timeout_ms: int) -> Any:
        if len(batch) > LIMIT:
            raise errors.MessageTooLargeError(
                f"batch at position 0 is {len(batch)} bytes, above the limit of {LIMIT}")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(types.SimpleNamespace(base_offset=self.appended))
        self.appended += 1
        return fut


@pytest.fixture
def coordinator() -> Iterator[tuple[GroupCoordinator, list[int]]]:
    now = [1_000_000]
    c = GroupCoordinator(node_id=1, replica_manager=LimitedOffsetsTopic(), metadata_cache=None,
                         config=CoordinatorConfig(), clock_ms=lambda: now[0])
    for p in range(c.config.offsets_topic_num_partitions):
        c._partitions[p] = _PartitionLoad(leader_epoch=0, loaded=True)
    try:
        yield c, now
    finally:
        c._loader.shutdown()


def _generation(c: GroupCoordinator, now: list[int], group: str, members: int) -> list[SyncResult]:
    """``members`` static members join ``group`` and sync their first generation; each one's answer."""
    joined: list[Any] = []
    for i in range(members):
        c.start_join(group_pb2.JoinGroupRequest(
            group_id=group, client_id="c", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
            group_instance_id=f"i{i}", protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=bytes(SUBSCRIPTION))]), joined.append)
    now[0] += 60_000  # past the initial rebalance delay
    c.tick()
    assert len(joined) == members and all(j.error_code == ErrorCode.NONE for j in joined), joined
    leader = next(j for j in joined if j.leader == j.member_id)
    answers: list[SyncResult] = []
    order = [leader] + [j for j in joined if j is not leader]  # the leader's sync completes the others'
    pending: list[tuple[group_pb2.SyncGroupRequest, list[SyncResult]]] = []
    for j in order:
        req = group_pb2.SyncGroupRequest(
            group_id=group, generation_id=j.generation_id, member_id=j.member_id,
            assignments=[group_pb2.SyncGroupAssignment(member_id=m.member_id, assignment=b"a")
                         for m in (joined if j is leader else [])])
        got: list[SyncResult] = []
        immediate = c.start_sync(req, got.append)
        if immediate is not None:
            got.append(immediate)
        pending.append((req, got))
    for req, got in pending:
        assert len(got) == 1, got
        answers.append(c.finish_sync(req, got[0]))
    return answers


def test_a_generation_too_large_to_store_is_refused_clearly_and_the_group_is_not_stable(
        coordinator: tuple[GroupCoordinator, list[int]]) -> None:
    c, now = coordinator
    answers = _generation(c, now, "big", members=3)  # 3 x 30 KB: a record over 64 KiB
    assert [a.error_code for a in answers] == [ErrorCode.UNKNOWN_SERVER_ERROR] * 3, answers
    assert all("too large to store in __consumer_offsets" in a.error_message
               and f"above the limit of {LIMIT}" in a.error_message for a in answers), answers[0].error_message
    assert not errors.error_for(ErrorCode.UNKNOWN_SERVER_ERROR, "").retriable
    assert c._groups["big"].state == GroupState.PREPARING_REBALANCE, c._groups["big"].state


def test_a_generation_that_fits_is_stored_and_stable(coordinator: tuple[GroupCoordinator, list[int]]) -> None:
    c, now = coordinator
    answers = _generation(c, now, "fits", members=2)  # 2 x 30 KB: under 64 KiB
    assert [a.error_code for a in answers] == [ErrorCode.NONE] * 2, answers
    assert c._groups["fits"].state == GroupState.STABLE


def test_a_failed_generation_keeps_no_copy_of_its_record(coordinator: tuple[GroupCoordinator, list[int]]) -> None:
    """The failed write is kept until the group's next generation (its members' SyncGroups read it),
    and it held the traceback of the refused append: every frame's locals, the record and its batch
    among them. On a real cluster 255 one-member groups of 1 MiB, each refused, took a coordinator
    from 78 MB to 1,084 MB, four times what its group.coordinator.metadata.max.bytes counted."""
    c, now = coordinator
    groups, metadata = 20, 200_000

    def hold() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        before = hold()
        for i in range(groups):
            joined: list[Any] = []
            c.start_join(group_pb2.JoinGroupRequest(
                group_id=f"g{i}", client_id="c", session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                group_instance_id="only", protocol_type="consumer",
                protocols=[group_pb2.GroupProtocol(name="range", metadata=bytes(metadata))]), joined.append)
            now[0] += 60_000
            c.tick()
            (j,) = joined
            req = group_pb2.SyncGroupRequest(group_id=f"g{i}", generation_id=j.generation_id, member_id=j.member_id,
                                             assignments=[group_pb2.SyncGroupAssignment(member_id=j.member_id,
                                                                                        assignment=b"a")])
            got: list[SyncResult] = []
            immediate = c.start_sync(req, got.append)
            answer = c.finish_sync(req, immediate or got[0])
            assert answer.error_code == ErrorCode.UNKNOWN_SERVER_ERROR, answer
        held = hold() - before
    finally:
        tracemalloc.stop()
    # The members' metadata is what a group must hold (about 4 MB here); each refused record and
    # batch kept would add two more copies of it.
    assert held < 1.5 * groups * metadata, f"{held} bytes held for {groups * metadata} bytes of members' metadata"
