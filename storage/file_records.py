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
"""

from __future__ import annotations

import os
from typing import Any


class FileRecords(bytes):
    fd: int
    position: int
    length: int
    first_offset: int

    def __new__(cls, fd: int, position: int, length: int, first_offset: int) -> FileRecords:
        obj = super().__new__(cls, b"")
        obj.fd = os.dup(fd)
        obj.position = position
        obj.length = length
        obj.first_offset = first_offset
        return obj

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
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError):
            pass

    def __reduce__(self) -> Any:  # never pickled: it holds a descriptor
        raise TypeError("FileRecords cannot be pickled")
