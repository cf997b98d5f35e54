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


def while_running(query, cond):  # type: ignore[no-untyped-def]
    """``cond`` for wait_for (or wait_until) that fails at once, with Spark's reason, once the query has died.

    Without it a query that Spark ended (a task failure, a Python worker that did not start)
    is only seen at the deadline, as rows that never came.
    """
    def check():  # type: ignore[no-untyped-def]
        if not query.isActive:
            raise AssertionError(f"the streaming query ended while waited on: {query.exception()}")
        return cond()
    return check
