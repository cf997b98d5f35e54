"""The log scrubber: every closed segment of every log read again, at a bounded rate, and each batch checked
as a fetch checks it (its CRC and a header that can be walked), so that bytes that changed on disk are found
while the other replicas still hold them intact, not when a consumer, a follower or a new leader first reads
them. HDFS's DataNode block scanner and ZFS's scrub do the same for their blocks.

A pass reads the logs one after the other, each log's segments within ``bytes_per_sec``: the closed ones, then
the active one up to where it ended when its read began (appends go on meanwhile). Before, the active segment
was left out, as "checked when appended": but that check was made once, maybe in an earlier run of the
broker, and a quiet partition's active segment holds up to ``segment.ms`` (7 days) of records, so the most
recent records of every partition were never scrubbed. A pass starts at most once per ``interval_ms``, the
first one ``FIRST_PASS_DELAY_MS`` after the start (or ``interval_ms``, when shorter).

A pass over a large disk takes long (1 TiB at 1 MiB/s: twelve days), longer than many brokers run between
restarts. So the pass's progress outlives the process: ``progress()`` (when the pass began, when the last one
ended, and per log the base offset of the next segment to check) goes to each data directory's
``scrubber-checkpoint`` with the other checkpoints (storage/log_manager.py), and ``seed()`` gives it back at
the start. A restarted broker resumes the pass where it was (``FIRST_PASS_DELAY_MS`` after the start), or
waits for the next one to be due (``interval_ms`` after the last one ended). A log's position is the offset
from which its segments are still to be checked: a segment's base offset, or, once its active segment was
checked, where that one ended then (the segments it rolls into later hold records appended since, and are
checked in the pass in progress). A position past a log's end belongs to another log of that name (deleted
and made again): that log is checked from its start.

What it finds goes to
``on_corrupt(log, CorruptBatchError)`` (the broker's ``ReplicaManager.corrupt_batch_found``: a replica whose
in-sync peers hold the batch is repaired from them; a sole replica logs it once), and the rest of that log
waits for the next pass. A disk read that fails (EIO) goes to ``on_error(log_dir, error)`` (the log manager
fails the directory, as for any read).

Offsets a segment lost on disk (cut short or emptied: ``Log.lost_offsets``) are reported as a corrupt batch at
the first of them, once that segment is checked.

A segment can change under a read that takes no lock: retention or compaction removes it (closed after
``file.delete.delay.ms``), a follower's truncation cuts it. So a batch that fails its check is read again
under the log's lock, from the segment as it is then, before it is reported: a segment no longer in the log,
or one that no longer holds that batch whole, reports nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.cleaner import CleanerAborted, Throttler, _iter_batches, confirmed_corrupt
from storage.log import Log
from storage.segment import CorruptBatchError, SegmentChangedError

log = logging.getLogger(__name__)

DEFAULT_SCRUB_BYTES_PER_SEC = 1024 * 1024  # HDFS's block scanner default: a disk hardly notices
DEFAULT_SCRUB_INTERVAL_MS = 7 * 24 * 3600 * 1000
FIRST_PASS_DELAY_MS = 600_000


@dataclass(frozen=True)
class ScrubProgress:
    """What ``scrubber-checkpoint`` keeps (times in ms since the epoch; 0: none)."""
    began_ms: int = 0  # when the pass in progress began (0: none in progress)
    ended_ms: int = 0  # when the last pass ended
    # Per log of the pass in progress: its segments from this offset on are still to be checked (module docstring).
    positions: Mapping[tuple[str, int], int] = field(default_factory=dict)


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class ScrubberStats:
    passes_total: int = 0
    bytes_total: int = 0
    batches_total: int = 0
    corrupt_batches_total: int = 0


class _Counted(Throttler):
    """The pass's throttle, counting what it read into the stats."""

    def __init__(self, bytes_per_sec: float, stop: threading.Event, stats: ScrubberStats) -> None:
        super().__init__(bytes_per_sec, stop)
        self.stats = stats

    def account(self, n: int) -> None:
        self.stats.bytes_total += n
        super().account(n)


class LogScrubber:
    def __init__(self, logs: Callable[[], Mapping[Any, Log]], *, bytes_per_sec: float = DEFAULT_SCRUB_BYTES_PER_SEC,
                 interval_ms: int = DEFAULT_SCRUB_INTERVAL_MS, enabled: bool = True,
                 wall_ms: Callable[[], int] = _wall_ms) -> None:
        if bytes_per_sec <= 0 or interval_ms <= 0:
            raise ValueError("the scrubber's rate and interval must be positive")
        self._logs = logs
        self.bytes_per_sec = bytes_per_sec
        self.interval_ms = interval_ms
        self.enabled = enabled
        self.stats = ScrubberStats()
        self.on_corrupt: Callable[[Log, CorruptBatchError], None] | None = None
        self.on_error: Callable[[Path, OSError], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wall_ms = wall_ms
        self._lock = threading.Lock()  # the progress below: the log manager's checkpointer reads it
        self._began_ms = 0
        self._ended_ms = 0
        self._positions: dict[tuple[str, int], int] = {}

    def seed(self, progress: ScrubProgress) -> None:
        """The progress a previous run of the broker checkpointed (before ``start``). A pass that began no later
        than the last one ended is not in progress (a directory's file written before that pass ended)."""
        began = progress.began_ms if progress.began_ms > progress.ended_ms else 0
        with self._lock:
            self._began_ms, self._ended_ms = began, progress.ended_ms
            self._positions = dict(progress.positions) if began else {}
        if began:
            log.info("the log scrubber resumes the pass begun at %d ms (%d log(s) under way or done)",
                     began, len(self._positions))

    def progress(self) -> ScrubProgress:
        with self._lock:
            return ScrubProgress(self._began_ms, self._ended_ms, dict(self._positions))

    def first_wait_ms(self) -> int:
        """How long after the start the first pass (or the rest of the one in progress) begins: soon, not an
        interval later (a broker restarted more often than ``interval_ms`` would never scrub otherwise), unless
        the last pass ended less than an interval ago."""
        soon = min(self.interval_ms, FIRST_PASS_DELAY_MS)
        with self._lock:
            began, ended = self._began_ms, self._ended_ms
        if began or not ended:
            return soon
        # A clock set back would put the last end in the future: never wait more than an interval.
        return min(self.interval_ms, max(soon, ended + self.interval_ms - self._wall_ms()))

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="log-scrubber", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        wait_ms = self.first_wait_ms()
        while not self._stop.wait(wait_ms / 1000):
            wait_ms = self.interval_ms
            started = time.monotonic()
            try:
                found = self.scrub_once()
            except CleanerAborted:
                return
            except Exception:  # never the thread's end: the next pass tries again
                log.exception("a log scrubber pass failed")
                continue
            log.info("log scrubber pass %d: %d bytes, %d batches checked in %.0f s, %d corrupt",
                     self.stats.passes_total, self.stats.bytes_total, self.stats.batches_total,
                     time.monotonic() - started, len(found))

    def scrub_once(self) -> list[CorruptBatchError]:
        """One pass over every log (or the rest of the pass in progress); the corrupt batches found (each also
        given to ``on_corrupt``). Raises CleanerAborted when ``shutdown`` cuts it short."""
        with self._lock:
            if not self._began_ms:
                self._began_ms, self._positions = self._wall_ms(), {}
        throttle = _Counted(self.bytes_per_sec, self._stop, self.stats)
        found = []
        for lg in list(self._logs().values()):
            corrupt = self.scrub_log(lg, throttle)
            if corrupt is not None:
                found.append(corrupt)
        with self._lock:
            self._began_ms, self._ended_ms, self._positions = 0, self._wall_ms(), {}
        self.stats.passes_total += 1
        return found

    def _advance(self, key: tuple[str, int], base_offset: int) -> None:
        with self._lock:
            self._positions[key] = base_offset

    def scrub_log(self, lg: Log, throttle: Throttler) -> CorruptBatchError | None:
        """Check ``lg``'s segments the pass has not checked yet, the active one last, up to where it ends when its
        read begins; the first corrupt batch (reported), else None."""
        key = (lg.topic, lg.partition)
        segments = lg.segments()
        with self._lock:
            start = self._positions.get(key, 0)
        if start > lg.log_end_offset:
            start = 0  # the position of another log of that name (deleted, made again): this one from its start
        for i, seg in enumerate(segments):
            if seg.base_offset < start:
                continue
            # Where the next position is once this one is checked: the next segment, or (the active one) the offset
            # after its last batch now; appends after that were checked as they came and go to later segments.
            after = segments[i + 1].base_offset if i + 1 < len(segments) else seg.next_offset
            lost = None
            try:
                for _ in _iter_batches(seg, throttle, self._stop):
                    self.stats.batches_total += 1
                lost = lg.lost_offsets_error(seg.next_offset)  # bytes the segment lost on disk (Log.lost_offsets)
                if lost is not None:
                    raise lost
                self._advance(key, after)
            except SegmentChangedError:
                continue  # removed while it was read: nothing to say of it
            except CorruptBatchError as corrupt:
                if corrupt is not lost and not confirmed_corrupt(lg, corrupt):
                    log.info("%s changed while it was scrubbed (%s): checked again next pass", seg, corrupt)
                    self._advance(key, after)
                    continue
                self.stats.corrupt_batches_total += 1
                log.error("%s-%d: the log scrubber found %s", lg.topic, lg.partition, corrupt)
                self._advance(key, lg.log_end_offset)  # the rest of the log waits for the next pass
                if self.on_corrupt is not None:
                    self.on_corrupt(lg, corrupt)
                return corrupt
            except OSError as exc:
                if seg.closed or not any(s is seg for s in lg.segments()):
                    continue  # removed (and closed) while it was read: nothing to say of it
                log.error("%s-%d: the log scrubber could not read %s: %s", lg.topic, lg.partition, seg, exc)
                if self.on_error is not None:
                    self.on_error(lg.dir, exc)
                return None
        return None

