"""ProducerStateManager: idempotent-producer and transaction bookkeeping of one partition log.

For every producer id it keeps the producer epoch and the metadata of its last five
batches (base/last sequence, first/last offset, max timestamp), taken from batch
HEADERS only. The leader checks each produced batch against it:

* same (epoch, base_seq, last_seq) as one of the last five -> duplicate, not appended;
  the caller answers with the original offsets (a retried produce is idempotent);
* an older epoch -> InvalidProducerEpochError (a zombie producer is fenced);
* a newer epoch must start at sequence 0; the same epoch must continue at last_seq + 1
  (int32 wrap-around) -> otherwise OutOfOrderSequenceNumberError;
* a producer id with no state must start at sequence 0, as Kafka's brokers before
  KIP-360 required. Accepting any first sequence would let a later batch that overtook
  an earlier one (pipelined gRPC requests are handled concurrently) start the
  producer's history, after which the earlier batch is refused and its records lost.
  A non-zero first sequence is refused with OutOfOrderSequenceNumberError (nothing
  appended; the client retries it after the earlier batches), or with
  UnknownProducerIdError when the log has evidence that producer state may have been
  lost (the caller says so: log start moved, compaction, truncation, the producer cap),
  so the client can bump its epoch and restart that partition's sequences at 0. The
  same holds for a known producer with no batch at its current epoch (a marker bumped
  it, or a truncation cut its batches);
* a producer with an ongoing transaction may write only transactional batches
  (InvalidTxnStateError, Kafka's INVALID_TXN_STATE).

Transactions (Kafka's ProducerAppendInfo/ProducerStateManager). A transactional data
batch from a producer with no ongoing transaction starts one at its base offset; a
COMMIT or ABORT marker (a control batch: its type is in the record, which the Log reads
for markers only) ends it and yields a ``CompletedTxn``, whose abort the Log writes to
its segment's ``.txnindex``. A marker with no ongoing transaction completes nothing (the
coordinator retries markers). A marker carries the producer epoch: a newer one replaces
the entry's and clears its batch metadata, as Kafka's ``maybeUpdateProducerEpoch``. The
leader refuses a marker from an older producer epoch or an older coordinator epoch
(``check_marker``). The ongoing transactions are kept in offset order, and the completed
ones whose marker is not yet below the high watermark too (Kafka's unreplicated
transactions: a marker a new leader may not have), so the first unstable offset, which
bounds the last stable offset, is found in O(1).

A producer with an ongoing transaction is never forgotten: not by the per-log cap, not
by the process budget, not by expiry. Forgetting it would move the last stable offset
past records whose fate is undecided, and its marker would then complete nothing (an
abort would never reach the aborted-transaction index, so read_committed consumers would
take aborted records as committed). The consequence: such producers are bounded only by
their markers. The transaction coordinator must end every transaction (it aborts those
past transaction.timeout.ms); until produce requests are verified against it (Kafka's
KIP-890), a client writing transactional batches under ever new producer ids and never
ending them grows this state, and holds the last stable offset, for as long.

Truncation (a follower's diverged tail) removes the transactions that began at or after
the cut and re-opens those whose marker was cut away, from each producer's last
``TXN_HISTORY`` completed transactions; where that history does not reach back far
enough (or a forgotten producer's marker may have been cut), ``truncate_from`` says so
and the Log rebuilds the state from the log's headers.

Followers apply the leader's batches without checks. The state is rebuilt on open by
scanning batch headers (and the bytes of control batches); a snapshot written at clean
close (``producer-state-snapshot``, valid up to the offset it names; version 1 carries
the transaction state, version 0 files still load) lets the next open scan only what
follows it. The number of tracked producers is bounded (least recently active is
forgotten first, producers with an ongoing transaction excepted), per log and over all
the logs of the process (``PRODUCER_BUDGET``: each costs about 1 KB, and producer ids are
the client's to choose, so a client writing batches under ever new ids would otherwise
grow every replica of every partition it writes to); forgetting one (by a cap or by
truncation) sets ``forgot_producers``, evidence the owning Log passes back as
``state_may_be_lost``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from proto import errors
from storage.checkpoints import write_atomically
from storage.record_batch import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    CONTROL_TYPE_ABORT,
    NO_SEQUENCE,
    BatchHeader,
)

log = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
# Completed transactions remembered per producer, newest last: what a truncation needs to re-open the one whose
# marker it cut. A follower's cut is its unreplicated tail, which rarely spans more of one producer's transactions.
TXN_HISTORY = 5
SNAPSHOT_FILE = "producer-state-snapshot"
_SNAPSHOT_VERSION = 1  # 0: idempotence only (still loaded)
DEFAULT_MAX_PRODUCERS = 100_000  # one log
DEFAULT_PROCESS_MAX_PRODUCERS = 200_000  # all the logs of a process (producer.id.max.tracked)
DEFAULT_PRODUCER_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms: Kafka's default, one day
_SEQ_MODULUS = 2**31
_NO_TXN = -1


InvalidTxnStateError = errors.error_class(errors.ErrorCode.INVALID_TXN_STATE)
"""A non-transactional batch from a producer with an ongoing transaction (Kafka's INVALID_TXN_STATE, 48)."""


TransactionCoordinatorFencedError = errors.error_class(errors.ErrorCode.TRANSACTION_COORDINATOR_FENCED)
"""A marker from a coordinator epoch older than one this producer's markers carried (Kafka's
TRANSACTION_COORDINATOR_FENCED, 52): a zombie coordinator, whose marker is dropped."""


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    base_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


class CompletedTxn(NamedTuple):
    """A transaction a marker ended (Kafka's CompletedTxn). ``last_stable_offset``: the first offset of the
    lowest transaction still ongoing once it completed, or the marker's offset + 1 if none: its abort's
    ``.txnindex`` entry carries it (a search for aborted transactions stops at an entry reaching its bound)."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's
    aborted: bool
    last_stable_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1  # of its last batch or marker: what expiry counts from
    txn_first_offset: int = _NO_TXN  # first offset of its ongoing transaction
    coordinator_epoch: int = -1  # of the last marker it saw
    # (first offset, marker offset) of its last TXN_HISTORY completed transactions, oldest first; every one it
    # completed with a marker at or after ``history_from`` is among them (older ones were dropped).
    completed: tuple[tuple[int, int], ...] = ()
    history_from: int = 0
    # Offset of the last marker written for it (any, completing a transaction or not), -1 none since this process
    # tracks it: a leader's verification of a transaction's first batch holds only while it has not moved
    # (``marker_mark``, Log.append_as_leader's ``verified``).
    last_marker_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, base_seq: int, last_seq: int) -> BatchMetadata | None:
        """The batch a retry of [base_seq, last_seq] repeats. Also one ending at ``last_seq`` and beginning later
        within it: all the cleaner left of the original (its first records went to later ones of their keys, and
        state was then rebuilt from the log), answered with the original's first offset."""
        for b in self.batches:
            if b.last_seq != last_seq:
                continue
            if b.base_seq == base_seq:
                return b
            cut = (b.base_seq - base_seq) % _SEQ_MODULUS
            if cut <= (last_seq - base_seq) % _SEQ_MODULUS and b.first_offset - cut >= 0:
                return BatchMetadata(base_seq, last_seq, b.first_offset - cut, b.last_offset, b.max_timestamp)
        return None


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == (last_seq + 1) % _SEQ_MODULUS


class ProducerBudget:
    """The producers all the ProducerStateManagers of a process track together, bounded.

    Counted afresh (summing the managers' sizes) at most once a second, new producers added on
    top in between; a manager that adds producers while the process is over the bound forgets
    as many of its own least recently active ones (never one with an ongoing transaction). So the
    bound holds within the producers one second's recount can miss, and the producers with an
    ongoing transaction, and no count can drift: managers that go away or drop entries in any way
    are simply not counted at the next recount.
    """

    def __init__(self, max_producers: int = DEFAULT_PROCESS_MAX_PRODUCERS) -> None:
        self.max_producers = max_producers
        self._lock = threading.Lock()
        self._managers: weakref.WeakSet[ProducerStateManager] = weakref.WeakSet()
        self._total = 0
        self._counted_at = float("-inf")
        self.forgotten = 0  # producers forgotten because of this bound, since start
        self._warned_at = float("-inf")

    def register(self, manager: ProducerStateManager) -> None:
        with self._lock:
            self._managers.add(manager)

    def excess(self, added: int) -> int:
        """How many producers the process tracks over the bound, ``added`` new ones included."""
        with self._lock:
            now = time.monotonic()
            if now - self._counted_at >= 1.0:
                self._total = sum(len(m) for m in list(self._managers))
                self._counted_at = now
            else:
                self._total += added
            return max(0, self._total - self.max_producers)

    def forgot(self, n: int) -> None:
        with self._lock:
            self._total -= n
            self.forgotten += n
            now = time.monotonic()
            if now - self._warned_at < 60:
                return
            self._warned_at = now
        log.warning("the partition logs track %d idempotent producers, over producer.id.max.tracked (%d): "
                    "forgetting the least recently active (%d so far; a client writing under ever new "
                    "producer ids?)", self._total + n, self.max_producers, self.forgotten)


PRODUCER_BUDGET = ProducerBudget()  # the process's (BrokerServer sets producer.id.max.tracked)


class ProducerStateManager:
    """Not thread-safe by itself: the owning Log calls it under its writer lock."""

    def __init__(self, max_producers: int = DEFAULT_MAX_PRODUCERS, budget: ProducerBudget | None = None) -> None:
        self.max_producers = max_producers
        self._producers: OrderedDict[int, ProducerEntry] = OrderedDict()
        # Producer id -> first offset of its ongoing transaction, in offset order (appends come in offset order;
        # anything else rebuilds it sorted): the first value is the lowest.
        self._ongoing: dict[int, int] = {}
        # (marker offset, first offset) of the completed transactions whose marker is not below the high
        # watermark, in marker order; ``_unreplicated_min`` the same, keeping only those whose first offset is
        # below every later one's, so its head is the lowest first offset of all (a sliding-window minimum).
        self._unreplicated: deque[tuple[int, int]] = deque()
        self._unreplicated_min: deque[tuple[int, int]] = deque()
        self._high_watermark = 0
        # The highest marker offset of a transaction completed by a producer since forgotten: a truncation at or
        # below it may re-open a transaction whose producer is no longer tracked (the Log then rescans).
        self._forgotten_txn_end = -1
        # Set once an entry was dropped (producer cap or truncation) while the log kept
        # going: an unknown producer may then be one whose history we no longer have.
        self.forgot_producers = False
        # Set whenever the ongoing or unreplicated transactions changed: the Log recomputes its first unstable
        # offset (and clears this).
        self.txn_changed = False
        self.snapshot_version: int | None = None  # of the snapshot last loaded
        self._budget = budget or PRODUCER_BUDGET
        self._budget.register(self)

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def active(self) -> list[tuple[int, int, int, int, int, int]]:
        """(producer id, epoch, last sequence, last timestamp, coordinator epoch of its last marker or -1, first
        offset of its ongoing transaction or -1) of each tracked producer, by id: what Kafka's DescribeProducers
        lists."""
        return [(pid, e.epoch, e.last_seq, e.last_timestamp, e.coordinator_epoch, max(e.txn_first_offset, -1))
                for pid, e in sorted(self._producers.items())]

    # -- transactions: reads ------------------------------------------------------------
    def ongoing(self) -> dict[int, int]:
        """Producer id -> first offset of each ongoing transaction, lowest first."""
        return dict(self._ongoing)

    def first_unstable_offset(self) -> int | None:
        """The lowest first offset of a transaction ongoing, or completed by a marker not yet below the high
        watermark (Kafka's firstUnstableOffset); None when there is none."""
        first = next(iter(self._ongoing.values())) if self._ongoing else None
        if self._unreplicated_min:
            u = self._unreplicated_min[0][1]
            first = u if first is None or u < first else first
        return first

    def on_high_watermark(self, high_watermark: int) -> bool:
        """The high watermark moved: transactions whose marker is now below it are stable. True if any was."""
        self._high_watermark = high_watermark
        changed = False
        while self._unreplicated and self._unreplicated[0][0] < high_watermark:
            marker, _first = self._unreplicated.popleft()
            if self._unreplicated_min and self._unreplicated_min[0][0] == marker:
                self._unreplicated_min.popleft()
            changed = True
        if changed:
            self.txn_changed = True
        return changed

    def _add_unreplicated(self, marker: int, first: int) -> None:
        self._unreplicated.append((marker, first))
        while self._unreplicated_min and self._unreplicated_min[-1][1] >= first:
            self._unreplicated_min.pop()
        self._unreplicated_min.append((marker, first))

    def _set_unreplicated(self, txns: list[tuple[int, int]]) -> None:
        self._unreplicated.clear()
        self._unreplicated_min.clear()
        for marker, first in txns:
            self._add_unreplicated(marker, first)

    # -- leader checks ------------------------------------------------------------------
    def check_leader_append(
        self, h: BatchHeader, pending: dict[int, ProducerEntry] | None = None, *,
        state_may_be_lost: bool = False,
    ) -> BatchMetadata | None:
        """Validate one produced batch; return the original's metadata if it is a duplicate.

        ``pending`` holds the state as updated by earlier batches of the same append call
        (checked but not yet written), so several batches of one producer in one call chain.
        ``state_may_be_lost``: the log may once have held batches of producers it no longer
        tracks; an unknown producer not starting at 0 then gets UnknownProducerIdError.
        """
        pid = h.producer_id
        if pid < 0:
            return None
        current = (pending or {}).get(pid) or self._producers.get(pid)
        if current is None:
            self._check_first_sequence(h, state_may_be_lost)
            return None
        if h.producer_epoch < current.epoch:
            raise errors.InvalidProducerEpochError(
                f"producer {pid} epoch {h.producer_epoch} is older than current epoch {current.epoch}"
            )
        if h.base_sequence != NO_SEQUENCE:
            if h.producer_epoch > current.epoch:
                if h.base_sequence != 0:
                    raise errors.OutOfOrderSequenceNumberError(
                        f"producer {pid} new epoch {h.producer_epoch} must start at sequence 0, got {h.base_sequence}"
                    )
            else:
                dup = current.find_duplicate(h.base_sequence, h.last_sequence)
                if dup is not None:
                    return dup
                if not current.batches:
                    self._check_first_sequence(h, state_may_be_lost, "of a producer with no batch at its epoch")
                elif not _in_sequence(current.last_seq, h.base_sequence):
                    raise errors.OutOfOrderSequenceNumberError(
                        f"producer {pid} epoch {h.producer_epoch}: expected sequence "
                        f"{(current.last_seq + 1) % _SEQ_MODULUS}, got {h.base_sequence}"
                    )
        if current.txn_first_offset >= 0 and not h.attributes & ATTR_TRANSACTIONAL:
            raise InvalidTxnStateError(
                f"producer {pid} has a transaction ongoing since offset {current.txn_first_offset}: "
                "a non-transactional batch from it is refused")
        return None

    @staticmethod
    def _check_first_sequence(h: BatchHeader, state_may_be_lost: bool, whose: str = "from a new producer") -> None:
        """A producer this log has no state for (or none at its epoch) must begin its history at sequence 0."""
        if h.base_sequence in (0, NO_SEQUENCE):
            return
        if state_may_be_lost:
            raise errors.UnknownProducerIdError(
                f"no state for producer {h.producer_id} (epoch {h.producer_epoch}, sequence {h.base_sequence}); "
                "its batches may have been removed by retention, compaction or truncation")
        raise errors.OutOfOrderSequenceNumberError(
            f"producer {h.producer_id} epoch {h.producer_epoch}: expected sequence 0 {whose}, "
            f"got {h.base_sequence}")

    def marker_mark(self, producer_id: int) -> int:
        """Where the producer's last marker is (-1: none known): taken before a transaction's first batch here is
        verified with its coordinator, and compared again when the batch is appended."""
        entry = self._producers.get(producer_id)
        return -1 if entry is None else entry.last_marker_offset

    def check_verified(self, h: BatchHeader, verified: dict[int, int] | None) -> None:
        """A transactional batch that would open a transaction here (its producer has none ongoing) must come with
        the marker mark its verification was made at, unchanged since (KIP-890's verification guard). Between the
        coordinator's answer and this append, the transaction may have ended and its marker been written here:
        this batch would then open a transaction no coordinator knows of, which nobody would ever end, holding
        every read_committed consumer of the partition for good."""
        if verified is None or not h.attributes & ATTR_TRANSACTIONAL or h.attributes & ATTR_CONTROL:
            return
        pid = h.producer_id
        entry = self._producers.get(pid)
        if entry is not None and entry.txn_first_offset >= 0:
            return
        mark = verified.get(pid)
        if mark is None or mark != self.marker_mark(pid):
            raise InvalidTxnStateError(
                f"producer {pid}: its transaction here was not verified with its coordinator, or ended since "
                f"(a marker was written after the verification): the batch would open a transaction nobody ends")

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """A marker the leader is asked to write (Kafka's appendEndTxnMarker checks): not from an older producer
        epoch (InvalidProducerEpochError) nor an older coordinator (TransactionCoordinatorFencedError)."""
        current = self._producers.get(producer_id)
        if current is None:
            return
        if producer_epoch < current.epoch:
            raise errors.InvalidProducerEpochError(
                f"marker for producer {producer_id} at epoch {producer_epoch}, older than its epoch {current.epoch}")
        if coordinator_epoch < current.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, older than the "
                f"{current.coordinator_epoch} of its last marker (a zombie coordinator)")

    # -- updates ------------------------------------------------------------------------
    @staticmethod
    def apply_to(state: dict[int, ProducerEntry], base: ProducerEntry | None, h: BatchHeader,
                 first_offset: int) -> None:
        """Record data batch ``h`` (written at ``first_offset``) into ``state`` (copy-on-write of base)."""
        pid = h.producer_id
        entry = state.get(pid)
        if entry is None:
            entry = ProducerEntry(pid, h.producer_epoch)
            if base is not None:
                if base.epoch == h.producer_epoch:
                    entry.batches.extend(base.batches)
                if base.txn_first_offset >= 0 or base.completed or base.coordinator_epoch != -1:  # transactional
                    entry.txn_first_offset = base.txn_first_offset
                    entry.coordinator_epoch = base.coordinator_epoch
                    entry.completed = base.completed
                    entry.history_from = base.history_from
            state[pid] = entry
        if h.producer_epoch > entry.epoch:
            entry.epoch = h.producer_epoch
            entry.batches.clear()
        if h.base_sequence != NO_SEQUENCE:
            entry.batches.append(BatchMetadata(
                h.base_sequence, h.last_sequence, first_offset, first_offset + h.last_offset_delta, h.max_timestamp
            ))
        entry.last_timestamp = h.max_timestamp
        if h.attributes & ATTR_TRANSACTIONAL and entry.txn_first_offset < 0:
            entry.txn_first_offset = first_offset  # begins a transaction

    def update(self, h: BatchHeader, first_offset: int, marker: tuple[int, int] | None = None
               ) -> CompletedTxn | None:
        """Apply one written batch (leader after checks, follower and recovery without). ``marker``: (control type,
        coordinator epoch) of a control batch's COMMIT/ABORT record (None for another: it changes nothing).
        Returns the transaction a marker completed."""
        if h.producer_id < 0:
            return None
        if h.attributes & ATTR_CONTROL:
            return self._apply_marker(h, first_offset, marker)
        staged: dict[int, ProducerEntry] = {}
        self.apply_to(staged, self._producers.get(h.producer_id), h, first_offset)
        self.commit(staged)
        return None

    def _apply_marker(self, h: BatchHeader, offset: int, marker: tuple[int, int] | None) -> CompletedTxn | None:
        """Kafka's appendEndTxnMarker, without its checks (``check_marker``). An empty control batch, or one of
        another type, changes nothing (Kafka: an empty one is what its cleaner leaves of a transaction)."""
        if marker is None:
            return None
        control_type, coordinator_epoch = marker
        pid = h.producer_id
        entry = self._producers.get(pid)
        if entry is None:
            entry = ProducerEntry(pid, h.producer_epoch)
        elif h.producer_epoch != entry.epoch:  # Kafka's maybeUpdateProducerEpoch
            entry.epoch = h.producer_epoch
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = h.max_timestamp
        entry.last_marker_offset = offset
        done = None
        first = entry.txn_first_offset
        if first >= 0:
            entry.txn_first_offset = _NO_TXN
            self._ongoing.pop(pid, None)
            history = (*entry.completed, (first, offset))
            if len(history) > TXN_HISTORY:
                entry.history_from = history[0][1] + 1
                history = history[1:]
            entry.completed = history
            if offset >= self._high_watermark:
                self._add_unreplicated(offset, first)
            stable = next(iter(self._ongoing.values())) if self._ongoing else offset + 1
            done = CompletedTxn(pid, first, offset, control_type == CONTROL_TYPE_ABORT, stable)
            self.txn_changed = True
        self.commit({pid: entry})
        return done

    def commit(self, staged: dict[int, ProducerEntry]) -> None:
        added = 0
        for pid, entry in staged.items():
            if pid not in self._producers:
                added += 1
            self._producers[pid] = entry
            self._producers.move_to_end(pid)
            if entry.txn_first_offset >= 0 and pid not in self._ongoing:
                self._ongoing[pid] = entry.txn_first_offset
                self.txn_changed = True
        over = len(self._producers) - self.max_producers
        if over > 0 and self._evict(over, ()) < over:
            log.debug("%d producers over the cap %d: the rest have an ongoing transaction",
                      len(self._producers) - self.max_producers, self.max_producers)
        if added:
            # Never the producers just written (the newest): at most the older ones of this log.
            excess = self._budget.excess(added)
            if excess > 0:
                forgot = self._evict(excess, staged)
                if forgot > 0:
                    self._budget.forgot(forgot)

    def _evict(self, n: int, keep: dict[int, ProducerEntry] | tuple[()]) -> int:
        """Forget up to ``n`` of the least recently active producers, none with an ongoing transaction and none
        of ``keep``; how many. Those skipped go to the back (they cannot go anyway), so the next call does not
        step over them again."""
        evictable = len(self._producers) - len(self._ongoing) - sum(1 for pid in keep if pid not in self._ongoing)
        n = min(n, evictable)
        forgotten = 0
        while forgotten < n:
            pid, entry = next(iter(self._producers.items()))
            if entry.txn_first_offset >= 0 or pid in keep:
                self._producers.move_to_end(pid)
                continue
            del self._producers[pid]
            self._forgot(entry)
            forgotten += 1
            log.debug("forgetting least recently active producer %d", pid)
        return forgotten

    def _forgot(self, entry: ProducerEntry) -> None:
        self.forgot_producers = True
        if entry.completed:
            self._forgotten_txn_end = max(self._forgotten_txn_end, entry.completed[-1][1])

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget the producers whose last batch or marker is ``expiration_ms`` or more before ``now_ms`` (Kafka's
        ``producer.id.expiration.ms``, KIP-854), except those with an ongoing transaction (as Kafka): state for
        producers gone quiet would otherwise stay until a cap pushed it out. Their next batch is answered as for
        any forgotten producer. How many."""
        expired = [pid for pid, e in self._producers.items()
                   if e.txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms]
        for pid in expired:
            self._forgot(self._producers.pop(pid))
        return len(expired)

    def cleaner_keeps(self) -> tuple[set[int], dict[int, int]]:
        """What the cleaner keeps so that producer state rebuilt from the log finds every tracked producer where it
        stands (Kafka's isBatchLastRecordOfProducer): the last offset of each one's last data batch, and the epoch
        of each one without a data batch in its epoch (it wrote only markers since, say a coordinator's abort that
        bumped it): its markers of that epoch are kept."""
        last: set[int] = set()
        marker_only: dict[int, int] = {}
        for pid, e in self._producers.items():
            if e.batches:
                last.add(e.batches[-1].last_offset)
            else:
                marker_only[pid] = e.epoch
        return last, marker_only

    def truncate_from(self, offset: int) -> bool:
        """Forget batches at or after ``offset`` (log truncated). Producers left empty are dropped. Transactions
        that began at or after it are gone; one whose marker was cut is ongoing again. False when that cannot be
        told from what is kept (a producer's history does not reach back to ``offset``, or a forgotten producer
        completed a transaction there): the caller then rebuilds the state from the log."""
        exact = offset > self._forgotten_txn_end
        for pid in list(self._producers):
            entry = self._producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            first = entry.txn_first_offset
            if first >= 0 or entry.completed:
                if first >= offset:
                    first = _NO_TXN
                completed = list(entry.completed)
                if first < 0:
                    while completed and completed[-1][1] >= offset:
                        f, _marker = completed.pop()
                        if f < offset:
                            first = f  # its marker was cut: undecided again
                            break
                    else:
                        if not completed and offset < entry.history_from:
                            exact = False
                entry.txn_first_offset = first
                entry.completed = tuple(completed)
            if len(kept) != len(entry.batches):
                if not kept and first < 0:
                    del self._producers[pid]
                    self._forgot(entry)
                else:
                    entry.batches = deque(kept, maxlen=NUM_BATCHES_TO_RETAIN)
                    if not kept:
                        self.forgot_producers = True
        ongoing = sorted((e.txn_first_offset, pid) for pid, e in self._producers.items() if e.txn_first_offset >= 0)
        self._ongoing = {pid: first for first, pid in ongoing}
        self._set_unreplicated([(m, f) for m, f in self._unreplicated if m < offset])
        self.txn_changed = True
        return exact

    def clear(self) -> None:
        """Empty state for a rebuild; a caller dropping live state sets ``forgot_producers`` itself."""
        self._producers.clear()
        self._ongoing.clear()
        self._set_unreplicated([])
        self._forgotten_txn_end = -1
        self.forgot_producers = False
        self.txn_changed = True

    # -- snapshot ------------------------------------------------------------------------
    def write_snapshot(self, path: Path, offset: int) -> None:
        """Persist the state as of ``offset`` (the log end at a clean close).

        Version 1, text: the version, the offset, the number of producer lines, then one line with the highest
        marker offset of a forgotten producer and the unreplicated transactions (count, then marker and first
        offset of each), then per producer: id, epoch, last timestamp, ongoing transaction's first offset (-1),
        coordinator epoch, history start, count and (first, marker) pairs of its completed transactions, count
        and the five fields of each batch."""
        lines = [str(_SNAPSHOT_VERSION), str(offset), str(len(self._producers)),
                 " ".join([str(self._forgotten_txn_end), str(len(self._unreplicated)),
                           *(f"{m} {f}" for m, f in self._unreplicated)])]
        for pid, e in self._producers.items():
            fields = [str(pid), str(e.epoch), str(e.last_timestamp), str(e.txn_first_offset),
                      str(e.coordinator_epoch), str(e.history_from), str(len(e.completed))]
            for f, m in e.completed:
                fields += [str(f), str(m)]
            fields.append(str(len(e.batches)))
            for b in e.batches:
                fields += [str(b.base_seq), str(b.last_seq), str(b.first_offset), str(b.last_offset),
                           str(b.max_timestamp)]
            lines.append(" ".join(fields))
        write_atomically(path, ("\n".join(lines) + "\n").encode())

    def load_snapshot(self, path: Path) -> int | None:
        """Replace the state with the snapshot's; return its offset, or None (absent or unreadable). Sets
        ``snapshot_version``."""
        self.snapshot_version = None
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            version = int(lines[0]) if lines else -1
            header = {0: 3, 1: 4}.get(version)
            if header is None or len(lines) < header or int(lines[2]) != len(lines) - header:
                raise ValueError("bad header")
            offset = int(lines[1])
            producers: OrderedDict[int, ProducerEntry] = OrderedDict()
            forgotten_txn_end, unreplicated = -1, []
            if version == 1:
                f = [int(x) for x in lines[3].split()]
                forgotten_txn_end, n = f[0], f[1]
                if len(f) != 2 + 2 * n:
                    raise ValueError(f"bad transactions line {lines[3]!r}")
                unreplicated = [(f[2 + 2 * i], f[3 + 2 * i]) for i in range(n)]
            for line in lines[header:]:
                entry = _parse_entry(line, version)
                producers[entry.producer_id] = entry
        except FileNotFoundError:
            return None
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            log.warning("ignoring unreadable producer state snapshot %s: %s", path, exc)
            return None
        self._producers = producers
        ongoing = sorted((e.txn_first_offset, pid) for pid, e in producers.items() if e.txn_first_offset >= 0)
        self._ongoing = {pid: first for first, pid in ongoing}
        self._set_unreplicated(unreplicated)
        self._forgotten_txn_end = forgotten_txn_end
        self.snapshot_version = version
        self.txn_changed = True
        return offset


def _parse_entry(line: str, version: int) -> ProducerEntry:
    f = [int(x) for x in line.split()]
    if version == 0:  # id, epoch, batches
        entry = ProducerEntry(f[0], f[1])
        i = 2
    else:
        entry = ProducerEntry(f[0], f[1], last_timestamp=f[2], txn_first_offset=f[3], coordinator_epoch=f[4],
                              history_from=f[5])
        n = f[6]
        if n > TXN_HISTORY:
            raise ValueError(f"bad entry {line!r}")
        entry.completed = tuple((f[7 + 2 * k], f[8 + 2 * k]) for k in range(n))
        i = 7 + 2 * n
    n = f[i]
    if n > NUM_BATCHES_TO_RETAIN or len(f) != i + 1 + 5 * n:
        raise ValueError(f"bad entry {line!r}")
    for k in range(n):
        entry.batches.append(BatchMetadata(*f[i + 1 + 5 * k: i + 6 + 5 * k]))
    if version == 0:
        entry.last_timestamp = entry.batches[-1].max_timestamp if entry.batches else -1
    return entry
