"""index.interval.bytes is bounded, and a segment with a sparse index is walked once, not at every read.

A lookup inside a segment reads batch headers from the offset-index entry below it. A topic owner could set
index.interval.bytes up to 2^31-1: the index then had no entry and every read in the middle of a segment
walked it from the start, 3.8 s per 100 MiB per fetch entry (found by an audit). The controller now refuses
more than 1 MiB, the storage uses at most 1 MiB whatever a topic says, and a segment written before (its
index sparse) keeps marks of what walks found, so it is walked once.

Costs are counted in bytes read from the segment file, never timed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metadata_quorum import cluster_configs
from metadata_quorum import commands as c
from metadata_quorum.state import MetadataState
from proto import errors
from storage import file_records, log_config, segment
from storage.file_records import FileRecords
from storage.log import Log
from storage.log_config import LogConfig, validate
from storage.record_batch import RecordBatchBuilder, iter_batches
from storage.segment import LogSegment

HUGE = str(2**31 - 1)
INDEX_INTERVAL_BYTES_MAX = MARK_BYTES = 1 << 20  # log_config.INDEX_INTERVAL_BYTES_MAX, segment.MARK_BYTES


def test_clients_may_not_set_an_interval_above_1_mib_but_what_was_stored_still_loads() -> None:
    with pytest.raises(errors.InvalidConfigError, match=r"index.interval.bytes.*at most 1048576"):
        validate({"index.interval.bytes": HUGE}, strict=True)
    with pytest.raises(errors.InvalidConfigError, match=r"at most 1048576"):
        validate({"index.interval.bytes": str((1 << 20) + 1)}, strict=True)
    assert validate({"index.interval.bytes": str(1 << 20)}, strict=True) == {"index.interval.bytes": str(1 << 20)}
    # The metadata state replays its journal unstrict; brokers build their logs' configs from it.
    assert validate({"index.interval.bytes": HUGE}) == {"index.interval.bytes": HUGE}
    assert LogConfig.from_overrides({"index.interval.bytes": HUGE}).index_interval_bytes == 2**31 - 1
    # The cluster default (log.index.interval.bytes): refused when asked, replayed when stored.
    with pytest.raises(errors.InvalidConfigError, match=r"log.index.interval.bytes.*at most 1048576"):
        cluster_configs.validate({"log.index.interval.bytes": HUGE})
    assert cluster_configs.validate({"log.index.interval.bytes": HUGE}, strict=False) == \
        {"log.index.interval.bytes": HUGE}
    assert log_config.INDEX_INTERVAL_BYTES_MAX == segment.MARK_BYTES == INDEX_INTERVAL_BYTES_MAX


def test_a_journal_with_a_huge_interval_still_replays() -> None:
    """Commands the controller accepted before the bound apply as they did (the metadata state is unstrict)."""
    state = MetadataState()
    assert state.apply(c.ActivateController(node_id=100, term=1)).ok
    epoch = state.apply(c.RegisterBroker(1, "inc-1", [["BROKER", "127.0.0.1", 9001]], "")).value
    assert state.apply(c.UnfenceBroker(1, epoch)).ok
    assert state.apply(c.AlterClusterConfigs({"log.index.interval.bytes": HUGE})).ok
    assert state.cluster_configs["log.index.interval.bytes"] == HUGE
    assert state.apply(c.CreateTopic("t", "id-t", {"index.interval.bytes": HUGE}, [[1]])).ok
    assert state.apply(c.AlterConfigs("t", "id-t", {"index.interval.bytes": HUGE})).ok
    assert state.topics["t"].configs == {"index.interval.bytes": HUGE}


def batch(base: int, value_size: int) -> bytes:
    b = RecordBatchBuilder(base_offset=base, partition_leader_epoch=0)
    b.append(1_700_000_000_000 + base, f"k{base}".encode(), b"v" * value_size)
    return b.build()


def fill(lg: Log, size: int, value_size: int) -> None:
    """One-record batches of ``value_size`` bytes until the active segment holds ``size`` bytes."""
    while lg.active_segment.size < size:
        data = bytearray()
        offset = lg.log_end_offset
        while len(data) < 256 * 1024:
            data += batch(offset, value_size)
            offset += 1
        lg.append_as_follower(bytes(data))


def test_a_topic_with_a_huge_interval_gets_an_index_entry_every_mib(
        tmp_path: Path, preads: Callable[[LogSegment], int]) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig.from_overrides({"index.interval.bytes": HUGE}))
    fill(lg, 6 << 20, 1000)
    seg = lg.active_segment
    assert seg.index.entries >= 5, seg.index.entries
    preads(seg)
    middle = lg.log_end_offset // 2
    got = lg.read(middle, 1)
    assert next(iter_batches(got.records))[1].base_offset == middle
    assert preads(seg) <= 2 * INDEX_INTERVAL_BYTES_MAX + (64 << 10)
    lg.close()


def sparse_segment(tmp_path: Path, size: int) -> tuple[Log, LogConfig, bytes]:
    """A log of one closed segment of ``size`` bytes whose index files are as a 2^31-1 interval left them: no
    offset-index entry, one time entry (the largest timestamp, written at the roll); reopened. Its bytes."""
    cfg = LogConfig.from_overrides({"index.interval.bytes": HUGE})
    lg = Log.open(tmp_path / "t-0", cfg)
    fill(lg, size, 1000)
    lg.roll()
    seg = lg.segments()[0]
    last_time = seg.time_index.last_entry()
    content = seg.log_path.read_bytes()
    index_path, time_path = seg.index.path, seg.time_index.path
    lg.close()
    index_path.write_bytes(b"")
    time_path.write_bytes(last_time.timestamp.to_bytes(8, "big") + (last_time.offset - 0).to_bytes(4, "big"))
    return Log.open(tmp_path / "t-0", cfg, clean_shutdown=True), cfg, content


def test_a_segment_with_a_sparse_index_opens_reads_right_and_is_walked_once(
        tmp_path: Path, preads: Callable[[LogSegment], int]) -> None:
    size = 8 << 20
    lg, _cfg, content = sparse_segment(tmp_path, size)
    seg = lg.segments()[0]
    assert seg.index.entries == 0 and seg.size == len(content) >= size
    bases = [h.base_offset for _pos, h in iter_batches(content)]
    positions = {h.base_offset: pos for pos, h in iter_batches(content)}
    preads(seg)
    far = bases[-3]
    got = lg.read(far, 1)  # the first read in the middle walks from the start: the index has nothing
    assert got.records == content[positions[far]:positions[far + 1]]
    assert preads(seg) >= positions[far]
    # Every later read starts at a mark: at most about MARK_BYTES of headers, whatever the offset. Before,
    # each of these walked from the segment start again.
    for offset in (bases[5], bases[len(bases) // 3], bases[len(bases) // 2], far, bases[-1]):
        got = lg.read(offset, 1)
        end = positions.get(offset + 1, len(content))
        assert got.records == content[positions[offset]:end], offset
        assert preads(seg) <= MARK_BYTES + 2 * INDEX_INTERVAL_BYTES_MAX + (64 << 10), offset
    assert size // MARK_BYTES - 1 <= len(seg.marks()) <= 4 * size // MARK_BYTES
    # The marks are hints checked against the batch they name; a truncation drops those past it.
    cut = bases[len(bases) // 2]
    lg.truncate_to(cut)
    seg = lg.segments()[0]
    assert seg.marks() and all(pos < positions[cut] for _o, pos in seg.marks())
    assert lg.read(bases[len(bases) // 4], 1).records[:61] == content[positions[bases[len(bases) // 4]]:][:61]
    lg.close()


def test_timestamp_lookups_in_a_sparse_segment_start_at_the_log_start_mark(
        tmp_path: Path, preads: Callable[[LogSegment], int]) -> None:
    lg, _cfg, content = sparse_segment(tmp_path, 4 << 20)
    seg = lg.segments()[0]
    bases = [h.base_offset for _pos, h in iter_batches(content)]
    lg.read(bases[-2], 1)  # marks
    preads(seg)
    start = bases[len(bases) // 2]
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(start)
    for ts, expected in ((0, start), (1_700_000_000_000 + start + 10, start + 10)):
        assert lg.offset_for_timestamp(ts) == (expected, 1_700_000_000_000 + expected)
        assert preads(seg) <= MARK_BYTES + 2 * INDEX_INTERVAL_BYTES_MAX + (64 << 10)
    lg.close()


def test_past_the_slice_budget_a_read_carries_the_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices (records left in the segment file for sendfile) hold a duplicated descriptor each until sent;
    past slice_budget() a read returns the bytes instead, the same bytes."""
    lg = Log.open(tmp_path / "t-0", LogConfig())
    fill(lg, 64 << 10, 100)
    expected = lg.read(0, 1 << 20).records
    before = getattr(file_records, "open_slices", lambda: 0)()  # slices other tests of this process hold
    held = lg.read(0, 1 << 20, as_slice=True).records
    assert isinstance(held, FileRecords)
    monkeypatch.setattr(file_records, "slice_budget", lambda: before + 1, raising=False)  # the one held
    got: Any = lg.read(0, 1 << 20, as_slice=True).records
    assert not isinstance(got, FileRecords) and got == expected
    assert held.read() == expected
    held.close()
    assert file_records.open_slices() == before
    got = lg.read(0, 1 << 20, as_slice=True).records
    assert isinstance(got, FileRecords) and got.read() == expected
    got.close()
    lg.close()
