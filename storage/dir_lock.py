"""An exclusive lock on a data directory for the life of the node that uses it (Kafka's ``.lock``).

Two processes writing one log or metadata directory would interleave appends, truncate each
other's segments and overwrite each other's checkpoints: silent corruption. A node takes an
``flock`` on ``<dir>/.lock`` for every directory it writes before any role starts, and a second
node pointed at the same directory refuses to start, naming the holder's pid. The kernel drops
the lock when the holder exits, however it exits (kill -9 included), so a restart never finds a
stale lock; a stopped (SIGSTOP) holder still holds it, as it should: it may resume.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

LOCK_FILE = ".lock"


class DirectoryInUseError(RuntimeError):
    """Another process holds the directory's lock."""


class DirectoryLock:
    """``acquire`` takes the lock (creating the directory if needed) or raises ``DirectoryInUseError``;
    ``release`` gives it back."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DirectoryInUseError(
                f"{self.directory} is in use by another process ({holder}, lock file {self.path}): "
                "two nodes must not share a log or metadata directory") from None
        except BaseException:
            os.close(fd)
            raise
        # Who holds it, for the refusal above (the lock itself is the flock, not this content).
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"


def lock_directories(directories: Iterable[Path]) -> list[DirectoryLock]:
    """Lock each distinct directory (a path named twice is locked once); all or none: on a refusal
    the locks already taken are released before ``DirectoryInUseError`` propagates."""
    locks: list[DirectoryLock] = []
    seen: set[Path] = set()
    try:
        for d in directories:
            key = d.resolve()
            if key in seen:
                continue
            seen.add(key)
            lock = DirectoryLock(d)
            lock.acquire()
            locks.append(lock)
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks
