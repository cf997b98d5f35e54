"""A group coordinator whose disk refuses to read ``__consumer_offsets`` fails its log directory.

Found with real EIO faults (tests/faults/test_disk_faults.py): the load of the groups warned and gave
up, so the broker kept leading the partition while answering its groups' members NOT_COORDINATOR,
and FindCoordinator sent them back to it until some other event moved the leadership. A read the
disk refuses now fails the log directory (the broker's handler then stops the broker), as every
other read or write of a failed disk does.

A batch whose bytes changed on disk (it fails its CRC) is the replica manager's to judge, as for a
fetch (``ReplicaManager.corrupt_batch_found``). With other replicas in sync, the leader marks it to be
cut and fetched back and fails its directory: they take the groups over. It used to fail the directory
without the mark, so the batch was still there when the broker led the partition again, and the load
stopped the broker again. As the only replica in sync it failed the directory too, at every start:
the load now goes on past the batch and the broker keeps serving."""

from __future__ import annotations

import errno
import functools
import os
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from broker.group_coordinator import CoordinatorConfig, GroupCoordinator, _PartitionLoad
from broker.group_records import OFFSETS_TOPIC, encode_offset_value, offset_key
from broker.group_state import OffsetEntry
from broker.replica_manager import ReplicaManager
from client.types import TopicPartition
from proto import errors
from storage import segment
from storage.log import RESCAN_FROM_FILE
from storage.log_manager import LogManager
from storage.record_batch import RecordBatchBuilder, iter_batches
from storage.segment import CorruptBatchError


def test_a_load_the_disk_refuses_fails_the_log_directory(tmp_path: Path) -> None:
    failed: list[tuple[Path, OSError]] = []
    lm = LogManager([tmp_path / "data"], on_dir_failure=lambda d, e: failed.append((d, e)))
    try:
        lg = lm.get_or_create_log(OFFSETS_TOPIC, 0, topic_id="T", overrides={})
        b = RecordBatchBuilder()
        b.append(0, b"k", b"v")
        lg.append_as_leader(b.build(), 0)
        hosted = SimpleNamespace(is_leader=True, log=lg)
        rm = SimpleNamespace(partition=lambda t, p: hosted if (t, p) == (OFFSETS_TOPIC, 0) else None,
                             log_manager=lm)
        coord = GroupCoordinator(node_id=1, replica_manager=rm, metadata_cache=None,
                                 config=CoordinatorConfig(offsets_topic_num_partitions=1))
        try:
            coord._partitions[0] = _PartitionLoad(leader_epoch=3)

            def refuse(fd: int, n: int, pos: int) -> bytes:
                raise OSError(errno.EIO, os.strerror(errno.EIO))

            with mock.patch.object(segment.os, "pread", refuse):
                coord._load_partition(0, 3)
        finally:
            coord._loader.shutdown()
        assert [d for d, _ in failed] == [tmp_path / "data"], f"failed dirs: {failed}"
        assert failed[0][1].errno == errno.EIO
        assert lm.failed_dirs == {tmp_path / "data"}
    finally:
        lm.shutdown()


def _commit_batches(lg, commits: list[tuple[str, int]]) -> None:
    """One batch per (group, offset) commit of partition t-0."""
    for group, offset in commits:
        b = RecordBatchBuilder()
        b.append(0, offset_key(group, TopicPartition("t", 0)), encode_offset_value(OffsetEntry(offset, -1, "", 0)))
        lg.append_as_leader(b.build(), 0)
    lg.flush()


def _flip_last_byte_of_batch(lg, index: int) -> int:
    """Flip the last byte (a value byte) of the ``index``-th batch of the log's only segment; its base offset."""
    path = lg.segments()[0].log_path
    pos, h = list(iter_batches(path.read_bytes()))[index]
    with open(path, "r+b") as f:
        f.seek(pos + h.size - 1)
        byte = f.read(1)
        f.seek(pos + h.size - 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    return h.base_offset


def _leading_coordinator(lm: LogManager, lg, isr: tuple[int, ...]) -> GroupCoordinator:
    """Broker 1's coordinator, leading __consumer_offsets-0 (``lg``) with ``isr``; a corrupt batch is judged by the
    replica manager's own rule, on a stand-in holding only what that rule reads."""
    hosted = SimpleNamespace(topic=OFFSETS_TOPIC, partition=0, is_leader=True, log=lg, isr=isr)
    judge = functools.partial(ReplicaManager.corrupt_batch_found,
                              SimpleNamespace(node_id=1, _corrupt_reported=set(), log_manager=lm))
    rm = SimpleNamespace(partition=lambda t, p: hosted if (t, p) == (OFFSETS_TOPIC, 0) else None,
                         log_manager=lm, corrupt_batch_found=judge)
    return GroupCoordinator(node_id=1, replica_manager=rm, metadata_cache=None,
                            config=CoordinatorConfig(offsets_topic_num_partitions=1))


@pytest.mark.parametrize("others_in_sync", [False, True], ids=["only-replica-in-sync", "others-in-sync"])
def test_a_corrupt_batch_in_the_load_is_judged_as_a_fetch_judges_it(tmp_path: Path, others_in_sync: bool) -> None:
    failed: list[tuple[Path, OSError]] = []
    lm = LogManager([tmp_path / "data"], on_dir_failure=lambda d, e: failed.append((d, e)))
    try:
        lg = lm.get_or_create_log(OFFSETS_TOPIC, 0, topic_id="T", overrides={})
        _commit_batches(lg, [("g1", 10), ("g2", 20), ("g3", 30)])
        corrupt_at = _flip_last_byte_of_batch(lg, 1)  # g2's commit
        coord = _leading_coordinator(lm, lg, isr=(1, 2) if others_in_sync else (1,))
        try:
            coord._partitions[0] = _PartitionLoad(leader_epoch=3)
            coord._load_partition(0, 3)
            loaded = {gid: g.offsets[TopicPartition("t", 0)].offset for gid, g in coord._groups.items()}
        finally:
            coord._loader.shutdown()
        marker = lg.dir / RESCAN_FROM_FILE
        if others_in_sync:
            # They hold it intact: this leader stops (its directory failed) and cuts its log there at the next start.
            assert [d for d, _ in failed] == [tmp_path / "data"], f"failed dirs: {failed}"
            assert marker.read_text().strip() == str(corrupt_at), "the batch is not marked to be cut"
            assert loaded == {}, f"groups served by a leader that is stopping: {loaded}"
        else:
            # Nothing stops, nothing is cut (the batch is on no other replica): the other commits are served.
            assert failed == [], f"the only in-sync replica failed its directory: {failed}"
            assert not marker.exists(), "a log on no other replica was marked to be cut"
            assert loaded == {"g1": 10, "g3": 30}, f"loaded: {loaded}"
    finally:
        lm.shutdown()


def test_a_corrupt_batch_whose_end_would_not_move_the_load_ends_it_instead_of_looping(tmp_path: Path) -> None:
    """The only replica in sync, and a corrupt batch whose damaged header puts the offset after it at or before
    the offset being loaded: the load ends there (the groups before it are served) rather than read the same
    batch again up to LOAD_BATCHES_MAX times."""
    failed: list[tuple[Path, OSError]] = []
    lm = LogManager([tmp_path / "data"], on_dir_failure=lambda d, e: failed.append((d, e)))
    try:
        lg = lm.get_or_create_log(OFFSETS_TOPIC, 0, topic_id="T", overrides={})
        _commit_batches(lg, [("g1", 10), ("g2", 20), ("g3", 30)])
        coord = _leading_coordinator(lm, lg, isr=(1,))
        reads: list[int] = []
        real_read = lg.read

        def read(offset: int, *args: object, **kwargs: object) -> object:
            reads.append(offset)
            if offset == 1:  # g2's batch, its header damaged: "the next batch starts at 1"
                cause = CorruptBatchError(lg.segments()[0].log_path, 70, 1, "CRC mismatch", next_offset=1)
                raise errors.KafkaStorageError(f"read failed: {cause}") from cause
            if offset == 0:
                kwargs["max_offset"] = 1  # g1's batch alone: the next read starts at g2's
            return real_read(offset, *args, **kwargs)
        try:
            coord._partitions[0] = _PartitionLoad(leader_epoch=3)
            with mock.patch.object(lg, "read", read):
                coord._load_partition(0, 3)
            loaded = {gid: g.offsets[TopicPartition("t", 0)].offset for gid, g in coord._groups.items()}
        finally:
            coord._loader.shutdown()
        assert failed == [], f"the only in-sync replica failed its directory: {failed}"
        assert loaded == {"g1": 10}, f"loaded: {loaded}"
        assert reads == [0, 1], f"the load read at {reads[:10]}"
    finally:
        lm.shutdown()
