"""TransactionIndex: a segment's ``.txnindex``, the aborted transactions whose ABORT marker it holds (Kafka's).

One fixed-size entry per aborted transaction, in marker order, 34 bytes big-endian as Kafka writes them::

    int16 version (0) | int64 producer id | int64 first offset | int64 last offset (the marker's)
    | int64 last stable offset (the first unstable offset once the transaction completed; marker + 1 if none)

A read_committed fetch gets the aborted transactions overlapping what it returns (``Log.aborted_transactions``),
so the consumer can drop their records. Entries are ordered by their last offset, and their last stable offsets
never decrease, which is what lets a search stop early (``collect``).

The file stays on disk, never in memory: a producer aborting in a loop must not grow the broker. A segment
keeps only the file's entry count, so the many segments without any abort cost no read; there is no open
descriptor either (segments hold three each against the process's budget): every append, read or truncation
opens the file for as long as it takes. Aborts are rare next to records, and reads are of a few entries.

The file exists for every segment written by a broker that writes them (created empty with the segment): one
missing beside a non-empty segment was lost, and the log rebuilds it (``LogSegment.txn_rebuild_needed``).
Rebuilt or copied contents replace the file atomically, so a crash never leaves half of them behind a name that
says they are complete.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from proto import errors
from storage.checkpoints import write_atomically

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
assert ENTRY_SIZE == 34
VERSION = 0
# Entries read at a time by a scan (about 1,900): a search stops early, so most reads are one of these.
READ_CHUNK_ENTRIES = 64 * 1024 // ENTRY_SIZE
COPY_CHUNK_BYTES = ENTRY_SIZE * 30_000  # about 1 MiB


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class CorruptTxnIndexError(ValueError):
    """A ``.txnindex`` whose entries cannot be trusted (torn, out of the segment, unknown version)."""


def encode(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(VERSION, *e) for e in entries)


def _decode(data: bytes | memoryview, path: Path) -> list[AbortedTxn]:
    out = []
    for version, pid, first, last, lso in ENTRY.iter_unpack(data):
        if version != VERSION:
            raise CorruptTxnIndexError(f"{path}: entry version {version} (only {VERSION})")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


class TransactionIndex:
    """Not thread-safe for writers (the owning Log's lock serialises appends, truncations and renames);
    readers without the lock read a prefix of at most ``entries`` entries, and are told by a missing file or
    a short read that a rename or truncation raced them (their caller reads again)."""

    __slots__ = ("path", "base_offset", "_size", "existed", "torn_bytes", "_dirty")

    def __init__(self, path: Path, base_offset: int, *, create: bool = False) -> None:
        self.path = path
        self.base_offset = base_offset
        try:
            size = os.stat(path).st_size
            self.existed = True
        except FileNotFoundError:
            size = 0
            self.existed = False
        self.torn_bytes = size % ENTRY_SIZE  # an append cut by a crash; see ``sanity_check``
        self._size = size - self.torn_bytes
        self._dirty = False
        if create and not self.existed:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
            self.existed = True

    @property
    def entries(self) -> int:
        return self._size // ENTRY_SIZE

    # -- writes (under the log's lock) ----------------------------------------------------
    def append(self, txn: AbortedTxn) -> None:
        self._write_at(self._size, ENTRY.pack(VERSION, *txn))

    def _write_at(self, position: int, data: bytes) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                view = memoryview(data)
                written = 0
                while written < len(view):
                    written += os.pwrite(fd, view[written:], position + written)
            finally:
                os.close(fd)
        except OSError as exc:
            raise errors.KafkaStorageError(f"write to {self.path} failed: {exc}") from exc
        self.existed = True
        self._dirty = True
        self._size = position + len(data)  # published last: readers read only whole entries written before

    def copy_from(self, other: TransactionIndex) -> None:
        """Append every entry of ``other`` (a segment a cleaned segment replaces), a chunk at a time."""
        done = 0
        total = other._size
        while done < total:
            chunk = other._read_bytes(done, min(COPY_CHUNK_BYTES, total - done))
            if len(chunk) % ENTRY_SIZE or not chunk:
                raise CorruptTxnIndexError(f"{other.path}: {len(chunk)} bytes read at {done} of {total}")
            self._write_at(self._size, chunk)
            done += len(chunk)

    def replace(self, entries: list[AbortedTxn]) -> None:
        """Make ``entries`` the whole index, atomically (a rebuild); a file that holds them already is kept."""
        data = encode(entries)
        if self.existed and self.torn_bytes == 0 and self._size == len(data) and \
                (not data or self._read_bytes(0, len(data)) == data):
            return
        if not data and not self.existed:
            # No abort where there was no file (a log from before transactions, or a lost empty one): created
            # without the fsyncs, which an upgrade would pay for every segment; lost again in a crash, it is
            # found again by the scan a crash makes anyway.
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644))
        else:
            write_atomically(self.path, data)
        self.existed, self.torn_bytes, self._size, self._dirty = True, 0, len(data), False

    def truncate_to(self, offset: int) -> int:
        """Drop the entries whose marker is at or after ``offset`` (the log was cut there); how many."""
        n = self.entries
        if n == 0:
            return 0
        keep = self._first_ending_at_or_after(offset, exact=True)
        if keep == n:
            return 0
        try:
            os.truncate(self.path, keep * ENTRY_SIZE)
        except OSError as exc:
            raise errors.KafkaStorageError(f"truncation of {self.path} failed: {exc}") from exc
        self._size = keep * ENTRY_SIZE
        self._dirty = True
        return n - keep

    def flush(self) -> None:
        if not self._dirty:
            return
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty = False

    def rename_to(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):  # lost: the log rebuilds it
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # -- reads (any thread) -------------------------------------------------------------------
    def _read_bytes(self, position: int, length: int) -> bytes:
        """Raises FileNotFoundError when the file was renamed meanwhile (the caller reads again)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, length, position)
        finally:
            os.close(fd)

    def read(self, start: int = 0, count: int | None = None) -> list[AbortedTxn]:
        """Entries ``start`` .. ``start + count`` (all from ``start`` by default)."""
        size = self._size
        if size == 0:
            return []
        end = size if count is None else min(size, (start + count) * ENTRY_SIZE)
        if start * ENTRY_SIZE >= end:
            return []
        data = self._read_bytes(start * ENTRY_SIZE, end - start * ENTRY_SIZE)
        return _decode(memoryview(data)[: len(data) - len(data) % ENTRY_SIZE], self.path)

    def iter_from(self, start: int = 0) -> Iterator[AbortedTxn]:
        """Every entry from ``start``, read ``READ_CHUNK_ENTRIES`` at a time."""
        n = self.entries
        i = start
        while i < n:
            chunk = self.read(i, READ_CHUNK_ENTRIES)
            if not chunk:
                return
            yield from chunk
            i += len(chunk)

    def _first_ending_at_or_after(self, offset: int, *, exact: bool = False) -> int:
        """Index of the first entry whose last offset >= ``offset`` (entries are in marker order): a binary
        search of single-entry reads when the index is larger than one chunk. Not ``exact``, a small index
        answers 0: one read covers it, and the scan skips what ends before."""
        lo, hi = 0, self.entries
        if hi <= READ_CHUNK_ENTRIES:
            if not exact:
                return 0
            return next((i for i, e in enumerate(self.read()) if e.last_offset >= offset), hi)
        while lo < hi:
            mid = (lo + hi) // 2
            got = self.read(mid, 1)
            if not got:
                hi = mid
            elif got[0].last_offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def collect(self, start_offset: int, upper_offset: int) -> tuple[list[AbortedTxn], bool]:
        """The aborted transactions overlapping [start_offset, upper_offset) (last >= start, first < upper), and
        whether the search is complete: an entry whose last stable offset is at or past ``upper_offset`` was
        met, so no later entry, here or in a later segment, can begin below it (Kafka's collectAbortedTxns)."""
        found: list[AbortedTxn] = []
        if self._size == 0:
            return found, False
        for e in self.iter_from(self._first_ending_at_or_after(start_offset)):
            if e.last_offset >= start_offset and e.first_offset < upper_offset:
                found.append(e)
            if e.last_stable_offset >= upper_offset:
                return found, True
        return found, False

    def sanity_check(self, next_offset: int) -> None:
        """Cheap checks of a trusted segment's index at open: whole entries, and the last one's marker within the
        segment (an index longer than its segment, as a crash between a cut and the index's own leaves it)."""
        if self.torn_bytes:
            raise CorruptTxnIndexError(f"{self.path}: {self.torn_bytes} bytes of a torn entry at its end")
        if self._size == 0:
            return
        last = self.read(self.entries - 1, 1)
        if not last or not self.base_offset <= last[0].last_offset < next_offset:
            raise CorruptTxnIndexError(f"{self.path}: last entry {last} outside the segment "
                                       f"[{self.base_offset}, {next_offset})")
