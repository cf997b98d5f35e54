"""DescribeCluster's answer, kept up to date outside the metadata state lock.

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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from metadata_quorum.state import MetadataState
from proto import common_pb2
from proto import controller_pb2 as pb

RELOAD_SLICE = 2000  # partitions copied per state-lock hold while the view loads everything
MAX_RELOADS = 4  # sliced loads in a row before the last resort, one hold for everything

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
        rack=b.rack, fenced=b.fenced, in_controlled_shutdown=b.in_controlled_shutdown)


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
