"""Admission control (broker/admission.py): per-client bounds and the in-flight byte budget.

Pure asyncio on a real event loop; the multi-process behaviour is in test_isolation.py.
"""

from __future__ import annotations

import asyncio

import pytest
from waiting import await_for

from broker.admission import (
    OVERLOADED_PREFIX,
    ByteBudget,
    ClientByteShares,
    ClientLimits,
    ConnectionDeadline,
    Overloaded,
    peer_host,
)


@pytest.mark.parametrize(("peer", "host"), [
    ("ipv4:127.0.0.1:51234", "127.0.0.1"),
    ("ipv6:[::1]:51234", "::1"),
    ("unix:/tmp/sock", "unix:/tmp/sock"),
])
def test_peer_host_names_the_client_address_without_its_port(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_client_limits_refuse_past_the_bound_and_forget_idle_clients() -> None:
    limits = ClientLimits(max_in_flight=2, max_waiting=1)
    limits.enter("a")
    limits.enter("a")
    with pytest.raises(Overloaded) as info:
        limits.enter("a")
    assert str(info.value).startswith(OVERLOADED_PREFIX)
    limits.enter("b")  # another client is not affected by a's requests
    limits.start_waiting("a")
    with pytest.raises(Overloaded):
        limits.start_waiting("a")
    assert limits.usage("a") == (2, 1) and limits.refused_total == 2
    limits.stop_waiting("a")
    limits.leave("a")
    limits.leave("a")
    limits.leave("b")
    assert limits.clients == 0, "a client with nothing in flight must not stay in the table"


def test_byte_budget_grants_in_order_and_wakes_waiters_on_release() -> None:
    async def scenario() -> list[str]:
        budget = ByteBudget(100)
        order: list[str] = []
        assert await budget.acquire(60) == 60
        assert not budget.try_acquire(50), "over the budget"

        async def take(name: str, n: int) -> None:
            await budget.acquire(n)
            order.append(name)

        big = asyncio.create_task(take("big", 80))
        await asyncio.sleep(0)
        small = asyncio.create_task(take("small", 10))
        await asyncio.sleep(0)
        assert order == [] and not budget.try_acquire(10), "FIFO: a waiter blocks later grants, even small ones"
        budget.release(60)
        await asyncio.wait_for(asyncio.gather(big, small), 5)
        assert budget.used_bytes == 90
        budget.release(90)
        assert budget.used_bytes == 0
        return order

    assert asyncio.run(scenario()) == ["big", "small"]


def test_byte_budget_cuts_a_grant_to_the_whole_budget_and_survives_cancellation() -> None:
    async def scenario() -> None:
        budget = ByteBudget(100)
        assert await budget.acquire(10**9) == 100, "one huge request still proceeds when alone"
        waiter = asyncio.create_task(budget.acquire(50))
        await asyncio.sleep(0)
        waiter.cancel()  # the RPC was cancelled while waiting for bytes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        budget.release(100)
        assert budget.used_bytes == 0, "a cancelled waiter must not keep bytes"
        assert budget.try_acquire(100)

    asyncio.run(scenario())


def test_client_byte_shares_hold_each_address_to_its_share_and_forget_idle_ones() -> None:
    async def run() -> None:
        shares = ClientByteShares(100)
        assert await shares.acquire("a", 10**9) == 100, "a grant is cut to the share"
        waiting = asyncio.create_task(shares.acquire("a", 30))
        await asyncio.sleep(0)
        assert not waiting.done(), "a client at its share waits for its own bytes"
        assert await asyncio.wait_for(shares.acquire("b", 60), 5) == 60, "another address is not held up"
        shares.release("a", 40)
        assert await asyncio.wait_for(waiting, 5) == 30
        assert (shares.held("a"), shares.held("b"), shares.clients) == (90, 60, 2)
        shares.release("a", 90)
        shares.release("b", 60)
        assert shares.clients == 0, "an address holding nothing is forgotten"

        # A grant of nothing (a fetch asking at most 0 bytes) holds nothing, and giving it back is a no-op
        # (the fuzzer found the KeyError this once raised: tests/fuzz/corpus/rpc/fetch-max-bytes-1-nothing-granted).
        assert await shares.acquire("c", 0) == 0
        assert shares.clients == 0
        shares.release("c", 0)

        # A waiter cancelled (its call went away) leaves nothing behind.
        assert await shares.acquire("d", 100) == 100
        cancelled = asyncio.create_task(shares.acquire("d", 1))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        shares.release("d", 100)
        assert shares.clients == 0

    asyncio.run(run())


async def _expiry_after(deadline_set: list[float]) -> tuple[ConnectionDeadline, list[float]]:
    """The deadlines set one after the other, and when the expiry came (polled for, within 5 s)."""
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = ConnectionDeadline(loop, lambda: fired.append(loop.time()))
    for s in deadline_set:
        deadline.within(s)
    await await_for(lambda: fired, 5, "the deadline to fire")
    return deadline, fired


async def test_a_connection_deadline_fires_once_when_it_passes() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline, fired = await _expiry_after([0.05])
    assert len(fired) == 1 and fired[0] - start >= 0.05 - 0.001, f"fired at {[f - start for f in fired]}"
    assert deadline.fired


async def test_a_shorter_deadline_set_later_is_kept() -> None:
    """The receive timeout of a frame's body, set after the idle wait's longer one, is not missed."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    _, fired = await _expiry_after([30.0, 0.05])
    assert len(fired) == 1 and fired[0] - start < 0.25, f"fired at {[f - start for f in fired]}"


async def test_a_deadline_moved_on_before_it_passes_does_not_fire() -> None:
    """A connection whose frames keep coming (each wait's deadline set anew) is not closed, however long
    it lives, and a cleared deadline (a request being handled) never fires."""
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = ConnectionDeadline(loop, lambda: fired.append(loop.time()))
    window = 0.05
    renewed: list[float] = []
    for _ in range(30):  # 0.3 s of waits, each within 0.05 s
        deadline.within(window)
        renewed.append(loop.time())
        await asyncio.sleep(0.01)
    deadline.clear()
    renewed.append(loop.time())
    await asyncio.sleep(0.15)
    # It may fire only where the loop itself ran a renewal late (a loaded machine stalls it past the window; the
    # test failed so once in a suite run beside three clusters): never otherwise.
    late = [round(b - a, 3) for a, b in zip(renewed, renewed[1:], strict=False) if b - a >= window - 0.002]
    assert (fired == [] and not deadline.fired) or late, f"fired at {fired} though every renewal came in time"
    deadline.within(0.02)  # and still enforced afterwards
    if fired:
        # It fired at a late renewal (allowed above): a deadline fires once, for good (its connection is closed),
        # so the one set after the clear cannot fire again. Before, the test waited 5 s for a second firing.
        await asyncio.sleep(0.1)
        assert len(fired) == 1 and deadline.fired
        return
    await await_for(lambda: len(fired) == 1, 5, "the deadline set after the clear to fire")


async def test_a_cancelled_deadline_never_fires() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = ConnectionDeadline(loop, lambda: fired.append(loop.time()))
    deadline.within(0.02)
    deadline.cancel()
    await asyncio.sleep(0.1)
    assert fired == []


async def test_a_deadline_already_passed_fires_at_once() -> None:
    """A wait whose time is already spent (what is left of a login) expires before the read, even when the
    bytes it waits for are already buffered: the read must not return them."""
    fired: list[str] = []
    deadline = ConnectionDeadline(asyncio.get_running_loop(), lambda: fired.append("expired"))
    deadline.within(0.0)
    assert fired == ["expired"] and deadline.fired
    deadline.within(-1.0)
    assert fired == ["expired"], "expired twice"
