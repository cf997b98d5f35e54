"""Hand-overs to the broker's event loop on the acks=all path (broker/replica_manager.py).

``call_on_loop`` runs a completion at once when it happens on the loop's own thread (a follower's
acknowledgement handled there completing a produce, an append there waking a follower's fetch
session) and through ``call_soon_threadsafe`` from any other thread. ``until_resolved`` waits for
a future with a deadline without the extra loop turn of ``asyncio.wait_for``: at the deadline the
future is resolved with None, and a later result is dropped.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from waiting import await_for

from broker.replica_manager import _resolve, call_on_loop, until_resolved


def test_on_the_loop_thread_the_completion_runs_at_once_elsewhere_on_the_loop() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        call_on_loop(loop, threading.get_ident(), lambda: ran.append(threading.get_ident()))
        assert ran == [threading.get_ident()], "on the loop's thread: before call_on_loop returns"

        fut = loop.create_future()
        worker = threading.Thread(target=call_on_loop, args=(loop, threading.get_ident(), _resolve, fut, 7))
        worker.start()
        worker.join(5)
        assert await asyncio.wait_for(fut, 5) == 7, "from another thread: on the loop"

    asyncio.run(scenario())


def test_a_closed_loop_drops_a_completion_from_another_thread() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    call_on_loop(loop, threading.get_ident() + 1, lambda: pytest.fail("ran on a closed loop"))


def test_until_resolved_returns_the_result_or_none_at_the_deadline() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(_resolve, fut, "data")
        assert await until_resolved(fut, 5) == "data"

        late = loop.create_future()
        assert await until_resolved(late, 0.01) is None
        assert late.done() and late.result() is None, "the deadline resolves the future"
        _resolve(late, "too late")  # a waker that comes after: dropped
        assert late.result() is None

    asyncio.run(scenario())


def test_a_cancelled_wait_cancels_the_future_and_its_timer() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        def timers() -> list[asyncio.TimerHandle]:
            return [h for h in loop._scheduled  # type: ignore[attr-defined]
                    if not h.cancelled() and h._callback is _resolve]

        waiting = asyncio.ensure_future(until_resolved(fut, 60))
        await await_for(timers, 5, "the wait to set its deadline timer")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert fut.cancelled(), "the RPC was cancelled: nobody waits for the future any more"
        assert timers() == [], f"the deadline timer outlived the wait: {timers()}"

    asyncio.run(scenario())
