"""MemoryLog: the part of storage.log.Log that Partition and the follower fetcher use, in memory.

Batches are kept as (base offset, leader epoch, values); on the "wire" (produce
requests and fetch responses) they travel as JSON bytes, which is all the simulated
network needs. The leader-epoch cache is storage's real ``LeaderEpochFileCache`` with
its file write-through switched off, so truncation and epoch lookups are the product's.

A crash keeps only what was flushed (``flush`` moves the recovery point to the log
end, as an fsync would) and restores the high watermark from its last checkpoint.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from proto import errors
from storage.leader_epoch_cache import LeaderEpochFileCache
from storage.log import AppendInfo, FetchData, UnexpectedAppendOffsetError
from storage.log_config import LogConfig

MAX_BATCHES_PER_READ = 3  # small reads so fetches often return part of what is there


class MemoryEpochCache(LeaderEpochFileCache):
    """The real epoch cache logic with no checkpoint file."""

    def __init__(self) -> None:  # noqa: D107 - deliberately skips the file-reading parent init
        self._lock = threading.RLock()
        self._entries = []

    @property
    def path(self) -> Path:
        return Path("<memory>")

    def _flush(self) -> None:
        pass  # nothing to persist: crash recovery rebuilds the cache from the batches


@dataclass(frozen=True, slots=True)
class Batch:
    base_offset: int
    epoch: int
    values: tuple[str, ...]

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)


def encode_produce(values: list[str]) -> bytes:
    return json.dumps(values).encode()


def _encode_batches(batches: list[Batch]) -> bytes:
    return json.dumps([[b.base_offset, b.epoch, list(b.values)] for b in batches]).encode()


def decode_batches(records: bytes) -> list[Batch]:
    return [Batch(int(base), int(epoch), tuple(values)) for base, epoch, values in json.loads(records)]


class MemoryLog:
    def __init__(self, topic: str, partition: int, config: LogConfig) -> None:
        self.topic = topic
        self.partition = partition
        self.config = config
        self.epoch_cache = MemoryEpochCache()
        self.batches: list[Batch] = []
        self._flat: list[tuple[int, str]] = []  # (epoch, value) per offset from log_start_offset: fast checks
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.recovery_point = 0
        self.hw_checkpoint = 0
        self.lock = threading.RLock()  # as Log.lock (never contended in the simulator)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    # ---- appends ----
    def append_as_leader(self, records: bytes, leader_epoch: int, *, blocking: bool = True) -> AppendInfo:
        # In memory nothing waits: a non-blocking append (the broker's event loop) is the same append.
        values = tuple(json.loads(records))
        if not values:
            raise errors.CorruptMessageError("empty produce")
        first = self.log_end_offset
        if leader_epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(leader_epoch, first)
        self._write([Batch(first, leader_epoch, values)])
        return AppendInfo(first, first + len(values) - 1, -1, -1, len(values), 1, len(records))

    def append_as_follower(self, records: bytes, *, blocking: bool = True) -> AppendInfo:
        # As for append_as_leader: in memory nothing waits, so a non-blocking append is the same append.
        batches = decode_batches(records)
        expected = self.log_end_offset
        for b in batches:
            if b.base_offset < expected:
                raise UnexpectedAppendOffsetError(
                    f"{self.topic}-{self.partition}: follower append at {b.base_offset} below log end {expected}")
            expected = b.next_offset
        for b in batches:
            if b.epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(b.epoch, b.base_offset)
        self._write(batches)
        n = sum(len(b.values) for b in batches)
        return AppendInfo(batches[0].base_offset, expected - 1, -1, -1, n, len(batches), len(records))

    def _write(self, batches: list[Batch]) -> None:
        for b in batches:
            gap = b.base_offset - self.log_end_offset
            if gap > 0:  # accepted as Log.append_as_follower does; the invariants will see the hole
                self._flat.extend([(-1, "<gap>")] * gap)
            self._flat.extend((b.epoch, v) for v in b.values)
            self.batches.append(b)
            self.log_end_offset = b.next_offset

    def _reflat(self) -> None:
        self._flat = []
        end = self.log_start_offset
        for b in self.batches:
            self._flat.extend([(-1, "<gap>")] * (b.base_offset - end))
            self._flat.extend((b.epoch, v) for v in b.values)
            end = b.next_offset

    # ---- reads ----
    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_batch: bool = True) -> FetchData:
        start, end = self.log_start_offset, self.log_end_offset
        if start_offset < start or start_offset > end:
            raise errors.OffsetOutOfRangeError(
                f"offset {start_offset} out of range [{start}, {end}] for {self.topic}-{self.partition}")
        bound = end if max_offset is None else min(max_offset, end)
        picked = [b for b in self.batches if b.next_offset > start_offset and b.base_offset < bound]
        picked = picked[:MAX_BATCHES_PER_READ]
        if not picked:
            return FetchData(b"", -1, end, start)
        return FetchData(_encode_batches(picked), picked[0].base_offset, end, start)

    def record_at(self, offset: int) -> tuple[int, str] | None:
        """(epoch, value) of the record at ``offset``, or None."""
        i = offset - self.log_start_offset
        return self._flat[i] if 0 <= i < len(self._flat) else None

    def records(self, end: int | None = None) -> list[tuple[int, str]]:
        """(epoch, value) of every record below ``end`` (default: the log end), in offset order."""
        if end is None:
            return list(self._flat)
        return self._flat[:max(0, end - self.log_start_offset)]

    # ---- offsets and epochs ----
    def update_high_watermark(self, hw: int) -> int:
        self.high_watermark = min(max(hw, self.log_start_offset), self.log_end_offset)
        return self.high_watermark

    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        self.epoch_cache.assign(epoch, start_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # ---- truncation ----
    def truncate_to(self, offset: int) -> None:
        """As Log.truncate_to: every batch at or after ``offset`` goes, a batch spanning it goes whole."""
        if offset >= self.log_end_offset:
            return
        self.batches = [b for b in self.batches if b.next_offset <= offset]
        new_end = self.batches[-1].next_offset if self.batches else self.log_start_offset
        self.log_end_offset = new_end
        self._reflat()
        self.epoch_cache.truncate_from_end(new_end)
        self.high_watermark = min(self.high_watermark, new_end)
        self.recovery_point = min(self.recovery_point, new_end)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches = []
        self._flat = []
        self.epoch_cache.clear()
        self.log_start_offset = self.log_end_offset = offset
        self.high_watermark = self.recovery_point = offset

    # ---- durability ----
    def flush(self) -> None:
        self.recovery_point = self.log_end_offset
        self.hw_checkpoint = self.high_watermark

    def crash(self) -> int:
        """Lose what was not flushed, as a power cut would; returns how many records were lost."""
        before = self.log_end_offset
        self.batches = [b for b in self.batches if b.next_offset <= self.recovery_point]
        self.log_end_offset = self.batches[-1].next_offset if self.batches else self.log_start_offset
        self.recovery_point = self.log_end_offset
        self._reflat()
        # Log.open rebuilds the epoch cache from the batch headers it kept.
        self.epoch_cache.clear()
        for b in self.batches:
            if b.epoch > self.epoch_cache.latest_epoch:
                self.epoch_cache.assign(b.epoch, b.base_offset)
        self.high_watermark = min(self.hw_checkpoint, self.log_end_offset)
        return before - self.log_end_offset
