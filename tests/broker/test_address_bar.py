"""Barring an address from a gRPC port in the kernel (broker/address_bar.py): the socket filter drops the
barred addresses' connection attempts, IPv4 and IPv6, and nobody else's, and leaves their open connections
alone; a look of the per-address bound bars an address past it and lifts the bar once it has lasted and the
address is back under its bound. Real sockets in this process, from two loopback addresses."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterable, Iterator

import pytest
from sockets import ATTACKER, closed_by_peer, connect_from, connects_within, still_open
from test_grpc_connections import connected, listener
from waiting import wait_for

from broker.address_bar import MAX_BARRED, AddressBar, attach, filter_program, install
from broker.admission import BAR_AFTER_REFUSALS, BAR_REVIEW_S, ConnectionSlots, ConnectionsPerIp
from broker.grpc_connections import PerAddressConnections

BPF_MAXINSNS = 4096  # the kernel's bound on a classic program (linux/bpf_common.h)
# A dropped SYN is sent again after 1 s: a connect still waiting at half a second was dropped. A connect that
# should succeed may need that retransmission (a SYN that meets a TIME_WAIT of an earlier connection with the same
# ports is answered only then), so it is given longer.
DROPPED_WITHIN_S, CONNECTS_WITHIN_S = 0.5, 3.0


def dropped(source: str, port: int) -> bool:
    """Does a connection attempt from ``source`` get no answer (its SYN dropped)?"""
    return not connects_within(source, port, DROPPED_WITHIN_S)


def connects(source: str, port: int) -> bool:
    return connects_within(source, port, CONNECTS_WITHIN_S)


def ipv6_loopback_dropped(port: int) -> bool:
    return not connects_within(None, port, DROPPED_WITHIN_S, target="::1")


def ipv6_loopback_connects(port: int) -> bool:
    return connects_within(None, port, CONNECTS_WITHIN_S, target="::1")


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6-dual-stack"])
def test_a_barred_address_cannot_connect_while_others_and_its_open_connections_are_served(family: int) -> None:
    host = "127.0.0.1" if family == socket.AF_INET else "::"
    with listener(host, family) as server, connected(server, [ATTACKER]) as (before, accepted):
        port = server.getsockname()[1]
        assert install([port], [ATTACKER]) == 1, "the filter was not attached to the listening socket"
        assert dropped(ATTACKER, port), f"{ATTACKER} connected to a port it is barred from"
        assert connects("127.0.0.1", port), "another address was barred too"
        # The connection it had before the bar is served both ways.
        before[0].sendall(b"ping")
        assert accepted[0].recv(4) == b"ping"
        accepted[0].sendall(b"pong")
        assert before[0].recv(4) == b"pong"
        assert install([port], []) == 1
        assert connects(ATTACKER, port), f"{ATTACKER} still barred once the filter was taken off"


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_address_is_barred_and_an_ipv4_mapped_one_as_its_ipv4_address() -> None:
    with listener("::", socket.AF_INET6) as server:
        port = server.getsockname()[1]
        install([port], ["::1", "2001:db8::1"])
        assert ipv6_loopback_dropped(port), "::1 connected to a port it is barred from"
        assert connects(ATTACKER, port) and connects("127.0.0.1", port)
        install([port], [f"::ffff:{ATTACKER}", "2001:db8::2"])  # how a dual-stack socket's table may name it
        assert dropped(ATTACKER, port), f"{ATTACKER}, named IPv4-mapped, connected"
        assert ipv6_loopback_connects(port), "::1 is no longer barred but could not connect"


def test_the_most_addresses_barred_at_once_fit_one_program_and_are_all_dropped() -> None:
    many = [f"2001:db8::{i:x}" for i in range(MAX_BARRED - 1)] + [ATTACKER]
    assert len(filter_program(many)) <= BPF_MAXINSNS
    with listener() as server:
        port = server.getsockname()[1]
        assert install([port], many) == 1
        assert dropped(ATTACKER, port), "the last of many barred addresses connected"
        assert connects("127.0.0.1", port)


class Recorded(AddressBar):
    """An AddressBar on a clock of its own, recording the address sets it would install."""

    def __init__(self, max_barred: int = MAX_BARRED) -> None:
        self.now = 100.0
        self.installed: list[list[str]] = []
        self.reported_meanwhile: list[list[str]] = []  # what ``barred`` said while a filter was being installed
        super().__init__([1], "test", bar_s=10.0, max_barred=max_barred, clock=lambda: self.now,
                         installer=self.record)

    def record(self, ports: Iterable[int], addresses: Iterable[str]) -> int:
        self.installed.append(sorted(addresses))
        self.reported_meanwhile.append(self.barred)
        return 1


def test_a_bar_lasts_its_time_and_while_the_address_holds_its_bound() -> None:
    bar, bound = Recorded(), ConnectionsPerIp(3)
    bar.update({"10.0.0.1": [9]}, {"10.0.0.1": 4, "10.0.0.2": 3}, bound)
    assert bar.barred == ["10.0.0.1"] and bar.bars_total == 1 and bar.installed == [["10.0.0.1"]]
    bar.now += 5
    bar.update({}, {"10.0.0.1": 3}, bound)
    assert bar.barred == ["10.0.0.1"] and len(bar.installed) == 1, "nothing changed, yet the filter was rebuilt"
    bar.now += 6  # the bar's time is over, but the address still holds its bound: it could not open another
    bar.update({}, {"10.0.0.1": 3}, bound)
    assert bar.barred == ["10.0.0.1"]
    bar.update({}, {"10.0.0.1": 2}, bound)
    assert bar.barred == [] and bar.installed[-1] == []
    # Reported only once installed: a lifted bar is not reported while the address still cannot connect.
    assert bar.reported_meanwhile == [[], ["10.0.0.1"]]
    bar.update({"10.0.0.1": [7]}, {"10.0.0.1": 5}, bound)  # again: a new bar
    assert bar.bars_total == 2 and bar.installed[-1] == ["10.0.0.1"]


def test_a_look_that_finds_a_barred_address_past_its_bound_again_renews_its_bar() -> None:
    bar, bound = Recorded(), ConnectionsPerIp(3)
    bar.update({"10.0.0.1": [9]}, {"10.0.0.1": 4}, bound)
    bar.now += 8
    bar.update({"10.0.0.1": [9]}, {"10.0.0.1": 4}, bound)
    bar.now += 8  # 16 s after the first bar, 8 after the second
    bar.update({}, {}, bound)
    assert bar.barred == ["10.0.0.1"] and bar.bars_total == 1


def test_past_the_most_barred_addresses_the_oldest_bar_is_lifted() -> None:
    bar, bound = Recorded(max_barred=2), ConnectionsPerIp(3)
    for i in range(1, 4):
        bar.update({f"10.0.0.{i}": [9]}, {f"10.0.0.{i}": 4}, bound)
        bar.now += 1
    assert bar.barred == ["10.0.0.2", "10.0.0.3"] and bar.bars_total == 3
    assert bar.installed[-1] == ["10.0.0.2", "10.0.0.3"]


def test_a_look_bars_an_address_past_its_bound_and_lifts_the_bar_once_it_is_under() -> None:
    with listener() as server:
        port = server.getsockname()[1]
        bound = PerAddressConnections([port], ConnectionsPerIp(2), "test",
                                      bar=AddressBar([port], "test", bar_s=0.0))
        with connected(server, [ATTACKER] * 2 + ["127.0.0.1"]) as (older, accepted):
            with connected(server, [ATTACKER]) as (newer, _):
                assert bound.check() == 1
                assert closed_by_peer(newer[0], 5) and all(still_open(s, 0.05) for s in older)
                assert bound.bar.barred == [ATTACKER] and bound.bar.bars_total == 1
                assert dropped(ATTACKER, port), f"{ATTACKER} opened a connection after it was found past its bound"
                assert connects("127.0.0.1", port)
            bound.check()
            assert bound.bar.barred == [ATTACKER], "the bar was lifted while the address held its bound"
            older[0].close()
            accepted[0].close()  # both ends: the server's end alone would be held open (CLOSE_WAIT)
            bound.check()
            assert bound.bar.barred == [], "the bar stayed once the address was under its bound"
            assert connects(ATTACKER, port), f"{ATTACKER} could not connect once its bar was lifted"


class _Stats:
    connections = connections_total = refused_connections_total = 0


@contextlib.contextmanager
def asyncio_listener(per_address: int, bar_s: float) -> Iterator[tuple[int, ConnectionSlots]]:
    """An asyncio server on a loop thread of its own, counting its connections as the Kafka and replication
    listeners do (``ConnectionSlots`` with a bar on its socket): a connection taken is held until its client
    closes it, one refused is closed at accept."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    slots = ConnectionSlots(100, ConnectionsPerIp(per_address), _Stats())
    state: dict[str, object] = {}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host = writer.get_extra_info("peername")[0]
        if not slots.take(host):
            writer.close()
            return
        try:
            await reader.read()
        finally:
            slots.give_back(host)
            writer.close()

    async def start() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        sockets = server.sockets
        slots.bar = AddressBar([sockets[0].getsockname()[1]], "test", bar_s=bar_s, where="its port",
                               installer=lambda _ports, addresses: attach(sockets, addresses))
        state["server"], state["port"] = server, sockets[0].getsockname()[1]
        ready.set()

    thread = threading.Thread(target=loop.run_forever, name="asyncio-listener", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    assert ready.wait(10)
    try:
        yield state["port"], slots  # type: ignore[misc]
    finally:
        async def stop() -> None:
            slots.close()
            state["server"].close()  # type: ignore[attr-defined]
            handlers = asyncio.all_tasks() - {asyncio.current_task()}
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextlib.contextmanager
def connections_from(source: str, port: int, count: int) -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            held.append(connect_from(source, port, CONNECTS_WITHIN_S))
        yield held
    finally:
        for s in held:
            s.close()


def refused_at_accept(source: str, port: int) -> bool:
    """Is a connection from ``source`` accepted and closed by the server at once (refused at its bound)?"""
    with connect_from(source, port, CONNECTS_WITHIN_S) as s:
        return closed_by_peer(s, 5)


def test_an_address_that_keeps_connecting_at_its_bound_is_barred_from_an_asyncio_listener() -> None:
    """Before, the Kafka and replication listeners refused each connection past an address's bound at accept
    and nothing more: a flood of them cost the event loop an accept and a close each, and filled the port's
    accept queue, whose overflow the kernel dropped whatever its source. Now an address refused more than
    BAR_AFTER_REFUSALS times in a second is barred in the kernel; a client retrying at its bound is not."""
    with asyncio_listener(per_address=2, bar_s=0.5) as (port, slots):
        bar = slots.bar
        assert bar is not None
        with connections_from(ATTACKER, port, 2) as held:
            # A client at its bound that retries a few times (as Kafka's clients do, with a backoff) is refused,
            # not barred.
            assert all(refused_at_accept(ATTACKER, port) for _ in range(3))
            assert bar.barred == [], "an address retrying a few times at its bound was barred"
            # A flood at the bound: each connection is accepted by the kernel, then refused by the listener.
            for _ in range(2 * BAR_AFTER_REFUSALS):
                if not connects(ATTACKER, port):
                    break  # the listener caught up with the flood and barred it already
            wait_for(lambda: bar.barred, 10, lambda: f"{ATTACKER} to be barred after {2 * BAR_AFTER_REFUSALS} "
                     f"connections at its bound ({slots.stats.refused_connections_total} refused)")
            assert dropped(ATTACKER, port), f"{ATTACKER} connected once barred"
            assert bar.barred == [ATTACKER] and bar.bars_total == 1
            assert connects("127.0.0.1", port), "another address was barred too"
            for s in held:  # its connections from before the bar are kept and served
                assert still_open(s, 0.05)
            # The bar outlasts its time while the address holds its bound: past it, and past a review after it.
            review_after_its_time = bar._until[ATTACKER] + BAR_REVIEW_S + 0.2
            wait_for(lambda: time.monotonic() > review_after_its_time, 5, "the bar's time and a review to pass")
            assert bar.barred == [ATTACKER], "the bar was lifted while the address held its bound"
            assert dropped(ATTACKER, port), f"{ATTACKER} connected while it still held its bound"
        # Its connections closed, the bar lifts at the next review past its time.
        wait_for(lambda: bar.barred == [], 10, f"the bar of {ATTACKER} to be lifted once it held no connection")
        assert connects(ATTACKER, port), f"{ATTACKER} could not connect once its bar was lifted"
        assert slots._review is None, "reviews went on with no address barred"
