"""Refusing a client address's new connections in the kernel: a socket filter on a port's listening sockets.

``max.connections.per.ip`` is kept on the gRPC ports after accept (broker/grpc_connections.py): gRPC
accepts its connections itself, and a look twice a second closes those of an address past its bound. A
flood that reconnects as fast as it is cut therefore fills ``max.connections`` again between looks, and
while it goes on most other clients' new connections are refused. Kafka refuses a connection past the
bound at accept, so such a flood costs it an accept and a close each, and no slot.

``AddressBar`` gives the gRPC ports the same effect one step earlier. An address a look finds past its
bound is *barred*: a classic BPF program attached to the port's listening sockets (``SO_ATTACH_FILTER``,
which needs no privilege) drops the packets it sends to them. So its connection attempts (SYNs) never
make a connection: no accept, no descriptor, no TLS handshake, no slot. The connections it has are not
touched: each was accepted with the filter the listener had then, and keeps that filter. A connection
attempt that is dropped is not refused: the client's connect times out, or it retries its SYN.

The Kafka and replication listeners refuse a connection past the bound at accept
(``admission.ConnectionSlots``), as Kafka does. An address that keeps trying at its bound, more than
``admission.BAR_AFTER_REFUSALS`` times within a second, is barred there too: each refusal costs the
broker's event loop an accept and a close, and a flood of them fills the port's accept queue, whose
overflow the kernel drops whatever its source. A client retrying at its bound with a backoff, as
Kafka's clients do, is refused as before, not barred.

A bar lasts ``BAR_S`` after the last finding that the address was past its bound, and then as long as the
address still holds its bound (as Kafka refuses an address at its bound). Then the filter is rebuilt
without it. At most ``MAX_BARRED`` addresses are barred at once (a program has at most 4,096
instructions; an IPv6 address costs 9): past that the oldest bar is lifted early. So a flood from many
addresses still needs a per-address limit in front of the port (a firewall).

Linux only (the filter and the tables are Linux's); a failure to attach is logged and the port is
served as before, with the bound kept after accept (gRPC) or at accept (the asyncio listeners).
"""
from __future__ import annotations

import ctypes
import errno
import ipaddress
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping

from broker.grpc_connections import own_sockets, read_tables
from broker.log_limits import ThrottledWarning

log = logging.getLogger(__name__)

BAR_S = 10.0
MAX_BARRED = 256

SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)
SO_DETACH_FILTER = getattr(socket, "SO_DETACH_FILTER", 27)
_SKF_NET_OFF = -0x100000  # loads relative to the network (IP) header: a TCP socket's filter starts past it
# Classic BPF opcodes (linux/filter.h).
_LD_W_ABS = 0x20
_LD_B_ABS = 0x30
_RSH_K = 0x74
_JEQ_K = 0x15
_JA = 0x05
_RET_K = 0x06
_KEEP, _DROP = 0xFFFFFFFF, 0
_V6_BLOCK = 9  # instructions per IPv6 address: four loads and compares, then the drop

_LISTEN = "0A"

Instruction = tuple[int, int, int, int]  # (code, jump if true, jump if false, k)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _net(offset: int) -> int:
    return (_SKF_NET_OFF + offset) & 0xFFFFFFFF


def filter_program(addresses: Iterable[str]) -> list[Instruction]:
    """A program that drops the packets whose source is one of ``addresses`` (IPv4, or IPv6; an IPv4-mapped
    address is its IPv4 one, as an IPv4 client of a dual-stack socket sends IPv4 packets) and keeps the rest."""
    v4: list[int] = []
    v6: list[bytes] = []
    for a in addresses:
        ip = ipaddress.ip_address(a)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if isinstance(ip, ipaddress.IPv4Address):
            v4.append(int(ip))
        else:
            v6.append(ip.packed)
    ipv4_part: list[Instruction] = [(_LD_W_ABS, 0, 0, _net(12))]  # the source address
    for k in v4:
        ipv4_part += [(_JEQ_K, 0, 1, k), (_RET_K, 0, 0, _DROP)]
    ipv4_part.append((_RET_K, 0, 0, _KEEP))
    program: list[Instruction] = [
        (_LD_B_ABS, 0, 0, _net(0)),
        (_RSH_K, 0, 0, 4),  # the IP version
        (_JEQ_K, 0, 1, 6),
        (_JA, 0, 0, len(ipv4_part)),  # IPv6: past the IPv4 part
        *ipv4_part,
    ]
    for packed in v6:  # the source address: bytes 8-23 of the IPv6 header, four words
        words = [int.from_bytes(packed[i:i + 4], "big") for i in range(0, 16, 4)]
        for n, word in enumerate(words):
            program.append((_LD_W_ABS, 0, 0, _net(8 + 4 * n)))
            # A word that differs jumps past the block's end; the fourth that matches falls to the drop.
            program.append((_JEQ_K, 0, _V6_BLOCK - 2 * n - 2, word))
        program.append((_RET_K, 0, 0, _DROP))
    program.append((_RET_K, 0, 0, _KEEP))
    return program


def listening_inodes(ports: Iterable[int], tables: Iterable[str]) -> set[int]:
    """The inodes of the listening sockets on ``ports`` in the texts of ``/proc/net/tcp`` and ``tcp6``."""
    wanted = "|".join(f"{p:04X}" for p in sorted(set(ports)))
    if not wanted:
        return set()
    line = re.compile(rf": [0-9A-F]+:(?:{wanted}) [0-9A-F]+:[0-9A-F]+ {_LISTEN} \S+ \S+ \S+ +\d+ +\d+ (\d+)")
    return {int(inode) for text in tables for inode in line.findall(text) if inode != "0"}


def attach(sockets: Iterable[socket.socket], addresses: Iterable[str]) -> int:
    """Attach the filter barring ``addresses`` (none: detach it) to ``sockets``, listening sockets; how many took
    it. OSError when a socket refuses it."""
    barred = list(addresses)
    program = filter_program(barred) if barred else []
    array = (_SockFilter * len(program))(*(_SockFilter(*i) for i in program))
    fprog = _SockFprog(len(program), ctypes.cast(array, ctypes.POINTER(_SockFilter)))
    done = 0
    for sock in sockets:
        if program:
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))  # the kernel copies `array`
        else:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            except OSError as e:
                if e.errno != errno.ENOENT:  # it had none
                    raise
        done += 1
    return done


def install(ports: Iterable[int], addresses: Iterable[str], listeners: set[int] | None = None) -> int:
    """``attach`` to this process's listening sockets on ``ports`` (or the sockets with the inodes ``listeners``,
    when known): the gRPC server's, which it does not hand out."""
    if listeners is None:
        listeners = listening_inodes(ports, read_tables())
    return attach(own_sockets(listeners), addresses)


class AddressBar:
    """The addresses barred from a server's ``ports`` (the module's docstring says how). ``update`` is called
    with each finding of the per-address bound; ``bars_total`` counts the bars begun, ``barred`` is the
    addresses barred now. ``what`` names the server and ``where`` its ports in log lines; ``installer`` puts
    a set of barred addresses in force (by default ``install`` on ``ports``)."""

    def __init__(self, ports: Iterable[int], what: str, bar_s: float = BAR_S, max_barred: int = MAX_BARRED,
                 clock: Callable[[], float] = time.monotonic,
                 installer: Callable[[Iterable[int], Iterable[str]], int] | None = None,
                 where: str = "its gRPC port(s)") -> None:
        self.ports = frozenset(ports)
        self.what = what
        self.where = where
        self.bars_total = 0
        self._bar_s = bar_s
        self._max = max_barred
        self._clock = clock
        self._install = installer or self._attach
        self._listeners: set[int] = set()  # the ports' listening sockets, found at the first bar
        self._until: dict[str, float] = {}  # barred address -> until when at least; oldest bar first
        self._failures = ThrottledWarning(log)

    def _attach(self, ports: Iterable[int], addresses: Iterable[str]) -> int:
        """``install`` on the ports' listening sockets, looked up in the tables only when not known yet (after a
        flood the tables are tens of thousands of lines long) or gone (the server listens anew)."""
        done = install(ports, addresses, self._listeners) if self._listeners else 0
        if done == 0:
            self._listeners = listening_inodes(ports, read_tables())
            done = install(ports, addresses, self._listeners)
        return done

    @property
    def barred(self) -> list[str]:
        return list(self._until)

    def update(self, over: Iterable[str], held: Mapping[str, int], bound: Callable[[str], int]) -> None:
        """One look's findings: ``over``, the addresses past their bound; ``held``, how many connections each
        address holds on the ports. ``barred`` changes only once the filter has (a lifted bar is reported once
        the address can connect)."""
        now = self._clock()
        until = dict(self._until)
        for address in over:
            if address not in until:
                self.bars_total += 1
                log.warning("%s: %s tried more connections than its max.connections.per.ip (%d) to %s: its new "
                            "connections are dropped for at least %.0f s", self.what, address, bound(address),
                            self.where, self._bar_s)
            until.pop(address, None)
            until[address] = now + self._bar_s  # the newest bar last
        for address, ends in list(until.items()):
            if ends <= now and held.get(address, 0) < bound(address):
                del until[address]
                log.info("%s: %s may connect to %s again (it holds %d connections, its bound %d)",
                         self.what, address, self.where, held.get(address, 0), bound(address))
        while len(until) > self._max:
            oldest = next(iter(until))
            del until[oldest]
            log.warning("%s: more than %d addresses past max.connections.per.ip: the bar of %s is lifted early",
                        self.what, self._max, oldest)
        if until.keys() != self._until.keys():
            try:
                self._install(self.ports, until)
            except OSError as e:
                self._failures.warn("%s: cannot filter the connections of barred addresses on %s (%s): they are "
                                    "held to their bound as before, after accept", self.what, self.where, e)
        self._until = until
