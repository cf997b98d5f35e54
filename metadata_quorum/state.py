"""MetadataState: all cluster metadata as one deterministic, replayable state machine.

Brokers, topics and partitions change only through ``apply(command)``. Applying reads
nothing but the state and the command (no clock, socket, file or random source), so
every controller that applies the same Raft log ends in the same state, and a journal
replay after a restart rebuilds it exactly.

Because a restart replays the journal, what this state accepts must not become stricter
between versions (a topic accepted before an upgrade would vanish on replay): new limits,
such as min.insync.replicas <= replication factor, are checked by the active controller
before it proposes a command.

Every successful command bumps ``version`` by one. A refused command (bad input, a
stale compare-and-set) changes nothing, not even the version, and returns its error.

A bounded changelog remembers which entities each version touched, so a watcher that
has version V gets the *current* values of everything changed since V; a watcher older
than the changelog window gets a snapshot instead.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain, takewhile
from typing import Any

from metadata_quorum import cluster_configs, features
from metadata_quorum import commands as c
from metadata_quorum import security as sec
from metadata_quorum.election import NO_LEADER, elect_leader, isr_without
from proto import errors
from proto.errors import ErrorCode
from storage import log_config

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1
MAX_TOPIC_NAME_CHARS = 249
MAX_PARTITIONS_PER_TOPIC = 100_000
MAX_PRODUCER_ID_BLOCK = 1_000_000
DEFAULT_CHANGELOG_MAX_KEYS = 250_000
_UNSEEN_SLACK = 1024  # keys the view's change set may hold beyond the state's size before it resets
_TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]+$")

# Changelog keys: which entity a version touched.
BrokerKey = tuple[str, int]  # ("B", node_id)
TopicKey = tuple[str, str]  # ("T", topic_id)
PartitionKey = tuple[str, str, int]  # ("P", topic_id, partition)


@dataclass(slots=True)
class BrokerState:
    node_id: int
    incarnation_id: str
    broker_epoch: int  # the metadata version that registered this incarnation
    endpoints: list[tuple[str, str, int]]  # (listener name, host, port)
    rack: str = ""
    fenced: bool = True
    in_controlled_shutdown: bool = False
    # Most partition replicas it may hold (reported at registration, from its descriptor limit and
    # max.partitions.per.broker); 0 = unbounded (a broker of an older release, a journal written before).
    partition_capacity: int = 0
    # This incarnation registered with log directories made at its start (a replaced or wiped disk): an
    # unclean election picks it only when no other replica can lead.
    storage_created: bool = False

    @property
    def eligible(self) -> bool:
        """May lead or join an ISR."""
        return not self.fenced and not self.in_controlled_shutdown


@dataclass(slots=True)
class PartitionState:
    replicas: list[int]  # during a reassignment: the target replicas first, then the ones leaving
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    adding: list[int] = field(default_factory=list)  # reassignment: replicas joining (not yet in sync)
    removing: list[int] = field(default_factory=list)  # reassignment: replicas leaving once the target is in sync

    @property
    def replication_factor(self) -> int:
        """The partition's size outside a reassignment (a reassignment keeps it)."""
        return len(self.replicas) - len(self.adding)

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> list[int]:
        return [r for r in self.replicas if r not in self.removing]

    @property
    def original(self) -> list[int]:
        return [r for r in self.replicas if r not in self.adding]


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: str
    configs: dict[str, str]
    partitions: list[PartitionState] = field(default_factory=list)
    request_id: str = ""  # the creating client's id for the request (CreatableTopic.request_id), if any


@dataclass(slots=True)
class ApplyResult:
    error_code: int = ErrorCode.NONE
    error_message: str = ""
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.NONE

    def raise_for_error(self) -> None:
        errors.raise_for(self.error_code, self.error_message)


@dataclass(slots=True)
class ItemResult:
    """Per-partition outcome of a ChangePartition item."""

    error_code: int
    error_message: str
    topic: str
    partition: int
    state: PartitionState | None  # a copy of the state after (or as it is, on refusal)


@dataclass(slots=True)
class MetadataDelta:
    """What a watcher needs to go from ``since_version`` to ``version``."""

    version: int
    is_snapshot: bool
    brokers: list[BrokerState]
    topics: list[TopicState]
    partitions: list[tuple[TopicState, int, PartitionState]]
    deleted_topic_ids: list[str]
    unregistered_broker_ids: list[int]
    # Security records: credentials upserted / deleted ((user, mechanism)), the whole ACL
    # set when it changed (None = unchanged), quota entities with current values ({} = removed).
    credentials: list[sec.ScramCredential] = field(default_factory=list)
    deleted_credentials: list[tuple[str, str]] = field(default_factory=list)
    acls: list[sec.AclBinding] | None = None
    quotas: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    cluster_configs: dict[str, str] | None = None  # all dynamic cluster configs when they changed
    metadata_level: int | None = None  # the finalized brook.metadata.version when it changed (features.py)


class MetadataInvariantError(Exception):
    """A programming error: applying a command raised, or left the state breaking an invariant.

    Deliberately not a ``BrookError``: it must never reach a client as a refusal (such
    as INVALID_REQUEST). Like Kafka's controller on a metadata invariant violation, the
    voter stops (``MetadataRaft`` halts it) rather than serve, or replicate, a state it
    cannot trust.
    """


def validate_topic_name(name: str) -> None:
    """Kafka's rules: [a-zA-Z0-9._-]{1,249}, not '.' or '..'."""
    if not name:
        raise errors.InvalidTopicException("topic name is empty")
    if name in (".", ".."):
        raise errors.InvalidTopicException(f"topic name cannot be '{name}'")
    if len(name) > MAX_TOPIC_NAME_CHARS:
        raise errors.InvalidTopicException(
            f"topic name is {len(name)} characters, the limit is {MAX_TOPIC_NAME_CHARS}")
    if not _TOPIC_NAME_RE.match(name):
        raise errors.InvalidTopicException(
            f"topic name '{name}' is illegal: only ASCII letters, digits, '.', '_' and '-' are allowed")


def collision_key(name: str) -> str:
    """Kafka's Topic.unifyCollisionChars: '.' and '_' collide (metric names flatten one to the other)."""
    return name.replace(".", "_")


def _invariant(ok: bool, what: str) -> None:
    if not ok:
        raise MetadataInvariantError(f"metadata invariant violated: {what}")


def replica_room_refusal(what: str, broker_id: int, capacity: int, count: int, adding: int) -> str:
    """The POLICY_VIOLATION message of a change that would put more replicas on a broker than its capacity."""
    return (f"{what}: broker {broker_id} has no room for {adding} more partition replica"
            f"{'s' if adding != 1 else ''}: it holds {count} of its capacity of {capacity} (the broker's "
            f"file-descriptor limit / 12, or its max.partitions.per.broker); raise its limit (ulimit -n), add "
            f"brokers or delete topics")


def _copy_partition(p: PartitionState) -> PartitionState:
    return PartitionState(list(p.replicas), list(p.isr), p.leader, p.leader_epoch, p.partition_epoch,
                          list(p.adding), list(p.removing))


def _replicas_per_broker(assignments: Iterable[list[int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for replicas in assignments:
        for r in replicas:
            out[r] = out.get(r, 0) + 1
    return out


def _bump(counts: dict[int, int], key: int, by: int) -> None:
    n = counts.get(key, 0) + by
    _invariant(n >= 0, f"derived count of {key} went negative")
    if n:
        counts[key] = n
    else:
        del counts[key]


def _partition_from_snapshot(entry: list[Any]) -> PartitionState:
    """[replicas, isr, leader, leader_epoch, partition_epoch] plus [adding, removing] while reassigning."""
    replicas, isr, leader, leader_epoch, partition_epoch = entry[:5]
    adding, removing = (entry[5], entry[6]) if len(entry) >= 7 else ([], [])
    return PartitionState(list(replicas), list(isr), leader, leader_epoch, partition_epoch, list(adding),
                          list(removing))


class MetadataState:
    """The cluster metadata; mutate only through ``apply``. Not thread-safe: the owner locks."""

    def __init__(self, *, changelog_max_keys: int = DEFAULT_CHANGELOG_MAX_KEYS) -> None:
        self.version = 0
        self.active_controller_id = -1
        self.controller_epoch = 0  # the Raft term of the last activation
        self.unclean_leader_election_default = False
        self.next_producer_id = 0
        self.brokers: dict[int, BrokerState] = {}
        self.topics: dict[str, TopicState] = {}  # by name
        self.topics_by_id: dict[str, TopicState] = {}
        # Topic names by their collision key ('.' read as '_'; Kafka's metric names flatten one to the other):
        # the controller refuses a new name that collides with an existing one, as Kafka's does.
        self.topics_by_collision_key: dict[str, set[str]] = {}
        self.scram: dict[tuple[str, str], sec.ScramCredential] = {}  # (user, mechanism)
        # Replaced, never changed in place: a reader takes the current set under the lock and may use it
        # after (the controller matches DeleteAcls filters against it outside the lock).
        self.acls: frozenset[sec.AclBinding] = frozenset()
        self.quotas: dict[str, dict[str, float]] = {}  # entity -> quota values
        self.cluster_configs: dict[str, str] = {}  # dynamic broker configs (metadata_quorum/cluster_configs.py)
        # The finalized brook.metadata.version (metadata_quorum/features.py): what every node may be asked to apply.
        self.metadata_level = features.SUPPORTED_MIN
        self._changelog_max_keys = changelog_max_keys
        self._changelog: deque[tuple[int, tuple[Any, ...]]] = deque()
        self._changelog_keys = 0
        self._changelog_floor = 0  # deltas are exact for since_version >= this
        self._touched: list[Any] = []
        # Derived figures, kept as records are applied (O(1) per partition changed) and recounted on
        # restore, so the queries below cost O(1) or O(brokers) under the owner's lock, never
        # O(partitions): a heartbeat in controlled shutdown, CreateTopics' placement, the controller's
        # tick (reassignments) and the node's stats read them. Always equal to a full recount
        # (tests/metadata_quorum/test_derived_figures.py checks it after every step of random histories).
        self._partition_total = 0
        self._replicas_on: dict[int, int] = {}  # broker id -> partitions naming it a replica (zero: absent)
        self._preferred_on: dict[int, int] = {}  # broker id -> partitions whose first replica it is
        self._leading: dict[int, int] = {}  # leader id (NO_LEADER: offline) -> partitions
        self._reassigning: dict[tuple[str, int], None] = {}  # (topic id, index) of partitions being moved
        # DescribeCluster's view (metadata_quorum/cluster_view.py) takes the topics and partitions changed
        # since its last read (``take_unseen``), first-touched first, instead of walking them all. Local
        # bookkeeping, not metadata: never in a snapshot, no effect on what a command does. Bounded: past
        # the state's own size it is dropped and the view reloads everything, once.
        self._unseen: dict[tuple[Any, ...], None] = {}
        self._unseen_all = True
        self._unseen_reader: object | None = None
        # Snapshots restored in place (local bookkeeping, like the above): a reader that copies the state
        # over several holds (a watcher's update, cluster_view.WatchReader) starts again when it moved.
        self.restores = 0
        self._handlers: dict[type, Callable[[Any], ApplyResult]] = {
            c.ActivateController: self._activate_controller,
            c.RegisterBroker: self._register_broker,
            c.FenceBroker: self._fence_broker,
            c.UnfenceBroker: self._unfence_broker,
            c.BeginControlledShutdown: self._begin_controlled_shutdown,
            c.UnregisterBroker: self._unregister_broker,
            c.CreateTopic: self._create_topic,
            c.DeleteTopic: self._delete_topic,
            c.CreatePartitions: self._create_partitions,
            c.AlterConfigs: self._alter_configs,
            c.ChangePartition: self._change_partition,
            c.AllocateProducerIds: self._allocate_producer_ids,
            c.UpsertScramCredential: self._upsert_scram,
            c.DeleteScramCredential: self._delete_scram,
            c.CreateAcls: self._create_acls,
            c.DeleteAcls: self._delete_acls,
            c.AlterClientQuota: self._alter_client_quota,
            c.AlterReassignment: self._alter_reassignment,
            c.CompleteReassignment: self._complete_reassignment,
            c.AlterClusterConfigs: self._alter_cluster_configs,
            c.UpdateFeature: self._update_feature,
            c.AlterScramCredentials: self._alter_scram,
        }

    # ---- applying commands ----
    def apply(self, cmd: c.Command | dict[str, Any], *, controller_epoch: int | None = None) -> ApplyResult:
        """Apply one command; returns its result. Never raises for bad input.

        ``controller_epoch`` is the Raft term in which the proposing controller became
        active. A command from any other epoch is refused (NOT_CONTROLLER): it was
        decided by a controller that has been replaced, e.g. one pysyncobj forwarded to
        the new leader after the proposer lost leadership. None skips the check (tests,
        tools replaying commands directly).
        """
        name = type(cmd).__name__ if not isinstance(cmd, dict) else str(cmd.get("type"))
        unreadable = c.unknown_to_this_release(cmd)
        if unreadable is not None:
            # Written by a newer release, which the finalized feature level should have kept from writing it while
            # this one runs. Refused here, it would be applied by the voters that know it and skipped by this one:
            # metadata that silently differs (a rolling-upgrade audit saw ISRs frozen and a topic vanish that way,
            # with a release before feature levels). Kafka's controller stops on a record it cannot read; so does
            # this voter.
            raise MetadataInvariantError(f"the metadata log holds a command this release cannot read ({unreadable}): "
                                         f"it was written by a newer release; run that release on this voter")
        try:
            command = c.from_dict(cmd) if isinstance(cmd, dict) else cmd
            handler = self._handlers.get(type(command))
            if handler is None:
                raise errors.InvalidRequestError(f"not a metadata command: {type(command).__name__}")
            if controller_epoch is not None and not isinstance(command, c.ActivateController) \
                    and controller_epoch != self.controller_epoch:
                raise errors.NotControllerError(
                    f"{type(command).__name__} was proposed by the controller of epoch {controller_epoch}; "
                    f"the active controller's epoch is {self.controller_epoch}")
            self._touched = []
            result = handler(command)
        except errors.BrookError as exc:
            # Refused input: handlers validate before they mutate, so nothing changed.
            self._touched = []
            return ApplyResult(exc.code, exc.message)
        except MetadataInvariantError:
            self._touched = []
            raise
        except Exception as exc:
            # Commands are type-checked on the way in (commands.from_dict): anything else is a bug,
            # and the state may be half-changed. Never report it as the caller's fault.
            self._touched = []
            raise MetadataInvariantError(f"applying {name} failed: {type(exc).__name__}: {exc}") from exc
        if result.ok and self._touched:
            self._check_invariants(self._touched)
            self.version += 1
            self._record_changes(self.version, self._touched)
        self._touched = []
        return result

    def _check_invariants(self, touched: list[Any]) -> None:
        """What must hold after every command, for the entities it touched (cheap: O(touched))."""
        for key in dict.fromkeys(touched):
            if key[0] == "P":
                topic = self.topics_by_id.get(key[1])
                if topic is None or key[2] >= len(topic.partitions):
                    continue  # deleted in the same command
                self._check_partition(topic, key[2], topic.partitions[key[2]])
            elif key[0] == "T":
                topic = self.topics_by_id.get(key[1])
                if topic is not None:
                    _invariant(self.topics.get(topic.name) is topic, f"topic {topic.name}: name and id maps disagree")
                    _invariant(topic.name in self.topics_by_collision_key.get(collision_key(topic.name), ()),
                               f"topic {topic.name} is missing from the collision index")
                    _invariant(bool(topic.partitions), f"topic {topic.name} has no partitions")
                    rf = topic.partitions[0].replication_factor
                    # From level 5 a reassignment may change one partition's replica count (as in Kafka).
                    _invariant(self.metadata_level >= features.REPLICATION_FACTOR_CHANGE
                               or all(p.replication_factor == rf for p in topic.partitions),
                               f"topic {topic.name}: partitions with different replication factors")
            elif key[0] == "B":
                broker = self.brokers.get(key[1])
                if broker is not None:
                    _invariant(broker.broker_epoch <= self.version + 1,
                               f"broker {broker.node_id}: epoch {broker.broker_epoch} from the future")
        _invariant(len(self.topics) == len(self.topics_by_id), "topic name and id maps differ in size")

    @staticmethod
    def _check_partition(topic: TopicState, index: int, p: PartitionState) -> None:
        name = f"{topic.name}-{index}"
        _invariant(bool(p.replicas) and len(set(p.replicas)) == len(p.replicas),
                   f"{name}: replicas {p.replicas} must be distinct and non-empty")
        _invariant(len(set(p.isr)) == len(p.isr) and set(p.isr) <= set(p.replicas),
                   f"{name}: ISR {p.isr} must be distinct replicas of {p.replicas}")
        _invariant(p.leader == NO_LEADER or p.leader in p.isr, f"{name}: leader {p.leader} is not in the ISR {p.isr}")
        _invariant(p.leader_epoch >= 0 and p.partition_epoch >= 0,
                   f"{name}: negative epochs ({p.leader_epoch}, {p.partition_epoch})")
        _invariant(set(p.adding) <= set(p.replicas) and set(p.removing) <= set(p.replicas)
                   and not set(p.adding) & set(p.removing) and len(p.target) > 0 and len(p.original) > 0,
                   f"{name}: reassignment adding {p.adding} / removing {p.removing} does not fit replicas {p.replicas}")

    def _touch(self, key: Any) -> None:
        self._touched.append(key)

    def _activate_controller(self, cmd: c.ActivateController) -> ApplyResult:
        if cmd.term <= self.controller_epoch:
            # A stale activation (e.g. forwarded by a deposed leader) must not roll the epoch back.
            raise errors.NotControllerError(
                f"activation for term {cmd.term} is stale: the controller epoch is already {self.controller_epoch}")
        previous = self.controller_epoch
        self.active_controller_id = cmd.node_id
        self.controller_epoch = cmd.term
        self.unclean_leader_election_default = bool(cmd.unclean_leader_election_default)
        self._touch(("C",))
        # The epoch before this activation, as of its place in the log (every earlier entry applied): 0 when it is
        # the first activation the cluster ever had (the controller then finalizes initial.metadata.version).
        return ApplyResult(value=previous)

    # -- brokers --
    def _register_broker(self, cmd: c.RegisterBroker) -> ApplyResult:
        if cmd.node_id < 0:
            raise errors.InvalidRequestError(f"broker id must be >= 0, got {cmd.node_id}")
        if not isinstance(cmd.endpoints, list) or not all(
                isinstance(e, list | tuple) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str)
                and isinstance(e[2], int) for e in cmd.endpoints):
            raise errors.InvalidRequestError(f"broker {cmd.node_id}: endpoints must be [name, host, port] lists")
        endpoints = [(str(e[0]), str(e[1]), int(e[2])) for e in cmd.endpoints]
        if cmd.partition_capacity < 0:
            raise errors.InvalidRequestError(
                f"broker {cmd.node_id}: partition capacity must be >= 0, got {cmd.partition_capacity}")
        old = self.brokers.get(cmd.node_id)
        if old is not None and old.incarnation_id == cmd.incarnation_id:
            # The same process registering again (a retried request): idempotent.
            return ApplyResult(value=old.broker_epoch)
        if cmd.storage_created:
            # Its log directories are new (a replaced or wiped disk): it has none of the records it had. It
            # leaves every ISR, the last member's place included: left there, the next clean election would make
            # its empty log the partition's, and the other replicas would truncate to it (every acknowledged
            # record gone; Kafka has the same hole before KIP-966). The partition waits offline for an unclean
            # election, which takes a replica that kept its log first.
            self._remove_from_partitions(cmd.node_id, keep_last=False)
        elif old is not None and old.eligible:
            # A new incarnation means the old process is gone: its replicas may have lost
            # unflushed data, so it leaves every ISR and its leaderships move.
            self._remove_from_partitions(old.node_id)
        epoch = self.version + 1
        self.brokers[cmd.node_id] = BrokerState(cmd.node_id, cmd.incarnation_id, epoch, endpoints, cmd.rack,
                                                partition_capacity=cmd.partition_capacity,
                                                storage_created=cmd.storage_created)
        self._touch(("B", cmd.node_id))
        return ApplyResult(value=epoch)

    def broker_with_epoch(self, node_id: int, broker_epoch: int) -> BrokerState:
        """The registered broker, if ``broker_epoch`` is its current one; raises the Kafka error otherwise."""
        broker = self.brokers.get(node_id)
        if broker is None:
            raise errors.error_class(ErrorCode.BROKER_ID_NOT_REGISTERED)(f"broker {node_id} is not registered")
        if broker.broker_epoch != broker_epoch:
            raise errors.error_class(ErrorCode.STALE_BROKER_EPOCH)(
                f"broker {node_id}: epoch {broker_epoch} is stale, the registered epoch is {broker.broker_epoch}")
        return broker

    def _fence_broker(self, cmd: c.FenceBroker) -> ApplyResult:
        broker = self.broker_with_epoch(cmd.node_id, cmd.broker_epoch)
        if broker.fenced:
            return ApplyResult()
        broker.fenced = True
        broker.in_controlled_shutdown = False
        self._touch(("B", broker.node_id))
        self._remove_from_partitions(broker.node_id)
        return ApplyResult()

    def _unfence_broker(self, cmd: c.UnfenceBroker) -> ApplyResult:
        broker = self.broker_with_epoch(cmd.node_id, cmd.broker_epoch)
        if not broker.fenced:
            return ApplyResult()
        broker.fenced = False
        broker.in_controlled_shutdown = False
        self._touch(("B", broker.node_id))
        self._elect_offline_partitions(lambda topic, p: broker.node_id in p.replicas)
        return ApplyResult()

    def _begin_controlled_shutdown(self, cmd: c.BeginControlledShutdown) -> ApplyResult:
        broker = self.broker_with_epoch(cmd.node_id, cmd.broker_epoch)
        if broker.fenced or broker.in_controlled_shutdown:
            return ApplyResult(value=self.leadership_count(broker.node_id))
        broker.in_controlled_shutdown = True
        self._touch(("B", broker.node_id))
        self._remove_from_partitions(broker.node_id)
        return ApplyResult(value=self.leadership_count(broker.node_id))

    def _unregister_broker(self, cmd: c.UnregisterBroker) -> ApplyResult:
        broker = self.brokers.get(cmd.node_id)
        if broker is None:
            raise errors.error_class(ErrorCode.BROKER_ID_NOT_REGISTERED)(f"broker {cmd.node_id} is not registered")
        if broker.eligible:
            self._remove_from_partitions(broker.node_id)
        del self.brokers[cmd.node_id]
        self._touch(("B", cmd.node_id))
        return ApplyResult()

    def _eligible_ids(self) -> set[int]:
        return {b.node_id for b in self.brokers.values() if b.eligible}

    def storage_created_ids(self) -> set[int]:
        """Brokers whose incarnation started on new log directories: an unclean election's last choice."""
        return {b.node_id for b in self.brokers.values() if b.storage_created}

    def _unclean_allowed(self, topic: TopicState) -> bool:
        raw = topic.configs.get("unclean.leader.election.enable",
                                self.cluster_configs.get("unclean.leader.election.enable"))
        if raw is None:
            return self.unclean_leader_election_default
        return raw.strip().lower() == "true"

    def _remove_from_partitions(self, broker_id: int, *, keep_last: bool = True) -> None:
        """A broker can no longer serve: drop it from every ISR and move its leaderships. ``keep_last``: as
        the last member of an ISR it stays there (Kafka's rule), unless its log is gone (``keep_last`` False)."""
        eligible = self._eligible_ids()
        eligible.discard(broker_id)
        fresh = self.storage_created_ids()
        if not keep_last:
            fresh.add(broker_id)
        for topic in self.topics.values():
            unclean = None
            for index, p in enumerate(topic.partitions):
                if broker_id not in p.replicas:
                    continue
                if broker_id not in p.isr:
                    new_isr = p.isr
                elif keep_last:
                    new_isr = isr_without(p.isr, broker_id)
                else:
                    new_isr = [r for r in p.isr if r != broker_id]
                new_leader, new_isr_final = p.leader, new_isr
                if p.leader == broker_id or p.leader == NO_LEADER:
                    if unclean is None:
                        unclean = self._unclean_allowed(topic)
                    chosen = elect_leader(p.replicas, new_isr, eligible, unclean_allowed=unclean,
                                          last_resort=fresh)
                    new_leader, new_isr_final = chosen.leader, chosen.isr
                self._set_partition(topic, index, p, new_leader, new_isr_final)

    def _elect_offline_partitions(self, where: Callable[[TopicState, PartitionState], bool],
                                  topics: Iterable[TopicState] | None = None) -> None:
        eligible = self._eligible_ids()
        fresh = self.storage_created_ids()
        for topic in list(self.topics.values()) if topics is None else topics:
            unclean = None
            for index, p in enumerate(topic.partitions):
                if p.leader != NO_LEADER or not where(topic, p):
                    continue
                if unclean is None:
                    unclean = self._unclean_allowed(topic)
                chosen = elect_leader(p.replicas, p.isr, eligible, unclean_allowed=unclean, last_resort=fresh)
                if chosen.leader != NO_LEADER:
                    self._set_partition(topic, index, p, chosen.leader, chosen.isr)

    def _set_partition(self, topic: TopicState, index: int, p: PartitionState,
                       leader: int, isr: list[int], *, replicas: list[int] | None = None,
                       adding: list[int] | None = None, removing: list[int] | None = None) -> bool:
        """Change leader/ISR (and, for reassignments, the replicas); bump the leader epoch on a leader
        change and the partition epoch on any change."""
        new_replicas = p.replicas if replicas is None else list(replicas)
        new_adding = p.adding if adding is None else list(adding)
        new_removing = p.removing if removing is None else list(removing)
        if leader == p.leader and isr == p.isr and (new_replicas, new_adding, new_removing) == (
                p.replicas, p.adding, p.removing):
            return False
        old_epochs = (p.leader_epoch, p.partition_epoch)
        old_leader, old_replicas, was_moving = p.leader, p.replicas, p.reassigning
        if leader != p.leader:
            p.leader_epoch += 1
            p.leader = leader
        p.replicas, p.adding, p.removing = new_replicas, new_adding, new_removing
        p.isr = list(isr)
        p.partition_epoch += 1
        # The derived figures: only what changed (an ISR change changes none of them).
        if leader != old_leader:
            _bump(self._leading, old_leader, -1)
            _bump(self._leading, leader, 1)
        if new_replicas is not old_replicas and new_replicas != old_replicas:
            for r in old_replicas:
                _bump(self._replicas_on, r, -1)
            for r in new_replicas:
                _bump(self._replicas_on, r, 1)
            _bump(self._preferred_on, old_replicas[0], -1)
            _bump(self._preferred_on, new_replicas[0], 1)
        if p.reassigning != was_moving:
            if was_moving:
                del self._reassigning[(topic.topic_id, index)]
            else:
                self._reassigning[(topic.topic_id, index)] = None
        _invariant(p.leader_epoch >= old_epochs[0] and p.partition_epoch > old_epochs[1],
                   f"{topic.name}-{index}: epochs went from {old_epochs} to {(p.leader_epoch, p.partition_epoch)}")
        self._touch(("P", topic.topic_id, index))
        return True

    def _count(self, topic_id: str, partitions: Iterable[tuple[int, PartitionState]], sign: int) -> None:
        """Add (1) or take away (-1) partitions' shares of the derived figures (made or deleted)."""
        replicas_on, preferred_on, leading = self._replicas_on, self._preferred_on, self._leading
        counted = 0
        for index, p in partitions:
            counted += 1
            replicas = p.replicas
            for r in replicas:
                n = replicas_on.get(r, 0) + sign
                if n > 0:
                    replicas_on[r] = n
                else:
                    _bump(replicas_on, r, sign)  # to zero (the entry goes), or a broken count (raises)
            n = preferred_on.get(replicas[0], 0) + sign  # (a partition always has replicas)
            if n > 0:
                preferred_on[replicas[0]] = n
            else:
                _bump(preferred_on, replicas[0], sign)
            n = leading.get(p.leader, 0) + sign
            if n > 0:
                leading[p.leader] = n
            else:
                _bump(leading, p.leader, sign)
            if p.adding or p.removing:
                if sign > 0:
                    self._reassigning[(topic_id, index)] = None
                else:
                    self._reassigning.pop((topic_id, index), None)
        self._partition_total += sign * counted

    def _recount(self) -> None:
        """Every figure from a walk of every partition (a snapshot restored)."""
        replicas_on: dict[int, int] = {}
        preferred_on: dict[int, int] = {}
        leading: dict[int, int] = {}
        moving: dict[tuple[str, int], None] = {}
        total = 0
        for topic in self.topics.values():
            total += len(topic.partitions)
            for index, p in enumerate(topic.partitions):
                replicas = p.replicas
                for r in replicas:
                    replicas_on[r] = replicas_on.get(r, 0) + 1
                preferred_on[replicas[0]] = preferred_on.get(replicas[0], 0) + 1
                leading[p.leader] = leading.get(p.leader, 0) + 1
                if p.adding or p.removing:
                    moving[(topic.topic_id, index)] = None
        self._partition_total = total
        self._replicas_on, self._preferred_on, self._leading, self._reassigning = \
            replicas_on, preferred_on, leading, moving

    def leadership_count(self, broker_id: int) -> int:
        """Partitions ``broker_id`` leads (NO_LEADER: the offline ones)."""
        return self._leading.get(broker_id, 0)

    def replica_count(self, broker_id: int) -> int:
        """Partitions naming ``broker_id`` among their replicas (a reassignment's joining ones included)."""
        return self._replicas_on.get(broker_id, 0)

    def check_replica_room(self, added: dict[int, int], what: str) -> None:
        """POLICY_VIOLATION if ``added`` (broker id -> new replicas) puts more replicas on a broker than the
        capacity it registered with. Reads replicated data only (the registrations and the replica counts),
        so every voter decides alike; the active controller checks the same before proposing, and this
        catches two requests planned concurrently. A broker without a capacity (0) is unbounded, so a
        journal written before capacities existed replays exactly as before."""
        for broker_id in sorted(added):
            broker = self.brokers.get(broker_id)
            if broker is None or broker.partition_capacity <= 0 or added[broker_id] <= 0:
                continue
            count = self.replica_count(broker_id)
            if count + added[broker_id] > broker.partition_capacity:
                raise errors.PolicyViolationError(
                    replica_room_refusal(what, broker_id, broker.partition_capacity, count, added[broker_id]))

    def preferred_leader_count(self, broker_id: int) -> int:
        """Partitions whose first replica (preferred leader) is ``broker_id``."""
        return self._preferred_on.get(broker_id, 0)

    # -- topics --
    def _validate_assignments(self, assignments: list[list[int]], replication_factor: int | None) -> None:
        if not assignments:
            raise errors.InvalidPartitionsError("a topic needs at least 1 partition")
        if len(assignments) > MAX_PARTITIONS_PER_TOPIC:
            raise errors.InvalidPartitionsError(
                f"{len(assignments)} partitions is more than the limit of {MAX_PARTITIONS_PER_TOPIC}")
        rf = replication_factor if replication_factor is not None else len(assignments[0])
        for index, replicas in enumerate(assignments):
            if not replicas:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(f"partition {index} has no replicas")
            if len(set(replicas)) != len(replicas):
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"partition {index} lists a broker twice: {replicas}")
            if len(replicas) != rf:
                raise errors.InvalidReplicationFactorError(
                    f"partition {index} has {len(replicas)} replicas, the topic's replication factor is {rf}")
            unknown = [r for r in replicas if r not in self.brokers]
            if unknown:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"partition {index} names unregistered brokers {unknown}")
            if not any(self.brokers[r].eligible for r in replicas):
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"every broker of partition {index} {replicas} is fenced or shutting down")

    def _new_partition(self, replicas: list[int], eligible: set[int]) -> PartitionState:
        isr = [r for r in replicas if r in eligible]
        leader = isr[0] if isr else NO_LEADER
        return PartitionState(list(replicas), isr, leader, 0, 0)

    def _create_topic(self, cmd: c.CreateTopic) -> ApplyResult:
        validate_topic_name(cmd.name)
        if cmd.name in self.topics:
            raise errors.TopicAlreadyExistsError(f"topic '{cmd.name}' already exists")
        if not cmd.topic_id or cmd.topic_id in self.topics_by_id:
            raise errors.InvalidRequestError(f"topic id '{cmd.topic_id}' is empty or already used")
        configs = log_config.validate(cmd.configs)
        self._validate_assignments(cmd.assignments, None)
        self.check_replica_room(_replicas_per_broker(cmd.assignments), f"topic '{cmd.name}'")
        eligible = self._eligible_ids()
        topic = TopicState(cmd.name, cmd.topic_id, configs,
                           [self._new_partition(r, eligible) for r in cmd.assignments], cmd.request_id)
        self.topics[cmd.name] = topic
        self.topics_by_id[cmd.topic_id] = topic
        self.topics_by_collision_key.setdefault(collision_key(cmd.name), set()).add(cmd.name)
        self._touch(("T", topic.topic_id))
        self._count(topic.topic_id, enumerate(topic.partitions), 1)
        for index in range(len(topic.partitions)):
            self._touch(("P", topic.topic_id, index))
        return ApplyResult(value=topic.topic_id)

    def _topic(self, name: str, topic_id: str) -> TopicState:
        topic = self.topics.get(name)
        if topic is None or (topic_id and topic.topic_id != topic_id):
            raise errors.UnknownTopicOrPartitionError(f"topic '{name}' does not exist"
                                                      + (f" with id {topic_id}" if topic and topic_id else ""))
        return topic

    def _delete_topic(self, cmd: c.DeleteTopic) -> ApplyResult:
        topic = self._topic(cmd.name, cmd.topic_id)
        del self.topics[topic.name]
        del self.topics_by_id[topic.topic_id]
        key = collision_key(topic.name)
        colliding = self.topics_by_collision_key[key]
        colliding.discard(topic.name)
        if not colliding:
            del self.topics_by_collision_key[key]
        self._count(topic.topic_id, enumerate(topic.partitions), -1)
        self._touch(("T", topic.topic_id))
        return ApplyResult(value=topic.topic_id)

    def _create_partitions(self, cmd: c.CreatePartitions) -> ApplyResult:
        topic = self._topic(cmd.name, cmd.topic_id)
        current = len(topic.partitions)
        if cmd.expected_count != current:
            raise errors.InvalidPartitionsError(
                f"topic '{topic.name}' has {current} partitions, the request was planned for {cmd.expected_count}")
        if current + len(cmd.assignments) > MAX_PARTITIONS_PER_TOPIC:
            raise errors.InvalidPartitionsError(f"more than {MAX_PARTITIONS_PER_TOPIC} partitions")
        self._validate_assignments(cmd.assignments, topic.partitions[0].replication_factor)
        self.check_replica_room(_replicas_per_broker(cmd.assignments), f"topic '{topic.name}'")
        eligible = self._eligible_ids()
        for replicas in cmd.assignments:
            topic.partitions.append(self._new_partition(replicas, eligible))
            self._count(topic.topic_id, [(len(topic.partitions) - 1, topic.partitions[-1])], 1)
            self._touch(("P", topic.topic_id, len(topic.partitions) - 1))
        self._touch(("T", topic.topic_id))
        return ApplyResult(value=len(topic.partitions))

    def _alter_configs(self, cmd: c.AlterConfigs) -> ApplyResult:
        topic = self._topic(cmd.name, cmd.topic_id)
        to_set = log_config.validate(cmd.set)
        unknown = [k for k in cmd.delete if k not in log_config.TOPIC_CONFIGS]
        if unknown:
            raise errors.InvalidConfigError(f"cannot delete unknown topic configs {unknown}")
        configs = dict(topic.configs)
        for key in cmd.delete:
            configs.pop(key, None)
        configs.update(to_set)
        if configs == topic.configs:
            return ApplyResult()
        topic.configs = configs
        self._touch(("T", topic.topic_id))
        if self._unclean_allowed(topic):
            # Kafka elects offline partitions as soon as unclean election is enabled.
            self._elect_offline_partitions(lambda t, p: True, [topic])
        return ApplyResult()

    # -- partitions --
    def _change_partition(self, cmd: c.ChangePartition) -> ApplyResult:
        if cmd.broker_id >= 0:
            broker = self.broker_with_epoch(cmd.broker_id, cmd.broker_epoch)
            if broker.fenced:
                raise errors.error_class(ErrorCode.STALE_BROKER_EPOCH)(f"broker {cmd.broker_id} is fenced")
        eligible = self._eligible_ids()
        results = []
        for item in cmd.items:
            try:
                results.append(self._change_one(cmd.broker_id, item, eligible))
            except errors.BrookError as exc:
                topic = self.topics.get(item.topic)
                current = None
                if topic is not None and 0 <= item.partition < len(topic.partitions):
                    current = _copy_partition(topic.partitions[item.partition])
                results.append(ItemResult(exc.code, exc.message, item.topic, item.partition, current))
        return ApplyResult(value=results)

    def _change_one(self, broker_id: int, item: c.PartitionChangeItem, eligible: set[int]) -> ItemResult:
        topic = self.topics.get(item.topic)
        if topic is None or not 0 <= item.partition < len(topic.partitions):
            raise errors.UnknownTopicOrPartitionError(f"{item.topic}-{item.partition} does not exist")
        p = topic.partitions[item.partition]
        if item.leader_epoch >= 0 and item.leader_epoch != p.leader_epoch:
            code = ErrorCode.FENCED_LEADER_EPOCH if item.leader_epoch < p.leader_epoch \
                else ErrorCode.UNKNOWN_LEADER_EPOCH
            raise errors.error_class(code)(
                f"{item.topic}-{item.partition}: leader epoch {item.leader_epoch}, current is {p.leader_epoch}")
        if broker_id >= 0 and p.leader != broker_id:
            raise errors.NotLeaderOrFollowerError(
                f"{item.topic}-{item.partition}: broker {broker_id} is not the leader (leader is {p.leader})")
        if item.partition_epoch != p.partition_epoch:
            raise errors.InvalidUpdateVersionError(
                f"{item.topic}-{item.partition}: partition epoch {item.partition_epoch} is stale, "
                f"current is {p.partition_epoch}")
        leader = p.leader if item.new_leader is None else item.new_leader
        isr = list(p.isr) if item.new_isr is None else list(item.new_isr)
        self._check_change(item, p, leader, isr, eligible)
        self._set_partition(topic, item.partition, p, leader, isr)
        return ItemResult(ErrorCode.NONE, "", item.topic, item.partition, _copy_partition(p))

    @staticmethod
    def _check_change(item: c.PartitionChangeItem, p: PartitionState, leader: int, isr: list[int],
                      eligible: set[int]) -> None:
        name = f"{item.topic}-{item.partition}"
        if not isr or len(set(isr)) != len(isr) or any(r not in p.replicas for r in isr):
            raise errors.InvalidRequestError(f"{name}: ISR {isr} must be distinct replicas of {p.replicas}")
        if leader not in isr:
            raise errors.InvalidRequestError(f"{name}: leader {leader} must be in the ISR {isr}")
        added = [r for r in isr if r not in p.isr and r not in eligible]
        if added or (leader != p.leader and leader not in eligible):
            raise errors.error_class(ErrorCode.INELIGIBLE_REPLICA)(
                f"{name}: brokers {added or [leader]} are fenced or shutting down")

    # -- reassignment --
    def _reassigned_partition(self, topic_name: str, index: int, partition_epoch: int) -> tuple[TopicState,
                                                                                                 PartitionState]:
        topic = self.topics.get(topic_name)
        if topic is None or not 0 <= index < len(topic.partitions):
            raise errors.UnknownTopicOrPartitionError(f"{topic_name}-{index} does not exist")
        p = topic.partitions[index]
        if partition_epoch != p.partition_epoch:
            raise errors.InvalidUpdateVersionError(
                f"{topic_name}-{index}: partition epoch {partition_epoch} is stale, current is {p.partition_epoch}")
        return topic, p

    def _alter_reassignment(self, cmd: c.AlterReassignment) -> ApplyResult:
        """Start (or redirect) a move: the replicas become the target followed by the original replicas
        not in it; the new ones join as followers and enter the ISR when caught up. Cancel: back to the
        original replicas. Either way no in-sync original replica is dropped before the move completes."""
        topic, p = self._reassigned_partition(cmd.topic, cmd.partition, cmd.partition_epoch)
        name = f"{cmd.topic}-{cmd.partition}"
        original = p.original
        if cmd.target is None:
            if not p.reassigning:
                raise errors.error_class(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)(f"{name} is not being reassigned")
            target = original
        else:
            target = list(cmd.target)
            if not target or len(set(target)) != len(target):
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"{name}: target replicas {target} must be distinct and non-empty")
            if len(target) != len(original) and self.metadata_level < features.REPLICATION_FACTOR_CHANGE:
                raise errors.InvalidReplicationFactorError(features.needs_level(
                    features.REPLICATION_FACTOR_CHANGE, self.metadata_level,
                    f"{name}: changing the replication factor from {len(original)} to {len(target)} (target replicas "
                    f"{target})"))
            unknown = [r for r in target if r not in self.brokers]
            if unknown:
                raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                    f"{name}: target names unregistered brokers {unknown}")
        replicas = target + [r for r in original if r not in target]
        adding = [r for r in target if r not in original]
        removing = [r for r in original if r not in target]
        self.check_replica_room({r: 1 for r in replicas if r not in p.replicas}, name)
        isr = [r for r in p.isr if r in replicas]
        if not isr:
            raise errors.error_class(ErrorCode.INVALID_REPLICA_ASSIGNMENT)(
                f"{name}: no in-sync replica would be left (ISR {p.isr}, replicas {replicas})")
        leader = p.leader
        if leader != NO_LEADER and leader not in replicas:  # it was a joining replica of the move replaced
            chosen = elect_leader(replicas, isr, self._eligible_ids(), unclean_allowed=False)
            if chosen.leader == NO_LEADER:
                raise errors.error_class(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)(
                    f"{name}: no live in-sync replica of {replicas} can take over from leader {leader}")
            leader = chosen.leader
        self._set_partition(topic, cmd.partition, p, leader, isr, replicas=replicas, adding=adding,
                            removing=removing)
        return ApplyResult()

    def _complete_reassignment(self, cmd: c.CompleteReassignment) -> ApplyResult:
        topic, p = self._reassigned_partition(cmd.topic, cmd.partition, cmd.partition_epoch)
        name = f"{cmd.topic}-{cmd.partition}"
        if not p.reassigning:
            raise errors.error_class(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)(f"{name} is not being reassigned")
        target = p.target
        missing = [r for r in target if r not in p.isr]
        if missing:
            raise errors.InvalidRequestError(f"{name}: target replicas {missing} are not in sync yet")
        isr = [r for r in p.isr if r in target]
        leader = p.leader
        if leader not in target:
            chosen = elect_leader(target, isr, self._eligible_ids(), unclean_allowed=False)
            if chosen.leader == NO_LEADER:
                raise errors.error_class(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)(
                    f"{name}: no live target replica can take over from leader {leader}")
            leader = chosen.leader
        self._set_partition(topic, cmd.partition, p, leader, isr, replicas=target, adding=[], removing=[])
        return ApplyResult()

    # -- dynamic cluster configs --
    def _alter_cluster_configs(self, cmd: c.AlterClusterConfigs) -> ApplyResult:
        to_set = cluster_configs.validate(cmd.set, list(cmd.delete), strict=False)  # as accepted when written
        configs = {k: v for k, v in self.cluster_configs.items() if k not in cmd.delete}
        configs.update(to_set)
        if configs == self.cluster_configs:
            return ApplyResult()
        self.cluster_configs = configs
        self._touch(("C",))
        # Kafka elects offline partitions as soon as unclean election is enabled.
        self._elect_offline_partitions(lambda t, p: self._unclean_allowed(t))
        return ApplyResult()

    # -- finalized features --
    def _update_feature(self, cmd: c.UpdateFeature) -> ApplyResult:
        if cmd.name != features.METADATA_VERSION:
            raise errors.InvalidRequestError(features.unsupported_feature(cmd.name))
        if cmd.level > features.SUPPORTED_MAX:
            # Committed by a controller that found every voter supporting it: this voter was rolled back to an older
            # release since. It cannot apply what the level allowed, so it stops instead of serving a metadata that
            # silently lacks it (a refusal here would let it run on, diverged).
            raise MetadataInvariantError(
                f"the metadata log finalizes {cmd.name} {cmd.level}; this release supports up to "
                f"{features.SUPPORTED_MAX}: run a release that supports it (a finalized level is never lowered)")
        if cmd.level < features.SUPPORTED_MIN:
            raise errors.InvalidUpdateVersionError(
                f"{cmd.name} {cmd.level} is outside the levels this release supports "
                f"({features.SUPPORTED_MIN}..{features.SUPPORTED_MAX})")
        if cmd.level < self.metadata_level:
            raise errors.InvalidUpdateVersionError(
                f"{cmd.name} cannot be lowered from {self.metadata_level} to {cmd.level}: what the higher level "
                f"let the controller write stays in the metadata")
        if cmd.level == self.metadata_level:
            return ApplyResult(value=cmd.level)
        self.metadata_level = cmd.level
        self._touch(("F",))
        return ApplyResult(value=cmd.level)

    def reassignments(self) -> list[tuple[str, int, PartitionState]]:
        """The partitions being reassigned, by topic name and index: O(moves), not O(partitions)."""
        out = []
        for topic_id, index in self._reassigning:
            topic = self.topics_by_id[topic_id]
            out.append((topic.name, index, topic.partitions[index]))
        out.sort(key=lambda item: (item[0], item[1]))
        return out

    def _allocate_producer_ids(self, cmd: c.AllocateProducerIds) -> ApplyResult:
        self.broker_with_epoch(cmd.broker_id, cmd.broker_epoch)
        if not 1 <= cmd.block_size <= MAX_PRODUCER_ID_BLOCK:
            raise errors.InvalidRequestError(f"producer id block size must be 1..{MAX_PRODUCER_ID_BLOCK}")
        start = self.next_producer_id
        self.next_producer_id += cmd.block_size
        self._touch(("PID",))
        return ApplyResult(value=(start, cmd.block_size))

    # -- security: SCRAM credentials, ACLs, quotas --
    def _upsert_scram(self, cmd: c.UpsertScramCredential) -> ApplyResult:
        cred = sec.ScramCredential.from_plain([cmd.user, cmd.mechanism, cmd.salt, cmd.stored_key, cmd.server_key,
                                               cmd.iterations])
        key = (cred.user, cred.mechanism)
        if key not in self.scram and len(self.scram) >= sec.MAX_CREDENTIALS:
            raise errors.InvalidRequestError(f"the cluster already stores {sec.MAX_CREDENTIALS} SCRAM credentials")
        self.scram[key] = cred
        self._touch(("S", cred.user, cred.mechanism))
        return ApplyResult()

    def _delete_scram(self, cmd: c.DeleteScramCredential) -> ApplyResult:
        keys = [k for k in self.scram if k[0] == cmd.user and cmd.mechanism in ("", k[1])]
        if not keys:
            raise errors.error_class(ErrorCode.RESOURCE_NOT_FOUND)(
                f"user {cmd.user!r} has no {cmd.mechanism or 'SCRAM'} credential")
        for key in sorted(keys):
            del self.scram[key]
            self._touch(("S", key[0], key[1]))
        return ApplyResult(value=len(keys))

    def _alter_scram(self, cmd: c.AlterScramCredentials) -> ApplyResult:
        """Every upsertion and deletion, or none: each is checked (credentials valid, deleted ones present, no key
        both upserted and deleted, the credential cap) before anything changes."""
        if self.metadata_level < features.ATOMIC_SCRAM:
            raise errors.UnsupportedVersionError(features.needs_level(
                features.ATOMIC_SCRAM, self.metadata_level, "changing a user's SCRAM credentials in one command"))
        try:
            creds = [sec.ScramCredential.from_plain(list(u)) for u in cmd.upsertions]
        except ValueError as exc:  # a key or salt that is not hex
            raise errors.InvalidRequestError(f"a credential is malformed: {exc}") from None
        if any(len(item) != 2 for item in cmd.deletions):
            raise errors.InvalidRequestError("each deletion is [user, mechanism]")
        doomed: list[tuple[str, str]] = []
        for user, mechanism in cmd.deletions:
            keys = [k for k in self.scram if k[0] == user and mechanism in ("", k[1])]
            if not keys:
                raise errors.error_class(ErrorCode.RESOURCE_NOT_FOUND)(
                    f"user {user!r} has no {mechanism or 'SCRAM'} credential")
            doomed += keys
        upserted = {(cred.user, cred.mechanism) for cred in creds}
        if len(upserted) != len(creds) or len(set(doomed)) != len(doomed) or upserted & set(doomed):
            raise errors.InvalidRequestError("a user credential cannot be altered twice in the same request")
        if len(self.scram) - len(doomed) + len(upserted - set(self.scram)) > sec.MAX_CREDENTIALS:
            raise errors.InvalidRequestError(f"the cluster already stores {sec.MAX_CREDENTIALS} SCRAM credentials")
        for key in doomed:
            del self.scram[key]
            self._touch(("S", key[0], key[1]))
        for cred in creds:
            self.scram[(cred.user, cred.mechanism)] = cred
            self._touch(("S", cred.user, cred.mechanism))
        return ApplyResult(value=len(doomed) + len(creds))

    def _create_acls(self, cmd: c.CreateAcls) -> ApplyResult:
        bindings = [sec.acl_binding(a) for a in cmd.acls]  # all validated before any change
        if self.metadata_level < features.EXTENDED_ACLS:
            extended = next((b for b in bindings if sec.is_extended(b)), None)
            if extended is not None:
                raise errors.UnsupportedVersionError(features.needs_level(
                    features.EXTENDED_ACLS, self.metadata_level, f"an ACL on {extended.resource_type} "
                                                                 f"'{extended.resource_name}' ({extended.operation})"))
        new = set(bindings) - self.acls
        if len(self.acls) + len(new) > sec.MAX_ACLS:
            raise errors.InvalidRequestError(f"more than {sec.MAX_ACLS} ACL bindings")
        if new:
            self.acls = self.acls | new
            self._touch(("ACL",))
        return ApplyResult(value=len(new))

    def _delete_acls(self, cmd: c.DeleteAcls) -> ApplyResult:
        gone = {sec.acl_binding(a) for a in cmd.acls} & self.acls
        if gone:
            self.acls = self.acls - gone
            self._touch(("ACL",))
        return ApplyResult(value=sorted(gone))

    def _alter_client_quota(self, cmd: c.AlterClientQuota) -> ApplyResult:
        entity = sec.validate_quota_entity(cmd.entity)
        to_set = sec.validate_quota_values(dict(cmd.set))
        unknown = [k for k in cmd.remove if k not in sec.QUOTA_KEYS]
        if unknown:
            raise errors.InvalidRequestError(f"cannot remove unknown quotas {unknown}")
        if entity not in self.quotas and len(self.quotas) >= sec.MAX_QUOTA_ENTITIES:
            raise errors.InvalidRequestError(f"more than {sec.MAX_QUOTA_ENTITIES} quota entities")
        values = dict(self.quotas.get(entity, {}))
        for key in cmd.remove:
            values.pop(key, None)
        values.update(to_set)
        if values == self.quotas.get(entity, {}):
            return ApplyResult()
        if values:
            self.quotas[entity] = values
        else:
            self.quotas.pop(entity, None)
        self._touch(("Q", entity))
        return ApplyResult()

    # ---- queries ----
    def partition_count(self) -> int:
        return self._partition_total

    def offline_partitions(self) -> int:
        return self._leading.get(NO_LEADER, 0)

    def live_brokers(self) -> list[BrokerState]:
        return [b for b in self.brokers.values() if b.eligible]

    def effective_unclean(self, topic: TopicState) -> bool:
        return self._unclean_allowed(topic)

    # ---- changelog / deltas ----
    def _record_changes(self, version: int, keys: list[Any]) -> None:
        entry = tuple(dict.fromkeys(keys))  # dedupe, keep order
        if not self._unseen_all:
            unseen = self._unseen
            for key in entry:
                if key[0] == "P":
                    unseen[key] = None
                elif key[0] == "T":
                    if key[1] in self.topics_by_id:
                        unseen[key] = None
                    else:  # deleted: ("X", id), and a topic made again with this id comes after it
                        unseen.pop(key, None)
                        unseen[("X", key[1])] = None
            if len(unseen) > self._partition_total + len(self.topics) + _UNSEEN_SLACK:
                # Mostly keys of deleted topics: reloading everything once costs less than these.
                unseen.clear()
                self._unseen_all = True
        self._changelog.append((version, entry))
        self._changelog_keys += len(entry)
        while self._changelog_keys > self._changelog_max_keys and len(self._changelog) > 1:
            old_version, old_keys = self._changelog.popleft()
            self._changelog_keys -= len(old_keys)
            self._changelog_floor = old_version

    def take_unseen(self, reader: object) -> tuple[bool, list[tuple[Any, ...]]]:
        """For one reader (DescribeCluster's view): (whether it must load everything, the keys changed
        since its previous call, first-touched first: ("T", topic id), ("P", topic id, index) and
        ("X", topic id) for a deleted topic, which precedes any "T" of a topic made again with its id).
        A reader other than the previous one loads everything."""
        if reader is not self._unseen_reader:
            self._unseen_reader = reader
            self._unseen_all = True
        everything, keys = self._unseen_all, list(self._unseen)
        self._unseen.clear()
        self._unseen_all = False
        return everything, keys

    @property
    def changelog_floor(self) -> int:
        return self._changelog_floor

    def changed_keys_since(self, since_version: int) -> list[tuple[Any, ...]] | None:
        """The keys of the entities changed after ``since_version``, each once, the most recently changed
        first; None if the changelog no longer (or not yet) covers that version. O(keys returned), at C speed
        for all but one step per version."""
        if since_version < self._changelog_floor or since_version > self.version:
            return None
        if since_version == self.version:
            return []
        entries = takewhile(lambda entry: entry[0] > since_version, reversed(self._changelog))
        return list(dict.fromkeys(chain.from_iterable(keys for _, keys in entries)))

    def changes_since(self, since_version: int) -> MetadataDelta | None:
        """Current values of everything changed after ``since_version``; None if a snapshot is needed."""
        keys = self.changed_keys_since(since_version)
        if keys is None:
            return None
        delta = MetadataDelta(self.version, False, [], [], [], [], [])
        for key in keys:
            kind = key[0]
            if kind == "B":
                broker = self.brokers.get(key[1])
                if broker is None:
                    delta.unregistered_broker_ids.append(key[1])
                else:
                    delta.brokers.append(broker)
            elif kind == "T":
                topic = self.topics_by_id.get(key[1])
                if topic is None:
                    delta.deleted_topic_ids.append(key[1])
                else:
                    delta.topics.append(topic)
            elif kind == "P":
                topic = self.topics_by_id.get(key[1])
                if topic is not None and key[2] < len(topic.partitions):
                    delta.partitions.append((topic, key[2], topic.partitions[key[2]]))
            elif kind in ("S", "ACL", "Q"):
                self._security_change(delta, key)
            elif kind == "C":
                delta.cluster_configs = dict(self.cluster_configs)
            elif kind == "F":
                delta.metadata_level = self.metadata_level
        return delta

    def _security_change(self, delta: MetadataDelta, key: tuple[Any, ...]) -> None:
        if key[0] == "S":
            cred = self.scram.get((key[1], key[2]))
            if cred is None:
                delta.deleted_credentials.append((key[1], key[2]))
            else:
                delta.credentials.append(cred)
        elif key[0] == "ACL":
            delta.acls = sorted(self.acls)
        else:
            delta.quotas.append((key[1], dict(self.quotas.get(key[1], {}))))

    def full_delta(self) -> MetadataDelta:
        """Everything, as a snapshot delta."""
        partitions = [(t, i, p) for t in self.topics.values() for i, p in enumerate(t.partitions)]
        return MetadataDelta(self.version, True, list(self.brokers.values()), list(self.topics.values()),
                             partitions, [], [], credentials=list(self.scram.values()), acls=sorted(self.acls),
                             quotas=[(e, dict(v)) for e, v in sorted(self.quotas.items())],
                             cluster_configs=dict(self.cluster_configs), metadata_level=self.metadata_level)

    # ---- snapshot / restore ----
    def to_snapshot(self) -> dict[str, Any]:
        """The whole state as builtins (what the quorum's full dump stores)."""
        return {
            "format": SNAPSHOT_FORMAT,
            "version": self.version,
            "active_controller_id": self.active_controller_id,
            "controller_epoch": self.controller_epoch,
            "unclean_leader_election_default": self.unclean_leader_election_default,
            "next_producer_id": self.next_producer_id,
            "brokers": [
                [b.node_id, b.incarnation_id, b.broker_epoch, [list(e) for e in b.endpoints], b.rack,
                 b.fenced, b.in_controlled_shutdown]
                # absent: unbounded, as before; then whether it started on new log directories (absent: no)
                + ([b.partition_capacity] if b.partition_capacity or b.storage_created else [])
                + ([True] if b.storage_created else [])
                for b in sorted(self.brokers.values(), key=lambda b: b.node_id)
            ],
            "topics": [
                [t.name, t.topic_id, dict(sorted(t.configs.items())),
                 [[list(p.replicas), list(p.isr), p.leader, p.leader_epoch, p.partition_epoch]
                  + ([list(p.adding), list(p.removing)] if p.reassigning else [])
                  for p in t.partitions]]
                + ([t.request_id] if t.request_id else [])
                for t in sorted(self.topics.values(), key=lambda t: t.name)
            ],
            "cluster_configs": dict(sorted(self.cluster_configs.items())),
            # Absent at level 1: the snapshot stays what a release without features reads and writes.
            **({"features": {features.METADATA_VERSION: self.metadata_level}}
               if self.metadata_level > features.SUPPORTED_MIN else {}),
            "security": {
                "scram": [cred.to_plain() for _, cred in sorted(self.scram.items())],
                "acls": [a.as_list() for a in sorted(self.acls)],
                "quotas": [[e, dict(sorted(v.items()))] for e, v in sorted(self.quotas.items())],
            },
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any], *,
                      changelog_max_keys: int = DEFAULT_CHANGELOG_MAX_KEYS) -> MetadataState:
        if data.get("format") != SNAPSHOT_FORMAT:
            raise errors.InvalidRequestError(f"unsupported metadata snapshot format {data.get('format')}")
        state = cls(changelog_max_keys=changelog_max_keys)
        state.restore(data)
        return state

    def restore(self, data: dict[str, Any]) -> None:
        """Replace the whole state with a snapshot; deltas start again from its version."""
        self.version = int(data["version"])
        self.active_controller_id = int(data["active_controller_id"])
        self.controller_epoch = int(data["controller_epoch"])
        self.unclean_leader_election_default = bool(data["unclean_leader_election_default"])
        self.next_producer_id = int(data["next_producer_id"])
        self.brokers = {}
        for node_id, inc, epoch, endpoints, rack, fenced, shutting, *more in data["brokers"]:
            # No capacity: a snapshot written before brokers reported one, or an unbounded broker; no storage
            # flag: written before it existed, or a broker that did not start on new log directories.
            self.brokers[node_id] = BrokerState(node_id, inc, epoch, [(e[0], e[1], e[2]) for e in endpoints],
                                                rack, fenced, shutting, int(more[0]) if more else 0,
                                                bool(more[1]) if len(more) > 1 else False)
        self.topics = {}
        self.topics_by_id = {}
        self.topics_by_collision_key = {}
        for name, topic_id, configs, partitions, *request_id in data["topics"]:  # no request id: older
            topic = TopicState(name, topic_id, dict(configs),
                               [_partition_from_snapshot(p) for p in partitions], *request_id)
            self.topics[name] = topic
            self.topics_by_id[topic_id] = topic
            self.topics_by_collision_key.setdefault(collision_key(name), set()).add(name)
        # Snapshots written before these records existed have no "cluster_configs" / "security" section.
        self.cluster_configs = {str(k): str(v) for k, v in (data.get("cluster_configs") or {}).items()}
        level = int((data.get("features") or {}).get(features.METADATA_VERSION, features.SUPPORTED_MIN))
        if level > features.SUPPORTED_MAX:
            # Metadata this release cannot apply (a node rolled back below the finalized level): stop, not serve it.
            raise MetadataInvariantError(
                f"the metadata is at {features.METADATA_VERSION} {level}; this release supports up to "
                f"{features.SUPPORTED_MAX}: run a release that supports it (a finalized level is never lowered)")
        self.metadata_level = level
        security = data.get("security") or {}
        self.scram = {}
        for plain in security.get("scram", []):
            cred = sec.ScramCredential.from_plain(plain)
            self.scram[(cred.user, cred.mechanism)] = cred
        self.acls = frozenset(sec.acl_binding(a) for a in security.get("acls", []))
        self.quotas = {str(e): {str(k): float(v) for k, v in values.items()} for e, values in security.get("quotas", [])}
        self._changelog.clear()
        self._changelog_keys = 0
        self._changelog_floor = self.version
        self._recount()
        self._unseen.clear()
        self._unseen_all = True
        self.restores += 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetadataState):
            return NotImplemented
        return self.to_snapshot() == other.to_snapshot()

    __hash__ = None  # type: ignore[assignment]
