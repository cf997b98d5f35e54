"""WatchMetadata does no O(partitions) work under the metadata state lock (audit: a watcher's first
snapshot built a record of every partition holding it, about 1.5 s at 200,000 partitions, and a restart
of every broker queued one per broker while Raft applies, heartbeats and every controller call waited).

The controller's gRPC service streams to a watcher over a real MetadataState of 20,000 partitions, built
by applying records, behind the state lock the service reads it under (``raft.read``). As in
test_describe_cluster_lock.py every partition notes when a thread holding that lock reads it: the tests
count the distinct partitions one hold reads, never time. Each update is also checked against the
state as a broker's metadata cache would apply it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_describe_cluster_lock import BROKERS, PARTITIONS, TOPICS, LockedState, watched_cluster

from broker.metadata_cache import MetadataCache
from metadata_quorum import commands as c
from metadata_quorum.service import ControllerService
from metadata_quorum.state import MetadataState
from proto import controller_pb2 as pb
from proto.errors import ErrorCode


class LockedRaft(LockedState):
    """What the service reads through: MetadataRaft's ``read``, ``version`` and ``wait_for_version_beyond``."""

    @property
    def version(self) -> int:
        return self.state.version

    def wait_for_version_beyond(self, version: int, timeout_s: float) -> int:
        return self.state.version  # never waits: the tests change the state between messages themselves


class Active:
    def is_active(self) -> bool:
        return True


class OpenContext:
    """A plaintext caller on loopback (a node of a single-host cluster), as in test_watch_limits.py."""

    def is_active(self) -> bool:
        return True

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def auth_context(self) -> dict[str, Any]:
        return {}

    def invocation_metadata(self) -> tuple[Any, ...]:
        return ()


@pytest.fixture(scope="module")
def locked() -> Iterator[LockedRaft]:
    def security_and_configs(ls: LockedRaft) -> None:
        ls.apply(c.CreateAcls([["TOPIC", "t00", "LITERAL", "User:alice", "*", "READ", "ALLOW"]]))
        ls.apply(c.AlterClientQuota("User:alice", {"producer_byte_rate": 1000.0}))
        ls.apply(c.AlterClusterConfigs({"unclean.leader.election.enable": "false"}, []))

    yield from watched_cluster(LockedRaft(), lambda t: {"retention.ms": str(1000 + t)}, security_and_configs)


def service(ls: LockedRaft) -> ControllerService:
    return ControllerService(Active(), ls, lambda: pb.ControllerRedirect(), cluster_id="lock-check",  # type: ignore[arg-type]
                             voter_ids={}, default_timeout_s=5.0)


def watch(svc: ControllerService, since: int, broker_id: int = 1) -> Iterator[pb.MetadataUpdate]:
    return svc.WatchMetadata(pb.WatchMetadataRequest(broker_id=broker_id, since_version=since), OpenContext())


def assert_follows(cache: MetadataCache, s: MetadataState) -> None:
    """The broker's cache holds exactly the state (brokers, topics, partitions, security, configs)."""
    assert cache.version == s.version and cache.controller_id == s.active_controller_id
    assert {b.node_id: (b.broker_epoch, b.fenced, b.in_controlled_shutdown, b.endpoints) for b in cache.brokers()} \
        == {b.node_id: (b.broker_epoch, b.fenced, b.in_controlled_shutdown, tuple(b.endpoints))
            for b in s.brokers.values()}
    assert {t.topic_id: (t.name, t.configs, t.partition_count) for t in cache._topics_by_id.values()} == \
        {t.topic_id: (t.name, t.configs, len(t.partitions)) for t in s.topics.values()}
    assert {k: (v.topic_id, v.replicas, v.isr, v.leader, v.leader_epoch, v.partition_epoch)
            for k, v in cache._partitions.items()} == {
        (t.name, i): (t.topic_id, tuple(p.replicas), tuple(p.isr), p.leader, p.leader_epoch, p.partition_epoch)
        for t in s.topics.values() for i, p in enumerate(t.partitions)}
    assert cache._acl_index.bindings == tuple(sorted(s.acls))
    assert cache._quotas == s.quotas and cache._credentials == s.scram
    assert cache.cluster_configs() == s.cluster_configs


def test_a_watchers_first_snapshot_reads_a_slice_of_the_partitions_per_hold(locked: LockedRaft) -> None:
    svc = service(locked)
    locked.holds.clear()
    first = next(watch(svc, 0))
    assert first.error_code == ErrorCode.NONE and first.is_snapshot
    assert len(first.partitions) == PARTITIONS and len(first.topics) == TOPICS and len(first.brokers) == BROKERS
    # Old: one hold read all 20,000. Now no hold reads more than a tenth of them.
    assert locked.most_read_in_one_hold() <= PARTITIONS // 10
    cache = MetadataCache(1)
    cache.apply(first)
    assert_follows(cache, locked.state)


def test_every_broker_restarting_at_once_gets_a_current_snapshot_read_in_slices(locked: LockedRaft) -> None:
    """Each watcher that needs a snapshot gets one as of when it asked, read in slices: never one read
    earlier for another broker. A broker deletes the logs of partitions its snapshot does not assign to it,
    so an older snapshot (a topic created since missing from it) made a restarted broker delete that
    topic's logs (a shared snapshot did, for 60 s after each was read)."""
    svc = service(locked)
    next(watch(svc, 0, 1))
    for b in range(2, BROKERS + 1):
        locked.apply(c.CreateTopic(f"made-before-broker-{b}-restarts", f"id-made-before-{b}", {}, [[b]]))
        locked.holds.clear()
        snapshot = next(watch(svc, 0, b))
        assert snapshot.is_snapshot and snapshot.version == locked.state.version
        assert f"made-before-broker-{b}-restarts" in {t.name for t in snapshot.topics}
        assert locked.most_read_in_one_hold() <= PARTITIONS // 10
        cache = MetadataCache(b)
        cache.apply(snapshot)
        assert_follows(cache, locked.state)


def test_a_delta_of_many_partitions_is_read_in_slices_too(locked: LockedRaft) -> None:
    """A broker reconnecting after a fencing moved thousands of leaderships: the changes since its
    version (still in the changelog) are read a slice per hold, and bring its cache to the state."""
    svc = service(locked)
    cache = MetadataCache(2)
    cache.apply(next(watch(svc, 0, 2)))
    before = locked.state.version
    epoch = locked.state.brokers[1].broker_epoch
    locked.apply(c.FenceBroker(1, epoch))  # broker 1 leaves 12,000 ISRs and gives up its leaderships
    try:
        locked.holds.clear()
        update = next(watch(svc, before, 2))
        assert not update.is_snapshot and len(update.partitions) >= PARTITIONS // 2
        assert locked.most_read_in_one_hold() <= PARTITIONS // 10
        cache.apply(update)
        assert_follows(cache, locked.state)
    finally:
        epoch = locked.apply(c.RegisterBroker(1, "inc-1-again", [["BROKER", "127.0.0.1", 9001]], "")).value
        locked.apply(c.UnfenceBroker(1, epoch))


def test_a_followed_stream_reads_only_what_changed(locked: LockedRaft) -> None:
    svc = service(locked)
    stream = watch(svc, 0, 3)
    cache = MetadataCache(3)
    cache.apply(next(stream))
    for round_ in range(3):
        for i in range(10):  # ten partitions change (and a topic's configs, a quota)
            name, index = f"t{(i + round_) % TOPICS:02d}", 11 * i + round_
            p = locked.state.topics[name].partitions[index]
            isr = [p.leader] if len(p.isr) > 1 else p.isr + [r for r in p.replicas if r not in p.isr][:1]
            result = locked.apply(c.ChangePartition([c.PartitionChangeItem(name, index, p.partition_epoch,
                                                                            new_isr=isr)]))
            assert result.value[0].error_code == ErrorCode.NONE, result.value[0]
        t = locked.state.topics[f"t{round_:02d}"]
        locked.apply(c.AlterConfigs(t.name, t.topic_id, {"retention.ms": str(5000 + round_)}))
        locked.apply(c.AlterClientQuota("User:alice", {"producer_byte_rate": 2000.0 + round_}))
        locked.holds.clear()
        update = next(stream)
        assert not update.is_snapshot and len(update.partitions) == 10 and len(update.topics) == 1
        assert locked.most_read_in_one_hold() <= 10
        cache.apply(update)
        assert_follows(cache, locked.state)
