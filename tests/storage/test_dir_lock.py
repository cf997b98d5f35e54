"""A data directory's lock (storage/dir_lock.py) against real holder processes: refused while held,
free again the moment the holder dies, kill -9 included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.dir_lock import LOCK_FILE, DirectoryInUseError, DirectoryLock, lock_directories

HOLD = """
import sys, time
from pathlib import Path
from storage.dir_lock import DirectoryLock
DirectoryLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder() -> Iterator:
    """holder(path) -> a process holding path's lock (killed at teardown)."""
    procs: list[subprocess.Popen] = []

    def start(path: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[2])
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked", "the holder did not lock"
        return proc
    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)


def test_a_held_directory_is_refused_naming_the_holder(tmp_path: Path, holder) -> None:
    proc = holder(tmp_path / "data")
    with pytest.raises(DirectoryInUseError) as refused:
        DirectoryLock(tmp_path / "data").acquire()
    assert f"in use by another process (pid {proc.pid}" in str(refused.value), refused.value
    assert str(tmp_path / "data") in str(refused.value)


def test_kill_9_of_the_holder_frees_the_directory(tmp_path: Path, holder) -> None:
    proc = holder(tmp_path / "data")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    lock = DirectoryLock(tmp_path / "data")
    lock.acquire()  # no stale lock after a crash: the kernel dropped it with the process
    assert lock.held
    assert (tmp_path / "data" / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()


def test_a_stopped_holder_still_holds_it(tmp_path: Path, holder) -> None:
    proc = holder(tmp_path / "data")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(DirectoryInUseError):
            DirectoryLock(tmp_path / "data").acquire()  # it may resume and write again
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_one_process_cannot_lock_a_directory_twice_and_release_frees_it(tmp_path: Path) -> None:
    first = DirectoryLock(tmp_path)
    first.acquire()
    with pytest.raises(DirectoryInUseError):
        DirectoryLock(tmp_path).acquire()
    first.release()
    first.release()  # idempotent
    second = DirectoryLock(tmp_path)
    second.acquire()
    second.release()


def test_lock_directories_is_all_or_none_and_locks_a_path_once(tmp_path: Path, holder) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    locks = lock_directories([a, tmp_path / "x" / ".." / "a", b])  # a named twice: locked once
    assert [lock.directory for lock in locks] == [a, b]
    for lock in locks:
        lock.release()
    holder(b)
    with pytest.raises(DirectoryInUseError):
        lock_directories([a, b])
    assert _free(a), "the lock taken on a before the refusal on b was not released"


def _free(path: Path) -> bool:
    lock = DirectoryLock(path)
    try:
        lock.acquire()
    except DirectoryInUseError:
        return False
    lock.release()
    return True
