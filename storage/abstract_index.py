"""Shared machinery of the sparse, fixed-entry-size index files (.index, .timeindex).

An index file is preallocated to ``segment.index.bytes`` while its segment is active
(so appends never grow the file and the mmap never moves), trimmed to its entries when
the segment becomes inactive, and grown again if a truncation makes the segment active
once more. Unused space is zeros; a valid entry is never all zeros (callers guarantee
it), so the number of entries of a preallocated file is found by binary search for the
first zero entry. Entries are hints: every entry is a lower bound of where its offset or
timestamp lives, so losing trailing entries (crash) only costs a longer forward scan.

Reads and writes go through an ``mmap``: lookups are a binary search with
``struct.unpack_from`` on the mapping, no copy of the file in Python objects.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class CorruptIndexError(ValueError):
    """An index file fails its sanity check; the caller rebuilds it from the segment."""


class AbstractIndex:
    entry_size: int = 0  # set by subclasses
    _zero: bytes = b""

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int, *, writable: bool) -> None:
        if max_index_bytes < self.entry_size:
            raise ValueError(f"index size {max_index_bytes} below one entry ({self.entry_size})")
        self.path = path
        self.base_offset = base_offset
        self.max_index_bytes = max_index_bytes
        self._lock = threading.RLock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._mm: mmap.mmap | None = None
        self._length = 0
        self.writable = False
        self._zero = b"\x00" * self.entry_size
        self._last_cache: object | None = None  # last entry, decoded; dropped on every change
        try:
            length = os.fstat(self._fd).st_size
            length -= length % self.entry_size  # a torn last entry is dropped
            self._map(length)
            self._entries = self._count_entries()
            if writable:
                self.make_writable()
            else:
                self._resize(self._entries * self.entry_size)
        except BaseException:
            self.close()
            raise

    # -- file and mapping management -------------------------------------------------
    def _map(self, length: int) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._length = length
        if length > 0:
            self._mm = mmap.mmap(self._fd, length, access=mmap.ACCESS_WRITE)

    def _resize(self, length: int) -> None:
        with self._lock:
            if self._mm is not None:
                self._mm.flush()
                self._mm.close()
                self._mm = None
            os.ftruncate(self._fd, length)
            self._map(length)

    def _count_entries(self) -> int:
        """Entries before the zero padding (binary search: valid entries are never zero)."""
        n = self._length // self.entry_size
        if self._mm is None:
            return 0
        lo, hi = 0, n  # invariant: entries [0, lo) non-zero, [hi, n) zero
        while lo < hi:
            mid = (lo + hi) // 2
            start = mid * self.entry_size
            if self._mm[start : start + self.entry_size] == self._zero:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @property
    def max_entries(self) -> int:
        return self.max_index_bytes // self.entry_size

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def size_bytes(self) -> int:
        return self._entries * self.entry_size

    def is_full(self) -> bool:
        # One slot stays free for the final entry written when the segment is rolled.
        return self._entries >= self.max_entries - 1

    def make_writable(self) -> None:
        """Preallocate to the configured size so the active segment can append."""
        with self._lock:
            target = max(self.max_entries, self._entries) * self.entry_size
            if target != self._length:
                self._resize(target)
            self.writable = True

    def trim(self) -> None:
        """Shrink the file to its entries (segment no longer active)."""
        with self._lock:
            if self._length != self._entries * self.entry_size:
                self._resize(self._entries * self.entry_size)
            self.writable = False

    def flush(self) -> None:
        with self._lock:
            if self._mm is not None:
                self._mm.flush()
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._mm is not None:
                self._mm.close()
                self._mm = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def rename_to(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # -- entries -----------------------------------------------------------------------
    def _append_raw(self, entry: bytes) -> None:
        with self._lock:
            if not self.writable:
                raise RuntimeError(f"index {self.path} is not writable")
            if self._entries >= self.max_entries:
                raise RuntimeError(f"index {self.path} is full ({self._entries} entries)")
            assert self._mm is not None and entry != self._zero
            start = self._entries * self.entry_size
            # Written with pwrite, read through the mmap (one page cache, so readers see it): a store
            # into the mmap page-faults when the page is new or was written back since, and ext4's
            # fault handler can wait for the journal, which waits for data being written back; such
            # stores took up to 56 ms on a broker's event loop after bursts of writes (59 over 3 ms
            # in a minute), the syscall never 3 ms.
            os.pwrite(self._fd, entry, start)
            # Publish the entry only after its bytes are in place (lock-free readers).
            self._entries += 1
            self._last_cache = None

    def truncate_to_entries(self, n: int) -> None:
        """Keep the first ``n`` entries; the rest becomes zero padding again."""
        with self._lock:
            n = max(0, min(n, self._entries))
            if n == self._entries:
                return
            assert self._mm is not None
            start, end = n * self.entry_size, self._entries * self.entry_size
            self._entries = n
            self._last_cache = None
            self._mm[start:end] = b"\x00" * (end - start)
            if not self.writable:
                self._resize(n * self.entry_size)

    def reset(self) -> None:
        self.truncate_to_entries(0)

    def _unpack(self, fmt: struct.Struct, i: int) -> tuple[int, ...]:
        if self._mm is None:
            raise ValueError(f"index {self.path} is closed")
        return fmt.unpack_from(self._mm, i * self.entry_size)

    def _search(self, key_of: int, target: int, fmt: struct.Struct) -> int:
        """Index of the last entry whose field ``key_of`` is <= target, or -1."""
        with self._lock:
            lo, hi = 0, self._entries - 1
            found = -1
            while lo <= hi:
                mid = (lo + hi) // 2
                if self._unpack(fmt, mid)[key_of] <= target:
                    found = mid
                    lo = mid + 1
                else:
                    hi = mid - 1
            return found
