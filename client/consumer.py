"""Consumer: kafka-python shaped, with pipelined fetches and Kafka's offset semantics.

    with Consumer(bootstrap_servers="127.0.0.1:9092", group_id="app", auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("events", 0)])       # or c.subscribe(["events"])
        for tp, records in c.poll(timeout_ms=1000).items():
            for r in records:
                handle(r.offset, r.key, r.value)
        c.commit()

Only committed data (below the high watermark) is ever returned: the broker serves
nothing else to consumers. With ``isolation.level=read_committed`` only what is below the
last stable offset, without the records of aborted transactions (Kafka's read_committed:
the broker names the aborted transactions among the records it returns, and the consumer
drops their batches, ``client.fetcher.AbortedFilter``); resets to latest, ``seek_to_end``,
``end_offsets`` and ``offsets_for_times`` then answer below the last stable offset too.
Transaction markers (control records) are never returned. Positions are "the next offset
to read"; committed offsets have the same meaning. Group membership (``subscribe``) comes from
``client.group_membership``; manual ``assign`` needs no coordinator except for
commits and committed().

With ``enable.auto.commit`` the positions are committed in the background every
``auto.commit.interval.ms``, and synchronously before partitions are revoked in a
rebalance and on ``close()`` (as Kafka's ConsumerCoordinator does), so records that
poll() returned are not handed to the next owner again after a clean rebalance.

Log truncation detection (KIP-320, as Kafka's consumer and librdkafka do it). A position carries the
leader epoch of the record before it (the epoch of the last consumed record's batch, or the one a
committed offset or a ListOffsets answer came with); commits carry it too. Fetches name the leader
epoch the client's metadata has (``current_leader_epoch``): a broker leading at another epoch answers
FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH, and the consumer refreshes its metadata and tries again.
When the metadata shows a new leader epoch for a partition whose position has an epoch (and when
resuming from a committed offset that has one), the partition is not fetched until the leader has
answered OffsetsForLeaderEpoch(the position's epoch) — one request per partition and leader change,
batched per broker, sent without blocking ``poll()``. If that epoch ends below the position in the
leader's log (an unclean leader election replaced the records there), the log was truncated under the
consumer: with ``auto.offset.reset`` earliest or latest it logs a WARNING and resumes from the divergent
offset (the end of the last epoch both logs share), as Kafka does — not from the earliest or latest
offset; with ``none`` every ``poll()`` raises ``LogTruncationError`` (the partition, its position and
the divergent offset) until ``seek()`` moves the partition. A leader that knows no epoch at or below the
position's resets the position by ``auto.offset.reset`` (``none``: ``LogTruncationError`` without a
divergent offset). ``seek(tp, offset)`` gives a position without an epoch, which is never checked;
``seek(tp, OffsetAndMetadata(offset, leader_epoch=e))`` one that is.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import grpc

from client import errors
from client.cluster import REFRESH_CODES, ClusterClient, as_timeout_ms, rpc_error
from client.config import (
    READ_COMMITTED,
    SECURITY_DEFAULTS,
    normalize,
    parse_bool,
    parse_isolation_level,
    require_int,
    security_config,
)
from client.coordinator import GroupCoordinatorClient
from client.fetcher import (
    POSITION_TRUNCATED,
    POSITION_VALID,
    CompletedFetch,
    Fetcher,
    PartitionRecords,
    PartitionState,
    check_position,
)
from client.types import ConsumerRecord, OffsetAndMetadata, TopicPartition
from proto import broker_pb2

log = logging.getLogger(__name__)

CONSUMER_DEFAULTS: dict[str, Any] = {
    "bootstrap_servers": "127.0.0.1:9092",
    "client_id": "brook-consumer",
    "group_id": None,
    # Static membership (KIP-345): a stable name for this consumer in its group. A restart within
    # session.timeout.ms gets the same partitions back without a rebalance; close() does not leave.
    "group_instance_id": None,
    "auto_offset_reset": "latest",
    "isolation_level": "read_uncommitted",  # or read_committed (Kafka's isolation.level)
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "max_poll_records": 500,
    "fetch_min_bytes": 1,
    "fetch_max_wait_ms": 500,
    "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 1048576,
    "session_timeout_ms": 45000,
    "heartbeat_interval_ms": 3000,
    "max_poll_interval_ms": 300000,
    "request_timeout_ms": 30000,
    "retry_backoff_ms": 100,
    "metadata_max_age_ms": 300000,
    "key_deserializer": None,
    "value_deserializer": None,
    "consumer_timeout_ms": None,  # iteration: stop after this long without records (None = forever)
    "partition_assignment_strategy": ("range", "cooperative-sticky"),
    "exclude_internal_topics": True,
    **SECURITY_DEFAULTS,
}
_RESETS = {"earliest": -2, "latest": -1, "none": None}
_RESET_NAMES = {-2: "earliest", -1: "latest", None: "none"}
EARLIEST, LATEST = -2, -1

CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], BaseException | None], Any]


class ConsumerRebalanceListener:
    """Override to act when partitions are taken away (commit here) or handed over (seek here)."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.on_partitions_revoked(lost)


class Consumer:
    def __init__(self, *topics: str, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        cfg = normalize(config, kwargs, CONSUMER_DEFAULTS, what="consumer")
        self.config = cfg
        reset = str(cfg["auto_offset_reset"]).lower()
        if reset not in _RESETS:
            raise errors.InvalidConfigError(f"auto.offset.reset must be earliest, latest or none, got {reset!r}")
        self._reset = _RESETS[reset]
        self.group_id: str | None = cfg["group_id"] or None
        self._auto_commit = parse_bool(cfg, "enable_auto_commit") and self.group_id is not None
        self._auto_commit_s = require_int(cfg, "auto_commit_interval_ms", minimum=1) / 1000
        self._max_poll_records = require_int(cfg, "max_poll_records", minimum=1)
        request_timeout_ms = require_int(cfg, "request_timeout_ms", minimum=1)
        self._retry_backoff_ms = require_int(cfg, "retry_backoff_ms")
        session_timeout_ms = require_int(cfg, "session_timeout_ms", minimum=1)
        heartbeat_ms = require_int(cfg, "heartbeat_interval_ms", minimum=1)
        if heartbeat_ms >= session_timeout_ms:
            raise errors.InvalidConfigError(
                f"heartbeat.interval.ms ({heartbeat_ms}) must be lower than session.timeout.ms ({session_timeout_ms})")
        require_int(cfg, "max_poll_interval_ms", minimum=1)
        self._isolation = parse_isolation_level(cfg["isolation_level"])
        self._key_des = cfg["key_deserializer"]
        self._value_des = cfg["value_deserializer"]
        self.cluster = ClusterClient(cfg["bootstrap_servers"], request_timeout_ms=request_timeout_ms,
                                     security=security_config(cfg),
                                     retry_backoff_ms=self._retry_backoff_ms,
                                     metadata_max_age_ms=require_int(cfg, "metadata_max_age_ms", minimum=1))
        self._fetcher = Fetcher(
            self.cluster,
            fetch_min_bytes=require_int(cfg, "fetch_min_bytes"),
            fetch_max_wait_ms=require_int(cfg, "fetch_max_wait_ms"),
            fetch_max_bytes=require_int(cfg, "fetch_max_bytes", minimum=1),
            max_partition_fetch_bytes=require_int(cfg, "max_partition_fetch_bytes", minimum=1),
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=self._retry_backoff_ms,
            isolation_level=self._isolation,
        )
        self._coordinator = GroupCoordinatorClient(self.cluster, self.group_id) if self.group_id else None
        self._assignment: dict[TopicPartition, PartitionState] = {}
        self._buffered: dict[TopicPartition, PartitionRecords] = {}
        self._subscription: set[str] | None = None
        self._pattern: re.Pattern[str] | None = None
        self._listener: ConsumerRebalanceListener | None = None
        self._membership: Any = None
        self._manual = False
        self._pending_error: BaseException | None = None
        self._next_auto_commit = time.monotonic() + self._auto_commit_s
        self._commit_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._last_async_commit: concurrent.futures.Future[None] | None = None
        self._request_timeout_ms = request_timeout_ms
        self._closing = False
        self._closed = False
        self._wakeup = threading.Event()  # Consumer.wakeup(): the blocked (or next) poll raises WakeupError
        self._iter_buffer: list[ConsumerRecord] = []
        # KIP-320 position checks: per broker, the OffsetsForLeaderEpoch call in flight and
        # {tp: (position, offset epoch, leader epoch)} it checks.
        self._validations: dict[int, tuple[Any, dict[TopicPartition, tuple[int, int, int]]]] = {}
        self._epochs_checked_meta: Any = None  # the metadata snapshot the leader epochs were last compared with
        self._validation_wanted = False  # some position may wait for a check: _validate_positions looks
        self._diverged: set[TopicPartition] = set()  # truncation found under auto.offset.reset=none: raised
        if topics:
            self.subscribe(list(topics))

    # ---- assignment / subscription ----
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manually take these partitions (no group rebalancing); replaces any previous assignment."""
        self._ensure_open()
        if self._subscription is not None or self._pattern is not None:
            raise errors.InvalidRequestError("assign() cannot be mixed with subscribe(); unsubscribe() first")
        wanted = {TopicPartition(*tp) for tp in partitions}
        self._manual = bool(wanted)
        self._set_assignment(wanted)

    def _set_assignment(self, wanted: set[TopicPartition]) -> None:
        for tp in list(self._assignment):
            if tp not in wanted:
                del self._assignment[tp]
                self._buffered.pop(tp, None)
        for tp in wanted:
            self._assignment.setdefault(tp, PartitionState())

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join ``group.id`` for these topics (or every topic matching ``pattern``)."""
        self._ensure_open()
        if self._manual:
            raise errors.InvalidRequestError("subscribe() cannot be mixed with assign(); unsubscribe() first")
        if not self.group_id:
            raise errors.InvalidGroupIdError("subscribe() needs group.id")
        if (topics is None) == (pattern is None):
            raise errors.InvalidRequestError("subscribe() takes topics or pattern, not both")
        if isinstance(topics, str):
            topics = [topics]
        self._subscription = set(topics) if topics is not None else None
        self._pattern = re.compile(pattern) if pattern is not None else None
        self._listener = listener
        self._membership = self._membership or self._make_membership()
        if pattern is not None:
            self._membership.subscribe(pattern=self._pattern)
        else:
            self._membership.subscribe(topics=sorted(self._subscription or ()))

    def _make_membership(self) -> Any:
        from client.group_membership import GroupMembership

        strategy = self.config["partition_assignment_strategy"]
        cfg = self.config
        return GroupMembership(
            self.cluster,
            self.group_id or "",
            listener=_MembershipListener(self),
            assignors=strategy if isinstance(strategy, str) else list(strategy),
            session_timeout_ms=require_int(cfg, "session_timeout_ms", minimum=1),
            heartbeat_interval_ms=require_int(cfg, "heartbeat_interval_ms", minimum=1),
            max_poll_interval_ms=require_int(cfg, "max_poll_interval_ms", minimum=1),
            client_id=str(cfg["client_id"]),
            coordinator=self._coordinator,
            group_instance_id=str(cfg["group_instance_id"] or ""),
            interrupt=self._wakeup,
        )

    def _subscribed_topics(self) -> set[str]:
        if self._pattern is None:
            return set(self._subscription or ())
        meta = self.cluster.metadata()
        internal = self.config["exclude_internal_topics"]
        return {name for name, t in meta.topics.items()
                if self._pattern.fullmatch(name) and not (internal and t.is_internal)}

    def subscription(self) -> set[str]:
        if self._pattern is not None:
            return self._subscribed_topics()
        return set(self._subscription or ())

    def unsubscribe(self) -> None:
        if self._membership is not None:
            self._membership.close(leave=True, revoke=True)
            self._membership = None
        self._subscription = None
        self._pattern = None
        self._manual = False
        self._set_assignment(set())

    # Called by group membership when the coordinator hands out a new assignment.
    def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        if revoked and not self._closing:
            # close() has already committed everything; otherwise this is the last chance
            # to commit these partitions before another member resumes from their commit.
            self._auto_commit_before_revoke(revoked)
        if self._listener is not None and revoked:
            self._listener.on_partitions_revoked(set(revoked))
        for tp in revoked:
            self._assignment.pop(tp, None)
            self._buffered.pop(tp, None)

    def _on_lost(self, lost: set[TopicPartition]) -> None:
        if self._listener is not None and lost:
            self._listener.on_partitions_lost(set(lost))
        for tp in lost:
            self._assignment.pop(tp, None)
            self._buffered.pop(tp, None)

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._assignment.setdefault(tp, PartitionState())
        if self._listener is not None and assigned:
            self._listener.on_partitions_assigned(set(assigned))

    # ---- poll ----
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched since the last poll, per partition; waits up to ``timeout_ms`` for some."""
        limit = max_records or self._max_poll_records
        return self._poll(timeout_ms, lambda: self._drain(limit))

    def poll_batches(self, timeout_ms: int = 0) -> dict[TopicPartition, bytes]:
        """Whole fetched RecordBatch v2 batches per partition, undecoded (for columnar readers).

        Positions move past the last batch returned. The first batch of a partition may
        start before the position it was fetched from (a batch is indivisible): skip
        records with lower offsets when decoding (``storage.record_batch.decode_batch``).
        read_committed: the batches of aborted transactions and the control batches are left
        out (read_uncommitted returns control batches as fetched: skip them when decoding).
        """
        return self._poll(timeout_ms, self._drain_batches)

    def _poll(self, timeout_ms: int, drain: Callable[[], dict[TopicPartition, Any]]) -> dict[TopicPartition, Any]:
        self._ensure_open()
        deadline = time.monotonic() + timeout_ms / 1000
        self._maybe_auto_commit()
        while True:
            self._group_poll(max(0.0, deadline - time.monotonic()))
            self._raise_if_woken()
            self._raise_pending()
            self._update_positions(deadline)
            self._validate_positions(deadline)
            self._raise_truncations()
            self._process_completed()
            self._raise_pending()
            out = drain()
            # Prefetch while the app works; a metadata refresh for it within the poll's time.
            self._fetcher.send_fetches(self._assignment, self._buffered,
                                       timeout_ms=as_timeout_ms(deadline - time.monotonic()))
            self._validate_positions(deadline)  # partitions whose new leader that refresh showed
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {}
            self._fetcher.wait(min(remaining, self._idle_wait_s()))

    def wakeup(self) -> None:
        """Make the ``poll()`` blocked in another thread raise ``WakeupError`` (or the next call of
        ``poll``, ``commit``, ``position`` or ``committed``, when none is blocked): Kafka's
        ``KafkaConsumer.wakeup()``, the one method safe to call from another thread, to end a poll loop
        from a signal handler or a shutdown hook. A poll waiting for records or for the group's
        rebalance returns at once; a lookup it has in flight (coordinator, metadata, offsets) ends
        first, within its timeout. Records already fetched stay for the next poll."""
        self._wakeup.set()
        self._fetcher.notify()
        membership = self._membership
        if membership is not None:
            membership.wake()

    def _raise_if_woken(self) -> None:
        if self._wakeup.is_set():
            self._wakeup.clear()
            raise errors.WakeupError("the consumer was woken up: wakeup() was called")

    def _drain_batches(self) -> dict[TopicPartition, bytes]:
        out: dict[TopicPartition, bytes] = {}
        for tp in list(self._buffered):
            state = self._assignment.get(tp)
            if state is not None and state.paused:
                continue
            part = self._buffered.pop(tp)
            if state is None or state.position is None or state.awaiting_validation or part.index < len(part.current):
                continue  # decoding started (poll() used meanwhile): drop, it is fetched again
            data = part.take_raw(state)
            if data:
                out[tp] = data
        return out

    def _idle_wait_s(self) -> float:
        if self._membership is not None:
            return 0.1  # keep heartbeats and rebalances moving
        return 1.0 if self._fetcher.in_flight else self._retry_backoff_ms / 1000 or 0.01

    def _group_poll(self, timeout_s: float = 0.0) -> None:
        if self._membership is not None:
            self._membership.poll(timeout_s)

    def _drain(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        count = 0
        for tp in list(self._buffered):
            if count >= limit:
                break
            state = self._assignment.get(tp)
            part = self._buffered[tp]
            if state is None or state.position is None or state.awaiting_validation:
                del self._buffered[tp]  # (awaiting: fetched from the previous leader, fetched again)
                continue
            if state.paused:
                continue
            records = part.take(state, limit - count, self._key_des, self._value_des)
            if part.exhausted():
                del self._buffered[tp]
            if records:
                out[tp] = records
                count += len(records)
        return out

    def _process_completed(self) -> None:
        for done in self._fetcher.take_completed():
            self._handle_fetch(done)

    def _handle_fetch(self, done: CompletedFetch) -> None:
        now = time.monotonic()
        backoff_until = now + self._retry_backoff_ms / 1000
        answered: set[TopicPartition] = set()
        if done.response is not None:
            for p in done.response.partitions:
                tp = TopicPartition(p.topic, p.partition)
                answered.add(tp)
                state = self._assignment.get(tp)
                if state is None or not state.in_flight:
                    continue
                state.in_flight = False
                if state.position != done.offsets.get(tp):
                    continue  # seek() since the request: the answer is for an old position
                if state.awaiting_validation or state.fetch_epoch != state.leader_epoch:
                    continue  # sent before a leader change: fetched again once the position is checked
                self._handle_partition(tp, state, p, backoff_until, done.node)
        elif done.error is not None:
            log.debug("fetch from broker %d failed: %s", done.node, done.error)
            self.cluster.request_update()
        for tp in done.offsets:
            state = self._assignment.get(tp)
            if tp not in answered and state is not None:
                # No answer (transport error, or the broker left it out): retry after a backoff.
                state.in_flight = False
                state.backoff_until = backoff_until

    def _handle_partition(self, tp: TopicPartition, state: PartitionState, p: Any, backoff_until: float,
                          node: int = -1) -> None:
        code = p.error_code
        if code == errors.ErrorCode.NONE:
            state.high_watermark = p.high_watermark
            state.log_start_offset = p.log_start_offset
            records = p.records  # each read of a protobuf bytes field is a copy
            if records:
                aborted = p.aborted_transactions if self._isolation == READ_COMMITTED else None
                self._buffered[tp] = PartitionRecords(tp, records, aborted)
            return
        if code == errors.ErrorCode.OFFSET_OUT_OF_RANGE:
            if self._reset is None:
                self._pending_error = errors.NoOffsetForPartitionError(
                    f"offset {state.position} is out of range for {tp.topic}-{tp.partition} "
                    f"and auto.offset.reset=none: {p.error_message}")
            else:
                log.info("offset %s out of range for %s, resetting (%s)", state.position, tp, self._reset)
                state.request_reset(self._reset)
            return
        err = errors.error_for(code, p.error_message)
        if code == errors.ErrorCode.CORRUPT_MESSAGE:
            # The leader found the batch at the position corrupt on its disk, and no other replica can serve it
            # (else it would have given the partition up): raised, as Kafka's consumer raises it, not retried
            # in silence for ever. Retriable for a producer (corrupted in transit), not here.
            self._pending_error = err
            return
        if err.retriable or code in REFRESH_CODES:
            if code in (errors.ErrorCode.FENCED_LEADER_EPOCH, errors.ErrorCode.UNKNOWN_LEADER_EPOCH):
                # KIP-320: the broker leads at another epoch than our metadata says (FENCED: ours is
                # older; UNKNOWN: it has not applied ours yet). Refresh; a new epoch gets the position
                # checked against that leader before the next fetch.
                log.debug("fetch of %s-%d at leader epoch %d from broker %d: %s (%s); refreshing metadata",
                          tp.topic, tp.partition, state.fetch_epoch, node, errors.code_name(code), p.error_message)
            self.cluster.request_update()
            state.backoff_until = backoff_until
            return
        self._pending_error = err

    def _raise_pending(self) -> None:
        if self._pending_error is not None:
            err, self._pending_error = self._pending_error, None
            raise err

    # ---- positions ----
    def _update_positions(self, deadline: float | None = None) -> None:
        """Positions of assigned partitions that have none: the committed offset, else the reset policy.

        With ``deadline`` (a poll's), the lookups take at most until then and a retriable failure
        leaves the positions unknown for the next poll (Kafka's poll(Duration), KIP-266: a poll
        against brokers that cannot answer returns when its timeout says). Without, they take
        up to request.timeout.ms and raise."""
        missing = [tp for tp, st in self._assignment.items() if st.position is None]
        if not missing:
            return
        if deadline is None:
            self._look_up_positions(missing, None)
            return
        try:
            self._look_up_positions(missing, as_timeout_ms(deadline - time.monotonic()))
        except errors.BrookError as exc:
            if not exc.retriable:
                raise
            log.debug("positions of %d partitions not found within the poll: %s", len(missing), exc)

    def _look_up_positions(self, missing: list[TopicPartition], timeout_ms: int | None) -> None:
        to_reset: dict[TopicPartition, int] = {}
        need_committed = []
        for tp in missing:
            st = self._assignment[tp]
            if st.reset_to is not None:
                to_reset[tp] = st.reset_to
            elif self._coordinator is not None:
                need_committed.append(tp)
            elif self._reset is not None:
                to_reset[tp] = self._reset
            else:
                raise errors.NoOffsetForPartitionError(
                    f"no position for {tp.topic}-{tp.partition}: no group.id to read a committed offset "
                    f"from and auto.offset.reset=none")
        if need_committed:
            assert self._coordinator is not None
            for tp, om in self._coordinator.committed(need_committed, timeout_ms=timeout_ms).items():
                if tp not in self._assignment:
                    continue
                if om is not None:
                    # Its leader epoch, if the commit carried one, is checked against the leader first.
                    self._assignment[tp].seek_unvalidated(om.offset, om.leader_epoch)
                    self._validation_wanted = True
                elif self._reset is not None:
                    to_reset[tp] = self._reset
                else:
                    raise errors.NoOffsetForPartitionError(
                        f"no committed offset for {tp.topic}-{tp.partition} in group {self.group_id!r} "
                        f"and auto.offset.reset=none")
        if to_reset:
            found = self.cluster.list_offsets_with_epochs(to_reset, timeout_ms=timeout_ms,
                                                          isolation_level=self._isolation)
            for tp, (offset, _ts, offset_epoch, leader_epoch) in found.items():
                st = self._assignment.get(tp)
                if st is not None and st.position is None:
                    # The leader at `leader_epoch` answered with an offset of its own log: nothing to check.
                    st.seek_validated(offset, offset_epoch)
                    st.leader_epoch = leader_epoch

    # ---- KIP-320: positions checked against a new leader ----
    def _validate_positions(self, deadline: float | None = None) -> None:
        """Check positions against their partitions' leaders where the leader epoch changed (or a committed
        offset with an epoch was taken): take the answers that came, send OffsetsForLeaderEpoch for the
        positions waiting, one request per broker at a time. Never waits for an answer; a metadata
        refresh it needs takes at most what is left until ``deadline``."""
        if self._validations:
            self._complete_validations()
        meta = self.cluster.metadata_snapshot()
        if meta is not self._epochs_checked_meta:
            self._epochs_checked_meta = meta
            self._check_leader_epochs(meta)
        if not (self._validation_wanted or self._fetcher.leader_changed):
            return  # no position waits for a check: no walk of the assignment
        self._fetcher.leader_changed = False
        wanted = False
        now = time.monotonic()
        by_node: dict[int, list[TopicPartition]] = {}
        for tp, st in self._assignment.items():
            if not st.awaiting_validation or st.divergence is not None:
                continue
            wanted = True  # until it is checked: sent now, in flight, or after its backoff
            if st.validating or st.position is None or now < st.backoff_until:
                continue
            try:
                timeout_ms = None if deadline is None else as_timeout_ms(deadline - time.monotonic())
                node, epoch = self.cluster.leader_and_epoch(tp, timeout_ms=timeout_ms)
            except errors.BrookError as exc:
                if not exc.retriable:
                    raise
                self.cluster.request_update()
                st.backoff_until = now + self._retry_backoff_ms / 1000
                continue
            if epoch != st.leader_epoch and not st.on_leader_epoch(epoch):
                continue
            if node not in self._validations:  # else after that broker's answer (it wakes the poll)
                by_node.setdefault(node, []).append(tp)
        self._validation_wanted = wanted
        for node, tps in by_node.items():
            self._send_validation(node, tps)

    def _check_leader_epochs(self, meta: Any) -> None:
        """A new metadata snapshot: partitions whose leader epoch changed are fetched at the new one, after
        their positions are checked against that leader when they have an epoch (their fetched records
        are dropped meanwhile: they are fetched again from the new leader)."""
        for tp, st in self._assignment.items():
            info = meta.topics.get(tp.topic)
            part = info.partitions.get(tp.partition) if info is not None else None
            if part is None or part.leader < 0 or part.leader_epoch == st.leader_epoch:
                continue
            if st.on_leader_epoch(part.leader_epoch):
                self._buffered.pop(tp, None)
                self._validation_wanted = True

    def _send_validation(self, node: int, tps: list[TopicPartition]) -> None:
        context = {}
        for tp in tps:
            st = self._assignment[tp]
            assert st.position is not None and st.offset_epoch is not None
            context[tp] = (st.position, st.offset_epoch, st.leader_epoch)
        request = broker_pb2.OffsetsForLeaderEpochRequest(replica_id=-1, partitions=[
            broker_pb2.OffsetForLeaderPartition(topic=tp.topic, partition=tp.partition, current_leader_epoch=le,
                                                leader_epoch=oe)
            for tp, (_pos, oe, le) in context.items()])
        try:
            call = self.cluster.broker_stub(node).OffsetsForLeaderEpoch.future(
                request, timeout=self._request_timeout_ms / 1000)
        except (errors.BrookError, grpc.RpcError) as exc:
            log.debug("OffsetsForLeaderEpoch to broker %d not sent: %s", node, exc)
            self.cluster.request_update()
            for tp in tps:
                self._assignment[tp].backoff_until = time.monotonic() + self._retry_backoff_ms / 1000
            return
        for tp in tps:
            self._assignment[tp].validating = True
        self._validations[node] = (call, context)
        call.add_done_callback(lambda _call: self._fetcher.notify())  # the poll waiting takes the answer

    def _validation_state(self, tp: TopicPartition, sent: tuple[int, int, int]) -> PartitionState | None:
        """The state of ``tp`` if it still waits for the check that was sent for ``sent``."""
        st = self._assignment.get(tp)
        if (st is None or not st.awaiting_validation or not st.validating
                or (st.position, st.offset_epoch, st.leader_epoch) != sent):
            return None  # seek(), a newer leader, unassigned: the answer is for another position
        return st

    def _complete_validations(self) -> None:
        now = time.monotonic()
        backoff_until = now + self._retry_backoff_ms / 1000
        for node, (call, context) in list(self._validations.items()):
            if not call.done():
                continue
            del self._validations[node]
            failure: errors.BrookError | None = None
            try:
                response = call.result(timeout=0)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # A broker without the call (Kafka's consumer and librdkafka skip the check then too).
                    log.info("broker %d does not serve OffsetsForLeaderEpoch: positions not checked (%s)", node,
                             sorted(context))
                    response = broker_pb2.OffsetsForLeaderEpochResponse(partitions=[
                        broker_pb2.OffsetForLeaderPartitionResult(
                            topic=tp.topic, partition=tp.partition, leader_epoch=oe, end_offset=pos)
                        for tp, (pos, oe, _le) in context.items()])
                else:
                    failure = rpc_error(exc, f"OffsetsForLeaderEpoch to broker {node}")
            except Exception as exc:  # cancelled
                failure = errors.error_for(errors.ErrorCode.NETWORK_EXCEPTION,
                                           f"OffsetsForLeaderEpoch to broker {node}: {exc!r}")
            answered: dict[TopicPartition, Any] = {}
            if failure is None:
                for p in response.partitions:
                    tp = TopicPartition(p.topic, p.partition)
                    if tp in context:
                        answered[tp] = p
            else:
                log.debug("position check failed: %s", failure)
                self.cluster.request_update()
            for tp, sent in context.items():
                st = self._validation_state(tp, sent)
                if st is None:
                    continue
                st.validating = False
                p = answered.get(tp)
                if p is None:  # no answer: tried again after a backoff
                    st.backoff_until = backoff_until
                    continue
                if p.error_code != errors.ErrorCode.NONE:
                    err = errors.error_for(p.error_code, p.error_message)
                    if err.retriable or p.error_code in REFRESH_CODES:
                        # FENCED / UNKNOWN_LEADER_EPOCH, NOT_LEADER: our metadata is behind or ahead of that
                        # broker's; the refreshed metadata's leader and epoch are checked against next.
                        log.debug("position check of %s-%d at broker %d: %s", tp.topic, tp.partition, node, err)
                        self.cluster.request_update()
                        st.backoff_until = backoff_until
                    else:
                        st.backoff_until = backoff_until
                        self._pending_error = err
                    continue
                self._position_checked(tp, st, p.end_offset, p.leader_epoch, node)

    def _position_checked(self, tp: TopicPartition, st: PartitionState, end_offset: int, end_epoch: int,
                          node: int) -> None:
        """Act on the leader's answer for a position (``check_position``), as Kafka's consumer does."""
        assert st.position is not None
        outcome = check_position(st.position, end_offset, end_epoch)
        if outcome == POSITION_VALID:
            log.debug("%s-%d: position %d (leader epoch %s) is in the log of the leader at epoch %d (epoch %d "
                      "ends at %d)", tp.topic, tp.partition, st.position, st.offset_epoch, st.leader_epoch,
                      end_epoch, end_offset)
            st.awaiting_validation = False
            return
        if self._reset is None:
            st.divergence = (end_offset if outcome == POSITION_TRUNCATED else None, end_epoch)
            self._diverged.add(tp)
            return
        self._buffered.pop(tp, None)
        if outcome == POSITION_TRUNCATED:
            log.warning(
                "%s-%d: log truncation detected: position %d (leader epoch %s) is past the end of leader epoch %d "
                "at offset %d on broker %d, the leader at epoch %d: the partition's log was truncated or "
                "replaced from offset %d on (an unclean leader election?), so the records at offsets %d..%d "
                "already read are not in it. Resuming from the divergent offset %d.",
                tp.topic, tp.partition, st.position, st.offset_epoch, end_epoch, end_offset, node, st.leader_epoch,
                end_offset, end_offset, st.position - 1, end_offset)
            st.seek_validated(end_offset, end_epoch)
        else:
            log.warning(
                "%s-%d: log truncation detected: the leader at epoch %d (broker %d) knows no leader epoch at or "
                "below %s, the epoch of position %d; resetting the position (auto.offset.reset=%s).",
                tp.topic, tp.partition, st.leader_epoch, node, st.offset_epoch, st.position,
                _RESET_NAMES[self._reset])
            st.request_reset(self._reset)

    def _raise_truncations(self) -> None:
        """auto.offset.reset=none: raise LogTruncationError while a partition's position is past its
        leader's log (until seek() moves it, or another leader is checked)."""
        if not self._diverged:
            return
        positions: dict[TopicPartition, int] = {}
        divergent: dict[TopicPartition, OffsetAndMetadata] = {}
        parts = []
        for tp in sorted(self._diverged):
            st = self._assignment.get(tp)
            if st is None or st.divergence is None or st.position is None:
                self._diverged.discard(tp)
                continue
            end_offset, end_epoch = st.divergence
            positions[tp] = st.position
            if end_offset is not None:
                divergent[tp] = OffsetAndMetadata(end_offset, "", end_epoch)
                parts.append(f"{tp.topic}-{tp.partition}: position {st.position} (leader epoch {st.offset_epoch}) "
                             f"is past offset {end_offset}, where leader epoch {end_epoch} ends in the log of "
                             f"the leader at epoch {st.leader_epoch}: divergent offset {end_offset}")
            else:
                parts.append(f"{tp.topic}-{tp.partition}: the leader at epoch {st.leader_epoch} knows no leader "
                             f"epoch at or below {st.offset_epoch}, the epoch of position {st.position}")
        if not positions:
            return
        raise errors.LogTruncationError(
            "log truncation detected (records the consumer read were replaced, e.g. by an unclean leader "
            "election) and auto.offset.reset=none: " + "; ".join(parts)
            + ". seek() these partitions to go on (e.g. to the divergent offset).", positions, divergent)

    def _state(self, tp: TopicPartition) -> PartitionState:
        state = self._assignment.get(TopicPartition(*tp))
        if state is None:
            raise errors.InvalidRequestError(f"{tp} is not assigned to this consumer")
        return state

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record poll() will return for ``tp`` (resolved now if unknown)."""
        state = self._state(tp)
        if state.position is None:
            self._raise_if_woken()
            self._update_positions()
        assert state.position is not None
        return state.position

    def seek(self, tp: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        """Fetch ``tp`` from ``offset`` on. An ``OffsetAndMetadata`` with a ``leader_epoch`` (the epoch of
        the record before the offset, e.g. from ``committed()`` or a ``LogTruncationError``) is checked
        against the partition's leader before fetching, as a committed offset is (KIP-320); a plain
        offset is not checked."""
        epoch = offset.leader_epoch if isinstance(offset, OffsetAndMetadata) else None
        offset = offset.offset if isinstance(offset, OffsetAndMetadata) else offset
        if offset < 0:
            raise errors.InvalidRequestError(f"seek offset must be >= 0, got {offset}")
        state = self._state(tp)
        if epoch is None:
            state.seek_validated(offset)
        else:
            state.seek_unvalidated(offset, epoch)
            self._validation_wanted = True
        self._buffered.pop(TopicPartition(*tp), None)

    def _seek_reset(self, tps: Iterable[TopicPartition] | None, target: int) -> None:
        for tp in (tps if tps else list(self._assignment)):
            state = self._state(tp)
            state.request_reset(target)
            self._buffered.pop(TopicPartition(*tp), None)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset (evaluated at the next poll() or position())."""
        self._seek_reset(partitions, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the high watermark, read_committed: the last stable offset (evaluated at the next poll() or
        position())."""
        self._seek_reset(partitions, LATEST)

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state(tp).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self._assignment.items() if st.paused}

    def highwater(self, tp: TopicPartition) -> int | None:
        """The high watermark seen in the last fetch of ``tp`` (None before one)."""
        hw = self._state(tp).high_watermark
        return hw if hw >= 0 else None

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self.cluster.list_offsets(dict.fromkeys(partitions, EARLIEST)).items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The latest offsets: high watermarks (read_committed: last stable offsets)."""
        found = self.cluster.list_offsets(dict.fromkeys(partitions, LATEST), isolation_level=self._isolation)
        return {tp: o for tp, (o, _) in found.items()}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        """{tp: ms} -> {tp: (offset, timestamp)} of the first record at or after it (None if none)."""
        found = self.cluster.list_offsets(timestamps, isolation_level=self._isolation)
        return {tp: (o, ts) if o >= 0 else None for tp, (o, ts) in found.items()}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(self.cluster.partitions_for(topic))

    def topics(self) -> set[str]:
        return set(self.cluster.metadata(refresh=True).topics)

    # ---- commits ----
    def _current_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The positions to commit, with their leader epochs (KIP-320). A position still to be checked
        against a new leader is left out, as Kafka leaves it: it may be past a truncated log."""
        return {tp: OffsetAndMetadata(st.position, "", st.offset_epoch) for tp, st in self._assignment.items()
                if st.position is not None and not st.awaiting_validation}

    def _commit_now(self, offsets: dict[TopicPartition, OffsetAndMetadata | int], timeout_ms: int | None) -> None:
        if self._membership is not None:
            # Generation-fenced: CommitFailedError if the group moved on (partitions may be elsewhere now).
            self._membership.commit_offsets(offsets, timeout_ms=timeout_ms)
        else:
            assert self._coordinator is not None
            self._coordinator.commit(offsets, generation_id=-1, member_id="", timeout_ms=timeout_ms)

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
               timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` (default: the current positions) and wait for the coordinator's answer."""
        self._ensure_open()
        self._raise_if_woken()
        if self._coordinator is None:
            raise errors.InvalidGroupIdError("commit() needs group.id")
        chosen = self._current_offsets() if offsets is None else dict(offsets)
        self._commit_now(chosen, timeout_ms)

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
                     callback: CommitCallback | None = None) -> concurrent.futures.Future[None]:
        """Commit in the background; ``callback(offsets, error_or_None)`` runs when it is done."""
        self._ensure_open()
        if self._coordinator is None:
            raise errors.InvalidGroupIdError("commit_async() needs group.id")
        chosen = self._current_offsets() if offsets is None else dict(offsets)
        if self._commit_executor is None:
            # One worker: commits are applied in the order they were asked for.
            self._commit_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="brook-commit")

        def run() -> None:
            try:
                self._commit_now(chosen, None)
            except BaseException as exc:
                if callback is not None:
                    callback(chosen, exc)
                raise
            if callback is not None:
                callback(chosen, None)

        future = self._commit_executor.submit(run)
        self._last_async_commit = future
        return future

    def _wait_for_async_commits(self, timeout_ms: int) -> None:
        """Let queued async commits land first: one finishing after a later synchronous commit
        would move the committed offset back and records would be processed twice."""
        pending = self._last_async_commit
        if pending is None:
            return
        # One worker runs them in order, so the last one done means all are done.
        done, _ = concurrent.futures.wait([pending], timeout=timeout_ms / 1000)
        if not done:
            log.warning("async commits still running after %d ms; committing anyway", timeout_ms)

    def committed(self, partitions: TopicPartition | Iterable[TopicPartition], timeout_ms: int | None = None
                  ) -> OffsetAndMetadata | None | dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of one partition (None if none), or a dict for several."""
        self._raise_if_woken()
        if self._coordinator is None:
            raise errors.InvalidGroupIdError("committed() needs group.id")
        if isinstance(partitions, TopicPartition):
            return self._coordinator.committed([partitions], timeout_ms=timeout_ms).get(partitions)
        return self._coordinator.committed(list(partitions), timeout_ms=timeout_ms)

    def _auto_commit_before_revoke(self, revoked: set[TopicPartition]) -> None:
        """enable.auto.commit: commit the positions of ``revoked`` synchronously before they go
        (Kafka's ConsumerCoordinator commits in onJoinPrepare), so their next owner starts
        right after the last record poll() returned here. A refused commit (the group moved
        on) is logged: the partitions are gone either way, as in Kafka."""
        if not self._auto_commit:
            return
        offsets = {tp: om for tp, om in self._current_offsets().items() if tp in revoked}
        if not offsets:
            return
        self._wait_for_async_commits(self._request_timeout_ms)
        try:
            self._commit_now(offsets, self._request_timeout_ms)
        except errors.BrookError as exc:
            log.warning("auto commit of %d revoked partition(s) failed: %s", len(offsets), exc)
            return
        self._next_auto_commit = time.monotonic() + self._auto_commit_s
        log.debug("auto-committed %d partition(s) before revocation", len(offsets))

    def _maybe_auto_commit(self) -> None:
        if not self._auto_commit or time.monotonic() < self._next_auto_commit:
            return
        self._next_auto_commit = time.monotonic() + self._auto_commit_s
        offsets = self._current_offsets()
        if offsets:
            self.commit_async(offsets, callback=_log_auto_commit_failure)

    # ---- iteration / lifecycle ----
    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        if not self._iter_buffer:
            limit_ms = self.config["consumer_timeout_ms"]
            deadline = None if limit_ms is None else time.monotonic() + int(limit_ms) / 1000
            while not self._iter_buffer:
                remaining = 1000 if deadline is None else int((deadline - time.monotonic()) * 1000)
                if remaining <= 0:
                    raise StopIteration
                for records in self.poll(timeout_ms=min(remaining, 1000)).values():
                    self._iter_buffer.extend(records)
            self._iter_buffer.reverse()
        return self._iter_buffer.pop()

    def _ensure_open(self) -> None:
        if self._closed:
            raise errors.ConsumerClosedError("consumer is closed")

    def close(self, autocommit: bool = True, timeout_ms: int = 30000) -> None:
        """Commit (if auto commit is on), leave the group, stop fetching and release connections."""
        if self._closed:
            return
        self._wakeup.clear()  # as Kafka's close(): a wakeup meant for the poll loop does not stop the close
        try:
            if autocommit and self._auto_commit and self._current_offsets():
                self._wait_for_async_commits(timeout_ms)
                try:
                    self.commit(timeout_ms=timeout_ms)
                except errors.BrookError as exc:
                    log.warning("final auto commit failed: %s", exc)
            # Everything was committed just above (or the caller asked for no commit): the
            # revocation in membership.close() must not commit again.
            self._closing = True
            if self._membership is not None:
                self._membership.close(leave=True, revoke=True)
        finally:
            self._closed = True
            for call, _context in self._validations.values():
                call.cancel()
            self._validations.clear()
            self._fetcher.close()
            if self._commit_executor is not None:
                self._commit_executor.shutdown(wait=True)
            self.cluster.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MembershipListener:
    """Keeps the consumer's assignment in step with the group, around the user's listener."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.consumer._on_revoked(revoked)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.consumer._on_assigned(assigned)

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.consumer._on_lost(lost)


def _log_auto_commit_failure(offsets: dict[TopicPartition, OffsetAndMetadata], exc: BaseException | None) -> None:
    if exc is not None:
        log.warning("auto commit of %d partition(s) failed: %s", len(offsets), exc)
