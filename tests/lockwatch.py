"""A re-entrant lock that records every acquisition that could have waited.

Code on the broker's event loop must never wait for a lock another thread may hold. Holding
one it try-acquired and re-entering it is fine; a blocking ``acquire`` of a lock this thread
does not already hold is a wait, whether or not another thread happened to hold it at that
moment. ``WaitWatchingLock.install(obj)`` puts one in place of ``obj._lock`` and lists such
acquisitions (with the caller's stack) in ``waits``, so a test can show a path never waits
without having to win a race. ``held_by_another_thread(lock)`` is the other half: the lock
held by a second thread for the duration of a block (an append, retention or a flush in progress).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class WaitWatchingLock:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0
        self.waits: list[str] = []  # one formatted stack per acquisition that could have waited

    @classmethod
    def install(cls, obj: Any, attr: str = "_lock") -> WaitWatchingLock:
        watched = cls()
        setattr(obj, attr, watched)
        return watched

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if blocking and self._owner != me:
            self.waits.append("".join(traceback.format_stack(limit=8)[:-1]))
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._owner = me
            self._depth += 1
        return got

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by a second thread until the block ends."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, name="lock-holder", daemon=True)
    holder.start()
    try:
        assert held.wait(10), "the holder thread never got the lock"
        yield
    finally:
        release.set()
        holder.join(10)
