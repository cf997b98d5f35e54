"""LogSegment: one ``.log`` file of record batches plus its ``.index``, ``.timeindex`` and ``.txnindex``.

A segment holds the batches whose offsets start at its base offset (the file names,
``%020d``) up to the next segment's base. Appends are one ``pwrite`` of the bytes as they
came; reads are ``pread``s; the OS page cache is the only cache. The segment keeps in
memory only what the log needs to decide: its size, next offset, largest timestamp and
the bytes since the last index entry.

Lookups inside a segment read batch headers from an index entry, so what one costs is bounded by
the index interval:

- ``index.interval.bytes`` is used as at most ``INDEX_INTERVAL_BYTES_MAX`` (1 MiB), whatever a
  topic says (the controller refuses more; a topic or broker config from before still opens).
- A segment whose index is sparser than that (written with a larger interval) is walked at most
  once between two points ``MARK_BYTES`` apart: a walk that reads far from its index entry leaves
  in-memory marks (offset, position) of the batches it passed, and later lookups start from the
  nearest mark.
- Every offset-index entry is written together with the time-index entry of the largest timestamp
  up to its batch (when that grew), the time entry first, or neither is written. So the batches up
  to an index entry whose running largest timestamp is below ``t`` are exactly those before the first
  time-index entry at or above ``t``; a timestamp lookup is a binary search of the time index and a
  scan of about one index interval (``find_offset_by_timestamp``), not a walk from the segment start.

The ``.txnindex`` (storage/txn_index.py) lists the aborted transactions whose marker the segment holds. Unlike
the other two it cannot be rebuilt from the segment alone (a transaction's first offset may be in an earlier
segment): the Log rebuilds it from the producer state it scans (``txn_rebuild_needed``), renames it first in
every suffix change (the ``.log``'s rename is a swap's commit point, see Log._complete_swaps), and a cleaned
segment carries the entries of the segments it replaces.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from crc32c import crc32c

from proto import errors
from storage.abstract_index import CorruptIndexError
from storage.fd_budget import DescriptorBudget
from storage.file_records import FileRecords
from storage.log_config import INDEX_INTERVAL_BYTES_MAX
from storage.offset_index import OffsetIndex, OffsetPosition
from storage.record_batch import (
    BATCH_HEADER_SIZE,
    CRC_START,
    NO_PARTITION_LEADER_EPOCH,
    BatchHeader,
    check_stored_header,
    decode_batch,
    iter_batches,
    read_header,
    validate_batch,
)
from storage.time_index import TimeIndex, TimestampOffset
from storage.txn_index import TXN_INDEX_SUFFIX, CorruptTxnIndexError, TransactionIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"

# Recovery and header walks read the file in chunks of this size (bounded memory).
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# translate_offset reads at least this much from an index entry (it covers the index interval).
MIN_TRANSLATE_CHUNK_BYTES = 16 * 1024
# read_slice finds where a slice ends reading the headers this many bytes at a time.
SLICE_SCAN_CHUNK_BYTES = 64 * 1024
MAX_CHECKED_RANGES = 64  # per segment: the ranges read_slice and appends marked checked
# A walk leaves a mark every this many bytes it reads past its start (a sparse index: see the module doc).
MARK_BYTES = INDEX_INTERVAL_BYTES_MAX
DAMAGED_INDEX_LOG_INTERVAL_S = 60.0  # a damaged index entry: one WARNING a minute per segment, not one per read
_INT32_MAX = 2**31 - 1


def _mark_offset(mark: tuple[int, int]) -> int:
    return mark[0]


def _mark_position(mark: tuple[int, int]) -> int:
    return mark[1]


# Segments open in this process: each holds three file descriptors (log, offset and time index) for as long
# as it exists. Logs roll only while the count is below segment_budget() (see Log._maybe_roll): a topic
# configured to roll at every batch (segment.bytes of a few bytes, segment.ms of 1) took every node of a
# cluster to its descriptor limit in 11 s, the controller's journal failed with EMFILE, and the nodes
# could not even restart (found by an audit).
SEGMENT_FD_SHARE = 2  # segments may hold at most half of the process's descriptors
_SEGMENTS = DescriptorBudget(SEGMENT_FD_SHARE, per_item=3)


def open_segments() -> int:
    return _SEGMENTS.held()


def segment_budget() -> int:
    """Segments this process may hold open before rolls wait: half its file-descriptor limit, 3 each."""
    return _SEGMENTS.budget()


class CorruptBatchError(OSError):
    """A batch read from a segment fails its CRC: the bytes on disk changed since they were written
    (or recovered). An EIO, as a file system with checksums (btrfs, ZFS) reports such bytes, so that a
    read hitting it is treated as a failed disk read (storage/disk_errors.py), never served.
    ``next_offset``: the offset after the batch, when its header could still be read (a reader that
    must go on past it, such as a coordinator loading its state from the only replica), else None."""

    def __init__(self, path: Path, position: int, base_offset: int, detail: str,
                 next_offset: int | None = None) -> None:
        super().__init__(errno.EIO, f"corrupt batch at position {position} (base offset {base_offset}) of "
                                    f"{path.name}: {detail}", str(path))
        self.position = position
        self.base_offset = base_offset
        self.next_offset = next_offset
        # Set by a reader that took no lock (storage/cleaner.py ``_iter_batches``): the segment it read and its
        # truncation count when the read began, to read the batch again under the lock (``confirmed_corrupt``).
        self.segment: LogSegment | None = None
        self.truncations: int | None = None


class SegmentChangedError(OSError):
    """A read raced a change of its segment: a truncation (what it read may be of two appends), or, for a reader
    without the log's lock (the cleaner, the scrubber), the segment's removal. Nothing it read is corrupt: read
    it again."""


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def now_ms() -> int:
    return int(time.time() * 1000)


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, *, index_bytes: int, index_interval_bytes: int,
                 writable: bool, suffix: str = "", created_ms: int | None = None) -> None:
        self.dir = directory
        self.base_offset = base_offset
        # Bounded whatever the topic says: a lookup reads the batch headers of about one interval.
        self.index_interval_bytes = min(index_interval_bytes, INDEX_INTERVAL_BYTES_MAX)
        self.suffix = suffix
        self.log_path = directory / (segment_file_name(base_offset, LOG_SUFFIX) + suffix)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        self._index_bytes = index_bytes
        self.index_rebuild_needed = False
        self.indexed_batch: int | None = None  # see load_without_recovery
        self.index = self._open_index(OffsetIndex, INDEX_SUFFIX, writable)
        self.time_index = self._open_index(TimeIndex, TIME_INDEX_SUFFIX, writable)
        # Created empty with a new segment; missing beside batches it was lost: the Log rebuilds it (set also for
        # the segments recovery rescans, and when the sanity check fails), and clears this once it did.
        self.txn_index = TransactionIndex(self.dir / (segment_file_name(base_offset, TXN_INDEX_SUFFIX) + suffix),
                                          base_offset, create=self.size == 0)
        self.txn_rebuild_needed = not self.txn_index.existed
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.bytes_since_last_index_entry = 0
        self.first_batch_timestamp = -1
        self.created_ms = created_ms if created_ms is not None else now_ms()
        self.indexes_synced = not writable
        self.closed = False
        self.truncations = 0  # a reader without the log's lock tells that its bytes changed under it
        # (position, header) of the last batch appended since the segment opened or was truncated:
        # a follower or tailing consumer reads from it, with no index lookup or scan.
        self._last_appended: tuple[int, BatchHeader] | None = None
        # Index files written before index and time entries went in pairs (``_index_batch``) may lack a time
        # entry after the time index filled up; only then was a time entry ever skipped. Such an index is
        # full: its lookups past the last time entry do not trust the pairing (``find_offset_by_timestamp``).
        self._time_entries_may_lack = self.time_index.is_full()
        # (base offset, position) of batches found by walks far from an index entry (a sparse index), in
        # order; replaced whole under _marks_lock, read without it. _generation changes whenever batches
        # go away (truncation), so a walk that started before does not leave marks of what it read.
        self._marks: tuple[tuple[int, int], ...] = ()
        self._marks_lock = threading.Lock()
        # [start, end) ranges of the file whose batches passed their CRC since the segment opened (appended after
        # validation, or checked by a slice read), sorted and merged; replaced whole under _marks_lock, read
        # without it, dropped with the marks. A slice for sendfile within them is sent as it is; the rest of a
        # slice is read and checked first (``read_slice``).
        self._checked: tuple[tuple[int, int], ...] = ()
        self._damaged_index_logged = -DAMAGED_INDEX_LOG_INTERVAL_S
        self._generation = 0
        _SEGMENTS.add(1)

    def _open_index(self, cls: type[OffsetIndex] | type[TimeIndex], suffix: str, writable: bool):
        path = self.dir / (segment_file_name(self.base_offset, suffix) + self.suffix)
        if not path.exists() and self.size > 0:
            self.index_rebuild_needed = True
        return cls(path, self.base_offset, self._index_bytes, writable=writable)

    # -- state loading ------------------------------------------------------------------
    def load_without_recovery(self) -> None:
        """Trust the (flushed) log; check the indexes and rebuild them if they look wrong. ``indexed_batch``: an
        offset both indexes say a batch of this segment holds, read before any rebuild (see ``lost_bytes``)."""
        self.indexed_batch = self._offset_both_indexes_name()
        try:
            if self.index_rebuild_needed:
                raise CorruptIndexError(f"index files of {self.log_path} missing")
            self.index.sanity_check(self.size)
            self.time_index.sanity_check()
            self._load_tail_state()
        except (CorruptIndexError, errors.CorruptMessageError) as exc:
            log.warning("rebuilding indexes of %s: %s", self.log_path, exc)
            self.rebuild_indexes()
        if not self.txn_rebuild_needed:
            try:
                self.txn_index.sanity_check(self.next_offset)
            except CorruptTxnIndexError as exc:
                log.warning("rebuilding the transaction index of %s: %s", self.log_path, exc)
                self.txn_rebuild_needed = True

    def _offset_both_indexes_name(self) -> int | None:
        """The smaller of the two indexes' last entries' offsets: a batch at or past it was in this segment when
        they were written (each names the base offset of a batch it indexed). None when either is empty or
        unreadable: a small segment has no entry, and one damaged file alone proves nothing."""
        if self.index_rebuild_needed or self.index.entries == 0 or self.time_index.entries == 0:
            return None
        try:
            return min(self.index.last_entry().offset, self.time_index.last_entry().offset)
        except (ValueError, OSError):  # closed under us
            return None

    def lost_bytes(self) -> bool:
        """Did this (trusted, flushed) segment lose bytes from its end since it was indexed? Both of its indexes
        name a batch at or past where its batches now end: the file was cut short (or emptied) on disk. Known
        only after ``load_without_recovery``; the indexes are rebuilt from what is left, so the caller keeps
        the answer (storage/log.py: ``lost-offsets``)."""
        return self.indexed_batch is not None and self.indexed_batch >= self.next_offset

    def _load_tail_state(self) -> None:
        """Next offset, largest timestamp and index bookkeeping from the indexes + a short tail walk.

        Every batch before the last time index entry's offset has a smaller timestamp, and
        every batch before the last offset index entry is accounted for, so walking from the
        smaller of the two positions to the end restores the in-memory state exactly.
        """
        last_time = self.time_index.last_entry()
        self.max_timestamp, self.offset_of_max_timestamp = last_time.timestamp, last_time.offset
        last_index = self.index.last_entry()
        start = min(self.index.lookup(last_time.offset).position, last_index.position)
        next_offset = self.base_offset
        for _pos, h in self.iter_headers(start):
            self._observe(h)
            next_offset = h.next_offset
        self.next_offset = next_offset  # once: a read's walk (after a truncation) takes it as the segment's end
        self.bytes_since_last_index_entry = self.size - last_index.position
        first = self.read_header_at(0) if self.size >= BATCH_HEADER_SIZE else None
        if first is not None:
            self.first_batch_timestamp = first.max_timestamp
            if first.max_timestamp > 0:
                self.created_ms = min(self.created_ms, first.max_timestamp)

    def _observe(self, h: BatchHeader) -> None:
        if h.max_timestamp > self.max_timestamp:
            self.max_timestamp = h.max_timestamp
            self.offset_of_max_timestamp = h.base_offset

    def rebuild_indexes(self, *, active: bool = False) -> None:
        """Walk every batch header (no CRC) and write fresh index entries."""
        self.on_become_active()
        self._reset_state()
        for pos, h in self.iter_headers(0):
            self._index_batch(h, pos)
            self.next_offset = h.next_offset
        self.index_rebuild_needed = False
        if not active:
            self.on_become_inactive()

    def _reset_state(self) -> None:
        self._last_appended = None
        self._drop_marks_from(0)
        self.index.reset()
        self.time_index.reset()
        self._time_entries_may_lack = False  # rebuilt by _index_batch: in pairs
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.bytes_since_last_index_entry = 0
        self.first_batch_timestamp = -1

    def recover(self, max_batch_bytes: int | None, on_batch: Callable[[BatchHeader], None],
                min_offset: int) -> bool:
        """Rescan with CRC checks; truncate at the first bad batch. True if the segment was cut.

        ``min_offset``: the first batch must start at or after it (the previous segment's end).
        """
        self.on_become_active()
        self._reset_state()
        pos = 0
        expected = max(min_offset, self.base_offset)
        reason = ""
        size = os.fstat(self._fd).st_size
        while pos < size:
            want = min(SCAN_CHUNK_BYTES, size - pos)
            chunk = os.pread(self._fd, want, pos)
            if len(chunk) < BATCH_HEADER_SIZE:
                reason = f"torn batch header ({len(chunk)} bytes)"
                break
            try:
                h = read_header(chunk, 0)
                if h.size > len(chunk):
                    if pos + h.size > size:
                        raise errors.CorruptMessageError(
                            f"torn batch: length says {h.size} bytes, {size - pos} left in file")
                    chunk = os.pread(self._fd, h.size, pos)
                consumed = self._recover_chunk(chunk, pos, max_batch_bytes, on_batch, expected)
            except errors.BrookError as exc:
                reason = exc.message
                consumed = 0
            if consumed == 0:
                break
            pos += consumed
            expected = self.next_offset
        if self.first_batch_timestamp > 0:
            # segment.ms counts from the first batch's time, not from this restart
            self.created_ms = min(self.created_ms, self.first_batch_timestamp)
        if pos < size:
            log.warning("recovery of %s: truncating at position %d (offset %d, %d bytes dropped): %s",
                        self.log_path, pos, self.next_offset, size - pos, reason or "corrupt batch")
            os.ftruncate(self._fd, pos)
            self.size = pos
            return True
        self.size = pos
        return False

    def _recover_chunk(self, chunk: bytes, chunk_pos: int, max_batch_bytes: int | None,
                       on_batch: Callable[[BatchHeader], None], expected: int) -> int:
        """Validate the complete batches of ``chunk``; return the bytes consumed.

        A bad batch at the start of the chunk raises (the caller truncates there); one
        further in ends the chunk early, so the next call starts at it and reports it.
        """
        pos = 0
        while len(chunk) - pos >= BATCH_HEADER_SIZE:
            try:
                h = read_header(chunk, pos)
                if pos + h.size > len(chunk):
                    if pos > 0:
                        break  # continues in the next chunk
                    raise errors.CorruptMessageError(f"torn batch: length says {h.size} bytes")
                h = validate_batch(chunk, pos, max_batch_bytes=max_batch_bytes)
                if h.base_offset < expected:
                    raise errors.CorruptMessageError(
                        f"batch base offset {h.base_offset} below expected {expected}")
                if h.last_offset - self.base_offset > _INT32_MAX:
                    raise errors.CorruptMessageError(f"offset {h.last_offset} too far from segment base")
            except errors.BrookError:
                if pos == 0:
                    raise
                break
            self._index_batch(h, chunk_pos + pos)
            self.next_offset = expected = h.next_offset
            on_batch(h)
            pos += h.size
        return pos

    def _index_batch(self, h: BatchHeader, position: int) -> None:
        if self.first_batch_timestamp < 0:
            self.first_batch_timestamp = h.max_timestamp
        self._observe(h)
        if (self.bytes_since_last_index_entry > self.index_interval_bytes and position > 0
                and self._room_for_index_entry()):
            # The time entry first: a reader (no lock) that sees this offset-index entry sees its time entry.
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.index.append(h.base_offset, position)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += h.size

    def _room_for_index_entry(self) -> bool:
        """Room for an offset-index entry and, if the largest timestamp grew, its time-index entry? Without
        it neither is written (the log rolls at its next append): an offset-index entry without the time
        entry it needs would make ``find_offset_by_timestamp`` skip the batches before it."""
        if self.index.entries >= self.index.max_entries:
            return False
        return not (self.time_index.is_full() and self.time_index.needs_entry(self.max_timestamp))

    # -- append / read --------------------------------------------------------------------
    def append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> None:
        """Write validated batches (offsets already assigned) as one pwrite, then index them."""
        assert headers and headers[0].base_offset >= self.next_offset, (headers[0], self.next_offset)
        start = self.size
        view = memoryview(data)
        try:
            written = 0
            while written < len(view):
                written += os.pwrite(self._fd, view[written:], start + written)
        except OSError as exc:
            os.ftruncate(self._fd, start)  # all or nothing: drop a partial write
            raise errors.KafkaStorageError(f"write to {self.log_path} failed: {exc}") from exc
        finally:
            view.release()
        pos = start
        for h in headers:
            self._index_batch(h, pos)
            pos += h.size
        self.next_offset = headers[-1].next_offset
        self._last_appended = (pos - headers[-1].size, headers[-1])
        self._mark_checked(start, pos, self._generation)  # validated batches (leader, follower, cleaner alike)
        self.size = pos  # publish last: readers never see a half-written append
        self.indexes_synced = False

    def read_bytes(self, position: int, size: int) -> bytes:
        """``size`` bytes of the log file from ``position`` (a control batch's record, for producer state)."""
        return os.pread(self._fd, size, position)

    def read_header_at(self, position: int) -> BatchHeader | None:
        data = os.pread(self._fd, BATCH_HEADER_SIZE, position)
        if len(data) < BATCH_HEADER_SIZE:
            return None
        return read_header(data, 0)

    def iter_headers(self, start: int = 0, end: int | None = None, chunk_bytes: int = SCAN_CHUNK_BYTES,
                     *, strict: bool = False) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every complete batch in [start, end), reading ``chunk_bytes`` at a time
        (one pread for many small batches; a batch larger than a chunk costs one pread of a chunk).
        ``strict`` (reads): a batch whose length runs past the end of the segment is a damaged header
        (``CorruptMessageError``), not the end of the walk: a flipped bit in a length field made every batch
        after it in the segment be stepped over in silence."""
        end = self.size if end is None else end
        pos = start
        while end - pos >= BATCH_HEADER_SIZE:
            chunk = os.pread(self._fd, min(chunk_bytes, end - pos), pos)
            advanced = 0
            for rel, h in iter_batches(chunk, 0):
                yield pos + rel, h
                advanced = rel + h.size
            if advanced == 0:
                h = read_header(chunk, 0)  # a batch bigger than a chunk: step over it
                if pos + h.size > end:
                    if strict and pos + h.size > self.size:
                        raise errors.CorruptMessageError(
                            f"batch at position {pos} is {h.size} bytes long, past the end of the segment "
                            f"({self.size} bytes)")
                    return
                yield pos, h
                advanced = h.size
            pos += advanced

    def translate_offset(self, offset: int, max_position: int | None = None) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= ``offset``; None past the end."""
        end = self.size if max_position is None else max_position
        last = self._last_appended
        if last is not None and last[1].base_offset <= offset <= last[1].last_offset and last[0] + last[1].size <= end:
            return last
        return self._walk(self._start_for(offset, end), end, lambda h: h.last_offset >= offset)

    def _starts_batch(self, position: int, base_offset: int, end: int) -> bool:
        try:
            at = self.read_header_at(position) if position + BATCH_HEADER_SIZE <= end else None
        except errors.CorruptMessageError:
            at = None
        return at is not None and at.base_offset == base_offset

    def _start_for(self, offset: int, end: int) -> int:
        """Where a walk to ``offset`` starts: the position of the closest batch at or before the one holding it
        that the index or a mark names (0 without either)."""
        entry = self.index.lookup(offset)
        marks = self._marks
        i = bisect.bisect_right(marks, offset, key=_mark_offset) - 1
        if i >= 0 and marks[i][1] > entry.position and self._starts_batch(marks[i][1], marks[i][0], end):
            return marks[i][1]
        return self._checked_position(entry, end)

    def _checked_position(self, entry: OffsetPosition, end: int) -> int:
        """``entry``'s position if the batch there starts at its offset, else 0: a damaged index must not send
        a walk to the wrong bytes (reads and timestamp lookups alike), so the walk scans from the start."""
        if entry.position > 0 and not self._starts_batch(entry.position, entry.offset, end):
            self._warn_damaged_index("%s: index entry %s does not point at its batch; scanning from the start",
                                     self.index.path, entry)
            return 0
        return entry.position

    def _warn_damaged_index(self, message: str, *args: object) -> None:
        """A WARNING about a damaged index entry, at most one a minute per segment: each read meets it again."""
        now = time.monotonic()
        if now - self._damaged_index_logged >= DAMAGED_INDEX_LOG_INTERVAL_S:
            self._damaged_index_logged = now
            log.warning(message, *args)

    def _time_entry_holds(self, entry: TimestampOffset | None, end: int) -> bool:
        """Does the batch ``entry`` names (each time-index entry is the largest timestamp so far and the base
        offset of the batch holding it, ``_index_batch``) start at its offset with that largest timestamp?
        A damaged entry used to start a timestamp lookup past the batches it should find (a later offset
        answered)."""
        if entry is None:
            return True
        indexed = self.index.lookup(entry.offset)
        try:
            if indexed.offset == entry.offset and indexed.position + BATCH_HEADER_SIZE <= end:
                # The usual case (timestamps that grow): the time entry's batch is the offset entry's, one header.
                found: tuple[int, BatchHeader] | None = (indexed.position, self.read_header_at(indexed.position))
            else:
                found = self._walk(self._start_for(entry.offset, end), end, lambda h: h.last_offset >= entry.offset)
        except errors.CorruptMessageError:
            found = None  # the lookup's own walk meets it too, and fails as a corrupt batch
        if found is not None and found[1].base_offset == entry.offset and found[1].max_timestamp == entry.timestamp:
            return True
        self._warn_damaged_index("%s: time index entry %s does not name a batch with that largest timestamp; "
                                 "timestamp lookups scan this segment from the start", self.time_index.path, entry)
        return False

    def _walk(self, start: int, end: int, wanted: Callable[[BatchHeader], bool]
              ) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch from ``start`` (a batch's position) before ``end`` that is
        ``wanted``, or None. A walk that reads far from its start leaves marks (see the module doc)."""
        # From an index entry, a read of about two index intervals holds every header up to the
        # batch wanted (small batches: one pread, not one per batch).
        chunk_bytes = min(SCAN_CHUNK_BYTES, max(2 * self.index_interval_bytes, MIN_TRANSLATE_CHUNK_BYTES))
        generation = self._generation
        marks: list[tuple[int, int]] = []
        marked = start
        found = None
        after = -1  # the offset after the batch before: offsets only grow along a segment
        # ... and end where the segment does: an append sets next_offset before it publishes its size, so every
        # batch before ``end`` (the caller's snapshot of the size) ends by this (a truncation racing the walk is
        # the read's generation check's: it reads again).
        limit = self.next_offset
        headers = self.iter_headers(start, end, chunk_bytes, strict=True)
        for at, h in headers:
            # A batch stepped over is not read, so its CRC is not checked: its offsets must at least agree with
            # its record count and follow the batch before (the base offset is outside the CRC), or a flipped
            # offset field would make every read skip it, or misplace it, in silence.
            check_stored_header(h, at)
            if h.base_offset < after or h.next_offset > limit:
                raise errors.CorruptMessageError(
                    f"batch at position {at} holds offsets {h.base_offset} to {h.next_offset - 1}, not after the "
                    f"batch before it (which ends before {after}) and within the segment (which ends before {limit})")
            after = h.next_offset
            if wanted(h):
                found = at, h
                break
            if at - marked >= MARK_BYTES:
                marks.append((h.base_offset, at))
                marked = at
        if found is not None:
            # The batch after the one found must start after it, or the offsets of the one found are suspect too
            # (which of the two was flipped cannot be told). A header after it that is wrong in itself is for
            # the read that reaches it: the batch found is served.
            try:
                following = next(headers, None)
                if following is not None:
                    check_stored_header(following[1], following[0])
            except errors.CorruptMessageError:
                following = None
            if following is not None and following[1].base_offset < after:
                raise errors.CorruptMessageError(
                    f"batch at position {following[0]} starts at offset {following[1].base_offset}, within the batch "
                    f"before it (at {found[0]}, offsets {found[1].base_offset} to {after - 1})")
        if marks:
            self._add_marks(marks, generation)
        return found

    def _add_marks(self, new: list[tuple[int, int]], generation: int) -> None:
        """Keep ``new`` marks, each at least MARK_BYTES / 2 from every kept one (at most about four per
        MARK_BYTES of segment)."""
        with self._marks_lock:
            if generation != self._generation or self.closed:
                return  # batches went away since the walk started: what it read may be gone
            marks = list(self._marks)
            for mark in new:
                i = bisect.bisect_left(marks, mark[1], key=_mark_position)
                if (i > 0 and mark[1] - marks[i - 1][1] < MARK_BYTES // 2) or \
                        (i < len(marks) and marks[i][1] - mark[1] < MARK_BYTES // 2):
                    continue
                marks.insert(i, mark)
            self._marks = tuple(marks)

    def _drop_marks_from(self, position: int) -> None:
        with self._marks_lock:
            self._generation += 1
            self._marks = tuple(m for m in self._marks if m[1] < position)
            self._checked = tuple((a, min(b, position)) for a, b in self._checked if a < position)

    def _mark_checked(self, start: int, end: int, generation: int) -> None:
        """The batches in [start, end) passed their CRC (unless the segment was truncated since ``generation``)."""
        if start >= end:
            return
        with self._marks_lock:
            if generation != self._generation:
                return
            ranges = self._checked
            if ranges and ranges[-1][1] == start:  # an append after the last checked range: the usual case
                self._checked = (*ranges[:-1], (ranges[-1][0], end))
                return
            merged: list[tuple[int, int]] = []
            for a, b in sorted((*ranges, (start, end))):
                if merged and a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self._checked = tuple(merged[-MAX_CHECKED_RANGES:])  # bounded: the latest positions are read most

    def _unchecked_from(self, start: int, stop: int) -> int:
        """The first position of [start, stop) outside the checked ranges (``stop``: none)."""
        pos = start
        for a, b in self._checked:
            if a > pos:
                break
            if pos < b:
                pos = b
        return min(pos, stop)

    def checked_ranges(self) -> tuple[tuple[int, int], ...]:
        """[start, end) ranges whose batches passed their CRC since the segment opened (tests, tools)."""
        return self._checked

    def marks(self) -> tuple[tuple[int, int], ...]:
        """(base offset, position) of the batches walks marked (tests, tools)."""
        return self._marks

    def read(self, start_offset: int, max_bytes: int, bound_offset: int, min_one_batch: bool
             ) -> tuple[bytes, int] | None:
        """Whole batches from the one holding ``start_offset``, each with last offset < bound_offset.

        Returns (bytes, first batch base offset), (b"", -1) when the first batch is at or past
        the bound, or None when this segment holds no batch at or after ``start_offset``.
        """
        end = self.size  # snapshot: an append in flight is not yet visible
        generation = self._generation
        found = self._translate_for_read(start_offset, end, generation)
        if found is None:
            return None
        pos, first = found
        if first.last_offset >= bound_offset:
            return b"", -1
        if first.size > max_bytes:
            if not min_one_batch:
                return b"", -1
            return self._verified(os.pread(self._fd, first.size, pos), pos, first, generation), first.base_offset
        chunk = os.pread(self._fd, min(max_bytes, end - pos), pos)
        return self._verified(chunk, pos, first, generation, bound_offset), first.base_offset

    def _translate_for_read(self, offset: int, end: int, generation: int) -> tuple[int, BatchHeader] | None:
        """``translate_offset`` for a fetch: batch headers that cannot be walked (a damaged magic or length) are a
        ``CorruptBatchError`` naming the batch the walk started from, as a failed CRC is (see ``_corrupt``)."""
        try:
            return self.translate_offset(offset, end)
        except errors.CorruptMessageError as exc:
            entry = self.index.lookup(offset)
            self._corrupt_headers(entry.position, entry.offset, generation, exc)

    def _verified(self, data: bytes, position: int, first: BatchHeader, generation: int,
                  bound_offset: int | None = None) -> bytes:
        """The whole batches of ``data`` (read at ``position``, starting with ``first``'s batch) before
        ``bound_offset`` and before the first one that fails its CRC or cannot be walked; raises (see
        ``_corrupt``) when that is the first one. The batches before it are served, the next read starts at it."""
        cut = 0
        after, limit = first.base_offset, self.next_offset
        with memoryview(data) as view:
            try:
                for rel, h in iter_batches(data, 0):
                    if bound_offset is not None and h.last_offset >= bound_offset:
                        break
                    # The base offset is outside the CRC: a batch served must follow the one before it and end
                    # within the segment, or a flipped bit there serves its records under other offsets.
                    if h.base_offset < after or h.next_offset > limit:
                        if rel == 0:
                            self._corrupt_headers(position, first.base_offset, generation, errors.CorruptMessageError(
                                f"batch at position {position} holds offsets {h.base_offset} to "
                                f"{h.next_offset - 1}, beyond the segment's end ({limit})"))
                        break
                    if crc32c(view[rel + CRC_START:rel + h.size]) != h.crc:
                        if rel == 0:
                            self._corrupt(h, position, generation)
                        break
                    after = h.next_offset
                    cut = rel + h.size
            except errors.CorruptMessageError as exc:
                if cut == 0:
                    self._corrupt_headers(position, first.base_offset, generation, exc)
        return data if cut == len(data) else data[:cut]

    def _corrupt_headers(self, position: int, base_offset: int, generation: int, exc: errors.BrookError) -> NoReturn:
        if generation != self._generation or self.closed:
            raise SegmentChangedError(f"segment {self.log_path} truncated during a read")
        raise CorruptBatchError(self.log_path, position, base_offset,
                                f"the batch headers from here cannot be walked: {exc.message}")

    def _corrupt(self, h: BatchHeader, position: int, generation: int) -> NoReturn:
        """A batch read for a fetch fails its CRC. Every batch was CRC-checked when it was appended (or
        recovered), so its bytes changed on disk since, unless a truncation raced the read (then it is
        read again: ``SegmentChangedError``). Raises ``CorruptBatchError``: such bytes are never served
        (Kafka's leader sends them, and no reader can use them; its followers refuse them for good)."""
        again = os.pread(self._fd, h.size, position)
        if generation != self._generation or self.closed:
            raise SegmentChangedError(f"segment {self.log_path} truncated during a read")
        try:
            validate_batch(again, 0)
        except errors.BrookError as exc:
            raise CorruptBatchError(self.log_path, position, h.base_offset, exc.message,
                                    next_offset=h.next_offset) from None
        raise SegmentChangedError(f"batch at {position} of {self.log_path} changed during a read")

    def read_slice(self, start_offset: int, max_bytes: int, bound_offset: int, min_one_batch: bool
                   ) -> tuple[FileRecords | bytes, int] | None:
        """``read``, but the batches stay in the file: a FileRecords slice for sendfile (zero copy).

        Where the slice ends is found from the batch headers, read 64 KiB at a time (one pread for
        many small batches); the response itself is sent from the file, once the part of it not yet
        checked passed its CRCs (``_checked_slice_end``).
        """
        end = self.size
        generation = self._generation
        found = self._translate_for_read(start_offset, end, generation)
        if found is None:
            return None
        pos, first = found
        if first.last_offset >= bound_offset or (first.size > max_bytes and not min_one_batch):
            return b"", -1
        stop = pos + first.size
        # The first position not yet checked, and its batch's header once the walk meets it (None: not a batch
        # start of this walk, or past the slice).
        unchecked = self._unchecked_from(pos, end)
        unchecked_header = first if unchecked == pos else None
        # Batches wholly within max_bytes of the start and the snapshot end, before the bound.
        with contextlib.suppress(errors.CorruptMessageError):  # a damaged header: the slice ends before it
            for at, h in self.iter_headers(stop, min(end, pos + max_bytes), SLICE_SCAN_CHUNK_BYTES):
                if h.last_offset >= bound_offset:
                    break
                if at == unchecked:
                    unchecked_header = h
                stop = at + h.size
        if self.closed:  # closed under us: the descriptor may already name another file
            raise OSError(f"segment {self.log_path} closed during a read")
        if unchecked < stop:
            if unchecked_header is None:  # the layout changed under us: check the whole slice
                unchecked, unchecked_header = pos, first
            stop = self._checked_slice_end(pos, stop, unchecked, unchecked_header, generation)
        records = FileRecords.within_budget(self._fd, pos, stop - pos, first.base_offset)
        if records is None:
            # Slices hold their share of the descriptor limit (answers not yet sent): this one is read into
            # memory, as ``read`` does; the fetch path's byte budgets count it alike.
            data = os.pread(self._fd, stop - pos, pos)
            if self.closed or len(data) != stop - pos:
                raise OSError(f"segment {self.log_path} closed or truncated during a read")
            return data, first.base_offset  # [pos, stop) passed its CRCs: checked above, or before
        return records, first.base_offset

    def _checked_slice_end(self, pos: int, stop: int, unchecked: int, header: BatchHeader, generation: int) -> int:
        """Where a slice [pos, stop) of whole batches may end for sendfile: ``stop``, once its part from
        ``unchecked`` (a batch start, ``header`` that batch's) was read and passed its CRCs (then it is marked
        checked), or the first batch that failed. A sendfile'd slice reaches the client unread, and librdkafka
        does not check CRCs by default: before, the bytes of a batch changed on disk went to it as they were.
        Raises, as ``read`` does, when the slice's first batch fails."""
        data = os.pread(self._fd, stop - unchecked, unchecked)
        if self.closed or len(data) != stop - unchecked:
            raise OSError(f"segment {self.log_path} closed or truncated during a read")
        try:
            good = len(self._verified(data, unchecked, header, generation))
        except CorruptBatchError:
            if unchecked == pos:
                raise
            good = 0  # the batches before it are served; the next read starts at it, and fails
        self._mark_checked(unchecked, unchecked + good, generation)
        return unchecked + good

    def find_offset_by_timestamp(self, timestamp_ms: int, start_offset: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record with timestamp >= ``timestamp_ms`` and offset >=
        ``start_offset``, as Kafka's ``FileRecords.searchForTimestamp``; None when this segment has none. The
        epoch is the partition leader epoch of the batch holding that record (-1 when it carries none), which
        ListOffsets answers (KIP-320: a client seeking there checks it with OffsetsForLeaderEpoch). Batches are
        walked by their headers to the first with max timestamp >= ``timestamp_ms`` and last offset >=
        ``start_offset``; that batch alone is decoded for the record (the walk goes on past it only when its
        records reaching the timestamp are all before ``start_offset``).

        The scan starts at the furthest of three positions before which no batch qualifies:

        - the offset-index entry at or below the last time-index entry under the timestamp (every batch
          up to that entry's offset is below it): where Kafka starts;
        - with a timestamp > 0, the last offset-index entry before the first time-index entry at or above
          the timestamp (or the last offset-index entry, when there is none): index and time entries go
          in pairs (``_index_batch``), so the largest timestamp up to any earlier offset-index entry is
          below the timestamp; the scan then reads about one index interval. Kafka walks from the first
          position instead: a segment of old timestamps then one new batch has one time entry below the
          new one, and every lookup in between walked the whole segment (found by an audit);
        - the batch holding ``start_offset`` (from the index, or a mark).

        Only a segment holding the log start, with ``start_offset`` past its first batch reaching the
        timestamp, can still be walked far: which of its later batches reach the timestamp is not indexed.
        """
        end = self.size
        # The offset index is read before the time index: the time entry of an offset-index entry is written
        # before it, so every offset-index entry up to ``last_entry`` has its time entry in what we read next.
        last_entry = self.index.last_entry()
        below, first_at, first_is_last = self.time_index.around(timestamp_ms)
        # A damaged time index says nothing of where the batches wanted are: the walk starts from the start.
        trusted = self._time_entry_holds(below, end)
        position = self._checked_position(self.index.lookup(below.offset), end) if trusted and below else 0
        if trusted and timestamp_ms > 0 and (
                not self._time_entries_may_lack or (first_at is not None and not first_is_last)) and (
                first_at is None or self._time_entry_holds(first_at, end)):
            bound = last_entry if first_at is None else self.index.lookup(min(first_at.offset - 1, last_entry.offset))
            position = max(position, self._checked_position(bound, end))
        position = max(position, self._start_for(start_offset, end))
        while True:
            found = self._walk(position, end,
                               lambda h: h.max_timestamp >= timestamp_ms and h.last_offset >= start_offset)
            if found is None:
                return None
            at, h = found
            # Kafka (FileRecords.searchForTimestamp): the first record of that batch with timestamp >= the
            # target and offset >= start_offset, with its own timestamp. Only this batch is read and
            # decompressed (at most max.message.bytes). Control batches are not skipped (Kafka neither); in a
            # LogAppendTime batch every record carries the batch's max timestamp (decode_batch), so its first
            # record at or after start_offset answers.
            data = os.pread(self._fd, h.size, at)
            if len(data) != h.size:
                raise OSError(f"segment {self.log_path} closed or truncated during a timestamp lookup")
            header, records = decode_batch(data, 0)
            for r in records:
                if r.timestamp >= timestamp_ms and r.offset >= start_offset:
                    return r.offset, r.timestamp, max(header.partition_leader_epoch, NO_PARTITION_LEADER_EPOCH)
            position = at + h.size  # its records reaching the timestamp are all before start_offset: go on

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def largest_timestamp(self) -> int:
        """Largest batch timestamp, or the file's mtime when no batch carries one (Kafka)."""
        if self.max_timestamp > 0:
            return self.max_timestamp
        return int(os.fstat(self._fd).st_mtime * 1000)

    def last_written_ms(self) -> int:
        """When the log file was last written, by this broker's clock (its mtime; the cleaner keeps it through
        a rewrite): what a tombstone's delete.retention.ms counts from."""
        return int(os.fstat(self._fd).st_mtime * 1000)

    def rolling_base_ms(self) -> int:
        return self.created_ms

    def can_hold_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    def on_become_inactive(self) -> None:
        """Final time index entry (largest timestamp) and trimmed index files."""
        if self.max_timestamp > 0 and self.time_index.writable:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        self.index.trim()
        self.time_index.trim()
        self.indexes_synced = False

    def on_become_active(self) -> None:
        self.index.make_writable()
        self.time_index.make_writable()

    def truncate_to(self, offset: int) -> int:
        """Drop batches whose last offset >= ``offset``; return bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        pos, first_removed = found
        removed = self.size - pos
        self._drop_marks_from(pos)
        # Index entries name batch base offsets: drop those of every removed batch.
        self.index.truncate_to(first_removed.base_offset)
        self.time_index.truncate_to(first_removed.base_offset)
        self.txn_index.truncate_to(first_removed.base_offset)  # aborts whose marker was cut away
        self._last_appended = None
        self.truncations += 1
        os.ftruncate(self._fd, pos)
        self.size = pos
        self.bytes_since_last_index_entry = 0
        if pos == 0:
            self._reset_state()
        else:
            self._load_tail_state()
        self.indexes_synced = False
        return removed

    def flush(self) -> None:
        os.fsync(self._fd)
        self.txn_index.flush()  # segments before the recovery point are not rescanned: their aborts must last
        if not self.indexes_synced and not self.index.writable:
            self.index.flush()
            self.time_index.flush()
            self.indexes_synced = True

    def change_suffix(self, new_suffix: str) -> None:
        """Rename all four files (open descriptors stay valid). The transaction index goes first: a ``.log``
        with the new suffix then always has its entries beside it (Log._complete_swaps relies on it)."""
        def renamed(path: Path) -> Path:
            name = path.name[: len(path.name) - len(self.suffix)] if self.suffix else path.name
            return path.with_name(name + new_suffix)
        self.txn_index.rename_to(renamed(self.txn_index.path))
        new_log = renamed(self.log_path)
        os.replace(self.log_path, new_log)
        self.log_path = new_log
        self.index.rename_to(renamed(self.index.path))
        self.time_index.rename_to(renamed(self.time_index.path))
        self.suffix = new_suffix

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _SEGMENTS.add(-1)
        self.index.close()
        self.time_index.close()
        os.close(self._fd)

    def delete_files(self) -> None:
        self.close()
        for path in (self.log_path, self.index.path, self.time_index.path, self.txn_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path.name}, size={self.size}, next_offset={self.next_offset})"

