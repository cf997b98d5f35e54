"""``max.connections.per.ip`` on the gRPC ports: one client address holds at most that many connections.

The Kafka and replication listeners count a connection at accept (``admission.ConnectionSlots``). gRPC
accepts its connections itself and Python's gRPC has no hook there, so its ports only had the bound on
all connections together (``grpc.max_allowed_incoming_connections``): one address could open every one
of them, and keep them for ``connections.max.idle.ms`` (10 minutes) with an HTTP/2 preface and nothing
else, while every other client was refused at accept.

``PerAddressConnections`` keeps the bound after the fact. A thread looks at the kernel's table of the
network namespace's TCP sockets (``/proc/self/net/tcp`` and ``tcp6``) every ``CHECK_INTERVAL_S``,
counts the connections each remote address holds on the server's ports, and shuts down (``shutdown(2)``
on a duplicate of the descriptor) those of an address past the bound: gRPC reads the end of the
connection and closes it, as if the client had. An address keeps the connections it had longest
(first seen in an earlier look); among those seen in the same look, the lowest socket inode.

Costs: while the network namespace has no more TCP sockets in use than the bound (``/proc/self/net/sockstat``
and ``sockstat6``, two short files), or the process no more descriptors open, no address can be past it,
and a look reads no table. Past that, a look reads the table (one regular expression over it: with
5,000 flood connections open, about 20 ms of the interpreter) and, only when an address is past the
bound, this process's descriptor links to find its connections (0.4 s to close 4,000 among 10,000
descriptors). The pause after a look is at least four times what it took. The kernel walks every bucket
of its connection hash to list the table, whatever few connections there are: about 8 ms a look on the
development machine. Gated on descriptors alone, a broker holding a few hundred partition replicas (each
with its segment and index files open) had more descriptors than the default bound of 1,000 and read the
tables at every look, idle or not: 0.02 of a core for each of a node's two gRPC servers.

An address past the bound keeps its connections for up to ``CHECK_INTERVAL_S`` (plus a look's time),
not a moment. A flood that reconnects as fast as it is cut would fill ``max.connections`` again within
moments of each look, so an address found past its bound is also barred (broker/address_bar.py): the
kernel drops its new connection attempts to the ports for a while, before accept. Linux only (the tables
are Linux's): elsewhere there is no per-address bound on the gRPC ports, and the start says so.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from broker.admission import ConnectionsPerIp
from broker.log_limits import ThrottledWarning

if TYPE_CHECKING:
    from broker.address_bar import AddressBar

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.5
# A look reads the table at least this often even while no address can be past the bound, so that the
# connections an address had before a flood are known as its older ones when the flood comes.
FULL_LOOK_EVERY = 20
AFTER_A_CUT = 5  # looks come this many times as often while they find connections to close
LOOK_SHARE_INVERSE = 4  # and the pause after a look is at least this many times what it took

_TABLES = (Path("/proc/self/net/tcp"), Path("/proc/self/net/tcp6"))
_SOCKSTATS = (Path("/proc/self/net/sockstat"), Path("/proc/self/net/sockstat6"))
_IN_USE = re.compile(r"^TCP6?: inuse (\d+)", re.MULTILINE)
_FDS = Path("/proc/self/fd")
# The states of a connection its client holds open: ESTABLISHED, and CLOSE_WAIT (the client's end came,
# the server has yet to close it). One shut down here is in FIN_WAIT until gRPC closes it, and not counted.
_HELD = frozenset({"01", "08"})


class Connection(NamedTuple):
    """One accepted connection of a watched port, as the kernel's table shows it."""

    address: str  # the client's IP (an IPv4-mapped IPv6 address as IPv4)
    inode: int  # the socket's inode: what ties the table's line to a descriptor of this process
    port: int = 0  # the client's port
    local_port: int = 0  # the watched port it came to


def remote_address(hex_address: str) -> str:
    """The IP a ``/proc/net/tcp{,6}`` address field names: each 32-bit word is printed in the host's byte
    order."""
    words = b"".join(struct.pack("=I", int(hex_address[i:i + 8], 16)) for i in range(0, len(hex_address), 8))
    if len(words) == 4:
        return str(ipaddress.IPv4Address(words))
    ip = ipaddress.IPv6Address(words)
    return str(ip.ipv4_mapped or ip)


def connections_on(ports: Iterable[int], table: str) -> list[Connection]:
    """The connections held open on ``ports`` in the text of ``/proc/net/tcp`` or ``tcp6``: every socket with
    one of those local ports in a state of ``_HELD`` (not the listener, nor a connection being closed). One
    regular expression over the whole text (a flood's 10,000 lines took 27 ms of the interpreter split line by
    line, holding the lock every other thread needs)."""
    wanted = "|".join(f"{p:04X}" for p in sorted(set(ports)))
    if not wanted:
        return []
    # "sl: local:port remote:port state tx:rx tr:when retransmits uid timeout inode ...". Only the local address
    # follows ": " (no anchor at the line's start: three times slower).
    line = re.compile(rf": [0-9A-F]+:({wanted}) ([0-9A-F]+):([0-9A-F]+) (?:{'|'.join(sorted(_HELD))}) "
                      r"\S+ \S+ \S+ +\d+ +\d+ (\d+)")
    out: list[Connection] = []
    names: dict[str, str] = {}
    inodes: set[str] = set()
    for local_port, remote, port, inode in line.findall(table):
        if inode == "0" or inode in inodes:
            continue  # a socket being freed, or a line the read gave twice (``read_tables``)
        inodes.add(inode)
        name = names.get(remote)
        if name is None:
            name = names[remote] = remote_address(remote)
        out.append(Connection(name, int(inode), int(port, 16), int(local_port, 16)))
    return out


def tcp_sockets_in_use() -> int | None:
    """The TCP sockets (IPv4 and IPv6) in use in this network namespace, by the kernel's count; None where it
    does not say. Every connection any process holds on any port is among them (those in TIME_WAIT are not:
    they are no one's connection any more)."""
    total: int | None = None
    for path in _SOCKSTATS:
        try:
            found = _IN_USE.search(path.read_text())
        except OSError:
            continue  # no IPv6 here
        if found is not None:
            total = (total or 0) + int(found.group(1))
    return total


def read_tables() -> list[str]:
    """The texts of this network namespace's TCP tables (IPv4, and IPv6 where there is one).

    A text is not a snapshot. The kernel hands a table out at most a page (about 27 lines) per ``read()``,
    and resumes each read by its place in a hash bucket of sockets: a connection opened meanwhile in that
    bucket repeats a line already read, one closed skips a line not read yet. On a host whose connections
    come and go by the thousand, 138 of 291 reads of a 28,000-line table gave some line twice. So a socket
    may be listed twice (``connections_on`` keeps its first line) or, rarely, not at all."""
    out: list[str] = []
    for table in _TABLES:
        try:
            out.append(table.read_text())
        except OSError:
            continue  # no IPv6 here
    return out


def read_connections(ports: Iterable[int], reads: int = 1) -> list[Connection]:
    """The connections held open on ``ports`` in this network namespace (IPv4 and IPv6 tables), each once.
    With ``reads`` > 1, those of that many reads of the tables: a connection one read skipped
    (``read_tables``) is found unless every read skipped it."""
    ports = frozenset(ports)
    found: dict[int, Connection] = {}
    for _ in range(reads):
        for text in read_tables():
            for c in connections_on(ports, text):
                found.setdefault(c.inode, c)
    return list(found.values())


def past_the_bound(connections: Iterable[Connection], bound: Callable[[str], int],
                   seen_before: set[int]) -> dict[str, list[int]]:
    """{address: inodes of its connections to close} for each address holding more than ``bound(address)``.
    An address keeps those in ``seen_before`` (found open by an earlier look) first, then the lowest inodes."""
    by_address: dict[str, list[int]] = {}
    for c in connections:
        by_address.setdefault(c.address, []).append(c.inode)
    out: dict[str, list[int]] = {}
    for address, inodes in by_address.items():
        if len(inodes) > (mine := bound(address)):
            inodes.sort(key=lambda i: (i not in seen_before, i))
            out[address] = inodes[mine:]
    return out


def own_sockets(inodes: set[int]) -> Iterator[socket.socket]:
    """This process's sockets with these inodes, each as a duplicate of its descriptor, closed once the caller
    has stepped past it. The duplicate's inode is checked, so a descriptor closed and reused since it was
    listed is left alone."""
    try:
        names = os.listdir(_FDS)
    except OSError:
        return
    for name in names:
        try:
            link = os.readlink(_FDS / name)
        except OSError:
            continue  # closed since the listing
        if not link.startswith("socket:[") or int(link[8:-1]) not in inodes:
            continue
        try:
            dup = os.dup(int(name))
        except OSError:
            continue
        try:
            if os.fstat(dup).st_ino not in inodes:
                os.close(dup)
                continue
            sock = socket.socket(fileno=dup)  # owns the duplicate now
        except OSError:
            os.close(dup)
            continue
        with sock:
            yield sock


def shut_down(inodes: set[int]) -> int:
    """Shut down this process's sockets with these inodes; how many were (``own_sockets``)."""
    done = 0
    for sock in own_sockets(inodes):
        try:
            sock.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass  # already ended
    return done


class PerAddressConnections:
    """Hold each client address to ``max_per_address(address)`` connections on a gRPC server's ``ports``
    (the module's docstring says how). ``closed_total`` counts the connections shut down. ``what`` names
    the server in log lines."""

    def __init__(self, ports: Iterable[int], max_per_address: ConnectionsPerIp, what: str,
                 interval_s: float = CHECK_INTERVAL_S, bar: AddressBar | None = None) -> None:
        self.ports = frozenset(ports)
        self.max_per_address = max_per_address
        self.what = what
        self.closed_total = 0
        if bar is None:
            from broker.address_bar import AddressBar  # it reads the tables and sockets through this module

            bar = AddressBar(self.ports, what)
        self.bar = bar
        self._interval_s = interval_s
        self._seen: set[int] = set()  # inodes open at either of the last two looks that read the table
        self._last: set[int] = set()  # inodes open at the last one
        self._looks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warning = ThrottledWarning(log)
        self._failures = ThrottledWarning(log)

    def start(self) -> None:
        if not _FDS.is_dir() or not _TABLES[0].exists():
            log.warning("%s: no /proc/self/net/tcp here, so the gRPC ports have no per-address connection bound "
                        "(max.connections.per.ip); max.connections still bounds them all together", self.what)
            return
        self._thread = threading.Thread(target=self._run, name=f"{self.what.replace(' ', '-')}-connections-per-ip",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        wait_s = self._interval_s
        while not self._stop.wait(wait_s):
            started = time.monotonic()
            try:
                # An address that was cut may be reconnecting as fast as it can: look again sooner. Back to the
                # interval after a clean look.
                wait_s = self._interval_s / AFTER_A_CUT if self.check() else self._interval_s
            except Exception as e:  # a look that failed is retried at the next; the port is served meanwhile
                self._failures.warn("%s: checking the connections per address failed: %r", self.what, e)
            # Never more than a fifth of the time looking (a flood's look reads a long table).
            wait_s = max(wait_s, (time.monotonic() - started) * LOOK_SHARE_INVERSE)

    def check(self) -> int:
        """One look: shut down the connections past the bound; how many were."""
        self._looks += 1
        if self._looks % FULL_LOOK_EVERY and not self.bar.barred:
            lowest = self.max_per_address.lowest
            in_use = tcp_sockets_in_use()
            try:
                if (in_use is not None and in_use <= lowest) or len(os.listdir(_FDS)) <= lowest:
                    return 0  # no address can be past the bound
            except OSError:
                return 0
        connections = read_connections(self.ports)
        over = past_the_bound(connections, self.max_per_address, self._seen)
        # An address's older connections are those of either of the last two looks: a read may skip a line
        # (``read_tables``), and the connection it skipped is not new at the next look.
        now = {c.inode for c in connections}
        self._seen, self._last = now | self._last, now
        if over or self.bar.barred:
            self.bar.update(over, Counter(c.address for c in connections), self.max_per_address)
        if not over:
            return 0
        cut = {i for inodes in over.values() for i in inodes}
        closed = shut_down(cut)
        self.closed_total += closed
        self._seen -= cut
        self._last -= cut
        bound = self.max_per_address
        self._warning.warn("%s: closed %d connection(s) past max.connections.per.ip on its gRPC port(s): %s",
                           self.what, closed, ", ".join(f"{a} had {len(v) + bound(a)} (its bound {bound(a)})"
                                                        for a, v in sorted(over.items())))
        return closed
