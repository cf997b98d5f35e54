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

Turns alone do not share the interpreter: threads share one GIL, and a client with tasks on 31 of 32 threads
had 31 turns at it for every one of another client's (a ListGroups flood of one address made another address's
commits 12x and its rebalances 5x slower). With ``running_per_client``, a client has at most that many tasks
running at a time; its other tasks wait for one of them to end, or to wait (``blocking()``: a task that waits
for a replicated write, and holds no share of the GIL meanwhile, gives its place up for the wait and takes a
place again, before the client's queued tasks, to go on). Threads are then for waiting, places for running.

The interface is ``concurrent.futures.Executor``'s, so ``loop.run_in_executor`` hands work to it unchanged: the
client is read from the context of the call to ``submit`` (a ``contextvars.ContextVar``, which each asyncio task
has a copy of).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CLIENT", "FairExecutor", "blocking"]

# The client whose request the running code serves (its address); "" for work of no client.
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("brook_client", default="")

_Task = tuple[concurrent.futures.Future, Callable[..., Any], tuple[Any, ...], dict[str, Any]]

# The pool and client of the task the current thread runs (None outside a capped pool's task): read by blocking().
_running_task = threading.local()


@contextmanager
def blocking() -> Iterator[None]:
    """Around a wait that holds no share of the interpreter (a replicated write's future): the task's place
    among its client's running tasks is free meanwhile (see the module doc). Anywhere else, nothing."""
    current = getattr(_running_task, "current", None)
    if current is None:
        yield
        return
    pool, client = current
    pool._step_out(client)
    try:
        yield
    finally:
        pool._step_in(client)


class FairExecutor(concurrent.futures.Executor):
    """``max_workers`` threads (started as work arrives) serving per-client queues in turn (see the module doc)."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "fair",
                 running_per_client: int | None = None, cpu: Any = None) -> None:
        if max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if running_per_client is not None and running_per_client <= 0:
            raise ValueError("running_per_client must be greater than 0")
        self._max_workers = max_workers
        self._cap = running_per_client
        self._cpu = cpu  # broker/cpu_shares.CpuShares: each task's thread CPU time is charged to its client
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        # Clients with tasks waiting, in turn order (a dict keeps insertion order: served ones go to the back).
        self._queues: dict[str, deque[_Task]] = {}
        self._waiting = 0
        # With a cap: each client's tasks running (not in blocking()), and those back from a wait for a place.
        self._running: dict[str, int] = {}
        self._resuming: dict[str, int] = {}
        self._places = threading.Condition(self._lock)  # resuming tasks wait here for their client's place
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
            if self._eligible_locked(client):
                self._wake_locked()
        return future

    def _wake_locked(self) -> None:
        """A thread for a task that may run now: an idle one, else a new one (up to max_workers)."""
        if self._idle > 0:
            self._idle -= 1  # counted off here, not when it wakes: the next submit wakes another one
            self._work.notify()
        elif len(self._threads) < self._max_workers:
            t = threading.Thread(target=self._run, name=f"{self._prefix}_{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _eligible_locked(self, client: str) -> bool:
        """May a queued task of ``client`` start (its running tasks under the cap, none waiting to go on)?"""
        return self._cap is None or (self._running.get(client, 0) < self._cap and not self._resuming.get(client))

    def _next(self) -> tuple[str, _Task] | None:
        """The oldest task of the next client in turn that may start (that client goes to the back of the turn),
        or None to stop."""
        with self._lock:
            while True:
                client = next((c for c in self._queues if self._eligible_locked(c)), None)
                if client is not None:
                    break
                if self._shutdown and not self._queues:
                    self._work.notify_all()  # the other threads, waiting for a place to free, stop too
                    return None
                self._idle += 1  # until a submit or a freed place wakes it (and counts it off)
                self._work.wait()
            queue = self._queues.pop(client)
            task = queue.popleft()
            if queue:
                self._queues[client] = queue
            self._waiting -= 1
            if self._cap is not None:
                self._running[client] = self._running.get(client, 0) + 1
            return client, task

    def _leave_place_locked(self, client: str) -> None:
        """One of ``client``'s running tasks ended or began to wait: its place goes to the client's task back from
        a wait, else to its next queued one (on a thread woken for it: the one that ran the ended task may take
        another client's, in turn)."""
        left = self._running[client] - 1
        if left:
            self._running[client] = left
        else:
            del self._running[client]
        if self._resuming.get(client):
            self._places.notify_all()
        elif client in self._queues:
            self._wake_locked()

    def _step_out(self, client: str) -> None:
        with self._lock:
            self._leave_place_locked(client)

    def _step_in(self, client: str) -> None:
        with self._lock:
            self._resuming[client] = self._resuming.get(client, 0) + 1
            try:
                while self._running.get(client, 0) >= self._cap:  # type: ignore[operator]
                    self._places.wait()
            finally:
                if (left := self._resuming[client] - 1):
                    self._resuming[client] = left
                else:
                    del self._resuming[client]
            self._running[client] = self._running.get(client, 0) + 1

    def _run(self) -> None:
        while (picked := self._next()) is not None:
            client, (future, fn, args, kwargs) = picked
            del picked
            if not future.set_running_or_notify_cancel():
                self._task_done(client)
                continue
            if self._cap is not None:
                _running_task.current = (self, client)
            failed: BaseException | None = None
            result = None
            started = time.thread_time()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller's to see, as ThreadPoolExecutor hands it over
                failed = exc
                del exc
            finally:
                _running_task.current = None
                if self._cpu is not None:
                    self._cpu.charge(client, time.thread_time() - started)
                self._task_done(client)  # its place is free before its caller hears of it
            if failed is not None:
                future.set_exception(failed)
            else:
                future.set_result(result)
            del future, fn, args, kwargs, result, failed

    def _task_done(self, client: str) -> None:
        if self._cap is not None:
            with self._lock:
                self._leave_place_locked(client)

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
