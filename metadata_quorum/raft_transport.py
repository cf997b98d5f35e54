"""The quorum port's transport: pysyncobj's TCP transport, with bounds on what a stranger can hold.

pysyncobj reads a frame (a 4-byte length, then the body) into one buffer before anything checks
it: the password's HMAC is verified only once the whole declared length has arrived. Anyone who
can reach a voter's Raft port could therefore declare a 2 GiB frame and stream it, and the voter
buffered every byte, growing by ``bytes +=`` on its Raft tick thread (quadratic copying: the
thread that sends heartbeats and answers votes), without the password. Connections were not
bounded either: each held a descriptor of the process, which on a combined node also holds the
partition logs, and a connection that sends nothing was never timed out.

``BoundedTCPTransport`` (the ``transportClass`` given to SyncObj) closes both:

- a connection not yet known as a voter (it has not passed the password's key exchange and named
  itself) may declare frames of at most ``UNKNOWN_FRAME_MAX_BYTES``; a voter's connection, of at most
  ``PEER_FRAME_MAX_BYTES`` (pysyncobj sends log entries in batches of 64 KiB and larger entries and
  snapshots in 64 KiB chunks; one batch may end with an entry past that, our largest commands
  are a few hundred KiB). A larger declaration closes the connection before its body is read;
- at most ``UNKNOWN_CONNECTIONS_MAX`` unknown connections are kept: a new one closes the oldest
  (a voter identifies itself within milliseconds, so a flood of strangers evicts strangers), and
  one still unknown after ``UNKNOWN_MAX_AGE_S`` is closed. The one closed is the oldest of the client
  address holding the most: strangers flooding from one address evict their own connections, not a
  voter's from another address;
- pysyncobj listened with a backlog of 5 and took one connection per turn of its loop (about 10 a
  second), so a few strangers connecting kept the accept queue full, and a voter's own connection
  waited out SYN retransmissions (1, 3, 7 s...) behind them. ``BoundedTcpServer`` listens with a
  backlog of ``LISTEN_BACKLOG`` and takes up to ``ACCEPTS_PER_TURN`` connections a turn. pysyncobj also
  closed its listening socket for good on any failed accept, EMFILE included: a voter out of
  descriptors for a moment stopped taking its peers' connections until it was restarted. Now a
  connection that fails is skipped, and running out of descriptors or memory pauses accepting for
  ``ACCEPT_PAUSE_S`` (polling on would spin on the queued connection) with the port left open;
- behind the key exchange, pysyncobj took three kinds of callers: its voters, its admin commands
  (syncobj_admin: ``status``, ``transfer``, ``set_version``, ``add``, ``remove``) and "readonly" nodes. Any
  holder of the password could thus move the leadership at will and was streamed the metadata log. Only
  voters are taken now, and only as pysyncobj connects them (each dials the voters whose addresses sort
  below its own); the others are closed, logged and counted (``_refusal``), as is a caller naming no voter
  (pysyncobj's lookup of a name that is not a string failed its tick with a TypeError, each time);
- a Raft message pysyncobj's handler cannot read (it indexes what it unpickled: a list, a number, a dict
  without ``type``) raised on the tick thread, which logged an ERROR and paused a tick period each time.
  It is dropped and the connection it came on closed (``_drop_malformed``);
- pysyncobj inflated a frame whole (``zlib.decompress``) once its HMAC passed: a voter's frame may be 16 MiB
  compressed, and zeros inflate about a thousand times. Frames inflate up to ``INFLATED_FRAME_MAX_BYTES``,
  a megabyte at a time, and are dropped with their connection past it (``_BoundedInflate``);
- pysyncobj joins the parts of an entry sent in parts in one buffer with no bound: parts past
  ``ENTRY_IN_PARTS_MAX_BYTES`` are dropped with their connection (``_transmission_problem``).
- pysyncobj reads a message's fields as they come (a term of 2**64 was stored, then failed every journal write):
  a message whose fields are not of the types and ranges this release sends is dropped with its connection
  (raft_messages.py).
"""

from __future__ import annotations

import errno
import functools
import logging
import socket
import struct
import time
import zlib
from collections import Counter
from typing import Any, NoReturn

import pysyncobj.tcp_connection
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.tcp_server import TcpServer
from pysyncobj.transport import TCPTransport

from broker.log_limits import ThrottledWarning
from metadata_quorum import (
    features,
    pysyncobj_compat,  # noqa: F401  (undoes pysyncobj's socket.inet_ntop)
    raft_messages,
)

log = logging.getLogger(__name__)

UNKNOWN_FRAME_MAX_BYTES = 64 * 1024
PEER_FRAME_MAX_BYTES = 16 * 1024 * 1024
UNKNOWN_CONNECTIONS_MAX = 32
UNKNOWN_MAX_AGE_S = 5.0
LISTEN_BACKLOG = 128
ACCEPTS_PER_TURN = 64
ACCEPT_PAUSE_S = 0.2
ACCEPT_PAUSE_WARN_EVERY_S = 10.0
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

_LENGTH = struct.Struct("i")  # pysyncobj's frame prefix: native-endian signed int
# The key of every Raft message naming the highest brook.metadata.version its sender's release supports.
LEVEL_STAMP = "brook_level"
FENCE_LOG_EVERY_S = 30.0
REFUSAL_LOG_EVERY_S = 30.0  # one WARNING per client address and period for the connections _refusal closes
REFUSAL_LOG_ADDRESSES = 1024  # addresses remembered for that (then forgotten at once)
# pysyncobj inflates a frame whole (zlib.decompress) after its HMAC passes and before anything looks at it. A voter's
# frame may be 16 MiB compressed; zeros inflate about a thousand times, so one frame from a holder of the password
# made a voter allocate 16 GB. Frames are inflated up to this bound (``_BoundedInflate``), and dropped past it.
INFLATED_FRAME_MAX_BYTES = 4 * PEER_FRAME_MAX_BYTES
INFLATE_LOG_EVERY_S = 30.0
_INFLATE_STEP_BYTES = 1 << 20
# What pysyncobj's message handler raises on a message of the wrong shape (it indexes and unpacks what it
# unpickled). ValueError too: a failing journal raises it (and OSError), but only after its own handler has
# stopped the voter (quorum_journal.FailStopJournal), so one that reaches the transport is the message's.
_MALFORMED = (KeyError, TypeError, IndexError, AttributeError, ValueError)
# An entry sent in parts is joined in one buffer: Brook's largest commands are a few hundred KiB.
ENTRY_IN_PARTS_MAX_BYTES = INFLATED_FRAME_MAX_BYTES
_TRANSMISSION_KINDS = ("start", "process", "finish")


class _BoundedInflate:
    """What ``pysyncobj.tcp_connection`` sees as ``zlib`` (``install``): ``decompress`` stops at
    ``INFLATED_FRAME_MAX_BYTES`` and raises past it, which pysyncobj's frame parser answers by closing the
    connection. ``compress`` is zlib's."""

    compress = staticmethod(zlib.compress)
    refused = 0  # frames dropped for inflating past the bound, in this process

    @classmethod
    def decompress(cls, data: bytes) -> bytes:
        # A megabyte at a time: one call with the bound as its limit held the bound twice (its buffer, then the
        # bytes made of it) before it could stop.
        inflater = zlib.decompressobj()
        parts: list[bytes] = []
        total = 0
        tail = data
        while True:
            part = inflater.decompress(tail, _INFLATE_STEP_BYTES)
            total += len(part)
            if total > INFLATED_FRAME_MAX_BYTES:
                cls._refuse(len(data))
            parts.append(part)
            tail = inflater.unconsumed_tail
            if inflater.eof or not (tail or part):
                break
        if not inflater.eof:
            raise zlib.error("incomplete or truncated stream")
        return b"".join(parts)

    @classmethod
    def _refuse(cls, size: int) -> NoReturn:
        cls.refused += 1
        _inflate_refusals.warn("quorum port: a frame of %d bytes that inflates past %d bytes was dropped with its "
                               "connection. It passed the quorum password's check: only a holder of the password "
                               "sends one", size, INFLATED_FRAME_MAX_BYTES)
        raise zlib.error(f"a frame inflating past {INFLATED_FRAME_MAX_BYTES} bytes")


_inflate_refusals = ThrottledWarning(log, every_s=INFLATE_LOG_EVERY_S)


def install() -> None:
    """Make pysyncobj's connections inflate frames with ``_BoundedInflate`` (it calls ``zlib`` through its module)."""
    pysyncobj.tcp_connection.zlib = _BoundedInflate  # type: ignore[assignment]


install()


class BoundedTcpConnection(TcpConnection):  # type: ignore[misc]
    """A TcpConnection that refuses a frame declared larger than ``frame_max_bytes`` before reading it.

    pysyncobj builds its connections itself (TcpServer, TCPTransport.addNode); the transport turns
    them into this class as it takes them (``adopt``). The overrides replace pysyncobj's private
    read step (name-mangled ``__processRead``), which its own read loop calls.
    """

    frame_max_bytes = UNKNOWN_FRAME_MAX_BYTES
    accepted_at = 0.0
    peer_host = ""  # the client address of an accepted connection

    @classmethod
    def adopt(cls, conn: TcpConnection, frame_max_bytes: int) -> BoundedTcpConnection:
        conn.__class__ = cls
        conn.frame_max_bytes = frame_max_bytes
        conn.accepted_at = time.monotonic()
        return conn  # type: ignore[return-value]

    def _TcpConnection__processRead(self) -> bool:  # noqa: N802 - pysyncobj's mangled name
        buffered: bytes = self._TcpConnection__readBuffer
        if len(buffered) >= _LENGTH.size:
            declared = _LENGTH.unpack_from(buffered)[0]
            if not 0 <= declared <= self.frame_max_bytes:
                log.warning("quorum port: a frame of %d bytes declared (at most %d here): connection closed "
                            "before its body is read", declared, self.frame_max_bytes)
                self.disconnect()
                return False
            if len(buffered) >= _LENGTH.size + declared:
                return False  # a whole frame is here: parse it before reading more
        return bool(TcpConnection._TcpConnection__processRead(self))


class BoundedTcpServer(TcpServer):  # type: ignore[misc]
    """pysyncobj's TcpServer with a real backlog, several accepts a turn, and no unbind on a failed accept."""

    _paused_until: float | None = None  # accepting paused (out of descriptors or memory) until then
    _warned_at = 0.0

    def bind(self) -> None:
        self._paused_until = None
        super().bind()
        self._TcpServer__socket.listen(LISTEN_BACKLOG)  # listen() again only sets the backlog

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:  # noqa: N802 - pysyncobj's mangled name
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()  # the listening socket itself failed (pysyncobj's behaviour)
            return
        if not event & POLL_EVENT_TYPE.READ:
            return
        listener = self._TcpServer__socket
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, addr = listener.accept()
            except BlockingIOError:
                return  # the queue is empty
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    # The queued connection stays queued: polling on would only spin on it. Stop listening
                    # for a moment (the transport's tick resumes it); the port stays open meanwhile.
                    self._pause(exc)
                    return
                continue  # that one connection failed (reset before we took it, say)
            self._adopt_accepted(sock, addr)

    def _pause(self, exc: OSError) -> None:
        now = time.monotonic()
        if now - self._warned_at >= ACCEPT_PAUSE_WARN_EVERY_S:
            self._warned_at = now
            log.warning("quorum port: accepting a connection failed (%s); accepting again in %.1f s, the port "
                        "stays open", exc, ACCEPT_PAUSE_S)
        self._TcpServer__poller.unsubscribe(self._TcpServer__fileno)
        self._paused_until = now + ACCEPT_PAUSE_S

    def maybe_resume(self, now: float) -> None:
        if self._paused_until is None or now < self._paused_until or self._TcpServer__fileno is None:
            return
        self._paused_until = None
        self._TcpServer__poller.subscribe(self._TcpServer__fileno, self._TcpServer__onNewConnection,
                                          POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def _adopt_accepted(self, sock: socket.socket, addr: Any) -> None:
        send, recv = self._TcpServer__sendBufferSize, self._TcpServer__recvBufferSize
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        except OSError:  # reset before we got to it
            sock.close()
            return
        conn = BoundedTcpConnection.adopt(
            TcpConnection(poller=self._TcpServer__poller, socket=sock, timeout=self._TcpServer__connectionTimeout,
                          sendBufferSize=send, recvBufferSize=recv, keepalive=self._TcpServer__keepalive),
            UNKNOWN_FRAME_MAX_BYTES)
        conn.peer_host = str(addr[0])
        self._TcpServer__onNewConnectionCallback(conn)


class BoundedTCPTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCPTransport whose connections are BoundedTcpConnections and whose server is a
    BoundedTcpServer (see the module doc), and which keeps voters of a release below the finalized
    brook.metadata.version out of the quorum.

    Every Raft message this release sends carries ``LEVEL_STAMP``: the highest level it supports. Releases
    without it ignore the key (pysyncobj and Brook's handlers read the keys they know). Once the level is above
    1, a message from a voter whose stamp is lower, or missing (a release before feature levels), is dropped, and
    nothing more is sent to that voter, until it speaks with a stamp high enough (restarted on a newer release).
    Such a voter was rolled back after the level was raised: it would refuse what the level allowed when it
    applies the log, so its metadata would silently differ, and as leader it would serve that metadata and let
    brokers of its release in (an audit rolled a voter back and saw both). Fenced, it cannot be elected, receives
    nothing, and the other voters carry on if they are a majority.
    """

    stamp: int | None = features.SUPPORTED_MAX  # None: send as a release before feature levels does (tests)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Voters fenced for their release -> when that was last logged (pysyncobj's tick thread only).
        self._fenced: dict[Any, float] = {}
        # Closed after the key exchange for what they said they were (_refusal) or sent (_drop_malformed).
        self.refused_connections = 0
        self._receiving: TcpConnection | None = None  # the connection whose message is being handled, if accepted
        self._refusals_logged: dict[str, float] = {}  # address -> when a refusal of it was last logged
        super().__init__(*args, **kwargs)

    @staticmethod
    def metadata_level() -> int:
        """The finalized level as this voter has applied it (MetadataRaft sets this to read its state)."""
        return features.SUPPORTED_MIN

    def send(self, node: Any, message: Any) -> bool:
        if node in self._fenced:
            return False
        if self.stamp is not None and isinstance(message, dict):
            message = {**message, LEVEL_STAMP: self.stamp}
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - pysyncobj's name
        level = self.metadata_level()
        fenced = self._fenced
        if level > features.SUPPORTED_MIN and isinstance(message, dict):
            stamp = message.get(LEVEL_STAMP)
            supported = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else features.SUPPORTED_MIN
            if supported < level:
                now = time.monotonic()
                if now - fenced.get(node, float("-inf")) >= FENCE_LOG_EVERY_S:
                    log.error("quorum: voter %s runs a release that supports brook.metadata.version up to %d, and "
                              "the cluster is at %d: its Raft messages are dropped and it is sent none (it would "
                              "not apply what the level allowed). Run a release that supports %d on it",
                              getattr(node, "address", node), supported, level, level)
                    fenced[node] = now
                return
        if fenced and fenced.pop(node, None) is not None:
            log.warning("quorum: voter %s now runs a release that supports the cluster's brook.metadata.version "
                        "%d: it takes part in the quorum again", getattr(node, "address", node), level)
        problem = raft_messages.problem(message)
        if problem is not None:
            self._drop_malformed(node, message, ValueError(problem))
            return
        if message.get("transmission") is not None:
            problem = self._transmission_problem(message)
            if problem is not None:
                self._drop_malformed(node, message, ValueError(problem))
                return
        try:
            super()._onMessageReceived(node, message)
        except _MALFORMED as exc:
            self._drop_malformed(node, message, exc)

    def _transmission_problem(self, message: dict[Any, Any]) -> str | None:
        """Why a part of an entry sent in parts may not be taken (None: it may). pysyncobj sends an entry of
        ``appendEntriesBatchSizeBytes`` or more in parts ('start', 'process'..., 'finish') and joins them in one
        buffer of the voter's, with no bound: parts from a holder of the password grew it until memory ran out.
        Any other kind raised a bare Exception on the tick thread."""
        kind = message.get("transmission")
        if kind not in _TRANSMISSION_KINDS:
            return "an entry part of no kind pysyncobj sends"
        data = message.get("data")
        if not isinstance(data, bytes):
            return "an entry part that is not bytes"
        held = getattr(self._syncObj, "_SyncObj__recvTransmission", None) if kind != "start" else None
        if kind != "start" and not (isinstance(held, bytes) and held):
            # pysyncobj joins it to '' (a str) when no start came: a TypeError on the tick thread. A leader sends
            # every part of an entry in one turn, and again from its start on a new connection.
            return "an entry part with no start before it"
        total = len(data) + (len(held) if isinstance(held, bytes) else 0)
        if total > ENTRY_IN_PARTS_MAX_BYTES:
            return f"an entry sent in parts past {ENTRY_IN_PARTS_MAX_BYTES} bytes"
        return None

    def _drop_malformed(self, node: Any, message: Any, exc: BaseException) -> None:
        """A message pysyncobj's handler could not read (not a dict, a key missing, a value of the wrong type): it
        raised on the tick thread, which logged an ERROR and paused a tick period (heartbeats, votes) before going
        on, for each such message. Only a holder of the password can send one; its connection is closed."""
        self.refused_connections += 1
        conn = self._receiving or self._connections.get(node)  # the latter: a connection this voter dialled
        if conn is not None:
            conn.disconnect()
        address = str(getattr(node, "address", node))
        if self._may_log_refusal(address):
            kind = message.get("type") if isinstance(message, dict) else None
            kind = kind if isinstance(kind, str) else type(message).__name__
            log.error("quorum: a Raft message from %s that this voter cannot read (%.40r: %s: %.100s) was dropped "
                      "and the connection closed. A voter of this quorum does not send one: if that address "
                      "runs one, compare their releases; if not, the quorum password has leaked",
                      address, kind, type(exc).__name__, exc)

    def _createServer(self) -> None:  # noqa: N802 - pysyncobj's name
        super()._createServer()
        self._server.__class__ = BoundedTcpServer  # made, not bound yet: bind() is ours

    def addNode(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:  # a connection this voter dials to a configured voter
            BoundedTcpConnection.adopt(conn, PEER_FRAME_MAX_BYTES)

    def _onNewIncomingConnection(self, conn: TcpConnection) -> None:  # noqa: N802 - pysyncobj's name
        if not isinstance(conn, BoundedTcpConnection):
            BoundedTcpConnection.adopt(conn, UNKNOWN_FRAME_MAX_BYTES)
        self._close_stale_unknown(time.monotonic())
        while len(self._unknownConnections) >= UNKNOWN_CONNECTIONS_MAX:
            victim = self._eviction_victim(conn.peer_host)
            self._unknownConnections.discard(victim)
            victim.disconnect()
        super()._onNewIncomingConnection(conn)

    def _eviction_victim(self, new_host: str) -> TcpConnection:
        """The oldest unknown connection of the address holding the most (the new one's counted too), so
        that a flood from one address closes its own connections first."""
        held = Counter(c.peer_host for c in self._unknownConnections)
        held[new_host] += 1
        most = max(held.values())
        crowded = {host for host, n in held.items() if n == most}
        candidates = [c for c in self._unknownConnections if c.peer_host in crowded] or list(self._unknownConnections)
        return min(candidates, key=lambda c: c.accepted_at)

    def _onIncomingMessageReceived(self, conn: TcpConnection, message: Any) -> None:  # noqa: N802
        # Called until the connection has named itself. With a password, its first message is its key.
        if not self._syncObj.encryptor or conn.sendRandKey:
            refusal = self._refusal(message)
            if refusal is not None:
                self._refuse(conn, refusal)
                return
        super()._onIncomingMessageReceived(conn, message)
        node = self._connToNode(conn) if conn not in self._unknownConnections else None
        if node is not None:
            conn.frame_max_bytes = PEER_FRAME_MAX_BYTES  # passed the key exchange and named itself
            # Its messages name the connection they came on: a malformed one closes that connection, not the
            # node's latest (two callers may name the same voter).
            conn.setOnMessageReceivedCallback(functools.partial(self._received_on, conn, node))

    def _received_on(self, conn: TcpConnection, node: Any, message: Any) -> None:
        self._receiving = conn
        try:
            self._onMessageReceived(node, message)
        finally:
            self._receiving = None

    def _refusal(self, message: Any) -> str | None:
        """Why a connection that passed the key exchange may not take part, by what it says it is (None: it may).

        pysyncobj takes three kinds of callers there, and a Brook voter has use for one: its configured voters,
        each dialling only the voters whose addresses sort below its own (``_shouldConnect``). A name that is no
        voter pysyncobj closed itself, but looked up first, which failed its tick for one that is not hashable. Its admin commands
        (``status``, ``transfer``, ``set_version``, ``add``, ``remove``: syncobj_admin) would let any holder of
        the password move the leadership at will, and a "readonly" node is sent the whole metadata log (SCRAM
        credentials, ACLs). Brook reads the quorum through its own RPCs (``brook cluster quorum``)."""
        if isinstance(message, list):
            command = message[0] if message and isinstance(message[0], str) else ""
            return f"a pysyncobj admin command ({command[:40]!r}); voters take none"
        if message == "readonly":
            return "a pysyncobj readonly node, which would be sent the metadata log"
        node = self._nodeAddrToNode.get(message) if isinstance(message, str) else None
        if node is None:  # pysyncobj looked a dict up unhashed: a TypeError failed its tick (an ERROR, a pause)
            shown = message[:80] if isinstance(message, str) else type(message).__name__
            return f"it names no voter of this quorum ({shown!r})"
        if self._shouldConnect(node):
            return (f"it names voter {message}, which this voter dials itself (a voter dials only those whose "
                    f"addresses sort below its own)")
        return None

    def _may_log_refusal(self, key: str) -> bool:
        """True at most once per ``key`` (a client address, a voter's) and REFUSAL_LOG_EVERY_S."""
        now = time.monotonic()
        logged = self._refusals_logged
        if now - logged.get(key, float("-inf")) < REFUSAL_LOG_EVERY_S:
            return False
        if len(logged) >= REFUSAL_LOG_ADDRESSES:
            logged.clear()
        logged[key] = now
        return True

    def _refuse(self, conn: TcpConnection, why: str) -> None:
        self._unknownConnections.discard(conn)
        conn.disconnect()
        self.refused_connections += 1
        peer = getattr(conn, "peer_host", "") or "?"
        if self._may_log_refusal(peer):
            if self._syncObj.encryptor:
                log.warning("quorum port: a connection from %s holds the quorum password and was closed: %s. If "
                            "that is not a voter of this quorum, the password has leaked: change it on every voter",
                            peer, why)
            else:
                log.warning("quorum port: a connection from %s was closed: %s", peer, why)

    def _onTick(self) -> None:  # noqa: N802 - pysyncobj's name
        super()._onTick()
        now = time.monotonic()
        if isinstance(self._server, BoundedTcpServer):
            self._server.maybe_resume(now)
        self._close_stale_unknown(now)

    def _close_stale_unknown(self, now: float) -> None:
        for conn in [c for c in self._unknownConnections if now - c.accepted_at > UNKNOWN_MAX_AGE_S]:
            self._unknownConnections.discard(conn)
            conn.disconnect()
