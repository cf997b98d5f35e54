"""Kafka's consumer group protocol (KIP-848) on the coordinator: ConsumerGroupHeartbeat's state machine.

A consumer of this protocol (librdkafka's ``group.protocol=consumer``, Kafka 4's Java consumer) does not
join, sync and assign as a classic member does: it heartbeats its subscription and the partitions it owns,
and the coordinator assigns. The rules are Kafka's (``GroupMetadataManager.consumerGroupHeartbeat``,
``CurrentAssignmentBuilder``), read in the apache/kafka source:

- A member's change of subscription (or of the subscribed topics' partitions) bumps the *group epoch*; the
  next heartbeat computes the *target assignment* of every member for that epoch with a server-side
  assignor (``consumer_group_assignors``: ``uniform``, the default, or ``range``).
- Each member is brought to its target on its own heartbeats: first it is told to give up the partitions it
  keeps no longer (it stays at its epoch, *unrevoked*), and once its heartbeat no longer names them, it moves
  to the target epoch and is given the partitions no other member still holds (*unreleased* ones come on a
  later heartbeat). So no partition is ever assigned to two members at once.
- A heartbeat's epoch must be the member's (or its previous one, when the answer that moved it was lost
  and it owns no more than it was given): otherwise FENCED_MEMBER_EPOCH, and the member rejoins at epoch 0
  after giving everything up. A member silent for the session timeout is removed; one that has not given up
  its revoked partitions within its rebalance timeout is removed too.
- Static members (``group.instance.id``): epoch -2 leaves for a while, keeping the partitions until the
  session runs out; a new process with the same instance id then takes them over.
- A member may subscribe to a regular expression (``SubscribedTopicRegex``) beside or instead of names: the
  coordinator matches it, in RE2 (``topic_regex``), against the cluster's topics the member may describe, and
  the member's subscription is the union. A pattern new to the group is checked (INVALID_REGULAR_EXPRESSION)
  and resolved on the heartbeat that brings it; all of a group's patterns are matched again when the
  metadata moved, at most every 10 s (Kafka's pace), and every ``regex_refresh_interval_ms`` whatever (ACLs
  may have changed). As in Kafka, a refresh is resolved under the ACLs of the member whose heartbeat made it.

The state is written to ``__consumer_offsets`` as it changes (``take_changes``: each changed member's record with
its target, the group's epochs, tombstones for members gone), and the heartbeat is answered once that is
durable, as Kafka does: the coordinator that takes the partition over loads the group (``restore``) and its
members go on at their epochs with their partitions. What Brook does not do (README, Consumer groups):
assignors do not use racks.

Everything here runs under the coordinator's lock, deterministic given the clock passed in.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker import topic_regex
from broker.consumer_group_assignors import ASSIGNORS, DEFAULT_ASSIGNOR, assign
from proto.common_pb2 import ErrorCode

log = logging.getLogger(__name__)

# Kafka's error codes of this protocol (proto/common.proto's enum predates them).
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113

CONSUMER_GROUP_TYPE, CLASSIC_GROUP_TYPE = "consumer", "classic"  # as ListGroups v5 and describe name them

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

# Kafka's group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms defaults.
SESSION_TIMEOUT_MS = 45_000
HEARTBEAT_INTERVAL_MS = 5_000
# A group's subscriptions name at most max(this, twice the cluster's topics) distinct topics: each is looked up
# again, under the coordinator's lock, whenever the cluster's metadata changes.
SUBSCRIBED_NAMES_MIN_BOUND = 1000
# Distinct regular expressions a group's members may subscribe to (Kafka has no bound; members of one group
# normally share one): each refresh matches them all against every topic name.
GROUP_REGEXES_MAX = 32
# Kafka's pace: a group's patterns are matched again at most every 10 s when the metadata moved, and every
# group.consumer.regex.refresh.interval.ms (10 minutes) whatever, for topics an ACL change let it describe.
REGEX_REFRESH_MIN_MS = 10_000
REGEX_REFRESH_INTERVAL_MS = 600_000

STABLE, UNREVOKED, UNRELEASED = "stable", "unrevoked_partitions", "unreleased_partitions"

Assignment = dict[uuid.UUID, frozenset[int]]
TopicLookup = Callable[[str], "tuple[uuid.UUID, int] | None"]  # name -> (topic id, partitions), None if unknown
Topic = tuple[uuid.UUID, int]
Describable = Callable[[set[str]], set[str]]  # of these topic names, those the heartbeat's caller may describe


@dataclass(frozen=True, slots=True)
class Matched:
    """Patterns matched ahead of the coordinator's lock (ConsumerGroups.match), at metadata ``version`` (read
    before the topic names were)."""

    version: int
    topics: dict[str, frozenset[str]]


class HeartbeatError(Exception):
    """Answers a heartbeat with ``code`` (Kafka's) and ``message``; nothing of the group changed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat's fields; None is Kafka's "unchanged since the last heartbeat"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: Sequence[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Sequence[tuple[uuid.UUID, Sequence[int]]] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None  # None: unchanged, not sent


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    topic_names: frozenset[str] = frozenset()  # as the member named them
    regex: str = ""  # its SubscribedTopicRegex, "" for none
    subscribed: frozenset[str] = frozenset()  # what it is assigned from: its names and what its regex matched
    assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = 0
    state: str = STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    session_deadline_ms: int = 0
    revoke_deadline_ms: int | None = None  # set while it holds partitions it was told to give up

    def held_bytes(self) -> int:
        """What it holds in memory beyond a fixed overhead: its subscription and ids (for the coordinator's
        metadata budget)."""
        return (sum(len(t) for t in self.subscribed) + len(self.regex) + len(self.member_id) + len(self.instance_id or "")
                + len(self.client_id) + len(self.rack_id or "")
                + 8 * sum(len(p) for p in self.assigned.values()))


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    partition: int  # of __consumer_offsets: the group is dropped when this coordinator stops leading it
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Assignment] = field(default_factory=dict)
    topics: dict[str, Topic] = field(default_factory=dict)  # the subscribed topics that exist, as last looked up
    # Every name some member subscribes to: how many do, and what it was at ``topics_version`` of the metadata.
    subscribers: dict[str, int] = field(default_factory=dict)
    looked_up: dict[str, Topic | None] = field(default_factory=dict)
    topics_version: int = -1
    topics_stale: bool = False  # the names changed since ``topics`` was computed
    owners: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)  # partition -> its holder's epoch
    regexes: dict[str, int] = field(default_factory=dict)  # each member's regex: how many members have it
    resolved: dict[str, frozenset[str]] = field(default_factory=dict)  # regex -> the topic names it matched
    regex_version: int = -1  # the metadata version all of ``resolved`` was last matched at
    regex_refreshed_ms: int | None = None  # and when
    # What changed since the coordinator last wrote the group down (ConsumerGroups.take_changes): members to write,
    # members to delete, the epochs as last written, and whether the group was dropped (left empty).
    changed: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    written_epochs: tuple[int, int] = (0, 0)
    dropped: bool = False

    def state(self) -> str:
        """Kafka's consumer group states, as ListGroups and describe name them."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def subscribe(self, member: Member, names: frozenset[str], lookup: TopicLookup) -> None:
        """Set the member's subscription, looking up only the names new to the group."""
        for name in member.subscribed - names:
            if (left := self.subscribers[name] - 1) == 0:
                del self.subscribers[name]
                self.looked_up.pop(name, None)
                self.topics_stale = True
            else:
                self.subscribers[name] = left
        for name in names - member.subscribed:
            if name not in self.subscribers:
                self.subscribers[name] = 0
                self.looked_up[name] = lookup(name)
                self.topics_stale = True
            self.subscribers[name] += 1
        member.subscribed = names

    def refresh_topics(self, version: int, lookup: TopicLookup) -> bool:
        """Bring ``topics`` up to date (every name looked up again if the metadata moved to ``version`` since);
        did it change?"""
        if version != self.topics_version:
            self.looked_up = {name: lookup(name) for name in self.subscribers}
            self.topics_version = version
            self.topics_stale = True
        if not self.topics_stale:
            return False
        self.topics_stale = False
        topics = {name: topic for name, topic in self.looked_up.items() if topic is not None}
        if topics == self.topics:
            return False
        self.topics = topics
        return True

    def touch(self, member_id: str) -> None:
        """The member's record must be written again."""
        self.changed.add(member_id)
        self.removed.discard(member_id)

    def forget(self, member_id: str) -> None:
        """The member's record must be deleted."""
        self.changed.discard(member_id)
        self.removed.add(member_id)

    def persisted(self, member: Member) -> tuple:
        """What of the member its record holds (a change of it is written)."""
        return (member.epoch, member.previous_epoch, member.state, member.assigned, member.revoking,
                member.topic_names, member.regex, member.subscribed, member.assignor, member.instance_id,
                member.rack_id, member.client_id, member.client_host, member.rebalance_timeout_ms,
                self.target.get(member.member_id))

    def set_regex(self, member: Member, regex: str) -> None:
        """Count the member's regex ("" for none); a pattern no member has any more is forgotten."""
        if member.regex:
            if (left := self.regexes[member.regex] - 1) == 0:
                del self.regexes[member.regex]
                self.resolved.pop(member.regex, None)
            else:
                self.regexes[member.regex] = left
        if regex:
            self.regexes[regex] = self.regexes.get(regex, 0) + 1
        member.regex = regex

    def effective(self, member: Member) -> frozenset[str]:
        """What the member is assigned from: its topic names and its regex's matches."""
        if not member.regex:
            return member.topic_names
        return member.topic_names | self.resolved.get(member.regex, frozenset())

    def hold(self, member: Member) -> None:
        for tid, parts in (*member.assigned.items(), *member.revoking.items()):
            for p in parts:
                self.owners[(tid, p)] = member.epoch

    def release(self, member: Member) -> None:
        for tid, parts in (*member.assigned.items(), *member.revoking.items()):
            for p in parts:
                self.owners.pop((tid, p), None)

    def holder_epoch(self, tid: uuid.UUID, partition: int) -> int:
        return self.owners.get((tid, partition), -1)


def _due(member: Member) -> int:
    """When the member is removed unless it heartbeats (or gives up its revoked partitions) first."""
    if member.revoke_deadline_ms is None:
        return member.session_deadline_ms
    return min(member.session_deadline_ms, member.revoke_deadline_ms)


def _subset(owned: Sequence[tuple[uuid.UUID, Sequence[int]]] | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(p in assigned.get(tid, ()) for tid, parts in owned for p in parts)


def _owns_any(owned: Sequence[tuple[uuid.UUID, Sequence[int]]] | None, revoking: Assignment) -> bool:
    if owned is None:
        return True  # not told: assume it still owns them
    return any(p in revoking.get(tid, ()) for tid, parts in owned for p in parts)


class ConsumerGroups:
    """The consumer groups (KIP-848) of one coordinator."""

    def __init__(self, topic_lookup: TopicLookup, *, members_max: int,
                 metadata_version: Callable[[], int] = lambda: 0, topic_count: Callable[[], int] = lambda: 0,
                 topic_names: Callable[[], Iterable[str]] = lambda: (),
                 session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
                 regex_refresh_interval_ms: int = REGEX_REFRESH_INTERVAL_MS,
                 on_emptied: Callable[[str, int], None] = lambda group_id, now_ms: None) -> None:
        """``metadata_version``: moves whenever the cluster's topics may have changed; ``topic_count``: the
        cluster's topics (the bound on a group's subscribed names); ``topic_names``: the names a regex may
        match (not the internal topics); ``on_emptied(group id, now)``: its last member left (its committed
        offsets' retention starts)."""
        self._lookup = topic_lookup
        self._version = metadata_version
        self._topic_count = topic_count
        self._topic_names = topic_names
        self.regex_refresh_interval_ms = regex_refresh_interval_ms
        self._on_emptied = on_emptied
        self.members_max = members_max
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.groups: dict[str, ConsumerGroup] = {}  # each with a member: a group left empty is dropped
        # Groups with changes not yet taken (take_changes), in the order they changed; keyed by object, as a
        # group dropped and one made again under its id are written in turn.
        self.pending: dict[int, ConsumerGroup] = {}
        # No member's session or revocation ends before this: expire() walks the members only from then.
        self.next_due_ms = 0

    # ------------------------------------------------------------------ requests
    @staticmethod
    def validate(hb: Heartbeat) -> None:
        """Kafka's checks of a heartbeat's fields (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR)."""
        def invalid(message: str) -> HeartbeatError:
            return HeartbeatError(ErrorCode.INVALID_REQUEST, message)
        if not hb.group_id:
            raise invalid("GroupId can't be empty.")
        if hb.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if hb.rack_id == "":
            raise invalid("RackId can't be empty.")
        if hb.member_epoch > 0 or hb.member_epoch == LEAVE_EPOCH:
            if not hb.member_id:
                raise invalid("MemberId can't be empty.")
        elif hb.member_epoch == JOIN_EPOCH:
            if hb.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if hb.owned is None or any(parts for _, parts in hb.owned):
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            # "" is no regex: librdkafka sends it beside topic names
            if not hb.subscribed_topic_names and not hb.subscribed_topic_regex:
                raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif hb.member_epoch == STATIC_LEAVE_EPOCH:
            if not hb.member_id:
                raise invalid("MemberId can't be empty.")
            if hb.instance_id is None:
                raise invalid("InstanceId can't be null.")
        else:
            raise invalid("MemberEpoch is invalid.")
        if hb.rebalance_timeout_ms < -1:
            raise invalid("RebalanceTimeoutMs is invalid.")
        if hb.server_assignor is not None and hb.server_assignor not in ASSIGNORS:
            raise HeartbeatError(UNSUPPORTED_ASSIGNOR, f"ServerAssignor {hb.server_assignor} is not supported. "
                                                       f"Supported assignors: {', '.join(ASSIGNORS)}.")

    def heartbeat(self, hb: Heartbeat, partition: int, now_ms: int, describable: Describable | None = None,
                  matched: Matched | None = None) -> HeartbeatAnswer:
        """One heartbeat, validated first (HeartbeatError: nothing changed). ``describable``: which topic names
        the caller may describe (a regex matches only those); None: all. ``matched``: the heartbeat's regex
        already matched (``match``, outside the coordinator's lock), used if the group has not matched it."""
        self.validate(hb)
        if hb.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(hb, now_ms)
        joining = hb.member_epoch == JOIN_EPOCH
        group = self.groups.get(hb.group_id)
        if group is None:
            if not joining:
                # Kafka answers GROUP_ID_NOT_FOUND; here a group is unknown after a coordinator change (its
                # state is not written down), and UNKNOWN_MEMBER_ID makes the member rejoin at once.
                raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                     f"Member {hb.member_id} is not a member of group {hb.group_id}: rejoin")
            group = ConsumerGroup(hb.group_id, partition)
        member_id = hb.member_id or str(uuid.uuid4())
        if len(group.members) >= self.members_max and member_id not in group.members and not (
                hb.instance_id is not None and hb.instance_id in group.static):
            raise HeartbeatError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                 f"The consumer group has reached its maximum capacity of {self.members_max} members.")
        if hb.subscribed_topic_names is not None:
            bound = max(SUBSCRIBED_NAMES_MIN_BOUND, 2 * self._topic_count())
            new = sum(1 for name in set(hb.subscribed_topic_names) if name not in group.subscribers)
            if len(group.subscribers) + new > bound:
                raise HeartbeatError(ErrorCode.INVALID_REQUEST,
                                     f"group {group.group_id} would subscribe to {len(group.subscribers) + new} topic "
                                     f"names; the cluster has {self._topic_count()} topics, so a group may name at "
                                     f"most {bound}")
        regex = hb.subscribed_topic_regex
        if regex and regex not in group.regexes:
            _check_regex(regex)
            if len(group.regexes) >= GROUP_REGEXES_MAX:
                raise HeartbeatError(ErrorCode.INVALID_REQUEST,
                                     f"group {group.group_id} already has {len(group.regexes)} distinct regular "
                                     f"expressions, the most a group may have")
        old, member = self._member(group, hb, member_id, now_ms)
        before = group.persisted(member) if old is not None else None
        if group.group_id not in self.groups:
            self.groups[group.group_id] = group
            log.info("consumer group %s created (KIP-848 protocol) by member %s", group.group_id, member_id)
        self.pending[id(group)] = group

        # 1. The member's subscription and settings; a change of subscription bumps the group epoch.
        if hb.instance_id is not None:
            member.instance_id = hb.instance_id
        if hb.rack_id is not None:
            member.rack_id = hb.rack_id
        if hb.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = hb.rebalance_timeout_ms
        if hb.server_assignor is not None:
            member.assignor = hb.server_assignor
        member.client_id, member.client_host = hb.client_id, hb.client_host
        bump = old is None
        changed = bump
        if hb.subscribed_topic_names is not None:
            member.topic_names = frozenset(hb.subscribed_topic_names)
            changed = True
        if regex is not None and regex != member.regex:
            group.set_regex(member, regex)
            changed = True
        # The group's patterns matched again if due (the other members' subscriptions with them), and the
        # member's own if the group has not matched it yet.
        bump = self._refresh_regexes(group, now_ms, describable, matched) or bump
        if member.regex and member.regex not in group.resolved:
            if matched is not None and member.regex in matched.topics:
                names = matched.topics[member.regex]
            else:  # the hint was wrong: matched with the lock held
                names = self._resolve([member.regex], describable)[member.regex]
            bump = self._set_resolved(group, member.regex, names) or bump
        if changed:
            subscribed = group.effective(member)
            bump = bump or subscribed != member.subscribed
            group.subscribe(member, subscribed, self._lookup)
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
        # A topic made, deleted or grown (the metadata moved), or names gone or new, may change the topics.
        bump = group.refresh_topics(self._version(), self._lookup) or bump
        if bump:
            group.epoch += 1
            log.info("consumer group %s: epoch %d (member %s %s)", group.group_id, group.epoch, member.member_id,
                     "joined" if old is None else "changed its subscription or the topics changed")

        # 2. The target assignment of the new epoch.
        if group.epoch > group.assignment_epoch:
            self._assign(group)

        # 3. The member toward its target.
        given = dict(member.assigned)
        self._reconcile(group, member, hb.owned, now_ms)
        if before is None or group.persisted(member) != before:
            group.touch(member.member_id)
        member.session_deadline_ms = now_ms + self.session_timeout_ms
        self.next_due_ms = min(self.next_due_ms, _due(member))
        full = joining or (hb.rebalance_timeout_ms != -1 and hb.subscribed_topic_names is not None
                           and hb.owned is not None)
        return HeartbeatAnswer(member.member_id, member.epoch, self.heartbeat_interval_ms,
                               dict(member.assigned) if full or member.assigned != given else None)

    def _member(self, group: ConsumerGroup, hb: Heartbeat, member_id: str,
                now_ms: int) -> tuple[Member | None, Member]:
        """(the member before this heartbeat or None, the member to update)."""
        if hb.member_epoch == JOIN_EPOCH:
            if hb.instance_id is not None and (existing_id := group.static.get(hb.instance_id)) is not None:
                existing = group.members[existing_id]
                if existing.epoch != STATIC_LEAVE_EPOCH and existing_id != member_id:
                    raise HeartbeatError(UNRELEASED_INSTANCE_ID,
                                         f"Static member {existing_id} with instance id {hb.instance_id} "
                                         "is still in the group (it has not left)")
                # A new process of the static member takes over its partitions and target under its new id.
                group.release(existing)
                del group.members[existing_id]
                group.forget(existing_id)
                group.touch(member_id)
                taken = Member(member_id, instance_id=hb.instance_id, topic_names=existing.topic_names,
                               regex=existing.regex, subscribed=existing.subscribed, assignor=existing.assignor,
                               assigned=dict(existing.assigned))
                if (target := group.target.pop(existing_id, None)) is not None:
                    group.target[member_id] = target
                group.hold(taken)
                log.info("consumer group %s: static member %s (instance %s) replaced by %s", group.group_id,
                         existing_id, hb.instance_id, member_id)
                return taken, taken
            if (existing := group.members.get(member_id)) is not None:
                # Rejoining (after FENCED_MEMBER_EPOCH, or a restart with the same id): it owns nothing now.
                self._remove(group, existing, bump=True)
            return None, Member(member_id)
        if hb.instance_id is not None:
            existing_id = group.static.get(hb.instance_id)
            if existing_id is None:
                raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                     f"Instance id {hb.instance_id} is unknown in group {group.group_id}")
            if existing_id != member_id:
                raise HeartbeatError(ErrorCode.FENCED_INSTANCE_ID,
                                     f"Static member {member_id} with instance id {hb.instance_id} was replaced "
                                     f"by member {existing_id}")
        member = group.members.get(member_id)
        if member is None:
            raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"Member {member_id} is not a member of group {group.group_id}")
        if hb.member_epoch > member.epoch:
            raise HeartbeatError(FENCED_MEMBER_EPOCH,
                                 f"The consumer group member has a greater member epoch ({hb.member_epoch}) than "
                                 f"the one known by the group coordinator ({member.epoch}). The member must "
                                 "abandon all its partitions and rejoin.")
        if hb.member_epoch < member.epoch and (hb.member_epoch != member.previous_epoch
                                               or not _subset(hb.owned, member.assigned)):
            raise HeartbeatError(FENCED_MEMBER_EPOCH,
                                 f"The consumer group member has a smaller member epoch ({hb.member_epoch}) than "
                                 f"the one known by the group coordinator ({member.epoch}). The member must "
                                 "abandon all its partitions and rejoin.")
        return member, member

    def match(self, hb: Heartbeat, describable: Describable | None, now_ms: int) -> Matched | None:
        """What ``heartbeat`` will match, matched ahead for its ``matched``: the heartbeat's regex if the group has
        not matched it yet, and all of the group's if their refresh is due. Called outside the coordinator's lock,
        as matching walks every topic name; what it reads of the groups without the lock is only a hint
        (``heartbeat`` matches, under the lock, what this missed). None: nothing to match. HeartbeatError: the
        heartbeat's pattern is invalid."""
        regex = hb.subscribed_topic_regex or ""
        group = self.groups.get(hb.group_id)
        patterns = []
        if regex and (group is None or regex not in group.resolved):
            _check_regex(regex)
            patterns.append(regex)
        if group is not None and self._refresh_due(group, now_ms):
            try:
                patterns += [r for r in list(group.regexes) if r != regex]
            except RuntimeError:  # changed while read: the refresh matches under the lock
                pass
        if not patterns:
            return None
        version = self._version()
        return Matched(version, self._resolve(patterns, describable))

    def _refresh_due(self, group: ConsumerGroup, now_ms: int) -> bool:
        """Kafka's pace: the metadata moved and 10 s passed since the group's last batch, or the refresh interval."""
        last = group.regex_refreshed_ms
        if last is None or not group.regexes:
            return False
        return ((self._version() != group.regex_version and now_ms - last >= REGEX_REFRESH_MIN_MS)
                or now_ms - last >= self.regex_refresh_interval_ms)

    def _resolve(self, patterns: Sequence[str], describable: Describable | None) -> dict[str, frozenset[str]]:
        resolved = topic_regex.resolve(patterns, self._topic_names())
        if describable is None:
            return resolved
        allowed = describable(set().union(*resolved.values()))  # only what matched is checked against the ACLs
        return {r: names & allowed for r, names in resolved.items()}

    def _refresh_regexes(self, group: ConsumerGroup, now_ms: int, describable: Describable | None,
                         matched: Matched | None) -> bool:
        """Match all of the group's patterns again if due (taking what ``matched`` has, matched ahead outside the
        lock); did a member's subscription change?"""
        if not group.regexes:
            return False
        if group.regex_refreshed_ms is None:
            # A group's first pattern (or a group just loaded): each pattern is matched when a member of it
            # first heartbeats, ahead of the lock (match); the batch refreshes count from now.
            group.regex_version, group.regex_refreshed_ms = self._version(), now_ms
            return False
        if not self._refresh_due(group, now_ms):
            return False
        version = self._version()
        resolved = {r: matched.topics[r] for r in group.regexes if matched is not None and r in matched.topics}
        if resolved:
            version = matched.version  # as of when those were matched: a topic made since is matched next time
        if missing := [r for r in group.regexes if r not in resolved]:
            resolved.update(self._resolve(missing, describable))
        group.regex_version, group.regex_refreshed_ms = version, now_ms
        moved = sorted(r for r, names in resolved.items() if group.resolved.get(r) != names)
        if moved:
            log.info("consumer group %s: regular expressions matched again: %s", group.group_id,
                     ", ".join(f"{r!r} -> {len(resolved[r])} topics" for r in moved))
        changed = False
        for regex in moved:
            changed = self._set_resolved(group, regex, resolved[regex]) or changed
        return changed

    def _set_resolved(self, group: ConsumerGroup, regex: str, names: frozenset[str]) -> bool:
        """The topics ``regex`` matches are ``names``: did a member's subscription change?"""
        group.resolved[regex] = names
        changed = False
        for m in group.members.values():
            if m.regex == regex:
                subscribed = group.effective(m)
                if subscribed != m.subscribed:
                    group.subscribe(m, subscribed, self._lookup)
                    group.touch(m.member_id)
                    changed = True
        return changed

    def _leave(self, hb: Heartbeat, now_ms: int) -> HeartbeatAnswer:
        group = self.groups.get(hb.group_id)
        if hb.instance_id is not None:
            member_id = group.static.get(hb.instance_id) if group is not None else None
            if member_id is None:
                raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                     f"Instance id {hb.instance_id} is unknown in group {hb.group_id}")
            if member_id != hb.member_id:
                raise HeartbeatError(ErrorCode.FENCED_INSTANCE_ID,
                                     f"Static member {hb.member_id} with instance id {hb.instance_id} was replaced "
                                     f"by member {member_id}")
        member = group.members.get(hb.member_id) if group is not None else None
        if group is None or member is None:
            raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"Member {hb.member_id} is not a member of group {hb.group_id}")
        if hb.member_epoch == STATIC_LEAVE_EPOCH:
            # Gone for a while: its partitions stay its own (no one else is given them) until its session ends.
            group.release(member)
            member.epoch, member.state, member.revoking, member.revoke_deadline_ms = STATIC_LEAVE_EPOCH, STABLE, {}, None
            group.hold(member)
            group.touch(member.member_id)
            self.pending[id(group)] = group
            log.info("consumer group %s: static member %s (instance %s) left for now", group.group_id,
                     member.member_id, member.instance_id)
        else:
            self._remove(group, member, bump=True)
            log.info("consumer group %s: member %s left", group.group_id, member.member_id)
            self._drop_if_empty(group, now_ms)
        return HeartbeatAnswer(hb.member_id, hb.member_epoch, self.heartbeat_interval_ms, None)

    # ------------------------------------------------------------------ assignment
    def _assign(self, group: ConsumerGroup) -> None:
        name = group_assignor(group)
        subscriptions = {mid: frozenset(group.topics[t][0] for t in m.subscribed if t in group.topics)
                         for mid, m in group.members.items()}
        counts = {tid: n for tid, n in group.topics.values()}
        previous = group.target
        group.target = assign(name, subscriptions, counts, previous)
        group.assignment_epoch = group.epoch
        for mid in group.members:
            if group.target.get(mid) != previous.get(mid):
                group.touch(mid)

    def _reconcile(self, group: ConsumerGroup, member: Member,
                   owned: Sequence[tuple[uuid.UUID, Sequence[int]]] | None, now_ms: int) -> None:
        """Kafka's CurrentAssignmentBuilder: the member's next assignment toward its target."""
        target_epoch = group.assignment_epoch
        if member.state == STABLE and member.epoch == target_epoch:
            return
        if member.state == UNREVOKED:
            if _owns_any(owned, member.revoking):
                return
            epoch = member.epoch + 1
        else:
            epoch = member.epoch
        target = group.target.get(member.member_id, {})
        kept: Assignment = {}
        revoking: Assignment = {}
        adding: Assignment = {}
        unreleased = False
        group.release(member)
        for tid in set(target) | set(member.assigned):
            want = target.get(tid, frozenset())
            have = member.assigned.get(tid, frozenset())
            if keep := have & want:
                kept[tid] = keep
            if give_up := have - want:
                revoking[tid] = give_up
            free = set()
            for p in want - have:
                if group.holder_epoch(tid, p) == -1:
                    free.add(p)
                else:
                    unreleased = True
            if free:
                adding[tid] = frozenset(free)
        previous = member.epoch
        if revoking and _owns_any(owned, revoking):
            member.state, member.assigned, member.revoking = UNREVOKED, kept, revoking
            if epoch != member.epoch or member.revoke_deadline_ms is None:
                # Each revocation gets the member's rebalance timeout to be done in.
                member.revoke_deadline_ms = now_ms + max(0, member.rebalance_timeout_ms)
            if epoch != member.epoch:
                member.previous_epoch = member.epoch
                member.epoch = epoch
        else:
            for tid, parts in adding.items():
                kept[tid] = kept.get(tid, frozenset()) | parts
            member.state = UNRELEASED if unreleased else STABLE
            member.assigned, member.revoking, member.revoke_deadline_ms = kept, {}, None
            if target_epoch != member.epoch:
                member.previous_epoch = member.epoch
                member.epoch = target_epoch
        group.hold(member)
        if member.epoch != previous or member.state != STABLE:
            log.debug("consumer group %s: member %s at epoch %d (%s)", group.group_id, member.member_id,
                      member.epoch, member.state)

    # ------------------------------------------------------------------ time and removal
    def _remove(self, group: ConsumerGroup, member: Member, *, bump: bool) -> None:
        group.release(member)
        group.subscribe(member, frozenset(), self._lookup)
        group.set_regex(member, "")
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.forget(member.member_id)
        self.pending[id(group)] = group
        if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        if bump:
            group.epoch += 1

    def expire(self, now_ms: int) -> list[tuple[str, str, str]]:
        """Remove the members whose session ran out, or whose rebalance timeout passed with revoked partitions
        still held; (group, member, why) of each. Walks the members only once the earliest deadline has come
        (heartbeats move deadlines later), so a coordinator of many members walks them about once a session."""
        if now_ms < self.next_due_ms:
            return []
        removed = []
        due = now_ms + self.session_timeout_ms
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                if member.session_deadline_ms <= now_ms:
                    why = "its session timed out"
                elif member.revoke_deadline_ms is not None and member.revoke_deadline_ms <= now_ms:
                    why = "it did not give up its revoked partitions within its rebalance timeout"
                else:
                    due = min(due, _due(member))
                    continue
                self._remove(group, member, bump=True)
                removed.append((group.group_id, member.member_id, why))
            self._drop_if_empty(group, now_ms)
        self.next_due_ms = due
        for group_id, member_id, why in removed:
            log.info("consumer group %s: member %s removed: %s", group_id, member_id, why)
        return removed

    def drop_partition(self, partition: int) -> int:
        """Forget the groups of a __consumer_offsets partition this coordinator no longer leads."""
        gone = [gid for gid, g in self.groups.items() if g.partition == partition]
        for gid in gone:
            del self.groups[gid]
        self.pending = {k: g for k, g in self.pending.items() if g.partition != partition}
        return len(gone)

    # ------------------------------------------------------------------ written down
    def take_changes(self) -> list[tuple[ConsumerGroup, list[Member], list[str], bool]]:
        """What to write since the last call, per group: (group, members to write, member ids to delete, write the
        group's epochs). A dropped group deletes its members and its group record (its epochs ``True`` then
        means: write the group's tombstone)."""
        out = []
        for group in self.pending.values():
            members = [group.members[mid] for mid in sorted(group.changed) if mid in group.members]
            epochs = (group.epoch, group.assignment_epoch)  # the topics change only with the epoch
            out.append((group, members, sorted(group.removed), group.dropped or epochs != group.written_epochs))
            group.changed, group.removed, group.written_epochs = set(), set(), epochs
        self.pending = {}
        return out

    def restore(self, group: ConsumerGroup, now_ms: int) -> None:
        """Take over a group loaded from its records (members with ``target`` set, epochs as written): sessions
        start now, partitions are held by their members, subscriptions are looked up at the first heartbeat."""
        for member in group.members.values():
            member.session_deadline_ms = now_ms + self.session_timeout_ms
            if member.revoking:
                member.revoke_deadline_ms = now_ms + max(0, member.rebalance_timeout_ms)
            group.hold(member)
            subscribed, member.subscribed = member.subscribed, frozenset()
            group.subscribe(member, subscribed, self._lookup)
            regex, member.regex = member.regex, ""
            group.set_regex(member, regex)
            if member.instance_id is not None:
                group.static[member.instance_id] = member.member_id
        # ``topics`` is as written: the first heartbeat looks the names up again, and bumps the epoch only if a
        # topic changed meanwhile (made, deleted, grown).
        group.topics_version, group.topics_stale = -1, False
        group.written_epochs = (group.epoch, group.assignment_epoch)
        self.groups[group.group_id] = group
        self.next_due_ms = min(self.next_due_ms, now_ms + self.session_timeout_ms)

    def _drop_if_empty(self, group: ConsumerGroup, now_ms: int) -> None:
        """A group without members is forgotten (its offsets stay with the coordinator's Group): nothing of it
        is kept beyond its members, so made-up groups cost only while their members are in."""
        if not group.members and self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
            group.dropped = True
            self.pending[id(group)] = group
            self._on_emptied(group.group_id, now_ms)

    # ------------------------------------------------------------------ offsets
    def active(self, group_id: str) -> ConsumerGroup | None:
        """The group if it has members (an empty one is a plain group of offsets, as Kafka treats it)."""
        group = self.groups.get(group_id)
        return group if group is not None and group.members else None

    def validate_commit(self, group_id: str, member_id: str, member_epoch: int) -> None:
        """Kafka's ConsumerGroup.validateOffsetCommit (HeartbeatError: the commit is refused)."""
        group = self.active(group_id)
        if group is None:
            if member_epoch >= 0 and member_id and group_id in self.groups:
                raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                     f"Member {member_id} is not a member of group {group_id}")
            return
        if member_epoch < 0 and not member_id:
            raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"group {group_id} has members: only they commit its offsets")
        _check_member_epoch(group, member_id, member_epoch)

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> None:
        """Kafka's ConsumerGroup.validateOffsetFetch, for OffsetFetch v9's member id and epoch (HeartbeatError: the
        group's fetch is refused). Without them (an admin client, or a client of another protocol) it is accepted,
        and so is any fetch from a group that is not of this protocol."""
        if member_id is None and member_epoch < 0:
            return
        group = self.active(group_id)
        if group is not None:
            _check_member_epoch(group, member_id or "", member_epoch)

    def held(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """(bytes held by all members, {client host: (bytes, members)}) for the coordinator's metadata budget."""
        total, hosts = 0, {}
        for group in self.groups.values():
            for m in group.members.values():
                n = m.held_bytes()
                total += n
                held, count = hosts.get(m.client_host, (0, 0))
                hosts[m.client_host] = (held + n, count + 1)
        return total, hosts

    def member_count(self) -> int:
        return sum(len(g.members) for g in self.groups.values())


def _check_regex(regex: str) -> None:
    """INVALID_REGULAR_EXPRESSION unless RE2 takes the pattern."""
    try:
        topic_regex.check(regex)
    except topic_regex.RegexError as exc:
        raise HeartbeatError(topic_regex.INVALID_REGULAR_EXPRESSION, str(exc)) from None


def _check_member_epoch(group: ConsumerGroup, member_id: str, member_epoch: int) -> None:
    """Kafka's validateMemberEpoch: the member must be one, at this epoch (ahead: fenced; behind: stale)."""
    member = group.members.get(member_id)
    if member is None:
        raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group.group_id}")
    if member_epoch > member.epoch:
        raise HeartbeatError(FENCED_MEMBER_EPOCH, f"The member epoch {member_epoch} is ahead of member {member_id}'s "
                                                  f"epoch {member.epoch}: the member must rejoin")
    if member_epoch < member.epoch:
        raise HeartbeatError(STALE_MEMBER_EPOCH, f"The member epoch {member_epoch} is stale: member {member_id} "
                                                 f"is at epoch {member.epoch}")


def group_assignor(group: ConsumerGroup) -> str:
    """The assignor the members ask for most (ties: by name), or the default: Kafka's choice."""
    votes: dict[str, int] = {}
    for m in group.members.values():
        if m.assignor is not None:
            votes[m.assignor] = votes.get(m.assignor, 0) + 1
    return min(votes, key=lambda a: (-votes[a], a)) if votes else DEFAULT_ASSIGNOR


def describe_assignment(assignment: Mapping[uuid.UUID, frozenset[int]]) -> list[dict]:
    """An assignment as the wire's TopicPartitions list, in a stable order."""
    return [{"topic_id": tid, "partitions": sorted(parts)}
            for tid, parts in sorted(assignment.items(), key=lambda kv: kv[0].bytes)]
