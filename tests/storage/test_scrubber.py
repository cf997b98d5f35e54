"""The log scrubber (storage/scrubber.py): closed segments read again, each batch's CRC checked, on real files.

It must find a batch whose bytes changed on disk (and tell the broker, once), read nothing of the active
segment, keep within its rate (it counts every byte it reads), and report nothing for a segment that changed
under its read without a lock: removed by retention, or cut by a follower's truncation.
"""

from __future__ import annotations

import threading
from pathlib import Path

from storage_testlib import flip_byte, flip_value_byte, make_batch, now_ms
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


def test_a_clean_log_is_read_whole_its_active_segment_too_and_nothing_is_reported(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    scrubber, told = _scrubber(lg)
    assert scrubber.scrub_once() == [] and told == []
    every = lg.segments()
    assert scrubber.stats.batches_total == sum(len(list(iter_batches(s.log_path.read_bytes()))) for s in every)
    assert scrubber.stats.bytes_total == sum(s.size for s in every), "read more or less than the segments"
    assert scrubber.stats.passes_total == 1
    lg.close()


def test_a_batch_changed_on_disk_is_found_and_told_once_a_pass(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    seg = lg.segments()[2]
    h = flip_value_byte(seg.log_path, 1)  # a value byte: the batch's CRC no longer matches
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


def test_the_active_segment_is_scrubbed_up_to_where_it_ended_when_its_read_began(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """Before, the active segment was left out as checked when appended; a quiet partition's holds days of
    records, checked once, perhaps by an earlier run of the broker."""
    lg = _log(tmp_path, batches=9)  # the active segment holds one batch
    active = lg.segments()[-1]
    h = flip_value_byte(active.log_path, 0)
    scrubber, told = _scrubber(lg)
    assert [(c.base_offset, c.filename) for c in scrubber.scrub_once()] == [(h.base_offset, str(active.log_path))]
    assert len(told) == 1
    flip_value_byte(active.log_path, 0)  # intact again; appends go on while the pass reads
    import storage.scrubber as scrubber_module
    real_iter = scrubber_module._iter_batches

    def appending_meanwhile(seg, throttle, stop):
        for item in real_iter(seg, throttle, stop):
            if seg is lg.segments()[-1] and lg.log_end_offset == 18:
                lg.append_as_leader(make_batch(2, ts=now_ms()), 0)  # fits the active segment: not read this pass
            yield item
    monkeypatch.setattr(scrubber_module, "_iter_batches", appending_meanwhile)
    scrubber, told = _scrubber(lg)
    assert scrubber.scrub_once() == [] and told == []
    assert scrubber.stats.bytes_total == _sizes(lg.segments()) - lg.segments()[-1].size + BATCH
    lg.close()


def test_a_segment_removed_or_cut_while_it_is_read_reports_nothing(tmp_path: Path) -> None:
    """The scrubber reads without the log's lock: what it read of a segment that retention removed, or that a
    truncation cut, is checked again under the lock against the segment as it is then, and not reported."""
    lg = _log(tmp_path)
    seg = lg.segments()[1]
    h = flip_value_byte(seg.log_path, 1)
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
    flip_value_byte(seg.log_path, 1)
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
    h = flip_value_byte(seg.log_path, 0)
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


def _sizes(segments) -> int:
    return sum(s.size for s in segments)


def test_a_pass_cut_short_resumes_where_it_was_and_checks_nothing_twice(tmp_path: Path, monkeypatch) -> None:
    """A broker restarted in the middle of a pass (a pass over a large disk takes days): the progress it
    checkpointed names, per log, the next segment to check; the resumed pass reads only from there on."""
    import storage.scrubber as scrubber_module
    from storage.cleaner import CleanerAborted

    lg = _log(tmp_path)
    closed = lg.segments()[:-1]
    assert len(closed) == 4
    seg0 = closed[0]
    h = flip_value_byte(seg0.log_path, 0)  # only a pass that reads segment 0 can find it
    walls = iter(range(1_000, 10_000, 1_000))
    first = LogScrubber(lambda: {("t", 0): lg}, bytes_per_sec=1 << 30, interval_ms=3_600_000,
                        wall_ms=lambda: next(walls))
    assert first.scrub_once()[0].base_offset == h.base_offset
    ended = first.progress().ended_ms
    assert first.progress() == scrubber_module.ScrubProgress(0, ended, {})
    flip_value_byte(seg0.log_path, 0)  # flipped back: intact again

    real_iter = scrubber_module._iter_batches
    reads: list[int] = []

    def stopping_at_the_third(seg, throttle, stop):  # the broker stops while the pass reads segment 2
        reads.append(seg.base_offset)
        if len(reads) == 3:
            first._stop.set()
        return real_iter(seg, throttle, stop)

    monkeypatch.setattr(scrubber_module, "_iter_batches", stopping_at_the_third)
    try:
        first.scrub_once()
        raise AssertionError("the pass ran on after shutdown")
    except CleanerAborted:
        pass
    progress = first.progress()
    assert progress.began_ms > ended and progress.ended_ms == ended
    assert progress.positions == {("t", 0): closed[2].base_offset}, "segments 0 and 1 were checked"
    monkeypatch.setattr(scrubber_module, "_iter_batches", real_iter)

    flip_value_byte(seg0.log_path, 0)  # corrupt again, in a segment this pass already checked
    resumed, told = _scrubber(lg)
    resumed.seed(progress)
    assert resumed.first_wait_ms() == min(3_600_000, scrubber_module.FIRST_PASS_DELAY_MS), "resumed soon"
    assert resumed.scrub_once() == [] and told == []
    assert resumed.stats.bytes_total == _sizes(lg.segments()[2:]), "read again what the pass had checked"
    assert resumed.stats.passes_total == 1
    after = resumed.progress()
    assert after.began_ms == 0 and after.ended_ms > 0 and after.positions == {}
    # The next pass starts afresh and reads segment 0 again.
    assert [c.base_offset for c in resumed.scrub_once()] == [h.base_offset] and len(told) == 1
    lg.close()


def test_a_log_done_in_the_pass_is_skipped_and_what_it_appends_later_is_checked(tmp_path: Path) -> None:
    lg = _log(tmp_path)
    scrubber, _ = _scrubber(lg)
    scrubber.scrub_once()
    done_at = lg.log_end_offset
    scrubber.seed(scrubber_progress(began_ms=5, positions={("t", 0): done_at}))  # as the pass left it
    scrubber.scrub_once()
    assert scrubber.stats.bytes_total == _sizes(lg.segments()), "a done log was read again"
    for _ in range(2):  # the active segment rolls: the new one holds what came after the log was checked
        lg.append_as_leader(make_batch(2, ts=now_ms()), 0)
    assert lg.segments()[-1].base_offset == done_at
    scrubber, _ = _scrubber(lg)
    scrubber.seed(scrubber_progress(began_ms=5, positions={("t", 0): done_at}))
    scrubber.scrub_once()
    assert scrubber.stats.bytes_total == lg.segments()[-1].size
    lg.close()


def test_a_position_past_the_log_is_another_logs_and_the_log_is_checked_whole(tmp_path: Path) -> None:
    """A topic deleted and made again under its name: the old log's position must not skip the new one."""
    lg = _log(tmp_path)
    scrubber, _ = _scrubber(lg)
    scrubber.seed(scrubber_progress(began_ms=5, positions={("t", 0): 1_000_000}))
    scrubber.scrub_once()
    assert scrubber.stats.bytes_total == _sizes(lg.segments())
    lg.close()


def scrubber_progress(began_ms: int = 0, ended_ms: int = 0, positions=None):
    from storage.scrubber import ScrubProgress
    return ScrubProgress(began_ms, ended_ms, positions or {})


def test_the_first_pass_after_a_start_waits_for_its_turn() -> None:
    """Soon after the start when a pass is under way or none ever ended or one is overdue; else when the next
    one is due; never more than an interval (a clock set back)."""
    from storage.scrubber import FIRST_PASS_DELAY_MS
    day = 86_400_000
    now = 100 * day
    scrubber = LogScrubber(dict, interval_ms=7 * day, wall_ms=lambda: now)
    assert scrubber.first_wait_ms() == FIRST_PASS_DELAY_MS
    scrubber.seed(scrubber_progress(began_ms=now - day, ended_ms=now - 8 * day, positions={("t", 0): 7}))
    assert scrubber.first_wait_ms() == FIRST_PASS_DELAY_MS
    scrubber.seed(scrubber_progress(ended_ms=now - day))
    assert scrubber.first_wait_ms() == 6 * day
    scrubber.seed(scrubber_progress(ended_ms=now - 7 * day + 1_000))
    assert scrubber.first_wait_ms() == FIRST_PASS_DELAY_MS, "due within the first-pass delay: not sooner"
    scrubber.seed(scrubber_progress(ended_ms=now - 30 * day))
    assert scrubber.first_wait_ms() == FIRST_PASS_DELAY_MS
    scrubber.seed(scrubber_progress(ended_ms=now + 30 * day))
    assert scrubber.first_wait_ms() == 7 * day
    short = LogScrubber(dict, interval_ms=50, wall_ms=lambda: now)
    short.seed(scrubber_progress(ended_ms=now - 10))
    assert short.first_wait_ms() == 50


def test_offsets_a_segment_lost_on_disk_are_found_and_told(tmp_path: Path) -> None:
    """A closed segment emptied on disk, its indexes left: the offsets it held are reported as a corrupt batch at
    the first of them (Log.lost_offsets), so the broker repairs it from the other replicas as for a changed batch."""
    cfg = LogConfig(segment_bytes=BATCH * 4, index_interval_bytes=1, file_delete_delay_ms=0)
    lg = Log.open(tmp_path / "t-0", cfg)
    for i in range(12):
        lg.append_as_leader(make_batch(2, ts=now_ms() + i), 0)
    lg.close()
    emptied = sorted((tmp_path / "t-0").glob("*.log"))[1]
    emptied.write_bytes(b"")
    lg = Log.open(tmp_path / "t-0", cfg, recovery_point=10**9, clean_shutdown=True)
    scrubber, told = _scrubber(lg)
    found = scrubber.scrub_once()
    assert len(found) == 1 and told == [(lg, found[0])], told
    assert (found[0].base_offset, found[0].next_offset) == (8, 16), found[0]
    assert scrubber.stats.corrupt_batches_total == 1
    lg.close()
