"""OffsetIndex: the sparse ``.index`` file of a segment: relative offset -> file position.

Entry: 4-byte relative offset (offset - segment base offset) + 4-byte position of the
batch in the .log file, big-endian, like Kafka. One entry about every
``index.interval.bytes`` of log; the entry points at a batch's start and names that
batch's base offset, so a lookup gives a position from which a forward scan of batch
headers finds any larger offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from storage.abstract_index import AbstractIndex, CorruptIndexError

_ENTRY = struct.Struct(">iI")


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    offset: int
    position: int


class OffsetIndex(AbstractIndex):
    entry_size = _ENTRY.size

    def entry(self, i: int) -> OffsetPosition:
        rel, pos = self._unpack(_ENTRY, i)
        return OffsetPosition(self.base_offset + rel, pos)

    def last_entry(self) -> OffsetPosition:
        with self._lock:
            if self._entries == 0:
                return OffsetPosition(self.base_offset, 0)
            if self._last_cache is None:  # the append path asks on every index entry
                self._last_cache = self.entry(self._entries - 1)
            return self._last_cache  # type: ignore[return-value]

    def lookup(self, offset: int) -> OffsetPosition:
        """Largest entry with offset <= ``offset``; (base offset, 0) when there is none."""
        with self._lock:
            i = self._search(0, offset - self.base_offset, _ENTRY)
            return OffsetPosition(self.base_offset, 0) if i < 0 else self.entry(i)

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if not 0 <= rel <= 0x7FFFFFFF or position <= 0:
            raise ValueError(f"index entry ({offset}, {position}) invalid for base {self.base_offset}")
        with self._lock:
            if self._entries:
                last = self.last_entry()
                if offset <= last.offset or position <= last.position:
                    raise ValueError(f"index entry ({offset}, {position}) not after {last}")
            self._append_raw(_ENTRY.pack(rel, position))

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        with self._lock:
            self.truncate_to_entries(self._search(0, offset - self.base_offset - 1, _ENTRY) + 1)

    def sanity_check(self, log_size: int) -> None:
        """Cheap checks Kafka also does: entries ordered at the ends, positions inside the log."""
        with self._lock:
            if self._entries == 0:
                return
            first, last = self.entry(0), self.last_entry()
            if first.offset < self.base_offset or last.offset < first.offset:
                raise CorruptIndexError(f"{self.path}: offsets out of order ({first}, {last})")
            if last.position >= log_size or first.position > last.position:
                raise CorruptIndexError(f"{self.path}: position {last.position} beyond log size {log_size}")
