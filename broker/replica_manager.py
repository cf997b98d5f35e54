"""ReplicaManager: the partitions this broker hosts, and everything that reads or writes them.

It turns metadata into roles (leader / follower per partition, fetchers to follow), runs
the produce path (append as leader, acks=all waiting in the produce purgatory until the
high watermark passes the batch), the fetch path (consumers below the HW, followers to
the log end, long polling woken by appends), ISR maintenance (shrink on lag, expand on
catch-up, both through the controller's AlterPartition) and the internal API other
broker components use (group coordinator: append_records, read_committed, leadership
listeners, ensure_internal_topic; transaction coordinator: markers_written). Consumers fetch
read_uncommitted (below the HW) or read_committed (below the last stable offset, with the
aborted transactions among what they read: replication/partition.py).

No per-record work here: batches are checked and stamped by the storage layer from
their headers, and fetch responses are the log's bytes as they are.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import heapq
import logging
import shutil
import struct
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.config import LISTENER_REPLICATION
from broker.fetch_answer import FetchAnswer
from broker.fetch_session import FollowerFetchSession, SessionIndex
from broker.metadata_cache import MetadataCache, MetadataDelta, PartitionInfo, TopicInfo
from broker.request_times import ProduceTimes
from metadata_quorum import cluster_configs
from proto import broker_pb2, common_pb2, controller_pb2, errors
from proto.errors import ErrorCode
from replication import isr as isr_rules
from replication.fetcher import FetcherConfig, ReplicaFetcherManager
from replication.partition import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    IsrProposal,
    LockBusy,
    Partition,
    Role,
    held,
)
from replication.purgatory import DelayedOperation, DelayedOperationPurgatory
from storage.disk_errors import disk_failure
from storage.file_records import FileRecords
from storage.log import WouldBlock
from storage.record_batch import MAGIC, MAGIC_OFFSET, decode_batch, iter_batches, read_header
from storage.segment import CorruptBatchError

log = logging.getLogger(__name__)

LeadershipListener = Callable[[str, int, bool, int], None]

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
DELETE_TO_HIGH_WATERMARK = -1  # DeleteRecords' offset for "everything committed" (Kafka's)
MAX_TIMESTAMP = -3
# KIP-405's earliest offset on the leader's own disk (ListOffsets v8+) and KIP-1005's latest offset in remote
# storage (v9+). Brook keeps no tiered storage: the first is the log start, as -2; the second is not there (-1).
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
# Broker-side caps on what any Fetch may make the broker read, whatever the request asks
# (``fetch.max.bytes`` / ``fetch.partition.max.bytes``). A single batch larger than the cap
# is still returned whole when it is the first (as Kafka does), so a consumer never sticks.
BROKER_FETCH_MAX_BYTES = 55 * 1024 * 1024
BROKER_FETCH_PARTITION_MAX_BYTES = 10 * 1024 * 1024
MAX_TIMESTAMP_SCAN_BYTES = 256 * 1024 * 1024  # bound on the header scans of one ListOffsets(-3) entry
# Each read of those scans: they mostly cover the tail of the active segment, from its last
# index entry below the high watermark (about index.interval.bytes), not a fetch's megabyte.
MAX_TIMESTAMP_READ_BYTES = 64 * 1024
_MAX_TIMESTAMP_ATTEMPTS = 3  # the log start moved under a ListOffsets(-3) lookup: look again
MAX_FETCH_WAIT_MS = 60_000  # longest long poll served, whatever the request says
MAX_PRODUCE_TIMEOUT_MS = 300_000  # longest acks=all wait served
ALTER_RETRY_BACKOFF_S = 0.5  # pause before sending again an AlterPartition whose outcome is unknown
# An idempotent producer pipelines several batches of a partition, and gRPC may hand its
# requests to our worker threads in any order: a batch that overtook its predecessor waits
# this long for it before being refused with OUT_OF_ORDER_SEQUENCE_NUMBER.
SEQUENCE_GAP_WAIT_S = 0.1
# A follower's fetch woken by an append made on the event loop is read there too, up to this
# many bytes (a first batch larger than that whole): the rest it fetches at once, off the loop.
LOOP_READ_MAX_BYTES = 64 * 1024
_SEQUENCE_MODULUS = 2**31
ISR_LOOP_STALL_WARN_S = 1.0  # an ISR check this late or more is logged as a stall of this broker


def now_ms() -> int:
    """The clock of replication's timers (followers' fetch and catch-up times, ISR expiry): monotonic, so a wall
    clock stepped forward (NTP after a VM resume, an operator) does not make every follower look out of sync."""
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class AppendResult:
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False


@dataclass(slots=True)
class PartitionStats:
    topic: str
    partition: int
    is_leader: bool
    leader_epoch: int
    isr: list[int]
    replicas: list[int]
    hw: int
    leo: int
    log_start: int
    size_bytes: int
    messages_in_total: int
    bytes_in_total: int
    bytes_out_total: int
    isr_shrinks_total: int
    isr_expands_total: int
    under_replicated: bool
    under_min_isr: bool
    invalid_appends_total: int = 0  # produce appends the log's validation refused (storage.log_validator)


class DelayedProduce(DelayedOperation):
    """acks=all: done when the HW reaches ``required_offset`` (or leadership moves, or the timeout).

    ``lease_valid``: whether this broker has heard from the controller quorum within a session when the
    timeout comes. Without it, the controller has fenced this broker and another replica leads (its
    followers fetch from that one, so the HW stays): the answer is NOT_LEADER_OR_FOLLOWER, which sends
    clients (Brook's and Kafka's) to fresh metadata. REQUEST_TIMED_OUT kept them retrying here for good.
    Either way the batch may or may not be written, as with any timed-out acks=all write."""

    kind = "produce"

    def __init__(self, partition: Partition, leader_epoch: int, result: AppendResult,
                 future: concurrent.futures.Future, deadline_s: float,
                 lease_valid: Callable[[], bool] = lambda: True) -> None:
        super().__init__(deadline_s)
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.required_offset = result.last_offset + 1
        self.result = result
        self.future = future
        self.lease_valid = lease_valid

    def _try_complete(self) -> bool:
        p = self.partition
        if p.role is not Role.LEADER or p.leader_epoch != self.leader_epoch:
            self.future.set_exception(errors.NotLeaderOrFollowerError(
                f"leadership of {p.topic}-{p.partition} moved before the batch was committed"))
            return True
        if p.log.high_watermark >= self.required_offset:
            min_isr = p.min_insync_replicas()
            if len(p.isr) < min_isr:
                self.future.set_exception(errors.error_class(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)(
                    f"ISR {list(p.isr)} shrank below min.insync.replicas={min_isr} after the append"))
            else:
                self.future.set_result(self.result)
            return True
        return False

    def _on_expire(self) -> None:
        if not self.lease_valid():
            self.future.set_exception(errors.NotLeaderOrFollowerError(
                f"{self.partition.topic}-{self.partition.partition}: acks=all not reached by the ISR in time "
                f"(HW {self.partition.log.high_watermark} < {self.required_offset}), and this broker has not "
                f"reached the controller quorum for broker.session.timeout.ms: another replica may lead now"))
            return
        self.future.set_exception(errors.RequestTimedOutError(
            f"{self.partition.topic}-{self.partition.partition}: acks=all not reached by the ISR in time "
            f"(HW {self.partition.log.high_watermark} < {self.required_offset})"))


def _wake_seq(p: Partition, for_follower: bool) -> int:
    """The counter a long poll waits on: followers need new data (or a role change), consumers also HW moves."""
    return p.data_seq if for_follower else p.change_seq


def _append_in_sequence(p: Partition, records: bytes, acks: int, max_wait_s: float, transactional: bool = False,
                        verified: dict[int, int] | None = None) -> Any:
    """``p.append_as_leader``, letting a batch that arrived ahead of its producer's next sequence wait.

    Kafka reads a connection's requests in order; gRPC does not, so two pipelined Produce
    requests of one producer can reach the partition lock swapped. Refusing the second
    would cost the client a retry backoff for it and every batch behind it. Caller holds
    ``p.lock``; the wait releases it and is woken by the partition's next append (or role
    change), bounded by ``max_wait_s``.
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        try:
            return p.append_as_leader(records, acks, transactional=transactional, verified=verified)
        except errors.OutOfOrderSequenceNumberError:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not _sequence_ahead(p, records):
                raise
            p.appended.wait(remaining_s)


def _append_now(p: Partition, records: bytes, acks: int) -> Any:
    """``p.append_as_leader`` without waiting: ``WouldBlock`` where the log would block, ``LockBusy``
    where ``_append_in_sequence`` would wait (a batch ahead of its producer's next sequence).
    Caller holds ``p.lock``."""
    try:
        return p.append_as_leader(records, acks, blocking=False)
    except errors.OutOfOrderSequenceNumberError:
        if _sequence_ahead(p, records):
            raise LockBusy from None
        raise


def _sequence_ahead(p: Partition, records: bytes) -> bool:
    """Does the first batch skip sequences its producer has not written yet (a gap, not a replay)?"""
    try:
        h = read_header(records)
    except errors.BrookError:
        return False
    if h.producer_id < 0 or h.base_sequence < 0:
        return False
    entry = p.log.producer_state.entry(h.producer_id)
    if entry is None or not entry.batches:
        return h.base_sequence > 0  # its first batch (sequence 0) has not arrived yet
    if h.producer_epoch != entry.epoch:
        return False
    gap = (h.base_sequence - entry.last_seq - 1) % _SEQUENCE_MODULUS
    return 0 < gap < _SEQUENCE_MODULUS // 2


# What a woken follower fetch read where it was woken: the wake counters taken just before
# the read (the next park compares against them, so no change is lost) and _read_once's result.
InlineRead = tuple[dict[Partition, int], tuple[FetchAnswer, int, bool]]
# A woken session fetch's read ((response, bytes, must answer), the partitions it read)
_WokenRead = tuple[tuple[FetchAnswer, int, bool], list[tuple[str, int]]]
# A woken session fetch whose answer the wake sent itself (FollowerFetchSession.send_now).
_SENT = object()


def _resolve(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


async def until_resolved(fut: asyncio.Future[Any], timeout_s: float) -> Any:
    """``fut``'s result, or None once ``timeout_s`` passed: a timer then resolves ``fut`` with None,
    so whoever resolves it later finds it done (``_resolve`` drops that result). The result reaches
    the waiting task in one loop turn; ``asyncio.wait_for`` and ``asyncio.wait`` (Python 3.11) take
    two (a done callback, then the task), and on the acks=all path each turn queues behind every
    ready callback of the loop."""
    timer = asyncio.get_running_loop().call_later(max(0.0, timeout_s), _resolve, fut, None)
    try:
        return await fut
    finally:
        timer.cancel()


def call_on_loop(loop: asyncio.AbstractEventLoop, loop_thread: int, callback: Callable[..., Any], *args: Any) -> None:
    """Run ``callback(*args)`` on ``loop``, whose thread is ``loop_thread``: at once when called on that
    thread (no loop turn, no write to the loop's self-pipe), else with ``call_soon_threadsafe``, dropped
    once the loop is closed (the broker is stopping and nobody waits any more). ``callback`` only
    resolves futures (which schedules their waiters) and takes no lock a caller may hold: it may
    run inside an append, a purgatory completion or a fetch session's wake."""
    if threading.get_ident() == loop_thread:
        callback(*args)
        return
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class _AsyncDataWaiter(DelayedOperation):
    """A long-polling fetch parked as an asyncio future: it holds no thread while it waits.

    Woken when a watched partition changes in a way the fetcher can use. Consumers: an
    append, HW move or role change. Followers: an append or role change only — an acks=all
    commit moves the HW once per batch, and waking the other followers' parked fetches for
    it would only make them re-read nothing and park again.

    Completed from whichever thread changes a watched partition (an append, a follower fetch
    moving the HW, a role change). A follower's fetch is completed as Kafka's purgatory
    does: that thread reads the new data itself (``read_inline``) and only hands the
    finished read to the event loop, so the acks=all path costs no extra hop through an
    executor. Woken on the loop thread itself (an append made there, see
    BrokerService._produce_append_inline), the follower's read is made there too if it
    waits for no lock, and of at most ``LOOP_READ_MAX_BYTES`` (the follower fetches the rest
    at once). Anything else only resolves the future, and the fetch reads again where it resumes
    (a consumer's read of the tail it waited for on the loop, see ``fetch_async``; else on its executor).
    The deadline is an asyncio timer, not the purgatory reaper.
    """

    def __init__(self, seqs: dict[Partition, int], for_follower: bool, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future[Any], read_inline: Callable[..., InlineRead] | None = None) -> None:
        super().__init__(None)
        self.seqs = seqs
        self.for_follower = for_follower
        self.kind = "follower_fetch" if for_follower else "consumer_fetch"
        self._loop = loop
        self._loop_thread = threading.get_ident()  # created on the loop
        self._future = future
        self._read_inline = read_inline
        self._fired = False  # set under the operation's lock by the one call that completes it

    def _try_complete(self) -> bool:
        if any(_wake_seq(p, self.for_follower) != s for p, s in self.seqs.items()):
            self._fired = True
            return True
        return False

    def try_complete(self) -> bool:
        done = super().try_complete()
        if done and self._fired:
            with self._done_lock:  # deliver exactly once, and read outside the lock
                fired, self._fired = self._fired, False
            if fired:
                self._deliver()
        return done

    def _on_expire(self) -> None:
        self._hand_over(None)

    def _deliver(self) -> None:
        result: InlineRead | None = None
        if self._read_inline is not None and not self._future.done():
            try:
                if threading.get_ident() != self._loop_thread:
                    result = self._read_inline()
                else:  # never wait on the loop: a held lock leaves the read to the executor
                    result = self._read_inline(blocking=False, max_bytes=LOOP_READ_MAX_BYTES)
            except LockBusy:
                pass
            except Exception:  # the loop re-reads on its executor instead
                log.exception("reading for a woken follower fetch failed")
        self._hand_over(result)

    def _hand_over(self, result: InlineRead | None) -> None:
        call_on_loop(self._loop, self._loop_thread, _resolve, self._future, result)



def marker_answer(fut: concurrent.futures.Future | asyncio.Future) -> int:
    """The answer for one marker of ``append_markers`` once its wait is over: NONE when the in-sync replicas have
    it, its error's code, or REQUEST_TIMED_OUT while it is still waiting."""
    if not fut.done() or fut.cancelled():
        return ErrorCode.REQUEST_TIMED_OUT
    exc = fut.exception()
    if exc is None:
        return ErrorCode.NONE
    return exc.code if isinstance(exc, errors.BrookError) else ErrorCode.UNKNOWN_SERVER_ERROR

class ReplicaManager:
    def __init__(self, node_id: int, log_manager: Any, metadata_cache: MetadataCache, controller_client: Any,
                 *, defaults: Mapping[str, str], broker_epoch: Callable[[], int],
                 lease_valid: Callable[[], bool] = lambda: True, fenced: Callable[[], bool] = lambda: False,
                 fetcher_config: FetcherConfig | None = None, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: the broker's event loop, where the replica fetchers run (without one, their own).
        ``fenced``: the controller has fenced this broker (or not yet unfenced it): no writes at all.
        ``lease_valid``: heard from the controller within a session: without it, acks=0/1 writes are
        refused and acks=all writes go on (see ``append_records``)."""
        self.node_id = node_id
        self._corrupt_reported: set[tuple[str, int, int]] = set()  # corrupt batches logged (sole in-sync replica)
        self.log_manager = log_manager
        cleaner = getattr(log_manager, "cleaner", None)
        if cleaner is not None:
            cleaner.on_corrupt = functools.partial(self._background_found_corrupt, "the log cleaner")
        scrubber = getattr(log_manager, "scrubber", None)
        if scrubber is not None:
            scrubber.on_corrupt = functools.partial(self._background_found_corrupt, "the log scrubber")
        self.metadata_cache = metadata_cache
        self.controller_client = controller_client
        self.defaults = dict(defaults)
        self._broker_epoch = broker_epoch
        self._lease_valid = lease_valid
        self._fenced = fenced
        self.replica_lag_time_max_ms = int(self.defaults.get("replica.lag.time.max.ms", "30000"))
        # How long no follower may have fetched a partition led here, without a controller session, before this
        # broker takes itself for a deposed leader towards consumers at the end of the log (``_deposed_leader``).
        self.deposed_after_ms = min(self.replica_lag_time_max_ms,
                                    int(self.defaults.get("broker.session.timeout.ms", "9000")))
        self.fetch_max_bytes = int(self.defaults.get("fetch.max.bytes", str(BROKER_FETCH_MAX_BYTES)))
        self.fetch_partition_max_bytes = int(self.defaults.get("fetch.partition.max.bytes",
                                                               str(BROKER_FETCH_PARTITION_MAX_BYTES)))
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._role_lock = threading.RLock()
        # partition -> (leader, its gRPC address, leader epoch, its replication listener's address or "")
        self._fetch_targets: dict[tuple[str, int], tuple[int, str, int, str]] = {}
        self._listeners: list[LeadershipListener] = []
        # Told of each transaction marker written here as leader: (topic, partition, producer id, commit, offset).
        self.marker_listeners: list[Callable[[str, int, int, bool, int], None]] = []
        self.produce_purgatory = DelayedOperationPurgatory("produce")
        self.fetch_purgatory = DelayedOperationPurgatory("fetch")
        self.fetch_sessions = SessionIndex()  # followers' ReplicaFetch streams, by the partitions they hold
        # Produce requests' local (append) and remote (acks=all wait) times, recorded by the service.
        self.produce_times = ProduceTimes()
        self.fetchers = ReplicaFetcherManager(node_id, broker_epoch, fetcher_config or FetcherConfig(), loop=loop,
                                              on_storage_error=log_manager.dir_failed,
                                              on_high_watermark=self._follower_high_watermark)
        self._alter = _AlterPartitionSender(self)
        self._stopped = threading.Event()
        self._isr_thread = threading.Thread(target=self._isr_loop, name=f"isr-expiration-{node_id}", daemon=True)

    # ---- lifecycle ----
    def start(self) -> None:
        self._alter.start()
        self._isr_thread.start()

    def shutdown(self) -> None:
        self._stopped.set()
        self.fetchers.shutdown()
        self._alter.stop()
        with self._role_lock:
            for p in self._partitions.values():
                p.make_offline()
                self._complete_delayed(p.key)
        self.produce_purgatory.shutdown()
        self.fetch_purgatory.shutdown()
        if self._isr_thread.is_alive():
            self._isr_thread.join(timeout=5)

    def add_leadership_listener(self, cb: LeadershipListener) -> None:
        self._listeners.append(cb)

    def partition(self, topic: str, partition: int) -> Partition | None:
        return self._partitions.get((topic, partition))

    def hosted_partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    # ---- metadata -> roles ----
    def apply_metadata_delta(self, delta: MetadataDelta) -> None:
        with self._role_lock:
            for topic in delta.deleted_topics:
                self._remove_topic(topic, snapshot=delta.is_snapshot)
            for topic in delta.changed_topics:
                if any(k[0] == topic.name for k in self._partitions):
                    try:
                        self.log_manager.update_topic_config(topic.name, topic.configs)
                    except Exception:
                        log.exception("updating config of topic %s failed", topic.name)
            seen: set[tuple[str, int]] = set()
            for info in delta.changed_partitions:
                seen.add((info.topic, info.partition))
                try:
                    self._apply_partition(info, snapshot=delta.is_snapshot)
                except Exception:
                    log.exception("applying metadata for %s-%d failed", info.topic, info.partition)
            if delta.is_snapshot:
                self._remove_unknown_logs(seen)
            if delta.cluster_configs is not None:
                self._apply_cluster_configs(delta.cluster_configs)
            self._reconcile_fetchers()

    def _apply_cluster_configs(self, configs: dict[str, str]) -> None:
        """Dynamic cluster configs: topic defaults for the logs, the follower copy throttle."""
        try:
            self.log_manager.set_dynamic_defaults(cluster_configs.topic_defaults(configs))
        except Exception:
            log.exception("applying dynamic topic defaults failed")
        rate = cluster_configs.follower_throttle(configs)
        if rate != self.fetchers.config.throttle.rate:
            log.info("follower replication throttle: %s", f"{rate} bytes/s" if rate else "none")
        self.fetchers.config.throttle.set_rate(rate)

    def _apply_partition(self, info: PartitionInfo, *, snapshot: bool = False) -> None:
        """``snapshot``: ``info`` comes from a snapshot of the metadata, not a delta; a replica it takes
        away from this broker is then set aside as a stray log, not deleted (see ``_stop_replica``)."""
        key = (info.topic, info.partition)
        p = self._partitions.get(key)
        if self.node_id not in info.replicas:
            if p is not None:
                self._stop_replica(p, delete=True,
                                   stray="a snapshot of the metadata does not place it here" if snapshot else None)
            return
        if p is not None and p.topic_id != info.topic_id:
            self._stop_replica(p, delete=True, stray=f"its topic id {p.topic_id} is not the topic's now "
                               f"({info.topic_id})" if snapshot else None)
            p = None
        if p is None:
            topic = self.metadata_cache.topic(info.topic)
            overrides = topic.configs if topic is not None else {}
            lg = self.log_manager.get_or_create_log(info.topic, info.partition, topic_id=info.topic_id,
                                                    overrides=overrides)
            p = Partition(info.topic, info.partition, info.topic_id, lg, self.node_id,
                          broker_usable=self.metadata_cache.is_broker_usable)
            self._partitions[key] = p
        if info.leader == self.node_id:
            self.fetchers.remove_partitions([key])
            self._fetch_targets.pop(key, None)
            if p.make_leader(info.replicas, info.isr, info.leader_epoch, info.partition_epoch, now_ms()):
                log.info("%s-%d: leader at epoch %d, ISR %s, LEO %d, HW %d", info.topic, info.partition,
                         info.leader_epoch, list(info.isr), p.log.log_end_offset, p.log.high_watermark)
                self._notify_listeners(info.topic, info.partition, True, info.leader_epoch)
            self._complete_delayed(key)
            return
        was_leader = p.is_leader
        if info.leader < 0:
            p.make_offline()
            p.leader_epoch = info.leader_epoch
        elif p.make_follower(info.leader, info.replicas, info.isr, info.leader_epoch, info.partition_epoch):
            log.info("%s-%d: follower of %d at epoch %d", info.topic, info.partition, info.leader,
                     info.leader_epoch)
        self._complete_delayed(key)
        if was_leader:
            self._notify_listeners(info.topic, info.partition, False, info.leader_epoch)

    def _reconcile_fetchers(self) -> None:
        """Every follower partition fetches from its leader's current endpoint at its current epoch."""
        for key, p in self._partitions.items():
            if p.role is not Role.FOLLOWER:
                if key in self._fetch_targets:
                    self.fetchers.remove_partitions([key])
                    del self._fetch_targets[key]
                continue
            b = self.metadata_cache.broker(p.leader_id)
            if b is None or b.port <= 0:
                continue
            replication = b.registered_endpoint(LISTENER_REPLICATION)
            target = (p.leader_id, f"{b.host}:{b.port}", p.leader_epoch,
                      f"{replication[0]}:{replication[1]}" if replication is not None else "")
            if self._fetch_targets.get(key) != target:
                self.fetchers.add_partition(p, target[0], target[1], target[2], replication_address=target[3])
                self._fetch_targets[key] = target

    def _stop_replica(self, p: Partition, *, delete: bool, stray: str | None = None) -> None:
        """Stop hosting ``p``; with ``delete``, its log goes too: deleted when the broker saw the change in a
        metadata delta (a topic deleted, a replica reassigned away), or set aside and kept as a stray log,
        with ``stray`` saying why, when only a snapshot says so. A snapshot may be stale or wrong (a
        controller bug, a wiped or mistaken quorum) and must not be able to delete data (Kafka: KAFKA-14616)."""
        was_leader = p.is_leader
        self.fetchers.remove_partitions([p.key])
        self._fetch_targets.pop(p.key, None)
        p.make_offline()
        self._complete_delayed(p.key)
        self._partitions.pop(p.key, None)
        if was_leader:
            self._notify_listeners(p.topic, p.partition, False, p.leader_epoch)
        if delete and stray is not None:
            self.log_manager.set_aside_log(p.topic, p.partition, stray)
        elif delete:
            log.info("%s-%d: no longer hosted here; deleting the log", p.topic, p.partition)
            self.log_manager.delete_log(p.topic, p.partition)
        if delete:  # the batches said of a log that is gone (a set rebuilt, not changed, under a reader)
            self._corrupt_reported = {k for k in self._corrupt_reported if k[:2] != p.key}

    def _remove_topic(self, topic: TopicInfo, *, snapshot: bool = False) -> None:
        """A deleted topic's replicas go, and their logs: deleted, or set aside when only a snapshot (which
        no longer names the topic) says it was deleted (see ``_stop_replica``)."""
        for key, p in list(self._partitions.items()):
            if key[0] == topic.name and p.topic_id == topic.topic_id:
                self._stop_replica(p, delete=True, stray="a snapshot of the metadata does not name its topic"
                                   if snapshot else None)

    def _remove_unknown_logs(self, seen: set[tuple[str, int]]) -> None:
        """After a snapshot: the partitions it does not name, and logs on disk it does not place here, are
        set aside as stray logs (kept, never deleted: see ``_stop_replica``)."""
        for key, p in list(self._partitions.items()):
            if key not in seen:
                self._stop_replica(p, delete=True, stray="a snapshot of the metadata does not name its partition")
        for (topic, part) in list(self.log_manager.all_logs()):
            info = self.metadata_cache.partition(topic, part)
            if (topic, part) not in self._partitions and (info is None or self.node_id not in info.replicas):
                self.log_manager.set_aside_log(topic, part, "a snapshot of the metadata does not place its "
                                               "partition on this broker")

    def _notify_listeners(self, topic: str, partition: int, is_leader: bool, epoch: int) -> None:
        for cb in list(self._listeners):
            try:
                cb(topic, partition, is_leader, epoch)
            except Exception:
                log.exception("leadership listener failed for %s-%d", topic, partition)

    def _complete_delayed(self, key: tuple[str, int]) -> None:
        self.produce_purgatory.check_and_complete(key)
        self._wake_fetches(key, self._partitions.get(key))

    def _follower_high_watermark(self, p: Partition) -> None:
        """A followed partition's high watermark moved (its fetcher, any thread): the consumers reading it from
        this follower (KIP-392) that wait in the purgatory for what it commits look again."""
        p.change_seq += 1  # their wait's counter (the fetcher is its only other writer on a follower)
        self.fetch_purgatory.check_and_complete(p.key)

    def _wake_fetches(self, key: tuple[str, int], p: Partition | None) -> None:
        """Partition ``key`` changed: the long polls waiting on it, in the purgatory (consumers, unary
        follower fetches) and in followers' fetch sessions, look again."""
        self.fetch_purgatory.check_and_complete(key)
        self.fetch_sessions.changed(key, p)

    def markers_written(self, keys: Iterable[tuple[str, int]]) -> None:
        """Transaction markers (COMMIT/ABORT) were appended as leader to partitions ``keys``
        (``Partition.append_marker_as_leader``, or ``Log.append_marker_as_leader`` itself); the transaction
        coordinator calls this once it wrote them. A marker moves the last stable offset, the bound of
        read_committed fetches, once the HW passes it: the followers' fetches are woken to replicate it (their
        progress then moves the HW, which wakes the consumers), a leader alone in its ISR moves its HW over it
        here (acks=all produces waiting on that complete), and the read_committed fetches parked on the
        partition look again at once (Kafka tries its delayed fetches after every leader append)."""
        for key in dict.fromkeys(keys):
            p = self._partitions.get(key)
            if p is None:
                continue
            p.markers_appended()
            self._complete_delayed(key)

    def write_markers(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      partitions: Iterable[tuple[str, int]], timeout_ms: int) -> dict[tuple[str, int], int]:
        """Kafka's WriteTxnMarkers on this broker: a COMMIT or ABORT marker of the producer's transaction appended
        as leader to each partition, each answered once the in-sync replicas have it (acks=all, as Kafka writes
        markers) or with its error. Blocking (the marker senders of a coordinator on this broker); the RPC appends
        with ``append_markers`` and waits on its event loop.

        ``on_marker`` listeners (the group coordinator, for ``__consumer_offsets``: a transaction's offsets become
        visible or go) are told of each marker written. The coordinator epoch is the transaction coordinator's
        partition leader epoch: the log refuses markers of a coordinator older than the last one it saw."""
        codes, waits, deadline = self.append_markers(producer_id, producer_epoch, commit, coordinator_epoch,
                                                     partitions, timeout_ms)
        concurrent.futures.wait(waits.values(), timeout=max(0.0, deadline - time.monotonic()) + 1)
        for key, fut in waits.items():
            codes[key] = marker_answer(fut)
        return codes

    def append_markers(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                       partitions: Iterable[tuple[str, int]], timeout_ms: int
                       ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], concurrent.futures.Future], float]:
        """The appends of ``write_markers``, without its wait: (error code of each partition refused, the future of
        each marker written, completed once the in-sync replicas have it or failed with its error, and the
        monotonic deadline it is watched until). A waiting WriteTxnMarkers held a replication thread: with the
        four of them waiting, no follower's fetch answer that needed one was put together, so no high watermark
        moved and every wait ran to its timeout (seen with 32 transactional producers)."""
        codes: dict[tuple[str, int], int] = {}
        waits: dict[tuple[str, int], concurrent.futures.Future] = {}
        deadline = time.monotonic() + min(max(0, timeout_ms), MAX_PRODUCE_TIMEOUT_MS) / 1000
        for key in dict.fromkeys(partitions):
            topic, index = key
            try:
                p = self.leader_partition(topic, index)
                if self._fenced():
                    raise errors.NotLeaderOrFollowerError(
                        f"broker {self.node_id} is fenced by the controller; not accepting writes")
                try:
                    with p.lock:
                        epoch = p.leader_epoch
                        info = p.append_marker_as_leader(producer_id, producer_epoch, commit, coordinator_epoch)
                except OSError as e:
                    log.error("marker append to %s-%d failed on disk: %s", topic, index, e)
                    self.log_manager.dir_failed(p.log.dir, e)
                    raise errors.KafkaStorageError(f"{topic}-{index}: {e}") from e
            except errors.BrookError as e:
                codes[key] = e.code
                continue
            for listener in self.marker_listeners:
                listener(topic, index, producer_id, commit, info.first_offset)
            self.markers_written([key])
            fut: concurrent.futures.Future = concurrent.futures.Future()
            result = AppendResult(topic, index, info.first_offset, info.last_offset, -1, p.log.log_start_offset)
            self.produce_purgatory.watch(DelayedProduce(p, epoch, result, fut, deadline, self._lease_valid), [p.key])
            waits[key] = fut
        return codes, waits, deadline

    # ---- lookup helpers ----
    def _current_leader(self, topic: str, partition: int) -> common_pb2.LeaderIdAndEpoch:
        return self.metadata_cache.leader_and_epoch(topic, partition)

    def leader_partition(self, topic: str, partition: int) -> Partition:
        """The partition if this broker leads it; else the specific error."""
        p = self._partitions.get((topic, partition))
        if p is None:
            if self.metadata_cache.partition(topic, partition) is None:
                raise errors.UnknownTopicOrPartitionError(f"unknown partition {partition} of topic {topic!r}")
            raise errors.NotLeaderOrFollowerError(f"broker {self.node_id} does not host {topic}-{partition}")
        p.check_leader()
        return p

    # ---- produce ----
    def append_records(self, topic: str, partition: int, records: bytes, *, acks: int,
                       timeout_ms: int, blocking: bool = True, transactional: bool = False,
                       verified: dict[int, int] | None = None) -> concurrent.futures.Future:
        """Append as leader. The future resolves to an AppendResult, or raises the BrookError.

        acks=0/1 resolve once the leader appended; acks=-1 once the HW passes the batch,
        with REQUEST_TIMED_OUT after ``timeout_ms`` (the data stays appended, as in Kafka).
        ``blocking=False`` is for the broker's event loop: it raises ``WouldBlock`` (``LockBusy`` for a
        held lock or a sequence gap), having changed nothing, where the append would wait or do
        blocking work. ``transactional``: a transactional producer's batches, verified by the caller with the
        marker marks in ``verified`` (``Log.append_as_leader``); only the blocking path takes them.
        """
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if transactional and not blocking:
                raise WouldBlock("transactional batches are appended off the loop")
            if acks not in (0, 1, -1):
                raise errors.InvalidRequiredAcksError(f"acks must be 0, 1 or -1 (all), not {acks}")
            if not records:
                raise errors.InvalidRecordError("a produce must hold at least one record batch per partition")
            if len(records) > MAGIC_OFFSET and records[MAGIC_OFFSET] != MAGIC:
                # Kafka's answer to a v3+ Produce of a message set (clients before 0.11): not retriable. The
                # batch parser said CORRUPT_MESSAGE ("truncated batch header"), which clients retry.
                raise errors.InvalidRecordError(
                    f"a message set of magic {records[MAGIC_OFFSET]}: only record batches of magic 2 (Kafka 0.11 "
                    f"and later clients) are accepted")
            p = self.leader_partition(topic, partition)
            if self._fenced():
                raise errors.NotLeaderOrFollowerError(
                    f"broker {self.node_id} is fenced by the controller; not accepting writes")
            if acks != -1 and not self._lease_valid():
                # A broker cut off from the controllers may have been replaced as leader already. An
                # acks=all write needs no lease: its HW waits for every in-sync follower, and they
                # fetch from another leader once one is elected, so a replaced leader acknowledges
                # nothing; the ISR cannot shrink without the quorum either. An acks=0/1 write has no
                # such guard, so it is refused rather than taken and lost (Kafka takes it).
                raise errors.NotLeaderOrFollowerError(
                    f"broker {self.node_id} has not reached the controller quorum for "
                    f"broker.session.timeout.ms: acks={acks} writes are refused until it does (acks=all "
                    f"writes go on)")
            with held(p.lock, blocking):
                epoch = p.leader_epoch
                try:
                    if blocking:
                        info = _append_in_sequence(p, records, acks,
                                                   min(SEQUENCE_GAP_WAIT_S, max(0, timeout_ms) / 1000), transactional,
                                                   verified)
                    else:
                        info = _append_now(p, records, acks)
                except OSError as e:
                    log.error("append to %s-%d failed on disk: %s", topic, partition, e)
                    self.log_manager.dir_failed(p.log.dir, e)
                    raise errors.KafkaStorageError(f"{topic}-{partition}: {e}") from e
                except errors.KafkaStorageError as e:
                    self.log_manager.dir_failed(p.log.dir, e)
                    raise
            result = AppendResult(topic, partition, info.first_offset, info.last_offset,
                                  info.log_append_time_ms, p.log.log_start_offset,
                                  bool(getattr(info, "duplicate", False)))
        except errors.BrookError as e:
            fut.set_exception(e)
            return fut
        self._wake_fetches(p.key, p)
        if acks != -1:
            fut.set_result(result)
            return fut
        timeout_ms = min(max(0, timeout_ms), MAX_PRODUCE_TIMEOUT_MS)
        op = DelayedProduce(p, epoch, result, fut, time.monotonic() + timeout_ms / 1000, self._lease_valid)
        self.produce_purgatory.watch(op, [p.key])
        return fut

    # ---- fetch ----
    def response_max_bytes(self, req: broker_pb2.FetchRequest) -> int:
        """The most a Fetch response may carry: the request's max_bytes, capped by ``fetch.max.bytes``."""
        asked = req.max_bytes if req.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        per_partition = len(req.partitions) * self.fetch_partition_max_bytes
        return max(0, min(asked, self.fetch_max_bytes, per_partition))

    async def fetch_async(self, req: broker_pb2.FetchRequest, *,
                          run: Callable[[Callable[[], Any]], Awaitable[Any]],
                          reserve: Callable[[int], Awaitable[int]], release: Callable[[int], None],
                          on_park: Callable[[], None], on_unpark: Callable[[], None],
                          slices: dict[tuple[str, int], Any] | None = None,
                          ) -> tuple[FetchAnswer, int]:
        """``fetch`` for the broker's event loop: reads run on ``run`` (an executor), a long poll
        parks as a future in the fetch purgatory and holds no thread.

        ``reserve(n)`` waits for up to ``n`` bytes of the broker's in-flight budget before a
        read and returns the grant; the bytes the response really holds are returned with it
        (the caller releases them once the response is handed to gRPC), the rest is released
        here. ``on_park``/``on_unpark`` bracket a wait (per-client accounting; may raise to
        refuse the wait). Cancelling the calling task (the RPC was cancelled) unparks at once.
        """
        loop = asyncio.get_running_loop()
        req = one_entry_per_partition(req)
        deadline = loop.time() + min(max(0, req.max_wait_ms), MAX_FETCH_WAIT_MS) / 1000
        keys = [(fp.topic, fp.partition) for fp in req.partitions]
        for_follower = req.replica_id >= 0
        cap = self.response_max_bytes(req)

        def wake_seqs() -> dict[Partition, int]:
            return {p: _wake_seq(p, for_follower) for k in keys if (p := self._partitions.get(k)) is not None}

        def read_inline(blocking: bool = True, max_bytes: int | None = None) -> InlineRead:
            before = wake_seqs()
            return before, self._read_once(req, cap if max_bytes is None else min(cap, max_bytes), blocking=blocking)

        inline: InlineRead | None = None
        if for_follower and self._follower_caught_up(req):
            # The follower has everything: this fetch only reports its progress (the acks=all path).
            # That is a few state updates, done here rather than after a hop to the executor and back.
            try:
                inline = read_inline(blocking=False)
            except LockBusy:  # an append holds a partition: the executor waits for it, not the loop
                inline = None
        # A consumer's read after a park is of the tail it waited for: what an append or HW move
        # just made readable, in the page cache; one asking only past the HW reads nothing (a consumer
        # that is up to date, before it parks). Read on the loop, as a woken follower fetch is,
        # up to LOOP_READ_MAX_BYTES (the rest the consumer fetches at once): no hop to the executor
        # and back between the commit and the answer. Not for reads sent from the files (slices),
        # nor for a min_bytes above that bound (the bounded read could never satisfy it).
        tail_on_loop = not for_follower and slices is None and req.min_bytes <= LOOP_READ_MAX_BYTES
        # A woken read_committed read also looks up the aborted transactions of what it read: on the executor.
        woken_on_loop = tail_on_loop and req.isolation_level != READ_COMMITTED
        parked = False
        while True:
            if inline is None:
                seqs = wake_seqs()  # before the read: a change racing with it wakes the park below
                # A consumer's read takes no lock (the log's view); one at the tail touches no file.
                here = (woken_on_loop and parked) or (tail_on_loop and self._at_tail(req))
                read_cap = min(cap, LOOP_READ_MAX_BYTES) if here else cap
                granted = await reserve(read_cap)
                try:
                    resp, total_bytes, must_answer = self._read_once(req, read_cap) if here else \
                        await run(lambda: self._read_once(req, cap, slices))
                except BaseException:
                    release(granted)
                    raise
            else:  # a follower fetch read by the thread that woke it (replication: no byte budget)
                granted = 0
                seqs, (resp, total_bytes, must_answer) = inline
            remaining_s = deadline - loop.time()
            if must_answer or total_bytes >= req.min_bytes or remaining_s <= 0 or not seqs or self._stopped.is_set():
                held = min(granted, total_bytes)
                release(granted - held)
                return resp, held
            release(granted)
            inline = await self._park(seqs, for_follower, remaining_s, on_park, on_unpark,
                                      read_inline if for_follower else None)
            parked = True
            if self._stopped.is_set():
                return resp, 0

    def _at_tail(self, req: broker_pb2.FetchRequest) -> bool:
        """Does a consumer's fetch ask only for what is not committed yet (read_committed: not yet stable)? Its
        read then finds nothing without touching a file (``Log.read`` stops at the HW, or the LSO, first), the
        usual case of a consumer that has read everything and asks again; partitions not hosted here read no
        file either."""
        committed = req.isolation_level == READ_COMMITTED
        for fp in req.partitions:
            p = self._partitions.get((fp.topic, fp.partition))
            if p is not None and fp.fetch_offset < (p.log.last_stable_offset if committed else p.log.high_watermark):
                return False
        return True

    async def _park(self, seqs: dict[Partition, int], for_follower: bool, timeout_s: float,
                    on_park: Callable[[], None], on_unpark: Callable[[], None],
                    read_inline: Callable[..., InlineRead] | None) -> InlineRead | None:
        """Wait for a change; the waker's read of it when it did one (followers), else None."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[InlineRead | None] = loop.create_future()
        waiter = _AsyncDataWaiter(seqs, for_follower, loop, fut, read_inline)
        on_park()
        try:
            if not self.fetch_purgatory.watch(waiter, [p.key for p in seqs]):
                return await until_resolved(fut, timeout_s)
            return None
        finally:
            waiter.cancel()
            on_unpark()

    def new_fetch_session(self) -> FollowerFetchSession:
        """The leader's side of a follower's ReplicaFetch stream (close it when the stream ends). Its full
        reads refresh every follower's caught-up time well within replica.lag.time.max.ms (an eighth,
        at most 1 s)."""
        return FollowerFetchSession(self.fetch_sessions, refresh_s=min(1.0, self.replica_lag_time_max_ms / 8000),
                                    hosted=lambda: len(self._partitions))

    async def session_fetch(self, req: broker_pb2.FetchRequest, session: FollowerFetchSession,
                            run: Callable[[Callable[[], Any]], Awaitable[Any]]) -> FetchAnswer | None:
        """A follower's fetch on its ReplicaFetch stream, ``session`` already updated with ``req``.

        Each read covers the session's partitions with something to tell or record
        (broker/fetch_session.py), all of them only once per refresh; the long poll is parked in
        the session, woken by new data on one of its partitions and, as ``fetch_async`` does for
        followers, read by the thread that appended it. ``session.answered`` marks each answer.

        None: the answer went out already, through ``session.send_now`` from a wake on the loop.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(0, req.max_wait_ms), MAX_FETCH_WAIT_MS) / 1000
        cap = self.response_max_bytes(req)
        woken: Any = None  # a _WokenRead
        while True:
            if woken is not None:
                (resp, total_bytes, must_answer), keys = woken
            else:
                r, keys = session.request(self._partitions, time.monotonic())
                read = None
                if self._follower_caught_up(r):
                    # Only progress to record (the acks=all path): a few state updates, done here.
                    try:
                        read = self._read_once(r, cap, blocking=False)
                    except LockBusy:  # an append holds a partition: the executor waits for it, not the loop
                        pass
                if read is None:
                    try:
                        read = await run(lambda r=r: self._read_once(r, cap))
                    except BaseException:
                        session.discarded(keys)
                        raise
                resp, total_bytes, must_answer = read
            remaining_s = deadline - loop.time()
            if (must_answer or total_bytes >= req.min_bytes or remaining_s <= 0 or not len(session)
                    or self._stopped.is_set()):
                session.answered(resp.message)
                return resp
            session.discarded(keys)
            woken = await self._session_park(session, remaining_s, cap, req.min_bytes)
            if woken is _SENT:
                return None

    async def _session_park(self, session: FollowerFetchSession, timeout_s: float, cap: int,
                            min_bytes: int) -> _WokenRead | object | None:
        """Wait for new data on one of the session's partitions: the waker's read of it, None (the
        deadline, something already new, or the waker left the read to the loop), or ``_SENT``: woken
        on the loop with an answer due, the waker sent it through ``session.send_now``. The follower
        then has its data before the append that woke it returns, not after the rest of that
        request's work and a loop turn."""
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()
        fut: asyncio.Future[_WokenRead | object | None] = loop.create_future()

        def hand_over(result: _WokenRead | None) -> None:  # on the loop
            if not fut.done():
                fut.set_result(result)
            elif result is not None:
                session.discarded(result[1])  # read after the fetch stopped waiting: read it again

        def wake() -> None:  # once, on the thread that marked a partition dirty
            result = None
            r, keys = session.request(self._partitions, time.monotonic())
            try:
                if threading.get_ident() != loop_thread:
                    result = self._read_once(r, cap), keys
                else:  # never wait on the loop: a held lock leaves the read to the loop's executor
                    read = self._read_once(r, min(cap, LOOP_READ_MAX_BYTES), blocking=False)
                    resp, total_bytes, must_answer = read
                    send_now = session.send_now
                    if send_now is not None and not fut.done() and (must_answer or total_bytes >= min_bytes):
                        session.answered(resp.message)
                        send_now(resp)
                        fut.set_result(_SENT)  # on the loop, not done: checked above
                        return
                    result = read, keys
            except LockBusy:
                session.discarded(keys)
            except Exception:
                session.discarded(keys)
                log.exception("reading for a woken follower fetch failed")
            call_on_loop(loop, loop_thread, hand_over, result)

        if not session.park(wake):
            return None
        try:
            return await until_resolved(fut, timeout_s)
        finally:
            session.unpark()

    def _follower_caught_up(self, req: broker_pb2.FetchRequest) -> bool:
        """Does this follower fetch ask for nothing past any hosted partition's log end?"""
        for fp in req.partitions:
            p = self._partitions.get((fp.topic, fp.partition))
            if p is None or fp.fetch_offset < p.log.log_end_offset:
                return False
        return True

    def _read_once(self, req: broker_pb2.FetchRequest, max_bytes: int | None = None,
                   slices: dict[tuple[str, int], Any] | None = None, *,
                   blocking: bool = True) -> tuple[FetchAnswer, int, bool]:
        """One read of every partition. With ``slices`` (a consumer fetch to be sent with sendfile), each
        partition's records stay in the segment file: a storage.file_records.FileRecords goes into
        ``slices`` (replacing, and closing, one of an earlier read) and the response's records stay empty;
        past the slices' descriptor budget (file_records.slice_budget) the records are read into the response.
        ``blocking=False`` (follower fetches on the event loop) raises LockBusy where a partition lock is
        held; partitions before it may have recorded the follower's progress, which a retry records again.
        Records read into memory stay the bytes read, apart from the message (broker/fetch_answer.py)."""
        answer = FetchAnswer()
        resp = answer.message
        remaining = self.response_max_bytes(req) if max_bytes is None else max_bytes
        total = 0
        must_answer = False
        is_follower = req.replica_id >= 0
        stale = self._stale_replica_epoch(req) if is_follower else _isolation_refusal(req.isolation_level)
        read_committed = not is_follower and req.isolation_level == READ_COMMITTED
        now = now_ms()
        for fp in req.partitions:
            out = resp.partitions.add(topic=fp.topic, partition=fp.partition, high_watermark=-1,
                                      log_start_offset=-1, log_end_offset=-1)
            if not is_follower:
                out.last_stable_offset = -1
            try:
                if stale is not None:
                    raise stale
                if fp.partition_max_bytes < 0:
                    raise errors.error_class(ErrorCode.INVALID_FETCH_SIZE)(
                        f"partition_max_bytes {fp.partition_max_bytes} < 0")
                p = self._partitions.get((fp.topic, fp.partition))
                if p is None:
                    self.leader_partition(fp.topic, fp.partition)  # raises the right error
                    raise errors.NotLeaderOrFollowerError(f"{fp.topic}-{fp.partition} not hosted")
                limit = min(fp.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES, self.fetch_partition_max_bytes,
                            max(0, remaining))
                first = total == 0
                if is_follower:
                    r = p.fetch_for_follower(req.replica_id, fp.fetch_offset, fp.log_start_offset,
                                             fp.last_fetched_epoch, fp.current_leader_epoch, limit, first, now,
                                             blocking=blocking)
                    records = r.records
                    out.high_watermark, out.log_start_offset, out.log_end_offset = (
                        r.high_watermark, r.log_start_offset, r.log_end_offset)
                    if r.diverging_epoch is not None:
                        out.diverging_epoch.epoch, out.diverging_epoch.end_offset = r.diverging_epoch
                        must_answer = True
                    if r.hw_changed:
                        self._complete_delayed(p.key)
                    if r.isr_proposal is not None:
                        self._alter.submit(r.isr_proposal)
                else:
                    data = p.read_for_consumer(fp.fetch_offset, limit, fp.current_leader_epoch, first,
                                               as_slice=slices is not None, follower_read=req.follower_read,
                                               read_committed=read_committed) \
                        if (limit > 0 or first) else None
                    records = data.records if data is not None else b""
                    if not records and self._deposed_leader(p, now):
                        raise errors.NotLeaderOrFollowerError(
                            f"{fp.topic}-{fp.partition}: this broker has not reached the controller quorum for "
                            f"broker.session.timeout.ms and no follower has fetched for {self.deposed_after_ms} ms: "
                            f"another replica may lead now")
                    lg = p.log
                    out.high_watermark, out.log_start_offset, out.log_end_offset = (
                        lg.high_watermark, lg.log_start_offset, lg.log_end_offset)
                    if data is None or not read_committed:
                        # Kafka answers the LSO at either isolation level (a read_uncommitted consumer's lag
                        # metrics ignore it); nothing is aborted for a consumer that reads everything.
                        out.last_stable_offset = lg.last_stable_offset
                    else:
                        out.last_stable_offset = data.last_stable_offset
                        for producer_id, first_offset in data.aborted_transactions:
                            out.aborted_transactions.add(producer_id=producer_id, first_offset=first_offset)
                    if slices is not None:
                        old = slices.pop((fp.topic, fp.partition), None)
                        if old is not None:
                            old.close()
                        if isinstance(records, FileRecords):
                            slices[(fp.topic, fp.partition)] = records
                            total += len(records)
                            remaining -= len(records)
                            continue
                        # bytes: read into memory (storage/file_records.py: the slice budget was spent)
                if records:
                    answer.records[len(resp.partitions) - 1] = records
                total += len(records)
                remaining -= len(records)
            except errors.BrookError as e:
                must_answer = True
                out.error_code, out.error_message = e.code, e.message
                self._fill_error_context(out, fp.topic, fp.partition, e.code)
                if e.code == ErrorCode.KAFKA_STORAGE_ERROR and (
                        failed := self._partitions.get((fp.topic, fp.partition))) is not None:
                    if self._read_failed(failed, e):
                        out.error_code, out.error_message = ErrorCode.CORRUPT_MESSAGE, e.message
        return answer, total, must_answer

    def _read_failed(self, p: Partition, exc: errors.BrookError) -> bool:
        """A read of ``p``'s log failed: a read the disk refused (EIO) fails its log directory, which stops the
        broker (LogManager.dir_failed); a batch whose bytes changed on disk (``CorruptBatchError``, found by the
        read's CRC check) is ``corrupt_batch_found``'s. True when nothing stops: the fetch is answered
        CORRUPT_MESSAGE, as Kafka's consumers report such a batch."""
        corrupt = disk_failure(exc)
        if isinstance(corrupt, CorruptBatchError):
            return self.corrupt_batch_found(p, corrupt, "a fetch")
        self.log_manager.dir_failed(p.log.dir, exc)  # a read the disk refused (EIO)
        return False

    def corrupt_batch_found(self, p: Partition, corrupt: CorruptBatchError, reader: str) -> bool:
        """A batch of ``p``'s log fails its CRC: its bytes changed on disk since they were written, found by
        ``reader`` (a fetch, the log cleaner, the group coordinator's load). What is done does not depend on who
        found it. Kafka's leader sends such a batch: every consumer fails on it, a follower that needs it
        refuses it for good, and a coordinator that loads it fails at each election.

        - Other replicas in sync hold it intact: the log is marked to be cut at the batch when it is opened
          again, and the rest fetched back (``Log.mark_corrupt``). A leader also fails its log directory, which
          stops the broker, so that they take the partition over (it cannot serve the batch); a follower keeps
          following, and is repaired at its next start.
        - None: nothing stops and nothing is cut (the records after the batch are on no other replica). An
          ERROR is logged once per batch; readers of the batch get CORRUPT_MESSAGE.

        True when nothing stops."""
        others = [r for r in p.isr if r != self.node_id]
        if not others:
            key = (p.topic, p.partition, corrupt.base_offset)
            if key not in self._corrupt_reported:
                self._corrupt_reported.add(key)
                log.error("%s-%d: %s (found by %s); no other replica is in sync (ISR %s), so this one keeps the "
                          "partition and reads of that batch fail with CORRUPT_MESSAGE", p.topic, p.partition,
                          corrupt, reader, list(p.isr))
            return True
        try:
            p.log.mark_corrupt(corrupt.base_offset)
        except OSError as werr:
            log.error("%s-%d: could not mark the corrupt batch for a rescan: %s", p.topic, p.partition, werr)
        if not p.is_leader:
            log.error("%s-%d: %s (found by %s); in-sync replicas %s hold it intact: this follower's log is cut "
                      "there at its next start and fetches the rest again", p.topic, p.partition, corrupt, reader,
                      others)
            return True
        log.critical("%s-%d: %s (found by %s); in-sync replicas %s hold it intact: failing the log directory so "
                     "that they take over, and rescanning from offset %d at the next start", p.topic, p.partition,
                     corrupt, reader, others, corrupt.base_offset)
        self.log_manager.dir_failed(p.log.dir, corrupt)
        return False

    def _background_found_corrupt(self, reader: str, lg: Any, corrupt: CorruptBatchError) -> None:
        """The log cleaner (the log stays uncleanable until it is opened again) or the log scrubber found a
        corrupt batch."""
        p = self._partitions.get((lg.topic, lg.partition))
        if p is not None and p.log is lg:  # else deleted or moved meanwhile: nothing to decide
            self.corrupt_batch_found(p, corrupt, reader)

    def _deposed_leader(self, p: Partition, now: int) -> bool:
        """Is ``p``'s leadership here likely gone without this broker knowing? No controller session (the
        controller may have fenced this broker and elected another leader, and cannot tell it), and not one of the
        other replicas has fetched for ``deposed_after_ms`` (they follow that leader now). A consumer at the end
        of the log is then answered NOT_LEADER_OR_FOLLOWER, which sends it to fresh metadata, instead of waiting
        here for records that will never come: it read nothing new for good, as a producer's acks=all writes
        timed out for good before DelayedProduce answered them so. Records already here are still served. The
        active controller cut from every broker leaves every broker without a session, but followers still
        fetch from their leaders: nothing changes for their consumers."""
        if self._lease_valid() or not p.is_leader:
            return False
        others = [r for r in p.replicas if r != self.node_id]
        if not others:
            return False  # the only replica: no other can lead it
        followers = p.followers
        return all((f := followers.get(r)) is None or now - f.last_fetch_time_ms > self.deposed_after_ms
                   for r in others)

    def _stale_replica_epoch(self, req: broker_pb2.FetchRequest) -> errors.BrookError | None:
        """The refusal for a follower fetch from an older registration of its broker id (KIP-903), else None.

        Its progress must not count: a process the controller no longer knows as that broker (one
        that was replaced by a restart, or another process started with the same node.id) could
        otherwise move the high watermark over records the registered replica does not have. A
        broker epoch newer than this leader's metadata is accepted (the leader is behind, as in Kafka).
        """
        registered = self.metadata_cache.broker(req.replica_id)
        if registered is None or req.replica_epoch >= registered.broker_epoch:
            return None
        return errors.NotLeaderOrFollowerError(
            f"fetch from broker {req.replica_id} with broker epoch {req.replica_epoch}: its registered epoch is "
            f"{registered.broker_epoch} (a stale registration of that broker id); its progress is not recorded")

    def _fill_error_context(self, out: Any, topic: str, partition: int, code: int) -> None:
        if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                    ErrorCode.UNKNOWN_LEADER_EPOCH):
            out.current_leader.CopyFrom(self._current_leader(topic, partition))
        p = self._partitions.get((topic, partition))
        if p is not None and hasattr(out, "log_end_offset"):
            out.high_watermark = p.log.high_watermark
            out.log_start_offset = p.log.log_start_offset
            out.log_end_offset = p.log.log_end_offset

    def read_committed(self, topic: str, partition: int, start_offset: int, max_bytes: int) -> Any:
        """Committed data (below the HW) of a partition this broker leads: a storage FetchData."""
        p = self.leader_partition(topic, partition)
        return p.read_for_consumer(start_offset, max_bytes, -1, True)

    # ---- DeleteRecords / log dirs ----
    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Advance the log start offset of a partition this broker leads to ``offset`` (-1: the high
        watermark); returns the new log start. Only committed records can be deleted; followers follow
        the leader's log start through their fetches."""
        result = self.delete_records_of([(topic, partition, offset)])[0]
        if isinstance(result, errors.BrookError):
            raise result
        return result

    def delete_records_of(self, entries: list[tuple[str, int, int]]) -> list[int | errors.BrookError]:
        """``delete_records`` for each (topic, partition, offset), in one go: the log start checkpoint, which
        lists every partition of this broker, is written once for all of them (it was written for each, and one
        request naming a partition a thousand times made 4,000 fsyncs: audit). Each entry's new log start, or
        the error that refused it."""
        out: list[int | errors.BrookError] = []
        moved = False
        for topic, partition, offset in entries:
            try:
                before, start = self._move_log_start(topic, partition, offset)
            except errors.BrookError as e:
                out.append(e)
                continue
            moved = moved or start != before
            out.append(start)
        if moved:
            self.log_manager.checkpoint_log_start_offsets()  # a restart must not bring the records back
        return out

    def _move_log_start(self, topic: str, partition: int, offset: int) -> tuple[int, int]:
        p = self.leader_partition(topic, partition)
        lg = p.log
        if not lg.config.delete:
            # As Kafka (Partition.deleteRecordsOnLeader): a compacted topic's records are its state (a table),
            # deleted only by the cleaner; "compact,delete" allows it.
            raise errors.PolicyViolationError(
                f"Records of partition {topic}-{partition} can not be deleted due to the configured policy "
                f"(cleanup.policy={','.join(lg.config.cleanup_policy)})")
        hw = lg.high_watermark
        target = hw if offset == DELETE_TO_HIGH_WATERMARK else offset
        if target < 0 or target > hw:
            raise errors.OffsetOutOfRangeError(
                f"{topic}-{partition}: cannot delete records before offset {offset}: it must be between 0 and the "
                f"high watermark {hw}")
        before = lg.log_start_offset
        lg.set_log_start_offset(target)
        if lg.log_start_offset != before:
            log.info("%s-%d: log start offset %d -> %d (DeleteRecords)", topic, partition, before,
                     lg.log_start_offset)
        return before, lg.log_start_offset

    def active_producers(self, topic: str, partition: int) -> list[tuple[int, int, int, int, int, int]]:
        """The idempotent producers a replica of this broker tracks (Log.active_producers): the leader's, or a
        follower's as far as it has copied (Kafka answers DescribeProducers on any replica, for its --broker-id)."""
        p = self._partitions.get((topic, partition))
        if p is None:
            return self.leader_partition(topic, partition).log.active_producers()  # raises the specific error
        return p.log.active_producers()

    def low_watermark(self, topic: str, partition: int) -> int:
        return self.leader_partition(topic, partition).low_watermark()

    def describe_log_dirs(self, topics: set[str] | None) -> list[broker_pb2.LogDirDescription]:
        """Each log directory with the partitions in it (all, or those of ``topics``)."""
        out = []
        for directory, logs in self.log_manager.by_dir().items():
            desc = broker_pb2.LogDirDescription(path=str(directory), total_bytes=-1, usable_bytes=-1)
            try:
                usage = shutil.disk_usage(directory)
                desc.total_bytes, desc.usable_bytes = usage.total, usage.free
            except OSError as exc:
                desc.error_code = ErrorCode.KAFKA_STORAGE_ERROR
                desc.error_message = f"{directory}: {exc}"
            for (topic, index), lg in sorted(logs.items()):
                if topics is not None and topic not in topics:
                    continue
                p = self._partitions.get((topic, index))
                hw, leo = lg.high_watermark, lg.log_end_offset
                desc.partitions.add(topic=topic, partition=index, size_bytes=lg.size_bytes,
                                    offset_lag=max(0, hw - leo), log_start_offset=lg.log_start_offset,
                                    high_watermark=hw, log_end_offset=leo,
                                    is_leader=p is not None and p.is_leader, segments=len(lg.segments()))
            out.append(desc)
        return out

    # ---- list offsets / epochs ----
    def list_offsets(self, req: broker_pb2.ListOffsetsRequest) -> broker_pb2.ListOffsetsResponse:
        resp = broker_pb2.ListOffsetsResponse()
        # A partition named more than once is looked up for none of its entries: each gets INVALID_REQUEST,
        # as Kafka answers (KafkaApis.handleListOffsetRequest, ``duplicatePartitions``). A lookup may read
        # its log (a timestamp, MAX_TIMESTAMP), and one request naming a partition with a thousand
        # timestamps read it a thousand times (found by an audit); no client needs two answers at once.
        named = Counter((lp.topic, lp.partition) for lp in req.partitions)
        from_replica = req.replica_id >= 0
        refusal = None if from_replica else _isolation_refusal(req.isolation_level)
        read_committed = not from_replica and req.isolation_level == READ_COMMITTED
        for lp in req.partitions:
            out = resp.partitions.add(topic=lp.topic, partition=lp.partition, timestamp=-1, offset=-1,
                                      leader_epoch=-1)
            try:
                if refusal is not None:
                    raise refusal
                refuse_repeated(named, lp.topic, lp.partition, "ListOffsets")
                p = self.leader_partition(lp.topic, lp.partition)
                p.check_leader(lp.current_leader_epoch)
                out.offset, out.timestamp, out.leader_epoch = self._offset_for(p, lp.timestamp, from_replica,
                                                                               read_committed)
            except errors.BrookError as e:
                out.error_code, out.error_message = e.code, e.message
                if e.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                              ErrorCode.UNKNOWN_LEADER_EPOCH):
                    out.current_leader.CopyFrom(self._current_leader(lp.topic, lp.partition))
        return resp

    def _offset_for(self, p: Partition, ts: int, from_replica: bool,
                    read_committed: bool = False) -> tuple[int, int, int]:
        """(offset, timestamp, leader epoch) that ListOffsets answers for ``ts``, as Kafka's
        ``Partition.fetchOffsetForTimestamp``: the epoch is the one of the answer's offset, for a client's
        KIP-320 check of it (OffsetsForLeaderEpoch), not the partition's current one. Earliest: the epoch of
        the log start (the leader epoch cache's first entry); latest: the current leader epoch; a timestamp
        and MAX_TIMESTAMP: the partition leader epoch of the batch holding the record found; nothing found:
        (-1, -1, -1). EARLIEST_LOCAL is the earliest (no tiered storage); LATEST_TIERED finds nothing.
        Kafka's last fetchable offset bounds latest, MAX_TIMESTAMP and timestamps: the log end for a replica,
        the last stable offset for a read_committed consumer, else the high watermark."""
        lg = p.log
        bound = lg.log_end_offset if from_replica else lg.last_stable_offset if read_committed else lg.high_watermark
        if ts in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            # the sentinel always answers
            return lg.lookup_timestamp(EARLIEST_TIMESTAMP) or (lg.log_start_offset, -1, -1)
        if ts == LATEST_TIERED_TIMESTAMP:
            return -1, -1, -1  # nothing is in remote storage (Kafka's answer when it is not enabled)
        if not from_replica and lg.high_watermark < p.leader_epoch_start_offset:
            # A new leader whose HW has not yet caught up with what the previous leader had
            # committed (KIP-207): answering now could move "latest" backwards. Retriable.
            raise errors.error_class(ErrorCode.OFFSET_NOT_AVAILABLE)(
                f"{p.topic}-{p.partition}: leader's high watermark {lg.high_watermark} is still below its epoch "
                f"start {p.leader_epoch_start_offset}")
        if ts == LATEST_TIMESTAMP:
            return bound, -1, p.leader_epoch
        if ts == MAX_TIMESTAMP:
            return _max_timestamp_lookup(lg, bound)
        if ts < 0:
            raise errors.InvalidRequestError(f"invalid ListOffsets timestamp {ts}")
        found = lg.lookup_timestamp(ts)
        if found is None or found.offset >= bound:
            return -1, -1, -1
        return found.offset, found.timestamp, found.leader_epoch

    def offsets_for_leader_epoch(self, req: broker_pb2.OffsetsForLeaderEpochRequest
                                 ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        resp = broker_pb2.OffsetsForLeaderEpochResponse()
        for op in req.partitions:
            out = resp.partitions.add(topic=op.topic, partition=op.partition, leader_epoch=-1, end_offset=-1)
            try:
                p = self.leader_partition(op.topic, op.partition)
                p.check_leader(op.current_leader_epoch)
                out.leader_epoch, out.end_offset = p.log.end_offset_for_epoch(op.leader_epoch)
            except errors.BrookError as e:
                out.error_code, out.error_message = e.code, e.message
        return resp

    # ---- ISR maintenance ----
    def _isr_loop(self) -> None:
        interval_s = max(0.05, self.replica_lag_time_max_ms / 2000)
        last = now_ms()
        while not self._stopped.wait(interval_s):
            now = now_ms()
            # Time this broker itself did not run (its process stopped, its host paused) is not the followers'
            # lag: they could not fetch from it. Without this, every leader resumed after a pause longer than
            # replica.lag.time.max.ms proposed to shrink each ISR to itself (and, below min.insync.replicas,
            # had its leadership moved instead). Only the time past the loop's own interval is forgiven (see
            # own_stall_ms): a merely slow loop still ages the followers.
            excess_ms = isr_rules.own_stall_ms(last, now, int(interval_s * 1000))
            last = now
            if excess_ms >= ISR_LOOP_STALL_WARN_S * 1000:
                log.warning("broker %d: the ISR check ran %.1f s late (a paused process or host?); followers' catch-up "
                            "times move on by as much, as they could not fetch from this broker meanwhile",
                            self.node_id, excess_ms / 1000)
            for p in list(self._partitions.values()):
                try:
                    if excess_ms > 0:
                        p.forgive_followers(excess_ms, now)
                    proposal = p.maybe_shrink_isr(now, self.replica_lag_time_max_ms)
                except Exception:
                    log.exception("ISR check of %s-%d failed", p.topic, p.partition)
                    continue
                if proposal is not None:
                    self._alter.submit(proposal)

    def apply_alter_result(self, result: controller_pb2.AlterPartitionResult, proposal: IsrProposal) -> None:
        p = self._partitions.get((result.topic, result.partition))
        if p is None:
            return
        if result.error_code != ErrorCode.NONE:
            log.info("%s-%d: AlterPartition refused: %s %s", result.topic, result.partition,
                     errors.code_name(result.error_code), result.error_message)
            st = result.partition_state
            current = (tuple(st.isr), st.leader_epoch, st.partition_epoch, tuple(st.replicas)) \
                if result.HasField("partition_state") else None
            p.alter_refused(proposal, current, now_ms())
            self._complete_delayed(p.key)
            return
        st = result.partition_state
        if p.apply_committed_state(tuple(st.isr), st.leader_epoch, st.partition_epoch, tuple(st.replicas), now_ms()):
            self._complete_delayed(p.key)
        else:
            self._complete_delayed(p.key)  # ISR size changed: waiting acks=all re-check min ISR

    # ---- internal topics ----
    def ensure_internal_topic(self, name: str, partitions: int, replication_factor: int,
                              configs: Mapping[str, str], *, timeout_s: float = 15.0) -> None:
        if self.metadata_cache.topic(name) is None:
            req = controller_pb2.CreateTopicsRequest(topics=[controller_pb2.CreatableTopic(
                name=name, num_partitions=partitions, replication_factor=replication_factor,
                configs=dict(configs))], timeout_ms=int(timeout_s * 1000))
            resp = self.controller_client.call("CreateTopics", req, timeout_s=timeout_s)
            for r in resp.results:
                if r.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    errors.raise_for(r.error_code, r.error_message)
        if not self.metadata_cache.wait_for(lambda c: c.topic(name) is not None, timeout_s):
            raise errors.RequestTimedOutError(f"topic {name} did not appear in metadata within {timeout_s}s")

    # ---- stats ----
    def delayed_operations(self) -> dict[str, int]:
        """Requests waiting now: acks=all produces, and follower and consumer long polls (a follower's
        on its ReplicaFetch stream waits in its fetch session, not in the purgatory)."""
        counts = {"produce": 0, "follower_fetch": self.fetch_sessions.parked(), "consumer_fetch": 0}
        for purgatory in (self.produce_purgatory, self.fetch_purgatory):
            for kind, n in purgatory.delayed_operations().items():
                counts[kind] = counts.get(kind, 0) + n
        return counts

    def stats(self) -> list[PartitionStats]:
        out = []
        for p in list(self._partitions.values()):
            lg = p.log
            out.append(PartitionStats(
                p.topic, p.partition, p.is_leader, p.leader_epoch, list(p.isr), list(p.replicas),
                lg.high_watermark, lg.log_end_offset, lg.log_start_offset, lg.size_bytes,
                p.messages_in_total, p.bytes_in_total, p.bytes_out_total, p.isr_shrinks_total,
                p.isr_expands_total, p.under_replicated, p.under_min_isr,
                invalid_appends_total=lg.invalid_appends_total))
        return out


def refuse_repeated(named: Counter[tuple[str, int]], topic: str, partition: int, api: str) -> None:
    """INVALID_REQUEST for an entry of a partition the request names more than once (``named``: how often it names
    each), as Kafka answers ListOffsets' ``duplicatePartitions``: no client needs two answers at once, and each copy
    was work (a read, a log start move) done again."""
    times = named[(topic, partition)]
    if times > 1:
        raise errors.InvalidRequestError(f"{topic}-{partition} is named {times} times in one {api} request: a "
                                         "partition may be named once")


def _isolation_refusal(isolation_level: int) -> errors.BrookError | None:
    """INVALID_REQUEST for an isolation level that is neither read_uncommitted (0) nor read_committed (1): Kafka's
    parser refuses it (``IsolationLevel.forId``)."""
    if isolation_level in (READ_UNCOMMITTED, READ_COMMITTED):
        return None
    return errors.InvalidRequestError(f"unknown isolation level {isolation_level} (0 read_uncommitted, 1 "
                                      "read_committed)")


def one_entry_per_partition(req: broker_pb2.FetchRequest) -> broker_pb2.FetchRequest:
    """``req`` with one entry per partition: a partition named again keeps its first entry's place and takes its
    last entry's fields, as Kafka's FetchRequest.fetchData map does, and the answer names it once. Each entry
    is a read: a Fetch naming one partition a thousand times read it a thousand times (found by an audit)."""
    last: dict[tuple[str, int], broker_pb2.FetchPartition] = {}
    for fp in req.partitions:
        last[(fp.topic, fp.partition)] = fp  # a dict keeps a key's first place when its value is replaced
    if len(last) == len(req.partitions):
        return req
    out = broker_pb2.FetchRequest()
    out.CopyFrom(req)
    del out.partitions[:]
    out.partitions.extend(last.values())
    return out


def _max_timestamp_lookup(lg: Any, bound: int) -> tuple[int, int, int]:
    """Offset, timestamp and batch leader epoch of the record with the largest timestamp below ``bound``
    (KIP-734), or (-1, -1, -1).

    The answer: among the non-control batches wholly below ``bound``, from the one holding the log
    start on, the one with the largest max timestamp (the earliest on a tie), then the first record
    in it carrying that timestamp. Walking every batch header from the log start read up to
    MAX_TIMESTAMP_SCAN_BYTES per request entry (gigabytes for a cheap request naming many
    partitions) and answered wrong past it; every segment already knows its largest timestamp and
    the first batch reaching it, so ``_MaxTimestampSearch`` reads one batch, plus a short scan for
    the segment crossing ``bound`` when that segment could hold the answer.

    Retention or DeleteRecords moving the log start while we look makes a read refuse an offset
    now below it: the lookup starts again from the new log start.
    """
    for attempt in range(_MAX_TIMESTAMP_ATTEMPTS):
        try:
            return _MaxTimestampSearch(lg, bound).run()
        except errors.OffsetOutOfRangeError:
            if attempt == _MAX_TIMESTAMP_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


class _MaxTimestampSearch:
    """One MAX_TIMESTAMP lookup, on a snapshot of the segment list, reading through ``Log.read``.

    Segments are visited best first by an upper bound of what each can answer: (its largest
    timestamp, its base offset). Segments do not overlap, so the first exact answer popped is the
    answer, and a segment whose largest timestamp cannot beat it is never read. Popped, a segment
    answers from its metadata (one batch read, to check it) when the first batch reaching its
    largest timestamp is in range and not a control batch: every batch before that one has a
    smaller timestamp. Otherwise (the segment crosses ``bound`` and its largest timestamp is in
    the uncommitted tail, it holds the log start, or that batch is a control batch) it is scanned,
    starting near ``bound`` when its indexes allow (``_scan_segment``); the scan's result goes back
    in the heap as an exact entry.

    Concurrency: the log appends, rolls, truncates and deletes segments meanwhile. ``bound`` was
    read before the segment list, so every batch below it was appended, indexed and observed by
    its segment's largest timestamp before we read it; what we read from a segment (its fields,
    its indexes) is only a hint, checked against the batch ``Log.read`` returns, and any mismatch
    (a field torn by an append, a segment truncated, compacted or deleted under us) falls back to
    a scan, which reads the log as it now is. Reads of a segment deleted under us are retried by
    ``Log.read`` on a fresh snapshot.
    """

    def __init__(self, lg: Any, bound: int) -> None:
        self.lg = lg
        self.bound = bound
        self.start = lg.log_start_offset
        self.budget = MAX_TIMESTAMP_SCAN_BYTES  # bytes this lookup may still read

    def run(self) -> tuple[int, int, int]:
        # (-timestamp, offset, tie breaker, segment, first batch reaching the timestamp, batch bytes):
        # a segment's upper bound (batch None) or a scanned segment's exact winner (batch set).
        heap: list[tuple[int, int, int, Any, int, bytes | None]] = []
        for seg in self.lg.segments():
            ts = seg.max_timestamp  # read before the offset: an append updates them in that order
            at = seg.offset_of_max_timestamp
            # max_timestamp -1: no batch with a timestamp (the scan never picked those either)
            if ts >= 0 and seg.next_offset > self.start and seg.base_offset < self.bound:
                heap.append((-ts, seg.base_offset, len(heap), seg, at, None))
        heapq.heapify(heap)
        tie = len(heap)
        while heap:
            neg_ts, _offset, _tie, seg, at, batch = heapq.heappop(heap)
            if batch is None:
                batch = self._batch_at(at, -neg_ts, max(self.start, seg.base_offset))
                if batch is None:
                    found = self._scan_segment(seg)
                    if found is not None:
                        heapq.heappush(heap, (-found[0], read_header(found[1], 0).base_offset, tie, None, 0,
                                              found[1]))
                        tie += 1
                    continue
            return _record_with_max_timestamp(batch)
        return -1, -1, -1

    def _read(self, offset: int, max_bytes: int, stop: int) -> bytes:
        data = self.lg.read(offset, max_bytes, max_offset=stop, min_one_batch=True)
        records = bytes(data.records)
        self.budget -= len(records)
        return records

    def _batch_at(self, offset: int, timestamp: int, start: int) -> bytes | None:
        """The batch at ``offset`` if it is in range, has this max timestamp and is no control batch."""
        if not start <= offset < self.bound:
            return None
        # max_bytes 0: exactly the one batch holding offset (not gated by the budget: one batch)
        batch = self._read(offset, 0, self.bound)
        if not batch:
            return None  # it ends at or past the bound
        h = read_header(batch, 0)
        if h.base_offset != offset or h.max_timestamp != timestamp or h.is_control:
            return None
        return batch

    def _scan_segment(self, seg: Any) -> tuple[int, bytes] | None:
        """(max timestamp, batch) of the best batch of ``seg`` in range, or None, reading little.

        A time index entry (t, o) says: batch o is the first whose max timestamp reaches t, all
        earlier batches of the segment are below t. Every offset index entry p was written with a
        time index entry for the largest timestamp up to batch p (``LogSegment._index_batch``),
        unless the time index was full or that timestamp was not positive. So with (t, o) the last
        time index entry before the bound, t > 0, and p the last offset index entry before the
        bound: no batch in [o, p] is above t, and the best batch is batch o or one in [p, bound).
        Anything unexpected (batch o a control batch, indexes changed under us) scans the segment.
        """
        start = max(self.start, seg.base_offset)
        stop = min(self.bound, seg.next_offset)
        if start >= stop:
            return None
        hints = _max_timestamp_hints(seg, stop)
        if hints is None:
            return self._scan(start, stop)
        t, o, p = hints
        if o < start:
            return self._scan(start, stop)  # the log start is past batch o: nothing known after it
        tail_from = max(o, p)
        tail = self._scan(tail_from, stop)
        if tail is not None and (tail[0] > t or (tail[0] == t and tail_from == o)):
            return tail
        if tail_from > o:
            batch = self._batch_at(o, t, start)
            if batch is not None:
                return t, batch
        return self._scan(start, stop)

    def _scan(self, start: int, stop: int) -> tuple[int, bytes] | None:
        """The header walk over [start, stop): (max timestamp, batch) of the best non-control batch."""
        best_ts, best = -1, None
        pos = start
        while pos < stop and self.budget > 0:
            records = self._read(pos, MAX_TIMESTAMP_READ_BYTES, stop)
            if not records:
                break
            last_next = pos
            for off, h in iter_batches(records):
                if h.max_timestamp > best_ts and not h.is_control:
                    best_ts, best = h.max_timestamp, records[off:off + h.size]
                last_next = h.next_offset
            if last_next <= pos:
                break
            pos = last_next
        return None if best is None else (best_ts, best)


def _max_timestamp_hints(seg: Any, stop: int) -> tuple[int, int, int] | None:
    """(t, o, p) for ``_MaxTimestampSearch._scan_segment``: the last time index entry (t, o) of
    ``seg`` before ``stop``, and p the last offset index entry before ``stop``, or o when that
    entry cannot be trusted to bound the batches before it (time index full). None when there is
    no usable time index entry.

    The time index has no search by offset: a binary search on its entries (offsets increase with
    timestamps). It is read without its lock: a roll may remap it and a truncation zero entries
    under us, and an index is only a hint, so any error, or an entry that looks wrong, means no hint.
    """
    ti = seg.time_index
    try:
        lo, hi, found = 0, ti.entries - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            e = ti.entry(mid)
            if e.offset < stop:
                found, lo = e, mid + 1
            else:
                hi = mid - 1
        if found is None or found.timestamp <= 0 or found.offset < seg.base_offset:
            return None
        p = found.offset
        if not ti.is_full():
            p = max(p, seg.index.lookup(stop - 1).offset)
    except (OSError, ValueError, TypeError, struct.error):
        return None
    return found.timestamp, found.offset, p


def _record_with_max_timestamp(batch: bytes) -> tuple[int, int, int]:
    """(offset, timestamp, leader epoch) of the first record of ``batch`` carrying the batch's max timestamp:
    the epoch is the batch's partition leader epoch (-1 when it has none), as Kafka answers MAX_TIMESTAMP."""
    header, records = decode_batch(batch)
    epoch = max(header.partition_leader_epoch, -1)
    for r in records:
        if r.timestamp == header.max_timestamp:
            return r.offset, r.timestamp, epoch
    return header.last_offset, header.max_timestamp, epoch


class _AlterPartitionSender:
    """Sends ISR proposals to the controller, batched; one in flight per partition (the Partition's pending_isr)."""

    def __init__(self, rm: ReplicaManager) -> None:
        self._rm = rm
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, int], IsrProposal] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"alter-partition-{rm.node_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def submit(self, proposal: IsrProposal) -> None:
        with self._cond:
            self._pending[(proposal.topic, proposal.partition)] = proposal
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch = list(self._pending.values())[:1000]
                for pr in batch:
                    del self._pending[(pr.topic, pr.partition)]
            req = controller_pb2.AlterPartitionRequest(
                broker_id=self._rm.node_id, broker_epoch=self._rm._broker_epoch(),
                items=[controller_pb2.AlterPartitionItem(topic=pr.topic, partition=pr.partition,
                                                         leader_epoch=pr.leader_epoch,
                                                         partition_epoch=pr.partition_epoch,
                                                         new_isr=list(pr.new_isr)) for pr in batch])
            try:
                resp = self._rm.controller_client.call("AlterPartition", req, timeout_s=10)
            except Exception as e:
                log.warning("AlterPartition of %d partitions: no answer (%s); sending again", len(batch), e)
                self._retry(batch)
                continue
            if resp.error_code != ErrorCode.NONE:
                log.warning("AlterPartition refused: %s %s", errors.code_name(resp.error_code), resp.error_message)
            by_key = {(pr.topic, pr.partition): pr for pr in batch}
            for result in resp.results:
                pr = by_key.pop((result.topic, result.partition), None)
                if pr is None:
                    continue
                try:
                    self._rm.apply_alter_result(result, pr)
                except Exception:
                    log.exception("applying AlterPartition result for %s-%d failed", result.topic,
                                  result.partition)
            if by_key:  # not answered: the outcome is unknown
                self._retry(list(by_key.values()))

    def _retry(self, unanswered: list[IsrProposal]) -> None:
        """Send again, after a pause, the proposals whose outcome is unknown and still pending: the
        pending ISR stays until the controller's answer (or newer metadata) settles it."""
        again = []
        for pr in unanswered:
            p = self._rm.partition(pr.topic, pr.partition)
            if p is not None and p.alter_outcome_unknown(pr):
                again.append(pr)
        with self._cond:
            for pr in again:
                self._pending.setdefault((pr.topic, pr.partition), pr)
            if not self._stopped:
                self._cond.wait(timeout=ALTER_RETRY_BACKOFF_S)
