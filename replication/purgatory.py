"""Delayed operations: requests that wait for a condition (HW passing a batch, new data).

As Kafka's purgatory: an operation is *watched* under one or more keys (a partition);
whoever changes a key's state calls ``check_and_complete(key)``, which tries to complete
the operations watching it. Operations with a deadline expire on a reaper thread that
sleeps on a heap of deadlines — nobody spins. Each operation completes exactly once:
either ``try_complete`` succeeded, or it expired, or it was cancelled.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable

log = logging.getLogger(__name__)


class DelayedOperation:
    """Base class. Subclasses implement ``_try_complete`` (return True once done) and ``_on_expire``."""

    kind = "operation"  # what the purgatory's count of waiting operations files it under

    def __init__(self, deadline_s: float | None) -> None:
        self.deadline_s = deadline_s
        self._done_lock = threading.Lock()
        self._done = False

    @property
    def is_done(self) -> bool:
        return self._done

    def try_complete(self) -> bool:
        """Complete the operation if its condition now holds; True when it is (or was) done."""
        with self._done_lock:
            if self._done:
                return True
            if self._try_complete():
                self._done = True
            return self._done

    def expire(self) -> bool:
        with self._done_lock:
            if self._done:
                return False
            self._done = True
        self._on_expire()
        return True

    def cancel(self) -> None:
        """Mark done without completing (the owner gave up waiting)."""
        with self._done_lock:
            self._done = True

    def force_complete(self, action: Callable[[], None]) -> bool:
        """Finish the operation now with ``action`` (e.g. an error), unless already done."""
        with self._done_lock:
            if self._done:
                return False
            self._done = True
        action()
        return True

    def _try_complete(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _on_expire(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class DelayedOperationPurgatory:
    """Watch lists per key plus a reaper thread for deadlines."""

    # Done operations are removed from watch lists lazily; purge when a list grows past this.
    PURGE_THRESHOLD = 1000

    def __init__(self, name: str, *, max_operations: int = 100_000) -> None:
        self.name = name
        self.max_operations = max_operations
        self._lock = threading.Lock()
        self._watchers: dict[Hashable, list[DelayedOperation]] = {}
        self._heap: list[tuple[float, int, DelayedOperation]] = []
        self._seq = itertools.count()
        self._wake = threading.Condition(self._lock)
        # When the reaper, asleep, wakes by itself (inf: no deadline; -inf: not asleep, it looks at the
        # heap before it sleeps). Under ``_lock``.
        self._reaper_wakes_at = float("-inf")
        self._stopped = False
        self._reaper = threading.Thread(target=self._reap_loop, name=f"purgatory-{name}", daemon=True)
        self._reaper.start()

    def watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Try to complete ``op`` at once; else watch it under ``keys``. True if done already.

        Checked again after registering, so a change racing with registration is not lost.
        """
        if op.try_complete():
            return True
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"purgatory {self.name} is shut down")
            if len(self._heap) >= self.max_operations:
                self._purge_locked()
            for key in keys:
                lst = self._watchers.setdefault(key, [])
                if len(lst) >= self.PURGE_THRESHOLD:
                    lst[:] = [o for o in lst if not o.is_done]
                lst.append(op)
            if op.deadline_s is not None:
                while self._heap and self._heap[0][2].is_done:
                    heapq.heappop(self._heap)  # keep the heap to live operations without the reaper's help
                heapq.heappush(self._heap, (op.deadline_s, next(self._seq), op))
                if op.deadline_s < self._reaper_wakes_at:
                    # Only a deadline before the reaper's own wake-up shortens its sleep. Not even
                    # every new earliest one: under one-at-a-time requests each is the earliest (its
                    # predecessor done), and the reaper, asleep until a done operation's deadline,
                    # wakes by then anyway. Waking it for each would put a thread switch into every
                    # acks=all produce.
                    self._wake.notify()
                    self._reaper_wakes_at = float("-inf")  # awake: it looks at the heap before it sleeps
        return op.try_complete()

    def check_and_complete(self, key: Hashable) -> int:
        """Try every operation watching ``key``; return how many completed."""
        with self._lock:
            ops = self._watchers.pop(key, None)
        if not ops:
            return 0
        completed = 0
        remaining: list[DelayedOperation] = []
        for op in ops:
            if op.is_done:
                continue
            if op.try_complete():
                completed += 1
            else:
                remaining.append(op)
        if remaining:
            with self._lock:
                self._watchers.setdefault(key, []).extend(remaining)
        return completed

    def complete_all(self, key: Hashable, action: Callable[[DelayedOperation], None]) -> int:
        """Force-finish every operation watching ``key`` (e.g. leadership lost)."""
        with self._lock:
            ops = self._watchers.pop(key, None) or []
        n = 0
        for op in ops:
            if op.force_complete(lambda op=op: action(op)):
                n += 1
        return n

    def watched(self, key: Hashable) -> int:
        with self._lock:
            return sum(1 for o in self._watchers.get(key, ()) if not o.is_done)

    def delayed_operations(self) -> dict[str, int]:
        """Operations waiting now, by ``kind`` (each once, however many keys it watches): Kafka's
        NumDelayedOperations. A walk of the watch lists, bounded by ``max_operations``; for metrics."""
        with self._lock:
            live = {id(o): o.kind for ops in self._watchers.values() for o in ops if not o.is_done}
        counts: dict[str, int] = {}
        for kind in live.values():
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.notify_all()
        self._reaper.join(timeout=5)

    def _purge_locked(self) -> None:
        self._heap = [e for e in self._heap if not e[2].is_done]
        heapq.heapify(self._heap)
        for key in list(self._watchers):
            live = [o for o in self._watchers[key] if not o.is_done]
            if live:
                self._watchers[key] = live
            else:
                del self._watchers[key]

    def _reap_loop(self) -> None:
        while True:
            expired: list[DelayedOperation] = []
            with self._lock:
                while not self._stopped:
                    now = time.monotonic()
                    while self._heap and (self._heap[0][2].is_done or self._heap[0][0] <= now):
                        _, _, op = heapq.heappop(self._heap)
                        if not op.is_done:
                            expired.append(op)
                    if expired:
                        break
                    wait_s = self._heap[0][0] - now if self._heap else None
                    self._reaper_wakes_at = self._heap[0][0] if self._heap else float("inf")
                    self._wake.wait(timeout=wait_s)
                    self._reaper_wakes_at = float("-inf")
                if self._stopped and not expired:
                    return
            for op in expired:
                try:
                    op.expire()
                except Exception:
                    log.exception("purgatory %s: expiring %r failed", self.name, op)
