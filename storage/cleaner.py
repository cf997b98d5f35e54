"""LogCleaner: log compaction for ``cleanup.policy=compact`` (and ``compact,delete``).

A pass over one log (Kafka's algorithm, simplified):

1. The *dirty* section runs from the cleaner checkpoint (first dirty offset) to the first
   uncleanable offset: the active segment's base, the last stable offset, or the first
   segment younger than ``min.compaction.lag.ms``, whichever is smallest. The active
   segment is never touched. The last stable offset stands for the high watermark: it is at
   most that, and held at the first undecided transaction.
   A log is picked when its dirty ratio reaches ``min.cleanable.dirty.ratio``, or
   whatever the ratio when a dirty record is older than ``max.compaction.lag.ms``; when
   no log is, one whose cleaned section holds a tombstone past ``delete.retention.ms``
   (known from its last pass, in memory as Kafka's ``latestDeleteHorizon``), and that
   pass goes over the cleaned section only, dropping such tombstones.
2. An offset map ``hash(key) -> last offset`` is built over the dirty records. Its
   size is capped (``max_map_entries``, from ``log.cleaner.dedupe.buffer.size``): when
   full, the pass ends at the first record whose key did not fit, in the middle of a
   segment if need be, and the next pass maps on from there, so memory is bounded
   whatever the log size and every pass makes progress.
3. Every segment from the log start to the end of the mapped range is rewritten, in
   groups that fit one segment: a record is kept when no later record has its key; a
   tombstone (null value) is kept until its segment was last written more than
   ``delete.retention.ms`` ago by the broker's clock (the file's mtime, kept through
   rewrites); a record without a key goes (Kafka's cleaner drops it). Offsets never change: kept records stay in batches whose
   offsets are contiguous runs of the original batch (base offset = first kept offset),
   with the original codec, timestamps and producer fields. The last batch of every
   producer the log tracks always leaves a batch ending at its last offset, as Kafka's
   cleaner leaves one: the run of its last record, or a batch of no records over the
   offsets of its last records that went (Kafka's RETAIN_EMPTY). Producer state rebuilt
   from the log (after a crash, or on a new replica) must find where each producer's
   sequence stands, or its next batch would be refused as out of order; a retry of the
   whole batch is still recognised (``ProducerEntry.find_duplicate``). A producer whose
   epoch has no data batch (it wrote only markers since) keeps its markers of that epoch.
4. The rewritten group is written as ``*.cleaned``, fsynced, and swapped in by
   ``Log.replace_segments`` (``.swap`` rename protocol, finished on open after a crash).

Transactions (Kafka's CleanedTransactionMetadata). Nothing at or past the last stable offset is
cleaned: an undecided transaction's records cannot be judged. A record of an aborted
transaction (the ``.txnindex`` entries say which) is never mapped, so it never hides an older
committed record of its key, and it is removed: a read_committed reader never saw it and a
read_uncommitted one has no claim on it. A committed transaction's records are compacted as any
other, in batches that stay transactional. A COMMIT or ABORT marker stays as long as a batch of
its transaction does (a replica rebuilding producer state from the log would otherwise find a
transaction that never ends, and hold its last stable offset there for good), and then for
``delete.retention.ms``, as a tombstone, so a reader behind still sees the transaction end; then
it goes. The cleaned segment's ``.txnindex`` holds the entries of the aborts whose records are
still there, in marker order. A pass goes over the log from its start, so it meets a
transaction's batches before its marker whatever the segment groups.

Reads and writes are throttled to ``io_bytes_per_sec``. Background threads pick the log
with the highest dirty ratio above ``min.cleanable.dirty.ratio``.

Every batch read is checked against its CRC first. One whose bytes changed on disk stops the pass
(``CorruptBatchError``, nothing swapped in) and leaves the log *uncleanable* (as Kafka's
LogCleanerManager marks a partition whose cleaning failed) until it is opened again: the broker is
told (``on_corrupt``) and decides whether the log is cut there and fetched back at its next start
(broker/replica_manager.py). Rewriting such a batch would give a changed record a fresh CRC, and
no reader could tell it from the record that was written.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from proto import errors
from storage.log import Log
from storage.record_batch import (
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    NO_SEQUENCE,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    Record,
    RecordBatchBuilder,
    build_empty_batch,
    decode_batch,
    read_header,
    validate_batch,
    validate_batches,
)
from storage.segment import (
    CLEANED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SCAN_CHUNK_BYTES,
    TIME_INDEX_SUFFIX,
    CorruptBatchError,
    LogSegment,
    SegmentChangedError,
    segment_file_name,
)
from storage.txn_index import TXN_INDEX_SUFFIX, AbortedTxn

log = logging.getLogger(__name__)

DEFAULT_MAX_MAP_ENTRIES = 200_000  # ~30 MB of Python dict with 16-byte digests
MAP_ENTRY_BYTES = 160  # what one key of the map costs (log.cleaner.dedupe.buffer.size / threads / this)
DEFAULT_IO_BYTES_PER_SEC = 64 * 1024 * 1024
DEFAULT_BACKOFF_MS = 15_000
_WRITE_BUFFER_BYTES = 1024 * 1024  # cleaned batches are written in chunks of about this size
_INT32_MAX = 2**31 - 1

TopicPartitionKey = tuple[str, int]


def key_digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """Bounded ``digest(key) -> latest offset`` map."""

    def __init__(self, max_entries: int) -> None:
        if max_entries <= 0:
            raise ValueError("offset map needs room for at least one key")
        self.max_entries = max_entries
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._map)

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``key`` at ``offset``; False (and nothing stored) when a new key does not fit."""
        digest = key_digest(key)
        if digest not in self._map and len(self._map) >= self.max_entries:
            return False
        self._map[digest] = offset
        self.latest_offset = max(self.latest_offset, offset)
        return True

    def get(self, key: bytes) -> int | None:
        return self._map.get(key_digest(key))


class Throttler:
    """Keeps the average I/O rate under ``bytes_per_sec``; sleeps are interruptible."""

    def __init__(self, bytes_per_sec: float, stop: threading.Event | None = None) -> None:
        self.bytes_per_sec = bytes_per_sec
        self._stop = stop or threading.Event()
        self._start = time.monotonic()
        self._bytes = 0

    def account(self, n: int) -> None:
        if self.bytes_per_sec <= 0:
            return
        self._bytes += n
        ahead_s = self._bytes / self.bytes_per_sec - (time.monotonic() - self._start)
        if ahead_s > 0:
            self._stop.wait(min(ahead_s, 5.0))


@dataclass
class CleanerStats:
    segments_cleaned: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0
    tombstones_kept: int = 0  # below the pass's end, not yet past delete.retention.ms
    # When the first tombstone this pass kept below its end may go (a segment's last write + delete.retention.ms);
    # None: it kept none there.
    tombstones_due_ms: int | None = None
    keyless_dropped: int = 0
    producer_batches_kept: int = 0  # the last batch of a producer the log tracks (its tail at least: _filter_batch)
    aborted_dropped: int = 0  # records of aborted transactions removed
    markers_dropped: int = 0
    markers_kept: int = 0  # with nothing of their transaction left, not yet past delete.retention.ms
    first_dirty_offset: int = 0
    end_offset: int = 0


class CleanerAborted(Exception):
    """The cleaner was stopped mid-pass; nothing was swapped in for the current group."""


class LogCleaner:
    def __init__(self, logs: Callable[[], dict[TopicPartitionKey, Log]], *, threads: int = 1,
                 max_map_entries: int = DEFAULT_MAX_MAP_ENTRIES,
                 io_bytes_per_sec: float = DEFAULT_IO_BYTES_PER_SEC, backoff_ms: int = DEFAULT_BACKOFF_MS,
                 checkpoints: dict[TopicPartitionKey, int] | None = None) -> None:
        self._logs = logs
        self.threads = threads
        self.max_map_entries = max_map_entries
        self.io_bytes_per_sec = io_bytes_per_sec
        self.backoff_ms = backoff_ms
        self._lock = threading.Lock()
        self._first_dirty: dict[TopicPartitionKey, int] = dict(checkpoints or {})
        self._in_progress: set[TopicPartitionKey] = set()
        self._stop = threading.Event()
        # (log dir, error) of a failed cleaning: the LogManager's dir_failed (a disk error stops the broker).
        self.on_error: Callable[[object, BaseException], object] | None = None
        # (log, error) of a pass stopped by a corrupt batch; without it, on_error is told instead.
        self.on_corrupt: Callable[[Log, CorruptBatchError], object] | None = None
        # Logs a corrupt batch made uncleanable: the Log object (a log opened again is cleaned again) and
        # the batch's base offset. Under _lock.
        self._uncleanable: dict[TopicPartitionKey, tuple[Log, int]] = {}
        # When a log's cleaned section holds a tombstone that may go (CleanerStats.tombstones_due_ms of its last
        # pass), in memory as Kafka's latestDeleteHorizon: a log nothing dirties again is picked for it. Under _lock.
        self._tombstones_due: dict[TopicPartitionKey, int] = {}
        self._workers: list[threading.Thread] = []

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoints(self) -> dict[TopicPartitionKey, int]:
        with self._lock:
            return dict(self._first_dirty)

    def seed_checkpoints(self, checkpoints: dict[TopicPartitionKey, int]) -> None:
        """First dirty offsets read from the cleaner-offset-checkpoint files at startup."""
        with self._lock:
            self._first_dirty.update(checkpoints)

    def truncated(self, tp: TopicPartitionKey, offset: int) -> None:
        """``tp``'s log was cut to ``offset``: its checkpoint goes no further (Kafka's maybeTruncateCheckpoint).
        It stayed above, so records written again below it (a follower's diverged tail replaced) were never
        mapped: a tombstone among them went unmatched, then expired, and the value it deleted came back."""
        with self._lock:
            if self._first_dirty.get(tp, 0) > offset:
                self._first_dirty[tp] = offset

    def forget(self, tp: TopicPartitionKey) -> None:
        with self._lock:
            self._first_dirty.pop(tp, None)
            self._uncleanable.pop(tp, None)
            self._tombstones_due.pop(tp, None)

    def uncleanable(self) -> dict[TopicPartitionKey, int]:
        """The logs a corrupt batch keeps from being cleaned, with that batch's base offset."""
        logs = self._logs()
        with self._lock:
            return {tp: base for tp, (lg, base) in self._uncleanable.items() if logs.get(tp) is lg}

    def _is_uncleanable(self, tp: TopicPartitionKey, lg: Log) -> bool:
        with self._lock:
            entry = self._uncleanable.get(tp)
            if entry is not None and entry[0] is not lg:  # opened again (a restart rescans it): clean it
                del self._uncleanable[tp]
                entry = None
            return entry is not None

    def first_dirty_offset(self, lg: Log) -> int:
        with self._lock:
            return max(self._first_dirty.get((lg.topic, lg.partition), 0), lg.log_start_offset)

    # -- choosing work ---------------------------------------------------------------------
    def _uncleanable_from(self, lg: Log, now_ms: int) -> int:
        segments = lg.segments()
        bound = min(segments[-1].base_offset, lg.last_stable_offset)  # at most the high watermark
        lag = lg.config.min_compaction_lag_ms
        if lag > 0:
            for seg in segments[:-1]:
                if now_ms - seg.largest_timestamp < lag:
                    bound = min(bound, seg.base_offset)
                    break
        return bound

    def _overdue(self, lg: Log, now_ms: int) -> bool:
        """A dirty record older than max.compaction.lag.ms exists (first dirty segment's first batch)."""
        lag = lg.config.max_compaction_lag_ms
        first_dirty = self.first_dirty_offset(lg)
        for seg in lg.segments()[:-1]:
            if seg.next_offset > first_dirty:
                ts = seg.first_batch_timestamp
                return 0 < ts and now_ms - ts > lag
        return False

    def dirty_ratio(self, lg: Log, now_ms: int | None = None) -> float:
        now = _now_ms(now_ms)
        first_dirty = self.first_dirty_offset(lg)
        bound = self._uncleanable_from(lg, now)
        segments = lg.segments()
        closed = segments[:-1]
        total = sum(s.size for s in closed)
        dirty = sum(s.size for i, s in enumerate(closed)  # a segment cleaned up to its middle is dirty
                    if first_dirty < _next_base_of(segments, i) <= bound)
        return dirty / total if total else 0.0

    def tombstones_due(self, lg: Log, now_ms: int | None = None) -> bool:
        """Does ``lg``'s cleaned section hold a tombstone whose delete.retention.ms has passed?"""
        with self._lock:
            due = self._tombstones_due.get((lg.topic, lg.partition))
        return due is not None and due <= _now_ms(now_ms)

    def grab_filthiest(self, now_ms: int | None = None) -> Log | None:
        """The log to clean next: the dirtiest past its min.cleanable.dirty.ratio (or past max.compaction.lag.ms);
        when there is none, one whose cleaned section holds tombstones that may go, as Kafka's cleaner picks one
        (without it a delete stayed in a log nothing was written to again, for good)."""
        now = _now_ms(now_ms)
        best: tuple[float, Log] | None = None
        tombstones: Log | None = None
        for tp, lg in self._logs().items():
            if not lg.config.compact or lg.closed or self._is_uncleanable(tp, lg):
                continue
            with self._lock:
                if tp in self._in_progress:
                    continue
            ratio = self.dirty_ratio(lg, now)
            if ratio > 0 and self._overdue(lg, now):
                ratio = float("inf")  # max.compaction.lag.ms passed: clean regardless of the ratio
            if ratio > 0 and ratio >= lg.config.min_cleanable_dirty_ratio:
                if best is None or ratio > best[0]:
                    best = (ratio, lg)
            elif best is None and tombstones is None and self.tombstones_due(lg, now):
                tombstones = lg
        chosen = best[1] if best is not None else tombstones
        if chosen is None:
            return None
        with self._lock:
            tp = (chosen.topic, chosen.partition)
            if tp in self._in_progress:
                return None
            self._in_progress.add(tp)
        return chosen

    # -- one pass ----------------------------------------------------------------------------
    def clean_log(self, lg: Log, now_ms: int | None = None) -> CleanerStats:
        """Compact ``lg`` once (callers: the background threads, tests, admin tools). A corrupt batch raises
        ``CorruptBatchError`` and leaves the log uncleanable (see the module docstring)."""
        try:
            return self._clean_log(lg, now_ms)
        except CorruptBatchError as exc:
            if not confirmed_corrupt(lg, exc):
                raise SegmentChangedError(f"{lg.dir}: a segment changed while it was read ({exc})") from exc
            with self._lock:
                self._uncleanable[(lg.topic, lg.partition)] = (lg, exc.base_offset)
            raise

    def _clean_log(self, lg: Log, now_ms: int | None) -> CleanerStats:
        now = _now_ms(now_ms)
        stats = CleanerStats()
        truncations = lg.truncations
        first_dirty = self.first_dirty_offset(lg)
        stats.first_dirty_offset = first_dirty
        bound = self._uncleanable_from(lg, now)
        throttler = Throttler(self.io_bytes_per_sec, self._stop)
        offset_map = OffsetMap(self.max_map_entries)
        end = self._build_offset_map(lg, first_dirty, bound, offset_map, throttler)
        stats.end_offset = end
        # Nothing dirty to map: a pass still goes over the cleaned section when tombstones there may go (every
        # older record of their keys went when they were mapped, so they can be dropped below ``end``).
        if end <= first_dirty and not self.tombstones_due(lg, now):
            return stats
        segments = lg.segments()
        to_clean = [s for s in segments[:-1] if s.base_offset < end]  # the last one may end past ``end``
        # Read once: a producer that writes during the pass only makes a kept batch no longer its last.
        last_batches, marker_only = lg.producers_cleaner_keeps()
        txns = _Transactions(lg, marker_only)  # across groups: a marker may be in a later group than its records
        for group in self._group_segments(to_clean, lg.config.segment_bytes):
            self._clean_group(lg, group, offset_map, now, throttler, stats, last_batches, end, txns)
        with self._lock:
            if lg.truncations == truncations:  # else the truncation set it (``truncated``)
                self._first_dirty[(lg.topic, lg.partition)] = end
            if stats.tombstones_due_ms is None:
                self._tombstones_due.pop((lg.topic, lg.partition), None)
            else:
                self._tombstones_due[(lg.topic, lg.partition)] = stats.tombstones_due_ms
        log.info("cleaned %s: %d segments, %d -> %d bytes, kept %d of %d records (%d producers' last batches "
                 "whole, %d aborted records removed, %d transaction markers removed), dirty up to %d", lg.dir,
                 stats.segments_cleaned, stats.bytes_read, stats.bytes_written, stats.records_kept,
                 stats.records_read, stats.producer_batches_kept, stats.aborted_dropped, stats.markers_dropped, end)
        return stats

    def _build_offset_map(self, lg: Log, first_dirty: int, bound: int, offset_map: OffsetMap,
                          throttler: Throttler) -> int:
        """Map the keys of the dirty records from ``first_dirty`` to the end of the last dirty segment below
        ``bound``; return the end of the mapped range. When the map fills, the range ends at the first record
        whose key did not fit, in the middle of a segment if need be (Kafka's cleaner does the same): the pass
        cleans up to there and the next one maps on from it. A pass used to map whole segments only, so a
        segment of more distinct keys than the map holds was never cleaned, and the cleaner picked it again at
        once, for good, at a core's worth of CPU (audit)."""
        segments = lg.segments()
        end = first_dirty
        aborts = _Transactions(lg, {})
        for i, seg in enumerate(segments[:-1]):
            seg_end = _next_base_of(segments, i)
            if seg_end <= first_dirty:
                continue
            if seg_end > bound:
                break
            aborts.enter(max(seg.base_offset, first_dirty), seg_end)
            for h, batch in _iter_batches(seg, throttler, self._stop):
                if h.attributes & ATTR_CONTROL or h.last_offset < first_dirty:
                    continue
                if h.attributes & ATTR_TRANSACTIONAL and aborts.aborted(h):
                    continue  # never maps: it must not hide the committed record before it
                for rec in decode_batch(batch, verify_crc=False)[1]:  # _iter_batches checked it
                    if rec.offset < first_dirty or rec.key is None:
                        continue
                    if not offset_map.put(rec.key, rec.offset):
                        if rec.offset == first_dirty:  # cannot happen with room for one key: no progress
                            raise ValueError(f"the cleaner's offset map holds no key of {lg.dir}")
                        return rec.offset
            end = seg_end
        return end

    @staticmethod
    def _group_segments(segments: list[LogSegment], max_bytes: int) -> Iterator[list[LogSegment]]:
        group: list[LogSegment] = []
        size = 0
        for seg in segments:
            if group and (size + seg.size > max_bytes or seg.next_offset - group[0].base_offset > _INT32_MAX):
                yield group
                group, size = [], 0
            group.append(seg)
            size += seg.size
        if group:
            yield group

    def _clean_group(self, lg: Log, group: list[LogSegment], offset_map: OffsetMap, now: int,
                     throttler: Throttler, stats: CleanerStats, last_batches: set[int], mapped_end: int,
                     txns: _Transactions) -> None:
        """Rewrite ``group`` keeping each key's latest record (``offset_map``, which covers every record below
        ``mapped_end``). A tombstone goes once its segment was last written more than ``delete.retention.ms``
        ago, by the broker's clock (the file's mtime, kept through each rewrite): Kafka keeps a tombstone that
        long after the cleaner first sees it, whatever the record's own timestamp says. The record's timestamp
        was used, so a tombstone stamped in the past (a mirrored or replayed delete) went at the first pass,
        before a consumer behind could see the delete (audit). Only one below ``mapped_end``: past it a key's
        older records were not matched against it."""
        c = lg.config
        base = group[0].base_offset
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):  # leftovers of an aborted pass
            (lg.dir / (segment_file_name(base, suffix) + CLEANED_SUFFIX)).unlink(missing_ok=True)
        target = LogSegment(lg.dir, base, index_bytes=c.segment_index_bytes,
                            index_interval_bytes=c.index_interval_bytes, writable=True, suffix=CLEANED_SUFFIX,
                            created_ms=group[-1].created_ms)
        try:
            pending = bytearray()
            written = [seg.last_written_ms() for seg in group]
            for seg, seg_written_ms in zip(group, written, strict=True):
                due_ms = seg_written_ms + c.delete_retention_ms
                kept_before = stats.tombstones_kept + stats.markers_kept
                txns.enter(seg.base_offset, seg.next_offset)
                for h, batch in _iter_batches(seg, throttler, self._stop):
                    stats.bytes_read += h.size
                    if h.attributes & ATTR_CONTROL:
                        pending += self._filter_marker(h, batch, txns, target, now > due_ms, stats)
                        continue
                    pending += self._filter_batch(h, batch, offset_map, mapped_end, now > due_ms, stats,
                                                  last_batches, txns)
                if stats.tombstones_kept + stats.markers_kept > kept_before:  # not yet due: when they are
                    stats.tombstones_due_ms = min(due_ms, stats.tombstones_due_ms or due_ms)
                    if len(pending) >= _WRITE_BUFFER_BYTES:
                        self._write(target, pending, throttler, stats)
                        pending = bytearray()
            if pending:
                self._write(target, pending, throttler, stats)
            target.on_become_inactive()
            target.flush()
            newest_ns = max(written) * 1_000_000
            os.utime(target.log_path, ns=(newest_ns, newest_ns))  # when its newest segment was last written
            if lg.replace_segments(target, group):
                stats.segments_cleaned += len(group)
                return
            log.info("log %s changed during cleaning; dropping the cleaned copy", lg.dir)
        except BaseException:
            target.delete_files()
            raise
        target.delete_files()

    @staticmethod
    def _write(target: LogSegment, data: bytearray, throttler: Throttler, stats: CleanerStats) -> None:
        headers = validate_batches(data)  # assert right before it goes to disk
        target.append(data, headers)
        stats.bytes_written += len(data)
        throttler.account(len(data))

    @staticmethod
    def _filter_marker(h: BatchHeader, batch: memoryview, txns: _Transactions, target: LogSegment,
                       past_retention: bool, stats: CleanerStats) -> bytes:
        """A control batch: kept while its transaction has a batch left (an abort's index entry with it), or while
        its producer's state needs it; else kept until ``past_retention`` (its segment is past
        delete.retention.ms, counted in ``stats.markers_kept`` until then)."""
        needed, entry = txns.marker(h)
        if entry is not None:
            target.txn_index.append(entry)
        if needed:
            return bytes(batch)
        if past_retention:
            stats.markers_dropped += 1
            return b""
        stats.markers_kept += 1
        return bytes(batch)

    @staticmethod
    def _filter_batch(h: BatchHeader, batch: memoryview, offset_map: OffsetMap, mapped_end: int,
                      drop_tombstones: bool, stats: CleanerStats, last_batches: set[int],
                      txns: _Transactions) -> bytes:
        """The data batch's kept records, re-batched in runs of consecutive offsets. A record without a key goes,
        as Kafka's cleaner drops it (it can only be there from before the topic was compacted). A tombstone below
        ``mapped_end`` goes when ``drop_tombstones`` (its segment is past delete.retention.ms); one kept there
        counts in ``stats.tombstones_kept``. A transactional batch is judged by ``txns``: an aborted one's
        records all go, a committed one is compacted, and ``txns`` is told when something of it stays.

        A producer's last batch (``last_batches``) always leaves something ending at its last offset: the run of
        its last record, or a batch of no records over the offsets its last records had (Kafka's RETAIN_EMPTY),
        whose header carries the producer's epoch and last sequence. Such batches were kept whole, records a
        later one of their key replaced included: once that later one was a tombstone past delete.retention.ms,
        the value it deleted was back for every reader."""
        transactional = bool(h.attributes & ATTR_TRANSACTIONAL)
        aborted = transactional and txns.aborted(h)
        producers_last = h.producer_id >= 0 and h.last_offset in last_batches
        if producers_last:
            stats.producer_batches_kept += 1
            if transactional:
                txns.kept(h)  # even empty, it begins its transaction for a replay: its marker (and entry) stay
        if aborted and not producers_last:
            stats.records_read += h.record_count
            stats.aborted_dropped += h.record_count
            return b""
        _h, records = decode_batch(batch, verify_crc=False)  # _iter_batches checked it
        stats.records_read += len(records)
        kept: list[Record] = []
        if aborted:
            stats.aborted_dropped += len(records)
        else:
            for rec in records:
                if rec.key is None:
                    stats.keyless_dropped += 1
                    continue
                latest = offset_map.get(rec.key)
                if latest is not None and rec.offset < latest:
                    continue  # a later record has this key
                if rec.value is None and rec.offset < mapped_end:
                    if drop_tombstones:
                        stats.tombstones_dropped += 1
                        continue
                    stats.tombstones_kept += 1
                kept.append(rec)
        stats.records_kept += len(kept)
        if kept and transactional:
            txns.kept(h)
        if len(kept) == len(records) and (kept or producers_last):
            return bytes(batch)  # nothing removed: keep the original bytes (an empty batch still its producer's last)
        out = bytearray()
        run: list[Record] = []
        for rec in kept:
            if run and rec.offset != run[-1].offset + 1:
                out += _build_run(h, run)
                run = []
            run.append(rec)
        if run:
            out += _build_run(h, run)
        if producers_last and (not kept or kept[-1].offset != h.last_offset):
            out += build_empty_batch(h, kept[-1].offset + 1 if kept else h.base_offset)
        return bytes(out)

    # -- background threads ----------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        for i in range(self.threads):
            t = threading.Thread(target=self._run, name=f"log-cleaner-{i}", daemon=True)
            t.start()
            self._workers.append(t)

    def _run(self) -> None:
        while not self._stop.is_set():
            lg = self.grab_filthiest()
            if lg is None:
                self._stop.wait(self.backoff_ms / 1000)
                continue
            tp = (lg.topic, lg.partition)
            try:
                stats = self.clean_log(lg)
                if stats.end_offset <= stats.first_dirty_offset:  # nothing it could clean yet: not at once again
                    self._stop.wait(self.backoff_ms / 1000)
            except CleanerAborted:
                return
            except SegmentChangedError as exc:  # retention or a truncation under the read: the next pass
                log.info("cleaning %s stopped: %s", lg.dir, exc)
                self._stop.wait(self.backoff_ms / 1000)
            except CorruptBatchError as exc:
                log.error("cleaning %s stopped: %s; the log is not cleaned again until it is opened again",
                          lg.dir, exc)
                if self.on_corrupt is not None:
                    self.on_corrupt(lg, exc)
                elif self.on_error is not None:
                    self.on_error(lg.dir, exc)
            except (errors.BrookError, OSError, ValueError) as exc:
                # One bad log must not stop compaction of the others; it is retried after backoff.
                log.error("cleaning %s failed: %s", lg.dir, exc)
                if self.on_error is not None:
                    self.on_error(lg.dir, exc)
                self._stop.wait(self.backoff_ms / 1000)
            finally:
                with self._lock:
                    self._in_progress.discard(tp)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout_s)
        self._workers = []


class _Transactions:
    """What a pass knows of transactions as it walks the log in offset order (Kafka's
    CleanedTransactionMetadata): which producers' batches are in an aborted transaction here, and whose current
    transaction still has a batch kept. Fed one segment at a time (``enter``), the aborts overlapping it from
    the ``.txnindex`` files, so its memory is one segment's aborts plus one transaction per producer."""

    def __init__(self, lg: Log, marker_only: dict[int, int]) -> None:
        self._lg = lg
        self._marker_only = marker_only  # producers whose markers of this epoch are kept (cleaner_keeps)
        self._upcoming: list[tuple[int, int, AbortedTxn]] = []  # heap by first offset
        self._current: dict[int, AbortedTxn] = {}  # producer -> the abort its batches are in now
        self._kept: set[int] = set()  # producers whose current transaction has a batch kept by this pass
        self._taken: set[int] = set()  # marker offsets of the aborts taken that may overlap what comes next
        # Read once: an abort written during the pass is past what it cleans (below the last stable offset every
        # transaction is decided, its marker written). A log without one reads no index.
        self._any = lg.has_aborted_transactions(lg.log_start_offset)

    def enter(self, start: int, end: int) -> None:
        """The walk reaches [start, end): take the aborts overlapping it not taken before. One is known by its
        marker's offset: what it began with may have gone in an earlier pass, so its first offset can lie in a
        gap between segments, or below the log start."""
        if not self._any:
            return
        self._taken = {marker for marker in self._taken if marker >= start}
        for e in self._lg.aborted_txn_entries(start, end):
            if e.last_offset not in self._taken:
                self._taken.add(e.last_offset)
                heapq.heappush(self._upcoming, (e.first_offset, e.last_offset, e))

    def _advance(self, offset: int) -> None:
        while self._upcoming and self._upcoming[0][0] <= offset:
            e = heapq.heappop(self._upcoming)[2]
            self._current[e.producer_id] = e

    def aborted(self, h: BatchHeader) -> bool:
        """Is transactional batch ``h`` in an aborted transaction?"""
        self._advance(h.base_offset)
        e = self._current.get(h.producer_id)
        return e is not None and e.first_offset <= h.base_offset <= e.last_offset

    def kept(self, h: BatchHeader) -> None:
        self._kept.add(h.producer_id)

    def marker(self, h: BatchHeader) -> tuple[bool, AbortedTxn | None]:
        """Control batch ``h`` ends its producer's transaction: is it needed (a batch of the transaction stays,
        or its producer's state lives in it), and the index entry to keep with it (an abort with records left)."""
        self._advance(h.base_offset)
        pid = h.producer_id
        e = self._current.get(pid)
        if e is not None and e.last_offset == h.base_offset:
            del self._current[pid]
        else:
            e = None
        had_records = pid in self._kept
        self._kept.discard(pid)
        needed = had_records or self._marker_only.get(pid) == h.producer_epoch
        return needed, e if had_records else None


def _build_run(h: BatchHeader, run: list[Record]) -> bytes:
    """One batch of consecutive kept records with the original batch's codec and producer fields."""
    first_delta = run[0].offset - h.base_offset
    base_seq = NO_SEQUENCE if h.base_sequence == NO_SEQUENCE else (h.base_sequence + first_delta) % 2**31
    ts_type = TIMESTAMP_LOG_APPEND_TIME if h.attributes & ATTR_TIMESTAMP_TYPE else TIMESTAMP_CREATE_TIME
    b = RecordBatchBuilder(h.compression, producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                           base_sequence=base_seq, timestamp_type=ts_type,
                           is_transactional=bool(h.attributes & ATTR_TRANSACTIONAL),
                           partition_leader_epoch=h.partition_leader_epoch, base_offset=run[0].offset)
    for rec in run:
        b.append(rec.timestamp, rec.key, rec.value, rec.headers)
    return b.build()


def _iter_batches(seg: LogSegment, throttler: Throttler, stop: threading.Event
                  ) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch of ``seg`` as bytes, read in bounded chunks (throttled, stoppable), each checked as a
    fetch checks it (its CRC, and a header that can be walked): ``CorruptBatchError`` names the first that
    fails, before any of its records is decoded. The read takes no lock: the error carries the segment and its
    truncation count at the start, for ``confirmed_corrupt``."""
    truncations = seg.truncations
    try:
        yield from _walk_batches(seg, throttler, stop)
    except CorruptBatchError as exc:
        exc.segment, exc.truncations = seg, truncations
        raise


def confirmed_corrupt(lg: Log, corrupt: CorruptBatchError) -> bool:
    """Is the batch ``corrupt`` names (found by ``_iter_batches``, without the log's lock) corrupt in its segment
    as it is now? Read again under the log's lock, and only in a segment that is still one of the log's (the
    cleaner reads closed ones, the scrubber the active one too) and was not truncated since the read began:
    retention may have removed it (its descriptor closed, and its number perhaps another file's) and a
    follower's truncation may have cut it, and neither is corruption."""
    seg = corrupt.segment
    if seg is None:
        return True  # not from an unlocked read
    with lg.lock:
        if seg.closed or seg.truncations != corrupt.truncations or not any(s is seg for s in lg.segments()):
            return False
        end, pos = seg.size, corrupt.position
        if pos + BATCH_HEADER_SIZE > end:
            return False
        fd = seg._fd  # noqa: SLF001 - a sibling reader
        try:  # the walk's own checks; under the lock the segment ends at a batch's end
            h = _header(seg, os.pread(fd, BATCH_HEADER_SIZE, pos), 0, pos, end, corrupt.base_offset)
            _checked(seg, memoryview(os.pread(fd, h.size, pos)), pos, h)
        except CorruptBatchError:
            return True
        return False


def _walk_batches(seg: LogSegment, throttler: Throttler, stop: threading.Event
                  ) -> Iterator[tuple[BatchHeader, memoryview]]:
    pos, end = 0, seg.size
    fd = seg._fd  # noqa: SLF001 - the cleaner is the segment's sibling reader
    expected = seg.base_offset  # where the next batch starts, for a header too damaged to say
    while end - pos > 0:
        if stop.is_set():
            raise CleanerAborted()
        chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, end - pos), pos)
        if seg.closed:  # removed meanwhile: the descriptor's number may be another file's by now
            raise SegmentChangedError(f"{seg.log_path.name} was removed while it was read")
        throttler.account(len(chunk))
        view = memoryview(chunk)
        rel = 0
        while len(chunk) - rel >= BATCH_HEADER_SIZE:
            h = _header(seg, chunk, rel, pos + rel, end, expected)
            if rel + h.size > len(chunk):
                break
            yield h, _checked(seg, view[rel:rel + h.size], pos + rel, h)
            rel += h.size
            expected = h.next_offset
        if rel == 0:
            h = _header(seg, chunk, 0, pos, end, expected)
            whole = os.pread(fd, h.size, pos)
            if seg.closed:
                raise SegmentChangedError(f"{seg.log_path.name} was removed while it was read")
            throttler.account(len(whole))
            yield h, _checked(seg, memoryview(whole), pos, h)
            rel = h.size
            expected = h.next_offset
        pos += rel


def _header(seg: LogSegment, chunk: bytes, rel: int, position: int, end: int, expected: int) -> BatchHeader:
    """The header at ``chunk[rel:]`` (``position`` in ``seg``), of a batch that ends within the segment."""
    try:
        h = read_header(chunk, rel)
    except errors.CorruptMessageError as exc:
        raise CorruptBatchError(seg.log_path, position, expected, exc.message) from None
    if h.size < BATCH_HEADER_SIZE or position + h.size > end:
        raise CorruptBatchError(seg.log_path, position, expected,
                                f"its length field ({h.batch_length}) does not fit the segment")
    return h


def _checked(seg: LogSegment, batch: memoryview, position: int, h: BatchHeader) -> memoryview:
    try:
        validate_batch(batch)
    except errors.CorruptMessageError as exc:
        raise CorruptBatchError(seg.log_path, position, h.base_offset, exc.message,
                                next_offset=h.next_offset) from None
    return batch


def _next_base_of(segments: tuple[LogSegment, ...] | list[LogSegment], i: int) -> int:
    return segments[i + 1].base_offset if i + 1 < len(segments) else segments[i].next_offset


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms
