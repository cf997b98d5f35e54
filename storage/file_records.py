"""Record bytes left in their segment file, for sending with sendfile(2) (zero copy).

A ``FileRecords`` is a slice ``[position, position + length)`` of a segment file holding
whole batches. It owns a duplicate of the segment's file descriptor, so retention or
compaction deleting the segment while the slice waits to be sent changes nothing: the
open descriptor keeps the bytes readable. Close it once sent (or dropped); a slice that
is garbage-collected unclosed closes its descriptor then.

It is a ``bytes`` subclass whose ``len()`` is the slice's length and whose content is empty,
so message writers that size a field with ``len()`` and then ``write()`` it (kio's) size it
right and hand the object itself to the output buffer, which sends the file bytes in its place.
It must never reach a writer that copies the content (protobuf): that would send nothing.

The duplicated descriptors are counted: a slice waits until its answer is written, and a client that
sends fetches of many partitions and never reads held one descriptor per partition each (4-8 unread
fetches of 2,000 partitions took a broker to its descriptor limit: new clients refused, checkpoints
failing; found by an audit). ``FileRecords.within_budget`` makes a slice only while the slices of this
process hold less than ``slice_budget()`` descriptors (a quarter of the limit; segments may hold half,
storage/segment.py); past it the caller reads the bytes into memory instead (the byte budgets of the
fetch path bound those).
"""

from __future__ import annotations

import os
from typing import Any

from storage.fd_budget import DescriptorBudget

SLICE_FD_SHARE = 4  # slices waiting to be sent may hold at most a quarter of the process's descriptors
_SLICES = DescriptorBudget(SLICE_FD_SHARE)
_count = _SLICES.add


def open_slices() -> int:
    """Descriptors held by FileRecords of this process (made and not yet closed)."""
    return _SLICES.held()


def slice_budget() -> int:
    """Descriptors slices may hold before ``FileRecords.within_budget`` refuses one: a quarter of the limit."""
    return _SLICES.budget()


class FileRecords(bytes):
    fd: int
    position: int
    length: int
    first_offset: int

    def __new__(cls, fd: int, position: int, length: int, first_offset: int, *,
                _counted: bool = False) -> FileRecords:
        obj = super().__new__(cls, b"")
        obj.fd = -1
        if not _counted:
            _count(1)
        try:
            obj.fd = os.dup(fd)
        except BaseException:
            _count(-1)
            raise
        obj.position = position
        obj.length = length
        obj.first_offset = first_offset
        return obj

    @classmethod
    def within_budget(cls, fd: int, position: int, length: int, first_offset: int) -> FileRecords | None:
        """A slice, or None when slices already hold ``slice_budget()`` descriptors (read the bytes instead)."""
        if not _count(1, slice_budget()):
            return None
        return cls(fd, position, length, first_offset, _counted=True)

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def __repr__(self) -> str:
        return f"FileRecords(fd={self.fd}, position={self.position}, length={self.length})"

    def read(self) -> bytes:
        """The bytes themselves (a copy: for TLS connections and tests)."""
        out = os.pread(self.fd, self.length, self.position) if self.fd >= 0 else b""
        if len(out) != self.length:
            raise OSError(f"segment slice shrank: {len(out)} of {self.length} bytes readable")
        return out

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _count(-1)
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # OSError; or at interpreter exit, module globals already gone
            pass

    def __reduce__(self) -> Any:  # never pickled: it holds a descriptor
        raise TypeError("FileRecords cannot be pickled")
