"""LogSegment: one ``.log`` file of record batches plus its ``.index`` and ``.timeindex``.

A segment holds the batches whose offsets start at its base offset (the file names,
``%020d``) up to the next segment's base. Appends are one ``pwrite`` of the bytes as they
came; reads are ``pread``s; the OS page cache is the only cache. The segment keeps in
memory only what the log needs to decide: its size, next offset, largest timestamp and
the bytes since the last index entry.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from proto import errors
from storage.abstract_index import CorruptIndexError
from storage.file_records import FileRecords
from storage.offset_index import OffsetIndex
from storage.record_batch import BATCH_HEADER_SIZE, BatchHeader, iter_batches, read_header, validate_batch
from storage.time_index import TimeIndex

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
_INT32_MAX = 2**31 - 1


# Segments open in this process: each holds three file descriptors (log, offset and time index) for as long
# as it exists. Logs roll only while the count is below segment_budget() (see Log._maybe_roll): a topic
# configured to roll at every batch (segment.bytes of a few bytes, segment.ms of 1) took every node of a
# cluster to its descriptor limit in 11 s, the controller's journal failed with EMFILE, and the nodes
# could not even restart (found by an audit).
_open_segments = 0
_open_lock = threading.Lock()
_FDS_PER_SEGMENT = 3
SEGMENT_FD_SHARE = 2  # segments may hold at most half of the process's descriptors


def open_segments() -> int:
    return _open_segments


def segment_budget() -> int:
    """Segments this process may hold open before rolls wait: half its file-descriptor limit, 3 each."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, soft // SEGMENT_FD_SHARE // _FDS_PER_SEGMENT)


def _count_open(delta: int) -> None:
    global _open_segments
    with _open_lock:
        _open_segments += delta


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def now_ms() -> int:
    return int(time.time() * 1000)


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, *, index_bytes: int, index_interval_bytes: int,
                 writable: bool, suffix: str = "", created_ms: int | None = None) -> None:
        self.dir = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix
        self.log_path = directory / (segment_file_name(base_offset, LOG_SUFFIX) + suffix)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        self._index_bytes = index_bytes
        self.index_rebuild_needed = False
        self.index = self._open_index(OffsetIndex, INDEX_SUFFIX, writable)
        self.time_index = self._open_index(TimeIndex, TIME_INDEX_SUFFIX, writable)
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self.bytes_since_last_index_entry = 0
        self.first_batch_timestamp = -1
        self.created_ms = created_ms if created_ms is not None else now_ms()
        self.indexes_synced = not writable
        self.closed = False
        # (position, header) of the last batch appended since the segment opened or was truncated:
        # a follower or tailing consumer reads from it, with no index lookup or scan.
        self._last_appended: tuple[int, BatchHeader] | None = None
        _count_open(1)

    def _open_index(self, cls: type[OffsetIndex] | type[TimeIndex], suffix: str, writable: bool):
        path = self.dir / (segment_file_name(self.base_offset, suffix) + self.suffix)
        if not path.exists() and self.size > 0:
            self.index_rebuild_needed = True
        return cls(path, self.base_offset, self._index_bytes, writable=writable)

    # -- state loading ------------------------------------------------------------------
    def load_without_recovery(self) -> None:
        """Trust the (flushed) log; check the indexes and rebuild them if they look wrong."""
        try:
            if self.index_rebuild_needed:
                raise CorruptIndexError(f"index files of {self.log_path} missing")
            self.index.sanity_check(self.size)
            self.time_index.sanity_check()
            self._load_tail_state()
        except (CorruptIndexError, errors.CorruptMessageError) as exc:
            log.warning("rebuilding indexes of %s: %s", self.log_path, exc)
            self.rebuild_indexes()

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
        self.next_offset = self.base_offset
        for _pos, h in self.iter_headers(start):
            self._observe(h)
            self.next_offset = h.next_offset
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
        self.index.reset()
        self.time_index.reset()
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
        if self.bytes_since_last_index_entry > self.index_interval_bytes and position > 0:
            self.index.append(h.base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += h.size

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
        self.size = pos  # publish last: readers never see a half-written append
        self.indexes_synced = False

    def read_header_at(self, position: int) -> BatchHeader | None:
        data = os.pread(self._fd, BATCH_HEADER_SIZE, position)
        if len(data) < BATCH_HEADER_SIZE:
            return None
        return read_header(data, 0)

    def iter_headers(self, start: int = 0, end: int | None = None,
                     chunk_bytes: int = SCAN_CHUNK_BYTES) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every complete batch in [start, end), reading ``chunk_bytes`` at a time
        (one pread for many small batches; a batch larger than a chunk costs one pread of a chunk)."""
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
        entry = self.index.lookup(offset)
        pos = entry.position
        if pos > 0:
            try:
                at = self.read_header_at(pos) if pos + BATCH_HEADER_SIZE <= end else None
            except errors.CorruptMessageError:
                at = None
            if at is None or at.base_offset != entry.offset:
                # A damaged index must not send reads to the wrong bytes: scan from the start.
                log.warning("%s: index entry %s does not point at its batch; scanning from the start",
                            self.index.path, entry)
                pos = 0
        # From the index entry, a read of about two index intervals holds every header up to the
        # batch wanted (small batches: one pread, not one per batch).
        chunk_bytes = min(SCAN_CHUNK_BYTES, max(2 * self.index_interval_bytes, MIN_TRANSLATE_CHUNK_BYTES))
        for at, h in self.iter_headers(pos, end, chunk_bytes):
            if h.last_offset >= offset:
                return at, h
        return None

    def read(self, start_offset: int, max_bytes: int, bound_offset: int, min_one_batch: bool
             ) -> tuple[bytes, int] | None:
        """Whole batches from the one holding ``start_offset``, each with last offset < bound_offset.

        Returns (bytes, first batch base offset), (b"", -1) when the first batch is at or past
        the bound, or None when this segment holds no batch at or after ``start_offset``.
        """
        end = self.size  # snapshot: an append in flight is not yet visible
        found = self.translate_offset(start_offset, end)
        if found is None:
            return None
        pos, first = found
        if first.last_offset >= bound_offset:
            return b"", -1
        if first.size > max_bytes:
            if not min_one_batch:
                return b"", -1
            return os.pread(self._fd, first.size, pos), first.base_offset
        chunk = os.pread(self._fd, min(max_bytes, end - pos), pos)
        cut = 0
        for rel, h in iter_batches(chunk, 0):
            if h.last_offset >= bound_offset:
                break
            cut = rel + h.size
        return (chunk if cut == len(chunk) else chunk[:cut]), first.base_offset

    def read_slice(self, start_offset: int, max_bytes: int, bound_offset: int, min_one_batch: bool
                   ) -> tuple[FileRecords | bytes, int] | None:
        """``read``, but the batches stay in the file: a FileRecords slice for sendfile (zero copy).

        Where the slice ends is found from the batch headers, read 64 KiB at a time (one pread for
        many small batches); the response itself is sent from the file.
        """
        end = self.size
        found = self.translate_offset(start_offset, end)
        if found is None:
            return None
        pos, first = found
        if first.last_offset >= bound_offset or (first.size > max_bytes and not min_one_batch):
            return b"", -1
        stop = pos + first.size
        # Batches wholly within max_bytes of the start and the snapshot end, before the bound.
        for at, h in self.iter_headers(stop, min(end, pos + max_bytes), SLICE_SCAN_CHUNK_BYTES):
            if h.last_offset >= bound_offset:
                break
            stop = at + h.size
        if self.closed:  # closed under us: the descriptor may already name another file
            raise OSError(f"segment {self.log_path} closed during a read")
        return FileRecords(self._fd, pos, stop - pos, first.base_offset), first.base_offset

    def find_offset_by_timestamp(self, timestamp_ms: int, start_offset: int) -> tuple[int, int] | None:
        """(offset, max timestamp) of the first batch with max timestamp >= ``timestamp_ms``."""
        entry = self.time_index.lookup(timestamp_ms)
        position = self.index.lookup(max(entry.offset, start_offset)).position
        for _pos, h in self.iter_headers(position):
            if h.max_timestamp >= timestamp_ms and h.last_offset >= start_offset:
                return max(h.base_offset, start_offset), h.max_timestamp
        return None

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def largest_timestamp(self) -> int:
        """Largest batch timestamp, or the file's mtime when no batch carries one (Kafka)."""
        if self.max_timestamp > 0:
            return self.max_timestamp
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
        # Index entries name batch base offsets: drop those of every removed batch.
        self.index.truncate_to(first_removed.base_offset)
        self.time_index.truncate_to(first_removed.base_offset)
        self._last_appended = None
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
        if not self.indexes_synced and not self.index.writable:
            self.index.flush()
            self.time_index.flush()
            self.indexes_synced = True

    def change_suffix(self, new_suffix: str) -> None:
        """Rename all three files (open descriptors stay valid)."""
        def renamed(path: Path) -> Path:
            name = path.name[: len(path.name) - len(self.suffix)] if self.suffix else path.name
            return path.with_name(name + new_suffix)
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
        _count_open(-1)
        self.index.close()
        self.time_index.close()
        os.close(self._fd)

    def delete_files(self) -> None:
        self.close()
        for path in (self.log_path, self.index.path, self.time_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path.name}, size={self.size}, next_offset={self.next_offset})"

