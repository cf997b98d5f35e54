"""The broker's copy of the cluster metadata, fed by the controller's WatchMetadata stream.

The quorum is the source of truth; this cache is a read-mostly replica of the parts a
broker needs (brokers, topics, partitions) at one metadata version. Updates arrive as
``MetadataUpdate`` messages: a snapshot replaces everything, a delta upserts the
current value of each changed entity and drops the deleted ones. Readers get immutable
records (the protobuf messages are copied in and never mutated afterwards).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.authorizer import EMPTY_INDEX, AclIndex
from metadata_quorum import security as sec
from proto import common_pb2, controller_pb2, security_pb2

log = logging.getLogger(__name__)

BROKER_LISTENER = "BROKER"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str
    fenced: bool
    in_controlled_shutdown: bool
    broker_epoch: int
    # Every registered listener: name -> (host, port); host/port above are BROKER's.
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, listener: str) -> tuple[str, int]:
        return self.registered_endpoint(listener) or (self.host, self.port)

    def registered_endpoint(self, listener: str) -> tuple[str, int] | None:
        """The address of ``listener`` if the broker registered one."""
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int

    @staticmethod
    def from_record(rec: controller_pb2.PartitionRecord) -> PartitionInfo:
        return PartitionInfo(rec.topic, rec.topic_id, rec.partition, tuple(rec.replicas), tuple(rec.isr),
                             rec.leader, rec.leader_epoch, rec.partition_epoch)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    configs: dict[str, str]
    partition_count: int


@dataclass(slots=True)
class MetadataDelta:
    """What one applied update changed, for the replica manager to act on."""

    version: int
    is_snapshot: bool
    changed_partitions: list[PartitionInfo] = field(default_factory=list)
    deleted_topics: list[TopicInfo] = field(default_factory=list)
    changed_topics: list[TopicInfo] = field(default_factory=list)
    cluster_configs: dict[str, str] | None = None  # every dynamic cluster config, when they changed


class MetadataCache:
    """Thread-safe view of brokers/topics/partitions at ``version``."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self._lock = threading.Condition()
        self._version = 0
        self._cluster_id = ""
        self._controller_id = -1
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics_by_id: dict[str, TopicInfo] = {}
        self._topic_ids: dict[str, str] = {}  # name -> id
        self._partitions: dict[tuple[str, int], PartitionInfo] = {}
        # Security records from the quorum: SCRAM credentials, ACLs (indexed once per change), quotas.
        self._credentials: dict[tuple[str, str], sec.ScramCredential] = {}
        self._acl_index: AclIndex = EMPTY_INDEX
        self._quotas: dict[str, dict[str, float]] = {}
        self._cluster_configs: dict[str, str] = {}  # dynamic broker configs (metadata_quorum/cluster_configs.py)
        self._metadata_level = 1  # the finalized brook.metadata.version (metadata_quorum/features.py)
        # Called with the topics an applied delta deleted (a same-name recreation included), after the
        # update is visible and outside the cache's lock: the group coordinator drops their committed
        # offsets, as Kafka's (GroupCoordinator.onPartitionsDeleted). Must be quick: it runs on the watch.
        self._deleted_topics_listeners: list[Callable[[list[TopicInfo]], None]] = []

    def add_deleted_topics_listener(self, listener: Callable[[list[TopicInfo]], None]) -> None:
        with self._lock:
            self._deleted_topics_listeners.append(listener)

    # ---- applying updates ----
    def apply(self, update: controller_pb2.MetadataUpdate) -> MetadataDelta:
        delta = self._apply(update)
        # Deletions seen in a delta only: a snapshot's "deleted" topics are the ones it does not name, and a
        # snapshot can be stale or wrong (see ReplicaManager._stop_replica); the coordinator's sweep removes
        # the offsets of topics that stay unknown.
        if delta.deleted_topics and not delta.is_snapshot:
            for listener in list(self._deleted_topics_listeners):
                try:
                    listener(list(delta.deleted_topics))
                except Exception:  # a listener's bug must not stop the metadata watch
                    log.exception("deleted-topics listener failed")
        return delta

    def _apply(self, update: controller_pb2.MetadataUpdate) -> MetadataDelta:
        with self._lock:
            delta = MetadataDelta(update.version, update.is_snapshot)
            # A snapshot's users go into a new dict that replaces the old one once filled: ``scram_credential``
            # reads without the lock, and live sessions are checked against it on every call (broker/sasl.py),
            # so a snapshot must never show a user as gone for a moment.
            credentials: dict[tuple[str, str], sec.ScramCredential] = {} if update.is_snapshot else self._credentials
            if update.is_snapshot:
                delta.deleted_topics = [t for t in self._topics_by_id.values()
                                        if t.topic_id not in {r.topic_id for r in update.topics}]
                self._brokers.clear()
                self._topics_by_id.clear()
                self._topic_ids.clear()
                self._partitions.clear()
                self._acl_index = EMPTY_INDEX
                self._quotas.clear()
            if update.HasField("security"):
                self._apply_security(update.security, credentials)
            self._credentials = credentials
            if update.cluster_configs_changed:
                self._cluster_configs = dict(update.cluster_configs)
                delta.cluster_configs = dict(self._cluster_configs)
            if update.metadata_level or update.is_snapshot:
                self._metadata_level = max(1, update.metadata_level)  # a snapshot without it: level 1
            if update.cluster_id:
                self._cluster_id = update.cluster_id
            self._controller_id = update.active_controller_id
            for b in update.brokers:
                self._brokers[b.node_id] = _broker_info(b)
            for node_id in update.unregistered_broker_ids:
                self._brokers.pop(node_id, None)
            for tid in update.deleted_topic_ids:
                topic = self._topics_by_id.pop(tid, None)
                if topic is None:
                    continue
                delta.deleted_topics.append(topic)
                if self._topic_ids.get(topic.name) == tid:
                    del self._topic_ids[topic.name]
                for p in range(topic.partition_count):
                    self._partitions.pop((topic.name, p), None)
            for t in update.topics:
                info = TopicInfo(t.name, t.topic_id, dict(t.configs), t.partition_count)
                old_id = self._topic_ids.get(t.name)
                if old_id is not None and old_id != t.topic_id:
                    # Same name, new incarnation: the old one is gone.
                    old = self._topics_by_id.pop(old_id)
                    delta.deleted_topics.append(old)
                    for p in range(old.partition_count):
                        self._partitions.pop((old.name, p), None)
                self._topics_by_id[t.topic_id] = info
                self._topic_ids[t.name] = t.topic_id
                delta.changed_topics.append(info)
            for rec in update.partitions:
                if rec.topic_id and rec.topic_id not in self._topics_by_id:
                    continue  # belongs to a topic deleted in this same update
                info = PartitionInfo.from_record(rec)
                self._partitions[(info.topic, info.partition)] = info
                delta.changed_partitions.append(info)
            if update.is_snapshot:
                delta.changed_partitions = list(self._partitions.values())
            self._version = max(self._version, update.version) if not update.is_snapshot else update.version
            self._lock.notify_all()
            return delta

    def _apply_security(self, delta: security_pb2.SecurityDelta,
                        credentials: dict[tuple[str, str], sec.ScramCredential]) -> None:
        for r in delta.credentials:
            cred = sec.ScramCredential(r.user, r.mechanism, r.salt, r.stored_key, r.server_key, r.iterations)
            credentials[(r.user, r.mechanism)] = cred
        for item in delta.deleted_credentials:
            credentials.pop((item.user, item.mechanism), None)
        if delta.acls_changed:
            self._acl_index = AclIndex(sec.AclBinding(a.resource_type, a.resource_name, a.pattern_type, a.principal,
                                                      a.host, a.operation, a.permission) for a in delta.acls)
        for q in delta.quotas:
            if q.values:
                self._quotas[q.entity] = dict(q.values)
            else:
                self._quotas.pop(q.entity, None)

    def wait_for(self, predicate: Callable[[MetadataCache], object], timeout_s: float) -> bool:
        """Block until ``predicate(self)`` holds (re-checked on each update) or the timeout."""
        with self._lock:
            return bool(self._lock.wait_for(lambda: predicate(self), timeout=timeout_s))

    # ---- reads ----
    @property
    def version(self) -> int:
        return self._version

    @property
    def metadata_level(self) -> int:
        """The finalized brook.metadata.version as of this version of the cache."""
        return self._metadata_level

    def cluster_configs(self) -> dict[str, str]:
        """The dynamic cluster configs (metadata_quorum/cluster_configs.py) as of this version."""
        with self._lock:
            return dict(self._cluster_configs)

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        return self._controller_id

    def brokers(self) -> list[BrokerInfo]:
        with self._lock:
            return sorted(self._brokers.values(), key=lambda b: b.node_id)

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self._brokers.get(node_id)

    def is_broker_usable(self, node_id: int) -> bool:
        """Registered, unfenced and not shutting down: may join an ISR (KIP-841)."""
        b = self._brokers.get(node_id)
        return b is not None and not b.fenced and not b.in_controlled_shutdown

    def counts(self) -> tuple[int, int]:
        """(topics, partitions) in the cluster, as of the last update (two atomic reads, no lock)."""
        return len(self._topic_ids), len(self._partitions)

    def topic(self, name: str) -> TopicInfo | None:
        with self._lock:
            tid = self._topic_ids.get(name)
            return self._topics_by_id.get(tid) if tid is not None else None

    def topic_names(self) -> list[str]:
        """Every topic's name, unsorted (cheaper than topics() when only the names are wanted)."""
        with self._lock:
            return list(self._topic_ids)

    def topic_by_id(self, topic_id: str) -> TopicInfo | None:
        """The topic of that id (the controller's uuid hex), None if none has it."""
        with self._lock:
            return self._topics_by_id.get(topic_id)

    def topics(self) -> list[TopicInfo]:
        with self._lock:
            return sorted(self._topics_by_id.values(), key=lambda t: t.name)

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        return self._partitions.get((topic, partition))

    def partitions_of(self, topic: str) -> list[PartitionInfo]:
        with self._lock:
            t = self._topics_by_id.get(self._topic_ids.get(topic, ""))
            if t is None:
                return []
            out = [self._partitions.get((topic, p)) for p in range(t.partition_count)]
            return [p for p in out if p is not None]

    # ---- security reads (no lock: each is one atomic dict/attribute read of immutable values) ----
    def scram_credential(self, user: str, mechanism: str) -> sec.ScramCredential | None:
        return self._credentials.get((user, mechanism))

    def acl_index(self) -> AclIndex:
        return self._acl_index

    def quotas(self, entity: str) -> dict[str, float] | None:
        return self._quotas.get(entity)

    def leader_and_epoch(self, topic: str, partition: int) -> common_pb2.LeaderIdAndEpoch:
        p = self._partitions.get((topic, partition))
        if p is None:
            return common_pb2.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)
        return common_pb2.LeaderIdAndEpoch(leader_id=p.leader, leader_epoch=p.leader_epoch)


def _broker_info(b: controller_pb2.BrokerRecord) -> BrokerInfo:
    host, port = "", -1
    for ep in b.endpoints:
        if ep.name == BROKER_LISTENER or (port < 0 and ep.name != "CONTROLLER"):
            host, port = ep.host, ep.port
    return BrokerInfo(b.node_id, host, port, b.rack, b.fenced, b.in_controlled_shutdown, b.broker_epoch,
                      tuple((ep.name, ep.host, ep.port) for ep in b.endpoints))
