"""DescribeCluster, and the per-broker figures the controller reads, do no O(partitions) work under the
state lock (audit: DescribeCluster built a record for each partition holding it, about 1.2 s at 200,000
partitions, while Raft applies, heartbeats and every other controller call waited).

A real MetadataState of 20,000 partitions, built by applying records, behind the state lock the
controller reads it under (``raft.read``). Every partition is an instance that notes when it is read
by a thread holding that lock: each test counts the distinct partitions one hold reads, never time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from metadata_quorum import commands as c
from metadata_quorum import state as state_module
from metadata_quorum.controller import ControllerConfig, QuorumController
from metadata_quorum.state import MetadataState, PartitionState

BROKERS = 5
TOPICS = 20
PER_TOPIC = 1000
PARTITIONS = TOPICS * PER_TOPIC


class LockedState:
    """What the controller reads through (MetadataRaft's ``read``): the state under an RLock; per hold,
    the distinct partitions read by the thread holding it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.state = MetadataState()
        self.counting = False
        self.seen: set[int] = set()
        self.holds: list[int] = []  # partitions read, per ``read``

    def read(self, fn: Callable[[MetadataState], Any]) -> Any:
        with self.lock:
            self.seen = set()
            self.counting = True
            try:
                return fn(self.state)
            finally:
                self.counting = False
                self.holds.append(len(self.seen))

    def apply(self, cmd: Any) -> Any:
        with self.lock:
            result = self.state.apply(cmd)
        assert result.ok, result
        return result

    def most_read_in_one_hold(self) -> int:
        most = max(self.holds, default=0)
        self.holds.clear()
        return most


WATCHED: list[LockedState] = []
LS = TypeVar("LS", bound=LockedState)


class WatchedPartition(PartitionState):
    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        for watched in WATCHED:
            if watched.counting and watched.lock._is_owned():  # type: ignore[attr-defined]
                watched.seen.add(id(self))
        return object.__getattribute__(self, name)


def watched_cluster(ls: LS, topic_configs: Callable[[int], dict[str, str]] = lambda t: {},
                    then: Callable[[LS], None] = lambda ls: None) -> Iterator[LS]:
    """``ls`` holding BROKERS live brokers and TOPICS topics of PER_TOPIC RF-3 partitions (topic ``t`` with
    ``topic_configs(t)``), every partition a WatchedPartition, ``then`` applied last; for a module fixture."""
    patch = pytest.MonkeyPatch()
    patch.setattr(state_module, "PartitionState", WatchedPartition)  # every partition the state makes
    WATCHED.append(ls)
    try:
        ls.apply(c.ActivateController(100, 1))
        for b in range(1, BROKERS + 1):
            epoch = ls.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "127.0.0.1", 9000 + b]], "")).value
            ls.apply(c.UnfenceBroker(b, epoch))
        for t in range(TOPICS):
            ls.apply(c.CreateTopic(f"t{t:02d}", f"id-{t}", topic_configs(t), [
                [(t + p + k) % BROKERS + 1 for k in range(3)] for p in range(PER_TOPIC)]))
        then(ls)
        assert all(type(p) is WatchedPartition for t in ls.state.topics.values() for p in t.partitions)
        yield ls
    finally:
        WATCHED.remove(ls)
        patch.undo()


@pytest.fixture(scope="module")
def locked() -> Iterator[LockedState]:
    yield from watched_cluster(LockedState())


def change_isrs(ls: LockedState, count: int) -> list[tuple[str, int]]:
    """Shrink the ISR of ``count`` partitions (one command each): [(topic, index)]."""
    changed = []
    for i in range(count):
        name, index = f"t{i % TOPICS:02d}", 7 * i
        p = ls.state.topics[name].partitions[index]
        ls.apply(c.ChangePartition([c.PartitionChangeItem(name, index, p.partition_epoch,
                                                          new_isr=[p.leader] + [r for r in p.isr if r != p.leader][:1])]))
        changed.append((name, index))
    return changed


def test_describe_cluster_reads_only_what_changed_under_the_state_lock(locked: LockedState) -> None:
    controller = QuorumController(ControllerConfig(1, "lock-check"), locked)  # type: ignore[arg-type]
    locked.holds.clear()
    first = controller.describe_cluster()
    assert len(first.partitions) == PARTITIONS and len(first.topics) == TOPICS and len(first.brokers) == BROKERS
    # A new controller loads everything, but in slices: no one hold reads more than a tenth of it.
    assert locked.most_read_in_one_hold() <= PARTITIONS // 10

    # Nothing changed: no partition read under the lock at all.
    again = controller.describe_cluster()
    assert locked.most_read_in_one_hold() == 0
    assert again == first

    # Ten partitions changed: those ten are read, not the 20,000.
    changed = change_isrs(locked, 10)
    after = controller.describe_cluster()
    assert locked.most_read_in_one_hold() <= 10
    assert after.metadata_version == locked.state.version
    by_key = {(p.topic, p.partition): p for p in after.partitions}
    for name, index in changed:
        now = locked.state.topics[name].partitions[index]
        assert list(by_key[(name, index)].isr) == now.isr and by_key[(name, index)].partition_epoch == \
            now.partition_epoch


def test_the_per_broker_figures_read_no_partition_under_the_state_lock(locked: LockedState) -> None:
    controller = QuorumController(ControllerConfig(1, "lock-check"), locked)  # type: ignore[arg-type]
    s = locked.state
    # Three partitions being moved: the controller's tick lists them on every tick (completing moves).
    for i in range(3):
        name = f"t{i:02d}"
        p = s.topics[name].partitions[0]
        locked.apply(c.AlterReassignment(name, 0, p.partition_epoch, [4, 5, 1] if 1 not in p.replicas[:1] else
                                         [2, 3, 4]))
    locked.holds.clear()
    leads = locked.read(lambda st: st.leadership_count(1))  # a heartbeat in controlled shutdown
    offline = locked.read(lambda st: st.offline_partitions())  # the node's stats
    total = locked.read(lambda st: st.partition_count())  # CreateTopics' cluster-wide limit
    loads = locked.read(controller._loads)  # CreateTopics' placement
    moving = locked.read(lambda st: st.reassignments())  # the controller's tick
    assert locked.most_read_in_one_hold() <= 3
    # ... and they are right.
    every = [p for t in s.topics.values() for p in t.partitions]
    assert leads == sum(p.leader == 1 for p in every) > 0
    assert offline == 0 and total == PARTITIONS
    assert [(b.node_id, b.replicas, b.leaders) for b in loads] == [
        (b, sum(b in p.replicas for p in every), sum(p.replicas[0] == b for p in every)) for b in range(1, BROKERS + 1)]
    assert sorted((name, i) for name, i, _ in moving) == [("t00", 0), ("t01", 0), ("t02", 0)]
