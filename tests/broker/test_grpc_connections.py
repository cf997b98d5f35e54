"""max.connections.per.ip on the gRPC ports (broker/grpc_connections.py): the kernel's table read right,
the newest connections of an address past the bound shut down, and nothing else touched; and
max.connections.per.ip.overrides, there and at a Kafka listener's accept. Real sockets in this process,
from two loopback addresses."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest
from sockets import ATTACKER, closed_by_peer, connect_from, still_open

from broker import grpc_connections as gc
from broker.address_bar import AddressBar
from broker.admission import ConnectionSlots, ConnectionsPerIp
from broker.grpc_connections import (
    Connection,
    PerAddressConnections,
    past_the_bound,
    read_connections,
    shut_down,
)


def table_connections(ports: list[int]) -> list[Connection]:
    return read_connections(ports)


@contextlib.contextmanager
def listener(host: str = "127.0.0.1", family: int = socket.AF_INET) -> Iterator[socket.socket]:
    server = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # 127.0.0.x arrives IPv4-mapped
        server.bind((host, 0))
        server.listen(64)
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def connected(server: socket.socket, sources: list[str]) -> Iterator[tuple[list[socket.socket], list[socket.socket]]]:
    """(client sockets, the server's accepted sockets), one pair per source address, in order."""
    port = server.getsockname()[1]
    clients: list[socket.socket] = []
    accepted: list[socket.socket] = []
    try:
        for source in sources:
            clients.append(connect_from(source, port))
            accepted.append(server.accept()[0])
        yield clients, accepted
    finally:
        for s in clients + accepted:
            s.close()


def inode(s: socket.socket) -> int:
    return os.fstat(s.fileno()).st_ino


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6-dual-stack"])
def test_the_kernels_table_gives_each_accepted_connection_its_client_address_and_socket(family: int) -> None:
    host = "127.0.0.1" if family == socket.AF_INET else "::"
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with listener(host, family) as server, connected(server, ["127.0.0.1", ATTACKER, ATTACKER]) as (_, accepted):
        found = table_connections([server.getsockname()[1]])
        port = server.getsockname()[1]
        want = {Connection(a, inode(s), s.getpeername()[1], port)
                for a, s in zip(["127.0.0.1", ATTACKER, ATTACKER], accepted, strict=True)}
        # The listener and the clients' own ends (local port: theirs) are not the port's connections.
        assert set(found) == want, found


def test_an_address_keeps_the_connections_it_had_before_and_then_its_lowest_inodes() -> None:
    conns = [Connection("a", i) for i in (10, 11, 12, 13, 14)] + [Connection("b", i) for i in (1, 2)]
    assert past_the_bound(conns, ConnectionsPerIp(2), seen_before=set()) == {"a": [12, 13, 14]}
    assert past_the_bound(conns, ConnectionsPerIp(2), seen_before={13, 14}) == {"a": [10, 11, 12]}
    assert past_the_bound(conns, ConnectionsPerIp(5), seen_before=set()) == {}


def test_overrides_name_addresses_and_hosts_as_kafkas_key_does() -> None:
    asked: list[str] = []

    def resolve(host: str, port: None) -> list[tuple]:
        asked.append(host)
        if host == "nat.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.9", 0)),
                    (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:10.0.0.10", 0, 0, 0))]
        if host == "gone.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return socket.getaddrinfo(host, port)

    limits = ConnectionsPerIp(3, ["127.0.0.2:0", "[::1]:7", "nat.example:500", "gone.example:9"], "test", resolve)
    assert (limits("127.0.0.2"), limits("::ffff:127.0.0.2"), limits("::1"), limits("127.0.0.1")) == (0, 0, 7, 3)
    assert (limits("10.0.0.9"), limits("10.0.0.10")) == (500, 500)  # a name: every address it resolves to
    assert limits("10.0.0.11") == 3 and "gone.example" in asked  # one that does not resolve is skipped
    assert limits.lowest == 0
    with pytest.raises(ValueError, match="not host:count"):
        ConnectionsPerIp(3, ["10.0.0.7"])


def test_a_kafka_listeners_accept_takes_an_addresses_override() -> None:
    class Stats:
        connections = connections_total = refused_connections_total = 0

    slots = ConnectionSlots(100, ConnectionsPerIp(2, [f"{ATTACKER}:1"]), Stats())
    assert [slots.take(ATTACKER) for _ in range(2)] == [True, False]
    assert [slots.take("127.0.0.1") for _ in range(3)] == [True, True, False]


def test_shut_down_ends_only_the_sockets_named_and_leaves_their_descriptors_to_their_owner() -> None:
    with listener() as server, connected(server, [ATTACKER, ATTACKER, "127.0.0.1"]) as (clients, accepted):
        assert shut_down({inode(accepted[1])}) == 1
        assert closed_by_peer(clients[1], 5), "the client of the connection shut down did not see its end"
        assert still_open(clients[0], 0.05) and still_open(clients[2], 0.05)
        # The server's own descriptor is still there, for it to close (as gRPC does on reading the end).
        assert accepted[1].fileno() >= 0 and os.fstat(accepted[1].fileno()).st_ino == inode(accepted[1])
        assert accepted[1].recv(1) == b""


def test_a_look_closes_the_connections_of_an_address_past_the_bound_and_no_one_elses() -> None:
    with listener() as server:
        port = server.getsockname()[1]
        bound = PerAddressConnections([port], ConnectionsPerIp(3), "test")
        with connected(server, ["127.0.0.1"] * 3 + [ATTACKER] * 3) as (clients, _):
            assert bound.check() == 0, "no address is past a bound of 3"
            with connected(server, [ATTACKER] * 4) as (newer, _):
                assert bound.check() == 4
                assert bound.closed_total == 4
                # The attacker's three older connections are kept, its four newer ones closed (though their
                # inodes may be lower); 127.0.0.1's three are another address's: the bound is per address.
                assert all(closed_by_peer(s, 5) for s in newer)
                assert all(still_open(s, 0.05) for s in clients)
                assert bound.check() == 0, "a look after the cut found more to close"


def test_an_override_of_0_closes_every_connection_of_its_address_on_the_grpc_ports() -> None:
    with listener() as server:
        bound = PerAddressConnections([server.getsockname()[1]], ConnectionsPerIp(3, [f"{ATTACKER}:0"]), "test")
        with connected(server, [ATTACKER, "127.0.0.1"]) as (clients, _):
            assert bound.check() == 1
            assert closed_by_peer(clients[0], 5) and still_open(clients[1], 0.05)


def test_looks_come_sooner_while_they_find_connections_to_close() -> None:
    class Recorded(PerAddressConnections):
        def __init__(self) -> None:
            super().__init__([1], ConnectionsPerIp(3), "test", interval_s=0.5)
            self.cuts = [4, 2, 0, 0, 1, 0]
            self.waits: list[float] = []
            self._stop = self  # type: ignore[assignment]  # its wait() records the pause and ends the run

        def wait(self, timeout: float) -> bool:
            self.waits.append(timeout)
            return not self.cuts

        def check(self) -> int:
            return self.cuts.pop(0)

    bound = Recorded()
    bound._run()
    assert bound.waits == [0.5, 0.1, 0.1, 0.5, 0.5, 0.1, 0.5]


# Two lines of the kernel's TCP table for connections to port 0x1F90 (8080) from 127.0.0.2, sockets 5001
# and 5002, in the table's own format.
_LINE = ("   {sl}: 0100007F:1F90 0200007F:{port} 01 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 "
         "0000000000000000 20 4 30 10 -1\n")
_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _table(*entries: tuple[str, int]) -> str:
    return _HEADER + "".join(_LINE.format(sl=i, port=port, inode=inode) for i, (port, inode) in enumerate(entries))


def test_a_line_the_read_gave_twice_is_one_connection_and_no_address_at_its_bound_is_cut() -> None:
    # The kernel hands the table out a page per read() and resumes by a place in a hash bucket: a connection
    # opened meanwhile in that bucket repeats a line (138 of 291 reads under a connection churn gave one).
    torn = _table(("C001", 5001), ("C002", 5002), ("C002", 5002))
    found = gc.connections_on([8080], torn)
    assert sorted(c.inode for c in found) == [5001, 5002], found
    assert past_the_bound(found, ConnectionsPerIp(2), seen_before=set()) == {}, "an address at its bound was cut"


def test_a_connection_one_read_skipped_is_still_an_older_one_at_the_next_look(monkeypatch: pytest.MonkeyPatch) -> None:
    # A connection closed meanwhile in the bucket the read resumes in skips a line instead. The address's
    # connection 11 is left out of the second look; at the third the address has a new one (inode 5, lower)
    # and is past its bound of 2: the new one is cut, not 11.
    looks = [_table(("C001", 10), ("C002", 11)), _table(("C001", 10)), _table(("C001", 10), ("C002", 11), ("C003", 5))]
    monkeypatch.setattr(gc, "read_tables", lambda: [looks.pop(0)])
    cut: list[set[int]] = []
    monkeypatch.setattr(gc, "shut_down", lambda inodes: cut.append(set(inodes)) or len(inodes))
    bar = AddressBar([8080], "test", installer=lambda ports, addresses: 0)
    bound = PerAddressConnections([8080], ConnectionsPerIp(2), "test", bar=bar)
    monkeypatch.setattr(gc, "FULL_LOOK_EVERY", 1)  # every look reads the table, however few the descriptors
    assert [bound.check(), bound.check(), bound.check()] == [0, 0, 1]
    assert cut == [{5}], f"cut {cut}: the connection the second look skipped was taken for a new one"


def test_more_reads_find_what_one_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = [_table(("C001", 10)), _table(("C002", 11), ("C001", 10))]
    monkeypatch.setattr(gc, "read_tables", lambda: [reads.pop(0)])
    assert sorted(c.inode for c in read_connections([8080], reads=2)) == [10, 11]


def test_the_namespaces_tcp_sockets_are_counted_from_sockstat(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with listener() as server, connected(server, ["127.0.0.1"] * 5):
        # The real files: every socket this test holds (a listener, five connections at both ends) is among them.
        in_use = gc.tcp_sockets_in_use()
        assert in_use is not None and in_use >= 11, in_use
    v4, v6 = tmp_path / "sockstat", tmp_path / "sockstat6"
    v4.write_text("sockets: used 106\nTCP: inuse 37 orphan 0 tw 29 alloc 69 mem 0\nUDP: inuse 0 mem 0\n")
    v6.write_text("TCP6: inuse 32\nUDP6: inuse 0\n")
    monkeypatch.setattr(gc, "_SOCKSTATS", (v4, v6))
    assert gc.tcp_sockets_in_use() == 69
    monkeypatch.setattr(gc, "_SOCKSTATS", (v4, tmp_path / "no-ipv6"))
    assert gc.tcp_sockets_in_use() == 37
    monkeypatch.setattr(gc, "_SOCKSTATS", (tmp_path / "none", tmp_path / "no-ipv6"))
    assert gc.tcp_sockets_in_use() is None


def test_a_look_reads_no_table_while_the_namespace_has_fewer_tcp_sockets_than_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker's descriptors are mostly its segment and index files: a few hundred partition replicas took it past
    the default bound of 1,000, and every look then read the kernel's tables (about 8 ms each, two servers, twice a
    second), idle or not. Fewer TCP sockets in the namespace than the bound say no address can be past it."""
    reads: list[int] = []

    def read(ports, reads_per_look: int = 1):
        reads.append(1)
        return []
    monkeypatch.setattr(gc, "read_connections", read)
    r, w = os.pipe()
    files = [os.dup(r) for _ in range(40)]  # more descriptors than the bound of 30
    try:
        bound = PerAddressConnections([1], ConnectionsPerIp(30), "test")
        monkeypatch.setattr(gc, "tcp_sockets_in_use", lambda: 12)
        assert [bound.check() for _ in range(gc.FULL_LOOK_EVERY - 1)] == [0] * (gc.FULL_LOOK_EVERY - 1)
        assert reads == []
        assert bound.check() == 0 and reads == [1]  # every FULL_LOOK_EVERY-th look reads them all the same
        monkeypatch.setattr(gc, "tcp_sockets_in_use", lambda: 31)  # past the bound in the namespace: read
        assert bound.check() == 0 and reads == [1, 1]
        monkeypatch.setattr(gc, "tcp_sockets_in_use", lambda: None)  # no sockstat: the descriptors decide
        assert bound.check() == 0 and reads == [1, 1, 1]
    finally:
        for fd in (*files, r, w):
            os.close(fd)
