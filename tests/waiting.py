"""Polling with a deadline: the one way tests wait for a condition.

A test never sleeps hoping something happened; it polls ``cond`` until it returns
something truthy and fails, at the deadline, saying what it waited for and what it
last saw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout_s: float = 10.0, what: str | Callable[[], str] = "a condition",
             poll_s: float = 0.05) -> T:
    """Return ``cond()``'s first truthy value; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(poll_s)
    raise _timed_out(timeout_s, what, last)


async def await_for(cond: Callable[[], T], timeout_s: float = 10.0, what: str | Callable[[], str] = "a condition",
                    poll_s: float = 0.005) -> T:
    """``wait_for`` inside a coroutine: the event loop runs between polls."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        await asyncio.sleep(poll_s)
    raise _timed_out(timeout_s, what, last)


def _timed_out(timeout_s: float, what: str | Callable[[], str], last: object) -> AssertionError:
    described = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout_s} s waiting for {described}; last saw {last!r}")
