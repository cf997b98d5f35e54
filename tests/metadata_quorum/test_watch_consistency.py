"""WatchMetadata's updates read in slices (metadata_quorum/cluster_view.py WatchReader) are exact.

A watcher's snapshot, or the changes since its version, is copied from the state over several short
holds of its lock while Raft keeps applying records in between. Random histories (topics made, grown,
deleted and made again, leader and ISR changes, reassignments, brokers fenced and re-registered,
SCRAM credentials, ACLs, quotas, cluster configs, snapshots restored in place) are applied between
the holds, and:

- each update read in slices equals the one a single hold gives at the version it names (the old
  one-hold ``full_delta`` / ``changes_since``), record for record;
- brokers following the controller's stream (snapshots, deltas, cut-offs and reconnects, a shared
  snapshot) always hold exactly the state as of the version of the last message they applied: none
  misses or applies twice a change.

Pure: no clock, no socket.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_derived_figures import BROKERS, History
from test_watch_lock import Active, OpenContext

from broker.metadata_cache import MetadataCache
from metadata_quorum import cluster_view
from metadata_quorum import commands as c
from metadata_quorum.cluster_view import WatchReader, broker_record, partition_record, topic_record
from metadata_quorum.security_service import salted_credential, security_delta
from metadata_quorum.service import ControllerService
from metadata_quorum.state import MetadataDelta, MetadataState
from proto import controller_pb2 as pb
from proto.errors import ErrorCode

CREDENTIALS = [c.UpsertScramCredential(*salted_credential(user, mechanism, "pw").to_plain())  # type: ignore[arg-type]
               for user in ("u0", "u1") for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")]
ACLS = [["TOPIC", f"t{i}", "LITERAL", f"User:u{i % 2}", "*", op, "ALLOW"] for i in range(3) for op in ("READ", "WRITE")]
QUOTA_ENTITIES = ["User:u0", "User:u1", "<default>"]


class WatchHistory(History):
    """History's random commands, plus security records; notes the state's content at every version.

    ``forward``: as Raft, never back to an older snapshot, and topic ids never reused (the controller makes
    a new UUID per topic), so a version names one content."""

    def __init__(self, seed: int, *, forward: bool) -> None:
        super().__init__(seed)
        self.forward = forward
        self.contents: dict[int, dict[str, Any]] = {}

    def apply(self, cmd: Any) -> None:
        super().apply(cmd)
        if self.forward:
            self.contents.setdefault(self.state.version, content(self.state))

    def step(self) -> str:
        if self.forward:
            self.snapshots.clear()  # "restore_old" needs an earlier snapshot: none
            self.deleted_ids.clear()  # "create" may reuse a deleted topic's id: none
        rng = self.rng
        if rng.random() >= 0.25:
            return super().step()
        action = rng.choice(["scram", "unscram", "acl", "unacl", "quota"])
        if action == "scram":
            self.apply(rng.choice(CREDENTIALS))
        elif action == "unscram":
            self.apply(c.DeleteScramCredential(rng.choice(["u0", "u1"]), rng.choice(["", "SCRAM-SHA-256"])))
        elif action == "acl":
            self.apply(c.CreateAcls(rng.sample(ACLS, rng.randint(1, 2))))
        elif action == "unacl":
            self.apply(c.DeleteAcls([rng.choice(ACLS)]))
        else:
            entity = rng.choice(QUOTA_ENTITIES)
            if rng.random() < 0.3:
                self.apply(c.AlterClientQuota(entity, remove=["producer_byte_rate", "consumer_byte_rate"]))
            else:
                self.apply(c.AlterClientQuota(entity, {rng.choice(["producer_byte_rate", "consumer_byte_rate"]):
                                                       float(rng.randrange(1, 100) * 1000)}))
        return action

    def start(self) -> None:
        for b in BROKERS:
            self.apply(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "h", 9000 + b]], ""))
            self.apply(c.UnfenceBroker(b, self._epoch(b)))
        self.apply(c.ActivateController(100, 1))
        self.term = 1


def content(s: MetadataState) -> dict[str, Any]:
    """Everything a broker follows, normalised."""
    return {
        "controller": s.active_controller_id,
        "brokers": {b.node_id: (b.broker_epoch, b.fenced, b.in_controlled_shutdown, b.rack, tuple(b.endpoints))
                    for b in s.brokers.values()},
        "topics": {t.topic_id: (t.name, dict(t.configs), len(t.partitions)) for t in s.topics.values()},
        "partitions": {(t.topic_id, i): (tuple(p.replicas), tuple(p.isr), p.leader, p.leader_epoch,
                                         p.partition_epoch, tuple(p.adding), tuple(p.removing))
                       for t in s.topics.values() for i, p in enumerate(t.partitions)},
        "credentials": dict(s.scram), "acls": tuple(sorted(s.acls)),
        "quotas": {e: dict(v) for e, v in s.quotas.items()}, "configs": dict(s.cluster_configs),
    }


class Follower:
    """A broker following the stream: its metadata cache, and every partition record whole (the cache
    keeps no reassignment fields)."""

    def __init__(self, node_id: int) -> None:
        self.cache = MetadataCache(node_id)
        self.partitions: dict[tuple[str, int], pb.PartitionRecord] = {}
        self.counts: dict[str, int] = {}

    def apply(self, u: pb.MetadataUpdate) -> None:
        self.cache.apply(u)
        if u.is_snapshot:
            self.partitions, self.counts = {}, {}
        for topic_id in u.deleted_topic_ids:
            self.counts.pop(topic_id, None)
        for t in u.topics:
            self.counts[t.topic_id] = t.partition_count
        self.partitions = {k: p for k, p in self.partitions.items() if k[1] < self.counts.get(k[0], 0)}
        for p in u.partitions:
            if p.topic_id in self.counts:
                self.partitions[(p.topic_id, p.partition)] = p

    def content(self) -> dict[str, Any]:
        cache = self.cache
        assert {(p.topic, p.partition) for p in self.partitions.values()} == set(cache._partitions)
        return {
            "controller": cache.controller_id,
            "brokers": {b.node_id: (b.broker_epoch, b.fenced, b.in_controlled_shutdown, b.rack, b.endpoints)
                        for b in cache.brokers()},
            "topics": {t.topic_id: (t.name, t.configs, t.partition_count) for t in cache._topics_by_id.values()},
            "partitions": {k: (tuple(p.replicas), tuple(p.isr), p.leader, p.leader_epoch, p.partition_epoch,
                               tuple(p.adding_replicas), tuple(p.removing_replicas))
                           for k, p in self.partitions.items()},
            "credentials": dict(cache._credentials), "acls": cache._acl_index.bindings,
            "quotas": dict(cache._quotas), "configs": cache.cluster_configs(),
        }


def one_hold_update(s: MetadataState, delta: MetadataDelta) -> pb.MetadataUpdate:
    """What the service sent before the reader: every record built from the state in one hold."""
    return pb.MetadataUpdate(
        version=delta.version, is_snapshot=delta.is_snapshot, cluster_id="cid", active_controller_id=s.active_controller_id,
        brokers=[broker_record(b) for b in delta.brokers], topics=[topic_record(t) for t in delta.topics],
        partitions=[partition_record(t, i, p) for t, i, p in delta.partitions],
        deleted_topic_ids=delta.deleted_topic_ids, unregistered_broker_ids=delta.unregistered_broker_ids,
        security=security_delta(delta), cluster_configs_changed=delta.cluster_configs is not None,
        cluster_configs=delta.cluster_configs or {})


def normalised(u: pb.MetadataUpdate) -> dict[str, Any]:
    """The update's content, whatever the order of its records."""
    def records(items: Any) -> list[bytes]:
        return sorted(r.SerializeToString(deterministic=True) for r in items)

    sec = u.security
    return {"version": u.version, "snapshot": u.is_snapshot, "cluster": u.cluster_id, "controller": u.active_controller_id,
            "brokers": records(u.brokers), "topics": records(u.topics), "partitions": records(u.partitions),
            "deleted": sorted(u.deleted_topic_ids), "unregistered": sorted(u.unregistered_broker_ids),
            "security": u.HasField("security"), "credentials": records(sec.credentials),
            "deleted_credentials": records(sec.deleted_credentials), "acls_changed": sec.acls_changed,
            "acls": records(sec.acls), "quotas": records(sec.quotas),
            "configs_changed": u.cluster_configs_changed, "configs": dict(u.cluster_configs)}


@pytest.mark.parametrize("seed", range(12))
def test_an_update_read_in_slices_equals_one_read_in_one_hold(seed: int) -> None:
    h = WatchHistory(seed, forward=False)  # old snapshots restored, topic ids reused: restarts and re-creations
    h.start()
    meddle = [0]

    def read(fn: Callable[[MetadataState], Any]) -> Any:
        for _ in range(meddle[0]):  # Raft applies records between the holds of one read
            actions.append(h.step())
        return fn(h.state)

    # (Each snapshot read afresh: a shared one is as of its own version, checked by the next test.)
    readers = [WatchReader(read, cluster_id="cid", slice_size=size) for size in (1, 3, 8)]
    actions: list[str] = []
    kinds = {"snapshot": 0, "delta": 0, "sliced": 0}
    for _ in range(150):
        for _ in range(h.rng.randint(0, 6)):
            actions.append(h.step())
        reader = h.rng.choice(readers)
        s = h.state
        snapshot = h.rng.random() < 0.4
        since = max(s.changelog_floor, s.version - h.rng.randint(0, 25))
        meddle[0] = h.rng.choice([0, 1, 1, 2, 3])
        holds_before = reader.copied
        update = reader.update(since, snapshot=snapshot)
        meddle[0] = 0  # the state as the read's last hold saw it
        assert update is not None and update.version == h.state.version
        if update.is_snapshot:
            expected = one_hold_update(h.state, h.state.full_delta())
            kinds["snapshot"] += 1
        else:
            assert not snapshot
            changes = h.state.changes_since(since)
            assert changes is not None
            expected = one_hold_update(h.state, changes)
            kinds["delta"] += 1
        kinds["sliced"] += reader.copied - holds_before > reader._slice
        assert normalised(update) == normalised(expected), (seed, since, update.is_snapshot)
        if update.is_snapshot:  # ... and a broker applying it holds exactly the state
            follower = Follower(1)
            follower.apply(update)
            assert follower.content() == content(h.state)
    assert min(kinds.values()) >= 10, kinds
    assert h.reused_ids > 0 and {"restore", "restore_old", "scram", "acl", "quota"} <= set(actions), set(actions)


class MeddlingRaft:
    """MetadataRaft as the service uses it, over a history: records are applied between the holds of the
    service's reads, and 'waiting' for a newer version applies records until one is."""

    def __init__(self, h: WatchHistory) -> None:
        self.h = h
        self.lock = threading.RLock()
        self.meddle = 0

    def read(self, fn: Callable[[MetadataState], Any]) -> Any:
        for _ in range(self.h.rng.randint(0, self.meddle)):
            self.h.step()
        with self.lock:
            return fn(self.h.state)

    @property
    def version(self) -> int:
        return self.h.state.version

    def wait_for_version_beyond(self, version: int, timeout_s: float) -> int:
        for _ in range(200):
            if self.h.state.version > version:
                break
            self.h.step()
        return self.h.state.version


@pytest.mark.parametrize("seed", range(10))
def test_brokers_following_the_stream_always_hold_the_state_at_their_version(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_view, "WATCH_SLICE", 1 + seed % 4)  # every read takes several holds
    h = WatchHistory(seed, forward=True)
    h.start()
    for _ in range(40):
        h.step()
    raft = MeddlingRaft(h)
    svc = ControllerService(Active(), raft, lambda: pb.ControllerRedirect(), cluster_id="cid",  # type: ignore[arg-type]
                            voter_ids={}, default_timeout_s=5.0)
    followers = {b: Follower(b) for b in (1, 2, 3)}
    streams: dict[int, Iterator[pb.MetadataUpdate]] = {}
    seen = {"snapshot": 0, "delta": 0, "cut off": 0}
    snapshots: dict[int, pb.MetadataUpdate] = {}
    for _ in range(300):
        b = h.rng.choice(list(followers))
        follower = followers[b]
        if b not in streams or h.rng.random() < 0.05:  # (re)connect: from scratch or from the version held
            since = 0 if b not in streams or h.rng.random() < 0.3 else follower.cache.version
            streams[b] = svc.WatchMetadata(pb.WatchMetadataRequest(broker_id=b, since_version=since), OpenContext())
        raft.meddle = h.rng.choice([0, 1, 3])
        update = next(streams[b])
        raft.meddle = 0
        if update.error_code == ErrorCode.REQUEST_TIMED_OUT:  # fell behind the changelog: reconnect
            seen["cut off"] += 1
            streams[b] = svc.WatchMetadata(pb.WatchMetadataRequest(broker_id=b, since_version=follower.cache.version),
                                           OpenContext())
            continue
        assert update.error_code == ErrorCode.NONE, update
        if update.is_snapshot:
            seen["snapshot"] += 1
            snapshots[b] = update
        else:
            seen["delta"] += 1
        # Never backwards, snapshots included: a broker deletes the logs its snapshot does not assign to it.
        assert update.version >= follower.cache.version, (seed, b, update.version, follower.cache.version)
        follower.apply(update)
        assert follower.content() == h.contents[update.version], (seed, b, update.version, update.is_snapshot)
    assert seen["snapshot"] >= 5 and seen["delta"] >= 100 and seen["cut off"] >= 1, seen
