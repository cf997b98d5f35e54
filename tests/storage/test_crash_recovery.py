"""Real crashes (SIGKILL of a writer process) and on-disk corruption, then recovery."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from storage_testlib import flip_byte, make_batch, read_all

from proto import errors
from storage.disk_errors import disk_failure
from storage.file_records import FileRecords
from storage.log import Log
from storage.log_config import LogConfig
from storage.log_manager import LogManager
from storage.record_batch import iter_batches, validate_batches

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def _batches_by_base(data: bytes) -> dict[int, bytes]:
    return {h.base_offset: data[p:p + h.size] for p, h in iter_batches(data)}


class Writer:
    """The crash_writer child with a thread collecting its report lines."""

    def __init__(self, directory: Path, seed: int, segment_bytes: int, mode: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "crash_writer.py"), str(directory), str(seed), str(segment_bytes), mode],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.endswith(b"\n"):  # a line cut by the kill is not a report
                self.lines.append(raw.decode().strip())

    def wait_for_reports(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.lines) < count + 1:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"writer exited with {self.proc.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"writer reported only {len(self.lines)} lines in {timeout_s}s")
            time.sleep(0.005)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def _reopen(directory: Path, segment_bytes: int, mode: str) -> tuple[Log, LogManager | None]:
    if mode == "manager":
        lm = LogManager([directory.parent], {"segment.bytes": str(segment_bytes)})
        lm.startup()
        lg = lm.get_log(directory.name.rsplit("-", 1)[0], 0)
        assert lg is not None, "the log was not found after the crash"
        return lg, lm
    return Log.open(directory, LogConfig(segment_bytes=segment_bytes)), None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["log", "manager"])
def test_sigkill_during_appends_loses_no_flushed_batch(tmp_path: Path, mode: str) -> None:
    _crash_rounds(tmp_path, mode, rounds=3, seed=f"20261122-{mode}")


# 40 writer processes: about 90 s on an idle 2-core machine, over 300 s (the suite's per-test timeout,
# which once failed this soak) with 36 CPU hogs running. Its own bound scales with that.
@pytest.mark.soak
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("mode", ["log", "manager"])
def test_sigkill_soak(tmp_path: Path, mode: str) -> None:
    _crash_rounds(tmp_path, mode, rounds=40, seed=f"soak-{mode}")


def _crash_rounds(tmp_path: Path, mode: str, *, rounds: int, seed: str) -> None:
    """Kill a writer ``rounds`` times at random moments; after each kill, reopen and check."""
    rng = random.Random(seed)
    directory = tmp_path / "data" / "crash-0"
    directory.parent.mkdir()
    segment_bytes = 64 * 1024  # small: kills also land around segment rolls
    reported: dict[int, tuple[int, str]] = {}
    for round_no in range(rounds):
        writer = Writer(directory, seed=round_no, segment_bytes=segment_bytes, mode=mode)
        try:
            writer.wait_for_reports(rng.randint(5, 60))
            time.sleep(rng.uniform(0.0, 0.3))  # the kill lands at a random point of an append
        finally:
            writer.kill()
        assert writer.lines and writer.lines[0].startswith("ready"), writer.lines[:1]
        for line in writer.lines[1:]:
            base, nxt, digest = line.split()
            reported[int(base)] = (int(nxt), digest)

        lg, lm = _reopen(directory, segment_bytes, mode)
        try:
            data = read_all(lg)
            if data:
                validate_batches(data)  # everything served is whole and CRC-valid
            stored = _batches_by_base(data)
            start = lg.log_start_offset  # retention (manager mode) may have deleted old segments
            for base, (_nxt, digest) in reported.items():
                if base < start:
                    continue
                assert base in stored, f"round {round_no}: flushed batch at {base} lost (log end {lg.log_end_offset})"
                assert hashlib.sha256(stored[base]).hexdigest() == digest, f"batch at {base} changed"
            assert lg.log_end_offset >= max(n for n, _ in reported.values())
            assert start <= max(reported)  # retention never passes the data
            # appends continue after the crash
            info = lg.append_as_leader(make_batch(2), 9)
            assert info.first_offset == lg.log_end_offset - 2
            last = lg.read(info.first_offset, 1 << 20)
            assert last.first_offset == info.first_offset and validate_batches(last.records)
            reported[info.first_offset] = (info.last_offset + 1,
                                           hashlib.sha256(last.records).hexdigest())
        finally:
            if lm is not None:
                lm.shutdown()
            else:
                lg.close()
    assert len(reported) > 20


def _corrupt_batch_in_middle(log_path: Path) -> int:
    """Flip a byte in the records of the batch at the middle of ``log_path``; return its base offset."""
    data = log_path.read_bytes()
    middle = len(data) // 2
    for pos, h in iter_batches(data):
        if pos <= middle < pos + h.size:
            flip_byte(log_path, pos + 61 + (h.size - 61) // 2)
            return h.base_offset
    raise AssertionError(f"no batch spans the middle of {log_path}")


@pytest.mark.parametrize("mode", ["recovery_point_behind", "full_scan"])
def test_corruption_in_closed_and_active_segment_truncates_at_first_bad_batch(
        tmp_path: Path, caplog, mode: str) -> None:
    dirs = [tmp_path / "data"]
    lm = LogManager(dirs, {"segment.bytes": "2000"})
    lm.startup()
    lg = lm.get_or_create_log("t", 0, topic_id="T", overrides={})
    for _ in range(6):
        lg.append_as_leader(make_batch(3, value_size=40), 1)
    if mode == "recovery_point_behind":
        lg.flush()
        lm.checkpoint_all()  # recovery point here; what follows is only in the page cache
    for _ in range(40):
        lg.append_as_leader(make_batch(3, value_size=40), 1)
    if mode == "full_scan":
        lg.flush()
        lm.checkpoint_all()  # recovery point at the end: only a forced full scan finds the damage
    segments = lg.segments()
    assert len(segments) >= 4
    before = _batches_by_base(read_all(lg))
    closed, active = segments[2], segments[-1]
    lg.close_without_flush()  # crash: no clean-shutdown marker
    bad_offset = _corrupt_batch_in_middle(closed.log_path)
    _corrupt_batch_in_middle(active.log_path)

    lm2 = LogManager(dirs, {"segment.bytes": "2000"}, recovery_full_scan=(mode == "full_scan"))
    with caplog.at_level(logging.WARNING, logger="storage.segment"):
        lm2.startup()
    lg2 = lm2.get_log("t", 0)
    assert lg2.log_end_offset == bad_offset, (lg2.log_end_offset, bad_offset)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(closed.log_path.name in w and f"offset {bad_offset}" in w for w in warnings), warnings
    data = read_all(lg2)
    validate_batches(data)
    after = _batches_by_base(data)
    assert after == {b: v for b, v in before.items() if b < bad_offset}  # intact up to the bad batch
    assert not (tmp_path / "data" / "t-0" / active.log_path.name).exists()  # nothing after it is kept
    assert lg2.append_as_leader(make_batch(1), 2).first_offset == bad_offset
    lm2.shutdown()


def test_corrupt_header_before_the_recovery_point_falls_back_to_full_scan(tmp_path: Path, caplog) -> None:
    size = len(make_batch(2))
    cfg = LogConfig(segment_bytes=size * 4)
    lg = Log.open(tmp_path / "t-0", cfg)
    for _ in range(12):
        lg.append_as_leader(make_batch(2), 1)
    lg.flush()
    rp = lg.recovery_point
    before = _batches_by_base(read_all(lg))
    first = lg.segments()[0]
    lg.close_without_flush()  # crash: no producer-state snapshot
    with open(first.log_path, "r+b") as f:
        f.seek(size * 2 + 16)  # magic byte of the third batch
        f.write(b"\x07")
    with caplog.at_level(logging.WARNING):
        lg = Log.open(tmp_path / "t-0", cfg, recovery_point=rp)  # segment 0 would not be rescanned
    assert lg.log_end_offset == 4
    assert _batches_by_base(read_all(lg)) == {b: v for b, v in before.items() if b < 4}
    assert any("falling back to a full recovery scan" in r.getMessage() for r in caplog.records)
    lg.close()


@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_lost_epoch_checkpoint_is_rebuilt_from_every_segment_after_a_crash(tmp_path: Path, damage: str) -> None:
    """The leader-epoch-checkpoint unreadable (or gone) and a crash: recovery scans only from the recovery point,
    and its batches used to be all the cache was rebuilt from: epochs that started before were lost, and the one
    running at the recovery point seemed to start there. As leader the replica then answered OffsetsForLeaderEpoch
    with end offsets past the real ones, so a follower with a diverged tail in an older epoch kept it."""
    size = len(make_batch(2))
    cfg = LogConfig(segment_bytes=size * 4)
    lg = Log.open(tmp_path / "t-0", cfg)
    for epoch in (0, 0, 0, 1, 1, 1, 2, 2):  # offsets 0-5 epoch 0, 6-11 epoch 1, 12-15 epoch 2
        lg.append_as_leader(make_batch(2), epoch)
    lg.flush()
    rp = lg.recovery_point
    for _ in range(4):
        lg.append_as_leader(make_batch(2), 2)  # after the recovery point: rescanned on open
    want = [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()]
    assert want == [(0, 0), (1, 6), (2, 12)]
    lg.close_without_flush()  # crash
    checkpoint = tmp_path / "t-0" / "leader-epoch-checkpoint"
    if damage == "garbage":
        checkpoint.write_bytes(b"0\n3\n0 0\n1 6\n2 1")  # torn: the count says 3 entries
    else:
        checkpoint.unlink()
    lg = Log.open(tmp_path / "t-0", cfg, recovery_point=rp)
    assert lg.segments()[0].base_offset < rp and bisect_segment(lg, rp) > 0, "the rescan must start past segment 0"
    assert [(e.epoch, e.start_offset) for e in lg.epoch_cache.entries()] == want
    assert lg.end_offset_for_epoch(1) == (1, 12)
    assert lg.end_offset_for_epoch(0) == (0, 6)
    lg.close()


def bisect_segment(lg: Log, offset: int) -> int:
    """Index of the segment holding ``offset``."""
    return max(i for i, s in enumerate(lg.segments()) if s.base_offset <= offset)



def _twelve_batches_in_small_segments(tmp_path: Path) -> tuple[Log, LogConfig]:
    """A log of twelve two-record batches, all committed, four batches a segment; and its config."""
    cfg = LogConfig(segment_bytes=len(make_batch(2)) * 4)
    lg = Log.open(tmp_path / "t-0", cfg)
    for _ in range(12):
        lg.append_as_leader(make_batch(2), 1)
    lg.update_high_watermark(lg.log_end_offset)
    return lg, cfg


@pytest.mark.parametrize("damage", ["records", "magic"])
def test_a_corrupt_batch_is_never_read_and_a_marked_log_is_cut_there_at_the_next_open(tmp_path: Path,
                                                                                      damage: str) -> None:
    """A byte flipped in a closed, flushed segment (below the recovery point: no recovery looks at it). A read
    used to return the batch as it was; it now fails as a disk read would (EIO, so the broker's read path fails
    the log directory); a read from before it ends before it. Marked (``mark_corrupt``), the log is rescanned from that segment at its next
    open, even after a clean shutdown, and cut at the batch."""
    lg, cfg = _twelve_batches_in_small_segments(tmp_path)
    lg.flush()
    first = lg.segments()[0]
    if damage == "records":
        bad = _corrupt_batch_in_middle(first.log_path)
    else:  # a header that cannot be walked: the CRC does not cover the magic byte
        bad = 4
        with open(first.log_path, "r+b") as f:
            f.seek(len(make_batch(2)) * 2 + 16)
            f.write(b"\x07")
    assert 0 < bad < first.next_offset
    before = lg.read(0, 1 << 20).records  # the batches before it are served, it is not
    assert [h.base_offset for _p, h in iter_batches(before)] == list(range(0, bad, 2))
    with pytest.raises(errors.KafkaStorageError) as caught:
        lg.read(bad, 1 << 20)
    cause = disk_failure(caught.value)  # segment.CorruptBatchError
    assert cause is not None and cause.errno == errno.EIO, caught.value
    # A CRC names the batch; a header that cannot be walked, the batch the walk started from (an index entry).
    assert cause.base_offset == bad if damage == "records" else cause.base_offset <= bad, caught.value
    with pytest.raises(errors.KafkaStorageError):
        lg.read(bad, 1, min_one_batch=True)  # one batch larger than max_bytes
    lg.mark_corrupt(cause.base_offset)
    end = lg.log_end_offset
    lg.close()  # clean: only the mark makes the next open look at the segment
    lg = Log.open(tmp_path / "t-0", cfg, recovery_point=end, clean_shutdown=True)
    assert lg.log_end_offset == bad
    assert not (tmp_path / "t-0" / "rescan-from").exists()
    validate_batches(read_all(lg))
    lg.close()


def test_a_slice_for_sendfile_ends_before_a_corrupt_batch_and_its_bytes_are_checked_once(tmp_path: Path) -> None:
    """The Kafka listener sends a fetch's records from the segment file (sendfile), unread; librdkafka does not
    check CRCs by default. Before, a batch whose bytes changed on disk went to it as they were: a slice is now
    checked before it is sent, as a read is (it ends before the batch; a slice starting there fails), and
    what passed is marked, so a later slice of the same bytes is sent unread again."""
    lg, cfg = _twelve_batches_in_small_segments(tmp_path)
    end = lg.log_end_offset
    lg.close()
    path = lg.segments()[0].log_path
    bad = _corrupt_batch_in_middle(path)  # below the recovery point, after a clean shutdown: nothing rescans it
    bad_position = next(pos for pos, h in iter_batches(path.read_bytes()) if h.base_offset == bad)
    lg = Log.open(tmp_path / "t-0", cfg, recovery_point=end, clean_shutdown=True)
    try:
        segment = lg.segments()[0]
        assert segment.checked_ranges() == ()  # nothing read yet in this process
        got = lg.read(0, 1 << 20, as_slice=True)
        assert isinstance(got.records, FileRecords), got.records
        try:
            assert [h.base_offset for _p, h in iter_batches(got.records.read())] == list(range(0, bad, 2))
        finally:
            got.records.close()
        assert segment.checked_ranges() == ((0, bad_position),)
        with pytest.raises(errors.KafkaStorageError) as caught:
            lg.read(bad, 1 << 20, as_slice=True)
        cause = disk_failure(caught.value)  # segment.CorruptBatchError, as for a read into memory
        assert cause is not None and cause.errno == errno.EIO and cause.base_offset == bad, caught.value
        # The next segment's bytes are checked at their first slice, then sent unread.
        second = lg.segments()[1]
        for _ in range(2):
            got = lg.read(second.base_offset, 1 << 20, as_slice=True)
            assert isinstance(got.records, FileRecords) and got.records.length == second.size
            got.records.close()
            assert second.checked_ranges() == ((0, second.size),)
    finally:
        lg.close()


def _three_batches(tmp_path: Path) -> Log:
    """A log of three one-record batches, all committed."""
    lg = Log.open(tmp_path / "t-0", LogConfig())
    for _ in range(3):
        lg.append_as_leader(make_batch(1, value_size=20), 0)
    lg.update_high_watermark(3)
    return lg


def _overwrite_second_batch(lg: Log, at: int, data: bytes) -> None:
    """Write ``data`` over the second batch's bytes from its ``at``-th on."""
    path = lg.segments()[0].log_path
    pos, _h = list(iter_batches(path.read_bytes()))[1]
    with open(path, "r+b") as f:
        f.seek(pos + at)
        f.write(data)

def test_a_batch_whose_offsets_disagree_with_its_count_is_not_skipped_in_silence(tmp_path: Path) -> None:
    """A read walks the headers from an index entry to the batch it wants, and does not read (so does not
    CRC-check) the batches it steps over. A last offset delta flipped to -16 made a read at that batch's offset
    step over it and answer the next batch: a consumer lost the record without a word, and a follower copied
    the log without it. The walk now checks what a header alone can say (the record count against the offset
    delta): the read fails as a corrupt batch, which the broker handles as any other (never served, cut and
    fetched back where other replicas hold it)."""
    lg = _three_batches(tmp_path)
    # last_offset_delta: after base offset 8, length 4, leader epoch 4, magic 1, crc 4 and attributes 2
    _overwrite_second_batch(lg, 23, (-16).to_bytes(4, "big", signed=True))
    with pytest.raises(errors.KafkaStorageError) as caught:
        lg.read(1, 1 << 20)
    assert "corrupt batch" in str(caught.value), caught.value
    assert lg.read(0, 1 << 20, max_offset=1).first_offset == 0  # the batch before it is still served
    lg.close()


def test_a_base_offset_that_goes_back_is_a_corrupt_batch(tmp_path: Path) -> None:
    """The base offset is outside the CRC: a batch whose base offset was flipped (to 0x10000001) was found for a
    read at its real offset, as holding offsets up to 0x10000001, past the high watermark: the read answered
    nothing and a consumer there never got past it. Offsets only grow along a segment, and end where it does:
    the walk now fails there as on a corrupt batch; the batch after it is still served."""
    lg = _three_batches(tmp_path)
    _overwrite_second_batch(lg, 4, (0x1000).to_bytes(2, "big"))  # the base offset's low half: 1 -> 0x10000001
    with pytest.raises(errors.KafkaStorageError) as caught:
        lg.read(1, 1 << 20)
    assert "corrupt batch" in str(caught.value), caught.value
    assert lg.read(2, 1 << 20).first_offset == 2
    lg.close()


SEGMENTED = LogConfig.from_overrides({"segment.bytes": "4096", "index.interval.bytes": "256"})


def _segmented_log(tmp_path: Path) -> tuple[Path, dict[int, bytes]]:
    """A closed log of 120 five-record batches over several 4 KiB segments, each record's timestamp one
    millisecond after the one before: {offset: value} of each record."""
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SEGMENTED)
    values: dict[int, bytes] = {}
    t0 = int(time.time() * 1000) - 100_000
    for b in range(120):
        batch_values = [b"v-%06d-" % (b * 5 + i) + b"x" * 40 for i in range(5)]
        values.update((b * 5 + i, v) for i, v in enumerate(batch_values))
        lg.append_as_leader(make_batch(5, values=batch_values, ts=t0 + b * 5), 1)  # record o: t0 + o
    lg.update_high_watermark(lg.log_end_offset)
    lg.close()
    return directory, values


def _damage(directory: Path, segment: int, batch: int, at: int, mask: int) -> None:
    """XOR byte ``at`` of the ``batch``-th batch header of the ``segment``-th segment file (oldest first)."""
    path = sorted(directory.glob("*.log"))[segment]
    pos, _h = list(iter_batches(path.read_bytes()))[batch]
    flip_byte(path, pos + at, mask)


def _read_until_refused(lg: Log) -> tuple[dict[int, bytes], BaseException | None]:
    """Records from the log start as a consumer reads them, until the end or the first refused read."""
    from storage.record_batch import decode_records

    got: dict[int, bytes] = {}
    offset = lg.log_start_offset
    while offset < lg.log_end_offset:
        try:
            records = lg.read(offset, 1 << 20).records
        except errors.KafkaStorageError as exc:
            return got, exc
        if not records:
            break
        for r in decode_records(records):
            assert r.offset >= offset, f"offset {r.offset} served for a read at {offset}"
            got[r.offset] = r.value
            offset = r.offset + 1
    return got, None


# A header field of a batch in a closed segment, changed on disk, and what a read of the log after a restart saw:
# - the batch length (byte 8, 0x04: 64 MiB longer): every batch after it in the segment was stepped over in
#   silence, 50 of 600 records gone, the reads jumping from offset 169 to 220;
# - the base offset of a batch a read serves after another (its low byte, 0x20): five records served under
#   offsets 32 lower, after the ones before them;
# - the base offset of a segment's last batch (byte 4, 0x20: 2^27 higher): the segment ended there by that
#   header, so a read at the batch's true offset answered nothing, for good; a consumer stayed there.
# Each is now a corrupt batch (KAFKA_STORAGE_ERROR: never served; the broker cuts the log there and fetches the
# rest back from the other replicas), and every record served before it is the one at its offset.
@pytest.mark.parametrize("segment, batch, at, mask", [(3, 1, 8, 0x04), (7, 8, 7, 0x20), (5, 10, 4, 0x20)],
                         ids=["batch-length", "base-offset-of-a-served-batch", "base-offset-of-a-segments-last-batch"])
def test_a_damaged_header_in_a_closed_segment_fails_the_read_instead_of_misplacing_records(
        tmp_path: Path, segment: int, batch: int, at: int, mask: int) -> None:
    directory, values = _segmented_log(tmp_path)
    _damage(directory, segment, batch, at, mask)
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)  # no recovery looks at it
    try:
        got, refused = _read_until_refused(lg)
    finally:
        lg.close()
    assert refused is not None and "corrupt batch" in str(refused), f"{len(got)} of 600 records read, no error"
    assert got == {o: values[o] for o in range(len(got))}, "a record was served under another offset, or skipped"


# One byte of a closed segment's index changed on disk, then a timestamp lookup (ListOffsets by timestamp,
# offsetsForTimes) for every record's timestamp. Reads checked the offset-index entry they start from; timestamp
# lookups trusted both indexes: an offset-index entry's position answered later offsets or CORRUPT_MESSAGE (its
# bytes were not a batch), a time-index entry's offset answered offset 325 for records 285-288.
@pytest.mark.parametrize("segment, suffix, at, mask", [(1, "index", 36, 0xB7), (3, "index", 55, 0xE3),
                                                       (5, "timeindex", 23, 0xF3)],
                         ids=["offset-index-position", "offset-index-offset", "time-index-offset"])
def test_a_damaged_index_entry_does_not_change_what_a_timestamp_lookup_answers(
        tmp_path: Path, segment: int, suffix: str, at: int, mask: int) -> None:
    directory, _values = _segmented_log(tmp_path)
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
    t0 = lg.segments()[0].first_batch_timestamp
    truth = {t: lg.lookup_timestamp(t0 + t) for t in range(600)}
    lg.close()
    flip_byte(sorted(directory.glob(f"*.{suffix}"))[segment], at, mask)
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
    try:
        wrong = {t: (truth[t], lg.lookup_timestamp(t0 + t)) for t in range(600)
                 if lg.lookup_timestamp(t0 + t) != truth[t]}
    finally:
        lg.close()
    assert not wrong, f"{len(wrong)} lookups answered otherwise, e.g. {list(wrong.items())[:2]}"


# A closed, flushed segment (no recovery looks at it) cut short or emptied on disk, its indexes left as they were.
# Reads stepped over the offsets it lost in silence, as over offsets compaction removed: records 165-219 (or
# 190-219) were gone, and a consumer went on from 220. Now the segment's indexes tell it (both name batches past
# where its batches end): reads there fail as at a corrupt batch, that stays so after the indexes were rebuilt,
# and marked (the broker marks it when in-sync replicas hold the records), the log is cut there at the next open.
@pytest.mark.parametrize("keep", ["nothing", "half"])
def test_a_segment_that_lost_bytes_on_disk_is_no_silent_hole(tmp_path: Path, keep: str) -> None:
    directory, values = _segmented_log(tmp_path)
    path = sorted(directory.glob("*.log"))[3]
    positions = [pos for pos, _h in iter_batches(path.read_bytes())]
    os.truncate(path, 0 if keep == "nothing" else positions[len(positions) // 2])
    base = int(path.name.split(".")[0])
    for attempt in ("found", "remembered"):  # the second open has only the rebuilt indexes
        lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
        try:
            got, refused = _read_until_refused(lg)
            assert refused is not None, f"{attempt}: {len(got)} of 600 records read and no error: the hole is silent"
            assert got == {o: values[o] for o in range(len(got))}, attempt
            lost_from = len(got)
            assert base <= lost_from < 220
            cause = disk_failure(refused)
            assert cause is not None and cause.errno == errno.EIO and cause.base_offset == lost_from, refused
            assert cause.next_offset == 220, refused  # a reader that must go on (a coordinator's load) can
            assert lg.lost_offsets() == ((lost_from, 220),)
        finally:
            lg.close()
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
    lg.mark_corrupt(lost_from)
    lg.close()
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
    try:
        assert lg.log_end_offset == lost_from, "not cut where the lost offsets begin"
        assert read_all(lg) and _read_until_refused(lg) == ({o: values[o] for o in range(lost_from)}, None)
        assert lg.lost_offsets() == ()
        assert not (directory / "lost-offsets").exists() and not (directory / "rescan-from").exists()
    finally:
        lg.close()


def test_lost_offsets_are_forgotten_when_the_log_moves_past_them(tmp_path: Path) -> None:
    directory, _values = _segmented_log(tmp_path)
    path = sorted(directory.glob("*.log"))[3]
    os.truncate(path, 0)
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
    try:
        assert lg.lost_offsets() == ((165, 220),)
        lg.truncate_to(400)  # a follower's truncation above them keeps them
        assert lg.lost_offsets() == ((165, 220),)
        lg.update_high_watermark(lg.log_end_offset)
        lg.set_log_start_offset(200)  # DeleteRecords into them
        assert lg.lost_offsets() == ((200, 220),)
        assert (directory / "lost-offsets").read_text() == "200 220\n"
        lg.set_log_start_offset(220)
        assert lg.lost_offsets() == () and not (directory / "lost-offsets").exists()
    finally:
        lg.close()


def test_a_log_without_damage_has_no_lost_offsets_after_many_opens(tmp_path: Path) -> None:
    """Rolled, truncated, compaction-like gaps, clean and unclean opens: nothing is taken for lost bytes."""
    directory, values = _segmented_log(tmp_path)
    for clean in (True, False, True):
        lg = Log.open(directory, SEGMENTED, recovery_point=0 if not clean else 10**9, clean_shutdown=clean)
        assert lg.lost_offsets() == ()
        lg.truncate_to(lg.log_end_offset - 7)  # mid-segment, as a follower does
        lg.append_as_leader(make_batch(5), 2)
        lg.roll()
        lg.append_as_leader(make_batch(5), 2)
        lg.close()
    lg = Log.open(directory, SEGMENTED, recovery_point=10**9, clean_shutdown=True)
    try:
        assert lg.lost_offsets() == () and not (directory / "lost-offsets").exists()
        got, refused = _read_until_refused(lg)
        assert refused is None and all(got[o] == values[o] for o in range(590))
    finally:
        lg.close()
