"""The log scrubber (storage/scrubber.py): closed segments read again, each batch's CRC checked, on real files.

It must find a batch whose bytes changed on disk (and tell the broker, once), read nothing of the active
segment, keep within its rate (it counts every byte it reads), and report nothing for a segment that changed
under its read without a lock: removed by retention, or cut by a follower's truncation.
"""

from __future__ import annotations

import threading
from pathlib import Path

from storage_testlib import flip_byte, make_batch, now_ms
from waiting import wait_for

from storage.cleaner import Throttler
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import iter_batches
from storage.scrubber import LogScrubber
from storage.segment import CorruptBatchError

BATCH = len(make_batch(2))


def _log(tmp_path: Path, batches: int = 10) -> Log:
    """``batches`` batches of two records, two batches a segment: the last segment is the active one."""
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=BATCH * 2, file_delete_delay_ms=0,
                                              retention_ms=60_000))
    ts = now_ms()
    for i in range(batches):
        lg.append_as_leader(make_batch(2, ts=ts + i), 0)
    lg.update_high_watermark(lg.log_end_offset)
    return lg


def _scrubber(lg: Log) -> tuple[LogScrubber, list[tuple[Log, CorruptBatchError]]]:
    scrubber = LogScrubber(lambda: {("t", 0): lg}, bytes_per_sec=1 << 30, interval_ms=3_600_000)
    told: list[tuple[Log, CorruptBatchError]] = []
    scrubber.on_corrupt = lambda log_, corrupt: told.append((log_, corrupt))
    return scrubber, told


def test_a_clean_log_is_read_whole_but_its_active_segment_and_nothing_is_reported(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    scrubber, told = _scrubber(lg)
    assert scrubber.scrub_once() == [] and told == []
    closed = lg.segments()[:-1]
    assert scrubber.stats.batches_total == sum(len(list(iter_batches(s.log_path.read_bytes()))) for s in closed)
    assert scrubber.stats.bytes_total == sum(s.size for s in closed), "read more or less than the closed segments"
    assert scrubber.stats.passes_total == 1
    lg.close()


def test_a_batch_changed_on_disk_is_found_and_told_once_a_pass(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    seg = lg.segments()[2]
    pos, h = list(iter_batches(seg.log_path.read_bytes()))[1]
    flip_byte(seg.log_path, pos + h.size - 1)  # a value byte: the batch's CRC no longer matches
    scrubber, told = _scrubber(lg)
    found = scrubber.scrub_once()
    assert [(c.base_offset, c.next_offset, c.filename) for c in found] == \
        [(h.base_offset, h.next_offset, str(seg.log_path))], found
    assert told == [(lg, found[0])]
    assert scrubber.stats.corrupt_batches_total == 1
    # The rest of that log waits for the next pass, which finds the same batch again.
    assert [c.base_offset for c in scrubber.scrub_once()] == [h.base_offset]
    lg.close()


def test_a_corrupt_length_field_is_found(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    seg = lg.segments()[1]
    pos, _ = list(iter_batches(seg.log_path.read_bytes()))[1]
    flip_byte(seg.log_path, pos + 8, 0x7F)  # the batch length's high byte: the batch would run past the segment
    scrubber, told = _scrubber(lg)
    assert [c.filename for c in scrubber.scrub_once()] == [str(seg.log_path)]
    assert len(told) == 1
    lg.close()


def test_the_active_segment_is_not_scrubbed(tmp_path: Path) -> None:
    lg = _log(tmp_path, batches=9)  # the active segment holds one batch
    active = lg.segments()[-1]
    pos, h = list(iter_batches(active.log_path.read_bytes()))[0]
    flip_byte(active.log_path, pos + h.size - 1)
    scrubber, told = _scrubber(lg)
    assert scrubber.scrub_once() == [] and told == []
    lg.close()


def test_a_segment_removed_or_cut_while_it_is_read_reports_nothing(tmp_path: Path) -> None:
    """The scrubber reads without the log's lock: what it read of a segment that retention removed, or that a
    truncation cut, is checked again under the lock against the segment as it is then, and not reported."""
    lg = _log(tmp_path)
    seg = lg.segments()[1]
    pos, h = list(iter_batches(seg.log_path.read_bytes()))[1]
    flip_byte(seg.log_path, pos + h.size - 1)
    scrubber, told = _scrubber(lg)
    # Cut: a follower truncates into that segment after the scrubber read it (the batch goes with the cut).
    truncated = threading.Event()

    class CutAfterReading(Throttler):
        def account(self, n: int) -> None:
            if not truncated.is_set():
                truncated.set()
                lg.truncate_to(h.base_offset)
    assert scrubber.scrub_log(lg, CutAfterReading(0)) is None, "a batch cut away under the read was reported"
    assert told == []
    lg.close()


def test_a_removed_segment_reports_nothing(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    seg = lg.segments()[0]
    pos, h = list(iter_batches(seg.log_path.read_bytes()))[1]
    flip_byte(seg.log_path, pos + h.size - 1)
    scrubber, told = _scrubber(lg)

    class RemoveAfterReading(Throttler):
        def account(self, n: int) -> None:
            if not seg.closed:
                lg.delete_old_segments(now_ms() + 10 * 3_600_000)  # everything closed is past retention now
    assert scrubber.scrub_log(lg, RemoveAfterReading(0)) is None, "a removed segment's batch was reported"
    assert told == []
    lg.close()


def test_the_thread_scrubs_each_interval_and_stops(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    seg = lg.segments()[1]
    pos, h = list(iter_batches(seg.log_path.read_bytes()))[0]
    flip_byte(seg.log_path, pos + h.size - 1)
    scrubber = LogScrubber(lambda: {("t", 0): lg}, bytes_per_sec=1 << 30, interval_ms=50)
    told: list[CorruptBatchError] = []
    scrubber.on_corrupt = lambda _lg, corrupt: told.append(corrupt)
    scrubber.start()
    try:
        wait_for(lambda: len(told) >= 2, 10, "two passes to find the batch", poll_s=0.01)
    finally:
        scrubber.shutdown()
    passes = scrubber.stats.passes_total
    assert {c.base_offset for c in told} == {h.base_offset}
    assert not any(t.name == "log-scrubber" for t in threading.enumerate()), "the thread outlived shutdown"
    assert scrubber.stats.passes_total == passes
    lg.close()
