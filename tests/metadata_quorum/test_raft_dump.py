"""The quorum's full dump (pysyncobj log compaction into quorum.snapshot) is written off the Raft thread.

pysyncobj (``useFork=False``) pickled and gzipped the whole state on its tick thread: 3.3 s at 200,000
partitions without a heartbeat, vote or commit, at every compaction. Here the dump's file writing is held
back (its gzip stream blocks until the test lets it go): a command must still commit meanwhile, and the
file, once written, must be exactly the state at the compacted index; a voter restarted from it and the
journal must have every command. A single voter on loopback; liveness is polled with deadlines.
"""

from __future__ import annotations

import gzip
import secrets
import threading
from pathlib import Path
from typing import Any

import pytest
from quorum_helpers import free_port
from waiting import wait_for

from metadata_quorum import commands as c
from metadata_quorum.raft import DUMP_FILE, MetadataRaft, RaftTiming, load_snapshot_file
from proto import errors

PASSWORD = secrets.token_urlsafe(32)
NO_AUTOMATIC_DUMP = RaftTiming(snapshot_min_entries=1_000_000, snapshot_min_interval_s=3600.0)


def loaded(path: Path) -> Any:
    try:
        return load_snapshot_file(path)
    except (OSError, EOFError):
        return None


class HeldDumpWrites:
    """gzip streams writing the quorum's dump wait at their first write until ``release``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()
        self.writer_thread: str | None = None
        held = self
        original = gzip.GzipFile

        class Held(original):  # type: ignore[misc, valid-type]
            def write(self, data: Any) -> int:
                name = str(getattr(self.fileobj, "name", ""))
                if self.mode == gzip.WRITE and DUMP_FILE in name and not held.gate.is_set():
                    held.writer_thread = threading.current_thread().name
                    held.started.set()
                    held.gate.wait(60)
                return super().write(data)

        monkeypatch.setattr(gzip, "GzipFile", Held)

    def release(self) -> None:
        self.gate.set()


def start_voter(address: str, data_dir: Path) -> MetadataRaft:
    raft = MetadataRaft(address, [], data_dir, password=PASSWORD, timing=NO_AUTOMATIC_DUMP)
    wait_for(raft.is_leader, 30, "the single voter to lead")
    return raft


def test_commands_commit_while_the_dump_is_written_and_the_dump_is_the_state_at_its_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    address = f"127.0.0.1:{free_port()}"
    raft = start_voter(address, tmp_path)
    try:
        raft.propose(c.ActivateController(1, raft.term), 10)
        for b in (1, 2, 3):
            epoch = raft.propose(c.RegisterBroker(b, f"inc-{b}", [["BROKER", "127.0.0.1", 9000 + b]], ""), 10).value
            raft.propose(c.UnfenceBroker(b, epoch), 10)
        for t in range(5):
            assert raft.propose(c.CreateTopic(f"t{t}", f"id-{t}", {}, [[1, 2, 3], [2, 3, 1]] * 20), 10).ok
        at_index = raft.read(lambda s: s.to_snapshot())

        held = HeldDumpWrites(monkeypatch)
        try:
            raft.force_snapshot()
            wait_for(held.started.is_set, 30, "the dump to start being written")
            # The file is being written: the Raft thread must go on committing and applying.
            try:
                result = raft.propose(c.CreateTopic("during", "id-during", {}, [[1, 2, 3]]), 10)
            except errors.RequestTimedOutError:
                pytest.fail(f"no command committed while the dump was written (written on thread "
                            f"{held.writer_thread!r}: the Raft tick thread stops for as long as that takes)")
            assert result.ok
            assert held.writer_thread is not None and "autoTick" not in held.writer_thread
        finally:
            held.release()
        dump = tmp_path / DUMP_FILE
        state = wait_for(lambda: loaded(dump), 30, "the dump to be in place")
        assert state.to_snapshot() == at_index  # the state at the compacted index, not the one after
        final = raft.read(lambda s: s.to_snapshot())
        assert final != at_index and "during" in raft.read(lambda s: list(s.topics))
        assert not list(tmp_path.glob("*.writing")) and not (tmp_path / (DUMP_FILE + ".tmp")).exists()
    finally:
        raft.destroy_synchronous()

    # Restarted from the dump and the journal after it: every command, the one during the dump too.
    again = start_voter(address, tmp_path)
    try:
        wait_for(lambda: again.read(lambda s: s.to_snapshot()) == final, 30, "the restarted voter to replay its journal")
    finally:
        again.destroy_synchronous()


def test_the_dump_rename_is_made_durable_before_the_journal_is_trimmed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj trims the journal once ``status`` reports SUCCESS: the rename of the new dump over the old
    one must be on disk by then (its directory fsynced), or a power loss leaves the old dump and a journal
    that no longer has the entries in between."""
    import os

    events: list[tuple[str, str]] = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_replace(src, dst, *args, **kwargs)
        events.append(("replace", str(dst)))

    def fsync(fd: int) -> None:
        real_fsync(fd)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    raft = start_voter(f"127.0.0.1:{free_port()}", tmp_path)
    try:
        raft.propose(c.ActivateController(1, raft.term), 10)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "fsync", fsync)
        written = raft.dump_writer.written
        raft.force_snapshot()
        wait_for(lambda: raft.dump_writer.written > written, 30, "the dump to be written")
    finally:
        monkeypatch.undo()
        raft.destroy_synchronous()
    dump = str(tmp_path / DUMP_FILE)
    renamed = events.index(("replace", dump))
    assert ("fsync", str(tmp_path)) in events[renamed:], events

    # A dump pysyncobj received from a leader is loaded through the same hook, and pysyncobj clears the
    # journal after it: pysyncobj wrote and renamed that file without fsyncs, so loading makes both durable.
    # (Shown at a start, where the voter loads its dump through the same hook.)
    events.clear()
    monkeypatch.setattr(os, "fsync", fsync)
    again = start_voter(f"127.0.0.1:{free_port()}", tmp_path)
    monkeypatch.undo()
    again.destroy_synchronous()
    assert ("fsync", dump) in events and ("fsync", str(tmp_path)) in events, events
