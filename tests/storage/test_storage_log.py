"""Partition Log: append/read, bad input, rolling, indexes, timestamps, truncation, followers, producers."""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pytest
from storage_testlib import batch_bases, make_batch, now_ms, offsets_of, read_all

from proto import errors
from storage.file_records import FileRecords
from storage.log import Log, UnexpectedAppendOffsetError, WouldBlock
from storage.log_config import LogConfig
from storage.record_batch import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_ZSTD,
    TIMESTAMP_LOG_APPEND_TIME,
    decode_records,
    iter_batches,
    read_header,
)


def open_log(tmp_path: Path, **cfg) -> Log:
    return Log.open(tmp_path / "t-0", LogConfig(**cfg))


def test_append_assigns_offsets_and_reads_back(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    infos = [lg.append_as_leader(make_batch(3), leader_epoch=4) for _ in range(5)]
    assert [(i.first_offset, i.last_offset) for i in infos] == [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14)]
    assert lg.log_end_offset == 15 and lg.log_start_offset == 0
    data = lg.read(0, 1 << 20).records
    assert offsets_of(data) == list(range(15))
    assert {h.partition_leader_epoch for _p, h in iter_batches(data)} == {4}
    # start in the middle of a batch: the whole batch comes back
    got = lg.read(4, 1 << 20)
    assert got.first_offset == 3 and batch_bases(got.records)[0] == 3
    lg.close()


def test_read_bounds_and_out_of_range(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    for _ in range(4):
        lg.append_as_leader(make_batch(2), 0)
    assert batch_bases(lg.read(0, 1 << 20, max_offset=4).records) == [0, 2]
    assert lg.read(4, 1 << 20, max_offset=4).records == b""
    assert lg.read(8, 1 << 20).records == b""  # at the log end: empty, not an error
    with pytest.raises(errors.OffsetOutOfRangeError):
        lg.read(9, 100)
    with pytest.raises(errors.OffsetOutOfRangeError):
        lg.read(-1, 100)
    one = lg.read(0, 10)  # max_bytes below one batch: still one whole batch
    assert batch_bases(one.records) == [0]
    assert lg.read(0, 10, min_one_batch=False).records == b""
    size = len(make_batch(2))
    assert batch_bases(lg.read(0, size * 2 + 5).records) == [0, 2]  # whole batches only
    lg.close()


@pytest.mark.parametrize("kind", ["crc", "magic", "length", "count", "truncated", "too_large", "trailing"])
def test_bad_input_refused_and_nothing_appended(tmp_path: Path, kind: str) -> None:
    lg = open_log(tmp_path, max_message_bytes=2000)
    lg.append_as_leader(make_batch(2), 0)
    good = make_batch(2)
    bad = bytearray(good)
    expected: type[errors.BrookError] = errors.CorruptMessageError
    if kind == "crc":
        bad[-1] ^= 0xFF
    elif kind == "magic":
        bad[16] = 1
    elif kind == "length":
        struct.pack_into(">i", bad, 8, len(bad) - 12 + 40)
    elif kind == "count":
        struct.pack_into(">i", bad, 57, 7)
    elif kind == "truncated":
        bad = bad[:-5]
    elif kind == "too_large":
        bad = bytearray(make_batch(1, value_size=3000))
        expected = errors.MessageTooLargeError
    elif kind == "trailing":
        bad = bytearray(good) + b"\x00" * 20
    before = (lg.log_end_offset, lg.size_bytes)
    # a good batch first: the call is all-or-nothing
    with pytest.raises(expected):
        lg.append_as_leader(good + bytes(bad), 0)
    assert (lg.log_end_offset, lg.size_bytes) == before
    assert lg.append_as_leader(good, 0).first_offset == 2
    lg.close()


def test_empty_append_refused(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    with pytest.raises(errors.CorruptMessageError):
        lg.append_as_leader(b"", 0)
    assert lg.log_end_offset == 0
    lg.close()


def test_roll_by_size_and_index_entries(tmp_path: Path) -> None:
    size = len(make_batch(3))
    lg = open_log(tmp_path, segment_bytes=size * 4, index_interval_bytes=size)
    for _ in range(10):
        lg.append_as_leader(make_batch(3), 0)
    segs = lg.segments()
    assert [s.base_offset for s in segs] == [0, 12, 24]
    assert all(s.size <= size * 4 for s in segs)
    names = sorted(p.name for p in (tmp_path / "t-0").iterdir() if p.suffix == ".log")
    assert names == ["00000000000000000000.log", "00000000000000000012.log", "00000000000000000024.log"]
    first = segs[0]
    assert first.index.entries >= 1 and first.index.lookup(7).offset <= 7
    # every offset is readable through the indexes
    for off in range(30):
        got = lg.read(off, 1)
        assert got.first_offset <= off < got.first_offset + 3, (off, got.first_offset)
    lg.close()


def test_roll_by_time(tmp_path: Path) -> None:
    lg = open_log(tmp_path, segment_ms=1000)
    t0 = now_ms()
    lg.append_as_leader(make_batch(1, ts=t0), 0, now_ms=t0)
    lg.append_as_leader(make_batch(1, ts=t0), 0, now_ms=t0 + 500)
    assert len(lg.segments()) == 1
    lg.append_as_leader(make_batch(1, ts=t0), 0, now_ms=t0 + 1500)
    assert [s.base_offset for s in lg.segments()] == [0, 2]
    lg.close()


def test_segment_jitter_rolls_each_segment_up_to_that_much_early(tmp_path: Path, monkeypatch) -> None:
    import storage.log as storage_log

    draws: list[int] = []
    picks = iter([300, 700, 0])

    def fake_randrange(bound: int) -> int:
        draws.append(bound)
        return next(picks)
    monkeypatch.setattr(storage_log._jitter_random, "randrange", fake_randrange)
    lg = open_log(tmp_path, segment_ms=1000, segment_jitter_ms=5000)
    assert draws == [1000], "the jitter is drawn below min(segment.jitter.ms, segment.ms)"
    t0 = now_ms()
    lg.append_as_leader(make_batch(1, ts=t0), 0, now_ms=t0)
    lg.append_as_leader(make_batch(1, ts=t0), 0, now_ms=t0 + 650)  # 650 <= 1000 - 300: same segment
    assert [s.base_offset for s in lg.segments()] == [0]
    lg.append_as_leader(make_batch(1, ts=t0 + 750), 0, now_ms=t0 + 750)  # 750 > 700: rolled early
    assert [s.base_offset for s in lg.segments()] == [0, 2]
    assert draws == [1000, 1000], "each new segment draws its own jitter"
    lg.append_as_leader(make_batch(1, ts=t0 + 750), 0, now_ms=t0 + 750 + 301)  # 301 > 1000 - 700
    assert [s.base_offset for s in lg.segments()] == [0, 2, 3]
    lg.close()


def test_roll_when_index_full(tmp_path: Path) -> None:
    lg = open_log(tmp_path, segment_index_bytes=8 * 4, index_interval_bytes=0)
    for _ in range(12):
        lg.append_as_leader(make_batch(1), 0)
    assert len(lg.segments()) > 2
    assert all(s.index.entries <= 4 for s in lg.segments())
    assert offsets_of(read_all(lg)) == list(range(12))
    lg.close()


def test_offset_for_timestamp(tmp_path: Path) -> None:
    size = len(make_batch(2))
    lg = open_log(tmp_path, segment_bytes=size * 3, index_interval_bytes=1)
    base = now_ms() - 100_000
    for i in range(10):
        lg.append_as_leader(make_batch(2, ts=base + i * 1000), 0)  # batch i: ts base+1000i, +1
    # The first record at or after the timestamp, with its own timestamp (Kafka), not its batch's base and max.
    assert lg.offset_for_timestamp(base) == (0, base)
    assert lg.offset_for_timestamp(base + 1) == (1, base + 1)
    assert lg.offset_for_timestamp(base + 4500) == (10, base + 5000)
    assert lg.offset_for_timestamp(base + 9001) == (19, base + 9001)
    assert lg.offset_for_timestamp(base + 9002) is None
    assert lg.offset_for_timestamp(-2) == (0, -1)
    assert lg.offset_for_timestamp(-1) == (20, -1)
    lg.close()
    lg = Log.open(tmp_path / "t-0", lg.config, clean_shutdown=True)  # from the persisted time indexes
    assert lg.offset_for_timestamp(base + 4500) == (10, base + 5000)
    assert lg.offset_for_timestamp(base + 4001) == (9, base + 4001)
    lg.close()


def test_log_append_time(tmp_path: Path) -> None:
    lg = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    info = lg.append_as_leader(make_batch(2, ts=5), 0, now_ms=1_700_000_000_000)
    assert info.log_append_time_ms == 1_700_000_000_000 and info.max_timestamp == 1_700_000_000_000
    h = read_header(lg.read(0, 1000).records)
    assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME and h.max_timestamp == 1_700_000_000_000
    lg.close()


def test_truncation_and_epoch_cache(tmp_path: Path) -> None:
    size = len(make_batch(2))
    lg = open_log(tmp_path, segment_bytes=size * 2)
    for epoch in (1, 1, 2, 2, 3, 3):
        lg.append_as_leader(make_batch(2), epoch)
    assert [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()] == [(1, 0), (2, 4), (3, 8)]
    assert lg.end_offset_for_epoch(1) == (1, 4)
    assert lg.end_offset_for_epoch(2) == (2, 8)
    assert lg.end_offset_for_epoch(3) == (3, 12)
    assert lg.end_offset_for_epoch(0) == (0, 0)
    assert lg.end_offset_for_epoch(4) == (-1, -1)
    lg.update_high_watermark(100)
    assert lg.high_watermark == 12
    lg.truncate_to(6)
    assert lg.log_end_offset == 6 and lg.high_watermark == 6
    assert [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()] == [(1, 0), (2, 4)]
    assert offsets_of(read_all(lg)) == list(range(6))
    with pytest.raises(errors.OffsetOutOfRangeError):
        lg.read(7, 100)
    lg.append_as_leader(make_batch(2), 5)
    assert lg.end_offset_for_epoch(2) == (2, 6) and lg.latest_epoch == 5
    # the truncation is durable: the checkpoint file and the log agree after a reopen
    lg.close()
    lg = Log.open(tmp_path / "t-0", lg.config)
    assert lg.log_end_offset == 8
    assert [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()] == [(1, 0), (2, 4), (5, 6)]
    lg.truncate_fully_and_start_at(50)
    assert (lg.log_start_offset, lg.log_end_offset, lg.latest_epoch) == (50, 50, -1)
    assert lg.append_as_leader(make_batch(1), 6).first_offset == 50
    lg.close()


def test_follower_append_rules(tmp_path: Path) -> None:
    leader = Log.open(tmp_path / "a-0", LogConfig())
    follower = Log.open(tmp_path / "b-0", LogConfig())
    leader.append_as_leader(make_batch(2), 3)
    leader.append_as_leader(make_batch(2), 4)
    data = leader.read(0, 1 << 20).records
    info = follower.append_as_follower(data)
    assert (info.first_offset, info.last_offset) == (0, 3)
    assert follower.read(0, 1 << 20).records == data  # byte-identical replica
    assert [(e.epoch, e.start_offset) for e in follower.epoch_cache.entries()] == [(3, 0), (4, 2)]
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(data)  # offsets 0.. again: not at the log end
    with pytest.raises(errors.CorruptMessageError):
        follower.append_as_follower(data[:-3])
    assert follower.log_end_offset == 4
    # a compacted leader may skip offsets: a gap after the log end is accepted, offsets kept
    gap = make_batch(2, base_offset=10, epoch=4)
    assert follower.append_as_follower(gap).first_offset == 10 and follower.log_end_offset == 12
    assert follower.read(5, 1000).first_offset == 10
    overlapping = make_batch(1, base_offset=20, epoch=4) + make_batch(1, base_offset=20, epoch=4)
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(overlapping)  # second batch overlaps the first
    assert follower.log_end_offset == 12
    leader.close()
    follower.close()


def test_a_non_blocking_follower_append_refuses_what_would_wait_and_changes_nothing(tmp_path: Path) -> None:
    # The follower's fetcher appends on the broker's event loop only what cannot hold it.
    follower = Log.open(tmp_path / "b-0", LogConfig(flush_messages=5))
    info = follower.append_as_follower(make_batch(2, base_offset=0, epoch=1), blocking=False)
    assert (info.first_offset, follower.log_end_offset) == (0, 2), "a plain append goes through"
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with follower.locked():
            held.set()
            release.wait(10)
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(10)
        with pytest.raises(WouldBlock):
            follower.append_as_follower(make_batch(1, base_offset=2, epoch=1), blocking=False)
        with pytest.raises(WouldBlock):
            with follower.locked(blocking=False):
                pass
    finally:
        release.set()
        holder.join()
    assert follower.log_end_offset == 2, "refused while another thread held the lock: nothing appended"
    with pytest.raises(WouldBlock):  # 2 + 3 records reach flush.messages: the flush is blocking work
        follower.append_as_follower(make_batch(3, base_offset=2, epoch=1), blocking=False)
    assert follower.log_end_offset == 2 and follower.recovery_point == 0
    follower.append_as_follower(make_batch(3, base_offset=2, epoch=1))
    assert follower.log_end_offset == 5 and follower.recovery_point == 5, "the blocking append flushed"
    with follower.locked(blocking=False):  # re-entrant: what the fetcher holds around its append
        follower.append_as_follower(make_batch(1, base_offset=5, epoch=1), blocking=False)
    assert follower.log_end_offset == 6
    follower.close()


def test_producer_state_duplicates_gaps_and_fencing(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    first = lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=0), 0)
    lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=3), 0)
    dup = lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=0), 0)
    assert dup.duplicate and (dup.first_offset, dup.last_offset) == (first.first_offset, first.last_offset)
    assert lg.log_end_offset == 6
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=10), 0)
    bumped = lg.append_as_leader(make_batch(1, producer_id=7, producer_epoch=1, base_sequence=0), 0)
    assert bumped.first_offset == 6
    with pytest.raises(errors.InvalidProducerEpochError):
        lg.append_as_leader(make_batch(1, producer_id=7, producer_epoch=0, base_sequence=6), 0)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        lg.append_as_leader(make_batch(1, producer_id=7, producer_epoch=2, base_sequence=5), 0)
    assert lg.log_end_offset == 7
    # the state survives a clean close (snapshot) and a crash (rebuilt from batch headers)
    for crash in (False, True):
        if crash:
            lg.close_without_flush()
            assert not (tmp_path / "t-0" / "producer-state-snapshot").exists()
        else:
            lg.close()
            assert (tmp_path / "t-0" / "producer-state-snapshot").exists()
        lg = Log.open(tmp_path / "t-0", lg.config)
        again = lg.append_as_leader(make_batch(1, producer_id=7, producer_epoch=1, base_sequence=0), 0)
        assert again.duplicate and again.first_offset == 6
        with pytest.raises(errors.OutOfOrderSequenceNumberError):
            lg.append_as_leader(make_batch(1, producer_id=7, producer_epoch=1, base_sequence=2), 0)
        with pytest.raises(errors.InvalidProducerEpochError):
            lg.append_as_leader(make_batch(1, producer_id=7, producer_epoch=0, base_sequence=6), 0)
    lg.close()


def test_flush_policy_moves_recovery_point(tmp_path: Path) -> None:
    lg = open_log(tmp_path, flush_messages=4)
    lg.append_as_leader(make_batch(3), 0)
    assert lg.recovery_point == 0
    lg.append_as_leader(make_batch(3), 0)
    assert lg.recovery_point == 6
    lg.close()
    lg = open_log(tmp_path, flush_ms=1000)
    t0 = now_ms()
    lg.append_as_leader(make_batch(1), 0, now_ms=t0)
    assert not lg.maybe_flush(now_ms=t0 - 1000 + 10)  # flush.ms not yet passed
    assert lg.maybe_flush(now_ms=t0 + 5000) and lg.recovery_point == lg.log_end_offset
    lg.close()


def test_reopen_after_clean_close_keeps_everything(tmp_path: Path) -> None:
    size = len(make_batch(4))
    lg = open_log(tmp_path, segment_bytes=size * 3, index_interval_bytes=size)
    for _ in range(10):
        lg.append_as_leader(make_batch(4), 2)
    before = read_all(lg)
    lg.close()
    lg2 = Log.open(tmp_path / "t-0", lg.config, clean_shutdown=True)
    assert lg2.log_end_offset == 40 and read_all(lg2) == before
    assert lg2.append_as_leader(make_batch(1), 2).first_offset == 40
    lg2.close()


def test_missing_index_rebuilt(tmp_path: Path) -> None:
    size = len(make_batch(2))
    lg = open_log(tmp_path, segment_bytes=size * 3, index_interval_bytes=1)
    for _ in range(9):
        lg.append_as_leader(make_batch(2), 0)
    before = read_all(lg)
    lg.close()
    (tmp_path / "t-0" / "00000000000000000000.index").unlink()
    (tmp_path / "t-0" / "00000000000000000006.timeindex").write_bytes(b"\x01" * 7)
    lg = Log.open(tmp_path / "t-0", lg.config, clean_shutdown=True)
    assert read_all(lg) == before
    assert lg.segments()[0].index.entries == 2
    assert lg.read(4, 1).first_offset == 4
    lg.close()


def test_damaged_index_entry_does_not_misdirect_reads(tmp_path: Path, caplog) -> None:
    size = len(make_batch(2))
    lg = open_log(tmp_path, segment_bytes=size * 5, index_interval_bytes=1)
    t0 = now_ms()
    for i in range(12):  # growing timestamps: the time index does not lead to the damaged entry
        lg.append_as_leader(make_batch(2, ts=t0 + 10 * i), 0)
    before = read_all(lg)
    lg.close()
    index = tmp_path / "t-0" / "00000000000000000000.index"
    raw = bytearray(index.read_bytes())
    struct.pack_into(">I", raw, 12, size * 2 + 7)  # 2nd entry: a position inside a batch (still ordered)
    index.write_bytes(bytes(raw))
    lg = Log.open(tmp_path / "t-0", lg.config, clean_shutdown=True)
    with caplog.at_level("WARNING"):
        assert read_all(lg) == before
        assert lg.read(5, 1).first_offset == 4
    assert any("does not point at its batch" in r.getMessage() for r in caplog.records)
    lg.close()


def test_iter_batches_from_spans_segments(tmp_path: Path) -> None:
    size = len(make_batch(2))
    lg = open_log(tmp_path, segment_bytes=size * 2)
    for _ in range(7):
        lg.append_as_leader(make_batch(2), 0)
    assert offsets_of(b"".join(lg.iter_batches_from(0))) == list(range(14))
    assert offsets_of(b"".join(lg.iter_batches_from(5, max_offset=10))) == list(range(4, 10))
    lg.close()


def test_lost_epoch_checkpoint_rebuilt_from_headers(tmp_path: Path) -> None:
    lg = open_log(tmp_path)
    for epoch in (1, 1, 3, 4):
        lg.append_as_leader(make_batch(2), epoch)
    lg.close()
    (tmp_path / "t-0" / "leader-epoch-checkpoint").unlink()
    lg = Log.open(tmp_path / "t-0", lg.config, clean_shutdown=True)
    assert [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()] == [(1, 0), (3, 4), (4, 6)]
    assert lg.end_offset_for_epoch(3) == (3, 6)
    lg.close()


@pytest.mark.parametrize("topic_codec,expected", [("producer", CODEC_GZIP), ("zstd", CODEC_ZSTD),
                                                  ("none", CODEC_NONE)])
def test_compression_type_recompresses(tmp_path: Path, topic_codec: str, expected: int) -> None:
    lg = open_log(tmp_path, compression_type=topic_codec)
    sent = make_batch(5, compression=CODEC_GZIP, producer_id=3, producer_epoch=0, base_sequence=0)
    info = lg.append_as_leader(sent, 2)
    assert (info.first_offset, info.last_offset) == (0, 4)
    stored = lg.read(0, 1 << 20).records
    h = read_header(stored)
    assert h.compression == expected and (h.producer_id, h.base_sequence, h.record_count) == (3, 0, 5)
    assert [(r.key, r.value, r.timestamp) for r in decode_records(stored)] == \
        [(r.key, r.value, r.timestamp) for r in decode_records(sent)]
    lg.close()


def test_kafkas_uncompressed_compression_type_stores_batches_uncompressed(tmp_path: Path) -> None:
    # Kafka's name for a topic stored without compression; it was refused as INVALID_CONFIG (audit).
    config = LogConfig.from_overrides({"compression.type": "uncompressed"})
    assert config.compression_type == "none"
    lg = Log.open(tmp_path / "t-0", config)
    lg.append_as_leader(make_batch(5, compression=CODEC_GZIP), 2)
    assert read_header(lg.read(0, 1 << 20).records).compression == CODEC_NONE
    lg.close()


@pytest.mark.parametrize("codec_name,codec,levels", [("zstd", CODEC_ZSTD, (1, 19)), ("gzip", CODEC_GZIP, (1, 9)),
                                                     ("lz4", CODEC_LZ4, (9, 16))])
def test_recompression_uses_the_topics_compression_level(tmp_path: Path, codec_name: str, codec: int,
                                                          levels: tuple[int, int]) -> None:
    """KIP-390: compression.<codec>.level is the level the broker compresses at: the stored records section
    is exactly what the codec writes at that level (and the two levels write different bytes here)."""
    from storage.compression import compress
    from storage.record_batch import BATCH_HEADER_SIZE, RecordBatchBuilder, decode_batch

    values = [b"%06d " % i * 40 for i in range(50)]
    sent = make_batch(50, values=values, producer_id=3, producer_epoch=0, base_sequence=0)
    plain = RecordBatchBuilder()
    for r in decode_records(sent):
        plain.append(r.timestamp, r.key, r.value, r.headers)
    section = plain.build()[BATCH_HEADER_SIZE:]  # the uncompressed records section
    written = []
    for i, level in enumerate(levels):
        lg = open_log(tmp_path / str(i), compression_type=codec_name, **{f"compression_{codec_name}_level": level})
        lg.append_as_leader(sent, 2)
        stored = lg.read(0, 1 << 20).records
        h, records = decode_batch(stored)
        assert h.compression == codec and [r.value for r in records] == values
        assert bytes(stored[BATCH_HEADER_SIZE:]) == compress(codec, section, level), f"not level {level}"
        written.append(bytes(stored))
        lg.close()
    assert written[0] != written[1], "both levels wrote the same bytes: the test shows nothing"


def test_compression_levels_out_of_range_are_refused() -> None:
    from storage.log_config import LogConfig, parse_value

    for key, bad in (("compression.gzip.level", "0"), ("compression.gzip.level", "10"),
                     ("compression.lz4.level", "18"), ("compression.zstd.level", "23"),
                     ("compression.zstd.level", "-131073")):
        with pytest.raises(errors.InvalidConfigError, match=key):
            parse_value(key, bad)
    assert parse_value("compression.gzip.level", "-1") == -1 and parse_value("compression.zstd.level", "-5") == -5
    c = LogConfig.from_overrides({"compression.zstd.level": "7"}, {"compression.gzip.level": "2"})
    assert (c.compression_zstd_level, c.compression_gzip_level, c.compression_lz4_level) == (7, 2, 9)


def count_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every os.pread the segments make, by size (reads are preads; the page cache is the only cache)."""
    import storage.segment as segment

    sizes: list[int] = []
    real = segment.os.pread

    class CountingOs:
        def __getattr__(self, name: str):  # everything else is the real os module
            return getattr(os, name)

        @staticmethod
        def pread(fd: int, n: int, offset: int) -> bytes:
            sizes.append(n)
            return real(fd, n, offset)
    monkeypatch.setattr(segment, "os", CountingOs())
    return sizes


def test_finding_an_offset_between_index_entries_is_one_read_not_one_per_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One-record batches of ~80 bytes with an index entry every 16 KiB: ~200 batches between entries.
    lg = open_log(tmp_path, index_interval_bytes=16 * 1024)
    for _ in range(2000):
        lg.append_as_leader(make_batch(1, value_size=10), 0)
    lg.append_as_leader(make_batch(1, value_size=10), 0)  # the last batch appended: read without any lookup
    reads = count_preads(monkeypatch)
    for offset in range(0, 2001, 7):
        reads.clear()
        got = lg.read(offset, 1)
        assert got.first_offset == offset and batch_bases(got.records) == [offset], offset
        assert len(reads) <= 3, f"offset {offset}: {len(reads)} preads to find and read one batch"
    reads.clear()
    assert batch_bases(lg.read(2000, 1).records) == [2000]
    assert len(reads) == 1, f"the batch just appended: {len(reads)} preads (only the read itself expected)"
    lg.close()


def test_batches_larger_than_the_scan_read_are_stepped_over(tmp_path: Path) -> None:
    # Large batches (bigger than one scan read) between small ones; every offset is still found.
    lg = open_log(tmp_path, index_interval_bytes=64 * 1024)
    bases = []
    for i in range(40):
        bases.append(lg.log_end_offset)
        lg.append_as_leader(make_batch(2, value_size=30_000 if i % 3 == 0 else 20), 0)
    for base in bases:
        for offset in (base, base + 1):
            got = lg.read(offset, 1)
            assert got.first_offset == base and batch_bases(got.records) == [base], offset
    lg.close()


def test_a_truncated_and_rewritten_tail_is_read_as_rewritten(tmp_path: Path) -> None:
    # The segment remembers where its last appended batch is; truncation forgets it.
    lg = open_log(tmp_path)
    lg.append_as_leader(make_batch(3, value_size=5), 0)
    lg.append_as_leader(make_batch(3, value_size=5), 0)
    assert lg.read(4, 1 << 20).first_offset == 3
    lg.truncate_to(3)
    assert lg.read(3, 1 << 20).records == b""
    lg.append_as_leader(make_batch(2, value_size=40), 1)  # offsets 3-4 again, other bytes
    got = lg.read(3, 1 << 20)
    assert got.first_offset == 3 and offsets_of(got.records) == [3, 4]
    assert {h.partition_leader_epoch for _, h in iter_batches(got.records)} == {1}
    lg.close()


def test_a_slice_read_covers_the_same_batches_as_a_read_in_few_preads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Kafka listener sends a fetch from the file (sendfile): only where the slice ends is read,
    # from the headers, and tiny batches must not cost a pread each.
    lg = open_log(tmp_path)
    sizes = [1, 1, 4, 1, 30, 1] * 400  # records per batch: ~80-byte to ~2 KiB batches
    for n in sizes:
        lg.append_as_leader(make_batch(n, value_size=60), 0)
    reads = count_preads(monkeypatch)
    for start, max_bytes, max_offset in ((0, 1 << 20, None), (5, 100_000, None), (100, 50_000, 1500),
                                         (3000, 10, None), (lg.log_end_offset - 1, 1 << 20, None)):
        whole = lg.read(start, max_bytes, max_offset=max_offset)
        reads.clear()
        sliced = lg.read(start, max_bytes, max_offset=max_offset, as_slice=True)
        try:
            assert sliced.first_offset == whole.first_offset, (start, max_bytes, max_offset)
            data = sliced.records.read() if isinstance(sliced.records, FileRecords) else sliced.records
            assert batch_bases(data) == batch_bases(whole.records), (start, max_bytes, max_offset)
        finally:
            close = getattr(sliced.records, "close", None)
            if close is not None:
                close()
        # one per 64 KiB of headers walked (chunks overlap by a torn batch), not one per batch
        assert len(reads) <= 4 + max_bytes // (32 * 1024), f"{len(reads)} preads for a {max_bytes}-byte slice"
    lg.close()


@pytest.mark.parametrize("index_bytes", ["4", "8", "11", "12", "24"])
def test_a_tiny_segment_index_bytes_still_makes_a_log_that_rolls_and_reads(tmp_path: Path, index_bytes: str) -> None:
    """Kafka takes segment.index.bytes from 4. Brook took 8 to 11 and could then create no index: a topic created
    with it had no log on any broker (its produces timed out), and set on an existing topic, every produce failed
    at the next segment roll. Smaller values now act as INDEX_BYTES_MIN (two time-index entries)."""
    from storage.log_config import INDEX_BYTES_MIN, validate
    assert validate({"segment.index.bytes": index_bytes}, strict=True) == {"segment.index.bytes": index_bytes}
    cfg = LogConfig.from_overrides({"segment.index.bytes": index_bytes, "index.interval.bytes": "1"})
    assert cfg.segment_index_bytes == max(INDEX_BYTES_MIN, int(index_bytes))
    lg = Log.open(tmp_path / "t-0", cfg)
    try:
        batches = [make_batch(2, ts=now_ms() + i) for i in range(20)]
        for b in batches:
            lg.append_as_leader(b, 0)
        lg.update_high_watermark(lg.log_end_offset)
        assert len(lg.segments()) > 2, "an index this small fills (and rolls the segment) every few batches"
        assert offsets_of(read_all(lg)) == list(range(40))
    finally:
        lg.close()
    lg = Log.open(tmp_path / "t-0", cfg, recovery_point=0)
    try:
        assert offsets_of(read_all(lg)) == list(range(40))
    finally:
        lg.close()


def test_appended_batches_are_marked_checked_and_a_truncation_forgets_what_it_removed(tmp_path: Path) -> None:
    # A slice for sendfile is sent unread only within ranges that passed their CRC (storage/segment.py).
    lg = open_log(tmp_path)
    for _ in range(3):
        lg.append_as_leader(make_batch(2, value_size=10), 0)
    seg = lg.segments()[-1]
    size = seg.size
    assert seg.checked_ranges() == ((0, size),)  # validated before they were written
    lg.truncate_to(2)
    cut = seg.size
    assert 0 < cut < size and seg.checked_ranges() == ((0, cut),)
    lg.append_as_leader(make_batch(2, value_size=10), 0)
    assert seg.checked_ranges() == ((0, seg.size),)
    lg.close()
