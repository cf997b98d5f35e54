"""The partition-log layer of Kafka transactions: producer state, markers, the last stable offset and ``.txnindex``.

A transactional batch starts its producer's transaction; a COMMIT or ABORT marker (written by
``append_marker_as_leader``, or replicated, or found by recovery) ends it. Read_committed reads stop at the last
stable offset (the high watermark, held at the first offset of the lowest undecided transaction, or of one whose
marker is not yet below the high watermark) and drop the aborted transactions the ``.txnindex`` files list. Real
logs in tmp_path; Kafka's UnifiedLog/ProducerStateManager/TransactionIndex are the specification.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from storage_testlib import make_batch, now_ms, read_all

from client.fetcher import AbortedFilter
from proto import errors
from storage import txn_index
from storage.cleaner import LogCleaner
from storage.log import Log, LogConfig
from storage.producer_state import (
    SNAPSHOT_FILE,
    TXN_HISTORY,
    InvalidTxnStateError,
    ProducerBudget,
    ProducerStateManager,
    TransactionCoordinatorFencedError,
)
from storage.record_batch import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    CODEC_GZIP,
    CODEC_NONE,
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    BatchHeader,
    RecordBatchBuilder,
    build_control_batch,
    decode_batch,
    iter_batches,
    parse_control_record,
)
from storage.txn_index import AbortedTxn, TransactionIndex

DAY_MS = 86_400_000


def open_log(path: Path, **cfg) -> Log:
    return Log.open(path, LogConfig(**cfg))


def txn_batch(pid: int, seq: int, count: int = 2, *, epoch: int = 0, codec: int = CODEC_NONE,
              ts: int | None = None) -> bytes:
    ts = now_ms() if ts is None else ts
    b = RecordBatchBuilder(codec, producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    for i in range(count):
        b.append(ts + i, b"key-%d-%d" % (pid, seq + i), b"value")
    return b.build()


def txn_records(pid: int, seq: int, records: list[tuple[bytes, bytes | None]], *, epoch: int = 0) -> bytes:
    b = RecordBatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    for key, value in records:
        b.append(now_ms(), key, value)
    return b.build()


class Producer:
    """One transactional producer of a leader log: its sequence, its epoch, its coordinator's epoch."""

    def __init__(self, lg: Log, pid: int, epoch: int = 0, coordinator_epoch: int = 0) -> None:
        self.lg, self.pid, self.epoch, self.coordinator_epoch = lg, pid, epoch, coordinator_epoch
        self.seq = 0

    def send(self, count: int = 2) -> int:
        info = self.lg.append_as_leader(txn_batch(self.pid, self.seq, count, epoch=self.epoch), 0, transactional=True)
        self.seq += count
        return info.first_offset

    def end(self, commit: bool) -> int:
        info = self.lg.append_marker_as_leader(self.pid, self.epoch, commit, self.coordinator_epoch, 0)
        return info.first_offset

    def abort(self) -> int:
        return self.end(False)

    def commit(self) -> int:
        return self.end(True)


def plain(lg: Log, count: int = 3) -> int:
    return lg.append_as_leader(make_batch(count), 0).first_offset


def txnindex_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.txnindex"))}


def all_entries(lg: Log) -> list[AbortedTxn]:
    return [e for seg in lg.segments() for e in seg.txn_index.read()]


def state_of(lg: Log) -> tuple:
    return (lg.first_unstable_offset, lg.last_stable_offset, lg.ongoing_transactions(),
            lg.aborted_transactions(lg.log_start_offset, lg.log_end_offset), all_entries(lg))


# ---------------------------------------------------------------------------------------------- LSO and markers
def test_an_ongoing_transaction_holds_the_lso_at_its_first_offset_while_the_hw_passes_it(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    p = Producer(lg, 7)
    plain(lg)  # 0..2
    first = p.send()  # 3..4
    plain(lg)  # 5..7
    lg.update_high_watermark(lg.log_end_offset)
    assert first == 3 and lg.high_watermark == 8
    assert lg.first_unstable_offset == 3 and lg.last_stable_offset == 3
    assert lg.ongoing_transactions() == {7: 3}
    p.send()  # 8..9: the same transaction
    assert lg.ongoing_transactions() == {7: 3}
    marker = p.commit()  # 10
    assert lg.ongoing_transactions() == {}
    # decided, but the marker is not replicated yet (Kafka's unreplicated transactions): still unstable
    assert lg.first_unstable_offset == 3 and lg.last_stable_offset == 3
    lg.update_high_watermark(marker)
    assert lg.last_stable_offset == 3, "the marker is not below the high watermark yet"
    lg.update_high_watermark(marker + 1)
    assert lg.first_unstable_offset is None and lg.last_stable_offset == lg.high_watermark == 11
    assert lg.aborted_transactions(0, 11) == [] and all_entries(lg) == []  # a commit is not indexed
    lg.close()


def test_commit_and_abort_markers_are_kafkas_control_batches(tmp_path: Path) -> None:
    # compression.type=gzip and LogAppendTime: the marker is uncompressed anyway, stamped like any batch
    lg = open_log(tmp_path / "t-0", compression_type="gzip", message_timestamp_type="LogAppendTime")
    p = Producer(lg, 7, epoch=3, coordinator_epoch=11)
    p.send()
    lg.assign_epoch_start_offset(4, lg.log_end_offset)
    info = lg.append_marker_as_leader(7, 3, False, 11, 4, now_ms=1_700_000_000_123)
    assert (info.first_offset, info.last_offset, info.num_records) == (2, 2, 1)
    assert info.log_append_time_ms == 1_700_000_000_123
    data = read_all(lg)
    [(_p0, data_h), (pos, h)] = list(iter_batches(data))
    assert data_h.compression == CODEC_GZIP and data_h.attributes & ATTR_TRANSACTIONAL  # recompressed, still txn
    assert h.attributes & (ATTR_CONTROL | ATTR_TRANSACTIONAL) == ATTR_CONTROL | ATTR_TRANSACTIONAL
    assert h.compression == CODEC_NONE and h.base_sequence == -1 and h.record_count == 1
    assert (h.producer_id, h.producer_epoch, h.partition_leader_epoch) == (7, 3, 4)
    assert h.max_timestamp == 1_700_000_000_123
    _h, [record] = decode_batch(data, pos)
    assert record.key == b"\x00\x00\x00\x00"  # version 0, ABORT
    assert record.value == b"\x00\x00" + (11).to_bytes(4, "big")  # version 0, coordinator epoch
    assert parse_control_record(record) == (CONTROL_TYPE_ABORT, 11)
    assert lg.aborted_transactions(0, 3) == [(7, 0)]
    assert all_entries(lg) == [AbortedTxn(7, 0, 2, 3)]
    p.send()
    commit = p.commit()
    _h, [record] = decode_batch(lg.read(commit, 1 << 20).records)
    assert parse_control_record(record) == (CONTROL_TYPE_COMMIT, 11)
    assert lg.aborted_transactions(0, lg.log_end_offset) == [(7, 0)]
    lg.close()


def test_aborts_record_the_lso_of_their_time_and_overlap_is_kafkas(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    a, b = Producer(lg, 1), Producer(lg, 2)
    a.send()  # 0..1
    b.send()  # 2..3
    a.abort()  # 4: b still ongoing -> its LSO is b's first offset
    plain(lg)  # 5..7
    b.abort()  # 8: nothing ongoing -> marker + 1
    assert all_entries(lg) == [AbortedTxn(1, 0, 4, 2), AbortedTxn(2, 2, 8, 9)]
    assert lg.aborted_transactions(0, 9) == [(1, 0), (2, 2)]
    assert lg.aborted_transactions(5, 9) == [(2, 2)]  # a's ended before 5
    assert lg.aborted_transactions(0, 2) == [(1, 0)]  # b began at 2
    assert lg.aborted_transactions(4, 5) == [(1, 0), (2, 2)]
    assert lg.aborted_transactions(9, 9) == []
    lg.close()


def test_a_marker_without_an_ongoing_transaction_is_written_and_completes_nothing(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    assert lg.append_marker_as_leader(9, 2, False, 1, 0).first_offset == 0  # a coordinator's retry
    assert lg.log_end_offset == 1 and all_entries(lg) == [] and lg.first_unstable_offset is None
    assert lg.producer_epoch(9) == 2 and lg.producer_state.entry(9).coordinator_epoch == 1
    p = Producer(lg, 7)
    p.send()
    p.abort()
    assert lg.append_marker_as_leader(7, 0, False, 0, 0).first_offset == 4  # the same marker again
    assert all_entries(lg) == [AbortedTxn(7, 1, 3, 4)]
    lg.close()


def test_a_marker_with_a_bumped_epoch_restarts_the_producers_sequence(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    p = Producer(lg, 7)
    p.send(3)
    p.commit()  # same epoch: the sequence goes on
    assert len(lg.producer_state.entry(7).batches) == 1
    p.send(2)
    assert lg.producer_state.entry(7).last_seq == 4
    lg.append_marker_as_leader(7, 1, True, 0, 0)  # KIP-890: the coordinator bumps the epoch at the end
    entry = lg.producer_state.entry(7)
    assert entry.epoch == 1 and not entry.batches and lg.producer_epoch(7) == 1
    end = lg.log_end_offset
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="expected sequence 0"):
        lg.append_as_leader(txn_batch(7, 5, epoch=1), 0, transactional=True)
    with pytest.raises(errors.InvalidProducerEpochError):
        lg.append_as_leader(txn_batch(7, 5, epoch=0), 0, transactional=True)
    assert lg.log_end_offset == end
    assert lg.append_as_leader(txn_batch(7, 0, epoch=1), 0, transactional=True).first_offset == end
    lg.close()


# ---------------------------------------------------------------------------------------------- leader checks
def test_what_a_client_may_write(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    marker = build_control_batch(True, producer_id=7, producer_epoch=0, timestamp_ms=now_ms())
    for transactional in (False, True):
        with pytest.raises(errors.InvalidRecordError, match="control"):
            lg.append_as_leader(marker, 0, transactional=transactional)
    with pytest.raises(errors.InvalidRecordError, match="may not set: transactional"):
        lg.append_as_leader(txn_batch(7, 0), 0)  # no transactional id: refused as before
    with pytest.raises(errors.InvalidRecordError, match="not transactional"):
        lg.append_as_leader(make_batch(2, producer_id=7, producer_epoch=0, base_sequence=0), 0, transactional=True)
    with pytest.raises(errors.InvalidRecordError, match="not transactional"):  # every batch of the request
        lg.append_as_leader(txn_batch(7, 0) + make_batch(2, producer_id=7, producer_epoch=0, base_sequence=2), 0,
                            transactional=True)
    with pytest.raises(errors.InvalidRecordError, match="without a producer id"):
        lg.append_as_leader(txn_batch(-1, 0), 0, transactional=True)
    with pytest.raises(errors.InvalidRecordError, match="without a base sequence"):
        lg.append_as_leader(txn_batch(7, -1), 0, transactional=True)
    assert lg.log_end_offset == 0 and lg.producer_state.entry(7) is None
    # a producer in a transaction writes transactional batches only
    Producer(lg, 7).send()
    with pytest.raises(InvalidTxnStateError, match="transaction ongoing since offset 0") as refused:
        lg.append_as_leader(make_batch(2, producer_id=7, producer_epoch=0, base_sequence=2), 0)
    assert refused.value.code == errors.ErrorCode.INVALID_TXN_STATE
    assert lg.log_end_offset == 2
    # a zombie's transactional batch is fenced as any other
    lg.append_as_leader(txn_batch(7, 0, epoch=1), 0, transactional=True)
    with pytest.raises(errors.InvalidProducerEpochError):
        lg.append_as_leader(txn_batch(7, 2, epoch=0), 0, transactional=True)
    lg.close()


def test_a_marker_from_an_older_producer_or_coordinator_epoch_writes_nothing(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    p = Producer(lg, 7, epoch=2, coordinator_epoch=5)
    p.send()
    end = lg.log_end_offset
    with pytest.raises(errors.InvalidProducerEpochError, match="older than its epoch 2"):
        lg.append_marker_as_leader(7, 1, False, 5, 0)
    assert lg.log_end_offset == end and lg.ongoing_transactions() == {7: 0}
    p.commit()  # coordinator epoch 5 seen
    p.send()
    end = lg.log_end_offset
    with pytest.raises(TransactionCoordinatorFencedError, match="coordinator epoch 4") as fenced:
        lg.append_marker_as_leader(7, 2, False, 4, 0)
    assert fenced.value.code == errors.ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert lg.log_end_offset == end and lg.ongoing_transactions() == {7: 3} and all_entries(lg) == []
    assert lg.append_marker_as_leader(7, 2, False, 6, 0).first_offset == end  # a newer coordinator is fine
    with pytest.raises(errors.InvalidRequestError):
        lg.append_marker_as_leader(-1, 0, True, 0, 0)
    lg.close()


# ---------------------------------------------------------------------------------------------- the index
def _aborts_over_segments(lg: Log, n: int) -> list[int]:
    """``n`` aborted transactions of producer 7, each in its own segment (segment.bytes small), with a producer
    8's transaction ongoing over the first three: their last stable offsets stay at its first offset."""
    p, q = Producer(lg, 7), Producer(lg, 8)
    firsts = []
    for i in range(n):
        firsts.append(p.send())
        if i == 0:
            q.send()
        p.abort()
        plain(lg, 1)
        if i == 2:
            q.commit()
    return firsts


def test_aborted_transactions_over_several_segments_stop_at_the_first_entry_reaching_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = open_log(tmp_path / "t-0", segment_bytes=400)
    firsts = _aborts_over_segments(lg, 8)
    assert len(lg.segments()) >= 5
    entries = all_entries(lg)
    assert [e.first_offset for e in entries] == firsts
    assert [e.last_stable_offset for e in entries[:3]] == [firsts[0] + 2] * 3  # producer 8's first offset
    holding = {e.last_offset: seg.base_offset for seg in lg.segments() for e in seg.txn_index.read()}
    assert all(lg.segments()[0].base_offset <= off for off in holding)
    assert len(set(holding.values())) > 1, "the entries should be spread over segments"
    every = [(7, f) for f in firsts]
    assert lg.aborted_transactions(0, lg.log_end_offset) == every
    read: list[int] = []
    real = TransactionIndex.collect

    def spy(self: TransactionIndex, start: int, upper: int):
        read.append(self.base_offset)
        return real(self, start, upper)

    monkeypatch.setattr(TransactionIndex, "collect", spy)
    # a fetch of the fifth transaction's records: the search starts at its segment and stops at its entry
    start, upper = firsts[4], firsts[4] + 2
    assert lg.aborted_transactions(start, upper) == [(7, firsts[4])]
    assert read == [holding[entries[4].last_offset]], "it read past the entry whose LSO reaches the bound"
    read.clear()
    # entries 0..2 carry producer 8's first offset as their LSO: a bound at it stops at the first entry ...
    assert lg.aborted_transactions(0, firsts[0] + 1) == [(7, firsts[0])]
    assert read == [holding[entries[0].last_offset]]
    read.clear()
    # ... a bound past it goes on to entry 3 (the first whose LSO reaches the bound), through every segment between
    assert entries[0].last_stable_offset < firsts[0] + 3 <= entries[3].last_stable_offset
    assert lg.aborted_transactions(0, firsts[0] + 3) == [(7, firsts[0])]
    assert sorted(set(read)) == sorted({holding[e.last_offset] for e in entries[:4]})
    read.clear()
    assert lg.aborted_transactions(lg.log_end_offset - 1, lg.log_end_offset) == []
    assert len(read) <= 1
    lg.close()


def test_a_large_index_is_searched_not_read_whole(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "00000000000000000000.txnindex", 0, create=True)
    n = 3 * txn_index.READ_CHUNK_ENTRIES + 17
    for i in range(n):
        idx.append(AbortedTxn(7, 3 * i, 3 * i + 2, 3 * i + 3))
    assert (tmp_path / "00000000000000000000.txnindex").stat().st_size == 34 * n
    found, complete = idx.collect(3 * 2000 + 1, 3 * 2000 + 2)
    assert found == [AbortedTxn(7, 6000, 6002, 6003)] and complete
    assert idx.truncate_to(3 * 5000 + 2) == n - 5000 and idx.entries == 5000
    assert idx.read(4999, 5) == [AbortedTxn(7, 14997, 14999, 15000)]


def _reopen(lg: Log, crash: bool) -> Log:
    path, config, hw = lg.dir, lg.config, lg.high_watermark
    if crash:
        lg.close_without_flush()
        assert not (path / SNAPSHOT_FILE).exists()
        return Log.open(path, config, high_watermark=hw)  # every segment rescanned, every index rebuilt
    lg.close()
    assert (path / SNAPSHOT_FILE).read_text().startswith("1\n")
    return Log.open(path, config, high_watermark=hw, clean_shutdown=True, recovery_point=lg.log_end_offset)


@pytest.mark.parametrize("crash", [False, True], ids=["clean-snapshot", "crash-rescan"])
def test_reopening_gives_the_same_lso_aborted_list_and_index_bytes(tmp_path: Path, crash: bool) -> None:
    lg = open_log(tmp_path / "t-0", segment_bytes=400)
    _aborts_over_segments(lg, 5)
    a = Producer(lg, 11, epoch=4, coordinator_epoch=2)
    a.send()
    a.commit()
    committed = Producer(lg, 13)
    committed.send()
    ongoing = Producer(lg, 12)
    ongoing.send()
    lg.update_high_watermark(lg.log_end_offset)
    committed.commit()  # above the high watermark: still unstable
    before, files = state_of(lg), txnindex_files(lg.dir)
    assert before[0] < lg.ongoing_transactions()[12], "the unreplicated commit should hold the LSO lower"
    coordinator = lg.producer_state.entry(11).coordinator_epoch
    lg = _reopen(lg, crash)
    assert state_of(lg) == before and txnindex_files(lg.dir) == files
    assert lg.producer_epoch(11) == 4 and lg.producer_state.entry(11).coordinator_epoch == coordinator == 2
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.first_unstable_offset == lg.ongoing_transactions()[12]
    # the state goes on as before
    ongoing.lg = lg
    ongoing.abort()
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.first_unstable_offset is None and (12, before[2][12]) in lg.aborted_transactions(0, lg.log_end_offset)
    lg.close()


def test_a_missing_index_is_rebuilt_even_after_a_clean_shutdown(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", segment_bytes=400)
    _aborts_over_segments(lg, 4)
    lg.update_high_watermark(lg.log_end_offset)
    files = txnindex_files(lg.dir)
    victim = next(name for name, data in files.items() if data)
    lg.close()
    (lg.dir / victim).unlink()
    lg = Log.open(lg.dir, lg.config, clean_shutdown=True, recovery_point=lg.log_end_offset)
    assert txnindex_files(lg.dir) == files
    lg.close()
    (lg.dir / victim).write_bytes(files[victim][:-5])  # torn: fails the sanity check
    lg = Log.open(lg.dir, lg.config, clean_shutdown=True, recovery_point=lg.log_end_offset)
    assert txnindex_files(lg.dir) == files
    lg.close()


def test_a_version_0_snapshot_still_loads_and_old_segments_get_empty_indexes(tmp_path: Path) -> None:
    """A log written before Brook had transactions: no .txnindex files, a version 0 snapshot. Nothing is
    rescanned for them (no marker can be there): they are created empty."""
    lg = open_log(tmp_path / "t-0", segment_bytes=300)
    for seq in range(0, 30, 3):
        lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=1, base_sequence=seq), 0)
    end = lg.log_end_offset
    lg.close()
    for p in lg.dir.glob("*.txnindex"):
        p.unlink()
    entry = lg.producer_state.entry(7)
    fields = " ".join(f"{b.base_seq} {b.last_seq} {b.first_offset} {b.last_offset} {b.max_timestamp}"
                      for b in entry.batches)
    (lg.dir / SNAPSHOT_FILE).write_text(f"0\n{end}\n1\n7 1 {len(entry.batches)} {fields}\n")
    scans: list[int] = []
    real = Log._scan_producer_state

    def spy(self: Log, segments, since: int) -> None:
        scans.append(since)
        real(self, segments, since)

    Log._scan_producer_state = spy  # type: ignore[method-assign]
    try:
        lg = Log.open(lg.dir, lg.config, clean_shutdown=True, recovery_point=end)
    finally:
        Log._scan_producer_state = real  # type: ignore[method-assign]
    assert scans == [end], "a version 0 snapshot must not make the whole log be scanned"
    assert lg.producer_state.snapshot_version == 0
    assert lg.producer_state.entry(7).last_seq == 29 and lg.producer_state.entry(7).last_timestamp > 0
    files = txnindex_files(lg.dir)
    assert len(files) == len(lg.segments()) and not any(files.values())
    dup = lg.append_as_leader(make_batch(3, producer_id=7, producer_epoch=1, base_sequence=27), 0)
    assert dup.duplicate
    lg.close()


# ---------------------------------------------------------------------------------------------- followers
def test_a_follower_fed_the_leaders_bytes_has_the_same_state_and_index_bytes(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader" / "t-0", segment_bytes=500)
    _aborts_over_segments(leader, 5)
    Producer(leader, 20, epoch=3).send()
    leader.append_marker_as_leader(21, 0, True, 0, 0)  # nothing ongoing: completes nothing
    leader.update_high_watermark(leader.log_end_offset)
    follower = open_log(tmp_path / "follower" / "t-0", segment_bytes=500)
    for _pos, h in iter_batches(read_all(leader)):  # one batch per fetch, as the leader appended them
        follower.append_as_follower(leader.read(h.base_offset, 1, min_one_batch=True).records)
    follower.update_high_watermark(leader.high_watermark)
    assert [s.base_offset for s in follower.segments()] == [s.base_offset for s in leader.segments()]
    assert state_of(follower) == state_of(leader)
    assert txnindex_files(follower.dir) == txnindex_files(leader.dir)
    assert follower.producer_epoch(20) == 3 and follower.producer_epoch(21) == 0
    # whole fetches too (several batches per append): the same entries
    whole = open_log(tmp_path / "whole" / "t-0")
    whole.append_as_follower(read_all(leader))
    whole.update_high_watermark(leader.high_watermark)
    assert state_of(whole)[:4] == state_of(leader)[:4] and all_entries(whole) == all_entries(leader)
    for lg in (leader, follower, whole):
        lg.close()


def test_truncation_reopens_a_transaction_whose_marker_was_cut_and_drops_index_entries(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    a, b = Producer(lg, 7), Producer(lg, 8)
    a.send()  # 0..1
    b.send()  # 2..3
    a.commit()  # 4
    b.abort()  # 5
    a.send()  # 6..7: a's next transaction
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.ongoing_transactions() == {7: 6} and all_entries(lg) == [AbortedTxn(8, 2, 5, 6)]
    lg.truncate_to(5)  # b's abort cut (a follower of a leader that never wrote it), and a's second transaction
    assert lg.ongoing_transactions() == {8: 2} and lg.first_unstable_offset == 2
    assert all_entries(lg) == [] and lg.aborted_transactions(0, 5) == []
    lg.truncate_to(4)  # a's commit too: undecided again
    assert lg.ongoing_transactions() == {7: 0, 8: 2} and lg.first_unstable_offset == 0
    assert lg.last_stable_offset == 0 and lg.high_watermark == 4
    # the new leader's markers come: both aborted
    lg.append_as_follower(build_control_batch(False, producer_id=8, producer_epoch=0, timestamp_ms=now_ms(),
                                              base_offset=4))
    lg.append_as_follower(build_control_batch(False, producer_id=7, producer_epoch=0, timestamp_ms=now_ms(),
                                              base_offset=5))
    assert all_entries(lg) == [AbortedTxn(8, 2, 4, 0), AbortedTxn(7, 0, 5, 6)]
    assert lg.aborted_transactions(0, 6) == [(8, 2), (7, 0)]
    lg.close()


def test_truncation_below_what_producer_state_remembers_rebuilds_it_from_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = open_log(tmp_path / "t-0")
    p = Producer(lg, 7)
    first = p.send()
    cut = p.commit()
    for _ in range(TXN_HISTORY + 1):  # its first commit falls out of its history
        p.send()
        p.abort()
    assert lg.producer_state.entry(7).history_from > cut
    scans: list[int] = []
    real = Log._scan_producer_state
    monkeypatch.setattr(Log, "_scan_producer_state", lambda self, segs, since: (scans.append(since),
                                                                                 real(self, segs, since)))
    lg.truncate_to(cut)
    assert scans == [0] and lg.ongoing_transactions() == {7: first} and all_entries(lg) == []
    lg.close()

    # a producer forgotten (by the cap) whose marker is cut: the same
    lg = open_log(tmp_path / "f-0")
    lg.producer_state.max_producers = 2
    p = Producer(lg, 7)
    first = p.send()
    cut = p.commit()
    for pid in (1, 2, 3):
        lg.append_as_leader(make_batch(1, producer_id=pid, producer_epoch=0, base_sequence=0), 0)
    assert lg.producer_state.entry(7) is None
    scans.clear()
    lg.truncate_to(cut)
    assert scans == [0] and lg.ongoing_transactions() == {7: first} and lg.first_unstable_offset == first
    lg.close()


# ---------------------------------------------------------------------------------------------- never forgotten
def test_the_cap_expiry_and_the_process_budget_never_forget_a_producer_in_a_transaction(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    lg.producer_state.max_producers = 2
    old = now_ms() - 10 * DAY_MS
    lg.append_as_leader(txn_batch(7, 0, ts=old), 0, transactional=True)
    lg.append_as_leader(make_batch(1, producer_id=6, producer_epoch=0, base_sequence=0, ts=old), 0)
    for pid in range(100, 110):
        lg.append_as_leader(make_batch(1, producer_id=pid, producer_epoch=0, base_sequence=0), 0)
    assert lg.producer_state.entry(7) is not None and lg.producer_state.entry(6) is None
    assert len(lg.producer_state) == 2 and lg.ongoing_transactions() == {7: 0}
    assert lg.remove_expired_producers(now_ms(), DAY_MS) == 0  # producer 7 is ten days quiet, but undecided
    assert lg.producer_state.entry(7) is not None and lg.first_unstable_offset == 0
    lg.append_marker_as_leader(7, 0, False, 0, 0, now_ms=old)  # its marker is as old
    assert lg.remove_expired_producers(now_ms(), DAY_MS) == 1 and lg.producer_state.entry(7) is None
    lg.close()

    budget = ProducerBudget(max_producers=3)
    ps = ProducerStateManager(budget=budget)
    ps.update(_header(7, transactional=True), 0)
    for pid in range(50):
        ps.update(_header(1000 + pid), 1 + pid)
    assert ps.entry(7) is not None and ps.entry(1049) is not None and ps.ongoing() == {7: 0}
    assert len(ps) <= 3 and budget.forgotten > 0
    # every producer in a transaction: over the bound, none forgotten
    ps = ProducerStateManager(max_producers=3, budget=ProducerBudget(max_producers=3))
    for pid in range(6):
        ps.update(_header(pid, transactional=True), pid)
    assert len(ps) == 6 and ps.ongoing() == {pid: pid for pid in range(6)}


def _header(pid: int, *, transactional: bool = False) -> BatchHeader:
    return BatchHeader(base_offset=0, batch_length=70, partition_leader_epoch=0, magic=2, crc=0,
                       attributes=ATTR_TRANSACTIONAL if transactional else 0, last_offset_delta=0, base_timestamp=0,
                       max_timestamp=now_ms(), producer_id=pid, producer_epoch=0, base_sequence=0, record_count=1)


# ---------------------------------------------------------------------------------------------- log start, retention
def test_the_lso_never_goes_below_the_log_start(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0")
    Producer(lg, 7).send()  # 0..1, undecided
    plain(lg)  # 2..4
    lg.update_high_watermark(lg.log_end_offset)
    lg.set_log_start_offset(3)  # DeleteRecords
    assert lg.first_unstable_offset == 3 and lg.last_stable_offset == 3
    assert lg.ongoing_transactions() == {7: 0}
    lg.close()


def test_retention_deletes_a_segments_index_with_it(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", segment_bytes=400, file_delete_delay_ms=0, retention_bytes=0)
    _aborts_over_segments(lg, 4)
    first = lg.segments()[0]
    path = first.txn_index.path
    assert path.stat().st_size > 0
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.delete_old_segments() >= 1
    assert not path.exists() and not list(lg.dir.glob("*.deleted"))
    assert {p.name for p in lg.dir.glob("*.txnindex")} == {s.txn_index.path.name for s in lg.segments()}
    assert all(f >= lg.log_start_offset or last >= lg.log_start_offset
               for f, last in ((e.first_offset, e.last_offset) for e in all_entries(lg)))
    lg.close()


# ---------------------------------------------------------------------------------------------- the cleaner
def _compacted_with_aborts(tmp_path: Path) -> Log:
    lg = open_log(tmp_path / "c-0", segment_bytes=600, cleanup_policy=("compact",))
    p, q = Producer(lg, 7), Producer(lg, 8)
    for i in range(6):
        for _ in range(3):
            lg.append_as_leader(make_batch(1, keys=[b"key-%d" % (i % 2)], values=[b"x" * 40]), 0)
        p.send()
        (p.abort if i % 2 else p.commit)()
        if i == 1:
            q.send()
        if i == 4:
            q.abort()
    plain(lg, 1)
    lg.roll()
    plain(lg, 1)
    lg.update_high_watermark(lg.log_end_offset)
    return lg


def committed_view(lg: Log) -> dict[bytes, tuple[int, bytes | None]]:
    """Each key's latest record as a read_committed reader of the whole log sees it (the client's own filter):
    offset and value."""
    data = read_all(lg, lg.last_stable_offset)
    keep = AbortedFilter(lg.aborted_transactions(lg.log_start_offset, lg.last_stable_offset))
    view: dict[bytes, tuple[int, bytes | None]] = {}
    for pos, h in iter_batches(data):
        if keep.keep(data, pos, h):
            for rec in decode_batch(data, pos)[1]:
                view[rec.key] = (rec.offset, rec.value)
    return view


def all_records(lg: Log) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every data record in the log, aborted or not."""
    data = read_all(lg)
    return [(r.offset, r.value) for pos, h in iter_batches(data) if not h.attributes & ATTR_CONTROL
            for r in decode_batch(data, pos)[1]]


def markers(lg: Log) -> list[int]:
    data = read_all(lg)
    return [h.base_offset for _pos, h in iter_batches(data) if h.attributes & ATTR_CONTROL]


def _reopened(lg: Log, crash: bool) -> Log:
    lg.close()
    if crash:  # producer state and indexes found again from the segments
        for path in lg.dir.glob("*.snapshot"):
            path.unlink()
        return Log.open(lg.dir, lg.config, recovery_point=0, high_watermark=lg.log_end_offset)
    return Log.open(lg.dir, lg.config, clean_shutdown=True, recovery_point=lg.log_end_offset,
                    high_watermark=lg.log_end_offset)


@pytest.mark.parametrize("crash", [False, True])
def test_the_cleaner_removes_aborted_records_and_keeps_the_entries_of_those_left(tmp_path: Path,
                                                                                  crash: bool) -> None:
    lg = _compacted_with_aborts(tmp_path)
    view = committed_view(lg)
    assert len(all_entries(lg)) == 4
    stats = LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    assert stats.segments_cleaned >= 2 and stats.records_kept < stats.records_read
    # the aborted records all went; each producer's last batch leaves a batch of no records (its sequence lives
    # there): producer 8's only transaction and producer 7's last keep their markers and index entries
    assert stats.aborted_dropped == 8
    assert [(e.producer_id, e.first_offset) for e in all_entries(lg)] == [(8, 12), (7, 36)]
    assert lg.aborted_transactions(lg.log_start_offset, lg.log_end_offset) == [(8, 12), (7, 36)]
    assert committed_view(lg) == view
    for seg in lg.segments():  # each entry is in the segment holding its marker
        assert all(seg.base_offset <= e.last_offset < seg.next_offset for e in seg.txn_index.read())
    state, files = state_of(lg), txnindex_files(lg.dir)
    assert state[:3] == (None, lg.log_end_offset, {})
    lg = _reopened(lg, crash)
    assert state_of(lg) == state and txnindex_files(lg.dir) == files and committed_view(lg) == view
    lg.close()


def test_an_aborted_record_never_hides_the_committed_record_of_its_key(tmp_path: Path) -> None:
    """The offset map used to take an aborted record's key: the committed record before it went, and
    read_committed readers lost the key's value."""
    lg = open_log(tmp_path / "c-0", segment_bytes=10_000, cleanup_policy=("compact",))
    lg.append_as_leader(make_batch(1, keys=[b"mine"], values=[b"committed"]), 0)
    p = Producer(lg, 7)
    lg.append_as_leader(txn_records(7, 0, [(b"mine", b"aborted")]), 0, transactional=True)
    p.seq = 1
    p.abort()
    p.send()  # the producer's last batch is another one: the aborted one may go
    p.commit()
    lg.roll()
    plain(lg, 1)
    lg.update_high_watermark(lg.log_end_offset)
    assert committed_view(lg)[b"mine"] == (0, b"committed")
    stats = LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    assert committed_view(lg).get(b"mine") == (0, b"committed")
    assert stats.aborted_dropped == 1
    assert b"aborted" not in [v for _o, v in all_records(lg)]
    assert all_entries(lg) == []  # nothing of the abort is left to skip
    lg.close()


def test_a_committed_transaction_is_compacted_and_its_marker_goes_after_delete_retention(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "c-0", segment_bytes=10_000, cleanup_policy=("compact",), delete_retention_ms=DAY_MS)
    p = Producer(lg, 7)
    for i in range(5):  # the same two keys, committed five times (TxnOffsetCommit's pattern)
        info = lg.append_as_leader(txn_records(7, p.seq, [(b"a", b"a%d" % i), (b"b", b"b%d" % i)]), 0,
                                   transactional=True)
        p.seq += 2
        assert info.first_offset == 3 * i
        p.commit()
    lg.roll()
    plain(lg, 1)
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    stats = cleaner.clean_log(lg)
    # the last transaction's batch is kept (and it is the producer's last): its marker stays for good; the other
    # four batches went, their markers stay for delete.retention.ms
    assert [o for o, _v in all_records(lg)] == [12, 13, 15]
    assert markers(lg) == [2, 5, 8, 11, 14]
    assert stats.markers_kept == 4 and stats.markers_dropped == 0
    assert cleaner.tombstones_due(lg, now_ms() + DAY_MS + 60_000)  # a pass is due once they may go
    stats = cleaner.clean_log(lg, now_ms() + DAY_MS + 60_000)
    assert stats.markers_dropped == 4 and markers(lg) == [14]
    assert {k: v for k, (_o, v) in committed_view(lg).items() if k in (b"a", b"b")} == {b"a": b"a4", b"b": b"b4"}
    lg = _reopened(lg, True)  # a replica rebuilding its state from these bytes finds no open transaction
    assert lg.ongoing_transactions() == {} and lg.last_stable_offset == lg.log_end_offset
    lg.close()


def test_a_marker_stays_while_a_record_of_its_transaction_does(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "c-0", segment_bytes=10_000, cleanup_policy=("compact",), delete_retention_ms=0)
    p = Producer(lg, 7)
    p.send()  # keys key-7-0, key-7-1: never written again
    p.commit()
    lg.append_as_leader(make_batch(1, producer_id=9, producer_epoch=0, base_sequence=0, keys=[b"x"]), 0)
    p.send()  # the producer's last batch, kept whole
    p.commit()
    lg.roll()
    plain(lg, 1)
    lg.update_high_watermark(lg.log_end_offset)
    stats = LogCleaner(lambda: {("c", 0): lg}).clean_log(lg, now_ms() + 60_000)
    assert stats.markers_dropped == 0 and markers(lg) == [2, 6]
    lg = _reopened(lg, True)
    assert lg.ongoing_transactions() == {} and lg.last_stable_offset == lg.log_end_offset
    lg.close()


def test_an_undecided_transaction_stops_the_cleaner_at_its_first_offset(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "c-0", segment_bytes=200, cleanup_policy=("compact",))
    for _ in range(4):
        lg.append_as_leader(make_batch(1, keys=[b"k"]), 0)
    Producer(lg, 7).send()  # ongoing
    start = lg.log_end_offset - 2
    for _ in range(6):
        lg.append_as_leader(make_batch(1, keys=[b"k"]), 0)
    lg.roll()
    plain(lg, 1)
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.last_stable_offset == start
    cleaner = LogCleaner(lambda: {("c", 0): lg})
    stats = cleaner.clean_log(lg)
    assert stats.end_offset <= start
    assert [o for o, _v in all_records(lg) if o >= start][:2] == [start, start + 1]


def test_a_producer_whose_epoch_has_only_markers_keeps_them(tmp_path: Path) -> None:
    """A coordinator's abort that bumped the producer's epoch (a timeout) is all that says the epoch: a replica
    rebuilding state from the cleaned log must still know it, as Kafka's cleaner keeps such a marker."""
    lg = open_log(tmp_path / "c-0", segment_bytes=10_000, cleanup_policy=("compact",), delete_retention_ms=0)
    Producer(lg, 7).send()
    Producer(lg, 7, epoch=1).abort()
    lg.roll()
    plain(lg, 1)
    lg.update_high_watermark(lg.log_end_offset)
    stats = LogCleaner(lambda: {("c", 0): lg}).clean_log(lg, now_ms() + 60_000)
    assert stats.aborted_dropped == 2 and markers(lg) == [2] and all_entries(lg) == []
    lg = _reopened(lg, True)
    assert lg.producer_epoch(7) == 1 and lg.ongoing_transactions() == {}
    lg.close()


def test_a_swap_interrupted_by_a_crash_keeps_the_index_of_the_swapped_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lg = _compacted_with_aborts(tmp_path)
    LogCleaner(lambda: {("c", 0): lg}).clean_log(lg)
    before = state_of(lg)
    cleaned = next(seg for seg in lg.segments() if seg.txn_index.entries)
    entries = cleaned.txn_index.read()
    end = lg.log_end_offset
    lg.close()
    base = cleaned.base_offset
    # the crash came after the cleaned files were renamed .swap, before the old segment went: the old segment's
    # files still have their names (here an index with another entry)
    for suffix in (".log", ".txnindex"):
        os.replace(lg.dir / f"{base:020d}{suffix}", lg.dir / f"{base:020d}{suffix}.swap")
    (lg.dir / f"{base:020d}.log").write_bytes(b"")
    (lg.dir / f"{base:020d}.txnindex").write_bytes(txn_index.encode([AbortedTxn(99, base, base, base + 1)]))
    (lg.dir / f"{99999:020d}.txnindex.swap").write_bytes(b"")  # an orphan: its log never became a swap
    rebuilt: list[int] = []  # the swapped segment's index must be moved in, not found again by a scan
    real = TransactionIndex.replace
    monkeypatch.setattr(TransactionIndex, "replace", lambda self, e: (rebuilt.append(self.base_offset),
                                                                       real(self, e)))
    lg = Log.open(lg.dir, lg.config, recovery_point=end, high_watermark=end)
    assert base not in rebuilt
    [swapped] = [seg for seg in lg.segments() if seg.base_offset == base]
    assert swapped.txn_index.read() == entries
    assert state_of(lg) == before
    assert not list(lg.dir.glob("*.swap"))
    lg.close()
    # the crash came while the swap took its final names: the index renamed already, the log not yet
    lg = open_log(tmp_path / "c-0", segment_bytes=600, cleanup_policy=("compact",))
    lg.close()
    os.replace(lg.dir / f"{base:020d}.log", lg.dir / f"{base:020d}.log.swap")
    rebuilt.clear()
    lg = Log.open(lg.dir, lg.config, recovery_point=end, high_watermark=end)
    assert base not in rebuilt
    [swapped] = [seg for seg in lg.segments() if seg.base_offset == base]
    assert swapped.txn_index.read() == entries and state_of(lg) == before
    lg.close()


class _Model:
    """What a read_committed reader must find in a compacted log: each key's latest committed record."""

    def __init__(self) -> None:
        self.latest: dict[bytes, tuple[int, bytes | None]] = {}
        self.open: dict[int, list[tuple[int, bytes, bytes | None]]] = {}  # producer -> its transaction's records

    def write(self, offset: int, key: bytes, value: bytes | None, pid: int | None = None) -> None:
        if pid is None:
            self.latest[key] = (offset, value)
        else:
            self.open.setdefault(pid, []).append((offset, key, value))

    def end(self, pid: int, commit: bool) -> None:
        records = self.open.pop(pid, [])
        for offset, key, value in records if commit else ():
            if offset > self.latest.get(key, (-1, None))[0]:
                self.latest[key] = (offset, value)

    def check(self, lg: Log, seed: int) -> None:
        view = committed_view(lg)
        stable = lg.last_stable_offset
        for key, (offset, value) in self.latest.items():
            if offset >= stable:
                continue
            got = view.get(key)
            if value is None:  # a tombstone may have gone, with every older record of its key
                assert got in (None, (offset, None)), (seed, key, got, offset)
            else:
                assert got == (offset, value), (seed, key, got, offset, value)
        assert {k for k, (o, _v) in view.items() if o < stable} <= set(self.latest), seed


# 54, 86, 292: an abort whose first batches an earlier pass removed (it ended inside the transaction) begins in a
# gap between segments; the pass that took aborts by first offset missed it and kept its records as committed.
@pytest.mark.parametrize("seed", [*range(30), 54, 86, 292])
def test_compaction_of_random_transactions_keeps_what_read_committed_readers_see(tmp_path: Path, seed: int) -> None:
    """Plain, idempotent and transactional writes to a few keys, commits, aborts, coordinator aborts that bump an
    epoch and tombstones, cleaned at random points with small maps and segments, now or past delete.retention.ms:
    every key's latest committed record stays where it was, a replica rebuilding state from the cleaned bytes finds
    the same open transactions and last stable offset, and once every transaction is decided and past
    delete.retention.ms no aborted record is left but in a producer's last batch."""
    rng = random.Random(seed)
    lg = open_log(tmp_path / "c-0", segment_bytes=rng.choice([300, 600, 1500]), cleanup_policy=("compact",),
                  delete_retention_ms=DAY_MS)
    cleaner = LogCleaner(lambda: {("c", 0): lg}, max_map_entries=rng.choice([3, 8, 50]))
    keys = [b"k%d" % i for i in range(6)]
    producers = {pid: Producer(lg, pid) for pid in (1, 2, 3)}
    idempotent_seq = 0
    model = _Model()

    def value() -> bytes | None:
        return None if rng.random() < 0.1 else b"v%d" % rng.randrange(10**6)

    for _step in range(300):
        r = rng.random()
        if r < 0.2:
            k, v = rng.choice(keys), value()
            model.write(lg.append_as_leader(make_batch(1, keys=[k], values=[v]), 0).first_offset, k, v)
        elif r < 0.3:
            k, v = rng.choice(keys), value()
            info = lg.append_as_leader(make_batch(1, keys=[k], values=[v], producer_id=9, producer_epoch=0,
                                                  base_sequence=idempotent_seq), 0)
            idempotent_seq += 1
            model.write(info.first_offset, k, v)
        elif r < 0.7:
            p = rng.choice(list(producers.values()))
            recs = [(rng.choice(keys), value()) for _ in range(rng.randint(1, 3))]
            first = lg.append_as_leader(txn_records(p.pid, p.seq, recs, epoch=p.epoch), 0,
                                        transactional=True).first_offset
            p.seq += len(recs)
            for i, (k, v) in enumerate(recs):
                model.write(first + i, k, v, p.pid)
        elif r < 0.93:
            p = rng.choice([p for p in producers.values() if p.pid in model.open] or list(producers.values()))
            commit = rng.random() < 0.6
            p.end(commit)
            model.end(p.pid, commit)
        else:  # the coordinator times the transaction out: an abort with the next epoch
            p = rng.choice(list(producers.values()))
            p.epoch, p.seq = p.epoch + 1, 0
            p.abort()
            model.end(p.pid, False)
        if rng.random() < 0.08:
            lg.update_high_watermark(lg.log_end_offset)
            cleaner.clean_log(lg, now_ms() + (DAY_MS + 60_000 if rng.random() < 0.5 else 0))
            model.check(lg, seed)
            if rng.random() < 0.3:
                lso, ongoing = lg.last_stable_offset, lg.ongoing_transactions()
                lg = _reopened(lg, crash=True)
                assert (lg.last_stable_offset, lg.ongoing_transactions()) == (lso, ongoing), seed
                for p in producers.values():
                    p.lg = lg
    for p in producers.values():  # every transaction decided, each producer's last batch a committed one
        if p.pid in model.open:
            p.commit()
            model.end(p.pid, True)
        first = lg.append_as_leader(txn_records(p.pid, p.seq, [(b"last", b"%d" % p.pid)], epoch=p.epoch), 0,
                                    transactional=True).first_offset
        p.seq += 1
        model.write(first, b"last", b"%d" % p.pid, p.pid)
        p.commit()
        model.end(p.pid, True)
    lg.roll()
    plain(lg, 1)
    model.write(lg.log_end_offset - 1, b"k", b"A" * 50)  # plain() writes key b"k"
    lg.update_high_watermark(lg.log_end_offset)
    later = now_ms() + DAY_MS + 60_000
    for _ in range(300):  # small maps take several passes
        stats = cleaner.clean_log(lg, later)
        if stats.end_offset <= stats.first_dirty_offset:
            break
    cleaner.clean_log(lg, later)
    model.check(lg, seed)
    assert lg.aborted_transactions(lg.log_start_offset, lg.log_end_offset) == [], seed
    data = read_all(lg)
    batches = [h for _pos, h in iter_batches(data)]
    txn_data = [h for h in batches if h.attributes & ATTR_TRANSACTIONAL and not h.attributes & ATTR_CONTROL]
    # a marker stays only with records of its transaction
    assert sum(1 for h in batches if h.attributes & ATTR_CONTROL) <= len(txn_data), seed
    lg = _reopened(lg, crash=True)
    assert lg.ongoing_transactions() == {} and lg.last_stable_offset == lg.log_end_offset, seed
    model.check(lg, seed)
    lg.close()


# ---------------------------------------------------------------------------------------------- concurrency
def test_aborted_transactions_read_safely_while_appends_truncations_and_retention_go_on(tmp_path: Path) -> None:
    lg = open_log(tmp_path / "t-0", segment_bytes=300, file_delete_delay_ms=0, retention_bytes=2000)
    stop = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                start = lg.log_start_offset
                found = lg.aborted_transactions(start, lg.log_end_offset + 1)
                assert all(pid == 7 for pid, _f in found)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        p = Producer(lg, 7)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            p.send(1)
            p.abort()
            lg.update_high_watermark(lg.log_end_offset)
            lg.delete_old_segments()
            if p.seq % 20 == 0:
                lg.truncate_to(lg.log_end_offset - 1)  # cut the last abort
                p.abort()
    finally:
        stop.set()
        t.join()
    assert not failures, failures[0]
    assert lg.aborted_transactions(lg.log_start_offset, lg.log_end_offset)
    lg.close()


def test_a_verification_is_void_once_a_marker_of_its_producer_was_written(tmp_path: Path) -> None:
    """KIP-890's guard: the leader takes the producer's marker mark, asks the coordinator, then appends. A marker
    written in between (the transaction ended meanwhile) must make the batch that would open a transaction be
    refused: it would open one no coordinator knows of, and hold the last stable offset below it for good."""
    lg = open_log(tmp_path / "t-0")
    mark = lg.marker_mark(7)
    assert mark == -1
    lg.append_as_leader(txn_batch(7, 0), 0, transactional=True, verified={7: mark})  # opens the transaction
    before_end = lg.marker_mark(7)
    lg.append_marker_as_leader(7, 0, True, 0, 0)  # the transaction ended while a late batch was being verified
    lg.update_high_watermark(lg.log_end_offset)
    end = lg.log_end_offset
    with pytest.raises(InvalidTxnStateError, match="ended since"):
        lg.append_as_leader(txn_batch(7, 2), 0, transactional=True, verified={7: before_end})
    with pytest.raises(InvalidTxnStateError, match="not verified"):
        lg.append_as_leader(txn_batch(7, 2), 0, transactional=True, verified={})
    assert lg.log_end_offset == end and lg.ongoing_transactions() == {}
    assert lg.last_stable_offset == end
    # verified after the marker: the next transaction opens
    lg.append_as_leader(txn_batch(7, 2), 0, transactional=True, verified={7: lg.marker_mark(7)})
    assert lg.ongoing_transactions() == {7: end}
    # and its later batches need no new verification (the transaction is open here)
    lg.append_as_leader(txn_batch(7, 4), 0, transactional=True, verified={})
    lg.close()
