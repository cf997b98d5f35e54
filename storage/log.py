"""Log: one partition's log, a sequence of segments (Kafka's UnifiedLog, local part).

Threading: one writer lock serialises appends, truncation, rolls, retention and segment
swaps. Readers never take it: they read an immutable snapshot of the segment list
(replaced copy-on-write) and the published log end offset, and each segment publishes
its size only after the bytes are written. A segment removed while a reader still uses
it is renamed ``.deleted`` and closed only after ``file.delete.delay.ms``.

Append path (leader): validate headers + CRC of every batch, then every record of every
batch (LogValidator: client bytes must be decodable by every consumer), producer-state
checks, rewrite base offsets and the leader epoch in place, one pwrite.

Transactions (Kafka's): producer state (storage/producer_state.py) follows each producer's
ongoing transaction; a COMMIT/ABORT marker (``append_marker_as_leader``, or a follower's or
recovery's control batch) ends it, and an abort goes to the ``.txnindex`` of the segment
holding its marker. The last stable offset is the high watermark, held back at the first
offset of the lowest transaction still undecided (or decided by a marker not yet below the
high watermark): read_committed fetches stop there and get the aborted transactions of what
they read (``aborted_transactions``). A non-transactional append pays two attribute checks
per batch for all of this.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from proto import errors
from storage.checkpoints import fsync_dir, write_atomically
from storage.compression import CODEC_BY_NAME
from storage.disk_errors import disk_failure
from storage.leader_epoch_cache import UNDEFINED_EPOCH, LeaderEpochFileCache
from storage.log_config import LogConfig
from storage.log_validator import LogValidator
from storage.producer_state import SNAPSHOT_FILE, ProducerEntry, ProducerStateManager
from storage.record_batch import (
    ATTR_CONTROL,
    CODEC_NONE,
    BatchHeader,
    Buffer,
    RecordBatchBuilder,
    assign_offsets,
    build_control_batch,
    decode_batch,
    end_txn_marker,
    iter_batches,
    read_header,
    set_log_append_time,
    validate_batches,
)
from storage.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    CorruptBatchError,
    LogSegment,
    SegmentChangedError,
    open_segments,
    segment_budget,
    segment_file_name,
)
from storage.txn_index import TXN_INDEX_SUFFIX, AbortedTxn

__all__ = ["AppendInfo", "FetchData", "Log", "LogConfig", "TimestampAndOffset", "UnexpectedAppendOffsetError"]

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2  # ListOffsets sentinels, as in Kafka
LATEST_TIMESTAMP = -1
_READ_ATTEMPTS = 3
_SEGMENT_POSITION_MAX = 2**31 - 1  # index positions are int32: a segment never grows past this
_OFFSET_MAX = 2**63 - 1
_LOG_OVERHEAD = 12  # a batch's size is its batch length plus this
_INT16_MAX = 2**15 - 1
_BUDGET_WARN_EVERY_S = 60.0
_budget_warned_at = float("-inf")
_REFUSED_LOG_INTERVAL_S = 10.0
# Written in a partition directory when a read found a corrupt batch (``mark_corrupt``): its base offset. The next
# open CRC-scans from the segment holding it (whatever the recovery point and the shutdown), which truncates there.
RESCAN_FROM_FILE = "rescan-from"
# Offset ranges a trusted segment lost on disk (``LogSegment.lost_bytes``: cut short or emptied), one "start end"
# line each (end exclusive): no segment holds them now, and reads of them fail as a corrupt batch would. Kept
# because the indexes that told it are rebuilt from what is left; gone once the log is cut there or moves past.
LOST_OFFSETS_FILE = "lost-offsets"
MAX_ITER_READS = 10_000_000  # bound of iter_batches_from (far beyond any real log)  # a reader racing a segment deletion retries on a fresh snapshot


class WouldBlock(Exception):
    """A non-blocking append (``append_as_leader``, ``append_as_follower``) would wait or do blocking work: nothing was changed."""


class UnexpectedAppendOffsetError(errors.InvalidRecordError):  # type: ignore[misc,valid-type]
    """A follower append whose first offset is not the log end offset."""


@dataclass
class AppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 if CreateTime
    num_records: int
    num_batches: int
    valid_bytes: int
    duplicate: bool = False


class TimestampAndOffset(NamedTuple):
    """A ListOffsets answer from the log (Kafka's ``FileRecords.TimestampAndOffset``)."""

    offset: int
    timestamp: int  # -1 for the sentinels
    leader_epoch: int  # -1: unknown


@dataclass
class FetchData:
    records: bytes  # whole batches
    first_offset: int  # -1 if empty
    log_end_offset: int
    log_start_offset: int


def _read_rescan_from(directory: Path) -> int | None:
    """The offset in ``RESCAN_FROM_FILE``; 0 (rescan everything) when it is there but unreadable."""
    try:
        text = (directory / RESCAN_FROM_FILE).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0
    try:
        return max(0, int(text.strip()))
    except ValueError:
        return 0


def _read_lost_offsets(directory: Path) -> tuple[tuple[int, int], ...]:
    """The ranges in ``LOST_OFFSETS_FILE`` (none when it is absent); an unreadable line is skipped, with a
    WARNING: what it held is then not refused, as before the file existed."""
    try:
        text = (directory / LOST_OFFSETS_FILE).read_text(encoding="ascii")
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as exc:
        log.warning("%s: %s unreadable (%s): no lost offsets refused", directory, LOST_OFFSETS_FILE, exc)
        return ()
    ranges = []
    for line in text.splitlines():
        try:
            start, end = (int(f) for f in line.split())
        except ValueError:
            log.warning("%s: %s: line %r skipped", directory, LOST_OFFSETS_FILE, line)
            continue
        if 0 <= start < end:
            ranges.append((start, end))
    return tuple(sorted(ranges))


def _write_lost_offsets(directory: Path, ranges: tuple[tuple[int, int], ...]) -> None:
    write_atomically(directory / LOST_OFFSETS_FILE, "".join(f"{a} {b}\n" for a, b in ranges).encode())


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def parse_partition_dir(name: str) -> tuple[str, int]:
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit():
        raise ValueError(f"not a partition directory name: {name!r}")
    return topic, int(part)


class Log:
    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.dir = directory
        self.topic, self.partition = parse_partition_dir(directory.name)
        self._config = config
        self._validator = LogValidator(config)
        self._roll_jitter_ms = roll_jitter_ms(config)  # taken off segment.ms for the active segment
        self.invalid_appends_total = 0  # leader appends refused by validation (metrics read it)
        self._refused_logged_s = -_REFUSED_LOG_INTERVAL_S
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._segments: tuple[LogSegment, ...] = ()
        self._bases: tuple[int, ...] = ()
        self._view: tuple[tuple[int, ...], tuple[LogSegment, ...]] = ((), ())
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._high_watermark = 0
        self._recovery_point = 0
        self._unflushed_records = 0
        self._truncations = 0  # bumped by every truncation: a flush racing one keeps the recovery point
        # Told the offset every truncation cut the log to, under the log's lock (the LogManager points it at
        # the cleaner, whose checkpoint must not stay above data that is gone).
        self.on_truncate: Callable[[int], None] | None = None
        self._last_flush_ms = _now_ms(None)
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self.epoch_cache = LeaderEpochFileCache(directory)
        self.producer_state = ProducerStateManager()
        # The first unstable offset (producer state's, at least the log start), None without any: recomputed under
        # the lock whenever it may change, read without it (``last_stable_offset``).
        self._first_unstable: int | None = None
        self.closed = False
        self._lost: tuple[tuple[int, int], ...] = ()  # see LOST_OFFSETS_FILE
        self._opened: list[LogSegment] | None = []  # segments opened by _load (closed if it fails)

    # ------------------------------------------------------------------ opening / recovery
    @classmethod
    def open(cls, dir: Path, config: LogConfig, *, recovery_point: int = 0, log_start_offset: int | None = None,
             now_ms: int | None = None, high_watermark: int | None = None, clean_shutdown: bool = False,
             full_recovery: bool = False) -> Log:
        """Open (or create) the partition log in ``dir`` and recover it.

        Segments from the one holding ``recovery_point`` onward are rescanned with CRC
        checks; the first torn or corrupt batch truncates the log there (WARNING logged)
        and every later segment is deleted. ``clean_shutdown`` skips the rescan (the last
        shutdown flushed everything); ``full_recovery`` rescans every segment.
        """
        dir.mkdir(parents=True, exist_ok=True)
        rescan_from = _read_rescan_from(dir)
        if rescan_from is not None:
            log.warning("%s: a read found a corrupt batch at offset %d before this start: CRC-scanning from the "
                        "segment holding it (the log is cut at the first bad batch; a follower fetches the rest "
                        "again from its leader)", dir, rescan_from)
            recovery_point = min(recovery_point, rescan_from)
            clean_shutdown = False
        self = cls(dir, config)
        try:
            with self._lock:
                self._load(recovery_point, log_start_offset, _now_ms(now_ms), clean_shutdown, full_recovery,
                           rescan_from, high_watermark)
        except errors.CorruptMessageError as exc:
            # A header that cannot be walked in a segment we trusted (before the recovery
            # point): distrust everything and CRC-scan the whole log instead of failing.
            self._close_opened()
            if full_recovery:
                raise
            log.warning("%s: %s while loading; falling back to a full recovery scan", dir, exc.message)
            self = cls(dir, config)
            with self._lock:
                self._load(recovery_point, log_start_offset, _now_ms(now_ms), False, True, rescan_from,
                           high_watermark)
        if high_watermark is not None:
            self.update_high_watermark(high_watermark)
        if rescan_from is not None:
            (dir / RESCAN_FROM_FILE).unlink(missing_ok=True)  # rescanned: the recovered bytes are flushed
            fsync_dir(dir)
        return self

    def mark_corrupt(self, offset: int) -> None:
        """A read found the batch at ``offset`` corrupt (``segment.CorruptBatchError``): the next open CRC-scans
        from its segment, even after a clean shutdown or with the recovery point past it (it is cut there)."""
        known = _read_rescan_from(self.dir)
        if known is None or offset < known:
            write_atomically(self.dir / RESCAN_FROM_FILE, f"{offset}\n".encode())

    def _close_opened(self) -> None:
        for seg in self._opened or []:
            seg.close()
        self._opened = []

    def _new_segment(self, base_offset: int, *, writable: bool, suffix: str = "",
                     now_ms: int | None = None) -> LogSegment:
        c = self._config
        seg = LogSegment(self.dir, base_offset, index_bytes=c.segment_index_bytes,
                         index_interval_bytes=c.index_interval_bytes, writable=writable, suffix=suffix,
                         created_ms=now_ms)
        if self._opened is not None:
            self._opened.append(seg)
        return seg

    def _load(self, recovery_point: int, log_start_offset: int | None, now_ms: int, clean_shutdown: bool,
              full_recovery: bool, rescan_from: int | None = None, high_watermark: int | None = None) -> None:
        self._remove_temp_files()
        lost = _read_lost_offsets(self.dir)
        # A read (or the scrubber) reported lost offsets, marked to be cut: the log ends where they begin.
        cut_at = next((a for a, b in lost if rescan_from is not None and a <= rescan_from < b), None)
        self._complete_swaps()
        # A leader-epoch-checkpoint lost or damaged: rebuilt below from every batch, after recovery. What recovery
        # alone observes starts at the recovery point: the epochs before it would be missing, and the one running
        # there would seem to start at it (OffsetsForLeaderEpoch would then answer end offsets past the real ones).
        epochs_lost = self.epoch_cache.damaged or self.epoch_cache.latest_entry() is None
        bases = sorted(int(p.name[: -len(LOG_SUFFIX)]) for p in self.dir.glob("*" + LOG_SUFFIX)
                       if p.name[: -len(LOG_SUFFIX)].isdigit())
        segments = [self._new_segment(b, writable=False) for b in bases]
        if log_start_offset is None:
            log_start_offset = bases[0] if bases else 0
        scan_all = full_recovery or not clean_shutdown
        first_recover = len(segments)
        if scan_all:
            # The segment holding the recovery point and every later one; all if forced.
            first_recover = 0 if full_recovery else max(0, bisect.bisect_right(bases, recovery_point) - 1)
        for seg in segments[:first_recover]:
            seg.load_without_recovery()
        self._bound_segment_ends(segments[:first_recover + 1])
        if found := self._lost_bytes(segments[:first_recover + 1]):
            # Written at once: the indexes that told it are rebuilt already, and a fallback to a full recovery
            # (a header that cannot be walked, below) loads again without them.
            lost = tuple(sorted(set(lost + found)))
            _write_lost_offsets(self.dir, lost)
        kept = self._recover_segments(segments, first_recover, cut_at)
        self._rebuild_producer_state(kept, high_watermark)
        if not kept:
            kept = [self._new_segment(log_start_offset, writable=True, now_ms=now_ms)]
        last = kept[-1]
        last.on_become_active()
        self._set_segments(kept)
        self._log_end_offset = last.next_offset
        self._log_start_offset = min(max(log_start_offset, kept[0].base_offset), self._log_end_offset)
        self.epoch_cache.truncate_from_end(self._log_end_offset)
        self.epoch_cache.truncate_from_start(self._log_start_offset)
        if (epochs_lost or self.epoch_cache.latest_entry() is None) and self._log_end_offset > self._log_start_offset:
            self.epoch_cache.clear()
            self._rebuild_epoch_cache(kept)
        if first_recover < len(segments):
            for seg in kept[first_recover:]:
                seg.flush()  # recovered bytes are now durable: the recovery point may pass them
            self._recovery_point = self._log_end_offset
        else:
            self._recovery_point = min(max(recovery_point, self._log_start_offset), self._log_end_offset)
        self._high_watermark = self._log_start_offset
        self.producer_state.on_high_watermark(self._high_watermark)
        self._refresh_first_unstable()
        self._lost = lost
        self._prune_lost()  # a cut ends the log where its lost offsets began: they go
        self._opened = None  # loaded: segments are tracked by the segment list from now on
        log.info("opened log %s: start %d, end %d, %d segments, recovery point %d", self.dir,
                 self._log_start_offset, self._log_end_offset, len(kept), self._recovery_point)

    def _remove_temp_files(self) -> None:
        for p in self.dir.iterdir():
            if p.name.endswith((CLEANED_SUFFIX, DELETED_SUFFIX, ".tmp")):
                log.info("removing leftover file %s", p)
                p.unlink(missing_ok=True)
            elif p.name.endswith(SWAP_SUFFIX) and not p.name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
                base = p.name[: -len(TXN_INDEX_SUFFIX + SWAP_SUFFIX)]
                if p.name.endswith(TXN_INDEX_SUFFIX + SWAP_SUFFIX) and \
                        (self.dir / (base + LOG_SUFFIX + SWAP_SUFFIX)).exists():
                    continue  # a swap's transaction index: _complete_swaps moves it in with its log
                p.unlink(missing_ok=True)  # index swaps: indexes of swapped segments are rebuilt; orphans go

    def _complete_swaps(self) -> None:
        """Finish a compaction swap interrupted by a crash (the .swap log is complete and fsynced).

        The transaction index cannot be rebuilt from its segment alone, so it is moved in, never dropped. It is
        renamed before the log in every suffix change (LogSegment.change_suffix): with a ``.log.swap`` present,
        the swap's index is ``.txnindex.swap``, or already has its final name when the crash came while the swap
        took its final names (the old segments were all renamed ``.deleted`` by then, so that name is the new
        index's, kept)."""
        for swap in sorted(self.dir.glob("*" + LOG_SUFFIX + SWAP_SUFFIX)):
            base = int(swap.name[: -len(LOG_SUFFIX + SWAP_SUFFIX)])
            seg = self._new_segment(base, writable=True, suffix=SWAP_SUFFIX)
            seg.recover(None, lambda h: None, base)
            end = seg.next_offset
            seg.close()
            txn_swap = self.dir / (segment_file_name(base, TXN_INDEX_SUFFIX) + SWAP_SUFFIX)
            txn_swapped = txn_swap.exists()
            for p in list(self.dir.glob("*" + LOG_SUFFIX)):
                other = int(p.name[: -len(LOG_SUFFIX)])
                if base <= other < max(end, base + 1):
                    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                        (self.dir / segment_file_name(other, suffix)).unlink(missing_ok=True)
                    if other != base or txn_swapped:
                        (self.dir / segment_file_name(other, TXN_INDEX_SUFFIX)).unlink(missing_ok=True)
            if txn_swapped:
                os.replace(txn_swap, self.dir / segment_file_name(base, TXN_INDEX_SUFFIX))
            os.replace(swap, self.dir / segment_file_name(base, LOG_SUFFIX))
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                (self.dir / (segment_file_name(base, suffix) + SWAP_SUFFIX)).unlink(missing_ok=True)
                (self.dir / segment_file_name(base, suffix)).unlink(missing_ok=True)  # rebuilt on load
            log.warning("completed interrupted compaction swap of %s (offsets %d..%d)", self.dir, base, end)

    def _bound_segment_ends(self, segments: list[LogSegment]) -> None:
        """A segment ends where the next one begins, at the latest. A loaded segment whose last batch header
        claims offsets past the next segment's base offset was damaged on disk (the base offset is outside
        the CRC): its end becomes that base offset, so a read of the damaged batch fails as a corrupt batch
        (and is handled as one) rather than serving the records under another segment's offsets, or leaving a
        consumer at the true offset with nothing to read for good."""
        for seg, after in zip(segments, segments[1:], strict=False):
            if seg.next_offset > after.base_offset:
                log.warning("%s: segment %s ends at offset %d by its last batch header, past the next segment's "
                            "base offset %d: a damaged header; its end is taken as %d", self.dir, seg,
                            seg.next_offset, after.base_offset, after.base_offset)
                seg.next_offset = after.base_offset

    def _lost_bytes(self, loaded: list[LogSegment]) -> tuple[tuple[int, int], ...]:
        """The offsets the segments ``loaded`` without recovery lost from their ends (``LogSegment.lost_bytes``):
        from where each now ends to the next segment's base offset. A segment cut short or emptied on disk left
        a hole that reads stepped over in silence, as they step over offsets compaction removed; they now fail
        there as at a corrupt batch. (A lost last segment only ends the log earlier: there is no hole.)"""
        found = []
        for seg, after in zip(loaded, loaded[1:], strict=False):
            if seg.lost_bytes() and seg.indexed_batch < after.base_offset:  # type: ignore[operator]
                log.error("%s: segment %s lost bytes on disk: its indexes name a batch at offset %d, its batches "
                          "end at %d; offsets %d to %d are on no segment and reads of them fail as a corrupt batch "
                          "(repaired from the in-sync replicas when there are any)", self.dir, seg,
                          seg.indexed_batch, seg.next_offset, seg.next_offset, after.base_offset - 1)
                found.append((seg.next_offset, after.base_offset))
        return tuple(found)

    def _prune_lost(self) -> None:
        """Forget lost offsets outside [log start, log end) (moved past, or cut); ``LOST_OFFSETS_FILE`` follows."""
        if not self._lost:
            return
        start, end = self._log_start_offset, self._log_end_offset
        kept = tuple(sorted({(max(a, start), min(b, end)) for a, b in self._lost if max(a, start) < min(b, end)}))
        if kept == self._lost:
            return
        self._lost = kept
        path = self.dir / LOST_OFFSETS_FILE
        if kept:
            _write_lost_offsets(self.dir, kept)
        elif path.exists():
            path.unlink()
            fsync_dir(self.dir)

    def lost_offsets_error(self, offset: int) -> CorruptBatchError | None:
        """The corrupt-batch error a read at ``offset`` fails with when a segment lost it on disk, else None."""
        lost = self._lost
        if not lost:
            return None
        i = bisect.bisect_right(lost, (offset, _OFFSET_MAX)) - 1
        if i < 0 or not lost[i][0] <= offset < lost[i][1]:
            return None
        a, b = lost[i]
        bases, segments = self._view
        seg = segments[max(0, bisect.bisect_right(bases, a) - 1)]
        return CorruptBatchError(seg.log_path, seg.size, a, f"the segment lost offsets {a} to {b - 1} on disk "
                                 "(its indexes named batches past where it now ends)", next_offset=b)

    def lost_offsets(self) -> tuple[tuple[int, int], ...]:
        return self._lost

    def _recover_segments(self, segments: list[LogSegment], first: int, cut_at: int | None = None
                          ) -> list[LogSegment]:
        """CRC-scan segments[first:]; cut at the first bad batch and drop everything after it. ``cut_at``: where
        lost offsets marked to be cut begin; every segment after it goes too."""
        kept = list(segments[:first])
        expected = kept[-1].next_offset if kept else 0
        cut = False
        for seg in segments[first:]:
            if not cut and cut_at is not None and seg.base_offset > cut_at:
                log.warning("recovery of %s: offsets from %d were lost on disk and are marked to be cut: segment %s "
                            "and every later one deleted (fetched again from the leader)", self.dir, cut_at, seg)
                cut = True
            if cut or seg.base_offset < expected:
                if not cut:
                    log.warning("recovery of %s: segment %s overlaps the previous one, deleted", self.dir, seg)
                seg.delete_files()
                continue
            cut = seg.recover(None, self._recovery_epoch_observer, expected)
            seg.txn_rebuild_needed = True  # its aborts are found again by the producer state scan
            if seg.size == 0 and kept:
                seg.delete_files()  # empty non-first segment: nothing to keep
                continue
            kept.append(seg)
            expected = seg.next_offset
        for seg in kept[:-1]:
            if seg.index.writable:
                seg.on_become_inactive()
        return kept

    def _recovery_epoch_observer(self, h: BatchHeader) -> None:
        if h.partition_leader_epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(h.partition_leader_epoch, h.base_offset)

    def _rebuild_epoch_cache(self, segments: list[LogSegment]) -> None:
        """The leader-epoch-checkpoint was lost or unreadable: rebuild it from batch headers."""
        log.warning("%s: leader epoch cache lost or damaged for a non-empty log; rebuilding it from the headers of "
                    "every batch", self.dir)
        for seg in segments:
            for _pos, h in seg.iter_headers(0):
                if h.partition_leader_epoch > self.epoch_cache.latest_epoch and h.next_offset > self._log_start_offset:
                    self.epoch_cache.assign(h.partition_leader_epoch, max(h.base_offset, self._log_start_offset))

    def _rebuild_producer_state(self, segments: list[LogSegment], high_watermark: int | None = None) -> None:
        """Producer state from the snapshot (if still valid) plus batch headers after it; and the transaction index
        of every segment that needs one rebuilt (recovered, missing, or failing its sanity check).

        A rebuilt index needs the producer state as of its segment's start (a transaction may begin segments
        earlier), so a segment needing one before the snapshot's offset makes the scan start from the log's
        first segment, unless the snapshot is of version 0: written before Brook had transactions, so the
        segments it covers hold no marker (logs from then have no ``.txnindex`` files: they are created empty).
        ``high_watermark``: the checkpointed one; transactions completed below it are not tracked as unreplicated
        (none when it is unknown: the high watermark is the log start until the leader moves it)."""
        ps = self.producer_state
        ps.clear()
        ps.on_high_watermark(_OFFSET_MAX if high_watermark is None else high_watermark)
        end = segments[-1].next_offset if segments else 0
        snapshot = self.dir / SNAPSHOT_FILE
        since = ps.load_snapshot(snapshot)
        if since is None or since > end:
            ps.clear()  # the log lost data the snapshot knows: rebuild from scratch
            since = 0
        if since > 0:
            # A valid snapshot was written by a clean close, which flushed every index: a segment it covers that
            # recovery rescanned anyway (a forced rescan, not a crash) still has all its aborts if its index is
            # there and sane (a cut past an entry fails the check).
            for seg in segments:
                if seg.txn_rebuild_needed and seg.next_offset <= since and seg.txn_index.existed:
                    with contextlib.suppress(ValueError, OSError):
                        seg.txn_index.sanity_check(seg.next_offset)
                        seg.txn_rebuild_needed = False
        needs = [seg for seg in segments if seg.txn_rebuild_needed]
        if needs and since > 0 and ps.snapshot_version != 0 and needs[0].base_offset < since:
            log.warning("%s: the transaction index of %s must be rebuilt: scanning the producer state of the whole "
                        "log", self.dir, needs[0])
            ps.clear()
            since = 0
        self._scan_producer_state(segments, since)
        for seg in needs:
            if seg.txn_rebuild_needed:  # wholly before a version 0 snapshot: no transaction there
                seg.txn_index.replace([])
                seg.txn_rebuild_needed = False
        # A later crash must not trust a snapshot the log may be truncated below: remove it now.
        snapshot.unlink(missing_ok=True)

    def _scan_producer_state(self, segments: list[LogSegment] | tuple[LogSegment, ...], since: int) -> None:
        """Apply every batch from ``since`` to the producer state (control batches read for their marker), writing
        the aborts of each segment whose ``txn_rebuild_needed`` is set to its transaction index, which then
        replaces the old one whole."""
        ps = self.producer_state
        for seg in segments:
            if seg.next_offset <= since:
                continue
            aborted: list[AbortedTxn] | None = [] if seg.txn_rebuild_needed else None
            for pos, h in seg.iter_headers(0):
                if h.producer_id < 0 or h.base_offset < since:
                    continue
                if h.attributes & ATTR_CONTROL:
                    done = ps.update(h, h.base_offset, self._marker_of(seg.read_bytes(pos, h.size), 0, h))
                    if done is not None and done.aborted and aborted is not None:
                        aborted.append(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                                  done.last_stable_offset))
                else:
                    ps.update(h, h.base_offset)
            if aborted is not None:
                seg.txn_index.replace(aborted)
                seg.txn_rebuild_needed = False

    def _marker_of(self, data: Buffer, pos: int, h: BatchHeader) -> tuple[int, int] | None:
        """(control type, coordinator epoch) of the control batch at ``pos`` of ``data``; None if it holds no
        transaction marker, or one that cannot be read (WARNING: it then ends no transaction)."""
        try:
            return end_txn_marker(data, pos)
        except errors.BrookError as exc:
            log.warning("%s: control batch at offset %d unreadable (%s): it ends no transaction", self.dir,
                        h.base_offset, exc.message)
            return None

    def _refresh_first_unstable(self) -> None:
        """Recompute the cached first unstable offset (caller holds the lock)."""
        ps = self.producer_state
        ps.txn_changed = False
        first = ps.first_unstable_offset()
        self._first_unstable = None if first is None else max(first, self._log_start_offset)

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def lock(self) -> threading.RLock:
        """The log's writer lock, re-entrant. Retention, compaction swaps, truncation and flushes take
        it without any partition lock (and may hold it through unlinks and fsyncs): code that must
        not wait (the broker's event loop) try-acquires it once, and every log call it then makes
        re-enters it instead of waiting."""
        return self._lock

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def segments(self) -> tuple[LogSegment, ...]:
        """Snapshot of the segment list (oldest first; the last one is active)."""
        return self._segments

    @property
    def recompresses(self) -> bool:
        """Are produced batches in another codec compressed again in the topic's ``compression.type``?"""
        return CODEC_BY_NAME.get(self._config.compression_type) is not None

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    def _set_segments(self, segments: list[LogSegment]) -> None:
        # Readers use (bases, segments) pairs; publish both as one tuple swap.
        self._view = (tuple(s.base_offset for s in segments), tuple(segments))
        self._bases, self._segments = self._view

    # ------------------------------------------------------------------ append
    def append_as_leader(self, records: bytes, leader_epoch: int, *, now_ms: int | None = None,
                         blocking: bool = True, transactional: bool = False,
                         verified: dict[int, int] | None = None) -> AppendInfo:
        """Validate (headers, CRCs, every record), assign offsets, stamp the epoch, write. All-or-nothing.

        ``blocking=False`` is for the broker's event loop: it raises ``WouldBlock``, having changed
        nothing, where the append would wait for the log's lock or do more than validate
        uncompressed records and write them to the page cache (decompress, recompress, roll a
        segment, fsync).

        ``transactional``: the produce request names a transactional id; then, and only then, every
        batch must be transactional, with a producer id and a base sequence (LogValidator). Control
        batches are refused either way: markers are the coordinator's (``append_marker_as_leader``).
        ``verified`` (with ``transactional``): producer id -> the ``marker_mark`` its coordinator's
        verification was made at; a batch opening a transaction is refused INVALID_TXN_STATE unless it is
        there and no marker of its producer was written since (``ProducerStateManager.check_verified``).
        """
        buf = bytearray(records)
        now = _now_ms(now_ms)
        try:
            headers = validate_batches(buf, max_batch_bytes=self._config.max_message_bytes, allow_empty=False)
            if not blocking and any(h.compression != CODEC_NONE for h in headers):
                raise WouldBlock("compressed records")  # decompression is the executor's CPU, not the loop's
            self._validator.validate(buf, headers, now, transactional=transactional)
        except (errors.CorruptMessageError, errors.InvalidRecordError, errors.MessageTooLargeError,
                errors.InvalidTimestampError) as exc:
            self._note_refused(exc)
            raise
        codec = CODEC_BY_NAME.get(self._config.compression_type)  # None: keep the producer's codec
        if codec is not None and any(h.compression != codec and not h.is_control for h in headers):
            if not blocking:
                raise WouldBlock("recompression")
            buf = _recompress(buf, headers, codec, self._config.compression_level(codec))
            headers = validate_batches(buf, max_batch_bytes=self._config.max_message_bytes, allow_empty=False)
        if len(buf) > self._config.segment_bytes:
            raise errors.RecordListTooLargeError(
                f"append of {len(buf)} bytes exceeds segment.bytes {self._config.segment_bytes}")
        with self.locked(blocking=blocking):
            self._ensure_open()
            dup = self._check_producers(headers, verified if transactional else None)
            if dup is not None:
                return dup
            if not blocking:
                self._refuse_roll_or_flush(len(buf), headers, self._log_end_offset
                                           + sum(h.last_offset_delta + 1 for h in headers) - 1, now)
            offset = first_offset = self._log_end_offset
            log_append = self._config.message_timestamp_type == "LogAppendTime"
            pos = 0
            assigned: list[BatchHeader] = []
            for h in headers:
                assign_offsets(buf, pos, offset, leader_epoch)
                if log_append:
                    set_log_append_time(buf, pos, now)
                assigned.append(read_header(buf, pos))  # the header exactly as it will be on disk
                offset += h.last_offset_delta + 1
                pos += h.size
            if leader_epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(leader_epoch, first_offset)
            self._write(buf, assigned, now)
            return self._append_info(assigned, len(buf), now if log_append else -1)

    def _note_refused(self, exc: errors.BrookError) -> None:
        # A hostile client can send refused batches in a loop: one INFO line per interval, the rest DEBUG.
        self.invalid_appends_total += 1
        now = time.monotonic()
        level = logging.INFO if now - self._refused_logged_s >= _REFUSED_LOG_INTERVAL_S else logging.DEBUG
        if level == logging.INFO:
            self._refused_logged_s = now
        log.log(level, "%s-%d: produced batch refused (%d so far): %s", self.topic, self.partition,
                self.invalid_appends_total, exc)

    def _check_producers(self, headers: list[BatchHeader], verified: dict[int, int] | None = None) -> AppendInfo | None:
        """Producer-state checks for every batch; a sole duplicate batch returns its original info."""
        pending: dict[int, ProducerEntry] = {}
        offset = self._log_end_offset
        lost = self._producer_state_may_be_lost()
        for h in headers:
            if h.producer_id < 0:
                offset += h.last_offset_delta + 1
                continue
            if h.producer_id not in pending:
                self.producer_state.check_verified(h, verified)
            dup = self.producer_state.check_leader_append(h, pending, state_may_be_lost=lost)
            if dup is not None:
                if len(headers) != 1:
                    raise errors.DuplicateSequenceNumberError(  # type: ignore[attr-defined]
                        f"producer {h.producer_id}: duplicate batch (sequence {h.base_sequence}) in a multi-batch append")
                count = dup.last_offset - dup.first_offset + 1
                return AppendInfo(dup.first_offset, dup.last_offset, dup.max_timestamp, -1, count, 1, 0,
                                  duplicate=True)
            ProducerStateManager.apply_to(pending, self.producer_state.entry(h.producer_id), h, offset)
            offset += h.last_offset_delta + 1
        return None

    def _producer_state_may_be_lost(self) -> bool:
        """Evidence that producers once written here may no longer be tracked.

        The log start moved (retention, DeleteRecords, a follower restarting above 0),
        compaction may have removed every batch of a producer (the state is rebuilt from
        the remaining batch headers on open), or the state manager dropped entries (the
        producer cap, truncation). Without any of these an unknown producer is new.
        """
        return (self._log_start_offset > 0 or self._config.compact
                or self.producer_state.forgot_producers)

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers quiet for ``expiration_ms`` (``ProducerStateManager.remove_expired``); how many."""
        with self._lock:
            return self.producer_state.remove_expired(now_ms, expiration_ms)

    def active_producers(self) -> list[tuple[int, int, int, int, int, int]]:
        """``ProducerStateManager.active``, read under the log's lock."""
        with self._lock:
            return self.producer_state.active()

    def producers_cleaner_keeps(self) -> tuple[set[int], dict[int, int]]:
        """``ProducerStateManager.cleaner_keeps``, read under the log's lock."""
        with self._lock:
            return self.producer_state.cleaner_keeps()

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its ongoing transaction (DescribeProducers' current transaction start
        offset), read under the log's lock."""
        with self._lock:
            return self.producer_state.ongoing()

    def marker_mark(self, producer_id: int) -> int:
        """``ProducerStateManager.marker_mark`` under the log's lock: taken before a transactional producer's
        batch is verified with its coordinator, and given back to ``append_as_leader`` as ``verified``."""
        with self._lock:
            return self.producer_state.marker_mark(producer_id)

    def producer_epoch(self, producer_id: int) -> int | None:
        """The epoch this log knows for ``producer_id`` (None: not tracked), read under the log's lock."""
        with self._lock:
            entry = self.producer_state.entry(producer_id)
            return None if entry is None else entry.epoch

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the lowest transaction undecided, or decided by a marker not yet below the high
        watermark (Kafka's), at least the log start; None when there is none. Read without the lock."""
        return self._first_unstable

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed reads stop (Kafka's LSO): the high watermark, or the first unstable offset when
        below it. Read without the lock."""
        high_watermark = self._high_watermark
        first = self._first_unstable
        return high_watermark if first is None or first >= high_watermark else first

    def has_aborted_transactions(self, start_offset: int) -> bool:
        """Does any segment from the one holding ``start_offset`` on index an aborted transaction? Counts kept in
        memory: no file is read (a read_committed fetch of a log without aborts skips the search)."""
        bases, segments = self._view
        return any(seg.txn_index.entries for seg in segments[max(0, bisect.bisect_right(bases, start_offset) - 1):])

    def aborted_transactions(self, start_offset: int, upper_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction whose offsets [first, marker] overlap
        [start_offset, upper_offset), for a read_committed fetch of that range (Kafka's
        collectAbortedTransactions): the ``.txnindex`` of the segment holding ``start_offset`` and of the later
        ones, until an entry whose last stable offset reaches ``upper_offset`` (no later abort can begin below
        it). Segments without aborts cost no read; one with many is searched, not read whole (storage/txn_index.py).
        Any thread, no lock: a read racing retention or a truncation reads again on a fresh segment list."""
        return [(t.producer_id, t.first_offset) for t in self.aborted_txn_entries(start_offset, upper_offset)]

    def aborted_txn_entries(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """``aborted_transactions`` as the ``.txnindex`` entries themselves, in the order of their markers (the
        cleaner needs each one's marker offset)."""
        if upper_offset <= start_offset:
            return []
        for attempt in range(_READ_ATTEMPTS):
            try:
                return self._aborted_once(start_offset, upper_offset)
            except (OSError, ValueError) as exc:
                if attempt == _READ_ATTEMPTS - 1 or disk_failure(exc) is not None:
                    raise errors.KafkaStorageError(
                        f"read of the aborted transactions of {self.dir} from {start_offset} failed: {exc}") from exc
        raise AssertionError("unreachable")

    def _aborted_once(self, start_offset: int, upper_offset: int) -> list[AbortedTxn]:
        bases, segments = self._view
        found: list[AbortedTxn] = []
        for seg in segments[max(0, bisect.bisect_right(bases, start_offset) - 1):]:
            index = seg.txn_index
            if index.entries == 0:
                continue
            truncations = seg.truncations
            txns, complete = index.collect(start_offset, upper_offset)
            if seg.truncations != truncations:
                raise SegmentChangedError(f"{seg} was truncated while its aborted transactions were read")
            found.extend(txns)
            if complete:
                break
        return found

    @contextlib.contextmanager
    def locked(self, *, blocking: bool = True) -> Iterator[None]:
        """Hold the log's (re-entrant) lock across several calls, e.g. a follower's append and high
        watermark update on the event loop; ``blocking=False`` raises ``WouldBlock`` while another
        thread holds it."""
        if not self._lock.acquire(blocking=blocking):
            raise WouldBlock("log lock held")
        try:
            yield
        finally:
            self._lock.release()

    def append_as_follower(self, records: bytes, *, blocking: bool = True) -> AppendInfo:
        """Append the leader's batches as they are (offsets and epochs already assigned).

        The first batch must start at the log end offset, or after it: on a compacted
        leader the batch following our log end may have lost its first offsets (Kafka
        accepts that gap too). Starting below the log end is refused. ``blocking=False`` (the
        event loop) raises ``WouldBlock``, having changed nothing, where the append would wait for
        the lock, roll a segment or flush.
        """
        headers = validate_batches(records)
        with self.locked(blocking=blocking):
            self._ensure_open()
            expected = self._log_end_offset
            if headers[0].base_offset < expected:
                raise UnexpectedAppendOffsetError(
                    f"{self.topic}-{self.partition}: follower append starts at {headers[0].base_offset}, "
                    f"below the log end offset {expected}")
            for h in headers:
                if h.base_offset < expected:
                    raise UnexpectedAppendOffsetError(
                        f"{self.topic}-{self.partition}: batch at {h.base_offset} overlaps offsets below {expected}")
                expected = h.next_offset
            now = _now_ms(None)
            if not blocking:
                self._refuse_roll_or_flush(len(records), headers, headers[-1].last_offset, now)
            for h in headers:
                if h.partition_leader_epoch > self.epoch_cache.latest_epoch:
                    self.epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
            self._write(records, headers, now)
            return self._append_info(headers, len(records), -1)

    def append_marker_as_leader(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                                leader_epoch: int, *, now_ms: int | None = None) -> AppendInfo:
        """Write one transaction marker (WriteTxnMarkers, from the transaction coordinator): a control batch of one
        COMMIT or ABORT record (key: version 0, type; value: version 0, coordinator epoch, as Kafka's
        EndTransactionMarker), transactional, uncompressed whatever compression.type says, base sequence -1, the
        producer's id and epoch in its header; stamped LogAppendTime on such topics, as any batch.

        Refused, nothing written, when its producer epoch is older than the producer's (InvalidProducerEpochError)
        or its coordinator epoch older than the last marker's (TransactionCoordinatorFencedError). A marker for a
        producer with no ongoing transaction is written and completes nothing: the coordinator retries markers.
        A coordinator epoch of -1 is an operator's (kafka-transactions abort, for a producer whose last marker, if
        any, said -1 too), as Kafka takes it. Followers and recovery apply markers without these checks."""
        if producer_id < 0 or not 0 <= producer_epoch <= _INT16_MAX or not -1 <= coordinator_epoch < 2**31:
            raise errors.InvalidRequestError(
                f"marker for producer {producer_id} epoch {producer_epoch}, coordinator epoch {coordinator_epoch}: "
                "out of range")
        now = _now_ms(now_ms)
        with self._lock:
            self._ensure_open()
            self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            offset = self._log_end_offset
            buf = bytearray(build_control_batch(
                commit, producer_id=producer_id, producer_epoch=producer_epoch, timestamp_ms=now,
                coordinator_epoch=coordinator_epoch, partition_leader_epoch=leader_epoch, base_offset=offset))
            log_append = self._config.message_timestamp_type == "LogAppendTime"
            if log_append:
                set_log_append_time(buf, 0, now)
            header = read_header(buf, 0)
            if leader_epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(leader_epoch, offset)
            self._write(buf, [header], now)
            return self._append_info([header], len(buf), now if log_append else -1)

    def _refuse_roll_or_flush(self, size: int, headers: list[BatchHeader], last_offset: int, now: int) -> None:
        """For a non-blocking append: ``WouldBlock`` if writing these batches would roll a segment or flush."""
        if self._roll_reason(size, last_offset, now) or self._flush_due(sum(h.record_count for h in headers), now):
            raise WouldBlock("segment roll or flush")

    def _write(self, data: bytes | bytearray, headers: list[BatchHeader], now: int) -> None:
        seg = self._maybe_roll(len(data), headers, now)
        seg.append(data, headers)
        ps = self.producer_state
        pos = 0
        for h in headers:
            if h.attributes & ATTR_CONTROL:
                done = ps.update(h, h.base_offset, self._marker_of(data, pos, h))
                if done is not None and done.aborted:  # in the index of the segment holding its marker
                    seg.txn_index.append(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                                    done.last_stable_offset))
            else:
                ps.update(h, h.base_offset)
            pos += h.batch_length + _LOG_OVERHEAD
        if ps.txn_changed:
            self._refresh_first_unstable()
        self._log_end_offset = headers[-1].next_offset
        records = sum(h.record_count for h in headers)
        due = self._flush_due(records, now)
        self._unflushed_records += records
        if due:
            self.flush()

    def _flush_due(self, records: int, now: int) -> bool:
        """Would writing ``records`` more reach flush.messages, or has flush.ms passed? Caller holds the lock."""
        return (self._unflushed_records + records >= self._config.flush_messages
                or now - self._last_flush_ms >= self._config.flush_ms)

    @staticmethod
    def _append_info(headers: list[BatchHeader], size: int, log_append_time_ms: int) -> AppendInfo:
        max_ts = max(h.max_timestamp for h in headers)
        return AppendInfo(headers[0].base_offset, headers[-1].last_offset, max_ts, log_append_time_ms,
                          sum(h.record_count for h in headers), len(headers), size)

    def _maybe_roll(self, size: int, headers: list[BatchHeader], now: int) -> LogSegment:
        reason = self._roll_reason(size, headers[-1].last_offset, now)
        if not reason:
            return self._segments[-1]
        seg = self._segments[-1]
        if (open_segments() >= segment_budget() and seg.can_hold_offset(headers[-1].last_offset)
                and seg.size + size <= _SEGMENT_POSITION_MAX):
            # Out of descriptors for segments (segment.py): the active segment grows past its bounds rather
            # than the process running out of descriptors; rolls resume once retention frees some.
            global _budget_warned_at
            if time.monotonic() - _budget_warned_at >= _BUDGET_WARN_EVERY_S:
                _budget_warned_at = time.monotonic()
                log.warning("not rolling %s (%s): this process holds %d segments, half its file-descriptor limit "
                            "at 3 each; the active segment grows until retention frees some. Raise the limit "
                            "(ulimit -n) or segment.bytes/segment.ms of topics that roll often", self.dir, reason,
                            open_segments())
            return seg
        log.debug("rolling %s: %s", self.dir, reason)
        return self._roll(headers[0].base_offset, now)

    def _roll_reason(self, size: int, last_offset: int, now: int) -> str:
        """Why ``size`` bytes ending at ``last_offset`` need a new segment ("" when they do not)."""
        seg = self._segments[-1]
        c = self._config
        if seg.size == 0:
            return ""
        if seg.size + size > c.segment_bytes:
            return f"size {seg.size} + {size} > segment.bytes {c.segment_bytes}"
        # A compacted log rolls by max.compaction.lag.ms too (Kafka's maxSegmentMs): the cleaner never touches
        # the active segment, so its records waited for segment.ms (7 days) whatever the lag said (audit).
        segment_ms, name = c.segment_ms, "segment.ms"
        if c.compact and 0 < c.max_compaction_lag_ms < segment_ms:
            segment_ms, name = c.max_compaction_lag_ms, "max.compaction.lag.ms"
        jitter = self._roll_jitter_ms if self._roll_jitter_ms < segment_ms else 0
        if now - seg.rolling_base_ms() > segment_ms - jitter:
            return (f"age {now - seg.rolling_base_ms()} ms > {name} {segment_ms}"
                    + (f" - jitter {jitter}" if jitter else ""))
        if seg.index.is_full() or seg.time_index.is_full():
            return "index full"
        if not seg.can_hold_offset(last_offset):
            return "offset too far from segment base"
        return ""

    def _roll(self, base_offset: int, now: int) -> LogSegment:
        old = self._segments[-1]
        if old.size == 0 and old.base_offset == base_offset:
            return old
        old.on_become_inactive()
        self._roll_jitter_ms = roll_jitter_ms(self._config)
        new = self._new_segment(base_offset, writable=True, now_ms=now)
        self._set_segments(list(self._segments) + [new])
        return new

    def roll(self, now_ms: int | None = None) -> None:
        with self._lock:
            self._ensure_open()
            self._roll(self._log_end_offset, _now_ms(now_ms))

    def _ensure_open(self) -> None:
        if self.closed:
            raise errors.KafkaStorageError(f"log {self.dir} is closed")

    # ------------------------------------------------------------------ read
    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_batch: bool = True, as_slice: bool = False) -> FetchData:
        """Whole batches from ``start_offset``; with ``as_slice`` the records are a FileRecords slice of
        the segment (zero copy: the caller sends it with sendfile and closes it) instead of bytes."""
        for attempt in range(_READ_ATTEMPTS):
            try:
                return self._read_once(start_offset, max_bytes, max_offset, min_one_batch, as_slice)
            except (OSError, ValueError) as exc:
                # A segment deleted or closed under us (retention, truncation, close): try
                # again on a fresh snapshot; the offset checks then give the right answer.
                # A disk that refused the read (EIO) is not retried: its directory has failed.
                if attempt == _READ_ATTEMPTS - 1 or disk_failure(exc) is not None:
                    raise errors.KafkaStorageError(f"read of {self.dir} at {start_offset} failed: {exc}") from exc
        raise AssertionError("unreachable")

    def _read_once(self, start_offset: int, max_bytes: int, max_offset: int | None,
                   min_one_batch: bool, as_slice: bool = False) -> FetchData:
        if self.closed:
            raise errors.KafkaStorageError(f"log {self.dir} is closed")
        bases, segments = self._view
        start, end = self._log_start_offset, self._log_end_offset
        if start_offset < start or start_offset > end:
            raise errors.OffsetOutOfRangeError(
                f"offset {start_offset} out of range [{start}, {end}] for {self.topic}-{self.partition}")
        bound = end if max_offset is None else min(max_offset, end)
        empty = FetchData(b"", -1, end, start)
        if start_offset >= bound:
            return empty
        if self._lost and (lost := self.lost_offsets_error(start_offset)) is not None:
            raise lost
        i = max(0, bisect.bisect_right(bases, start_offset) - 1)
        for seg in segments[i:]:
            reader = seg.read_slice if as_slice else seg.read
            got = reader(start_offset, max(max_bytes, 0), bound, min_one_batch)
            if got is None:
                continue  # nothing at or after start_offset here (compacted away): next segment
            data, first = got
            return FetchData(data, first, end, start) if data else empty
        return empty

    def iter_batches_from(self, start_offset: int, max_offset: int | None = None,
                          chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]:
        """Whole-batch chunks from ``start_offset`` up to ``max_offset`` (default: the log end).

        Bounded reads of about ``chunk_bytes`` each; for tools, tests and internal scans.
        """
        offset = start_offset
        for _ in range(MAX_ITER_READS):
            data = self.read(offset, chunk_bytes, max_offset=max_offset)
            if not data.records:
                return
            next_offset = offset
            for _pos, h in iter_batches(data.records):
                next_offset = h.next_offset
            yield data.records
            if next_offset <= offset:
                return
            offset = next_offset

    # ------------------------------------------------------------------ offsets and epochs
    def update_high_watermark(self, hw: int) -> int:
        with self._lock:
            self._high_watermark = min(max(hw, self._log_start_offset), self._log_end_offset)
            if self.producer_state.on_high_watermark(self._high_watermark):
                self._refresh_first_unstable()
            return self._high_watermark

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        with self._lock:
            self.epoch_cache.assign(epoch, start_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self.epoch_cache.end_offset_for(epoch, self._log_end_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of ``lookup_timestamp``: without the leader epoch."""
        found = self.lookup_timestamp(timestamp_ms)
        return None if found is None else (found.offset, found.timestamp)

    def lookup_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None:
        """The first record, from the log start, whose timestamp >= ``timestamp_ms``: its own offset and
        timestamp (Kafka: not its batch's base offset and max timestamp) and the partition leader epoch of its
        batch, as Kafka's ``UnifiedLog.fetchOffsetByTimestamp`` answers ListOffsets v4+ (the epoch a KIP-320
        client validates its position with; -1 when the batch carries none). None when no record has one.

        Sentinels as in Kafka: -2 -> (log start, -1, the epoch of the earliest leader epoch cache entry when it
        starts at or below the log start, else -1); -1 -> (log end, -1, the cache's latest epoch).
        """
        if timestamp_ms == EARLIEST_TIMESTAMP:
            with self._lock:  # the log start and the cache's first entry move together, under the lock
                start = self._log_start_offset
                first = self.epoch_cache.earliest_entry()
                epoch = first.epoch if first is not None and first.start_offset <= start else UNDEFINED_EPOCH
            return TimestampAndOffset(start, -1, epoch)
        if timestamp_ms == LATEST_TIMESTAMP:
            with self._lock:
                return TimestampAndOffset(self._log_end_offset, -1, self.epoch_cache.latest_epoch)
        _bases, segments = self._view
        start = self._log_start_offset
        for seg in segments:
            if seg.next_offset <= start or seg.max_timestamp < timestamp_ms:
                continue
            found = seg.find_offset_by_timestamp(timestamp_ms, start)
            if found is not None:
                return TimestampAndOffset(*found)
        return None

    # ------------------------------------------------------------------ truncation
    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after ``offset`` (a batch spanning it goes whole)."""
        with self._lock:
            self._ensure_open()
            if offset >= self._log_end_offset:
                return
            if offset < self._log_start_offset:
                self.truncate_fully_and_start_at(offset)
                return
            keep = [s for s in self._segments if s.base_offset <= offset]
            doomed = [s for s in self._segments if s.base_offset > offset]
            if not keep:
                self.truncate_fully_and_start_at(offset)
                return
            self._set_segments(keep)
            for seg in doomed:
                self._schedule_delete(seg)
            last = keep[-1]
            last.truncate_to(offset)
            last.on_become_active()
            self._after_truncation(last.next_offset)
            log.info("truncated %s to %d (log end now %d)", self.dir, offset, self._log_end_offset)

    @property
    def truncations(self) -> int:
        return self._truncations

    def _after_truncation(self, new_end: int) -> None:
        self._truncations += 1
        if self.on_truncate is not None:
            self.on_truncate(new_end)
        # Readers (no lock) see the last stable offset at the log start until the transactions are known again: a
        # cut may re-open one below the high watermark.
        self._first_unstable = self._log_start_offset
        self._log_end_offset = new_end
        self.epoch_cache.truncate_from_end(new_end)
        self._high_watermark = min(self._high_watermark, new_end)
        ps = self.producer_state
        if not ps.truncate_from(new_end):
            # Its history does not tell which transactions the cut re-opened: the state is read again from the log
            # (every batch header, under the lock; only past TXN_HISTORY transactions of a producer or a forgotten
            # producer's marker, see ProducerStateManager.truncate_from).
            log.info("%s: truncated to %d below what producer state remembers of its transactions: rebuilding it "
                     "from the log", self.dir, new_end)
            ps.clear()
            ps.on_high_watermark(self._high_watermark)
            self._scan_producer_state(self._segments, 0)
            ps.forgot_producers = True  # a truncation: what was cut may have been a producer's history
        ps.on_high_watermark(self._high_watermark)
        self._refresh_first_unstable()
        self._recovery_point = min(self._recovery_point, new_end)
        self._prune_lost()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything; the log restarts empty at ``offset``."""
        with self._lock:
            self._ensure_open()
            for seg in self._segments:
                self._schedule_delete(seg)  # renamed first, so the new segment's names are free
            self._set_segments([self._new_segment(offset, writable=True, now_ms=_now_ms(None))])
            self.epoch_cache.clear()
            dropped = len(self.producer_state) > 0
            self._first_unstable = self._log_start_offset  # as in _after_truncation, until it is recomputed
            self.producer_state.clear()
            self.producer_state.forgot_producers = dropped
            self._log_start_offset = self._log_end_offset = offset
            self._high_watermark = self._recovery_point = offset
            self.producer_state.on_high_watermark(offset)
            self._refresh_first_unstable()
            self._truncations += 1
            if self.on_truncate is not None:
                self.on_truncate(offset)
            self._prune_lost()
            log.info("truncated %s fully, restarting at %d", self.dir, offset)

    # ------------------------------------------------------------------ flush
    def flush(self) -> None:
        """fsync the unflushed segments; the recovery point moves to the log end.

        Lock order: the writer lock is never taken while the flush lock is held (appends
        hold the writer lock and may flush), so the fsyncs of a background flush do not
        block appends and no cycle is possible.
        """
        with self._lock:
            target = self._log_end_offset
            truncations = self._truncations
            bases, segments = self._view
            first = max(0, bisect.bisect_right(bases, self._recovery_point) - 1)
            self._unflushed_records = 0
            self._last_flush_ms = _now_ms(None)
        with self._flush_lock:
            for seg in segments[first:]:
                try:
                    seg.flush()
                except (OSError, ValueError):
                    if not seg.closed:
                        raise
        with self._lock:
            if truncations == self._truncations:  # else the flushed bytes may no longer be the log
                self._recovery_point = max(self._recovery_point, min(target, self._log_end_offset))

    def maybe_flush(self, now_ms: int | None = None) -> bool:
        """Background flusher: flush when flush.ms has passed since the last flush."""
        now = _now_ms(now_ms)
        if self._unflushed_records and now - self._last_flush_ms >= self._config.flush_ms:
            self.flush()
            return True
        return False

    # ------------------------------------------------------------------ retention
    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Retention: whole segments fully below the high watermark, by time then size. The active one too once
        every closed one goes and it is past retention itself, as Kafka's deletableSegments does: a new empty
        segment is rolled at the log end first. Only closed ones went, so a partition no longer written kept its
        last segment past retention.ms for good (audit)."""
        now = _now_ms(now_ms)
        with self._lock:
            self._ensure_open()
            self._delete_pending(now)
            c = self._config
            segments = self._segments
            candidates: list[LogSegment] = []
            for i, seg in enumerate(segments[:-1]):
                if segments[i + 1].base_offset > self._high_watermark:
                    break
                candidates.append(seg)
            doomed = 0
            # Segments entirely below the log start offset go first (start moved by other means).
            while doomed < len(candidates) and segments[doomed + 1].base_offset <= self._log_start_offset:
                doomed += 1
            if c.delete and c.retention_ms >= 0:
                while doomed < len(candidates) and now - candidates[doomed].largest_timestamp > c.retention_ms:
                    doomed += 1
            excess = -1
            if c.delete and c.retention_bytes >= 0:
                excess = sum(s.size for s in segments) - c.retention_bytes
                excess -= sum(s.size for s in candidates[:doomed])
                while doomed < len(candidates) and excess - candidates[doomed].size >= 0:
                    excess -= candidates[doomed].size
                    doomed += 1
            active = segments[-1]
            if (c.delete and doomed == len(segments) - 1 and active.size > 0
                    and self._high_watermark >= self._log_end_offset
                    and ((c.retention_ms >= 0 and now - active.largest_timestamp > c.retention_ms)
                         or (c.retention_bytes >= 0 and excess - active.size >= 0))
                    # The roll is a new segment, and the deleted one keeps its descriptors until
                    # file.delete.delay.ms: only within the descriptor budget, as any roll (_maybe_roll). A
                    # retention.ms of 1 on busy partitions took two of three nodes past their limit (audit).
                    and open_segments() < segment_budget()):
                self._roll(self._log_end_offset, now)
                segments = self._segments
                doomed += 1
            if doomed == 0:
                return 0
            victims = list(segments[:doomed])
            self._set_segments(list(segments[doomed:]))
            new_start = max(self._log_start_offset, self._segments[0].base_offset)
            self._log_start_offset = new_start
            self._recovery_point = max(self._recovery_point, new_start)
            self.epoch_cache.truncate_from_start(new_start)
            self._refresh_first_unstable()  # never below the log start
            self._prune_lost()
            for seg in victims:
                self._schedule_delete(seg, now)
            log.info("retention deleted %d segments of %s; log start now %d", doomed, self.dir, new_start)
            self._delete_pending(now)
            return doomed

    def _schedule_delete(self, seg: LogSegment, now: int | None = None) -> None:
        """Rename to .deleted now (off the segment list), close and unlink after file.delete.delay.ms."""
        try:
            seg.change_suffix(DELETED_SUFFIX)
        except OSError as exc:
            log.warning("could not rename %s for deletion: %s", seg, exc)
        self._pending_deletes.append((_now_ms(now) + self._config.file_delete_delay_ms, seg))
        if self._config.file_delete_delay_ms == 0:
            self._delete_pending(_now_ms(now))

    def _delete_pending(self, now: int, force: bool = False) -> None:
        still: list[tuple[int, LogSegment]] = []
        for deadline, seg in self._pending_deletes:
            if force or deadline <= now:
                seg.delete_files()
            else:
                still.append((deadline, seg))
        self._pending_deletes = still

    def delete_pending_segments(self, now_ms: int | None = None) -> None:
        with self._lock:
            self._delete_pending(_now_ms(now_ms))

    def set_log_start_offset(self, offset: int) -> None:
        """Move the log start forward (DeleteRecords-like); segments below go at the next retention run."""
        with self._lock:
            if offset > self._high_watermark:
                raise errors.OffsetOutOfRangeError(f"log start {offset} above high watermark {self._high_watermark}")
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                self.epoch_cache.truncate_from_start(offset)
                self._refresh_first_unstable()  # never below the log start
                self._prune_lost()

    # ------------------------------------------------------------------ compaction support
    def replace_segments(self, new: LogSegment, old: list[LogSegment]) -> bool:
        """Swap a cleaned segment (files ``*.cleaned``) in for ``old``; False if the log moved on.

        Crash safety: the cleaned files are renamed ``.swap`` (a complete, fsynced
        replacement, finished by ``_complete_swaps`` on the next open), the old segments
        are renamed ``.deleted``, then the swap files take their final names.
        """
        with self._lock:
            if self.closed:
                return False
            current = self._segments
            try:
                i = current.index(old[0])
            except ValueError:
                return False
            if tuple(current[i:i + len(old)]) != tuple(old) or i + len(old) >= len(current):
                return False  # truncation or retention changed these segments meanwhile
            new.change_suffix(SWAP_SUFFIX)
            fsync_dir(self.dir)
            for seg in old:
                self._schedule_delete(seg)
            new.change_suffix("")
            fsync_dir(self.dir)
            self._set_segments(list(current[:i]) + [new] + list(current[i + len(old):]))
            return True

    # ------------------------------------------------------------------ lifecycle
    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            if (config.segment_ms, config.segment_jitter_ms) != (self._config.segment_ms,
                                                                 self._config.segment_jitter_ms):
                self._roll_jitter_ms = roll_jitter_ms(config)
            self._config = config
            self._validator = LogValidator(config)

    def close(self) -> None:
        """Flush, write the final index entries, release files. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.flush()
            self.producer_state.write_snapshot(self.dir / SNAPSHOT_FILE, self._log_end_offset)
            active = self._segments[-1]
            active.on_become_inactive()
            active.flush()
            self.closed = True
            for seg in self._segments:
                seg.close()
            self._delete_pending(0, force=True)

    def close_without_flush(self) -> None:
        """Release files as a crash would leave them (tests, and deletion of the whole log)."""
        with self._lock:
            self.closed = True
            for seg in self._segments:
                seg.close()
            self._delete_pending(0, force=True)

    def delete(self) -> None:
        with self._lock:
            self.close_without_flush()
            shutil.rmtree(self.dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Log({self.topic}-{self.partition}, start={self._log_start_offset}, end={self._log_end_offset})"


_jitter_random = random.Random()


def roll_jitter_ms(config: LogConfig) -> int:
    """A segment's share of ``segment.jitter.ms`` (Kafka's randomSegmentJitter): uniform in
    [0, min(jitter, segment.ms)), drawn when the segment becomes the active one."""
    bound = min(config.segment_jitter_ms, config.segment_ms)
    return _jitter_random.randrange(bound) if bound > 0 else 0


def _recompress(buf: bytearray, headers: list[BatchHeader], codec: int, level: int | None = None) -> bytearray:
    """Re-encode batches with the topic's ``compression.type`` (Kafka's broker-side recompression).

    The only per-record work on the append path, and only for topics that ask for a codec
    other than ``producer``. Producer id/epoch/sequence, timestamps and headers are kept.
    """
    out = bytearray()
    pos = 0
    for h in headers:
        if h.compression == codec or h.is_control:
            out += buf[pos:pos + h.size]
        else:
            _h, records = decode_batch(buf, pos, verify_crc=False)  # CRC checked by validate_batches
            b = RecordBatchBuilder(codec, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                                   base_sequence=h.base_sequence, timestamp_type=h.timestamp_type,
                                   is_transactional=h.is_transactional,
                                   partition_leader_epoch=h.partition_leader_epoch, base_offset=h.base_offset,
                                   compression_level=level)
            for r in records:
                b.append(r.timestamp, r.key, r.value, r.headers)
            out += b.build()
        pos += h.size
    return out
