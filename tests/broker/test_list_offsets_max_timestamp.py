"""ListOffsets MAX_TIMESTAMP (-3, KIP-734) on real logs: the right record, and little read.

The answer: among the non-control batches wholly below the bound (high watermark for clients, log
end for replicas), from the batch holding the log start on, the largest timestamp, the earliest
record carrying it. Each segment knows its largest timestamp and the first batch reaching it, so
the broker reads one batch, plus a scan of the segment crossing the bound when that segment could
hold the answer; walking every batch header from the log start made a cheap request naming many
partitions (or one partition many times) read gigabytes, and answered wrong past 256 MiB.

Every answer is checked against a brute-force decode of every record in range. Costs are counted
in segment reads (LogSegment.read wrapped), never timed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import InProcessBroker

from broker.replica_manager import MAX_TIMESTAMP, _max_timestamp_lookup
from proto import broker_pb2
from proto.errors import ErrorCode
from storage.log import Log
from storage.log_config import LogConfig
from storage.record_batch import RecordBatchBuilder, build_control_batch, decode_batch, iter_batches
from storage.segment import LogSegment

EPOCH = 0


def open_log(path: Path, **cfg: Any) -> Log:
    return Log.open(path / "t-0", LogConfig(**cfg))


def append(lg: Log, timestamps: list[int], *, value_size: int = 20) -> int:
    """One data batch of one record per timestamp at the log end (as a follower: no validator); its base offset."""
    base = lg.log_end_offset
    b = RecordBatchBuilder(base_offset=base, partition_leader_epoch=EPOCH)
    for i, ts in enumerate(timestamps):
        b.append(ts, f"k{base + i}".encode(), b"v" * value_size)
    lg.append_as_follower(b.build())
    return base


def append_control(lg: Log, ts: int) -> int:
    base = lg.log_end_offset
    lg.append_as_follower(build_control_batch(True, producer_id=7, producer_epoch=0, timestamp_ms=ts,
                                              partition_leader_epoch=EPOCH, base_offset=base))
    return base


def _max_timestamp_offset(lg: Log, bound: int) -> tuple[int, int]:
    """(offset, timestamp) of the lookup (its third figure, the batch's epoch, is tested elsewhere)."""
    return _max_timestamp_lookup(lg, bound)[:2]


def brute_force(lg: Log, bound: int) -> tuple[int, int]:
    """Every record of every non-control batch wholly below ``bound`` from the one holding the log start:
    the largest timestamp, its earliest record."""
    best_ts, best_offset = -1, -1
    for chunk in lg.iter_batches_from(lg.log_start_offset, max_offset=bound):
        for pos, h in iter_batches(chunk):
            if h.is_control:
                continue
            _h, records = decode_batch(chunk, pos)
            for r in records:
                if r.timestamp > best_ts:
                    best_ts, best_offset = r.timestamp, r.offset
    return best_offset, best_ts


def check_all_bounds(lg: Log) -> None:
    """MAX_TIMESTAMP for every bound from the log start to the log end, against the brute force."""
    for bound in range(lg.log_start_offset, lg.log_end_offset + 1):
        assert _max_timestamp_offset(lg, bound) == brute_force(lg, bound), f"bound {bound}, {lg}"


class SegmentReads:
    """LogSegment.read wrapped: (segment base offset, bytes returned) of every read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[tuple[int, int]] = []
        real = LogSegment.read

        def counting(seg: LogSegment, *args: Any, **kwargs: Any) -> Any:
            got = real(seg, *args, **kwargs)
            self.reads.append((seg.base_offset, len(got[0]) if got else 0))
            return got

        monkeypatch.setattr(LogSegment, "read", counting)

    def segments(self) -> set[int]:
        return {base for base, _n in self.reads}

    def bytes(self) -> int:
        return sum(n for _base, n in self.reads)


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], Any]], tuple[Any, SegmentReads]]:
    def run(call: Callable[[], Any]) -> tuple[Any, SegmentReads]:
        with monkeypatch.context() as m:
            reads = SegmentReads(m)
            result = call()
        return result, reads
    return run


def segment_of(lg: Log, offset: int) -> LogSegment:
    return [s for s in lg.segments() if s.base_offset <= offset][-1]


# ---------------------------------------------------------------------------------------- answers
def test_max_in_an_early_segment_in_the_active_one_and_above_the_high_watermark(tmp_path: Path) -> None:
    lg = open_log(tmp_path, index_interval_bytes=100)
    for seg_ts in ([100, 300, 200], [900, 150], [400, 880, 120]):
        for ts in seg_ts:
            append(lg, [ts, ts - 50])
        lg.roll()
    early_max = brute_force(lg, lg.log_end_offset)
    assert early_max == (6, 900)  # second segment's first batch
    append(lg, [500])
    active_max = append(lg, [950, 960, 10])  # committed below
    append(lg, [300])
    hw = lg.log_end_offset
    append(lg, [5000, 20])  # uncommitted: not for clients
    append(lg, [700])
    lg.update_high_watermark(hw)
    assert _max_timestamp_offset(lg, hw) == (active_max + 1, 960) == brute_force(lg, hw)
    assert _max_timestamp_offset(lg, lg.log_end_offset) == (hw, 5000)  # a replica's bound: the log end
    assert _max_timestamp_offset(lg, active_max) == early_max
    check_all_bounds(lg)
    lg.close()


def test_ties_answer_the_earliest_record(tmp_path: Path) -> None:
    lg = open_log(tmp_path, index_interval_bytes=1)
    append(lg, [10, 20])
    lg.roll()
    first = append(lg, [30, 70, 70])  # max 70 reached at its second record
    append(lg, [70])
    lg.roll()
    append(lg, [70, 5])
    append(lg, [69])
    assert _max_timestamp_offset(lg, lg.log_end_offset) == (first + 1, 70)
    check_all_bounds(lg)
    lg.close()


def test_control_batches_never_answer(tmp_path: Path) -> None:
    """A segment's largest timestamp may be a control batch's: the metadata cannot tell, the scan does."""
    lg = open_log(tmp_path, index_interval_bytes=1)
    append(lg, [100])
    append_control(lg, 9000)
    winner = append(lg, [800, 50])
    append(lg, [800])
    lg.roll()
    append(lg, [700])
    append_control(lg, 9500)
    append(lg, [600])
    assert _max_timestamp_offset(lg, lg.log_end_offset) == (winner, 800)
    check_all_bounds(lg)
    # only control batches: no answer
    lg2 = open_log(tmp_path / "other")
    append_control(lg2, 10)
    assert _max_timestamp_offset(lg2, lg2.log_end_offset) == (-1, -1)
    lg.close()
    lg2.close()


def test_after_the_log_start_moved(tmp_path: Path) -> None:
    """DeleteRecords: the batches below the log start do not count, the batch holding it does."""
    lg = open_log(tmp_path, index_interval_bytes=1)
    append(lg, [100, 9999])
    lg.roll()
    append(lg, [500])
    held = append(lg, [450, 600, 10])  # its largest timestamp first reached in this segment
    append(lg, [490])
    lg.roll()
    append(lg, [300])
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(2)  # the second segment's start: past the first one's 9999
    assert _max_timestamp_offset(lg, lg.log_end_offset) == (held + 1, 600) == brute_force(lg, lg.log_end_offset)
    lg.set_log_start_offset(held + 1)  # inside a batch: the whole batch still counts
    assert _max_timestamp_offset(lg, lg.log_end_offset) == (held + 1, 600) == brute_force(lg, lg.log_end_offset)
    lg.set_log_start_offset(held + 3)  # past it
    assert _max_timestamp_offset(lg, lg.log_end_offset) == (held + 3, 490) == brute_force(lg, lg.log_end_offset)
    check_all_bounds(lg)
    lg.close()


def test_the_segment_crossing_the_bound(tmp_path: Path) -> None:
    """Its largest timestamp is above the bound: the answer comes from its indexes and a short scan.
    A tie with the batch first reaching the last indexed timestamp goes to that earlier batch; a control
    batch there, or a time index that was full (entries skipped), sends it to a longer scan."""
    lg = open_log(tmp_path, index_interval_bytes=1)
    first = append(lg, [700])  # time index entry (700, first)
    for ts in (100, 200, 300):
        append(lg, [ts])
    append(lg, [700])  # after the last offset index entry below the bound, ties with the first
    hw = lg.log_end_offset
    append(lg, [900])
    assert _max_timestamp_offset(lg, hw) == (first, 700) == brute_force(lg, hw)
    check_all_bounds(lg)
    lg.close()

    lg = open_log(tmp_path / "control", index_interval_bytes=1)
    append(lg, [700])
    lg.roll()
    best = append(lg, [750])
    control = append_control(lg, 800)  # the last time index entry below the bound: (800, control)
    append(lg, [100, 300])
    append(lg, [200])
    hw = lg.log_end_offset
    append(lg, [900])
    assert control < hw
    assert _max_timestamp_offset(lg, hw) == (best, 750) == brute_force(lg, hw)
    check_all_bounds(lg)
    lg.close()


def test_a_full_time_index_is_not_trusted(tmp_path: Path) -> None:
    """A tiny index fills within one append: index files written before offset- and time-index entries went
    in pairs (LogSegment._index_batch) have offset index entries without their time entries, so the last
    offset index entry no longer bounds the timestamps before it."""
    lg = open_log(tmp_path, index_interval_bytes=1, segment_index_bytes=48)  # time index full at 3 entries
    data = bytearray()  # one batch per timestamp, one append
    for i, ts in enumerate([10, 20, 30, 40, 90, 50, 100]):
        b = RecordBatchBuilder(base_offset=i, partition_leader_epoch=EPOCH)
        b.append(ts, b"k", b"v")
        data += b.build()
    lg.append_as_follower(bytes(data))
    seg = lg.active_segment
    for pos, h in seg.iter_headers(0):  # the offset index entries the time index has none for, as written before
        if h.base_offset > seg.index.last_entry().offset:
            seg.index.append(h.base_offset, pos)
    assert seg.time_index.is_full() and seg.index.entries > seg.time_index.entries
    assert _max_timestamp_offset(lg, 6) == (4, 90) == brute_force(lg, 6)
    check_all_bounds(lg)
    lg.close()


@pytest.mark.parametrize("seed", range(12))
def test_random_logs_match_the_brute_force(tmp_path: Path, seed: int) -> None:
    """Random timestamps (many ties), control batches, rolls (some because a tiny index is full), the log
    start moved, truncation, and a reopen (segment maxima restored from the time index)."""
    rng = random.Random(seed)
    cfg: dict[str, Any] = {"index_interval_bytes": rng.choice([1, 120, 400, 4096]),
                           "segment_index_bytes": rng.choice([48, 120, 10 * 1024 * 1024]),
                           "segment_bytes": rng.choice([600, 2000, 1 << 30])}
    lg = open_log(tmp_path, **cfg)
    top = rng.choice([5, 50, 5000])

    def grow(n: int) -> None:
        for _ in range(n):
            r = rng.random()
            if r < 0.08:
                lg.roll()
            elif r < 0.16:
                append_control(lg, rng.randint(1, top + 10))
            else:
                append(lg, [rng.randint(0, top) for _ in range(rng.randint(1, 4))])

    grow(rng.randint(30, 70))
    check_all_bounds(lg)
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(rng.randint(0, lg.log_end_offset))
    check_all_bounds(lg)
    lg.truncate_to(rng.randint(lg.log_start_offset, lg.log_end_offset))
    grow(rng.randint(5, 30))
    check_all_bounds(lg)
    start = lg.log_start_offset
    lg.close()
    lg = Log.open(tmp_path / "t-0", LogConfig(**cfg), log_start_offset=start, clean_shutdown=True)
    check_all_bounds(lg)
    grow(rng.randint(5, 20))
    check_all_bounds(lg)
    lg.close()


# ---------------------------------------------------------------------------------------- costs
def many_segments(lg: Log, segments: int, *, best_in: int, best_ts: int = 9000) -> int:
    """``segments`` closed segments of 8 batches, timestamps below 1000 but one ``best_ts`` batch in
    segment ``best_in``; its offset."""
    rng = random.Random(1)
    best = -1
    for s in range(segments):
        for b in range(8):
            if s == best_in and b == 3:
                best = append(lg, [best_ts])
            else:
                append(lg, [rng.randint(1, 999) for _ in range(3)])
        lg.roll()
    return best


def test_max_in_an_old_segment_reads_one_batch(tmp_path: Path, measured: Any) -> None:
    lg = open_log(tmp_path, index_interval_bytes=200)
    best = many_segments(lg, 40, best_in=5)
    for _ in range(30):  # the active segment, its tail above the high watermark, below the best
        append(lg, [random.Random(2).randint(1, 2000)])
    lg.update_high_watermark(lg.log_end_offset - 10)
    expected = brute_force(lg, lg.high_watermark)
    assert expected == (best, 9000)
    got, reads = measured(lambda: _max_timestamp_offset(lg, lg.high_watermark))
    assert got == expected
    assert reads.segments() == {segment_of(lg, best).base_offset}, reads.reads
    assert len(reads.reads) == 1, "one batch read: the winner's, to check it and find its record"
    lg.close()


def test_max_in_the_active_segment_scans_only_near_the_high_watermark(tmp_path: Path, measured: Any) -> None:
    """The active segment's largest timestamp is above the high watermark: its time and offset indexes
    bound the scan to about one index interval below the high watermark, however long the segment."""
    interval = 300
    lg = open_log(tmp_path, index_interval_bytes=interval)
    many_segments(lg, 20, best_in=3, best_ts=900)
    active = lg.log_end_offset
    plateau = append(lg, [5000])  # the committed answer unless a later batch beats it
    rng = random.Random(3)
    for _ in range(400):
        append(lg, [rng.randint(1000, 4999)])
    hw = lg.log_end_offset
    append(lg, [8000])  # uncommitted
    lg.update_high_watermark(hw)
    seg = lg.active_segment
    assert seg.base_offset == active and seg.size > 30 * interval

    got, reads = measured(lambda: _max_timestamp_offset(lg, hw))
    assert got == brute_force(lg, hw) == (plateau, 5000)
    assert reads.segments() == {active}, reads.reads
    assert reads.bytes() < 3 * interval, reads.reads

    append(lg, [100])
    beaten = append(lg, [8500])  # just below the new high watermark: beats the plateau and the 8000
    append(lg, [200])
    hw = lg.log_end_offset
    append(lg, [9000])
    lg.update_high_watermark(hw)
    got, reads = measured(lambda: _max_timestamp_offset(lg, hw))
    assert got == brute_force(lg, hw) == (beaten, 8500)
    assert reads.segments() == {active} and reads.bytes() < 3 * interval, reads.reads
    lg.close()


def test_after_delete_records_only_the_segment_holding_the_log_start_is_scanned(
        tmp_path: Path, measured: Any) -> None:
    """The log start moved past the batch with a segment's largest timestamp: that segment is scanned
    from the log start to its own end (not on through the log), the others answer from metadata."""
    lg = open_log(tmp_path, index_interval_bytes=200, retention_ms=-1)
    gone = many_segments(lg, 20, best_in=5)
    append(lg, [3])
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(gone + 2)
    expected = brute_force(lg, lg.high_watermark)
    got, reads = measured(lambda: _max_timestamp_offset(lg, lg.high_watermark))
    assert got == expected and expected[1] < 1000
    held = segment_of(lg, gone).base_offset
    assert reads.segments() <= {held, segment_of(lg, expected[0]).base_offset}, reads.reads
    assert held in reads.segments()
    lg.close()


def test_a_segment_deleted_under_the_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention runs between the snapshot of the segment list and the first read: the lookup starts
    again from the new log start, on the segments left."""
    lg = open_log(tmp_path, index_interval_bytes=100, file_delete_delay_ms=0, retention_ms=-1)
    many_segments(lg, 6, best_in=1)
    append(lg, [950])
    lg.update_high_watermark(lg.log_end_offset)
    new_start = lg.segments()[3].base_offset
    real_read = Log.read
    moved: list[int] = []

    def read_after_retention(self: Log, *args: Any, **kwargs: Any) -> Any:
        if not moved:
            moved.append(1)
            self.set_log_start_offset(new_start)
            assert self.delete_old_segments() == 3
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Log, "read", read_after_retention)
    got = _max_timestamp_offset(lg, lg.high_watermark)
    monkeypatch.undo()
    assert moved and lg.log_start_offset == new_start
    assert got == brute_force(lg, lg.high_watermark) and got[0] >= new_start
    lg.close()


# ---------------------------------------------------------------------------------------- requests
@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {"index.interval.bytes": "100"}}, partitions=2) as b:
        yield b


def entry(partition: int, timestamp: int, epoch: int = -1) -> broker_pb2.ListOffsetsPartition:
    return broker_pb2.ListOffsetsPartition(topic="t", partition=partition, timestamp=timestamp,
                                           current_leader_epoch=epoch)


def test_a_partition_named_twice_is_refused_for_each_entry_and_looked_up_for_none(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """As Kafka answers (KafkaApis.handleListOffsetRequest): INVALID_REQUEST for every entry of a partition
    named more than once. A request naming one partition with a thousand timestamps read its log a thousand
    times (audit); the other partitions are answered."""
    lg = broker.rm.leader_partition("t", 0).log
    for s in range(5):
        for ts in (100 * s + 1, 100 * s + 50, 100 * s + 7):
            append(lg, [ts, ts - 1])
        lg.roll()
    append(lg, [460, 470])
    hw = lg.log_end_offset
    append(lg, [9999])
    lg.update_high_watermark(hw)
    lg1 = broker.rm.leader_partition("t", 1).log
    append(lg1, [42])
    lg1.update_high_watermark(lg1.log_end_offset)

    lookups: list[tuple[int, int, int]] = []  # (partition, timestamp, bound)
    offset_for = broker.rm._offset_for

    def counted(p: Any, ts: int, from_replica: bool, read_committed: bool = False) -> tuple[int, int]:
        lookups.append((p.partition, ts, p.log.log_end_offset if from_replica else p.log.high_watermark))
        return offset_for(p, ts, from_replica, read_committed)

    monkeypatch.setattr(broker.rm, "_offset_for", counted)
    req = broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=(
        [entry(0, 1000 + i) for i in range(500)] + [entry(1, MAX_TIMESTAMP)] + [entry(0, MAX_TIMESTAMP)] * 500))
    resp = broker.rm.list_offsets(req)
    assert lookups == [(1, -3, 1)], "only the partition named once is looked up"
    parts = list(resp.partitions)
    assert len(parts) == len(req.partitions)
    for p in parts[:500] + parts[501:]:
        assert (p.topic, p.partition, p.error_code, p.offset, p.timestamp, p.leader_epoch) == \
            ("t", 0, ErrorCode.INVALID_REQUEST, -1, -1, -1), p
    assert (parts[500].error_code, parts[500].offset, parts[500].timestamp) == (ErrorCode.NONE, 0, 42)

    # Named once, each partition is answered; an entry's own leader epoch is checked.
    lookups.clear()
    resp = broker.rm.list_offsets(broker_pb2.ListOffsetsRequest(replica_id=-1, partitions=[
        entry(0, MAX_TIMESTAMP), entry(1, MAX_TIMESTAMP, epoch=3)]))
    assert lookups == [(0, -3, hw)]
    assert (resp.partitions[0].offset, resp.partitions[0].timestamp) == brute_force(lg, hw) == (hw - 1, 470)
    assert resp.partitions[1].error_code == ErrorCode.UNKNOWN_LEADER_EPOCH

    # a replica's bound is the log end
    lookups.clear()
    resp = broker.rm.list_offsets(broker_pb2.ListOffsetsRequest(replica_id=2, partitions=[entry(0, MAX_TIMESTAMP)]))
    assert lookups == [(0, -3, lg.log_end_offset)]
    assert [(p.offset, p.timestamp) for p in resp.partitions] == [(hw, 9999)]
