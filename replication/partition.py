"""One hosted partition replica: its log, its role, and (as leader) its followers' progress.

The partition is leader or follower exactly as the latest metadata says. As leader it
takes appends stamped with its leader epoch, tracks each follower's log end offset from
their fetches, moves the high watermark (HW) over the maximal ISR, and proposes ISR
changes — which it only *believes* once the controller has committed them. As follower
it is written only by the replica fetcher (replication/fetcher.py).

Thread-safety: every state change and every leader append happens under ``self.lock``;
reads of the log go straight to the (thread-safe) Log.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from proto import errors
from replication import isr as isr_rules
from replication.isr import UNKNOWN_OFFSET, FollowerProgress
from storage.file_records import FileRecords
from storage.log import FetchData, WouldBlock
from storage.record_batch import BATCH_HEADER_SIZE, LOG_OVERHEAD, MIN_BATCH_LENGTH

# A consumer's isolation level (Kafka's IsolationLevel): what Fetch and ListOffsets carry.
READ_UNCOMMITTED, READ_COMMITTED = 0, 1

log = logging.getLogger(__name__)


class ReplicationInvariantError(Exception):
    """A programming error in the replication state (HW past the LEO, leader epoch going back).

    Not a ``BrookError``: it is never a client's fault, and the caller must not clamp it
    away or mistake it for a routine refusal.
    """


class LockBusy(WouldBlock):
    """A non-blocking partition call (the broker's event loop) found the partition lock held, or
    an append would wait for its producer's earlier batch: nothing was changed."""


@contextlib.contextmanager
def held(lock: Any, blocking: bool) -> Iterator[None]:
    """Hold ``lock``; without ``blocking``, ``LockBusy`` at once when another thread holds it."""
    if not lock.acquire(blocking=blocking):
        raise LockBusy
    try:
        yield
    finally:
        lock.release()


class Role(enum.Enum):
    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class IsrProposal:
    topic: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(slots=True)
class FollowerFetchResult:
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    diverging_epoch: tuple[int, int] | None
    hw_changed: bool
    isr_proposal: IsrProposal | None


@dataclass
class CommittedFetchData(FetchData):
    """A read_committed consumer's read: records below the last stable offset, that LSO (the bound the read used),
    and the aborted transactions overlapping the records returned, each (producer id, first offset)."""

    last_stable_offset: int = -1
    aborted_transactions: list[tuple[int, int]] = field(default_factory=list)


_OFFSET_AND_LENGTH = struct.Struct(">qi")  # a batch's base offset and length
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23  # base offset, length, leader epoch, magic, crc, attributes
_HEAD_BYTES = _LAST_OFFSET_DELTA_AT + _LAST_OFFSET_DELTA.size
_SLICE_SCAN_BYTES = 64 * 1024
_SMALL_BATCH_BYTES = 4 * 1024  # batches up to this size: a window holds the next headers too


def records_end_offset(records: bytes) -> int:
    """One past the last offset of the whole batches in ``records`` (bytes, or a FileRecords slice of a segment,
    whose batch headers are read from the file a window at a time); -1 when it holds none. Only the headers'
    base offset, length and last offset delta are read (the log checked the batches when it read them)."""
    if isinstance(records, FileRecords):
        return _slice_end_offset(records)
    end, pos, size = -1, 0, len(records)
    while size - pos >= BATCH_HEADER_SIZE:
        base, length = _OFFSET_AND_LENGTH.unpack_from(records, pos)
        if length < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + length > size:
            break
        end = base + _LAST_OFFSET_DELTA.unpack_from(records, pos + _LAST_OFFSET_DELTA_AT)[0] + 1
        pos += LOG_OVERHEAD + length
    return end


def _slice_end_offset(records: FileRecords) -> int:
    """``records_end_offset`` of a slice: small batches' headers a 64 KiB window at a time, a large batch's
    alone (a read per batch of the few bytes needed, not of the batch)."""
    end, pos, size = -1, 0, records.length
    window, at = b"", 0  # bytes of the slice from ``at``
    length = 0
    while size - pos >= BATCH_HEADER_SIZE:
        if pos + _HEAD_BYTES > at + len(window):
            want = _HEAD_BYTES if length > _SMALL_BATCH_BYTES else _SLICE_SCAN_BYTES
            window, at = os.pread(records.fd, min(want, size - pos), records.position + pos), pos
            if len(window) < _HEAD_BYTES:
                break
        base, length = _OFFSET_AND_LENGTH.unpack_from(window, pos - at)
        if length < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + length > size:
            break
        end = base + _LAST_OFFSET_DELTA.unpack_from(window, pos - at + _LAST_OFFSET_DELTA_AT)[0] + 1
        pos += LOG_OVERHEAD + length
    return end


class Partition:
    def __init__(self, topic: str, partition: int, topic_id: str, log_: Any, local_id: int, *,
                 broker_usable: Callable[[int], bool]) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.log = log_
        self.local_id = local_id
        self._broker_usable = broker_usable
        self.lock = threading.RLock()
        # Notified on every leader append and role change (with ``lock`` held): an idempotent
        # batch that arrived ahead of its predecessor waits on it (see ReplicaManager).
        self.appended = threading.Condition(self.lock)
        self.role = Role.NONE
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.pending_isr: tuple[int, ...] | None = None  # in-flight AlterPartition
        self.leader_epoch_start_offset = 0
        self.followers: dict[int, FollowerProgress] = {}
        # Bumped on every HW move and role change: long-polling consumer fetches compare it to
        # know whether anything happened while they were registering. Not on appends: a
        # consumer reads below the HW, so an append gives it nothing until the HW moves (its
        # own bump), and waking every parked consumer at each append cost each a re-read.
        # Also on a transaction marker's append (``markers_appended``): it decides a transaction, so the
        # last stable offset (a read_committed consumer's bound) moves, once the HW passes the marker.
        self.change_seq = 0
        # Bumped on appends and role changes only. A follower's long poll waits on this one:
        # a HW move alone gives it nothing to replicate (it learns the HW with its next data),
        # and waking it would cost a thread switch and a re-read on every acks=all commit.
        self.data_seq = 0
        self.messages_in_total = 0
        self.bytes_in_total = 0
        self.bytes_out_total = 0
        self.isr_shrinks_total = 0
        self.isr_expands_total = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def maximal_isr(self) -> tuple[int, ...]:
        if self.pending_isr is None:
            return self.isr
        return tuple(sorted(set(self.isr) | set(self.pending_isr)))

    # ---- role changes (from metadata) ----
    def make_leader(self, replicas: tuple[int, ...], isr: tuple[int, ...], leader_epoch: int,
                    partition_epoch: int, now_ms: int) -> bool:
        """Become (or stay) leader. True if this is a new leadership (new epoch)."""
        with self.lock:
            if leader_epoch < self.leader_epoch:
                # Metadata is applied in version order and leader epochs only grow: an older epoch
                # here is a bug upstream, not a new leadership to take on.
                raise ReplicationInvariantError(
                    f"{self.topic}-{self.partition}: asked to lead at epoch {leader_epoch}, "
                    f"older than the current {self.leader_epoch}")
            new_term = self.role is not Role.LEADER or leader_epoch != self.leader_epoch
            if not new_term and partition_epoch <= self.partition_epoch:
                return False  # nothing newer than what we hold (an AlterPartition may be in flight)
            self.role = Role.LEADER
            self.leader_id = self.local_id
            self.replicas = replicas
            if not new_term and self.is_leader and set(isr) != set(self.isr):
                self.isr_shrinks_total += 1 if set(self.isr) - set(isr) else 0
                self.isr_expands_total += 1 if set(isr) - set(self.isr) else 0
            self.isr = isr
            self.partition_epoch = partition_epoch
            self.pending_isr = None
            if new_term:
                self._check_hw()
                self.leader_epoch = leader_epoch
                leo = self.log.log_end_offset
                if self.log.latest_epoch < leader_epoch:
                    self.log.assign_epoch_start_offset(leader_epoch, leo)
                self.leader_epoch_start_offset = leo
                self.followers = {}
            self._sync_followers(now_ms)
            self._maybe_increment_hw()
            self.change_seq += 1
            self.data_seq += 1
            self.appended.notify_all()
            return new_term

    def _sync_followers(self, now_ms: int) -> None:
        """Follower progress for exactly the current replicas (new ones start unknown). Caller holds the lock."""
        for rid in self.replicas:
            if rid != self.local_id and rid not in self.followers:
                f = FollowerProgress(rid)
                f.reset(now_ms, rid in self.isr)
                self.followers[rid] = f
        for rid in [r for r in self.followers if r not in self.replicas]:
            del self.followers[rid]

    def make_follower(self, leader_id: int, replicas: tuple[int, ...], isr: tuple[int, ...],
                      leader_epoch: int, partition_epoch: int) -> bool:
        """Become (or stay) follower. True if the leader or its epoch changed (fetcher must restart)."""
        with self.lock:
            changed = (self.role is not Role.FOLLOWER or leader_id != self.leader_id
                       or leader_epoch != self.leader_epoch)
            self.role = Role.FOLLOWER
            self.leader_id = leader_id
            self.leader_epoch = leader_epoch
            self.partition_epoch = partition_epoch
            self.replicas = replicas
            self.isr = isr
            self.pending_isr = None
            self.followers = {}
            self.change_seq += 1
            self.data_seq += 1
            self.appended.notify_all()
            return changed

    def make_offline(self) -> None:
        with self.lock:
            self.role = Role.NONE
            self.leader_id = -1
            self.followers = {}
            self.pending_isr = None
            self.change_seq += 1
            self.data_seq += 1
            self.appended.notify_all()

    def apply_committed_state(self, isr: tuple[int, ...], leader_epoch: int, partition_epoch: int,
                              replicas: tuple[int, ...] | None = None, now_ms: int = 0) -> bool:
        """A committed state of the current leadership (from an AlterPartition answer). True if the HW
        moved. ``replicas`` come with it: a reassignment changes them without a new leader epoch, and
        the partition epoch taken here would otherwise hide that change when the metadata arrives."""
        with self.lock:
            if leader_epoch != self.leader_epoch or partition_epoch < self.partition_epoch:
                return False
            if partition_epoch == self.partition_epoch and self.pending_isr is None:
                return False
            old = self.isr
            self.isr = isr
            self.partition_epoch = partition_epoch
            self.pending_isr = None
            if replicas and tuple(replicas) != tuple(self.replicas):
                self.replicas = tuple(replicas)
                if self.is_leader:
                    self._sync_followers(now_ms)
            if self.is_leader:
                shrunk = set(old) - set(isr)
                grown = set(isr) - set(old)
                self.isr_shrinks_total += 1 if shrunk else 0
                self.isr_expands_total += 1 if grown else 0
                if shrunk or grown:
                    log.info("%s-%d ISR %s -> %s (partition epoch %d)", self.topic, self.partition,
                             list(old), list(isr), partition_epoch)
                return self._maybe_increment_hw()
            return False

    def clear_pending_isr(self) -> None:
        with self.lock:
            self.pending_isr = None

    # ---- AlterPartition outcomes (KIP-497/841): the pending ISR goes only when the answer is known ----
    def alter_outcome_unknown(self, proposal: IsrProposal) -> bool:
        """No answer to ``proposal`` (lost response, timeout, controller failover): the controller may
        have committed it, so the pending ISR stays (the HW keeps counting a member being added).
        True if the proposal is still this leader's to resolve: send it again. A retry of a change
        that did commit is refused INVALID_UPDATE_VERSION with the current state (alter_refused)."""
        with self.lock:
            return (self.is_leader and self.pending_isr == proposal.new_isr
                    and self.leader_epoch == proposal.leader_epoch
                    and self.partition_epoch == proposal.partition_epoch)

    def alter_refused(self, proposal: IsrProposal, current: tuple[Any, ...] | None, now_ms: int = 0) -> bool:
        """The controller refused ``proposal``; ``current`` is its committed (isr, leader epoch,
        partition epoch[, replicas]) when it sent one. A newer state of this leadership is taken as
        committed (an earlier attempt of this very change may be in it); otherwise nothing was applied
        and the pending ISR is dropped (the next check proposes again). True if the HW moved."""
        with self.lock:
            if current is not None:
                isr, leader_epoch, partition_epoch = current[:3]
                replicas = current[3] if len(current) > 3 else None
                if leader_epoch == self.leader_epoch and partition_epoch > self.partition_epoch:
                    return self.apply_committed_state(isr, leader_epoch, partition_epoch, replicas, now_ms)
            if self.pending_isr == proposal.new_isr and self.partition_epoch == proposal.partition_epoch:
                self.pending_isr = None
            return False

    # ---- leader: appends ----
    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise unless this replica leads at ``current_leader_epoch`` (-1 = any).

        The epoch is checked first, on any replica, as Kafka's ``Partition.getLocalLog`` does: a client
        behind this replica's epoch is told FENCED_LEADER_EPOCH (its metadata is stale: refresh it), one
        ahead UNKNOWN_LEADER_EPOCH (this replica is behind: retry), and only a client at this replica's
        epoch NOT_LEADER_OR_FOLLOWER when it is not the leader."""
        self.check_leader_epoch(current_leader_epoch)
        if self.role is not Role.LEADER:
            raise errors.NotLeaderOrFollowerError(
                f"broker {self.local_id} is not the leader of {self.topic}-{self.partition}")

    def check_leader_epoch(self, current_leader_epoch: int = -1) -> None:
        """Raise unless a client at ``current_leader_epoch`` (-1 = any) agrees with this replica's epoch."""
        if current_leader_epoch >= 0:
            if current_leader_epoch < self.leader_epoch:
                raise errors.FencedLeaderEpochError(
                    f"leader epoch {current_leader_epoch} is older than {self.leader_epoch} on broker "
                    f"{self.local_id} for {self.topic}-{self.partition}")
            if current_leader_epoch > self.leader_epoch:
                raise errors.error_class(errors.ErrorCode.UNKNOWN_LEADER_EPOCH)(
                    f"leader epoch {current_leader_epoch} is newer than {self.leader_epoch} on broker "
                    f"{self.local_id} for {self.topic}-{self.partition}")

    def min_insync_replicas(self) -> int:
        return int(getattr(self.log.config, "min_insync_replicas", 1))

    def append_as_leader(self, records: bytes, acks: int, *, blocking: bool = True,
                         transactional: bool = False, verified: dict[int, int] | None = None) -> Any:
        """Append as leader; all-or-nothing. Raises before appending if acks=all and the ISR is too small.

        ``blocking=False`` is for the broker's event loop: ``LockBusy`` when the partition lock or the
        log's lock is held, and the log's ``WouldBlock`` where its append would do blocking work;
        either way nothing was changed. ``transactional``, ``verified``: a transactional producer's batches and
        their verification (``Log.append_as_leader``).
        """
        with held(self.lock, blocking):
            if blocking:
                return self._append_as_leader(records, acks, True, transactional, verified)
            with held(self.log.lock, False):  # the log calls below re-enter it: none waits (Log.lock)
                return self._append_as_leader(records, acks, False, transactional, verified)

    def _append_as_leader(self, records: bytes, acks: int, blocking: bool, transactional: bool = False,
                          verified: dict[int, int] | None = None) -> Any:
        self.check_leader()
        self._check_hw()
        min_isr = self.min_insync_replicas()
        if acks == -1 and len(self.isr) < min_isr:
            raise errors.NotEnoughReplicasError(
                f"{self.topic}-{self.partition}: ISR {list(self.isr)} is smaller than "
                f"min.insync.replicas={min_isr}")
        info = self.log.append_as_leader(records, self.leader_epoch, blocking=blocking, transactional=True,
                                         verified=verified) \
            if transactional else self.log.append_as_leader(records, self.leader_epoch, blocking=blocking)
        if not getattr(info, "duplicate", False):
            self.messages_in_total += info.num_records
            self.bytes_in_total += len(records)
        self.data_seq += 1
        self.appended.notify_all()
        self._maybe_increment_hw()
        return info

    def append_marker_as_leader(self, producer_id: int, producer_epoch: int, commit: bool,
                                coordinator_epoch: int) -> Any:
        """Write a transaction's COMMIT or ABORT marker as leader (``Log.append_marker_as_leader``, at this
        leadership's epoch), then ``markers_appended``. The caller then wakes the partition's fetches
        (``ReplicaManager.markers_written``)."""
        with self.lock:
            self.check_leader()
            self._check_hw()
            info = self.log.append_marker_as_leader(producer_id, producer_epoch, commit, coordinator_epoch,
                                                    self.leader_epoch)
            self.markers_appended()
            return info

    def markers_appended(self) -> bool:
        """Transaction markers were appended to this leader's log (through ``append_marker_as_leader`` or
        the log's own): as an append, for the followers and the HW (a leader alone in its ISR moves it over
        them here, and with it the last stable offset); and for read_committed consumers, whose bound the
        markers move (storage/log.py: once the HW passes them, as in Kafka). True if the HW moved."""
        with self.lock:
            self.data_seq += 1
            self.change_seq += 1
            self.appended.notify_all()
            return self._maybe_increment_hw()

    # ---- leader: follower progress ----
    def fetch_for_follower(self, replica_id: int, fetch_offset: int, follower_log_start: int,
                           last_fetched_epoch: int, current_leader_epoch: int, max_bytes: int,
                           min_one_batch: bool, now_ms: int, *, blocking: bool = True) -> FollowerFetchResult:
        """A follower's fetch: its progress (which may move the HW and grow the ISR) and the data after it.

        ``blocking=False`` is for the broker's event loop: it raises ``LockBusy``, having changed
        nothing, when the partition lock is held (an append in progress) or the log's (retention,
        a compaction swap, a truncation or a flush in progress), and otherwise holds both for the
        whole call.
        """
        args = (replica_id, fetch_offset, follower_log_start, last_fetched_epoch, current_leader_epoch, max_bytes,
                min_one_batch, now_ms)
        if blocking:
            return self._fetch_for_follower(*args)
        with held(self.lock, blocking=False), held(self.log.lock, blocking=False):  # log calls re-enter it
            return self._fetch_for_follower(*args)

    def _fetch_for_follower(self, replica_id: int, fetch_offset: int, follower_log_start: int,
                            last_fetched_epoch: int, current_leader_epoch: int, max_bytes: int,
                            min_one_batch: bool, now_ms: int) -> FollowerFetchResult:
        with self.lock:
            self.check_leader(current_leader_epoch)
            if replica_id not in self.followers:
                raise errors.NotLeaderOrFollowerError(
                    f"broker {replica_id} is not a replica of {self.topic}-{self.partition}")
        lg = self.log
        if last_fetched_epoch >= 0:
            div = isr_rules.diverging_epoch(last_fetched_epoch, fetch_offset,
                                            lg.end_offset_for_epoch(last_fetched_epoch))
            if div is not None:
                return FollowerFetchResult(b"", lg.high_watermark, lg.log_start_offset, lg.log_end_offset,
                                           div, False, None)
        leo = lg.log_end_offset
        data = lg.read(fetch_offset, max_bytes, max_offset=None, min_one_batch=min_one_batch)
        with self.lock:
            if not self.is_leader or replica_id not in self.followers:
                raise errors.NotLeaderOrFollowerError(f"leadership of {self.topic}-{self.partition} moved")
            self.followers[replica_id].record_fetch(fetch_offset, follower_log_start, leo, now_ms)
            self.bytes_out_total += len(data.records)
            hw_changed = self._maybe_increment_hw()
            proposal = self._maybe_expand_isr(replica_id)
            return FollowerFetchResult(data.records, lg.high_watermark, lg.log_start_offset,
                                       lg.log_end_offset, None, hw_changed, proposal)

    def low_watermark(self) -> int:
        """The smallest log start offset of the leader and its in-sync followers (Kafka's low watermark,
        what DeleteRecords waits for); -1 while a follower has not reported its own since this leadership."""
        with self.lock:
            if not self.is_leader:
                raise errors.NotLeaderOrFollowerError(f"broker {self.local_id} does not lead {self.topic}-{self.partition}")
            starts = [self.log.log_start_offset]
            starts += [f.log_start_offset for rid, f in self.followers.items() if rid in self.isr]
            return -1 if UNKNOWN_OFFSET in starts else min(starts)

    def _maybe_increment_hw(self) -> bool:
        if not self.is_leader:
            return False
        lg = self.log
        self._check_hw()
        hw = isr_rules.high_watermark(self.local_id, lg.log_end_offset, self.maximal_isr(), self.followers)
        if hw > lg.high_watermark:
            lg.update_high_watermark(hw)
            self.change_seq += 1
            return True
        return False

    def _check_hw(self) -> None:
        """A leader's HW never passes its LEO: the HW is the smallest LEO over the ISR, the leader's
        included. If it does, the log or its truncation is broken; clamping would hide that and
        serve consumers offsets that do not exist."""
        hw, leo = self.log.high_watermark, self.log.log_end_offset
        if hw > leo:
            raise ReplicationInvariantError(
                f"{self.topic}-{self.partition}: high watermark {hw} is past the log end offset {leo}")

    def _maybe_expand_isr(self, replica_id: int) -> IsrProposal | None:
        if self.pending_isr is not None or replica_id in self.isr:
            return None
        f = self.followers[replica_id]
        if not isr_rules.can_join_isr(f, self.log.high_watermark, self.leader_epoch_start_offset,
                                      self._broker_usable):
            return None
        new_isr = isr_rules.expanded_isr(self.isr, replica_id)
        self.pending_isr = new_isr
        log.info("%s-%d proposing ISR expansion %s -> %s", self.topic, self.partition,
                 list(self.isr), list(new_isr))
        return IsrProposal(self.topic, self.partition, self.leader_epoch, self.partition_epoch, new_isr)

    def forgive_followers(self, excess_ms: int, now_ms: int) -> None:
        """This broker did not run for ``excess_ms`` (see ReplicaManager._isr_loop): move each follower's last
        catch-up on by as much (never past now), so that the time it could not fetch is not counted as lag."""
        with self.lock:
            if not self.is_leader:
                return
            for f in self.followers.values():
                if f.last_caught_up_time_ms:
                    f.last_caught_up_time_ms = min(now_ms, f.last_caught_up_time_ms + excess_ms)

    def maybe_shrink_isr(self, now_ms: int, lag_max_ms: int) -> IsrProposal | None:
        with self.lock:
            if not self.is_leader or self.pending_isr is not None:
                return None
            out = isr_rules.out_of_sync_replicas(self.local_id, self.isr, self.followers, now_ms, lag_max_ms)
            if not out:
                return None
            new_isr = isr_rules.shrunk_isr(self.isr, out)
            self.pending_isr = new_isr
            log.info("%s-%d proposing ISR shrink %s -> %s (out of sync: %s)", self.topic, self.partition,
                     list(self.isr), list(new_isr), sorted(out))
            return IsrProposal(self.topic, self.partition, self.leader_epoch, self.partition_epoch, new_isr)

    # ---- reads ----
    def read_for_consumer(self, fetch_offset: int, max_bytes: int, current_leader_epoch: int,
                          min_one_batch: bool, as_slice: bool = False, *, follower_read: bool = False,
                          read_committed: bool = False) -> Any:
        """Committed records from ``fetch_offset`` (up to this replica's high watermark). ``follower_read``: a
        consumer that may read from a follower (Kafka's Fetch v11+, KIP-392), which a follower serves too, up to
        the high watermark it learnt from the leader (never past what the leader has committed), while it is in
        the ISR: one that fell out of it (cut from the leader, far behind) sends its consumers back to the leader
        with NOT_LEADER_OR_FOLLOWER. Kafka's followers keep serving them what they have, and librdkafka stays up
        to its 5-minute lease on the follower with nothing new to read.

        ``read_committed`` (Kafka's FetchIsolation TXN_COMMITTED): up to this replica's last stable offset
        instead (a follower's own), as a ``CommittedFetchData`` holding that LSO and the aborted transactions
        overlapping what was read, [fetch_offset, end of the last batch returned) (none when nothing was:
        Kafka's answer). The read_uncommitted path reads no transaction state."""
        if follower_read and self.role is Role.FOLLOWER:
            self.check_leader_epoch(current_leader_epoch)
            if self.local_id not in self.isr:
                raise errors.NotLeaderOrFollowerError(
                    f"broker {self.local_id} is not in the ISR of {self.topic}-{self.partition}: read from the leader")
        else:
            self.check_leader(current_leader_epoch)
        lg = self.log
        if not read_committed:
            data = lg.read(fetch_offset, max_bytes, max_offset=lg.high_watermark, min_one_batch=min_one_batch,
                           as_slice=as_slice)
            self.bytes_out_total += len(data.records)
            return data
        lso = lg.last_stable_offset
        data = lg.read(fetch_offset, max_bytes, max_offset=lso, min_one_batch=min_one_batch, as_slice=as_slice)
        self.bytes_out_total += len(data.records)
        aborted: list[tuple[int, int]] = []
        if data.records and lg.has_aborted_transactions(fetch_offset):
            # Kafka collects them for the range the read returned, [fetch_offset, end of its last batch): the
            # aborted-transaction index search then stops within a segment or two, however far behind the
            # consumer is (bounded by the LSO it would read every index from there to the log end). A marker is
            # written before the LSO passes its transaction, so every aborted one among the records is known.
            # A log with no abort from the fetch offset on (most: librdkafka reads read_committed by default)
            # pays neither the walk of the returned batches' headers nor an index search.
            try:
                end = records_end_offset(data.records)
            except (OSError, struct.error):  # a slice whose file went meanwhile: the LSO bounds what was read
                end = -1
            if end <= fetch_offset:
                end = lso
            aborted = [(int(pid), int(first)) for pid, first, *_ in lg.aborted_transactions(fetch_offset, end)]
        return CommittedFetchData(data.records, data.first_offset, data.log_end_offset, data.log_start_offset,
                                  lso, aborted)

    @property
    def under_replicated(self) -> bool:
        return self.is_leader and len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        return self.is_leader and len(self.isr) < self.min_insync_replicas()
