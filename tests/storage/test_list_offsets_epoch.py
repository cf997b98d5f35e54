"""ListOffsets' leader epoch from the log (Log.lookup_timestamp), as Kafka's UnifiedLog.fetchOffsetByTimestamp.

A timestamp answers the partition leader epoch stored in the header of the batch holding the record found
(FileRecords.searchForTimestamp), not the partition's current epoch: a KIP-320 client seeking there checks
its position with OffsetsForLeaderEpoch for that epoch, and with a later epoch it could miss a truncation
(or be told the wrong end offset). EARLIEST answers the epoch of the leader epoch cache's first entry when
it starts at or below the log start; LATEST the cache's latest epoch. Answers are checked against a decode
of every batch of every segment file.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log
from storage.log_config import LogConfig
from storage.record_batch import CODEC_NONE, CODEC_ZSTD, RecordBatchBuilder, decode_batch, iter_batches


def open_log(path: Path, **cfg: Any) -> Log:
    return Log.open(path / "t-0", LogConfig(**cfg))


def batch(base: int, epoch: int, timestamps: list[int], codec: int = CODEC_NONE) -> bytes:
    b = RecordBatchBuilder(codec, base_offset=base, partition_leader_epoch=epoch)
    for i, ts in enumerate(timestamps):
        b.append(ts, f"k{base + i}".encode(), b"v" * 30)
    return b.build()


def append(lg: Log, epoch: int, timestamps: list[int], codec: int = CODEC_NONE) -> int:
    """One batch written by the leader of ``epoch``, as a follower copies it (its epoch kept); its base."""
    base = lg.log_end_offset
    lg.append_as_follower(batch(base, epoch, timestamps, codec))
    return base


def every_record(lg: Log) -> list[tuple[int, int, int]]:
    """(offset, timestamp, batch leader epoch) of every record of every segment file, in log order."""
    out = []
    for seg in lg.segments():
        data = seg.log_path.read_bytes()[: seg.size]
        for pos, _h in iter_batches(data):
            header, records = decode_batch(data, pos)
            out.extend((r.offset, r.timestamp, header.partition_leader_epoch) for r in records)
    return out


def brute_force(records: list[tuple[int, int, int]], ts: int, start: int) -> tuple[int, int, int] | None:
    for offset, timestamp, epoch in records:
        if offset >= start and timestamp >= ts:
            return offset, timestamp, epoch
    return None


def check_all(lg: Log, top: int) -> None:
    records = every_record(lg)
    start = lg.log_start_offset
    for ts in range(0, top + 2):
        found = lg.lookup_timestamp(ts)
        assert (None if found is None else tuple(found)) == brute_force(records, ts, start), f"timestamp {ts}"


def test_a_timestamp_answers_the_epoch_of_the_batch_holding_the_record(tmp_path: Path) -> None:
    """Three leaders wrote the log (epochs 0, 3, 7): a timestamp in the first one's batches answers 0, in the
    second's 3, and so on, whatever the current epoch (7). The old answer was the current epoch for all."""
    lg = open_log(tmp_path)
    append(lg, 0, [1000, 1001])
    append(lg, 0, [1002])
    second = append(lg, 3, [2000, 2001], CODEC_ZSTD)  # a compressed batch: the record is decoded from it
    third = append(lg, 7, [3000])
    assert lg.lookup_timestamp(1001) == (1, 1001, 0)
    assert lg.lookup_timestamp(1002) == (2, 1002, 0)
    assert lg.lookup_timestamp(1500) == (second, 2000, 3)
    assert lg.lookup_timestamp(2001) == (second + 1, 2001, 3)
    assert lg.lookup_timestamp(2500) == (third, 3000, 7)
    assert lg.lookup_timestamp(3001) is None
    assert lg.offset_for_timestamp(2001) == (second + 1, 2001)  # the pair, as before
    # The sentinels: EARLIEST the epoch of the log start, LATEST the latest epoch.
    assert lg.lookup_timestamp(EARLIEST_TIMESTAMP) == (0, -1, 0)
    assert lg.lookup_timestamp(LATEST_TIMESTAMP) == (third + 1, -1, 7)
    lg.close()


def test_earliest_answers_the_epoch_of_the_log_start(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    append(lg, 2, [10, 11])
    later = append(lg, 5, [20, 21])
    append(lg, 9, [30])
    assert lg.lookup_timestamp(EARLIEST_TIMESTAMP) == (0, -1, 2)
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(later + 1)  # DeleteRecords into epoch 5's batch
    assert lg.lookup_timestamp(EARLIEST_TIMESTAMP) == (later + 1, -1, 5)
    assert lg.lookup_timestamp(0) == (later + 1, 21, 5)  # the first record at or after the log start
    lg.truncate_fully_and_start_at(100)  # an empty log: no epoch known
    assert lg.lookup_timestamp(EARLIEST_TIMESTAMP) == (100, -1, -1)
    assert lg.lookup_timestamp(LATEST_TIMESTAMP) == (100, -1, -1)
    lg.close()


def test_a_leader_append_stamps_the_epoch_it_answers(tmp_path: Path) -> None:
    """append_as_leader writes its epoch into the batch header: that is what a later lookup answers."""
    lg = open_log(tmp_path)
    lg.append_as_leader(batch(0, -1, [100, 101]), leader_epoch=4)
    lg.append_as_leader(batch(0, -1, [200]), leader_epoch=6)
    assert lg.lookup_timestamp(101) == (1, 101, 4)
    assert lg.lookup_timestamp(150) == (2, 200, 6)
    assert lg.lookup_timestamp(EARLIEST_TIMESTAMP) == (0, -1, 4)
    lg.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_logs_match_the_brute_force(tmp_path: Path, seed: int) -> None:
    """Random timestamps and epoch changes over rolls (some because a tiny index is full), the log start moved
    inside a segment, a truncation and a reopen: every answer's epoch is its batch's."""
    rng = random.Random(seed)
    cfg: dict[str, Any] = {"index_interval_bytes": rng.choice([0, 120, 4096]),
                           "segment_index_bytes": rng.choice([48, 10 * 1024 * 1024]),
                           "segment_bytes": rng.choice([700, 3000, 1 << 30])}
    lg = open_log(tmp_path, **cfg)
    top = rng.choice([40, 400])
    epoch = 0

    def grow(n: int) -> None:
        nonlocal epoch
        for _ in range(n):
            if rng.random() < 0.2:
                epoch += rng.randint(1, 3)
            if rng.random() < 0.08:
                lg.roll()
            append(lg, epoch, [rng.randint(0, top) for _ in range(rng.randint(1, 4))],
                   rng.choice([CODEC_NONE, CODEC_NONE, CODEC_ZSTD]))

    grow(rng.randint(20, 50))
    check_all(lg, top)
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(rng.randint(0, lg.log_end_offset))
    check_all(lg, top)
    lg.truncate_to(rng.randint(lg.log_start_offset, lg.log_end_offset))
    epoch += 1
    grow(rng.randint(5, 20))
    check_all(lg, top)
    start = lg.log_start_offset
    lg.close()
    lg = Log.open(tmp_path / "t-0", LogConfig(**cfg), log_start_offset=start, clean_shutdown=True)
    check_all(lg, top)
    lg.close()
