"""The transaction coordinator: Kafka's transactional producer APIs on top of ``__transaction_state``.

The coordinator of a transactional id is the leader of partition ``partition_for(id)`` of the compacted
internal topic ``__transaction_state`` (made on the first FindCoordinator for a transaction, as Kafka
makes it). Its state is ``TransactionCoordinatorState`` (broker/txn_state.py), a pure state machine:
this module gives it what it lacks, as Kafka's TransactionStateManager and TransactionMarkerChannelManager
do:

- **loading**: a broker that becomes leader of a partition replays it (every record, up to the log end)
  before answering for its ids (COORDINATOR_LOAD_IN_PROGRESS meanwhile); one that stops leading it forgets
  them (NOT_COORDINATOR). A transaction the load finds half-ended (PrepareCommit/PrepareAbort) gets its
  markers written again;
- **writes**: every transition is appended with acks=all to the partition, and applied in memory only once
  the in-sync replicas have it (a failed write is undone; the client retries). So the next coordinator
  loads exactly the state this one answered from;
- **markers**: once a transaction is PrepareCommit or PrepareAbort, a COMMIT or ABORT control batch is
  written to every partition it touched, on each partition's leader (``write_markers``: this broker's
  replica manager, or another broker's WriteTxnMarkers), retried until every one is written or the
  coordinator moved; then CompleteCommit/CompleteAbort is written. The markers carry the partition's
  leader epoch as the coordinator epoch, so a deposed coordinator's late markers are refused by the logs.
  Each partition leader has its own senders (``MARKER_LANE_THREADS``), as Kafka's
  TransactionMarkerChannelManager has a queue per broker: a leader that does not answer (frozen, or cut
  off) holds only the transactions that touched it, and transactions complete concurrently;
- **timers**: an Ongoing transaction older than its timeout is aborted with the producer's epoch bumped
  (the producer is fenced), every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``; idle
  transactional ids go after ``transactional.id.expiration.ms``.

The request methods block (a log write and its replication): callers run them on worker threads.
"""

from __future__ import annotations

import concurrent.futures
import functools
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker import txn_records as rec
from broker import txn_state as ts
from broker.group_records import partition_for_group
from broker.internal_topics import InternalTopic, int_setting
from broker.txn_state import TxnError
from client.types import TopicPartition
from proto import errors
from storage.record_batch import RecordBatchBuilder, decode_batch, iter_batches

log = logging.getLogger(__name__)

TOPIC = rec.TRANSACTION_STATE_TOPIC
LOAD_READ_BYTES = 4 * 1024 * 1024
LOAD_BATCHES_MAX = 10_000_000
MARKER_RETRY_S = 0.2  # a marker that could not be written is tried again after this, doubling to the cap
MARKER_RETRY_MAX_S = 5.0
# How often deliveries waiting out a backoff are checked for a partition whose leader moved. Without it, a
# transaction whose partition leader died waited out its backoff (up to 5 s) after the new leader was there: a
# 10 s stretch without a commit in make chaos-txn (seed 1), the controller and that leader killed together.
LEADER_CHECK_S = 0.25
# Marker requests in flight to one partition leader at once. They were all written by one thread, one
# transaction after another: a frozen leader held every transaction of the coordinator, a request timeout (5 s)
# per transaction and attempt, and a coordinator completed about as many transactions a second as one thread
# could wait out acks=all round trips for.
MARKER_LANE_THREADS = 4
COMPLETE_THREADS = 4  # CompleteCommit/CompleteAbort records being written at once (acks=all each)
COMPLETION_WAITERS_MAX = 10_000  # requests waiting for a transaction's end (when_completed), all ids together
TICK_S = 0.5


@dataclass(frozen=True)
class TxnConfig:
    """Kafka's keys and defaults."""

    num_partitions: int = 50  # transaction.state.log.num.partitions
    replication_factor: int = 3  # transaction.state.log.replication.factor
    min_isr: int = 2  # transaction.state.log.min.isr
    segment_bytes: int = 100 * 1024 * 1024  # transaction.state.log.segment.bytes
    max_timeout_ms: int = ts.DEFAULT_MAX_TIMEOUT_MS  # transaction.max.timeout.ms
    id_expiration_ms: int = ts.DEFAULT_ID_EXPIRATION_MS  # transactional.id.expiration.ms
    abort_interval_ms: int = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    id_expiry_interval_ms: int = 3_600_000  # transaction.remove.expired.transaction.cleanup.interval.ms
    write_timeout_ms: int = 5_000  # an append's wait for the in-sync replicas (offsets.commit.timeout.ms's role)

    @classmethod
    def from_defaults(cls, defaults: dict[str, str]) -> TxnConfig:
        def get(key: str, fallback: int) -> int:
            return int_setting(defaults, key, fallback)

        b = cls()
        return cls(
            num_partitions=get("transaction.state.log.num.partitions", b.num_partitions),
            replication_factor=get("transaction.state.log.replication.factor", b.replication_factor),
            min_isr=get("transaction.state.log.min.isr", b.min_isr),
            segment_bytes=get("transaction.state.log.segment.bytes", b.segment_bytes),
            max_timeout_ms=get("transaction.max.timeout.ms", b.max_timeout_ms),
            id_expiration_ms=get("transactional.id.expiration.ms", b.id_expiration_ms),
            abort_interval_ms=get("transaction.abort.timed.out.transaction.cleanup.interval.ms", b.abort_interval_ms),
            id_expiry_interval_ms=get("transaction.remove.expired.transaction.cleanup.interval.ms",
                                      b.id_expiry_interval_ms),
        )


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """Markers of one transaction for the partitions one broker leads (Kafka's WritableTxnMarker)."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]


# (leader node id, request) -> error code per partition; raises for a broker that could not be reached.
MarkerWriter = Callable[[int, MarkerRequest], dict[TopicPartition, int]]

# Answers of a partition leader that end a marker's retries: written, or nothing left to mark.
_MARKER_DONE = frozenset({0, 3})  # NONE; UNKNOWN_TOPIC_OR_PARTITION (the topic is gone: Kafka drops it too)


@dataclass(slots=True)
class _Delivery:
    """A transaction's markers being written: the partitions still to do."""

    markers: ts.PendingMarkers
    txn_partition: int
    coordinator_epoch: int
    left: set[TopicPartition]
    attempts: int = 0
    # The leader each partition still to mark was last sent to (or -1: it had none): a delivery waiting out its
    # backoff is tried at once when one of them has another leader now (``_retry_moved_locked``).
    tried: dict[TopicPartition, int] = field(default_factory=dict)


class TransactionCoordinator:
    def __init__(self, *, node_id: int, replica_manager: Any, metadata_cache: Any, config: TxnConfig,
                 new_producer_id: Callable[[], int], write_markers: MarkerWriter,
                 offsets_partitions: int = 50, clock_ms: Callable[[], int] | None = None) -> None:
        self.node_id = node_id
        self.replica_manager = replica_manager
        self.metadata_cache = metadata_cache
        self.config = config
        self._new_producer_id = new_producer_id
        self._write_markers = write_markers
        self._offsets_partitions = offsets_partitions
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.RLock()
        self.state = ts.TransactionCoordinatorState(config.num_partitions, max_timeout_ms=config.max_timeout_ms,
                                                    id_expiration_ms=config.id_expiration_ms)
        self._epochs: dict[int, int] = {}  # partition -> leader epoch it is owned (loaded or loading) at
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="txn-loader")
        self._stop = threading.Event()
        self._wake = threading.Condition(self._lock)
        # Markers to write, by when to try: (due monotonic, seq, delivery). One delivery per transaction in
        # Prepare*, so bounded by the transactional ids this coordinator holds.
        self._deliveries: list[tuple[float, int, _Delivery]] = []
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._lanes: dict[int, concurrent.futures.ThreadPoolExecutor] = {}  # partition leader -> its senders
        # transactional id -> callbacks of requests waiting for its transaction in Prepare* to end (when_completed)
        self._completion_waiters: dict[str, list[Callable[[], None]]] = {}
        self._waiting = 0
        self._completer = concurrent.futures.ThreadPoolExecutor(COMPLETE_THREADS, thread_name_prefix="txn-complete")
        self.topic = InternalTopic(
            TOPIC, metadata_cache, replica_manager, partitions=config.num_partitions,
            replication_factor=config.replication_factor, partitions_key="transaction.state.log.num.partitions",
            configs=lambda rf: {"cleanup.policy": "compact", "segment.bytes": str(config.segment_bytes),
                                "min.insync.replicas": str(max(1, min(config.min_isr, rf))),
                                "compression.type": "producer"})
        self.calls: BrokerCalls | None = None  # install() sets the broker's (closed at stop)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.replica_manager.add_leadership_listener(self.on_leadership_change)
        for name, target in (("txn-markers", self._run_markers), ("txn-timers", self._run_timers)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            self._wake.notify_all()
        for t in self._threads:
            t.join(timeout=5)
        self._loader.shutdown(wait=False, cancel_futures=True)
        self._release_waiters(None)
        with self._lock:
            pools = [*self._lanes.values(), self._completer]
        for pool in pools:  # a sender waiting on a leader ends with its request's timeout
            pool.shutdown(wait=False, cancel_futures=True)
        if self.calls is not None:
            self.calls.close()

    # ------------------------------------------------------------------ leadership and loading
    def on_leadership_change(self, topic: str, partition: int, is_leader: bool, leader_epoch: int) -> None:
        if topic != TOPIC or not 0 <= partition < self.config.num_partitions:
            return
        with self._lock:
            if is_leader:
                if self._epochs.get(partition) == leader_epoch:
                    return
                self._epochs[partition] = leader_epoch
                self.state.begin_load(partition)
                self._drop_deliveries_locked(partition)
            else:
                if self._epochs.pop(partition, None) is None:
                    return
                self.state.unload(partition)
                self._drop_deliveries_locked(partition)
                log.info("unloaded transactions of %s-%d", TOPIC, partition)
        self._release_waiters(partition)  # they ask again: NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS
        if not is_leader:
            return
        if self._stop.is_set():
            return
        log.info("loading transactions of %s-%d (leader epoch %d)", TOPIC, partition, leader_epoch)
        try:
            self._loader.submit(self._load, partition, leader_epoch)
        except RuntimeError:
            log.debug("loader stopped; not loading %s-%d", TOPIC, partition)

    def _drop_deliveries_locked(self, partition: int) -> None:
        self._deliveries = [d for d in self._deliveries if d[2].txn_partition != partition]
        heapq.heapify(self._deliveries)

    def _owned_at(self, partition: int, leader_epoch: int) -> bool:
        return self._epochs.get(partition) == leader_epoch

    def _load(self, partition: int, leader_epoch: int) -> None:
        """Replay the partition up to the log end it had (the leader's log is authoritative), then serve it."""
        hosted = self.replica_manager.partition(TOPIC, partition)
        if hosted is None or not hosted.is_leader:
            return
        lg = hosted.log
        offset, target = lg.log_start_offset, lg.log_end_offset
        loaded = skipped = 0
        try:
            for _ in range(LOAD_BATCHES_MAX):
                if offset >= target:
                    break
                try:
                    data = lg.read(offset, LOAD_READ_BYTES, max_offset=target)
                except errors.OffsetOutOfRangeError:
                    offset = lg.log_start_offset
                    continue
                if not data.records:
                    break
                with self._lock:
                    if self._stop.is_set() or not self._owned_at(partition, leader_epoch):
                        return
                    for pos, header in iter_batches(data.records):
                        offset = header.next_offset
                        if header.is_control:
                            continue
                        for r in decode_batch(data.records, pos)[1]:
                            try:
                                self.state.load(r.key, r.value)
                                loaded += 1
                            except rec.TxnRecordError as exc:
                                skipped += 1
                                log.warning("%s-%d offset %d: skipping a record: %s", TOPIC, partition, r.offset, exc)
        except errors.BrookError as exc:
            log.warning("loading %s-%d failed: %s; the partition's leadership moves away", TOPIC, partition, exc)
            self.replica_manager.log_manager.dir_failed(lg.dir, exc)
            return
        with self._lock:
            if not self._owned_at(partition, leader_epoch):
                return
            pending = self.state.finish_load(partition)
            for markers in pending:
                self._deliver_locked(markers, partition)
        log.info("loaded %s-%d: %d records (%d skipped), %d transactions to finish", TOPIC, partition, loaded,
                 skipped, len(pending))

    # ------------------------------------------------------------------ FindCoordinator
    def partition_for(self, transactional_id: str) -> int:
        return self.state.partition_for(transactional_id)

    def find_coordinator(self, transactional_id: str, listener: str = "BROKER") -> tuple[int, str, int]:
        """The coordinator's (node id, host, port) on ``listener``; raises COORDINATOR_NOT_AVAILABLE (retriable)
        while the topic is made or the partition has no leader."""
        if not transactional_id:
            raise errors.error_for(TxnError.INVALID_REQUEST, "a transactional id must not be empty")
        p = self.partition_for(transactional_id)
        return self.topic.coordinator(p, f"transactional id {transactional_id}", listener)

    # ------------------------------------------------------------------ requests (blocking)
    def init_producer_id(self, transactional_id: str, timeout_ms: int,
                         expected: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """(error, producer id, epoch) for InitProducerId with a transactional id."""
        with self._lock:
            try:
                t = self.state.init_producer_id(transactional_id, timeout_ms, self.clock_ms(),
                                                self._new_producer_id, expected)
            except errors.BrookError as exc:  # no producer id block at hand (the controller unreachable)
                log.info("no producer id for transactional id %r: %s", transactional_id[:100], exc)
                return TxnError.COORDINATOR_NOT_AVAILABLE, -1, -1
        if not isinstance(t, ts.Transition):
            return int(t), -1, -1
        done = self._write(t)
        if isinstance(done, int):
            return done, -1, -1
        if done.error:
            return int(done.error), -1, -1
        return TxnError.NONE, done.producer_id, done.producer_epoch

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition]) -> int:
        with self._lock:
            t = self.state.add_partitions(transactional_id, producer_id, producer_epoch,
                                          [(tp.topic, tp.partition) for tp in partitions], self.clock_ms())
        return self._finish(t)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> int:
        p = partition_for_group(group_id, self._offsets_partitions)
        with self._lock:
            t = self.state.add_offsets(transactional_id, producer_id, producer_epoch, p, self.clock_ms())
        return self._finish(t)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        """EndTxn: answered once PrepareCommit/PrepareAbort is written (the markers follow), as Kafka does."""
        with self._lock:
            t = self.state.end_txn(transactional_id, producer_id, producer_epoch, commit, self.clock_ms())
        return self._finish(t)

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        """Is ``tp`` in the ongoing transaction of this producer (KIP-890's verification, asked by a partition
        leader before the transaction's first batch there)? NONE, or the reason it is not."""
        with self._lock:
            d = self.state.describe(transactional_id)
        if isinstance(d, TxnError):
            return int(d) if d != TxnError.TRANSACTIONAL_ID_NOT_FOUND else TxnError.INVALID_PRODUCER_ID_MAPPING
        if d.producer_id != producer_id:
            return TxnError.INVALID_PRODUCER_ID_MAPPING
        if d.producer_epoch != producer_epoch:
            return TxnError.PRODUCER_FENCED
        if d.state != ts.TransactionState.ONGOING or tp.partition not in dict(d.topics).get(tp.topic, ()):
            return TxnError.INVALID_TXN_STATE
        return TxnError.NONE

    def describe(self, transactional_id: str) -> ts.TxnDescription | TxnError:
        with self._lock:
            return self.state.describe(transactional_id)

    def list_transactions(self, states: Iterable[str], producer_ids: Iterable[int],
                          duration_filter_ms: int = -1) -> ts.TxnListing:
        with self._lock:
            return self.state.list_transactions(states, producer_ids, duration_filter_ms=duration_filter_ms,
                                                now_ms=self.clock_ms())

    def _finish(self, t: ts.Transition | TxnError) -> int:
        if not isinstance(t, ts.Transition):
            return int(t)
        done = self._write(t)
        return done if isinstance(done, int) else int(done.error)

    def _write(self, t: ts.Transition) -> ts.Completed | int:
        """Append the transition's record with acks=all; apply it (and send its markers) or undo it."""
        builder = RecordBatchBuilder()
        builder.append(self.clock_ms(), t.key, t.value)
        try:
            fut = self.replica_manager.append_records(TOPIC, t.partition, builder.build(), acks=-1,
                                                      timeout_ms=self.config.write_timeout_ms)
            fut.result(timeout=self.config.write_timeout_ms / 1000 + 5)
        except errors.BrookError as exc:
            with self._lock:
                self.state.abort(t)
            log.info("writing %s of transactional id %r failed: %s", t.kind, t.transactional_id[:100], exc)
            return ts.append_error(exc.code)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self.state.abort(t)
            return TxnError.COORDINATOR_NOT_AVAILABLE
        with self._lock:
            done = self.state.complete(t)
            if done.markers is not None:
                self._deliver_locked(done.markers, t.partition)
        return done

    # ------------------------------------------------------------------ markers
    def _deliver_locked(self, markers: ts.PendingMarkers, partition: int) -> None:
        epoch = self._epochs.get(partition)
        if epoch is None:
            return  # unloaded meanwhile: the next coordinator sends them after its load
        d = _Delivery(markers, partition, epoch, set(markers.partitions))
        self._schedule_locked(d, 0.0)

    def _schedule_locked(self, d: _Delivery, delay_s: float) -> None:
        self._seq += 1
        heapq.heappush(self._deliveries, (time.monotonic() + delay_s, self._seq, d))
        self._wake.notify_all()

    def _run_markers(self) -> None:
        """Hands each due delivery to the senders of the partition leaders it needs, and never waits on one."""
        checked = time.monotonic()
        while True:
            with self._lock:
                while not self._stop.is_set():
                    now = time.monotonic()
                    if self._deliveries and now - checked >= LEADER_CHECK_S:
                        checked = now
                        self._retry_moved_locked(now)
                    wait = self._deliveries[0][0] - now if self._deliveries else None
                    if wait is not None and wait <= 0:
                        break
                    self._wake.wait(timeout=None if wait is None else min(wait, LEADER_CHECK_S))
                if self._stop.is_set():
                    return
                _, _, d = heapq.heappop(self._deliveries)
                if not self._owned_at(d.txn_partition, d.coordinator_epoch):
                    continue
            try:
                self._attempt(d)
            except Exception:  # noqa: BLE001 - the delivery is retried; the thread must go on
                log.exception("writing the markers of transactional id %r failed", d.markers.transactional_id[:100])
                self._attempted(d)

    def _retry_moved_locked(self, now: float) -> None:
        """Make due now every delivery waiting out a backoff one of whose partitions has another leader than the
        one its last attempt went to (or has one again): Kafka's marker channel re-queues markers on a metadata
        update the same way."""
        moved = False
        for i, (due, seq, d) in enumerate(self._deliveries):
            if due <= now or not d.tried:
                continue
            for tp, leader in d.tried.items():
                info = self.metadata_cache.partition(tp.topic, tp.partition)
                if info is not None and info.leader >= 0 and info.leader != leader:
                    self._deliveries[i] = (now, seq, d)
                    moved = True
                    break
        if moved:
            heapq.heapify(self._deliveries)

    def _lane(self, leader: int) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            lane = self._lanes.get(leader)
            if lane is None:
                if self._stop.is_set():
                    raise RuntimeError("the coordinator is stopped")
                lane = concurrent.futures.ThreadPoolExecutor(MARKER_LANE_THREADS,
                                                             thread_name_prefix=f"txn-markers-{leader}")
                self._lanes[leader] = lane  # one per broker that leads a partition of a transaction
            return lane

    def _attempt(self, d: _Delivery) -> None:
        """One attempt at every partition still to mark: a request to each leader on that leader's senders.
        When every answer is in, ``d.left`` holds the partitions not done, and ``_attempted`` goes on. At most
        one attempt of a delivery is under way: the next one is scheduled by this one's end."""
        m = d.markers
        by_leader: dict[int, list[TopicPartition]] = {}
        d.tried = {}
        for tp in sorted(d.left):
            info = self.metadata_cache.partition(tp.topic, tp.partition)
            if info is None:
                d.left.discard(tp)  # deleted: no marker needed (Kafka drops it too)
                continue
            d.tried[tp] = info.leader
            if info.leader >= 0:
                by_leader.setdefault(info.leader, []).append(tp)
        if not by_leader:  # every partition done or gone, or none has a leader now
            self._attempted(d)
            return
        answered = threading.Lock()
        waiting = [len(by_leader)]

        def on_answer(leader: int, tps: list[TopicPartition], fut: concurrent.futures.Future) -> None:
            try:
                answers = fut.result()
            except concurrent.futures.CancelledError:
                return  # stopped
            except Exception as exc:  # noqa: BLE001 - an unreachable leader: retried
                log.info("markers for transactional id %r to broker %d: %s", m.transactional_id[:100], leader, exc)
                answers = {}
            with answered:
                for tp in tps:
                    code = answers.get(tp, TxnError.UNKNOWN_SERVER_ERROR)
                    if code in _MARKER_DONE:
                        d.left.discard(tp)
                    elif d.attempts in (3, 30):
                        log.warning("writing the %s marker of transactional id %r to %s-%d: error %d; retrying",
                                    "COMMIT" if m.commit else "ABORT", m.transactional_id[:100], tp.topic,
                                    tp.partition, code)
                waiting[0] -= 1
                last = waiting[0] == 0
            if last:
                self._attempted(d)

        for leader, tps in by_leader.items():
            req = MarkerRequest(m.producer_id, m.producer_epoch, m.commit, d.coordinator_epoch, tuple(tps))
            try:
                fut = self._lane(leader).submit(self._write_markers, leader, req)
            except RuntimeError:
                return  # stopped
            fut.add_done_callback(functools.partial(on_answer, leader, tps))

    def _attempted(self, d: _Delivery) -> None:
        """An attempt ended: try again later what is left, or write the transaction's Complete* record."""
        if d.left:
            d.attempts += 1
            with self._lock:
                if self._owned_at(d.txn_partition, d.coordinator_epoch):
                    self._schedule_locked(d, min(MARKER_RETRY_MAX_S, MARKER_RETRY_S * 2 ** min(d.attempts, 8)))
            return
        try:
            self._completer.submit(self._complete_logged, d)
        except RuntimeError:
            pass  # stopped: the next coordinator finds the transaction in Prepare* and writes it

    def _complete_logged(self, d: _Delivery) -> None:
        try:
            self._complete_delivery(d)
        except Exception:  # noqa: BLE001 - retried after a while, as a failed write is
            log.exception("completing transactional id %r failed", d.markers.transactional_id[:100])
            with self._lock:
                if self._owned_at(d.txn_partition, d.coordinator_epoch):
                    self._schedule_locked(d, MARKER_RETRY_MAX_S)

    def _complete_delivery(self, d: _Delivery) -> None:
        m = d.markers
        with self._lock:
            if not self._owned_at(d.txn_partition, d.coordinator_epoch):
                return
            t = self.state.markers_written(m.transactional_id, m.producer_id, m.producer_epoch, self.clock_ms())
        if not isinstance(t, ts.Transition):
            log.info("transactional id %r: not completing after its markers: error %d", m.transactional_id[:100],
                     int(t))
            return
        done = self._write(t)
        if isinstance(done, int):
            # Kafka retries the Complete* write; the markers are written already, so only the record is due.
            with self._lock:
                if self._owned_at(d.txn_partition, d.coordinator_epoch):
                    self._schedule_locked(d, MARKER_RETRY_MAX_S)
            return
        self._release_waiters(d.txn_partition, m.transactional_id)

    # ------------------------------------------------------------------ waiting for a transaction's end
    def when_completed(self, transactional_id: str, callback: Callable[[], None]) -> bool:
        """Have ``callback`` called (once, on any thread) when ``transactional_id``'s transaction, in PrepareCommit
        or PrepareAbort now, is complete, or this coordinator stops owning it or stops. False, and no call, when
        it is not in Prepare* now or ``COMPLETION_WAITERS_MAX`` requests wait already.

        For the Kafka listener's AddPartitionsToTxn: a producer's next transaction asks while its last one is
        being completed (EndTxn is answered once PrepareCommit is written, as Kafka answers it); answered
        CONCURRENT_TRANSACTIONS at once, librdkafka tried again only after its backoff, which bounded each
        producer to about one transaction per 40 ms. Waiting here costs no thread."""
        with self._lock:
            d = self.state.describe(transactional_id)
            if isinstance(d, TxnError) or d.state not in ts.PREPARE_STATES or self._waiting >= COMPLETION_WAITERS_MAX:
                return False
            self._completion_waiters.setdefault(transactional_id, []).append(callback)
            self._waiting += 1
            return True

    def forget_waiter(self, transactional_id: str, callback: Callable[[], None]) -> None:
        """A waiter gave up (its own timeout): it is not called."""
        with self._lock:
            waiters = self._completion_waiters.get(transactional_id)
            if waiters is not None and callback in waiters:
                waiters.remove(callback)
                self._waiting -= 1
                if not waiters:
                    del self._completion_waiters[transactional_id]

    def _release_waiters(self, partition: int | None, transactional_id: str | None = None) -> None:
        """Call the waiters of ``transactional_id``, or of every id of ``partition`` (None: of every id)."""
        with self._lock:
            if transactional_id is not None:
                ids = [transactional_id] if transactional_id in self._completion_waiters else []
            else:
                ids = [tid for tid in self._completion_waiters
                       if partition is None or self.partition_for(tid) == partition]
            called = [cb for tid in ids for cb in self._completion_waiters.pop(tid)]
            self._waiting -= len(called)
        for cb in called:
            try:
                cb()
            except Exception:  # noqa: BLE001 - one waiter's failure must not keep the others waiting
                log.exception("a waiter of a transaction's completion failed")

    # ------------------------------------------------------------------ timers
    def _run_timers(self) -> None:
        next_abort = time.monotonic() + self.config.abort_interval_ms / 1000
        next_expiry = time.monotonic() + self.config.id_expiry_interval_ms / 1000
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            try:
                if now >= next_abort:
                    next_abort = now + self.config.abort_interval_ms / 1000
                    self.abort_timed_out()
                if now >= next_expiry:
                    next_expiry = now + self.config.id_expiry_interval_ms / 1000
                    self.expire_ids()
            except Exception:  # noqa: BLE001 - a timer bug must not stop the timeouts for good
                log.exception("transaction timers failed; continuing")

    def abort_timed_out(self) -> int:
        """Abort (fencing the producer) every Ongoing transaction past its timeout; how many were."""
        with self._lock:
            due = self.state.expired(self.clock_ms())
        for t in due:
            log.info("aborting the transaction of transactional id %r: open longer than its timeout",
                     t.transactional_id[:100])
            self._write(t)
        return len(due)

    def expire_ids(self) -> int:
        with self._lock:
            due = self.state.expire_ids(self.clock_ms())
        for t in due:
            self._write(t)
        return len(due)


class BrokerCalls:
    """What the transaction machinery asks of a given broker: this one's replica manager or coordinator
    directly, another one over its BROKER listener (node certificates: WriteTxnMarkers, VerifyTransaction)."""

    def __init__(self, node_id: int, metadata_cache: Any, replica_manager: Any, security: Any,
                 coordinator: Callable[[], TransactionCoordinator | None], rpc_timeout_s: float = 10.0) -> None:
        self.node_id = node_id
        self.metadata_cache = metadata_cache
        self.replica_manager = replica_manager
        self.security = security
        self._coordinator = coordinator
        self.rpc_timeout_s = rpc_timeout_s
        self._lock = threading.Lock()
        self._channels: dict[str, Any] = {}

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    def _stub(self, node_id: int) -> Any:
        from client.cluster import HUNG_PEER_OPTIONS
        from client.security import make_channel
        from proto import broker_pb2_grpc

        info = self.metadata_cache.broker(node_id)
        if info is None:
            raise errors.error_for(TxnError.COORDINATOR_NOT_AVAILABLE, f"broker {node_id} is not registered")
        host, port = info.endpoint("BROKER")
        address = f"{host}:{port}"
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = make_channel(address, self.security, options=[
                    ("grpc.enable_retries", 0), *HUNG_PEER_OPTIONS])
        return broker_pb2_grpc.BrokerServiceStub(ch)

    def write_markers(self, leader: int, req: MarkerRequest, timeout_ms: int = 5000) -> dict[TopicPartition, int]:
        if leader == self.node_id:
            codes = self.replica_manager.write_markers(req.producer_id, req.producer_epoch, req.commit,
                                                       req.coordinator_epoch,
                                                       [(tp.topic, tp.partition) for tp in req.partitions], timeout_ms)
            return {TopicPartition(t, p): c for (t, p), c in codes.items()}
        from proto import broker_pb2

        pb = broker_pb2.WriteTxnMarkersRequest(producer_id=req.producer_id, producer_epoch=req.producer_epoch,
                                               commit=req.commit, coordinator_epoch=req.coordinator_epoch,
                                               timeout_ms=timeout_ms)
        for tp in req.partitions:
            pb.partitions.add(topic=tp.topic, partition=tp.partition)
        resp = self._stub(leader).WriteTxnMarkers(pb, timeout=timeout_ms / 1000 + self.rpc_timeout_s)
        return {TopicPartition(p.topic, p.partition): p.error_code for p in resp.partitions}

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, tp: TopicPartition) -> int:
        """KIP-890's check, asked of the id's coordinator: NONE when ``tp`` is in the producer's ongoing
        transaction; NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE when it cannot be asked now."""
        coordinator = self._coordinator()
        if coordinator is None:
            return TxnError.COORDINATOR_NOT_AVAILABLE
        info = self.metadata_cache.partition(TOPIC, coordinator.partition_for(transactional_id))
        if info is None or info.leader < 0:
            return TxnError.COORDINATOR_NOT_AVAILABLE
        if info.leader == self.node_id:
            return coordinator.verify(transactional_id, producer_id, producer_epoch, tp)
        from proto import broker_pb2

        try:
            resp = self._stub(info.leader).VerifyTransaction(broker_pb2.VerifyTransactionRequest(
                transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
                topic=tp.topic, partition=tp.partition), timeout=self.rpc_timeout_s)
        except Exception as exc:  # noqa: BLE001 - unreachable: the producer retries
            log.info("verifying transactional id %r with broker %d: %s", transactional_id[:100], info.leader, exc)
            return TxnError.COORDINATOR_NOT_AVAILABLE
        return resp.error_code


def install(broker: Any) -> TransactionCoordinator:
    """BrokerServer extension: the transaction coordinator and the calls it makes to other brokers."""
    from client.security import SecurityConfig

    defaults = dict(getattr(broker.settings, "defaults", {}) or {})
    config = TxnConfig.from_defaults(defaults)
    security = getattr(broker.settings, "inter_broker_security", None) or SecurityConfig()
    holder: list[TransactionCoordinator] = []
    calls = BrokerCalls(broker.settings.node_id, broker.metadata_cache, broker.replica_manager, security,
                        lambda: holder[0] if holder else None)
    offsets_partitions = int(defaults.get("offsets.topic.num.partitions") or 50)
    coordinator = TransactionCoordinator(
        node_id=broker.settings.node_id, replica_manager=broker.replica_manager, metadata_cache=broker.metadata_cache,
        config=config, new_producer_id=broker.service.producer_ids.next_id,
        write_markers=lambda leader, req: calls.write_markers(leader, req, config.write_timeout_ms),
        offsets_partitions=offsets_partitions)
    holder.append(coordinator)
    coordinator.calls = calls
    coordinator.start()
    broker.txn_coordinator = coordinator
    broker.service.txn = coordinator
    broker.service.txn_calls = calls
    return coordinator
