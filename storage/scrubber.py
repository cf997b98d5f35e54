"""The log scrubber: every closed segment of every log read again, at a bounded rate, and each batch checked
as a fetch checks it (its CRC and a header that can be walked), so that bytes that changed on disk are found
while the other replicas still hold them intact, not when a consumer, a follower or a new leader first reads
them. HDFS's DataNode block scanner and ZFS's scrub do the same for their blocks.

A pass reads the logs one after the other, each log's closed segments (the active one is being written, and
its batches were checked as they were appended or fetched) within ``bytes_per_sec``; a pass starts at most
once per ``interval_ms``, the first one ``FIRST_PASS_DELAY_MS`` after the start (or ``interval_ms``, when
shorter). What it finds goes to
``on_corrupt(log, CorruptBatchError)`` (the broker's ``ReplicaManager.corrupt_batch_found``: a replica whose
in-sync peers hold the batch is repaired from them; a sole replica logs it once), and the rest of that log
waits for the next pass. A disk read that fails (EIO) goes to ``on_error(log_dir, error)`` (the log manager
fails the directory, as for any read).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.cleaner import CleanerAborted, SegmentChanged, Throttler, _iter_batches, confirmed_corrupt
from storage.log import Log
from storage.segment import CorruptBatchError

log = logging.getLogger(__name__)

DEFAULT_SCRUB_BYTES_PER_SEC = 1024 * 1024  # HDFS's block scanner default: a disk hardly notices
DEFAULT_SCRUB_INTERVAL_MS = 7 * 24 * 3600 * 1000
FIRST_PASS_DELAY_MS = 600_000


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
                 interval_ms: int = DEFAULT_SCRUB_INTERVAL_MS, enabled: bool = True) -> None:
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
        # The first pass soon after the start, not an interval later: a broker restarted more often than
        # ``interval_ms`` would otherwise never scrub.
        wait_ms = min(self.interval_ms, FIRST_PASS_DELAY_MS)
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
        """One pass over every log; the corrupt batches found (each also given to ``on_corrupt``)."""
        throttle = _Counted(self.bytes_per_sec, self._stop, self.stats)
        found = []
        for lg in list(self._logs().values()):
            corrupt = self.scrub_log(lg, throttle)
            if corrupt is not None:
                found.append(corrupt)
        self.stats.passes_total += 1
        return found

    def scrub_log(self, lg: Log, throttle: Throttler) -> CorruptBatchError | None:
        """Check ``lg``'s closed segments; the first corrupt batch (reported), else None."""
        for seg in lg.segments()[:-1]:
            try:
                for _ in _iter_batches(seg, throttle, self._stop):
                    self.stats.batches_total += 1
            except SegmentChanged:
                continue  # removed while it was read: nothing to say of it
            except CorruptBatchError as corrupt:
                if not confirmed_corrupt(lg, corrupt):
                    log.info("%s changed while it was scrubbed (%s): checked again next pass", seg, corrupt)
                    continue
                self.stats.corrupt_batches_total += 1
                log.error("%s-%d: the log scrubber found %s", lg.topic, lg.partition, corrupt)
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

