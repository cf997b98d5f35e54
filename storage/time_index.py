"""TimeIndex: the sparse ``.timeindex`` file of a segment: timestamp -> offset.

Entry: 8-byte timestamp + 4-byte relative offset, big-endian, like Kafka. An entry
``(t, o)`` says: the largest timestamp seen in this segment up to batch ``o`` is ``t``,
and it was first reached at batch ``o`` (so every batch before ``o`` has a max timestamp
below ``t``). Timestamps strictly increase from entry to entry. When a segment is
rolled, a final entry with the segment's largest timestamp is written, so the last
entry of a closed segment gives the segment's largest timestamp (used by retention).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from storage.abstract_index import AbstractIndex, CorruptIndexError

_ENTRY = struct.Struct(">qi")


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int
    offset: int


class TimeIndex(AbstractIndex):
    entry_size = _ENTRY.size

    def entry(self, i: int) -> TimestampOffset:
        ts, rel = self._unpack(_ENTRY, i)
        return TimestampOffset(ts, self.base_offset + rel)

    def last_entry(self) -> TimestampOffset:
        with self._lock:
            if self._entries == 0:
                return TimestampOffset(-1, self.base_offset)
            if self._last_cache is None:  # the append path asks on every index entry
                self._last_cache = self.entry(self._entries - 1)
            return self._last_cache  # type: ignore[return-value]

    def lookup(self, timestamp_ms: int) -> TimestampOffset:
        """Largest entry with timestamp <= ``timestamp_ms``; (-1, base offset) when none."""
        with self._lock:
            i = self._search(0, timestamp_ms, _ENTRY)
            return TimestampOffset(-1, self.base_offset) if i < 0 else self.entry(i)

    def around(self, timestamp_ms: int) -> tuple[TimestampOffset | None, TimestampOffset | None, bool]:
        """(last entry with a timestamp below ``timestamp_ms`` or None, first entry with one at or above it or
        None, whether that first one is the index's last entry): one binary search."""
        with self._lock:
            i = self._search(0, timestamp_ms - 1, _ENTRY)
            below = self.entry(i) if i >= 0 else None
            if i + 1 >= self._entries:
                return below, None, False
            return below, self.entry(i + 1), i + 1 == self._entries - 1

    def needs_entry(self, timestamp_ms: int) -> bool:
        """Would ``maybe_append(timestamp_ms, ...)`` append (before the full check)?"""
        return timestamp_ms > 0 and timestamp_ms > self.last_entry().timestamp

    def maybe_append(self, timestamp_ms: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Append when the timestamp grew; the final entry at roll uses the reserved slot."""
        if timestamp_ms <= 0:
            return  # no timestamp (-1); an all-zero entry would read as padding
        with self._lock:
            last = self.last_entry()
            if timestamp_ms <= last.timestamp:
                return
            if offset < last.offset:
                raise ValueError(f"time index offset {offset} before last entry {last}")
            if not skip_full_check and self.is_full():
                return
            rel = offset - self.base_offset
            self._append_raw(_ENTRY.pack(timestamp_ms, rel))

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose offset is >= ``offset`` (offsets are ordered like timestamps)."""
        with self._lock:
            # Offsets never decrease from entry to entry, so a binary search on them is valid.
            self.truncate_to_entries(self._search(1, offset - self.base_offset - 1, _ENTRY) + 1)

    def sanity_check(self) -> None:
        with self._lock:
            if self._entries == 0:
                return
            first, last = self.entry(0), self.last_entry()
            if first.offset < self.base_offset or last.offset < first.offset or last.timestamp < first.timestamp:
                raise CorruptIndexError(f"{self.path}: entries out of order ({first}, {last})")
