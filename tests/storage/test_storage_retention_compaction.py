"""Retention (time, size, only below the HW) and compaction (last value per key, tombstones, swaps)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from storage_testlib import flip_value_byte, make_batch, now_ms, read_all
from waiting import wait_for

from proto import errors
from storage import cleaner as cleaner_module
from storage.cleaner import LogCleaner, Throttler
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import decode_records, iter_batches
from storage.segment import CorruptBatchError, SegmentChangedError


def _fill(lg: Log, batches: int, ts: int, count: int = 2) -> None:
    for i in range(batches):
        lg.append_as_leader(make_batch(count, ts=ts + i), 0)


def test_retention_by_time_only_closed_segments_below_hw(tmp_path: Path) -> None:
    size = len(make_batch(2))
    cfg = LogConfig(segment_bytes=size * 2, retention_ms=60_000, file_delete_delay_ms=0)
    lg = Log.open(tmp_path / "t-0", cfg)
    old = now_ms() - 3_600_000
    _fill(lg, 6, old)  # three old segments: [0,4) [4,8) [8,12)
    _fill(lg, 2, now_ms())  # a fresh one [12,16) and the active one
    assert [s.base_offset for s in lg.segments()] == [0, 4, 8, 12]
    assert lg.delete_old_segments() == 0  # HW is 0: nothing is below it
    lg.update_high_watermark(6)
    assert lg.delete_old_segments() == 1  # only [0,4) lies fully below the HW
    assert lg.log_start_offset == 4
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.delete_old_segments() == 2
    assert lg.log_start_offset == 12 and [s.base_offset for s in lg.segments()] == [12]
    assert not any(p.name.startswith("00000000000000000000") for p in (tmp_path / "t-0").iterdir())
    assert read_all(lg)  # the fresh data is still served
    lg.close()


def test_retention_takes_the_active_segment_once_it_is_past_retention_and_replicated(tmp_path: Path) -> None:
    """As Kafka's deletableSegments: with every closed segment gone, the active one goes too once it is past
    retention and fully replicated (a new empty segment is rolled at the log end first). Only closed segments
    went, so a partition no longer written kept its last segment past retention.ms for good (audit)."""
    cfg = LogConfig(segment_bytes=1 << 20, retention_ms=60_000, file_delete_delay_ms=0)
    lg = Log.open(tmp_path / "t-0", cfg)
    _fill(lg, 5, now_ms() - 3_600_000)  # one segment, the active one, past retention
    assert lg.delete_old_segments() == 0  # not replicated yet (HW 0)
    lg.update_high_watermark(lg.log_end_offset - 1)
    assert lg.delete_old_segments() == 0  # nor all of it
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.delete_old_segments() == 1
    assert (lg.log_start_offset, lg.log_end_offset) == (10, 10) and [s.base_offset for s in lg.segments()] == [10]
    assert lg.append_as_leader(make_batch(2), 0).first_offset == 10  # written on as before
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.delete_old_segments() == 0  # fresh data stays
    lg.close()
    lg = Log.open(tmp_path / "t-0", cfg)
    assert (lg.log_start_offset, lg.log_end_offset) == (10, 12)
    lg.close()


def test_retention_rolls_the_active_segment_only_within_the_descriptor_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The roll before the active segment is deleted is a new segment, and the deleted one keeps its descriptors
    until file.delete.delay.ms: as any roll, only while segments hold less than half the descriptor limit. It
    skipped that check, and retention.ms=1 on 100 busy partitions took two of three nodes past their limit: their
    quorum journals failed with EMFILE and they halted (audit)."""
    from storage import log as log_module

    cfg = LogConfig(segment_bytes=1 << 20, retention_ms=60_000, file_delete_delay_ms=3_600_000)
    lg = Log.open(tmp_path / "t-0", cfg)
    _fill(lg, 5, now_ms() - 3_600_000)
    lg.update_high_watermark(lg.log_end_offset)
    monkeypatch.setattr(log_module, "segment_budget", log_module.open_segments)  # no room for one more
    assert lg.delete_old_segments() == 0 and [s.base_offset for s in lg.segments()] == [0]
    monkeypatch.undo()
    assert lg.delete_old_segments() == 1  # room again: it goes
    lg.close()


def test_retention_by_size_and_delayed_file_delete(tmp_path: Path) -> None:
    size = len(make_batch(2))
    cfg = LogConfig(segment_bytes=size * 2, retention_bytes=size * 5, retention_ms=-1, file_delete_delay_ms=60_000)
    lg = Log.open(tmp_path / "t-0", cfg)
    _fill(lg, 9, now_ms())  # segments of 2 batches: sizes 2,2,2,2,1
    lg.update_high_watermark(lg.log_end_offset)
    t = now_ms()
    assert lg.delete_old_segments(now_ms=t) == 2
    assert lg.size_bytes <= size * 5 and lg.log_start_offset == 8
    deleted = [p for p in (tmp_path / "t-0").iterdir() if p.name.endswith(".deleted")]
    assert len(deleted) == 8  # 2 segments x (log, 3 indexes): renamed now, removed after file.delete.delay.ms
    lg.delete_pending_segments(now_ms=t + 60_001)
    assert not [p for p in (tmp_path / "t-0").iterdir() if p.name.endswith(".deleted")]
    lg.close()


def test_compact_policy_does_not_delete_by_retention(tmp_path: Path) -> None:
    size = len(make_batch(2))
    cfg = LogConfig(segment_bytes=size * 2, retention_ms=1, cleanup_policy=("compact",))
    lg = Log.open(tmp_path / "t-0", cfg)
    _fill(lg, 6, now_ms() - 100_000)
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.delete_old_segments() == 0
    lg.close()


def _compacted_log(tmp_path: Path, **extra) -> Log:
    size = len(make_batch(1, key=b"key-00", value_size=20))
    cfg = LogConfig(segment_bytes=size * 8, cleanup_policy=("compact",), file_delete_delay_ms=0, **extra)
    return Log.open(tmp_path / "c-0", cfg)


def _put(lg: Log, key: str, value: bytes | None, ts: int) -> int:
    return lg.append_as_leader(make_batch(1, ts=ts, keys=[key.encode()], values=[value]), 0).first_offset


def _latest(lg: Log) -> dict[bytes, tuple[int, bytes | None]]:
    return {r.key: (r.offset, r.value) for r in decode_records(read_all(lg))}


def test_compaction_keeps_last_value_per_key_and_offsets(tmp_path: Path) -> None:
    lg = _compacted_log(tmp_path)
    ts = now_ms()
    expected: dict[bytes, tuple[int, bytes | None]] = {}
    for i in range(60):
        key = f"key-{i % 7:02d}"
        value = f"value-{i:04d}".encode()
        expected[key.encode()] = (_put(lg, key, value, ts), value)
    active_before = lg.segments()[-1]
    active_bytes = active_before.size
    lg.update_high_watermark(lg.log_end_offset)
    before = lg.size_bytes
    stats = LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    assert stats.segments_cleaned >= 1 and lg.size_bytes < before
    records = list(decode_records(read_all(lg)))
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets)
    # every key's latest value survives with its original offset
    latest = {r.key: (r.offset, r.value) for r in records}
    assert latest == expected
    # closed segments hold one record per key at most; the active segment is untouched
    active = lg.segments()[-1]
    assert active is active_before and active.size == active_bytes
    closed_keys = [r.key for r in records if r.offset < active.base_offset]
    assert len(closed_keys) == len(set(closed_keys))
    assert lg.log_end_offset == 60
    # reading works from any offset, including compacted-away ones
    got = lg.read(1, 1 << 20)
    assert got.first_offset >= 1 and got.records
    lg.close()
    lg = Log.open(tmp_path / "c-0", lg.config)  # full rescan: the cleaned segments are valid
    assert _latest(lg) == expected
    lg.close()


def test_tombstones_dropped_after_delete_retention(tmp_path: Path) -> None:
    """A tombstone goes once its segment was last written more than delete.retention.ms ago by the broker's
    clock. The records' own timestamps do not count: a tombstone stamped an hour ago (a mirrored or replayed
    delete) went at the first pass, before a consumer behind could see the delete (audit)."""
    lg = _compacted_log(tmp_path, delete_retention_ms=60_000)
    old = now_ms() - 3_600_000
    for i in range(20):
        _put(lg, f"key-{i % 4:02d}", b"v", old + i)
    _put(lg, "key-01", None, old + 100)  # tombstone, in a segment written an hour ago
    for i in range(8):
        _put(lg, f"fill-{i:02d}", b"x", old + 200 + i)
    lg.roll()
    hour_ago_s = time.time() - 3600
    for seg in lg.segments()[:-1]:
        os.utime(seg.log_path, (hour_ago_s, hour_ago_s))
    _put(lg, "key-02", None, old + 300)  # a tombstone stamped an hour ago, written now
    for i in range(9):
        _put(lg, f"late-{i:02d}", b"y", old + 400 + i)
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    cleaner.clean_log(lg)
    latest = _latest(lg)
    assert b"key-01" not in latest  # its segment was written more than delete.retention.ms ago: gone
    assert latest[b"key-02"][1] is None, latest  # written now: kept, whatever its timestamp
    assert latest[b"key-00"][1] == b"v" and latest[b"key-03"][1] == b"v"
    assert cleaner.checkpoints()[("c", 0)] > 0
    written = {seg.base_offset: seg.last_written_ms() for seg in lg.segments()[:-1]}
    assert min(written.values()) < (hour_ago_s + 60) * 1000, f"a rewrite reset when it was written: {written}"
    cleaner.clean_log(lg)  # a second pass soon after: the segments' times were kept, the tombstone too
    assert _latest(lg)[b"key-02"][1] is None
    _put(lg, "key-00", b"w", old + 500)  # something dirty for the next pass to clean
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    cleaner.clean_log(lg, now_ms=now_ms() + 120_000)  # past delete.retention.ms
    assert b"key-02" not in _latest(lg)
    lg.close()


def test_a_log_nothing_dirties_again_is_picked_for_its_due_tombstones(tmp_path: Path) -> None:
    """A pass that keeps a tombstone (not yet past delete.retention.ms) remembers when it may go, and the log is
    picked for it then though nothing dirtied it again (Kafka's latestDeleteHorizon): the delete stayed in such
    a log for good. That pass goes over the cleaned section only, and the log is not picked again after it."""
    lg = _compacted_log(tmp_path, delete_retention_ms=60_000)
    ts = now_ms()
    for i in range(16):
        _put(lg, f"key-{i % 4:02d}", b"v", ts + i)
    _put(lg, "key-01", None, ts + 20)  # a tombstone, written now
    for i in range(7):
        _put(lg, f"fill-{i:02d}", b"x", ts + 30 + i)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    assert cleaner.grab_filthiest(now_ms=ts) is lg
    first = cleaner.clean_log(lg, now_ms=ts)
    cleaner._in_progress.clear()  # what the background thread does after a pass
    assert first.tombstones_kept == 1 and first.tombstones_due_ms is not None
    assert _latest(lg)[b"key-01"][1] is None
    end = cleaner.checkpoints()[("c", 0)]
    assert cleaner.grab_filthiest(now_ms=ts + 1_000) is None  # clean, and the tombstone not yet due
    later = first.tombstones_due_ms + 1
    assert cleaner.grab_filthiest(now_ms=later) is lg
    second = cleaner.clean_log(lg, now_ms=later)
    cleaner._in_progress.clear()
    assert second.tombstones_dropped == 1 and second.tombstones_kept == 0
    latest = _latest(lg)
    assert b"key-01" not in latest and latest[b"key-00"][1] == b"v" and latest[b"fill-06"][1] == b"x"
    assert cleaner.checkpoints()[("c", 0)] == end  # the cleaned section only: the checkpoint stays
    assert cleaner.grab_filthiest(now_ms=later + 1_000) is None  # nothing due any more: not picked again
    lg.close()


def test_min_compaction_lag_and_hw_bound_the_dirty_section(tmp_path: Path) -> None:
    lg = _compacted_log(tmp_path)
    ts = now_ms()
    for i in range(40):
        _put(lg, "same", f"{i}".encode(), ts)
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    assert cleaner.clean_log(lg).segments_cleaned == 0  # HW 0: nothing committed to clean
    lg.update_high_watermark(lg.log_end_offset)
    assert cleaner.dirty_ratio(lg) > 0.5
    assert cleaner.grab_filthiest() is lg
    lg.close()


def test_offset_map_bound_limits_one_pass(tmp_path: Path) -> None:
    lg = _compacted_log(tmp_path)
    ts = now_ms()
    for i in range(48):
        _put(lg, f"key-{i:02d}", b"v", ts)  # all distinct keys: 6 closed segments of 8
    lg.update_high_watermark(lg.log_end_offset)
    bases = [s.base_offset for s in lg.segments()]
    assert len(bases) >= 4
    cleaner = LogCleaner(lambda: {("c", 0): lg}, max_map_entries=20)
    stats = cleaner.clean_log(lg)
    # only whole segments whose keys fit in 20 map entries are cleaned in one pass
    assert stats.end_offset == max(b for b in bases if b <= 20) > 0
    second = cleaner.clean_log(lg)  # the next pass continues from there
    assert second.first_dirty_offset == stats.end_offset and second.end_offset > stats.end_offset
    assert len(_latest(lg)) == 48
    lg.close()


def test_crash_mid_swap_is_completed_on_open(tmp_path: Path) -> None:
    lg = _compacted_log(tmp_path)
    ts = now_ms()
    expected = {}
    for i in range(40):
        key = f"key-{i % 3:02d}"
        expected[key.encode()] = (_put(lg, key, f"{i}".encode(), ts), f"{i}".encode())
    lg.update_high_watermark(lg.log_end_offset)
    d = tmp_path / "c-0"

    # Simulate a crash after the cleaned segment was renamed .swap but before the old
    # segments were replaced: clean, then put the old files back beside the swap file.
    saved = {p.name: p.read_bytes() for p in d.iterdir() if p.suffix == ".log"}
    LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    cleaned = (d / "00000000000000000000.log").read_bytes()
    lg.close_without_flush()
    for name, data in saved.items():
        (d / name).write_bytes(data)
    (d / "00000000000000000000.log.swap").write_bytes(cleaned)
    (d / "00000000000000000008.log.cleaned").write_bytes(b"partial garbage")
    lg = Log.open(d, lg.config)
    assert not [p for p in d.iterdir() if p.name.endswith((".swap", ".cleaned"))]
    assert _latest(lg) == expected
    bases = [h.base_offset for _p, h in iter_batches(read_all(lg))]
    assert bases == sorted(set(bases))
    lg.close()
    os.sync()


def test_max_compaction_lag_forces_cleaning_below_the_ratio(tmp_path: Path) -> None:
    lg = _compacted_log(tmp_path, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=60_000)
    old = now_ms() - 3_600_000
    for i in range(30):
        _put(lg, f"k{i % 2}", f"{i}".encode(), old + i)
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    cleaner.clean_log(lg)  # now everything is clean
    for i in range(10):
        _put(lg, f"k{i % 2}", f"{i}".encode(), old + 100 + i)  # a little dirty data, already old
    lg.update_high_watermark(lg.log_end_offset)
    assert 0 < cleaner.dirty_ratio(lg) < 0.99
    assert cleaner.grab_filthiest() is lg  # overdue by max.compaction.lag.ms
    lg.close()


def test_segments_below_a_moved_log_start_are_deleted(tmp_path: Path) -> None:
    size = len(make_batch(2))
    cfg = LogConfig(segment_bytes=size * 2, retention_ms=-1, retention_bytes=-1, file_delete_delay_ms=0)
    lg = Log.open(tmp_path / "t-0", cfg)
    _fill(lg, 6, now_ms())  # segments [0,4) [4,8) [8,12) + active
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(9)
    with pytest.raises(errors.OffsetOutOfRangeError):
        lg.read(8, 100)
    assert lg.read(9, 100).first_offset == 8  # the batch holding offset 9
    assert lg.delete_old_segments() == 2
    assert [s.base_offset for s in lg.segments()][0] == 8 and lg.log_start_offset == 9
    with pytest.raises(errors.OffsetOutOfRangeError):
        lg.set_log_start_offset(100)  # above the high watermark
    lg.close()


def test_compaction_keeps_each_producers_last_batch_so_its_sequence_survives_a_rebuild(tmp_path: Path) -> None:
    """Kafka's cleaner keeps the last batch of every producer it tracks: producer state rebuilt from
    the log after a crash (no snapshot) must still know where each producer's sequence stands. Here
    producer 7's last batch lost its trailing record to a later value of the same key; rebuilt from
    the cleaned log, the producer must still be at sequence 1, so its next batch (sequence 2) is taken
    and a retry of the last one is recognised as a duplicate."""
    lg = _compacted_log(tmp_path)
    ts = now_ms()
    first = lg.append_as_leader(make_batch(2, ts=ts, keys=[b"a", b"b"], producer_id=7, producer_epoch=0,
                                           base_sequence=0), 0).first_offset
    for i in range(20):  # later values of "b" (and more keys) by a producer without idempotence
        _put(lg, "b" if i == 0 else f"key-{i:02d}", f"v{i}".encode(), ts)
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.segments()[0].base_offset <= first < lg.segments()[-1].base_offset
    LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    assert _latest(lg)[b"b"][1] == b"v0"
    cfg = lg.config
    lg.close()
    (tmp_path / "c-0" / "producer-state-snapshot").unlink(missing_ok=True)  # as after kill -9
    lg = Log.open(tmp_path / "c-0", cfg)
    entry = lg.producer_state.entry(7)
    assert entry is not None and entry.last_seq == 1, f"rebuilt producer 7: {entry}"
    retry = lg.append_as_leader(make_batch(2, ts=ts, keys=[b"a", b"b"], producer_id=7, producer_epoch=0,
                                           base_sequence=0), 0)
    assert retry.first_offset == first, "a retry of the last batch was not recognised as a duplicate"
    nxt = lg.append_as_leader(make_batch(1, ts=ts, keys=[b"c"], producer_id=7, producer_epoch=0,
                                         base_sequence=2), 0)
    assert nxt.first_offset == lg.log_end_offset - 1
    lg.close()


def test_a_deleted_key_never_comes_back_from_a_producers_last_batch(tmp_path: Path) -> None:
    """An idempotent producer's last batch was kept whole, records later ones of their key replaced included: once
    a later tombstone of such a key was past delete.retention.ms and went, the value it deleted was read again.
    What is kept now is a batch of no records over the replaced ones, whose header still carries the producer's
    sequence (Kafka's empty batch)."""
    lg = _compacted_log(tmp_path, delete_retention_ms=0)
    ts = now_ms()
    first = lg.append_as_leader(make_batch(2, ts=ts, keys=[b"gone", b"also-gone"], producer_id=7, producer_epoch=0,
                                           base_sequence=0), 0).first_offset
    _put(lg, "gone", None, ts)  # deletes, by another writer
    _put(lg, "also-gone", None, ts)
    for i in range(12):
        _put(lg, f"key-{i:02d}", b"v", ts)
    lg.update_high_watermark(lg.log_end_offset)
    LogCleaner(lambda: {("c", 0): lg}).clean_log(lg, now_ms() + 60_000)
    latest = _latest(lg)
    assert b"gone" not in latest and b"also-gone" not in latest, latest
    [kept] = [h for _pos, h in iter_batches(read_all(lg)) if h.producer_id == 7]
    assert (kept.base_offset, kept.last_offset, kept.record_count, kept.base_sequence) == (first, first + 1, 0, 0)
    cfg = lg.config
    lg.close()
    (tmp_path / "c-0" / "producer-state-snapshot").unlink(missing_ok=True)  # as after kill -9
    lg = Log.open(tmp_path / "c-0", cfg)
    retry = lg.append_as_leader(make_batch(2, ts=ts, keys=[b"gone", b"also-gone"], producer_id=7, producer_epoch=0,
                                           base_sequence=0), 0)
    assert retry.first_offset == first, "a retry of the last batch was not recognised as a duplicate"
    assert b"gone" not in _latest(lg)
    lg.close()


def _compacted_log_with_a_corrupt_batch(tmp_path: Path) -> tuple[Log, Any, Any]:
    """A cleanable compacted log whose third segment's last batch fails its CRC (a value byte flipped); the
    log, that segment and the batch's header."""
    lg = _compacted_log(tmp_path, min_cleanable_dirty_ratio=0.01)
    ts = now_ms()
    for i in range(60):
        _put(lg, f"key-{i % 7:02d}", f"value-{i:04d}".encode(), ts)
    lg.update_high_watermark(lg.log_end_offset)
    seg = lg.segments()[2]
    h = flip_value_byte(seg.log_path, -1)
    return lg, seg, h


def test_a_corrupt_batch_stops_cleaning_and_leaves_the_log_uncleanable(tmp_path: Path) -> None:
    """A batch whose bytes changed on disk is never compacted: the pass stops before it, nothing is swapped
    in, and the log is not picked again (one ERROR, not one per backoff) until it is opened again. The broker
    is told (``on_corrupt``) and decides whether the log is cut there (broker/replica_manager.py). Before, the
    pass failed on the batch's CRC as a plain CORRUPT_MESSAGE: the broker was not told, and the log was picked,
    failed and logged again after every backoff."""
    lg, seg, h = _compacted_log_with_a_corrupt_batch(tmp_path)  # a value byte: its CRC no longer matches
    files_before = {p.name: p.read_bytes() for p in lg.dir.iterdir() if p.suffix == ".log"}
    told: list[tuple[Log, BaseException]] = []
    cleaner = LogCleaner(lambda: {("c", 0): lg}, backoff_ms=10)
    cleaner.on_corrupt = lambda log_, exc: told.append((log_, exc))
    with pytest.raises(CorruptBatchError) as caught:
        cleaner.clean_log(lg)
    assert caught.value.base_offset == h.base_offset and caught.value.next_offset == h.next_offset
    assert caught.value.filename == str(seg.log_path)
    assert {p.name: p.read_bytes() for p in lg.dir.iterdir() if p.suffix == ".log"} == files_before, \
        "a pass stopped by a corrupt batch changed the log"
    assert cleaner.uncleanable() == {("c", 0): h.base_offset}
    assert cleaner.grab_filthiest() is None, "an uncleanable log was picked again"
    # The background thread: told once, and the log is not picked again.
    cleaner.forget(("c", 0))
    cleaner.start()
    try:
        wait_for(lambda: told, 10.0, "the cleaner thread to report the corrupt batch", poll_s=0.01)
    finally:
        cleaner.shutdown()
    assert [(log_, type(exc)) for log_, exc in told] == [(lg, CorruptBatchError)], told
    # Opened again (a restart rescans it and cuts it at the batch): cleaned again.
    lg.close()
    reopened = Log.open(tmp_path / "c-0", lg.config)
    try:
        cleaner = LogCleaner(lambda: {("c", 0): reopened})
        assert cleaner.uncleanable() == {}
    finally:
        reopened.close()


def test_a_batch_header_that_does_not_fit_the_segment_is_corrupt_not_read(tmp_path: Path) -> None:
    """A length field flipped to gigabytes names the batch corrupt; the cleaner does not try to read it."""
    lg = _compacted_log(tmp_path)
    ts = now_ms()
    for i in range(30):
        _put(lg, f"key-{i % 3:02d}", b"v" * 10, ts)
    lg.update_high_watermark(lg.log_end_offset)
    seg = lg.segments()[1]
    pos, h = list(iter_batches(seg.log_path.read_bytes()))[1]
    with open(seg.log_path, "r+b") as f:
        f.seek(pos + 8)  # batch_length
        f.write((0x7FFFFFF0).to_bytes(4, "big"))
    with pytest.raises(CorruptBatchError) as caught:
        LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    assert caught.value.base_offset == h.base_offset and caught.value.next_offset is None
    lg.close()


def test_a_batch_cut_away_while_the_cleaner_read_it_is_no_corruption(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleaner reads segments without the log's lock. A follower's truncation that cuts a segment after the
    cleaner read it is no corruption, even when what was read fails its check (here: a batch corrupt on disk,
    cut away by the truncation): the pass stops (SegmentChangedError) and the log stays cleanable, the broker is not
    told. Before, the find was taken as it was read: the log was marked uncleanable and the broker told, which
    for a leader with in-sync followers means stopping it."""
    lg, seg, h = _compacted_log_with_a_corrupt_batch(tmp_path)
    cut: list[int] = []

    class CutAfterReading(Throttler):
        def account(self, n: int) -> None:
            super().account(n)
            if not cut and seg.size and n >= seg.size:  # the cleaner has read that segment whole
                cut.append(h.base_offset)
                lg.truncate_to(h.base_offset)
    monkeypatch.setattr(cleaner_module, "Throttler", CutAfterReading)
    cleaner = LogCleaner(lambda: {("c", 0): lg}, backoff_ms=10)
    told: list[BaseException] = []
    cleaner.on_corrupt = lambda _lg, exc: told.append(exc)
    with pytest.raises(SegmentChangedError):
        cleaner.clean_log(lg)
    assert cut == [h.base_offset], "the test's truncation did not happen during the pass"
    assert cleaner.uncleanable() == {}, "a batch cut away under the read left the log uncleanable"
    assert told == []
    lg.close()


def test_a_segment_of_more_keys_than_the_map_holds_is_cleaned_over_several_passes(tmp_path: Path) -> None:
    """The offset map filling in the middle of a segment ends the pass there and the next maps on from it, as
    Kafka's cleaner does. A pass mapped whole segments only: a segment of more distinct keys than the map holds
    was never cleaned, and the cleaner picked the log again at once, for good (audit: a core of CPU, other
    partitions' produce p99 from 5.8 to 31.5 ms)."""
    cfg = LogConfig(segment_bytes=1 << 20, cleanup_policy=("compact",), file_delete_delay_ms=0)
    lg = Log.open(tmp_path / "c-0", cfg)
    ts = now_ms()
    for round_ in range(2):
        for i in range(50):
            _put(lg, f"k{i:02d}", f"v{round_}".encode(), ts)
    lg.roll()
    _put(lg, "active", b"a", ts)
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(lambda: {("c", 0): lg}, max_map_entries=30)
    ends = []
    for _ in range(6):
        stats = cleaner.clean_log(lg)
        if stats.end_offset <= stats.first_dirty_offset:
            break
        ends.append(stats.end_offset)
    assert ends == [30, 60, 90, 100], ends  # each pass as far as 30 keys reach
    latest = _latest(lg)
    kept = [r.offset for r in decode_records(read_all(lg))]
    assert kept == list(range(50, 101)), kept  # one record a key: the second round, and the active segment's
    assert all(latest[f"k{i:02d}".encode()][1] == b"v1" for i in range(50))
    assert cleaner.dirty_ratio(lg) == 0.0
    lg.close()


def test_records_without_a_key_go_when_a_topic_becomes_compacted(tmp_path: Path) -> None:
    """Kafka's cleaner drops a record without a key (it counts it invalid): on a compacted topic one can only be
    there from before the topic was compacted. Brook's kept them for good."""
    lg = Log.open(tmp_path / "c-0", LogConfig(segment_bytes=1 << 20, file_delete_delay_ms=0))
    ts = now_ms()
    lg.append_as_leader(make_batch(3, ts=ts, keys=[None, b"k", None], values=[b"a", b"b", b"c"]), 0)
    lg.close()
    lg = Log.open(tmp_path / "c-0", LogConfig(segment_bytes=1 << 20, cleanup_policy=("compact",),
                                              file_delete_delay_ms=0))
    lg.roll()
    _put(lg, "k2", b"d", ts)
    lg.update_high_watermark(lg.log_end_offset)
    stats = LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    assert stats.keyless_dropped == 2
    assert [(r.offset, r.key) for r in decode_records(read_all(lg))] == [(1, b"k"), (3, b"k2")]
    lg.close()


def test_a_truncation_below_the_cleaner_checkpoint_lowers_it(tmp_path: Path) -> None:
    """A log cut below the cleaner's checkpoint (a follower's diverged tail replaced) has its checkpoint lowered
    to the cut, as Kafka's maybeTruncateCheckpoint does. It stayed above, so a tombstone written again below it
    was never matched against the value it deletes: it expired and the value came back (audit)."""
    from storage.log_manager import LogManager

    lm = LogManager([tmp_path], {"segment.bytes": "400", "cleanup.policy": "compact", "delete.retention.ms": "1000",
                                 "min.cleanable.dirty.ratio": "0.0", "file.delete.delay.ms": "0"}, cleaner_threads=0)
    lm.startup()
    try:
        lg = lm.get_or_create_log("trunc", 0, topic_id="T1", overrides={})
        ts = now_ms()
        _put(lg, "K", b"old-value", ts)
        for i in range(40):
            _put(lg, f"f{i % 5}", b"x" * 20, ts)
        lg.update_high_watermark(lg.log_end_offset)
        cleaner = lm.cleaner
        cleaner.clean_log(lg)
        assert cleaner.checkpoints()[("trunc", 0)] > 1
        lg.truncate_to(1)  # the new leader's history diverges after offset 0
        assert cleaner.checkpoints()[("trunc", 0)] == 1
        _put(lg, "K", None, ts)  # ... and deletes K at offset 1
        for i in range(60):
            _put(lg, f"g{i % 5}", b"y" * 20, ts)
        lg.update_high_watermark(lg.log_end_offset)
        for _ in range(3):
            cleaner.clean_log(lg, now_ms=now_ms() + 3_600_000)  # the tombstone is past delete.retention.ms
        assert [(r.offset, r.value) for r in decode_records(read_all(lg)) if r.key == b"K"] == []
    finally:
        lm.shutdown()


def test_a_compacted_log_rolls_by_max_compaction_lag(tmp_path: Path) -> None:
    """Kafka's maxSegmentMs: a compacted log's active segment rolls once max.compaction.lag.ms passed, so the
    cleaner (which never touches the active segment) can keep to the lag. It waited for segment.ms (7 days)."""
    lg = _compacted_log(tmp_path, max_compaction_lag_ms=5_000)
    start = now_ms()
    for i in range(5):
        _put(lg, "k", f"v{i}".encode(), start)
    lg.append_as_leader(make_batch(1, ts=start, keys=[b"k"], values=[b"v5"]), 0, now_ms=start + 7_000)
    assert [s.base_offset for s in lg.segments()] == [0, 5], [s.base_offset for s in lg.segments()]
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    assert cleaner.grab_filthiest(now_ms=start + 7_000) is lg  # overdue
    cleaner.clean_log(lg, now_ms=start + 7_000)
    assert [r.value for r in decode_records(read_all(lg))] == [b"v4", b"v5"]  # the active segment untouched
    lg.close()


def test_any_negative_retention_bytes_means_no_size_bound_as_in_kafka() -> None:
    """Kafka's retention.bytes has no validator and takes any negative value as "no bound"; -2 was refused
    (config audit). retention.ms keeps Kafka's rule (-1 or at least 0)."""
    from proto import errors as proto_errors
    from storage import log_config

    assert log_config.validate({"retention.bytes": "-2"}, strict=True) == {"retention.bytes": "-2"}
    assert LogConfig.from_overrides({"retention.bytes": "-2"}).retention_bytes == -2
    with pytest.raises(proto_errors.BrookError):
        log_config.validate({"retention.ms": "-2"}, strict=True)
