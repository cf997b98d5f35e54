"""The client side of the consumer group protocol, used by ``client.consumer.Consumer``.

``GroupMembership`` joins a group, runs the configured assignor when it is the group
leader, keeps the session alive with a background heartbeat thread and tells a
listener which partitions it gained or lost. Everything that changes what the consumer
owns happens in the caller's thread, inside ``poll()`` (as in Kafka, rebalance
callbacks run in ``Consumer.poll``); the heartbeat thread only sets flags.

Rebalance protocols:

- eager (range, roundrobin): before every join the member revokes everything it owns
  (``on_partitions_revoked``), then gets its new share (``on_partitions_assigned``).
- cooperative (cooperative-sticky, KIP-429): the member keeps its partitions through the
  join and reports them as ``owned_partitions``; afterwards it revokes only what it lost
  and, if it lost any, joins once more so the leader can hand them to their new owner.

A member that the coordinator fenced (session expired, stale generation) loses its
partitions without the chance to commit (``on_partitions_lost``) and joins afresh.

It also rejoins when the partition count of a subscribed topic changes or, with a
pattern subscription, when the set of matching topics changes (checked every
``metadata_max_age_ms`` from ``poll``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from client import consumer_protocol, errors
from client.assignors import (
    COOPERATIVE,
    Assignor,
    Subscription,
    get_assignors,
    rebalance_protocol,
)
from client.cluster import ClusterClient, as_timeout_ms
from client.coordinator import GroupCoordinatorClient, offset_commit_request
from client.types import OffsetAndMetadata, TopicPartition
from proto import group_pb2

log = logging.getLogger(__name__)
_INSTANCE_ID = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # what Kafka's clients accept for group.instance.id

PROTOCOL_TYPE = "consumer"
JOIN_ATTEMPTS_MAX = 100  # bound on join/sync round trips within one ensure_active call
HEARTBEAT_RETRY_BACKOFF_S = 0.1
ErrorCode = errors.ErrorCode


class CommitFailedError(errors.BrookError):
    """The group rebalanced (or fenced this member) before the commit: the partitions may
    belong to another member now, so the commit was refused (Kafka's CommitFailedException)."""

    code = ErrorCode.ILLEGAL_GENERATION


class RebalanceListener(Protocol):
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...
    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...
    def on_partitions_lost(self, lost: set[TopicPartition]) -> None: ...


@dataclass(frozen=True)
class Generation:
    generation_id: int
    member_id: str
    protocol_name: str

    @property
    def is_valid(self) -> bool:
        return self.generation_id >= 0 and bool(self.member_id)


NO_GENERATION = Generation(-1, "", "")


def encode_subscription(topics: Iterable[str], owned: Iterable[TopicPartition] = (), generation_id: int = -1,
                        user_data: bytes = b"") -> bytes:
    """JoinGroup metadata in Kafka's consumer protocol format (client/consumer_protocol), so that the group
    may mix Brook's and Kafka's clients and Kafka's tools can describe it."""
    return consumer_protocol.encode_subscription(topics, owned, generation_id, user_data)


def decode_subscription(raw: bytes) -> Subscription:
    msg = consumer_protocol.subscription(raw)
    return Subscription(tuple(msg.topics), tuple(TopicPartition(r.topic, r.partition) for r in msg.owned_partitions),
                        msg.generation_id, msg.user_data)


def encode_assignment(partitions: Iterable[TopicPartition]) -> bytes:
    return consumer_protocol.encode_assignment(partitions)


def decode_assignment(raw: bytes) -> set[TopicPartition]:
    return {TopicPartition(r.topic, r.partition) for r in consumer_protocol.assignment(raw).partitions}


@dataclass(eq=False)
class _Round:
    """One join + sync round in flight, kept across polls. Kafka's consumer keeps its JoinGroup
    future the same way: ``poll(Duration)`` returns when its timeout says while the coordinator
    waits for the other members (up to their rebalance timeout, minutes), and the next poll goes
    on waiting for the same answer instead of joining again."""

    topics: set[str]
    reason: str
    call: Any = None  # the JoinGroup or SyncGroup in flight (a grpc future)
    join: group_pb2.JoinGroupResponse | None = None  # the join phase's answer, once the SyncGroup is sent
    joins: int = 0  # JoinGroups sent in this round (the first may only fetch a member id)

    @property
    def method(self) -> str:
        return "JoinGroup" if self.join is None else "SyncGroup"


class GroupMembership:
    def __init__(
        self,
        cluster: ClusterClient,
        group_id: str,
        *,
        listener: RebalanceListener | None = None,
        assignors: str | list[str] = "range,cooperative-sticky",
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3000,
        max_poll_interval_ms: int = 300_000,
        rebalance_timeout_ms: int | None = None,
        metadata_max_age_ms: int = 5000,
        client_id: str = "brook-consumer",
        coordinator: GroupCoordinatorClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        group_instance_id: str = "",
        interrupt: threading.Event | None = None,
    ) -> None:
        if group_instance_id and not _INSTANCE_ID.fullmatch(group_instance_id):
            raise errors.InvalidConfigError(
                f"group.instance.id {group_instance_id!r} must be 1-249 characters of [a-zA-Z0-9._-]")
        if heartbeat_interval_ms <= 0 or heartbeat_interval_ms >= session_timeout_ms:
            raise errors.InvalidConfigError(
                f"heartbeat.interval.ms ({heartbeat_interval_ms}) must be > 0 and < session.timeout.ms "
                f"({session_timeout_ms})")
        self.cluster = cluster
        self.group_id = group_id
        self.coordinator = coordinator or GroupCoordinatorClient(cluster, group_id)
        self.listener = listener
        self.assignors: list[Assignor] = get_assignors(assignors)
        self.protocol = rebalance_protocol(self.assignors)
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        # Kafka: the rebalance timeout is max.poll.interval.ms (time to finish a poll loop
        # iteration, i.e. revocation callbacks, before the member is dropped).
        self.rebalance_timeout_ms = rebalance_timeout_ms or max_poll_interval_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.client_id = client_id
        self.group_instance_id = group_instance_id  # "" for a dynamic member
        self.clock = clock
        self._lock = threading.RLock()
        self._topics: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._generation = NO_GENERATION
        self._member_id = ""
        self._owned: set[TopicPartition] = set()
        self._rejoin_reason: str | None = "initial join"  # cleared when a round starts; set again if it fails
        self._round: _Round | None = None  # only the polling thread starts, advances or ends one
        self._interrupt = interrupt or threading.Event()  # set by Consumer.wakeup(): poll's waits end early
        self._waits = threading.Condition()  # notified when a round's call completes, and by wake()
        self._lost = False  # fenced: owned partitions must be dropped without commit
        self._stable = False
        self._partition_counts: dict[str, int] = {}  # topics this member watches -> count at assignment
        self._last_metadata_check = 0.0
        self._last_poll = clock()
        self._closed = False
        self._fenced: errors.BrookError | None = None  # FENCED_INSTANCE_ID seen by the heartbeat: fatal
        self._stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self.rebalances_total = 0

    # ------------------------------------------------------------------ subscription
    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | re.Pattern[str] | None = None) -> None:
        if (topics is None) == (pattern is None):
            raise errors.InvalidConfigError("subscribe to either a list of topics or a pattern")
        with self._lock:
            if pattern is not None:
                self._pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
                self._topics = self._matching_topics()
            else:
                names = {str(t) for t in topics or ()}
                if not names or any(not t for t in names):
                    raise errors.InvalidTopicException(f"bad topic list {sorted(names)}")
                self._pattern = None
                self._topics = names
            self.request_rejoin("subscription changed")

    def subscription(self) -> set[str]:
        with self._lock:
            return set(self._topics)

    def _matching_topics(self, timeout_ms: int | None = None) -> set[str]:
        assert self._pattern is not None
        meta = self.cluster.metadata(refresh=True, timeout_ms=timeout_ms)
        return {t for t, info in meta.topics.items() if not info.is_internal and self._pattern.fullmatch(t)}

    # ------------------------------------------------------------------ state
    def assignment(self) -> set[TopicPartition]:
        with self._lock:
            return set(self._owned)

    def generation(self) -> Generation:
        with self._lock:
            return self._generation

    @property
    def member_id(self) -> str:
        with self._lock:
            return self._member_id

    def request_rejoin(self, reason: str) -> None:
        with self._lock:
            if self._rejoin_reason is None:
                log.info("group %s: rejoin requested: %s", self.group_id, reason)
                self._rejoin_reason = reason

    def needs_rejoin(self) -> bool:
        """A rejoin is asked for or a round is under way."""
        with self._lock:
            return self._rejoin_reason is not None or self._lost or self._round is not None

    # ------------------------------------------------------------------ poll-driven work
    def poll(self, timeout_s: float = 0.0) -> bool:
        """Called from ``Consumer.poll``: notes liveness, watches metadata, (re)joins when
        needed and runs the listener callbacks. True when the member holds a current
        assignment. Takes at most ``timeout_s`` to find the coordinator and wait for its
        answers (False when they have not come: the next poll looks again, or goes on waiting
        for the JoinGroup or SyncGroup already sent)."""
        if self._closed:
            raise errors.error_for(ErrorCode.INVALID_REQUEST, "group membership is closed")
        if self._fenced is not None:
            raise self._fenced
        self._last_poll = self.clock()
        self._start_heartbeat_thread()
        self._maybe_check_metadata(timeout_s)
        if self.needs_rejoin():
            return self.ensure_active(timeout_s)
        return True

    def ensure_active(self, timeout_s: float) -> bool:
        deadline = self.clock() + max(0.0, timeout_s)
        for _ in range(JOIN_ATTEMPTS_MAX):
            if not self.needs_rejoin():
                return True
            if self._interrupt.is_set():
                return False  # Consumer.wakeup(): the consumer raises; a round in flight stays so
            self._handle_lost()
            # Within the poll's time, as Kafka's poll(Duration) (KIP-266): against a cluster that
            # cannot name a coordinator (down, unreachable, failing over) poll returns when its
            # timeout says instead of retrying for the whole rebalance timeout.
            if not self.coordinator.ready(max(0.0, deadline - self.clock())):
                return False
            try:
                done = self._advance_round(deadline)
            except errors.BrookError as exc:
                if not exc.retriable:
                    raise
                log.info("group %s: join failed (%s); retrying", self.group_id, exc)
                self.coordinator.forget()
                self._wait(lambda: False, self.clock() + min(1.0, max(0.05, deadline - self.clock())))
                done = False
            if done is None:
                return False  # no answer within this poll's time: the next poll waits on for it
            if self.clock() >= deadline:
                return not self.needs_rejoin()
        return not self.needs_rejoin()

    def _handle_lost(self) -> None:
        with self._lock:
            if not self._lost:
                return
            lost, self._owned = set(self._owned), set()
            self._lost = False
        if lost:
            log.warning("group %s: lost %d partitions (fenced by the coordinator)", self.group_id, len(lost))
            if self.listener is not None:
                self.listener.on_partitions_lost(lost)

    def _prepare_join(self) -> None:
        """Eager protocol: give everything up before joining (the commit-before-revoke point)."""
        if self.protocol == COOPERATIVE:
            return
        with self._lock:
            revoked, self._owned = set(self._owned), set()
        if revoked and self.listener is not None:
            self.listener.on_partitions_revoked(revoked)

    def _advance_round(self, deadline: float) -> bool | None:
        """Start the join + sync round, or go on with the one in flight, until ``deadline``. True
        when it installed an assignment, False when it ended without one (the caller may start
        another), None when the coordinator has not answered yet (the round stays in flight)."""
        r = self._round or self._start_round()
        synced: group_pb2.SyncGroupResponse | None = None
        try:
            while True:
                self._wait(r.call.done, deadline)
                resp = self.coordinator.receive(r.method, r.call)
                if resp is None:
                    return None
                if r.join is None:
                    if resp.error_code == ErrorCode.MEMBER_ID_REQUIRED:
                        if r.joins >= 3:
                            break
                        with self._lock:  # first contact: the real join carries the id the coordinator chose
                            self._member_id = resp.member_id
                        r.call = self._send_join(r)
                        continue
                    if resp.error_code != ErrorCode.NONE:
                        self._on_group_error(resp.error_code, resp.error_message, "JoinGroup")
                        break
                    with self._lock:
                        self._member_id = resp.member_id
                    r.join = resp
                    r.call = self._send_sync(resp)
                    continue
                if resp.error_code != ErrorCode.NONE:
                    self._on_group_error(resp.error_code, resp.error_message, "SyncGroup")
                    break
                synced = resp
                break
        except BaseException:
            self._end_round(r, rejoin=True)
            raise
        self._end_round(r, rejoin=synced is None)
        if synced is None or r.join is None:
            return False
        # Outside the round: a listener callback that raises leaves the assignment installed (as
        # Kafka's do) and asks for no rejoin.
        self._install(r.join, decode_assignment(synced.assignment), r.topics)
        return True

    def _start_round(self) -> _Round:
        with self._lock:
            if self._pattern is not None:
                self._topics = self._matching_topics()
            # Taken by this round: a rejoin asked for while it is in flight (a new subscription)
            # starts another one after it.
            r = _Round(set(self._topics), self._rejoin_reason or "rejoin")
            self._rejoin_reason = None
            self._stable = False
            self._round = r
        try:
            self._prepare_join()
            r.call = self._send_join(r)
        except BaseException:
            self._end_round(r, rejoin=True)
            raise
        return r

    def wake(self) -> None:
        """End a wait of ``poll`` now (``Consumer.wakeup`` sets the interrupt first)."""
        with self._waits:
            self._waits.notify_all()

    def _wait(self, done: Callable[[], bool], deadline: float) -> None:
        """Until ``done()``, ``deadline`` or a wakeup."""
        with self._waits:
            while not done() and not self._interrupt.is_set():
                remaining = deadline - self.clock()
                if remaining <= 0:
                    return
                self._waits.wait(remaining)

    def _watch(self, call: Any) -> Any:
        """``call`` (a round's grpc future), with its completion waking ``_wait``."""
        call.add_done_callback(lambda _: self.wake())
        return call

    def _end_round(self, r: _Round, *, rejoin: bool) -> None:
        """``r`` is over: its call (if still in flight) cancelled, and, unless it installed an
        assignment or the member is closing, a rejoin asked for with the round's reason."""
        with self._lock:
            if self._round is r:
                self._round = None
        if r.call is not None and not r.call.done():
            r.call.cancel()
        if rejoin:
            self.request_rejoin(r.reason)

    def _send_join(self, r: _Round) -> Any:
        with self._lock:
            owned = set(self._owned) if self.protocol == COOPERATIVE else set()
            gen = self._generation.generation_id
            member_id = self._member_id
        protocols = [group_pb2.GroupProtocol(name=a.name, metadata=encode_subscription(r.topics, owned, gen))
                     for a in self.assignors]
        r.joins += 1
        return self._watch(self.coordinator.send("JoinGroup", group_pb2.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=member_id, protocol_type=PROTOCOL_TYPE,
            protocols=protocols, client_id=self.client_id, reason=r.reason,
            group_instance_id=self.group_instance_id), timeout_ms=self.rebalance_timeout_ms + 10_000))

    def _send_sync(self, join: group_pb2.JoinGroupResponse) -> Any:
        assignments = self._lead(join) if join.leader == join.member_id else {}
        return self._watch(self.coordinator.send("SyncGroup", group_pb2.SyncGroupRequest(
            group_id=self.group_id, generation_id=join.generation_id, member_id=join.member_id,
            protocol_type=PROTOCOL_TYPE, protocol_name=join.protocol_name,
            group_instance_id=self.group_instance_id,
            assignments=[group_pb2.SyncGroupAssignment(member_id=m, assignment=a) for m, a in assignments.items()]),
            timeout_ms=self.rebalance_timeout_ms + 10_000))

    def _on_group_error(self, code: int, message: str, what: str) -> None:
        """Handle an error answer to JoinGroup/SyncGroup/Heartbeat; raise when fatal."""
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            with self._lock:
                if code == ErrorCode.UNKNOWN_MEMBER_ID:
                    self._member_id = ""
                self._generation = NO_GENERATION
                self._lost = bool(self._owned)
                self._rejoin_reason = self._rejoin_reason or f"{what}: {errors.code_name(code)}"
            return
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.request_rejoin(f"{what}: rebalance in progress")
            return
        err = errors.error_for(code, message or what)
        if err.retriable:
            self.coordinator.forget()
        raise err

    def _lead(self, join: group_pb2.JoinGroupResponse) -> dict[str, bytes]:
        """As group leader: compute every member's share with the chosen assignor."""
        assignor = next((a for a in self.assignors if a.name == join.protocol_name), None)
        if assignor is None:
            raise errors.InconsistentGroupProtocolError(f"coordinator chose unknown assignor {join.protocol_name}")
        subs = {m.member_id: decode_subscription(m.metadata) for m in join.members}
        all_topics = sorted({t for s in subs.values() for t in s.topics})
        meta = self.cluster.metadata(all_topics, refresh=True) if all_topics else None
        counts = {t: len(meta.partitions_for(t) or []) for t in all_topics} if meta else {}
        result = assignor.assign(counts, subs)
        log.info("group %s generation %d: leader assigned with %s: %s", self.group_id, join.generation_id,
                 assignor.name, {m: len(ps) for m, ps in result.items()})
        with self._lock:
            self._partition_counts = dict(counts)  # the leader watches every group topic
        return {m: encode_assignment(ps) for m, ps in result.items()}

    def _install(self, join: group_pb2.JoinGroupResponse, assigned: set[TopicPartition], topics: set[str]) -> None:
        with self._lock:
            previous = set(self._owned)
            self._generation = Generation(join.generation_id, join.member_id, join.protocol_name)
            self.rebalances_total += 1
            if join.leader != join.member_id:
                meta = self.cluster.metadata_snapshot()
                self._partition_counts = {t: len(meta.partitions_for(t) or []) for t in topics}
        revoked = previous - assigned
        added = assigned - previous
        log.info("group %s generation %d: member %s owns %d partitions (+%d -%d)", self.group_id,
                 join.generation_id, join.member_id, len(assigned), len(added), len(revoked))
        if revoked:
            # Cooperative: give up only what moved, then rejoin so it can be handed over.
            if self.listener is not None:
                self.listener.on_partitions_revoked(revoked)
            with self._lock:
                self._owned -= revoked
            self.request_rejoin(f"revoked {len(revoked)} partitions")
        with self._lock:
            self._owned |= added
            self._stable = True
        if self.listener is not None:
            self.listener.on_partitions_assigned(added)

    def _maybe_check_metadata(self, timeout_s: float) -> None:
        """Every metadata.max.age.ms: a rejoin if the subscribed topics' partition counts (or the
        pattern's matches) changed. Its refresh takes at most ``timeout_s`` (the poll's); a failed
        one is tried again at the next check."""
        now = self.clock()
        if now - self._last_metadata_check < self.metadata_max_age_ms / 1000:
            return
        budget_ms = as_timeout_ms(timeout_s)
        self._last_metadata_check = now
        with self._lock:
            if not self._stable:
                return
            watched = dict(self._partition_counts)
            pattern = self._pattern
            topics = set(self._topics)
        try:
            if pattern is not None:
                with self._lock:
                    matched = self._matching_topics(budget_ms)
                if matched != topics:
                    self.request_rejoin(f"pattern now matches {sorted(matched)}")
                    return
            meta = self.cluster.metadata(sorted(watched), refresh=True, timeout_ms=budget_ms) if watched else None
        except errors.BrookError as exc:
            log.debug("group %s: metadata check failed: %s", self.group_id, exc)
            return
        for topic, count in watched.items():
            now_count = len(meta.partitions_for(topic) or []) if meta else 0
            if now_count != count:
                self.request_rejoin(f"topic {topic} has {now_count} partitions (was {count})")
                return

    # ------------------------------------------------------------------ heartbeats
    def _start_heartbeat_thread(self) -> None:
        with self._lock:
            if self._heartbeat_thread is not None or self._closed:
                return
            self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                                      name=f"heartbeat-{self.group_id}")
            self._heartbeat_thread.start()

    def _heartbeat_loop(self) -> None:
        interval_s = self.heartbeat_interval_ms / 1000
        wait_s = interval_s
        while not self._stop.wait(wait_s):
            wait_s = interval_s
            with self._lock:
                # Heartbeats go on while a rejoin is asked for and the application has not polled
                # yet (Kafka's consumers do the same): the coordinator waits for the member up to its
                # rebalance timeout instead of expiring its session. They stop once the round starts.
                gen, stable = self._generation, self._stable
            if not stable or not gen.is_valid:
                wait_s = min(interval_s, HEARTBEAT_RETRY_BACKOFF_S * 5)
                continue
            if self.clock() - self._last_poll > self.max_poll_interval_ms / 1000:
                log.warning("group %s: poll() not called for max.poll.interval.ms (%d ms); leaving the group",
                            self.group_id, self.max_poll_interval_ms)
                self._leave("max.poll.interval.ms exceeded")
                with self._lock:
                    self._lost = bool(self._owned)
                    self._rejoin_reason = self._rejoin_reason or "max.poll.interval.ms exceeded"
                continue
            try:
                resp = self.coordinator.call("Heartbeat", group_pb2.HeartbeatRequest(
                    group_id=self.group_id, generation_id=gen.generation_id, member_id=gen.member_id,
                    group_instance_id=self.group_instance_id),
                    timeout_ms=max(1000, self.heartbeat_interval_ms), check=False)
            except errors.BrookError as exc:
                log.debug("group %s: heartbeat failed: %s", self.group_id, exc)
                self.coordinator.forget()
                wait_s = HEARTBEAT_RETRY_BACKOFF_S
                continue
            if resp.error_code == ErrorCode.NONE:
                continue
            with self._lock:
                if self._generation != gen or self._round is not None:
                    continue  # a rejoin started or completed meanwhile: this answer is about the old one
            try:
                self._on_group_error(resp.error_code, resp.error_message, "Heartbeat")
            except errors.BrookError as exc:
                if exc.code == ErrorCode.FENCED_INSTANCE_ID:
                    # Another process runs under our group.instance.id and holds our partitions now: stop, and
                    # make the next poll() raise (Kafka's consumers treat it as fatal too).
                    log.error("group %s: fenced: another consumer joined with group.instance.id %s (%s)",
                              self.group_id, self.group_instance_id, exc.message)
                    with self._lock:
                        self._fenced = exc
                        self._owned = set()
                        self._generation = NO_GENERATION
                    return
                log.debug("group %s: heartbeat: %s", self.group_id, exc)
                wait_s = HEARTBEAT_RETRY_BACKOFF_S

    # ------------------------------------------------------------------ offsets
    def commit_offsets(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int], *,
                       timeout_ms: int | None = None) -> None:
        """Commit as the current generation; CommitFailedError if the group moved on."""
        with self._lock:
            gen = self._generation
        request = offset_commit_request(self.group_id, offsets, generation_id=gen.generation_id,
                                        member_id=gen.member_id)
        if request is None:
            return
        request.group_instance_id = self.group_instance_id

        def attempt(timeout_s: float) -> None:
            resp = self.coordinator.call("OffsetCommit", request, timeout_ms=as_timeout_ms(timeout_s),
                                         check=False)
            code = resp.error_code
            if code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS):
                if code != ErrorCode.REBALANCE_IN_PROGRESS:
                    self._on_group_error(code, resp.error_message, "OffsetCommit")
                else:
                    self.request_rejoin("commit saw a rebalance")
                # Not retriable: the partitions may belong to another member by now.
                raise CommitFailedError(f"commit refused ({errors.code_name(code)}): the group rebalanced; "
                                        f"{resp.error_message}")
            if code != ErrorCode.NONE:
                err = errors.error_for(code, resp.error_message)
                if err.retriable:  # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...: find it again
                    self.coordinator.forget()
                raise err
            for p in resp.partitions:
                errors.raise_for(p.error_code, p.error_message or f"commit {p.topic}-{p.partition}")

        self.cluster.with_retries(attempt, timeout_ms=timeout_ms or self.coordinator.request_timeout_ms)

    def fetch_committed(self, tps: Iterable[TopicPartition] | None = None, *, timeout_ms: int | None = None
                        ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        return self.coordinator.committed(tps, timeout_ms=timeout_ms)

    # ------------------------------------------------------------------ leaving
    def _leave(self, reason: str) -> None:
        with self._lock:
            member_id = self._member_id
            self._generation = NO_GENERATION
            self._member_id = ""
            self._stable = False
        if not member_id:
            return
        if self.group_instance_id:
            # A static member keeps its place for its session (Kafka's consumers do not leave either): a
            # restart in time takes it back without a rebalance. `brook group` admin removal ends it early.
            log.info("group %s: static member %s stops (%s) without leaving the group", self.group_id,
                     self.group_instance_id, reason)
            return
        try:
            self.coordinator.call("LeaveGroup", group_pb2.LeaveGroupRequest(
                group_id=self.group_id, member_ids=[member_id], reason=reason), timeout_ms=5000, check=False)
        except errors.BrookError as exc:
            log.info("group %s: LeaveGroup failed (%s); the session timeout will remove us", self.group_id, exc)

    def close(self, *, leave: bool = True, revoke: bool = True) -> None:
        """Stop heartbeating; revoke what we own (commit point) and leave so the group
        rebalances now instead of after a session timeout."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if (r := self._round) is not None:
            self._end_round(r, rejoin=False)  # closing: no rejoin after it
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=max(1.0, self.heartbeat_interval_ms / 1000 + 1))
        with self._lock:
            owned, self._owned = set(self._owned), set()
        if revoke and owned and self.listener is not None:
            try:
                self.listener.on_partitions_revoked(owned)
            except Exception:  # the consumer is closing: leave anyway
                log.exception("group %s: on_partitions_revoked failed during close", self.group_id)
        if leave:
            self._leave("consumer closed")
