"""ListOffsets by timestamp (Log.offset_for_timestamp): the same answers as a brute force, reading little.

The answer (Kafka's FileRecords.searchForTimestamp): the first record, at or after the log start, whose
timestamp reaches the timestamp asked; its own offset and timestamp (not its batch's base offset and
largest timestamp: a found batch is decoded, decompressed if need be). Kafka starts the
walk at the time-index entry below the timestamp: a segment of old timestamps followed by one new batch
has one such entry, at its start, and every lookup between the two walked the whole segment (2.8 s per
100 MiB, per request entry; found by an audit). Offset- and time-index entries now go in pairs, so the
lookup starts at the last offset-index entry before the first time entry reaching the timestamp.

Answers are checked against a decode of every batch of every segment file; costs are counted in bytes
read from the segment files, never timed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import (
    CODEC_GZIP,
    CODEC_NONE,
    CODEC_ZSTD,
    TIMESTAMP_LOG_APPEND_TIME,
    RecordBatchBuilder,
    build_control_batch,
    decode_batch,
    iter_batches,
)
from storage.segment import LogSegment


def open_log(path: Path, **cfg: Any) -> Log:
    return Log.open(path / "t-0", LogConfig(**cfg))


def batch(base: int, timestamps: list[int], value_size: int = 20) -> bytes:
    b = RecordBatchBuilder(base_offset=base, partition_leader_epoch=0)
    for i, ts in enumerate(timestamps):
        b.append(ts, f"k{base + i}".encode(), b"v" * value_size)
    return b.build()


def append(lg: Log, *batches_timestamps: list[int]) -> int:
    """Batches (one per list of record timestamps) in one follower append at the log end; the first's base."""
    base = offset = lg.log_end_offset
    data = bytearray()
    for timestamps in batches_timestamps:
        data += batch(offset, timestamps)
        offset += len(timestamps)
    lg.append_as_follower(bytes(data))
    return base


def append_control(lg: Log, ts: int) -> None:
    lg.append_as_follower(build_control_batch(True, producer_id=7, producer_epoch=0, timestamp_ms=ts,
                                              partition_leader_epoch=0, base_offset=lg.log_end_offset))


def every_batch(lg: Log) -> list[tuple[int, int]]:
    """(offset, timestamp) of every record of every batch of every segment file, in log order, decoded."""
    out = []
    for seg in lg.segments():
        data = seg.log_path.read_bytes()[: seg.size]
        for pos, h in iter_batches(data):
            _h, records = decode_batch(data, pos)
            largest = max(r.timestamp for r in records)
            assert largest == h.max_timestamp or h.is_control, (h, largest)
            out.extend((r.offset, r.timestamp) for r in records)
    return out


def brute_force(records: list[tuple[int, int]], ts: int, start: int) -> tuple[int, int] | None:
    """Kafka: the first record at or after the log start whose timestamp reaches ``ts``; its offset and timestamp."""
    for offset, timestamp in records:
        if offset >= start and timestamp >= ts:
            return offset, timestamp
    return None


def check_all_timestamps(lg: Log, top: int) -> None:
    """Every timestamp from 0 to past ``top`` that could be answered differently from its neighbours: the
    lookup compares the timestamp with stored ones (records', indexes'), so its answer can change only
    around a stored timestamp t; t - 1, t and t + 1 are on each side of every comparison with t."""
    batches = every_batch(lg)
    start = lg.log_start_offset
    stored = {t for _offset, t in batches}
    for ts in sorted({0, 1, 2, top + 1, top + 2} | {u for t in stored for u in (t - 1, t, t + 1) if u >= 0}):
        assert lg.offset_for_timestamp(ts) == brute_force(batches, ts, start), f"timestamp {ts}, start {start}, {lg}"


@pytest.mark.parametrize("seed", range(16))
def test_random_logs_match_the_brute_force(tmp_path: Path, seed: int) -> None:
    """Random timestamps (runs of old ones, jumps, ties, -1 and 0), control batches, several batches an append,
    rolls (some because a tiny index is full), the log start moved inside a segment, truncation, a clean
    reopen and a recovery."""
    rng = random.Random(seed)
    cfg: dict[str, Any] = {"index_interval_bytes": rng.choice([0, 1, 120, 400, 4096]),
                           "segment_index_bytes": rng.choice([48, 120, 10 * 1024 * 1024]),
                           "segment_bytes": rng.choice([600, 2000, 1 << 30])}
    lg = open_log(tmp_path, **cfg)
    top = rng.choice([5, 50, 5000])
    level = [rng.randint(1, top)]

    def timestamp() -> int:
        r = rng.random()
        if r < 0.05:
            return rng.choice([-1, 0])
        if r < 0.15:
            level[0] = rng.randint(1, top)  # a jump, up or down; then a run near it
        return max(1, min(top, level[0] + rng.randint(-2, 2)))

    def grow(n: int) -> None:
        for _ in range(n):
            r = rng.random()
            if r < 0.06:
                lg.roll()
            elif r < 0.12:
                append_control(lg, rng.randint(1, top))
            else:
                append(lg, *[[timestamp() for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 5))])

    grow(rng.randint(30, 80))
    check_all_timestamps(lg, top)
    lg.update_high_watermark(lg.log_end_offset)
    for _ in range(3):
        lg.set_log_start_offset(rng.randint(lg.log_start_offset, lg.log_end_offset))
        check_all_timestamps(lg, top)
    lg.truncate_to(rng.randint(lg.log_start_offset, lg.log_end_offset))
    check_all_timestamps(lg, top)
    grow(rng.randint(5, 30))
    check_all_timestamps(lg, top)
    start = lg.log_start_offset
    lg.close()
    lg = Log.open(tmp_path / "t-0", LogConfig(**cfg), log_start_offset=start, clean_shutdown=True)
    check_all_timestamps(lg, top)
    grow(rng.randint(5, 20))
    check_all_timestamps(lg, top)
    lg.close_without_flush()  # a crash: the active segment is recovered (its indexes rebuilt)
    lg = Log.open(tmp_path / "t-0", LogConfig(**cfg), log_start_offset=start, recovery_point=start)
    check_all_timestamps(lg, top)
    grow(rng.randint(5, 20))
    check_all_timestamps(lg, top)
    lg.close()


def test_an_index_written_before_entries_went_in_pairs_is_not_trusted_past_its_last_time_entry(
        tmp_path: Path) -> None:
    """Index files from before: a time index full within one append skipped entries the offset index has.
    Reopened, such a segment (its time index full) is scanned from the last time entry below the timestamp
    when the first at or above it is its last; timestamp 60 would otherwise be answered 5 (batch of 50),
    not 4 (batch of 90)."""
    lg = open_log(tmp_path, index_interval_bytes=1, segment_index_bytes=48)  # time index full at 3 entries
    append(lg, *[[ts] for ts in [10, 20, 30, 40, 90, 50, 100]])
    seg = lg.active_segment
    assert seg.time_index.is_full() and seg.index.entries == seg.time_index.entries == 3
    for pos, h in seg.iter_headers(0):  # what the index had, written without its time entries
        if h.base_offset > 3:
            seg.index.append(h.base_offset, pos)
    lg.close()
    lg = Log.open(tmp_path / "t-0", LogConfig(index_interval_bytes=1, segment_index_bytes=48), clean_shutdown=True)
    seg = lg.active_segment
    assert seg.index.entries == 6 and seg.time_index.entries == 4  # the last: the segment's largest (100, 6)
    assert lg.offset_for_timestamp(60) == (4, 90)
    check_all_timestamps(lg, 110)
    lg.close()


# ------------------------------------------------------------------- records inside one batch
BASE_MS = 1_700_000_000_000


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP, CODEC_ZSTD])
def test_the_first_record_at_or_after_the_timestamp_inside_a_multi_record_batch(tmp_path: Path, codec: int) -> None:
    """Ten records in one (compressed) batch, stamped base+0 s .. base+9 s: base+3.5 s is answered by offset 4
    stamped base+4 s (Kafka), not by the batch's base offset 0 and largest timestamp base+9 s."""
    lg = open_log(tmp_path)
    b = RecordBatchBuilder(codec, partition_leader_epoch=0)
    for i in range(10):
        b.append(BASE_MS + 1000 * i, f"k{i}".encode(), b"v" * 100)
    lg.append_as_leader(b.build(), 0)
    append(lg, [BASE_MS + 20_000, BASE_MS + 21_000])  # a later batch, of two records
    assert lg.offset_for_timestamp(BASE_MS + 3500) == (4, BASE_MS + 4000)
    assert lg.offset_for_timestamp(BASE_MS) == (0, BASE_MS)
    assert lg.offset_for_timestamp(BASE_MS + 9000) == (9, BASE_MS + 9000)
    assert lg.offset_for_timestamp(BASE_MS + 9001) == (10, BASE_MS + 20_000)
    assert lg.offset_for_timestamp(BASE_MS + 20_500) == (11, BASE_MS + 21_000)
    assert lg.offset_for_timestamp(BASE_MS + 21_001) is None
    assert lg.offset_for_timestamp(-2) == (0, -1) and lg.offset_for_timestamp(-1) == (12, -1)
    # The log start inside the batch: the first record at or after it that reaches the timestamp.
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(6)
    assert lg.offset_for_timestamp(BASE_MS + 3500) == (6, BASE_MS + 6000)
    assert lg.offset_for_timestamp(BASE_MS + 7500) == (8, BASE_MS + 8000)
    check_all_timestamps_near(lg)
    lg.close()


def check_all_timestamps_near(lg: Log) -> None:
    records = every_batch(lg)
    for ts in range(BASE_MS - 1, BASE_MS + 22_001, 250):
        assert lg.offset_for_timestamp(ts) == brute_force(records, ts, lg.log_start_offset), ts


def test_out_of_order_records_inside_a_batch(tmp_path: Path) -> None:
    """Record timestamps need not rise inside a batch: the first record in offset order reaching the timestamp."""
    lg = open_log(tmp_path)
    append(lg, [BASE_MS + 5000, BASE_MS + 1000, BASE_MS + 9000, BASE_MS + 3000])
    assert lg.offset_for_timestamp(BASE_MS + 2000) == (0, BASE_MS + 5000)
    assert lg.offset_for_timestamp(BASE_MS + 6000) == (2, BASE_MS + 9000)
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(1)
    assert lg.offset_for_timestamp(BASE_MS + 2000) == (2, BASE_MS + 9000)
    lg.set_log_start_offset(3)  # the batch's records reaching the timestamp are all before the log start
    assert lg.offset_for_timestamp(BASE_MS + 4000) is None
    append(lg, [BASE_MS + 4500])
    assert lg.offset_for_timestamp(BASE_MS + 4000) == (4, BASE_MS + 4500)  # the walk goes on to the next batch
    lg.close()


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP])
def test_a_log_append_time_batch_answers_its_first_record_with_the_batch_timestamp(
        tmp_path: Path, codec: int) -> None:
    """LogAppendTime: every record carries the batch's timestamp (Kafka's record.timestamp()), so any timestamp
    up to it is answered by the batch's first record (at or after the log start), stamped with it."""
    lg = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    b = RecordBatchBuilder(codec, partition_leader_epoch=0)
    for i in range(10):
        b.append(BASE_MS + 1000 * i, f"k{i}".encode(), b"v")  # create times, replaced by the append time
    appended = BASE_MS + 50_000
    lg.append_as_leader(b.build(), 0, now_ms=appended)
    h = next(iter_batches(lg.segments()[0].log_path.read_bytes()))[1]
    assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME and h.max_timestamp == appended
    assert lg.offset_for_timestamp(BASE_MS + 3500) == (0, appended)
    assert lg.offset_for_timestamp(appended) == (0, appended)
    assert lg.offset_for_timestamp(appended + 1) is None
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(4)
    assert lg.offset_for_timestamp(BASE_MS + 3500) == (4, appended)
    lg.close()


def test_a_control_batch_is_answered_like_any_other(tmp_path: Path) -> None:
    """Kafka does not skip control batches: a transaction marker reaching the timestamp first is the answer."""
    lg = open_log(tmp_path)
    append(lg, [BASE_MS + 1000, BASE_MS + 2000])
    append_control(lg, BASE_MS + 3000)
    append(lg, [BASE_MS + 4000])
    assert lg.offset_for_timestamp(BASE_MS + 1500) == (1, BASE_MS + 2000)
    assert lg.offset_for_timestamp(BASE_MS + 2500) == (2, BASE_MS + 3000)
    assert lg.offset_for_timestamp(BASE_MS + 3500) == (3, BASE_MS + 4000)
    lg.close()


# ---------------------------------------------------------------------------------------- costs
def old_then_new(lg: Log, old_bytes: int, new_ts: int) -> int:
    """About ``old_bytes`` of one-record batches at timestamp 1000, then one at ``new_ts``; that one's offset."""
    per_append = 200
    while lg.active_segment.size < old_bytes:
        append(lg, *[[1000]] * per_append)
    return append(lg, [new_ts])


@pytest.mark.parametrize("new_batch", ["unindexed", "indexed", "rolled", "reopened"])
def test_a_timestamp_between_old_batches_and_a_new_one_reads_one_index_interval(
        tmp_path: Path, preads: Callable[[LogSegment], int], new_batch: str) -> None:
    interval = 4096
    cfg = LogConfig(index_interval_bytes=interval)
    lg = open_log(tmp_path, index_interval_bytes=interval)
    new = old_then_new(lg, 2 << 20, 50_000)
    seg = lg.active_segment
    if new_batch == "indexed":  # the new batch is not the last: a later batch gets the index entry after it
        while seg.index.last_entry().offset <= new:
            append(lg, [40_000])
    elif new_batch == "rolled":  # the closed segment's last time entry: its largest timestamp
        lg.roll()
    elif new_batch == "reopened":
        lg.close()
        lg = Log.open(tmp_path / "t-0", cfg, clean_shutdown=True)
        seg = lg.segments()[0]
    assert seg.size > 2 << 20 and seg.time_index.entries <= 3
    preads(seg)
    for ts in (1001, 2000, 49_999, 50_000):
        assert lg.offset_for_timestamp(ts) == (new, 50_000), ts
        read = preads(seg)
        # From the last offset-index entry before the new batch: about one interval, in one or two reads of
        # (at least) 16 KiB. The walk from the segment start read all 2 MiB.
        assert read <= 4 * max(2 * interval, 16 * 1024), f"timestamp {ts}: {read} bytes read"
    assert lg.offset_for_timestamp(1000) == (0, 1000)
    lg.close()


def test_many_lookups_of_one_segment_each_read_one_interval(
        tmp_path: Path, preads: Callable[[LogSegment], int]) -> None:
    """Timestamps rising over the segment (the usual log): each lookup is a binary search and one interval."""
    lg = open_log(tmp_path, index_interval_bytes=4096)
    for i in range(100):
        append(lg, *[[10 * (200 * i + j) + 1] for j in range(200)])
    seg = lg.active_segment
    batches = every_batch(lg)
    preads(seg)
    rng = random.Random(3)
    for ts in [rng.randint(0, 200_001) for _ in range(200)]:
        assert lg.offset_for_timestamp(ts) == brute_force(batches, ts, 0)
        assert preads(seg) <= 2 * 16 * 1024, ts
    lg.close()
