"""ProducerStateManager: idempotent-producer bookkeeping of one partition log.

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
  so the client can bump its epoch and restart that partition's sequences at 0.

Followers apply the leader's batches without checks. The state is rebuilt on open by
scanning batch headers; a snapshot written at clean close (``producer-state-snapshot``,
valid up to the offset it names) lets the next open scan only what follows it. The
number of tracked producers is bounded (least recently active is forgotten first), per
log and over all the logs of the process (``PRODUCER_BUDGET``: each costs about 1 KB, and
producer ids are the client's to choose, so a client writing batches under ever new ids
would otherwise grow every replica of every partition it writes to); forgetting one (by a
cap or by truncation) sets ``forgot_producers``, evidence the owning Log passes back as
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

from proto import errors
from storage.checkpoints import write_atomically
from storage.record_batch import NO_SEQUENCE, BatchHeader

log = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
SNAPSHOT_FILE = "producer-state-snapshot"
_SNAPSHOT_VERSION = 0
DEFAULT_MAX_PRODUCERS = 100_000  # one log
DEFAULT_PROCESS_MAX_PRODUCERS = 200_000  # all the logs of a process (producer.id.max.tracked)
DEFAULT_PRODUCER_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms: Kafka's default, one day
_SEQ_MODULUS = 2**31


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    base_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, base_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.base_seq == base_seq and b.last_seq == last_seq:
                return b
        return None


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == (last_seq + 1) % _SEQ_MODULUS


class ProducerBudget:
    """The producers all the ProducerStateManagers of a process track together, bounded.

    Counted afresh (summing the managers' sizes) at most once a second, new producers added on
    top in between; a manager that adds producers while the process is over the bound forgets
    as many of its own least recently active ones. So the bound holds within the producers one
    second's recount can miss, and no count can drift: managers that go away or drop entries
    in any way are simply not counted at the next recount.
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
        # Set once an entry was dropped (producer cap or truncation) while the log kept
        # going: an unknown producer may then be one whose history we no longer have.
        self.forgot_producers = False
        self._budget = budget or PRODUCER_BUDGET
        self._budget.register(self)

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def active(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, last batch's max timestamp) of each tracked producer, by id: what
        Kafka's DescribeProducers lists."""
        return [(pid, e.epoch, e.last_seq, e.batches[-1].max_timestamp if e.batches else -1)
                for pid, e in sorted(self._producers.items())]

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
        if h.base_sequence == NO_SEQUENCE:
            return None
        if h.producer_epoch > current.epoch:
            if h.base_sequence != 0:
                raise errors.OutOfOrderSequenceNumberError(
                    f"producer {pid} new epoch {h.producer_epoch} must start at sequence 0, got {h.base_sequence}"
                )
            return None
        dup = current.find_duplicate(h.base_sequence, h.last_sequence)
        if dup is not None:
            return dup
        if current.last_seq != NO_SEQUENCE and not _in_sequence(current.last_seq, h.base_sequence):
            raise errors.OutOfOrderSequenceNumberError(
                f"producer {pid} epoch {h.producer_epoch}: expected sequence "
                f"{(current.last_seq + 1) % _SEQ_MODULUS}, got {h.base_sequence}"
            )
        return None

    @staticmethod
    def _check_first_sequence(h: BatchHeader, state_may_be_lost: bool) -> None:
        """A producer this log has no state for must begin its history at sequence 0."""
        if h.base_sequence in (0, NO_SEQUENCE):
            return
        if state_may_be_lost:
            raise errors.UnknownProducerIdError(
                f"no state for producer {h.producer_id} (epoch {h.producer_epoch}, sequence {h.base_sequence}); "
                "its batches may have been removed by retention, compaction or truncation")
        raise errors.OutOfOrderSequenceNumberError(
            f"producer {h.producer_id} epoch {h.producer_epoch}: expected sequence 0 from a new producer, "
            f"got {h.base_sequence}")

    @staticmethod
    def apply_to(state: dict[int, ProducerEntry], base: ProducerEntry | None, h: BatchHeader,
                 first_offset: int) -> None:
        """Record batch ``h`` (written at ``first_offset``) into ``state`` (copy-on-write of base)."""
        pid = h.producer_id
        entry = state.get(pid)
        if entry is None:
            entry = ProducerEntry(pid, h.producer_epoch)
            if base is not None and base.epoch == h.producer_epoch:
                entry.batches.extend(base.batches)
            state[pid] = entry
        if h.producer_epoch > entry.epoch:
            entry.epoch = h.producer_epoch
            entry.batches.clear()
        if h.base_sequence != NO_SEQUENCE:
            entry.batches.append(BatchMetadata(
                h.base_sequence, h.last_sequence, first_offset, first_offset + h.last_offset_delta, h.max_timestamp
            ))

    def update(self, h: BatchHeader, first_offset: int) -> None:
        """Apply one written batch (leader after checks, follower and recovery without)."""
        if h.producer_id < 0:
            return
        staged: dict[int, ProducerEntry] = {}
        self.apply_to(staged, self._producers.get(h.producer_id), h, first_offset)
        self.commit(staged)

    def commit(self, staged: dict[int, ProducerEntry]) -> None:
        added = 0
        for pid, entry in staged.items():
            if pid not in self._producers:
                added += 1
            self._producers[pid] = entry
            self._producers.move_to_end(pid)
        while len(self._producers) > self.max_producers:
            pid, _ = self._producers.popitem(last=False)
            self.forgot_producers = True
            log.debug("forgetting least recently active producer %d (cap %d)", pid, self.max_producers)
        if added:
            # Never the producers just written (the newest): at most the older ones of this log.
            forget = min(self._budget.excess(added), len(self._producers) - len(staged))
            for _ in range(forget):
                self._producers.popitem(last=False)
            if forget > 0:
                self.forgot_producers = True
                self._budget.forgot(forget)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget the producers whose last batch's max timestamp is ``expiration_ms`` or more before ``now_ms``
        (Kafka's ``producer.id.expiration.ms``, KIP-854): state for producers gone quiet would otherwise stay
        until a cap pushed it out. Their next batch is answered as for any forgotten producer. How many."""
        expired = [pid for pid, e in self._producers.items()
                   if now_ms - (e.batches[-1].max_timestamp if e.batches else -1) >= expiration_ms]
        for pid in expired:
            del self._producers[pid]
        if expired:
            self.forgot_producers = True
        return len(expired)

    def last_batch_offsets(self) -> set[int]:
        """The last offset of every tracked producer's last batch (what the cleaner keeps whole)."""
        return {e.batches[-1].last_offset for e in self._producers.values() if e.batches}

    def truncate_from(self, offset: int) -> None:
        """Forget batches at or after ``offset`` (log truncated). Producers left empty are dropped."""
        for pid in list(self._producers):
            entry = self._producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if len(kept) != len(entry.batches):
                if not kept:
                    del self._producers[pid]
                    self.forgot_producers = True
                else:
                    entry.batches = deque(kept, maxlen=NUM_BATCHES_TO_RETAIN)

    def clear(self) -> None:
        """Empty state for a rebuild; a caller dropping live state sets ``forgot_producers`` itself."""
        self._producers.clear()
        self.forgot_producers = False

    # -- snapshot ------------------------------------------------------------------------
    def write_snapshot(self, path: Path, offset: int) -> None:
        """Persist the state as of ``offset`` (the log end at a clean close)."""
        lines = [str(_SNAPSHOT_VERSION), str(offset), str(len(self._producers))]
        for pid, e in self._producers.items():
            fields = [str(pid), str(e.epoch), str(len(e.batches))]
            for b in e.batches:
                fields += [str(b.base_seq), str(b.last_seq), str(b.first_offset), str(b.last_offset),
                           str(b.max_timestamp)]
            lines.append(" ".join(fields))
        write_atomically(path, ("\n".join(lines) + "\n").encode())

    def load_snapshot(self, path: Path) -> int | None:
        """Replace the state with the snapshot's; return its offset, or None (absent or unreadable)."""
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            if len(lines) < 3 or int(lines[0]) != _SNAPSHOT_VERSION or int(lines[2]) != len(lines) - 3:
                raise ValueError("bad header")
            offset = int(lines[1])
            producers: OrderedDict[int, ProducerEntry] = OrderedDict()
            for line in lines[3:]:
                f = [int(x) for x in line.split()]
                pid, epoch, n = f[0], f[1], f[2]
                if n > NUM_BATCHES_TO_RETAIN or len(f) != 3 + 5 * n:
                    raise ValueError(f"bad entry {line!r}")
                entry = ProducerEntry(pid, epoch)
                for i in range(n):
                    entry.batches.append(BatchMetadata(*f[3 + 5 * i: 8 + 5 * i]))
                producers[pid] = entry
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("ignoring unreadable producer state snapshot %s: %s", path, exc)
            return None
        self._producers = producers
        return offset
