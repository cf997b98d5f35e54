"""A thread pool that takes turns between clients: the broker's client-request threads (``num.io.threads``) and
recompression threads (``num.recompression.threads``).

A FIFO pool serves a client in proportion to how much it sends. One client pipelining produce requests of
1 KiB zstd batches that each inflate to 30 MiB (about 5 ms of a thread to decompress and check) had about 500
of them queued at a time, and every other client's work on those threads (a compressed produce, a fetch read,
a metadata answer) waited behind them: 0.7 s at the median, 1.4 s at worst, against 5.6 ms before the flood.

Here each client (``CLIENT``: its address, set by the request's handler before it hands work over) has a queue
of its own, and a free thread takes the oldest task of the next client in turn: one task each, round robin. A
client's flood then delays another client's task by at most one task per thread, whatever its length; a
client's own tasks still run in the order it sent them. What a client may queue at all is bounded where its
requests are admitted (``max.inflight.requests.per.ip``, broker/admission.py).

The interface is ``concurrent.futures.Executor``'s, so ``loop.run_in_executor`` hands work to it unchanged: the
client is read from the context of the call to ``submit`` (a ``contextvars.ContextVar``, which each asyncio task
has a copy of).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["CLIENT", "FairExecutor"]

# The client whose request the running code serves (its address); "" for work of no client.
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("brook_client", default="")

_Task = tuple[concurrent.futures.Future, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class FairExecutor(concurrent.futures.Executor):
    """``max_workers`` threads (started as work arrives) serving per-client queues in turn (see the module doc)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "fair") -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        # Clients with tasks waiting, in turn order (a dict keeps insertion order: served ones go to the back).
        self._queues: dict[str, deque[_Task]] = {}
        self._waiting = 0
        self._idle = 0  # threads waiting for work that no submit has woken yet
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    @property
    def max_workers(self) -> int:
        return self._max_workers

    def queued(self) -> int:
        """Tasks waiting for a thread."""
        return self._waiting

    def clients_waiting(self) -> int:
        """Clients with a task waiting for a thread."""
        return len(self._queues)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        client = CLIENT.get()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            queue = self._queues.get(client)
            if queue is None:
                queue = self._queues[client] = deque()
            queue.append((future, fn, args, kwargs))
            self._waiting += 1
            if self._idle > 0:
                self._idle -= 1  # counted off here, not when it wakes: the next submit wakes another one
                self._work.notify()
            elif len(self._threads) < self._max_workers:
                t = threading.Thread(target=self._run, name=f"{self._prefix}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        return future

    def _next(self) -> _Task | None:
        """The next client's oldest task (that client goes to the back of the turn), or None to stop."""
        with self._lock:
            while not self._queues:
                if self._shutdown:
                    return None
                self._idle += 1  # until a submit wakes it (and counts it off)
                self._work.wait()
            client, queue = next(iter(self._queues.items()))
            task = queue.popleft()
            del self._queues[client]
            if queue:
                self._queues[client] = queue
            self._waiting -= 1
            return task

    def _run(self) -> None:
        while (task := self._next()) is not None:
            future, fn, args, kwargs = task
            del task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller's to see, as ThreadPoolExecutor hands it over
                future.set_exception(exc)
                del exc
            else:
                future.set_result(result)
                del result
            del future, fn, args, kwargs

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for queue in self._queues.values():
                    for future, *_ in queue:
                        future.cancel()
                self._queues.clear()
                self._waiting = 0
            self._work.notify_all()
            threads = list(self._threads)
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join()
