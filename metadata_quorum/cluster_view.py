"""DescribeCluster's answer, and WatchMetadata's updates, built outside the metadata state lock.

DescribeCluster lists every broker, topic and partition. Building those records from the
state under its lock took O(partitions) of it (1.2 s at 200,000 partitions on a quiet
machine; Raft applies, heartbeats and every other controller call waited). The view keeps
one record per topic and partition of its own instead. Under the lock a call copies only
the brokers and what changed since its previous call (``MetadataState.take_unseen``: the
keys of the topics and partitions touched, first-touched first), as plain tuples; the
records are built and the answer put together after the lock is released. The answer is
kept until something changes, so calls on an unchanged state share it.

Under the lock a call costs O(brokers + entities changed since the previous call): each
change is copied once, and the apply that made it held the lock at least as long. A view
that must load everything (a new view, after a snapshot restore, or after more keys
changed than the state holds) loads it in slices of ``RELOAD_SLICE`` partitions, one short
hold each, then catches up with what changed meanwhile, so no single hold is O(partitions).

WatchMetadata (``WatchReader``) reads the same way. A watcher's first message may be a
snapshot of everything; built from the state in one hold it took 1.0-1.4 s at 200,000
partitions, and a restart of every broker queued one per broker. The reader copies the
topics and partitions as plain tuples, ``WATCH_SLICE`` per hold, then the keys the
changelog lists as changed since the round began (``MetadataState.changed_keys_since``),
again in slices, until a round's changes fit in one hold; that last hold also copies the
brokers, security records and cluster configs and fixes the version. The records are built
after the lock is released. A delta (the changes after the watcher's version) is read the
same way from the changelog's keys. The result is exactly the state (or the changes) as of
the last hold's version: an entity not changed since a round began has the value copied
during it, and every entity changed since is copied again.

Each snapshot is read for the watcher that asks, as of then; one is never served again to
another watcher. A broker applying a snapshot deletes the logs of partitions the snapshot
does not assign to it, so a snapshot older than what a restarted broker had seen (shared
from an earlier read) made it delete the logs of topics created in between: with one
replica, their data was gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from metadata_quorum.security_service import security_delta
from metadata_quorum.state import MetadataDelta, MetadataState
from proto import common_pb2
from proto import controller_pb2 as pb

RELOAD_SLICE = 2000  # partitions copied per state-lock hold while the view loads everything
MAX_RELOADS = 4  # sliced loads in a row before the last resort, one hold for everything
WATCH_SLICE = 2000  # topics, partitions and other keys a watcher's update copies per state-lock hold
MAX_WATCH_ROUNDS = 4  # catch-up rounds of one read before the rest is copied in one hold
MAX_WATCH_RESTARTS = 3  # reads begun again (a snapshot restored, the changelog moved past) before one whole hold

# (name, topic id, configs, partition count)
_Topic = tuple[str, str, dict[str, str], int]
# (topic name, replicas, isr, leader, leader epoch, partition epoch, adding, removing)
_Partition = tuple[str, tuple[int, ...], tuple[int, ...], int, int, int, tuple[int, ...], tuple[int, ...]]
# What a hold copied, in the order it happened: ("X", topic id) deleted; ("T", topic id, topic, None or
# every partition from index 0); ("P", topic id, index, partition).
_Copied = tuple[Any, ...]


def partition_record(topic: Any, index: int, p: Any) -> pb.PartitionRecord:
    return pb.PartitionRecord(topic=topic.name, topic_id=topic.topic_id, partition=index, replicas=p.replicas,
                              isr=p.isr, leader=p.leader, leader_epoch=p.leader_epoch,
                              partition_epoch=p.partition_epoch, adding_replicas=p.adding,
                              removing_replicas=p.removing)


def broker_record(b: Any) -> pb.BrokerRecord:
    return pb.BrokerRecord(
        node_id=b.node_id, incarnation_id=b.incarnation_id, broker_epoch=b.broker_epoch,
        endpoints=[common_pb2.Endpoint(name=n, host=h, port=p) for n, h, p in b.endpoints],
        rack=b.rack, fenced=b.fenced, in_controlled_shutdown=b.in_controlled_shutdown,
        partition_capacity=b.partition_capacity)


def topic_record(t: Any) -> pb.TopicRecord:
    return pb.TopicRecord(name=t.name, topic_id=t.topic_id, configs=t.configs, partition_count=len(t.partitions))


def _topic(t: Any) -> _Topic:
    return (t.name, t.topic_id, dict(t.configs), len(t.partitions))


def _partition(name: str, p: Any) -> _Partition:
    return (name, tuple(p.replicas), tuple(p.isr), p.leader, p.leader_epoch, p.partition_epoch, tuple(p.adding),
            tuple(p.removing))


class _Header:
    """The state-wide part of a hold: version, active controller, brokers (O(brokers))."""

    __slots__ = ("version", "active_controller_id", "brokers")

    def __init__(self, s: MetadataState) -> None:
        self.version = s.version
        self.active_controller_id = s.active_controller_id
        self.brokers = [broker_record(b) for b in s.brokers.values()]


class ClusterView:
    """One per controller; ``describe`` may be called from any thread (calls take turns)."""

    def __init__(self, read: Callable[[Callable[[MetadataState], Any]], Any], *,
                 reload_slice: int = RELOAD_SLICE) -> None:
        self._read = read  # runs a function on the state under the state lock (MetadataRaft.read)
        self._reload_slice = reload_slice
        self._token = object()  # who this view is to MetadataState.take_unseen
        # One call at a time: the holds of a call and its merges happen in order. Taken before the state
        # lock, never while holding it.
        self._lock = threading.Lock()
        self._version = -1
        self._active_controller_id = -1
        self._brokers: list[pb.BrokerRecord] = []
        self._topics: dict[str, pb.TopicRecord] = {}  # by topic id, in the state's order
        self._partitions: dict[str, list[pb.PartitionRecord | None]] = {}  # by topic id, then index
        self._answer: pb.DescribeClusterResponse | None = None
        self._answer_key: tuple[str, int] | None = None
        # For tests: topics and partitions copied under the state lock, and the most copied by one hold.
        self.copied = 0
        self.most_copied_in_one_hold = 0

    def describe(self, cluster_id: str, default_min_insync_replicas: int) -> pb.DescribeClusterResponse:
        """The current brokers, topics and partitions. The answer may be shared with other callers:
        do not change it."""
        with self._lock:
            try:
                self._refresh()
                key = (cluster_id, default_min_insync_replicas)
                if self._answer is None or self._answer_key != key:
                    answer = pb.DescribeClusterResponse(
                        cluster_id=cluster_id, active_controller_id=self._active_controller_id,
                        default_min_insync_replicas=default_min_insync_replicas, metadata_version=self._version,
                        brokers=self._brokers)
                    answer.topics.extend(self._topics.values())
                    for records in self._partitions.values():
                        answer.partitions.extend(records)  # type: ignore[arg-type]  # complete: every index filled
                    self._answer, self._answer_key = answer, key
                return self._answer
            except BaseException:
                # Interrupted half-way (a bug): never serve a half-merged view; the next call loads all.
                self._token = object()
                self._version, self._topics, self._partitions, self._answer = -1, {}, {}, None
                raise

    def _refresh(self) -> None:
        for attempt in range(MAX_RELOADS + 1):
            header, copied, ids = self._read(self._take_changes)
            if header is None:
                return  # nothing changed: the answer stands
            self._answer = None
            if copied is not None:
                self._merge(header, copied)
                return
            # Everything to load: the topics slice by slice, then (next turn) the changes made meanwhile,
            # tracked since that hold. The last resort loads everything in one hold.
            self._topics, self._partitions = {}, {}
            if attempt == MAX_RELOADS:
                self._merge(*self._read(self._take_everything))
                return
            self._merge(header, [])
            self._load_in_slices(ids)

    # ---- under the state lock ----
    def _hold_copied(self, count: int) -> None:
        self.copied += count
        self.most_copied_in_one_hold = max(self.most_copied_in_one_hold, count)

    def _take_changes(self, s: MetadataState) -> tuple[_Header | None, list[_Copied] | None, list[str]]:
        """(None, None, []): nothing changed. (header, copies, []): what changed. (header, None, topic ids in
        the state's order): load everything (changes are tracked from this hold on)."""
        everything, keys = s.take_unseen(self._token)
        if everything:
            return _Header(s), None, list(s.topics_by_id)  # one C-speed copy of the ids
        if not keys and s.version == self._version:
            return None, None, []
        copied: list[_Copied] = []
        whole: set[str] = set()  # topics copied whole in this hold: their partitions' keys are done
        gone: set[str] = set()  # deleted since the previous call (earlier in this list)
        count = 0
        for key in keys:
            kind, topic_id = key[0], key[1]
            topic = s.topics_by_id.get(topic_id)
            if kind == "X":
                copied.append(("X", topic_id))
                gone.add(topic_id)
            elif kind == "T":
                if topic is None:
                    continue  # deleted later: its "X" follows
                if topic_id in self._topics and topic_id not in gone:
                    copied.append(("T", topic_id, _topic(topic), None))
                else:  # new to the view: every partition now (its partitions' keys may precede this one)
                    copied.append(("T", topic_id, _topic(topic), [_partition(topic.name, p) for p in topic.partitions]))
                    whole.add(topic_id)
                    count += len(topic.partitions)
                count += 1
            elif topic is not None and topic_id not in whole and key[2] < len(topic.partitions):
                copied.append(("P", topic_id, key[2], _partition(topic.name, topic.partitions[key[2]])))
                count += 1
        self._hold_copied(count)
        return _Header(s), copied, []

    def _take_everything(self, s: MetadataState) -> tuple[_Header, list[_Copied]]:
        s.take_unseen(self._token)
        copied: list[_Copied] = [("T", t.topic_id, _topic(t), [_partition(t.name, p) for p in t.partitions])
                                 for t in s.topics.values()]
        self._hold_copied(len(copied) + s.partition_count())
        return _Header(s), copied

    def _load_in_slices(self, ids: list[str]) -> None:
        position = [0, 0]  # next topic in ids, next partition of it

        def take_slice(s: MetadataState) -> list[_Copied]:
            copied: list[_Copied] = []
            budget = self._reload_slice
            while position[0] < len(ids) and budget > 0:
                topic_id = ids[position[0]]
                topic = s.topics_by_id.get(topic_id)
                if topic is None:  # deleted meanwhile: its "X" comes with the changes
                    position[0], position[1] = position[0] + 1, 0
                    budget -= 1
                    continue
                start = position[1]
                end = min(len(topic.partitions), start + budget)
                if start == 0:
                    copied.append(("T", topic_id, _topic(topic), None))
                for index in range(start, end):
                    copied.append(("P", topic_id, index, _partition(topic.name, topic.partitions[index])))
                budget -= max(1, end - start)
                if end >= len(topic.partitions):
                    position[0], position[1] = position[0] + 1, 0
                else:
                    position[1] = end
            self._hold_copied(len(copied))
            return copied

        while position[0] < len(ids):  # bounded: each slice moves past >= 1 partition or topic
            self._merge_records(self._read(take_slice))

    # ---- after the state lock: the records ----
    def _merge(self, header: _Header, copied: list[_Copied]) -> None:
        self._version = header.version
        self._active_controller_id = header.active_controller_id
        self._brokers = header.brokers
        self._merge_records(copied)

    def _merge_records(self, copied: list[_Copied]) -> None:
        for item in copied:
            kind, topic_id = item[0], item[1]
            if kind == "X":
                self._topics.pop(topic_id, None)
                self._partitions.pop(topic_id, None)
            elif kind == "T":
                _, _, (name, _, configs, count), partitions = item
                self._topics[topic_id] = pb.TopicRecord(name=name, topic_id=topic_id, configs=configs,
                                                        partition_count=count)
                if partitions is not None:
                    self._partitions[topic_id] = [_record(topic_id, i, p) for i, p in enumerate(partitions)]
                else:
                    records = self._partitions.setdefault(topic_id, [])
                    if len(records) < count:  # new partitions: filled from their own keys
                        records.extend([None] * (count - len(records)))
            else:
                records = self._partitions.get(topic_id)
                if records is None:
                    continue
                index = item[2]
                if index >= len(records):
                    records.extend([None] * (index + 1 - len(records)))
                records[index] = _record(topic_id, index, item[3])


def _record(topic_id: str, index: int, p: _Partition) -> pb.PartitionRecord:
    name, replicas, isr, leader, leader_epoch, partition_epoch, adding, removing = p
    return pb.PartitionRecord(topic=name, topic_id=topic_id, partition=index, replicas=replicas, isr=isr,
                              leader=leader, leader_epoch=leader_epoch, partition_epoch=partition_epoch,
                              adding_replicas=adding, removing_replicas=removing)


# ---- WatchMetadata ----
_MORE, _DONE, _RESTART = "more", "done", "restart"  # what a hold of a watcher's read ended with


class _WatchRead:
    """One watcher's update being read: what the holds copied so far, and what is left to copy."""

    __slots__ = ("snapshot", "restores", "start", "work", "next", "next_partition", "rounds", "topics",
                 "partitions", "others", "version", "active_controller_id", "brokers", "unregistered",
                 "credentials", "deleted_credentials", "acls", "quotas", "cluster_configs", "metadata_level")

    def __init__(self, snapshot: bool, s: MetadataState, work: list[Any]) -> None:
        self.snapshot = snapshot
        self.restores = s.restores  # a snapshot restored in place since: begin again
        self.start = s.version  # the version of the hold that listed this round's work
        # A snapshot's first round: topic ids (the whole topic). Later rounds, and a delta: changelog keys.
        self.work = work
        self.next = 0  # the next item of work
        self.next_partition = 0  # the next partition of a whole topic
        self.rounds = 0
        self.topics: dict[str, _Topic | None] = {}  # None: gone when copied
        self.partitions: dict[tuple[str, int], _Partition | None] = {}
        self.others: dict[tuple[Any, ...], None] = {}  # brokers', security and cluster-wide keys (a delta)
        # Copied by the last hold:
        self.version = -1
        self.active_controller_id = -1
        self.brokers: list[pb.BrokerRecord] = []
        self.unregistered: list[int] = []
        self.credentials: list[Any] = []
        self.deleted_credentials: list[tuple[str, str]] = []
        self.acls: frozenset[Any] | None = None
        self.quotas: list[tuple[str, dict[str, float]]] = []
        self.cluster_configs: dict[str, str] | None = None
        self.metadata_level: int | None = None  # the finalized brook.metadata.version, when it changed


class WatchReader:
    """WatchMetadata's updates for one controller, read in slices (see the module docstring). Any thread
    may call ``update``; snapshots are read one at a time, each for the watcher that asks, as of then."""

    def __init__(self, read: Callable[[Callable[[MetadataState], Any]], Any], *, cluster_id: str = "",
                 slice_size: int | None = None, max_rounds: int = MAX_WATCH_ROUNDS,
                 max_restarts: int = MAX_WATCH_RESTARTS) -> None:
        self._read = read  # runs a function on the state under the state lock (MetadataRaft.read)
        self._cluster_id = cluster_id
        self._slice = WATCH_SLICE if slice_size is None else slice_size
        self._max_rounds = max_rounds
        self._max_restarts = max_restarts
        # One snapshot read at a time (each is O(partitions) of copying, if in short holds). Taken before the
        # state lock, never while holding it.
        self._snapshot_lock = threading.Lock()
        # For tests: topics, partitions and keys copied under the state lock, the most in one hold, snapshots built.
        self.copied = 0
        self.most_copied_in_one_hold = 0
        self.snapshots_built = 0

    def update(self, since: int, *, snapshot: bool = False, if_behind: bool = True) -> pb.MetadataUpdate | None:
        """The changes after ``since`` as one update (not a snapshot), as of the version it names. A snapshot
        instead when ``snapshot`` is set, or when the changelog no longer covers ``since`` and ``if_behind``
        is set; without ``if_behind`` that is None (the watcher fell behind). A snapshot is as of a version
        no older than the state's when this was called (never one read earlier for another watcher)."""
        for attempt in range(self._max_restarts + 1):
            whole = attempt == self._max_restarts  # the last resort: everything in one hold, which cannot restart
            if not snapshot:
                r, outcome = self._run(lambda s: self._begin_delta(s, since), whole)
                if r is not None:
                    if outcome == _DONE:
                        return self._build(r)
                    continue  # a snapshot restored, or the changelog moved past the read: begin again
                if not if_behind:
                    return None
                snapshot = True
            with self._snapshot_lock:
                r, outcome = self._run(lambda s: _WatchRead(True, s, list(s.topics_by_id)), whole)
                if outcome != _DONE:
                    continue
                update = self._build(r)
                self.snapshots_built += 1
                return update
        raise AssertionError("unreachable: the last attempt reads in one hold")

    def _run(self, begin: Callable[[MetadataState], _WatchRead | None],
             whole: bool) -> tuple[_WatchRead | None, str]:
        budget = float("inf") if whole else self._slice

        def first(s: MetadataState) -> tuple[_WatchRead | None, str]:
            r = begin(s)
            return (None, _DONE) if r is None else (r, self._hold(s, r, budget))

        r, outcome = self._read(first)
        while outcome == _MORE:
            assert r is not None
            outcome = self._read(lambda s: self._hold(s, r, budget))  # type: ignore[arg-type]
        return r, outcome

    # ---- under the state lock ----
    @staticmethod
    def _begin_delta(s: MetadataState, since: int) -> _WatchRead | None:
        keys = s.changed_keys_since(since)
        return None if keys is None else _WatchRead(False, s, keys)

    def _hold(self, s: MetadataState, r: _WatchRead, budget: float) -> str:
        """One hold: copy up to ``budget`` items; when the work is done, list what changed since the round
        began and go on; when nothing did, copy the rest (brokers, security, version) and finish."""
        if s.restores != r.restores:
            return _RESTART
        copied = 0
        try:
            while True:
                if r.next >= len(r.work):
                    if s.version == r.start:
                        self._finish(s, r)
                        return _DONE
                    keys = s.changed_keys_since(r.start)
                    if keys is None:
                        return _RESTART
                    r.start, r.work, r.next, r.next_partition = s.version, keys, 0, 0
                    r.rounds += 1
                    if r.rounds > self._max_rounds:
                        budget = float("inf")  # the changes keep coming faster than slices copy them
                n = self._copy(s, r, budget - copied)
                copied += n
                if copied >= budget and r.next < len(r.work):
                    return _MORE
        finally:
            self.copied += copied
            self.most_copied_in_one_hold = max(self.most_copied_in_one_hold, copied)

    @staticmethod
    def _copy(s: MetadataState, r: _WatchRead, budget: float) -> int:
        copied = 0
        work, topics_by_id = r.work, s.topics_by_id
        while r.next < len(work) and copied < budget:
            item = work[r.next]
            if type(item) is str:  # a whole topic, from r.next_partition on
                topic = topics_by_id.get(item)
                if topic is None:  # deleted since it was listed: its key comes with the changes
                    r.next, r.next_partition = r.next + 1, 0
                    copied += 1
                    continue
                start = r.next_partition
                if start == 0:
                    r.topics[item] = _topic(topic)
                    copied += 1
                name, partitions = topic.name, topic.partitions
                end = min(len(partitions), start + max(1, budget - copied))
                for index in range(start, end):  # type: ignore[arg-type]  # end is an int: len() is smaller
                    r.partitions[(item, index)] = _partition(name, partitions[index])
                copied += end - start  # type: ignore[operator]
                if end >= len(partitions):
                    r.next, r.next_partition = r.next + 1, 0
                else:
                    r.next_partition = int(end)
                continue
            kind = item[0]
            if kind == "P":
                topic = topics_by_id.get(item[1])
                r.partitions[(item[1], item[2])] = None if topic is None or item[2] >= len(topic.partitions) \
                    else _partition(topic.name, topic.partitions[item[2]])
            elif kind == "T":
                topic = topics_by_id.get(item[1])
                r.topics[item[1]] = None if topic is None else _topic(topic)
            else:
                r.others[item] = None
            copied += 1
            r.next += 1
        return copied

    @staticmethod
    def _finish(s: MetadataState, r: _WatchRead) -> None:
        """The version, and the brokers, security records and cluster configs (O(brokers + security), C
        speed but for the brokers). Credentials and ACL sets are immutable, and a quota entity's or the
        cluster configs' dict is replaced, never changed: references are enough."""
        r.version = s.version
        r.active_controller_id = s.active_controller_id
        if r.snapshot:
            r.brokers = [broker_record(b) for b in s.brokers.values()]
            r.credentials = list(s.scram.values())
            r.acls = s.acls
            r.quotas = list(s.quotas.items())
            r.cluster_configs = s.cluster_configs
            r.metadata_level = s.metadata_level
            return
        for key in r.others:
            kind = key[0]
            if kind == "B":
                broker = s.brokers.get(key[1])
                if broker is None:
                    r.unregistered.append(key[1])
                else:
                    r.brokers.append(broker_record(broker))
            elif kind == "S":
                cred = s.scram.get((key[1], key[2]))
                if cred is None:
                    r.deleted_credentials.append((key[1], key[2]))
                else:
                    r.credentials.append(cred)
            elif kind == "ACL":
                r.acls = s.acls
            elif kind == "Q":
                r.quotas.append((key[1], s.quotas.get(key[1], {})))
            elif kind == "C":
                r.cluster_configs = s.cluster_configs
            elif kind == "F":
                r.metadata_level = s.metadata_level

    # ---- after the state lock: the update ----
    def _build(self, r: _WatchRead) -> pb.MetadataUpdate:
        """The update, its records made in place one call each (one call copying 200,000 records into
        the message held the GIL for 0.1 s: the Raft and gRPC threads waited for it as for a lock)."""
        quotas = [(e, dict(v)) for e, v in (sorted(r.quotas) if r.snapshot else r.quotas)]
        delta = MetadataDelta(r.version, r.snapshot, [], [], [], [], [], credentials=r.credentials,
                              deleted_credentials=r.deleted_credentials,
                              acls=None if r.acls is None else sorted(r.acls), quotas=quotas,
                              cluster_configs=r.cluster_configs)
        configs = r.cluster_configs
        update = pb.MetadataUpdate(
            version=r.version, is_snapshot=r.snapshot, cluster_id=self._cluster_id,
            active_controller_id=r.active_controller_id, brokers=r.brokers, unregistered_broker_ids=r.unregistered,
            security=security_delta(delta), cluster_configs_changed=configs is not None,
            cluster_configs=configs or {}, metadata_level=r.metadata_level or 0)
        add_topic, add_partition = update.topics.add, update.partitions.add
        for topic_id, t in r.topics.items():
            if t is None:
                if not r.snapshot:
                    update.deleted_topic_ids.append(topic_id)
                continue
            name, _, configs_of_topic, count = t
            add_topic(name=name, topic_id=topic_id, configs=configs_of_topic, partition_count=count)
            if r.snapshot:
                for index in range(count):
                    p = r.partitions.get((topic_id, index))
                    if p is None:  # a bug: the catch-up missed a change
                        raise RuntimeError(f"watch snapshot at version {r.version}: {name}-{index} was not copied")
                    _add_record(add_partition, topic_id, index, p)
        if not r.snapshot:
            for (topic_id, index), p in r.partitions.items():
                if p is None:
                    continue
                if topic_id in r.topics:  # changed too: gone, or made again with fewer partitions
                    t = r.topics[topic_id]
                    if t is None or index >= t[3]:
                        continue
                _add_record(add_partition, topic_id, index, p)
        return update


def _add_record(add: Callable[..., Any], topic_id: str, index: int, p: _Partition) -> None:
    name, replicas, isr, leader, leader_epoch, partition_epoch, adding, removing = p
    add(topic=name, topic_id=topic_id, partition=index, replicas=replicas, isr=isr, leader=leader,
        leader_epoch=leader_epoch, partition_epoch=partition_epoch, adding_replicas=adding,
        removing_replicas=removing)
