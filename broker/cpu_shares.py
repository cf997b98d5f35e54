"""Each client address's share of the broker's interpreter: ``request.cpu.max.percent.per.ip``.

A broker is one Python process: its event loop and every worker thread take turns at one GIL. The client
pools take turns between addresses (broker/fair_pool.py), but turns bound waiting, not work: one address
sending ListGroups of 500 groups (about 12 ms of work each), 20 at a time, kept the broker's interpreter
busy, and another address's ApiVersions (the loop alone) went from 2 ms to 15-20 ms, its commits from
10 ms to 130 ms at the median, its rebalances from 0.1 s to 0.6 s. Nothing was refused and nothing logged.

Kafka's remedy is its request quota (``request_percentage``: a client's share of the I/O and network
threads' time), off unless configured. Here the same kind of bound is on by default, per client address,
and applies only while the broker has other clients: work the client pools did for an address (thread CPU
time of each task: io, recompression, group and the Kafka listener's parse pool) is summed over the last
``WINDOW_S``; while it is over ``max_share`` of one core and another address has sent a request in that
window, the address's next requests wait before they start, as Kafka's throttle mutes a channel, for as
long as its sum needs to come back under the share were it to send nothing more (Kafka's throttle time).
A lone client, a benchmark's, is never held. The event loop's own work for a request (reading it,
answering small ones) is not counted: the loop serves everyone and large answers are built off it.

Addresses are the bound's unit, as for ``max.connections.per.ip``: clients behind one NAT share it, and an
attacker with many addresses gets a share for each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

from broker.log_limits import ThrottledWarning

T = TypeVar("T")
log = logging.getLogger(__name__)

__all__ = ["CpuShares", "DEFAULT_MAX_PERCENT"]

DEFAULT_MAX_PERCENT = 50  # of one core, per client address, while the broker has other clients
WINDOW_S = 1.0
SLOTS = 10  # the window, in slots: a slot's work leaves the sum all at once, WINDOW_S / SLOTS after its end
MAX_DELAY_S = 1.0  # one wait at most; a request still over its share after it waits again
MAX_CLIENTS = 10_000  # addresses tracked; the least recently active ones are dropped first
METER_FLUSH_S = 0.001  # a metered coroutine's steps are charged once this much CPU has gathered, and at its end


class _Metered:
    """An awaitable that runs a coroutine, timing each step of it (its thread's CPU time) for ``charge``: summed
    here and charged once a millisecond has gathered, and at the end (a lock a step cost 3-4 us)."""

    __slots__ = ("_coro", "_client", "_shares", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], client: str, shares: CpuShares) -> None:
        self._coro, self._client, self._shares = coro, client, shares
        self._pending = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        return self  # type: ignore[return-value]

    def __iter__(self) -> _Metered:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: Any) -> Any:
        return self._step(self._coro.send, value)

    def throw(self, *exc: Any) -> Any:
        return self._step(self._coro.throw, *exc)

    def _step(self, step: Callable[..., Any], *args: Any) -> Any:
        started = time.thread_time()
        try:
            out = step(*args)
        except BaseException:  # StopIteration too: the coroutine's end
            self._flush(time.thread_time() - started)
            raise
        self._add(time.thread_time() - started)
        return out

    def _add(self, cpu_s: float) -> None:
        self._pending += cpu_s
        if self._pending >= METER_FLUSH_S:
            self._flush(0.0)

    def _flush(self, cpu_s: float) -> None:
        pending, self._pending = self._pending + cpu_s, 0.0
        self._shares.charge(self._client, pending)

    def close(self) -> None:
        self._coro.close()
        self._flush(0.0)


class _Usage:
    __slots__ = ("slots", "seen")

    def __init__(self) -> None:
        self.slots: list[list[float]] = []  # [slot number, CPU seconds], oldest first, at most SLOTS
        self.seen = -1  # the slot of its last request


class CpuShares:
    """Per-address CPU seconds of the client pools, and the wait an address over its share is given.
    Thread-safe: charged from pool threads, asked on the event loop."""

    def __init__(self, max_percent: float = DEFAULT_MAX_PERCENT, *, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = MAX_CLIENTS) -> None:
        if max_percent < 0:
            raise ValueError(f"max_percent must be >= 0 (0: no bound), not {max_percent}")
        self.max_share = max_percent / 100  # of one core; 0: no bound
        self._clock = clock
        self._slot_s = WINDOW_S / SLOTS
        self._max_clients = max_clients
        self._usage: OrderedDict[str, _Usage] = OrderedDict()
        self._lock = threading.Lock()
        self._others: tuple[int, str | None, bool] = (-1, None, False)  # (slot, address, another active?)
        # Addresses whose requests go one at a time (over their share): [their lock, requests waiting or
        # running]. Read and written on the event loop only.
        self._queues: dict[str, list[Any]] = {}
        self._held_warning = ThrottledWarning(log)
        self.throttled_total = 0  # requests made to wait
        self.throttle_seconds_total = 0.0

    def _slot(self) -> int:
        return int(self._clock() / self._slot_s)

    def _usage_locked(self, client: str) -> _Usage:
        usage = self._usage.get(client)
        if usage is None:
            usage = self._usage[client] = _Usage()
            if len(self._usage) > self._max_clients:
                self._usage.popitem(last=False)
        else:
            self._usage.move_to_end(client)
        return usage

    def held_addresses(self) -> int:
        """Addresses whose requests go one at a time now (over their share)."""
        return len(self._queues)

    def charge(self, client: str, cpu_s: float) -> None:
        """``client``'s task took ``cpu_s`` of its thread's CPU time."""
        if not self.max_share or not client or cpu_s <= 0:
            return
        now = self._slot()
        with self._lock:
            slots = self._usage_locked(client).slots
            if slots and slots[-1][0] == now:
                slots[-1][1] += cpu_s
            else:
                slots.append([now, cpu_s])
                if len(slots) > SLOTS:
                    del slots[0]

    def used_s(self, client: str) -> float:
        """CPU seconds charged to ``client`` in the window."""
        now = self._slot()
        with self._lock:
            usage = self._usage.get(client)
            return self._used_locked(usage, now) if usage is not None else 0.0

    @staticmethod
    def _used_locked(usage: _Usage, now: int) -> float:
        return sum(s for n, s in usage.slots if now - n < SLOTS)

    def delay_s(self, client: str) -> float:
        """How long ``client``'s request should wait before it starts (0: at once). Notes the request: the
        address is active, and holds other addresses to their share meanwhile."""
        if not self.max_share or not client:
            return 0.0
        now = self._slot()
        with self._lock:
            usage = self._usage_locked(client)
            usage.seen = now
            over = self._used_locked(usage, now) - self.max_share * WINDOW_S
            if over <= 0 or not self._another_active_locked(client, now):
                return 0.0
        # Kafka's throttle time: how long until the sum is back under the share with nothing more sent.
        return min(MAX_DELAY_S, over / self.max_share)

    def _another_active_locked(self, client: str, now: int) -> bool:
        """Has an address other than ``client`` sent a request within the window? Computed once a slot for
        one address (the walk is over every tracked address)."""
        slot, who, answer = self._others
        if slot == now and who == client:
            return answer
        answer = any(a != client and now - u.seen < SLOTS for a, u in reversed(self._usage.items()))
        self._others = (now, client, answer)
        return answer

    def metered(self, coro: Coroutine[Any, Any, T], client: str) -> Awaitable[T]:
        """``coro``, awaited with each of its steps on the event loop charged to ``client`` (the loop's work for
        the request: parsing and answering on the loop, between its waits)."""
        if not self.max_share or not client:
            return coro
        return _Metered(coro, client, self)

    async def run(self, client: str, request: Callable[[], Coroutine[Any, Any, T]], until: float | None = None) -> T:
        """``request()`` as one request of ``client``: it starts in the address's turn, and its steps on the event
        loop are charged to it. A unary gRPC call's handler and each message of a produce or fetch stream."""
        async with self.turn(client, until):
            return await self.metered(request(), client)

    @contextlib.asynccontextmanager
    async def turn(self, client: str, until: float | None = None) -> AsyncIterator[None]:
        """Around a request of ``client``: it starts at once while the address is within its share; over it, it
        waits (see delay_s) up to the monotonic time ``until`` (it then starts anyway, so a request waits at
        most its own timeout), and the address's requests go one at a time, each run to its end before the next
        one's wait begins, until none is waiting. Without that, every waiting request started the moment its
        address's sum came back under the share: 20 ListGroups at once, a burst that held other addresses'
        requests up to 90 ms."""
        queue = self._queues.get(client)
        if queue is None and self.delay_s(client) <= 0:
            yield
            return
        if queue is None:
            queue = self._queues[client] = [asyncio.Lock(), 0]
            self._held_warning.warn(
                "client address %s took %.0f%% of a core in the last second, over its share "
                "(request.cpu.max.percent.per.ip=%.0f) while other addresses have requests: its requests wait "
                "before they start, one at a time, until it is back under", client,
                100 * self.used_s(client) / WINDOW_S, 100 * self.max_share)
        queue[1] += 1
        try:
            async with queue[0]:
                await self._wait(client, until)
                yield
        finally:
            queue[1] -= 1
            if not queue[1]:
                del self._queues[client]

    async def _wait(self, client: str, until: float | None) -> None:
        waited = 0.0
        while (delay := self.delay_s(client)) > 0:
            if until is not None:
                delay = min(delay, until - time.monotonic())
                if delay <= 0:
                    break
            await asyncio.sleep(delay)
            waited += delay
        if waited:
            with self._lock:
                self.throttled_total += 1
                self.throttle_seconds_total += waited
