"""Offsets committed within a transaction (TxnOffsetCommit) as the group coordinator keeps them: written to
``__consumer_offsets`` as the producer's transactional batch, invisible until the transaction's COMMIT marker,
dropped with its ABORT marker, and so again when the next coordinator loads the partition from the log (real logs).
A marker written while the partition loads is applied once the load is published."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from leader_logs import LeaderLogs
from topics_cache import TopicsCache

from broker import group_records as records
from broker.group_coordinator import CoordinatorConfig, GroupCoordinator, _PartitionLoad
from client.types import TopicPartition
from proto.common_pb2 import ErrorCode
from storage.cleaner import LogCleaner
from storage.record_batch import ATTR_CONTROL, iter_batches

TP = TopicPartition("t", 0)
PID, EPOCH = 42, 0


class Disk(LeaderLogs):
    """__consumer_offsets-0, led here; the markers a transaction coordinator would write there."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, (records.OFFSETS_TOPIC, 0), overrides={"cleanup.policy": "compact"})
        self.log = self.logs[(records.OFFSETS_TOPIC, 0)]

    def marker(self, commit: bool) -> None:
        self.log.append_marker_as_leader(PID, EPOCH, commit, 0, 0)
        self.log.update_high_watermark(self.log.log_end_offset)


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path / "data")
    try:
        yield d
    finally:
        d.close()


def coordinator(disk: Disk, epoch: int, *, load: bool = True) -> GroupCoordinator:
    c = GroupCoordinator(node_id=epoch, replica_manager=disk, metadata_cache=TopicsCache({"t": 2}),
                         config=CoordinatorConfig(offsets_topic_num_partitions=1), clock_ms=lambda: 1_000_000)
    c._partitions[0] = _PartitionLoad(leader_epoch=epoch)
    if load:
        c._load_partition(0, epoch)
    return c


def committed(c: GroupCoordinator) -> int | None:
    [(_, entry)] = c.fetch_offsets("g", [TP])
    return None if entry is None else entry.offset


def commit_in_txn(c: GroupCoordinator, disk: Disk, offset: int) -> None:
    marks = {PID: disk.log.marker_mark(PID)}
    got = c.txn_commit_offsets("g", PID, EPOCH, "", -1, "", [(TP, offset, -1, "")], lambda p: (ErrorCode.NONE, marks))
    assert got == [("t", 0, ErrorCode.NONE)]


def test_offsets_of_a_transaction_show_at_its_commit_and_go_with_its_abort(disk: Disk) -> None:
    c = coordinator(disk, 1)
    commit_in_txn(c, disk, 5)
    assert committed(c) is None and c.unstable_offsets("g") == {TP}
    disk.marker(commit=True)
    c.on_marker(records.OFFSETS_TOPIC, 0, PID, True, disk.log.log_end_offset - 1)
    assert committed(c) == 5 and c.unstable_offsets("g") == set()
    commit_in_txn(c, disk, 9)
    disk.marker(commit=False)
    c.on_marker(records.OFFSETS_TOPIC, 0, PID, False, disk.log.log_end_offset - 1)
    assert committed(c) == 5 and c.unstable_offsets("g") == set()
    # the next coordinator reads the same from the log: committed 5, aborted 9 gone, nothing pending
    nxt = coordinator(disk, 2)
    assert committed(nxt) == 5 and nxt.unstable_offsets("g") == set()


def test_the_next_coordinator_keeps_offsets_pending_until_their_marker(disk: Disk) -> None:
    c = coordinator(disk, 1)
    commit_in_txn(c, disk, 7)
    nxt = coordinator(disk, 2)  # the partition moved before the transaction ended
    assert committed(nxt) is None and nxt.unstable_offsets("g") == {TP}
    disk.marker(commit=True)
    nxt.on_marker(records.OFFSETS_TOPIC, 0, PID, True, disk.log.log_end_offset - 1)
    assert committed(nxt) == 7


def test_a_marker_written_while_the_partition_loads_is_applied_after_the_load(disk: Disk) -> None:
    c = coordinator(disk, 1)
    commit_in_txn(c, disk, 3)
    nxt = coordinator(disk, 2, load=False)  # leading, not loaded yet
    # A marker appended past the log end the load reads up to: told here while the load runs, not in what it reads.
    nxt.on_marker(records.OFFSETS_TOPIC, 0, PID, True, disk.log.log_end_offset)
    nxt._load_partition(0, 2)
    assert committed(nxt) == 3 and nxt.unstable_offsets("g") == set()


def test_transactional_commits_are_compacted_away_and_the_next_coordinator_reads_the_last(disk: Disk) -> None:
    """Every TxnOffsetCommit is a transactional batch and a marker in ``__consumer_offsets``: the cleaner must take
    the superseded ones, aborted ones and, after delete.retention.ms, their markers, or the partition grows with
    every transaction a consume-transform-produce application commits."""
    c = coordinator(disk, 1)
    for i in range(201):  # the last one aborted
        commit_in_txn(c, disk, i)
        commit = i % 3 != 2
        disk.marker(commit=commit)
        c.on_marker(records.OFFSETS_TOPIC, 0, PID, commit, disk.log.log_end_offset - 1)
    assert committed(c) == 199
    lg = disk.log
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    before = sum(seg.size for seg in lg.segments())
    later = 1_000_000_000_000_000
    LogCleaner(lambda: {(records.OFFSETS_TOPIC, 0): lg}).clean_log(lg, later)
    batches = [h for seg in lg.segments() for _pos, h in iter_batches(seg.log_path.read_bytes())]
    # the last transaction (aborted, the producer's last batch: kept whole with its marker) and the last
    # committed one's offset with its marker
    assert len(batches) <= 5, [(h.base_offset, bool(h.attributes & ATTR_CONTROL)) for h in batches]
    assert sum(seg.size for seg in lg.segments()) < before / 20
    nxt = coordinator(disk, 2)
    assert committed(nxt) == 199 and nxt.unstable_offsets("g") == set()
