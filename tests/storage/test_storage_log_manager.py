"""LogManager: placement, topic ids, checkpoints round trip, clean/unclean restarts, background threads."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_testlib import make_batch, now_ms, read_all
from waiting import wait_for as _wait_for

from proto import errors
from storage.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    SCRUBBER_CHECKPOINT,
    CorruptCheckpointError,
    OffsetCheckpointFile,
    ScrubberCheckpointFile,
)
from storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager, read_partition_metadata


def test_new_logs_go_to_least_used_dir(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"]
    lm = LogManager(dirs)
    lm.startup()
    for p in range(6):
        lm.get_or_create_log("orders", p, topic_id="T1", overrides={})
    counts = {d: sum(1 for c in d.iterdir() if c.is_dir()) for d in dirs}
    assert set(counts.values()) == {2}, counts
    lm.get_or_create_log("big", 0, topic_id="T2", overrides={}).append_as_leader(make_batch(50), 0)
    placed = lm.log_dir_of("big", 0)
    # equal partition counts: the emptier directories win the next placements
    nxt = lm.get_or_create_log("x", 0, topic_id="T3", overrides={})
    assert lm.log_dir_of("x", 0) != placed and nxt.dir.parent != placed
    assert read_partition_metadata(nxt.dir) == "T3"
    lm.shutdown()


def test_checkpoints_round_trip_and_clean_restart(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    lm = LogManager(dirs, {"segment.bytes": "2000"})
    lm.startup()
    logs = {p: lm.get_or_create_log("t", p, topic_id="T", overrides={"retention.ms": "-1"}) for p in range(4)}
    for p, lg in logs.items():
        for _ in range(10 + p):
            lg.append_as_leader(make_batch(2), 1)
        lg.update_high_watermark(5 + p)
    logs[0].update_high_watermark(logs[0].log_end_offset)
    logs[0].set_log_start_offset(4)
    contents = {p: read_all(lg) for p, lg in logs.items()}
    lm.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
        hws = OffsetCheckpointFile(d / REPLICATION_OFFSET_CHECKPOINT).read()
        assert all(t == "t" for t, _p in hws)
    lm2 = LogManager(dirs, {"segment.bytes": "2000"})
    lm2.startup()
    for d in dirs:
        assert not (d / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is unclean
    for p in range(4):
        lg = lm2.get_log("t", p)
        assert lg is not None
        assert lg.log_end_offset == 2 * (10 + p)
        assert lg.high_watermark == (lg.log_end_offset if p == 0 else 5 + p)
        assert lg.recovery_point == lg.log_end_offset
        assert read_all(lg) == contents[p]
    assert lm2.get_log("t", 0).log_start_offset == 4
    assert lm2.topic_id("t", 1) == "T"
    lm2.shutdown()


def test_unclean_restart_recovers_from_recovery_point(tmp_path: Path, caplog) -> None:
    lm = LogManager([tmp_path / "d"], {"segment.bytes": "1500"})
    lm.startup()
    lg = lm.get_or_create_log("t", 0, topic_id="T", overrides={})
    for _ in range(20):
        lg.append_as_leader(make_batch(2), 1)
    lg.flush()
    lm.checkpoint_all()
    rp = lg.recovery_point
    lg.append_as_leader(make_batch(2), 1)  # not flushed, but in the page cache: survives a process crash
    active = lg.segments()[-1]
    lg.close_without_flush()  # the "crash": no shutdown, no marker
    with open(active.log_path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x2a\x00\x00\x01")  # torn tail
    lm2 = LogManager([tmp_path / "d"], {"segment.bytes": "1500"})
    with caplog.at_level("WARNING"):
        lm2.startup()
    lg2 = lm2.get_log("t", 0)
    assert lg2.log_end_offset == 42 and rp == 40
    assert any("truncating" in r.getMessage() and active.log_path.name in r.getMessage() for r in caplog.records)
    lm2.shutdown()


def test_old_incarnation_replaced_and_delete_log(tmp_path: Path) -> None:
    lm = LogManager([tmp_path / "d"])
    lm.startup()
    lg = lm.get_or_create_log("t", 0, topic_id="OLD", overrides={})
    lg.append_as_leader(make_batch(3), 0)
    same = lm.get_or_create_log("t", 0, topic_id="OLD", overrides={"segment.bytes": "5000"})
    assert same is lg and lg.config.segment_bytes == 5000
    fresh = lm.get_or_create_log("t", 0, topic_id="NEW", overrides={})
    assert fresh is not lg and fresh.log_end_offset == 0 and read_partition_metadata(fresh.dir) == "NEW"
    lm.delete_log("t", 0)
    assert lm.get_log("t", 0) is None and not (tmp_path / "d" / "t-0").exists()
    with pytest.raises(errors.InvalidConfigError):
        lm.get_or_create_log("t", 1, topic_id="X", overrides={"segment.bytes": "tiny"})
    lm.shutdown()


def test_a_deleted_topics_overrides_go_with_its_last_partition(tmp_path: Path) -> None:
    # Every topic name a broker ever hosted kept its overrides for the life of the process, however many were
    # created and deleted (audit: 2,200 cycles, 2,200 entries left).
    lm = LogManager([tmp_path / "d"])
    lm.startup()
    for cycle in range(50):
        name = f"churn-{cycle}"
        for p in range(2):
            lm.get_or_create_log(name, p, topic_id=f"id-{cycle}", overrides={"retention.ms": "60000"})
        lm.update_topic_config(name, {"retention.ms": "120000"})
        lm.delete_log(name, 0)
        assert name in lm._overrides  # partition 1 is still here
        lm.delete_log(name, 1)
    lm.update_topic_config("never-hosted", {"retention.ms": "1"})
    assert lm._overrides == {}
    again = lm.get_or_create_log("churn-0", 0, topic_id="id-again", overrides={"retention.ms": "5000"})
    assert again.config.retention_ms == 5000
    lm.shutdown()


def test_update_topic_config_and_background_retention_and_flush(tmp_path: Path) -> None:
    lm = LogManager([tmp_path / "d"], flush_check_ms=20, retention_check_ms=20, checkpoint_interval_ms=20)
    lm.startup()
    size = len(make_batch(2))
    lg = lm.get_or_create_log("t", 0, topic_id="T", overrides={"segment.bytes": str(size * 2)})
    old = now_ms() - 3_600_000
    for i in range(8):
        lg.append_as_leader(make_batch(2, ts=old + i), 0)
    lg.update_high_watermark(lg.log_end_offset)
    lm.start_background()
    lm.update_topic_config("t", {"segment.bytes": str(size * 2), "retention.ms": "1000",
                                 "file.delete.delay.ms": "0", "flush.ms": "10"})
    # every record is an hour old and replicated: the active segment [12, 16) goes too (a new one at 16)
    _wait_for(lambda: lg.log_start_offset == 16, what="retention to delete the old segments")
    _wait_for(lambda: lg.recovery_point == lg.log_end_offset, what="flush.ms flush")
    cp = tmp_path / "d" / RECOVERY_POINT_CHECKPOINT
    _wait_for(lambda: cp.exists() and OffsetCheckpointFile(cp).read().get(("t", 0)) == 16,
              what="checkpointer")
    lm.shutdown()


def test_background_cleaner_compacts(tmp_path: Path) -> None:
    lm = LogManager([tmp_path / "d"], cleaner_backoff_ms=20)
    lm.startup()
    lg = lm.get_or_create_log("c", 0, topic_id="C", overrides={
        "cleanup.policy": "compact", "segment.bytes": "1200", "file.delete.delay.ms": "0"})
    for i in range(60):
        lg.append_as_leader(make_batch(1, keys=[b"k%d" % (i % 3)], values=[b"v%d" % i]), 0)
    lg.update_high_watermark(lg.log_end_offset)
    before = lg.size_bytes
    lm.start_background()
    _wait_for(lambda: lg.size_bytes < before / 2, what="background compaction")
    # The size drops at the pass's first swapped group; its cleaned-up-to offset is recorded when the whole pass
    # is over. A shutdown in between stops the pass, which records nothing (CI once read an empty checkpoint).
    _wait_for(lambda: lm.cleaner.checkpoints().get(("c", 0), 0) > 0, what="the compaction pass to finish")
    lm.shutdown()
    cleaner_cp = OffsetCheckpointFile(tmp_path / "d" / "cleaner-offset-checkpoint").read()
    assert cleaner_cp.get(("c", 0), 0) > 0


def test_corrupt_checkpoint_reported(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_text("0\n3\nt 0 1\n")
    with pytest.raises(CorruptCheckpointError):
        OffsetCheckpointFile(path).read()
    assert OffsetCheckpointFile(path).read_or_empty() == {}
    OffsetCheckpointFile(path).write({("a", 1): 5, ("b", 0): 7})
    assert OffsetCheckpointFile(path).read() == {("a", 1): 5, ("b", 0): 7}
    assert not (tmp_path / "cp.tmp").exists()


def test_partition_dir_on_disk_but_not_loaded(tmp_path: Path) -> None:
    lm = LogManager([tmp_path / "a", tmp_path / "b"])
    lm.startup()
    lg = lm.get_or_create_log("t", 0, topic_id="T", overrides={})
    lg.append_as_leader(make_batch(3), 0)
    lm.shutdown()
    fresh = LogManager([tmp_path / "a", tmp_path / "b"])  # startup() not called: nothing loaded
    again = fresh.get_or_create_log("t", 0, topic_id="T", overrides={})
    assert again.log_end_offset == 3  # the data is found, not wiped
    other = fresh.get_or_create_log("u", 0, topic_id="U", overrides={})
    assert other.dir.parent != again.dir.parent
    fresh.shutdown()


def test_a_disk_error_fails_its_log_dir_once_and_other_errors_fail_nothing(tmp_path: Path) -> None:
    """What counts as a failed disk (and stops the broker, see broker/server.py): ENOSPC, EDQUOT,
    EIO, EROFS, EFBIG behind the error, mapped to the log dir it happened under, reported once.
    Errors a race with a log's deletion gives (ENOENT, EBADF) and Brook's own refusals do not."""
    import errno
    import os

    from storage.disk_errors import disk_failure

    dirs = [tmp_path / "a", tmp_path / "b"]
    failed: list[tuple[Path, int]] = []
    lm = LogManager(dirs, on_dir_failure=lambda d, exc: failed.append((d, exc.errno)))
    lm.startup()
    try:
        def storage_error(code: int) -> errors.BrookError:
            try:
                raise OSError(code, os.strerror(code))
            except OSError as exc:
                try:
                    raise errors.KafkaStorageError("write failed") from exc
                except errors.BrookError as wrapped:
                    return wrapped

        for harmless in (FileNotFoundError(errno.ENOENT, "gone"), OSError(errno.EBADF, "closed fd"),
                         errors.KafkaStorageError("log is closed"), storage_error(errno.EBADF)):
            assert disk_failure(harmless) is None
            assert not lm.dir_failed(dirs[0] / "t-0", harmless)
        assert failed == []
        assert lm.dir_failed(dirs[1] / "t-0", storage_error(errno.ENOSPC))
        assert failed == [(dirs[1], errno.ENOSPC)]
        assert lm.dir_failed(dirs[1] / "u-3", OSError(errno.EIO, "I/O error"))  # same dir: told once
        full = OSError(errno.EFBIG, "File too large", str(dirs[0] / "t-1" / "00000000000000000000.log"))
        assert lm.dir_failed(None, full)  # no path from the caller: the error's file names the dir
        assert failed == [(dirs[1], errno.ENOSPC), (dirs[0], errno.EFBIG)]
        assert lm.failed_dirs == {dirs[0], dirs[1]}
    finally:
        lm.shutdown()


_CLEANER_DISK_FAULT = r'''
import json, resource, sys, threading
from pathlib import Path
from storage.log_manager import LogManager
from storage.record_batch import decode_records
from storage_testlib import make_batch, now_ms, read_all

failed = []
told = threading.Event()
lm = LogManager([Path(sys.argv[1])], cleaner_threads=1, cleaner_backoff_ms=50,
                on_dir_failure=lambda d, exc: (failed.append((str(d), exc.errno)), told.set()))
lm.startup()
size = len(make_batch(1, key=b"key-00", value_size=20))
lg = lm.get_or_create_log("c", 0, topic_id="T", overrides={
    "cleanup.policy": "compact", "segment.bytes": str(size * 8), "min.cleanable.dirty.ratio": "0.01"})
ts = now_ms()
for i in range(60):
    lg.append_as_leader(make_batch(1, ts=ts, keys=[b"key-%02d" % (i % 7)], values=[b"value-%04d" % i]), 0)
lg.update_high_watermark(lg.log_end_offset)
# From here no file of this process may grow past one byte: the cleaner's new segment cannot be written.
resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
lm.cleaner.start()
told.wait(30)
lm.cleaner.shutdown()
print(json.dumps({"failed": failed, "records": len(list(decode_records(read_all(lg))))}))
'''


def test_a_disk_error_while_compacting_fails_the_log_dir_and_leaves_the_log_whole(tmp_path: Path) -> None:
    """A real write failure under the cleaner: a process whose file size limit (RLIMIT_FSIZE) lets
    no file grow (EFBIG, as on a full disk) compacting a log. The cleaner's failure reaches
    ``on_dir_failure`` (the broker halts on it) and the log still reads back every record."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", _CLEANER_DISK_FAULT, str(tmp_path / "logs")], cwd=repo,
                          env={"PYTHONPATH": f"{repo}:{repo / 'tests' / 'storage'}", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failed"] == [[str(tmp_path / "logs"), 27]], proc.stderr[-2000:]  # EFBIG, once
    assert out["records"] == 60


def test_a_read_the_disk_refuses_is_not_retried(tmp_path: Path) -> None:
    """Log.read retries an OSError once (a segment deleted under it by retention or truncation),
    but an EIO is the disk: it is raised at once, so the caller fails the directory, even when a
    second try would have read the bytes."""
    import errno
    import os
    from unittest import mock

    from storage import segment
    from storage.disk_errors import disk_failure

    lm = LogManager([tmp_path / "d"])
    lm.startup()
    try:
        lg = lm.get_or_create_log("t", 0, topic_id="T", overrides={})
        lg.append_as_leader(make_batch(3), 0)
        real, calls = os.pread, []

        def once_eio(fd: int, n: int, pos: int) -> bytes:
            calls.append(pos)
            if len(calls) == 1:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(fd, n, pos)

        with mock.patch.object(segment.os, "pread", once_eio), pytest.raises(errors.KafkaStorageError) as info:
            lg.read(0, 1 << 20)
        assert disk_failure(info.value) is not None and disk_failure(info.value).errno == errno.EIO
        assert len(calls) == 1, f"{len(calls)} preads: the read was tried again after EIO"
        assert lg.read(0, 1 << 20).records  # the log itself is fine once the disk answers
    finally:
        lm.shutdown()


def test_scrubber_checkpoint_round_trip_and_corrupt_files(tmp_path: Path) -> None:
    path = tmp_path / SCRUBBER_CHECKPOINT
    assert ScrubberCheckpointFile(path).read() is None
    ScrubberCheckpointFile(path).write(1_700_000_000_000, 1_690_000_000_000, {("a", 1): 5, ("b", 0): 0})
    assert path.read_text() == "0\n1700000000000 1690000000000\n2\na 1 5\nb 0 0\n"
    assert ScrubberCheckpointFile(path).read() == (1_700_000_000_000, 1_690_000_000_000, {("a", 1): 5, ("b", 0): 0})
    for text in ("0\n5\n0\n", "0\n5 x\n0\n", "0\n5 6 7\n0\n", "0\n-1 0\n0\n", "0\n5 6\n2\na 1 5\n", "1\n5 6\n0\n",
                 "0\n5 6\n1\na 1\n"):
        path.write_text(text)
        with pytest.raises(CorruptCheckpointError):
            ScrubberCheckpointFile(path).read()
        assert ScrubberCheckpointFile(path).read_or_none() is None


def test_the_scrubbers_progress_outlives_a_restart(tmp_path: Path) -> None:
    """Written to each data directory with the other checkpoints (each directory its own logs' positions),
    given back to the scrubber by the next startup."""
    from storage.scrubber import ScrubProgress

    dirs = [tmp_path / "d1", tmp_path / "d2"]
    lm = LogManager(dirs, scrubber_enabled=False)
    lm.startup()
    for p in range(2):
        lm.get_or_create_log("t", p, topic_id="T", overrides={}).append_as_leader(make_batch(2), 0)
    placed = {p: lm.log_dir_of("t", p) for p in range(2)}
    assert set(placed.values()) == set(dirs), "one log in each directory"
    lm.scrubber.seed(ScrubProgress(2_000, 1_000, {("t", 0): 7, ("t", 1): 9}))
    lm.shutdown()
    for d in dirs:
        assert ScrubberCheckpointFile(d / SCRUBBER_CHECKPOINT).read() == \
            (2_000, 1_000, {("t", p): (7, 9)[p] for p in range(2) if placed[p] == d})
    lm2 = LogManager(dirs, scrubber_enabled=False)
    lm2.startup()
    assert lm2.scrubber.progress() == ScrubProgress(2_000, 1_000, {("t", 0): 7, ("t", 1): 9})
    lm2.shutdown()
    # A pass that ended since leaves no positions to resume.
    ScrubberCheckpointFile(dirs[0] / SCRUBBER_CHECKPOINT).write(2_000, 3_000, {})
    lm3 = LogManager(dirs, scrubber_enabled=False)
    lm3.startup()
    assert lm3.scrubber.progress() == ScrubProgress(0, 3_000, {})
    lm3.shutdown()


def test_checkpoints_written_from_several_threads_at_once_all_land(tmp_path: Path) -> None:
    """The checkpointer thread and a DeleteRecords (which checkpoints log starts at once) wrote the log start
    checkpoint together, through one tmp file: a rename found the other's tmp gone, and the DeleteRecords was
    answered UNKNOWN_SERVER_ERROR (fresh-clone CI). Eight threads writing it at once now all succeed, and the file
    holds the last state."""
    import threading

    lm = LogManager([tmp_path / "d1"])
    lm.startup()
    logs = [lm.get_or_create_log("t", p, topic_id="T", overrides={}) for p in range(20)]
    for lg in logs:
        lg.append_as_leader(make_batch(5), 0)
        lg.update_high_watermark(lg.log_end_offset)
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for _ in range(100):
                lm.checkpoint_log_start_offsets()
                lm.checkpoint_high_watermarks()
        except BaseException as exc:  # noqa: BLE001 - what a writer met is the test's finding
            failures.append(exc)
    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:3]
    logs[3].set_log_start_offset(2)
    lm.checkpoint_log_start_offsets()
    written = OffsetCheckpointFile(tmp_path / "d1" / LOG_START_OFFSET_CHECKPOINT).read()
    assert written[("t", 3)] == 2 and written[("t", 0)] == 0 and len(written) == 20
    lm.shutdown()
