"""LeaderEpochFileCache: leader epoch -> start offset, persisted in ``leader-epoch-checkpoint``.

The cache records, for every leader epoch that wrote to this replica's log, the first
offset written in that epoch (KIP-101 / KIP-279). A follower asks the leader for the end
offset of its latest epoch and truncates to it, so replicas never diverge after a
leader change. Every change is written through to the checkpoint file atomically.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from storage.checkpoints import LEADER_EPOCH_CHECKPOINT, CorruptCheckpointError, EpochCheckpointFile

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochFileCache:
    def __init__(self, partition_dir: Path) -> None:
        self._file = EpochCheckpointFile(partition_dir / LEADER_EPOCH_CHECKPOINT)
        self._lock = threading.RLock()
        # True when the file could not be read whole (unreadable, or entries out of order): the log then
        # rebuilds the cache from the headers of every batch it holds (Log.open), not only the rescanned ones.
        self.damaged = False
        try:
            raw = self._file.read()
        except CorruptCheckpointError as exc:
            log.warning("leader epoch cache unreadable, rebuilding: %s", exc)
            raw = []
            self.damaged = True
        self._entries: list[EpochEntry] = []
        for epoch, start in raw:
            if self._entries and (epoch <= self._entries[-1].epoch or start < self._entries[-1].start_offset):
                log.warning("%s: entry (%d, %d) out of order, dropped", self._file.path, epoch, start)
                self.damaged = True
                continue
            self._entries.append(EpochEntry(epoch, start))

    @property
    def path(self) -> Path:
        return self._file.path

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        with self._lock:
            return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def latest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._entries[-1] if self._entries else None

    def earliest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._entries[0] if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True when the cache changed.

        Like Kafka: a repeat of the latest epoch at the same or a later offset is a no-op;
        otherwise entries that conflict (epoch >= new epoch, or start >= new start) are
        removed first, so epochs and start offsets both stay strictly ordered.
        """
        if epoch < 0:
            return False
        with self._lock:
            latest = self.latest_entry()
            if latest is not None and latest.epoch == epoch and latest.start_offset <= start_offset:
                return False
            kept = [e for e in self._entries if e.epoch < epoch and e.start_offset < start_offset]
            removed = len(self._entries) - len(kept)
            if removed:
                log.info("%s: assigning epoch %d at %d removed %d conflicting entries",
                         self.path, epoch, start_offset, removed)
            kept.append(EpochEntry(epoch, start_offset))
            self._entries = kept
            self._flush()
            return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= requested, its end offset), Kafka's OffsetsForLeaderEpoch semantics.

        The end offset of an epoch is the start offset of the next larger epoch, or the log
        end offset for the latest epoch. A requested epoch below every known epoch answers
        (requested, start of the earliest epoch); one above the latest, or an empty cache,
        answers (-1, -1).
        """
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH or not self._entries:
                return UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if requested_epoch == self._entries[-1].epoch:
                return requested_epoch, log_end_offset
            epochs = [e.epoch for e in self._entries]
            higher = bisect.bisect_right(epochs, requested_epoch)
            if higher >= len(self._entries):
                return UNDEFINED_EPOCH, UNDEFINED_OFFSET
            if higher == 0:
                return requested_epoch, self._entries[0].start_offset
            return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop epochs that start at or after ``end_offset`` (log truncated to it)."""
        with self._lock:
            kept = [e for e in self._entries if e.start_offset < end_offset]
            if len(kept) != len(self._entries):
                self._entries = kept
                self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Log start moved to ``start_offset``: drop older epochs, clamp the one spanning it."""
        with self._lock:
            below = [e for e in self._entries if e.start_offset <= start_offset]
            if not below or (len(below) == 1 and below[0].start_offset == start_offset):
                return
            last_below = below[-1]
            kept = [EpochEntry(last_below.epoch, start_offset)]
            kept += [e for e in self._entries if e.start_offset > start_offset]
            self._entries = kept
            self._flush()

    def clear(self) -> None:
        with self._lock:
            self._entries = []
            self._flush()

    def _flush(self) -> None:
        self._file.write([(e.epoch, e.start_offset) for e in self._entries])
