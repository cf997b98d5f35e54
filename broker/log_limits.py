"""A WARNING a client can cause, logged at most once per period.

Each refusal a client's request earns (a full budget, a bound reached) is worth a line to the operator, but
not one line per request: 53,443 refused group descriptions from one client wrote 13 MB of log in 45 s
(about 1 GB an hour, found by a probe). ``ThrottledWarning`` logs the first refusal of a period and counts
the rest, which its next line reports.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


def _after(delay_s: float, fn: Callable[[], None]) -> None:
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True
    timer.start()


class ThrottledWarning:
    """``warn(fmt, *args)`` logs at WARNING on ``logger`` at most once every ``every_s`` seconds; the calls in
    between are counted and the next line says how many there were. When no call comes after them, the last
    of them is logged at the end of its period with that count: a burst that ends is still told in full
    (before, its count was lost unless the client did it again). Thread-safe."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 after: Callable[[float, Callable[[], None]], None] = _after) -> None:
        self._log = logger
        self._clock = clock
        self._every_s = every_s
        self._after = after  # runs a function after a delay (a timer thread; a test's hand)
        self._lock = threading.Lock()
        self._logged_at = float("-inf")
        self._unlogged = 0
        self._last: tuple[str, tuple[object, ...]] | None = None  # the latest call not logged
        self._flush_due = False

    def warn(self, fmt: str, *args: object) -> bool:
        """True when this call was logged."""
        now = self._clock()
        with self._lock:
            if now - self._logged_at < self._every_s:
                self._unlogged += 1
                self._last = (fmt, args)
                if not self._flush_due:
                    self._flush_due = True
                    self._after(max(0.0, self._logged_at + self._every_s - now), self._flush)
                return False
            more, self._logged_at, self._unlogged, self._last = self._unlogged, now, 0, None
        self._emit(fmt, args, more)
        return True

    def _flush(self) -> None:
        """The end of a period with calls not logged: the last of them, unless a later call logged their count."""
        with self._lock:
            self._flush_due = False
            if self._last is None:
                return
            (fmt, args), more = self._last, self._unlogged - 1  # the line itself is one of them
            self._logged_at, self._unlogged, self._last = self._clock(), 0, None
        self._emit(fmt, args, more)

    def _emit(self, fmt: str, args: tuple[object, ...], more: int) -> None:
        if more:
            fmt += " (%d more since the last such line)"
            args = (*args, more)
        self._log.warning(fmt, *args)
