"""Pauses that hold up every request of a node: its event loop not running, and garbage collection.

Every produce, fetch and follower fetch of a broker passes through its one asyncio loop (see
``broker/server.py``), so any callback that runs long, on purpose or not, delays all of them; and
a collection of the garbage collector stops every thread of the process. Neither shows in the
request metrics as a cause, only as latency. These make both visible:

- ``LoopMonitor``: a callback on the loop every ``interval_s`` records how late it ran (the loop's
  *lag*: what a request that became ready at that moment waited for the loop beyond its own
  work) into a histogram, and stamps the time for ``/livez``. A watchdog thread reports a loop
  that has not run for ``stall_s`` while it is still stuck, with the stack of the loop's thread
  (as Redpanda reports a stalled reactor with a backtrace); when the loop runs again, how long it
  stalled. Both reports are rate-limited; the stall counter is not.
- ``GcPauses``: ``gc.callbacks`` time every collection, by generation.

The roles count here (no Prometheus code); ``broker.metrics.PauseCollector`` exports them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from broker.request_times import LatencyHistogram

log = logging.getLogger(__name__)

# Upper bounds in seconds. An idle loop runs its timers within a fraction of a millisecond.
LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
GC_PAUSE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOOP_PROBE_INTERVAL_S = 0.05
DEFAULT_STALL_S = 0.25  # event.loop.stall.warn.ms
STACK_REPORT_EVERY_S = 30.0  # at most one stack per this long: a loop that stalls often would flood the log
RESUME_REPORT_EVERY_S = 10.0
STACK_FRAMES = 16


class LoopMonitor:
    """Lag histogram, stall count and watchdog of one asyncio loop. ``start`` from any thread."""

    def __init__(self, name: str, *, interval_s: float = LOOP_PROBE_INTERVAL_S, stall_s: float = DEFAULT_STALL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or stall_s <= 0:
            raise ValueError(f"interval_s and stall_s must be positive: {interval_s}, {stall_s}")
        self.name = name
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.lag = LatencyHistogram(LOOP_LAG_BUCKETS_S)
        self.stalls_total = 0  # loop runs that came stall_s or more late (written on the loop only)
        self._clock = clock
        self.last_beat = clock()  # when the probe last ran: /livez reads it
        self._due = float("inf")  # when the probe should run next (inf: not scheduled yet)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._last_stack_report = float("-inf")
        self._stacks_skipped = 0
        self._last_resume_report = float("-inf")
        self._resumes_skipped = 0

    def start(self, loop: asyncio.AbstractEventLoop, loop_thread: threading.Thread) -> None:
        self._loop = loop
        self._thread_id = loop_thread.ident
        self.last_beat = self._clock()
        loop.call_soon_threadsafe(self._probe)
        self._watchdog = threading.Thread(target=self._watch, name=f"{self.name.replace(' ', '-')}-loop-watchdog",
                                          daemon=True)
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=5)

    # ---- on the loop ----
    def _probe(self) -> None:
        now = self._clock()
        late = now - self._due
        if self._due != float("inf"):  # not on the first run
            self.lag.observe(late)  # negative only within the clock's resolution: counted as 0
            if late >= self.stall_s:
                self.stalls_total += 1
                self._report_resume(late, now)
        self.last_beat = now
        self._due = now + self.interval_s
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self._stop.is_set():
            loop.call_later(self.interval_s, self._probe)

    def _report_resume(self, late: float, now: float) -> None:
        if now - self._last_resume_report < RESUME_REPORT_EVERY_S:
            self._resumes_skipped += 1
            return
        more = f"; {self._resumes_skipped} more stall(s) since the last report" if self._resumes_skipped else ""
        log.warning("%s: the event loop ran again, %.0f ms late (event.loop.stall.warn.ms=%.0f; %d stall(s) "
                    "since start%s): every request that was ready waited up to that long",
                    self.name, late * 1000, self.stall_s * 1000, self.stalls_total, more)
        self._last_resume_report = now
        self._resumes_skipped = 0

    # ---- watchdog thread ----
    def _watch(self) -> None:
        check_s = max(0.005, self.stall_s / 4)
        reported_due = None
        while not self._stop.wait(check_s):
            due = self._due
            now = self._clock()
            late = now - due
            if late < self.stall_s or due == reported_due:
                continue
            reported_due = due  # one report per stall
            if now - self._last_stack_report < STACK_REPORT_EVERY_S:
                self._stacks_skipped += 1
                continue
            stack = self._loop_stack()
            if self._due != due:
                continue  # the loop ran meanwhile (e.g. the whole process was stopped): the stack is not the stall's
            more = (f" ({self._stacks_skipped} earlier stall(s) not shown)" if self._stacks_skipped else "")
            log.warning("%s: the event loop is stalled, %.0f ms late (event.loop.stall.warn.ms=%.0f)%s; "
                        "its thread is at:\n%s", self.name, late * 1000, self.stall_s * 1000, more, stack)
            self._last_stack_report = now
            self._stacks_skipped = 0

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._thread_id) if self._thread_id is not None else None
        if frame is None:
            return "  (the loop's thread is gone)"
        return "".join(traceback.format_stack(frame, limit=STACK_FRAMES)).rstrip()


class GcPauses:
    """Time of each garbage collection, by generation (0, 1, 2). ``install`` once per process."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.by_generation = tuple(LatencyHistogram(GC_PAUSE_BUCKETS_S) for _ in range(3))
        self._clock = clock
        self._started: float | None = None
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:
                pass
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Collections run in whichever thread allocated, one at a time (the GIL), so start and stop pair up.
        if phase == "start":
            self._started = self._clock()
        elif self._started is not None:
            generation = info.get("generation", 2)
            if 0 <= generation < len(self.by_generation):
                self.by_generation[generation].observe(self._clock() - self._started)
            self._started = None
