"""Admission control for the broker's client-facing requests: what one client may hold.

Everything here lives on the broker's asyncio loop thread (broker/server.py) and is
touched only from it, so it needs no lock. Three bounds:

- ``ClientLimits``: per client address (the IP of ``context.peer()``), how many requests
  it has in flight and how many of them are long polls parked in the fetch purgatory
  (Kafka's ``max.connections.per.ip`` in spirit: gRPC multiplexes a client's requests on
  few connections, so the request is the unit). A unary request counts until its answer is
  written out, not only while it is handled (broker/service.py ``_admitted``). Excess is refused
  at once with the gRPC status RESOURCE_EXHAUSTED, which the client library retries after a backoff.
- ``ByteBudget``: the bytes of fetch responses being built or not yet delivered and of
  produce requests being handled, across all clients (Kafka's ``queued.max.request.bytes``):
  N concurrent huge fetches wait their turn instead of multiplying the broker's memory.
- ``ClientByteShares``: each client address's share of those fetch-response bytes. A fetch
  response is held until its call ends (gRPC has written it out, or the call was cancelled), not
  only while it is built: a client that never reads its answers (an HTTP/2 peer that grants no
  flow-control window, a stopped process) would otherwise leave every answer in the server's
  buffers, and 50 such calls on one connection held 1.9 GB. A client at its share waits for its
  own answers to be delivered; the others go on.

And one bound on each request, ``refuse_oversized``: how many partitions (topics, groups) it may name.

Follower fetches from other brokers and health checks do not pass through here: they
have their own capacity (server.py), so a client flood never starves replication.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from broker.config import per_ip_override_entries
from metadata_quorum.security import acl_host

if TYPE_CHECKING:
    from broker.address_bar import AddressBar

log = logging.getLogger(__name__)


# connections.max.idle.ms (Kafka's default): a connection with no request for this long is closed, on
# the Kafka listeners and (as gRPC's max_connection_idle: no call open) on the gRPC ports.
DEFAULT_CONNECTION_IDLE_MS = 600_000

# max.connections.per.ip: a tenth of max.connections, so one client address cannot take a port's every
# connection (Kafka listeners, the gRPC ports: broker/grpc_connections.py).
DEFAULT_CONNECTIONS_PER_IP = 1000


def normal_ip(address: str) -> str:
    """An IP as the bounds compare them, in the canonical form ACLs use (an IPv4-mapped IPv6 address as the
    IPv4 one); anything that is not an IP as given."""
    try:
        return acl_host(address)
    except ValueError:
        return address


class ConnectionsPerIp:
    """``max.connections.per.ip`` and its ``overrides``: how many connections one client address may hold.
    A host name among the overrides stands for every address it resolves to when the node starts (Kafka
    resolves it when the config is read); one that does not resolve is skipped with a WARNING, so a name
    service down at start does not keep the node down."""

    def __init__(self, default: int, overrides: list[str] | None = None, what: str = "",
                 resolve: Callable[..., list[Any]] = socket.getaddrinfo) -> None:
        self.default = default
        self.overrides: dict[str, int] = {}
        for host, count in per_ip_override_entries(overrides or []):
            try:
                addresses = {normal_ip(str(info[4][0])) for info in resolve(host, None)}
            except OSError as e:
                log.warning("%s: max.connections.per.ip.overrides: %r does not resolve (%s); its override is "
                            "skipped", what, host, e)
                continue
            for address in addresses:
                self.overrides[address] = count

    @classmethod
    def of(cls, defaults: dict[str, str], what: str) -> ConnectionsPerIp:
        """From a node's config (``max.connections.per.ip`` and ``max.connections.per.ip.overrides``)."""
        overrides = [e.strip() for e in defaults.get("max.connections.per.ip.overrides", "").split(",") if e.strip()]
        return cls(int(defaults.get("max.connections.per.ip", str(DEFAULT_CONNECTIONS_PER_IP))), overrides, what)

    @property
    def lowest(self) -> int:
        """The lowest bound of any address: no address is past its bound while fewer are open in all."""
        return min([self.default, *self.overrides.values()])

    def __call__(self, address: str) -> int:
        if not self.overrides:
            return self.default
        return self.overrides.get(normal_ip(address), self.default)


async def stop_serving(server: asyncio.AbstractServer | None, tasks: set[asyncio.Task[Any]],
                       timeout_s: float = 2.0) -> None:
    """Stop an asyncio listener (the Kafka and replication listeners): accept no more connections, cancel
    each connection's task and wait up to ``timeout_s`` for them to end."""
    if server is not None:
        server.close()
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.wait(list(tasks), timeout=timeout_s)


# An address refused at its max.connections.per.ip more than this many times within a second is barred from the
# port in the kernel (broker/address_bar.py): a flood, not a client retrying with a backoff (Kafka's clients
# wait reconnect.backoff.ms, 50 ms at first, between attempts).
BAR_AFTER_REFUSALS = 20
REFUSALS_WINDOW_S = 1.0
MAX_COUNTED_ADDRESSES = 4096  # addresses whose refusals are being counted (a flood from many is dropped)
BAR_REVIEW_S = 1.0  # how often barred addresses are looked at, for the bars to lift


class ConnectionSlots:
    """The connections an asyncio listener (the Kafka and replication listeners) holds: at most
    ``max_connections`` in all and ``max_per_address`` from one client address, counted at accept, before
    any TLS handshake. ``stats`` (the listener's) gets ``connections``, ``connections_total`` and
    ``refused_connections_total``.

    With a ``bar`` (an ``address_bar.AddressBar`` on the listener's sockets, set once it listens), an address
    refused at its bound more than ``BAR_AFTER_REFUSALS`` times within ``REFUSALS_WINDOW_S`` is barred: the
    kernel drops its new connections, which then cost the loop nothing and leave the accept queue to others.
    Loop thread only."""

    def __init__(self, max_connections: int, max_per_address: ConnectionsPerIp, stats: Any,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.stats = stats
        self.bar: AddressBar | None = None
        self._by_address: dict[str, int] = {}  # client address -> its open connections
        self._refusals: dict[str, tuple[float, int]] = {}  # address -> (its window's start, refusals in it)
        self._clock = clock
        self._review: asyncio.TimerHandle | None = None

    def take(self, host: str) -> bool:
        """Count a connection from ``host``; False (counted as refused) when either bound is reached."""
        mine = self._by_address.get(host, 0)
        if self.stats.connections >= self.max_connections:
            self.stats.refused_connections_total += 1
            return False
        if mine >= self.max_per_address(host):
            self.stats.refused_connections_total += 1
            if self.bar is not None:
                self._refused_at_bound(host)
            return False
        self._by_address[host] = mine + 1
        self.stats.connections += 1
        self.stats.connections_total += 1
        return True

    def give_back(self, host: str) -> bool:
        """A connection ``take`` counted has ended; True when ``host`` holds none any more."""
        self.stats.connections -= 1
        if (left := self._by_address.get(host, 1) - 1) > 0:
            self._by_address[host] = left
            return False
        self._by_address.pop(host, None)
        return True

    def close(self) -> None:
        """The listener stopped: no more reviews (its sockets, and their filter, are gone)."""
        if self._review is not None:
            self._review.cancel()
            self._review = None

    def _refused_at_bound(self, host: str) -> None:
        now = self._clock()
        start, count = self._refusals.get(host, (now, 0))
        if now - start > REFUSALS_WINDOW_S:
            start, count = now, 0
        count += 1
        if count <= BAR_AFTER_REFUSALS:
            if host not in self._refusals and len(self._refusals) >= MAX_COUNTED_ADDRESSES:
                self._refusals = {a: w for a, w in self._refusals.items() if now - w[0] <= REFUSALS_WINDOW_S}
                if len(self._refusals) >= MAX_COUNTED_ADDRESSES:
                    return  # refused, not counted: the bar is for one address's flood
            self._refusals[host] = (start, count)
            return
        self._refusals.pop(host, None)
        self._look([host])

    def _look(self, over: list[str]) -> None:
        """A finding (``over``, barred anew) or a review: the bar updated, and looked at again while any holds."""
        assert self.bar is not None
        self.close()
        self.bar.update(over, self._by_address, self.max_per_address)
        if self.bar.barred:
            self._review = asyncio.get_running_loop().call_later(BAR_REVIEW_S, self._look, [])


DEADLINE_SLACK_S = 0.001


class ConnectionDeadline:
    """The deadline of what a connection of an asyncio listener waits for now (its next frame, the rest of
    one, its answer's delivery): past it, ``expired`` is called, once, and is expected to close the
    connection.

    An ``asyncio.timeout`` per wait costs the event loop a timer handle, a context manager and a
    cancellation a wait, two a frame: at 10,000 records/s the replication listener reads two frames per
    acks=all write. Here setting a deadline is an assignment and one timer is kept: armed no later than
    the earliest deadline set since it last fired, it re-arms itself at the deadline current when it fires
    if that is later. A connection that keeps its deadlines costs a timer a timeout period, not a frame,
    and one that misses its deadline is closed when it passes, as with a timeout per wait. Loop thread
    only."""

    __slots__ = ("_loop", "_expired", "_at", "_timer", "_timer_at", "fired")

    def __init__(self, loop: asyncio.AbstractEventLoop, expired: Callable[[], None]) -> None:
        self._loop = loop
        self._expired = expired
        self._at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self.fired = False

    def within(self, seconds: float) -> None:
        """What the connection waits for now must come within ``seconds``; at once when that is not positive
        (a login's time already spent), whether or not what it waits for is already buffered."""
        if seconds <= 0:
            self._at = self._loop.time()
            if not self.fired:
                self.fired = True
                self._expired()
            return
        at = self._loop.time() + seconds
        self._at = at
        if at < self._timer_at:
            self._arm(at)

    def clear(self) -> None:
        """Nothing is waited for (the broker is handling a request: its own bounds apply)."""
        self._at = None

    def cancel(self) -> None:
        """The connection ended."""
        self._at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, float("inf")

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(at, self._check), at

    def _check(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        at = self._at
        if at is None or self.fired:
            return
        # A loop may run a timer up to its clock's resolution early: that is not before the deadline.
        if self._loop.time() >= at - DEADLINE_SLACK_S:
            self.fired = True
            self._expired()
        else:
            self._arm(at)

def connections_within_descriptors(wanted: int, share: int, what: str) -> int:
    """``wanted`` connections (a ``max.connections``), lowered to ``1/share`` of the process's
    file-descriptor limit, with a warning: the rest of the descriptors are for the logs and the other
    ports (the gRPC port takes at most a half, each Kafka listener a quarter)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or wanted <= soft // share:
        return wanted
    ceiling = max(1, soft // share)
    log.warning("%s: max.connections %d lowered to %d (1/%d of the file-descriptor limit %d)",
                what, wanted, ceiling, share, soft)
    return ceiling

# A client request may name at most max(this, twice the cluster's) partitions (topics, for
# Metadata and DescribeLogDirs): no client needs to name one twice, and every entry costs the
# broker a lookup, checks and an answer entry even when it is empty or unknown (a Produce naming
# 100,000 empty partitions, 800 KB, held the event loop for 2.6 s; a DeleteRecords naming 100,000
# unknown ones took 16 s of an I/O thread).
MIN_REQUEST_ENTRIES_BOUND = 1000

# max.fetch.response.bytes.per.ip: more than fetch.max.bytes (55 MiB), so a client's largest answer fits.
DEFAULT_FETCH_BYTES_PER_CLIENT = 64 * 1024 * 1024


def release_when_done(context: Any, release: Callable[[], None], *, at_once: bool = False) -> None:
    """Call ``release`` on the running loop when ``context``'s call has ended: its answer written out or
    the call cancelled (gRPC), the answer written or the connection closed (the Kafka listener's
    context). A context without calls of its own (a stream's request, ``principal.CallIdentity``; a
    test's): now (``at_once``) or in the loop's next turn."""
    loop = asyncio.get_running_loop()
    add = getattr(context, "add_done_callback", None)
    if add is None:
        if at_once:
            release()
        else:
            loop.call_soon(release)
        return

    def ended(_: Any = None) -> None:  # gRPC may call it on another thread, or after the loop stopped
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(release)

    add(ended)


async def refuse_oversized(context: Any, cache: Any, entries: int, kind: str) -> None:
    """End the call INVALID_ARGUMENT, before anything is done, when it names more ``kind``
    ("partitions" or "topics") than ``MIN_REQUEST_ENTRIES_BOUND`` and twice the cluster's
    (``cache``: the broker's MetadataCache)."""
    topics, partitions = cache.counts()
    await refuse_over(context, entries, kind, partitions if kind == "partitions" else topics,
                      f"this cluster has {topics} topics and {partitions} partitions")


async def refuse_over(context: Any, entries: int, kind: str, known: int, why: str) -> None:
    """``refuse_oversized`` against ``known`` things of the kind (``why`` says whose)."""
    bound = max(MIN_REQUEST_ENTRIES_BOUND, 2 * known)
    if entries > bound:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request names {entries} {kind}; {why}, so a request may name at most {bound}")


# The client library (client/cluster.py BROKER_OVERLOADED_PREFIX) retries a RESOURCE_EXHAUSTED
# whose details start with this; gRPC's own RESOURCE_EXHAUSTED (message too large) it does not.
OVERLOADED_PREFIX = "broker overloaded:"


class Overloaded(Exception):
    """A request refused by admission control; answered with RESOURCE_EXHAUSTED."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{OVERLOADED_PREFIX} {message}")


def peer_host(peer: str) -> str:
    """The client address of a gRPC peer string: 'ipv4:1.2.3.4:5' -> '1.2.3.4', 'ipv6:[::1]:5' -> '::1'."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer  # unix sockets and the like: the whole string names the client


@dataclass(slots=True)
class _ClientUsage:
    in_flight: int = 0
    waiting: int = 0


class ClientLimits:
    """Per-client counts of in-flight requests and parked long polls (loop thread only)."""

    def __init__(self, max_in_flight: int, max_waiting: int) -> None:
        assert max_in_flight >= 1 and max_waiting >= 0
        self.max_in_flight = max_in_flight
        self.max_waiting = max_waiting
        self._usage: dict[str, _ClientUsage] = {}
        self.refused_total = 0

    def enter(self, client: str) -> None:
        u = self._usage.get(client)
        if u is None:
            u = self._usage[client] = _ClientUsage()
        if u.in_flight >= self.max_in_flight:
            self.refused_total += 1
            raise Overloaded(f"client {client} has {u.in_flight} requests in flight "
                             f"(max.inflight.requests.per.ip={self.max_in_flight})")
        u.in_flight += 1

    def leave(self, client: str) -> None:
        u = self._usage[client]
        u.in_flight -= 1
        if u.in_flight == 0 and u.waiting == 0:
            del self._usage[client]  # the table holds only clients with work here: bounded by them

    def start_waiting(self, client: str) -> None:
        u = self._usage[client]  # only called between enter() and leave()
        if u.waiting >= self.max_waiting:
            self.refused_total += 1
            raise Overloaded(f"client {client} has {u.waiting} long polls waiting "
                             f"(max.waiting.fetches.per.ip={self.max_waiting})")
        u.waiting += 1

    def stop_waiting(self, client: str) -> None:
        self._usage[client].waiting -= 1

    def usage(self, client: str) -> tuple[int, int]:
        u = self._usage.get(client)
        return (u.in_flight, u.waiting) if u is not None else (0, 0)

    @property
    def clients(self) -> int:
        return len(self._usage)


class ByteBudget:
    """A pool of bytes granted first come, first served (loop thread only).

    ``acquire`` waits (as a parked coroutine, no thread) until the bytes are free; a grant
    larger than the whole budget is cut to the budget, so one request can always proceed
    once it is alone. ``try_acquire`` never waits.
    """

    def __init__(self, total_bytes: int) -> None:
        assert total_bytes >= 1
        self.total_bytes = total_bytes
        self.used_bytes = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def clamp(self, n: int) -> int:
        return max(0, min(n, self.total_bytes))

    def try_acquire(self, n: int) -> bool:
        n = self.clamp(n)
        if self._waiters or self.used_bytes + n > self.total_bytes:
            return False
        self.used_bytes += n
        return True

    async def acquire(self, n: int) -> int:
        """Wait for ``n`` bytes (clamped to the budget); returns the bytes granted. Cancellable."""
        n = self.clamp(n)
        if not self._waiters and self.used_bytes + n <= self.total_bytes:
            self.used_bytes += n
            return n
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.used_bytes -= n  # granted just as we were cancelled: give it back
                self._grant()
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._grant()
            raise
        return n

    def release(self, n: int) -> None:
        assert 0 <= n <= self.used_bytes, (n, self.used_bytes)
        self.used_bytes -= n
        self._grant()

    @property
    def idle(self) -> bool:
        """Nothing held and nobody waiting."""
        return self.used_bytes == 0 and all(fut.done() for _, fut in self._waiters)

    def _grant(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self.used_bytes + n > self.total_bytes:
                return  # FIFO: a big grant is not starved by small ones behind it
            self._waiters.popleft()
            self.used_bytes += n
            fut.set_result(None)


class ClientByteShares:
    """Each client address's share of the fetch-response bytes (loop thread only): one ``ByteBudget``
    of ``per_client`` bytes per address holding any, dropped when it holds nothing."""

    def __init__(self, per_client: int) -> None:
        assert per_client >= 1
        self.per_client = per_client
        self._budgets: dict[str, ByteBudget] = {}

    def try_acquire(self, client: str, n: int) -> int | None:
        """``n`` bytes (clamped to the share) for ``client`` if they are free now, without waiting; else None."""
        b = self._budgets.get(client)
        if b is None:
            b = self._budgets[client] = ByteBudget(self.per_client)
        if b.try_acquire(n):
            return b.clamp(n)
        self._drop_if_idle(client, b)
        return None

    async def acquire(self, client: str, n: int) -> int:
        """Wait until ``client`` holds few enough to take ``n`` bytes (clamped to the share); the bytes granted."""
        b = self._budgets.get(client)
        if b is None:
            b = self._budgets[client] = ByteBudget(self.per_client)
        try:
            return await b.acquire(n)
        finally:
            self._drop_if_idle(client, b)

    def release(self, client: str, n: int) -> None:
        if n == 0:
            return  # a grant of nothing left no budget behind to give it to
        b = self._budgets[client]
        b.release(n)
        self._drop_if_idle(client, b)

    def held(self, client: str) -> int:
        b = self._budgets.get(client)
        return 0 if b is None else b.used_bytes

    @property
    def clients(self) -> int:
        return len(self._budgets)

    def _drop_if_idle(self, client: str, b: ByteBudget) -> None:
        if b.idle and self._budgets.get(client) is b:
            del self._budgets[client]  # the table holds only clients holding bytes: bounded by them
