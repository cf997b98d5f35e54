"""The group coordinator: consumer groups and their committed offsets, on every broker.

A group belongs to partition ``abs(java_hash(group_id)) % offsets.topic.num.partitions``
of the compacted internal topic ``__consumer_offsets``; the broker leading that partition
is the group's coordinator. Commits and group metadata are records in that partition,
written with ``ReplicaManager.append_records(acks=-1)``: they are replicated like any
data and survive the loss of the coordinator's broker; the Raft quorum never sees them.

When this broker becomes leader of an offsets partition it reads the partition from the
start and rebuilds the groups (answering COORDINATOR_LOAD_IN_PROGRESS meanwhile); when
it stops leading it drops them (NOT_COORDINATOR). The rebalance protocol itself lives in
the pure ``broker.group_state.Group``; this module feeds it time and requests, persists
what it decides, runs the timers (sessions, join/sync deadlines, offset retention) and
serves ``GroupCoordinatorService``.

Entry point for the broker: ``install(broker_server)`` (the ``extensions`` hook).
"""

from __future__ import annotations

import concurrent.futures
import heapq
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from broker import consumer_groups as cg
from broker import group_records as records
from broker.fair_pool import blocking
from broker.group_records import OFFSETS_TOPIC, GroupRecord, OffsetRecord, OwnerRecord, partition_for_group
from broker.group_state import (
    GROUP_OVERHEAD_BYTES,
    MEMBER_PROTOCOLS_MAX,
    MEMBERS_MAX,
    NO_SUBSCRIPTIONS,
    Group,
    GroupState,
    JoinResult,
    OffsetEntry,
    SyncResult,
    offset_bytes,
)
from broker.internal_topics import InternalTopic, int_setting
from broker.log_limits import ThrottledWarning
from client.cluster import HUNG_PEER_OPTIONS
from client.security import SecurityConfig, make_channel
from client.types import TopicPartition
from proto import broker_pb2, broker_pb2_grpc, errors, group_pb2
from proto.common_pb2 import ErrorCode
from storage.disk_errors import disk_failure
from storage.record_batch import (
    CONTROL_TYPE_COMMIT,
    RecordBatchBuilder,
    decode_batch,
    end_txn_marker,
    iter_batches,
)
from storage.segment import CorruptBatchError

log = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.1
LOAD_READ_BYTES = 4 * 1024 * 1024
LOAD_BATCHES_MAX = 10_000_000  # bound on one partition load loop
INT64_MAX = 2**63 - 1
RECORDS_PER_BATCH_MAX = 1000  # commits of many partitions are split into batches of this many
RPC_TIMEOUT_S = 10.0
TXN_PENDING_OFFSETS_MAX = 200_000  # offsets of transactions not ended yet, over all of a coordinator's groups
# What a member costs the coordinator besides its metadata and assignment (ids, timers, the
# Member itself), counted against group.coordinator.metadata.max.bytes: so members, and pending
# members (MEMBER_ID_REQUIRED) that never come back, are bounded over all groups too.
MEMBER_OVERHEAD_BYTES = 512
# How often the timers look for consumer-protocol members whose session or rebalance timeout ran out (a walk
# over those members).
CONSUMER_EXPIRY_INTERVAL_MS = 250
GROUP_INSTANCE_ID_MAX = 249  # as a group or topic name: the longest a static member's instance id may be
# The longest group id. Kafka sets none, but a group id is hashed (Java's String.hashCode, a Python
# loop over its characters) under the coordinator's lock, every group's: a Heartbeat naming a 7 MB
# id held it 0.9 s, and eight such callers kept other groups' heartbeats waiting 8 s.
GROUP_ID_MAX = 1024
# The longest client id a member may join with (Java's default is "consumer-<group id>-<n>"), and its
# protocol type ("consumer", "connect"). Member ids are "<client id>-<uuid>".
CLIENT_ID_MAX = GROUP_ID_MAX + 64
PROTOCOL_TYPE_MAX = 249
_UUID_SUFFIX = 37  # "-" and a UUID: what a member id adds to its client id (or instance id)
# What a pending member (MEMBER_ID_REQUIRED, until it comes back or its session ends) is counted as:
# its id at the longest, and the overhead of a member.
PENDING_MEMBER_BYTES = MEMBER_OVERHEAD_BYTES + CLIENT_ID_MAX + _UUID_SUFFIX
# A DescribeGroups member entry's framing and fixed fields, beyond its strings and bytes.
DESCRIBED_MEMBER_OVERHEAD = 64
# A DescribeGroups offset entry's framing and numbers (partition, committed and end offsets, lag), beyond
# its topic, owner and metadata strings.
DESCRIBED_OFFSET_OVERHEAD = 48
LIST_OFFSETS_LATEST, LIST_OFFSETS_EARLIEST = -1, -2
CHANNEL_OPTIONS = [("grpc.enable_retries", 0), *HUNG_PEER_OPTIONS]


@dataclass(frozen=True)
class CoordinatorConfig:
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024
    offsets_retention_minutes: int = 10080
    offsets_retention_check_interval_ms: int = 600_000
    offsets_commit_timeout_ms: int = 5000
    offset_metadata_max_bytes: int = 4096
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    lag_refresh_interval_ms: int = 10_000
    # What members hand the coordinator, which it keeps in memory for their sessions: one member's
    # protocol metadata (summed over its JoinGroup's protocols) or assignment, and everything of
    # every group this coordinator holds.
    group_member_metadata_max_bytes: int = 1 << 20
    group_coordinator_metadata_max_bytes: int = 256 << 20
    group_coordinator_offsets_max_bytes: int = 256 << 20
    group_coordinator_offsets_max_bytes_per_ip: int = 64 << 20
    group_coordinator_metadata_max_bytes_per_ip: int = 64 << 20
    # Group-partition rows /metrics shows (committed offset and lag each), the largest lags first: group
    # ids are chosen by clients, and one with READ on a prefix of groups made 3 nodes' /metrics 230 MB.
    group_lag_metrics_max_series: int = 1000
    # Kafka's consumer protocol (KIP-848): how often members heartbeat, and how long one may be silent.
    group_consumer_heartbeat_interval_ms: int = cg.HEARTBEAT_INTERVAL_MS
    group_consumer_session_timeout_ms: int = cg.SESSION_TIMEOUT_MS
    # How __consumer_offsets records are written: "kafka" (Kafka's layouts, what tools read) or "brook" (the
    # earlier protobuf values, which a release before the Kafka layouts reads: set while one still runs).
    record_format: str = "kafka"

    @classmethod
    def from_defaults(cls, defaults: dict[str, str]) -> CoordinatorConfig:
        """From the broker's defaults (Kafka key names)."""
        def get(key: str, fallback: int) -> int:
            return int_setting(defaults, key, fallback)

        base = cls()
        return cls(
            offsets_topic_num_partitions=get("offsets.topic.num.partitions", base.offsets_topic_num_partitions),
            offsets_topic_replication_factor=get("offsets.topic.replication.factor",
                                                 base.offsets_topic_replication_factor),
            offsets_topic_segment_bytes=get("offsets.topic.segment.bytes", base.offsets_topic_segment_bytes),
            offsets_retention_minutes=get("offsets.retention.minutes", base.offsets_retention_minutes),
            offsets_retention_check_interval_ms=get("offsets.retention.check.interval.ms",
                                                    base.offsets_retention_check_interval_ms),
            offsets_commit_timeout_ms=get("offsets.commit.timeout.ms", base.offsets_commit_timeout_ms),
            offset_metadata_max_bytes=get("offset.metadata.max.bytes", base.offset_metadata_max_bytes),
            group_initial_rebalance_delay_ms=get("group.initial.rebalance.delay.ms",
                                                 base.group_initial_rebalance_delay_ms),
            group_min_session_timeout_ms=get("group.min.session.timeout.ms", base.group_min_session_timeout_ms),
            group_max_session_timeout_ms=get("group.max.session.timeout.ms", base.group_max_session_timeout_ms),
            group_member_metadata_max_bytes=get("group.member.metadata.max.bytes",
                                                base.group_member_metadata_max_bytes),
            group_coordinator_metadata_max_bytes=get("group.coordinator.metadata.max.bytes",
                                                     base.group_coordinator_metadata_max_bytes),
            group_coordinator_offsets_max_bytes=get("group.coordinator.offsets.max.bytes",
                                                    base.group_coordinator_offsets_max_bytes),
            group_coordinator_metadata_max_bytes_per_ip=get("group.coordinator.metadata.max.bytes.per.ip",
                                                            base.group_coordinator_metadata_max_bytes_per_ip),
            group_coordinator_offsets_max_bytes_per_ip=get("group.coordinator.offsets.max.bytes.per.ip",
                                                           base.group_coordinator_offsets_max_bytes_per_ip),
            group_lag_metrics_max_series=get("group.lag.metrics.max.series", base.group_lag_metrics_max_series),
            group_consumer_heartbeat_interval_ms=get("group.consumer.heartbeat.interval.ms",
                                                     base.group_consumer_heartbeat_interval_ms),
            group_consumer_session_timeout_ms=get("group.consumer.session.timeout.ms",
                                                  base.group_consumer_session_timeout_ms),
            record_format=defaults.get("group.coordinator.record.format") or base.record_format,
        )


@dataclass(frozen=True)
class GroupOffsetStats:
    group: str
    topic: str
    partition: int
    committed_offset: int
    log_end_offset: int  # -1 when not known yet
    lag: int  # -1 when not known yet


@dataclass(frozen=True)
class GroupCoordinatorStats:
    groups_by_state: dict[str, int]  # classic groups
    offsets: list[GroupOffsetStats]  # at most group.lag.metrics.max.series, the largest lags first
    loaded_partitions: int
    loading_partitions: int
    offsets_left_out: int = 0  # group-partition rows with a known lag not in ``offsets``
    consumer_groups_by_state: dict[str, int] = field(default_factory=dict)  # KIP-848's
    consumer_group_members: int = 0


@dataclass
class _PartitionLoad:
    leader_epoch: int
    loaded: bool = False
    # Transaction markers written while the partition loads, past what the load reads: (producer id, commit),
    # applied to the loaded transactions' offsets when it is published.
    markers: list[tuple[int, bool]] = field(default_factory=list)


@dataclass
class _Waiter:
    """A gRPC handler thread blocked until the group machine answers."""

    event: threading.Event = field(default_factory=threading.Event)
    result: Any = None

    def __call__(self, result: Any) -> None:
        self.result = result
        self.event.set()


def join_timed_out(req: group_pb2.JoinGroupRequest) -> JoinResult:
    return JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, req.member_id,
                      error_message="join phase did not end before the request deadline")


def sync_timed_out() -> SyncResult:
    return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS, error_message="leader did not sync in time")


class GroupTimers:
    """The coordinator's timers, deadline-ordered: a tick costs O(groups due + groups changed since the
    previous tick + log n), not O(groups).

    Each tick used to ask every group for its next deadline, ten times a second under the coordinator's
    lock: 26 ms a tick with 20,000 groups holding only offsets (nothing scheduled, so asked afresh each
    time; the audit saw 70 ms), 1.9 ms with 20,000 Stable ones. Now a heap holds one (deadline, entry, group) entry per group with
    something scheduled, at a time no later than the group's next deadline (``Group.next_deadline_ms``);
    a tick pops the entries that came due, asks those groups (a group whose deadline moved later, as
    heartbeats move it, answers its real one and is put back), and ticks the ones really due, each at most
    once a tick, as before. A group that may have a deadline earlier than its entry (anything but a
    heartbeat or a commit: ``Group.deadline_listener``) is asked again on the next tick: its entry is
    replaced when the new deadline is earlier. Replaced entries and those of groups removed stay in the
    heap until popped (lazy invalidation); when they outnumber the live ones twice over, the heap is rebuilt
    from the live ones (O(n), after at least 2n replacements), so it stays within 3x the scheduled groups.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str, Group]] = []  # (deadline ms, entry number, group id, group)
        self._scheduled: dict[str, tuple[int, int, Group]] = {}  # group id -> its live entry: (number, deadline, group)
        self._changed: dict[str, Group] = {}  # asked again on the next tick
        self._next_entry = 0
        # For tests and stats: groups asked for their deadline by ticks, heap rebuilds.
        self.visits = 0
        self.rebuilds = 0

    def watch(self, g: Group) -> None:
        """A group the coordinator now holds: asked on the next tick, and whenever its deadlines may move earlier."""
        g.deadline_listener = self._on_change
        self._changed[g.group_id] = g

    def unwatch(self, g: Group) -> None:
        """A group the coordinator no longer holds (its entry, if any, goes stale)."""
        g.deadline_listener = None
        self._changed.pop(g.group_id, None)
        entry = self._scheduled.get(g.group_id)
        if entry is not None and entry[2] is g:
            del self._scheduled[g.group_id]

    def clear(self) -> None:
        """Forget every entry (the coordinator holds no group any more)."""
        self._heap, self._scheduled, self._changed = [], {}, {}

    def _on_change(self, g: Group) -> None:
        self._changed[g.group_id] = g

    def due(self, now_ms: int, groups: dict[str, Group]) -> list[Group]:
        """Schedule the changed groups, then take (off the heap) the held groups whose entries came due."""
        self.schedule_changed(now_ms, groups)
        out: list[Group] = []
        heap, scheduled = self._heap, self._scheduled
        while heap and heap[0][0] <= now_ms:  # bounded: each turn pops one entry
            _, number, gid, g = heapq.heappop(heap)
            entry = scheduled.get(gid)
            if entry is None or entry[0] != number:
                continue  # replaced, or the group was removed
            del scheduled[gid]
            if groups.get(gid) is g:
                out.append(g)
        self.visits += len(out)
        return out

    def schedule_changed(self, now_ms: int, groups: dict[str, Group]) -> None:
        changed, self._changed = self._changed, {}
        self.visits += len(changed)
        for gid, g in changed.items():
            if groups.get(gid) is not g:
                continue
            deadline = g.next_deadline_ms(now_ms)
            if deadline is None:
                continue  # nothing scheduled (an entry it has is stale-safe: asked, it answers None)
            entry = self._scheduled.get(gid)
            if entry is not None and entry[2] is g and entry[1] <= deadline:
                continue  # its entry comes no later: it is asked then
            self._next_entry += 1
            self._scheduled[gid] = (self._next_entry, deadline, g)
            heapq.heappush(self._heap, (deadline, self._next_entry, gid, g))
        if len(self._heap) > 3 * len(self._scheduled) + 64:  # stale > 2 x live
            self._heap = [(d, n, g.group_id, g) for n, d, g in self._scheduled.values()]
            heapq.heapify(self._heap)
            self.rebuilds += 1

    def sizes(self) -> tuple[int, int]:
        """(heap entries, live entries)."""
        return len(self._heap), len(self._scheduled)


class _GroupTable(dict[str, Group]):
    """The coordinator's groups by id: a group put in is watched by the timers, one taken out is not."""

    def __init__(self, timers: GroupTimers) -> None:
        super().__init__()
        self._timers = timers

    def __setitem__(self, group_id: str, g: Group) -> None:
        old = self.get(group_id)
        if old is not None and old is not g:
            self._timers.unwatch(old)
        super().__setitem__(group_id, g)
        self._timers.watch(g)

    def __delitem__(self, group_id: str) -> None:
        self._timers.unwatch(self[group_id])
        super().__delitem__(group_id)

    def pop(self, group_id: str, *default: Any) -> Any:  # type: ignore[override]
        if group_id not in self:
            return super().pop(group_id, *default)
        g = super().pop(group_id)
        self._timers.unwatch(g)
        return g

    def clear(self) -> None:
        for g in self.values():
            g.deadline_listener = None
        self._timers.clear()
        super().clear()

    def update(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise TypeError("_GroupTable: put groups one by one")

    setdefault = popitem = update  # type: ignore[assignment]


class CoordinatorError(errors.BrookError):
    """Carries the code a group request is answered with (NOT_COORDINATOR, ...)."""


# Bound on the members' metadata and assignments one DescribeGroups answer carries (each group
# id a request names is described again): 1,000 ids of one 10 MiB group would have built 10 GiB.
DESCRIBE_ANSWER_MAX_BYTES = 32 << 20
# Bound on what all DescribeGroups answers being built at once carry: each call's is bounded above,
# but the calls run on the group executor's threads side by side, and 32 of them were 1 GiB. A group
# whose description does not fit what is left is answered COORDINATOR_LOAD_IN_PROGRESS (retriable:
# Kafka's admin clients and Brook's retry it), never waited for on an executor thread.
DESCRIBE_INFLIGHT_MAX_BYTES = 2 * DESCRIBE_ANSWER_MAX_BYTES


def steady_wall_clock() -> Callable[[], int]:
    """A clock in milliseconds since the epoch that never steps: the wall clock as read now, moved on by the
    monotonic clock since. The group machine measures its deadlines (members' sessions, rebalances, pending
    members) and its timestamps (commits, empty-since for offsets retention) with it. On the wall clock, a
    step forward (NTP after a VM resume, an operator) expired every member's session at once, and every
    group rebalanced; a step back kept a dead member's partitions assigned, unread, for as long as the step
    (Kafka's coordinator times sessions on a monotonic clock too). Timestamps written stay within the steps
    the wall clock took since the broker started of the wall clock's: nothing for offsets retention's days."""
    wall_s, steady_s = time.time(), time.monotonic()
    return lambda: int((wall_s + time.monotonic() - steady_s) * 1000)


class GroupCoordinator:
    """Owns the groups of the ``__consumer_offsets`` partitions this broker leads."""

    def __init__(self, *, node_id: int, replica_manager: Any, metadata_cache: Any, config: CoordinatorConfig,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self.node_id = node_id
        self.replica_manager = replica_manager
        self.metadata_cache = metadata_cache
        self.config = config
        self.clock_ms = clock_ms or steady_wall_clock()
        self.security = SecurityConfig()  # how to reach other brokers; install() sets the node's own
        self._lock = threading.RLock()
        self._describe_lock = threading.Lock()
        self._describing_bytes = 0  # of DescribeGroups answers being built and sent (DESCRIBE_INFLIGHT_MAX_BYTES)
        self.timers = GroupTimers()  # sessions, join and sync deadlines, deadline-ordered
        self._groups: dict[str, Group] = _GroupTable(self.timers)
        self._partitions: dict[int, _PartitionLoad] = {}
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="group-loader")
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._maintenance: threading.Thread | None = None
        self._offsets_topic_short = ThrottledWarning(log)
        self.offsets_topic = InternalTopic(
            OFFSETS_TOPIC, metadata_cache, replica_manager, partitions=config.offsets_topic_num_partitions,
            replication_factor=config.offsets_topic_replication_factor, partitions_key="offsets.topic.num.partitions",
            configs=lambda rf: {"cleanup.policy": "compact", "segment.bytes": str(config.offsets_topic_segment_bytes),
                                "compression.type": "producer"},
            on_short=lambda message: self._offsets_topic_short.warn("%s", message))
        self._channels: dict[str, grpc.Channel] = {}
        self._end_offsets: dict[TopicPartition, int] = {}
        self._writes: set[concurrent.futures.Future] = set()
        self._group_writes: dict[str, tuple[int, concurrent.futures.Future]] = {}  # group -> (generation, write)
        self._writes_max = 10_000
        # Members' metadata and assignments held (see _admit_bytes_locked): counted afresh at most
        # once a second, what came in since added on top.
        self._held_bytes = 0
        self._held_by_host: dict[str, int] = {}  # the same by the members' client addresses
        self._held_counted_at = float("-inf")
        # What committed offsets and groups hold (group_coordinator_offsets_max_bytes): an upper bound, what was
        # admitted added to the last count, counted again only when it would refuse (_admit_offsets_locked).
        self._offset_bytes = 0
        self._offset_bytes_by_owner: dict[str, int] = {}  # the same, over the groups each client address made
        self._offsets_in_flight: dict[str, int] = {}  # admitted, not applied yet: by owner, "" for all
        self._offsets_counted_at = float("-inf")
        # Refusals a client's requests earn: a line every 10 s at most, each (broker/log_limits.py).
        self._offset_refusals = ThrottledWarning(log)
        self._member_refusals = ThrottledWarning(log)
        self._describe_refusals = ThrottledWarning(log)
        # Topics the metadata deleted (name, when this broker saw it), waiting for the maintenance thread to
        # drop the groups' offsets of them (on_topics_deleted).
        self._deleted_lock = threading.Lock()
        self._deleted_topics: list[tuple[str, int]] = []
        self._unknown_at_last_sweep: set[str] = set()  # topics with offsets the metadata did not know then
        # Groups of Kafka's consumer protocol (KIP-848), beside the classic ones: a group id is one or the other
        # while it has members. Their offsets are kept as the classic groups' are (a Group of no members).
        self.consumer_groups = cg.ConsumerGroups(
            self._consumer_topic, members_max=MEMBERS_MAX,
            session_timeout_ms=config.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms, on_emptied=self._consumer_emptied_at,
            metadata_version=lambda: getattr(self.metadata_cache, "version", 0),
            topic_count=lambda: self.metadata_cache.counts()[0] if hasattr(self.metadata_cache, "counts") else 0,
            topic_names=self._consumer_topic_names)
        self._consumer_expired_at = 0
        # group id -> when its last consumer-protocol member left, for the groups holding offsets (so bounded by
        # them): their offsets' retention counts from then, as Kafka's does for a group that became empty.
        self._consumer_emptied: dict[str, int] = {}
        # Offsets committed within a transaction (TxnOffsetCommit), written but not visible until its COMMIT marker
        # (then applied) or ABORT marker (then dropped) lands on the partition: (partition, producer id) -> group ->
        # its partitions' offsets. Bounded by TXN_PENDING_OFFSETS_MAX entries in all.
        self._txn_pending: dict[tuple[int, int], dict[str, dict[TopicPartition, OffsetEntry]]] = {}
        self._txn_pending_count = 0
        self._txn_write_lock = threading.Lock()  # one transactional offsets append at a time (their sequences)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.replica_manager.add_leadership_listener(self.on_leadership_change)
        listeners = getattr(self.replica_manager, "marker_listeners", None)
        if listeners is not None:
            listeners.append(self.on_marker)
        add_deleted_listener = getattr(self.metadata_cache, "add_deleted_topics_listener", None)
        if add_deleted_listener is not None:
            add_deleted_listener(self.on_topics_deleted)
        self._ticker = threading.Thread(target=self._run_timers, name="group-timers", daemon=True)
        self._ticker.start()
        self._maintenance = threading.Thread(target=self._run_maintenance, name="group-maintenance", daemon=True)
        self._maintenance.start()

    def stop(self) -> None:
        self._stop.set()
        for t in (self._ticker, self._maintenance):
            if t is not None:
                t.join(timeout=5)
        self._loader.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            now = self.clock_ms()
            for g in self._groups.values():
                g.mark_dead(now)
            self._groups.clear()
            self._partitions.clear()
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    # ------------------------------------------------------------------ leadership
    def on_leadership_change(self, topic: str, partition: int, is_leader: bool, leader_epoch: int) -> None:
        if topic != OFFSETS_TOPIC:
            return
        with self._lock:
            current = self._partitions.get(partition)
            if is_leader:
                if current is not None and current.leader_epoch == leader_epoch:
                    return
                self._unload_locked(partition)
                self._partitions[partition] = _PartitionLoad(leader_epoch)
            else:
                self._unload_locked(partition)
                return
        if not self._stop.is_set():
            log.info("loading groups of %s-%d (leader epoch %d)", OFFSETS_TOPIC, partition, leader_epoch)
            try:
                self._loader.submit(self._load_partition, partition, leader_epoch)
            except RuntimeError:
                log.debug("loader stopped; not loading %s-%d", OFFSETS_TOPIC, partition)

    def _unload_locked(self, partition: int) -> None:
        if self._partitions.pop(partition, None) is None:
            return
        now = self.clock_ms()
        for gid in [gid for gid, g in self._groups.items() if self._partition_of(g) == partition]:
            self._groups.pop(gid).mark_dead(now)
            self._group_writes.pop(gid, None)
        self.consumer_groups.drop_partition(partition)
        for key in [k for k in self._txn_pending if k[0] == partition]:
            self._txn_pending_count -= sum(map(len, self._txn_pending.pop(key).values()))
        log.info("unloaded groups of %s-%d", OFFSETS_TOPIC, partition)

    def _still_leader(self, partition: int, leader_epoch: int) -> bool:
        state = self._partitions.get(partition)
        return state is not None and state.leader_epoch == leader_epoch

    def _load_partition(self, partition: int, leader_epoch: int) -> None:
        """Replay the partition into fresh groups, then publish them (all at once)."""
        try:
            consumer: dict[str, cg.ConsumerGroup] = {}
            pending: dict[int, dict[str, dict[TopicPartition, OffsetEntry]]] = {}
            loaded = self._read_partition(partition, leader_epoch, consumer, pending)
        except errors.BrookError as exc:
            log.warning("loading %s-%d failed: %s; will retry on the next leadership change",
                        OFFSETS_TOPIC, partition, exc)
            with self._lock:
                if self._still_leader(partition, leader_epoch):
                    self._partitions.pop(partition, None)
            # A disk that refuses the read fails its log directory, which stops the broker, as any
            # other read or write of it would: the partition's leadership, and its groups, move to
            # a replica that can read them. Left leading, this broker would answer the groups'
            # members NOT_COORDINATOR, and FindCoordinator would send them back to it, for good.
            hosted = self.replica_manager.partition(OFFSETS_TOPIC, partition)
            if hosted is not None:
                self.replica_manager.log_manager.dir_failed(hosted.log.dir, exc)
            return
        if loaded is None:
            return
        for g in loaded.values():  # what members subscribe to, parsed once (OffsetDelete), before the lock
            records.parse_member_subscriptions(g)
        with self._lock:
            if not self._still_leader(partition, leader_epoch):
                return
            for gid, g in loaded.items():
                self._groups[gid] = g
            for pid, by_group in pending.items():
                self._txn_pending[(partition, pid)] = by_group
                self._txn_pending_count += sum(map(len, by_group.values()))
            self._partitions[partition].loaded = True
            for pid, commit in self._partitions[partition].markers:
                self._end_txn_offsets_locked(partition, pid, commit)
            self._partitions[partition].markers.clear()
            now = self.clock_ms()
            taken = 0
            for cgroup in consumer.values():
                if cgroup.members and self._classic_with_members_locked(cgroup.group_id) is None:
                    self.consumer_groups.restore(cgroup, now)
                    taken += 1
            self._partitions[partition].loaded = True
        log.info("loaded %d groups from %s-%d (%d of Kafka's consumer protocol with members)", len(loaded),
                 OFFSETS_TOPIC, partition, taken)

    def _read_partition(self, partition: int, leader_epoch: int,
                        consumer: dict[str, cg.ConsumerGroup] | None = None,
                        pending: dict[int, dict[str, dict[TopicPartition, OffsetEntry]]] | None = None
                        ) -> dict[str, Group] | None:
        """Read the partition from its log start to the log end offset it had at election; its groups of Kafka's
        consumer protocol into ``consumer``.

        The leader's log is authoritative (a leader never truncates), so the load reads up
        to the log end, not the HW: a commit acked by the old ISR may sit above this
        leader's HW until its followers fetch again, and must not be lost (as in Kafka)."""
        hosted = self.replica_manager.partition(OFFSETS_TOPIC, partition)
        if hosted is None or not hosted.is_leader:
            return None
        lg = hosted.log
        groups: dict[str, Group] = {}
        owners: dict[str, str] = {}  # the groups' owner records, applied when the whole partition is read
        now = self.clock_ms()
        offset, target = lg.log_start_offset, lg.log_end_offset
        for _ in range(LOAD_BATCHES_MAX):
            if offset >= target:
                break
            with self._lock:
                if self._stop.is_set() or not self._still_leader(partition, leader_epoch):
                    return None
            try:
                data = lg.read(offset, LOAD_READ_BYTES, max_offset=target)
            except errors.OffsetOutOfRangeError:
                offset = lg.log_start_offset  # retention/compaction moved the start meanwhile
                continue
            except errors.BrookError as exc:
                past = self._past_corrupt_batch(hosted, exc, partition, offset, target)
                if past is None:
                    raise
                offset = past
                continue
            if not data.records:
                break
            offset = self._apply_batches(data.records, groups, now, offset, partition, owners, consumer, pending)
        for gid, owner in owners.items():  # a group's owner record may come before the records that make it
            g = groups.get(gid)
            if g is not None:
                g.owner, g.owner_recorded = owner, True
        return groups

    def _past_corrupt_batch(self, hosted: Any, exc: errors.BrookError, partition: int, offset: int,
                            target: int) -> int | None:
        """Where the load goes on after a batch that fails its CRC, or None to fail it (``_load_partition``).

        With other replicas in sync, the replica manager marks the batch to be cut and fetched back, and fails
        this leader's log directory: they take the groups over (None). As the only replica in sync the broker
        keeps leading (stopping would only start it again on the same bytes, at each election), and the load
        goes on after the batch, as Kafka's coordinator goes on with what it could load: the offsets and group
        records in that batch are lost, an ERROR says which. A batch whose header cannot be walked either ends
        the load there (``target``): the groups are served as loaded so far, as when the offset after the batch
        (from its damaged header) would not move the load past ``offset``."""
        corrupt = disk_failure(exc)
        if not isinstance(corrupt, CorruptBatchError) or \
                not self.replica_manager.corrupt_batch_found(hosted, corrupt, "the group coordinator's load"):
            return None
        if corrupt.next_offset is None or corrupt.next_offset <= offset:
            log.error("loading %s-%d: the batch headers from offset %d cannot be walked and are on no other replica: "
                      "the groups are served as loaded up to there", OFFSETS_TOPIC, partition, corrupt.base_offset)
            return target
        log.error("loading %s-%d: skipping offsets %d to %d, which fail their CRC and are on no other replica: the "
                  "commits and group changes in them are lost", OFFSETS_TOPIC, partition, corrupt.base_offset,
                  corrupt.next_offset - 1)
        return corrupt.next_offset

    def _apply_batches(self, buf: bytes, groups: dict[str, Group], now_ms: int, offset: int,
                       partition: int = -1, owners: dict[str, str] | None = None,
                       consumer: dict[str, cg.ConsumerGroup] | None = None,
                       pending: dict[int, dict[str, dict[TopicPartition, OffsetEntry]]] | None = None) -> int:
        """Replay batches into ``groups`` (and the others). Offsets in a transactional batch go to ``pending`` under
        its producer id until that producer's COMMIT marker (applied then) or ABORT marker (dropped)."""
        if pending is None:
            pending = {}
        for pos, header in iter_batches(buf):
            offset = header.next_offset
            if header.is_control:
                if header.producer_id >= 0:
                    try:
                        marker = end_txn_marker(buf, pos)
                    except errors.BrookError as exc:
                        log.warning("%s-%d: unreadable control batch at offset %d: %s", OFFSETS_TOPIC, partition,
                                    header.base_offset, exc)
                        marker = None
                    by_group = pending.pop(header.producer_id, None)
                    if marker is not None and marker[0] == CONTROL_TYPE_COMMIT and by_group:
                        for gid, entries in by_group.items():
                            g = groups.get(gid)
                            if g is None:
                                g = groups[gid] = self._new_group(gid, partition)
                            for tp, entry in entries.items():
                                g.apply_offset(tp, entry)
                continue
            _, recs = decode_batch(buf, pos)
            for rec in recs:
                try:
                    parsed = records.parse_record(rec.key, rec.value, rec.offset)
                except errors.CorruptMessageError as exc:
                    log.warning("skipping: %s", exc)
                    continue
                if header.is_transactional:
                    if isinstance(parsed, OffsetRecord) and parsed.entry is not None:
                        parsed.entry.log_offset = rec.offset
                        pending.setdefault(header.producer_id, {}).setdefault(parsed.group_id, {})[parsed.tp] = \
                            parsed.entry
                    continue
                if isinstance(parsed, OffsetRecord):
                    g = groups.get(parsed.group_id)
                    if g is None:
                        if parsed.entry is None:
                            continue
                        g = groups[parsed.group_id] = self._new_group(parsed.group_id, partition, parsed.owner)
                    elif parsed.owner and not g.owner:
                        g.owner = parsed.owner
                    g.apply_offset(parsed.tp, parsed.entry)
                elif isinstance(parsed, GroupRecord):
                    if parsed.value is None:
                        groups.pop(parsed.group_id, None)
                        continue
                    g = groups.get(parsed.group_id) or self._new_group(parsed.group_id, partition)
                    groups[parsed.group_id] = g
                    records.restore_group(g, parsed.value, now_ms)
                elif isinstance(parsed, OwnerRecord) and owners is not None:
                    if parsed.owner is None:
                        owners.pop(parsed.group_id, None)
                    else:
                        owners[parsed.group_id] = parsed.owner
                elif isinstance(parsed, records.ConsumerGroupRecord) and consumer is not None:
                    if parsed.value is None:
                        consumer.pop(parsed.group_id, None)
                        continue
                    cgroup = consumer.setdefault(parsed.group_id, cg.ConsumerGroup(parsed.group_id, partition))
                    cgroup.epoch, cgroup.assignment_epoch = parsed.value.epoch, parsed.value.assignment_epoch
                    cgroup.topics = records.consumer_group_topics(parsed.value)
                elif isinstance(parsed, records.ConsumerMemberRecord) and consumer is not None:
                    cgroup = consumer.setdefault(parsed.group_id, cg.ConsumerGroup(parsed.group_id, partition))
                    if parsed.value is None:
                        cgroup.members.pop(parsed.member_id, None)
                        cgroup.target.pop(parsed.member_id, None)
                    else:
                        member, target = records.restore_consumer_member(parsed.member_id, parsed.value)
                        cgroup.members[member.member_id] = member
                        cgroup.target[member.member_id] = target
        return offset

    def _new_group(self, group_id: str, partition: int = -1, owner: str = "") -> Group:
        """A new group of ``__consumer_offsets`` partition ``partition`` (-1: hash its id now), made by a call
        from client address ``owner``."""
        return Group(group_id, initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms,
                     state_timestamp_ms=self.clock_ms(),
                     offsets_partition=partition if partition >= 0 else self.partition_for(group_id), owner=owner)

    # ------------------------------------------------------------------ lookup
    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self.config.offsets_topic_num_partitions)

    def _partition_of(self, g: Group) -> int:
        """The group's offsets partition: kept on the group when it was made (hashed once)."""
        if g.offsets_partition < 0:  # a group made elsewhere (a test's): hash once, then keep
            g.offsets_partition = self.partition_for(g.group_id)
        return g.offsets_partition

    @staticmethod
    def _check_group_id(group_id: str) -> None:
        """A group id a request names: not empty, and within GROUP_ID_MAX before it is hashed."""
        if not group_id:
            raise CoordinatorError("group id must not be empty", code=ErrorCode.INVALID_GROUP_ID)
        if len(group_id) > GROUP_ID_MAX:
            raise CoordinatorError(f"group id of {len(group_id)} characters, longer than {GROUP_ID_MAX}",
                                   code=ErrorCode.INVALID_GROUP_ID)

    def _check_owner_locked(self, group_id: str) -> int:
        self._check_group_id(group_id)
        p = self.partition_for(group_id)
        state = self._partitions.get(p)
        if state is None:
            raise CoordinatorError(f"broker {self.node_id} does not lead {OFFSETS_TOPIC}-{p}",
                                   code=ErrorCode.NOT_COORDINATOR)
        if not state.loaded:
            raise CoordinatorError(f"loading {OFFSETS_TOPIC}-{p}", code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        return p

    def _group_locked(self, group_id: str, *, create: bool, owner: str = "") -> Group | None:
        p = self._check_owner_locked(group_id)
        g = self._groups.get(group_id)
        if g is None and create:
            g = self._groups[group_id] = self._new_group(group_id, p, owner)
        return g

    # ------------------------------------------------------------------ FindCoordinator
    def find_coordinator(self, group_id: str, listener: str = "BROKER") -> tuple[int, str, int]:
        self._check_group_id(group_id)
        return self.offsets_topic.coordinator(self.partition_for(group_id), f"group {group_id}", listener)

    # ------------------------------------------------------------------ membership
    def _validate_session(self, session_timeout_ms: int) -> None:
        low, high = self.config.group_min_session_timeout_ms, self.config.group_max_session_timeout_ms
        if not low <= session_timeout_ms <= high:
            raise CoordinatorError(f"session timeout {session_timeout_ms} ms is outside [{low}, {high}]",
                                   code=ErrorCode.INVALID_SESSION_TIMEOUT)

    def join_group(self, req: group_pb2.JoinGroupRequest, wait_s: float) -> JoinResult:
        waiter = _Waiter()
        self.start_join(req, waiter)
        if not waiter.event.wait(timeout=max(0.0, wait_s)):
            return join_timed_out(req)
        return waiter.result

    def start_join(self, req: group_pb2.JoinGroupRequest, callback: Callable[[JoinResult], None]) -> None:
        """Register a join; ``callback`` gets the JoinResult when the join phase ends (from whichever
        thread ends it), so a caller can wait without holding a thread (broker/group_service.py)."""
        self._validate_session(req.session_timeout_ms)
        if len(req.group_instance_id) > GROUP_INSTANCE_ID_MAX:
            raise CoordinatorError(f"group instance id longer than {GROUP_INSTANCE_ID_MAX} characters",
                                   code=ErrorCode.INVALID_REQUEST)
        if len(req.protocols) > MEMBER_PROTOCOLS_MAX:
            raise CoordinatorError(f"{len(req.protocols)} protocols offered, at most {MEMBER_PROTOCOLS_MAX}",
                                   code=ErrorCode.INVALID_REQUEST)
        if any(len(p.name) > PROTOCOL_TYPE_MAX for p in req.protocols):
            # The chosen one is a string of the group's record (Kafka's layout: an int16 length); assignor names
            # are a few characters.
            raise CoordinatorError(f"a protocol name longer than {PROTOCOL_TYPE_MAX} characters",
                                   code=ErrorCode.INVALID_REQUEST)
        _check_lengths(("client id", req.client_id, CLIENT_ID_MAX), ("client host", req.client_host, CLIENT_ID_MAX),
                       ("protocol type", req.protocol_type, PROTOCOL_TYPE_MAX),
                       ("member id", req.member_id, CLIENT_ID_MAX + _UUID_SUFFIX))
        rebalance_timeout_ms = req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else req.session_timeout_ms
        metadata = sum(len(p.name) + len(p.metadata) for p in req.protocols)
        self._check_member_bytes(metadata, "protocol metadata")
        # The member's (or pending member's) ids count with its metadata: a client id is kept in its
        # member id and as itself until the session ends.
        ids = len(req.client_id) + _UUID_SUFFIX + len(req.client_id) + len(req.client_host) + len(req.group_instance_id)
        protocols = [(p.name, p.metadata) for p in req.protocols]
        # What a consumer's metadata subscribes to, parsed once here (before the lock) and kept with the
        # member: OffsetDelete reads the sets. A join without a member id or an instance id only gets an id
        # (MEMBER_ID_REQUIRED), so its metadata is not parsed.
        subscriptions = (records.parse_subscriptions(req.protocol_type, protocols)
                         if req.member_id or req.group_instance_id else NO_SUBSCRIPTIONS)
        with self._lock:
            joining = MEMBER_OVERHEAD_BYTES + metadata + ids + subscriptions.held_bytes
            self._admit_bytes_locked(joining, "JoinGroup", {req.client_host: joining})
            self._check_owner_locked(req.group_id)
            if (active := self.consumer_groups.active(req.group_id)) is not None:
                raise CoordinatorError(f"group {req.group_id} has {len(active.members)} members of the consumer "
                                       "protocol (KIP-848): a classic member cannot join it",
                                       code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            g = self._group_locked(req.group_id, create=True, owner=req.client_host)
            assert g is not None
            g.join(member_id=req.member_id, client_id=req.client_id, client_host=req.client_host,
                   session_timeout_ms=req.session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
                   protocol_type=req.protocol_type, protocols=protocols, callback=callback, now_ms=self.clock_ms(),
                   group_instance_id=req.group_instance_id, subscriptions=subscriptions, reason=req.reason)
            self._after_change_locked(g)

    def _check_member_bytes(self, n: int, what: str) -> None:
        if n > self.config.group_member_metadata_max_bytes:
            raise CoordinatorError(f"{what} of {n} bytes is over group.member.metadata.max.bytes "
                                   f"({self.config.group_member_metadata_max_bytes})", code=ErrorCode.INVALID_REQUEST)

    def _admit_bytes_locked(self, incoming: int, what: str, by_host: dict[str, int] | None = None) -> None:
        """Refuse (retriable COORDINATOR_NOT_AVAILABLE) what would take the members' metadata and
        assignments (and the topics parsed from consumers' metadata, Member.subscriptions) this
        coordinator holds past group.coordinator.metadata.max.bytes, or what the members at one client
        address hold past group.coordinator.metadata.max.bytes.per.ip (``by_host``: the incoming bytes by
        the address of the members they are for). They stay in memory for as long as their members'
        sessions (up to group.max.session.timeout.ms), so without a bound a client joining many groups
        with large metadata grows the broker without end; and with the first bound alone, one address's
        members filled it (295 members of 900 KB) and other addresses' joins were refused for as long as
        those sessions lasted. Counted afresh at most once a second (members leave and expire in many
        places), what was admitted since on top; each group keeps its members' sums, in all and by
        address, so a count is one step a group and address (a walk over every member took 0.4 s a count
        with the 500,000 members the bound allows)."""
        now = time.monotonic()
        if now - self._held_counted_at >= 1.0:
            total, hosts = 0, {}
            for g in list(self._groups.values()):
                total += (g.members.held_bytes + MEMBER_OVERHEAD_BYTES * len(g.members)
                          + PENDING_MEMBER_BYTES * len(g.pending_members))
                for host, (held, members) in g.members.held_by_host.items():
                    hosts[host] = hosts.get(host, 0) + held + MEMBER_OVERHEAD_BYTES * members
                for host, pending in g.pending_members.by_host.items():
                    hosts[host] = hosts.get(host, 0) + PENDING_MEMBER_BYTES * pending
            consumer_total, consumer_hosts = self.consumer_groups.held()
            total += consumer_total
            for host, (held, members) in consumer_hosts.items():
                hosts[host] = hosts.get(host, 0) + held + MEMBER_OVERHEAD_BYTES * members
            self._held_bytes, self._held_by_host = total, hosts
            self._held_counted_at = now
        limit = self.config.group_coordinator_metadata_max_bytes
        if self._held_bytes + incoming > limit:
            self._member_refusals.warn(
                "group coordinator %d refused a %s of %d bytes: members hold %d bytes of metadata, assignments "
                "and parsed subscriptions (group.coordinator.metadata.max.bytes=%d)",
                self.node_id, what, incoming, self._held_bytes, limit)
            raise CoordinatorError(f"the coordinator holds {self._held_bytes} bytes of group metadata "
                                   f"(group.coordinator.metadata.max.bytes={limit}); retry later",
                                   code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        share = self.config.group_coordinator_metadata_max_bytes_per_ip
        for host, n in (by_host or {}).items():
            if host and (held := self._held_by_host.get(host, 0)) + n > share:
                self._member_refusals.warn(
                    "group coordinator %d refused a %s of %d bytes for members at %s: they hold %d bytes "
                    "(group.coordinator.metadata.max.bytes.per.ip=%d)", self.node_id, what, n, host, held, share)
                raise CoordinatorError(f"members at {host} hold {held} bytes of group metadata on this coordinator "
                                       f"(group.coordinator.metadata.max.bytes.per.ip={share}); retry later",
                                       code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        self._held_bytes += incoming
        for host, n in (by_host or {}).items():
            if host:
                self._held_by_host[host] = self._held_by_host.get(host, 0) + n

    def sync_group(self, req: group_pb2.SyncGroupRequest, wait_s: float) -> SyncResult:
        waiter = _Waiter()
        answered = self.start_sync(req, waiter)
        if answered is not None:
            return answered
        if not waiter.event.wait(timeout=max(0.0, wait_s)):
            return sync_timed_out()
        return self.finish_sync(req, waiter.result)

    def start_sync(self, req: group_pb2.SyncGroupRequest,
                   callback: Callable[[SyncResult], None]) -> SyncResult | None:
        """Register a sync; an immediate answer, or None and ``callback`` gets the result later
        (then pass it through ``finish_sync``)."""
        if len(req.assignments) > MEMBERS_MAX:  # one a member at most: a longer list is not an assignment
            raise CoordinatorError(f"{len(req.assignments)} assignments, a group has at most {MEMBERS_MAX} members",
                                   code=ErrorCode.INVALID_REQUEST)
        for a in req.assignments:
            self._check_member_bytes(len(a.assignment), f"assignment of member {a.member_id!r}")
        assignments = {a.member_id: a.assignment for a in req.assignments}  # built before the lock is taken
        incoming = sum(len(a) for a in assignments.values())
        with self._lock:
            g = self._group_locked(req.group_id, create=False)
            if g is None:
                return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID, error_message="no such group")
            hosts: dict[str, int] = {}
            for member_id, assignment in assignments.items():
                if (m := g.members.get(member_id)) is not None:
                    hosts[m.client_host] = hosts.get(m.client_host, 0) + len(assignment)
            self._admit_bytes_locked(incoming, "SyncGroup", hosts)
            g.sync(member_id=req.member_id, generation_id=req.generation_id, assignments=assignments,
                   callback=callback, now_ms=self.clock_ms(), group_instance_id=req.group_instance_id,
                   protocol_type=req.protocol_type, protocol_name=req.protocol_name)
            self._after_change_locked(g)
        return None

    def finish_sync(self, req: group_pb2.SyncGroupRequest, result: SyncResult) -> SyncResult:
        """The group's sync answer, once its generation is durable (blocks on the write)."""
        if result.error_code == ErrorCode.NONE:
            result = self._await_group_write(req.group_id, req.generation_id, result)
        return result

    def _await_group_write(self, group_id: str, generation_id: int, result: SyncResult) -> SyncResult:
        """Hand out an assignment only once its generation is durable: otherwise a new
        coordinator could load the previous generation and issue the same number again,
        and stale members would pass generation fencing."""
        with self._lock:
            pending = self._group_writes.get(group_id)
        if pending is None or pending[0] != generation_id:
            return result
        try:
            with blocking():  # a wait, not work: its place on the group pool is another task's meanwhile
                pending[1].result(timeout=self._write_wait_s)
        except Exception as exc:  # any failure of the write means: not durable
            first = False  # the first member to see it says it; the others' answers say it to them
            with self._lock:
                g = self._group_locked(group_id, create=False)
                if g is not None:
                    first = g.persist_failed(generation_id, self.clock_ms(), str(exc))
                    self._after_change_locked(g)
            too_large = exc if isinstance(exc, errors.BrookError) and exc.code in _TOO_LARGE else None
            log.log(logging.WARNING if first else logging.DEBUG, "group %s generation %d not persisted (%s): %s",
                    group_id, generation_id, exc, "its metadata record is too large for " + OFFSETS_TOPIC
                    if too_large else "members must rejoin")
            if too_large is not None:
                # As Kafka's storeGroup: not retriable, the consumers' poll() raises it. Rejoining would
                # build the same record again.
                return SyncResult(ErrorCode.UNKNOWN_SERVER_ERROR, error_message=(
                    f"the group's metadata (every member's subscription and assignment) is too large to store "
                    f"in {OFFSETS_TOPIC}: {too_large.message}; the group needs fewer members or smaller "
                    "subscriptions"))
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS, error_message="group metadata not persisted")
        return result

    def heartbeat(self, group_id: str, member_id: str, generation_id: int, group_instance_id: str = "") -> int:
        with self._lock:
            g = self._group_locked(group_id, create=False)
            if g is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return g.heartbeat(member_id=member_id, generation_id=generation_id, now_ms=self.clock_ms(),
                               group_instance_id=group_instance_id)

    # ------------------------------------------------------------------ consumer protocol (KIP-848)
    def _consumer_topic(self, name: str) -> tuple[uuid.UUID, int] | None:
        topic = self.metadata_cache.topic(name)
        if topic is None or not topic.topic_id or topic.partition_count <= 0 or name.startswith("__"):
            return None
        try:
            return uuid.UUID(hex=topic.topic_id), topic.partition_count
        except ValueError:  # not an id a client can be told (the controller's are uuid4 hex): not assignable
            return None

    def _consumer_topic_names(self) -> list[str]:
        """The names a member's regular expression may match: every topic but the internal ones."""
        return [name for name in self.metadata_cache.topic_names() if not name.startswith("__")]

    def _consumer_emptied_at(self, group_id: str, now_ms: int) -> None:
        if group_id in self._groups:  # under the lock (called from consumer_groups' heartbeat and expiry)
            self._consumer_emptied[group_id] = now_ms

    def _classic_with_members_locked(self, group_id: str) -> Group | None:
        """The classic group of that id if it has members (or members to come): then it is no consumer group."""
        classic = self._groups.get(group_id)
        return classic if classic is not None and (classic.members or classic.pending_members) else None

    def consumer_group_heartbeat(self, hb: cg.Heartbeat,
                                 describable: cg.Describable | None = None) -> cg.HeartbeatAnswer:
        """A ConsumerGroupHeartbeat (consumer_groups.py). Raises CoordinatorError (NOT_COORDINATOR, ...) or
        consumer_groups.HeartbeatError; either way nothing changed. ``describable``: the topic names of those
        given that the caller may describe (what its regular expression may match); None: all."""
        _check_lengths(("member id", hb.member_id, CLIENT_ID_MAX + _UUID_SUFFIX),
                       ("instance id", hb.instance_id or "", GROUP_INSTANCE_ID_MAX),
                       ("rack id", hb.rack_id or "", GROUP_INSTANCE_ID_MAX), ("client id", hb.client_id, CLIENT_ID_MAX),
                       ("server assignor", hb.server_assignor or "", PROTOCOL_TYPE_MAX))
        names = hb.subscribed_topic_names or ()
        if any(len(n) > GROUP_INSTANCE_ID_MAX for n in names):
            raise CoordinatorError(f"a subscribed topic name longer than {GROUP_INSTANCE_ID_MAX} characters",
                                   code=ErrorCode.INVALID_REQUEST)
        subscription = sum(map(len, names)) + len(hb.subscribed_topic_regex or "")
        self._check_member_bytes(subscription, "subscription")
        # A pattern new to the group walks every topic name: not under the lock, which every group waits on.
        matched = self.consumer_groups.match(hb, describable, self.clock_ms())
        with self._lock:
            p = self._check_owner_locked(hb.group_id)
            if (classic := self._classic_with_members_locked(hb.group_id)) is not None:
                raise CoordinatorError(f"Group {hb.group_id} is not a consumer group: its "
                                       f"{len(classic.members)} members use the classic protocol",
                                       code=ErrorCode.GROUP_ID_NOT_FOUND)
            if hb.member_epoch == cg.JOIN_EPOCH or hb.subscribed_topic_names is not None or hb.subscribed_topic_regex:
                # A subscription is held for the member's session: admitted as a JoinGroup's metadata is.
                incoming = subscription + (MEMBER_OVERHEAD_BYTES if hb.member_epoch == cg.JOIN_EPOCH else 0)
                self._admit_bytes_locked(incoming, "ConsumerGroupHeartbeat", {hb.client_host: incoming})
            try:
                answer = self.consumer_groups.heartbeat(hb, p, self.clock_ms(), describable, matched)
            finally:
                writes = self._write_consumer_changes_locked()
        # As Kafka's coordinator: the answer goes out once what it changed is durable, so that a coordinator
        # taking over never has a member older than the member itself (which it would fence: a rebalance).
        self._await_consumer_writes(writes, hb.group_id)
        return answer

    def _write_consumer_changes_locked(self) -> list[concurrent.futures.Future]:
        """Append what the consumer-protocol groups changed (consumer_groups.take_changes), in order: deleted
        members, changed members with their targets, the group's epochs (or its tombstone when dropped)."""
        futures = []
        for group, members, removed, epochs in self.consumer_groups.take_changes():
            gid = group.group_id
            try:
                kvs: list[tuple[bytes, bytes | None]] = [(records.consumer_member_key(gid, mid), None) for mid in removed]
                kvs += [(records.consumer_member_key(gid, m.member_id),
                         records.encode_consumer_member(m, group.target.get(m.member_id, {}))) for m in members]
                if epochs:
                    kvs.append((records.consumer_group_key(gid),
                                None if group.dropped else records.encode_consumer_group(group)))
            except errors.BrookError as exc:  # a name past a record's length: the heartbeats bound every one
                log.error("consumer group %s: its records cannot be written: %s", gid, exc)
                continue
            for i in range(0, len(kvs), RECORDS_PER_BATCH_MAX):
                futures.append(self._append_async(group.partition, kvs[i : i + RECORDS_PER_BATCH_MAX],
                                                  f"consumer group {gid} epoch {group.epoch}"))
        return futures

    def _await_consumer_writes(self, writes: list[concurrent.futures.Future], group_id: str) -> None:
        """Wait for a heartbeat's writes; CoordinatorError if one failed (the member retries its heartbeat)."""
        for fut in writes:
            try:
                with blocking():  # a wait, not work (as _await_group_write)
                    fut.result(timeout=self._write_wait_s)
            except Exception as exc:  # any failure of the write: not durable
                code = (_commit_error(exc.code, too_large=ErrorCode.UNKNOWN_SERVER_ERROR)
                        if isinstance(exc, errors.BrookError) else ErrorCode.COORDINATOR_NOT_AVAILABLE)
                log.warning("consumer group %s: its state was not written to %s (%s): answering %s", group_id,
                            OFFSETS_TOPIC, exc, ErrorCode.Name(code))
                raise CoordinatorError(f"the group's state was not written: {exc}", code=code) from None

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> None:
        """OffsetFetch v9's member check (consumer_groups.validate_fetch): HeartbeatError when refused. A group this
        coordinator does not lead is left to the fetch, which answers it NOT_COORDINATOR."""
        with self._lock:
            try:
                self._check_owner_locked(group_id)
            except CoordinatorError:
                return
            self.consumer_groups.validate_fetch(group_id, member_id, member_epoch)

    def describe_consumer_group(self, group_id: str) -> dict[str, Any]:
        """ConsumerGroupDescribe's entry for one group (Kafka's field names; an error code and message
        instead of the group when it is not one of this coordinator's consumer-protocol groups)."""
        with self._lock:
            try:
                self._check_owner_locked(group_id)
            except CoordinatorError as exc:
                return {"group_id": group_id, "error_code": exc.code, "error_message": exc.message}
            group = self.consumer_groups.active(group_id)
            if group is None:
                message = (f"Group {group_id} is not a consumer group."
                           if self._classic_with_members_locked(group_id) is not None else f"Group {group_id} not found.")
                return {"group_id": group_id, "error_code": ErrorCode.GROUP_ID_NOT_FOUND, "error_message": message}
            names = {tid: name for name, (tid, _) in group.topics.items()}

            def partitions(assignment: cg.Assignment) -> dict[str, Any]:
                return {"topic_partitions": [
                    {"topic_id": t["topic_id"], "topic_name": names.get(t["topic_id"], ""),
                     "partitions": t["partitions"]} for t in cg.describe_assignment(assignment)]}
            return {
                "group_id": group_id, "error_code": 0, "group_state": group.state(),
                "group_epoch": group.epoch, "assignment_epoch": group.assignment_epoch,
                "assignor_name": cg.group_assignor(group),
                "members": [{
                    "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                    "member_epoch": m.epoch, "client_id": m.client_id, "client_host": m.client_host,
                    "subscribed_topic_names": sorted(m.topic_names), "subscribed_topic_regex": m.regex or None,
                    "assignment": partitions(m.assigned), "target_assignment": partitions(group.target.get(mid, {})),
                    "member_type": 1,  # the consumer protocol (v1)
                } for mid, m in sorted(group.members.items())]}

    def consumer_group_listing(self, states: set[str]) -> list[tuple[str, str]]:
        """(group id, state) of the consumer-protocol groups with members on the loaded partitions."""
        named = {s.lower() for s in states}
        listed = []
        with self._lock:
            loaded = {p for p, load in self._partitions.items() if load.loaded}
            for gid, g in self.consumer_groups.groups.items():
                if g.members and g.partition in loaded:
                    state = g.state()
                    if not named or state.lower() in named:
                        listed.append((gid, state))
        return listed

    def leave_group(self, group_id: str, members: Iterable[tuple[str, str]], reason: str = "") -> list[int]:
        """Each (member id, group instance id) leaves; an error code for each, in order. ``reason``: the client's,
        for the log."""
        members = list(members)
        if len(members) > MEMBERS_MAX:  # 1,000,000 made-up ids held the lock, every group's, for 3.4 s
            raise CoordinatorError(f"{len(members)} members named, a group has at most {MEMBERS_MAX}",
                                   code=ErrorCode.INVALID_REQUEST)
        with self._lock:
            g = self._group_locked(group_id, create=False)
            if g is None:
                return [ErrorCode.UNKNOWN_MEMBER_ID for _ in members]
            out = [g.leave(m, self.clock_ms(), gi, reason) for m, gi in members]
            self._after_change_locked(g)
            return out

    def _after_change_locked(self, g: Group) -> None:
        """Persist group metadata the machine marked as changed (best effort, ordered)."""
        if not g.persist_needed:
            return
        g.persist_needed = False
        try:
            encode = records.encode_group_value if self._kafka_records else records.encode_legacy_group_value
            kvs = [(records.group_key(g.group_id), encode(g))]
        except errors.BrookError as exc:  # a string past its record's length: the joins bound every one
            log.error("group %s generation %d: its record cannot be written: %s", g.group_id, g.generation_id, exc)
            return
        owner_record = self._kafka_records and bool(g.owner) and not g.owner_recorded
        if owner_record:
            kvs.append(records.owner_record(g.group_id, g.owner))
            g.owner_recorded = True
        fut = self._append_async(self._partition_of(g), kvs, f"group {g.group_id} generation {g.generation_id}")
        if owner_record:
            def unrecorded(f: concurrent.futures.Future) -> None:
                if f.cancelled() or f.exception() is not None:
                    g.owner_recorded = False  # not written after all: the group's next write or commit writes it
            fut.add_done_callback(unrecorded)
        if g.state == GroupState.STABLE:
            # SyncGroup answers of this generation wait for this write (see sync_group).
            self._group_writes[g.group_id] = (g.generation_id, fut)

    def _append_async(self, partition: int, kvs: list[tuple[bytes, bytes | None]],
                      what: str) -> concurrent.futures.Future:
        """Append without waiting (the record is in the leader's log, in call order, when this
        returns); the future resolves once the ISR has it."""
        # A failed write's future is kept until the group's next generation (its SyncGroups read it):
        # its exception keeps no traceback, whose frames held the record and its batch (a refused
        # 1 MiB group record kept 3 MiB, outside group.coordinator.metadata.max.bytes).
        try:
            fut = self._append(partition, kvs)
        except errors.BrookError as exc:
            log.warning("writing %s failed: %s", what, exc)
            failed: concurrent.futures.Future = concurrent.futures.Future()
            failed.set_exception(exc.with_traceback(None))
            return failed
        if len(self._writes) >= self._writes_max:
            log.warning("too many group metadata writes in flight; not tracking %s", what)
            return fut
        self._writes.add(fut)

        def done(f: concurrent.futures.Future) -> None:
            self._writes.discard(f)
            if (exc := f.exception()) is not None:
                exc.__traceback__ = None
                log.warning("writing %s failed: %s", what, exc)

        fut.add_done_callback(done)
        return fut

    @property
    def _write_wait_s(self) -> float:
        """How long a caller waits for a write of ``__consumer_offsets`` (its append's own timeout, and a margin)."""
        return self.config.offsets_commit_timeout_ms / 1000 + 5

    @property
    def _kafka_records(self) -> bool:
        return self.config.record_format != "brook"

    def _offset_kvs(self, group_id: str, entries: Sequence[tuple[TopicPartition, OffsetEntry]],
                    owner: str) -> list[tuple[bytes, bytes | None]]:
        """The records of committed offsets: Kafka's values, or (record format "brook") the earlier ones, which
        name the group's owner in each."""
        if self._kafka_records:
            return [(records.offset_key(group_id, tp), records.encode_offset_value(e)) for tp, e in entries]
        return [(records.offset_key(group_id, tp), records.encode_legacy_offset_value(e, owner)) for tp, e in entries]

    def _append(self, partition: int, kvs: list[tuple[bytes, bytes | None]]) -> concurrent.futures.Future:
        now = self.clock_ms()
        builder = RecordBatchBuilder()
        for key, value in kvs:
            builder.append(now, key, value)
        return self.replica_manager.append_records(OFFSETS_TOPIC, partition, builder.build(), acks=-1,
                                                   timeout_ms=self.config.offsets_commit_timeout_ms)

    def _append_and_wait(self, partition: int, kvs: list[tuple[bytes, bytes | None]]) -> int:
        """Append (in batches) with acks=all; returns the base offset of the last batch."""
        base = -1
        for i in range(0, len(kvs), RECORDS_PER_BATCH_MAX):
            chunk = kvs[i : i + RECORDS_PER_BATCH_MAX]
            fut = self._append(partition, chunk)
            try:
                with blocking():  # as in _await_group_write
                    result = fut.result(timeout=self._write_wait_s)
            except concurrent.futures.TimeoutError as exc:
                raise CoordinatorError("offsets append timed out", code=ErrorCode.REQUEST_TIMED_OUT) from exc
            except errors.BrookError as exc:
                raise CoordinatorError(str(exc), code=_commit_error(exc.code)) from exc
            base = _base_offset(result)
        return base

    def group_count(self) -> int:
        """Groups this coordinator holds (one atomic read)."""
        return len(self._groups)

    # ------------------------------------------------------------------ offsets
    def commit_offsets(self, req: group_pb2.OffsetCommitRequest, client: str = "") -> list[tuple[str, int, int, str]]:
        """Validate, write with acks=all, then make visible. Returns per-partition errors. ``client``: the
        caller's address (a group the commit makes is that address's, see _admit_offsets_locked)."""
        now = self.clock_ms()
        # OffsetCommit v2-v4's retention time, as Kafka: the offsets expire that long after this commit once the
        # group is empty, not offsets.retention.minutes after it became so (-1, what most clients send: the latter).
        retention = req.retention_time_ms if req.HasField("retention_time_ms") else -1
        expire_ms = min(now + retention, INT64_MAX) if retention >= 0 else -1
        results: list[tuple[str, int, int, str]] = []
        entries: list[tuple[TopicPartition, OffsetEntry]] = []
        with self._lock:
            p = self._check_owner_locked(req.group_id)
            g = self._groups.get(req.group_id)
            if req.group_id in self.consumer_groups.groups:
                # The consumer protocol's rule: a member commits at its current epoch (generation_id carries it).
                try:
                    self.consumer_groups.validate_commit(req.group_id, req.member_id, req.generation_id)
                except cg.HeartbeatError as exc:
                    raise CoordinatorError(exc.message, code=exc.code) from None
                g = None  # its Group, if any, holds only offsets
            elif g is None and not (req.generation_id < 0 and not req.member_id):
                raise CoordinatorError("unknown group", code=ErrorCode.UNKNOWN_MEMBER_ID)
            # A commit from outside group management (no member, no generation) to a group not made yet
            # makes it only once an offset is written (_write_offsets), as Kafka, whose request handler
            # leaves out unknown and refused partitions before the coordinator sees the commit: a commit
            # that writes nothing makes no group (20,000 of them, each naming a made-up partition, made
            # 20,000 empty groups every ListGroups and timer walked; found by an audit).
            if g is not None:
                code = g.validate_commit(req.member_id, req.generation_id, now, req.group_instance_id)
                if code != ErrorCode.NONE:
                    raise CoordinatorError(f"commit refused for member {req.member_id!r} generation "
                                           f"{req.generation_id} (group generation {g.generation_id}, {g.state})",
                                           code=code)
            epoch = self._partitions[p].leader_epoch
        for part in req.partitions:
            tp = TopicPartition(part.topic, part.partition)
            if len(part.metadata.encode()) > self.config.offset_metadata_max_bytes:
                results.append((tp.topic, tp.partition, ErrorCode.OFFSET_METADATA_TOO_LARGE, "metadata too large"))
                continue
            if not part.topic or part.partition < 0:
                results.append((tp.topic, tp.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"unknown partition {tp.topic}-{tp.partition}"))
                continue
            # A negative offset is stored as given, as Kafka stores it: KafkaJS commits -1 (latest) and -2
            # (earliest) to reset a group after OFFSET_OUT_OF_RANGE and in admin.resetOffsets, and reads them back as
            # such; every client takes a negative committed offset for none. Refused, its consumers died
            # (INVALID_COMMIT_OFFSET_SIZE is not retriable) and resetOffsets never returned (KafkaJS audit).
            if self.metadata_cache.partition(tp.topic, tp.partition) is None:
                # As Kafka: offsets only for partitions that exist (a group cannot be made to hold
                # offsets for any number of made-up ones).
                results.append((tp.topic, tp.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"unknown partition {tp.topic}-{tp.partition}"))
                continue
            entries.append((tp, OffsetEntry(part.offset, part.leader_epoch, part.metadata, now,
                                            expire_timestamp_ms=expire_ms)))
        if entries:
            self._admit_and_write_offsets(req.group_id, p, epoch, entries, client)
        results += [(tp.topic, tp.partition, ErrorCode.NONE, "") for tp, _ in entries]
        return results

    def _admit_and_write_offsets(self, group_id: str, partition: int, epoch: int,
                                 entries: list[tuple[TopicPartition, OffsetEntry]], client: str) -> None:
        """Offsets a commit or an admin reset sets: admitted against the offsets budget (in all, and the
        share of ``client``'s address), written with acks=all, then made visible. Each record names the address
        the group counts against, so that the coordinator that loads it after a failover counts it there too
        (before, loaded groups counted against no address: each failover gave an address a new share)."""
        with self._lock:
            owner, incoming = self._admit_offsets_locked(group_id, entries, client)
            g = self._groups.get(group_id)
            record_owner = self._kafka_records and bool(owner) and (g is None or not g.owner_recorded)
        try:  # the records are made inside: one that cannot be encoded still gives back what was admitted
            kvs = self._offset_kvs(group_id, entries, owner)
            if record_owner:  # last: the entries keep their places in the batches (_write_offsets)
                kvs.append(records.owner_record(group_id, owner))
            self._write_offsets(group_id, partition, epoch, entries, kvs, owner=owner, owner_recorded=record_owner)
        finally:
            with self._lock:
                self._offsets_in_flight_locked(owner, -incoming)

    def _admit_offsets_locked(self, group_id: str, entries: list[tuple[TopicPartition, OffsetEntry]],
                              client: str = "") -> tuple[str, int]:
        """Refuse (retriable COORDINATOR_NOT_AVAILABLE) a commit that would take what committed offsets and
        groups hold in this coordinator's memory past group.coordinator.offsets.max.bytes, or what the groups
        one client address made hold past group.coordinator.offsets.max.bytes.per.ip. Kafka has no such
        bound, but its heap is one: without it, a client committing to made-up group ids (each a new group,
        each offset with up to offset.metadata.max.bytes of metadata) grew the broker without end; and with
        the first bound alone, one address filled it (about 190 commits of 200 partitions with 4 KB of
        metadata) and every new group of the coordinator was refused, whatever its address, until the
        offsets expired (offsets.retention.minutes, 7 days). A group counts against the address whose commit
        or join made it (``client``, kept as Group.owner and written in an owner record next to its first
        commit or group record, so a coordinator that loads it from the log counts it there too; one whose
        records name none counts against no address).
        A commit that adds nothing (the same partitions again, metadata no longer) is always taken,
        so the groups already here go on committing. The figures are upper bounds, what was admitted since
        the last count added to them; they are counted again (one step a group: each group keeps its offsets'
        sum) only when they would refuse, at most once a second. Returns the address the commit counts against
        and the bytes it adds, in flight until the caller has applied them (``_offsets_in_flight_locked``):
        a count made meanwhile adds them, as the groups do not hold them yet (without, concurrent commits
        passed the share by 4%)."""
        g = self._groups.get(group_id)
        incoming = 0 if g is not None else GROUP_OVERHEAD_BYTES + len(group_id)
        for tp, entry in entries:
            old = g.offsets.get(tp) if g is not None else None
            incoming += max(0, offset_bytes(tp, entry) - (offset_bytes(tp, old) if old is not None else 0))
        owner = g.owner if g is not None else client
        if incoming == 0:
            return owner, 0
        limit = self.config.group_coordinator_offsets_max_bytes
        share = self.config.group_coordinator_offsets_max_bytes_per_ip if owner else limit
        now = time.monotonic()

        def over() -> bool:
            return (self._offset_bytes + incoming > limit
                    or self._offset_bytes_by_owner.get(owner, 0) + incoming > share)
        if over() and now - self._offsets_counted_at >= 1.0:
            self._count_offset_bytes_locked()
            self._offsets_counted_at = now
        if over():
            mine = self._offset_bytes_by_owner.get(owner, 0)
            self._offset_refusals.warn(
                "group coordinator %d refused an offset commit to group %r (%d bytes, the group made from %s): "
                "committed offsets and groups hold %d bytes (group.coordinator.offsets.max.bytes=%d), %d of them in "
                "groups that address made (group.coordinator.offsets.max.bytes.per.ip=%d)",
                self.node_id, group_id[:100], incoming, owner or "no address", self._offset_bytes, limit, mine, share)
            if self._offset_bytes + incoming > limit:
                raise CoordinatorError(f"the coordinator holds {self._offset_bytes} bytes of committed offsets and "
                                       f"groups (group.coordinator.offsets.max.bytes={limit}); retry later",
                                       code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
            raise CoordinatorError(f"groups made from {owner} hold {mine} bytes of committed offsets on this "
                                   f"coordinator (group.coordinator.offsets.max.bytes.per.ip={share}); retry later "
                                   f"or delete groups", code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        self._offset_bytes += incoming
        if owner:
            self._offset_bytes_by_owner[owner] = self._offset_bytes_by_owner.get(owner, 0) + incoming
        self._offsets_in_flight_locked(owner, incoming)
        return owner, incoming

    def _offsets_in_flight_locked(self, owner: str, delta: int) -> None:
        if not delta:
            return
        self._offsets_in_flight[""] = self._offsets_in_flight.get("", 0) + delta  # "": every address's
        if owner:
            left = self._offsets_in_flight.get(owner, 0) + delta
            if left:
                self._offsets_in_flight[owner] = left
            else:
                del self._offsets_in_flight[owner]

    def _count_offset_bytes_locked(self) -> None:
        """Count what committed offsets and groups hold afresh, and what commits being written will add: in all, and
        by the address that made each group."""
        total, by_owner = self._offsets_in_flight.get("", 0), {o: n for o, n in self._offsets_in_flight.items() if o}
        for gid, grp in self._groups.items():
            held = grp.offsets.held_bytes + GROUP_OVERHEAD_BYTES + len(gid)
            total += held
            if grp.owner:
                by_owner[grp.owner] = by_owner.get(grp.owner, 0) + held
        self._offset_bytes, self._offset_bytes_by_owner = total, by_owner

    def _write_offsets(self, group_id: str, partition: int, epoch: int,
                       entries: Sequence[tuple[TopicPartition, OffsetEntry | None]],
                       kvs: list[tuple[bytes, bytes | None]], owner: str = "", owner_recorded: bool = False) -> None:
        """Append ``kvs`` (the records of ``entries``, in order, perhaps an owner record after them) with acks=all,
        then apply ``entries`` to the group (made here, as ``owner``'s, when the commit is its first)."""
        base = self._append_and_wait(partition, kvs)
        with self._lock:
            if not self._still_leader(partition, epoch):
                raise CoordinatorError("coordinator moved during the commit", code=ErrorCode.NOT_COORDINATOR)
            g = self._groups.get(group_id)
            if g is None:
                if all(e is None for _, e in entries):
                    return
                g = self._groups[group_id] = self._new_group(group_id, partition, owner)
            if owner_recorded:
                g.owner_recorded = True
            last_chunk_start = ((len(kvs) - 1) // RECORDS_PER_BATCH_MAX) * RECORDS_PER_BATCH_MAX
            for i, (tp, entry) in enumerate(entries):
                if entry is not None and i >= last_chunk_start and base >= 0:
                    entry.log_offset = base + (i - last_chunk_start)
                g.apply_offset(tp, entry)

    # ------------------------------------------------------------------ transactional offsets (KIP-98)
    def txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
                           generation_id: int, instance_id: str, offsets: Sequence[tuple[TopicPartition, int, int, str]],
                           verify: Callable[[int], tuple[int, dict[int, int] | None]]) -> list[tuple[str, int, int]]:
        """TxnOffsetCommit: ``offsets`` ((topic, partition), offset, leader epoch, metadata) committed within the
        producer's transaction. They are written to the group's ``__consumer_offsets`` partition as a
        transactional batch of the producer (acks=all) and stay invisible until the transaction's COMMIT marker
        lands there (``on_marker``), or go with its ABORT. ``verify(partition)``: the transaction coordinator's
        answer that this partition is in the producer's ongoing transaction (AddOffsetsToTxn), and the marker
        marks the append is held to (broker/service.py: KIP-890's verification). A member id or generation given
        (KIP-447) is checked as an OffsetCommit's. Returns (topic, partition, error) per partition."""
        now = self.clock_ms()
        with self._lock:
            p = self._check_owner_locked(group_id)
            if member_id or generation_id >= 0:
                if group_id in self.consumer_groups.groups:
                    try:
                        self.consumer_groups.validate_commit(group_id, member_id, generation_id)
                    except cg.HeartbeatError as exc:
                        raise CoordinatorError(exc.message, code=exc.code) from None
                else:
                    g = self._groups.get(group_id)
                    if g is None:
                        raise CoordinatorError("unknown group", code=ErrorCode.UNKNOWN_MEMBER_ID)
                    code = g.validate_commit(member_id, generation_id, now, instance_id)
                    if code != ErrorCode.NONE:
                        raise CoordinatorError(f"transactional commit refused for member {member_id!r} generation "
                                               f"{generation_id}", code=code)
            epoch = self._partitions[p].leader_epoch
            room = TXN_PENDING_OFFSETS_MAX - self._txn_pending_count
        results: list[tuple[str, int, int]] = []
        entries: list[tuple[TopicPartition, OffsetEntry]] = []
        for tp, offset, leader_epoch, metadata in offsets:
            if len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                results.append((tp.topic, tp.partition, ErrorCode.OFFSET_METADATA_TOO_LARGE))
            elif tp.partition < 0 or self.metadata_cache.partition(tp.topic, tp.partition) is None:
                results.append((tp.topic, tp.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            else:
                entries.append((tp, OffsetEntry(offset, leader_epoch, metadata, now)))
        if not entries:
            return results
        if len(entries) > room:
            raise CoordinatorError(f"the coordinator holds {self._txn_pending_count} offsets of transactions not "
                                   f"ended yet ({TXN_PENDING_OFFSETS_MAX} at most); retry later",
                                   code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
        code, marks = verify(p)
        if code != ErrorCode.NONE:
            return results + [(tp.topic, tp.partition, code) for tp, _ in entries]
        kvs = self._offset_kvs(group_id, entries, "")
        with self._txn_write_lock:
            hosted = self.replica_manager.partition(OFFSETS_TOPIC, p)
            known = hosted.log.producer_state.entry(producer_id) if hosted is not None else None
            # Its sequence on this partition: the coordinator is the producer's only writer here.
            sequence = known.last_seq + 1 if known is not None and known.epoch == producer_epoch and known.batches \
                else 0
            builder = RecordBatchBuilder(producer_id=producer_id, producer_epoch=producer_epoch,
                                         base_sequence=sequence % 2**31, is_transactional=True)
            for key, value in kvs:
                builder.append(now, key, value)
            fut = self.replica_manager.append_records(OFFSETS_TOPIC, p, builder.build(), acks=-1,
                                                      timeout_ms=self.config.offsets_commit_timeout_ms,
                                                      transactional=True, verified=marks)
        try:
            with blocking():
                result = fut.result(timeout=self._write_wait_s)
        except concurrent.futures.TimeoutError:
            return results + [(tp.topic, tp.partition, ErrorCode.REQUEST_TIMED_OUT) for tp, _ in entries]
        except errors.BrookError as exc:
            code = _commit_error(exc.code)
            return results + [(tp.topic, tp.partition, code) for tp, _ in entries]
        base = _base_offset(result)
        with self._lock:
            if not self._still_leader(p, epoch):
                return results + [(tp.topic, tp.partition, ErrorCode.NOT_COORDINATOR) for tp, _ in entries]
            by_group = self._txn_pending.setdefault((p, producer_id), {}).setdefault(group_id, {})
            for i, (tp, entry) in enumerate(entries):
                entry.log_offset = base + i if base >= 0 else -1
                if tp not in by_group:
                    self._txn_pending_count += 1
                by_group[tp] = entry
        return results + [(tp.topic, tp.partition, ErrorCode.NONE) for tp, _ in entries]

    def on_marker(self, topic: str, partition: int, producer_id: int, commit: bool, offset: int) -> None:
        """ReplicaManager marker listener: a transaction's marker was written on ``__consumer_offsets`` partition
        ``partition`` this broker leads: its offsets become the groups' committed offsets (COMMIT) or go (ABORT)."""
        if topic != OFFSETS_TOPIC:
            return
        with self._lock:
            state = self._partitions.get(partition)
            if state is not None and not state.loaded:
                state.markers.append((producer_id, commit))  # the load may end before it: applied after it
                return
            self._end_txn_offsets_locked(partition, producer_id, commit)

    def _end_txn_offsets_locked(self, partition: int, producer_id: int, commit: bool) -> None:
        by_group = self._txn_pending.pop((partition, producer_id), None)
        if not by_group:
            return
        self._txn_pending_count -= sum(map(len, by_group.values()))
        if commit and partition in self._partitions:
            for gid, entries in by_group.items():
                g = self._groups.get(gid)
                if g is None:
                    g = self._groups[gid] = self._new_group(gid, partition)
                for tp, entry in entries.items():
                    g.apply_offset(tp, entry)

    def unstable_offsets(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with offsets of a transaction not ended yet: an OffsetFetch asking for stable
        offsets (v7+, librdkafka's read_committed consumers) is answered UNSTABLE_OFFSET_COMMIT for them."""
        with self._lock:
            partition = self.partition_for(group_id)
            return {tp for (p, _), by_group in self._txn_pending.items() if p == partition
                    for tp in by_group.get(group_id, ())}

    def fetch_offsets(self, group_id: str, tps: list[TopicPartition]) -> list[tuple[TopicPartition, OffsetEntry | None]]:
        with self._lock:
            g = self._group_locked(group_id, create=False)
            if g is None:
                return [(tp, None) for tp in tps]
            if not tps:
                return sorted(g.offsets.items())
            return [(tp, g.offsets.get(tp)) for tp in tps]

    # ------------------------------------------------------------------ admin
    def list_groups(self, states: set[str]) -> list[Group]:
        """The groups of the loaded partitions (in ``states``, if any named: compared without case, as Kafka's
        coordinator does, so ``stable`` names Stable). Under the lock, only the
        groups and loaded partitions are copied (C-speed); each group's partition was kept when it was
        made, so the choice, after, hashes no id (it hashed every id under the lock: 5.2 s with 20,000
        groups, found by an audit). The states read after the copy may be a moment newer: a listing."""
        with self._lock:
            groups = list(self._groups.values())
            loaded = {p for p, load in self._partitions.items() if load.loaded}
            consumer = {gid for gid, g in self.consumer_groups.groups.items() if g.members}
        named = {s.lower() for s in states}
        wanted = {state for state in GroupState if state.value.lower() in named}
        # A consumer-protocol group's Group holds only its offsets: consumer_group_listing lists it.
        return [g for g in groups if self._partition_of(g) in loaded and (not states or g.state in wanted)
                and g.group_id not in consumer]

    def reserve_describe(self, size: int) -> bool:
        """Take ``size`` bytes of DESCRIBE_INFLIGHT_MAX_BYTES for a description being built (False:
        not that much is free); give them back with ``release_describe`` once the answer is sent."""
        with self._describe_lock:
            if self._describing_bytes + size > DESCRIBE_INFLIGHT_MAX_BYTES:
                return False
            self._describing_bytes += size
            return True

    def release_describe(self, size: int) -> None:
        with self._describe_lock:
            self._describing_bytes -= size

    def describe_group(self, group_id: str, include_offsets: bool, max_bytes: int = DESCRIBE_ANSWER_MAX_BYTES,
                       reserve: Callable[[int], bool] | None = None,
                       end_offsets: dict[TopicPartition, tuple[int, str]] | None = None,
                       ) -> tuple[group_pb2.DescribedGroup, int]:
        """The group as DescribeGroups shows it and about how many bytes it carries (its members' ids,
        metadata and assignments, and with ``include_offsets`` an entry per partition it committed or
        assigned); an error instead when that is more than ``max_bytes`` (what is left of the answer's
        bound), or when ``reserve`` (of those bytes, before they are built) says no. ``end_offsets``: the
        partitions' end offsets resolved so far by this request, resolved once each and added to."""
        with self._lock:  # only what the answer needs is taken under the lock (members' bytes by reference)
            try:
                g = self._group_locked(group_id, create=False)
            except CoordinatorError as exc:
                return group_pb2.DescribedGroup(error_code=exc.code, error_message=exc.message, group_id=group_id), 0
            kip848 = self.consumer_groups.active(group_id)
            if kip848 is not None:
                # Shown with the same fields (the Kafka listener answers Kafka's DescribeGroups for it as for no
                # classic group, by group_type): its members' subscriptions and assignments are not bytes to decode.
                names = {tid: name for name, (tid, _) in kip848.topics.items()}
                out = group_pb2.DescribedGroup(
                    group_id=group_id, state=kip848.state(), protocol_type=records.CONSUMER_PROTOCOL_TYPE,
                    protocol_name=cg.group_assignor(kip848), generation_id=kip848.epoch,
                    coordinator_id=self.node_id, group_type=cg.CONSUMER_GROUP_TYPE)
                members = [(m.member_id, m.client_id, m.client_host, b"", b"", self.consumer_groups.session_timeout_ms,
                            m.rebalance_timeout_ms, m.instance_id or "")
                           for m in sorted(kip848.members.values(), key=lambda m: m.member_id)]
                kip848_members = {m.member_id: (sorted(m.subscribed), [
                    group_pb2.TopicPartitionRef(topic=names.get(tid, str(tid)), partition=p)
                    for tid, parts in sorted(m.assigned.items(), key=lambda kv: names.get(kv[0], "")) for p in sorted(parts)],
                    m.regex) for m in kip848.members.values()}
                offsets = sorted(g.offsets.items()) if g is not None else []
            elif g is None:
                return group_pb2.DescribedGroup(group_id=group_id, state=GroupState.DEAD.value,
                                                coordinator_id=self.node_id), 0
            else:
                kip848_members = None
                out = group_pb2.DescribedGroup(
                    group_id=group_id, state=g.state.value, protocol_type=g.protocol_type,
                    protocol_name=g.protocol_name, generation_id=g.generation_id, leader=g.leader_id,
                    coordinator_id=self.node_id, group_type=cg.CLASSIC_GROUP_TYPE)
                members = [(m.member_id, m.client_id, m.client_host, m.metadata_for(g.protocol_name), m.assignment,
                            m.session_timeout_ms, m.rebalance_timeout_ms, m.group_instance_id)
                           for m in sorted(g.members.values(), key=lambda m: m.member_id)]
                offsets = sorted(g.offsets.items())
        consumer = out.protocol_type == records.CONSUMER_PROTOCOL_TYPE
        # A consumer member's metadata is shown decoded as well: about twice its bytes. Its ids are shown
        # as they are (a client id may be kilobytes: they count).
        size = (sum(len(m[3]) + len(m[4]) for m in members) * (2 if consumer else 1)
                + sum(len(m[0]) + len(m[1]) + len(m[2]) + len(m[7]) + DESCRIBED_MEMBER_OVERHEAD for m in members))
        if size > max_bytes:
            return self._description_too_large(group_id, f"{len(members)} members", size, max_bytes), 0
        # Each consumer member's assignment, decoded once: shown, and (with offsets) who owns each partition. Each
        # decoded partition carries its topic's name: what they cost counts, as they are decoded (a 1 MiB assignment
        # of four-byte partitions decodes to some 60 times its bytes; audit).
        assigned: list[Any] = []
        for m in members:
            if kip848_members is not None:
                refs = kip848_members[m[0]][1]
                size += (records.consumer_protocol.decoded_bytes(refs) + sum(map(len, kip848_members[m[0]][0]))
                         + len(kip848_members[m[0]][2]))
                if size > max_bytes:
                    return self._description_too_large(group_id, f"{len(members)} members' assignments", size,
                                                       max_bytes), 0
                assigned.append(refs)
                continue
            refs = _decode_assignment(m[0], m[4], max_bytes - size) if consumer else ()
            if refs is None:
                return self._description_too_large(group_id, f"{len(members)} members' assignments", max_bytes + 1,
                                                   max_bytes), 0
            size += records.consumer_protocol.decoded_bytes(refs)
            assigned.append(refs)
        tps: list[TopicPartition] = []
        owner: dict[TopicPartition, str] = {}
        committed = dict(offsets)
        if include_offsets:
            for m, refs in zip(members, assigned, strict=True):
                for ref in refs:
                    owner[TopicPartition(ref.topic, ref.partition)] = m[0]
            tps = sorted(set(owner) | set(committed))
            # Each entry carries its topic, owner and commit metadata: counted as the members are (an offset
            # entry per committed partition of each copy of a group id, uncounted, made a 12 KB request
            # build a 20 MB answer; found by an audit).
            size += sum(len(tp.topic) + len(owner.get(tp, "")) + DESCRIBED_OFFSET_OVERHEAD for tp in tps)
            size += sum(len(e.metadata) for e in committed.values())
            if size > max_bytes:
                return self._description_too_large(
                    group_id, f"{len(members)} members, {len(tps)} partitions", size, max_bytes), 0
        if (refused := self.describe_refusal(group_id, size, max_bytes, reserve)) is not None:
            return refused, 0
        for (member_id, client_id, client_host, metadata, assignment, session_ms, rebalance_ms, instance), refs in zip(
                members, assigned, strict=True):
            dm = out.members.add(member_id=member_id, client_id=client_id, client_host=client_host,
                                 metadata=metadata, assignment=assignment, session_timeout_ms=session_ms,
                                 rebalance_timeout_ms=rebalance_ms, group_instance_id=instance)
            if kip848_members is not None:
                dm.subscribed_topics.extend(kip848_members[member_id][0])
                dm.subscribed_topic_regex = kip848_members[member_id][2]
                dm.assigned_partitions.extend(refs)
            elif consumer:
                _decode_consumer_member(dm, refs)
        if include_offsets:
            ends = end_offsets if end_offsets is not None else {}
            missing = {tp: LIST_OFFSETS_LATEST for tp in tps if tp not in ends}
            if missing:
                resolved = self._resolve_offsets(missing)
                for tp in missing:
                    ends[tp] = resolved.get(tp, (-1, "no answer"))
            for tp in tps:
                entry = committed.get(tp)
                end = ends[tp][0]
                c = entry.offset if entry is not None else -1
                out.offsets.append(group_pb2.GroupPartitionOffset(
                    topic=tp.topic, partition=tp.partition, committed_offset=c, log_end_offset=end,
                    lag=max(0, end - c) if end >= 0 and c >= 0 else -1, member_id=owner.get(tp, ""),
                    metadata=entry.metadata if entry is not None else ""))
        return out, size

    def _description_too_large(self, group_id: str, what: str, size: int, max_bytes: int) -> group_pb2.DescribedGroup:
        return group_pb2.DescribedGroup(
            group_id=group_id, coordinator_id=self.node_id, error_code=ErrorCode.INVALID_REQUEST,
            error_message=f"the description of group {group_id!r} ({what}) would take about {size} bytes, over "
                          f"the {max_bytes} left of this answer's {DESCRIBE_ANSWER_MAX_BYTES}: describe fewer groups "
                          f"a call")

    def answer_bytes_refusal(self, what: str, group_id: str, size: int) -> None:
        """Log (throttled) that ``what`` for ``group_id`` (``size`` bytes) did not fit DESCRIBE_INFLIGHT_MAX_BYTES."""
        self._describe_refusals.warn(
            "group coordinator %d: %s for group %s (%d bytes) would take the answers being built past %d bytes; "
            "answered COORDINATOR_LOAD_IN_PROGRESS", self.node_id, what, group_id[:100], size,
            DESCRIBE_INFLIGHT_MAX_BYTES)

    def listing_refusal(self, count: int, size: int) -> group_pb2.ListGroupsResponse:
        """The answer to a ListGroups whose ``count`` groups (``size`` bytes) do not fit what the answers being
        built may hold now (DESCRIBE_INFLIGHT_MAX_BYTES, shared with DescribeGroups): retriable."""
        self._describe_refusals.warn(
            "group coordinator %d: listing %d groups (%d bytes) would take the answers being built past %d bytes; "
            "answered COORDINATOR_LOAD_IN_PROGRESS", self.node_id, count, size, DESCRIBE_INFLIGHT_MAX_BYTES)
        return group_pb2.ListGroupsResponse(
            error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            error_message=f"other listings and descriptions of groups are being built ({DESCRIBE_INFLIGHT_MAX_BYTES} "
                          f"bytes at most at once); retry")

    def describe_refusal(self, group_id: str, size: int, max_bytes: int,
                         reserve: Callable[[int], bool] | None) -> group_pb2.DescribedGroup | None:
        """None when a description of ``size`` bytes may go in the answer (then its bytes are reserved), or
        the error it is answered with instead: over what is left of the answer's bound (``max_bytes``), or
        over what all answers being built may carry. A group id a request repeats is answered again (as
        Kafka does), with a copy of its description: the copy is admitted here like the first."""
        if size > max_bytes:
            return self._description_too_large(group_id, "repeated", size, max_bytes)
        if size and reserve is not None and not reserve(size):
            self._describe_refusals.warn(
                "group coordinator %d: describing group %s (%d bytes) would take the descriptions being built past "
                "%d bytes; answered COORDINATOR_LOAD_IN_PROGRESS", self.node_id, group_id[:100], size,
                DESCRIBE_INFLIGHT_MAX_BYTES)
            return group_pb2.DescribedGroup(
                group_id=group_id, coordinator_id=self.node_id, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                error_message=f"other descriptions of groups are being built ({DESCRIBE_INFLIGHT_MAX_BYTES} bytes "
                              f"at most at once); retry")
        return None

    def delete_group(self, group_id: str) -> None:
        with self._lock:
            self._check_owner_locked(group_id)
            if (active := self.consumer_groups.active(group_id)) is not None:
                raise CoordinatorError(f"group {group_id} has {len(active.members)} members ({active.state()})",
                                       code=ErrorCode.NON_EMPTY_GROUP)
            g = self._group_locked(group_id, create=False)
            if g is None or g.state == GroupState.DEAD:
                raise CoordinatorError(f"group {group_id} does not exist", code=ErrorCode.GROUP_ID_NOT_FOUND)
            if g.members:
                raise CoordinatorError(f"group {group_id} has {len(g.members)} members ({g.state})",
                                       code=ErrorCode.NON_EMPTY_GROUP)
            p = self._partition_of(g)
            epoch = self._partitions[p].leader_epoch
            tps = sorted(g.offsets)
        kvs: list[tuple[bytes, bytes | None]] = [(records.offset_key(group_id, tp), None) for tp in tps]
        kvs += records.group_tombstones(group_id)
        self._append_and_wait(p, kvs)
        with self._lock:
            if not self._still_leader(p, epoch):
                raise CoordinatorError("coordinator moved during the delete", code=ErrorCode.NOT_COORDINATOR)
            g = self._groups.get(group_id)
            if g is not None and not g.members:
                self._groups.pop(group_id).mark_dead(self.clock_ms())
                self._group_writes.pop(group_id, None)

    def delete_offsets(self, group_id: str, tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        """OffsetDelete: tombstones for the partitions of topics no member subscribes to (Kafka refuses the
        others, GROUP_SUBSCRIBED_TO_TOPIC). The members' topics were parsed when they joined: under the lock
        only references to their sets are taken; the named topics are looked up in them after."""
        with self._lock:
            g = self._group_locked(group_id, create=False)
            if g is None:
                raise CoordinatorError(f"group {group_id} does not exist", code=ErrorCode.GROUP_ID_NOT_FOUND)
            protocol = g.protocol_name
            member_topics = ([m.subscribed_topics(protocol) for m in g.members.values()]
                             if g.protocol_type == records.CONSUMER_PROTOCOL_TYPE else [])
            if (consumers := self.consumer_groups.active(group_id)) is not None:
                member_topics = [m.subscribed for m in consumers.members.values()]
            p = self._partition_of(g)
            epoch = self._partitions[p].leader_epoch
        named = {tp.topic for tp in tps}
        subscribed: set[str] = set()
        for topics in member_topics:
            if not named:
                break
            found = topics.intersection(named)  # C-speed, over the smaller of the two
            if found:
                subscribed |= found
                named -= found
        results: list[tuple[TopicPartition, int]] = []
        to_delete: list[TopicPartition] = []
        cache = self.metadata_cache
        for tp in tps:
            if cache is not None and cache.partition(tp.topic, tp.partition) is None:
                # As Kafka (KafkaApis.handleDeleteGroupOffsetsRequest): a partition that does not exist is
                # refused, not answered as deleted (Brook answered NONE; compat audit). A deleted topic's
                # offsets go with it (drop_offsets_of_deleted_topics).
                results.append((tp, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            elif tp.topic in subscribed:
                results.append((tp, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC))
            else:
                to_delete.append(tp)
                results.append((tp, ErrorCode.NONE))
        if to_delete:
            self._write_offsets(group_id, p, epoch, [(tp, None) for tp in to_delete],
                                [(records.offset_key(group_id, tp), None) for tp in to_delete])
        return results

    def alter_offsets(self, req: group_pb2.AlterGroupOffsetsRequest, client: str = "") -> list[group_pb2.ResolvedOffset]:
        """Reset committed offsets of an empty group (Kafka's kafka-consumer-groups --reset-offsets). The
        offsets count against the offsets budget as a commit's do (``client``: the caller's address, whose
        share a group the reset makes counts against): resets of made-up groups, each setting an offset for
        every partition of a topic, took the coordinator past group.coordinator.offsets.max.bytes."""
        with self._lock:
            g = self._group_locked(req.group_id, create=False)
            if g is not None and g.members:
                raise CoordinatorError(f"group {req.group_id} is {g.state} with {len(g.members)} members; "
                                       "stop its consumers first", code=ErrorCode.NON_EMPTY_GROUP)
            previous = {tp: e.offset for tp, e in g.offsets.items()} if g is not None else {}
            p = self.partition_for(req.group_id)
            epoch = self._partitions[p].leader_epoch
        if unknown := sorted({s.kind for s in req.specs} - _RESET_KINDS):
            # It was taken for RESET_EXPLICIT and written (audit).
            raise CoordinatorError(f"unknown offset reset kind {unknown[0]}: 0 (explicit) to 4 (shift by)",
                                   code=ErrorCode.INVALID_REQUEST)
        specs = self._expand_specs(req.specs, previous)
        tps = sorted(specs)
        earliest = self._resolve_offsets({tp: LIST_OFFSETS_EARLIEST for tp in tps})
        latest = self._resolve_offsets({tp: LIST_OFFSETS_LATEST for tp in tps})
        by_ts = self._resolve_offsets({tp: s.value for tp, s in specs.items()
                                       if s.kind == group_pb2.RESET_TIMESTAMP})
        out: list[group_pb2.ResolvedOffset] = []
        entries: list[tuple[TopicPartition, OffsetEntry]] = []
        now = self.clock_ms()
        for tp in tps:
            spec = specs[tp]
            low, low_err = earliest.get(tp, (-1, "no answer"))
            high, high_err = latest.get(tp, (-1, "no answer"))
            res = group_pb2.ResolvedOffset(topic=tp.topic, partition=tp.partition,
                                           previous_offset=previous.get(tp, -1))
            if low < 0 or high < 0:
                res.error_code, res.error_message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, low_err or high_err
                out.append(res)
                continue
            target = _reset_target(spec, low, high, previous.get(tp, -1), by_ts.get(tp, (-1, ""))[0])
            res.offset = min(max(target, low), high)
            out.append(res)
            entries.append((tp, OffsetEntry(res.offset, -1, "", now)))
        if entries and not req.dry_run:
            with self._lock:
                g = self._groups.get(req.group_id)
                if g is not None and g.members:
                    raise CoordinatorError("a member joined while resetting", code=ErrorCode.NON_EMPTY_GROUP)
            self._admit_and_write_offsets(req.group_id, p, epoch, entries, client)
        return out

    def _expand_specs(self, specs: Iterable[group_pb2.OffsetResetSpec],
                      previous: dict[TopicPartition, int]) -> dict[TopicPartition, group_pb2.OffsetResetSpec]:
        """Each partition the specs name, and the spec that decides it: the last naming it, by its number or
        by naming its whole topic (partition -1). The specs are reduced first, to the last spec of each
        partition and of each whole topic, so each topic is expanded once: expanding it again for every spec
        naming it cost specs x partitions (4.7 s for one 80 KB request at 2,000 partitions; an audit)."""
        whole: dict[str, tuple[int, group_pb2.OffsetResetSpec]] = {}  # topic -> (position, spec), first-named order
        single: dict[TopicPartition, tuple[int, group_pb2.OffsetResetSpec]] = {}
        for i, spec in enumerate(specs):
            if spec.partition >= 0:
                single[TopicPartition(spec.topic, spec.partition)] = (i, spec)
            else:
                whole[spec.topic] = (i, spec)
        chosen: dict[TopicPartition, tuple[int, group_pb2.OffsetResetSpec]] = {}
        for topic, named in whole.items():
            parts = self.metadata_cache.partitions_of(topic)
            if not parts:
                raise CoordinatorError(f"unknown topic {topic!r}", code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            for info in parts:
                chosen[TopicPartition(topic, info.partition)] = named
        for tp, named in single.items():
            current = chosen.get(tp)
            if current is None or current[0] < named[0]:
                chosen[tp] = named
        return {tp: spec for tp, (_, spec) in chosen.items()}

    def _resolve_offsets(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, str]]:
        """ListOffsets at the partition leaders: tp -> (offset or -1, error text)."""
        by_leader: dict[int, list[TopicPartition]] = {}
        out: dict[TopicPartition, tuple[int, str]] = {}
        for tp in wanted:
            info = self.metadata_cache.partition(tp.topic, tp.partition)
            if info is None or info.leader < 0:
                out[tp] = (-1, f"{tp.topic}-{tp.partition} is unknown or has no leader")
                continue
            by_leader.setdefault(info.leader, []).append(tp)
        for leader, tps in by_leader.items():
            broker = self.metadata_cache.broker(leader)
            if broker is None:
                out.update({tp: (-1, f"leader {leader} unknown") for tp in tps})
                continue
            req = broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=[
                broker_pb2.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp=wanted[tp],
                                                current_leader_epoch=-1) for tp in tps])
            try:
                resp = self._stub(broker.host, broker.port).ListOffsets(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                out.update({tp: (-1, f"ListOffsets to broker {leader}: {exc.code()}") for tp in tps})
                continue
            for r in resp.partitions:
                tp = TopicPartition(r.topic, r.partition)
                out[tp] = (r.offset, "") if r.error_code == ErrorCode.NONE else (-1, r.error_message)
        return out

    def _stub(self, host: str, port: int) -> broker_pb2_grpc.BrokerServiceStub:
        address = f"{host}:{port}"
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = make_channel(address, self.security, options=CHANNEL_OPTIONS)
        return broker_pb2_grpc.BrokerServiceStub(ch)

    # ------------------------------------------------------------------ timers
    def _run_timers(self) -> None:
        """Sessions and join/sync deadlines: fast and never blocked on I/O."""
        while not self._stop.wait(TICK_INTERVAL_S):
            try:
                self.tick()
            except Exception:  # a timer bug must not stop every group's sessions
                log.exception("group timers failed; continuing")

    def _run_maintenance(self) -> None:
        """Offset retention and lag figures: these write and call other brokers, so they run
        apart from the session timers (a slow write must not delay member expiry)."""
        next_retention = time.monotonic() + self.config.offsets_retention_check_interval_ms / 1000
        next_lag = time.monotonic()
        while not self._stop.wait(TICK_INTERVAL_S * 5):
            try:
                with self._deleted_lock:
                    deletions = bool(self._deleted_topics)
                if deletions:
                    self.drop_offsets_of_deleted_topics()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self.config.offsets_retention_check_interval_ms / 1000
                    # Topics deleted while another broker held these groups are gone from the metadata.
                    self.drop_offsets_of_deleted_topics(sweep_unknown=True)
                    self.expire_offsets()
                if time.monotonic() >= next_lag:
                    next_lag = time.monotonic() + self.config.lag_refresh_interval_ms / 1000
                    self._refresh_end_offsets()
            except errors.BrookError as exc:
                log.warning("group maintenance: %s", exc)
            except Exception:  # keep retention running whatever one pass hit
                log.exception("group maintenance failed; continuing")

    def tick(self) -> None:
        """Fire the groups' due timers: O(groups due + groups changed since the last tick + log n) (GroupTimers).
        A group is ticked at most once a tick, when its next deadline has come, as when every group was asked."""
        with self._lock:
            now = self.clock_ms()
            if now - self._consumer_expired_at >= CONSUMER_EXPIRY_INTERVAL_MS:
                self._consumer_expired_at = now
                self.consumer_groups.expire(now)
                self._write_consumer_changes_locked()
            for g in self.timers.due(now, self._groups):
                deadline = g.next_deadline_ms(now)
                if deadline is not None and deadline <= now:
                    g.tick(now)
                    self._after_change_locked(g)
                    if self._drop_if_vacant_locked(g, now):
                        continue
                self.timers.watch(g)  # its next entry (after this tick: each group fires once a tick)
            self.timers.schedule_changed(now, self._groups)

    def _drop_if_vacant_locked(self, g: Group, now: int) -> bool:
        """Drop ``g`` if its timers left it vacant (``Group.vacant``): made by a JoinGroup answered
        MEMBER_ID_REQUIRED whose member never came back, nothing of it written. Kept, such groups had no bound:
        38,000 of them from 100 addresses in a minute, each in every ListGroups answer after (audit). Kafka drops
        them at its next cleanup."""
        if not g.vacant() or self._groups.get(g.group_id) is not g:
            return False
        self._groups.pop(g.group_id).mark_dead(now)
        self._group_writes.pop(g.group_id, None)
        self.timers.unwatch(g)
        return True

    def on_topics_deleted(self, topics: list[Any]) -> None:
        """MetadataCache listener (on the metadata watch: quick): ``topics`` were deleted, or recreated under
        the same name. Their offsets are dropped by the maintenance thread (drop_offsets_of_deleted_topics)."""
        now = self.clock_ms()
        with self._deleted_lock:
            self._deleted_topics.extend((t.name, now) for t in topics)

    def drop_offsets_of_deleted_topics(self, sweep_unknown: bool = False) -> int:
        """As Kafka (GroupCoordinator.onPartitionsDeleted): a deleted topic's committed offsets are removed
        from every group (tombstones in __consumer_offsets), so OffsetFetch no longer lists them and a topic
        created again under the name starts with no committed offset (auto.offset.reset), not the old
        topic's: Brook kept them, and a group resumed a recreated topic at the old topic's positions,
        skipping its first records (compat audit). Offsets committed after the deletion was seen (to the
        new topic) stay. ``sweep_unknown``: also the offsets of topics the metadata did not know at this
        sweep nor at the one before (deleted while another broker was the coordinator, or while this one's
        watch fell behind): a topic missing from the metadata for a moment (a stale snapshot) keeps its
        offsets. Returns how many offsets were removed."""
        with self._deleted_lock:
            pending, self._deleted_topics = self._deleted_topics, []
        deleted_at: dict[str, int] = {}
        for name, at in pending:
            deleted_at[name] = max(at, deleted_at.get(name, at))
        sweep_unknown = sweep_unknown and getattr(self.metadata_cache, "version", 0) > 0
        if not deleted_at and not sweep_unknown:
            return 0
        held: list[tuple[str, int, int, list[tuple[TopicPartition, OffsetEntry]]]] = []
        with self._lock:
            for gid, g in self._groups.items():
                p = self._partition_of(g)
                load = self._partitions.get(p)
                if load is None or not load.loaded or not g.offsets:
                    continue
                entries = list(g.offsets.items()) if sweep_unknown else \
                    [(tp, e) for tp, e in g.offsets.items() if tp.topic in deleted_at]
                if entries:
                    held.append((gid, p, load.leader_epoch, entries))
        removed_total = 0
        unknown: set[str] = set()  # the metadata cache is read outside the coordinator's lock
        if sweep_unknown:
            unknown = {tp.topic for _, _, _, entries in held for tp, _ in entries
                       if self.metadata_cache.topic(tp.topic) is None}
            unknown, self._unknown_at_last_sweep = unknown & self._unknown_at_last_sweep, unknown
        for gid, p, epoch, entries in held:
            gone = [(tp, e) for tp, e in entries
                    if (tp.topic in deleted_at and e.commit_timestamp_ms <= deleted_at[tp.topic])
                    or tp.topic in unknown]
            if not gone:
                continue
            try:
                self._append_and_wait(p, [(records.offset_key(gid, tp), None) for tp, _ in gone])
            except errors.BrookError as exc:
                log.warning("removing the offsets of deleted topics from group %s failed: %s", gid, exc)
                continue
            rewrite: list[tuple[TopicPartition, OffsetEntry]] = []
            removed = 0
            with self._lock:
                g = self._groups.get(gid)
                if g is None or not self._still_leader(p, epoch):
                    continue
                owner = g.owner
                for tp, e in gone:
                    current = g.offsets.get(tp)
                    if current is e:
                        g.offsets.pop(tp)
                        removed += 1
                    elif current is not None:
                        rewrite.append((tp, current))  # committed meanwhile: written again after the tombstone
            if rewrite:
                try:
                    self._write_offsets(gid, p, epoch, list(rewrite), self._offset_kvs(gid, rewrite, owner))
                except errors.BrookError as exc:
                    log.warning("group %s: rewriting %d offsets committed during a topic deletion failed: %s",
                                gid, len(rewrite), exc)
            removed_total += removed
            log.info("group %s: removed %d committed offsets of deleted topics", gid, removed)
        return removed_total

    def expire_offsets(self) -> int:
        """offsets.retention.minutes: an empty group's offsets expire that long after it
        became empty (a group never managed by the protocol: per commit timestamp).
        Writes tombstones; an empty group left without offsets is removed for good."""
        retention_ms = self.config.offsets_retention_minutes * 60_000
        now = self.clock_ms()
        expired_total = 0
        plan: list[tuple[str, int, list[TopicPartition], bool]] = []
        with self._lock:
            for gid in [gid for gid, at in self._consumer_emptied.items()
                        if gid not in self._groups or now - at >= retention_ms]:
                del self._consumer_emptied[gid]  # its Group is gone, or the wait is over for its offsets
            for gid, g in self._groups.items():
                p = self._partition_of(g)
                load = self._partitions.get(p)
                if load is None or not load.loaded or gid in self.consumer_groups.groups:
                    continue  # a group of consumer-protocol members keeps its offsets while they are in
                expired, remove_group = g.expired_offsets(now, retention_ms, self._consumer_emptied.get(gid))
                if expired or remove_group:
                    plan.append((gid, p, expired, remove_group))
        for gid, p, expired, remove_group in plan:
            kvs: list[tuple[bytes, bytes | None]] = [(records.offset_key(gid, tp), None) for tp in expired]
            if remove_group:
                kvs += records.group_tombstones(gid)
            try:
                self._append_and_wait(p, kvs)
            except errors.BrookError as exc:
                log.warning("expiring offsets of group %s failed: %s", gid, exc)
                continue
            removed = False
            with self._lock:
                g = self._groups.get(gid)
                if g is None or g.state != GroupState.EMPTY or gid in self.consumer_groups.groups:
                    continue
                for tp in expired:
                    g.offsets.pop(tp, None)
                # Checked again: a member may have been handed an id (KIP-394) during the write; its
                # join creates the group's record anew.
                if remove_group and not g.offsets and not g.pending_members:
                    self._groups.pop(gid).mark_dead(now)
                    self._group_writes.pop(gid, None)
                    removed = True
            expired_total += len(expired)
            log.info("group %s: expired %d committed offsets%s", gid, len(expired),
                     " and removed the empty group" if removed else "")
        return expired_total

    def _refresh_end_offsets(self) -> None:
        with self._lock:
            tps = {tp for g in self._groups.values() for tp in g.offsets}
        if not tps:
            self._end_offsets = {}
            return
        resolved = self._resolve_offsets({tp: LIST_OFFSETS_LATEST for tp in sorted(tps)[:10_000]})
        self._end_offsets = {tp: off for tp, (off, _) in resolved.items() if off >= 0}

    # ------------------------------------------------------------------ stats
    def stats(self) -> GroupCoordinatorStats:
        """Groups by state, and the group-partition rows with a known lag, at most
        group.lag.metrics.max.series of them, the largest lags first (then by group, topic, partition).
        Under the lock only the groups' offsets are copied (C-speed copies); the choice is made after."""
        by_state = {s.value: 0 for s in GroupState if s != GroupState.DEAD}
        ends = self._end_offsets
        consumer_states = {"Assigning": 0, "Reconciling": 0, "Stable": 0}
        with self._lock:
            snapshot = []
            consumer = self.consumer_groups.groups
            for g in self._groups.values():
                if g.group_id not in consumer:  # a consumer-protocol group's Group holds only its offsets
                    by_state[g.state.value] = by_state.get(g.state.value, 0) + 1
                if g.offsets:
                    snapshot.append((g.group_id, list(g.offsets.items())))
            for cgroup in consumer.values():
                state = cgroup.state()
                consumer_states[state] = consumer_states.get(state, 0) + 1
            members = self.consumer_groups.member_count()
            loaded = sum(1 for s in self._partitions.values() if s.loaded)
            loading = len(self._partitions) - loaded
        known = [(max(0, end - e.offset), group, tp, e.offset, end) for group, offsets in snapshot
                 for tp, e in offsets if (end := ends.get(tp, -1)) >= 0 and e.offset >= 0]  # < 0: none committed
        chosen = heapq.nsmallest(self.config.group_lag_metrics_max_series, known,
                                 key=lambda r: (-r[0], r[1], r[2].topic, r[2].partition))
        rows = [GroupOffsetStats(group, tp.topic, tp.partition, committed, end, lag)
                for lag, group, tp, committed, end in chosen]
        return GroupCoordinatorStats(by_state, rows, loaded, loading, len(known) - len(rows), consumer_states, members)


# ---------------------------------------------------------------------- helpers
_TOO_LARGE = (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE)


def _commit_error(code: int, too_large: int = ErrorCode.INVALID_COMMIT_OFFSET_SIZE) -> int:
    """Kafka's mapping of append errors to what a committing client (or a heartbeating one, whose write is too
    large as ``too_large`` says) should do."""
    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if code in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                ErrorCode.REQUEST_TIMED_OUT):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE):
        return too_large
    return ErrorCode.UNKNOWN_SERVER_ERROR


def _base_offset(result: Any) -> int:
    for name in ("base_offset", "first_offset"):
        value = getattr(result, name, None)
        if isinstance(value, int):
            return value
    return -1


_RESET_KINDS = frozenset(group_pb2.OffsetResetKind.values())


def _reset_target(spec: group_pb2.OffsetResetSpec, low: int, high: int, current: int, at_ts: int) -> int:
    if spec.kind == group_pb2.RESET_EARLIEST:
        return low
    if spec.kind == group_pb2.RESET_LATEST:
        return high
    if spec.kind == group_pb2.RESET_TIMESTAMP:
        return at_ts if at_ts >= 0 else high  # nothing that late: the end, as Kafka does
    if spec.kind == group_pb2.RESET_SHIFT_BY:
        return (current if current >= 0 else low) + spec.value
    return spec.value


def _check_lengths(*fields: tuple[str, str, int]) -> None:
    """INVALID_REQUEST for the first (what, value, most) whose value is longer than its most."""
    for what, value, most in fields:
        if len(value) > most:
            raise CoordinatorError(f"{what} of {len(value)} characters, longer than {most}",
                                   code=ErrorCode.INVALID_REQUEST)


def _decode_assignment(member_id: str, raw: bytes, max_decoded_bytes: int) -> Any:
    """A consumer member's assigned partitions (TopicPartitionRef), () when it has none or they do not decode, None
    when they would cost more than ``max_decoded_bytes`` decoded."""
    if not raw:
        return ()
    try:
        return records.consumer_assignment(raw, max(0, max_decoded_bytes)).partitions
    except records.consumer_protocol.DecodedTooLarge:
        return None
    except Exception as exc:  # noqa: BLE001 - a client's bytes; describe must not fail on them
        log.debug("undecodable consumer assignment of %s: %s", member_id, exc)
        return ()


def _decode_consumer_member(dm: group_pb2.DescribedMember, assigned: Any) -> None:
    try:
        sub = records.consumer_subscription(dm.metadata, owned=False)  # its topics are shown, not what it owned
    except Exception as exc:  # noqa: BLE001 - a client's bytes; describe must not fail on them
        log.debug("undecodable consumer metadata of %s: %s", dm.member_id, exc)
        return
    dm.subscribed_topics.extend(sub.topics)
    dm.assigned_partitions.extend(assigned)


def install(broker: Any) -> GroupCoordinator:
    """BrokerServer extension: create the coordinator, serve it on the broker's gRPC server."""
    from broker.authorizer import ALLOW_ALL
    from broker.group_service import GroupCoordinatorServicer, add_to_server

    config = CoordinatorConfig.from_defaults(dict(getattr(broker.settings, "defaults", {}) or {}))
    coordinator = GroupCoordinator(node_id=broker.settings.node_id, replica_manager=broker.replica_manager,
                                   metadata_cache=broker.metadata_cache, config=config)
    coordinator.security = getattr(broker.settings, "inter_broker_security", None) or SecurityConfig()
    servicer = GroupCoordinatorServicer(coordinator, authorizer=getattr(broker, "authorizer", ALLOW_ALL),
                                        cpu=getattr(getattr(broker, "capacity", None), "cpu", None))
    servicer.listener_by_tls = broker.listener_by_tls() if hasattr(broker, "listener_by_tls") else {}
    broker.add_servicer(lambda server: add_to_server(servicer, server))  # JoinGroup answers keep metadata apart
    coordinator.start()
    broker.group_coordinator = coordinator
    broker.group_servicer = servicer  # the Kafka-protocol listener calls it too
    return coordinator
