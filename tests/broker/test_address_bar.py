"""Barring an address from a gRPC port in the kernel (broker/address_bar.py): the socket filter drops the
barred addresses' connection attempts, IPv4 and IPv6, and nobody else's, and leaves their open connections
alone; a look of the per-address bound bars an address past it and lifts the bar once it has lasted and the
address is back under its bound. Real sockets in this process, from two loopback addresses."""

from __future__ import annotations

import socket
from collections.abc import Iterable

import pytest
from sockets import ATTACKER, closed_by_peer, connects_within, still_open
from test_grpc_connections import connected, listener

from broker.address_bar import MAX_BARRED, AddressBar, filter_program, install
from broker.admission import ConnectionsPerIp
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
