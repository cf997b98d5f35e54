"""The consumer-group state machine (Kafka's classic rebalance protocol), pure.

One ``Group`` per group id. It never reads a clock, a socket or a disk: every
operation takes ``now_ms``, timers fire from ``tick(now_ms)``, and answers that must
wait (a JoinGroup until the join phase ends, a follower's SyncGroup until the leader
hands in the assignment) are delivered through the callback the caller passed in.
The coordinator (broker/group_coordinator.py) serialises calls with its lock, feeds it
time, and persists what ``persist_needed`` says changed.

States (Kafka's names)::

    Empty --join--> PreparingRebalance --all joined / deadline--> CompletingRebalance
      ^                  ^    |                                      | leader's SyncGroup
      |                  |    +--no member left--> Empty             v
      +--last member leaves / expires------------------------------ Stable
    Dead: deleted or unloaded; every call answers COORDINATOR_NOT_AVAILABLE.

Generations fence stale members: every completed join phase bumps ``generation_id``,
and SyncGroup, Heartbeat and OffsetCommit carrying another generation get
ILLEGAL_GENERATION.

Static members (KIP-345, a consumer's ``group.instance.id``) are known by their instance id as
well: one that joins again without a member id (a restarted process, within its session) takes
the place of the member holding that instance id: a new member id, the old one's assignment, and
no rebalance while the group is Stable and the chosen protocol stays; the old member id is fenced
(FENCED_INSTANCE_ID on its requests). Static members leave by session timeout or an explicit
LeaveGroup naming the instance id, not when their client closes.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from client.types import TopicPartition
from proto.common_pb2 import ErrorCode

log = logging.getLogger(__name__)

MEMBERS_MAX = 10_000  # bound on one group's size (GROUP_MAX_SIZE_REACHED beyond)
# Bound on the assignors one JoinGroup may offer (clients offer one to three). Each join checks that
# the group's members share one: without a bound, 40 members offering 100,000 made-up names each
# (1 MiB of metadata apiece) held the coordinator's lock for 3.8 s a join.
MEMBER_PROTOCOLS_MAX = 64


class GroupState(enum.StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


CLIENT_REASON_LOGGED_MAX = 200  # characters of a client's JoinGroup or LeaveGroup reason in a log line


def client_reason(reason: str) -> str:
    """The log line's tail for a client's reason: ``; client reason: ...`` (its first characters only), or ""."""
    if not reason:
        return ""
    cut = reason[:CLIENT_REASON_LOGGED_MAX]
    return f"; client reason: {cut}" + ("..." if len(reason) > len(cut) else "")


@dataclass(frozen=True)
class JoinResult:
    error_code: int
    member_id: str = ""
    generation_id: int = -1
    protocol_name: str = ""
    leader: str = ""
    # (member id, metadata, client id, group instance id), leader only
    members: tuple[tuple[str, bytes, str, str], ...] = ()
    error_message: str = ""


@dataclass(frozen=True)
class SyncResult:
    error_code: int
    protocol_name: str = ""
    assignment: bytes = b""
    error_message: str = ""


JoinCallback = Callable[[JoinResult], None]
SyncCallback = Callable[[SyncResult], None]


@dataclass(frozen=True, eq=False)
class Subscriptions:
    """The topics a consumer member's metadata subscribes to, per protocol it offers, parsed once when it
    joins (by the coordinator, before it takes its lock: see group_records.parse_subscriptions), and what
    the parsed sets cost in memory (counted with the member's bytes). OffsetDelete asks which topics the
    group subscribes to: parsing every member's metadata for each request held the coordinator's lock,
    every group's, 4.65 s a request with 200 members of 1 MiB subscriptions (found by an audit). Kafka
    likewise keeps a group's subscribed topics rather than parsing them per request."""

    topics: dict[str, frozenset[str]] = field(default_factory=dict)  # protocol name -> subscribed topics
    held_bytes: int = 0

    def of(self, protocol: str) -> frozenset[str]:
        return self.topics.get(protocol, frozenset())


NO_SUBSCRIPTIONS = Subscriptions()


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]  # (assignor name, metadata), in preference order
    last_heartbeat_ms: int
    assignment: bytes = b""
    sync_callback: SyncCallback | None = None
    group_instance_id: str = ""  # "" for a dynamic member
    subscriptions: Subscriptions = field(default=NO_SUBSCRIPTIONS, repr=False, compare=False)
    protocol_names: frozenset[str] = field(init=False, repr=False, compare=False)
    protocol_bytes: int = field(init=False, repr=False, compare=False)  # the protocols' names and metadata
    id_bytes: int = field(init=False, repr=False, compare=False)  # member id, client id and host, instance id
    # The JoinGroup this member waits in, and the table holding it (which counts waiting members).
    _join_callback: JoinCallback | None = field(init=False, default=None, repr=False, compare=False)
    _table: MemberTable | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.protocol_names = frozenset(name for name, _ in self.protocols)
        self.protocol_bytes = sum(len(name) + len(metadata) for name, metadata in self.protocols)
        self.id_bytes = self._ids_length(self.client_id, self.client_host)

    def _ids_length(self, client_id: str, client_host: str) -> int:
        return len(self.member_id) + len(client_id) + len(client_host) + len(self.group_instance_id)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "assignment":  # the table holding this member keeps the sum of what its members hold
            table = self.__dict__.get("_table")
            if table is not None:
                table.count_held(self.client_host,
                                 len(value) - len(self.__dict__.get("assignment", b"")))  # type: ignore[arg-type]
        object.__setattr__(self, name, value)

    @property
    def join_callback(self) -> JoinCallback | None:
        return self._join_callback

    @join_callback.setter
    def join_callback(self, callback: JoinCallback | None) -> None:
        if self._table is not None and (callback is None) != (self._join_callback is None):
            self._table.joining += 1 if callback is not None else -1
        self._join_callback = callback

    def held_bytes(self) -> int:
        """What this member makes the coordinator keep: its protocols' names and metadata, its assignment,
        its ids, its parsed subscriptions."""
        return self.protocol_bytes + len(self.assignment) + self.id_bytes + self.subscriptions.held_bytes

    def fail_waiters(self, error_code: int) -> None:
        """Answer a JoinGroup or SyncGroup this member is blocked in with an error."""
        join_cb, self.join_callback = self.join_callback, None
        sync_cb, self.sync_callback = self.sync_callback, None
        if join_cb is not None:
            join_cb(JoinResult(error_code, self.member_id))
        if sync_cb is not None:
            sync_cb(SyncResult(error_code))

    def rejoined(self, client_id: str, client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int,
                 protocols: list[tuple[str, bytes]], now_ms: int,
                 subscriptions: Subscriptions = NO_SUBSCRIPTIONS) -> None:
        """What a JoinGroup of this member says about it now (a rejoin, or a static member's new process)."""
        id_bytes = self._ids_length(client_id, client_host)
        if self._table is not None and client_host != self.client_host:  # what it holds moves to its new address
            held = self.held_bytes()
            self._table.count_held(self.client_host, -held, members=-1)
            self._table.count_held(client_host, held, members=1)
        self.client_id, self.client_host = client_id, client_host
        self.session_timeout_ms, self.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        self.protocols = list(protocols)
        names = frozenset(name for name, _ in self.protocols)
        protocol_bytes = sum(len(name) + len(metadata) for name, metadata in self.protocols)
        if self._table is not None:
            self._table.count_protocols(self.protocol_names, -1)
            self._table.count_protocols(names, 1)
            self._table.count_held(client_host, protocol_bytes - self.protocol_bytes + id_bytes - self.id_bytes)
        self.protocol_names, self.protocol_bytes, self.id_bytes = names, protocol_bytes, id_bytes
        self.set_subscriptions(subscriptions)
        self.last_heartbeat_ms = now_ms

    def set_subscriptions(self, subscriptions: Subscriptions) -> None:
        """What this member's protocols' metadata subscribe to, parsed (counted in what it holds)."""
        if self._table is not None:
            self._table.count_held(self.client_host, subscriptions.held_bytes - self.subscriptions.held_bytes)
        self.subscriptions = subscriptions

    def subscribed_topics(self, protocol: str) -> frozenset[str]:
        """The topics this member's metadata for ``protocol`` subscribes to (parsed when it joined; empty
        for a member that is not a consumer's, or whose metadata did not parse)."""
        return self.subscriptions.of(protocol)

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


_V = TypeVar("_V")


class _TalliedDict(dict[str, _V]):
    """A dict whose subclass keeps tallies in ``__setitem__`` / ``__delitem__``: every other way to add or remove an
    entry goes through those two (pop, clear) or is refused (update, setdefault, popitem)."""

    def pop(self, key: str, *default: _V | None) -> _V | None:  # type: ignore[override]
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        value = self[key]
        del self[key]
        return value

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def update(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise TypeError(f"{type(self).__name__}: add entries one by one")

    setdefault = popitem = update  # type: ignore[assignment]


class MemberTable(_TalliedDict[Member]):
    """A group's members by id, with the tallies each JoinGroup needs kept as members come and go:
    how many wait in a JoinGroup, and how many offer each protocol name. Without them every join
    looked at every member (is everyone in? which protocols do all offer?): a join storm of a
    10,000-member group held the coordinator's lock, every group's, for 16 s. Kafka keeps the
    same two counts (numMembersAwaitingJoinResponse, supportedProtocols). Also the bytes the
    members hold (Member.held_bytes), which the coordinator's memory bound adds up over groups, and the
    same by the members' client addresses, with how many members each has (its share of that bound)."""

    def __init__(self, members: dict[str, Member] | None = None) -> None:
        super().__init__()
        self.joining = 0
        self.held_bytes = 0
        self.held_by_host: dict[str, tuple[int, int]] = {}  # client address -> (bytes its members hold, members)
        self.protocol_counts: dict[str, int] = {}
        for member_id, member in (members or {}).items():
            self[member_id] = member

    def count_protocols(self, names: frozenset[str], delta: int) -> None:
        counts = self.protocol_counts
        for name in names:
            n = counts.get(name, 0) + delta
            if n:
                counts[name] = n
            else:
                del counts[name]

    def count_held(self, host: str, delta: int, members: int = 0) -> None:
        """The members at ``host`` now hold ``delta`` bytes more (and are ``members`` more)."""
        self.held_bytes += delta
        held, count = self.held_by_host.get(host, (0, 0))
        held, count = held + delta, count + members
        if count:
            self.held_by_host[host] = (held, count)
        else:
            self.held_by_host.pop(host, None)

    def _attach(self, member: Member) -> None:
        if member._table is not None:
            raise ValueError(f"member {member.member_id} is in a group already")
        member._table = self
        self.joining += member._join_callback is not None
        self.count_held(member.client_host, member.held_bytes(), members=1)
        self.count_protocols(member.protocol_names, 1)

    def _detach(self, member: Member) -> None:
        member._table = None
        self.joining -= member._join_callback is not None
        self.count_held(member.client_host, -member.held_bytes(), members=-1)
        self.count_protocols(member.protocol_names, -1)

    def __setitem__(self, member_id: str, member: Member) -> None:
        old = self.get(member_id)
        if old is member:
            return
        self._attach(member)
        if old is not None:
            self._detach(old)
        super().__setitem__(member_id, member)

    def __delitem__(self, member_id: str) -> None:
        member = self[member_id]
        super().__delitem__(member_id)
        self._detach(member)

    def common_protocols(self, extra: frozenset[str] | None = None) -> set[str]:
        """The protocol names every member (and ``extra``, a joining member's, when given) offers:
        O(one member's names), from the counts."""
        n = len(self)
        if not n:
            return set(extra or ())
        some = extra if extra is not None else next(iter(self.values())).protocol_names
        counts = self.protocol_counts
        return {name for name in some if counts.get(name, 0) == n}


class PendingMembers(_TalliedDict[int]):
    """Member ids handed out with MEMBER_ID_REQUIRED (KIP-394) -> their deadline (ms), with the client address
    each was handed to, counted by address: what pending members hold counts against that address's share of
    group.coordinator.metadata.max.bytes (per.ip), as its members do. An id set without ``add`` has no
    address ("")."""

    def __init__(self, pending: dict[str, int] | None = None) -> None:
        super().__init__()
        self.hosts: dict[str, str] = {}
        self.by_host: dict[str, int] = {}
        for member_id, deadline_ms in (pending or {}).items():
            self.add(member_id, deadline_ms, "")

    def add(self, member_id: str, deadline_ms: int, host: str) -> None:
        if member_id in self:
            del self[member_id]
        super().__setitem__(member_id, deadline_ms)
        self.hosts[member_id] = host
        self.by_host[host] = self.by_host.get(host, 0) + 1

    def __setitem__(self, member_id: str, deadline_ms: int) -> None:
        self.add(member_id, deadline_ms, "")

    def __delitem__(self, member_id: str) -> None:
        super().__delitem__(member_id)
        host = self.hosts.pop(member_id, "")
        if (left := self.by_host.get(host, 0) - 1) > 0:
            self.by_host[host] = left
        else:
            self.by_host.pop(host, None)


@dataclass
class OffsetEntry:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    log_offset: int = -1  # where the commit record sits in __consumer_offsets (orders racing commits)
    # When it expires, for a commit that gave its retention time (OffsetCommit v2-v4); -1: offsets.retention.minutes.
    expire_timestamp_ms: int = -1


# What a committed offset costs the coordinator's memory besides its topic name and metadata (measured: the
# TopicPartition key, the OffsetEntry and the dict slot, about 260 bytes), and what a group costs without
# members or offsets besides its id: about 2,000 bytes traced (the Group, its OffsetMap and member tables, its
# entry in the coordinator's table; an audit measured an empty group of 3 offsets at 2,800 bytes against 1,835
# counted with 1,024 here, so the budget held 1.5 times its bytes). Counted against
# group.coordinator.offsets.max.bytes.
OFFSET_ENTRY_BYTES = 256
GROUP_OVERHEAD_BYTES = 2048


def offset_bytes(tp: TopicPartition, entry: OffsetEntry) -> int:
    return OFFSET_ENTRY_BYTES + len(tp.topic) + len(entry.metadata)


class OffsetMap(dict[TopicPartition, OffsetEntry]):
    """A group's committed offsets, keeping the bytes they hold (``held_bytes``, see ``offset_bytes``) as they
    change, however they change (a commit, a load, a tombstone, an expiry): the coordinator bounds their sum
    over all groups without walking every offset."""

    __slots__ = ("held_bytes",)

    def __init__(self) -> None:
        super().__init__()
        self.held_bytes = 0

    def __setitem__(self, tp: TopicPartition, entry: OffsetEntry) -> None:
        old = dict.get(self, tp)
        if old is not None:
            self.held_bytes -= offset_bytes(tp, old)
        dict.__setitem__(self, tp, entry)
        self.held_bytes += offset_bytes(tp, entry)

    def __delitem__(self, tp: TopicPartition) -> None:
        old = dict.pop(self, tp)
        self.held_bytes -= offset_bytes(tp, old)

    def pop(self, tp: TopicPartition, *default: Any) -> Any:  # type: ignore[override]
        if tp in self:
            old = dict.pop(self, tp)
            self.held_bytes -= offset_bytes(tp, old)
            return old
        if default:
            return default[0]
        raise KeyError(tp)

    def clear(self) -> None:
        dict.clear(self)
        self.held_bytes = 0

    def _unsupported(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("OffsetMap keeps its byte count: set, pop or delete one offset at a time")

    update = setdefault = popitem = __ior__ = _unsupported  # type: ignore[assignment]


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader_id: str = ""
    state_timestamp_ms: int = 0  # when the state last changed (empty-since, for offset retention)
    initial_rebalance_delay_ms: int = 3000
    members: MemberTable = field(default_factory=MemberTable)
    static_members: dict[str, str] = field(default_factory=dict)  # group instance id -> its member id
    # Member ids handed out with MEMBER_ID_REQUIRED, valid until the deadline (ms).
    pending_members: PendingMembers = field(default_factory=PendingMembers)
    offsets: OffsetMap = field(default_factory=OffsetMap)
    join_deadline_ms: int = 0
    join_deadline_max_ms: int = 0  # cap on initial-delay extensions
    initial_join: bool = False  # this rebalance started from Empty: wait for the delay
    sync_deadline_ms: int = 0
    persist_needed: bool = False  # group metadata changed in a way that must be written
    new_member_id: Callable[[str], str] = field(default=lambda client_id: f"{client_id or 'member'}-{uuid.uuid4()}")
    # The __consumer_offsets partition the group belongs to, set by the coordinator when it makes the group
    # (-1: not known yet). Hashing the id again (Java's String.hashCode, a Python loop) for every group
    # each ListGroups, under the lock every group shares, took 5.2 s with 20,000 groups (an audit).
    offsets_partition: int = field(default=-1, compare=False)
    # The client address whose commit or join made the group here ("" for a group loaded from the log): what
    # its offsets hold counts against that address's share (group.coordinator.offsets.max.bytes.per.ip).
    owner: str = field(default="", compare=False)
    owner_recorded: bool = field(default=False, compare=False)  # an owner record of ``owner`` is in the log
    _deadline_floor_ms: int | None = field(default=None, repr=False, compare=False)  # see next_deadline_ms
    # Told (with this group) whenever the group forgets its last deadline answer, i.e. whenever a deadline
    # may have moved earlier: the coordinator's timers (broker/group_coordinator.py GroupTimers) then ask
    # this group again on their next tick. None: nobody is told.
    deadline_listener: Callable[[Group], None] | None = field(default=None, repr=False, compare=False)

    # ---- queries ----
    def is_empty(self) -> bool:
        return not self.members

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def _fenced(self, member_id: str, group_instance_id: str) -> bool:
        """Another member holds ``group_instance_id`` now (this one was replaced by a newer process)."""
        holder = self.static_members.get(group_instance_id) if group_instance_id else None
        return holder is not None and holder != member_id

    def __setattr__(self, name: str, value: object) -> None:
        if name == "members" and not isinstance(value, MemberTable):
            value = MemberTable(value)  # type: ignore[arg-type]  # a loaded group's members, a test's
        if name == "pending_members" and not isinstance(value, PendingMembers):
            value = PendingMembers(value)  # type: ignore[arg-type]
        if name in ("members", "pending_members", "state"):
            self.__dict__["_deadline_floor_ms"] = None
            listener = self.__dict__.get("deadline_listener")
            if listener is not None:
                listener(self)
        super().__setattr__(name, value)

    def _candidate_protocols(self, extra: Sequence[str] | None = None) -> set[str]:
        """The protocol names every member (and ``extra``, a joining member's) offers."""
        return self.members.common_protocols(frozenset(extra) if extra is not None else None)

    def select_protocol(self) -> str:
        """The protocol every member supports, by most first-preference votes."""
        candidates = self._candidate_protocols()
        votes: dict[str, int] = {}
        for m in sorted(self.members.values(), key=lambda m: m.member_id):
            first = next(name for name, _ in m.protocols if name in candidates)
            votes[first] = votes.get(first, 0) + 1
        leader = self.members.get(self.leader_id)
        order = [name for name, _ in leader.protocols] if leader else sorted(candidates)
        return max(sorted(votes), key=lambda name: (votes[name], -order.index(name) if name in order else 0))

    # ---- transitions ----
    def _transition(self, state: GroupState, now_ms: int) -> None:
        log.debug("group %s: %s -> %s (generation %d)", self.group_id, self.state, state, self.generation_id)
        self.state = state
        self.state_timestamp_ms = now_ms

    def join(
        self,
        *,
        member_id: str,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        callback: JoinCallback,
        now_ms: int,
        group_instance_id: str = "",
        subscriptions: Subscriptions = NO_SUBSCRIPTIONS,
        reason: str = "",
    ) -> None:
        """``subscriptions``: the topics ``protocols``' metadata subscribe to, parsed by the caller (a
        consumer's; NO_SUBSCRIPTIONS otherwise), kept with the member. ``reason``: why the client (re)joins,
        for the log line of a rebalance the join starts (KIP-800)."""
        why = client_reason(reason)
        self._forget_deadline()
        if self.state == GroupState.DEAD:
            callback(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id, error_message="group is dead"))
            return
        if not protocols or not protocol_type:
            callback(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id,
                                error_message="protocol_type and at least one protocol are required"))
            return
        if self.members and (
            protocol_type != self.protocol_type or not self._candidate_protocols([n for n, _ in protocols])
        ):
            common = sorted(self._candidate_protocols())
            shown = ", ".join(repr(name[:64]) for name in common[:8]) + (", ..." if len(common) > 8 else "")
            callback(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id,
                                error_message=f"group uses {self.protocol_type[:64]!r} with protocols [{shown}]"))
            return
        if group_instance_id:
            holder = self.static_members.get(group_instance_id)
            if not member_id and holder is not None:
                self._replace_static(holder, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                                     protocols, callback, now_ms, subscriptions, why)
                return
            if member_id and self._fenced(member_id, group_instance_id):
                callback(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id,
                                    error_message=f"group instance id {group_instance_id} is held by a newer member"))
                return
        if not member_id:
            if len(self.members) + len(self.pending_members) >= MEMBERS_MAX:
                callback(JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, error_message=f"{MEMBERS_MAX} members"))
                return
            if group_instance_id:
                # A static member joins with its new id at once (KIP-345: its instance id already keeps
                # a lost answer from leaving a ghost behind, the reason for MEMBER_ID_REQUIRED).
                self._add_member(self.new_member_id(group_instance_id), client_id, client_host, session_timeout_ms,
                                 rebalance_timeout_ms, protocol_type, protocols, callback, now_ms, group_instance_id,
                                 subscriptions, why)
                return
            # KIP-394: hand out an id and make the member come back with it, so a client
            # that loses this response does not leave a ghost member behind.
            new_id = self.new_member_id(client_id)
            self.pending_members.add(new_id, now_ms + session_timeout_ms, client_host)
            callback(JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id))
            return
        member = self.members.get(member_id)
        if member is None:
            if member_id not in self.pending_members:
                callback(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id, error_message="unknown member id"))
                return
            del self.pending_members[member_id]
            self._add_member(member_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                             protocol_type, protocols, callback, now_ms, group_instance_id, subscriptions, why)
            return
        self._rejoin(member, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                     protocols, callback, now_ms, subscriptions, why)

    def _add_member(self, member_id: str, client_id: str, client_host: str, session_timeout_ms: int,
                    rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
                    callback: JoinCallback, now_ms: int, group_instance_id: str,
                    subscriptions: Subscriptions = NO_SUBSCRIPTIONS, why: str = "") -> None:
        if not self.members:
            self.protocol_type = protocol_type  # an empty group takes the first member's type
        member = Member(member_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                        list(protocols), now_ms, group_instance_id=group_instance_id, subscriptions=subscriptions)
        self.members[member_id] = member
        if group_instance_id:
            self.static_members[group_instance_id] = member_id
        member.join_callback = callback
        self._prepare_rebalance(now_ms, f"member {member_id} joined{why}", new_member=True)
        self._maybe_complete_join(now_ms)

    def _replace_static(self, old_id: str, client_id: str, client_host: str, session_timeout_ms: int,
                        rebalance_timeout_ms: int, protocols: list[tuple[str, bytes]], callback: JoinCallback,
                        now_ms: int, subscriptions: Subscriptions = NO_SUBSCRIPTIONS, why: str = "") -> None:
        """A static member joined again without a member id: a new process under its instance id takes the
        member's place (and assignment) with a new member id; the old id is fenced. As Kafka's coordinator
        does: no rebalance in Stable while the chosen protocol stays (the answer names the current leader,
        so the newcomer does not assign, and its SyncGroup returns the assignment it had); a rebalance in
        CompletingRebalance (the leader may be assigning to the old id); the running one in PreparingRebalance."""
        member = self.members.pop(old_id)
        member.fail_waiters(ErrorCode.FENCED_INSTANCE_ID)
        new_id = self.new_member_id(member.group_instance_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[member.group_instance_id] = new_id
        current_leader = self.leader_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        member.rejoined(client_id, client_host, session_timeout_ms, rebalance_timeout_ms, protocols, now_ms,
                        subscriptions)
        log.info("group %s: static member %s rejoined as %s (was %s)", self.group_id, member.group_instance_id,
                 new_id, old_id)
        if self.state == GroupState.STABLE:
            if self.select_protocol() == self.protocol_name:
                self.persist_needed = True  # the new member id, for a coordinator that loads the group
                callback(JoinResult(ErrorCode.NONE, new_id, self.generation_id, self.protocol_name, current_leader))
                return
            self._prepare_rebalance(now_ms,
                                    f"static member {member.group_instance_id} rejoined with other protocols{why}")
        elif self.state == GroupState.COMPLETING_REBALANCE:
            self._prepare_rebalance(now_ms,
                                    f"static member {member.group_instance_id} rejoined during the assignment{why}")
        member.join_callback = callback
        self._maybe_complete_join(now_ms)

    def _rejoin(self, member: Member, client_id: str, client_host: str, session_timeout_ms: int,
                rebalance_timeout_ms: int, protocols: list[tuple[str, bytes]], callback: JoinCallback,
                now_ms: int, subscriptions: Subscriptions = NO_SUBSCRIPTIONS, why: str = "") -> None:
        changed = list(protocols) != member.protocols
        if member.join_callback is not None:
            # A second join while the first still waits: the first is superseded.
            member.join_callback(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id,
                                            error_message="superseded by a newer JoinGroup"))
        member.rejoined(client_id, client_host, session_timeout_ms, rebalance_timeout_ms, protocols, now_ms,
                        subscriptions)
        member.join_callback = callback
        if self.state == GroupState.COMPLETING_REBALANCE and not changed:
            # The member lost our JoinGroup answer: give it again.
            member.join_callback = None
            callback(self._join_result_for(member))
            return
        if self.state != GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(now_ms, f"member {member.member_id} rejoined{why}")
        self._maybe_complete_join(now_ms)

    def _prepare_rebalance(self, now_ms: int, reason: str, *, new_member: bool = False) -> None:
        if self.state == GroupState.PREPARING_REBALANCE:
            if self.initial_join and new_member:
                # group.initial.rebalance.delay.ms: each newcomer extends the wait a little,
                # so a fleet starting together lands in one generation.
                self.join_deadline_ms = min(self.join_deadline_max_ms,
                                            max(self.join_deadline_ms, now_ms + self.initial_rebalance_delay_ms))
            return
        if self.state == GroupState.COMPLETING_REBALANCE:
            # Members waiting in SyncGroup must rejoin the new round.
            for m in self.members.values():
                if m.sync_callback is not None:
                    m.sync_callback(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
                    m.sync_callback = None
                    m.last_heartbeat_ms = now_ms  # it was waiting on us: alive until now
        log.info("group %s: preparing rebalance (generation %d): %s", self.group_id, self.generation_id, reason)
        rebalance_timeout_ms = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        self.initial_join = self.state == GroupState.EMPTY and self.initial_rebalance_delay_ms > 0
        if self.initial_join:
            self.join_deadline_ms = now_ms + self.initial_rebalance_delay_ms
            self.join_deadline_max_ms = now_ms + max(rebalance_timeout_ms, self.initial_rebalance_delay_ms)
        else:
            self.join_deadline_ms = now_ms + rebalance_timeout_ms
        self._transition(GroupState.PREPARING_REBALANCE, now_ms)

    def _maybe_complete_join(self, now_ms: int) -> None:
        if self.state != GroupState.PREPARING_REBALANCE:
            return
        all_joined = self.members.joining == len(self.members)
        if (all_joined and not self.initial_join and not self.pending_members) or now_ms >= self.join_deadline_ms:
            self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        for m in [m for m in self.members.values() if m.join_callback is None]:
            log.info("group %s: removing member %s that did not rejoin in time", self.group_id, m.member_id)
            self._forget(m)
        self.generation_id += 1
        self.initial_join = False
        if not self.members:
            self.protocol_name = ""
            self.leader_id = ""
            self._transition(GroupState.EMPTY, now_ms)
            self.persist_needed = True
            return
        if self.leader_id not in self.members:
            self.leader_id = next(iter(self.members))
        self.protocol_name = self.select_protocol()
        self._transition(GroupState.COMPLETING_REBALANCE, now_ms)
        self.sync_deadline_ms = now_ms + max(m.rebalance_timeout_ms for m in self.members.values())
        log.info("group %s: generation %d with %d members, leader %s, protocol %s", self.group_id,
                 self.generation_id, len(self.members), self.leader_id, self.protocol_name)
        for m in self.members.values():
            m.assignment = b""
            m.last_heartbeat_ms = now_ms
            callback, m.join_callback = m.join_callback, None
            assert callback is not None
            callback(self._join_result_for(m))

    def _join_result_for(self, member: Member) -> JoinResult:
        members: tuple[tuple[str, bytes, str], ...] = ()
        if member.member_id == self.leader_id:
            members = tuple((m.member_id, m.metadata_for(self.protocol_name), m.client_id, m.group_instance_id)
                            for m in sorted(self.members.values(), key=lambda m: m.member_id))
        return JoinResult(ErrorCode.NONE, member.member_id, self.generation_id, self.protocol_name,
                          self.leader_id, members)

    def _check_member(self, member_id: str, generation_id: int, group_instance_id: str = "") -> int:
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def sync(self, *, member_id: str, generation_id: int, assignments: dict[str, bytes],
             callback: SyncCallback, now_ms: int, group_instance_id: str = "", protocol_type: str = "",
             protocol_name: str = "") -> None:
        self._forget_deadline()
        error = self._check_member(member_id, generation_id, group_instance_id)
        if error == ErrorCode.NONE and ((protocol_type and protocol_type != self.protocol_type)
                                        or (protocol_name and protocol_name != self.protocol_name)):
            # SyncGroup v5+ names the group's protocol (KIP-559): another is refused, as Kafka refuses it (the
            # leader's assignment of another protocol was taken, and the group went Stable on it: audit).
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error != ErrorCode.NONE:
            callback(SyncResult(error))
            return
        if self.state == GroupState.PREPARING_REBALANCE:
            callback(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            return
        member = self.members[member_id]
        member.last_heartbeat_ms = now_ms
        if self.state == GroupState.STABLE:
            callback(SyncResult(ErrorCode.NONE, self.protocol_name, member.assignment))
            return
        member.sync_callback = callback
        if member_id == self.leader_id:
            for mid, m in self.members.items():
                m.assignment = assignments.get(mid, b"")
            self._transition(GroupState.STABLE, now_ms)
            self.persist_needed = True
            for m in self.members.values():
                cb, m.sync_callback = m.sync_callback, None
                if cb is not None:
                    cb(SyncResult(ErrorCode.NONE, self.protocol_name, m.assignment))

    def persist_failed(self, generation_id: int, now_ms: int, reason: str) -> bool:
        """Writing ``generation_id``'s metadata failed, so no member was given its assignment: the
        generation never took effect, and the group rebalances (Kafka's doSyncGroup after a failed
        storeGroup) rather than stay Stable on an assignment nobody has. False if that was done already
        (each member's SyncGroup reports the failure)."""
        if self.generation_id != generation_id or self.state != GroupState.STABLE:
            return False
        self._prepare_rebalance(now_ms, f"generation {generation_id} not persisted: {reason}")
        return True

    def heartbeat(self, *, member_id: str, generation_id: int, now_ms: int, group_instance_id: str = "") -> int:
        error = self._check_member(member_id, generation_id, group_instance_id)
        if error != ErrorCode.NONE:
            return error
        self.members[member_id].last_heartbeat_ms = now_ms
        if self.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, member_id: str, now_ms: int, group_instance_id: str = "", reason: str = "") -> int:
        """A member leaves: by member id, or a static member by its instance id (``member_id`` "" removes
        whichever member holds it, as an admin's removal does; another member id is fenced). ``reason``: why,
        as its client says (LeaveGroup v5+, KIP-800), for the log."""
        why = client_reason(reason)
        self._forget_deadline()
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group_instance_id:
            holder = self.static_members.get(group_instance_id)
            if holder is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if member_id and member_id != holder:
                return ErrorCode.FENCED_INSTANCE_ID
            self._remove_member(holder, now_ms, f"(static member {group_instance_id}) left the group{why}")
            return ErrorCode.NONE
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            self._maybe_complete_join(now_ms)
            return ErrorCode.NONE
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._remove_member(member_id, now_ms, f"left the group{why}")
        return ErrorCode.NONE

    def _forget(self, member: Member) -> None:
        del self.members[member.member_id]
        if member.group_instance_id and self.static_members.get(member.group_instance_id) == member.member_id:
            del self.static_members[member.group_instance_id]

    def _remove_member(self, member_id: str, now_ms: int, reason: str) -> None:
        member = self.members[member_id]
        self._forget(member)
        member.fail_waiters(ErrorCode.UNKNOWN_MEMBER_ID)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), "")  # the longest-standing member, as Kafka
        log.info("group %s: member %s %s", self.group_id, member_id, reason)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if self.members:
                self._prepare_rebalance(now_ms, f"member {member_id} {reason}")
            else:
                self.generation_id += 1
                self.protocol_name = ""
                self._transition(GroupState.EMPTY, now_ms)
                self.persist_needed = True
        elif self.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(now_ms)

    def tick(self, now_ms: int) -> None:
        """Fire due timers: pending ids, sessions, the join deadline, the sync deadline."""
        self._forget_deadline()
        for pending_id, deadline_ms in list(self.pending_members.items()):
            if now_ms >= deadline_ms:
                del self.pending_members[pending_id]
        for m in list(self.members.values()):
            if self.members.get(m.member_id) is not m:
                continue  # a removal before it ended the join round, which dropped this one too
            waiting = m.join_callback is not None or m.sync_callback is not None
            if not waiting and now_ms - m.last_heartbeat_ms >= m.session_timeout_ms:
                self._remove_member(m.member_id, now_ms, f"missed its session timeout ({m.session_timeout_ms} ms)")
        if self.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(now_ms)
        elif self.state == GroupState.COMPLETING_REBALANCE and now_ms >= self.sync_deadline_ms:
            # The leader never handed in an assignment: drop whoever has not synced.
            for m in [m for m in self.members.values() if m.sync_callback is None]:
                if self.members.get(m.member_id) is m:  # (as above)
                    self._remove_member(m.member_id, now_ms, "did not sync in time")

    def next_deadline_ms(self, now_ms: int | None = None) -> int | None:
        """The earliest time ``tick`` has something to do (None: nothing scheduled), or, given ``now_ms``,
        a time no later than that (the last answer, while it is still ahead of ``now_ms``).

        Walking every member each time cost 0.7 ms per 10,000 members under the coordinator's lock.
        Deadlines only move later between the walks but for what ``_forget_deadline`` covers: every
        operation but a heartbeat or a commit (which move one member's deadline later) forgets the
        last answer (and tells ``deadline_listener``), so a stable group is walked about once per
        session timeout. The coordinator asks a group only when its answer comes due or after it was
        forgotten (GroupTimers), not every group every tick."""
        floor = self._deadline_floor_ms
        if floor is not None and now_ms is not None and floor > now_ms:
            return floor
        deadlines = list(self.pending_members.values())
        # A member waiting in a JoinGroup or SyncGroup does not expire (tick): the round's deadline holds.
        deadlines += [m.last_heartbeat_ms + m.session_timeout_ms for m in self.members.values()
                      if m.join_callback is None and m.sync_callback is None]
        if self.state == GroupState.PREPARING_REBALANCE:
            deadlines.append(self.join_deadline_ms)
        if self.state == GroupState.COMPLETING_REBALANCE:
            deadlines.append(self.sync_deadline_ms)
        self._deadline_floor_ms = min(deadlines) if deadlines else None
        return self._deadline_floor_ms

    def _forget_deadline(self) -> None:
        self._deadline_floor_ms = None
        if self.deadline_listener is not None:
            self.deadline_listener(self)

    # ---- offsets ----
    def validate_commit(self, member_id: str, generation_id: int, now_ms: int, group_instance_id: str = "") -> int:
        """May this commit go ahead? (Kafka: a commit is also a heartbeat.)"""
        if self.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and not member_id and not self.members:
            return ErrorCode.NONE  # commit from outside group management (assign(), admin)
        if self._fenced(member_id, group_instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if self.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        error = self._check_member(member_id, generation_id, group_instance_id)
        if error == ErrorCode.NONE:
            self.members[member_id].last_heartbeat_ms = now_ms
        return error

    def apply_offset(self, tp: TopicPartition, entry: OffsetEntry | None) -> None:
        """Apply a commit (or a tombstone with None) read back from or written to the log.
        Racing commits to one partition keep the one later in the log."""
        current = self.offsets.get(tp)
        if entry is None:
            self.offsets.pop(tp, None)
            return
        if current is not None and entry.log_offset >= 0 and current.log_offset > entry.log_offset:
            return
        self.offsets[tp] = entry

    def expired_offsets(self, now_ms: int, retention_ms: int,
                        empty_since_ms: int | None = None) -> tuple[list[TopicPartition], bool]:
        """offsets.retention.minutes (KIP-211): the offsets of a group that uses the protocol
        expire together, ``retention_ms`` after the group became empty; offsets committed
        outside group management (no protocol type) expire one by one, ``retention_ms``
        after their commit, or after ``empty_since_ms`` if later (when the group's members of Kafka's
        consumer protocol, which this Group does not hold, last left). Returns (expired partitions, whether
        the group can go too: not while a member handed an id by MEMBER_ID_REQUIRED may still join with it,
        KIP-394)."""
        if self.state != GroupState.EMPTY:
            return [], False

        def expired_entry(e: OffsetEntry) -> bool:
            if e.expire_timestamp_ms >= 0:  # its commit gave a retention time: Kafka's expireTimestamp
                return now_ms >= e.expire_timestamp_ms
            since = self.state_timestamp_ms if self.protocol_type else max(e.commit_timestamp_ms,
                                                                           empty_since_ms or 0)
            return now_ms - since >= retention_ms
        expired = sorted(tp for tp, e in self.offsets.items() if expired_entry(e))
        return expired, len(expired) == len(self.offsets) and not self.pending_members

    def vacant(self) -> bool:
        """Nothing in it, nor ever was: no member, none to come, no committed offset, no generation (so no record
        of it in ``__consumer_offsets``). A group a JoinGroup made, answered MEMBER_ID_REQUIRED, and whose member
        never came back."""
        return (self.state == GroupState.EMPTY and self.generation_id == 0 and not self.members
                and not self.pending_members and not self.offsets and not self.static_members
                and not self.persist_needed)

    def mark_dead(self, now_ms: int) -> None:
        for m in self.members.values():
            m.fail_waiters(ErrorCode.NOT_COORDINATOR)
        self._transition(GroupState.DEAD, now_ms)
