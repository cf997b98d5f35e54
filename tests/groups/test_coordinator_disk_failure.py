"""A group coordinator whose disk refuses to read ``__consumer_offsets`` fails its log directory.

Found with real EIO faults (tests/ops/test_disk_faults.py): the load of the groups warned and gave
up, so the broker kept leading the partition while answering its groups' members NOT_COORDINATOR,
and FindCoordinator sent them back to it until some other event moved the leadership. A read the
disk refuses now fails the log directory (the broker's handler then stops the broker), as every
other read or write of a failed disk does."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from broker.group_coordinator import CoordinatorConfig, GroupCoordinator, _PartitionLoad
from broker.group_records import OFFSETS_TOPIC
from storage import segment
from storage.log_manager import LogManager
from storage.record_batch import RecordBatchBuilder


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
