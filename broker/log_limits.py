"""What a client can put in a node's log: how often, and in what shape.

Each refusal a client's request earns (a full budget, a bound reached) is worth a line to the operator, but
not one line per request: 53,443 refused group descriptions from one client wrote 13 MB of log in 45 s
(about 1 GB an hour, found by a probe). ``ThrottledWarning`` logs the first refusal of a period and counts
the rest, which its next line reports.

Log lines quote what clients choose (group and member ids, client ids, topic names): a group id holding a
newline and a timestamp wrote a forged ``ERROR`` line and ``Traceback`` into the log, and a NUL made the file
binary to grep (audit). ``OneLineFormatter`` escapes the control characters of every message, so a line of
the log is one record; a record's own traceback is still printed below it.
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
    """``warn(fmt, *args)`` logs at WARNING (or ``level``) on ``logger`` at most once every ``every_s`` seconds; the calls in
    between are counted and the next line says how many there were. When no call comes after them, the last
    of them is logged at the end of its period with that count: a burst that ends is still told in full
    (before, its count was lost unless the client did it again). Thread-safe."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 after: Callable[[float, Callable[[], None]], None] = _after, *, level: int = logging.WARNING) -> None:
        self._log = logger
        self._level = level  # WARNING by default; INFO for what a client may cause and is told of anyway
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
        self._log.log(self._level, fmt, *args)


# C0 controls but TAB, DEL, the C1 controls and the Unicode line and paragraph separators, as Python escapes them.
_ESCAPES = {c: {0x0A: "\\n", 0x0D: "\\r"}.get(c, f"\\x{c:02x}")
            for c in [*range(0x00, 0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0)]}
_ESCAPES.update({0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (``\\n``, ``\\x00``): one line, whatever a client put in it."""
    return text.translate(_ESCAPES)


class OneLineFormatter(logging.Formatter):
    """A formatter whose messages are one line each (``one_line``); the exception text of a record is not touched."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = one_line(record.message)
        return super().formatMessage(record)


def log_handler(fmt: str) -> logging.Handler:
    """The nodes' handler: standard error, ``OneLineFormatter`` on ``fmt``."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(fmt))
    return handler


# asyncio's SSL layer logs this at WARNING for each TLS connection its client ends during the handshake: the
# StreamReaderProtocol that Kafka listener connections start TLS on (StreamWriter.start_tls) learns it is over
# TLS only once the handshake is done, and asks to stay half-open meanwhile. Nothing is wrong and nothing is
# done about it: a churn audit counted 97-134 such lines a node over 6,000 connections, none telling anything.
_ASYNCIO_SSL_EOF = "returning true from eof_received() has no effect when using ssl"


class QuietAsyncioSslEof(logging.Filter):
    """Drops asyncio's ``_ASYNCIO_SSL_EOF`` warning; every other record of the ``asyncio`` logger passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _ASYNCIO_SSL_EOF
